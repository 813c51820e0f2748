/*
 * The FP8 (E4M3) SIMD GEMM's and activation quantizer's drivers, written once for every ISA:
 * the loops over row chunks, K blocks and column tiles (one-row decode steps and row steps),
 * the fold of a block's d into the fp32 chain, the entries. fp8_avx2.c and fp8_avx512.c include
 * it after defining:
 *   TILE, STEP_ROWS, FP8_ENTRY(name), FP8_PAIRS(n): the tile's columns (int32 lanes), a step's
 *     rows, the entries' names, the pairs of K pack_tile makes of a block of n codes;
 *   vint, vfloat, vlanes: TILE int32 and fp32 lanes, a set of lanes (columns);
 *   vint v_zero(void), v_add(vint, vint); vint dot_pairs(vint acc, const int32_t *pair,
 *     vint w): acc plus the dword dots of the broadcast int16 pair at `pair` and w;
 *   vfloat nan_lanes(vfloat d, vlanes nan, int all): d NaN in the lanes `nan`, or all;
 *   vfloat vf_set1(float), vf_mul, vf_add, load_columns(const float *, size_t cols);
 *     vint load_ints(const int32_t *); vfloat gather_columns(const float *base, vint offsets);
 *     void store_columns(float *, vfloat, size_t cols);
 *   and, before or after the include, pack_tile, decode_rows, block_d and quantize_block (the
 *   declarations below), which take their decoded pairs through take_pair;
 *   optionally FP8_ONE_ROW(j, n0, n1): nonzero where a kernel of its own took the job (the
 *   columns [n0, n1) computed), tried first.
 *
 * The GEMM allocates nothing: a chunk of up to FP8_CHUNK_ROWS activation rows is decoded onto
 * the stack a run of K blocks at a time (fp8_rows, 48 KB: one block for 64 rows, all of K up to
 * 8192 for one row), the weight tile of a block too (12 KB at the most), and the fp32 chain
 * accumulates in y itself (a one-row step's in registers over a run of blocks; only the job's
 * columns are written).
 */
#ifndef PARITY_QUANT_FP8_DRIVER_H
#define PARITY_QUANT_FP8_DRIVER_H

/* Decodes block kb ([k0, k1)) of the activation rows [m0, m0 + rows) into b (fp8_simd.h). */
static void decode_rows(const quant_gemm_job *j, size_t m0, size_t rows, size_t kb, size_t k0,
                        size_t k1, fp8_rows *b);
/* Decodes block [k0, k1) of the tile's `cols` weight rows `w` into `tile` (three vectors per
 * pair of K: lo, hi, v, a column's pair a dword lane); returns the columns holding a NaN code.
 * With `row` (a single row of activations: its digits at the block's first pair), takes that
 * row's three dots into dots[6] instead (pack_tile may keep two chains: 0..2 and 3..5), the
 * decoded pairs never stored. */
static inline __attribute__((always_inline)) vlanes pack_tile(
    const uint8_t *const *w, size_t cols, size_t k0, size_t k1, vint *tile, const int32_t *row,
    vint *dots);
/* d of TILE columns from the three dots (fp8_simd.h), rounded once to fp32. */
static inline vfloat block_d(vint ll, vint hh, vint pp);
/* One row's block of n <= 128 values: the amax (NaN passed over, as fmaxf), the rule's scale,
 * the codes; returns the scale as the portable quantizer stores it. */
static float quantize_block(const quant_rule *r, const float *x, size_t n, uint8_t *codes);

/* pack_tile's use of the decoded pair `pair` of its block (lo, hi, v): the one-row dots (three
 * at `dots`), or the tile's stored pair. */
static inline __attribute__((always_inline)) void take_pair(const int32_t *row, vint *dots,
                                                            vint *tile, size_t pair, vint lo,
                                                            vint hi, vint v) {
    if (row) {
        const int32_t *a = row + pair * 3;
        dots[0] = dot_pairs(dots[0], a, lo);
        dots[1] = dot_pairs(dots[1], a + 1, hi);
        dots[2] = dot_pairs(dots[2], a + 2, v);
    } else {
        vint *t = tile + 3 * pair;
        t[0] = lo;
        t[1] = hi;
        t[2] = v;
    }
}

/* Row m's (the chunk's row r) block kb from its three dots folded into its output columns:
 * acc = acc + (d * a_s) * w_s, acc +0 at the first block, d NaN where the row's or a column's
 * block holds a NaN. */
static inline void fold_block(const quant_gemm_job *j, const fp8_rows *b, size_t kb, size_t m,
                              size_t r, vint ll, vint hh, vint pp, vlanes w_nan, vfloat w_scale,
                              float *y, size_t cols) {
    const vfloat d = nan_lanes(block_d(ll, hh, pp), w_nan, b->nan[r * b->blocks + kb - b->kb0]);
    const vfloat x_scale = vf_set1(j->xs[m * j->nblocks + kb]);
    const vfloat acc = kb ? load_columns(y, cols) : vf_set1(0.0f);
    store_columns(y, vf_add(acc, vf_mul(vf_mul(d, x_scale), w_scale)), cols);
}

/* The chunk's rows [r, r + R) (rows m0 + r .. of the job) against the packed tile of `pairs`
 * pairs of K: their block's d folded into their output columns [n, n + cols). */
static inline __attribute__((always_inline)) void step_rows(
    const quant_gemm_job *j, fp8_rows *b, const vint *tile, size_t pairs, size_t kb, size_t m0,
    size_t r, int R, vlanes w_nan, vfloat w_scale, size_t n, size_t cols) {
    vint ll[STEP_ROWS], hh[STEP_ROWS], pp[STEP_ROWS];
#pragma GCC unroll 8
    for (int i = 0; i < R; i++) ll[i] = hh[i] = pp[i] = v_zero();
    /* the rows r .. r + R - 1, all of one group */
    const size_t g = b->group;
    const int32_t *a = fp8_row_pair(b, r, (kb - b->kb0) * FP8_BLOCK_PAIRS);
    for (size_t p = 0; p < pairs; p++, a += 3 * g) {
        const vint wl = tile[3 * p], wh = tile[3 * p + 1], wv = tile[3 * p + 2];
#pragma GCC unroll 8
        for (int i = 0; i < R; i++) {
            ll[i] = dot_pairs(ll[i], a + i, wl);
            hh[i] = dot_pairs(hh[i], a + g + i, wh);
            pp[i] = dot_pairs(pp[i], a + 2 * g + i, wv);
        }
    }
#pragma GCC unroll 8
    for (int i = 0; i < R; i++)
        fold_block(j, b, kb, m0 + r + i, r + i, ll[i], hh[i], pp[i], w_nan, w_scale,
                   j->y + (m0 + r + i) * j->ldy + n, cols);
}

/* A tile's columns [n, n + cols), cols <= TILE: their weight rows and their rows of block
 * scales, as offsets in j->ws and as int32 offsets from the first column's row for a gather
 * (the lanes past cols repeat the last column's, whose results are never stored; a tile whose
 * rows of scales lie 2^31 or more apart, which takes K beyond 2^32, reads them one by one). */
typedef struct fp8_tile {
    const uint8_t *w[TILE];
    size_t ws[TILE];
    vint ws_offsets;
    int gather;
    size_t n, cols;
} fp8_tile;

static inline void fp8_tile_begin(const quant_gemm_job *j, fp8_tile *t, size_t n, size_t cols) {
    const size_t block_rows = j->rule->format->block_rows;
    int32_t offsets[TILE];
    t->n = n;
    t->cols = cols;
    t->gather = 1;
    for (size_t c = 0; c < TILE; c++) {
        const size_t column = n + (c < cols ? c : cols - 1);
        t->w[c] = j->wq + column * j->K;
        t->ws[c] = (column / block_rows) * j->w_grid_cols;
        if (t->ws[c] - t->ws[0] > (size_t)INT32_MAX) t->gather = 0;
        offsets[c] = (int32_t)(t->ws[c] - t->ws[0]);
    }
    t->ws_offsets = load_ints(offsets);
}

/* The tile's weight block scales of block kb. */
static inline vfloat tile_scales(const quant_gemm_job *j, const fp8_tile *t, size_t kb) {
    if (t->gather) return gather_columns(j->ws + t->ws[0] + kb, t->ws_offsets);
    float ws[TILE];
    for (size_t c = 0; c < TILE; c++) ws[c] = j->ws[t->ws[c] + kb];
    return load_columns(ws, TILE);
}

/* The next tile's weight rows [k0, k1) into L2 (the hardware's prefetchers lose TILE short
 * streams), a prefetch at each multiple of 64 codes (a block of 32 starting between two has its
 * codes fetched with the block before); the job's columns end at n_end. */
static inline void prefetch_next_tile(const quant_gemm_job *j, const fp8_tile *t, size_t k0,
                                      size_t k1, size_t n_end) {
    for (size_t c = t->n + TILE; c < t->n + 2 * TILE && c < n_end; c++)
        for (size_t k = (k0 + 63) / 64 * 64; k < k1; k += 64)
            _mm_prefetch((const char *)(j->wq + c * j->K + k), _MM_HINT_T1);
}

/* A decode step of one row (the job's row m0, the chunk's only one) against the tile over the
 * chunk's run of blocks: each decoded pair straight into its dots, the fp32 chain
 * acc = acc + (d * a_s) * w_s in registers from y (+0 before the first block) back to y. */
static void row_tile(const quant_gemm_job *j, fp8_rows *b, const fp8_tile *t, size_t m0,
                     size_t n_end) {
    float *y = j->y + m0 * j->ldy + t->n;
    vfloat acc = b->kb0 ? load_columns(y, t->cols) : vf_set1(0.0f);
    for (size_t kb = b->kb0; kb < b->kb0 + b->blocks; kb++) {
        const size_t k0 = kb * j->bc, k1 = k0 + j->bc < j->K ? k0 + j->bc : j->K;
        prefetch_next_tile(j, t, k0, k1, n_end);
        vint dots[6] = {v_zero(), v_zero(), v_zero(), v_zero(), v_zero(), v_zero()};
        const vlanes w_nan = pack_tile(t->w, t->cols, k0, k1, NULL,
                                       fp8_row_pair(b, 0, (kb - b->kb0) * FP8_BLOCK_PAIRS), dots);
        const vfloat d = nan_lanes(block_d(v_add(dots[0], dots[3]), v_add(dots[1], dots[4]),
                                           v_add(dots[2], dots[5])),
                                   w_nan, b->nan[kb - b->kb0]);
        const vfloat x_scale = vf_set1(j->xs[m0 * j->nblocks + kb]);
        acc = vf_add(acc, vf_mul(vf_mul(d, x_scale), tile_scales(j, t, kb)));
    }
    store_columns(y, acc, t->cols);
}

/* Block kb ([k0, k1)) of the tile's columns for the `rows` rows of the chunk from m0 (decoded
 * in b); the job's columns end at n_end. */
static void block_tile(const quant_gemm_job *j, fp8_rows *b, vint *tile, const fp8_tile *t,
                       size_t m0, size_t rows, size_t kb, size_t k0, size_t k1, size_t n_end) {
    const size_t pairs = FP8_PAIRS(k1 - k0), n = t->n, cols = t->cols;
    prefetch_next_tile(j, t, k0, k1, n_end);
    const vfloat w_scale = tile_scales(j, t, kb);
    const vlanes w_nan = pack_tile(t->w, cols, k0, k1, tile, NULL, NULL);
    size_t r = 0;
    for (; r + STEP_ROWS <= rows; r += STEP_ROWS)
        step_rows(j, b, tile, pairs, kb, m0, r, STEP_ROWS, w_nan, w_scale, n, cols);
#if STEP_ROWS > 4
    if (r + 4 <= rows) {
        step_rows(j, b, tile, pairs, kb, m0, r, 4, w_nan, w_scale, n, cols);
        r += 4;
    }
#endif
    if (r + 2 <= rows) {
        step_rows(j, b, tile, pairs, kb, m0, r, 2, w_nan, w_scale, n, cols);
        r += 2;
    }
    if (r < rows) step_rows(j, b, tile, pairs, kb, m0, r, 1, w_nan, w_scale, n, cols);
}

void FP8_ENTRY(fp8_gemm)(const quant_gemm_job *j, size_t n0, size_t n1) {
#ifdef FP8_ONE_ROW
    if (FP8_ONE_ROW(j, n0, n1)) return; /* a job of one row the ISA file's own kernel took */
#endif
    if (j->nblocks == 0) { /* K = 0: every output the empty sum */
        for (size_t m = 0; m < j->M; m++)
            for (size_t n = n0; n < n1; n++) j->y[m * j->ldy + n] = 0.0f;
        return;
    }
    fp8_rows b;
    vint tile[FP8_BLOCK_PAIRS * 3];
    for (size_t m0 = 0; m0 < j->M; m0 += FP8_CHUNK_ROWS) {
        const size_t rows = j->M - m0 < FP8_CHUNK_ROWS ? j->M - m0 : FP8_CHUNK_ROWS;
        for (size_t kb0 = 0; kb0 < j->nblocks; kb0 += b.blocks) {
            fp8_rows_begin(&b, rows, STEP_ROWS, kb0, j->nblocks);
            for (size_t kb = kb0; kb < kb0 + b.blocks; kb++) {
                const size_t k0 = kb * j->bc, k1 = k0 + j->bc < j->K ? k0 + j->bc : j->K;
                decode_rows(j, m0, rows, kb, k0, k1, &b);
            }
            /* each tile's blocks in order: a weight row's codes read in one stream */
            for (size_t n = n0; n < n1; n += TILE) {
                fp8_tile t;
                fp8_tile_begin(j, &t, n, n1 - n < TILE ? n1 - n : TILE);
                if (rows == 1) {
                    row_tile(j, &b, &t, m0, n1);
                    continue;
                }
                for (size_t kb = kb0; kb < kb0 + b.blocks; kb++) {
                    const size_t k0 = kb * j->bc, k1 = k0 + j->bc < j->K ? k0 + j->bc : j->K;
                    block_tile(j, &b, tile, &t, m0, rows, kb, k0, k1, n1);
                }
            }
        }
    }
}

void FP8_ENTRY(fp8_quantize_activations)(const quant_rule *r, size_t rows, size_t cols,
                                         const float *x, size_t x_stride, uint8_t *codes,
                                         size_t codes_stride, float *scales, float *row_scales) {
    (void)row_scales;
    const size_t bc = r->format->block_cols, grid = (cols + bc - 1) / bc;
    for (size_t m = 0; m < rows; m++)
        for (size_t c0 = 0; c0 < cols; c0 += bc)
            scales[m * grid + c0 / bc] =
                quantize_block(r, x + m * x_stride + c0, cols - c0 < bc ? cols - c0 : bc,
                               codes + m * codes_stride + c0);
}

#endif /* PARITY_QUANT_FP8_DRIVER_H */
