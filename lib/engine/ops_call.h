/* One call of a public kernel entry point (ops.c): the pool it runs on (the caller's, entered,
 * or a one-thread pool of its own), its scratch (the pool's, kept from call to call, or the
 * call's own) and the FP environment; shared by the entry points of ops.c and train_ops.c. */
#ifndef PARITY_ENGINE_OPS_CALL_H
#define PARITY_ENGINE_OPS_CALL_H

#include <stddef.h>
#include <stdint.h>

#include "base/threadpool.h"
#include "forward_types.h"
#include "parity_ops.h"

/* Room for the buffers of one call (a head on the bf16 backend takes 8, attention 8). */
#define OPS_MAX_SCRATCH 16

typedef struct op_call {
    parity_pool *user;      /* the caller's pool, entered; NULL if the call made its own */
    threadpool *pool;
    unsigned fp_saved;
    void *scratch[OPS_MAX_SCRATCH];  /* without a pool: the call's own buffers */
    size_t n_scratch;
} op_call;

/* Enters `pool` (PARITY_ERR_BUSY if another thread is in it) or makes a one-thread pool, and
 * sets the library's FP environment; op_end undoes both and frees the call's own scratch. */
int op_begin(op_call *c, parity_pool *pool, const char *fn);
void op_end(op_call *c);
/* n elements of `size` bytes, 64-byte aligned: the pool's next buffer (grown if too small) or
 * the call's own, freed by op_end; NULL (with the status set) if the size overflows or memory
 * is exhausted. */
void *op_alloc(op_call *c, uint64_t n, size_t size, const char *what);
/* The GEMM scratch of M rows of K columns (packed input, a weight panel per worker). */
int gemm_scratch_of(op_call *c, size_t M, size_t K, gemm_scratch *g);
/* The forward context of a kernel entry point over the call's pool and the given scratch. */
fwd_ctx op_ctx(const op_call *c, const parity_policy *pol, uint32_t backend,
               const parity_config *shape, fwd_scratch *s, struct kv_cache *kv);

#endif /* PARITY_ENGINE_OPS_CALL_H */
