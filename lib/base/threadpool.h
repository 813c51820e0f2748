/* A fixed pool of worker threads for parallel loops. The calling thread is worker 0; the
 * pool starts n-1 threads once, at creation, and never per call. A loop's tasks [0, n_tasks)
 * are split into contiguous static ranges, one per worker (pool_run), or handed out in
 * chunks to whichever worker is free (pool_run_dynamic); which worker computes a task never
 * matters to the result: tasks must be independent (no task reduces into another's output),
 * and fn may be called several times per worker. */
#ifndef PARITY_THREADPOOL_H
#define PARITY_THREADPOOL_H

#include <stddef.h>
#include <stdint.h>

typedef struct threadpool threadpool;

/* fn computes tasks [begin, end) as worker `worker` (0 .. n_workers-1). */
typedef void (*pool_fn)(void *ctx, size_t begin, size_t end, unsigned worker);

int pool_create(unsigned n_workers, threadpool **out);
void pool_free(threadpool *p);
/* The bytes pool_create(n_workers) allocates (the per-worker start arguments included: each
 * worker frees its own once it has started). */
uint64_t pool_bytes(unsigned n_workers);
unsigned pool_size(const threadpool *p);
/* Runs fn over [0, n_tasks) on all workers and returns when every task is done. */
void pool_run(threadpool *p, pool_fn fn, void *ctx, size_t n_tasks);
/* The same with tasks taken `chunk` at a time by whichever worker comes first: for loops
 * whose workers may run at different speeds, at the price of an atomic per chunk. */
void pool_run_dynamic(threadpool *p, pool_fn fn, void *ctx, size_t n_tasks, size_t chunk);

/* Timing of the pool's own cost (for a profile): when on, each loop adds its wall time less
 * its slowest worker's time in fn to *overhead_s, and counts itself in *loops. Switching it
 * zeroes both. Off (the default) reads no clock. */
void pool_set_timing(threadpool *p, int on);
void pool_timing(const threadpool *p, double *overhead_s, uint64_t *loops);

/* Sets the calling thread's floating-point environment to IEEE defaults (round to nearest,
 * no flush-to-zero, no denormals-are-zero) and returns what it was, for fp_env_restore:
 * a host that runs with FTZ/DAZ must not change libparity's results. */
unsigned fp_env_enter(void);
void fp_env_restore(unsigned saved);

#endif
