/*
 * NVFP4 (parity.h, "4-bit and ternary quantizers"): E2M1 elements in 1 x 16 blocks, each with an
 * E4M3 block scale, under an fp32 tensor scale s2 (per row for activations), and its rules
 * ModelOpt, Transformer Engine and torchao, and TE's 16 x 16 weight tiles ("te-2d"). Each rule
 * is the arithmetic of its source written as IEEE fp32 operations, one rounding per operation,
 * in the source's order; the header names file and function per rule and docs/quant-formats.md
 * quotes them.
 */
#include <math.h>

#include "nvfp4.h"

#include "codecs.h"

/* One 1 x 16 block: its E4M3 scale code returned, its E2M1 codes written. */
static uint8_t nvfp4_block(int rule, const nvfp4_tensor *t, const float *x, size_t n,
                           uint8_t *codes) {
    const nvfp4_step step = nvfp4_block_step(rule, t, quant_amax(x, n));
    for (size_t i = 0; i < n; i++) codes[i] = nvfp4_element(&step, x[i]);
    return step.sf;
}

/* The blocks of `rows` rows under one tensor entry (rows = 1 for a per-row call): the block
 * scales as E4M3 bytes (`sf_bytes`) or as the values they mean (`sf_values`), whichever is not
 * NULL. */
static void nvfp4_rows(int rule, const nvfp4_tensor *t, size_t rows, size_t cols, const float *x,
                       size_t x_stride, uint8_t *codes, size_t codes_stride, uint8_t *sf_bytes,
                       float *sf_values) {
    const size_t grid = (cols + 15) / 16;
    for (size_t r = 0; r < rows; r++)
        for (size_t c0 = 0; c0 < cols; c0 += 16) {
            const size_t n = cols - c0 < 16 ? cols - c0 : 16;
            const uint8_t sf = nvfp4_block(rule, t, x + r * x_stride + c0, n,
                                           codes + r * codes_stride + c0);
            if (sf_bytes) sf_bytes[r * grid + c0 / 16] = sf;
            if (sf_values) sf_values[r * grid + c0 / 16] = e4m3_to_f32(sf);
        }
}

/* max |x| over a rows x cols tensor. */
static float tensor_amax(size_t rows, size_t cols, const float *x, size_t stride) {
    float a = 0.0f;
    for (size_t r = 0; r < rows; r++) a = fmaxf(a, quant_amax(x + r * stride, cols));
    return a;
}

/* Every row under its own s2 (rows_scales[r]): the activations' quantization, and the API's
 * per_row = 1. */
static void nvfp4_per_row(int rule, size_t rows, size_t cols, const float *x, size_t x_stride,
                          uint8_t *codes, size_t codes_stride, uint8_t *sf_bytes,
                          float *sf_values, float *row_scales) {
    const size_t grid = (cols + 15) / 16;
    for (size_t r = 0; r < rows; r++) {
        const float *xr = x + r * x_stride;
        const nvfp4_tensor t = nvfp4_tensor_of(rule, quant_amax(xr, cols));
        nvfp4_rows(rule, &t, 1, cols, xr, x_stride, codes + r * codes_stride, codes_stride,
                   sf_bytes ? sf_bytes + r * grid : NULL, sf_values ? sf_values + r * grid : NULL);
        row_scales[r] = t.s2;
    }
}

void nvfp4_quantize_tiles(int rule, size_t rows, size_t cols, const float *x, size_t x_stride,
                          uint8_t *codes, size_t codes_stride, uint8_t *tile_bytes,
                          uint8_t *row_bytes, float *row_values, float *tensor_scale) {
    const nvfp4_tensor t = nvfp4_tensor_of(rule, tensor_amax(rows, cols, x, x_stride));
    const size_t grid = (cols + 15) / 16;
    for (size_t r0 = 0; r0 < rows; r0 += 16)
        for (size_t c0 = 0; c0 < cols; c0 += 16) {
            const size_t nr = rows - r0 < 16 ? rows - r0 : 16, nc = cols - c0 < 16 ? cols - c0 : 16;
            float amax = 0.0f;
            for (size_t r = r0; r < r0 + nr; r++)
                amax = fmaxf(amax, quant_amax(x + r * x_stride + c0, nc));
            const nvfp4_step step = nvfp4_block_step(rule, &t, amax);
            for (size_t r = r0; r < r0 + nr; r++) {
                for (size_t c = c0; c < c0 + nc; c++)
                    codes[r * codes_stride + c] = nvfp4_element(&step, x[r * x_stride + c]);
                if (row_bytes) row_bytes[r * grid + c0 / 16] = step.sf;
                if (row_values) row_values[r * grid + c0 / 16] = e4m3_to_f32(step.sf);
            }
            if (tile_bytes) tile_bytes[r0 / 16 * grid + c0 / 16] = step.sf;
        }
    *tensor_scale = t.s2;
}

void nvfp4_quantize_weight(const quant_rule *r, size_t rows, size_t cols, const float *x,
                           size_t x_stride, uint8_t *codes, size_t codes_stride,
                           float *block_scales, float *tensor_scale) {
    if (r->id == PARITY_QUANT_NVFP4_TE_2D) {
        nvfp4_quantize_tiles(r->id, rows, cols, x, x_stride, codes, codes_stride, NULL, NULL,
                             block_scales, tensor_scale);
        return;
    }
    const nvfp4_tensor t = nvfp4_tensor_of(r->id, tensor_amax(rows, cols, x, x_stride));
    nvfp4_rows(r->id, &t, rows, cols, x, x_stride, codes, codes_stride, NULL, block_scales);
    *tensor_scale = t.s2;
}

void nvfp4_quantize_activations(const quant_rule *r, size_t rows, size_t cols, const float *x,
                                size_t x_stride, uint8_t *codes, size_t codes_stride,
                                float *block_scales, float *row_scales) {
    nvfp4_per_row(r->id, rows, cols, x, x_stride, codes, codes_stride, NULL, block_scales,
                  row_scales);
}

float nvfp4_quantize_block(const quant_rule *r, float tensor_amax, const float *x, size_t n,
                           uint8_t *codes) {
    const nvfp4_tensor t = nvfp4_tensor_of(r->id, tensor_amax);
    return e4m3_to_f32(nvfp4_block(r->id, &t, x, n, codes));
}

void nvfp4_quantize_bytes(const quant_rule *r, int per_row, size_t rows, size_t cols,
                          const float *x, size_t x_stride, uint8_t *codes, size_t codes_stride,
                          uint8_t *block_scales, float *tensor_scales) {
    if (per_row) {
        nvfp4_per_row(r->id, rows, cols, x, x_stride, codes, codes_stride, block_scales, NULL,
                      tensor_scales);
    } else if (r->id == PARITY_QUANT_NVFP4_TE_2D) {
        nvfp4_quantize_tiles(r->id, rows, cols, x, x_stride, codes, codes_stride, NULL,
                             block_scales, NULL, tensor_scales);
    } else {
        const nvfp4_tensor t = nvfp4_tensor_of(r->id, tensor_amax(rows, cols, x, x_stride));
        nvfp4_rows(r->id, &t, rows, cols, x, x_stride, codes, codes_stride, block_scales, NULL);
        tensor_scales[0] = t.s2;
    }
}
