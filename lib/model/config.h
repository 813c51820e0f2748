/* A config's values: validation (lib/model/config.c) and the loops of a looped model. */
#ifndef PARITY_MODEL_CONFIG_H
#define PARITY_MODEL_CONFIG_H

#include <stdint.h>

#include "parity.h"

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

#endif
