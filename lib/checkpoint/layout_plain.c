/* The plain checkpoint layouts (rows of layout.h): every weight's values, in BF16, F16 or F32;
 * no quantization_config. They load through the same code as a quantized checkpoint's
 * unquantized tensors (load.c) and save values only (save.c), so a row is its name and dtype. */
#include "layout.h"

const checkpoint_layout layout_bf16 = {.name = "bf16", .gemm = PARITY_GEMM_BF16,
                                       .values_dtype = "BF16"};
const checkpoint_layout layout_fp16 = {.name = "fp16", .gemm = PARITY_GEMM_BF16,
                                       .values_dtype = "F16"};
const checkpoint_layout layout_fp32 = {.name = "fp32", .gemm = PARITY_GEMM_BF16,
                                       .values_dtype = "F32"};
