/*
 * The forward pass: one function for the scorer and the sampler. They differ only in which
 * rows they send (a whole sequence, a prefill chunk, one decode token per sequence) and
 * which rows they want logits for; K/V always go through the cache.
 *
 * Every buffer is fp32. Under a bf16 policy the values in it are bf16 values (fp16 values
 * under PARITY_COMPUTE_FP16), made so at each rounding point below: a GEMM's output by
 * linear_round_point / linear_weights_round_point (round_to_policy of the output, done by
 * the GEMM's tasks as they finish their columns; under PARITY_COMPUTE_FP32 nothing rounds),
 * everything else inside a region kernel, by the policy switch named at the call. Grepping
 * this file for round_point lists the rounding points outside the regions;
 * lib/kernels/kernels_ref.c shows the ones inside.
 */
#include "forward.h"

#include <time.h>

#include "base/internal.h"
#include "kernels/kernels.h"
#include "model/config.h"

/* The fp32 values of a small weight (norms): the master under PARITY_COMPUTE_FP32, the fp16
 * values under PARITY_COMPUTE_FP16, else the bf16 values widened. */
static const float *vec(const fwd_ctx *ctx, const weight *w) { return weight_values(&ctx->pol, w); }

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

/* The MLP's gate and up projections, each rounded, and silu(gate) * up (region: SwiGLU)
 * into s->gate: in the GEMM's tasks where linear_swiglu_fused can (its time then the GEMM
 * phase's), else the two GEMMs and a pass over the rows. */
static void swiglu_mlp_in(const fwd_ctx *ctx, size_t R, const layer_weights *w, double *t) {
    fwd_scratch *s = ctx->s;
    if (!linear_swiglu_fused(ctx, R, s->xn, &w->w_gate, &w->w_up, s->gate, s->up, s->gate)) {
        const weight *gate_up[] = {&w->w_gate, &w->w_up}, *no_bias[] = {NULL, NULL};
        float *const gate_up_out[] = {s->gate, s->up};
        linear_group_round_point(ctx, R, s->xn, 2, gate_up, no_bias, gate_up_out);
        phase_lap(ctx, PARITY_PHASE_GEMM, t);
        run_rows(ctx, job_swiglu, (region_job){.a = s->gate, .b = s->up, .out = s->gate,
                                               .width = ctx->config->intermediate_size}, R);
        phase_lap(ctx, PARITY_PHASE_REGIONS, t);
        return;
    }
    phase_lap(ctx, PARITY_PHASE_GEMM, t);
}

/* ---- the KV cache ----------------------------------------------------------------------- */

typedef struct kv_store_job {
    const fwd_ctx *ctx;
    uint32_t layer;
    const fwd_row *rows;
    const float *k, *v;
    size_t k_stride, v_stride;
} kv_store_job;

static void kv_store_rows(void *p, size_t begin, size_t end, unsigned worker) {
    (void)worker;
    const kv_store_job *j = p;
    const kv_cache *kv = j->ctx->kv;
    const size_t w = kv->width, hd = kv->head_dim;
    for (size_t r = begin; r < end; r++)
        for (size_t h = 0; h < w / hd; h++) {
            const size_t off = kv_offset(kv, j->layer, j->rows[r].blocks, j->rows[r].pos, h);
            const float *kh = j->k + r * j->k_stride + h * hd, *vh = j->v + r * j->v_stride + h * hd;
            if (kv->fp32) {
                memcpy((float *)kv->k + off, kh, hd * sizeof(float));
                memcpy((float *)kv->v + off, vh, hd * sizeof(float));
            } else {
                /* exact for the forward: its K and V already hold bf16 values */
                uint16_t *kd = (uint16_t *)kv->k + off, *vd = (uint16_t *)kv->v + off;
                for (size_t i = 0; i < hd; i++) kd[i] = bf16_from_f32(kh[i]);
                for (size_t i = 0; i < hd; i++) vd[i] = bf16_from_f32(vh[i]);
            }
        }
}

/* Each row writes its own position's cells: the rows go over the pool (a decode step's one
 * row is stored by the caller: a pool round trip costs more). */
void kv_store(const fwd_ctx *ctx, uint32_t layer, size_t n_rows, const fwd_row *rows,
              const float *k, size_t k_stride, const float *v, size_t v_stride) {
    kv_store_job j = {ctx, layer, rows, k, v, k_stride, v_stride};
    if (n_rows <= 1)
        kv_store_rows(&j, 0, n_rows, 0);
    else
        pool_run(ctx->pool, kv_store_rows, &j, n_rows);
}

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

/* ---- the head ----------------------------------------------------------------------------- */

void forward_head(const fwd_ctx *ctx, size_t n, float *delta, float *h, const float *norm,
                  float eps, float *xn, const gemm_weights *lm_head, float *logits) {
    const size_t dim = lm_head->cols;
    /* last residual connection + final rmsnorm (region: residual + RMSNorm) */
    run_rows(ctx, job_rmsnorm_residual, (region_job){.w = norm, .eps = eps, .a = delta, .b = h,
                                                     .out = xn, .width = dim}, n);
    /* classifier into logits: rounded (to bf16, or fp16) unless the policy keeps an fp32 head */
    if (ctx->pol.logits == PARITY_LOGITS_BF16)
        linear_weights_round_point(ctx, n, xn, dim, lm_head, NULL, logits, lm_head->rows);
    else
        linear_weights(ctx, n, xn, dim, lm_head, NULL, logits, lm_head->rows);
}

/* ---- the forward -------------------------------------------------------------------------- */

static void forward_looped(const fwd_ctx *ctx, size_t n_rows, fwd_row *rows, size_t n_out,
                           const uint32_t *out_rows, float *logits);

void forward(const fwd_ctx *ctx, size_t n_rows, fwd_row *rows, size_t n_out,
             const uint32_t *out_rows, float *logits) {
    if (ctx->model->config.arch == PARITY_ARCH_OURO) {
        forward_looped(ctx, n_rows, rows, n_out, out_rows, logits);
        return;
    }
    const parity_model *m = ctx->model;
    const parity_config *c = &m->config;
    fwd_scratch *s = ctx->s;
    const size_t R = n_rows, dim = c->hidden_size, hd = c->head_dim;
    const size_t kv_dim = (size_t)c->num_key_value_heads * hd;
    const float eps = c->rms_norm_eps;
    const float *embed_f32 = ctx->pol.compute == PARITY_COMPUTE_BF16 ? NULL : vec(ctx, &m->embed);

    double t = phase_start(ctx);
    if (ctx->prof) ctx->prof->forwards++, ctx->prof->rows += R;

    /* token embedding: the residual stream starts as the embedding rows (exact) */
    for (size_t r = 0; r < R; r++)
        embed_rows(1, &rows[r].token, dim, m->embed.bf16, embed_f32, dim, s->h + r * dim, dim);
    phase_lap(ctx, PARITY_PHASE_EMBED, &t);

    for (uint32_t l = 0; l < c->num_hidden_layers; l++) {
        const layer_weights *w = &m->layers[l];

        /* attention rmsnorm: layer 0 reads the embedding; later layers first add the
         * previous MLP's output to the residual stream (region: residual + RMSNorm) */
        if (l == 0)
            run_rows(ctx, job_rmsnorm, (region_job){.w = vec(ctx, &w->attn_norm), .eps = eps,
                                                    .a = s->h, .out = s->xn, .width = dim}, R);
        else
            run_rows(ctx, job_rmsnorm_residual,
                     (region_job){.w = vec(ctx, &w->attn_norm), .eps = eps, .a = s->delta,
                                  .b = s->h, .out = s->xn, .width = dim}, R);
        phase_lap(ctx, PARITY_PHASE_REGIONS, &t);

        /* q, k, v projections: each GEMM output rounded once */
        const weight *qkv[] = {&w->wq, &w->wk, &w->wv}, *qkv_bias[] = {&w->bq, &w->bk, &w->bv};
        float *const qkv_out[] = {s->q, s->k, s->v};
        linear_group_round_point(ctx, R, s->xn, 3, qkv, qkv_bias, qkv_out);
        phase_lap(ctx, PARITY_PHASE_GEMM, &t);

        /* Qwen3 q/k-norm over each head (region: RMSNorm, policy->qk_norm), then RoPE on q
         * and k (region: RoPE), row by row */
        run_rows(ctx, job_qk_norm_rope,
                 (region_job){.w = c->qk_norm ? vec(ctx, &w->q_norm) : NULL,
                              .w_k = c->qk_norm ? vec(ctx, &w->k_norm) : NULL, .eps = eps,
                              .a = s->q, .b = s->k, .rows = rows}, R);
        phase_lap(ctx, PARITY_PHASE_REGIONS, &t);

        /* this batch's keys and values join the cache; attention reads them from there */
        kv_store(ctx, l, R, rows, s->k, kv_dim, s->v, kv_dim);
        attention(ctx, l, R, rows, s->q, s->att);
        phase_lap(ctx, PARITY_PHASE_ATTENTION, &t);

        /* output projection */
        linear_round_point(ctx, R, s->att, &w->wo, NULL, s->delta);
        phase_lap(ctx, PARITY_PHASE_GEMM, &t);

        /* residual connection + MLP rmsnorm (region: residual + RMSNorm) */
        run_rows(ctx, job_rmsnorm_residual,
                 (region_job){.w = vec(ctx, &w->mlp_norm), .eps = eps, .a = s->delta, .b = s->h,
                              .out = s->xn, .width = dim}, R);
        phase_lap(ctx, PARITY_PHASE_REGIONS, &t);

        /* SwiGLU MLP: gate and up projections rounded, silu(gate) * up (region: SwiGLU),
         * down projection rounded */
        swiglu_mlp_in(ctx, R, w, &t);
        linear_round_point(ctx, R, s->gate, &w->w_down, NULL, s->delta);
        phase_lap(ctx, PARITY_PHASE_GEMM, &t);
    }

    if (n_out == 0) return;

    /* gather the rows that want logits (out_rows ascending, so in place is safe) */
    for (size_t i = 0; i < n_out; i++) {
        size_t r = out_rows[i];
        if (r != i) {
            memmove(s->h + i * dim, s->h + r * dim, dim * sizeof(float));
            memmove(s->delta + i * dim, s->delta + r * dim, dim * sizeof(float));
        }
    }

    const gemm_weights head = {m->lm_head.rows, m->lm_head.cols, m->lm_head.cols,
                               m->lm_head.bf16, linear_f32_weights(ctx, &m->lm_head)};
    forward_head(ctx, n_out, s->delta, s->h, vec(ctx, &m->final_norm), eps, s->xn, &head, logits);
    phase_lap(ctx, PARITY_PHASE_HEAD, &t);
}

/* ---- looped models (Ouro) ------------------------------------------------------------------
 *
 * One stack of N layers runs up to T = config_loops times per row. The loop index goes
 * outside the layer loop; RoPE is the row's position in every loop; loop t, layer l reads and
 * writes KV plane t * N + l. Ouro's layer (OuroDecoderLayer) norms each sublayer's output
 * before its residual add:
 *     h = h + norm2(attn(norm1(h)));  h = h + norm4(mlp(norm3(h)))
 * and the final norm ends every loop: its output is the next loop's input, and the head's and
 * the gate's input. Here the adds join the next norm as everywhere in this file (region:
 * residual + RMSNorm): norm2 and norm4 are plain RMSNorms of the sublayer output, in place,
 * whose result is the delta the next residual region adds.
 *
 * Each row runs to its depth: a fixed one (rows[r].depth: a replayed schedule, a fixed-depth
 * rule, or all loops) or the first loop at which its exit rule fires on the gate's exit
 * distribution (policy->exit_dist). Its logits read its output at that loop (h_exit). After
 * its exit, under PARITY_LOOP_KV_LAST_EXITED the row runs no further loop and its K/V of
 * the exit loop are copied into the deeper planes of every layer, before the next loop runs,
 * so that later positions attend to them there; under PARITY_LOOP_KV_FULL it runs every loop
 * and computes every plane. Rows are independent: a row's values depend on its own depth, its exit rule
 * and the cache, never on which rows share the forward, so a sampler that exits early and a
 * scorer replaying the depths it recorded compute the same bits. */

/* A step of the exit distribution, rounded to the model's format under PARITY_EXIT_DIST_MODEL
 * (nothing rounds under PARITY_COMPUTE_FP32). */
static float exit_round(const fwd_ctx *ctx, float x) {
    if (ctx->pol.exit_dist == PARITY_EXIT_DIST_MODEL) round_to_policy(&ctx->pol, &x, 1);
    return x;
}

/* The row's exit distribution after loop `depth` (1-based) of `loops`, given the gate's output
 * there (exit_pdf_step: that loop's p, the state advanced); exit_rule_fires: whether its rule
 * exits. OuroForCausalLM.forward: lambda = sigmoid(gate),
 * p = lambda * remaining and remaining *= 1 - lambda before the last loop, p = remaining at
 * it; the CDF is the running sum of the p (torch.cumsum: summed in fp32, each value rounded
 * to the tensor's dtype), compared with the threshold (a Python float against a bf16 tensor:
 * the threshold is rounded to bf16 first). */
static float exit_pdf_step(const fwd_ctx *ctx, loop_state *st, float gate, uint32_t depth,
                           uint32_t loops) {
    const float logit = exit_round(ctx, gate);
    const float lambda = exit_round(ctx, 1.0f / (1.0f + parity_expf(-logit)));
    float p;
    if (depth < loops) {
        p = exit_round(ctx, lambda * st->remaining);
        st->remaining = exit_round(ctx, st->remaining * exit_round(ctx, 1.0f - lambda));
    } else {
        p = st->remaining;
    }
    return p;
}

static int exit_rule_fires(const fwd_ctx *ctx, const fwd_exit *e, loop_state *st, float gate,
                           uint32_t depth, uint32_t loops) {
    const float p = exit_pdf_step(ctx, st, gate, depth, loops);
    st->cdf_sum += p;
    const float cdf = exit_round(ctx, st->cdf_sum);
    return depth >= e->max_depth || (depth >= e->min_depth && cdf >= exit_round(ctx, e->threshold));
}

/* Position pos's K and V of plane `from` into plane `to` (a row that exited: LAST_EXITED). */
static void kv_copy_plane(const kv_cache *kv, uint32_t from, uint32_t to, const uint32_t *blocks,
                          uint32_t pos) {
    const size_t hd = kv->head_dim, elem = kv->fp32 ? 4 : 2;
    for (size_t h = 0; h < kv->width / hd; h++) {
        const size_t src = kv_offset(kv, from, blocks, pos, h), dst = kv_offset(kv, to, blocks, pos, h);
        memcpy((char *)kv->k + dst * elem, (const char *)kv->k + src * elem, hd * elem);
        memcpy((char *)kv->v + dst * elem, (const char *)kv->v + src * elem, hd * elem);
    }
}

/* The N layers of loop `loop` on the R rows packed in s->h: leaves in s->delta the last
 * layer's normed MLP output, which the loop's final norm adds. */
static void looped_layers(const fwd_ctx *ctx, uint32_t loop, size_t R, const fwd_row *rows,
                          double *t) {
    const parity_model *m = ctx->model;
    const parity_config *c = &m->config;
    fwd_scratch *s = ctx->s;
    const size_t dim = c->hidden_size, hd = c->head_dim;
    const size_t kv_dim = (size_t)c->num_key_value_heads * hd;
    const float eps = c->rms_norm_eps;
    for (uint32_t l = 0; l < c->num_hidden_layers; l++) {
        const layer_weights *w = &m->layers[l];
        const uint32_t plane = loop * c->num_hidden_layers + l;

        /* input_layernorm: layer 0 reads the loop's input; later layers first add the previous
         * layer's normed MLP output (region: residual + RMSNorm) */
        if (l == 0)
            run_rows(ctx, job_rmsnorm, (region_job){.w = vec(ctx, &w->attn_norm), .eps = eps,
                                                    .a = s->h, .out = s->xn, .width = dim}, R);
        else
            run_rows(ctx, job_rmsnorm_residual,
                     (region_job){.w = vec(ctx, &w->attn_norm), .eps = eps, .a = s->delta,
                                  .b = s->h, .out = s->xn, .width = dim}, R);
        phase_lap(ctx, PARITY_PHASE_REGIONS, t);

        /* q, k, v projections, each rounded (one group); RoPE (region) */
        const weight *qkv[] = {&w->wq, &w->wk, &w->wv}, *no_bias[] = {NULL, NULL, NULL};
        float *const qkv_out[] = {s->q, s->k, s->v};
        linear_group_round_point(ctx, R, s->xn, 3, qkv, no_bias, qkv_out);
        phase_lap(ctx, PARITY_PHASE_GEMM, t);
        run_rows(ctx, job_qk_norm_rope, (region_job){.a = s->q, .b = s->k, .rows = rows}, R);
        phase_lap(ctx, PARITY_PHASE_REGIONS, t);

        /* this loop's plane of the layer */
        kv_store(ctx, plane, R, rows, s->k, kv_dim, s->v, kv_dim);
        attention(ctx, plane, R, rows, s->q, s->att);
        phase_lap(ctx, PARITY_PHASE_ATTENTION, t);

        linear_round_point(ctx, R, s->att, &w->wo, NULL, s->delta);
        phase_lap(ctx, PARITY_PHASE_GEMM, t);

        /* input_layernorm_2 on the attention output (region: RMSNorm, in place), then the
         * residual add and post_attention_layernorm (region: residual + RMSNorm) */
        run_rows(ctx, job_rmsnorm, (region_job){.w = vec(ctx, &w->attn_out_norm), .eps = eps,
                                                .a = s->delta, .out = s->delta, .width = dim}, R);
        run_rows(ctx, job_rmsnorm_residual,
                 (region_job){.w = vec(ctx, &w->mlp_norm), .eps = eps, .a = s->delta, .b = s->h,
                              .out = s->xn, .width = dim}, R);
        phase_lap(ctx, PARITY_PHASE_REGIONS, t);

        /* SwiGLU MLP, as in forward() */
        swiglu_mlp_in(ctx, R, w, t);
        linear_round_point(ctx, R, s->gate, &w->w_down, NULL, s->delta);
        phase_lap(ctx, PARITY_PHASE_GEMM, t);

        /* post_attention_layernorm_2 on the MLP output (region: RMSNorm, in place) */
        run_rows(ctx, job_rmsnorm, (region_job){.w = vec(ctx, &w->mlp_out_norm), .eps = eps,
                                                .a = s->delta, .out = s->delta, .width = dim}, R);
        phase_lap(ctx, PARITY_PHASE_REGIONS, t);
    }
}

/* The head on the n normed rows in s->xn: logits[n][vocab], rounded unless the policy keeps
 * an fp32 head. */
static void looped_head(const fwd_ctx *ctx, size_t n, float *logits) {
    const parity_model *m = ctx->model;
    const gemm_weights head = {m->lm_head.rows, m->lm_head.cols, m->lm_head.cols,
                               m->lm_head.bf16, linear_f32_weights(ctx, &m->lm_head)};
    if (ctx->pol.logits == PARITY_LOGITS_BF16)
        linear_weights_round_point(ctx, n, ctx->s->xn, m->config.hidden_size, &head, NULL, logits,
                                   head.rows);
    else
        linear_weights(ctx, n, ctx->s->xn, m->config.hidden_size, &head, NULL, logits, head.rows);
}

static void forward_looped(const fwd_ctx *ctx, size_t n_rows, fwd_row *rows, size_t n_out,
                           const uint32_t *out_rows, float *logits) {
    const parity_model *m = ctx->model;
    const parity_config *c = &m->config;
    fwd_scratch *s = ctx->s;
    const size_t dim = c->hidden_size;
    const uint32_t loops = config_loops(c), N = c->num_hidden_layers;
    const float eps = c->rms_norm_eps;
    const float *embed_f32 = ctx->pol.compute == PARITY_COMPUTE_BF16 ? NULL : vec(ctx, &m->embed);
    const int full_kv = ctx->loop_kv == PARITY_LOOP_KV_FULL;

    double t = phase_start(ctx);
    if (ctx->prof) ctx->prof->forwards++, ctx->prof->rows += n_rows;

    /* the rows, packed in the order they came: row i in slot i */
    for (size_t r = 0; r < n_rows; r++) {
        embed_rows(1, &rows[r].token, dim, m->embed.bf16, embed_f32, dim, s->h + r * dim, dim);
        s->loop_rows[r] = rows[r];
        s->loop_slot[r] = (uint32_t)r;
        const uint32_t d = rows[r].depth && rows[r].depth < loops ? rows[r].depth : loops;
        s->loop_state[r] = (loop_state){1.0f, 0.0f, rows[r].exit && c->early_exit_gate ? 0 : d, 0};
    }
    phase_lap(ctx, PARITY_PHASE_EMBED, &t);

    size_t A = n_rows; /* rows still running */
    for (uint32_t loop = 0; loop < loops && A > 0; loop++) {
        const uint32_t depth = loop + 1;
        looped_layers(ctx, loop, A, s->loop_rows, &t);

        /* the loop's final norm (model.norm; region: residual + RMSNorm): its output, in xn,
         * is the loop's output */
        run_rows(ctx, job_rmsnorm_residual,
                 (region_job){.w = vec(ctx, &m->final_norm), .eps = eps, .a = s->delta,
                              .b = s->h, .out = s->xn, .width = dim}, A);
        phase_lap(ctx, PARITY_PHASE_REGIONS, &t);

        /* every loop's output, for the dense readouts */
        if (ctx->loop_out)
            for (size_t i = 0; i < A; i++)
                memcpy(ctx->loop_out + ((size_t)loop * s->max_rows + s->loop_slot[i]) * dim,
                       s->xn + i * dim, dim * sizeof(float));

        /* the exit gate, where a row's rule reads it (or the readouts its distribution):
         * Linear(hidden, 1) with its bias */
        const int pdf = ctx->loop_pdf && c->early_exit_gate;
        int gate = pdf;
        for (size_t i = 0; i < A && !gate; i++)
            gate = !s->loop_state[s->loop_slot[i]].target && !s->loop_state[s->loop_slot[i]].exited;
        if (gate) linear(ctx, A, s->xn, &m->exit_gate, &m->exit_gate_bias, s->gate);
        if (pdf)
            for (size_t i = 0; i < A; i++) {
                const uint32_t r = s->loop_slot[i];
                loop_state *st = &s->loop_state[r];
                if (st->target)
                    ctx->loop_pdf[(size_t)r * loops + loop] =
                        exit_pdf_step(ctx, st, s->gate[i], depth, loops);
            }

        /* exits, and the rows that run the next loop packed again, their input the output */
        size_t kept = 0;
        for (size_t i = 0; i < A; i++) {
            const uint32_t r = s->loop_slot[i];
            loop_state *st = &s->loop_state[r];
            if (!st->exited) {
                const int exits = st->target ? depth >= st->target
                                             : exit_rule_fires(ctx, rows[r].exit, st, s->gate[i],
                                                               depth, loops);
                if (exits || depth == loops) {
                    st->exited = 1;
                    rows[r].depth = depth;
                    memcpy(s->h_exit + (size_t)r * dim, s->xn + i * dim, dim * sizeof(float));
                    if (!full_kv) {
                        const fwd_row *row = &s->loop_rows[i];
                        for (uint32_t deeper = depth; deeper < loops; deeper++)
                            for (uint32_t l = 0; l < N; l++)
                                kv_copy_plane(ctx->kv, loop * N + l, deeper * N + l, row->blocks,
                                              row->pos);
                        continue;
                    }
                }
            }
            if (kept != i) {
                s->loop_rows[kept] = s->loop_rows[i];
                s->loop_slot[kept] = r;
            }
            memcpy(s->h + kept * dim, s->xn + i * dim, dim * sizeof(float));
            kept++;
        }
        A = kept;
        phase_lap(ctx, PARITY_PHASE_HEAD, &t);
    }

    if (n_out == 0) return;
    /* the head on each wanted row's exit-loop output (Ouro's lm_head reads the normed state) */
    for (size_t i = 0; i < n_out; i++)
        memcpy(s->xn + i * dim, s->h_exit + (size_t)out_rows[i] * dim, dim * sizeof(float));
    looped_head(ctx, n_out, logits);
    phase_lap(ctx, PARITY_PHASE_HEAD, &t);
}

void forward_loop_logits(const fwd_ctx *ctx, uint32_t loop, size_t n_out,
                         const uint32_t *out_rows, float *logits) {
    fwd_scratch *s = ctx->s;
    const size_t dim = ctx->model->config.hidden_size;
    double t = phase_start(ctx);
    for (size_t i = 0; i < n_out; i++)
        memcpy(s->xn + i * dim, ctx->loop_out + ((size_t)loop * s->max_rows + out_rows[i]) * dim,
               dim * sizeof(float));
    looped_head(ctx, n_out, logits);
    phase_lap(ctx, PARITY_PHASE_HEAD, &t);
}

double profile_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}
