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

/* A weight's codes as held, a row at a time, each row quant_weight_row_bytes long, by the
 * format's code_bits:
 *   8  one code a byte (E4M3);
 *   4  two codes a byte, code 2i in the low nibble of byte i and code 2i + 1 in the high one
 *      (E2M1 with its sign at 0x8: the layout NVFP4 and MXFP4 checkpoints ship); an odd row's
 *      last high nibble is 0;
 *   2  ternary, four codes a byte as w + 1 (0, 1, 2) in groups of 64 codes in 16 bytes: code
 *      64 g + 16 q + i at bits 2q, 2q + 1 of byte 16 g + i, so that a shift by 2q and a mask
 *      give 16 consecutive codes; a row's last group is padded with 1 (the code 0).
 * The quantizers, the activations and the public calls take one code a byte (E4M3, E2M1 in the
 * low nibble, ternary as int8); quant_codes_pack_row and _unpack_row convert. */
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
/* Code c of a held row, one a byte. */
static inline uint8_t quant_code_at(const quant_format *f, const uint8_t *held, size_t c) {
    switch (f->code_bits) {
    case 4:
        return (uint8_t)((held[c / 2] >> (c % 2 * 4)) & 0xfu);
    case 2: {
        const size_t g = c / 64, q = c % 64 / 16, i = c % 16;
        return (uint8_t)((int)((held[g * 16 + i] >> (2 * q)) & 3u) - 1);
    }
    default:
        return held[c];
    }
}
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
