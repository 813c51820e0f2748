/*
 * NVFP4's quantization (nvfp4.c): E2M1 codes, E4M3 block scales, an fp32 tensor scale s2; the
 * entries of its format row (format.h) and the forms the public call and the export check use.
 */
#ifndef PARITY_QUANT_NVFP4_H
#define PARITY_QUANT_NVFP4_H

#include <float.h>
#include <math.h>

#include "codecs.h"
#include "e2m1_simd.h"
#include "format.h"

/* The entries (quant_fn): block scales as the E4M3 values they mean; a weight's s2 from the
 * tensor's amax, activations' per row. */
quant_fn nvfp4_quantize_weight, nvfp4_quantize_activations;
/* One block of n <= 16 values as nvfp4_quantize_weight quantizes it for a weight whose amax is
 * tensor_amax: codes written, the block scale's value returned. */
float nvfp4_quantize_block(const quant_rule *r, float tensor_amax, const float *x, size_t n,
                           uint8_t *codes);
/* A weight in 16 x 16 tiles (partial at the edges), each tile's scale from its amax under the
 * rule's arithmetic: the tile scales as E4M3 bytes tile_bytes[ceil(rows / 16)][ceil(cols /
 * 16)], and repeated in each row of the tile as bytes row_bytes[rows][ceil(cols / 16)] or as
 * values row_values (each may be NULL); the tensor's s2 in *tensor_scale. "te-2d"'s weights and
 * parity_nvfp4_quantize_2d. */
void nvfp4_quantize_tiles(int rule, size_t rows, size_t cols, const float *x, size_t x_stride,
                          uint8_t *codes, size_t codes_stride, uint8_t *tile_bytes,
                          uint8_t *row_bytes, float *row_values, float *tensor_scale);
/* The public call's form: block scales as E4M3 bytes, one s2 (per_row 0) or one per row. */
void nvfp4_quantize_bytes(const quant_rule *r, int per_row, size_t rows, size_t cols,
                          const float *x, size_t x_stride, uint8_t *codes, size_t codes_stride,
                          uint8_t *block_scales, float *tensor_scales);

/* ---- the rules' arithmetic, inline for nvfp4.c and the SIMD variants (e2m1_lanes.h) ----- */

/* The tensor-level numbers of an NVFP4 rule for a tensor (or row) amax: s2, the stored decode
 * scale, and (TE) the encode scale S. `zero`: the all-zero case of ModelOpt and torchao. */
typedef struct nvfp4_tensor {
    float s2;  /* the decode scale a checkpoint stores (weight_scale_2) */
    float enc; /* TE's encode scale S = 1 / s2 */
    int zero;  /* s2 = 0 (ModelOpt, torchao): every block's scale 1, every code 0 */
} nvfp4_tensor;

/* The rule whose scale and element arithmetic `rule` uses: "te-2d" is "te" on 16 x 16 tiles of a
 * weight (its activations are "te"'s 1 x 16 blocks). */
static inline int nvfp4_arithmetic(int rule) {
    return rule == PARITY_QUANT_NVFP4_TE_2D ? PARITY_QUANT_NVFP4_TE : rule;
}

static inline nvfp4_tensor nvfp4_tensor_of(int rule, float amax) {
    nvfp4_tensor t = {0.0f, 0.0f, 0};
    if (nvfp4_arithmetic(rule) == PARITY_QUANT_NVFP4_TE) {
        float s = 2688.0f / amax; /* 448 * 6; +inf for amax 0 */
        s = fminf(s, FLT_MAX);
        if (amax == 0.0f || s == 0.0f) s = 1.0f;
        t.enc = s;
        t.s2 = 1.0f / s;
        return t;
    }
    t.s2 = amax / 2688.0f;
    t.zero = t.s2 == 0.0f;
    return t;
}

/* How a block's values become codes once its scale is chosen: every code 0; e2m1(x / f);
 * e2m1(x * f); e2m1(clamp(x / f, -6, 6)), rounding to nearest even. */
enum { NVFP4_CODES_ZERO, NVFP4_CODES_DIVIDE, NVFP4_CODES_MULTIPLY, NVFP4_CODES_DIVIDE_CLAMPED };

/* A block's E4M3 scale code and the step from its values to its codes. */
typedef struct nvfp4_step {
    uint8_t sf;     /* the block scale's E4M3 code */
    int codes;      /* NVFP4_CODES_* */
    float factor;   /* f of the step */
} nvfp4_step;

/* The step of a 1 x 16 block (or, "te-2d" and parity_nvfp4_quantize_2d, a 16 x 16 tile) whose
 * amax is `amax` under rule `rule` and tensor entry t. */
static inline nvfp4_step nvfp4_block_step(int rule, const nvfp4_tensor *t, float amax) {
    nvfp4_step step = {0, NVFP4_CODES_ZERO, 0.0f};
    if (t->zero) { /* s2 = 0: a zero tensor (or row); ModelOpt's 0 / 0 taken as sf 1, codes 0 */
        step.sf = e4m3_from_f32_saturating(1.0f);
        return step;
    }
    switch (nvfp4_arithmetic(rule)) {
    case PARITY_QUANT_NVFP4_MODELOPT: {
        float v = amax / (6.0f * t->s2);
        if (v == 0.0f) v = 1.0f;
        step.sf = e4m3_from_f32_saturating(v);
        const float sfv = e4m3_to_f32(step.sf);
        step.factor = sfv * t->s2;
        step.codes = sfv == 0.0f ? NVFP4_CODES_ZERO : NVFP4_CODES_DIVIDE;
        return step;
    }
    case PARITY_QUANT_NVFP4_TE: {
        step.sf = e4m3_from_f32_saturating(amax * (t->enc * (1.0f / 6.0f)));
        const float sfv = e4m3_to_f32(step.sf);
        step.factor = fminf(1.0f / (sfv * (1.0f / t->enc)), FLT_MAX);
        step.codes = sfv == 0.0f ? NVFP4_CODES_ZERO : NVFP4_CODES_MULTIPLY;
        return step;
    }
    default: { /* torchao */
        float v = (amax / 6.0f) / t->s2;
        v = fminf(fmaxf(v, 0x1p-6f), 448.0f);
        step.sf = e4m3_from_f32_saturating(v);
        step.factor = t->s2 * e4m3_to_f32(step.sf);
        step.codes = NVFP4_CODES_DIVIDE_CLAMPED;
        return step;
    }
    }
}

/* The code of one value x of a block under its step. */
static inline uint8_t nvfp4_element(const nvfp4_step *step, float x) {
    switch (step->codes) {
    case NVFP4_CODES_DIVIDE:
        return e2m1_from_f32(x / step->factor, 0);
    case NVFP4_CODES_MULTIPLY:
        return e2m1_from_f32(x * step->factor, 0);
    case NVFP4_CODES_DIVIDE_CLAMPED:
        return e2m1_from_f32(fminf(fmaxf(x / step->factor, -6.0f), 6.0f), 0);
    }
    return 0;
}

/* The SIMD variants of the format row (rules.c): e2m1_simd.h's. */
#define NVFP4_SIMD E2M1_SIMD(nvfp4_quantize_rows_avx2, nvfp4_quantize_rows_avx512)

#endif /* PARITY_QUANT_NVFP4_H */
