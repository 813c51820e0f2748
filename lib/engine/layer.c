/*
 * The per-layer jobs of the forward: the row-parallel region calls, a layer's attention and
 * MLP blocks, the embedding and the head, each with its rounding points. The dense forward
 * (forward.c) and the looped one (looped.c) call these in their order; the kernel entry
 * points (ops.c) call the embedding and the head. GEMM outputs are rounded by
 * linear_round_point / linear_group_round_point (round_to_policy, done by the GEMM's tasks);
 * everything else inside a region kernel, by the policy switch named at the call.
 */
#include "layer.h"

#include <string.h>

#include "attention.h"
#include "base/floats.h"
#include "base/threadpool.h"
#include "kernels/kernels.h"
#include "kvcache.h"
#include "profile.h"

/* ---- row-parallel region calls ---------------------------------------------------------- */

typedef struct region_job {
    const fwd_ctx *ctx;
    const float *w;       /* a norm's weight values (q-norm's in job_qk_norm_rope) */
    const float *w_k;     /* job_qk_norm_rope: k-norm's weight values */
    float eps;            /* a norm's epsilon */
    float *a, *b, *out;   /* meaning depends on the region */
    size_t width;         /* row width of a/b/out */
    const fwd_row *rows;
} region_job;

/* residual add + RMSNorm: a = delta [rows][hidden], b = h (updated), out = xn */
static void job_rmsnorm_residual(void *p, size_t begin, size_t end, unsigned worker) {
    (void)worker;
    const region_job *j = p;
    for (size_t r = begin; r < end; r++)
        kern()->rmsnorm_residual(&j->ctx->pol, j->width, j->a + r * j->width, j->b + r * j->width,
                                 j->w, j->eps, j->out + r * j->width);
}

/* RMSNorm without residual: a = x [rows][width], out */
static void job_rmsnorm(void *p, size_t begin, size_t end, unsigned worker) {
    (void)worker;
    const region_job *j = p;
    for (size_t r = begin; r < end; r++)
        kern()->rmsnorm(&j->ctx->pol, 0, j->width, j->a + r * j->width, j->w, j->eps,
                        j->out + r * j->width);
}

/* SwiGLU: a = gate, b = up, out (may alias a) */
static void job_swiglu(void *p, size_t begin, size_t end, unsigned worker) {
    (void)worker;
    const region_job *j = p;
    for (size_t r = begin; r < end; r++)
        kern()->swiglu(&j->ctx->pol, j->width, j->a + r * j->width, j->b + r * j->width,
                       j->out + r * j->width);
}

/* Row r's q (a, heads) and k (b, kv heads): Qwen3's q/k-norm over each head where the
 * job has its weights (region: RMSNorm, policy->qk_norm), then RoPE at the row's position
 * (region: RoPE). The row's q and k stay in L1 from the one region to the other: one pass
 * over the rows instead of three (q-norm, k-norm, RoPE over every row), the same kernel
 * calls on each row. */
static void job_qk_norm_rope(void *p, size_t begin, size_t end, unsigned worker) {
    (void)worker;
    const region_job *j = p;
    const parity_config *c = &j->ctx->model->config;
    const parity_policy *pol = &j->ctx->pol;
    const rope_tables *t = &j->ctx->model->rope;
    /* the rounded table: bf16, or fp16 under PARITY_COMPUTE_FP16 */
    const int rounded_table = pol->compute != PARITY_COMPUTE_FP32 &&
                              pol->rope_table == PARITY_ROPE_TABLE_BF16;
    const int fp16 = pol->compute == PARITY_COMPUTE_FP16;
    const size_t hd = c->head_dim, half = hd / 2;
    const size_t q_heads = c->num_attention_heads, k_heads = c->num_key_value_heads;
    for (size_t r = begin; r < end; r++) {
        float *q = j->a + r * q_heads * hd, *k = j->b + r * k_heads * hd;
        if (j->w) {
            for (size_t h = 0; h < q_heads; h++)
                kern()->rmsnorm(pol, 1, hd, q + h * hd, j->w, j->eps, q + h * hd);
            for (size_t h = 0; h < k_heads; h++)
                kern()->rmsnorm(pol, 1, hd, k + h * hd, j->w_k, j->eps, k + h * hd);
        }
        const size_t pos = j->rows[r].pos;
        const float *cos = (!rounded_table ? t->cos_f32 : fp16 ? t->cos_fp16 : t->cos_bf16) + pos * half;
        const float *sin = (!rounded_table ? t->sin_f32 : fp16 ? t->sin_fp16 : t->sin_bf16) + pos * half;
        kern()->rope(pol, q_heads, hd, q, cos, sin);
        kern()->rope(pol, k_heads, hd, k, cos, sin);
    }
}

static void run_rows(const fwd_ctx *ctx, pool_fn fn, region_job j, size_t n_rows) {
    j.ctx = ctx;
    pool_run(ctx->pool, fn, &j, n_rows);
}

void rows_rmsnorm(const fwd_ctx *ctx, size_t R, const weight *norm, float *x, float *out) {
    const parity_config *c = &ctx->model->config;
    run_rows(ctx, job_rmsnorm, (region_job){.w = weight_values(&ctx->pol, norm),
                                            .eps = c->rms_norm_eps, .a = x, .out = out,
                                            .width = c->hidden_size}, R);
}

void rows_rmsnorm_residual(const fwd_ctx *ctx, size_t R, const weight *norm, float *delta,
                           float *h, float *out) {
    const parity_config *c = &ctx->model->config;
    run_rows(ctx, job_rmsnorm_residual, (region_job){.w = weight_values(&ctx->pol, norm),
                                                     .eps = c->rms_norm_eps, .a = delta, .b = h,
                                                     .out = out, .width = c->hidden_size}, R);
}

/* ---- a layer's blocks --------------------------------------------------------------------- */

void layer_input_norm(const fwd_ctx *ctx, const layer_weights *w, uint32_t layer, size_t R,
                      double *t) {
    fwd_scratch *s = ctx->s;
    if (layer == 0)
        rows_rmsnorm(ctx, R, &w->attn_norm, s->h, s->xn);
    else
        rows_rmsnorm_residual(ctx, R, &w->attn_norm, s->delta, s->h, s->xn);
    phase_lap(ctx, PARITY_PHASE_REGIONS, t);
}

void layer_attention(const fwd_ctx *ctx, const layer_weights *w, uint32_t plane, size_t R,
                     const fwd_row *rows, int bias, int qk_norm, double *t) {
    const parity_config *c = &ctx->model->config;
    fwd_scratch *s = ctx->s;
    const size_t kv_dim = (size_t)c->num_key_value_heads * c->head_dim;

    /* q, k, v projections: each GEMM output rounded once */
    const weight *qkv[] = {&w->wq, &w->wk, &w->wv};
    const weight *qkv_bias[] = {&w->bq, &w->bk, &w->bv}, *no_bias[] = {NULL, NULL, NULL};
    float *const qkv_out[] = {s->q, s->k, s->v};
    linear_group_round_point(ctx, R, s->xn, 3, qkv, bias ? qkv_bias : no_bias, qkv_out);
    phase_lap(ctx, PARITY_PHASE_GEMM, t);

    /* Qwen3 q/k-norm over each head (region: RMSNorm, policy->qk_norm), then RoPE on q and k
     * (region: RoPE), row by row */
    run_rows(ctx, job_qk_norm_rope,
             (region_job){.w = qk_norm ? weight_values(&ctx->pol, &w->q_norm) : NULL,
                          .w_k = qk_norm ? weight_values(&ctx->pol, &w->k_norm) : NULL,
                          .eps = c->rms_norm_eps, .a = s->q, .b = s->k, .rows = rows}, R);
    phase_lap(ctx, PARITY_PHASE_REGIONS, t);

    /* this batch's keys and values join the cache; attention reads them from there */
    kv_store(ctx, plane, R, rows, s->k, kv_dim, s->v, kv_dim);
    attention(ctx, plane, R, rows, s->q, s->att);
    phase_lap(ctx, PARITY_PHASE_ATTENTION, t);

    /* output projection */
    linear_round_point(ctx, R, s->att, &w->wo, NULL, s->delta);
    phase_lap(ctx, PARITY_PHASE_GEMM, t);
}

/* silu(x . w_gate^T) * (x . w_up^T), the two projections rounded (region: SwiGLU), into
 * s->gate [M][w_gate->rows]: in the GEMM's tasks where linear_swiglu_fused can (its time then
 * the GEMM phase's), else the two GEMMs and a pass over the rows. */
void mlp_swiglu(const fwd_ctx *ctx, size_t M, const float *x, const weight *w_gate,
                const weight *w_up, double *t) {
    fwd_scratch *s = ctx->s;
    if (linear_swiglu_fused(ctx, M, x, w_gate, w_up, s->gate, s->up, s->gate)) return;
    const weight *gate_up[] = {w_gate, w_up}, *no_bias[] = {NULL, NULL};
    float *const gate_up_out[] = {s->gate, s->up};
    linear_group_round_point(ctx, M, x, 2, gate_up, no_bias, gate_up_out);
    phase_lap(ctx, PARITY_PHASE_GEMM, t);
    rows_swiglu(ctx, M, s->gate, s->up, w_gate->rows);
    phase_lap(ctx, PARITY_PHASE_REGIONS, t);
}

void rows_swiglu(const fwd_ctx *ctx, size_t M, float *gate, float *up, size_t width) {
    run_rows(ctx, job_swiglu, (region_job){.a = gate, .b = up, .out = gate, .width = width}, M);
}

/* The MLP's gate and up projections with silu(gate) * up (mlp_swiglu), then the down
 * projection. */
void layer_mlp(const fwd_ctx *ctx, const layer_weights *w, size_t R, double *t) {
    fwd_scratch *s = ctx->s;
    mlp_swiglu(ctx, R, s->xn, &w->w_gate, &w->w_up, t);
    linear_round_point(ctx, R, s->gate, &w->w_down, NULL, s->delta);
    phase_lap(ctx, PARITY_PHASE_GEMM, t);
}

/* ---- the embedding and the head ------------------------------------------------------------ */

void embed_rows(size_t n, const int32_t *tokens, size_t dim, const uint16_t *table_bf16,
                const float *table_f32, size_t table_stride, float *out, size_t out_stride) {
    for (size_t r = 0; r < n; r++) {
        const size_t tok = (size_t)tokens[r];
        float *h = out + r * out_stride;
        if (table_f32) {
            memcpy(h, table_f32 + tok * table_stride, dim * sizeof *h);
        } else {
            const uint16_t *e = table_bf16 + tok * table_stride;
            for (size_t i = 0; i < dim; i++) h[i] = bf16_to_f32(e[i]);
        }
    }
}

void embed_tokens(const fwd_ctx *ctx, size_t R, const fwd_row *rows, float *h) {
    const parity_model *m = ctx->model;
    const size_t dim = m->config.hidden_size;
    const float *embed_f32 =
        ctx->pol.compute == PARITY_COMPUTE_BF16 ? NULL : weight_values(&ctx->pol, &m->embed);
    for (size_t r = 0; r < R; r++)
        embed_rows(1, &rows[r].token, dim, m->embed.bf16, embed_f32, dim, h + r * dim, dim);
}

gemm_weights head_weights(const fwd_ctx *ctx) {
    const weight *w = &ctx->model->lm_head;
    return (gemm_weights){w->rows, w->cols, w->cols, w->bf16, linear_f32_weights(ctx, w)};
}

void head_logits(const fwd_ctx *ctx, size_t n, const float *xn, const gemm_weights *lm_head,
                 float *logits) {
    /* classifier into logits: rounded (to bf16, or fp16) unless the policy keeps an fp32 head */
    if (ctx->pol.logits == PARITY_LOGITS_BF16)
        linear_weights_round_point(ctx, n, xn, lm_head->cols, lm_head, NULL, logits,
                                   lm_head->rows);
    else
        linear_weights(ctx, n, xn, lm_head->cols, lm_head, NULL, logits, lm_head->rows);
}

void forward_head(const fwd_ctx *ctx, size_t n, float *delta, float *h, const float *norm,
                  float eps, float *xn, const gemm_weights *lm_head, float *logits) {
    /* last residual connection + final rmsnorm (region: residual + RMSNorm) */
    run_rows(ctx, job_rmsnorm_residual, (region_job){.w = norm, .eps = eps, .a = delta, .b = h,
                                                     .out = xn, .width = lm_head->cols}, n);
    head_logits(ctx, n, xn, lm_head, logits);
}
