/* Weight updates from a learner, and the checks that they arrived intact: a manifest of
 * per-tensor checksums, and a probe of log-probs. */
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>

#include "internal.h"
#include "json.h"
#include "model.h"
#include "sampling.h"

uint64_t parity_model_version(const parity_model *m) {
    if (!m) return 0;
    if (pthread_rwlock_rdlock((pthread_rwlock_t *)&m->use_lock) != 0) return m->version;
    uint64_t v = m->version;
    pthread_rwlock_unlock((pthread_rwlock_t *)&m->use_lock);
    return v;
}

/* ---- updates -------------------------------------------------------------------------------- */

/* A checked tensor waiting to go in: converted into new buffers (v), or, when the model owns
 * the buffers the weight holds (a cast or copy from loading or an earlier update), to be
 * converted into them in place once no call runs (in_place, src). */
typedef struct staged {
    weight *w;
    tensor_values v;
    int in_place;
    tensor_source src;
} staged;

int parity_model_update(parity_model *m, const parity_tensor_data *tensors, size_t n) {
    clear_error();
    if (!m || (!tensors && n))
        return set_error(PARITY_ERR_INVALID_ARGUMENT, "model or tensors is NULL");
    if (n == 0) return set_error(PARITY_ERR_EMPTY_INPUT, "no tensors to update");
    staged *st = px_calloc(n, sizeof *st, "staged tensors");
    int rc = st ? PARITY_OK : PARITY_ERR_OUT_OF_MEMORY;
    /* everything is checked and converted before anything changes */
    for (size_t i = 0; i < n && !rc; i++) {
        const parity_tensor_data *t = &tensors[i];
        if (!t->name) {
            rc = set_error(PARITY_ERR_INVALID_ARGUMENT, "update %zu has no name", i);
            break;
        }
        const expected *slot = model_find_tensor(m, t->name);
        if (!slot) {
            rc = set_error(PARITY_ERR_TENSOR_UNEXPECTED, "update of '%s': the model has no such tensor",
                           t->name);
            break;
        }
        for (size_t j = 0; j < i && !rc; j++)
            if (!strcmp(tensors[j].name, t->name))
                rc = set_error(PARITY_ERR_ST_DUPLICATE, "update of '%s': listed twice", t->name);
        if (rc) break;
        char where[160];
        snprintf(where, sizeof where, "update of '%s'", t->name);
        if (t->ndim != 1 && t->ndim != 2) {
            rc = set_error(PARITY_ERR_TENSOR_SHAPE, "%s: ndim is %u, the model's tensors have 1 or 2",
                           where, t->ndim);
            break;
        }
        const tensor_source src = {where, t->dtype, NULL, t->ndim, t->shape, t->data, 0};
        weight *w = st[i].w = slot->dst;
        /* the old values are overwritten only after every tensor passed its checks; a buffer
         * the model does not own (a mapped checkpoint's) is never written */
        st[i].in_place = model_owns(m, w->bf16) &&
                         (t->dtype == PARITY_DTYPE_BF16 || model_owns(m, w->master));
        st[i].src = src;
        st[i].src.where = NULL;  /* `where` is this loop's buffer: only the checks print it */
        rc = st[i].in_place ? tensor_check(&src, slot) : tensor_import(&src, slot, &st[i].v);
        /* a model an fp16 policy reads must be able to hold the new values in fp16 */
        if (!rc && w->fp16) rc = tensor_check_fp16(&src, (uint64_t)w->rows * w->cols);
    }
    /* room in the owned list, so that the swap below cannot fail */
    if (!rc && m->n_owned + 2 * n > m->cap_owned) {
        size_t want = m->n_owned + 2 * n;
        void **grown = px_realloc(m->owned, want * sizeof *grown, "model buffer list");
        if (!grown) rc = PARITY_ERR_OUT_OF_MEMORY;
        else {
            m->owned = grown;
            m->cap_owned = want;
        }
    }
    /* the rows an fp8 requantization widens bf16 values into, so that it cannot fail */
    float *fp8_rows = NULL;
    size_t widest = 0;
    for (size_t i = 0; !rc && i < n; i++)
        for (int q = 0; q < FP8_QUANTIZERS; q++)
            if (st[i].w->fp8[q] && st[i].w->cols > widest) widest = st[i].w->cols;
    if (!rc && widest && !(fp8_rows = px_malloc(128 * widest * sizeof(float), "fp8 quantization rows")))
        rc = PARITY_ERR_OUT_OF_MEMORY;
    if (!rc && pthread_rwlock_trywrlock(&m->use_lock) != 0)
        rc = set_error(PARITY_ERR_BUSY, "a scorer or sampler of this model is inside a call: "
                       "weights can only be updated while no call runs");
    if (rc) {
        for (size_t i = 0; st && i < n; i++) tensor_values_free(&st[i].v);
        px_free(st);
        px_free(fp8_rows);
        return rc;
    }
    for (size_t i = 0; i < n; i++) {
        weight *w = st[i].w;
        if (st[i].in_place) {
            const uint64_t count = (uint64_t)w->rows * w->cols;
            const int bf16_source = st[i].src.dtype == PARITY_DTYPE_BF16;
            tensor_convert_into(&st[i].src, count, (uint16_t *)w->bf16,
                                bf16_source ? NULL : (float *)w->master);
            if (bf16_source) {
                model_disown(m, w->master);  /* BF16 values have no fp32 master */
                w->master = NULL;
            }
        } else {
            model_disown(m, w->bf16);
            model_disown(m, w->master);
            /* an update's values are copies (owned[0] the bf16, owned[1] an fp32 master) */
            w->bf16 = model_own(m, st[i].v.owned[0]);
            w->master = st[i].v.owned[1] ? model_own(m, st[i].v.owned[1]) : NULL;
        }
        /* the fp32 copies a backend or policy reads, in place */
        if (w->wide) weight_widen_into(w, w->wide);
        if (w->fp16) weight_fp16_into(w, w->fp16);
        for (int q = 0; q < FP8_QUANTIZERS; q++) /* requantized from the new values */
            if (w->fp8[q]) fp8_weight_quantize(w, q, w->fp8[q], fp8_rows);
    }
    if (m->config.tie_word_embeddings) m->lm_head = m->embed;
    m->version++;
    pthread_rwlock_unlock(&m->use_lock);
    px_free(st);
    px_free(fp8_rows);
    return PARITY_OK;
}

/* ---- manifests -------------------------------------------------------------------------- */

/* FNV-1a 64 of the two little-endian bytes of one bf16 value, continuing from h. */
#define FNV1A64_OFFSET 0xcbf29ce484222325ull
#define FNV1A64_PRIME 0x100000001b3ull
static inline uint64_t fnv1a64_step(uint64_t h, uint16_t v) {
    h = (h ^ (v & 0xffu)) * FNV1A64_PRIME;
    return (h ^ (uint16_t)(v >> 8)) * FNV1A64_PRIME;
}

/* FNV-1a 64 over the little-endian bytes of n bf16 values. */
static uint64_t fnv1a64_bf16(const uint16_t *x, uint64_t n) {
    uint64_t h = FNV1A64_OFFSET;
    for (uint64_t i = 0; i < n; i++) h = fnv1a64_step(h, x[i]);
    return h;
}

int parity_tensor_checksum(uint32_t dtype, const void *data, uint64_t n, uint64_t *fnv1a64) {
    clear_error();
    if (!fnv1a64 || (!data && n))
        return set_error(PARITY_ERR_INVALID_ARGUMENT, "parity_tensor_checksum: data or output is NULL");
    if (dtype > PARITY_DTYPE_F32)
        return set_error(PARITY_ERR_INVALID_ARGUMENT,
                         "parity_tensor_checksum: dtype %u is not BF16 (0), F16 (1) or F32 (2)", dtype);
    /* The caller's buffer need not be aligned: values are read with memcpy. */
    const uint8_t *src = data;
    uint64_t h = FNV1A64_OFFSET;
    for (uint64_t i = 0; i < n; i++) {
        uint16_t v;
        float f;
        if (dtype == PARITY_DTYPE_F32) {
            memcpy(&f, src + 4 * i, 4);
            v = bf16_from_f32(f);
        } else {
            memcpy(&v, src + 2 * i, 2);
            if (dtype == PARITY_DTYPE_F16) v = bf16_from_f32(f16_to_f32(v));
        }
        h = fnv1a64_step(h, v);
    }
    *fnv1a64 = h;
    return PARITY_OK;
}

int parity_model_write_manifest(const parity_model *m, const char *path) {
    clear_error();
    if (!m || !path) return set_error(PARITY_ERR_INVALID_ARGUMENT, "model or path is NULL");
    int rc = model_enter(m);
    if (rc) return rc;
    size_t n;
    const expected *slots = model_tensors(m, &n);
    FILE *f = fopen(path, "w");
    if (!f) {
        rc = set_error(PARITY_ERR_IO, "%s: cannot create: %s", path, strerror(errno));
    } else {
        fprintf(f, "{\"version\": %" PRIu64 ", \"tensors\": {", m->version);
        for (size_t i = 0; i < n; i++) {
            const weight *w = slots[i].dst;
            fprintf(f, "%s\n  \"%s\": {\"shape\": [", i ? "," : "", slots[i].name);
            if (slots[i].rows) fprintf(f, "%u, %u", w->rows, w->cols);
            else fprintf(f, "%u", w->cols);
            fprintf(f, "], \"dtype\": \"BF16\", \"fnv1a64\": \"%016" PRIx64 "\"}",
                    fnv1a64_bf16(w->bf16, (uint64_t)w->rows * w->cols));
        }
        fprintf(f, "\n}}\n");
        if (fclose(f) != 0) rc = set_error(PARITY_ERR_IO, "%s: write failed: %s", path, strerror(errno));
    }
    model_leave(m);
    return rc;
}

/* Appends a line to the report; counts it. */
typedef struct report {
    char *buf;
    size_t size, used;
    unsigned count;
} report;

static void report_line(report *r, const char *fmt, ...) PARITY_PRINTF(2, 3);
static void report_line(report *r, const char *fmt, ...) {
    r->count++;
    if (!r->buf || r->used + 1 >= r->size) return;
    va_list ap;
    va_start(ap, fmt);
    int k = vsnprintf(r->buf + r->used, r->size - r->used, fmt, ap);
    va_end(ap);
    if (k < 0) return;
    r->used = r->used + (size_t)k < r->size ? r->used + (size_t)k : r->size - 1;
    if (r->used + 1 < r->size) {
        r->buf[r->used++] = '\n';
        r->buf[r->used] = '\0';
    }
}

static int read_manifest(const char *path, json_doc **doc) {
    FILE *f = fopen(path, "rb");
    if (!f) return set_error(PARITY_ERR_IO, "%s: cannot open: %s", path, strerror(errno));
    char *text = NULL;
    size_t len = 0, cap = 0;
    int rc = PARITY_OK;
    for (;;) {
        if (len == cap) {
            if (cap >= (256u << 20)) {
                rc = set_error(PARITY_ERR_VERIFY, "%s: larger than 256 MB", path);
                break;
            }
            cap = cap ? 2 * cap : 65536;
            char *grown = px_realloc(text, cap, "manifest");
            if (!grown) {
                rc = PARITY_ERR_OUT_OF_MEMORY;
                break;
            }
            text = grown;
        }
        size_t got = fread(text + len, 1, cap - len, f);
        len += got;
        if (!got) break;
    }
    if (!rc && ferror(f)) rc = set_error(PARITY_ERR_IO, "%s: read error", path);
    fclose(f);
    char err[256];
    if (!rc) {
        rc = json_parse(text, len, doc, err, sizeof err);
        if (rc == PARITY_ERR_JSON_SYNTAX) set_error(rc, "%s: %s", path, err);
    }
    px_free(text);
    return rc;
}

int parity_model_verify(const parity_model *m, const char *path, char *report_buf,
                        size_t report_size) {
    clear_error();
    if (!m || !path) return set_error(PARITY_ERR_INVALID_ARGUMENT, "model or manifest path is NULL");
    if (report_buf && report_size) report_buf[0] = '\0';
    json_doc *doc;
    int rc = read_manifest(path, &doc);
    if (rc) return rc;
    const json_value *root = json_doc_root(doc);
    const json_value *tensors = json_get(root, "tensors"), *version = json_get(root, "version");
    if (!tensors || tensors->type != JSON_OBJECT || !version || version->type != JSON_NUMBER ||
        !version->is_int || version->integer < 0) {
        json_free(doc);
        return set_error(PARITY_ERR_VERIFY, "%s: not a manifest (wants {\"version\": N, "
                         "\"tensors\": {...}})", path);
    }
    if ((rc = model_enter(m))) {
        json_free(doc);
        return rc;
    }
    size_t n;
    const expected *slots = model_tensors(m, &n);
    report r = {report_buf, report_size, 0, 0};
    if ((uint64_t)version->integer != m->version)
        report_line(&r, "version: the manifest has %lld, the model %" PRIu64,
                    (long long)version->integer, m->version);
    for (size_t i = 0; i < n; i++) {
        const weight *w = slots[i].dst;
        const json_value *e = json_get(tensors, slots[i].name);
        if (!e || e->type != JSON_OBJECT) {
            report_line(&r, "%s: in the model, not in the manifest", slots[i].name);
            continue;
        }
        const json_value *shape = json_get(e, "shape"), *dtype = json_get(e, "dtype"),
                         *sum = json_get(e, "fnv1a64");
        uint64_t want[2] = {slots[i].rows ? w->rows : w->cols, w->cols};
        size_t ndim = slots[i].rows ? 2 : 1;
        int shape_ok = shape && shape->type == JSON_ARRAY && shape->count == ndim;
        for (size_t d = 0; shape_ok && d < ndim; d++)
            shape_ok = shape->items[d].type == JSON_NUMBER && shape->items[d].is_int &&
                       (uint64_t)shape->items[d].integer == want[d];
        if (!shape_ok) {
            report_line(&r, "%s: shape differs (the model has %s)", slots[i].name, slots[i].shape_doc);
            continue;
        }
        if (!dtype || dtype->type != JSON_STRING || strcmp(dtype->str, "BF16")) {
            report_line(&r, "%s: dtype is %s in the manifest, BF16 in the model", slots[i].name,
                        dtype && dtype->type == JSON_STRING ? dtype->str : "missing");
            continue;
        }
        char have[17];
        snprintf(have, sizeof have, "%016" PRIx64, fnv1a64_bf16(w->bf16, (uint64_t)w->rows * w->cols));
        if (!sum || sum->type != JSON_STRING || strcmp(sum->str, have))
            report_line(&r, "%s: checksum differs (manifest %s, model %s): the values differ",
                        slots[i].name, sum && sum->type == JSON_STRING ? sum->str : "missing", have);
    }
    for (size_t k = 0; k < tensors->count; k++)
        if (!model_find_tensor(m, tensors->keys[k]))
            report_line(&r, "%s: in the manifest, not in the model", tensors->keys[k]);
    model_leave(m);
    json_free(doc);
    if (r.count)
        return set_error(PARITY_ERR_VERIFY, "%u difference%s between the model and %s", r.count,
                         r.count == 1 ? "" : "s", path);
    return PARITY_OK;
}

/* ---- the probe --------------------------------------------------------------------------- */

int parity_scorer_probe(parity_scorer *scorer, const int32_t *tokens, uint32_t len,
                        const float *expected_lp) {
    clear_error();
    if (!scorer || !tokens || !expected_lp)
        return set_error(PARITY_ERR_INVALID_ARGUMENT, "scorer, tokens or expected is NULL");
    if (len < 2) return set_error(PARITY_ERR_EMPTY_INPUT, "a probe needs at least 2 tokens");
    float *got = px_malloc((size_t)(len - 1) * sizeof *got, "probe log-probs");
    if (!got) return PARITY_ERR_OUT_OF_MEMORY;
    parity_score_options o;
    parity_score_default_options(&o);
    int rc = parity_score(scorer, &o, tokens, &len, 1, got, NULL, NULL, NULL);
    if (!rc) {
        uint32_t differ = 0, first = 0;
        double worst = 0;
        for (uint32_t t = 0; t + 1 < len; t++)
            if (f32_bits(got[t]) != f32_bits(expected_lp[t])) {
                if (!differ++) first = t;
                double d = fabs((double)got[t] - (double)expected_lp[t]);
                if (!(d <= worst)) worst = d;
            }
        if (differ)
            rc = set_error(PARITY_ERR_VERIFY,
                           "probe: %u of %u log-probs differ from the learner's (first at "
                           "position %u, max |difference| %.9g): the weights, policy or "
                           "backend do not match",
                           differ, len - 1, first + 1, worst);
    }
    px_free(got);
    return rc;
}
