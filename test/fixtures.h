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
    uint32_t max_seqs, max_len; /* sampler */
    uint64_t max_memory;
} fixture;

/* For `kind` (scorer or sampler), with its own two fixture fields own1 and own2, defines
 *   parity_KIND_params KIND_params(fixture f): the defaults, then f's policy, backend,
 *     n_threads (each where set), max_memory, own1 and own2;
 *   parity_KIND *new_KIND(const parity_model *m, fixture f): one on m made with those params
 *     (CHECK_OK of the creation); NULL when it fails. */
#define FIXTURE_KIND(kind, own1, own2)                                                     \
    static inline parity_##kind##_params kind##_params(fixture f) {                        \
        parity_##kind##_params p;                                                          \
        parity_##kind##_default_params(&p);                                                \
        if (f.policy) CHECK_OK(parity_policy_from_name(f.policy, &p.policy));              \
        if (f.backend) p.backend = f.backend;                                              \
        if (f.n_threads) p.n_threads = f.n_threads;                                        \
        p.max_memory = f.max_memory;                                                       \
        p.own1 = f.own1;                                                                   \
        p.own2 = f.own2;                                                                   \
        return p;                                                                          \
    }                                                                                      \
    static inline parity_##kind *new_##kind(const parity_model *m, fixture f) {            \
        parity_##kind##_params p = kind##_params(f);                                       \
        parity_##kind *s = NULL;                                                           \
        CHECK_OK(parity_##kind##_create(m, &p, &s));                                       \
        return s;                                                                          \
    }

/* scorer_params, new_scorer; sampler_params, new_sampler. */
FIXTURE_KIND(scorer, max_tokens, chunk_rows)
FIXTURE_KIND(sampler, max_seqs, max_len)

/* Whether `backend` runs on this CPU: the amx backend needs AMX-BF16; on a CPU without it,
 * it must be refused as unsupported, which this checks, saying once that its runs are
 * skipped. */
static inline int backend_runs(uint32_t backend) {
    if (backend != PARITY_BACKEND_AMX) return 1;
    static int known, runs;
    if (!known++) {
        const int rc = parity_backend_check(PARITY_BACKEND_AMX);
        runs = rc == PARITY_OK;
        if (!runs) {
            CHECK_INT(rc, PARITY_ERR_UNSUPPORTED);
            printf("amx backend runs skipped: %s\n", parity_last_error());
        }
    }
    return runs;
}

/* parity_score with the default options (raw log-probs), log-probs only (CHECK_OK). */
static inline void score_raw(parity_scorer *s, const int32_t *tokens, const uint32_t *lengths,
                             size_t n_seqs, float *logprobs) {
    parity_score_options o;
    parity_score_default_options(&o);
    CHECK_OK(parity_score(s, &o, tokens, lengths, n_seqs, logprobs, NULL, NULL, NULL));
}

#endif
