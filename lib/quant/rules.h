/*
 * The table of quantized formats and their quantizer rules (the row types are format.h's):
 * the lookups every "which rule is this" question in lib/ goes through, the scale grid, and
 * the argument checks the public quantize calls share. A new format is a format row, its rule
 * rows (rules.c) and one file with its quantize entries (as fp8.c, nvfp4.c, mxfp4.c,
 * ternary.c), its public call in quantize_api.c, and its tests.
 */
#ifndef PARITY_QUANT_RULES_H
#define PARITY_QUANT_RULES_H

#include <stddef.h>
#include <stdint.h>

#include "format.h"

/* The row of a quantizer, NULL for a value that is none. */
const quant_rule *quant_rule_of(int quantizer);
/* The row of a gemm format, NULL for PARITY_GEMM_BF16 and other values. */
const quant_format *quant_format_row(uint32_t gemm);
/* The gemm format (PARITY_GEMM_*) a quantizer belongs to, -1 for none; a format's name
 * ("fp8-block", ..., "ternary"), NULL for none. */
int quant_format_of(int quantizer);
const char *quant_format_name(uint32_t gemm);
/* The entries that run on the current CPU path for format f (format.h says which variant): the
 * activation quantizer and the GEMM's column kernel. */
quant_fn *quant_rows_entry(const quant_format *f);
quant_gemm_fn *quant_gemm_entry(const quant_format *f);
/* Format f's SIMD variant v (QUANT_SIMD_*) if this build and CPU can run it, NULL otherwise;
 * its entries may be NULL (the format has no such variant). The tests walk them. */
const quant_simd *quant_simd_variant(const quant_format *f, int v);

/* The number of block scales of a rows x cols weight: ceil(rows / block_rows) x ceil(cols /
 * block_cols), 1 for a format without blocks. */
uint64_t quant_scale_count(const quant_format *f, uint64_t rows, uint64_t cols);

/* ---- argument checks of the public quantize calls (rules.c) --------------------------------
 * Each sets the message, prefixed with the function's name fn, and returns the status. */

/* The quantizer is one of format `gemm`'s rules (PARITY_ERR_POLICY naming them if not). */
int quant_check_rule(const char *fn, int quantizer, uint32_t gemm);
/* x, codes and the scale buffers not NULL (`scales_name` names them in the message), a
 * rows x cols shape of at least one value, strides of at least cols, every value finite. */
int quant_check_values(const char *fn, size_t rows, size_t cols, const float *x, size_t x_stride,
                       const void *codes, size_t codes_stride, const void *block_scales,
                       const void *tensor_scales, const char *scales_name);
/* The checks of a public quantize call, after clearing the error: quant_check_rule, per_row 0
 * (one tensor scale) or 1 (one per row) unless the call has none (per_row < 0), then
 * quant_check_values. */
int quant_check_call(const char *fn, int quantizer, uint32_t gemm, int per_row, size_t rows,
                     size_t cols, const float *x, size_t x_stride, const void *codes,
                     size_t codes_stride, const void *block_scales, const void *tensor_scales,
                     const char *scales_name);

#endif /* PARITY_QUANT_RULES_H */
