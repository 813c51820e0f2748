/* config.json -> parity_config. (lib/model/config.c validates the values and holds the built-in
 * configs.)
 *
 * Reads Hugging Face configs of model_type "qwen2" (Qwen2, Qwen2.5), "qwen3", "llama"
 * (Llama 3.x), "ouro" and the mixtures of experts "qwen3_moe" and "qwen2_moe" (read_moe) in
 * both forms transformers writes: the old one (`torch_dtype`, top-level
 * `rope_theta`, `rope_scaling`) and the new one (`dtype`, `rope_parameters` holding
 * `rope_theta` and the scaling parameters). A field that is absent takes the default of the
 * transformers config class (Qwen2Config, Qwen3Config, LlamaConfig); JSON null counts as
 * absent except where transformers gives null its own meaning (head_dim, yarn's factor).
 *
 *   required                 vocab_size, hidden_size, intermediate_size, num_hidden_layers,
 *                            num_attention_heads (integers in 1..2^32-1), model_type
 *   num_key_value_heads      num_attention_heads
 *   head_dim                 absent: 128 for qwen3 (Qwen3Config), hidden/heads otherwise
 *                            (qwen3_moe too: Qwen3MoeConfig has no head_dim); null:
 *                            hidden/heads
 *   max_position_embeddings  32768 (qwen2, qwen3), 2048 (llama)
 *   rms_norm_eps             1e-6
 *   rope_theta               10000 (rope_parameters.rope_theta wins over the top level)
 *   tie_word_embeddings      false
 *   attention_bias           qwen2: q/k/v always have a bias (Qwen2Attention hard-codes it,
 *                            the key is ignored); qwen3, llama: false, and true (a bias on
 *                            q/k/v and o_proj) is unsupported
 *   hidden_act               "silu"; anything else is unsupported
 *
 * The rope dict is `rope_scaling` when it is a non-empty object, else `rope_parameters`
 * (transformers: `rope_scaling or self.rope_parameters`); its type is "rope_type", else
 * "type", else "default". Types default, linear (factor), llama3 (factor, low_freq_factor,
 * high_freq_factor) and yarn (factor; attention_factor, beta_fast, beta_slow, mscale,
 * mscale_all_dim, truncate) are read; any other type is PARITY_ERR_UNSUPPORTED. llama3 and
 * yarn take original_max_position_embeddings from the top level if it is there, else from
 * the dict, else max_position_embeddings (standardize_rope_params). Yarn follows
 * transformers 5: an explicit factor is used as given; factor null means
 * max_position_embeddings / original_max_position_embeddings.
 *
 * Unsupported features are refused rather than ignored: use_sliding_window true,
 * partial_rotary_factor != 1, mlp_bias true. Duplicate keys anywhere in the file are a
 * PARITY_ERR_CONFIG. */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/alloc.h"
#include "base/errors.h"
#include "base/files.h"
#include "config_json.h"
#include "json.h"
#include "model/config.h"

#define CONFIG_MAX_BYTES (16u * 1024u * 1024u)

/* ---- parsing ------------------------------------------------------------------------------ */

typedef struct reader {
    const char *path; /* for messages */
} reader;

static const char *type_name(const json_value *v) {
    return v->type == JSON_NUMBER && v->is_int ? "an integer" : json_type_name(v->type);
}

/* The member, or NULL when it is absent or null. */
static const json_value *member(const json_value *obj, const char *key) {
    const json_value *v = obj ? json_get(obj, key) : NULL;
    return v && v->type != JSON_NULL ? v : NULL;
}

static int wrong_type(const reader *r, const char *field, const json_value *v, const char *want) {
    return set_error(PARITY_ERR_CONFIG, "%s: field '%s' must be %s, got %s", r->path, field, want,
                     type_name(v));
}

static int missing(const reader *r, const char *field) {
    return set_error(PARITY_ERR_CONFIG, "%s: required field '%s' is missing or null", r->path,
                     field);
}

/* A positive integer that fits uint32. *out is left alone when the field is absent or null and
 * not required. */
static int read_uint(const reader *r, const json_value *obj, const char *key, const char *field,
                     int required, uint32_t *out) {
    const json_value *v = member(obj, key);
    if (!v) return required ? missing(r, field) : PARITY_OK;
    if (v->type != JSON_NUMBER || !v->is_int) {
        if (v->type == JSON_NUMBER)
            return set_error(PARITY_ERR_CONFIG, "%s: field '%s' must be an integer, got %.17g",
                             r->path, field, v->number);
        return wrong_type(r, field, v, "an integer");
    }
    if (v->integer < 1 || v->integer > (int64_t)UINT32_MAX)
        return set_error(PARITY_ERR_CONFIG, "%s: field '%s' must be in 1..4294967295, got %lld",
                         r->path, field, (long long)v->integer);
    *out = (uint32_t)v->integer;
    return PARITY_OK;
}

/* A number; *present says whether the field was there (not absent, not null). */
static int read_number(const reader *r, const json_value *obj, const char *key, const char *field,
                       int *present, double *out) {
    const json_value *v = member(obj, key);
    *present = v != NULL;
    if (!v) return PARITY_OK;
    if (v->type != JSON_NUMBER) return wrong_type(r, field, v, "a number");
    *out = v->number;
    return PARITY_OK;
}

/* A number that must be finite and > 0 and fit a float (the struct holds floats). */
static int read_positive_float(const reader *r, const json_value *obj, const char *key,
                               const char *field, int required, float *out) {
    int present;
    double x = 0.0;
    TRY(read_number(r, obj, key, field, &present, &x));
    if (!present) return required ? missing(r, field) : PARITY_OK;
    if (!(x > 0.0) || !isfinite((float)x))
        return set_error(PARITY_ERR_CONFIG, "%s: field '%s' must be > 0 and fit a float, got %.17g",
                         r->path, field, x);
    *out = (float)x;
    return PARITY_OK;
}

static int read_bool(const reader *r, const json_value *obj, const char *key, const char *field,
                     uint32_t *out) {
    const json_value *v = member(obj, key);
    if (!v) return PARITY_OK;
    if (v->type != JSON_TRUE && v->type != JSON_FALSE) return wrong_type(r, field, v, "a boolean");
    *out = v->type == JSON_TRUE;
    return PARITY_OK;
}

/* A string member, NULL when absent or null. */
static int read_string(const reader *r, const json_value *obj, const char *key, const char *field,
                       const char **out) {
    const json_value *v = member(obj, key);
    *out = NULL;
    if (!v) return PARITY_OK;
    if (v->type != JSON_STRING) return wrong_type(r, field, v, "a string");
    *out = v->str;
    return PARITY_OK;
}

/* Every object in the tree, checked for a key that appears twice. */
static int check_duplicates(const reader *r, const json_value *v) {
    if (v->type == JSON_OBJECT) {
        long dup = json_find_duplicate_key(v);
        if (dup >= 0)
            return set_error(PARITY_ERR_CONFIG, "%s: key '%s' appears twice in an object", r->path,
                             v->keys[dup]);
    }
    if (v->type == JSON_OBJECT || v->type == JSON_ARRAY)
        for (size_t i = 0; i < v->count; i++) TRY(check_duplicates(r, &v->items[i]));
    return PARITY_OK;
}

/* partial_rotary_factor: only 1 (rotate the whole head) is supported. */
static int check_partial_rotary(const reader *r, const json_value *obj, const char *field) {
    int present;
    double x = 1.0;
    TRY(read_number(r, obj, "partial_rotary_factor", field, &present, &x));
    if (present && x != 1.0)
        return set_error(PARITY_ERR_UNSUPPORTED, "%s: %s = %g is not supported (only 1)", r->path,
                         field, x);
    return PARITY_OK;
}

/* The rope fields: theta, type and scaling parameters, old or new form. */
static int read_rope(const reader *r, const json_value *root, parity_config *c) {
    const json_value *scaling = member(root, "rope_scaling");
    const json_value *params = member(root, "rope_parameters");
    if (scaling && scaling->type != JSON_OBJECT)
        return wrong_type(r, "rope_scaling", scaling, "an object or null");
    if (params && params->type != JSON_OBJECT)
        return wrong_type(r, "rope_parameters", params, "an object or null");
    const json_value *d = NULL;
    const char *dname = NULL;
    if (scaling && scaling->count > 0) {
        d = scaling;
        dname = "rope_scaling";
    } else if (params && params->count > 0) {
        d = params;
        dname = "rope_parameters";
    }
    char f[96];
#define FIELD(key) (snprintf(f, sizeof f, "%s.%s", dname, key), f)

    int present;
    double theta = 10000.0;
    TRY(read_number(r, root, "rope_theta", "rope_theta", &present, &theta));
    if (d) TRY(read_number(r, d, "rope_theta", FIELD("rope_theta"), &present, &theta));
    c->rope_theta = theta;
    TRY(check_partial_rotary(r, root, "partial_rotary_factor"));
    if (!d) {
        c->rope_type = PARITY_ROPE_DEFAULT;
        return PARITY_OK;
    }
    TRY(check_partial_rotary(r, d, FIELD("partial_rotary_factor")));

    const char *type;
    TRY(read_string(r, d, "rope_type", FIELD("rope_type"), &type));
    if (!type) TRY(read_string(r, d, "type", FIELD("type"), &type));
    if (!type || strcmp(type, "default") == 0) {
        c->rope_type = PARITY_ROPE_DEFAULT;
        return PARITY_OK;
    }
    if (strcmp(type, "linear") == 0)
        c->rope_type = PARITY_ROPE_LINEAR;
    else if (strcmp(type, "llama3") == 0)
        c->rope_type = PARITY_ROPE_LLAMA3;
    else if (strcmp(type, "yarn") == 0)
        c->rope_type = PARITY_ROPE_YARN;
    else
        return set_error(PARITY_ERR_UNSUPPORTED,
                         "%s: %s.rope_type '%s' is not supported "
                         "(default, linear, llama3, yarn)",
                         r->path, dname, type);

    if (c->rope_type == PARITY_ROPE_LINEAR)
        return read_positive_float(r, d, "factor", FIELD("factor"), 1, &c->rope_factor);

    /* standardize_rope_params: the top-level original_max_position_embeddings has priority,
     * then the dict's, then max_position_embeddings. */
    c->rope_original_max_position_embeddings = c->max_position_embeddings;
    TRY(read_uint(r, d, "original_max_position_embeddings",
                  FIELD("original_max_position_embeddings"), 0,
                  &c->rope_original_max_position_embeddings));
    TRY(read_uint(r, root, "original_max_position_embeddings", "original_max_position_embeddings",
                  0, &c->rope_original_max_position_embeddings));

    if (c->rope_type == PARITY_ROPE_LLAMA3) {
        TRY(read_positive_float(r, d, "factor", FIELD("factor"), 1, &c->rope_factor));
        TRY(read_positive_float(r, d, "low_freq_factor", FIELD("low_freq_factor"), 1,
                                &c->rope_low_freq_factor));
        TRY(read_positive_float(r, d, "high_freq_factor", FIELD("high_freq_factor"), 1,
                                &c->rope_high_freq_factor));
        return PARITY_OK;
    }

    /* yarn: `factor` is a required key; null derives it from the context lengths. */
    const json_value *fv = json_get(d, "factor");
    if (!fv) return missing(r, FIELD("factor"));
    if (fv->type == JSON_NULL)
        c->rope_factor = (float)((double)c->max_position_embeddings /
                                 (double)c->rope_original_max_position_embeddings);
    else
        TRY(read_positive_float(r, d, "factor", FIELD("factor"), 1, &c->rope_factor));
    /* `get("beta_fast") or 32`: absent, null and 0 all mean the default. */
    double x = 0.0;
    TRY(read_number(r, d, "beta_fast", FIELD("beta_fast"), &present, &x));
    if (present && x != 0.0) c->rope_beta_fast = (float)x;
    TRY(read_number(r, d, "beta_slow", FIELD("beta_slow"), &present, &x));
    if (present && x != 0.0) c->rope_beta_slow = (float)x;
    TRY(read_positive_float(r, d, "attention_factor", FIELD("attention_factor"), 0,
                            &c->rope_attention_factor));
    TRY(read_number(r, d, "mscale", FIELD("mscale"), &present, &x));
    if (present) c->rope_mscale = (float)x;
    TRY(read_number(r, d, "mscale_all_dim", FIELD("mscale_all_dim"), &present, &x));
    if (present) c->rope_mscale_all_dim = (float)x;
    /* `rope_parameters.get("truncate", True)`: null is falsy. */
    const json_value *tv = json_get(d, "truncate");
    if (tv && tv->type == JSON_NULL)
        c->rope_truncate = 0;
    else
        TRY(read_bool(r, d, "truncate", FIELD("truncate"), &c->rope_truncate));
    return PARITY_OK;
#undef FIELD
}

/* The struct with every field at its neutral value: default rope, yarn's defaults. */
static void config_init(parity_config *c) {
    memset(c, 0, sizeof *c);
    c->size = sizeof(parity_config);
    c->rope_type = PARITY_ROPE_DEFAULT;
    c->rope_factor = 1.0f;
    c->rope_beta_fast = 32.0f;
    c->rope_beta_slow = 1.0f;
    c->rope_truncate = 1;
    c->total_ut_steps = 1;
}

/* The mixture-of-experts fields of a qwen3_moe or qwen2_moe config.json, with the defaults of
 * transformers' Qwen3MoeConfig / Qwen2MoeConfig where a field may be absent (norm_topk_prob
 * false, decoder_sparse_step 1, mlp_only_layers []); num_experts is also read under the name
 * newer transformers writes, num_local_experts. */
static int read_moe(const reader *r, const json_value *root, parity_config *c) {
    uint32_t experts = 0, local = 0;
    TRY(read_uint(r, root, "num_experts", "num_experts", 0, &experts));
    TRY(read_uint(r, root, "num_local_experts", "num_local_experts", 0, &local));
    if (experts && local && experts != local)
        return set_error(PARITY_ERR_CONFIG,
                         "%s: num_experts (%u) and num_local_experts (%u) disagree", r->path,
                         experts, local);
    c->num_experts = experts ? experts : local;
    if (!c->num_experts) return missing(r, "num_experts");
    TRY(read_uint(r, root, "num_experts_per_tok", "num_experts_per_tok", 1,
                  &c->num_experts_per_tok));
    TRY(read_uint(r, root, "moe_intermediate_size", "moe_intermediate_size", 1,
                  &c->moe_intermediate_size));
    if (c->arch == PARITY_ARCH_QWEN2_MOE) {
        TRY(read_uint(r, root, "shared_expert_intermediate_size",
                      "shared_expert_intermediate_size", 1, &c->shared_expert_intermediate_size));
        uint32_t qkv_bias = 1;
        TRY(read_bool(r, root, "qkv_bias", "qkv_bias", &qkv_bias));
        if (!qkv_bias)
            return set_error(PARITY_ERR_UNSUPPORTED,
                             "%s: qkv_bias false is not supported for qwen2_moe", r->path);
    } else {
        /* Qwen3-MoE has no shared expert: a stray 0 is accepted, a width is refused by
         * config_validate rather than dropped along with the expert it describes */
        const json_value *v = member(root, "shared_expert_intermediate_size");
        if (!v || v->type != JSON_NUMBER || !v->is_int || v->integer != 0)
            TRY(read_uint(r, root, "shared_expert_intermediate_size",
                          "shared_expert_intermediate_size", 0,
                          &c->shared_expert_intermediate_size));
    }
    TRY(read_bool(r, root, "norm_topk_prob", "norm_topk_prob", &c->norm_topk_prob));
    c->decoder_sparse_step = 1;
    TRY(read_uint(r, root, "decoder_sparse_step", "decoder_sparse_step", 0,
                  &c->decoder_sparse_step));
    const json_value *only = member(root, "mlp_only_layers");
    if (!only) return PARITY_OK;
    if (only->type != JSON_ARRAY) return wrong_type(r, "mlp_only_layers", only, "an array");
    /* the set holds layers 0..1023 (config_validate refuses more layers, after this) */
    const uint32_t layers = c->num_hidden_layers < 1024 ? c->num_hidden_layers : 1024;
    for (size_t i = 0; i < only->count; i++) {
        const json_value *v = &only->items[i];
        if (v->type != JSON_NUMBER || !v->is_int || v->integer < 0 ||
            v->integer >= (int64_t)layers)
            return set_error(PARITY_ERR_CONFIG,
                             "%s: mlp_only_layers[%zu] must be a layer index in 0..%u", r->path, i,
                             layers - 1);
        const uint32_t l = (uint32_t)v->integer;
        c->mlp_only_layers[l / 64] |= (uint64_t)1 << (l % 64);
    }
    return PARITY_OK;
}

static int parse_tree(const reader *r, const json_value *root, parity_config *c) {
    if (root->type != JSON_OBJECT)
        return set_error(PARITY_ERR_CONFIG, "%s: the top level is %s, not an object", r->path,
                         type_name(root));
    TRY(check_duplicates(r, root));

    const char *model_type;
    TRY(read_string(r, root, "model_type", "model_type", &model_type));
    if (!model_type) return missing(r, "model_type");
    uint32_t head_dim_absent = 0; /* head_dim when the key is absent; 0 = hidden / heads */
    c->max_position_embeddings = 32768;
    parity_arch arch;
    if (parity_arch_from_name(model_type, &arch) != PARITY_OK) {
        char why[256];
        snprintf(why, sizeof why, "%s", parity_last_error());
        return set_error(PARITY_ERR_UNSUPPORTED, "%s: model_type is not supported: %s", r->path,
                         why);
    }
    c->arch = arch;
    switch (arch) {
    case PARITY_ARCH_QWEN2:
        c->attention_bias = 1;
        break;
    case PARITY_ARCH_QWEN3:
        c->qk_norm = 1;
        head_dim_absent = 128;
        break;
    case PARITY_ARCH_LLAMA:
        c->max_position_embeddings = 2048;
        break;
    case PARITY_ARCH_QWEN2_MOE:
        c->attention_bias = 1; /* Qwen2MoeConfig's qkv_bias, true by default */
        break;
    case PARITY_ARCH_QWEN3_MOE:
        /* No head_dim default of 128 as Qwen3's: transformers' Qwen3MoeConfig has no head_dim
         * field (configuration_qwen3_moe.py @008e5743) and Qwen3MoeAttention takes
         * getattr(config, "head_dim", config.hidden_size // config.num_attention_heads)
         * (modeling_qwen3_moe.py @00d4b3d2), so an absent head_dim is hidden / heads. */
        c->qk_norm = 1;
        break;
    case PARITY_ARCH_OURO:
        /* configuration_ouro.py's defaults */
        c->total_ut_steps = 4;
        c->early_exit_gate = 1;
        c->early_exit_threshold = 1.0f;
        break;
    }

    static const struct {
        const char *key;
        size_t offset;
        int required;
    } ints[] = {
        {"vocab_size", offsetof(parity_config, vocab_size), 1},
        {"hidden_size", offsetof(parity_config, hidden_size), 1},
        {"intermediate_size", offsetof(parity_config, intermediate_size), 1},
        {"num_hidden_layers", offsetof(parity_config, num_hidden_layers), 1},
        {"num_attention_heads", offsetof(parity_config, num_attention_heads), 1},
        {"num_key_value_heads", offsetof(parity_config, num_key_value_heads), 0},
        {"max_position_embeddings", offsetof(parity_config, max_position_embeddings), 0},
    };
    for (size_t i = 0; i < sizeof ints / sizeof ints[0]; i++) {
        uint32_t *field = (uint32_t *)((char *)c + ints[i].offset);
        TRY(read_uint(r, root, ints[i].key, ints[i].key, ints[i].required, field));
    }
    if (!c->num_key_value_heads) c->num_key_value_heads = c->num_attention_heads;

    const json_value *hd = json_get(root, "head_dim");
    if (hd && hd->type != JSON_NULL) {
        TRY(read_uint(r, root, "head_dim", "head_dim", 1, &c->head_dim));
    } else if (!hd && head_dim_absent) {
        c->head_dim = head_dim_absent;
    } else {
        if (c->hidden_size % c->num_attention_heads != 0)
            return set_error(PARITY_ERR_CONFIG,
                             "%s: head_dim is not given and hidden_size (%u) is not "
                             "a multiple of num_attention_heads (%u)",
                             r->path, c->hidden_size, c->num_attention_heads);
        c->head_dim = c->hidden_size / c->num_attention_heads;
    }

    c->rms_norm_eps = 1e-6f;
    TRY(read_positive_float(r, root, "rms_norm_eps", "rms_norm_eps", 0, &c->rms_norm_eps));
    TRY(read_bool(r, root, "tie_word_embeddings", "tie_word_embeddings", &c->tie_word_embeddings));

    uint32_t flag = 0;
    TRY(read_bool(r, root, "attention_bias", "attention_bias", &flag));
    if (flag && c->arch != PARITY_ARCH_QWEN2 && c->arch != PARITY_ARCH_QWEN2_MOE)
        return set_error(PARITY_ERR_UNSUPPORTED,
                         "%s: attention_bias true (a bias on q/k/v and o_proj) "
                         "is not supported for model_type '%s'",
                         r->path, model_type);
    flag = 0;
    TRY(read_bool(r, root, "mlp_bias", "mlp_bias", &flag));
    if (flag)
        return set_error(PARITY_ERR_UNSUPPORTED, "%s: mlp_bias true is not supported", r->path);
    flag = 0;
    TRY(read_bool(r, root, "use_sliding_window", "use_sliding_window", &flag));
    if (flag)
        return set_error(PARITY_ERR_UNSUPPORTED, "%s: use_sliding_window true is not supported",
                         r->path);

    if (arch == PARITY_ARCH_OURO) {
        TRY(read_uint(r, root, "total_ut_steps", "total_ut_steps", 0, &c->total_ut_steps));
        /* ouro_rl's use_early_exit_gate: false for a fixed-loop model without the gate */
        TRY(read_bool(r, root, "use_early_exit_gate", "use_early_exit_gate", &c->early_exit_gate));
        int present;
        double thr = 1.0;
        TRY(read_number(r, root, "early_exit_threshold", "early_exit_threshold", &present, &thr));
        if (present && !(thr >= 0.0 && thr <= 1.0))
            return set_error(PARITY_ERR_CONFIG,
                             "%s: field 'early_exit_threshold' must be in 0..1, got %.17g", r->path,
                             thr);
        c->early_exit_threshold = (float)thr;
    }

    if (arch == PARITY_ARCH_QWEN2_MOE || arch == PARITY_ARCH_QWEN3_MOE) TRY(read_moe(r, root, c));

    const char *s;
    TRY(read_string(r, root, "hidden_act", "hidden_act", &s));
    if (s && strcmp(s, "silu") != 0)
        return set_error(PARITY_ERR_UNSUPPORTED, "%s: hidden_act '%s' is not supported (only silu)",
                         r->path, s);
    TRY(read_string(r, root, "torch_dtype", "torch_dtype", &s));
    TRY(read_string(r, root, "dtype", "dtype", &s));

    return read_rope(r, root, c);
}

int config_parse(const char *text, size_t len, const char *path, parity_config *out) {
    if (!text || !out)
        return set_error(PARITY_ERR_INVALID_ARGUMENT, "config text or output is NULL");
    reader r = {path ? path : "config.json"};
    char err[256];
    json_doc *doc = NULL;
    int rc = json_parse(text, len, &doc, err, sizeof err);
    if (rc == PARITY_ERR_OUT_OF_MEMORY)
        return set_error(rc, "%s: out of memory parsing JSON: %s", r.path, err);
    if (rc) return set_error(PARITY_ERR_JSON_SYNTAX, "%s: %s", r.path, err);

    parity_config c;
    config_init(&c);
    rc = parse_tree(&r, json_doc_root(doc), &c);
    json_free(doc);
    if (rc) return rc;
    TRY(error_prefixed(r.path, config_validate(&c)));
    *out = c;
    return PARITY_OK;
}

int parity_config_load(const char *path, parity_config *out) {
    clear_error();
    if (!path || !out) return set_error(PARITY_ERR_INVALID_ARGUMENT, "path or output is NULL");
    char *text = NULL;
    size_t len = 0;
    int rc = read_file_capped(path, CONFIG_MAX_BYTES, PARITY_ERR_CONFIG, &text, &len);
    if (rc == PARITY_OK) rc = config_parse(text, len, path, out);
    px_free(text);
    return rc;
}

