/* Checkpoint files for the C tests that write their own (test_checkpoint, test_moe_load): path
 * joining and whole-file reading and writing below PATH_LEN, removing a scratch tree, a
 * checkpoint's tensors in memory (ckpt: added, copied, read from a safetensors file, looked up,
 * removed, replaced), a small safetensors writer (write_st), and loading a checkpoint that must
 * load (load) or fail with a status and a message (check_load_fails). Every step is a CHECK. */
#ifndef PARITY_TEST_CKPT_FILES_H
#define PARITY_TEST_CKPT_FILES_H

#include <ftw.h>
#include <stddef.h>
#include <sys/stat.h>

#include "check.h"
#include "checkpoint/safetensors.h"

#define PATH_LEN 4096

/* ---- files ------------------------------------------------------------------------------ */

static inline void join(char *out, const char *dir, const char *name) {
    int n = snprintf(out, PATH_LEN, "%s/%s", dir, name);
    if (n < 0 || n >= PATH_LEN) {
        fprintf(stderr, "path too long: %s/%s\n", dir, name);
        exit(1);
    }
}

/* The bytes of a file, NUL-terminated, *len of them (0 when it cannot be read: NULL). */
static inline char *read_all(const char *path, size_t *len) {
    *len = 0;
    FILE *fp = fopen(path, "rb");
    CHECK(fp != NULL);
    if (!fp) return NULL;
    fseek(fp, 0, SEEK_END);
    long n = ftell(fp);
    fseek(fp, 0, SEEK_SET);
    char *buf = malloc((size_t)n + 1);
    CHECK(buf && fread(buf, 1, (size_t)n, fp) == (size_t)n);
    fclose(fp);
    if (buf) buf[n] = '\0';
    *len = (size_t)n;
    return buf;
}

static inline void write_all(const char *path, const void *data, size_t len) {
    FILE *fp = fopen(path, "wb");
    CHECK(fp != NULL);
    if (!fp) return;
    CHECK(fwrite(data, 1, len, fp) == len);
    CHECK(fclose(fp) == 0);
}

/* The text of dir/file, NUL-terminated (read_all's checks); NULL when it cannot be read. */
static inline char *read_in(const char *dir, const char *file) {
    char path[PATH_LEN];
    size_t len;
    join(path, dir, file);
    return read_all(path, &len);
}

/* from_dir/file copied to to_dir/file; returns its text (the caller frees it; NULL when it
 * could not be read, and then nothing is written). */
static inline char *copy_file_in(const char *from_dir, const char *to_dir, const char *file) {
    char src[PATH_LEN], dst[PATH_LEN];
    join(src, from_dir, file);
    join(dst, to_dir, file);
    size_t len;
    char *text = read_all(src, &len);
    if (text) write_all(dst, text, len);
    return text;
}

static inline int remove_entry(const char *path, const struct stat *st, int flag, struct FTW *ftw) {
    (void)st, (void)flag, (void)ftw;
    return remove(path);
}

static inline void remove_tree(const char *dir) {
    CHECK(nftw(dir, remove_entry, 16, FTW_DEPTH | FTW_PHYS) == 0);
}

/* ---- checkpoints in memory, and a safetensors writer ------------------------------------- */

typedef struct tensor {
    char name[128];
    char dtype[8];
    uint32_t ndim;
    uint64_t shape[4];
    uint8_t *data; /* owned */
    size_t bytes;
} tensor;

typedef struct ckpt {
    tensor *t;
    size_t n, cap;
} ckpt;

static inline tensor *ckpt_add(ckpt *c, const char *name, const char *dtype, uint32_t ndim,
                               const uint64_t *shape, const void *data, size_t bytes) {
    if (c->n == c->cap) {
        c->cap = c->cap ? 2 * c->cap : 32;
        c->t = realloc(c->t, c->cap * sizeof *c->t);
    }
    tensor *t = &c->t[c->n++];
    snprintf(t->name, sizeof t->name, "%s", name);
    snprintf(t->dtype, sizeof t->dtype, "%s", dtype);
    t->ndim = ndim;
    memcpy(t->shape, shape, ndim * sizeof *shape);
    t->data = malloc(bytes);
    memcpy(t->data, data, bytes);
    t->bytes = bytes;
    return t;
}

static inline void ckpt_free(ckpt *c) {
    for (size_t i = 0; i < c->n; i++) free(c->t[i].data);
    free(c->t);
    *c = (ckpt){0};
}

static inline void ckpt_copy(ckpt *dst, const ckpt *src) {
    *dst = (ckpt){0};
    for (size_t i = 0; i < src->n; i++) {
        const tensor *t = &src->t[i];
        ckpt_add(dst, t->name, t->dtype, t->ndim, t->shape, t->data, t->bytes);
    }
}

/* The tensors of a safetensors file, in header order. */
static inline void ckpt_read(ckpt *c, const char *path) {
    *c = (ckpt){0};
    st_file *f = NULL;
    CHECK_OK(st_open(path, &f));
    if (!f) return;
    for (size_t i = 0; i < f->n_tensors; i++) {
        const st_tensor *t = &f->tensors[i];
        ckpt_add(c, t->name, st_dtype_name(t->dtype), t->ndim, t->shape, t->data,
                 (size_t)(t->end - t->begin));
    }
    st_close(f);
}

/* The tensors of dir/model.safetensors. */
static inline void ckpt_read_in(ckpt *c, const char *dir) {
    char path[PATH_LEN];
    join(path, dir, "model.safetensors");
    ckpt_read(c, path);
}

static inline tensor *ckpt_get(ckpt *c, const char *name) {
    for (size_t i = 0; i < c->n; i++)
        if (!strcmp(c->t[i].name, name)) return &c->t[i];
    fprintf(stderr, "test checkpoint has no tensor '%s'\n", name);
    exit(1);
}

static inline void ckpt_remove(ckpt *c, const char *name) {
    tensor *t = ckpt_get(c, name);
    free(t->data);
    memmove(t, t + 1, (size_t)(c->t + c->n - (t + 1)) * sizeof *t);
    c->n--;
}

/* Replaces a tensor's data (taking ownership of `data`) and dtype. */
static inline void tensor_set(tensor *t, const char *dtype, void *data, size_t bytes) {
    free(t->data);
    snprintf(t->dtype, sizeof t->dtype, "%s", dtype);
    t->data = data;
    t->bytes = bytes;
}

/* A value's bits, of a 2- or 4-byte dtype. */
static inline uint32_t value_load(const uint8_t *p, size_t size) {
    uint16_t h;
    uint32_t u;
    if (size == 4) return memcpy(&u, p, 4), u;
    return memcpy(&h, p, 2), h;
}
static inline void value_store(uint8_t *p, size_t size, uint32_t u) {
    uint16_t h = (uint16_t)u;
    memcpy(p, size == 4 ? (const void *)&u : (const void *)&h, size);
}

/* Converts every tensor (of dtype `from`; NULL: every tensor) value by value: `one` turns the
 * bits of an in_size-byte value into those of an out_size-byte `to` value, given `arg`. */
typedef uint32_t convert_fn(uint32_t bits, uint32_t arg);
static inline void ckpt_convert(ckpt *c, const char *from, size_t in_size, const char *to,
                                size_t out_size, convert_fn *one, uint32_t arg) {
    for (size_t i = 0; i < c->n; i++) {
        tensor *t = &c->t[i];
        if (from && strcmp(t->dtype, from)) continue;
        size_t n = t->bytes / in_size;
        uint8_t *out = malloc(out_size * n);
        for (size_t k = 0; k < n; k++)
            value_store(out + out_size * k, out_size,
                        one(value_load(t->data + in_size * k, in_size), arg));
        tensor_set(t, to, out, out_size * n);
    }
}

/* bf16 -> fp32, with `low_bits` set below the bf16 bits. */
static inline uint32_t bf16_widened_bits(uint32_t h, uint32_t low_bits) {
    return (h << 16) | low_bits;
}

/* BF16 tensors -> F32: each value widened, with `low_bits` set below the bf16 bits. */
static inline void ckpt_bf16_to_f32(ckpt *c, uint32_t low_bits) {
    ckpt_convert(c, "BF16", 2, "F32", 4, bf16_widened_bits, low_bits);
}

/* Writes a safetensors file: header in the given order, padded with spaces to a multiple of 8
 * and then `extra_pad` more (which moves the data off alignment), tensors contiguous. */
static inline void write_st(const char *path, const tensor *ts, size_t n, size_t extra_pad) {
    size_t cap = 64 + n * 256 + 8 + extra_pad, len = 0;
    char *h = malloc(cap);
    uint64_t offset = 0;
    len += (size_t)snprintf(h, cap, "{\"__metadata__\":{\"format\":\"pt\"}");
    for (size_t i = 0; i < n; i++) {
        const tensor *t = &ts[i];
        len += (size_t)snprintf(h + len, cap - len, ",\"%s\":{\"dtype\":\"%s\",\"shape\":[",
                                t->name, t->dtype);
        for (uint32_t d = 0; d < t->ndim; d++)
            len += (size_t)snprintf(h + len, cap - len, "%s%llu", d ? "," : "",
                                    (unsigned long long)t->shape[d]);
        len += (size_t)snprintf(h + len, cap - len, "],\"data_offsets\":[%llu,%llu]}",
                                (unsigned long long)offset,
                                (unsigned long long)(offset + t->bytes));
        offset += t->bytes;
    }
    h[len++] = '}';
    while (len % 8) h[len++] = ' ';
    for (size_t k = 0; k < extra_pad; k++) h[len++] = ' ';

    FILE *fp = fopen(path, "wb");
    CHECK(fp != NULL);
    if (fp) {
        uint8_t le[8];
        for (int b = 0; b < 8; b++) le[b] = (uint8_t)((uint64_t)len >> (8 * b));
        CHECK(fwrite(le, 1, 8, fp) == 8 && fwrite(h, 1, len, fp) == len);
        for (size_t i = 0; i < n; i++)
            CHECK(fwrite(ts[i].data, 1, ts[i].bytes, fp) == ts[i].bytes);
        CHECK(fclose(fp) == 0);
    }
    free(h);
}

/* ---- loading ------------------------------------------------------------------------------ */

/* The model of checkpoint dir (CHECK_OK); NULL when it does not load. */
static inline parity_model *load(const char *dir) {
    parity_model *m = NULL;
    CHECK_OK(parity_model_load(dir, &m));
    return m;
}

/* What a failed load must leave in *out. */
static max_align_t sentinel_object;
#define SENTINEL ((parity_model *)&sentinel_object)

/* The last error message mentions `needle`. */
static inline void check_message(const char *needle) {
    const char *msg = parity_last_error();
    CHECK(strstr(msg, needle) != NULL);
    if (!strstr(msg, needle))
        fprintf(stderr, "  message \"%s\" does not mention \"%s\"\n", msg, needle);
}

/* Loading dir fails with `status`, leaves *out alone, and the message mentions each of the
 * (up to two) needles. */
static inline void check_load_fails(const char *dir, int status, const char *needle,
                                    const char *needle2) {
    parity_model *m = SENTINEL;
    int rc = parity_model_load(dir, &m);
    CHECK_STATUS(rc, status);
    CHECK(m == SENTINEL);
    if (m != SENTINEL && m) parity_model_free(m);
    printf("  %-27s %s\n", parity_status_name(rc), parity_last_error());
    if (needle) check_message(needle);
    if (needle2) check_message(needle2);
}

#endif
