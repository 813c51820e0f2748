/*
 * The names of the library's enumerations, each in one table: backends, log-prob modes,
 * architectures and profile phases. The command-line tools, the benches and the Python
 * binding use these functions rather than copies of the strings. (Presets: policy.c; built-in configs:
 * config.c; CPU paths: cpu.c; statuses: errors.c.)
 */
#include <string.h>

#include "errors.h"
#include "nametable.h"

typedef struct name_entry {
    const char *name;  /* first: a table of named entries (nametable.c) */
    int value;
} name_entry;

static const name_entry backends[] = {
    {"bf16", PARITY_BACKEND_BF16},
    {"openblas", PARITY_BACKEND_OPENBLAS},
    {"amx", PARITY_BACKEND_AMX},
};

static const name_entry logprob_modes[] = {
    {"raw", PARITY_LOGPROB_RAW},
    {"processed", PARITY_LOGPROB_PROCESSED},
    {"processed-truncated", PARITY_LOGPROB_PROCESSED_TRUNCATED},
};

/* The config.json model_type of each architecture. */
static const name_entry archs[] = {
    {"qwen2", PARITY_ARCH_QWEN2},
    {"qwen3", PARITY_ARCH_QWEN3},
    {"llama", PARITY_ARCH_LLAMA},
    {"ouro", PARITY_ARCH_OURO},
    {"qwen3_moe", PARITY_ARCH_QWEN3_MOE},
    {"qwen2_moe", PARITY_ARCH_QWEN2_MOE},
};

static const name_entry phases[] = {
    {"embed", PARITY_PHASE_EMBED},
    {"gemm", PARITY_PHASE_GEMM},
    {"rounding", PARITY_PHASE_ROUNDING},
    {"regions", PARITY_PHASE_REGIONS},
    {"attention", PARITY_PHASE_ATTENTION},
    {"head", PARITY_PHASE_HEAD},
    {"sampling", PARITY_PHASE_SAMPLING},
};

#define COUNT(t) (sizeof t / sizeof t[0])

static const char *name_of(const name_entry *t, size_t n, int value) {
    for (size_t i = 0; i < n; i++)
        if (t[i].value == value) return t[i].name;
    return NULL;
}

/* The value of `name` into *out, an enum of the public API (int-sized, as the ABI makes
 * every enum whose values fit an int). */
_Static_assert(sizeof(parity_backend) == sizeof(int) && sizeof(parity_logprob_mode) == sizeof(int) &&
                   sizeof(parity_arch) == sizeof(int),
               "the public enums are int-sized");
static int value_of(const name_entry *t, size_t n, const char *what, const char *name, void *out) {
    clear_error();
    if (!name || !out) return set_error(PARITY_ERR_INVALID_ARGUMENT, "%s name or output is NULL", what);
    const name_entry *e = name_table_find(t, n, sizeof *t, name, strlen(name));
    if (e) {
        memcpy(out, &e->value, sizeof e->value);
        return PARITY_OK;
    }
    char names[128];
    name_table_list(t, n, sizeof *t, names, sizeof names);
    return set_error(PARITY_ERR_INVALID_ARGUMENT, "'%s' is not a %s (%s)", name, what, names);
}

const char *parity_backend_name(int backend) { return name_of(backends, COUNT(backends), backend); }
int parity_backend_from_name(const char *name, parity_backend *out) {
    return value_of(backends, COUNT(backends), "backend", name, out);
}

const char *parity_logprob_mode_name(int mode) {
    return name_of(logprob_modes, COUNT(logprob_modes), mode);
}
int parity_logprob_mode_from_name(const char *name, parity_logprob_mode *out) {
    return value_of(logprob_modes, COUNT(logprob_modes), "log-prob mode", name, out);
}

const char *parity_arch_name(int arch) { return name_of(archs, COUNT(archs), arch); }
int parity_arch_from_name(const char *name, parity_arch *out) {
    return value_of(archs, COUNT(archs), "architecture (model_type)", name, out);
}

const char *parity_phase_name(uint32_t phase) {
    return phase < PARITY_PHASE_COUNT ? name_of(phases, COUNT(phases), (int)phase) : NULL;
}
