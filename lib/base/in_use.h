/* The busy flag of an object used by one thread at a time (a scorer, a sampler, a pool). */
#ifndef PARITY_BASE_IN_USE_H
#define PARITY_BASE_IN_USE_H

#include <stdatomic.h>

#include "errors.h"

/* An object's public calls take its `in_use` flag on entry and drop it on exit, and a call
 * that finds it taken fails with PARITY_ERR_BUSY instead of corrupting the object's scratch
 * state. */
static inline int object_enter(atomic_int *in_use, const char *what) {
    if (atomic_exchange_explicit(in_use, 1, memory_order_acq_rel))
        return set_error(PARITY_ERR_BUSY,
                         "this %s is in use by another thread: a %s serves one thread at a time",
                         what, what);
    return PARITY_OK;
}
static inline void object_leave(atomic_int *in_use) {
    atomic_store_explicit(in_use, 0, memory_order_release);
}

#endif /* PARITY_BASE_IN_USE_H */
