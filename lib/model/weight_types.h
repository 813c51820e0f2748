/* The types of a weight tensor as the model holds it (weight: its values in each precision,
 * quant_weight: a quantized copy; expected: a tensor's entry in the model's table) and the
 * inline accessors that pick the values or copy a policy reads (quant_weight itself is
 * lib/quant/quant_weight.h's). Types only: no module's functions are declared here. */
#ifndef PARITY_MODEL_WEIGHT_TYPES_H
#define PARITY_MODEL_WEIGHT_TYPES_H

#include <stdint.h>

#include "parity.h"
#include "quant/format.h"
#include "quant/quant_weight.h"

/* One weight tensor: rows x cols (a vector has rows = 1). */
typedef struct weight {
    uint32_t rows, cols;
    const uint16_t *bf16;  /* bf16 values [rows][cols]: mapped from a BF16 checkpoint, or owned
                              (RNE cast of F16/F32, or synthetic, or a shipped weight's
                              dequantized values); NULL for a shipped weight until a reader
                              asks for its values (model_weight_values) */
    const float *master;   /* fp32 master values [rows][cols] when the checkpoint is F32
                              (mapped or owned) or F16 (widened, owned), or a shipped weight's
                              dequantized values (built with its bf16); NULL for BF16 */
    float *wide;           /* bf16 widened to fp32, owned, built on demand (model_prepare) */
    float *fp16;           /* the fp16 values PARITY_COMPUTE_FP16 reads (the master, else the
                              bf16 values, rounded once to nearest even; exact for an F16
                              checkpoint), held in fp32, owned, built on demand */
    quant_weight *quant[QUANTIZERS]; /* the decoder layers' linear weights quantized with each
                              quantizer a policy asked for, owned, built on demand */
    quant_weight *shipped;   /* codes and scales as a checkpoint (or, block-FP8, an update)
                              shipped them, owned: block-FP8, ternary, NVFP4 or MXFP4 (the
                              layouts of lib/checkpoint/layout_*.c, and update.c); every
                              policy of that format reads them as they are; NULL if none. bf16
                              and master then hold the dequantized values once something reads
                              values (model_weight_values, MODEL_NEED_VALUES), NULL before */
    uint8_t shipped_gemm;  /* the format of the shipped codes: PARITY_GEMM_FP8_BLOCK, _NVFP4,
                              _MXFP4 or _TERNARY */
    uint8_t shipped_scale_dtype; /* PARITY_DTYPE_F32, _BF16 (or _F16, ternary): how the shipped
                              scales were stored */
    uint8_t shipped_scale_is_mean; /* ternary: the values are code * shipped_value_scale
                              (autobitlinear), else code / shipped_value_scale (bitlinear) */
    float shipped_value_scale; /* ternary: the checkpoint's weight_scale, as fp32 */
    uint8_t keep_bf16;     /* named by the checkpoint's modules_to_not_convert / ignored_layers:
                              no fp8 policy quantizes it */
    uint8_t master_dropped; /* its bf16 values are the cast of F16/F32 values an update did not
                              keep as a master (PARITY_MASTERS_WHERE_READ; master NULL): every
                              reader of fp32 masters refuses it (weight_master_check) */
} weight;

/* One tensor of the blueprint: its checkpoint name, where it goes, its shape and how the
 * shape follows from the config (for messages). */
struct expected {
    char name[96];
    weight *dst;
    uint32_t rows, cols;  /* rows = 0: a vector of cols */
    char shape_doc[96];
    int linear;           /* a decoder layer's linear weight: what the fp8 formats quantize */
};
typedef struct expected expected;

/* The fp8 weights a policy's GEMM reads for w: the shipped ones under an fp8-block policy
 * where w has them, else the copy of the policy's quantizer (NULL: w runs in bf16). */
static inline const quant_weight *quant_weight_for(const parity_policy *pol, const weight *w) {
    if (pol->gemm == PARITY_GEMM_BF16 || w->keep_bf16) return NULL;
    if (w->shipped && pol->gemm == w->shipped_gemm) return w->shipped;
    return w->quant[pol->quantizer];
}

/* fp32 values of a weight for PARITY_COMPUTE_FP32: the master if any, else the widened bf16
 * (model_prepare(MODEL_NEED_WIDE) must have run; for a weight holding shipped codes,
 * MODEL_NEED_VALUES too, else both are NULL). */
static inline const float *weight_f32(const weight *w) { return w->master ? w->master : w->wide; }

/* The fp32 values a policy reads for a weight: weight_f32 under PARITY_COMPUTE_FP32, the
 * fp16 values under PARITY_COMPUTE_FP16 (MODEL_NEED_FP16), else the bf16 values widened
 * (MODEL_NEED_WIDE; the region kernels read the vectors so under bf16). */
static inline const float *weight_values(const parity_policy *pol, const weight *w) {
    return pol->compute == PARITY_COMPUTE_FP32   ? weight_f32(w)
           : pol->compute == PARITY_COMPUTE_FP16 ? w->fp16
                                                 : w->wide;
}

#endif
