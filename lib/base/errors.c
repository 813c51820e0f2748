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

/* A case per status of parity.h's one list (PARITY_STATUS_LIST), returning its name. */
const char *parity_status_name(int status) {
    switch (status) {
#define STATUS_NAME_CASE(name, value) \
    case name:                        \
        return #name;
        PARITY_STATUS_LIST(STATUS_NAME_CASE)
#undef STATUS_NAME_CASE
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
        {"parity_weight_info", sizeof(parity_weight_info)},
        {"parity_weight_bytes", sizeof(parity_weight_bytes)},
        {"parity_quant_operand", sizeof(parity_quant_operand)},
    };
    for (size_t i = 0; name && i < sizeof structs / sizeof structs[0]; i++)
        if (!strcmp(structs[i].name, name)) return structs[i].size;
    return 0;
}
