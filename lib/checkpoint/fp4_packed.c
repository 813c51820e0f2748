/*
 * 4-bit weights as checkpoints hold them, the part both FP4 layouts share (layout_nvfp4.c,
 * layout_mxfp4.c): E2M1 codes two a byte, the low nibble the even column (torchao's pack_uint4,
 * ModelOpt's q[..., 1::2] << 4 | q[..., 0::2]), each code S E E M (code & 8 the sign, code & 7
 * the magnitudes 0, 0.5, 1, 1.5, 2, 3, 4, 6). A partial last block's padding codes (an odd
 * column count, cols not a multiple of 32) must be +0, and every dequantized value must be
 * within bf16's range. A model holds these codes as they are (quant_weight.h's 4-bit layout,
 * (cols + 1) / 2 bytes a row): an import copies the rows, or uses them in place from a mapped
 * file whose rows are as long (NVFP4's always, MXFP4's when cols % 32 is 0 or 31), and a save
 * writes them, each row padded to its 32-blocks for MXFP4. The block scales are held as the
 * bytes they are (NVFP4's E4M3, MXFP4's E8M0: quant_weight.h), copied from the file and written
 * back as they are. Here: the packed codes' checks and copy, the block scales' grid, the values'
 * range check, and what a save writes of them.
 */
#include <inttypes.h>
#include <stdio.h>
#include <string.h>

#include "base/alloc.h"
#include "base/errors.h"
#include "base/floats.h"
#include "fp4_packed.h"
#include "quant/codecs.h"


static uint8_t nibble(const uint8_t *row, uint64_t c) { return (uint8_t)((row[c / 2] >> (4 * (c & 1))) & 0xfu); }

/* The bytes of a row of `cols` codes as a model holds them. */
static uint64_t held_row_bytes(uint64_t cols) { return (cols + 1) / 2; }

void fp4_pad_rows(const uint8_t *held, uint32_t rows, uint32_t cols, uint64_t packed_cols,
                  uint8_t *packed) {
    const uint64_t row_bytes = held_row_bytes(cols);
    memset(packed, 0, (size_t)rows * packed_cols);
    for (uint64_t r = 0; r < rows; r++)
        memcpy(packed + r * packed_cols, held + r * row_bytes, row_bytes);
}

int fp4_check_packed(const tensor_source *codes, const expected *slot, uint64_t packed_cols,
                     int blocks_3d, const char *layout) {
    if (codes->dtype != TENSOR_SOURCE_U8)
        return set_error(PARITY_ERR_TENSOR_DTYPE, "%s: dtype %s where %s codes are U8, two a byte "
                         "(a layer kept in bf16 is named in the config's list of modules not "
                         "converted)", codes->where, codes->dtype_name ? codes->dtype_name : "?",
                         layout);
    const int ok = slot->rows && codes->data &&
                   (blocks_3d ? codes->ndim == 3 && codes->shape[0] == slot->rows &&
                                    codes->shape[1] == packed_cols / 16 && codes->shape[2] == 16
                              : codes->ndim == 2 && codes->shape[0] == slot->rows &&
                                    codes->shape[1] == packed_cols);
    if (!ok && !codes->data && slot->rows)
        return set_error(PARITY_ERR_INVALID_ARGUMENT, "%s: data is NULL", codes->where);
    if (!ok) {
        char got[96];
        int k = snprintf(got, sizeof got, "[");
        for (uint32_t d = 0; d < codes->ndim && d < 4 && k > 0 && (size_t)k < sizeof got; d++)
            k += snprintf(got + k, sizeof got - (size_t)k, "%s%" PRIu64, d ? ", " : "", codes->shape[d]);
        if (k > 0 && (size_t)k < sizeof got) snprintf(got + k, sizeof got - (size_t)k, "%s]", codes->ndim > 4 ? ", ..." : "");
        if (blocks_3d)
            return set_error(PARITY_ERR_TENSOR_SHAPE, "%s: shape %s, not [%u, %" PRIu64 ", 16]: "
                             "the %u x %u weight %s in blocks of 32 codes, 16 bytes each",
                             codes->where, got, slot->rows, packed_cols / 16, slot->rows,
                             slot->cols, slot->shape_doc);
        return set_error(PARITY_ERR_TENSOR_SHAPE, "%s: shape %s, not [%u, %" PRIu64 "]: two codes "
                         "a byte along the %u columns of %s", codes->where, got, slot->rows,
                         packed_cols, slot->cols, slot->shape_doc);
    }
    const uint8_t *p = codes->data;
    for (uint64_t r = 0; r < slot->rows; r++)
        for (uint64_t c = slot->cols; c < 2 * packed_cols; c++)
            if (nibble(p + r * packed_cols, c))
                return set_error(PARITY_ERR_TENSOR_SHAPE, "%s: row %" PRIu64 " has padding code "
                                 "0x%x at column %" PRIu64 " (past the weight's %u columns the "
                                 "last block is padded with +0)", codes->where, r,
                                 nibble(p + r * packed_cols, c), c, slot->cols);
    return PARITY_OK;
}

/* The held codes: the mapped file's rows in place where they are as long as the held ones (read
 * only: nothing writes a weight's shipped codes, an update or a set replaces them), else a new
 * buffer; and the scale bytes: the mapped file's in place (the file's grid is the held one),
 * else a new buffer. */
static int alloc_values(const tensor_source *codes, const tensor_source *scales,
                        const expected *slot, uint64_t packed_cols, uint64_t grid,
                        shipped_values *out) {
    const uint64_t row_bytes = held_row_bytes(slot->cols);
    out->codes_mapped = (uint8_t)(codes->may_map && packed_cols == row_bytes);
    out->codes = out->codes_mapped ? (uint8_t *)(uintptr_t)codes->data
                                   : px_huge_alloc(slot->rows * row_bytes, slot->name);
    out->scales_mapped = (uint8_t)scales->may_map;
    out->scale_codes = out->scales_mapped ? (uint8_t *)(uintptr_t)scales->data
                                          : px_malloc(grid ? grid : 1, "block scales");
    if (out->codes && out->scales) return PARITY_OK;
    shipped_values_free(out);
    return PARITY_ERR_OUT_OF_MEMORY;
}

/* Each value checked within bf16's range (the values themselves are shipped_dequantize's,
 * computed the same way when a reader asks for them), and the rows copied into v's codes
 * unless v uses them in place. */
static int fill_codes(const tensor_source *codes, const expected *slot, uint64_t packed_cols,
                      uint64_t block, float tensor_scale, float (*scale_of)(uint8_t),
                      shipped_values *v) {
    const uint8_t *p = codes->data;
    const uint64_t grid_cols = (slot->cols + block - 1) / block;
    const uint64_t row_bytes = held_row_bytes(slot->cols);
    for (uint64_t r = 0; r < slot->rows; r++) {
        for (uint64_t c = 0; c < slot->cols; c++) {
            const uint8_t code = nibble(p + r * packed_cols, c);
            float x = e2m1_to_f32(code) * scale_of(v->scale_codes[r * grid_cols + c / block]);
            if (tensor_scale) x = x * tensor_scale;
            if ((bf16_from_f32(x) & 0x7f80u) == 0x7f80u)
                return set_error(PARITY_ERR_TENSOR_NONFINITE, "%s: element [%" PRIu64 "][%" PRIu64
                                 "] dequantizes to %g, beyond bf16's range", codes->where, r, c,
                                 (double)x);
        }
        if (!v->codes_mapped) memcpy(v->codes + r * row_bytes, p + r * packed_cols, row_bytes);
    }
    return PARITY_OK;
}

int fp4_check_scales(const tensor_source *codes, const tensor_source *s, const expected *slot,
                     const fp4_scales *want) {
    const uint64_t grid_cols = (slot->cols + want->block - 1) / want->block;
    if (!s)
        return set_error(PARITY_ERR_SCALE_MISSING, "%s: %s (%s%s, %s)", codes->where,
                         want->missing, slot->name, want->suffix, want->stored);
    if (s->dtype != want->dtype)
        return set_error(PARITY_ERR_TENSOR_DTYPE, "%s: dtype %s, %s", s->where,
                         s->dtype_name ? s->dtype_name : "?", want->dtype_doc);
    const unsigned block = want->block;
    if (s->ndim != 2 || s->shape[0] != slot->rows || s->shape[1] != grid_cols)
        return set_error(PARITY_ERR_SCALE_GRID, "%s: shape [%" PRIu64 "%s%" PRIu64 "] is not the "
                         "1 x %u block grid [%u, %" PRIu64 "] of the %u x %u weight", s->where,
                         s->ndim ? s->shape[0] : 0, s->ndim == 2 ? ", " : "",
                         s->ndim == 2 ? s->shape[1] : 0, block, slot->rows, grid_cols, slot->rows,
                         slot->cols);
    if (!s->data) return set_error(PARITY_ERR_INVALID_ARGUMENT, "%s: data is NULL", s->where);
    return PARITY_OK;
}

int fp4_values(const tensor_source *codes, const expected *slot, uint64_t packed_cols,
               uint64_t block, float tensor_scale, const tensor_source *scales,
               float (*scale_of)(uint8_t), shipped_values *out) {
    const uint64_t grid = slot->rows * ((slot->cols + block - 1) / block);
    TRY(alloc_values(codes, scales, slot, packed_cols, grid, out));
    if (!out->scales_mapped) memcpy(out->scale_codes, scales->data, grid);
    const int rc = fill_codes(codes, slot, packed_cols, block, tensor_scale, scale_of, out);
    if (rc) shipped_values_free(out);
    return rc;
}

/* ---- saving ------------------------------------------------------------------------------- */

int fp4_plan(const weight *w, int gemm, int rule, uint64_t block, const char *layout_name,
             const char *scale_dtype, const char *scale_suffix, saved_tensor *v, saved_tensor *sc) {
    const uint64_t grid_cols = (w->cols + block - 1) / block;
    const quant_weight *q;
    if (w->shipped && w->shipped_gemm == gemm) {
        q = w->shipped;
    } else if (rule < 0) {
        return set_error(PARITY_ERR_INVALID_ARGUMENT, "layout %s: '%s' holds no shipped %s codes; "
                         "name the quantizer that makes them (%s:RULE)", layout_name, v->name,
                         gemm == PARITY_GEMM_NVFP4 ? "NVFP4" : "MXFP4", layout_name);
    } else {
        TRY(quant_weight_make(w, rule, w->rows * grid_cols, &v->made, "fp4 quantization"));
        q = &v->made;
    }
    v->kind = OUT_CODES;
    v->dtype = "U8";
    v->q = q;
    *sc = (saved_tensor){.w = w, .kind = OUT_SCALES, .q = q, .dtype = scale_dtype,
                         .bytes = w->rows * grid_cols};
    snprintf(sc->shape, sizeof sc->shape, "%u,%llu", w->rows, (unsigned long long)grid_cols);
    snprintf(sc->scale_name, sizeof sc->scale_name, "%s%s", v->name, scale_suffix);
    sc->name = sc->scale_name;
    return PARITY_OK;
}

int fp4_write(FILE *fp, const saved_tensor *t) {
    const weight *w = t->w;
    if (t->kind == OUT_SCALES) /* held as the file's bytes */
        return fwrite(t->q->scale_codes, 1, t->bytes, fp) == t->bytes;
    /* the held rows are the file's (NVFP4's, and MXFP4's when cols % 32 is 0 or 31) or are
     * padded to it */
    if (t->bytes == w->rows * held_row_bytes(w->cols))
        return fwrite(t->q->codes, 1, t->bytes, fp) == t->bytes;
    uint8_t *packed = px_malloc(t->bytes ? t->bytes : 1, "packed fp4 codes");
    if (!packed) return 0;
    fp4_pad_rows(t->q->codes, w->rows, w->cols, t->bytes / w->rows, packed);
    const int ok = fwrite(packed, 1, t->bytes, fp) == t->bytes;
    px_free(packed);
    return ok;
}
