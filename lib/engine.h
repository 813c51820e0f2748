/* The engine under the scorer and the sampler: the thread pool, the KV cache, the forward's
 * scratch, the rows of a batch, the logits, the per-worker work buffers and the busy flag.
 * The scorer and the sampler embed one and add their own tables to it; every byte that
 * either allocates at creation is listed in one table (engine_layout), from which both the
 * reported size (engine_bytes, parity_scorer_bytes, parity_sampler_bytes, the max_memory
 * check) and the allocations (engine_init) are made, so the two cannot disagree. */
#ifndef PARITY_ENGINE_H
#define PARITY_ENGINE_H

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include "forward.h"

/* What sizes an engine (every field resolved: no zeros meaning "default"). */
typedef struct engine_params {
    uint32_t n_threads;    /* workers of the pool, the calling thread included (>= 1) */
    uint32_t backend;      /* parity_backend */
    parity_policy policy;
    uint32_t kv_cells;     /* positions of the KV cache */
    uint32_t max_rows;     /* rows of one forward */
    uint32_t max_ctx;      /* the longest context one row attends to */
    uint32_t split_k;      /* > 1: the scratch holds split-K partial sums */
} engine_params;

/* A buffer of `count` elements of `size` bytes at *p: zeroed, or 64-byte aligned and not
 * initialised. The engine's own buffers and those of the object that embeds it. */
typedef struct engine_buf {
    void **p;
    uint64_t count, size;
    int aligned;
    const char *what;
} engine_buf;

#define ENGINE_MAX_BUFS 16

typedef struct engine {
    const parity_model *model;
    engine_params p;
    threadpool *pool;
    kv_cache kv;
    fwd_scratch scratch;
    fwd_row *rows;         /* [max_rows] */
    uint32_t *out_rows;    /* [max_rows] rows of a forward whose logits are wanted */
    float *logits;         /* [max_rows][vocab] */
    float *work;           /* [n_threads][3 * vocab]: a dist_work per worker */
    engine_buf bufs[ENGINE_MAX_BUFS];  /* the table engine_init allocated, freed by engine_free */
    size_t n_bufs;
    atomic_int in_use;     /* set while a public call runs (object_enter) */
} engine;

/* The settings every engine takes: the policy, the backend, the thread count (1..256). */
int engine_check(const parity_policy *pol, uint32_t backend, uint32_t n_threads);

/* The bytes that creating an object of `object_size` bytes that embeds an engine with these
 * params and `n_extra` buffers of its own allocates: the object, the pool, the KV cache, the
 * scratch, and every buffer of the table. The model's weights are not included (fp32 copies
 * that a policy or backend needs belong to the model: engine_prepare_weights). */
uint64_t engine_bytes(const parity_config *c, const engine_params *p, size_t object_size,
                      const engine_buf *extra, size_t n_extra);

/* PARITY_ERR_MEMORY_LIMIT, with `bytes` and `detail` in the message, if max_memory is set
 * and `bytes` exceed it. `what` is "scorer" or "sampler". */
int engine_check_memory(const char *what, uint64_t bytes, uint64_t max_memory, const char *detail);

/* Builds, once per model, the fp32 weights a policy and backend read (the openblas backend
 * and the fp32 policy multiply fp32 weights). */
int engine_prepare_weights(const parity_model *m, const parity_policy *pol, uint32_t backend);

/* Allocates the engine and the extra buffers (all or nothing: on failure everything is freed
 * and the pointers are NULL). `e` lives inside the object the extra pointers point into. */
int engine_init(engine *e, const parity_model *m, const engine_params *p, const engine_buf *extra,
                size_t n_extra);
/* Frees what engine_init allocated (harmless on a zeroed or failed engine). */
void engine_free(engine *e);

/* The forward's context on this engine, with the contract's summation orders. */
fwd_ctx engine_fwd_ctx(engine *e);

#endif
