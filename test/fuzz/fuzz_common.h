/* What the fuzz targets share: a per-process scratch directory, file helpers, a micro
 * checkpoint (a synthetic model small enough to live in a corpus), and the checks that turn a
 * broken promise of the API into a crash libFuzzer reports. Everything here is header-only:
 * each target is one translation unit. */
#ifndef PARITY_FUZZ_COMMON_H
#define PARITY_FUZZ_COMMON_H

#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "model/model.h"
#include "checkpoint/safetensors.h"

/* The framing of fuzz_load's input: the parts between markers are these files, in order; an
 * empty part is a file that is not there. */
#define FUZZ_MARKER "@@FILE"
#define FUZZ_MARKER_LEN 6
static const char *const fuzz_files[] = {
    "config.json",
    "model.safetensors.index.json",
    "model.safetensors",
    "model-00001-of-00002.safetensors",
    "model-00002-of-00002.safetensors",
};
#define FUZZ_N_FILES (sizeof fuzz_files / sizeof fuzz_files[0])

/* A broken promise: print it and abort, which libFuzzer reports with the input. */
#define FUZZ_REQUIRE(cond, ...)                                                         \
    do {                                                                                \
        if (!(cond)) {                                                                  \
            fprintf(stderr, "%s:%d: fuzz invariant failed: %s: ", __FILE__, __LINE__, #cond); \
            fprintf(stderr, __VA_ARGS__);                                               \
            fputc('\n', stderr);                                                        \
            abort();                                                                    \
        }                                                                               \
    } while (0)

/* A failed call returns a status of the enum and says why. */
static inline void fuzz_check_failure(int rc) {
    FUZZ_REQUIRE(rc < 0, "status %d", rc);
    FUZZ_REQUIRE(strcmp(parity_status_name(rc), "PARITY_UNKNOWN_STATUS") != 0, "status %d", rc);
    FUZZ_REQUIRE(parity_last_error()[0] != '\0', "%s without a message", parity_status_name(rc));
}

/* ---- files ------------------------------------------------------------------------------ */

static char fuzz_dir[512];

static inline void fuzz_path(char *out, size_t n, const char *dir, const char *name) {
    snprintf(out, n, "%s/%s", dir, name);
}

static inline void fuzz_write(const char *dir, const char *name, const void *data, size_t len) {
    char path[1024];
    fuzz_path(path, sizeof path, dir, name);
    FILE *f = fopen(path, "wb");
    FUZZ_REQUIRE(f != NULL, "cannot create %s", path);
    FUZZ_REQUIRE(fwrite(data, 1, len, f) == len && fclose(f) == 0, "cannot write %s", path);
}

static inline void fuzz_remove(const char *dir, const char *name) {
    char path[1024];
    fuzz_path(path, sizeof path, dir, name);
    unlink(path);
}

static void fuzz_remove_dir(void) {
    DIR *d = opendir(fuzz_dir);
    if (!d) return;
    struct dirent *e;
    while ((e = readdir(d)) != NULL)
        if (strcmp(e->d_name, ".") && strcmp(e->d_name, "..")) fuzz_remove(fuzz_dir, e->d_name);
    closedir(d);
    rmdir(fuzz_dir);
}

/* Creates this process's scratch directory (removed at exit): libFuzzer's -jobs and -fork
 * run several processes, each with its own. */
static inline const char *fuzz_make_dir(const char *target) {
    const char *tmp = getenv("TMPDIR");
    snprintf(fuzz_dir, sizeof fuzz_dir, "%s/parity-%s-XXXXXX", tmp && *tmp ? tmp : "/tmp", target);
    FUZZ_REQUIRE(mkdtemp(fuzz_dir) != NULL, "mkdtemp %s", fuzz_dir);
    atexit(fuzz_remove_dir);
    return fuzz_dir;
}

/* ---- the micro checkpoint ----------------------------------------------------------------- */

/* Qwen3, one layer, 8 wide, vocab 8, tied: 12 tensors, under 3 KB on disk. */
static inline parity_config fuzz_micro_config(void) {
    parity_config c;
    parity_config_builtin("tiny", &c);
    c.vocab_size = 8;
    c.hidden_size = 8;
    c.intermediate_size = 8;
    c.num_hidden_layers = 1;
    c.num_attention_heads = 1;
    c.num_key_value_heads = 1;
    c.head_dim = 8;
    c.max_position_embeddings = 16;
    c.tie_word_embeddings = 1;
    return c;
}

/* Writes tensors [first, last) of f as a safetensors file. */
static inline void fuzz_write_subset(const st_file *f, size_t first, size_t last, const char *dir,
                                     const char *name) {
    size_t cap = 256 + 256 * f->n_tensors, len = 0, data_len = 0;
    char *h = malloc(cap);
    FUZZ_REQUIRE(h != NULL, "out of memory");
    len += (size_t)snprintf(h, cap, "{");
    for (size_t i = first; i < last; i++) {
        const st_tensor *t = &f->tensors[i];
        size_t bytes = (size_t)(t->end - t->begin);
        len += (size_t)snprintf(h + len, cap - len, "%s\"%s\":{\"dtype\":\"%s\",\"shape\":[",
                                i > first ? "," : "", t->name, st_dtype_name(t->dtype));
        for (uint32_t d = 0; d < t->ndim; d++)
            len += (size_t)snprintf(h + len, cap - len, "%s%llu", d ? "," : "",
                                    (unsigned long long)t->shape[d]);
        len += (size_t)snprintf(h + len, cap - len, "],\"data_offsets\":[%zu,%zu]}", data_len,
                                data_len + bytes);
        data_len += bytes;
    }
    len += (size_t)snprintf(h + len, cap - len, "}");
    uint8_t *out = malloc(8 + len + data_len);
    FUZZ_REQUIRE(out != NULL, "out of memory");
    for (int b = 0; b < 8; b++) out[b] = (uint8_t)((uint64_t)len >> (8 * b));
    memcpy(out + 8, h, len);
    size_t at = 8 + len;
    for (size_t i = first; i < last; i++) {
        size_t bytes = (size_t)(f->tensors[i].end - f->tensors[i].begin);
        memcpy(out + at, f->tensors[i].data, bytes);
        at += bytes;
    }
    fuzz_write(dir, name, out, at);
    free(out);
    free(h);
}

/* Writes the micro checkpoint into dir: config.json and model.safetensors as
 * parity_model_save writes them, and the same tensors split into two shards (without an
 * index: the caller writes that). */
static inline void fuzz_write_checkpoint(const char *dir) {
    parity_config c = fuzz_micro_config();
    parity_model *m = NULL;
    int rc = parity_model_synthetic(&c, 7, &m);
    FUZZ_REQUIRE(rc == PARITY_OK, "%s", parity_last_error());
    rc = parity_model_save(m, dir);
    FUZZ_REQUIRE(rc == PARITY_OK, "%s", parity_last_error());
    parity_model_free(m);
    char path[1024];
    fuzz_path(path, sizeof path, dir, "model.safetensors");
    st_file *f = NULL;
    rc = st_open(path, &f);
    FUZZ_REQUIRE(rc == PARITY_OK, "%s", parity_last_error());
    fuzz_write_subset(f, 0, f->n_tensors / 2, dir, fuzz_files[3]);
    fuzz_write_subset(f, f->n_tensors / 2, f->n_tensors, dir, fuzz_files[4]);
    st_close(f);
}

/* A model that loaded is usable: a scorer scores a few tokens with it. */
static inline void fuzz_check_model(const parity_model *m) {
    const parity_config *c = parity_model_config(m);
    parity_scorer_params p;
    parity_scorer_default_params(&p);
    p.max_tokens = 8;
    p.chunk_rows = 4;
    parity_scorer *s = NULL;
    int rc = parity_scorer_create(m, &p, &s);
    FUZZ_REQUIRE(rc == PARITY_OK, "scorer on a loaded model: %s", parity_last_error());
    int32_t tokens[4];
    uint32_t len = c->max_position_embeddings < 4 ? c->max_position_embeddings : 4;
    for (uint32_t i = 0; i < len; i++) tokens[i] = (int32_t)((i * 5 + 1) % c->vocab_size);
    parity_score_options o;
    parity_score_default_options(&o);
    float lp[4];
    rc = parity_score(s, &o, tokens, &len, 1, lp, NULL, NULL, NULL);
    FUZZ_REQUIRE(rc == PARITY_OK, "score on a loaded model: %s", parity_last_error());
    parity_scorer_free(s);
}

/* Loads fuzz_dir: a failure must be a clean one (a status with a message, no model); a model
 * that loads must be usable. */
static inline void fuzz_load_dir(void) {
    parity_model *m = NULL;
    int rc = parity_model_load(fuzz_dir, &m);
    if (rc) {
        fuzz_check_failure(rc);
        FUZZ_REQUIRE(m == NULL, "output set on failure");
        return;
    }
    fuzz_check_model(m);
    parity_model_free(m);
}

#endif
