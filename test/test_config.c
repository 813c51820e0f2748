/* config.json parsing and validation (lib/checkpoint/config_json.c, lib/model/config.c): the real configs of the built-in models
 * in the old and new forms, the rope scaling types, transformers' defaults, and every class of
 * bad input with its status and a message naming the file and the field; the mixture-of-experts
 * fields of qwen3_moe and qwen2_moe (defaults, the num_local_experts alias, the sparse-layer
 * rule, refusals, validation). Files are in test/data/configs/. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "check.h"
#include "base/errors.h"
#include "checkpoint/config_json.h"
#include "model/config.h"
#include "model/model.h"

static int load(const char *name, parity_config *c) {
    char path[1024];
    snprintf(path, sizeof path, "%s/test/data/configs/%s", source_root(), name);
    return parity_config_load(path, c);
}

static int parse(const char *text, parity_config *c) {
    clear_error();
    return config_parse(text, strlen(text), "mem.json", c);
}

/* The last error message mentions `what`. */
#define CHECK_MESSAGE(what)                                                              \
    do {                                                                                 \
        check_count++;                                                                   \
        if (!strstr(parity_last_error(), (what))) {                                      \
            check_failures++;                                                            \
            fprintf(stderr, "%s:%d: message \"%s\" does not mention \"%s\"\n", __FILE__, \
                    __LINE__, parity_last_error(), (what));                              \
        }                                                                                \
    } while (0)

/* The configs refused: each a file in test/data/configs (test_bad_files) or the members added
 * to a small valid one (test_bad_fields), with the status and a word the message must name. */
typedef struct refusal {
    const char *file, *members;
    int status;
    const char *mention;
} refusal;

static const refusal refusals[] = {
    {"bad-missing-hidden-size.json", NULL, PARITY_ERR_CONFIG, "hidden_size"},
    {"bad-wrong-type.json", NULL, PARITY_ERR_CONFIG, "num_hidden_layers"},
    {"bad-negative.json", NULL, PARITY_ERR_CONFIG, "vocab_size"},
    {"bad-heads-not-divisible.json", NULL, PARITY_ERR_CONFIG, "num_key_value_heads"},
    {"bad-rope-dynamic.json", NULL, PARITY_ERR_UNSUPPORTED, "dynamic"},
    {"bad-hidden-act-gelu.json", NULL, PARITY_ERR_UNSUPPORTED, "gelu"},
    {"bad-json-trailing-comma.json", NULL, PARITY_ERR_JSON_SYNTAX, "line "},
    {"bad-duplicate-key.json", NULL, PARITY_ERR_CONFIG, "head_dim"},
    {NULL, ", \"vocab_size\": 1}", PARITY_ERR_JSON_SYNTAX, "mem.json"},
    {NULL, ", \"head_dim\": 16.0", PARITY_ERR_CONFIG, "head_dim"},
    {NULL, ", \"head_dim\": 1e2", PARITY_ERR_CONFIG, "head_dim"},
    {NULL, ", \"head_dim\": 0", PARITY_ERR_CONFIG, "head_dim"},
    {NULL, ", \"head_dim\": -16", PARITY_ERR_CONFIG, "head_dim"},
    {NULL, ", \"head_dim\": 4294967296", PARITY_ERR_CONFIG, "head_dim"},
    {NULL, ", \"head_dim\": 15", PARITY_ERR_CONFIG, "head_dim"},
    {NULL, ", \"head_dim\": true", PARITY_ERR_CONFIG, "head_dim"},
    {NULL, ", \"num_key_value_heads\": 3", PARITY_ERR_CONFIG, "num_key_value_heads"},
    {NULL, ", \"num_key_value_heads\": \"2\"", PARITY_ERR_CONFIG, "num_key_value_heads"},
    {NULL, ", \"max_position_embeddings\": 0", PARITY_ERR_CONFIG, "max_position_embeddings"},
    {NULL, ", \"rms_norm_eps\": \"1e-6\"", PARITY_ERR_CONFIG, "rms_norm_eps"},
    {NULL, ", \"rms_norm_eps\": 0", PARITY_ERR_CONFIG, "rms_norm_eps"},
    {NULL, ", \"rms_norm_eps\": -1e-6", PARITY_ERR_CONFIG, "rms_norm_eps"},
    {NULL, ", \"rms_norm_eps\": 1e-50", PARITY_ERR_CONFIG, "rms_norm_eps"},
    {NULL, ", \"rope_theta\": \"1e6\"", PARITY_ERR_CONFIG, "rope_theta"},
    {NULL, ", \"rope_theta\": -10000", PARITY_ERR_CONFIG, "rope_theta"},
    {NULL, ", \"rope_theta\": 1e39", PARITY_ERR_CONFIG, "rope_theta"},
    {NULL, ", \"tie_word_embeddings\": 1", PARITY_ERR_CONFIG, "tie_word_embeddings"},
    {NULL, ", \"hidden_act\": 7", PARITY_ERR_CONFIG, "hidden_act"},
    {NULL, ", \"hidden_act\": \"gelu_pytorch_tanh\"", PARITY_ERR_UNSUPPORTED, "gelu_pytorch_tanh"},
    {NULL, ", \"torch_dtype\": 16", PARITY_ERR_CONFIG, "torch_dtype"},
    {NULL, ", \"dtype\": [\"bfloat16\"]", PARITY_ERR_CONFIG, "dtype"},
    {NULL, ", \"attention_bias\": true", PARITY_ERR_UNSUPPORTED, "attention_bias"},
    {NULL, ", \"mlp_bias\": true", PARITY_ERR_UNSUPPORTED, "mlp_bias"},
    {NULL, ", \"use_sliding_window\": true", PARITY_ERR_UNSUPPORTED, "use_sliding_window"},
    {NULL, ", \"partial_rotary_factor\": 0.5", PARITY_ERR_UNSUPPORTED, "partial_rotary_factor"},
    {NULL, ", \"vocab_size\": 300", PARITY_ERR_CONFIG, "vocab_size"}, /* duplicate key */
    {NULL, ", \"x\": {\"a\": 1, \"a\": 2}", PARITY_ERR_CONFIG, "'a'"},
    {NULL, ", \"rope_scaling\": \"yarn\"", PARITY_ERR_CONFIG, "rope_scaling"},
    {NULL, ", \"rope_parameters\": []", PARITY_ERR_CONFIG, "rope_parameters"},
    {NULL, ", \"rope_scaling\": {\"rope_type\": \"longrope\"}", PARITY_ERR_UNSUPPORTED, "longrope"},
    {NULL, ", \"rope_scaling\": {\"type\": \"mrope\"}", PARITY_ERR_UNSUPPORTED, "mrope"},
    {NULL, ", \"rope_scaling\": {\"rope_type\": 3}", PARITY_ERR_CONFIG, "rope_scaling.rope_type"},
    {NULL, ", \"rope_scaling\": {\"rope_type\": \"linear\"}", PARITY_ERR_CONFIG,
     "rope_scaling.factor"},
    {NULL, ", \"rope_scaling\": {\"rope_type\": \"linear\", \"factor\": \"2\"}", PARITY_ERR_CONFIG,
     "rope_scaling.factor"},
    {NULL, ", \"rope_scaling\": {\"rope_type\": \"linear\", \"factor\": 0}", PARITY_ERR_CONFIG,
     "rope_scaling.factor"},
    {NULL, ", \"rope_scaling\": {\"rope_type\": \"linear\", \"factor\": 2, \"factor\": 3}",
     PARITY_ERR_CONFIG, "factor"},
    {NULL, ", \"rope_scaling\": {\"rope_type\": \"llama3\", \"factor\": 8, "
     "\"high_freq_factor\": 4}",
     PARITY_ERR_CONFIG, "rope_scaling.low_freq_factor"},
    {NULL, ", \"rope_scaling\": {\"rope_type\": \"llama3\", \"factor\": 8, \"low_freq_factor\": 4, "
     "\"high_freq_factor\": 4}", PARITY_ERR_CONFIG, "high_freq_factor"},
    {NULL, ", \"rope_parameters\": {\"rope_type\": \"llama3\", \"factor\": 8, "
     "\"low_freq_factor\": 1, \"high_freq_factor\": 4, "
     "\"original_max_position_embeddings\": 8192.5}",
     PARITY_ERR_CONFIG, "rope_parameters.original_max_position_embeddings"},
    {NULL, ", \"rope_scaling\": {\"rope_type\": \"yarn\"}", PARITY_ERR_CONFIG,
     "rope_scaling.factor"},
    {NULL, ", \"rope_scaling\": {\"rope_type\": \"yarn\", \"factor\": 4, \"truncate\": 1}",
     PARITY_ERR_CONFIG, "rope_scaling.truncate"},
    {NULL, ", \"rope_scaling\": {\"rope_type\": \"yarn\", \"factor\": 4, \"attention_factor\": 0}",
     PARITY_ERR_CONFIG, "rope_scaling.attention_factor"},
    {NULL, ", \"rope_scaling\": {\"rope_type\": \"yarn\", \"factor\": 4, \"beta_fast\": -1}",
     PARITY_ERR_CONFIG, "beta_fast"},
    {NULL, ", \"rope_scaling\": {\"rope_type\": \"yarn\", \"factor\": 4, \"mscale\": \"1\"}",
     PARITY_ERR_CONFIG, "rope_scaling.mscale"},
    {NULL, ", \"rope_scaling\": {\"rope_type\": \"yarn\", \"factor\": 4, "
     "\"partial_rotary_factor\": 0.25}", PARITY_ERR_UNSUPPORTED, "partial_rotary_factor"},
};

/* Field-by-field equality, naming the first field that differs. */
static int same_config(const parity_config *a, const parity_config *b, const char *what) {
#define SAME(f)                                                                             \
    if (a->f != b->f) {                                                                     \
        fprintf(stderr, "%s: field %s differs: %.17g != %.17g\n", what, #f, (double)a->f,   \
                (double)b->f);                                                              \
        return 0;                                                                           \
    }
    SAME(size) SAME(arch) SAME(vocab_size) SAME(hidden_size) SAME(intermediate_size)
    SAME(num_hidden_layers) SAME(num_attention_heads) SAME(num_key_value_heads) SAME(head_dim)
    SAME(max_position_embeddings) SAME(tie_word_embeddings) SAME(attention_bias) SAME(qk_norm)
    SAME(rms_norm_eps) SAME(rope_theta) SAME(rope_type) SAME(rope_factor)
    SAME(rope_low_freq_factor) SAME(rope_high_freq_factor)
    SAME(rope_original_max_position_embeddings) SAME(rope_beta_fast) SAME(rope_beta_slow)
    SAME(rope_attention_factor) SAME(rope_mscale) SAME(rope_mscale_all_dim) SAME(rope_truncate)
    SAME(num_experts) SAME(num_experts_per_tok) SAME(moe_intermediate_size)
    SAME(shared_expert_intermediate_size) SAME(norm_topk_prob) SAME(decoder_sparse_step)
#undef SAME
    if (memcmp(a->mlp_only_layers, b->mlp_only_layers, sizeof a->mlp_only_layers)) {
        fprintf(stderr, "%s: field mlp_only_layers differs\n", what);
        return 0;
    }
    return 1;
}

static void test_builtins(void) {
    const char *const *names = parity_config_builtin_names();
    size_t n = 0;
    for (; names[n]; n++) {
        parity_config c;
        CHECK_OK(parity_config_builtin(names[n], &c));
        CHECK_INT(c.size, sizeof(parity_config));
        CHECK_OK(config_validate(&c));
    }
    CHECK_INT(n, 13);

    parity_config c;
    CHECK_OK(parity_config_builtin("tiny", &c));
    CHECK_FIELDS(FIELD(c, arch, PARITY_ARCH_QWEN3), FIELD(c, vocab_size, 256),
                 FIELD(c, hidden_size, 64), FIELD(c, intermediate_size, 160),
                 FIELD(c, num_hidden_layers, 2), FIELD(c, num_attention_heads, 4),
                 FIELD(c, num_key_value_heads, 2), FIELD(c, head_dim, 16),
                 FIELD(c, max_position_embeddings, 512), FIELD(c, rope_type, PARITY_ROPE_DEFAULT));
    CHECK(c.rms_norm_eps == 1e-6f && c.rope_theta == 1e4);
    CHECK(c.qk_norm == 1 && c.tie_word_embeddings == 0 && c.attention_bias == 0);

    CHECK_OK(parity_config_builtin("llama3.2-1b", &c));
    CHECK_INT(c.rope_type, PARITY_ROPE_LLAMA3);
    CHECK(c.rope_factor == 32.0f && c.rope_low_freq_factor == 1.0f &&
          c.rope_high_freq_factor == 4.0f);
    CHECK_INT(c.rope_original_max_position_embeddings, 8192);

    CHECK_STATUS(parity_config_builtin("qwen3-7b", &c), PARITY_ERR_INVALID_ARGUMENT);
    CHECK_MESSAGE("qwen3-7b");
    CHECK_STATUS(parity_config_builtin(NULL, &c), PARITY_ERR_INVALID_ARGUMENT);
    CHECK_STATUS(parity_config_builtin("tiny", NULL), PARITY_ERR_INVALID_ARGUMENT);
}

/* The published config.json of each built-in model parses to the built-in. */
static void test_real_configs(void) {
    static const struct {
        const char *file, *builtin;
    } pairs[] = {
        {"qwen3-0.6b.json", "qwen3-0.6b"},
        {"qwen3-0.6b-v5.json", "qwen3-0.6b"},
        {"qwen2.5-0.5b.json", "qwen2.5-0.5b"},
        {"llama3.2-1b.json", "llama3.2-1b"},
        {"qwen3-30b-a3b.json", "qwen3-30b-a3b"},
        {"qwen2-57b-a14b.json", "qwen2-57b-a14b"},
    };
    for (size_t i = 0; i < sizeof pairs / sizeof pairs[0]; i++) {
        parity_config got, want;
        CHECK_OK(load(pairs[i].file, &got));
        CHECK(parity_last_error()[0] == '\0');
        CHECK_OK(parity_config_builtin(pairs[i].builtin, &want));
        CHECK(same_config(&got, &want, pairs[i].file));
    }
}

static void test_rope_configs(void) {
    parity_config c;
    CHECK_OK(load("qwen3-yarn.json", &c));
    CHECK_INT(c.rope_type, PARITY_ROPE_YARN);
    CHECK(c.rope_factor == 4.0f);
    CHECK_INT(c.rope_original_max_position_embeddings, 32768);
    CHECK_INT(c.max_position_embeddings, 40960);
    CHECK(c.rope_beta_fast == 32.0f && c.rope_beta_slow == 1.0f);
    CHECK(c.rope_attention_factor == 0.0f && c.rope_mscale == 0.0f &&
          c.rope_mscale_all_dim == 0.0f);
    CHECK_INT(c.rope_truncate, 1);
    CHECK(c.rope_theta == 1e6);

    CHECK_OK(load("qwen3-yarn-v5.json", &c));
    CHECK_INT(c.rope_type, PARITY_ROPE_YARN);
    CHECK(c.rope_theta == 10000.0);
    CHECK(c.rope_factor == 40.0f);
    CHECK_INT(c.rope_original_max_position_embeddings, 4096);
    CHECK_INT(c.max_position_embeddings, 163840);
    CHECK(c.rope_beta_fast == 16.0f && c.rope_beta_slow == 2.0f);
    CHECK(c.rope_mscale == 0.707f && c.rope_mscale_all_dim == 0.707f);
    CHECK_INT(c.rope_truncate, 0);

    CHECK_OK(load("llama-linear.json", &c));
    CHECK_INT(c.rope_type, PARITY_ROPE_LINEAR);
    CHECK(c.rope_factor == 2.0f);
    CHECK_INT(c.head_dim, 64); /* hidden 2048 / 32 heads */
    CHECK(c.rope_theta == 500000.0);
}

static void test_bad_files(void) {
    for (size_t i = 0; i < sizeof refusals / sizeof refusals[0]; i++) {
        if (!refusals[i].file) continue;
        parity_config c;
        memset(&c, 0xab, sizeof c);
        parity_config before = c;
        CHECK_STATUS(load(refusals[i].file, &c), refusals[i].status);
        CHECK_MESSAGE(refusals[i].file);
        CHECK_MESSAGE(refusals[i].mention);
        CHECK(memcmp(&c, &before, sizeof c) == 0); /* output untouched on failure */
    }

    parity_config c;
    CHECK_STATUS(load("no-such-file.json", &c), PARITY_ERR_IO);
    CHECK_MESSAGE("no-such-file.json");
    CHECK_MESSAGE("No such file");
    char dir[1024];
    snprintf(dir, sizeof dir, "%s/test/data/configs", source_root());
    CHECK_STATUS(parity_config_load(dir, &c), PARITY_ERR_IO);
    CHECK_STATUS(parity_config_load(NULL, &c), PARITY_ERR_INVALID_ARGUMENT);
    CHECK_STATUS(parity_config_load(dir, NULL), PARITY_ERR_INVALID_ARGUMENT);
    /* A success clears the previous message. */
    CHECK_OK(load("qwen3-0.6b.json", &c));
    CHECK(parity_last_error()[0] == '\0');

    /* Larger than 16 MB: refused before parsing. */
    char big[] = "/tmp/parity_test_config_XXXXXX";
    int fd = mkstemp(big);
    CHECK(fd >= 0);
    if (fd >= 0) {
        FILE *fp = fdopen(fd, "w");
        static char spaces[1 << 16];
        memset(spaces, ' ', sizeof spaces);
        fputc('{', fp);
        for (int i = 0; i < 260; i++) fwrite(spaces, 1, sizeof spaces, fp);
        fputc('}', fp);
        fclose(fp);
        CHECK_STATUS(parity_config_load(big, &c), PARITY_ERR_CONFIG);
        CHECK_MESSAGE(big);
        unlink(big);
    }
}

/* A small valid qwen3 config with `extra` members appended. */
static int parse_with(const char *model_type, const char *extra, parity_config *c) {
    char text[4096];
    snprintf(text, sizeof text,
             "{\"model_type\": \"%s\", \"vocab_size\": 256, \"hidden_size\": 64, "
             "\"intermediate_size\": 160, \"num_hidden_layers\": 2, \"num_attention_heads\": 4%s}",
             model_type, extra);
    return parse(text, c);
}

static void test_defaults(void) {
    parity_config c;
    /* Qwen3Config: head_dim 128 when absent, max_position_embeddings 32768. */
    CHECK_OK(parse_with("qwen3", "", &c));
    CHECK_FIELDS(FIELD(c, arch, PARITY_ARCH_QWEN3), FIELD(c, head_dim, 128),
                 FIELD(c, num_key_value_heads, 4), FIELD(c, max_position_embeddings, 32768),
                 FIELD(c, rope_type, PARITY_ROPE_DEFAULT), FIELD(c, size, sizeof(parity_config)));
    CHECK(c.rms_norm_eps == 1e-6f && c.rope_theta == 10000.0);
    CHECK(c.tie_word_embeddings == 0 && c.attention_bias == 0 && c.qk_norm == 1);
    /* null head_dim and null num_key_value_heads: derived. */
    CHECK_OK(parse_with("qwen3", ", \"head_dim\": null, \"num_key_value_heads\": null", &c));
    CHECK_INT(c.head_dim, 16);
    CHECK_INT(c.num_key_value_heads, 4);
    /* LlamaConfig: head_dim hidden/heads, context 2048. */
    CHECK_OK(parse_with("llama", "", &c));
    CHECK_INT(c.arch, PARITY_ARCH_LLAMA);
    CHECK_INT(c.head_dim, 16);
    CHECK_INT(c.max_position_embeddings, 2048);
    CHECK(c.attention_bias == 0 && c.qk_norm == 0);
    /* Qwen2: q/k/v bias whatever attention_bias says (transformers hard-codes it). */
    CHECK_OK(parse_with("qwen2", "", &c));
    CHECK_INT(c.arch, PARITY_ARCH_QWEN2);
    CHECK(c.attention_bias == 1 && c.qk_norm == 0);
    CHECK_INT(c.head_dim, 16);
    CHECK_OK(parse_with("qwen2", ", \"attention_bias\": false", &c));
    CHECK_INT(c.attention_bias, 1);
    /* Given values. */
    CHECK_OK(parse_with("qwen3", ", \"num_key_value_heads\": 2, \"head_dim\": 32, "
                        "\"max_position_embeddings\": 1000, \"rms_norm_eps\": 1e-5, "
                        "\"rope_theta\": 123456.5, \"tie_word_embeddings\": true, "
                        "\"hidden_act\": \"silu\", \"torch_dtype\": \"float32\", "
                        "\"partial_rotary_factor\": 1.0, \"use_sliding_window\": false, "
                        "\"sliding_window\": null, \"attention_bias\": false", &c));
    CHECK_INT(c.num_key_value_heads, 2);
    CHECK_INT(c.head_dim, 32);
    CHECK_INT(c.max_position_embeddings, 1000);
    CHECK(c.rms_norm_eps == 1e-5f && c.rope_theta == 123456.5 && c.tie_word_embeddings == 1);
}

static void test_bad_fields(void) {
    for (size_t i = 0; i < sizeof refusals / sizeof refusals[0]; i++) {
        if (!refusals[i].members) continue;
        parity_config c;
        int rc = parse_with("qwen3", refusals[i].members, &c);
        check_count++;
        if (rc != refusals[i].status || !strstr(parity_last_error(), refusals[i].mention) ||
            !strstr(parity_last_error(), "mem.json")) {
            check_failures++;
            fprintf(stderr, "case %zu (%s): got %s \"%s\", expected %s mentioning \"%s\"\n", i,
                    refusals[i].members, parity_status_name(rc), parity_last_error(),
                    parity_status_name(refusals[i].status), refusals[i].mention);
        }
    }

    parity_config c;
    CHECK_STATUS(parse("[1, 2]", &c), PARITY_ERR_CONFIG);
    CHECK_STATUS(parse("", &c), PARITY_ERR_JSON_SYNTAX);
    CHECK_STATUS(parse("{\"rope_theta\": NaN}", &c), PARITY_ERR_JSON_SYNTAX);
    CHECK_STATUS(parse("{\"vocab_size\": 256}", &c), PARITY_ERR_CONFIG);
    CHECK_MESSAGE("model_type");
    CHECK_STATUS(parse("{\"model_type\": 3}", &c), PARITY_ERR_CONFIG);
    CHECK_STATUS(parse_with("mistral", "", &c), PARITY_ERR_UNSUPPORTED);
    CHECK_MESSAGE("mistral");
    CHECK_STATUS(parse("{\"model_type\": \"qwen3\", \"vocab_size\": 256, \"hidden_size\": null, "
                       "\"intermediate_size\": 160, \"num_hidden_layers\": 2, "
                       "\"num_attention_heads\": 4}", &c),
                 PARITY_ERR_CONFIG);
    CHECK_MESSAGE("hidden_size");
    /* head_dim derived from a hidden size the heads do not divide. */
    CHECK_STATUS(parse("{\"model_type\": \"llama\", \"vocab_size\": 256, \"hidden_size\": 60, "
                       "\"intermediate_size\": 160, \"num_hidden_layers\": 2, "
                       "\"num_attention_heads\": 8}", &c),
                 PARITY_ERR_CONFIG);
    CHECK_MESSAGE("head_dim");
    CHECK_STATUS(config_parse(NULL, 0, "x", &c), PARITY_ERR_INVALID_ARGUMENT);
}

static void test_rope_forms(void) {
    parity_config c;
    /* The new form: theta inside rope_parameters wins over the top level. */
    CHECK_OK(parse_with("qwen3", ", \"rope_theta\": 5.0, "
                        "\"rope_parameters\": {\"rope_type\": \"default\", \"rope_theta\": 1e6}",
                        &c));
    CHECK(c.rope_theta == 1e6);
    CHECK_INT(c.rope_type, PARITY_ROPE_DEFAULT);
    /* rope_parameters without a type: default. */
    CHECK_OK(parse_with("qwen3", ", \"rope_parameters\": {\"rope_theta\": 250000}", &c));
    CHECK(c.rope_theta == 250000.0);
    CHECK_INT(c.rope_type, PARITY_ROPE_DEFAULT);
    /* rope_scaling, when a non-empty object, is the dict; an empty one falls through. */
    CHECK_OK(parse_with("qwen3", ", \"rope_scaling\": {\"rope_type\": \"linear\", \"factor\": 3}, "
                        "\"rope_parameters\": {\"rope_type\": \"default\", \"rope_theta\": 1e6}",
                        &c));
    CHECK_INT(c.rope_type, PARITY_ROPE_LINEAR);
    CHECK(c.rope_factor == 3.0f && c.rope_theta == 10000.0);
    CHECK_OK(parse_with("qwen3", ", \"rope_scaling\": {}, "
                        "\"rope_parameters\": {\"rope_type\": \"linear\", \"factor\": 3, "
                        "\"rope_theta\": 1e6}", &c));
    CHECK_INT(c.rope_type, PARITY_ROPE_LINEAR);
    CHECK(c.rope_theta == 1e6);
    /* "rope_type" before the legacy "type". */
    CHECK_OK(parse_with("qwen3", ", \"rope_scaling\": {\"type\": \"dynamic\", \"rope_type\": "
                        "\"linear\", \"factor\": 2}", &c));
    CHECK_INT(c.rope_type, PARITY_ROPE_LINEAR);
    CHECK_OK(parse_with("qwen3", ", \"rope_scaling\": {\"type\": \"default\"}", &c));
    CHECK_INT(c.rope_type, PARITY_ROPE_DEFAULT);
    /* llama3: original_max_position_embeddings from the dict, the top level, or the context. */
    CHECK_OK(parse_with("llama", ", \"max_position_embeddings\": 4096, \"rope_scaling\": "
                        "{\"rope_type\": \"llama3\", \"factor\": 8, \"low_freq_factor\": 1, "
                        "\"high_freq_factor\": 4}", &c));
    CHECK_INT(c.rope_type, PARITY_ROPE_LLAMA3);
    CHECK_INT(c.rope_original_max_position_embeddings, 4096);
    CHECK_OK(parse_with("llama", ", \"original_max_position_embeddings\": 1024, \"rope_scaling\": "
                        "{\"rope_type\": \"llama3\", \"factor\": 8, \"low_freq_factor\": 1, "
                        "\"high_freq_factor\": 4, \"original_max_position_embeddings\": 8192}",
                        &c));
    CHECK_INT(c.rope_original_max_position_embeddings, 1024);
    /* yarn: factor null is derived; beta 0 or null is the default; truncate null is false. */
    CHECK_OK(parse_with("qwen3", ", \"max_position_embeddings\": 131072, \"rope_scaling\": "
                        "{\"rope_type\": \"yarn\", \"factor\": null, "
                        "\"original_max_position_embeddings\": 32768, \"beta_fast\": 0, "
                        "\"beta_slow\": null, \"truncate\": null, \"attention_factor\": null, "
                        "\"mscale\": null}", &c));
    CHECK_INT(c.rope_type, PARITY_ROPE_YARN);
    CHECK(c.rope_factor == 4.0f);
    CHECK(c.rope_beta_fast == 32.0f && c.rope_beta_slow == 1.0f);
    CHECK_INT(c.rope_truncate, 0);
    CHECK(c.rope_attention_factor == 0.0f && c.rope_mscale == 0.0f);
    CHECK_OK(parse_with("qwen3", ", \"rope_scaling\": {\"rope_type\": \"yarn\", \"factor\": 2.5, "
                        "\"attention_factor\": 1.25, \"beta_fast\": 24.5, \"truncate\": true}",
                        &c));
    CHECK(c.rope_factor == 2.5f && c.rope_attention_factor == 1.25f && c.rope_beta_fast == 24.5f);
    CHECK_INT(c.rope_truncate, 1);
    CHECK_INT(c.rope_original_max_position_embeddings, 32768);
}

/* c, a copy of base changed by stmt, fails validation with PARITY_ERR_CONFIG naming what. */
#define CHECK_INVALID(base, stmt, what)                          \
    do {                                                         \
        c = (base);                                              \
        stmt;                                                    \
        CHECK_STATUS(config_validate(&c), PARITY_ERR_CONFIG);    \
        CHECK_MESSAGE(what);                                     \
    } while (0)

static void test_validate(void) {
    parity_config base, c;
    CHECK_OK(parity_config_builtin("qwen3-0.6b", &base));
#define BAD(stmt, what) CHECK_INVALID(base, stmt, what)
    BAD(c.size = 4, "size");
    BAD(c.arch = 7, "arch");
    BAD(c.vocab_size = 0, "vocab_size");
    BAD(c.vocab_size = 1u << 24, "vocab_size");
    BAD(c.hidden_size = 1u << 20, "hidden_size");
    BAD(c.intermediate_size = 0, "intermediate_size");
    BAD(c.num_hidden_layers = 1024, "num_hidden_layers");
    BAD(c.num_key_value_heads = 3, "num_key_value_heads");
    BAD(c.num_key_value_heads = 0, "num_key_value_heads");
    BAD(c.head_dim = 127, "head_dim");
    BAD(c.max_position_embeddings = 0, "max_position_embeddings");
    BAD(c.tie_word_embeddings = 2, "tie_word_embeddings");
    BAD(c.rms_norm_eps = NAN, "rms_norm_eps");
    BAD(c.rms_norm_eps = 0.0f, "rms_norm_eps");
    BAD(c.rope_theta = INFINITY, "rope_theta");
    BAD(c.rope_theta = 0.0, "rope_theta");
    BAD(c.rope_type = 9, "rope_type");
    BAD((c.rope_type = PARITY_ROPE_LINEAR, c.rope_factor = 0.0f), "factor");
    BAD((c.rope_type = PARITY_ROPE_LLAMA3, c.rope_factor = 8.0f, c.rope_low_freq_factor = 4.0f,
         c.rope_high_freq_factor = 1.0f, c.rope_original_max_position_embeddings = 8192),
        "high_freq_factor");
    BAD((c.rope_type = PARITY_ROPE_LLAMA3, c.rope_factor = 8.0f, c.rope_low_freq_factor = 1.0f,
         c.rope_high_freq_factor = 4.0f, c.rope_original_max_position_embeddings = 0),
        "original_max_position_embeddings");
    BAD((c.rope_type = PARITY_ROPE_YARN, c.rope_factor = 4.0f,
         c.rope_original_max_position_embeddings = 32768, c.rope_beta_slow = 0.0f),
        "beta_slow");
    BAD((c.rope_type = PARITY_ROPE_YARN, c.rope_factor = 4.0f,
         c.rope_original_max_position_embeddings = 32768, c.rope_attention_factor = -1.0f),
        "attention_factor");
    BAD((c.rope_type = PARITY_ROPE_YARN, c.rope_factor = 4.0f,
         c.rope_original_max_position_embeddings = 32768, c.rope_truncate = 2),
        "truncate");
#undef BAD
    CHECK_STATUS(config_validate(NULL), PARITY_ERR_INVALID_ARGUMENT);
}

/* ---- mixture of experts ---------------------------------------------------------------- */

/* The layers of c that are sparse, as a bit mask (layer l: bit l). */
static unsigned sparse_mask(const parity_config *c) {
    unsigned mask = 0;
    for (uint32_t l = 0; l < c->num_hidden_layers && l < 32; l++)
        mask |= (unsigned)config_layer_is_sparse(c, l) << l;
    return mask;
}

/* The MoE built-ins: their fields and which layers are sparse. */
static void test_moe_builtins(void) {
    parity_config c;
    CHECK_OK(parity_config_builtin("qwen3-moe-tiny", &c));
    CHECK_FIELDS(FIELD(c, arch, PARITY_ARCH_QWEN3_MOE), FIELD(c, num_experts, 8),
                 FIELD(c, num_experts_per_tok, 2), FIELD(c, moe_intermediate_size, 32),
                 FIELD(c, shared_expert_intermediate_size, 0), FIELD(c, norm_topk_prob, 1),
                 FIELD(c, decoder_sparse_step, 1), FIELD(c, mlp_only_layers[0], 2),
                 FIELD(c, num_hidden_layers, 3), FIELD(c, qk_norm, 1),
                 FIELD(c, attention_bias, 0));
    CHECK_INT(sparse_mask(&c), 0x5); /* layers 0 and 2 sparse, 1 dense */
    CHECK_INT(config_sparse_layers(&c), 2);
    CHECK_OK(parity_config_builtin("qwen2-moe-tiny", &c));
    CHECK_FIELDS(FIELD(c, arch, PARITY_ARCH_QWEN2_MOE), FIELD(c, num_experts, 8),
                 FIELD(c, num_experts_per_tok, 4), FIELD(c, moe_intermediate_size, 32),
                 FIELD(c, shared_expert_intermediate_size, 48), FIELD(c, norm_topk_prob, 0),
                 FIELD(c, decoder_sparse_step, 1), FIELD(c, mlp_only_layers[0], 0),
                 FIELD(c, attention_bias, 1), FIELD(c, qk_norm, 0));
    CHECK_INT(sparse_mask(&c), 0x7);
    CHECK_OK(parity_config_builtin("qwen3-30b-a3b", &c));
    CHECK_INT(config_sparse_layers(&c), 48);
    CHECK_OK(parity_config_builtin("qwen1.5-moe-a2.7b", &c));
    CHECK_FIELDS(FIELD(c, num_experts, 60), FIELD(c, num_experts_per_tok, 4),
                 FIELD(c, shared_expert_intermediate_size, 5632), FIELD(c, norm_topk_prob, 0));
    CHECK_INT(config_sparse_layers(&c), 24);
    /* the dense architectures have no sparse layer */
    CHECK_OK(parity_config_builtin("tiny", &c));
    CHECK_INT(config_sparse_layers(&c), 0);
}

/* The MoE members every qwen3_moe / qwen2_moe parse_with below starts from. */
#define MOE_FIELDS ", \"num_experts\": 8, \"num_experts_per_tok\": 2, \"moe_intermediate_size\": 32"
#define SHARED ", \"shared_expert_intermediate_size\": 48"

/* config.json of qwen3_moe and qwen2_moe: transformers' defaults, the alias, the layer rule. */
static void test_moe_fields(void) {
    parity_config c;
    /* Qwen3MoeConfig: norm_topk_prob false, decoder_sparse_step 1, mlp_only_layers [], and no
     * head_dim field, so hidden / heads (16) rather than Qwen3Config's 128 */
    CHECK_OK(parse_with("qwen3_moe", MOE_FIELDS, &c));
    CHECK_FIELDS(FIELD(c, arch, PARITY_ARCH_QWEN3_MOE), FIELD(c, num_experts, 8),
                 FIELD(c, num_experts_per_tok, 2), FIELD(c, moe_intermediate_size, 32),
                 FIELD(c, shared_expert_intermediate_size, 0), FIELD(c, norm_topk_prob, 0),
                 FIELD(c, decoder_sparse_step, 1), FIELD(c, mlp_only_layers[0], 0),
                 FIELD(c, head_dim, 16), FIELD(c, qk_norm, 1), FIELD(c, attention_bias, 0));
    CHECK_INT(sparse_mask(&c), 0x3);
    /* Qwen2MoeConfig: qkv_bias true, head_dim hidden / heads */
    CHECK_OK(parse_with("qwen2_moe", MOE_FIELDS SHARED, &c));
    CHECK_FIELDS(FIELD(c, arch, PARITY_ARCH_QWEN2_MOE),
                 FIELD(c, shared_expert_intermediate_size, 48), FIELD(c, norm_topk_prob, 0),
                 FIELD(c, decoder_sparse_step, 1), FIELD(c, head_dim, 16), FIELD(c, qk_norm, 0),
                 FIELD(c, attention_bias, 1));
    CHECK_OK(parse_with("qwen2_moe", MOE_FIELDS SHARED ", \"qkv_bias\": true", &c));
    CHECK_INT(c.attention_bias, 1);
    /* given values; null mlp_only_layers is [] (transformers: None -> []) */
    CHECK_OK(parse_with("qwen3_moe", MOE_FIELDS ", \"norm_topk_prob\": true, "
                        "\"decoder_sparse_step\": 2, \"mlp_only_layers\": null, \"head_dim\": 32",
                        &c));
    CHECK_FIELDS(FIELD(c, norm_topk_prob, 1), FIELD(c, decoder_sparse_step, 2),
                 FIELD(c, mlp_only_layers[0], 0), FIELD(c, head_dim, 32));
    CHECK_INT(sparse_mask(&c), 0x2); /* (l + 1) % 2 == 0: layer 1 */
    CHECK_OK(parse_with("qwen3_moe", MOE_FIELDS ", \"mlp_only_layers\": [1, 0, 1]", &c));
    CHECK_INT(c.mlp_only_layers[0], 3);
    CHECK_INT(sparse_mask(&c), 0);
    CHECK_OK(parse_with("qwen3_moe", MOE_FIELDS ", \"mlp_only_layers\": [0]", &c));
    CHECK_INT(sparse_mask(&c), 0x2);
    /* num_local_experts: newer transformers' name, alone or agreeing */
    CHECK_OK(parse_with("qwen3_moe", ", \"num_local_experts\": 6, \"num_experts_per_tok\": 2, "
                        "\"moe_intermediate_size\": 32", &c));
    CHECK_INT(c.num_experts, 6);
    CHECK_OK(parse_with("qwen3_moe", MOE_FIELDS ", \"num_local_experts\": 8", &c));
    CHECK_INT(c.num_experts, 8);
    /* a stray shared width of 0 on qwen3_moe is no shared expert */
    CHECK_OK(parse_with("qwen3_moe", MOE_FIELDS ", \"shared_expert_intermediate_size\": 0", &c));
    CHECK_INT(c.shared_expert_intermediate_size, 0);
    /* a dense model_type ignores MoE members, as transformers' dense configs do */
    CHECK_OK(parse_with("qwen3", MOE_FIELDS, &c));
    CHECK_INT(c.num_experts, 0);
}

/* Each refused MoE config.json: status and a word of the message. */
static void test_moe_refusals(void) {
    static const struct {
        const char *model_type, *members;
        int status;
        const char *mention;
    } cases[] = {
        {"qwen3_moe", ", \"num_experts_per_tok\": 2, \"moe_intermediate_size\": 32",
         PARITY_ERR_CONFIG, "num_experts"},
        {"qwen3_moe", ", \"num_experts\": 8, \"moe_intermediate_size\": 32", PARITY_ERR_CONFIG,
         "num_experts_per_tok"},
        {"qwen3_moe", ", \"num_experts\": 8, \"num_experts_per_tok\": 2", PARITY_ERR_CONFIG,
         "moe_intermediate_size"},
        {"qwen3_moe", ", \"num_experts\": 8, \"num_experts_per_tok\": 9, "
                      "\"moe_intermediate_size\": 32", PARITY_ERR_CONFIG, "num_experts_per_tok"},
        {"qwen3_moe", ", \"num_experts\": 0, \"num_experts_per_tok\": 1, "
                      "\"moe_intermediate_size\": 32", PARITY_ERR_CONFIG, "num_experts"},
        {"qwen3_moe", ", \"num_experts\": 8.5, \"num_experts_per_tok\": 1, "
                      "\"moe_intermediate_size\": 32", PARITY_ERR_CONFIG, "num_experts"},
        {"qwen3_moe", MOE_FIELDS ", \"num_local_experts\": 16", PARITY_ERR_CONFIG,
         "num_local_experts"},
        {"qwen3_moe", MOE_FIELDS ", \"mlp_only_layers\": [2]", PARITY_ERR_CONFIG,
         "mlp_only_layers[0]"},
        {"qwen3_moe", MOE_FIELDS ", \"mlp_only_layers\": [0, -1]", PARITY_ERR_CONFIG,
         "mlp_only_layers[1]"},
        {"qwen3_moe", MOE_FIELDS ", \"mlp_only_layers\": [0.5]", PARITY_ERR_CONFIG,
         "mlp_only_layers[0]"},
        {"qwen3_moe", MOE_FIELDS ", \"mlp_only_layers\": [\"1\"]", PARITY_ERR_CONFIG,
         "mlp_only_layers[0]"},
        {"qwen3_moe", MOE_FIELDS ", \"mlp_only_layers\": 1", PARITY_ERR_CONFIG, "mlp_only_layers"},
        {"qwen3_moe", MOE_FIELDS ", \"mlp_only_layers\": {}", PARITY_ERR_CONFIG, "an array"},
        {"qwen3_moe", MOE_FIELDS ", \"decoder_sparse_step\": 0", PARITY_ERR_CONFIG,
         "decoder_sparse_step"},
        {"qwen3_moe", MOE_FIELDS ", \"norm_topk_prob\": 1", PARITY_ERR_CONFIG, "norm_topk_prob"},
        {"qwen3_moe", MOE_FIELDS SHARED, PARITY_ERR_CONFIG, "shared_expert_intermediate_size"},
        {"qwen3_moe", MOE_FIELDS ", \"shared_expert_intermediate_size\": \"48\"",
         PARITY_ERR_CONFIG, "shared_expert_intermediate_size"},
        {"qwen2_moe", MOE_FIELDS, PARITY_ERR_CONFIG, "shared_expert_intermediate_size"},
        {"qwen2_moe", MOE_FIELDS SHARED ", \"qkv_bias\": false", PARITY_ERR_UNSUPPORTED,
         "qkv_bias"},
        {"qwen3_moe", MOE_FIELDS ", \"attention_bias\": true", PARITY_ERR_UNSUPPORTED,
         "attention_bias"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        parity_config c;
        const int rc = parse_with(cases[i].model_type, cases[i].members, &c);
        check_count++;
        if (rc != cases[i].status || !strstr(parity_last_error(), cases[i].mention) ||
            !strstr(parity_last_error(), "mem.json")) {
            check_failures++;
            fprintf(stderr, "MoE case %zu (%s%s): got %s \"%s\", expected %s mentioning \"%s\"\n",
                    i, cases[i].model_type, cases[i].members, parity_status_name(rc),
                    parity_last_error(), parity_status_name(cases[i].status), cases[i].mention);
        }
    }
    /* a layer past the set's 1024, num_hidden_layers saying there are that many: refused before
     * the bit is set (config_validate's layer limit comes after; the set would be written past
     * its end, as ASan saw) */
    parity_config c;
    CHECK_STATUS(parse("{\"model_type\": \"qwen3_moe\", \"vocab_size\": 256, \"hidden_size\": 64, "
                       "\"intermediate_size\": 160, \"num_hidden_layers\": 2000000001, "
                       "\"num_attention_heads\": 4, \"num_experts\": 8, \"num_experts_per_tok\": 2, "
                       "\"moe_intermediate_size\": 32, \"mlp_only_layers\": [1100, 2000000000]}",
                       &c),
                 PARITY_ERR_CONFIG);
    CHECK(strstr(parity_last_error(), "mlp_only_layers[0]") != NULL);
}

/* parity_config validation of the MoE fields, on built-ins changed one field at a time. */
static void test_moe_validate(void) {
    parity_config dense, moe3, moe2, c;
    CHECK_OK(parity_config_builtin("tiny", &dense));
    CHECK_OK(parity_config_builtin("qwen3-moe-tiny", &moe3));
    CHECK_OK(parity_config_builtin("qwen2-moe-tiny", &moe2));
#define BAD CHECK_INVALID
    /* MoE fields on a dense architecture */
    BAD(dense, c.num_experts = 8, "qwen3_moe and qwen2_moe only");
    BAD(dense, c.num_experts_per_tok = 2, "qwen3_moe and qwen2_moe only");
    BAD(dense, c.moe_intermediate_size = 32, "qwen3_moe and qwen2_moe only");
    BAD(dense, c.shared_expert_intermediate_size = 32, "qwen3_moe and qwen2_moe only");
    BAD(dense, c.norm_topk_prob = 1, "qwen3_moe and qwen2_moe only");
    BAD(dense, c.decoder_sparse_step = 1, "qwen3_moe and qwen2_moe only");
    BAD(dense, c.mlp_only_layers[15] = 1, "qwen3_moe and qwen2_moe only");
    /* out of range */
    BAD(moe3, c.num_experts = 0, "num_experts");
    BAD(moe3, c.num_experts = 4097, "num_experts");
    BAD(moe3, c.num_experts_per_tok = 0, "num_experts_per_tok");
    BAD(moe3, c.num_experts_per_tok = 9, "num_experts_per_tok");
    BAD(moe3, (c.num_experts = 128, c.num_experts_per_tok = 65), "num_experts_per_tok");
    BAD(moe3, c.moe_intermediate_size = 0, "moe_intermediate_size");
    BAD(moe3, c.shared_expert_intermediate_size = 48, "no shared expert");
    BAD(moe2, c.shared_expert_intermediate_size = 0, "shared_expert_intermediate_size");
    BAD(moe3, c.norm_topk_prob = 2, "norm_topk_prob");
    BAD(moe3, c.decoder_sparse_step = 0, "decoder_sparse_step");
    BAD(moe3, c.mlp_only_layers[0] |= 1u << 3, "mlp_only_layers");
    BAD(moe2, c.mlp_only_layers[15] = 1ull << 63, "layer 1023");
#undef BAD
    c = moe3;
    c.num_experts = 4096;
    c.num_experts_per_tok = 64;
    CHECK_OK(config_validate(&c));
}

int main(void) {
    test_builtins();
    test_moe_builtins();
    test_moe_fields();
    test_moe_refusals();
    test_moe_validate();
    test_real_configs();
    test_rope_configs();
    test_bad_files();
    test_defaults();
    test_bad_fields();
    test_rope_forms();
    test_validate();
    return check_report("test_config");
}
