"""The region kernels on caller-owned bf16 buffers (parity.h, "Region kernels").

Buffers hold bf16 bit patterns (uint16): numpy uint16 arrays, array('H'), bytearray (2 bytes an
element, native byte order), or memoryviews of those; read-only buffers (bytes) may be inputs.
Rows of `dim` elements: a 2-D numpy array gives (rows, dim) and its row stride; a flat buffer
needs `dim` (or takes it from the weight) and holds rows * dim elements.

Outputs: each function writes into `out` (and `residual_out`) when given, else into new buffers
of the input's kind, and returns them. Passing an input as its output works in place where the
C API allows it (out=delta, residual_out=residual, out=x, out=gate or out=up); rope() always
rotates `x` in place.

Every function raises TypeError for a buffer of the wrong type (e.g. float32, array('f')),
ParityError (PARITY_ERR_INVALID_ARGUMENT) for sizes that do not match, and ParityError with the
library's status for what it refuses (PARITY_ERR_POLICY, PARITY_ERR_INVALID_ARGUMENT: eps <= 0,
odd head_dim, negative position, ...). The kernels run the process's CPU path (see
parity.cpu_path()); every path returns the same bits.
"""
import ctypes
import sys
from array import array

from . import _lib
from ._convert import Bf16, numpy_array
from ._lib import lib
from .policy import policy_struct

__all__ = ["rmsnorm_residual", "rmsnorm", "swiglu", "rope", "to_bf16", "from_bf16"]


def _rows(buf, rows, dim):
    if rows is not None:
        return _lib.as_int(rows, "rows", 0, 2 ** 63)
    if buf.shape is not None:
        return buf.shape[0]
    if dim == 0 or buf.size % dim:
        _lib.fail(_lib.ERR_INVALID_ARGUMENT, "%s holds %d elements, not a whole number of rows "
                  "of dim = %d" % (buf.name, buf.size, dim))
    return buf.size // dim


def _dim(dim, buf):
    if dim is not None:
        return _lib.as_int(dim, "dim", 0, 2 ** 63)
    return buf.shape[1] if buf.shape is not None else buf.size


def _output(given, like, name):
    obj = like.like(name) if given is None else given
    return obj, Bf16(obj, name, writable=True)


def _weight(weight, dim):
    """The weight buffer; `dim` (if given) must be its length."""
    w = Bf16(weight, "weight")
    if dim is not None and w.size != _lib.as_int(dim, "dim", 0, 2 ** 63):
        _lib.fail(_lib.ERR_INVALID_ARGUMENT, "weight holds %d elements, dim is %d" % (w.size, dim))
    return w


def rmsnorm_residual(delta, residual, weight, policy="aligned", eps=1e-6, rows=None, dim=None,
                     out=None, residual_out=None):
    """Residual add + RMSNorm over rows of `dim` (the residual norms of a decoder layer).

    s = residual + delta (fp32); residual_out = bf16(s); out = RMSNorm(s or bf16(s), per the
    policy's norm_input) * weight, rounded per its norm_weight. eps as float32.

    Args:
        delta, residual: rows x dim bf16 buffers. weight: dim bf16 values (dim defaults to its
            length). residual_out may be `residual` and out may be `delta` (in place); they
            may not be the same buffer.
    Returns:
        (residual_out, out)."""
    pol = policy_struct(policy)
    d = Bf16(delta, "delta")
    w = _weight(weight, dim)
    dim = w.size
    r = Bf16(residual, "residual")
    rows = _rows(d, rows, dim)
    out, o = _output(out, d, "out")
    residual_out, ro = _output(residual_out, r, "residual_out")
    lib.parity_rmsnorm_residual(pol, rows, dim, d.ptr, d.check_rows(rows, dim), r.ptr,
                                r.check_rows(rows, dim), w.ptr, _lib.as_float(eps, "eps"),
                                ro.ptr, ro.check_rows(rows, dim), o.ptr, o.check_rows(rows, dim))
    return residual_out, out


def rmsnorm(x, weight, policy="aligned", eps=1e-6, qk_norm=False, rows=None, dim=None, out=None):
    """RMSNorm over rows of `dim` without a residual: layer 0's input norm, or Qwen3's
    q_norm/k_norm with qk_norm=True (which then follows the policy's qk_norm switch instead of
    norm_weight). out may be `x` (in place). Returns out."""
    pol = policy_struct(policy)
    w = _weight(weight, dim)
    dim = w.size
    xb = Bf16(x, "x")
    rows = _rows(xb, rows, dim)
    out, o = _output(out, xb, "out")
    lib.parity_rmsnorm(pol, 1 if qk_norm else 0, rows, dim, xb.ptr, xb.check_rows(rows, dim),
                       w.ptr, _lib.as_float(eps, "eps"), o.ptr, o.check_rows(rows, dim))
    return out


def swiglu(gate, up, policy="aligned", rows=None, dim=None, out=None):
    """SwiGLU: out = silu(gate) * up, elementwise, rounded per the policy's swiglu switch
    (silu(g) = g / (1 + exp(-g)) with the library's exp). A flat buffer is one row unless
    rows/dim say otherwise. out may be `gate` or `up` (in place). Returns out."""
    pol = policy_struct(policy)
    g = Bf16(gate, "gate")
    u = Bf16(up, "up")
    dim = _dim(dim, g)
    rows = _rows(g, rows, dim)
    out, o = _output(out, g, "out")
    lib.parity_swiglu(pol, rows, dim, g.ptr, g.check_rows(rows, dim), u.ptr,
                      u.check_rows(rows, dim), o.ptr, o.check_rows(rows, dim))
    return out


def _positions(positions, rows):
    a = numpy_array(positions)
    if a is not None:
        if a.dtype.kind not in "iu":
            raise TypeError("positions must be integers, not %s" % a.dtype)
        np = sys.modules["numpy"]
        if a.size and (int(a.min()) < -2 ** 31 or int(a.max()) > 2 ** 31 - 1):
            _lib.fail(_lib.ERR_INVALID_ARGUMENT, "a position does not fit int32")
        pos = np.ascontiguousarray(a.reshape(-1), dtype=np.int32)
        ptr = ctypes.cast(pos.ctypes.data, ctypes.POINTER(ctypes.c_int32))
    else:
        try:
            pos = array("i", positions)
        except OverflowError:
            _lib.fail(_lib.ERR_INVALID_ARGUMENT, "a position does not fit int32")
        except TypeError as e:
            raise TypeError("positions must be a sequence of ints (%s)" % e) from None
        ptr = ctypes.cast((ctypes.c_int32 * max(len(pos), 1)).from_buffer(pos) if len(pos)
                          else (ctypes.c_int32 * 1)(), ctypes.POINTER(ctypes.c_int32))
    if rows is not None and len(pos) != rows:
        _lib.fail(_lib.ERR_INVALID_ARGUMENT, "%d positions for %d rows" % (len(pos), rows))
    return pos, ptr


def rope(x, positions, head_dim=None, policy="aligned", theta=10000.0, n_heads=None):
    """RoPE (rotate-half pairing), in place on x: rows tokens x n_heads heads x head_dim.

    Args:
        x: a numpy uint16 array of shape (rows, n_heads, head_dim) (head vectors contiguous,
            any token stride) or (rows, n_heads * head_dim) with head_dim given; or a flat
            buffer of rows * n_heads * head_dim elements with head_dim given.
        positions: one position per row (ints >= 0).
        theta: the rope base (default RoPE; tables from it as lib/model/rope.c computes them,
            kept bf16 or fp32 per the policy's rope_table).
    Returns:
        x, rotated."""
    pol = policy_struct(policy)
    a = numpy_array(x)
    if a is not None and a.ndim == 3:
        if head_dim is not None and head_dim != a.shape[2]:
            _lib.fail(_lib.ERR_INVALID_ARGUMENT, "x has head_dim %d, head_dim=%d was given"
                      % (a.shape[2], head_dim))
        head_dim = a.shape[2]
        if a.strides[1] != 2 * a.shape[2]:
            raise TypeError("x: the heads of a token must be contiguous (stride %d bytes)"
                            % a.strides[1])
        v = a.view()
        v.shape = (a.shape[0], a.shape[1] * a.shape[2]) if a.shape[0] > 1 else (1, -1)
        xb = Bf16(v, "x", writable=True)
        xb.obj = a
    else:
        xb = Bf16(x, "x", writable=True)
    if head_dim is None:
        raise TypeError("rope() needs head_dim for a buffer that is not (rows, n_heads, "
                        "head_dim)")
    head_dim = _lib.as_int(head_dim, "head_dim", 1, 2 ** 31)
    pos, pos_ptr = _positions(positions, None)
    rows = len(pos)
    if xb.shape is not None:
        if xb.shape[0] != rows:
            _lib.fail(_lib.ERR_INVALID_ARGUMENT, "x has %d rows, %d positions were given"
                      % (xb.shape[0], rows))
        width = xb.shape[1]
    else:
        if rows == 0 or xb.size % rows:
            _lib.fail(_lib.ERR_INVALID_ARGUMENT, "x holds %d elements, not a whole number of "
                      "rows for %d positions" % (xb.size, rows))
        width = xb.size // rows
    if width % head_dim:
        _lib.fail(_lib.ERR_INVALID_ARGUMENT, "a row of %d elements is not a whole number of "
                  "heads of %d" % (width, head_dim))
    heads = width // head_dim
    if n_heads is not None and _lib.as_int(n_heads, "n_heads", 0, 2 ** 31) != heads:
        _lib.fail(_lib.ERR_INVALID_ARGUMENT, "x holds %d heads per row, n_heads=%d was given"
                  % (heads, n_heads))
    stride = xb.check_rows(rows, width) if rows else width
    lib.parity_rope(pol, rows, heads, head_dim, xb.ptr, stride, pos_ptr,
                    _lib.as_float(theta, "theta"))
    return x


# ---- bf16 conversions ---------------------------------------------------------------------------

def to_bf16(values):
    """Floats -> array('H') of bf16 bit patterns: each value rounded to float32, then to bf16
    with round-to-nearest-even (NaN -> 0x7fc0), as the library and PyTorch round."""
    bits = array("I")
    bits.frombytes(array("f", values).tobytes())
    return array("H", (0x7FC0 if (u & 0x7FFFFFFF) > 0x7F800000
                       else (u + 0x7FFF + ((u >> 16) & 1)) >> 16 for u in bits))


def from_bf16(buf):
    """bf16 bit patterns (any buffer Bf16 takes, or a list of ints) -> list of floats, exact."""
    if isinstance(buf, list):
        buf = array("H", buf)
    b = Bf16(buf, "buf")
    raw = ctypes.string_at(b.ptr, 2 * b.size) if b.np is None else buf.tobytes()
    h = array("H")
    h.frombytes(raw)
    bits = array("I", (v << 16 for v in h))
    return array("f", bits.tobytes()).tolist()
