/*
 * Block-FP8 weights as Hugging Face checkpoints hold them (DeepSeek-V3's README_WEIGHTS.md,
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
 * computes them: master = RN_fp32(e4m3(code) * scale), bf16 = RN_bf16(master).
 */
#include <inttypes.h>
#include <math.h>
#include <stdio.h>

#include "internal.h"
#include "json.h"
#include "model.h"

/* ---- quantization_config ------------------------------------------------------------------ */

void fp8_checkpoint_free(fp8_checkpoint *c) {
    for (size_t i = 0; i < c->n_not_converted; i++) px_free(c->not_converted[i]);
    px_free(c->not_converted);
    *c = (fp8_checkpoint){0};
}

/* Appends the strings of an array member (modules_to_not_convert, ignored_layers). */
static int read_module_list(const json_value *q, const char *key, const char *path,
                            fp8_checkpoint *c) {
    const json_value *v = json_get(q, key);
    if (!v || v->type == JSON_NULL) return PARITY_OK;
    if (v->type != JSON_ARRAY)
        return set_error(PARITY_ERR_CONFIG, "%s: quantization_config.%s is %s, expected an array "
                         "of module names", path, key, json_type_name(v->type));
    char **grown = px_realloc(c->not_converted, (c->n_not_converted + v->count + 1) * sizeof *grown,
                              "modules_to_not_convert");
    if (!grown) return PARITY_ERR_OUT_OF_MEMORY;
    c->not_converted = grown;
    for (size_t i = 0; i < v->count; i++) {
        if (v->items[i].type != JSON_STRING)
            return set_error(PARITY_ERR_CONFIG, "%s: quantization_config.%s[%zu] is %s, expected "
                             "a module name", path, key, i, json_type_name(v->items[i].type));
        char *s = px_malloc(v->items[i].len + 1, "module name");
        if (!s) return PARITY_ERR_OUT_OF_MEMORY;
        memcpy(s, v->items[i].str, v->items[i].len + 1);
        c->not_converted[c->n_not_converted++] = s;
    }
    return PARITY_OK;
}

/* A string member: PARITY_OK with *out NULL when absent; PARITY_ERR_CONFIG for another type. */
static int read_str(const json_value *q, const char *key, const char *path, const char **out) {
    const json_value *v = json_get(q, key);
    *out = NULL;
    if (!v || v->type == JSON_NULL) return PARITY_OK;
    if (v->type != JSON_STRING)
        return set_error(PARITY_ERR_CONFIG, "%s: quantization_config.%s is %s, expected a string",
                         path, key, json_type_name(v->type));
    *out = v->str;
    return PARITY_OK;
}

/* quant_method "bitnet" (transformers integrations/bitnet.py; lib/bitnet_checkpoint.c). */
static int parse_bitnet(const json_value *q, const char *path, fp8_checkpoint *c) {
    const char *cls, *mode;
    int rc;
    if ((rc = read_str(q, "linear_class", path, &cls)) || (rc = read_str(q, "quantization_mode", path, &mode)))
        return rc;
    if (cls && strcmp(cls, "bitlinear") && strcmp(cls, "autobitlinear"))
        return set_error(PARITY_ERR_UNSUPPORTED, "%s: quantization_config.linear_class '%s' is not "
                         "known (\"bitlinear\": weight_scale is 1 / mean|W|; \"autobitlinear\": it "
                         "is mean|W|)", path, cls);
    const int autobit = cls && !strcmp(cls, "autobitlinear");
    if (autobit && mode && strcmp(mode, "offline"))
        return set_error(PARITY_ERR_UNSUPPORTED, "%s: quantization_config.quantization_mode '%s' is "
                         "not supported (\"offline\": packed codes in the files; an online "
                         "checkpoint holds latents, which load without quantization_config)", path, mode);
    c->quantized = 1;
    c->bitnet = 1;
    c->bitnet_scale_is_mean = autobit;
    return read_module_list(q, "modules_to_not_convert", path, c);
}

static int parse_quant(const json_value *q, const char *path, fp8_checkpoint *c) {
    if (q->type != JSON_OBJECT)
        return set_error(PARITY_ERR_CONFIG, "%s: quantization_config is %s, expected an object",
                         path, json_type_name(q->type));
    const char *method, *fmt, *scheme, *scale_fmt;
    int rc;
    if ((rc = read_str(q, "quant_method", path, &method))) return rc;
    if (!method)
        return set_error(PARITY_ERR_CONFIG, "%s: quantization_config has no quant_method", path);
    if (!strcmp(method, "bitnet")) return parse_bitnet(q, path, c);
    if (strcmp(method, "fp8"))
        return set_error(PARITY_ERR_UNSUPPORTED, "%s: quantization_config.quant_method '%s' is not "
                         "supported (block-wise \"fp8\" and \"bitnet\" checkpoints are)", path,
                         method);
    if ((rc = read_str(q, "fmt", path, &fmt)) || (rc = read_str(q, "activation_scheme", path, &scheme)) ||
        (rc = read_str(q, "scale_fmt", path, &scale_fmt)))
        return rc;
    if (fmt && strcmp(fmt, "e4m3"))
        return set_error(PARITY_ERR_UNSUPPORTED, "%s: quantization_config.fmt '%s' is not supported "
                         "(only e4m3)", path, fmt);
    if (scheme && strcmp(scheme, "dynamic"))
        return set_error(PARITY_ERR_UNSUPPORTED, "%s: quantization_config.activation_scheme '%s' is "
                         "not supported (only dynamic: activations quantized per token, per 1 x 128 "
                         "group, at each GEMM input)", path, scheme);
    if (scale_fmt && strcmp(scale_fmt, "ue8m0") && strcmp(scale_fmt, "float32"))
        return set_error(PARITY_ERR_UNSUPPORTED, "%s: quantization_config.scale_fmt '%s' is not "
                         "supported (ue8m0 or float32)", path, scale_fmt);
    const json_value *bs = json_get(q, "weight_block_size");
    if (!bs || bs->type == JSON_NULL)
        return set_error(PARITY_ERR_UNSUPPORTED, "%s: quantization_config has no weight_block_size: "
                         "per-tensor fp8 is not supported (128 x 128 blocks are)", path);
    if (bs->type != JSON_ARRAY || bs->count != 2 || bs->items[0].type != JSON_NUMBER ||
        bs->items[1].type != JSON_NUMBER || !bs->items[0].is_int || !bs->items[1].is_int)
        return set_error(PARITY_ERR_CONFIG, "%s: quantization_config.weight_block_size is not two "
                         "integers", path);
    if (bs->items[0].integer != 128 || bs->items[1].integer != 128)
        return set_error(PARITY_ERR_UNSUPPORTED, "%s: quantization_config.weight_block_size [%lld, "
                         "%lld] is not supported (only [128, 128])", path,
                         (long long)bs->items[0].integer, (long long)bs->items[1].integer);
    c->quantized = 1;
    c->scale_ue8m0 = scale_fmt && !strcmp(scale_fmt, "ue8m0");
    if ((rc = read_module_list(q, "modules_to_not_convert", path, c))) return rc;
    return read_module_list(q, "ignored_layers", path, c);
}

int fp8_checkpoint_parse(const char *text, size_t len, const char *path, fp8_checkpoint *out) {
    *out = (fp8_checkpoint){0};
    char err[256];
    json_doc *doc = NULL;
    int rc = json_parse(text, len, &doc, err, sizeof err);
    if (rc == PARITY_ERR_OUT_OF_MEMORY) return set_error(rc, "%s: out of memory parsing JSON", path);
    if (rc) return set_error(PARITY_ERR_JSON_SYNTAX, "%s: %s", path, err);
    const json_value *q = json_get(json_doc_root(doc), "quantization_config");
    if (q && q->type != JSON_NULL) rc = parse_quant(q, path, out);
    json_free(doc);
    if (rc) fp8_checkpoint_free(out);
    return rc;
}

/* Whether a list entry names the module: equal, a dotted prefix of it ("model.layers.0"
 * keeps a whole layer), or a dotted suffix ("down_proj", "mlp.down_proj": every layer's). */
static int entry_names(const char *entry, const char *module) {
    const size_t n = strlen(entry), m = strlen(module);
    if (!n || n >= m) return n == m && !strcmp(entry, module);
    if (!strncmp(module, entry, n) && module[n] == '.') return 1;
    return module[m - n - 1] == '.' && !strcmp(module + m - n, entry);
}

int fp8_checkpoint_keeps(const fp8_checkpoint *c, const char *weight_name) {
    char module[96];
    const size_t n = strlen(weight_name);
    if (n < 7 || n - 7 >= sizeof module || strcmp(weight_name + n - 7, ".weight")) return 0;
    memcpy(module, weight_name, n - 7);
    module[n - 7] = '\0';
    for (size_t i = 0; i < c->n_not_converted; i++)
        if (entry_names(c->not_converted[i], module)) return 1;
    return 0;
}

/* ---- shipped codes and scales --------------------------------------------------------------- */

void shipped_values_free(shipped_values *v) {
    px_free(v->codes);
    px_free(v->scales);
    px_free(v->master);
    px_free(v->bf16);
    *v = (shipped_values){0};
}

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

int shipped_check(const tensor_source *codes, const tensor_source *scales, const expected *slot,
                  int ue8m0) {
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
    const uint8_t *c = codes->data;
    const uint64_t n = (uint64_t)slot->rows * slot->cols;
    for (uint64_t i = 0; i < n; i++) {
        if ((c[i] & 0x7f) == 0x7f)
            return set_error(PARITY_ERR_TENSOR_NONFINITE, "%s: element %" PRIu64 " is the NaN code "
                             "0x%02x (weights must be finite)", codes->where, i, c[i]);
        const uint64_t r = i / slot->cols, k = i % slot->cols;
        float v;
        parity_fp8_to_f32(PARITY_FP8_E4M3, 1, &c[i], &v);
        v = v * scale_value(scales, (r / 128) * gc + k / 128);
        if ((bf16_from_f32(v) & 0x7f80u) == 0x7f80u)
            return set_error(PARITY_ERR_TENSOR_NONFINITE, "%s: element %" PRIu64 " dequantizes to "
                             "%g, beyond bf16's range", codes->where, i, (double)v);
    }
    return PARITY_OK;
}

void shipped_convert_into(const tensor_source *codes, const tensor_source *scales,
                          const expected *slot, uint8_t *out_codes, float *out_scales,
                          float *master, uint16_t *bf16) {
    const uint64_t gc = grid_cols(slot), n = (uint64_t)slot->rows * slot->cols;
    for (uint64_t i = 0; i < grid_rows(slot) * gc; i++) out_scales[i] = scale_value(scales, i);
    memcpy(out_codes, codes->data, n);
    parity_fp8_to_f32(PARITY_FP8_E4M3, n, out_codes, master);
    for (uint64_t i = 0; i < n; i++) {
        const uint64_t r = i / slot->cols, k = i % slot->cols;
        master[i] = master[i] * out_scales[(r / 128) * gc + k / 128];
        bf16[i] = bf16_from_f32(master[i]);
    }
}

int shipped_import(const tensor_source *codes, const tensor_source *scales, const expected *slot,
                   int ue8m0, shipped_values *out) {
    *out = (shipped_values){0};
    int rc = shipped_check(codes, scales, slot, ue8m0);
    if (rc) return rc;
    const uint64_t n = (uint64_t)slot->rows * slot->cols;
    out->codes = px_weight_alloc(n, slot->name);
    out->scales = px_malloc(grid_rows(slot) * grid_cols(slot) * sizeof(float), "fp8 block scales");
    out->master = px_weight_alloc(n * 4, slot->name);
    out->bf16 = px_weight_alloc(n * 2, slot->name);
    if (!out->codes || !out->scales || !out->master || !out->bf16) {
        shipped_values_free(out);
        return PARITY_ERR_OUT_OF_MEMORY;
    }
    shipped_convert_into(codes, scales, slot, out->codes, out->scales, out->master, out->bf16);
    out->scale_dtype = (uint8_t)scales->dtype;
    return PARITY_OK;
}
