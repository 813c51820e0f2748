"""parity.hf.patch(model, policy) and parity.hf.unpatch(model): a transformers Qwen2, Qwen3,
Llama, Qwen3-MoE or Qwen2-MoE causal LM given a libparity policy's rounding points, in plain
torch operations that run on the model's own device and dtype (no call into the C library
while it runs), so that a learner trained with transformers (FSDP, DDP, a single GPU) rounds
where its sampler rounds:

    import parity.hf
    parity.hf.patch(model, "vllm+aligned")    # the learner now rounds as its vLLM sampler
    logits = model(input_ids).logits
    parity.hf.unpatch(model)                  # transformers' own forward again, bit for bit

What the patch replaces (each module's forward, on the instance; the classes are untouched):
  - every RMSNorm (input, post-attention, final; Qwen3's q_norm/k_norm per the policy's
    qk_norm switch): parity.torch's exact arithmetic (dot16 sum of squares, 1/sqrtf), rounded
    once or twice per norm_weight;
  - the decoder layer: the residual adds in fp32, the residual stream rounded after each add,
    and each norm reading the rounded sum or the unrounded fp32 one per norm_input. Under an
    fp32 norm_input a layer hands the next one its unrounded fp32 sum (so the model's hidden
    states between layers, and output_hidden_states, are float32: the residual stream is that
    sum rounded, as the next layer takes it);
  - the rotary embedding: libparity's cos/sin tables (bf16 or fp32 per rope_table) and the
    rotation with three roundings or one (rope_apply);
  - the MLP's SwiGLU: silu with the library's exp, per-op or fused (swiglu);
  - the attention's rounding steps (attention): "eager" is transformers' eager attention itself
    (bf16 scores, * scaling, + mask, fp32 softmax rounded, bf16 P.V); "flash" is DESIGN.md's
    flash order (fp32 scores and scale, P = exp(s - max), l over the unrounded P, O = bf16(P).V
    in fp32, bf16(O / l)); "fp32" (or compute "fp32") fp32 softmax attention unrounded, o_proj
    then an fp32 GEMM over the bf16 weights, rounded;
  - the logits: transformers' bf16 lm_head, or an fp32 head (logits "fp32": lm_head on the
    normed state in fp32, unrounded);
  - a mixture-of-experts block (transformers v5's fused experts): the router GEMM (rounded),
    the route as parity_moe_route (moe_router, moe_weights: fp32 softmax with the library's
    exp, its sum in expert order, top-k with ties to the lower index, the renormalisation),
    each chosen expert's gate/up GEMMs and SwiGLU, its down projection's unrounded fp32 output
    (an fp32 GEMM over the bf16 weights), Qwen2-MoE's shared expert and gate, and the combine
    as parity_moe_combine (moe_combine).
The linear layers, the embedding and the attention's dot products stay the model's own torch
GEMMs: they sum in the device's order, so a patched model's log-probs meet libparity's within
the GEMMs' summation floor, while every region above gives libparity's bits on its inputs.
Gradients flow through every region with the fp32 formulas, straight through each rounding
point (as parity.torch and the learner).

Refused, with a ValueError that names the switch or the class: a quantized gemm (fp8, NVFP4,
MXFP4, ternary: the model's own linear layers cannot quantize); a compute switch that is not
the model's dtype (compute "fp32" needs a float32 model; "bf16" a bfloat16 one, "fp16" (the
"+fp16" modifier) a float16 one; a float32 model is let through for bf16/fp16 policies, for
FSDP's mixed precision, and then checked at run time); a model class other than the ones in
SUPPORTED; a non-SiLU activation, rope scaling other than "default", partial rotary, sliding
window attention. The policy's temperature switch is not part of the model's forward (divide
the logits as it says).

Patching a patched model re-patches it (unpatch, then patch with the new policy). Patch before
wrapping the model (FSDP, DDP, torch.compile): the wrappers keep the modules, and so their
patched forwards; generate() with a KV cache and activation checkpointing work as unpatched.

The exact regions cost time (a 4-layer, 1024-wide Qwen3 forward of 512 tokens on one CPU
thread: 0.5 s unpatched, 1.4 to 1.75 s patched: bench/hf_patch_speed.py), mostly the exact fmaf
of SiLU's exp and of the sums of squares, which parity.torch computes in float64: a device
without float64 (Apple's MPS) cannot run them.
"""
import math
import types

import torch as _torch
import torch.nn.functional as _F

from .. import _torch_regions as _regions
from ..policy import policy_struct

__all__ = ["patch", "unpatch", "patched_policy", "SUPPORTED"]

#: The transformers classes patch() takes (and their subclasses).
SUPPORTED = ("Qwen2ForCausalLM", "Qwen2Model", "Qwen3ForCausalLM", "Qwen3Model",
             "LlamaForCausalLM", "LlamaModel", "Qwen3MoeForCausalLM", "Qwen3MoeModel",
             "Qwen2MoeForCausalLM", "Qwen2MoeModel")

_f32 = _torch.float32
_ATTR = "_parity_hf_patch"
_NO_FORWARD = object()   # a module had no forward of its own in its __dict__
_DTYPE_OF_COMPUTE = {0: _torch.bfloat16, 1: _torch.float32, 2: _torch.float16}
_ATTN_EAGER, _ATTN_FLASH, _ATTN_FP32 = 0, 1, 2
_ROUTER_HF, _ROUTER_VLLM, _ROUTER_SGLANG, _ROUTER_TOPK_SOFTMAX = 0, 1, 2, 3
_WEIGHTS_ROUNDED = 0
_COMBINE_HF, _COMBINE_VLLM, _COMBINE_SGLANG, _COMBINE_FP32 = 0, 1, 2, 3
# parity_policy.gemm's values by name (parity.h's PARITY_GEMM_*)
_GEMM_NAMES = ("bf16", "fp8-block", "mxfp8", "nvfp4", "mxfp4", "ternary")


class _Patch:
    """What a patch holds: the policy, the dtypes it runs in, and each replaced forward."""

    def __init__(self, policy, pol):
        self.policy = policy            # as the caller gave it (a name or a Policy)
        self.pol = pol                  # the parity.Policy
        self.dtype = _DTYPE_OF_COMPUTE[pol.compute]   # the activations' dtype
        self.round_to = _regions._round_dtype(pol)    # bf16, fp16, or None under compute fp32
        self.saved = []                 # (module, its own forward before, or _NO_FORWARD)

    def replace(self, module, forward):
        self.saved.append((module, module.__dict__.get("forward", _NO_FORWARD)))
        module.forward = types.MethodType(forward, module)

    def stream(self, s):
        """The residual stream of an fp32 sum s (rounded) and what the next norm reads."""
        if self.round_to is None:
            return s, s
        residual = s.to(self.dtype)
        return residual, (s if self.pol.norm_input == 1 else residual)


# ---- checks -------------------------------------------------------------------------------------

def _class_name(model):
    for cls in type(model).__mro__:
        if cls.__name__ in SUPPORTED and cls.__module__.startswith("transformers."):
            return cls.__name__
    return None


def _check_model(model):
    if not isinstance(model, _torch.nn.Module):
        raise TypeError("model must be a transformers model (a torch.nn.Module such as "
                        "Qwen3ForCausalLM), not %s" % type(model).__name__)
    if _class_name(model) is None:
        raise ValueError("parity.hf.patch does not support %s (%s): it patches %s"
                         % (type(model).__name__, type(model).__module__, ", ".join(SUPPORTED)))


def _policy(policy):
    """The parity.Policy of a name or a Policy, its values checked by the library."""
    policy_struct(policy)   # ParityError for an unknown name or an undefined switch value
    return _regions._policy(policy)


def _check_policy(pol, model_dtype):
    names = pol.names()
    if pol.gemm != 0:
        gemm = _GEMM_NAMES[pol.gemm] if pol.gemm < len(_GEMM_NAMES) else pol.gemm
        raise ValueError("policy switch gemm = %r: the patch keeps the model's own linear layers, "
                         "which cannot quantize (fp8, fp4 and ternary policies run on "
                         "parity.torch.CausalLM)" % gemm)
    want = _DTYPE_OF_COMPUTE.get(pol.compute)
    if want is None:
        raise ValueError("policy switch compute = %r is not one the patch knows" % names["compute"])
    if model_dtype != want and not (model_dtype == _f32 and want != _f32):
        raise ValueError("policy switch compute = %r computes in %s, and this model holds %s "
                         "weights: %s" % (names["compute"], want, model_dtype,
                                          "cast it with model.float() first" if want == _f32
                                          else "load it in %s (or use the policy for its dtype: "
                                          "\"+fp16\" for float16)" % want))


def _is_dense(mlp):
    return all(hasattr(mlp, n) for n in ("gate_proj", "up_proj", "down_proj"))


def _is_sparse(mlp):
    experts, router = getattr(mlp, "experts", None), getattr(mlp, "gate", None)
    return (all(getattr(getattr(experts, n, None), "dim", lambda: 0)() == 3
                for n in ("gate_up_proj", "down_proj"))
            and all(hasattr(router, n) for n in ("weight", "top_k", "norm_topk_prob")))


def _rope_theta(config):
    params = getattr(config, "rope_parameters", None)
    scaling = getattr(config, "rope_scaling", None)
    if isinstance(params, dict):
        kind, theta = params.get("rope_type", "default"), params.get("rope_theta")
        partial = params.get("partial_rotary_factor", 1.0)
    else:
        kind = (scaling or {}).get("rope_type", (scaling or {}).get("type", "default"))
        theta, partial = getattr(config, "rope_theta", None), 1.0
    partial = getattr(config, "partial_rotary_factor", partial)
    if kind != "default":
        raise ValueError("rope_type %r is not supported by parity.hf.patch (only \"default\" "
                         "RoPE)" % kind)
    if partial not in (None, 1, 1.0):
        raise ValueError("partial_rotary_factor %r is not supported by parity.hf.patch" % partial)
    if theta is None:
        raise ValueError("the model's config has no rope_theta")
    return float(theta)


def _check_config(config):
    act = getattr(config, "hidden_act", "silu")
    if act != "silu":
        raise ValueError("hidden_act %r is not supported by parity.hf.patch (SwiGLU with silu "
                         "only)" % act)
    kinds = set(getattr(config, "layer_types", None) or ["full_attention"])
    if kinds != {"full_attention"} or getattr(config, "use_sliding_window", False):
        raise ValueError("sliding window attention (layer_types %s) is not supported by "
                         "parity.hf.patch" % sorted(kinds))
    return _rope_theta(config)


# ---- the regions --------------------------------------------------------------------------------

def _rope_heads(q, k, cos, sin, state):
    """RoPE of q [B, T, heads, hd] and k [B, T, kv_heads, hd] with the tables [B, T, hd/2]:
    parity_rope's arithmetic; returns both in the activations' dtype, token-major."""
    c, s = cos.unsqueeze(2), sin.unsqueeze(2)
    q = _regions._rope_f32(q.float(), c, s, state.pol)
    k = _regions._rope_f32(k.float(), c, s, state.pol)
    return q.to(state.dtype), k.to(state.dtype)


def _allowed(mask, rows, cols, device):
    """Which keys each query may see, bool [B or 1, 1, rows, cols], from what transformers
    passed as the attention mask: None (causal, the queries the last `rows` of `cols`
    positions), a 4-D bool mask, a 4-D additive mask (0 where seen) or a 2-D padding mask."""
    i = _torch.arange(rows, device=device)[:, None] + (cols - rows)
    causal = (_torch.arange(cols, device=device)[None, :] <= i)[None, None]
    if mask is None:
        return causal
    if not isinstance(mask, _torch.Tensor):
        raise ValueError("the attention mask is a %s, which parity.hf.patch does not read: load "
                         "the model with attn_implementation=\"eager\" or \"sdpa\""
                         % type(mask).__name__)
    if mask.dim() == 2:
        return causal & mask[:, None, None, -cols:].bool()
    if mask.dim() != 4:
        raise ValueError("an attention mask of shape %s is not one parity.hf.patch reads"
                         % (tuple(mask.shape),))
    mask = mask[..., -cols:]
    return mask if mask.dtype == _torch.bool else mask == 0


def _attend(q, k, v, mask, module, state):
    """Causal GQA attention of q [B, heads, T, hd], k and v [B, kv_heads, S, hd] (the
    activations' dtype) per the policy's attention switch; [B, heads, T, hd] in that dtype, or
    float32 for fp32 attention."""
    group = q.shape[1] // k.shape[1]
    if group > 1:
        k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
    rows, cols = q.shape[2], k.shape[2]
    mode = _ATTN_FP32 if state.round_to is None else state.pol.attention
    if mode == _ATTN_EAGER:   # transformers' eager_attention_forward, step for step
        if isinstance(mask, _torch.Tensor) and mask.dim() == 4 and mask.is_floating_point():
            add = mask
        else:
            seen = _allowed(mask, rows, cols, q.device)
            add = _torch.zeros(seen.shape, dtype=q.dtype, device=q.device)
            add = add.masked_fill(~seen, _torch.finfo(q.dtype).min)
        w = _torch.matmul(q, k.transpose(2, 3)) * module.scaling
        w = _F.softmax(w + add, dim=-1, dtype=_f32).to(q.dtype)
        w = _F.dropout(w, p=module.attention_dropout if module.training else 0.0,
                       training=module.training)
        return _torch.matmul(w, v)
    seen = _allowed(mask, rows, cols, q.device)
    scale = float(_torch.tensor(1.0 / math.sqrt(q.shape[-1]), dtype=_f32))  # as the library's
    s = _torch.matmul(q.float(), k.float().transpose(2, 3)) * scale
    s = s.masked_fill(~seen, -math.inf)
    if mode == _ATTN_FP32:
        return _torch.matmul(_torch.softmax(s, dim=-1).nan_to_num(0.0), v.float())
    m = s.amax(dim=-1, keepdim=True)
    m = _torch.where(_torch.isfinite(m), m, _torch.zeros_like(m))   # a row that sees nothing
    p = _torch.exp(s - m)
    l = p.sum(dim=-1, keepdim=True)
    l = _torch.where(l > 0, l, _torch.ones_like(l))
    o = _torch.matmul(_regions._round(p, state.round_to), v.float())
    return _regions._round(o / l, state.round_to).to(state.dtype)


# ---- mixture of experts -------------------------------------------------------------------------

def _serial_sum(columns):
    """The fp32 sum of a list of tensors, one add after another from 0 (a C loop's order)."""
    total = _torch.zeros_like(columns[0])
    for c in columns:
        total = total + c
    return total


def _top_k(values, k):
    """The k largest of each row in slot order: descending, ties to the lower index."""
    return _torch.sort(values, dim=1, descending=True, stable=True).indices[:, :k]


def _sigmoid(g):
    """1 / (1 + exp(-g)) with the library's exp, fp32 (the gradient of torch.sigmoid)."""
    with _torch.no_grad():
        value = _regions._const(1.0, g) / (_regions._const(1.0, g) + _regions.expf(-g.detach()))
    return _regions._exact(value, _torch.sigmoid(g)) if g.requires_grad else value


def _moe_route(logits, k, norm_topk_prob, state):
    """The router as parity_moe_route (lib/kernels/moe.c): fp32 logits [rows, E] (the router
    GEMM's output, rounded) to (weights fp32 [rows, k], ids int64 [rows, k]) per the policy's
    moe_router and moe_weights. The weights carry the gradient of the fp32 formula (softmax,
    the chosen, renormalised; a topk-softmax router's softmax over the chosen); the choice is
    a constant."""
    pol = state.pol
    x = logits.detach()
    with _torch.no_grad():
        if pol.moe_router == _ROUTER_TOPK_SOFTMAX:
            ids = _top_k(x, k)
            chosen = x.gather(1, ids)
            e = _regions.expf(chosen - chosen.amax(dim=1, keepdim=True))
            w = e / _serial_sum(list(e.unbind(1))).unsqueeze(1)
        else:
            p = _regions.expf(x - x.amax(dim=1, keepdim=True))
            total = _serial_sum(list(p.unbind(1))).unsqueeze(1)
            if pol.moe_router == _ROUTER_HF:
                p = p / total
            else:
                p = p * (_regions._const(1.0, total) / total)
            ids = _top_k(p, k)
            w = p.gather(1, ids)
            if norm_topk_prob:
                chosen = _serial_sum(list(w.unbind(1))).unsqueeze(1)
                if pol.moe_router == _ROUTER_HF:
                    w = w / chosen
                elif pol.moe_router == _ROUTER_VLLM:
                    w = w / _torch.where(chosen > 0, chosen, _regions._const(1.0, chosen))
                else:
                    w = w * (_regions._const(1.0, chosen) / chosen)
    if logits.requires_grad:
        if pol.moe_router == _ROUTER_TOPK_SOFTMAX:
            approx = _torch.softmax(logits.gather(1, ids), dim=1)
        else:
            approx = _torch.softmax(logits, dim=1).gather(1, ids)
            if norm_topk_prob:
                approx = approx / approx.sum(1, keepdim=True)
        w = _regions._exact(w, approx)
    if pol.moe_weights == _WEIGHTS_ROUNDED:
        w = _regions._round_if(state.round_to, w)
    return w, ids


def _moe_combine(y, weights, ids, state, y_shared=None, shared_gate=None):
    """The combine as parity_moe_combine: the experts' unrounded fp32 outputs y [rows, k, H]
    (slot order), weights [rows, k], ids [rows, k], and a shared expert's unrounded output
    [rows, H] and gate logit [rows] (rounded) or None; fp32 [rows, H] rounded per moe_combine."""
    pol, k = state.pol, y.shape[1]

    def rnd(t):
        return _regions._round_if(state.round_to, t)

    def term(s):
        return y[:, s] * weights[:, s, None]
    if pol.moe_combine == _COMBINE_FP32:
        f = _serial_sum([term(s) for s in range(k)])
        if y_shared is not None:
            f = f + _sigmoid(shared_gate)[:, None] * y_shared
        return rnd(f)
    if pol.moe_combine == _COMBINE_HF:   # transformers' loop over the experts hit, ascending
        order = ids.argsort(dim=1, stable=True)
        yo = y.gather(1, order[:, :, None].expand(-1, -1, y.shape[2]))
        wo = weights.gather(1, order)
        a = _torch.zeros_like(y[:, 0])
        for s in range(k):
            a = rnd(a + rnd(rnd(yo[:, s]) * wo[:, s, None]))
    elif pol.moe_combine == _COMBINE_SGLANG and k == 1:
        a = rnd(term(0))
    elif k <= (4 if pol.moe_combine == _COMBINE_VLLM else 2):   # a 16-bit running sum
        a = _torch.zeros_like(y[:, 0])
        for s in range(k):
            a = rnd(a + rnd(term(s)))
    else:                                          # an fp32 sum of rounded terms, rounded once
        a = rnd(_serial_sum([rnd(term(s)) for s in range(k)]))
    if y_shared is not None:
        gate = rnd(_sigmoid(shared_gate))
        a = rnd(a + rnd(gate[:, None] * rnd(y_shared)))
    return a


def _swiglu_down_f32(gate, up, down_weight, state):
    """SwiGLU of 16-bit gate and up, then the down projection's unrounded fp32 output."""
    h = _regions._swiglu_f32(gate.float(), up.float(), state.pol)   # rounded where it rounds
    return _F.linear(h, down_weight.float())


def _moe_forward(state):
    def forward(self, hidden_states):
        shape = hidden_states.shape
        x = hidden_states.reshape(-1, shape[-1])
        router = self.gate
        logits = _F.linear(x, router.weight)   # the router GEMM, rounded as the model holds it
        weights, ids = _moe_route(logits.float(), router.top_k, router.norm_topk_prob, state)
        experts = self.experts
        y = x.new_zeros(x.shape[0], ids.shape[1], shape[-1], dtype=_f32)
        for e in _torch.unique(ids).tolist():
            rows, slots = (ids == e).nonzero(as_tuple=True)
            gate, up = _F.linear(x[rows], experts.gate_up_proj[e]).chunk(2, dim=-1)
            y = y.index_put((rows, slots), _swiglu_down_f32(gate, up, experts.down_proj[e],
                                                            state))
        y_shared = shared_gate = None
        shared = getattr(self, "shared_expert", None)
        if shared is not None:
            y_shared = _swiglu_down_f32(shared.gate_proj(x), shared.up_proj(x),
                                        shared.down_proj.weight, state)
            shared_gate = self.shared_expert_gate(x).float()[:, 0]
        out = _moe_combine(y, weights, ids, state, y_shared, shared_gate)
        out = out if state.round_to is None else out.to(state.dtype)
        return out.reshape(shape)
    return forward


# ---- the replaced forwards ---------------------------------------------------------------------

def _rotary_forward(state, head_dim, theta):
    def forward(self, x, position_ids):
        if x.dtype != state.dtype:
            raise ValueError("the model runs in %s, and the patch's policy computes in %s "
                             "(compute = %r): cast the model, or give the policy of its dtype"
                             % (x.dtype, state.dtype, state.pol.names()["compute"]))
        return _regions.rope_cos_sin(position_ids, head_dim, theta, state.pol)
    return forward


def _norm_forward(state, qk_norm):
    def forward(self, x):
        out = _regions._rmsnorm_f32(x.float(), self.weight.float(), self.variance_epsilon,
                                    state.pol, qk_norm)
        return out if state.round_to is None else out.to(state.dtype)
    return forward


def _mlp_forward(state):
    def forward(self, x):
        h = _regions._swiglu_f32(self.gate_proj(x).float(), self.up_proj(x).float(), state.pol)
        return self.down_proj(h if state.round_to is None else h.to(state.dtype))
    return forward


def _attention_forward(state):
    def forward(self, hidden_states, position_embeddings=None, attention_mask=None, cache=None,
                past_key_values=None, **kwargs):
        cache = cache if cache is not None else past_key_values
        shape = hidden_states.shape[:-1] + (-1, self.head_dim)
        q = self.q_proj(hidden_states).view(shape)
        k = self.k_proj(hidden_states).view(shape)
        v = self.v_proj(hidden_states).view(shape).transpose(1, 2)
        if getattr(self, "q_norm", None) is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        q, k = _rope_heads(q, k, *position_embeddings, state)
        q, k = q.transpose(1, 2), k.transpose(1, 2)
        if cache is not None:
            k, v = cache.update(k, v, self.layer_idx)
        out = _attend(q, k, v, attention_mask, self, state)
        out = out.transpose(1, 2).reshape(hidden_states.shape[:-1] + (-1,)).contiguous()
        if out.dtype == self.o_proj.weight.dtype or state.round_to is None:
            return self.o_proj(out), None
        # fp32 attention under a 16-bit policy: o_proj reads the unrounded output
        bias = self.o_proj.bias
        y = _F.linear(out, self.o_proj.weight.float(), None if bias is None else bias.float())
        return _regions._round(y, state.round_to).to(state.dtype), None
    return forward


def _layer_forward(state):
    def forward(self, hidden_states, attention_mask=None, position_ids=None, cache=None,
                use_cache=False, position_embeddings=None, past_key_values=None, **kwargs):
        cache = cache if cache is not None else past_key_values
        if state.round_to is not None and hidden_states.dtype == _f32:
            residual, norm_in = state.stream(hidden_states)   # the previous layer's fp32 sum
        else:
            residual = norm_in = hidden_states
        h = self.input_layernorm(norm_in)
        h, _ = self.self_attn(hidden_states=h, attention_mask=attention_mask,
                              position_ids=position_ids, cache=cache, use_cache=use_cache,
                              position_embeddings=position_embeddings, **kwargs)
        residual, norm_in = state.stream(residual.float() + h.float())
        h = self.mlp(self.post_attention_layernorm(norm_in))
        s = residual.float() + h.float()
        if state.round_to is None or state.pol.norm_input == 1:
            return s
        return s.to(state.dtype)
    return forward


def _head_forward(self, h):
    bias = self.bias
    return _F.linear(h.float(), self.weight.float(), None if bias is None else bias.float())


# ---- patch and unpatch --------------------------------------------------------------------------

def patch(model, policy):
    """Gives a transformers Qwen2/Qwen3/Llama model (a *ForCausalLM or its *Model) the rounding
    points of a libparity policy (a preset name such as "vllm+aligned", or a parity.Policy), in
    place; returns the model. See this module's docstring for what is replaced and what is
    refused (TypeError for something that is not a model, ValueError for an unsupported class,
    configuration or policy switch, parity.ParityError for an unknown policy name). A model
    patched already is re-patched with the new policy."""
    _check_model(model)
    pol = _policy(policy)
    base = model.model if hasattr(model, "model") and hasattr(model.model, "layers") else model
    model_dtype = base.embed_tokens.weight.dtype
    _check_policy(pol, model_dtype)
    theta = _check_config(model.config)
    for i, layer in enumerate(base.layers):
        if (_is_sparse(layer.mlp) and pol.moe_router == _ROUTER_TOPK_SOFTMAX
                and not layer.mlp.gate.norm_topk_prob):
            raise ValueError("policy switch moe_router = 'topk-softmax' needs norm_topk_prob, "
                             "and this model's config has norm_topk_prob = False")
        if not (_is_dense(layer.mlp) or _is_sparse(layer.mlp)):
            raise ValueError("layer %d's MLP is a %s, neither a SwiGLU MLP nor a mixture of "
                             "experts with fused gate_up_proj/down_proj experts (transformers "
                             "v5): parity.hf.patch does not patch it"
                             % (i, type(layer.mlp).__name__))
    if getattr(model, _ATTR, None) is not None:
        unpatch(model)
    state = _Patch(policy, pol)
    head_dim = base.layers[0].self_attn.head_dim if len(base.layers) else None
    state.replace(base.rotary_emb, _rotary_forward(state, head_dim, theta))
    norm = _norm_forward(state, False)
    for layer in base.layers:
        state.replace(layer, _layer_forward(state))
        state.replace(layer.input_layernorm, norm)
        state.replace(layer.post_attention_layernorm, norm)
        state.replace(layer.self_attn, _attention_forward(state))
        if getattr(layer.self_attn, "q_norm", None) is not None:
            qk = _norm_forward(state, True)
            state.replace(layer.self_attn.q_norm, qk)
            state.replace(layer.self_attn.k_norm, qk)
        state.replace(layer.mlp, _mlp_forward(state) if _is_dense(layer.mlp)
                      else _moe_forward(state))
    state.replace(base.norm, norm)
    head = getattr(model, "lm_head", None)
    if head is not None and pol.logits == 1 and state.round_to is not None:
        state.replace(head, _head_forward)
    model.__dict__[_ATTR] = state
    return model


def unpatch(model):
    """Takes a patch away: every module's forward is transformers' own again, so the model's
    outputs are bitwise what they were before patch(). Returns the model. Raises TypeError for
    something that is not a model, ValueError for a model that is not patched."""
    if not isinstance(model, _torch.nn.Module):
        raise TypeError("model must be a transformers model (a torch.nn.Module), not %s"
                        % type(model).__name__)
    state = model.__dict__.get(_ATTR)
    if state is None:
        raise ValueError("this %s is not patched: parity.hf.patch was not called on it, or "
                         "unpatch was already" % type(model).__name__)
    for module, before in reversed(state.saved):
        if before is _NO_FORWARD:
            module.__dict__.pop("forward", None)
        else:
            module.__dict__["forward"] = before
    del model.__dict__[_ATTR]
    return model


def patched_policy(model):
    """The policy a model is patched with (as given to patch()), or None."""
    state = getattr(model, "__dict__", {}).get(_ATTR)
    return None if state is None else state.policy

