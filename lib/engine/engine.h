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

#include "base/threadpool.h"
#include "forward_types.h"
#include "kvcache.h"
#include "sampling.h"

/* What sizes an engine (every field resolved: no zeros meaning "default"). */
typedef struct engine_params {
    uint32_t n_threads;    /* workers of the pool, the calling thread included (>= 1) */
    uint32_t backend;      /* parity_backend */
    parity_policy policy;
    uint32_t kv_cells;     /* positions of the KV cache */
    uint32_t max_rows;     /* rows of one forward */
    uint32_t max_ctx;      /* the longest context one row attends to */
    uint32_t split_k;      /* > 1: the scratch holds split-K partial sums */
    uint64_t max_memory;   /* the caller's ceiling on the bytes creation allocates; 0 = none */
    uint32_t works;        /* dist_works per worker: 1, or DIST_DRAW_ROWS for the sampler,
                            * which draws that many rows together */
    uint32_t prefault;     /* write every page of the KV cache, the scratch and the buffers
                            * at creation */
} engine_params;

/* A buffer of `count` elements of `size` bytes at *p: zeroed, or (`large`) not initialised,
 * 64-byte aligned and, from 2 MB, in huge pages where the OS gives them (px_huge_alloc). The
 * engine's own buffers and those of the object that embeds it. */
typedef struct engine_buf {
    void **p;
    uint64_t count, size;
    int large;
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
    float *work;           /* [n_threads][p.works][dist_work_floats(vocab)]: a worker's dist_works */
    engine_buf bufs[ENGINE_MAX_BUFS];  /* the table engine_init allocated, freed by engine_free */
    size_t n_bufs;
    atomic_int in_use;     /* set while a public call runs (object_enter) */
    int profiling;         /* parity_*_set_profiling */
    fwd_profile prof;
} engine;

/* Profiling, the public calls of both kinds (parity_sampler_set_profiling, ...;
 * `what`: "sampler", "scorer"; e NULL for a NULL object): on or off, the counters zeroed;
 * and the counters as a parity_profile (size checked). A public call that is profiled counts
 * itself through engine_enter / engine_leave. */
int engine_set_profiling(engine *e, const char *what, int on);
int engine_profile(const engine *e, const char *what, parity_profile *out);

/* The defaults of the settings every engine takes: one thread, the bf16 backend, the
 * "aligned" policy. */
void engine_default_settings(uint32_t *n_threads, uint32_t *backend, parity_policy *policy);
/* The settings every engine takes: the policy, the backend, the thread count (1..256). */
int engine_check(const parity_policy *pol, uint32_t backend, uint32_t n_threads);

/* The bytes that creating an object of `object_size` bytes that embeds an engine with these
 * params and `n_extra` buffers of its own allocates: the object, the pool, the KV cache, the
 * scratch, and every buffer of the table. The model's weights are not included (fp32 copies
 * that a policy or backend needs belong to the model: engine_prepare_weights). */
uint64_t engine_bytes(const parity_config *c, const engine_params *p, size_t object_size,
                      const engine_buf *extra, size_t n_extra);


/* The copies of the weights a policy and backend read beside the bf16 values (MODEL_NEED_*):
 * the fp16 values under fp16, the fp32 ones under fp32 and on the openblas backend. */
int engine_weight_needs(const parity_policy *pol, uint32_t backend);

/* Builds, once per model, the copies of the weights a policy and backend read: the values of
 * shipped codes (unless the policy's GEMM reads the codes, bf16 compute), the fp32 weights
 * (the openblas backend and the fp32 policy multiply them), the fp16 ones, the quantized. */
int engine_prepare_weights(const parity_model *m, const parity_policy *pol, uint32_t backend);

/* Allocates the engine and the extra buffers (all or nothing: on failure everything is freed
 * and the pointers are NULL). `e` lives inside the object the extra pointers point into. */
int engine_init(engine *e, const parity_model *m, const engine_params *p, const engine_buf *extra,
                size_t n_extra);
/* Frees what engine_init allocated (harmless on a zeroed or failed engine). */
void engine_free(engine *e);

/* A public call on an object takes its engine (PARITY_ERR_INVALID_ARGUMENT if the object is
 * NULL: pass `object ? &object->eng : NULL`; PARITY_ERR_BUSY if another call has it) and
 * gives it back when it returns, its status passing through engine_leave. A profiled call
 * passes t0, which engine_enter sets to its start time and engine_leave reads to count the
 * call; a call that is not profiled passes NULL to both. ENGINE_CALL is that whole body. */
int engine_enter(engine *e, const char *what, double *t0);
int engine_leave(engine *e, const double *t0, int status);

/* The body of a public call on `obj` (a scorer or sampler, named `what` in messages): clears
 * the message, takes obj's engine, returns the status of `call` (an internal function of obj)
 * through engine_leave; profiled when `timed`, not when 0:
 *     int parity_sampler_step(parity_sampler *s, ...) {
 *         ENGINE_CALL(s, "sampler", 1, sampler_step(s, ...));
 *     } */
#define ENGINE_CALL(obj, what, timed, call)                                         \
    do {                                                                            \
        clear_error();                                                              \
        double engine_t0_;                                                          \
        TRY(engine_enter((obj) ? &(obj)->eng : NULL, what, (timed) ? &engine_t0_ : NULL)); \
        return engine_leave(&(obj)->eng, (timed) ? &engine_t0_ : NULL, call);        \
    } while (0)

/* Worker `worker`'s share `slot` (< p.works) of the work buffer: what lib/sampling.c needs to
 * build one position's distribution. */
static inline dist_work engine_work(const engine *e, unsigned worker, unsigned slot) {
    const size_t V = e->model->config.vocab_size;
    return dist_work_at(e->work + ((size_t)worker * e->p.works + slot) * dist_work_floats(V), V);
}

/* The forward's context on this engine, with the contract's summation orders. */
fwd_ctx engine_fwd_ctx(engine *e);

/* ---- objects on an engine: the scorer and the sampler ----------------------------------- */

/* What an object that embeds an engine tells it, so that both are sized and created in one
 * way: the public *_bytes and *_create functions are engine_object_bytes/_create. */
typedef struct engine_kind {
    const char *name;          /* "scorer", "sampler": for messages */
    size_t object_size;        /* sizeof the object */
    size_t engine_offset;      /* offsetof(object, its engine) */
    size_t params_offset;      /* offsetof(object, its resolved params) */
    size_t params_size;        /* sizeof its params struct (whose first field is `size`) */
    void *layout;              /* an object of the kind, only for the addresses of its fields
                                  (sizing without creating): never read or written */
    /* Checks the caller's params and fills `resolved` (params_size bytes) with every default
     * applied, and the engine they make. */
    int (*resolve)(const parity_model *m, const void *params, void *resolved, engine_params *ep);
    /* The object's own buffers, pointing into `object`, for a model of config c. */
    size_t (*bufs)(void *object, const parity_config *c, const void *resolved,
                   const engine_params *ep, engine_buf *b);
    /* The sizes a PARITY_ERR_MEMORY_LIMIT message names. */
    void (*describe)(const void *resolved, char *buf, size_t size);
    /* Sets the object up once its buffers exist (its resolved params are in place). */
    void (*start)(void *object, const parity_model *m);
} engine_kind;

/* The bytes engine_object_create would allocate. */
int engine_object_bytes(const engine_kind *k, const parity_model *m, const void *params,
                        uint64_t *bytes);
/* Checks the params, the memory ceiling (before anything is allocated), prepares the model's
 * fp32 weights if the policy or backend reads them, and allocates the object, its engine and
 * its buffers, all or nothing. `out` points to the caller's object pointer (a parity_scorer *
 * or parity_sampler *), written only on success. */
int engine_object_create(const engine_kind *k, const parity_model *m, const void *params,
                         void *out);
/* Frees an object made by engine_object_create (NULL: nothing). */
void engine_object_free(const engine_kind *k, void *object);

#endif
