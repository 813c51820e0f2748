"""A PyTorch learner whose forward is libparity's forward: log-probs bitwise equal to
parity_score's and the sampler's, with gradients from ordinary autograd.

Imported through parity.torch (``from parity.torch import CausalLM``); needs torch.

The forward runs the pieces of libparity's own forward, on CPU tensors:
  - the embedding gather, every linear layer, causal GQA attention and the head (final
    residual + RMSNorm + lm_head + log-softmax of the targets) through the C kernel entry
    points (parity_embedding, parity_linear, parity_attention, parity_head_logprobs: the very
    functions parity_score runs);
  - residual + RMSNorm, q/k-norm and SwiGLU through the C region kernels
    (parity_rmsnorm_residual, parity_rmsnorm, parity_swiglu, on the fp32 tensors through their
    _f32 entries, on the module's pool) under compute "bf16", and through parity.torch's exact
    torch versions under compute "fp32" (whose unrounded outputs the bf16 buffers of the C
    region kernels cannot hold); RoPE through the C kernel (parity_rope, parity_rope_f32)
    under compute "bf16" and "fp16", through parity.torch's exact version under "fp32";
  - no torch operation over a whole activation or weight in between (the masters' bf16 casts
    by parity_bf16_from_f32_array, the head's rows gathered by parity_embedding): each would
    wake torch's threads between the library's calls, which on a machine of few cores then
    contend with the library's pool;
  - every rounding point as parity.torch.round_point: bf16 values held in fp32 tensors.
So the log-probs equal parity_score's bit for bit, for every preset (and +fp32-head, +fp16),
both backends and the three log-prob modes. Under compute "fp16" the same holds with fp16 in
place of bf16: the kernels read the masters' fp16 casts, the region kernels fp16 buffers, and
every rounding point rounds to fp16 (a master beyond fp16's range raises ValueError). Under
an fp8 gemm ("+fp8-block:RULE", "+mxfp8:RULE") the decoder layers' linear layers quantize the
fp32 masters and their inputs with the rule, as the model's fp8 GEMM does (so a model synced
with the masters scores the same bits), with gradients straight through both quantizers.

Mixture-of-experts models (Qwen3-MoE, Qwen2-MoE): a sparse layer runs the forward's steps
(lib/engine/moe_layer.c) on the same entry points: the router's logits (parity_linear on the
bf16 router, never quantized, rounded), the route (parity_moe_route: the policy's moe_router
and moe_weights; or a routing record replayed, forward(routes=...)), each expert over the rows
that chose it (gate and up rounded, SwiGLU, the down projection's fp32 output), Qwen2-MoE's
shared expert and its gate, and the combine (parity_moe_combine). Backward: the router's
weights are differentiated in fp32 (softmax over the experts, the chosen ones, renormalised;
a topk-softmax router's softmax over the chosen) with respect to its logits, the choice itself
a constant; the combine as sum_s w_s y_s + sigmoid(g) y_shared.

With a training recipe (CausalLM(recipe=...), linear(recipe=...); parity.recipes) the decoder
layers' linear layers keep this forward and run the recipe's dgrad and wgrad GEMMs on quantized
operands instead (python/parity/_recipe_linear.py); everything else is as below.

The backward is in fp32: each kernel call is an autograd Function whose backward is the fp32
formula of what it computes (x W^T; softmax attention; RMSNorm, SwiGLU, RoPE's rotation,
lm_head and log_softmax of the targets), evaluated at the saved inputs, and every rounding
point passes its gradient straight through (d round(x)/dx = 1), as parity.torch documents. The
weights' gradients reach the fp32 masters straight through the bf16 cast. The backward runs on
the library's kernels, each piece one call over the batch: the linear layers' products on
parity_matmul (transposed operands read in place), attention's on parity_attention_backward,
the norms' and SwiGLU's on parity_rmsnorm_backward and parity_swiglu_backward (autograd's steps
of the formula, in C); the head's through torch autograd. With CausalLM(gradients="bf16") the
linear layers' backward GEMMs take the incoming gradient rounded to bf16, everything else as
above (_LinearBf16Gradients).

What the backward keeps (fp32, 4 bytes a value; H = hidden size, Q = heads x head_dim,
KV = kv_heads x head_dim, I = intermediate size), per token and layer under compute "bf16":
the linear layers' inputs (2H + Q + I), the norms' inputs (4H, and Q + KV for q/k-norm), the
attention's q, k, v (Q + 2KV) and SwiGLU's gate and up (2I): about 4 (6H + 3Q + 3KV + 3I)
bytes; plus, per forward, the bf16 weights each linear layer read (2 bytes a parameter) and
the head's inputs (2H a scored token). The logits are not kept: the head's backward
recomputes them. Under compute "fp32" the regions' exact torch graphs keep more.
CausalLM.saved_bytes(sequences) measures it for a batch.
"""
import ctypes
import json
import os
import zlib

import torch as _torch

from . import _lib, _safetensors
from . import _recipe_linear, _torch_moe, _torch_regions
from ._lib import lib, ParityError
from ._routes import route_ids, sparse_layers
from .model import Model, score_options
from .pool import Pool
from .policy import policy_struct
from .recipes import Recipe

__all__ = ["CausalLM", "Pool", "embedding", "linear", "attention", "head_logprobs",
           "logprobs_from_logits", "read_checkpoint"]

_f32 = _torch.float32
_bf16 = _torch.bfloat16
_f16 = _torch.float16
_BF16, _F16, _F32 = 0, 1, 2   # parity_dtype


# ---- arguments ---------------------------------------------------------------------------------

def _tensor(t, name, dtype, ndim=None):
    """t as a tensor the C kernels may read: a CPU tensor of `dtype`, contiguous, with `ndim`
    dimensions; otherwise a TypeError / ValueError that says what to change."""
    if not isinstance(t, _torch.Tensor):
        raise TypeError("%s must be a torch.Tensor, not %s" % (name, type(t).__name__))
    if t.device.type != "cpu":
        raise ValueError("%s is on %s: libparity computes on the CPU (move it with .cpu())"
                         % (name, t.device))
    if t.dtype != dtype:
        raise TypeError("%s must be %s, not %s" % (name, dtype, t.dtype))
    if ndim is not None and t.dim() != ndim:
        raise ValueError("%s must have %d dimensions, not %d (shape %s)"
                         % (name, ndim, t.dim(), tuple(t.shape)))
    if not t.is_contiguous():
        raise ValueError("%s is not contiguous (strides %s): pass x.contiguous()"
                         % (name, t.stride()))
    return t


def _shape(t, name, shape):
    if tuple(t.shape) != tuple(shape):
        raise ValueError("%s has shape %s, expected %s" % (name, tuple(t.shape), tuple(shape)))


def _backend(backend):
    value = _lib.BACKENDS.get(backend) if isinstance(backend, str) else None
    if value is None:
        raise ValueError("backend must be one of %s, not %r" % (", ".join(_lib.BACKENDS), backend))
    return value


def _pol(policy):
    """(the C struct, the parity.torch Policy) of a preset name or a Policy."""
    return policy_struct(policy), _torch_regions._policy(policy)


def _compute_fp32(pol):
    return pol.compute == 1


def _half(pol):
    """The 16-bit dtype of a policy's values: float16 under compute "fp16", else bfloat16."""
    return _f16 if pol.compute == 2 else _bf16


def _check_fp16_range(w, h, name):
    """h = fp16(w): a finite master that became infinite is beyond what fp16 holds."""
    if bool(_torch.isinf(h).any()) and not bool(_torch.isinf(w).any()):
        raise ValueError("%s holds a value beyond fp16's range (|x| >= 65520 rounds to "
                         "infinity), which an fp16 policy cannot hold" % name)


def _weight_data(w, pol, name="a weight", pool=None):
    """What the kernels read of a weight (an fp32 master tensor): its bf16 round-to-nearest-
    even bits (compute "bf16"; cast by the library on `pool`, a pool handle or None,
    parity_bf16_from_f32_array: torch's cast, the same bits, would wake torch's own threads
    between the library's calls), its fp16 ones (compute "fp16"; a master beyond fp16's range
    raises ValueError, as the library refuses it) or the master itself (compute "fp32");
    (tensor, dtype)."""
    w = w.detach()
    if _compute_fp32(pol):
        return w.contiguous(), _F32
    if pol.compute == 2:
        h = w.to(_f16).contiguous()
        _check_fp16_range(w, h, name)
        return h, _F16
    w = w.contiguous()
    data = _torch.empty(w.shape, dtype=_bf16)
    lib.parity_bf16_from_f32_array(pool, w.numel(), _addr(w), _addr(data))
    return data, _BF16


def _weight_values(w, pol, name="a weight"):
    """The fp32 values the forward multiplies by (bf16(w) under compute "bf16", fp16(w) under
    "fp16", with _weight_data's range check), with the gradient reaching w straight through
    the cast."""
    if _compute_fp32(pol):
        return w
    v = _torch_regions._round(w, _half(pol))
    if pol.compute == 2:
        _check_fp16_range(w, v, name)
    return v


def _addr(t):
    return ctypes.c_void_p(t.data_ptr()) if t is not None else None


def _pool_handle(pool):
    if pool is None:
        return None
    if not isinstance(pool, Pool):
        raise TypeError("pool must be a parity.torch.Pool or None, not %s" % type(pool).__name__)
    return pool.handle


# ---- the kernel calls as autograd Functions -------------------------------------------------

class _Embedding(_torch.autograd.Function):
    @staticmethod
    def forward(ctx, tokens, table, data, dtype):
        rows, (vocab, dim) = tokens.numel(), data.shape
        out = _torch.empty(rows, dim, dtype=_f32)
        lib.parity_embedding(rows, _addr(tokens), vocab, dim, dtype, _addr(data), dim, _addr(out),
                             dim)
        ctx.save_for_backward(tokens)
        ctx.vocab = vocab
        return out

    @staticmethod
    def backward(ctx, grad):
        (tokens,) = ctx.saved_tensors
        g = _torch.zeros(ctx.vocab, grad.shape[1], dtype=_f32)
        g.index_add_(0, tokens.long(), grad)
        return None, g, None, None


def embedding(tokens, table, policy="aligned"):
    """The embedding rows of `tokens` (an int32 tensor of ids) from `table` (the fp32 master
    [vocab, dim]; the forward reads bf16(table) under compute "bf16"), as parity_embedding:
    fp32 [len(tokens), dim]. The gradient goes to table's rows (index_add)."""
    _tensor(tokens, "tokens", _torch.int32, 1)
    _tensor(table, "table", _f32, 2)
    _, pol = _pol(policy)
    data, dtype = _weight_data(table, pol)
    return _Embedding.apply(tokens, table, data, dtype)


def _gather_rows(table, rows):
    """table[rows] of a 2-D fp32 tensor (rows an int32 tensor of row indices, at least one),
    copied by the library (parity_embedding on an F32 table) rather than by torch, whose
    threads would wake between the library's calls."""
    t = table.detach().contiguous()
    n, dim = t.shape
    out = _torch.empty(rows.numel(), dim, dtype=_f32)
    lib.parity_embedding(rows.numel(), _addr(rows), n, dim, _F32, _addr(t), dim, _addr(out), dim)
    return out


class _Rows(_torch.autograd.Function):
    """x.index_select(0, rows) by _gather_rows (rows32 int32, rows the same as int64);
    backward as torch's index_select's: zeros with the gradient's rows added at `rows`."""

    @staticmethod
    def forward(ctx, x, rows32, rows):
        ctx.save_for_backward(rows)
        ctx.n = x.shape[0]
        return _gather_rows(x, rows32)

    @staticmethod
    def backward(ctx, g):
        (rows,) = ctx.saved_tensors
        gx = _torch.zeros(ctx.n, g.shape[1], dtype=g.dtype)
        gx.index_add_(0, rows, g)
        return gx, None, None


_round_in_place = _torch_regions._round_in_place


class _Linear(_torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, bias, data, dtype, bias_values, pol_c, backend, pool,
                rounding=None):
        (m, k), n = x.shape, data.shape[0]
        y = _torch.empty(m, n, dtype=_f32)
        lib.parity_linear(pool, ctypes.byref(pol_c), backend, m, k, n, _addr(x), k, dtype,
                          _addr(data), k, _addr(bias_values), _addr(y), n)
        _round_in_place(y, rounding)
        ctx.save_for_backward(x, data)
        ctx.has_bias = bias is not None
        ctx.pool = pool
        return y

    @staticmethod
    def backward(ctx, gy):
        x, data = ctx.saved_tensors
        # data.t() and the transposes of gy and x are views: parity_matmul reads them in place
        gx = _matmul_t(gy, data.t(), ctx.pool) if ctx.needs_input_grad[0] else None
        gw = _matmul_t(gy.t(), x.t(), ctx.pool) if ctx.needs_input_grad[1] else None
        gb = gy.sum(0) if ctx.has_bias and ctx.needs_input_grad[2] else None
        return gx, gw, gb, None, None, None, None, None, None, None


class _LinearBf16Gradients(_Linear):
    """_Linear with the backward of CausalLM(gradients="bf16"): the same forward; the two
    GEMMs of the backward take the incoming gradient rounded to bf16 (nearest even, a new
    tensor: gy itself is untouched), so that both operands are bf16 values (the weights are,
    and the saved input is under a bf16 policy) and the GEMMs run on the CPU's bf16 dot
    products: gx = bf16(gy) W, gW = bf16(gy)^T x, exact products summed in fp32 in pair32
    order, fp32 results. The bias' gradient is the fp32 column sum of gy itself."""

    @staticmethod
    def backward(ctx, gy):
        x, data = ctx.saved_tensors
        g16 = _torch_regions._rounded(gy, _bf16)
        gx = _matmul_t(g16, data.t(), ctx.pool) if ctx.needs_input_grad[0] else None
        gw = _matmul_t(g16.t(), x.t(), ctx.pool) if ctx.needs_input_grad[1] else None
        gb = gy.sum(0) if ctx.has_bias and ctx.needs_input_grad[2] else None
        return gx, gw, gb, None, None, None, None, None, None, None


class _GateUpSwiglu(_torch.autograd.Function):
    """A SwiGLU MLP's first half, swiglu(round(x Wg^T), round(x Wu^T)), as one GEMM over the
    two weights side by side (data: bf16 [2 * inter, k], the gate's rows then the up's), its
    output [rows, 2 * inter] holding the gate's columns then the up's. Each output column is
    the bits of its own projection's GEMM (an output depends on its row of x and of the
    weights alone), so the same values as two _Linear calls and _SwigluC; swiglu reads the
    two halves through their row stride, without copies. Backward: swiglu's gradients written
    into the two halves of one [rows, 2 * inter] buffer, so that the two weight gradients are
    one GEMM (x^T packed once; each row of it the bits of its own GEMM) and the input gradient
    the two GEMMs' sum, as autograd adds them (one fp32 add: the same bits in either order).
    gradients "bf16": the GEMMs take the incoming gradient rounded to bf16, as
    _LinearBf16Gradients'."""

    @staticmethod
    def forward(ctx, x, w_gate, w_up, data, pol_c, backend, pool, rounding, gradients):
        (m, k), n = x.shape, data.shape[0]
        inter = n // 2
        y = _torch.empty(m, n, dtype=_f32)
        lib.parity_linear(pool, ctypes.byref(pol_c), backend, m, k, n, _addr(x), k, _BF16,
                          _addr(data), k, None, _addr(y), n)
        _round_in_place(y, rounding)
        out = _torch.empty(m, inter, dtype=_f32)
        lib.parity_swiglu_f32(pool, ctypes.byref(pol_c), m, inter, _addr(y), n,
                              _addr(y[:, inter:]), n, _addr(out), inter)
        ctx.save_for_backward(x, data, y)
        ctx.pool, ctx.gradients = pool, gradients
        return out

    @staticmethod
    def backward(ctx, grad):
        x, data, y = ctx.saved_tensors
        m, n = y.shape
        inter = n // 2
        grad = grad.contiguous()
        gy = _torch.empty(m, n, dtype=_f32)
        lib.parity_swiglu_backward(ctx.pool, m, inter, _addr(y), n, _addr(y[:, inter:]), n,
                                   _addr(grad), inter, _addr(gy), n, _addr(gy[:, inter:]), n)
        if ctx.gradients == "bf16":
            gy = _torch_regions._rounded(gy, _bf16)
        gx = gw_gate = gw_up = None
        if ctx.needs_input_grad[0]:
            gx = _matmul_t(gy[:, :inter], data[:inter].t(), ctx.pool)
            gx += _matmul_t(gy[:, inter:], data[inter:].t(), ctx.pool)
        if ctx.needs_input_grad[1] or ctx.needs_input_grad[2]:
            gw = _matmul_t(gy.t(), x.t(), ctx.pool)
            gw_gate, gw_up = gw[:inter], gw[inter:]
        return gx, gw_gate, gw_up, None, None, None, None, None, None


#: The gradient arithmetic of the linear layers' backward GEMMs (CausalLM(gradients=...)).
GRADIENTS = ("fp32", "bf16")


def _check_gradients(gradients, pol, pol_c, recipe):
    """gradients ("fp32" or "bf16") where the policy allows it, else ValueError saying why."""
    if gradients not in GRADIENTS:
        raise ValueError("gradients must be one of %s, not %r" % (", ".join(GRADIENTS),
                                                                 gradients))
    if gradients == "bf16":
        why = None
        if pol.compute != 0:
            fmt = "fp32" if _compute_fp32(pol) else "fp16"
            why = "its compute is %s: the weights the forward reads are %s values" % (fmt, fmt)
        elif pol_c.gemm != 0:
            why = ("its quantized GEMM multiplies by dequantized weights, which are not bf16 "
                   "values (and a training recipe runs its own backward GEMMs)"
                   if recipe is None else "a training recipe runs its own backward GEMMs")
        if why:
            raise ValueError("gradients='bf16' runs the linear layers' backward GEMMs on bf16 "
                             "values, the weights' included, which this policy does not give: "
                             "%s (use gradients='fp32')" % why)
    return gradients


def _matmul_t(a, b, pool):
    """a b^T in fp32 for the backward (a [m, k] fp32, b [n, k] bf16 or fp32 (fp16 widened), any
    strides: transposed views are read in place) on libparity's GEMM, parity_matmul: Debian's
    torch multiplies fp32 matrices with a generic BLAS (about 10 GFLOP/s on the machines here).
    b of bf16 values (the weights, and the activations under compute "bf16") runs the
    bf16-weight GEMM, exact products of fp32 by bf16 summed in pair32 order with the bf16
    backend's denormal flush; other b the fp32 GEMM (dot16 order)."""
    m, k = a.shape
    n = b.shape[0]
    if b.dtype == _f16:
        b = b.to(_f32)
    y = _torch.empty(m, n, dtype=_f32)
    lib.parity_matmul(pool, m, n, k, _addr(a), a.stride(0), a.stride(1),
                      _BF16 if b.dtype == _bf16 else _F32, _addr(b), b.stride(0), b.stride(1),
                      _addr(y), n)
    return y


_E4M3_VALUES = []


def _e4m3_values():
    """The fp32 value of each of the 256 E4M3 codes (parity_fp8_to_f32), as a tensor."""
    if not _E4M3_VALUES:
        codes = (ctypes.c_uint8 * 256)(*range(256))
        out = (ctypes.c_float * 256)()
        lib.parity_fp8_to_f32(0, 256, codes, out)
        _E4M3_VALUES.append(_torch.tensor(list(out), dtype=_f32))
    return _E4M3_VALUES[0]


_E2M1_VALUES = _torch.tensor([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0,
                              -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0], dtype=_f32)


def _low_bit_dequantized(t, pol_c, weight):
    """The 4-bit and ternary formats' dequantized values (see _fp8_dequantized): NVFP4
    e2m1 * e4m3 * s2 (s2 per tensor for a weight, per row for activations), MXFP4 e2m1 *
    2^(b - 127), ternary code / s (s_w per tensor, s_x per row)."""
    rows, cols = t.shape
    per_row = 0 if weight else 1
    n_t = rows if per_row else 1
    if pol_c.gemm == 5:
        codes = _torch.empty(rows, cols, dtype=_torch.int8)
        s = _torch.empty(n_t, dtype=_f32)
        lib.parity_ternary_quantize(pol_c.quantizer, per_row, rows, cols, _addr(t), cols,
                                    _addr(codes), cols, _addr(s))
        return codes.to(_f32) / s.reshape(-1, 1)
    codes = _torch.empty(rows, cols, dtype=_torch.uint8)
    if pol_c.gemm == 4:
        e8m0 = _torch.empty(rows, -(-cols // 32), dtype=_torch.uint8)
        lib.parity_mxfp4_quantize(pol_c.quantizer, rows, cols, _addr(t), cols, _addr(codes), cols,
                                  _addr(e8m0))
        scales = _torch.pow(2.0, e8m0.to(_torch.float64) - 127).to(_f32)  # exact powers of two
        return _E2M1_VALUES[codes.long()] * scales.repeat_interleave(32, 1)[:, :cols]
    sf = _torch.empty(rows, -(-cols // 16), dtype=_torch.uint8)
    s2 = _torch.empty(n_t, dtype=_f32)
    lib.parity_nvfp4_quantize(pol_c.quantizer, per_row, rows, cols, _addr(t), cols, _addr(codes),
                              cols, _addr(sf), _addr(s2))
    block = _e4m3_values()[sf.long()].repeat_interleave(16, 1)[:, :cols]
    # (e2m1 * sf) is exact in fp32; then one rounding by s2, as the GEMM's alpha applies it
    return (_E2M1_VALUES[codes.long()] * block) * s2.reshape(-1, 1)


def _fp8_dequantized(t, pol_c, weight):
    """code * scale of t quantized as the policy's quantized GEMM quantizes it (parity_linear):
    a weight in 128 x 128 blocks (1 x 32 under MXFP8), an activation per row in 1 x 128 groups
    (1 x 32), with the policy's rule: the values the forward's dot products multiply; the
    4-bit and ternary formats by _low_bit_dequantized."""
    t = t.detach().contiguous()
    rows, cols = t.shape
    if pol_c.gemm >= 3:
        return _low_bit_dequantized(t, pol_c, weight)
    codes = _torch.empty(rows, cols, dtype=_torch.uint8)
    if pol_c.gemm == 2:
        br, bc = 1, 32
        e8m0 = _torch.empty(rows, -(-cols // 32), dtype=_torch.uint8)
        lib.parity_mxfp8_quantize(pol_c.quantizer, rows, cols, _addr(t), cols, _addr(codes), cols,
                                  _addr(e8m0))
        scales = _torch.pow(2.0, e8m0.to(_torch.float64) - 127).to(_f32)  # exact powers of two
    else:
        br, bc = (128 if weight else 1), 128
        scales = _torch.empty(-(-rows // br), -(-cols // bc), dtype=_f32)
        lib.parity_fp8_quantize_blocks(pol_c.quantizer, rows, cols, _addr(t), cols, br, bc,
                                       _addr(codes), cols, _addr(scales))
    s = scales.repeat_interleave(br, 0)[:rows].repeat_interleave(bc, 1)[:, :cols]
    return _e4m3_values()[codes.long()] * s


class _LinearFP8(_torch.autograd.Function):
    """x W^T under an fp8 gemm: parity_linear quantizes the fp32 master W and each row of x
    with the policy's rule and runs the model's fp8 GEMM. Backward: the fp32 formula at the
    quantized inputs, straight through both quantizers: gx = gy deq(Wq), gW = gy^T deq(xq)."""

    @staticmethod
    def forward(ctx, x, weight, bias, bias_values, pol_c, backend, pool, rounding=None):
        (m, k), n = x.shape, weight.shape[0]
        w = weight.detach().contiguous()
        y = _torch.empty(m, n, dtype=_f32)
        lib.parity_linear(pool, ctypes.byref(pol_c), backend, m, k, n, _addr(x), k, _F32, _addr(w),
                          k, _addr(bias_values), _addr(y), n)
        _round_in_place(y, rounding)
        ctx.save_for_backward(x, w)
        ctx.has_bias, ctx.pool, ctx.pol_c = bias is not None, pool, pol_c
        return y

    @staticmethod
    def backward(ctx, gy):
        x, w = ctx.saved_tensors
        gx = _matmul_t(gy, _fp8_dequantized(w, ctx.pol_c, True).t(), ctx.pool) \
            if ctx.needs_input_grad[0] else None
        gw = _matmul_t(gy.t(), _fp8_dequantized(x, ctx.pol_c, False).t(), ctx.pool) \
            if ctx.needs_input_grad[1] else None
        gb = gy.sum(0) if ctx.has_bias and ctx.needs_input_grad[2] else None
        return gx, gw, gb, None, None, None, None, None


def _linear(x, weight, bias, data, dtype, pol_c, pol, backend, pool, fp8=False, rounding=None,
            recipe=None, seed=0, stream=0, gradients="fp32"):
    """x W^T (+ bias) on the library's GEMM, then the rounding point `rounding` (a parity
    dtype, or None) on the output, the straight-through gradient; under a quantized gemm with
    a training recipe, the recipe's backward (python/parity/_recipe_linear.py); gradients
    "bf16" (checked by _check_gradients): the backward GEMMs on the gradient rounded to bf16."""
    bias_values = None
    if bias is not None:
        bias_values = bias.detach().contiguous() if _compute_fp32(pol) else \
            bias.detach().to(_half(pol)).to(_f32)
    if fp8 and pol_c.gemm != 0 and recipe is not None:
        return _recipe_linear.RecipeLinear.apply(x, weight, bias, bias_values, pol_c, backend,
                                                 pool, recipe, seed, stream, rounding)
    if fp8 and pol_c.gemm != 0:
        return _LinearFP8.apply(x, weight, bias, bias_values, pol_c, backend, pool, rounding)
    function = _LinearBf16Gradients if gradients == "bf16" else _Linear
    return function.apply(x, weight, bias, data, dtype, bias_values, pol_c, backend, pool,
                          rounding)


def linear(x, weight, bias=None, policy="aligned", backend="bf16", pool=None, recipe=None,
           seed=0, stream=0, gradients="fp32"):
    """x W^T (+ bias) as parity_linear, fp32 and unrounded (round with round_point where the
    policy rounds): x fp32 [m, k]; weight the fp32 master [n, k] (the forward reads bf16(W)
    under compute "bf16"); bias fp32 [n] or None. Each output depends on its row of x and of W
    alone, in the backend's order. Gradients: gy W and gy^T x in fp32, straight through the
    cast to bf16. Under a quantized gemm policy ("+fp8-block:RULE", "+mxfp8:RULE",
    "+nvfp4:RULE", "+mxfp4:RULE", "+ternary:RULE") the master W and each row of x are
    quantized with the rule, as the model's quantized GEMM does; the gradients are gy deq(Wq)
    and gy^T deq(xq), straight through both quantizers. With a training recipe (a name of
    parity.recipes() or a parity.Recipe; its fprop must be the policy's, else ValueError) the
    forward is the same and the gradients are the recipe's dgrad and wgrad GEMMs on quantized
    operands (parity_quant_gemm); seed and stream key its stochastic rounding. gradients
    "bf16" (a bf16 policy only, as CausalLM's): the gradients' GEMMs take gy rounded to bf16."""
    _tensor(x, "x", _f32, 2)
    _tensor(weight, "weight", _f32, 2)
    if x.shape[1] != weight.shape[1]:
        raise ValueError("x has %d columns, weight %d: they must agree" % (x.shape[1],
                                                                           weight.shape[1]))
    if bias is not None:
        _tensor(bias, "bias", _f32, 1)
        _shape(bias, "bias", (weight.shape[0],))
    pol_c, pol = _pol(policy)
    recipe = _recipe_of(recipe, policy)
    _check_gradients(gradients, pol, pol_c, recipe)
    data, dtype = _weight_data(weight, pol)
    return _linear(x, weight, bias, data, dtype, pol_c, pol, _backend(backend),
                   _pool_handle(pool), fp8=True, recipe=recipe, seed=seed, stream=stream,
                   gradients=gradients)


def _recipe_of(recipe, policy):
    """None, or the parity.Recipe of a name or a Recipe, checked against the policy."""
    if recipe is None:
        return None
    r = recipe if isinstance(recipe, Recipe) else Recipe(recipe)
    r.check_policy(policy)
    return r


class _Attention(_torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, lengths, pol_c, pool):
        T, nh, hd = q.shape
        nkv = k.shape[1]
        out = _torch.empty(T, nh, hd, dtype=_f32)
        c_lengths = (ctypes.c_uint32 * len(lengths))(*lengths)
        lib.parity_attention(pool, ctypes.byref(pol_c), len(lengths), c_lengths, nh, nkv, hd,
                             _addr(q), nh * hd, _addr(k), nkv * hd, _addr(v), nkv * hd,
                             _addr(out), nh * hd)
        ctx.save_for_backward(q, k, v)
        ctx.lengths, ctx.pool = lengths, pool
        return out

    @staticmethod
    def backward(ctx, grad):
        q, k, v = ctx.saved_tensors
        gq, gk, gv = _attention_backward(q, k, v, grad.contiguous(), ctx.lengths, ctx.pool)
        return gq, gk, gv, None, None, None


def _attention_backward(q, k, v, grad, lengths, pool):
    """The gradients of causal fp32 softmax attention at q, k, v (parity_attention_backward):
    per sequence and KV head, with the group's query heads as one block of rows,
    P = softmax(Q K^T s) recomputed, dP = dO V^T, dS = P (dP - rowsum(P dP)) s, dQ = dS K,
    dK = dS^T Q, dV = P^T dO, on libparity's fp32 GEMM, all sequences and heads in one call."""
    T, nh, hd = q.shape
    nkv = k.shape[1]
    grad = grad.contiguous()
    gq, gk, gv = _torch.empty_like(q), _torch.empty_like(k), _torch.empty_like(v)
    c_lengths = (ctypes.c_uint32 * len(lengths))(*lengths)
    lib.parity_attention_backward(pool, len(lengths), c_lengths, nh, nkv, hd, _addr(q), nh * hd,
                                  _addr(k), nkv * hd, _addr(v), nkv * hd, _addr(grad), nh * hd,
                                  _addr(gq), nh * hd, _addr(gk), nkv * hd, _addr(gv), nkv * hd)
    return gq, gk, gv


def _lengths(lengths, total):
    lens = [_lib.as_int(n, "lengths[%d]" % i, 1, 2 ** 32 - 1) for i, n in enumerate(lengths)]
    if not lens:
        raise ValueError("lengths is empty: no sequences")
    if sum(lens) != total:
        raise ValueError("the lengths add up to %d rows, q has %d" % (sum(lens), total))
    return lens


def attention(q, k, v, lengths, policy="aligned", pool=None):
    """Causal GQA attention of a batch of sequences, as parity_attention: q fp32 [T, heads,
    head_dim] (after q-norm and RoPE), k and v fp32 [T, kv_heads, head_dim], the sequences'
    rows concatenated (lengths adds up to T), each attending to its own positions; the policy's
    attention mode; fp32 [T, heads, head_dim]. Gradient: fp32 softmax attention."""
    _tensor(q, "q", _f32, 3)
    _tensor(k, "k", _f32, 3)
    _tensor(v, "v", _f32, 3)
    _shape(v, "v", k.shape)
    if k.shape[0] != q.shape[0] or k.shape[2] != q.shape[2]:
        raise ValueError("k has shape %s, q %s: rows and head_dim must agree"
                         % (tuple(k.shape), tuple(q.shape)))
    if q.shape[1] % k.shape[1]:
        raise ValueError("%d query heads are not a multiple of %d KV heads" % (q.shape[1],
                                                                             k.shape[1]))
    pol_c, _ = _pol(policy)
    return _Attention.apply(q, k, v, _lengths(lengths, q.shape[0]), pol_c, _pool_handle(pool))


def _support(x, o):
    """The truncated support of processed logits x [n, V] (top-k, then top-p, then min-p on
    the probabilities), as torch computes it: the backward's mask (the forward's values come
    from the library's own support)."""
    keep = _torch.ones_like(x, dtype=_torch.bool)
    if o.top_k:
        kth = x.topk(min(o.top_k, x.shape[1]), dim=1).values[:, -1:]
        keep &= x >= kth
    p = _torch.softmax(x.masked_fill(~keep, float("-inf")), dim=1)
    if o.top_p < 1:
        sp, order = p.sort(dim=1, descending=True)
        before = sp.cumsum(1) - sp
        keep_sorted = before < o.top_p
        keep &= _torch.zeros_like(keep).scatter(1, order, keep_sorted)
    if o.min_p > 0:
        keep &= p >= o.min_p * p.max(dim=1, keepdim=True).values
    return keep


class _Head(_torch.autograd.Function):
    @staticmethod
    def forward(ctx, h, delta, norm_w, lm_w, norm_data, lm_data, dtype, targets, options, eps,
                pol_c, backend, pool):
        n, dim = h.shape
        vocab = lm_data.shape[0]
        lp = _torch.empty(n, dtype=_f32)
        logits = _torch.empty(n, vocab, dtype=_f32)
        lib.parity_head_logprobs(pool, ctypes.byref(pol_c), backend, ctypes.byref(options), n,
                                 dim, vocab, _addr(h), dim, _addr(delta), dim, dtype,
                                 _addr(norm_data), eps, _addr(lm_data), dim, _addr(targets),
                                 _addr(lp), None, _addr(logits), vocab)
        ctx.save_for_backward(h, delta, norm_data, lm_data, targets)
        ctx.options, ctx.eps = options, eps
        return lp, logits

    @staticmethod
    def backward(ctx, g_lp, g_logits):
        h, delta, norm_data, lm_data, targets = ctx.saved_tensors
        o = ctx.options
        h, delta = h.detach().requires_grad_(), delta.detach().requires_grad_()
        nw = norm_data.to(_f32).requires_grad_()
        w = lm_data.to(_f32).requires_grad_()
        with _torch.enable_grad():
            s = h + delta
            xn = s * _torch.rsqrt((s * s).mean(-1, keepdim=True) + ctx.eps) * nw
            logits = xn @ w.t()
            x = logits
            if o.mode:
                x = logits / (o.temperature if o.temperature > 0 else 1.0)
            if o.mode == 2:
                x = x.masked_fill(~_support(x.detach(), o), float("-inf"))
            lse = _torch.logsumexp(x, dim=1)
            picked = x.gather(1, targets.long().unsqueeze(1)).squeeze(1)
            inside = _torch.isfinite(picked)
            lp = _torch.where(inside, picked - lse, _torch.zeros_like(lse))
            outs, grads = [lp], [_torch.where(inside, g_lp, _torch.zeros_like(g_lp))]
            if g_logits is not None:
                outs.append(logits)
                grads.append(g_logits)
            gh, gd, gn, gw = _torch.autograd.grad(outs, (h, delta, nw, w), grads,
                                                  allow_unused=True)
        return gh, gd, gn, gw, None, None, None, None, None, None, None, None, None


def _options(mode, temperature, top_k, top_p, min_p):
    return _lib.parity_score_options.from_buffer_copy(
        score_options(mode, temperature, top_k, top_p, min_p, 0))


def head_logprobs(residual, delta, norm_weight, lm_head, targets, eps=1e-6, policy="aligned",
                  backend="bf16", mode="raw", temperature=1.0, top_k=None, top_p=None,
                  min_p=None, pool=None):
    """The head as parity_head_logprobs: s = residual + delta, the final RMSNorm (the residual
    + RMSNorm region), lm_head, and log p(targets) under `mode` (raw, processed,
    processed-truncated with temperature, top_k, top_p, min_p as parity.Model.score takes
    them). residual, delta fp32 [n, hidden]; norm_weight fp32 [hidden] and lm_head fp32
    [vocab, hidden] masters; targets int32 [n]. Returns (logprobs [n], logits [n, vocab] as the
    policy rounds them), both differentiable. The backward is the fp32 formula (RMSNorm,
    lm_head, log_softmax of logits / temperature over the support torch computes)."""
    _tensor(residual, "residual", _f32, 2)
    _tensor(delta, "delta", _f32, 2)
    _shape(delta, "delta", residual.shape)
    _tensor(norm_weight, "norm_weight", _f32, 1)
    _shape(norm_weight, "norm_weight", (residual.shape[1],))
    _tensor(lm_head, "lm_head", _f32, 2)
    if lm_head.shape[1] != residual.shape[1]:
        raise ValueError("lm_head has %d columns, the hidden size is %d"
                         % (lm_head.shape[1], residual.shape[1]))
    _tensor(targets, "targets", _torch.int32, 1)
    _shape(targets, "targets", (residual.shape[0],))
    pol_c, pol = _pol(policy)
    nd, dtype = _weight_data(norm_weight, pol)
    ld, _ = _weight_data(lm_head, pol)
    return _Head.apply(residual, delta, norm_weight, lm_head, nd, ld, dtype, targets,
                       _options(mode, temperature, top_k, top_p, min_p), float(eps), pol_c,
                       _backend(backend), _pool_handle(pool))


def logprobs_from_logits(logits, targets, policy="aligned", mode="raw", temperature=1.0,
                         top_k=None, top_p=None, min_p=None, pool=None):
    """The head's second half as parity_logprobs_from_logits: log p(targets) under `mode` from
    logits fp32 [n, vocab] holding the values as the head holds them after its rounding point
    (head_logprobs' logits output, or an engine's own, e.g. bf16 logits widened), bit for bit
    as head_logprobs and parity_score compute them; targets int32 [n]. Returns (logprobs [n],
    entropy [n]) of the mode's distribution, without gradient (head_logprobs is the
    differentiable head)."""
    _tensor(logits, "logits", _f32, 2)
    _tensor(targets, "targets", _torch.int32, 1)
    _shape(targets, "targets", (logits.shape[0],))
    pol_c, _ = _pol(policy)
    n, vocab = logits.shape
    lp, ent = _torch.empty(n, dtype=_f32), _torch.empty(n, dtype=_f32)
    options = _options(mode, temperature, top_k, top_p, min_p)
    lib.parity_logprobs_from_logits(_pool_handle(pool), ctypes.byref(pol_c), ctypes.byref(options),
                                    n, vocab, _addr(logits.detach()), vocab, _addr(targets),
                                    _addr(lp), _addr(ent))
    return lp, ent


# ---- the regions under compute "bf16": the C region kernels, fp32 formulas backward ---------

def _rms_backward(x, w, eps, g, g_add, pool, delta=None):
    """The gradients (x's, plus g_add where given; w's) of the fp32 formula
    x rsqrt(mean(x x) + eps) w over x's last dimension, autograd's steps in C
    (parity_rmsnorm_backward); with delta, at x + delta, the sum formed in C
    (parity_rmsnorm_residual_backward)."""
    dim = x.shape[-1]
    rows = x.numel() // dim
    x, g = x.contiguous(), g.contiguous()
    g_add = g_add.contiguous() if g_add is not None else None
    gx, gw = _torch.empty_like(x), _torch.empty(dim, dtype=_f32)
    wc = w.detach().contiguous()
    if delta is None:
        lib.parity_rmsnorm_backward(pool, rows, dim, _addr(x), dim, _addr(wc), eps, _addr(g),
                                    dim, _addr(g_add), dim, _addr(gx), dim, _addr(gw))
    else:
        d = delta.contiguous()
        lib.parity_rmsnorm_residual_backward(pool, rows, dim, _addr(x), dim, _addr(d), dim,
                                             _addr(wc), eps, _addr(g), dim, _addr(g_add), dim,
                                             _addr(gx), dim, _addr(gw))
    return gx, gw


def _f32_rows(t):
    """(t as contiguous fp32, its rows, its last dimension) for a region call on fp32 rows."""
    t = t.detach().contiguous()
    dim = t.shape[-1]
    return t, t.numel() // dim, dim


class _RmsnormResidualC(_torch.autograd.Function):
    """parity_rmsnorm_residual on the 16-bit casts, fp32 in and out on the pool
    (parity_rmsnorm_residual_f32): (residual stream, norm output); backward: s = h + delta
    straight through, the norm's fp32 formula."""

    @staticmethod
    def forward(ctx, delta, h, w, eps, pol_c, dtype, pool):
        (d, rows, dim), (hc, _, _) = _f32_rows(delta), _f32_rows(h)
        wc = w.detach().contiguous()
        res, out = _torch.empty_like(hc), _torch.empty_like(hc)
        lib.parity_rmsnorm_residual_f32(pool, ctypes.byref(pol_c), rows, dim, _addr(d), dim,
                                        _addr(hc), dim, _addr(wc), eps, _addr(res), dim,
                                        _addr(out), dim)
        ctx.save_for_backward(delta, h, w)
        ctx.eps, ctx.pool = eps, pool
        return res, out

    @staticmethod
    def backward(ctx, g_res, g_out):
        delta, h, w = ctx.saved_tensors
        gs, gw = _rms_backward(h, w, ctx.eps, g_out, g_res, ctx.pool, delta)
        return gs, gs, gw, None, None, None, None


class _RmsnormC(_torch.autograd.Function):
    """parity_rmsnorm (qk: Qwen3's q/k-norm switch) on the 16-bit casts, fp32 in and out on
    the pool (parity_rmsnorm_f32); backward: the fp32 formula."""

    @staticmethod
    def forward(ctx, x, w, eps, qk, pol_c, dtype, pool):
        xc, rows, dim = _f32_rows(x)
        wc = w.detach().contiguous()
        out = _torch.empty_like(xc)
        lib.parity_rmsnorm_f32(pool, ctypes.byref(pol_c), int(qk), rows, dim, _addr(xc), dim,
                               _addr(wc), eps, _addr(out), dim)
        ctx.save_for_backward(x, w)
        ctx.eps, ctx.pool = eps, pool
        return out

    @staticmethod
    def backward(ctx, g):
        x, w = ctx.saved_tensors
        gx, gw = _rms_backward(x, w, ctx.eps, g, None, ctx.pool)
        return gx, gw, None, None, None, None, None


class _SwigluC(_torch.autograd.Function):
    """parity_swiglu on the 16-bit casts, fp32 in and out on the pool (parity_swiglu_f32);
    backward: the fp32 formula g sigmoid(g) u."""

    @staticmethod
    def forward(ctx, g, u, pol_c, dtype, pool):
        (gc, rows, dim), (uc, _, _) = _f32_rows(g), _f32_rows(u)
        out = _torch.empty_like(gc)
        lib.parity_swiglu_f32(pool, ctypes.byref(pol_c), rows, dim, _addr(gc), dim, _addr(uc),
                              dim, _addr(out), dim)
        ctx.save_for_backward(g, u)
        ctx.pool = pool
        return out

    @staticmethod
    def backward(ctx, grad):
        g, u = ctx.saved_tensors
        dim = g.shape[-1]
        rows = g.numel() // dim
        grad = grad.contiguous()
        gg, gu = _torch.empty_like(g), _torch.empty_like(u)
        lib.parity_swiglu_backward(ctx.pool, rows, dim, _addr(g), dim, _addr(u), dim,
                                   _addr(grad), dim, _addr(gg), dim, _addr(gu), dim)
        return gg, gu, None, None, None


class _Rope(_torch.autograd.Function):
    """RoPE of x [rows, heads, head_dim]: under compute "bf16" ("fp16") the C kernel,
    parity_rope, on x's 16-bit values (exact: the q/k-norm's rounded outputs) at `positions`
    (int32, one a row), fp32 in and out on the pool (parity_rope_f32); under compute "fp32"
    parity.torch's exact fp32 version. Backward: the
    rotation's transpose by the same tables, straight through its rounding points:
    g_a = g_lo cos + g_hi sin, g_b = g_hi cos - g_lo sin (the sums autograd forms through the
    formula, the same bits), in C on the pool (parity_rope_backward)."""

    @staticmethod
    def forward(ctx, x, cos, sin, pol, pol_c, positions, theta, pool=None):
        ctx.save_for_backward(cos, sin)
        ctx.pool = pool
        if _compute_fp32(pol):
            return _torch_regions._rope_f32(x, cos, sin, pol)
        rows, heads, hd = x.shape
        xc = x.detach().contiguous()
        out = _torch.empty_like(xc)
        lib.parity_rope_f32(pool, ctypes.byref(pol_c), rows, heads, hd, _addr(xc), heads * hd,
                            _addr(out), heads * hd, _addr(positions), float(theta))
        return out

    @staticmethod
    def backward(ctx, g):
        cos, sin = ctx.saved_tensors
        return (_rope_backward(g, cos, sin, ctx.pool), None, None, None, None, None, None, None)


def _rope_backward(g, cos, sin, pool):
    """RoPE's gradient at g [rows, heads, head_dim] by the forward's tables cos, sin (one row of
    head_dim // 2 values a row of g, any leading shape that has `rows` rows), as
    parity_rope_backward computes it on the pool: g_a = g_lo cos + g_hi sin,
    g_b = g_hi cos - g_lo sin, each product rounded to fp32 before the sum."""
    rows, heads, hd = g.shape
    g = g.contiguous()
    cos, sin = cos.reshape(rows, hd // 2).contiguous(), sin.reshape(rows, hd // 2).contiguous()
    out = _torch.empty_like(g)
    lib.parity_rope_backward(pool, rows, heads, hd, _addr(g), heads * hd, _addr(cos),
                             _addr(sin), hd // 2, _addr(out), heads * hd)
    return out


def _rmsnorm_residual(delta, h, w, eps, pol_c, pol, pool=None):
    if _compute_fp32(pol):
        return _torch_regions._rmsnorm_residual_f32(delta, h, w, eps, pol)
    return _RmsnormResidualC.apply(delta, h, w, eps, pol_c, _half(pol), pool)


def _rmsnorm(x, w, eps, pol_c, pol, qk=False, pool=None):
    if _compute_fp32(pol):
        return _torch_regions._rmsnorm_f32(x, w, eps, pol, qk)
    return _RmsnormC.apply(x, w, eps, qk, pol_c, _half(pol), pool)


def _swiglu(g, u, pol_c, pol, pool=None):
    if _compute_fp32(pol):
        return _torch_regions._swiglu_f32(g, u, pol)
    return _SwigluC.apply(g, u, pol_c, _half(pol), pool)


# ---- checkpoints ---------------------------------------------------------------------------------

_ST_DTYPES = {"BF16": _bf16, "F16": _torch.float16, "F32": _f32}


def _read_safetensors(path):
    """{name: fp32 tensor} of a safetensors file (BF16 and F16 widened exactly, F32 as is)."""
    try:
        tensors = _safetensors.read(path, _safetensors.FLOAT_DTYPES)
    except _safetensors.FormatError as e:
        raise ParityError(_lib.ERR_INVALID_ARGUMENT, str(e)) from None
    out = {}
    for name, (dtype, shape, raw) in tensors.items():
        t = _torch.frombuffer(bytearray(raw), dtype=_torch.uint8) if raw.nbytes else \
            _torch.empty(0, dtype=_torch.uint8)
        out[name] = t.view(_ST_DTYPES[dtype]).reshape(shape).to(_f32)
    return out


def read_checkpoint(directory):
    """{checkpoint name: fp32 tensor} of a Hugging Face checkpoint directory's weights
    (model.safetensors, or the shards model.safetensors.index.json names), read with the
    standard library: BF16 and F16 widened exactly, F32 as it is."""
    index = os.path.join(directory, "model.safetensors.index.json")
    if os.path.isfile(index):
        with open(index) as f:
            files = sorted(set(json.load(f)["weight_map"].values()))
    else:
        files = ["model.safetensors"]
    tensors = {}
    for name in files:
        tensors.update(_read_safetensors(os.path.join(directory, name)))
    return tensors


# ---- the module ---------------------------------------------------------------------------------

def _per_expert(tensors):
    """A checkpoint's tensors with the fused 3-D expert layout newer transformers writes
    (`mlp.experts.gate_up_proj` [E, 2I, H], each expert's gate rows then its up rows, and
    `mlp.experts.down_proj` [E, H, I]) split under the per-expert names the parameters take
    (`mlp.experts.N.gate_proj.weight`, ...), as the library's loader splits them."""
    out = {}
    for name, t in tensors.items():
        if name.endswith(".mlp.experts.gate_up_proj"):
            prefix, half = name[:-len("gate_up_proj")], t.shape[1] // 2
            for e in range(t.shape[0]):
                out["%s%d.gate_proj.weight" % (prefix, e)] = t[e, :half].clone()
                out["%s%d.up_proj.weight" % (prefix, e)] = t[e, half:].clone()
        elif name.endswith(".mlp.experts.down_proj"):
            prefix = name[:-len("down_proj")]
            for e in range(t.shape[0]):
                out["%s%d.down_proj.weight" % (prefix, e)] = t[e].clone()
        else:
            out[name] = t
    return out


class CausalLM(_torch.nn.Module):
    """A Qwen-family causal LM as a torch module whose forward is libparity's.

    Args:
        source: a checkpoint directory (read with read_checkpoint), "synthetic:NAME[:SEED]",
            or an open parity.Model (its weights copied straight from its memory: the module
            does not use the model afterwards).
        policy: the precision policy (a preset name or a parity.Policy), as the sampler's.
        backend: "bf16", "openblas" or "amx" (where parity.backends() has it), as the sampler's.
        threads: threads of the module's kernel pool (None = the CPUs this process may use);
            the bits never depend on it.
        recipe: None (the backward straight through the quantizers), or a training recipe
            (a name of parity.recipes() or a parity.Recipe) whose fprop is the policy's (else
            ValueError): the decoder layers' linear layers then run its dgrad and wgrad GEMMs
            on quantized operands; the forward, and so the log-probs, do not change. Its
            stochastic rounding is keyed by the attribute recipe_seed (set it per step) and
            a stream per layer.
        gradients: "fp32" (the default: every linear layer's backward GEMMs in fp32 on the
            fp32 incoming gradient), or "bf16": they take the incoming gradient rounded to
            bf16 (nearest even), so that both operands are bf16 values and the GEMMs run on
            the CPU's bf16 dot products (exact products, fp32 sums in pair32 order, fp32
            results), as a bf16 PyTorch learner's backward does (roughly twice as fast). A
            change of the gradient's arithmetic, not of the forward: the log-probs are the
            same bits. Only under a bf16 policy without a quantized GEMM or recipe (the
            weights must be bf16 values); elsewhere ValueError.

    Parameters are fp32 tensors named as in the checkpoint ("model.layers.0.mlp.up_proj.weight",
    ...): the checkpoint's (or the model's) F32 masters where it has them, else its bf16 values
    widened exactly. The forward reads their round-to-nearest-even bf16 cast (compute "bf16"), the
    cast parity_model_update makes, or the masters themselves (compute "fp32"); so after
    sync_to(model) the module and the model's sampler and scorer agree bit for bit.
    Architectures: those of libparity with default RoPE (rope_type "default"), the
    mixture-of-experts ones included (parameters "model.layers.L.mlp.gate.weight",
    "model.layers.L.mlp.experts.N.gate_proj.weight", "...mlp.shared_expert.up_proj.weight",
    "...mlp.shared_expert_gate.weight", ...; a directory must hold the per-expert names).
    """

    def __init__(self, source, policy="aligned", backend="bf16", threads=None, recipe=None,
                 gradients="fp32"):
        super().__init__()
        self._pol_c, self._pol = _pol(policy)
        self.recipe = _recipe_of(recipe, policy)
        self.gradients = _check_gradients(gradients, self._pol, self._pol_c, self.recipe)
        self.recipe_seed = 0
        self.policy = policy
        self.backend_name = backend
        self._backend = _backend(backend)
        self._pool = Pool(threads)
        if isinstance(source, Model):
            tensors, config = self._from_model(source)
        elif isinstance(source, (str, os.PathLike)):
            spec = os.fspath(source)
            with Model(spec, threads=1) as m:
                config = m.config
                if os.path.isdir(spec):
                    tensors = _per_expert(read_checkpoint(spec))
                else:
                    tensors, _ = self._from_model(m)
        else:
            raise TypeError("source must be a checkpoint directory, 'synthetic:NAME' or a "
                            "parity.Model, not %s" % type(source).__name__)
        if config["rope_type"] != "default":
            raise ValueError("CausalLM supports default RoPE; this model's rope_type is %r"
                             % config["rope_type"])
        self.config = config
        self._names = list(tensors)
        for name, t in tensors.items():
            self._attach(name, _torch.nn.Parameter(t.contiguous()))

    @staticmethod
    def _from_model(model):
        """({name: fp32 tensor}, config) of every weight a parity.Model holds, read straight
        from it into the tensors' memory (parity_model_weight_values: its fp32 masters where it
        has them, else its bf16 values widened exactly), names sorted as a saved checkpoint
        lists them."""
        h = model._acquire()
        try:
            names = []
            while True:
                name = lib.parity_model_tensor_name(h, len(names))
                if name is None:
                    break
                names.append(name)
            tensors = {}
            for name in sorted(names):
                info = _lib.parity_weight_info(size=ctypes.sizeof(_lib.parity_weight_info))
                lib.parity_model_weight_info(h, name, ctypes.byref(info))
                t = _torch.empty(tuple(info.shape[:info.ndim]), dtype=_f32)
                lib.parity_model_weight_values(h, name, ctypes.c_void_p(t.data_ptr()), t.numel())
                tensors[name.decode()] = t
        finally:
            model._release()
        return tensors, model.config

    def _attach(self, name, param):
        parts = name.split(".")
        mod = self
        for p in parts[:-1]:
            child = mod._modules.get(p)
            if child is None:
                child = _torch.nn.Module()
                mod.add_module(p, child)
            mod = child
        mod.register_parameter(parts[-1], param)

    def _param(self, name):
        mod = self
        for p in name.split("."):
            mod = getattr(mod, p)
        return mod

    def _has(self, name):
        try:
            self._param(name)
            return True
        except AttributeError:
            return False

    def close(self):
        """Frees the kernel pool (a later forward raises)."""
        self._pool.close()

    # ---- forward -----------------------------------------------------------------------------

    def _sequences(self, sequences):
        if isinstance(sequences, _torch.Tensor) or not hasattr(sequences, "__len__"):
            raise TypeError("sequences must be a list of token-id sequences")
        seqs, vocab = [], self.config["vocab_size"]
        context = self.config["max_position_embeddings"]
        for i, s in enumerate(sequences):
            if isinstance(s, _torch.Tensor):
                if s.dim() != 1 or s.dtype.is_floating_point or s.dtype == _torch.bool:
                    raise TypeError("sequence %d: a 1-D integer tensor, not %s of shape %s"
                                    % (i, s.dtype, tuple(s.shape)))
                s = s.tolist()
            if 0 < len(s) <= context and all(type(t) is int for t in s) and \
                    0 <= min(s) and max(s) < vocab:
                seqs.append(list(s))  # the common case, checked without a call per token
                continue
            s = [_lib.as_int(t, "sequence %d token" % i, -2 ** 63, 2 ** 63) for t in s]
            bad = [t for t in s if not 0 <= t < vocab]
            if bad:
                raise ParityError(_lib.ERR_TOKEN_RANGE, "sequence %d: token id %d is outside the "
                                  "vocabulary [0, %d)" % (i, bad[0], vocab))
            if not s:
                raise ParityError(_lib.ERR_EMPTY_INPUT, "sequence %d is empty" % i)
            if len(s) > context:
                raise ParityError(_lib.ERR_TOO_LONG, "sequence %d has %d tokens, more than the "
                                  "model's context (%d)" % (i, len(s), context))
            seqs.append(s)
        if not seqs:
            raise ParityError(_lib.ERR_EMPTY_INPUT, "no sequences")
        return seqs

    def _layer_ops(self):
        """(lin, vec) of the forward passes: lin(x, prefix, bias=False, rounded=True,
        quantized=True) a decoder layer's linear layer (under a quantized gemm, quantized from
        the masters unless quantized=False: a router, a shared expert's gate) rounded where the
        policy rounds GEMM outputs (rounded=False: an expert's down projection, whose fp32
        output the combine reads); vec(name) a norm weight's values."""
        pol, pol_c, be = self._pol, self._pol_c, self._backend
        pool = self._pool.handle
        rd = {_bf16: _BF16, _f16: _F16}.get(_torch_regions._round_dtype(pol))
        plain_c = _lib.parity_policy.from_buffer_copy(pol_c)  # the GEMM unquantized
        plain_c.gemm = plain_c.quantizer = 0

        def lin(x, prefix, bias=False, rounded=True, quantized=True):
            w = self._param(prefix + ".weight")
            b = self._param(prefix + ".bias") if bias and self._has(prefix + ".bias") else None
            data, dtype = _weight_data(w, pol, prefix + ".weight", pool)
            return _linear(x, w, b, data, dtype, pol_c if quantized else plain_c, pol, be, pool,
                           fp8=quantized, rounding=rd if rounded else None, recipe=self.recipe,
                           seed=self.recipe_seed, stream=zlib.crc32(prefix.encode()),
                           gradients=self.gradients)

        def vec(name):
            return _weight_values(self._param(name), pol, name)

        return lin, vec

    #: Whether a dense MLP's gate and up run as one Function (_GateUpSwiglu) where they can.
    _fuse_gate_up = True

    def _gate_up_swiglu(self, xn, prefix, lin):
        """swiglu(gate_proj(xn), up_proj(xn)) of a dense MLP (prefix "model.layers.N.mlp."):
        one GEMM over both weights (_GateUpSwiglu) where the GEMM is the bf16 backend's on
        bf16 weights (unquantized, compute "bf16"), whose outputs are each their own column's
        bits; else (and where _fuse_gate_up is False: the tests' reference) the two
        projections and swiglu one after the other. The same values."""
        pol, pol_c, pool = self._pol, self._pol_c, self._pool.handle
        if not self._fuse_gate_up or pol.compute != 0 or pol_c.gemm != 0 or \
                self._backend != _lib.BACKENDS["bf16"] or \
                self._has(prefix + "gate_proj.bias") or self._has(prefix + "up_proj.bias"):
            return _swiglu(lin(xn, prefix + "gate_proj"), lin(xn, prefix + "up_proj"), pol_c,
                           pol, pool=pool)
        w_gate = self._param(prefix + "gate_proj.weight")
        w_up = self._param(prefix + "up_proj.weight")
        inter, k = w_gate.shape
        data = _torch.empty(2 * inter, k, dtype=_bf16)
        for i, w in enumerate((w_gate, w_up)):
            lib.parity_bf16_from_f32_array(pool, w.numel(), _addr(w.detach().contiguous()),
                                           _addr(data[i * inter:]))
        rounding = {_bf16: _BF16}[_torch_regions._round_dtype(pol)]
        return _GateUpSwiglu.apply(xn, w_gate, w_up, data, pol_c, self._backend, pool, rounding,
                                   self.gradients)

    def _sparse_layers(self):
        """{layer index: its index among the sparse layers} of a mixture-of-experts model
        ({} for the others), as Model.sparse_layers decides."""
        return {layer: i for i, layer in enumerate(sparse_layers(self.config))}

    def _replay(self, routes, lengths):
        """The routing records to replay as an int64 tensor [tokens, sparse layers, k], and a
        bool tensor [tokens] of the rows that replay (every position but each sequence's
        last, which the scorer does not replay either); (None, None) without routes."""
        if routes is None:
            return None, None
        c, n_sparse = self.config, len(self._sparse_layers())
        if not n_sparse:
            raise ParityError(_lib.ERR_INVALID_ARGUMENT, "routes: this model (%s) has no sparse "
                              "layers to route" % c["arch"])
        if len(routes) != len(lengths):
            raise ParityError(_lib.ERR_INVALID_ARGUMENT, "routes has %d records for %d sequences: "
                              "one per sequence" % (len(routes), len(lengths)))
        k = c["num_experts_per_tok"]
        flat = []
        for i, (record, n) in enumerate(zip(routes, lengths)):
            flat.extend(route_ids(record, n, n_sparse, k, "routes of sequence %d" % i))
        ids = _torch.tensor(flat, dtype=_torch.int64).view(-1, n_sparse, k)
        last = _torch.zeros(ids.shape[0], dtype=_torch.bool)
        last[_torch.tensor(lengths).cumsum(0) - 1] = True
        return ids, ~last

    def _moe_block(self, xn, prefix, lin, replay, replaying):
        """A sparse layer's MLP block on the rows xn [T, hidden] (lib/engine/moe_layer.c): the
        router's logits (rounded, unquantized), each row's route (replaying `replay` [T, k]
        on the rows `replaying` marks), each expert over the rows that chose it (SwiGLU, the
        down projection unrounded), the shared expert and its gate, the combine."""
        c = self.config
        k, E = c["num_experts_per_tok"], c["num_experts"]
        norm, pol_c, pool = c["norm_topk_prob"], self._pol_c, self._pool.handle
        logits = lin(xn, prefix + "mlp.gate", quantized=False).contiguous()
        if replay is not None:
            # the rows that do not replay (each sequence's last) replay their own top-k
            _, own = _torch_moe.route(logits.detach(), k, norm, pol_c)
            replay = _torch.where(replaying.unsqueeze(1), replay, own)
        weights, ids = _torch_moe.route(logits, k, norm, pol_c, replay)
        pairs = ids.reshape(-1)                       # (row, slot) pairs, row-major
        order = _torch.argsort(pairs, stable=True)    # grouped by expert, rows ascending
        counts = _torch.bincount(pairs, minlength=E).tolist()
        outs, at = [], 0
        for e, n in enumerate(counts):
            if not n:
                continue
            chosen = order[at:at + n]
            at += n
            x = xn.index_select(0, _torch.div(chosen, k, rounding_mode="floor")).contiguous()
            ep = prefix + "mlp.experts.%d." % e
            a = _swiglu(lin(x, ep + "gate_proj"), lin(x, ep + "up_proj"), pol_c, self._pol,
                        pool=pool)
            outs.append(lin(a, ep + "down_proj", rounded=False))
        y = _torch.cat(outs).index_select(0, _torch.argsort(order))
        y = y.view(xn.shape[0], k, -1)
        y_shared = gate = None
        if self._has(prefix + "mlp.shared_expert_gate.weight"):
            sp = prefix + "mlp.shared_expert."
            a = _swiglu(lin(xn, sp + "gate_proj"), lin(xn, sp + "up_proj"), pol_c, self._pol,
                        pool=pool)
            y_shared = lin(a, sp + "down_proj", rounded=False)
            gate = lin(xn, prefix + "mlp.shared_expert_gate", quantized=False).view(-1)
        return _torch_moe.combine(y, weights, ids, pol_c, y_shared, gate)

    def _embed(self, tokens, positions):
        """(the embedded tokens, cos, sin): the embedding rows of `tokens` and the rope tables
        of `positions`, with a heads axis (unsqueeze(1)) to broadcast over the heads."""
        pol, c = self._pol, self.config
        emb = self._param("model.embed_tokens.weight")
        data, dtype = _weight_data(emb, pol, "model.embed_tokens.weight",
                                   self._pool.handle)
        x = _Embedding.apply(tokens, emb, data, dtype)
        # rope_cos_sin(positions): each position's row depends on that position alone, so the
        # rows of 0 .. the last position, then each token's by _gather_rows
        cos, sin = _torch_regions._table_rows(range(int(positions.max()) + 1), c["head_dim"],
                                              c["rope_theta"], pol)
        pos32 = positions.to(_torch.int32)
        cos, sin = _gather_rows(cos, pos32), _gather_rows(sin, pos32)
        return x, cos.unsqueeze(1), sin.unsqueeze(1)

    def _rope_op(self, positions, cos, sin):
        """rope(x): RoPE of q or k [rows, heads, head_dim] at `positions` (one a row), the
        policy's rounding points, differentiable (_Rope)."""
        pos32 = positions.to(_torch.int32).contiguous()
        theta = self.config["rope_theta"]

        def rope(x):
            return _Rope.apply(x.contiguous(), cos, sin, self._pol, self._pol_c, pos32, theta,
                               self._pool.handle)

        return rope

    def forward(self, sequences, mode="raw", temperature=1.0, top_k=None, top_p=None,
                min_p=None, return_logits=False, depths=None, loop_kv=None,
                loop_logprobs=False, routes=None):
        """Per-token log-probs of a batch of sequences of any lengths.

        Args:
            sequences: a list of token-id sequences (lists or 1-D integer tensors), each
                at least 1 token long.
            mode, temperature, top_k, top_p, min_p: the log-prob mode, as parity.Model.score.
            return_logits: also return each sequence's logits [len - 1, vocab] (as the policy
                rounds them, before any temperature), differentiable (not with a looped model).
            depths, loop_kv: a looped model's depth schedules to replay, one list per
                sequence (Completion.schedule(); None = every position runs every loop, the
                dense learner) and the KV rule they were sampled with (None = the
                schedules' own), as parity.Model.score. The schedule is a constant: the
                gradient flows through the K/V an exited position leaves in the deeper
                loops (its exit loop's, under "last-exited") and through the loop each
                position is read at, never through the choice of depth.
            loop_logprobs: a looped model, dense: also return every loop's log-probs, a
                [len - 1, total_ut_steps] tensor per sequence (loop 1 first), differentiable.
            routes: a mixture-of-experts model's routing records to replay, one per sequence
                (Completion.routes, Sampler.routes(), or any form parity.Model.score takes:
                len - 1 or len positions x sparse layers x k). Each position runs the experts
                recorded, their weights recomputed from this module's router under its policy,
                so the log-probs equal parity.Model.score's with the same routes (under the
                sampler's policy, the sampler's). None: every position routes itself. The
                gradient reaches each router through the chosen experts' weights (softmax,
                renormalisation), never through the choice. A record of the wrong size, an
                id >= num_experts or one repeated within a layer raises ParityError
                (PARITY_ERR_INVALID_ARGUMENT).
        Returns:
            A list of fp32 tensors, entry i holding log p(x_t | x_<t) for t = 1 .. len_i - 1,
            bitwise equal to parity.Model.score under this policy and backend (and the same
            depths and KV rule); with return_logits, a list of (logprobs, logits) pairs; with
            loop_logprobs, a list of (logprobs, per-loop logprobs) pairs.
        """
        seqs = self._sequences(sequences)
        if self.config.get("arch") == "ouro":
            if return_logits:
                raise ValueError("return_logits is not available for a looped model")
            if routes is not None:
                raise ParityError(_lib.ERR_INVALID_ARGUMENT, "routes: this model (ouro) has no "
                                  "sparse layers to route")
            return self._forward_looped(seqs, mode, temperature, top_k, top_p, min_p, depths,
                                        loop_kv, loop_logprobs)
        if depths is not None or loop_kv is not None or loop_logprobs:
            raise ParityError(_lib.ERR_INVALID_ARGUMENT,
                              "depths, loop_kv and loop_logprobs are a looped model's; this "
                              "model does not loop")
        sparse = self._sparse_layers()
        c, pol, pol_c, be = self.config, self._pol, self._pol_c, self._backend
        pool = self._pool.handle
        options = _options(mode, temperature, top_k, top_p, min_p)
        lengths = [len(s) for s in seqs]
        tokens = _torch.tensor([t for s in seqs for t in s], dtype=_torch.int32)
        positions = _torch.tensor([p for n in lengths for p in range(n)], dtype=_torch.int64)
        T, hd = tokens.numel(), c["head_dim"]
        nh, nkv, eps = c["num_attention_heads"], c["num_key_value_heads"], c["rms_norm_eps"]
        lin, vec = self._layer_ops()
        replay, replaying = self._replay(routes, lengths)
        h, cos, sin = self._embed(tokens, positions)
        rope = self._rope_op(positions, cos, sin)
        delta = None
        for l in range(c["num_hidden_layers"]):
            p = "model.layers.%d." % l
            if delta is None:
                xn = _rmsnorm(h, vec(p + "input_layernorm.weight"), eps, pol_c, pol, pool=pool)
            else:
                h, xn = _rmsnorm_residual(delta, h, vec(p + "input_layernorm.weight"), eps, pol_c,
                                          pol, pool=pool)
            q = lin(xn, p + "self_attn.q_proj", bias=True).view(T, nh, hd)
            k = lin(xn, p + "self_attn.k_proj", bias=True).view(T, nkv, hd)
            v = lin(xn, p + "self_attn.v_proj", bias=True).view(T, nkv, hd)
            if c["qk_norm"]:
                q = _rmsnorm(q, vec(p + "self_attn.q_norm.weight"), eps, pol_c, pol, True,
                             pool=pool)
                k = _rmsnorm(k, vec(p + "self_attn.k_norm.weight"), eps, pol_c, pol, True,
                             pool=pool)
            q = rope(q).contiguous()
            k = rope(k).contiguous()
            att = _Attention.apply(q, k, v.contiguous(), lengths, pol_c, pool)
            delta = lin(att.view(T, nh * hd), p + "self_attn.o_proj")
            h, xn = _rmsnorm_residual(delta, h, vec(p + "post_attention_layernorm.weight"), eps,
                                      pol_c, pol, pool=pool)
            if l in sparse:
                delta = self._moe_block(xn, p, lin, None if replay is None else
                                        replay[:, sparse[l]], replaying)
                continue
            delta = lin(self._gate_up_swiglu(xn, p + "mlp.", lin), p + "mlp.down_proj")

        # the head on every position but each sequence's last, predicting the next token
        rows, at = [], 0
        for n in lengths:
            rows.extend(range(at, at + n - 1))
            at += n
        idx = _torch.tensor(rows, dtype=_torch.int64)
        idx32 = idx.to(_torch.int32)
        head_name = "model.embed_tokens.weight" if c["tie_word_embeddings"] else "lm_head.weight"
        norm_w, lm_w = self._param("model.norm.weight"), self._param(head_name)
        nd, dtype = _weight_data(norm_w, pol, "model.norm.weight", pool)
        ld, _ = _weight_data(lm_w, pol, head_name, pool)
        if idx.numel():
            lp, logits = _Head.apply(_Rows.apply(h, idx32, idx), _Rows.apply(delta, idx32, idx),
                                     norm_w, lm_w, nd, ld, dtype, tokens[idx + 1].contiguous(),
                                     options, float(eps), pol_c, be, pool)
        else:
            lp = _torch.zeros(0, dtype=_f32)
            logits = _torch.zeros(0, c["vocab_size"], dtype=_f32)
        counts = [n - 1 for n in lengths]
        lps = list(lp.split(counts))
        if return_logits:
            return list(zip(lps, logits.split(counts)))
        return lps

    def _forward_looped(self, seqs, mode, temperature, top_k, top_p, min_p, depths, loop_kv,
                        want_loops):
        """The Ouro forward (lib/engine/looped.c, forward_looped) on every row at once: loop t runs
        the N layers on every row; under "last-exited" a row whose depth is <= t keeps, in
        every layer, the K/V of its exit loop (a torch.where of the previous loop's K/V:
        the copy, and its gradient); each row's head reads its state at its depth. The rows
        past their depth compute values nothing reads; each row's values are those of the
        scorer, which runs it alone to its depth."""
        from .model import _schedule_loop_kv
        c, pol, pol_c, be = self.config, self._pol, self._pol_c, self._backend
        pool = self._pool.handle
        T_loops = c["total_ut_steps"]
        options = _options(mode, temperature, top_k, top_p, min_p)
        lengths = [len(s) for s in seqs]
        total = sum(lengths)
        rule = _schedule_loop_kv(depths, loop_kv)
        if rule not in ("last-exited", "full"):
            raise ParityError(_lib.ERR_INVALID_ARGUMENT,
                              "loop_kv must be 'last-exited' or 'full', not %r" % (rule,))
        if depths is None:
            depth = _torch.full((total,), T_loops, dtype=_torch.int64)
        else:
            if want_loops:
                raise ParityError(_lib.ERR_INVALID_ARGUMENT,
                                  "loop_logprobs is the dense learner's readout (every position "
                                  "runs every loop): not with a depth schedule")
            if len(depths) != len(seqs):
                raise ParityError(_lib.ERR_INVALID_ARGUMENT,
                                  "depths has %d schedules for %d sequences"
                                  % (len(depths), len(seqs)))
            flat = []
            for i, (d, n) in enumerate(zip(depths, lengths)):
                d = [_lib.as_int(x, "depth", 0, 2 ** 32 - 1) for x in d]
                if len(d) != n:
                    raise ParityError(_lib.ERR_INVALID_ARGUMENT,
                                      "sequence %d: %d depths for %d tokens: one depth per token"
                                      % (i, len(d), n))
                for j, x in enumerate(d):
                    if not 1 <= x <= T_loops:
                        raise ParityError(_lib.ERR_INVALID_ARGUMENT,
                                          "sequence %d, position %d: depth %d is not in 1..%d "
                                          "(the model's loops, total_ut_steps)"
                                          % (i, j, x, T_loops))
                flat.extend(d)
            depth = _torch.tensor(flat, dtype=_torch.int64)
        copies = rule == "last-exited"
        tokens = _torch.tensor([t for s in seqs for t in s], dtype=_torch.int32)
        positions = _torch.tensor([p for n in lengths for p in range(n)], dtype=_torch.int64)
        hd, N = c["head_dim"], c["num_hidden_layers"]
        nh, nkv, eps = c["num_attention_heads"], c["num_key_value_heads"], c["rms_norm_eps"]
        lin, vec = self._layer_ops()
        x, cos, sin = self._embed(tokens, positions)
        rope = self._rope_op(positions, cos, sin)
        kept_k, kept_v = [None] * N, [None] * N  # each layer's K/V of the previous loop
        read_h = read_delta = None                 # each row's head input at its depth
        per_loop = []
        loops_run = int(depth.max()) if copies else T_loops
        for t in range(loops_run):
            exited = (depth <= t)[:, None, None]  # rows past their depth at loop t
            h, delta = x, None
            for l in range(N):
                p = "model.layers.%d." % l
                if delta is None:
                    xn = _rmsnorm(h, vec(p + "input_layernorm.weight"), eps, pol_c, pol, pool=pool)
                else:
                    h, xn = _rmsnorm_residual(delta, h, vec(p + "input_layernorm.weight"), eps,
                                              pol_c, pol, pool=pool)
                q = lin(xn, p + "self_attn.q_proj", bias=True).view(-1, nh, hd)
                k = lin(xn, p + "self_attn.k_proj", bias=True).view(-1, nkv, hd)
                v = lin(xn, p + "self_attn.v_proj", bias=True).view(-1, nkv, hd)
                q = rope(q).contiguous()
                k = rope(k)
                if copies and t > 0:
                    k = _torch.where(exited, kept_k[l], k)
                    v = _torch.where(exited, kept_v[l], v)
                kept_k[l], kept_v[l] = k, v
                att = _Attention.apply(q, k.contiguous(), v.contiguous(), lengths, pol_c, pool)
                delta = lin(att.view(-1, nh * hd), p + "self_attn.o_proj")
                delta = _rmsnorm(delta, vec(p + "input_layernorm_2.weight"), eps, pol_c, pol,
                                 pool=pool)
                h, xn = _rmsnorm_residual(delta, h, vec(p + "post_attention_layernorm.weight"),
                                          eps, pol_c, pol, pool=pool)
                g = lin(xn, p + "mlp.gate_proj")
                u = lin(xn, p + "mlp.up_proj")
                delta = lin(_swiglu(g, u, pol_c, pol, pool=pool), p + "mlp.down_proj")
                delta = _rmsnorm(delta, vec(p + "post_attention_layernorm_2.weight"), eps, pol_c,
                                 pol, pool=pool)
            # the loop's final norm: its output is the next loop's input and the head's
            _, x = _rmsnorm_residual(delta, h, vec("model.norm.weight"), eps, pol_c, pol, pool=pool)
            here = (depth == t + 1)[:, None]
            read_h = h if read_h is None else _torch.where(here, h, read_h)
            read_delta = delta if read_delta is None else _torch.where(here, delta, read_delta)
            if want_loops:
                per_loop.append((h, delta))

        rows, at = [], 0
        for n in lengths:
            rows.extend(range(at, at + n - 1))
            at += n
        idx = _torch.tensor(rows, dtype=_torch.int64)
        counts = [n - 1 for n in lengths]

        head_name = "model.embed_tokens.weight" if c["tie_word_embeddings"] else "lm_head.weight"

        def head(hh, dd):
            norm_w, lm_w = self._param("model.norm.weight"), self._param(head_name)
            nd, dtype = _weight_data(norm_w, pol, "model.norm.weight", pool)
            ld, _ = _weight_data(lm_w, pol, head_name, pool)
            if not idx.numel():
                return _torch.zeros(0, dtype=_f32)
            lp, _ = _Head.apply(hh.index_select(0, idx).contiguous(),
                                dd.index_select(0, idx).contiguous(), norm_w, lm_w, nd, ld,
                                dtype, tokens[idx + 1].contiguous(), options, float(eps), pol_c,
                                be, pool)
            return lp

        lps = list(head(read_h, read_delta).split(counts))
        if not want_loops:
            return lps
        every = _torch.stack([head(hh, dd) for hh, dd in per_loop], dim=1)
        return list(zip(lps, every.split(counts)))

    # ---- weights -------------------------------------------------------------------------------

    def checkpoint_tensors(self):
        """{checkpoint name: fp32 master} of every weight (the parameters, detached)."""
        return {name: self._param(name).detach() for name in self._names}

    def sync_to(self, model, masters="keep"):
        """Pushes the weights into a parity.Model: Model.sync with the fp32 masters as they are
        (no copy), which parity_model_update casts to bf16 with round-to-nearest-even, then
        checks the model against their manifest. `masters` is Model.update's: "keep" (the
        default) keeps the fp32 masters in the model for its fp32 policy and every other
        reader; "where-read" only where the model holds them already or a scorer or sampler
        made before reads them (an fp32- or fp16-compute or quantized policy): what a learner
        that keeps its own masters needs for a bf16 sampler, without the model's 4 bytes a
        parameter of new memory on the first sync. The model's samplers' sequences become
        STALE. Returns (update, verify) seconds; raises ParityError on any difference."""
        if not isinstance(model, Model):
            raise TypeError("model must be a parity.Model, not %s" % type(model).__name__)
        return model.sync(self.checkpoint_tensors(), masters=masters)

    def saved_bytes(self, sequences):
        """The bytes the forward of `sequences` keeps for the backward (measured with
        torch.autograd.graph.saved_tensors_hooks; a tensor saved twice counts once)."""
        seen = {}

        def pack(t):
            seen[(t.data_ptr(), t.numel(), t.dtype)] = t.numel() * t.element_size()
            return t

        with _torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            self.forward(sequences)
        return sum(seen.values())
