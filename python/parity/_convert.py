"""Turning Python and numpy objects into the C buffers the library reads, without copies where
the object's memory already has the right layout. numpy is used only when the caller passes a
numpy array (it is then already imported); nothing here imports it."""
import ctypes
import sys
from array import array

from . import _lib

assert array("i").itemsize == 4 and array("I").itemsize == 4 and array("H").itemsize == 2

_INT_CODES = "bBhHiIlLqQ"
_I32_MIN, _I32_MAX = -2 ** 31, 2 ** 31 - 1


def numpy_array(x):
    """x if it is a numpy ndarray, else None (without importing numpy)."""
    np = sys.modules.get("numpy")
    if np is not None and isinstance(x, np.ndarray):
        return x
    return None


def pointer(buf, ctype):
    """A pointer to the first element of a writable buffer (array.array or bytearray) or of a
    numpy array's data, as a ctype (ctypes.byref of a ctype over that memory: cheap, and typed
    for the C function's POINTER(ctype) argument). The caller keeps `buf` alive for as long
    as it is used. An empty buffer gets a zeroed dummy, so that the library sees a valid
    pointer and reports what is wrong itself."""
    if type(buf) is array:
        return ctypes.byref(ctype.from_buffer(buf)) if len(buf) else ctypes.byref(ctype())
    if buf is None or len(buf) == 0:
        return ctypes.byref(ctype())
    if numpy_array(buf) is not None:
        return ctypes.byref(ctype.from_address(buf.__array_interface__["data"][0]))
    return ctypes.byref(ctype.from_buffer(buf))


# ---- memory of buffer-protocol objects -----------------------------------------------------

class _Py_buffer(ctypes.Structure):
    """Py_buffer of the C API (stable since Python 3.3, in the limited API since 3.11)."""
    _fields_ = [("buf", ctypes.c_void_p), ("obj", ctypes.c_void_p), ("len", ctypes.c_ssize_t),
                ("itemsize", ctypes.c_ssize_t), ("readonly", ctypes.c_int),
                ("ndim", ctypes.c_int), ("format", ctypes.c_char_p),
                ("shape", ctypes.c_void_p), ("strides", ctypes.c_void_p),
                ("suboffsets", ctypes.c_void_p), ("internal", ctypes.c_void_p)]


# int PyObject_GetBuffer(PyObject *obj, Py_buffer *view, int flags) (raises on failure: a
# function of ctypes.pythonapi checks the Python error indicator) and
# void PyBuffer_Release(Py_buffer *view)
_get_buffer = ctypes.pythonapi.PyObject_GetBuffer
_get_buffer.restype = ctypes.c_int
_get_buffer.argtypes = [ctypes.py_object, ctypes.POINTER(_Py_buffer), ctypes.c_int]
_release_buffer = ctypes.pythonapi.PyBuffer_Release
_release_buffer.restype = None
_release_buffer.argtypes = [ctypes.POINTER(_Py_buffer)]
_PyBUF_SIMPLE = 0  # a contiguous block of bytes, read-only allowed


class Pinned:
    """Holds the memory of Python objects in place while the library reads it: address(obj)
    is the address of the bytes of any object with the buffer protocol (bytes, bytearray,
    memoryview, array.array, numpy arrays, mmap, ...), read-only ones included, without a
    copy; keep(obj) keeps an object (a numpy array or torch tensor whose address the caller
    took) alive. Leaving the ``with`` block releases them."""

    def __init__(self):
        self._views, self._keep = [], []

    def address(self, obj):
        """The address of obj's bytes (BufferError if they are not one contiguous block)."""
        view = _Py_buffer()
        _get_buffer(obj, ctypes.byref(view), _PyBUF_SIMPLE)
        self._views.append(view)
        return view.buf or 0

    def keep(self, obj):
        self._keep.append(obj)
        return obj

    def close(self):
        views, self._views, self._keep = self._views, [], []
        for view in views:
            _release_buffer(ctypes.byref(view))

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


# ---- token ids --------------------------------------------------------------------------------

def _np_tokens(a, what):
    """A 1-D or 2-D numpy array of token ids as contiguous int32 (range-checked)."""
    np = sys.modules["numpy"]
    if a.dtype.kind not in "iu":
        raise TypeError("%s must hold integer token ids, not %s" % (what, a.dtype))
    if a.dtype != np.int32 and a.size:
        lo, hi = int(a.min()), int(a.max())
        if lo < _I32_MIN or hi > _I32_MAX:
            _lib.fail(_lib.ERR_TOKEN_RANGE, "%s holds token id %d, which does not fit int32"
                      % (what, lo if lo < _I32_MIN else hi))
    return np.ascontiguousarray(a, dtype=np.int32)


def _append_tokens(flat, seq, what):
    """Appends one sequence's ids to the int32 array `flat`; returns its length and whether it
    was a numpy array."""
    a = numpy_array(seq)
    if a is not None:
        if a.ndim != 1:
            raise TypeError("%s must be a 1-D array of token ids, not %d-D" % (what, a.ndim))
        a = _np_tokens(a, what)
        flat.frombytes(a.tobytes())
        return len(a), True
    if isinstance(seq, array):
        if seq.typecode not in _INT_CODES:
            raise TypeError("%s must hold integer token ids, not array('%s')"
                            % (what, seq.typecode))
        if seq.typecode == "i":
            flat.extend(seq)
            return len(seq), False
        seq = seq.tolist()
    elif isinstance(seq, (str,)):
        raise TypeError("%s is a str: pass token ids (a list of ints), or bytes whose byte "
                        "values are the ids" % what)
    n = len(flat)
    try:
        flat.extend(seq)  # bytes/bytearray/memoryview iterate as ints
    except OverflowError:
        bad = next(t for t in seq if not _I32_MIN <= t <= _I32_MAX)
        _lib.fail(_lib.ERR_TOKEN_RANGE, "%s holds token id %d, which does not fit int32"
                  % (what, bad))
    except TypeError as e:
        raise TypeError("%s must be a sequence of integer token ids (%s)" % (what, e)) from None
    return len(flat) - n, False


def _is_single(x):
    """Whether x is one sequence of token ids (rather than a collection of sequences)."""
    if isinstance(x, (bytes, bytearray, memoryview, array)):
        return True
    a = numpy_array(x)
    if a is not None:
        return a.ndim == 1
    if isinstance(x, (list, tuple)):
        return len(x) > 0 and hasattr(x[0], "__index__") and not isinstance(x[0], bool) \
            and numpy_array(x[0]) is None
    return False


class TokenBatch:
    """Sequences of token ids packed as the library takes them.

    Attributes: tokens (array('i') or an int32 numpy array), lengths (array('I')), n (count),
    single (the caller passed one sequence), numpy (per sequence: it was a numpy array),
    matrix (the caller passed one 2-D numpy array)."""

    def __init__(self, sequences, what="sequences"):
        self.matrix = False
        if type(sequences) is list and sequences:
            first = sequences[0]
            if type(first) is int:  # fast path: one list of ints
                try:
                    self.tokens = array("i", sequences)
                except (TypeError, OverflowError):
                    pass  # the general path below says what is wrong
                else:
                    self.lengths, self.n = array("I", [len(sequences)]), 1
                    self.single, self.numpy, self.any_numpy = True, [False], False
                    return
            elif type(first) is list and all(type(x) is list for x in sequences):
                flat = array("i")
                try:  # fast path: a list of lists of ints
                    for seq in sequences:
                        flat.extend(seq)
                except (TypeError, OverflowError):
                    pass
                else:
                    self.tokens, self.n = flat, len(sequences)
                    self.lengths = array("I", [len(x) for x in sequences])
                    self.single, self.numpy = False, [False] * self.n
                    self.any_numpy = False
                    return
        self.single = _is_single(sequences)
        a = numpy_array(sequences)
        if a is not None and a.ndim == 2:
            self.tokens = _np_tokens(a, what)
            self.lengths = array("I", [a.shape[1]]) * a.shape[0]
            self.n = a.shape[0]
            self.numpy = [True] * self.n
            self.matrix = self.any_numpy = True
            return
        if a is not None and a.ndim != 1:
            raise TypeError("%s: a numpy array of token ids must be 1-D (one sequence) or 2-D "
                            "(one per row), not %d-D" % (what, a.ndim))
        if self.single:
            sequences = [sequences]
        elif isinstance(sequences, (str, dict)) or not hasattr(sequences, "__iter__"):
            raise TypeError("%s must be a sequence of token ids or a list of them, not %s"
                            % (what, type(sequences).__name__))
        flat, lengths, kinds = array("i"), array("I"), []
        for i, seq in enumerate(sequences):
            if hasattr(seq, "__index__") and numpy_array(seq) is None:
                raise TypeError("%s: element %d is an int among sequences: pass one sequence "
                                "of ids or a list of sequences, not a mix" % (what, i))
            n, is_np = _append_tokens(flat, seq, "%s[%d]" % (what, i) if not self.single else what)
            lengths.append(n)
            kinds.append(is_np)
        self.tokens, self.lengths, self.n, self.numpy = flat, lengths, len(lengths), kinds
        self.any_numpy = any(kinds)

    def pointers(self):
        """(tokens, lengths) as ctypes pointers; a batch with no sequence gets 1-element
        dummies so that the library reports what is wrong (no sequences) instead of a NULL."""
        return (pointer(self.tokens, ctypes.c_int32), pointer(self.lengths, ctypes.c_uint32))


# ---- bf16 buffers -----------------------------------------------------------------------------

class Bf16:
    """A buffer of bf16 bit patterns (uint16) seen as rows of `dim` elements `stride` apart.

    Takes numpy uint16 arrays (any number of dimensions; the last is the row, its elements
    contiguous; a 2-D array may have any row stride), array('H'), bytearray / bytes (native
    byte order, 2 bytes an element) and memoryviews of those (format 'H' or 'B')."""

    def __init__(self, obj, name, writable=False):
        self.obj, self.name = obj, name
        self.np = numpy_array(obj)
        if self.np is not None:
            a = self.np
            if a.dtype.name != "uint16":
                raise TypeError("%s must hold bf16 bit patterns as uint16, not %s "
                                "(use x.view(numpy.uint16) on bf16 bits)" % (name, a.dtype))
            if a.ndim == 0:
                raise TypeError("%s must have at least one dimension" % name)
            if writable and not a.flags.writeable:
                raise TypeError("%s is read-only" % name)
            if a.ndim > 2:
                if not a.flags.c_contiguous:
                    raise TypeError("%s: an array of more than 2 dimensions must be "
                                    "C-contiguous" % name)
                a = a.reshape(-1, a.shape[-1])
            if a.strides[-1] != 2 and a.shape[-1] > 1:
                raise TypeError("%s: the elements of a row must be contiguous (stride %d bytes)"
                                % (name, a.strides[-1]))
            if a.ndim == 2 and (a.strides[0] < 0 or a.strides[0] % 2):
                raise TypeError("%s: negative or odd row stride %d bytes" % (name, a.strides[0]))
            self.shape = (a.shape[0], a.shape[1]) if a.ndim == 2 else None
            self.stride = a.strides[0] // 2 if a.ndim == 2 and a.shape[0] > 1 else None
            self.size = a.size
            self.span = ((a.shape[0] - 1) * a.strides[0] // 2 + a.shape[1]) if a.ndim == 2 \
                else a.size
            self.ptr = ctypes.cast(a.ctypes.data, ctypes.POINTER(ctypes.c_uint16))
            return
        self.shape, self.stride = None, None
        if isinstance(obj, array):
            if obj.typecode != "H":
                raise TypeError("%s must be array('H') of bf16 bit patterns, not array('%s')"
                                % (name, obj.typecode))
            mv = memoryview(obj).cast("B")
        elif isinstance(obj, (bytes, bytearray, memoryview)):
            mv = memoryview(obj)
            if mv.format not in ("B", "b", "c", "H", "<H", "=H", "@H"):
                raise TypeError("%s: a memoryview of format %r is not bf16 bits (uint16, 'H')"
                                % (name, mv.format))
            if not mv.c_contiguous:
                raise TypeError("%s must be contiguous" % name)
            mv = mv.cast("B")
            if mv.nbytes % 2:
                raise TypeError("%s has %d bytes, an odd number: not bf16 elements"
                                % (name, mv.nbytes))
        else:
            raise TypeError("%s must be a bf16 buffer (numpy uint16 array, array('H'), bytearray "
                            "or memoryview), not %s" % (name, type(obj).__name__))
        self.size = self.span = mv.nbytes // 2
        if mv.readonly:
            if writable:
                raise TypeError("%s is read-only (bytes): pass a bytearray or array('H')" % name)
            self._keep = (ctypes.c_uint16 * max(self.size, 1)).from_buffer_copy(
                mv.tobytes() or b"\0\0")
        else:
            self._keep = (ctypes.c_uint16 * max(self.size, 1)).from_buffer(mv) if self.size \
                else (ctypes.c_uint16 * 1)()
        self._mv = mv
        self.ptr = ctypes.cast(self._keep, ctypes.POINTER(ctypes.c_uint16))

    def same_memory(self, other):
        return ctypes.addressof(self.ptr.contents) == ctypes.addressof(other.ptr.contents)

    def check_rows(self, rows, dim):
        """The row stride to pass for `rows` x `dim` (raises ParityError if the buffer is too
        small or shaped otherwise)."""
        if self.shape is not None:
            if self.shape[1] != dim or self.shape[0] != rows:
                _lib.fail(_lib.ERR_INVALID_ARGUMENT, "%s has shape %s, expected (%d, %d)"
                          % (self.name, self.shape, rows, dim))
            return self.stride if self.stride is not None else dim
        if self.size != rows * dim:
            _lib.fail(_lib.ERR_INVALID_ARGUMENT, "%s holds %d elements, expected rows x dim = "
                      "%d x %d = %d" % (self.name, self.size, rows, dim, rows * dim))
        return dim

    def like(self, name):
        """A new zeroed buffer of the same kind and shape (for outputs)."""
        if self.np is not None:
            return sys.modules["numpy"].zeros(self.np.shape, dtype=self.np.dtype)
        if isinstance(self.obj, array):
            return array("H", bytes(2 * self.size))
        return bytearray(2 * self.size)
