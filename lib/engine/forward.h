/* The one forward pass, shared by the scorer (learner) and the sampler (forward.c). */
#ifndef PARITY_ENGINE_FORWARD_H
#define PARITY_ENGINE_FORWARD_H

#include <stddef.h>
#include <stdint.h>

#include "forward_types.h"

/* Runs the rows through the model, writing their K/V to the cache. For the n_out rows listed
 * in out_rows (indices into rows, ascending), writes the logits to logits[n_out][vocab]
 * (rounded to bf16 unless the policy keeps an fp32 head). n_rows <= s->max_rows. A looped
 * model's rows run to their depth or exit rule and have their exit depth written to
 * rows[r].depth (forward_looped). */
void forward(const fwd_ctx *ctx, size_t n_rows, fwd_row *rows, size_t n_out,
             const uint32_t *out_rows, float *logits);

#endif /* PARITY_ENGINE_FORWARD_H */
