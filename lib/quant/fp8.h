/*
 * The FP8 formats' quantization (fp8.c): fp8-block and MXFP8, E4M3 codes; the entries of their
 * format rows (format.h) and the forms the public calls write.
 */
#ifndef PARITY_QUANT_FP8_H
#define PARITY_QUANT_FP8_H

#include "format.h"

/* The per-block parameters of a block rule: `stored`, the fp32 dequantization multiplier a
 * checkpoint holds (weight_scale_inv, the activation scale); `mult`, what the element step
 * applies; `divide`: the element step is x / stored instead of x * mult. */
typedef struct fp8_block_scale {
    float stored, mult;
    int divide;
} fp8_block_scale;

/* The scale steps of the rules, one block at a time, which the portable quantizers (fp8.c)
 * and the SIMD ones (fp8_avx2.c, fp8_avx512.c) share: a block rule's parameters for the
 * block's amax; an MX rule's E8M0 byte for the amax, and the multiplier its element step
 * applies for that byte. */
fp8_block_scale fp8_block_scale_of(int rule, float amax);
uint8_t fp8_mx_scale_of(int rule, float amax);
float fp8_mx_mult_of(int rule, uint8_t biased);

/* The entries (quant_fn): a weight in the format's blocks (128 x 128 or 1 x 32), activations
 * in 1 x 128 or 1 x 32 blocks; scales as fp32 values (MX: the powers of two); no tensor
 * scale (a weight's is written 0). */
quant_fn fp8_quantize_weight, fp8_quantize_activations;
/* A block rule in blocks of block_rows x block_cols: scales [ceil(rows / block_rows)]
 * [ceil(cols / block_cols)], the stored fp32 multipliers. */
void fp8_quantize_blocks(const quant_rule *r, size_t rows, size_t cols, const float *x,
                         size_t x_stride, size_t block_rows, size_t block_cols, uint8_t *codes,
                         size_t codes_stride, float *scales);
/* An MX rule: scales [rows][ceil(cols / 32)] as E8M0 bytes. */
void mxfp8_quantize_bytes(const quant_rule *r, size_t rows, size_t cols, const float *x,
                          size_t x_stride, uint8_t *codes, size_t codes_stride, uint8_t *scales);
/* An MX rule with elements of `element` (PARITY_FP8_E4M3: mxfp8_quantize_bytes; PARITY_FP8_E5M2:
 * the rule's arithmetic with E5M2's emax 15 and max 57344, its cast saturating). */
void mxfp8_quantize_element(const quant_rule *r, int element, size_t rows, size_t cols,
                            const float *x, size_t x_stride, uint8_t *codes, size_t codes_stride,
                            uint8_t *scales);

/* The SIMD variants of the activation quantizer and of the GEMM (dot.h's quant_gemm_blocked on
 * E4M3 codes): fp8_avx2.c, and fp8_avx512.c built twice, without and with VNNI; each gives the
 * portable entries' bits. FP8_SIMD: the format rows' SIMD argument (rules.c), the variants
 * this build has. */
quant_fn fp8_quantize_activations_avx2, fp8_quantize_activations_avx512,
    fp8_quantize_activations_avx512vnni;
quant_gemm_fn fp8_gemm_avx2, fp8_gemm_avx512, fp8_gemm_avx512vnni;

#if defined(PARITY_HAVE_AVX2)
#define FP8_SIMD_AVX2 [QUANT_SIMD_AVX2] = {fp8_quantize_activations_avx2, fp8_gemm_avx2},
#else
#define FP8_SIMD_AVX2
#endif
#if defined(PARITY_HAVE_AVX512)
#define FP8_SIMD_AVX512 [QUANT_SIMD_AVX512] = {fp8_quantize_activations_avx512, fp8_gemm_avx512},
#else
#define FP8_SIMD_AVX512
#endif
#if defined(PARITY_HAVE_AVX512VNNI)
#define FP8_SIMD_AVX512VNNI                                                                        \
    [QUANT_SIMD_AVX512VNNI] = {fp8_quantize_activations_avx512vnni, fp8_gemm_avx512vnni},
#else
#define FP8_SIMD_AVX512VNNI
#endif
#if defined(PARITY_HAVE_AVX2)
#define FP8_SIMD FP8_SIMD_AVX2 FP8_SIMD_AVX512 FP8_SIMD_AVX512VNNI
#else
#define FP8_SIMD {NULL, NULL}
#endif

#endif /* PARITY_QUANT_FP8_H */
