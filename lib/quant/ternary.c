/*
 * Ternary weights with int8 activations (parity.h, "4-bit and ternary quantizers"): BitNet
 * b1.58's absmean weights (codes -1, 0, 1 under one tensor scale s_w) and per-token absmax
 * int8 activations (s_x per row), with the rules of BitNet, transformers' BitLinear (in bf16)
 * and onebitllms. Each rule is the arithmetic of its source written as IEEE fp32 operations
 * (bf16 where the source computes in bf16), one rounding per operation, in the source's order;
 * the header names file and function per rule and docs/quant-formats.md quotes them. Codes are
 * two's complement int8 in a uint8_t.
 */
#include <math.h>

#include "ternary.h"

#include "base/floats.h"

/* The rule's rounding to an integer: half up under onebitllms, to even under the others. */
static float round_step(int rule, float v) {
    return rule == PARITY_QUANT_TERNARY_ONEBITLLMS ? floorf(v + 0.5f) : rintf(v);
}

/* v clamped to [lo, hi] as a two's complement code. A NaN (the product of a NaN or infinite
 * input) is code 0: C leaves the conversion of a NaN undefined, and gcc's x86 code gave 0 (the
 * low byte of cvttss2si's 0x80000000) where clang's gave 0x80; the SIMD variants give 0. */
static uint8_t clamp_code(float v, float lo, float hi) {
    if (isnan(v)) return 0;
    return (uint8_t)(int8_t)(v < lo ? lo : v > hi ? hi : v);
}

/* The multiplier s_w of a weight: 1 / max(mean|W|, 1e-5), the mean from an fp64 sum in order. */
static float ternary_weight_scale(size_t rows, size_t cols, const float *x, size_t stride) {
    double sum = 0.0;
    for (size_t r = 0; r < rows; r++)
        for (size_t c = 0; c < cols; c++) sum += (double)fabsf(x[r * stride + c]);
    const float mean = (float)(sum / (double)(rows * cols));
    return 1.0f / fmaxf(mean, 1e-5f);
}

/* Per-token int8 codes of one row; returns s_x. */
static float ternary_activation_row(const quant_rule *r, const float *x, size_t cols,
                                   uint8_t *codes) {
    if (r->tensor_scale == QUANT_SCALE_BF16) {
        /* transformers' BitLinear.activation_quant in bf16: 127 / clamp(max|x|, 1e-5), x * s */
        float amax = 0.0f;
        for (size_t c = 0; c < cols; c++) amax = fmaxf(amax, fabsf(round_bf16(x[c])));
        const float s = round_bf16(127.0f / fmaxf(amax, round_bf16(1e-5f)));
        for (size_t c = 0; c < cols; c++)
            codes[c] = clamp_code(rintf(round_bf16(round_bf16(x[c]) * s)), -128.0f, 127.0f);
        return s;
    }
    const float s = 127.0f / fmaxf(quant_amax(x, cols), 1e-5f);
    for (size_t c = 0; c < cols; c++)
        codes[c] = clamp_code(round_step(r->id, x[c] * s), -128.0f, 127.0f);
    return s;
}

void ternary_quantize_weight(const quant_rule *r, size_t rows, size_t cols, const float *x,
                             size_t x_stride, uint8_t *codes, size_t codes_stride,
                             float *block_scales, float *tensor_scale) {
    (void)block_scales;
    const float s = ternary_weight_scale(rows, cols, x, x_stride);
    for (size_t i = 0; i < rows; i++)
        for (size_t c = 0; c < cols; c++)
            codes[i * codes_stride + c] =
                clamp_code(round_step(r->id, x[i * x_stride + c] * s), -1.0f, 1.0f);
    *tensor_scale = r->tensor_scale == QUANT_SCALE_BF16 ? round_bf16(s) : s;
}

void ternary_quantize_activations(const quant_rule *r, size_t rows, size_t cols, const float *x,
                                  size_t x_stride, uint8_t *codes, size_t codes_stride,
                                  float *block_scales, float *row_scales) {
    (void)block_scales;
    for (size_t i = 0; i < rows; i++)
        row_scales[i] = ternary_activation_row(r, x + i * x_stride, cols, codes + i * codes_stride);
}
