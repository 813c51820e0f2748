/* Causal attention of each row over its sequence's cached positions, one (row, KV head) pair
 * per task. The order of every sum is fixed and the same for a prefill row and a decode row:
 * q.k in dot16 order over head_dim, the softmax denominator in dot16 order over positions,
 * P.V one position at a time in ascending order. Masked positions are not visited: their
 * probability is exactly 0 in every recipe (exp of the most negative bf16 minus the row max
 * underflows to +0), and adding +0 changes no accumulator. */
#include <math.h>

#include "forward.h"
#include "internal.h"
#include "kernels.h"

typedef struct attn_job {
    const fwd_ctx *ctx;
    uint32_t layer;
    size_t n_rows;
    const fwd_row *rows;
    const float *q;
    float *att;
} attn_job;

/* Kernel-order experiment (parity_sampler_params.split_kv): flash attention over segments of
 * split_kv positions, each with its own max m_s, sum l_s and output O_s = sum bf16(P) V, merged
 * in segment order into a running (m, l, O) as split-KV decode kernels combine them. */
static void attend_split(const fwd_ctx *ctx, uint32_t layer, const fwd_row *row, const float *q,
                         size_t kvh, float *s, float *o, float *out) {
    const kernels *k = kern();
    const kv_cache *kv = ctx->kv;
    const size_t hd = ctx->model->config.head_dim, n = (size_t)row->pos + 1, seg = ctx->split_kv;
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
        k->round_bf16(s, len);
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
    k->round_bf16(out, hd);
}

/* s[p] = q.k_p in dot16 order for the len <= KV_BLOCK consecutive vectors of one head's block
 * at K + off (bf16 keys four at a time, each in its own order). */
static void block_scores(const kernels *k, const kv_cache *kv, const float *q, size_t off,
                         size_t len, float *s) {
    const size_t hd = kv->head_dim;
    size_t p = 0;
    if (kv->fp32) {
        for (; p < len; p++) s[p] = k->dot_f32(q, (const float *)kv->k + off + p * hd, hd);
        return;
    }
    const uint16_t *key = (const uint16_t *)kv->k + off;
    for (; p + 4 <= len; p += 4) {
        const uint16_t *keys[4] = {key + p * hd, key + (p + 1) * hd, key + (p + 2) * hd,
                                   key + (p + 3) * hd};
        k->dot4_f32_bf16(q, keys, hd, s + p);
    }
    for (; p < len; p++) s[p] = k->dot_f32_bf16(q, key + p * hd, hd);
}

/* o += P[p] v_p for the len <= KV_BLOCK consecutive vectors of one head's block at V + off,
 * one position after another (bf16 values four at a time, in the same order). */
static void block_pv(const kernels *k, const kv_cache *kv, const float *P, size_t off,
                     size_t len, float *o) {
    const size_t hd = kv->head_dim;
    size_t p = 0;
    if (kv->fp32) {
        for (; p < len; p++) k->axpy_f32(o, P[p], (const float *)kv->v + off + p * hd, hd);
        return;
    }
    const uint16_t *val = (const uint16_t *)kv->v + off;
    for (; p + 4 <= len; p += 4) {
        const uint16_t *vals[4] = {val + p * hd, val + (p + 1) * hd, val + (p + 2) * hd,
                                   val + (p + 3) * hd};
        k->axpy4_bf16(o, P + p, vals, hd);
    }
    for (; p < len; p++) k->axpy_bf16(o, P[p], val + p * hd, hd);
}

/* One task = one row and one KV head with its `group` query heads: each block of the head's
 * keys and values is read from memory once and used by every query head of the group while
 * it is in L1. Tasks run KV head by KV head, so that a worker's rows of one sequence share
 * that head's cache lines too; every score, sum and product is the one the mode defines for
 * that query head alone. */
static void attend(void *ctx_, size_t begin, size_t end, unsigned worker) {
    const attn_job *j = ctx_;
    const fwd_ctx *ctx = j->ctx;
    const parity_config *c = &ctx->model->config;
    const kernels *k = kern();
    const kv_cache *kv = ctx->kv;
    const size_t hd = c->head_dim, heads = c->num_attention_heads;
    const size_t group = heads / c->num_key_value_heads;  /* query heads per KV head */
    const int mode = ctx->pol.compute == PARITY_COMPUTE_FP32 ? PARITY_ATTN_FP32 : ctx->pol.attention;
    const float scale = (float)(1.0 / sqrt((double)hd));  /* head_dim ** -0.5 */
    const size_t max_ctx = ctx->s->max_ctx;
    float *scores = ctx->s->scores + (size_t)worker * group * max_ctx;
    float *acc = ctx->s->pv + (size_t)worker * ((group + 1) * hd + group);
    float *l = acc + (group + 1) * hd;  /* each query head's softmax denominator */

    for (size_t t = begin; t < end; t++) {
        const size_t kvh = t / j->n_rows, r = t % j->n_rows;
        const fwd_row *row = &j->rows[r];
        const float *q = j->q + r * heads * hd + kvh * group * hd;   /* the group's queries */
        float *out = j->att + r * heads * hd + kvh * group * hd;
        const size_t n = (size_t)row->pos + 1;

        if (mode == PARITY_ATTN_FLASH && ctx->split_kv) {
            for (size_t g = 0; g < group; g++)
                attend_split(ctx, j->layer, row, q + g * hd, kvh, scores, acc, out + g * hd);
            continue;
        }

        /* scores: q.k of each position, block by block, every query head on the block */
        for (size_t b0 = 0; b0 < n; b0 += KV_BLOCK) {
            const size_t off = kv_offset(kv, j->layer, row->blocks, (uint32_t)b0, kvh);
            const size_t len = n - b0 < KV_BLOCK ? n - b0 : KV_BLOCK;
            for (size_t g = 0; g < group; g++)
                block_scores(k, kv, q + g * hd, off, len, scores + g * max_ctx + b0);
        }

        /* probabilities, each query head on its own */
        for (size_t g = 0; g < group; g++) {
            float *s = scores + g * max_ctx;
            /* eager: matmul output rounded, then `* scaling` rounded (+ mask 0 is exact) */
            if (mode == PARITY_ATTN_EAGER) k->round_bf16(s, n);
            for (size_t p = 0; p < n; p++) s[p] *= scale;
            if (mode == PARITY_ATTN_EAGER) k->round_bf16(s, n);
            const float m = k->max_f32(s, n);
            l[g] = k->sum_exp(s, n, m, s);  /* s[p] <- exp(s[p] - m) */
            if (mode == PARITY_ATTN_FLASH) {
                /* P stays unnormalised; bf16(P) feeds P.V, l sums the unrounded P */
                k->round_bf16(s, n);
            } else {
                const float inv = 1.0f / l[g];
                for (size_t p = 0; p < n; p++) s[p] *= inv;
                if (mode == PARITY_ATTN_EAGER) k->round_bf16(s, n);  /* softmax(fp32).to(bf16) */
            }
        }

        /* P.V, one position after another in ascending order, block by block */
        memset(acc, 0, group * hd * sizeof *acc);
        for (size_t b0 = 0; b0 < n; b0 += KV_BLOCK) {
            const size_t off = kv_offset(kv, j->layer, row->blocks, (uint32_t)b0, kvh);
            const size_t len = n - b0 < KV_BLOCK ? n - b0 : KV_BLOCK;
            for (size_t g = 0; g < group; g++)
                block_pv(k, kv, scores + g * max_ctx + b0, off, len, acc + g * hd);
        }
        for (size_t g = 0; g < group; g++) {
            float *o = acc + g * hd, *dst = out + g * hd;
            if (mode == PARITY_ATTN_FLASH) {
                for (size_t d = 0; d < hd; d++) dst[d] = o[d] / l[g];
                k->round_bf16(dst, hd);  /* O / l rounded once */
            } else {
                memcpy(dst, o, hd * sizeof *o);
                if (mode == PARITY_ATTN_EAGER) k->round_bf16(dst, hd);  /* bf16 matmul output */
            }
        }
    }
}

void attention(const fwd_ctx *ctx, uint32_t layer, size_t n_rows, const fwd_row *rows,
               const float *q, float *att) {
    attn_job j = {ctx, layer, n_rows, rows, q, att};
    /* tasks differ in length (rows at different positions): handed out one at a time */
    pool_run_dynamic(ctx->pool, attend, &j, n_rows * ctx->model->config.num_key_value_heads, 1);
}
