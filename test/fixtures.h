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

/* The fields the scorer's and the sampler's params share, from f into the params p. */
#define FIXTURE_COMMON(p, f)                                                \
    do {                                                                    \
        if ((f).policy) CHECK_OK(parity_policy_from_name((f).policy, &(p).policy)); \
        if ((f).backend) (p).backend = (f).backend;                         \
        if ((f).n_threads) (p).n_threads = (f).n_threads;                   \
        (p).max_memory = (f).max_memory;                                    \
    } while (0)

static inline parity_scorer_params scorer_params(fixture f) {
    parity_scorer_params p;
    parity_scorer_default_params(&p);
    FIXTURE_COMMON(p, f);
    p.max_tokens = f.max_tokens;
    p.chunk_rows = f.chunk_rows;
    return p;
}

static inline parity_sampler_params sampler_params(fixture f) {
    parity_sampler_params p;
    parity_sampler_default_params(&p);
    FIXTURE_COMMON(p, f);
    p.max_seqs = f.max_seqs;
    p.max_len = f.max_len;
    return p;
}

/* A scorer / sampler on m (CHECK_OK of the creation); NULL when it fails. */
static inline parity_scorer *new_scorer(const parity_model *m, fixture f) {
    parity_scorer_params p = scorer_params(f);
    parity_scorer *s = NULL;
    CHECK_OK(parity_scorer_create(m, &p, &s));
    return s;
}

static inline parity_sampler *new_sampler(const parity_model *m, fixture f) {
    parity_sampler_params p = sampler_params(f);
    parity_sampler *s = NULL;
    CHECK_OK(parity_sampler_create(m, &p, &s));
    return s;
}

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
