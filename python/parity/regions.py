"""The region kernels on caller-owned bf16 buffers (parity.h, "Region kernels"), and a
mixture-of-experts layer's router and combine on fp32 values (moe_route, moe_combine).

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

__all__ = ["rmsnorm_residual", "rmsnorm", "swiglu", "rope", "moe_route", "moe_combine",
           "to_bf16", "from_bf16"]


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


# ---- mixture of experts: the router and the combine on fp32 values ------------------------------

def _floats(values, name):
    """(array('f') of the values, the numpy array given or None): a numpy array of any float
    dtype (converted to float32) or any sequence of numbers."""
    a = numpy_array(values)
    if a is not None:
        if a.dtype.kind != "f":
            raise TypeError("%s must hold floats, not %s" % (name, a.dtype))
        out = array("f")
        out.frombytes(a.astype("float32").tobytes())
        return out, a
    try:
        return array("f", values), None
    except TypeError as e:
        raise TypeError("%s must be a sequence of floats (%s)" % (name, e)) from None


def _ids(values, name):
    """array('H') of expert ids (ints in 0..65535, else ParityError INVALID_ARGUMENT)."""
    a = numpy_array(values)
    flat = a.reshape(-1).tolist() if a is not None else values
    return array("H", [_lib.as_int(x, name, 0, 2 ** 16 - 1) for x in flat])


def _buf(a):
    """The address of an array's first element (None for an empty one)."""
    return ctypes.cast(a.buffer_info()[0], ctypes.c_void_p) if len(a) else None


def moe_route(logits, k, norm_topk_prob=True, policy="aligned", n_experts=None, replay=None):
    """A mixture-of-experts router, as parity_moe_route (a sparse layer of the forward routes
    each token so): each row of router logits (the router GEMM's output, rounded where the
    policy rounds GEMM outputs) gives its k experts in slot order (descending probability,
    ties to the lower index) and their weights, per the policy's moe_router and moe_weights.

    Args:
        logits: rows x n_experts floats: a 2-D numpy array, or a flat sequence with n_experts
            given.
        k: experts a token (1..min(n_experts, 64)); norm_topk_prob: the model config's.
        replay: None, or rows x k expert ids (each row's distinct and below n_experts) taken
            instead of the top-k, their weights computed from these logits (a routing
            record's replay).
    Returns:
        (ids, weights), rows x k each: numpy uint16 and float32 arrays of shape (rows, k) for
        numpy logits, else array('H') and array('f').
    Raises ParityError (PARITY_ERR_INVALID_ARGUMENT: sizes, a replayed id out of range or
    repeated; PARITY_ERR_POLICY: a topk-softmax router without norm_topk_prob)."""
    pol = policy_struct(policy)
    values, np_in = _floats(logits, "logits")
    if np_in is not None and np_in.ndim == 2:
        if n_experts is not None and n_experts != np_in.shape[1]:
            _lib.fail(_lib.ERR_INVALID_ARGUMENT, "logits has %d columns, n_experts=%d was given"
                      % (np_in.shape[1], n_experts))
        n_experts = np_in.shape[1]
    if n_experts is None:
        raise TypeError("moe_route() needs n_experts for logits that are not a 2-D array")
    n_experts = _lib.as_int(n_experts, "n_experts", 1, 2 ** 32 - 1)
    k = _lib.as_int(k, "k", 1, 2 ** 32 - 1)
    if len(values) % n_experts:
        _lib.fail(_lib.ERR_INVALID_ARGUMENT, "logits holds %d values, not a whole number of rows "
                  "of n_experts = %d" % (len(values), n_experts))
    rows = len(values) // n_experts
    rep = None
    if replay is not None:
        rep = _ids(replay, "replayed expert")
        if len(rep) != rows * k:
            _lib.fail(_lib.ERR_INVALID_ARGUMENT, "replay holds %d ids, %d rows of k = %d need %d"
                      % (len(rep), rows, k, rows * k))
    ids, weights = array("H", bytes(2 * rows * k)), array("f", bytes(4 * rows * k))
    lib.parity_moe_route(pol, rows, n_experts, k, 1 if norm_topk_prob else 0, _buf(values),
                         n_experts, _buf(rep) if rep is not None else None, _buf(ids),
                         _buf(weights))
    if np_in is None:
        return ids, weights
    np = sys.modules["numpy"]
    return (np.frombuffer(ids, dtype=np.uint16).reshape(rows, k).copy(),
            np.frombuffer(weights, dtype=np.float32).reshape(rows, k).copy())


def moe_combine(y, ids, weights, k, policy="aligned", y_shared=None, shared_gate=None):
    """A mixture-of-experts combine, as parity_moe_combine (a sparse layer of the forward sums
    its experts so, per the policy's moe_combine): each row's output from its k experts' fp32
    down-projection outputs y (unrounded), their ids and weights (moe_route's, slot order)
    and, for a Qwen2-MoE shared expert, its unrounded output y_shared and gate logit
    shared_gate (one per row, the gate GEMM's output rounded).

    Args:
        y: rows x k x width floats (numpy (rows, k, width), or flat); ids, weights: rows x k.
        y_shared: None, or rows x width floats; shared_gate: None, or rows floats (both or
            neither).
    Returns:
        rows x width floats: a numpy float32 array (rows, width) for numpy y, else array('f').
    """
    pol = policy_struct(policy)
    k = _lib.as_int(k, "k", 1, 2 ** 32 - 1)
    yv, np_in = _floats(y, "y")
    idv = _ids(ids, "expert id")
    wv, _ = _floats(weights, "weights")
    rows = len(idv) // k
    if rows == 0 or len(idv) != rows * k or len(wv) != rows * k or len(yv) % (rows * k):
        _lib.fail(_lib.ERR_INVALID_ARGUMENT, "ids (%d), weights (%d) and y (%d values) must hold "
                  "rows x k = %d ids and weights and rows x k x width values"
                  % (len(idv), len(wv), len(yv), k))
    width = len(yv) // (rows * k)
    ys = gate = None
    if (y_shared is None) != (shared_gate is None):
        _lib.fail(_lib.ERR_INVALID_ARGUMENT, "y_shared and shared_gate go together")
    if y_shared is not None:
        ys, _ = _floats(y_shared, "y_shared")
        gate, _ = _floats(shared_gate, "shared_gate")
        if len(ys) != rows * width or len(gate) != rows:
            _lib.fail(_lib.ERR_INVALID_ARGUMENT, "y_shared holds %d values and shared_gate %d; "
                      "%d rows of width %d need %d and %d"
                      % (len(ys), len(gate), rows, width, rows * width, rows))
    out = array("f", bytes(4 * rows * width))
    lib.parity_moe_combine(pol, rows, width, k, _buf(idv), _buf(wv), _buf(yv),
                           _buf(ys) if ys is not None else None,
                           _buf(gate) if gate is not None else None, _buf(out))
    if np_in is None:
        return out
    np = sys.modules["numpy"]
    return np.frombuffer(out, dtype=np.float32).reshape(rows, width).copy()


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
