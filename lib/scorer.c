/* The scorer: the learner's entry point. It runs whole sequences through the forward (in
 * chunks of rows, through its own KV cache) and turns each position's logits into the
 * log-prob of the next token. Sequences are packed into groups that fit the cache; a
 * sequence's values depend on nothing but its own tokens, since every row of the forward is
 * computed in an order fixed per row. */

#include "forward.h"
#include "internal.h"
#include "kernels.h"
#include "sampling.h"

struct parity_scorer {
    const parity_model *model;
    parity_scorer_params params;
    threadpool *pool;
    kv_cache kv;
    fwd_scratch scratch;
    uint32_t capacity;      /* KV cells */
    uint32_t *blocks;       /* identity block table [capacity / KV_BLOCK] */
    fwd_row *rows;          /* [chunk_rows] */
    uint32_t *out_rows;     /* [chunk_rows] rows of a chunk that predict a token */
    size_t *out_index;      /* [chunk_rows] where their results go */
    int32_t *out_target;    /* [chunk_rows] the token they predict */
    float *logits;          /* [chunk_rows][vocab] */
    float *work;            /* [workers][3 * vocab]: a dist_work per worker */
    atomic_int in_use;      /* set while a call runs (object_enter) */
};

void parity_scorer_default_params(parity_scorer_params *p) {
    if (!p) return;
    memset(p, 0, sizeof *p);
    p->size = sizeof *p;
    p->n_threads = 1;
    p->backend = PARITY_BACKEND_BF16;
    parity_policy_from_name("aligned", &p->policy);
}

void parity_score_default_options(parity_score_options *o) {
    if (!o) return;
    memset(o, 0, sizeof *o);
    o->size = sizeof *o;
    o->mode = PARITY_LOGPROB_RAW;
    o->temperature = 1.0f;
    o->top_p = 1.0f;
}

void parity_scorer_free(parity_scorer *s) {
    if (!s) return;
    pool_free(s->pool);
    kv_cache_free(&s->kv);
    fwd_scratch_free(&s->scratch);
    px_free(s->blocks);
    px_free(s->rows);
    px_free(s->out_rows);
    px_free(s->out_index);
    px_free(s->out_target);
    px_free(s->logits);
    px_free(s->work);
    px_free(s);
}

int parity_scorer_create(const parity_model *model, const parity_scorer_params *params,
                         parity_scorer **out) {
    clear_error();
    if (!model || !params || !out)
        return set_error(PARITY_ERR_INVALID_ARGUMENT, "model, params or output is NULL");
    if (params->size != sizeof *params)
        return set_error(PARITY_ERR_INVALID_ARGUMENT,
                         "params.size is %u, this library expects %zu: initialise the params "
                         "with parity_scorer_default_params()",
                         params->size, sizeof *params);
    int rc = engine_check(&params->policy, params->backend, params->n_threads);
    if (rc) return rc;
    const parity_config *c = &model->config;
    uint32_t capacity = params->max_tokens ? params->max_tokens
                        : c->max_position_embeddings < 8192 ? c->max_position_embeddings
                                                             : 8192;
    if (capacity > (1u << 28))
        return set_error(PARITY_ERR_INVALID_ARGUMENT, "max_tokens %u is too large", capacity);
    capacity = (capacity + KV_BLOCK - 1) / KV_BLOCK * KV_BLOCK;
    uint32_t chunk = params->chunk_rows ? params->chunk_rows : 256;
    if (chunk > capacity) chunk = capacity;
    const int fp32 = params->policy.compute == PARITY_COMPUTE_FP32;

    /* what the scorer will hold, against the caller's ceiling, before anything is taken */
    const uint64_t V = c->vocab_size, T = params->n_threads ? params->n_threads : 1;
    const uint64_t bytes = kv_cache_bytes(c, capacity, fp32) +
                           fwd_scratch_bytes(c, chunk, capacity, (unsigned)T, 0) +
                           (uint64_t)chunk * V * 4 + T * 3 * V * 4 +
                           (uint64_t)chunk * (sizeof(fwd_row) + 4 + sizeof(size_t) + 4) +
                           capacity / KV_BLOCK * 4;
    if (params->max_memory && bytes > params->max_memory)
        return set_error(PARITY_ERR_MEMORY_LIMIT,
                         "the scorer needs %llu bytes of KV cache and scratch (max_tokens %u, "
                         "chunk_rows %u), more than max_memory = %llu",
                         (unsigned long long)bytes, capacity, chunk,
                         (unsigned long long)params->max_memory);

    if ((rc = engine_prepare_weights(model, &params->policy, params->backend))) return rc;

    parity_scorer *s = px_calloc(1, sizeof *s, "scorer");
    if (!s) return PARITY_ERR_OUT_OF_MEMORY;
    s->model = model;
    s->params = *params;
    s->params.max_tokens = capacity;
    s->params.chunk_rows = chunk;
    s->params.n_threads = params->n_threads ? params->n_threads : 1;
    s->capacity = capacity;
    rc = pool_create(s->params.n_threads, &s->pool);
    if (!rc) rc = kv_cache_init(&s->kv, c, capacity, fp32);
    if (!rc) rc = fwd_scratch_init(&s->scratch, c, chunk, capacity, s->params.n_threads, 0);
    if (!rc) {
        s->blocks = px_calloc(capacity / KV_BLOCK, sizeof *s->blocks, "block table");
        s->rows = px_calloc(chunk, sizeof *s->rows, "batch rows");
        s->out_rows = px_calloc(chunk, sizeof *s->out_rows, "batch rows");
        s->out_index = px_calloc(chunk, sizeof *s->out_index, "batch rows");
        s->out_target = px_calloc(chunk, sizeof *s->out_target, "batch rows");
        s->logits = px_aligned_alloc((size_t)chunk * V * sizeof(float), "logits");
        s->work = px_aligned_alloc((size_t)s->params.n_threads * 3 * V * sizeof(float), "log-softmax");
        if (!s->blocks || !s->rows || !s->out_rows || !s->out_index || !s->out_target ||
            !s->logits || !s->work)
            rc = PARITY_ERR_OUT_OF_MEMORY;
    }
    if (rc) {
        parity_scorer_free(s);
        return rc;
    }
    for (uint32_t b = 0; b < capacity / KV_BLOCK; b++) s->blocks[b] = b;
    *out = s;
    return PARITY_OK;
}

/* ---- scoring ------------------------------------------------------------------------------ */

typedef struct lp_job {
    parity_scorer *s;
    const parity_score_options *o;
    float *logprobs, *entropy;
    int32_t *top_ids;
    float *top_logprobs;
} lp_job;

static void job_logprobs(void *p, size_t begin, size_t end, unsigned worker) {
    const lp_job *j = p;
    parity_scorer *s = j->s;
    const size_t V = s->model->config.vocab_size;
    float *work = s->work + (size_t)worker * 3 * V;
    const dist_work w = {work, work + V, (uint32_t *)(work + 2 * V)};
    const dist_params dp = {j->o->mode, j->o->temperature, j->o->top_k, j->o->top_p, j->o->min_p};
    const uint32_t n = j->o->top_n;
    for (size_t i = begin; i < end; i++) {
        const size_t at = s->out_index[i];
        dist d;
        dist_build(&s->params.policy, &dp, s->logits + i * V, V, &w, &d);
        j->logprobs[at] = dist_logprob(&d, &w, s->out_target[i]);
        if (n) dist_top(&d, &w, V, n, j->top_ids + at * n, j->top_logprobs + at * n);
        if (j->entropy) j->entropy[at] = dist_entropy(&d, &w, V);
    }
}

static int check_inputs(const parity_scorer *s, const parity_score_options *o,
                        const int32_t *tokens, const uint32_t *lengths, size_t n_seqs,
                        const float *logprobs, const int32_t *top_ids, const float *top_logprobs) {
    const parity_config *c = &s->model->config;
    if (!o || !tokens || !lengths || !logprobs)
        return set_error(PARITY_ERR_INVALID_ARGUMENT, "options, tokens, lengths or logprobs is NULL");
    if (o->size != sizeof *o)
        return set_error(PARITY_ERR_INVALID_ARGUMENT,
                         "options.size is %u, this library expects %zu: initialise the options "
                         "with parity_score_default_options()",
                         o->size, sizeof *o);
    const dist_params dp = {o->mode, o->temperature, o->top_k, o->top_p, o->min_p};
    int rc = dist_params_check(&dp, c->vocab_size);
    if (rc) return rc;
    if (o->top_n > c->vocab_size)
        return set_error(PARITY_ERR_INVALID_ARGUMENT, "top_n %u exceeds the vocabulary (%u)",
                         o->top_n, c->vocab_size);
    if (o->top_n && (!top_ids || !top_logprobs))
        return set_error(PARITY_ERR_INVALID_ARGUMENT, "top_n is %u but top_ids or top_logprobs is NULL",
                         o->top_n);
    if (n_seqs == 0) return set_error(PARITY_ERR_EMPTY_INPUT, "no sequences to score");
    size_t at = 0;
    for (size_t i = 0; i < n_seqs; i++) {
        uint32_t len = lengths[i];
        if (len == 0) return set_error(PARITY_ERR_EMPTY_INPUT, "sequence %zu is empty", i);
        if (len > c->max_position_embeddings)
            return set_error(PARITY_ERR_TOO_LONG,
                             "sequence %zu has %u tokens, more than the model's context "
                             "(max_position_embeddings = %u)",
                             i, len, c->max_position_embeddings);
        if (len > s->capacity)
            return set_error(PARITY_ERR_TOO_LONG,
                             "sequence %zu has %u tokens, more than this scorer holds "
                             "(max_tokens = %u)",
                             i, len, s->capacity);
        for (uint32_t t = 0; t < len; t++) {
            int32_t tok = tokens[at + t];
            if (tok < 0 || (uint32_t)tok >= c->vocab_size)
                return set_error(PARITY_ERR_TOKEN_RANGE,
                                 "sequence %zu, position %u: token id %d is outside the "
                                 "vocabulary [0, %u)",
                                 i, t, tok, c->vocab_size);
        }
        at += len;
    }
    return PARITY_OK;
}

static int score(parity_scorer *s, const parity_score_options *o, const int32_t *tokens,
                 const uint32_t *lengths, size_t n_seqs, float *logprobs, float *entropy,
                 int32_t *top_ids, float *top_logprobs) {
    int rc = check_inputs(s, o, tokens, lengths, n_seqs, logprobs, top_ids, top_logprobs);
    if (rc) return rc;
    if ((rc = model_enter(s->model))) return rc;

    unsigned fp_saved = fp_env_enter();
    fwd_ctx ctx = {s->model, s->params.policy, s->params.backend, s->pool, &s->kv, &s->scratch, 0, 0};
    lp_job lj = {s, o, logprobs, entropy, top_ids, top_logprobs};
    const uint32_t chunk = s->params.chunk_rows;

    /* groups of whole sequences that fit the cache, each sequence from a block boundary */
    size_t first = 0, token_at = 0, out_at = 0;
    while (first < n_seqs) {
        size_t last = first;
        uint32_t cells = 0;
        while (last < n_seqs) {
            uint32_t need = (lengths[last] + KV_BLOCK - 1) / KV_BLOCK * KV_BLOCK;
            if (cells + need > s->capacity) break;
            cells += need;
            last++;
        }
        /* the rows of the group, in chunks */
        size_t n_rows = 0, n_out = 0;
        uint32_t block = 0;
        for (size_t i = first; i < last; i++) {
            const uint32_t len = lengths[i];
            for (uint32_t t = 0; t < len; t++) {
                s->rows[n_rows] = (fwd_row){tokens[token_at + t], t, s->blocks + block};
                if (t + 1 < len) {
                    s->out_rows[n_out] = (uint32_t)n_rows;
                    s->out_index[n_out] = out_at + t;
                    s->out_target[n_out] = tokens[token_at + t + 1];
                    n_out++;
                }
                if (++n_rows == chunk || (i + 1 == last && t + 1 == len)) {
                    forward(&ctx, n_rows, s->rows, n_out, s->out_rows, s->logits);
                    pool_run(s->pool, job_logprobs, &lj, n_out);
                    n_rows = n_out = 0;
                }
            }
            block += (len + KV_BLOCK - 1) / KV_BLOCK;
            token_at += len;
            out_at += len - 1;
        }
        first = last;
    }
    fp_env_restore(fp_saved);
    model_leave(s->model);
    return PARITY_OK;
}

int parity_score(parity_scorer *s, const parity_score_options *o, const int32_t *tokens,
                 const uint32_t *lengths, size_t n_seqs, float *logprobs, float *entropy,
                 int32_t *top_ids, float *top_logprobs) {
    clear_error();
    if (!s) return set_error(PARITY_ERR_INVALID_ARGUMENT, "scorer is NULL");
    int rc = object_enter(&s->in_use, "scorer");
    if (rc) return rc;
    rc = score(s, o, tokens, lengths, n_seqs, logprobs, entropy, top_ids, top_logprobs);
    object_leave(&s->in_use);
    return rc;
}
