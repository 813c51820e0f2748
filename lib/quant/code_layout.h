/*
 * How a weight's codes are held in memory, by its format's code_bits, and the readers of that
 * layout every kernel and converter shares (inline, so that the portable GEMMs of dot.c, which
 * the format rows point to, read it as quant_weight.c does).
 *
 * A weight's codes as held, a row at a time, each row quant_weight_row_bytes long, by the
 * format's code_bits:
 *   8  one code a byte (E4M3);
 *   4  two codes a byte, code 2i in the low nibble of byte i and code 2i + 1 in the high one
 *      (E2M1 with its sign at 0x8: the layout NVFP4 and MXFP4 checkpoints ship); an odd row's
 *      last high nibble is 0;
 *   2  ternary, four codes a byte as w + 1 (0, 1, 2) in groups of 64 codes in 16 bytes: code
 *      64 g + 16 q + i at bits 2q, 2q + 1 of byte 16 g + i, so that a shift by 2q and a mask
 *      give 16 consecutive codes; a row's last group is padded with 1 (the code 0).
 * The quantizers, the activations and the public calls take one code a byte (E4M3, E2M1 in the
 * low nibble, ternary as int8); quant_codes_pack_row and _unpack_row (quant_weight.h)
 * convert.
 */
#ifndef PARITY_QUANT_CODE_LAYOUT_H
#define PARITY_QUANT_CODE_LAYOUT_H

#include <stddef.h>
#include <stdint.h>

#include "format.h"

/* Code c of a held row, one a byte. */
static inline uint8_t quant_code_at(const quant_format *f, const uint8_t *held, size_t c) {
    switch (f->code_bits) {
    case 4:
        return (uint8_t)((held[c / 2] >> (c % 2 * 4)) & 0xfu);
    case 2: {
        const size_t g = c / 64, q = c % 64 / 16, i = c % 16;
        return (uint8_t)((int)((held[g * 16 + i] >> (2 * q)) & 3u) - 1);
    }
    default:
        return held[c];
    }
}

/* Codes [c0, c1) of a row held two a byte (code_bits 4), one a byte into out. */
static inline void quant_nibbles_unpack(const uint8_t *held, size_t c0, size_t c1, uint8_t *out) {
    for (size_t c = c0; c < c1; c++) out[c - c0] = (uint8_t)(held[c / 2] >> (c % 2 * 4) & 0xfu);
}

/* The int8 codes of `groups` whole groups of 64 of a row held four a byte (code_bits 2) into w
 * (a row's last group is padded, so whole groups are there to read). */
static inline void quant_ternary_groups_unpack(const uint8_t *held, size_t groups, int8_t *w) {
    for (size_t g = 0; g < groups; g++, held += 16, w += 64)
        for (int i = 0; i < 16; i++) {
            const uint8_t b = held[i];
            w[i] = (int8_t)((b & 3) - 1);
            w[16 + i] = (int8_t)((b >> 2 & 3) - 1);
            w[32 + i] = (int8_t)((b >> 4 & 3) - 1);
            w[48 + i] = (int8_t)((b >> 6) - 1);
        }
}

#endif /* PARITY_QUANT_CODE_LAYOUT_H */
