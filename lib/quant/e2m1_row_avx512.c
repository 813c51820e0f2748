/*
 * The E2M1 formats' GEMM of one activation row (M = 1, decoding at batch 1) on AVX-512, bit for
 * bit dot.c's quant_gemm_blocked on E2M1 codes (NVFP4 blocks of 16, MXFP4 blocks of 32): the
 * entries e2m1_row_gemm_avx512 and (compiled a second time with E2M1_VNNI defined and
 * -mavx512vnni) e2m1_row_gemm_avx512vnni, which take a job of one row whose K fits their stack
 * (E2M1_ROW_MAX_K) and give any other to e2m1_gemm_avx512 / _avx512vnni (e2m1_lanes.h).
 *
 * The tiles of e2m1_lanes.h transpose 16 weight rows a chunk at a time, which at M = 1 costs
 * more instructions than the row's bytes take to arrive, and read 16 rows of a few lines each
 * at once, which the hardware's prefetchers lose. Here the weight rows are read whole, one
 * after the other, in address order (the next unit's lines asked for through both of the
 * current unit's phases: ahead_lines), and the transposition is of the block dots, after the
 * integer work:
 *
 * Once per call, the activation row's codes become their k_a (k = 2 x value, |k| <= 12, signed
 * bytes) arranged per chunk of 128 codes as the chunk's 64 held weight bytes pair with them:
 * 64 bytes of the even codes (byte i: code 2 i, the low nibble of weight byte i), then 64 of the
 * odd ones (the high nibbles); 0 past K. With them, per chunk, the vector its dots start from:
 * each block's correction -12 sum(k_a) in the block's first lane.
 *
 * Per weight row and chunk: the 64 bytes loaded once (masked at the row's end; a byte past it
 * is code 0, whose k_a partner is 0), the nibbles mapped to k_w + 12 (unsigned bytes, 0 .. 24,
 * vpshufb), then two vpdpbusd (or vpmaddubsw pairs summed in int16, at most 2 x 2 x 24 x 12,
 * then vpmaddwd) against the even and odd k_a: dword lane i sums codes 8 i .. 8 i + 7, so a
 * block of 16 codes is two lanes and one of 32 four. Those vectors of 16 columns are kept, then
 * per chunk their lanes are summed by block and transposed (block_dots) so that a vector holds
 * one block of the 16 columns, a column a lane: the correction plus sum (k_w + 12) k_a is
 * S = sum k_w k_a, the block's exact dot in units of 1/4 (at most 32 x 144 in magnitude, every
 * partial sum at most 32 x 24 x 12 + 12 x 32 x 12: no sum overflows, and every sum of integers
 * is exact in any order). Then dot.c's fp32 chain in
 * the lanes, the blocks ascending, as e2m1_lanes.h writes it (its header says why it is
 * acc + (d * a_s) * w_s): acc = acc + (S * (a_s / 4)) * w_s; last, NVFP4's acc * (s2a * s2w).
 * The weight's scale bytes become their fp32 values as codecs.h's e4m3_to_f32 and
 * e8m0_to_f32 give them (scale_values: an E4M3 byte's 7 bits moved to bits 20 .. 26 are the
 * fp32 of its value times 2^-120, exact through subnormals, which MXCSR does not flush here;
 * its NaN codes the quiet NaN of their sign; E8M0's exponent field, 2^-127 for byte 0; where
 * no byte of a chunk is an E4M3 NaN code, scale_values_at moves each byte's bits into place
 * straight from the dword holding it).
 */
#include <immintrin.h>
#include <string.h>

#include "dot.h"
#include "e2m1_row.h"
#include "e2m1_simd.h"

#include "kernels/kernels_x86.h"

#if defined(E2M1_VNNI)
#define E2M1_ROW_GEMM e2m1_row_gemm_avx512vnni
#define E2M1_TILES_GEMM e2m1_gemm_avx512vnni
#else
#define E2M1_ROW_GEMM e2m1_row_gemm_avx512
#define E2M1_TILES_GEMM e2m1_gemm_avx512
#endif

/* The chunks of 128 codes whose block dots are kept at once (16 columns of each: 24 KB). */
enum { SEGMENT_CHUNKS = 24 };

/* The mask of the first n of 64 bytes (n <= 64). */
static inline __mmask64 byte_mask(size_t n) { return n >= 64 ? ~0ull : (1ull << n) - 1; }

/* The activation row's k_a arranged per chunk (the header), K rounded up to 128 bytes of them
 * into `arranged`; per chunk, the vector its block dots start from (16 dwords into `start`):
 * -12 sum(k_a) of each block of bc codes in the block's first lane (lane 2 h for the block of
 * codes 16 h .. 16 h + 15, lane 4 h for that of 32 h .. 32 h + 31), 0 elsewhere. */
static void arrange_row(const uint8_t *x, size_t K, size_t bc, int8_t *arranged,
                        int32_t *start) {
    const __m512i k_of = _mm512_broadcast_i32x4(_mm_setr_epi8(E2M1_K_SIGNED));
    /* per 128-bit lane: the even bytes to its low half, the odd ones to its high half */
    const __m512i deal = _mm512_broadcast_i32x4(
        _mm_setr_epi8(0, 2, 4, 6, 8, 10, 12, 14, 1, 3, 5, 7, 9, 11, 13, 15));
    const __m512i even = _mm512_setr_epi64(0, 2, 4, 6, 8, 10, 12, 14);
    const __m512i odd = _mm512_setr_epi64(1, 3, 5, 7, 9, 11, 13, 15);
    for (size_t s = 0; s < K; s += 128) {
        const __m512i v0 = _mm512_maskz_loadu_epi8(byte_mask(K - s), x + s);
        const __m512i v1 =
            _mm512_maskz_loadu_epi8(s + 64 < K ? byte_mask(K - s - 64) : 0, x + s + 64);
        const __m512i d0 = _mm512_shuffle_epi8(_mm512_shuffle_epi8(k_of, v0), deal);
        const __m512i d1 = _mm512_shuffle_epi8(_mm512_shuffle_epi8(k_of, v1), deal);
        _mm512_storeu_si512(arranged + s, _mm512_permutex2var_epi64(d0, even, d1));
        _mm512_storeu_si512(arranged + s + 64, _mm512_permutex2var_epi64(d0, odd, d1));
    }
    static const int8_t k_values[16] = {E2M1_K_SIGNED};
    memset(start, 0, (K + 127) / 128 * 16 * sizeof *start);
    for (size_t k0 = 0; k0 < K; k0 += bc) {
        int32_t sum = 0;
        for (size_t k = k0; k < K && k < k0 + bc; k++) sum += k_values[x[k] & 0xf];
        start[k0 / 8] = -E2M1_K_BIAS * sum; /* chunk k0 / 128, lane k0 % 128 / 8 */
    }
}

/* Per dword lane i, start + sum (k_w + 12) k_a over codes 8 i .. 8 i + 7 of a chunk: u0, u1
 * the unsigned k_w + 12 of the low and high nibbles, s0, s1 the even and odd k_a. */
static inline __m512i chunk_dot(__m512i start, __m512i u0, __m512i s0, __m512i u1, __m512i s1) {
#if defined(E2M1_VNNI)
    return _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(start, u0, s0), u1, s1);
#else
    const __m512i pairs =
        _mm512_add_epi16(_mm512_maddubs_epi16(u0, s0), _mm512_maddubs_epi16(u1, s1));
    return _mm512_add_epi32(start, _mm512_madd_epi16(pairs, _mm512_set1_epi16(1)));
#endif
}

/* The 4 x 4 transpose of the 128-bit lanes of q: t[L] holds lane L of q[0], q[1], q[2], q[3]
 * in its lanes 0 .. 3. */
static inline void transpose_lanes(const __m512i q[4], __m512i t[4]) {
    const __m512i a0 = _mm512_shuffle_i64x2(q[0], q[1], 0x44);
    const __m512i a1 = _mm512_shuffle_i64x2(q[0], q[1], 0xee);
    const __m512i b0 = _mm512_shuffle_i64x2(q[2], q[3], 0x44);
    const __m512i b1 = _mm512_shuffle_i64x2(q[2], q[3], 0xee);
    t[0] = _mm512_shuffle_i64x2(a0, b0, 0x88);
    t[1] = _mm512_shuffle_i64x2(a0, b0, 0xdd);
    t[2] = _mm512_shuffle_i64x2(a1, b1, 0x88);
    t[3] = _mm512_shuffle_i64x2(a1, b1, 0xdd);
}

/* From the chunk vectors of 16 columns (v[c]: column c, lane i codes 8 i .. 8 i + 7), the
 * chunk's block sums a vector a block, lane c column c: 8 blocks of 16 codes (quads = 0) or 4
 * of 32 (quads = 1). Every lane and every sum of two or four of them fits int16 (at most
 * 12 x 32 x 12 from a block's start plus 16 x 24 x 12: 9216), so each pair of columns' lanes
 * is narrowed to int16 (vpackssdw, which then saturates nothing) and summed in pairs
 * (vpmaddwd by 1): per 128-bit lane L, dwords (block 2 L, 2 L + 1 of column 2 p, the same of
 * column 2 p + 1) for 16 codes a block. For 32 codes the pairs of those vectors again: dword
 * j of lane L is block L of column 4 g + j; for 16, a shuffle of dwords per pair of them puts
 * block 2 L + e of columns 4 g .. 4 g + 3 in lane L. Then the 128-bit lanes transposed. */
static inline void block_dots(const __m512i v[16], const int quads, __m512i out[8]) {
    const __m512i ones = _mm512_set1_epi16(1);
    __m512i pair[8];
#pragma GCC unroll 8
    for (int p = 0; p < 8; p++)
        pair[p] = _mm512_madd_epi16(_mm512_packs_epi32(v[2 * p], v[2 * p + 1]), ones);
    __m512i q[4], t[4];
    if (quads) {
#pragma GCC unroll 4
        for (int g = 0; g < 4; g++)
            q[g] = _mm512_madd_epi16(_mm512_packs_epi32(pair[2 * g], pair[2 * g + 1]), ones);
        transpose_lanes(q, out);
        return;
    }
#pragma GCC unroll 2
    for (int e = 0; e < 2; e++) {
#pragma GCC unroll 4
        for (int g = 0; g < 4; g++) {
            const __m512 x = _mm512_castsi512_ps(pair[2 * g]);
            const __m512 y = _mm512_castsi512_ps(pair[2 * g + 1]);
            q[g] = _mm512_castps_si512(e ? _mm512_shuffle_ps(x, y, 0xdd)
                                         : _mm512_shuffle_ps(x, y, 0x88));
        }
        transpose_lanes(q, t);
#pragma GCC unroll 4
        for (int L = 0; L < 4; L++) out[2 * L + e] = t[L];
    }
}

/* The fp32 values of scale bytes (one a dword lane), bit for bit e4m3_to_f32 (e4m3) or
 * e8m0_to_f32 of them (the header says how). */
static inline __m512 scale_values(__m512i b, int e4m3) {
    if (!e4m3) {
        const __m512i bits = _mm512_slli_epi32(b, 23);
        const __mmask16 zero = _mm512_cmpeq_epi32_mask(b, _mm512_setzero_si512());
        return _mm512_castsi512_ps(
            _mm512_mask_or_epi32(bits, zero, bits, _mm512_set1_epi32(0x400000)));
    }
    const __m512i magnitude = _mm512_and_si512(b, _mm512_set1_epi32(0x7f));
    const __m512i sign = _mm512_slli_epi32(b, 24); /* bit 31: the byte's sign */
    const __m512 value = _mm512_mul_ps(_mm512_castsi512_ps(_mm512_slli_epi32(magnitude, 20)),
                                       _mm512_set1_ps(0x1p120f));
    const __m512i top = _mm512_set1_epi32((int32_t)0x80000000u);
    /* value | (sign & top), and for the NaN codes (sign & top) | 0x7fc00000 */
    const __m512i bits = _mm512_ternarylogic_epi32(_mm512_castps_si512(value), sign, top, 0xf8);
    const __m512i nan = _mm512_ternarylogic_epi32(sign, top, _mm512_set1_epi32(0x7fc00000), 0xea);
    const __mmask16 is_nan = _mm512_cmpeq_epi32_mask(magnitude, _mm512_set1_epi32(0x7f));
    return _mm512_castsi512_ps(_mm512_mask_mov_epi32(bits, is_nan, nan));
}

/* scale_values of byte i (0 .. 3) of each dword lane of v, where no E4M3 byte of v is a NaN
 * code: the byte's bits moved straight to their places (E4M3: magnitude to bits 20 .. 26 and
 * sign to bit 31; E8M0: to bits 23 .. 30), the rest as scale_values. */
static inline __m512 scale_values_at(__m512i v, const int i, int e4m3) {
    if (!e4m3) {
        const __m512i field = i == 3 ? _mm512_srli_epi32(v, 1) : _mm512_slli_epi32(v, 23 - 8 * i);
        const __m512i bits = _mm512_and_si512(field, _mm512_set1_epi32(0x7f800000));
        const __mmask16 zero = _mm512_cmpeq_epi32_mask(bits, _mm512_setzero_si512());
        return _mm512_castsi512_ps(
            _mm512_mask_or_epi32(bits, zero, bits, _mm512_set1_epi32(0x400000)));
    }
    const __m512i field = i == 3 ? _mm512_srli_epi32(v, 4) : _mm512_slli_epi32(v, 20 - 8 * i);
    const __m512i sign = i == 3 ? v : _mm512_slli_epi32(v, 24 - 8 * i); /* bit 31: its sign */
    const __m512 value =
        _mm512_mul_ps(_mm512_castsi512_ps(_mm512_and_si512(field, _mm512_set1_epi32(0x07f00000))),
                      _mm512_set1_ps(0x1p120f));
    return _mm512_castsi512_ps(_mm512_ternarylogic_epi32(
        _mm512_castps_si512(value), sign, _mm512_set1_epi32((int32_t)0x80000000u), 0xf8));
}

/* Chunk k of a column: its 64 weight bytes (whole: all of them in the row, else masked at the
 * row's end; a byte past it is code 0, whose k_a partner is 0), the nibbles mapped to k_w + 12
 * and dotted with the even and odd k_a from the chunk's start (chunk_dot); and its blocks'
 * per scale bytes (0 past the row's nb, not read) staged in memory at `stage`, to be loaded
 * as vectors by the fold long after these stores (chunk_scale_bytes): loaded right after
 * them, they waited on the stores' forwarding (a quarter of a call's time; a gather costs
 * about as much on Zen 4). */
ALWAYS_INLINE __m512i read_chunk(const uint8_t *row, size_t row_bytes, const uint8_t *scale_row,
                                 size_t nb, size_t k, const int whole, const int per,
                                 const int8_t *arranged, const int32_t *start,
                                 __m512i k_unsigned, uint8_t *stage) {
    const size_t at = 64 * k, kb0 = k * (size_t)per;
    const __m512i nibble = _mm512_set1_epi8(0x0f);
    __m512i w;
    if (whole) {
        memcpy(stage, scale_row + kb0, (size_t)per);
        w = _mm512_loadu_si512(row + at);
    } else {
        const size_t n = nb - kb0 < (size_t)per ? nb - kb0 : (size_t)per;
        memset(stage, 0, (size_t)per);
        for (size_t b = 0; b < n; b++) stage[b] = scale_row[kb0 + b];
        w = _mm512_maskz_loadu_epi8(byte_mask(row_bytes - at), row + at);
    }
    const __m512i low = _mm512_and_si512(w, nibble);
    const __m512i high = _mm512_and_si512(_mm512_srli_epi16(w, 4), nibble);
    const __m512i *x = (const __m512i *)(const void *)(arranged + 2 * at);
    return chunk_dot(_mm512_load_si512(start + 16 * k), _mm512_shuffle_epi8(k_unsigned, low),
                     x[0], _mm512_shuffle_epi8(k_unsigned, high), x[1]);
}

/* A chunk's staged scale bytes of the 16 columns (words of 8 bytes: NVFP4, or of 4: MXFP4) as
 * per / 4 vectors of dwords (lane c: column c, block kb0 + 4 v + i in byte i of vector v). */
static inline void chunk_scale_bytes(const void *staged, int per, __m512i out[2]) {
    if (per == 4) {
        out[0] = _mm512_loadu_si512(staged);
        return;
    }
    /* a column's 8 bytes are two dwords: the first four blocks, then the next four */
    const __m512i first = _mm512_loadu_si512(staged);
    const __m512i second = _mm512_loadu_si512((const uint8_t *)staged + 64);
    out[0] = _mm512_permutex2var_epi32(
        first, _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30),
        second);
    out[1] = _mm512_permutex2var_epi32(
        first, _mm512_setr_epi32(1, 3, 5, 7, 9, 11, 13, 15, 17, 19, 21, 23, 25, 27, 29, 31),
        second);
}

/* scale_values_at of byte i of each dword lane of v, E4M3, where every byte is below 0x7f (no
 * sign, no NaN code): the byte's 7 bits moved to bits 20 .. 26, times 2^120. */
static inline __m512 e4m3_plain_values_at(__m512i v, const int i) {
    const __m512i field = i == 3 ? _mm512_srli_epi32(v, 4) : _mm512_slli_epi32(v, 20 - 8 * i);
    return _mm512_mul_ps(
        _mm512_castsi512_ps(_mm512_and_si512(field, _mm512_set1_epi32(0x07f00000))),
        _mm512_set1_ps(0x1p120f));
}

/* The columns [n0, n1) of a job of one row under blocks of bc = 16 (NVFP4) or 32 (MXFP4). */
ALWAYS_INLINE void row_columns(const quant_gemm_job *j, size_t n0, size_t n1, const int bc) {
    const size_t K = j->K, nb = j->nblocks, grid = j->w_grid_cols, row_bytes = j->w_row_bytes;
    const size_t chunks = (K + 127) / 128;
    const int per = 128 / bc; /* blocks a chunk */
    const int e4m3 = bc == 16;
    _Alignas(64) int8_t arranged[E2M1_ROW_MAX_K];
    _Alignas(64) int32_t start[E2M1_ROW_MAX_K / 8];
    float a_quarter[E2M1_ROW_MAX_K / 16];
    arrange_row(j->xq, K, (size_t)bc, arranged, start);
    for (size_t b = 0; b < nb; b++) a_quarter[b] = j->xs[b] * 0.25f;
    const int fusable = bc == 16 && nvfp4_row_fusable(j->xs, nb);
    /* MXFP4: the scale bytes' bounds of the exponent add (mxfp4_row_bounds), and per block
     * the bits of a_s / 4 less those of 1.0 */
    int least = 0, most = 0;
    int32_t exponent_add[E2M1_ROW_MAX_K / 32];
    const int adds = bc == 32 && mxfp4_row_bounds(j->xs, nb, &least, &most);
    if (adds) mxfp4_exponent_adds(a_quarter, nb, exponent_add);
    const __m512i least_byte = _mm512_set1_epi8((char)least);
    const __m512i most_byte = _mm512_set1_epi8((char)most);
    const __m512i k_unsigned = _mm512_broadcast_i32x4(_mm_setr_epi8(E2M1_K_UNSIGNED));
    const __m512i seven_bits = _mm512_set1_epi8(0x7f);
    __m512i kept[SEGMENT_CHUNKS * 16];
    /* the chunks' scale bytes, per bytes a column (read_chunk) */
    _Alignas(64) uint8_t staged[SEGMENT_CHUNKS * 16 * 8];
    const size_t whole_chunks =
        row_bytes / 64 < nb / (size_t)per ? row_bytes / 64 : nb / (size_t)per;
    for (size_t n = n0; n < n1; n += 16) {
        const size_t cols = n1 - n < 16 ? n1 - n : 16;
        const uint8_t *srow[16];
        for (size_t c = 0; c < 16; c++) /* past the last column: the last again, not stored */
            srow[c] = j->ws_codes + (n + (c < cols ? c : cols - 1)) * grid;
        __m512 acc = _mm512_setzero_ps();
        for (size_t s0 = 0; s0 < chunks; s0 += SEGMENT_CHUNKS) {
            const size_t s1 = chunks - s0 < SEGMENT_CHUNKS ? chunks : s0 + SEGMENT_CHUNKS;
            ahead_lines next = {j->wq + n * row_bytes, cols, row_bytes, 64 * s1, 64 * s1,
                                64 * (chunks - s1 < SEGMENT_CHUNKS ? chunks : s1 + SEGMENT_CHUNKS)};
            if (s1 == chunks) { /* the first segment of the next 16 columns */
                next.row += 16 * row_bytes;
                next.rows = n1 - n > 16 ? (n1 - n - 16 < 16 ? n1 - n - 16 : 16) : 0;
                next.at = next.from = 0;
                next.to = 64 * (chunks < SEGMENT_CHUNKS ? chunks : SEGMENT_CHUNKS);
            }
            for (size_t c = 0; c < cols; c++) {
                const uint8_t *row = j->wq + (n + c) * row_bytes;
                /* the column's scales of the segment, and those of the column 16 on, asked
                 * for now: read once the 16 columns' block dots are there */
                for (size_t at = s0 * (size_t)per; at < s1 * (size_t)per; at += 64) {
                    _mm_prefetch((const char *)(srow[c] + at), _MM_HINT_T0);
                    _mm_prefetch((const char *)(srow[c] + 16 * grid + at), _MM_HINT_T0);
                }
                for (size_t l = 0; l < (s1 - s0 + 1) / 2; l++) ask_next_line(&next);
                const size_t whole = s1 < whole_chunks ? s1 : whole_chunks;
                for (size_t k = s0; k < whole; k++)
                    kept[(k - s0) * 16 + c] =
                        read_chunk(row, row_bytes, srow[c], nb, k, 1, per, arranged, start,
                                   k_unsigned, staged + ((k - s0) * 16 + c) * (size_t)per);
                for (size_t k = whole > s0 ? whole : s0; k < s1; k++) /* the row's last */
                    kept[(k - s0) * 16 + c] =
                        read_chunk(row, row_bytes, srow[c], nb, k, 0, per, arranged, start,
                                   k_unsigned, staged + ((k - s0) * 16 + c) * (size_t)per);
            }
            for (size_t k = s0; k < s1; k++) {
                __m512i *v = kept + (k - s0) * 16;
                for (int l = 0; l < 8; l++) ask_next_line(&next);
                uint8_t *chunk_scales = staged + (k - s0) * 16 * (size_t)per;
                for (size_t c = cols; c < 16; c++) {
                    v[c] = v[0];
                    memcpy(chunk_scales + c * (size_t)per, chunk_scales, (size_t)per);
                }
                __m512i dots[8], scale_bytes[2];
                block_dots(v, bc == 32, dots);
                const size_t kb0 = k * (size_t)per;
                const int n_blocks = nb - kb0 < (size_t)per ? (int)(nb - kb0) : per;
                chunk_scale_bytes(chunk_scales, per, scale_bytes);
                /* NVFP4: the conversions without a sign where no byte has one or is a NaN
                 * code (0x7f: the bytes below 0x7f), else without NaN where none is one; the
                 * fused step where the row's activation scales allow it and no byte is a NaN */
                const int plain = e4m3 && !(_mm512_cmpge_epu8_mask(scale_bytes[0], seven_bits) |
                                            _mm512_cmpge_epu8_mask(scale_bytes[1], seven_bits));
                const int any_nan =
                    e4m3 && !plain &&
                    (_mm512_cmpeq_epi8_mask(_mm512_and_si512(scale_bytes[0], seven_bits),
                                            seven_bits) |
                     _mm512_cmpeq_epi8_mask(_mm512_and_si512(scale_bytes[1], seven_bits),
                                            seven_bits));
                const int fuse = fusable && !any_nan;
                if (adds && !(_mm512_cmplt_epu8_mask(scale_bytes[0], least_byte) |
                              _mm512_cmpgt_epu8_mask(scale_bytes[0], most_byte))) {
                    /* MXFP4, every byte within the bounds: acc = fma(S, a_s (w_s / 4), acc),
                     * a_s (w_s / 4) the integer sum of the exponents' bits */
#pragma GCC unroll 4
                    for (int b = 0; b < 4; b++) {
                        const __m512i field =
                            b == 3 ? _mm512_srli_epi32(scale_bytes[0], 1)
                                   : _mm512_slli_epi32(scale_bytes[0], 23 - 8 * b);
                        const __m512i product = _mm512_add_epi32(
                            _mm512_and_si512(field, _mm512_set1_epi32(0x7f800000)),
                            _mm512_set1_epi32(exponent_add[kb0 + b]));
                        acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dots[b]),
                                              _mm512_castsi512_ps(product), acc);
                    }
                    continue;
                }
#pragma GCC unroll 8
                for (int b = 0; b < per; b++) {
                    if (b >= n_blocks) break;
                    const __m512i bytes = scale_bytes[b / 4];
                    const __m512i byte = _mm512_and_si512(_mm512_srli_epi32(bytes, 8 * (b % 4)),
                                                          _mm512_set1_epi32(0xff));
                    const __m512 w_scale = plain     ? e4m3_plain_values_at(bytes, b % 4)
                                           : any_nan ? scale_values(byte, 1)
                                                     : scale_values_at(bytes, b % 4, e4m3);
                    const __m512 d = _mm512_cvtepi32_ps(dots[b]);
                    const __m512 a = _mm512_set1_ps(a_quarter[kb0 + b]);
                    if (fuse) /* fma(S, a_s (w_s / 4), acc): nvfp4_row_fusable says why */
                        acc = _mm512_fmadd_ps(d, _mm512_mul_ps(w_scale, a), acc);
                    else
                        acc = _mm512_add_ps(acc, _mm512_mul_ps(_mm512_mul_ps(d, a), w_scale));
                }
            }
        }
        if (j->rule->format->has_tensor_scale)
            acc = _mm512_mul_ps(acc, _mm512_set1_ps(j->xt[0] * j->w_tensor_scale));
        _mm512_mask_storeu_ps(j->y + n, (__mmask16)((1u << cols) - 1), acc);
    }
}

void E2M1_ROW_GEMM(const quant_gemm_job *j, size_t n0, size_t n1) {
    if (j->M != 1 || j->K > E2M1_ROW_MAX_K)
        E2M1_TILES_GEMM(j, n0, n1);
    else if (j->bc == 16)
        row_columns(j, n0, n1, 16);
    else
        row_columns(j, n0, n1, 32);
}
