/* Models: loading a Hugging Face checkpoint (single file or shards), binding its tensors to
 * the blueprint with every shape checked, synthetic models from a seed, saving. */
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/internal.h"
#include "checkpoint/json.h"
#include "model.h"
#include "checkpoint/safetensors.h"
#include "quant/codecs.h"

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

static void expect(expected *e, size_t *n, weight *dst, uint32_t rows, uint32_t cols,
                   const char *shape_doc, const char *fmt, int layer) {
    expected *x = &e[(*n)++];
    snprintf(x->name, sizeof x->name, fmt, layer);
    x->dst = dst;
    x->rows = rows;
    x->cols = cols;
    snprintf(x->shape_doc, sizeof x->shape_doc, "%s", shape_doc);
    x->linear = 0;
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
        expect(e, &n, &l->w_gate, c->intermediate_size, c->hidden_size, d_up,
               "model.layers.%d.mlp.gate_proj.weight", li);
        expect(e, &n, &l->w_up, c->intermediate_size, c->hidden_size, d_up,
               "model.layers.%d.mlp.up_proj.weight", li);
        expect(e, &n, &l->w_down, c->hidden_size, c->intermediate_size, d_down,
               "model.layers.%d.mlp.down_proj.weight", li);
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
    /* the decoder layers' linear weights: what the fp8 formats quantize */
    for (size_t i = 0; i < n; i++) {
        const weight *d = e[i].dst;
        for (uint32_t l = 0; l < c->num_hidden_layers; l++) {
            const layer_weights *lw = &m->layers[l];
            if (d == &lw->wq || d == &lw->wk || d == &lw->wv || d == &lw->wo || d == &lw->w_gate ||
                d == &lw->w_up || d == &lw->w_down)
                e[i].linear = 1;
        }
    }
    return n;
}

/* At most 15 tensors a layer (and 5 more per model): room to spare. */
static size_t model_max_tensors(const parity_config *c) { return 16 * (size_t)c->num_hidden_layers + 6; }

const expected *model_find_tensor(const parity_model *m, const char *name) {
    for (size_t i = 0; i < m->n_tensors; i++)
        if (!strcmp(m->tensors[i].name, name)) return &m->tensors[i];
    return NULL;
}

static parity_model *model_new(const parity_config *c) {
    parity_model *m = px_calloc(1, sizeof *m, "model");
    if (!m) return NULL;
    m->config = *c;
    pthread_mutex_init(&m->prepare_lock, NULL);
    pthread_rwlock_init(&m->use_lock, NULL);
    m->layers = px_calloc(c->num_hidden_layers, sizeof *m->layers, "model layers");
    m->tensors = m->layers ? px_calloc(model_max_tensors(c), sizeof *m->tensors, "tensor table") : NULL;
    if (!m->tensors) {
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
    for (size_t i = 0; i < m->n_files; i++) st_close(m->files[i]);
    px_free(m->files);
    rope_tables_free(&m->rope);
    quant_checkpoint_free(&m->ckpt);
    px_free(m->tensors);
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

/* Tensors a checkpoint may carry that the forward does not read. */
static int ignorable(const parity_model *m, const char *name) {
    size_t n = strlen(name);
    const char *inv = "rotary_emb.inv_freq";
    if (n >= strlen(inv) && !strcmp(name + n - strlen(inv), inv)) return 1;
    /* tied models: some writers also store the (identical) lm_head */
    return m->config.tie_word_embeddings && !strcmp(name, "lm_head.weight");
}

/* ---- binding a checkpoint tensor ------------------------------------------------------- */

static int bind_tensor(parity_model *m, const st_file *f, const st_tensor *t, const expected *e) {
    char where[512];
    snprintf(where, sizeof where, "%s: tensor '%s'", f->path, t->name);
    const uint32_t dtype = t->dtype == ST_BF16  ? PARITY_DTYPE_BF16
                           : t->dtype == ST_F16 ? PARITY_DTYPE_F16
                           : t->dtype == ST_F32 ? PARITY_DTYPE_F32
                                                : UINT32_MAX;
    const tensor_source src = {where, dtype, st_dtype_name(t->dtype), t->ndim, t->shape, t->data, 1};
    tensor_values v;
    int rc = tensor_import(&src, e, &v);
    if (rc) return rc;
    /* the model frees what the import allocated (model_own frees it if it cannot) */
    void *owned1 = v.owned[1];
    if (v.owned[0] && !model_own(m, v.owned[0])) {
        px_free(owned1);
        return PARITY_ERR_OUT_OF_MEMORY;
    }
    if (owned1 && !model_own(m, owned1)) return PARITY_ERR_OUT_OF_MEMORY;
    weight *w = e->dst;
    w->rows = e->rows ? e->rows : 1;
    w->cols = e->cols;
    w->bf16 = v.bf16;
    w->master = v.master;
    return PARITY_OK;
}

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

/* The decoder layers' linear weights: what an fp8 gemm quantizes (the embedding, lm_head,
 * norms and biases stay as they are). */
static size_t linear_weights_of(parity_model *m, uint32_t layer, weight **out) {
    layer_weights *l = &m->layers[layer];
    weight *ws[] = {&l->wq, &l->wk, &l->wv, &l->wo, &l->w_gate, &l->w_up, &l->w_down};
    for (size_t j = 0; j < 7; j++) out[j] = ws[j];
    return 7;
}

quant_weight *quant_weight_alloc(parity_model *m, const weight *w, int quantizer) {
    const uint64_t n = (uint64_t)w->rows * w->cols;
    const uint64_t scales = quant_scale_count(quant_rule_of(quantizer)->format, w->rows, w->cols);
    quant_weight *q = model_own(m, px_calloc(1, sizeof *q, "quantized weight"));
    if (!q) return NULL;
    q->codes = model_own(m, px_huge_alloc(n, "quantized weight codes"));
    q->scales = q->codes ? model_own(m, px_huge_alloc(scales * sizeof(float),
                                                          "quantized weight scales"))
                         : NULL;
    return q->scales ? q : NULL;
}

int model_prepare_quant(parity_model *m, int quantizer) {
    if (quantizer < 0 || quantizer >= QUANTIZERS)
        return set_error(PARITY_ERR_POLICY, "quantizer %d is not defined", quantizer);
    pthread_mutex_lock(&m->prepare_lock);
    int rc = PARITY_OK;
    if (!m->quant_ready[quantizer]) {
        const parity_config *c = &m->config;
        size_t most = 1; /* floats of the widened values a quantization reads */
        for (uint32_t i = 0; i < c->num_hidden_layers; i++) {
            weight *ws[7];
            const size_t n = linear_weights_of(m, i, ws);
            for (size_t j = 0; j < n; j++) {
                const size_t f = quant_scratch_floats(ws[j], quantizer);
                if (f > most) most = f;
            }
        }
        float *scratch = px_malloc(most * sizeof(float), "quantization rows");
        if (!scratch) rc = PARITY_ERR_OUT_OF_MEMORY;
        /* a failure leaves some copies built: harmless, a retry reuses them */
        for (uint32_t i = 0; !rc && i < c->num_hidden_layers; i++) {
            weight *ws[7];
            const size_t n = linear_weights_of(m, i, ws);
            for (size_t j = 0; !rc && j < n; j++) {
                /* kept in bf16 by the checkpoint, or shipped codes the policy's format reads */
                if (ws[j]->quant[quantizer] || ws[j]->keep_bf16 ||
                    (ws[j]->shipped && quant_format_of(quantizer) == ws[j]->shipped_gemm))
                    continue;
                quant_weight *q = quant_weight_alloc(m, ws[j], quantizer);
                if (!q) {
                    rc = PARITY_ERR_OUT_OF_MEMORY;
                    break;
                }
                quant_weight_quantize(ws[j], quantizer, q, scratch);
                ws[j]->quant[quantizer] = q;
            }
        }
        px_free(scratch);
        if (!rc) m->quant_ready[quantizer] = 1;
    }
    pthread_mutex_unlock(&m->prepare_lock);
    return rc;
}

int model_prepare(parity_model *m, int need) {
    if (!(need & (MODEL_NEED_WIDE | MODEL_NEED_FP16))) return PARITY_OK;
    pthread_mutex_lock(&m->prepare_lock);
    int rc = PARITY_OK;
    /* a failure leaves some copies built: harmless, a retry reuses them */
    if ((need & MODEL_NEED_WIDE) && !m->wide_ready) {
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

/* ---- files --------------------------------------------------------------------------- */

static int read_text_file(const char *path, size_t limit, char **out, size_t *len) {
    FILE *fp = fopen(path, "rb");
    if (!fp) return set_error(PARITY_ERR_IO, "%s: cannot open: %s", path, strerror(errno));
    char *buf = NULL;
    size_t n = 0, cap = 0;
    for (;;) {
        if (n == cap) {
            if (cap >= limit) {
                fclose(fp);
                px_free(buf);
                return set_error(PARITY_ERR_INDEX, "%s: larger than %zu bytes", path, limit);
            }
            cap = cap ? 2 * cap : 4096;
            char *grown = px_realloc(buf, cap, path);
            if (!grown) {
                fclose(fp);
                px_free(buf);
                return PARITY_ERR_OUT_OF_MEMORY;
            }
            buf = grown;
        }
        size_t got = fread(buf + n, 1, cap - n, fp);
        n += got;
        if (got == 0) break;
    }
    int err = ferror(fp);
    fclose(fp);
    if (err) {
        px_free(buf);
        return set_error(PARITY_ERR_IO, "%s: read error", path);
    }
    *out = buf;
    *len = n;
    return PARITY_OK;
}

static int file_exists(const char *path) {
    struct stat st;
    return stat(path, &st) == 0;
}

static int add_file(parity_model *m, st_file *f) {
    st_file **grown = px_realloc(m->files, (m->n_files + 1) * sizeof *grown, "model file list");
    if (!grown) {
        st_close(f);
        return PARITY_ERR_OUT_OF_MEMORY;
    }
    m->files = grown;
    m->files[m->n_files++] = f;
    return PARITY_OK;
}

/* A shard name from an index must be a plain file name in the checkpoint directory. */
static int shard_name_ok(const char *s, size_t len) {
    if (len == 0 || len > 255 || strlen(s) != len) return 0;
    if (!strcmp(s, ".") || !strcmp(s, "..")) return 0;
    return strchr(s, '/') == NULL;
}

/* Opens the shards named by model.safetensors.index.json and checks that the map and the
 * shards agree: every mapped tensor is in its shard, every shard tensor is in the map. */
static int open_sharded(parity_model *m, const char *dir, const char *index_path) {
    char *text = NULL;
    size_t len = 0;
    int rc = read_text_file(index_path, 64u << 20, &text, &len);
    if (rc) return rc;
    json_doc *doc;
    char err[256];
    rc = json_parse(text, len, &doc, err, sizeof err);
    px_free(text);
    if (rc == PARITY_ERR_OUT_OF_MEMORY) return set_error(rc, "%s: out of memory parsing", index_path);
    if (rc) return set_error(PARITY_ERR_JSON_SYNTAX, "%s: %s", index_path, err);
    const json_value *map = json_get(json_doc_root(doc), "weight_map");
    if (!map || map->type != JSON_OBJECT) {
        json_free(doc);
        return set_error(PARITY_ERR_INDEX, "%s: no \"weight_map\" object", index_path);
    }
    long dup = json_find_duplicate_key(map);
    if (dup >= 0) {
        rc = set_error(PARITY_ERR_ST_DUPLICATE, "%s: tensor '%s' appears twice in weight_map",
                       index_path, map->keys[dup]);
        json_free(doc);
        return rc;
    }
    /* open each distinct shard once, in order of first mention */
    for (size_t i = 0; i < map->count && rc == PARITY_OK; i++) {
        const json_value *v = &map->items[i];
        if (v->type != JSON_STRING || !shard_name_ok(v->str, v->len)) {
            rc = set_error(PARITY_ERR_INDEX,
                           "%s: tensor '%s': shard must be a file name in the checkpoint "
                           "directory",
                           index_path, map->keys[i]);
            break;
        }
        int seen = 0;
        for (size_t j = 0; j < i && !seen; j++) seen = !strcmp(map->items[j].str, v->str);
        if (seen) continue;
        size_t plen = strlen(dir) + 1 + v->len + 1;
        char *path = px_malloc(plen, "shard path");
        if (!path) {
            rc = PARITY_ERR_OUT_OF_MEMORY;
            break;
        }
        snprintf(path, plen, "%s/%s", dir, v->str);
        if (!file_exists(path)) {
            rc = set_error(PARITY_ERR_INDEX, "%s: shard '%s' (tensor '%s') does not exist",
                           index_path, v->str, map->keys[i]);
            px_free(path);
            break;
        }
        st_file *f;
        rc = st_open(path, &f);
        px_free(path);
        if (rc == PARITY_OK) rc = add_file(m, f);
    }
    /* every tensor of every shard is in no other shard, and mapped to this one */
    for (size_t fi = 0; fi < m->n_files && rc == PARITY_OK; fi++) {
        const st_file *f = m->files[fi];
        const char *base = strrchr(f->path, '/') + 1;
        for (size_t t = 0; t < f->n_tensors && rc == PARITY_OK; t++) {
            for (size_t g = 0; g < fi && rc == PARITY_OK; g++)
                if (st_find(m->files[g], f->tensors[t].name))
                    rc = set_error(PARITY_ERR_ST_DUPLICATE, "tensor '%s' is in both %s and %s",
                                   f->tensors[t].name, m->files[g]->path, f->path);
            if (rc) break;
            const json_value *v = json_get(map, f->tensors[t].name);
            if (!v)
                rc = set_error(PARITY_ERR_INDEX, "%s: tensor '%s' is not in %s's weight_map",
                               f->path, f->tensors[t].name, index_path);
            else if (strcmp(v->str, base))
                rc = set_error(PARITY_ERR_INDEX,
                               "%s: tensor '%s' is here but the weight_map puts it in '%s'",
                               f->path, f->tensors[t].name, v->str);
        }
    }
    /* every mapped tensor is in its shard */
    for (size_t i = 0; i < map->count && rc == PARITY_OK; i++) {
        int found = 0;
        for (size_t fi = 0; fi < m->n_files && !found; fi++)
            found = st_find(m->files[fi], map->keys[i]) != NULL;
        if (!found)
            rc = set_error(PARITY_ERR_INDEX, "%s: tensor '%s' is not in shard '%s'", index_path,
                           map->keys[i], map->items[i].str);
    }
    json_free(doc);
    return rc;
}

static const st_tensor *find_tensor(const parity_model *m, const char *name, const st_file **file) {
    for (size_t i = 0; i < m->n_files; i++) {
        const st_tensor *t = st_find(m->files[i], name);
        if (t) {
            *file = m->files[i];
            return t;
        }
    }
    return NULL;
}

/* A tensor of the checkpoint as a tensor_source (`where` its buffer for messages), or 0 when
 * no file holds NAME. */
static int find_source(const parity_model *m, const char *name, char *where, size_t where_size,
                       tensor_source *out) {
    const st_file *f;
    const st_tensor *t = find_tensor(m, name, &f);
    if (!t) return 0;
    snprintf(where, where_size, "%s: tensor '%s'", f->path, name);
    const uint32_t dtype = t->dtype == ST_F32       ? PARITY_DTYPE_F32
                           : t->dtype == ST_BF16    ? PARITY_DTYPE_BF16
                           : t->dtype == ST_F16     ? PARITY_DTYPE_F16
                           : t->dtype == ST_F8_E4M3 ? PARITY_DTYPE_F8_E4M3
                           : t->dtype == ST_U8      ? TENSOR_SOURCE_U8
                                                    : UINT32_MAX;
    *out = (tensor_source){where, dtype, st_dtype_name(t->dtype), t->ndim, t->shape, t->data, 1};
    return 1;
}

/* The imported values become w's: the model owns the buffers, w->shipped the codes and scales
 * of format `gemm`. */
static int install_shipped(parity_model *m, weight *w, const expected *e, shipped_values *v,
                           int gemm, int scale_dtype) {
    quant_weight *q = model_own(m, px_calloc(1, sizeof *q, "shipped weight"));
    if (!q) {
        shipped_values_free(v);
        return PARITY_ERR_OUT_OF_MEMORY;
    }
    /* the model frees what the import allocated (model_own frees a buffer it cannot take) */
    void *bufs[4] = {v->codes, v->scales, v->master, v->bf16};
    for (int i = 0; i < 4; i++)
        if (!model_own(m, bufs[i])) {
            for (int j = i + 1; j < 4; j++) px_free(bufs[j]);
            return PARITY_ERR_OUT_OF_MEMORY;
        }
    q->codes = v->codes;
    q->scales = v->scales;
    q->tensor_scale = v->tensor_scale;
    q->input_scale = v->input_scale;
    w->rows = e->rows;
    w->cols = e->cols;
    w->bf16 = v->bf16;
    w->master = v->master;
    w->shipped = q;
    w->shipped_gemm = (uint8_t)gemm;
    w->shipped_scale_dtype = (uint8_t)scale_dtype;
    return PARITY_OK;
}

/* The name of a weight's companion tensor: "<weight><suffix>", or with `module_level` the
 * module's ("<module><suffix>", "<module>" being the weight's name less ".weight"). */
static void companion_name(const expected *e, const char *suffix, int module_level, char *out,
                           size_t size) {
    const size_t n = strlen(e->name);
    const int cut = module_level && n > 7 ? 7 : 0;
    snprintf(out, size, "%.*s%s", (int)(n - (size_t)cut), e->name, suffix);
}

/* A quantized linear weight of the checkpoint, in the layout of its quantization method. */
static int bind_quantized(parity_model *m, const char *dir, const expected *e) {
    char w0[512], w1[512], w2[512], w3[512], name[160];
    tensor_source codes = {0}, s1 = {0}, s2 = {0}, s3 = {0};
    const int method = m->ckpt.method;
    int have = 0, h1, h2 = 0, h3 = 0;
    if (method == QUANT_METHOD_MXFP4) {
        companion_name(e, "_blocks", 0, name, sizeof name);
        have = find_source(m, name, w0, sizeof w0, &codes);
        tensor_source plain;
        char wp[512];
        if (find_source(m, e->name, wp, sizeof wp, &plain))
            return set_error(PARITY_ERR_TENSOR_UNEXPECTED, "%s: quantization_config (quant_method "
                             "mxfp4) quantizes this layer, whose codes are '%s' (a layer kept in "
                             "bf16 is named in modules_to_not_convert)", wp, name);
    } else {
        snprintf(name, sizeof name, "%s", e->name);
        have = find_source(m, e->name, w0, sizeof w0, &codes);
    }
    if (!have)
        return set_error(PARITY_ERR_TENSOR_MISSING, "%s: tensor '%s' (the %s codes of %s, shape %s) "
                         "is missing", dir, name, quant_method_name(method), e->name, e->shape_doc);
    shipped_values v;
    int rc, gemm;
    switch (method) {
    case QUANT_METHOD_FP8_BLOCK:
        if (codes.dtype != PARITY_DTYPE_F8_E4M3)
            return set_error(PARITY_ERR_TENSOR_DTYPE, "%s: dtype %s, but config.json's "
                             "quantization_config (quant_method fp8) quantizes this layer: F8_E4M3 "
                             "codes expected (a layer kept in bf16 is named in "
                             "modules_to_not_convert)", w0, codes.dtype_name);
        companion_name(e, "_scale_inv", 0, name, sizeof name);
        h1 = find_source(m, name, w1, sizeof w1, &s1);
        rc = shipped_import(&codes, h1 ? &s1 : NULL, e, m->ckpt.scale_ue8m0, &v);
        gemm = PARITY_GEMM_FP8_BLOCK;
        break;
    case QUANT_METHOD_BITNET:
        companion_name(e, "_scale", 0, name, sizeof name);
        h1 = find_source(m, name, w1, sizeof w1, &s1);
        rc = ternary_shipped_import(&codes, h1 ? &s1 : NULL, e, m->ckpt.bitnet_scale_is_mean, &v);
        /* autobitlinear's s_w is computed (1 / mean): it saves as F32, exactly */
        if (!rc && m->ckpt.bitnet_scale_is_mean) v.scale_dtype = PARITY_DTYPE_F32;
        gemm = PARITY_GEMM_TERNARY;
        break;
    case QUANT_METHOD_NVFP4:
        companion_name(e, "_scale", 0, name, sizeof name);
        h1 = find_source(m, name, w1, sizeof w1, &s1);
        companion_name(e, "_scale_2", 0, name, sizeof name);
        h2 = find_source(m, name, w2, sizeof w2, &s2);
        companion_name(e, ".input_scale", 1, name, sizeof name);
        h3 = find_source(m, name, w3, sizeof w3, &s3);
        rc = nvfp4_shipped_import(&codes, h1 ? &s1 : NULL, h2 ? &s2 : NULL, h3 ? &s3 : NULL, e, &v);
        gemm = PARITY_GEMM_NVFP4;
        break;
    default: /* QUANT_METHOD_MXFP4 */
        companion_name(e, "_scales", 0, name, sizeof name);
        h1 = find_source(m, name, w1, sizeof w1, &s1);
        rc = mxfp4_shipped_import(&codes, h1 ? &s1 : NULL, e, &v);
        gemm = PARITY_GEMM_MXFP4;
        break;
    }
    if (rc) return rc;
    return install_shipped(m, e->dst, e, &v, gemm, v.scale_dtype);
}

/* Whether NAME is a companion tensor (scales, or MXFP4's blocks) of a weight the checkpoint
 * quantizes. */
static int is_shipped_companion(const parity_model *m, const char *name) {
    static const char *const suffixes[][3] = {
        [QUANT_METHOD_FP8_BLOCK] = {"_scale_inv"},
        [QUANT_METHOD_BITNET] = {"_scale"},
        [QUANT_METHOD_NVFP4] = {"_scale", "_scale_2"},
        [QUANT_METHOD_MXFP4] = {"_blocks", "_scales"},
    };
    if (m->ckpt.method == QUANT_METHOD_NONE) return 0;
    const size_t n = strlen(name);
    char base[160];
    for (int s = 0; s < 3 && suffixes[m->ckpt.method][s]; s++) {
        const char *suffix = suffixes[m->ckpt.method][s];
        const size_t k = strlen(suffix);
        if (n <= k || n - k >= sizeof base || strcmp(name + n - k, suffix)) continue;
        memcpy(base, name, n - k);
        base[n - k] = '\0';
        const expected *e = model_find_tensor(m, base);
        if (e && e->linear && !e->dst->keep_bf16) return 1;
    }
    /* NVFP4's "<module>.input_scale" */
    static const char input[] = ".input_scale";
    const size_t k = sizeof input - 1;
    if (m->ckpt.method == QUANT_METHOD_NVFP4 && n > k && n - k + 7 < sizeof base &&
        !strcmp(name + n - k, input)) {
        memcpy(base, name, n - k);
        memcpy(base + n - k, ".weight", 8);
        const expected *e = model_find_tensor(m, base);
        return e && e->linear && !e->dst->keep_bf16;
    }
    return 0;
}

static int bind_all(parity_model *m, const char *dir) {
    size_t n;
    const expected *e = model_tensors(m, &n);
    int rc = PARITY_OK;
    const int quantized = m->ckpt.method != QUANT_METHOD_NONE;
    for (size_t i = 0; i < n; i++)
        e[i].dst->keep_bf16 = quantized && e[i].linear && quant_checkpoint_keeps(&m->ckpt, e[i].name);
    for (size_t i = 0; i < n && rc == PARITY_OK; i++) {
        const st_file *f;
        if (quantized && e[i].linear && !e[i].dst->keep_bf16) {
            rc = bind_quantized(m, dir, &e[i]);
            continue;
        }
        const st_tensor *t = find_tensor(m, e[i].name, &f);
        if (!t)
            rc = set_error(PARITY_ERR_TENSOR_MISSING, "%s: tensor '%s' (shape %s) is missing",
                           dir, e[i].name, e[i].shape_doc);
        else if (t->dtype == ST_F8_E4M3)
            rc = set_error(PARITY_ERR_TENSOR_DTYPE, "%s: tensor '%s' is F8_E4M3, but %s",
                           f->path, e[i].name,
                           !quantized ? "config.json has no quantization_config "
                                                "(quant_method fp8) that quantizes it"
                           : e[i].linear ? "quantization_config's modules_to_not_convert / "
                                           "ignored_layers keep it unquantized"
                                         : "only the decoder layers' linear weights are quantized "
                                           "(the embedding, norms and lm_head are not)");
        else
            rc = bind_tensor(m, f, t, &e[i]);
    }
    /* nothing in the files that the architecture does not use */
    for (size_t fi = 0; fi < m->n_files && rc == PARITY_OK; fi++) {
        const st_file *f = m->files[fi];
        for (size_t t = 0; t < f->n_tensors && rc == PARITY_OK; t++) {
            const char *name = f->tensors[t].name;
            int known = ignorable(m, name) || is_shipped_companion(m, name);
            for (size_t i = 0; i < n && !known; i++) known = !strcmp(e[i].name, name);
            if (!known)
                rc = set_error(PARITY_ERR_TENSOR_UNEXPECTED,
                               "%s: tensor '%s' is not part of a %s model with this config%s",
                               f->path, name, parity_arch_name((int)m->config.arch),
                               strstr(name, "_scale") ? " (a scale of a weight the checkpoint "
                                                            "does not quantize)" : "");
        }
    }
    return rc;
}

/* The end of every way a model is made, once its weights are bound (rc == PARITY_OK) or not:
 * the tied head, the vectors widened to fp32 (the region kernels read norms and biases in
 * fp32), the RoPE tables; *out on success, everything freed on failure. */
static int model_finish(parity_model *m, int rc, parity_model **out) {
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

int parity_model_load(const char *dir, parity_model **out) {
    clear_error();
    if (!dir || !out) return set_error(PARITY_ERR_INVALID_ARGUMENT, "directory or output is NULL");
    size_t plen = strlen(dir) + 64;
    char *path = px_malloc(plen, "path");
    if (!path) return PARITY_ERR_OUT_OF_MEMORY;
    parity_config c;
    snprintf(path, plen, "%s/config.json", dir);
    int rc = parity_config_load(path, &c);
    quant_checkpoint ckpt = {0};
    char *text = NULL;
    size_t text_len = 0;
    if (!rc && !(rc = read_text_file(path, 16u << 20, &text, &text_len)))
        rc = quant_checkpoint_parse(text, text_len, path, &ckpt);
    px_free(text);
    text = NULL;
    /* a ModelOpt checkpoint may say how it is quantized in hf_quant_config.json alone */
    snprintf(path, plen, "%s/hf_quant_config.json", dir);
    if (!rc && ckpt.method == QUANT_METHOD_NONE && file_exists(path) &&
        !(rc = read_text_file(path, 16u << 20, &text, &text_len)))
        rc = quant_checkpoint_parse_modelopt(text, text_len, path, &ckpt);
    px_free(text);
    if (rc) {
        px_free(path);
        return rc;
    }
    parity_model *m = model_new(&c);
    if (!m) {
        quant_checkpoint_free(&ckpt);
        px_free(path);
        return PARITY_ERR_OUT_OF_MEMORY;
    }
    m->ckpt = ckpt;
    snprintf(path, plen, "%s/model.safetensors.index.json", dir);
    if (file_exists(path)) {
        rc = open_sharded(m, dir, path);
    } else {
        snprintf(path, plen, "%s/model.safetensors", dir);
        st_file *f;
        if (!file_exists(path))
            rc = set_error(PARITY_ERR_IO, "%s: neither model.safetensors nor "
                           "model.safetensors.index.json is there", dir);
        else if ((rc = st_open(path, &f)) == PARITY_OK)
            rc = add_file(m, f);
    }
    px_free(path);
    if (rc == PARITY_OK) rc = bind_all(m, dir);
    return model_finish(m, rc, out);
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
    int rc = config_validate(config);
    if (rc) return rc;
    parity_model *m = model_new(config);
    if (!m) return PARITY_ERR_OUT_OF_MEMORY;
    size_t n;
    const expected *e = model_tensors(m, &n);
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

int parity_model_open(const char *spec, parity_model **out) {
    clear_error();
    if (!spec || !out) return set_error(PARITY_ERR_INVALID_ARGUMENT, "model spec or output is NULL");
    if (strncmp(spec, "synthetic:", 10)) return parity_model_load(spec, out);
    char name[64];
    const char *colon = strchr(spec + 10, ':');
    size_t len = colon ? (size_t)(colon - spec - 10) : strlen(spec + 10);
    if (len == 0 || len >= sizeof name)
        return set_error(PARITY_ERR_INVALID_ARGUMENT, "'%s': expected synthetic:NAME[:SEED]", spec);
    memcpy(name, spec + 10, len);
    name[len] = '\0';
    uint64_t seed = 0;
    if (colon) {
        char *end;
        errno = 0;
        unsigned long long v = strtoull(colon + 1, &end, 10);
        if (errno || end == colon + 1 || *end || colon[1] == '-')
            return set_error(PARITY_ERR_INVALID_ARGUMENT, "'%s': the seed must be a non-negative integer", spec);
        seed = v;
    }
    parity_config c;
    int rc = parity_config_builtin(name, &c);
    if (rc) return rc;
    return parity_model_synthetic(&c, seed, out);
}

/* ---- saving ------------------------------------------------------------------------------ */

static int write_config(const parity_config *c, const char *path, const char *torch_dtype,
                        const char *quantization_config) {
    FILE *fp = fopen(path, "w");
    if (!fp) return set_error(PARITY_ERR_IO, "%s: cannot create: %s", path, strerror(errno));
    const char *type = parity_arch_name((int)c->arch);
    const char *archname = c->arch == PARITY_ARCH_QWEN2   ? "Qwen2ForCausalLM"
                           : c->arch == PARITY_ARCH_QWEN3 ? "Qwen3ForCausalLM"
                           : c->arch == PARITY_ARCH_OURO  ? "OuroForCausalLM"
                                                          : "LlamaForCausalLM";
    fprintf(fp,
            "{\n  \"architectures\": [\"%s\"],\n  \"model_type\": \"%s\",\n"
            "  \"vocab_size\": %u,\n  \"hidden_size\": %u,\n  \"intermediate_size\": %u,\n"
            "  \"num_hidden_layers\": %u,\n  \"num_attention_heads\": %u,\n"
            "  \"num_key_value_heads\": %u,\n  \"head_dim\": %u,\n  \"hidden_act\": \"silu\",\n"
            "  \"max_position_embeddings\": %u,\n  \"rms_norm_eps\": %.9g,\n"
            "  \"rope_theta\": %.17g,\n  \"tie_word_embeddings\": %s,\n"
            "  \"attention_bias\": %s,\n  \"torch_dtype\": \"%s\",\n",
            archname, type, c->vocab_size, c->hidden_size, c->intermediate_size,
            c->num_hidden_layers, c->num_attention_heads, c->num_key_value_heads, c->head_dim,
            c->max_position_embeddings, (double)c->rms_norm_eps, c->rope_theta,
            c->tie_word_embeddings ? "true" : "false", c->attention_bias ? "true" : "false",
            torch_dtype);
    if (c->arch == PARITY_ARCH_OURO)
        fprintf(fp,
                "  \"total_ut_steps\": %u,\n  \"early_exit_threshold\": %.9g,\n"
                "  \"use_early_exit_gate\": %s,\n",
                c->total_ut_steps, (double)c->early_exit_threshold,
                c->early_exit_gate ? "true" : "false");
    if (quantization_config) fprintf(fp, "  \"quantization_config\": %s,\n", quantization_config);
    switch (c->rope_type) {
    case PARITY_ROPE_LINEAR:
        fprintf(fp, "  \"rope_scaling\": {\"rope_type\": \"linear\", \"factor\": %.9g}\n",
                (double)c->rope_factor);
        break;
    case PARITY_ROPE_LLAMA3:
        fprintf(fp,
                "  \"rope_scaling\": {\"rope_type\": \"llama3\", \"factor\": %.9g, "
                "\"low_freq_factor\": %.9g, \"high_freq_factor\": %.9g, "
                "\"original_max_position_embeddings\": %u}\n",
                (double)c->rope_factor, (double)c->rope_low_freq_factor,
                (double)c->rope_high_freq_factor, c->rope_original_max_position_embeddings);
        break;
    case PARITY_ROPE_YARN:
        fprintf(fp,
                "  \"rope_scaling\": {\"rope_type\": \"yarn\", \"factor\": %.9g, "
                "\"original_max_position_embeddings\": %u, \"beta_fast\": %.9g, "
                "\"beta_slow\": %.9g, \"truncate\": %s",
                (double)c->rope_factor, c->rope_original_max_position_embeddings,
                (double)c->rope_beta_fast, (double)c->rope_beta_slow,
                c->rope_truncate ? "true" : "false");
        if (c->rope_attention_factor > 0)
            fprintf(fp, ", \"attention_factor\": %.9g", (double)c->rope_attention_factor);
        if (c->rope_mscale > 0) fprintf(fp, ", \"mscale\": %.9g", (double)c->rope_mscale);
        if (c->rope_mscale_all_dim > 0)
            fprintf(fp, ", \"mscale_all_dim\": %.9g", (double)c->rope_mscale_all_dim);
        fprintf(fp, "}\n");
        break;
    default:
        fprintf(fp, "  \"rope_scaling\": null\n");
    }
    fprintf(fp, "}\n");
    if (fclose(fp) != 0) return set_error(PARITY_ERR_IO, "%s: write failed: %s", path, strerror(errno));
    return PARITY_OK;
}

/* The layouts parity_model_save_as writes. */
enum { LAYOUT_BF16, LAYOUT_FP16, LAYOUT_FP32, LAYOUT_FP8_BLOCK, LAYOUT_BITNET, LAYOUT_NVFP4,
       LAYOUT_MXFP4 };

/* One tensor of the file: a weight's values in the layout's dtype, or a quantized weight's
 * codes, block scales, tensor scale (NVFP4's weight_scale_2) or input_scale (NVFP4's). */
enum { OUT_VALUES, OUT_CODES, OUT_SCALES, OUT_TENSOR_SCALE, OUT_INPUT_SCALE };
typedef struct saved_tensor {
    const char *name;
    char scale_name[128];  /* the name when it is not the weight's: "<weight>_scale_inv" (fp8),
                              "<weight>_scale" (bitnet, NVFP4), "<weight>_blocks" (MXFP4), ... */
    char shape[48];        /* the shape as the header writes it, where it is not the weight's */
    const weight *w;
    int is_vector, kind;
    const char *dtype;     /* "BF16", "F16", "F32", "F8_E4M3", "U8" */
    uint64_t bytes;
    const quant_weight *q;   /* OUT_CODES/OUT_SCALES: the shipped codes, or `made` */
    quant_weight made;       /* codes and scales quantized for the file (owned by the save) */
    int scales_bf16;       /* OUT_SCALES: stored as BF16 (shipped so, or hf-bitlinear's) */
    int scales_f16;        /* OUT_SCALES: stored as F16 (a BitNet checkpoint's) */
} saved_tensor;

static int cmp_saved(const void *a, const void *b) {
    return strcmp(((const saved_tensor *)a)->name, ((const saved_tensor *)b)->name);
}

/* "bf16", "fp16", "fp32", "fp8-block[:RULE]", "bitnet[:RULE]", "nvfp4[:RULE]" or
 * "mxfp4[:RULE]" (NULL: "bf16"). */
static int parse_layout(const char *layout, int *kind, int *rule) {
    *rule = -1;
    if (!layout || !strcmp(layout, "bf16")) return *kind = LAYOUT_BF16, PARITY_OK;
    if (!strcmp(layout, "fp16")) return *kind = LAYOUT_FP16, PARITY_OK;
    if (!strcmp(layout, "fp32")) return *kind = LAYOUT_FP32, PARITY_OK;
    if (!strcmp(layout, "fp8-block")) return *kind = LAYOUT_FP8_BLOCK, PARITY_OK;
    if (!strncmp(layout, "fp8-block:", 10)) {
        *kind = LAYOUT_FP8_BLOCK;
        return parity_fp8_quantizer_from_name(0, layout + 10, rule);
    }
    if (!strcmp(layout, "bitnet")) return *kind = LAYOUT_BITNET, PARITY_OK;
    if (!strncmp(layout, "bitnet:", 7)) {
        *kind = LAYOUT_BITNET;
        return parity_quantizer_from_name(PARITY_GEMM_TERNARY, layout + 7, rule);
    }
    if (!strcmp(layout, "nvfp4")) return *kind = LAYOUT_NVFP4, PARITY_OK;
    if (!strncmp(layout, "nvfp4:", 6)) {
        *kind = LAYOUT_NVFP4;
        return parity_quantizer_from_name(PARITY_GEMM_NVFP4, layout + 6, rule);
    }
    if (!strcmp(layout, "mxfp4")) return *kind = LAYOUT_MXFP4, PARITY_OK;
    if (!strncmp(layout, "mxfp4:", 6)) {
        *kind = LAYOUT_MXFP4;
        return parity_quantizer_from_name(PARITY_GEMM_MXFP4, layout + 6, rule);
    }
    return set_error(PARITY_ERR_INVALID_ARGUMENT, "layout '%s' is not one of bf16, fp16, fp32, "
                     "fp8-block[:RULE], bitnet[:RULE], nvfp4[:RULE], mxfp4[:RULE]", layout);
}

/* Writes one tensor's bytes. */
static int write_saved(FILE *fp, const saved_tensor *t, int layout) {
    const weight *w = t->w;
    const size_t count = (size_t)w->rows * w->cols;
    const int fp4 = layout == LAYOUT_NVFP4 || layout == LAYOUT_MXFP4;
    if (t->kind == OUT_CODES && fp4) {
        uint8_t *packed = px_malloc(t->bytes ? t->bytes : 1, "packed fp4 codes");
        if (!packed) return 0;
        fp4_pack_rows(t->q->codes, w->rows, w->cols, t->bytes / w->rows, packed);
        const int ok = fwrite(packed, 1, t->bytes, fp) == t->bytes;
        px_free(packed);
        return ok;
    }
    if (t->kind == OUT_SCALES && fp4) {
        for (uint64_t i = 0; i < t->bytes; i++) {
            const float v = t->q->scales[i];
            const uint8_t b = layout == LAYOUT_NVFP4 ? e4m3_from_f32_saturating(v) : e8m0_from_pow2(v);
            if (fputc(b, fp) == EOF) return 0;
        }
        return 1;
    }
    if (t->kind == OUT_TENSOR_SCALE || t->kind == OUT_INPUT_SCALE) {
        float v = t->kind == OUT_INPUT_SCALE ? t->q->input_scale : t->q->tensor_scale;
        if (v == 0.0f) v = 1.0f; /* an all-zero weight's s2: its codes are 0 whatever s2 is */
        return fwrite(&v, 4, 1, fp) == 1;
    }
    if (t->kind == OUT_CODES && layout == LAYOUT_BITNET) {
        uint8_t *packed = px_malloc(t->bytes ? t->bytes : 1, "packed ternary codes");
        if (!packed) return 0;
        ternary_pack(t->q->codes, w->rows, w->cols, packed);
        const int ok = fwrite(packed, 1, t->bytes, fp) == t->bytes;
        px_free(packed);
        return ok;
    }
    if (t->kind == OUT_CODES) return fwrite(t->q->codes, 1, count, fp) == count;
    if (t->kind == OUT_SCALES && layout == LAYOUT_BITNET) {
        const float s = t->q->tensor_scale;
        if (t->scales_bf16 || t->scales_f16) {
            const uint16_t h = t->scales_bf16 ? bf16_from_f32(s) : f16_from_f32(s);
            return fwrite(&h, 2, 1, fp) == 1;
        }
        return fwrite(&s, 4, 1, fp) == 1;
    }
    if (t->kind == OUT_SCALES) {
        const size_t g = (size_t)(t->bytes / (t->scales_bf16 ? 2 : 4));
        if (!t->scales_bf16) return fwrite(t->q->scales, 4, g, fp) == g;
        for (size_t i = 0; i < g; i++) {
            const uint16_t h = bf16_from_f32(t->q->scales[i]); /* exact: they came from bf16 */
            if (fwrite(&h, 2, 1, fp) != 1) return 0;
        }
        return 1;
    }
    if (layout != LAYOUT_FP16 && layout != LAYOUT_FP32) return fwrite(w->bf16, 2, count, fp) == count;
    /* fp16 and fp32 from the master where there is one, else the bf16 values (exact) */
    for (size_t i = 0; i < count; i++) {
        const float v = w->master ? w->master[i] : bf16_to_f32(w->bf16[i]);
        if (layout == LAYOUT_FP32 ? fwrite(&v, 4, 1, fp) != 1 : 0) return 0;
        if (layout == LAYOUT_FP16) {
            const uint16_t h = f16_from_f32(v);
            if (fwrite(&h, 2, 1, fp) != 1) return 0;
        }
    }
    return 1;
}

/* A BitNet layout's codes (v) and weight_scale (sc) of w: the shipped ternary codes, or those
 * of `rule` quantizing its values into buffers v owns. The scale keeps a shipped scale's
 * dtype; a quantized one is F32 (BF16 under hf-bitlinear, whose s_w is a bf16 value). */
static int plan_ternary(const weight *w, saved_tensor *v, saved_tensor *sc, int rule) {
    *sc = (saved_tensor){.w = w, .kind = OUT_SCALES};
    snprintf(sc->scale_name, sizeof sc->scale_name, "%s_scale", v->name);
    sc->name = sc->scale_name;
    v->kind = OUT_CODES;
    v->dtype = "U8";
    v->bytes = ((uint64_t)w->rows + 3) / 4 * w->cols;
    if (w->shipped && w->shipped_gemm == PARITY_GEMM_TERNARY) {
        v->q = sc->q = w->shipped;
        sc->scales_bf16 = w->shipped_scale_dtype == PARITY_DTYPE_BF16;
        sc->scales_f16 = w->shipped_scale_dtype == PARITY_DTYPE_F16;
    } else if (rule < 0) {
        return set_error(PARITY_ERR_INVALID_ARGUMENT, "layout bitnet: '%s' holds no shipped ternary "
                         "codes; name the quantizer that makes them (bitnet:RULE)", v->name);
    } else {
        const size_t f = quant_scratch_floats(w, rule);
        float *scratch = px_malloc((f ? f : 1) * sizeof(float), "ternary quantization");
        v->made.codes = scratch ? px_malloc((size_t)w->rows * w->cols, "ternary codes") : NULL;
        v->made.scales = v->made.codes ? px_malloc(sizeof(float), "ternary scale") : NULL;
        if (v->made.scales) quant_weight_quantize(w, rule, &v->made, scratch);
        px_free(scratch);
        if (!v->made.scales) return PARITY_ERR_OUT_OF_MEMORY;
        v->q = sc->q = &v->made;
        sc->scales_bf16 = quant_rule_of(rule)->tensor_scale == QUANT_SCALE_BF16;
    }
    sc->dtype = sc->scales_bf16 ? "BF16" : sc->scales_f16 ? "F16" : "F32";
    sc->bytes = sc->scales_bf16 || sc->scales_f16 ? 2 : 4;
    return PARITY_OK;
}

/* An NVFP4 or MXFP4 layout's tensors of w (v the codes, then up to three more at more[0..]):
 * the shipped codes of that format, or those of `rule` quantizing its values into buffers v
 * owns. Returns the number of entries written to `more`, or a negative status. */
static int plan_fp4(const weight *w, int layout, int rule, saved_tensor *v, saved_tensor *more) {
    const int nv = layout == LAYOUT_NVFP4, gemm = nv ? PARITY_GEMM_NVFP4 : PARITY_GEMM_MXFP4;
    const char *lname = nv ? "nvfp4" : "mxfp4";
    const uint64_t bc = nv ? 16 : 32, grid_cols = (w->cols + bc - 1) / bc;
    const quant_weight *q;
    if (w->shipped && w->shipped_gemm == gemm) {
        q = w->shipped;
    } else if (rule < 0) {
        return set_error(PARITY_ERR_INVALID_ARGUMENT, "layout %s: '%s' holds no shipped %s codes; "
                         "name the quantizer that makes them (%s:RULE)", lname, v->name,
                         nv ? "NVFP4" : "MXFP4", lname);
    } else {
        const size_t f = quant_scratch_floats(w, rule);
        float *scratch = px_malloc((f ? f : 1) * sizeof(float), "fp4 quantization");
        v->made.codes = scratch ? px_malloc((size_t)w->rows * w->cols, "fp4 codes") : NULL;
        v->made.scales = v->made.codes ? px_malloc(w->rows * grid_cols * sizeof(float), "fp4 scales") : NULL;
        if (v->made.scales) quant_weight_quantize(w, rule, &v->made, scratch);
        px_free(scratch);
        if (!v->made.scales) return PARITY_ERR_OUT_OF_MEMORY;
        q = &v->made;
    }
    const char *base = v->name;
    v->kind = OUT_CODES;
    v->dtype = "U8";
    v->q = q;
    int k = 0;
    saved_tensor *sc = &more[k++];
    *sc = (saved_tensor){.w = w, .kind = OUT_SCALES, .q = q, .dtype = nv ? "F8_E4M3" : "U8",
                         .bytes = w->rows * grid_cols};
    snprintf(sc->shape, sizeof sc->shape, "%u,%llu", w->rows, (unsigned long long)grid_cols);
    if (nv) {
        v->bytes = (uint64_t)w->rows * ((w->cols + 1) / 2);
        snprintf(v->shape, sizeof v->shape, "%u,%u", w->rows, (w->cols + 1) / 2);
        snprintf(sc->scale_name, sizeof sc->scale_name, "%s_scale", base);
        saved_tensor *s2 = &more[k++];
        *s2 = (saved_tensor){.w = w, .kind = OUT_TENSOR_SCALE, .q = q, .dtype = "F32", .bytes = 4};
        snprintf(s2->scale_name, sizeof s2->scale_name, "%s_scale_2", base);
        s2->name = s2->scale_name;
        if (q->input_scale > 0) {
            saved_tensor *in = &more[k++];
            *in = (saved_tensor){.w = w, .kind = OUT_INPUT_SCALE, .q = q, .dtype = "F32", .bytes = 4};
            snprintf(in->scale_name, sizeof in->scale_name, "%.*s.input_scale",
                     (int)(strlen(base) - 7), base);
            in->name = in->scale_name;
        }
    } else {
        v->bytes = (uint64_t)w->rows * grid_cols * 16;
        snprintf(v->shape, sizeof v->shape, "%u,%llu,16", w->rows, (unsigned long long)grid_cols);
        snprintf(v->scale_name, sizeof v->scale_name, "%s_blocks", base);
        v->name = v->scale_name;
        snprintf(sc->scale_name, sizeof sc->scale_name, "%s_scales", base);
    }
    sc->name = sc->scale_name;
    return k;
}

/* The tensor list of a layout: every slot's values, and for fp8-block each quantized weight's
 * codes and scales (shipped, or quantized with `rule` into buffers the list owns). */
static int plan_saved(const parity_model *m, int layout, int rule, saved_tensor **out, size_t *count,
                      int *all_pow2) {
    size_t n;
    const expected *e = model_tensors(m, &n);
    saved_tensor *s = px_calloc(4 * n, sizeof *s, "tensor list");
    if (!s) return PARITY_ERR_OUT_OF_MEMORY;
    /* sorted by name, each scale right after its weight ("X.weight" < "X.weight_scale_inv") */
    size_t k = 0, widest = 0;
    for (size_t i = 0; i < n; i++) widest = e[i].cols > widest ? e[i].cols : widest;
    float *scratch = NULL;
    int rc = PARITY_OK;
    *all_pow2 = 1;
    saved_tensor *tmp = px_calloc(n, sizeof *tmp, "tensor list");
    if (!tmp) rc = PARITY_ERR_OUT_OF_MEMORY;
    for (size_t i = 0; !rc && i < n; i++) tmp[i] = (saved_tensor){.name = e[i].name, .w = e[i].dst,
                                                                   .is_vector = e[i].rows == 0};
    if (!rc) qsort(tmp, n, sizeof *tmp, cmp_saved);
    for (size_t i = 0; !rc && i < n; i++) {
        const weight *w = tmp[i].w;
        const expected *slot = model_find_tensor(m, tmp[i].name);
        const uint64_t count = (uint64_t)w->rows * w->cols;
        saved_tensor *v = &s[k++];
        *v = tmp[i];
        v->kind = OUT_VALUES;
        const int quantize = (layout == LAYOUT_FP8_BLOCK || layout == LAYOUT_BITNET ||
                              layout == LAYOUT_NVFP4 || layout == LAYOUT_MXFP4) &&
                             slot->linear && !w->keep_bf16;
        v->dtype = layout == LAYOUT_FP16 ? "F16" : layout == LAYOUT_FP32 ? "F32" : "BF16";
        v->shape[0] = '\0';
        v->bytes = count * (layout == LAYOUT_FP32 ? 4 : 2);
        if (layout == LAYOUT_FP16)
            for (uint64_t j = 0; j < count && !rc; j++) {
                const float x = w->master ? w->master[j] : bf16_to_f32(w->bf16[j]);
                if (isinf(round_fp16(x)))
                    rc = set_error(PARITY_ERR_TENSOR_NONFINITE, "layout fp16: '%s' element %llu "
                                   "(%g) is beyond fp16's range", v->name,
                                   (unsigned long long)j, (double)x);
            }
        if (!quantize || rc) continue;
        if (layout == LAYOUT_BITNET) {
            rc = plan_ternary(w, v, &s[k++], rule);
            continue;
        }
        if (layout == LAYOUT_NVFP4 || layout == LAYOUT_MXFP4) {
            const int more = plan_fp4(w, layout, rule, v, &s[k]);
            if (more < 0) rc = more;
            else k += (size_t)more;
            continue;
        }
        const uint64_t grid = (uint64_t)((w->rows + 127) / 128) * ((w->cols + 127) / 128);
        saved_tensor *sc = &s[k++];
        *sc = (saved_tensor){.w = w, .kind = OUT_SCALES};
        snprintf(sc->scale_name, sizeof sc->scale_name, "%s_scale_inv", v->name);
        sc->name = sc->scale_name;
        v->kind = OUT_CODES;
        v->dtype = "F8_E4M3";
        v->bytes = count;
        if (w->shipped) {
            v->q = sc->q = w->shipped;
            sc->scales_bf16 = w->shipped_scale_dtype == PARITY_DTYPE_BF16;
        } else if (rule < 0) {
            rc = set_error(PARITY_ERR_INVALID_ARGUMENT, "layout fp8-block: '%s' holds no shipped fp8 "
                           "codes; name the quantizer that makes them (fp8-block:RULE)", v->name);
        } else {
            if (!scratch && !(scratch = px_malloc(128 * widest * sizeof(float), "fp8 quantization rows")))
                rc = PARITY_ERR_OUT_OF_MEMORY;
            v->made.codes = rc ? NULL : px_malloc(count, "fp8 codes");
            v->made.scales = v->made.codes ? px_malloc(grid * sizeof(float), "fp8 scales") : NULL;
            if (!rc && !v->made.scales) rc = PARITY_ERR_OUT_OF_MEMORY;
            if (!rc) quant_weight_quantize(w, rule, &v->made, scratch);
            v->q = sc->q = &v->made;
        }
        sc->dtype = sc->scales_bf16 ? "BF16" : "F32";
        sc->bytes = grid * (sc->scales_bf16 ? 2 : 4);
        for (uint64_t j = 0; !rc && j < grid; j++)
            if (f32_bits(sc->q->scales[j]) & 0x007fffffu) *all_pow2 = 0;
    }
    px_free(scratch);
    px_free(tmp);
    *out = s;
    *count = k;
    return rc;
}

static void saved_free(saved_tensor *s, size_t n) {
    for (size_t i = 0; s && i < n; i++) {
        px_free(s[i].made.codes);
        px_free(s[i].made.scales);
    }
    px_free(s);
}

/* The modules a quantized layout keeps in bf16, as a JSON array: lm_head, then the linear
 * layers the model keeps (named by the checkpoint it was loaded from). */
static int kept_modules_text(const parity_model *m, char *buf, size_t size) {
    int k = snprintf(buf, size, "[\"lm_head\"");
    size_t n;
    const expected *e = model_tensors(m, &n);
    for (size_t i = 0; i < n && k > 0 && (size_t)k < size; i++)
        if (e[i].linear && e[i].dst->keep_bf16)
            k += snprintf(buf + k, size - (size_t)k, ", \"%.*s\"", (int)(strlen(e[i].name) - 7),
                          e[i].name);
    if (k > 0 && (size_t)k < size) k += snprintf(buf + k, size - (size_t)k, "]");
    return k;
}

/* config.json's quantization_config for a quantized layout (hf_quant_config.json's
 * "quantization" object with `modelopt_file`), into buf. */
static void quant_config_text(const parity_model *m, int layout, int scale_ue8m0, int modelopt_file,
                              char *buf, size_t size) {
    int k;
    switch (layout) {
    case LAYOUT_BITNET: /* weight_scale is s_w = 1 / mean|W| */
        k = snprintf(buf, size, "{\"quant_method\": \"bitnet\", \"linear_class\": \"bitlinear\", "
                     "\"modules_to_not_convert\": ");
        break;
    case LAYOUT_NVFP4:
        k = snprintf(buf, size, "{%s\"quant_algo\": \"NVFP4\", \"kv_cache_quant_algo\": null, "
                     "\"group_size\": 16, \"exclude_modules\": ",
                     modelopt_file ? "" : "\"quant_method\": \"modelopt\", ");
        break;
    case LAYOUT_MXFP4:
        k = snprintf(buf, size, "{\"quant_method\": \"mxfp4\", \"modules_to_not_convert\": ");
        break;
    default:
        k = snprintf(buf, size, "{\"quant_method\": \"fp8\", \"fmt\": \"e4m3\", "
                     "\"activation_scheme\": \"dynamic\", \"weight_block_size\": [128, 128], "
                     "%s\"modules_to_not_convert\": ", scale_ue8m0 ? "\"scale_fmt\": \"ue8m0\", " : "");
    }
    if (k > 0 && (size_t)k < size) k += kept_modules_text(m, buf + k, size - (size_t)k);
    if (k > 0 && (size_t)k < size) snprintf(buf + k, size - (size_t)k, "}");
}

/* hf_quant_config.json beside an NVFP4 checkpoint's config.json (vLLM finds ModelOpt
 * checkpoints by it); for another layout, one left from an earlier save is removed, so that
 * the directory does not contradict itself. */
static int write_modelopt_file(const parity_model *m, const char *dir, int layout, char *qtext,
                               size_t qsize) {
    const size_t plen = strlen(dir) + 32;
    char *path = px_malloc(plen, "path");
    if (!path) return PARITY_ERR_OUT_OF_MEMORY;
    snprintf(path, plen, "%s/hf_quant_config.json", dir);
    int rc = PARITY_OK;
    if (layout != LAYOUT_NVFP4) {
        if (remove(path) != 0 && errno != ENOENT)
            rc = set_error(PARITY_ERR_IO, "%s: cannot remove the stale file: %s", path, strerror(errno));
        px_free(path);
        return rc;
    }
    quant_config_text(m, layout, 0, 1, qtext, qsize);
    FILE *fp = fopen(path, "w");
    if (!fp) rc = set_error(PARITY_ERR_IO, "%s: cannot create: %s", path, strerror(errno));
    if (fp) {
        fprintf(fp, "{\n  \"producer\": {\"name\": \"libparity\", \"version\": \"%s\"},\n"
                "  \"quantization\": %s\n}\n", PARITY_VERSION_STRING, qtext);
        if (fclose(fp) != 0) rc = set_error(PARITY_ERR_IO, "%s: write failed: %s", path, strerror(errno));
    }
    px_free(path);
    return rc;
}

int parity_model_save(const parity_model *m, const char *dir) {
    return parity_model_save_as(m, dir, "bf16");
}

int parity_model_save_as(const parity_model *m, const char *dir, const char *layout_name) {
    clear_error();
    if (!m || !dir) return set_error(PARITY_ERR_INVALID_ARGUMENT, "model or directory is NULL");
    int layout = LAYOUT_BF16, rule = -1;
    int rc = parse_layout(layout_name, &layout, &rule);
    if (rc) return rc;
    if ((rc = model_enter(m))) return rc;
    size_t plen = strlen(dir) + 64;
    char *path = px_malloc(plen, "path"), *tmp = px_malloc(plen, "path");
    size_t n = 0;
    saved_tensor *s = NULL;
    int all_pow2 = 0;
    char *header = NULL, *qtext = NULL;
    FILE *fp = NULL;
    rc = (path && tmp) ? plan_saved(m, layout, rule, &s, &n, &all_pow2) : PARITY_ERR_OUT_OF_MEMORY;
    const size_t qsize = 512 + m->n_tensors * 100;
    const int quantized = layout != LAYOUT_BF16 && layout != LAYOUT_FP16 && layout != LAYOUT_FP32;
    if (rc == PARITY_OK && !(qtext = px_malloc(qsize, "config text"))) rc = PARITY_ERR_OUT_OF_MEMORY;
    if (rc == PARITY_OK) rc = write_modelopt_file(m, dir, layout, qtext, qsize);
    if (rc == PARITY_OK) {
        if (quantized)
            quant_config_text(m, layout,
                              all_pow2 && (rule == PARITY_FP8Q_TE_POW2 || m->ckpt.scale_ue8m0), 0,
                              qtext, qsize);
        snprintf(path, plen, "%s/config.json", dir);
        rc = write_config(&m->config, path,
                          layout == LAYOUT_FP16 ? "float16" : layout == LAYOUT_FP32 ? "float32" : "bfloat16",
                          quantized ? qtext : NULL);
    }
    if (rc == PARITY_OK) {
        size_t cap = 256 + n * 200, len = 0;
        header = px_malloc(cap, "safetensors header");
        if (!header) rc = PARITY_ERR_OUT_OF_MEMORY;
        uint64_t offset = 0;
        if (header) len += (size_t)snprintf(header, cap, "{\"__metadata__\":{\"format\":\"pt\"}");
        for (size_t i = 0; i < n && header; i++) {
            const weight *w = s[i].w;
            char shape[64];
            if (s[i].shape[0])
                snprintf(shape, sizeof shape, "%s", s[i].shape);
            else if (s[i].kind == OUT_TENSOR_SCALE || s[i].kind == OUT_INPUT_SCALE)
                shape[0] = '\0'; /* a scalar, [] */
            else if (s[i].kind == OUT_SCALES && layout == LAYOUT_BITNET)
                snprintf(shape, sizeof shape, "1");
            else if (s[i].kind == OUT_CODES && layout == LAYOUT_BITNET)
                snprintf(shape, sizeof shape, "%u,%u", (w->rows + 3) / 4, w->cols);
            else if (s[i].kind == OUT_SCALES)
                snprintf(shape, sizeof shape, "%u,%u", (w->rows + 127) / 128, (w->cols + 127) / 128);
            else if (s[i].is_vector)
                snprintf(shape, sizeof shape, "%u", w->cols);
            else
                snprintf(shape, sizeof shape, "%u,%u", w->rows, w->cols);
            len += (size_t)snprintf(header + len, cap - len,
                                    ",\"%s\":{\"dtype\":\"%s\",\"shape\":[%s],"
                                    "\"data_offsets\":[%llu,%llu]}",
                                    s[i].name, s[i].dtype, shape, (unsigned long long)offset,
                                    (unsigned long long)(offset + s[i].bytes));
            offset += s[i].bytes;
        }
        if (header) {
            header[len++] = '}';
            while (len % 8) header[len++] = ' '; /* data 8-byte aligned */
            snprintf(tmp, plen, "%s/model.safetensors.tmp", dir);
            snprintf(path, plen, "%s/model.safetensors", dir);
            fp = fopen(tmp, "wb");
            if (!fp) rc = set_error(PARITY_ERR_IO, "%s: cannot create: %s", tmp, strerror(errno));
        }
        if (fp) {
            uint64_t hlen = len;
            uint8_t le[8];
            for (int b = 0; b < 8; b++) le[b] = (uint8_t)(hlen >> (8 * b));
            int ok = fwrite(le, 1, 8, fp) == 8 && fwrite(header, 1, len, fp) == len;
            for (size_t i = 0; i < n && ok; i++) ok = write_saved(fp, &s[i], layout);
            if (fclose(fp) != 0) ok = 0;
            if (!ok || rename(tmp, path) != 0) {
                rc = set_error(PARITY_ERR_IO, "%s: write failed: %s", path, strerror(errno));
                remove(tmp);
            }
        }
    }
    model_leave(m);
    px_free(header);
    px_free(qtext);
    saved_free(s, n);
    px_free(tmp);
    px_free(path);
    return rc;
}
