/*
 * The AVX2 + FMA GEMMs: gemm_bf16w (pair32 on bf16 weights) on its decode and prefill paths,
 * gemm_bf16w_tiles and its x packing (the lane tiles of large M), and gemm_f32w (dot16 on fp32
 * weights); kernels_ref.c's GEMMs vectorised, bit for bit, under the rules of kernels_avx2.c
 * (the orders of the specification exactly, padding terms -0, no fp contraction).
 *
 * Compiled with -mavx2 -mfma -mf16c, as kernels_avx2.c, which puts these entries into the
 * avx2 table.
 */
#include <immintrin.h>
#include <string.h>

#include "kernels.h"
#include "kernels_avx2.h"
#include "kernels_x86.h"

/* ---- GEMM ------------------------------------------------------------------------------- */

/*
 * gemm_bf16w has two paths, chosen by M. Both compute pair32 exactly. An output's 16 lane
 * accumulators are 16 independent chains of fmas: lane l's chain takes, chunk after chunk in
 * ascending order, the odd element's product and then the even one's; the chains only meet
 * in the fold at the end. The paths differ in which chains they advance side by side, and in
 * that a chain may wait in memory between two stretches of K (an fp32 store and reload is
 * exact); no chain ever changes the order of its own steps. So no output depends on M, on
 * the tile it falls in, on the columns next to it or on the thread that computes it.
 *
 * Decode (M < GEMM_HALF_MIN_M): each weight byte feeds one or two rows, so the loop is bound
 * by memory bandwidth. One x row against GEMM_NR weight rows, both lane halves (2
 * accumulators per output) in one pass, the next tile's weights prefetched.
 *
 * Prefill (M >= GEMM_HALF_MIN_M): bound by the fma units. Each accumulator is a chain of
 * dependent fmas (latency 4, two issued per cycle), so a tile needs at least 8 accumulators
 * to keep both units busy, and 16 ymm registers must hold them with the x and weight
 * vectors. Lanes 0..7 and 8..15 of an output never meet before the fold, so they are computed
 * in two passes over K (half 0, then half 1), one accumulator per output and pass; each pass
 * advances its 8 chains in the same order as the single pass would. That makes room for a
 * 3 x 3 tile: 9 accumulators, the 3 odd x vectors of a chunk, and one weight dword vector
 * split into its odd and even halves at a time (the even x vectors are fma memory operands,
 * read from L1). Per chunk and pass: 18 fmas, 3 weight loads, 6 integer ops. Measured on
 * Zen 4 (from L1: 3 x 3 at about 95% of the fma peak) against 2 x 3 (6 chains, bound by
 * latency at 75%), 2 x 4 (8 chains, no slack), 2 x 5 (spills), 3 x 4 and 4 x 3 (all of x as
 * memory operands: more loads than the load ports sustain), and against weights widened to
 * fp32 once into an L1 buffer (4% faster from L1, but it would double the weight bytes
 * coming from L2, or make x stream from L2 instead).
 */

/* Weight rows per tile of the decode path. */
#define GEMM_NR 4
/* x rows per block of the fp32-weight GEMM (so that the block stays in L2). */
#define GEMM_BLOCK_BYTES (192u * 1024u)

/* The smallest M that takes the prefill path (measured: M = 2 is faster on the decode path,
 * M = 3 about even, M = 4 faster here). */
#define GEMM_HALF_MIN_M 3
/* Prefill blocking, from the inside out:
 *   - a row tile (3 x rows) against an N block of HP_NB column tiles (3 weight rows each):
 *     the row tile's slice of x stays in L1 and every column tile reads it, while the
 *     weights stream from L2 (bf16: half the bytes x would take);
 *   - K in blocks of HP_KB chunks, so that the x slice (3 rows x 4 KB) fits L1 next to the
 *     streaming weights; between K blocks the chains wait in an hp_part;
 *   - the N block (33 rows, 66 KB per 1024 of K) stays in L2 while every row tile of the x
 *     block passes, and the next N block is prefetched into L2 meanwhile;
 *   - x rows in blocks of about HP_MB_BYTES, also for L2. */
#define HP_KB 32
#define HP_NB 11
#define HP_MB_BYTES (512u * 1024u)

/* One packed x chunk: the 16 even elements (lanes 0..7, 8..15), then the 16 odd ones. */
typedef struct xchunk {
    __m256 e0, e1, o0, o1;
} xchunk;

static inline xchunk load_xchunk(const float *xc) {
    xchunk x = {_mm256_loadu_ps(xc), _mm256_loadu_ps(xc + 8), _mm256_loadu_ps(xc + 16),
                _mm256_loadu_ps(xc + 24)};
    return x;
}

/* Dword l of the 32 bf16 of a weight chunk holds (w[k0], w[k1]) for lane l, k0 = 32c + 2l,
 * the even element in the low half: w_odd = dword & 0xffff0000, w_even = dword << 16. */
static inline __m256 w_odd(__m256i d) {
    return _mm256_castsi256_ps(_mm256_and_si256(d, _mm256_set1_epi32((int)0xffff0000u)));
}
static inline __m256 w_even(__m256i d) { return _mm256_castsi256_ps(_mm256_slli_epi32(d, 16)); }

/* One chunk of pair32 for one weight row, both halves. Per lane: odd element first. */
ALWAYS_INLINE void pair32_row(__m256 *acc0, __m256 *acc1, xchunk x, const uint16_t *wc) {
    __m256i d0 = _mm256_loadu_si256((const __m256i *)wc);
    __m256i d1 = _mm256_loadu_si256((const __m256i *)(wc + 16));
    *acc0 = _mm256_fmadd_ps(x.o0, w_odd(d0), *acc0);
    *acc0 = _mm256_fmadd_ps(x.e0, w_even(d0), *acc0);
    *acc1 = _mm256_fmadd_ps(x.o1, w_odd(d1), *acc1);
    *acc1 = _mm256_fmadd_ps(x.e1, w_even(d1), *acc1);
}

/* The last chunk when K % 32 != 0: the `rest` weights of each of the nr rows copied into a
 * buffer, so that no load runs past the end of a weight row. Past K, x is packed with +0 and
 * the weights are padded with -0 (0x8000): each padded step adds the product -0, which
 * leaves the accumulator as it is, as the specification's skipped step does. */
static inline void copy_tail(uint16_t tail[GEMM_NR][32], size_t nr, const uint16_t *w, size_t ldw,
                             size_t rest) {
    for (size_t j = 0; j < nr; j++) {
        memcpy(tail[j], w + j * ldw, rest * sizeof(uint16_t));
        for (size_t k = rest; k < 32; k++) tail[j][k] = 0x8000u;
    }
}

/* Decode prefetch: while a tile runs, the next tile's weights (GEMM_NR rows on) are
 * prefetched, a chunk's worth of each row per chunk step. A small tile (4 rows of at most
 * 2 KB) is prefetched in address order, which the memory system streams best; a larger one
 * row by row, in the order it will be read, so that what arrives first is used first and a
 * prefetched line is not evicted from L1 before its turn. */
#define DECODE_LINEAR_MAX_BYTES (8u * 1024u)

/* y[0..3]: one packed x row against weight rows w, w + ldw, w + 2 ldw, w + 3 ldw. `pf` (NULL
 * to skip) is the next tile's first row; `linear` selects the address-order prefetch. */
static void bf16w_tile4(size_t K, const float *xp, const uint16_t *w, size_t ldw, float *y,
                        const uint16_t *pf, int linear) {
    const size_t full = K / 32, rest = K % 32;
    const size_t row_bytes = ldw * sizeof(uint16_t);
    __m256 a0 = _mm256_setzero_ps(), b0 = a0, a1 = a0, b1 = a0, a2 = a0, b2 = a0, a3 = a0, b3 = a0;
    for (size_t c = 0; c < full; c++) {
        if (pf) {
            const char *p = (const char *)pf + (linear ? 256 * c : 64 * c);
            const size_t step = linear ? 64 : row_bytes;
            _mm_prefetch(p, _MM_HINT_T0);
            _mm_prefetch(p + step, _MM_HINT_T0);
            _mm_prefetch(p + 2 * step, _MM_HINT_T0);
            _mm_prefetch(p + 3 * step, _MM_HINT_T0);
        }
        xchunk x = load_xchunk(xp + 32 * c);
        const uint16_t *wc = w + 32 * c;
        pair32_row(&a0, &b0, x, wc);
        pair32_row(&a1, &b1, x, wc + ldw);
        pair32_row(&a2, &b2, x, wc + 2 * ldw);
        pair32_row(&a3, &b3, x, wc + 3 * ldw);
    }
    if (rest) {
        uint16_t tail[GEMM_NR][32];
        copy_tail(tail, 4, w + 32 * full, ldw, rest);
        xchunk x = load_xchunk(xp + 32 * full);
        pair32_row(&a0, &b0, x, tail[0]);
        pair32_row(&a1, &b1, x, tail[1]);
        pair32_row(&a2, &b2, x, tail[2]);
        pair32_row(&a3, &b3, x, tail[3]);
    }
    y[0] = fold16(a0, b0);
    y[1] = fold16(a1, b1);
    y[2] = fold16(a2, b2);
    y[3] = fold16(a3, b3);
}

/* y[0]: one packed x row against one weight row (the columns left over by the 4-tiles). */
static void bf16w_tile1(size_t K, const float *xp, const uint16_t *w, float *y) {
    const size_t full = K / 32, rest = K % 32;
    __m256 a0 = _mm256_setzero_ps(), b0 = a0;
    for (size_t c = 0; c < full; c++) pair32_row(&a0, &b0, load_xchunk(xp + 32 * c), w + 32 * c);
    if (rest) {
        uint16_t tail[GEMM_NR][32];
        copy_tail(tail, 1, w + 32 * full, 0, rest);
        pair32_row(&a0, &b0, load_xchunk(xp + 32 * full), tail[0]);
    }
    y[0] = fold16(a0, b0);
}

/* One packed x row against weight rows n0 .. n1-1 of w (a decode step of one row), row after
 * row: each row's chunks in order on its two accumulators (the chains of bf16w_tile4, the
 * same bits), so that the weights are read as one linear stream, the line
 * DECODE_PF_LINEAR elements ahead asked into L1 across rows; the out-of-order core overlaps
 * the rows' chains. Zen 4 VM, 2 threads, a decode step of one row on the avx2 path
 * (bench/ab-builds, 12 pairs each way round) against the tiles of 4 rows: 0.876 and 1/1.086
 * of the time (gemm-bench --m 1 --thp: 24-30 GB/s before, 25-45 after, in runs of different
 * phases of the VM). */
#define DECODE_PF_LINEAR 3072
static void bf16w_rowwise(size_t K, const float *xp, const uint16_t *w, size_t ldw, float *y,
                          size_t n0, size_t n1) {
    const size_t full = K / 32, rest = K % 32;
    for (size_t n = n0; n < n1; n++) {
        const uint16_t *wn = w + n * ldw;
        __m256 a = _mm256_setzero_ps(), b = a;
        for (size_t c = 0; c < full; c++) {
            _mm_prefetch((const char *)(wn + 32 * c + DECODE_PF_LINEAR), _MM_HINT_T0);
            pair32_row(&a, &b, load_xchunk(xp + 32 * c), wn + 32 * c);
        }
        if (rest) {
            uint16_t tail[GEMM_NR][32];
            copy_tail(tail, 1, wn + 32 * full, 0, rest);
            pair32_row(&a, &b, load_xchunk(xp + 32 * full), tail[0]);
        }
        y[n] = fold16(a, b);
    }
}

/* Decode path: weight tiles outside, x rows inside (rows after the first read the tile from
 * L1, and only the first prefetches); one row alone row after row (bf16w_rowwise). */
static void gemm_bf16w_rows(size_t M, size_t K, const float *xp, const uint16_t *w, size_t ldw,
                            float *y, size_t ldy, size_t n0, size_t n1) {
    if (M == 1) {
        bf16w_rowwise(K, xp, w, ldw, y, n0, n1);
        return;
    }
    const size_t row = gemm_packed_row(K);
    const int linear = GEMM_NR * ldw * sizeof(uint16_t) <= DECODE_LINEAR_MAX_BYTES;
    size_t n = n0;
    for (; n + GEMM_NR <= n1; n += GEMM_NR) {
        const uint16_t *pf = n + 2 * GEMM_NR <= n1 ? w + (n + GEMM_NR) * ldw : NULL;
        for (size_t m = 0; m < M; m++)
            bf16w_tile4(K, xp + m * row, w + n * ldw, ldw, y + m * ldy + n, m ? NULL : pf,
                        linear);
    }
    for (; n < n1; n++)
        for (size_t m = 0; m < M; m++) bf16w_tile1(K, xp + m * row, w + n * ldw, y + m * ldy + n);
}

/* ---- prefill path ---- */

/* Half h of chunks [0, nc) for R x rows (row stride ldx) against C weight rows (stride ldw):
 * x points at the first chunk of row 0 plus 8h floats, w at its first chunk plus 16h
 * elements; acc[r][j] holds lanes 8h .. 8h+7 of output (r, j) and takes, per lane, the odd
 * element's product and then the even one's, chunk after chunk, as pair32 does. R, C are
 * constants after inlining (the loops unroll and the accumulators live in registers). */
ALWAYS_INLINE void half_tile(const int R, const int C, size_t nc, const float *x, size_t ldx,
                             const uint16_t *w, size_t ldw, __m256 acc[3][3], const char *pf,
                             size_t pf_step, size_t pf_n) {
    for (size_t c = 0; c < nc; c++) {
        if (c < pf_n) {
            _mm_prefetch(pf + pf_step * c, _MM_HINT_T1);
            if (pf_step > 64) _mm_prefetch(pf + pf_step * c + 64, _MM_HINT_T1);
        }
        __m256 xo[3];
#pragma GCC unroll 3
        for (int r = 0; r < R; r++) xo[r] = _mm256_loadu_ps(x + r * ldx + 32 * c + 16);
#pragma GCC unroll 3
        for (int j = 0; j < C; j++) {
            __m256i d = _mm256_loadu_si256((const __m256i *)(w + j * ldw + 32 * c));
            __m256 wo = w_odd(d), we = w_even(d);
#pragma GCC unroll 3
            for (int r = 0; r < R; r++) acc[r][j] = _mm256_fmadd_ps(xo[r], wo, acc[r][j]);
#pragma GCC unroll 3
            for (int r = 0; r < R; r++)
                acc[r][j] = _mm256_fmadd_ps(_mm256_loadu_ps(x + r * ldx + 32 * c), we, acc[r][j]);
        }
    }
}

/* A range of memory to prefetch into L2 while computing (the next N block's weights):
 * bytes [off, end) from base, `step` bytes (one or two cache lines) per chunk step. */
typedef struct hp_prefetch {
    const char *base;
    size_t off, end, step;
} hp_prefetch;

/* The next nc chunk steps' share of the range: its start, and in *n how many steps have a
 * line to prefetch (0 once the range is done). */
static inline const char *pf_take(hp_prefetch *pf, size_t nc, size_t *n) {
    const size_t left = pf->off < pf->end ? (pf->end - pf->off + pf->step - 1) / pf->step : 0;
    const char *p = pf->base + (left ? pf->off : 0);
    *n = left < nc ? left : nc;
    pf->off += *n * pf->step;
    return p;
}

/* Where a tile's chains stand between two K blocks: both halves of up to 3 x 3 outputs. */
typedef struct hp_part {
    __m256 a[2][3][3];
} hp_part;

/* Chunks [c0, c1) of an R x C tile (both halves, one after the other) at x row tile `x` and
 * weight row `w`. The chains start at +0 when c0 == 0 and continue from `part` otherwise;
 * they end in `part`, or, when c1 is the last chunk, folded into y. Chunk `full` (if
 * c1 > full) is the padded tail. */
ALWAYS_INLINE void hp_tile(const int R, const int C, size_t K, size_t c0, size_t c1,
                           const float *x, size_t ldx, const uint16_t *w, size_t ldw,
                           hp_part *part, float *y, size_t ldy, hp_prefetch *pf) {
    const size_t full = K / 32, rest = K % 32, nct = full + (rest != 0);
    const size_t f1 = c1 < full ? c1 : full;
    uint16_t tail[GEMM_NR][32];
    if (c1 > full) copy_tail(tail, (size_t)C, w + 32 * full, ldw, rest);
    __m256 s[2][3][3];
    size_t pf_n;
#pragma GCC unroll 2
    for (int h = 0; h < 2; h++) {
        __m256 acc[3][3];
#pragma GCC unroll 3
        for (int r = 0; r < R; r++)
#pragma GCC unroll 3
            for (int j = 0; j < C; j++)
                acc[r][j] = c0 == 0 ? _mm256_setzero_ps() : part->a[h][r][j];
        if (f1 > c0) {
            const char *p = pf_take(pf, f1 - c0, &pf_n);
            half_tile(R, C, f1 - c0, x + 32 * c0 + 8 * h, ldx, w + 32 * c0 + 16 * h, ldw, acc, p,
                      pf->step, pf_n);
        }
        if (c1 > full)
            half_tile(R, C, 1, x + 32 * full + 8 * h, ldx, tail[0] + 16 * h, 32, acc, NULL, 0, 0);
#pragma GCC unroll 3
        for (int r = 0; r < R; r++)
#pragma GCC unroll 3
            for (int j = 0; j < C; j++) s[h][r][j] = acc[r][j];
    }
    if (c1 == nct) {
        for (int r = 0; r < R; r++)
            for (int j = 0; j < C; j++) y[r * ldy + j] = fold16(s[0][r][j], s[1][r][j]);
    } else {
        for (int h = 0; h < 2; h++)
            for (int r = 0; r < R; r++)
                for (int j = 0; j < C; j++) part->a[h][r][j] = s[h][r][j];
    }
}

typedef void (*hp_tile_fn)(size_t K, size_t c0, size_t c1, const float *x, size_t ldx,
                           const uint16_t *w, size_t ldw, hp_part *part, float *y, size_t ldy,
                           hp_prefetch *pf);

#define HP_TILE(R, C)                                                                          \
    static void hp_tile_##R##x##C(size_t K, size_t c0, size_t c1, const float *x, size_t ldx, \
                                  const uint16_t *w, size_t ldw, hp_part *part, float *y,     \
                                  size_t ldy, hp_prefetch *pf) {                               \
        hp_tile(R, C, K, c0, c1, x, ldx, w, ldw, part, y, ldy, pf);                           \
    }
HP_TILE(1, 1)
HP_TILE(1, 2)
HP_TILE(1, 3)
HP_TILE(2, 1)
HP_TILE(2, 2)
HP_TILE(2, 3)
HP_TILE(3, 1)
HP_TILE(3, 2)
HP_TILE(3, 3)

static const hp_tile_fn hp_tiles[3][3] = {
    {hp_tile_1x1, hp_tile_1x2, hp_tile_1x3},
    {hp_tile_2x1, hp_tile_2x2, hp_tile_2x3},
    {hp_tile_3x1, hp_tile_3x2, hp_tile_3x3},
};

/* Rows of the next row tile when `left` rows of the x block remain: 3, except that 4 splits
 * as 2 + 2 and 2 stays 2 (a 1-row tile only for a 1-row block). */
static inline size_t hp_rows(size_t left) { return left == 4 || left == 2 ? 2 : left < 3 ? left : 3; }

static void gemm_bf16w_halves(size_t M, size_t K, const float *xp, const uint16_t *w, size_t ldw,
                              float *y, size_t ldy, size_t n0, size_t n1) {
    const size_t row = gemm_packed_row(K), nct = row / 32;
    /* x blocks of at most about HP_MB_BYTES, all of about the same size, in whole row tiles */
    size_t mb = HP_MB_BYTES / (row * sizeof(float));
    mb = mb < 3 ? 3 : mb;
    const size_t n_blocks = (M + mb - 1) / mb;
    mb = ((M + n_blocks - 1) / n_blocks + 2) / 3 * 3;
    hp_part part[HP_NB]; /* 6 KB */
    for (size_t m0 = 0; m0 < M; m0 += mb) {
        const size_t m1 = M - m0 < mb ? M : m0 + mb;
        for (size_t nb0 = n0; nb0 < n1; nb0 += 3 * HP_NB) {
            const size_t nb1 = n1 - nb0 < 3 * HP_NB ? n1 : nb0 + 3 * HP_NB;
            /* the next N block's weights are prefetched into L2 meanwhile: one line per chunk
             * step covers them within 2 row tiles (11 tiles x 2 halves x the chunks, against 33
             * rows x the chunks' lines); a single row tile takes two lines a step */
            size_t pf0 = nb1, pf1 = n1 - nb1 < 3 * HP_NB ? n1 : nb1 + 3 * HP_NB;
            if (pf0 == n1 && m1 < M) /* the last N block: the next x block's first one */
                pf0 = n0, pf1 = n1 - n0 < 3 * HP_NB ? n1 : n0 + 3 * HP_NB;
            hp_prefetch pf = {(const char *)w, pf0 * ldw * sizeof *w, pf1 * ldw * sizeof *w,
                              m1 - m0 <= 3 ? 128 : 64};
            for (size_t m = m0, R; m < m1; m += R) {
                R = hp_rows(m1 - m);
                for (size_t c0 = 0; c0 < nct; c0 += HP_KB) {
                    const size_t c1 = nct - c0 < HP_KB ? nct : c0 + HP_KB;
                    size_t t = 0;
                    for (size_t n = nb0, C; n < nb1; n += C, t++) {
                        C = nb1 - n < 3 ? nb1 - n : 3;
                        hp_tiles[R - 1][C - 1](K, c0, c1, xp + m * row, row, w + n * ldw, ldw,
                                               &part[t], y + m * ldy + n, ldy, &pf);
                    }
                }
            }
        }
    }
}

PAIR32_BODY void gemm_bf16w_body(size_t M, size_t K, const float *xp, const uint16_t *w,
                                 size_t ldw, float *y, size_t ldy, size_t n0, size_t n1) {
    if (M >= GEMM_HALF_MIN_M && K > 0)
        gemm_bf16w_halves(M, K, xp, w, ldw, y, ldy, n0, n1);
    else
        gemm_bf16w_rows(M, K, xp, w, ldw, y, ldy, n0, n1);
}

static void gemm_bf16w_avx2(size_t M, size_t K, const float *xp, const uint16_t *w, size_t ldw,
                            float *y, size_t ldy, size_t n0, size_t n1) {
    PAIR32_FLUSHED(gemm_bf16w_body(M, K, xp, w, ldw, y, ldy, n0, n1));
}

/* ---- large M: lane tiles (gemm_bf16w_tiles) ----
 *
 * pair32's 16 lanes are 16 independent chains: lane l of output (m, n) is an fp32 dot product,
 * in a fixed order, of the sequence x[m][32c + 2l + 1], x[m][32c + 2l] (c ascending) with the
 * same elements of weight row n. gemm_pack_xt lays these sequences out lane by lane with 16
 * rows side by side, so lane l of a block of 16 rows x LT_NR weight rows is an outer-product
 * GEMM: per step, two vectors of 8 rows' x times LT_NR broadcast weights, 2 LT_NR
 * accumulators (the register block BLIS uses on Haswell, 6 x 16): 12 fmas, 2 x loads and 6
 * broadcast loads, no integer work. The LT_NR weight rows are widened to fp32 into the
 * thread's panel first (past K the panel holds -0, whose product with the +0 of the packed x
 * leaves a chain as it is, as the specification's skipped step does). Then for each tile of
 * 16 rows the 16 lanes run one after the other, each over the whole of K, and the 16 lane sums
 * of every output are folded in the dot16 order. No chain changes the order of its steps, so
 * the bits are pair32's whatever M, the tile or the thread.
 *
 * Blocking: x tiles in blocks of about LT_XBLOCK_BYTES, which stay in L2 while every panel of
 * the thread's columns passes them (each widened panel serves the whole block); one lane of
 * one tile (16 rows x K/16 pairs, 4 KB at K = 1024) and the panel lines it reads stay in L1. A
 * tile with at most 8 rows left runs on one vector of rows.
 */
#define LT_NR 6
#define LT_KB 32
#define LT_XBLOCK_BYTES (1024u * 1024u)

/* The vector mapping of lane_tiles.h: 8 rows of a tile per ymm. */
typedef __m256 lv;
#define LANE_NR LT_NR
#define lv_fmadd _mm256_fmadd_ps
#define lv_add _mm256_add_ps
#define lv_broadcast _mm256_broadcast_ss
#include "lane_tiles.h"

/* Weight rows w, w + ldw, ... (nr of them) widened into panel rows (`row` floats of each, the
 * rows gemm_panel_stride(K) apart); panel rows nr .. LT_NR-1 and every element past K hold
 * -0. */
static void lt_widen(size_t K, const uint16_t *w, size_t ldw, size_t nr, float *panel,
                     size_t row) {
    const __m256 neg0 = _mm256_set1_ps(-0.0f);
    for (size_t j = 0; j < LT_NR; j++) {
        float *p = panel + j * gemm_panel_stride(K);
        size_t k = 0;
        if (j < nr) {
            const uint16_t *wj = w + j * ldw;
            for (; k + 8 <= K; k += 8)
                _mm256_storeu_ps(p + k, widen_bf16(_mm_loadu_si128((const __m128i *)(wj + k))));
            for (; k < K; k++) {
                uint32_t b = (uint32_t)wj[k] << 16;
                memcpy(p + k, &b, sizeof b);
            }
        }
        for (; k + 8 <= row; k += 8) _mm256_storeu_ps(p + k, neg0);
        for (; k < row; k++) p[k] = -0.0f;
    }
}

/* Chunks [0, nc) of lane l of one tile: xl is the lane's packed x at the first chunk (chunk c
 * at xl + 32c: the odd step's 16 rows, then the even step's), wl the panel at the same chunk
 * plus 2l (the even element of chunk c of panel row j at wl[j * ps + 32c], the odd one after
 * it). H vectors of 8 rows (1 or 2). The chains start at zero where `fresh` (the lane's first
 * block of K), else at the values in acc_io; at the end they go back to acc_io, or, where
 * `fold` is given (the last block of a lane l >= 8), the dot16 fold's first step is taken on
 * the way: fold (lane l - 8, finished before) becomes fold + these chains. */
ALWAYS_INLINE void lt_lane(const int H, size_t nc, const float *xl, const float *wl, size_t ps,
                           __m256 acc_io[LT_NR][2], int fresh, __m256 fold[LT_NR][2]) {
    __m256 acc[LT_NR][2];
#pragma GCC unroll 6
    for (int j = 0; j < LT_NR; j++)
        for (int h = 0; h < 2; h++)
            acc[j][h] = fresh || h >= H ? _mm256_setzero_ps() : acc_io[j][h];
    for (size_t c = 0; c < nc; c++) {
        const float *xs = xl + 32 * c, *ws = wl + 32 * c;
#pragma GCC unroll 2
        for (int s = 0; s < 2; s++) {
            const __m256 x0 = _mm256_loadu_ps(xs + 16 * s);
            const __m256 x[2] = {x0, H > 1 ? _mm256_loadu_ps(xs + 16 * s + 8) : x0};
            lane_step(H, x, ws, ps, 1 - s, acc);
        }
    }
    lane_end(H, acc, acc_io, fold);
}

/* One tile (`rows` <= 8H valid rows) against the panel's nr weight rows: y[r][j]. K in blocks
 * of LT_KB chunks, every lane through a block before the next block: the block's panel lines
 * stay in L1 for the 16 lanes, and the chains wait in `lanes` (in L1) between blocks. */
ALWAYS_INLINE void lt_tile(const int H, size_t nc, const float *tile, const float *panel,
                           size_t ps, size_t rows, size_t nr, float *y, size_t ldy,
                           panel_prefetch *pf) {
    __m256 lanes[16][LT_NR][2]; /* 6 KB */
    if (!nc) memset(lanes, 0, sizeof lanes);  /* K = 0: every output +0, as the chains start */
    for (size_t c0 = 0; c0 < nc; c0 += LT_KB) {
        const size_t n = nc - c0 < LT_KB ? nc - c0 : LT_KB;
        const int last = c0 + n == nc;
        for (size_t l = 0; l < 16; l++) {
            panel_prefetch_some(pf);
            lt_lane(H, n, tile + (l * nc + c0) * 32, panel + 32 * c0 + 2 * l, ps, lanes[l],
                    c0 == 0, last && l >= 8 ? lanes[l - 8] : NULL);
        }
    }
    lanes_fold(H, lanes);
    /* the 8 x LT_NR block of each row vector transposed (columns 6, 7 unused), one masked
     * store of nr floats per row */
    const __m256i mask = lane_mask(nr);
    for (int h = 0; h < H; h++) {
        __m256 c[8];
        for (int j = 0; j < 8; j++) c[j] = j < LT_NR ? lanes[0][j][h] : _mm256_setzero_ps();
        __m256 r[8];
        transpose8(c, r);
        for (size_t i = 0; i < 8 && 8 * (size_t)h + i < rows; i++)
            _mm256_maskstore_ps(y + (8 * (size_t)h + i) * ldy, mask, r[i]);
    }
}

static void lt_tile2(size_t nc, const float *tile, const float *panel, size_t ps, size_t rows,
                     size_t nr, float *y, size_t ldy, panel_prefetch *pf) {
    lt_tile(2, nc, tile, panel, ps, rows, nr, y, ldy, pf);
}
static void lt_tile1(size_t nc, const float *tile, const float *panel, size_t ps, size_t rows,
                     size_t nr, float *y, size_t ldy, panel_prefetch *pf) {
    lt_tile(1, nc, tile, panel, ps, rows, nr, y, ldy, pf);
}

/* gemm_pack_xt_tiles with 8 x 8 transposes: 8 rows' 8 consecutive elements of a chunk become
 * 8 vectors, vector i holding element 8q + i of every row, that is lane 4q + i/2, step 1 - i%2.
 * Partial chunks (past K) and row groups (past M) take the specification's loop. */
static void pack_xt_tiles_avx2(size_t M, size_t K, const float *x, size_t ldx, float *xt,
                               size_t t0, size_t t1) {
    const size_t row = gemm_packed_row(K), nc = row / 32, full = K / 32;
    for (size_t t = t0; t < t1; t++) {
        float *tile = xt + t * GEMM_XT_ROWS * row;
        for (size_t h = 0; h < 2; h++) {
            const size_t m0 = t * GEMM_XT_ROWS + 8 * h;
            if (m0 + 8 > M) continue;
            const float *xr = x + m0 * ldx;
            for (size_t c = 0; c < full; c++)
                for (size_t q = 0; q < 4; q++) {
                    const float *xc = xr + 32 * c + 8 * q;
                    __m256 a[8], v[8]; /* v[i]: element 8q + i of rows m0 .. m0+7 */
                    for (size_t i = 0; i < 8; i++) a[i] = _mm256_loadu_ps(xc + i * ldx);
                    transpose8(a, v);
                    for (size_t i = 0; i < 8; i++) {
                        const size_t l = 4 * q + i / 2, step = 1 - i % 2;
                        _mm256_storeu_ps(tile + ((l * nc + c) * 2 + step) * GEMM_XT_ROWS + 8 * h, v[i]);
                    }
                }
        }
        /* what the transposes left: row groups past M and the partial chunk */
        for (size_t c = 0; c < nc; c++)
            for (size_t r = 0; r < GEMM_XT_ROWS; r++)
                if (c >= full || t * GEMM_XT_ROWS + (r < 8 ? 0 : 8) + 8 > M)
                    gemm_pack_xt_row(M, K, x, ldx, tile, t, c, r);
    }
}

PAIR32_BODY void gemm_bf16w_tiles_body(size_t M, size_t K, const float *xt, const uint16_t *w,
                                       size_t ldw, float *y, size_t ldy, size_t n0, size_t n1,
                                       float *panel) {
    const size_t row = gemm_packed_row(K), nc = row / 32, tiles = gemm_xt_tiles(M);
    const size_t tile_floats = GEMM_XT_ROWS * row;
    size_t tb = row ? LT_XBLOCK_BYTES / (tile_floats * sizeof(float)) : tiles;
    if (tb < 1) tb = 1;
    for (size_t t0 = 0; t0 < tiles; t0 += tb) {
        const size_t t1 = tiles - t0 < tb ? tiles : t0 + tb;
        /* lane passes per panel: where the next panel's lines are asked for */
        const size_t slots = (t1 - t0) * ((nc + LT_KB - 1) / LT_KB) * 16;
        for (size_t n = n0; n < n1; n += LT_NR) {
            const size_t nr = n1 - n < LT_NR ? n1 - n : LT_NR;
            lt_widen(K, w + n * ldw, ldw, nr, panel, row);
            panel_prefetch pf = {NULL, ldw * 2, (K * 2 + 63) / 64, 0, 0, 0};
            if (n + LT_NR < n1 && slots && pf.lines_per_row) {
                const size_t next_nr = n1 - n - LT_NR < LT_NR ? n1 - n - LT_NR : LT_NR;
                pf.w = (const char *)(w + (n + LT_NR) * ldw);
                pf.lines = next_nr * pf.lines_per_row;
                pf.per_slot = (pf.lines + slots - 1) / slots;
            }
            for (size_t t = t0; t < t1; t++) {
                const size_t m = t * GEMM_XT_ROWS, rows = M - m < 16 ? M - m : 16;
                (rows > 8 ? lt_tile2 : lt_tile1)(nc, xt + t * tile_floats, panel,
                                                 gemm_panel_stride(K), rows, nr,
                                                 y + m * ldy + n, ldy, &pf);
            }
        }
    }
}

static void gemm_bf16w_tiles_avx2(size_t M, size_t K, const float *xt, const uint16_t *w,
                                  size_t ldw, float *y, size_t ldy, size_t n0, size_t n1,
                                  float *panel) {
    PAIR32_FLUSHED(gemm_bf16w_tiles_body(M, K, xt, w, ldw, y, ldy, n0, n1, panel));
}

/* dot16 step of 16 elements for one weight row: x0/x1 hold x[i..i+7], x[i+8..i+15]. */
ALWAYS_INLINE void dot16_row(__m256 *acc0, __m256 *acc1, __m256 x0, __m256 x1, __m256 w0,
                             __m256 w1) {
    *acc0 = _mm256_fmadd_ps(x0, w0, *acc0);
    *acc1 = _mm256_fmadd_ps(x1, w1, *acc1);
}

/* y[0..3]: dot16 of one x row against 4 fp32 weight rows. The last partial block of 16 goes
 * through masked loads, x padded with -0 and w with +0. */
static void f32w_tile4(size_t K, const float *x, const float *w, size_t ldw, float *y) {
    __m256 a0 = _mm256_setzero_ps(), b0 = a0, a1 = a0, b1 = a0, a2 = a0, b2 = a0, a3 = a0, b3 = a0;
    const float *w1 = w + ldw, *w2 = w + 2 * ldw, *w3 = w + 3 * ldw;
    size_t i = 0;
    for (; i + 16 <= K; i += 16) {
        __m256 x0 = _mm256_loadu_ps(x + i), x1 = _mm256_loadu_ps(x + i + 8);
        dot16_row(&a0, &b0, x0, x1, _mm256_loadu_ps(w + i), _mm256_loadu_ps(w + i + 8));
        dot16_row(&a1, &b1, x0, x1, _mm256_loadu_ps(w1 + i), _mm256_loadu_ps(w1 + i + 8));
        dot16_row(&a2, &b2, x0, x1, _mm256_loadu_ps(w2 + i), _mm256_loadu_ps(w2 + i + 8));
        dot16_row(&a3, &b3, x0, x1, _mm256_loadu_ps(w3 + i), _mm256_loadu_ps(w3 + i + 8));
    }
    if (i < K) {
        size_t k0 = lanes_at(K, i), k1 = K - i - k0;
        __m256 x0 = load_f32_n_neg0(x + i, k0);
        __m256 x1 = k1 ? load_f32_n_neg0(x + i + 8, k1) : _mm256_set1_ps(-0.0f);
        __m256 z = _mm256_setzero_ps();
        dot16_row(&a0, &b0, x0, x1, load_f32_n(w + i, k0), k1 ? load_f32_n(w + i + 8, k1) : z);
        dot16_row(&a1, &b1, x0, x1, load_f32_n(w1 + i, k0), k1 ? load_f32_n(w1 + i + 8, k1) : z);
        dot16_row(&a2, &b2, x0, x1, load_f32_n(w2 + i, k0), k1 ? load_f32_n(w2 + i + 8, k1) : z);
        dot16_row(&a3, &b3, x0, x1, load_f32_n(w3 + i, k0), k1 ? load_f32_n(w3 + i + 8, k1) : z);
    }
    y[0] = fold16(a0, b0);
    y[1] = fold16(a1, b1);
    y[2] = fold16(a2, b2);
    y[3] = fold16(a3, b3);
}

/* The fp32-weight GEMM: blocks of x rows outside, column tiles inside, so that a tile's
 * weights are reused from L1 by every row of the block and the block is reused from L2 by
 * every tile. */
static void gemm_f32w_avx2(size_t M, size_t K, const float *x, size_t ldx, const float *w,
                           size_t ldw, float *y, size_t ldy, size_t n0, size_t n1) {
    size_t block = GEMM_BLOCK_BYTES / ((K ? K : 1) * sizeof(float));
    if (block == 0) block = 1;
    for (size_t m0 = 0; m0 < M; m0 += block) {
        size_t m1 = M - m0 < block ? M : m0 + block;
        size_t n = n0;
        for (; n + GEMM_NR <= n1; n += GEMM_NR)
            for (size_t m = m0; m < m1; m++)
                f32w_tile4(K, x + m * ldx, w + n * ldw, ldw, y + m * ldy + n);
        for (; n < n1; n++)
            for (size_t m = m0; m < m1; m++) y[m * ldy + n] = dot_f32_avx2(x + m * ldx, w + n * ldw, K);
    }
}

/* The GEMM entries of the avx2 table. */
void gemm_avx2_set_entries(kernels *t) {
    t->gemm_bf16w = gemm_bf16w_avx2;
    t->gemm_f32w = gemm_f32w_avx2;
    t->gemm_bf16w_tiles = gemm_bf16w_tiles_avx2;
    t->pack_xt_tiles = pack_xt_tiles_avx2;
}
