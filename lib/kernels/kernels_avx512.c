/*
 * The AVX-512 kernels (AVX-512F, BW, VL, DQ) but the GEMMs (gemm_avx512.c): elementwise
 * kernels, attention's q.k and P.V blocks, reductions, and the region kernels (simd_shared.h
 * on 16 lanes of zmm); kernels_ref.c on 16 fp32 lanes, bit for bit, and the avx512 table's
 * entries.
 *
 * Compiled with -mavx512f -mavx512bw -mavx512vl -mavx512dq, as gemm_avx512.c; cpu.c selects
 * this table only on a CPU (and OS) that has them. The table is the AVX2 one with the entries
 * of this file and of gemm_avx512.c over it, so an entry not written there is the AVX2 kernel
 * (equal to the specification like every entry). The rules of kernels_avx2.c hold here too:
 * the orders of the specification exactly, padding terms -0, masked loads and stores at the
 * ends of rows, no fp contraction (every fma below is written as one).
 */
#include <immintrin.h>
#include <string.h>

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

/* fp32 -> fp16 on 16 lanes, as f16_from_f32 (see kernels_avx2.h's fp16_bits: vcvtps2ph is
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

/* ---- the vector mapping of simd_shared.h: 16 lanes of zmm, partial blocks as masks ---- */

typedef __m512 rv;
typedef __m512i rv_int;
typedef __mmask16 rv_tail;
#define RV_LANES 16
#define RV_NAME(f) f##_avx512
#define rv_tail_at z_mask_at
#define rv_load z_load
#define rv_store z_store
#define rv_round_if z_round_if
#define rv_set1 _mm512_set1_ps
#define rv_add _mm512_add_ps
#define rv_sub _mm512_sub_ps
#define rv_mul _mm512_mul_ps
#define rv_div _mm512_div_ps
#define rv_min _mm512_min_ps
#define rv_max _mm512_max_ps
#define rv_xor _mm512_xor_ps
#define rv_fmadd _mm512_fmadd_ps
#define rv_fnmadd _mm512_fnmadd_ps
#define rv_int_set1 _mm512_set1_epi32
#define rv_int_add _mm512_add_epi32
#define rv_int_sub _mm512_sub_epi32
#define rv_int_srli _mm512_srli_epi32
#define rv_int_slli _mm512_slli_epi32
#define rv_trunc_int _mm512_cvttps_epi32
#define rv_from_int _mm512_castsi512_ps
#define rv_replace_if(y, v, x, c, pred) _mm512_mask_mov_ps(y, _mm512_cmp_ps_mask(x, c, pred), v)

/* A sum of squares' 16 dot16 lanes: one zmm. */
typedef __m512 rv_squares;
static inline __m512 rv_squares_zero(void) { return _mm512_setzero_ps(); }
static inline void rv_squares_add(__m512 *acc, size_t i, __m512 v) {
    (void)i;
    *acc = _mm512_fmadd_ps(v, v, *acc);
}
#define rv_squares_sum z_fold16

#include "simd_shared.h"

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
        const __m512 e0 = rv_exp(_mm512_sub_ps(_mm512_loadu_ps(x + i), mv));
        const __m512 e1 = rv_exp(_mm512_sub_ps(_mm512_loadu_ps(x + i + 16), mv));
        const __m512 e2 = rv_exp(_mm512_sub_ps(_mm512_loadu_ps(x + i + 32), mv));
        const __m512 e3 = rv_exp(_mm512_sub_ps(_mm512_loadu_ps(x + i + 48), mv));
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
        const __m512 e = rv_exp(_mm512_sub_ps(_mm512_maskz_loadu_ps(k, x + i), mv));
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
        _mm512_mask_storeu_ps(x + i, m, rv_exp(_mm512_maskz_loadu_ps(m, x + i)));
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

/* The entries of this file and of gemm_avx512.c over a copy of the AVX2 table (kernels.h). */
void kernels_avx512_set_entries(kernels *t) {
    t->name = "avx512";
    RV_KERNEL_ENTRIES(RV_SET_ENTRY)
    gemm_avx512_set_entries(t);
}
