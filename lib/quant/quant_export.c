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
#include <string.h>

#include "base/alloc.h"
#include "base/errors.h"
#include "base/floats.h"
#include "nvfp4.h"
#include "rules.h"

uint64_t parity_quant_scale_count(int quantizer, size_t rows, size_t cols) {
    const quant_rule *r = quant_rule_of(quantizer);
    return r ? quant_scale_count(r->format, rows, cols) : 0;
}

static int check(const char *fn, int quantizer, size_t rows, size_t cols, const float *x,
                 size_t stride, const void *codes, const void *scales) {
    if (!quant_rule_of(quantizer))
        return set_error(PARITY_ERR_POLICY, "%s: quantizer %d is not defined", fn, quantizer);
    return quant_check_values(fn, rows, cols, x, stride, codes, cols, scales, scales, "scales");
}

/* The weight quantization the model makes (codes one a byte; scales the grid's fp32 values,
 * then the tensor scale). */
static void quantize_weight(int q, size_t rows, size_t cols, const float *x, size_t stride,
                            uint8_t *codes, float *scales) {
    const quant_rule *r = quant_rule_of(q);
    const uint64_t g = quant_scale_count(r->format, rows, cols);
    r->format->quantize_weight(r, rows, cols, x, stride, codes, cols, scales, &scales[g]);
}

int parity_quantize_weight(int quantizer, size_t rows, size_t cols, const float *x, size_t stride,
                           uint8_t *codes, float *scales) {
    clear_error();
    TRY(check("parity_quantize_weight", quantizer, rows, cols, x, stride, codes, scales));
    quantize_weight(quantizer, rows, cols, x, stride, codes, scales);
    return PARITY_OK;
}

/* ---- the export path ------------------------------------------------------------------------ */

/* Whether q is a ternary rule (the export runs those in bf16 arithmetic). */
static int is_ternary(int q) { return quant_rule_of(q)->format->element == QUANT_ELEMENT_TERNARY; }

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
    if (!is_ternary(q)) {
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

/* The bf16 values nearest xi (k = 0, 1, ...: in order of distance, ties to the lower one), from
 * h0 = RN(xi) outwards; *state holds how far each side has gone. */
typedef struct nearest {
    uint16_t h0;
    int lo, hi;
} nearest;

static float nearest_next(nearest *s, float xi) {
    const uint16_t a = bf16_step(s->h0, -s->lo), c = bf16_step(s->h0, s->hi);
    const float va = bf16_to_f32(a), vc = bf16_to_f32(c);
    const int take_a = fabsf(va - xi) <= fabsf(vc - xi);
    if (take_a) s->lo++;
    else s->hi++;
    return take_a ? va : vc;
}

/* One block of n <= 32 values of a 4-bit rule as its weight quantization quantizes it (NVFP4:
 * under the s2 of a weight whose amax is tmax): codes written, the block scale's value
 * returned. */
static float quantize_block(int q, float tmax, const float *x, size_t n, uint8_t *codes) {
    const quant_rule *r = quant_rule_of(q);
    if (r->format->has_tensor_scale) return nvfp4_quantize_block(r, tmax, x, n, codes);
    float scale, tensor_scale;
    r->format->quantize_weight(r, 1, n, x, n, codes, n, &scale, &tensor_scale);
    return scale;
}

/* One block of a 4-bit rule: bf16 values b[0..n) near the latents xb whose export has the
 * block scale ws and the codes want. The export's block scale follows the block's amax (and,
 * NVFP4, the tensor's amax `tmax`, held fixed: no value may pass it), so first the element
 * with the largest latent takes the nearest bf16 value that gives both its code and the
 * scale, with the others held at or below it; then each other element whose code differs
 * takes the nearest bf16 value at or below that amax that gives its code. 0 when found. */
static int adjust_block(int q, float tmax, const float *xb, float *b, size_t n, const uint8_t *want,
                        float ws) {
    uint8_t codes[32];
    float t[32];
    float sf = quantize_block(q, tmax, b, n, codes);
    if (f32_bits(sf) == f32_bits(ws) && !memcmp(codes, want, n)) return 0;
    size_t j = 0;
    for (size_t i = 1; i < n; i++)
        if (fabsf(xb[i]) > fabsf(xb[j])) j = i;
    nearest near = {bf16_from_f32(xb[j]), 0, 1};
    int found = 0;
    for (int tries = 0; tries < 1024 && !found; tries++) {
        const float v = nearest_next(&near, xb[j]);
        if (quant_rule_of(q)->format->has_tensor_scale && fabsf(v) > tmax) continue;
        for (size_t i = 0; i < n; i++)
            t[i] = fabsf(b[i]) > fabsf(v) ? copysignf(fabsf(v), b[i]) : b[i];
        t[j] = v;
        sf = quantize_block(q, tmax, t, n, codes);
        found = f32_bits(sf) == f32_bits(ws) && codes[j] == want[j];
    }
    if (!found) return 1;
    const float cap = fabsf(t[j]);
    for (size_t i = 0; i < n; i++) {
        if (codes[i] == want[i]) continue;
        nearest ni = {bf16_from_f32(xb[i]), 0, 1};
        int ok = 0;
        for (int tries = 0; tries < 1024 && !ok; tries++) {
            const float v = nearest_next(&ni, xb[i]);
            if (fabsf(v) > cap) continue;
            const float keep = t[i];
            t[i] = v;
            sf = quantize_block(q, tmax, t, n, codes);
            ok = f32_bits(sf) == f32_bits(ws) && codes[i] == want[i];
            if (!ok) t[i] = keep;
        }
        if (!ok) return 1;
    }
    sf = quantize_block(q, tmax, t, n, codes);
    if (f32_bits(sf) != f32_bits(ws) || memcmp(codes, want, n)) return 1;
    memcpy(b, t, n * sizeof *b);
    return 0;
}

/* The second remedy for the NVFP4 and MXFP4 rules: every block adjusted (adjust_block); the
 * codes and block scales of the export then equal the training ones, NVFP4's tensor scale s2
 * (the bf16 amax / 2688) excepted. */
static int adjust_4bit(int q, size_t rows, size_t cols, const float *x, size_t stride, float *b,
                       const uint8_t *want, const float *want_scales, size_t *failed) {
    const size_t bc = quant_rule_of(q)->format->block_cols, gcols = (cols + bc - 1) / bc;
    float tmax = 0.0f;
    for (size_t i = 0; i < rows * cols; i++) tmax = fmaxf(tmax, fabsf(b[i]));
    *failed = 0;
    for (size_t r = 0; r < rows; r++)
        for (size_t g = 0; g < gcols; g++) {
            const size_t c0 = g * bc, n = cols - c0 < bc ? cols - c0 : bc;
            *failed += (size_t)adjust_block(q, tmax, x + r * stride + c0, b + r * cols + c0, n,
                                            want + r * cols + c0, want_scales[r * gcols + g]);
        }
    return *failed ? PARITY_ERR_VERIFY : PARITY_OK;
}

int parity_quant_adjust_bf16(int quantizer, size_t rows, size_t cols, const float *x,
                             size_t stride, uint16_t *out, uint64_t *n_adjusted) {
    static const char fn[] = "parity_quant_adjust_bf16";
    clear_error();
    TRY(check(fn, quantizer, rows, cols, x, stride, out, out));
    if (quant_rule_of(quantizer)->format->element == QUANT_ELEMENT_E4M3)
        return set_error(PARITY_ERR_UNSUPPORTED, "%s: the bf16 adjustment is written for the "
                         "4-bit and ternary rules, not the fp8 ones; write the training codes "
                         "instead", fn);
    if (quantizer == PARITY_QUANT_NVFP4_TE_2D)
        return set_error(PARITY_ERR_UNSUPPORTED, "%s: the bf16 adjustment works on 1 x 16 blocks; "
                         "\"te-2d\" scales 16 x 16 tiles: write the training codes instead", fn);
    const size_t n = rows * cols;
    float *b = bf16_copy(rows, cols, x, stride);
    uint8_t *want = px_malloc(n, "training codes");
    const uint64_t n_scales = parity_quant_scale_count(quantizer, rows, cols) + 1;
    float *scales = px_malloc(n_scales * sizeof *scales, "scales");
    if (!b || !want || !scales) {
        px_free(b), px_free(want), px_free(scales);
        return PARITY_ERR_OUT_OF_MEMORY;
    }
    quantize_weight(quantizer, rows, cols, x, stride, want, scales);
    uint64_t moved = 0;
    int rc = PARITY_ERR_VERIFY;
    size_t failed = 0;
    if (!is_ternary(quantizer)) {
        rc = adjust_4bit(quantizer, rows, cols, x, stride, b, want, scales, &failed);
        for (size_t i = 0; i < n; i++)
            moved += f32_bits(b[i]) != f32_bits(round_bf16(x[(i / cols) * stride + i % cols]));
    }
    for (int round = 0; is_ternary(quantizer) && round < 16; round++) {
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
    } else if (is_ternary(quantizer)) {
        set_error(PARITY_ERR_VERIFY, "%s: no bf16 inputs found within 16 rounds whose export "
                  "gives the training codes (%llu values moved)", fn, (unsigned long long)moved);
    } else {
        set_error(PARITY_ERR_VERIFY, "%s: %zu blocks have no bf16 inputs near their latents whose "
                  "export gives the training codes and block scale", fn, failed);
    }
    px_free(b), px_free(want), px_free(scales);
    return rc;
}
