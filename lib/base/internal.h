/* Internal declarations shared by the library's files. Nothing here is API. */
#ifndef PARITY_INTERNAL_H
#define PARITY_INTERNAL_H

#include <stdarg.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "parity.h"

#if defined(__GNUC__)
#define PARITY_PRINTF(a, b) __attribute__((format(printf, a, b)))
#else
#define PARITY_PRINTF(a, b)
#endif

/* ---- errors (errors.c) ----------------------------------------------------------------- */

/* Records `status` and a formatted message for this thread; returns `status`, so that a
 * failing path reads `return set_error(PARITY_ERR_X, "...", ...);`. */
int set_error(int status, const char *fmt, ...) PARITY_PRINTF(2, 3);
/* Clears this thread's message (called on entry by public functions that can fail). */
void clear_error(void);
/* The logging hook (log.c). */
void log_message(parity_log_level level, const char *fmt, ...) PARITY_PRINTF(2, 3);

/* ---- memory (alloc.c) ------------------------------------------------------------------ */

/* Every allocation of the library goes through these, so that tests can count them and
 * fail the Nth one. They set PARITY_ERR_OUT_OF_MEMORY with a message naming `what` when
 * they fail. Sizes are checked for overflow (n * size). */
void *px_malloc(size_t size, const char *what);
void *px_calloc(size_t n, size_t size, const char *what);
void *px_aligned_alloc(size_t size, const char *what); /* 64-byte aligned, free with px_free */
/* For the large buffers (weights, KV cache, logits, the forward's scratch): px_aligned_alloc,
 * and a buffer of 2 MB or more is 2 MB aligned and advised MADV_HUGEPAGE. Free with px_free. */
void *px_huge_alloc(size_t size, const char *what);
void *px_realloc(void *p, size_t size, const char *what);
char *px_strdup(const char *s, const char *what);
void px_free(void *p);
/* Test hook: counts allocations from now on and makes the fail_at-th one fail (0 = none). */
void px_alloc_test_reset(long fail_at);
long px_alloc_test_count(void);
/* Test hook: the bytes requested by the allocations that succeeded since the last reset
 * (frees are not subtracted). */
uint64_t px_alloc_test_bytes(void);

/* ---- objects used by one thread at a time ----------------------------------------------- */

/* A scorer or sampler is used by one thread at a time: its public calls take its `in_use`
 * flag on entry and drop it on exit, and a call that finds it taken fails with
 * PARITY_ERR_BUSY instead of corrupting the object's scratch state. */
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

/* ---- argument checks of the public kernel calls (regions.c) ---------------------------
 * Each sets the message, prefixed with the function's name fn, and returns the status. */
int arg_policy(const char *fn, const parity_policy *policy);
/* A failed check's status with fn prefixed to its message (PARITY_OK passes through). */
int arg_prefixed(const char *fn, int status);
int arg_ptr(const char *fn, const void *p, const char *what);
/* `rows` rows of `dim` elements, `stride` apart: dim <= stride, and the last element's index
 * fits in size_t. */
int arg_rows(const char *fn, size_t rows, size_t dim, size_t stride, const char *what);
/* rows and dim both at least 1. */
int arg_shape(const char *fn, size_t rows, size_t dim);
int arg_eps(const char *fn, float eps);
/* An output may alias an input only exactly: the same rows (same pointer, same stride). */
int arg_alias(const char *fn, const void *out, size_t out_stride, const void *in,
                size_t in_stride, const char *out_name, const char *in_name);

/* Returns the status of `call` if it failed. */
#define TRY(call)                            \
    do {                                     \
        int try_status_ = (call);            \
        if (try_status_) return try_status_; \
    } while (0)

/* ---- bf16 ------------------------------------------------------------------------------ */

static inline uint32_t f32_bits(float x) {
    uint32_t u;
    memcpy(&u, &x, 4);
    return u;
}
static inline float f32_from_bits(uint32_t u) {
    float x;
    memcpy(&x, &u, 4);
    return x;
}
/* fp32 -> bf16 bits: round to nearest even; every NaN -> 0x7fc0 (PyTorch's c10::BFloat16). */
static inline uint16_t bf16_from_f32(float x) {
    const uint32_t u = f32_bits(x), rounded = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
    /* no branch: a loop of these vectorizes (kv_store) */
    return (uint16_t)((u & 0x7fffffffu) > 0x7f800000u ? 0x7fc0u : rounded);
}
static inline float bf16_to_f32(uint16_t h) { return f32_from_bits((uint32_t)h << 16); }
/* The rounding point: an fp32 value rounded to the nearest bf16, held in fp32. */
static inline float round_bf16(float x) { return bf16_to_f32(bf16_from_f32(x)); }

/* f16 (IEEE binary16) bits -> fp32, exact. */
float f16_to_f32(uint16_t h);
/* fp32 -> f16 bits: round to nearest even, overflow to infinity (|x| >= 65520), subnormals
 * kept (quantum 2^-24), every NaN -> 0x7e00 (as bf16's one NaN 0x7fc0: which sign a NaN
 * result has follows the operand order a compiler chose, so it is not the same in every
 * kernel table; PyTorch's c10::Half keeps it). Integer arithmetic only, so MXCSR plays no
 * part. */
static inline uint16_t f16_from_f32(float x) {
    const uint32_t u = f32_bits(x), a = u & 0x7fffffffu;
    const uint16_t sign = (uint16_t)((u >> 16) & 0x8000u);
    if (a > 0x7f800000u) return 0x7e00u;
    if (a >= 0x477ff000u) return sign | 0x7c00u;             /* >= 65520 (and inf): inf */
    if (a >= 0x38800000u) {                                  /* >= 2^-14: normal */
        const uint32_t r = a + 0x0fffu + ((a >> 13) & 1u);   /* RNE at bit 13 */
        return sign | (uint16_t)((r >> 13) - ((127u - 15u) << 10));
    }
    if (a <= 0x33000000u) return sign;                       /* <= 2^-25 (a tie at 2^-25): 0 */
    /* subnormal: n = RNE(|x| / 2^-24) with |x| = m 2^(e - 150); n = 1024 is the smallest
     * normal, whose encoding is n itself */
    const uint32_t e = a >> 23, m = (a & 0x7fffffu) | 0x800000u, shift = 126u - e;
    uint32_t n = m >> shift;
    const uint32_t rem = m & ((1u << shift) - 1u), half = 1u << (shift - 1u);
    if (rem > half || (rem == half && (n & 1u))) n++;
    return sign | (uint16_t)n;
}
/* The fp16 rounding point: an fp32 value rounded to the nearest fp16, held in fp32. */
static inline float round_fp16(float x) { return f16_to_f32(f16_from_f32(x)); }

/* ---- tables of named entries (nametable.c) -------------------------------------------- */

/* For arrays of n structs, `stride` bytes apart, whose first member is the entry's name
 * (const char *). The entry whose name is the `len` bytes at `name`, or NULL: */
const void *name_table_find(const void *table, size_t n, size_t stride, const char *name,
                            size_t len);
/* "a, b, c": the names, for messages (truncated to size). */
void name_table_list(const void *table, size_t n, size_t stride, char *buf, size_t size);
/* names[0..n-1] = the names, names[n] = NULL. */
void name_table_names(const void *table, size_t n, size_t stride, const char **names);
/* The three for an array `t` whose length the compiler knows. */
#define NAME_FIND(t, name, len) name_table_find(t, sizeof t / sizeof t[0], sizeof t[0], name, len)
#define NAME_LIST(t, buf) name_table_list(t, sizeof t / sizeof t[0], sizeof t[0], buf, sizeof buf)
#define NAME_NAMES(t, names) name_table_names(t, sizeof t / sizeof t[0], sizeof t[0], names)
/* Defines `const char *const *getter(void)`: the names of table t, NULL-terminated, derived
 * once (the including file includes <pthread.h>). */
#define NAME_NAMES_ONCE(t, getter)                                                             \
    static const char *getter##_list[sizeof t / sizeof t[0] + 1];                              \
    static pthread_once_t getter##_once = PTHREAD_ONCE_INIT;                                   \
    static void getter##_fill(void) { NAME_NAMES(t, getter##_list); }                          \
    const char *const *getter(void) {                                                          \
        pthread_once(&getter##_once, getter##_fill);                                           \
        return getter##_list;                                                                  \
    }

/* ---- checked arithmetic ---------------------------------------------------------------- */

static inline int mul_overflows(uint64_t a, uint64_t b, uint64_t *out) {
    return __builtin_mul_overflow(a, b, out);
}

#endif /* PARITY_INTERNAL_H */
