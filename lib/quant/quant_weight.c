/*
 * The quantization of a weight (quant_weight.h): its fp32 values, or its bf16 values widened
 * a block row at a time, through the quantize_weight entry of the rule's format (rules.h).
 */
#include "quant_weight.h"

#include <string.h>

#include "base/floats.h"
#include "rules.h"

/* The rows widened at once: the format's widen_rows, or all of them. */
static size_t rows_at_once(const quant_format *f, size_t rows) {
    return f->widen_rows ? f->widen_rows : rows;
}

size_t quant_weight_row_bytes(const quant_format *f, size_t cols) {
    switch (f->code_bits) {
    case 4:
        return (cols + 1) / 2;
    case 2:
        return (cols + 63) / 64 * 16;
    default:
        return cols;
    }
}

uint64_t quant_weight_code_bytes(const quant_format *f, uint64_t rows, uint64_t cols) {
    return rows * quant_weight_row_bytes(f, (size_t)cols);
}

void quant_codes_pack_row(const quant_format *f, const uint8_t *codes, size_t cols,
                          uint8_t *held) {
    switch (f->code_bits) {
    case 4:
        for (size_t i = 0; i < cols / 2; i++)
            held[i] = (uint8_t)((codes[2 * i] & 0xfu) | (codes[2 * i + 1] & 0xfu) << 4);
        if (cols % 2) held[cols / 2] = codes[cols - 1] & 0xfu;
        return;
    case 2: {
        const size_t bytes = quant_weight_row_bytes(f, cols);
        memset(held, 0x55, bytes); /* every field 1: the code 0 */
        for (size_t c = 0; c < cols; c++) {
            const size_t g = c / 64, q = c % 64 / 16, i = c % 16;
            const unsigned field = (unsigned)((int)(int8_t)codes[c] + 1) & 3u;
            uint8_t *b = held + g * 16 + i;
            *b = (uint8_t)((*b & ~(3u << (2 * q))) | field << (2 * q));
        }
        return;
    }
    default:
        memcpy(held, codes, cols);
    }
}

void quant_codes_unpack_row(const quant_format *f, const uint8_t *held, size_t cols,
                            uint8_t *codes) {
    if (f->code_bits == 8) {
        memcpy(codes, held, cols);
        return;
    }
    for (size_t c = 0; c < cols; c++) codes[c] = quant_code_at(f, held, c);
}

uint64_t quant_weight_scale_bytes(const quant_format *f, uint64_t rows, uint64_t cols) {
    return quant_scale_count(f, rows, cols) * f->scale_bytes;
}

/* The floats of scratch that stage a step's codes one a byte for a packed format (0: the format
 * holds one code a byte, quantize_weight writes them in place). */
static size_t staged_code_floats(const quant_format *f, size_t rows, size_t cols) {
    if (f->code_bits == 8) return 0;
    return (rows_at_once(f, rows) * cols + sizeof(float) - 1) / sizeof(float);
}

/* The floats of scratch that stage the fp32 scales of a format that holds them as bytes (0: it
 * holds them as fp32, quantize_weight writes them in place). Such formats quantize the whole
 * tensor at once (widen_rows 0), so these are all of its scales. */
static size_t staged_scale_floats(const quant_format *f, size_t rows, size_t cols) {
    return f->scale_bytes == 4 ? 0 : (size_t)quant_scale_count(f, rows, cols);
}

size_t quant_weight_scratch_floats(int quantizer, size_t rows, size_t cols, int has_master) {
    const quant_format *f = quant_rule_of(quantizer)->format;
    return (has_master ? 0 : rows_at_once(f, rows) * cols) + staged_code_floats(f, rows, cols) +
           staged_scale_floats(f, rows, cols);
}

void quant_weight_quantize_values(int quantizer, size_t rows, size_t cols, const float *master,
                                  const uint16_t *bf16, size_t stride, quant_weight *q,
                                  float *scratch) {
    const quant_rule *rule = quant_rule_of(quantizer);
    const quant_format *f = rule->format;
    /* a block row at a time (all rows when the format's scales read them all): its scales start
     * at row r0 / block_rows of the scale grid; its codes one a byte in place, or staged after
     * the widened values and packed */
    const size_t step = rows_at_once(f, rows), row_bytes = quant_weight_row_bytes(f, cols);
    const size_t grid_cols = f->block_cols ? (cols + f->block_cols - 1) / f->block_cols : 0;
    float *wide = master ? NULL : scratch;
    float *after_wide = scratch + (master ? 0 : step * cols);
    uint8_t *staged = f->code_bits == 8 ? NULL : (uint8_t *)(void *)after_wide;
    float *staged_scales = f->scale_bytes == 4 ? NULL
                                               : after_wide + staged_code_floats(f, rows, cols);
    for (size_t r0 = 0; r0 < rows; r0 += step) {
        const size_t n = rows - r0 < step ? rows - r0 : step;
        const float *x = master ? master + r0 * stride : wide;
        if (!master)
            for (size_t r = 0; r < n; r++)
                for (size_t c = 0; c < cols; c++)
                    wide[r * cols + c] = bf16_to_f32(bf16[(r0 + r) * stride + c]);
        const size_t grid_row = f->block_rows ? r0 / f->block_rows : 0;
        uint8_t *held = q->codes + r0 * row_bytes;
        float *scales = staged_scales ? staged_scales : q->scales + grid_row * grid_cols;
        f->quantize_weight(rule, n, cols, x, master ? stride : cols, staged ? staged : held, cols,
                           scales, &q->tensor_scale);
        for (size_t r = 0; staged && r < n; r++)
            quant_codes_pack_row(f, staged + r * cols, cols, held + r * row_bytes);
    }
    /* the staged scales (the whole grid: such formats quantize all rows at once) as bytes */
    const size_t grid = staged_scales ? staged_scale_floats(f, rows, cols) : 0;
    for (size_t i = 0; i < grid; i++) q->scale_codes[i] = quant_scale_byte(f, staged_scales[i]);
}
