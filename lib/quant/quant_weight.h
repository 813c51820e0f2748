/*
 * A quantized tensor (quant_weight: codes and scales under one quantizer rule) and the
 * quantization of a weight into one, from its fp32 values or its bf16 values widened.
 */
#ifndef PARITY_QUANT_WEIGHT_H
#define PARITY_QUANT_WEIGHT_H

#include <stddef.h>
#include <stdint.h>

#include "code_layout.h"
#include "format.h"

/* A weight quantized with one quantizer of a quantized gemm format. */
typedef struct quant_weight {
    uint8_t *codes;        /* [rows][quant_weight_row_bytes], packed as the format's code_bits
                              say (below) */
    /* The block scales as the format's scale_bytes hold them: one buffer, named by its type.
     * scale_bytes 4: `scales`, fp32 values (fp8-block: [ceil(rows / 128)][ceil(cols / 128)], the
     * stored dequantization multipliers; MXFP8: [rows][ceil(cols / 32)], the E8M0 scales as fp32
     * powers of two; ternary: unused, 1 float). scale_bytes 1: `scale_codes`, the bytes the
     * checkpoints ship (NVFP4: [rows][ceil(cols / 16)] E4M3 bits; MXFP4: [rows][ceil(cols / 32)]
     * E8M0 biased exponents); quant_scale_value gives the fp32 value of one. A union rather than
     * two fields: code that only allocates, frees, copies or owns the buffer (by
     * quant_weight_scale_bytes) reads the same for every format. */
    union {
        float *scales;
        uint8_t *scale_codes;
    };
    float tensor_scale;    /* NVFP4's s2, ternary's s_w; 0 for the others */
    float input_scale;     /* shipped NVFP4: the checkpoint's input_scale (ModelOpt's calibrated
                              activation scale, kept to be saved back; the GEMM scales
                              activations per token), 0 when it had none */
} quant_weight;

/* The bytes of a row of `cols` codes as held (code_layout.h says the layouts). */
size_t quant_weight_row_bytes(const quant_format *f, size_t cols);
/* The bytes of a rows x cols weight's codes as held: every allocation of a quant_weight's codes
 * takes this many, and parity_model_bytes counts what a step reads in it. */
uint64_t quant_weight_code_bytes(const quant_format *f, uint64_t rows, uint64_t cols);
/* A row of `cols` codes one a byte into the held layout (quant_weight_row_bytes bytes). */
void quant_codes_pack_row(const quant_format *f, const uint8_t *codes, size_t cols,
                          uint8_t *held);
/* A held row back into `cols` codes one a byte. */
void quant_codes_unpack_row(const quant_format *f, const uint8_t *held, size_t cols,
                            uint8_t *codes);
/* The bytes of its scales as held: quant_scale_count of the format, each scale_bytes long. */
uint64_t quant_weight_scale_bytes(const quant_format *f, uint64_t rows, uint64_t cols);

/* Block scale i of q (its grid in row order) as the fp32 value it means. */
static inline float quant_weight_scale(const quant_format *f, const quant_weight *q, uint64_t i) {
    return f->scale_bytes == 1 ? quant_scale_value(f, q->scale_codes[i]) : q->scales[i];
}

/* Quantizes a rows x cols weight, rows `stride` apart, with `quantizer` into q (codes
 * [rows][cols], scales quant_scale_count of the rule's format as held, the tensor scale): from
 * its fp32
 * values `master` if not NULL, else from its bf16 values widened (exactly) into `scratch`, which
 * holds quant_weight_scratch_floats(quantizer, rows, cols, master != NULL) floats: a block row
 * of 128 rows at a time for the fp8 formats, the whole tensor for the others (whose scales read
 * it all); packed codes and byte scales are staged there too (as the quantizers write them: a
 * code a byte, fp32 scales), then converted into q. */
void quant_weight_quantize_values(int quantizer, size_t rows, size_t cols, const float *master,
                                  const uint16_t *bf16, size_t stride, quant_weight *q,
                                  float *scratch);
/* The floats of scratch quant_weight_quantize_values needs (0 when it reads a master). */
size_t quant_weight_scratch_floats(int quantizer, size_t rows, size_t cols, int has_master);

#endif /* PARITY_QUANT_WEIGHT_H */
