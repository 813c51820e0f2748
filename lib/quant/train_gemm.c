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
 * y = RN(acc * RN(ga * gb)), as the forward applies its alpha.
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

/* (-1)^negative * s * 2^e rounded once to fp32, to nearest even (s * 2^e within fp32's normal
 * range once rounded, as the block dots' are). */
static float round_to_f32(int negative, u128 s, int e) {
    unsigned bits = 0;
    for (unsigned i = 128; i-- > 0;)
        if (u128_bit(s, i)) {
            bits = i + 1;
            break;
        }
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

/* The exact dot of n codes of a (table ta) and b (table tb), rounded once to fp32; NaN if a
 * code is not finite. */
static float block_dot(const element_table *ta, const uint8_t *a, const element_table *tb,
                       const uint8_t *b, size_t n) {
    unsigned bad = 0;
    for (size_t i = 0; i < n; i++) bad |= ta->bad[a[i]] | tb->bad[b[i]];
    if (bad) return NAN;
    const int e = ta->unit_exp + tb->unit_exp;
    if (ta != &tables[TRAIN_E5M2] || tb != &tables[TRAIN_E5M2]) {
        int64_t s = 0; /* below 2^55 (the header's bounds) */
        for (size_t i = 0; i < n; i++) s += ta->k[a[i]] * tb->k[b[i]];
        const u128 m = {0, s < 0 ? 0u - (uint64_t)s : (uint64_t)s};
        return round_to_f32(s < 0, m, e);
    }
    u128 pos = {0, 0}, neg = {0, 0};
    for (size_t i = 0; i < n; i++) {
        const int64_t ka = ta->k[a[i]], kb = tb->k[b[i]];
        const uint64_t p = (uint64_t)(ka < 0 ? -ka : ka) * (uint64_t)(kb < 0 ? -kb : kb);
        u128_add((ka < 0) != (kb < 0) ? &neg : &pos, p);
    }
    return u128_less(pos, neg) ? round_to_f32(1, u128_sub(neg, pos), e)
                               : round_to_f32(0, u128_sub(pos, neg), e);
}

/* The value of block scale kb of an operand's row r. */
static float scale_of(const train_operand *o, size_t r, size_t kb) {
    const uint8_t byte = o->scales[(r / o->scale_rows) * o->scales_stride + kb];
    return o->element == TRAIN_E2M1 ? e4m3_value[byte] : e8m0_value[byte];
}

void train_gemm_columns(const train_gemm_job *j, size_t n0, size_t n1) {
    pthread_once(&tables_once, fill_tables);
    const element_table *ta = &tables[j->a.element], *tb = &tables[j->b.element];
    const size_t nblocks = (j->K + j->block - 1) / j->block;
    for (size_t n = n0; n < n1; n++) {
        const uint8_t *br = j->b.codes + n * j->b.codes_stride;
        for (size_t m = 0; m < j->M; m++) {
            const uint8_t *ar = j->a.codes + m * j->a.codes_stride;
            float acc = 0.0f;
            for (size_t kb = 0; kb < nblocks; kb++) {
                const size_t k0 = kb * j->block, k1 = k0 + j->block < j->K ? k0 + j->block : j->K;
                const float d = block_dot(ta, ar + k0, tb, br + k0, k1 - k0);
                acc = acc + (d * scale_of(&j->a, m, kb)) * scale_of(&j->b, n, kb);
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
