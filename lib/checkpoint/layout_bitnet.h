/* What the BitNet layout (lib/checkpoint/layout_bitnet.c) offers besides its row: the packing
 * of ternary codes. */
#ifndef PARITY_LAYOUT_BITNET_H
#define PARITY_LAYOUT_BITNET_H

#include <stdint.h>

/* int8 ternary codes [rows][cols] into transformers' pack_weights layout [ceil(rows/4)][cols]. */
void ternary_pack(const uint8_t *codes, uint32_t rows, uint32_t cols, uint8_t *packed);

#endif
