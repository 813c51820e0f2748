/* The library's allocations, in one place: overflow-checked sizes, a message on failure, and
 * a hook for tests that counts allocations and fails the Nth one (the SQLite way). */
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "alloc.h"
#include "errors.h"

static atomic_long alloc_count;      /* allocations attempted since the last reset */
static atomic_long alloc_fail_at;    /* fail the allocation with this count (0 = never) */
static _Atomic uint64_t alloc_bytes; /* bytes of the allocations that succeeded since then */

void px_alloc_test_reset(long fail_at) {
    atomic_store(&alloc_count, 0);
    atomic_store(&alloc_bytes, 0);
    atomic_store(&alloc_fail_at, fail_at);
}

long px_alloc_test_count(void) { return atomic_load(&alloc_count); }
uint64_t px_alloc_test_bytes(void) { return atomic_load(&alloc_bytes); }

/* Counts the bytes of an allocation that succeeded. */
static void *counted(void *p, uint64_t bytes) {
    if (p) atomic_fetch_add(&alloc_bytes, bytes);
    return p;
}

/* Counts an allocation; true if the test hook says this one fails. */
static int injected_failure(void) {
    long n = atomic_fetch_add(&alloc_count, 1) + 1;
    long at = atomic_load(&alloc_fail_at);
    return at > 0 && n == at;
}

void *px_malloc(size_t size, const char *what) {
    void *p = injected_failure() ? NULL : malloc(size ? size : 1);
    if (!p) set_error(PARITY_ERR_OUT_OF_MEMORY, "out of memory allocating %zu bytes for %s", size, what);
    return counted(p, size);
}

void *px_calloc(size_t n, size_t size, const char *what) {
    uint64_t total;
    if (mul_overflows(n, size, &total) || total > SIZE_MAX) {
        set_error(PARITY_ERR_OUT_OF_MEMORY, "size of %s overflows (%zu x %zu bytes)", what, n, size);
        return NULL;
    }
    void *p = injected_failure() ? NULL : calloc(n ? n : 1, size ? size : 1);
    if (!p) set_error(PARITY_ERR_OUT_OF_MEMORY, "out of memory allocating %zu x %zu bytes for %s", n, size, what);
    return counted(p, total);
}

void *px_aligned_alloc(size_t size, const char *what) {
    void *p = NULL;
    if (injected_failure() || posix_memalign(&p, 64, size ? size : 1) != 0) {
        set_error(PARITY_ERR_OUT_OF_MEMORY, "out of memory allocating %zu bytes for %s", size, what);
        return NULL;
    }
    return counted(p, size);
}

/* Weights are streamed from memory at every decode step, and the first call of a scorer
 * touches its logits (155 MB for a chunk of 256 rows of 151936) a few columns of every row at
 * a time: buffers of at least a huge page are aligned to one and advised MADV_HUGEPAGE, so
 * that the kernel can back them with 2 MB pages where transparent huge pages are enabled
 * (always or madvise). Fewer TLB misses and page faults: bench/gemm-bench --thp measures what
 * it gives the weights, parity-speed's "first calls" line what it gives a new scorer (DESIGN.md,
 * "Large buffers"). Where the advice is refused the buffer is an ordinary one. */
#define HUGE_PAGE (2u << 20)
void *px_huge_alloc(size_t size, const char *what) {
    if (size < HUGE_PAGE) return px_aligned_alloc(size, what);
    void *p = NULL;
    if (injected_failure() || posix_memalign(&p, HUGE_PAGE, size) != 0) {
        set_error(PARITY_ERR_OUT_OF_MEMORY, "out of memory allocating %zu bytes for %s", size, what);
        return NULL;
    }
#if defined(MADV_HUGEPAGE)
    (void)madvise(p, (size + HUGE_PAGE - 1) / HUGE_PAGE * HUGE_PAGE, MADV_HUGEPAGE);
#endif
    return counted(p, size);
}

void *px_realloc(void *p, size_t size, const char *what) {
    void *q = injected_failure() ? NULL : realloc(p, size ? size : 1);
    if (!q) set_error(PARITY_ERR_OUT_OF_MEMORY, "out of memory growing %s to %zu bytes", what, size);
    return counted(q, size); /* the new size: a test of growth counts it as allocated anew */
}

char *px_strdup(const char *s, const char *what) {
    size_t n = strlen(s) + 1;
    char *d = px_malloc(n, what);
    if (d) memcpy(d, s, n);
    return d;
}

void px_free(void *p) { free(p); }
