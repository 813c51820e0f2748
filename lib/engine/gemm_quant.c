/*
 * The quantized GEMMs (parity.h, PARITY_GEMM_FP8_BLOCK .. PARITY_GEMM_TERNARY): the
 * activations quantized per token at each GEMM input with the policy's rule (the weights were
 * quantized once per rule, quant/quant_weight.c), then the rule's GEMM entry (quant/dot.c says
 * the arithmetic) over the thread pool, columns split between the workers:
 *   y[m][n] = sum over K blocks kb, ascending, in fp32: acc = acc + (d * a_s) * w_s
 * with d the block's dot product of the codes' values computed exactly and rounded once to
 * fp32 (ternary: the integer dot over s_w s_x). Activations are never NaN in the 4-bit and
 * ternary formats, whose elements have no NaN: a row holding a NaN or an infinity yields NaN,
 * as an E4M3 NaN code does in the fp8 GEMMs.
 */
#include <math.h>

#include "gemm_quant.h"
#include "model/model.h"
#include "quant/dot.h"
#include "quant/quant_weight.h"
#include "quant/rules.h"

/* Up to QUANT_GROUP_MAX quantized GEMMs on the same activations over the pool, one pool call:
 * the columns of the group are the layers' columns one layer after the other, part i's being
 * [first[i], first[i + 1]); each column is computed by its layer's job alone, so that grouping
 * moves no bit. */

typedef struct quant_group_run {
    size_t n;
    quant_gemm_job job[QUANT_EXPERT_PARTS_MAX];
    size_t first[QUANT_EXPERT_PARTS_MAX + 1];
    quant_gemm_fn *columns; /* the column kernel of the current CPU path */
} quant_group_run;

static void group_columns(void *p, size_t c0, size_t c1, unsigned worker) {
    (void)worker;
    const quant_group_run *r = p;
    for (size_t i = 0; i < r->n; i++) {
        const size_t a = c0 > r->first[i] ? c0 : r->first[i];
        const size_t b = c1 < r->first[i + 1] ? c1 : r->first[i + 1];
        if (a < b) r->columns(&r->job[i], a - r->first[i], b - r->first[i]);
    }
}

/* The activations' block count along K under format f. */
static size_t activation_blocks(const quant_format *f, size_t K) {
    return f->block_cols ? (K + f->block_cols - 1) / f->block_cols : 0;
}

/* The activations of M rows quantized by rule r: each row alone (every rule's activations are
 * per token), so from QUANTIZE_SPLIT_ROWS rows the rows are split between the pool's workers
 * (below, one call: the pool's round trip costs more than the rows). */
enum { QUANTIZE_SPLIT_ROWS = 16 };

typedef struct quantize_run {
    const quant_rule *rule;
    quant_fn *rows;
    size_t K, ldx, nblocks;
    const float *x;
    uint8_t *xq;
    float *xs, *xt;
} quantize_run;

static void quantize_part(void *p, size_t r0, size_t r1, unsigned worker) {
    (void)worker;
    const quantize_run *q = p;
    q->rows(q->rule, r1 - r0, q->K, q->x + r0 * q->ldx, q->ldx, q->xq + r0 * q->K, q->K,
            q->xs + r0 * q->nblocks, q->xt + r0);
}

static void quantize_activations(const fwd_ctx *ctx, const quant_rule *r, size_t M, size_t K,
                                 const float *x, size_t ldx, uint8_t *xq, float *xs, float *xt) {
    quantize_run q = {r, quant_rows_entry(r->format), K, ldx, activation_blocks(r->format, K),
                      x, xq, xs, xt};
    if (M < QUANTIZE_SPLIT_ROWS)
        quantize_part(&q, 0, M, 0);
    else
        pool_run(ctx->pool, quantize_part, &q, M);
}

/* Whether row x of K values holds a NaN or an infinity. */
static int row_not_finite(const float *x, size_t K) {
    size_t k = 0;
    while (k < K && isfinite(x[k])) k++;
    return k < K;
}

void linear_quantized_group(const fwd_ctx *ctx, size_t M, const float *x, size_t ldx, size_t n,
                            const weight *const *w, const quant_weight *const *wq,
                            const float *const *bias, float *const *y, const size_t *ldy) {
    const quant_rule *rule = quant_rule_of(ctx->pol.quantizer);
    const quant_format *f = rule->format;
    const size_t K = w[0]->cols, nblocks = activation_blocks(f, K);
    /* the activations' codes and scales in the GEMM scratch (linear_quantized_scratch bytes),
     * quantized once for every layer of the group */
    uint8_t *xq = (uint8_t *)ctx->s->gemm.xpack;
    float *xs = (float *)(void *)(xq + (M * K + 63) / 64 * 64);
    float *xt = xs + M * nblocks;
    quantize_activations(ctx, rule, M, K, x, ldx, xq, xs, xt);
    quant_group_run run = {.n = n, .columns = quant_gemm_entry(f)};
    for (size_t i = 0; i < n; i++) {
        run.job[i] = (quant_gemm_job){M, K, nblocks, f->block_cols, rule, xq, xs, xt,
                                      wq[i]->codes, quant_weight_row_bytes(f, K), {wq[i]->scales},
                                      nblocks, wq[i]->tensor_scale, y[i], ldy[i]};
        run.first[i + 1] = run.first[i] + w[i]->rows;
    }
    pool_run(ctx->pool, group_columns, &run, run.first[n]);
    if (f->element != QUANT_ELEMENT_E4M3)
        /* E2M1 and int8 have no NaN: a row holding a NaN or an infinity yields NaN in every
         * layer of the group, as an E4M3 NaN code does in the fp8 GEMMs, rather than the codes
         * its saturation gives (each row scanned once for the group) */
        for (size_t m = 0; m < M; m++)
            if (row_not_finite(x + m * ldx, K))
                for (size_t i = 0; i < n; i++)
                    for (size_t c = 0; c < w[i]->rows; c++) y[i][m * ldy[i] + c] = NAN;
    for (size_t i = 0; i < n; i++)
        if (bias[i])
            for (size_t m = 0; m < M; m++)
                for (size_t c = 0; c < w[i]->rows; c++) y[i][m * ldy[i] + c] += bias[i][c];
}

void linear_quantized(const fwd_ctx *ctx, size_t M, const float *x, size_t ldx, const weight *w,
                      const quant_weight *wq, const float *bias, float *y, size_t ldy) {
    linear_quantized_group(ctx, M, x, ldx, 1, &w, &wq, &bias, &y, &ldy);
}

void linear_quantized_experts(const fwd_ctx *ctx, size_t n, const uint32_t *first,
                              const float *x, size_t per, const weight *const *w,
                              const quant_weight *const *wq, float *const *y) {
    const quant_rule *rule = quant_rule_of(ctx->pol.quantizer);
    const quant_format *f = rule->format;
    const size_t K = w[0]->cols, nblocks = activation_blocks(f, K), M = first[n] - first[0];
    /* the rows of every expert quantized at once, each row on its own (per-token scales) */
    uint8_t *xq = (uint8_t *)ctx->s->gemm.xpack;
    float *xs = (float *)(void *)(xq + (M * K + 63) / 64 * 64);
    float *xt = xs + M * nblocks;
    quantize_activations(ctx, rule, M, K, x + first[0] * K, K, xq, xs, xt);
    quant_group_run run = {.n = n * per, .columns = quant_gemm_entry(f)};
    for (size_t p = 0; p < n; p++) {
        const size_t r = first[p] - first[0], rows = first[p + 1] - first[p];
        for (size_t j = 0; j < per; j++) {
            const size_t i = p * per + j, N = w[i]->rows;
            run.job[i] = (quant_gemm_job){rows, K, nblocks, f->block_cols, rule, xq + r * K,
                                          xs + r * nblocks, xt + r, wq[i]->codes,
                                          quant_weight_row_bytes(f, K), {wq[i]->scales}, nblocks,
                                          wq[i]->tensor_scale, y[j] + first[p] * N, N};
            run.first[i + 1] = run.first[i] + N;
        }
    }
    /* the columns in chunks of about an eighth of a worker's share, to whichever worker is
     * free, as the bf16 GEMMs of a small M go (a column's sums do not depend on its chunk) */
    const size_t columns = run.first[run.n], shares = 8 * (size_t)pool_size(ctx->pool);
    pool_run_dynamic(ctx->pool, group_columns, &run, columns, (columns + shares - 1) / shares);
    if (f->element != QUANT_ELEMENT_E4M3) /* a non-finite row: NaN, as linear_quantized_group */
        for (size_t p = 0; p < n; p++)
            for (size_t m = first[p]; m < first[p + 1]; m++)
                if (row_not_finite(x + m * K, K))
                    for (size_t j = 0; j < per; j++) {
                        const size_t N = w[p * per + j]->rows;
                        for (size_t c = 0; c < N; c++) y[j][m * N + c] = NAN;
                    }
}

size_t linear_quantized_scratch(int quantizer, size_t M, size_t K) {
    const size_t nblocks = activation_blocks(quant_rule_of(quantizer)->format, K);
    return (M * K + 63) / 64 * 64 + (M * nblocks + M) * sizeof(float);
}
