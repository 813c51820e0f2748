/* Fuzz target: the scorer's input validation, and the scores of what it accepts. One
 * synthetic tiny model (vocab 256) and four scorers (policies, backends, threads, capacities)
 * are made once. The input is:
 *   [0] scorer   [1] mode (3 is invalid)   [2] temperature, [3] top_p, [4] min_p: indices
 *   into tables of valid and invalid values   [5..6] top_k (u16)   [7..8] top_n (u16)
 *   [9] flags (FLAG_*)   [10] n_seqs (0..4)   then n_seqs lengths (u16, 0..1023), then the
 *   tokens: one byte each (always in the vocabulary), or int16 with FLAG_WIDE_TOKENS;
 *   missing bytes read as 0.
 * Accepted input must give sane values (no NaN, log-probs <= 0, sorted top-n), and with
 * FLAG_ONE_BY_ONE each sequence scored alone must give the same bits (the parity contract). */
#include <math.h>

#include "fuzz_common.h"

enum {
    FLAG_ENTROPY = 1,      /* ask for the entropy */
    FLAG_TOP_ARRAYS = 2,   /* pass the top-n arrays (top_n > 0 without them is invalid) */
    FLAG_WIDE_TOKENS = 4,  /* tokens are int16: out-of-range ids */
    FLAG_ONE_BY_ONE = 8,   /* rescore each sequence alone and compare */
    FLAG_BAD_SIZE = 16,    /* options.size is wrong */
};

#define N_SCORERS 4
static parity_model *model;
static parity_scorer *scorers[N_SCORERS];

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc, (void)argv;
    int rc = parity_model_open("synthetic:tiny:1", &model);
    FUZZ_REQUIRE(rc == PARITY_OK, "%s", parity_last_error());
    static const struct {
        const char *policy;
        uint32_t backend, threads, max_tokens, chunk;
    } kinds[N_SCORERS] = {
        {"aligned", PARITY_BACKEND_BF16, 1, 32, 16},
        {"hf-eager", PARITY_BACKEND_BF16, 2, 48, 7},
        {"fp32", PARITY_BACKEND_BF16, 1, 24, 0},
        {"vllm+fp32-head", PARITY_BACKEND_OPENBLAS, 1, 32, 5},
    };
    for (int i = 0; i < N_SCORERS; i++) {
        parity_scorer_params p;
        parity_scorer_default_params(&p);
        FUZZ_REQUIRE(parity_policy_from_name(kinds[i].policy, &p.policy) == PARITY_OK, "policy");
        p.backend = kinds[i].backend;
        if (parity_backend_check((int)p.backend) != PARITY_OK) /* a build without OpenBLAS */
            p.backend = PARITY_BACKEND_BF16;
        p.n_threads = kinds[i].threads;
        p.max_tokens = kinds[i].max_tokens;
        p.chunk_rows = kinds[i].chunk;
        rc = parity_scorer_create(model, &p, &scorers[i]);
        FUZZ_REQUIRE(rc == PARITY_OK, "%s", parity_last_error());
    }
    return 0;
}

typedef struct reader {
    const uint8_t *p, *end;
} reader;

static unsigned get8(reader *r) { return r->p < r->end ? *r->p++ : 0; }
static unsigned get16(reader *r) { return get8(r) | get8(r) << 8; }

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    static const float temps[8] = {1.0f, 0.7f, 0.0f, 1.5f, -1.0f, NAN, INFINITY, 1e-30f};
    static const float top_ps[8] = {1.0f, 0.9f, 0.5f, 1e-7f, 0.0f, -0.5f, 1.5f, NAN};
    static const float min_ps[8] = {0.0f, 0.05f, 0.5f, 0.999f, 1.0f, -0.1f, NAN, 1e-9f};
    reader r = {data, data + size};
    parity_scorer *s = scorers[get8(&r) % N_SCORERS];
    parity_score_options o;
    parity_score_default_options(&o);
    o.mode = get8(&r) % 4;
    o.temperature = temps[get8(&r) % 8];
    o.top_p = top_ps[get8(&r) % 8];
    o.min_p = min_ps[get8(&r) % 8];
    o.top_k = get16(&r);
    o.top_n = get16(&r);
    const unsigned flags = get8(&r);
    if (flags & FLAG_BAD_SIZE) o.size = 0;
    const size_t n_seqs = get8(&r) % 5;
    uint32_t lengths[4];
    size_t n_tokens = 0, n_out = 0;
    for (size_t i = 0; i < n_seqs; i++) {
        lengths[i] = get16(&r) & 0x3ff;
        n_tokens += lengths[i];
        n_out += lengths[i] ? lengths[i] - 1 : 0;
    }
    int32_t *tokens = malloc((n_tokens + 1) * sizeof *tokens);
    for (size_t i = 0; i < n_tokens; i++)
        tokens[i] = flags & FLAG_WIDE_TOKENS ? (int16_t)get16(&r) : (int32_t)get8(&r);
    /* outputs sized exactly, so that ASan sees a write past them */
    const size_t n_top = (flags & FLAG_TOP_ARRAYS) ? n_out * o.top_n : 0;
    float *lp = malloc((n_out + 1) * sizeof *lp), *ent = malloc((n_out + 1) * sizeof *ent);
    int32_t *top_ids = malloc((n_top + 1) * sizeof *top_ids);
    float *top_lp = malloc((n_top + 1) * sizeof *top_lp);
    FUZZ_REQUIRE(tokens && lp && ent && top_ids && top_lp, "out of memory");
    int rc = parity_score(s, &o, tokens, lengths, n_seqs, lp, flags & FLAG_ENTROPY ? ent : NULL,
                          flags & FLAG_TOP_ARRAYS ? top_ids : NULL,
                          flags & FLAG_TOP_ARRAYS ? top_lp : NULL);
    if (rc) {
        fuzz_check_failure(rc);
        FUZZ_REQUIRE(rc == PARITY_ERR_INVALID_ARGUMENT || rc == PARITY_ERR_EMPTY_INPUT ||
                         rc == PARITY_ERR_TOO_LONG || rc == PARITY_ERR_TOKEN_RANGE,
                     "unexpected %s: %s", parity_status_name(rc), parity_last_error());
    } else {
        const uint32_t V = parity_model_config(model)->vocab_size;
        for (size_t i = 0; i < n_out; i++) {
            FUZZ_REQUIRE(!isnan(lp[i]) && lp[i] <= 0.0f, "logprob[%zu] = %g", i, (double)lp[i]);
            if (flags & FLAG_ENTROPY)
                FUZZ_REQUIRE(!isnan(ent[i]) && ent[i] >= -1e-5f, "entropy[%zu] = %g", i,
                             (double)ent[i]);
            for (uint32_t k = 0; k < (n_top ? o.top_n : 0); k++) {
                /* past the support of a truncated distribution: id -1, log-prob -inf */
                const size_t at = i * o.top_n + k;
                const int32_t id = top_ids[at];
                if (k > 0 && top_ids[at - 1] == -1)
                    FUZZ_REQUIRE(id == -1, "top id %d after -1", id);
                else if (id == -1)
                    FUZZ_REQUIRE(o.mode == PARITY_LOGPROB_PROCESSED_TRUNCATED, "top id -1");
                else
                    FUZZ_REQUIRE(id >= 0 && (uint32_t)id < V, "top id %d", id);
                FUZZ_REQUIRE(id >= 0 || top_lp[at] == -INFINITY, "top log-prob of id -1");
                FUZZ_REQUIRE(!isnan(top_lp[at]) && (k == 0 || top_lp[at] <= top_lp[at - 1]),
                             "top log-prob %zu/%u = %g", i, k, (double)top_lp[at]);
            }
        }
        if (flags & FLAG_ONE_BY_ONE) {
            float one[1024];
            size_t tok_at = 0, out_at = 0;
            for (size_t i = 0; i < n_seqs; i++) {
                rc = parity_score(s, &o, tokens + tok_at, &lengths[i], 1, one, NULL,
                                  flags & FLAG_TOP_ARRAYS ? top_ids : NULL,
                                  flags & FLAG_TOP_ARRAYS ? top_lp : NULL);
                FUZZ_REQUIRE(rc == PARITY_OK, "sequence %zu alone: %s", i, parity_last_error());
                FUZZ_REQUIRE(!memcmp(one, lp + out_at, (lengths[i] - 1) * sizeof *one),
                             "sequence %zu scored alone differs from the batch", i);
                tok_at += lengths[i];
                out_at += lengths[i] - 1;
            }
        }
    }
    free(tokens), free(lp), free(ent), free(top_ids), free(top_lp);
    return 0;
}
