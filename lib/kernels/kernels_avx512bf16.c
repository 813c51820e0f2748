/*
 * The AVX512_BF16 kernels: pair32 on vdpbf16ps, bit for bit; and attention's q.k (dot16) and
 * P.V on vdpbf16ps where that gives dot16's and pv_bf16's bits (below, "attention blocks").
 *
 * The only file compiled with -mavx512bf16 (and the AVX-512 F/BW/VL/DQ flags); cpu.c selects
 * this table only on a CPU that has AVX512_BF16 as well as the avx512 path. The table is the
 * avx512 one with the entries of this file over it.
 *
 * vdpbf16ps computes, per fp32 lane l, acc = fma(x[2l], w[2l], fma(x[2l+1], w[2l+1], acc))
 * with denormals flushed as pair32 defines them (kernels.h): one instruction is one step of
 * pair32's 16 lanes for a chunk of 32 elements, when both x and w are bf16 pairs in their
 * natural order. So x is packed once per GEMM into bf16 rows (gemm_pack_x_bf16, which says
 * whether every x was a bf16 value: when one is not, as after an fp32 attention output, the
 * caller runs the fp32-FMA entries instead), and the kernel needs no widening and no panel.
 * The fold at the end runs with MXCSR.DAZ|FTZ set like the other tables' pair32 kernels.
 */
#include <immintrin.h>
#include <stdatomic.h>
#include <string.h>
#include <unistd.h>

#include "base/floats.h"
#include "kernels.h"
#include "kernels_avx512.h"
#include "kernels_x86.h"

/* ---- packing x: bf16 rows ---- */

/* Rows m0 .. m1-1 of x as bf16 (gemm_pack_x_bf16 in kernels.h): 32 floats per chunk become one
 * zmm of bf16 in their order (vcvtne2ps2bf16 is exact on bf16 values; any other value is
 * caught by its low 16 bits first), -0 past K. */
static int pack_x_bf16_avx512bf16(size_t K, const float *x, size_t ldx, uint16_t *xb, size_t m0,
                                  size_t m1) {
    const size_t row = gemm_packed_row(K);
    __m512i low = _mm512_setzero_si512();
    const __m512 neg0 = _mm512_set1_ps(-0.0f);
    for (size_t m = m0; m < m1; m++) {
        const float *xm = x + m * ldx;
        uint16_t *out = xb + m * row;
        for (size_t k = 0; k < row; k += 32) {
            const __m512 a = _mm512_mask_loadu_ps(neg0, k < K ? z_mask_at(K, k) : 0, xm + k);
            const __m512 b = _mm512_mask_loadu_ps(neg0, k + 16 < K ? z_mask_at(K, k + 16) : 0,
                                                  xm + k + 16);
            low = _mm512_or_si512(low, _mm512_or_si512(_mm512_castps_si512(a),
                                                       _mm512_castps_si512(b)));
            _mm512_storeu_si512((void *)(out + k), (__m512i)_mm512_cvtne2ps_pbh(b, a));
        }
    }
    return _mm512_test_epi32_mask(low, _mm512_set1_epi32(0xffff)) == 0;
}

/* ---- the GEMM on bf16 x ---- */

/* The 32 bf16 of w's chunk at k: all of them, or those before K (+0 past it, which times
 * x's -0 padding adds -0, leaving the lane as it was). */
static inline __m512i z_load_w(const uint16_t *w, size_t k, size_t K) {
    if (k + 32 <= K) return _mm512_loadu_si512((const void *)(w + k));
    return _mm512_maskz_loadu_epi16((__mmask32)((1ull << (K - k)) - 1), w + k);
}

/* What a block asks into the cache for its weight rows (`pf`, flags, a constant after
 * inlining): BF_PF_AHEAD, the chunks BF_PF_CHUNKS ahead of the current one into L1 (the first
 * row block of a column group, which meets the group's weights first; the later row blocks
 * find them in L1, and prefetches there only took load slots: on a Zen 5 VM, dropping them
 * made M = 32 10% and M = 512 15-20% faster); and, where further row blocks reuse the weight
 * rows (M >= 4), the next column group's rows into L2, so that a new group does not start with
 * a wait on memory: all of them from the first block (BF_PF_NEXT_ALL) where there are fewer
 * row blocks than weight rows, else one row from each of the first NR blocks (BF_PF_NEXT_ONE,
 * the row `next`), one line per chunk: the first block's burst of NR lines per chunk held its
 * loads while it waited for the group's weights (Zen 4 VM, gemm-bench, M = 32 with weights
 * from memory ran at 71-77% of the peak, 86-89% with the weights in cache). */
#define BF_PF_CHUNKS 8
enum { BF_PF_AHEAD = 1, BF_PF_NEXT_ALL = 2, BF_PF_NEXT_ONE = 4 };

/* y[i][j] for MR rows of xb and NR weight rows (MR * NR <= 16, constants after inlining):
 * MR * NR accumulators, acc[NR * i + j], each one vdpbf16ps per chunk. A full block (16)
 * folds as one tree, its lane NR * i + j being y[i][j]: one store per row of outputs, rounded
 * to bf16 first where rnd (z_store_block_as; so in every kernel below). */
ALWAYS_INLINE void bf_block(const int MR, const int NR, size_t K, const uint16_t *xb, size_t ldxb,
                            const uint16_t *w, size_t ldw, float *y, size_t ldy, const int pf,
                            const uint16_t *next, int rnd) {
    __m512 acc[16];
    for (int a = 0; a < 16; a++) acc[a] = _mm512_setzero_ps();
    for (size_t k = 0; k < K; k += 32) {
        __m512bh x[4];
        for (int i = 0; i < MR; i++) x[i] = (__m512bh)_mm512_loadu_si512((const void *)(xb + i * ldxb + k));
        if (pf & BF_PF_NEXT_ONE) _mm_prefetch((const char *)(next + k), _MM_HINT_T1);
        for (int j = 0; j < NR; j++) {
            const uint16_t *wj = w + j * ldw;
            if (pf & BF_PF_AHEAD) _mm_prefetch((const char *)(wj + k + 32 * BF_PF_CHUNKS), _MM_HINT_T0);
            if (pf & BF_PF_NEXT_ALL) _mm_prefetch((const char *)(wj + NR * ldw + k), _MM_HINT_T1);
            const __m512bh wv = (__m512bh)z_load_w(wj, k, K);
            for (int i = 0; i < MR; i++) acc[NR * i + j] = _mm512_dpbf16_ps(acc[NR * i + j], x[i], wv);
        }
    }
    z_store_block_as(MR, NR, acc, y, ldy, rnd);
}

/* A decode step of one x row takes 16 weight rows row after row (z_rowwise in
 * kernels_avx512.h, on bf_chunk: each weight row's chunks in order on one accumulator, the
 * chain of bf_block's acc[j], the same bits; one chain alone would already read 64 bytes per
 * vdpbf16ps latency, more than memory gives). Each chunk asks the line BF_PF_LINEAR elements
 * (6 KB) ahead of it into L1, across rows: on a Zen 5 VM (gemm-bench --m 1 --thp, interleaved
 * runs, the six shapes) 1 KB ahead gave 34-46 GB/s, 4 KB 39-65, 6 KB 37-68, 8 KB 36-60; the
 * 16-stream order of bf_block 31-49. */
#define BF_PF_LINEAR 3072

/* One chunk of pair32 on bf16 x, for z_rowwise: one vdpbf16ps. */
static inline __attribute__((always_inline)) __m512 bf_chunk(__m512 a, const void *x,
                                                             const uint16_t *w, size_t k,
                                                             size_t K) {
    const uint16_t *xb = x;
    return _mm512_dpbf16_ps(a, (__m512bh)_mm512_loadu_si512((const void *)(xb + k)),
                            (__m512bh)z_load_w(w, k, K));
}

/* Rows [0, rows) against NR weight rows: blocks of 4 rows, then the 1 to 3 left. */
ALWAYS_INLINE void bf_rows(const int NR, size_t rows, size_t K, const uint16_t *xb, size_t ldxb,
                           const uint16_t *w, size_t ldw, float *y, size_t ldy, int rnd) {
    const size_t blocks = (rows + 3) / 4;
    const uint16_t *next = w + NR * ldw;  /* the next group's first row */
    size_t i = 0;
    if (rows >= 4 && blocks >= (size_t)NR) {
        /* the first NR blocks ask for one row of the next group each */
        bf_block(4, NR, K, xb, ldxb, w, ldw, y, ldy, BF_PF_AHEAD | BF_PF_NEXT_ONE, next, rnd);
        for (i = 4; i + 4 <= rows; i += 4)
            if (i / 4 < (size_t)NR)
                bf_block(4, NR, K, xb + i * ldxb, ldxb, w, ldw, y + i * ldy, ldy, BF_PF_NEXT_ONE,
                         next + i / 4 * ldw, rnd);
            else
                bf_block(4, NR, K, xb + i * ldxb, ldxb, w, ldw, y + i * ldy, ldy, 0, NULL, rnd);
    } else {
        for (; i + 4 <= rows; i += 4)
            if (i == 0)
                bf_block(4, NR, K, xb, ldxb, w, ldw, y, ldy, BF_PF_AHEAD | BF_PF_NEXT_ALL, NULL,
                         rnd);
            else
                bf_block(4, NR, K, xb + i * ldxb, ldxb, w, ldw, y + i * ldy, ldy, 0, NULL, rnd);
    }
    /* the 1 to 3 rows left: the first block (nothing after it to reuse the weights) or none */
    const int pf = i ? 0 : BF_PF_AHEAD;
    switch (rows - i) {
    case 3: bf_block(3, NR, K, xb + i * ldxb, ldxb, w, ldw, y + i * ldy, ldy, pf, NULL, rnd); break;
    case 2: bf_block(2, NR, K, xb + i * ldxb, ldxb, w, ldw, y + i * ldy, ldy, pf, NULL, rnd); break;
    case 1: bf_block(1, NR, K, xb + i * ldxb, ldxb, w, ldw, y + i * ldy, ldy, pf, NULL, rnd); break;
    default: break;
    }
}

/* Rows of xb per block, so that a block stays in L2 while every weight row of the thread's
 * columns passes over it: half the L2 (1 MB where the OS does not say), a multiple of 4. */
static size_t bf_row_block(size_t K) {
    static _Atomic size_t cached;
    size_t bytes = atomic_load_explicit(&cached, memory_order_relaxed);
    if (!bytes) {
        const long l2 = sysconf(_SC_LEVEL2_CACHE_SIZE);
        bytes = l2 >= 256 * 1024 ? (size_t)l2 / 2 : 1024u * 1024u;
        atomic_store_explicit(&cached, bytes, memory_order_relaxed);
    }
    const size_t rows = bytes / (gemm_packed_row(K) * sizeof(uint16_t) + 1) / 4 * 4;
    return rows < 4 ? 4 : rows;
}

PAIR32_BODY void bf_gemm(size_t M, size_t K, const uint16_t *xb, const uint16_t *w, size_t ldw,
                         float *y, size_t ldy, size_t n0, size_t n1, int rnd) {
    /* M in row blocks of equal size (a multiple of 4), as few as fit: 256 rows of K = 1024
     * went as 252 + 4, the second pass over the weights serving 4 rows */
    if (M == 0) return;
    const size_t ldxb = gemm_packed_row(K), most = bf_row_block(K), blocks = (M + most - 1) / most;
    const size_t mb = ((M + blocks - 1) / blocks + 3) / 4 * 4;
    for (size_t m0 = 0; m0 < M; m0 += mb) {
        const size_t rows = M - m0 < mb ? M - m0 : mb;
        const uint16_t *xm = xb + m0 * ldxb;
        float *ym = y + m0 * ldy;
        size_t n = n0;
        if (rows >= 4) {
            for (; n + 4 <= n1; n += 4)
                bf_rows(4, rows, K, xm, ldxb, w + n * ldw, ldw, ym + n, ldy, rnd);
        } else {
            /* a decode step: fewer rows, more weight rows at once */
            const int nr = rows == 1 ? 16 : rows == 2 ? 8 : 5;
            for (; n + (size_t)nr <= n1; n += (size_t)nr) {
                const uint16_t *wn = w + n * ldw;
                if (rows == 1) z_rowwise(16, bf_chunk, BF_PF_LINEAR, K, xm, wn, ldw, ym + n, rnd);
                else if (rows == 2)
                    bf_block(2, 8, K, xm, ldxb, wn, ldw, ym + n, ldy, BF_PF_AHEAD, NULL, rnd);
                else
                    bf_block(3, 5, K, xm, ldxb, wn, ldw, ym + n, ldy, BF_PF_AHEAD, NULL, rnd);
            }
        }
        for (; n < n1; n++) bf_rows(1, rows, K, xm, ldxb, w + n * ldw, ldw, ym + n, ldy, rnd);
    }
}

static void gemm_bf16xw_avx512bf16(size_t M, size_t K, const uint16_t *xb, const uint16_t *w,
                                   size_t ldw, float *y, size_t ldy, size_t n0, size_t n1,
                                   int round_bf16) {
    PAIR32_FLUSHED(bf_gemm(M, K, xb, w, ldw, y, ldy, n0, n1, round_bf16));
}

/* ---- attention blocks on vdpbf16ps ---- */

/* q.k (dots_packed_bf16) and P.V (pv_bf16_grained) on vdpbf16ps, in the orders of
 * dots_f32_bf16 and pv_bf16, bit for bit.
 *
 * q.k: dot16's lane l takes, in chunk c of 32 elements, element 32c + l and then 32c + 16 + l;
 * vdpbf16ps's lane l takes the bf16 pair in its dword l, the high half first (pair32's odd
 * element). So each chunk of a query (packed once per attention task) and of a key (once per
 * call) is rearranged so that dword l holds element l in its high half and element 16 + l in
 * its low half: one vdpbf16ps is then two steps of dot16's 16 chains, with the same products
 * (a product of two bf16 values is exact in fp32) and the same roundings, and the fold is
 * dot16's (z_store_block, without pair32's flushing).
 *
 * P.V: an output element's chain takes the positions j in ascending order, fmaf(p[j], v[j][i],
 * o[i]); a dword holding p[j] high and p[j + 1] low against one holding v[j][i] high and
 * v[j + 1][i] low is two of its steps. The values of a block are packed so pairwise per call,
 * each query's probabilities per call.
 *
 * Both need bf16 values (the presets' rounded q and P; under +fp16 or fp32 compute they are
 * not) and must meet no denormal, which vdpbf16ps flushes (its inputs read as zero, its
 * results flushed: pair32's rule, not dot16's). The exponents make sure of the second: with
 * E1 and E2 the least biased exponents of the nonzero elements of the two operands, no input
 * is a denormal where both are at least 1, and since a nonzero bf16 value of biased exponent
 * E is a multiple of 2^(E - 134), every product, every partial sum and every rounded sum is a
 * multiple of 2^(E1 + E2 - 268): zero or a normal number where E1 + E2 >= 142. For P.V the
 * outputs must be such sums too (+0 from attention's memset, or sums of earlier calls that
 * took this path; the zero pair that pads an odd block adds +0 to an output that is never
 * -0). Calls that miss it (a denormal or tiny element, an inf or NaN,
 * a value that is not bf16), calls of few queries (packing would cost more than it saves) and
 * n not a multiple of 32 run the avx512 table's kernels. */
#define BF_ATT_MAX_N 256       /* elements per vector the packed forms take */
#define BF_ATT_MIN_QUERIES 8   /* fewer go to the widening kernels */
#define BF_ATT_MIN_EXPONENTS 142
#define BF_ATT_QUERY_GROUP 32  /* P.V: queries whose probabilities are packed at a time */

static void (*dots_widening)(const float *a, size_t lda, size_t queries, const uint16_t *b,
                             size_t ldb, size_t count, size_t n, float *out, size_t ldo);
static void (*pv_widening)(float *o, size_t ldo, const float *p, size_t ldp, size_t queries,
                           const uint16_t *v, size_t ldv, size_t count, size_t n);

/* The least biased exponent of the nonzero elements seen and the greatest exponent of all
 * (255: an inf or NaN), as exponent fields in place (fp32: << 23, bf16: << 7); `low` ors
 * together fp32 bits whose low halves must be zero for the values to be bf16. */
typedef struct bf_range {
    __m512i least, most, low;
} bf_range;

static inline bf_range bf_range_start(void) {
    return (bf_range){_mm512_set1_epi32(-1), _mm512_setzero_si512(), _mm512_setzero_si512()};
}

static inline void bf_range_f32(bf_range *r, __m512i bits) {
    const __m512i e = _mm512_and_si512(bits, _mm512_set1_epi32(0x7f800000));
    const __mmask16 nz = _mm512_test_epi32_mask(bits, _mm512_set1_epi32(0x7fffffff));
    r->least = _mm512_mask_min_epu32(r->least, nz, r->least, e);
    r->most = _mm512_max_epu32(r->most, e);
    r->low = _mm512_or_si512(r->low, bits);
}

static inline void bf_range_bf16(bf_range *r, __m512i bits) {
    const __m512i e = _mm512_and_si512(bits, _mm512_set1_epi16(0x7f80));
    const __mmask32 nz = _mm512_test_epi16_mask(bits, _mm512_set1_epi16(0x7fff));
    r->least = _mm512_mask_min_epu16(r->least, nz, r->least, e);
    r->most = _mm512_max_epu16(r->most, e);
}

/* The least exponent of a range (255 where no element was nonzero), or -1 where an element
 * was an inf or NaN or, for fp32, not a bf16 value. */
static inline int bf_range_least_f32(const bf_range *r) {
    if (_mm512_test_epi32_mask(r->low, _mm512_set1_epi32(0xffff))) return -1;
    const unsigned most = _mm512_reduce_max_epu32(r->most) >> 23;
    const unsigned least = _mm512_reduce_min_epu32(r->least);
    return most == 255 ? -1 : least == 0xffffffffu ? 255 : (int)(least >> 23);
}

static inline int bf_range_least_bf16(const bf_range *r) {
    const __m512i lo16 = _mm512_set1_epi32(0xffff);
    const __m512i least = _mm512_min_epu32(_mm512_and_si512(r->least, lo16), _mm512_srli_epi32(r->least, 16));
    const __m512i most = _mm512_max_epu32(_mm512_and_si512(r->most, lo16), _mm512_srli_epi32(r->most, 16));
    const unsigned l = _mm512_reduce_min_epu32(least), m = _mm512_reduce_max_epu32(most) >> 7;
    return m == 255 ? -1 : l == 0xffffu ? 255 : (int)(l >> 7);
}

/* Whether two least exponents keep vdpbf16ps away from the denormals: no input is one
 * (exponent 0: vdpbf16ps reads it as a zero, where its product with a large value can be
 * normal) and every sum of their products is zero or normal. */
static inline int bf_exponents_fit(int e1, int e2) {
    return e1 >= 1 && e2 >= 1 && e1 + e2 >= BF_ATT_MIN_EXPONENTS;
}

/* pack_queries_bf16: queries dot16-paired (above), n apart; returns their least exponent. */
static int pack_queries_bf16_avx512bf16(const float *a, size_t lda, size_t queries, size_t n,
                                        uint16_t *qp) {
    if (n % 32 || n > BF_ATT_MAX_N) return -1;
    bf_range r = bf_range_start();
    for (size_t q = 0; q < queries; q++)
        for (size_t c = 0; c < n; c += 32) {
            const __m512i lo = _mm512_loadu_si512((const void *)(a + q * lda + c));
            const __m512i hi = _mm512_loadu_si512((const void *)(a + q * lda + c + 16));
            bf_range_f32(&r, lo);
            bf_range_f32(&r, hi);
            _mm512_storeu_si512((void *)(qp + q * n + c), _mm512_or_si512(lo, _mm512_srli_epi32(hi, 16)));
        }
    return bf_range_least_f32(&r);
}

/* Keys b + j ldb (j < nk), n bf16 each, dot16-paired into kp (n apart); returns their least
 * exponent (bf_range_least_bf16). */
static int bf_pack_keys(const uint16_t *b, size_t ldb, size_t nk, size_t n, uint16_t *kp) {
    /* word 2l of a chunk <- element 16 + l, word 2l + 1 <- element l */
    const __m512i order = _mm512_set_epi16(15, 31, 14, 30, 13, 29, 12, 28, 11, 27, 10, 26, 9, 25, 8, 24,
                                           7, 23, 6, 22, 5, 21, 4, 20, 3, 19, 2, 18, 1, 17, 0, 16);
    bf_range r = bf_range_start();
    for (size_t j = 0; j < nk; j++)
        for (size_t c = 0; c < n; c += 32) {
            const __m512i v = _mm512_loadu_si512((const void *)(b + j * ldb + c));
            bf_range_bf16(&r, v);
            _mm512_storeu_si512((void *)(kp + j * n + c), _mm512_permutexvar_epi16(order, v));
        }
    return bf_range_least_bf16(&r);
}

/* Q packed queries against J packed keys (Q, J <= 4, constants after inlining), n apart:
 * Q J chains of vdpbf16ps, folded and stored as z_dots stores them. */
ALWAYS_INLINE void bf_dots_block(const int Q, const int J, const uint16_t *qp, const uint16_t *kp,
                                 size_t n, float *out, size_t ldo) {
    __m512 acc[16];
    for (int c = 0; c < Q * J; c++) acc[c] = _mm512_setzero_ps();
    for (size_t i = 0; i < n; i += 32) {
        __m512bh key[4];
        for (int j = 0; j < J; j++) key[j] = (__m512bh)_mm512_loadu_si512((const void *)(kp + j * n + i));
        for (int q = 0; q < Q; q++) {
            const __m512bh x = (__m512bh)_mm512_loadu_si512((const void *)(qp + q * n + i));
            for (int j = 0; j < J; j++) acc[J * q + j] = _mm512_dpbf16_ps(acc[J * q + j], x, key[j]);
        }
    }
    z_store_block(Q, J, acc, out, ldo);
}

/* Q packed queries against nk packed keys: four at a time, then the 1 to 3 left. */
ALWAYS_INLINE void bf_dots_keys(const int Q, const uint16_t *qp, const uint16_t *kp, size_t nk,
                                size_t n, float *out, size_t ldo) {
    size_t j = 0;
    for (; j + 4 <= nk; j += 4) bf_dots_block(Q, 4, qp, kp + j * n, n, out + j, ldo);
    switch (nk - j) {
    case 3: bf_dots_block(Q, 3, qp, kp + j * n, n, out + j, ldo); break;
    case 2: bf_dots_block(Q, 2, qp, kp + j * n, n, out + j, ldo); break;
    case 1: bf_dots_block(Q, 1, qp, kp + j * n, n, out + j, ldo); break;
    default: break;
    }
}

static void dots_packed_bf16_avx512bf16(const uint16_t *qp, int code, const float *a, size_t lda,
                                        size_t queries, const uint16_t *b, size_t ldb, size_t count,
                                        size_t n, float *out, size_t ldo) {
    if (code < 0 || queries < BF_ATT_MIN_QUERIES || n % 32 || n > BF_ATT_MAX_N) {
        dots_widening(a, lda, queries, b, ldb, count, n, out, ldo);
        return;
    }
    uint16_t kp[16 * BF_ATT_MAX_N] __attribute__((aligned(64)));
    for (size_t j0 = 0; j0 < count; j0 += 16) {
        const size_t nk = count - j0 < 16 ? count - j0 : 16;
        float *o = out + j0;
        if (!bf_exponents_fit(code, bf_pack_keys(b + j0 * ldb, ldb, nk, n, kp))) {
            dots_widening(a, lda, queries, b + j0 * ldb, ldb, nk, n, o, ldo);
            continue;
        }
        size_t q = 0;
        for (; q + 4 <= queries; q += 4) bf_dots_keys(4, qp + q * n, kp, nk, n, o + q * ldo, ldo);
        switch (queries - q) {
        case 3: bf_dots_keys(3, qp + q * n, kp, nk, n, o + q * ldo, ldo); break;
        case 2: bf_dots_keys(2, qp + q * n, kp, nk, n, o + q * ldo, ldo); break;
        case 1: bf_dots_keys(1, qp + q * n, kp, nk, n, o + q * ldo, ldo); break;
        default: break;
        }
    }
}

/* Values v + j ldv (j < nk <= 16), n bf16 each, as nk / 2 rounded up pairs of positions into
 * vp (n dwords apart): dword i of pair t holds v[2t][i] high and v[2t + 1][i] low (+0 past
 * nk); returns their least exponent. */
static int bf_pack_values(const uint16_t *v, size_t ldv, size_t nk, size_t n, uint32_t *vp) {
    const __m512i first = _mm512_set_epi16(47, 15, 46, 14, 45, 13, 44, 12, 43, 11, 42, 10, 41, 9, 40, 8,
                                           39, 7, 38, 6, 37, 5, 36, 4, 35, 3, 34, 2, 33, 1, 32, 0);
    const __m512i second = _mm512_add_epi16(first, _mm512_set1_epi16(16));
    bf_range r = bf_range_start();
    for (size_t j = 0; j < nk; j += 2)
        for (size_t c = 0; c < n; c += 32) {
            const __m512i v0 = _mm512_loadu_si512((const void *)(v + j * ldv + c));
            const __m512i v1 = j + 1 < nk ? _mm512_loadu_si512((const void *)(v + (j + 1) * ldv + c))
                                          : _mm512_setzero_si512();
            bf_range_bf16(&r, v0);
            bf_range_bf16(&r, v1);
            uint32_t *out = vp + j / 2 * n + c;
            /* word 2l <- v1[l] (index l), word 2l + 1 <- v0[l] (index 32 + l) */
            _mm512_storeu_si512((void *)out, _mm512_permutex2var_epi16(v1, first, v0));
            _mm512_storeu_si512((void *)(out + 16), _mm512_permutex2var_epi16(v1, second, v0));
        }
    return bf_range_least_bf16(&r);
}

/* Probabilities p + q ldp (q < nq) at positions 0 .. nk-1 (nk <= 16) as pairs into pp (8
 * dwords per query): dword t holds p[2t] high and p[2t + 1] low (+0 past nk); returns their
 * least exponent. */
static int bf_pack_probabilities(const float *p, size_t ldp, size_t nq, size_t nk, uint32_t *pp) {
    bf_range r = bf_range_start();
    const __mmask16 m = z_mask(nk);
    for (size_t q = 0; q < nq; q++) {
        const __m512 x = _mm512_maskz_loadu_ps(m, p + q * ldp);
        bf_range_f32(&r, _mm512_castps_si512(x));
        /* the bf16 values in order make dwords of p[2t] low, p[2t + 1] high: swap the halves */
        const __m256i h = (__m256i)_mm512_cvtneps_pbh(x);
        _mm256_storeu_si256((__m256i *)(pp + 8 * q), _mm256_or_si256(_mm256_slli_epi32(h, 16), _mm256_srli_epi32(h, 16)));
    }
    return bf_range_least_f32(&r);
}

/* Q outputs (Q <= 4) on 16 H elements (H <= 4; constants after inlining) through np pairs of
 * positions: Q H chains of vdpbf16ps from the outputs' current values, stored back. */
ALWAYS_INLINE void bf_pv_block(const int Q, const int H, float *o, size_t ldo, const uint32_t *pp,
                               const uint32_t *vp, size_t n, size_t np) {
    __m512 acc[16];
    for (int q = 0; q < Q; q++)
        for (int h = 0; h < H; h++) acc[H * q + h] = _mm512_loadu_ps(o + q * ldo + 16 * h);
    for (size_t t = 0; t < np; t++) {
        __m512bh val[4];
        for (int h = 0; h < H; h++) val[h] = (__m512bh)_mm512_loadu_si512((const void *)(vp + t * n + 16 * h));
        for (int q = 0; q < Q; q++) {
            const __m512bh pj = (__m512bh)_mm512_set1_epi32((int)pp[8 * q + t]);
            for (int h = 0; h < H; h++) acc[H * q + h] = _mm512_dpbf16_ps(acc[H * q + h], pj, val[h]);
        }
    }
    for (int q = 0; q < Q; q++)
        for (int h = 0; h < H; h++) _mm512_storeu_ps(o + q * ldo + 16 * h, acc[H * q + h]);
}

/* Q outputs over all n elements: 64 at a time, then 32. */
ALWAYS_INLINE void bf_pv_queries(const int Q, float *o, size_t ldo, const uint32_t *pp,
                                 const uint32_t *vp, size_t n, size_t np) {
    size_t i = 0;
    for (; i + 64 <= n; i += 64) bf_pv_block(Q, 4, o + i, ldo, pp, vp + i, n, np);
    if (i < n) bf_pv_block(Q, 2, o + i, ldo, pp, vp + i, n, np);
}

static int pv_bf16_grained_avx512bf16(float *o, size_t ldo, const float *p, size_t ldp,
                                      size_t queries, const uint16_t *v, size_t ldv, size_t count,
                                      size_t n) {
    if (queries < BF_ATT_MIN_QUERIES || n % 32 || n > BF_ATT_MAX_N) {
        pv_widening(o, ldo, p, ldp, queries, v, ldv, count, n);
        return 0;
    }
    uint32_t vp[8 * BF_ATT_MAX_N] __attribute__((aligned(64)));
    uint32_t pp[8 * BF_ATT_QUERY_GROUP] __attribute__((aligned(64)));
    int all = 1;
    for (size_t j0 = 0; j0 < count; j0 += 16) {
        const size_t nk = count - j0 < 16 ? count - j0 : 16, np = (nk + 1) / 2;
        const int ev = bf_pack_values(v + j0 * ldv, ldv, nk, n, vp);
        for (size_t q0 = 0; q0 < queries; q0 += BF_ATT_QUERY_GROUP) {
            const size_t nq = queries - q0 < BF_ATT_QUERY_GROUP ? queries - q0 : BF_ATT_QUERY_GROUP;
            float *oq = o + q0 * ldo;
            /* after a fallback the outputs may hold sums this path cannot take: the rest
             * falls back too */
            if (!all || !bf_exponents_fit(ev, bf_pack_probabilities(p + q0 * ldp + j0, ldp, nq, nk, pp))) {
                pv_widening(oq, ldo, p + q0 * ldp + j0, ldp, nq, v + j0 * ldv, ldv, nk, n);
                all = 0;
                continue;
            }
            size_t q = 0;
            for (; q + 4 <= nq; q += 4) bf_pv_queries(4, oq + q * ldo, ldo, pp + 8 * q, vp, n, np);
            switch (nq - q) {
            case 3: bf_pv_queries(3, oq + q * ldo, ldo, pp + 8 * q, vp, n, np); break;
            case 2: bf_pv_queries(2, oq + q * ldo, ldo, pp + 8 * q, vp, n, np); break;
            case 1: bf_pv_queries(1, oq + q * ldo, ldo, pp + 8 * q, vp, n, np); break;
            default: break;
            }
        }
    }
    return all;
}

/* The entries of this file over a copy of the avx512 table (kernels.h). */
void kernels_avx512bf16_set_entries(kernels *t) {
    t->name = "avx512bf16";
    t->pack_x_bf16 = pack_x_bf16_avx512bf16;
    t->gemm_bf16xw = gemm_bf16xw_avx512bf16;
    dots_widening = t->dots_f32_bf16;
    pv_widening = t->pv_bf16;
    t->pack_queries_bf16 = pack_queries_bf16_avx512bf16;
    t->dots_packed_bf16 = dots_packed_bf16_avx512bf16;
    t->pv_bf16_grained = pv_bf16_grained_avx512bf16;
    /* On the Zen 5 VM the widening in registers runs beside the fmas: attention reading the
     * bf16 blocks directly took 6-10% less time than widening the shared ones first (prefill
     * 512, attention against GEMM time, interleaved pairs), and less of a decode step at
     * batch 32 over a forked prompt (parity-speed --profile, contexts 128 and 1024). */
    t->attn_widens_shared_blocks = 0;
}
