/* parity-bisect: where an engine's rounding departs from each preset's, from a dump of its
 * intermediates.
 *
 *   parity-bisect --model DIR|synthetic:NAME[:SEED] --dump FILE [--policy P]...
 *                 [--between A B] [--threads N] [--json]
 *
 * The dump (docs/DESIGN.md, "Intermediates dump and bisect") is one safetensors file holding
 * an engine's intermediates for one sequence of T tokens, each [T, width] in the 16-bit dtype
 * the engine held them, with __metadata__ parity_dump "1", engine, model_type and dtype. For
 * each preset (every preset by default: PRESET+fp16 on an F16 dump, where fp32 is skipped;
 * or each --policy) every point is recomputed with the library's public ops from the dump's
 * OWN inputs to it (teacher forcing) and compared bit for bit; the report gives each point's
 * differing elements, the first rounding point that departs, the fraction of rounding-point
 * elements differing from there on, per-kind totals and the GEMMs' summation-order floor.
 * --between A B instead attributes the k3 KL and bias between A's and B's raw log-probs of the
 * dump's tokens (parity_score) to the switches where A and B differ, flipped from A toward B
 * one at a time in the policy's field order (bench/mismatch.h's definitions).
 *
 * Prints a table, or with --json the report as one JSON line, byte for byte what
 * `python3 -m parity.bisect --json` prints (python/parity/bisect.py: the same points, order,
 * checks and messages). Exit status: 0, 2 for bad input (a dump missing a tensor, a shape,
 * dtype or metadata field the model does not match, tokens out of range, an unknown preset, an
 * unsupported model), 1 for another failure. The dump is read with the library's own
 * safetensors reader (linked from its internal archive, as the benchmarks link internal code).
 */
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "checkpoint/json.h"
#include "checkpoint/safetensors.h"
#include "options.h"
#include "parity.h"

#define MAX_POLICIES 32
#define NAME_LEN 96

static void usage(void) {
    fprintf(stderr,
            "usage: parity-bisect --model DIR|synthetic:NAME[:SEED] --dump FILE [--policy P]...\n"
            "                     [--between A B] [--threads N] [--json]\n");
}

/* ---- failures: a message on stderr and the exit status (2 bad input, 1 otherwise) ------------ */

static int bad(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    print_error(fmt, ap);
    va_end(ap);
    return 2;
}

/* A library call that failed: its status and message, as the binding's ParityError says it.
 * Bad input (a policy, a token, a shape) is 2; memory, files and the rest 1. */
static int lib_failed(int status) {
    fprintf(stderr, "error: %s: %s\n", parity_status_name(status), parity_last_error());
    return status == PARITY_ERR_OUT_OF_MEMORY || status == PARITY_ERR_IO ? 1 : 2;
}

#define TRY_LIB(call)                                \
    do {                                             \
        int try_status_ = (call);                    \
        if (try_status_) return lib_failed(try_status_); \
    } while (0)
#define TRY_RC(call)                  \
    do {                              \
        int try_rc_ = (call);         \
        if (try_rc_) return try_rc_;  \
    } while (0)

static void *xcalloc(size_t n, size_t size) {
    void *p = calloc(n ? n : 1, size);
    if (!p) {
        fprintf(stderr, "error: out of memory\n");
        exit(1);
    }
    return p;
}

/* ---- JSON text: as python/parity/bisect.py's _json writes it ------------------------------- */

/* A string as Python's json.dumps writes it (' ' to '~' as they are, the rest \uXXXX, surrogate
 * pairs beyond the BMP). s is valid UTF-8 (the safetensors reader checked the header). */
static void json_string(FILE *out, const char *s) {
    fputc('"', out);
    for (const unsigned char *p = (const unsigned char *)s; *p;) {
        unsigned c = *p++;
        if (c >= 0x80) { /* decode the rest of the sequence */
            int more = c >= 0xf0 ? 3 : c >= 0xe0 ? 2 : 1;
            c &= more == 3 ? 0x07 : more == 2 ? 0x0f : 0x1f;
            for (int i = 0; i < more && *p; i++) c = (c << 6) | (*p++ & 0x3f);
        }
        if (c == '"' || c == '\\') fprintf(out, "\\%c", (char)c);
        else if (c == '\n') fputs("\\n", out);
        else if (c == '\r') fputs("\\r", out);
        else if (c == '\t') fputs("\\t", out);
        else if (c == '\b') fputs("\\b", out);
        else if (c == '\f') fputs("\\f", out);
        else if (c >= 0x10000)
            fprintf(out, "\\u%04x\\u%04x", 0xd800 + ((c - 0x10000) >> 10),
                    0xdc00 + ((c - 0x10000) & 0x3ff));
        else if (c < 0x20 || c >= 0x7f) fprintf(out, "\\u%04x", c);  /* beyond ' '..'~' */
        else fputc((int)c, out);
    }
    fputc('"', out);
}

static void json_number(FILE *out, double x) {
    if (isfinite(x)) fprintf(out, "%.9g", x);
    else fputs("null", out);
}

/* ---- the dump ------------------------------------------------------------------------------ */

typedef struct dump {
    const char *path;
    st_file *file;
    json_doc *header;
    const json_value *meta;  /* __metadata__, or NULL */
    int f16;                 /* the 16-bit tensors are F16 (else BF16) */
    uint32_t T;
    int32_t *tokens;
} dump;

static const char *meta_get(const dump *d, const char *key) {
    const json_value *v = d->meta ? json_get(d->meta, key) : NULL;
    return v && v->type == JSON_STRING ? v->str : NULL;
}

static int sparse_layer(const parity_config *c, uint32_t i) {
    const uint32_t step = c->decoder_sparse_step ? c->decoder_sparse_step : 1;
    return c->num_experts > 0 && (i + 1) % step == 0 &&
           !((c->mlp_only_layers[i / 64] >> (i % 64)) & 1);
}

/* One tensor the dump must (or may) hold. */
typedef struct want {
    char name[NAME_LEN];
    st_dtype dtype;
    uint64_t rows, cols;  /* cols 0: 1-D [rows] */
    int optional;
} want;

static void add_want(want *w, size_t *n, const char *name, st_dtype dtype, uint64_t rows,
                     uint64_t cols, int optional) {
    want *x = &w[(*n)++];
    snprintf(x->name, sizeof x->name, "%s", name);
    x->dtype = dtype, x->rows = rows, x->cols = cols, x->optional = optional;
}

/* The tensors of a dump of T tokens for config c, in forward order (bisect.py's
 * expected_tensors); returns how many (w holds 16 + 24 per layer). */
static size_t expected_tensors(const parity_config *c, uint32_t T, st_dtype half, want *w) {
    const uint64_t H = c->hidden_size, hd = c->head_dim;
    const uint64_t q = c->num_attention_heads * hd, kv = c->num_key_value_heads * hd;
    size_t n = 0;
    char name[NAME_LEN];
    add_want(w, &n, "tokens", ST_I32, T, 0, 0);
    add_want(w, &n, "logprobs", ST_F32, T - 1, 0, 0);
    add_want(w, &n, "embed", half, T, H, 0);
    for (uint32_t i = 0; i < c->num_hidden_layers; i++) {
        const char *parts[16];
        uint64_t widths[16];
        size_t k = 0;
#define PART(part_, width_) (parts[k] = (part_), widths[k++] = (width_))
        if (i) PART("input", H);
        PART("attn_norm", H), PART("q_proj", q), PART("k_proj", kv), PART("v_proj", kv);
        if (c->qk_norm) PART("q_norm", q), PART("k_norm", kv);
        PART("q_rope", q), PART("k_rope", kv), PART("attn", q), PART("o_proj", H);
        PART("attn_residual", H), PART("mlp_norm", H);
#undef PART
        for (size_t j = 0; j < k; j++) {
            snprintf(name, sizeof name, "layers.%u.%s", i, parts[j]);
            add_want(w, &n, name, half, T, widths[j], 0);
        }
        if (sparse_layer(c, i)) {
            snprintf(name, sizeof name, "layers.%u.router_logits", i);
            add_want(w, &n, name, half, T, c->num_experts, 0);
            snprintf(name, sizeof name, "layers.%u.router_ids", i);
            add_want(w, &n, name, ST_I32, T, c->num_experts_per_tok, 1);
            snprintf(name, sizeof name, "layers.%u.router_weights", i);
            add_want(w, &n, name, ST_F32, T, c->num_experts_per_tok, 1);
        } else {
            static const char *const mlp[] = {"gate_proj", "up_proj", "swiglu"};
            for (size_t j = 0; j < 3; j++) {
                snprintf(name, sizeof name, "layers.%u.%s", i, mlp[j]);
                add_want(w, &n, name, half, T, c->intermediate_size, 0);
            }
        }
        snprintf(name, sizeof name, "layers.%u.mlp", i);
        add_want(w, &n, name, half, T, H, 0);
    }
    add_want(w, &n, "final_residual", half, T, H, 0);
    add_want(w, &n, "final_norm", half, T, H, 0);
    add_want(w, &n, "logits", half, T, c->vocab_size, 0);
    return n;
}

/* "[a, b]" of a shape. */
static const char *shape_text(char *buf, size_t size, const uint64_t *shape, uint32_t ndim) {
    size_t at = (size_t)snprintf(buf, size, "[");
    for (uint32_t i = 0; i < ndim && at < size; i++)
        at += (size_t)snprintf(buf + at, size - at, "%s%llu", i ? ", " : "",
                               (unsigned long long)shape[i]);
    if (at < size) snprintf(buf + at, size - at, "]");
    return buf;
}

/* The metadata value as Python's json.dumps quotes it, for messages. */
static const char *quoted(char *buf, size_t size, const char *s) {
    FILE *f = fmemopen(buf, size, "w");
    if (!f) return s;
    json_string(f, s);
    fclose(f);
    return buf;
}

static int check_model(const parity_config *c) {
    static const char *const rope[] = {"default", "linear", "llama3", "yarn"};
    if (c->arch == PARITY_ARCH_OURO)
        return bad("the model is a looped model (ouro): the bisect recomputes a plain decoder "
                   "stack only");
    if (c->rope_type != PARITY_ROPE_DEFAULT)
        return bad("the model's rope scaling (%s) is not supported: the bisect recomputes "
                   "default RoPE only", c->rope_type < 4 ? rope[c->rope_type] : "unknown");
    return 0;
}

/* Opens and checks the dump against the model's config, in the order bisect.py's Dump does,
 * with its messages. */
static int dump_open(dump *d, const char *path, const parity_config *c) {
    memset(d, 0, sizeof *d);
    d->path = path;
    int rc = st_open(path, &d->file);
    if (rc) { /* a file missing or not safetensors: bad input, as bisect.py's OSError */
        lib_failed(rc);
        return 2;
    }
    const uint8_t *base = d->file->base;
    uint64_t hlen = 0;
    for (int i = 7; i >= 0; i--) hlen = hlen << 8 | base[i];
    char err[200];
    if (json_parse((const char *)base + 8, (size_t)hlen, &d->header, err, sizeof err))
        return bad("%s: the header is not JSON: %s", path, err);
    d->meta = json_get(json_doc_root(d->header), "__metadata__");
    char q[512];
    const char *version = meta_get(d, "parity_dump");
    if (!version)
        return bad("%s: __metadata__ has no parity_dump (not an intermediates dump)", path);
    if (strcmp(version, "1"))
        return bad("%s: __metadata__ parity_dump is %s: this bisect reads format 1", path,
                   quoted(q, sizeof q, version));
    static const char *const fields[] = {"engine", "model_type", "dtype"};
    for (size_t i = 0; i < 3; i++)
        if (!meta_get(d, fields[i])) return bad("%s: __metadata__ has no %s", path, fields[i]);
    const char *dtype = meta_get(d, "dtype");
    if (strcmp(dtype, "bf16") && strcmp(dtype, "f16"))
        return bad("%s: __metadata__ dtype is %s: \"bf16\" or \"f16\"", path,
                   quoted(q, sizeof q, dtype));
    d->f16 = !strcmp(dtype, "f16");
    const char *arch = parity_arch_name((int)c->arch);
    if (strcmp(meta_get(d, "model_type"), arch))
        return bad("%s: __metadata__ model_type is %s, the model is %s", path,
                   quoted(q, sizeof q, meta_get(d, "model_type")), arch);
    TRY_RC(check_model(c));
    const st_tensor *tok = st_find(d->file, "tokens");
    if (!tok) return bad("%s: no tensor tokens in the dump", path);
    char s1[64], s2[64];
    if (tok->dtype != ST_I32 || tok->ndim != 1)
        return bad("%s: tensor tokens is %s %s: I32 [T] needed", path, st_dtype_name(tok->dtype),
                   shape_text(s1, sizeof s1, tok->shape, tok->ndim));
    if (tok->shape[0] < 2)
        return bad("%s: tensor tokens holds %llu ids: a dump needs at least 2", path,
                   (unsigned long long)tok->shape[0]);
    if (tok->shape[0] > (1u << 24)) return bad("%s: tensor tokens holds too many ids", path);
    d->T = (uint32_t)tok->shape[0];
    want *w = xcalloc(16 + 24 * (size_t)c->num_hidden_layers, sizeof *w);
    const size_t n = expected_tensors(c, d->T, d->f16 ? ST_F16 : ST_BF16, w);
    rc = 0;
    for (size_t i = 0; i < n && !rc; i++) {
        const st_tensor *t = st_find(d->file, w[i].name);
        const uint64_t shape[2] = {w[i].rows, w[i].cols};
        const uint32_t ndim = w[i].cols ? 2 : 1;
        if (!t) {
            if (!w[i].optional)
                rc = bad("%s: no tensor %s in the dump (the model needs %s %s)", path, w[i].name,
                         st_dtype_name(w[i].dtype), shape_text(s1, sizeof s1, shape, ndim));
        } else if (t->dtype != w[i].dtype) {
            rc = bad("%s: tensor %s has dtype %s, the model needs %s", path, w[i].name,
                     st_dtype_name(t->dtype), st_dtype_name(w[i].dtype));
        } else if (t->ndim != ndim || t->shape[0] != shape[0] ||
                   (ndim == 2 && t->shape[1] != shape[1])) {
            rc = bad("%s: tensor %s has shape %s, the model needs %s", path, w[i].name,
                     shape_text(s1, sizeof s1, t->shape, t->ndim),
                     shape_text(s2, sizeof s2, shape, ndim));
        }
    }
    for (size_t i = 0; i < d->file->n_tensors && !rc; i++) {
        const char *name = d->file->tensors[i].name;
        size_t j = 0;
        while (j < n && strcmp(w[j].name, name)) j++;
        if (j == n)
            rc = bad("%s: tensor %s is not one this model has (%s, %u layers)", path, name, arch,
                     c->num_hidden_layers);
    }
    free(w);
    if (rc) return rc;
    d->tokens = xcalloc(d->T, sizeof *d->tokens);
    memcpy(d->tokens, tok->data, (size_t)d->T * 4);
    for (uint32_t t = 0; t < d->T; t++)
        if (d->tokens[t] < 0 || (uint32_t)d->tokens[t] >= c->vocab_size)
            return bad("%s: tokens[%u] = %d is outside the model's vocabulary [0, %u)", path, t,
                       d->tokens[t], c->vocab_size);
    return 0;
}

static void dump_close(dump *d) {
    st_close(d->file);
    json_free(d->header);
    free(d->tokens);
}

/* {the metadata sorted by key..., "tokens": T}, as Dump.summary(). */
static void print_dump_summary(FILE *out, const dump *d) {
    const json_value *m = d->meta;
    size_t n = m && m->type == JSON_OBJECT ? m->count : 0;
    size_t *order = xcalloc(n, sizeof *order);
    for (size_t i = 0; i < n; i++) order[i] = i;
    for (size_t i = 1; i < n; i++) /* insertion sort by key: a handful of fields */
        for (size_t j = i; j > 0 && strcmp(m->keys[order[j - 1]], m->keys[order[j]]) > 0; j--) {
            size_t t = order[j];
            order[j] = order[j - 1], order[j - 1] = t;
        }
    /* a "tokens" field of the metadata keeps its place and takes the count, as a dict's
     * update does */
    int tokens_done = 0;
    fputs("{", out);
    for (size_t i = 0; i < n; i++) {
        const char *key = m->keys[order[i]];
        json_string(out, key);
        fputs(": ", out);
        if (!strcmp(key, "tokens")) fprintf(out, "%u", d->T), tokens_done = 1;
        else json_string(out, m->items[order[i]].str);
        if (i + 1 < n) fputs(", ", out);
    }
    if (!tokens_done) fprintf(out, "%s\"tokens\": %u", n ? ", " : "", d->T);
    fputs("}", out);
    free(order);
}

/* ---- 16-bit values ------------------------------------------------------------------------- */

static float widen1(uint16_t h, int f16) {
    return f16 ? parity_fp16_to_f32(h) : parity_bf16_to_f32(h);
}

static uint16_t round1(float x, int f16) {
    return f16 ? parity_fp16_from_f32(x) : parity_bf16_from_f32(x);
}

/* A copy of a 16-bit tensor of the dump (aligned, whatever the file's offsets). */
static uint16_t *dump_u16(const dump *d, const char *name, size_t *n) {
    const st_tensor *t = st_find(d->file, name);
    uint16_t *out = xcalloc((size_t)t->n_elements, 2);
    memcpy(out, t->data, (size_t)t->n_elements * 2);
    if (n) *n = (size_t)t->n_elements;
    return out;
}

static float *dump_wide(const dump *d, const char *name) {
    size_t n;
    uint16_t *h = dump_u16(d, name, &n);
    float *out = xcalloc(n, 4);
    for (size_t i = 0; i < n; i++) out[i] = widen1(h[i], d->f16);
    free(h);
    return out;
}

/* ---- the model's weights, as a policy's ops read them --------------------------------------- */

typedef struct weight_entry {
    char name[NAME_LEN];
    size_t n;
    float *f32;            /* the masters, else the bf16 values widened */
    uint16_t *half[2];     /* rounded once to bf16 [0] or fp16 [1] */
} weight_entry;

typedef struct weights {
    const parity_model *m;
    weight_entry *v;
    size_t n, cap;
} weights;

static weight_entry *weight_get(weights *w, const char *name, int *rc) {
    for (size_t i = 0; i < w->n; i++)
        if (!strcmp(w->v[i].name, name)) return &w->v[i];
    if (w->n == w->cap) {
        w->cap = w->cap ? 2 * w->cap : 64;
        weight_entry *grown = realloc(w->v, w->cap * sizeof *grown);
        if (!grown) {
            *rc = bad("out of memory");
            return NULL;
        }
        w->v = grown;
    }
    weight_entry *e = &w->v[w->n];
    memset(e, 0, sizeof *e);
    snprintf(e->name, sizeof e->name, "%s", name);
    parity_weight_info info = {.size = sizeof info};
    int s = parity_model_weight_info(w->m, name, &info);
    if (!s) {
        e->n = (size_t)(info.shape[0] * info.shape[1]);
        e->f32 = xcalloc(e->n, 4);
        s = parity_model_weight_values(w->m, name, e->f32, e->n);
    }
    if (s) {
        free(e->f32);
        *rc = lib_failed(s);
        return NULL;
    }
    w->n++;
    return e;
}

static const uint16_t *weight_half(weights *w, const char *name, int f16, int *rc) {
    weight_entry *e = weight_get(w, name, rc);
    if (!e) return NULL;
    if (!e->half[f16]) {
        e->half[f16] = xcalloc(e->n, 2);
        for (size_t i = 0; i < e->n; i++) e->half[f16][i] = round1(e->f32[i], f16);
    }
    return e->half[f16];
}

static void weights_free(weights *w) {
    for (size_t i = 0; i < w->n; i++) {
        free(w->v[i].f32);
        free(w->v[i].half[0]);
        free(w->v[i].half[1]);
    }
    free(w->v);
}

/* ---- one preset's run ------------------------------------------------------------------------ */

typedef struct point {
    char name[NAME_LEN];
    const char *kind;
    uint64_t elements, differing;
} point;

typedef struct run {
    const dump *d;
    weights *w;
    const parity_config *c;
    parity_pool *pool;
    char preset[160];
    parity_policy pol, plain;  /* plain: the gemm bf16 (lm_head and the router) */
    point *points;
    size_t n_points;
} run;

static void add_point(run *r, const char *name, const char *kind, uint64_t elements,
                      uint64_t differing) {
    point *p = &r->points[r->n_points++];
    snprintf(p->name, sizeof p->name, "%s", name);
    p->kind = kind, p->elements = elements, p->differing = differing;
}

/* Compares n 16-bit values with the dump's tensor `name`. */
static void compare16(run *r, const char *name, const char *kind, const uint16_t *got, size_t n) {
    uint16_t *want = dump_u16(r->d, name, NULL);
    uint64_t differ = 0;
    for (size_t i = 0; i < n; i++) differ += got[i] != want[i];
    free(want);
    add_point(r, name, kind, n, differ);
}

/* fp32 values rounded to the dump's dtype, compared. */
static void compare_rounded(run *r, const char *name, const char *kind, const float *y, size_t n) {
    uint16_t *h = xcalloc(n, 2);
    for (size_t i = 0; i < n; i++) h[i] = round1(y[i], r->d->f16);
    compare16(r, name, kind, h, n);
    free(h);
}

static void compare32(run *r, const char *name, const char *kind, const void *got, size_t n) {
    const st_tensor *t = st_find(r->d->file, name);
    uint64_t differ = 0;
    for (size_t i = 0; i < n; i++) {
        uint32_t a, b;
        memcpy(&a, (const uint8_t *)got + 4 * i, 4);
        memcpy(&b, t->data + 4 * i, 4);
        differ += a != b;
    }
    add_point(r, name, kind, n, differ);
}

static int norm(run *r, const char *x, const char *weight, const char *out_name) {
    const size_t T = r->d->T, H = r->c->hidden_size;
    int rc = 0;
    const uint16_t *w = weight_half(r->w, weight, r->d->f16, &rc);
    if (!w) return rc;
    uint16_t *xb = dump_u16(r->d, x, NULL), *out = xcalloc(T * H, 2);
    int s = parity_rmsnorm(&r->pol, 0, T, H, xb, H, w, r->c->rms_norm_eps, out, H);
    if (!s) compare16(r, out_name, "norm", out, T * H);
    free(xb), free(out);
    return s ? lib_failed(s) : 0;
}

static int residual_norm(run *r, const char *delta, const char *residual, const char *weight,
                         const char *residual_name, const char *norm_name) {
    const size_t T = r->d->T, H = r->c->hidden_size;
    int rc = 0;
    const uint16_t *w = weight_half(r->w, weight, r->d->f16, &rc);
    if (!w) return rc;
    uint16_t *dl = dump_u16(r->d, delta, NULL), *rs = dump_u16(r->d, residual, NULL);
    uint16_t *res = xcalloc(T * H, 2), *out = xcalloc(T * H, 2);
    int s = parity_rmsnorm_residual(&r->pol, T, H, dl, H, rs, H, w, r->c->rms_norm_eps, res, H,
                                    out, H);
    if (!s) {
        compare16(r, residual_name, "residual", res, T * H);
        compare16(r, norm_name, "norm", out, T * H);
    }
    free(dl), free(rs), free(res), free(out);
    return s ? lib_failed(s) : 0;
}

/* parity_linear of the dump's x by `weight` [n, k] (+ bias), rounded to the dump's dtype. */
static int linear(run *r, const char *x, const char *weight, size_t n, const char *out_name,
                  const char *bias, int plain) {
    const size_t T = r->d->T;
    const parity_policy *pol = plain ? &r->plain : &r->pol;
    int rc = 0;
    weight_entry *e = weight_get(r->w, weight, &rc);
    if (!e) return rc;
    const size_t k = e->n / n;
    const void *wt;
    uint32_t wd;
    if (pol->compute == PARITY_COMPUTE_FP32 || pol->gemm) {
        wd = PARITY_DTYPE_F32, wt = e->f32;
    } else {
        const int f16 = pol->compute == PARITY_COMPUTE_FP16;
        wd = f16 ? PARITY_DTYPE_F16 : PARITY_DTYPE_BF16;
        if (!(wt = weight_half(r->w, weight, f16, &rc))) return rc;
    }
    float *b = NULL;
    if (bias) {
        weight_entry *be = weight_get(r->w, bias, &rc);
        if (!be) return rc;
        b = xcalloc(n, 4);
        for (size_t i = 0; i < n; i++)
            b[i] = pol->compute == PARITY_COMPUTE_FP32 ? be->f32[i]
                                                       : widen1(round1(be->f32[i], r->d->f16),
                                                                r->d->f16);
    }
    float *xs = dump_wide(r->d, x), *y = xcalloc(T * n, 4);
    int s = parity_linear(r->pool, pol, PARITY_BACKEND_BF16, T, k, n, xs, k, wd, wt, k, b, y, n);
    if (!s) compare_rounded(r, out_name, "gemm", y, T * n);
    free(b), free(xs), free(y);
    return s ? lib_failed(s) : 0;
}

static int qk_norm(run *r, const char *x, const char *weight, size_t heads, const char *out_name) {
    const size_t T = r->d->T, hd = r->c->head_dim;
    int rc = 0;
    const uint16_t *w = weight_half(r->w, weight, r->d->f16, &rc);
    if (!w) return rc;
    uint16_t *xb = dump_u16(r->d, x, NULL), *out = xcalloc(T * heads * hd, 2);
    int s = parity_rmsnorm(&r->pol, 1, T * heads, hd, xb, hd, w, r->c->rms_norm_eps, out, hd);
    if (!s) compare16(r, out_name, "qk_norm", out, T * heads * hd);
    free(xb), free(out);
    return s ? lib_failed(s) : 0;
}

static int rope(run *r, const char *x, size_t heads, const char *out_name) {
    const size_t T = r->d->T, hd = r->c->head_dim;
    uint16_t *xb = dump_u16(r->d, x, NULL);
    int32_t *pos = xcalloc(T, 4);
    for (size_t t = 0; t < T; t++) pos[t] = (int32_t)t;
    int s = parity_rope(&r->pol, T, heads, hd, xb, heads * hd, pos, r->c->rope_theta);
    if (!s) compare16(r, out_name, "rope", xb, T * heads * hd);
    free(xb), free(pos);
    return s ? lib_failed(s) : 0;
}

static int attention(run *r, const char *prefix) {
    const size_t T = r->d->T, hd = r->c->head_dim;
    const size_t nq = r->c->num_attention_heads, nkv = r->c->num_key_value_heads;
    char name[NAME_LEN];
    snprintf(name, sizeof name, "%sq_rope", prefix);
    float *q = dump_wide(r->d, name);
    snprintf(name, sizeof name, "%sk_rope", prefix);
    float *k = dump_wide(r->d, name);
    snprintf(name, sizeof name, "%sv_proj", prefix);
    float *v = dump_wide(r->d, name);
    float *out = xcalloc(T * nq * hd, 4);
    const uint32_t length = (uint32_t)T;
    int s = parity_attention(r->pool, &r->pol, 1, &length, nq, nkv, hd, q, nq * hd, k, nkv * hd,
                             v, nkv * hd, out, nq * hd);
    snprintf(name, sizeof name, "%sattn", prefix);
    if (!s) compare_rounded(r, name, "attention", out, T * nq * hd);
    free(q), free(k), free(v), free(out);
    return s ? lib_failed(s) : 0;
}

static int swiglu(run *r, const char *prefix) {
    const size_t T = r->d->T, inter = r->c->intermediate_size;
    char name[NAME_LEN];
    snprintf(name, sizeof name, "%sgate_proj", prefix);
    uint16_t *g = dump_u16(r->d, name, NULL);
    snprintf(name, sizeof name, "%sup_proj", prefix);
    uint16_t *u = dump_u16(r->d, name, NULL), *out = xcalloc(T * inter, 2);
    int s = parity_swiglu(&r->pol, T, inter, g, inter, u, inter, out, inter);
    snprintf(name, sizeof name, "%sswiglu", prefix);
    if (!s) compare16(r, name, "swiglu", out, T * inter);
    free(g), free(u), free(out);
    return s ? lib_failed(s) : 0;
}

static int route(run *r, const char *prefix) {
    const size_t T = r->d->T, E = r->c->num_experts, k = r->c->num_experts_per_tok;
    char name[NAME_LEN];
    snprintf(name, sizeof name, "%srouter_logits", prefix);
    float *logits = dump_wide(r->d, name), *weights = xcalloc(T * k, 4);
    uint16_t *ids = xcalloc(T * k, 2);
    int s = parity_moe_route(&r->pol, T, (uint32_t)E, (uint32_t)k, r->c->norm_topk_prob ? 1 : 0,
                             logits, E, NULL, ids, weights);
    snprintf(name, sizeof name, "%srouter_ids", prefix);
    const st_tensor *t = st_find(r->d->file, name);
    if (!s && t) {
        uint64_t differ = 0;
        for (size_t i = 0; i < T * k; i++) {
            int32_t want;
            memcpy(&want, t->data + 4 * i, 4);
            differ += (int32_t)ids[i] != want;
        }
        add_point(r, name, "moe_route", T * k, differ);
    }
    snprintf(name, sizeof name, "%srouter_weights", prefix);
    if (!s && st_find(r->d->file, name)) compare32(r, name, "moe_route", weights, T * k);
    free(logits), free(weights), free(ids);
    return s ? lib_failed(s) : 0;
}

static int logprobs(run *r) {
    const size_t T = r->d->T, V = r->c->vocab_size;
    float *logits = dump_wide(r->d, "logits"), *lp = xcalloc(T, 4);
    parity_score_options o;
    parity_score_default_options(&o);
    int s = parity_logprobs_from_logits(r->pool, &r->pol, &o, T - 1, V, logits, V,
                                        r->d->tokens + 1, lp, NULL);
    if (!s) compare32(r, "logprobs", "logits", lp, T - 1);
    free(logits), free(lp);
    return s ? lib_failed(s) : 0;
}

/* A name formatted into buf (NAME_LEN bytes). */
static const char *nm(char *buf, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, NAME_LEN, fmt, ap);
    va_end(ap);
    return buf;
}

/* Every point of the dump, in forward order (bisect.py's _Run.run). */
static int run_points(run *r) {
    const parity_config *c = r->c;
    const size_t hd = c->head_dim, nq = c->num_attention_heads, nkv = c->num_key_value_heads;
    const size_t H = c->hidden_size;
    char a[NAME_LEN], b[NAME_LEN], e[NAME_LEN], f[NAME_LEN], g[NAME_LEN];
    for (uint32_t i = 0; i < c->num_hidden_layers; i++) {
        char L[32], W[48];
        snprintf(L, sizeof L, "layers.%u.", i);
        snprintf(W, sizeof W, "model.layers.%u.", i);
        if (i == 0) {
            TRY_RC(norm(r, "embed", nm(a, "%sinput_layernorm.weight", W),
                        nm(b, "%sattn_norm", L)));
        } else {
            TRY_RC(residual_norm(r, nm(a, "layers.%u.mlp", i - 1),
                                 nm(b, "layers.%u.attn_residual", i - 1),
                                 nm(e, "%sinput_layernorm.weight", W), nm(f, "%sinput", L),
                                 nm(g, "%sattn_norm", L)));
        }
        static const char *const proj[] = {"q_proj", "k_proj", "v_proj"};
        const size_t width[] = {nq * hd, nkv * hd, nkv * hd};
        for (size_t j = 0; j < 3; j++)
            TRY_RC(linear(r, nm(a, "%sattn_norm", L), nm(b, "%sself_attn.%s.weight", W, proj[j]),
                          width[j], nm(e, "%s%s", L, proj[j]),
                          c->attention_bias ? nm(f, "%sself_attn.%s.bias", W, proj[j]) : NULL, 0));
        char q[NAME_LEN], k[NAME_LEN];
        nm(q, "%sq_proj", L), nm(k, "%sk_proj", L);
        if (c->qk_norm) {
            TRY_RC(qk_norm(r, q, nm(a, "%sself_attn.q_norm.weight", W), nq, nm(b, "%sq_norm", L)));
            TRY_RC(qk_norm(r, k, nm(a, "%sself_attn.k_norm.weight", W), nkv, nm(e, "%sk_norm", L)));
            nm(q, "%sq_norm", L), nm(k, "%sk_norm", L);
        }
        TRY_RC(rope(r, q, nq, nm(a, "%sq_rope", L)));
        TRY_RC(rope(r, k, nkv, nm(a, "%sk_rope", L)));
        TRY_RC(attention(r, L));
        TRY_RC(linear(r, nm(a, "%sattn", L), nm(b, "%sself_attn.o_proj.weight", W), H,
                      nm(e, "%so_proj", L), NULL, 0));
        TRY_RC(residual_norm(r, nm(a, "%so_proj", L), i == 0 ? "embed" : nm(b, "%sinput", L),
                             nm(e, "%spost_attention_layernorm.weight", W),
                             nm(f, "%sattn_residual", L), nm(g, "%smlp_norm", L)));
        if (sparse_layer(c, i)) {
            TRY_RC(linear(r, nm(a, "%smlp_norm", L), nm(b, "%smlp.gate.weight", W),
                          c->num_experts, nm(e, "%srouter_logits", L), NULL, 1));
            TRY_RC(route(r, L));
        } else {
            const size_t inter = c->intermediate_size;
            TRY_RC(linear(r, nm(a, "%smlp_norm", L), nm(b, "%smlp.gate_proj.weight", W), inter,
                          nm(e, "%sgate_proj", L), NULL, 0));
            TRY_RC(linear(r, nm(a, "%smlp_norm", L), nm(b, "%smlp.up_proj.weight", W), inter,
                          nm(e, "%sup_proj", L), NULL, 0));
            TRY_RC(swiglu(r, L));
            TRY_RC(linear(r, nm(a, "%sswiglu", L), nm(b, "%smlp.down_proj.weight", W), H,
                          nm(e, "%smlp", L), NULL, 0));
        }
    }
    const uint32_t last = c->num_hidden_layers - 1;
    TRY_RC(residual_norm(r, nm(a, "layers.%u.mlp", last), nm(b, "layers.%u.attn_residual", last),
                         "model.norm.weight", "final_residual", "final_norm"));
    TRY_RC(linear(r, "final_norm",
                  c->tie_word_embeddings ? "model.embed_tokens.weight" : "lm_head.weight",
                  c->vocab_size, "logits", NULL, 1));
    return logprobs(r);
}

/* ---- the report ---------------------------------------------------------------------------- */

static int is_rounding(const point *p) { return strcmp(p->kind, "gemm") != 0; }

static void print_point(FILE *out, const point *p) {
    fputs("{\"name\": ", out);
    json_string(out, p->name);
    fprintf(out, ", \"kind\": \"%s\", \"elements\": %llu, \"differing\": %llu, \"fraction\": ",
            p->kind, (unsigned long long)p->elements, (unsigned long long)p->differing);
    json_number(out, (double)p->differing / (double)p->elements);
    fputs("}", out);
}

/* A preset's summary figures (bisect.py's _Run.report). */
typedef struct summary {
    long first;                    /* the first departing rounding point, or -1 */
    double after_fraction, gemm_floor;
    const char *kinds[16];         /* in order of first appearance */
    uint64_t kind_elements[16], kind_differing[16];
    size_t n_kinds;
} summary;

static void summarize(const run *r, summary *s) {
    memset(s, 0, sizeof *s);
    s->first = -1;
    uint64_t after_e = 0, after_d = 0;
    for (size_t i = 0; i < r->n_points; i++) {
        const point *p = &r->points[i];
        if (s->first < 0 && is_rounding(p) && p->differing) s->first = (long)i;
        if (s->first >= 0 && is_rounding(p)) after_e += p->elements, after_d += p->differing;
        size_t k = 0;
        while (k < s->n_kinds && strcmp(s->kinds[k], p->kind)) k++;
        if (k == s->n_kinds) s->kinds[s->n_kinds++] = p->kind;
        s->kind_elements[k] += p->elements;
        s->kind_differing[k] += p->differing;
    }
    s->after_fraction = after_e ? (double)after_d / (double)after_e : 0.0;
    s->gemm_floor = 1.0;
    for (size_t k = 0; k < s->n_kinds; k++)
        if (!strcmp(s->kinds[k], "gemm") && s->kind_elements[k])
            s->gemm_floor = (double)(s->kind_elements[k] - s->kind_differing[k]) /
                            (double)s->kind_elements[k];
}

static void print_preset_json(FILE *out, const run *r) {
    summary s;
    summarize(r, &s);
    fputs("{\"preset\": ", out);
    json_string(out, r->preset);
    fputs(", \"points\": [", out);
    for (size_t i = 0; i < r->n_points; i++) {
        if (i) fputs(", ", out);
        print_point(out, &r->points[i]);
    }
    fputs("], \"first_departure\": ", out);
    if (s.first >= 0) print_point(out, &r->points[s.first]);
    else fputs("null", out);
    fputs(", \"after_fraction\": ", out);
    json_number(out, s.after_fraction);
    fputs(", \"kinds\": {", out);
    for (size_t k = 0; k < s.n_kinds; k++)
        fprintf(out, "%s\"%s\": {\"elements\": %llu, \"differing\": %llu}", k ? ", " : "",
                s.kinds[k], (unsigned long long)s.kind_elements[k],
                (unsigned long long)s.kind_differing[k]);
    fputs("}, \"gemm_floor\": ", out);
    json_number(out, s.gemm_floor);
    fputs("}", out);
}

static void print_percent(FILE *out, double x) { fprintf(out, "%.1f%%", 100.0 * x); }

static void print_preset_table(FILE *out, const run *r) {
    summary s;
    summarize(r, &s);
    if (s.first < 0) {
        fprintf(out, "%s: every rounding point bitwise (gemm floor ", r->preset);
    } else {
        const point *p = &r->points[s.first];
        fprintf(out, "%s: departs at %s (%s, ", r->preset, p->name, p->kind);
        print_percent(out, (double)p->differing / (double)p->elements);
        fputs(" of elements); ", out);
        print_percent(out, s.after_fraction);
        fputs(" of rounding-point elements differ from there on (gemm floor ", out);
    }
    print_percent(out, s.gemm_floor);
    fputs(" equal)\n", out);
    for (size_t k = 0; k < s.n_kinds; k++) {
        fprintf(out, "  %-10s %12llu elements %12llu differ (", s.kinds[k],
                (unsigned long long)s.kind_elements[k], (unsigned long long)s.kind_differing[k]);
        print_percent(out, s.kind_elements[k] ? (double)s.kind_differing[k] /
                                                    (double)s.kind_elements[k]
                                              : 0.0);
        fputs(")\n", out);
    }
}

static void print_dump_line(FILE *out, const dump *d) {
    fprintf(out, "dump: %s, %s, %s, %u tokens\n", meta_get(d, "engine"), meta_get(d, "model_type"),
            meta_get(d, "dtype"), d->T);
}

/* ---- --between: the switch attribution ------------------------------------------------------- */

static const char *const policy_fields[] = {
    "compute", "norm_input", "norm_weight", "qk_norm", "rope_table", "rope_apply", "swiglu",
    "attention", "logits", "temperature", "gemm", "quantizer", "exit_dist", "moe_router",
    "moe_weights", "moe_combine"};
#define N_FIELDS (sizeof policy_fields / sizeof policy_fields[0])

/* parity_policy's switches are its bytes, in field order (one uint8_t each). */
static uint8_t *field(parity_policy *p, size_t i) { return (uint8_t *)p + i; }

typedef struct metrics {
    double k3, bias;
} metrics;

/* bench/mismatch.h's k3 and bias of `other` against `base` (bisect.py's _metrics). */
static metrics metrics_of(const float *base, const float *other, size_t n) {
    double s_r = 0, s_k3 = 0;
    size_t count = 0;
    for (size_t i = 0; i < n; i++) {
        if (!isfinite(base[i]) || !isfinite(other[i])) continue;
        const double d = (double)other[i] - (double)base[i];
        s_r += d;
        s_k3 += exp(d) - d - 1;
        count++;
    }
    if (!count) return (metrics){NAN, NAN};
    return (metrics){s_k3 / (double)count, s_r / (double)count};
}

static int score(const parity_model *m, const parity_policy *pol, uint32_t threads, const dump *d,
                 float *lp) {
    parity_scorer_params params;
    parity_scorer_default_params(&params);
    params.n_threads = threads;
    params.policy = *pol;
    if (d->T > params.max_tokens) params.max_tokens = d->T;
    parity_scorer *s = NULL;
    TRY_LIB(parity_scorer_create(m, &params, &s));
    parity_score_options o;
    parity_score_default_options(&o);
    const uint32_t len = d->T;
    int status = parity_score(s, &o, d->tokens, &len, 1, lp, NULL, NULL, NULL);
    parity_scorer_free(s);
    return status ? lib_failed(status) : 0;
}

static void print_metrics(FILE *out, metrics m) {
    fputs("{\"k3\": ", out);
    json_number(out, m.k3);
    fputs(", \"bias\": ", out);
    json_number(out, m.bias);
    fputs("}", out);
}

static void print_g(FILE *out, const char *fmt, double x) {
    char buf[32];
    if (isfinite(x)) snprintf(buf, sizeof buf, "%.6g", x);
    else snprintf(buf, sizeof buf, "-");
    fprintf(out, fmt, buf);
}

static int between(const parity_model *m, const dump *d, const char *a, const char *b,
                   uint32_t threads, int as_json) {
    parity_policy pa, pb;
    TRY_LIB(parity_policy_from_name(a, &pa));
    TRY_LIB(parity_policy_from_name(b, &pb));
    const size_t n = d->T - 1;
    float *base = xcalloc(d->T, 4), *lp = xcalloc(d->T, 4);
    size_t fields[N_FIELDS], n_fields = 0;
    metrics cum[N_FIELDS], alone[N_FIELDS];
    int rc = score(m, &pa, threads, d, base);
    parity_policy cumulative = pa;
    for (size_t i = 0; i < N_FIELDS && !rc; i++) {
        if (*field(&pa, i) == *field(&pb, i)) continue;
        *field(&cumulative, i) = *field(&pb, i);
        parity_policy one = pa;
        *field(&one, i) = *field(&pb, i);
        rc = score(m, &cumulative, threads, d, lp);
        if (!rc) cum[n_fields] = metrics_of(base, lp, n);
        if (!rc) rc = score(m, &one, threads, d, lp);
        if (!rc) alone[n_fields] = metrics_of(base, lp, n);
        fields[n_fields++] = i;
    }
    free(base), free(lp);
    if (rc) return rc;
    const metrics total = n_fields ? cum[n_fields - 1] : (metrics){0, 0};
    if (!as_json) {
        print_dump_line(stdout, d);
        printf("%s -> %s over %zu positions: k3 ", a, b, n);
        print_g(stdout, "%s", total.k3);
        printf(", bias ");
        print_g(stdout, "%s\n", total.bias);
        printf("  %-14s %9s %14s %14s %14s %14s\n", "switch", "a -> b", "k3 increment",
               "bias increment", "k3 alone", "bias alone");
    } else {
        fputs("{\"dump\": ", stdout);
        print_dump_summary(stdout, d);
        fputs(", \"between\": {\"a\": ", stdout);
        json_string(stdout, a);
        fputs(", \"b\": ", stdout);
        json_string(stdout, b);
        printf(", \"positions\": %zu, \"total\": ", n);
        print_metrics(stdout, total);
        fputs(", \"switches\": [", stdout);
    }
    metrics previous = {0, 0};
    for (size_t j = 0; j < n_fields; j++) {
        const size_t i = fields[j];
        const metrics inc = {cum[j].k3 - previous.k3, cum[j].bias - previous.bias};
        previous = cum[j];
        if (!as_json) {
            char ab[32];
            snprintf(ab, sizeof ab, "%u -> %u", *field(&pa, i), *field(&pb, i));
            printf("  %-14s %9s", policy_fields[i], ab);
            print_g(stdout, " %14s", inc.k3);
            print_g(stdout, " %14s", inc.bias);
            print_g(stdout, " %14s", alone[j].k3);
            print_g(stdout, " %14s\n", alone[j].bias);
            continue;
        }
        printf("%s{\"switch\": \"%s\", \"a\": %u, \"b\": %u, \"cumulative\": ", j ? ", " : "",
               policy_fields[i], *field(&pa, i), *field(&pb, i));
        print_metrics(stdout, cum[j]);
        fputs(", \"increment\": ", stdout);
        print_metrics(stdout, inc);
        fputs(", \"alone\": ", stdout);
        print_metrics(stdout, alone[j]);
        fputs("}", stdout);
    }
    if (as_json) fputs("]}}\n", stdout);
    return 0;
}

/* ---- main ------------------------------------------------------------------------------------ */

/* The policy a preset runs as on the dump (bisect.py's preset_name): a bf16 one as NAME+fp16
 * on an F16 dump. */
static int preset_name(const char *name, const dump *d, char *out, size_t size) {
    parity_policy p;
    TRY_LIB(parity_policy_from_name(name, &p));
    snprintf(out, size, "%s%s", name, d->f16 && p.compute == PARITY_COMPUTE_BF16 ? "+fp16" : "");
    return 0;
}

static int bisect(const parity_model *m, const dump *d, const char *const *names, size_t n_names,
                  uint32_t threads, int as_json) {
    const parity_config *c = parity_model_config(m);
    char (*presets)[160] = xcalloc(n_names ? n_names : 1, sizeof *presets);
    int rc = 0;
    for (size_t i = 0; i < n_names && !rc; i++)
        rc = preset_name(names[i], d, presets[i], sizeof presets[i]);
    weights w = {m, NULL, 0, 0};
    parity_pool *pool = NULL;
    if (!rc && (rc = parity_pool_create(threads, &pool))) rc = lib_failed(rc);
    run *runs = xcalloc(n_names ? n_names : 1, sizeof *runs);
    const size_t max_points = 8 + 32 * (size_t)c->num_hidden_layers;
    size_t done = 0;
    for (; done < n_names && !rc; done++) {
        run *r = &runs[done];
        *r = (run){.d = d, .w = &w, .c = c, .pool = pool};
        snprintf(r->preset, sizeof r->preset, "%s", presets[done]);
        r->points = xcalloc(max_points, sizeof *r->points);
        parity_policy_from_name(r->preset, &r->pol);
        if (r->pol.compute == PARITY_COMPUTE_FP32 && d->f16) {
            rc = bad("%s: policy %s computes in fp32: it keeps no fp16 values to compare with an "
                     "F16 dump", d->path, r->preset);
        } else if (r->pol.compute == PARITY_COMPUTE_FP16 && !d->f16) {
            rc = bad("%s: policy %s rounds to fp16; the dump holds BF16 values", d->path,
                     r->preset);
        } else {
            r->plain = r->pol;
            r->plain.gemm = r->plain.quantizer = 0;
            rc = run_points(r);
        }
    }
    if (!rc && as_json) {
        fputs("{\"dump\": ", stdout);
        print_dump_summary(stdout, d);
        fputs(", \"presets\": [", stdout);
        for (size_t i = 0; i < n_names; i++) {
            if (i) fputs(", ", stdout);
            print_preset_json(stdout, &runs[i]);
        }
        fputs("]}\n", stdout);
    } else if (!rc) {
        print_dump_line(stdout, d);
        for (size_t i = 0; i < n_names; i++) print_preset_table(stdout, &runs[i]);
    }
    for (size_t i = 0; i < done; i++) free(runs[i].points);
    free(runs);
    free(presets);
    weights_free(&w);
    parity_pool_free(pool);
    return rc;
}

int main(int argc, char **argv) {
    const char *model_spec = NULL, *dump_path = NULL, *policies[MAX_POLICIES], *a = NULL, *b = NULL;
    size_t n_policies = 0;
    uint32_t threads = 1;
    int as_json = 0;
    for (int i = 1; i < argc; i++) {
        const char *opt = argv[i], *v = NULL;
        if (option_is_help(opt)) {
            usage();
            return 0;
        }
        if (!strcmp(opt, "--json")) {
            as_json = 1;
            continue;
        }
        if (!option_value(argc, argv, &i, &v)) {
            fprintf(stderr, "error: %s needs a value\n", opt);
            usage();
            return 2;
        }
        if (!strcmp(opt, "--model")) model_spec = v;
        else if (!strcmp(opt, "--dump")) dump_path = v;
        else if (!strcmp(opt, "--policy")) {
            if (n_policies == MAX_POLICIES) return bad("more than %d --policy", MAX_POLICIES);
            policies[n_policies++] = v;
        } else if (!strcmp(opt, "--between")) {
            a = v;
            if (!option_value(argc, argv, &i, &b)) {
                fprintf(stderr, "error: --between needs two policies\n");
                return 2;
            }
        } else if (!strcmp(opt, "--threads")) {
            if (!parse_u32(v, &threads) || threads == 0 || threads > 256)
                return bad("--threads must be in 1..256, not '%s'", v);
        } else {
            fprintf(stderr, "error: unknown option %s\n", opt);
            usage();
            return 2;
        }
    }
    if (!model_spec || !dump_path) {
        usage();
        return 2;
    }
    parity_model *m = NULL;
    int s = parity_model_open(model_spec, &m);
    if (s) {
        fprintf(stderr, "error: %s: %s: %s\n", model_spec, parity_status_name(s),
                parity_last_error());
        return 2;
    }
    dump d;
    int rc = dump_open(&d, dump_path, parity_model_config(m));
    if (!rc && a) {
        rc = between(m, &d, a, b, threads, as_json);
    } else if (!rc) {
        const char *const *names = policies;
        const char *defaults[MAX_POLICIES];
        if (!n_policies) { /* every preset; fp32 not on an F16 dump */
            for (const char *const *p = parity_policy_preset_names(); *p; p++)
                if (n_policies < MAX_POLICIES && !(d.f16 && !strcmp(*p, "fp32")))
                    defaults[n_policies++] = *p;
            names = defaults;
        }
        rc = bisect(m, &d, names, n_policies, threads, as_json);
    }
    dump_close(&d);
    parity_model_free(m);
    return rc;
}
