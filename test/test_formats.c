/* fp16, fp8 and fp4 (E2M1) element conversions, exhaustively (and the FP8 quantizers' names, answers by
 * hand and refusals; their known answers are test/python/test_quant.py's): fp32 -> fp16 (the public function and every
 * kernel table's round_fp16) and fp32 -> E4M3 / E5M2 (saturating and not) on all 2^32
 * inputs, against a reference computed on values rather than bits: |x| is split into its
 * binade, the quantum of the target format there is a power of two, and the magnitude is
 * rounded to a multiple of it in double by the add-and-subtract of 2^52 (round to nearest
 * even in the default rounding mode); the result is then encoded from its value. The two
 * share no step with the library's integer carries. fp16 -> fp32 and fp8 -> fp32 on every
 * code against a decoding from the fields. fp32 -> E2M1 (nearest even and half away) on all
 * 2^32 inputs (NaN refused) against the same kind of reference. "All 2^32" means: every input
 * of the binades where some target format has codes or rounds to one (|x| from 2^-40 to
 * 2^25: below, everything flushes to zero; above, everything overflows or saturates) and of
 * the two special exponents (zeros and subnormals, infinities and NaNs); every 61st fraction of
 * the other binades, which only repeat the flush and the overflow. The sweep is split across
 * two threads, one sign each. */
#include <math.h>
#include <pthread.h>
#include <string.h>

#include "check.h"
#include "base/floats.h"
#include "kernels/kernels.h"

/* A target format, by its numbers: fraction bits, smallest normal exponent, largest finite
 * value and code, what overflow gives without saturation, the NaN code, the sign bit. */
typedef struct target {
    int mbits, emin;
    double max;
    uint32_t max_code, overflow_code, nan_code, sign;
} target;

static const target FP16 = {10, -14, 65504.0, 0x7bff, 0x7c00, 0x7e00, 0x8000};
static const target E4M3 = {3, -6, 448.0, 0x7e, 0x7f, 0x7f, 0x80};
static const target E5M2 = {2, -14, 57344.0, 0x7b, 0x7c, 0x7f, 0x80};

/* Round to nearest even of a double y with 0 <= y < 2^52. */
static double rne(double y) {
    const double big = 4503599627370496.0; /* 2^52 */
    volatile double t = y + big;           /* volatile: no algebraic folding */
    return t - big;
}

/* 2^e for e in [-160, 160], built once with ldexp. */
static double pow2_table[321];
static double pow2(int e) { return pow2_table[e + 160]; }

/* The codes of fp32 bits u in format t, saturating (*sat) and not (*raw): one rounding. */
static void want_codes(const target *t, uint32_t u, uint32_t *sat, uint32_t *raw) {
    const uint32_t sign = u >> 31 ? t->sign : 0;
    const float x = f32_from_bits(u);
    if (isnan(x)) {
        *sat = *raw = (t == &FP16 ? 0 : sign) | t->nan_code; /* fp16: one NaN, 0x7e00 */
        return;
    }
    *sat = sign | t->max_code, *raw = sign | t->overflow_code;
    if (isinf(x)) return;
    const double a = fabs((double)x);
    /* the binade of a (an fp32 subnormal is below every emin here), and the quantum of the
     * format there, the subnormal quantum below emin */
    int e = (int)((u >> 23) & 0xffu) - 127;
    if (e < t->emin) e = t->emin;
    const double n = rne(a * pow2(t->mbits - e)); /* exact: a power of two */
    const double v = n * pow2(e - t->mbits);
    if (v > t->max) return;
    uint32_t code;
    if (v == 0)
        code = sign;
    else if (v < pow2(t->emin)) /* subnormal: n quanta */
        code = sign | (uint32_t)n;
    else { /* encode v from its value: its binade is e, or e + 1 when the rounding carried */
        const int ev = v >= pow2(e + 1) ? e + 1 : e;
        const uint32_t frac = (uint32_t)((v * pow2(-ev) - 1.0) * pow2(t->mbits));
        code = sign | (uint32_t)(ev + 1 - t->emin) << t->mbits | frac;
    }
    *sat = *raw = code;
}

static uint32_t want_code(const target *t, uint32_t u, int saturate) {
    uint32_t sat, raw;
    want_codes(t, u, &sat, &raw);
    return saturate ? sat : raw;
}

/* The E2M1 code of fp32 bits u (not NaN), the same way: the quantum of E2M1 in u's binade
 * (emin 0: 0.5 below 1), the magnitude rounded to a multiple of it in double — to nearest
 * even, or half away from zero by floor(y + 1/2) — saturated at 6, and encoded by looking its
 * value up among the eight magnitudes. */
static uint32_t want_fp4(uint32_t u, int away) {
    static const double mags[8] = {0, 0.5, 1, 1.5, 2, 3, 4, 6};
    const uint32_t sign = u >> 31 ? 0x8u : 0u;
    int e = (int)((u >> 23) & 0xffu) - 127;
    if (e >= 3) return sign | 7u;  /* |x| >= 8 (infinity included): beyond 6 */
    if (e < -3) return sign;       /* |x| < 1/8: below half of 0.5 */
    const float x = f32_from_bits(u);
    if (e < 0) e = 0;
    const double y = fabs((double)x) * pow2(1 - e);
    const double v = (away ? floor(y + 0.5) : rne(y)) * pow2(e - 1);
    if (v > 6.0) return sign | 7u;
    for (uint32_t k = 0; k < 8; k++)
        if (v == mags[k]) return sign | k;
    return 0xffu; /* not a magnitude: the reference is wrong */
}

static uint64_t quick_step = 1; /* 1, or a prime in quick mode: one input in it */

/* The step within a biased fp32 exponent's binade: 1 where a target format has codes or
 * rounds to one (or the exponent is special), 61 where every input flushes or overflows. */
static uint64_t binade_step(uint32_t biased_exp) {
    const int e = (int)biased_exp - 127;
    const int dense = biased_exp == 0 || biased_exp == 255 || (e >= -40 && e <= 24);
    return (dense ? 1 : 61) * quick_step;
}

#define N_SWEEPS 10
typedef struct sweep {
    uint64_t begin, end;
    uint64_t bad[N_SWEEPS];
    uint32_t first_bad[N_SWEEPS];
} sweep;

enum { PUBLIC_FP16, TABLE_PORTABLE, TABLE_AVX2, TABLE_AVX512, E4M3_SAT, E4M3_RAW, E5M2_SAT, E5M2_RAW,
       FP4_RNE, FP4_AWAY };
static const char *const names[N_SWEEPS] = {"parity_fp16_from_f32", "round_fp16 (portable)",
                                            "round_fp16 (avx2)", "round_fp16 (avx512)",
                                            "E4M3 saturating", "E4M3 non-saturating",
                                            "E5M2 saturating", "E5M2 non-saturating",
                                            "E2M1 nearest even", "E2M1 half away"};
static const kernels *tables[3]; /* portable, avx2, avx512 where this CPU has them */

static void count(sweep *s, int what, uint32_t got, uint32_t want, uint32_t u) {
    if (got == want) return;
    if (!s->bad[what]) s->first_bad[what] = u;
    s->bad[what]++;
}

static void *sweep_run(void *arg) {
    sweep *s = arg;
    enum { BLOCK = 4096 };
    float x[BLOCK], y[BLOCK];
    uint32_t u[BLOCK];
    uint8_t c8[BLOCK];
    uint64_t v = s->begin;
    while (v < s->end) {
        /* a block of inputs within one binade, at its step */
        const uint64_t binade_end = (v | ((1ull << 23) - 1)) + 1;
        const uint64_t step = binade_step((uint32_t)(v >> 23) & 0xff);
        size_t n = 0;
        for (; n < BLOCK && v < binade_end && v < s->end; n++, v += step) u[n] = (uint32_t)v;
        if (v >= binade_end) v = binade_end;
        for (size_t i = 0; i < n; i++) x[i] = f32_from_bits(u[i]);
        uint32_t want16[BLOCK];
        for (size_t i = 0; i < n; i++) {
            want16[i] = want_code(&FP16, u[i], 0);
            count(s, PUBLIC_FP16, parity_fp16_from_f32(x[i]), want16[i], u[i]);
        }
        for (int t = 0; t < 3; t++) {
            if (!tables[t]) continue;
            memcpy(y, x, n * sizeof *y);
            tables[t]->round_fp16(y, n);
            for (size_t i = 0; i < n; i++) {
                /* round_fp16 holds the value in fp32: it must be the widened code */
                count(s, TABLE_PORTABLE + t, f32_bits(y[i]),
                      f32_bits(f16_to_f32((uint16_t)want16[i])), u[i]);
            }
        }
        const struct {
            int format, what;
            const target *t;
        } fp8[] = {{PARITY_FP8_E4M3, E4M3_SAT, &E4M3}, {PARITY_FP8_E5M2, E5M2_SAT, &E5M2}};
        uint8_t raw8[BLOCK];
        for (int f = 0; f < 2; f++) {
            /* saturating and not, both against one rounding of the reference */
            if (parity_fp8_from_f32(fp8[f].format, 1, n, x, c8) != PARITY_OK ||
                parity_fp8_from_f32(fp8[f].format, 0, n, x, raw8) != PARITY_OK) {
                count(s, fp8[f].what, 1, 0, u[0]);
                continue;
            }
            for (size_t i = 0; i < n; i++) {
                uint32_t sat, raw;
                want_codes(fp8[f].t, u[i], &sat, &raw);
                count(s, fp8[f].what, c8[i], sat, u[i]);
                count(s, fp8[f].what + 1, raw8[i], raw, u[i]);
            }
        }
        /* E2M1 refuses NaN (tested by hand in main): NaN inputs become 0 here */
        float xf[BLOCK];
        for (size_t i = 0; i < n; i++) xf[i] = isnan(x[i]) ? 0.0f : x[i];
        for (int away = 0; away < 2; away++) {
            if (parity_fp4_from_f32(away ? PARITY_FP4_HALF_AWAY : PARITY_FP4_RNE, n, xf, c8) !=
                PARITY_OK) {
                count(s, FP4_RNE + away, 1, 0, u[0]);
                continue;
            }
            for (size_t i = 0; i < n; i++)
                if (!isnan(x[i])) count(s, FP4_RNE + away, c8[i], want_fp4(u[i], away), u[i]);
        }
    }
    return NULL;
}

/* The value of a code from its fields: (-1)^s 2^(e - bias) (1 + f / 2^mbits), subnormals
 * 2^(emin) (f / 2^mbits); `ieee`: the top exponent holds infinities and NaNs. */
static float decode(const target *t, uint32_t code, int ieee) {
    const int ebits = t == &FP16 ? 5 : t == &E4M3 ? 4 : 5;
    const int bias = 1 - t->emin;
    const uint32_t mag = code & (t->sign - 1);
    const int e = (int)(mag >> t->mbits), f = (int)(mag & ((1u << t->mbits) - 1));
    double v;
    if (ieee && e == (1 << ebits) - 1)
        v = f ? NAN : INFINITY;
    else if (!ieee && mag == t->nan_code)
        v = NAN;
    else if (e == 0)
        v = ldexp((double)f, t->emin - t->mbits);
    else
        v = ldexp(1.0 + ldexp((double)f, -t->mbits), e - bias);
    return (float)((code & t->sign) ? -v : v);
}

static int same_value(float got, float want) {
    return isnan(want) ? isnan(got) && signbit(got) == signbit(want)
                       : f32_bits(got) == f32_bits(want);
}

int main(void) {
    if (quick()) quick_step = 31;
    for (int e = -160; e <= 160; e++) pow2_table[e + 160] = ldexp(1.0, e);
    tables[0] = &kernels_portable;
#if defined(PARITY_HAVE_AVX2)
    if (parity_set_cpu_path(PARITY_CPU_AVX2) == PARITY_OK) tables[1] = kernel_table(PARITY_CPU_AVX2);
#endif
#if defined(PARITY_HAVE_AVX512)
    if (parity_set_cpu_path(PARITY_CPU_AVX512) == PARITY_OK)
        tables[2] = kernel_table(PARITY_CPU_AVX512);
#endif
    for (int t = 0; t < 3; t++)
        if (!tables[t]) fprintf(stderr, "test_formats: %s: not on this CPU, skipped\n", names[1 + t]);

    sweep parts[2] = {{0, 1ull << 31, {0}, {0}}, {1ull << 31, 1ull << 32, {0}, {0}}};
    pthread_t th;
    CHECK(pthread_create(&th, NULL, sweep_run, &parts[1]) == 0);
    sweep_run(&parts[0]);
    pthread_join(th, NULL);
    for (int w = 0; w < N_SWEEPS; w++)
        for (int i = 0; i < 2; i++) {
            if (parts[i].bad[w])
                fprintf(stderr, "%s: %" PRIu64 " wrong, first 0x%08" PRIx32 "\n", names[w],
                        parts[i].bad[w], parts[i].first_bad[w]);
            CHECK_INT(parts[i].bad[w], 0);
        }

    /* by hand: the edges each rule is about */
    CHECK_INT(parity_fp16_from_f32(65504.0f), 0x7bff);
    CHECK_INT(parity_fp16_from_f32(65519.996f), 0x7bff);  /* below the tie */
    CHECK_INT(parity_fp16_from_f32(65520.0f), 0x7c00);    /* tie, odd: -> inf */
    CHECK_INT(parity_fp16_from_f32(0x1p-25f), 0x0000);    /* subnormal tie, even: 0 */
    CHECK_INT(parity_fp16_from_f32(0x1.000002p-25f), 0x0001);
    CHECK_INT(parity_fp16_from_f32(0x1.8p-24f), 0x0002);  /* 1.5 quanta: tie, up to even */
    CHECK_INT(parity_fp16_from_f32(-NAN), 0x7e00);
    CHECK_INT(parity_fp16_from_f32(f32_from_bits(0x7f800001u)), 0x7e00);
    uint8_t c[8];
    const float edges[8] = {448.0f, 464.0f, 464.00003f, 480.0f, INFINITY, -1e30f, 0x1p-10f, 0x1.000002p-10f};
    CHECK_OK(parity_fp8_from_f32(PARITY_FP8_E4M3, 1, 8, edges, c));
    const uint8_t sat[8] = {0x7e, 0x7e, 0x7e, 0x7e, 0x7e, 0xfe, 0x00, 0x01};
    for (int i = 0; i < 8; i++) CHECK_INT(c[i], sat[i]);
    CHECK_OK(parity_fp8_from_f32(PARITY_FP8_E4M3, 0, 8, edges, c));
    const uint8_t raw[8] = {0x7e, 0x7e, 0x7f, 0x7f, 0x7f, 0xff, 0x00, 0x01};
    for (int i = 0; i < 8; i++) CHECK_INT(c[i], raw[i]);
    const float e5[4] = {57344.0f, 61439.996f, 61440.0f, -INFINITY};
    CHECK_OK(parity_fp8_from_f32(PARITY_FP8_E5M2, 0, 4, e5, c));
    CHECK(c[0] == 0x7b && c[1] == 0x7b && c[2] == 0x7c && c[3] == 0xfc);
    CHECK_OK(parity_fp8_from_f32(PARITY_FP8_E5M2, 1, 4, e5, c));
    CHECK(c[0] == 0x7b && c[1] == 0x7b && c[2] == 0x7b && c[3] == 0xfb);

    /* E2M1 by hand: every tie of each rounding, saturation, -0, NaN refused, the 16 codes'
     * values and the round trip, packing (low nibble = even index) */
    {
        const float x[14] = {0.25f, 0.75f, 1.25f, 1.75f, 2.5f, 3.5f, 5.0f, 5.0001f, 1e9f,
                             -INFINITY, -0.0f, 0.2499f, -2.6f, 0x1p-140f};
        const uint8_t rne_codes[14] = {0x0, 0x2, 0x2, 0x4, 0x4, 0x6, 0x6, 0x7, 0x7, 0xf, 0x8,
                                       0x0, 0xd, 0x0};
        const uint8_t away_codes[14] = {0x1, 0x2, 0x3, 0x4, 0x5, 0x6, 0x7, 0x7, 0x7, 0xf, 0x8,
                                        0x0, 0xd, 0x0};
        uint8_t got[14];
        CHECK_OK(parity_fp4_from_f32(PARITY_FP4_RNE, 14, x, got));
        for (int i = 0; i < 14; i++) CHECK_INT(got[i], rne_codes[i]);
        CHECK_OK(parity_fp4_from_f32(PARITY_FP4_HALF_AWAY, 14, x, got));
        for (int i = 0; i < 14; i++) CHECK_INT(got[i], away_codes[i]);
        const float with_nan[3] = {1.0f, NAN, 2.0f};
        uint8_t untouched[3] = {0xaa, 0xaa, 0xaa};
        CHECK_STATUS(parity_fp4_from_f32(PARITY_FP4_RNE, 3, with_nan, untouched),
                     PARITY_ERR_TENSOR_NONFINITE);
        CHECK(untouched[0] == 0xaa && strstr(parity_last_error(), "x[1]"));
        CHECK_STATUS(parity_fp4_from_f32(2, 1, x, got), PARITY_ERR_INVALID_ARGUMENT);
        uint8_t all[16], again[16], packed[8], unpacked[16];
        float v[16];
        for (int i = 0; i < 16; i++) all[i] = (uint8_t)i;
        CHECK_OK(parity_fp4_to_f32(16, all, v));
        const float mags[8] = {0, 0.5f, 1, 1.5f, 2, 3, 4, 6};
        for (int i = 0; i < 16; i++)
            CHECK(f32_bits(v[i]) == f32_bits(i & 8 ? -mags[i & 7] : mags[i & 7]));
        CHECK_OK(parity_fp4_from_f32(PARITY_FP4_RNE, 16, v, again));
        CHECK(memcmp(again, all, 16) == 0);
        CHECK_OK(parity_fp4_pack(16, all, packed));
        CHECK(packed[0] == 0x10 && packed[1] == 0x32 && packed[7] == 0xfe);
        CHECK_OK(parity_fp4_unpack(16, packed, unpacked));
        CHECK(memcmp(unpacked, all, 16) == 0);
        CHECK_OK(parity_fp4_pack(3, all + 5, packed));
        CHECK(packed[0] == 0x65 && packed[1] == 0x07);
        const uint8_t wide[2] = {0x3, 0x13};
        CHECK_STATUS(parity_fp4_to_f32(2, wide, v), PARITY_ERR_INVALID_ARGUMENT);
        CHECK_STATUS(parity_fp4_pack(2, wide, packed), PARITY_ERR_INVALID_ARGUMENT);
        CHECK(strstr(parity_last_error(), "codes[1]") != NULL);
    }

    /* decoding: every code against its fields; the round trip is the identity */
    int bad = 0;
    for (uint32_t h = 0; h < 65536; h++) {
        const float x = parity_fp16_to_f32((uint16_t)h), want = decode(&FP16, h, 1);
        if (!same_value(x, want)) bad++;
        if (!isnan(x) && parity_fp16_from_f32(x) != h) bad++;
    }
    CHECK_INT(bad, 0);
    uint8_t codes[256], back[256];
    float vals[256];
    for (int i = 0; i < 256; i++) codes[i] = (uint8_t)i;
    const struct {
        int format;
        const target *t;
        int ieee;
    } f8[2] = {{PARITY_FP8_E4M3, &E4M3, 0}, {PARITY_FP8_E5M2, &E5M2, 1}};
    for (int f = 0; f < 2; f++) {
        CHECK_OK(parity_fp8_to_f32(f8[f].format, 256, codes, vals));
        CHECK_OK(parity_fp8_from_f32(f8[f].format, 0, 256, vals, back));
        int bad8 = 0;
        for (int i = 0; i < 256; i++) {
            if (!same_value(vals[i], decode(f8[f].t, (uint32_t)i, f8[f].ieee))) bad8++;
            if (!isnan(vals[i]) && back[i] != i) bad8++;
        }
        CHECK_INT(bad8, 0);
    }

    /* the quantizers by name, a few answers by hand, and what they refuse (the known-answer
     * test against an independent reference is test/python/test_quant.py) */
    static const char *const block_names[] = {"deepseek", "sglang", "te", "deepgemm", "te-pow2"};
    for (int q = 0; q < 5; q++) {
        int got = -1;
        CHECK_OK(parity_fp8_quantizer_from_name(0, block_names[q], &got));
        CHECK_INT(got, q);
        CHECK(strcmp(parity_fp8_quantizer_name(q), block_names[q]) == 0);
    }
    int qid = -1;
    CHECK_OK(parity_fp8_quantizer_from_name(1, "ocp", &qid));
    CHECK_INT(qid, PARITY_FP8Q_MX_OCP);
    CHECK_OK(parity_fp8_quantizer_from_name(1, "te", &qid));
    CHECK_INT(qid, PARITY_FP8Q_MX_RCEIL);
    CHECK_STATUS(parity_fp8_quantizer_from_name(1, "deepseek", &qid), PARITY_ERR_POLICY);
    CHECK_STATUS(parity_fp8_quantizer_from_name(0, "ocp", &qid), PARITY_ERR_POLICY);
    CHECK(parity_fp8_quantizer_name(7) == NULL);
    /* one 2 x 2 block of amax 896: deepseek's s = 2, te's m = 0.5 stored 2, te-pow2 the same */
    const float blk[4] = {896.0f, -3.0f, 1.0f, 0.0f};
    uint8_t qc[4];
    float qs[1];
    CHECK_OK(parity_fp8_quantize_blocks(PARITY_FP8Q_DEEPSEEK, 2, 2, blk, 2, 2, 2, qc, 2, qs));
    CHECK(qs[0] == 2.0f && qc[0] == 0x7e && qc[1] == 0xbc && qc[2] == 0x30 && qc[3] == 0x00);
    CHECK_OK(parity_fp8_quantize_blocks(PARITY_FP8Q_TE, 2, 2, blk, 2, 2, 2, qc, 2, qs));
    CHECK(qs[0] == 2.0f && qc[0] == 0x7e && qc[1] == 0xbc);
    /* an all-zero block: te's scale 1 (compute_scale_from_amax), deepseek's eps */
    const float zero4[4] = {0};
    CHECK_OK(parity_fp8_quantize_blocks(PARITY_FP8Q_TE, 2, 2, zero4, 2, 2, 2, qc, 2, qs));
    CHECK(qs[0] == 1.0f && qc[0] == 0);
    CHECK_OK(parity_fp8_quantize_blocks(PARITY_FP8Q_DEEPSEEK, 2, 2, zero4, 2, 2, 2, qc, 2, qs));
    CHECK(qs[0] == 1e-10f / 448.0f);
    /* MX: amax 500 saturates under the OCP floor (scale 2^0), RCEIL takes 2^1 */
    float row[32];
    for (int i = 0; i < 32; i++) row[i] = 1.0f;
    row[0] = 500.0f;
    uint8_t mc[32], ms[1];
    CHECK_OK(parity_mxfp8_quantize(PARITY_FP8Q_MX_OCP, 1, 32, row, 32, mc, 32, ms));
    CHECK(ms[0] == 127 && mc[0] == 0x7e);
    CHECK_OK(parity_mxfp8_quantize(PARITY_FP8Q_MX_RCEIL, 1, 32, row, 32, mc, 32, ms));
    CHECK(ms[0] == 128 && mc[0] == 0x78); /* 250 rounds to 256 */
    /* refused: another family's rule, a NaN (nothing written), sizes, NULL */
    memset(qc, 0xaa, sizeof qc), qs[0] = -1.0f;
    const float nan4[4] = {1.0f, 2.0f, NAN, 4.0f};
    CHECK_STATUS(parity_fp8_quantize_blocks(PARITY_FP8Q_MX_OCP, 2, 2, blk, 2, 2, 2, qc, 2, qs),
                 PARITY_ERR_POLICY);
    CHECK_STATUS(parity_fp8_quantize_blocks(PARITY_FP8Q_TE, 2, 2, nan4, 2, 2, 2, qc, 2, qs),
                 PARITY_ERR_TENSOR_NONFINITE);
    CHECK(strstr(parity_last_error(), "x[1][0]") != NULL);
    CHECK(qc[0] == 0xaa && qs[0] == -1.0f);
    CHECK_STATUS(parity_fp8_quantize_blocks(PARITY_FP8Q_TE, 2, 2, blk, 1, 2, 2, qc, 2, qs),
                 PARITY_ERR_INVALID_ARGUMENT);
    CHECK_STATUS(parity_fp8_quantize_blocks(PARITY_FP8Q_TE, 2, 2, blk, 2, 0, 2, qc, 2, qs),
                 PARITY_ERR_INVALID_ARGUMENT);
    CHECK_STATUS(parity_fp8_quantize_blocks(PARITY_FP8Q_TE, 0, 2, blk, 2, 2, 2, qc, 2, qs),
                 PARITY_ERR_INVALID_ARGUMENT);
    CHECK_STATUS(parity_mxfp8_quantize(PARITY_FP8Q_TE, 1, 32, row, 32, mc, 32, ms), PARITY_ERR_POLICY);
    CHECK_STATUS(parity_mxfp8_quantize(PARITY_FP8Q_MX_OCP, 1, 32, row, 32, NULL, 32, ms),
                 PARITY_ERR_INVALID_ARGUMENT);

    /* bad arguments */
    CHECK_STATUS(parity_fp8_from_f32(2, 1, 1, edges, c), PARITY_ERR_INVALID_ARGUMENT);
    CHECK_STATUS(parity_fp8_from_f32(PARITY_FP8_E4M3, 1, 1, NULL, c), PARITY_ERR_INVALID_ARGUMENT);
    CHECK_STATUS(parity_fp8_to_f32(PARITY_FP8_E5M2, 1, codes, NULL), PARITY_ERR_INVALID_ARGUMENT);
    CHECK_OK(parity_fp8_to_f32(PARITY_FP8_E5M2, 0, NULL, NULL));
    return check_report("test_formats");
}
