/* The calls that read a model's tensors by name and set a quantized weight's codes
 * (parity_model_weight_info, _weight_values, _weight_codes, parity_model_set_quantized), through
 * the public header alone: their argument errors and bad names, wrong buffer sizes, that a
 * failed call changes nothing, values and codes bit for bit as the documented rules give them,
 * that the policies of a format read set codes and other policies do not, and that a save in
 * the format's layout writes them (and that another format's layout does not, a BitNet
 * checkpoint's codes included). */
#include <math.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include "fixtures.h"

#define Q_PROJ "model.layers.0.self_attn.q_proj.weight"
#define DOWN_PROJ "model.layers.1.mlp.down_proj.weight"

static void *xcalloc(size_t n) {
    void *p = calloc(1, n ? n : 1);
    if (!p) abort();
    return p;
}

static uint32_t bits(float x) {
    uint32_t u;
    memcpy(&u, &x, 4);
    return u;
}

/* A linear weight's shape and, for `quantizer`, its code and scale counts. */
typedef struct shape {
    uint64_t rows, cols, n, n_scales;
} shape;

static shape shape_of(const parity_model *m, const char *name, int quantizer) {
    parity_weight_info info = {.size = sizeof info};
    CHECK_OK(parity_model_weight_info(m, name, &info));
    shape s = {info.shape[0], info.shape[1], info.shape[0] * info.shape[1], 0};
    s.n_scales = parity_quant_scale_count(quantizer, s.rows, s.cols) + 1;
    return s;
}

/* The weight's values, in a new buffer. */
static float *values_of(const parity_model *m, const char *name) {
    const shape s = shape_of(m, name, 0);
    float *x = xcalloc(s.n * sizeof *x);
    CHECK_OK(parity_model_weight_values(m, name, x, s.n));
    return x;
}

/* m saved in `layout` to a temporary directory and loaded back (the directory removed: the
 * loaded model keeps its files mapped); NULL if either failed (CHECK_OK of each). */
static parity_model *round_trip(const parity_model *m, const char *layout) {
    char dir[] = "/tmp/parity-test-weights-XXXXXX", cmd[64];
    parity_model *back = NULL;
    CHECK(mkdtemp(dir) != NULL);
    CHECK_OK(parity_model_save_as(m, dir, layout));
    CHECK_OK(parity_model_load(dir, &back));
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    CHECK_INT(system(cmd), 0);
    return back;
}

static void test_info_and_errors(const parity_model *m) {
    const parity_config *c = parity_model_config(m);
    parity_weight_info info = {.size = sizeof info};
    CHECK_OK(parity_model_weight_info(m, Q_PROJ, &info));
    CHECK_FIELDS(FIELD(info, ndim, 2), FIELD(info, shape[0], c->num_attention_heads * c->head_dim),
                 FIELD(info, shape[1], c->hidden_size), FIELD(info, has_master, 0),
                 FIELD(info, quantized, 1));
    CHECK_OK(parity_model_weight_info(m, "model.norm.weight", &info));
    CHECK_FIELDS(FIELD(info, ndim, 1), FIELD(info, shape[0], c->hidden_size),
                 FIELD(info, shape[1], 1), FIELD(info, quantized, 0));
    CHECK_OK(parity_model_weight_info(m, "model.embed_tokens.weight", &info));
    CHECK_FIELDS(FIELD(info, ndim, 2), FIELD(info, shape[0], c->vocab_size),
                 FIELD(info, quantized, 0));
    CHECK_INT(parity_struct_size("parity_weight_info"), sizeof info);

    /* bad arguments, bad names: each status, the name in the message, *info untouched */
    parity_weight_info keep = info;
    CHECK_STATUS(parity_model_weight_info(NULL, Q_PROJ, &info), PARITY_ERR_INVALID_ARGUMENT);
    CHECK_STATUS(parity_model_weight_info(m, NULL, &info), PARITY_ERR_INVALID_ARGUMENT);
    CHECK_STATUS(parity_model_weight_info(m, Q_PROJ, NULL), PARITY_ERR_INVALID_ARGUMENT);
    CHECK_STATUS(parity_model_weight_info(m, "model.layers.9.mlp.up_proj.weight", &info),
                 PARITY_ERR_TENSOR_UNEXPECTED);
    CHECK(strstr(parity_last_error(), "model.layers.9.mlp.up_proj.weight") != NULL);
    info.size = sizeof info - 4;
    CHECK_STATUS(parity_model_weight_info(m, Q_PROJ, &info), PARITY_ERR_INVALID_ARGUMENT);
    info.size = sizeof info;
    CHECK(!memcmp(&info, &keep, sizeof info));

    const shape s = shape_of(m, Q_PROJ, 0);
    float *x = xcalloc((s.n + 1) * sizeof *x);
    CHECK_STATUS(parity_model_weight_values(m, Q_PROJ, x, s.n - 1), PARITY_ERR_INVALID_ARGUMENT);
    CHECK(strstr(parity_last_error(), "values") != NULL);
    CHECK_STATUS(parity_model_weight_values(m, Q_PROJ, x, s.n + 1), PARITY_ERR_INVALID_ARGUMENT);
    CHECK_STATUS(parity_model_weight_values(m, Q_PROJ, NULL, s.n), PARITY_ERR_INVALID_ARGUMENT);
    CHECK_STATUS(parity_model_weight_values(m, "lm_head.bias", x, s.n),
                 PARITY_ERR_TENSOR_UNEXPECTED);
    /* a bf16 model's values are its bf16 values: each one a bf16 value */
    CHECK_OK(parity_model_weight_values(m, Q_PROJ, x, s.n));
    size_t not_bf16 = 0;
    for (uint64_t i = 0; i < s.n; i++) not_bf16 += (bits(x[i]) & 0xffffu) != 0;
    CHECK_INT(not_bf16, 0);

    const int q = PARITY_QUANT_NVFP4_MODELOPT;
    const shape sq = shape_of(m, Q_PROJ, q);
    uint8_t *codes = xcalloc(sq.n);
    float *scales = xcalloc(sq.n_scales * sizeof *scales);
    CHECK_STATUS(parity_model_weight_codes(m, Q_PROJ, q, codes, sq.n - 1, scales, sq.n_scales),
                 PARITY_ERR_INVALID_ARGUMENT);
    CHECK_STATUS(parity_model_weight_codes(m, Q_PROJ, q, codes, sq.n, scales, sq.n_scales - 1),
                 PARITY_ERR_INVALID_ARGUMENT);
    CHECK_STATUS(parity_model_weight_codes(m, Q_PROJ, q, NULL, sq.n, scales, sq.n_scales),
                 PARITY_ERR_INVALID_ARGUMENT);
    CHECK_STATUS(parity_model_weight_codes(m, Q_PROJ, 99, codes, sq.n, scales, sq.n_scales),
                 PARITY_ERR_POLICY);
    CHECK_STATUS(parity_model_weight_codes(m, "model.norm.weight", q, codes, sq.n, scales,
                                           sq.n_scales), PARITY_ERR_INVALID_ARGUMENT);
    CHECK(strstr(parity_last_error(), "model.norm.weight") != NULL);
    CHECK_STATUS(parity_model_weight_codes(m, "nonesuch", q, codes, sq.n, scales, sq.n_scales),
                 PARITY_ERR_TENSOR_UNEXPECTED);
    free(x), free(codes), free(scales);
}

static void test_codes_are_the_rules(const parity_model *m);

/* Values after updates: F32 data is kept as the master and returned as it is; BF16 data
 * widened exactly (and the master dropped). */
static void test_values_after_updates(parity_model *m) {
    const shape s = shape_of(m, DOWN_PROJ, 0);
    float *sent = xcalloc(s.n * sizeof *sent), *got = xcalloc(s.n * sizeof *got);
    uint16_t *sent_bf16 = xcalloc(s.n * 2);
    float *widened = xcalloc(s.n * sizeof *widened);
    uint64_t state = 7;
    for (uint64_t i = 0; i < s.n; i++) {
        sent[i] = (float)((int64_t)(xorshift64(&state) % 20001) - 10000) * 1.37e-6f;
        uint32_t u = bits(sent[i]);
        sent_bf16[i] = (uint16_t)(u >> 16) ^ (uint16_t)(i & 1); /* any bf16 bits */
        u = (uint32_t)sent_bf16[i] << 16;
        memcpy(&widened[i], &u, 4);
    }
    parity_tensor_data t = {DOWN_PROJ, PARITY_DTYPE_F32, 2, {s.rows, s.cols}, sent};
    CHECK_OK(parity_model_update(m, &t, 1));
    parity_weight_info info = {.size = sizeof info};
    CHECK_OK(parity_model_weight_info(m, DOWN_PROJ, &info));
    CHECK_INT(info.has_master, 1);
    CHECK_OK(parity_model_weight_values(m, DOWN_PROJ, got, s.n));
    CHECK_BITS_F32(got, sent, s.n, "the F32 update's masters");
    test_codes_are_the_rules(m); /* quantized from the master */
    t = (parity_tensor_data){DOWN_PROJ, PARITY_DTYPE_BF16, 2, {s.rows, s.cols}, sent_bf16};
    CHECK_OK(parity_model_update(m, &t, 1));
    CHECK_OK(parity_model_weight_info(m, DOWN_PROJ, &info));
    CHECK_INT(info.has_master, 0);
    CHECK_OK(parity_model_weight_values(m, DOWN_PROJ, got, s.n));
    CHECK_BITS_F32(got, widened, s.n, "the BF16 update's values widened");
    free(sent), free(got), free(sent_bf16), free(widened);
}

/* Without codes of its own, a weight's codes are the quantizer's of its values, every rule. */
static void test_codes_are_the_rules(const parity_model *m) {
    float *x = values_of(m, DOWN_PROJ);
    for (int q = PARITY_FP8Q_DEEPSEEK; q <= PARITY_QUANT_NVFP4_TE_2D; q++) {
        const shape s = shape_of(m, DOWN_PROJ, q);
        uint8_t *want = xcalloc(s.n), *got = xcalloc(s.n);
        float *want_s = xcalloc(s.n_scales * 4), *got_s = xcalloc(s.n_scales * 4);
        CHECK_OK(parity_quantize_weight(q, s.rows, s.cols, x, s.cols, want, want_s));
        CHECK_OK(parity_model_weight_codes(m, DOWN_PROJ, q, got, s.n, got_s, s.n_scales));
        CHECK(!memcmp(want, got, s.n));
        if (q >= PARITY_QUANT_TERNARY_BITNET && q <= PARITY_QUANT_TERNARY_ONEBITLLMS) {
            /* no block scale: its slot reads 0 */
            CHECK_INT(bits(got_s[0]), 0);
            want_s[0] = 0.0f;
        }
        CHECK_BITS_F32(got_s, want_s, s.n_scales, parity_quantizer_name(q));
        free(want), free(got), free(want_s), free(got_s);
    }
    free(x);
}

/* The log-probs of one sequence under the policy of a name. */
static void score(const parity_model *m, const char *policy, float *out) {
    static const int32_t tokens[12] = {1, 17, 200, 3, 99, 4, 250, 31, 8, 64, 128, 5};
    const uint32_t len = 12;
    parity_scorer_params p;
    parity_scorer_default_params(&p);
    CHECK_OK(parity_policy_from_name(policy, &p.policy));
    parity_scorer *s = NULL;
    CHECK_OK(parity_scorer_create(m, &p, &s));
    parity_score_options o;
    parity_score_default_options(&o);
    CHECK_OK(parity_score(s, &o, tokens, &len, 1, out, NULL, NULL, NULL));
    parity_scorer_free(s);
}

/* Every linear weight of m given codes of `quantizer`'s format: the rule's own codes of the
 * values, or (`other` >= 0) those of rule `other` of the same format. */
static void set_all(parity_model *m, int quantizer, int other, uint32_t scale_dtype) {
    const parity_config *c = parity_model_config(m);
    static const char *const names[7] = {"self_attn.q_proj", "self_attn.k_proj",
                                         "self_attn.v_proj", "self_attn.o_proj",
                                         "mlp.gate_proj",    "mlp.up_proj", "mlp.down_proj"};
    int gemm = -1; /* the quantizer's format */
    for (uint32_t g = PARITY_GEMM_FP8_BLOCK; g <= PARITY_GEMM_TERNARY; g++) {
        int found;
        if (parity_quantizer_from_name(g, parity_quantizer_name(quantizer), &found) == 0 &&
            found == quantizer)
            gemm = (int)g;
    }
    CHECK(gemm > 0);
    for (uint32_t l = 0; l < c->num_hidden_layers; l++)
        for (int j = 0; j < 7; j++) {
            char name[96];
            snprintf(name, sizeof name, "model.layers.%u.%s.weight", l, names[j]);
            const shape s = shape_of(m, name, quantizer);
            float *x = values_of(m, name);
            uint8_t *codes = xcalloc(s.n);
            float *scales = xcalloc(s.n_scales * 4);
            CHECK_OK(parity_quantize_weight(other >= 0 ? other : quantizer, s.rows, s.cols, x,
                                            s.cols, codes, scales));
            CHECK_OK(parity_model_set_quantized(m, name, (uint32_t)gemm, codes, s.n, scales,
                                                s.n_scales, scale_dtype));
            free(x), free(codes), free(scales);
        }
}

/* Set codes are what the policies of the format read, and nothing else. */
static void test_policies_read_set_codes(void) {
    parity_model *plain = NULL, *same = NULL, *other = NULL;
    CHECK_OK(parity_model_open("synthetic:tiny:5", &plain));
    CHECK_OK(parity_model_open("synthetic:tiny:5", &same));
    CHECK_OK(parity_model_open("synthetic:tiny:5", &other));
    if (!plain || !same || !other) return;
    const uint64_t v0 = parity_model_version(same);
    /* the rule's own codes, given as set codes: its policy's log-probs bit for bit */
    set_all(same, PARITY_QUANT_NVFP4_TE, -1, PARITY_DTYPE_F32);
    CHECK_INT(parity_model_version(same), v0 + 14);
    /* the te rule's codes where the policy's rule is torchao: the policy reads te's codes */
    set_all(other, PARITY_QUANT_NVFP4_TORCHAO, PARITY_QUANT_NVFP4_TE, PARITY_DTYPE_F32);
    float a[11], b[11], c[11];
    score(plain, "hf-eager+nvfp4:te", a);
    score(same, "hf-eager+nvfp4:te", b);
    CHECK_BITS_F32(a, b, 11, "the rule's codes set");
    /* torchao's activations on te's weight codes: not the plain torchao policy's */
    score(plain, "hf-eager+nvfp4:torchao", a);
    score(other, "hf-eager+nvfp4:torchao", c);
    size_t same_bits = 0;
    for (int i = 0; i < 11; i++) same_bits += bits(a[i]) == bits(c[i]);
    CHECK(same_bits < 11);
    /* the bf16 policy and other formats read the values, which set codes leave as they were */
    score(plain, "hf-eager", a);
    score(other, "hf-eager", c);
    CHECK_BITS_F32(a, c, 11, "bf16 policy of a model with set codes");
    score(plain, "hf-eager+mxfp4:ocp", a);
    score(other, "hf-eager+mxfp4:ocp", c);
    CHECK_BITS_F32(a, c, 11, "another format's policy of a model with set codes");
    float *x0 = values_of(plain, Q_PROJ), *x1 = values_of(other, Q_PROJ);
    const shape s = shape_of(plain, Q_PROJ, 0);
    CHECK_BITS_F32(x0, x1, s.n, "values after set codes");
    free(x0), free(x1);
    parity_model_free(plain), parity_model_free(same), parity_model_free(other);
}

/* Codes and scales of one weight before and after a refused call: the same. */
typedef struct snapshot {
    uint64_t version;
    uint8_t codes[64 * 160];
    float scales[64 * 10 + 1];
} snapshot;

static void take(const parity_model *m, int quantizer, snapshot *s) {
    const shape sh = shape_of(m, DOWN_PROJ, quantizer);
    s->version = parity_model_version(m);
    CHECK(sh.n <= sizeof s->codes && sh.n_scales <= sizeof s->scales / 4);
    CHECK_OK(parity_model_weight_codes(m, DOWN_PROJ, quantizer, s->codes, sh.n, s->scales,
                                       sh.n_scales));
}

static void test_refusals_change_nothing(void) {
    parity_model *m = NULL;
    CHECK_OK(parity_model_open("synthetic:tiny:9", &m));
    if (!m) return;
    static snapshot before, after;
    const int nv = PARITY_QUANT_NVFP4_MODELOPT, tern = PARITY_QUANT_TERNARY_BITNET;
    const shape s = shape_of(m, DOWN_PROJ, nv), st = shape_of(m, DOWN_PROJ, tern);
    const shape sf = shape_of(m, DOWN_PROJ, PARITY_FP8Q_DEEPSEEK);
    const shape sm = shape_of(m, DOWN_PROJ, PARITY_QUANT_MXFP4_OCP);
    uint8_t *codes = xcalloc(s.n);
    float *scales = xcalloc(s.n * 4);
    float *x = values_of(m, DOWN_PROJ);
    for (int pass = 0; pass < 2; pass++) {
        /* pass 1: the weight already holds set codes, which a refusal must keep */
        if (pass) set_all(m, nv, -1, PARITY_DTYPE_F32);
        take(m, nv, &before);
        const uint32_t NV = PARITY_GEMM_NVFP4;
        CHECK_OK(parity_quantize_weight(nv, s.rows, s.cols, x, s.cols, codes, scales));
/* the call refused with `status`, its message saying `says`, nothing changed */
#define REFUSED(call, status, says)                                            \
    do {                                                                       \
        CHECK_STATUS(call, status);                                            \
        CHECK(strstr(parity_last_error(), says) != NULL);                      \
        take(m, nv, &after);                                                   \
        CHECK_INT(after.version, before.version);                              \
        CHECK(!memcmp(before.codes, after.codes, s.n));                        \
        CHECK_BITS_F32(before.scales, after.scales, s.n_scales, #call);        \
    } while (0)
        REFUSED(parity_model_set_quantized(NULL, DOWN_PROJ, NV, codes, s.n, scales, s.n_scales,
                                           PARITY_DTYPE_F32), PARITY_ERR_INVALID_ARGUMENT, "NULL");
        REFUSED(parity_model_set_quantized(m, "nope", NV, codes, s.n, scales, s.n_scales,
                                           PARITY_DTYPE_F32), PARITY_ERR_TENSOR_UNEXPECTED, "nope");
        REFUSED(parity_model_set_quantized(m, "model.layers.0.input_layernorm.weight", NV, codes,
                                           s.n, scales, s.n_scales, PARITY_DTYPE_F32),
                PARITY_ERR_INVALID_ARGUMENT, "input_layernorm");
        REFUSED(parity_model_set_quantized(m, DOWN_PROJ, PARITY_GEMM_BF16, codes, s.n, scales,
                                           s.n_scales, PARITY_DTYPE_F32),
                PARITY_ERR_INVALID_ARGUMENT, "gemm 0");
        REFUSED(parity_model_set_quantized(m, DOWN_PROJ, NV, codes, s.n - 1, scales, s.n_scales,
                                           PARITY_DTYPE_F32), PARITY_ERR_INVALID_ARGUMENT, "codes");
        REFUSED(parity_model_set_quantized(m, DOWN_PROJ, NV, codes, s.n, scales, s.n_scales + 1,
                                           PARITY_DTYPE_F32), PARITY_ERR_INVALID_ARGUMENT, "scales");
        REFUSED(parity_model_set_quantized(m, DOWN_PROJ, NV, codes, s.n, NULL, s.n_scales,
                                           PARITY_DTYPE_F32), PARITY_ERR_INVALID_ARGUMENT, "scales is NULL");
        /* NVFP4 scales are stored E4M3: no BF16 choice */
        REFUSED(parity_model_set_quantized(m, DOWN_PROJ, NV, codes, s.n, scales, s.n_scales,
                                           PARITY_DTYPE_BF16), PARITY_ERR_INVALID_ARGUMENT, "scale_dtype");
        REFUSED(parity_model_set_quantized(m, DOWN_PROJ, NV, codes, s.n, scales, s.n_scales,
                                           PARITY_DTYPE_F16), PARITY_ERR_INVALID_ARGUMENT, "scale_dtype");
        /* a code that is no E2M1 code, in the last element */
        codes[s.n - 1] = 0x10;
        REFUSED(parity_model_set_quantized(m, DOWN_PROJ, NV, codes, s.n, scales, s.n_scales,
                                           PARITY_DTYPE_F32), PARITY_ERR_INVALID_ARGUMENT, "code 10239");
        codes[s.n - 1] = 0;
        /* a block scale E4M3 cannot hold (0.3), a negative one, an s2 that is NaN */
        const float keep = scales[3], keep_s2 = scales[s.n_scales - 1];
        scales[3] = 0.3f;
        REFUSED(parity_model_set_quantized(m, DOWN_PROJ, NV, codes, s.n, scales, s.n_scales,
                                           PARITY_DTYPE_F32), PARITY_ERR_SCALE_VALUE, "block scale 3");
        scales[3] = -1.0f;
        REFUSED(parity_model_set_quantized(m, DOWN_PROJ, NV, codes, s.n, scales, s.n_scales,
                                           PARITY_DTYPE_F32), PARITY_ERR_SCALE_VALUE, "block scale 3");
        scales[3] = keep;
        scales[s.n_scales - 1] = NAN;
        REFUSED(parity_model_set_quantized(m, DOWN_PROJ, NV, codes, s.n, scales, s.n_scales,
                                           PARITY_DTYPE_F32), PARITY_ERR_SCALE_VALUE, "tensor scale");
        scales[s.n_scales - 1] = keep_s2;
        /* ternary: a code of 2; s_w not positive; s_w not a bf16 value under BF16 */
        CHECK_OK(parity_quantize_weight(tern, st.rows, st.cols, x, st.cols, codes, scales));
        codes[5] = 2;
        REFUSED(parity_model_set_quantized(m, DOWN_PROJ, PARITY_GEMM_TERNARY, codes, st.n, scales,
                                           st.n_scales, PARITY_DTYPE_F32),
                PARITY_ERR_INVALID_ARGUMENT, "code 5");
        codes[5] = 0;
        scales[1] = 0.0f;
        REFUSED(parity_model_set_quantized(m, DOWN_PROJ, PARITY_GEMM_TERNARY, codes, st.n, scales,
                                           st.n_scales, PARITY_DTYPE_F32),
                PARITY_ERR_SCALE_VALUE, "tensor scale");
        scales[1] = 1.0f + 0x1p-20f;
        REFUSED(parity_model_set_quantized(m, DOWN_PROJ, PARITY_GEMM_TERNARY, codes, st.n, scales,
                                           st.n_scales, PARITY_DTYPE_BF16),
                PARITY_ERR_SCALE_VALUE, "bf16 value");
        /* fp8-block: an E4M3 NaN code; a zero scale */
        CHECK_OK(parity_quantize_weight(PARITY_FP8Q_DEEPSEEK, sf.rows, sf.cols, x, sf.cols, codes,
                                        scales));
        codes[7] = 0xff;
        REFUSED(parity_model_set_quantized(m, DOWN_PROJ, PARITY_GEMM_FP8_BLOCK, codes, sf.n,
                                           scales, sf.n_scales, PARITY_DTYPE_F32),
                PARITY_ERR_INVALID_ARGUMENT, "code 7");
        codes[7] = 0;
        scales[0] = 0.0f;
        REFUSED(parity_model_set_quantized(m, DOWN_PROJ, PARITY_GEMM_FP8_BLOCK, codes, sf.n,
                                           scales, sf.n_scales, PARITY_DTYPE_F32),
                PARITY_ERR_SCALE_VALUE, "block scale 0");
        /* MXFP4: a scale that is not a power of two, one below E8M0's range */
        CHECK_OK(parity_quantize_weight(PARITY_QUANT_MXFP4_OCP, sm.rows, sm.cols, x, sm.cols,
                                        codes, scales));
        scales[2] = 3.0f;
        REFUSED(parity_model_set_quantized(m, DOWN_PROJ, PARITY_GEMM_MXFP4, codes, sm.n, scales,
                                           sm.n_scales, PARITY_DTYPE_F32),
                PARITY_ERR_SCALE_VALUE, "power of two");
        scales[2] = 0x1p-130f;
        REFUSED(parity_model_set_quantized(m, DOWN_PROJ, PARITY_GEMM_MXFP4, codes, sm.n, scales,
                                           sm.n_scales, PARITY_DTYPE_F32),
                PARITY_ERR_SCALE_VALUE, "block scale 2");
#undef REFUSED
    }
    free(codes), free(scales), free(x);
    parity_model_free(m);
}

/* m saved in the block-FP8 layout with the deepseek rule: the weight `name` holds, loaded back,
 * the rule's codes and scales of m's values (not codes m holds of another format). */
static void check_saved_as_fp8_block(const parity_model *m, const char *name, const char *what) {
    const int q = PARITY_FP8Q_DEEPSEEK;
    parity_model *back = round_trip(m, "fp8-block:deepseek");
    const shape s = shape_of(m, name, q);
    float *x = values_of(m, name);
    uint8_t *want = xcalloc(s.n), *have = xcalloc(s.n);
    float *want_s = xcalloc(s.n_scales * 4), *have_s = xcalloc(s.n_scales * 4);
    CHECK_OK(parity_quantize_weight(q, s.rows, s.cols, x, s.cols, want, want_s));
    if (back) CHECK_OK(parity_model_weight_codes(back, name, q, have, s.n, have_s, s.n_scales));
    CHECK(!memcmp(want, have, s.n));
    CHECK_BITS_F32(have_s, want_s, s.n_scales, what);
    free(x), free(want), free(have), free(want_s), free(have_s);
    parity_model_free(back);
}

/* Set codes read back, bit for bit, by another rule of the format; a save in the format's
 * layout writes them (BF16 scales where given so), and another format's layout quantizes the
 * values instead. */
static void test_round_trips(void) {
    parity_model *m = NULL;
    CHECK_OK(parity_model_open("synthetic:tiny:3", &m));
    if (!m) return;
    float *x = values_of(m, DOWN_PROJ);
    const struct {
        uint32_t gemm;
        int made_by, read_by;      /* the rule that makes the codes; another that reads them */
        uint32_t scale_dtype;
        const char *layout;        /* the format's layout ("" none) */
    } cases[] = {
        {PARITY_GEMM_TERNARY, PARITY_QUANT_TERNARY_HF_BITLINEAR, PARITY_QUANT_TERNARY_BITNET,
         PARITY_DTYPE_BF16, "bitnet"},
        {PARITY_GEMM_NVFP4, PARITY_QUANT_NVFP4_TORCHAO, PARITY_QUANT_NVFP4_MODELOPT,
         PARITY_DTYPE_F32, "nvfp4"},
        {PARITY_GEMM_MXFP4, PARITY_QUANT_MXFP4_RCEIL, PARITY_QUANT_MXFP4_OCP, PARITY_DTYPE_F32,
         "mxfp4"},
        {PARITY_GEMM_FP8_BLOCK, PARITY_FP8Q_TE, PARITY_FP8Q_DEEPSEEK, PARITY_DTYPE_BF16,
         "fp8-block"},
        {PARITY_GEMM_MXFP8, PARITY_FP8Q_MX_RCEIL, PARITY_FP8Q_MX_OCP, PARITY_DTYPE_F32, ""},
    };
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        const int q = cases[k].made_by;
        const shape s = shape_of(m, DOWN_PROJ, q);
        uint8_t *codes = xcalloc(s.n), *got = xcalloc(s.n);
        float *scales = xcalloc(s.n_scales * 4), *got_s = xcalloc(s.n_scales * 4);
        CHECK_OK(parity_quantize_weight(q, s.rows, s.cols, x, s.cols, codes, scales));
        if (cases[k].scale_dtype == PARITY_DTYPE_BF16) /* BF16 scales: bf16 values */
            for (uint64_t i = 0; i < s.n_scales; i++)
                scales[i] = parity_bf16_to_f32(parity_bf16_from_f32(scales[i]));
        if (cases[k].gemm == PARITY_GEMM_TERNARY) scales[0] = 0.0f; /* the slot reads 0 */
        CHECK_OK(parity_model_set_quantized(m, DOWN_PROJ, cases[k].gemm, codes, s.n, scales,
                                            s.n_scales, cases[k].scale_dtype));
        CHECK_OK(parity_model_weight_codes(m, DOWN_PROJ, cases[k].read_by, got, s.n, got_s,
                                           s.n_scales));
        CHECK(!memcmp(codes, got, s.n));
        CHECK_BITS_F32(got_s, scales, s.n_scales, "set codes read back");
        if (cases[k].layout[0]) {
            /* the format's layout without a rule: every other weight needs codes too */
            char layout[64];
            snprintf(layout, sizeof layout, "%s:%s", cases[k].layout,
                     parity_quantizer_name(q));
            parity_model *back = round_trip(m, layout);
            if (back) {
                memset(got, 0, s.n);
                CHECK_OK(parity_model_weight_codes(back, DOWN_PROJ, cases[k].read_by, got, s.n,
                                                   got_s, s.n_scales));
                CHECK(!memcmp(codes, got, s.n));
                CHECK_BITS_F32(got_s, scales, s.n_scales, layout);
                parity_model_free(back);
            }
        } else { /* MXFP8 codes are no block-FP8 checkpoint's */
            check_saved_as_fp8_block(m, DOWN_PROJ, "fp8-block save of MXFP8 codes");
        }
        free(codes), free(got), free(scales), free(got_s);
    }
    free(x);
    parity_model_free(m);
}

/* A BitNet checkpoint's shipped ternary codes saved in the block-FP8 layout: the layout
 * quantizes the values (what the ternary codes dequantize to) with its rule, as it would any
 * weight without block-FP8 codes, and never writes the ternary codes as E4M3 bytes. */
static void test_bitnet_saved_as_fp8_block(void) {
    parity_model *m = NULL;
    load_model("models/qwen3-bytes-ternary-4.9m", &m);
    if (!m) return;
    check_saved_as_fp8_block(m, Q_PROJ, "fp8-block save of a BitNet checkpoint");
    parity_model_free(m);
}

/* Codes of another format set on a BitNet checkpoint whose ternary codes a prepared ternary
 * policy read: that policy now quantizes the values (what the ternary codes dequantize to,
 * held in fp32), bit for bit as the same values saved in fp32 and loaded do under it. */
static void test_shipped_codes_replaced(void) {
    parity_model *m = NULL;
    load_model("models/qwen3-bytes-ternary-4.9m", &m);
    if (!m) return;
    parity_model *values = round_trip(m, "fp32"); /* the dequantized values, as the model's */
    float shipped[11], after[11], want[11];
    score(m, "hf-eager+ternary:bitnet", shipped); /* prepares the rule, skipping shipped codes */
    set_all(m, PARITY_QUANT_NVFP4_MODELOPT, -1, PARITY_DTYPE_F32);
    score(m, "hf-eager+ternary:bitnet", after);
    if (values) score(values, "hf-eager+ternary:bitnet", want);
    CHECK_BITS_F32(after, want, 11, "the ternary rule on the values once the codes went");
    /* the shipped codes were what the policy read before: not the requantized values' */
    size_t same = 0;
    for (int i = 0; i < 11; i++) same += bits(shipped[i]) == bits(after[i]);
    CHECK(same < 11);
    parity_model_free(values);
    parity_model_free(m);
}

/* A model holding shipped codes alone (loaded from a quantized checkpoint, nothing has asked
 * for its values yet) answers as one whose values a bf16 policy made: it has a master, its
 * values and another format's codes come from the dequantized values, and codes set over it
 * leave those values as they were. */
static void test_codes_held_alone(void) {
    const char *dir = "models/qwen3-bytes-ternary-4.9m";
    const char *name = "model.layers.1.mlp.up_proj.weight";
    parity_model *made = NULL, *lazy = NULL, *lazy2 = NULL, *set = NULL;
    load_model(dir, &made);
    load_model(dir, &lazy);
    load_model(dir, &lazy2);
    load_model(dir, &set);
    if (made && lazy && lazy2 && set) {
        float warm[11];
        score(made, "hf-eager", warm); /* a bf16 policy: the dequantized values made */
        parity_weight_info a = {.size = sizeof a}, b = {.size = sizeof b};
        CHECK_OK(parity_model_weight_info(made, name, &a));
        CHECK_OK(parity_model_weight_info(lazy, name, &b));
        CHECK(a.has_master && b.has_master);
        const int nv = PARITY_QUANT_NVFP4_MODELOPT;
        const shape s = shape_of(made, name, nv);
        float *want = values_of(made, name), *got = values_of(lazy, name);
        CHECK_BITS_F32(got, want, s.n, "the values of codes held alone");
        uint8_t *c0 = xcalloc(s.n), *c1 = xcalloc(s.n);
        float *s0 = xcalloc(s.n_scales * 4), *s1 = xcalloc(s.n_scales * 4);
        CHECK_OK(parity_model_weight_codes(made, name, nv, c0, s.n, s0, s.n_scales));
        CHECK_OK(parity_model_weight_codes(lazy2, name, nv, c1, s.n, s1, s.n_scales));
        CHECK(memcmp(c0, c1, s.n) == 0 && memcmp(s0, s1, s.n_scales * 4) == 0);
        CHECK_OK(parity_model_set_quantized(set, name, PARITY_GEMM_NVFP4, c0, s.n, s0,
                                            s.n_scales, PARITY_DTYPE_F32));
        float *after = values_of(set, name);
        CHECK_BITS_F32(after, want, s.n, "the values once codes of another format were set");
        free(want), free(got), free(after), free(c0), free(c1), free(s0), free(s1);
    }
    parity_model_free(made);
    parity_model_free(lazy);
    parity_model_free(lazy2);
    parity_model_free(set);
}

int main(void) {
    parity_model *trained = NULL, *tiny = NULL;
    load_model(TRAINED_MODEL, &trained);
    if (trained) test_info_and_errors(trained);
    CHECK_OK(parity_model_open("synthetic:tiny", &tiny));
    if (tiny) {
        test_codes_are_the_rules(tiny);
        test_values_after_updates(tiny);
        test_codes_are_the_rules(tiny); /* bf16 values again */
    }
    test_policies_read_set_codes();
    test_refusals_change_nothing();
    test_round_trips();
    test_bitnet_saved_as_fp8_block();
    test_shipped_codes_replaced();
    test_codes_held_alone();
    parity_model_free(trained);
    parity_model_free(tiny);
    return check_report("test_weights_api");
}
