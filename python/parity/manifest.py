"""Weights as the learner sends them: conversion to the library's tensor data, and the learner's
side of the sync check — a manifest of the weights it sent, in the format
parity_model_write_manifest writes and parity_model_verify (Model.verify) reads:

    {"version": N, "tensors": {"NAME": {"shape": [..], "dtype": "BF16",
                                        "fnv1a64": "16 hex digits"}, ...}}

The checksum is FNV-1a 64 over the little-endian bytes of the bf16 values the sampler should
hold: bf16 tensors as they are, f16 and f32 ones cast with round-to-nearest-even (the cast the
library applies to them in Model.update). Pure Python: about a second per 10 MB of weights.
"""
import ctypes
import json
import struct
import sys
from array import array

from . import _lib
from ._convert import numpy_array

DTYPES = {"BF16": 0, "F16": 1, "F32": 2}
_FNV_OFFSET, _FNV_PRIME, _MASK = 0xCBF29CE484222325, 0x100000001B3, (1 << 64) - 1


def tensor_data(value, name="tensor"):
    """(dtype name, shape, bytes-like, keepalive) of one tensor's values.

    Takes a numpy array (uint16 = bf16 bit patterns, float16, float32), a torch tensor
    (bfloat16, float16, float32; copied to the CPU), or a tuple (dtype, shape, buffer) with
    dtype "BF16", "F16" or "F32" and a buffer of its little-endian values. 1 or 2 dimensions.
    Raises TypeError for anything else."""
    if type(value).__module__.startswith("torch"):
        np = __import__("numpy")
        t = value.detach().to("cpu").contiguous()
        kind = str(t.dtype).replace("torch.", "")
        if kind == "bfloat16":
            import torch
            value = t.view(torch.int16).numpy().view(np.uint16)
        elif kind in ("float16", "float32"):
            value = t.numpy()
        else:
            raise TypeError("%s: a torch tensor of %s; weights are bfloat16, float16 or float32"
                            % (name, t.dtype))
    a = numpy_array(value)
    if a is not None:
        dtype = {"uint16": "BF16", "float16": "F16", "float32": "F32"}.get(a.dtype.name)
        if dtype is None:
            raise TypeError("%s: a numpy array of %s; weights are uint16 (bf16 bits), float16 or "
                            "float32" % (name, a.dtype))
        a = sys.modules["numpy"].ascontiguousarray(a)
        if a.dtype.byteorder == ">":
            a = a.byteswap().newbyteorder()
        return dtype, tuple(a.shape), a, a
    if isinstance(value, tuple) and len(value) == 3:
        dtype, shape, buf = value
        if dtype not in DTYPES:
            raise TypeError("%s: dtype %r; one of BF16, F16, F32" % (name, dtype))
        shape = tuple(int(s) for s in shape)
        mv = memoryview(buf).cast("B")
        want = (2 if dtype != "F32" else 4) * _product(shape)
        if mv.nbytes != want:
            _lib.fail(_lib.ERR_INVALID_ARGUMENT, "%s: %d bytes for shape %s of %s (want %d)"
                      % (name, mv.nbytes, shape, dtype, want))
        return dtype, shape, mv, buf
    raise TypeError("%s: weights are numpy arrays, torch tensors or (dtype, shape, buffer) "
                    "tuples, not %s" % (name, type(value).__name__))


def _product(shape):
    n = 1
    for s in shape:
        n *= s
    return n


def bf16_bytes(dtype, data):
    """The little-endian bf16 bytes of a tensor's values (f16/f32 cast with RNE)."""
    if dtype == "BF16":
        return bytes(memoryview(data).cast("B"))
    raw = bytes(memoryview(data).cast("B"))
    if dtype == "F16":
        values = struct.unpack("<%de" % (len(raw) // 2), raw)
        f32 = array("f", values)
    else:
        f32 = array("f")
        f32.frombytes(raw)
        if sys.byteorder == "big":
            f32.byteswap()
    u = array("I", f32.tobytes())
    out = array("H", (0x7FC0 if (x & 0x7FFFFFFF) > 0x7F800000
                      else (x + 0x7FFF + ((x >> 16) & 1)) >> 16 for x in u))
    if sys.byteorder == "big":
        out.byteswap()
    return out.tobytes()


def fnv1a64(data):
    """FNV-1a 64 of bytes (an int)."""
    h = _FNV_OFFSET
    for b in data:
        h = ((h ^ b) * _FNV_PRIME) & _MASK
    return h


def write_manifest(path, tensors, version=0):
    """Writes the manifest of `tensors` (a dict name -> value as tensor_data() takes) with
    `version` (the model's version once these weights are in: the number of updates)."""
    entries = []
    for name, value in tensors.items():
        dtype, shape, data, _ = tensor_data(value, name)
        entries.append('  %s: {"shape": [%s], "dtype": "BF16", "fnv1a64": "%016x"}'
                       % (json.dumps(name), ", ".join(str(s) for s in shape),
                          fnv1a64(bf16_bytes(dtype, data))))
    with open(path, "w") as f:
        f.write('{"version": %d, "tensors": {\n%s\n}}\n' % (version, ",\n".join(entries)))


def c_tensors(tensors):
    """A parity_tensor_data array for Model.update, and what keeps its memory alive."""
    arr = (_lib.parity_tensor_data * max(len(tensors), 1))()
    keep = []
    for i, (name, value) in enumerate(tensors.items()):
        dtype, shape, data, holder = tensor_data(value, name)
        if not 1 <= len(shape) <= 2:
            _lib.fail(_lib.ERR_INVALID_ARGUMENT, "%s: %d dimensions; weights have 1 or 2"
                      % (name, len(shape)))
        if numpy_array(data) is not None:
            addr = data.__array_interface__["data"][0]
        else:
            mv = memoryview(data).cast("B")
            buf = (ctypes.c_char * max(mv.nbytes, 1)).from_buffer_copy(mv.tobytes() or b"\0")
            keep.append(buf)
            addr = ctypes.addressof(buf)
        encoded = name.encode()
        keep += [encoded, holder]
        arr[i].name = encoded
        arr[i].dtype = DTYPES[dtype]
        arr[i].ndim = len(shape)
        for k, s in enumerate(shape):
            arr[i].shape[k] = s
        arr[i].data = addr
    return arr, keep
