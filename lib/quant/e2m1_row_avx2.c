/*
 * The E2M1 formats' GEMM of one activation row (M = 1, decoding at batch 1) on AVX2, bit for
 * bit dot.c's quant_gemm_blocked on E2M1 codes (NVFP4 blocks of 16, MXFP4 blocks of 32): the
 * entry e2m1_row_gemm_avx2, which takes a job of one row whose K fits its stack
 * (E2M1_ROW_MAX_K) and gives any other to e2m1_gemm_avx2 (e2m1_lanes.h). It is
 * e2m1_row_avx512.c's kernel on 8 lanes (that file's header says why the rows are read whole,
 * in address order, and the block dots transposed after the integer work):
 *
 * Once per call, the activation row's codes become their k_a (k = 2 x value, |k| <= 12, signed
 * bytes) arranged per chunk of 64 codes as the chunk's 32 held weight bytes pair with them: 32
 * bytes of the even codes (byte i: code 2 i, the low nibble of weight byte i), then 32 of the
 * odd ones; 0 past K. With them, per chunk, the vector its dots start from: each block's
 * correction -12 sum(k_a) in the block's first lane.
 *
 * Per weight row and chunk: the 32 bytes loaded once (the row's last chunk through a copy
 * padded with code 0, whose k_a partner is 0), the nibbles mapped to k_w + 12 (unsigned bytes,
 * 0 .. 24, vpshufb), then vpmaddubsw against the even and odd k_a (each int16 at most 2 x 24 x
 * 12), the two summed in int16 and pairs of those by vpmaddwd: dword lane i sums codes 8 i ..
 * 8 i + 7 (a block of 16 codes is two lanes, one of 32 four), plus the start. Those vectors of
 * 8 columns are kept, then per chunk their lanes are summed by block and transposed
 * (block_dots) so that a vector holds one block of the 8 columns, a column a lane: S = sum k_w
 * k_a, the block's exact dot in units of 1/4. Then dot.c's fp32 chain in the lanes, the blocks
 * ascending: acc = acc + (S * (a_s / 4)) * w_s, or its fused forms where e2m1_row.h's checks
 * allow them; last, NVFP4's acc * (s2a * s2w). The scale bytes become their fp32 values as
 * codecs.h's e4m3_to_f32 and e8m0_to_f32 give them (e2m1_row_avx512.c's scale_values says how).
 */
#include <immintrin.h>
#include <string.h>

#include "dot.h"
#include "e2m1_row.h"
#include "e2m1_simd.h"

#include "kernels/kernels_x86.h"

/* The chunks of 64 codes whose block dots are kept at once (8 columns of each: 12 KB). */
enum { SEGMENT_CHUNKS = 48 };

/* The activation row's k_a arranged per chunk (the header), K rounded up to 64 bytes of them
 * into `arranged`; per chunk, the vector its block dots start from (8 dwords into `start`):
 * -12 sum(k_a) of each block of bc codes in the block's first lane (lane 2 h for the block of
 * codes 16 h .. 16 h + 15, lane 4 h for that of 32 h .. 32 h + 31), 0 elsewhere. */
static void arrange_row(const uint8_t *x, size_t K, size_t bc, int8_t *arranged,
                        int32_t *start) {
    static const int8_t k_values[16] = {E2M1_K_SIGNED};
    const size_t chunks = (K + 63) / 64;
    memset(arranged, 0, chunks * 64);
    for (size_t k = 0; k < K; k++)
        arranged[k / 64 * 64 + k % 2 * 32 + k % 64 / 2] = k_values[x[k] & 0xf];
    memset(start, 0, chunks * 8 * sizeof *start);
    for (size_t k0 = 0; k0 < K; k0 += bc) {
        int32_t sum = 0;
        for (size_t k = k0; k < K && k < k0 + bc; k++) sum += k_values[x[k] & 0xf];
        start[k0 / 8] = -E2M1_K_BIAS * sum; /* chunk k0 / 64, lane k0 % 64 / 8 */
    }
}

/* Chunk k of a column: its 32 weight bytes (whole: all of them in the row, else through a
 * copy padded with 0), dotted with the chunk's k_a from its start; and its blocks' per scale
 * bytes (0 past the row's nb, not read) staged at `stage` (a dword), loaded as a vector by
 * the fold long after (e2m1_row_avx512.c's read_chunk says why). */
ALWAYS_INLINE __m256i read_chunk(const uint8_t *row, size_t row_bytes, const uint8_t *scale_row,
                                 size_t nb, size_t k, const int whole, const int per,
                                 const int8_t *arranged, const int32_t *start,
                                 __m256i k_unsigned, uint32_t *stage) {
    const size_t at = 32 * k, kb0 = k * (size_t)per;
    const __m256i nibble = _mm256_set1_epi8(0x0f);
    __m256i w;
    uint32_t scales = 0;
    if (whole) {
        memcpy(&scales, scale_row + kb0, (size_t)per);
        w = _mm256_loadu_si256((const __m256i *)(const void *)(row + at));
    } else {
        const size_t n = nb - kb0 < (size_t)per ? nb - kb0 : (size_t)per;
        for (size_t b = 0; b < n; b++) scales |= (uint32_t)scale_row[kb0 + b] << (8 * b);
        uint8_t tail[32] = {0};
        memcpy(tail, row + at, row_bytes - at < 32 ? row_bytes - at : 32);
        w = _mm256_loadu_si256((const __m256i *)(const void *)tail);
    }
    *stage = scales;
    const __m256i low = _mm256_shuffle_epi8(k_unsigned, _mm256_and_si256(w, nibble));
    const __m256i high =
        _mm256_shuffle_epi8(k_unsigned, _mm256_and_si256(_mm256_srli_epi16(w, 4), nibble));
    const __m256i *x = (const __m256i *)(const void *)(arranged + 2 * at);
    const __m256i pairs = _mm256_add_epi16(_mm256_maddubs_epi16(low, _mm256_load_si256(x)),
                                           _mm256_maddubs_epi16(high, _mm256_load_si256(x + 1)));
    return _mm256_add_epi32(_mm256_load_si256((const __m256i *)(const void *)(start + 8 * k)),
                            _mm256_madd_epi16(pairs, _mm256_set1_epi16(1)));
}

/* Dwords e and e + 2 of each 128-bit lane of a, then those of b. */
static inline __m256i pick_blocks(__m256i a, __m256i b, const int e) {
    const __m256 x = _mm256_castsi256_ps(a), y = _mm256_castsi256_ps(b);
    return _mm256_castps_si256(e ? _mm256_shuffle_ps(x, y, 0xdd) : _mm256_shuffle_ps(x, y, 0x88));
}

/* From the chunk vectors of 8 columns (v[c]: column c, lane i codes 8 i .. 8 i + 7), the
 * chunk's block sums a vector a block, lane c column c: 4 blocks of 16 codes (quads = 0) or 2
 * of 32 (quads = 1), as e2m1_row_avx512.c's block_dots (every sum fits int16): per 128-bit
 * lane L, pairs of columns narrowed and summed in pairs (blocks 2 L, 2 L + 1 of columns 2 p,
 * 2 p + 1), then for 32 codes pairs of those again (block L of columns 4 g .. 4 g + 3), for 16
 * a shuffle of dwords (block 2 L + e of columns 4 g .. 4 g + 3); then the 128-bit halves
 * exchanged. */
static inline void block_dots(const __m256i v[8], const int quads, __m256i out[4]) {
    const __m256i ones = _mm256_set1_epi16(1);
    __m256i pair[4];
#pragma GCC unroll 4
    for (int p = 0; p < 4; p++)
        pair[p] = _mm256_madd_epi16(_mm256_packs_epi32(v[2 * p], v[2 * p + 1]), ones);
    if (quads) {
        const __m256i q0 = _mm256_madd_epi16(_mm256_packs_epi32(pair[0], pair[1]), ones);
        const __m256i q1 = _mm256_madd_epi16(_mm256_packs_epi32(pair[2], pair[3]), ones);
        out[0] = _mm256_permute2x128_si256(q0, q1, 0x20);
        out[1] = _mm256_permute2x128_si256(q0, q1, 0x31);
        return;
    }
#pragma GCC unroll 2
    for (int e = 0; e < 2; e++) {
        const __m256i q0 = pick_blocks(pair[0], pair[1], e), q1 = pick_blocks(pair[2], pair[3], e);
        out[e] = _mm256_permute2x128_si256(q0, q1, 0x20);
        out[2 + e] = _mm256_permute2x128_si256(q0, q1, 0x31);
    }
}

/* The fp32 values of byte i of each dword lane of v, bit for bit e4m3_to_f32 (e4m3) or
 * e8m0_to_f32 of them; `plain`: no E4M3 byte has its sign or is a NaN code (the bytes below
 * 0x7f), then the byte's 7 bits moved to bits 20 .. 26 times 2^120 is the value. */
static inline __m256 scale_values(__m256i v, const int i, int e4m3, int plain) {
    const __m256i b = _mm256_and_si256(_mm256_srli_epi32(v, 8 * i), _mm256_set1_epi32(0xff));
    if (!e4m3) {
        const __m256i zero = _mm256_cmpeq_epi32(b, _mm256_setzero_si256());
        return _mm256_castsi256_ps(_mm256_or_si256(
            _mm256_slli_epi32(b, 23), _mm256_and_si256(zero, _mm256_set1_epi32(0x400000))));
    }
    const __m256i magnitude = _mm256_and_si256(b, _mm256_set1_epi32(0x7f));
    const __m256 value = _mm256_mul_ps(_mm256_castsi256_ps(_mm256_slli_epi32(magnitude, 20)),
                                       _mm256_set1_ps(0x1p120f));
    if (plain) return value;
    const __m256i sign = _mm256_slli_epi32(_mm256_and_si256(b, _mm256_set1_epi32(0x80)), 24);
    const __m256i nan = _mm256_cmpeq_epi32(magnitude, _mm256_set1_epi32(0x7f));
    const __m256i bits = _mm256_or_si256(_mm256_castps_si256(value), sign);
    return _mm256_castsi256_ps(_mm256_blendv_epi8(
        bits, _mm256_or_si256(sign, _mm256_set1_epi32(0x7fc00000)), nan));
}

/* The columns [n0, n1) of a job of one row under blocks of bc = 16 (NVFP4) or 32 (MXFP4). */
ALWAYS_INLINE void row_columns(const quant_gemm_job *j, size_t n0, size_t n1, const int bc) {
    const size_t K = j->K, nb = j->nblocks, grid = j->w_grid_cols, row_bytes = j->w_row_bytes;
    const size_t chunks = (K + 63) / 64;
    const int per = 64 / bc; /* blocks a chunk */
    const int e4m3 = bc == 16;
    _Alignas(32) int8_t arranged[E2M1_ROW_MAX_K];
    _Alignas(32) int32_t start[E2M1_ROW_MAX_K / 8];
    float a_quarter[E2M1_ROW_MAX_K / 16];
    arrange_row(j->xq, K, (size_t)bc, arranged, start);
    for (size_t b = 0; b < nb; b++) a_quarter[b] = j->xs[b] * 0.25f;
    const int fusable = e4m3 && nvfp4_row_fusable(j->xs, nb);
    int least = 0, most = 0;
    int32_t exponent_add[E2M1_ROW_MAX_K / 32];
    const int adds = !e4m3 && mxfp4_row_bounds(j->xs, nb, &least, &most);
    if (adds) mxfp4_exponent_adds(a_quarter, nb, exponent_add);
    const __m256i k_unsigned = _mm256_setr_epi8(E2M1_K_UNSIGNED, E2M1_K_UNSIGNED);
    __m256i kept[SEGMENT_CHUNKS * 8];
    _Alignas(32) uint32_t staged[SEGMENT_CHUNKS * 8]; /* the chunks' scale bytes (read_chunk) */
    const size_t whole_chunks =
        row_bytes / 32 < nb / (size_t)per ? row_bytes / 32 : nb / (size_t)per;
    for (size_t n = n0; n < n1; n += 8) {
        const size_t cols = n1 - n < 8 ? n1 - n : 8;
        __m256 acc = _mm256_setzero_ps();
        for (size_t s0 = 0; s0 < chunks; s0 += SEGMENT_CHUNKS) {
            const size_t s1 = chunks - s0 < SEGMENT_CHUNKS ? chunks : s0 + SEGMENT_CHUNKS;
            /* the next unit's lines (e2m1_row.h): the next segment's 32 bytes a chunk of
             * these rows, else the first segment of the next 8 rows */
            ahead_lines next = {j->wq + n * row_bytes, cols, row_bytes, 32 * s1, 32 * s1,
                                32 * (chunks - s1 < SEGMENT_CHUNKS ? chunks : s1 + SEGMENT_CHUNKS)};
            if (s1 == chunks) {
                next.row += 8 * row_bytes;
                next.rows = n1 - n > 8 ? (n1 - n - 8 < 8 ? n1 - n - 8 : 8) : 0;
                next.at = next.from = 0;
                next.to = 32 * (chunks < SEGMENT_CHUNKS ? chunks : SEGMENT_CHUNKS);
            }
            for (size_t c = 0; c < cols; c++) {
                const uint8_t *row = j->wq + (n + c) * row_bytes;
                const uint8_t *scale_row = j->ws_codes + (n + c) * grid;
                /* half of a row's share of the next unit's lines (of 64 bytes, two chunks) now,
                 * the other half in the fold (two lines a chunk); the scales of the column's
                 * segment and of the column 8 on */
                for (size_t l = 0; l < (s1 - s0 + 3) / 4; l++) ask_next_line(&next);
                for (size_t at = s0 * (size_t)per; at < s1 * (size_t)per; at += 64) {
                    _mm_prefetch((const char *)(scale_row + at), _MM_HINT_T0);
                    _mm_prefetch((const char *)(scale_row + 8 * grid + at), _MM_HINT_T0);
                }
                const size_t whole = s1 < whole_chunks ? s1 : whole_chunks;
                for (size_t k = s0; k < whole; k++)
                    kept[(k - s0) * 8 + c] =
                        read_chunk(row, row_bytes, scale_row, nb, k, 1, per, arranged, start,
                                   k_unsigned, staged + (k - s0) * 8 + c);
                for (size_t k = whole > s0 ? whole : s0; k < s1; k++) /* the row's last */
                    kept[(k - s0) * 8 + c] =
                        read_chunk(row, row_bytes, scale_row, nb, k, 0, per, arranged, start,
                                   k_unsigned, staged + (k - s0) * 8 + c);
            }
            for (size_t k = s0; k < s1; k++) {
                __m256i *v = kept + (k - s0) * 8;
                uint32_t *chunk_scales = staged + (k - s0) * 8;
                ask_next_line(&next);
                ask_next_line(&next);
                for (size_t c = cols; c < 8; c++) { /* past the last column: the first again */
                    v[c] = v[0];
                    chunk_scales[c] = chunk_scales[0];
                }
                __m256i dots[4];
                block_dots(v, bc == 32, dots);
                const __m256i bytes =
                    _mm256_load_si256((const __m256i *)(const void *)chunk_scales);
                const size_t kb0 = k * (size_t)per;
                const int n_blocks = nb - kb0 < (size_t)per ? (int)(nb - kb0) : per;
                /* the bytes' top bits: no sign and no NaN code (E4M3: all below 0x7f); no NaN
                 * code (no magnitude 0x7f); E8M0: all within the exponent add's bounds */
                const __m256i over_7e = _mm256_cmpeq_epi8(
                    _mm256_max_epu8(bytes, _mm256_set1_epi8(0x7f)), bytes);
                const int plain = e4m3 && _mm256_testz_si256(over_7e, over_7e);
                const __m256i magnitude = _mm256_and_si256(bytes, _mm256_set1_epi8(0x7f));
                const int any_nan =
                    e4m3 && !plain &&
                    !_mm256_testz_si256(_mm256_cmpeq_epi8(magnitude, _mm256_set1_epi8(0x7f)),
                                        _mm256_set1_epi8(-1));
                if (adds && n_blocks == per) {
                    const __m256i below = _mm256_cmpeq_epi8(
                        _mm256_min_epu8(bytes, _mm256_set1_epi8((char)(least - 1))), bytes);
                    const __m256i above = _mm256_cmpeq_epi8(
                        _mm256_max_epu8(bytes, _mm256_set1_epi8((char)(most + 1))), bytes);
                    const __m256i outside = _mm256_or_si256(below, above);
                    /* only bytes 0 and 1 of each dword are scales (2 blocks a chunk) */
                    if (_mm256_testz_si256(outside, _mm256_set1_epi32(0xffff))) {
#pragma GCC unroll 2
                        for (int b = 0; b < 2; b++) {
                            const __m256i field =
                                _mm256_and_si256(_mm256_slli_epi32(bytes, 23 - 8 * b),
                                                 _mm256_set1_epi32(0x7f800000));
                            const __m256i product = _mm256_add_epi32(
                                field, _mm256_set1_epi32(exponent_add[kb0 + b]));
                            acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dots[b]),
                                                  _mm256_castsi256_ps(product), acc);
                        }
                        continue;
                    }
                }
                const int fuse = fusable && !any_nan;
#pragma GCC unroll 4
                for (int b = 0; b < per; b++) {
                    if (b >= n_blocks) break;
                    const __m256 w_scale = scale_values(bytes, b, e4m3, plain);
                    const __m256 d = _mm256_cvtepi32_ps(dots[b]);
                    const __m256 a = _mm256_set1_ps(a_quarter[kb0 + b]);
                    if (fuse) /* fma(S, a_s (w_s / 4), acc): nvfp4_row_fusable says why */
                        acc = _mm256_fmadd_ps(d, _mm256_mul_ps(w_scale, a), acc);
                    else
                        acc = _mm256_add_ps(acc, _mm256_mul_ps(_mm256_mul_ps(d, a), w_scale));
                }
            }
        }
        if (j->rule->format->has_tensor_scale)
            acc = _mm256_mul_ps(acc, _mm256_set1_ps(j->xt[0] * j->w_tensor_scale));
        float out[8];
        _mm256_storeu_ps(out, acc);
        memcpy(j->y + n, out, cols * sizeof *out);
    }
}

void e2m1_row_gemm_avx2(const quant_gemm_job *j, size_t n0, size_t n1) {
    if (j->M != 1 || j->K > E2M1_ROW_MAX_K)
        e2m1_gemm_avx2(j, n0, n1);
    else if (j->bc == 16)
        row_columns(j, n0, n1, 16);
    else
        row_columns(j, n0, n1, 32);
}
