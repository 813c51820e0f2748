/*
 * The public calls of the element formats below bf16 (parity.h, "Element formats"): IEEE
 * binary16 (fp16), the two OCP 8-bit floats E4M3 and E5M2, and the 4-bit E2M1 with its
 * packing, each over an array, with argument checks; the codecs themselves are codecs.h's.
 *
 * Overflow. "Saturating" conversions clamp to the largest finite value first, as every
 * production quantizer does before its cast (and as PyTorch's float8 casts do since 2026,
 * pytorch #177870/#178817); infinities then become that value too. The non-saturating forms
 * are what c10's fp8e4m3fn_from_fp32_value / fp8e5m2_from_fp32_value computed before that:
 * E4M3 rounds onto a grid whose pattern above 448 is NaN, so (464, inf] becomes NaN (464 is a
 * tie and goes to the even 448); E5M2 rounds [61440, inf] to infinity. NaN keeps its sign:
 * E4M3 0x7f, E5M2 0x7f (| 0x80 when negative), as c10 writes them.
 */
#include <math.h>

#include "base/errors.h"
#include "base/floats.h"
#include "codecs.h"

uint16_t parity_fp16_from_f32(float x) { return f16_from_f32(x); }

float parity_fp16_to_f32(uint16_t x) { return f16_to_f32(x); }

/* The format of a call converting n values from `in` to `out`, after its checks (NULL with
 * the error set): format E4M3 or E5M2, both buffers there. */
static const minifloat *fp8_call(const char *fn, int format, size_t n, const void *in,
                                 const char *in_name, const void *out) {
    clear_error();
    const minifloat *f = format == PARITY_FP8_E4M3   ? &MINIFLOAT_E4M3
                         : format == PARITY_FP8_E5M2 ? &MINIFLOAT_E5M2
                                                     : NULL;
    if (!f)
        set_error(PARITY_ERR_INVALID_ARGUMENT, "%s: format %d is neither PARITY_FP8_E4M3 nor "
                  "PARITY_FP8_E5M2", fn, format);
    else if (n && (!in || !out))
        set_error(PARITY_ERR_INVALID_ARGUMENT, "%s: %s is NULL", fn, in ? "out" : in_name);
    else
        return f;
    return NULL;
}

int parity_fp8_from_f32(int format, int saturate, size_t n, const float *x, uint8_t *out) {
    const minifloat *f = fp8_call("parity_fp8_from_f32", format, n, x, "x", out);
    if (!f) return PARITY_ERR_INVALID_ARGUMENT;
    for (size_t i = 0; i < n; i++) out[i] = minifloat_from_f32(f, x[i], saturate);
    return PARITY_OK;
}

int parity_fp8_to_f32(int format, size_t n, const uint8_t *codes, float *out) {
    const minifloat *f = fp8_call("parity_fp8_to_f32", format, n, codes, "codes", out);
    if (!f) return PARITY_ERR_INVALID_ARGUMENT;
    for (size_t i = 0; i < n; i++) out[i] = minifloat_to_f32(f, codes[i]);
    return PARITY_OK;
}

/* ---- E2M1 ---------------------------------------------------------------------------------- */

int parity_fp4_from_f32(int rounding, size_t n, const float *x, uint8_t *codes) {
    clear_error();
    if (rounding != PARITY_FP4_RNE && rounding != PARITY_FP4_HALF_AWAY)
        return set_error(PARITY_ERR_INVALID_ARGUMENT, "parity_fp4_from_f32: rounding %d is neither "
                         "PARITY_FP4_RNE nor PARITY_FP4_HALF_AWAY", rounding);
    if (n && (!x || !codes))
        return set_error(PARITY_ERR_INVALID_ARGUMENT, "parity_fp4_from_f32: %s is NULL",
                         x ? "codes" : "x");
    for (size_t i = 0; i < n; i++)
        if (isnan(x[i]))
            return set_error(PARITY_ERR_TENSOR_NONFINITE, "parity_fp4_from_f32: x[%zu] is NaN, "
                             "which E2M1 cannot hold", i);
    for (size_t i = 0; i < n; i++) codes[i] = e2m1_from_f32(x[i], rounding == PARITY_FP4_HALF_AWAY);
    return PARITY_OK;
}

/* The checks of a call reading n codes into `out`: both buffers there, every code 4 bits. */
static int fp4_check_codes(const char *fn, size_t n, const uint8_t *codes, const void *out,
                           const char *out_name) {
    if (n && (!codes || !out))
        return set_error(PARITY_ERR_INVALID_ARGUMENT, "%s: %s is NULL", fn,
                         codes ? out_name : "codes");
    for (size_t i = 0; i < n; i++)
        if (codes[i] > 0xf)
            return set_error(PARITY_ERR_INVALID_ARGUMENT, "%s: codes[%zu] is 0x%02x, not a 4-bit "
                             "code", fn, i, codes[i]);
    return PARITY_OK;
}

int parity_fp4_to_f32(size_t n, const uint8_t *codes, float *out) {
    clear_error();
    TRY(fp4_check_codes("parity_fp4_to_f32", n, codes, out, "out"));
    for (size_t i = 0; i < n; i++) out[i] = e2m1_to_f32(codes[i]);
    return PARITY_OK;
}

int parity_fp4_pack(size_t n, const uint8_t *codes, uint8_t *packed) {
    clear_error();
    TRY(fp4_check_codes("parity_fp4_pack", n, codes, packed, "packed"));
    for (size_t j = 0; j < n / 2; j++) packed[j] = (uint8_t)(codes[2 * j] | codes[2 * j + 1] << 4);
    if (n & 1) packed[n / 2] = codes[n - 1];
    return PARITY_OK;
}

int parity_fp4_unpack(size_t n, const uint8_t *packed, uint8_t *codes) {
    clear_error();
    if (n && (!codes || !packed))
        return set_error(PARITY_ERR_INVALID_ARGUMENT, "parity_fp4_unpack: %s is NULL",
                         packed ? "codes" : "packed");
    for (size_t i = 0; i < n; i++) codes[i] = (uint8_t)(packed[i / 2] >> (4 * (i & 1)) & 0xfu);
    return PARITY_OK;
}
