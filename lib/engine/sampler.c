/* The sampler: the inference engine's side. Sequences live in a paged KV cache (blocks of
 * KV_BLOCK positions, reference-counted so that forks share their prompt and copy a block
 * only when they write to it). A step feeds each sequence's last token through the same
 * forward the scorer uses, as one row of a batch, and draws the next token from the
 * distribution of lib/sampling.c with randomness keyed by (seed, stream, position). */
#include <math.h>

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

typedef struct seq_state {
    int live;
    uint32_t len;           /* tokens so far; the cache holds positions 0 .. len-2 and token
                               len-1 is fed by the next step */
    uint32_t prompt_len;
    uint32_t generated;
    uint32_t finished;      /* parity_finish */
    int32_t *tokens;        /* [max_len] */
    uint32_t *depths;       /* [max_len] loops each cached position ran (a looped model's
                               schedule; 1 for the others) */
    uint16_t *routes;       /* [max_len][sparse layers][k] the experts each cached position ran
                               (record_routes), else NULL */
    fwd_exit exit;          /* its exit rule, resolved (PARITY_EXIT_THRESHOLD) */
    uint32_t *blocks;       /* [max_len / KV_BLOCK, rounded up] */
    uint32_t n_blocks;      /* blocks held: positions 0 .. n_blocks * KV_BLOCK - 1 */
    parity_sampling sampling;
    uint64_t stream;
    uint64_t version;       /* the model version its cache was computed under */
} seq_state;

struct parity_sampler {
    engine eng;             /* pool, KV cache, scratch, rows, logits, work, busy flag */
    const parity_model *model;
    parity_sampler_params params;  /* resolved: no zero means "default" */
    uint32_t n_blocks;      /* blocks in the cache */
    uint32_t *refs;         /* [n_blocks] sequences holding each block */
    uint32_t *free_blocks;  /* [n_blocks] stack of free block ids */
    uint32_t n_free;
    seq_state *seqs;        /* [max_seqs] */
    int32_t *seq_tokens;    /* [max_seqs][max_len]: seqs[i].tokens */
    uint32_t *seq_blocks;   /* [max_seqs][block table]: seqs[i].blocks */
    uint32_t *seq_depths;   /* [max_seqs][max_len]: seqs[i].depths */
    uint16_t *seq_routes;   /* [max_seqs][max_len][route_stride]: seqs[i].routes (record_routes) */
    uint32_t route_stride;  /* sparse layers x experts a token (record_routes), else 0 */
    uint32_t *batch_seq;    /* [max_rows] the sequence of each decode row */
};

void parity_sampling_default(parity_sampling *s) {
    if (!s) return;
    memset(s, 0, sizeof *s);
    s->size = sizeof *s;
    s->temperature = 1.0f;
    s->top_p = 1.0f;
    s->logprob_mode = PARITY_LOGPROB_RAW;
}

void parity_sampler_default_params(parity_sampler_params *p) {
    if (!p) return;
    memset(p, 0, sizeof *p);
    p->size = sizeof *p;
    engine_default_settings(&p->n_threads, &p->backend, &p->policy);
}

/* ---- creation: the engine and the sampler's own tables ----------------------------------- */

/* Entries of a sequence's block table: enough blocks for max_len positions. */
static uint32_t table_len(const parity_sampler_params *p) {
    return (p->max_len + KV_BLOCK - 1) / KV_BLOCK;
}

/* The params with every default filled in, and the engine they make; checks them. */
static int sampler_resolve(const parity_model *model, const void *params, void *resolved,
                           engine_params *ep) {
    const parity_config *c = &model->config;
    parity_sampler_params p = *(const parity_sampler_params *)params;
    if (!p.n_threads) p.n_threads = 1;
    if (!p.max_seqs) p.max_seqs = 64;
    if (!p.max_len) p.max_len = c->max_position_embeddings < 4096 ? c->max_position_embeddings : 4096;
    if (!p.prefill_chunk) p.prefill_chunk = 256;
    if (!p.max_batch) p.max_batch = 64;
    if (p.max_len > c->max_position_embeddings)
        return set_error(PARITY_ERR_INVALID_ARGUMENT,
                         "max_len %u exceeds the model's context (max_position_embeddings = %u)",
                         p.max_len, c->max_position_embeddings);
    if (p.split_k > 64)
        return set_error(PARITY_ERR_INVALID_ARGUMENT, "split_k %u is more than 64", p.split_k);
    if (p.loop_kv > PARITY_LOOP_KV_FULL)
        return set_error(PARITY_ERR_INVALID_ARGUMENT, "loop_kv %u is not a parity_loop_kv",
                         p.loop_kv);
    if (p.prefault > 1)
        return set_error(PARITY_ERR_INVALID_ARGUMENT, "prefault %u is not 0 or 1", p.prefault);
    if (p.record_routes > 1)
        return set_error(PARITY_ERR_INVALID_ARGUMENT, "record_routes %u is not 0 or 1",
                         p.record_routes);
    if (p.record_routes && !config_sparse_layers(c))
        return set_error(PARITY_ERR_INVALID_ARGUMENT,
                         "record_routes: the model (%s) has no sparse layers to route",
                         parity_arch_name((int)c->arch));
    if (p.max_seqs > 65536 || p.prefill_chunk > 65536 || p.max_batch > 65536)
        return set_error(PARITY_ERR_INVALID_ARGUMENT,
                         "max_seqs, prefill_chunk and max_batch must be at most 65536");
    /* by default every sequence can reach max_len on blocks of its own, shared or not */
    const uint64_t seq_cells = (uint64_t)table_len(&p) * KV_BLOCK;
    uint64_t cells = p.cache_tokens ? p.cache_tokens : (uint64_t)p.max_seqs * seq_cells;
    if (cells > (1u << 28))
        return set_error(PARITY_ERR_INVALID_ARGUMENT, "a cache of %llu positions is too large",
                         (unsigned long long)cells);
    p.cache_tokens = (uint32_t)((cells + KV_BLOCK - 1) / KV_BLOCK * KV_BLOCK);
    const uint32_t rows = p.prefill_chunk > p.max_batch ? p.prefill_chunk : p.max_batch;
    *ep = (engine_params){.n_threads = p.n_threads, .backend = p.backend, .policy = p.policy,
                          .kv_cells = p.cache_tokens, .max_rows = rows, .max_ctx = p.max_len,
                          .split_k = p.split_k, .max_memory = p.max_memory, .works = DIST_DRAW_ROWS,
                          .prefault = p.prefault};
    *(parity_sampler_params *)resolved = p;
    return PARITY_OK;
}

/* The sampler's own tables, beside the engine's. */
/* The entries of a position's routing record: sparse layers x experts a token. */
static uint32_t route_stride(const parity_config *c, const parity_sampler_params *p) {
    return p->record_routes ? config_sparse_layers(c) * c->num_experts_per_tok : 0;
}

static size_t sampler_bufs(void *object, const parity_config *c, const void *resolved,
                           const engine_params *ep, engine_buf *b) {
    parity_sampler *s = object;
    const parity_sampler_params *p = resolved;
    const uint64_t n_blocks = p->cache_tokens / KV_BLOCK;
    const engine_buf bufs[] = {
        {(void **)&s->refs, n_blocks, sizeof *s->refs, 0, "block references"},
        {(void **)&s->free_blocks, n_blocks, sizeof *s->free_blocks, 0, "free blocks"},
        {(void **)&s->seqs, p->max_seqs, sizeof *s->seqs, 0, "sequences"},
        {(void **)&s->seq_tokens, (uint64_t)p->max_seqs * p->max_len, sizeof *s->seq_tokens, 0,
         "sequence tokens"},
        {(void **)&s->seq_blocks, (uint64_t)p->max_seqs * table_len(p), sizeof *s->seq_blocks, 0,
         "sequence block tables"},
        {(void **)&s->seq_depths, (uint64_t)p->max_seqs * p->max_len, sizeof *s->seq_depths, 0,
         "sequence depth schedules"},
        {(void **)&s->seq_routes, (uint64_t)p->max_seqs * p->max_len * route_stride(c, p),
         sizeof *s->seq_routes, 0, "sequence routing records"},
        {(void **)&s->batch_seq, ep->max_rows, sizeof *s->batch_seq, 0, "batch rows"},
    };
    memcpy(b, bufs, sizeof bufs);
    return sizeof bufs / sizeof bufs[0];
}

static void sampler_describe(const void *resolved, char *buf, size_t size) {
    const parity_sampler_params *p = resolved;
    snprintf(buf, size, "cache_tokens %u, max_seqs %u, max_len %u", p->cache_tokens, p->max_seqs,
             p->max_len);
}

static void sampler_start(void *object, const parity_model *m) {
    parity_sampler *s = object;
    const parity_sampler_params *p = &s->params;
    s->model = m;
    s->n_blocks = p->cache_tokens / KV_BLOCK;
    const uint32_t table = table_len(p);
    s->route_stride = route_stride(&m->config, p);
    for (uint32_t i = 0; i < p->max_seqs; i++) {
        s->seqs[i].tokens = s->seq_tokens + (size_t)i * p->max_len;
        s->seqs[i].blocks = s->seq_blocks + (size_t)i * table;
        s->seqs[i].depths = s->seq_depths + (size_t)i * p->max_len;
        s->seqs[i].routes = s->route_stride
                                ? s->seq_routes + (size_t)i * p->max_len * s->route_stride
                                : NULL;
    }
    /* the free stack pops the lowest block ids first */
    for (uint32_t k = 0; k < s->n_blocks; k++) s->free_blocks[k] = s->n_blocks - 1 - k;
    s->n_free = s->n_blocks;
}

static parity_sampler sampler_layout; /* for the addresses of its fields only */
static const engine_kind sampler_kind = {
    "sampler", sizeof(parity_sampler), offsetof(parity_sampler, eng),
    offsetof(parity_sampler, params), sizeof(parity_sampler_params), &sampler_layout,
    sampler_resolve, sampler_bufs, sampler_describe, sampler_start,
};

int parity_sampler_create(const parity_model *model, const parity_sampler_params *params,
                          parity_sampler **out) {
    clear_error();
    return engine_object_create(&sampler_kind, model, params, out);
}

void parity_sampler_free(parity_sampler *s) { engine_object_free(&sampler_kind, s); }

int parity_sampler_bytes(const parity_model *model, const parity_sampler_params *params,
                         uint64_t *bytes) {
    clear_error();
    return engine_object_bytes(&sampler_kind, model, params, bytes);
}

uint32_t parity_kv_block_tokens(void) { return KV_BLOCK; }

int parity_sampler_cache_tokens(size_t n_groups, const uint32_t *prompt_lens,
                                const uint32_t *completions, uint32_t max_new_tokens,
                                uint64_t *cache_tokens) {
    clear_error();
    if (!prompt_lens || !cache_tokens)
        return set_error(PARITY_ERR_INVALID_ARGUMENT, "prompt_lens or output is NULL");
    if (max_new_tokens == 0)
        return set_error(PARITY_ERR_INVALID_ARGUMENT,
                         "max_new_tokens is 0: the cache a sequence needs has no bound");
    uint64_t blocks = 0;
    for (size_t g = 0; g < n_groups; g++) {
        const uint64_t P = prompt_lens[g], n = completions ? completions[g] : 1;
        if (P == 0) return set_error(PARITY_ERR_EMPTY_INPUT, "group %zu has an empty prompt", g);
        /* a sequence of final length L has written positions 0 .. L-2 */
        const uint64_t written = P + max_new_tokens - 1;
        const uint64_t shared = (P - 1) / KV_BLOCK;  /* full prompt blocks, never written again */
        const uint64_t own = (written + KV_BLOCK - 1) / KV_BLOCK - shared;
        const int partly_filled = (P - 1) % KV_BLOCK != 0;
        blocks += shared + n * own + (partly_filled && n > 1 ? 1 : 0);
    }
    *cache_tokens = blocks * KV_BLOCK;
    return PARITY_OK;
}

/* ---- blocks ------------------------------------------------------------------------------- */

static uint32_t block_take(parity_sampler *s) {
    uint32_t b = s->free_blocks[--s->n_free];
    s->refs[b] = 1;
    return b;
}

static void block_drop(parity_sampler *s, uint32_t b) {
    if (--s->refs[b] == 0) s->free_blocks[s->n_free++] = b;
}

/* Copies every layer's K and V of block `from` into block `to`. */
static void block_copy(parity_sampler *s, uint32_t from, uint32_t to) {
    const kv_cache *kv = &s->eng.kv;
    const size_t esz = kv->fp32 ? 4 : 2, cells = (size_t)KV_BLOCK * kv->width * esz;
    for (uint32_t l = 0; l < kv->n_layers; l++) {
        size_t layer = (size_t)l * kv->n_cells * kv->width * esz;
        memcpy((char *)kv->k + layer + (size_t)to * cells, (char *)kv->k + layer + (size_t)from * cells, cells);
        memcpy((char *)kv->v + layer + (size_t)to * cells, (char *)kv->v + layer + (size_t)from * cells, cells);
    }
}

/* Blocks a sequence needs before it can write position `pos`: a fresh block, or a private copy
 * of a shared one. */
static uint32_t blocks_needed(const parity_sampler *s, const seq_state *q, uint32_t pos) {
    uint32_t b = pos / KV_BLOCK;
    if (b >= q->n_blocks) return b + 1 - q->n_blocks;
    return s->refs[q->blocks[b]] > 1 ? 1 : 0;
}

/* Makes position `pos` writable (blocks_needed() blocks must be free). */
static void make_writable(parity_sampler *s, seq_state *q, uint32_t pos) {
    uint32_t b = pos / KV_BLOCK;
    while (q->n_blocks <= b) q->blocks[q->n_blocks++] = block_take(s);
    if (s->refs[q->blocks[b]] > 1) {
        uint32_t copy = block_take(s);
        block_copy(s, q->blocks[b], copy);
        block_drop(s, q->blocks[b]);
        q->blocks[b] = copy;
    }
}

/* ---- sequences ------------------------------------------------------------------------- */

/* The sequence's exit rule into the forward's terms. */
static void resolve_exit(const parity_config *c, seq_state *q) {
    const parity_sampling *p = &q->sampling;
    q->exit = exit_rule_resolve(c, p->exit_threshold, p->min_depth, p->max_depth);
}

/* Where the experts position pos of the sequence runs are recorded (record_routes), else NULL. */
static uint16_t *route_record(const parity_sampler *s, const seq_state *q, uint32_t pos) {
    return q->routes ? q->routes + (size_t)pos * s->route_stride : NULL;
}

/* A decode row of the sequence at pos: its depth or its rule. A prompt token (the first
 * step feeds the prompt's last one) runs every loop, as the prefill does: the published
 * replay's alignment, where the rollout's first exit depth is the prefill's, full. */
static fwd_row decode_row(const parity_sampler *s, const seq_state *q, uint32_t pos) {
    const fwd_row row = {q->tokens[pos], pos, q->blocks, 0, NULL, NULL, route_record(s, q, pos)};
    return pos < q->prompt_len ? row : exit_rule_row(row, q->sampling.exit_rule, &q->exit);
}

static int check_sampling(const parity_sampler *s, const parity_sampling *p) {
    if (!p) return set_error(PARITY_ERR_INVALID_ARGUMENT, "sampling parameters are NULL");
    if (p->size != sizeof *p)
        return set_error(PARITY_ERR_INVALID_ARGUMENT,
                         "sampling.size is %u, this library expects %zu: initialise it with "
                         "parity_sampling_default()",
                         p->size, sizeof *p);
    const uint32_t V = s->model->config.vocab_size;
    const dist_params dp = {p->logprob_mode, p->temperature, p->top_k, p->top_p, p->min_p};
    TRY(dist_params_check(&dp, V));
    if (p->n_stop > PARITY_MAX_STOP)
        return set_error(PARITY_ERR_INVALID_ARGUMENT, "n_stop %u exceeds PARITY_MAX_STOP (%d)",
                         p->n_stop, PARITY_MAX_STOP);
    for (uint32_t i = 0; i < p->n_stop; i++)
        if (p->stop[i] < 0 || (uint32_t)p->stop[i] >= V)
            return set_error(PARITY_ERR_TOKEN_RANGE, "stop token %d is outside the vocabulary [0, %u)",
                             p->stop[i], V);
    if (p->top_n > V)
        return set_error(PARITY_ERR_INVALID_ARGUMENT, "top_n %u exceeds the vocabulary (%u)",
                         p->top_n, V);
    return exit_rule_check(&s->model->config, p->exit_rule, p->exit_threshold, p->min_depth,
                           p->max_depth);
}

static int check_seq(const parity_sampler *s, uint32_t seq) {
    if (seq >= s->params.max_seqs || !s->seqs[seq].live)
        return set_error(PARITY_ERR_UNKNOWN_SEQUENCE, "sequence %u is not live in this sampler", seq);
    return PARITY_OK;
}

static int free_slot(const parity_sampler *s, uint32_t *slot) {
    for (uint32_t i = 0; i < s->params.max_seqs; i++)
        if (!s->seqs[i].live) {
            *slot = i;
            return PARITY_OK;
        }
    return set_error(PARITY_ERR_CACHE_FULL, "all %u sequence slots are live (max_seqs)",
                     s->params.max_seqs);
}

/* The checks of one prompt to add; `which` names it in messages ("the prompt", "prompt 3"). */
static int check_prompt(const parity_sampler *s, const char *which, const int32_t *prompt,
                        uint32_t len, const parity_sampling *sampling) {
    TRY(check_sampling(s, sampling));
    const uint32_t V = s->model->config.vocab_size;
    if (len == 0) return set_error(PARITY_ERR_EMPTY_INPUT, "%s is empty", which);
    if (!prompt) return set_error(PARITY_ERR_INVALID_ARGUMENT, "%s is NULL", which);
    if (len > s->params.max_len)
        return set_error(PARITY_ERR_TOO_LONG, "%s has %u tokens, more than max_len (%u)", which,
                         len, s->params.max_len);
    for (uint32_t t = 0; t < len; t++)
        if (prompt[t] < 0 || (uint32_t)prompt[t] >= V)
            return set_error(PARITY_ERR_TOKEN_RANGE,
                             "%s, position %u: token id %d is outside the vocabulary [0, %u)",
                             which, t, prompt[t], V);
    return PARITY_OK;
}

/* KV blocks a prompt of len tokens fills (its last token is fed by the first step). */
static uint32_t prompt_blocks(uint32_t len) { return (len - 1 + KV_BLOCK - 1) / KV_BLOCK; }

/* A checked prompt into a free slot, with its blocks (the caller made sure there are enough). */
static uint32_t take_seq(parity_sampler *s, const int32_t *prompt, uint32_t len,
                         const parity_sampling *sampling, uint64_t stream) {
    uint32_t slot = 0;
    free_slot(s, &slot);
    seq_state *q = &s->seqs[slot];
    const uint32_t need = prompt_blocks(len);
    q->live = 1;
    q->len = q->prompt_len = len;
    q->generated = 0;
    q->finished = len == s->params.max_len ? PARITY_FINISHED_CAPACITY : PARITY_RUNNING;
    q->sampling = *sampling;
    resolve_exit(&s->model->config, q);
    q->stream = stream;
    q->version = s->model->version;
    q->n_blocks = 0;
    memcpy(q->tokens, prompt, len * sizeof *prompt);
    /* the prompt runs every loop */
    for (uint32_t j = 0; j + 1 < len; j++) q->depths[j] = config_loops(&s->model->config);
    while (q->n_blocks < need) q->blocks[q->n_blocks++] = block_take(s);
    return slot;
}

/* Prefills positions 0 .. len-2 of the n sequences seqs (their prompts are in their tokens),
 * packed into forwards of up to prefill_chunk rows, sequence after sequence; no logits are
 * needed. A row's K/V and attention depend only on its sequence, so the packing moves no bit. */
static void prefill(parity_sampler *s, const uint32_t *seqs, size_t n) {
    unsigned fp_saved = fp_env_enter();
    fwd_ctx ctx = engine_fwd_ctx(&s->eng);
    uint32_t rows = 0;
    for (size_t i = 0; i < n; i++) {
        const seq_state *q = &s->seqs[seqs[i]];
        for (uint32_t at = 0; at + 1 < q->prompt_len; at++) {
            s->eng.rows[rows++] =
                (fwd_row){q->tokens[at], at, q->blocks, 0, NULL, NULL, route_record(s, q, at)};
            if (rows == s->params.prefill_chunk) {
                forward(&ctx, rows, s->eng.rows, 0, NULL, NULL);
                rows = 0;
            }
        }
    }
    if (rows) forward(&ctx, rows, s->eng.rows, 0, NULL, NULL);
    fp_env_restore(fp_saved);
}

static int sampler_add(parity_sampler *s, const int32_t *prompt, uint32_t len,
                       const parity_sampling *sampling, uint64_t stream, uint32_t *seq) {
    if (!s || !prompt || !seq)
        return set_error(PARITY_ERR_INVALID_ARGUMENT, "sampler, prompt or output is NULL");
    TRY(check_prompt(s, "the prompt", prompt, len, sampling));
    uint32_t slot = 0;
    TRY(free_slot(s, &slot));
    const uint32_t need = prompt_blocks(len);
    if (need > s->n_free)
        return set_error(PARITY_ERR_CACHE_FULL,
                         "the prompt needs %u cache blocks, %u are free", need, s->n_free);
    TRY(model_enter(s->model));
    slot = take_seq(s, prompt, len, sampling, stream);
    prefill(s, &slot, 1);
    model_leave(s->model);
    *seq = slot;
    return PARITY_OK;
}

static int sampler_add_batch(parity_sampler *s, size_t n, const int32_t *const *prompts,
                             const uint32_t *lens, const parity_sampling *sampling,
                             const uint64_t *streams, uint32_t *seqs) {
    if (!s || !prompts || !lens || !sampling || !streams || !seqs)
        return set_error(PARITY_ERR_INVALID_ARGUMENT,
                         "sampler, prompts, lens, sampling, streams or output is NULL");
    if (n == 0) return set_error(PARITY_ERR_EMPTY_INPUT, "no prompts to add");
    uint64_t need = 0;
    for (size_t i = 0; i < n; i++) {
        char which[48];
        snprintf(which, sizeof which, "prompt %zu", i);
        TRY(check_prompt(s, which, prompts[i], lens[i], &sampling[i]));
        need += prompt_blocks(lens[i]);
    }
    size_t free_slots = 0;
    for (uint32_t i = 0; i < s->params.max_seqs; i++) free_slots += !s->seqs[i].live;
    if (n > free_slots)
        return set_error(PARITY_ERR_CACHE_FULL, "%zu prompts, %zu free sequence slots (max_seqs %u)",
                         n, free_slots, s->params.max_seqs);
    if (need > s->n_free)
        return set_error(PARITY_ERR_CACHE_FULL, "the prompts need %llu cache blocks, %u are free",
                         (unsigned long long)need, s->n_free);
    TRY(model_enter(s->model));
    for (size_t i = 0; i < n; i++) seqs[i] = take_seq(s, prompts[i], lens[i], &sampling[i], streams[i]);
    prefill(s, seqs, n);
    model_leave(s->model);
    return PARITY_OK;
}

static int sampler_fork(parity_sampler *s, uint32_t parent, const parity_sampling *sampling,
                        uint64_t stream, uint32_t *child) {
    if (!s || !child) return set_error(PARITY_ERR_INVALID_ARGUMENT, "sampler or output is NULL");
    int rc = check_seq(s, parent);
    if (!rc) rc = check_sampling(s, sampling);
    uint32_t slot = 0;
    if (!rc) rc = free_slot(s, &slot);
    if (rc) return rc;
    const seq_state *p = &s->seqs[parent];
    seq_state *q = &s->seqs[slot];
    q->live = 1;
    q->len = p->len;
    q->prompt_len = p->len; /* the child's completion starts here */
    q->generated = 0;
    q->finished = p->len == s->params.max_len ? PARITY_FINISHED_CAPACITY : PARITY_RUNNING;
    q->sampling = *sampling;
    resolve_exit(&s->model->config, q);
    q->stream = stream;
    q->version = p->version;
    memcpy(q->tokens, p->tokens, p->len * sizeof *q->tokens);
    memcpy(q->depths, p->depths, p->len * sizeof *q->depths);
    if (q->routes) /* the positions the parent ran */
        memcpy(q->routes, p->routes, (size_t)(p->len - 1) * s->route_stride * sizeof *q->routes);
    q->n_blocks = p->n_blocks;
    for (uint32_t b = 0; b < p->n_blocks; b++) {
        q->blocks[b] = p->blocks[b];
        s->refs[q->blocks[b]]++;
    }
    *child = slot;
    return PARITY_OK;
}

static int sampler_release(parity_sampler *s, uint32_t seq) {
    if (!s) return set_error(PARITY_ERR_INVALID_ARGUMENT, "sampler is NULL");
    TRY(check_seq(s, seq));
    seq_state *q = &s->seqs[seq];
    for (uint32_t b = 0; b < q->n_blocks; b++) block_drop(s, q->blocks[b]);
    q->n_blocks = 0;
    q->live = 0;
    return PARITY_OK;
}

int parity_sampler_seq_info(const parity_sampler *s, uint32_t seq, parity_seq_info *info) {
    clear_error();
    if (!s || !info) return set_error(PARITY_ERR_INVALID_ARGUMENT, "sampler or output is NULL");
    if (info->size != sizeof *info)
        return set_error(PARITY_ERR_INVALID_ARGUMENT,
                         "info.size is %u, this library expects %zu", info->size, sizeof *info);
    TRY(check_seq(s, seq));
    const seq_state *q = &s->seqs[seq];
    *info = (parity_seq_info){sizeof *info, q->len, q->prompt_len, q->finished, q->stream, q->version};
    return PARITY_OK;
}

int parity_sampler_depths(const parity_sampler *s, uint32_t seq, const uint32_t **depths,
                          uint32_t *n) {
    clear_error();
    if (!s || !depths || !n) return set_error(PARITY_ERR_INVALID_ARGUMENT, "sampler or output is NULL");
    TRY(check_seq(s, seq));
    *depths = s->seqs[seq].depths;
    *n = s->seqs[seq].len - 1;
    return PARITY_OK;
}

int parity_sampler_routes(const parity_sampler *s, uint32_t seq, const uint16_t **routes,
                          uint32_t *n, uint32_t *stride) {
    clear_error();
    if (!s || !routes || !n || !stride)
        return set_error(PARITY_ERR_INVALID_ARGUMENT, "sampler or output is NULL");
    if (!s->route_stride)
        return set_error(PARITY_ERR_INVALID_ARGUMENT,
                         "the sampler keeps no routing record (record_routes 0, or a model "
                         "without experts)");
    TRY(check_seq(s, seq));
    *routes = s->seqs[seq].routes;
    *n = s->seqs[seq].len - 1;
    *stride = s->route_stride;
    return PARITY_OK;
}

int parity_sampler_tokens(const parity_sampler *s, uint32_t seq, const int32_t **tokens,
                          uint32_t *len, uint32_t *prompt_len) {
    clear_error();
    if (!s || !tokens || !len) return set_error(PARITY_ERR_INVALID_ARGUMENT, "sampler or output is NULL");
    TRY(check_seq(s, seq));
    *tokens = s->seqs[seq].tokens;
    *len = s->seqs[seq].len;
    if (prompt_len) *prompt_len = s->seqs[seq].prompt_len;
    return PARITY_OK;
}

/* ---- steps ----------------------------------------------------------------------------- */

typedef struct draw_job {
    parity_sampler *s;
    size_t first;           /* index of the batch's first row in the step's outputs */
    int32_t *tokens;
    float *logprobs;
    int32_t *top_ids;
    float *top_logprobs;
    uint32_t max_top_n;     /* the stride of the alternatives in the outputs */
} draw_job;

/* Reports row r's log-prob and alternatives from d, the draw's distribution in w, building
 * the reported mode's distribution there when it differs. */
static void report_row(const draw_job *j, size_t r, int32_t token, dist *d, const dist_work *w,
                       const float *logits, const dist_params *draw) {
    parity_sampler *s = j->s;
    const size_t V = s->model->config.vocab_size;
    const parity_sampling *sp = &s->seqs[s->batch_seq[r]].sampling;
    const size_t o = j->first + r;
    j->tokens[o] = token;
    /* the reported log-prob, in the sequence's mode (the draw's distribution when that mode
     * is the truncated one, or when the draw's is untruncated and the same) */
    const dist_params rep = {sp->logprob_mode, sp->temperature, sp->top_k, sp->top_p, sp->min_p};
    if (sp->logprob_mode != PARITY_LOGPROB_PROCESSED_TRUNCATED &&
        !dist_built_as(draw, d, &rep))
        dist_build(&s->params.policy, &rep, logits, V, w, d);
    j->logprobs[o] = dist_logprob(d, w, token);
    uint32_t n = sp->top_n < j->max_top_n ? sp->top_n : j->max_top_n;
    if (n && j->top_ids)
        dist_top(d, w, V, n, j->top_ids + o * j->max_top_n, j->top_logprobs + o * j->max_top_n);
}

static void job_draw(void *p, size_t begin, size_t end, unsigned worker) {
    const draw_job *j = p;
    parity_sampler *s = j->s;
    const size_t V = s->model->config.vocab_size;
    dist_work w[DIST_DRAW_ROWS];
    for (unsigned k = 0; k < DIST_DRAW_ROWS; k++) w[k] = engine_work(&s->eng, worker, k);
    /* DIST_DRAW_ROWS rows at a time, each drawn from the truncated processed distribution
     * keyed by its new position */
    for (size_t r = begin; r < end; r += DIST_DRAW_ROWS) {
        const unsigned rows = end - r >= DIST_DRAW_ROWS ? DIST_DRAW_ROWS : (unsigned)(end - r);
        dist d[DIST_DRAW_ROWS];
        dist_params draw[DIST_DRAW_ROWS];
        double u[DIST_DRAW_ROWS];
        int32_t token[DIST_DRAW_ROWS];
        for (unsigned k = 0; k < rows; k++) {
            const seq_state *q = &s->seqs[s->batch_seq[r + k]];
            const parity_sampling *sp = &q->sampling;
            draw[k] = (dist_params){PARITY_LOGPROB_PROCESSED_TRUNCATED, sp->temperature,
                                    sp->top_k, sp->top_p, sp->min_p};
            dist_build(&s->params.policy, &draw[k], s->eng.logits + (r + k) * V, V, &w[k], &d[k]);
            u[k] = philox_uniform(sp->seed, q->stream, q->len);
        }
        dist_draw_rows(rows, d, w, u, V, token);
        for (unsigned k = 0; k < rows; k++)
            report_row(j, r + k, token[k], &d[k], &w[k], s->eng.logits + (r + k) * V, &draw[k]);
    }
}

/* Checks a step's sequences and counts the cache blocks it needs, before anything changes. */
static int step_check(const parity_sampler *s, const uint32_t *seqs, size_t n, uint64_t *need) {
    *need = 0;
    for (size_t i = 0; i < n; i++) {
        TRY(check_seq(s, seqs[i]));
        const seq_state *q = &s->seqs[seqs[i]];
        if (q->finished)
            return set_error(PARITY_ERR_SEQUENCE_FINISHED, "sequence %u has finished (%s)", seqs[i],
                             q->finished == PARITY_FINISHED_STOP     ? "stop token"
                             : q->finished == PARITY_FINISHED_LENGTH ? "max_new_tokens"
                                                                     : "max_len");
        for (size_t j = 0; j < i; j++)
            if (seqs[j] == seqs[i])
                return set_error(PARITY_ERR_INVALID_ARGUMENT, "sequence %u is listed twice", seqs[i]);
        if (q->version != s->model->version)
            return set_error(PARITY_ERR_STALE,
                             "sequence %u's KV cache was computed under model version %llu, the "
                             "weights are now version %llu: release it and add it again",
                             seqs[i], (unsigned long long)q->version,
                             (unsigned long long)s->model->version);
        *need += blocks_needed(s, q, q->len - 1);
    }
    /* A fork and its parent may both need a private copy of one shared block; the second
     * to copy then finds the block no longer shared. Counting both overestimates, which only
     * makes the check stricter by at most one block per shared block. */
    if (*need > s->n_free)
        return set_error(PARITY_ERR_CACHE_FULL, "the step needs %llu cache blocks, %u are free",
                         (unsigned long long)*need, s->n_free);
    return PARITY_OK;
}

static int sampler_step(parity_sampler *s, const uint32_t *seqs, size_t n, int32_t *tokens,
                        float *logprobs, uint32_t *finished, uint32_t max_top_n, int32_t *top_ids,
                        float *top_logprobs) {
    if (!s || !seqs || !tokens || !logprobs || !finished)
        return set_error(PARITY_ERR_INVALID_ARGUMENT, "sampler, seqs or an output is NULL");
    if (n == 0) return set_error(PARITY_ERR_EMPTY_INPUT, "no sequences to step");
    if (max_top_n && (!top_ids || !top_logprobs))
        return set_error(PARITY_ERR_INVALID_ARGUMENT, "max_top_n is %u but top_ids or top_logprobs is NULL",
                         max_top_n);
    /* the weights cannot change from here to the end of the step */
    TRY(model_enter(s->model));
    uint64_t need;
    const int rc = step_check(s, seqs, n, &need);
    if (rc) {
        model_leave(s->model);
        return rc;
    }

    unsigned fp_saved = fp_env_enter();
    const int looped = s->model->config.arch == PARITY_ARCH_OURO;
    /* decode: the kernel-order experiments apply here, as engines use them in decode */
    fwd_ctx ctx = engine_fwd_ctx(&s->eng);
    ctx.split_k = s->params.split_k > 1 ? s->params.split_k : 0;
    ctx.split_kv = s->params.split_kv;
    ctx.loop_kv = s->params.loop_kv;
    for (size_t first = 0; first < n; first += s->params.max_batch) {
        size_t B = n - first < s->params.max_batch ? n - first : s->params.max_batch;
        for (size_t r = 0; r < B; r++) {
            seq_state *q = &s->seqs[seqs[first + r]];
            const uint32_t pos = q->len - 1;
            make_writable(s, q, pos);
            s->eng.rows[r] = decode_row(s, q, pos);
            s->eng.out_rows[r] = (uint32_t)r;
            s->batch_seq[r] = seqs[first + r];
        }
        forward(&ctx, B, s->eng.rows, B, s->eng.out_rows, s->eng.logits);
        for (size_t r = 0; r < B; r++) {
            seq_state *q = &s->seqs[seqs[first + r]];
            q->depths[q->len - 1] = looped ? s->eng.rows[r].depth : 1;
        }
        double t = phase_start(&ctx);
        draw_job j = {s, first, tokens, logprobs, top_ids, top_logprobs, max_top_n};
        pool_run(s->eng.pool, job_draw, &j, B);
        phase_lap(&ctx, PARITY_PHASE_SAMPLING, &t);
    }
    fp_env_restore(fp_saved);
    model_leave(s->model);

    /* append the tokens, finish what finished */
    for (size_t i = 0; i < n; i++) {
        seq_state *q = &s->seqs[seqs[i]];
        const int32_t t = tokens[i];
        q->tokens[q->len++] = t;
        q->generated++;
        q->finished = PARITY_RUNNING;
        for (uint32_t k = 0; k < q->sampling.n_stop; k++)
            if (q->sampling.stop[k] == t) q->finished = PARITY_FINISHED_STOP;
        if (!q->finished && q->sampling.max_new_tokens && q->generated >= q->sampling.max_new_tokens)
            q->finished = PARITY_FINISHED_LENGTH;
        if (!q->finished && q->len == s->params.max_len) q->finished = PARITY_FINISHED_CAPACITY;
        finished[i] = q->finished;
    }
    return PARITY_OK;
}

/* ---- the public calls: one thread at a time ------------------------------------------- */

int parity_sampler_add(parity_sampler *s, const int32_t *prompt, uint32_t len,
                       const parity_sampling *sampling, uint64_t stream, uint32_t *seq) {
    ENGINE_CALL(s, "sampler", 1, sampler_add(s, prompt, len, sampling, stream, seq));
}

int parity_sampler_add_batch(parity_sampler *s, size_t n, const int32_t *const *prompts,
                             const uint32_t *lens, const parity_sampling *sampling,
                             const uint64_t *streams, uint32_t *seqs) {
    ENGINE_CALL(s, "sampler", 1, sampler_add_batch(s, n, prompts, lens, sampling, streams, seqs));
}

int parity_sampler_fork(parity_sampler *s, uint32_t parent, const parity_sampling *sampling,
                        uint64_t stream, uint32_t *child) {
    ENGINE_CALL(s, "sampler", 0, sampler_fork(s, parent, sampling, stream, child));
}

int parity_sampler_release(parity_sampler *s, uint32_t seq) {
    ENGINE_CALL(s, "sampler", 0, sampler_release(s, seq));
}

int parity_sampler_step(parity_sampler *s, const uint32_t *seqs, size_t n, int32_t *tokens,
                        float *logprobs, uint32_t *finished, uint32_t max_top_n, int32_t *top_ids,
                        float *top_logprobs) {
    ENGINE_CALL(s, "sampler", 1, sampler_step(s, seqs, n, tokens, logprobs, finished, max_top_n,
                                              top_ids, top_logprobs));
}

int parity_sampler_set_profiling(parity_sampler *s, int on) {
    return engine_set_profiling(s ? &s->eng : NULL, "sampler", on);
}

int parity_sampler_profile(const parity_sampler *s, parity_profile *profile) {
    return engine_profile(s ? &s->eng : NULL, "sampler", profile);
}
