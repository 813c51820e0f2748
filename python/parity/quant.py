"""FP8 elements and the named FP8 quantizers (parity.h, "fp16 and fp8 elements" and "FP8
quantizers"): the rules of the public code — DeepSeek/vLLM, SGLang, TransformerEngine,
DeepGEMM, TE's power-of-two scales for block FP8; the OCP floor rule and TE's RCEIL for
MXFP8 — as the fp32 arithmetic each source performs, so that both sides of an RL loop can name
one and get the same codes and scales.

Values are float32 buffers: array('f'), a bytes-like object of float32s, or a numpy float32
array (C-contiguous). Results are bytes (E4M3 codes, E8M0 scales) and array('f') (fp32 block
scales), or numpy arrays when the input was one.

    codes, scales = parity.quant.quantize_fp8_blocks(w, rows, cols, "te", block=(128, 128))
    codes, e8m0 = parity.quant.quantize_mxfp8(x, rows, cols, "ocp")
"""
import ctypes
from array import array

from . import _lib
from ._convert import numpy_array
from ._lib import lib

__all__ = ["BLOCK_RULES", "MX_RULES", "FP4_ROUNDINGS", "fp8_from_f32", "fp8_to_f32", "fp4_from_f32", "fp4_to_f32",
           "fp4_pack", "fp4_unpack", "quantize_fp8_blocks",
           "quantize_mxfp8", "fp16_from_f32", "fp16_to_f32", "NVFP4_RULES", "MXFP4_RULES",
           "TERNARY_RULES", "quantize_nvfp4", "quantize_mxfp4", "quantize_ternary",
           "quantize_weight", "quantize_bf16_export", "adjust_bf16", "quantize_nvfp4_2d",
           "quantize_nvfp4_sr", "rht16"]

#: The names of the block-FP8 and MXFP8 quantizers, as parity_quantizer_from_name takes them.
BLOCK_RULES = ("deepseek", "sglang", "te", "deepgemm", "te-pow2")
MX_RULES = ("ocp", "te")
#: The names of the 4-bit and ternary quantizers (parity.h, "4-bit and ternary quantizers").
NVFP4_RULES = ("modelopt", "te", "torchao", "te-2d")
MXFP4_RULES = ("ocp", "rceil", "microxcaling")
TERNARY_RULES = ("bitnet", "hf-bitlinear", "onebitllms")
_GEMM = {"nvfp4": 3, "mxfp4": 4, "ternary": 5}
_FORMATS = {"e4m3": 0, "e5m2": 1}


def fp16_from_f32(x):
    """The fp16 bit pattern (int) of a float rounded to float32 then to fp16 (RNE, overflow to
    inf, every NaN 0x7e00)."""
    return lib.parity_fp16_from_f32(x)


def fp16_to_f32(bits):
    """The float value of an fp16 bit pattern (exact)."""
    return lib.parity_fp16_to_f32(bits)


def _floats(values, what):
    """(a ctypes buffer holding the float32 values, their count, the numpy module or None)."""
    a = numpy_array(values)
    if a is not None:
        if a.dtype.str != "<f4" or not a.flags["C_CONTIGUOUS"]:
            raise TypeError("%s must be a C-contiguous float32 numpy array, not %s" % (what, a.dtype))
        import numpy
        buf = (ctypes.c_char * a.nbytes).from_address(a.__array_interface__["data"][0])
        return buf, a.size, numpy, a
    if isinstance(values, array):
        if values.typecode != "f":
            raise TypeError("%s must be an array('f'), not array(%r)" % (what, values.typecode))
        data = values.tobytes()
    else:
        try:
            data = bytes(memoryview(values).cast("B"))
        except TypeError:
            raise TypeError("%s must be a float32 buffer (array('f'), bytes, numpy float32), not %s"
                            % (what, type(values).__name__)) from None
        if len(data) % 4:
            raise ValueError("%s holds %d bytes, not a whole number of float32s" % (what, len(data)))
    return ctypes.create_string_buffer(data, len(data)), len(data) // 4, None, None


#: parity.h's PARITY_GEMM_FP8_BLOCK and PARITY_GEMM_MXFP8.
_GEMM_FP8_BLOCK, _GEMM_MXFP8 = 1, 2


def _rule(mx, name):
    q = ctypes.c_int()
    lib.parity_quantizer_from_name(_GEMM_MXFP8 if mx else _GEMM_FP8_BLOCK, name.encode(),
                                   ctypes.byref(q))
    return q.value


def _shape(n, rows, cols):
    rows, cols = _lib.as_int(rows, "rows", 1, 2 ** 62), _lib.as_int(cols, "cols", 1, 2 ** 62)
    if rows * cols != n:
        raise ValueError("%d values are not %d x %d" % (n, rows, cols))
    return rows, cols


def fp8_from_f32(values, format="e4m3", saturate=True):
    """The fp8 codes (bytes) of float32 values: "e4m3" or "e5m2", round to nearest even,
    saturating (the quantizers' clamp) or not (c10's conversion before 2026)."""
    buf, n, np, _ = _floats(values, "values")
    out = ctypes.create_string_buffer(max(n, 1))
    lib.parity_fp8_from_f32(_FORMATS[format], 1 if saturate else 0, n, buf, out)
    return np.frombuffer(out.raw[:n], dtype=np.uint8).copy() if np else out.raw[:n]


def fp8_to_f32(codes, format="e4m3"):
    """The float32 values (array('f')) of fp8 codes (a bytes-like object), exact."""
    data = bytes(memoryview(codes).cast("B"))
    out = array("f", bytes(4 * len(data)))
    src = ctypes.create_string_buffer(data, max(len(data), 1))
    lib.parity_fp8_to_f32(_FORMATS[format], len(data), src,
                          (ctypes.c_char * len(out.tobytes())).from_buffer(out) if len(data) else None)
    return out


#: E2M1 roundings (parity_fp4_from_f32).
FP4_ROUNDINGS = {"nearest-even": 0, "half-away": 1}


def _codes(codes):
    data = bytes(memoryview(codes).cast("B"))
    return data, ctypes.create_string_buffer(data, max(len(data), 1))


def fp4_from_f32(values, rounding="nearest-even"):
    """The E2M1 codes (bytes, one code in the low nibble of each) of float32 values:
    "nearest-even" (PTX cvt.rn.satfinite, torchao, ModelOpt) or "half-away" (microxcaling's
    round="nearest"), saturating at +-6. Raises ParityError for a NaN."""
    if rounding not in FP4_ROUNDINGS:
        raise ValueError("rounding must be one of %s, not %r" % (", ".join(FP4_ROUNDINGS), rounding))
    buf, n, np, _ = _floats(values, "values")
    out = ctypes.create_string_buffer(max(n, 1))
    lib.parity_fp4_from_f32(FP4_ROUNDINGS[rounding], n, buf, out)
    return np.frombuffer(out.raw[:n], dtype=np.uint8).copy() if np else out.raw[:n]


def fp4_to_f32(codes):
    """The float32 values (array('f')) of E2M1 codes (a bytes-like object, one code a byte)."""
    data, src = _codes(codes)
    out = array("f", bytes(4 * len(data)))
    lib.parity_fp4_to_f32(len(data), src,
                          (ctypes.c_char * len(out.tobytes())).from_buffer(out) if data else None)
    return out


def fp4_pack(codes):
    """Two E2M1 codes a byte (bytes): code 2j in the low nibble of byte j, 2j + 1 in the high."""
    data, src = _codes(codes)
    out = ctypes.create_string_buffer(max((len(data) + 1) // 2, 1))
    lib.parity_fp4_pack(len(data), src, out)
    return out.raw[:(len(data) + 1) // 2]


def fp4_unpack(packed, n):
    """The n E2M1 codes (bytes) of packed bytes (fp4_pack's layout)."""
    data, src = _codes(packed)
    n = _lib.as_int(n, "n", 0, 2 * len(data))
    out = ctypes.create_string_buffer(max(n, 1))
    lib.parity_fp4_unpack(n, src, out)
    return out.raw[:n]


def quantize_fp8_blocks(values, rows, cols, rule="deepseek", block=(128, 128)):
    """Block-FP8 quantization of a rows x cols float32 matrix with a named rule (BLOCK_RULES):
    (codes, scales): rows * cols E4M3 codes, row-major, and the fp32 dequantization scales of
    the ceil(rows / br) x ceil(cols / bc) blocks, row-major (value = code * scale). block is
    (128, 128) for weights, (1, 128) for activations."""
    buf, n, np, _ = _floats(values, "values")
    rows, cols = _shape(n, rows, cols)
    br, bc = (_lib.as_int(b, "block", 1, 2 ** 31) for b in block)
    q = _rule(False, rule)
    grid = -(-rows // br) * -(-cols // bc)
    codes = ctypes.create_string_buffer(n)
    scales = array("f", bytes(4 * grid))
    lib.parity_fp8_quantize_blocks(q, rows, cols, buf, cols, br, bc, codes, cols,
                                   (ctypes.c_char * (4 * grid)).from_buffer(scales))
    if np:
        return (np.frombuffer(codes.raw, dtype=np.uint8).reshape(rows, cols).copy(),
                np.frombuffer(scales.tobytes(), dtype=np.float32).reshape(-(-rows // br), -(-cols // bc)))
    return codes.raw, scales


def quantize_mxfp8(values, rows, cols, rule="ocp"):
    """MXFP8 quantization (1 x 32 blocks along each row) with a named rule (MX_RULES):
    (codes, scales): rows * cols E4M3 codes and rows * ceil(cols / 32) E8M0 scale bytes
    (byte b means 2^(b - 127)), row-major."""
    buf, n, np, _ = _floats(values, "values")
    rows, cols = _shape(n, rows, cols)
    q = _rule(True, rule)
    grid = rows * -(-cols // 32)
    codes = ctypes.create_string_buffer(n)
    scales = ctypes.create_string_buffer(grid)
    lib.parity_mxfp8_quantize(q, rows, cols, buf, cols, codes, cols, scales)
    if np:
        return (np.frombuffer(codes.raw, dtype=np.uint8).reshape(rows, cols).copy(),
                np.frombuffer(scales.raw, dtype=np.uint8).reshape(rows, -(-cols // 32)).copy())
    return codes.raw, scales.raw


def _rule_of(fmt, name):
    q = ctypes.c_int()
    lib.parity_quantizer_from_name(_GEMM[fmt], name.encode(), ctypes.byref(q))
    return q.value


def _per_row(per_row):
    if per_row not in (False, True, 0, 1):
        raise ValueError("per_row must be a bool, not %r" % (per_row,))
    return 1 if per_row else 0


def quantize_nvfp4(values, rows, cols, rule="modelopt", per_row=False):
    """NVFP4 quantization (1 x 16 blocks along each row) with a named rule (NVFP4_RULES):
    (codes, block_scales, tensor_scales): rows * cols E2M1 codes (one a byte), rows *
    ceil(cols / 16) E4M3 block-scale codes, and the fp32 tensor scales s2 (one for a weight,
    per_row=False; one per row for activations, per_row=True). value = e2m1 * e4m3 * s2."""
    buf, n, np, _ = _floats(values, "values")
    rows, cols = _shape(n, rows, cols)
    q, pr = _rule_of("nvfp4", rule), _per_row(per_row)
    grid = rows * -(-cols // 16)
    codes, sf = ctypes.create_string_buffer(n), ctypes.create_string_buffer(grid)
    s2 = array("f", bytes(4 * (rows if pr else 1)))
    lib.parity_nvfp4_quantize(q, pr, rows, cols, buf, cols, codes, cols, sf,
                              (ctypes.c_char * (4 * len(s2))).from_buffer(s2))
    if np:
        return (np.frombuffer(codes.raw, dtype=np.uint8).reshape(rows, cols).copy(),
                np.frombuffer(sf.raw, dtype=np.uint8).reshape(rows, -(-cols // 16)).copy(),
                np.frombuffer(s2.tobytes(), dtype=np.float32).copy())
    return codes.raw, sf.raw, s2


def _nvfp4_out(np, codes, sf, s2, rows, cols, grid_rows):
    if np:
        return (np.frombuffer(codes.raw, dtype=np.uint8).reshape(rows, cols).copy(),
                np.frombuffer(sf.raw, dtype=np.uint8).reshape(grid_rows, -(-cols // 16)).copy(),
                np.frombuffer(s2.tobytes(), dtype=np.float32).copy())
    return codes.raw, sf.raw, s2


def quantize_nvfp4_2d(values, rows, cols, rule="te"):
    """NVFP4 in 16 x 16 tiles (TransformerEngine's weight quantization; parity_nvfp4_quantize_2d):
    (codes, tile_scales, s2): rows * cols E2M1 codes, ceil(rows / 16) * ceil(cols / 16) E4M3
    tile scales, one fp32 s2. The transpose quantized so gives the transposed codes and grid."""
    buf, n, np, _ = _floats(values, "values")
    rows, cols = _shape(n, rows, cols)
    q = _rule_of("nvfp4", rule)
    grid_rows = -(-rows // 16)
    codes = ctypes.create_string_buffer(n)
    sf = ctypes.create_string_buffer(grid_rows * -(-cols // 16))
    s2 = array("f", bytes(4))
    lib.parity_nvfp4_quantize_2d(q, rows, cols, buf, cols, codes, cols, sf,
                                 (ctypes.c_char * 4).from_buffer(s2))
    return _nvfp4_out(np, codes, sf, s2, rows, cols, grid_rows)


def quantize_nvfp4_sr(values, rows, cols, seed, stream=0, rule="te", per_row=False):
    """quantize_nvfp4 with the E2M1 rounding stochastic (parity_nvfp4_quantize_sr, TE's
    stochastic_round_fp4_e2m1): element (r, c) takes 8 bits of Philox4x32-10 keyed by seed and
    stream, counter r * cols + c; the same (seed, stream, values) give the same codes."""
    buf, n, np, _ = _floats(values, "values")
    rows, cols = _shape(n, rows, cols)
    q, pr = _rule_of("nvfp4", rule), _per_row(per_row)
    seed = _lib.as_int(seed, "seed", 0, 2 ** 64 - 1)
    stream = _lib.as_int(stream, "stream", 0, 2 ** 64 - 1)
    codes, sf = ctypes.create_string_buffer(n), ctypes.create_string_buffer(rows * -(-cols // 16))
    s2 = array("f", bytes(4 * (rows if pr else 1)))
    lib.parity_nvfp4_quantize_sr(q, pr, rows, cols, buf, cols, seed, stream, codes, cols, sf,
                                 (ctypes.c_char * (4 * len(s2))).from_buffer(s2))
    return _nvfp4_out(np, codes, sf, s2, rows, cols, rows)


def rht16(values, rows, cols, sign_seed=0):
    """The random Hadamard transform along each row in blocks of 16 (parity_rht16): each block
    times H16 diag(signs) / 4; sign_seed 0 gives TransformerEngine's fixed signs. float32 out,
    numpy (rows, cols) when the input was numpy, else array('f')."""
    buf, n, np, _ = _floats(values, "values")
    rows, cols = _shape(n, rows, cols)
    sign_seed = _lib.as_int(sign_seed, "sign_seed", 0, 2 ** 64 - 1)
    out = array("f", bytes(4 * n))
    lib.parity_rht16(rows, cols, buf, cols, sign_seed, (ctypes.c_char * (4 * n)).from_buffer(out),
                     cols)
    if np:
        return np.frombuffer(out.tobytes(), dtype=np.float32).reshape(rows, cols).copy()
    return out


def quantize_mxfp4(values, rows, cols, rule="ocp"):
    """MXFP4 quantization (1 x 32 blocks along each row) with a named rule (MXFP4_RULES):
    (codes, scales): rows * cols E2M1 codes (one a byte) and rows * ceil(cols / 32) E8M0
    scale bytes (byte b means 2^(b - 127))."""
    buf, n, np, _ = _floats(values, "values")
    rows, cols = _shape(n, rows, cols)
    q = _rule_of("mxfp4", rule)
    grid = rows * -(-cols // 32)
    codes, scales = ctypes.create_string_buffer(n), ctypes.create_string_buffer(grid)
    lib.parity_mxfp4_quantize(q, rows, cols, buf, cols, codes, cols, scales)
    if np:
        return (np.frombuffer(codes.raw, dtype=np.uint8).reshape(rows, cols).copy(),
                np.frombuffer(scales.raw, dtype=np.uint8).reshape(rows, -(-cols // 32)).copy())
    return codes.raw, scales.raw


def quantize_ternary(values, rows, cols, rule="bitnet", per_row=False):
    """Ternary quantization with a named rule (TERNARY_RULES): a weight (per_row=False: codes
    in {-1, 0, 1} and one multiplier s_w, value = code / s_w) or activations (per_row=True:
    int8 codes and one multiplier s_x per row). (codes as int8, scales as float32)."""
    buf, n, np, _ = _floats(values, "values")
    rows, cols = _shape(n, rows, cols)
    q, pr = _rule_of("ternary", rule), _per_row(per_row)
    codes = ctypes.create_string_buffer(n)
    scales = array("f", bytes(4 * (rows if pr else 1)))
    lib.parity_ternary_quantize(q, pr, rows, cols, buf, cols, codes, cols,
                                (ctypes.c_char * (4 * len(scales))).from_buffer(scales))
    if np:
        return (np.frombuffer(codes.raw, dtype=np.int8).reshape(rows, cols).copy(),
                np.frombuffer(scales.tobytes(), dtype=np.float32).copy())
    return codes.raw, scales


def _any_rule(rule):
    """A quantizer from "FORMAT:RULE" (fp8-block, mxfp8, nvfp4, mxfp4, ternary)."""
    fmt, _, name = rule.partition(":")
    gemm = {"fp8-block": 1, "mxfp8": 2}.get(fmt, _GEMM.get(fmt))
    if gemm is None or not name:
        raise ValueError("rule must be FORMAT:RULE with FORMAT fp8-block, mxfp8, nvfp4, mxfp4 or "
                         "ternary, not %r" % (rule,))
    q = ctypes.c_int()
    lib.parity_quantizer_from_name(gemm, name.encode(), ctypes.byref(q))
    return q.value


def _weight_call(fn, values, rows, cols, rule):
    buf, n, np, _ = _floats(values, "values")
    rows, cols = _shape(n, rows, cols)
    q = _any_rule(rule)
    g = lib.parity_quant_scale_count(q, rows, cols)
    codes = ctypes.create_string_buffer(n)
    scales = array("f", bytes(4 * (g + 1)))
    fn(q, rows, cols, buf, cols, codes, (ctypes.c_char * (4 * (g + 1))).from_buffer(scales))
    if np:
        return (np.frombuffer(codes.raw, dtype=np.uint8).reshape(rows, cols).copy(),
                np.frombuffer(scales.tobytes(), dtype=np.float32).copy())
    return codes.raw, scales


def quantize_weight(values, rows, cols, rule):
    """A weight as the model quantizes it with rule "FORMAT:RULE": (codes, scales), codes one a
    byte (E4M3, E2M1, or ternary as int8 bytes), scales the block scales' fp32 values followed
    by the tensor scale (NVFP4's s2, ternary's s_w; 0 for the others)."""
    return _weight_call(lib.parity_quantize_weight, values, rows, cols, rule)


def quantize_bf16_export(values, rows, cols, rule):
    """The same quantizer as an export script runs it on a bf16 cast of the values (the
    ternary rules in bf16 arithmetic, as onebitllms' quantize_to_1bit); as quantize_weight."""
    return _weight_call(lib.parity_quantize_bf16_export, values, rows, cols, rule)


def adjust_bf16(values, rows, cols, rule):
    """The second remedy (4-bit and ternary rules): (bf16 bit patterns as uint16 / array('H'), the count
    that differ from the plain cast): each the nearest bf16 value to its latent whose export
    (quantize_bf16_export) gives the training code (quantize_weight of the latents)."""
    buf, n, np, _ = _floats(values, "values")
    rows, cols = _shape(n, rows, cols)
    q = _any_rule(rule)
    out = array("H", bytes(2 * n))
    moved = ctypes.c_uint64()
    lib.parity_quant_adjust_bf16(q, rows, cols, buf, cols,
                                 (ctypes.c_char * (2 * n)).from_buffer(out), ctypes.byref(moved))
    if np:
        return np.frombuffer(out.tobytes(), dtype=np.uint16).reshape(rows, cols).copy(), moved.value
    return out, moved.value
