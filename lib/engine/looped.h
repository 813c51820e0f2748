/* The looped (Ouro) forward and its exit rules (looped.c). */
#ifndef PARITY_ENGINE_LOOPED_H
#define PARITY_ENGINE_LOOPED_H

#include <stddef.h>
#include <stdint.h>

#include "forward_types.h"
#include "parity.h"

/* forward() on a looped model: each row runs to its depth or until its exit rule fires, and
 * has its exit depth written to rows[r].depth; the logits read each row's output at its exit
 * loop. */
void forward_looped(const fwd_ctx *ctx, size_t n_rows, fwd_row *rows, size_t n_out,
                    const uint32_t *out_rows, float *logits);

/* A looped model's logits of loop `loop` (0-based) for the n_out rows out_rows of the last
 * forward, from ctx->loop_out: the head as forward() applies it at a row's exit loop. */
void forward_loop_logits(const fwd_ctx *ctx, uint32_t loop, size_t n_out,
                         const uint32_t *out_rows, float *logits);

/* ---- the exit rules (parity_sampling, parity_score_options) ---------------------------- */

/* The rule is defined, its values in range, and one the model can run (a gate for
 * PARITY_EXIT_THRESHOLD, a looped model for any but PARITY_EXIT_FULL). */
int exit_rule_check(const parity_config *c, uint32_t rule, float threshold, uint32_t min_depth,
                    uint32_t max_depth);
/* The rule in the forward's terms (0 depths resolved: 1 and the model's loops). */
fwd_exit exit_rule_resolve(const parity_config *c, float threshold, uint32_t min_depth,
                           uint32_t max_depth);
/* A row under the rule: PARITY_EXIT_THRESHOLD reads e, PARITY_EXIT_FIXED runs e->max_depth
 * loops, PARITY_EXIT_FULL every loop. */
fwd_row exit_rule_row(fwd_row row, uint32_t rule, const fwd_exit *e);

#endif /* PARITY_ENGINE_LOOPED_H */
