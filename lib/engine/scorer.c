/* The scorer: the learner's entry point. It runs whole sequences through the forward (in
 * chunks of rows, through its own KV cache) and turns each position's logits into the
 * log-prob of the next token. Sequences are packed into groups that fit the cache; a
 * sequence's values depend on nothing but its own tokens, since every row of the forward is
 * computed in an order fixed per row. */

#include <stddef.h>
#include <stdio.h>
#include <string.h>

#include "engine.h"
#include "base/alloc.h"
#include "base/errors.h"
#include "forward.h"
#include "looped.h"
#include "profile.h"
#include "kernels/kernels.h"
#include "model/config.h"
#include "sampling.h"

struct parity_scorer {
    engine eng;             /* pool, KV cache, scratch, rows, logits, work, busy flag */
    const parity_model *model;
    parity_scorer_params params;  /* resolved: no zero means "default" */
    uint32_t capacity;      /* KV cells */
    uint32_t *blocks;       /* identity block table [capacity / KV_BLOCK] */
    size_t *out_index;      /* [chunk_rows] where the results of a chunk's rows go */
    int32_t *out_target;    /* [chunk_rows] the token they predict */
    /* looped models, the dense readouts: */
    float *loop_out;        /* [loops][chunk_rows][hidden] every loop's output */
    float *loop_pdf;        /* [chunk_rows][loops] the exit distribution (a gate) */
    float *mix_logits;      /* [chunk_rows][vocab] the expected logits (a gate) */
};

void parity_scorer_default_params(parity_scorer_params *p) {
    if (!p) return;
    memset(p, 0, sizeof *p);
    p->size = sizeof *p;
    engine_default_settings(&p->n_threads, &p->backend, &p->policy);
}

void parity_score_default_options(parity_score_options *o) {
    if (!o) return;
    memset(o, 0, sizeof *o);
    o->size = sizeof *o;
    o->mode = PARITY_LOGPROB_RAW;
    o->temperature = 1.0f;
    o->top_p = 1.0f;
}

/* ---- creation: the engine and the scorer's own tables ------------------------------------ */

/* The params with every default filled in, and the engine they make; checks them. */
static int scorer_resolve(const parity_model *model, const void *params, void *resolved,
                          engine_params *ep) {
    const parity_config *c = &model->config;
    parity_scorer_params *p = resolved;
    *p = *(const parity_scorer_params *)params;
    uint32_t capacity = p->max_tokens ? p->max_tokens
                        : c->max_position_embeddings < 8192 ? c->max_position_embeddings
                                                             : 8192;
    if (capacity > (1u << 28))
        return set_error(PARITY_ERR_INVALID_ARGUMENT, "max_tokens %u is too large", capacity);
    /* whole blocks; a chunk never longer than the capacity */
    p->max_tokens = capacity = (capacity + KV_BLOCK - 1) / KV_BLOCK * KV_BLOCK;
    p->chunk_rows = p->chunk_rows ? p->chunk_rows : 256;
    if (p->chunk_rows > capacity) p->chunk_rows = capacity;
    p->n_threads = p->n_threads ? p->n_threads : 1;
    *ep = (engine_params){.n_threads = p->n_threads, .backend = p->backend, .policy = p->policy,
                          .kv_cells = capacity, .max_rows = p->chunk_rows, .max_ctx = capacity,
                          .max_memory = p->max_memory, .works = 1};
    return PARITY_OK;
}

/* The scorer's own tables, beside the engine's. */
static size_t scorer_bufs(void *object, const parity_config *c, const void *resolved,
                          const engine_params *ep, engine_buf *b) {
    parity_scorer *s = object;
    const parity_scorer_params *p = resolved;
    const uint64_t R = ep->max_rows, loops = c->arch == PARITY_ARCH_OURO ? config_loops(c) : 0;
    const uint64_t gated = loops && c->early_exit_gate;
    const engine_buf bufs[] = {
        {(void **)&s->blocks, p->max_tokens / KV_BLOCK, sizeof *s->blocks, 0, "block table"},
        {(void **)&s->out_index, R, sizeof *s->out_index, 0, "batch rows"},
        {(void **)&s->out_target, R, sizeof *s->out_target, 0, "batch rows"},
        {(void **)&s->loop_out, loops * R * c->hidden_size, sizeof(float), 1, "loop outputs"},
        {(void **)&s->loop_pdf, gated * R * loops, sizeof(float), 1, "exit distributions"},
        {(void **)&s->mix_logits, gated * R * c->vocab_size, sizeof(float), 1, "expected logits"},
    };
    memcpy(b, bufs, sizeof bufs);
    return sizeof bufs / sizeof bufs[0];
}

static void scorer_describe(const void *resolved, char *buf, size_t size) {
    const parity_scorer_params *p = resolved;
    snprintf(buf, size, "max_tokens %u, chunk_rows %u", p->max_tokens, p->chunk_rows);
}

static void scorer_start(void *object, const parity_model *m) {
    parity_scorer *s = object;
    s->model = m;
    s->capacity = s->params.max_tokens;
    for (uint32_t k = 0; k < s->capacity / KV_BLOCK; k++) s->blocks[k] = k;
}

static parity_scorer scorer_layout; /* for the addresses of its fields only */
static const engine_kind scorer_kind = {
    "scorer", sizeof(parity_scorer), offsetof(parity_scorer, eng), offsetof(parity_scorer, params),
    sizeof(parity_scorer_params), &scorer_layout, scorer_resolve, scorer_bufs, scorer_describe,
    scorer_start,
};

int parity_scorer_bytes(const parity_model *model, const parity_scorer_params *params,
                        uint64_t *bytes) {
    clear_error();
    return engine_object_bytes(&scorer_kind, model, params, bytes);
}

int parity_scorer_create(const parity_model *model, const parity_scorer_params *params,
                         parity_scorer **out) {
    clear_error();
    return engine_object_create(&scorer_kind, model, params, out);
}

void parity_scorer_free(parity_scorer *s) { engine_object_free(&scorer_kind, s); }

/* ---- scoring ------------------------------------------------------------------------------ */

/* The log-probs of a chunk's wanted rows from their logits: logprobs[at * stride + offset]
 * for the row's place `at`, and the entropy and top-n where asked. */
typedef struct lp_job {
    parity_scorer *s;
    const parity_score_options *o;
    const float *logits;
    float *logprobs, *entropy;
    int32_t *top_ids;
    float *top_logprobs;
    size_t stride, offset;
} lp_job;

static void job_logprobs(void *p, size_t begin, size_t end, unsigned worker) {
    const lp_job *j = p;
    const dist_params dp = {j->o->mode, j->o->temperature, j->o->top_k, j->o->top_p, j->o->min_p};
    const uint32_t n = j->top_ids ? j->o->top_n : 0;
    parity_scorer *s = j->s;
    const size_t V = s->model->config.vocab_size;
    const dist_work w = engine_work(&s->eng, worker, 0);
    for (size_t i = begin; i < end; i++) {
        const size_t at = s->out_index[i];
        dist d;
        dist_build(&s->params.policy, &dp, j->logits + i * V, V, &w, &d);
        j->logprobs[at * j->stride + j->offset] = dist_logprob(&d, &w, s->out_target[i]);
        if (n) dist_top(&d, &w, V, n, j->top_ids + at * n, j->top_logprobs + at * n);
        if (j->entropy) j->entropy[at] = dist_entropy(&d, &w, V);
    }
}

/* The expected logits' step at one loop (OuroForCausalLM's compute_expected_logits): for each
 * wanted row, w = p_t in the logits' format, then step = step * w and mix = step (the first
 * loop) or mix + step, each rounded where the logits are. Overwrites the step logits. */
typedef struct mix_job {
    parity_scorer *s;
    const uint32_t *out_rows;
    float *step;
    uint32_t loop, loops;
} mix_job;

static void job_mix(void *p, size_t begin, size_t end, unsigned worker) {
    (void)worker;
    const mix_job *j = p;
    parity_scorer *s = j->s;
    const parity_policy *pol = &s->params.policy;
    const int round = pol->logits == PARITY_LOGITS_BF16;
    const size_t V = s->model->config.vocab_size;
    for (size_t i = begin; i < end; i++) {
        float w = s->loop_pdf[(size_t)j->out_rows[i] * j->loops + j->loop];
        float *step = j->step + i * V, *mix = s->mix_logits + i * V;
        if (round) round_to_policy(pol, &w, 1);
        for (size_t v = 0; v < V; v++) step[v] *= w;
        if (round) round_to_policy(pol, step, V);
        if (j->loop == 0) {
            memcpy(mix, step, V * sizeof *mix);
            continue;
        }
        for (size_t v = 0; v < V; v++) mix[v] += step[v];
        if (round) round_to_policy(pol, mix, V);
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
    TRY(dist_params_check(&dp, c->vocab_size));
    if (o->top_n > c->vocab_size)
        return set_error(PARITY_ERR_INVALID_ARGUMENT, "top_n %u exceeds the vocabulary (%u)",
                         o->top_n, c->vocab_size);
    if (o->top_n && (!top_ids || !top_logprobs))
        return set_error(PARITY_ERR_INVALID_ARGUMENT, "top_n is %u but top_ids or top_logprobs is NULL",
                         o->top_n);
    if (n_seqs == 0) return set_error(PARITY_ERR_EMPTY_INPUT, "no sequences to score");
    if (o->loop_kv > PARITY_LOOP_KV_FULL)
        return set_error(PARITY_ERR_INVALID_ARGUMENT, "options.loop_kv %u is not a parity_loop_kv",
                         o->loop_kv);
    const uint32_t loops = config_loops(c);
    if (o->depths && o->exit_rule != PARITY_EXIT_FULL)
        return set_error(PARITY_ERR_INVALID_ARGUMENT,
                         "options give both depths and exit_rule %u: a schedule is replayed, a "
                         "rule re-derives one", o->exit_rule);
    TRY(exit_rule_check(c, o->exit_rule, o->exit_threshold, o->min_depth, o->max_depth));
    if (o->readout > PARITY_READOUT_EXPECTED_LOGITS)
        return set_error(PARITY_ERR_INVALID_ARGUMENT,
                         "options.readout %u is not a parity_loop_readout", o->readout);
    if (o->readout != PARITY_READOUT_EXIT || o->loop_logprobs) {
        const char *what = o->loop_logprobs ? "loop_logprobs" : "a loop readout";
        if (c->arch != PARITY_ARCH_OURO)
            return set_error(PARITY_ERR_INVALID_ARGUMENT,
                             "options ask for %s, but this model does not loop", what);
        if (o->depths || o->exit_rule != PARITY_EXIT_FULL)
            return set_error(PARITY_ERR_INVALID_ARGUMENT,
                             "options ask for %s with %s: the loop readouts are the dense "
                             "learner's (every position runs every loop)",
                             what, o->depths ? "a depth schedule" : "an exit rule");
        if (o->readout == PARITY_READOUT_LOOP && (o->readout_loop < 1 || o->readout_loop > loops))
            return set_error(PARITY_ERR_INVALID_ARGUMENT,
                             "options.readout_loop %u is not in 1..%u (the model's loops, "
                             "total_ut_steps)",
                             o->readout_loop, loops);
        if (o->readout == PARITY_READOUT_EXPECTED_LOGITS && !c->early_exit_gate)
            return set_error(PARITY_ERR_INVALID_ARGUMENT,
                             "the expected-logits readout weights the loops by the exit "
                             "distribution, and this model has no exit gate");
    }
    const uint32_t k = c->num_experts_per_tok, route_stride = config_sparse_layers(c) * k;
    if ((o->routes || o->routes_out) && !route_stride)
        return set_error(PARITY_ERR_INVALID_ARGUMENT,
                         "options give %s, but this model (%s) has no sparse layers to route",
                         o->routes ? "routes to replay" : "routes_out",
                         parity_arch_name((int)c->arch));
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
            if (o->depths && (o->depths[at + t] < 1 || o->depths[at + t] > loops))
                return set_error(PARITY_ERR_INVALID_ARGUMENT,
                                 "sequence %zu, position %u: depth %u is not in 1..%u (the "
                                 "model's loops, total_ut_steps)",
                                 i, t, o->depths[at + t], loops);
        }
        /* a replayed route: k distinct experts in range per sparse layer (the last position
         * is not read) */
        for (uint32_t t = 0; o->routes && t + 1 < len; t++)
            for (uint32_t l = 0; l < route_stride; l += k) {
                const uint16_t *ids = o->routes + (at + t) * route_stride + l;
                for (uint32_t a = 0; a < k; a++) {
                    int dup = ids[a] >= c->num_experts;
                    for (uint32_t b = 0; b < a && !dup; b++) dup = ids[b] == ids[a];
                    if (dup)
                        return set_error(PARITY_ERR_INVALID_ARGUMENT,
                                         "sequence %zu, position %u, sparse layer %u: routed "
                                         "expert %u in slot %u is %s",
                                         i, t, l / k, ids[a], a,
                                         ids[a] >= c->num_experts ? "not below num_experts"
                                                                  : "repeated");
                }
            }
        at += len;
    }
    return PARITY_OK;
}

/* The dense readouts of a chunk's n_out wanted rows, after its forward: each loop's logits
 * in turn, with their log-probs where asked (loop_logprobs) and their step of the expected
 * logits; then the log-probs of the expected logits (`mixed`, the main outputs' job). */
static void loop_readouts(parity_scorer *s, const fwd_ctx *ctx, const parity_score_options *o,
                          size_t n_out, uint32_t loops, const lp_job *mixed) {
    const int mixture = o->readout == PARITY_READOUT_EXPECTED_LOGITS;
    for (uint32_t loop = 0; loop < loops; loop++) {
        forward_loop_logits(ctx, loop, n_out, s->eng.out_rows, s->eng.logits);
        double t = phase_start(ctx);
        if (o->loop_logprobs) {
            lp_job lj = {s, o, s->eng.logits, o->loop_logprobs, NULL, NULL, NULL, loops, loop};
            pool_run(s->eng.pool, job_logprobs, &lj, n_out);
        }
        if (mixture) {
            mix_job mj = {s, s->eng.out_rows, s->eng.logits, loop, loops};
            pool_run(s->eng.pool, job_mix, &mj, n_out);
        }
        phase_lap(ctx, PARITY_PHASE_SAMPLING, &t);
    }
    if (mixture) pool_run(s->eng.pool, job_logprobs, (void *)mixed, n_out);
}

static int score(parity_scorer *s, const parity_score_options *o, const int32_t *tokens,
                 const uint32_t *lengths, size_t n_seqs, float *logprobs, float *entropy,
                 int32_t *top_ids, float *top_logprobs) {
    TRY(check_inputs(s, o, tokens, lengths, n_seqs, logprobs, top_ids, top_logprobs));
    TRY(model_enter(s->model));

    unsigned fp_saved = fp_env_enter();
    fwd_ctx ctx = engine_fwd_ctx(&s->eng);
    ctx.loop_kv = o->loop_kv;
    const fwd_exit rule = exit_rule_resolve(&s->model->config, o->exit_threshold, o->min_depth,
                                            o->max_depth);
    /* the dense readouts: a chosen loop is the depth every row exits at, every loop run
     * (full K/V: the dense learner's planes); every loop's output kept where they read it */
    const int mixture = o->readout == PARITY_READOUT_EXPECTED_LOGITS;
    const uint32_t fixed_depth = o->readout == PARITY_READOUT_LOOP ? o->readout_loop : 0;
    if (fixed_depth) ctx.loop_kv = PARITY_LOOP_KV_FULL;
    /* the entries of a position's routing record (mixture-of-experts models) */
    const size_t route_stride =
        (size_t)config_sparse_layers(&s->model->config) * s->model->config.num_experts_per_tok;
    if (mixture || o->loop_logprobs) ctx.loop_out = s->loop_out;
    if (mixture) ctx.loop_pdf = s->loop_pdf;
    const uint32_t loops = config_loops(&s->model->config);
    lp_job lj = {s, o, mixture ? s->mix_logits : s->eng.logits, logprobs, entropy, top_ids,
                 top_logprobs, 1, 0};
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
                const size_t route_at = (token_at + t) * route_stride;
                const fwd_row row = {tokens[token_at + t], t, s->blocks + block,
                                     o->depths ? o->depths[token_at + t] : fixed_depth, NULL,
                                     o->routes && t + 1 < len ? o->routes + route_at : NULL,
                                     o->routes_out ? o->routes_out + route_at : NULL};
                s->eng.rows[n_rows] = t < o->prompt_len || o->depths
                                          ? row
                                          : exit_rule_row(row, o->exit_rule, &rule);
                if (t + 1 < len) {
                    s->eng.out_rows[n_out] = (uint32_t)n_rows;
                    s->out_index[n_out] = out_at + t;
                    s->out_target[n_out] = tokens[token_at + t + 1];
                    n_out++;
                }
                if (++n_rows == chunk || (i + 1 == last && t + 1 == len)) {
                    /* (the expected logits need no head at the exit loop) */
                    forward(&ctx, n_rows, s->eng.rows, mixture ? 0 : n_out, s->eng.out_rows,
                            s->eng.logits);
                    double t = phase_start(&ctx);
                    if (!mixture) pool_run(s->eng.pool, job_logprobs, &lj, n_out);
                    phase_lap(&ctx, PARITY_PHASE_SAMPLING, &t);
                    if (ctx.loop_out) loop_readouts(s, &ctx, o, n_out, loops, &lj);
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
    ENGINE_CALL(s, "scorer", 1,
                score(s, o, tokens, lengths, n_seqs, logprobs, entropy, top_ids, top_logprobs));
}

int parity_scorer_set_profiling(parity_scorer *s, int on) {
    return engine_set_profiling(s ? &s->eng : NULL, "scorer", on);
}

int parity_scorer_profile(const parity_scorer *s, parity_profile *profile) {
    return engine_profile(s ? &s->eng : NULL, "scorer", profile);
}
