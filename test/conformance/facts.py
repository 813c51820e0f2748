"""The facts about transformers' source that the hf-eager and hf-sdpa presets rely on, checked
against the installed transformers: each names the region (the bisect's point kind) it sets, the
function that holds it and the statements that must be there; check() prints each with pass/fail,
the source file and a hash of the function's source, so that a transformers release that moves
a rounding point fails here, naming the region, before any number is compared.

Run by conformance.py with the tier's virtual environment (torch and transformers installed).
"""
import hashlib
import inspect
import os
import re

import torch
import transformers
from transformers import activations, masking_utils
from transformers.integrations import sdpa_attention
from transformers.models.llama import modeling_llama
from transformers.models.qwen2 import modeling_qwen2
from transformers.models.qwen2_moe import modeling_qwen2_moe
from transformers.models.qwen3 import modeling_qwen3
from transformers.models.qwen3_moe import modeling_qwen3_moe

#: The modeling modules of the five architectures the tier builds, by model_type.
MODELING = {"qwen2": modeling_qwen2, "qwen3": modeling_qwen3, "llama": modeling_llama,
            "qwen3_moe": modeling_qwen3_moe, "qwen2_moe": modeling_qwen2_moe}
_PREFIX = {"qwen2": "Qwen2", "qwen3": "Qwen3", "llama": "Llama", "qwen3_moe": "Qwen3Moe",
           "qwen2_moe": "Qwen2Moe"}


def _facts():
    """[(kind, presets, what, function, [statement])] over the five architectures; a statement
    is a string, or a tuple of the forms transformers releases have written it in (any one)."""
    both, eager, sdpa = ("hf-eager", "hf-sdpa"), ("hf-eager",), ("hf-sdpa",)
    facts = []
    for model_type, module in MODELING.items():
        prefix = _PREFIX[model_type]
        norm = getattr(module, prefix + "RMSNorm").forward
        facts.append(("norm", both, "%sRMSNorm widens to fp32, then rounds x*rsqrt(mean(x^2)+eps) "
                      "to the input dtype before the weight multiply (2 roundings)" % prefix, norm,
                      ["hidden_states = hidden_states.to(torch.float32)",
                       "variance = hidden_states.pow(2).mean(-1, keepdim=True)",
                       "hidden_states * torch.rsqrt(variance + self.variance_epsilon)",
                       "return self.weight * hidden_states.to(input_dtype)"]))
        layer = getattr(module, prefix + "DecoderLayer").forward
        facts.append(("residual", both, "%sDecoderLayer adds the residual in the model dtype (the "
                      "norm reads the rounded sum)" % prefix, layer,
                      ["hidden_states = residual + hidden_states",
                       "hidden_states = self.post_attention_layernorm(hidden_states)"]))
        rotary = getattr(module, prefix + "RotaryEmbedding")
        facts.append(("rope", both, "%sRotaryEmbedding: fp32 inv_freq = 1/base^(2i/d), fp32 "
                      "angles, cos/sin cast to the input dtype (bf16 table)" % prefix,
                      rotary.compute_default_rope_parameters,
                      [("inv_freq = 1.0 / (base ** (torch.arange(0, dim, 2, dtype=torch.float) "
                        "/ dim))",
                        "inv_freq = 1.0 / (base ** (torch.arange(0, dim, 2, dtype=torch.int64)"
                        ".to(device=device, dtype=torch.float) / dim))")]))
        facts.append(("rope", both, "%sRotaryEmbedding.forward rounds cos and sin to x's dtype"
                      % prefix, rotary.forward,
                      ["emb = torch.cat((freqs, freqs), dim=-1)",
                       "return cos.to(dtype=x.dtype), sin.to(dtype=x.dtype)"]))
        facts.append(("rope", both, "apply_rotary_pos_emb: (q*cos) + (rotate_half(q)*sin) in the "
                      "model dtype (3 roundings), half-split pairs", module.apply_rotary_pos_emb,
                      ["q_embed = (q * cos) + (rotate_half(q) * sin)",
                       "k_embed = (k * cos) + (rotate_half(k) * sin)"]))
        facts.append(("rope", both, "rotate_half pairs element i with i + d/2", module.rotate_half,
                      ["return torch.cat((-x2, x1), dim=-1)"]))
        mlp = getattr(module, prefix + "MLP").forward
        facts.append(("swiglu", both, "%sMLP: down(act(gate(x)) * up(x)), silu and the product "
                      "each rounded to the model dtype (2 roundings)" % prefix, mlp,
                      ["self.down_proj(self.act_fn(self.gate_proj(x)) * self.up_proj(x))"]))
        facts.append(("attention", eager, "eager_attention_forward: scores = matmul(q, k^T) * "
                      "scaling + mask in the model dtype, softmax in fp32 then to the query "
                      "dtype, P @ V", module.eager_attention_forward,
                      ["attn_weights = torch.matmul(query, key_states.transpose(2, 3)) * scaling",
                       "attn_weights = attn_weights + attention_mask",
                       "nn.functional.softmax(attn_weights, dim=-1, dtype=torch.float32)"
                       ".to(query.dtype)",
                       "attn_output = torch.matmul(attn_weights, value_states)"]))
        if model_type.endswith("_moe"):
            router = getattr(module, prefix + "TopKRouter").forward
            facts.append(("moe_route", both, "%sTopKRouter: logits in the model dtype, softmax in "
                          "fp32, top-k, optional renormalisation, weights cast to the logits' "
                          "dtype" % prefix, router,
                          ["router_logits = F.linear(hidden_states, self.weight)",
                           "torch.nn.functional.softmax(router_logits, dtype=torch.float, dim=-1)",
                           "torch.topk(router_probs, self.top_k, dim=-1)",
                           "router_top_value = router_top_value.to(router_logits.dtype)"]))
            experts = getattr(module, prefix + "Experts").forward
            facts.append(("moe_combine", both, "%sExperts (experts_implementation 'eager'): "
                          "round(round(y) x w) added into the model-dtype output expert by "
                          "expert, in ascending expert index" % prefix, experts,
                          ["for expert_idx in expert_hit:",
                           "current_hidden_states = current_hidden_states * "
                           "top_k_weights[token_idx, top_k_pos, None]",
                           "final_hidden_states.index_add_(0, token_idx, "
                           "current_hidden_states.to(final_hidden_states.dtype))"]))
        if model_type == "qwen2_moe":
            block = module.Qwen2MoeSparseMoeBlock.forward
            facts.append(("moe_combine", both, "Qwen2MoeSparseMoeBlock: sigmoid(gate logit) x "
                          "shared expert output, then added to the experts' sum, each in the "
                          "model dtype", block,
                          ["shared_expert_output = F.sigmoid(self.shared_expert_gate("
                           "hidden_states_reshaped)) * shared_expert_output",
                           "expert_output = expert_output + shared_expert_output"]))
        causal_lm = getattr(module, prefix + "ForCausalLM").forward
        facts.append(("logits", both, "%sForCausalLM: logits = lm_head(h) in the model dtype "
                      "(bf16 logits)" % prefix, causal_lm,
                      ["logits = self.lm_head(hidden_states"]))
    facts.append(("swiglu", both, "ACT2FN['silu'] is SiLUActivation = torch.nn.functional.silu",
                  activations.SiLUActivation.forward, ["return nn.functional.silu(input)"]))
    facts.append(("attention", eager, "eager_mask: the causal mask's masked entries are the "
                  "dtype's most negative finite value", masking_utils.eager_mask,
                  ["min_dtype = torch.finfo(dtype).min"]))
    facts.append(("attention", sdpa, "sdpa_attention_forward calls torch's "
                  "scaled_dot_product_attention (is_causal without a mask in a prefill)",
                  sdpa_attention.sdpa_attention_forward,
                  ["is_causal = q_length > 1 and attention_mask is None and is_causal",
                   "torch.nn.functional.scaled_dot_product_attention("]))
    return facts


def unwrapped(function):
    """The Python function behind `function`: transformers wraps some (apply_rotary_pos_emb) in a
    module made by the `kernels` package's use_kernel_forward_from_hub, whose forward calls the
    original, held in its closure as `func` (used as is unless the model is kernelized)."""
    if inspect.isfunction(function) or inspect.ismethod(function):
        return function
    forward = type(function).forward
    cells = dict(zip(forward.__code__.co_freevars, forward.__closure__ or ()))
    if "func" not in cells:
        raise TypeError("%r: not a function, nor a kernels hub wrapper of one" % (function,))
    return cells["func"].cell_contents


def _normalized(text):
    return re.sub(r"\s+", " ", text)


def source_hash(function):
    """The first 12 hex digits of the sha256 of the function's source."""
    return hashlib.sha256(inspect.getsource(function).encode()).hexdigest()[:12]


def check(log):
    """Prints (through log) every fact with PASS/FAIL, its file, function and source hash;
    returns the failed facts' [(kind, what)]."""
    root = os.path.dirname(transformers.__file__)
    failed = []
    log("transformers %s, torch %s" % (transformers.__version__, torch.__version__))
    log("facts the presets rely on, in the installed transformers (%s):" % root)
    for kind, presets, what, function, statements in _facts():
        function = unwrapped(function)
        source = _normalized(inspect.getsource(function))
        missing = [s for s in statements
                   if not any(_normalized(form) in source
                              for form in (s if isinstance(s, tuple) else (s,)))]
        path = os.path.relpath(inspect.getsourcefile(function), root)
        log("  %s  %-9s %-17s %s" % ("PASS" if not missing else "FAIL", kind, "/".join(presets),
                                     what))
        log("        %s %s sha256:%s" % (path, function.__qualname__, source_hash(function)))
        for s in missing:
            log("        missing: %s" % s)
        if missing:
            failed.append((kind, what))
    return failed


# The fast exponential torch's CPU flash-attention kernel takes (fexp_u20 in ATen's vectorized
# float, after Malossi et al., "Fast Exponential Computation on SIMD Architectures"): 2^(x log2 e)
# with the fraction's 2^f corrected by a cubic and the sum placed in the exponent field by a
# truncating conversion. Its constants, as ATen defines them:
_FEXP_CUBIC = (0.00010703434948458272, 0.30354260500649682, -0.22433836478672356,
               -0.079204240219773236)
_LOG2E = 0x3FB8AA3B          # log2(e) as fp32 bits
_LN_FLT_MIN = 0xC2AEAC50     # ln(FLT_MIN): below it the result is 0


def _fp32_bits(bits):
    return torch.tensor([bits], dtype=torch.int64).to(torch.int32).view(torch.float32)[0]


def _fma(a, b, c):
    """fp32 fused multiply-add (the product exact in float64, one rounding)."""
    return (a.double() * b.double() + c.double()).float()


def fast_exp(x):
    """torch's CPU flash kernel's exp (fexp_u20) on an fp32 tensor, operation for operation."""
    c0, c1, c2, c3 = (torch.tensor(c, dtype=torch.float32) for c in _FEXP_CUBIC)
    finite = torch.where(torch.isinf(x), torch.full_like(x, -100.0), x)
    scaled = finite * _fp32_bits(_LOG2E)
    fraction = scaled - torch.floor(scaled)
    poly = _fma(fraction, _fma(fraction, _fma(fraction, c3, c2), c1), c0)
    field = _fma(torch.tensor(2.0 ** 23), scaled - poly, torch.tensor(2.0 ** 23 * 127))
    bits = torch.trunc(field.double()).to(torch.int64).to(torch.int32)
    return torch.where(finite < _fp32_bits(_LN_FLT_MIN), torch.zeros_like(x),
                       bits.view(torch.float32))


def _flash(q, k, v, exp, dtype):
    """The flash point hf-sdpa takes, in torch: fp32 scores x scale, causal, P = exp(s - max)
    rounded to dtype for P.V (fp32 sums), l over the unrounded P, out = O / l rounded."""
    length, head_dim = q.shape[-2], q.shape[-1]
    causal = torch.triu(torch.ones(length, length, dtype=torch.bool), 1)
    scores = (q.float() @ k.float().transpose(-1, -2) * head_dim ** -0.5).masked_fill(
        causal, float("-inf"))
    p = exp(scores - scores.max(-1, keepdim=True).values)
    return ((p.to(dtype).float() @ v.float()) / p.sum(-1, keepdim=True)).to(dtype)


def check_flash_exp(log, tokens=128):
    """The sdpa claim's reason, measured: torch's scaled_dot_product_attention on random q, k, v
    (4 heads of 16, causal) against the flash point with an accurate exp and with fast_exp, in
    bf16 and fp16. Returns the failures (fast_exp not giving the kernel's bits)."""
    failed = []
    generator = torch.Generator().manual_seed(20261207)
    for dtype, bound in ((torch.bfloat16, 1.0), (torch.float16, 0.999)):
        q, k, v = (torch.randn(1, 4, tokens, 16, generator=generator).to(dtype)
                   for _ in range(3))
        kernel = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
        accurate = float((_flash(q, k, v, torch.exp, dtype) == kernel).float().mean())
        fast = float((_flash(q, k, v, fast_exp, dtype) == kernel).float().mean())
        ok = fast >= bound
        log("  %s  attention hf-sdpa          torch's CPU sdpa kernel, %s: the flash point with "
            "an accurate exp gives %.2f%% of its bits, with fexp_u20 %.2f%%"
            % ("PASS" if ok else "FAIL", str(dtype).replace("torch.", ""), 100 * accurate,
               100 * fast))
        if not ok:
            failed.append(("attention", "torch's CPU flash kernel no longer takes fexp_u20 "
                           "(%s: %.2f%%)" % (dtype, 100 * fast)))
    return failed
