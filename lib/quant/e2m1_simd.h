/*
 * The SIMD variants of the E2M1 formats (NVFP4 and MXFP4), written once in e2m1_lanes.h and
 * compiled per ISA (e2m1_avx2.c, e2m1_avx512.c, the latter a second time with VNNI for the
 * GEMM alone): one GEMM column kernel for both formats, bitwise dot.c's quant_gemm_blocked, and
 * each format's activation quantizer, bitwise its quantize_rows. The formats' headers (nvfp4.h,
 * mxfp4.h) put them in their rows.
 */
#ifndef PARITY_QUANT_E2M1_SIMD_H
#define PARITY_QUANT_E2M1_SIMD_H

#include "format.h"

/* The E2M1 codes' k = 2 x value (|k| <= 12, an integer), by code (sign at 0x8), as the
 * bytes of a vpshufb table: signed, and offset by E2M1_K_BIAS to be unsigned (0 .. 24). */
#define E2M1_K_BIAS 12
#define E2M1_K_SIGNED 0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12
#define E2M1_K_UNSIGNED 12, 13, 14, 15, 16, 18, 20, 24, 12, 11, 10, 9, 8, 6, 4, 0

#if defined(PARITY_HAVE_AVX2)
/* e2m1_row_avx2.c: a job of one activation row, others to e2m1_gemm_avx2 */
quant_gemm_fn e2m1_gemm_avx2, e2m1_row_gemm_avx2;
quant_fn nvfp4_quantize_rows_avx2, mxfp4_quantize_rows_avx2;
#endif
#if defined(PARITY_HAVE_AVX512)
/* e2m1_row_avx512.c: a job of one activation row, others to e2m1_gemm_avx512 (the VNNI
 * variant's likewise) */
quant_gemm_fn e2m1_gemm_avx512, e2m1_row_gemm_avx512;
quant_fn nvfp4_quantize_rows_avx512, mxfp4_quantize_rows_avx512;
#endif
#if defined(PARITY_HAVE_AVX512VNNI)
quant_gemm_fn e2m1_gemm_avx512vnni, e2m1_row_gemm_avx512vnni;
#endif

/* The SIMD variants of a format row (rules.c's FORMAT), as its designated initializers: the
 * format's activation quantizers `rows_avx2` and `rows_avx512` (the VNNI variant has none of
 * its own: it falls back to the AVX-512 one) and the GEMM, for the ISAs this build has (each
 * implies the ones before it: lib/kernels/meson.build). */
#define E2M1_SIMD_AVX2(rows_avx2) [QUANT_SIMD_AVX2] = {rows_avx2, e2m1_row_gemm_avx2}
#define E2M1_SIMD_AVX512(rows_avx512) [QUANT_SIMD_AVX512] = {rows_avx512, e2m1_row_gemm_avx512}
#define E2M1_SIMD_AVX512VNNI [QUANT_SIMD_AVX512VNNI] = {NULL, e2m1_row_gemm_avx512vnni}
#if defined(PARITY_HAVE_AVX512VNNI)
#define E2M1_SIMD(rows_avx2, rows_avx512)                                                        \
    E2M1_SIMD_AVX2(rows_avx2), E2M1_SIMD_AVX512(rows_avx512), E2M1_SIMD_AVX512VNNI
#elif defined(PARITY_HAVE_AVX512)
#define E2M1_SIMD(rows_avx2, rows_avx512) E2M1_SIMD_AVX2(rows_avx2), E2M1_SIMD_AVX512(rows_avx512)
#elif defined(PARITY_HAVE_AVX2)
#define E2M1_SIMD(rows_avx2, rows_avx512) E2M1_SIMD_AVX2(rows_avx2)
#else
#define E2M1_SIMD(rows_avx2, rows_avx512) {NULL, NULL}
#endif

#endif /* PARITY_QUANT_E2M1_SIMD_H */
