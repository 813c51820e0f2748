/* Loading a checkpoint directory into a model: config.json (and its quantization_config, or
 * hf_quant_config.json), model.safetensors or the shards of model.safetensors.index.json, and
 * every tensor bound to its slot of the architecture's blueprint (lib/model/model.c): the
 * values of plain tensors (a mixture of experts' routed experts also from transformers v5's
 * fused tensors, fused_experts.h), and each quantized linear weight through its checkpoint
 * layout (layout.h). parity_model_open also makes synthetic models by name. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "base/alloc.h"
#include "base/errors.h"
#include "base/files.h"
#include "fused_experts.h"
#include "json.h"
#include "layouts.h"
#include "model/config.h"
#include "model/model.h"
#include "quant_config.h"
#include "safetensors.h"

/* What a loaded model holds of its checkpoint, released with it (parity_model_free): the
 * mapped files and the quantization settings. */
static void release_checkpoint(parity_model *m) {
    for (size_t i = 0; i < m->n_files; i++) st_close(m->files[i]);
    px_free(m->files);
    quant_checkpoint_free(&m->ckpt);
}

/* Tensors a checkpoint may carry that the forward does not read. */
static int ignorable(const parity_model *m, const char *name) {
    size_t n = strlen(name);
    const char *inv = "rotary_emb.inv_freq";
    if (n >= strlen(inv) && !strcmp(name + n - strlen(inv), inv)) return 1;
    /* tied models: some writers also store the (identical) lm_head */
    return m->config.tie_word_embeddings && !strcmp(name, "lm_head.weight");
}

/* ---- binding a checkpoint tensor ------------------------------------------------------- */

/* Tensor t of file f as a tensor_source, `where` its buffer for messages ("PATH: tensor
 * 'NAME'"). A dtype other than BF16, F16, F32, F8_E4M3 and U8 (packed codes) is UINT32_MAX,
 * which tensor_import refuses naming it. */
static tensor_source source_of(const st_file *f, const st_tensor *t, char *where,
                               size_t where_size) {
    snprintf(where, where_size, "%s: tensor '%s'", f->path, t->name);
    const uint32_t dtype = t->dtype == ST_F32       ? PARITY_DTYPE_F32
                           : t->dtype == ST_BF16    ? PARITY_DTYPE_BF16
                           : t->dtype == ST_F16     ? PARITY_DTYPE_F16
                           : t->dtype == ST_F8_E4M3 ? PARITY_DTYPE_F8_E4M3
                           : t->dtype == ST_U8      ? TENSOR_SOURCE_U8
                                                    : UINT32_MAX;
    return (tensor_source){where, dtype, st_dtype_name(t->dtype), t->ndim, t->shape, t->data, 1};
}

/* A weight's values from src, bound to its slot e->dst. */
static int bind_source(parity_model *m, const tensor_source *src, const expected *e) {
    tensor_values v;
    TRY(tensor_import(src, e, &v));
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

static int bind_tensor(parity_model *m, const st_file *f, const st_tensor *t, const expected *e) {
    char where[512];
    const tensor_source src = source_of(f, t, where, sizeof where);
    return bind_source(m, &src, e);
}

/* A routed expert's weight from its rows of a fused tensor (fused_experts.h): BF16 used in
 * place as a per-expert tensor's is, F16 and F32 converted. */
static int bind_fused(parity_model *m, const fused_view *view, const expected *e) {
    char where[600];
    tensor_source src = source_of(view->file, view->tensor, where, sizeof where);
    const size_t n = strlen(where);
    snprintf(where + n, sizeof where - n, " (expert %u's %s)", view->expert, view->part);
    src.ndim = 2;
    src.shape = view->shape;
    src.data = (const uint8_t *)src.data + view->offset * st_dtype_size(view->tensor->dtype);
    return bind_source(m, &src, e);
}

/* ---- files --------------------------------------------------------------------------- */

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
    TRY(read_file_capped(index_path, 64u << 20, PARITY_ERR_INDEX, &text, &len));
    json_doc *doc;
    char err[256];
    int rc = json_parse(text, len, &doc, err, sizeof err);
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
    return st_find_in(m->files, m->n_files, name, file);
}

/* A tensor of the checkpoint as a tensor_source (`where` its buffer for messages), or 0 when
 * no file holds NAME. */
static int find_source(const parity_model *m, const char *name, char *where, size_t where_size,
                       tensor_source *out) {
    const st_file *f;
    const st_tensor *t = find_tensor(m, name, &f);
    if (!t) return 0;
    *out = source_of(f, t, where, where_size);
    return 1;
}

/* The imported codes become w's: the model owns the buffers, w->shipped the codes and scales
 * of format `gemm`. w holds no values (bf16, master) until a reader asks for them
 * (model_weight_values): a model served under the checkpoint's format holds the codes alone. */
static int install_shipped(parity_model *m, weight *w, const expected *e, shipped_values *v,
                           int gemm, int scale_dtype) {
    quant_weight *q = model_own(m, px_calloc(1, sizeof *q, "shipped weight"));
    if (!q) {
        shipped_values_free(v);
        return PARITY_ERR_OUT_OF_MEMORY;
    }
    /* the model frees what the import allocated (model_own frees a buffer it cannot take) */
    if (!v->codes_mapped && !model_own(m, v->codes)) {
        if (!v->scales_mapped) px_free(v->scales);
        return PARITY_ERR_OUT_OF_MEMORY;
    }
    if (!v->scales_mapped && !model_own(m, v->scales)) return PARITY_ERR_OUT_OF_MEMORY;
    q->codes = v->codes;
    q->scales = v->scales;
    q->tensor_scale = v->tensor_scale;
    q->input_scale = v->input_scale;
    w->rows = e->rows;
    w->cols = e->cols;
    w->bf16 = NULL;
    w->master = NULL;
    w->shipped = q;
    w->shipped_gemm = (uint8_t)gemm;
    w->shipped_scale_dtype = (uint8_t)scale_dtype;
    w->shipped_value_scale = v->value_scale;
    w->shipped_scale_is_mean = v->scale_is_mean;
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

/* A quantized linear weight of the checkpoint, through the layout of its quantization method:
 * its codes and companion tensors found by their names, imported, installed. */
static int bind_quantized(parity_model *m, const char *dir, const checkpoint_layout *layout,
                          const expected *e) {
    char where[1 + LAYOUT_COMPANIONS][512], name[160];
    tensor_source codes = {0}, found[LAYOUT_COMPANIONS];
    layout_tensors in = {.codes = &codes, .slot = e, .settings = &m->ckpt};
    const int method = m->ckpt.method;
    companion_name(e, layout->codes_suffix, 0, name, sizeof name);
    const int have = find_source(m, name, where[0], sizeof where[0], &codes);
    if (layout->codes_suffix[0]) {
        tensor_source plain;
        char wp[512];
        if (find_source(m, e->name, wp, sizeof wp, &plain))
            return set_error(PARITY_ERR_TENSOR_UNEXPECTED, "%s: quantization_config (quant_method "
                             "%s) quantizes this layer, whose codes are '%s' (a layer kept in "
                             "bf16 is named in modules_to_not_convert)", wp,
                             quant_method_name(method), name);
    }
    if (!have)
        return set_error(PARITY_ERR_TENSOR_MISSING, "%s: tensor '%s' (the %s codes of %s, shape %s) "
                         "is missing", dir, name, quant_method_name(method), e->name, e->shape_doc);
    for (int i = 0; i < LAYOUT_COMPANIONS && layout->companions[i]; i++) {
        const char *suffix = layout->companions[i];
        companion_name(e, suffix, suffix[0] == '.', name, sizeof name);
        if (find_source(m, name, where[1 + i], sizeof where[1 + i], &found[i]))
            in.companion[i] = &found[i];
    }
    shipped_values v;
    TRY(layout->import(&in, &v));
    return install_shipped(m, e->dst, e, &v, layout->gemm, v.scale_dtype);
}

/* Whether NAME is a companion tensor (scales, or MXFP4's blocks) of a weight the checkpoint
 * quantizes. */
static int is_shipped_companion(const parity_model *m, const checkpoint_layout *layout,
                                const char *name) {
    if (!layout) return 0;
    const char *suffixes[LAYOUT_COMPANIONS + 2] = {layout->codes_suffix};
    for (int i = 0; i < LAYOUT_COMPANIONS; i++) suffixes[1 + i] = layout->companions[i];
    const size_t n = strlen(name);
    char base[160];
    for (int s = 0; s < LAYOUT_COMPANIONS + 1; s++) {
        const char *suffix = suffixes[s];
        if (!suffix || !suffix[0]) continue;
        /* "<module>.input_scale" belongs to "<module>.weight" */
        const int module_level = suffix[0] == '.';
        const size_t k = strlen(suffix), extra = module_level ? 7 : 0;
        if (n <= k || n - k + extra >= sizeof base || strcmp(name + n - k, suffix)) continue;
        memcpy(base, name, n - k);
        snprintf(base + n - k, sizeof base - (n - k), "%s", module_level ? ".weight" : "");
        const expected *e = model_find_tensor(m, base);
        if (e && e->linear && !e->dst->keep_bf16) return 1;
    }
    return 0;
}

static int bind_all(parity_model *m, const char *dir) {
    size_t n;
    const expected *e = model_tensors(m, &n);
    int rc = PARITY_OK;
    const checkpoint_layout *layout = layout_of_method(m->ckpt.method);
    const int quantized = layout != NULL;
    for (size_t i = 0; i < n; i++)
        e[i].dst->keep_bf16 = quantized && e[i].linear && quant_checkpoint_keeps(&m->ckpt, e[i].name);
    fused_layer *fused = NULL; /* the layers whose experts are fused tensors (NULL: none) */
    rc = fused_experts_find(m, quantized, &fused);
    for (size_t i = 0; i < n && rc == PARITY_OK; i++) {
        const st_file *f;
        fused_view view;
        if (fused_expert_view(m, fused, &e[i], &view)) {
            rc = bind_fused(m, &view, &e[i]);
            continue;
        }
        if (quantized && e[i].linear && !e[i].dst->keep_bf16) {
            rc = bind_quantized(m, dir, layout, &e[i]);
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
            int known = ignorable(m, name) || is_shipped_companion(m, layout, name) ||
                        fused_experts_hold(m, fused, name);
            for (size_t i = 0; i < n && !known; i++) known = !strcmp(e[i].name, name);
            if (!known)
                rc = set_error(PARITY_ERR_TENSOR_UNEXPECTED,
                               "%s: tensor '%s' is not part of a %s model with this config%s",
                               f->path, name, parity_arch_name((int)m->config.arch),
                               strstr(name, "_scale") ? " (a scale of a weight the checkpoint "
                                                            "does not quantize)" : "");
        }
    }
    px_free(fused);
    return rc;
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
    if (!rc && !(rc = read_file_capped(path, 16u << 20, PARITY_ERR_INDEX, &text, &text_len)))
        rc = quant_checkpoint_parse(text, text_len, path, &ckpt);
    px_free(text);
    text = NULL;
    /* a ModelOpt checkpoint may say how it is quantized in hf_quant_config.json alone */
    snprintf(path, plen, "%s/hf_quant_config.json", dir);
    if (!rc && ckpt.method == QUANT_METHOD_NONE && file_exists(path) &&
        !(rc = read_file_capped(path, 16u << 20, PARITY_ERR_INDEX, &text, &text_len)))
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
    m->release_source = release_checkpoint;
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
    TRY(parity_config_builtin(name, &c));
    return parity_model_synthetic(&c, seed, out);
}
