/*
 * The FP8 (E4M3) formats' GEMM of one activation row (M = 1, decoding at batch 1) on AVX-512
 * with VBMI, bit for bit dot.c's quant_gemm_blocked (fp8-block's blocks of 128 codes, MXFP8's
 * of 32): fp8_row_gemm_avx512vbmi, which fp8_avx512.c's entries (with and without VNNI) hand
 * their jobs of one row where the CPU has VBMI; it takes those whose K is at most
 * FP8_ROW_MAX_K and leaves the others to the tiles (fp8_driver.h).
 *
 * The tiles transpose 16 weight rows and split each code into three int16 digits, about 30
 * vector instructions per 64 codes of a column: at M = 1 the codes arrive faster than they are
 * decoded. Here the weight rows are read whole, two at a time, in address order; each code
 * becomes its value as a double (a byte add and a bitwise select, or two byte permutes, then a
 * byte shuffle for 8 codes), and a block's dot is a sum of doubles.
 *
 * The arithmetic. An E4M3 code's value is k 2^-9 with k an integer of at most 4 significant
 * bits, |k| <= 448 * 2^9 < 2^18 (dot.c). Held as the double k / 2, bytes 0 .. 5 are zero (its
 * fraction has at most 3 bits, bits 49 .. 51), byte 7 is the code's sign and the top 7 bits of
 * the exponent, byte 6 the exponent's low 4 bits and the fraction. Where the code's exponent
 * field e is 1 .. 15 and the code is no NaN, k / 2 = (1 + m / 8) 2^(e + 1) has exponent field
 * 0x400 + e: byte 7 is the sign | 0x40, byte 6 the code's low 7 bits shifted left once. The
 * other codes (e = 0: zero, the subnormals k = 1 .. 7; the NaN codes 0x7f, 0xff, a NaN) take
 * two tables of the low 7 bits (the subnormals normalized there) and the sign bit; a chunk of
 * two columns holding any of them takes the tables whole. A product (k_a / 2)(k_w / 2) is a
 * multiple of 1/4 of at most 8 significant bits below 2^34, exact in double (in an FMA too); a
 * block's sum of at most 128 of them, in any order and grouping, has every partial sum a
 * multiple of 1/4 below 128 * 2^34 = 2^41, 43 bits: exact. So the block's sum is exactly S / 4
 * with S = sum k_a k_w the portable kernel's (its block_dot sums the same integers, exactly),
 * (S / 4) 2^-16 = S 2^-18 exactly (S is 0 or at least 1 in magnitude), and one conversion to
 * fp32 (round to nearest even, as C's cast) is its d. A block holding a NaN code (weight or
 * activation) sums to NaN, and d is then the quiet NaN the tiles write (the portable kernel's
 * NaN may differ in sign and payload: a NaN, as the spec and its tests ask). No double here is
 * subnormal. Then dot.c's fp32 chain, the blocks ascending, acc = acc + (d * a_s) * w_s from
 * acc = 0, the same fp32 operations in the same order: every block scale the formats hold
 * (fp8-block's fp32 scales of any value, MXFP8's powers of two 2^-127 .. 2^127) gives the
 * portable bits without a case of its own, as do saturated codes (0x7e: k = 448 * 2^9) and
 * zero blocks (S = 0, d = +0).
 *
 * The layout. Per chunk of 64 codes (one load of a weight row; masked at the row's end, the
 * codes past it 0), 8 vectors of 8 doubles (the codes' bytes 6 and 7 as words, then each
 * vector's words by a byte shuffle within 128-bit lanes, a shift or a mask), 128-bit lane l of
 * each holding codes of 16 l .. 16 l + 15, so that lanes 0, 1 hold codes 0 .. 31 of the chunk
 * and lanes 2, 3 codes 32 .. 63: an MXFP8 block is half of each vector, an fp8-block block two
 * chunks. The activation row is arranged so once per call (its doubles, 0 past K). Per chunk,
 * two columns a and b: their 8 products each summed into a vector, then the two vectors' lanes
 * summed in pairs into one, whose 128-bit lane l holds (a, b) over codes 16 l .. 16 l + 15 of
 * the chunk, kept for the group of 8 columns; then per block the group's 4 kept vectors summed
 * across their 128-bit lanes (an MXFP8 block: lanes 0, 1 or 2, 3; an fp8-block block: all four,
 * of both chunks) into one vector of sums, a column a lane, and the fp32 chain of the 8 columns
 * in a vector.
 */
#include <immintrin.h>
#include <math.h>
#include <pthread.h>
#include <string.h>

#include "codecs.h"
#include "dot.h"
#include "fp8_simd.h"

#include "kernels/kernels_x86.h"

/* The longest row the kernel takes (its activation doubles are on its stack, 64 KB), the
 * chunks of 64 codes whose kept vectors it holds at once (a group's: 16 KB), and how far ahead
 * of its reads it asks for the weight's lines, in bytes. */
#define FP8_ROW_MAX_K ((size_t)8192)
enum { SEGMENT_CHUNKS = 64 };
#ifndef ROW_AHEAD_BYTES
#define ROW_AHEAD_BYTES 4096
#endif

/* Bytes 6 and 7 (without the sign) of the double k / 2 of each code's low 7 bits (the header), and
 * the byte shuffles that place them: within each 64-bit lane, spread[i] puts word i (1 or 2)
 * of the codes' (byte 6, byte 7) words at bytes 6 and 7, 0 elsewhere. */
static uint8_t k_byte6[128], k_byte7[128], spread_index[2][16];
static pthread_once_t tables_once = PTHREAD_ONCE_INIT;

static void fill_tables(void) {
    for (int c = 0; c < 128; c++) {
        const double k = (double)e4m3_to_f32((uint8_t)c) * 0x1p8; /* k / 2; NaN for 0x7f */
        uint64_t bits;
        memcpy(&bits, &k, sizeof bits);
        k_byte6[c] = (uint8_t)(bits >> 48);
        k_byte7[c] = (uint8_t)(bits >> 56);
    }
    for (int i = 0; i < 2; i++)
        for (int h = 0; h < 2; h++)
            for (int b = 0; b < 8; b++)
                spread_index[i][8 * h + b] = b < 6 ? 0x80 : (uint8_t)(8 * h + 2 * (i + 1) + b - 6);
}

typedef struct decode_tables {
    __m512i byte6[2], byte7[2], spread[2];
} decode_tables;

static void load_tables(decode_tables *t) {
    pthread_once(&tables_once, fill_tables);
    for (int h = 0; h < 2; h++) {
        t->byte6[h] = _mm512_loadu_si512(k_byte6 + 64 * h);
        t->byte7[h] = _mm512_loadu_si512(k_byte7 + 64 * h);
        t->spread[h] = _mm512_broadcast_i32x4(
            _mm_loadu_si128((const __m128i *)(const void *)spread_index[h]));
    }
}

/* The doubles of the 4 words (byte 6, byte 7) of each 64-bit lane of w, each at the top of its
 * lane: word 3 in k[0], 0 in k[1], 1 and 2 in k[2], k[3]. */
ALWAYS_INLINE void spread_words(__m512i w, const decode_tables *t, __m512d k[4]) {
    const __m512i top = _mm512_set1_epi64((int64_t)0xffff000000000000ull);
    k[0] = _mm512_castsi512_pd(_mm512_and_si512(w, top));
    k[1] = _mm512_castsi512_pd(_mm512_slli_epi64(w, 48));
    k[2] = _mm512_castsi512_pd(_mm512_shuffle_epi8(w, t->spread[0]));
    k[3] = _mm512_castsi512_pd(_mm512_shuffle_epi8(w, t->spread[1]));
}

/* The doubles of 64 codes from their bytes 6 and 7, each vector's 128-bit lane l holding 2 of
 * codes 16 l .. 16 l + 15: k[0 .. 3] of 16 l .. 16 l + 7, k[4 .. 7] of the next 8. */
ALWAYS_INLINE void spread64(__m512i b6, __m512i b7, const decode_tables *t, __m512d k[8]) {
    /* the (byte 6, byte 7) words of codes 16 l .. 16 l + 7 of each lane l, then of the next 8 */
    spread_words(_mm512_unpacklo_epi8(b6, b7), t, k);
    spread_words(_mm512_unpackhi_epi8(b6, b7), t, k + 4);
}

/* The doubles k / 2 of 64 codes (spread64's lanes) by the tables. */
ALWAYS_INLINE void decode64(__m512i codes, const decode_tables *t, __m512d k[8]) {
    const __m512i b6 = _mm512_permutex2var_epi8(t->byte6[0], codes, t->byte6[1]);
    /* byte 7 | the code's sign (bit 7) */
    const __m512i b7 =
        _mm512_ternarylogic_epi32(_mm512_permutex2var_epi8(t->byte7[0], codes, t->byte7[1]),
                                  codes, _mm512_set1_epi8((char)0x80), 0xf8);
    spread64(b6, b7, t, k);
}

/* The same of 64 codes none of which has exponent field 0 or is a NaN code, without the
 * tables: k / 2 = (1 + m / 8) 2^(e + 1), the double whose exponent field is 0x400 + e and whose
 * fraction's top bits are m, so byte 7 is the sign | 0x40 and byte 6 (e << 4) | (m << 1), the
 * code's low 7 bits doubled: `twice`, each code plus itself. */
ALWAYS_INLINE void decode64_normal(__m512i codes, __m512i twice, const decode_tables *t,
                                   __m512d k[8]) {
    const __m512i b7 = _mm512_ternarylogic_epi32(codes, _mm512_set1_epi8((char)0x80),
                                                 _mm512_set1_epi8(0x40), 0xea);
    spread64(twice, b7, t, k);
}

/* Whether any of two vectors of codes, given as each code plus itself (u, bytes), has exponent
 * field 0 (u < 0x10) or is a NaN code (u = 0xfe): u - 0x10 >= 0xee, unsigned, in either. */
ALWAYS_INLINE int any_not_normal(__m512i twice_a, __m512i twice_b) {
    const __m512i less = _mm512_set1_epi8((char)0xf0);
    const __m512i most = _mm512_max_epu8(_mm512_add_epi8(twice_a, less),
                                         _mm512_add_epi8(twice_b, less));
    return _mm512_cmpge_epu8_mask(most, _mm512_set1_epi8((char)0xee)) != 0;
}

/* Codes [at, at + 64) of a row of `len` codes, 0 past its end. */
ALWAYS_INLINE __m512i row_codes(const uint8_t *row, size_t at, size_t len) {
    if (at + 64 <= len) return _mm512_loadu_si512(row + at);
    return _mm512_maskz_loadu_epi8(((__mmask64)1 << (len - at)) - 1, row + at);
}

/* Two columns' chunk against the chunk's 64 arranged activation doubles x: 128-bit lane l is
 * (a, b) summed over codes 16 l .. 16 l + 15 of the chunk (the header). */
ALWAYS_INLINE __m512d pair_chunk(__m512i codes_a, __m512i codes_b, const double *x,
                                 const decode_tables *t) {
    __m512d wa[8], wb[8];
    const __m512i twice_a = _mm512_add_epi8(codes_a, codes_a);
    const __m512i twice_b = _mm512_add_epi8(codes_b, codes_b);
    if (any_not_normal(twice_a, twice_b)) {
        decode64(codes_a, t, wa);
        decode64(codes_b, t, wb);
    } else {
        decode64_normal(codes_a, twice_a, t, wa);
        decode64_normal(codes_b, twice_b, t, wb);
    }
    const __m512d x0 = _mm512_load_pd(x), x1 = _mm512_load_pd(x + 8);
    __m512d a0 = _mm512_mul_pd(wa[0], x0), a1 = _mm512_mul_pd(wa[1], x1);
    __m512d b0 = _mm512_mul_pd(wb[0], x0), b1 = _mm512_mul_pd(wb[1], x1);
#pragma GCC unroll 3
    for (int q = 2; q < 8; q += 2) {
        const __m512d xe = _mm512_load_pd(x + 8 * q), xo = _mm512_load_pd(x + 8 * q + 8);
        a0 = _mm512_fmadd_pd(wa[q], xe, a0);
        b0 = _mm512_fmadd_pd(wb[q], xe, b0);
        a1 = _mm512_fmadd_pd(wa[q + 1], xo, a1);
        b1 = _mm512_fmadd_pd(wb[q + 1], xo, b1);
    }
    const __m512d a = _mm512_add_pd(a0, a1), b = _mm512_add_pd(b0, b1);
    return _mm512_add_pd(_mm512_unpacklo_pd(a, b), _mm512_unpackhi_pd(a, b));
}

/* Two kept vectors (columns 0, 1 and 2, 3 of four) with their 128-bit lanes 0, 1 and 2, 3
 * summed: (columns 0, 1 over lanes 0, 1), (0, 1 over 2, 3), (2, 3 over 0, 1), (2, 3 over 2, 3). */
ALWAYS_INLINE __m512d lanes_pairwise(__m512d p, __m512d r) {
    return _mm512_add_pd(_mm512_shuffle_f64x2(p, r, _MM_SHUFFLE(2, 0, 2, 0)),
                         _mm512_shuffle_f64x2(p, r, _MM_SHUFFLE(3, 1, 3, 1)));
}

/* One block of the 8 columns' fp32 chain from their block sums S (a column a lane): d, NaN
 * where S is, then acc + (d * a_s) * w_s. */
ALWAYS_INLINE __m256 chain_step(__m256 acc, __m512d S, float a_s, __m256 w_s) {
    __m256 d = _mm512_cvtpd_ps(_mm512_mul_pd(S, _mm512_set1_pd(0x1p-16)));
    d = _mm256_mask_mov_ps(d, _mm512_cmp_pd_mask(S, S, _CMP_UNORD_Q), _mm256_set1_ps(NAN));
    return _mm256_add_ps(acc, _mm256_mul_ps(_mm256_mul_ps(d, _mm256_set1_ps(a_s)), w_s));
}

/* The columns [n0, n1) of a job of one row under blocks of bc = 128 (fp8-block) or 32
 * (MXFP8). */
ALWAYS_INLINE void row_columns(const quant_gemm_job *j, size_t n0, size_t n1, const int bc) {
    const size_t K = j->K, nb = j->nblocks, grid = j->w_grid_cols, row_bytes = j->w_row_bytes;
    const size_t chunks = (K + 63) / 64, block_rows = j->rule->format->block_rows;
    decode_tables t;
    load_tables(&t);
    _Alignas(64) double x[FP8_ROW_MAX_K];
    for (size_t c = 0; c < chunks; c++) {
        __m512d k[8];
        decode64(row_codes(j->xq, 64 * c, K), &t, k);
        for (int q = 0; q < 8; q++) _mm512_store_pd(x + 64 * c + 8 * q, k[q]);
    }
    __m512d kept[SEGMENT_CHUNKS * 4];
    for (size_t n = n0; n < n1; n += 8) {
        const size_t cols = n1 - n < 8 ? n1 - n : 8;
        /* past the last column: the last again, not stored */
        const uint8_t *rows[8];
        int32_t offsets[8];
        size_t scale_row0 = 0;
        int one_scale_row = 1;
        for (size_t c = 0; c < 8; c++) {
            const size_t column = n + (c < cols ? c : cols - 1);
            const size_t scale_row = column / block_rows * grid;
            if (c == 0) scale_row0 = scale_row;
            rows[c] = j->wq + column * row_bytes;
            offsets[c] = (int32_t)(scale_row - scale_row0); /* below 8 grid rows: K <= 8192 */
            one_scale_row &= scale_row == scale_row0;
        }
        const __m256i scale_offsets = _mm256_loadu_si256((const __m256i *)(const void *)offsets);
        const float *ws = j->ws + scale_row0;
        __m256 acc = _mm256_setzero_ps();
        for (size_t s0 = 0; s0 < chunks; s0 += SEGMENT_CHUNKS) {
            const size_t s1 = chunks - s0 < SEGMENT_CHUNKS ? chunks : s0 + SEGMENT_CHUNKS;
            for (int p = 0; p < 4; p++) {
                const uint8_t *a = rows[2 * p], *b = rows[2 * p + 1];
                for (size_t c = s0; c < s1; c++) {
                    const size_t at = 64 * c;
                    _mm_prefetch((const char *)(a + at + ROW_AHEAD_BYTES), _MM_HINT_T0);
                    _mm_prefetch((const char *)(b + at + ROW_AHEAD_BYTES), _MM_HINT_T0);
                    kept[(c - s0) * 4 + p] = pair_chunk(
                        row_codes(a, at, row_bytes), row_codes(b, at, row_bytes), x + at, &t);
                }
            }
            /* the segment's blocks, ascending (a segment is a whole number of fp8-block's
             * blocks: SEGMENT_CHUNKS is even) */
            for (size_t c = s0; c < s1; c += bc == 128 ? 2 : 1) {
                const __m512d *v = kept + (c - s0) * 4;
                if (bc == 128) {
                    __m512d P[4];
                    for (int p = 0; p < 4; p++)
                        P[p] = c + 1 < s1 ? _mm512_add_pd(v[p], v[4 + p]) : v[p];
                    const __m512d q01 = lanes_pairwise(P[0], P[1]),
                                  q23 = lanes_pairwise(P[2], P[3]);
                    const size_t kb = c / 2;
                    const __m256 w_s = one_scale_row
                                           ? _mm256_set1_ps(ws[kb])
                                           : _mm256_i32gather_ps(ws + kb, scale_offsets, 4);
                    acc = chain_step(acc, lanes_pairwise(q01, q23), j->xs[kb], w_s);
                } else {
                    const __m512d q01 = lanes_pairwise(v[0], v[1]),
                                  q23 = lanes_pairwise(v[2], v[3]);
                    for (size_t h = 0; h < 2 && 2 * c + h < nb; h++) {
                        const size_t kb = 2 * c + h;
                        const __m512d S =
                            h ? _mm512_shuffle_f64x2(q01, q23, _MM_SHUFFLE(3, 1, 3, 1))
                              : _mm512_shuffle_f64x2(q01, q23, _MM_SHUFFLE(2, 0, 2, 0));
                        const __m256 w_s = one_scale_row
                                               ? _mm256_set1_ps(ws[kb])
                                               : _mm256_i32gather_ps(ws + kb, scale_offsets, 4);
                        acc = chain_step(acc, S, j->xs[kb], w_s);
                    }
                }
            }
        }
        _mm256_mask_storeu_ps(j->y + n, (__mmask8)((1u << cols) - 1), acc);
    }
}

int fp8_row_gemm_avx512vbmi(const quant_gemm_job *j, size_t n0, size_t n1) {
    if (j->M != 1 || j->K == 0 || j->K > FP8_ROW_MAX_K || j->w_row_bytes != j->K) return 0;
    if (j->bc == 128)
        row_columns(j, n0, n1, 128);
    else if (j->bc == 32)
        row_columns(j, n0, n1, 32);
    else
        return 0;
    return 1;
}
