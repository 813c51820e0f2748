/* The GEMM backends (gemm.c): the linear layers of the forward on bf16 or fp32 weights, each
 * output's rounding point done by the GEMM's own tasks, and the grouped GEMMs on one input. */
#ifndef PARITY_ENGINE_GEMM_H
#define PARITY_ENGINE_GEMM_H

#include <stddef.h>
#include <stdint.h>

#include "base/threadpool.h"
#include "forward_types.h"
#include "model/model.h"

/* The weights of one GEMM: rows x cols, rows ld elements apart, as bf16 values (the bf16
 * backend under a bf16 policy) and/or as fp32 (the openblas backend: bf16 widened; the fp32
 * policy: the masters). */
typedef struct gemm_weights {
    size_t rows, cols, ld;
    const uint16_t *bf16;
    const float *f32;
} gemm_weights;

/* The floats of gemm_scratch.xpack for up to max_rows rows of max_k columns. */
size_t gemm_scratch_xpack_floats(size_t max_rows, size_t max_k);

/* ---- GEMM backends (gemm.c) -------------------------------------------------------------- */
/* y[m][n] = sum_k x[m][k] * w[n][k] (+ bias[n]) for m < M, n < w->rows, fp32, unrounded (the
 * caller rounds); x has w->cols columns, rows ldx apart; y rows ldy apart. The order of each
 * sum is the backend's (bf16: pair32 on bf16 weights, dot16 on fp32 weights under
 * PARITY_COMPUTE_FP32; openblas: one-row cblas_sgemm); the bias joins the fp32 sum. */
void linear_weights(const fwd_ctx *ctx, size_t M, const float *x, size_t ldx,
                    const gemm_weights *w, const float *bias, float *y, size_t ldy);

/* The fp32 values of a model weight that the context's GEMM reads: the masters (or the bf16
 * widened) under PARITY_COMPUTE_FP32, the widened copy on the openblas backend, else NULL. */
const float *linear_f32_weights(const fwd_ctx *ctx, const weight *w);
/* linear_weights, then the rounding point of its output (round_to_policy of each of y's M
 * rows), done by the GEMM's tasks where the backend is bf16 (as linear_round_point below). */
void linear_weights_round_point(const fwd_ctx *ctx, size_t M, const float *x, size_t ldx,
                                const gemm_weights *w, const float *bias, float *y, size_t ldy);
/* linear_weights on a model weight (and bias: rows = 0 for none), x and y contiguous. */
void linear(const fwd_ctx *ctx, size_t M, const float *x, const weight *w, const weight *bias,
            float *y);
/* linear, then the rounding point of its output (round_to_policy of all of y), the rounding
 * done by the GEMM's own tasks on the columns each computed where the backend is bf16 (the
 * same bits as a pass after the GEMM, without one core rounding all of y alone). */
void linear_round_point(const fwd_ctx *ctx, size_t M, const float *x, const weight *w,
                        const weight *bias, float *y);
/* linear_round_point of n <= GEMM_GROUP_MAX layers that read the same x (q, k and v; gate and
 * up): y[i] = round(x . w[i]^T + bias[i]) (bias[i] NULL or of rows = 0 for none), each
 * output the same bits as linear_round_point's. On the bf16 backend x is packed once and one
 * parallel loop runs the column blocks of all n (gemm_bf16w_group_pool); elsewhere the n run
 * one after the other. */
void linear_group_round_point(const fwd_ctx *ctx, size_t M, const float *x, size_t n,
                              const weight *const *w, const weight *const *bias, float *const *y);
/* The bf16-weight GEMM as linear() runs it: y[M][N] = x . w^T (x rows ldx apart, w rows ldw
 * apart, y rows ldy apart, K <= s->max_k): x packed over the pool (gemm_pack_x, or
 * gemm_pack_xt from the table's tiles_min_m rows on), then output columns split over the pool
 * in blocks (bench/gemm-bench times it). */
void gemm_bf16w_pool(threadpool *pool, size_t M, size_t K, const float *x, size_t ldx,
                     const uint16_t *w, size_t ldw, float *y, size_t ldy, size_t N,
                     const gemm_scratch *s);
/* gemm_bf16w_pool on an x its caller packed (the learner's backward packs straight from
 * strided operands, parity_matmul): xb, M bf16 rows in pack_x_bf16's layout, for a table
 * with gemm_bf16xw (then xt is ignored), else xt, gemm_pack_xt_tiles' tiles of M >= the
 * table's tiles_min_m rows, with s's panels; the same bits as gemm_bf16w_pool on that x. */
void gemm_bf16w_pool_packed(threadpool *pool, size_t M, size_t K, const uint16_t *xb,
                            const float *xt, const uint16_t *w, size_t ldw, float *y, size_t ldy,
                            size_t N, const gemm_scratch *s);
/* What a GEMM task does to the output columns it computed, before anyone else reads them: the
 * bias added to the fp32 sums, then the policy's output rounding. The same additions and the
 * same rounding as passes over y after the GEMM, so the same bits; done by every worker on
 * columns still in its cache instead of by the caller over all of y. */
typedef struct gemm_epilogue {
    const float *bias;           /* [N], or NULL */
    const parity_policy *round;  /* round_with this policy, or NULL */
} gemm_epilogue;
/* One GEMM of a group: y[M][N] = x . w^T (w rows ldw apart, y rows ldy apart), then ep (or
 * NULL). */
typedef struct gemm_part {
    const uint16_t *w;
    size_t ldw, N;
    float *y;
    size_t ldy;
    const gemm_epilogue *ep;
} gemm_part;
#define GEMM_GROUP_MAX 3
/* A SwiGLU MLP's first half where the bf16 backend runs it in one pass (bf16 compute, bf16
 * weights, K not split): gate = x . w_gate^T and up = x . w_up^T, each rounded as
 * linear_group_round_point rounds them, and out = the policy's swiglu(gate, up) (out may be
 * gate), all in the GEMM's tasks, each on the columns it has just computed; returns 1. Returns
 * 0 having done nothing elsewhere: the caller runs the GEMMs and the region itself. The same
 * bits either way (swiglu is elementwise). */
int linear_swiglu_fused(const fwd_ctx *ctx, size_t M, const float *x, const weight *w_gate,
                        const weight *w_up, float *gate, float *up, float *out);
/* gemm_bf16w_pool of n <= GEMM_GROUP_MAX GEMMs on the same x: x packed once, then the column
 * blocks of all n split over the pool in one parallel loop, each output the same bits as
 * its own gemm_bf16w_pool's (an output depends on nothing computed beside it). */
void gemm_bf16w_group_pool(threadpool *pool, size_t M, size_t K, const float *x, size_t ldx,
                           size_t n, const gemm_part *parts, const gemm_scratch *s);

/* A mixture of experts' experts, each over its own rows of one x, in one pool dispatch per
 * call (a decode step's few rows would otherwise pay a dispatch per expert and GEMM). Expert p
 * (p < n <= GEMM_EXPERTS_MAX) reads x's rows first[p] .. first[p+1]-1 (x rows w->cols apart,
 * first ascending, first[n] <= the scratch's rows) and writes the same rows of the outputs
 * (rows N apart, N its weight's rows). x is packed once for all of them. Each output has the
 * bits linear_swiglu_fused or linear would give the expert's rows alone (an output depends
 * only on its row and column). Only where linear_experts_runs says so for every weight. */
#define GEMM_EXPERTS_MAX 32
/* Whether the experts' GEMMs below run w: the bf16 backend, bf16 compute, K not split, and w
 * read as bf16 values (not a quantized format's codes). */
int linear_experts_runs(const fwd_ctx *ctx, const weight *w);
/* gate = round(x . w_gate[p]^T), up = round(x . w_up[p]^T) on expert p's rows, then gate =
 * the policy's swiglu(gate, up) (mlp_swiglu's bits). */
void linear_experts_swiglu(const fwd_ctx *ctx, size_t n, const uint32_t *first, const float *x,
                           const weight *const *w_gate, const weight *const *w_up, float *gate,
                           float *up);
/* y = x . w[p]^T on expert p's rows, fp32, unrounded (linear's bits). */
void linear_experts(const fwd_ctx *ctx, size_t n, const uint32_t *first, const float *x,
                    const weight *const *w, float *y);

#endif /* PARITY_ENGINE_GEMM_H */
