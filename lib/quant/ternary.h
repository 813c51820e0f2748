/*
 * The ternary format's quantization (ternary.c): weights -1, 0, 1 under one tensor scale s_w,
 * activations int8 under one scale s_x per row; the entries of its format row (format.h).
 */
#ifndef PARITY_QUANT_TERNARY_H
#define PARITY_QUANT_TERNARY_H

#include "format.h"

/* The entries (quant_fn): codes as two's complement int8; no block scales (block_scales is
 * not touched); the weight's s_w, the activations' s_x per row. */
quant_fn ternary_quantize_weight, ternary_quantize_activations;

#endif /* PARITY_QUANT_TERNARY_H */
