/*
 * The ternary format's quantization (ternary.c): weights -1, 0, 1 under one tensor scale s_w,
 * activations int8 under one scale s_x per row; the entries of its format row (format.h).
 */
#ifndef PARITY_QUANT_TERNARY_H
#define PARITY_QUANT_TERNARY_H

#include "format.h"

/* The entries (quant_fn): codes as two's complement int8; no block scales (block_scales is
 * not touched); the weight's s_w, the activations' s_x per row. */
quant_fn ternary_quantize_weight, ternary_quantize_activations;

/* The SIMD variants (ternary_avx2.c, ternary_avx512.c), each bit for bit the entries above and
 * dot.c's quant_gemm_ternary; TERNARY_SIMD, the last arguments of the format's row (rules.c),
 * names those the build has: [QUANT_SIMD_*] = {quantize_rows, gemm_columns}. The avx512vnni
 * variant quantizes as the avx512 one. */
#if defined(PARITY_HAVE_AVX2)
quant_fn ternary_quantize_rows_avx2;
quant_gemm_fn ternary_gemm_avx2;
#define TERNARY_SIMD_AVX2 {ternary_quantize_rows_avx2, ternary_gemm_avx2}
#else
#define TERNARY_SIMD_AVX2 {NULL, NULL}
#endif
#if defined(PARITY_HAVE_AVX512)
quant_fn ternary_quantize_rows_avx512;
quant_gemm_fn ternary_gemm_avx512;
#define TERNARY_SIMD_AVX512 {ternary_quantize_rows_avx512, ternary_gemm_avx512}
#else
#define TERNARY_SIMD_AVX512 {NULL, NULL}
#endif
#if defined(PARITY_HAVE_AVX512VNNI)
quant_gemm_fn ternary_gemm_avx512vnni;
#define TERNARY_SIMD_AVX512VNNI {ternary_quantize_rows_avx512, ternary_gemm_avx512vnni}
#else
#define TERNARY_SIMD_AVX512VNNI {NULL, NULL}
#endif
#define TERNARY_SIMD                                                                            \
    [QUANT_SIMD_AVX2] = TERNARY_SIMD_AVX2, [QUANT_SIMD_AVX512] = TERNARY_SIMD_AVX512,         \
    [QUANT_SIMD_AVX512VNNI] = TERNARY_SIMD_AVX512VNNI

#endif /* PARITY_QUANT_TERNARY_H */
