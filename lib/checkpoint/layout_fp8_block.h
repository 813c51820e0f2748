/* What the block-FP8 layout (lib/checkpoint/layout_fp8_block.c) offers besides its row: the
 * import of shipped codes and scales, which a weight update also uses (engine/update.c). */
#ifndef PARITY_LAYOUT_FP8_BLOCK_H
#define PARITY_LAYOUT_FP8_BLOCK_H

#include "layout.h"

/* The checks of shipped codes (F8_E4M3, the slot's shape, no NaN code, dequantized values
 * within bf16's range) and scales (scales NULL: PARITY_ERR_SCALE_MISSING; F32/BF16; the block
 * grid; finite, positive, powers of two if ue8m0), then the codes and fp32 scales into new
 * buffers (nothing left allocated on failure); no values (shipped_dequantize makes them). */
int shipped_import(const tensor_source *codes, const tensor_source *scales, const expected *slot,
                   int ue8m0, shipped_values *out);

#endif
