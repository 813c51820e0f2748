/* RoPE's two building blocks (rope.c), shared by the forward's tables (rope_tables_build,
 * model.h) and the public region API (parity_rope, regions.c), so that the two cannot drift
 * apart. DESIGN.md section 3 defines them. */
#ifndef PARITY_ROPE_H
#define PARITY_ROPE_H

#include <stdint.h>

/* Default RoPE's inverse frequencies, as transformers' _compute_default_rope_parameters:
 * inv_freq[i] = 1 / base^(2i / dim) for i < dim / 2, base the fp32 theta, the exponent and
 * the reciprocal in fp32, the power evaluated in double and rounded to fp32. */
void rope_default_inv_freq(float base, uint32_t dim, float *inv_freq);

/* cos/sin of position `pos` for `half` frequencies: angle = (float)pos * inv_freq[i] in fp32,
 * cos and sin of that angle evaluated in double and rounded to fp32, times
 * attention_factor (an fp32 multiply, skipped when it is 1). */
void rope_cos_sin(const float *inv_freq, uint32_t half, uint32_t pos, float attention_factor,
                  float *cos_out, float *sin_out);

#endif /* PARITY_ROPE_H */
