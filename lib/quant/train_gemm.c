/*
 * The training GEMM (train_gemm.h) in portable C: its specification, which every CPU path
 * runs. The block dot is exact for every pair of element formats: each code's value is an
 * integer k times a power of two u (E4M3: |k| <= 448 * 2^9 < 2^18, u = 2^-9; E5M2: |k| <= 57344
 * * 2^16 < 2^32, u = 2^-16; E2M1: |k| <= 12, u = 2^-1), so a block's dot is the integer
 * S = sum k_a k_b times u_a u_b. With at most 32 terms: E4M3 x E4M3 terms are below 2^36,
 * E5M2 x E4M3 below 2^50 and those with E2M1 below 2^36, so S is exact in int64 (below 2^55);
 * an E5M2 x E5M2 term is below 2^64 and S is summed exactly in 128 bits (the positive and the
 * negative terms apart, each a pair of uint64). Then d = RN_fp32(S) * u_a u_b: one rounding
 * (to nearest even on S's bits, written out here rather than left to the compiler's integer
 * conversion), and the power of two is exact (a nonzero |S u_a u_b| lies in [2^-32, 2^70)).
 * The order of a block's terms is therefore free; the blocks' is fixed: acc = acc + (d * sa)
 * * sb, ascending, in fp32, as the forward's quantized GEMM (dot.c); then NVFP4's globals,
 * y = RN(acc * RN(ga * gb)), as the forward applies its alpha. The operands are decoded once
 * per call (each code's k as int64, each block's scale value and non-finite flag), so that
 * the inner loop is integer multiply-adds over contiguous rows, in cache-sized output tiles.
 */
#include <math.h>
#include <pthread.h>

#include "train_gemm.h"

#include "codecs.h"

/* Per element format: k of every code (0 for a non-finite one), whether the code is not
 * finite, and the unit's exponent. */
typedef struct element_table {
    int64_t k[256];
    uint8_t bad[256];
    int unit_exp;
} element_table;

static element_table tables[3];
static float e8m0_value[256], e4m3_value[256];
static pthread_once_t tables_once = PTHREAD_ONCE_INIT;

static void fill_tables(void) {
    static const int unit_exp[3] = {-9, -16, -1};
    for (int t = 0; t < 3; t++) tables[t].unit_exp = unit_exp[t];
    for (int c = 0; c < 256; c++) {
        const uint8_t code = (uint8_t)c;
        const float v[3] = {e4m3_to_f32(code), minifloat_to_f32(&MINIFLOAT_E5M2, code),
                            c < 16 ? e2m1_to_f32(code) : NAN};
        for (int t = 0; t < 3; t++) {
            tables[t].bad[c] = !isfinite(v[t]);
            tables[t].k[c] = tables[t].bad[c] ? 0 : (int64_t)ldexp((double)v[t], -unit_exp[t]);
        }
        e8m0_value[c] = e8m0_to_f32(code);
        e4m3_value[c] = e4m3_to_f32(code);
    }
}

/* A 128-bit unsigned integer as two halves. */
typedef struct u128 {
    uint64_t hi, lo;
} u128;

static void u128_add(u128 *s, uint64_t v) {
    s->lo += v;
    s->hi += s->lo < v;
}

/* s - t for s >= t. */
static u128 u128_sub(u128 s, u128 t) {
    const u128 d = {s.hi - t.hi - (s.lo < t.lo), s.lo - t.lo};
    return d;
}

static int u128_less(u128 s, u128 t) { return s.hi < t.hi || (s.hi == t.hi && s.lo < t.lo); }

/* Bit i of s (i < 128). */
static unsigned u128_bit(u128 s, unsigned i) {
    return (unsigned)((i < 64 ? s.lo >> i : s.hi >> (i - 64)) & 1u);
}

/* Whether any bit of s below bit i is set (i < 128). */
static int u128_any_below(u128 s, unsigned i) {
    if (i == 0) return 0;
    if (i < 64) return (s.lo & ((1ull << i) - 1u)) != 0;
    if (s.lo) return 1;
    return i > 64 && (s.hi & ((1ull << (i - 64)) - 1u)) != 0;
}

/* s >> i for 0 < i < 128. */
static uint64_t u128_shift(u128 s, unsigned i) {
    if (i >= 64) return s.hi >> (i - 64);
    return (s.lo >> i) | (s.hi << (64 - i));
}

/* The number of significant bits of v (0 for 0), by halving. */
static unsigned bit_length(uint64_t v) {
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
static float round_to_f32(int negative, u128 s, int e) {
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

size_t train_decoded_bytes(size_t rows, size_t K, size_t block) {
    const size_t nblocks = (K + block - 1) / block;
    return rows * K * sizeof(int64_t) + rows * nblocks * (sizeof(float) + 1);
}

void train_gemm_decode(const train_operand *o, size_t rows, size_t K, size_t block, void *bytes,
                       train_decoded *d) {
    pthread_once(&tables_once, fill_tables);
    const element_table *t = &tables[o->element];
    const size_t nblocks = (K + block - 1) / block;
    d->k = bytes;
    d->scale = (float *)(void *)(d->k + rows * K);
    d->bad = (uint8_t *)(d->scale + rows * nblocks);
    d->unit_exp = t->unit_exp;
    for (size_t r = 0; r < rows; r++) {
        const uint8_t *codes = o->codes + r * o->codes_stride;
        const uint8_t *scales = o->scales + (r / o->scale_rows) * o->scales_stride;
        for (size_t kb = 0; kb < nblocks; kb++) {
            const size_t k0 = kb * block, k1 = k0 + block < K ? k0 + block : K;
            unsigned bad = 0;
            for (size_t i = k0; i < k1; i++) {
                d->k[r * K + i] = t->k[codes[i]];
                bad |= t->bad[codes[i]];
            }
            d->bad[r * nblocks + kb] = (uint8_t)bad;
            d->scale[r * nblocks + kb] =
                o->element == TRAIN_E2M1 ? e4m3_value[scales[kb]] : e8m0_value[scales[kb]];
        }
    }
}

/* The exact dot of n decoded codes a and b (units 2^ea, 2^eb) rounded once to fp32; `wide`:
 * both E5M2, whose products need the 128-bit sum. */
static float block_dot(const int64_t *a, const int64_t *b, size_t n, int e, int wide) {
    if (!wide) {
        int64_t s0 = 0, s1 = 0; /* each below 2^55 (the header's bounds) */
        size_t i = 0;
        for (; i + 2 <= n; i += 2) {
            s0 += a[i] * b[i];
            s1 += a[i + 1] * b[i + 1];
        }
        if (i < n) s0 += a[i] * b[i];
        const int64_t s = s0 + s1;
        const u128 m = {0, s < 0 ? 0u - (uint64_t)s : (uint64_t)s};
        return round_to_f32(s < 0, m, e);
    }
    u128 pos = {0, 0}, neg = {0, 0};
    for (size_t i = 0; i < n; i++) {
        const uint64_t p = (uint64_t)(a[i] < 0 ? -a[i] : a[i]) * (uint64_t)(b[i] < 0 ? -b[i] : b[i]);
        u128_add((a[i] < 0) != (b[i] < 0) ? &neg : &pos, p);
    }
    return u128_less(pos, neg) ? round_to_f32(1, u128_sub(neg, pos), e)
                               : round_to_f32(0, u128_sub(pos, neg), e);
}

/* Output tiles: TILE_N columns against TILE_M rows at a time, so that both tiles' decoded
 * rows stay in cache (each output's chain is its own: tiling moves no bit). */
enum { TILE_N = 8, TILE_M = 32 };

void train_gemm_columns(const train_gemm_job *j, size_t n0, size_t n1) {
    const size_t K = j->K, nblocks = (K + j->block - 1) / j->block;
    const int e = j->da.unit_exp + j->db.unit_exp;
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
                        const float d = ba[kb] | bb[kb] ? NAN
                                                        : block_dot(ar + k0, br + k0, len, e, wide);
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
