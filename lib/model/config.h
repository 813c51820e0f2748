/* A config's values: validation (lib/model/config.c) and the loops of a looped model. */
#ifndef PARITY_MODEL_CONFIG_H
#define PARITY_MODEL_CONFIG_H

#include <stdint.h>

#include "parity.h"

/* The most routed experts a mixture-of-experts model has (a routing record holds an expert as
 * 16 bits) and runs a token (moe_combine orders at most this many slots). */
#define CONFIG_MAX_EXPERTS 4096u
#define CONFIG_MAX_EXPERTS_PER_TOK 64u

/* Validates field values and shapes; the message names the field. */
int config_validate(const parity_config *c);

/* The loops a token runs through the layer stack: total_ut_steps (Ouro), 1 for the others. */
static inline uint32_t config_loops(const parity_config *c) {
    return c->total_ut_steps > 1 ? c->total_ut_steps : 1;
}

/* The KV cache's planes: one per (loop, layer), loop-major (plane t * layers + l, as HF's
 * UniversalTransformerCache and vLLM's Ouro index them). */
static inline uint32_t config_kv_planes(const parity_config *c) {
    return config_loops(c) * c->num_hidden_layers;
}

/* Mixture of experts: whether the architecture routes (Qwen3-MoE, Qwen2-MoE). */
static inline int config_is_moe(const parity_config *c) {
    return c->arch == PARITY_ARCH_QWEN3_MOE || c->arch == PARITY_ARCH_QWEN2_MOE;
}

/* Whether layer l of a mixture-of-experts model is sparse (router and experts) rather than a
 * dense MLP: transformers' and vLLM's rule, (l + 1) % decoder_sparse_step == 0 and l not in
 * mlp_only_layers. 0 for every layer of the other architectures. */
static inline int config_layer_is_sparse(const parity_config *c, uint32_t l) {
    return config_is_moe(c) && c->num_experts > 0 && c->decoder_sparse_step > 0 &&
           (l + 1) % c->decoder_sparse_step == 0 && l < 1024 &&
           !((c->mlp_only_layers[l / 64] >> (l % 64)) & 1u);
}

/* The number of sparse layers (the layers a routing record covers, in layer order). */
static inline uint32_t config_sparse_layers(const parity_config *c) {
    uint32_t n = 0;
    for (uint32_t l = 0; l < c->num_hidden_layers; l++) n += (uint32_t)config_layer_is_sparse(c, l);
    return n;
}

#endif
