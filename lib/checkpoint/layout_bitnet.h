/* What the BitNet layout (lib/checkpoint/layout_bitnet.c) offers besides its row: the packing
 * of ternary codes. */
#ifndef PARITY_LAYOUT_BITNET_H
#define PARITY_LAYOUT_BITNET_H

#include <stdint.h>

/* A ternary weight's codes as the model holds them ([rows] rows of quant_weight_row_bytes,
 * quant_weight.h) into transformers' pack_weights layout [ceil(rows/4)][cols]. */
void ternary_pack(const uint8_t *held, uint32_t rows, uint32_t cols, uint8_t *packed);

#endif
