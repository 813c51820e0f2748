/*
 * The mixture-of-experts router and combine as public calls on caller-owned fp32 buffers
 * (parity_ops.h, "Forward pieces"): parity_moe_route and parity_moe_combine check their
 * arguments, then run lib/kernels/moe.c's moe_route and moe_combine row by row, the very
 * functions a sparse layer of the forward runs (lib/engine/moe_layer.c), so a host learner
 * that composes them with parity_linear and the region kernels gets the forward's bits.
 */

#include "args.h"
#include "base/alloc.h"
#include "base/errors.h"
#include "kernels/moe.h"
#include "model/config.h"

/* n_experts and k in range, and a router rule that means something with norm_topk_prob. */
static int check_experts(const char *fn, const parity_policy *policy, uint32_t n_experts,
                         uint32_t k, int norm_topk_prob) {
    if (n_experts < 1 || n_experts > CONFIG_MAX_EXPERTS)
        return set_error(PARITY_ERR_INVALID_ARGUMENT, "%s: n_experts %u is not in 1..%u", fn,
                         n_experts, CONFIG_MAX_EXPERTS);
    if (k < 1 || k > n_experts || k > CONFIG_MAX_EXPERTS_PER_TOK)
        return set_error(PARITY_ERR_INVALID_ARGUMENT,
                         "%s: k %u is not in 1..min(n_experts = %u, %u)", fn, k, n_experts,
                         CONFIG_MAX_EXPERTS_PER_TOK);
    if (policy && policy->moe_router == PARITY_MOE_ROUTER_TOPK_SOFTMAX && !norm_topk_prob)
        return set_error(PARITY_ERR_POLICY,
                         "%s: policy moe_router topk-softmax renormalises the chosen experts' "
                         "weights, and norm_topk_prob is 0", fn);
    return PARITY_OK;
}

/* Whether the byte ranges [a, a + a_bytes) and [b, b + b_bytes) share a byte (an output over
 * an input would be read after it was written). */
static int overlap(const void *a, size_t a_bytes, const void *b, size_t b_bytes) {
    if (!a || !b || !a_bytes || !b_bytes) return 0;
    const uintptr_t x = (uintptr_t)a, y = (uintptr_t)b;
    return x < y + b_bytes && y < x + a_bytes;
}

/* Row r's k expert ids: each below n_experts, none repeated. */
static int check_ids(const char *fn, size_t r, uint32_t n_experts, uint32_t k,
                     const uint16_t *ids) {
    for (uint32_t a = 0; a < k; a++) {
        if (ids[a] >= n_experts)
            return set_error(PARITY_ERR_INVALID_ARGUMENT,
                             "%s: row %zu: replayed expert %u in slot %u is not below "
                             "n_experts = %u",
                             fn, r, ids[a], a, n_experts);
        for (uint32_t b = 0; b < a; b++)
            if (ids[b] == ids[a])
                return set_error(PARITY_ERR_INVALID_ARGUMENT,
                                 "%s: row %zu: replayed expert %u is repeated (slots %u and %u)",
                                 fn, r, ids[a], b, a);
    }
    return PARITY_OK;
}

int parity_moe_route(const parity_policy *policy, size_t rows, uint32_t n_experts, uint32_t k,
                     int norm_topk_prob, const float *logits, size_t logits_stride,
                     const uint16_t *replay, uint16_t *ids, float *weights) {
    static const char fn[] = "parity_moe_route";
    clear_error();
    const arg_buf bufs[] = {{logits, "logits", 0, 0}, {ids, "ids", 0, 0},
                            {weights, "weights", 0, 0}};
    TRY(arg_buffers(fn, policy, sizeof bufs / sizeof bufs[0], bufs));
    TRY(check_experts(fn, policy, n_experts, k, norm_topk_prob));
    TRY(arg_shape(fn, rows, n_experts));
    TRY(arg_rows(fn, rows, n_experts, logits_stride, "logits"));
    const size_t logits_bytes = ((rows - 1) * logits_stride + n_experts) * sizeof(float),
                 ids_bytes = rows * k * sizeof(uint16_t), weights_bytes = rows * k * sizeof(float);
    if (overlap(weights, weights_bytes, logits, logits_bytes) ||
        overlap(ids, ids_bytes, logits, logits_bytes) ||
        overlap(ids, ids_bytes, weights, weights_bytes) ||
        overlap(weights, weights_bytes, replay, ids_bytes))
        return set_error(PARITY_ERR_INVALID_ARGUMENT,
                         "%s: ids, weights, logits and replay must not overlap (the outputs "
                         "would overwrite what the routing still reads)",
                         fn);
    if (replay)
        for (size_t r = 0; r < rows; r++)
            TRY(check_ids(fn, r, n_experts, k, replay + r * k));
    float *scratch = px_malloc(moe_route_scratch_floats(n_experts) * sizeof(float),
                               "routing scratch");
    if (!scratch) return PARITY_ERR_OUT_OF_MEMORY;
    for (size_t r = 0; r < rows; r++)
        moe_route(policy, n_experts, k, norm_topk_prob != 0, logits + r * logits_stride,
                  replay ? replay + r * k : NULL, ids + r * k, weights + r * k, scratch);
    px_free(scratch);
    return PARITY_OK;
}

int parity_moe_combine(const parity_policy *policy, size_t rows, size_t width, uint32_t k,
                       const uint16_t *ids, const float *weights, const float *y,
                       const float *y_shared, const float *shared_gate, float *out) {
    static const char fn[] = "parity_moe_combine";
    clear_error();
    const arg_buf bufs[] = {{ids, "ids", 0, 0}, {weights, "weights", 0, 0}, {y, "y", 0, 0},
                            {out, "out", 0, 0}};
    TRY(arg_buffers(fn, policy, sizeof bufs / sizeof bufs[0], bufs));
    TRY(arg_shape(fn, rows, width));
    if (k < 1 || k > CONFIG_MAX_EXPERTS_PER_TOK)
        return set_error(PARITY_ERR_INVALID_ARGUMENT, "%s: k %u is not in 1..%u", fn, k,
                         CONFIG_MAX_EXPERTS_PER_TOK);
    if (!y_shared != !shared_gate)
        return set_error(PARITY_ERR_INVALID_ARGUMENT,
                         "%s: y_shared and shared_gate go together (a shared expert has both)",
                         fn);
    TRY(arg_rows(fn, rows, k * width, k * width, "y"));
    const size_t out_bytes = rows * width * sizeof(float);
    if (overlap(out, out_bytes, y, rows * k * width * sizeof(float)) ||
        overlap(out, out_bytes, y_shared, out_bytes) ||
        overlap(out, out_bytes, weights, rows * k * sizeof(float)) ||
        overlap(out, out_bytes, ids, rows * k * sizeof(uint16_t)) ||
        overlap(out, out_bytes, shared_gate, rows * sizeof(float)))
        return set_error(PARITY_ERR_INVALID_ARGUMENT,
                         "%s: out overlaps an input (y, y_shared, weights, ids or shared_gate)",
                         fn);
    for (size_t r = 0; r < rows; r++)
        moe_combine(policy, width, k, ids + r * k, weights + r * k, y + r * k * width,
                    y_shared ? y_shared + r * width : NULL, y_shared ? shared_gate[r] : 0.0f,
                    out + r * width);
    return PARITY_OK;
}
