/*
 * The quantizers of TransformerEngine's NVFP4 training recipe beyond the forward's (parity.h,
 * "NVFP4 training"): parity_nvfp4_quantize_2d (weights in 16 x 16 tiles), parity_nvfp4_quantize_sr
 * (gradients, E2M1 rounded stochastically with bits from Philox4x32-10 keyed by the caller's
 * seed and stream and counted by the element's index) and parity_rht16 (the random Hadamard
 * transform of the weight gradient's inputs). The header cites TE's file and function for each
 * step; the arithmetic here is the header's, one fp32 rounding per operation.
 */
#include <math.h>

#include "base/errors.h"
#include "nvfp4.h"
#include "rules.h"

/* ---- Philox4x32-10 (Salmon et al. 2011; TE common/util/curanddx.hpp) ---------------------- */

/* The ten rounds of Philox4x32 on counter ctr under key (k0, k1), written to out: each round
 * multiplies words 0 and 2 by the two constants, mixes the high halves with words 1 and 3 and
 * the key, and bumps the key by the Weyl constants between rounds. */
static void philox4x32_10(const uint32_t ctr[4], uint32_t k0, uint32_t k1, uint32_t out[4]) {
    uint32_t c0 = ctr[0], c1 = ctr[1], c2 = ctr[2], c3 = ctr[3];
    for (int round = 0; round < 10; round++) {
        if (round) {
            k0 += 0x9E3779B9u;
            k1 += 0xBB67AE85u;
        }
        const uint64_t p0 = (uint64_t)0xD2511F53u * c0, p1 = (uint64_t)0xCD9E8D57u * c2;
        const uint32_t hi0 = (uint32_t)(p0 >> 32), lo0 = (uint32_t)p0;
        const uint32_t hi1 = (uint32_t)(p1 >> 32), lo1 = (uint32_t)p1;
        c0 = hi1 ^ c1 ^ k0;
        c1 = lo1;
        c2 = hi0 ^ c3 ^ k1;
        c3 = lo0;
    }
    out[0] = c0, out[1] = c1, out[2] = c2, out[3] = c3;
}

/* The 16 random bytes of element group g = i / 16 for (seed, stream): TE's init(seed,
 * subsequence = stream, offset = g) followed by generate4(), as little-endian words. */
static void sr_group_bytes(uint64_t seed, uint64_t stream, uint64_t g, uint8_t bytes[16]) {
    const uint32_t ctr[4] = {(uint32_t)g, (uint32_t)(g >> 32), (uint32_t)stream,
                             (uint32_t)(stream >> 32)};
    uint32_t w[4];
    philox4x32_10(ctr, (uint32_t)seed, (uint32_t)(seed >> 32), w);
    for (int k = 0; k < 16; k++) bytes[k] = (uint8_t)(w[k / 4] >> (8 * (k % 4)));
}

/* ---- stochastic rounding ---------------------------------------------------------------- */

/* v rounded to E2M1 stochastically with the 8 random bits `bits` (TE's stochastic_round_fp4_e2m1,
 * util/ptx.cuh): the grid step at |v|, |v| plus u times it, floored to the grid of the sum's
 * step, saturated at 6, v's sign. u * step is exact (8 bits times a power of two), so the sum
 * is rounded once whether or not the compiler fuses it. */
static uint8_t e2m1_stochastic(float v, uint8_t bits) {
    const float u = (float)bits * (1.0f / 256.0f);
    const float a = fabsf(v);
    const float step = a >= 4.0f ? 2.0f : a >= 2.0f ? 1.0f : 0.5f;
    const float t = a + u * step;
    const float step_t = t >= 4.0f ? 2.0f : t >= 2.0f ? 1.0f : 0.5f;
    const float q = fminf(floorf(t / step_t) * step_t, 6.0f);
    return e2m1_from_f32(copysignf(q, v), 0);
}

/* The value a block's round-to-nearest step would cast (nvfp4_element's operand). */
static float nvfp4_scaled(const nvfp4_step *step, float x) {
    switch (step->codes) {
    case NVFP4_CODES_DIVIDE:
        return x / step->factor;
    case NVFP4_CODES_MULTIPLY:
        return x * step->factor;
    case NVFP4_CODES_DIVIDE_CLAMPED:
        return fminf(fmaxf(x / step->factor, -6.0f), 6.0f);
    }
    return 0.0f;
}

/* One row of `cols` values under the tensor entry t, its elements numbered from `first`. */
static void sr_row(int rule, const nvfp4_tensor *t, size_t cols, const float *x, uint64_t seed,
                   uint64_t stream, uint64_t first, uint8_t *codes, uint8_t *sf) {
    uint8_t bytes[16];
    uint64_t group = UINT64_MAX;
    for (size_t c0 = 0; c0 < cols; c0 += 16) {
        const size_t n = cols - c0 < 16 ? cols - c0 : 16;
        const nvfp4_step step = nvfp4_block_step(rule, t, quant_amax(x + c0, n));
        sf[c0 / 16] = step.sf;
        for (size_t c = c0; c < c0 + n; c++) {
            if (step.codes == NVFP4_CODES_ZERO) {
                codes[c] = 0;
                continue;
            }
            const uint64_t i = first + c;
            if (i / 16 != group) sr_group_bytes(seed, stream, group = i / 16, bytes);
            codes[c] = e2m1_stochastic(nvfp4_scaled(&step, x[c]), bytes[i % 16]);
        }
    }
}

int parity_nvfp4_quantize_sr(int quantizer, int per_row, size_t rows, size_t cols,
                             const float *x, size_t ldx, uint64_t seed, uint64_t stream,
                             uint8_t *codes, size_t ldc, uint8_t *sf, float *s2) {
    TRY(quant_check_call("parity_nvfp4_quantize_sr", quantizer, PARITY_GEMM_NVFP4, per_row, rows,
                         cols, x, ldx, codes, ldc, sf, s2, "sf or s2"));
    const size_t grid = (cols + 15) / 16;
    float amax = 0.0f;
    for (size_t r = 0; !per_row && r < rows; r++) amax = fmaxf(amax, quant_amax(x + r * ldx, cols));
    for (size_t r = 0; r < rows; r++) {
        const float *xr = x + r * ldx;
        const nvfp4_tensor t = nvfp4_tensor_of(quantizer, per_row ? quant_amax(xr, cols) : amax);
        sr_row(quantizer, &t, cols, xr, seed, stream, (uint64_t)r * cols, codes + r * ldc,
               sf + r * grid);
        if (per_row || r == 0) s2[per_row ? r : 0] = t.s2;
    }
    return PARITY_OK;
}

/* ---- 16 x 16 tiles ---------------------------------------------------------------------- */

int parity_nvfp4_quantize_2d(int quantizer, size_t rows, size_t cols, const float *x,
                             size_t ldx, uint8_t *codes, size_t ldc, uint8_t *sf, float *s2) {
    TRY(quant_check_call("parity_nvfp4_quantize_2d", quantizer, PARITY_GEMM_NVFP4, -1, rows, cols,
                         x, ldx, codes, ldc, sf, s2, "sf or s2"));
    nvfp4_quantize_tiles(quantizer, rows, cols, x, ldx, codes, ldc, sf, NULL, NULL, s2);
    return PARITY_OK;
}

/* ---- the random Hadamard transform ------------------------------------------------------ */

/* TE's hard-coded wgrad signs (nvfp4_tensor.py get_wgrad_sign_vector) as a mask, bit i set
 * where sign i is -1 (get_sign_from_vector's mask). */
#define TE_WGRAD_SIGN_MASK 0xD7E8u

/* The sign mask of sign_seed: TE's for 0, else the low 16 bits of Philox4x32-10's first word
 * for key sign_seed and counter 0. */
static uint32_t rht_sign_mask(uint64_t sign_seed) {
    if (!sign_seed) return TE_WGRAD_SIGN_MASK;
    const uint32_t ctr[4] = {0, 0, 0, 0};
    uint32_t w[4];
    philox4x32_10(ctr, (uint32_t)sign_seed, (uint32_t)(sign_seed >> 32), w);
    return w[0] & 0xffffu;
}

/* One block of 16 in place: signs, the four butterfly stages, the 1/4. */
static void rht_block(float v[16], uint32_t mask) {
    for (int i = 0; i < 16; i++)
        if (mask >> i & 1u) v[i] = -v[i];
    for (int h = 1; h < 16; h *= 2)
        for (int j0 = 0; j0 < 16; j0 += 2 * h)
            for (int j = j0; j < j0 + h; j++) {
                const float a = v[j], b = v[j + h];
                v[j] = a + b;
                v[j + h] = a - b;
            }
    for (int i = 0; i < 16; i++) v[i] *= 0.25f;
}

int parity_rht16(size_t rows, size_t cols, const float *x, size_t ldx, uint64_t sign_seed,
                 float *out, size_t ldo) {
    static const char fn[] = "parity_rht16";
    clear_error();
    if (!x || !out)
        return set_error(PARITY_ERR_INVALID_ARGUMENT, "%s: %s is NULL", fn, !x ? "x" : "out");
    if (rows == 0 || cols == 0 || cols % 16)
        return set_error(PARITY_ERR_INVALID_ARGUMENT, "%s: %zu x %zu values (cols must be a "
                         "positive multiple of 16)", fn, rows, cols);
    if (ldx < cols || ldo < cols)
        return set_error(PARITY_ERR_INVALID_ARGUMENT, "%s: a row stride (x %zu, out %zu) is "
                         "below cols %zu", fn, ldx, ldo, cols);
    if (out == x && ldo != ldx)
        return set_error(PARITY_ERR_INVALID_ARGUMENT, "%s: out is x with another stride (x %zu, "
                         "out %zu)", fn, ldx, ldo);
    for (size_t r = 0; r < rows; r++)
        for (size_t c = 0; c < cols; c++)
            if (!isfinite(x[r * ldx + c]))
                return set_error(PARITY_ERR_TENSOR_NONFINITE, "%s: x[%zu][%zu] is %s", fn, r, c,
                                 isnan(x[r * ldx + c]) ? "NaN" : "Inf");
    const uint32_t mask = rht_sign_mask(sign_seed);
    for (size_t r = 0; r < rows; r++)
        for (size_t c0 = 0; c0 < cols; c0 += 16) {
            float v[16];
            for (int i = 0; i < 16; i++) v[i] = x[r * ldx + c0 + (size_t)i];
            rht_block(v, mask);
            for (int i = 0; i < 16; i++) out[r * ldo + c0 + (size_t)i] = v[i];
        }
    return PARITY_OK;
}
