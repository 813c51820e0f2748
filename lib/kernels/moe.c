/* The mixture-of-experts router and combine (moe.h): plain C, one fixed order of every sum,
 * so every CPU path computes the same bits. The rules are parity.h's ("The policy in
 * detail", moe_router / moe_weights / moe_combine); the comments below name the framework
 * lines each follows. */
#include "moe.h"

#include <string.h>

#include "base/floats.h"
#include "kernels.h"

/* The policy's rounding point on one value: bf16, fp16, or none under PARITY_COMPUTE_FP32. */
static float round_point(const parity_policy *pol, float x) {
    return pol->compute == PARITY_COMPUTE_BF16   ? round_bf16(x)
           : pol->compute == PARITY_COMPUTE_FP16 ? round_fp16(x)
                                                 : x;
}

/* The k largest of v[n] into ids in slot order: descending value, ties to the lower index
 * (topk_softmax's "lower indices win"); `taken` (n floats) marks the chosen. A NaN never
 * displaces a value already held, so every slot still gets a distinct index. */
static void top_k(const float *v, uint32_t n, uint32_t k, uint16_t *ids, float *taken) {
    for (uint32_t e = 0; e < n; e++) taken[e] = 0.0f;
    for (uint32_t s = 0; s < k; s++) {
        uint32_t best = n;
        for (uint32_t e = 0; e < n; e++)
            if (taken[e] == 0.0f && (best == n || v[e] > v[best])) best = e;
        taken[best] = 1.0f;
        ids[s] = (uint16_t)best;
    }
}

void moe_route(const parity_policy *pol, uint32_t n_experts, uint32_t k, int norm_topk,
               const float *logits, const uint16_t *replay, uint16_t *ids, float *weights,
               float *scratch) {
    float *p = scratch, *taken = scratch + n_experts;
    if (pol->moe_router == PARITY_MOE_ROUTER_TOPK_SOFTMAX) {
        /* mistral-inference MoeLayer: `weights, selected = torch.topk(gate_logits, k)`,
         * `F.softmax(weights, dim=1, dtype=torch.float)`: the softmax over the k chosen */
        if (replay) memcpy(ids, replay, k * sizeof *ids);
        else top_k(logits, n_experts, k, ids, taken);
        float m = logits[ids[0]], sum = 0.0f;
        for (uint32_t s = 1; s < k; s++)
            if (logits[ids[s]] > m) m = logits[ids[s]];
        for (uint32_t s = 0; s < k; s++) sum += weights[s] = parity_expf(logits[ids[s]] - m);
        for (uint32_t s = 0; s < k; s++) weights[s] = weights[s] / sum;
    } else {
        /* softmax over all E in fp32 (every framework: `softmax(router_logits, dtype=float)`,
         * topk_softmax's fp32 row), the sum in ascending expert index */
        float m = logits[0], sum = 0.0f;
        for (uint32_t e = 1; e < n_experts; e++)
            if (logits[e] > m) m = logits[e];
        for (uint32_t e = 0; e < n_experts; e++) sum += p[e] = parity_expf(logits[e] - m);
        if (pol->moe_router == PARITY_MOE_ROUTER_HF) {
            for (uint32_t e = 0; e < n_experts; e++) p[e] = p[e] / sum; /* torch divides */
        } else {
            const float r = 1.0f / sum; /* `reciprocal_row_sum = 1.f / row_sum`, a product */
            for (uint32_t e = 0; e < n_experts; e++) p[e] = p[e] * r;
        }
        if (replay) memcpy(ids, replay, k * sizeof *ids);
        else top_k(p, n_experts, k, ids, taken);
        for (uint32_t s = 0; s < k; s++) weights[s] = p[ids[s]];
        if (norm_topk) {
            float chosen = 0.0f; /* the k chosen, summed in slot order */
            for (uint32_t s = 0; s < k; s++) chosen += weights[s];
            if (pol->moe_router == PARITY_MOE_ROUTER_HF) {
                /* `routing_weights /= routing_weights.sum(dim=-1, keepdim=True)` */
                for (uint32_t s = 0; s < k; s++) weights[s] = weights[s] / chosen;
            } else if (pol->moe_router == PARITY_MOE_ROUTER_VLLM) {
                /* `denom = selected_sum > 0.f ? selected_sum : 1.f; output / denom` */
                const float denom = chosen > 0.0f ? chosen : 1.0f;
                for (uint32_t s = 0; s < k; s++) weights[s] = weights[s] / denom;
            } else {
                /* SGLang: `row_sum_for_renormalize_inv = 1.f / row_sum`, then a product */
                const float inv = 1.0f / chosen;
                for (uint32_t s = 0; s < k; s++) weights[s] = weights[s] * inv;
            }
        }
    }
    /* transformers v4: `routing_weights.to(hidden_states.dtype)` */
    if (pol->moe_weights == PARITY_MOE_WEIGHTS_ROUNDED)
        for (uint32_t s = 0; s < k; s++) weights[s] = round_point(pol, weights[s]);
}

static float sigmoid(float g) { return 1.0f / (1.0f + parity_expf(-g)); }

void moe_combine(const parity_policy *pol, size_t width, uint32_t k, const uint16_t *ids,
                 const float *weights, const float *y, const float *y_shared, float shared_gate,
                 float *out) {
    /* the slots in ascending expert index, for transformers' loop over `expert_hit` */
    uint32_t order[64];
    for (uint32_t s = 0; s < k; s++) {
        uint32_t j = s;
        for (; j > 0 && ids[order[j - 1]] > ids[s]; j--) order[j] = order[j - 1];
        order[j] = s;
    }
    const int combine = pol->moe_combine;
    if (combine == PARITY_MOE_COMBINE_FP32) {
        const float gate = y_shared ? sigmoid(shared_gate) : 0.0f;
        for (size_t h = 0; h < width; h++) {
            float f = 0.0f;
            for (uint32_t s = 0; s < k; s++) f += y[s * width + h] * weights[s];
            if (y_shared) f += gate * y_shared[h];
            out[h] = round_point(pol, f);
        }
        return;
    }
    /* `F.sigmoid(self.shared_expert_gate(x))`, in the model's dtype */
    const float gate = y_shared ? round_point(pol, sigmoid(shared_gate)) : 0.0f;
    for (size_t h = 0; h < width; h++) {
        float a = 0.0f;
        if (combine == PARITY_MOE_COMBINE_HF) {
            /* `expert_layer(x) * routing_weights[...]` (bf16 output times the weight), then
             * `final_hidden_states.index_add_` expert by expert */
            for (uint32_t i = 0; i < k; i++) {
                const uint32_t s = order[i];
                a = round_point(pol, a + round_point(pol, round_point(pol, y[s * width + h]) *
                                                              weights[s]));
            }
        } else {
            /* the fused_moe epilogue `accumulator * moe_weight`, `.to(compute_type)` */
            const int bf16_fold = combine == PARITY_MOE_COMBINE_VLLM ? k <= 4 : k <= 2;
            if (combine == PARITY_MOE_COMBINE_SGLANG && k == 1) {
                a = round_point(pol, y[h] * weights[0]); /* the expert's output itself */
            } else if (bf16_fold) {
                /* vLLM moe_sum_kernel's `scalar_t x = 0.0; x += ...`; SGLang's torch.add */
                for (uint32_t s = 0; s < k; s++)
                    a = round_point(pol, a + round_point(pol, y[s * width + h] * weights[s]));
            } else {
                /* at::sum_out / _moe_sum_reduce_kernel: an fp32 sum, rounded once */
                for (uint32_t s = 0; s < k; s++)
                    a += round_point(pol, y[s * width + h] * weights[s]);
                a = round_point(pol, a);
            }
        }
        if (y_shared) {
            /* `... * shared_expert_output`, then `final_hidden_states + shared_expert_output` */
            a = round_point(pol, a + round_point(pol, gate * round_point(pol, y_shared[h])));
        }
        out[h] = a;
    }
}
