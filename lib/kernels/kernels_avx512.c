/*
 * The AVX-512 kernels (AVX-512F, BW, VL, DQ): kernels_ref.c on 16 fp32 lanes, bit for bit.
 *
 * The only file compiled with -mavx512f -mavx512bw -mavx512vl -mavx512dq; cpu.c selects this
 * table only on a CPU (and OS) that has them. The table is the AVX2 one with the entries of
 * this file over it, so an entry not written here is the AVX2 kernel (equal to the
 * specification like every entry). The rules of kernels_avx2.c hold here too: the orders of
 * the specification exactly, padding terms -0, masked loads and stores at the ends of rows,
 * no fp contraction (every fma below is written as one).
 */
#include <immintrin.h>
#include <stdatomic.h>
#include <string.h>
#include <unistd.h>

#include "base/internal.h"
#include "kernel_common.h"
#include "kernels.h"
#include "kernels_avx512.h"
#include "kernels_x86.h"

/* ---- elementwise: round_bf16, widen_bf16 ---- */

/* Masked lanes of an fp16 row at p, +0 past the mask (vcvtph2ps is exact). */
static inline __m512 z_load_fp16(const uint16_t *p, __mmask16 m) {
    return _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m, p));
}

/* Masked lanes of a 16-bit or fp32 row at element i (`elt` a constant after inlining:
 * FMT_NONE for fp32, FMT_BF16, FMT_FP16), +0 past the mask. */
ALWAYS_INLINE __m512 z_load(int elt, const void *p, size_t i, __mmask16 m) {
    return elt == FMT_BF16   ? z_load_bf16((const uint16_t *)p + i, m)
           : elt == FMT_FP16 ? z_load_fp16((const uint16_t *)p + i, m)
                             : _mm512_maskz_loadu_ps(m, (const float *)p + i);
}

/* fp32 -> fp16 on 16 lanes, as f16_from_f32 (see kernels_avx2.c's fp16_bits: vcvtps2ph is
 * the specification but for NaN, so NaN lanes become 0x7fc00000 first). */
static inline __m256i z_fp16_bits(__m512 x) {
    const __mmask16 nan = _mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q);
    const __m512 y = _mm512_mask_mov_ps(x, nan, _mm512_castsi512_ps(_mm512_set1_epi32(0x7fc00000)));
    return _mm512_cvtps_ph(y, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
}

/* round_fp16 on 16 lanes. */
static inline __m512 z_round_fp16(__m512 x) { return _mm512_cvtph_ps(z_fp16_bits(x)); }

/* A rounding point: to the format the policy names there (kernel_common.h), or not at all. */
static inline __m512 z_round_if(int fmt, __m512 x) {
    return fmt == FMT_BF16 ? z_round_bf16(x) : fmt == FMT_FP16 ? z_round_fp16(x) : x;
}

/* The masked lanes of x rounded to bf16 and stored at p. */
static inline void z_store_bf16(uint16_t *p, __mmask16 m, __m512 x) {
    _mm256_mask_storeu_epi16(p, m, _mm512_cvtepi32_epi16(z_bf16_bits(x)));
}

/* Generic row access for the region kernels (`elt` as z_load's): masked lanes at element i;
 * a 16-bit store rounds to its format. */
ALWAYS_INLINE void z_store(int elt, void *p, size_t i, __mmask16 m, __m512 v) {
    if (elt == FMT_BF16)
        z_store_bf16((uint16_t *)p + i, m, v);
    else if (elt == FMT_FP16)
        _mm256_mask_storeu_epi16((uint16_t *)p + i, m, z_fp16_bits(v));
    else
        _mm512_mask_storeu_ps((float *)p + i, m, v);
}

static void round_bf16_avx512(float *x, size_t n) {
    for (size_t i = 0; i < n; i += 16) {
        const __mmask16 m = z_mask_at(n, i);
        _mm512_mask_storeu_ps(x + i, m, z_round_bf16(_mm512_maskz_loadu_ps(m, x + i)));
    }
}

static void round_fp16_avx512(float *x, size_t n) {
    for (size_t i = 0; i < n; i += 16) {
        const __mmask16 m = z_mask_at(n, i);
        _mm512_mask_storeu_ps(x + i, m, z_round_fp16(_mm512_maskz_loadu_ps(m, x + i)));
    }
}

static void widen_bf16_avx512(const uint16_t *src, size_t n, float *dst) {
    for (size_t i = 0; i < n; i += 16) {
        const __mmask16 m = z_mask_at(n, i);
        _mm512_mask_storeu_ps(dst + i, m, z_load_bf16(src + i, m));
    }
}

/* ---- attention blocks (dots_f32, pv_f32) ---- */

/* dot16 products of Q queries a + q lda against J keys b[j] (bf16 or fp32, `elt` a FMT_*
 * value; Q * J <= 16; all three constants after inlining), side by side: each key chunk is
 * loaded (and widened) once for the Q queries and each query chunk once for the J keys, Q J
 * chains; a full block of 16 folds as one tree, its lane J q + j being query q's score j,
 * stored at out + q ldo + j. The partial chunk at the end pads the queries with -0 and the
 * keys with +0. */
ALWAYS_INLINE void z_dots(const int Q, const int J, int elt, const float *a, size_t lda,
                          const void *const *b, size_t n, float *out, size_t ldo) {
    __m512 acc[16], key[16];
    for (int c = 0; c < Q * J; c++) acc[c] = _mm512_setzero_ps();
    size_t i = 0;
    for (; i + 16 <= n; i += 16) {
        for (int j = 0; j < J; j++) key[j] = z_load(elt, b[j], i, 0xffff);
        for (int q = 0; q < Q; q++) {
            const __m512 x = _mm512_loadu_ps(a + q * lda + i);
            for (int j = 0; j < J; j++) acc[J * q + j] = _mm512_fmadd_ps(x, key[j], acc[J * q + j]);
        }
    }
    if (i < n) {
        const __mmask16 m = z_mask(n - i);
        for (int j = 0; j < J; j++) key[j] = z_load(elt, b[j], i, m);
        for (int q = 0; q < Q; q++) {
            const __m512 x = _mm512_mask_loadu_ps(_mm512_set1_ps(-0.0f), m, a + q * lda + i);
            for (int j = 0; j < J; j++) acc[J * q + j] = _mm512_fmadd_ps(x, key[j], acc[J * q + j]);
        }
    }
    z_store_block(Q, J, acc, out, ldo);
}

static float dot_f32_bf16_avx512(const float *a, const uint16_t *b, size_t n) {
    const void *const row[1] = {b};
    float out;
    z_dots(1, 1, FMT_BF16, a, 0, row, n, &out, 0);
    return out;
}

static void axpy_bf16_avx512(float *o, float p, const uint16_t *v, size_t n) {
    const __m512 pv = _mm512_set1_ps(p);
    for (size_t i = 0; i < n; i += 16) {
        const __mmask16 m = z_mask_at(n, i);
        const __m512 r = _mm512_fmadd_ps(pv, z_load_bf16(v + i, m), _mm512_maskz_loadu_ps(m, o + i));
        _mm512_mask_storeu_ps(o + i, m, r);
    }
}

/* Q queries against the keys j, j + J, ... of count, ldb apart, J at a time while J are
 * left; returns the first key not done. */
ALWAYS_INLINE size_t z_dots_run(const int Q, const int J, int elt, const float *a, size_t lda,
                                const void *b, size_t ldb, size_t j, size_t count, size_t n,
                                float *out, size_t ldo) {
    const size_t bytes = elt == FMT_NONE ? sizeof(float) : sizeof(uint16_t);
    const void *rows[16];
    for (; j + (size_t)J <= count; j += (size_t)J) {
        for (int r = 0; r < J; r++) rows[r] = (const char *)b + (j + (size_t)r) * ldb * bytes;
        z_dots(Q, J, elt, a, lda, rows, n, out + j, ldo);
    }
    return j;
}

/* Q (1, 2 or 4) queries over count keys: 16 / Q keys at a time, then half as many, down to
 * one. */
ALWAYS_INLINE void z_dots_keys(const int Q, int elt, const float *a, size_t lda, const void *b,
                               size_t ldb, size_t count, size_t n, float *out, size_t ldo) {
    size_t j = 0;
    if (Q == 1) j = z_dots_run(1, 16, elt, a, lda, b, ldb, j, count, n, out, ldo);
    if (Q <= 2) j = z_dots_run(Q, 8, elt, a, lda, b, ldb, j, count, n, out, ldo);
    j = z_dots_run(Q, 4, elt, a, lda, b, ldb, j, count, n, out, ldo);
    j = z_dots_run(Q, 2, elt, a, lda, b, ldb, j, count, n, out, ldo);
    z_dots_run(Q, 1, elt, a, lda, b, ldb, j, count, n, out, ldo);
}

/* dots_f32 and dots_f32_bf16 (`elt` FMT_NONE or FMT_BF16, a constant after inlining): the
 * queries four at a time against four keys (the query heads of the rows that read a block
 * share every key load, each key chunk is widened once for four queries), the two or three
 * left as a pair and one alone. On the Zen 5 VM four by four took 15-20% less time than the
 * pairs against eight keys before them (prefill 512, timed around the q.k and P.V passes). */
ALWAYS_INLINE void z_dots_queries(int elt, const float *a, size_t lda, size_t queries,
                                  const void *b, size_t ldb, size_t count, size_t n, float *out,
                                  size_t ldo) {
    size_t q = 0;
    for (; q + 4 <= queries; q += 4)
        z_dots_keys(4, elt, a + q * lda, lda, b, ldb, count, n, out + q * ldo, ldo);
    if (q + 2 <= queries) {
        z_dots_keys(2, elt, a + q * lda, lda, b, ldb, count, n, out + q * ldo, ldo);
        q += 2;
    }
    if (q < queries) z_dots_keys(1, elt, a + q * lda, lda, b, ldb, count, n, out + q * ldo, ldo);
}

static void dots_f32_avx512(const float *a, size_t lda, size_t queries, const float *b,
                            size_t ldb, size_t count, size_t n, float *out, size_t ldo) {
    z_dots_queries(FMT_NONE, a, lda, queries, b, ldb, count, n, out, ldo);
}

static void dots_f32_bf16_avx512(const float *a, size_t lda, size_t queries, const uint16_t *b,
                                 size_t ldb, size_t count, size_t n, float *out, size_t ldo) {
    z_dots_queries(FMT_BF16, a, lda, queries, b, ldb, count, n, out, ldo);
}

/* Q outputs o + q ldo with their probabilities p + q ldp against count vectors ldv apart
 * (`elt` as z_dots'; Q * H <= 16, constants after inlining): the outputs' elements 16 H at a
 * time in Q H registers through all count vectors, each value chunk loaded (and widened) once
 * for the Q outputs, every element's fmas in ascending j; the rest 16 at a time, masked at the
 * end. */
ALWAYS_INLINE void z_pv(const int Q, const int H, int elt, float *o, size_t ldo, const float *p,
                        size_t ldp, const void *v, size_t ldv, size_t count, size_t n) {
    const size_t bytes = elt == FMT_NONE ? sizeof(float) : sizeof(uint16_t);
    const char *base = v;
    size_t i = 0;
    for (; i + 16 * (size_t)H <= n; i += 16 * (size_t)H) {
        __m512 acc[16], val[16];
        for (int q = 0; q < Q; q++)
            for (int h = 0; h < H; h++) acc[H * q + h] = _mm512_loadu_ps(o + q * ldo + i + 16 * h);
        for (size_t j = 0; j < count; j++) {
            const void *vj = base + j * ldv * bytes;
            for (int h = 0; h < H; h++) val[h] = z_load(elt, vj, i + 16 * h, 0xffff);
            for (int q = 0; q < Q; q++) {
                const __m512 pj = _mm512_set1_ps(p[q * ldp + j]);
                for (int h = 0; h < H; h++) acc[H * q + h] = _mm512_fmadd_ps(pj, val[h], acc[H * q + h]);
            }
        }
        for (int q = 0; q < Q; q++)
            for (int h = 0; h < H; h++) _mm512_storeu_ps(o + q * ldo + i + 16 * h, acc[H * q + h]);
    }
    for (; i < n; i += 16) {
        const __mmask16 m = z_mask_at(n, i);
        __m512 acc[16];
        for (int q = 0; q < Q; q++) acc[q] = _mm512_maskz_loadu_ps(m, o + q * ldo + i);
        for (size_t j = 0; j < count; j++) {
            const __m512 vv = z_load(elt, base + j * ldv * bytes, i, m);
            for (int q = 0; q < Q; q++) acc[q] = _mm512_fmadd_ps(_mm512_set1_ps(p[q * ldp + j]), vv, acc[q]);
        }
        for (int q = 0; q < Q; q++) _mm512_mask_storeu_ps(o + q * ldo + i, m, acc[q]);
    }
}

/* pv_f32 and pv_bf16: the outputs four at a time on 64 elements (each value chunk widened
 * once for four outputs; see z_dots_queries), the two or three left as a pair and one alone
 * on 128. */
ALWAYS_INLINE void z_pv_queries(int elt, float *o, size_t ldo, const float *p, size_t ldp,
                                size_t queries, const void *v, size_t ldv, size_t count,
                                size_t n) {
    size_t q = 0;
    for (; q + 4 <= queries; q += 4)
        z_pv(4, 4, elt, o + q * ldo, ldo, p + q * ldp, ldp, v, ldv, count, n);
    if (q + 2 <= queries) {
        z_pv(2, 8, elt, o + q * ldo, ldo, p + q * ldp, ldp, v, ldv, count, n);
        q += 2;
    }
    if (q < queries) z_pv(1, 8, elt, o + q * ldo, ldo, p + q * ldp, ldp, v, ldv, count, n);
}

static void pv_f32_avx512(float *o, size_t ldo, const float *p, size_t ldp, size_t queries,
                          const float *v, size_t ldv, size_t count, size_t n) {
    z_pv_queries(FMT_NONE, o, ldo, p, ldp, queries, v, ldv, count, n);
}

static void pv_bf16_avx512(float *o, size_t ldo, const float *p, size_t ldp, size_t queries,
                           const uint16_t *v, size_t ldv, size_t count, size_t n) {
    z_pv_queries(FMT_BF16, o, ldo, p, ldp, queries, v, ldv, count, n);
}

/* ---- exp, reductions, elementwise ---- */

/* parity_expf on 16 lanes, as exp8 in kernels_avx2.c: every lane computes on x clamped to
 * [EXP_LO, EXP_HI], then the out-of-range and NaN lanes take what the scalar branches
 * return. */
static inline __m512 z_exp(__m512 x) {
    const __m512 hi = _mm512_set1_ps(EXP_HI), lo = _mm512_set1_ps(EXP_LO);
    const __m512 magic = _mm512_set1_ps(ROUND_MAGIC);
    const __m512 xc = _mm512_min_ps(_mm512_max_ps(x, lo), hi);

    const __m512 t = _mm512_mul_ps(xc, _mm512_set1_ps(LOG2E));
    const __m512 n = _mm512_sub_ps(_mm512_add_ps(t, magic), magic);
    /* fmaf(-n, c, r) == -(n * c) + r: fnmadd, the same single rounding */
    __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(LN2_HI), xc);
    r = _mm512_fnmadd_ps(n, _mm512_set1_ps(LN2_LO), r);

    __m512 p = _mm512_set1_ps(EXP_C7);
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(EXP_C6));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(EXP_C5));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(EXP_C4));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(EXP_C3));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(EXP_C2));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));

    const __m512i ni = _mm512_cvttps_epi32(n); /* n is an integer: exact */
    const __m512i n1 = _mm512_sub_epi32(
        _mm512_srli_epi32(_mm512_add_epi32(ni, _mm512_set1_epi32(EXP_SCALE_BIAS)), 1),
        _mm512_set1_epi32(EXP_SCALE_BIAS / 2));
    const __m512i n2 = _mm512_sub_epi32(ni, n1);
    const __m512i bias = _mm512_set1_epi32(127);
    const __m512 s1 = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_add_epi32(n1, bias), 23));
    const __m512 s2 = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_add_epi32(n2, bias), 23));
    __m512 y = _mm512_mul_ps(_mm512_mul_ps(p, s1), s2);

    y = _mm512_mask_mov_ps(y, _mm512_cmp_ps_mask(x, hi, _CMP_GT_OQ), _mm512_set1_ps(INFINITY));
    y = _mm512_mask_mov_ps(y, _mm512_cmp_ps_mask(x, lo, _CMP_LT_OQ), _mm512_setzero_ps());
    return _mm512_mask_mov_ps(y, _mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q), _mm512_add_ps(x, x));
}

/* dot16 is one zmm: lane l of the accumulator is lane l of the specification. */
static float dot_f32_avx512(const float *a, const float *b, size_t n) {
    const void *const row[1] = {b};
    float out;
    z_dots(1, 1, FMT_NONE, a, 0, row, n, &out, 0);
    return out;
}

static float sum_squares_avx512(const float *x, size_t n) { return dot_f32_avx512(x, x, n); }

/* Lanes past the row add -0 (a padded lane computed exp(0 - m) and must add nothing). Four
 * vectors' exps are computed side by side (their polynomial chains overlap in program order
 * as well as in the core's window) and added to the one accumulator in order: the same
 * additions as one vector at a time. */
static float sum_exp_avx512(const float *x, size_t n, float m, float *out) {
    const __m512 mv = _mm512_set1_ps(m), neg0 = _mm512_set1_ps(-0.0f);
    __m512 acc = _mm512_setzero_ps();
    size_t i = 0;
    for (; i + 64 <= n; i += 64) {
        const __m512 e0 = z_exp(_mm512_sub_ps(_mm512_loadu_ps(x + i), mv));
        const __m512 e1 = z_exp(_mm512_sub_ps(_mm512_loadu_ps(x + i + 16), mv));
        const __m512 e2 = z_exp(_mm512_sub_ps(_mm512_loadu_ps(x + i + 32), mv));
        const __m512 e3 = z_exp(_mm512_sub_ps(_mm512_loadu_ps(x + i + 48), mv));
        if (out) {
            _mm512_storeu_ps(out + i, e0);
            _mm512_storeu_ps(out + i + 16, e1);
            _mm512_storeu_ps(out + i + 32, e2);
            _mm512_storeu_ps(out + i + 48, e3);
        }
        acc = _mm512_add_ps(_mm512_add_ps(_mm512_add_ps(_mm512_add_ps(acc, e0), e1), e2), e3);
    }
    for (; i < n; i += 16) {
        const __mmask16 k = z_mask_at(n, i);
        const __m512 e = z_exp(_mm512_sub_ps(_mm512_maskz_loadu_ps(k, x + i), mv));
        if (out) _mm512_mask_storeu_ps(out + i, k, e);
        acc = _mm512_add_ps(acc, _mm512_mask_mov_ps(neg0, k, e));
    }
    return z_fold16(acc);
}

/* The fold of max_f32's lanes, with its step: lane l = (lane l + h > lane l) ? lane l + h
 * : lane l. */
static inline float z_fold_max(__m512 acc) {
    const __m256 v = _mm256_max_ps(_mm512_extractf32x8_ps(acc, 1), _mm512_castps512_ps256(acc));
    const __m128 u = _mm_max_ps(_mm256_extractf128_ps(v, 1), _mm256_castps256_ps128(v));
    const __m128 t = _mm_max_ps(_mm_movehl_ps(u, u), u);
    return _mm_cvtss_f32(_mm_max_ss(_mm_movehdup_ps(t), t));
}

/* vmaxps(x, m) = (x > m) ? x : m, the step of the specification; lanes past the row hold
 * x[0], which never replaces anything (every lane starts at x[0]). */
static float max_f32_avx512(const float *x, size_t n) {
    const __m512 x0 = _mm512_set1_ps(x[0]);
    __m512 acc = x0;
    for (size_t i = 0; i < n; i += 16)
        acc = _mm512_max_ps(_mm512_mask_loadu_ps(x0, z_mask_at(n, i), x + i), acc);
    return z_fold_max(acc);
}

/* One pass, full vectors loaded and stored whole; the max taken on the way as max_f32 takes
 * it, every lane starting at the new x[0] and the lanes past the row holding it. */
static void scale_round_avx512(float *x, size_t n, float scale, int before, int after, float *max) {
    const __m512 sv = _mm512_set1_ps(scale);
    __m512 acc = _mm512_setzero_ps(), x0 = acc;
    for (size_t i = 0; i < n; i += 16) {
        const __mmask16 m = z_mask_at(n, i);
        const __m512 v = m == 0xffff ? _mm512_loadu_ps(x + i) : _mm512_maskz_loadu_ps(m, x + i);
        const __m512 r = z_round_if(after, _mm512_mul_ps(z_round_if(before, v), sv));
        if (m == 0xffff)
            _mm512_storeu_ps(x + i, r);
        else
            _mm512_mask_storeu_ps(x + i, m, r);
        if (i == 0) acc = x0 = _mm512_broadcastss_ps(_mm512_castps512_ps128(r));
        acc = _mm512_max_ps(_mm512_mask_mov_ps(x0, m, r), acc);
    }
    if (max) *max = z_fold_max(acc);
}

static void exp_f32_avx512(float *x, size_t n) {
    for (size_t i = 0; i < n; i += 16) {
        const __mmask16 m = z_mask_at(n, i);
        _mm512_mask_storeu_ps(x + i, m, z_exp(_mm512_maskz_loadu_ps(m, x + i)));
    }
}

static void axpy_f32_avx512(float *o, float p, const float *v, size_t n) {
    const __m512 pv = _mm512_set1_ps(p);
    for (size_t i = 0; i < n; i += 16) {
        const __mmask16 m = z_mask_at(n, i);
        const __m512 r = _mm512_fmadd_ps(pv, _mm512_maskz_loadu_ps(m, v + i), _mm512_maskz_loadu_ps(m, o + i));
        _mm512_mask_storeu_ps(o + i, m, r);
    }
}

/* ---- regions ---- */

/* norm_points_of, swiglu_points_of, rope_points_of, inv_rms: kernel_common.h. */

/* round_if(out, w * round_if(twice, v * r)) */
static inline __m512 z_norm_value(norm_points p, __m512 w, __m512 v, __m512 r) {
    return z_round_if(p.out, _mm512_mul_ps(w, z_round_if(p.twice, _mm512_mul_ps(v, r))));
}

/* The bodies serve every buffer type (`elt`), as in kernels_avx2.c; the sum of squares is
 * one zmm of dot16 lanes, padded lanes adding v = +0 (harmless: a sum of squares is never
 * -0). Pass 2 recomputes s, as the specification does. */
ALWAYS_INLINE void z_rmsnorm_residual_body(int elt, const parity_policy *pol, size_t dim,
                                           const void *delta, const void *residual,
                                           const void *w, float eps, void *residual_out,
                                           void *out) {
    const norm_points p = norm_points_of(pol, 1, 0);
    __m512 acc = _mm512_setzero_ps();
    for (size_t i = 0; i < dim; i += 16) {
        const __mmask16 m = z_mask_at(dim, i);
        const __m512 s = _mm512_add_ps(z_load(elt, residual, i, m), z_load(elt, delta, i, m));
        const __m512 v = z_round_if(p.rounded_in, s);
        acc = _mm512_fmadd_ps(v, v, acc);
    }
    const __m512 r = _mm512_set1_ps(inv_rms(z_fold16(acc), dim, eps));
    for (size_t i = 0; i < dim; i += 16) {
        const __mmask16 m = z_mask_at(dim, i);
        const __m512 s = _mm512_add_ps(z_load(elt, residual, i, m), z_load(elt, delta, i, m));
        const __m512 o = z_norm_value(p, z_load(elt, w, i, m), z_round_if(p.rounded_in, s), r);
        z_store(elt, residual_out, i, m, z_round_if(p.out, s));
        z_store(elt, out, i, m, o);
    }
}

ALWAYS_INLINE void z_rmsnorm_body(int elt, const parity_policy *pol, int qk, size_t dim,
                                  const void *x, const void *w, float eps, void *out) {
    const norm_points p = norm_points_of(pol, 0, qk);
    __m512 acc = _mm512_setzero_ps();
    for (size_t i = 0; i < dim; i += 16) {
        const __m512 v = z_load(elt, x, i, z_mask_at(dim, i));
        acc = _mm512_fmadd_ps(v, v, acc);
    }
    const __m512 r = _mm512_set1_ps(inv_rms(z_fold16(acc), dim, eps));
    for (size_t i = 0; i < dim; i += 16) {
        const __mmask16 m = z_mask_at(dim, i);
        z_store(elt, out, i, m, z_norm_value(p, z_load(elt, w, i, m), z_load(elt, x, i, m), r));
    }
}

ALWAYS_INLINE void z_swiglu_body(int elt, const parity_policy *pol, size_t n, const void *g,
                                 const void *u, void *out) {
    const op_points p = swiglu_points_of(pol);
    const __m512 one = _mm512_set1_ps(1.0f), sign = _mm512_set1_ps(-0.0f);
    for (size_t i = 0; i < n; i += 16) {
        const __mmask16 m = z_mask_at(n, i);
        const __m512 gv = z_load(elt, g, i, m), uv = z_load(elt, u, i, m);
        /* silu(g) = g / (1 + exp(-g)); -g flips the sign bit, as C's unary minus does */
        const __m512 silu = _mm512_div_ps(gv, _mm512_add_ps(one, z_exp(_mm512_xor_ps(gv, sign))));
        z_store(elt, out, i, m, z_round_if(p.out, _mm512_mul_ps(z_round_if(p.per_op, silu), uv)));
    }
}

ALWAYS_INLINE void z_rope_body(int elt, const parity_policy *pol, size_t n_heads, size_t hd,
                               void *x, const float *cos, const float *sin) {
    const op_points p = rope_points_of(pol);
    const size_t half = hd / 2;
    for (size_t h = 0; h < n_heads; h++) {
        const size_t base = h * hd;
        for (size_t i = 0; i < half; i += 16) {
            const __mmask16 m = z_mask_at(half, i);
            const __m512 a = z_load(elt, x, base + i, m), b = z_load(elt, x, base + half + i, m);
            const __m512 c = _mm512_maskz_loadu_ps(m, cos + i), sn = _mm512_maskz_loadu_ps(m, sin + i);
            const __m512 a2 = _mm512_sub_ps(z_round_if(p.per_op, _mm512_mul_ps(a, c)),
                                            z_round_if(p.per_op, _mm512_mul_ps(b, sn)));
            const __m512 b2 = _mm512_add_ps(z_round_if(p.per_op, _mm512_mul_ps(b, c)),
                                            z_round_if(p.per_op, _mm512_mul_ps(a, sn)));
            z_store(elt, x, base + i, m, z_round_if(p.out, a2));
            z_store(elt, x, base + half + i, m, z_round_if(p.out, b2));
        }
    }
}

static void rmsnorm_residual_avx512(const parity_policy *pol, size_t dim, const float *delta,
                                    float *residual, const float *w, float eps, float *out) {
    z_rmsnorm_residual_body(FMT_NONE, pol, dim, delta, residual, w, eps, residual, out);
}

static void rmsnorm_avx512(const parity_policy *pol, int qk, size_t dim, const float *x,
                           const float *w, float eps, float *out) {
    z_rmsnorm_body(FMT_NONE, pol, qk, dim, x, w, eps, out);
}

static void swiglu_avx512(const parity_policy *pol, size_t n, const float *g, const float *u,
                          float *out) {
    z_swiglu_body(FMT_NONE, pol, n, g, u, out);
}

static void rope_avx512(const parity_policy *pol, size_t n_heads, size_t hd, float *x,
                        const float *cos, const float *sin) {
    z_rope_body(FMT_NONE, pol, n_heads, hd, x, cos, sin);
}

/* The 16-bit forms: one instance of each body per buffer format. */
static void rmsnorm_residual_16_avx512(const parity_policy *pol, size_t dim, const uint16_t *delta,
                                       const uint16_t *residual, const uint16_t *w, float eps,
                                       uint16_t *residual_out, uint16_t *out) {
    if (buffer_format_of(pol) == FMT_FP16)
        z_rmsnorm_residual_body(FMT_FP16, pol, dim, delta, residual, w, eps, residual_out, out);
    else
        z_rmsnorm_residual_body(FMT_BF16, pol, dim, delta, residual, w, eps, residual_out, out);
}

static void rmsnorm_16_avx512(const parity_policy *pol, int qk, size_t dim, const uint16_t *x,
                              const uint16_t *w, float eps, uint16_t *out) {
    if (buffer_format_of(pol) == FMT_FP16)
        z_rmsnorm_body(FMT_FP16, pol, qk, dim, x, w, eps, out);
    else
        z_rmsnorm_body(FMT_BF16, pol, qk, dim, x, w, eps, out);
}

static void swiglu_16_avx512(const parity_policy *pol, size_t n, const uint16_t *g,
                             const uint16_t *u, uint16_t *out) {
    if (buffer_format_of(pol) == FMT_FP16)
        z_swiglu_body(FMT_FP16, pol, n, g, u, out);
    else
        z_swiglu_body(FMT_BF16, pol, n, g, u, out);
}

static void rope_16_avx512(const parity_policy *pol, size_t n_heads, size_t hd, uint16_t *x,
                           const float *cos, const float *sin) {
    if (buffer_format_of(pol) == FMT_FP16)
        z_rope_body(FMT_FP16, pol, n_heads, hd, x, cos, sin);
    else
        z_rope_body(FMT_BF16, pol, n_heads, hd, x, cos, sin);
}

/* ---- small M: rows (gemm_bf16w) ----
 *
 * One zmm is the 16 lanes of pair32 for one output: per chunk, the packed x row's even and
 * odd elements are two zmm (gemm_pack_x), and the weight row's 32 bf16 are one zmm of
 * dwords, split into its odd (d & 0xffff0000) and even (d << 16) halves; lane l then takes
 * fma(x_even, w_even, fma(x_odd, w_odd, acc)), the odd element first. A block is R x rows
 * against C weight rows (R * C accumulators): 4 x 4 (each weight chunk split once for 4
 * rows), with the rows left over in blocks of 1 to 3; a decode step of one row takes 16
 * weight rows one after another instead (zr_rowwise). Weight rows are read straight from
 * memory, the next chunks asked for a few steps ahead; the block's rows after the first find
 * them in L1. Past K, x is packed with +0 and the weight chunk is loaded with -0 (0x8000) in
 * the missing elements, so a padded step adds -0 and leaves the lane as it was. */
#define ZR_PF_CHUNKS 8

/* The 32 bf16 of w's chunk at k, -0 past K, as 16 dwords. */
static inline __m512i zr_load_w(const uint16_t *w, size_t k, size_t K) {
    if (k + 32 <= K) return _mm512_loadu_si512((const void *)(w + k));
    return _mm512_mask_loadu_epi16(_mm512_set1_epi16((short)0x8000), (__mmask32)((1ull << (K - k)) - 1),
                                   w + k);
}

ALWAYS_INLINE void zr_block(const int R, const int C, size_t K, const float *xp, size_t row,
                            const uint16_t *w, size_t ldw, float *y, size_t ldy) {
    const __m512i high16 = _mm512_set1_epi32((int)0xffff0000u);
    __m512 acc[16];
    for (int a = 0; a < R * C; a++) acc[a] = _mm512_setzero_ps();
    for (size_t k = 0; k < K; k += 32) {
        __m512 xe[4], xo[4];
        for (int i = 0; i < R; i++) {
            xe[i] = _mm512_loadu_ps(xp + i * row + k);
            xo[i] = _mm512_loadu_ps(xp + i * row + k + 16);
        }
        for (int j = 0; j < C; j++) {
            const uint16_t *wj = w + j * ldw;
            _mm_prefetch((const char *)(wj + k + 32 * ZR_PF_CHUNKS), _MM_HINT_T0);
            const __m512i d = zr_load_w(wj, k, K);
            const __m512 wo = _mm512_castsi512_ps(_mm512_and_si512(d, high16));
            const __m512 we = _mm512_castsi512_ps(_mm512_slli_epi32(d, 16));
            for (int i = 0; i < R; i++) {
                acc[C * i + j] = _mm512_fmadd_ps(xo[i], wo, acc[C * i + j]);
                acc[C * i + j] = _mm512_fmadd_ps(xe[i], we, acc[C * i + j]);
            }
        }
    }
    z_store_block(R, C, acc, y, ldy);
}

/* One x row against C weight rows (a decode step), row after row: each weight row's chunks
 * in order on one accumulator (the chain of zr_block's acc[j], the same bits), so that the
 * weights are read as one linear stream, which the hardware prefetchers follow better than
 * C streams of K elements each, the line ZR_PF_LINEAR elements ahead asked into L1 across
 * rows; the out-of-order core overlaps the rows' chains (bf_rowwise in kernels_avx512bf16.c
 * is the same loop on vdpbf16ps). Zen 4 VM, 2 threads, gemm-bench --m 1 --thp over the six
 * shapes: 20-32 GB/s with 1 x 8 blocks (20 at K = 1024), 27-38 row after row; a decode step
 * of one row (bench/ab-builds, avx512 path, 12 pairs each way round) took 0.69 and 1/1.43
 * of its time before. */
#define ZR_PF_LINEAR 3072
ALWAYS_INLINE void zr_rowwise(const int C, size_t K, const float *xp, const uint16_t *w,
                              size_t ldw, float *y) {
    const __m512i high16 = _mm512_set1_epi32((int)0xffff0000u);
    __m512 acc[16];
#pragma GCC unroll 16
    for (int j = 0; j < C; j++) {
        const uint16_t *wj = w + j * ldw;
        __m512 a = _mm512_setzero_ps();
        for (size_t k = 0; k < K; k += 32) {
            _mm_prefetch((const char *)(wj + k + ZR_PF_LINEAR), _MM_HINT_T0);
            const __m512i d = zr_load_w(wj, k, K);
            a = _mm512_fmadd_ps(_mm512_loadu_ps(xp + k + 16),
                                _mm512_castsi512_ps(_mm512_and_si512(d, high16)), a);
            a = _mm512_fmadd_ps(_mm512_loadu_ps(xp + k),
                                _mm512_castsi512_ps(_mm512_slli_epi32(d, 16)), a);
        }
        acc[j] = a;
    }
    z_store_block(1, C, acc, y, 0);
}

/* Rows [0, M) against C weight rows: blocks of 4 rows, then the 1 to 3 left. */
ALWAYS_INLINE void zr_rows(const int C, size_t M, size_t K, const float *xp, size_t row,
                           const uint16_t *w, size_t ldw, float *y, size_t ldy) {
    size_t m = 0;
    for (; m + 4 <= M; m += 4) zr_block(4, C, K, xp + m * row, row, w, ldw, y + m * ldy, ldy);
    switch (M - m) {
    case 3: zr_block(3, C, K, xp + m * row, row, w, ldw, y + m * ldy, ldy); break;
    case 2: zr_block(2, C, K, xp + m * row, row, w, ldw, y + m * ldy, ldy); break;
    case 1: zr_block(1, C, K, xp + m * row, row, w, ldw, y + m * ldy, ldy); break;
    default: break;
    }
}

PAIR32_BODY void zr_gemm(size_t M, size_t K, const float *xp, const uint16_t *w, size_t ldw,
                         float *y, size_t ldy, size_t n0, size_t n1) {
    const size_t row = gemm_packed_row(K);
    size_t n = n0;
    if (M == 1)
        for (; n + 16 <= n1; n += 16) zr_rowwise(16, K, xp, w + n * ldw, ldw, y + n);
    for (; n + 4 <= n1; n += 4) zr_rows(4, M, K, xp, row, w + n * ldw, ldw, y + n, ldy);
    for (; n < n1; n++) zr_rows(1, M, K, xp, row, w + n * ldw, ldw, y + n, ldy);
}

static void gemm_bf16w_avx512(size_t M, size_t K, const float *xp, const uint16_t *w, size_t ldw,
                              float *y, size_t ldy, size_t n0, size_t n1) {
    const unsigned mxcsr = pair32_flush_begin();
    zr_gemm(M, K, xp, w, ldw, y, ldy, n0, n1);
    pair32_flush_end(mxcsr);
}

/* ---- fp32 weights (gemm_f32w, PARITY_COMPUTE_FP32) ----
 *
 * dot16 on fp32 weights: one zmm is one output's 16 lanes, element i in lane i % 16. A block
 * is R x rows against C weight rows (1 x 8 for one row, 4 x 4 otherwise, the rest in
 * smaller blocks), x rows blocked to a fraction of the L2 as in the AVX2 kernel; the last,
 * partial chunk pads x with -0 and w with +0, so a padded lane adds -0 and stays as it was. */
static size_t z_xblock_bytes(void); /* below, with the lane tiles */

ALWAYS_INLINE void zf_block(const int R, const int C, size_t K, const float *x, size_t ldx,
                            const float *w, size_t ldw, float *y, size_t ldy) {
    __m512 acc[16];
    for (int a = 0; a < R * C; a++) acc[a] = _mm512_setzero_ps();
    size_t k = 0;
    for (; k + 16 <= K; k += 16) {
        __m512 xv[4];
        for (int i = 0; i < R; i++) xv[i] = _mm512_loadu_ps(x + i * ldx + k);
        for (int j = 0; j < C; j++) {
            const __m512 wv = _mm512_loadu_ps(w + j * ldw + k);
            for (int i = 0; i < R; i++) acc[C * i + j] = _mm512_fmadd_ps(xv[i], wv, acc[C * i + j]);
        }
    }
    if (k < K) {
        const __mmask16 m = z_mask(K - k);
        __m512 xv[4];
        for (int i = 0; i < R; i++) xv[i] = _mm512_mask_loadu_ps(_mm512_set1_ps(-0.0f), m, x + i * ldx + k);
        for (int j = 0; j < C; j++) {
            const __m512 wv = _mm512_maskz_loadu_ps(m, w + j * ldw + k);
            for (int i = 0; i < R; i++) acc[C * i + j] = _mm512_fmadd_ps(xv[i], wv, acc[C * i + j]);
        }
    }
    z_store_block(R, C, acc, y, ldy);
}

ALWAYS_INLINE void zf_rows(const int C, size_t M, size_t K, const float *x, size_t ldx,
                           const float *w, size_t ldw, float *y, size_t ldy) {
    size_t m = 0;
    for (; m + 4 <= M; m += 4) zf_block(4, C, K, x + m * ldx, ldx, w, ldw, y + m * ldy, ldy);
    switch (M - m) {
    case 3: zf_block(3, C, K, x + m * ldx, ldx, w, ldw, y + m * ldy, ldy); break;
    case 2: zf_block(2, C, K, x + m * ldx, ldx, w, ldw, y + m * ldy, ldy); break;
    case 1: zf_block(1, C, K, x + m * ldx, ldx, w, ldw, y + m * ldy, ldy); break;
    default: break;
    }
}

static void gemm_f32w_avx512(size_t M, size_t K, const float *x, size_t ldx, const float *w,
                             size_t ldw, float *y, size_t ldy, size_t n0, size_t n1) {
    /* x rows per block: a quarter of the L2 (the weights stream past it) */
    size_t block = z_xblock_bytes() / 5 * 2 / ((K ? K : 1) * sizeof(float)) / 4 * 4;
    if (block < 4) block = 4;
    for (size_t m0 = 0; m0 < M; m0 += block) {
        const size_t rows = M - m0 < block ? M - m0 : block;
        const float *xm = x + m0 * ldx;
        float *ym = y + m0 * ldy;
        size_t n = n0;
        if (rows == 1)
            for (; n + 8 <= n1; n += 8) zf_block(1, 8, K, xm, ldx, w + n * ldw, ldw, ym + n, ldy);
        for (; n + 4 <= n1; n += 4) zf_rows(4, rows, K, xm, ldx, w + n * ldw, ldw, ym + n, ldy);
        for (; n < n1; n++) zf_rows(1, rows, K, xm, ldx, w + n * ldw, ldw, ym + n, ldy);
    }
}

/* ---- large M: lane tiles (gemm_bf16w_tiles) ----
 *
 * As in kernels_avx2.c, pair32's 16 lanes are 16 independent chains and gemm_pack_xt lays
 * each lane's sequence out with the 16 rows of a tile side by side: one zmm is one step of
 * one lane for 16 rows. A register block is two tiles (32 rows) x Z_NR = 8 weight rows: per
 * step 2 x loads, 8 broadcasts and 16 fmas into 16 accumulators.
 *
 * The weight panel is widened to fp32 lane by lane (lane-major): lane l's pairs of chunk c
 * for the 8 weight rows are one cache line, [w0(k0) .. w7(k0), w0(k1) .. w7(k1)] with
 * k0 = 32c + 2l, k1 = k0 + 1. So a lane runs through the whole of K with its own 64 bytes
 * per chunk, the panel needs no K blocking (it streams from L2, a line per chunk), and each
 * lane's 16 accumulators are stored once, for the fold at the end. The x tiles are taken in
 * blocks (an even number of tiles, about 5/8 of the core's L2: z_xblock_bytes) that stay in
 * L2 while every panel of the thread's columns passes over them; the next panel's weight
 * rows are asked into L2 while the current one is computed. No blocking changes a chain's
 * order, so the L2 size read here moves no bit.
 */
#define Z_NR 8
#define Z_PF_CHUNKS 6

/* 5/8 of the L2 (measured on a 2 MB L2: 1.25 MB blocks ran faster than 640 KB ones, the
 * panel widened half as often, and no slower than 1.75 MB), 1 MB where the OS does not say. */
static size_t z_xblock_bytes(void) {
    static _Atomic size_t cached;
    size_t b = atomic_load_explicit(&cached, memory_order_relaxed);
    if (!b) {
        const long l2 = sysconf(_SC_LEVEL2_CACHE_SIZE);
        b = l2 >= 256 * 1024 ? (size_t)l2 / 8 * 5 : 1024u * 1024u;
        atomic_store_explicit(&cached, b, memory_order_relaxed);
    }
    return b;
}

/* Weight rows w, w + ldw, ... (nr <= Z_NR of them, K columns) widened into the lane-major
 * panel: lane l, chunk c is the line at panel + (l * nc + c) * 16, holding row j's even
 * element (k = 32c + 2l) at j and its odd one (k + 1) at 8 + j. Rows past nr and elements
 * past K hold -0.
 *
 * Per chunk: the 8 rows' 16 pairs (a bf16 pair is one dword) are transposed to 16 lanes of
 * 8 dwords (two lanes per zmm: unpack epi32, unpack epi64, then a qword permute across the
 * 128-bit lanes), and each dword splits into its two fp32 values with one shift (even:
 * d << 16) and one and (odd: d & 0xffff0000); bf16 -0 (0x8000) pads. */
static void z_widen(size_t K, size_t nc, const uint16_t *w, size_t ldw, size_t nr, float *panel) {
    static const uint16_t neg0_chunk[32] __attribute__((aligned(64))) = {
        0x8000, 0x8000, 0x8000, 0x8000, 0x8000, 0x8000, 0x8000, 0x8000,
        0x8000, 0x8000, 0x8000, 0x8000, 0x8000, 0x8000, 0x8000, 0x8000,
        0x8000, 0x8000, 0x8000, 0x8000, 0x8000, 0x8000, 0x8000, 0x8000,
        0x8000, 0x8000, 0x8000, 0x8000, 0x8000, 0x8000, 0x8000, 0x8000};
    uint16_t tail[Z_NR][32];
    const __m512i lanes_0_4 = _mm512_setr_epi64(0, 1, 8, 9, 2, 3, 10, 11);
    const __m512i lanes_8_12 = _mm512_setr_epi64(4, 5, 12, 13, 6, 7, 14, 15);
    const __m512i high16 = _mm512_set1_epi32((int)0xffff0000u);
    for (size_t c = 0; c < nc; c++) {
        const int full = 32 * c + 32 <= K;
        __m512i r[Z_NR], t[Z_NR], u[Z_NR];
        for (size_t j = 0; j < Z_NR; j++) {
            const uint16_t *src = neg0_chunk;
            if (j < nr) {
                src = w + j * ldw + 32 * c;
                _mm_prefetch((const char *)(src + 32 * Z_PF_CHUNKS), _MM_HINT_T0);
                if (!full) {
                    memcpy(tail[j], neg0_chunk, sizeof tail[j]);
                    memcpy(tail[j], src, (K - 32 * c) * sizeof *src);
                    src = tail[j];
                }
            }
            r[j] = _mm512_loadu_si512((const void *)src); /* row j: pair l in dword l */
        }
        /* per 128-bit lane q: u[i] (i < 4) holds dword 4q + i of rows 0..3, u[4 + i] of rows 4..7 */
        for (int i = 0; i < 8; i += 2) {
            t[i] = _mm512_unpacklo_epi32(r[i], r[i + 1]);
            t[i + 1] = _mm512_unpackhi_epi32(r[i], r[i + 1]);
        }
        for (int h = 0; h < 8; h += 4) {
            u[h + 0] = _mm512_unpacklo_epi64(t[h + 0], t[h + 2]);
            u[h + 1] = _mm512_unpackhi_epi64(t[h + 0], t[h + 2]);
            u[h + 2] = _mm512_unpacklo_epi64(t[h + 1], t[h + 3]);
            u[h + 3] = _mm512_unpackhi_epi64(t[h + 1], t[h + 3]);
        }
        for (size_t i = 0; i < 4; i++)
            for (size_t g = 0; g < 2; g++) {
                /* lanes a (low 256 bits) and a + 4 (high): all 8 rows' pairs of each */
                const size_t a = i + 8 * g;
                const __m512i v = _mm512_permutex2var_epi64(u[i], g ? lanes_8_12 : lanes_0_4, u[4 + i]);
                const __m512i even = _mm512_slli_epi32(v, 16), odd = _mm512_and_si512(v, high16);
                _mm512_storeu_si512((void *)(panel + (a * nc + c) * 16),
                                    _mm512_shuffle_i64x2(even, odd, 0x44));
                _mm512_storeu_si512((void *)(panel + ((a + 4) * nc + c) * 16),
                                    _mm512_shuffle_i64x2(even, odd, 0xee));
            }
    }
}

/* Lane l of a tile pair through all nc chunks: xa, xb the lane's packed x in the two tiles
 * (chunk c at + 32c: the odd step's 16 rows, then the even step's), wl the lane's panel
 * lines (chunk c at + 16c). H tiles (1 or 2). The chains go to out, or, where `fold` is given
 * (lanes 8-15), the dot16 fold's first step is taken on the way: fold (lane l - 8, finished
 * before) becomes fold + these chains. */
ALWAYS_INLINE void z_lane(const int H, size_t nc, const float *xa, const float *xb,
                          const float *wl, __m512 out[Z_NR][2], __m512 fold[Z_NR][2]) {
    __m512 acc[Z_NR][2];
#pragma GCC unroll 8
    for (int j = 0; j < Z_NR; j++) acc[j][0] = acc[j][1] = _mm512_setzero_ps();
    for (size_t c = 0; c < nc; c++) {
        const float *xs0 = xa + 32 * c, *xs1 = xb + 32 * c, *ws = wl + 16 * c;
        /* x and panel lines come from L2: asked for Z_PF_CHUNKS chunks ahead (measured: the
         * hardware prefetchers alone left the loop at about 70% of the fma peak) */
        _mm_prefetch((const char *)(xs0 + 32 * Z_PF_CHUNKS), _MM_HINT_T0);
        _mm_prefetch((const char *)(xs0 + 32 * Z_PF_CHUNKS + 16), _MM_HINT_T0);
        if (H > 1) {
            _mm_prefetch((const char *)(xs1 + 32 * Z_PF_CHUNKS), _MM_HINT_T0);
            _mm_prefetch((const char *)(xs1 + 32 * Z_PF_CHUNKS + 16), _MM_HINT_T0);
        }
        _mm_prefetch((const char *)(ws + 16 * Z_PF_CHUNKS), _MM_HINT_T0);
#pragma GCC unroll 2
        for (int s = 0; s < 2; s++) {
            const __m512 x0 = _mm512_loadu_ps(xs0 + 16 * s);
            const __m512 x1 = H > 1 ? _mm512_loadu_ps(xs1 + 16 * s) : x0;
#pragma GCC unroll 8
            for (int j = 0; j < Z_NR; j++) {
                const __m512 b = _mm512_set1_ps(ws[8 * (1 - s) + j]); /* odd element, then even */
                acc[j][0] = _mm512_fmadd_ps(x0, b, acc[j][0]);
                if (H > 1) acc[j][1] = _mm512_fmadd_ps(x1, b, acc[j][1]);
            }
        }
    }
#pragma GCC unroll 8
    for (int j = 0; j < Z_NR; j++)
        for (int h = 0; h < H; h++)
            if (fold) fold[j][h] = _mm512_add_ps(fold[j][h], acc[j][h]);
            else out[j][h] = acc[j][h];
}

/* One tile pair (H tiles, `rows` <= 16H valid rows) against the panel's nr weight rows:
 * y[r][j]. Every lane through all of K, then the dot16 fold across the lanes. */
ALWAYS_INLINE void z_tile(const int H, size_t nc, const float *tile0, const float *tile1,
                          const float *panel, size_t rows, size_t nr, float *y, size_t ldy,
                          panel_prefetch *pf) {
    __m512 lanes[16][Z_NR][2]; /* 16 KB */
    for (size_t l = 0; l < 16; l++) {
        panel_prefetch_some(pf);
        z_lane(H, nc, tile0 + l * nc * 32, tile1 + l * nc * 32, panel + l * nc * 16, lanes[l],
               l >= 8 ? lanes[l - 8] : NULL);
    }
    /* the rest of the dot16 fold (l += l + 8 was taken as lanes 8-15 ended): l += l + 4, +2, +1 */
    for (size_t step = 4; step >= 1; step /= 2)
        for (size_t l = 0; l < step; l++)
            for (int j = 0; j < Z_NR; j++)
                for (int h = 0; h < H; h++)
                    lanes[l][j][h] = _mm512_add_ps(lanes[l][j][h], lanes[l + step][j][h]);
    /* each tile's 16 x 8 block transposed in two 8 x 8 halves, one masked store of nr floats
     * per row */
    const __mmask8 mask = (__mmask8)((1u << nr) - 1);
    for (int h = 0; h < H; h++)
        for (int half = 0; half < 2; half++) {
            __m256 c[8], r[8];
            for (int j = 0; j < 8; j++)
                c[j] = half ? _mm512_extractf32x8_ps(lanes[0][j][h], 1)
                            : _mm512_castps512_ps256(lanes[0][j][h]);
            transpose8(c, r);
            for (size_t i = 0; i < 8; i++) {
                const size_t m = 16 * (size_t)h + 8 * (size_t)half + i;
                if (m < rows) _mm256_mask_storeu_ps(y + m * ldy, mask, r[i]);
            }
        }
}

static void z_tile2(size_t nc, const float *tile0, const float *tile1, const float *panel,
                    size_t rows, size_t nr, float *y, size_t ldy, panel_prefetch *pf) {
    z_tile(2, nc, tile0, tile1, panel, rows, nr, y, ldy, pf);
}
static void z_tile1(size_t nc, const float *tile0, const float *tile1, const float *panel,
                    size_t rows, size_t nr, float *y, size_t ldy, panel_prefetch *pf) {
    z_tile(1, nc, tile0, tile1, panel, rows, nr, y, ldy, pf);
}

PAIR32_BODY void z_gemm_tiles(size_t M, size_t K, const float *xt, const uint16_t *w,
                              size_t ldw, float *y, size_t ldy, size_t n0, size_t n1,
                              float *panel) {
    const size_t row = gemm_packed_row(K), nc = row / 32, tiles = gemm_xt_tiles(M);
    const size_t tile_floats = GEMM_XT_ROWS * row;
    size_t tb = row ? z_xblock_bytes() / (tile_floats * sizeof(float)) / 2 * 2 : tiles;
    if (tb < 2) tb = 2;
    for (size_t t0 = 0; t0 < tiles; t0 += tb) {
        const size_t t1 = tiles - t0 < tb ? tiles : t0 + tb;
        /* lane passes per panel: where the next panel's lines are asked for */
        const size_t slots = (t1 - t0 + 1) / 2 * 16;
        for (size_t n = n0; n < n1; n += Z_NR) {
            const size_t nr = n1 - n < Z_NR ? n1 - n : Z_NR;
            z_widen(K, nc, w + n * ldw, ldw, nr, panel);
            panel_prefetch pf = {NULL, ldw * 2, (K * 2 + 63) / 64, 0, 0, 0};
            if (n + Z_NR < n1 && pf.lines_per_row) {
                const size_t next_nr = n1 - n - Z_NR < Z_NR ? n1 - n - Z_NR : Z_NR;
                pf.w = (const char *)(w + (n + Z_NR) * ldw);
                pf.lines = next_nr * pf.lines_per_row;
                pf.per_slot = (pf.lines + slots - 1) / slots;
            }
            for (size_t t = t0; t < t1; t += 2) {
                const size_t m = t * GEMM_XT_ROWS, h = t + 1 < t1 ? 2 : 1;
                const size_t rows = M - m < GEMM_XT_ROWS * h ? M - m : GEMM_XT_ROWS * h;
                const float *tile0 = xt + t * tile_floats;
                if (h == 2)
                    z_tile2(nc, tile0, tile0 + tile_floats, panel, rows, nr, y + m * ldy + n, ldy, &pf);
                else
                    z_tile1(nc, tile0, tile0, panel, rows, nr, y + m * ldy + n, ldy, &pf);
            }
        }
    }
}

static void gemm_bf16w_tiles_avx512(size_t M, size_t K, const float *xt, const uint16_t *w,
                                    size_t ldw, float *y, size_t ldy, size_t n0, size_t n1,
                                    float *panel) {
    const unsigned mxcsr = pair32_flush_begin();
    z_gemm_tiles(M, K, xt, w, ldw, y, ldy, n0, n1, panel);
    pair32_flush_end(mxcsr);
}

/* The entries of this file over a copy of the AVX2 table (kernels.h). */
void kernels_avx512_set_entries(kernels *t) {
    t->name = "avx512";
    t->round_bf16 = round_bf16_avx512;
    t->scale_round = scale_round_avx512;
    t->round_fp16 = round_fp16_avx512;
    t->widen_bf16 = widen_bf16_avx512;
    t->dot_f32_bf16 = dot_f32_bf16_avx512;
    t->dots_f32 = dots_f32_avx512;
    t->dots_f32_bf16 = dots_f32_bf16_avx512;
    t->axpy_bf16 = axpy_bf16_avx512;
    t->pv_f32 = pv_f32_avx512;
    t->pv_bf16 = pv_bf16_avx512;
    t->gemm_bf16w_tiles = gemm_bf16w_tiles_avx512;
    /* below 64 rows the row kernel (1 x 8 and 4 x 4 blocks, weights split in registers) ran
     * faster than the lane tiles, whose panel widening is shared by too few rows:
     * build/bench/gemm-bench --m 16,24,32,40,48,56 on Qwen3-0.6B's q and down shapes, 2
     * threads, 3 runs each way on an Intel Xeon (5th generation), 10-30% at 16-40 rows, 5-10%
     * at 48-56, even at 64-128 */
    t->tiles_min_m = 64;
    t->gemm_bf16w = gemm_bf16w_avx512;
    t->gemm_f32w = gemm_f32w_avx512;
    t->dot_f32 = dot_f32_avx512;
    t->sum_squares = sum_squares_avx512;
    t->sum_exp = sum_exp_avx512;
    t->max_f32 = max_f32_avx512;
    t->exp_f32 = exp_f32_avx512;
    t->axpy_f32 = axpy_f32_avx512;
    t->rmsnorm_residual = rmsnorm_residual_avx512;
    t->rmsnorm = rmsnorm_avx512;
    t->swiglu = swiglu_avx512;
    t->rope = rope_avx512;
    t->rmsnorm_residual_16 = rmsnorm_residual_16_avx512;
    t->rmsnorm_16 = rmsnorm_16_avx512;
    t->swiglu_16 = swiglu_16_avx512;
    t->rope_16 = rope_16_avx512;
}
