/* The quantized linear layer (gemm_quant.c): its entry from the forward and its scratch size. */
#ifndef PARITY_ENGINE_GEMM_QUANT_H
#define PARITY_ENGINE_GEMM_QUANT_H

#include <stddef.h>
#include <stdint.h>

#include "forward_types.h"

/* y = x . w^T (+ bias) under the policy's
 * quantized gemm and quantizer, with wq the weight's codes and scales (quant_weight_for:
 * shipped, or the copy model_prepare_quant built); x rows ldx apart, y rows ldy apart; the
 * activations are quantized into the GEMM scratch (xpack), which holds
 * linear_quantized_scratch(quantizer, M, K) bytes. */
struct weight;
struct quant_weight;
void linear_quantized(const fwd_ctx *ctx, size_t M, const float *x, size_t ldx,
                      const struct weight *w, const struct quant_weight *wq, const float *bias,
                      float *y, size_t ldy);
/* linear_quantized of n <= QUANT_GROUP_MAX layers that read the same x (q, k and v; gate and up), each with
 * its bias (NULL: none) and output: x quantized once, one pool call over their columns; every
 * output the bits linear_quantized gives it alone. */
#define QUANT_GROUP_MAX 3
void linear_quantized_group(const fwd_ctx *ctx, size_t M, const float *x, size_t ldx, size_t n,
                            const struct weight *const *w, const struct quant_weight *const *wq,
                            const float *const *bias, float *const *y, const size_t *ldy);
/* A mixture of experts' quantized GEMMs, each expert over its own rows of one x, in one pool
 * call: expert p (p < n) reads x's rows first[p] .. first[p+1]-1 (x rows w->cols apart,
 * first ascending) and runs its `per` weights w[p * per + j] (j < per, each with codes wq[..]
 * and the same K), output j into the same rows of y[j] (rows N apart). The rows are quantized
 * once; each output has the bits linear_quantized gives the expert's rows alone (a row's
 * codes and scales are its own, a column's sums its own). n * per <= QUANT_EXPERT_PARTS_MAX;
 * first[n] - first[0] rows fit the GEMM scratch. No bias, no rounding. */
#define QUANT_EXPERT_PARTS_MAX 64
void linear_quantized_experts(const fwd_ctx *ctx, size_t n, const uint32_t *first,
                              const float *x, size_t per, const struct weight *const *w,
                              const struct quant_weight *const *wq, float *const *y);
size_t linear_quantized_scratch(int quantizer, size_t M, size_t K);

#endif /* PARITY_ENGINE_GEMM_QUANT_H */
