/*
 * The names of the library's enumerations, each in one table: backends, log-prob modes and
 * architectures. The command-line tools, the benches and the Python binding use these
 * functions rather than copies of the strings. (Presets: policy.c; built-in configs:
 * config.c; CPU paths: cpu.c; statuses: errors.c.)
 */
#include <stdio.h>

#include "internal.h"

typedef struct name_entry {
    int value;
    const char *name;
} name_entry;

static const name_entry backends[] = {
    {PARITY_BACKEND_BF16, "bf16"},
    {PARITY_BACKEND_OPENBLAS, "openblas"},
};

static const name_entry logprob_modes[] = {
    {PARITY_LOGPROB_RAW, "raw"},
    {PARITY_LOGPROB_PROCESSED, "processed"},
    {PARITY_LOGPROB_PROCESSED_TRUNCATED, "processed-truncated"},
};

/* The config.json model_type of each architecture. */
static const name_entry archs[] = {
    {PARITY_ARCH_QWEN2, "qwen2"},
    {PARITY_ARCH_QWEN3, "qwen3"},
    {PARITY_ARCH_LLAMA, "llama"},
};

#define COUNT(t) (sizeof t / sizeof t[0])

static const char *name_of(const name_entry *t, size_t n, int value) {
    for (size_t i = 0; i < n; i++)
        if (t[i].value == value) return t[i].name;
    return NULL;
}

/* The list of names for a message: "bf16 | openblas". */
static void list_names(const name_entry *t, size_t n, char *buf, size_t size) {
    size_t used = 0;
    buf[0] = 0;
    for (size_t i = 0; i < n && used < size; i++) {
        int w = snprintf(buf + used, size - used, "%s%s", i ? " | " : "", t[i].name);
        if (w < 0) break;
        used += (size_t)w;
    }
}

/* The value of `name` into *value; `have_out` says whether the caller's output exists. */
static int value_of(const name_entry *t, size_t n, const char *what, const char *name,
                    int have_out, int *value) {
    clear_error();
    if (!name || !have_out) return set_error(PARITY_ERR_INVALID_ARGUMENT, "%s name or output is NULL", what);
    for (size_t i = 0; i < n; i++)
        if (strcmp(t[i].name, name) == 0) {
            *value = t[i].value;
            return PARITY_OK;
        }
    char names[128];
    list_names(t, n, names, sizeof names);
    return set_error(PARITY_ERR_INVALID_ARGUMENT, "'%s' is not a %s (%s)", name, what, names);
}

const char *parity_backend_name(int backend) { return name_of(backends, COUNT(backends), backend); }

int parity_backend_from_name(const char *name, parity_backend *out) {
    int v = 0;
    int rc = value_of(backends, COUNT(backends), "backend", name, out != NULL, &v);
    if (rc == PARITY_OK) *out = (parity_backend)v;
    return rc;
}

const char *parity_logprob_mode_name(int mode) {
    return name_of(logprob_modes, COUNT(logprob_modes), mode);
}

int parity_logprob_mode_from_name(const char *name, parity_logprob_mode *out) {
    int v = 0;
    int rc = value_of(logprob_modes, COUNT(logprob_modes), "log-prob mode", name, out != NULL, &v);
    if (rc == PARITY_OK) *out = (parity_logprob_mode)v;
    return rc;
}

const char *parity_arch_name(int arch) { return name_of(archs, COUNT(archs), arch); }

int parity_arch_from_name(const char *name, parity_arch *out) {
    int v = 0;
    int rc = value_of(archs, COUNT(archs), "architecture (model_type)", name, out != NULL, &v);
    if (rc == PARITY_OK) *out = (parity_arch)v;
    return rc;
}
