/* Tests of the safetensors reader (lib/checkpoint/safetensors.c). The corpus in
 * test/data/bad-safetensors/ (written by make_bad_safetensors.py) names the expected status
 * in each file name, "<case>.<STATUS>.safetensors": every file is opened with st_open and
 * parsed from memory with st_parse, and must give that status with a message naming the
 * file. Then the valid files' contents, images built here, and test/data/regions.safetensors.
 */
#include <dirent.h>
#include <string.h>

#include "check.h"
#include "base/errors.h"
#include "checkpoint/safetensors.h"

/* "ST_OFFSETS" -> PARITY_ERR_ST_OFFSETS, "OK" -> PARITY_OK; 1 if the name is a status. */
static int status_from_token(const char *token, int *status) {
    char full[96];
    if (strcmp(token, "OK") == 0) {
        *status = PARITY_OK;
        return 1;
    }
    snprintf(full, sizeof full, "PARITY_ERR_%s", token);
    for (int s = -1; s >= -99; s--) {
        if (strcmp(parity_status_name(s), full) == 0) {
            *status = s;
            return 1;
        }
    }
    return 0;
}

static uint8_t *read_file(const char *path, size_t *size) {
    FILE *fp = fopen(path, "rb");
    if (!fp) return NULL;
    size_t cap = 4096, n = 0;
    uint8_t *buf = malloc(cap);
    while (buf) {
        n += fread(buf + n, 1, cap - n, fp);
        if (n < cap) break;
        cap *= 2;
        uint8_t *b = realloc(buf, cap);
        if (!b) free(buf);
        buf = b;
    }
    fclose(fp);
    *size = n;
    return buf;
}

static uint64_t header_len(const st_file *f) {
    uint64_t n = 0;
    for (int k = 7; k >= 0; k--) n = (n << 8) | f->base[k];
    return n;
}

/* What holds for every valid file: data pointers, sizes, lookups. */
static void check_valid(const st_file *f, const char *what) {
    uint64_t n = header_len(f);
    int good = 1;
    for (size_t i = 0; i < f->n_tensors; i++) {
        const st_tensor *t = &f->tensors[i];
        uint64_t count = 1;
        for (uint32_t d = 0; d < t->ndim; d++) count *= t->shape[d];
        good = good && t->ndim <= ST_MAX_DIMS && count == t->n_elements &&
               t->end - t->begin == t->n_elements * st_dtype_size(t->dtype) &&
               t->data == f->base + 8 + n + t->begin && 8 + n + t->end <= f->size &&
               st_find(f, t->name) == t;
    }
    check_count++;
    if (!good) {
        check_failures++;
        fprintf(stderr, "%s: a tensor's data pointer, size or lookup is wrong\n", what);
    }
}

/* The tensor `name` with that dtype and shape (ndim entries), or NULL after a failed check. */
static const st_tensor *expect_tensor(const st_file *f, const char *name, st_dtype dtype,
                                      uint32_t ndim, const uint64_t *shape) {
    const st_tensor *t = st_find(f, name);
    check_count++;
    if (!t || t->dtype != dtype || t->ndim != ndim ||
        (ndim && memcmp(t->shape, shape, ndim * sizeof *shape) != 0)) {
        check_failures++;
        fprintf(stderr, "%s: tensor '%s' missing or with a wrong dtype or shape\n", f->path,
                name);
        return NULL;
    }
    return t;
}

/* The contents of the valid corpus files (see make_bad_safetensors.py). */
static void check_ok_contents(const char *base, const st_file *f) {
    const st_tensor *t;
    if (strcmp(base, "ok_single_f32.OK.safetensors") == 0) {
        CHECK_INT(f->n_tensors, 1);
        if ((t = expect_tensor(f, "x", ST_F32, 2, (const uint64_t[]){2, 2}))) {
            float v[4];
            memcpy(v, t->data, sizeof v);
            CHECK(v[0] == 1.0f && v[1] == 2.0f && v[2] == 3.0f && v[3] == 4.0f);
            CHECK_INT(t->n_elements, 4);
        }
    } else if (strcmp(base, "ok_metadata.OK.safetensors") == 0) {
        CHECK_INT(f->n_tensors, 1); /* __metadata__ is not a tensor */
        CHECK(st_find(f, "__metadata__") == NULL);
        if ((t = expect_tensor(f, "w", ST_BF16, 1, (const uint64_t[]){3}))) {
            uint16_t v[3];
            memcpy(v, t->data, sizeof v);
            CHECK(v[0] == 0x3f80 && v[1] == 0x4000 && v[2] == 0x4040);
        }
    } else if (strcmp(base, "ok_zero_size_tensor.OK.safetensors") == 0) {
        CHECK_INT(f->n_tensors, 2);
        if ((t = expect_tensor(f, "empty", ST_F32, 2, (const uint64_t[]){0, 3})))
            CHECK(t->n_elements == 0 && t->begin == 0 && t->end == 0);
        if ((t = expect_tensor(f, "one", ST_U8, 1, (const uint64_t[]){1})))
            CHECK_INT(t->data[0], 7);
    } else if (strcmp(base, "ok_scalar_shape.OK.safetensors") == 0) {
        if ((t = expect_tensor(f, "s", ST_F64, 0, NULL))) {
            double v;
            memcpy(&v, t->data, sizeof v);
            CHECK(t->n_elements == 1 && v == 2.5);
        }
    } else if (strcmp(base, "ok_header_padded_spaces.OK.safetensors") == 0) {
        if ((t = expect_tensor(f, "x", ST_I32, 1, (const uint64_t[]){2}))) {
            int32_t v[2];
            memcpy(v, t->data, sizeof v);
            CHECK(v[0] == -1 && v[1] == 7);
        }
    } else if (strcmp(base, "ok_empty_header.OK.safetensors") == 0 ||
               strcmp(base, "ok_metadata_only.OK.safetensors") == 0) {
        CHECK_INT(f->n_tensors, 0);
    } else if (strcmp(base, "ok_unsorted_offsets.OK.safetensors") == 0) {
        CHECK_INT(f->n_tensors, 3);
        if (f->n_tensors == 3) /* header order is kept */
            CHECK(strcmp(f->tensors[0].name, "b") == 0 && strcmp(f->tensors[1].name, "a") == 0 &&
                  strcmp(f->tensors[2].name, "c") == 0);
        if ((t = expect_tensor(f, "b", ST_U8, 1, (const uint64_t[]){2})))
            CHECK(t->data[0] == 3 && t->data[1] == 4);
        if ((t = expect_tensor(f, "c", ST_I16, 1, (const uint64_t[]){1})))
            CHECK(t->data[0] == 5 && t->data[1] == 6);
    } else if (strcmp(base, "ok_unicode_names.OK.safetensors") == 0) {
        if ((t = expect_tensor(f, "\xc3\xa9t\xc3\xa9", ST_U8, 1, (const uint64_t[]){1})))
            CHECK_INT(t->data[0], 1);
        if ((t = expect_tensor(f, "\xf0\x9f\x98\x80", ST_U8, 1, (const uint64_t[]){1})))
            CHECK_INT(t->data[0], 2);
    } else if (strcmp(base, "ok_all_dtypes.OK.safetensors") == 0) {
        CHECK_INT(f->n_tensors, 15);
        for (int d = ST_BOOL; d <= ST_U64; d++) {
            char name[32];
            snprintf(name, sizeof name, "t_%s", st_dtype_name((st_dtype)d));
            expect_tensor(f, name, (st_dtype)d, 1, (const uint64_t[]){3});
        }
    } else if (strcmp(base, "ok_8_dims.OK.safetensors") == 0) {
        expect_tensor(f, "x", ST_U8, 8, (const uint64_t[]){1, 2, 1, 2, 1, 2, 1, 1});
    } else if (strcmp(base, "ok_whitespace_json.OK.safetensors") == 0) {
        if ((t = expect_tensor(f, "x", ST_F16, 1, (const uint64_t[]){1})))
            CHECK(t->data[0] == 0x00 && t->data[1] == 0x3c);
    } else if (strcmp(base, "ok_only_zero_size.OK.safetensors") == 0) {
        expect_tensor(f, "empty", ST_F16, 2, (const uint64_t[]){4, 0});
    } else {
        check_count++;
        check_failures++;
        fprintf(stderr, "%s: a valid corpus file this test does not know\n", base);
    }
}

static int cmp_str(const void *a, const void *b) {
    return strcmp(*(char *const *)a, *(char *const *)b);
}

static void test_corpus(void) {
    char dir[4096];
    snprintf(dir, sizeof dir, "%s/test/data/bad-safetensors", source_root());
    DIR *d = opendir(dir);
    CHECK(d != NULL);
    if (!d) {
        fprintf(stderr, "cannot open %s (run test/data/make_bad_safetensors.py)\n", dir);
        return;
    }
    char *names[1024];
    size_t n_names = 0;
    struct dirent *e;
    while ((e = readdir(d)) && n_names < 1024) {
        size_t len = strlen(e->d_name);
        if (len > 12 && strcmp(e->d_name + len - 12, ".safetensors") == 0)
            names[n_names++] = strdup(e->d_name);
    }
    closedir(d);
    qsort(names, n_names, sizeof *names, cmp_str);
    CHECK(n_names >= 60);

    int seen[100] = {0};
    for (size_t i = 0; i < n_names; i++) {
        const char *base = names[i];
        /* the status token sits between the last two dots */
        char token[64] = "";
        const char *end = base + strlen(base) - 12;
        const char *dot = end;
        while (dot > base && dot[-1] != '.') dot--;
        int expected = 0;
        if (dot > base && (size_t)(end - dot) < sizeof token) {
            memcpy(token, dot, (size_t)(end - dot));
            token[end - dot] = '\0';
        }
        check_count++;
        if (!status_from_token(token, &expected)) {
            check_failures++;
            fprintf(stderr, "%s: no status in the file name\n", base);
            continue;
        }
        char path[8192];
        snprintf(path, sizeof path, "%s/%s", dir, base);

        st_file *f = NULL;
        clear_error();
        int s = st_open(path, &f);
        check_count++;
        if (s != expected) {
            check_failures++;
            fprintf(stderr, "%s: st_open returned %s, expected %s (message: %s)\n", base,
                    parity_status_name(s), parity_status_name(expected), parity_last_error());
        }
        if (s < 0 && -s < 100) seen[-s] = 1;
        if (s != PARITY_OK) {
            check_count++;
            if (!parity_last_error()[0] || !strstr(parity_last_error(), base)) {
                check_failures++;
                fprintf(stderr, "%s: message does not name the file: '%s'\n", base,
                        parity_last_error());
            }
        } else {
            CHECK(f->map != NULL || f->size < 8);
            check_valid(f, base);
            check_ok_contents(base, f);
            st_close(f);
        }

        /* The same image from memory: the same status, and every prefix of it fails
         * cleanly (a mini fuzz of truncation, run under the sanitizers). */
        size_t size = 0;
        uint8_t *buf = read_file(path, &size);
        CHECK(buf != NULL);
        if (!buf) continue;
        f = NULL;
        s = st_parse(buf, size, base, &f);
        CHECK_INT(s, expected);
        if (s == PARITY_OK) {
            CHECK(f->map == NULL && f->base == buf && f->size == size);
            check_valid(f, base);
            check_ok_contents(base, f);
            st_close(f);
            /* every shorter prefix breaks the header length or truncates the data */
            int prefixes_fail = 1;
            for (size_t cut = 0; cut < size; cut++) {
                uint8_t *copy = malloc(cut ? cut : 1);
                memcpy(copy, buf, cut);
                f = NULL;
                int ps = st_parse(copy, cut, base, &f);
                if (ps != PARITY_ERR_ST_HEADER_LENGTH && ps != PARITY_ERR_ST_TRUNCATED) {
                    prefixes_fail = 0;
                    st_close(f);
                }
                free(copy);
            }
            CHECK(prefixes_fail);
        } else {
            CHECK(strstr(parity_last_error(), base) != NULL);
        }
        free(buf);
    }

    /* every safetensors rule has a file that breaks it */
    for (int s = -PARITY_ERR_ST_HEADER_LENGTH; s <= -PARITY_ERR_ST_DUPLICATE; s++) {
        check_count++;
        if (!seen[s]) {
            check_failures++;
            fprintf(stderr, "no corpus file produces %s\n", parity_status_name(-s));
        }
    }
    for (size_t i = 0; i < n_names; i++) free(names[i]);
    printf("corpus: %zu files\n", n_names);
}

/* ---- images built here -------------------------------------------------------------------- */

/* header length + header + `data_len` bytes of data 0, 1, 2, ... (malloc'd). */
static uint8_t *make_image(const char *header, size_t data_len, size_t *size) {
    size_t n = strlen(header);
    *size = 8 + n + data_len;
    uint8_t *b = malloc(*size);
    for (int k = 0; k < 8; k++) b[k] = (uint8_t)((uint64_t)n >> (8 * k));
    memcpy(b + 8, header, n);
    for (size_t i = 0; i < data_len; i++) b[8 + n + i] = (uint8_t)i;
    return b;
}

static int parse_image(const char *header, size_t data_len) {
    size_t size;
    uint8_t *b = make_image(header, data_len, &size);
    st_file *f = NULL;
    int s = st_parse(b, size, "mem.safetensors", &f);
    if (s == PARITY_OK) {
        check_valid(f, header);
        st_close(f);
    } else {
        CHECK(strncmp(parity_last_error(), "mem.safetensors: ", 17) == 0);
    }
    free(b);
    return s;
}

static void test_images(void) {
    CHECK_OK(parse_image("{}", 0));
    CHECK_OK(parse_image("{\"a\":{\"dtype\":\"I64\",\"shape\":[2],\"data_offsets\":[0,16]}}", 16));
    CHECK_OK(parse_image("{\"a\":{\"data_offsets\":[0,2],\"shape\":[1,1,2],\"dtype\":\"I8\"}}", 2));
    CHECK_STATUS(parse_image("", 0), PARITY_ERR_ST_HEADER_LENGTH);
    CHECK_STATUS(parse_image("{\"a\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1]}\xed"
                             "\xa0\x80}", 1), PARITY_ERR_ST_HEADER_UTF8);
    CHECK_STATUS(parse_image("\n{}", 0), PARITY_ERR_ST_HEADER_JSON);
    CHECK_STATUS(parse_image("{\"a\":[]}", 0), PARITY_ERR_ST_HEADER_JSON);
    CHECK_STATUS(parse_image("{\"a\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1]},"
                             "\"b\":{}}", 1), PARITY_ERR_ST_HEADER_JSON);
    CHECK_STATUS(parse_image("{\"a\\u0000b\":{\"dtype\":\"U8\",\"shape\":[1],"
                             "\"data_offsets\":[0,1]}}", 1), PARITY_ERR_ST_HEADER_JSON);
    CHECK_STATUS(parse_image("{\"a\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1],"
                             "\"data_offsets\":[0,1]}}", 1), PARITY_ERR_ST_HEADER_JSON);
    CHECK_STATUS(parse_image("{\"a\":{\"dtype\":\"U8\\u0000\",\"shape\":[1],"
                             "\"data_offsets\":[0,1]}}", 1), PARITY_ERR_ST_DTYPE);
    CHECK_STATUS(parse_image("{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]},"
                             "\"b\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[3,7]}}", 7),
                 PARITY_ERR_ST_OFFSETS);
    CHECK(strstr(parity_last_error(), "tensor 'b'") && strstr(parity_last_error(), "overlap"));
    CHECK_STATUS(parse_image("{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]},"
                             "\"b\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[5,9]}}", 9),
                 PARITY_ERR_ST_OFFSETS);
    CHECK(strstr(parity_last_error(), "tensor 'b'") && strstr(parity_last_error(), "gap"));
    CHECK_STATUS(parse_image("{\"a\":{\"dtype\":\"U32\",\"shape\":[9223372036854775807],"
                             "\"data_offsets\":[0,0]}}", 0), PARITY_ERR_ST_OVERFLOW);
    CHECK_STATUS(parse_image("{\"a\":{\"dtype\":\"U8\",\"shape\":[65536,65536,65536,65536],"
                             "\"data_offsets\":[0,0]}}", 0), PARITY_ERR_ST_OVERFLOW);
    CHECK(strstr(parity_last_error(), "tensor 'a'") && strstr(parity_last_error(), "shape[3]"));
    CHECK_STATUS(parse_image("{\"a\":{\"dtype\":\"U8\",\"shape\":[3],\"data_offsets\":[0,2]}}", 2),
                 PARITY_ERR_ST_SIZE);
    CHECK(strstr(parity_last_error(), "tensor 'a'") && strstr(parity_last_error(), "3 elements"));
    CHECK_STATUS(parse_image("{\"a\":{\"dtype\":\"U8\",\"shape\":[3],\"data_offsets\":[0,3]}}", 2),
                 PARITY_ERR_ST_TRUNCATED);
    CHECK_STATUS(parse_image("{\"a\":{\"dtype\":\"U8\",\"shape\":[3],\"data_offsets\":[0,3]}}", 4),
                 PARITY_ERR_ST_TRAILING);
    CHECK_STATUS(parse_image("{\"a\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1]},"
                             "\"__metadata__\":{},"
                             "\"a\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[1,2]}}", 2),
                 PARITY_ERR_ST_DUPLICATE);
    CHECK(strstr(parity_last_error(), "tensor 'a'") != NULL);

    /* a header length past the file, given through a buffer shorter than the field says */
    static const uint8_t tiny[8] = {1, 0, 0, 0, 0, 0, 0, 0};
    st_file *f = NULL;
    CHECK_STATUS(st_parse(tiny, 8, "tiny", &f), PARITY_ERR_ST_HEADER_LENGTH);
    CHECK_STATUS(st_parse(tiny, 3, "tiny", &f), PARITY_ERR_ST_HEADER_LENGTH);
    CHECK_STATUS(st_parse(NULL, 0, "null", &f), PARITY_ERR_ST_HEADER_LENGTH);
    CHECK_STATUS(st_parse(NULL, 8, "null", &f), PARITY_ERR_INVALID_ARGUMENT);
    CHECK_STATUS(st_parse(tiny, 8, "tiny", NULL), PARITY_ERR_INVALID_ARGUMENT);
    CHECK(f == NULL);

    /* many tensors, listed in reverse order of their offsets */
    enum { N = 3000 };
    char *header = malloc(N * 80 + 16);
    size_t pos = 0;
    header[pos++] = '{';
    for (int i = 0; i < N; i++)
        pos += (size_t)sprintf(header + pos, "%s\"layer.%d\":{\"dtype\":\"BF16\",\"shape\":[2],"
                               "\"data_offsets\":[%d,%d]}", i ? "," : "", i, 4 * (N - 1 - i),
                               4 * (N - i));
    header[pos++] = '}';
    header[pos] = '\0';
    size_t size;
    uint8_t *img = make_image(header, 4 * N, &size);
    CHECK_OK(st_parse(img, size, "many", &f));
    if (f) {
        CHECK_INT(f->n_tensors, N);
        const st_tensor *t = st_find(f, "layer.0");
        CHECK(t && t->begin == 4 * (N - 1) && t->data == img + 8 + pos + 4 * (N - 1));
        CHECK(st_find(f, "layer.2999") && st_find(f, "layer.2999")->begin == 0);
        CHECK(st_find(f, "layer.3000") == NULL);
        check_valid(f, "many");
        st_close(f);
    }
    free(img);
    free(header);
}

static void test_dtypes(void) {
    static const struct {
        st_dtype t;
        const char *name;
        size_t size;
    } table[] = {
        {ST_BOOL, "BOOL", 1}, {ST_U8, "U8", 1},   {ST_I8, "I8", 1},    {ST_F8_E5M2, "F8_E5M2", 1},
        {ST_F8_E4M3, "F8_E4M3", 1}, {ST_I16, "I16", 2}, {ST_U16, "U16", 2}, {ST_F16, "F16", 2},
        {ST_BF16, "BF16", 2}, {ST_I32, "I32", 4}, {ST_U32, "U32", 4}, {ST_F32, "F32", 4},
        {ST_F64, "F64", 8}, {ST_I64, "I64", 8}, {ST_U64, "U64", 8},
    };
    for (size_t i = 0; i < sizeof table / sizeof table[0]; i++) {
        CHECK(strcmp(st_dtype_name(table[i].t), table[i].name) == 0);
        CHECK_INT(st_dtype_size(table[i].t), table[i].size);
    }
    CHECK_INT(st_dtype_size((st_dtype)99), 0);
}

static void test_open_errors(void) {
    st_file *f = NULL;
    char path[4096];
    snprintf(path, sizeof path, "%s/test/data/no-such-file.safetensors", source_root());
    CHECK_STATUS(st_open(path, &f), PARITY_ERR_IO);
    CHECK(strstr(parity_last_error(), "no-such-file") != NULL);
    snprintf(path, sizeof path, "%s/test/data", source_root());
    CHECK_STATUS(st_open(path, &f), PARITY_ERR_IO);
    CHECK(f == NULL);
    st_close(NULL);
    CHECK(st_find(NULL, "x") == NULL);
}

static void test_regions_file(void) {
    char path[4096];
    st_file *f = NULL;
    CHECK_OK(st_open(source_path(path, sizeof path, "test/data/regions.safetensors"), &f));
    if (!f) return;
    CHECK_INT(f->n_tensors, 44);
    check_valid(f, path);
    const st_tensor *t = expect_tensor(f, "rope.positions", ST_I32, 1, (const uint64_t[]){48});
    if (t) {
        int32_t pos[48];
        memcpy(pos, t->data, sizeof pos);
        CHECK(pos[0] == 0 && pos[15] == 15 && pos[16] == 40556 && pos[47] == 7800);
    }
    expect_tensor(f, "qknorm.weight", ST_BF16, 1, (const uint64_t[]){128});
    expect_tensor(f, "resnorm.delta", ST_BF16, 2, (const uint64_t[]){64, 1024});
    st_close(f);
}

int main(void) {
    test_dtypes();
    test_corpus();
    test_images();
    test_open_errors();
    test_regions_file();
    return check_report("test_safetensors");
}
