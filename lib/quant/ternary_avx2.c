/*
 * The ternary format's AVX2 variant (format.h, QUANT_SIMD_AVX2): the activation quantizer of
 * every ternary rule and the GEMM's column kernel, bit for bit the portable ones of ternary.c
 * and dot.c; compiled with -mavx2 -mfma -mf16c. ternary_avx512.c is the same construction on
 * zmm, and its opening comment says why each step gives the portable bits.
 *
 * The GEMM (ternary_simd.h has the loop): a tile of R activation rows x 8 / R weight rows
 * (4 x 2, 2 x 4, 1 x 8) keeps one ymm of int32 sums per output, 64 codes a step in two halves:
 * vpmaddubsw of the weight codes as held, w + 1 in {0, 1, 2} (unsigned; a group's 16 bytes
 * broadcast to both 128-bit lanes, shifted right by 0 and 2 bits for the first half, 4 and 6
 * for the second, masked to their bytes' low two bits), and the activation codes (signed),
 * pairs at most 2 * 2 * 128 in int16, then vpmaddwd by ones into int32; the row's sum of codes
 * subtracted at the end leaves D, exact in int32. A row's last K mod 64 codes are one more
 * step, their activation codes copied into zeros. The 8 sums of a tile are folded into one
 * ymm for the last steps, as the portable kernel's fp32 (bf16 under hf-bitlinear) operations
 * on 8 lanes.
 *
 * The quantizer: per row, max |x| (of round_bf16(x) under hf-bitlinear, a NaN passed over),
 * the scale in scalar fp32 as ternary.c writes it, then 8 codes a step: rounded (to even, or
 * onebitllms' floor(v + 0.5)), clamped with a NaN kept, truncated to int32, low byte kept.
 */
#include <immintrin.h>

#include "ternary.h"

#include "kernels/kernels_avx2.h"
#include "ternary_simd.h"

/* ---- the GEMM ------------------------------------------------------------------------------ */

/* The 64 weight codes k .. k + 63 of a held row (k a multiple of 64) as w + 1 in {0, 1, 2},
 * the first 32 into lo, the others into hi: the one place that reads the weight's layout
 * (code_layout.h: group k / 64 in 16 bytes, code 16 q + i in bits 2 q, 2 q + 1 of byte i). In
 * a row's last group the fields past K are read too; the activation codes there are 0. */
ALWAYS_INLINE void weight_codes(const uint8_t *row, size_t k, __m256i *lo, __m256i *hi) {
    const __m256i group = _mm256_broadcastsi128_si256(
        _mm_loadu_si128((const __m128i *)(const void *)(row + k / 4)));
    const __m256i low_bits = _mm256_set1_epi8(3);
    /* shifted by 0 and 2, then by 4 more (one shift count vector: the tiles are short of
     * registers) */
    const __m256i first = _mm256_srlv_epi64(group, _mm256_setr_epi64x(0, 0, 2, 2));
    *lo = _mm256_and_si256(first, low_bits);
    *hi = _mm256_and_si256(_mm256_srli_epi64(first, 4), low_bits);
}

/* The 64 weight codes k .. k + 63 of a weight row as w + 1 into lo and hi: held
 * (weight_codes) or, where `unpacked`, one a byte. */
ALWAYS_INLINE void weight_at(const int unpacked, const uint8_t *row, size_t k, __m256i *lo,
                             __m256i *hi) {
    if (unpacked) {
        *lo = _mm256_loadu_si256((const __m256i *)(const void *)(row + k));
        *hi = _mm256_loadu_si256((const __m256i *)(const void *)(row + k + 32));
    } else {
        weight_codes(row, k, lo, hi);
    }
}

/* ternary_unpack_fn: a held row's codes one a byte as w + 1, 64 at a time. */
static void unpack_row(const uint8_t *held, size_t K, uint8_t *bytes) {
    for (size_t k = 0; k < K; k += 64) {
        __m256i lo, hi;
        weight_codes(held, k, &lo, &hi);
        _mm256_storeu_si256((__m256i *)(void *)(bytes + k), lo);
        _mm256_storeu_si256((__m256i *)(void *)(bytes + k + 32), hi);
    }
}

/* acc + the sums of the products u s (u unsigned bytes, s signed) four by four into int32. */
ALWAYS_INLINE __m256i dot_bytes(__m256i acc, __m256i u, __m256i s) {
    return _mm256_add_epi32(acc, _mm256_madd_epi16(_mm256_maddubs_epi16(u, s),
                                                   _mm256_set1_epi16(1)));
}

/* acc + the products of two steps (u0 s0, u1 s1) summed into int32: the two vpmaddubsw added
 * in int16 (each pair at most 2 * 2 * 128, so the four at most 1024) before one vpmaddwd. */
ALWAYS_INLINE __m256i dot_bytes2(__m256i acc, __m256i u0, __m256i s0, __m256i u1, __m256i s1) {
    const __m256i pairs = _mm256_add_epi16(_mm256_maddubs_epi16(u0, s0),
                                           _mm256_maddubs_epi16(u1, s1));
    return _mm256_add_epi32(acc, _mm256_madd_epi16(pairs, _mm256_set1_epi16(1)));
}

static int32_t sum_codes(const uint8_t *x, size_t K) {
    const __m256i ones = _mm256_set1_epi8(1);
    __m256i acc = _mm256_setzero_si256();
    size_t k = 0;
    for (; k + 32 <= K; k += 32)
        acc = dot_bytes(acc, ones, _mm256_loadu_si256((const __m256i *)(const void *)(x + k)));
    int32_t rest = 0;
    for (; k < K; k++) rest += (int8_t)x[k];
    const __m128i s = _mm_add_epi32(_mm256_castsi256_si128(acc), _mm256_extracti128_si256(acc, 1));
    const __m128i t = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0x4e));
    return _mm_cvtsi128_si32(_mm_add_epi32(t, _mm_shuffle_epi32(t, 0xb1))) + rest;
}

/* Lane k of the result: the sum of the 8 int32 lanes of a[k]. */
ALWAYS_INLINE __m256i fold8(const __m256i a[8]) {
    __m256i pair[4];
#pragma GCC unroll 4
    for (int p = 0; p < 4; p++) /* per 128-bit lane: a[2p] 0+2, a[2p+1] 0+2, then 1+3 */
        pair[p] = _mm256_add_epi32(_mm256_unpacklo_epi32(a[2 * p], a[2 * p + 1]),
                                   _mm256_unpackhi_epi32(a[2 * p], a[2 * p + 1]));
    /* per 128-bit lane: a[0] .. a[3], a[4] .. a[7] */
    const __m256i q0 = _mm256_add_epi32(_mm256_unpacklo_epi64(pair[0], pair[1]),
                                        _mm256_unpackhi_epi64(pair[0], pair[1]));
    const __m256i q1 = _mm256_add_epi32(_mm256_unpacklo_epi64(pair[2], pair[3]),
                                        _mm256_unpackhi_epi64(pair[2], pair[3]));
    return _mm256_add_epi32(_mm256_permute2x128_si256(q0, q1, 0x20),
                            _mm256_permute2x128_si256(q0, q1, 0x31));
}

/* The tile's last steps (ternary_avx512.c's tile_store on 8 lanes). */
ALWAYS_INLINE void tile_store(const int R, const int C, const __m256i acc[8],
                              const quant_gemm_job *j, const ternary_block *b, size_t m,
                              size_t n, size_t cols) {
    const __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    const __m256i row = _mm256_srli_epi32(lane, C == 8 ? 3 : C == 4 ? 2 : 1);
    const __m256i sum_x = _mm256_permutevar8x32_epi32(
        _mm256_loadu_si256((const __m256i *)(const void *)(b->sum_x + m)), row);
    const __m256 divisor = _mm256_permutevar8x32_ps(_mm256_loadu_ps(b->divisor + m), row);
    const __m256 d = _mm256_cvtepi32_ps(_mm256_sub_epi32(fold8(acc), sum_x));
    const __m256 y = b->bf16_steps ? round_bf16_8(_mm256_div_ps(round_bf16_8(d), divisor))
                                   : _mm256_div_ps(d, divisor);
    for (int i = 0; i < R; i++) {
        const __m256 yi =
            _mm256_permutevar8x32_ps(y, _mm256_add_epi32(lane, _mm256_set1_epi32(i * C)));
        store_f32_n(j->y + (b->m0 + m + i) * j->ldy + n, cols, yi);
    }
}

/* The 64 codes from k of the tile's R activation rows (at x[r] + xk) and C weight rows (U:
 * unpacked) into its sums; once a line of held weight codes (256 codes), where `ahead`, the
 * weight rows' lines `ahead` bytes past the codes read asked into L1. */
ALWAYS_INLINE void tile_step(const int R, const int C, const int U, const uint8_t *const x[4],
                             size_t xk,
                             const uint8_t *const w[8], size_t k, size_t ahead, __m256i acc[8]) {
    __m256i w0[8], w1[8];
    const int fetch = ahead && k % 256 == 0;
#pragma GCC unroll 8
    for (int c = 0; c < C; c++) {
        if (fetch) _mm_prefetch((const char *)(w[c] + k / 4 + ahead), _MM_HINT_T0);
        weight_at(U, w[c], k, &w0[c], &w1[c]);
    }
#pragma GCC unroll 4
    for (int r = 0; r < R; r++) {
        const __m256i x0 = _mm256_loadu_si256((const __m256i *)(const void *)(x[r] + xk));
        const __m256i x1 = _mm256_loadu_si256((const __m256i *)(const void *)(x[r] + xk + 32));
#pragma GCC unroll 8
        for (int c = 0; c < C; c++)
            acc[r * C + c] = dot_bytes2(acc[r * C + c], w0[c], x0, w1[c], x1);
    }
}

/* A tile of R rows x C = 8 / R columns (U: its weight rows from the block's unpacked ones),
 * 64 codes a step; the last K mod 64 codes one more step, the activation rows' codes copied
 * into zeros; columns past `cols` read the first column's weights and are not stored. */
ALWAYS_INLINE void tile(const int R, const int U, const quant_gemm_job *j, const ternary_block *b,
                        size_t m, size_t n, size_t cols) {
    const int C = 8 / R;
    const size_t K = j->K;
    const uint8_t *x[4], *w[8];
    const size_t ahead = ternary_tile_rows(R, C, U, j, b, m, n, cols, x, w);
    __m256i acc[8];
#pragma GCC unroll 8
    for (int i = 0; i < 8; i++) acc[i] = _mm256_setzero_si256();
    size_t k = 0;
    for (; k + 64 <= K; k += 64) tile_step(R, C, U, x, k, w, k, ahead, acc);
    if (k < K) {
        uint8_t tail[4][64];
        const uint8_t *tails[4];
        for (int r = 0; r < R; r++) {
            memset(tail[r], 0, sizeof tail[r]);
            memcpy(tail[r], x[r] + k, K - k);
            tails[r] = tail[r];
        }
        tile_step(R, C, U, tails, 0, w, k, ahead, acc);
    }
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
 * longer ones go to the tiles. How far ahead of its reads it asks for the weight's lines, in
 * rows. */
#define ROW_MAX_K ((size_t)16384)
#define ROW_AHEAD 16

/* The activation codes of a row arranged as the held weight's 32-byte pieces read them (as
 * ternary_avx512.c's arrange_row, on two 128-bit lanes): per 128 codes (a piece: groups
 * g = 0, 1 of 64 codes in its lanes), four vectors X_q, q = 0 .. 3, whose lane g holds codes
 * 64 g + 16 q .. 64 g + 16 q + 15; 0 past K. `arranged` takes K rounded up to 128. */
static void arrange_row(const uint8_t *x, size_t K, uint8_t *arranged) {
    for (size_t s = 0; s < K; s += 128)
        for (size_t q = 0; q < 4; q++)
            for (size_t g = 0; g < 2; g++) {
                const size_t from = s + 64 * g + 16 * q;
                uint8_t *to = arranged + s + 32 * q + 16 * g;
                const size_t n = from < K ? (K - from < 16 ? K - from : 16) : 0;
                memcpy(to, x + from, n);
                memset(to + n, 0, 16 - n);
            }
}

/* The integer sum sum (w + 1) x of a weight row against the arranged activations, in a vector
 * (its 8 lanes summed later): each held piece of 32 bytes loaded once (a row's last 16 bytes
 * alone where its length is an odd number of groups: the high lane then 0, codes w + 1 = 0),
 * its field q (a shift by 2 q and a mask) the codes of X_q, fields 0, 1 and 2, 3 each into a
 * sum of its own (dot_bytes2); the line `ahead` bytes on asked for once a line. */
ALWAYS_INLINE __m256i row_sum(const uint8_t *row, size_t row_bytes, size_t ahead,
                              const uint8_t *arranged) {
    const __m256i three = _mm256_set1_epi8(3);
    __m256i acc[2] = {_mm256_setzero_si256(), _mm256_setzero_si256()};
    for (size_t b = 0; b < row_bytes; b += 32) {
        const __m256i *x = (const __m256i *)(const void *)(arranged + 4 * b);
        if (b % 64 == 0) _mm_prefetch((const char *)(row + b + ahead), _MM_HINT_T0);
        const __m256i w =
            b + 32 <= row_bytes
                ? _mm256_loadu_si256((const __m256i *)(const void *)(row + b))
                : _mm256_zextsi128_si256(_mm_loadu_si128((const __m128i *)(const void *)(row + b)));
        const __m256i w2 = _mm256_srli_epi64(w, 2);
        acc[0] = dot_bytes2(acc[0], _mm256_and_si256(w, three), _mm256_loadu_si256(x),
                            _mm256_and_si256(w2, three), _mm256_loadu_si256(x + 1));
        acc[1] = dot_bytes2(acc[1], _mm256_and_si256(_mm256_srli_epi64(w, 4), three),
                            _mm256_loadu_si256(x + 2),
                            _mm256_and_si256(_mm256_srli_epi64(w2, 4), three),
                            _mm256_loadu_si256(x + 3));
    }
    return _mm256_add_epi32(acc[0], acc[1]);
}

/* The columns [n0, n1) of a job of one activation row (M = 1, K <= ROW_MAX_K): the weight rows
 * read one after the other in address order, each row's sum kept in a vector until 8 rows are
 * there, folded (fold8) and finished as the tiles finish theirs (tile_store, one row of 8
 * columns); ternary_avx512.c's gemm_row on 8 lanes. */
static void gemm_row(const quant_gemm_job *j, size_t n0, size_t n1) {
    const size_t K = j->K, row_bytes = j->w_row_bytes;
    _Alignas(32) uint8_t arranged[ROW_MAX_K];
    arrange_row(j->xq, K, arranged);
    ternary_block b;
    ternary_row_block(j, sum_codes, &b);
    const size_t ahead = ROW_AHEAD * row_bytes;
    for (size_t n = n0; n < n1; n += 8) {
        const size_t cols = n1 - n < 8 ? n1 - n : 8;
        __m256i sums[8];
        for (size_t c = 0; c < 8; c++) /* past the last column: the last again, not stored */
            sums[c] = row_sum(j->wq + (n + (c < cols ? c : cols - 1)) * row_bytes, row_bytes,
                              ahead, arranged);
        tile_store(1, 8, sums, j, &b, 0, n, cols);
    }
}

void ternary_gemm_avx2(const quant_gemm_job *j, size_t n0, size_t n1) {
    if (j->M == 1 && j->K <= ROW_MAX_K)
        gemm_row(j, n0, n1);
    else
        ternary_gemm_loop(j, n0, n1, 8, sum_codes, tiles, unpack_row);
}

/* ---- the activation quantizer -------------------------------------------------------------- */

/* max |x| over a row (|round_bf16(x)| where `bf16`), a NaN passed over. */
static float row_amax(const float *x, size_t n, int bf16) {
    const __m256 magnitude = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
    __m256 acc = _mm256_setzero_ps();
    for (size_t i = 0; i < n; i += 8) {
        __m256 v = load_f32_n(x + i, n - i < 8 ? n - i : 8);
        if (bf16) v = round_bf16_8(v);
        /* vmaxps returns its second operand when either is NaN: the NaN lane is passed over */
        acc = _mm256_max_ps(_mm256_and_ps(v, magnitude), acc);
    }
    __m128 a = _mm_max_ps(_mm256_castps256_ps128(acc), _mm256_extractf128_ps(acc, 1));
    a = _mm_max_ps(a, _mm_movehl_ps(a, a));
    return _mm_cvtss_f32(_mm_max_ss(a, _mm_movehdup_ps(a)));
}

/* The codes of 8 values (the first n) at x under scale s, stored at codes; `half_up`:
 * onebitllms' rounding, floor(v + 0.5). */
ALWAYS_INLINE void codes8(int half_up, int bf16, const float *x, float s, size_t n,
                          uint8_t *codes) {
    const __m256 scale = _mm256_set1_ps(s);
    __m256 v = load_f32_n(x, n);
    v = bf16 ? round_bf16_8(_mm256_mul_ps(round_bf16_8(v), scale)) : _mm256_mul_ps(v, scale);
    if (half_up)
        v = _mm256_round_ps(_mm256_add_ps(v, _mm256_set1_ps(0.5f)),
                            _MM_FROUND_TO_NEG_INF | _MM_FROUND_NO_EXC);
    else
        v = _mm256_round_ps(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    /* vminps / vmaxps return their second operand, v, when it is NaN */
    v = _mm256_max_ps(_mm256_set1_ps(-128.0f), _mm256_min_ps(_mm256_set1_ps(127.0f), v));
    /* the low byte of each int32, lanes 0..3 then 4..7 */
    const __m256i low = _mm256_shuffle_epi8(_mm256_cvttps_epi32(v), _mm256_set1_epi32(0x0c080400));
    const __m128i bytes = _mm_unpacklo_epi32(_mm256_castsi256_si128(low),
                                             _mm256_extracti128_si256(low, 1));
    if (n == 8) {
        _mm_storel_epi64((__m128i *)(void *)codes, bytes);
    } else {
        uint8_t out[16];
        _mm_storeu_si128((__m128i *)(void *)out, bytes);
        memcpy(codes, out, n);
    }
}

/* ternary_codes_fn: a row's codes, 8 at a time. */
static void row_codes(int half_up, int bf16, const float *x, size_t n, float s, uint8_t *codes) {
    for (size_t c = 0; c < n; c += 8)
        codes8(half_up, bf16, x + c, s, n - c < 8 ? n - c : 8, codes + c);
}

void ternary_quantize_rows_avx2(const quant_rule *r, size_t rows, size_t cols, const float *x,
                                size_t x_stride, uint8_t *codes, size_t codes_stride,
                                float *block_scales, float *row_scales) {
    (void)block_scales;
    ternary_rows_loop(r, rows, cols, x, x_stride, codes, codes_stride, row_scales, row_amax,
                      row_codes);
}
