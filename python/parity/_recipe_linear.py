"""The linear layer under a training recipe (parity.recipes): forward parity_linear under the
policy (bitwise the sampler's quantized GEMM), backward the recipe's dgrad and wgrad GEMMs on
the library's quantizers and its training GEMM (parity_quant_gemm).

Each backward operand is quantized from its fp32 values as the recipe's table says: the tensor
(x the layer's input as the forward read it, W the fp32 master, dy the incoming gradient) in
its orientation (column-wise: the transpose, made contiguous), the transform (rht16: the
random Hadamard transform along the reduction dimension, padded with zeros to a multiple of
16), then its format's quantizer (MX: parity_mxfp8_quantize_as with the element; NVFP4 1x16:
parity_nvfp4_quantize, or parity_nvfp4_quantize_sr for stochastic rounding keyed by (seed,
stream); NVFP4 16x16: parity_nvfp4_quantize_2d of the stored tensor, its codes and scale grid
transposed for the column-wise read). Needs torch.
"""
import ctypes

import torch as _torch

from . import _lib
from ._lib import lib
from ._torch_regions import _round_in_place
from .policy import CHOICES

_f32 = _torch.float32
_u8 = _torch.uint8

_ELEMENT = {"e4m3": 0, "e5m2": 1}      # PARITY_FP8_E4M3, PARITY_FP8_E5M2
_GEMM = {"mxfp8": 2, "nvfp4": 3}       # PARITY_GEMM_MXFP8, PARITY_GEMM_NVFP4
# The random signs of the Hadamard transform: one fixed sign vector, as TE's (a recipe
# constant, not a per-step random draw: both wgrad operands must share it).
RHT_SIGN_SEED = 0
# Stream numbers of the stochastically rounded operands within one linear layer's stream.
_SR_SLOT = {("dy", "row-wise"): 0, ("dy", "column-wise"): 1, ("x", "column-wise"): 2,
            ("w", "column-wise"): 3, ("x", "row-wise"): 4, ("w", "row-wise"): 5}


def _addr(t):
    return ctypes.c_void_p(t.data_ptr())


class QuantizedOperand:
    """An operand's codes, scales and globals (torch tensors kept alive) and its
    parity_quant_operand."""

    def __init__(self, fmt, element, codes, scales, scale_rows=1, globals_=None, per_row=0):
        self.codes, self.scales, self.globals = codes, scales, globals_
        self.struct = _lib.parity_quant_operand(
            _GEMM[fmt], element, _addr(codes), codes.shape[1], _addr(scales), scales.shape[1],
            scale_rows, per_row, _addr(globals_) if globals_ is not None else None)


def _rht16(t):
    """t [rows, cols] with each row's 16-blocks times H16 diag(signs) / 4 (parity_rht16), the
    columns padded with zeros to a multiple of 16."""
    rows, cols = t.shape
    padded = -(-cols // 16) * 16
    if padded != cols:
        t = _torch.nn.functional.pad(t, (0, padded - cols))
    t = t.contiguous()
    out = _torch.empty(rows, padded, dtype=_f32)
    lib.parity_rht16(rows, padded, _addr(t), padded, RHT_SIGN_SEED, _addr(out), padded)
    return out


def quantize_operand(op, tensors, seed=0, stream=0):
    """The QuantizedOperand of recipe operand `op` (parity.recipes.Operand) over `tensors`
    ({"x": [tokens, in], "w": [out, in], "dy": [tokens, out]}, fp32)."""
    src = tensors[op.tensor].detach()
    q = CHOICES["quantizer"].index(op.quantizer)
    if op.block == (16, 16):
        # quantized as stored (W and W^T share the 16x16 tiles), transposed when read
        # column-wise: the transposed codes and scale grid
        w = src.contiguous()
        rows, cols = w.shape
        codes = _torch.empty(rows, cols, dtype=_u8)
        sf = _torch.empty(-(-rows // 16), -(-cols // 16), dtype=_u8)
        s2 = _torch.empty(1, dtype=_f32)
        lib.parity_nvfp4_quantize_2d(q, rows, cols, _addr(w), cols, _addr(codes), cols,
                                     _addr(sf), _addr(s2))
        if op.orientation == "column-wise":
            codes, sf = codes.t().contiguous(), sf.t().contiguous()
        return QuantizedOperand("nvfp4", 0, codes, sf, 16, s2, 0)
    t = src if op.orientation == "row-wise" else src.t()
    t = _rht16(t) if op.transform == "rht16" else t.contiguous()
    rows, cols = t.shape
    codes = _torch.empty(rows, cols, dtype=_u8)
    if op.format == "mxfp8":
        scales = _torch.empty(rows, -(-cols // 32), dtype=_u8)
        lib.parity_mxfp8_quantize_as(q, _ELEMENT[op.element], rows, cols, _addr(t), cols,
                                     _addr(codes), cols, _addr(scales))
        return QuantizedOperand("mxfp8", _ELEMENT[op.element], codes, scales)
    per_row = 1 if op.globals == "per-row" else 0
    sf = _torch.empty(rows, -(-cols // 16), dtype=_u8)
    s2 = _torch.empty(rows if per_row else 1, dtype=_f32)
    if op.rounding == "stochastic":
        lib.parity_nvfp4_quantize_sr(q, per_row, rows, cols, _addr(t), cols, seed,
                                     stream * 8 + _SR_SLOT[op.tensor, op.orientation],
                                     _addr(codes), cols, _addr(sf), _addr(s2))
    else:
        lib.parity_nvfp4_quantize(q, per_row, rows, cols, _addr(t), cols, _addr(codes), cols,
                                  _addr(sf), _addr(s2))
    return QuantizedOperand("nvfp4", 0, codes, sf, 1, s2, per_row)


def run_gemm(gemm, tensors, pool=None, seed=0, stream=0):
    """The recipe GEMM `gemm` (parity.recipes.Gemm) on `tensors`: y = a b^T [rows of a,
    rows of b], fp32, by parity_quant_gemm."""
    a = quantize_operand(gemm.a, tensors, seed, stream)
    b = quantize_operand(gemm.b, tensors, seed, stream)
    m, k = a.codes.shape
    n = b.codes.shape[0]
    if b.codes.shape[1] != k:
        raise ValueError("%s: operands of %d and %d along the reduction dimension"
                         % (gemm.name, k, b.codes.shape[1]))
    y = _torch.empty(m, n, dtype=_f32)
    lib.parity_quant_gemm(pool, m, n, k, ctypes.byref(a.struct), ctypes.byref(b.struct),
                          _addr(y), n)
    return y


class RecipeLinear(_torch.autograd.Function):
    """x W^T under a quantized-gemm policy with a training recipe: the forward is
    parity_linear on the fp32 master (the sampler's bits), then the rounding point `rounding`
    (a parity dtype, or None) in place, as learner._Linear rounds; the backward runs the recipe's
    dgrad (dx = dy W) and wgrad (dW = dy^T x) on quantized operands; the bias' gradient is the
    fp32 column sum of dy."""

    @staticmethod
    def forward(ctx, x, weight, bias, bias_values, pol_c, backend, pool, recipe, seed, stream,
                rounding=None):
        (m, k), n = x.shape, weight.shape[0]
        w = weight.detach().contiguous()
        y = _torch.empty(m, n, dtype=_f32)
        lib.parity_linear(pool, ctypes.byref(pol_c), backend, m, k, n, _addr(x), k, 2, _addr(w),
                          k, _addr(bias_values) if bias_values is not None else None, _addr(y), n)
        _round_in_place(y, rounding)
        ctx.save_for_backward(x, w)
        ctx.has_bias, ctx.pool, ctx.recipe = bias is not None, pool, recipe
        ctx.seed, ctx.stream = seed, stream
        return y

    @staticmethod
    def backward(ctx, gy):
        x, w = ctx.saved_tensors
        tensors = {"x": x, "w": w, "dy": gy.contiguous()}
        r = ctx.recipe
        gx = run_gemm(r.dgrad, tensors, ctx.pool, ctx.seed, ctx.stream) \
            if ctx.needs_input_grad[0] else None
        gw = run_gemm(r.wgrad, tensors, ctx.pool, ctx.seed, ctx.stream) \
            if ctx.needs_input_grad[1] else None
        gb = gy.sum(0) if ctx.has_bias and ctx.needs_input_grad[2] else None
        return gx, gw, gb, None, None, None, None, None, None, None, None
