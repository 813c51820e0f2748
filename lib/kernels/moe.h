/* A mixture-of-experts layer's two token-local steps (moe.c), the same C on every CPU path: the
 * router (logits to k experts and their weights) and the combine (the k experts' outputs and
 * the shared expert's to the layer's output), each rounding where the policy's moe_router,
 * moe_weights and moe_combine switches say (parity.h, "The policy in detail"). */
#ifndef PARITY_KERNELS_MOE_H
#define PARITY_KERNELS_MOE_H

#include <stddef.h>
#include <stdint.h>

#include "parity.h"

/* Floats of scratch moe_route needs for E experts. */
static inline size_t moe_route_scratch_floats(uint32_t n_experts) { return 2 * (size_t)n_experts; }

/* One token's route: from its E router logits, the k experts in slot order (descending
 * probability, ties to the lower index) into ids[k] and their weights into weights[k]. With
 * `replay` not NULL its k experts (distinct, < E, in the order recorded) are taken instead of
 * the top-k and only the weights are computed, from this policy's probabilities, as a
 * replaying learner recomputes them. norm_topk: the config's norm_topk_prob. scratch holds
 * moe_route_scratch_floats(E). */
void moe_route(const parity_policy *pol, uint32_t n_experts, uint32_t k, int norm_topk,
               const float *logits, const uint16_t *replay, uint16_t *ids, float *weights,
               float *scratch);

/* One token's output of a sparse layer: out[h] for h < width from the k chosen experts' fp32
 * down-projection outputs y[s][h] (slot order, rows `width` apart), their ids and weights
 * (moe_route's), and, for a shared expert (y_shared not NULL), its fp32 down-projection output
 * and gate logit (the gate GEMM's output, rounded as GEMM outputs are). */
void moe_combine(const parity_policy *pol, size_t width, uint32_t k, const uint16_t *ids,
                 const float *weights, const float *y, const float *y_shared, float shared_gate,
                 float *out);

#endif /* PARITY_KERNELS_MOE_H */
