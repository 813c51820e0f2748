/*
 * A checkpoint's quantization settings: config.json's "quantization_config" (and, for ModelOpt
 * checkpoints that carry none there, hf_quant_config.json's "quantization"), read into a
 * quant_checkpoint. Four methods are known, each with its tensor layout in its own file:
 *   "fp8"      block-FP8 (DeepSeek-V3, Qwen3-FP8): fmt e4m3, activation_scheme dynamic,
 *              weight_block_size [128, 128], optional scale_fmt ue8m0 (layout_fp8_block.c);
 *   "bitnet"   transformers' BitNet: linear_class bitlinear | autobitlinear, quantization_mode
 *              offline, use_rms_norm false (layout_bitnet.c);
 *   "modelopt" with quant_algo "NVFP4": ModelOpt's NVFP4, group_size 16, kv_cache_quant_algo
 *              null (layout_nvfp4.c);
 *   "mxfp4"    the *_blocks / *_scales layout of gpt-oss (layout_mxfp4.c).
 * The layers a checkpoint keeps unquantized are listed in modules_to_not_convert,
 * ignored_layers, or (ModelOpt) exclude_modules / ignore; an entry names a module exactly, by a
 * dotted prefix or suffix, or as a shell pattern when it holds '*' or '?'.
 */
#include <fnmatch.h>
#include <stdio.h>
#include <string.h>

#include "base/alloc.h"
#include "base/errors.h"
#include "json.h"
#include "quant_config.h"

/* Where a member is read from, for messages: "PATH: quantization_config.KEY". */
typedef struct config_place {
    const char *path, *object;
} config_place;

void quant_checkpoint_free(quant_checkpoint *c) {
    for (size_t i = 0; i < c->n_not_converted; i++) px_free(c->not_converted[i]);
    px_free(c->not_converted);
    *c = (quant_checkpoint){0};
}

const char *quant_method_name(int method) {
    switch (method) {
    case QUANT_METHOD_FP8_BLOCK: return "fp8";
    case QUANT_METHOD_BITNET: return "bitnet";
    case QUANT_METHOD_NVFP4: return "modelopt NVFP4";
    case QUANT_METHOD_MXFP4: return "mxfp4";
    default: return "none";
    }
}

/* Appends the strings of an array member (a list of modules kept unquantized). */
static int read_module_list(const json_value *q, const char *key, const config_place *at,
                            quant_checkpoint *c) {
    const json_value *v = json_get(q, key);
    if (!v || v->type == JSON_NULL) return PARITY_OK;
    if (v->type != JSON_ARRAY)
        return set_error(PARITY_ERR_CONFIG, "%s: %s.%s is %s, expected an array of module names",
                         at->path, at->object, key, json_type_name(v->type));
    char **grown = px_realloc(c->not_converted, (c->n_not_converted + v->count + 1) * sizeof *grown,
                              "modules_to_not_convert");
    if (!grown) return PARITY_ERR_OUT_OF_MEMORY;
    c->not_converted = grown;
    for (size_t i = 0; i < v->count; i++) {
        if (v->items[i].type != JSON_STRING)
            return set_error(PARITY_ERR_CONFIG, "%s: %s.%s[%zu] is %s, expected a module name",
                             at->path, at->object, key, i, json_type_name(v->items[i].type));
        char *s = px_malloc(v->items[i].len + 1, "module name");
        if (!s) return PARITY_ERR_OUT_OF_MEMORY;
        memcpy(s, v->items[i].str, v->items[i].len + 1);
        c->not_converted[c->n_not_converted++] = s;
    }
    return PARITY_OK;
}

/* A string member: PARITY_OK with *out NULL when absent; PARITY_ERR_CONFIG for another type. */
static int read_str(const json_value *q, const char *key, const config_place *at, const char **out) {
    const json_value *v = json_get(q, key);
    *out = NULL;
    if (!v || v->type == JSON_NULL) return PARITY_OK;
    if (v->type != JSON_STRING)
        return set_error(PARITY_ERR_CONFIG, "%s: %s.%s is %s, expected a string", at->path,
                         at->object, key, json_type_name(v->type));
    *out = v->str;
    return PARITY_OK;
}

/* A boolean member: PARITY_OK with *out 0 when absent or null; PARITY_ERR_CONFIG for another
 * type. */
static int read_bool(const json_value *q, const char *key, const config_place *at, int *out) {
    const json_value *v = json_get(q, key);
    *out = 0;
    if (!v || v->type == JSON_NULL) return PARITY_OK;
    if (v->type != JSON_TRUE && v->type != JSON_FALSE)
        return set_error(PARITY_ERR_CONFIG, "%s: %s.%s is %s, expected true or false", at->path,
                         at->object, key, json_type_name(v->type));
    *out = v->type == JSON_TRUE;
    return PARITY_OK;
}

/* "dequantize" (transformers' FineGrainedFP8Config and Mxfp4Config): whether transformers
 * turns the codes into bf16 weights when it loads them. It is read and either value accepted:
 * the arithmetic here is the policy's, and a bf16 policy reads the dequantized values. */
static int read_dequantize(const json_value *q, const config_place *at) {
    int dequantize;
    return read_bool(q, "dequantize", at, &dequantize);
}

/* quant_method "bitnet" (transformers integrations/bitnet.py; layout_bitnet.c).
 * use_rms_norm puts an RMSNorm (of rms_norm_eps, weight all ones unless the checkpoint ships
 * one) before every BitLinear: an arithmetic the forward does not have, so it is refused. */
static int parse_bitnet(const json_value *q, const config_place *at, quant_checkpoint *c) {
    const char *cls, *mode;
    int rms_norm;
    TRY(read_str(q, "linear_class", at, &cls));
    TRY(read_str(q, "quantization_mode", at, &mode));
    TRY(read_bool(q, "use_rms_norm", at, &rms_norm));
    const json_value *eps = json_get(q, "rms_norm_eps");
    if (eps && eps->type != JSON_NULL && eps->type != JSON_NUMBER)
        return set_error(PARITY_ERR_CONFIG, "%s: %s.rms_norm_eps is %s, expected a number",
                         at->path, at->object, json_type_name(eps->type));
    if (rms_norm)
        return set_error(PARITY_ERR_UNSUPPORTED, "%s: %s.use_rms_norm is true: transformers then "
                         "puts an RMSNorm before every BitLinear, which this library does not "
                         "compute (a checkpoint loads with use_rms_norm false or absent)",
                         at->path, at->object);
    if (cls && strcmp(cls, "bitlinear") && strcmp(cls, "autobitlinear"))
        return set_error(PARITY_ERR_UNSUPPORTED, "%s: %s.linear_class '%s' is not known "
                         "(\"bitlinear\": weight_scale is 1 / mean|W|; \"autobitlinear\": it is "
                         "mean|W|)", at->path, at->object, cls);
    const int autobit = cls && !strcmp(cls, "autobitlinear");
    if (autobit && mode && strcmp(mode, "offline"))
        return set_error(PARITY_ERR_UNSUPPORTED, "%s: %s.quantization_mode '%s' is not supported "
                         "(\"offline\": packed codes in the files; an online checkpoint holds "
                         "latents, which load without quantization_config)", at->path, at->object, mode);
    c->method = QUANT_METHOD_BITNET;
    c->bitnet_scale_is_mean = autobit;
    return read_module_list(q, "modules_to_not_convert", at, c);
}

/* quant_method "modelopt" (config.json) or hf_quant_config.json's "quantization" object:
 * quant_algo NVFP4 with 16-element groups and no quantized KV cache. */
static int parse_modelopt(const json_value *q, const config_place *at, quant_checkpoint *c) {
    const char *algo, *kv;
    TRY(read_str(q, "quant_algo", at, &algo));
    if (!algo)
        return set_error(PARITY_ERR_CONFIG, "%s: %s has no quant_algo", at->path, at->object);
    if (strcmp(algo, "NVFP4"))
        return set_error(PARITY_ERR_UNSUPPORTED, "%s: %s.quant_algo '%s' is not supported (a "
                         "ModelOpt checkpoint loads when it is \"NVFP4\"; MIXED_PRECISION and the "
                         "FP8 algorithms do not)", at->path, at->object, algo);
    const json_value *kvv = json_get(q, "kv_cache_quant_algo");
    if (kvv && kvv->type != JSON_NULL) {
        TRY(read_str(q, "kv_cache_quant_algo", at, &kv));
        return set_error(PARITY_ERR_UNSUPPORTED, "%s: %s.kv_cache_quant_algo '%s' is not supported "
                         "(the KV cache holds what the policy says; a checkpoint with k/v scales "
                         "does not load)", at->path, at->object, kv);
    }
    const json_value *g = json_get(q, "group_size");
    if (g && g->type != JSON_NULL) {
        if (g->type != JSON_NUMBER || !g->is_int)
            return set_error(PARITY_ERR_CONFIG, "%s: %s.group_size is not an integer", at->path,
                             at->object);
        if (g->integer != 16)
            return set_error(PARITY_ERR_UNSUPPORTED, "%s: %s.group_size %lld is not supported "
                             "(NVFP4 blocks are 16 elements)", at->path, at->object,
                             (long long)g->integer);
    }
    c->method = QUANT_METHOD_NVFP4;
    TRY(read_module_list(q, "exclude_modules", at, c));
    return read_module_list(q, "ignore", at, c);
}

/* quant_method "fp8": block-wise FP8. */
static int parse_fp8(const json_value *q, const config_place *at, quant_checkpoint *c) {
    const char *fmt, *scheme, *scale_fmt;
    TRY(read_str(q, "fmt", at, &fmt));
    TRY(read_str(q, "activation_scheme", at, &scheme));
    TRY(read_str(q, "scale_fmt", at, &scale_fmt));
    if (fmt && strcmp(fmt, "e4m3"))
        return set_error(PARITY_ERR_UNSUPPORTED, "%s: %s.fmt '%s' is not supported (only e4m3)",
                         at->path, at->object, fmt);
    if (scheme && strcmp(scheme, "dynamic"))
        return set_error(PARITY_ERR_UNSUPPORTED, "%s: %s.activation_scheme '%s' is not supported "
                         "(only dynamic: activations quantized per token, per 1 x 128 group, at "
                         "each GEMM input)", at->path, at->object, scheme);
    if (scale_fmt && strcmp(scale_fmt, "ue8m0") && strcmp(scale_fmt, "float32") &&
        strcmp(scale_fmt, "float"))
        return set_error(PARITY_ERR_UNSUPPORTED, "%s: %s.scale_fmt '%s' is not supported (ue8m0, "
                         "float or float32)", at->path, at->object, scale_fmt);
    TRY(read_dequantize(q, at));
    const json_value *bs = json_get(q, "weight_block_size");
    if (!bs || bs->type == JSON_NULL)
        return set_error(PARITY_ERR_UNSUPPORTED, "%s: %s has no weight_block_size: per-tensor fp8 "
                         "is not supported (128 x 128 blocks are)", at->path, at->object);
    if (bs->type != JSON_ARRAY || bs->count != 2 || bs->items[0].type != JSON_NUMBER ||
        bs->items[1].type != JSON_NUMBER || !bs->items[0].is_int || !bs->items[1].is_int)
        return set_error(PARITY_ERR_CONFIG, "%s: %s.weight_block_size is not two integers",
                         at->path, at->object);
    if (bs->items[0].integer != 128 || bs->items[1].integer != 128)
        return set_error(PARITY_ERR_UNSUPPORTED, "%s: %s.weight_block_size [%lld, %lld] is not "
                         "supported (only [128, 128])", at->path, at->object,
                         (long long)bs->items[0].integer, (long long)bs->items[1].integer);
    c->method = QUANT_METHOD_FP8_BLOCK;
    c->scale_ue8m0 = scale_fmt && !strcmp(scale_fmt, "ue8m0");
    TRY(read_module_list(q, "modules_to_not_convert", at, c));
    return read_module_list(q, "ignored_layers", at, c);
}

static int parse_quant(const json_value *q, const config_place *at, quant_checkpoint *c) {
    if (q->type != JSON_OBJECT)
        return set_error(PARITY_ERR_CONFIG, "%s: %s is %s, expected an object", at->path,
                         at->object, json_type_name(q->type));
    const char *method;
    TRY(read_str(q, "quant_method", at, &method));
    if (!method)
        return set_error(PARITY_ERR_CONFIG, "%s: %s has no quant_method", at->path, at->object);
    if (!strcmp(method, "fp8")) return parse_fp8(q, at, c);
    if (!strcmp(method, "bitnet")) return parse_bitnet(q, at, c);
    if (!strcmp(method, "modelopt")) return parse_modelopt(q, at, c);
    if (!strcmp(method, "mxfp4")) {
        TRY(read_dequantize(q, at));
        c->method = QUANT_METHOD_MXFP4;
        return read_module_list(q, "modules_to_not_convert", at, c);
    }
    return set_error(PARITY_ERR_UNSUPPORTED, "%s: %s.quant_method '%s' is not supported (block-wise "
                     "\"fp8\", \"bitnet\", \"modelopt\" NVFP4 and \"mxfp4\" checkpoints are)",
                     at->path, at->object, method);
}

/* The document's member `key` through `parse` (nothing when it is absent or null). */
static int parse_doc(const char *text, size_t len, const char *path, const char *key,
                     int (*parse)(const json_value *, const config_place *, quant_checkpoint *),
                     quant_checkpoint *out) {
    *out = (quant_checkpoint){0};
    char err[256];
    json_doc *doc = NULL;
    int rc = json_parse(text, len, &doc, err, sizeof err);
    if (rc == PARITY_ERR_OUT_OF_MEMORY) return set_error(rc, "%s: out of memory parsing JSON", path);
    if (rc) return set_error(PARITY_ERR_JSON_SYNTAX, "%s: %s", path, err);
    const json_value *root = json_doc_root(doc);
    const json_value *q = root && root->type == JSON_OBJECT ? json_get(root, key) : NULL;
    const config_place at = {path, key};
    if (root && root->type != JSON_OBJECT)
        rc = set_error(PARITY_ERR_CONFIG, "%s: the document is %s, expected an object", path,
                       json_type_name(root->type));
    else if (q && q->type != JSON_NULL)
        rc = parse(q, &at, out);
    json_free(doc);
    if (rc) quant_checkpoint_free(out);
    return rc;
}

int quant_checkpoint_parse(const char *text, size_t len, const char *path, quant_checkpoint *out) {
    return parse_doc(text, len, path, "quantization_config", parse_quant, out);
}

static int parse_modelopt_object(const json_value *q, const config_place *at, quant_checkpoint *c) {
    if (q->type != JSON_OBJECT)
        return set_error(PARITY_ERR_CONFIG, "%s: %s is %s, expected an object", at->path,
                         at->object, json_type_name(q->type));
    return parse_modelopt(q, at, c);
}

int quant_checkpoint_parse_modelopt(const char *text, size_t len, const char *path,
                                    quant_checkpoint *out) {
    int rc = parse_doc(text, len, path, "quantization", parse_modelopt_object, out);
    if (rc == PARITY_OK && out->method == QUANT_METHOD_NONE)
        rc = set_error(PARITY_ERR_CONFIG, "%s: no \"quantization\" object (ModelOpt writes "
                       "{\"quantization\": {\"quant_algo\": ...}})", path);
    return rc;
}

/* Whether a list entry names the module: equal, a dotted prefix of it ("model.layers.0"
 * keeps a whole layer), a dotted suffix ("down_proj", "mlp.down_proj": every layer's), or a
 * shell pattern matching it ("model.layers.1.*"). */
static int entry_names(const char *entry, const char *module) {
    if (strpbrk(entry, "*?[")) return fnmatch(entry, module, 0) == 0;
    const size_t n = strlen(entry), m = strlen(module);
    if (!n || n >= m) return n == m && !strcmp(entry, module);
    if (!strncmp(module, entry, n) && module[n] == '.') return 1;
    return module[m - n - 1] == '.' && !strcmp(module + m - n, entry);
}

int quant_checkpoint_keeps(const quant_checkpoint *c, const char *weight_name) {
    char module[96];
    const size_t n = strlen(weight_name);
    if (n < 7 || n - 7 >= sizeof module || strcmp(weight_name + n - 7, ".weight")) return 0;
    memcpy(module, weight_name, n - 7);
    module[n - 7] = '\0';
    for (size_t i = 0; i < c->n_not_converted; i++)
        if (entry_names(c->not_converted[i], module)) return 1;
    return 0;
}
