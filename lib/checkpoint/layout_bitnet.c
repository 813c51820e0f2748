/*
 * The BitNet checkpoint layout (a row of layout.h): ternary weights as transformers' BitNet
 * integration stores them (integrations/bitnet.py):
 * config.json's
 *   "quantization_config": {"quant_method": "bitnet", "linear_class": "bitlinear" |
 *                           "autobitlinear", "quantization_mode": "offline",
 *                           "modules_to_not_convert": [...]}
 * and, for each quantized linear layer, "<module>.weight" U8 [ceil(rows / 4), cols] with four
 * ternary values a byte, and "<module>.weight_scale" (one value: shape [1] or [], BF16, F16 or
 * F32). pack_weights stores value + 1 (0, 1, 2) in two bits and interleaves quarter blocks of
 * rows: with R = ceil(rows / 4), row i * R + r sits in bits 2i..2i+1 of packed row r (not four
 * consecutive rows in one byte). A field of 3 is no ternary code.
 *
 * linear_class decides what weight_scale is: "bitlinear" (the default, BitLinear) divides the
 * GEMM output by it, so it is s_w = 1 / mean|W| and W = code / weight_scale; "autobitlinear"
 * (offline AutoBitLinear) multiplies by it, so it is mean|W| and W = code * weight_scale.
 *
 * The model keeps the codes ("shipped"), repacked at load from four rows' codes a byte into the
 * layout the ternary GEMM holds (quant_weight.h: four codes of a row a byte, in groups of 64),
 * with s_w as the ternary GEMM's multiplier: the stored
 * value under bitlinear, RN(1 / weight_scale) under autobitlinear. Every ternary policy reads
 * them as they are (its rule then quantizes the activations only); every other reader sees
 * the dequantized values master = RN_fp32(code / weight_scale) (bitlinear) or RN_fp32(code *
 * weight_scale) (autobitlinear), bf16 = RN_bf16(master), made when such a reader first asks
 * (shipped_dequantize in lib/model/weights.c), not at load.
 */
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "base/alloc.h"
#include "base/errors.h"
#include "base/floats.h"
#include "layout.h"
#include "layout_bitnet.h"
#include "quant/quant_weight.h"
#include "quant/rules.h"

static uint64_t packed_rows(uint32_t rows) { return ((uint64_t)rows + 3) / 4; }

static float one_scale(const tensor_source *s) {
    const uint8_t *p = s->data;
    if (s->dtype == PARITY_DTYPE_F32) {
        float f;
        memcpy(&f, p, 4);
        return f;
    }
    uint16_t h;
    memcpy(&h, p, 2);
    return s->dtype == PARITY_DTYPE_BF16 ? bf16_to_f32(h) : f16_to_f32(h);
}

static int ternary_shipped_check(const tensor_source *codes, const tensor_source *scale,
                                 const expected *slot) {
    if (codes->dtype != TENSOR_SOURCE_U8)
        return set_error(PARITY_ERR_TENSOR_DTYPE, "%s: dtype %s where packed ternary codes are U8 "
                         "(quantization_config quant_method bitnet quantizes this layer; a layer "
                         "kept in bf16 is named in modules_to_not_convert)", codes->where,
                         codes->dtype_name ? codes->dtype_name : "?");
    if (!scale)
        return set_error(PARITY_ERR_SCALE_MISSING, "%s: packed ternary codes without their "
                         "weight_scale (%s_scale)", codes->where, slot->name);
    const uint64_t pr = packed_rows(slot->rows);
    if (!slot->rows || codes->ndim != 2 || codes->shape[0] != pr || codes->shape[1] != slot->cols)
        return set_error(PARITY_ERR_TENSOR_SHAPE, "%s: packed codes of shape [%" PRIu64 ", %u] "
                         "expected (four ternary values a byte along the %u rows of %s), not of %u "
                         "dimensions [%" PRIu64 "%s", codes->where, pr, slot->cols, slot->rows,
                         slot->shape_doc, codes->ndim, codes->ndim ? codes->shape[0] : 0,
                         codes->ndim == 2 ? ", ...]" : "]");
    if (scale->dtype != PARITY_DTYPE_F32 && scale->dtype != PARITY_DTYPE_BF16 &&
        scale->dtype != PARITY_DTYPE_F16)
        return set_error(PARITY_ERR_TENSOR_DTYPE, "%s: dtype %s, a weight_scale is BF16, F16 or F32",
                         scale->where, scale->dtype_name ? scale->dtype_name : "?");
    if (scale->ndim > 1 || (scale->ndim == 1 && scale->shape[0] != 1))
        return set_error(PARITY_ERR_SCALE_GRID, "%s: a ternary weight has one scale (shape [1] or "
                         "[]), not %u dimensions [%" PRIu64 "%s", scale->where, scale->ndim,
                         scale->ndim ? scale->shape[0] : 0, scale->ndim > 1 ? ", ...]" : "]");
    if (!codes->data || !scale->data)
        return set_error(PARITY_ERR_INVALID_ARGUMENT, "%s: data is NULL", codes->where);
    const float s = one_scale(scale);
    if (!(isfinite(s) && s > 0))
        return set_error(PARITY_ERR_SCALE_VALUE, "%s: weight_scale %g: a ternary scale is finite "
                         "and positive", scale->where, (double)s);
    const uint8_t *p = codes->data;
    for (uint32_t r = 0; r < slot->rows; r++) {
        const uint64_t byte_row = r % pr, field = r / pr;
        for (uint32_t c = 0; c < slot->cols; c++)
            if (((p[byte_row * slot->cols + c] >> (2 * field)) & 3u) == 3u)
                return set_error(PARITY_ERR_TENSOR_NONFINITE, "%s: element [%u][%u] (byte [%" PRIu64
                                 "][%u], bits %u-%u) is 3, not a ternary code (0, 1, 2 mean -1, "
                                 "0, 1)", codes->where, r, c, byte_row, c, (unsigned)(2 * field),
                                 (unsigned)(2 * field + 1));
    }
    return PARITY_OK;
}

static int ternary_shipped_import(const tensor_source *codes, const tensor_source *scale,
                                  const expected *slot, int scale_is_mean,
                                  shipped_values *out) {
    *out = (shipped_values){0};
    TRY(ternary_shipped_check(codes, scale, slot));
    const quant_format *f = quant_format_row(PARITY_GEMM_TERNARY);
    const uint64_t pr = packed_rows(slot->rows);
    const size_t row_bytes = quant_weight_row_bytes(f, slot->cols);
    out->codes = px_huge_alloc(quant_weight_code_bytes(f, slot->rows, slot->cols), slot->name);
    out->scales = px_malloc(sizeof(float), "ternary scale");
    /* a row's codes one a byte, then packed as held */
    uint8_t *row = px_malloc(slot->cols, "a row of ternary codes");
    if (!out->codes || !out->scales || !row) {
        px_free(row);
        shipped_values_free(out);
        return PARITY_ERR_OUT_OF_MEMORY;
    }
    const float s = one_scale(scale);
    const uint8_t *p = codes->data;
    int nonzero = 0;
    for (uint32_t r = 0; r < slot->rows; r++) {
        const uint64_t byte_row = r % pr, field = r / pr;
        for (uint32_t c = 0; c < slot->cols; c++) {
            const int code = (int)((p[byte_row * slot->cols + c] >> (2 * field)) & 3u) - 1;
            row[c] = (uint8_t)(int8_t)code;
            nonzero |= code != 0;
        }
        quant_codes_pack_row(f, row, slot->cols, out->codes + r * row_bytes);
    }
    px_free(row);
    /* what the codes mean must be representable: the GEMM's s_w finite, and the value of a
     * nonzero code (shipped_dequantize: code * mean, or code / s_w) within bf16's range */
    const float s_w = scale_is_mean ? 1.0f / s : s, one = scale_is_mean ? 1.0f * s : 1.0f / s;
    if (!isfinite(s_w) || (nonzero && (bf16_from_f32(one) & 0x7f80u) == 0x7f80u)) {
        shipped_values_free(out);
        return set_error(PARITY_ERR_TENSOR_NONFINITE, "%s: weight_scale %g %s: a code of 1 "
                         "dequantizes to %g and the GEMM's s_w is %g; both must be finite, the "
                         "value within bf16's range", scale->where, (double)s,
                         scale_is_mean ? "(mean |W|, autobitlinear)" : "(s_w, bitlinear)",
                         (double)one, (double)s_w);
    }
    out->scales[0] = 0.0f;
    out->tensor_scale = s_w;
    out->value_scale = s;
    out->scale_is_mean = (uint8_t)scale_is_mean;
    out->scale_dtype = (uint8_t)scale->dtype;
    return PARITY_OK;
}

void ternary_pack(const uint8_t *held, uint32_t rows, uint32_t cols, uint8_t *packed) {
    const quant_format *f = quant_format_row(PARITY_GEMM_TERNARY);
    const uint64_t pr = packed_rows(rows);
    const size_t row_bytes = quant_weight_row_bytes(f, cols);
    memset(packed, 0, pr * cols);
    for (uint32_t r = 0; r < rows; r++) {
        const uint64_t byte_row = r % pr, field = r / pr;
        const uint8_t *codes = held + (uint64_t)r * row_bytes;
        for (uint32_t c = 0; c < cols; c++) {
            const unsigned v = (unsigned)((int8_t)quant_code_at(f, codes, c) + 1);
            packed[byte_row * cols + c] |= (uint8_t)(v << (2 * field));
        }
    }
}

/* ---- the layout's row --------------------------------------------------------------------- */

static int bitnet_import(const layout_tensors *in, shipped_values *out) {
    const int scale_is_mean = in->settings->bitnet_scale_is_mean;
    TRY(ternary_shipped_import(in->codes, in->companion[0], in->slot, scale_is_mean, out));
    /* autobitlinear's s_w is computed (1 / mean): it saves as F32, exactly */
    if (scale_is_mean) out->scale_dtype = PARITY_DTYPE_F32;
    return PARITY_OK;
}

static int bitnet_rule(const char *name, int *rule) {
    return parity_quantizer_from_name(PARITY_GEMM_TERNARY, name, rule);
}

/* The packed codes and their weight_scale "<weight>_scale": the shipped ternary codes, or those
 * of `rule` quantizing w's values. The scale keeps a shipped scale's dtype; a quantized one is
 * F32 (BF16 under hf-bitlinear, whose s_w is a bf16 value). */
static int bitnet_plan(const weight *w, int rule, saved_tensor *v, saved_tensor *more) {
    saved_tensor *sc = &more[0];
    *sc = (saved_tensor){.w = w, .kind = OUT_SCALES};
    snprintf(sc->scale_name, sizeof sc->scale_name, "%s_scale", v->name);
    sc->name = sc->scale_name;
    snprintf(sc->shape, sizeof sc->shape, "1");
    v->kind = OUT_CODES;
    v->dtype = "U8";
    v->bytes = packed_rows(w->rows) * w->cols;
    snprintf(v->shape, sizeof v->shape, "%u,%u", (w->rows + 3) / 4, w->cols);
    if (w->shipped && w->shipped_gemm == PARITY_GEMM_TERNARY) {
        v->q = sc->q = w->shipped;
        sc->scales_bf16 = w->shipped_scale_dtype == PARITY_DTYPE_BF16;
        sc->scales_f16 = w->shipped_scale_dtype == PARITY_DTYPE_F16;
    } else if (rule < 0) {
        return set_error(PARITY_ERR_INVALID_ARGUMENT, "layout bitnet: '%s' holds no shipped ternary "
                         "codes; name the quantizer that makes them (bitnet:RULE)", v->name);
    } else {
        TRY(quant_weight_make(w, rule, 1, &v->made, "ternary quantization"));
        v->q = sc->q = &v->made;
        sc->scales_bf16 = quant_rule_of(rule)->tensor_scale == QUANT_SCALE_BF16;
    }
    sc->dtype = sc->scales_bf16 ? "BF16" : sc->scales_f16 ? "F16" : "F32";
    sc->bytes = sc->scales_bf16 || sc->scales_f16 ? 2 : 4;
    return 1;
}

static int bitnet_write(FILE *fp, const saved_tensor *t) {
    const weight *w = t->w;
    if (t->kind == OUT_CODES) {
        uint8_t *packed = px_malloc(t->bytes ? t->bytes : 1, "packed ternary codes");
        if (!packed) return 0;
        ternary_pack(t->q->codes, w->rows, w->cols, packed);
        const int ok = fwrite(packed, 1, t->bytes, fp) == t->bytes;
        px_free(packed);
        return ok;
    }
    const float s = t->q->tensor_scale;
    if (t->scales_bf16 || t->scales_f16) {
        const uint16_t h = t->scales_bf16 ? bf16_from_f32(s) : f16_from_f32(s);
        return fwrite(&h, 2, 1, fp) == 1;
    }
    return fwrite(&s, 4, 1, fp) == 1;
}

/* weight_scale is s_w = 1 / mean|W|: linear_class bitlinear. */
static int bitnet_config_head(char *buf, size_t size, const saved_tensor *entries, size_t n,
                              int rule, const quant_checkpoint *settings, int modelopt_file) {
    (void)entries, (void)n, (void)rule, (void)settings, (void)modelopt_file;
    return snprintf(buf, size, "{\"quant_method\": \"bitnet\", \"linear_class\": \"bitlinear\", "
                    "\"modules_to_not_convert\": ");
}

QUANTIZED_LAYOUT(bitnet, "bitnet", QUANT_METHOD_BITNET, PARITY_GEMM_TERNARY, 0, "", "_scale");
