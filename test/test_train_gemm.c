/* The training GEMM on pre-quantized operands (parity_quant_gemm) against a straightforward
 * reference written here: codes decoded by the public codecs, each block's dot summed exactly
 * in __int128 units of 2^-32 (every product of the formats' values is a multiple of it),
 * converted to fp32 by the compiler, then the fp32 chain of the scale products; for every
 * element pair, partial blocks, 16 x 16 NVFP4 scale grids, per-row and per-tensor globals,
 * non-finite codes, on every CPU path and two pool sizes (E4M3 x E4M3 runs the forward's
 * MXFP8 GEMM and its SIMD variants, the others the training GEMM's own loop); its refusals;
 * and the MX E5M2 quantizer (parity_mxfp8_quantize_as). */
#include <math.h>
#include <stdint.h>

#include "check.h"
#include "parity.h"

static uint64_t rng_state = 0x9e3779b97f4a7c15ull;
static uint32_t rnd(void) {
    rng_state = rng_state * 6364136223846793005ull + 1442695040888963407ull;
    return (uint32_t)(rng_state >> 33);
}

/* The value of a code of an operand. */
static float value_of(const parity_quant_operand *o, uint8_t code) {
    float v;
    if (o->format == PARITY_GEMM_NVFP4)
        parity_fp4_to_f32(1, &code, &v);
    else
        parity_fp8_to_f32((int)o->element, 1, &code, &v);
    return v;
}

static float scale_value(const parity_quant_operand *o, size_t r, size_t kb) {
    const uint8_t byte = o->scales[(r / o->scale_rows) * o->scales_stride + kb];
    if (o->format == PARITY_GEMM_NVFP4) {
        float v;
        parity_fp8_to_f32(PARITY_FP8_E4M3, 1, &byte, &v);
        return v;
    }
    return ldexpf(1.0f, (int)byte - 127);
}

static void reference(size_t m, size_t n, size_t k, const parity_quant_operand *a,
                      const parity_quant_operand *b, float *y) {
    const size_t block = a->format == PARITY_GEMM_NVFP4 ? 16 : 32;
    for (size_t i = 0; i < m; i++)
        for (size_t j = 0; j < n; j++) {
            float acc = 0.0f;
            for (size_t k0 = 0; k0 < k; k0 += block) {
                __int128 s = 0;
                int nan = 0;
                for (size_t t = k0; t < k0 + block && t < k; t++) {
                    const float va = value_of(a, a->codes[i * a->codes_stride + t]);
                    const float vb = value_of(b, b->codes[j * b->codes_stride + t]);
                    if (!isfinite(va) || !isfinite(vb)) nan = 1;
                    else
                        s += (__int128)(int64_t)ldexp(va, 16) * (int64_t)ldexp(vb, 16);
                }
                const float d = nan ? NAN : ldexpf((float)s, -32);
                acc = acc + (d * scale_value(a, i, k0 / block)) * scale_value(b, j, k0 / block);
            }
            if (a->format == PARITY_GEMM_NVFP4)
                acc = acc * (a->globals[a->per_row_globals ? i : 0] *
                             b->globals[b->per_row_globals ? j : 0]);
            y[i * n + j] = acc;
        }
}

/* Random finite codes of the operand's element (every magnitude, the largest ones often). */
static void fill_codes(parity_quant_operand *o, uint8_t *codes, size_t rows, size_t k) {
    for (size_t i = 0; i < rows * k; i++) {
        uint8_t c;
        if (o->format == PARITY_GEMM_NVFP4) {
            c = (uint8_t)(rnd() & 0xf);
        } else {
            do {
                c = (uint8_t)(rnd() % 5 == 0 ? (rnd() & 0x80) | (o->element ? 0x7b : 0x7e)
                                             : rnd() & 0xff);
            } while (!isfinite(value_of(o, c)));
        }
        codes[i] = c;
    }
    o->codes = codes;
    o->codes_stride = k;
}

/* The result on every CPU path and two pool sizes, each bitwise the reference. */
static void check_all_paths(size_t m, size_t n, size_t k, const parity_quant_operand *a,
                            const parity_quant_operand *b, const char *what) {
    float *want = malloc(m * n * sizeof *want), *got = malloc(m * n * sizeof *got);
    reference(m, n, k, a, b, want);
    parity_pool *pool;
    CHECK_OK(parity_pool_create(2, &pool));
    const parity_cpu_path saved = parity_get_cpu_path();
    for (int p = PARITY_CPU_PORTABLE; p <= PARITY_CPU_AVX512BF16; p++) {
        if (parity_set_cpu_path((parity_cpu_path)p) != PARITY_OK) continue;
        for (int threads = 1; threads <= 2; threads++) {
            memset(got, 0xff, m * n * sizeof *got);
            CHECK_OK(parity_quant_gemm(threads == 2 ? pool : NULL, m, n, k, a, b, got, n));
            CHECK_BITS_F32(got, want, m * n, what);
        }
    }
    parity_set_cpu_path(saved);
    parity_pool_free(pool);
    free(want);
    free(got);
}

static void test_mx(uint32_t ea, uint32_t eb, size_t m, size_t n, size_t k, const char *what) {
    const size_t nb = (k + 31) / 32;
    uint8_t *ac = malloc(m * k), *bc = malloc(n * k), *as = malloc(m * nb), *bs = malloc(n * nb);
    parity_quant_operand a = {PARITY_GEMM_MXFP8, ea, NULL, 0, as, nb, 1, 0, NULL};
    parity_quant_operand b = {PARITY_GEMM_MXFP8, eb, NULL, 0, bs, nb, 1, 0, NULL};
    fill_codes(&a, ac, m, k);
    fill_codes(&b, bc, n, k);
    for (size_t i = 0; i < m * nb; i++) as[i] = (uint8_t)(110 + rnd() % 30);
    for (size_t i = 0; i < n * nb; i++) bs[i] = (uint8_t)(110 + rnd() % 30);
    check_all_paths(m, n, k, &a, &b, what);
    free(ac);
    free(bc);
    free(as);
    free(bs);
}

/* A block whose exact sum needs more than a double's 53 bits: the largest E5M2 products and
 * one smallest, which a double sum would lose. */
static void test_wide_sums(void) {
    uint8_t ac[32], bc[32], s = 127;
    for (int i = 0; i < 32; i++) ac[i] = bc[i] = 0x7b; /* 57344 */
    ac[31] = 0x01;                                       /* 2^-16 */
    bc[31] = 0x01;
    ac[30] = 0xfb;                                       /* -57344 */
    parity_quant_operand a = {PARITY_GEMM_MXFP8, PARITY_FP8_E5M2, ac, 32, &s, 1, 1, 0, NULL};
    parity_quant_operand b = {PARITY_GEMM_MXFP8, PARITY_FP8_E5M2, bc, 32, &s, 1, 1, 0, NULL};
    check_all_paths(1, 1, 32, &a, &b, "E5M2 x E5M2 wide block");
    float y;
    CHECK_OK(parity_quant_gemm(NULL, 1, 1, 32, &a, &b, &y, 1));
    /* 29 * 57344^2 + 2^-32, rounded once to fp32: 29 * 57344^2 (its fp32 neighbours are far) */
    CHECK(y == 29.0f * 57344.0f * 57344.0f);
    b.element = PARITY_FP8_E4M3;
    for (int i = 0; i < 32; i++) bc[i] = 0x7e; /* 448 */
    bc[31] = 0x01;                             /* 2^-9 */
    check_all_paths(1, 1, 32, &a, &b, "E5M2 x E4M3 wide block");
}

/* Sums exactly halfway between two fp32 values: 2^16 + 2^-8 ties to 2^16 (even), 2^16 + 2^-8
 * + 2^-7 to 2^16 + 2^-6; the E5M2 x E5M2 path the same way. */
static void test_ties(void) {
    uint8_t a1[3] = {0x78, 0x00, 0x00}, b1[3] = {0x78, 0x40, 0x00}, s = 127;
    uint8_t fp8[3];
    const float av[3] = {256.0f, 0x1p-9f, 0.0f}, bv[3] = {256.0f, 2.0f, 2.0f};
    parity_fp8_from_f32(PARITY_FP8_E4M3, 1, 3, av, a1);
    parity_fp8_from_f32(PARITY_FP8_E4M3, 1, 3, bv, b1);
    parity_quant_operand a = {PARITY_GEMM_MXFP8, PARITY_FP8_E4M3, a1, 3, &s, 1, 1, 0, NULL};
    parity_quant_operand b = {PARITY_GEMM_MXFP8, PARITY_FP8_E4M3, b1, 3, &s, 1, 1, 0, NULL};
    float y;
    CHECK_OK(parity_quant_gemm(NULL, 1, 1, 3, &a, &b, &y, 1));
    CHECK(y == 65536.0f);
    const float a3[3] = {256.0f, 0x1p-9f, 0x1p-8f};
    parity_fp8_from_f32(PARITY_FP8_E4M3, 1, 3, a3, a1);
    CHECK_OK(parity_quant_gemm(NULL, 1, 1, 3, &a, &b, &y, 1));
    CHECK(y == 65536.0f + 0x1p-6f);
    check_all_paths(1, 1, 3, &a, &b, "E4M3 ties");
    /* E5M2: 2^15 * 2^15 + 2^-16 * 2^-8 (= 2^30 + 2^-24: far below half an ulp) and a tie */
    const float e1[3] = {32768.0f, 0x1p-16f, 0.0f}, e2[3] = {32768.0f, 0x1p8f, 0.0f};
    parity_fp8_from_f32(PARITY_FP8_E5M2, 1, 3, e1, fp8);
    memcpy(a1, fp8, 3);
    parity_fp8_from_f32(PARITY_FP8_E5M2, 1, 3, e2, fp8);
    memcpy(b1, fp8, 3);
    a.element = b.element = PARITY_FP8_E5M2;
    CHECK_OK(parity_quant_gemm(NULL, 1, 1, 3, &a, &b, &y, 1));
    CHECK(y == 0x1p30f);
    const float e3[3] = {32768.0f, 0x1p-1f, 0x1p-16f}, e4[3] = {32768.0f, 0x1p7f, 0x1p-16f};
    parity_fp8_from_f32(PARITY_FP8_E5M2, 1, 3, e3, a1);
    parity_fp8_from_f32(PARITY_FP8_E5M2, 1, 3, e4, b1);
    /* 2^30 + 2^6 + 2^-32: just above the tie 2^30 + 2^6, so up to 2^30 + 2^7 */
    CHECK_OK(parity_quant_gemm(NULL, 1, 1, 3, &a, &b, &y, 1));
    CHECK(y == 0x1p30f + 0x1p7f);
    check_all_paths(1, 1, 3, &a, &b, "E5M2 ties");
}

static void test_nvfp4(uint32_t scale_rows, int per_row_a, int per_row_b) {
    const size_t m = 6, n = 20, k = 40, nb = 3;
    uint8_t ac[6 * 40], bc[20 * 40], as[6 * 3], bs[20 * 3];
    float ga[6], gb[20];
    parity_quant_operand a = {PARITY_GEMM_NVFP4, 0, NULL, 0, as, nb, 1, (uint32_t)per_row_a, ga};
    parity_quant_operand b = {PARITY_GEMM_NVFP4, 0, NULL, 0, bs, nb, scale_rows,
                              (uint32_t)per_row_b, gb};
    fill_codes(&a, ac, m, k);
    fill_codes(&b, bc, n, k);
    for (size_t i = 0; i < sizeof as; i++) as[i] = (uint8_t)(rnd() % 0x7e);
    for (size_t i = 0; i < sizeof bs; i++) bs[i] = (uint8_t)(rnd() % 0x7e);
    for (size_t i = 0; i < m; i++) ga[i] = (float)(rnd() % 1000 + 1) * 1e-5f;
    for (size_t i = 0; i < n; i++) gb[i] = (float)(rnd() % 1000 + 1) * 3e-6f;
    check_all_paths(m, n, k, &a, &b, "NVFP4");
}

static void test_nonfinite(void) {
    uint8_t ac[64], bc[64], s[2] = {127, 127};
    for (int i = 0; i < 64; i++) ac[i] = bc[i] = 0x38;
    ac[40] = 0x7f; /* E4M3 NaN in the second block */
    parity_quant_operand a = {PARITY_GEMM_MXFP8, PARITY_FP8_E4M3, ac, 64, s, 2, 1, 0, NULL};
    parity_quant_operand b = {PARITY_GEMM_MXFP8, PARITY_FP8_E5M2, bc, 64, s, 2, 1, 0, NULL};
    float y = 0;
    CHECK_OK(parity_quant_gemm(NULL, 1, 1, 64, &a, &b, &y, 1));
    CHECK(isnan(y));
    b.element = PARITY_FP8_E4M3; /* E4M3 x E4M3 runs the forward's MXFP8 GEMM: NaN there too */
    CHECK_OK(parity_quant_gemm(NULL, 1, 1, 64, &a, &b, &y, 1));
    CHECK(isnan(y));
    check_all_paths(1, 1, 64, &a, &b, "E4M3 NaN block");
    b.element = PARITY_FP8_E5M2;
    ac[40] = 0x38;
    bc[3] = 0x7c; /* E5M2 infinity */
    CHECK_OK(parity_quant_gemm(NULL, 1, 1, 64, &a, &b, &y, 1));
    CHECK(isnan(y));
}

static void test_refusals(void) {
    uint8_t c[32] = {0}, s[2] = {127, 127}; /* one MX block of 32, two NVFP4 blocks of 16 */
    float g = 1.0f, y;
    parity_quant_operand mx = {PARITY_GEMM_MXFP8, PARITY_FP8_E4M3, c, 32, s, 1, 1, 0, NULL};
    parity_quant_operand nv = {PARITY_GEMM_NVFP4, 0, c, 32, s, 2, 1, 0, &g};
    CHECK_STATUS(parity_quant_gemm(NULL, 1, 1, 32, &mx, &nv, &y, 1), PARITY_ERR_INVALID_ARGUMENT);
    CHECK_STATUS(parity_quant_gemm(NULL, 1, 1, 32, NULL, &mx, &y, 1), PARITY_ERR_INVALID_ARGUMENT);
    CHECK_STATUS(parity_quant_gemm(NULL, 1, 1, 32, &mx, &mx, NULL, 1),
                 PARITY_ERR_INVALID_ARGUMENT);
    CHECK_STATUS(parity_quant_gemm(NULL, 0, 1, 32, &mx, &mx, &y, 1), PARITY_ERR_INVALID_ARGUMENT);
    parity_quant_operand bad = mx;
    bad.element = 7;
    CHECK_STATUS(parity_quant_gemm(NULL, 1, 1, 32, &bad, &mx, &y, 1),
                 PARITY_ERR_INVALID_ARGUMENT);
    bad = mx;
    bad.scale_rows = 16;
    CHECK_STATUS(parity_quant_gemm(NULL, 1, 1, 32, &mx, &bad, &y, 1),
                 PARITY_ERR_INVALID_ARGUMENT);
    bad = mx;
    bad.globals = &g;
    CHECK_STATUS(parity_quant_gemm(NULL, 1, 1, 32, &mx, &bad, &y, 1),
                 PARITY_ERR_INVALID_ARGUMENT);
    CHECK_STATUS(parity_quant_gemm(NULL, 1, 1, 33, &mx, &mx, &y, 1), PARITY_ERR_INVALID_ARGUMENT);
    CHECK_OK(parity_quant_gemm(NULL, 1, 1, 32, &nv, &nv, &y, 1));
    c[5] = 0x10;
    CHECK_STATUS(parity_quant_gemm(NULL, 1, 1, 32, &nv, &nv, &y, 1), PARITY_ERR_INVALID_ARGUMENT);
    CHECK(strstr(parity_last_error(), "[0][5]") != NULL);
    bad = nv;
    bad.globals = NULL;
    c[5] = 0;
    CHECK_STATUS(parity_quant_gemm(NULL, 1, 1, 32, &nv, &bad, &y, 1),
                 PARITY_ERR_INVALID_ARGUMENT);
}

/* parity_mxfp8_quantize_as: E4M3 as parity_mxfp8_quantize; E5M2 with the rules' formulas. */
static void test_quantize_e5m2(void) {
    enum { R = 3, C = 40 };
    float x[R * C];
    for (int i = 0; i < R * C; i++) x[i] = ((float)(int)(rnd() % 20001) - 10000.0f) * 0.37f;
    x[5] = 0.0f;
    for (int i = C; i < C + 32; i++) x[i] = 0.0f; /* an all-zero block */
    uint8_t c1[R * C], c2[R * C], s1[R * 2], s2[R * 2];
    for (int q = PARITY_FP8Q_MX_OCP; q <= PARITY_FP8Q_MX_RCEIL; q++) {
        CHECK_OK(parity_mxfp8_quantize(q, R, C, x, C, c1, C, s1));
        CHECK_OK(parity_mxfp8_quantize_as(q, PARITY_FP8_E4M3, R, C, x, C, c2, C, s2));
        CHECK(!memcmp(c1, c2, sizeof c1) && !memcmp(s1, s2, sizeof s1));
        CHECK_OK(parity_mxfp8_quantize_as(q, PARITY_FP8_E5M2, R, C, x, C, c2, C, s2));
        for (int r = 0; r < R; r++)
            for (int b = 0; b < 2; b++) {
                float amax = 0.0f;
                for (int i = b * 32; i < C && i < b * 32 + 32; i++)
                    amax = fmaxf(amax, fabsf(x[r * C + i]));
                int e;
                if (q == PARITY_FP8Q_MX_OCP) {
                    e = amax == 0.0f ? -127 : ilogbf(amax) - 15;
                } else {
                    const float v = amax * (1.0f / 57344.0f);
                    e = v == 0.0f ? -127 : ilogbf(v) + (ldexpf(1.0f, ilogbf(v)) != v);
                }
                CHECK_INT(s2[r * 2 + b], e + 127);
                const float m = ldexpf(1.0f, -e);
                for (int i = b * 32; i < C && i < b * 32 + 32; i++) {
                    uint8_t want;
                    const float scaled = x[r * C + i] * m;
                    parity_fp8_from_f32(PARITY_FP8_E5M2, 1, 1, &scaled, &want);
                    CHECK_INT(c2[r * C + i], want);
                }
            }
    }
    x[7] = NAN;
    CHECK_STATUS(parity_mxfp8_quantize_as(PARITY_FP8Q_MX_OCP, PARITY_FP8_E5M2, R, C, x, C, c2, C,
                                          s2),
                 PARITY_ERR_TENSOR_NONFINITE);
    x[7] = 1.0f;
    CHECK_STATUS(parity_mxfp8_quantize_as(PARITY_FP8Q_MX_OCP, 2, R, C, x, C, c2, C, s2),
                 PARITY_ERR_INVALID_ARGUMENT);
    CHECK_STATUS(parity_mxfp8_quantize_as(PARITY_FP8Q_TE, PARITY_FP8_E5M2, R, C, x, C, c2, C,
                                          s2),
                 PARITY_ERR_POLICY);
}

int main(void) {
    test_mx(PARITY_FP8_E4M3, PARITY_FP8_E4M3, 5, 7, 70, "MX E4M3 x E4M3");
    test_mx(PARITY_FP8_E4M3, PARITY_FP8_E4M3, 70, 40, 100, "MX E4M3 x E4M3, whole tiles");
    test_mx(PARITY_FP8_E5M2, PARITY_FP8_E4M3, 5, 7, 70, "MX E5M2 x E4M3");
    test_mx(PARITY_FP8_E4M3, PARITY_FP8_E5M2, 5, 7, 70, "MX E4M3 x E5M2");
    test_mx(PARITY_FP8_E5M2, PARITY_FP8_E5M2, 5, 7, 70, "MX E5M2 x E5M2");
    test_mx(PARITY_FP8_E5M2, PARITY_FP8_E4M3, 33, 20, 96, "MX E5M2 x E4M3, larger");
    test_wide_sums();
    test_ties();
    test_nvfp4(1, 1, 0);
    test_nvfp4(16, 0, 0);
    test_nvfp4(16, 1, 1);
    test_nonfinite();
    test_refusals();
    test_quantize_e5m2();
    return check_report("train_gemm");
}
