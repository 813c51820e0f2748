/*
 * The AVX-512 GEMMs (AVX-512F, BW, VL, DQ): gemm_bf16w (pair32 on bf16 weights) on rows of
 * x, gemm_f32w (dot16 on fp32 weights) and gemm_bf16w_tiles (the lane tiles of large M);
 * kernels_ref.c's GEMMs on 16 fp32 lanes, bit for bit, under the rules of kernels_avx2.c (the
 * orders of the specification exactly, padding terms -0, no fp contraction).
 *
 * Compiled with -mavx512f -mavx512bw -mavx512vl -mavx512dq, as kernels_avx512.c, which puts
 * these entries into the avx512 table.
 */
#include <immintrin.h>
#include <stdatomic.h>
#include <string.h>
#include <unistd.h>

#include "kernels.h"
#include "kernels_avx512.h"
#include "kernels_x86.h"

/* ---- small M: rows (gemm_bf16w) ----
 *
 * One zmm is the 16 lanes of pair32 for one output: per chunk, the packed x row's even and
 * odd elements are two zmm (gemm_pack_x), and the weight row's 32 bf16 are one zmm of
 * dwords, split into its odd (d & 0xffff0000) and even (d << 16) halves; lane l then takes
 * fma(x_even, w_even, fma(x_odd, w_odd, acc)), the odd element first. A block is R x rows
 * against C weight rows (R * C accumulators): 4 x 4 (each weight chunk split once for 4
 * rows), with the rows left over in blocks of 1 to 3; a decode step of one row takes 16
 * weight rows one after another instead (z_rowwise). Weight rows are read straight from
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

/* A decode step of one x row takes 16 weight rows row after row (z_rowwise in
 * kernels_avx512.h, on zr_chunk: each weight row's chunks in order on one accumulator, the chain
 * of zr_block's acc[j], the same bits), the line ZR_PF_LINEAR elements ahead asked into L1
 * across rows; kernels_avx512bf16.c runs the same loop on vdpbf16ps. Zen 4 VM, 2 threads,
 * gemm-bench --m 1 --thp over the six shapes: 20-32 GB/s with 1 x 8 blocks (20 at K = 1024),
 * 27-38 row after row; a decode step of one row (bench/ab-builds, avx512 path, 12 pairs each
 * way round) took 0.69 and 1/1.43 of its time before. */
#define ZR_PF_LINEAR 3072

/* One chunk of pair32 on widened weights, for z_rowwise: the odd element's product, then the
 * even one's. */
static inline __attribute__((always_inline)) __m512 zr_chunk(__m512 a, const void *x,
                                                             const uint16_t *w, size_t k,
                                                             size_t K) {
    const float *xp = x;
    const __m512i d = zr_load_w(w, k, K);
    const __m512i high16 = _mm512_set1_epi32((int)0xffff0000u);
    a = _mm512_fmadd_ps(_mm512_loadu_ps(xp + k + 16),
                        _mm512_castsi512_ps(_mm512_and_si512(d, high16)), a);
    return _mm512_fmadd_ps(_mm512_loadu_ps(xp + k),
                           _mm512_castsi512_ps(_mm512_slli_epi32(d, 16)), a);
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

/* ---- the row GEMMs: blocks of rows, on either weight type ---- */

/* An R x C block (R 1 to 4; R, C and f32w constants after inlining): zr_block on bf16 weights
 * (f32w 0, x packed, row stride ldx the packed row), zf_block on fp32 ones (f32w 1). */
ALWAYS_INLINE void z_block(const int f32w, const int R, const int C, size_t K, const float *x,
                           size_t ldx, const void *w, size_t ldw, float *y, size_t ldy) {
    if (f32w)
        zf_block(R, C, K, x, ldx, (const float *)w, ldw, y, ldy);
    else
        zr_block(R, C, K, x, ldx, (const uint16_t *)w, ldw, y, ldy);
}

/* Rows [0, M) against C weight rows: blocks of 4 rows, then the 1 to 3 left. */
ALWAYS_INLINE void z_rows(const int f32w, const int C, size_t M, size_t K, const float *x,
                          size_t ldx, const void *w, size_t ldw, float *y, size_t ldy) {
    size_t m = 0;
    for (; m + 4 <= M; m += 4) z_block(f32w, 4, C, K, x + m * ldx, ldx, w, ldw, y + m * ldy, ldy);
    switch (M - m) {
    case 3: z_block(f32w, 3, C, K, x + m * ldx, ldx, w, ldw, y + m * ldy, ldy); break;
    case 2: z_block(f32w, 2, C, K, x + m * ldx, ldx, w, ldw, y + m * ldy, ldy); break;
    case 1: z_block(f32w, 1, C, K, x + m * ldx, ldx, w, ldw, y + m * ldy, ldy); break;
    default: break;
    }
}

PAIR32_BODY void zr_gemm(size_t M, size_t K, const float *xp, const uint16_t *w, size_t ldw,
                         float *y, size_t ldy, size_t n0, size_t n1) {
    const size_t row = gemm_packed_row(K);
    size_t n = n0;
    if (M == 1)
        for (; n + 16 <= n1; n += 16)
            z_rowwise(16, zr_chunk, ZR_PF_LINEAR, K, xp, w + n * ldw, ldw, y + n, 0);
    for (; n + 4 <= n1; n += 4) z_rows(0, 4, M, K, xp, row, w + n * ldw, ldw, y + n, ldy);
    for (; n < n1; n++) z_rows(0, 1, M, K, xp, row, w + n * ldw, ldw, y + n, ldy);
}

static void gemm_bf16w_avx512(size_t M, size_t K, const float *xp, const uint16_t *w, size_t ldw,
                              float *y, size_t ldy, size_t n0, size_t n1) {
    PAIR32_FLUSHED(zr_gemm(M, K, xp, w, ldw, y, ldy, n0, n1));
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
        for (; n + 4 <= n1; n += 4) z_rows(1, 4, rows, K, xm, ldx, w + n * ldw, ldw, ym + n, ldy);
        for (; n < n1; n++) z_rows(1, 1, rows, K, xm, ldx, w + n * ldw, ldw, ym + n, ldy);
    }
}

/* ---- large M: lane tiles (gemm_bf16w_tiles) ----
 *
 * As in gemm_avx2.c, pair32's 16 lanes are 16 independent chains and gemm_pack_xt lays
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

/* The vector mapping of lane_tiles.h: a tile's 16 rows per zmm. */
typedef __m512 lv;
#define LANE_NR Z_NR
#define lv_fmadd _mm512_fmadd_ps
#define lv_add _mm512_add_ps
#define lv_broadcast(p) _mm512_set1_ps(*(p))
#include "lane_tiles.h"

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
            const __m512 x[2] = {x0, H > 1 ? _mm512_loadu_ps(xs1 + 16 * s) : x0};
            lane_step(H, x, ws, 1, 8 * (1 - s), acc); /* odd element, then even */
        }
    }
    lane_end(H, acc, out, fold);
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
    lanes_fold(H, lanes);
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
    PAIR32_FLUSHED(z_gemm_tiles(M, K, xt, w, ldw, y, ldy, n0, n1, panel));
}

/* The GEMM entries of the avx512 table. */
void gemm_avx512_set_entries(kernels *t) {
    t->gemm_bf16w_tiles = gemm_bf16w_tiles_avx512;
    /* below 64 rows the row kernel (1 x 8 and 4 x 4 blocks, weights split in registers) ran
     * faster than the lane tiles, whose panel widening is shared by too few rows:
     * build/bench/gemm-bench --m 16,24,32,40,48,56 on Qwen3-0.6B's q and down shapes, 2
     * threads, 3 runs each way on an Intel Xeon (5th generation), 10-30% at 16-40 rows, 5-10%
     * at 48-56, even at 64-128 */
    t->tiles_min_m = 64;
    t->gemm_bf16w = gemm_bf16w_avx512;
    t->gemm_f32w = gemm_f32w_avx512;
}
