/*
 * MXFP4's quantization (mxfp4.c): E2M1 codes, E8M0 scales per 1 x 32 block; the entries of its
 * format row (format.h) and the form the public call writes.
 */
#ifndef PARITY_QUANT_MXFP4_H
#define PARITY_QUANT_MXFP4_H

#include "codecs.h"
#include "e2m1_simd.h"
#include "format.h"

/* The entries (quant_fn): scales as the fp32 powers of two; no tensor scale (a weight's is
 * written 0, the rows' are left alone). */
quant_fn mxfp4_quantize_weight, mxfp4_quantize_activations;
/* The public call's form: scales [rows][ceil(cols / 32)] as E8M0 bytes. */
void mxfp4_quantize_bytes(const quant_rule *r, size_t rows, size_t cols, const float *x,
                          size_t x_stride, uint8_t *codes, size_t codes_stride, uint8_t *scales);

/* ---- the rules' arithmetic, inline for mxfp4.c and the SIMD variants (e2m1_lanes.h) ----- */

/* The E8M0 scale of a block: OCP's (and microxcaling's) floor(log2 amax) - emax(E2M1) = 2, or
 * RCEIL's amax / 6 rounded up to a power of two. */
static inline uint8_t mxfp4_scale_byte(int rule, float amax) {
    if (rule != PARITY_QUANT_MXFP4_RCEIL) return e8m0_floor_scale(amax, 2);
    return e8m0_ceil_scale(amax * (1.0f / 6.0f));
}

/* The SIMD variants of the format row (rules.c): e2m1_simd.h's. */
#define MXFP4_SIMD E2M1_SIMD(mxfp4_quantize_rows_avx2, mxfp4_quantize_rows_avx512)

#endif /* PARITY_QUANT_MXFP4_H */
