/*
 * libparity's public API, tier "quant": the element formats (bf16, fp16, E4M3 and E5M2, E2M1)
 * and their conversions, the quantizers (one enum, the rules by name, the quantization
 * functions), the arithmetic of the quantized GEMMs that a policy's gemm switch selects, and
 * the export check. parity.h includes this header at its end; it includes parity.h for the
 * core (status codes, PARITY_GEMM_*), so either may be included first.
 */
#ifndef PARITY_QUANT_H
#define PARITY_QUANT_H

#include <stddef.h>
#include <stdint.h>

#include "parity.h"

#ifdef __cplusplus
extern "C" {
#endif

/* A function kept for the ABI that another one replaces: gcc and clang warn where a host
 * calls it, naming the replacement. Silent in the library's own build and for a host that
 * defines PARITY_NO_DEPRECATION_WARNINGS before including libparity's headers. */
#if defined(__GNUC__) && !defined(PARITY_BUILDING_LIBRARY) && \
    !defined(PARITY_NO_DEPRECATION_WARNINGS)
#define PARITY_DEPRECATED(replacement) __attribute__((deprecated("use " replacement)))
#else
#define PARITY_DEPRECATED(replacement)
#endif

/* ---------------------------------------------------------------------------------------- */
/* bf16                                                                                     */
/* ---------------------------------------------------------------------------------------- */

/* fp32 -> bf16, round to nearest even; every NaN -> 0x7fc0 (quiet): as PyTorch's
 * c10::BFloat16. Exactly the rule `(u + 0x7fff + ((u >> 16) & 1)) >> 16` for non-NaN u. */
PARITY_API uint16_t parity_bf16_from_f32(float x);
/* bf16 -> fp32, exact. */
PARITY_API float parity_bf16_to_f32(uint16_t x);

/* ---------------------------------------------------------------------------------------- */
/* fp16 and fp8 elements                                                                    */
/* ---------------------------------------------------------------------------------------- */

/* fp32 -> IEEE binary16, round to nearest even: |x| >= 65520 overflows to infinity,
 * subnormals are kept (quantum 2^-24), every NaN -> 0x7e00 (the sign dropped, as bf16's
 * every NaN -> 0x7fc0: a NaN's sign is not the same in every kernel table). */
PARITY_API uint16_t parity_fp16_from_f32(float x);
/* fp16 -> fp32, exact (NaN payloads kept). */
PARITY_API float parity_fp16_to_f32(uint16_t x);

/* The OCP 8-bit floats: E4M3 (torch.float8_e4m3fn: bias 7, max 448 = 0x7e, no infinities,
 * NaN 0x7f / 0xff) and E5M2 (torch.float8_e5m2: bias 15, max 57344 = 0x7b, infinities 0x7c,
 * NaN 0x7f / 0xff as written here). */
enum { PARITY_FP8_E4M3 = 0, PARITY_FP8_E5M2 = 1 };

/* out[i] = x[i] in fp8, round to nearest even, subnormals kept, NaN -> sign | 0x7f. With
 * `saturate` != 0, values beyond the largest finite one (infinities included) become it,
 * signed: the clamp every production quantizer applies before its cast. With saturate = 0,
 * PyTorch's c10 conversion before 2026: E4M3 gives NaN above 464 (464 itself is a tie that
 * rounds to 448), E5M2 gives infinity from 61440 up. Integer arithmetic: the same codes on
 * every CPU. PARITY_ERR_INVALID_ARGUMENT for another format or NULL buffers with n > 0. */
PARITY_API int parity_fp8_from_f32(int format, int saturate, size_t n, const float *x,
                                   uint8_t *out);
/* out[i] = the value of codes[i], exact (NaN codes -> a quiet NaN of their sign). */
PARITY_API int parity_fp8_to_f32(int format, size_t n, const uint8_t *codes, float *out);

/* The OCP 4-bit float E2M1 (FP4 of NVFP4 and MXFP4): 1 sign, 2 exponent (bias 1) and 1
 * fraction bit, magnitudes 0, 0.5, 1, 1.5, 2, 3, 4, 6; no infinity, no NaN. A code is the low
 * four bits of a byte, the sign bit 0x8 (so -0 is 0x8). Roundings: */
enum {
    PARITY_FP4_RNE = 0,       /* to nearest, ties to the even code, saturating at +-6 (infinities
                                 too): PTX cvt.rn.satfinite.e2m1x2.f32, torchao's
                                 f32_to_f4_unpacked, ModelOpt's _cast_fp4 (searchsorted on the
                                 midpoints plus the ties 0.75, 1.75, 3.5 rounding up) */
    PARITY_FP4_HALF_AWAY = 1, /* to nearest, ties away from zero, saturating: microxcaling's
                                 round="nearest" (sign(x) floor(|x| + 0.5) on the mantissa) */
};
/* codes[i] = x[i] in E2M1 with `rounding`. A NaN is refused (E2M1 has none) with
 * PARITY_ERR_TENSOR_NONFINITE naming the element, before anything is written;
 * PARITY_ERR_INVALID_ARGUMENT for another rounding or NULL buffers with n > 0. */
PARITY_API int parity_fp4_from_f32(int rounding, size_t n, const float *x, uint8_t *codes);
/* out[i] = the value of codes[i] (exact); a code above 0xf is PARITY_ERR_INVALID_ARGUMENT,
 * naming it. */
PARITY_API int parity_fp4_to_f32(size_t n, const uint8_t *codes, float *out);
/* Two codes a byte, as ModelOpt, torchao and the MXFP4 *_blocks tensors store them: byte j
 * holds code 2j in its low nibble and code 2j + 1 in its high one (0 past an odd n);
 * packed has (n + 1) / 2 bytes. Codes above 0xf are refused as by parity_fp4_to_f32. */
PARITY_API int parity_fp4_pack(size_t n, const uint8_t *codes, uint8_t *packed);
PARITY_API int parity_fp4_unpack(size_t n, const uint8_t *packed, uint8_t *codes);

/* ---------------------------------------------------------------------------------------- */
/* Quantizers: one enum, one pair of names                                                  */
/* ---------------------------------------------------------------------------------------- */

/* Every quantizer rule of every quantized gemm format, in one enum (a policy's `quantizer`).
 * A rule's name is unique within its format, not across formats ("te" names an fp8-block, an
 * MXFP8 and an NVFP4 rule); each rule's arithmetic and sources are in "FP8 quantizers" and
 * "4-bit and ternary quantizers" below. The PARITY_FP8Q_ and PARITY_QUANT_ prefixes are the
 * names the values were published with. */
typedef enum parity_quantizer {
    /* fp8-block (PARITY_GEMM_FP8_BLOCK) */
    PARITY_FP8Q_DEEPSEEK = 0,               /* "deepseek" */
    PARITY_FP8Q_SGLANG = 1,                 /* "sglang" */
    PARITY_FP8Q_TE = 2,                     /* "te" */
    PARITY_FP8Q_DEEPGEMM = 3,               /* "deepgemm" */
    PARITY_FP8Q_TE_POW2 = 4,                /* "te-pow2" */
    /* MXFP8 (PARITY_GEMM_MXFP8) */
    PARITY_FP8Q_MX_OCP = 5,                 /* "ocp" */
    PARITY_FP8Q_MX_RCEIL = 6,               /* "te" */
    /* NVFP4 (PARITY_GEMM_NVFP4) */
    PARITY_QUANT_NVFP4_MODELOPT = 7,        /* "modelopt" */
    PARITY_QUANT_NVFP4_TE = 8,              /* "te" */
    PARITY_QUANT_NVFP4_TORCHAO = 9,         /* "torchao" */
    /* MXFP4 (PARITY_GEMM_MXFP4) */
    PARITY_QUANT_MXFP4_OCP = 10,            /* "ocp" */
    PARITY_QUANT_MXFP4_RCEIL = 11,          /* "rceil" */
    PARITY_QUANT_MXFP4_MICROXCALING = 12,   /* "microxcaling" */
    /* ternary (PARITY_GEMM_TERNARY) */
    PARITY_QUANT_TERNARY_BITNET = 13,       /* "bitnet" */
    PARITY_QUANT_TERNARY_HF_BITLINEAR = 14, /* "hf-bitlinear" */
    PARITY_QUANT_TERNARY_ONEBITLLMS = 15,   /* "onebitllms" */
    /* NVFP4, appended after the others (their values never move) */
    PARITY_QUANT_NVFP4_TE_2D = 16,          /* "te-2d" */
} parity_quantizer;

/* The name of any quantizer (a parity_quantizer value), NULL for another value. */
PARITY_API const char *parity_quantizer_name(int quantizer);
/* The quantizer named `name` for the gemm format `gemm` (PARITY_GEMM_FP8_BLOCK, _MXFP8,
 * _NVFP4, _MXFP4, _TERNARY; the names above), PARITY_ERR_POLICY for another. */
PARITY_API int parity_quantizer_from_name(uint32_t gemm, const char *name, int *out);

/* Deprecated: the fp8 rules' pair, which the pair above replaces. The quantizer of a name:
 * `mx` = 0 for the fp8-block rules ("deepseek", "sglang", "te", "deepgemm", "te-pow2"), 1 for
 * the MXFP8 ones ("ocp", "te"), as parity_quantizer_from_name(mx ? PARITY_GEMM_MXFP8 :
 * PARITY_GEMM_FP8_BLOCK, name, out). PARITY_ERR_POLICY for another. */
PARITY_DEPRECATED("parity_quantizer_from_name")
PARITY_API int parity_fp8_quantizer_from_name(int mx, const char *name, int *out);
/* Deprecated: the name of an fp8 quantizer ("deepseek", ..., "ocp", "te"), NULL for another
 * value (a 4-bit or ternary one included): parity_quantizer_name for those values. */
PARITY_DEPRECATED("parity_quantizer_name")
PARITY_API const char *parity_fp8_quantizer_name(int quantizer);

/* ---------------------------------------------------------------------------------------- */
/* FP8 quantizers: the scale and element rules of the public code, by name                  */
/* ---------------------------------------------------------------------------------------- */
/*
 * Each rule is the fp32 arithmetic its source performs, IEEE and round to nearest even, in
 * the order written; amax = max |x| over the block; the element step ends in the E4M3 cast
 * with the clamp to +-448 (parity_fp8_from_f32 saturating). Block rules (fp8-block: 128 x 128
 * weight blocks, 1 x 128 activation groups; "stored" is the fp32 dequantization multiplier a
 * checkpoint's weight_scale_inv holds, value = code * stored):
 *   PARITY_FP8Q_DEEPSEEK  "deepseek": s = max(amax, 1e-10) / 448, stored s, code = e4m3(x / s).
 *       vLLM csrc/quantization/fp8/per_token_group_quant.cu, per_token_group_quant_8bit_kernel
 *       (eps 1e-10, IEEE division); DeepSeek-V3 inference/kernel.py act_quant_kernel and
 *       weight_quant_kernel write the same formula without eps, in Triton, whose fp32 division
 *       is approximate (div.full.f32): their bits are not reproducible on a CPU, the formula is.
 *   PARITY_FP8Q_SGLANG    "sglang": s = max(amax, 1e-10) / 448, stored s, code = e4m3(x * (1 / s)).
 *       SGLang python/sglang/srt/layers/quantization/fp8_kernel.py, _per_token_group_quant_8bit
 *       (row-major Triton; its 1.0 / y_s is Triton's approximate division on the GPU).
 *   PARITY_FP8Q_TE        "te": m = 448 / amax (FLT_MAX if that overflows, 1 if amax = 0, eps 0),
 *       stored 1 / m, code = e4m3(x * m). TransformerEngine common/recipe/recipe_common.cuh,
 *       compute_scale_from_amax (__fdiv_rn), with NVTE_FP8_BLOCK_SCALING_FP32_SCALES=1.
 *   PARITY_FP8Q_DEEPGEMM  "deepgemm": a = max(amax, 1e-4), stored a / 448,
 *       code = e4m3(x * (448 / a)).
 *       DeepGEMM's reference per_token_cast_to_fp8 / per_block_cast_to_fp8 (torch, IEEE).
 *   PARITY_FP8Q_TE_POW2   "te-pow2": m as "te", then floored to a power of two (its exponent bits
 *       kept: force_pow_2_scales), stored 1 / m (exact), code = e4m3(x * m). TE's default
 *       Float8BlockScaling recipe (power_2_scale = True).
 * MXFP8 rules (1 x 32 blocks along K, E8M0 scales: byte b means 2^(b - 127)):
 *   PARITY_FP8Q_MX_OCP    "ocp": b = clamp(exponent(amax) - 8, -127, 128) + 127 (floor(log2 amax)
 *       minus E4M3's emax, from the bits), code = e4m3(x * 2^(127 - b)). OCP MX v1.0 /
 *       microsoft/microxcaling _shared_exponents(method="max"); torchao mx_tensor.py to_mx with
 *       ScaleCalculationMode.FLOOR (its default). (microxcaling rounds elements half away from
 *       zero by default; this rule rounds to nearest even, as torchao's cast does.)
 *   PARITY_FP8Q_MX_RCEIL  "te": v = amax * (1 / 448 in fp32), b = exponent(v) rounded up when v is
 *       not a power of two (TE common/util/ptx.cuh float_to_e8m0: NaN -> 0xff, Inf -> 0xfe,
 *       subnormal v up to 2^-127 -> 0), code = e4m3(x * m) with m = 1 for b = 0, else
 *       2^(127 - b) (exp2f_rcp). TransformerEngine's MXFP8 cast (and cuBLAS' RCEIL).
 */

/* Block quantization of rows x cols fp32 values (row stride x_stride) with a block rule, in
 * blocks of block_rows x block_cols (128 x 128 for weights, 1 x 128 for activations; partial
 * blocks at the edges): codes[r * codes_stride + c] E4M3, scales[ceil(rows / block_rows)]
 * [ceil(cols / block_cols)] the stored fp32 multipliers. A NaN or Inf value is refused
 * (PARITY_ERR_TENSOR_NONFINITE, naming the element), before anything is written. */
PARITY_API int parity_fp8_quantize_blocks(int quantizer, size_t rows, size_t cols,
                                          const float *x, size_t x_stride, uint32_t block_rows,
                                          uint32_t block_cols, uint8_t *codes,
                                          size_t codes_stride, float *scales);
/* MXFP8 quantization with an MX rule: 1 x 32 blocks along each row (the last one partial),
 * codes E4M3, scales[rows][ceil(cols / 32)] E8M0 bytes. Errors as above. */
PARITY_API int parity_mxfp8_quantize(int quantizer, size_t rows, size_t cols, const float *x,
                                     size_t x_stride, uint8_t *codes, size_t codes_stride,
                                     uint8_t *scales);

/* parity_mxfp8_quantize with the element format chosen (the training recipes quantize
 * gradients to E5M2): PARITY_FP8_E4M3 gives parity_mxfp8_quantize's codes and scales;
 * PARITY_FP8_E5M2 runs the same rule with E5M2's emax 15 and max 57344: "ocp" b =
 * clamp(exponent(amax) - 15, -127, 128) + 127; "te" v = amax * RN(1 / 57344) (TE
 * common/utils.cuh, Quantized_Limits<fp8e5m2>::max_norm_rcp = 1.0 / max_norm, which
 * cast/mxfp8/quantize_mxfp8.cuh passes to float_to_e8m0), rounded up as for E4M3; then
 * code = e5m2(x * m), saturating at +-57344 (TE's static_cast<OType>: __nv_fp8_e5m2 converts
 * with __NV_SATFINITE). Codes one a byte, scales[rows][ceil(cols / 32)] E8M0 bytes; errors as
 * parity_mxfp8_quantize, and PARITY_ERR_INVALID_ARGUMENT for another element. A column-wise
 * quantization (1 x 32 blocks down the columns, as a GEMM that reduces over the rows reads
 * the tensor) is this call on the transpose: transposing values is exact. */
PARITY_API int parity_mxfp8_quantize_as(int quantizer, int element, size_t rows, size_t cols,
                                        const float *x, size_t x_stride, uint8_t *codes,
                                        size_t codes_stride, uint8_t *scales);

/* ---------------------------------------------------------------------------------------- */
/* 4-bit and ternary quantizers                                                             */
/* ---------------------------------------------------------------------------------------- */
/*
 * As the FP8 rules: each is the arithmetic its source performs, IEEE fp32 (bf16 where said),
 * round to nearest even, in the order written; amax = max |x| over the block; RN() is one
 * fp32 rounding. Codes are unpacked, one per byte (E2M1 in the low nibble, sign 0x8, as
 * parity_fp4_from_f32 writes them; ternary and int8 as two's complement int8).
 *
 * NVFP4 (E2M1 in 1 x 16 blocks along K, an E4M3 block scale, an fp32 tensor scale s2; value =
 * e2m1 * e4m3 * s2). A weight's s2 is per tensor; an activation's is per token (per row):
 * a scale over a whole batch would make a token's codes depend on its neighbours in the
 * batch, which the parity contract forbids (TE's NVTE_NVFP4_PER_TOKEN mode is this one).
 * A block whose E4M3 scale is 0 decodes to 0 whatever its codes; such blocks get code 0
 * (ModelOpt's x / 0 would write +-6 there, TE's x * FLT_MAX too: the values are the same).
 *   PARITY_QUANT_NVFP4_MODELOPT "modelopt": s2 = amax_tensor / 2688; sf = e4m3(amax16 /
 *       RN(6 * s2)), 1 where amax16 / RN(6 * s2) is 0; code = e2m1(x / RN(sf * s2)). NVIDIA
 *       Model-Optimizer nvfp4_tensor.py, NVFP4QTensor (get_weights_scaling_factor_2,
 *       get_weights_scaling_factor, _cast_fp4): the rule of the NVFP4 checkpoints people
 *       download. An all-zero tensor: s2 = 0, every sf 1 and every code 0 (ModelOpt divides
 *       0 by 0 there).
 *   PARITY_QUANT_NVFP4_TE "te": S = min(2688 / amax_tensor, FLT_MAX), 1 where amax is 0 or
 *       S is 0; s2 = RN(1 / S); sf = e4m3(amax16 * RN(S * RN(1 / 6))); m = min(RN(1 /
 *       RN(sf * RN(1 / S))), FLT_MAX); code = e2m1(x * m). TransformerEngine
 *       cast/nvfp4/core_nvfp4.cuh (compute_global_encode_scaling_factor_FP4,
 *       compute_decoding_scaling_factor, compute_scaling_coefficient<float>): the form its
 *       comment calls an exact emulation. 1 x 16 blocks (TE's weights default to 16 x 16;
 *       NVTE_NVFP4_DISABLE_2D_QUANTIZATION=1 gives these).
 *   PARITY_QUANT_NVFP4_TE_2D "te-2d": TE's default weight quantization (NVFP4BlockScaling,
 *       common/recipe/__init__.py: fp4_2d_quantization for weights): a weight's amax16 is the
 *       max |x| over its 16 x 16 tile (rows 16i..16i+15, columns 16j..16j+15; partial tiles at
 *       the edges), then "te"'s arithmetic to the letter (cast/nvfp4/quantize_transpose_nvfp4.cuh,
 *       quantize_transpose_nvfp4_2D_kernel: block_amax_matrix, compute_decoding_scaling_factor,
 *       S_enc_rowwise = S_enc_colwise from the one tensor amax; pytorch/custom_recipes/
 *       reference_nvfp4.py, _quantize_blockwise_reference with quant_tile_shape (16, 16)). The
 *       scale grid stays [rows][ceil(cols / 16)], each tile's scale in its 16 rows (as TE's
 *       reference repeats it), so the GEMM is NVFP4's; W and its transpose get the same codes
 *       and scales, transposed. Activations as "te" (1 x 16, s2 per row). The bf16 adjustment
 *       (parity_quant_adjust_bf16) is written for 1 x 16 blocks: PARITY_ERR_UNSUPPORTED here.
 *   PARITY_QUANT_NVFP4_TORCHAO "torchao": s2 = amax_tensor / 2688; sf = e4m3(clamp(RN(amax16 /
 *       6) / s2, 2^-6, 448)); code = e2m1(clamp(x / RN(s2 * sf), -6, 6)). torchao
 *       prototype/mx_formats/nvfp4_tensor.py nvfp4_quantize (no subnormal block scales).
 *       An all-zero tensor as "modelopt".
 *   Not offered: vLLM's, FlashInfer's and TRT-LLM's activation quantizer (nvfp4_utils.cuh,
 *   cvt_warp_fp16_to_fp4) computes its scales with rcp.approx.ftz.f32, whose bits no CPU
 *   reproduces from a formula.
 *
 * MXFP4 (E2M1 in 1 x 32 blocks along K with E8M0 scales, byte b meaning 2^(b - 127); value =
 * e2m1 * 2^(b - 127)); elements are e2m1(x * 2^(127 - b)), saturating at +-6:
 *   PARITY_QUANT_MXFP4_OCP "ocp": b = clamp(exponent(amax) - 2, -127, 128) + 127 (floor(log2
 *       amax) minus E2M1's emax 2, from the bits), elements to nearest even. torchao to_mx
 *       with ScaleCalculationMode.FLOOR (its default), f32_to_f4_unpacked.
 *   PARITY_QUANT_MXFP4_RCEIL "rceil": v = amax * RN(1 / 6), b = exponent(v) rounded up when v
 *       is not a power of two (the subnormal rule of the MXFP8 "te" rule), elements to nearest
 *       even. torchao to_mx with ScaleCalculationMode.RCEIL (cvt.rp.satfinite.ue8m0x2.f32).
 *   PARITY_QUANT_MXFP4_MICROXCALING "microxcaling": b as "ocp", elements rounded half away from
 *       zero: microsoft/microxcaling _quantize_mx with its default round="nearest".
 *
 * Ternary (BitNet b1.58: weights w = code / s_w with code in {-1, 0, 1} and one multiplier
 * s_w per tensor; activations int8 per token, x = code / s_x). mean|W| = RN(S / n) with S the
 * fp64 sum of the |w| in row-major order (numpy.cumsum's last element), then rounded to fp32.
 *   PARITY_QUANT_TERNARY_BITNET "bitnet": s_w = RN(1 / max(mean|W|, 1e-5)); code =
 *       clamp(rne(RN(w * s_w)), -1, 1); s_x = RN(127 / max(amax_row, 1e-5)); code =
 *       clamp(rne(RN(x * s_x)), -128, 127). 1bitLLM utils_quant.py, the lineage llama.cpp and
 *       microsoft/BitNet convert from; transformers' AutoBitLinear online WeightQuant.
 *   PARITY_QUANT_TERNARY_HF_BITLINEAR "hf-bitlinear": transformers integrations/bitnet.py
 *       BitLinear: weights as "bitnet" with s_w stored in bf16 (its weight_scale buffer is in
 *       the model dtype); the activation quantizer in bf16 arithmetic: c = max(amax_row,
 *       bf16(1e-5)), s_x = bf16(RN(127 / c)), code = clamp(rne(bf16(x * s_x)), -128, 127).
 *   PARITY_QUANT_TERNARY_ONEBITLLMS "onebitllms": as "bitnet" with every rounding half up,
 *       floor(RN(RN(v * s) + 0.5)): tiiuae/onebitllms' training kernels (weight_quant.py,
 *       activation_quant.py, tl.floor(x * scale + 0.5), read unfused).
 */

/* NVFP4 quantization of rows x cols fp32 values with an NVFP4 rule: codes[r * codes_stride
 * + c] E2M1, block_scales[rows][ceil(cols / 16)] E4M3 codes, and the tensor scales s2: one
 * (tensor_scales[0]) when per_row is 0 (a weight), one per row when 1 (activations); a
 * "te-2d" weight (per_row 0) in its 16 x 16 tiles, each tile's scale in each of its rows. A
 * NaN or Inf value is refused (PARITY_ERR_TENSOR_NONFINITE, naming the element), before
 * anything is written. */
PARITY_API int parity_nvfp4_quantize(int quantizer, int per_row, size_t rows, size_t cols,
                                     const float *x, size_t x_stride, uint8_t *codes,
                                     size_t codes_stride, uint8_t *block_scales,
                                     float *tensor_scales);

/* ---- NVFP4 training (TransformerEngine's NVFP4BlockScaling recipe) -------------------------
 * The quantizers of TE's NVFP4 training recipe beyond the forward's: weights in 16 x 16 tiles,
 * gradients rounded stochastically, the random Hadamard transform on the weight gradient's
 * inputs. Each checks as parity_nvfp4_quantize (a NaN or Inf value is
 * PARITY_ERR_TENSOR_NONFINITE naming it; NULL buffers, an empty shape or a stride below cols
 * PARITY_ERR_INVALID_ARGUMENT; a quantizer not of NVFP4 PARITY_ERR_POLICY), before anything is
 * written. The quantizer gives the scale arithmetic: TE's is "te" (or "te-2d", the same). */

/* NVFP4 with 16x16 blocks (TE's weight quantization): one E4M3 scale per 16x16 tile and one
 * fp32 global per tensor; Wᵀ quantized this way has exactly the transposed codes and scale
 * grid. amax16 is the tile's max |x| (partial tiles at the edges), then the rule's block
 * arithmetic (under "te": "te-2d" above); sf[ceil(rows / 16)][ceil(cols / 16)] E4M3 bytes,
 * row-major; s2[0] the tensor scale. */
PARITY_API int parity_nvfp4_quantize_2d(int quantizer, size_t rows, size_t cols, const float *x,
                                        size_t ldx, uint8_t *codes, size_t ldc, uint8_t *sf,
                                        float *s2);
/* parity_nvfp4_quantize's layout and scale arithmetic, with the E2M1 rounding stochastic: the
 * random bits of element (r, c) from a counter-based generator keyed by (seed, stream) and
 * counter i = r * cols + c, so the same (seed, stream, tensor) give the same codes on every CPU
 * path and thread count.
 * The rounding is TE's (common/util/ptx.cuh, stochastic_round_fp4_e2m1, the form of its
 * cvt.rs.satfinite.e2m1x4.f32, which takes 8 random bits an element): v the value the rule's
 * round-to-nearest step would cast (under "te" x * m), a = |v|, u = bits / 256 (8 bits), step
 * = 2 if a >= 4, 1 if a >= 2, else 0.5; t = a + u * step (the product exact, one rounding);
 * q = min(floor(t / step_t) * step_t, 6) with step_t the step of t; the code is q with v's
 * sign. Blocks whose E4M3 scale is 0 get code 0 as in parity_nvfp4_quantize.
 * The generator is TE's: Philox4x32-10 (common/util/curanddx.hpp, philox4x32_native_state with
 * NVTE_BUILD_NUM_PHILOX_ROUNDS' default 10, common/CMakeLists.txt), key (seed low 32 bits,
 * seed high 32 bits), counter words (i / 16 low, i / 16 high, stream low, stream high): TE's
 * init(seed, subsequence = stream, offset = i / 16) then generate4(); element i takes byte
 * i % 4 (bits 8k..8k+7 for k = i % 4, as TE's software path passes rbits >> 8k to the k-th of
 * four elements: util/ptx_arch_spec.cuh) of output word (i % 16) / 4 (TE's get_rbits in
 * cast/nvfp4/core_nvfp4.cuh uses the words in order). TE's own subsequence is its CUDA
 * thread's index (quantize_transpose_nvfp4.cuh, rng_sequence), which no CPU layout has; the
 * element index replaces it, so the bits follow the element, not the schedule. E[q] is v up
 * to the 8 bits' resolution, |E[q] - v| < step / 256, for |v| <= 6 (beyond, where a block
 * scale rounded down, q saturates at 6 as the round-to-nearest cast does). */
PARITY_API int parity_nvfp4_quantize_sr(int quantizer, int per_row, size_t rows, size_t cols,
                                        const float *x, size_t ldx, uint64_t seed,
                                        uint64_t stream, uint8_t *codes, size_t ldc,
                                        uint8_t *sf, float *s2);
/* The random Hadamard transform along each row, in blocks of 16 columns: each 16-block v times
 * H16 diag(signs) / 4, out_j = sum_i H16[j][i] s_i v_i / 4, cols a multiple of 16. H16 is the
 * Sylvester Hadamard matrix (TE pytorch/tensor/nvfp4_tensor.py get_hadamard_matrix, scaled by
 * 1 / sqrt(16) there); TE applies it, signs first, to the columnwise (transposed) operands of
 * the weight-gradient GEMM, along its reduction dimension (get_rht_matrix = diag(signs) @ H,
 * used as x @ rht_matrix: reference_nvfp4.py _apply_rht), so pass Xᵀ and dYᵀ.
 * The signs: sign_seed 0 gives TE's, which it hard-codes rather than derives (nvfp4_tensor.py
 * get_wgrad_sign_vector: 1 1 1 -1 1 -1 -1 -1 -1 -1 -1 1 -1 1 -1 -1); another sign_seed gives
 * s_i = -1 where bit i of Philox4x32-10's first output word for key sign_seed and counter 0
 * is set (this library's choice: TE has no seeded signs).
 * Arithmetic: s_i v_i (exact), then the fast Walsh-Hadamard butterflies in fp32, pairs (j, j +
 * h) for h = 1, 2, 4, 8 becoming (a + b, a - b), each rounded once, then times 0.25 (exact
 * unless the result is subnormal). The output is exact whenever the partial sums are (e.g.
 * values that are integers times one power of two, each below 2^20 of it); otherwise four
 * roundings of partial sums bounded by sum |v_i| give |out_j - exact_j| <= 2^-22 sum_i |v_i|
 * / 4 (to first order). TE computes it on tensor cores from bf16 (hadamard_transform.cu,
 * mma_m16_n16_k16_b16_b16_b16_noacc: an accumulation order the hardware fixes and a bf16
 * output); round the output to bf16 for that dtype. out may be x (then ldo = ldx).
 * PARITY_ERR_INVALID_ARGUMENT for cols not a multiple of 16, NULL buffers, an empty shape or
 * a stride below cols; PARITY_ERR_TENSOR_NONFINITE for a NaN or Inf. */
PARITY_API int parity_rht16(size_t rows, size_t cols, const float *x, size_t ldx,
                            uint64_t sign_seed, float *out, size_t ldo);

/* MXFP4 quantization with an MXFP4 rule: codes E2M1, scales[rows][ceil(cols / 32)] E8M0
 * bytes. Errors as above. */
PARITY_API int parity_mxfp4_quantize(int quantizer, size_t rows, size_t cols, const float *x,
                                     size_t x_stride, uint8_t *codes, size_t codes_stride,
                                     uint8_t *scales);
/* Ternary quantization of a weight (per_row 0: codes in {-1, 0, 1}, one multiplier s_w in
 * scales[0], as fp32, rounded to bf16 first under "hf-bitlinear") or of activations (per_row
 * 1: int8 codes, one multiplier s_x per row). Errors as above. */
PARITY_API int parity_ternary_quantize(int quantizer, int per_row, size_t rows, size_t cols,
                                       const float *x, size_t x_stride, int8_t *codes,
                                       size_t codes_stride, float *scales);

/* ---------------------------------------------------------------------------------------- */
/* Quantized GEMMs: the policy's gemm formats                                               */
/* ---------------------------------------------------------------------------------------- */
/*
 * A policy whose gemm switch (parity.h, "Precision policy") is not PARITY_GEMM_BF16 runs the
 * decoder layers' linear layers (q, k, v, o, gate, up, down; the embedding, the norms and
 * lm_head stay bf16) in that format, with the policy's quantizer. Requires compute bf16.
 *
 * fp8-block and MXFP8: the weights are quantized once, with the policy's quantizer (FP8
 * quantizers above), from the checkpoint's own values (fp32 masters where it has them, never
 * through a bf16 cast), and each GEMM input is quantized per token with the same rule,
 * dynamically; the output is fp32 and the forward rounds it to bf16 as every GEMM output.
 * y[m][n] = sum over K blocks kb, ascending, in fp32: acc = acc + (d * a_s) * w_s, where d =
 * the block's dot product of the E4M3 codes' values, exact (E4M3 x E4M3 products are integer
 * multiples of 2^-18: the library sums them exactly, in any order), then rounded once to
 * fp32; a_s, w_s the activation's and the weight's block scales (DeepSeek-V3
 * fp8_gemm_kernel's `accumulator += dot * a_s * b_s`, left to right).
 *
 * The 4-bit and ternary formats (4-bit and ternary quantizers above): codes of both operands
 * exact integers times a power of two, so every block dot is exact in fp32. NVFP4: acc = acc
 * + (d * sfa) * sfw over the 1 x 16 blocks, ascending (each term exact: at most 22
 * significant bits), y = RN(acc * RN(s2a * s2w)) (the GEMM's alpha, as vLLM's input_scale *
 * weight_scale_2). MXFP4: as MXFP8 over 1 x 32 blocks. Ternary: D = the integer dot of the
 * int8 and ternary codes (exact), y = RN(D / RN(s_w * s_x)) (BitLinear's y / (weight_scale *
 * input_scale)); under "hf-bitlinear" every step of it in bf16: bf16(bf16(D) / bf16(s_w *
 * s_x)), with the division done in fp32 and rounded.
 *
 * The training GEMM (parity_quant_gemm, parity_ops.h) computes this arithmetic on operands the
 * caller quantized (a training recipe's backward: MXFP8 with E4M3 or E5M2 elements, NVFP4 with
 * 1 x 16 or 16 x 16 scale grids), every element pair's block dot exact.
 */

/* ---------------------------------------------------------------------------------------- */
/* Export check (bench/parity-quant-check)                                                   */
/* ---------------------------------------------------------------------------------------- */
/*
 * A weight's codes and scales as the model quantizes it with any quantizer (PARITY_FP8Q_*,
 * PARITY_QUANT_*): codes one a byte, row-major; scales the parity_quant_scale_count() block
 * scales as fp32 values (the stored multipliers of fp8-block, E8M0 and E4M3 scales as their
 * values) followed by one tensor scale (NVFP4's s2, ternary's s_w; 0 for the others). A NaN
 * or Inf value is PARITY_ERR_TENSOR_NONFINITE.
 */
PARITY_API uint64_t parity_quant_scale_count(int quantizer, size_t rows, size_t cols);
PARITY_API int parity_quantize_weight(int quantizer, size_t rows, size_t cols, const float *x,
                                      size_t x_stride, uint8_t *codes, float *scales);
/* The same quantizer as an export script runs it on a bf16 cast of x: the 4-bit and fp8
 * rules in their fp32 arithmetic on the cast values (ModelOpt and torchao exports read bf16
 * models); the ternary rules in bf16 arithmetic, as onebitllms' quantize_to_1bit
 * (_weight_quant on a bfloat16 model): mean|W| rounded to bf16, s = bf16(1 / max(mean,
 * bf16(1e-5))), code = clamp(round(bf16(w * s)), -1, 1) with the rule's rounding. */
PARITY_API int parity_quantize_bf16_export(int quantizer, size_t rows, size_t cols,
                                           const float *x, size_t x_stride, uint8_t *codes,
                                           float *scales);
/* The second remedy: out[rows * cols] bf16 values, each the nearest bf16 value to its latent
 * x whose export (parity_quantize_bf16_export) gives the training code
 * (parity_quantize_weight of x); *n_adjusted (if not NULL) counts the values that differ from
 * the plain bf16 cast. Ternary rules: iterated until the export's bf16 multiplier is stable
 * (16 rounds at most, else PARITY_ERR_VERIFY); the multiplier itself stays the export's.
 * NVFP4 and MXFP4 rules, block by block: the element with the largest latent first takes the
 * nearest bf16 value that gives its code and the training block scale (the others held at or
 * below it), then each other element the nearest one at or below it that gives its code; the
 * export then has the training codes and block scales (NVFP4's s2, the bf16 amax / 2688,
 * excepted: no bf16 value is the fp32 amax unless it is one already); a block where no bf16
 * value within 1024 steps works is PARITY_ERR_VERIFY. The fp8 rules are
 * PARITY_ERR_UNSUPPORTED. */
PARITY_API int parity_quant_adjust_bf16(int quantizer, size_t rows, size_t cols, const float *x,
                                        size_t x_stride, uint16_t *out, uint64_t *n_adjusted);

/* A model's quantized weights, by checkpoint name: what the check compares and substitutes.
 * Both take a decoder layer's linear weight (parity_weight_info.quantized, parity.h; the
 * shape and the sizes come from there), codes and scales laid out as parity_quantize_weight's
 * for a quantizer of the format: n_codes = rows x cols, n_scales = parity_quant_scale_count()
 * + 1 (the block scales, then the tensor scale). PARITY_ERR_INVALID_ARGUMENT for a NULL
 * pointer, another count (the message says the right one) or a tensor that is not such a
 * weight; PARITY_ERR_TENSOR_UNEXPECTED for a name the model has no tensor of.
 *
 * parity_model_weight_codes: the codes and scales a policy with `quantizer`'s gemm format and
 * rule reads for the weight: the codes it holds of that format (shipped by its checkpoint or a
 * block-FP8 update, or set by parity_model_set_quantized), else `quantizer` applied to the
 * values parity_model_weight_values returns, bit for bit parity_quantize_weight's (given also
 * for a weight the checkpoint keeps in bf16). Ternary codes hold no block scale: that slot is
 * written 0. PARITY_ERR_POLICY for a value that is not a quantizer. Reads as
 * parity_model_weight_values (PARITY_ERR_BUSY during an update; any thread).
 */
PARITY_API int parity_model_weight_codes(const parity_model *model, const char *name,
                                         int quantizer, uint8_t *codes, uint64_t n_codes,
                                         float *scales, uint64_t n_scales);
/* parity_model_set_quantized: the weight holds these codes and scales of the gemm format
 * `gemm` (PARITY_GEMM_FP8_BLOCK .. PARITY_GEMM_TERNARY) from now on, as if its checkpoint had
 * shipped them: every policy of that format reads them (its rule then quantizes the
 * activations only), parity_model_save_as in the format's layout writes them (MXFP8 has no
 * layout: the fp8-block layout quantizes the values as ever), a manifest lists
 * them as shipped codes ("quantizer": null). Codes it held before (shipped of any format, or
 * set) are replaced; policies of another format quantize its values, which stay as they are
 * (parity_model_weight_values, the bf16 policies). scale_dtype is how a checkpoint stores the
 * scales where a format lets it choose: PARITY_DTYPE_F32, or PARITY_DTYPE_BF16 for fp8-block's
 * block scales and ternary's s_w (each must then be a bf16 value); the other formats' scales
 * have their own dtype: pass PARITY_DTYPE_F32. Everything is checked before anything changes:
 * PARITY_ERR_INVALID_ARGUMENT, naming the element, for a code that is none of the format's
 * (an E4M3 NaN, E2M1 above 0xf, ternary other than -1, 0, 1) and for a gemm or scale_dtype
 * outside those; PARITY_ERR_SCALE_VALUE, naming it, for a scale the format cannot hold: fp8-
 * block and ternary scales not finite and positive, NVFP4 block scales not an E4M3 value >= 0
 * or an s2 not finite and >= 0, MXFP8 and MXFP4 scales not a power of two in E8M0's range
 * [2^-127, 2^127]; the slots a format does not read (a ternary block scale, the tensor scale
 * of the fp8 and MXFP4 formats) are not checked. A weight the checkpoint keeps in bf16 is
 * PARITY_ERR_INVALID_ARGUMENT (no policy reads codes for it). Like parity_model_update it runs
 * only while no other call uses the model (PARITY_ERR_BUSY otherwise) and bumps the model's
 * version: a sampler's sequences cached before it are stale.
 */
PARITY_API int parity_model_set_quantized(parity_model *model, const char *name, uint32_t gemm,
                                          const uint8_t *codes, uint64_t n_codes,
                                          const float *scales, uint64_t n_scales,
                                          uint32_t scale_dtype);

#ifdef __cplusplus
}
#endif

#endif /* PARITY_QUANT_H */
