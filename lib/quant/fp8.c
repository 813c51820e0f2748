/*
 * The FP8 formats, fp8-block (128 x 128 blocks, fp32 scales) and MXFP8 (1 x 32 blocks, E8M0
 * scales), and their quantizer rules: the scale and element rules of the public
 * implementations, each written as the fp32 operations its source performs (IEEE, round to
 * nearest even, in the order given), so that a sampler and a learner that name the same rule
 * get the same codes and scales.
 * ../shared/notes/quant-formats.md (copied to docs/quant-formats.md) quotes each source; the
 * header (parity.h, "FP8 quantizers") names file and function per rule.
 *
 * A block's amax is max |x| over its elements (the padding of a partial block is zero, which
 * changes no maximum). Element codes are E4M3 with the clamp to +-448 every rule applies
 * before its cast (e4m3_from_f32_saturating); the MX rules also quantize to E5M2 (the
 * training recipes' gradients), with E5M2's emax and max and its saturating cast.
 */
#include <float.h>
#include <math.h>

#include "fp8.h"

#include "base/floats.h"
#include "codecs.h"

static float f32_floor_pow2(float m) { return f32_from_bits(f32_bits(m) & 0xff800000u); }

/* The parameters of a block rule's block of largest magnitude amax (fp8.h). */
fp8_block_scale fp8_block_scale_of(int rule, float amax) {
    fp8_block_scale b = {0, 0, 0};
    switch (rule) {
    case PARITY_FP8Q_DEEPSEEK: /* s = max(amax, 1e-10) / 448; q = x / s */
        b.stored = fmaxf(amax, 1e-10f) / 448.0f;
        b.divide = 1;
        break;
    case PARITY_FP8Q_SGLANG: /* s = max(amax, 1e-10) / 448; q = x * (1 / s) */
        b.stored = fmaxf(amax, 1e-10f) / 448.0f;
        b.mult = 1.0f / b.stored;
        break;
    case PARITY_FP8Q_DEEPGEMM: /* a = max(amax, 1e-4); s = a / 448; q = x * (448 / a) */
        b.stored = fmaxf(amax, 1e-4f) / 448.0f;
        b.mult = 448.0f / fmaxf(amax, 1e-4f);
        break;
    case PARITY_FP8Q_TE:
    case PARITY_FP8Q_TE_POW2: {
        /* compute_scale_from_amax: scale = 448 / amax, FLT_MAX if that overflows, 1 for a zero
         * amax; power-of-two scales floor it (the exponent bits kept); stored 1 / scale */
        float m = amax > 0.0f ? 448.0f / amax : 1.0f;
        if (isinf(m)) m = FLT_MAX;
        if (rule == PARITY_FP8Q_TE_POW2) m = f32_floor_pow2(m);
        b.mult = m;
        b.stored = 1.0f / m;
        break;
    }
    }
    return b;
}

/* E8M0 of a 1x32 block's amax for elements of `element` (PARITY_FP8_E4M3 or _E5M2): OCP's
 * floor(log2 amax) - emax (8 for E4M3, 15 for E5M2), or RCEIL (TE's float_to_e8m0 of amax *
 * max_norm_rcp, RN(1 / 448) or RN(1 / 57344), rounded up to a power of two). */
static uint8_t mx_scale_for(int rule, int element, float amax) {
    const int e5m2 = element == PARITY_FP8_E5M2;
    if (rule == PARITY_FP8Q_MX_OCP) return e8m0_floor_scale(amax, e5m2 ? 15 : 8);
    return e8m0_ceil_scale(amax * (e5m2 ? 1.0f / 57344.0f : 1.0f / 448.0f));
}

uint8_t fp8_mx_scale_of(int rule, float amax) { return mx_scale_for(rule, PARITY_FP8_E4M3, amax); }

/* The multiplier the element step applies for an E8M0 scale: 2^(127 - biased) for the OCP
 * rule (torchao's reciprocal from the bits), TE's exp2f_rcp for RCEIL (1 for byte 0). */
float fp8_mx_mult_of(int rule, uint8_t biased) {
    if (rule == PARITY_FP8Q_MX_RCEIL)
        return biased == 0 ? 1.0f : f32_from_bits((uint32_t)(254 - biased) << 23);
    return e8m0_reciprocal(biased);
}

/* One block [r0, r1) x [c0, c1) of a block rule: its codes, and its stored scale returned. */
static float quantize_block(int quantizer, const float *x, size_t x_stride, size_t r0, size_t r1,
                            size_t c0, size_t c1, uint8_t *codes, size_t codes_stride) {
    float amax = 0.0f;
    for (size_t r = r0; r < r1; r++) amax = fmaxf(amax, quant_amax(x + r * x_stride + c0, c1 - c0));
    const fp8_block_scale b = fp8_block_scale_of(quantizer, amax);
    for (size_t r = r0; r < r1; r++)
        for (size_t c = c0; c < c1; c++) {
            const float v = x[r * x_stride + c];
            const float scaled = b.divide ? v / b.stored : v * b.mult;
            codes[r * codes_stride + c] = e4m3_from_f32_saturating(scaled);
        }
    return b.stored;
}

/* Every block_rows x block_cols block of a block rule; scales row-major over the grid. */
static void quantize_grid(int quantizer, size_t rows, size_t cols, const float *x, size_t x_stride,
                          size_t block_rows, size_t block_cols, uint8_t *codes, size_t codes_stride,
                          float *scales) {
    const size_t grid_cols = (cols + block_cols - 1) / block_cols;
    for (size_t r0 = 0; r0 < rows; r0 += block_rows)
        for (size_t c0 = 0; c0 < cols; c0 += block_cols) {
            const size_t r1 = r0 + block_rows < rows ? r0 + block_rows : rows;
            const size_t c1 = c0 + block_cols < cols ? c0 + block_cols : cols;
            scales[(r0 / block_rows) * grid_cols + c0 / block_cols] =
                quantize_block(quantizer, x, x_stride, r0, r1, c0, c1, codes, codes_stride);
        }
}

/* Every 1 x 32 block of an MX rule with elements of `element` (PARITY_FP8_E4M3 or _E5M2,
 * saturating): codes, and the E8M0 scales as bytes (`bytes`) or as the fp32 powers of two they
 * mean (`pow2`), whichever is not NULL. */
static void quantize_mx(int quantizer, int element, size_t rows, size_t cols, const float *x,
                        size_t x_stride, uint8_t *codes, size_t codes_stride, uint8_t *bytes,
                        float *pow2) {
    const minifloat *f = element == PARITY_FP8_E5M2 ? &MINIFLOAT_E5M2 : &MINIFLOAT_E4M3;
    const size_t grid_cols = (cols + 31) / 32;
    for (size_t r = 0; r < rows; r++)
        for (size_t c0 = 0; c0 < cols; c0 += 32) {
            const size_t c1 = c0 + 32 < cols ? c0 + 32 : cols;
            const float *xr = x + r * x_stride;
            const uint8_t biased = mx_scale_for(quantizer, element, quant_amax(xr + c0, c1 - c0));
            const float mult = fp8_mx_mult_of(quantizer, biased);
            if (bytes) bytes[r * grid_cols + c0 / 32] = biased;
            if (pow2) pow2[r * grid_cols + c0 / 32] = e8m0_to_f32(biased);
            for (size_t c = c0; c < c1; c++)
                codes[r * codes_stride + c] = minifloat_from_f32(f, xr[c] * mult, 1);
        }
}

/* Block rules in blocks of block_rows x 128, scales the stored fp32 multipliers; MX rules in
 * 1 x 32 blocks, scales the E8M0 values as fp32 powers of two. */
static void fp8_quantize_rows(const quant_rule *r, size_t rows, size_t cols, const float *x,
                              size_t x_stride, size_t block_rows, uint8_t *codes,
                              size_t codes_stride, float *scales) {
    if (r->format->block_scale == QUANT_SCALE_E8M0)
        quantize_mx(r->id, PARITY_FP8_E4M3, rows, cols, x, x_stride, codes, codes_stride, NULL,
                    scales);
    else
        quantize_grid(r->id, rows, cols, x, x_stride, block_rows, r->format->block_cols, codes,
                      codes_stride, scales);
}

void fp8_quantize_weight(const quant_rule *r, size_t rows, size_t cols, const float *x,
                         size_t x_stride, uint8_t *codes, size_t codes_stride, float *scales,
                         float *tensor_scale) {
    fp8_quantize_rows(r, rows, cols, x, x_stride, r->format->block_rows, codes, codes_stride,
                      scales);
    *tensor_scale = 0.0f;
}

void fp8_quantize_activations(const quant_rule *r, size_t rows, size_t cols, const float *x,
                              size_t x_stride, uint8_t *codes, size_t codes_stride, float *scales,
                              float *row_scales) {
    (void)row_scales;
    fp8_quantize_rows(r, rows, cols, x, x_stride, 1, codes, codes_stride, scales);
}

void fp8_quantize_blocks(const quant_rule *r, size_t rows, size_t cols, const float *x,
                         size_t x_stride, size_t block_rows, size_t block_cols, uint8_t *codes,
                         size_t codes_stride, float *scales) {
    quantize_grid(r->id, rows, cols, x, x_stride, block_rows, block_cols, codes, codes_stride,
                  scales);
}

void mxfp8_quantize_bytes(const quant_rule *r, size_t rows, size_t cols, const float *x,
                          size_t x_stride, uint8_t *codes, size_t codes_stride, uint8_t *scales) {
    quantize_mx(r->id, PARITY_FP8_E4M3, rows, cols, x, x_stride, codes, codes_stride, scales,
                NULL);
}

void mxfp8_quantize_element(const quant_rule *r, int element, size_t rows, size_t cols,
                            const float *x, size_t x_stride, uint8_t *codes, size_t codes_stride,
                            uint8_t *scales) {
    quantize_mx(r->id, element, rows, cols, x, x_stride, codes, codes_stride, scales, NULL);
}
