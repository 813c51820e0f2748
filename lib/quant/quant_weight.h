/*
 * A quantized tensor (quant_weight: codes and scales under one quantizer rule) and the
 * quantization of a weight into one, from its fp32 values or its bf16 values widened.
 */
#ifndef PARITY_QUANT_WEIGHT_H
#define PARITY_QUANT_WEIGHT_H

#include <stddef.h>
#include <stdint.h>

#include "format.h"

/* A weight quantized with one quantizer of a quantized gemm format. */
typedef struct quant_weight {
    uint8_t *codes;        /* [rows][cols], one code a byte: E4M3, E2M1 (low nibble), or
                              ternary as int8 */
    float *scales;         /* fp8-block: [ceil(rows / 128)][ceil(cols / 128)] fp32, the stored
                              dequantization multipliers; MXFP8, MXFP4: [rows][ceil(cols / 32)],
                              the E8M0 scales as fp32 powers of two; NVFP4: [rows][ceil(cols /
                              16)], the E4M3 block scales' values; ternary: unused (1 float) */
    float tensor_scale;    /* NVFP4's s2, ternary's s_w; 0 for the others */
    float input_scale;     /* shipped NVFP4: the checkpoint's input_scale (ModelOpt's calibrated
                              activation scale, kept to be saved back; the GEMM scales
                              activations per token), 0 when it had none */
} quant_weight;

/* The bytes of a rows x cols weight's codes as a quant_weight holds them (one code a byte
 * today, whatever the format's element: E4M3, E2M1 or ternary): every allocation of a
 * quant_weight's codes takes this many, and parity_model_bytes counts what a step reads in it,
 * so a packed layout changes both here. */
uint64_t quant_weight_code_bytes(const quant_format *f, uint64_t rows, uint64_t cols);
/* The bytes of its scales as held: quant_scale_count of the format, each an fp32 value. */
uint64_t quant_weight_scale_bytes(const quant_format *f, uint64_t rows, uint64_t cols);

/* Quantizes a rows x cols weight, rows `stride` apart, with `quantizer` into q (codes
 * [rows][cols], scales quant_scale_count of the rule's format, the tensor scale): from its fp32
 * values `master` if not NULL, else from its bf16 values widened (exactly) into `scratch`, which
 * holds quant_weight_scratch_floats(quantizer, rows, cols, 0) floats: a block row of 128 rows
 * at a time for the fp8 formats, the whole tensor for the others (whose scales read it all). */
void quant_weight_quantize_values(int quantizer, size_t rows, size_t cols, const float *master,
                                  const uint16_t *bf16, size_t stride, quant_weight *q,
                                  float *scratch);
/* The floats of scratch quant_weight_quantize_values needs (0 when it reads a master). */
size_t quant_weight_scratch_floats(int quantizer, size_t rows, size_t cols, int has_master);

#endif /* PARITY_QUANT_WEIGHT_H */
