/* Causal attention of each row over its sequence's cached positions, one (row, KV head) pair
 * per task. The order of every sum is fixed and the same for a prefill row and a decode row:
 * q.k in dot16 order over head_dim, the softmax denominator in dot16 order over positions,
 * P.V one position at a time in ascending order. Masked positions are not visited: their
 * probability is exactly 0 in every recipe (exp of the most negative bf16 minus the row max
 * underflows to +0), and adding +0 changes no accumulator. */
#include <math.h>

#include "attention.h"

#include <string.h>

#include "base/floats.h"
#include "base/threadpool.h"
#include "kvcache.h"
#include "profile.h"
#include "kernels/kernel_common.h"
#include "kernels/kernels.h"

typedef struct attn_job {
    const fwd_ctx *ctx;
    uint32_t layer;
    size_t n_rows;
    const fwd_row *rows;
    const float *q;
    float *att;
    const uint32_t *fresh;  /* per row: the first position this forward wrote of its sequence */
} attn_job;

/* Kernel-order experiment (parity_sampler_params.split_kv): flash attention over segments of
 * split_kv positions, each with its own max m_s, sum l_s and output O_s = sum bf16(P) V, merged
 * in segment order into a running (m, l, O) as split-KV decode kernels combine them. */
static void attend_split(const fwd_ctx *ctx, uint32_t layer, const fwd_row *row, const float *q,
                         size_t kvh, float *s, float *o, float *out) {
    const kernels *k = kern();
    const parity_policy *pol = &ctx->pol;
    const kv_cache *kv = ctx->kv;
    const size_t hd = ctx->config->head_dim, n = (size_t)row->pos + 1, seg = ctx->split_kv;
    const float scale = (float)(1.0 / sqrt((double)hd));
    float *os = o + hd; /* the segment's output */
    float m = -INFINITY, l = 0;
    memset(o, 0, hd * sizeof *o);
    for (size_t p0 = 0; p0 < n; p0 += seg) {
        const size_t len = n - p0 < seg ? n - p0 : seg;
        for (size_t p = 0; p < len; p++) {
            size_t cell = kv_offset(kv, layer, row->blocks, (uint32_t)(p0 + p), kvh);
            s[p] = (kv->fp32 ? k->dot_f32(q, (const float *)kv->k + cell, hd)
                             : k->dot_f32_bf16(q, (const uint16_t *)kv->k + cell, hd)) * scale;
        }
        const float ms = k->max_f32(s, len);
        const float ls = k->sum_exp(s, len, ms, s);
        round_with(k, pol, s, len);
        memset(os, 0, hd * sizeof *os);
        for (size_t p = 0; p < len; p++) {
            size_t cell = kv_offset(kv, layer, row->blocks, (uint32_t)(p0 + p), kvh);
            if (kv->fp32)
                k->axpy_f32(os, s[p], (const float *)kv->v + cell, hd);
            else
                k->axpy_bf16(os, s[p], (const uint16_t *)kv->v + cell, hd);
        }
        /* merge: rescale both sides to the new max */
        const float mn = ms > m ? ms : m;
        const float a = parity_expf(m - mn), b = parity_expf(ms - mn);
        for (size_t d = 0; d < hd; d++) o[d] = o[d] * a + os[d] * b;
        l = l * a + ls * b;
        m = mn;
    }
    for (size_t d = 0; d < hd; d++) out[d] = o[d] / l;
    round_with(k, pol, out, hd);
}

/* Scores of one query head over positions 0..n-1 -> probabilities in place, per mode;
 * returns the softmax denominator. Three passes over the row: the scaling with its rounding
 * points and the max, sum_exp, the normalisation or P's rounding. */
static float probabilities(const kernels *k, const parity_policy *pol, int mode, float scale,
                           float *s, size_t n) {
    const int fmt = round_format_of(pol);
    /* eager: matmul output rounded, then `* scaling` rounded (+ mask 0 is exact) */
    const int eager = mode == PARITY_ATTN_EAGER ? fmt : FMT_NONE;
    float m;
    k->scale_round(s, n, scale, eager, eager, &m);
    const float l = k->sum_exp(s, n, m, s);  /* s[p] <- exp(s[p] - m) */
    if (mode == PARITY_ATTN_FLASH)
        round_with(k, pol, s, n);  /* P stays unnormalised; bf16(P) feeds P.V, l sums the unrounded P */
    else
        k->scale_round(s, n, 1.0f / l, FMT_NONE, eager, NULL);  /* softmax(fp32).to(bf16) */
    return l;
}

/* The cache's blocks of one head lie a whole block of every head apart (kv_cache), each in a
 * page of its own that the hardware's stream prefetchers do not follow from the last, so
 * attend_run asks for them itself: the block KV_NEAR_BLOCKS ahead of the one it reads into
 * L1 (prefetch_rows), and, where the rows read positions written before this forward, a
 * walk over those blocks (kv_walk) up to KV_FAR_BLOCKS ahead into L2, a few lines beside each
 * kernel call, as many as the call's work covers: the blocks that only one row reads (a
 * fork's own tail: 16 of them side by side in a task at a batch of forks) then come in while
 * the shared ones are worked on, instead of in one burst each that waits on memory. */
#define KV_NEAR_BLOCKS 2
#define KV_FAR_BLOCKS 8

static void prefetch_block(const kv_cache *kv, const void *plane, uint32_t layer,
                           const uint32_t *blocks, size_t pos, size_t n, size_t kvh) {
    if (pos >= n) return;
    const size_t len = n - pos < KV_BLOCK ? n - pos : KV_BLOCK;
    const size_t elt = kv->fp32 ? sizeof(float) : sizeof(uint16_t);
    const size_t bytes = len * kv->head_dim * elt;
    const char *p = (const char *)plane + kv_offset(kv, layer, blocks, (uint32_t)pos, kvh) * elt;
    for (size_t b = 0; b < bytes; b += 64) __builtin_prefetch(p + b);
}

/* A worker's scratch: scores [ATTN_TASK_ROWS][group][max_ctx] and, in pv (attn_pv_floats),
 * the accumulators [ATTN_TASK_ROWS][group][hd], the denominators [ATTN_TASK_ROWS][group],
 * one block of keys and one of values widened to fp32 ([KV_BLOCK][hd] each), and the task's
 * queries [ATTN_TASK_ROWS][group][hd], so that those of consecutive rows lie hd apart like
 * the heads of one row, then the same packed for the table's bf16 dot products (qb, where it
 * has them: pack_queries_bf16). */
typedef struct attn_scratch {
    float *scores, *acc, *l, *keys, *vals, *q;
    uint16_t *qb;
    size_t max_ctx;
} attn_scratch;

/* Where row r's block at position b0 comes from, for attend_run: the block widened to fp32 in
 * the worker's scratch, when the rows share it, else the cache as it is (bf16 or fp32). */
enum { BLOCK_DIRECT, BLOCK_WIDENED };

/* The source of row r's block at b0 (offset `off` in the plane), widening it into `wide` when
 * another row of the run reads the same block: the next row that reaches b0 (rows of one
 * sequence, or forks of one prompt, which share their prefix's blocks, come next to each
 * other). *widened is the offset now in `wide`, SIZE_MAX for none. */
static int block_source(const attn_job *j, size_t r, size_t r1, size_t b0, size_t kvh, size_t off,
                        size_t blen, const void *plane, float *wide, size_t *widened) {
    const kv_cache *kv = j->ctx->kv;
    if (kv->fp32 || !kern()->attn_widens_shared_blocks) return BLOCK_DIRECT;
    if (off == *widened) return BLOCK_WIDENED;
    for (size_t s = r + 1; s < r1; s++) {
        if (b0 >= (size_t)j->rows[s].pos + 1) continue;
        if (kv_offset(kv, j->layer, j->rows[s].blocks, (uint32_t)b0, kvh) != off) break;
        kern()->widen_bf16((const uint16_t *)plane + off, blen * kv->head_dim, wide);
        *widened = off;
        return BLOCK_WIDENED;
    }
    return BLOCK_DIRECT;
}

/* The rows from r on (before r1) that read the same positions of the same block at b0 as row
 * r: the rows of one sequence whose positions cover the whole block, or forks over their
 * shared prefix. Returns the first row after them; *len is how many positions of the block
 * they read (0 when row r ends before b0: the run is row r alone), *off where the block
 * lies. */
static size_t rows_on_block(const attn_job *j, size_t r, size_t r1, size_t b0, size_t kvh,
                            size_t *len, size_t *off) {
    const kv_cache *kv = j->ctx->kv;
    const size_t n = (size_t)j->rows[r].pos + 1;
    *len = 0;
    if (b0 >= n) return r + 1;
    *len = n - b0 < KV_BLOCK ? n - b0 : KV_BLOCK;
    *off = kv_offset(kv, j->layer, j->rows[r].blocks, (uint32_t)b0, kvh);
    size_t e = r + 1;
    for (; e < r1; e++) {
        const size_t ne = (size_t)j->rows[e].pos + 1;
        if (ne <= b0 || (ne - b0 < KV_BLOCK ? ne - b0 : KV_BLOCK) != *len ||
            kv_offset(kv, j->layer, j->rows[e].blocks, (uint32_t)b0, kvh) != *off)
            break;
    }
    return e;
}

/* Asks into L1 the block at position `pos` of every row of the run whose block there is not
 * the previous row's. */
static void prefetch_rows(const attn_job *j, const void *plane, size_t r0, size_t r1, size_t pos,
                          size_t kvh) {
    const kv_cache *kv = j->ctx->kv;
    size_t last = SIZE_MAX;
    for (size_t r = r0; r < r1; r++) {
        const size_t n = (size_t)j->rows[r].pos + 1;
        if (pos >= n) continue;
        const size_t off = kv_offset(kv, j->layer, j->rows[r].blocks, (uint32_t)pos, kvh);
        if (off != last) prefetch_block(kv, plane, j->layer, j->rows[r].blocks, pos, n, kvh);
        last = off;
    }
}

/* The far walk over the blocks that rows r0 .. r1-1 read in one plane and that hold a
 * position written before this forward (those it wrote, just now, are still in the caches),
 * in attend_run's order: positions ascending; at each, the rows in order, a block that the
 * previous row reads too only once. It starts KV_NEAR_BLOCKS in, where prefetch_rows has not
 * been. */
typedef struct kv_walk {
    const attn_job *j;
    const char *plane;
    size_t r0, r1, kvh, elt;
    size_t end;          /* past the last position written before this forward */
    size_t b0, r, line;  /* the next line to ask for: line `line` of row r's block at b0 */
    size_t last;         /* the previous row's block at b0, SIZE_MAX for none */
} kv_walk;

/* The walk of a pass over `plane`; where it has blocks to walk, the pass's first
 * KV_NEAR_BLOCKS blocks, which the pass's loop does not ask for, are asked into L1 now. */
static kv_walk kv_walk_start(const attn_job *j, const void *plane, size_t r0, size_t r1,
                             size_t kvh, size_t n_max) {
    const kv_cache *kv = j->ctx->kv;
    size_t old = 0;
    for (size_t r = r0; r < r1; r++)
        if (j->fresh[r] > old) old = j->fresh[r];
    if (old)
        for (size_t b0 = 0; b0 < KV_NEAR_BLOCKS * KV_BLOCK; b0 += KV_BLOCK)
            prefetch_rows(j, plane, r0, r1, b0, kvh);
    return (kv_walk){j, plane, r0, r1, kvh, kv->fp32 ? sizeof(float) : sizeof(uint16_t),
                     old < n_max ? old : n_max, KV_NEAR_BLOCKS * KV_BLOCK, r0, 0, SIZE_MAX};
}

/* Asks into L2 for the walk's next lines, at most `budget` of them and none of a block at
 * `until` or after; with budget 0 it only passes the rows it has nothing to ask of. */
static void kv_walk_ask(kv_walk *w, size_t until, size_t budget) {
    const kv_cache *kv = w->j->ctx->kv;
    if (until > w->end) until = w->end;
    while (w->b0 < until) {
        if (w->r == w->r1) {
            w->b0 += KV_BLOCK, w->r = w->r0, w->last = SIZE_MAX;
            continue;
        }
        const fwd_row *row = &w->j->rows[w->r];
        const size_t n = (size_t)row->pos + 1;
        if (w->b0 >= n || w->b0 >= w->j->fresh[w->r]) {
            w->r++;
            continue;
        }
        const size_t off = kv_offset(kv, w->j->layer, row->blocks, (uint32_t)w->b0, w->kvh);
        if (off == w->last) {
            w->r++;
            continue;
        }
        if (!budget) return;
        const size_t len = n - w->b0 < KV_BLOCK ? n - w->b0 : KV_BLOCK;
        const size_t lines = (len * kv->head_dim * w->elt + 63) / 64;
        const char *p = w->plane + off * w->elt;
        for (; w->line < lines && budget; w->line++, budget--)
            __builtin_prefetch(p + 64 * w->line, 0, 2);  /* prefetcht1 */
        if (w->line == lines) w->last = off, w->r++, w->line = 0;
    }
}

/* Shared blocks read by at least this many query vectors are read in four calls, a quarter
 * of the queries each, with the walk's asks between them, while it has any left. */
#define ATT_SPLIT_QUERIES 16
#define ATT_SPLIT_PARTS 4

/* The query vectors per kernel call for a run of `queries` on the block at b0. */
static size_t kv_walk_split(kv_walk *w, size_t queries, size_t b0) {
    if (queries < ATT_SPLIT_QUERIES || !w->end) return queries;
    const size_t until = b0 + KV_FAR_BLOCKS * KV_BLOCK;
    kv_walk_ask(w, until, 0);  /* past the rows it has nothing to ask of */
    if (w->b0 >= (until < w->end ? until : w->end)) return queries;
    return (queries + ATT_SPLIT_PARTS - 1) / ATT_SPLIT_PARTS;
}

/* The walk's asks beside a kernel call on `queries` query vectors and `len` positions of the
 * block at b0: as many lines as the call's work covers, two blocks' worth at least (so that
 * it gains on a stream of blocks that each take one call). */
static void kv_walk_beside(kv_walk *w, size_t b0, size_t queries, size_t len) {
    if (!w->end) return;
    const size_t work = queries * len / 2,
                 blocks = 2 * KV_BLOCK * w->j->ctx->kv->head_dim * w->elt / 64;
    kv_walk_ask(w, b0 + KV_FAR_BLOCKS * KV_BLOCK, work > blocks ? work : blocks);
}

/* What a pass over one KV head's blocks (kv_pass) hands its step: the query heads q0 ..
 * q0 + nq - 1 of the rows from r on read `len` positions of the block at position b0, at
 * element offset `off` of the plane, from `src` (block_source). */
typedef struct kv_chunk {
    size_t r, q0, nq, b0, len, off;
    int src;
} kv_chunk;

/* What a step of attend_run's passes reads: rows r0 .. in scratch slots slot .., `group`
 * query heads of head_dim hd per row; the queries packed as bf16 in code qcode (< 0: not
 * packed); whether the P.V accumulators hold only their own sums (pv_bf16_grained). */
typedef struct attn_pass {
    const kernels *k;
    const kv_cache *kv;
    const attn_scratch *w;
    size_t r0, slot, group, hd;
    int qcode, grained;
} attn_pass;

typedef void (*kv_step)(attn_pass *p, const kv_chunk *c);

/* One pass over the blocks of KV head kvh up to position n_max, rows r0 .. r1-1: block by
 * block, each run of rows that read the same positions of it (rows_on_block), the block read
 * as it is or widened into `widen` once for all of them (block_source), its query heads in
 * chunks the far walk sizes (kv_walk_split); `step` does the arithmetic of each chunk. The
 * next blocks are asked for (prefetch_rows) and the far ones walked beside each chunk. */
static inline void kv_pass(const attn_job *j, const void *plane, float *widen, size_t r0,
                           size_t r1, size_t kvh, size_t n_max, kv_walk *far, kv_step step,
                           attn_pass *p) {
    size_t widened = SIZE_MAX;
    for (size_t b0 = 0; b0 < n_max; b0 += KV_BLOCK) {
        const size_t blen = n_max - b0 < KV_BLOCK ? n_max - b0 : KV_BLOCK;
        prefetch_rows(j, plane, r0, r1, b0 + KV_NEAR_BLOCKS * KV_BLOCK, kvh);
        size_t len, off;
        for (size_t r = r0, e; r < r1; r = e) {
            e = rows_on_block(j, r, r1, b0, kvh, &len, &off);
            if (!len) continue;
            const size_t queries = (e - r) * p->group;
            const int src = block_source(j, r, r1, b0, kvh, off, blen, plane, widen, &widened);
            const size_t chunk = kv_walk_split(far, queries, b0);
            for (size_t q0 = 0; q0 < queries; q0 += chunk) {
                const size_t nq = queries - q0 < chunk ? queries - q0 : chunk;
                kv_walk_beside(far, b0, nq, len);
                step(p, &(kv_chunk){r, q0, nq, b0, len, off, src});
            }
        }
    }
}

/* The scratch index of the chunk's first query head: row c->r's query heads follow those of
 * the rows before it in the pass (ATT_Q and the others below, at c->q0). */
static inline size_t chunk_query(const attn_pass *p, const kv_chunk *c) {
    return (p->slot + c->r - p->r0) * p->group + c->q0;
}

/* Scores: q.k of each position of the chunk, its query heads in one call (queries hd apart,
 * scores max_ctx apart). */
static void scores_step(attn_pass *p, const kv_chunk *c) {
    const attn_scratch *w = p->w;
    const size_t hd = p->hd, i = chunk_query(p, c), ld = w->max_ctx;
    const float *qp = w->q + i * hd;
    float *sp = w->scores + i * ld + c->b0;
    if (c->src == BLOCK_WIDENED)
        p->k->dots_f32(qp, hd, c->nq, w->keys, hd, c->len, hd, sp, ld);
    else if (p->kv->fp32)
        p->k->dots_f32(qp, hd, c->nq, (const float *)p->kv->k + c->off, hd, c->len, hd, sp, ld);
    else if (p->qcode >= 0)
        p->k->dots_packed_bf16(w->qb + i * hd, p->qcode, qp, hd, c->nq,
                               (const uint16_t *)p->kv->k + c->off, hd, c->len, hd, sp, ld);
    else
        p->k->dots_f32_bf16(qp, hd, c->nq, (const uint16_t *)p->kv->k + c->off, hd, c->len, hd,
                            sp, ld);
}

/* P.V: the chunk's probabilities times its values into the accumulators, one position after
 * another in ascending order. */
static void pv_step(attn_pass *p, const kv_chunk *c) {
    const attn_scratch *w = p->w;
    const size_t hd = p->hd, i = chunk_query(p, c), ld = w->max_ctx;
    float *op = w->acc + i * hd;
    const float *pp = w->scores + i * ld + c->b0;
    const uint16_t *v16 = (const uint16_t *)p->kv->v + c->off;
    if (c->src == BLOCK_WIDENED || p->kv->fp32) {
        p->k->pv_f32(op, hd, pp, ld, c->nq,
                     c->src == BLOCK_WIDENED ? w->vals : (const float *)p->kv->v + c->off, hd,
                     c->len, hd);
        p->grained = 0;
    } else if (p->grained) {
        p->grained = p->k->pv_bf16_grained(op, hd, pp, ld, c->nq, v16, hd, c->len, hd);
    } else {
        p->k->pv_bf16(op, hd, pp, ld, c->nq, v16, hd, c->len, hd);
    }
}

#define ATT_Q(r, g) (w->q + ((slot + (r) - r0) * group + (g)) * hd)
#define ATT_S(r, g) (w->scores + ((slot + (r) - r0) * group + (g)) * w->max_ctx)
#define ATT_ACC(r, g) (w->acc + ((slot + (r) - r0) * group + (g)) * hd)
#define ATT_QB(r, g) (w->qb + ((slot + (r) - r0) * group + (g)) * hd)

/* Rows r0 .. r1-1, KV head kvh, in scratch slots slot ..: each block of the head's keys and
 * values is read once for every row and query head that reads it, while it is in L1, and
 * widened once when several rows share it (the rows of one sequence, or sequences forked from
 * one prompt over their shared prefix); every score, sum and product is the one the mode
 * defines for that row and query head alone, whichever rows run beside it and whether its
 * block was read widened or as it is (dots_f32 and pv_f32 on widened vectors are
 * dots_f32_bf16 and pv_bf16, bit for bit). */
static void attend_run(const attn_job *j, size_t r0, size_t r1, size_t kvh, size_t slot,
                       const attn_scratch *w) {
    const fwd_ctx *ctx = j->ctx;
    const parity_config *c = ctx->config;
    const kernels *k = kern();
    const parity_policy *pol = &ctx->pol;
    const kv_cache *kv = ctx->kv;
    const size_t hd = c->head_dim, heads = c->num_attention_heads;
    const size_t group = heads / c->num_key_value_heads;  /* query heads per KV head */
    const int mode = ctx->pol.compute == PARITY_COMPUTE_FP32 ? PARITY_ATTN_FP32 : ctx->pol.attention;
    const float scale = (float)(1.0 / sqrt((double)hd));  /* head_dim ** -0.5 */
    size_t n_max = 0;
    for (size_t r = r0; r < r1; r++)
        if ((size_t)j->rows[r].pos + 1 > n_max) n_max = (size_t)j->rows[r].pos + 1;

    for (size_t r = r0; r < r1; r++)  /* the row's query heads of this KV head */
        memcpy(ATT_Q(r, 0), j->q + r * heads * hd + kvh * group * hd, group * hd * sizeof *w->q);
    /* the table's bf16 dot products take the queries packed once for every block (qcode < 0:
     * not these queries, or not this table) */
    const int qcode = k->pack_queries_bf16 && !kv->fp32
                          ? k->pack_queries_bf16(ATT_Q(r0, 0), hd, (r1 - r0) * group, hd, ATT_QB(r0, 0))
                          : -1;

    /* scores: q.k of each position, block by block, every row and query head on the block:
     * the query heads of the rows that read the same positions of it in one call */
    attn_pass pass = {k, kv, w, r0, slot, group, hd, qcode, 0};
    kv_walk far = kv_walk_start(j, kv->k, r0, r1, kvh, n_max);
    kv_pass(j, kv->k, w->keys, r0, r1, kvh, n_max, &far, scores_step, &pass);

    /* the values' first blocks come in while the probabilities are computed */
    far = kv_walk_start(j, kv->v, r0, r1, kvh, n_max);

/* probabilities, each row and query head on its own */
    for (size_t r = r0; r < r1; r++)
        for (size_t g = 0; g < group; g++)
            w->l[(slot + r - r0) * group + g] =
                probabilities(k, pol, mode, scale, ATT_S(r, g), (size_t)j->rows[r].pos + 1);

    for (size_t r = r0; r < r1; r++) {
        const char *dst = (const char *)(j->att + r * heads * hd + kvh * group * hd);
        for (size_t b = 0; b < group * hd * sizeof(float); b += 64) __builtin_prefetch(dst + b, 1);
    }

    /* P.V, one position after another in ascending order, block by block; the table's bf16
     * dot products take the accumulators while they hold only what they summed themselves
     * (pv_bf16_grained) */
    memset(w->acc + slot * group * hd, 0, (r1 - r0) * group * hd * sizeof *w->acc);
    pass.grained = k->pv_bf16_grained != NULL;
    kv_pass(j, kv->v, w->vals, r0, r1, kvh, n_max, &far, pv_step, &pass);

    /* the outputs, each row's query heads side by side: finished in the scratch, then copied
     * to lines asked for at the P.V pass's start (written cold, each waited on its line) */
    for (size_t r = r0; r < r1; r++) {
        float *dst = j->att + r * heads * hd + kvh * group * hd;
        for (size_t g = 0; g < group; g++) {
            float *o = ATT_ACC(r, g);
            const float l = w->l[(slot + r - r0) * group + g];
            if (mode == PARITY_ATTN_FLASH) {
                for (size_t d = 0; d < hd; d++) o[d] /= l;
                round_with(k, pol, o, hd);  /* O / l rounded once */
            } else if (mode == PARITY_ATTN_EAGER) {
                round_with(k, pol, o, hd);  /* bf16 matmul output */
            }
        }
        memcpy(dst, ATT_ACC(r, 0), group * hd * sizeof *dst);
    }
#undef ATT_Q
#undef ATT_S
#undef ATT_ACC
#undef ATT_QB
}

/* One task = ATTN_TASK_ROWS consecutive rows (fewer at the end) and one KV head with its
 * `group` query heads; the rows are taken in runs of one sequence each. Tasks run KV head by
 * KV head, so that concurrent tasks share that head's cache lines too. */
static void attend(void *ctx_, size_t begin, size_t end, unsigned worker) {
    const attn_job *j = ctx_;
    const fwd_ctx *ctx = j->ctx;
    const parity_config *c = ctx->config;
    const size_t hd = c->head_dim, group = c->num_attention_heads / c->num_key_value_heads;
    const size_t n_groups = (j->n_rows + ATTN_TASK_ROWS - 1) / ATTN_TASK_ROWS;
    const size_t slots = ATTN_TASK_ROWS * group;
    attn_scratch w;
    w.max_ctx = ctx->s->max_ctx;
    w.scores = ctx->s->scores + (size_t)worker * slots * w.max_ctx;
    w.acc = ctx->s->pv + (size_t)worker * attn_pv_floats(group, hd);
    w.l = w.acc + slots * hd;
    w.keys = w.l + slots;
    w.vals = w.keys + KV_BLOCK * hd;
    w.q = w.vals + KV_BLOCK * hd;
    w.qb = (uint16_t *)(((uintptr_t)(w.q + slots * hd) + 63) & ~(uintptr_t)63);

    for (size_t t = begin; t < end; t++) {
        const size_t kvh = t / n_groups, first = t % n_groups * ATTN_TASK_ROWS;
        const size_t last = j->n_rows - first < ATTN_TASK_ROWS ? j->n_rows : first + ATTN_TASK_ROWS;
        if (ctx->pol.compute != PARITY_COMPUTE_FP32 && ctx->pol.attention == PARITY_ATTN_FLASH &&
            ctx->split_kv) {
            for (size_t r = first; r < last; r++)
                for (size_t g = 0; g < group; g++) {
                    const size_t h = kvh * group + g;
                    attend_split(ctx, j->layer, &j->rows[r], j->q + (r * c->num_attention_heads + h) * hd,
                                 kvh, w.scores, w.acc, j->att + (r * c->num_attention_heads + h) * hd);
                }
            continue;
        }
        attend_run(j, first, last, kvh, 0, &w);
    }
}

void attention(const fwd_ctx *ctx, uint32_t layer, size_t n_rows, const fwd_row *rows,
               const float *q, float *att) {
    /* a sequence's rows in a forward come one after the other, its first row at the first
     * position the forward writes for it */
    uint32_t *fresh = ctx->s->attn_fresh;
    for (size_t r = 0; r < n_rows; r++)
        fresh[r] = r && rows[r].blocks == rows[r - 1].blocks ? fresh[r - 1] : rows[r].pos;
    attn_job j = {ctx, layer, n_rows, rows, q, att, fresh};
    const size_t n_groups = (n_rows + ATTN_TASK_ROWS - 1) / ATTN_TASK_ROWS;
    /* tasks differ in length (rows at different positions): handed out one at a time */
    pool_run_dynamic(ctx->pool, attend, &j, n_groups * ctx->config->num_key_value_heads, 1);
}
