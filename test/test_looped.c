/* Looped models (Ouro): the sampler exits early and records each position's depth; the
 * scorer replays that schedule and returns the sampler's log-probs bit for bit.
 *
 *   - Under every preset and both KV rules (LAST_EXITED, FULL), for random prompts, sampling
 *     settings and exit rules (thresholds from 0 to 1 with random depth bounds, fixed depths
 *     from 1 to all loops, every loop), generation is run with batches of 1, 3 and 32,
 *     members stepped in random subsets, prefill chunks of 1..256 rows, forked or fresh, 1 or
 *     2 threads, every CPU path: tokens, log-probs and depth schedules are identical across
 *     all of them, and the scorer given the schedule (in one call for all sequences, in
 *     chunks of 5 rows) returns the log-probs bitwise, and so does the scorer re-deriving the
 *     depths with the same exit rule and policy.
 *   - Schedules that exit at depth 1 and that never exit early are among them (checked).
 *   - The dense scorer (every loop for every token) disagrees with an early-exit sampler;
 *     LAST_EXITED and FULL give different log-probs once depths vary.
 *   - The exit distribution's dtype: with the gate's bias raised so that every loop's exit
 *     probability is 0.9997, HF's bf16 CDF rounds to exactly 1 after the first loop, so the
 *     threshold 1 exits at depth 1 under exit_dist "model", and at depth 3 under "fp32"
 *     (where 1 - 4e-11 rounds to 1).
 *   - The fixed-loop model (no gate): FIXED and FULL run, THRESHOLD is refused.
 *   - The KV cache holds loops x layers planes (its bytes per token), a checkpoint saved and
 *     loaded back scores the same bits, and bad input gets a status: depths of 0 or above the
 *     loops, an unknown KV rule or exit rule, a threshold outside [0, 1], min above max, an
 *     exit rule on a model that does not loop, config fields out of range, an Ouro
 *     checkpoint missing its gate or a second norm. */
#include <math.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "fixtures.h"
#include "checkpoint/config_json.h"
#include "engine/kvcache.h"

#define N_SEQS 24
#define MAX_NEW 14
#define MAX_PROMPT 30
#define MAX_LEN (MAX_PROMPT + MAX_NEW)

typedef struct gen_case {
    int32_t prompt[MAX_PROMPT];
    uint32_t prompt_len;
    parity_sampling sampling[N_SEQS];
} gen_case;

typedef struct gen_result {
    COMPLETION_MEMBERS(N_SEQS, MAX_NEW);
    uint32_t depths[N_SEQS][MAX_LEN];  /* the schedule: per position of prompt + completion */
} gen_result;

typedef struct run_config {
    uint32_t threads, prefill_chunk, max_batch;
    int fork;
    uint64_t schedule; /* 0: every live sequence each step; else a seed for random subsets */
    const char *name;
} run_config;

static void make_case(gen_case *c, const parity_config *cfg, uint64_t seed) {
    uint64_t r = seed * 0x9e3779b97f4a7c15ull + 7;
    const uint32_t T = cfg->total_ut_steps;
    c->prompt_len = 1 + (uint32_t)(xorshift64(&r) % MAX_PROMPT);
    for (uint32_t t = 0; t < c->prompt_len; t++)
        c->prompt[t] = (int32_t)(xorshift64(&r) % cfg->vocab_size);
    static const float temps[] = {0.0f, 0.7f, 1.0f, 1.2f};
    static const float thresholds[] = {0.0f, 0.3f, 0.5f, 0.65f, 0.8f, 0.9f, 0.99f, 1.0f};
    for (int i = 0; i < N_SEQS; i++) {
        parity_sampling *s = &c->sampling[i];
        parity_sampling_default(s);
        s->temperature = temps[xorshift64(&r) % 4];
        s->top_k = xorshift64(&r) % 2 ? 0 : 20;
        s->seed = seed;
        s->max_new_tokens = 3 + (uint32_t)(xorshift64(&r) % (MAX_NEW - 3));
        s->logprob_mode = (uint32_t)(xorshift64(&r) % 3);
        const uint32_t kind = (uint32_t)(xorshift64(&r) % 4);
        if (kind == 0) {
            s->exit_rule = PARITY_EXIT_FULL;
        } else if (kind == 1 || !cfg->early_exit_gate) {
            s->exit_rule = PARITY_EXIT_FIXED;
            s->max_depth = 1 + (uint32_t)(xorshift64(&r) % T); /* 1 .. T */
        } else {
            s->exit_rule = PARITY_EXIT_THRESHOLD;
            s->exit_threshold = thresholds[xorshift64(&r) % 8];
            s->min_depth = (uint32_t)(xorshift64(&r) % 3);      /* 0 (= 1), 1, 2 */
            s->max_depth = s->min_depth + (uint32_t)(xorshift64(&r) % (T - s->min_depth + 1));
            if (s->max_depth == 0) s->max_depth = T;
        }
    }
}

static int run(const parity_model *m, const char *policy, uint32_t loop_kv, const gen_case *c,
               const run_config *rc, gen_result *out) {
    parity_sampler_params p = sampler_params((fixture){
        .policy = policy, .n_threads = rc->threads, .prefill_chunk = rc->prefill_chunk,
        .max_batch = rc->max_batch, .max_seqs = N_SEQS + 1, .max_len = MAX_LEN});
    p.loop_kv = loop_kv;
    uint32_t ids[N_SEQS];
    parity_sampler *s = sampler_generate(
        m, &p, (generation){c->prompt, c->prompt_len, c->sampling, rc->fork, 0 /* in order */, 10 * MAX_NEW,
                            rc->schedule}, ids, COMPLETIONS_OF(out));
    if (!s) return 0;
    for (int i = 0; i < N_SEQS; i++) {
        const uint32_t *d;
        uint32_t nd;
        CHECK_OK(parity_sampler_depths(s, ids[i], &d, &nd));
        CHECK_INT(nd, c->prompt_len + out->n[i] - 1);
        memcpy(out->depths[i], d, nd * sizeof *d);
        out->depths[i][nd] = 1; /* the last position's depth: not used */
    }
    parity_sampler_free(s);
    return 1;
}

/* The same completions, and the same depth schedules. */
static void compare(gen_result *a, gen_result *b, uint32_t prompt_len, const char *what) {
    check_same_completions(COMPLETIONS_OF(a), COMPLETIONS_OF(b), what);
    for (int i = 0; i < N_SEQS; i++)
        if (a->n[i] == b->n[i])
            CHECK(!memcmp(a->depths[i], b->depths[i], (prompt_len + a->n[i]) * sizeof(uint32_t)));
}

/* How the scorer runs a looped model's positions. */
enum { DENSE, REPLAY, RULE };

/* The scorer on each sequence of the case (one call each: the options carry its mode), with
 * chunk_rows `chunk`: dense (every loop), replaying the sampler's depths, or re-deriving them
 * with the sequence's exit rule. Returns the mean |log-prob - sampler's| over the finite
 * differences. */
static double score_case(const parity_model *m, const char *policy, uint32_t loop_kv,
                         uint32_t chunk, int how, const gen_case *c, const gen_result *g,
                         int expect_bitwise, const char *what) {
    parity_scorer *s = new_scorer(m, (fixture){.policy = policy, .chunk_rows = chunk});
    if (!s) return 0;
    double sum = 0;
    size_t count = 0;
    for (int i = 0; i < N_SEQS; i++) {
        int32_t seq[MAX_LEN];
        uint32_t len = prompt_then(seq, c->prompt, c->prompt_len, g->tokens[i], g->n[i]);
        const parity_sampling *sp = &c->sampling[i];
        /* (top_p and min_p: the sampling's defaults, the same as the options') */
        parity_score_options o = score_options_of(sp);
        o.depths = how == REPLAY ? g->depths[i] : NULL;
        o.loop_kv = loop_kv;
        if (how == RULE) {
            o.exit_rule = sp->exit_rule;
            o.exit_threshold = sp->exit_threshold;
            o.min_depth = sp->min_depth;
            o.max_depth = sp->max_depth;
            o.prompt_len = c->prompt_len;
        }
        float lp[MAX_LEN];
        CHECK_OK(parity_score(s, &o, seq, &len, 1, lp, NULL, NULL, NULL));
        if (expect_bitwise) {
            char w[200];
            snprintf(w, sizeof w, "%s: sequence %d (exit rule %u, threshold %g, depths %u..%u)",
                     what, i, sp->exit_rule, (double)sp->exit_threshold, sp->min_depth,
                     sp->max_depth);
            CHECK_BITS_F32(lp + c->prompt_len - 1, g->logprobs[i], g->n[i], w);
        }
        for (uint32_t t = 0; t < g->n[i]; t++) {
            /* (a truncated mode gives -inf to a token outside the dense learner's support) */
            const double d = fabs((double)lp[c->prompt_len - 1 + t] - (double)g->logprobs[i][t]);
            if (isfinite(d)) sum += d, count++;
        }
    }
    parity_scorer_free(s);
    return count ? sum / (double)count : 0;
}

/* The schedules that occurred: some position at depth 1, some decode position below the
 * model's loops, some sequence that never exited early. */
static void tally(const gen_case *c, const gen_result *g, uint32_t T, int *depth1, int *early,
                  int *never) {
    for (int i = 0; i < N_SEQS; i++) {
        int any_early = 0;
        for (uint32_t j = 0; j + 1 < c->prompt_len + g->n[i]; j++) {
            const uint32_t d = g->depths[i][j];
            CHECK(d >= 1 && d <= T);
            if (j + 1 < c->prompt_len) CHECK_INT(d, T); /* the prompt: every loop */
            if (d == 1) (*depth1)++;
            if (d < T) any_early = 1;
        }
        *early += any_early;
        *never += !any_early && g->n[i] > 1;
    }
}

static void check_policy(const parity_model *m, const char *policy, uint32_t loop_kv,
                         uint64_t seed, int *depth1, int *early, int *never) {
    const parity_config *cfg = parity_model_config(m);
    gen_case c;
    make_case(&c, cfg, seed);
    static const run_config configs[] = {
        {1, 256, 32, 0, 0, "fresh prefill, one batch, 1 thread"},
        {2, 5, 3, 1, 0, "forked, batches of 3, chunks of 5, 2 threads"},
        {1, 1, 1, 1, 77, "forked, batch 1, chunks of 1, random subsets"},
        {2, 7, 32, 0, 1234, "fresh prefill, random subsets, 2 threads"},
    };
    static gen_result ref, got;
    char what[200];
    if (!run(m, policy, loop_kv, &c, &configs[0], &ref)) return;
    for (size_t k = 1; k < sizeof configs / sizeof configs[0]; k++) {
        if (!run(m, policy, loop_kv, &c, &configs[k], &got)) continue;
        snprintf(what, sizeof what, "%s, kv %u: %s", policy, loop_kv, configs[k].name);
        compare(&ref, &got, c.prompt_len, what);
    }
    parity_cpu_path saved = parity_get_cpu_path();
    for (int path = PARITY_CPU_PORTABLE; path <= PARITY_CPU_AVX512BF16; path++) {
        if (parity_set_cpu_path((parity_cpu_path)path) != PARITY_OK) continue;
        if (!run(m, policy, loop_kv, &c, &configs[1], &got)) continue;
        snprintf(what, sizeof what, "%s, kv %u: cpu path %s", policy, loop_kv,
                 parity_cpu_path_name((parity_cpu_path)path));
        compare(&ref, &got, c.prompt_len, what);
    }
    parity_set_cpu_path(saved);
    snprintf(what, sizeof what, "%s, kv %u: replaying scorer", policy, loop_kv);
    score_case(m, policy, loop_kv, 256, REPLAY, &c, &ref, 1, what);
    snprintf(what, sizeof what, "%s, kv %u: replaying scorer in chunks of 5", policy, loop_kv);
    score_case(m, policy, loop_kv, 5, REPLAY, &c, &ref, 1, what);
    snprintf(what, sizeof what, "%s, kv %u: scorer re-deriving the depths by the rule", policy,
             loop_kv);
    score_case(m, policy, loop_kv, 7, RULE, &c, &ref, 1, what);
    tally(&c, &ref, cfg->total_ut_steps, depth1, early, never);
    if (cfg->early_exit_gate) {
        const double dense = score_case(m, policy, loop_kv, 256, DENSE, &c, &ref, 0, "");
        printf("%-9s kv %-11s dense learner vs early-exit sampler: mean |dlogp| %.6f\n", policy,
               loop_kv ? "full" : "last-exited", dense);
        CHECK(dense > 0);
    }
}

/* LAST_EXITED and FULL on the same case: the same tokens and depths until the first token
 * where a later position reads a plane the exited one did not compute; some log-prob moves. */
static void check_kv_rules_differ(const parity_model *m) {
    gen_case c;
    make_case(&c, parity_model_config(m), 42);
    for (int i = 0; i < N_SEQS; i++) {
        c.sampling[i].exit_rule = PARITY_EXIT_THRESHOLD;
        c.sampling[i].exit_threshold = 0.5f + 0.02f * (float)i;
        c.sampling[i].temperature = 0.0f;
    }
    static gen_result last, full;
    const run_config rc = {1, 256, 32, 0, 0, "one batch"};
    if (!run(m, "aligned", PARITY_LOOP_KV_LAST_EXITED, &c, &rc, &last) ||
        !run(m, "aligned", PARITY_LOOP_KV_FULL, &c, &rc, &full))
        return;
    size_t differ = 0, total = 0;
    for (int i = 0; i < N_SEQS; i++)
        for (uint32_t t = 0; t < last.n[i] && t < full.n[i]; t++, total++)
            differ += memcmp(&last.logprobs[i][t], &full.logprobs[i][t], 4) != 0;
    printf("LAST_EXITED vs FULL K/V: %zu of %zu log-probs differ\n", differ, total);
    CHECK(differ > 0);
}

/* The gate's bias raised to +8: lambda = 0.99966 at every loop. Under exit_dist "model" the
 * first loop's CDF rounds to bf16 1.0 (1 - 2^-9 and above do), which the threshold 1 reaches;
 * under "fp32" it is 1 - 3.4e-4, then 1 - 1.2e-7, and only the third loop's (1 - 4e-11)
 * rounds to fp32 1.0. */
static void check_exit_dist_dtype(void) {
    parity_model *m = NULL;
    CHECK_OK(parity_model_open("synthetic:ouro-tiny:3", &m));
    if (!m) return;
    const float bias = 8.0f;
    const parity_tensor_data t = {"model.early_exit_gate.bias", PARITY_DTYPE_F32, 1, {1, 0}, &bias};
    CHECK_OK(parity_model_update(m, &t, 1));
    const uint32_t T = parity_model_config(m)->total_ut_steps;
    const int32_t prompt[4] = {5, 6, 7, 8};
    for (int dist = 0; dist < 2; dist++) {
        parity_sampler_params p;
        parity_sampler_default_params(&p);
        CHECK_OK(parity_policy_from_name("hf-eager", &p.policy));
        p.policy.exit_dist = dist == 0 ? PARITY_EXIT_DIST_MODEL : PARITY_EXIT_DIST_FP32;
        p.max_seqs = 1;
        p.max_len = 16;
        parity_sampler *s = NULL;
        CHECK_OK(parity_sampler_create(m, &p, &s));
        if (!s) continue;
        parity_sampling sp;
        parity_sampling_default(&sp);
        sp.exit_rule = PARITY_EXIT_THRESHOLD;
        sp.exit_threshold = 1.0f;
        uint32_t id;
        CHECK_OK(parity_sampler_add(s, prompt, 4, &sp, 0, &id));
        int32_t tok;
        float lp;
        uint32_t fin;
        for (int k = 0; k < 4; k++) CHECK_OK(parity_sampler_step(s, &id, 1, &tok, &lp, &fin, 0, NULL, NULL));
        const uint32_t *d;
        uint32_t n;
        CHECK_OK(parity_sampler_depths(s, id, &d, &n));
        CHECK_INT(n, 7);
        /* positions 0..3 are the prompt (every loop); 4..6 are decode steps */
        for (uint32_t j = 4; j < n; j++) CHECK_INT(d[j], dist == 0 ? 1u : 3u);
        CHECK(T > 3);
        printf("exit_dist %s, threshold 1, lambda 0.99966: decode depth %u\n",
               dist == 0 ? "model (bf16)" : "fp32", d[n - 1]);
        parity_sampler_free(s);
    }
    parity_model_free(m);
}

/* config_parse of the smallest Ouro config.json with `members` (", "-led, or "") added. */
static int parse_ouro_json(const char *members, parity_config *c) {
    char text[512];
    const int len = snprintf(text, sizeof text,
                             "{\"model_type\": \"ouro\", \"vocab_size\": 300, "
                             "\"hidden_size\": 64, \"intermediate_size\": 96, "
                             "\"num_hidden_layers\": 2, \"num_attention_heads\": 4%s}", members);
    return config_parse(text, (size_t)len, "ouro.json", c);
}

static void check_config(void) {
    parity_config c;
    CHECK_OK(parity_config_builtin("ouro-1.4b", &c));
    CHECK_INT(c.arch, PARITY_ARCH_OURO);
    CHECK_INT(c.num_hidden_layers, 24);
    CHECK_INT(c.total_ut_steps, 4);
    CHECK_INT(c.early_exit_gate, 1);
    CHECK_INT(c.vocab_size, 49152);
    CHECK_INT(c.num_key_value_heads, 16);
    /* the KV cache: loops x layers planes; 768 KiB a token for Ouro-1.4B's bf16 cells */
    CHECK_INT(kv_cache_bytes(&c, 16, 0) / 16, 2ull * 4 * 24 * 16 * 128 * 2);
    CHECK_INT(kv_cache_bytes(&c, 16, 0) / 16, 768u * 1024u);
    CHECK_OK(parity_config_builtin("ouro-2.6b", &c));
    CHECK_INT(c.num_hidden_layers, 48);
    CHECK_OK(parity_config_builtin("ouro-tiny-fixed", &c));
    CHECK_INT(c.early_exit_gate, 0);
    CHECK_INT(c.total_ut_steps, 3);
    parity_config bad = c;
    bad.total_ut_steps = 0;
    CHECK_STATUS(parity_model_synthetic(&bad, 1, &(parity_model *){NULL}), PARITY_ERR_CONFIG);
    bad = c;
    bad.early_exit_threshold = 1.5f;
    CHECK_STATUS(parity_model_synthetic(&bad, 1, &(parity_model *){NULL}), PARITY_ERR_CONFIG);
    bad = c;
    bad.qk_norm = 1;
    CHECK_STATUS(parity_model_synthetic(&bad, 1, &(parity_model *){NULL}), PARITY_ERR_CONFIG);
    CHECK_OK(parity_config_builtin("tiny", &bad));
    bad.total_ut_steps = 2;
    CHECK_STATUS(parity_model_synthetic(&bad, 1, &(parity_model *){NULL}), PARITY_ERR_CONFIG);

    /* config.json: the smallest Ouro config, with the members given */
    CHECK_OK(parse_ouro_json(", \"num_key_value_heads\": 4, \"total_ut_steps\": 3, "
                             "\"early_exit_threshold\": 0.75, \"use_early_exit_gate\": false, "
                             "\"rope_theta\": 1000000.0", &c));
    CHECK_INT(c.arch, PARITY_ARCH_OURO);
    CHECK_INT(c.total_ut_steps, 3);
    CHECK_INT(c.early_exit_gate, 0);
    CHECK(c.early_exit_threshold == 0.75f);
    CHECK_INT(c.head_dim, 16);
    CHECK_OK(parse_ouro_json("", &c));
    CHECK_INT(c.total_ut_steps, 4); /* configuration_ouro.py's defaults */
    CHECK_INT(c.early_exit_gate, 1);
    CHECK(c.early_exit_threshold == 1.0f);
    CHECK_STATUS(parse_ouro_json(", \"total_ut_steps\": 0", &c), PARITY_ERR_CONFIG);
    CHECK(strstr(parity_last_error(), "total_ut_steps") != NULL);
    CHECK_STATUS(parse_ouro_json(", \"early_exit_threshold\": 2", &c), PARITY_ERR_CONFIG);
    CHECK(strstr(parity_last_error(), "early_exit_threshold") != NULL);
}

static void check_bad_input(const parity_model *ouro, const parity_model *fixed) {
    const uint32_t T = parity_model_config(ouro)->total_ut_steps;
    parity_scorer *s = new_scorer(ouro, (fixture){.policy = "aligned"});
    if (s) {
        const int32_t toks[5] = {1, 2, 3, 4, 5};
        const uint32_t len = 5;
        uint32_t depths[5] = {T, T, 2, 0, 1};
        parity_score_options o;
        parity_score_default_options(&o);
        o.depths = depths;
        float lp[4] = {7, 7, 7, 7};
        CHECK_STATUS(parity_score(s, &o, toks, &len, 1, lp, NULL, NULL, NULL),
                     PARITY_ERR_INVALID_ARGUMENT);
        CHECK(strstr(parity_last_error(), "position 3: depth 0") != NULL);
        depths[3] = T + 1;
        CHECK_STATUS(parity_score(s, &o, toks, &len, 1, lp, NULL, NULL, NULL),
                     PARITY_ERR_INVALID_ARGUMENT);
        CHECK(strstr(parity_last_error(), "depth 5 is not in 1..4") != NULL);
        depths[3] = 2;
        o.loop_kv = 7;
        CHECK_STATUS(parity_score(s, &o, toks, &len, 1, lp, NULL, NULL, NULL),
                     PARITY_ERR_INVALID_ARGUMENT);
        CHECK(strstr(parity_last_error(), "loop_kv") != NULL);
        for (int i = 0; i < 4; i++) CHECK(lp[i] == 7.0f); /* untouched */
        o.loop_kv = PARITY_LOOP_KV_FULL;
        o.exit_rule = PARITY_EXIT_FIXED;
        CHECK_STATUS(parity_score(s, &o, toks, &len, 1, lp, NULL, NULL, NULL),
                     PARITY_ERR_INVALID_ARGUMENT);
        CHECK(strstr(parity_last_error(), "both depths and exit_rule") != NULL);
        o.depths = NULL;
        o.max_depth = T + 1;
        CHECK_STATUS(parity_score(s, &o, toks, &len, 1, lp, NULL, NULL, NULL),
                     PARITY_ERR_INVALID_ARGUMENT);
        for (int i = 0; i < 4; i++) CHECK(lp[i] == 7.0f); /* untouched */
        o.max_depth = 2;
        CHECK_OK(parity_score(s, &o, toks, &len, 1, lp, NULL, NULL, NULL));
        o.exit_rule = PARITY_EXIT_FULL;
        o.depths = depths;
        CHECK_OK(parity_score(s, &o, toks, &len, 1, lp, NULL, NULL, NULL));
        parity_scorer_free(s);
    }

    parity_sampler_params p;
    parity_sampler_default_params(&p);
    p.loop_kv = 2;
    parity_sampler *bad = NULL;
    CHECK_STATUS(parity_sampler_create(ouro, &p, &bad), PARITY_ERR_INVALID_ARGUMENT);
    CHECK(bad == NULL);
    parity_sampler *smp = new_sampler(ouro, (fixture){.policy = "aligned"});
    parity_sampler *fix = new_sampler(fixed, (fixture){.policy = "aligned"});
    parity_model *tiny = NULL;
    CHECK_OK(parity_model_open("synthetic:tiny:1", &tiny));
    parity_sampler *plain = tiny ? new_sampler(tiny, (fixture){.policy = "aligned"}) : NULL;
    if (smp && fix && plain) {
        const int32_t prompt[3] = {1, 2, 3};
        uint32_t id = 12345;
        parity_sampling sp;
        parity_sampling_default(&sp);
        sp.exit_rule = 9;
        CHECK_STATUS(parity_sampler_add(smp, prompt, 3, &sp, 0, &id), PARITY_ERR_INVALID_ARGUMENT);
        sp.exit_rule = PARITY_EXIT_THRESHOLD;
        sp.exit_threshold = 1.5f;
        CHECK_STATUS(parity_sampler_add(smp, prompt, 3, &sp, 0, &id), PARITY_ERR_INVALID_ARGUMENT);
        sp.exit_threshold = NAN;
        CHECK_STATUS(parity_sampler_add(smp, prompt, 3, &sp, 0, &id), PARITY_ERR_INVALID_ARGUMENT);
        sp.exit_threshold = 0.5f;
        sp.min_depth = 3;
        sp.max_depth = 2;
        CHECK_STATUS(parity_sampler_add(smp, prompt, 3, &sp, 0, &id), PARITY_ERR_INVALID_ARGUMENT);
        CHECK(strstr(parity_last_error(), "min_depth 3 is above max_depth 2") != NULL);
        sp.min_depth = 0;
        sp.max_depth = T + 1;
        CHECK_STATUS(parity_sampler_add(smp, prompt, 3, &sp, 0, &id), PARITY_ERR_INVALID_ARGUMENT);
        sp.max_depth = 0;
        /* the fixed-loop model has no gate to read */
        CHECK_STATUS(parity_sampler_add(fix, prompt, 3, &sp, 0, &id), PARITY_ERR_UNSUPPORTED);
        CHECK(strstr(parity_last_error(), "exit gate") != NULL);
        /* a model that does not loop */
        CHECK_STATUS(parity_sampler_add(plain, prompt, 3, &sp, 0, &id), PARITY_ERR_UNSUPPORTED);
        CHECK(strstr(parity_last_error(), "does not loop") != NULL);
        CHECK_INT(id, 12345);
        /* and its depths: 1 everywhere */
        sp.exit_rule = PARITY_EXIT_FULL;
        CHECK_OK(parity_sampler_add(plain, prompt, 3, &sp, 0, &id));
        const uint32_t *d;
        uint32_t n;
        CHECK_OK(parity_sampler_depths(plain, id, &d, &n));
        CHECK_INT(n, 2);
        CHECK(d[0] == 1 && d[1] == 1);
        CHECK_STATUS(parity_sampler_depths(plain, 77, &d, &n), PARITY_ERR_UNKNOWN_SEQUENCE);
    }
    parity_sampler_free(smp);
    parity_sampler_free(fix);
    parity_sampler_free(plain);
    parity_model_free(tiny);
}

/* Replaces `from` by `to` in the file at path (once). */
static void edit_file(const char *path, const char *from, const char *to) {
    FILE *f = fopen(path, "rb");
    CHECK(f != NULL);
    if (!f) return;
    static char text[1 << 16], out[1 << 16];
    size_t n = fread(text, 1, sizeof text - 1, f);
    fclose(f);
    text[n] = 0;
    char *at = strstr(text, from);
    CHECK(at != NULL);
    if (!at) return;
    snprintf(out, sizeof out, "%.*s%s%s", (int)(at - text), text, to, at + strlen(from));
    f = fopen(path, "wb");
    CHECK(f != NULL);
    if (!f) return;
    fputs(out, f);
    fclose(f);
}

static void remove_dir(const char *dir) {
    static const char *const files[] = {"config.json", "model.safetensors"};
    for (size_t i = 0; i < sizeof files / sizeof files[0]; i++) {
        char path[4200];
        snprintf(path, sizeof path, "%s/%s", dir, files[i]);
        unlink(path);
    }
    rmdir(dir);
}

static void check_checkpoints(const parity_model *ouro) {
    char dir[] = "/tmp/parity-looped-XXXXXX";
    CHECK(mkdtemp(dir) != NULL);
    char cfg[4200];
    snprintf(cfg, sizeof cfg, "%s/config.json", dir);
    const int32_t toks[9] = {3, 1, 4, 1, 5, 9, 2, 6, 5};
    const uint32_t len = 9, depths[9] = {4, 4, 4, 2, 1, 3, 4, 2, 1};
    parity_score_options o;
    parity_score_default_options(&o);
    o.depths = depths;
    float before[8], after[8];
    parity_scorer *orig = new_scorer(ouro, (fixture){.policy = "hf-eager"});
    if (orig) score_raw(orig, toks, &len, 1, before);
    parity_scorer_free(orig);

    /* saved and loaded back: the same bits, dense and replayed */
    CHECK_OK(parity_model_save(ouro, dir));
    parity_model *m = NULL;
    CHECK_OK(parity_model_load(dir, &m));
    if (m) {
        CHECK_INT(parity_model_config(m)->total_ut_steps, 4);
        CHECK_INT(parity_model_config(m)->early_exit_gate, 1);
        parity_scorer *back = new_scorer(m, (fixture){.policy = "hf-eager"});
        if (back) score_raw(back, toks, &len, 1, after);
        parity_scorer_free(back);
        CHECK_BITS_F32(before, after, 8, "ouro-tiny saved and loaded, dense");
        parity_scorer *a = new_scorer(ouro, (fixture){.policy = "vllm"});
        parity_scorer *b = new_scorer(m, (fixture){.policy = "vllm"});
        if (a && b) {
            CHECK_OK(parity_score(a, &o, toks, &len, 1, before, NULL, NULL, NULL));
            CHECK_OK(parity_score(b, &o, toks, &len, 1, after, NULL, NULL, NULL));
            CHECK_BITS_F32(before, after, 8, "ouro-tiny saved and loaded, replayed");
        }
        parity_scorer_free(a);
        parity_scorer_free(b);
        parity_model_free(m);
    }
    /* a config that says "no gate" for a checkpoint that has one: the gate is unexpected */
    edit_file(cfg, "\"use_early_exit_gate\": true", "\"use_early_exit_gate\": false");
    m = NULL;
    CHECK(parity_model_load(dir, &m) != PARITY_OK);
    CHECK(m == NULL);
    CHECK(strstr(parity_last_error(), "early_exit_gate") != NULL);
    printf("gate not in the config: %s\n", parity_last_error());
    remove_dir(dir);

    /* the fixed-loop model's checkpoint read as one with a gate: the gate is missing */
    CHECK(mkdtemp(strcpy(dir, "/tmp/parity-looped-XXXXXX")) != NULL);
    snprintf(cfg, sizeof cfg, "%s/config.json", dir);
    parity_model *fixed = NULL;
    CHECK_OK(parity_model_open("synthetic:ouro-tiny-fixed:2", &fixed));
    CHECK_OK(parity_model_save(fixed, dir));
    parity_model_free(fixed);
    edit_file(cfg, "\"use_early_exit_gate\": false", "\"use_early_exit_gate\": true");
    CHECK(parity_model_load(dir, &m) != PARITY_OK);
    CHECK(strstr(parity_last_error(), "model.early_exit_gate.weight") != NULL);
    printf("gate missing: %s\n", parity_last_error());
    remove_dir(dir);

    /* a Llama-shaped checkpoint called ouro: the second norms are missing */
    CHECK(mkdtemp(strcpy(dir, "/tmp/parity-looped-XXXXXX")) != NULL);
    snprintf(cfg, sizeof cfg, "%s/config.json", dir);
    parity_config c;
    CHECK_OK(parity_config_builtin("ouro-tiny-fixed", &c));
    c.arch = PARITY_ARCH_LLAMA;
    c.total_ut_steps = 1;
    parity_model *llama = NULL;
    CHECK_OK(parity_model_synthetic(&c, 4, &llama));
    CHECK_OK(parity_model_save(llama, dir));
    parity_model_free(llama);
    edit_file(cfg, "\"model_type\": \"llama\"",
              "\"model_type\": \"ouro\", \"use_early_exit_gate\": false");
    CHECK(parity_model_load(dir, &m) != PARITY_OK);
    CHECK(strstr(parity_last_error(), "input_layernorm_2") != NULL);
    printf("second norm missing: %s\n", parity_last_error());
    remove_dir(dir);
}

/* The dense learner's readouts: every loop's log-probs in one call, a chosen loop, and the
 * expected logits. Loop T of the every-loop readout is the dense learner's log-prob, loop k
 * the chosen loop k's, which is also the replay of depth k everywhere with full K/V; the
 * expected logits' log-prob is at least the smallest loop's (log-sum-exp is convex: exact
 * under fp32); each is invariant to threads, chunks, batching and the CPU path. */
enum { RO_SEQS = 3, RO_MAX = 24 };
static void score_readout(parity_scorer *s, parity_score_options *o, const int32_t *toks,
                          const uint32_t *lens, int one_by_one, float *lp, float *loops_lp,
                          uint32_t T) {
    o->loop_logprobs = loops_lp;
    if (!one_by_one) {
        CHECK_OK(parity_score(s, o, toks, lens, RO_SEQS, lp, NULL, NULL, NULL));
        return;
    }
    size_t tok_at[RO_SEQS], out_at[RO_SEQS], ta = 0, oa = 0;
    for (int i = 0; i < RO_SEQS; i++) tok_at[i] = ta, out_at[i] = oa, ta += lens[i], oa += lens[i] - 1;
    for (int i = RO_SEQS - 1; i >= 0; i--) {
        o->loop_logprobs = loops_lp ? loops_lp + out_at[i] * T : NULL;
        CHECK_OK(parity_score(s, o, toks + tok_at[i], &lens[i], 1, lp + out_at[i], NULL, NULL, NULL));
    }
}

static void check_dense_readouts(const parity_model *ouro, const parity_model *fixed) {
    const parity_config *cfg = parity_model_config(ouro);
    const uint32_t T = cfg->total_ut_steps;
    static const uint32_t lens[RO_SEQS] = {9, 23, 17};
    int32_t toks[3 * RO_MAX];
    uint32_t depths[3 * RO_MAX];
    uint64_t x = 99;
    size_t n_tok = 0, n_out = 0;
    for (int i = 0; i < RO_SEQS; i++) n_tok += lens[i], n_out += lens[i] - 1;
    for (size_t j = 0; j < n_tok; j++) {
        x = x * 6364136223846793005ull + 1442695040888963407ull;
        toks[j] = (int32_t)((x >> 33) % cfg->vocab_size);
    }
    static const char *const policies[] = {"hf-eager", "vllm", "aligned", "fp32"};
    static float dense[3 * RO_MAX], every[3 * RO_MAX * 8], chosen[3 * RO_MAX], replay[3 * RO_MAX],
        mixed[3 * RO_MAX], got[3 * RO_MAX], every2[3 * RO_MAX * 8];
    char what[160];
    for (size_t pi = 0; pi < sizeof policies / sizeof *policies; pi++) {
        const char *pol = policies[pi];
        parity_scorer *s1 = new_scorer(ouro, (fixture){.policy = pol});
        parity_scorer *s2 = new_scorer(ouro, (fixture){.policy = pol, .n_threads = 2, .chunk_rows = 5});
        if (!s1 || !s2) return;
        parity_score_options o;
        parity_score_default_options(&o);
        score_readout(s1, &o, toks, lens, 0, dense, every, T);
        for (size_t j = 0; j < n_out; j++) got[j] = every[j * T + T - 1];
        snprintf(what, sizeof what, "%s: the every-loop readout's last loop against the dense learner", pol);
        CHECK_BITS_F32(got, dense, n_out, what);
        for (uint32_t k = 1; k <= T; k++) {
            parity_score_default_options(&o);
            o.readout = PARITY_READOUT_LOOP;
            o.readout_loop = k;
            score_readout(s1, &o, toks, lens, 0, chosen, NULL, T);
            for (size_t j = 0; j < n_out; j++) got[j] = every[j * T + k - 1];
            snprintf(what, sizeof what, "%s: loop %u read alone against the every-loop readout", pol, k);
            CHECK_BITS_F32(chosen, got, n_out, what);
            parity_score_default_options(&o);
            for (size_t j = 0; j < n_tok; j++) depths[j] = k;
            o.depths = depths;
            o.loop_kv = PARITY_LOOP_KV_FULL;
            score_readout(s2, &o, toks, lens, 1, replay, NULL, T);
            snprintf(what, sizeof what, "%s: loop %u against the replay of depth %u with full K/V", pol, k, k);
            CHECK_BITS_F32(replay, chosen, n_out, what);
        }
        parity_score_default_options(&o);
        o.readout = PARITY_READOUT_EXPECTED_LOGITS;
        score_readout(s1, &o, toks, lens, 0, mixed, every2, T);
        snprintf(what, sizeof what, "%s: every loop beside the expected logits", pol);
        CHECK_BITS_F32(every2, every, n_out * T, what);
        size_t moved = 0, below = 0;
        for (size_t j = 0; j < n_out; j++) {
            float lo = every[j * T];
            for (uint32_t t = 1; t < T; t++) lo = fminf(lo, every[j * T + t]);
            moved += memcmp(&mixed[j], &dense[j], 4) != 0;
            CHECK(isfinite(mixed[j]) && mixed[j] <= 0);
            if (!strcmp(pol, "fp32")) below += mixed[j] < lo - 1e-5f;
        }
        printf("%s: expected logits differ from the last loop at %zu of %zu positions\n", pol,
               moved, n_out);
        CHECK(moved > 0);
        CHECK_INT(below, 0);
        score_readout(s2, &o, toks, lens, 1, got, every2, T);
        snprintf(what, sizeof what, "%s: expected logits, 2 threads, chunks of 5, one by one", pol);
        CHECK_BITS_F32(got, mixed, n_out, what);
        CHECK_BITS_F32(every2, every, n_out * T, what);
        parity_cpu_path saved = parity_get_cpu_path();
        for (int path = PARITY_CPU_PORTABLE; path <= PARITY_CPU_AVX512BF16; path++) {
            if (parity_set_cpu_path((parity_cpu_path)path) != PARITY_OK) continue;
            score_readout(s2, &o, toks, lens, 0, got, every2, T);
            snprintf(what, sizeof what, "%s: expected logits and every loop, cpu path %s", pol,
                     parity_cpu_path_name((parity_cpu_path)path));
            CHECK_BITS_F32(got, mixed, n_out, what);
            CHECK_BITS_F32(every2, every, n_out * T, what);
        }
        parity_set_cpu_path(saved);
        parity_scorer_free(s1);
        parity_scorer_free(s2);
    }

    /* refusals, the outputs untouched */
    parity_scorer *s = new_scorer(ouro, (fixture){.policy = "aligned"});
    parity_scorer *sf = new_scorer(fixed, (fixture){.policy = "aligned"});
    parity_model *plain = NULL;
    CHECK_OK(parity_model_open("synthetic:tiny", &plain));
    parity_scorer *sp = plain ? new_scorer(plain, (fixture){.policy = "aligned"}) : NULL;
    if (!s || !sf || !sp) return;
    const int32_t t5[5] = {1, 2, 3, 4, 5};
    const uint32_t len = 5;
    uint32_t d5[5] = {T, T, T, 1, 1};
    float lp[4] = {7, 7, 7, 7}, ll[32];
    for (int i = 0; i < 32; i++) ll[i] = 7;
    const struct {
        uint32_t readout, loop;
        int with_depths, with_rule, loops_out;
        parity_scorer *on;
        const char *message;
    } bad[] = {
        {3, 0, 0, 0, 0, s, "readout 3 is not a parity_loop_readout"},
        {PARITY_READOUT_LOOP, 0, 0, 0, 0, s, "readout_loop 0 is not in 1..4"},
        {PARITY_READOUT_LOOP, 5, 0, 0, 0, s, "readout_loop 5 is not in 1..4"},
        {PARITY_READOUT_EXIT, 0, 1, 0, 1, s, "loop_logprobs with a depth schedule"},
        {PARITY_READOUT_EXPECTED_LOGITS, 0, 0, 1, 0, s, "a loop readout with an exit rule"},
        {PARITY_READOUT_EXPECTED_LOGITS, 0, 0, 0, 0, sf, "has no exit gate"},
        {PARITY_READOUT_EXIT, 0, 0, 0, 1, sp, "this model does not loop"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        parity_score_options o;
        parity_score_default_options(&o);
        o.readout = bad[i].readout;
        o.readout_loop = bad[i].loop;
        o.depths = bad[i].with_depths ? d5 : NULL;
        if (bad[i].with_rule) o.exit_rule = PARITY_EXIT_FIXED, o.max_depth = 2;
        o.loop_logprobs = bad[i].loops_out ? ll : NULL;
        CHECK_STATUS(parity_score(bad[i].on, &o, t5, &len, 1, lp, NULL, NULL, NULL),
                     PARITY_ERR_INVALID_ARGUMENT);
        if (!strstr(parity_last_error(), bad[i].message))
            fprintf(stderr, "readout refusal %zu: \"%s\" does not say \"%s\"\n", i,
                    parity_last_error(), bad[i].message);
        CHECK(strstr(parity_last_error(), bad[i].message) != NULL);
    }
    for (int i = 0; i < 4; i++) CHECK(lp[i] == 7.0f);
    for (int i = 0; i < 32; i++) CHECK(ll[i] == 7.0f);
    parity_scorer_free(s);
    parity_scorer_free(sf);
    parity_scorer_free(sp);
    parity_model_free(plain);
}

int main(void) {
    check_config();
    parity_model *ouro = NULL, *fixed = NULL;
    CHECK_OK(parity_model_open("synthetic:ouro-tiny:11", &ouro));
    CHECK_OK(parity_model_open("synthetic:ouro-tiny-fixed:12", &fixed));
    if (!ouro || !fixed) return check_report("looped");

    int depth1 = 0, early = 0, never = 0;
    const char *const *presets = parity_policy_preset_names();
    uint64_t seed = 1;
    for (int i = 0; presets[i]; i++)
        for (uint32_t kv = 0; kv <= PARITY_LOOP_KV_FULL; kv++)
            if (!quick() || i % 2 == 0)
                check_policy(ouro, presets[i], kv, seed++, &depth1, &early, &never);
    check_policy(ouro, "hf-eager+fp16", PARITY_LOOP_KV_LAST_EXITED, seed++, &depth1, &early, &never);
    check_policy(fixed, "vllm", PARITY_LOOP_KV_LAST_EXITED, seed++, &depth1, &early, &never);
    printf("schedules: %d positions at depth 1, %d sequences exiting early, %d never\n", depth1,
           early, never);
    CHECK(depth1 > 0 && early > 0 && never > 0);

    check_kv_rules_differ(ouro);
    check_dense_readouts(ouro, fixed);
    check_exit_dist_dtype();
    check_bad_input(ouro, fixed);
    check_checkpoints(ouro);
    parity_model_free(ouro);
    parity_model_free(fixed);
    return check_report("looped");
}
