/*
 * MXFP4 (parity.h, "4-bit and ternary quantizers"): E2M1 elements in 1 x 32 blocks, each with
 * an E8M0 scale, and its rules OCP (torchao), RCEIL (TE) and microxcaling. Each rule is the
 * arithmetic of its source written as IEEE fp32 operations, one rounding per operation, in the
 * source's order; the header names file and function per rule and docs/quant-formats.md
 * quotes them.
 */
#include <math.h>

#include "mxfp4.h"

#include "codecs.h"

/* Every 1 x 32 block: codes, and the scales as E8M0 bytes (`bytes`) or as the fp32 powers of
 * two they mean (`pow2`), whichever is not NULL. */
static void mxfp4_rows(int rule, size_t rows, size_t cols, const float *x, size_t x_stride,
                       uint8_t *codes, size_t codes_stride, uint8_t *bytes, float *pow2) {
    const size_t grid = (cols + 31) / 32;
    const int away = rule == PARITY_QUANT_MXFP4_MICROXCALING;
    for (size_t r = 0; r < rows; r++)
        for (size_t c0 = 0; c0 < cols; c0 += 32) {
            const size_t n = cols - c0 < 32 ? cols - c0 : 32;
            const float *xr = x + r * x_stride + c0;
            const uint8_t b = mxfp4_scale_byte(rule, quant_amax(xr, n));
            const float mult = e8m0_reciprocal(b);
            if (bytes) bytes[r * grid + c0 / 32] = b;
            if (pow2) pow2[r * grid + c0 / 32] = e8m0_to_f32(b);
            for (size_t i = 0; i < n; i++)
                codes[r * codes_stride + c0 + i] = e2m1_from_f32(xr[i] * mult, away);
        }
}

void mxfp4_quantize_weight(const quant_rule *r, size_t rows, size_t cols, const float *x,
                           size_t x_stride, uint8_t *codes, size_t codes_stride, float *scales,
                           float *tensor_scale) {
    mxfp4_rows(r->id, rows, cols, x, x_stride, codes, codes_stride, NULL, scales);
    *tensor_scale = 0.0f;
}

void mxfp4_quantize_activations(const quant_rule *r, size_t rows, size_t cols, const float *x,
                                size_t x_stride, uint8_t *codes, size_t codes_stride,
                                float *scales, float *row_scales) {
    (void)row_scales;
    mxfp4_rows(r->id, rows, cols, x, x_stride, codes, codes_stride, NULL, scales);
}

void mxfp4_quantize_bytes(const quant_rule *r, size_t rows, size_t cols, const float *x,
                          size_t x_stride, uint8_t *codes, size_t codes_stride, uint8_t *scales) {
    mxfp4_rows(r->id, rows, cols, x, x_stride, codes, codes_stride, scales, NULL);
}
