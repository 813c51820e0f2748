/*
 * The public quantize calls of the formats (parity.h, "FP8 quantizers" and "4-bit and ternary
 * quantizers"): each checks its arguments against the rule table (rules.c) and hands them to
 * its format's file (fp8.c, nvfp4.c, mxfp4.c, ternary.c) in the form the call returns.
 */
#include "base/errors.h"
#include "fp8.h"
#include "mxfp4.h"
#include "nvfp4.h"
#include "rules.h"
#include "ternary.h"

int parity_fp8_quantize_blocks(int quantizer, size_t rows, size_t cols, const float *x,
                               size_t x_stride, uint32_t block_rows, uint32_t block_cols,
                               uint8_t *codes, size_t codes_stride, float *scales) {
    static const char fn[] = "parity_fp8_quantize_blocks";
    clear_error();
    TRY(quant_check_rule(fn, quantizer, PARITY_GEMM_FP8_BLOCK));
    if (block_rows == 0 || block_cols == 0)
        return set_error(PARITY_ERR_INVALID_ARGUMENT, "%s: block %u x %u", fn, block_rows,
                         block_cols);
    TRY(quant_check_values(fn, rows, cols, x, x_stride, codes, codes_stride, scales, scales,
                           "scales"));
    fp8_quantize_blocks(quant_rule_of(quantizer), rows, cols, x, x_stride, block_rows, block_cols,
                        codes, codes_stride, scales);
    return PARITY_OK;
}

/* The MX formats' calls: checks, then the format's quantization with E8M0 byte scales. */
typedef void mx_bytes_fn(const quant_rule *r, size_t rows, size_t cols, const float *x,
                         size_t x_stride, uint8_t *codes, size_t codes_stride, uint8_t *scales);
static int mx_quantize(const char *fn, uint32_t gemm, mx_bytes_fn *quantize, int quantizer,
                       size_t rows, size_t cols, const float *x, size_t x_stride, uint8_t *codes,
                       size_t codes_stride, uint8_t *scales, const char *scales_name) {
    TRY(quant_check_call(fn, quantizer, gemm, -1, rows, cols, x, x_stride, codes, codes_stride,
                         scales, scales, scales_name));
    quantize(quant_rule_of(quantizer), rows, cols, x, x_stride, codes, codes_stride, scales);
    return PARITY_OK;
}

int parity_mxfp8_quantize(int quantizer, size_t rows, size_t cols, const float *x,
                          size_t x_stride, uint8_t *codes, size_t codes_stride, uint8_t *scales) {
    return mx_quantize("parity_mxfp8_quantize", PARITY_GEMM_MXFP8, mxfp8_quantize_bytes, quantizer,
                       rows, cols, x, x_stride, codes, codes_stride, scales, "scales");
}

int parity_mxfp8_quantize_as(int quantizer, int element, size_t rows, size_t cols,
                             const float *x, size_t x_stride, uint8_t *codes, size_t codes_stride,
                             uint8_t *scales) {
    static const char fn[] = "parity_mxfp8_quantize_as";
    clear_error();
    if (element != PARITY_FP8_E4M3 && element != PARITY_FP8_E5M2)
        return set_error(PARITY_ERR_INVALID_ARGUMENT, "%s: element %d is neither PARITY_FP8_E4M3 "
                         "nor PARITY_FP8_E5M2", fn, element);
    TRY(quant_check_call(fn, quantizer, PARITY_GEMM_MXFP8, -1, rows, cols, x, x_stride, codes,
                         codes_stride, scales, scales, "scales"));
    mxfp8_quantize_element(quant_rule_of(quantizer), element, rows, cols, x, x_stride, codes,
                           codes_stride, scales);
    return PARITY_OK;
}

int parity_nvfp4_quantize(int quantizer, int per_row, size_t rows, size_t cols, const float *x,
                          size_t x_stride, uint8_t *codes, size_t codes_stride,
                          uint8_t *block_scales, float *tensor_scales) {
    TRY(quant_check_call("parity_nvfp4_quantize", quantizer, PARITY_GEMM_NVFP4, per_row, rows,
                         cols, x, x_stride, codes, codes_stride, block_scales, tensor_scales,
                         "a scales buffer"));
    nvfp4_quantize_bytes(quant_rule_of(quantizer), per_row, rows, cols, x, x_stride, codes,
                         codes_stride, block_scales, tensor_scales);
    return PARITY_OK;
}

int parity_ternary_quantize(int quantizer, int per_row, size_t rows, size_t cols, const float *x,
                            size_t x_stride, int8_t *codes, size_t codes_stride, float *scales) {
    TRY(quant_check_call("parity_ternary_quantize", quantizer, PARITY_GEMM_TERNARY, per_row, rows,
                         cols, x, x_stride, codes, codes_stride, scales, scales,
                         "a scales buffer"));
    /* per_row: activations, one s_x per row; else a weight's one s_w */
    quant_fn *quantize = per_row ? ternary_quantize_activations : ternary_quantize_weight;
    quantize(quant_rule_of(quantizer), rows, cols, x, x_stride, (uint8_t *)codes, codes_stride,
             NULL, scales);
    return PARITY_OK;
}

int parity_mxfp4_quantize(int quantizer, size_t rows, size_t cols, const float *x,
                          size_t x_stride, uint8_t *codes, size_t codes_stride, uint8_t *scales) {
    return mx_quantize("parity_mxfp4_quantize", PARITY_GEMM_MXFP4, mxfp4_quantize_bytes, quantizer,
                       rows, cols, x, x_stride, codes, codes_stride, scales, "a scales buffer");
}
