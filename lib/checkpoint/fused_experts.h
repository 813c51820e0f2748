/* The fused expert tensors newer transformers (v5) writes for a mixture-of-experts layer, read
 * when a checkpoint is loaded (fused_experts.c): per sparse layer L,
 * "model.layers.L.mlp.experts.gate_up_proj" [num_experts, 2 * moe_intermediate_size,
 * hidden_size] (each expert's gate_proj rows, then its up_proj rows) and
 * "model.layers.L.mlp.experts.down_proj" [num_experts, hidden_size, moe_intermediate_size], in
 * place of the per-expert "mlp.experts.N.{gate,up,down}_proj.weight" the hub checkpoints ship.
 * Each routed expert's three weights are bound to views into them (load.c); a save writes the
 * per-expert names back (save.c goes by the blueprint). */
#ifndef PARITY_FUSED_EXPERTS_H
#define PARITY_FUSED_EXPERTS_H

#include <stdint.h>

#include "model/model.h"
#include "safetensors.h"

/* A sparse layer's fused tensors; both NULL where its experts are per-expert tensors. */
typedef struct fused_layer {
    uint32_t layer;
    const st_file *gate_up_file, *down_file;
    const st_tensor *gate_up, *down;
} fused_layer;

/* Where a routed expert's weight lies in its layer's fused tensor: a [rows, cols] matrix from
 * element `offset` on. */
typedef struct fused_view {
    const st_file *file;
    const st_tensor *tensor;
    uint64_t shape[2];
    uint64_t offset;
    uint32_t expert;
    const char *part;      /* "gate_proj", "up_proj" or "down_proj" */
} fused_view;

/* The fused tensors of each of m's sparse layers in its mapped files (*out: an array of
 * config_sparse_layers(&m->config) entries, px_free it; NULL, nothing allocated, where no layer
 * has any), each checked: both there, of the shapes above and a weight dtype, and no per-expert
 * tensor of the same layer beside them; in a quantized checkpoint (`quantized`) refused. Sets
 * the error naming the tensor at fault. */
int fused_experts_find(const parity_model *m, int quantized, fused_layer **out);
/* Whether table entry e is a routed expert's weight of a layer in `fused` whose experts are
 * fused; if so *view says where it lies. */
int fused_expert_view(const parity_model *m, const fused_layer *fused, const expected *e,
                      fused_view *view);
/* Whether NAME is one of the fused tensors in `fused` (NULL: none). */
int fused_experts_hold(const parity_model *m, const fused_layer *fused, const char *name);

#endif
