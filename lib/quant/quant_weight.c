/*
 * The quantization of a weight (quant_weight.h): its fp32 values, or its bf16 values widened
 * a block row at a time, through the quantize_weight entry of the rule's format (rules.h).
 */
#include "quant_weight.h"

#include "base/internal.h"
#include "rules.h"

/* The rows widened at once: the format's widen_rows, or all of them. */
static size_t rows_at_once(const quant_format *f, size_t rows) {
    return f->widen_rows ? f->widen_rows : rows;
}

uint64_t quant_weight_code_bytes(const quant_format *f, uint64_t rows, uint64_t cols) {
    (void)f; /* one code a byte in every format */
    return rows * cols;
}

uint64_t quant_weight_scale_bytes(const quant_format *f, uint64_t rows, uint64_t cols) {
    return quant_scale_count(f, rows, cols) * sizeof(float);
}

size_t quant_weight_scratch_floats(int quantizer, size_t rows, size_t cols, int has_master) {
    if (has_master) return 0;
    return rows_at_once(quant_rule_of(quantizer)->format, rows) * cols;
}

void quant_weight_quantize_values(int quantizer, size_t rows, size_t cols, const float *master,
                                  const uint16_t *bf16, size_t stride, quant_weight *q,
                                  float *scratch) {
    const quant_rule *rule = quant_rule_of(quantizer);
    const quant_format *f = rule->format;
    if (master) {
        f->quantize_weight(rule, rows, cols, master, stride, q->codes, cols, q->scales,
                           &q->tensor_scale);
        return;
    }
    /* a block row at a time: its scales start at row r0 / block_rows of the scale grid */
    const size_t step = rows_at_once(f, rows);
    const size_t grid_cols = f->block_cols ? (cols + f->block_cols - 1) / f->block_cols : 0;
    for (size_t r0 = 0; r0 < rows; r0 += step) {
        const size_t n = rows - r0 < step ? rows - r0 : step;
        for (size_t r = 0; r < n; r++)
            for (size_t c = 0; c < cols; c++)
                scratch[r * cols + c] = bf16_to_f32(bf16[(r0 + r) * stride + c]);
        const size_t grid_row = f->block_rows ? r0 / f->block_rows : 0;
        f->quantize_weight(rule, n, cols, scratch, cols, q->codes + r0 * cols, cols,
                           q->scales + grid_row * grid_cols, &q->tensor_scale);
    }
}
