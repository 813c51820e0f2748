/*
 * The 4-bit and ternary quantizers (parity.h, "4-bit and ternary quantizers"): NVFP4 and MXFP4
 * with E2M1 elements, and BitNet b1.58's ternary weights with int8 activations. Each rule is
 * the arithmetic of its source written as IEEE fp32 operations (bf16 where the source computes
 * in bf16), one rounding per operation, in the source's order; the header names file and
 * function per rule and docs/quant-formats.md quotes them.
 *
 * Codes are one per byte: E2M1 in the low nibble with its sign at 0x8 (formats.c), ternary
 * and int8 codes as two's complement int8 in a uint8_t.
 */
#include <float.h>
#include <math.h>

#include "base/internal.h"

/* ---- E2M1 and E4M3 steps -------------------------------------------------------------------- */

static const float e2m1_mid[7] = {0.25f, 0.75f, 1.25f, 1.75f, 2.5f, 3.5f, 5.0f};

/* x in E2M1, saturating at +-6 (an infinity too); `away`: ties away from zero, else to even.
 * The same rule as parity_fp4_from_f32 (test_formats checks it on every fp32 input). */
static uint8_t e2m1_code(float x, int away) {
    const uint8_t sign = (uint8_t)((f32_bits(x) >> 28) & 0x8u);
    const float a = fabsf(x);
    uint8_t code = 0;
    for (int i = 0; i < 7; i++)
        if (a > e2m1_mid[i] || (a == e2m1_mid[i] && (away || (i & 1)))) code = (uint8_t)(i + 1);
    return sign | code;
}

/* The value of an E4M3 code (finite codes only: the quantizers write none of the NaN ones). */
static float e4m3_value(uint8_t c) {
    const int mag = c & 0x7f, e = mag >> 3, f = mag & 7;
    const float v = e == 0 ? ldexpf((float)f, -9) : ldexpf((float)(8 + f), e - 10);
    return c & 0x80 ? -v : v;
}

int quant_is_nvfp4(int q) { return q >= PARITY_QUANT_NVFP4_MODELOPT && q <= PARITY_QUANT_NVFP4_TORCHAO; }
int quant_is_mxfp4(int q) { return q >= PARITY_QUANT_MXFP4_OCP && q <= PARITY_QUANT_MXFP4_MICROXCALING; }
int quant_is_ternary(int q) { return q >= PARITY_QUANT_TERNARY_BITNET && q <= PARITY_QUANT_TERNARY_ONEBITLLMS; }

static float row_amax(const float *x, size_t cols) {
    float a = 0.0f;
    for (size_t c = 0; c < cols; c++) a = fmaxf(a, fabsf(x[c]));
    return a;
}

static float tensor_amax(size_t rows, size_t cols, const float *x, size_t stride) {
    float a = 0.0f;
    for (size_t r = 0; r < rows; r++) a = fmaxf(a, row_amax(x + r * stride, cols));
    return a;
}

/* ---- NVFP4 ---------------------------------------------------------------------------------- */

/* The tensor-level numbers of an NVFP4 rule for a tensor (or row) amax: s2, the stored decode
 * scale, and (TE) the encode scale S. `zero`: the all-zero case of ModelOpt and torchao. */
typedef struct nvfp4_tensor {
    float s2, enc;
    int zero;
} nvfp4_tensor;

static nvfp4_tensor nvfp4_tensor_of(int rule, float amax) {
    nvfp4_tensor t = {0.0f, 0.0f, 0};
    if (rule == PARITY_QUANT_NVFP4_TE) {
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

/* One 1 x 16 block: its E4M3 scale code returned, its E2M1 codes written. */
static uint8_t nvfp4_block(int rule, const nvfp4_tensor *t, const float *x, size_t n,
                           uint8_t *codes) {
    float amax = 0.0f;
    for (size_t i = 0; i < n; i++) amax = fmaxf(amax, fabsf(x[i]));
    uint8_t sf;
    float sfv;
    if (t->zero) { /* s2 = 0: a zero tensor (or row); ModelOpt's 0 / 0 taken as sf 1, codes 0 */
        sf = e4m3_from_f32_saturating(1.0f);
        for (size_t i = 0; i < n; i++) codes[i] = 0;
        return sf;
    }
    switch (rule) {
    case PARITY_QUANT_NVFP4_MODELOPT: {
        float v = amax / (6.0f * t->s2);
        if (v == 0.0f) v = 1.0f;
        sf = e4m3_from_f32_saturating(v);
        sfv = e4m3_value(sf);
        const float d = sfv * t->s2;
        for (size_t i = 0; i < n; i++) codes[i] = sfv == 0.0f ? 0 : e2m1_code(x[i] / d, 0);
        return sf;
    }
    case PARITY_QUANT_NVFP4_TE: {
        sf = e4m3_from_f32_saturating(amax * (t->enc * (1.0f / 6.0f)));
        sfv = e4m3_value(sf);
        const float m = fminf(1.0f / (sfv * (1.0f / t->enc)), FLT_MAX);
        for (size_t i = 0; i < n; i++) codes[i] = sfv == 0.0f ? 0 : e2m1_code(x[i] * m, 0);
        return sf;
    }
    default: { /* torchao */
        float v = (amax / 6.0f) / t->s2;
        v = fminf(fmaxf(v, 0x1p-6f), 448.0f);
        sf = e4m3_from_f32_saturating(v);
        sfv = e4m3_value(sf);
        const float d = t->s2 * sfv;
        for (size_t i = 0; i < n; i++) codes[i] = e2m1_code(fminf(fmaxf(x[i] / d, -6.0f), 6.0f), 0);
        return sf;
    }
    }
}

/* The blocks of `rows` rows under one tensor entry (rows = 1 for a per-row call). */
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
            if (sf_values) sf_values[r * grid + c0 / 16] = e4m3_value(sf);
        }
}

/* ---- MXFP4 ---------------------------------------------------------------------------------- */

static uint8_t mxfp4_scale(int rule, float amax) {
    if (rule != PARITY_QUANT_MXFP4_RCEIL) {
        /* floor(log2 amax) - emax(E2M1) = 2, from the exponent bits, clamped to [-127, 128] */
        int e = (int)((f32_bits(amax) >> 23) & 0xffu) - 127 - 2;
        if (e < -127) e = -127;
        if (e > 128) e = 128;
        return (uint8_t)(e + 127);
    }
    const uint32_t v = f32_bits(amax * (1.0f / 6.0f));
    const uint32_t exp = (v >> 23) & 0xffu, mant = v & 0x7fffffu;
    const int up = mant > 0 && exp != 0xfeu && !(exp == 0 && mant <= 0x400000u);
    return (uint8_t)(exp + (uint32_t)up);
}

static void mxfp4_rows(int rule, size_t rows, size_t cols, const float *x, size_t x_stride,
                       uint8_t *codes, size_t codes_stride, uint8_t *bytes, float *pow2) {
    const size_t grid = (cols + 31) / 32;
    const int away = rule == PARITY_QUANT_MXFP4_MICROXCALING;
    for (size_t r = 0; r < rows; r++)
        for (size_t c0 = 0; c0 < cols; c0 += 32) {
            const size_t n = cols - c0 < 32 ? cols - c0 : 32;
            const float *xr = x + r * x_stride + c0;
            const uint8_t b = mxfp4_scale(rule, row_amax(xr, n));
            const float mult = ldexpf(1.0f, 127 - (int)b);
            if (bytes) bytes[r * grid + c0 / 32] = b;
            if (pow2) pow2[r * grid + c0 / 32] = ldexpf(1.0f, (int)b - 127);
            for (size_t i = 0; i < n; i++) codes[r * codes_stride + c0 + i] = e2m1_code(xr[i] * mult, away);
        }
}

/* ---- ternary -------------------------------------------------------------------------------- */

static float round_step(int rule, float v) {
    return rule == PARITY_QUANT_TERNARY_ONEBITLLMS ? floorf(v + 0.5f) : rintf(v);
}

static uint8_t clamp_code(float v, float lo, float hi) {
    return (uint8_t)(int8_t)(v < lo ? lo : v > hi ? hi : v);
}

/* The multiplier s_w of a weight: 1 / max(mean|W|, 1e-5), the mean from an fp64 sum in order. */
static float ternary_weight_scale(size_t rows, size_t cols, const float *x, size_t stride) {
    double sum = 0.0;
    for (size_t r = 0; r < rows; r++)
        for (size_t c = 0; c < cols; c++) sum += (double)fabsf(x[r * stride + c]);
    const float mean = (float)(sum / (double)(rows * cols));
    return 1.0f / fmaxf(mean, 1e-5f);
}

static void ternary_weight_rows(int rule, float s, size_t rows, size_t cols, const float *x,
                                size_t stride, uint8_t *codes, size_t codes_stride) {
    for (size_t r = 0; r < rows; r++)
        for (size_t c = 0; c < cols; c++)
            codes[r * codes_stride + c] = clamp_code(round_step(rule, x[r * stride + c] * s), -1.0f, 1.0f);
}

/* Per-token int8 codes of one row; returns s_x. */
static float ternary_activation_row(int rule, const float *x, size_t cols, uint8_t *codes) {
    if (rule == PARITY_QUANT_TERNARY_HF_BITLINEAR) {
        /* transformers' BitLinear.activation_quant in bf16: 127 / clamp(max|x|, 1e-5), x * s */
        float amax = 0.0f;
        for (size_t c = 0; c < cols; c++) amax = fmaxf(amax, fabsf(round_bf16(x[c])));
        const float s = round_bf16(127.0f / fmaxf(amax, round_bf16(1e-5f)));
        for (size_t c = 0; c < cols; c++)
            codes[c] = clamp_code(rintf(round_bf16(round_bf16(x[c]) * s)), -128.0f, 127.0f);
        return s;
    }
    const float s = 127.0f / fmaxf(row_amax(x, cols), 1e-5f);
    for (size_t c = 0; c < cols; c++) codes[c] = clamp_code(round_step(rule, x[c] * s), -128.0f, 127.0f);
    return s;
}

/* ---- the internal entry points (internal.h) ------------------------------------------------- */

size_t quant_block_cols(int quantizer) {
    if (quantizer <= PARITY_FP8Q_TE_POW2) return 128;
    if (quant_is_nvfp4(quantizer)) return 16;
    if (quant_is_ternary(quantizer)) return 0;
    return 32; /* MXFP8, MXFP4 */
}

void quant4_weight(int quantizer, size_t rows, size_t cols, const float *x, size_t x_stride,
                   uint8_t *codes, size_t codes_stride, float *block_scales, float *tensor_scale) {
    if (quant_is_nvfp4(quantizer)) {
        const nvfp4_tensor t = nvfp4_tensor_of(quantizer, tensor_amax(rows, cols, x, x_stride));
        nvfp4_rows(quantizer, &t, rows, cols, x, x_stride, codes, codes_stride, NULL, block_scales);
        *tensor_scale = t.s2;
    } else if (quant_is_mxfp4(quantizer)) {
        mxfp4_rows(quantizer, rows, cols, x, x_stride, codes, codes_stride, NULL, block_scales);
        *tensor_scale = 0.0f;
    } else {
        const float s = ternary_weight_scale(rows, cols, x, x_stride);
        ternary_weight_rows(quantizer, s, rows, cols, x, x_stride, codes, codes_stride);
        *tensor_scale = quantizer == PARITY_QUANT_TERNARY_HF_BITLINEAR ? round_bf16(s) : s;
    }
}

float quant4_block(int quantizer, float tensor_amax, const float *x, size_t n, uint8_t *codes) {
    if (quant_is_nvfp4(quantizer)) {
        const nvfp4_tensor t = nvfp4_tensor_of(quantizer, tensor_amax);
        return e4m3_value(nvfp4_block(quantizer, &t, x, n, codes));
    }
    float pow2;
    mxfp4_rows(quantizer, 1, n, x, n, codes, n, NULL, &pow2);
    return pow2;
}

void quant4_activations(int quantizer, size_t rows, size_t cols, const float *x, size_t x_stride,
                        uint8_t *codes, size_t codes_stride, float *block_scales,
                        float *row_scales) {
    for (size_t r = 0; r < rows; r++) {
        const float *xr = x + r * x_stride;
        uint8_t *cr = codes + r * codes_stride;
        if (quant_is_nvfp4(quantizer)) {
            const nvfp4_tensor t = nvfp4_tensor_of(quantizer, row_amax(xr, cols));
            nvfp4_rows(quantizer, &t, 1, cols, xr, cols, cr, cols, NULL,
                       block_scales + r * ((cols + 15) / 16));
            row_scales[r] = t.s2;
        } else if (quant_is_mxfp4(quantizer)) {
            mxfp4_rows(quantizer, 1, cols, xr, cols, cr, cols, NULL,
                       block_scales + r * ((cols + 31) / 32));
        } else {
            row_scales[r] = ternary_activation_row(quantizer, xr, cols, cr);
        }
    }
}

/* ---- the API -------------------------------------------------------------------------------- */

static int check_args(const char *fn, size_t rows, size_t cols, const float *x, size_t x_stride,
                      const void *codes, size_t codes_stride, const void *scales,
                      const void *more) {
    if (!x || !codes || !scales || !more)
        return set_error(PARITY_ERR_INVALID_ARGUMENT, "%s: %s is NULL", fn,
                         !x ? "x" : !codes ? "codes" : "a scales buffer");
    if (rows == 0 || cols == 0)
        return set_error(PARITY_ERR_INVALID_ARGUMENT, "%s: %zu x %zu values", fn, rows, cols);
    if (x_stride < cols || codes_stride < cols)
        return set_error(PARITY_ERR_INVALID_ARGUMENT, "%s: a row stride (x %zu, codes %zu) is "
                         "below cols %zu", fn, x_stride, codes_stride, cols);
    for (size_t r = 0; r < rows; r++)
        for (size_t c = 0; c < cols; c++)
            if (!isfinite(x[r * x_stride + c]))
                return set_error(PARITY_ERR_TENSOR_NONFINITE, "%s: x[%zu][%zu] is %s", fn, r, c,
                                 isnan(x[r * x_stride + c]) ? "NaN" : "Inf");
    return PARITY_OK;
}

static int check_per_row(const char *fn, int per_row) {
    if (per_row != 0 && per_row != 1)
        return set_error(PARITY_ERR_INVALID_ARGUMENT, "%s: per_row is %d (0: one tensor scale, "
                         "1: one per row)", fn, per_row);
    return PARITY_OK;
}

int parity_nvfp4_quantize(int quantizer, int per_row, size_t rows, size_t cols, const float *x,
                          size_t x_stride, uint8_t *codes, size_t codes_stride,
                          uint8_t *block_scales, float *tensor_scales) {
    static const char fn[] = "parity_nvfp4_quantize";
    clear_error();
    if (!quant_is_nvfp4(quantizer))
        return set_error(PARITY_ERR_POLICY, "%s: %d is not an NVFP4 quantizer "
                         "(PARITY_QUANT_NVFP4_MODELOPT .. _TORCHAO)", fn, quantizer);
    TRY(check_per_row(fn, per_row));
    TRY(check_args(fn, rows, cols, x, x_stride, codes, codes_stride, block_scales, tensor_scales));
    if (per_row) {
        for (size_t r = 0; r < rows; r++) {
            const nvfp4_tensor t = nvfp4_tensor_of(quantizer, row_amax(x + r * x_stride, cols));
            nvfp4_rows(quantizer, &t, 1, cols, x + r * x_stride, x_stride, codes + r * codes_stride,
                       codes_stride, block_scales + r * ((cols + 15) / 16), NULL);
            tensor_scales[r] = t.s2;
        }
    } else {
        const nvfp4_tensor t = nvfp4_tensor_of(quantizer, tensor_amax(rows, cols, x, x_stride));
        nvfp4_rows(quantizer, &t, rows, cols, x, x_stride, codes, codes_stride, block_scales, NULL);
        tensor_scales[0] = t.s2;
    }
    return PARITY_OK;
}

int parity_mxfp4_quantize(int quantizer, size_t rows, size_t cols, const float *x,
                          size_t x_stride, uint8_t *codes, size_t codes_stride, uint8_t *scales) {
    static const char fn[] = "parity_mxfp4_quantize";
    clear_error();
    if (!quant_is_mxfp4(quantizer))
        return set_error(PARITY_ERR_POLICY, "%s: %d is not an MXFP4 quantizer "
                         "(PARITY_QUANT_MXFP4_OCP .. _MICROXCALING)", fn, quantizer);
    TRY(check_args(fn, rows, cols, x, x_stride, codes, codes_stride, scales, scales));
    mxfp4_rows(quantizer, rows, cols, x, x_stride, codes, codes_stride, scales, NULL);
    return PARITY_OK;
}

int parity_ternary_quantize(int quantizer, int per_row, size_t rows, size_t cols, const float *x,
                            size_t x_stride, int8_t *codes, size_t codes_stride, float *scales) {
    static const char fn[] = "parity_ternary_quantize";
    clear_error();
    if (!quant_is_ternary(quantizer))
        return set_error(PARITY_ERR_POLICY, "%s: %d is not a ternary quantizer "
                         "(PARITY_QUANT_TERNARY_BITNET .. _ONEBITLLMS)", fn, quantizer);
    TRY(check_per_row(fn, per_row));
    TRY(check_args(fn, rows, cols, x, x_stride, codes, codes_stride, scales, scales));
    uint8_t *c = (uint8_t *)codes;
    if (per_row) {
        for (size_t r = 0; r < rows; r++)
            scales[r] = ternary_activation_row(quantizer, x + r * x_stride, cols, c + r * codes_stride);
    } else {
        const float s = ternary_weight_scale(rows, cols, x, x_stride);
        ternary_weight_rows(quantizer, s, rows, cols, x, x_stride, c, codes_stride);
        scales[0] = quantizer == PARITY_QUANT_TERNARY_HF_BITLINEAR ? round_bf16(s) : s;
    }
    return PARITY_OK;
}
