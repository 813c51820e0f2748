/* The model in memory: its blueprint (the tensors of an architecture, with their shapes), the
 * buffers it owns, its use lock, the copies of its weights built on demand (the values of
 * shipped codes, fp32, fp16, quantized), and synthetic models from a seed. Checkpoints are
 * loaded and saved in lib/checkpoint/ (load.c, save.c), above this folder. */
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/alloc.h"
#include "base/errors.h"
#include "base/floats.h"
#include "config.h"
#include "model.h"
#include "rope.h"
#include "weights.h"

/* ---- ownership ------------------------------------------------------------------------- */

/* Registers a buffer the model frees; on failure frees it and returns NULL. */
void *model_own(parity_model *m, void *p) {
    if (!p) return NULL;
    if (m->n_owned == m->cap_owned) {
        size_t cap = m->cap_owned ? 2 * m->cap_owned : 64;
        void **grown = px_realloc(m->owned, cap * sizeof *grown, "model buffer list");
        if (!grown) {
            px_free(p);
            return NULL;
        }
        m->owned = grown;
        m->cap_owned = cap;
    }
    m->owned[m->n_owned++] = p;
    return p;
}

/* ---- the tensors of an architecture ---------------------------------------------------- */

/* The next entry: a tensor of rows x cols (rows = 0: a vector) going to dst; its name is the
 * caller's to write. */
static expected *expect_entry(expected *e, size_t *n, weight *dst, uint32_t rows, uint32_t cols,
                              const char *shape_doc) {
    expected *x = &e[(*n)++];
    x->dst = dst;
    x->rows = rows;
    x->cols = cols;
    snprintf(x->shape_doc, sizeof x->shape_doc, "%s", shape_doc);
    x->linear = 0;
    return x;
}

/* The entry of the tensor named fmt % layer. */
static void expect(expected *e, size_t *n, weight *dst, uint32_t rows, uint32_t cols,
                   const char *shape_doc, const char *fmt, int layer) {
    expected *x = expect_entry(e, n, dst, rows, cols, shape_doc);
    snprintf(x->name, sizeof x->name, fmt, layer);
}

/* The last `count` entries are decoder linear weights: what the quantized formats quantize. */
static void mark_linear(expected *e, size_t n, size_t count) {
    for (size_t i = n - count; i < n; i++) e[i].linear = 1;
}

/* The tensors of sparse layer `layer`'s MLP: the router, each routed expert's three linear
 * weights (expert by expert, as the checkpoints' per-expert names come) and Qwen2-MoE's shared
 * expert and its gate. */
static void expect_moe(expected *e, size_t *n, parity_model *m, uint32_t layer) {
    const parity_config *c = &m->config;
    layer_weights *l = &m->layers[layer];
    const int li = (int)layer;
    char d_router[96], d_up[96], d_down[96], d_gate1[64];
    snprintf(d_router, sizeof d_router, "[num_experts=%u, hidden_size=%u]", c->num_experts,
             c->hidden_size);
    snprintf(d_up, sizeof d_up, "[moe_intermediate_size=%u, hidden_size=%u]",
             c->moe_intermediate_size, c->hidden_size);
    snprintf(d_down, sizeof d_down, "[hidden_size=%u, moe_intermediate_size=%u]", c->hidden_size,
             c->moe_intermediate_size);
    expect(e, n, &l->router, c->num_experts, c->hidden_size, d_router,
           "model.layers.%d.mlp.gate.weight", li);
    for (uint32_t x = 0; x < c->num_experts; x++) {
        const char *proj[] = {"gate_proj", "up_proj", "down_proj"};
        weight *dst[] = {&l->expert_gate[x], &l->expert_up[x], &l->expert_down[x]};
        const uint32_t I = c->moe_intermediate_size, H = c->hidden_size;
        const uint32_t rows[] = {I, I, H}, cols[] = {H, H, I};
        const char *const docs[] = {d_up, d_up, d_down};
        for (int j = 0; j < 3; j++) {
            expected *t = expect_entry(e, n, dst[j], rows[j], cols[j], docs[j]);
            snprintf(t->name, sizeof t->name, "model.layers.%d.mlp.experts.%u.%s.weight", li, x,
                     proj[j]);
        }
        mark_linear(e, *n, 3);
    }
    if (c->arch != PARITY_ARCH_QWEN2_MOE) return;
    const uint32_t si = c->shared_expert_intermediate_size;
    snprintf(d_up, sizeof d_up, "[shared_expert_intermediate_size=%u, hidden_size=%u]", si,
             c->hidden_size);
    snprintf(d_down, sizeof d_down, "[hidden_size=%u, shared_expert_intermediate_size=%u]",
             c->hidden_size, si);
    snprintf(d_gate1, sizeof d_gate1, "[1, hidden_size=%u]", c->hidden_size);
    expect(e, n, &l->shared_gate, si, c->hidden_size, d_up,
           "model.layers.%d.mlp.shared_expert.gate_proj.weight", li);
    expect(e, n, &l->shared_up, si, c->hidden_size, d_up,
           "model.layers.%d.mlp.shared_expert.up_proj.weight", li);
    expect(e, n, &l->shared_down, c->hidden_size, si, d_down,
           "model.layers.%d.mlp.shared_expert.down_proj.weight", li);
    mark_linear(e, *n, 3);
    expect(e, n, &l->shared_expert_gate, 1, c->hidden_size, d_gate1,
           "model.layers.%d.mlp.shared_expert_gate.weight", li);
}

/* Fills e (model_max_tensors entries) with the tensors of m's architecture; returns the count. */
static size_t build_tensor_table(parity_model *m, expected *e) {
    const parity_config *c = &m->config;
    uint32_t hd = c->head_dim, q = c->num_attention_heads * hd, kv = c->num_key_value_heads * hd;
    char d_q[96], d_kv[96], d_o[96], d_up[96], d_down[96], d_h[64], d_emb[96], d_hd[64],
        d_bq[64], d_bkv[64];
    snprintf(d_h, sizeof d_h, "[hidden_size=%u]", c->hidden_size);
    snprintf(d_emb, sizeof d_emb, "[vocab_size=%u, hidden_size=%u]", c->vocab_size, c->hidden_size);
    snprintf(d_q, sizeof d_q, "[num_attention_heads*head_dim=%u, hidden_size=%u]", q, c->hidden_size);
    snprintf(d_kv, sizeof d_kv, "[num_key_value_heads*head_dim=%u, hidden_size=%u]", kv,
             c->hidden_size);
    snprintf(d_o, sizeof d_o, "[hidden_size=%u, num_attention_heads*head_dim=%u]", c->hidden_size, q);
    snprintf(d_up, sizeof d_up, "[intermediate_size=%u, hidden_size=%u]", c->intermediate_size,
             c->hidden_size);
    snprintf(d_down, sizeof d_down, "[hidden_size=%u, intermediate_size=%u]", c->hidden_size,
             c->intermediate_size);
    snprintf(d_hd, sizeof d_hd, "[head_dim=%u]", hd);
    snprintf(d_bq, sizeof d_bq, "[num_attention_heads*head_dim=%u]", q);
    snprintf(d_bkv, sizeof d_bkv, "[num_key_value_heads*head_dim=%u]", kv);

    size_t n = 0;
    expect(e, &n, &m->embed, c->vocab_size, c->hidden_size, d_emb, "model.embed_tokens.weight", 0);
    for (uint32_t i = 0; i < c->num_hidden_layers; i++) {
        layer_weights *l = &m->layers[i];
        int li = (int)i;
        expect(e, &n, &l->attn_norm, 0, c->hidden_size, d_h, "model.layers.%d.input_layernorm.weight", li);
        expect(e, &n, &l->wq, q, c->hidden_size, d_q, "model.layers.%d.self_attn.q_proj.weight", li);
        expect(e, &n, &l->wk, kv, c->hidden_size, d_kv, "model.layers.%d.self_attn.k_proj.weight", li);
        expect(e, &n, &l->wv, kv, c->hidden_size, d_kv, "model.layers.%d.self_attn.v_proj.weight", li);
        expect(e, &n, &l->wo, c->hidden_size, q, d_o, "model.layers.%d.self_attn.o_proj.weight", li);
        mark_linear(e, n, 4);
        if (c->attention_bias) {
            expect(e, &n, &l->bq, 0, q, d_bq, "model.layers.%d.self_attn.q_proj.bias", li);
            expect(e, &n, &l->bk, 0, kv, d_bkv, "model.layers.%d.self_attn.k_proj.bias", li);
            expect(e, &n, &l->bv, 0, kv, d_bkv, "model.layers.%d.self_attn.v_proj.bias", li);
        }
        if (c->qk_norm) {
            expect(e, &n, &l->q_norm, 0, hd, d_hd, "model.layers.%d.self_attn.q_norm.weight", li);
            expect(e, &n, &l->k_norm, 0, hd, d_hd, "model.layers.%d.self_attn.k_norm.weight", li);
        }
        if (c->arch == PARITY_ARCH_OURO)
            expect(e, &n, &l->attn_out_norm, 0, c->hidden_size, d_h,
                   "model.layers.%d.input_layernorm_2.weight", li);
        expect(e, &n, &l->mlp_norm, 0, c->hidden_size, d_h,
               "model.layers.%d.post_attention_layernorm.weight", li);
        if (c->arch == PARITY_ARCH_OURO)
            expect(e, &n, &l->mlp_out_norm, 0, c->hidden_size, d_h,
                   "model.layers.%d.post_attention_layernorm_2.weight", li);
        if (!config_layer_is_sparse(c, i)) {
            expect(e, &n, &l->w_gate, c->intermediate_size, c->hidden_size, d_up,
                   "model.layers.%d.mlp.gate_proj.weight", li);
            expect(e, &n, &l->w_up, c->intermediate_size, c->hidden_size, d_up,
                   "model.layers.%d.mlp.up_proj.weight", li);
            expect(e, &n, &l->w_down, c->hidden_size, c->intermediate_size, d_down,
                   "model.layers.%d.mlp.down_proj.weight", li);
            mark_linear(e, n, 3);
        } else {
            expect_moe(e, &n, m, i);
        }
    }
    expect(e, &n, &m->final_norm, 0, c->hidden_size, d_h, "model.norm.weight", 0);
    if (c->early_exit_gate) {
        char d_gate[64];
        snprintf(d_gate, sizeof d_gate, "[1, hidden_size=%u]", c->hidden_size);
        expect(e, &n, &m->exit_gate, 1, c->hidden_size, d_gate, "model.early_exit_gate.weight", 0);
        expect(e, &n, &m->exit_gate_bias, 0, 1, "[1]", "model.early_exit_gate.bias", 0);
    }
    if (!c->tie_word_embeddings)
        expect(e, &n, &m->lm_head, c->vocab_size, c->hidden_size, d_emb, "lm_head.weight", 0);
    return n;
}

/* At most 15 tensors a layer (and 5 more per model), and a sparse layer's experts (3 each)
 * with its router and shared expert (5): room to spare. */
static size_t model_max_tensors(const parity_config *c) {
    return (16 + 3 * (size_t)c->num_experts + 5) * c->num_hidden_layers + 6;
}

const expected *model_find_tensor(const parity_model *m, const char *name) {
    for (size_t i = 0; i < m->n_tensors; i++)
        if (!strcmp(m->tensors[i].name, name)) return &m->tensors[i];
    return NULL;
}

parity_model *model_new(const parity_config *c) {
    parity_model *m = px_calloc(1, sizeof *m, "model");
    if (!m) return NULL;
    m->config = *c;
    pthread_mutex_init(&m->prepare_lock, NULL);
    pthread_rwlock_init(&m->use_lock, NULL);
    m->layers = px_calloc(c->num_hidden_layers, sizeof *m->layers, "model layers");
    const size_t n_sparse = config_sparse_layers(c);
    if (m->layers && n_sparse) {
        m->experts = px_calloc(3 * (size_t)c->num_experts * n_sparse, sizeof *m->experts,
                               "expert weights");
        for (uint32_t l = 0, s = 0; m->experts && l < c->num_hidden_layers; l++)
            if (config_layer_is_sparse(c, l)) {
                weight *x = m->experts + 3 * (size_t)c->num_experts * s++;
                m->layers[l].expert_gate = x;
                m->layers[l].expert_up = x + c->num_experts;
                m->layers[l].expert_down = x + 2 * (size_t)c->num_experts;
            }
    }
    m->tensors = m->layers && (m->experts || !n_sparse)
                     ? px_calloc(model_max_tensors(c), sizeof *m->tensors, "tensor table")
                     : NULL;
    if (!m->tensors) {
        px_free(m->experts);
        px_free(m->layers);
        pthread_mutex_destroy(&m->prepare_lock);
        pthread_rwlock_destroy(&m->use_lock);
        px_free(m);
        return NULL;
    }
    m->n_tensors = build_tensor_table(m, m->tensors);
    return m;
}

void parity_model_free(parity_model *m) {
    if (!m) return;
    for (size_t i = 0; i < m->n_owned; i++) px_free(m->owned[i]);
    px_free(m->owned);
    if (m->release_source) m->release_source(m);
    rope_tables_free(&m->rope);
    px_free(m->tensors);
    px_free(m->experts);
    px_free(m->layers);
    pthread_mutex_destroy(&m->prepare_lock);
    pthread_rwlock_destroy(&m->use_lock);
    px_free(m);
}

int model_owns(const parity_model *m, const void *p) {
    for (size_t i = 0; p && i < m->n_owned; i++)
        if (m->owned[i] == p) return 1;
    return 0;
}

void model_disown(parity_model *m, const void *p) {
    for (size_t i = 0; p && i < m->n_owned; i++)
        if (m->owned[i] == p) {
            px_free(m->owned[i]);
            m->owned[i] = m->owned[--m->n_owned];
            return;
        }
}

int model_enter(const parity_model *m) {
    if (pthread_rwlock_tryrdlock((pthread_rwlock_t *)&m->use_lock) != 0)
        return set_error(PARITY_ERR_BUSY, "the model's weights are being updated");
    return PARITY_OK;
}

void model_leave(const parity_model *m) { pthread_rwlock_unlock((pthread_rwlock_t *)&m->use_lock); }

const parity_config *parity_model_config(const parity_model *m) { return m ? &m->config : NULL; }

/* ---- the fp32 copies ------------------------------------------------------------------ */

static int widen(parity_model *m, weight *w) {
    if (w->wide || !w->bf16) return PARITY_OK;
    uint64_t n = (uint64_t)w->rows * w->cols;
    float *wide = model_own(m, px_huge_alloc(n * 4, "fp32 weights"));
    if (!wide) return PARITY_ERR_OUT_OF_MEMORY;
    weight_widen_into(w, wide);
    w->wide = wide;
    return PARITY_OK;
}

/* Widens the weights (all of them, or only the vectors: norms and biases, which the region
 * kernels always read in fp32). */
static int widen_weights(parity_model *m, int vectors_only) {
    int rc = PARITY_OK;
    for (size_t i = 0; i < m->n_tensors && !rc; i++) {
        weight *w = m->tensors[i].dst;
        if (!vectors_only || w->rows == 1) rc = widen(m, w);
    }
    if (m->config.tie_word_embeddings) m->lm_head.wide = m->embed.wide;
    return rc;
}

/* The fp16 copy of one weight; a value beyond fp16's range fails, naming the tensor. */
static int to_fp16(parity_model *m, weight *w, const char *name) {
    if (w->fp16 || !w->bf16) return PARITY_OK;
    TRY(weight_master_check(w, name, "an fp16-compute policy (the masters rounded to fp16)"));
    const uint64_t n = (uint64_t)w->rows * w->cols;
    float *fp16 = px_huge_alloc(n * 4, "fp16 weights (held in fp32)");
    if (!fp16) return PARITY_ERR_OUT_OF_MEMORY;
    weight_fp16_into(w, fp16);
    for (uint64_t i = 0; i < n; i++)
        if (isinf(fp16[i])) {
            px_free(fp16);
            return set_error(PARITY_ERR_TENSOR_NONFINITE,
                             "tensor '%s': element %" PRIu64 " is beyond fp16's range (|x| >= "
                             "65520 rounds to infinity), which the fp16 policy cannot hold",
                             name, i);
        }
    if (!model_own(m, fp16)) return PARITY_ERR_OUT_OF_MEMORY;
    w->fp16 = fp16;
    return PARITY_OK;
}

/* The fp16 copies of every tensor of the architecture (a tied lm_head shares embed's). */
static int fp16_weights(parity_model *m) {
    size_t n;
    const expected *t = model_tensors(m, &n);
    int rc = PARITY_OK;
    for (size_t i = 0; i < n && !rc; i++) rc = to_fp16(m, t[i].dst, t[i].name);
    if (!rc && m->config.tie_word_embeddings) m->lm_head.fp16 = m->embed.fp16;
    return rc;
}

/* ---- the values of shipped codes ------------------------------------------------------ */

/* w's dequantized values, built once (the caller holds the prepare lock). The fp32 and fp16
 * copies are then no longer ready for every weight: the next ask builds those of w. */
static int dequantize_shipped(parity_model *m, weight *w) {
    if (!w->shipped || w->bf16) return PARITY_OK;
    const uint64_t n = (uint64_t)w->rows * w->cols;
    float *master = model_own(m, px_huge_alloc(n * 4, "dequantized weights (fp32)"));
    uint16_t *bf16 = master ? model_own(m, px_huge_alloc(n * 2, "dequantized weights (bf16)"))
                            : NULL;
    if (!bf16) {
        model_disown(m, master);
        return PARITY_ERR_OUT_OF_MEMORY;
    }
    shipped_dequantize(w, master, bf16);
    w->master = master;
    w->bf16 = bf16;
    m->wide_ready = m->fp16_ready = 0;
    return PARITY_OK;
}

int model_weight_values(parity_model *m, weight *w) {
    pthread_mutex_lock(&m->prepare_lock);
    const int rc = dequantize_shipped(m, w);
    pthread_mutex_unlock(&m->prepare_lock);
    return rc;
}

quant_weight *quant_weight_alloc(parity_model *m, const weight *w, int quantizer) {
    const quant_format *f = quant_rule_of(quantizer)->format;
    quant_weight *q = model_own(m, px_calloc(1, sizeof *q, "quantized weight"));
    if (!q) return NULL;
    q->codes = model_own(m, px_huge_alloc(quant_weight_code_bytes(f, w->rows, w->cols),
                                          "quantized weight codes"));
    q->scales = q->codes ? model_own(m, px_huge_alloc(quant_weight_scale_bytes(f, w->rows, w->cols),
                                                      "quantized weight scales"))
                         : NULL;
    return q->scales ? q : NULL;
}

/* Whether model_prepare_quant makes a copy of w with `quantizer`: not where it has one, where
 * the checkpoint keeps it in bf16, or where it holds shipped codes the quantizer's format reads
 * as they are. */
static int quantizes(const weight *w, int quantizer) {
    return !w->quant[quantizer] && !w->keep_bf16 &&
           !(w->shipped && quant_format_of(quantizer) == w->shipped_gemm);
}

int quant_copies_unshipped(parity_model *m, const weight *w, int next,
                           quant_weight *fresh[QUANTIZERS], float **scratch) {
    size_t most = 0;
    for (int q = 0; q < QUANTIZERS; q++) {
        fresh[q] = NULL;
        const int format = quant_format_of(q);
        if (!w->shipped || format != w->shipped_gemm || format == next || !m->quant_ready[q] ||
            w->quant[q])
            continue;
        if (!(fresh[q] = quant_weight_alloc(m, w, q))) return PARITY_ERR_OUT_OF_MEMORY;
        const size_t f = quant_scratch_floats(w, q);
        if (f > most) most = f;
    }
    if (scratch && !(*scratch = px_malloc((most ? most : 1) * sizeof(float), "quantization rows")))
        return PARITY_ERR_OUT_OF_MEMORY;
    return PARITY_OK;
}

void quant_copies_install(weight *w, quant_weight *const fresh[QUANTIZERS], float *scratch) {
    for (int q = 0; q < QUANTIZERS; q++)
        if (fresh[q]) {
            quant_weight_quantize(w, q, fresh[q], scratch);
            w->quant[q] = fresh[q];
        }
}

int model_reads_master(const parity_model *m, const weight *w) {
    int quantized = 0;
    for (int q = 0; q < QUANTIZERS; q++) quantized |= w->quant[q] != NULL;
    return m->masters_read || w->fp16 || quantized;
}

int model_reserve_owned(parity_model *m, size_t more) {
    if (m->n_owned + more <= m->cap_owned) return 1;
    const size_t want = m->n_owned + more;
    void **grown = px_realloc(m->owned, want * sizeof *grown, "model buffer list");
    if (!grown) return 0;
    m->owned = grown;
    m->cap_owned = want;
    return 1;
}

int model_prepare_quant(parity_model *m, int quantizer) {
    if (quantizer < 0 || quantizer >= QUANTIZERS)
        return set_error(PARITY_ERR_POLICY, "quantizer %d is not defined", quantizer);
    pthread_mutex_lock(&m->prepare_lock);
    int rc = PARITY_OK;
    if (!m->quant_ready[quantizer]) {
        size_t most = 1; /* floats of the widened values a quantization reads */
        /* the decoder layers' linear weights (the table's `linear` entries); a failure leaves
         * some copies built: harmless, a retry reuses them */
        for (size_t i = 0; !rc && i < m->n_tensors; i++) {
            weight *w = m->tensors[i].dst;
            if (!m->tensors[i].linear) continue;
            if (quantizes(w, quantizer))
                rc = weight_master_check(w, m->tensors[i].name, "a quantized policy's quantizer");
            /* shipped codes of another format are quantized from their values */
            if (!rc && quantizes(w, quantizer)) rc = dequantize_shipped(m, w);
            const size_t f = quant_scratch_floats(w, quantizer);
            if (f > most) most = f;
        }
        float *scratch = rc ? NULL : px_malloc(most * sizeof(float), "quantization rows");
        if (!scratch && !rc) rc = PARITY_ERR_OUT_OF_MEMORY;
        for (size_t i = 0; !rc && i < m->n_tensors; i++) {
            weight *w = m->tensors[i].dst;
            if (!m->tensors[i].linear || !quantizes(w, quantizer)) continue;
            quant_weight *q = quant_weight_alloc(m, w, quantizer);
            if (!q) {
                rc = PARITY_ERR_OUT_OF_MEMORY;
                break;
            }
            quant_weight_quantize(w, quantizer, q, scratch);
            w->quant[quantizer] = q;
        }
        px_free(scratch);
        if (!rc) m->quant_ready[quantizer] = 1;
    }
    pthread_mutex_unlock(&m->prepare_lock);
    return rc;
}

int model_prepare(parity_model *m, int need) {
    if (!need) return PARITY_OK;
    pthread_mutex_lock(&m->prepare_lock);
    int rc = PARITY_OK;
    /* an fp32-compute policy reads every master: none may have been dropped, and updates keep
     * them from now on */
    for (size_t i = 0; (need & MODEL_NEED_MASTERS) && !m->masters_read && i < m->n_tensors && !rc;
         i++)
        rc = weight_master_check(m->tensors[i].dst, m->tensors[i].name,
                                 "an fp32-compute policy");
    if (!rc && (need & MODEL_NEED_MASTERS)) m->masters_read = 1;
    /* a failure leaves some copies built: harmless, a retry reuses them */
    for (size_t i = 0; (need & MODEL_NEED_VALUES) && i < m->n_tensors && !rc; i++)
        rc = dequantize_shipped(m, m->tensors[i].dst);
    if (!rc && (need & MODEL_NEED_WIDE) && !m->wide_ready) {
        rc = widen_weights(m, 0);
        if (!rc) m->wide_ready = 1;
    }
    if (!rc && (need & MODEL_NEED_FP16) && !m->fp16_ready) {
        rc = fp16_weights(m);
        if (!rc) m->fp16_ready = 1;
    }
    pthread_mutex_unlock(&m->prepare_lock);
    return rc;
}

/* The end of every way a model is made, once its weights are bound (rc == PARITY_OK) or not:
 * the tied head, the vectors widened to fp32 (the region kernels read norms and biases in
 * fp32), the RoPE tables; *out on success, everything freed on failure. */
int model_finish(parity_model *m, int rc, parity_model **out) {
    if (rc == PARITY_OK && m->config.tie_word_embeddings) m->lm_head = m->embed;
    if (rc == PARITY_OK) rc = widen_weights(m, 1);
    if (rc == PARITY_OK) rc = rope_tables_build(&m->config, m->config.max_position_embeddings, &m->rope);
    if (rc) {
        parity_model_free(m);
        return rc;
    }
    *out = m;
    return PARITY_OK;
}

/* ---- synthetic models ------------------------------------------------------------------ */

/* splitmix64: a counter-based generator, so every element's value depends only on (seed,
 * tensor, index). */
static uint64_t splitmix64(uint64_t x) {
    x += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

/* The standard normal quantile function at (i + 0.5) / 4096, i < 4096, tabulated once (by
 * bisection on erfc, in double): synthetic weights interpolate it, which is fast enough for
 * models of billions of parameters and normal to well within what synthetic weights need
 * (the tails are cut at about 3.7 sigma). */
#define NORMAL_TABLE 4096
static float normal_quantile[NORMAL_TABLE];
static pthread_once_t normal_once = PTHREAD_ONCE_INIT;

static void normal_table_build(void) {
    for (int i = 0; i < NORMAL_TABLE; i++) {
        const double p = (i + 0.5) / NORMAL_TABLE;
        double lo = -10, hi = 10;
        for (int it = 0; it < 100; it++) {
            double mid = 0.5 * (lo + hi);
            if (0.5 * erfc(-mid / sqrt(2.0)) < p) lo = mid;
            else hi = mid;
        }
        normal_quantile[i] = (float)(0.5 * (lo + hi));
    }
}

/* Fills n bf16 values with mean + std * N(0,1): 12 random bits pick a table interval, 20 more
 * the point within it. */
static void fill_normal(uint16_t *dst, uint64_t n, uint64_t key, float mean, float std) {
    pthread_once(&normal_once, normal_table_build);
    for (uint64_t i = 0; i < n; i++) {
        const uint64_t r = splitmix64(key + i);
        const uint32_t idx = (uint32_t)(r >> 52);
        const float frac = (float)((r >> 32) & 0xfffffu) * (1.0f / 1048576.0f);
        const float lo = normal_quantile[idx];
        const float hi = idx + 1 < NORMAL_TABLE ? normal_quantile[idx + 1] : lo;
        dst[i] = bf16_from_f32(mean + std * (lo + frac * (hi - lo)));
    }
}

int parity_model_synthetic(const parity_config *config, uint64_t seed, parity_model **out) {
    clear_error();
    if (!config || !out) return set_error(PARITY_ERR_INVALID_ARGUMENT, "config or output is NULL");
    TRY(config_validate(config));
    parity_model *m = model_new(config);
    if (!m) return PARITY_ERR_OUT_OF_MEMORY;
    size_t n;
    const expected *e = model_tensors(m, &n);
    int rc = PARITY_OK;
    for (size_t i = 0; i < n && rc == PARITY_OK; i++) {
        uint64_t rows = e[i].rows ? e[i].rows : 1, count = rows * e[i].cols;
        uint16_t *data = model_own(m, px_huge_alloc(count * 2, e[i].name));
        if (!data) {
            rc = PARITY_ERR_OUT_OF_MEMORY;
            break;
        }
        /* norm weights are vectors named *norm.weight: near 1 */
        size_t len = strlen(e[i].name);
        int is_norm = len > 11 && !strcmp(e[i].name + len - 11, "norm.weight");
        fill_normal(data, count, splitmix64(splitmix64(seed) ^ (0x1000 + i)), is_norm ? 1.0f : 0.0f,
                    0.02f);
        e[i].dst->rows = (uint32_t)rows;
        e[i].dst->cols = e[i].cols;
        e[i].dst->bf16 = data;
    }
    return model_finish(m, rc, out);
}
