/* A sparse layer's MLP block (moe_layer.c): the router, the experts run over the rows that
 * chose each, Qwen2-MoE's shared expert, and the combine. */
#ifndef PARITY_ENGINE_MOE_LAYER_H
#define PARITY_ENGINE_MOE_LAYER_H

#include <stddef.h>
#include <stdint.h>

#include "forward_types.h"
#include "model/model.h"

/* Sparse layer number `sparse` (its index among the sparse layers: where the rows' route
 * records and replays hold it) on s->xn [R][hidden], into s->delta: each row's router logits
 * (the gate GEMM, rounded), its k experts and weights (moe_route; the row's route_replay
 * where it has one, and route_record written), each expert's SwiGLU MLP over the rows that
 * chose it, the shared expert and its gate where the model has one, and the combine
 * (moe_combine). Every row's output is a function of that row alone. */
void layer_moe(const fwd_ctx *ctx, const layer_weights *w, uint32_t sparse, size_t R,
               const fwd_row *rows, double *t);

#endif /* PARITY_ENGINE_MOE_LAYER_H */
