/*
 * The export check (parity.h, "Export check"; bench/parity-quant-check.c): what a training
 * quantizer makes of fp32 latents, what an export script makes of them after a bf16 cast, and
 * the bf16 inputs that make the export land on the training codes.
 *
 * The export path: the latents cast to bf16 (RNE), then the rule. The 4-bit rules run their
 * fp32 arithmetic on the cast values (ModelOpt and torchao export bf16 models: amax of the
 * bf16 values, scales in fp32). The ternary rules run in bf16 arithmetic, as onebitllms'
 * quantize_to_1bit (_weight_quant on a model loaded with torch_dtype=bfloat16): mean|W| rounded
 * to bf16, s = bf16(1 / max(mean, bf16(1e-5))), code = clamp(round(bf16(w * s)), -1, 1), the
 * rule's rounding (to even, or half up under onebitllms).
 */
#include <math.h>

#include "internal.h"

static int is_fp8(int q) { return q >= 0 && q <= PARITY_FP8Q_MX_RCEIL; }

static uint64_t grid_of(int q, size_t rows, size_t cols) {
    const size_t bc = quant_block_cols(q);
    if (!bc) return 1;
    if (q <= PARITY_FP8Q_TE_POW2) return (uint64_t)((rows + 127) / 128) * ((cols + bc - 1) / bc);
    return (uint64_t)rows * ((cols + bc - 1) / bc);
}

uint64_t parity_quant_scale_count(int quantizer, size_t rows, size_t cols) {
    return quant_format_of(quantizer) < 0 ? 0 : grid_of(quantizer, rows, cols);
}

static int check(const char *fn, int quantizer, size_t rows, size_t cols, const float *x,
                 size_t stride, const void *codes, const void *scales) {
    if (quant_format_of(quantizer) < 0)
        return set_error(PARITY_ERR_POLICY, "%s: quantizer %d is not defined", fn, quantizer);
    if (!x || !codes || !scales)
        return set_error(PARITY_ERR_INVALID_ARGUMENT, "%s: %s is NULL", fn,
                         !x ? "x" : !codes ? "codes" : "scales");
    if (!rows || !cols || stride < cols)
        return set_error(PARITY_ERR_INVALID_ARGUMENT, "%s: %zu x %zu values, stride %zu", fn, rows,
                         cols, stride);
    for (size_t r = 0; r < rows; r++)
        for (size_t c = 0; c < cols; c++)
            if (!isfinite(x[r * stride + c]))
                return set_error(PARITY_ERR_TENSOR_NONFINITE, "%s: x[%zu][%zu] is not finite", fn, r, c);
    return PARITY_OK;
}

/* The weight quantization the model makes (codes one a byte; scales the grid's fp32 values,
 * then the tensor scale). */
static void quantize_weight(int q, size_t rows, size_t cols, const float *x, size_t stride,
                            uint8_t *codes, float *scales) {
    const uint64_t g = grid_of(q, rows, cols);
    if (is_fp8(q)) {
        fp8_quantize_rows(q, rows, cols, x, stride, 128, codes, cols, scales);
        scales[g] = 0.0f;
    } else {
        quant4_weight(q, rows, cols, x, stride, codes, cols, scales, &scales[g]);
    }
}

int parity_quantize_weight(int quantizer, size_t rows, size_t cols, const float *x, size_t stride,
                           uint8_t *codes, float *scales) {
    clear_error();
    TRY(check("parity_quantize_weight", quantizer, rows, cols, x, stride, codes, scales));
    quantize_weight(quantizer, rows, cols, x, stride, codes, scales);
    return PARITY_OK;
}

/* ---- the export path ------------------------------------------------------------------------ */

static float ternary_round(int q, float v) {
    return q == PARITY_QUANT_TERNARY_ONEBITLLMS ? floorf(v + 0.5f) : rintf(v);
}

/* onebitllms' _weight_quant in bf16 on bf16 values b (already rounded): the bf16 multiplier. */
static float ternary_bf16_scale(size_t n, const float *b) {
    double sum = 0.0;
    for (size_t i = 0; i < n; i++) sum += (double)fabsf(b[i]);
    const float mean = round_bf16((float)(sum / (double)n));
    return round_bf16(1.0f / fmaxf(mean, round_bf16(1e-5f)));
}

static uint8_t ternary_bf16_code(int q, float b, float s) {
    const float v = ternary_round(q, round_bf16(b * s));
    return (uint8_t)(int8_t)(v < -1.0f ? -1.0f : v > 1.0f ? 1.0f : v);
}

/* The export path on the values b (bf16 values, held in fp32, contiguous). */
static void export_quantize(int q, size_t rows, size_t cols, const float *b, uint8_t *codes,
                            float *scales) {
    if (!quant_is_ternary(q)) {
        quantize_weight(q, rows, cols, b, cols, codes, scales);
        return;
    }
    const size_t n = rows * cols;
    const float s = ternary_bf16_scale(n, b);
    for (size_t i = 0; i < n; i++) codes[i] = ternary_bf16_code(q, b[i], s);
    scales[0] = 0.0f;
    scales[1] = s;
}

static float *bf16_copy(size_t rows, size_t cols, const float *x, size_t stride) {
    float *b = px_malloc(rows * cols * sizeof *b, "bf16 cast");
    if (b)
        for (size_t r = 0; r < rows; r++)
            for (size_t c = 0; c < cols; c++) b[r * cols + c] = round_bf16(x[r * stride + c]);
    return b;
}

int parity_quantize_bf16_export(int quantizer, size_t rows, size_t cols, const float *x,
                                size_t stride, uint8_t *codes, float *scales) {
    clear_error();
    TRY(check("parity_quantize_bf16_export", quantizer, rows, cols, x, stride, codes, scales));
    float *b = bf16_copy(rows, cols, x, stride);
    if (!b) return PARITY_ERR_OUT_OF_MEMORY;
    export_quantize(quantizer, rows, cols, b, codes, scales);
    px_free(b);
    return PARITY_OK;
}

/* ---- the second remedy: bf16 inputs whose export gives the training codes ------------------- */

/* The bf16 value k steps of one ulp from h (k < 0: towards -inf), over zero and binades. */
static uint16_t bf16_step(uint16_t h, int k) {
    /* an ordered integer: negative values mirrored below the positive ones */
    int32_t o = (h & 0x8000) ? -(int32_t)(h & 0x7fff) : (int32_t)h;
    o += k;
    return (uint16_t)(o < 0 ? 0x8000 | (uint32_t)(-o) : (uint32_t)o);
}

int parity_quant_adjust_bf16(int quantizer, size_t rows, size_t cols, const float *x,
                             size_t stride, uint16_t *out, uint64_t *n_adjusted) {
    static const char fn[] = "parity_quant_adjust_bf16";
    clear_error();
    TRY(check(fn, quantizer, rows, cols, x, stride, out, out));
    if (!quant_is_ternary(quantizer))
        return set_error(PARITY_ERR_UNSUPPORTED, "%s: the bf16 adjustment is written for the "
                         "ternary rules (the 4-bit rules' block scales move with the values they "
                         "adjust: open); write the training codes instead", fn);
    const size_t n = rows * cols;
    float *b = bf16_copy(rows, cols, x, stride);
    uint8_t *want = px_malloc(n, "training codes");
    float *scales = px_malloc(2 * sizeof *scales, "scales");
    if (!b || !want || !scales) {
        px_free(b), px_free(want), px_free(scales);
        return PARITY_ERR_OUT_OF_MEMORY;
    }
    quantize_weight(quantizer, rows, cols, x, stride, want, scales);
    uint64_t moved = 0;
    int rc = PARITY_ERR_VERIFY;
    for (int round = 0; round < 16; round++) {
        const float s = ternary_bf16_scale(n, b);
        size_t wrong = 0;
        for (size_t i = 0; i < n; i++) {
            if (ternary_bf16_code(quantizer, b[i], s) == want[i]) continue;
            wrong++;
            /* the nearest bf16 values to the latent, in order of distance, until one lands */
            const float xi = x[(i / cols) * stride + i % cols];
            const uint16_t h0 = bf16_from_f32(xi);
            int lo = 0, hi = 1;
            for (int tries = 0; tries < 512; tries++) {
                const uint16_t a = bf16_step(h0, -lo), c = bf16_step(h0, hi);
                const float va = bf16_to_f32(a), vc = bf16_to_f32(c);
                const int take_a = fabsf(va - xi) <= fabsf(vc - xi);
                const float v = take_a ? va : vc;
                if (take_a) lo++;
                else hi++;
                if (ternary_bf16_code(quantizer, v, s) == want[i]) {
                    b[i] = v;
                    moved++;
                    break;
                }
            }
        }
        if (!wrong) {
            rc = PARITY_OK;
            break;
        }
    }
    if (rc == PARITY_OK) {
        for (size_t i = 0; i < n; i++) out[i] = bf16_from_f32(b[i]);
        if (n_adjusted) {
            *n_adjusted = 0;
            for (size_t i = 0; i < n; i++)
                *n_adjusted += out[i] != bf16_from_f32(x[(i / cols) * stride + i % cols]);
        }
    } else {
        set_error(PARITY_ERR_VERIFY, "%s: no bf16 inputs found within 16 rounds whose export "
                  "gives the training codes (%llu values moved)", fn, (unsigned long long)moved);
    }
    px_free(b), px_free(want), px_free(scales);
    return rc;
}
