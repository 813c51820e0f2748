/* Causal attention over the KV cache (attention.c), and the size of its per-worker scratch. */
#ifndef PARITY_ENGINE_ATTENTION_H
#define PARITY_ENGINE_ATTENTION_H

#include <stddef.h>
#include <stdint.h>

#include "forward_types.h"
#include "kvcache.h"

/* Rows per attention task: a prefill's rows of one sequence share each block of keys and
 * values; a worker's attention scratch holds that many rows' scores, queries and
 * accumulators. */
#define ATTN_TASK_ROWS 16
static inline size_t attn_pv_floats(size_t group, size_t head_dim) {
    const size_t slots = ATTN_TASK_ROWS * group;
    /* + the queries packed as bf16 (half a float each), 64-byte aligned */
    return 2 * slots * head_dim + slots + 2 * KV_BLOCK * head_dim + (slots * head_dim + 1) / 2 + 16;
}


/* ---- attention (attention.c) ----------------------------------------------------------
 * For every row and head: causal attention over the row's positions 0..pos from the cache
 * of `layer`, per policy->attention; q [n_rows][heads*hd] -> att [n_rows][heads*hd]. */
void attention(const fwd_ctx *ctx, uint32_t layer, size_t n_rows, const fwd_row *rows,
               const float *q, float *att);

#endif /* PARITY_ENGINE_ATTENTION_H */
