/* The public calls that list a model's tensors (parity_model_tensor_name) and read them by
 * checkpoint name (parity_model_weight_info, parity_model_weight_values,
 * parity_model_weight_codes), and the one that gives a quantized weight codes as a checkpoint
 * would ship them (parity_model_set_quantized): what bench/parity-quant-check compares and
 * substitutes, and what parity.torch.CausalLM reads its parameters from. */
#include <inttypes.h>
#include <math.h>

#include "base/alloc.h"
#include "base/errors.h"
#include "base/floats.h"
#include "checkpoint/layout.h"
#include "model/model.h"
#include "model/weights.h"
#include "quant/codecs.h"
#include "quant/rules.h"

/* The table entry of `name` for call `fn`: NULL arguments and unknown names refused. */
static int find_tensor(const char *fn, const parity_model *m, const char *name,
                       const expected **out) {
    if (!m || !name) return set_error(PARITY_ERR_INVALID_ARGUMENT, "%s: model or name is NULL", fn);
    if (!(*out = model_find_tensor(m, name)))
        return set_error(PARITY_ERR_TENSOR_UNEXPECTED, "%s: the model has no tensor '%s'", fn,
                         name);
    return PARITY_OK;
}

/* A buffer of `have` elements where `want` are needed. */
static int check_count(const char *fn, const char *name, const char *what, const void *buffer,
                       uint64_t have, uint64_t want) {
    if (!buffer) return set_error(PARITY_ERR_INVALID_ARGUMENT, "%s: %s is NULL", fn, what);
    if (have != want)
        return set_error(PARITY_ERR_INVALID_ARGUMENT, "%s: '%s' has %" PRIu64 " %s, not %" PRIu64,
                         fn, name, want, what, have);
    return PARITY_OK;
}

const char *parity_model_tensor_name(const parity_model *m, size_t index) {
    if (!m) return NULL;
    size_t n;
    const expected *e = model_tensors(m, &n);
    return index < n ? e[index].name : NULL;
}

int parity_model_weight_info(const parity_model *m, const char *name, parity_weight_info *info) {
    clear_error();
    const expected *e;
    TRY(find_tensor("parity_model_weight_info", m, name, &e));
    if (!info || info->size != sizeof *info)
        return set_error(PARITY_ERR_INVALID_ARGUMENT, "parity_model_weight_info: info is NULL "
                         "or its size is not sizeof(parity_weight_info) = %zu", sizeof *info);
    TRY(model_enter(m));
    const weight *w = e->dst;
    *info = (parity_weight_info){
        .size = sizeof *info,
        .ndim = e->rows ? 2 : 1,
        .shape = {e->rows ? e->rows : e->cols, e->rows ? e->cols : 1},
        /* shipped codes dequantize to an fp32 master and its bf16 rounding, whether or not
         * a reader has asked for them yet (model_weight_values) */
        .has_master = w->master != NULL || (w->shipped && !w->bf16),
        .quantized = e->linear && !w->keep_bf16,
    };
    model_leave(m);
    return PARITY_OK;
}

int parity_model_weight_values(const parity_model *m, const char *name, float *values,
                               uint64_t n_values) {
    clear_error();
    const char *fn = "parity_model_weight_values";
    const expected *e;
    TRY(find_tensor(fn, m, name, &e));
    const weight *w = e->dst;
    const uint64_t n = (uint64_t)w->rows * w->cols;
    TRY(check_count(fn, name, "values", values, n_values, n));
    TRY(model_enter(m));
    /* the masters, never the bf16 cast standing for masters an update dropped; a weight
     * holding shipped codes alone makes its dequantized values first */
    int rc = weight_master_check(w, name, fn);
    if (!rc) rc = model_weight_values((parity_model *)m, (weight *)w);
    if (!rc && w->master) memcpy(values, w->master, n * sizeof *values);
    else if (!rc) weight_widen_into(w, values);
    model_leave(m);
    return rc;
}

/* The checks both quantized-weight calls share: a linear weight, codes and scales of the
 * counts a quantizer of format f lays out. */
static int check_codes(const char *fn, const char *name, const expected *e, const quant_format *f,
                       const void *codes, uint64_t n_codes, const void *scales,
                       uint64_t n_scales) {
    if (!e->linear)
        return set_error(PARITY_ERR_INVALID_ARGUMENT, "%s: '%s' is not a decoder layer's linear "
                         "weight: no quantized gemm reads it", fn, name);
    const weight *w = e->dst;
    TRY(check_count(fn, name, "codes", codes, n_codes, (uint64_t)w->rows * w->cols));
    return check_count(fn, name, "scales", scales, n_scales,
                       quant_scale_count(f, w->rows, w->cols) + 1);
}

/* A weight's held codes (quant_weight.h) into `codes`, one a byte, row by row. */
static void codes_unpack(const quant_format *f, const weight *w, const uint8_t *held,
                         uint8_t *codes) {
    const size_t row_bytes = quant_weight_row_bytes(f, w->cols);
    for (uint32_t r = 0; r < w->rows; r++)
        quant_codes_unpack_row(f, held + r * row_bytes, w->cols, codes + (uint64_t)r * w->cols);
}

/* The grid block scales of q as the fp32 values they mean (the API's form). */
static void scale_values(const quant_format *f, const quant_weight *q, uint64_t grid,
                         float *scales) {
    for (uint64_t i = 0; i < grid; i++) scales[i] = quant_weight_scale(f, q, i);
}

int parity_model_weight_codes(const parity_model *m, const char *name, int quantizer,
                              uint8_t *codes, uint64_t n_codes, float *scales,
                              uint64_t n_scales) {
    clear_error();
    const char *fn = "parity_model_weight_codes";
    const expected *e;
    TRY(find_tensor(fn, m, name, &e));
    const quant_rule *rule = quant_rule_of(quantizer);
    if (!rule) return set_error(PARITY_ERR_POLICY, "%s: quantizer %d is not defined", fn, quantizer);
    TRY(check_codes(fn, name, e, rule->format, codes, n_codes, scales, n_scales));
    const weight *w = e->dst;
    const uint64_t grid = n_scales - 1;
    TRY(model_enter(m));
    int rc = PARITY_OK;
    if (w->shipped && w->shipped_gemm == rule->format->gemm) {
        codes_unpack(rule->format, w, w->shipped->codes, codes);
        scale_values(rule->format, w->shipped, grid, scales);
        scales[grid] = w->shipped->tensor_scale;
    } else if (!(rc = weight_master_check(w, name, fn)) &&
               !(rc = model_weight_values((parity_model *)m, (weight *)w))) {
        /* the rule quantizes the weight's values (dequantized first from codes of another
         * format) */
        quant_weight made;
        rc = quant_weight_make(w, quantizer, grid, &made, "a weight's codes");
        if (!rc) {
            codes_unpack(rule->format, w, made.codes, codes);
            scale_values(rule->format, &made, grid, scales);
            scales[grid] = made.tensor_scale;
            px_free(made.codes);
            px_free(made.scales);
        }
    }
    /* a format without blocks keeps no block scale: its slot reads 0 */
    if (!rc && !rule->format->block_cols) scales[0] = 0.0f;
    model_leave(m);
    return rc;
}

/* ---- parity_model_set_quantized ------------------------------------------------------------- */

/* Whether `code` is one of element kind `element`'s codes. */
static int is_code(uint8_t element, uint8_t code) {
    return element == QUANT_ELEMENT_E4M3   ? (code & 0x7fu) != 0x7fu
           : element == QUANT_ELEMENT_E2M1 ? code <= 0x0fu
                                           : code <= 1u || code == 0xffu;
}

/* Whether a scale stored as `kind` (QUANT_SCALE_*) holds the fp32 value s; `zero_ok` admits 0. */
static int holds_scale(uint8_t kind, float s, int zero_ok) {
    if (!isfinite(s) || signbit(s) || (s == 0.0f && !zero_ok)) return 0;
    switch (kind) {
    case QUANT_SCALE_E4M3:
        return f32_bits(e4m3_to_f32(e4m3_from_f32_saturating(s))) == f32_bits(s);
    case QUANT_SCALE_E8M0:
        return s > 0.0f && ilogbf(s) >= -127 && ilogbf(s) <= 127 &&
               ldexpf(1.0f, ilogbf(s)) == s;
    case QUANT_SCALE_BF16:
        return f32_bits(round_bf16(s)) == f32_bits(s);
    default:
        return 1;
    }
}

static const char *scale_kind_name(uint8_t kind) {
    return kind == QUANT_SCALE_E4M3   ? "an E4M3 value"
           : kind == QUANT_SCALE_E8M0 ? "a power of two in [2^-127, 2^127]"
           : kind == QUANT_SCALE_BF16 ? "a bf16 value"
                                      : "finite";
}

/* The codes and scales of format f as a checkpoint of the format could hold them, the scales
 * stored in `dtype` where the format lets it choose. */
static int check_shipped(const char *fn, const char *name, const quant_format *f, uint64_t n,
                         const uint8_t *codes, uint64_t grid, const float *scales,
                         uint32_t dtype) {
    for (uint64_t i = 0; i < n; i++)
        if (!is_code(f->element, codes[i]))
            return set_error(PARITY_ERR_INVALID_ARGUMENT, "%s: '%s': code %" PRIu64 " (0x%02x) "
                             "is not a %s code", fn, name, i, codes[i], f->name);
    const int bf16 = dtype == PARITY_DTYPE_BF16;
    if (f->block_cols) { /* block scales: fp8-block's F32 (or BF16), E4M3, E8M0 */
        const uint8_t kind = f->block_scale == QUANT_SCALE_F32 && bf16 ? QUANT_SCALE_BF16
                                                                       : f->block_scale;
        for (uint64_t i = 0; i < grid; i++)
            if (!holds_scale(kind, scales[i], kind == QUANT_SCALE_E4M3))
                return set_error(PARITY_ERR_SCALE_VALUE, "%s: '%s': block scale %" PRIu64
                                 " (%g) is not %s%s", fn, name, i, (double)scales[i],
                                 scale_kind_name(kind), kind == QUANT_SCALE_E4M3 ? " >= 0"
                                                                                 : " > 0");
    }
    if (f->has_tensor_scale) { /* NVFP4's s2 (0 for an all-zero weight), ternary's s_w */
        const int ternary = f->element == QUANT_ELEMENT_TERNARY;
        const uint8_t kind = ternary && bf16 ? QUANT_SCALE_BF16 : QUANT_SCALE_F32;
        if (!holds_scale(kind, scales[grid], !ternary))
            return set_error(PARITY_ERR_SCALE_VALUE, "%s: '%s': the tensor scale (%g) is not %s "
                             "and %s", fn, name, (double)scales[grid], scale_kind_name(kind),
                             ternary ? "positive" : ">= 0");
    }
    return PARITY_OK;
}

/* What a checkpoint of format f records as its scales' dtype (the loader's values). */
static uint8_t shipped_scale_dtype_of(const quant_format *f, uint32_t dtype) {
    return f->gemm == PARITY_GEMM_NVFP4 ? PARITY_DTYPE_F8_E4M3 : (uint8_t)dtype;
}

int parity_model_set_quantized(parity_model *m, const char *name, uint32_t gemm,
                               const uint8_t *codes, uint64_t n_codes, const float *scales,
                               uint64_t n_scales, uint32_t scale_dtype) {
    clear_error();
    const char *fn = "parity_model_set_quantized";
    const expected *e;
    TRY(find_tensor(fn, m, name, &e));
    const quant_format *f = quant_format_row(gemm);
    if (!f)
        return set_error(PARITY_ERR_INVALID_ARGUMENT, "%s: gemm %u is not a quantized format "
                         "(PARITY_GEMM_FP8_BLOCK .. PARITY_GEMM_TERNARY)", fn, gemm);
    const int dtype_choice = f->block_scale == QUANT_SCALE_F32 || f->element == QUANT_ELEMENT_TERNARY;
    if (scale_dtype != PARITY_DTYPE_F32 && !(scale_dtype == PARITY_DTYPE_BF16 && dtype_choice))
        return set_error(PARITY_ERR_INVALID_ARGUMENT, "%s: scale_dtype %u: %s scales are given "
                         "as PARITY_DTYPE_F32%s", fn, scale_dtype, f->name,
                         dtype_choice ? " or PARITY_DTYPE_BF16" : "");
    TRY(check_codes(fn, name, e, f, codes, n_codes, scales, n_scales));
    weight *w = e->dst;
    if (w->keep_bf16)
        return set_error(PARITY_ERR_INVALID_ARGUMENT, "%s: '%s' is kept in bf16 by the "
                         "checkpoint (modules_to_not_convert): no policy reads codes for it",
                         fn, name);
    const uint64_t grid = n_scales - 1;
    TRY(check_shipped(fn, name, f, n_codes, codes, grid, scales, scale_dtype));
    /* the new codes; then, under the exclusive lock (so that no scorer or sampler prepares a
     * quantizer meanwhile), the copies the prepared quantizers of a format whose shipped codes
     * go read from then on and room in the owned list: everything the swap needs */
    quant_weight *q = px_calloc(1, sizeof *q, "set codes");
    uint8_t *c = q ? px_huge_alloc(quant_weight_code_bytes(f, w->rows, w->cols), "set codes") : NULL;
    /* the scales as f holds them: fp32, or bytes (check_shipped found each an exact value of
     * the format's scale type, which quant_scale_byte holds) */
    void *s = c ? px_huge_alloc(quant_weight_scale_bytes(f, w->rows, w->cols), "set scales")
                : NULL;
    int rc = s ? PARITY_OK : PARITY_ERR_OUT_OF_MEMORY, locked = 0;
    if (!rc && pthread_rwlock_trywrlock(&m->use_lock) != 0)
        rc = set_error(PARITY_ERR_BUSY, "%s: a scorer or sampler of this model is inside a call: "
                       "codes can only be set while no call runs", fn);
    else if (!rc)
        locked = 1;
    quant_weight *fresh[QUANTIZERS] = {0};
    float *scratch = NULL;
    /* the weight's values stay what they were: dequantized from the codes it held before, if
     * no reader had made them yet (the copies below quantize them) */
    if (!rc) rc = model_weight_values(m, w);
    if (!rc) rc = quant_copies_unshipped(m, w, (int)gemm, fresh, &scratch);
    if (!rc && !model_reserve_owned(m, 3)) rc = PARITY_ERR_OUT_OF_MEMORY;
    if (rc) {
        for (int k = 0; k < QUANTIZERS; k++)
            if (fresh[k]) { /* unused copies leave the model's list again */
                model_disown(m, fresh[k]->codes);
                model_disown(m, fresh[k]->scales);
                model_disown(m, fresh[k]);
            }
        if (locked) pthread_rwlock_unlock(&m->use_lock);
        px_free(scratch), px_free(q), px_free(c), px_free(s);
        return rc;
    }
    const size_t row_bytes = quant_weight_row_bytes(f, w->cols);
    for (uint32_t r = 0; r < w->rows; r++)
        quant_codes_pack_row(f, codes + (uint64_t)r * w->cols, w->cols, c + r * row_bytes);
    q->codes = model_own(m, c);
    q->scales = model_own(m, s);
    if (f->scale_bytes == 1)
        for (uint64_t i = 0; i < grid; i++) q->scale_codes[i] = quant_scale_byte(f, scales[i]);
    else
        memcpy(q->scales, scales, grid * sizeof *scales);
    q->tensor_scale = f->has_tensor_scale ? scales[grid] : 0.0f;
    if (w->shipped) {
        model_disown(m, w->shipped->codes);
        model_disown(m, w->shipped->scales);
        model_disown(m, w->shipped);
    }
    quant_copies_install(w, fresh, scratch);
    px_free(scratch);
    w->shipped = model_own(m, q);
    w->shipped_gemm = (uint8_t)gemm;
    w->shipped_scale_dtype = shipped_scale_dtype_of(f, scale_dtype);
    m->version++;
    pthread_rwlock_unlock(&m->use_lock);
    return PARITY_OK;
}
