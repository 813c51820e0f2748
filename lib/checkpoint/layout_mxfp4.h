/* What the MXFP4 layout (lib/checkpoint/layout_mxfp4.c) offers besides its row: the E8M0 byte
 * of a scale. */
#ifndef PARITY_LAYOUT_MXFP4_H
#define PARITY_LAYOUT_MXFP4_H

#include <stdint.h>

/* The E8M0 byte of a scale held as an fp32 power of two (2^-127 .. 2^127). */
uint8_t e8m0_of_pow2(float s);

#endif
