/*
 * FP8 quantizers: the scale and element rules of the public implementations, each written as
 * the fp32 operations its source performs (IEEE, round to nearest even, in the order given),
 * so that a sampler and a learner that name the same rule get the same codes and scales.
 * ../shared/notes/quant-formats.md (copied to docs/quant-formats.md) quotes each source; the
 * header (parity.h, "FP8 quantizers") names file and function per rule.
 *
 * A block's amax is max |x| over its elements (the padding of a partial block is zero, which
 * changes no maximum). Element codes are E4M3 with the clamp to +-448 every rule applies
 * before its cast (e4m3_from_f32_saturating).
 */
#include <float.h>
#include <math.h>

#include "base/internal.h"

static float f32_floor_pow2(float m) { return f32_from_bits(f32_bits(m) & 0xff800000u); }

/* The per-block parameters of a block rule: `stored`, the fp32 dequantization multiplier a
 * checkpoint holds (weight_scale_inv, the activation scale); `mult`, what the element step
 * applies; `divide`: the element step is x / stored instead of x * mult. */
typedef struct block_scale {
    float stored, mult;
    int divide;
} block_scale;

static block_scale block_scale_of(int rule, float amax) {
    block_scale b = {0, 0, 0};
    switch (rule) {
    case PARITY_FP8Q_DEEPSEEK: /* s = max(amax, 1e-10) / 448; q = x / s */
        b.stored = fmaxf(amax, 1e-10f) / 448.0f;
        b.divide = 1;
        break;
    case PARITY_FP8Q_SGLANG: /* s = max(amax, 1e-10) / 448; q = x * (1 / s) */
        b.stored = fmaxf(amax, 1e-10f) / 448.0f;
        b.mult = 1.0f / b.stored;
        break;
    case PARITY_FP8Q_DEEPGEMM: /* a = max(amax, 1e-4); s = a / 448; q = x * (448 / a) */
        b.stored = fmaxf(amax, 1e-4f) / 448.0f;
        b.mult = 448.0f / fmaxf(amax, 1e-4f);
        break;
    case PARITY_FP8Q_TE:
    case PARITY_FP8Q_TE_POW2: {
        /* compute_scale_from_amax: scale = 448 / amax, FLT_MAX if that overflows, 1 for a zero
         * amax; power-of-two scales floor it (the exponent bits kept); stored 1 / scale */
        float m = amax > 0.0f ? 448.0f / amax : 1.0f;
        if (isinf(m)) m = FLT_MAX;
        if (rule == PARITY_FP8Q_TE_POW2) m = f32_floor_pow2(m);
        b.mult = m;
        b.stored = 1.0f / m;
        break;
    }
    }
    return b;
}

static int is_block_rule(int rule) { return rule >= PARITY_FP8Q_DEEPSEEK && rule <= PARITY_FP8Q_TE_POW2; }
static int is_mx_rule(int rule) { return rule == PARITY_FP8Q_MX_OCP || rule == PARITY_FP8Q_MX_RCEIL; }

/* E8M0 of a 1x32 block's amax. */
static uint8_t mx_scale_of(int rule, float amax) {
    if (rule == PARITY_FP8Q_MX_OCP) {
        /* floor(log2 amax) - emax(E4M3) = 8, from the exponent bits, clamped to [-127, 128] */
        int e = (int)((f32_bits(amax) >> 23) & 0xffu) - 127 - 8;
        if (e < -127) e = -127;
        if (e > 128) e = 128;
        return (uint8_t)(e + 127);
    }
    /* RCEIL (TE's float_to_e8m0 of amax * (1 / 448), rounded up to a power of two) */
    const uint32_t v = f32_bits(amax * (1.0f / 448.0f));
    const uint32_t exp = (v >> 23) & 0xffu, mant = v & 0x7fffffu;
    if (exp == 0xffu) return mant ? 0xff : 0xfe;
    const int up = mant > 0 && exp != 0xfeu && !(exp == 0 && mant <= 0x400000u);
    return (uint8_t)(exp + (uint32_t)up);
}

/* The multiplier the element step applies for an E8M0 scale: 2^(127 - biased) for the OCP
 * rule (torchao's reciprocal from the bits), TE's exp2f_rcp for RCEIL (1 for byte 0). */
static float mx_mult_of(int rule, uint8_t biased) {
    if (rule == PARITY_FP8Q_MX_RCEIL)
        return biased == 0 ? 1.0f : f32_from_bits((uint32_t)(254 - biased) << 23);
    const int e = 127 - (int)biased; /* in [-128, 127]; 2^-128 and below are subnormal */
    return ldexpf(1.0f, e);
}

static const char *const quantizer_names[] = {
    "deepseek", "sglang", "te", "deepgemm", "te-pow2", /* fp8-block */
    "ocp", "te",                                       /* MXFP8 */
    "modelopt", "te", "torchao",                       /* NVFP4 */
    "ocp", "rceil", "microxcaling",                    /* MXFP4 */
    "bitnet", "hf-bitlinear", "onebitllms",            /* ternary */
};
#define N_QUANTIZERS (int)(sizeof quantizer_names / sizeof quantizer_names[0])

const char *parity_fp8_quantizer_name(int quantizer) {
    return quantizer >= 0 && quantizer <= PARITY_FP8Q_MX_RCEIL ? quantizer_names[quantizer] : NULL;
}

const char *parity_quantizer_name(int quantizer) {
    return quantizer >= 0 && quantizer < N_QUANTIZERS ? quantizer_names[quantizer] : NULL;
}

/* The quantizers of a gemm format: [lo, hi] and the names for a message. */
static int format_rules(uint32_t gemm, int *lo, int *hi, const char **what, const char **names) {
    switch (gemm) {
    case PARITY_GEMM_FP8_BLOCK:
        *lo = PARITY_FP8Q_DEEPSEEK, *hi = PARITY_FP8Q_TE_POW2, *what = "fp8-block";
        *names = "deepseek, sglang, te, deepgemm, te-pow2";
        return 1;
    case PARITY_GEMM_MXFP8:
        *lo = PARITY_FP8Q_MX_OCP, *hi = PARITY_FP8Q_MX_RCEIL, *what = "mxfp8", *names = "ocp, te";
        return 1;
    case PARITY_GEMM_NVFP4:
        *lo = PARITY_QUANT_NVFP4_MODELOPT, *hi = PARITY_QUANT_NVFP4_TORCHAO, *what = "nvfp4";
        *names = "modelopt, te, torchao";
        return 1;
    case PARITY_GEMM_MXFP4:
        *lo = PARITY_QUANT_MXFP4_OCP, *hi = PARITY_QUANT_MXFP4_MICROXCALING, *what = "mxfp4";
        *names = "ocp, rceil, microxcaling";
        return 1;
    case PARITY_GEMM_TERNARY:
        *lo = PARITY_QUANT_TERNARY_BITNET, *hi = PARITY_QUANT_TERNARY_ONEBITLLMS, *what = "ternary";
        *names = "bitnet, hf-bitlinear, onebitllms";
        return 1;
    }
    return 0;
}

int quant_format_of(int quantizer) {
    for (uint32_t g = PARITY_GEMM_FP8_BLOCK; g <= PARITY_GEMM_TERNARY; g++) {
        int lo, hi;
        const char *what, *names;
        if (format_rules(g, &lo, &hi, &what, &names) && quantizer >= lo && quantizer <= hi)
            return (int)g;
    }
    return -1;
}

const char *quant_format_name(uint32_t gemm) {
    int lo, hi;
    const char *what, *names;
    return format_rules(gemm, &lo, &hi, &what, &names) ? what : NULL;
}

int parity_quantizer_from_name(uint32_t gemm, const char *name, int *out) {
    clear_error();
    if (!name || !out)
        return set_error(PARITY_ERR_INVALID_ARGUMENT, "parity_quantizer_from_name: NULL argument");
    int lo, hi;
    const char *what, *names;
    if (!format_rules(gemm, &lo, &hi, &what, &names))
        return set_error(PARITY_ERR_POLICY, "parity_quantizer_from_name: gemm %u is not a quantized "
                         "format (PARITY_GEMM_FP8_BLOCK .. PARITY_GEMM_TERNARY)", gemm);
    for (int q = lo; q <= hi; q++)
        if (!strcmp(name, quantizer_names[q])) {
            *out = q;
            return PARITY_OK;
        }
    return set_error(PARITY_ERR_POLICY, "unknown %s quantizer '%s' (%s)", what, name, names);
}

int parity_fp8_quantizer_from_name(int mx, const char *name, int *out) {
    return parity_quantizer_from_name(mx ? PARITY_GEMM_MXFP8 : PARITY_GEMM_FP8_BLOCK, name, out);
}

/* Shared argument checks; every value finite (a NaN or Inf is refused, naming the element). */
static int check_quant_args(const char *fn, size_t rows, size_t cols, const float *x,
                            size_t x_stride, const void *codes, size_t codes_stride,
                            const void *scales) {
    if (!x || !codes || !scales)
        return set_error(PARITY_ERR_INVALID_ARGUMENT, "%s: %s is NULL", fn,
                         !x ? "x" : !codes ? "codes" : "scales");
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

/* One block [r0, r1) x [c0, c1) of a block rule: its codes, and its stored scale returned. */
static float quantize_block(int quantizer, const float *x, size_t x_stride, size_t r0, size_t r1,
                            size_t c0, size_t c1, uint8_t *codes, size_t codes_stride) {
    float amax = 0.0f;
    for (size_t r = r0; r < r1; r++)
        for (size_t c = c0; c < c1; c++) amax = fmaxf(amax, fabsf(x[r * x_stride + c]));
    const block_scale b = block_scale_of(quantizer, amax);
    for (size_t r = r0; r < r1; r++)
        for (size_t c = c0; c < c1; c++) {
            const float v = x[r * x_stride + c];
            codes[r * codes_stride + c] = e4m3_from_f32_saturating(b.divide ? v / b.stored : v * b.mult);
        }
    return b.stored;
}

/* Every block_rows x block_cols block of a block rule; scales row-major over the grid. */
static void quantize_grid(int quantizer, size_t rows, size_t cols, const float *x, size_t x_stride,
                          size_t block_rows, size_t block_cols, uint8_t *codes, size_t codes_stride,
                          float *scales) {
    const size_t grid_cols = (cols + block_cols - 1) / block_cols;
    for (size_t r0 = 0; r0 < rows; r0 += block_rows)
        for (size_t c0 = 0; c0 < cols; c0 += block_cols) {
            const size_t r1 = r0 + block_rows < rows ? r0 + block_rows : rows;
            const size_t c1 = c0 + block_cols < cols ? c0 + block_cols : cols;
            scales[(r0 / block_rows) * grid_cols + c0 / block_cols] =
                quantize_block(quantizer, x, x_stride, r0, r1, c0, c1, codes, codes_stride);
        }
}

/* Every 1 x 32 block of an MX rule: codes, and the E8M0 scales as bytes (`bytes`) or as the
 * fp32 powers of two they mean (`pow2`), whichever is not NULL. */
static void quantize_mx(int quantizer, size_t rows, size_t cols, const float *x, size_t x_stride,
                        uint8_t *codes, size_t codes_stride, uint8_t *bytes, float *pow2) {
    const size_t grid_cols = (cols + 31) / 32;
    for (size_t r = 0; r < rows; r++)
        for (size_t c0 = 0; c0 < cols; c0 += 32) {
            const size_t c1 = c0 + 32 < cols ? c0 + 32 : cols;
            const float *xr = x + r * x_stride;
            float amax = 0.0f;
            for (size_t c = c0; c < c1; c++) amax = fmaxf(amax, fabsf(xr[c]));
            const uint8_t biased = mx_scale_of(quantizer, amax);
            const float mult = mx_mult_of(quantizer, biased);
            if (bytes) bytes[r * grid_cols + c0 / 32] = biased;
            if (pow2) pow2[r * grid_cols + c0 / 32] = ldexpf(1.0f, (int)biased - 127);
            for (size_t c = c0; c < c1; c++)
                codes[r * codes_stride + c] = e4m3_from_f32_saturating(xr[c] * mult);
        }
}

void fp8_quantize_rows(int quantizer, size_t rows, size_t cols, const float *x, size_t x_stride,
                       uint32_t block_rows, uint8_t *codes, size_t codes_stride, float *scales) {
    if (is_mx_rule(quantizer))
        quantize_mx(quantizer, rows, cols, x, x_stride, codes, codes_stride, NULL, scales);
    else
        quantize_grid(quantizer, rows, cols, x, x_stride, block_rows, 128, codes, codes_stride,
                      scales);
}

int parity_fp8_quantize_blocks(int quantizer, size_t rows, size_t cols, const float *x,
                               size_t x_stride, uint32_t block_rows, uint32_t block_cols,
                               uint8_t *codes, size_t codes_stride, float *scales) {
    static const char fn[] = "parity_fp8_quantize_blocks";
    clear_error();
    if (!is_block_rule(quantizer))
        return set_error(PARITY_ERR_POLICY, "%s: %d is not a block quantizer (PARITY_FP8Q_DEEPSEEK "
                         ".. PARITY_FP8Q_TE_POW2)", fn, quantizer);
    if (block_rows == 0 || block_cols == 0)
        return set_error(PARITY_ERR_INVALID_ARGUMENT, "%s: block %u x %u", fn, block_rows, block_cols);
    TRY(check_quant_args(fn, rows, cols, x, x_stride, codes, codes_stride, scales));
    quantize_grid(quantizer, rows, cols, x, x_stride, block_rows, block_cols, codes, codes_stride,
                  scales);
    return PARITY_OK;
}

int parity_mxfp8_quantize(int quantizer, size_t rows, size_t cols, const float *x,
                          size_t x_stride, uint8_t *codes, size_t codes_stride, uint8_t *scales) {
    static const char fn[] = "parity_mxfp8_quantize";
    clear_error();
    if (!is_mx_rule(quantizer))
        return set_error(PARITY_ERR_POLICY, "%s: %d is not an MXFP8 quantizer (PARITY_FP8Q_MX_OCP, "
                         "PARITY_FP8Q_MX_RCEIL)", fn, quantizer);
    TRY(check_quant_args(fn, rows, cols, x, x_stride, codes, codes_stride, scales));
    quantize_mx(quantizer, rows, cols, x, x_stride, codes, codes_stride, scales, NULL);
    return PARITY_OK;
}
