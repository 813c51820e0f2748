/*
 * The AVX2 + FMA kernels but the GEMMs (gemm_avx2.c): reductions, elementwise kernels,
 * attention's q.k and P.V blocks, and the region kernels (simd_shared.h on 8 lanes of ymm);
 * kernels_ref.c vectorised, bit for bit, and the avx2 table's entries.
 *
 * Compiled with -mavx2 -mfma -mf16c, as gemm_avx2.c; cpu.c selects this table only on a CPU
 * (and OS) that has them. Every function here must return what its portable twin returns
 * for every input (test_kernels checks it), so the vector code keeps the specification's
 * structure exactly:
 *   - dot16: the 16 lane accumulators are two registers, acc0 = lanes 0..7 (elements
 *     i % 16 < 8) and acc1 = lanes 8..15. In a partial block at the end of a row, the lanes
 *     past the end must leave their accumulators exactly as they are, as the
 *     specification does not touch them: they add -0 (a product -0 * +0, or a padding
 *     term -0), since acc + -0 = acc for every acc. +0 would not do: an accumulator can
 *     hold -0 (fmaf(-tiny, tiny, +0) = -0), and -0 + +0 = +0;
 *   - elementwise kernels do the same IEEE operations in the same order, one lane per
 *     element; partial blocks go through masked loads/stores or small zeroed buffers, so
 *     nothing is read or written past the caller's arrays;
 *   - exp is parity_expf's algorithm with the range checks turned into blends.
 * As everywhere in the library, no fp contraction (-ffp-contract=off): every fma below is
 * written as one.
 */
#include <immintrin.h>
#include <math.h>

#include "kernel_common.h"
#include "kernels.h"
#include "kernels_avx2.h"
#include "kernels_x86.h"

/* ---- the vector mapping of simd_shared.h: 8 lanes of ymm, partial blocks as lane counts -- */

typedef __m256 rv;
typedef __m256i rv_int;
typedef size_t rv_tail;
#define RV_LANES 8
#define RV_NAME(f) f##_avx2
#define rv_tail_at lanes_at
#define rv_load ld
#define rv_store st
#define rv_round_if round_if
#define rv_set1 _mm256_set1_ps
#define rv_add _mm256_add_ps
#define rv_sub _mm256_sub_ps
#define rv_mul _mm256_mul_ps
#define rv_div _mm256_div_ps
#define rv_min _mm256_min_ps
#define rv_max _mm256_max_ps
#define rv_xor _mm256_xor_ps
#define rv_fmadd _mm256_fmadd_ps
#define rv_fnmadd _mm256_fnmadd_ps
#define rv_int_set1 _mm256_set1_epi32
#define rv_int_add _mm256_add_epi32
#define rv_int_sub _mm256_sub_epi32
#define rv_int_srli _mm256_srli_epi32
#define rv_int_slli _mm256_slli_epi32
#define rv_trunc_int _mm256_cvttps_epi32
#define rv_from_int _mm256_castsi256_ps
#define rv_replace_if(y, v, x, c, pred) _mm256_blendv_ps(y, v, _mm256_cmp_ps(x, c, pred))

/* A sum of squares' 16 dot16 lanes: lanes 0..7 and 8..15. */
typedef struct rv_squares {
    __m256 lo, hi;
} rv_squares;

static inline rv_squares rv_squares_zero(void) {
    const rv_squares acc = {_mm256_setzero_ps(), _mm256_setzero_ps()};
    return acc;
}

/* The block at i holds lanes 0..7 when i/8 is even, lanes 8..15 when it is odd (a branch, so
 * that both accumulators stay in registers). */
static inline void rv_squares_add(rv_squares *acc, size_t i, __m256 v) {
    if ((i / 8) % 2 == 0)
        acc->lo = _mm256_fmadd_ps(v, v, acc->lo);
    else
        acc->hi = _mm256_fmadd_ps(v, v, acc->hi);
}

static inline float rv_squares_sum(rv_squares acc) { return fold16(acc.lo, acc.hi); }

#include "simd_shared.h"

/* ---- dot16 ------------------------------------------------------------------------------ */

float dot_f32_avx2(const float *a, const float *b, size_t n) {
    __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
    size_t i = 0;
    for (; i + 16 <= n; i += 16) {
        acc0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), acc0);
        acc1 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 8), _mm256_loadu_ps(b + i + 8), acc1);
    }
    if (i < n) {
        size_t k0 = lanes_at(n, i), k1 = n - i - k0;
        acc0 = _mm256_fmadd_ps(load_f32_n_neg0(a + i, k0), load_f32_n(b + i, k0), acc0);
        if (k1)
            acc1 = _mm256_fmadd_ps(load_f32_n_neg0(a + i + 8, k1), load_f32_n(b + i + 8, k1), acc1);
    }
    return fold16(acc0, acc1);
}

static float dot_f32_bf16_avx2(const float *a, const uint16_t *b, size_t n) {
    __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
    size_t i = 0;
    for (; i + 16 <= n; i += 16) {
        acc0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), load_bf16_n(b + i, 8), acc0);
        acc1 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 8), load_bf16_n(b + i + 8, 8), acc1);
    }
    if (i < n) {
        size_t k0 = lanes_at(n, i), k1 = n - i - k0;
        acc0 = _mm256_fmadd_ps(load_f32_n_neg0(a + i, k0), load_bf16_n(b + i, k0), acc0);
        if (k1) {
            __m256 a1 = load_f32_n_neg0(a + i + 8, k1);
            acc1 = _mm256_fmadd_ps(a1, load_bf16_n(b + i + 8, k1), acc1);
        }
    }
    return fold16(acc0, acc1);
}

/* Four dot16 products of one a against b[0..3] (bf16 or fp32, `elt` (a FMT_* value) a constant after
 * inlining), side by side: a's loads shared, four independent pairs of chains (the single
 * dot is bound by the latency of its two chains). */
ALWAYS_INLINE void dot4_rows(int elt, const float *a, const void *const b[4], size_t n,
                             float out[4]) {
    __m256 acc0[4], acc1[4];
    for (int j = 0; j < 4; j++) acc0[j] = acc1[j] = _mm256_setzero_ps();
    size_t i = 0;
    for (; i + 16 <= n; i += 16) {
        const __m256 x0 = _mm256_loadu_ps(a + i), x1 = _mm256_loadu_ps(a + i + 8);
#pragma GCC unroll 4
        for (int j = 0; j < 4; j++) {
            acc0[j] = _mm256_fmadd_ps(x0, ld(elt, b[j], i, 8), acc0[j]);
            acc1[j] = _mm256_fmadd_ps(x1, ld(elt, b[j], i + 8, 8), acc1[j]);
        }
    }
    if (i < n) {
        const size_t k0 = lanes_at(n, i), k1 = n - i - k0;
        const __m256 x0 = load_f32_n_neg0(a + i, k0);
        const __m256 x1 = k1 ? load_f32_n_neg0(a + i + 8, k1) : _mm256_setzero_ps();
        for (int j = 0; j < 4; j++) {
            acc0[j] = _mm256_fmadd_ps(x0, ld(elt, b[j], i, k0), acc0[j]);
            if (k1) acc1[j] = _mm256_fmadd_ps(x1, ld(elt, b[j], i + 8, k1), acc1[j]);
        }
    }
    for (int j = 0; j < 4; j++) out[j] = fold16(acc0[j], acc1[j]);
}

/* dots_f32 and dots_f32_bf16 (`elt` FMT_NONE or FMT_BF16, a constant after inlining): keys
 * four at a time (dot4_rows), the last one to three singly. */
ALWAYS_INLINE void dots_rows(int elt, const float *a, const void *b, size_t ldb, size_t count,
                             size_t n, float *out) {
    const size_t bytes = elt == FMT_NONE ? sizeof(float) : sizeof(uint16_t);
    const char *base = b;
    size_t j = 0;
    for (; j + 4 <= count; j += 4) {
        const void *const rows[4] = {base + j * ldb * bytes, base + (j + 1) * ldb * bytes,
                                     base + (j + 2) * ldb * bytes, base + (j + 3) * ldb * bytes};
        dot4_rows(elt, a, rows, n, out + j);
    }
    for (; j < count; j++)
        out[j] = elt == FMT_NONE ? dot_f32_avx2(a, (const float *)(base + j * ldb * bytes), n)
                                 : dot_f32_bf16_avx2(a, (const uint16_t *)(base + j * ldb * bytes), n);
}

static void dots_f32_avx2(const float *a, size_t lda, size_t queries, const float *b, size_t ldb,
                          size_t count, size_t n, float *out, size_t ldo) {
    for (size_t q = 0; q < queries; q++) dots_rows(FMT_NONE, a + q * lda, b, ldb, count, n, out + q * ldo);
}

static void dots_f32_bf16_avx2(const float *a, size_t lda, size_t queries, const uint16_t *b,
                               size_t ldb, size_t count, size_t n, float *out, size_t ldo) {
    for (size_t q = 0; q < queries; q++) dots_rows(FMT_BF16, a + q * lda, b, ldb, count, n, out + q * ldo);
}

static float sum_squares_avx2(const float *x, size_t n) { return dot_f32_avx2(x, x, n); }

/* exp(x[i + l] - m) for the k lanes at i (to out if any); lanes >= k are -0, since a
 * padded lane computed exp(0 - m) and must add nothing. */
static inline __m256 exp_block(const float *x, size_t i, size_t k, __m256 m, float *out) {
    __m256 e = rv_exp(_mm256_sub_ps(load_f32_n(x + i, k), m));
    if (out) store_f32_n(out + i, k, e);
    if (k == 8) return e;
    return _mm256_blendv_ps(_mm256_set1_ps(-0.0f), e, _mm256_castsi256_ps(lane_mask(k)));
}

static float sum_exp_avx2(const float *x, size_t n, float m, float *out) {
    const __m256 mv = _mm256_set1_ps(m);
    __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
    for (size_t i = 0; i < n; i += 16) {
        acc0 = _mm256_add_ps(acc0, exp_block(x, i, lanes_at(n, i), mv, out));
        if (n - i > 8) acc1 = _mm256_add_ps(acc1, exp_block(x, i + 8, lanes_at(n, i + 8), mv, out));
    }
    return fold16(acc0, acc1);
}

/* x[i..i+k), lanes >= k holding x[0]: such a lane never replaces anything, since every
 * lane starts at x[0] and only takes strictly greater values. */
static inline __m256 max_block(const float *x, size_t i, size_t k, __m256 x0) {
    if (k == 8) return _mm256_loadu_ps(x + i);
    return _mm256_blendv_ps(x0, load_f32_n(x + i, k), _mm256_castsi256_ps(lane_mask(k)));
}

/* vmaxps(x, m) = (x > m) ? x : m, the step of the specification. */
static float max_f32_avx2(const float *x, size_t n) {
    const __m256 x0 = _mm256_set1_ps(x[0]);
    __m256 acc0 = x0, acc1 = x0;
    for (size_t i = 0; i < n; i += 16) {
        acc0 = _mm256_max_ps(max_block(x, i, lanes_at(n, i), x0), acc0);
        if (n - i > 8) acc1 = _mm256_max_ps(max_block(x, i + 8, lanes_at(n, i + 8), x0), acc1);
    }
    /* the fold, with the same step: lane l = (lane l + s > lane l) ? lane l + s : lane l */
    __m256 v = _mm256_max_ps(acc1, acc0);
    __m128 u = _mm_max_ps(_mm256_extractf128_ps(v, 1), _mm256_castps256_ps128(v));
    __m128 t = _mm_max_ps(_mm_movehl_ps(u, u), u);
    return _mm_cvtss_f32(_mm_max_ss(_mm_movehdup_ps(t), t));
}

/* ---- elementwise ------------------------------------------------------------------------ */

static void round_bf16_avx2(float *x, size_t n) {
    for (size_t i = 0; i < n; i += 8) {
        size_t k = lanes_at(n, i);
        store_f32_n(x + i, k, round_bf16_8(load_f32_n(x + i, k)));
    }
}

static void round_fp16_avx2(float *x, size_t n) {
    for (size_t i = 0; i < n; i += 8) {
        size_t k = lanes_at(n, i);
        store_f32_n(x + i, k, round_fp16_8(load_f32_n(x + i, k)));
    }
}

/* One pass, full vectors loaded and stored whole, then max_f32's. */
static void scale_round_avx2(float *x, size_t n, float scale, int before, int after, float *max) {
    const __m256 sv = _mm256_set1_ps(scale);
    for (size_t i = 0; i < n; i += 8) {
        const size_t k = lanes_at(n, i);
        const __m256 v = k == 8 ? _mm256_loadu_ps(x + i) : load_f32_n(x + i, k);
        const __m256 r = round_if(after, _mm256_mul_ps(round_if(before, v), sv));
        if (k == 8)
            _mm256_storeu_ps(x + i, r);
        else
            store_f32_n(x + i, k, r);
    }
    if (max) *max = max_f32_avx2(x, n);
}

static void exp_f32_avx2(float *x, size_t n) {
    for (size_t i = 0; i < n; i += 8) {
        size_t k = lanes_at(n, i);
        store_f32_n(x + i, k, rv_exp(load_f32_n(x + i, k)));
    }
}

static void axpy_f32_avx2(float *o, float p, const float *v, size_t n) {
    const __m256 pv = _mm256_set1_ps(p);
    for (size_t i = 0; i < n; i += 8) {
        size_t k = lanes_at(n, i);
        store_f32_n(o + i, k, _mm256_fmadd_ps(pv, load_f32_n(v + i, k), load_f32_n(o + i, k)));
    }
}

static void axpy_bf16_avx2(float *o, float p, const uint16_t *v, size_t n) {
    const __m256 pv = _mm256_set1_ps(p);
    for (size_t i = 0; i < n; i += 8) {
        size_t k = lanes_at(n, i);
        store_f32_n(o + i, k, _mm256_fmadd_ps(pv, load_bf16_n(v + i, k), load_f32_n(o + i, k)));
    }
}

/* pv_f32 and pv_bf16 (`elt` FMT_NONE or FMT_BF16, a constant after inlining): 64 elements
 * of o at a time held in 8 registers (8 independent chains) through all count vectors, each
 * element's fmas in ascending j; the rest 8 at a time. */
ALWAYS_INLINE void pv_rows(int elt, float *o, const float *p, const void *v, size_t ldv,
                           size_t count, size_t n) {
    const size_t bytes = elt == FMT_NONE ? sizeof(float) : sizeof(uint16_t);
    const char *base = v;
    size_t i = 0;
    for (; i + 64 <= n; i += 64) {
        __m256 acc[8];
#pragma GCC unroll 8
        for (int h = 0; h < 8; h++) acc[h] = _mm256_loadu_ps(o + i + 8 * h);
        for (size_t j = 0; j < count; j++) {
            const __m256 pj = _mm256_broadcast_ss(p + j);
            const void *vj = base + j * ldv * bytes;
#pragma GCC unroll 8
            for (int h = 0; h < 8; h++) acc[h] = _mm256_fmadd_ps(pj, ld(elt, vj, i + 8 * h, 8), acc[h]);
        }
#pragma GCC unroll 8
        for (int h = 0; h < 8; h++) _mm256_storeu_ps(o + i + 8 * h, acc[h]);
    }
    for (; i < n; i += 8) {
        const size_t k = lanes_at(n, i);
        __m256 acc = load_f32_n(o + i, k);
        for (size_t j = 0; j < count; j++)
            acc = _mm256_fmadd_ps(_mm256_broadcast_ss(p + j), ld(elt, base + j * ldv * bytes, i, k), acc);
        store_f32_n(o + i, k, acc);
    }
}

static void pv_f32_avx2(float *o, size_t ldo, const float *p, size_t ldp, size_t queries,
                        const float *v, size_t ldv, size_t count, size_t n) {
    for (size_t q = 0; q < queries; q++) pv_rows(FMT_NONE, o + q * ldo, p + q * ldp, v, ldv, count, n);
}

static void pv_bf16_avx2(float *o, size_t ldo, const float *p, size_t ldp, size_t queries,
                         const uint16_t *v, size_t ldv, size_t count, size_t n) {
    for (size_t q = 0; q < queries; q++) pv_rows(FMT_BF16, o + q * ldo, p + q * ldp, v, ldv, count, n);
}

static void widen_bf16_avx2(const uint16_t *src, size_t n, float *dst) {
    for (size_t i = 0; i < n; i += 8) {
        const size_t k = lanes_at(n, i);
        store_f32_n(dst + i, k, load_bf16_n(src + i, k));
    }
}


/* The entries of this file and of gemm_avx2.c over a copy of the portable table (kernels.h):
 * an entry that is not set here stays the specification's. */
void kernels_avx2_set_entries(kernels *t) {
    t->name = "avx2";
    RV_KERNEL_ENTRIES(RV_SET_ENTRY)
    gemm_avx2_set_entries(t);
}
