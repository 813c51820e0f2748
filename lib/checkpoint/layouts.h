/* The list of checkpoint layouts (lib/checkpoint/layouts.c): every row, and the lookups of
 * loading and saving. */
#ifndef PARITY_LAYOUTS_H
#define PARITY_LAYOUTS_H

#include "layout.h"

extern const checkpoint_layout layout_bf16, layout_fp16, layout_fp32, layout_fp8_block,
    layout_bitnet, layout_nvfp4, layout_mxfp4;

/* The layout that reads checkpoints of a quantization method (NULL for QUANT_METHOD_NONE). */
const checkpoint_layout *layout_of_method(int method);
/* "NAME" or "NAME:RULE" (NULL: "bf16") -> the layout and the rule (-1 when none is named);
 * PARITY_ERR_INVALID_ARGUMENT naming every layout for another name. */
int layout_parse(const char *spec, const checkpoint_layout **layout, int *rule);
/* Whether a layout quantizes the linear weights (a row with an importer). */
static inline int layout_quantizes(const checkpoint_layout *l) { return l->import != NULL; }

#endif
