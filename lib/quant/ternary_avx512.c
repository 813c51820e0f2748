/*
 * The ternary format's AVX-512 variants (format.h, QUANT_SIMD_AVX512 and QUANT_SIMD_AVX512VNNI):
 * the activation quantizer of every ternary rule and the GEMM's column kernel, bit for bit
 * the portable ones of ternary.c and dot.c. This file is compiled twice: with -mavx512f, bw,
 * vl and dq (the avx512 variant, which also holds the quantizer both variants use), and with
 * -mavx512vnni and TERNARY_VNNI defined (the avx512vnni variant's GEMM).
 *
 * The GEMM (ternary_simd.h has the loop): a tile of R activation rows x 16 / R weight rows
 * (4 x 4, 2 x 8, 1 x 16) keeps one zmm of int32 sums per output, 64 codes a step: the weight
 * codes w as held, w + 1 in {0, 1, 2} (unsigned; a group's 16 bytes broadcast to the four
 * 128-bit lanes, lane q shifted right by 2 q bits and masked to its bytes' low two bits gives
 * codes 16 q .. 16 q + 15), the activation codes x as they are (signed), so
 * one vpdpbusd (VNNI), or vpmaddubsw (pairs: at most 2 * 2 * 128, far inside int16) then
 * vpmaddwd by ones, adds four or two products (w + 1) x to each int32 lane; the sum of the
 * row's x, subtracted at the end, leaves D = sum w x. Every sum is of integers and exact in
 * int32 (TERNARY_MAX_K), so the tile's order of terms gives the portable kernel's D. The 16
 * sums of a tile are folded into one zmm, then y = RN(D / (s_w s_x)), or under hf-bitlinear
 * round_bf16(round_bf16(D) / round_bf16(s_w s_x)), on 16 lanes: each one IEEE operation as
 * the portable kernel does it (vcvtdq2ps and vdivps round as cvtsi2ss and divss do).
 *
 * The quantizer: per row, max |x| (round_bf16(x) under hf-bitlinear; a NaN passed over, as
 * fmaxf does), the scale in scalar fp32 as ternary.c writes it, then 16 codes a step: the
 * product (rounded to bf16 under hf-bitlinear), rounded to an integer (to even; onebitllms
 * floor(v + 0.5)), clamped to [-128, 127] with a NaN kept, truncated to int32 and its low
 * byte kept: a NaN becomes 0x80000000, so code 0, as ternary.c's clamp_code writes it.
 */
#include <immintrin.h>

#include "ternary.h"

#include "kernels/kernels_avx512.h"
#include "ternary_simd.h"

#ifdef TERNARY_VNNI
#define TERNARY_GEMM ternary_gemm_avx512vnni
#else
#define TERNARY_GEMM ternary_gemm_avx512
#endif

/* ---- the GEMM ------------------------------------------------------------------------------ */

/* The mask of the first n of 64 bytes (n <= 64). */
static inline __mmask64 byte_mask(size_t n) { return n >= 64 ? ~0ull : (1ull << n) - 1; }

/* The 64 weight codes k .. k + 63 of a held row (k a multiple of 64), as w + 1 in {0, 1, 2}:
 * the one place that reads the weight's layout (code_layout.h: group k / 64 in 16 bytes, code
 * 16 q + i in bits 2 q, 2 q + 1 of byte i). In a row's last group the fields past K are read
 * too; the activation codes there are 0. */
ALWAYS_INLINE __m512i weight_codes(const uint8_t *row, size_t k) {
    const __m128i group = _mm_loadu_si128((const __m128i *)(const void *)(row + k / 4));
    const __m512i quarters =
        _mm512_srlv_epi64(_mm512_broadcast_i32x4(group), _mm512_setr_epi64(0, 0, 2, 2, 4, 4, 6, 6));
    return _mm512_and_si512(quarters, _mm512_set1_epi8(3));
}

/* The 64 weight codes k .. k + 63 of a weight row as w + 1: held (weight_codes) or, where
 * `unpacked`, one a byte. */
ALWAYS_INLINE __m512i weight_at(const int unpacked, const uint8_t *row, size_t k) {
    return unpacked ? _mm512_loadu_si512(row + k) : weight_codes(row, k);
}

/* ternary_unpack_fn: a held row's codes one a byte as w + 1, 64 at a time. */
static void unpack_row(const uint8_t *held, size_t K, uint8_t *bytes) {
    for (size_t k = 0; k < K; k += 64) _mm512_storeu_si512(bytes + k, weight_codes(held, k));
}

/* acc + the sums of the products u s (u unsigned bytes, s signed) four by four into int32. */
ALWAYS_INLINE __m512i dot_bytes(__m512i acc, __m512i u, __m512i s) {
#ifdef TERNARY_VNNI
    return _mm512_dpbusd_epi32(acc, u, s);
#else
    return _mm512_add_epi32(acc, _mm512_madd_epi16(_mm512_maddubs_epi16(u, s),
                                                   _mm512_set1_epi16(1)));
#endif
}

static int32_t sum_codes(const uint8_t *x, size_t K) {
    const __m512i ones = _mm512_set1_epi8(1);
    __m512i acc = _mm512_setzero_si512();
    for (size_t k = 0; k < K; k += 64)
        acc = dot_bytes(acc, ones, _mm512_maskz_loadu_epi8(byte_mask(K - k), x + k));
    return _mm512_reduce_add_epi32(acc);
}

/* Lane k of the result: the sum of the 16 int32 lanes of a[k]. */
ALWAYS_INLINE __m512i fold16(const __m512i a[16]) {
    __m512i pair[8], quad[4];
#pragma GCC unroll 8
    for (int p = 0; p < 8; p++) /* per 128-bit lane: a[2p] 0+2, a[2p+1] 0+2, then 1+3 */
        pair[p] = _mm512_add_epi32(_mm512_unpacklo_epi32(a[2 * p], a[2 * p + 1]),
                                   _mm512_unpackhi_epi32(a[2 * p], a[2 * p + 1]));
#pragma GCC unroll 4
    for (int q = 0; q < 4; q++) /* per 128-bit lane: a[4q] .. a[4q + 3] */
        quad[q] = _mm512_add_epi32(_mm512_unpacklo_epi64(pair[2 * q], pair[2 * q + 1]),
                                   _mm512_unpackhi_epi64(pair[2 * q], pair[2 * q + 1]));
    /* the four 128-bit lanes of each quad summed, quad q into lanes 4q .. 4q + 3 */
    const __m512i s01 = _mm512_add_epi32(_mm512_shuffle_i32x4(quad[0], quad[1], 0x44),
                                         _mm512_shuffle_i32x4(quad[0], quad[1], 0xee));
    const __m512i s23 = _mm512_add_epi32(_mm512_shuffle_i32x4(quad[2], quad[3], 0x44),
                                         _mm512_shuffle_i32x4(quad[2], quad[3], 0xee));
    return _mm512_add_epi32(_mm512_shuffle_i32x4(s01, s23, 0x88),
                            _mm512_shuffle_i32x4(s01, s23, 0xdd));
}

/* The tile's last steps: the sums (lane i C + j: row m + i, column n + j) minus the rows'
 * sums of codes, to fp32, divided by the rows' divisors (in bf16 steps under hf-bitlinear),
 * stored for the first `cols` columns of each row. */
ALWAYS_INLINE void tile_store(const int R, const int C, const __m512i acc[16],
                              const quant_gemm_job *j, const ternary_block *b, size_t m,
                              size_t n, size_t cols) {
    const __m512i lane = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
    const __m512i row = _mm512_srli_epi32(lane, C == 16 ? 4 : C == 8 ? 3 : 2);
    const __m512i sum_x = _mm512_permutexvar_epi32(row, _mm512_loadu_si512(b->sum_x + m));
    const __m512 divisor = _mm512_permutexvar_ps(row, _mm512_loadu_ps(b->divisor + m));
    const __m512 d = _mm512_cvtepi32_ps(_mm512_sub_epi32(fold16(acc), sum_x));
    const __m512 y = b->bf16_steps ? z_round_bf16(_mm512_div_ps(z_round_bf16(d), divisor))
                                   : _mm512_div_ps(d, divisor);
    for (int i = 0; i < R; i++) {
        const __m512i shift = _mm512_add_epi32(lane, _mm512_set1_epi32(i * C));
        const __m512 yi = _mm512_permutexvar_ps(shift, y);
        _mm512_mask_storeu_ps(j->y + (b->m0 + m + i) * j->ldy + n, z_mask(cols), yi);
    }
}

/* The 64 codes from k of the tile's R rows (the first `mask` of them, the others read as 0)
 * and C weight rows (U: unpacked) into its sums; once a line of held weight codes (256
 * codes), where `ahead`, the weight rows' lines `ahead` bytes past the codes read asked into
 * L1. */
ALWAYS_INLINE void tile_step(const int R, const int C, const int U, const uint8_t *const x[4],
                             const uint8_t *const w[16], size_t k, size_t ahead, __mmask64 mask,
                             __m512i acc[16]) {
    __m512i wk[16];
    const int fetch = ahead && k % 256 == 0;
#pragma GCC unroll 16
    for (int c = 0; c < C; c++) {
        if (fetch) _mm_prefetch((const char *)(w[c] + k / 4 + ahead), _MM_HINT_T0);
        wk[c] = weight_at(U, w[c], k);
    }
#pragma GCC unroll 4
    for (int r = 0; r < R; r++) {
        const __m512i xk = mask == ~0ull ? _mm512_loadu_si512(x[r] + k)
                                         : _mm512_maskz_loadu_epi8(mask, x[r] + k);
#pragma GCC unroll 16
        for (int c = 0; c < C; c++) acc[r * C + c] = dot_bytes(acc[r * C + c], wk[c], xk);
    }
}

#ifndef TERNARY_VNNI
/* acc + the products of two steps (u0 s0, u1 s1) summed into int32 (without VNNI): the two
 * vpmaddubsw added in int16 (each pair at most 2 * 2 * 128, so the four at most 1024) before
 * one vpmaddwd by ones. */
ALWAYS_INLINE __m512i dot_bytes2(__m512i acc, __m512i u0, __m512i s0, __m512i u1, __m512i s1) {
    const __m512i pairs = _mm512_add_epi16(_mm512_maddubs_epi16(u0, s0),
                                           _mm512_maddubs_epi16(u1, s1));
    return _mm512_add_epi32(acc, _mm512_madd_epi16(pairs, _mm512_set1_epi16(1)));
}

/* tile_step over the 128 codes from k, two steps at once (dot_bytes2). */
ALWAYS_INLINE void tile_step2(const int R, const int C, const int U, const uint8_t *const x[4],
                              const uint8_t *const w[16], size_t k, size_t ahead,
                              __m512i acc[16]) {
    __m512i w0[16], w1[16];
    const int fetch = ahead && k % 256 == 0;
#pragma GCC unroll 16
    for (int c = 0; c < C; c++) {
        if (fetch) _mm_prefetch((const char *)(w[c] + k / 4 + ahead), _MM_HINT_T0);
        w0[c] = weight_at(U, w[c], k);
        w1[c] = weight_at(U, w[c], k + 64);
    }
#pragma GCC unroll 4
    for (int r = 0; r < R; r++) {
        const __m512i x0 = _mm512_loadu_si512(x[r] + k), x1 = _mm512_loadu_si512(x[r] + k + 64);
#pragma GCC unroll 16
        for (int c = 0; c < C; c++)
            acc[r * C + c] = dot_bytes2(acc[r * C + c], w0[c], x0, w1[c], x1);
    }
}
#endif /* TERNARY_VNNI */

/* A tile of R rows x C = 16 / R columns (U: its weight rows from the block's unpacked ones),
 * 128 codes a step, then 64, the last step masked; columns past `cols` read the first
 * column's weights and are not stored. */
ALWAYS_INLINE void tile(const int R, const int U, const quant_gemm_job *j, const ternary_block *b,
                        size_t m, size_t n, size_t cols) {
    const int C = 16 / R;
    const size_t K = j->K;
    const uint8_t *x[4], *w[16];
    const size_t ahead = ternary_tile_rows(R, C, U, j, b, m, n, cols, x, w);
    __m512i acc[16];
#pragma GCC unroll 16
    for (int i = 0; i < 16; i++) acc[i] = _mm512_setzero_si512();
    size_t k = 0;
#ifndef TERNARY_VNNI
    /* in pairs of steps (dot_bytes2): one vpmaddwd for two vpmaddubsw */
    for (; k + 128 <= K; k += 128) tile_step2(R, C, U, x, w, k, ahead, acc);
#endif
    for (; k + 64 <= K; k += 64) tile_step(R, C, U, x, w, k, ahead, ~0ull, acc);
    if (k < K) tile_step(R, C, U, x, w, k, ahead, byte_mask(K - k), acc);
    tile_store(R, C, acc, j, b, m, n, cols);
}

/* ternary_tile_fn: the tile of `rows` rows. */
static void tiles(const quant_gemm_job *j, const ternary_block *b, size_t m, size_t rows,
                  size_t n, size_t cols) {
    if (rows == 4 && b->unpacked)
        tile(4, 1, j, b, m, n, cols);
    else if (rows == 4)
        tile(4, 0, j, b, m, n, cols);
    else if (rows == 2)
        tile(2, 0, j, b, m, n, cols);
    else
        tile(1, 0, j, b, m, n, cols);
}

/* ---- the GEMM of one activation row (decoding at batch 1) -------------------------------- */

/* The longest row the one-row kernel takes (its arranged activation codes are on the stack);
 * longer ones go to the tiles. */
#define ROW_MAX_K ((size_t)16384)
/* How far ahead of its reads the one-row kernel asks for the weight's lines, in rows. */
#ifndef ROW_AHEAD
#define ROW_AHEAD 16
#endif

/* The activation codes of a row arranged as the held weight lines read them: per line of 256
 * codes (64 bytes of a held row, groups g = 0 .. 3 of 64 codes in its 128-bit lanes), four
 * vectors X_q, q = 0 .. 3, whose lane g holds codes 64 g + 16 q .. 64 g + 16 q + 15 (field q
 * of the line's bytes, code_layout.h); 0 past K. `arranged` takes K rounded up to 256. */
static void arrange_row(const uint8_t *x, size_t K, uint8_t *arranged) {
    for (size_t s = 0; s < K; s += 256) {
        __m512i g[4];
#pragma GCC unroll 4
        for (int i = 0; i < 4; i++) {
            const size_t at = s + 64 * (size_t)i;
            g[i] = _mm512_maskz_loadu_epi8(at < K ? byte_mask(K - at) : 0, x + at);
        }
        /* the 4 x 4 transpose of 128-bit lanes: X_q lane g is g[g] lane q */
        const __m512i a0 = _mm512_shuffle_i64x2(g[0], g[1], 0x44);
        const __m512i a1 = _mm512_shuffle_i64x2(g[0], g[1], 0xee);
        const __m512i b0 = _mm512_shuffle_i64x2(g[2], g[3], 0x44);
        const __m512i b1 = _mm512_shuffle_i64x2(g[2], g[3], 0xee);
        _mm512_storeu_si512(arranged + s, _mm512_shuffle_i64x2(a0, b0, 0x88));
        _mm512_storeu_si512(arranged + s + 64, _mm512_shuffle_i64x2(a0, b0, 0xdd));
        _mm512_storeu_si512(arranged + s + 128, _mm512_shuffle_i64x2(a1, b1, 0x88));
        _mm512_storeu_si512(arranged + s + 192, _mm512_shuffle_i64x2(a1, b1, 0xdd));
    }
}

/* The integer sum sum (w + 1) x of a weight row against the arranged activations, in a vector
 * (its 16 lanes summed later): each held line of 64 bytes loaded once (masked at the row's end:
 * bytes past it read as 0, codes w + 1 = 0), its field q (a shift by 2 q and a mask) the codes
 * of X_q, into a sum of its own (four chains of products); the line `ahead` bytes on asked
 * for. */
ALWAYS_INLINE __m512i row_sum(const uint8_t *row, size_t row_bytes, size_t ahead,
                              const uint8_t *arranged) {
    const __m512i three = _mm512_set1_epi8(3);
    __m512i acc[4];
#pragma GCC unroll 4
    for (int q = 0; q < 4; q++) acc[q] = _mm512_setzero_si512();
    for (size_t b = 0; b < row_bytes; b += 64) {
        const __m512i *x = (const __m512i *)(const void *)(arranged + 4 * b);
        _mm_prefetch((const char *)(row + b + ahead), _MM_HINT_T0);
        const __m512i w = _mm512_maskz_loadu_epi8(byte_mask(row_bytes - b), row + b);
        acc[0] = dot_bytes(acc[0], _mm512_and_si512(w, three), x[0]);
        acc[1] = dot_bytes(acc[1], _mm512_and_si512(_mm512_srli_epi64(w, 2), three), x[1]);
        acc[2] = dot_bytes(acc[2], _mm512_and_si512(_mm512_srli_epi64(w, 4), three), x[2]);
        acc[3] = dot_bytes(acc[3], _mm512_and_si512(_mm512_srli_epi64(w, 6), three), x[3]);
    }
    return _mm512_add_epi32(_mm512_add_epi32(acc[0], acc[1]), _mm512_add_epi32(acc[2], acc[3]));
}

/* The columns [n0, n1) of a job of one activation row (M = 1, K <= ROW_MAX_K): the weight rows
 * read one after the other in address order (the hardware's prefetchers follow one stream,
 * where the tiles' 16 rows of a few lines each lose them), each row's sum
 * kept in a vector until 16 rows are there, folded (fold16) and finished as the tiles finish
 * theirs (tile_store, one row of 16 columns). The integer sums are exact in any order
 * (TERNARY_MAX_K), so D is the tiles' and the portable kernel's. */
static void gemm_row(const quant_gemm_job *j, size_t n0, size_t n1) {
    const size_t K = j->K, row_bytes = j->w_row_bytes;
    _Alignas(64) uint8_t arranged[ROW_MAX_K];
    arrange_row(j->xq, K, arranged);
    ternary_block b;
    ternary_row_block(j, sum_codes, &b);
    const size_t ahead = ROW_AHEAD * row_bytes;
    for (size_t n = n0; n < n1; n += 16) {
        const size_t cols = n1 - n < 16 ? n1 - n : 16;
        __m512i sums[16];
        for (size_t c = 0; c < 16; c++) /* past the last column: the last again, not stored */
            sums[c] = row_sum(j->wq + (n + (c < cols ? c : cols - 1)) * row_bytes, row_bytes,
                              ahead, arranged);
        tile_store(1, 16, sums, j, &b, 0, n, cols);
    }
}

void TERNARY_GEMM(const quant_gemm_job *j, size_t n0, size_t n1) {
    if (j->M == 1 && j->K <= ROW_MAX_K)
        gemm_row(j, n0, n1);
    else
        ternary_gemm_loop(j, n0, n1, 16, sum_codes, tiles, unpack_row);
}

/* ---- the activation quantizer (the avx512 build only; the avx512vnni variant uses it) ------ */
#ifndef TERNARY_VNNI

/* max |x| over a row (|round_bf16(x)| where `bf16`), a NaN passed over. */
static float row_amax(const float *x, size_t n, int bf16) {
    __m512 acc = _mm512_setzero_ps();
    for (size_t i = 0; i < n; i += 16) {
        __m512 v = _mm512_maskz_loadu_ps(z_mask_at(n, i), x + i);
        if (bf16) v = z_round_bf16(v);
        /* vmaxps returns its second operand when either is NaN: the NaN lane is passed over */
        acc = _mm512_max_ps(_mm512_abs_ps(v), acc);
    }
    return _mm512_reduce_max_ps(acc);
}

/* The codes of 16 values (the first `m`) at x under scale s, stored at codes; `half_up`:
 * onebitllms' rounding, floor(v + 0.5). */
ALWAYS_INLINE void codes16(int half_up, int bf16, const float *x, float s, __mmask16 m,
                           uint8_t *codes) {
    const __m512 scale = _mm512_set1_ps(s);
    __m512 v = _mm512_maskz_loadu_ps(m, x);
    v = bf16 ? z_round_bf16(_mm512_mul_ps(z_round_bf16(v), scale)) : _mm512_mul_ps(v, scale);
    if (half_up)
        v = _mm512_roundscale_ps(_mm512_add_ps(v, _mm512_set1_ps(0.5f)),
                                 _MM_FROUND_TO_NEG_INF | _MM_FROUND_NO_EXC);
    else
        v = _mm512_roundscale_ps(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    /* vminps / vmaxps return their second operand, v, when it is NaN */
    v = _mm512_max_ps(_mm512_set1_ps(-128.0f), _mm512_min_ps(_mm512_set1_ps(127.0f), v));
    _mm_mask_storeu_epi8(codes, m, _mm512_cvtepi32_epi8(_mm512_cvttps_epi32(v)));
}

/* ternary_codes_fn: a row's codes, 16 at a time. */
static void row_codes(int half_up, int bf16, const float *x, size_t n, float s, uint8_t *codes) {
    for (size_t c = 0; c < n; c += 16) codes16(half_up, bf16, x + c, s, z_mask_at(n, c), codes + c);
}

void ternary_quantize_rows_avx512(const quant_rule *r, size_t rows, size_t cols, const float *x,
                                  size_t x_stride, uint8_t *codes, size_t codes_stride,
                                  float *block_scales, float *row_scales) {
    (void)block_scales;
    ternary_rows_loop(r, rows, cols, x, x_stride, codes, codes_stride, row_scales, row_amax,
                      row_codes);
}

#endif /* TERNARY_VNNI */
