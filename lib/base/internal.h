/* The transition header of issue 49's re-housing: the base headers at once, for the files
 * not yet converted to include only what they need (base/ and engine/ are converted; they do
 * not include this), and the quantizer declarations that lib/quant/ will take into headers
 * of its own. Nothing here is API. */
#ifndef PARITY_INTERNAL_H
#define PARITY_INTERNAL_H

#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "parity.h"

#include "alloc.h"
#include "errors.h"
#include "floats.h"
#include "in_use.h"
#include "nametable.h"

/* ==== quantizer declarations (lib/quant/ defines them; the quant branch moves them) ==== */

/* fp32 -> E4M3 (formats.c), round to nearest even, saturating at +-448, NaN -> sign | 0x7f. */
uint8_t e4m3_from_f32_saturating(float x);
/* The quantizer's codes and scales of rows x cols values (quant.c), without argument checks:
 * block rules in blocks of block_rows x 128, scales the stored fp32 multipliers
 * [ceil(rows / block_rows)][ceil(cols / 128)]; MX rules in 1 x 32 blocks (block_rows
 * ignored), scales [rows][ceil(cols / 32)] the E8M0 values as fp32 powers of two. */
void fp8_quantize_rows(int quantizer, size_t rows, size_t cols, const float *x, size_t x_stride,
                       uint32_t block_rows, uint8_t *codes, size_t codes_stride, float *scales);

/* The gemm format (PARITY_GEMM_*) a quantizer belongs to, -1 for none; a format's name
 * ("fp8-block", ..., "ternary"), NULL for none (quant.c). */
int quant_format_of(int quantizer);
const char *quant_format_name(uint32_t gemm);
/* The 4-bit and ternary rules (quant_4bit_ternary.c). */
int quant_is_nvfp4(int quantizer);
int quant_is_mxfp4(int quantizer);
int quant_is_ternary(int quantizer);
/* Block width along K of a quantizer's scales: 128, 32, 16, or 0 (ternary: none). */
size_t quant_block_cols(int quantizer);
/* A weight's codes with a 4-bit or ternary rule, without argument checks: block_scales
 * [rows][ceil(cols / block)] as fp32 values (NVFP4: the E4M3 scales' values; MXFP4: the E8M0
 * powers of two; ternary: unused), *tensor_scale NVFP4's s2, ternary's s_w (0 for MXFP4). */
void quant4_weight(int quantizer, size_t rows, size_t cols, const float *x, size_t x_stride,
                   uint8_t *codes, size_t codes_stride, float *block_scales, float *tensor_scale);
/* One block of n <= 32 values of an NVFP4 (tensor_amax: the weight's amax, which sets s2) or
 * MXFP4 rule, as quant4_weight quantizes it: codes written, the block scale's value returned. */
float quant4_block(int quantizer, float tensor_amax, const float *x, size_t n, uint8_t *codes);
/* Activations, per token: block_scales as above, row_scales[r] NVFP4's s2 or ternary's s_x of
 * row r (unused for MXFP4). */
void quant4_activations(int quantizer, size_t rows, size_t cols, const float *x, size_t x_stride,
                        uint8_t *codes, size_t codes_stride, float *block_scales,
                        float *row_scales);
/* ==== end of the quantizer declarations ==== */

#endif /* PARITY_INTERNAL_H */
