/* Errors: the per-thread message with its status, the one way a status travels up a call
 * chain, the prefix that names where a failure was seen, and the logging hook. */
#ifndef PARITY_BASE_ERRORS_H
#define PARITY_BASE_ERRORS_H

#include "parity.h"

#if defined(__GNUC__)
#define PARITY_PRINTF(a, b) __attribute__((format(printf, a, b)))
#else
#define PARITY_PRINTF(a, b)
#endif

/* Records `status` and a formatted message for this thread; returns `status`, so that a
 * failing path reads `return set_error(PARITY_ERR_X, "...", ...);`. */
int set_error(int status, const char *fmt, ...) PARITY_PRINTF(2, 3);
/* Clears this thread's message (called on entry by public functions that can fail). */
void clear_error(void);
/* The one error-prefix helper: a failed status (not PARITY_OK) gets `prefix: ` put before
 * the message its callee recorded, so that the message names where the failure was seen
 * ("parity_rmsnorm: policy ..."); returns `status` unchanged. PARITY_OK passes through. */
int error_prefixed(const char *prefix, int status);

/* The one propagation idiom: a call whose failure ends the caller, with nothing to undo, is
 * written TRY(call): its status, message kept, is the caller's. A caller with something to
 * undo keeps the status in `rc` and undoes before returning it. */
#define TRY(call)                            \
    do {                                     \
        int try_status_ = (call);            \
        if (try_status_) return try_status_; \
    } while (0)

/* The logging hook (parity_set_log_callback): the library prints nothing but through it. */
void log_message(parity_log_level level, const char *fmt, ...) PARITY_PRINTF(2, 3);

#endif /* PARITY_BASE_ERRORS_H */
