/* Loading and saving checkpoints, on files this test writes itself into a scratch directory:
 *   1. Round trip at real size: synthetic qwen3-0.6b saved as bf16 safetensors and loaded back
 *      has the same config and scores bitwise the same log-probs (preset aligned).
 *   2. Variants of a saved synthetic tiny model, rewritten tensor by tensor with the small
 *      safetensors writer below:
 *      a. F32 weights equal to the bf16 ones score bitwise the same under every preset; F32
 *         weights a quarter bf16 ulp away (RNE gives back the same bf16) score bitwise the
 *         same under the bf16 presets, while "fp32" reads the masters (different, but close);
 *      b. F16 weights score bitwise as an F32 file of the same (exactly widened) values;
 *      c. sharded with model.safetensors.index.json, and data at unaligned offsets: bitwise
 *         the same as the single aligned file;
 *      d. every way a checkpoint can be wrong gets its own status, a message naming the
 *         tensor, field or file, and leaves *out untouched;
 *      e. bad "synthetic:" specs are refused;
 *      f. rotary_emb.inv_freq tensors are accepted and ignored;
 *      g. fp16 policies read F32 masters rounded once to fp16 (bitwise as an F16 file of
 *         those values, unlike one rounded through bf16), and a value beyond fp16's range is
 *         refused when an fp16 scorer is made, naming the tensor and element; an fp8 gemm
 *         quantizes the F32 masters themselves (its codes and scales are the quantizer's on
 *         the masters, not on their bf16 cast). */
#include <ftw.h>
#include <math.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "ckpt_files.h"
#include "fixtures.h"
#include "base/floats.h"
#include "checkpoint/fp4_packed.h"
#include "checkpoint/layout_bitnet.h"
#include "model/model.h"
#include "quant/codecs.h"
#include "quant/quant_weight.h"
#include "quant/rules.h"

#define TINY_LEN 48
#define SHARD1 "model-00001-of-00002.safetensors"
#define SHARD2 "model-00002-of-00002.safetensors"

static const char *const all_presets[] = {"fp32", "hf-eager", "aligned", NULL};
static const char *const bf16_presets[] = {"hf-eager", "aligned", NULL};

static char root[PATH_LEN];          /* scratch directory */
static char tiny_dir[PATH_LEN];      /* synthetic:tiny:5 as parity_model_save wrote it */
static int32_t tiny_tokens[TINY_LEN];

/* ---- files (ckpt_files.h has the helpers) ------------------------------------------------- */

/* A new directory root/name holding a copy of the tiny model's config.json. */
static void variant_dir(const char *name, char *dir) {
    join(dir, root, name);
    CHECK(mkdir(dir, 0700) == 0);
    free(copy_file_in(tiny_dir, dir, "config.json"));
}


/* ---- checkpoints in memory (ckpt_files.h), their values converted to and from F16 -------- */

/* fp32 -> IEEE binary16 rounded toward zero (tiny's weights are far below the f16 range). */
static uint16_t f16_truncated(float x) {
    uint32_t u;
    memcpy(&u, &x, 4);
    uint16_t sign = (uint16_t)((u >> 16) & 0x8000u);
    int e = (int)((u >> 23) & 0xffu) - 127;
    uint32_t mant = u & 0x7fffffu;
    if (e > 15) return sign | 0x7bffu;
    if (e >= -14) return sign | (uint16_t)((uint32_t)(e + 15) << 10) | (uint16_t)(mant >> 13);
    if (e >= -24) return sign | (uint16_t)((mant | 0x800000u) >> (-e - 1));
    return sign;
}

/* binary16 -> fp32, exact (finite values). */
static float f16_widened(uint16_t h) {
    unsigned e = (h >> 10) & 0x1fu, m = h & 0x3ffu;
    float mag = e ? ldexpf((float)(0x400u | m), (int)e - 25) : ldexpf((float)m, -24);
    return (h & 0x8000u) ? -mag : mag;
}

static uint32_t f16_truncated_bits(uint32_t u, uint32_t unused) {
    (void)unused;
    return f16_truncated(f32_from_bits(u));
}

static uint32_t f16_widened_bits(uint32_t h, uint32_t unused) {
    (void)unused;
    return f32_bits(f16_widened((uint16_t)h));
}

static void ckpt_f32_to_f16(ckpt *c) { ckpt_convert(c, NULL, 4, "F16", 2, f16_truncated_bits, 0); }

static void ckpt_f16_to_f32(ckpt *c) { ckpt_convert(c, NULL, 2, "F32", 4, f16_widened_bits, 0); }

/* root/name/model.safetensors from c. */
static void write_variant(const char *name, const ckpt *c, size_t extra_pad, char *dir) {
    char path[PATH_LEN];
    variant_dir(name, dir);
    join(path, dir, "model.safetensors");
    write_st(path, c->t, c->n, extra_pad);
}

/* The first `split` tensors of c go to SHARD1, the rest to SHARD2. */
static void write_shards(const char *dir, const ckpt *c, size_t split) {
    char path[PATH_LEN];
    join(path, dir, SHARD1);
    write_st(path, c->t, split, 0);
    join(path, dir, SHARD2);
    write_st(path, c->t + split, c->n - split, 0);
}

/* model.safetensors.index.json mapping names[i] -> shards[i]. */
static void write_index(const char *dir, const char *const *names, const char *const *shards,
                        size_t n) {
    size_t cap = 128 + n * 256, len = 0;
    char *text = malloc(cap), path[PATH_LEN];
    len += (size_t)snprintf(text, cap, "{\"metadata\": {\"total_size\": 0}, \"weight_map\": {");
    for (size_t i = 0; i < n; i++)
        len += (size_t)snprintf(text + len, cap - len, "%s\n  \"%s\": \"%s\"", i ? "," : "",
                                names[i], shards[i]);
    len += (size_t)snprintf(text + len, cap - len, "\n}}\n");
    join(path, dir, "model.safetensors.index.json");
    write_all(path, text, len);
    free(text);
}

/* ---- loading and scoring ---------------------------------------------------------------- */

/* Log-probs of one sequence (n_threads 2, max_tokens 64). */
static void score(const parity_model *m, const char *preset, const int32_t *tokens,
                  uint32_t len, float *lp) {
    memset(lp, 0xff, (len - 1) * sizeof *lp);
    parity_scorer *s = new_scorer(m, (fixture){.policy = preset, .n_threads = 2, .max_tokens = 64});
    if (!s) return;
    score_raw(s, tokens, &len, 1, lp);
    parity_scorer_free(s);
}

/* Models a and b score the tiny sequence bitwise the same under each preset. */
static void check_same_scores(const parity_model *a, const parity_model *b,
                              const char *const *presets, const char *what) {
    CHECK(a && b);
    if (!a || !b) return;
    for (size_t i = 0; presets[i]; i++) {
        float la[TINY_LEN - 1], lb[TINY_LEN - 1];
        char label[256];
        score(a, presets[i], tiny_tokens, TINY_LEN, la);
        score(b, presets[i], tiny_tokens, TINY_LEN, lb);
        snprintf(label, sizeof label, "%s, preset %s", what, presets[i]);
        CHECK_BITS_F32(la, lb, TINY_LEN - 1, label);
    }
}

static void check_config_equal(const parity_config *a, const parity_config *b) {
#define SAME(f) CHECK(a->f == b->f)
    SAME(size);
    SAME(arch);
    SAME(vocab_size);
    SAME(hidden_size);
    SAME(intermediate_size);
    SAME(num_hidden_layers);
    SAME(num_attention_heads);
    SAME(num_key_value_heads);
    SAME(head_dim);
    SAME(max_position_embeddings);
    SAME(tie_word_embeddings);
    SAME(attention_bias);
    SAME(qk_norm);
    SAME(rms_norm_eps);
    SAME(rope_theta);
    SAME(rope_type);
    SAME(rope_factor);
    SAME(rope_low_freq_factor);
    SAME(rope_high_freq_factor);
    SAME(rope_original_max_position_embeddings);
    SAME(rope_beta_fast);
    SAME(rope_beta_slow);
    SAME(rope_attention_factor);
    SAME(rope_mscale);
    SAME(rope_mscale_all_dim);
    SAME(rope_truncate);
#undef SAME
}

/* ---- 1. round trip at real size --------------------------------------------------------- */

static void test_real_size(void) {
    parity_model *m = NULL;
    CHECK_OK(parity_model_open("synthetic:qwen3-0.6b:1", &m));
    if (!m) return;
    parity_config c0 = *parity_model_config(m), builtin;
    CHECK_OK(parity_config_builtin("qwen3-0.6b", &builtin));
    check_config_equal(&c0, &builtin);
    int32_t tokens[12];
    for (uint32_t i = 0; i < 12; i++) tokens[i] = (int32_t)((i * 40503u + 17u) % c0.vocab_size);
    float before[11], after[11];
    score(m, "aligned", tokens, 12, before);

    char dir[PATH_LEN], path[PATH_LEN];
    join(dir, root, "qwen3-0.6b");
    CHECK(mkdir(dir, 0700) == 0);
    CHECK_OK(parity_model_save(m, dir));
    parity_model_free(m);

    /* a tied Qwen3 checkpoint: 11 tensors a layer, embed_tokens and norm; no lm_head */
    join(path, dir, "model.safetensors");
    st_file *f = NULL;
    CHECK_OK(st_open(path, &f));
    if (f) {
        CHECK_INT(f->n_tensors, 2 + 11 * c0.num_hidden_layers);
        CHECK(st_find(f, "lm_head.weight") == NULL);
        for (size_t i = 0; i < f->n_tensors; i++) CHECK_INT(f->tensors[i].dtype, ST_BF16);
        printf("qwen3-0.6b: saved %zu bf16 tensors, %zu bytes\n", f->n_tensors, f->size);
        st_close(f);
    }

    m = load(dir);
    if (m) {
        check_config_equal(&c0, parity_model_config(m));
        score(m, "aligned", tokens, 12, after);
        CHECK_BITS_F32(before, after, 11, "qwen3-0.6b saved and loaded, preset aligned");
        printf("qwen3-0.6b: aligned log-probs after the round trip: %.7f %.7f ... %.7f\n",
               (double)after[0], (double)after[1], (double)after[10]);
        parity_model_free(m);
    }
    remove_tree(dir);
}

/* ---- 2. variants of the tiny model ------------------------------------------------------ */

/* a. F32 and b. F16 weights. */
static void test_float_dtypes(const parity_model *orig, const ckpt *base) {
    char dir[PATH_LEN], dir2[PATH_LEN];
    ckpt exact, quarter, half, half_wide;

    ckpt_copy(&exact, base);
    ckpt_bf16_to_f32(&exact, 0);
    write_variant("f32-exact", &exact, 0, dir);
    parity_model *m = load(dir);
    check_same_scores(orig, m, all_presets, "F32 holding bf16 values");
    parity_model_free(m);

    ckpt_copy(&quarter, base);
    ckpt_bf16_to_f32(&quarter, 0x4000u); /* + 1/4 ulp of bf16: RNE gives the bf16 back */
    write_variant("f32-quarter-ulp", &quarter, 0, dir);
    m = load(dir);
    check_same_scores(orig, m, bf16_presets, "F32 a quarter ulp off");
    if (m) {
        float a[TINY_LEN - 1], b[TINY_LEN - 1];
        score(orig, "fp32", tiny_tokens, TINY_LEN, a);
        score(m, "fp32", tiny_tokens, TINY_LEN, b);
        double max_d = 0;
        int n_diff = 0;
        for (int i = 0; i < TINY_LEN - 1; i++) {
            max_d = fmax(max_d, fabs((double)a[i] - (double)b[i]));
            n_diff += memcmp(&a[i], &b[i], 4) != 0;
        }
        printf("F32 a quarter ulp off, preset fp32: %d of %d log-probs differ, max |d| %.3g\n",
               n_diff, TINY_LEN - 1, max_d);
        CHECK(n_diff > 0);
        CHECK(max_d < 1e-2);
    }
    /* the copying path: data not aligned for F32 (or BF16) in the file */
    write_variant("f32-unaligned", &quarter, 2, dir2);
    parity_model *u = load(dir2);
    check_same_scores(m, u, all_presets, "F32 at offsets 2 mod 4");
    parity_model_free(u);
    parity_model_free(m);

    ckpt_copy(&half, &quarter);
    ckpt_f32_to_f16(&half);
    ckpt_copy(&half_wide, &half);
    ckpt_f16_to_f32(&half_wide);
    write_variant("f16", &half, 0, dir);
    write_variant("f16-as-f32", &half_wide, 0, dir2);
    m = load(dir);
    u = load(dir2);
    check_same_scores(m, u, all_presets, "F16 against the same values in F32");
    parity_model_free(u);
    parity_model_free(m);

    ckpt_free(&half_wide);
    ckpt_free(&half);
    ckpt_free(&quarter);
    ckpt_free(&exact);
}

/* g. fp16 policies read the checkpoint's own values in fp16: F32 masters rounded once to fp16
 * (never through bf16), F16 values as they are; a value beyond fp16's range is refused when
 * the first fp16 scorer is made, naming the tensor, while bf16 policies still load it. */
static uint32_t f16_rne_bits(uint32_t u, uint32_t unused) {
    (void)unused;
    return parity_fp16_from_f32(f32_from_bits(u));
}

static uint32_t f16_via_bf16_bits(uint32_t u, uint32_t unused) {
    (void)unused;
    return parity_fp16_from_f32(parity_bf16_to_f32(parity_bf16_from_f32(f32_from_bits(u))));
}

static void test_fp16_weights(const ckpt *base) {
    static const char *const fp16_presets[] = {"hf-eager+fp16", "vllm+fp16", NULL};
    char dir[PATH_LEN], dir2[PATH_LEN], dir3[PATH_LEN];
    ckpt masters, rne, detour;
    ckpt_copy(&masters, base);
    /* fp32 masters with low bits that bf16 drops and fp16 partly keeps */
    ckpt_bf16_to_f32(&masters, 0x5a5au);
    ckpt_copy(&rne, &masters);
    ckpt_convert(&rne, NULL, 4, "F16", 2, f16_rne_bits, 0);
    ckpt_copy(&detour, &masters);
    ckpt_convert(&detour, NULL, 4, "F16", 2, f16_via_bf16_bits, 0);
    write_variant("fp16-masters", &masters, 0, dir);
    write_variant("fp16-rne", &rne, 0, dir2);
    write_variant("fp16-detour", &detour, 0, dir3);
    parity_model *m = load(dir), *r = load(dir2), *d = load(dir3);
    check_same_scores(m, r, fp16_presets, "F32 masters against their fp16 values in F16");
    /* an fp8 gemm quantizes the F32 masters themselves: the model's codes and scales are the
     * quantizer's on the masters, not on their bf16 cast */
    if (m) {
        parity_scorer *s8 = new_scorer(m, (fixture){.policy = "vllm+fp8-block:te", .max_tokens = 64});
        const char *name = "model.layers.1.mlp.down_proj.weight";
        const expected *e = model_find_tensor(m, name);
        const tensor *t = ckpt_get(&masters, name);
        CHECK(s8 && e && t && e->dst->quant[PARITY_FP8Q_TE]);
        if (s8 && e && t && e->dst->quant[PARITY_FP8Q_TE]) {
            const weight *w = e->dst;
            const size_t n = (size_t)w->rows * w->cols, grid = ((w->rows + 127) / 128) * ((w->cols + 127) / 128);
            uint8_t *codes = malloc(n);
            float *scales = malloc(grid * sizeof *scales), *cast = malloc(n * sizeof *cast);
            CHECK_OK(parity_fp8_quantize_blocks(PARITY_FP8Q_TE, w->rows, w->cols, (const float *)t->data,
                                                w->cols, 128, 128, codes, w->cols, scales));
            CHECK(memcmp(codes, w->quant[PARITY_FP8Q_TE]->codes, n) == 0);
            CHECK(memcmp(scales, w->quant[PARITY_FP8Q_TE]->scales, grid * sizeof *scales) == 0);
            for (size_t i = 0; i < n; i++)
                cast[i] = parity_bf16_to_f32(parity_bf16_from_f32(((const float *)t->data)[i]));
            CHECK_OK(parity_fp8_quantize_blocks(PARITY_FP8Q_TE, w->rows, w->cols, cast, w->cols,
                                                128, 128, codes, w->cols, scales));
            CHECK(memcmp(codes, w->quant[PARITY_FP8Q_TE]->codes, n) != 0 ||
                  memcmp(scales, w->quant[PARITY_FP8Q_TE]->scales, grid * sizeof *scales) != 0);
            free(codes), free(scales), free(cast);
        }
        parity_scorer_free(s8);
    }
    if (m && d) {
        float a[TINY_LEN - 1], b[TINY_LEN - 1];
        score(m, "hf-eager+fp16", tiny_tokens, TINY_LEN, a);
        score(d, "hf-eager+fp16", tiny_tokens, TINY_LEN, b);
        int n_diff = 0;
        for (int i = 0; i < TINY_LEN - 1; i++) n_diff += memcmp(&a[i], &b[i], 4) != 0;
        printf("F32 masters against fp16 through a bf16 cast, hf-eager+fp16: %d of %d log-probs "
               "differ\n", n_diff, TINY_LEN - 1);
        CHECK(n_diff > 0);
    }
    parity_model_free(d);
    parity_model_free(r);
    parity_model_free(m);

    /* 70000 fits bf16, not fp16 (|x| >= 65520 rounds to infinity) */
    tensor *t = ckpt_get(&masters, "model.layers.0.mlp.down_proj.weight");
    const float big = 70000.0f;
    CHECK(t != NULL);
    if (t) memcpy(t->data + 4 * 5, &big, 4);
    write_variant("fp16-overflow", &masters, 0, dir);
    m = load(dir);
    if (m) {
        parity_scorer_params p;
        parity_scorer_default_params(&p);
        parity_scorer *s = NULL;
        CHECK_OK(parity_policy_from_name("hf-eager+fp16", &p.policy));
        CHECK_STATUS(parity_scorer_create(m, &p, &s), PARITY_ERR_TENSOR_NONFINITE);
        check_message("model.layers.0.mlp.down_proj.weight");
        check_message("element 5");
        CHECK(s == NULL);
        CHECK_OK(parity_policy_from_name("hf-eager", &p.policy));
        CHECK_OK(parity_scorer_create(m, &p, &s));
        parity_scorer_free(s);
    }
    parity_model_free(m);
    ckpt_free(&detour);
    ckpt_free(&rne);
    ckpt_free(&masters);
}

/* c. shards, unaligned BF16 data, f. rotary_emb.inv_freq. */
static void test_layouts(const parity_model *orig, const ckpt *base) {
    char dir[PATH_LEN];
    const char *names[256], *shards[256];
    size_t split = base->n / 2;
    for (size_t i = 0; i < base->n; i++) {
        names[i] = base->t[i].name;
        shards[i] = i < split ? SHARD1 : SHARD2;
    }
    variant_dir("sharded", dir);
    write_shards(dir, base, split);
    write_index(dir, names, shards, base->n);
    parity_model *m = load(dir);
    check_same_scores(orig, m, all_presets, "2 shards");
    parity_model_free(m);

    write_variant("bf16-unaligned", base, 1, dir);
    m = load(dir);
    check_same_scores(orig, m, all_presets, "BF16 at odd offsets");
    parity_model_free(m);

    ckpt c;
    ckpt_copy(&c, base);
    float inv_freq[8];
    for (int i = 0; i < 8; i++) inv_freq[i] = (float)pow(10000.0, -i / 8.0);
    uint64_t shape[1] = {8};
    ckpt_add(&c, "model.layers.0.self_attn.rotary_emb.inv_freq", "F32", 1, shape, inv_freq,
             sizeof inv_freq);
    ckpt_add(&c, "model.layers.1.self_attn.rotary_emb.inv_freq", "F32", 1, shape, inv_freq,
             sizeof inv_freq);
    write_variant("inv-freq", &c, 0, dir);
    m = load(dir);
    check_same_scores(orig, m, all_presets, "with rotary_emb.inv_freq");
    parity_model_free(m);
    ckpt_free(&c);
}

/* d. single-file failures. */
static void test_bad_tensors(const ckpt *base) {
    char dir[PATH_LEN], path[PATH_LEN];
    ckpt c;

    ckpt_copy(&c, base);
    ckpt_remove(&c, "model.layers.1.self_attn.k_norm.weight");
    write_variant("missing", &c, 0, dir);
    check_load_fails(dir, PARITY_ERR_TENSOR_MISSING, "model.layers.1.self_attn.k_norm.weight",
                     NULL);
    ckpt_free(&c);

    ckpt_copy(&c, base);
    tensor *t = ckpt_get(&c, "model.layers.1.mlp.gate_proj.weight");
    uint64_t rows = t->shape[0];
    t->shape[0] = t->shape[1];
    t->shape[1] = rows;
    write_variant("shape", &c, 0, dir);
    check_load_fails(dir, PARITY_ERR_TENSOR_SHAPE, "model.layers.1.mlp.gate_proj.weight",
                     "intermediate_size");
    ckpt_free(&c);

    ckpt_copy(&c, base);
    uint16_t nan = 0x7fc1u;
    memcpy(ckpt_get(&c, "model.layers.0.mlp.up_proj.weight")->data + 2 * 5, &nan, 2);
    write_variant("nan-bf16", &c, 0, dir);
    check_load_fails(dir, PARITY_ERR_TENSOR_NONFINITE, "model.layers.0.mlp.up_proj.weight",
                     "NaN");
    ckpt_free(&c);

    ckpt_copy(&c, base);
    ckpt_bf16_to_f32(&c, 0);
    float inf = INFINITY;
    memcpy(ckpt_get(&c, "model.norm.weight")->data + 4 * 3, &inf, 4);
    write_variant("inf-f32", &c, 0, dir);
    check_load_fails(dir, PARITY_ERR_TENSOR_NONFINITE, "model.norm.weight", "Inf");
    ckpt_free(&c);

    ckpt_copy(&c, base);
    ckpt_bf16_to_f32(&c, 0);
    float big = 3.4e38f; /* finite in fp32, above bf16's largest (3.3895e38): RNE gives Inf */
    memcpy(ckpt_get(&c, "model.layers.0.self_attn.o_proj.weight")->data + 4 * 7, &big, 4);
    write_variant("f32-beyond-bf16", &c, 0, dir);
    check_load_fails(dir, PARITY_ERR_TENSOR_NONFINITE, "model.layers.0.self_attn.o_proj.weight",
                     NULL);
    ckpt_free(&c);

    ckpt_copy(&c, base);
    uint16_t extra[4] = {0x3f80u, 0x3f80u, 0x3f80u, 0x3f80u};
    uint64_t shape[1] = {4};
    ckpt_add(&c, "model.layers.0.mlp.extra_proj.weight", "BF16", 1, shape, extra, sizeof extra);
    write_variant("unexpected", &c, 0, dir);
    check_load_fails(dir, PARITY_ERR_TENSOR_UNEXPECTED, "model.layers.0.mlp.extra_proj.weight",
                     NULL);
    ckpt_free(&c);

    ckpt_copy(&c, base);
    t = ckpt_get(&c, "model.norm.weight");
    size_t n = t->bytes / 2;
    int32_t *ones = malloc(4 * n);
    for (size_t i = 0; i < n; i++) ones[i] = 1;
    tensor_set(t, "I32", ones, 4 * n);
    write_variant("i32", &c, 0, dir);
    check_load_fails(dir, PARITY_ERR_TENSOR_DTYPE, "model.norm.weight", "I32");
    ckpt_free(&c);

    write_variant("truncated", base, 0, dir);
    join(path, dir, "model.safetensors");
    struct stat st;
    CHECK(stat(path, &st) == 0);
    CHECK(truncate(path, st.st_size - 1) == 0);
    check_load_fails(dir, PARITY_ERR_ST_TRUNCATED, "model.safetensors", NULL);

    variant_dir("no-weights", dir);
    check_load_fails(dir, PARITY_ERR_IO, "model.safetensors", NULL);

    write_variant("bad-config", base, 0, dir);
    join(path, dir, "config.json");
    size_t len;
    char *text = read_all(path, &len);
    char *field = text ? strstr(text, "\"hidden_size\": 64,") : NULL;
    CHECK(field != NULL);
    if (field) {
        memcpy(field, "\"hidden_size\":  0,", 18);
        write_all(path, text, len);
    }
    free(text);
    check_load_fails(dir, PARITY_ERR_CONFIG, "hidden_size", NULL);

    join(dir, root, "no-config");
    CHECK(mkdir(dir, 0700) == 0);
    join(path, dir, "model.safetensors");
    write_st(path, base->t, base->n, 0);
    check_load_fails(dir, PARITY_ERR_IO, "config.json", NULL);
}

/* d. sharded failures. */
static void test_bad_shards(const ckpt *base) {
    char dir[PATH_LEN], path[PATH_LEN];
    const char *names[257], *shards[257];
    size_t n = base->n, split = n / 2;
    const char *first = base->t[0].name;
    for (size_t i = 0; i < n; i++) {
        names[i] = base->t[i].name;
        shards[i] = i < split ? SHARD1 : SHARD2;
    }

    variant_dir("index-absent-shard", dir);
    write_shards(dir, base, split);
    shards[n - 1] = "model-00003-of-00003.safetensors";
    write_index(dir, names, shards, n);
    shards[n - 1] = SHARD2;
    check_load_fails(dir, PARITY_ERR_INDEX, "model-00003-of-00003.safetensors", NULL);

    variant_dir("index-lacks-tensor", dir);
    write_shards(dir, base, split);
    write_index(dir, names + 1, shards + 1, n - 1);
    check_load_fails(dir, PARITY_ERR_INDEX, first, NULL);

    variant_dir("index-wrong-shard", dir);
    write_shards(dir, base, split);
    shards[0] = SHARD2;
    write_index(dir, names, shards, n);
    shards[0] = SHARD1;
    check_load_fails(dir, PARITY_ERR_INDEX, first, SHARD2);

    variant_dir("index-dotdot", dir);
    write_shards(dir, base, split);
    shards[0] = "../x.safetensors";
    write_index(dir, names, shards, n);
    shards[0] = SHARD1;
    check_load_fails(dir, PARITY_ERR_INDEX, first, NULL);

    /* the first tensor in both shards: the index names it once, or once per shard */
    ckpt c;
    ckpt_copy(&c, base);
    ckpt_add(&c, first, c.t[0].dtype, c.t[0].ndim, c.t[0].shape, c.t[0].data, c.t[0].bytes);
    variant_dir("duplicate-across-shards", dir);
    write_shards(dir, &c, split);
    write_index(dir, names, shards, n);
    check_load_fails(dir, PARITY_ERR_ST_DUPLICATE, first, NULL);

    variant_dir("duplicate-in-index", dir);
    write_shards(dir, &c, split);
    names[n] = first;
    shards[n] = SHARD2;
    write_index(dir, names, shards, n + 1);
    check_load_fails(dir, PARITY_ERR_ST_DUPLICATE, first, NULL);
    ckpt_free(&c);

    variant_dir("index-not-json", dir);
    write_shards(dir, base, split);
    join(path, dir, "model.safetensors.index.json");
    const char *broken = "{\"weight_map\": {\"model.norm.weight\": ";
    write_all(path, broken, strlen(broken));
    check_load_fails(dir, PARITY_ERR_JSON_SYNTAX, "model.safetensors.index.json", NULL);

    variant_dir("index-no-map", dir);
    write_shards(dir, base, split);
    const char *no_map = "{\"metadata\": {\"total_size\": 0}}";
    join(path, dir, "model.safetensors.index.json");
    write_all(path, no_map, strlen(no_map));
    check_load_fails(dir, PARITY_ERR_INDEX, "weight_map", NULL);
}

/* e. model specs. */
static void test_specs(void) {
    static const struct {
        const char *spec;
        int status;
    } bad[] = {
        {"synthetic:nope", PARITY_ERR_INVALID_ARGUMENT},
        {"synthetic:tiny:abc", PARITY_ERR_INVALID_ARGUMENT},
        {"synthetic:tiny:", PARITY_ERR_INVALID_ARGUMENT},
        {"synthetic:tiny:-1", PARITY_ERR_INVALID_ARGUMENT},
        {"synthetic:", PARITY_ERR_INVALID_ARGUMENT},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        parity_model *m = SENTINEL;
        CHECK_STATUS(parity_model_open(bad[i].spec, &m), bad[i].status);
        CHECK(m == SENTINEL);
        printf("  %-27s %s\n", parity_status_name(bad[i].status), parity_last_error());
    }
}

/* ---- block-FP8 checkpoints ---------------------------------------------------------------- */

static const char *const linear_names[] = {"self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj",
                                           "self_attn.o_proj", "mlp.gate_proj",    "mlp.up_proj",
                                           "mlp.down_proj"};

/* Whether two files hold the same bytes. */
static int same_file(const char *a, const char *b) {
    size_t la, lb;
    char *x = read_all(a, &la), *y = read_all(b, &lb);
    int same = x && y && la == lb && !memcmp(x, y, la);
    free(x);
    free(y);
    return same;
}

static void check_same_files(const char *dir_a, const char *dir_b, const char *what) {
    char pa[PATH_LEN], pb[PATH_LEN];
    join(pa, dir_a, "model.safetensors");
    join(pb, dir_b, "model.safetensors");
    CHECK(same_file(pa, pb));
    join(pa, dir_a, "config.json");
    join(pb, dir_b, "config.json");
    CHECK(same_file(pa, pb));
    if (!same_file(pa, pb)) fprintf(stderr, "  %s: the checkpoints differ\n", what);
}

/* A saved checkpoint of m in `layout` under root/name. */
static void save_as(const parity_model *m, const char *layout, const char *name, char *dir) {
    join(dir, root, name);
    CHECK(mkdir(dir, 0700) == 0);
    CHECK_OK(parity_model_save_as(m, dir, layout));
}

/* ---- shipped (quantized) weights -------------------------------------------------------- */

/* m, loaded from dir where orig was saved in a quantized layout, scores bitwise as orig
 * quantized at load under `presets`, and saved again as `layout` into root/name (again) is
 * the same files. */
static void check_scores_and_saved_back(const parity_model *orig, const parity_model *m,
                                        const char *const *presets, const char *dir,
                                        const char *layout, const char *name, char *again,
                                        const char *what) {
    char label[160];
    snprintf(label, sizeof label, "%s saved and loaded", what);
    check_same_scores(orig, m, presets, label);
    save_as(m, layout, name, again);
    snprintf(label, sizeof label, "%s saved back", what);
    check_same_files(dir, again, label);
}

static float e4m3_of(uint8_t c) {
    float v;
    parity_fp8_to_f32(PARITY_FP8_E4M3, 1, &c, &v);
    return v;
}

static float e2m1_of(uint8_t c) {
    float v;
    parity_fp4_to_f32(1, &c, &v);
    return v;
}

/* Whether w's value i differs from the dequantized d as every reader sees it: its master,
 * and its bf16 (rounded once). */
static int dequantized_differs(const weight *w, size_t i, float d) {
    return f32_bits(w->master[i]) != f32_bits(d) || w->bf16[i] != bf16_from_f32(d);
}

/* How many of shipped weight w's codes, scales and dequantized values differ from what the
 * public quantizer `rule` of its format makes of x, the fp32 values of weight v. */
typedef size_t shipped_differences(const weight *w, const weight *v, const float *x, int rule);

/* Every linear weight of `m` holds shipped codes (of `gemm`; -1: any) whose codes, scales and
 * dequantized values are, bitwise, what `differences` expects of quantizer `rule` on
 * values_of's fp32 values (its masters, else its bf16). */
static void check_shipped(const parity_model *m, const parity_model *values_of, int gemm,
                          int rule, shipped_differences *differences, const char *what) {
    const parity_config *c = parity_model_config(m);
    size_t bad = 0, checked = 0;
    for (uint32_t l = 0; l < c->num_hidden_layers; l++)
        for (size_t j = 0; j < 7; j++) {
            char name[128];
            snprintf(name, sizeof name, "model.layers.%u.%s.weight", l, linear_names[j]);
            const weight *w = model_find_tensor(m, name)->dst;
            const weight *v = model_find_tensor(values_of, name)->dst;
            /* the dequantized values are made when a reader first asks for them */
            CHECK_OK(model_weight_values((parity_model *)m, model_find_tensor(m, name)->dst));
            CHECK_OK(model_weight_values((parity_model *)values_of,
                                         model_find_tensor(values_of, name)->dst));
            const int shipped = w->shipped && (gemm < 0 || w->shipped_gemm == gemm);
            CHECK(shipped);
            if (!shipped) return;
            const size_t n = (size_t)v->rows * v->cols;
            float *x = malloc(n * sizeof *x);
            for (size_t i = 0; i < n; i++) x[i] = v->master ? v->master[i] : bf16_to_f32(v->bf16[i]);
            bad += differences(w, v, x, rule);
            checked++;
            free(x);
        }
    CHECK(checked == 7u * c->num_hidden_layers);
    CHECK_INT(bad, 0);
    if (bad) fprintf(stderr, "  %s: %zu differences\n", what, bad);
}

/* Block-FP8: the codes and 128 x 128 scales of parity_fp8_quantize_blocks, and the values
 * every other reader sees, RN_bf16(RN_fp32(e4m3 * scale)). */
static size_t fp8_block_differences(const weight *w, const weight *v, const float *x, int rule) {
    const size_t n = (size_t)v->rows * v->cols, grid_cols = (v->cols + 127) / 128;
    const size_t grid = ((v->rows + 127) / 128) * grid_cols;
    float *scales = malloc(grid * sizeof *scales);
    uint8_t *codes = malloc(n);
    size_t bad = 0;
    CHECK_OK(parity_fp8_quantize_blocks(rule, v->rows, v->cols, x, v->cols, 128, 128, codes,
                                        v->cols, scales));
    bad += memcmp(codes, w->shipped->codes, n) != 0;
    bad += memcmp(scales, w->shipped->scales, grid * sizeof *scales) != 0;
    for (size_t i = 0; i < n; i++) {
        const float scale = scales[(i / v->cols / 128) * grid_cols + (i % v->cols) / 128];
        bad += dequantized_differs(w, i, e4m3_of(codes[i]) * scale);
    }
    free(scales);
    free(codes);
    return bad;
}

/* Ternary: the codes and s_w of parity_ternary_quantize (held four a byte, quant_weight.h),
 * the dequantized values code / s_w. */
static size_t ternary_differences(const weight *w, const weight *v, const float *x, int rule) {
    const quant_format *f = quant_format_row(PARITY_GEMM_TERNARY);
    const size_t n = (size_t)v->rows * v->cols, row_bytes = quant_weight_row_bytes(f, v->cols);
    int8_t *codes = malloc(n);
    uint8_t *held = malloc(v->rows * row_bytes);
    float s_w;
    size_t bad = 0;
    CHECK_OK(parity_ternary_quantize(rule, 0, v->rows, v->cols, x, v->cols, codes, v->cols, &s_w));
    for (size_t r = 0; r < v->rows; r++)
        quant_codes_pack_row(f, (const uint8_t *)codes + r * v->cols, v->cols,
                             held + r * row_bytes);
    bad += memcmp(held, w->shipped->codes, v->rows * row_bytes) != 0;
    bad += f32_bits(s_w) != f32_bits(w->shipped->tensor_scale);
    for (size_t i = 0; i < n; i++) bad += dequantized_differs(w, i, (float)codes[i] / s_w);
    free(codes);
    free(held);
    return bad;
}

/* NVFP4 (nv) or MXFP4: the codes and block scales of the public quantizer, the dequantized
 * values e2m1 * sf * s2 (NVFP4, one rounding) or e2m1 * 2^(e - 127) (MXFP4, exact). */
static size_t fp4_differences(const weight *w, const weight *v, const float *x, int rule,
                              int nv) {
    const size_t bc = nv ? 16 : 32;
    const size_t n = (size_t)v->rows * v->cols, g = (v->cols + bc - 1) / bc;
    float s2 = 0.0f;
    uint8_t *codes = malloc(n), *sf = malloc(v->rows * g);
    size_t bad = 0;
    if (nv)
        CHECK_OK(parity_nvfp4_quantize(rule, 0, v->rows, v->cols, x, v->cols, codes, v->cols, sf, &s2));
    else
        CHECK_OK(parity_mxfp4_quantize(rule, v->rows, v->cols, x, v->cols, codes, v->cols, sf));
    /* held two a byte, the low nibble the even column, an odd row's last high nibble 0 */
    const size_t row_bytes = (v->cols + 1) / 2;
    uint8_t *held = calloc(v->rows * row_bytes, 1);
    for (size_t i = 0; i < n; i++)
        held[i / v->cols * row_bytes + i % v->cols / 2] |=
            (uint8_t)(codes[i] << (4 * (i % v->cols % 2)));
    bad += memcmp(held, w->shipped->codes, v->rows * row_bytes) != 0;
    free(held);
    bad += nv && f32_bits(s2) != f32_bits(w->shipped->tensor_scale);
    for (size_t b = 0; b < v->rows * g; b++) {
        const float sv = nv ? e4m3_of(sf[b]) : ldexpf(1.0f, (int)sf[b] - 127);
        const quant_format *f = quant_format_row(nv ? PARITY_GEMM_NVFP4 : PARITY_GEMM_MXFP4);
        bad += sf[b] != w->shipped->scale_codes[b]; /* held as the file's bytes */
        bad += f32_bits(sv) != f32_bits(quant_weight_scale(f, w->shipped, b));
    }
    for (size_t i = 0; i < n; i++) {
        const size_t b = (i / v->cols) * g + (i % v->cols) / bc;
        float d = e2m1_of(codes[i]) * (nv ? e4m3_of(sf[b]) : ldexpf(1.0f, (int)sf[b] - 127));
        if (nv) d = d * s2;
        bad += dequantized_differs(w, i, d);
    }
    free(codes);
    free(sf);
    return bad;
}

static size_t nvfp4_differences(const weight *w, const weight *v, const float *x, int rule) {
    return fp4_differences(w, v, x, rule, 1);
}

static size_t mxfp4_differences(const weight *w, const weight *v, const float *x, int rule) {
    return fp4_differences(w, v, x, rule, 0);
}

/* A copy of the tiny model's config.json with `insert` after the first '{' (NULL: as it is). */
static void write_config_with(const char *dir, const char *from_dir, const char *insert) {
    char src[PATH_LEN], dst[PATH_LEN];
    join(src, from_dir, "config.json");
    join(dst, dir, "config.json");
    size_t len;
    char *text = read_all(src, &len);
    if (!text) return;
    char *out = malloc(len + (insert ? strlen(insert) : 0) + 2);
    const char *brace = strchr(text, '{');
    size_t k = (size_t)(brace - text) + 1;
    memcpy(out, text, k);
    size_t n = k;
    if (insert) n += (size_t)sprintf(out + n, "%s", insert);
    memcpy(out + n, text + k, len - k);
    write_all(dst, out, n + len - k);
    free(out);
    free(text);
}

/* root/name holding c with a config.json of `config_dir` (plus `insert`). */
static void write_fp8_variant(const char *name, const ckpt *c, const char *config_dir,
                              const char *insert, char *dir) {
    char path[PATH_LEN];
    join(dir, root, name);
    CHECK(mkdir(dir, 0700) == 0);
    write_config_with(dir, config_dir, insert);
    join(path, dir, "model.safetensors");
    write_st(path, c->t, c->n, 0);
}

static float scale_at(tensor *t, size_t i) {
    float f;
    memcpy(&f, t->data + 4 * i, 4);
    return f;
}

static void set_scale(tensor *t, size_t i, float v) { memcpy(t->data + 4 * i, &v, 4); }

#define GATE0 "model.layers.0.mlp.gate_proj.weight"
#define Q0 "model.layers.0.self_attn.q_proj.weight"
#define QUANT_DEEPSEEK "deepseek"

/* ---- quantized checkpoints: the shared set-up of their cases ----------------------------- */

/* t becomes w's bf16 values: dtype BF16, shape rows x cols (a weight kept in bf16). */
static void tensor_set_bf16(tensor *t, const weight *w) {
    const size_t bytes = (size_t)w->rows * w->cols * 2;
    uint16_t *d = malloc(bytes);
    memcpy(d, w->bf16, bytes);
    tensor_set(t, "BF16", d, bytes);
    t->shape[0] = w->rows;
    t->shape[1] = w->cols;
}

/* t, an F32 scale, holds its first value twice (shape[0] = 2). */
static void set_two_scales(tensor *t) {
    float two[2] = {scale_at(t, 0), scale_at(t, 0)};
    void *d = malloc(8);
    memcpy(d, two, 8);
    tensor_set(t, "F32", d, 8);
    t->shape[0] = 2;
}

/* One way a quantized checkpoint is wrong: its name, the status its load fails with and a
 * text the message names, and the text inserted in its config.json when not the layout's
 * quantization_config (NO_QUANT_CONFIG: nothing). */
typedef struct bad_case {
    const char *what;
    int status;
    const char *needle;
    const char *cfg;
} bad_case;
#define NO_QUANT_CONFIG ""

/* A bad case's checkpoint: its tensors (the good checkpoint's, edited), the text inserted in
 * its config.json (NULL: none), and a file written beside them (NULL: none). */
typedef struct bad_variant {
    ckpt c;
    const char *cfg;
    const char *file, *file_text;
} bad_variant;

/* Makes v the checkpoint of case `what`; orig is the bf16 model the good one was saved from. */
typedef void bad_edit(bad_variant *v, const char *what, const parity_model *orig);

/* Each of the n cases: `good` with its own or else `cfg` in tiny's config.json, as `edit`
 * makes it, written to root/LAYOUT-bad-WHAT, fails to load with the case's status and
 * message. */
static void check_bad_cases(const char *layout, const ckpt *good, const char *cfg,
                            const bad_case *cases, size_t n, bad_edit *edit,
                            const parity_model *orig) {
    for (size_t i = 0; i < n; i++) {
        bad_variant v = {.cfg = cases[i].cfg ? cases[i].cfg : cfg};
        ckpt_copy(&v.c, good);
        char name[64], dir[PATH_LEN], path[PATH_LEN];
        snprintf(name, sizeof name, "%s-bad-%s", layout, cases[i].what);
        edit(&v, cases[i].what, orig);
        write_fp8_variant(name, &v.c, tiny_dir, v.cfg, dir);
        if (v.file) {
            join(path, dir, v.file);
            write_all(path, v.file_text, strlen(v.file_text));
        }
        check_load_fails(dir, cases[i].status, cases[i].needle, NULL);
        ckpt_free(&v.c);
    }
}

/* The odd model (intermediate size 149) saved as `layout` in root/odd_name, with byte `at`
 * of its tensor `tensor_name` made (byte & keep) | set, which sets padding, and with its
 * hf_quant_config.json when `hfq`: the load fails as `bad` says, naming down_proj too. */
static void check_padding_refused(const char *layout, const char *odd_name,
                                  const char *tensor_name, size_t at, uint8_t keep, uint8_t set,
                                  int hfq, const bad_case *bad) {
    char odd_dir[PATH_LEN], name[64], dir[PATH_LEN];
    ckpt c;
    join(odd_dir, root, odd_name);
    ckpt_read_in(&c, odd_dir);
    tensor *d = ckpt_get(&c, tensor_name);
    d->data[at] = (uint8_t)((d->data[at] & keep) | set);
    snprintf(name, sizeof name, "%s-bad-%s", layout, bad->what);
    write_fp8_variant(name, &c, odd_dir, NULL, dir);
    if (hfq) free(copy_file_in(odd_dir, dir, "hf_quant_config.json"));
    check_load_fails(dir, bad->status, bad->needle, "down_proj");
    ckpt_free(&c);
}

/* The block-FP8 cases (test_fp8_checkpoints). */
static void edit_fp8_case(bad_variant *v, const char *w, const parity_model *orig) {
    tensor *g = ckpt_get(&v->c, GATE0), *gs = ckpt_get(&v->c, GATE0 "_scale_inv");
    if (!strcmp(w, "grid")) {
        gs->shape[0] = 1; /* [2, 1] for the 160 x 64 weight */
        gs->bytes = 4;
    } else if (!strcmp(w, "nan-scale")) set_scale(gs, 1, NAN);
    else if (!strcmp(w, "zero-scale")) set_scale(gs, 0, 0.0f);
    else if (!strcmp(w, "negative-scale")) set_scale(gs, 0, -scale_at(gs, 0));
    else if (!strcmp(w, "e5m2-codes")) snprintf(g->dtype, sizeof g->dtype, "F8_E5M2");
    else if (!strcmp(w, "f16-scales")) {
        uint16_t *h = calloc(gs->bytes / 4, 2);
        for (size_t k = 0; k < gs->bytes / 4; k++) h[k] = 0x3c00;
        tensor_set(gs, "F16", h, gs->bytes / 2);
    } else if (!strcmp(w, "bf16-not-kept")) {
        tensor_set_bf16(g, model_find_tensor(orig, GATE0)->dst);
        ckpt_remove(&v->c, GATE0 "_scale_inv");
    } else if (!strcmp(w, "missing-scale")) ckpt_remove(&v->c, GATE0 "_scale_inv");
    else if (!strcmp(w, "nan-code")) g->data[17] = 0xff;
    else if (!strcmp(w, "huge-scale")) set_scale(gs, 1, 1e37f); /* its block's 448 * 1e37 */
    else if (!strcmp(w, "scale-of-kept")) {
        /* the kept weight in bf16, its scale left behind */
        for (uint32_t l = 0; l < 2; l++) {
            char nm[96];
            snprintf(nm, sizeof nm, "model.layers.%u.mlp.gate_proj.weight", l);
            tensor_set_bf16(ckpt_get(&v->c, nm), model_find_tensor(orig, nm)->dst);
        }
    }
}

static void test_fp8_checkpoints(const parity_model *orig, const ckpt *base) {
    (void)base;
    char fp8_dir[PATH_LEN], dir[PATH_LEN], dir2[PATH_LEN];
    int rule_deepseek = -1, rule_te = -1;
    CHECK_OK(parity_fp8_quantizer_from_name(0, "deepseek", &rule_deepseek));
    CHECK_OK(parity_fp8_quantizer_from_name(0, "te", &rule_te));

    /* bf16 model -> fp8-block:deepseek -> load: the shipped codes are the quantizer's, the
     * fp8 policy scores bitwise as the bf16 model quantized at load, and the file saves back
     * byte for byte */
    save_as(orig, "fp8-block:deepseek", "fp8-deepseek", fp8_dir);
    char *text = read_in(fp8_dir, "config.json");
    CHECK(text && strstr(text, "\"quant_method\": \"fp8\"") && strstr(text, "[128, 128]") &&
          strstr(text, "\"modules_to_not_convert\": [\"lm_head\"]") && !strstr(text, "ue8m0"));
    free(text);
    parity_model *m = load(fp8_dir);
    if (!m) return;
    check_shipped(m, orig, -1, rule_deepseek, fp8_block_differences,
                  "fp8-block:deepseek from bf16");
    const char *fp8_presets[] = {"vllm+fp8-block:deepseek", "hf-eager+fp8-block:deepseek", NULL};
    check_scores_and_saved_back(orig, m, fp8_presets, fp8_dir, "fp8-block", "fp8-resaved", dir,
                                "fp8-block:deepseek");
    /* shipped codes are written as they are whatever the rule: never re-quantized */
    save_as(m, "fp8-block:te", "fp8-resaved-te", dir);
    check_same_files(fp8_dir, dir, "fp8-block:te of a shipped model");
    /* an fp8-block policy with another rule reads the shipped weights too (its rule quantizes
     * the activations only): no te copy is made of them, an mxfp8 one is (from the
     * dequantized values) */
    {
        parity_scorer *s = new_scorer(m, (fixture){.policy = "vllm+fp8-block:te", .n_threads = 1, .max_tokens = 64});
        parity_scorer *s2 = new_scorer(m, (fixture){.policy = "vllm+mxfp8:ocp", .n_threads = 1, .max_tokens = 64});
        const weight *g = model_find_tensor(m, GATE0)->dst;
        parity_policy te;
        CHECK_OK(parity_policy_from_name("vllm+fp8-block:te", &te));
        CHECK(g->quant[rule_te] == NULL && quant_weight_for(&te, g) == g->shipped &&
              g->quant[PARITY_FP8Q_MX_OCP] != NULL);
        parity_scorer_free(s);
        parity_scorer_free(s2);
    }
    /* the other layouts of an fp8 model hold its dequantized values */
    save_as(m, "bf16", "fp8-as-bf16", dir);
    parity_model *mb = load(dir);
    const char *bf16_only[] = {"hf-eager", NULL};
    check_same_scores(m, mb, bf16_only, "an fp8 model saved as bf16");
    parity_model_free(mb);
    parity_model_free(m);

    /* no rule and no shipped codes: refused */
    join(dir, root, "fp8-no-rule");
    CHECK(mkdir(dir, 0700) == 0);
    CHECK_STATUS(parity_model_save_as(orig, dir, "fp8-block"), PARITY_ERR_INVALID_ARGUMENT);
    check_message("fp8-block:RULE");
    CHECK_STATUS(parity_model_save_as(orig, dir, "fp8-block:nope"), PARITY_ERR_POLICY);
    CHECK_STATUS(parity_model_save_as(orig, dir, "int4"), PARITY_ERR_INVALID_ARGUMENT);

    /* fp32 masters are quantized from fp32, not through a bf16 cast */
    ckpt f32;
    ckpt_copy(&f32, base);
    ckpt_bf16_to_f32(&f32, 0x5a5a);
    write_variant("f32-for-fp8", &f32, 0, dir);
    ckpt_free(&f32);
    parity_model *m32 = load(dir);
    if (m32) {
        save_as(m32, "fp8-block:te", "fp8-te-from-f32", dir2);
        parity_model *q = load(dir2);
        if (q)
            check_shipped(q, m32, -1, rule_te, fp8_block_differences,
                          "fp8-block:te from fp32 masters");
        parity_model_free(q);
        /* fp16 and fp32 layouts load back with the same scores */
        save_as(m32, "fp32", "f32-resaved", dir2);
        q = load(dir2);
        check_same_scores(m32, q, all_presets, "fp32 layout saved and loaded");
        parity_model_free(q);
        save_as(m32, "fp16", "f16-saved", dir2);
        q = load(dir2);
        const char *fp16_presets[] = {"hf-eager+fp16", "vllm+fp16", NULL};
        check_same_scores(m32, q, fp16_presets, "fp16 layout saved and loaded");
        parity_model_free(q);
        parity_model_free(m32);
    }

    ckpt fp8;
    ckpt_read_in(&fp8, fp8_dir);

    /* BF16 scales (Qwen3-FP8) are read widened, and save back as BF16 */
    {
        ckpt c;
        ckpt_copy(&c, &fp8);
        for (size_t i = 0; i < c.n; i++) {
            tensor *t = &c.t[i];
            if (!strstr(t->name, "_scale_inv")) continue;
            const size_t g = t->bytes / 4;
            uint16_t *h = malloc(g * 2);
            for (size_t k = 0; k < g; k++) h[k] = bf16_from_f32(scale_at(t, k));
            tensor_set(t, "BF16", h, g * 2);
        }
        write_fp8_variant("fp8-bf16-scales", &c, fp8_dir, NULL, dir);
        parity_model *mb16 = load(dir);
        if (mb16) {
            const weight *w = model_find_tensor(mb16, GATE0)->dst;
            const tensor *t = ckpt_get(&c, GATE0 "_scale_inv");
            uint16_t h0;
            memcpy(&h0, t->data, 2);
            CHECK(w->shipped && w->shipped_scale_dtype == PARITY_DTYPE_BF16 &&
                  f32_bits(w->shipped->scales[0]) == (uint32_t)h0 << 16u);
            save_as(mb16, "fp8-block", "fp8-bf16-scales-resaved", dir2);
            char pa[PATH_LEN], pb[PATH_LEN];
            join(pa, dir, "model.safetensors");
            join(pb, dir2, "model.safetensors");
            CHECK(same_file(pa, pb));
            parity_model_free(mb16);
        }
        ckpt_free(&c);
    }

    /* scale_fmt "float" (transformers' default spelling) and dequantize (transformers' load-time
     * choice; the policy chooses the arithmetic here) are read and change nothing */
    {
        write_fp8_variant("fp8-scale-float", &fp8, tiny_dir,
                          "\"quantization_config\": {\"quant_method\": \"fp8\", \"weight_block_size\": "
                          "[128, 128], \"scale_fmt\": \"float\", \"dequantize\": true},", dir);
        parity_model *mf = load(dir);
        if (mf) check_same_scores(orig, mf, fp8_presets, "fp8 with scale_fmt float, dequantize");
        parity_model_free(mf);
    }

    /* modules_to_not_convert: a layer kept in bf16 (its weight BF16, no scale), by full name
     * and by a suffix naming every layer's down_proj */
    {
        ckpt c;
        ckpt_copy(&c, &fp8);
        const weight *wq = model_find_tensor(orig, Q0)->dst;
        tensor *t = ckpt_get(&c, Q0);
        uint16_t *vals = malloc((size_t)wq->rows * wq->cols * 2);
        memcpy(vals, wq->bf16, (size_t)wq->rows * wq->cols * 2);
        tensor_set(t, "BF16", vals, (size_t)wq->rows * wq->cols * 2);
        ckpt_remove(&c, Q0 "_scale_inv");
        const parity_config *cfg = parity_model_config(orig);
        for (uint32_t l = 0; l < cfg->num_hidden_layers; l++) {
            char name[128];
            snprintf(name, sizeof name, "model.layers.%u.mlp.down_proj.weight", l);
            const weight *wd = model_find_tensor(orig, name)->dst;
            uint16_t *d = malloc((size_t)wd->rows * wd->cols * 2);
            memcpy(d, wd->bf16, (size_t)wd->rows * wd->cols * 2);
            tensor_set(ckpt_get(&c, name), "BF16", d, (size_t)wd->rows * wd->cols * 2);
            strcat(name, "_scale_inv");
            ckpt_remove(&c, name);
        }
        /* the saved config.json's list is replaced by a later key? no: a fresh file */
        char cfgtext[512];
        snprintf(cfgtext, sizeof cfgtext, "\"quantization_config\": {\"quant_method\": \"fp8\", "
                 "\"fmt\": \"e4m3\", \"activation_scheme\": \"dynamic\", \"weight_block_size\": "
                 "[128, 128], \"modules_to_not_convert\": [\"lm_head\", "
                 "\"model.layers.0.self_attn.q_proj\"], \"ignored_layers\": [\"down_proj\"]},");
        write_fp8_variant("fp8-kept-layers", &c, tiny_dir, cfgtext, dir);
        parity_model *mk = load(dir);
        if (mk) {
            const weight *kq = model_find_tensor(mk, Q0)->dst;
            CHECK(kq->keep_bf16 && !kq->shipped && !memcmp(kq->bf16, wq->bf16, (size_t)wq->rows * wq->cols * 2));
            parity_scorer *s = new_scorer(mk, (fixture){.policy = "vllm+fp8-block:deepseek", .n_threads = 1, .max_tokens = 64});
            parity_scorer *s2 = new_scorer(mk, (fixture){.policy = "vllm+mxfp8:ocp", .n_threads = 1, .max_tokens = 64});
            /* no fp8 policy quantizes a kept layer; the others run on their shipped codes or
             * (mxfp8) on a copy quantized from their dequantized values */
            for (int q = 0; q < QUANTIZERS; q++) CHECK(kq->quant[q] == NULL);
            const weight *kg = model_find_tensor(mk, GATE0)->dst;
            CHECK(kg->shipped && !kg->quant[rule_deepseek] && kg->quant[PARITY_FP8Q_MX_OCP]);
            const weight *kd = model_find_tensor(mk, "model.layers.1.mlp.down_proj.weight")->dst;
            CHECK(kd->keep_bf16 && !kd->shipped);
            parity_scorer_free(s);
            parity_scorer_free(s2);
            save_as(mk, "fp8-block", "fp8-kept-resaved", dir2);
            text = read_in(dir2, "config.json");
            CHECK(text && strstr(text, "\"lm_head\", \"model.layers.0.self_attn.q_proj\", "
                                       "\"model.layers.0.mlp.down_proj\", "
                                       "\"model.layers.1.mlp.down_proj\"]"));
            free(text);
            parity_model *again = load(dir2);
            check_same_scores(mk, again, fp8_presets, "kept layers saved and loaded");
            parity_model_free(again);
            parity_model_free(mk);
        }
        ckpt_free(&c);
    }

    /* ue8m0: power-of-two scales written by te-pow2, and required on load */
    save_as(orig, "fp8-block:te-pow2", "fp8-te-pow2", dir);
    text = read_in(dir, "config.json");
    CHECK(text && strstr(text, "\"scale_fmt\": \"ue8m0\""));
    free(text);
    m = load(dir);
    parity_model_free(m);

    printf("block-FP8 failures, as expected:\n");
    const char *qcfg = "\"quantization_config\": {\"quant_method\": \"fp8\", \"fmt\": \"e4m3\", "
                       "\"activation_scheme\": \"dynamic\", \"weight_block_size\": [128, 128]},";
    static const bad_case cases[] = {
        {"grid", PARITY_ERR_SCALE_GRID, GATE0 "_scale_inv", NULL},
        {"nan-scale", PARITY_ERR_SCALE_VALUE, GATE0 "_scale_inv", NULL},
        {"zero-scale", PARITY_ERR_SCALE_VALUE, GATE0 "_scale_inv", NULL},
        {"negative-scale", PARITY_ERR_SCALE_VALUE, GATE0 "_scale_inv", NULL},
        {"ue8m0-not-pow2", PARITY_ERR_SCALE_VALUE, "ue8m0",
         "\"quantization_config\": {\"quant_method\": \"fp8\", \"weight_block_size\": "
         "[128, 128], \"scale_fmt\": \"ue8m0\"},"},
        {"e5m2-codes", PARITY_ERR_TENSOR_DTYPE, GATE0, NULL},
        {"f16-scales", PARITY_ERR_TENSOR_DTYPE, GATE0 "_scale_inv", NULL},
        {"bf16-not-kept", PARITY_ERR_TENSOR_DTYPE, GATE0, NULL},
        {"missing-scale", PARITY_ERR_SCALE_MISSING, GATE0, NULL},
        {"nan-code", PARITY_ERR_TENSOR_NONFINITE, GATE0, NULL},
        {"huge-scale", PARITY_ERR_TENSOR_NONFINITE, GATE0, NULL},
        {"no-quant-config", PARITY_ERR_TENSOR_DTYPE, "quantization_config", NO_QUANT_CONFIG},
        {"scale-of-kept", PARITY_ERR_TENSOR_UNEXPECTED, GATE0 "_scale_inv",
         "\"quantization_config\": {\"quant_method\": \"fp8\", \"weight_block_size\": "
         "[128, 128], \"modules_to_not_convert\": [\"gate_proj\"]},"},
        {"method", PARITY_ERR_UNSUPPORTED, "awq", "\"quantization_config\": {\"quant_method\": \"awq\"},"},
        {"fmt", PARITY_ERR_UNSUPPORTED, "e5m2",
         "\"quantization_config\": {\"quant_method\": \"fp8\", \"fmt\": \"e5m2\", "
         "\"weight_block_size\": [128, 128]},"},
        {"block", PARITY_ERR_UNSUPPORTED, "[64, 64]",
         "\"quantization_config\": {\"quant_method\": \"fp8\", \"weight_block_size\": [64, 64]},"},
        {"static", PARITY_ERR_UNSUPPORTED, "static",
         "\"quantization_config\": {\"quant_method\": \"fp8\", \"activation_scheme\": "
         "\"static\", \"weight_block_size\": [128, 128]},"},
        {"block-type", PARITY_ERR_CONFIG, "weight_block_size",
         "\"quantization_config\": {\"quant_method\": \"fp8\", \"weight_block_size\": \"128\"},"},
        {"dequantize-type", PARITY_ERR_CONFIG, "quantization_config.dequantize",
         "\"quantization_config\": {\"quant_method\": \"fp8\", \"weight_block_size\": "
         "[128, 128], \"dequantize\": \"yes\"},"},
    };
    check_bad_cases("fp8", &fp8, qcfg, cases, sizeof cases / sizeof cases[0], edit_fp8_case, orig);
    ckpt_free(&fp8);
}

/* ---- BitNet (ternary) checkpoints ------------------------------------------------------------ */

/* The BitNet cases (test_bitnet_checkpoints). */
static void edit_bitnet_case(bad_variant *v, const char *w, const parity_model *orig) {
    tensor *g = ckpt_get(&v->c, GATE0), *gs = ckpt_get(&v->c, GATE0 "_scale");
    if (!strcmp(w, "packed-shape")) {
        g->shape[0] -= 1; /* one packed row short */
        g->bytes -= g->shape[1];
    } else if (!strcmp(w, "code-3")) g->data[5] |= 0x30; /* field 2 of a byte: 3 */
    else if (!strcmp(w, "missing-scale")) ckpt_remove(&v->c, GATE0 "_scale");
    else if (!strcmp(w, "zero-scale")) set_scale(gs, 0, 0.0f);
    else if (!strcmp(w, "tiny-scale")) set_scale(gs, 0, 1e-39f); /* s_w: 1 / s_w beyond fp32 */
    else if (!strcmp(w, "huge-mean")) set_scale(gs, 0, 3.4e38f); /* code * mean beyond bf16 */
    else if (!strcmp(w, "nan-scale")) set_scale(gs, 0, NAN);
    else if (!strcmp(w, "negative-scale")) set_scale(gs, 0, -scale_at(gs, 0));
    else if (!strcmp(w, "two-scales")) set_two_scales(gs);
    else if (!strcmp(w, "i8-codes")) snprintf(g->dtype, sizeof g->dtype, "I8");
    else if (!strcmp(w, "bf16-not-kept") || !strcmp(w, "scale-of-kept")) {
        tensor_set_bf16(g, model_find_tensor(orig, GATE0)->dst);
        if (!strcmp(w, "bf16-not-kept")) ckpt_remove(&v->c, GATE0 "_scale");
    }
}

static void test_bitnet_checkpoints(const parity_model *orig) {
    char bn_dir[PATH_LEN], dir[PATH_LEN];
    /* transformers' pack_weights by hand: 5 rows, R = ceil(5 / 4) = 2 packed rows; row i*R + r
     * sits in bits 2i of packed row r. Column 0 holds -1..1 codes (1, 0, -1, 1, 0), stored +1:
     * (2, 1, 0, 2, 1): packed[0] = 2 | 0 << 2 | 1 << 4 = 18, packed[1] = 1 | 2 << 2 = 9;
     * column 1 (-1, -1, 1, 0, 1): (0, 0, 2, 1, 2): packed[0] = 0 | 2 << 2 | 2 << 4 = 40,
     * packed[1] = 0 | 1 << 2 = 4. */
    {
        const int8_t codes[10] = {1, -1, 0, -1, -1, 1, 1, 0, 0, 1};
        const quant_format *f = quant_format_row(PARITY_GEMM_TERNARY);
        uint8_t held[5 * 16], packed[4]; /* five rows of one group, as the model holds them */
        CHECK(quant_weight_row_bytes(f, 2) == 16);
        for (int r = 0; r < 5; r++)
            quant_codes_pack_row(f, (const uint8_t *)codes + 2 * r, 2, held + 16 * r);
        ternary_pack(held, 5, 2, packed);
        CHECK_INT(packed[0], 18);
        CHECK_INT(packed[2], 9);
        CHECK_INT(packed[1], 40);
        CHECK_INT(packed[3], 4);
    }
    int bitnet = -1, hf = -1;
    CHECK_OK(parity_quantizer_from_name(PARITY_GEMM_TERNARY, "bitnet", &bitnet));
    CHECK_OK(parity_quantizer_from_name(PARITY_GEMM_TERNARY, "hf-bitlinear", &hf));
    /* bf16 model -> bitnet:bitnet -> load: the shipped codes are the quantizer's, the ternary
     * policy scores bitwise as the bf16 model quantized at load, and it saves back byte for
     * byte (also when a rule is named: shipped codes are never re-quantized) */
    save_as(orig, "bitnet:bitnet", "bitnet", bn_dir);
    char *text = read_in(bn_dir, "config.json");
    CHECK(text && strstr(text, "\"quant_method\": \"bitnet\"") &&
          strstr(text, "\"linear_class\": \"bitlinear\""));
    free(text);
    parity_model *m = load(bn_dir);
    if (!m) return;
    check_shipped(m, orig, PARITY_GEMM_TERNARY, bitnet, ternary_differences,
                  "bitnet:bitnet from bf16");
    const char *tern[] = {"hf-eager+ternary:bitnet", "vllm+ternary:onebitllms", NULL};
    check_scores_and_saved_back(orig, m, tern, bn_dir, "bitnet", "bitnet-resaved", dir, "bitnet");
    /* hf-bitlinear: its s_w is bf16, and stored so */
    save_as(orig, "bitnet:hf-bitlinear", "bitnet-hf", dir);
    parity_model *mh = load(dir);
    if (mh) {
        const weight *g = model_find_tensor(mh, GATE0)->dst;
        CHECK(g->shipped_scale_dtype == PARITY_DTYPE_BF16);
        const char *hfp[] = {"hf-eager+ternary:hf-bitlinear", NULL};
        check_same_scores(orig, mh, hfp, "bitnet:hf-bitlinear saved and loaded");
        parity_model_free(mh);
    }
    (void)hf;
    /* the other layouts of a ternary model hold its dequantized values */
    save_as(m, "bf16", "bitnet-as-bf16", dir);
    parity_model *mb = load(dir);
    const char *bf16_only[] = {"hf-eager", NULL};
    check_same_scores(m, mb, bf16_only, "a ternary model saved as bf16");
    parity_model_free(mb);

    ckpt bn;
    ckpt_read_in(&bn, bn_dir);
    /* autobitlinear: weight_scale is mean|W| = 1 / s_w; the dequantized values code * mean */
    {
        ckpt c;
        ckpt_copy(&c, &bn);
        tensor *gs = ckpt_get(&c, GATE0 "_scale");
        const float mean = 1.0f / scale_at(gs, 0);
        set_scale(gs, 0, mean);
        write_fp8_variant("bitnet-auto", &c, tiny_dir,
                          "\"quantization_config\": {\"quant_method\": \"bitnet\", \"linear_class\": "
                          "\"autobitlinear\", \"quantization_mode\": \"offline\"},", dir);
        parity_model *ma = load(dir);
        if (ma) {
            const weight *g = model_find_tensor(ma, GATE0)->dst;
            const weight *g0 = model_find_tensor(m, GATE0)->dst;
            CHECK_OK(model_weight_values(ma, model_find_tensor(ma, GATE0)->dst));
            CHECK(f32_bits(g->shipped->tensor_scale) == f32_bits(1.0f / mean));
            const quant_format *f = quant_format_row(PARITY_GEMM_TERNARY);
            const size_t row_bytes = quant_weight_row_bytes(f, g->cols);
            size_t bad = 0;
            for (size_t i = 0; i < (size_t)g->rows * g->cols; i++) {
                const uint8_t *held = g0->shipped->codes + i / g->cols * row_bytes;
                const float code = (float)(int8_t)quant_code_at(f, held, i % g->cols);
                bad += f32_bits(g->master[i]) != f32_bits(code * mean);
            }
            CHECK_INT(bad, 0);
            parity_model_free(ma);
        }
        ckpt_free(&c);
    }

    /* use_rms_norm false (transformers' default) and its rms_norm_eps are read and change
     * nothing: the same model as without them */
    {
        write_fp8_variant("bitnet-no-rms-norm", &bn, tiny_dir,
                          "\"quantization_config\": {\"quant_method\": \"bitnet\", \"use_rms_norm\": "
                          "false, \"rms_norm_eps\": 1e-06},", dir);
        parity_model *mr = load(dir);
        if (mr) check_same_scores(m, mr, tern, "bitnet with use_rms_norm false");
        parity_model_free(mr);
    }

    printf("BitNet failures, as expected:\n");
    const char *qcfg = "\"quantization_config\": {\"quant_method\": \"bitnet\"},";
    static const bad_case cases[] = {
        {"packed-shape", PARITY_ERR_TENSOR_SHAPE, GATE0, NULL},
        {"code-3", PARITY_ERR_TENSOR_NONFINITE, GATE0, NULL},
        {"missing-scale", PARITY_ERR_SCALE_MISSING, GATE0, NULL},
        {"zero-scale", PARITY_ERR_SCALE_VALUE, GATE0 "_scale", NULL},
        {"nan-scale", PARITY_ERR_SCALE_VALUE, GATE0 "_scale", NULL},
        {"negative-scale", PARITY_ERR_SCALE_VALUE, GATE0 "_scale", NULL},
        {"two-scales", PARITY_ERR_SCALE_GRID, GATE0 "_scale", NULL},
        {"tiny-scale", PARITY_ERR_TENSOR_NONFINITE, GATE0 "_scale", NULL},
        {"huge-mean", PARITY_ERR_TENSOR_NONFINITE, GATE0 "_scale",
         "\"quantization_config\": {\"quant_method\": \"bitnet\", \"linear_class\": "
         "\"autobitlinear\", \"quantization_mode\": \"offline\"},"},
        {"i8-codes", PARITY_ERR_TENSOR_DTYPE, GATE0, NULL},
        {"bf16-not-kept", PARITY_ERR_TENSOR_DTYPE, GATE0, NULL},
        {"scale-of-kept", PARITY_ERR_TENSOR_UNEXPECTED, GATE0 "_scale",
         "\"quantization_config\": {\"quant_method\": \"bitnet\", "
         "\"modules_to_not_convert\": [\"model.layers.0.mlp.gate_proj\"]},"},
        {"linear-class", PARITY_ERR_UNSUPPORTED, "ternarylinear",
         "\"quantization_config\": {\"quant_method\": \"bitnet\", \"linear_class\": "
         "\"ternarylinear\"},"},
        {"online", PARITY_ERR_UNSUPPORTED, "online",
         "\"quantization_config\": {\"quant_method\": \"bitnet\", \"linear_class\": "
         "\"autobitlinear\", \"quantization_mode\": \"online\"},"},
        /* transformers puts an RMSNorm before each BitLinear when use_rms_norm is true */
        {"use-rms-norm", PARITY_ERR_UNSUPPORTED, "quantization_config.use_rms_norm",
         "\"quantization_config\": {\"quant_method\": \"bitnet\", \"use_rms_norm\": true, "
         "\"rms_norm_eps\": 1e-06},"},
        {"use-rms-norm-type", PARITY_ERR_CONFIG, "quantization_config.use_rms_norm",
         "\"quantization_config\": {\"quant_method\": \"bitnet\", \"use_rms_norm\": 1},"},
        {"rms-norm-eps-type", PARITY_ERR_CONFIG, "quantization_config.rms_norm_eps",
         "\"quantization_config\": {\"quant_method\": \"bitnet\", \"rms_norm_eps\": "
         "\"1e-6\"},"},
    };
    check_bad_cases("bitnet", &bn, qcfg, cases, sizeof cases / sizeof cases[0], edit_bitnet_case,
                    orig);
    ckpt_free(&bn);
    parity_model_free(m);
}


/* ---- NVFP4 (ModelOpt) and MXFP4 checkpoints ------------------------------------------------- */

static void check_same_file_in(const char *dir_a, const char *dir_b, const char *file) {
    char pa[PATH_LEN], pb[PATH_LEN];
    join(pa, dir_a, file);
    join(pb, dir_b, file);
    CHECK(same_file(pa, pb));
    if (!same_file(pa, pb)) fprintf(stderr, "  %s differs between %s and %s\n", file, dir_a, dir_b);
}

static int file_present(const char *dir, const char *file) {
    char p[PATH_LEN];
    join(p, dir, file);
    return access(p, F_OK) == 0;
}

/* One 4-bit layout's round trips on model `orig` (named `tag`): saved with each rule, the
 * shipped codes are the quantizer's, the policies of the format score bitwise as orig
 * quantized at load, and the loaded model saves back byte for byte. */
static void fp4_round_trips(const parity_model *orig, const char *tag, const char *format,
                            int gemm, const char *const *rules, const char *policy_base) {
    for (size_t r = 0; rules[r]; r++) {
        char layout[64], name[96], dir[PATH_LEN], again[PATH_LEN], policy[96];
        int rule = -1;
        CHECK_OK(parity_quantizer_from_name(gemm, rules[r], &rule));
        snprintf(layout, sizeof layout, "%s:%s", format, rules[r]);
        snprintf(name, sizeof name, "%s-%s-%s", tag, format, rules[r]);
        save_as(orig, layout, name, dir);
        CHECK(file_present(dir, "hf_quant_config.json") == (gemm == PARITY_GEMM_NVFP4));
        parity_model *m = load(dir);
        if (!m) continue;
        check_shipped(m, orig, gemm, rule,
                      gemm == PARITY_GEMM_NVFP4 ? nvfp4_differences : mxfp4_differences, layout);
        snprintf(policy, sizeof policy, "%s+%s", policy_base, layout);
        const char *pol[] = {policy, NULL};
        /* saved back, with or without the rule named: the shipped codes as they are */
        snprintf(name, sizeof name, "%s-%s-%s-again", tag, format, rules[r]);
        check_scores_and_saved_back(orig, m, pol, dir, r % 2 ? format : layout, name, again, layout);
        if (gemm == PARITY_GEMM_NVFP4) check_same_file_in(dir, again, "hf_quant_config.json");
        parity_model_free(m);
    }
}

/* The NVFP4 cases (test_fp4_checkpoints). */
static void edit_nvfp4_case(bad_variant *v, const char *w, const parity_model *orig) {
    tensor *g = ckpt_get(&v->c, GATE0), *gs = ckpt_get(&v->c, GATE0 "_scale"),
           *g2 = ckpt_get(&v->c, GATE0 "_scale_2");
    if (!strcmp(w, "nibble-count")) { /* one byte short a row: 2 * 31 codes for 64 columns */
        g->shape[1] -= 1;
        g->bytes -= g->shape[0];
    } else if (!strcmp(w, "i8-codes")) snprintf(g->dtype, sizeof g->dtype, "I8");
    else if (!strcmp(w, "missing-block-scales")) ckpt_remove(&v->c, GATE0 "_scale");
    else if (!strcmp(w, "missing-scale-2")) ckpt_remove(&v->c, GATE0 "_scale_2");
    else if (!strcmp(w, "scale-grid")) {
        gs->shape[1] -= 1;
        gs->bytes -= gs->shape[0];
    } else if (!strcmp(w, "f32-block-scales")) {
        const size_t nb = gs->bytes;
        float *d = calloc(nb, 4);
        for (size_t k = 0; k < nb; k++) d[k] = e4m3_of(gs->data[k]);
        tensor_set(gs, "F32", d, nb * 4);
    } else if (!strcmp(w, "nan-block-scale")) gs->data[3] = 0x7f;
    else if (!strcmp(w, "negative-block-scale")) gs->data[3] = 0xb8; /* -1.0 */
    else if (!strcmp(w, "zero-scale-2")) set_scale(g2, 0, 0.0f);
    else if (!strcmp(w, "nan-scale-2")) set_scale(g2, 0, NAN);
    else if (!strcmp(w, "negative-scale-2")) set_scale(g2, 0, -scale_at(g2, 0));
    else if (!strcmp(w, "two-scale-2")) {
        set_two_scales(g2);
        g2->ndim = 1;
    } else if (!strcmp(w, "huge-scale-2")) set_scale(g2, 0, 1e37f); /* 6 * 448 * 1e37 */
    else if (!strcmp(w, "nan-input-scale")) {
        const float in = NAN;
        const uint64_t none = 0;
        ckpt_add(&v->c, "model.layers.0.mlp.gate_proj.input_scale", "F32", 0, &none, &in, 4);
    } else if (!strcmp(w, "scale-of-kept")) {
        tensor_set_bf16(g, model_find_tensor(orig, GATE0)->dst);
    } else if (!strcmp(w, "hfq-no-quantization")) {
        v->file = "hf_quant_config.json";
        v->file_text = "{\"producer\": {\"name\": \"modelopt\"}}";
    }
}

/* The MXFP4 cases (test_fp4_checkpoints). */
static void edit_mxfp4_case(bad_variant *v, const char *w, const parity_model *orig) {
    tensor *g = ckpt_get(&v->c, GATE0 "_blocks"), *gs = ckpt_get(&v->c, GATE0 "_scales");
    if (!strcmp(w, "nibble-count")) { /* blocks of 8 bytes: 16 codes, not 32 */
        g->shape[2] = 8;
        g->bytes /= 2;
    } else if (!strcmp(w, "missing-blocks")) ckpt_remove(&v->c, GATE0 "_blocks");
    else if (!strcmp(w, "weight-and-blocks")) {
        const weight *o = model_find_tensor(orig, GATE0)->dst;
        const uint64_t shape[2] = {o->rows, o->cols};
        ckpt_add(&v->c, GATE0, "BF16", 2, shape, o->bf16, (size_t)o->rows * o->cols * 2);
    } else if (!strcmp(w, "missing-scales")) ckpt_remove(&v->c, GATE0 "_scales");
    else if (!strcmp(w, "scale-grid")) {
        gs->shape[1] += 1;
        uint8_t *d = calloc(gs->shape[0] * gs->shape[1], 1);
        tensor_set(gs, "U8", d, gs->shape[0] * gs->shape[1]);
    } else if (!strcmp(w, "f32-scales")) {
        const size_t nb = gs->bytes;
        float *d = calloc(nb, 4);
        for (size_t k = 0; k < nb; k++) d[k] = ldexpf(1.0f, (int)gs->data[k] - 127);
        tensor_set(gs, "F32", d, nb * 4);
    } else if (!strcmp(w, "nan-scale")) gs->data[2] = 0xff;
    else if (!strcmp(w, "overflow")) { /* 6 * 2^127 */
        gs->data[0] = 0xfe;
        g->data[0] = 0x77;
    }
}

static void test_fp4_checkpoints(const parity_model *orig) {
    char nv_dir[PATH_LEN], mx_dir[PATH_LEN], dir[PATH_LEN];
    /* two codes a byte, the low nibble the even column (ModelOpt's q[1::2] << 4 | q[0::2],
     * torchao's pack_uint4), as a model holds them: row 0 codes (0x1, 0xA, 0x7) -> bytes 0xA1,
     * 0x07; row 1 (0xF, 0x0, 0x3) -> 0x0F, 0x03; padded to MXFP4's 16 bytes a 32-block, zero */
    {
        const uint8_t codes[6] = {0x1, 0xA, 0x7, 0xF, 0x0, 0x3};
        const quant_format *nv = quant_format_row(PARITY_GEMM_NVFP4);
        uint8_t packed[4], blocks[32];
        CHECK_INT(quant_weight_row_bytes(nv, 3), 2);
        quant_codes_pack_row(nv, codes, 3, packed);
        quant_codes_pack_row(nv, codes + 3, 3, packed + 2);
        CHECK_INT(packed[0], 0xA1);
        CHECK_INT(packed[1], 0x07);
        CHECK_INT(packed[2], 0x0F);
        CHECK_INT(packed[3], 0x03);
        memset(blocks, 0xee, sizeof blocks);
        fp4_pad_rows(packed, 2, 3, 16, blocks);
        size_t padding = 0;
        for (size_t i = 0; i < 32; i++) padding += i % 16 >= 2 && blocks[i] == 0;
        CHECK_INT(padding, 28);
        CHECK(!memcmp(blocks, packed, 2) && !memcmp(blocks + 16, packed + 2, 2));
        CHECK_INT(e8m0_from_pow2(ldexpf(1.0f, -127)), 0);
        CHECK_INT(e8m0_from_pow2(1.0f), 127);
        CHECK_INT(e8m0_from_pow2(ldexpf(1.0f, 127)), 254);
    }
    const char *nv_rules[] = {"modelopt", "te", "torchao", NULL};
    const char *mx_rules[] = {"ocp", "rceil", "microxcaling", NULL};
    fp4_round_trips(orig, "tiny", "nvfp4", PARITY_GEMM_NVFP4, nv_rules, "vllm");
    fp4_round_trips(orig, "tiny", "mxfp4", PARITY_GEMM_MXFP4, mx_rules, "vllm");
    /* an odd intermediate size: NVFP4 pads a row's last byte, both formats a partial block */
    parity_config oc = *parity_model_config(orig);
    oc.intermediate_size = 149;
    parity_model *odd = NULL;
    CHECK_OK(parity_model_synthetic(&oc, 5, &odd));
    if (odd) {
        const char *one_nv[] = {"modelopt", NULL}, *one_mx[] = {"ocp", NULL};
        fp4_round_trips(odd, "odd", "nvfp4", PARITY_GEMM_NVFP4, one_nv, "hf-eager");
        fp4_round_trips(odd, "odd", "mxfp4", PARITY_GEMM_MXFP4, one_mx, "hf-eager");
    }
    /* the 4-bit codes are what a shipped model's other readers see dequantized: as bf16 */
    save_as(orig, "nvfp4:modelopt", "nvfp4", nv_dir);
    save_as(orig, "mxfp4:ocp", "mxfp4", mx_dir);
    parity_model *m = load(nv_dir);
    if (m) {
        save_as(m, "bf16", "nvfp4-as-bf16", dir);
        CHECK(!file_present(dir, "hf_quant_config.json"));
        parity_model *mb = load(dir);
        const char *bf16_only[] = {"hf-eager", NULL};
        check_same_scores(m, mb, bf16_only, "an NVFP4 model saved as bf16");
        parity_model_free(mb);
        /* an NVFP4 model holds no fp8-block codes: saved as fp8-block it needs a rule, which
         * quantizes its dequantized values as it does the same values saved as fp32 */
        char fp8_a[PATH_LEN], fp8_b[PATH_LEN];
        join(fp8_a, root, "nvfp4-as-fp8-no-rule");
        CHECK(mkdir(fp8_a, 0700) == 0);
        CHECK_STATUS(parity_model_save_as(m, fp8_a, "fp8-block"), PARITY_ERR_INVALID_ARGUMENT);
        check_message("fp8-block:RULE");
        save_as(m, "fp8-block:deepseek", "nvfp4-as-fp8", fp8_a);
        save_as(m, "fp32", "nvfp4-as-fp32", dir);
        parity_model *m32 = load(dir);
        if (m32) {
            save_as(m32, "fp8-block:deepseek", "nvfp4-fp32-as-fp8", fp8_b);
            check_same_files(fp8_a, fp8_b, "an NVFP4 model saved as fp8-block:deepseek");
        }
        parity_model_free(m32);
        /* saving another layout over an NVFP4 directory removes its hf_quant_config.json */
        save_as(m, "nvfp4", "nvfp4-then-bf16", dir);
        CHECK_OK(parity_model_save_as(m, dir, "bf16"));
        CHECK(!file_present(dir, "hf_quant_config.json"));
        parity_model *mb2 = load(dir);
        CHECK(mb2 != NULL);
        parity_model_free(mb2);
    }
    parity_model *mx = load(mx_dir);
    const char *nv_pol[] = {"vllm+nvfp4:modelopt", NULL};
    /* hf_quant_config.json alone says how the files are quantized, as ModelOpt's exports do */
    ckpt nv;
    ckpt_read_in(&nv, nv_dir);
    {
        write_fp8_variant("nvfp4-hfq-only", &nv, tiny_dir, NULL, dir);
        char *text = copy_file_in(nv_dir, dir, "hf_quant_config.json");
        CHECK(text && strstr(text, "\"quant_algo\": \"NVFP4\"") && strstr(text, "\"group_size\": 16"));
        free(text);
        parity_model *mh = load(dir);
        check_same_scores(m, mh, nv_pol, "NVFP4 described by hf_quant_config.json alone");
        parity_model_free(mh);
    }
    /* input_scale: ModelOpt's calibrated activation scale, kept and saved back, not read by
     * the GEMM (activations are scaled per token) */
    {
        ckpt c;
        ckpt_copy(&c, &nv);
        const float in = 0.0123f;
        const uint64_t one = 1;
        ckpt_add(&c, "model.layers.0.mlp.gate_proj.input_scale", "F32", 1, &one, &in, 4);
        write_fp8_variant("nvfp4-input-scale", &c, nv_dir, NULL, dir);
        parity_model *mi = load(dir);
        if (mi) {
            CHECK(f32_bits(model_find_tensor(mi, GATE0)->dst->shipped->input_scale) == f32_bits(in));
            check_same_scores(m, mi, nv_pol, "NVFP4 with an input_scale");
            char again[PATH_LEN];
            save_as(mi, "nvfp4", "nvfp4-input-scale-again", again);
            ckpt back;
            ckpt_read_in(&back, again);
            tensor *t = ckpt_get(&back, "model.layers.0.mlp.gate_proj.input_scale");
            CHECK(t->ndim == 0 && t->bytes == 4 && scale_at(t, 0) == in);
            ckpt_free(&back);
            parity_model_free(mi);
        }
        ckpt_free(&c);
    }

    printf("NVFP4 failures, as expected:\n");
    const char *nv_cfg = "\"quantization_config\": {\"quant_method\": \"modelopt\", \"quant_algo\": "
                         "\"NVFP4\", \"group_size\": 16},";
    static const bad_case nv_cases[] = {
        {"nibble-count", PARITY_ERR_TENSOR_SHAPE, GATE0, NULL},
        {"i8-codes", PARITY_ERR_TENSOR_DTYPE, GATE0, NULL},
        {"missing-block-scales", PARITY_ERR_SCALE_MISSING, GATE0 "_scale", NULL},
        {"missing-scale-2", PARITY_ERR_SCALE_MISSING, GATE0 "_scale_2", NULL},
        {"scale-grid", PARITY_ERR_SCALE_GRID, GATE0 "_scale", NULL},
        {"f32-block-scales", PARITY_ERR_TENSOR_DTYPE, GATE0 "_scale", NULL},
        {"nan-block-scale", PARITY_ERR_SCALE_VALUE, GATE0 "_scale", NULL},
        {"negative-block-scale", PARITY_ERR_SCALE_VALUE, GATE0 "_scale", NULL},
        {"zero-scale-2", PARITY_ERR_SCALE_VALUE, GATE0 "_scale_2", NULL},
        {"nan-scale-2", PARITY_ERR_SCALE_VALUE, GATE0 "_scale_2", NULL},
        {"negative-scale-2", PARITY_ERR_SCALE_VALUE, GATE0 "_scale_2", NULL},
        {"two-scale-2", PARITY_ERR_SCALE_GRID, GATE0 "_scale_2", NULL},
        {"huge-scale-2", PARITY_ERR_TENSOR_NONFINITE, GATE0, NULL},
        {"nan-input-scale", PARITY_ERR_SCALE_VALUE, "gate_proj.input_scale", NULL},
        {"scale-of-kept", PARITY_ERR_TENSOR_UNEXPECTED, GATE0 "_scale",
         "\"quantization_config\": {\"quant_method\": \"modelopt\", \"quant_algo\": "
         "\"NVFP4\", \"exclude_modules\": [\"lm_head\", \"model.layers.0.mlp.gate_*\"]},"},
        {"mixed-precision", PARITY_ERR_UNSUPPORTED, "MIXED_PRECISION",
         "\"quantization_config\": {\"quant_method\": \"modelopt\", \"quant_algo\": "
         "\"MIXED_PRECISION\"},"},
        {"group-32", PARITY_ERR_UNSUPPORTED, "group_size",
         "\"quantization_config\": {\"quant_method\": \"modelopt\", \"quant_algo\": "
         "\"NVFP4\", \"group_size\": 32},"},
        {"fp8-kv-cache", PARITY_ERR_UNSUPPORTED, "kv_cache_quant_algo",
         "\"quantization_config\": {\"quant_method\": \"modelopt\", \"quant_algo\": "
         "\"NVFP4\", \"kv_cache_quant_algo\": \"FP8\"},"},
        {"hfq-no-quantization", PARITY_ERR_CONFIG, "hf_quant_config.json", NO_QUANT_CONFIG},
    };
    check_bad_cases("nvfp4", &nv, nv_cfg, nv_cases, sizeof nv_cases / sizeof nv_cases[0],
                    edit_nvfp4_case, orig);
    /* the odd model's down_proj: 149 columns, 75 bytes a row, the last high nibble pad */
    check_padding_refused("nvfp4", "odd-nvfp4-modelopt", "model.layers.1.mlp.down_proj.weight", 74,
                          0xff, 0x10, 1,
                          &(bad_case){"padding-nibble", PARITY_ERR_TENSOR_SHAPE, "padding", NULL});
    /* a gate_proj kept in bf16 by an exclude_modules pattern loads (the case above without its
     * stray scales) */
    {
        ckpt c;
        ckpt_copy(&c, &nv);
        tensor_set_bf16(ckpt_get(&c, GATE0), model_find_tensor(orig, GATE0)->dst);
        ckpt_remove(&c, GATE0 "_scale");
        ckpt_remove(&c, GATE0 "_scale_2");
        write_fp8_variant("nvfp4-kept-gate", &c, tiny_dir,
                          "\"quantization_config\": {\"quant_method\": \"modelopt\", \"quant_algo\": "
                          "\"NVFP4\", \"exclude_modules\": [\"lm_head\", \"model.layers.0.mlp.gate_*\"]},",
                          dir);
        parity_model *mk = load(dir);
        if (mk) {
            CHECK(model_find_tensor(mk, GATE0)->dst->keep_bf16 && !model_find_tensor(mk, GATE0)->dst->shipped);
            char again[PATH_LEN];
            save_as(mk, "nvfp4", "nvfp4-kept-gate-again", again);
            char *text = read_in(again, "config.json");
            CHECK(text && strstr(text, "\"model.layers.0.mlp.gate_proj\""));
            free(text);
            parity_model_free(mk);
        }
        ckpt_free(&c);
    }
    ckpt_free(&nv);

    printf("MXFP4 failures, as expected:\n");
    ckpt mc;
    ckpt_read_in(&mc, mx_dir);
    const char *mx_cfg = "\"quantization_config\": {\"quant_method\": \"mxfp4\"},";
    static const bad_case mx_cases[] = {
        {"nibble-count", PARITY_ERR_TENSOR_SHAPE, GATE0 "_blocks", NULL},
        {"missing-blocks", PARITY_ERR_TENSOR_MISSING, GATE0 "_blocks", NULL},
        {"weight-and-blocks", PARITY_ERR_TENSOR_UNEXPECTED, GATE0, NULL},
        {"missing-scales", PARITY_ERR_SCALE_MISSING, GATE0 "_scales", NULL},
        {"scale-grid", PARITY_ERR_SCALE_GRID, GATE0 "_scales", NULL},
        {"f32-scales", PARITY_ERR_TENSOR_DTYPE, GATE0 "_scales", NULL},
        {"nan-scale", PARITY_ERR_SCALE_VALUE, GATE0 "_scales", NULL},
        {"overflow", PARITY_ERR_TENSOR_NONFINITE, GATE0 "_blocks", NULL},
    };
    check_bad_cases("mxfp4", &mc, mx_cfg, mx_cases, sizeof mx_cases / sizeof mx_cases[0],
                    edit_mxfp4_case, orig);
    /* the odd model's down_proj: 149 columns in 5 blocks, codes 149..159 are padding; row 0,
     * block 4, byte 15 holds codes 158 and 159 (zero, as padding is) */
    check_padding_refused("mxfp4", "odd-mxfp4-ocp", "model.layers.1.mlp.down_proj.weight_blocks",
                          79, 0x00, 0x20, 0,
                          &(bad_case){"padding-code", PARITY_ERR_TENSOR_SHAPE, "padding", NULL});
    ckpt_free(&mc);
    parity_model_free(mx);
    parity_model_free(m);
    parity_model_free(odd);
}

int main(void) {
    snprintf(root, sizeof root, "/tmp/parity-checkpoint-XXXXXX");
    if (!mkdtemp(root)) {
        perror("mkdtemp");
        return 1;
    }

    if (!quick()) test_real_size(); /* a 0.6B model: too heavy for the sanitizer tiers */

    parity_model *orig = NULL;
    CHECK_OK(parity_model_open("synthetic:tiny:5", &orig));
    if (!orig) {
        remove_tree(root);
        return check_report("checkpoint");
    }
    for (uint32_t i = 0; i < TINY_LEN; i++)
        tiny_tokens[i] = (int32_t)((i * 37u + 11u) % parity_model_config(orig)->vocab_size);
    join(tiny_dir, root, "tiny");
    CHECK(mkdir(tiny_dir, 0700) == 0);
    CHECK_OK(parity_model_save(orig, tiny_dir));
    parity_model *saved = load(tiny_dir);
    if (saved) check_config_equal(parity_model_config(orig), parity_model_config(saved));
    check_same_scores(orig, saved, all_presets, "tiny saved and loaded");
    parity_model_free(saved);

    char path[PATH_LEN];
    join(path, tiny_dir, "model.safetensors");
    ckpt base;
    ckpt_read(&base, path);
    CHECK(base.n > 0 && base.n < 256);

    test_float_dtypes(orig, &base);
    test_fp16_weights(&base);
    test_layouts(orig, &base);
    test_fp8_checkpoints(orig, &base);
    test_bitnet_checkpoints(orig);
    test_fp4_checkpoints(orig);
    printf("failures, as expected:\n");
    test_bad_tensors(&base);
    test_bad_shards(&base);
    test_specs();

    ckpt_free(&base);
    parity_model_free(orig);
    remove_tree(root);
    return check_report("checkpoint");
}
