/* RoPE (rope.c): the model's cos/sin tables (rope_tables) for a config, and the two building
 * blocks they share with the public region API (parity_rope, regions.c), so that the two cannot
 * drift apart. DESIGN.md section 3 defines them. */
#ifndef PARITY_ROPE_H
#define PARITY_ROPE_H

#include <stdint.h>

#include "parity.h"

/* RoPE tables for positions 0 .. n_positions-1, hd/2 frequencies each. */
typedef struct rope_tables {
    uint32_t n_positions, half;
    float *cos_f32, *sin_f32;      /* [n_positions][half] fp32 */
    float *cos_bf16, *sin_bf16;    /* the same rounded to bf16 (held in fp32) */
    float *cos_fp16, *sin_fp16;    /* the same rounded to fp16 (held in fp32) */
} rope_tables;

/* Default RoPE's inverse frequencies, as transformers' _compute_default_rope_parameters:
 * inv_freq[i] = 1 / base^(2i / dim) for i < dim / 2, base the fp32 theta, the exponent and
 * the reciprocal in fp32, the power evaluated in double and rounded to fp32. */
void rope_default_inv_freq(float base, uint32_t dim, float *inv_freq);

/* cos/sin of position `pos` for `half` frequencies: angle = (float)pos * inv_freq[i] in fp32,
 * cos and sin of that angle evaluated in double and rounded to fp32, times
 * attention_factor (an fp32 multiply, skipped when it is 1). */
void rope_cos_sin(const float *inv_freq, uint32_t half, uint32_t pos, float attention_factor,
                  float *cos_out, float *sin_out);

/* inv_freq and attention factor for a config (rope_type, scaling), as transformers'
 * modeling_rope_utils computes them, in fp32. inv_freq has head_dim/2 values. */
int rope_inv_freq(const parity_config *c, float *inv_freq, float *attention_factor);
/* Fills the tables: angle = (float)pos * inv_freq[i] (fp32), cos/sin evaluated in double
 * on that fp32 angle and rounded to fp32, times attention_factor (fp32 multiply, skipped
 * when 1). */
int rope_tables_build(const parity_config *c, uint32_t n_positions, rope_tables *t);
void rope_tables_free(rope_tables *t);

#endif /* PARITY_ROPE_H */
