/*
 * The E2M1 formats' SIMD variants (NVFP4 and MXFP4), written once over each instruction set's
 * vector mapping, as kernels/simd_shared.h is: the GEMM column kernel (bitwise dot.c's
 * quant_gemm_blocked on E2M1 codes) and the activation quantizers (bitwise nvfp4.c's and
 * mxfp4.c's quantize_activations). e2m1_avx2.c and e2m1_avx512.c each include this header
 * once, after their mapping, so every function here is compiled with that file's instruction
 * set and under its own name (EV_NAME).
 *
 * The GEMM. Output columns in tiles of EV_LANES, a column a lane; K in chunks of EV_CHUNK = 4
 * EV_LANES codes (on AVX-512 4 NVFP4 blocks or 2 MXFP4 ones). The weight rows are held two codes a
 * byte (code_layout.h), (K + 1) / 2 bytes a row, so a chunk of a row is EV_CHUNK / 2 bytes. Per
 * tile and chunk the weight rows' codes are transposed and expanded to a code a byte
 * (ei_weight_chunk), so that register i holds codes 4i .. 4i+3 of every column, and become their
 * k_w (k = 2 x value, |k| <= 12, signed bytes) through a byte shuffle; a block's correction -12
 * sum(k_w) per column comes from the same registers (past PASS_ROWS rows, once per tile into a
 * panel of a segment of K that every pass reads: e2m1_columns). Then each row of activations (up to
 * PASS_ROWS a pass, two at a time, each reusing the transposed chunk from registers) has its codes
 * mapped to k_a + 12 (unsigned bytes, 0 .. 24), and each dword of them, broadcast, is multiplied
 * with register i, 4 products summed per lane (vpdpbusd, or vpmaddubsw pairs summed in int16 then
 * vpmaddwd); a block's lanes start at its correction, so they end at S = sum k_a k_w, the block's
 * exact dot in units of 1/4 (at most 32 x 144 in magnitude: no lane overflows). Then dot.c's fp32
 * chain in the lanes, the blocks ascending: acc = acc + (S * (a_s / 4)) * w_s, which is acc + (d *
 * a_s) * w_s: d = S / 4 exactly, and a_s / 4 is exact (an E4M3 value is at least 2^-9, an E8M0 one
 * at least 2^-127: powers of two down to 2^-149 divide exactly), so S * (a_s / 4) and d * a_s are
 * one real number rounded once. Where every scale of a pass's rows and of the job's columns is
 * within the bounds that make each product exact (below, "the fused chain step"), the step is the
 * one fma acc = fma(S, a_s * (w_s / 4), acc), the same bits. Last, NVFP4's acc * (s2a * s2w). Past
 * K the codes read as 0 (k_w = 0: nothing added).
 *
 * The quantizers. Per block, amax is the lanes' max of |x| (a NaN passed over as fmaxf does:
 * vmaxps returns its second operand, the running max, when the first is NaN; a max is exact in
 * any order); the scale and the step from values to codes come from the scalar code every path
 * shares (nvfp4.h, mxfp4.h); the step runs in lanes: vdivps and vmulps are the scalar IEEE
 * operations, the clamp fminf(fmaxf(q, -6), 6) is vmaxps(q, -6) (-6 for a NaN q, as fmaxf)
 * then vminps, and E2M1 is codecs.h's e2m1_from_f32: the count of the midpoints |q| is above
 * (or at, for the odd ones and under round-away; ordered compares, false for NaN), the sign
 * from bit 31. Past a row's end the lanes read +0, which no amax sees, and nothing is written.
 *
 * The mapping, macros or always-inline functions of the including file:
 *   EV_LANES, EV_NAME(f)       the lanes (16, 8), f's name in this variant (f ## _avx2, ...)
 *   EV_PREFETCH                the cache the next tile is prefetched into (_MM_HINT_T*)
 *   ev, ei                     the fp32 and the int32 (or byte) vector
 *   ei_codes(p, len)           a chunk of EV_CHUNK code bytes from p, 0 past len (not read)
 *   ei_weight_chunk(w, rows, byte0, len)   the chunk of EV_LANES weight rows held two codes
 *                              a byte, from byte byte0 of each, transposed: w[i] holds codes
 *                              4i .. 4i+3 of every row, a row a lane, one a byte; 0 past len
 *                              ((len + 1) / 2 bytes read)
 *   ei_store(p, v), ei_shuffle_bytes(table, v), ei_table(bytes...)
 *   ei_transpose(r)            EV_LANES vectors of EV_LANES dwords transposed
 *   ei_dot(start, w, u, n)     per lane, start + sum over n dwords of u[q] (unsigned bytes,
 *                              broadcast) times w[q] (signed bytes)
 *   ei_set1, ei_add, ei_sub, ei_or, ei_and, ei_srli, ei_slli, ei_of_dwords (EV_LANES dwords of an
 *   array, lane l the l-th)
 *   EV_E4M3_CHUNK(out, v)      optional: out[b] = ev_scale_values of byte b of v's lanes, E4M3,
 *                              for all EV_CHUNK / 16 blocks at once
 *   ev_set1, ev_zero(), ev_add, ev_mul, ev_fma (a b + c, rounded once), ev_div, ev_min,
 *   ev_max, ev_abs, ev_from_int (a conversion), ev_bits (the bits as an ei), ev_from_bits (an
 *   ei's bits as an ev), ev_reduce_max
 *   ev_load(p, n), ev_store(p, v, n)       lanes [0, n) of p (n may exceed EV_LANES), +0 past n
 *   ei_count_if(code, a, c, pred)          code + 1 in the lanes where a pred c
 *   e2m1_store(p, code, n)                 the low bytes of the lanes' codes, n of them
 */
#ifndef PARITY_QUANT_E2M1_LANES_H
#define PARITY_QUANT_E2M1_LANES_H

#include <string.h>

#include "dot.h"
#include "mxfp4.h"
#include "nvfp4.h"

#define EV_CHUNK (4 * EV_LANES)
enum { PASS_ROWS = 32 };

/* ---- the GEMM ----------------------------------------------------------------------------- */

/* E2M1_K_BIAS in each byte of 8 dwords: the bias the activations' bytes carry, whose product
 * with a block's k_w is its correction. */
static const int32_t e2m1_biases[8] = {
    E2M1_K_BIAS * 0x01010101, E2M1_K_BIAS * 0x01010101, E2M1_K_BIAS * 0x01010101,
    E2M1_K_BIAS * 0x01010101, E2M1_K_BIAS * 0x01010101, E2M1_K_BIAS * 0x01010101,
    E2M1_K_BIAS * 0x01010101, E2M1_K_BIAS * 0x01010101};

/* The n <= EV_CHUNK / 16 scale bytes of a weight row from p, byte b in bits 8b .. 8b + 7 (0
 * past n; no byte past n read): a chunk's, one load where the chunk is whole. */
static inline int32_t scale_bytes_of_row(const uint8_t *p, int n) {
    if (n == EV_CHUNK / 16 && n == 4) {
        uint32_t v;
        memcpy(&v, p, 4);
        return (int32_t)v;
    }
    if (n == EV_CHUNK / 16 && n == 2) {
        uint16_t v;
        memcpy(&v, p, 2);
        return v;
    }
    uint32_t v = 0;
    for (int b = 0; b < n; b++) v |= (uint32_t)p[b] << (8 * b);
    return (int32_t)v;
}

/* The fp32 values of scale bytes (one a lane, 0 .. 255), bit for bit codecs.h's e4m3_to_f32 and
 * e8m0_to_f32 of them. E8M0: 2^(b - 127) is the exponent field b, or for b = 0 the subnormal
 * 2^-127, the bit 0x400000 ((b - 1) >> 31 is 1 only for b = 0); 255 is the infinity. E4M3: the
 * sign moved to bit 31 and the 7 bits of exponent and mantissa to bits 20 .. 26 are the fp32
 * whose value is the E4M3 one times 2^-120 (an E4M3 subnormal m 2^-9 becomes the fp32 subnormal
 * m 2^-129), so a multiply by 2^120 gives it exactly (denormals are not flushed here: MXCSR's
 * DAZ and FTZ are off outside the pair32 kernels); the NaN codes 0x7f, 0xff (which no loader
 * accepts as a scale) become e4m3_to_f32's quiet NaN of their sign, sign | 0x7fc00000
 * ((m + 1) >> 7 is 1 only for m = 0x7f). */
static inline ev ev_scale_values(ei b, int e4m3) {
    if (!e4m3) {
        const ei zero_bit = ei_slli(ei_srli(ei_sub(b, ei_set1(1)), 31), 22);
        return ev_from_bits(ei_or(ei_slli(b, 23), zero_bit));
    }
    const ei magnitude = ei_and(b, ei_set1(0x7f));
    const ei bits = ei_or(ei_slli(magnitude, 20), ei_slli(ei_and(b, ei_set1(0x80)), 24));
    const ev v = ev_mul(ev_from_bits(bits), ev_set1(0x1p120f));
    const ei nan = ei_sub(ei_set1(0), ei_srli(ei_sub(magnitude, ei_set1(-1)), 7));
    const ei kept = ei_or(ei_sub(ei_set1(-1), nan), ei_set1((int32_t)0x80000000u));
    return ev_from_bits(ei_or(ei_and(ev_bits(v), kept), ei_and(nan, ei_set1(0x7fc00000))));
}

/* out[b], b < n (n <= EV_CHUNK / 16): the values of the scale bytes kb0 + b of the EV_LANES
 * weight rows whose scales start at rows[l], row l in lane l; E4M3 bytes (NVFP4) or E8M0 ones.
 * A row's n bytes are one dword, the rows' dwords one vector (ei_of_dwords: built in
 * registers), each byte shifted down in turn (those past n give values never read). A gather
 * per block costs more on Zen 4. */
static inline void ev_block_scales(ev *out, const uint8_t *const rows[EV_LANES], size_t kb0,
                                   int n, int e4m3) {
    int32_t row_bytes[EV_LANES];
#pragma GCC unroll 16
    for (int l = 0; l < EV_LANES; l++) row_bytes[l] = scale_bytes_of_row(rows[l] + kb0, n);
    const ei v = ei_of_dwords(row_bytes);
#if defined(EV_E4M3_CHUNK)
    if (e4m3) {
        EV_E4M3_CHUNK(out, v);
        return;
    }
#endif
#pragma GCC unroll 4
    for (int b = 0; b < EV_CHUNK / 16; b++)
        out[b] = ev_scale_values(ei_and(ei_srli(v, 8 * b), ei_set1(0xff)), e4m3);
}

/* ---- the fused chain step ---------------------------------------------------------------
 * Where every product is exact the chain step acc + (S * (a_s / 4)) * w_s is one fma:
 * fma(S, a_s * (w_s / 4), acc), bit for bit. Both round the same real acc + S a_s w_s / 4 once
 * (the fma's product is exact by definition; the spec's add gets that product exactly) when:
 *   - every significand is short: |S| <= 32 x 144 < 2^13 (13 bits), w_s an E4M3 (4 bits) or
 *     E8M0 (1 bit) value, a_s with at most 7 significant bits (its low 17 mantissa bits 0:
 *     E4M3 and E8M0 activation scales have 4 and 1); so S a_s (20 bits), S a_s w_s (24) and
 *     a_s w_s (11) each fit fp32's 24;
 *   - every value is finite and normal or zero: nonzero |a_s| in [2^-124, 2^116], nonzero
 *     |w_s| at least 2^-124 and |a_s| |w_s| in [2^-124, 2^116], so a_s / 4, w_s / 4 and
 *     a_s w_s / 4 are normal (a quarter of a normal value at least 2^-124 keeps its
 *     significand: exact), S a_s / 4 below 2^13 2^114 = 2^127, and S a_s w_s / 4 within
 *     [2^-126, 2^127) (no infinity, no denormal, no NaN code);
 *   - zeros: S, a_s or w_s zero gives a zero product of sign sign(S) ^ sign(a_s) ^ sign(w_s)
 *     (the conversion of S = 0 is +0) in both forms, and the same add of it to acc.
 * e2m1_chain_fusable checks these bounds for the range of a job's activation scales (else a
 * pass's) against that of a tile's weight scale bytes; outside them (NaN or infinite scale
 * codes, E8M0 exponents past the bounds, activation scales that are not short) the rows run
 * the spec's steps. */

/* Rows from which a GEMM looks for the fused step (below, the scans cost more than it saves). */
enum { FUSE_MIN_ROWS = 4 };

/* The magnitudes of a span of weight scale bytes: `ok` if none is a NaN or infinity code,
 * `zero` if one is a zero, the least nonzero and the largest value (0 for none). */
typedef struct e2m1_weight_scales {
    int ok, zero;
    double least, most;
} e2m1_weight_scales;

static inline e2m1_weight_scales e2m1_weight_scales_of(const uint8_t *p, size_t n, int e4m3) {
    /* E4M3: the magnitude's 7 bits order the values, 0x7f the NaN; E8M0: the byte orders
     * them (0 is 2^-127, no zero), 0xff the infinity. least_less1: the least nonzero less 1
     * (0 wraps past all of them). */
    const uint8_t keep = e4m3 ? 0x7f : 0xff, bad = e4m3 ? 0x7f : 0xff;
    const uint8_t shift = e4m3 ? 1 : 0;
    uint8_t least_less1 = 0xff, most = 0, zero = 0;
    for (size_t i = 0; i < n; i++) {
        const uint8_t v = (uint8_t)(p[i] & keep), key = (uint8_t)(v - shift);
        least_less1 = key < least_less1 ? key : least_less1;
        most = v > most ? v : most;
        zero |= v == 0;
    }
    e2m1_weight_scales r = {most != bad, e4m3 && zero, 0.0, 0.0};
    if (e4m3 && most > 0) {
        r.least = e4m3_to_f32((uint8_t)(least_less1 + 1));
        r.most = e4m3_to_f32(most);
    } else if (!e4m3 && n > 0) {
        r.least = e8m0_to_f32(least_less1);
        r.most = e8m0_to_f32(most);
    }
    return r;
}

/* A span of activation scales: `short_finite` if each is finite with at most 7 significant
 * bits (its low 17 bits 0), `powers` if each is moreover a nonzero power of two, the least
 * nonzero and the largest magnitude (0 for none). */
typedef struct e2m1_activation_scales {
    int short_finite, powers;
    float least, most;
} e2m1_activation_scales;

static inline e2m1_activation_scales e2m1_activation_scales_of(const float *xs, size_t n) {
    /* the scales' bits: any of the low 17 set, any of the 23 of the significand, a zero, the
     * least nonzero magnitude less 1 (0 wraps past all), the largest (an infinity or NaN above
     * every finite value) */
    uint32_t low = 0, fraction = 0, zero = 0, least_less1 = 0xffffffffu, most = 0;
    for (size_t i = 0; i < n; i++) {
        uint32_t bits;
        memcpy(&bits, xs + i, 4);
        const uint32_t magnitude = bits & 0x7fffffffu;
        low |= bits & 0x1ffffu;
        fraction |= bits & 0x7fffffu;
        zero |= magnitude == 0;
        least_less1 = magnitude - 1 < least_less1 ? magnitude - 1 : least_less1;
        most = magnitude > most ? magnitude : most;
    }
    e2m1_activation_scales r = {!low && most < 0x7f800000u, !fraction && !zero, 0.0f, 0.0f};
    if (most > 0) {
        const uint32_t least_bits = least_less1 + 1;
        memcpy(&r.least, &least_bits, 4);
        memcpy(&r.most, &most, 4);
    }
    return r;
}

/* How the fused step may run for activation scales a against weight scales w (the bounds
 * above): 0 not at all, FUSED_MULTIPLY (a_s * (w_s / 4) by vmulps), FUSED_EXPONENT_ADD where
 * every a_s is moreover a nonzero power of two (MXFP4's E8M0 activation scales) and no w_s is
 * zero (an E8M0 one never is): then a_s (w_s / 4) is the integer sum of the bits of w_s / 4
 * and of a_s, less those of 1.0 (the exponent fields add and the sign bits xor; the bounds
 * keep the sum of the exponents a normal one, so nothing carries into the sign), an integer
 * add that the vector integer units take off the multiply pipes. */
enum { FUSED_MULTIPLY = 1, FUSED_EXPONENT_ADD = 2 };
static inline int e2m1_chain_fusable(const e2m1_activation_scales *a,
                                     const e2m1_weight_scales *w) {
    if (!w->ok || (w->most > 0 && w->least < 0x1p-124) || !a->short_finite) return 0;
    if (a->most == 0 || w->most == 0) return FUSED_MULTIPLY; /* every product is a zero */
    const int level = a->powers && !w->zero ? FUSED_EXPONENT_ADD : FUSED_MULTIPLY;
    return a->least >= 0x1p-124f && a->most <= 0x1p116f &&
                   (double)a->least * w->least >= 0x1p-124 &&
                   (double)a->most * w->most <= 0x1p116
               ? level
               : 0;
}

/* u: a row's codes [k0, k0 + len) as k_a + 12 (0 past len), a dword of 4 at a time, kept in
 * memory (the empty asm says it may have changed), so that each ei_dot broadcast is a load
 * (vpbroadcastd from memory, no shuffle unit) rather than the lane shifts and register
 * broadcasts the compiler otherwise picks. */
static inline void activation_dwords(int32_t u[EV_CHUNK / 4], ei unsigned_k, const uint8_t *p,
                                     size_t len) {
    ei_store(u, ei_shuffle_bytes(unsigned_k, ei_codes(p, len)));
    __asm__ volatile("" : "+m"(*(int32_t(*)[EV_CHUNK / 4])u));
}

/* The chunk [k0, k0 + len) (blocks kb0 .. kb0 + nbc - 1) of `rows` (1 or 2, a constant where
 * inlined) activation rows from row m, into their accumulators acc[0 .. rows): the block dots
 * from the chunk's weight registers w and corrections, then the chain step per block, fused
 * (FUSED_*: w_scale is w_s / 4, or its bits less those of 1.0) or the spec's. The rows'
 * chains are independent, so that two rows at once keep twice the dots in flight. */
static inline __attribute__((always_inline)) void
e2m1_rows_chunk(ev *acc, const int rows, const quant_gemm_job *j, size_t m, size_t k0,
                size_t len, size_t kb0, int nbc, const ei *w, const ei *correction,
                const ev *w_scale, int fused, const int dwords) {
    const size_t K = j->K, nb = j->nblocks;
    const int blocks_per_chunk = EV_CHUNK / 4 / dwords;
    const ei unsigned_k = ei_table(E2M1_K_UNSIGNED);
    int32_t u[2][EV_CHUNK / 4];
    const float *xs[2];
    ev a[2];
    for (int r = 0; r < rows; r++) {
        activation_dwords(u[r], unsigned_k, j->xq + (m + (size_t)r) * K + k0, len);
        xs[r] = j->xs + (m + (size_t)r) * nb + kb0;
        a[r] = acc[r];
    }
    if (fused == FUSED_EXPONENT_ADD) {
#pragma GCC unroll 4
        for (int b = 0; b < blocks_per_chunk; b++) {
            if (b >= nbc) break;
            for (int r = 0; r < rows; r++) {
                const ei s = ei_dot(correction[b], w + b * dwords, u[r] + b * dwords, dwords);
                int32_t scale_bits;
                memcpy(&scale_bits, xs[r] + b, 4);
                const ev p = ev_from_bits(ei_add(ev_bits(w_scale[b]), ei_set1(scale_bits)));
                a[r] = ev_fma(ev_from_int(s), p, a[r]);
            }
        }
    } else if (fused) {
#pragma GCC unroll 4
        for (int b = 0; b < blocks_per_chunk; b++) {
            if (b >= nbc) break;
            for (int r = 0; r < rows; r++) {
                const ei s = ei_dot(correction[b], w + b * dwords, u[r] + b * dwords, dwords);
                a[r] = ev_fma(ev_from_int(s), ev_mul(w_scale[b], ev_set1(xs[r][b])), a[r]);
            }
        }
    } else {
#pragma GCC unroll 4
        for (int b = 0; b < blocks_per_chunk; b++) {
            if (b >= nbc) break;
            for (int r = 0; r < rows; r++) {
                const ei s = ei_dot(correction[b], w + b * dwords, u[r] + b * dwords, dwords);
                const ev t = ev_mul(ev_from_int(s), ev_set1(xs[r][b] * 0.25f));
                a[r] = ev_add(a[r], ev_mul(t, w_scale[b]));
            }
        }
    }
    for (int r = 0; r < rows; r++) acc[r] = a[r];
}

/* A chunk of a tile's weights made ready for the rows: w[i] codes 4i .. 4i+3 of every column as
 * k_w (signed bytes), per block the correction -12 sum(k_w) and w_s (0 past the job's
 * blocks). */
typedef struct e2m1_chunk {
    ei w[EV_LANES];
    ei correction[EV_CHUNK / 16];
    ev w_scale[EV_CHUNK / 16];
} e2m1_chunk;

/* The panel of a tile: from PASS_ROWS rows on, a segment of K's chunks is made ready once (the
 * codes transposed and widened, the corrections, the scales' values: about 15% of a pass when
 * repeated for each) and read from memory by every pass, about 24 KB of it (L1). */
enum { PANEL_CHUNKS = 24 * 1024 / sizeof(e2m1_chunk) };

/* Makes chunk [k0, k0 + len) of the tile's columns ready (blocks kb0 .. kb0 + nbc - 1). */
static inline __attribute__((always_inline)) void
e2m1_chunk_ready(e2m1_chunk *c, const uint8_t *const wrow[EV_LANES],
                 const uint8_t *const srow[EV_LANES], size_t k0, size_t len, size_t kb0,
                 int nbc, const int dwords) {
    const int blocks_per_chunk = EV_CHUNK / 4 / dwords;
    const ei signed_k = ei_table(E2M1_K_SIGNED);
    ei_weight_chunk(c->w, wrow, k0 / 2, len);
    for (int i = 0; i < EV_LANES; i++) c->w[i] = ei_shuffle_bytes(signed_k, c->w[i]);
    for (int b = 0; b < EV_CHUNK / 16; b++) {
        c->correction[b] = ei_set1(0);
        c->w_scale[b] = ev_zero();
    }
    for (int b = 0; b < blocks_per_chunk; b++) {
        if (b >= nbc) break;
        c->correction[b] =
            ei_sub(ei_set1(0), ei_dot(ei_set1(0), c->w + b * dwords, e2m1_biases, dwords));
    }
    ev_block_scales(c->w_scale, srow, kb0, nbc, dwords == 4); /* NVFP4: E4M3 */
}

/* Prefetches the next tile's share of chunk k0: its codes and scales (each contiguous): the
 * hardware's prefetchers lose EV_LANES streams of short rows (2-3x the read rate of a cold
 * 3072 x 1024 decode GEMM on Zen 4). */
static inline void e2m1_prefetch_next(const quant_gemm_job *j, size_t nt, size_t k0, size_t kb0,
                                      int blocks_per_chunk) {
    const uint8_t *next = j->wq + (nt + EV_LANES) * j->w_row_bytes + k0 / 2 * EV_LANES;
    for (int l = 0; l < EV_LANES * EV_CHUNK / 2; l += 64)
        _mm_prefetch((const char *)(next + l), EV_PREFETCH);
    const uint8_t *next_ws = j->ws_codes + (nt + EV_LANES) * j->w_grid_cols + kb0 * EV_LANES;
    for (int l = 0; l < EV_LANES * blocks_per_chunk; l += 64)
        _mm_prefetch((const char *)(next_ws + l), EV_PREFETCH);
}

/* The rows [m0, m1) (a pass) over chunk c at [k0, k0 + len): the chain's scales made the fused
 * step's factors where `fused`, then the rows `pair` (1 or 2) at a time (two: two chains of
 * block dots in flight, the faster from the panel; one: the faster for a single pass, whose
 * chunk is made ready in registers), the last alone. */
static inline __attribute__((always_inline)) void
e2m1_pass_chunk(ev *acc, const quant_gemm_job *j, size_t m0, size_t m1, const e2m1_chunk *c,
                size_t k0, size_t len, size_t kb0, int nbc, int fused, const int pair,
                const int dwords) {
    ev w_scale[EV_CHUNK / 16];
    for (int b = 0; b < EV_CHUNK / 16; b++) {
        /* w_s / 4 (exact: e2m1_chain_fusable), the fused chain's factor; for the exponent
         * add, its bits less those of 1.0 */
        w_scale[b] = c->w_scale[b];
        if (fused) w_scale[b] = ev_mul(w_scale[b], ev_set1(0.25f));
        if (fused == FUSED_EXPONENT_ADD)
            w_scale[b] = ev_from_bits(ei_sub(ev_bits(w_scale[b]), ei_set1(0x3f800000)));
    }
    size_t m = m0;
    for (; pair == 2 && m + 2 <= m1; m += 2)
        e2m1_rows_chunk(acc + (m - m0), 2, j, m, k0, len, kb0, nbc, c->w, c->correction,
                        w_scale, fused, dwords);
    for (; pair == 1 && m + 1 < m1; m++)
        e2m1_rows_chunk(acc + (m - m0), 1, j, m, k0, len, kb0, nbc, c->w, c->correction,
                        w_scale, fused, dwords);
    if (m < m1)
        e2m1_rows_chunk(acc + (m - m0), 1, j, m, k0, len, kb0, nbc, c->w, c->correction,
                        w_scale, fused, dwords);
}

/* The rows a tile of columns nt.. nt + cols - 1 reads, a lane each (lanes past the tile's
 * columns repeat its last column: read, never stored): its codes' rows in wrow, its scale
 * bytes' rows in srow; and its weight scales (its rows of `grid` bytes, one span) in
 * tile_scales where fuse_rows, returning whether the fused chain step is exact for them
 * against all rows' activation scales (e2m1_chain_fusable), else 0. */
static inline __attribute__((always_inline)) int
e2m1_tile_sources(const quant_gemm_job *j, size_t nt, size_t cols, const int dwords,
                  int fuse_rows, const e2m1_activation_scales *all_rows,
                  const uint8_t *wrow[EV_LANES], const uint8_t *srow[EV_LANES],
                  e2m1_weight_scales *tile_scales) {
    const size_t grid = j->w_grid_cols;
    const uint8_t *ws = j->ws_codes + nt * grid;
    for (size_t l = 0; l < EV_LANES; l++) {
        wrow[l] = j->wq + (nt + (l < cols ? l : cols - 1)) * j->w_row_bytes;
        srow[l] = ws + (l < cols ? l : cols - 1) * grid;
    }
    *tile_scales = (e2m1_weight_scales){0, 0, 0.0, 0.0};
    if (!fuse_rows) return 0;
    *tile_scales = e2m1_weight_scales_of(ws, cols * grid, dwords == 4);
    return e2m1_chain_fusable(all_rows, tile_scales);
}

/* The fused chain step for the pass of rows m0.. m1 - 1 of a tile: where it is exact for
 * every row of the pass and the tile's columns (all of the job's rows at once, fuse_tile,
 * else the pass's own activation scales where fuse_rows): 0 or FUSED_*. */
static inline __attribute__((always_inline)) int
e2m1_pass_fusable(const quant_gemm_job *j, size_t m0, size_t m1, int fuse_tile, int fuse_rows,
                  const e2m1_weight_scales *tile_scales) {
    if (fuse_tile || !fuse_rows) return fuse_tile;
    const e2m1_activation_scales pass_rows =
        e2m1_activation_scales_of(j->xs + m0 * j->nblocks, (m1 - m0) * j->nblocks);
    return e2m1_chain_fusable(&pass_rows, tile_scales);
}

/* The columns [n0, n1) of the job under blocks of `dwords` dwords (4: NVFP4's 16 codes, 8:
 * MXFP4's 32), a tile's columns a lane each. Up to PASS_ROWS rows, one pass whose chunks are
 * made ready in registers; from there on K in segments of PANEL_CHUNKS chunks, each made ready
 * once into the panel and read by every pass, the rows' sums kept in y between segments
 * (fp32 stored and loaded: the chain goes on unchanged). */
static inline __attribute__((always_inline)) void e2m1_columns(const quant_gemm_job *j,
                                                               size_t n0, size_t n1,
                                                               const int dwords) {
    const size_t K = j->K, nb = j->nblocks;
    const int blocks_per_chunk = EV_CHUNK / 4 / dwords;
    const int paneled = j->M > PASS_ROWS;
    const size_t segment = paneled ? (size_t)PANEL_CHUNKS * EV_CHUNK : K;
    e2m1_chunk panel[paneled ? PANEL_CHUNKS : 1];
    /* the activation scales of all rows, once (below FUSE_MIN_ROWS rows the scans cost more
     * than the fused chain saves) */
    const int fuse_rows = j->M >= FUSE_MIN_ROWS;
    e2m1_activation_scales all_rows = {0, 0, 0.0f, 0.0f};
    if (fuse_rows) all_rows = e2m1_activation_scales_of(j->xs, j->M * nb);
    for (size_t nt = n0; nt < n1; nt += EV_LANES) {
        const size_t cols = n1 - nt < EV_LANES ? n1 - nt : EV_LANES;
        const int prefetch = nt + EV_LANES < n1;
        const uint8_t *wrow[EV_LANES], *srow[EV_LANES];
        e2m1_weight_scales tile_scales;
        const int fuse_tile = e2m1_tile_sources(j, nt, cols, dwords, fuse_rows, &all_rows, wrow,
                                                srow, &tile_scales);
        for (size_t s0 = 0; s0 < K; s0 += segment) {
            const size_t s1 = K - s0 < segment ? K : s0 + segment;
            if (paneled)
                for (size_t k0 = s0, c = 0; k0 < s1; k0 += EV_CHUNK, c++) {
                    const size_t kb0 = k0 / (size_t)(4 * dwords), left = nb - kb0;
                    const int nbc = left < (size_t)blocks_per_chunk ? (int)left
                                                                    : blocks_per_chunk;
                    if (prefetch) e2m1_prefetch_next(j, nt, k0, kb0, blocks_per_chunk);
                    e2m1_chunk_ready(&panel[c], wrow, srow, k0,
                                     K - k0 < EV_CHUNK ? K - k0 : EV_CHUNK, kb0, nbc, dwords);
                }
            for (size_t m0 = 0; m0 < j->M; m0 += PASS_ROWS) {
                const size_t m1 = j->M - m0 < PASS_ROWS ? j->M : m0 + PASS_ROWS;
                const int fused = e2m1_pass_fusable(j, m0, m1, fuse_tile, fuse_rows, &tile_scales);
                ev acc[PASS_ROWS];
                for (size_t m = m0; m < m1; m++)
                    acc[m - m0] = s0 == 0 ? ev_zero() : ev_load(j->y + m * j->ldy + nt, cols);
                for (size_t k0 = s0, c = 0; k0 < s1; k0 += EV_CHUNK, c++) {
                    const size_t len = K - k0 < EV_CHUNK ? K - k0 : EV_CHUNK;
                    const size_t kb0 = k0 / (size_t)(4 * dwords), left = nb - kb0;
                    const int nbc = left < (size_t)blocks_per_chunk ? (int)left
                                                                    : blocks_per_chunk;
                    if (paneled) {
                        /* the chunk into registers for the pass (as below): read from the
                         * panel by each row, its 24 vectors would cost a load each */
                        const e2m1_chunk ready = panel[c];
                        e2m1_pass_chunk(acc, j, m0, m1, &ready, k0, len, kb0, nbc, fused,
                                        2, dwords);
                    } else {
                        if (prefetch) e2m1_prefetch_next(j, nt, k0, kb0, blocks_per_chunk);
                        e2m1_chunk ready;
                        e2m1_chunk_ready(&ready, wrow, srow, k0, len, kb0, nbc, dwords);
                        e2m1_pass_chunk(acc, j, m0, m1, &ready, k0, len, kb0, nbc, fused,
                                        1, dwords);
                    }
                }
                for (size_t m = m0; m < m1; m++) {
                    ev a = acc[m - m0];
                    if (s1 == K && j->rule->format->has_tensor_scale)
                        a = ev_mul(a, ev_set1(j->xt[m] * j->w_tensor_scale));
                    ev_store(j->y + m * j->ldy + nt, a, cols);
                }
            }
        }
    }
}

/* e2m1_columns up to PASS_ROWS rows: one pass, each chunk made ready in registers and the rows
 * one at a time (on Zen 4 the faster at 32 rows than e2m1_columns' single pass). */
static inline __attribute__((always_inline)) void e2m1_columns_one_pass(const quant_gemm_job *j,
                                                               size_t n0, size_t n1,
                                                               const int dwords) {
    const size_t K = j->K, nb = j->nblocks, grid = j->w_grid_cols;
    const size_t row_bytes = j->w_row_bytes; /* (K + 1) / 2 */
    const int blocks_per_chunk = EV_CHUNK / 4 / dwords;
    const ei signed_k = ei_table(E2M1_K_SIGNED), unsigned_k = ei_table(E2M1_K_UNSIGNED);
    /* the activation scales of all rows, once (below FUSE_MIN_ROWS rows the scans cost more
     * than the fused chain saves) */
    const int fuse_rows = j->M >= FUSE_MIN_ROWS;
    e2m1_activation_scales all_rows = {0, 0, 0.0f, 0.0f};
    if (fuse_rows) all_rows = e2m1_activation_scales_of(j->xs, j->M * nb);
    for (size_t nt = n0; nt < n1; nt += EV_LANES) {
        const size_t cols = n1 - nt < EV_LANES ? n1 - nt : EV_LANES;
        const uint8_t *wrow[EV_LANES], *srow[EV_LANES];
        e2m1_weight_scales tile_scales;
        const int fuse_tile = e2m1_tile_sources(j, nt, cols, dwords, fuse_rows, &all_rows, wrow,
                                                srow, &tile_scales);
        for (size_t m0 = 0; m0 < j->M; m0 += PASS_ROWS) {
            const size_t m1 = j->M - m0 < PASS_ROWS ? j->M : m0 + PASS_ROWS;
            const int fused = e2m1_pass_fusable(j, m0, m1, fuse_tile, fuse_rows, &tile_scales);
            ev acc[PASS_ROWS];
            for (size_t m = m0; m < m1; m++) acc[m - m0] = ev_zero();
            for (size_t k0 = 0, kb0 = 0; k0 < K; k0 += EV_CHUNK, kb0 += (size_t)blocks_per_chunk) {
                const size_t len = K - k0 < EV_CHUNK ? K - k0 : EV_CHUNK;
                const size_t left = nb - kb0;
                const int nbc = left < (size_t)blocks_per_chunk ? (int)left : blocks_per_chunk;
                /* the next tile's codes and scales (each contiguous), a share a chunk: the
                 * hardware's prefetchers lose EV_LANES streams of short rows (2-3x the read
                 * rate of a cold 3072 x 1024 decode GEMM on Zen 4) */
                if (m0 == 0 && nt + EV_LANES < n1) {
                    const uint8_t *next = j->wq + (nt + EV_LANES) * row_bytes + k0 / 2 * EV_LANES;
                    for (int l = 0; l < EV_LANES * EV_CHUNK / 2; l += 64)
                        _mm_prefetch((const char *)(next + l), EV_PREFETCH);
                    const uint8_t *next_ws = srow[0] + EV_LANES * grid + kb0 * EV_LANES;
                    for (int l = 0; l < EV_LANES * blocks_per_chunk; l += 64)
                        _mm_prefetch((const char *)(next_ws + l), EV_PREFETCH);
                }
                ei w[EV_LANES];
                ei_weight_chunk(w, wrow, k0 / 2, len);
                for (int i = 0; i < EV_LANES; i++) w[i] = ei_shuffle_bytes(signed_k, w[i]);
                /* per block: -12 sum(k_w) in each lane, and w_s */
                ei correction[EV_CHUNK / 16];
                ev w_scale[EV_CHUNK / 16];
                for (int b = 0; b < EV_CHUNK / 16; b++) {
                    correction[b] = ei_set1(0);
                    w_scale[b] = ev_zero();
                }
                for (int b = 0; b < blocks_per_chunk; b++) {
                    if (b >= nbc) break;
                    correction[b] = ei_sub(ei_set1(0), ei_dot(ei_set1(0), w + b * dwords,
                                                              e2m1_biases, dwords));
                }
                ev_block_scales(w_scale, srow, kb0, nbc, dwords == 4); /* NVFP4: E4M3 */
                if (fused) {
                    /* w_s / 4 (exact: e2m1_chain_fusable), the fused chain's factor; for the
                     * exponent add, its bits less those of 1.0 */
                    for (int b = 0; b < EV_CHUNK / 16; b++) {
                        w_scale[b] = ev_mul(w_scale[b], ev_set1(0.25f));
                        if (fused == FUSED_EXPONENT_ADD)
                            w_scale[b] = ev_from_bits(ei_sub(ev_bits(w_scale[b]),
                                                             ei_set1(0x3f800000)));
                    }
                    for (size_t m = m0; m < m1; m++) {
                        int32_t u[EV_CHUNK / 4];
                        activation_dwords(u, unsigned_k, j->xq + m * K + k0, len);
                        const float *xs = j->xs + m * nb + kb0;
                        ev a = acc[m - m0];
                        if (fused == FUSED_EXPONENT_ADD) {
                            const int32_t *xs_bits = (const int32_t *)(const void *)xs;
#pragma GCC unroll 4
                            for (int b = 0; b < blocks_per_chunk; b++) {
                                if (b >= nbc) break;
                                const ei s =
                                    ei_dot(correction[b], w + b * dwords, u + b * dwords, dwords);
                                const ev p = ev_from_bits(
                                    ei_add(ev_bits(w_scale[b]), ei_set1(xs_bits[b])));
                                a = ev_fma(ev_from_int(s), p, a);
                            }
                        } else {
#pragma GCC unroll 4
                            for (int b = 0; b < blocks_per_chunk; b++) {
                                if (b >= nbc) break;
                                const ei s =
                                    ei_dot(correction[b], w + b * dwords, u + b * dwords, dwords);
                                a = ev_fma(ev_from_int(s), ev_mul(w_scale[b], ev_set1(xs[b])), a);
                            }
                        }
                        acc[m - m0] = a;
                    }
                } else {
                    for (size_t m = m0; m < m1; m++) {
                        int32_t u[EV_CHUNK / 4];
                        activation_dwords(u, unsigned_k, j->xq + m * K + k0, len);
                        const float *xs = j->xs + m * nb + kb0;
                        ev a = acc[m - m0];
#pragma GCC unroll 4
                        for (int b = 0; b < blocks_per_chunk; b++) {
                            if (b >= nbc) break;
                            const ei s =
                                ei_dot(correction[b], w + b * dwords, u + b * dwords, dwords);
                            const ev t = ev_mul(ev_from_int(s), ev_set1(xs[b] * 0.25f));
                            a = ev_add(a, ev_mul(t, w_scale[b]));
                        }
                        acc[m - m0] = a;
                    }
                }
            }
            for (size_t m = m0; m < m1; m++) {
                ev a = acc[m - m0];
                if (j->rule->format->has_tensor_scale)
                    a = ev_mul(a, ev_set1(j->xt[m] * j->w_tensor_scale));
                ev_store(j->y + m * j->ldy + nt, a, cols);
            }
        }
    }
}

void EV_NAME(e2m1_gemm)(const quant_gemm_job *j, size_t n0, size_t n1) {
    if (j->M <= PASS_ROWS && j->bc == 16)
        e2m1_columns_one_pass(j, n0, n1, 4);
    else if (j->M <= PASS_ROWS)
        e2m1_columns_one_pass(j, n0, n1, 8);
    else if (j->bc == 16)
        e2m1_columns(j, n0, n1, 4);
    else
        e2m1_columns(j, n0, n1, 8);
}

/* ---- the activation quantizers ------------------------------------------------------------ */

#if !defined(E2M1_GEMM_ONLY)

/* max |x| over the n values of a block of `size` from p (n < size: a row's last block). */
static inline float block_amax(const float *p, size_t n, size_t size) {
    ev m = ev_zero();
    for (size_t i = 0; i < size && i < n; i += EV_LANES)
        m = ev_max(ev_abs(ev_load(p + i, n - i)), m);
    return ev_reduce_max(m);
}

/* Writes e2m1_from_f32(q, away) of the lanes, n of them (n may exceed EV_LANES). */
static inline void store_e2m1(uint8_t *p, ev q, int away, size_t n) {
    /* the midpoints of E2M1_MAGNITUDE's neighbours; at the odd ones' a tie goes up */
    static const float mid[7] = {0.25f, 0.75f, 1.25f, 1.75f, 2.5f, 3.5f, 5.0f};
    const ev a = ev_abs(q);
    ei code = ei_set1(0);
    for (int i = 0; i < 7; i++)
        code = away || (i & 1) ? ei_count_if(code, a, ev_set1(mid[i]), _CMP_GE_OQ)
                               : ei_count_if(code, a, ev_set1(mid[i]), _CMP_GT_OQ);
    e2m1_store(p, ei_or(code, ei_and(ei_srli(ev_bits(q), 28), ei_set1(8))), n);
}

/* The codes of values x under an NVFP4 step, n of them written. */
static inline void store_nvfp4(uint8_t *p, const nvfp4_step *step, ev x, size_t n) {
    const ev f = ev_set1(step->factor);
    switch (step->codes) {
    case NVFP4_CODES_DIVIDE:
        store_e2m1(p, ev_div(x, f), 0, n);
        return;
    case NVFP4_CODES_MULTIPLY:
        store_e2m1(p, ev_mul(x, f), 0, n);
        return;
    case NVFP4_CODES_DIVIDE_CLAMPED:
        store_e2m1(p, ev_min(ev_max(ev_div(x, f), ev_set1(-6.0f)), ev_set1(6.0f)), 0, n);
        return;
    }
    store_e2m1(p, ev_zero(), 0, n);
}

void EV_NAME(nvfp4_quantize_rows)(const quant_rule *r, size_t rows, size_t cols, const float *x,
                                  size_t x_stride, uint8_t *codes, size_t codes_stride,
                                  float *block_scales, float *row_scales) {
    const size_t grid = (cols + 15) / 16;
    for (size_t row = 0; row < rows; row++) {
        const float *xr = x + row * x_stride;
        uint8_t *cr = codes + row * codes_stride;
        float row_amax = 0.0f;
        for (size_t c0 = 0; c0 < cols; c0 += 16) {
            const float amax = block_amax(xr + c0, cols - c0, 16);
            row_amax = amax > row_amax ? amax : row_amax;
        }
        const nvfp4_tensor t = nvfp4_tensor_of(r->id, row_amax);
        for (size_t c0 = 0; c0 < cols; c0 += 16) {
            const size_t n = cols - c0;
            const nvfp4_step step = nvfp4_block_step(r->id, &t, block_amax(xr + c0, n, 16));
            for (size_t i = 0; i < 16 && i < n; i += EV_LANES)
                store_nvfp4(cr + c0 + i, &step, ev_load(xr + c0 + i, n - i), n - i);
            block_scales[row * grid + c0 / 16] = e4m3_to_f32(step.sf);
        }
        row_scales[row] = t.s2;
    }
}

void EV_NAME(mxfp4_quantize_rows)(const quant_rule *r, size_t rows, size_t cols, const float *x,
                                  size_t x_stride, uint8_t *codes, size_t codes_stride,
                                  float *scales, float *row_scales) {
    (void)row_scales;
    const size_t grid = (cols + 31) / 32;
    const int away = r->id == PARITY_QUANT_MXFP4_MICROXCALING;
    for (size_t row = 0; row < rows; row++) {
        const float *xr = x + row * x_stride;
        uint8_t *cr = codes + row * codes_stride;
        for (size_t c0 = 0; c0 < cols; c0 += 32) {
            const size_t n = cols - c0;
            const uint8_t e = mxfp4_scale_byte(r->id, block_amax(xr + c0, n, 32));
            const ev mult = ev_set1(e8m0_reciprocal(e));
            scales[row * grid + c0 / 32] = e8m0_to_f32(e);
            for (size_t i = 0; i < 32 && i < n; i += EV_LANES)
                store_e2m1(cr + c0 + i, ev_mul(ev_load(xr + c0 + i, n - i), mult), away, n - i);
        }
    }
}

#endif /* !E2M1_GEMM_ONLY */

#endif /* PARITY_QUANT_E2M1_LANES_H */
