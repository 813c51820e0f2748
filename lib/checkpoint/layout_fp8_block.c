/*
 * The block-FP8 checkpoint layout (a row of layout.h): block-FP8 weights as Hugging Face
 * checkpoints hold them (DeepSeek-V3's README_WEIGHTS.md,
 * Qwen3-*-FP8): config.json's
 *   "quantization_config": {"quant_method": "fp8", "fmt": "e4m3", "activation_scheme":
 *                           "dynamic", "weight_block_size": [128, 128],
 *                           "modules_to_not_convert": [...], "scale_fmt": "ue8m0"}
 * and, for each quantized linear layer, "<module>.weight" F8_E4M3 [rows, cols] (the true shape:
 * a partial last block is not padded in the file) with "<module>.weight_scale_inv" F32 or BF16
 * [ceil(rows / 128), ceil(cols / 128)], which, despite its name, is the dequantization
 * multiplier of each 128 x 128 block (a partial block's is that of its values zero-padded to
 * 128 x 128, which have the same amax).
 *
 * The model keeps such a weight's codes and scales as they are ("shipped"): every fp8-block
 * policy reads them, whatever its rule (the rule then quantizes the activations only), so a
 * sampler serving the checkpoint never re-quantizes it. The weight's values for every other
 * reader (bf16 and fp16 policies, the fp32 policy, an mxfp8 policy's quantizer, the save
 * layouts other than fp8-block) are the dequantized ones, as DeepSeek-V3's weight_dequant
 * computes them: master = RN_fp32(e4m3(code) * scale), bf16 = RN_bf16(master), made when
 * such a reader first asks (shipped_dequantize in lib/model/weights.c), not at load.
 */
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "base/alloc.h"
#include "base/errors.h"
#include "base/floats.h"
#include "layout.h"
#include "layout_fp8_block.h"

/* ---- shipped codes and scales --------------------------------------------------------------- */

static uint64_t grid_rows(const expected *slot) { return (slot->rows + 127u) / 128u; }
static uint64_t grid_cols(const expected *slot) { return (slot->cols + 127u) / 128u; }

/* Scale i of a checked scale source, as fp32 (BF16 widened exactly). */
static float scale_value(const tensor_source *s, uint64_t i) {
    const uint8_t *p = s->data;
    if (s->dtype == PARITY_DTYPE_F32) {
        float f;
        memcpy(&f, p + 4 * i, 4);
        return f;
    }
    uint16_t h;
    memcpy(&h, p + 2 * i, 2);
    return bf16_to_f32(h);
}

static int is_pow2(float s) { return (f32_bits(s) & 0x007fffffu) == 0 && (f32_bits(s) & 0x7f800000u); }

/* |e4m3(code)|: the code's value without its sign. */
static float e4m3_magnitude(uint8_t code) {
    const uint8_t m = code & 0x7f;
    float v;
    parity_fp8_to_f32(PARITY_FP8_E4M3, 1, &m, &v);
    return v;
}

/* Whether a code (not NaN) times its block's scale dequantizes within bf16's range. */
static int code_in_range(uint8_t code, float scale) {
    const float v = e4m3_magnitude(code) * scale;
    return (bf16_from_f32(v) & 0x7f80u) != 0x7f80u;
}

/* Whether every code is finite and dequantizes within bf16's range, a block at a time: the
 * block's largest magnitude field (code & 0x7f; 0x7f is the NaN code) is its largest value, and
 * the product with the scale and bf16's rounding are monotone in it, so one value a block
 * decides (a byte max over the codes, not a conversion an element). */
static int codes_in_range(const uint8_t *c, const tensor_source *scales, const expected *slot) {
    const uint64_t gc = grid_cols(slot), cols = slot->cols;
    uint8_t top[64]; /* the block row's largest field per block column, a chunk at a time */
    for (uint64_t r0 = 0; r0 < slot->rows; r0 += 128) {
        const uint64_t r1 = slot->rows - r0 < 128 ? slot->rows : r0 + 128;
        for (uint64_t b0 = 0; b0 < gc; b0 += 64) {
            const uint64_t nb = gc - b0 < 64 ? gc - b0 : 64;
            memset(top, 0, sizeof top);
            for (uint64_t r = r0; r < r1; r++)
                for (uint64_t b = 0; b < nb; b++) {
                    const uint8_t *p = c + r * cols + (b0 + b) * 128;
                    const uint64_t len = cols - (b0 + b) * 128 < 128 ? cols - (b0 + b) * 128 : 128;
                    uint8_t t = top[b];
                    for (uint64_t k = 0; k < len; k++) {
                        const uint8_t f = p[k] & 0x7f;
                        t = f > t ? f : t;
                    }
                    top[b] = t;
                }
            for (uint64_t b = 0; b < nb; b++)
                if (top[b] == 0x7f ||
                    !code_in_range(top[b], scale_value(scales, r0 / 128 * gc + b0 + b)))
                    return 0;
        }
    }
    return 1;
}

static int shipped_check(const tensor_source *codes, const tensor_source *scales,
                         const expected *slot, int ue8m0) {
    if (codes->dtype != PARITY_DTYPE_F8_E4M3)
        return set_error(PARITY_ERR_TENSOR_DTYPE, "%s: dtype %s where block-FP8 codes are F8_E4M3",
                         codes->where, codes->dtype_name ? codes->dtype_name : "not F8_E4M3");
    if (!scales)
        return set_error(PARITY_ERR_SCALE_MISSING, "%s: an F8_E4M3 weight without its "
                         "weight_scale_inv (%s_scale_inv, the block scales)", codes->where,
                         slot->name);
    if (!slot->rows || codes->ndim != 2 || codes->shape[0] != slot->rows ||
        codes->shape[1] != slot->cols)
        return set_error(PARITY_ERR_TENSOR_SHAPE, "%s: F8_E4M3 codes of shape %s expected (the "
                         "config's), not of %u dimensions [%" PRIu64 "%s", codes->where,
                         slot->shape_doc, codes->ndim, codes->ndim ? codes->shape[0] : 0,
                         codes->ndim == 2 ? ", ...]" : "]");
    if (scales->dtype != PARITY_DTYPE_F32 && scales->dtype != PARITY_DTYPE_BF16)
        return set_error(PARITY_ERR_TENSOR_DTYPE, "%s: dtype %s, block scales are F32 or BF16",
                         scales->where, scales->dtype_name ? scales->dtype_name : "not F32/BF16");
    const uint64_t gr = grid_rows(slot), gc = grid_cols(slot);
    if (scales->ndim != 2 || scales->shape[0] != gr || scales->shape[1] != gc)
        return set_error(PARITY_ERR_SCALE_GRID, "%s: shape [%" PRIu64 "%s%" PRIu64 "] is not the "
                         "128 x 128 block grid [%" PRIu64 ", %" PRIu64 "] of the %u x %u weight "
                         "(ceil(rows / 128), ceil(cols / 128); partial blocks are not padded "
                         "away)", scales->where, scales->ndim ? scales->shape[0] : 0,
                         scales->ndim == 2 ? ", " : "", scales->ndim == 2 ? scales->shape[1] : 0,
                         gr, gc, slot->rows, slot->cols);
    if (!codes->data || !scales->data)
        return set_error(PARITY_ERR_INVALID_ARGUMENT, "%s: data is NULL", codes->where);
    for (uint64_t i = 0; i < gr * gc; i++) {
        const float s = scale_value(scales, i);
        if (!(isfinite(s) && s > 0) || (ue8m0 && !is_pow2(s)))
            return set_error(PARITY_ERR_SCALE_VALUE, "%s: block [%" PRIu64 ", %" PRIu64 "] has "
                             "scale %g: %s", scales->where, i / gc, i % gc, (double)s,
                             !(isfinite(s) && s > 0)
                                 ? "a dequantization multiplier is finite and positive"
                                 : "scale_fmt ue8m0 wants a power of two");
    }
    if (codes_in_range(codes->data, scales, slot)) return PARITY_OK;
    /* something is out of range: the element-wise walk names the first element that is */
    const uint8_t *c = codes->data;
    const uint64_t n = (uint64_t)slot->rows * slot->cols;
    for (uint64_t i = 0; i < n; i++) {
        if ((c[i] & 0x7f) == 0x7f)
            return set_error(PARITY_ERR_TENSOR_NONFINITE, "%s: element %" PRIu64 " is the NaN code "
                             "0x%02x (weights must be finite)", codes->where, i, c[i]);
        const uint64_t r = i / slot->cols, k = i % slot->cols;
        if (!code_in_range(c[i], scale_value(scales, (r / 128) * grid_cols(slot) + k / 128)))
            return set_error(PARITY_ERR_TENSOR_NONFINITE, "%s: element %" PRIu64 " dequantizes to "
                             "%g, beyond bf16's range", codes->where, i,
                             (double)(e4m3_magnitude(c[i]) *
                                      scale_value(scales, (r / 128) * grid_cols(slot) + k / 128)));
    }
    return PARITY_OK;
}

static void shipped_convert_into(const tensor_source *codes, const tensor_source *scales,
                                 const expected *slot, uint8_t *out_codes, float *out_scales) {
    const uint64_t gc = grid_cols(slot), n = (uint64_t)slot->rows * slot->cols;
    for (uint64_t i = 0; i < grid_rows(slot) * gc; i++) out_scales[i] = scale_value(scales, i);
    if (out_codes != codes->data) memcpy(out_codes, codes->data, n);
}

int shipped_import(const tensor_source *codes, const tensor_source *scales, const expected *slot,
                   int ue8m0, shipped_values *out) {
    *out = (shipped_values){0};
    TRY(shipped_check(codes, scales, slot, ue8m0));
    const uint64_t n = (uint64_t)slot->rows * slot->cols;
    /* the codes of a mapped checkpoint are already as the model holds them, one a byte: used
     * in place (read-only: nothing writes a weight's shipped codes; an update replaces them) */
    out->codes_mapped = (uint8_t)(codes->may_map != 0);
    out->codes = out->codes_mapped ? (uint8_t *)(uintptr_t)codes->data
                                   : px_huge_alloc(n, slot->name);
    out->scales = px_malloc(grid_rows(slot) * grid_cols(slot) * sizeof(float), "fp8 block scales");
    if (!out->codes || !out->scales) {
        shipped_values_free(out);
        return PARITY_ERR_OUT_OF_MEMORY;
    }
    shipped_convert_into(codes, scales, slot, out->codes, out->scales);
    out->scale_dtype = (uint8_t)scales->dtype;
    return PARITY_OK;
}

/* ---- the layout's row --------------------------------------------------------------------- */

static int fp8_block_import(const layout_tensors *in, shipped_values *out) {
    const tensor_source *codes = in->codes;
    if (codes->dtype != PARITY_DTYPE_F8_E4M3)
        return set_error(PARITY_ERR_TENSOR_DTYPE, "%s: dtype %s, but config.json's "
                         "quantization_config (quant_method fp8) quantizes this layer: F8_E4M3 "
                         "codes expected (a layer kept in bf16 is named in "
                         "modules_to_not_convert)", codes->where, codes->dtype_name);
    return shipped_import(codes, in->companion[0], in->slot, in->settings->scale_ue8m0, out);
}

static int fp8_block_rule(const char *name, int *rule) {
    return parity_fp8_quantizer_from_name(0, name, rule);
}

/* The codes and their block scales "<weight>_scale_inv": the shipped ones, or those of `rule`
 * (codes shipped in another format are not fp8-block's: `rule` quantizes their values). */
static int fp8_block_plan(const weight *w, int rule, saved_tensor *v, saved_tensor *more) {
    const uint64_t count = (uint64_t)w->rows * w->cols;
    const uint64_t grid = (uint64_t)((w->rows + 127) / 128) * ((w->cols + 127) / 128);
    saved_tensor *sc = &more[0];
    *sc = (saved_tensor){.w = w, .kind = OUT_SCALES};
    snprintf(sc->scale_name, sizeof sc->scale_name, "%s_scale_inv", v->name);
    sc->name = sc->scale_name;
    snprintf(sc->shape, sizeof sc->shape, "%u,%u", (w->rows + 127) / 128, (w->cols + 127) / 128);
    v->kind = OUT_CODES;
    v->dtype = "F8_E4M3";
    v->bytes = count;
    if (w->shipped && w->shipped_gemm == PARITY_GEMM_FP8_BLOCK) {
        v->q = sc->q = w->shipped;
        sc->scales_bf16 = w->shipped_scale_dtype == PARITY_DTYPE_BF16;
    } else if (rule < 0) {
        return set_error(PARITY_ERR_INVALID_ARGUMENT, "layout fp8-block: '%s' holds no shipped fp8 "
                         "codes; name the quantizer that makes them (fp8-block:RULE)", v->name);
    } else {
        TRY(quant_weight_make(w, rule, grid, &v->made, "fp8 quantization"));
        v->q = sc->q = &v->made;
    }
    sc->dtype = sc->scales_bf16 ? "BF16" : "F32";
    sc->bytes = grid * (sc->scales_bf16 ? 2 : 4);
    return 1;
}

static int fp8_block_write(FILE *fp, const saved_tensor *t) {
    if (t->kind == OUT_CODES) {
        const size_t count = (size_t)t->w->rows * t->w->cols;
        return fwrite(t->q->codes, 1, count, fp) == count;
    }
    const size_t g = (size_t)(t->bytes / (t->scales_bf16 ? 2 : 4));
    if (!t->scales_bf16) return fwrite(t->q->scales, 4, g, fp) == g;
    for (size_t i = 0; i < g; i++) {
        const uint16_t h = bf16_from_f32(t->q->scales[i]); /* exact: they came from bf16 */
        if (fwrite(&h, 2, 1, fp) != 1) return 0;
    }
    return 1;
}

/* scale_fmt ue8m0 when every scale saved is a power of two and the rule (te-pow2) or the
 * checkpoint the model came from said so. */
static int fp8_block_config_head(char *buf, size_t size, const saved_tensor *entries, size_t n,
                                 int rule, const quant_checkpoint *settings, int modelopt_file) {
    (void)modelopt_file;
    int all_pow2 = 1;
    for (size_t i = 0; i < n; i++) {
        if (entries[i].kind != OUT_SCALES) continue;
        const uint64_t g = entries[i].bytes / (entries[i].scales_bf16 ? 2 : 4);
        for (uint64_t j = 0; j < g; j++)
            if (f32_bits(entries[i].q->scales[j]) & 0x007fffffu) all_pow2 = 0;
    }
    const int ue8m0 = all_pow2 && (rule == PARITY_FP8Q_TE_POW2 || settings->scale_ue8m0);
    return snprintf(buf, size, "{\"quant_method\": \"fp8\", \"fmt\": \"e4m3\", "
                    "\"activation_scheme\": \"dynamic\", \"weight_block_size\": [128, 128], "
                    "%s\"modules_to_not_convert\": ", ue8m0 ? "\"scale_fmt\": \"ue8m0\", " : "");
}

QUANTIZED_LAYOUT(fp8_block, "fp8-block", QUANT_METHOD_FP8_BLOCK, PARITY_GEMM_FP8_BLOCK, 0, "",
                 "_scale_inv");
