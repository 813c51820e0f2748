/*
 * NVFP4's quantization (nvfp4.c): E2M1 codes, E4M3 block scales, an fp32 tensor scale s2; the
 * entries of its format row (format.h) and the forms the public call and the export check use.
 */
#ifndef PARITY_QUANT_NVFP4_H
#define PARITY_QUANT_NVFP4_H

#include "e2m1_simd.h"
#include "format.h"

/* The entries (quant_fn): block scales as the E4M3 values they mean; a weight's s2 from the
 * tensor's amax, activations' per row. */
quant_fn nvfp4_quantize_weight, nvfp4_quantize_activations;
/* One block of n <= 16 values as nvfp4_quantize_weight quantizes it for a weight whose amax is
 * tensor_amax: codes written, the block scale's value returned. */
float nvfp4_quantize_block(const quant_rule *r, float tensor_amax, const float *x, size_t n,
                           uint8_t *codes);
/* The public call's form: block scales as E4M3 bytes, one s2 (per_row 0) or one per row. */
void nvfp4_quantize_bytes(const quant_rule *r, int per_row, size_t rows, size_t cols,
                          const float *x, size_t x_stride, uint8_t *codes, size_t codes_stride,
                          uint8_t *block_scales, float *tensor_scales);

/* The SIMD variants of the format row (rules.c): e2m1_simd.h's. */
#define NVFP4_SIMD E2M1_SIMD(NULL, NULL)

#endif /* PARITY_QUANT_NVFP4_H */
