/* The public query of a model's bytes (parity_model_bytes): what its weights take in memory,
 * and what one forward step under a policy reads of them, counted from the tensors the model
 * holds and the layout of the quantized copies (quant_weight_code_bytes). */
#include <pthread.h>
#include <stdio.h>
#include <string.h>

#include "base/errors.h"
#include "engine.h"
#include "kvcache.h"
#include "model/model.h"
#include "quant/quant_weight.h"
#include "quant/rules.h"

/* The bytes of a quantized weight of format `gemm`, codes and scales, as the model holds it. */
static uint64_t quant_bytes(uint32_t gemm, const weight *w) {
    const quant_format *f = quant_format_row(gemm);
    return quant_weight_code_bytes(f, w->rows, w->cols) +
           quant_weight_scale_bytes(f, w->rows, w->cols);
}

/* Adds what w holds to out->held, and to out->held_for_policy what serving pol with the
 * copies `need` (MODEL_NEED_*) keeps of it. */
static void count_held(const weight *w, const parity_policy *pol, int need,
                       parity_weight_bytes *out) {
    const uint64_t n = (uint64_t)w->rows * w->cols;
    uint64_t kept = 0, other = 0;
    /* a shipped weight's values are a copy too: a policy reading its codes as they are (its
     * format, bf16 compute: no fp32 or fp16 copies) keeps none */
    const int values_read = !w->shipped || need || pol->gemm != w->shipped_gemm;
    if (w->bf16) *(values_read ? &kept : &other) += 2 * n;
    if (w->master) *(values_read ? &kept : &other) += 4 * n;
    if (w->shipped) kept += quant_bytes(w->shipped_gemm, w);
    /* the norms and biases are widened when the model is made: every policy reads them */
    if (w->wide) *(w->rows == 1 || (need & MODEL_NEED_WIDE) ? &kept : &other) += 4 * n;
    if (w->fp16) *(need & MODEL_NEED_FP16 ? &kept : &other) += 4 * n;
    for (int q = 0; q < QUANTIZERS; q++)
        if (w->quant[q]) {
            const int read = pol->gemm != PARITY_GEMM_BF16 && q == pol->quantizer;
            *(read ? &kept : &other) += quant_bytes((uint32_t)quant_format_of(q), w);
        }
    out->held += kept + other;
    out->held_for_policy += kept;
}

/* Whether one token's step leaves the entry out: a routed expert past the first
 * num_experts_per_tok of its layer. A token runs that many of a sparse layer's experts, and
 * every expert of a layer has one shape and one format, so the first ones stand for whichever
 * the router picks. */
static int expert_not_run(const parity_config *c, const expected *e) {
    unsigned layer, expert;
    return sscanf(e->name, "model.layers.%u.mlp.experts.%u.", &layer, &expert) == 2 &&
           expert >= c->num_experts_per_tok;
}

/* Adds what one step under pol reads of w (an entry of the model's table) to out. */
static void count_step(const parity_model *m, const expected *e, const parity_policy *pol,
                       int need, parity_weight_bytes *out) {
    const weight *w = e->dst;
    const uint64_t n = (uint64_t)w->rows * w->cols;
    /* matrices: bf16 values, or fp32 (the fp16 values are held in fp32 too) */
    const uint64_t matrix = need ? 4 : 2;
    if (expert_not_run(&m->config, e)) return;
    /* Qwen2-MoE's shared expert gate, one row, is a GEMM's weight as the router is */
    if (w->rows == 1 && strstr(e->name, ".mlp.shared_expert_gate.")) {
        out->step_linear += matrix * n;
    } else if (w->rows == 1) {
        out->step_vectors += 4 * n;
    } else if (w == &m->embed) {
        out->embedding_row = (uint64_t)w->cols * (pol->compute == PARITY_COMPUTE_BF16 ? 2 : 4);
        if (m->config.tie_word_embeddings) out->step_head += matrix * n;
    } else if (w == &m->lm_head) {
        out->step_head += matrix * n;
    } else if (e->linear && pol->gemm != PARITY_GEMM_BF16 && !w->keep_bf16) {
        out->step_linear += quant_bytes(pol->gemm, w);
    } else {
        out->step_linear += matrix * n;
    }
}

int parity_model_bytes(const parity_model *model, const parity_policy *policy, uint32_t backend,
                       parity_weight_bytes *out) {
    clear_error();
    if (!model || !policy || !out)
        return set_error(PARITY_ERR_INVALID_ARGUMENT, "parity_model_bytes: NULL argument");
    if (out->size != sizeof *out)
        return set_error(PARITY_ERR_INVALID_ARGUMENT,
                         "parity_model_bytes: out->size is %u, this library expects %zu: set it "
                         "to sizeof(parity_weight_bytes)", out->size, sizeof *out);
    TRY(error_prefixed("parity_model_bytes", parity_policy_validate(policy)));
    if (!parity_backend_name((int)backend))
        return set_error(PARITY_ERR_INVALID_ARGUMENT, "parity_model_bytes: unknown backend %u "
                         "(bf16 = 0, openblas = 1, amx = 2)", (unsigned)backend);
    TRY(model_enter(model));
    parity_weight_bytes r;
    memset(&r, 0, sizeof r);
    r.size = sizeof r;
    const int need = engine_weight_needs(policy, backend);
    size_t n;
    const expected *t = model_tensors(model, &n);
    /* the copies are built under the prepare lock: their pointers are read under it */
    pthread_mutex_lock((pthread_mutex_t *)&model->prepare_lock);
    for (size_t i = 0; i < n; i++) {
        if (!t[i].dst->rows) continue; /* a tensor this model has not (a bias of Qwen3) */
        count_held(t[i].dst, policy, need, &r);
        count_step(model, &t[i], policy, need, &r);
    }
    pthread_mutex_unlock((pthread_mutex_t *)&model->prepare_lock);
    r.kv_position = kv_cache_bytes(&model->config, KV_BLOCK, kv_cells_fp32(policy)) / KV_BLOCK;
    model_leave(model);
    *out = r;
    return PARITY_OK;
}
