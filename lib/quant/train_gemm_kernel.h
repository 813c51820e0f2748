/*
 * The training GEMM's column loop (train_gemm.h has its entries), inline, so that
 * train_gemm.c (the portable entry) and train_gemm_avx512.c (the same source compiled with
 * AVX-512 F/DQ, where the compiler vectorizes the int64 block sums with vpmullq) run one text:
 * every block sum is an exact integer, so the bits cannot depend on the path.
 */
#ifndef PARITY_QUANT_TRAIN_GEMM_KERNEL_H
#define PARITY_QUANT_TRAIN_GEMM_KERNEL_H

#include <math.h>
#include <stdint.h>

#include "train_gemm_types.h"

/* A 128-bit unsigned integer as two halves. */
typedef struct u128 {
    uint64_t hi, lo;
} u128;

static inline void u128_add(u128 *s, uint64_t v) {
    s->lo += v;
    s->hi += s->lo < v;
}

/* s - t for s >= t. */
static inline u128 u128_sub(u128 s, u128 t) {
    const u128 d = {s.hi - t.hi - (s.lo < t.lo), s.lo - t.lo};
    return d;
}

static inline int u128_less(u128 s, u128 t) {
    return s.hi < t.hi || (s.hi == t.hi && s.lo < t.lo);
}

/* Bit i of s (i < 128). */
static inline unsigned u128_bit(u128 s, unsigned i) {
    return (unsigned)((i < 64 ? s.lo >> i : s.hi >> (i - 64)) & 1u);
}

/* Whether any bit of s below bit i is set (i < 128). */
static inline int u128_any_below(u128 s, unsigned i) {
    if (i == 0) return 0;
    if (i < 64) return (s.lo & ((1ull << i) - 1u)) != 0;
    if (s.lo) return 1;
    return i > 64 && (s.hi & ((1ull << (i - 64)) - 1u)) != 0;
}

/* s >> i for 0 < i < 128. */
static inline uint64_t u128_shift(u128 s, unsigned i) {
    if (i >= 64) return s.hi >> (i - 64);
    return (s.lo >> i) | (s.hi << (64 - i));
}

/* The number of significant bits of v (0 for 0), by halving. */
static inline unsigned bit_length(uint64_t v) {
    unsigned n = 0;
    for (unsigned step = 32; step; step /= 2)
        if (v >> step) {
            v >>= step;
            n += step;
        }
    return n + (unsigned)(v != 0);
}

/* (-1)^negative * s * 2^e rounded once to fp32, to nearest even (s * 2^e within fp32's normal
 * range once rounded, as the block dots' are). */
static inline float round_to_f32(int negative, u128 s, int e) {
    const unsigned bits = s.hi ? 64 + bit_length(s.hi) : bit_length(s.lo);
    float r;
    if (bits <= 24) {
        r = ldexpf((float)s.lo, e); /* exact: at most 24 significant bits */
    } else {
        const unsigned drop = bits - 24;
        uint64_t q = u128_shift(s, drop);
        const unsigned half = u128_bit(s, drop - 1);
        if (half && (u128_any_below(s, drop - 1) || (q & 1u))) q++; /* q <= 2^24: exact */
        r = ldexpf((float)q, e + (int)drop);
    }
    return negative ? -r : r;
}

/* The exact dot of n decoded codes a and b (units 2^ea, 2^eb) rounded once to fp32; `wide`:
 * both E5M2, whose products need the 128-bit sum. */
static inline float block_dot(const int64_t *a, const int64_t *b, size_t n, int e,
                              double unit, int wide) {
    if (!wide) {
        int64_t s = 0; /* below 2^55 (train_gemm.c's bounds): exact in any order */
        for (size_t i = 0; i < n; i++) s += a[i] * b[i];
        if (s > -(INT64_C(1) << 53) && s < (INT64_C(1) << 53))
            /* exact in double, and so is the power of two: the cast to float is the one
             * rounding, to nearest even */
            return (float)((double)s * unit);
        const u128 m = {0, s < 0 ? 0u - (uint64_t)s : (uint64_t)s};
        return round_to_f32(s < 0, m, e);
    }
    u128 pos = {0, 0}, neg = {0, 0};
    for (size_t i = 0; i < n; i++) {
        const uint64_t p =
            (uint64_t)(a[i] < 0 ? -a[i] : a[i]) * (uint64_t)(b[i] < 0 ? -b[i] : b[i]);
        u128_add((a[i] < 0) != (b[i] < 0) ? &neg : &pos, p);
    }
    return u128_less(pos, neg) ? round_to_f32(1, u128_sub(neg, pos), e)
                               : round_to_f32(0, u128_sub(pos, neg), e);
}

/* Output tiles: TILE_N columns against TILE_M rows at a time, so that both tiles' decoded
 * rows stay in cache (each output's chain is its own: tiling moves no bit). */
enum { TILE_N = 8, TILE_M = 32 };

static inline void train_columns(const train_gemm_job *j, size_t n0, size_t n1) {
    const size_t K = j->K, nblocks = (K + j->block - 1) / j->block;
    const int e = j->da.unit_exp + j->db.unit_exp;
    const double unit = ldexp(1.0, e);
    const int wide = j->a.element == TRAIN_E5M2 && j->b.element == TRAIN_E5M2;
    for (size_t nt = n0; nt < n1; nt += TILE_N)
        for (size_t mt = 0; mt < j->M; mt += TILE_M)
            for (size_t n = nt; n < n1 && n < nt + TILE_N; n++) {
                const int64_t *br = j->db.k + n * K;
                const float *sb = j->db.scale + n * nblocks;
                const uint8_t *bb = j->db.bad + n * nblocks;
                for (size_t m = mt; m < j->M && m < mt + TILE_M; m++) {
                    const int64_t *ar = j->da.k + m * K;
                    const float *sa = j->da.scale + m * nblocks;
                    const uint8_t *ba = j->da.bad + m * nblocks;
                    float acc = 0.0f;
                    for (size_t kb = 0; kb < nblocks; kb++) {
                        const size_t k0 = kb * j->block;
                        const size_t len = k0 + j->block < K ? j->block : K - k0;
                        const float d = ba[kb] | bb[kb]
                                            ? NAN
                                            : block_dot(ar + k0, br + k0, len, e, unit, wide);
                        acc = acc + (d * sa[kb]) * sb[kb];
                    }
                    if (j->a.globals) {
                        const float ga = j->a.globals[j->a.per_row_globals ? m : 0];
                        const float gb = j->b.globals[j->b.per_row_globals ? n : 0];
                        acc = acc * (ga * gb);
                    }
                    j->y[m * j->ldy + n] = acc;
                }
            }
}

#endif /* PARITY_QUANT_TRAIN_GEMM_KERNEL_H */
