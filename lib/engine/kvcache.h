/* The KV cache (kvcache.c): its cells in blocks, the offsets of a position's vectors, and the
 * store of a batch's keys and values. */
#ifndef PARITY_ENGINE_KVCACHE_H
#define PARITY_ENGINE_KVCACHE_H

#include <stddef.h>
#include <stdint.h>

#include "forward_types.h"
#include "parity.h"

/* ---- KV cache ---------------------------------------------------------------------------
 * Cells hold the K and V vectors of one position of one sequence, for every layer. Cells are
 * grouped in blocks of KV_BLOCK positions; a sequence owns a block table, and position p of
 * it lives in cell blocks[p / KV_BLOCK] * KV_BLOCK + p % KV_BLOCK. Within a layer, a block is
 * one contiguous run of KV_BLOCK * width elements laid out head by head: KV head h's vectors
 * of the block's KV_BLOCK positions follow each other (KV_BLOCK * head_dim elements), so
 * attention streams each head's keys and values in runs of KV_BLOCK vectors, and copying a
 * block is one memcpy per layer. K is stored after q/k-norm and RoPE. Values are bf16 (exact:
 * the forward rounded them), or fp32 cells under PARITY_COMPUTE_FP32 and PARITY_COMPUTE_FP16
 * (kv_cells_fp32). */
#define KV_BLOCK 16

typedef struct kv_cache {
    uint32_t n_layers, n_cells, width;  /* n_layers: planes (config_kv_planes: a looped model
                                           has one per loop and layer); width =
                                           num_key_value_heads * head_dim */
    uint32_t head_dim;
    int fp32;
    void *k, *v;                        /* [n_layers][n_cells / KV_BLOCK][kv heads][KV_BLOCK][head_dim] */
} kv_cache;

/* Whether a policy's KV cache cells are fp32: under PARITY_COMPUTE_FP32, and under
 * PARITY_COMPUTE_FP16, whose fp16 keys and values are held in fp32 cells (exact; twice the
 * bytes of a 16-bit cell). bf16 cells otherwise. */
static inline int kv_cells_fp32(const parity_policy *pol) {
    return pol->compute != PARITY_COMPUTE_BF16;
}
uint64_t kv_cache_bytes(const parity_config *c, uint32_t n_cells, int fp32);
/* prefault: every page written (zeros) now rather than at a step's first store into it */
int kv_cache_init(kv_cache *kv, const parity_config *c, uint32_t n_cells, int fp32, int prefault);
void kv_cache_free(kv_cache *kv);

static inline size_t kv_cell(const uint32_t *blocks, uint32_t pos) {
    return (size_t)blocks[pos / KV_BLOCK] * KV_BLOCK + pos % KV_BLOCK;
}

/* The element offset in K or V of KV head `head`'s vector at position pos of a sequence with
 * block table `blocks`, in layer `layer`. The next positions of the same block follow at
 * strides of head_dim elements. */
static inline size_t kv_offset(const kv_cache *kv, uint32_t layer, const uint32_t *blocks,
                               uint32_t pos, size_t head) {
    const size_t block = blocks[pos / KV_BLOCK], slot = pos % KV_BLOCK;
    return ((size_t)layer * kv->n_cells + block * KV_BLOCK) * kv->width +
           (head * KV_BLOCK + slot) * kv->head_dim;
}

/* The K and V vectors of the rows (k, v: [n_rows][kv heads * head_dim], rows k_stride and
 * v_stride apart) into the cache of `layer` at the rows' positions: fp32 as they are, or
 * bf16 (round to nearest even: exact for the bf16 values the forward passes). */
void kv_store(const fwd_ctx *ctx, uint32_t layer, size_t n_rows, const fwd_row *rows,
              const float *k, size_t k_stride, const float *v, size_t v_stride);

#endif /* PARITY_ENGINE_KVCACHE_H */
