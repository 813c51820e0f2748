/* The part of the NVFP4 and MXFP4 checkpoint layouts they share (lib/checkpoint/fp4_packed.c):
 * packed E2M1 codes, their block scales' grid, the dequantized values, and a save's entries. */
#ifndef PARITY_FP4_PACKED_H
#define PARITY_FP4_PACKED_H

#include <stdint.h>
#include <stdio.h>

#include "layout.h"

/* A model's held codes, two a byte (quant_weight.h: [rows][ceil(cols / 2)], low nibble the
 * even column, as NVFP4 files hold them), into rows of packed_cols bytes, zero past each held
 * row: MXFP4's [rows][ceil(cols / 32)][16] with each 32-block's padding zero. */
void fp4_pad_rows(const uint8_t *held, uint32_t rows, uint32_t cols, uint64_t packed_cols,
                  uint8_t *packed);

/* Packed codes [rows][packed_cols] of a slot ([rows][packed_cols / 16][16] with blocks_3d):
 * U8, the shape, zero padding; `layout` for messages. */
int fp4_check_packed(const tensor_source *codes, const expected *slot, uint64_t packed_cols,
                     int blocks_3d, const char *layout);
/* What a layout's block scales are, for their checks and messages. */
typedef struct fp4_scales {
    unsigned block;         /* 1 x block elements a scale */
    uint32_t dtype;         /* their tensor_source dtype */
    const char *suffix;     /* their name: "<weight><suffix>" */
    const char *stored;     /* how they are stored: "F8_E4M3", "E8M0 as U8" */
    const char *missing;    /* the message's words when they are missing */
    const char *dtype_doc;  /* the message's words for another dtype */
} fp4_scales;
/* The block scales s of the codes (s NULL: PARITY_ERR_SCALE_MISSING): the dtype, the grid
 * [rows][ceil(cols / block)], data. */
int fp4_check_scales(const tensor_source *codes, const tensor_source *s, const expected *slot,
                     const fp4_scales *want);
/* The checked codes as the model holds them (two a byte, the rows copied into a new buffer,
 * or the mapped file's in place, codes_mapped, where its rows are as long) and the bytes of
 * `scales` (checked by fp4_check_scales) as scale_codes, the mapped file's in place
 * (scales_mapped) or copied; a value e2m1 * scale_of(byte) (times tensor_scale
 * unless 0) beyond bf16's range fails naming the element, nothing left allocated. The values
 * are not kept: shipped_dequantize makes them when a reader asks. */
int fp4_values(const tensor_source *codes, const expected *slot, uint64_t packed_cols,
               uint64_t block, float tensor_scale, const tensor_source *scales,
               float (*scale_of)(uint8_t), shipped_values *out);
/* A save's codes entry v of w and its block scales' entry sc (dtype scale_dtype, named
 * "<weight><scale_suffix>"): the shipped codes of format `gemm`, or those `rule` makes. */
int fp4_plan(const weight *w, int gemm, int rule, uint64_t block, const char *layout_name,
             const char *scale_dtype, const char *scale_suffix, saved_tensor *v, saved_tensor *sc);
/* The bytes of a codes entry (packed) or a scales entry (the held scale bytes). */
int fp4_write(FILE *fp, const saved_tensor *t);

#endif
