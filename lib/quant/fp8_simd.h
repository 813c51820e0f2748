/*
 * What the FP8 (E4M3) SIMD kernels of every ISA share (fp8_avx2.c, fp8_avx512.c; included only
 * by files compiled with AVX2 or wider): the digit decoding's tables, the 16 x 16 transpose of
 * 16-bit units that turns 16 weight rows into pairs of K a column, and the GEMM's scratch.
 *
 * The digits: an E4M3 code's value is k * 2^-9 with k = s * 2^sh, s = m (exponent field e = 0)
 * or 8 + m (e >= 1, sh = e - 1). Where e < 8, k itself (|k| <= 15 * 2^6 = 960) is the code's
 * low digit and its high digit is 0; where e >= 8, k / 2^7 (<= 15 * 2^7 = 1920, exact: sh >= 7)
 * is the high digit and the low one is 0. So k_a k_w = LL + 2^7 (LH + HL) + 2^14 HH, and over a
 * block of at most 128 terms each of LL, HH and P = sum (lo_a + hi_a)(lo_w + hi_w) is below
 * 128 * 1920^2 < 2^29 in magnitude: exact in int32 (vpmaddwd pairs, vpdpwssd), as is the cross
 * term P - LL - HH = sum (LH + HL). The block's S = LL + 2^7 cross + 2^14 HH is an integer below
 * 2^43, which double holds exactly at every step of that sum.
 */
#ifndef PARITY_QUANT_FP8_SIMD_H
#define PARITY_QUANT_FP8_SIMD_H

#include <immintrin.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "codecs.h"
#include "dot.h"
#include "fp8.h"

/* By a code's bits 3..7 (its exponent field e and sign): 8 where e >= 1 (the implicit bit of
 * s), and the signed power of two that multiplies s into the code's digit (2^(e-1) for e in
 * 1..7, 2^(e-8) for e >= 8, 1 for e = 0; negated for the sign). */
static const int16_t fp8_implicit_bit[32] = {0, 8, 8, 8, 8, 8, 8, 8, 8, 8, 8, 8, 8, 8, 8, 8,
                                             0, 8, 8, 8, 8, 8, 8, 8, 8, 8, 8, 8, 8, 8, 8, 8};
static const int16_t fp8_signed_power[32] = {
    1,  1,  2,  4,  8,  16,  32,  64,  1,  2,  4,  8,  16,  32,  64,  128,
    -1, -1, -2, -4, -8, -16, -32, -64, -1, -2, -4, -8, -16, -32, -64, -128};

/* Transposes 16 rows of 16 16-bit units (r[c] unit p, p < 8 in the low 128-bit lane) into
 * r[p] unit c: four rounds of unpacks within 128-bit lanes (16, 32, 64 bits), then the lanes
 * crossed; with rows 8..15 zero, the same rounds give rows 0..7 transposed in the low halves. */
static inline void fp8_transpose16x16_epi16(__m256i r[16]) {
    __m256i a[16], b[16], c[16];
    /* a[2i + h]: unit j of lane L is the column pair (2i, 2i + 1) at p = 8L + 4h + j */
    for (int i = 0; i < 8; i++) {
        a[2 * i] = _mm256_unpacklo_epi16(r[2 * i], r[2 * i + 1]);
        a[2 * i + 1] = _mm256_unpackhi_epi16(r[2 * i], r[2 * i + 1]);
    }
    /* b[4q + 2h + g]: 64-bit unit j of lane L is the column quad q at p = 8L + 4h + 2g + j */
    for (int q = 0; q < 4; q++)
        for (int h = 0; h < 2; h++) {
            b[4 * q + 2 * h] = _mm256_unpacklo_epi32(a[4 * q + h], a[4 * q + 2 + h]);
            b[4 * q + 2 * h + 1] = _mm256_unpackhi_epi32(a[4 * q + h], a[4 * q + 2 + h]);
        }
    /* c[8o + t]: lane L is the column octet o at p = 8L + t (t = 4h + 2g + the unpack half) */
    for (int o = 0; o < 2; o++)
        for (int hg = 0; hg < 4; hg++) {
            c[8 * o + 2 * hg] = _mm256_unpacklo_epi64(b[8 * o + hg], b[8 * o + 4 + hg]);
            c[8 * o + 2 * hg + 1] = _mm256_unpackhi_epi64(b[8 * o + hg], b[8 * o + 4 + hg]);
        }
    for (int t = 0; t < 8; t++) {
        r[t] = _mm256_permute2x128_si256(c[t], c[8 + t], 0x20);
        r[8 + t] = _mm256_permute2x128_si256(c[t], c[8 + t], 0x31);
    }
}

/* The GEMM's scratch, one a call (a thread's columns): the activations' digits, their blocks'
 * NaN flags, the tile's accumulators (M x tile_cols floats) and the decoded weight tile (three
 * vectors of tile_cols dwords per pair of K of a block). The digits are in groups of `group`
 * rows (the rows a GEMM step takes), per group and pair of K three runs of `group` dwords (lo,
 * hi, v; each dword a pair of K as two int16 digits, zero past K and past M), so that a step
 * finds every row's broadcast dword at a fixed offset from one pointer. */
typedef struct fp8_scratch {
    void *memory;
    int32_t *act;
    size_t pairs, group, group_stride; /* pairs of K (K rounded up to 32), rows a group, and
                                          the dwords from a group to the next */
    uint8_t *act_nan;                  /* [M][nblocks] */
    float *acc;
    void *tile;
} fp8_scratch;

static inline size_t fp8_align64(size_t bytes) { return (bytes + 63) / 64 * 64; }

/* Allocates s for job j with tiles of tile_cols columns and steps of up to step_rows rows (a
 * group: step_rows rows, or M when fewer); 0 when out of memory. */
static inline int fp8_scratch_alloc(fp8_scratch *s, const quant_gemm_job *j, size_t tile_cols,
                                    size_t step_rows) {
    const size_t group = j->M < step_rows ? j->M : step_rows;
    s->pairs = (j->K + 31) / 32 * 16;
    s->group = group;
    s->group_stride = s->pairs * 3 * group;
    const size_t groups = (j->M + group - 1) / group;
    const size_t act = fp8_align64(groups * s->group_stride * sizeof(int32_t));
    const size_t nan = fp8_align64(j->M * j->nblocks);
    const size_t acc = fp8_align64(j->M * tile_cols * sizeof(float));
    const size_t tile = fp8_align64((j->bc + 31) / 32 * 16 * 3 * tile_cols * sizeof(int32_t));
    uint8_t *p = aligned_alloc(64, act + nan + acc + tile);
    if (!p) return 0;
    s->memory = p;
    s->act = (int32_t *)(void *)p;
    /* the rows past M of the last group: zero digits */
    memset(p + (act - fp8_align64(s->group_stride * sizeof(int32_t))), 0,
           fp8_align64(s->group_stride * sizeof(int32_t)));
    s->act_nan = p + act;
    s->acc = (float *)(void *)(p + act + nan);
    s->tile = p + act + nan + acc;
    return 1;
}

/* Stores the digit pairs [pair0, pair0 + n) of row m (lo, hi, v: n dwords each) into s. */
static inline void fp8_store_act(const fp8_scratch *s, size_t m, size_t pair0, const int32_t *lo,
                                 const int32_t *hi, const int32_t *v, size_t n) {
    const size_t g = s->group;
    int32_t *a = s->act + (m / g) * s->group_stride + pair0 * 3 * g + m % g;
    for (size_t i = 0; i < n; i++, a += 3 * g) {
        a[0] = lo[i];
        a[g] = hi[i];
        a[2 * g] = v[i];
    }
}

static inline void fp8_scratch_free(fp8_scratch *s) { free(s->memory); }

/* The element step's parameters of rule r for a block of largest magnitude amax, and in
 * *stored the block's scale as the portable quantizer stores it (MX: the E8M0 power of two). */
static inline fp8_block_scale fp8_rule_scale(const quant_rule *r, float amax, float *stored) {
    if (r->format->block_scale == QUANT_SCALE_E8M0) {
        const uint8_t biased = fp8_mx_scale_of(r->id, amax);
        *stored = e8m0_to_f32(biased);
        const fp8_block_scale b = {*stored, fp8_mx_mult_of(r->id, biased), 0};
        return b;
    }
    const fp8_block_scale b = fp8_block_scale_of(r->id, amax);
    *stored = b.stored;
    return b;
}

#endif /* PARITY_QUANT_FP8_SIMD_H */
