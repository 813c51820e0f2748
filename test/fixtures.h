/* Set-up the C tests share: paths below the source root, scorers and samplers made from the
 * few parameters a test varies, default-option scoring, an xorshift generator. Every library
 * call in here is a CHECK_OK, as the tests had it inline. */
#ifndef PARITY_TEST_FIXTURES_H
#define PARITY_TEST_FIXTURES_H

#include "check.h"

/* The trained checkpoint the model-level tests load, relative to the source root. */
#define TRAINED_MODEL "models/qwen3-bytes-pystdlib-4.9m"

/* Loads the model at `rel` below the source root into *m (CHECK_OK). */
static inline void load_model(const char *rel, parity_model **m) {
    char dir[4096];
    CHECK_OK(parity_model_load(source_path(dir, sizeof dir, rel), m));
}

/* The two models the engine tests run on: the synthetic tiny model `tiny_spec` and the trained
 * checkpoint, into *tiny and *trained (CHECK_OK of each); returns whether both loaded. */
static inline int load_tiny_and_trained(const char *tiny_spec, parity_model **tiny,
                                        parity_model **trained) {
    *tiny = *trained = NULL;
    CHECK_OK(parity_model_open(tiny_spec, tiny));
    load_model(TRAINED_MODEL, trained);
    return *tiny && *trained;
}

/* Marsaglia's xorshift64 (shifts 13, 7, 17): advances *state and returns the new state. */
static inline uint64_t xorshift64(uint64_t *state) {
    uint64_t x = *state;
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    return *state = x;
}

/* What a test varies in a scorer's or sampler's parameters; a field left 0 (NULL) keeps the
 * default of parity_scorer_default_params / parity_sampler_default_params (whose zeros mean
 * the same as their defaults: 1 thread, the bf16 backend). */
typedef struct fixture {
    const char *policy;  /* a preset's name */
    uint32_t backend, n_threads;
    uint32_t max_tokens, chunk_rows; /* scorer */
    uint32_t max_seqs, max_len, prefill_chunk, max_batch; /* sampler */
    uint64_t max_memory;
} fixture;

/* The fields of a fixture only a scorer's / a sampler's params have, from f into p. */
#define FIXTURE_SCORER_OWN(p, f) ((p).max_tokens = (f).max_tokens, (p).chunk_rows = (f).chunk_rows)
#define FIXTURE_SAMPLER_OWN(p, f)                                                           \
    ((p).max_seqs = (f).max_seqs, (p).max_len = (f).max_len,                                \
     (p).prefill_chunk = (f).prefill_chunk, (p).max_batch = (f).max_batch)

/* For `kind` (scorer or sampler), whose own fixture fields `own` sets, defines
 *   parity_KIND_params KIND_params(fixture f): the defaults, then f's policy, backend,
 *     n_threads (each where set), max_memory and its own fields;
 *   parity_KIND *KIND_with(const parity_model *m, const parity_KIND_params *p): one on m
 *     made with p (CHECK_OK of the creation); NULL when it fails;
 *   parity_KIND *new_KIND(const parity_model *m, fixture f): KIND_with(m, KIND_params(f)). */
#define FIXTURE_KIND(kind, own)                                                            \
    static inline parity_##kind##_params kind##_params(fixture f) {                        \
        parity_##kind##_params p;                                                          \
        parity_##kind##_default_params(&p);                                                \
        if (f.policy) CHECK_OK(parity_policy_from_name(f.policy, &p.policy));              \
        if (f.backend) p.backend = f.backend;                                              \
        if (f.n_threads) p.n_threads = f.n_threads;                                        \
        p.max_memory = f.max_memory;                                                       \
        own(p, f);                                                                         \
        return p;                                                                          \
    }                                                                                      \
    static inline parity_##kind *kind##_with(const parity_model *m,                        \
                                             const parity_##kind##_params *p) {            \
        parity_##kind *s = NULL;                                                           \
        CHECK_OK(parity_##kind##_create(m, p, &s));                                        \
        return s;                                                                          \
    }                                                                                      \
    static inline parity_##kind *new_##kind(const parity_model *m, fixture f) {            \
        parity_##kind##_params p = kind##_params(f);                                       \
        return kind##_with(m, &p);                                                         \
    }

/* scorer_params, scorer_with, new_scorer; sampler_params, sampler_with, new_sampler. */
FIXTURE_KIND(scorer, FIXTURE_SCORER_OWN)
FIXTURE_KIND(sampler, FIXTURE_SAMPLER_OWN)

/* Whether `backend` runs here: the amx backend needs AMX-BF16, the openblas backend a build
 * with OpenBLAS (meson -Dopenblas, on by default where it is installed); where one does not
 * run, it must be refused as unsupported, which this checks, saying once that its runs are
 * skipped. */
static inline int backend_runs(uint32_t backend) {
    if (backend != PARITY_BACKEND_AMX && backend != PARITY_BACKEND_OPENBLAS) return 1;
    static int known[PARITY_BACKEND_AMX + 1], runs[PARITY_BACKEND_AMX + 1];
    if (!known[backend]++) {
        const int rc = parity_backend_check((int)backend);
        runs[backend] = rc == PARITY_OK;
        if (!runs[backend]) {
            CHECK_INT(rc, PARITY_ERR_UNSUPPORTED);
            printf("%s backend runs skipped: %s\n", parity_backend_name((int)backend),
                   parity_last_error());
        }
    }
    return runs[backend];
}

/* parity_model_bytes of m under the preset on the backend (CHECK_OK of each call). */
static inline parity_weight_bytes weight_bytes_of(const parity_model *m, const char *preset,
                                                  uint32_t backend) {
    parity_policy p;
    parity_weight_bytes b;
    memset(&b, 0, sizeof b);
    b.size = sizeof b;
    CHECK_OK(parity_policy_from_name(preset, &p));
    CHECK_OK(parity_model_bytes(m, &p, backend, &b));
    return b;
}

/* parity_score with the default options (raw log-probs), log-probs only (CHECK_OK). */
static inline void score_raw(parity_scorer *s, const int32_t *tokens, const uint32_t *lengths,
                             size_t n_seqs, float *logprobs) {
    parity_score_options o;
    parity_score_default_options(&o);
    CHECK_OK(parity_score(s, &o, tokens, lengths, n_seqs, logprobs, NULL, NULL, NULL));
}

/* ---- generation: the sampler's completions of one prompt ------------------------------------ */

/* Where a run's completions are: n_seqs sequences, sequence q's k-th token and log-prob at
 * tokens[q * stride + k] and logprobs[q * stride + k], counts[q] of them. */
typedef struct completions {
    size_t n_seqs, stride;
    int32_t *tokens;
    float *logprobs;
    uint32_t *counts;
} completions;

/* The members of a test's result type that hold n_seqs completions of at most max_new tokens
 * each: their counts n, tokens and log-probs; COMPLETIONS_OF(&result) is their view. */
#define COMPLETION_MEMBERS(n_seqs, max_new) \
    uint32_t n[n_seqs];                      \
    int32_t tokens[n_seqs][max_new];         \
    float logprobs[n_seqs][max_new]
#define COMPLETIONS_OF(g)                                                                     \
    ((completions){sizeof (g)->n / sizeof (g)->n[0], sizeof (g)->tokens[0] / sizeof(int32_t), \
                   (g)->tokens[0], (g)->logprobs[0], (g)->n})

/* Adds a sequence of `prompt` for each of the n sampling[i] (seed i) to s, ids[i]: each
 * prefilled afresh or, with `fork`, forked from one prefilled parent (sampling[0], seed 99).
 * CHECK_OK of each call. */
static inline void sampler_add_all(parity_sampler *s, const int32_t *prompt, uint32_t prompt_len,
                                   const parity_sampling *sampling, size_t n, int fork,
                                   uint32_t *ids) {
    uint32_t parent = 0;
    if (fork) CHECK_OK(parity_sampler_add(s, prompt, prompt_len, &sampling[0], 99, &parent));
    for (size_t i = 0; i < n; i++) {
        if (fork)
            CHECK_OK(parity_sampler_fork(s, parent, &sampling[i], (uint64_t)i, &ids[i]));
        else
            CHECK_OK(parity_sampler_add(s, prompt, prompt_len, &sampling[i], (uint64_t)i, &ids[i]));
    }
}

/* Steps the sequences ids[0 .. out.n_seqs) until all have finished, for at most max_rounds
 * rounds, into out: each round every live one (schedule 0) or, with `schedule` a seed, a random
 * subset of them (each left out with odds 1 in 3), in random order when `shuffle`. Stops at a
 * failed step (CHECK_OK). */
static inline void sampler_step_to_end(parity_sampler *s, const uint32_t *ids, uint64_t schedule,
                                       int shuffle, int max_rounds, completions out) {
    const size_t n_seqs = out.n_seqs;
    int *live = malloc(n_seqs * sizeof *live);
    uint32_t *step_ids = malloc(n_seqs * sizeof *step_ids), *which = malloc(n_seqs * sizeof *which);
    int32_t *tok = malloc(n_seqs * sizeof *tok);
    float *lp = malloc(n_seqs * sizeof *lp);
    uint32_t *fin = malloc(n_seqs * sizeof *fin);
    if (!live || !step_ids || !which || !tok || !lp || !fin) exit(2);
    for (size_t i = 0; i < n_seqs; i++) live[i] = 1, out.counts[i] = 0;
    uint64_t r = schedule;
    for (int rounds = 0; rounds < max_rounds; rounds++) {
        size_t n = 0;
        for (size_t i = 0; i < n_seqs; i++)
            if (live[i] && (!schedule || xorshift64(&r) % 3 != 0)) which[n++] = (uint32_t)i;
        if (n == 0) {
            int any = 0;
            for (size_t i = 0; i < n_seqs; i++) any |= live[i];
            if (!any) break;
            continue;
        }
        if (schedule && shuffle)
            for (size_t i = n - 1; i > 0; i--) {
                size_t j = xorshift64(&r) % (i + 1);
                uint32_t t = which[i];
                which[i] = which[j];
                which[j] = t;
            }
        for (size_t i = 0; i < n; i++) step_ids[i] = ids[which[i]];
        int st = parity_sampler_step(s, step_ids, n, tok, lp, fin, 0, NULL, NULL);
        CHECK_OK(st);
        if (st) break;
        for (size_t i = 0; i < n; i++) {
            const size_t q = which[i], at = q * out.stride + out.counts[q];
            out.tokens[at] = tok[i];
            out.logprobs[at] = lp[i];
            out.counts[q]++;
            if (fin[i]) live[q] = 0;
        }
    }
    free(live), free(step_ids), free(which), free(tok), free(lp), free(fin);
}

/* A generation: n sequences of one prompt (n: the completions' n_seqs), added with
 * sampler_add_all and stepped with sampler_step_to_end as these fields say. */
typedef struct generation {
    const int32_t *prompt;
    uint32_t prompt_len;
    const parity_sampling *sampling; /* one per sequence */
    int fork, shuffle, max_rounds;
    uint64_t schedule;
} generation;

/* A sampler on m with params p (CHECK_OK) that has run generation g into out, its sequences
 * ids[0 .. out.n_seqs); NULL when it could not be made. */
static inline parity_sampler *sampler_generate(const parity_model *m,
                                               const parity_sampler_params *p, generation g,
                                               uint32_t *ids, completions out) {
    parity_sampler *s = sampler_with(m, p);
    if (!s) return NULL;
    sampler_add_all(s, g.prompt, g.prompt_len, g.sampling, out.n_seqs, g.fork, ids);
    sampler_step_to_end(s, ids, g.schedule, g.shuffle, g.max_rounds, out);
    return s;
}

/* Two runs' completions are the same: counts, tokens, and log-probs bitwise. */
static inline void check_same_completions(completions a, completions b, const char *what) {
    for (size_t i = 0; i < a.n_seqs; i++) {
        CHECK_INT(a.counts[i], b.counts[i]);
        if (a.counts[i] != b.counts[i]) {
            fprintf(stderr, "  (%s, sequence %zu)\n", what, i);
            continue;
        }
        CHECK(!memcmp(a.tokens + i * a.stride, b.tokens + i * b.stride,
                      a.counts[i] * sizeof(int32_t)));
        CHECK_BITS_F32(a.logprobs + i * a.stride, b.logprobs + i * b.stride, a.counts[i], what);
    }
}

/* prompt followed by a completion, into seq; returns its length. */
static inline uint32_t prompt_then(int32_t *seq, const int32_t *prompt, uint32_t prompt_len,
                                   const int32_t *completion, uint32_t n) {
    memcpy(seq, prompt, prompt_len * sizeof *seq);
    memcpy(seq + prompt_len, completion, n * sizeof *seq);
    return prompt_len + n;
}

/* The scoring options that give a sampled sequence's log-probs: its mode, temperature, top_k,
 * top_p and min_p. */
static inline parity_score_options score_options_of(const parity_sampling *sp) {
    parity_score_options o;
    parity_score_default_options(&o);
    o.mode = sp->logprob_mode;
    o.temperature = sp->temperature;
    o.top_k = sp->top_k;
    o.top_p = sp->top_p;
    o.min_p = sp->min_p;
    return o;
}

#endif
