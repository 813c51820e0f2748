/* Transformers v5's fused expert tensors (fused_experts.h): finding and checking them in a
 * checkpoint's files, and where each routed expert's weight lies in them. The layout is
 * Qwen2MoeExperts' (modular_qwen2_moe.py, inherited by Qwen3MoeExperts): gate_up_proj =
 * nn.Parameter(torch.empty(num_experts, 2 * intermediate_dim, hidden_dim)), its forward
 * `gate, up = linear(x, gate_up_proj[e]).chunk(2, dim=-1)` (so expert e's gate_proj is rows
 * 0..I-1 of gate_up_proj[e], its up_proj rows I..2I-1), and down_proj = (num_experts,
 * hidden_dim, intermediate_dim); conversion_mapping.py builds it from the per-expert names by
 * stacking over the experts (MergeModulelist(dim=0)) and concatenating gate and up
 * (Concatenate(dim=1)). Not transposed: GptOss's [E, H, 2I] is another model's. */
#include <inttypes.h>
#include <stdio.h>
#include <string.h>

#include "base/alloc.h"
#include "base/errors.h"
#include "fused_experts.h"
#include "model/config.h"
#include "quant_config.h"

static const char *const expert_parts[3] = {"gate_proj", "up_proj", "down_proj"};

/* A fused tensor's dtype is a weight dtype and its shape [d0, d1, d2] (shape_doc says how the
 * config makes it). A dtype is checked as tensor_import checks a weight's, after the shape. */
static int check_fused_tensor(const st_file *f, const st_tensor *t, uint64_t d0, uint64_t d1,
                              uint64_t d2, const char *shape_doc) {
    if (t->ndim != 3)
        return set_error(PARITY_ERR_TENSOR_SHAPE,
                         "%s: tensor '%s' has %u dimensions, not 3: the config makes it %s",
                         f->path, t->name, t->ndim, shape_doc);
    if (t->shape[0] != d0 || t->shape[1] != d1 || t->shape[2] != d2)
        return set_error(PARITY_ERR_TENSOR_SHAPE,
                         "%s: tensor '%s' has shape [%" PRIu64 ", %" PRIu64 ", %" PRIu64
                         "], the config makes it %s",
                         f->path, t->name, t->shape[0], t->shape[1], t->shape[2], shape_doc);
    if (t->dtype != ST_BF16 && t->dtype != ST_F16 && t->dtype != ST_F32)
        return set_error(PARITY_ERR_TENSOR_DTYPE,
                         "%s: tensor '%s': dtype %s is not a weight dtype (BF16, F16 or F32)",
                         f->path, t->name, st_dtype_name(t->dtype));
    return PARITY_OK;
}

/* The checks of a layer that has a fused tensor (fused_experts_find). */
static int check_fused_layer(const parity_model *m, const fused_layer *fl, int quantized) {
    const parity_config *c = &m->config;
    const st_tensor *some = fl->gate_up ? fl->gate_up : fl->down;
    const st_file *some_file = fl->gate_up ? fl->gate_up_file : fl->down_file;
    /* the layouts' codes and scales are per weight; a quantized fused tensor is left for when
     * a checkpoint that ships one is seen */
    if (quantized)
        return set_error(PARITY_ERR_UNSUPPORTED,
                         "%s: tensor '%s': fused expert tensors (transformers v5's layout) are not "
                         "supported in a quantized checkpoint (quant_method %s); per-expert "
                         "tensors (mlp.experts.N.gate_proj.weight, ...) are",
                         some_file->path, some->name, quant_method_name(m->ckpt.method));
    /* the one without the other leaves half the experts' weights absent: MISSING, naming
     * the absent tensor */
    if (!fl->gate_up || !fl->down)
        return set_error(PARITY_ERR_TENSOR_MISSING,
                         "%s: tensor 'model.layers.%u.mlp.experts.%s' is missing: layer %u's "
                         "experts are fused (transformers v5's layout: '%s' is there), which "
                         "takes both gate_up_proj and down_proj",
                         some_file->path, fl->layer, fl->gate_up ? "down_proj" : "gate_up_proj",
                         fl->layer, some->name);
    const uint64_t E = c->num_experts, I = c->moe_intermediate_size, H = c->hidden_size;
    char doc[128];
    snprintf(doc, sizeof doc,
             "[num_experts=%" PRIu64 ", 2 x moe_intermediate_size=%" PRIu64 ", hidden_size=%" PRIu64
             "]",
             E, 2 * I, H);
    TRY(check_fused_tensor(fl->gate_up_file, fl->gate_up, E, 2 * I, H, doc));
    snprintf(doc, sizeof doc,
             "[num_experts=%" PRIu64 ", hidden_size=%" PRIu64 ", moe_intermediate_size=%" PRIu64
             "]",
             E, H, I);
    TRY(check_fused_tensor(fl->down_file, fl->down, E, H, I, doc));
    /* an expert's weight stored both ways: the per-expert tensor is one this model does not
     * read (its values come from the fused tensor), so UNEXPECTED, as any tensor the
     * architecture does not use; ST_DUPLICATE is one name twice, and these names differ */
    for (uint32_t x = 0; x < c->num_experts; x++)
        for (int p = 0; p < 3; p++) {
            char name[128];
            snprintf(name, sizeof name, "model.layers.%u.mlp.experts.%u.%s.weight", fl->layer, x,
                     expert_parts[p]);
            const st_file *f;
            if (st_find_in(m->files, m->n_files, name, &f))
                return set_error(PARITY_ERR_TENSOR_UNEXPECTED,
                                 "%s: tensor '%s' is there beside the fused '%s': layer %u's "
                                 "experts are stored both per expert and fused",
                                 f->path, name, p == 2 ? fl->down->name : fl->gate_up->name,
                                 fl->layer);
        }
    return PARITY_OK;
}

int fused_experts_find(const parity_model *m, int quantized, fused_layer **out) {
    const parity_config *c = &m->config;
    *out = NULL;
    fused_layer *layers = NULL;
    int rc = PARITY_OK;
    for (uint32_t l = 0, s = 0; l < c->num_hidden_layers && rc == PARITY_OK; l++) {
        if (!config_layer_is_sparse(c, l)) continue;
        fused_layer fl = {.layer = l};
        char name[96];
        snprintf(name, sizeof name, "model.layers.%u.mlp.experts.gate_up_proj", l);
        fl.gate_up = st_find_in(m->files, m->n_files, name, &fl.gate_up_file);
        snprintf(name, sizeof name, "model.layers.%u.mlp.experts.down_proj", l);
        fl.down = st_find_in(m->files, m->n_files, name, &fl.down_file);
        if (fl.gate_up || fl.down) {
            rc = check_fused_layer(m, &fl, quantized);
            if (rc == PARITY_OK && !layers) {
                layers = px_calloc(config_sparse_layers(c), sizeof *layers, "fused expert tensors");
                if (!layers) rc = PARITY_ERR_OUT_OF_MEMORY;
            }
            if (rc == PARITY_OK) layers[s] = fl;
        }
        s++;
    }
    if (rc != PARITY_OK) {
        px_free(layers);
        return rc;
    }
    *out = layers;
    return PARITY_OK;
}

/* The index of w among m's routed experts' weights (m->experts: each sparse layer's gate_proj,
 * up_proj and down_proj weights, num_experts of each), or -1 for another weight. */
static int64_t expert_index(const parity_model *m, const weight *w) {
    const parity_config *c = &m->config;
    const uint64_t count = 3 * (uint64_t)c->num_experts * config_sparse_layers(c);
    const uintptr_t at = (uintptr_t)w, base = (uintptr_t)m->experts;
    if (!m->experts || at < base || at >= base + count * sizeof *w) return -1;
    return (int64_t)((at - base) / sizeof *w);
}

int fused_expert_view(const parity_model *m, const fused_layer *fused, const expected *e,
                      fused_view *view) {
    const int64_t k = fused ? expert_index(m, e->dst) : -1;
    if (k < 0) return 0;
    const uint64_t E = m->config.num_experts, I = m->config.moe_intermediate_size,
                   H = m->config.hidden_size;
    const fused_layer *fl = &fused[(uint64_t)k / (3 * E)];
    if (!fl->gate_up) return 0;
    const uint32_t part = (uint32_t)((uint64_t)k % (3 * E) / E), x = (uint32_t)((uint64_t)k % E);
    /* gate_proj: rows 0..I-1 of gate_up_proj[x], up_proj: rows I..2I-1; down_proj[x] */
    if (part < 2)
        *view = (fused_view){fl->gate_up_file, fl->gate_up, {I, H}, (x * 2 * I + part * I) * H,
                             x, expert_parts[part]};
    else
        *view = (fused_view){fl->down_file, fl->down, {H, I}, x * H * I, x, expert_parts[part]};
    return 1;
}

int fused_experts_hold(const parity_model *m, const fused_layer *fused, const char *name) {
    const uint32_t n = fused ? config_sparse_layers(&m->config) : 0;
    for (uint32_t s = 0; s < n; s++)
        if (fused[s].gate_up &&
            (!strcmp(fused[s].gate_up->name, name) || !strcmp(fused[s].down->name, name)))
            return 1;
    return 0;
}
