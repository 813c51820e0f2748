"""The intermediates dump of a transformers model's forward (docs/DESIGN.md, "The intermediates
dump"): dump(model, input_ids, path) runs a Qwen2, Qwen3, Llama, Qwen3-MoE or Qwen2-MoE causal
LM on one sequence, as one causal prefill from position 0, and writes what each region produced
as one safetensors file that parity.bisect compares point by point with libparity's presets.

The tensors are captured with forward hooks on the modules that yield them, and the attention
function's inputs and output (the query and key after RoPE, its output) by a wrapper put around
the function transformers' AttentionInterface hands the attention modules for the model's
attn_implementation, for the duration of the call. Nothing the model computes changes: the hooks
and the wrapper only copy tensors, and the model runs as it is (call model.eval() first when it
has dropout). Needs PyTorch; the file is written by parity's own safetensors writer.
"""
import sys

import torch

from .. import _safetensors

#: The config model_types dump() knows the modules of.
SUPPORTED_MODEL_TYPES = ("qwen2", "qwen3", "llama", "qwen3_moe", "qwen2_moe")

_DTYPE_NAMES = {torch.bfloat16: ("bf16", "BF16"), torch.float16: ("f16", "F16")}


def _rows(tensor, tokens):
    """A captured tensor as token-major [T, width] on the CPU, in its own dtype."""
    return tensor.detach().reshape(tokens, -1).contiguous().cpu()


def _first(output):
    """The hidden states of a module output that may be a tuple."""
    return output[0] if isinstance(output, (tuple, list)) else output


def _check_model(model):
    """The model's config model_type and its 16-bit dtype, or ValueError naming what is wrong."""
    config = getattr(model, "config", None)
    model_type = getattr(config, "model_type", None)
    if model_type not in SUPPORTED_MODEL_TYPES or not hasattr(model, "lm_head") \
            or not hasattr(getattr(model, "model", None), "layers"):
        raise ValueError("parity.hf.dump: %s (model_type %r) is not supported: a transformers "
                         "causal LM of model_type %s is"
                         % (type(model).__name__, model_type, ", ".join(SUPPORTED_MODEL_TYPES)))
    dtype = model.lm_head.weight.dtype
    if dtype not in _DTYPE_NAMES:
        raise ValueError("parity.hf.dump: the model's dtype is %s; a dump holds a bfloat16 or "
                         "float16 model's intermediates (model.to(torch.bfloat16))" % dtype)
    return model_type, dtype


def _check_tokens(input_ids, vocab_size):
    """input_ids ([T] or [1, T], a tensor or a list) as a [1, T] int64 tensor."""
    ids = torch.as_tensor(input_ids)
    if ids.dim() == 2:
        if ids.shape[0] != 1:
            raise ValueError("parity.hf.dump: input_ids holds a batch of %d sequences; a dump "
                             "holds one sequence ([T] or [1, T])" % ids.shape[0])
        ids = ids[0]
    if ids.dim() != 1:
        raise ValueError("parity.hf.dump: input_ids has shape %s; a dump holds one sequence "
                         "([T] or [1, T])" % (tuple(ids.shape),))
    if ids.dtype.is_floating_point or ids.dtype == torch.bool:
        raise ValueError("parity.hf.dump: input_ids must be integers, not %s" % ids.dtype)
    if ids.numel() < 2:
        raise ValueError("parity.hf.dump: %d tokens; a dump needs at least 2 (the log-probs "
                         "score tokens 1..T-1)" % ids.numel())
    if int(ids.min()) < 0 or int(ids.max()) >= vocab_size:
        raise ValueError("parity.hf.dump: a token id outside the vocabulary 0..%d"
                         % (vocab_size - 1))
    return ids.to(torch.int64).reshape(1, -1)


class _Capture:
    """The hooks and the attention wrapper of one dump; captured: {name: tensor}."""

    def __init__(self, model, tokens):
        self.model, self.tokens, self.captured = model, tokens, {}
        self.handles, self.interface, self.saved_local = [], None, None

    def keep(self, name, tensor):
        if name in self.captured:
            raise RuntimeError("parity.hf.dump: %s was produced twice in one forward (a module "
                               "called again?)" % name)
        self.captured[name] = _rows(tensor, self.tokens)

    def on_output(self, module, name, pick=_first):
        self.handles.append(module.register_forward_hook(
            lambda _m, _args, out: self.keep(name, pick(out))))

    def on_input(self, module, name):
        def hook(_m, args, kwargs):
            self.keep(name, args[0] if args else kwargs["hidden_states"])
        self.handles.append(module.register_forward_pre_hook(hook, with_kwargs=True))

    def install(self, model_type):
        inner = self.model.model
        self.on_output(inner.embed_tokens, "embed")
        for i, layer in enumerate(inner.layers):
            p = "layers.%d." % i
            if i > 0:
                self.on_input(layer, p + "input")
            attention = layer.self_attn
            self.on_output(layer.input_layernorm, p + "attn_norm")
            for proj in ("q_proj", "k_proj", "v_proj"):
                self.on_output(getattr(attention, proj), p + proj)
            if model_type in ("qwen3", "qwen3_moe"):
                self.on_output(attention.q_norm, p + "q_norm")
                self.on_output(attention.k_norm, p + "k_norm")
            self.on_output(attention.o_proj, p + "o_proj")
            self.on_input(layer.post_attention_layernorm, p + "attn_residual")
            self.on_output(layer.post_attention_layernorm, p + "mlp_norm")
            mlp = layer.mlp
            if hasattr(mlp, "gate") and hasattr(mlp, "experts"):
                self.on_output(mlp.gate, p + "router_logits", lambda out: out[0])
                self.on_output(mlp.gate, p + "router_weights", lambda out: out[1].float())
                self.on_output(mlp.gate, p + "router_ids", lambda out: out[2].to(torch.int32))
            else:
                self.on_output(mlp.gate_proj, p + "gate_proj")
                self.on_output(mlp.up_proj, p + "up_proj")
                self.on_input(mlp.down_proj, p + "swiglu")
            self.on_output(mlp, p + "mlp")
        self.on_input(inner.norm, "final_residual")
        self.on_output(inner.norm, "final_norm")
        self.on_output(self.model.lm_head, "logits")
        self.wrap_attention(inner.layers[0].self_attn)

    def wrap_attention(self, attention):
        """Puts the wrapper in the attention modules' AttentionInterface under the model's
        attn_implementation (a local entry of that interface, removed by remove())."""
        implementation = self.model.config._attn_implementation
        module = sys.modules[type(attention).__module__]
        interface = getattr(module, "ALL_ATTENTION_FUNCTIONS", None)
        if interface is None:
            raise ValueError("parity.hf.dump: %s has no ALL_ATTENTION_FUNCTIONS to capture the "
                             "attention through (transformers 5 is needed)" % module.__name__)
        if implementation == "eager":
            original = module.eager_attention_forward
        elif implementation in interface:
            original = interface[implementation]
        else:
            raise ValueError("parity.hf.dump: attn_implementation %r is not in transformers' "
                             "AttentionInterface" % implementation)

        def attention_function(attention_module, query, key, value, *args, **kwargs):
            p = "layers.%d." % attention_module.layer_idx
            # query/key: [1, heads, T, head_dim], after RoPE; token-major rows of all heads.
            self.keep(p + "q_rope", query.transpose(1, 2))
            self.keep(p + "k_rope", key.transpose(1, 2))
            output, weights = original(attention_module, query, key, value, *args, **kwargs)
            self.keep(p + "attn", output)
            return output, weights

        self.interface = interface
        self.saved_local = (implementation, interface._local_mapping.get(implementation))
        interface[implementation] = attention_function

    def remove(self):
        for handle in self.handles:
            handle.remove()
        if self.interface is not None:
            implementation, local = self.saved_local
            if local is None:
                del self.interface[implementation]
            else:
                self.interface[implementation] = local


def _names(model, model_type):
    """Every tensor name the dump of this model holds, in forward order."""
    names = ["embed"]
    for i, layer in enumerate(model.model.layers):
        p = "layers.%d." % i
        names += [p + "input"] if i > 0 else []
        names += [p + n for n in ("attn_norm", "q_proj", "k_proj", "v_proj")]
        if model_type in ("qwen3", "qwen3_moe"):
            names += [p + "q_norm", p + "k_norm"]
        names += [p + n for n in ("q_rope", "k_rope", "attn", "o_proj", "attn_residual",
                                  "mlp_norm")]
        if hasattr(layer.mlp, "experts"):
            names += [p + n for n in ("router_logits", "router_ids", "router_weights")]
        else:
            names += [p + n for n in ("gate_proj", "up_proj", "swiglu")]
        names.append(p + "mlp")
    return names + ["final_residual", "final_norm", "logits"]


def _raw(tensor):
    return tensor.contiguous().view(torch.uint8).numpy().tobytes() \
        if tensor.dtype in (torch.bfloat16, torch.float16) else tensor.numpy().tobytes()


def dump(model, input_ids, path, *, engine=None):
    """Runs the transformers causal LM `model` (Qwen2, Qwen3, Llama, Qwen3-MoE, Qwen2-MoE, in
    bfloat16 or float16) on the one sequence input_ids ([T] or [1, T], T >= 2) and writes its
    intermediates to `path` as a parity dump. engine: the metadata's engine text (default: the
    transformers and torch versions and the attn_implementation). Returns {name: tensor} of what
    was written (the token ids and log-probs included).

    Raises ValueError for an unsupported model class or dtype, a batch of more than one sequence,
    fewer than two tokens or an id outside the vocabulary."""
    import transformers
    model_type, dtype = _check_model(model)
    tokens = _check_tokens(input_ids, model.config.vocab_size)
    length = tokens.shape[1]
    capture = _Capture(model, length)
    try:
        capture.install(model_type)
        with torch.no_grad():
            model(input_ids=tokens.to(model.lm_head.weight.device), use_cache=False)
    finally:
        capture.remove()
    captured = capture.captured
    names = _names(model, model_type)
    missing = [n for n in names if n not in captured]
    if missing:
        raise RuntimeError("parity.hf.dump: the forward produced no %s (this transformers "
                           "version calls its modules differently)" % ", ".join(missing[:4]))
    logits = captured["logits"]
    logprobs = torch.log_softmax(logits.float(), dim=-1)[
        torch.arange(length - 1), tokens[0, 1:]].contiguous()
    dtype_name, st_dtype = _DTYPE_NAMES[dtype]
    if engine is None:
        engine = "transformers %s, torch %s, attn_implementation=%s" % (
            transformers.__version__, torch.__version__, model.config._attn_implementation)
    out = {"tokens": tokens[0].to(torch.int32), "logprobs": logprobs}
    out.update((n, captured[n]) for n in names)
    entries = []
    for name, tensor in out.items():
        if tensor.dtype == torch.int32:
            st = "I32"
        elif tensor.dtype == torch.float32:
            st = "F32"
        elif tensor.dtype == dtype:
            st = st_dtype
        else:
            raise RuntimeError("parity.hf.dump: %s came out %s in a %s model"
                               % (name, tensor.dtype, dtype))
        entries.append((name, st, tuple(tensor.shape) if name not in ("tokens", "logprobs")
                        else (tensor.numel(),), _raw(tensor)))
    _safetensors.write(path, entries, {"parity_dump": "1", "engine": engine,
                                       "model_type": model_type, "dtype": dtype_name})
    return out
