/* safetensors reader: maps a file read-only and validates it rule by rule, in the order of
 * the reference implementation (huggingface/safetensors): header length, UTF-8, JSON shape
 * of the header, dtypes, then the tensors sorted by offsets (contiguity, overflow, size),
 * then the end of the data. Names and the tensor array live in one allocation (the arena). */
#include "safetensors.h"

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/alloc.h"
#include "base/errors.h"
#include "json.h"

static const char *const dtype_names[] = {
    "BOOL", "U8", "I8", "F8_E5M2", "F8_E4M3", "I16", "U16", "F16", "BF16",
    "I32", "U32", "F32", "F64", "I64", "U64",
};
static const unsigned char dtype_sizes[] = {1, 1, 1, 1, 1, 2, 2, 2, 2, 4, 4, 4, 8, 8, 8};
#define N_DTYPES (sizeof dtype_names / sizeof dtype_names[0])

const char *st_dtype_name(st_dtype t) {
    return (unsigned)t < N_DTYPES ? dtype_names[t] : "?";
}

size_t st_dtype_size(st_dtype t) { return (unsigned)t < N_DTYPES ? dtype_sizes[t] : 0; }

/* How many bytes of a name to print: at most 120, not cutting a UTF-8 sequence. */
static int name_width(const char *name) {
    size_t n = strlen(name);
    if (n <= 120) return (int)n;
    n = 120;
    while (n > 0 && ((unsigned char)name[n] & 0xc0) == 0x80) n--;
    return (int)n;
}

/* Header length, then UTF-8 of the header: returns 0 and the header length, or an error. */
static int check_header_bytes(const uint8_t *buf, size_t size, const char *path,
                              uint64_t *header_len) {
    if (size < 8)
        return set_error(PARITY_ERR_ST_HEADER_LENGTH,
                         "%s: file is %zu bytes, shorter than the 8-byte header length", path,
                         size);
    uint64_t n = 0;
    for (int k = 7; k >= 0; k--) n = (n << 8) | buf[k];
    if (n == 0)
        return set_error(PARITY_ERR_ST_HEADER_LENGTH, "%s: header length is 0", path);
    if (n > ST_MAX_HEADER)
        return set_error(PARITY_ERR_ST_HEADER_LENGTH,
                         "%s: header length %llu exceeds the limit of %u bytes", path,
                         (unsigned long long)n, ST_MAX_HEADER);
    if (n > size - 8)
        return set_error(PARITY_ERR_ST_HEADER_LENGTH,
                         "%s: header length %llu runs past the end of the file (%zu bytes "
                         "after the length field)", path, (unsigned long long)n, size - 8);
    const uint8_t *h = buf + 8;
    for (size_t i = 0; i < n;) {
        unsigned c = h[i];
        size_t len = 1;
        unsigned lo = 0x80, hi = 0xbf; /* allowed range of the second byte */
        if (c < 0x80) {
            i++;
            continue;
        } else if (c >= 0xc2 && c <= 0xdf) {
            len = 2;
        } else if (c >= 0xe0 && c <= 0xef) {
            len = 3;
            if (c == 0xe0) lo = 0xa0;
            if (c == 0xed) hi = 0x9f;
        } else if (c >= 0xf0 && c <= 0xf4) {
            len = 4;
            if (c == 0xf0) lo = 0x90;
            if (c == 0xf4) hi = 0x8f;
        } else {
            len = 0;
        }
        int ok = len > 0 && n - i >= len && h[i + 1] >= lo && h[i + 1] <= hi;
        for (size_t k = 2; ok && k < len; k++) ok = h[i + k] >= 0x80 && h[i + k] <= 0xbf;
        if (!ok)
            return set_error(PARITY_ERR_ST_HEADER_UTF8,
                             "%s: header is not valid UTF-8 at header byte %zu (file offset "
                             "%zu, byte 0x%02x)", path, i, i + 8, c);
        i += len;
    }
    *header_len = n;
    return 0;
}

/* A non-negative JSON integer (which fits int64), into *out. */
static int get_uint(const json_value *v, uint64_t *out) {
    if (v->type != JSON_NUMBER || !v->is_int || v->integer < 0) return 0;
    *out = (uint64_t)v->integer;
    return 1;
}

#define ENTRY_ERROR(status, fmt, ...)                                                       \
    set_error((status), "%s: tensor '%.*s': " fmt, path, name_width(name), name, __VA_ARGS__)

/* Checks one tensor entry of the header and fills t (all but data). */
static int parse_entry(const char *path, const char *name, size_t name_len,
                       const json_value *e, st_tensor *t) {
    if (strlen(name) != name_len)
        return ENTRY_ERROR(PARITY_ERR_ST_HEADER_JSON, "%s", "name contains a NUL character");
    if (e->type != JSON_OBJECT)
        return ENTRY_ERROR(PARITY_ERR_ST_HEADER_JSON,
                           "entry is %s, expected an object {\"dtype\", \"shape\", "
                           "\"data_offsets\"}", json_type_name(e->type));
    const json_value *dtype = NULL, *shape = NULL, *offsets = NULL;
    for (size_t i = 0; i < e->count; i++) {
        const char *k = e->keys[i];
        const json_value **slot = strcmp(k, "dtype") == 0          ? &dtype
                                  : strcmp(k, "shape") == 0        ? &shape
                                  : strcmp(k, "data_offsets") == 0 ? &offsets
                                                                   : NULL;
        if (!slot || strlen(k) != e->key_lens[i])
            return ENTRY_ERROR(PARITY_ERR_ST_HEADER_JSON,
                               "unknown key '%.*s' (an entry holds only \"dtype\", \"shape\" "
                               "and \"data_offsets\")", name_width(k), k);
        if (*slot)
            return ENTRY_ERROR(PARITY_ERR_ST_HEADER_JSON, "key '%s' appears twice", k);
        *slot = &e->items[i];
    }
    if (!dtype || !shape || !offsets)
        return ENTRY_ERROR(PARITY_ERR_ST_HEADER_JSON, "missing \"%s\"",
                           !dtype ? "dtype" : !shape ? "shape" : "data_offsets");

    if (dtype->type != JSON_STRING)
        return ENTRY_ERROR(PARITY_ERR_ST_HEADER_JSON, "dtype is %s, expected a string",
                           json_type_name(dtype->type));
    if (shape->type != JSON_ARRAY)
        return ENTRY_ERROR(PARITY_ERR_ST_HEADER_JSON, "shape is %s, expected an array",
                           json_type_name(shape->type));
    if (shape->count > ST_MAX_DIMS)
        return ENTRY_ERROR(PARITY_ERR_ST_HEADER_JSON,
                           "shape has %zu dimensions, more than the %d supported",
                           shape->count, ST_MAX_DIMS);
    for (size_t d = 0; d < shape->count; d++)
        if (!get_uint(&shape->items[d], &t->shape[d]))
            return ENTRY_ERROR(PARITY_ERR_ST_HEADER_JSON,
                               "shape[%zu] is not a non-negative integer below 2^63", d);
    if (offsets->type != JSON_ARRAY)
        return ENTRY_ERROR(PARITY_ERR_ST_HEADER_JSON,
                           "data_offsets is %s, expected an array [begin, end]",
                           json_type_name(offsets->type));
    if (offsets->count != 2)
        return ENTRY_ERROR(PARITY_ERR_ST_HEADER_JSON,
                           "data_offsets has %zu entries, expected 2 [begin, end]",
                           offsets->count);
    for (size_t k = 0; k < 2; k++)
        if (!get_uint(&offsets->items[k], k ? &t->end : &t->begin))
            return ENTRY_ERROR(PARITY_ERR_ST_HEADER_JSON,
                               "data_offsets[%zu] is not a non-negative integer below 2^63", k);

    size_t d;
    for (d = 0; d < N_DTYPES; d++)
        if (strlen(dtype_names[d]) == dtype->len && strcmp(dtype_names[d], dtype->str) == 0)
            break;
    if (d == N_DTYPES)
        return ENTRY_ERROR(PARITY_ERR_ST_DTYPE,
                           "unknown dtype \"%.*s\" (known: BOOL U8 I8 F8_E5M2 F8_E4M3 I16 U16 "
                           "F16 BF16 I32 U32 F32 F64 I64 U64)", name_width(dtype->str),
                           dtype->str);
    t->dtype = (st_dtype)d;
    t->ndim = (uint32_t)shape->count;
    return 0;
}

static int check_metadata(const char *path, const json_value *m) {
    if (m->type != JSON_OBJECT)
        return set_error(PARITY_ERR_ST_HEADER_JSON,
                         "%s: \"__metadata__\" is %s, expected an object of strings", path,
                         json_type_name(m->type));
    for (size_t i = 0; i < m->count; i++)
        if (m->items[i].type != JSON_STRING)
            return set_error(PARITY_ERR_ST_HEADER_JSON,
                             "%s: \"__metadata__\" key '%.*s' is %s, expected a string", path,
                             name_width(m->keys[i]), m->keys[i],
                             json_type_name(m->items[i].type));
    return 0;
}

/* Order of the tensors in the data section: by (begin, end), ties in header order. */
static int cmp_offsets(const void *a, const void *b) {
    const st_tensor *x = *(const st_tensor *const *)a, *y = *(const st_tensor *const *)b;
    if (x->begin != y->begin) return x->begin < y->begin ? -1 : 1;
    if (x->end != y->end) return x->end < y->end ? -1 : 1;
    return x < y ? -1 : x > y;
}

/* The data-section rules on tensors sorted by offsets. Writes the end of the last tensor. */
static int check_layout(const char *path, st_tensor *tensors, size_t n, uint64_t *data_end) {
    st_tensor **order = px_calloc(n ? n : 1, sizeof *order, "safetensors tensor order");
    if (!order) return PARITY_ERR_OUT_OF_MEMORY;
    for (size_t i = 0; i < n; i++) order[i] = &tensors[i];
    qsort(order, n, sizeof *order, cmp_offsets);

    int status = 0;
    uint64_t expect = 0;
    const st_tensor *prev = NULL;
    for (size_t i = 0; i < n && !status; i++) {
        st_tensor *t = order[i];
        const char *name = t->name;
        if (t->end < t->begin) {
            status = ENTRY_ERROR(PARITY_ERR_ST_OFFSETS,
                                 "data_offsets end %llu is before begin %llu",
                                 (unsigned long long)t->end, (unsigned long long)t->begin);
        } else if (t->begin != expect && !prev) {
            status = ENTRY_ERROR(PARITY_ERR_ST_OFFSETS,
                                 "the data section must start at offset 0, but the first "
                                 "tensor begins at %llu", (unsigned long long)t->begin);
        } else if (t->begin != expect) {
            status = ENTRY_ERROR(PARITY_ERR_ST_OFFSETS,
                                 "data_offsets [%llu, %llu] %s the previous tensor '%.*s', "
                                 "which ends at %llu (tensors must be contiguous)",
                                 (unsigned long long)t->begin, (unsigned long long)t->end,
                                 t->begin > expect ? "leave a gap after" : "overlap",
                                 name_width(prev->name), prev->name,
                                 (unsigned long long)expect);
        }
        if (status) break;
        expect = t->end;
        prev = t;

        /* Left to right, as the reference does: a later zero does not excuse an overflow. */
        uint64_t count = 1, bytes;
        for (uint32_t d = 0; d < t->ndim && !status; d++)
            if (mul_overflows(count, t->shape[d], &count))
                status = ENTRY_ERROR(PARITY_ERR_ST_OVERFLOW,
                                     "the element count overflows 64 bits at shape[%u] = %llu",
                                     d, (unsigned long long)t->shape[d]);
        if (status) break;
        if (mul_overflows(count, st_dtype_size(t->dtype), &bytes)) {
            status = ENTRY_ERROR(PARITY_ERR_ST_OVERFLOW,
                                 "the byte size (%llu elements x %zu bytes of %s) overflows "
                                 "64 bits", (unsigned long long)count,
                                 st_dtype_size(t->dtype), st_dtype_name(t->dtype));
            break;
        }
        t->n_elements = count;
        if (bytes != t->end - t->begin)
            status = ENTRY_ERROR(PARITY_ERR_ST_SIZE,
                                 "shape holds %llu elements of %s = %llu bytes, but "
                                 "data_offsets [%llu, %llu] span %llu bytes",
                                 (unsigned long long)count, st_dtype_name(t->dtype),
                                 (unsigned long long)bytes, (unsigned long long)t->begin,
                                 (unsigned long long)t->end,
                                 (unsigned long long)(t->end - t->begin));
    }
    px_free(order);
    *data_end = expect;
    return status;
}

/* Validates buf[0..size) and builds f's tensor table. f->path is set. */
static int parse_into(st_file *f, const uint8_t *buf, size_t size) {
    const char *path = f->path;
    uint64_t n = 0;
    TRY(check_header_bytes(buf, size, path, &n));
    const char *header = (const char *)buf + 8;
    if (header[0] != '{')
        return set_error(PARITY_ERR_ST_HEADER_JSON,
                         "%s: header does not start with '{' (byte 0x%02x): it must be a JSON "
                         "object", path, (unsigned char)header[0]);

    json_doc *doc;
    char msg[256];
    int status = json_parse(header, (size_t)n, &doc, msg, sizeof msg);
    if (status == PARITY_ERR_OUT_OF_MEMORY)
        return set_error(status, "%s: out of memory parsing the header: %s", path, msg);
    if (status)
        return set_error(PARITY_ERR_ST_HEADER_JSON, "%s: header is not valid JSON: %s", path,
                         msg);
    const json_value *root = json_doc_root(doc);

    /* Count the tensors and the bytes their names need. */
    size_t n_tensors = 0, name_bytes = 0;
    for (size_t i = 0; i < root->count; i++) {
        if (strcmp(root->keys[i], "__metadata__") == 0 && root->key_lens[i] == 12) continue;
        n_tensors++;
        name_bytes += root->key_lens[i] + 1;
    }
    /* Bounded by the header length (<= 100 MB): no overflow. */
    size_t arena_size = n_tensors * sizeof(st_tensor) + name_bytes;
    unsigned char *arena = px_calloc(1, arena_size, "safetensors tensor table");
    if (!arena) {
        json_free(doc);
        return PARITY_ERR_OUT_OF_MEMORY;
    }
    st_tensor *tensors = (st_tensor *)arena;
    char *names = (char *)(arena + n_tensors * sizeof(st_tensor));

    size_t k = 0;
    for (size_t i = 0; i < root->count && !status; i++) {
        const char *key = root->keys[i];
        size_t key_len = root->key_lens[i];
        if (strcmp(key, "__metadata__") == 0 && key_len == 12) {
            status = check_metadata(path, &root->items[i]);
            continue;
        }
        st_tensor *t = &tensors[k++];
        memcpy(names, key, key_len + 1);
        t->name = names;
        names += key_len + 1;
        status = parse_entry(path, key, key_len, &root->items[i], t);
    }
    if (!status) {
        long dup = json_find_duplicate_key(root);
        if (dup >= 0) {
            const char *name = root->keys[dup];
            status = strcmp(name, "__metadata__") == 0
                         ? set_error(PARITY_ERR_ST_DUPLICATE,
                                     "%s: \"__metadata__\" appears twice in the header", path)
                         : ENTRY_ERROR(PARITY_ERR_ST_DUPLICATE, "%s",
                                       "the name appears twice in the header");
        }
    }
    json_free(doc);

    uint64_t data_end = 0;
    if (!status) status = check_layout(path, tensors, n_tensors, &data_end);
    if (!status) {
        /* n <= 100 MB and data_end < 2^63: the sum cannot wrap. */
        uint64_t need = 8 + n + data_end;
        if (need > size)
            status = set_error(PARITY_ERR_ST_TRUNCATED,
                               "%s: the tensors' data ends at file offset %llu (8 + header %llu "
                               "+ data %llu), but the file is %zu bytes", path,
                               (unsigned long long)need, (unsigned long long)n,
                               (unsigned long long)data_end, size);
        else if (need < size)
            status = set_error(PARITY_ERR_ST_TRAILING,
                               "%s: %llu trailing bytes after the tensors' data, which ends "
                               "at file offset %llu of %zu", path,
                               (unsigned long long)(size - need), (unsigned long long)need,
                               size);
    }
    if (status) {
        px_free(arena);
        return status;
    }
    for (size_t i = 0; i < n_tensors; i++) tensors[i].data = buf + 8 + n + tensors[i].begin;
    f->base = buf;
    f->size = size;
    f->n_tensors = n_tensors;
    f->tensors = tensors;
    f->arena = arena;
    return 0;
}

static st_file *new_file(const char *path) {
    st_file *f = px_calloc(1, sizeof *f, "safetensors file");
    if (!f) return NULL;
    f->path = px_strdup(path, "safetensors path");
    if (!f->path) {
        px_free(f);
        return NULL;
    }
    return f;
}

int st_parse(const uint8_t *buf, size_t size, const char *path, st_file **out) {
    if (!path) path = "<memory>";
    if ((!buf && size) || !out)
        return set_error(PARITY_ERR_INVALID_ARGUMENT, "%s: st_parse: NULL %s", path,
                         out ? "buffer" : "output pointer");
    st_file *f = new_file(path);
    if (!f) return PARITY_ERR_OUT_OF_MEMORY;
    int status = parse_into(f, buf, size);
    if (status) {
        st_close(f);
        return status;
    }
    *out = f;
    return 0;
}

int st_open(const char *path, st_file **out) {
    if (!path || !out)
        return set_error(PARITY_ERR_INVALID_ARGUMENT, "st_open: NULL %s",
                         path ? "output pointer" : "path");
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return set_error(PARITY_ERR_IO, "%s: cannot open: %s", path, strerror(errno));
    struct stat st;
    if (fstat(fd, &st) != 0) {
        int e = errno;
        close(fd);
        return set_error(PARITY_ERR_IO, "%s: cannot stat: %s", path, strerror(e));
    }
    if (!S_ISREG(st.st_mode)) {
        close(fd);
        return set_error(PARITY_ERR_IO, "%s: not a regular file", path);
    }
    if ((uint64_t)st.st_size > SIZE_MAX) {
        close(fd);
        return set_error(PARITY_ERR_IO, "%s: file too large to map", path);
    }
    size_t size = (size_t)st.st_size;
    void *map = NULL;
    /* A file too short for the length field is reported by the parser; mmap of 0 bytes
     * would fail. */
    if (size >= 8) {
        map = mmap(NULL, size, PROT_READ, MAP_PRIVATE, fd, 0);
        if (map == MAP_FAILED) {
            int e = errno;
            close(fd);
            return set_error(PARITY_ERR_IO, "%s: cannot map %zu bytes: %s", path, size,
                             strerror(e));
        }
    }
    close(fd);

    static const uint8_t none[8];
    st_file *f = new_file(path);
    if (!f) {
        if (map) munmap(map, size);
        return PARITY_ERR_OUT_OF_MEMORY;
    }
    f->map = map;
    f->size = size;
    int status = parse_into(f, map ? map : none, size);
    if (status) {
        st_close(f);
        return status;
    }
    *out = f;
    return 0;
}

void st_close(st_file *f) {
    if (!f) return;
    if (f->map) munmap(f->map, f->size);
    px_free(f->arena);
    px_free(f->path);
    px_free(f);
}

const st_tensor *st_find(const st_file *f, const char *name) {
    if (!f || !name) return NULL;
    for (size_t i = 0; i < f->n_tensors; i++)
        if (strcmp(f->tensors[i].name, name) == 0) return &f->tensors[i];
    return NULL;
}

const st_tensor *st_find_in(st_file *const *files, size_t n, const char *name,
                            const st_file **file) {
    for (size_t i = 0; i < n; i++) {
        const st_tensor *t = st_find(files[i], name);
        if (t) {
            *file = files[i];
            return t;
        }
    }
    return NULL;
}
