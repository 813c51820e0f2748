"""The policies' region semantics on PyTorch bf16 tensors, bitwise equal to libparity's kernels:
the functions parity.torch serves (its docstring tells the arithmetic, step by step) and the
private steps the learner (learner.py) builds on. A module of its own below both, so that the
learner need not import parity.torch, which serves the learner's names too.
"""
import math
from array import array

try:
    import torch as _torch
except ImportError as _e:  # pragma: no cover - exercised where torch is missing
    raise ImportError("parity.torch needs PyTorch (import torch failed: %s); the rest of parity "
                      "works without it" % _e) from None

from . import _lib
from .policy import Policy

__all__ = ["rmsnorm_residual", "rmsnorm", "swiglu", "rope", "rope_cos_sin", "round_point", "silu",
           "expf", "fmaf", "sum_squares"]

_f32 = _torch.float32
_f64 = _torch.float64
_bf16 = _torch.bfloat16


def _policy(policy):
    if isinstance(policy, Policy):
        return policy
    if isinstance(policy, str):
        cached = _policies.get(policy)
        if cached is None:
            cached = _policies[policy] = Policy.from_name(policy)
        return cached
    raise TypeError("policy must be a preset name (str) or a parity.Policy, not %s"
                    % type(policy).__name__)


_policies = {}


_f16 = _torch.float16
_DTYPES = {_bf16: 0, _f16: 1}   # parity_dtype


def _rounded(x, dtype):
    """x rounded to bf16 (or fp16; nearest even) and held in fp32, a new tensor: one pass of
    the library's rounding (parity_round_f32) for a contiguous CPU fp32 tensor, else torch's
    two conversions (the same values: both round to nearest even)."""
    if x.dtype == _f32 and x.device.type == "cpu" and x.is_contiguous() and x.numel():
        out = _torch.empty_like(x)
        _lib.lib.parity_round_f32(_DTYPES[dtype], x.numel(), x.data_ptr(), out.data_ptr())
        return out
    return x.to(dtype).to(_f32)


def _round_in_place(y, rounding):
    """The rounding point of a GEMM output, in place (parity_round_f32; `rounding` a parity
    dtype, 0 bf16 or 1 fp16, or None for none): the linear autograd Functions (learner.py,
    _recipe_linear.py) call it inside their forward, so that its gradient, the identity, is
    the linear's own (d round(y) / dy = 1, straight through)."""
    if rounding is not None and y.numel():
        _lib.lib.parity_round_f32(rounding, y.numel(), y.data_ptr(), y.data_ptr())
    return y


class _RoundPoint(_torch.autograd.Function):
    """A rounding point: fp32 -> bf16 (or fp16; nearest even) -> fp32 forward; the gradient
    passes straight through, unchanged and in fp32 (d round(x) / dx = 1)."""

    @staticmethod
    def forward(ctx, x, dtype):
        return _rounded(x, dtype)

    @staticmethod
    def backward(ctx, grad):
        return grad, None


def _round(x, dtype=_bf16):
    """The rounding point: fp32 -> bf16 (nearest even, NaN -> 0x7fc0; fp16 with dtype
    float16, overflow to inf) -> fp32, with the straight-through gradient (identity, fp32)
    when x needs one."""
    if x.requires_grad:
        return _RoundPoint.apply(x, dtype)
    return _rounded(x, dtype)


def _round_dtype(pol):
    """The dtype a policy's rounding points round to: bf16 under compute "bf16", fp16 under
    compute "fp16", None (no rounding) under compute "fp32"."""
    return {0: _bf16, 2: _f16}.get(pol.compute)


def _buffer_dtype(pol):
    """The dtype of the 16-bit tensors the public region functions take: fp16 under compute
    "fp16", bf16 otherwise (as the C region API's buffers)."""
    return _f16 if pol.compute == 2 else _bf16


def round_point(x):
    """A rounding point on an fp32 tensor, as the policies place them: the values rounded to
    bf16 (round to nearest even) and held in fp32; its gradient is the straight-through one,
    the incoming gradient unchanged (fp32, not rounded to bf16)."""
    if not isinstance(x, _torch.Tensor) or x.dtype != _f32:
        raise TypeError("round_point takes a float32 tensor")
    return _round(x)


def _to_bf16(x, dtype=_bf16):
    """fp32 -> bf16 tensor as the library stores it: nearest even, and every NaN -> 0x7fc0
    (PyTorch's vectorised CPU conversion writes 0xffff for a NaN, its scalar one 0x7fc0);
    with dtype float16, fp16 and every NaN -> 0x7e00 (the library drops a NaN's sign)."""
    out = x.to(dtype)
    nan = _torch.isnan(x)
    if bool(nan.any()):
        qnan = _torch.tensor(0x7FC0 if dtype == _bf16 else 0x7E00, dtype=_torch.int16,
                             device=x.device).view(dtype)
        out = _torch.where(nan, qnan, out)
    return out


def _round_if(dtype, x):
    """A rounding point to `dtype` (bf16 or fp16), or none when dtype is None."""
    return _round(x, dtype) if dtype is not None else x


def _check_bf16(t, name, dtype=_bf16):
    if not isinstance(t, _torch.Tensor):
        raise TypeError("%s must be a torch.Tensor, not %s" % (name, type(t).__name__))
    if t.dtype != dtype:
        raise TypeError("%s must be a %s tensor under this policy, not %s"
                        % (name, "float16" if dtype == _f16 else "bfloat16", t.dtype))


def _const(value, like):
    """A full fp32 tensor shaped like `like` (never a 0-dim "scalar" operand, so that no
    kernel can take a scalar fast path such as multiplying by a reciprocal)."""
    return _torch.full_like(like, value, dtype=_f32)


# ---- fmaf -------------------------------------------------------------------------------------

_F32_MIN_NORMAL = 2.0 ** -126
_BELOW_F32_MIDPOINT = (1 << 29) - 1   # a double's fraction bits below an fp32 ulp
_F32_MIDPOINT = 1 << 28               # those bits of an fp32 midpoint (normal range)


def _round_sum_f32(p, c):
    """round_fp32(p + c) exactly, for float64 tensors p and c holding exact values (a product
    of two fp32 values, an fp32 value). The float64 sum s rounds to fp32 as the exact sum does
    unless s is itself an fp32 midpoint (a midpoint strictly between s and the exact sum would
    be a double nearer the sum than s): only there, and below fp32's normal range (whose
    midpoints are coarser), is the sum rounded to odd instead (TwoSum gives the exact error; an
    inexact sum with an even last bit moves one ulp toward the error), which rounds to fp32 as
    the exact sum (float64 has more than 24 + 2 bits: Boldo & Melquiond)."""
    p, c = _torch.broadcast_tensors(p, c)
    s = p + c
    suspect = ((s.view(_torch.int64) & _BELOW_F32_MIDPOINT) == _F32_MIDPOINT) | \
        ((s.abs() < _F32_MIN_NORMAL) & (s != 0))   # a sum of 0 is exact
    if bool(suspect.any()):
        at = suspect.nonzero(as_tuple=True)
        ps, cs, ss = p[at], c[at], s[at]
        bb = ss - ps                           # TwoSum: ss + err == ps + cs exactly
        err = (ps - (ss - bb)) + (cs - bb)
        fix = (err != 0) & ((ss.view(_torch.int64) & 1) == 0)
        toward = _torch.where(err > 0, _torch.full_like(ss, math.inf),
                              _torch.full_like(ss, -math.inf))
        s = s.index_put(at, _torch.where(fix, _torch.nextafter(ss, toward), ss))
    return s.to(_f32)


def fmaf(a, b, c):
    """fmaf(a, b, c) on fp32 tensors (broadcasting): round_fp32(a * b + c) computed exactly."""
    return _round_sum_f32(a.to(_f64) * b.to(_f64), c.to(_f64))   # the product is exact


# ---- exp and silu -----------------------------------------------------------------------------

_EXP_HI = float.fromhex("0x1.62e42ep+6")
_EXP_LO = float.fromhex("-0x1.9fe368p+6")
_LOG2E = float.fromhex("0x1.715476p+0")
_LN2_HI = float.fromhex("0x1.62e430p-1")
_LN2_LO = float.fromhex("-0x1.05c610p-29")
_MAGIC = float.fromhex("0x1.8p+23")
_EXP_C = [float.fromhex(h) for h in ("0x1.a124eep-13", "0x1.6d4320p-10", "0x1.1110e0p-7",
                                     "0x1.5554eap-5", "0x1.555556p-3", "0x1.000000p-1")]


def expf(x):
    """The library's exp (parity_expf) on an fp32 tensor, bitwise: x = n ln2 + r with
    n = rint(x log2e), r by two fmaf steps, a degree-7 polynomial in fmaf steps, scaled by
    2^floor(n/2) then 2^(n - floor(n/2)); +inf above 0x1.62e42ep+6, 0 below -0x1.9fe368p+6."""
    if x.dtype != _f32:
        raise TypeError("expf takes a float32 tensor, not %s" % x.dtype)
    xc = _torch.clamp(x, _EXP_LO, _EXP_HI)
    t = xc * _const(_LOG2E, xc)
    magic = _const(_MAGIC, xc)
    n = (t + magic) - magic
    neg_n = -n
    r = fmaf(neg_n, _const(_LN2_HI, xc), xc)
    r = fmaf(neg_n, _const(_LN2_LO, xc), r)
    p = _const(_EXP_C[0], xc)
    for coef in _EXP_C[1:]:
        p = fmaf(p, r, _const(coef, xc))
    one = _const(1.0, xc)
    p = fmaf(p, r, one)
    p = fmaf(p, r, one)
    ni = _torch.nan_to_num(n, nan=0.0).to(_torch.int32)
    n1 = _torch.div(ni + 256, 2, rounding_mode="floor") - 128
    n2 = ni - n1
    s1 = ((n1 + 127) * (1 << 23)).view(_f32)
    s2 = ((n2 + 127) * (1 << 23)).view(_f32)
    out = (p * s1) * s2
    out = _torch.where(x > _EXP_HI, _const(math.inf, x), out)
    out = _torch.where(x < _EXP_LO, _const(0.0, x), out)
    return _torch.where(_torch.isnan(x), x + x, out)


def silu(g):
    """silu(g) = g / (1 + parity_expf(-g)) on an fp32 tensor, bitwise as the library."""
    return g / (_const(1.0, g) + expf(-g))


def _exact(value, approx):
    """`value` (exact, no gradient) carrying the gradient of `approx` where that needs one:
    approx + (value - approx), kept only where it reproduces value's bits."""
    if not approx.requires_grad:
        return value
    y = approx + (value - approx).detach()
    same = y.detach().view(_torch.int32) == value.view(_torch.int32)
    return _torch.where(same, y, value)


# ---- sums of squares ------------------------------------------------------------------------

def sum_squares(x):
    """The dot16 sum of squares of the last dimension of an fp32 tensor: 16 lane accumulators
    (element i in lane i % 16, acc = fmaf(x, x, acc) in ascending i), folded l += l+8, l+4,
    l+2, l+1. Returns fp32 of shape x.shape[:-1]."""
    dim = x.shape[-1]
    rows = x.reshape(-1, dim).detach()
    chunks = (dim + 15) // 16
    pad = chunks * 16 - dim
    if pad:  # fmaf(0, 0, acc) == acc: padding changes nothing
        rows = _torch.cat([rows, rows.new_zeros(rows.shape[0], pad)], dim=1)
    lanes = rows.reshape(rows.shape[0], chunks, 16).to(_f64)
    acc = _torch.zeros(rows.shape[0], 16, dtype=_f32, device=x.device)
    for c in range(chunks):
        v = lanes[:, c, :]
        acc = _round_sum_f32(v * v, acc.to(_f64))   # fmaf(v, v, acc); v * v exact in float64
    for half in (8, 4, 2, 1):
        acc = acc[:, :half] + acc[:, half:2 * half]
    return acc.reshape(x.shape[:-1])


def _sqrtf(x):
    """sqrtf on an fp32 tensor, correctly rounded: the float64 square root (exact to 53 bits)
    rounded to fp32, which is the correctly rounded fp32 root since 53 >= 2 * 24 + 2 (no double
    rounding can slip through). torch.sqrt on float32 is not correctly rounded on every version:
    PyTorch 2.15's CPU kernel misses by one ulp on about 15% of random inputs (1.13's does not)."""
    return _torch.sqrt(x.to(_f64)).to(_f32)


def _inv_rms(v, eps):
    """r = 1.0f / sqrtf(sum_squares(v) / dim + eps), per row, exact; with the gradient of
    rsqrt(mean(v^2) + eps) when v needs one."""
    dim = v.shape[-1]
    ss = sum_squares(v)
    ms = ss / _const(float(dim), ss)
    eps_t = _const(eps, ms)  # rounds eps to fp32, as the C API's float eps
    r = _const(1.0, ms) / _sqrtf(ms + eps_t)
    if v.requires_grad:
        approx = _torch.rsqrt((v * v).mean(-1) + eps_t)
        r = _exact(r, approx)
    return r.unsqueeze(-1)


# ---- regions ------------------------------------------------------------------------------------

def _rmsnorm_residual_f32(delta, residual, weight, eps, pol):
    """rmsnorm_residual on fp32 tensors (bf16 values under compute "bf16", fp16 ones under
    "fp16"): returns the residual stream and the norm output as fp32, rounded where the policy
    rounds (nothing rounds under compute "fp32")."""
    rd = _round_dtype(pol)
    rounded_in = rd if pol.norm_input == 0 else None
    twice = rd if pol.norm_weight == 0 else None
    s = residual + delta
    v = _round_if(rounded_in, s)
    r = _inv_rms(v, eps)
    out = _round_if(rd, weight * _round_if(twice, v * r))
    return _round_if(rd, s), out


def _rmsnorm_f32(x, weight, eps, pol, qk_norm=False):
    """rmsnorm on an fp32 tensor, the output fp32 (rounded under compute "bf16"/"fp16")."""
    rd = _round_dtype(pol)
    twice = rd if (pol.qk_norm if qk_norm else pol.norm_weight) == 0 else None
    r = _inv_rms(x, eps)
    return _round_if(rd, weight * _round_if(twice, x * r))


def _swiglu_f32(g, u, pol):
    """swiglu on fp32 tensors, the output fp32 (rounded under compute "bf16"/"fp16")."""
    rd = _round_dtype(pol)
    per_op = rd if pol.swiglu == 0 else None
    with _torch.no_grad():
        value = silu(g.detach())
    sg = _exact(value, g * _torch.sigmoid(g)) if g.requires_grad else value
    return _round_if(rd, _round_if(per_op, sg) * u)


def rmsnorm_residual(delta, residual, weight, eps=1e-6, policy="aligned"):
    """Residual add + RMSNorm over the last dimension, as parity_rmsnorm_residual.

    s = residual + delta (fp32); residual_out = bf16(s) (the residual stream);
    out = norm(s, or bf16(s) if the policy's norm_input is "rounded") * weight, with
    bf16(w * bf16(x * r)) for norm_weight "round-twice" and bf16(w * x * r) for "round-once".
    Under compute "fp32" nothing rounds but the bf16 outputs.

    Args: delta, residual: bf16 tensors (..., dim) (float16 under compute "fp16", whose
    rounding points round to fp16); weight: bf16 (dim,) (float16 likewise); eps: a float (used
    as float32). Returns (residual_out, out), tensors of that dtype shaped like delta."""
    pol = _policy(policy)
    dt = _buffer_dtype(pol)
    _check_bf16(delta, "delta", dt)
    _check_bf16(residual, "residual", dt)
    _check_bf16(weight, "weight", dt)
    res, out = _rmsnorm_residual_f32(delta.to(_f32), residual.to(_f32), weight.to(_f32), eps,
                                     pol)
    return _to_bf16(res, dt), _to_bf16(out, dt)


def rmsnorm(x, weight, eps=1e-6, policy="aligned", qk_norm=False):
    """RMSNorm over the last dimension without a residual, as parity_rmsnorm: layer 0's input
    norm, the final norm, or Qwen3's q_norm/k_norm with qk_norm=True (which then follows the
    policy's qk_norm switch instead of norm_weight).

    Args: x: bf16 (..., dim); weight: bf16 (dim,) (float16 both under compute "fp16").
    Returns a tensor of that dtype shaped like x."""
    pol = _policy(policy)
    dt = _buffer_dtype(pol)
    _check_bf16(x, "x", dt)
    _check_bf16(weight, "weight", dt)
    return _to_bf16(_rmsnorm_f32(x.to(_f32), weight.to(_f32), eps, pol, qk_norm), dt)


def swiglu(gate, up, policy="aligned"):
    """SwiGLU as parity_swiglu: silu(gate) * up, bf16(bf16(silu(g)) * u) for swiglu "per-op"
    and bf16(silu(g) * u) for "fused". gate, up: bf16 tensors of one shape (float16 under
    compute "fp16"); returns that dtype."""
    pol = _policy(policy)
    dt = _buffer_dtype(pol)
    _check_bf16(gate, "gate", dt)
    _check_bf16(up, "up", dt)
    return _to_bf16(_swiglu_f32(gate.to(_f32), up.to(_f32), pol), dt)


_tables = {}


def _f32_list(values):
    return array("f", values).tolist()


def _rows(head_dim, theta, positions):
    """fp32 cos/sin rows of the given positions as lib/model/rope.c computes them (lists of
    lists), cached per (head_dim, theta, position)."""
    theta32 = array("f", [theta])[0]
    key = (head_dim, theta32)
    table = _tables.get(key)
    if table is None:
        half = head_dim // 2
        exps = _f32_list([(2 * i) / head_dim for i in range(half)])
        inv = _f32_list([1.0 / p for p in _f32_list([math.pow(theta32, e) for e in exps])])
        table = _tables[key] = (inv, {})
    inv, rows = table
    out_c, out_s = [], []
    for pos in positions:
        row = rows.get(pos)
        if row is None:
            pf = array("f", [float(pos)])[0]
            ang = _f32_list([pf * f for f in inv])
            row = rows[pos] = (_f32_list([math.cos(a) for a in ang]),
                               _f32_list([math.sin(a) for a in ang]))
        out_c.append(row[0])
        out_s.append(row[1])
    return out_c, out_s


def _table_rows(positions, head_dim, theta, pol):
    """rope_cos_sin's rows for a list of positions (ints >= 0; head_dim checked), one row a
    position: (cos, sin) fp32 [len(positions), head_dim // 2], rounded as the policy keeps
    its table. Each row depends on its position alone."""
    cos_rows, sin_rows = _rows(head_dim, float(theta), positions)
    half = head_dim // 2
    cos = _torch.tensor(cos_rows, dtype=_f32).reshape(-1, half)
    sin = _torch.tensor(sin_rows, dtype=_f32).reshape(-1, half)
    rd = _round_dtype(pol)
    if rd is not None and pol.rope_table == 0:
        cos, sin = _round(cos, rd), _round(sin, rd)
    return cos, sin


def rope_cos_sin(positions, head_dim, theta=10000.0, policy="aligned"):
    """The cos/sin tables parity_rope uses (default RoPE) for integer `positions`.

    Returns (cos, sin): fp32 tensors of shape positions.shape + (head_dim // 2,), holding bf16
    values when the policy keeps a bf16 table (rope_table "bf16" under compute "bf16"; fp16
    values under compute "fp16")."""
    pol = _policy(policy)
    positions = _torch.as_tensor(positions)
    if positions.dtype.is_floating_point or positions.dtype == _torch.bool:
        raise TypeError("positions must be integers, not %s" % positions.dtype)
    if head_dim <= 0 or head_dim % 2:
        raise ValueError("head_dim %d must be even and positive" % head_dim)
    if positions.numel() and int(positions.min()) < 0:
        raise ValueError("positions must be >= 0")
    uniq, inverse = _torch.unique(positions.reshape(-1).cpu(), return_inverse=True)
    cos, sin = _table_rows(uniq.tolist(), head_dim, theta, pol)
    shape = tuple(positions.shape) + (head_dim // 2,)
    return (cos[inverse].reshape(shape).to(positions.device),
            sin[inverse].reshape(shape).to(positions.device))


def _rope_f32(x, cos, sin, pol):
    """RoPE on an fp32 tensor (..., head_dim) with the tables of rope_cos_sin broadcast to
    x.shape[:-1] + (head_dim // 2,); the output fp32 (rounded under compute "bf16"/"fp16")."""
    rd = _round_dtype(pol)
    per_op = rd if pol.rope_apply == 0 else None
    half = x.shape[-1] // 2
    a, b = x[..., :half], x[..., half:]
    lo = _round_if(per_op, a * cos) - _round_if(per_op, b * sin)
    hi = _round_if(per_op, b * cos) + _round_if(per_op, a * sin)
    return _round_if(rd, _torch.cat([lo, hi], dim=-1))


def rope(x, positions, theta=10000.0, policy="aligned"):
    """RoPE with rotate-half pairing, as parity_rope (returns a new tensor).

    For i < hd/2, a = x[..., i], b = x[..., i + hd/2]: "per-op" rope_apply gives
    (bf16(bf16(a c) - bf16(b s)), bf16(bf16(b c) + bf16(a s))), "fused" gives
    (bf16(a c - b s), bf16(b c + a s)) with each product rounded to fp32 (no fma).

    Args:
        x: bf16 tensor (..., head_dim), e.g. (tokens, heads, head_dim) or (batch, heads, seq,
            head_dim).
        positions: integer tensor broadcastable to x.shape[:-1] (e.g. (tokens, 1) for
            (tokens, heads, head_dim), or (batch, 1, seq)).
        theta: the rope base.
    Returns a bf16 tensor shaped like x (x and the result float16 under compute "fp16")."""
    pol = _policy(policy)
    dt = _buffer_dtype(pol)
    _check_bf16(x, "x", dt)
    cos, sin = rope_cos_sin(positions, x.shape[-1], theta, pol)
    return _to_bf16(_rope_f32(x.to(_f32), cos.to(x.device), sin.to(x.device), pol), dt)

