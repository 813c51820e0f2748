/*
 * The types of the table of quantized formats (rules.h, rules.c), as ggml's type_traits: a
 * format row (PARITY_GEMM_FP8_BLOCK .. PARITY_GEMM_TERNARY: element codec, block shape, scale
 * types, the quantize and GEMM entries) and a rule row (PARITY_FP8Q_* and PARITY_QUANT_*: its
 * name, its format, what it changes within the format). The format files (fp8.c, nvfp4.c,
 * mxfp4.c, ternary.c) implement the entries from these types alone, so that they see nothing
 * of the table that points to them.
 */
#ifndef PARITY_QUANT_FORMAT_H
#define PARITY_QUANT_FORMAT_H

#include <math.h>
#include <stddef.h>
#include <stdint.h>

#include "codecs.h"
#include "parity.h"

/* The number of quantizer rules: PARITY_FP8Q_* and PARITY_QUANT_* are 0 .. QUANTIZERS - 1. */
#define QUANTIZERS (PARITY_QUANT_NVFP4_TE_2D + 1)

/* A format's element codes (codecs.h). The quantizers and the activations' codes take one a
 * byte; a weight's codes are held as code_bits says (code_layout.h). */
enum {
    QUANT_ELEMENT_E4M3,    /* E4M3 (weights and activations) */
    QUANT_ELEMENT_E2M1,    /* E2M1 in the low nibble, its sign at 0x8 */
    QUANT_ELEMENT_TERNARY  /* weights -1, 0, 1 and activations int8, as two's complement int8 */
};

/* How a scale is stored: in a checkpoint, a manifest, an API buffer. In memory the quantizers
 * and the activations hold every scale as the fp32 value it means; a weight's block scales are
 * held as the format's scale_bytes say (quant_weight.h). */
enum {
    QUANT_SCALE_NONE,
    QUANT_SCALE_F32,
    QUANT_SCALE_BF16,
    QUANT_SCALE_E4M3,
    QUANT_SCALE_E8M0
};

struct quant_gemm_job;
struct quant_rule;

/* A quantize entry: rows x cols values x (rows x_stride apart) into codes (one a byte, rows
 * codes_stride apart), the block scales as fp32 values over the scale grid, and the tensor
 * scale (a weight: one value; activations: one per row) where the format has one. No argument
 * checks: the caller checked them. */
typedef void quant_fn(const struct quant_rule *rule, size_t rows, size_t cols, const float *x,
                      size_t x_stride, uint8_t *codes, size_t codes_stride, float *block_scales,
                      float *tensor_scales);
/* A GEMM entry: the columns [n0, n1) of the job's output (dot.h). */
typedef void quant_gemm_fn(const struct quant_gemm_job *job, size_t n0, size_t n1);

/* The SIMD variants of a format's activation quantizer and GEMM. Each returns, for every input,
 * the bits of the format's portable entries (quantize_rows, gemm_columns), which are the
 * specification. Which runs (quant_rows_entry, quant_gemm_entry in rules.h): on the avx2 CPU
 * path the avx2 variant; on avx512 and avx512bf16 the avx512vnni one where the CPU has
 * AVX512_VNNI, else the avx512 one; a variant a format lacks (NULL entries) falls back to the
 * next narrower one (avx512vnni, avx512, avx2), then to the portable entry. */
enum {
    QUANT_SIMD_AVX2,       /* AVX2, FMA, F16C */
    QUANT_SIMD_AVX512,     /* AVX-512 F, BW, VL, DQ */
    QUANT_SIMD_AVX512VNNI, /* AVX-512 F, BW, VL, DQ and VNNI */
    QUANT_SIMD_VARIANTS
};

typedef struct quant_simd {
    quant_fn *quantize_rows;      /* activations, as the format's quantize_rows; NULL: none */
    quant_gemm_fn *gemm_columns;  /* the GEMM, as the format's gemm_columns; NULL: none */
} quant_simd;

typedef struct quant_format {
    uint32_t gemm;             /* PARITY_GEMM_FP8_BLOCK .. PARITY_GEMM_TERNARY */
    const char *name;          /* "fp8-block", "mxfp8", "nvfp4", "mxfp4", "ternary" */
    uint8_t element;           /* QUANT_ELEMENT_* */
    uint8_t code_bits;         /* the bits a weight's code takes as held: 8, 4 or 2
                                  (code_layout.h: the packed layouts) */
    uint32_t block_rows;       /* a weight's scale block: block_rows x block_cols (activations */
    uint32_t block_cols;       /* 1 x block_cols); 0 x 0: no blocks, one tensor scale */
    uint8_t block_scale;       /* QUANT_SCALE_*: how a block scale is stored (F32, E8M0, E4M3) */
    uint8_t scale_bytes;       /* the bytes a weight's block scale takes as held: 4, its fp32
                                  value; 1, its block_scale byte (E4M3 bits, E8M0's biased
                                  exponent), as the format's checkpoints ship it */
    uint8_t has_tensor_scale;  /* a second, tensor-wide scale: NVFP4's s2, ternary's s_w (per
                                  row for activations: s2, s_x) */
    uint32_t widen_rows;       /* bf16 weights are widened to fp32 this many rows at a time for
                                  quantize_weight (0: the whole tensor: its scales read it all) */
    quant_fn *quantize_weight; /* a weight: block_rows x block_cols blocks, one tensor scale */
    quant_fn *quantize_rows;   /* activations, per token: 1 x block_cols blocks, row scales */
    quant_gemm_fn *gemm_columns;
    quant_simd simd[QUANT_SIMD_VARIANTS]; /* the SIMD variants of the two above, by QUANT_SIMD_* */
} quant_format;

typedef struct quant_rule {
    int id;                    /* its PARITY_FP8Q_* / PARITY_QUANT_* value */
    const char *api_name;      /* "PARITY_FP8Q_DEEPSEEK", ...: the value's name, for messages */
    const char *name;          /* its name within the format (parity_quantizer_from_name) */
    const quant_format *format;
    uint8_t tensor_scale;      /* QUANT_SCALE_*: the tensor scale's type; BF16: the rule computes
                                  its scales and the GEMM's last steps in bf16 (hf-bitlinear) */
    uint8_t pow2_scales;       /* every block scale a power of two (te-pow2, the MX rules) */
} quant_rule;

/* max |x| over n values (0 for none; a NaN is passed over, as fmaxf does). */
static inline float quant_amax(const float *x, size_t n) {
    float a = 0.0f;
    for (size_t i = 0; i < n; i++) a = fmaxf(a, fabsf(x[i]));
    return a;
}

/* The fp32 value of a held scale byte of a format whose scale_bytes is 1: E4M3 (NVFP4) or E8M0
 * (MXFP4). */
static inline float quant_scale_value(const quant_format *f, uint8_t byte) {
    return f->block_scale == QUANT_SCALE_E4M3 ? e4m3_to_f32(byte) : e8m0_to_f32(byte);
}
/* The held byte of a scale value s of such a format, which must be a value of its byte type (an
 * E4M3 value; a power of two in [2^-127, 2^127]): the quantizers' scales are, and
 * parity_model_set_quantized refuses others. */
static inline uint8_t quant_scale_byte(const quant_format *f, float s) {
    return f->block_scale == QUANT_SCALE_E4M3 ? e4m3_from_f32_saturating(s) : e8m0_from_pow2(s);
}

#endif /* PARITY_QUANT_FORMAT_H */
