/* The scorer's half of the parity contract: a sequence's log-probs are bitwise the same
 * whatever else shares the call, the order of the sequences, the thread count, the chunking
 * of rows, the capacity that splits sequences into groups, and the CPU path — under every
 * preset and both backends. Also: bad input gets a status, and the optional outputs agree
 * with the log-probs. */
#include <math.h>

#include "fixtures.h"

#if defined(PARITY_HAVE_OPENBLAS)
#include <cblas.h>
/* OpenBLAS's own thread control: the host's, which libparity must never change. */
extern int openblas_get_num_threads(void);
extern void openblas_set_num_threads(int);
#endif

#define N_SEQS 6

typedef struct batch {
    int32_t tokens[4096];
    uint32_t lengths[N_SEQS];
    size_t n_out;
} batch;

static uint64_t rng = 0x1234567;
static uint32_t next_u32(void) { return (uint32_t)(xorshift64(&rng) >> 11); }

static void make_batch(batch *b, uint32_t vocab) {
    static const uint32_t lens[N_SEQS] = {1, 2, 17, 40, 33, 64};
    size_t at = 0;
    b->n_out = 0;
    for (int i = 0; i < N_SEQS; i++) {
        b->lengths[i] = lens[i];
        for (uint32_t t = 0; t < lens[i]; t++) b->tokens[at++] = (int32_t)(next_u32() % vocab);
        b->n_out += lens[i] - 1;
    }
}

static parity_scorer *make_scorer(const parity_model *m, const char *policy, uint32_t backend,
                                  uint32_t threads, uint32_t chunk, uint32_t max_tokens) {
    return new_scorer(m, (fixture){.policy = policy, .backend = backend, .n_threads = threads,
                                   .chunk_rows = chunk, .max_tokens = max_tokens});
}

/* Scores the batch with the given scorer: all at once. */
static void score_all(parity_scorer *s, const parity_score_options *o, const batch *b, float *lp) {
    CHECK_OK(parity_score(s, o, b->tokens, b->lengths, N_SEQS, lp, NULL, NULL, NULL));
}

/* Scores the batch one sequence per call, in reverse order, into the same layout. */
static void score_one_by_one_reversed(parity_scorer *s, const parity_score_options *o,
                                      const batch *b, float *lp) {
    size_t tok_at[N_SEQS], out_at[N_SEQS], t = 0, u = 0;
    for (int i = 0; i < N_SEQS; i++) {
        tok_at[i] = t;
        out_at[i] = u;
        t += b->lengths[i];
        u += b->lengths[i] - 1;
    }
    for (int i = N_SEQS - 1; i >= 0; i--)
        CHECK_OK(parity_score(s, o, b->tokens + tok_at[i], &b->lengths[i], 1, lp + out_at[i],
                              NULL, NULL, NULL));
}

/* The model every policy runs on every CPU path with. The trained model does so for two
 * presets on the bf16 backend: test_golden pins the scorer's bits on every path for the trained
 * model's GEMM and rounding kinds and tiny's every case, and the portable path is several
 * times slower than the SIMD ones. */
static const parity_model *every_path_model;

static int sweeps_paths(const parity_model *m, const char *policy, uint32_t backend) {
    return m == every_path_model ||
           (backend == PARITY_BACKEND_BF16 && (!strcmp(policy, "hf-eager") || !strcmp(policy, "vllm")));
}

static void check_invariance(const parity_model *m, const char *policy, uint32_t backend,
                             const batch *b) {
    char what[128];
    parity_score_options o;
    parity_score_default_options(&o);
    float ref[4096], got[4096];

    parity_scorer *s1 = make_scorer(m, policy, backend, 1, 0, 0);
    if (!s1) return;
    score_all(s1, &o, b, ref);
    for (size_t i = 0; i < b->n_out; i++) CHECK(isfinite(ref[i]) && ref[i] <= 0);

    snprintf(what, sizeof what, "%s/%s: one call per sequence, reversed", policy,
             parity_backend_name((int)backend));
    score_one_by_one_reversed(s1, &o, b, got);
    CHECK_BITS_F32(ref, got, b->n_out, what);

    parity_scorer *s2 = make_scorer(m, policy, backend, 2, 7, 80);
    if (s2) {
        snprintf(what, sizeof what, "%s/%s: 2 threads, chunks of 7 rows, groups of <= 80 cells",
                 policy, parity_backend_name((int)backend));
        score_all(s2, &o, b, got);
        CHECK_BITS_F32(ref, got, b->n_out, what);
        parity_scorer_free(s2);
    }

    /* every CPU path: the portable reference and each SIMD path */
    parity_cpu_path saved = parity_get_cpu_path();
    const int paths = sweeps_paths(m, policy, backend);
    for (int path = PARITY_CPU_PORTABLE; paths && path <= PARITY_CPU_AVX512BF16; path++) {
        if (parity_set_cpu_path((parity_cpu_path)path) != PARITY_OK) continue;
        snprintf(what, sizeof what, "%s/%s: cpu path %s", policy, parity_backend_name((int)backend),
                 parity_cpu_path_name((parity_cpu_path)path));
        score_all(s1, &o, b, got);
        CHECK_BITS_F32(ref, got, b->n_out, what);
    }
    parity_set_cpu_path(saved);

    /* processed mode with a temperature is another function, equally invariant */
    o.mode = PARITY_LOGPROB_PROCESSED;
    o.temperature = 0.7f;
    score_all(s1, &o, b, ref);
    score_one_by_one_reversed(s1, &o, b, got);
    snprintf(what, sizeof what, "%s/%s: processed, T = 0.7", policy, parity_backend_name((int)backend));
    CHECK_BITS_F32(ref, got, b->n_out, what);
    parity_scorer_free(s1);
}

/* entropy and top-n are consistent with the log-probs */
static void check_optional_outputs(const parity_model *m) {
    batch b;
    make_batch(&b, parity_model_config(m)->vocab_size);
    parity_scorer *s = make_scorer(m, "aligned", PARITY_BACKEND_BF16, 2, 0, 0);
    if (!s) return;
    parity_score_options o;
    parity_score_default_options(&o);
    const uint32_t n = 5;
    float lp[4096], lp2[4096], ent[4096], top_lp[4096 * 5];
    int32_t top_id[4096 * 5];
    o.top_n = n;
    CHECK_OK(parity_score(s, &o, b.tokens, b.lengths, N_SEQS, lp, ent, top_id, top_lp));
    o.top_n = 0;
    CHECK_OK(parity_score(s, &o, b.tokens, b.lengths, N_SEQS, lp2, NULL, NULL, NULL));
    CHECK_BITS_F32(lp, lp2, b.n_out, "log-probs with and without the optional outputs");
    const uint32_t V = parity_model_config(m)->vocab_size;
    for (size_t i = 0; i < b.n_out; i++) {
        CHECK(ent[i] >= 0 && ent[i] <= logf((float)V) + 1e-3f);
        CHECK(top_lp[i * n] >= lp[i]);
        for (uint32_t j = 1; j < n; j++) {
            CHECK(top_lp[i * n + j] <= top_lp[i * n + j - 1]);
            CHECK(top_id[i * n + j] != top_id[i * n + j - 1]);
        }
    }
    parity_scorer_free(s);
}

static void check_bad_input(const parity_model *m) {
    parity_scorer *s = make_scorer(m, "hf-eager", PARITY_BACKEND_BF16, 1, 0, 64);
    if (!s) return;
    const parity_config *c = parity_model_config(m);
    parity_score_options o;
    parity_score_default_options(&o);
    int32_t tok[200] = {1, 2, 3, 4};
    uint32_t len = 4, zero = 0;
    float lp[200];

    tok[2] = (int32_t)c->vocab_size;
    CHECK_STATUS(parity_score(s, &o, tok, &len, 1, lp, NULL, NULL, NULL), PARITY_ERR_TOKEN_RANGE);
    CHECK(strstr(parity_last_error(), "position 2") != NULL);
    tok[2] = -1;
    CHECK_STATUS(parity_score(s, &o, tok, &len, 1, lp, NULL, NULL, NULL), PARITY_ERR_TOKEN_RANGE);
    tok[2] = 3;
    CHECK_STATUS(parity_score(s, &o, tok, &zero, 1, lp, NULL, NULL, NULL), PARITY_ERR_EMPTY_INPUT);
    CHECK_STATUS(parity_score(s, &o, tok, &len, 0, lp, NULL, NULL, NULL), PARITY_ERR_EMPTY_INPUT);
    uint32_t too_long = 65; /* capacity 64 */
    CHECK_STATUS(parity_score(s, &o, tok, &too_long, 1, lp, NULL, NULL, NULL), PARITY_ERR_TOO_LONG);
    uint32_t beyond_context = c->max_position_embeddings + 1;
    CHECK_STATUS(parity_score(s, &o, tok, &beyond_context, 1, lp, NULL, NULL, NULL),
                 PARITY_ERR_TOO_LONG);
    CHECK_STATUS(parity_score(s, &o, NULL, &len, 1, lp, NULL, NULL, NULL),
                 PARITY_ERR_INVALID_ARGUMENT);
    CHECK_STATUS(parity_score(NULL, &o, tok, &len, 1, lp, NULL, NULL, NULL),
                 PARITY_ERR_INVALID_ARGUMENT);
    o.mode = PARITY_LOGPROB_PROCESSED;
    o.temperature = -1;
    CHECK_STATUS(parity_score(s, &o, tok, &len, 1, lp, NULL, NULL, NULL),
                 PARITY_ERR_INVALID_ARGUMENT);
    o.temperature = NAN;
    CHECK_STATUS(parity_score(s, &o, tok, &len, 1, lp, NULL, NULL, NULL),
                 PARITY_ERR_INVALID_ARGUMENT);
    o.temperature = 1;
    o.top_p = 0;
    CHECK_STATUS(parity_score(s, &o, tok, &len, 1, lp, NULL, NULL, NULL),
                 PARITY_ERR_INVALID_ARGUMENT);
    o.top_p = 1;
    o.mode = 9;
    CHECK_STATUS(parity_score(s, &o, tok, &len, 1, lp, NULL, NULL, NULL),
                 PARITY_ERR_INVALID_ARGUMENT);
    parity_score_default_options(&o);
    o.size = 4;
    CHECK_STATUS(parity_score(s, &o, tok, &len, 1, lp, NULL, NULL, NULL),
                 PARITY_ERR_INVALID_ARGUMENT);
    parity_score_default_options(&o);
    o.top_n = 3;
    CHECK_STATUS(parity_score(s, &o, tok, &len, 1, lp, NULL, NULL, NULL),
                 PARITY_ERR_INVALID_ARGUMENT);
    /* after all that, the scorer still works */
    parity_score_default_options(&o);
    CHECK_OK(parity_score(s, &o, tok, &len, 1, lp, NULL, NULL, NULL));
    parity_scorer_free(s);

    /* bad scorer params */
    parity_scorer_params p;
    parity_scorer *x = NULL;
    parity_scorer_default_params(&p);
    p.size = 3;
    CHECK_STATUS(parity_scorer_create(m, &p, &x), PARITY_ERR_INVALID_ARGUMENT);
    parity_scorer_default_params(&p);
    p.backend = 7;
    CHECK_STATUS(parity_scorer_create(m, &p, &x), PARITY_ERR_INVALID_ARGUMENT);
    parity_scorer_default_params(&p);
    p.policy.attention = 9;
    CHECK_STATUS(parity_scorer_create(m, &p, &x), PARITY_ERR_POLICY);
    CHECK(x == NULL);
    parity_scorer_free(NULL);

    parity_policy pol;
    CHECK_STATUS(parity_policy_from_name("vllm+nonsense", &pol), PARITY_ERR_POLICY);
    CHECK_STATUS(parity_policy_from_name("hf", &pol), PARITY_ERR_POLICY);
    CHECK_OK(parity_policy_from_name("vllm+aligned+fp32-head", &pol));
    CHECK_INT(pol.logits, PARITY_LOGITS_FP32);
    CHECK_INT(pol.swiglu, PARITY_SWIGLU_FUSED);
    CHECK_INT(pol.attention, PARITY_ATTN_FLASH);
    CHECK_OK(parity_policy_from_name("hf-eager+aligned+fp16", &pol));
    CHECK_INT(pol.compute, PARITY_COMPUTE_FP16);
    CHECK_INT(pol.swiglu, PARITY_SWIGLU_FUSED);
    CHECK_INT(pol.attention, PARITY_ATTN_EAGER);
    CHECK_STATUS(parity_policy_from_name("fp32+fp16", &pol), PARITY_ERR_POLICY);
    CHECK(strstr(parity_last_error(), "fp32") != NULL);
    CHECK_OK(parity_policy_from_name("vllm+fp8-block:te-pow2", &pol));
    CHECK(pol.gemm == PARITY_GEMM_FP8_BLOCK && pol.quantizer == PARITY_FP8Q_TE_POW2);
    CHECK_INT(pol.attention, PARITY_ATTN_FLASH);
    CHECK_OK(parity_policy_from_name("hf-eager+mxfp8:te", &pol));
    CHECK(pol.gemm == PARITY_GEMM_MXFP8 && pol.quantizer == PARITY_FP8Q_MX_RCEIL);
    CHECK_OK(parity_policy_from_name("hf-eager+aligned+fp8-block:sglang", &pol));
    CHECK(pol.quantizer == PARITY_FP8Q_SGLANG && pol.swiglu == PARITY_SWIGLU_FUSED);
    const char *const bad_fp8[] = {"vllm+fp8-block", "vllm+fp8-block:", "vllm+fp8-block:ocp",
                                   "vllm+mxfp8:deepseek", "fp32+fp8-block:te",
                                   "vllm+fp16+mxfp8:te", "vllm+aligned:x", "vllm+fp8-block:te:1",
                                   NULL};
    for (int i = 0; bad_fp8[i]; i++)
        CHECK_STATUS(parity_policy_from_name(bad_fp8[i], &pol), PARITY_ERR_POLICY);
    /* the 4-bit and ternary modifiers: each rule maps to its quantizer, its format's only */
    static const struct {
        const char *name;
        int gemm, quantizer;
    } fmt4[] = {{"vllm+nvfp4:modelopt", PARITY_GEMM_NVFP4, PARITY_QUANT_NVFP4_MODELOPT},
                {"vllm+nvfp4:te", PARITY_GEMM_NVFP4, PARITY_QUANT_NVFP4_TE},
                {"aligned+nvfp4:torchao", PARITY_GEMM_NVFP4, PARITY_QUANT_NVFP4_TORCHAO},
                {"vllm+nvfp4:te-2d", PARITY_GEMM_NVFP4, PARITY_QUANT_NVFP4_TE_2D},
                {"vllm+mxfp4:ocp", PARITY_GEMM_MXFP4, PARITY_QUANT_MXFP4_OCP},
                {"vllm+mxfp4:rceil", PARITY_GEMM_MXFP4, PARITY_QUANT_MXFP4_RCEIL},
                {"sglang+mxfp4:microxcaling", PARITY_GEMM_MXFP4, PARITY_QUANT_MXFP4_MICROXCALING},
                {"hf-eager+ternary:bitnet", PARITY_GEMM_TERNARY, PARITY_QUANT_TERNARY_BITNET},
                {"hf-eager+ternary:hf-bitlinear", PARITY_GEMM_TERNARY, PARITY_QUANT_TERNARY_HF_BITLINEAR},
                {"hf-eager+ternary:onebitllms", PARITY_GEMM_TERNARY, PARITY_QUANT_TERNARY_ONEBITLLMS}};
    for (size_t i = 0; i < sizeof fmt4 / sizeof fmt4[0]; i++) {
        CHECK_OK(parity_policy_from_name(fmt4[i].name, &pol));
        CHECK_INT(pol.gemm, fmt4[i].gemm);
        CHECK_INT(pol.quantizer, fmt4[i].quantizer);
        CHECK_OK(parity_policy_validate(&pol));
        CHECK(!strcmp(parity_quantizer_name(pol.quantizer), strchr(fmt4[i].name, ':') + 1));
    }
    const char *const bad_fmt4[] = {"vllm+nvfp4", "vllm+nvfp4:ocp", "vllm+mxfp4:te",
                                    "vllm+ternary:", "vllm+ternary:bitnet:x", "fp32+ternary:bitnet",
                                    "vllm+fp16+nvfp4:te", "vllm+nvfp4:te+mxfp4:ocp",
                                    "vllm+mxfp4:ocp+fp8-block:te", NULL};
    for (int i = 0; bad_fmt4[i]; i++)
        CHECK_STATUS(parity_policy_from_name(bad_fmt4[i], &pol), PARITY_ERR_POLICY);
    CHECK(strstr(parity_last_error(), "one quantized format") != NULL);
    CHECK_OK(parity_policy_from_name("vllm", &pol));
    pol.gemm = PARITY_GEMM_NVFP4;
    pol.quantizer = PARITY_QUANT_MXFP4_OCP; /* a rule of another format */
    CHECK_STATUS(parity_policy_validate(&pol), PARITY_ERR_POLICY);
    pol.quantizer = PARITY_QUANT_NVFP4_TE_2D + 1; /* past the last rule */
    CHECK_STATUS(parity_policy_validate(&pol), PARITY_ERR_POLICY);
    pol.gemm = PARITY_GEMM_TERNARY + 1;
    pol.quantizer = 0;
    CHECK_STATUS(parity_policy_validate(&pol), PARITY_ERR_POLICY);
    int q = -1;
    CHECK_STATUS(parity_quantizer_from_name(PARITY_GEMM_BF16, "te", &q), PARITY_ERR_POLICY);
    CHECK_OK(parity_quantizer_from_name(PARITY_GEMM_MXFP4, "rceil", &q));
    CHECK_INT(q, PARITY_QUANT_MXFP4_RCEIL);
    CHECK(parity_quantizer_name(PARITY_QUANT_NVFP4_TE_2D + 1) == NULL);
    /* the switches checked: a quantizer of the other family, fp8 on fp16, a stray quantizer */
    parity_policy sw;
    CHECK_OK(parity_policy_from_name("vllm", &sw));
    sw.quantizer = PARITY_FP8Q_TE;
    CHECK_STATUS(parity_policy_validate(&sw), PARITY_ERR_POLICY);
    sw.gemm = PARITY_GEMM_MXFP8;
    CHECK_STATUS(parity_policy_validate(&sw), PARITY_ERR_POLICY);
    sw.quantizer = PARITY_FP8Q_MX_OCP;
    CHECK_OK(parity_policy_validate(&sw));
    sw.compute = PARITY_COMPUTE_FP16;
    CHECK_STATUS(parity_policy_validate(&sw), PARITY_ERR_POLICY);
}

#if defined(PARITY_HAVE_OPENBLAS)
/* A host that uses OpenBLAS itself: its thread setting survives, its own sgemm works. */
static float host_sgemm(void) {
    float a[4] = {1, 2, 3, 4}, b[4] = {5, 6, 7, 8}, c[4];
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, 2, 2, 2, 1.0f, a, 2, b, 2, 0.0f, c, 2);
    return c[0] + c[1] + c[2] + c[3]; /* 17 + 23 + 39 + 53 */
}
#endif

int main(void) {
#if defined(PARITY_HAVE_OPENBLAS)
    openblas_set_num_threads(1); /* the host's choice */
    CHECK(host_sgemm() == 132.0f);
#endif
    parity_model *tiny, *trained;
    if (!load_tiny_and_trained("synthetic:tiny:3", &tiny, &trained)) return check_report("scorer");
    every_path_model = tiny;

    const char *const *presets = parity_policy_preset_names();
    const char *extra[] = {"vllm+aligned", "hf-sdpa+fp32-head", "hf-eager+fp16", "vllm+fp16",
                           "vllm+fp8-block:deepseek", "aligned+fp8-block:te-pow2",
                           "hf-eager+mxfp8:te", "vllm+nvfp4:modelopt", "vllm+mxfp4:ocp",
                           "hf-eager+ternary:bitnet", NULL};
    parity_model *models[] = {tiny, trained};
    /* quick mode: every other preset (fp32, flash and eager attention all met), no extras */
    const int every = quick() ? 2 : 1;
    for (int mi = 0; mi < 2; mi++) {
        batch b;
        make_batch(&b, parity_model_config(models[mi])->vocab_size);
        for (uint32_t backend = PARITY_BACKEND_BF16; backend <= PARITY_BACKEND_AMX; backend++) {
            for (int i = 0; presets[i]; i++)
                if (i % every == 0 && backend_runs(backend))
                    check_invariance(models[mi], presets[i], backend, &b);
            for (int i = 0; extra[i] && !quick(); i++)
                if (backend_runs(backend)) check_invariance(models[mi], extra[i], backend, &b);
        }
    }
    check_optional_outputs(trained);
    check_bad_input(tiny);
    parity_model_free(tiny);
    parity_model_free(trained);
    parity_model_free(NULL);
#if defined(PARITY_HAVE_OPENBLAS)
    CHECK_INT(openblas_get_num_threads(), 1);
    CHECK(host_sgemm() == 132.0f);
#endif
    return check_report("scorer");
}
