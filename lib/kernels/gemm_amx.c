/*
 * The amx backend's GEMM: y[M][N] = x[M][K] . w[N][K]^T on AMX-BF16 tiles (tdpbf16ps), for
 * bf16 weights and bf16 activations, fp32 accumulation in the tile unit's own order.
 *
 * The only file compiled with -mamx-tile -mamx-bf16 (and AVX-512 for packing and the output
 * transpose); cpu.c says whether the CPU has AMX-BF16 and the OS granted the tile state
 * (amx_ready), and nothing here runs before it does.
 *
 * The arithmetic, which is the backend's contract (DESIGN.md, "The amx backend"):
 *   - K is cut into tiles of 32 elements from k = 0; a last, partial tile is padded with
 *     zero products (x and w both 0 there). Each output element is accumulated in fp32 by
 *     one tdpbf16ps per K tile, in increasing k order, starting from +0: the tile unit adds
 *     the 32 exact products of a tile to the accumulator in an order of its own (it is neither
 *     pair order nor one rounding; measured on Intel Xeon 4th/5th generation), with
 *     denormal inputs read as zero and denormal results flushed to zero.
 *   - The weights are the A operand (16 rows of w = 16 output columns, 32 k each, loaded
 *     from the matrix as it is), x packed as the B operand (16 rows of x per tile, in the
 *     pair layout tdpbf16ps reads). Each output element depends only on its own row of x
 *     and column of w (measured: the same data give the same bits in every tile position,
 *     beside any other data), so a result does not depend on M, on the row's place in the
 *     batch, on N's blocking or on the thread: the parity contract holds within the
 *     backend. It is not the bf16 backend's pair32 order, and other CPUs (or none) give it.
 */
#include <immintrin.h>
#include <string.h>

#include "kernels.h"

#define TILE_K 32        /* bf16 elements of K per tile op (16 pairs, 64 bytes a row) */
#define TILE_ROWS 16     /* rows of x, or of w (output columns), per tile */
#define TILE_FLOATS 256  /* a 16 x 16 accumulator */

/* The tile configuration: palette 1, all eight tiles 16 rows of 64 bytes. */
typedef struct tile_config {
    uint8_t palette, start_row, reserved[14];
    uint16_t colsb[16];
    uint8_t rows[16];
} tile_config;

static void tiles_configure(void) {
    tile_config c;
    memset(&c, 0, sizeof c);
    c.palette = 1;
    for (int t = 0; t < 8; t++) c.colsb[t] = 64, c.rows[t] = TILE_ROWS;
    _tile_loadconfig(&c);
}

size_t amx_packed_x_bytes(size_t M, size_t K) {
    const size_t mb = (M + TILE_ROWS - 1) / TILE_ROWS, kt = (K + TILE_K - 1) / TILE_K;
    return mb * kt * TILE_ROWS * TILE_K * sizeof(uint16_t);
}

/* ---- 16 x 16 transposes of 32-bit elements ------------------------------------------------ */

/* r[i][j] -> r[j][i]: four butterfly stages, each swapping the off-diagonal b x b blocks of
 * every 2b x 2b block (b = 1, 2, 4, 8). Stage s's row i (i & b == 0) keeps its own j where
 * j & b == 0 and takes row i+b's j-b elsewhere (lo); row i+b takes row i's j+b where j & b
 * == 0 and keeps its own elsewhere (hi). Indices of vpermt2d: 16 + j reads the second row. */
static const int32_t butterfly_lo[4][16] = {
    {0, 16, 2, 18, 4, 20, 6, 22, 8, 24, 10, 26, 12, 28, 14, 30},
    {0, 1, 16, 17, 4, 5, 20, 21, 8, 9, 24, 25, 12, 13, 28, 29},
    {0, 1, 2, 3, 16, 17, 18, 19, 8, 9, 10, 11, 24, 25, 26, 27},
    {0, 1, 2, 3, 4, 5, 6, 7, 16, 17, 18, 19, 20, 21, 22, 23},
};
static const int32_t butterfly_hi[4][16] = {
    {1, 17, 3, 19, 5, 21, 7, 23, 9, 25, 11, 27, 13, 29, 15, 31},
    {2, 3, 18, 19, 6, 7, 22, 23, 10, 11, 26, 27, 14, 15, 30, 31},
    {4, 5, 6, 7, 20, 21, 22, 23, 12, 13, 14, 15, 28, 29, 30, 31},
    {8, 9, 10, 11, 12, 13, 14, 15, 24, 25, 26, 27, 28, 29, 30, 31},
};

static inline void transpose16(__m512i r[16]) {
    for (int s = 0, b = 1; s < 4; s++, b <<= 1) {
        const __m512i ilo = _mm512_loadu_si512(butterfly_lo[s]);
        const __m512i ihi = _mm512_loadu_si512(butterfly_hi[s]);
        for (int i = 0; i < 16; i++) {
            if (i & b) continue;
            const __m512i a = r[i], c = r[i + b];
            r[i] = _mm512_permutex2var_epi32(a, ilo, c);
            r[i + b] = _mm512_permutex2var_epi32(a, ihi, c);
        }
    }
}

/* ---- packing x ---------------------------------------------------------------------------- */

/* The 32 floats of x at p (n of them valid, the rest 0) as 16 dwords of bf16 pairs (low half
 * = even k); clears *exact when some value is not a bf16 value. */
static inline __m512i pair_dwords(const float *p, size_t n, int *exact) {
    const __mmask16 m0 = n >= 16 ? 0xffff : (__mmask16)((1u << n) - 1);
    const __mmask16 m1 = n >= 32 ? 0xffff : n <= 16 ? 0 : (__mmask16)((1u << (n - 16)) - 1);
    const __m512i a = _mm512_castps_si512(_mm512_maskz_loadu_ps(m0, p));
    const __m512i b = _mm512_castps_si512(_mm512_maskz_loadu_ps(m1, p + 16));
    const __m512i low = _mm512_set1_epi32(0xffff);
    if (_mm512_test_epi32_mask(a, low) | _mm512_test_epi32_mask(b, low)) *exact = 0;
    /* the high half of float j is 16-bit word 2j+1 of a (j < 16) or of b */
    static const short odd[32] = {1,  3,  5,  7,  9,  11, 13, 15, 17, 19, 21,
                                  23, 25, 27, 29, 31, 33, 35, 37, 39, 41, 43,
                                  45, 47, 49, 51, 53, 55, 57, 59, 61, 63};
    return _mm512_permutex2var_epi16(a, _mm512_loadu_si512(odd), b);
}

/* Packs the row blocks mb0 .. mb1-1 of x (16 rows each; rows past M are zero) into the B
 * operand layout: block mb, K tile t holds dword [p][m] = the pair (k = 32t + 2p, +1) of row
 * 16 mb + m. Returns the number of rows among them that hold a value that is not a bf16
 * value (those rows' packed values are truncated, and not to be used). */
size_t amx_pack_x(size_t M, size_t K, const float *x, size_t ldx, uint16_t *xt, size_t mb0,
                  size_t mb1) {
    const size_t kt_n = (K + TILE_K - 1) / TILE_K;
    size_t inexact = 0;
    for (size_t mb = mb0; mb < mb1; mb++) {
        int row_exact[TILE_ROWS];
        for (int m = 0; m < TILE_ROWS; m++) row_exact[m] = 1;
        for (size_t t = 0; t < kt_n; t++) {
            const size_t k0 = t * TILE_K, nk = K - k0 < TILE_K ? K - k0 : TILE_K;
            __m512i r[16];
            for (int m = 0; m < TILE_ROWS; m++) {
                const size_t row = mb * TILE_ROWS + (size_t)m;
                r[m] = row < M ? pair_dwords(x + row * ldx + k0, nk, &row_exact[m])
                               : _mm512_setzero_si512();
            }
            transpose16(r); /* r[p] = pair p of the 16 rows */
            uint16_t *dst = xt + (mb * kt_n + t) * TILE_ROWS * TILE_K;
            for (int p = 0; p < 16; p++) _mm512_storeu_si512(dst + p * 32, r[p]);
        }
        for (int m = 0; m < TILE_ROWS; m++)
            if (mb * TILE_ROWS + (size_t)m < M && !row_exact[m]) inexact++;
    }
    return inexact;
}

/* ---- the GEMM ----------------------------------------------------------------------------- */

/* The 16 x 16 accumulator c[n][m] (n: output column n0 + n, m: row m0 + m) stored into y,
 * rows m < rows and columns n < cols. */
static void store_accumulator(const float *c, size_t rows, size_t cols, float *y, size_t ldy) {
    const __mmask16 mask = cols >= 16 ? 0xffff : (__mmask16)((1u << cols) - 1);
    if (rows < 4) {
        for (size_t m = 0; m < rows; m++)
            for (size_t n = 0; n < cols; n++) y[m * ldy + n] = c[n * 16 + m];
        return;
    }
    __m512i r[16];
    for (int i = 0; i < 16; i++) r[i] = _mm512_loadu_si512(c + i * 16);
    transpose16(r);
    for (size_t m = 0; m < rows; m++)
        _mm512_mask_storeu_ps(y + m * ldy, mask, _mm512_castsi512_ps(r[m]));
}

/* The A operand of K tile t for output columns n0 .. n0+15: straight from w when all 16 rows
 * and 32 k exist, else copied into `pad` with zeros past N and K. Returns the base and sets
 * the stride in bytes. */
static inline const uint16_t *weight_tile(const uint16_t *w, size_t ldw, size_t N, size_t K,
                                          size_t n0, size_t t, uint16_t *pad, size_t *stride) {
    const size_t k0 = t * TILE_K;
    if (n0 + TILE_ROWS <= N && k0 + TILE_K <= K) {
        *stride = ldw * sizeof(uint16_t);
        return w + n0 * ldw + k0;
    }
    const size_t nk = K - k0 < TILE_K ? K - k0 : TILE_K;
    memset(pad, 0, TILE_ROWS * TILE_K * sizeof *pad);
    for (size_t n = 0; n < TILE_ROWS && n0 + n < N; n++)
        memcpy(pad + n * TILE_K, w + (n0 + n) * ldw + k0, nk * sizeof *pad);
    *stride = TILE_K * sizeof(uint16_t);
    return pad;
}

/* Output columns n0 .. n1-1 (n0 a multiple of 32) of y for all M rows: two weight tiles (32
 * columns) against two row blocks (32 rows) at a time, four accumulators in tiles 0-3,
 * weights in 4-5, x in 6-7. The tile state is configured on entry and released on exit. */
void amx_gemm_columns(size_t M, size_t K, const uint16_t *xt, const uint16_t *w, size_t ldw,
                      float *y, size_t ldy, size_t N, size_t n0, size_t n1) {
    const size_t kt_n = (K + TILE_K - 1) / TILE_K, mb_n = (M + TILE_ROWS - 1) / TILE_ROWS;
    const size_t xblock = kt_n * TILE_ROWS * TILE_K; /* uint16 per packed row block */
    uint16_t pad0[TILE_ROWS * TILE_K], pad1[TILE_ROWS * TILE_K];
    float c[4][TILE_FLOATS];
    tiles_configure();
    for (size_t nb = n0; nb < n1; nb += 2 * TILE_ROWS) {
        const int two_n = nb + TILE_ROWS < n1;
        for (size_t mb = 0; mb < mb_n; mb += 2) {
            const int two_m = mb + 1 < mb_n;
            const uint16_t *x0 = xt + mb * xblock, *x1 = x0 + xblock;
            _tile_zero(0);
            _tile_zero(1);
            _tile_zero(2);
            _tile_zero(3);
            for (size_t t = 0; t < kt_n; t++) {
                size_t s0, s1;
                const uint16_t *a0 = weight_tile(w, ldw, N, K, nb, t, pad0, &s0);
                _tile_loadd(4, a0, s0);
                _tile_loadd(6, x0 + t * TILE_ROWS * TILE_K, 64);
                _tile_dpbf16ps(0, 4, 6);
                if (two_m) {
                    _tile_loadd(7, x1 + t * TILE_ROWS * TILE_K, 64);
                    _tile_dpbf16ps(1, 4, 7);
                }
                if (two_n) {
                    const uint16_t *a1 = weight_tile(w, ldw, N, K, nb + TILE_ROWS, t, pad1, &s1);
                    _tile_loadd(5, a1, s1);
                    _tile_dpbf16ps(2, 5, 6);
                    if (two_m) _tile_dpbf16ps(3, 5, 7);
                }
            }
            _tile_stored(0, c[0], 64);
            if (two_m) _tile_stored(1, c[1], 64);
            if (two_n) _tile_stored(2, c[2], 64);
            if (two_n && two_m) _tile_stored(3, c[3], 64);
            for (int a = 0; a < 1 + two_n; a++)
                for (int b = 0; b < 1 + two_m; b++) {
                    const size_t col = nb + (size_t)a * TILE_ROWS;
                    const size_t row = (mb + (size_t)b) * TILE_ROWS;
                    const size_t cols = n1 - col < TILE_ROWS ? n1 - col : TILE_ROWS;
                    const size_t rows = M - row < TILE_ROWS ? M - row : TILE_ROWS;
                    store_accumulator(c[2 * a + b], rows, cols, y + row * ldy + col, ldy);
                }
        }
    }
    _tile_release();
}
