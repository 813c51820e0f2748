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
#include "quant/rules.h"

/* One quantized GEMM over the pool: the job and the column kernel of the current CPU path. */
typedef struct quant_gemm_run {
    quant_gemm_job job;
    quant_gemm_fn *columns;
} quant_gemm_run;

static void quant_columns(void *p, size_t n0, size_t n1, unsigned worker) {
    (void)worker;
    const quant_gemm_run *r = p;
    r->columns(&r->job, n0, n1);
}

/* The activations' block count along K under format f. */
static size_t activation_blocks(const quant_format *f, size_t K) {
    return f->block_cols ? (K + f->block_cols - 1) / f->block_cols : 0;
}

void linear_quantized(const fwd_ctx *ctx, size_t M, const float *x, size_t ldx, const weight *w,
                      const quant_weight *wq, const float *bias, float *y, size_t ldy) {
    const quant_rule *rule = quant_rule_of(ctx->pol.quantizer);
    const quant_format *f = rule->format;
    const size_t K = w->cols, N = w->rows, nblocks = activation_blocks(f, K);
    /* the activations' codes and scales in the GEMM scratch (linear_quantized_scratch bytes) */
    uint8_t *xq = (uint8_t *)ctx->s->gemm.xpack;
    float *xs = (float *)(void *)(xq + (M * K + 63) / 64 * 64);
    float *xt = xs + M * nblocks;
    quant_rows_entry(f)(rule, M, K, x, ldx, xq, K, xs, xt);
    quant_gemm_run run = {{M, K, nblocks, f->block_cols, rule, xq, xs, xt, wq->codes, wq->scales,
                           nblocks, wq->tensor_scale, y, ldy},
                          quant_gemm_entry(f)};
    pool_run(ctx->pool, quant_columns, &run, N);
    if (f->element != QUANT_ELEMENT_E4M3)
        /* E2M1 and int8 have no NaN: a row holding a NaN or an infinity yields NaN, as an
         * E4M3 NaN code does in the fp8 GEMMs, rather than the codes its saturation gives */
        for (size_t m = 0; m < M; m++)
            for (size_t i = 0; i < K; i++)
                if (!isfinite(x[m * ldx + i])) {
                    for (size_t c = 0; c < N; c++) y[m * ldy + c] = NAN;
                    break;
                }
    if (bias)
        for (size_t m = 0; m < M; m++)
            for (size_t n = 0; n < N; n++) y[m * ldy + n] += bias[n];
}

size_t linear_quantized_scratch(int quantizer, size_t M, size_t K) {
    const size_t nblocks = activation_blocks(quant_rule_of(quantizer)->format, K);
    return (M * K + 63) / 64 * 64 + (M * nblocks + M) * sizeof(float);
}
