/* Allocation: every allocation of the library goes through these, so that tests can count
 * them and fail the Nth one; and the checked arithmetic of sizes. */
#ifndef PARITY_BASE_ALLOC_H
#define PARITY_BASE_ALLOC_H

#include <stddef.h>
#include <stdint.h>

/* They set PARITY_ERR_OUT_OF_MEMORY with a message naming `what` when they fail. Sizes are
 * checked for overflow (n * size). */
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

/* a * b into *out; nonzero when the product overflows 64 bits. */
static inline int mul_overflows(uint64_t a, uint64_t b, uint64_t *out) {
    return __builtin_mul_overflow(a, b, out);
}

#endif /* PARITY_BASE_ALLOC_H */
