/*
 * The FP8 (E4M3) SIMD GEMM's and activation quantizer's drivers, written once for every ISA:
 * the tile loop over K blocks (one-row decode steps and row steps), the fold of a block's d
 * into the fp32 chain, the entries. fp8_avx2.c and fp8_avx512.c include it after defining:
 *   TILE, STEP_ROWS, FP8_ENTRY(name): the tile's columns (int32 lanes), a step's rows, the
 *     entries' names;
 *   vint, vfloat, vlanes: TILE int32 and fp32 lanes, a set of lanes (columns);
 *   vint v_zero(void); vint dot_pairs(vint acc, const int32_t *pair, vint w): acc plus the
 *     dword dots of the broadcast int16 pair at `pair` and w;
 *   vfloat block_d(vint ll, vint hh, vint pp): d from the three dots (fp8_simd.h);
 *   vfloat nan_lanes(vfloat d, vlanes nan, int all): d NaN in the lanes `nan`, or all;
 *   vfloat vf_set1(float), vf_load(const float *), vf_mul, vf_add; void vf_store(float *,
 *     vfloat); void store_columns(float *y, const float *acc, size_t cols);
 *   vlanes pack_tile(...), decode_activations(...), quantize_block(...): as in the files.
 */
#ifndef PARITY_QUANT_FP8_DRIVER_H
#define PARITY_QUANT_FP8_DRIVER_H

/* Row m's block kb from its three dots folded into its tile accumulators (acc, TILE floats a
 * row): acc = acc + (d * a_s) * w_s, d NaN where the row's or a column's block holds a NaN. */
static inline void fold_block(const quant_gemm_job *j, const fp8_scratch *s, size_t kb, size_t m,
                              vint ll, vint hh, vint pp, vlanes w_nan, vfloat w_scale,
                              float *acc) {
    const vfloat d = nan_lanes(block_d(ll, hh, pp), w_nan, s->act_nan[m * j->nblocks + kb]);
    const vfloat x_scale = vf_set1(j->xs[m * j->nblocks + kb]);
    float *ar = acc + m * TILE;
    vf_store(ar, vf_add(vf_load(ar), vf_mul(vf_mul(d, x_scale), w_scale)));
}

/* Rows [m, m + R) against the packed tile of `pairs` pairs of K from pair p0: their block's d
 * folded into their tile accumulators (acc, TILE floats a row). */
static inline __attribute__((always_inline)) void step_rows(
    const quant_gemm_job *j, const fp8_scratch *s, const vint *tile, size_t pairs, size_t p0,
    size_t kb, size_t m, int R, vlanes w_nan, vfloat w_scale, float *acc) {
    vint ll[STEP_ROWS], hh[STEP_ROWS], pp[STEP_ROWS];
#pragma GCC unroll 8
    for (int r = 0; r < R; r++) ll[r] = hh[r] = pp[r] = v_zero();
    /* the rows m .. m + R - 1, all of one group (of STEP_ROWS rows, or M when fewer) */
    const size_t g = s->group;
    const int32_t *a = s->act + (m / g) * s->group_stride + p0 * 3 * g + m % g;
    for (size_t p = 0; p < pairs; p++, a += 3 * g) {
        const vint wl = tile[3 * p], wh = tile[3 * p + 1], wv = tile[3 * p + 2];
#pragma GCC unroll 8
        for (int r = 0; r < R; r++) {
            ll[r] = dot_pairs(ll[r], a + r, wl);
            hh[r] = dot_pairs(hh[r], a + g + r, wh);
            pp[r] = dot_pairs(pp[r], a + 2 * g + r, wv);
        }
    }
#pragma GCC unroll 8
    for (int r = 0; r < R; r++)
        fold_block(j, s, kb, m + r, ll[r], hh[r], pp[r], w_nan, w_scale, acc);
}

/* The columns [n, n + cols) of the output, cols <= TILE. */
static void gemm_tile(const quant_gemm_job *j, const fp8_scratch *s, size_t n, size_t cols) {
    const uint8_t *w[TILE];
    for (size_t c = 0; c < cols; c++) w[c] = j->wq + (n + c) * j->K;
    memset(s->acc, 0, j->M * TILE * sizeof(float));
    const size_t block_rows = j->rule->format->block_rows;
    vint *tile = (vint *)s->tile;
    for (size_t kb = 0; kb < j->nblocks; kb++) {
        const size_t k0 = kb * j->bc, k1 = k0 + j->bc < j->K ? k0 + j->bc : j->K;
        const size_t pairs = (k1 - k0 + 1) / 2, p0 = k0 / 2;
        float ws[TILE] = {0};
        for (size_t c = 0; c < cols; c++)
            ws[c] = j->ws[((n + c) / block_rows) * j->w_grid_cols + kb];
        const vfloat w_scale = vf_load(ws);
        if (j->M == 1) {
            /* a decode step of one row: each decoded pair straight into its dots */
            vint dots[3] = {v_zero(), v_zero(), v_zero()};
            const vlanes w_nan = pack_tile(w, cols, k0, k1, NULL, s->act + p0 * 3, dots);
            fold_block(j, s, kb, 0, dots[0], dots[1], dots[2], w_nan, w_scale, s->acc);
            continue;
        }
        const vlanes w_nan = pack_tile(w, cols, k0, k1, tile, NULL, NULL);
        size_t m = 0;
        for (; m + STEP_ROWS <= j->M; m += STEP_ROWS)
            step_rows(j, s, tile, pairs, p0, kb, m, STEP_ROWS, w_nan, w_scale, s->acc);
#if STEP_ROWS > 4
        if (m + 4 <= j->M) {
            step_rows(j, s, tile, pairs, p0, kb, m, 4, w_nan, w_scale, s->acc);
            m += 4;
        }
#endif
        if (m + 2 <= j->M) {
            step_rows(j, s, tile, pairs, p0, kb, m, 2, w_nan, w_scale, s->acc);
            m += 2;
        }
        if (m < j->M) step_rows(j, s, tile, pairs, p0, kb, m, 1, w_nan, w_scale, s->acc);
    }
    for (size_t m = 0; m < j->M; m++) store_columns(j->y + m * j->ldy + n, s->acc + m * TILE, cols);
}

void FP8_ENTRY(fp8_gemm)(const quant_gemm_job *j, size_t n0, size_t n1) {
    if (j->M == 0 || n0 >= n1) return; /* no output */
    fp8_scratch s;
    if (!fp8_scratch_alloc(&s, j, TILE, STEP_ROWS)) {
        /* no memory for the decoded planes: the specification computes the same bits */
        quant_gemm_blocked(j, n0, n1);
        return;
    }
    decode_activations(j, &s);
    for (size_t n = n0; n < n1; n += TILE) gemm_tile(j, &s, n, n1 - n < TILE ? n1 - n : TILE);
    fp8_scratch_free(&s);
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
