"""Weights as the learner sends them: their memory handed to the library (Model.update), and
the learner's side of the sync check — a manifest of the weights it sent, in the format
parity_model_write_manifest writes and parity_model_verify (Model.verify) reads:

    {"version": N, "manifest_version": 2,
     "tensors": {"NAME": {"shape": [..], "dtype": "BF16", "fnv1a64": "16 hex digits"}, ...}}

The checksum is over the little-endian bytes of the bf16 values the sampler should hold: bf16
tensors as they are, f16 and f32 ones cast with round-to-nearest-even (the cast the library
applies to them in Model.update). Under manifest_version 2 (what the library and this module
write) it is the FNV-1a 64 of each 64 KiB chunk of those bytes, the chunks' checksums hashed
in order with FNV-1a 64; under version 1 (a manifest without "manifest_version", which the
library still reads and writes on request) FNV-1a 64 over the bytes in one chain (parity.h,
"Sync checks"). The library computes it (parity_tensor_checksums) on the caller's memory,
without a copy where that memory is contiguous, the chunks spread over a thread pool: the
value does not depend on the number of threads (bench/manifest_speed.py times it).
"""
import ctypes
import json
import re
import struct
import sys
from concurrent.futures import ThreadPoolExecutor

from . import _lib
from ._convert import Pinned, numpy_array
from ._lib import DTYPES, MANIFEST_VERSION, lib

_ITEMSIZE = {"BF16": 2, "F16": 2, "F32": 4, "F8_E4M3": 1}
#: write_manifest hashes the bf16 entries in batches of this many bytes of input (so that the
#: copies of tensors that are not contiguous CPU memory do not all exist at once).
_BATCH_BYTES = 1 << 30
_NUMPY_DTYPES = {"uint16": "BF16", "float16": "F16", "float32": "F32"}
_TORCH_DTYPES = {"torch.bfloat16": "BF16", "torch.float16": "F16", "torch.float32": "F32"}


def _is_torch(value):
    return type(value).__module__.startswith("torch") and hasattr(value, "data_ptr")


def _product(shape):
    n = 1
    for s in shape:
        n *= s
    return n


def tensor_view(value, name, pin):
    """(dtype name, shape, address, element count) of one tensor's values, its memory held by
    `pin` (a _convert.Pinned) until that is closed.

    Takes a torch tensor (bfloat16, float16, float32; any device: copied to the CPU), a numpy
    array (uint16 = bf16 bit patterns, float16, float32), or a tuple (dtype, shape, buffer)
    with dtype "BF16", "F16" or "F32" and any object with the buffer protocol (bytes,
    bytearray, memoryview, array.array, numpy array, ...) holding its little-endian values
    row-major. Contiguous memory is read where it is; a non-contiguous tensor, array or
    memoryview is copied in row-major order, a big-endian numpy array converted. Raises
    TypeError for anything else, ParityError (PARITY_ERR_INVALID_ARGUMENT) for a buffer whose
    size does not match its shape."""
    if _is_torch(value):
        dtype = _TORCH_DTYPES.get(str(value.dtype))
        if dtype is None:
            raise TypeError("%s: a torch tensor of %s; weights are bfloat16, float16 or float32"
                            % (name, value.dtype))
        t = value.detach()
        if t.device.type != "cpu":
            t = t.to("cpu")
        if not t.is_contiguous():
            t = t.contiguous()
        pin.keep(t)
        return dtype, tuple(t.shape), t.data_ptr(), t.numel()
    a = numpy_array(value)
    if a is not None:
        dtype = _NUMPY_DTYPES.get(a.dtype.name)
        if dtype is None:
            raise TypeError("%s: a numpy array of %s; weights are uint16 (bf16 bits), float16 or "
                            "float32" % (name, a.dtype))
        if not a.flags.c_contiguous or a.dtype.byteorder == ">":
            a = sys.modules["numpy"].ascontiguousarray(a, dtype=a.dtype.newbyteorder("<"))
        pin.keep(a)
        return dtype, tuple(a.shape), a.__array_interface__["data"][0], a.size
    if isinstance(value, tuple) and len(value) == 3:
        dtype, shape, buf = value
        if dtype not in DTYPES:
            raise TypeError("%s: dtype %r; one of BF16, F16, F32" % (name, dtype))
        if isinstance(shape, int) or not hasattr(shape, "__iter__"):
            raise TypeError("%s: the shape must be a sequence of ints, not %s"
                            % (name, type(shape).__name__))
        shape = tuple(_lib.as_int(s, "%s: a dimension" % name, 0, 2 ** 63 - 1) for s in shape)
        try:
            mv = memoryview(buf)
        except TypeError:
            raise TypeError("%s: the values must be an object with the buffer protocol (bytes, "
                            "bytearray, memoryview, array.array, numpy array), not %s"
                            % (name, type(buf).__name__)) from None
        if not mv.c_contiguous:
            mv = memoryview(mv.tobytes())
        n = _product(shape)
        if mv.nbytes != _ITEMSIZE[dtype] * n:
            _lib.fail(_lib.ERR_INVALID_ARGUMENT, "%s: %d bytes for shape %s of %s (want %d)"
                      % (name, mv.nbytes, shape, dtype, _ITEMSIZE[dtype] * n))
        return dtype, shape, pin.address(mv), n
    raise TypeError("%s: weights are numpy arrays, torch tensors or (dtype, shape, buffer) "
                    "tuples, not %s" % (name, type(value).__name__))


def _name(name):
    if not isinstance(name, str):
        raise TypeError("tensor names are str, not %s" % type(name).__name__)
    return name


def _checksums(views, version, pool=None):
    """The checksums (ints) of a manifest of `version` for views (dtype name, element count,
    address), on `pool` (a parity.Pool; None: the calling thread), by parity_tensor_checksums."""
    arr = (_lib.parity_tensor_data * max(len(views), 1))()
    for i, (dtype, n, address) in enumerate(views):
        arr[i].dtype = DTYPES[dtype]
        arr[i].ndim = 1
        arr[i].shape[0] = n
        arr[i].data = address
    out = (ctypes.c_uint64 * max(len(views), 1))()
    lib.parity_tensor_checksums(pool.handle if pool is not None else None, version, arr,
                                len(views), out)
    return list(out)[:len(views)]


def _bytes_checksums(buffers, version, pool=None):
    """The checksums of a manifest of `version` of (ctypes buffer or bytes, n bytes) pairs (a
    weight's codes and scales) in one call, on `pool` (None: the calling thread)."""
    with Pinned() as pin:
        return _checksums([("F8_E4M3", n, pin.address(buf)) for buf, n in buffers], version, pool)


def _version(manifest_version):
    return _lib.as_int(manifest_version, "manifest_version", 1, 2)


def checksum(value, name="tensor", manifest_version=MANIFEST_VERSION):
    """(shape, checksum as an int) of one tensor as tensor_view() takes it: the checksum a
    manifest of `manifest_version` (the library's by default) holds for it
    (parity_tensor_checksums)."""
    version = _version(manifest_version)
    with Pinned() as pin:
        dtype, shape, address, n = tensor_view(value, name, pin)
        return shape, _checksums([(dtype, n, address)], version)[0]


#: The decoder layers' linear weights: what an fp8 policy quantizes.
_LINEAR = re.compile(r"^model\.layers\.\d+\.(self_attn\.[qkvo]_proj|mlp\.(gate|up|down)_proj)\.weight$")


def _module(name):
    return name[:-len(".weight")]


_FORMAT_NAMES = {1: "fp8-block", 2: "mxfp8", 3: "nvfp4", 4: "mxfp4", 5: "ternary"}


def _lowbit_entry(name, rows, cols, address, n, pol, version, pool=None):
    """The entry of a weight a 4-bit or ternary policy quantizes (parity_model_write_manifest_for's
    form): the codes one a byte, the block scales' fp32 values (ternary: s_w), NVFP4's s2."""
    g = lib.parity_quant_scale_count(pol.quantizer, rows, cols)
    codes = ctypes.create_string_buffer(max(n, 1))
    scales = (ctypes.c_float * (g + 1))()
    lib.parity_quantize_weight(pol.quantizer, rows, cols, address, cols, codes, scales)
    raw = bytes(scales)
    fmt = _FORMAT_NAMES[pol.gemm]
    if pol.gemm == 5:
        block, grid, sraw, sdtype = (rows, cols), (1, 1), raw[4 * g:4 * g + 4], "F32"
    else:
        bc = 16 if pol.gemm == 3 else 32
        block, grid, sraw = (1, bc), (rows, -(-cols // bc)), raw[:4 * g]
        sdtype = "F8_E4M3" if pol.gemm == 3 else "F8_E8M0"
    hc, hs = _bytes_checksums([(codes, n), (sraw, len(sraw))], version, pool)
    rule = lib.parity_quantizer_name(pol.quantizer).decode()
    tail = (', "tensor_scale": "%08x"' % struct.unpack("<I", raw[4 * g:4 * g + 4])[0]
            if pol.gemm == 3 else "")
    return ('  %s: {"shape": [%d, %d], "dtype": "%s", "format": "%s", "block": [%d, %d], '
            '"quantizer": "%s", "fnv1a64": "%016x", "scales": {"shape": [%d, %d], "dtype": "%s", '
            '"fnv1a64": "%016x"}%s}'
            % (json.dumps(name), rows, cols, "TERNARY" if pol.gemm == 5 else "E2M1", fmt,
               block[0], block[1], rule, hc, grid[0], grid[1], sdtype, hs, tail))


def _quantized_view(name, value, pin):
    """(rows, cols, address, element count) of a weight a quantized policy quantizes, its memory
    held by `pin`; TypeError unless it is a matrix of float32 values (the learner's masters)."""
    dtype, shape, address, n = tensor_view(value, name, pin)
    if dtype != "F32" or len(shape) != 2:
        raise TypeError("%s: a quantized manifest quantizes the learner's float32 masters; this "
                        "is a %s tensor of %d dimensions" % (name, dtype, len(shape)))
    return shape[0], shape[1], address, n


def _quantized_entry(name, view, pol, version, pool=None):
    """The manifest entry of a weight a quantized policy quantizes: its codes and scales made
    with the policy's quantizer from its float32 values (_quantized_view), their checksums on
    `pool` (None: the calling thread)."""
    rows, cols, address, n = view
    if pol.gemm >= 3:
        return _lowbit_entry(name, rows, cols, address, n, pol, version, pool)
    mx = pol.gemm == 2
    grid = (rows, -(-cols // 32)) if mx else (-(-rows // 128), -(-cols // 128))
    codes = ctypes.create_string_buffer(max(n, 1))
    if mx:
        e8m0 = ctypes.create_string_buffer(max(grid[0] * grid[1], 1))
        lib.parity_mxfp8_quantize(pol.quantizer, rows, cols, address, cols, codes, cols, e8m0)
        # the scales as the library holds them: fp32 powers of two 2^(b - 127)
        scales = struct.pack("<%df" % (grid[0] * grid[1]),
                             *[2.0 ** (b - 127) for b in e8m0.raw[:grid[0] * grid[1]]])
    else:
        buf = (ctypes.c_float * max(grid[0] * grid[1], 1))()
        lib.parity_fp8_quantize_blocks(pol.quantizer, rows, cols, address, cols, 128, 128, codes,
                                       cols, buf)
        scales = bytes(buf)[:4 * grid[0] * grid[1]]
    hc, hs = _bytes_checksums([(codes, n), (scales, len(scales))], version, pool)
    rule = lib.parity_quantizer_name(pol.quantizer).decode()
    return ('  %s: {"shape": [%d, %d], "dtype": "F8_E4M3", "format": "%s", "block": [%s], '
            '"quantizer": "%s", "fnv1a64": "%016x", "scales": {"shape": [%d, %d], "dtype": "%s", '
            '"fnv1a64": "%016x"}}'
            % (json.dumps(name), rows, cols, "mxfp8" if mx else "fp8-block",
               "1, 32" if mx else "128, 128", rule, hc, grid[0], grid[1],
               "F8_E8M0" if mx else "F32", hs))


def write_manifest(path, tensors, version=0, policy=None, kept=(), threads=None,
                   manifest_version=MANIFEST_VERSION):
    """Writes the manifest of `tensors` (a dict name -> value as tensor_view() takes) with
    `version` (the model's version once these weights are in: the number of updates), in the
    format of `manifest_version` (the library's, 2, by default; 1 for a reader that knows only
    that one), the checksums computed on a pool of `threads` threads (None = the CPUs this
    process may use; the file is the same on any number).

    With `policy` (a name or parity.Policy) whose gemm is quantized ("vllm+fp8-block:deepseek",
    "hf-eager+mxfp8:te", "vllm+nvfp4:modelopt", "vllm+mxfp4:ocp", "hf-eager+ternary:bitnet"), the decoder linear weights — except the modules or weight names
    in `kept`, which the learner keeps in bf16 — are listed as the codes and scales its GEMMs
    read: quantized with the policy's rule from their float32 values (the masters; another
    dtype raises TypeError), as parity_model_write_manifest_for writes them; Model.verify(path,
    policy=...) checks a sampler against it. Those weights are quantized and hashed on `threads`
    worker threads, a weight each (the file does not depend on their number)."""
    from .pool import Pool
    from .policy import policy_struct
    if not isinstance(tensors, dict):
        raise TypeError("tensors must be a dict of name -> values, not %s"
                        % type(tensors).__name__)
    version = _lib.as_int(version, "version", 0, 2 ** 64 - 1)
    mv = _version(manifest_version)
    pol = policy_struct(policy) if policy is not None else None
    quantized = pol is not None and pol.gemm != 0
    kept = set(kept)
    entries, batch = [], []   # batch: (entry index, name, shape, view) of bf16 entries

    def flush(pool):
        """The batch's checksums in one call, every tensor's chunks spread over the pool."""
        sums = _checksums([view for _, _, _, view in batch], mv, pool)
        for (i, name, shape, _), h in zip(batch, sums):
            entries[i] = ('  %s: {"shape": [%s], "dtype": "BF16", "fnv1a64": "%016x"}'
                          % (json.dumps(name), ", ".join(str(s) for s in shape), h))
        del batch[:]

    pending = []  # (entry index, future) of the quantized entries being made

    def settle():
        """The quantized entries made so far into `entries`, in order (the first failure in
        the order given raised)."""
        for i, made in pending:
            entries[i] = made.result()
        del pending[:]

    pin, pinned_bytes, qpin, qpinned_bytes = Pinned(), 0, Pinned(), 0
    try:
        # the quantized entries (their quantization is the most of their cost) made on worker
        # threads, a weight each: ctypes lets go of the GIL in the library's calls, so the
        # weights are quantized and hashed in parallel while the bf16 entries' chunks are
        # hashed on the pool; the executor waits for its workers before the memory is released
        with Pool(threads) as pool, ThreadPoolExecutor(pool.threads) as workers:
            try:
                for name, value in tensors.items():
                    _name(name)
                    if quantized and _LINEAR.match(name) and name not in kept and \
                            _module(name) not in kept:
                        view = _quantized_view(name, value, qpin)
                        entries.append(None)
                        pending.append((len(entries) - 1,
                                        workers.submit(_quantized_entry, name, view, pol, mv)))
                        qpinned_bytes += 4 * view[3]
                        if qpinned_bytes >= _BATCH_BYTES:
                            settle()
                            qpin.close()
                            qpin, qpinned_bytes = Pinned(), 0
                        continue
                    dtype, shape, address, n = tensor_view(value, name, pin)
                    entries.append(None)
                    batch.append((len(entries) - 1, name, shape, (dtype, n, address)))
                    # the memory pinned (a copy where the tensor was not contiguous CPU memory)
                    # stays bounded: a batch is hashed and released every _BATCH_BYTES
                    pinned_bytes += n * _ITEMSIZE[dtype]
                    if pinned_bytes >= _BATCH_BYTES:
                        flush(pool)
                        pin.close()
                        pin, pinned_bytes = Pinned(), 0
                flush(pool)
            except BaseException:
                settle()  # an earlier weight's failure first
                raise
            settle()
    finally:
        pin.close()
        qpin.close()
    head = '{"version": %d, ' % version
    if mv >= 2:
        head += '"manifest_version": %d, ' % mv
    if quantized:
        head += '"quantization": {"format": "%s", "quantizer": "%s"}, ' % (
            _FORMAT_NAMES[pol.gemm], lib.parity_quantizer_name(pol.quantizer).decode())
    with open(path, "w") as f:
        f.write('%s"tensors": {\n%s\n}}\n' % (head, ",\n".join(entries)))


def c_tensors(tensors, pin):
    """A parity_tensor_data array of `tensors` for Model.update, their memory held by `pin`."""
    arr = (_lib.parity_tensor_data * max(len(tensors), 1))()
    for i, (name, value) in enumerate(tensors.items()):
        dtype, shape, address, _ = tensor_view(value, _name(name), pin)
        if not 1 <= len(shape) <= 2:
            _lib.fail(_lib.ERR_INVALID_ARGUMENT, "%s: %d dimensions; weights have 1 or 2"
                      % (name, len(shape)))
        arr[i].name = pin.keep(name.encode())
        arr[i].dtype = DTYPES[dtype]
        arr[i].ndim = len(shape)
        for k, s in enumerate(shape):
            arr[i].shape[k] = s
        arr[i].data = address
    return arr
