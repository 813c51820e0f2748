/* Causal attention of each row over its sequence's cached positions, one (row, head) pair per
 * task. The order of every sum is fixed and the same for a prefill row and a decode row:
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
    const fwd_row *rows;
    const float *q;
    float *att;
} attn_job;

/* Kernel-order experiment (parity_sampler_params.split_kv): flash attention over segments of
 * split_kv positions, each with its own max m_s, sum l_s and output O_s = sum bf16(P) V, merged
 * in segment order into a running (m, l, O) as split-KV decode kernels combine them. */
static void attend_split(const fwd_ctx *ctx, const fwd_row *row, const float *q, size_t head_off,
                         float *s, float *o, float *out) {
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
            size_t cell = kv_cell(row->blocks, (uint32_t)(p0 + p)) * kv->width + head_off;
            s[p] = (kv->fp32 ? k->dot_f32(q, (const float *)kv->k + cell, hd)
                             : k->dot_f32_bf16(q, (const uint16_t *)kv->k + cell, hd)) * scale;
        }
        const float ms = k->max_f32(s, len);
        const float ls = k->sum_exp(s, len, ms, s);
        k->round_bf16(s, len);
        memset(os, 0, hd * sizeof *os);
        for (size_t p = 0; p < len; p++) {
            size_t cell = kv_cell(row->blocks, (uint32_t)(p0 + p)) * kv->width + head_off;
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

/* The element offset of position p of a row's sequence in a layer's K or V, for one head. */
static inline size_t cell_at(const kv_cache *kv, const fwd_row *row, size_t p, size_t head_off) {
    return kv_cell(row->blocks, (uint32_t)p) * kv->width + head_off;
}

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
    float *s = ctx->s->scores + (size_t)worker * ctx->s->max_ctx;
    float *o = ctx->s->pv + (size_t)worker * 2 * hd;
    const size_t layer_off = (size_t)j->layer * kv->n_cells * kv->width;

    for (size_t t = begin; t < end; t++) {
        const size_t r = t / heads, h = t % heads, kvh = h / group;
        const fwd_row *row = &j->rows[r];
        const float *q = j->q + r * heads * hd + h * hd;
        const size_t n = (size_t)row->pos + 1;
        const size_t head_off = layer_off + kvh * hd;

        if (mode == PARITY_ATTN_FLASH && ctx->split_kv) {
            attend_split(ctx, row, q, head_off, s, o, j->att + r * heads * hd + h * hd);
            continue;
        }

        /* scores: q.k of each position (bf16 keys four at a time, each in its own order) */
        size_t p = 0;
        if (!kv->fp32)
            for (; p + 4 <= n; p += 4) {
                const uint16_t *keys[4];
                for (int u = 0; u < 4; u++)
                    keys[u] = (const uint16_t *)kv->k + cell_at(kv, row, p + u, head_off);
                k->dot4_f32_bf16(q, keys, hd, s + p);
            }
        for (; p < n; p++) {
            size_t cell = cell_at(kv, row, p, head_off);
            s[p] = kv->fp32 ? k->dot_f32(q, (const float *)kv->k + cell, hd)
                            : k->dot_f32_bf16(q, (const uint16_t *)kv->k + cell, hd);
        }
        for (p = 0; p < n; p++)
            /* eager: matmul output rounded, then `* scaling` rounded (+ mask 0 is exact) */
            s[p] = mode == PARITY_ATTN_EAGER ? round_bf16(round_bf16(s[p]) * scale) : s[p] * scale;
        const float m = k->max_f32(s, n);
        const float l = k->sum_exp(s, n, m, s);  /* s[p] <- exp(s[p] - m) */

        /* probabilities */
        if (mode == PARITY_ATTN_FLASH) {
            /* P stays unnormalised; bf16(P) feeds P.V, l sums the unrounded P */
            k->round_bf16(s, n);
        } else {
            const float inv = 1.0f / l;
            for (size_t p = 0; p < n; p++) s[p] *= inv;
            if (mode == PARITY_ATTN_EAGER) k->round_bf16(s, n);  /* softmax(fp32).to(bf16) */
        }

        /* P.V, one position after another (bf16 values four at a time, in the same order) */
        memset(o, 0, hd * sizeof *o);
        p = 0;
        if (!kv->fp32)
            for (; p + 4 <= n; p += 4) {
                const uint16_t *vals[4];
                for (int u = 0; u < 4; u++)
                    vals[u] = (const uint16_t *)kv->v + cell_at(kv, row, p + u, head_off);
                k->axpy4_bf16(o, s + p, vals, hd);
            }
        for (; p < n; p++) {
            size_t cell = cell_at(kv, row, p, head_off);
            if (kv->fp32)
                k->axpy_f32(o, s[p], (const float *)kv->v + cell, hd);
            else
                k->axpy_bf16(o, s[p], (const uint16_t *)kv->v + cell, hd);
        }
        float *out = j->att + r * heads * hd + h * hd;
        if (mode == PARITY_ATTN_FLASH) {
            for (size_t d = 0; d < hd; d++) out[d] = o[d] / l;
            k->round_bf16(out, hd);  /* O / l rounded once */
        } else {
            memcpy(out, o, hd * sizeof *o);
            if (mode == PARITY_ATTN_EAGER) k->round_bf16(out, hd);  /* bf16 matmul output */
        }
    }
}

void attention(const fwd_ctx *ctx, uint32_t layer, size_t n_rows, const fwd_row *rows,
               const float *q, float *att) {
    attn_job j = {ctx, layer, rows, q, att};
    pool_run(ctx->pool, attend, &j, n_rows * ctx->model->config.num_attention_heads);
}
