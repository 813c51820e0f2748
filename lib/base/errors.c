/* Status names, the per-thread error message and its prefix, the logging hook, the version. */
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "errors.h"

static _Thread_local char last_message[1024];

int set_error(int status, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(last_message, sizeof last_message, fmt, ap);
    va_end(ap);
    return status;
}

void clear_error(void) { last_message[0] = '\0'; }

int error_prefixed(const char *prefix, int status) {
    if (!status) return PARITY_OK;
    /* copied first: set_error writes the buffer the message is in */
    char why[sizeof last_message];
    snprintf(why, sizeof why, "%s", last_message);
    return set_error(status, "%s: %s", prefix, why);
}

const char *parity_last_error(void) { return last_message; }

const char *parity_status_name(int status) {
    switch (status) {
#define NAME(s) \
    case s:     \
        return #s;
        NAME(PARITY_OK)
        NAME(PARITY_ERR_INVALID_ARGUMENT)
        NAME(PARITY_ERR_OUT_OF_MEMORY)
        NAME(PARITY_ERR_IO)
        NAME(PARITY_ERR_UNSUPPORTED)
        NAME(PARITY_ERR_MEMORY_LIMIT)
        NAME(PARITY_ERR_BUSY)
        NAME(PARITY_ERR_JSON_SYNTAX)
        NAME(PARITY_ERR_CONFIG)
        NAME(PARITY_ERR_INDEX)
        NAME(PARITY_ERR_ST_HEADER_LENGTH)
        NAME(PARITY_ERR_ST_HEADER_UTF8)
        NAME(PARITY_ERR_ST_HEADER_JSON)
        NAME(PARITY_ERR_ST_DTYPE)
        NAME(PARITY_ERR_ST_OFFSETS)
        NAME(PARITY_ERR_ST_OVERFLOW)
        NAME(PARITY_ERR_ST_SIZE)
        NAME(PARITY_ERR_ST_TRUNCATED)
        NAME(PARITY_ERR_ST_TRAILING)
        NAME(PARITY_ERR_ST_DUPLICATE)
        NAME(PARITY_ERR_TENSOR_MISSING)
        NAME(PARITY_ERR_TENSOR_SHAPE)
        NAME(PARITY_ERR_TENSOR_DTYPE)
        NAME(PARITY_ERR_TENSOR_NONFINITE)
        NAME(PARITY_ERR_TENSOR_UNEXPECTED)
        NAME(PARITY_ERR_SCALE_MISSING)
        NAME(PARITY_ERR_SCALE_GRID)
        NAME(PARITY_ERR_SCALE_VALUE)
        NAME(PARITY_ERR_TOKEN_RANGE)
        NAME(PARITY_ERR_EMPTY_INPUT)
        NAME(PARITY_ERR_TOO_LONG)
        NAME(PARITY_ERR_POLICY)
        NAME(PARITY_ERR_CACHE_FULL)
        NAME(PARITY_ERR_UNKNOWN_SEQUENCE)
        NAME(PARITY_ERR_SEQUENCE_FINISHED)
        NAME(PARITY_ERR_STALE)
        NAME(PARITY_ERR_VERIFY)
#undef NAME
    }
    return "PARITY_UNKNOWN_STATUS";
}

/* ---- logging ---------------------------------------------------------------------------- */

static parity_log_fn log_fn;
static void *log_user;

void parity_set_log_callback(parity_log_fn fn, void *user) {
    log_fn = fn;
    log_user = user;
}

void log_message(parity_log_level level, const char *fmt, ...) {
    parity_log_fn fn = log_fn;
    if (!fn) return;
    char buf[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    fn(level, buf, log_user);
}

/* ---- version ------------------------------------------------------------------------------ */

const char *parity_version(void) { return PARITY_VERSION_STRING; }
int parity_version_number(void) { return PARITY_VERSION_NUMBER; }
int parity_abi_version(void) { return PARITY_ABI_VERSION; }

size_t parity_struct_size(const char *name) {
    static const struct {
        const char *name;
        size_t size;
    } structs[] = {
        {"parity_policy", sizeof(parity_policy)},
        {"parity_config", sizeof(parity_config)},
        {"parity_scorer_params", sizeof(parity_scorer_params)},
        {"parity_score_options", sizeof(parity_score_options)},
        {"parity_sampling", sizeof(parity_sampling)},
        {"parity_sampler_params", sizeof(parity_sampler_params)},
        {"parity_tensor_data", sizeof(parity_tensor_data)},
        {"parity_seq_info", sizeof(parity_seq_info)},
        {"parity_profile", sizeof(parity_profile)},
    };
    for (size_t i = 0; name && i < sizeof structs / sizeof structs[0]; i++)
        if (!strcmp(structs[i].name, name)) return structs[i].size;
    return 0;
}
