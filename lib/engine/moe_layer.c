/*
 * A sparse layer's MLP block: the router, the routed experts, the shared expert, the combine.
 *
 * Batch invariance: a row's route is moe_route of its own logits; the experts run grouped,
 * each over the rows that chose it (gathered in row order), expert by expert in ascending
 * index or, where the pairs fit the scratch on the bf16 backend, many experts in one pool
 * dispatch (gemm.h: linear_experts); every GEMM of the library gives a row the bits of that
 * row alone whatever the other rows (M, tiles, threads and the GEMMs run beside it never
 * enter a row's sums); the combine reads the row's own outputs. No capacity, no dropped
 * token, no quantity computed across rows: the quantized formats quantize activations per row
 * (their blocks lie along K).
 */
#include "moe_layer.h"

#include <string.h>

#include "gemm.h"
#include "gemm_quant.h"
#include "kernels/kernels.h"
#include "kernels/moe.h"
#include "layer.h"
#include "model/config.h"
#include "profile.h"

typedef struct combine_job {
    const fwd_ctx *ctx;
    uint32_t k;
    int shared;
} combine_job;

/* moe_combine of rows [begin, end) into s->delta. */
static void job_combine(void *p, size_t begin, size_t end, unsigned worker) {
    (void)worker;
    const combine_job *j = p;
    const fwd_scratch *s = j->ctx->s;
    const size_t H = j->ctx->config->hidden_size, k = j->k;
    for (size_t r = begin; r < end; r++)
        moe_combine(&j->ctx->pol, H, j->k, s->moe_ids + r * k, s->moe_weights + r * k,
                    s->moe_y + r * k * H, j->shared ? s->moe_shared + r * H : NULL,
                    j->shared ? s->moe_gate[r] : 0.0f, s->delta + r * H);
}

/* Each row's k experts and weights, recorded or replayed where the row says; then the (row,
 * slot) pairs grouped by expert (a counting sort, rows ascending within an expert). */
static void route_rows(const fwd_ctx *ctx, uint32_t sparse, size_t R, const fwd_row *rows) {
    const parity_config *c = ctx->config;
    fwd_scratch *s = ctx->s;
    const uint32_t E = c->num_experts, k = c->num_experts_per_tok;
    for (size_t r = 0; r < R; r++) {
        const uint16_t *replay = rows[r].route_replay ? rows[r].route_replay + (size_t)sparse * k
                                                      : NULL;
        uint16_t *ids = s->moe_ids + r * k;
        moe_route(&ctx->pol, E, k, (int)c->norm_topk_prob, s->moe_logits + r * E, replay, ids,
                  s->moe_weights + r * k, s->moe_route);
        if (rows[r].route_record)
            memcpy(rows[r].route_record + (size_t)sparse * k, ids, k * sizeof *ids);
    }
    uint32_t *count = s->moe_count;
    memset(count, 0, (E + 1) * sizeof *count);
    for (size_t i = 0; i < R * k; i++) count[s->moe_ids[i] + 1]++;
    for (uint32_t e = 0; e < E; e++) count[e + 1] += count[e];
    /* count[e] is now where expert e's pairs start; fill, then shift back */
    for (size_t i = 0; i < R * k; i++) s->moe_order[count[s->moe_ids[i]]++] = (uint32_t)i;
    for (uint32_t e = E; e > 0; e--) count[e] = count[e - 1];
    count[0] = 0;
}

/* The rows of pairs first .. first+n-1 (in expert order) gathered into s->moe_x's rows 0 ..
 * n-1. */
static void gather_pairs(fwd_scratch *s, size_t H, size_t k, uint32_t first, uint32_t n) {
    for (uint32_t i = 0; i < n; i++)
        memcpy(s->moe_x + i * H, s->xn + (s->moe_order[first + i] / k) * H, H * sizeof(float));
}

/* s->moe_out's rows 0 .. n-1, the outputs of pairs first .. first+n-1, to each pair's row
 * of s->moe_y. */
static void scatter_pairs(fwd_scratch *s, size_t H, uint32_t first, uint32_t n) {
    for (uint32_t i = 0; i < n; i++)
        memcpy(s->moe_y + (size_t)s->moe_order[first + i] * H, s->moe_out + i * H,
               H * sizeof(float));
}

/* How the experts of this batch run: grouped (experts_grouped) where their (row, slot) pairs
 * fit the scratch's rows and every expert weight of the layer is read one way, bf16 values
 * (linear_experts_runs) or a quantized format's codes; else one by one. */
enum { ONE_BY_ONE, GROUPED_BF16, GROUPED_QUANTIZED };

static int experts_mode(const fwd_ctx *ctx, const layer_weights *w, size_t R) {
    const parity_config *c = ctx->config;
    if (R * c->num_experts_per_tok > ctx->s->max_rows) return ONE_BY_ONE;
    int bf16 = 1, quantized = 1;
    for (uint32_t e = 0; e < c->num_experts && (bf16 || quantized); e++) {
        const weight *x[] = {&w->expert_gate[e], &w->expert_up[e], &w->expert_down[e]};
        for (int j = 0; j < 3; j++) {
            bf16 &= linear_experts_runs(ctx, x[j]);
            quantized &= quant_weight_for(&ctx->pol, x[j]) != NULL;
        }
    }
    return bf16 ? GROUPED_BF16 : quantized ? GROUPED_QUANTIZED : ONE_BY_ONE;
}

/* Experts ids[0..n) over their pairs' rows first[] of s->moe_x, quantized: gate and up (each
 * rounded as linear_group_round_point rounds them), SwiGLU over the rows, the down
 * projection: two GEMM dispatches and the region's, each with mlp_swiglu's and linear's bits
 * (linear_quantized_experts). */
static void experts_quantized(const fwd_ctx *ctx, const layer_weights *w, size_t n,
                              const uint32_t *ids, const uint32_t *first) {
    fwd_scratch *s = ctx->s;
    const weight *gate_up[2 * GEMM_EXPERTS_MAX], *down[GEMM_EXPERTS_MAX];
    const quant_weight *gate_up_q[2 * GEMM_EXPERTS_MAX], *down_q[GEMM_EXPERTS_MAX];
    for (size_t p = 0; p < n; p++) {
        gate_up[2 * p] = &w->expert_gate[ids[p]], gate_up[2 * p + 1] = &w->expert_up[ids[p]];
        down[p] = &w->expert_down[ids[p]];
        gate_up_q[2 * p] = quant_weight_for(&ctx->pol, gate_up[2 * p]);
        gate_up_q[2 * p + 1] = quant_weight_for(&ctx->pol, gate_up[2 * p + 1]);
        down_q[p] = quant_weight_for(&ctx->pol, down[p]);
    }
    const size_t N = ctx->config->moe_intermediate_size, rows = first[n] - first[0];
    float *const gu_out[] = {s->gate, s->up};
    linear_quantized_experts(ctx, n, first, s->moe_x, 2, gate_up, gate_up_q, gu_out);
    round_to_policy(&ctx->pol, s->gate + first[0] * N, rows * N);
    round_to_policy(&ctx->pol, s->up + first[0] * N, rows * N);
    rows_swiglu(ctx, rows, s->gate + first[0] * N, s->up + first[0] * N, N);
    linear_quantized_experts(ctx, n, first, s->gate, 1, down, down_q, &s->moe_out);
}

/* Every (row, slot) pair's row gathered in expert order into s->moe_x, then the experts that
 * were chosen, up to GEMM_EXPERTS_MAX at a time: one pool dispatch for their gate, up and
 * SwiGLU, one for their down projections (a decode step of one sequence: 2 dispatches for
 * its 8 experts instead of 16), the outputs scattered to each pair. Each output has the
 * bits of the expert-by-expert loop (gemm.h: linear_experts). */
static void experts_grouped(const fwd_ctx *ctx, const layer_weights *w, size_t R, int quantized,
                            double *t) {
    const parity_config *c = ctx->config;
    fwd_scratch *s = ctx->s;
    const size_t H = c->hidden_size, k = c->num_experts_per_tok;
    const uint32_t pairs = (uint32_t)(R * k);
    gather_pairs(s, H, k, 0, pairs);
    for (uint32_t e = 0; e < c->num_experts;) {
        const weight *gate[GEMM_EXPERTS_MAX], *up[GEMM_EXPERTS_MAX], *down[GEMM_EXPERTS_MAX];
        uint32_t ids[GEMM_EXPERTS_MAX], first[GEMM_EXPERTS_MAX + 1];
        size_t n = 0;
        for (; e < c->num_experts && n < GEMM_EXPERTS_MAX; e++) {
            if (s->moe_count[e + 1] == s->moe_count[e]) continue;
            gate[n] = &w->expert_gate[e], up[n] = &w->expert_up[e], down[n] = &w->expert_down[e];
            ids[n] = e;
            first[n++] = s->moe_count[e];
        }
        if (!n) break;
        first[n] = s->moe_count[e];
        if (quantized) {
            experts_quantized(ctx, w, n, ids, first);
            continue;
        }
        linear_experts_swiglu(ctx, n, first, s->moe_x, gate, up, s->gate, s->up);
        linear_experts(ctx, n, first, s->gate, down, s->moe_out);
    }
    scatter_pairs(s, H, 0, pairs);
    phase_lap(ctx, PARITY_PHASE_GEMM, t);
}

/* Each expert over the rows that chose it, one after the other: gathered, SwiGLU, the down
 * projection's fp32 output scattered to each (row, slot). */
static void experts_one_by_one(const fwd_ctx *ctx, const layer_weights *w, double *t) {
    const parity_config *c = ctx->config;
    fwd_scratch *s = ctx->s;
    const size_t H = c->hidden_size, k = c->num_experts_per_tok;
    for (uint32_t e = 0; e < c->num_experts; e++) {
        const uint32_t first = s->moe_count[e], n = s->moe_count[e + 1] - first;
        if (!n) continue;
        gather_pairs(s, H, k, first, n);
        mlp_swiglu(ctx, n, s->moe_x, &w->expert_gate[e], &w->expert_up[e], t);
        linear(ctx, n, s->gate, &w->expert_down[e], NULL, s->moe_out);
        scatter_pairs(s, H, first, n);
        phase_lap(ctx, PARITY_PHASE_GEMM, t);
    }
}

void layer_moe(const fwd_ctx *ctx, const layer_weights *w, uint32_t sparse, size_t R,
               const fwd_row *rows, double *t) {
    const parity_config *c = ctx->config;
    fwd_scratch *s = ctx->s;

    /* the router's logits: a GEMM output, rounded as every one is */
    linear_round_point(ctx, R, s->xn, &w->router, NULL, s->moe_logits);
    phase_lap(ctx, PARITY_PHASE_GEMM, t);
    route_rows(ctx, sparse, R, rows);
    phase_lap(ctx, PARITY_PHASE_REGIONS, t);

    const int mode = experts_mode(ctx, w, R);
    if (mode == ONE_BY_ONE)
        experts_one_by_one(ctx, w, t);
    else
        experts_grouped(ctx, w, R, mode == GROUPED_QUANTIZED, t);

    /* Qwen2-MoE's shared expert on every row, and its gate's logit (rounded) */
    const int shared = w->shared_gate.rows > 0;
    if (shared) {
        mlp_swiglu(ctx, R, s->xn, &w->shared_gate, &w->shared_up, t);
        linear(ctx, R, s->gate, &w->shared_down, NULL, s->moe_shared);
        linear_round_point(ctx, R, s->xn, &w->shared_expert_gate, NULL, s->moe_gate);
        phase_lap(ctx, PARITY_PHASE_GEMM, t);
    }

    /* a decode step's row or two combined by the caller: a pool round trip costs more */
    combine_job combine = {ctx, c->num_experts_per_tok, shared};
    if (R <= 2)
        job_combine(&combine, 0, R, 0);
    else
        pool_run(ctx->pool, job_combine, &combine, R);
    phase_lap(ctx, PARITY_PHASE_REGIONS, t);
}
