/*
 * The AVX512_BF16 kernels: pair32 on vdpbf16ps, bit for bit.
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

#include "internal.h"
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
 * folds as one tree, its lane NR * i + j being y[i][j]: one store per row of outputs. */
ALWAYS_INLINE void bf_block(const int MR, const int NR, size_t K, const uint16_t *xb, size_t ldxb,
                            const uint16_t *w, size_t ldw, float *y, size_t ldy, const int pf,
                            const uint16_t *next) {
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
    z_store_block(MR, NR, acc, y, ldy);
}

/* One row of x against NR weight rows (a decode step), row after row: each weight row's
 * chunks in order on one accumulator (the chain of bf_block's acc[j], the same bits), so that
 * the weights are read as one linear stream, which the hardware prefetchers follow better
 * than NR streams of K elements each; the out-of-order core overlaps the rows' chains (one
 * chain alone would already read 64 bytes per vdpbf16ps latency, more than memory gives).
 * Each chunk asks the line BF_PF_LINEAR elements (6 KB) ahead of it into L1, across rows: on
 * a Zen 5 VM (gemm-bench --m 1 --thp, interleaved runs, the six shapes) 1 KB ahead gave
 * 34-46 GB/s, 4 KB 39-65, 6 KB 37-68, 8 KB 36-60; the 16-stream order of bf_block 31-49. */
#define BF_PF_LINEAR 3072
ALWAYS_INLINE void bf_rowwise(const int NR, size_t K, const uint16_t *xb, const uint16_t *w,
                              size_t ldw, float *y) {
    __m512 acc[16];
#pragma GCC unroll 16
    for (int j = 0; j < NR; j++) {
        const uint16_t *wj = w + j * ldw;
        __m512 a = _mm512_setzero_ps();
        for (size_t k = 0; k < K; k += 32) {
            _mm_prefetch((const char *)(wj + k + BF_PF_LINEAR), _MM_HINT_T0);
            a = _mm512_dpbf16_ps(a, (__m512bh)_mm512_loadu_si512((const void *)(xb + k)),
                                 (__m512bh)z_load_w(wj, k, K));
        }
        acc[j] = a;
    }
    z_store_block(1, NR, acc, y, 0);
}

/* Rows [0, rows) against NR weight rows: blocks of 4 rows, then the 1 to 3 left. */
ALWAYS_INLINE void bf_rows(const int NR, size_t rows, size_t K, const uint16_t *xb, size_t ldxb,
                           const uint16_t *w, size_t ldw, float *y, size_t ldy) {
    const size_t blocks = (rows + 3) / 4;
    const uint16_t *next = w + NR * ldw;  /* the next group's first row */
    size_t i = 0;
    if (rows >= 4 && blocks >= (size_t)NR) {
        /* the first NR blocks ask for one row of the next group each */
        bf_block(4, NR, K, xb, ldxb, w, ldw, y, ldy, BF_PF_AHEAD | BF_PF_NEXT_ONE, next);
        for (i = 4; i + 4 <= rows; i += 4)
            if (i / 4 < (size_t)NR)
                bf_block(4, NR, K, xb + i * ldxb, ldxb, w, ldw, y + i * ldy, ldy, BF_PF_NEXT_ONE,
                         next + i / 4 * ldw);
            else
                bf_block(4, NR, K, xb + i * ldxb, ldxb, w, ldw, y + i * ldy, ldy, 0, NULL);
    } else {
        for (; i + 4 <= rows; i += 4)
            if (i == 0)
                bf_block(4, NR, K, xb, ldxb, w, ldw, y, ldy, BF_PF_AHEAD | BF_PF_NEXT_ALL, NULL);
            else
                bf_block(4, NR, K, xb + i * ldxb, ldxb, w, ldw, y + i * ldy, ldy, 0, NULL);
    }
    /* the 1 to 3 rows left: the first block (nothing after it to reuse the weights) or none */
    const int pf = i ? 0 : BF_PF_AHEAD;
    switch (rows - i) {
    case 3: bf_block(3, NR, K, xb + i * ldxb, ldxb, w, ldw, y + i * ldy, ldy, pf, NULL); break;
    case 2: bf_block(2, NR, K, xb + i * ldxb, ldxb, w, ldw, y + i * ldy, ldy, pf, NULL); break;
    case 1: bf_block(1, NR, K, xb + i * ldxb, ldxb, w, ldw, y + i * ldy, ldy, pf, NULL); break;
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
                         float *y, size_t ldy, size_t n0, size_t n1) {
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
            for (; n + 4 <= n1; n += 4) bf_rows(4, rows, K, xm, ldxb, w + n * ldw, ldw, ym + n, ldy);
        } else {
            /* a decode step: fewer rows, more weight rows at once */
            const int nr = rows == 1 ? 16 : rows == 2 ? 8 : 5;
            for (; n + (size_t)nr <= n1; n += (size_t)nr) {
                const uint16_t *wn = w + n * ldw;
                if (rows == 1) bf_rowwise(16, K, xm, wn, ldw, ym + n);
                else if (rows == 2) bf_block(2, 8, K, xm, ldxb, wn, ldw, ym + n, ldy, BF_PF_AHEAD, NULL);
                else bf_block(3, 5, K, xm, ldxb, wn, ldw, ym + n, ldy, BF_PF_AHEAD, NULL);
            }
        }
        for (; n < n1; n++) bf_rows(1, rows, K, xm, ldxb, w + n * ldw, ldw, ym + n, ldy);
    }
}

static void gemm_bf16xw_avx512bf16(size_t M, size_t K, const uint16_t *xb, const uint16_t *w,
                                   size_t ldw, float *y, size_t ldy, size_t n0, size_t n1) {
    const unsigned mxcsr = pair32_flush_begin();
    bf_gemm(M, K, xb, w, ldw, y, ldy, n0, n1);
    pair32_flush_end(mxcsr);
}

/* The entries of this file over a copy of the avx512 table (kernels.h). */
void kernels_avx512bf16_set_entries(kernels *t) {
    t->name = "avx512bf16";
    t->pack_x_bf16 = pack_x_bf16_avx512bf16;
    t->gemm_bf16xw = gemm_bf16xw_avx512bf16;
    /* On the Zen 5 VM the widening in registers runs beside the fmas: attention reading the
     * bf16 blocks directly took 6-10% less time than widening the shared ones first (prefill
     * 512, attention against GEMM time, interleaved pairs), and less of a decode step at
     * batch 32 over a forked prompt (parity-speed --profile, contexts 128 and 1024). */
    t->attn_widens_shared_blocks = 0;
}
