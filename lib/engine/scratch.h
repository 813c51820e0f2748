/* The forward's scratch (scratch.c): its size for a model and a batch, its buffers. */
#ifndef PARITY_ENGINE_SCRATCH_H
#define PARITY_ENGINE_SCRATCH_H

#include <stdint.h>

#include "forward_types.h"
#include "parity.h"

/* Scratch for batches of up to max_rows rows and contexts up to max_ctx positions (the
 * buffers: forward_types.h). */
uint64_t fwd_scratch_bytes(const parity_config *c, uint32_t max_rows, uint32_t max_ctx,
                           unsigned n_workers, int split_k);
int fwd_scratch_init(fwd_scratch *s, const parity_config *c, uint32_t max_rows,
                     uint32_t max_ctx, unsigned n_workers, int split_k, int prefault);
void fwd_scratch_free(fwd_scratch *s);

#endif /* PARITY_ENGINE_SCRATCH_H */
