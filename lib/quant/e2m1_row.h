/*
 * What the E2M1 one-row kernels (e2m1_row_avx512.c, e2m1_row_avx2.c: decoding at batch 1)
 * share apart from their vectors: the prefetch of the next unit's weight lines through both
 * phases of a unit, and the checks that let a row's chain steps run fused (NVFP4) or as an
 * exponent add and one fma (MXFP4), bit for bit dot.c's steps.
 */
#ifndef PARITY_QUANT_E2M1_ROW_H
#define PARITY_QUANT_E2M1_ROW_H

#include <immintrin.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

/* The longest row the kernels take: their arranged activations are on the stack. */
#define E2M1_ROW_MAX_K ((size_t)16384)

/* The weight lines of the next unit of work (the next segment of the 16 columns, else the
 * first of the next 16), asked for one at a time in address order: half of them while the
 * current unit's rows are read (a line every other chunk), half while its block dots are
 * folded (8 lines a chunk), so that the memory is kept busy through both phases; asked for
 * only while the integer work runs, the lines came in bursts the fold phase left idle. */
typedef struct ahead_lines {
    const uint8_t *row; /* the row being asked for, `rows` rows left from it */
    size_t rows, row_bytes, at, from, to; /* bytes [from, to) of each row, `at` the next */
} ahead_lines;

static inline void ask_next_line(ahead_lines *a) {
    if (!a->rows) return;
    _mm_prefetch((const char *)(a->row + a->at), _MM_HINT_T0);
    a->at += 64;
    if (a->at >= a->to) {
        a->at = a->from;
        a->row += a->row_bytes;
        a->rows--;
    }
}

/* Whether NVFP4's chain step acc + (S (a_s / 4)) w_s is, for every block of the row, the one
 * fma(S, (a_s / 4) w_s, acc) against every E4M3 weight scale but the NaN codes (whose chunks
 * take the spec's steps). e2m1_lanes.h's "fused chain step" proves the two the same bits when
 * |S| < 2^13, w_s has at most 4 significant bits and a_s at most 7 (its low 17 bits 0), and
 * every nonzero a_s, w_s and product a_s w_s is in [2^-124, 2^116]; a zero a_s or w_s gives the
 * same signed zero product in both. A nonzero E4M3 w_s is in [2^-9, 448], so a nonzero a_s in
 * [2^-115, 2^107] keeps every product in bounds (2^107 x 448 < 2^116); then a_s / 4 is exact
 * and (a_s / 4) w_s is the exact a_s (w_s / 4) of the proof. */
static inline int nvfp4_row_fusable(const float *xs, size_t nb) {
    for (size_t b = 0; b < nb; b++) {
        uint32_t bits;
        memcpy(&bits, xs + b, 4);
        const float magnitude = xs[b] < 0 ? -xs[b] : xs[b];
        if (bits & 0x1ffffu) return 0;
        if (magnitude != 0 && !(magnitude >= 0x1p-115f && magnitude <= 0x1p107f)) return 0;
    }
    return 1;
}

/* Whether MXFP4's chain step acc + (S (a_s / 4)) w_s may run, for every block of the row,
 * as fma(S, a_s (w_s / 4), acc) with a_s (w_s / 4) the integer sum of the bits of a_s / 4 and
 * of the E8M0 byte moved to the exponent field, less those of 1.0, for the chunks whose scale
 * bytes are all within [*least, *most] (set here). e2m1_lanes.h's "fused chain step" proves
 * the fma the spec's step where every activation scale is a power of two and every a_s, w_s
 * and a_s w_s is within [2^-124, 2^116]: a_s = 2^e (bits: no fraction, the exponent field
 * 3 .. 243) and w_s = 2^(byte - 127) then need byte >= 3 and 3 - e_least <= byte <= 243 -
 * e_most (and byte < 255, the infinity); then a_s / 4 and the product are normal, so the
 * exponents add with nothing carried into the sign or past the field. */
static inline int mxfp4_row_bounds(const float *xs, size_t nb, int *least, int *most) {
    int e_least = 1000, e_most = -1000;
    for (size_t b = 0; b < nb; b++) {
        uint32_t bits;
        memcpy(&bits, xs + b, 4);
        const int field = (int)(bits >> 23 & 0xff);
        if ((bits & 0x7fffffu) || field < 3 || field > 243) return 0;
        e_least = field - 127 < e_least ? field - 127 : e_least;
        e_most = field - 127 > e_most ? field - 127 : e_most;
    }
    *least = 3 - e_least > 3 ? 3 - e_least : 3;
    *most = 243 - e_most < 254 ? 243 - e_most : 254;
    return nb > 0 && *least <= *most;
}

/* The exponent adds of mxfp4_row_bounds, per block: the bits of a_s / 4 (a_quarter) less
 * those of 1.0, modulo 2^32 (a negative scale's sign bit rides along into the product's; the
 * subtraction is unsigned, as the kernels' vector adds are, so no int overflows). */
static inline void mxfp4_exponent_adds(const float *a_quarter, size_t nb, int32_t *adds) {
    for (size_t b = 0; b < nb; b++) {
        uint32_t bits;
        memcpy(&bits, a_quarter + b, 4);
        bits -= 0x3f800000u;
        memcpy(adds + b, &bits, 4);
    }
}

#endif /* PARITY_QUANT_E2M1_ROW_H */
