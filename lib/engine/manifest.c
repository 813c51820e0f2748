/* Manifests: per-tensor checksums of the weights a policy reads (the values, or the codes and
 * scales of its quantized format: fp8-block, mxfp8, nvfp4, mxfp4, ternary), written as JSON
 * (parity_model_write_manifest_for), and their verification against a model, with a report of
 * every tensor that differs (parity_model_verify_for). */
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "base/alloc.h"
#include "base/errors.h"
#include "base/files.h"
#include "base/floats.h"
#include "checksum.h"
#include "checkpoint/json.h"
#include "checkpoint/layout.h"
#include "model/model.h"
#include "quant/rules.h"
#include "user_pool.h"

/* ---- manifests -------------------------------------------------------------------------- */

/* The checksum (manifest version `mv`) of a weight's held codes (quant_weight.h) one a byte,
 * as the quantizers write them: it does not depend on how they are packed. */
static uint64_t codes_checksum(uint32_t mv, const quant_format *f, const weight *w,
                               const uint8_t *held) {
    const size_t row_bytes = quant_weight_row_bytes(f, w->cols);
    checksum_stream s;
    checksum_begin(&s, mv);
    for (uint32_t r = 0; r < w->rows; r++)
        for (uint32_t c = 0; c < w->cols; c++)
            checksum_byte(&s, quant_code_at(f, held + r * row_bytes, c));
    return checksum_end(&s);
}

/* The checksum (manifest version `mv`) of n bytes. */
static uint64_t bytes_checksum(uint32_t mv, const void *data, uint64_t n) {
    const checksum_job job = {PARITY_DTYPE_F8_E4M3, data, n};
    return checksum_buffer(mv, &job);
}

/* ---- quantized weights in manifests -------------------------------------------------------- */

/* The codes a policy's GEMM reads for w: the shipped ones (`shipped`), the copy of `quantizer`
 * the model built, or (not built yet) a quantization of w's values made for the manifest into
 * *made, which the view frees. */
static int view_codes(const weight *w, int shipped, int quantizer, uint64_t scale_floats,
                      quant_weight *made, const quant_weight **q) {
    *q = shipped ? w->shipped : w->quant[quantizer];
    if (*q) return PARITY_OK;
    *q = made;
    return quant_weight_make(w, quantizer, scale_floats, made, "codes for a manifest");
}

/* The fp8 codes and scales a policy's GEMM reads for a weight, as a manifest describes them:
 * the shipped ones, the copy the model built, or (not built yet) a quantization of the
 * weight's values made for the manifest. */
typedef struct fp8_view {
    int mx;                 /* MXFP8: 1 x 32 blocks, E8M0 scales; else 128 x 128, fp32 */
    int shipped;            /* the shipped codes (no quantizer of the model's made them) */
    int quantizer;          /* the PARITY_FP8Q_* that made them (not shipped) */
    uint64_t grid_rows, grid_cols;
    const uint8_t *codes;
    const float *scales;
    uint8_t scale_dtype;    /* PARITY_DTYPE_F32 / _BF16 (shipped), or SCALE_E8M0 */
    quant_weight made;        /* owned when the view had to quantize */
} fp8_view;
#define SCALE_E8M0 0xe8u

static const char *scale_dtype_name(unsigned d) {
    return d == PARITY_DTYPE_BF16 ? "BF16" : d == SCALE_E8M0 ? "F8_E8M0" : "F32";
}

static void fp8_view_free(fp8_view *v) {
    px_free(v->made.codes);
    px_free(v->made.scales);
}

/* The view of w under gemm format `gemm` (PARITY_GEMM_FP8_BLOCK / _MXFP8) and `quantizer`. */
static int fp8_view_of(const weight *w, int gemm, int quantizer, fp8_view *v) {
    *v = (fp8_view){0};
    v->mx = gemm == PARITY_GEMM_MXFP8;
    v->grid_rows = v->mx ? w->rows : (w->rows + 127u) / 128u;
    v->grid_cols = v->mx ? (w->cols + 31u) / 32u : (w->cols + 127u) / 128u;
    v->quantizer = quantizer;
    v->scale_dtype = v->mx ? SCALE_E8M0 : PARITY_DTYPE_F32;
    v->shipped = w->shipped && w->shipped_gemm == gemm;
    if (v->shipped && !v->mx) v->scale_dtype = w->shipped_scale_dtype;
    const quant_weight *q;
    int rc = view_codes(w, v->shipped, quantizer, v->grid_rows * v->grid_cols, &v->made, &q);
    if (rc) return rc;
    v->codes = q->codes;
    v->scales = q->scales;
    return PARITY_OK;
}

static uint64_t view_codes_sum(uint32_t mv, const weight *w, const fp8_view *v) {
    return bytes_checksum(mv, v->codes, (uint64_t)w->rows * w->cols);
}
/* The scales' checksum: over their fp32 values' little-endian bytes (BF16 and E8M0 scales
 * widened exactly). */
static uint64_t view_scales_sum(uint32_t mv, const fp8_view *v) {
    return bytes_checksum(mv, v->scales, v->grid_rows * v->grid_cols * sizeof(float));
}

/* Whether the policy quantizes slot's weight (an fp8 gemm, a linear weight not kept in bf16). */
static int policy_quantizes(const parity_policy *pol, const expected *slot) {
    return pol && pol->gemm != PARITY_GEMM_BF16 && slot->linear && !slot->dst->keep_bf16;
}

static const char *format_name(int gemm) { return gemm == PARITY_GEMM_MXFP8 ? "mxfp8" : "fp8-block"; }

/* The values of a slot's weight where its entry reads them (its bf16 checksum, or codes made
 * from them): built now if the weight holds shipped codes alone, unless the entry is of those
 * codes' format `gemm` (PARITY_GEMM_BF16: a bf16 entry). */
static int entry_values(const parity_model *m, const expected *slot, int gemm) {
    const weight *w = slot->dst;
    if (!w->shipped || (gemm != PARITY_GEMM_BF16 && gemm == w->shipped_gemm))
        return PARITY_OK;
    return model_weight_values((parity_model *)m, slot->dst);
}

/* ---- 4-bit and ternary weights in manifests ------------------------------------------------
 * An entry: "dtype" "E2M1" (nvfp4, mxfp4) or "TERNARY", "format", "block" [1, 16], [1, 32] or
 * [rows, cols] (ternary: one scale for the tensor), "quantizer" (null: shipped codes),
 * "fnv1a64" over the codes one a byte, not as the model packs them (E2M1 in the low nibble,
 * ternary as int8), "scales" {"shape", "dtype" F8_E4M3 / F8_E8M0 / F32, "fnv1a64" over the
 * fp32 values: the block scales, ternary's s_w}, and NVFP4's "tensor_scale" s2 as its fp32 bits in hex. */

static int is_lowbit(int gemm) {
    const quant_format *f = quant_format_row((uint32_t)gemm);
    return f && f->element != QUANT_ELEMENT_E4M3;
}

typedef struct lowbit_view {
    int gemm, shipped, quantizer;
    uint64_t grid_rows, grid_cols, block_rows, block_cols;
    const uint8_t *codes;
    const float *scales;   /* grid_rows x grid_cols fp32 values (ternary: &tensor_scale) */
    float tensor_scale;
    quant_weight made;
    float *scale_values;   /* owned: the values of the held scale bytes (NVFP4, MXFP4), which
                              the manifest hashes, as it did when they were held as fp32 */
} lowbit_view;

static const char *lowbit_dtype(int gemm) { return gemm == PARITY_GEMM_TERNARY ? "TERNARY" : "E2M1"; }
static const char *lowbit_scale_dtype(int gemm) {
    return gemm == PARITY_GEMM_NVFP4 ? "F8_E4M3" : gemm == PARITY_GEMM_MXFP4 ? "F8_E8M0" : "F32";
}

static int lowbit_view_of(const weight *w, int gemm, int quantizer, lowbit_view *v) {
    *v = (lowbit_view){.gemm = gemm, .quantizer = quantizer};
    const uint64_t bc = gemm == PARITY_GEMM_NVFP4 ? 16 : 32;
    if (gemm == PARITY_GEMM_TERNARY) {
        v->grid_rows = v->grid_cols = 1;
        v->block_rows = w->rows, v->block_cols = w->cols;
    } else {
        v->grid_rows = w->rows, v->grid_cols = (w->cols + bc - 1) / bc;
        v->block_rows = 1, v->block_cols = bc;
    }
    v->shipped = w->shipped && w->shipped_gemm == gemm;
    const quant_weight *q;
    int rc = view_codes(w, v->shipped, quantizer, v->grid_rows * v->grid_cols, &v->made, &q);
    if (rc) return rc;
    v->codes = q->codes;
    v->tensor_scale = q->tensor_scale;
    if (gemm == PARITY_GEMM_TERNARY) {
        v->scales = &v->tensor_scale;
        return PARITY_OK;
    }
    const quant_format *f = quant_format_row((uint32_t)gemm);
    const uint64_t grid = v->grid_rows * v->grid_cols;
    v->scale_values = px_malloc((grid ? grid : 1) * sizeof(float), "manifest scales");
    if (!v->scale_values) {
        px_free(v->made.codes);
        px_free(v->made.scales);
        return PARITY_ERR_OUT_OF_MEMORY;
    }
    for (uint64_t i = 0; i < grid; i++) v->scale_values[i] = quant_weight_scale(f, q, i);
    v->scales = v->scale_values;
    return PARITY_OK;
}

static void lowbit_view_free(lowbit_view *v) {
    px_free(v->made.codes);
    px_free(v->made.scales);
    px_free(v->scale_values);
}

/* The view's checksums as the manifest writes them: codes, scales, tensor scale bits. */
static void lowbit_sums(uint32_t mv, const weight *w, const lowbit_view *v, char codes[17],
                        char scales[17], char tensor[9]) {
    snprintf(codes, 17, "%016" PRIx64,
             codes_checksum(mv, quant_format_row((uint32_t)v->gemm), w, v->codes));
    snprintf(scales, 17, "%016" PRIx64,
             bytes_checksum(mv, v->scales, v->grid_rows * v->grid_cols * 4));
    snprintf(tensor, 9, "%08" PRIx32, f32_bits(v->tensor_scale));
}

static void write_lowbit_entry(uint32_t mv, FILE *f, const weight *w, const lowbit_view *v) {
    char c[17], sc[17], t[9];
    lowbit_sums(mv, w, v, c, sc, t);
    fprintf(f, "], \"dtype\": \"%s\", \"format\": \"%s\", \"block\": [%" PRIu64 ", %" PRIu64 "], ",
            lowbit_dtype(v->gemm), quant_format_name((uint32_t)v->gemm), v->block_rows, v->block_cols);
    if (v->shipped) fprintf(f, "\"quantizer\": null, ");
    else fprintf(f, "\"quantizer\": \"%s\", ", parity_quantizer_name(v->quantizer));
    fprintf(f, "\"fnv1a64\": \"%s\", \"scales\": {\"shape\": [%" PRIu64 ", %" PRIu64 "], "
               "\"dtype\": \"%s\", \"fnv1a64\": \"%s\"}", c, v->grid_rows, v->grid_cols,
            lowbit_scale_dtype(v->gemm), sc);
    if (v->gemm == PARITY_GEMM_NVFP4) fprintf(f, ", \"tensor_scale\": \"%s\"", t);
    fprintf(f, "}");
}

/* The checksums (manifest version mv) of the bf16 values of the slots `want` marks into
 * sums[i], on the pool's threads; each slot's values made first where its weight holds shipped
 * codes alone. */
static int bf16_checksums(threadpool *pool, uint32_t mv, const parity_model *m,
                          const unsigned char *want, uint64_t *sums) {
    size_t n, k = 0;
    const expected *slots = model_tensors(m, &n);
    checksum_job *jobs = px_malloc((n ? n : 1) * (sizeof *jobs + sizeof(size_t) + 8), "checksums");
    if (!jobs) return PARITY_ERR_OUT_OF_MEMORY;
    size_t *slot_of = (size_t *)(jobs + (n ? n : 1));
    uint64_t *out = (uint64_t *)(slot_of + (n ? n : 1));
    int rc = PARITY_OK;
    for (size_t i = 0; i < n && !rc; i++) {
        if (!want[i] || (rc = entry_values(m, &slots[i], PARITY_GEMM_BF16))) continue;
        const weight *w = slots[i].dst;
        jobs[k] = (checksum_job){PARITY_DTYPE_BF16, w->bf16, (uint64_t)w->rows * w->cols};
        slot_of[k++] = i;
    }
    if (!rc) rc = checksum_buffers(pool, mv, jobs, k, out);
    for (size_t j = 0; j < k && !rc; j++) sums[slot_of[j]] = out[j];
    px_free(jobs);
    return rc;
}

static int manifest_write(threadpool *pool, const parity_model *m, const parity_policy *pol,
                          uint32_t mv, const char *path) {
    size_t n;
    const expected *slots = model_tensors(m, &n);
    const int quantized = pol && pol->gemm != PARITY_GEMM_BF16;
    /* the bf16 entries' checksums first, all on the pool */
    uint64_t *sums = px_malloc((n ? n : 1) * (sizeof *sums + 1), "manifest checksums");
    if (!sums) return PARITY_ERR_OUT_OF_MEMORY;
    unsigned char *want = (unsigned char *)(sums + (n ? n : 1));
    for (size_t i = 0; i < n; i++) want[i] = !policy_quantizes(pol, &slots[i]);
    int rc = bf16_checksums(pool, mv, m, want, sums);
    FILE *f = rc ? NULL : fopen(path, "w");
    if (!f) {
        px_free(sums);
        return rc ? rc : set_error(PARITY_ERR_IO, "%s: cannot create: %s", path, strerror(errno));
    }
    fprintf(f, "{\"version\": %" PRIu64 ", ", m->version);
    if (mv >= 2) fprintf(f, "\"manifest_version\": %u, ", mv);
    if (quantized)
        fprintf(f, "\"quantization\": {\"format\": \"%s\", \"quantizer\": \"%s\"}, ",
                quant_format_name(pol->gemm), parity_quantizer_name(pol->quantizer));
    fprintf(f, "\"tensors\": {");
    for (size_t i = 0; i < n && !rc; i++) {
        const weight *w = slots[i].dst;
        if ((rc = entry_values(m, &slots[i], policy_quantizes(pol, &slots[i]) ? pol->gemm
                                                                               : PARITY_GEMM_BF16)))
            break;
        fprintf(f, "%s\n  \"%s\": {\"shape\": [", i ? "," : "", slots[i].name);
        if (slots[i].rows) fprintf(f, "%u, %u", w->rows, w->cols);
        else fprintf(f, "%u", w->cols);
        if (!policy_quantizes(pol, &slots[i])) {
            fprintf(f, "], \"dtype\": \"BF16\", \"fnv1a64\": \"%016" PRIx64 "\"}", sums[i]);
            continue;
        }
        /* codes the model has not built are made from the masters, never their bf16 cast */
        if ((rc = weight_master_check(w, slots[i].name, "a quantized policy's manifest"))) break;
        if (is_lowbit(pol->gemm)) {
            lowbit_view lv;
            if ((rc = lowbit_view_of(w, pol->gemm, pol->quantizer, &lv))) break;
            write_lowbit_entry(mv, f, w, &lv);
            lowbit_view_free(&lv);
            continue;
        }
        fp8_view v;
        if ((rc = fp8_view_of(w, pol->gemm, pol->quantizer, &v))) break;
        fprintf(f, "], \"dtype\": \"F8_E4M3\", \"format\": \"%s\", \"block\": [%u, %u], ",
                format_name(pol->gemm), v.mx ? 1u : 128u, v.mx ? 32u : 128u);
        if (v.shipped) fprintf(f, "\"quantizer\": null, ");
        else fprintf(f, "\"quantizer\": \"%s\", ", parity_fp8_quantizer_name(v.quantizer));
        fprintf(f, "\"fnv1a64\": \"%016" PRIx64 "\", \"scales\": {\"shape\": [%" PRIu64 ", %" PRIu64
                   "], \"dtype\": \"%s\", \"fnv1a64\": \"%016" PRIx64 "\"}}",
                view_codes_sum(mv, w, &v), v.grid_rows, v.grid_cols,
                scale_dtype_name(v.scale_dtype), view_scales_sum(mv, &v));
        fp8_view_free(&v);
    }
    fprintf(f, "\n}}\n");
    if (fclose(f) != 0 && !rc) rc = set_error(PARITY_ERR_IO, "%s: write failed: %s", path, strerror(errno));
    px_free(sums);
    return rc;
}

int parity_model_write_manifest_on(parity_pool *pool, const parity_model *m,
                                   const parity_policy *pol, uint32_t manifest_version,
                                   const char *path) {
    clear_error();
    if (!m || !path) return set_error(PARITY_ERR_INVALID_ARGUMENT, "model or path is NULL");
    if (!checksum_version_known(manifest_version))
        return set_error(PARITY_ERR_INVALID_ARGUMENT, "parity_model_write_manifest_on: manifest "
                         "version %u; the library writes 1 and 2", manifest_version);
    int rc = pol ? parity_policy_validate(pol) : PARITY_OK;
    if (rc) return rc;
    threadpool *threads;
    TRY(user_pool_enter(pool, &threads, "parity_model_write_manifest_on"));
    if (!(rc = model_enter(m))) {
        rc = manifest_write(threads, m, pol, manifest_version, path);
        model_leave(m);
    }
    user_pool_leave(pool, threads);
    return rc;
}

int parity_model_write_manifest_for(const parity_model *m, const parity_policy *pol,
                                    const char *path) {
    return parity_model_write_manifest_on(NULL, m, pol, PARITY_MANIFEST_VERSION, path);
}

int parity_model_write_manifest(const parity_model *m, const char *path) {
    return parity_model_write_manifest_for(m, NULL, path);
}

/* Appends a line to the report; counts it. */
typedef struct report {
    char *buf;
    size_t size, used;
    unsigned count;
} report;

static void report_line(report *r, const char *fmt, ...) PARITY_PRINTF(2, 3);
static void report_line(report *r, const char *fmt, ...) {
    r->count++;
    if (!r->buf || r->used + 1 >= r->size) return;
    va_list ap;
    va_start(ap, fmt);
    int k = vsnprintf(r->buf + r->used, r->size - r->used, fmt, ap);
    va_end(ap);
    if (k < 0) return;
    r->used = r->used + (size_t)k < r->size ? r->used + (size_t)k : r->size - 1;
    if (r->used + 1 < r->size) {
        r->buf[r->used++] = '\n';
        r->buf[r->used] = '\0';
    }
}

static int read_manifest(const char *path, json_doc **doc) {
    char *text = NULL;
    size_t len = 0;
    int rc = read_file_capped(path, 256u << 20, PARITY_ERR_VERIFY, &text, &len);
    char err[256];
    if (!rc) {
        rc = json_parse(text, len, doc, err, sizeof err);
        if (rc == PARITY_ERR_JSON_SYNTAX) set_error(rc, "%s: %s", path, err);
    }
    px_free(text);
    return rc;
}

/* A string member of a manifest entry, NULL if absent or not a string. */
static const char *entry_str(const json_value *e, const char *key) {
    const json_value *v = json_get(e, key);
    return v && v->type == JSON_STRING ? v->str : NULL;
}

/* Whether `v` is the array [a, b] of integers. */
static int is_pair(const json_value *v, uint64_t a, uint64_t b) {
    return v && v->type == JSON_ARRAY && v->count == 2 && v->items[0].type == JSON_NUMBER &&
           v->items[0].is_int && (uint64_t)v->items[0].integer == a &&
           v->items[1].type == JSON_NUMBER && v->items[1].is_int && (uint64_t)v->items[1].integer == b;
}

/* The quantizer identity line: the sampler's rule is not the learner's; `same` whether the
 * learner's rule on the sampler's values gives the learner's codes (-1: not known). */
static void report_identity(report *r, const char *name, const char *sampler_rule,
                            const char *learner_rule, int same) {
    report_line(r, "%s: quantizer identity: the sampler quantizes its weights with '%s', the "
                "learner's codes were made with '%s'; %s", name, sampler_rule, learner_rule,
                same == 1   ? "re-quantized with the learner's rule, the sampler's values give the "
                              "learner's codes: only the quantizer differs"
                : same == 0 ? "even the learner's rule does not give its codes from the sampler's "
                              "values: the values differ too"
                            : "(out of memory re-quantizing)");
}

/* The codes and scales lines, for the checksums that differ: want_c / want_s are the
 * manifest's where they differ (its missing one: ""), NULL where they agree. */
static void report_differs(report *r, const char *name, const char *want_c, const char *have_c,
                           int shipped, const char *want_s, const char *have_s) {
    if (want_c)
        report_line(r, "%s: codes differ (manifest %s, sampler %s)%s", name,
                    *want_c ? want_c : "missing", have_c,
                    shipped ? ": the shipped codes are not the learner's"
                            : ": the values the sampler quantized differ");
    if (want_s)
        report_line(r, "%s: scales differ (manifest %s, sampler %s)", name,
                    *want_s ? want_s : "missing", have_s);
}

/* The checks of one F8_E4M3 manifest entry against the codes the sampler's policy (pol; NULL:
 * the entry's own format and quantizer) reads for the weight. */
static int verify_fp8_entry(uint32_t mv, const expected *slot, const json_value *e,
                            const parity_policy *pol, report *r) {
    const weight *w = slot->dst;
    const char *name = slot->name;
    const char *fmt = entry_str(e, "format"), *qname = entry_str(e, "quantizer");
    const int learner_mx = fmt && !strcmp(fmt, "mxfp8");
    int learner_q = -1;
    if (qname) parity_fp8_quantizer_from_name(learner_mx, qname, &learner_q);
    clear_error();
    if (w->keep_bf16 || (pol && pol->gemm == PARITY_GEMM_BF16)) {
        report_line(r, "%s: kept in bf16: the learner ships it quantized (F8_E4M3, %s), the sampler "
                    "runs it in bf16 (%s)", name, fmt ? fmt : "?",
                    w->keep_bf16 ? "the checkpoint's modules_to_not_convert"
                                 : "its policy has no fp8 gemm");
        return PARITY_OK;
    }
    const int gemm = pol ? pol->gemm : learner_mx ? PARITY_GEMM_MXFP8 : PARITY_GEMM_FP8_BLOCK;
    const int quantizer = pol ? pol->quantizer : learner_q;
    if (!pol && learner_q < 0 && !(w->shipped && w->shipped_gemm == gemm)) {
        report_line(r, "%s: quantizer %s%s%s is not one of the library's: the sampler cannot make "
                    "the learner's codes", name, qname ? "'" : "", qname ? qname : "null",
                    qname ? "'" : "");
        return PARITY_OK;
    }
    /* geometry: the format, the block and the scale grid */
    const json_value *scales = json_get(e, "scales");
    const json_value *sshape = scales ? json_get(scales, "shape") : NULL;
    const uint64_t gr = gemm == PARITY_GEMM_MXFP8 ? w->rows : (w->rows + 127u) / 128u,
                   gc = gemm == PARITY_GEMM_MXFP8 ? (w->cols + 31u) / 32u : (w->cols + 127u) / 128u;
    const int mx = gemm == PARITY_GEMM_MXFP8;
    if (!fmt || strcmp(fmt, format_name(gemm)) || !is_pair(json_get(e, "block"), mx ? 1 : 128, mx ? 32 : 128) ||
        !is_pair(sshape, gr, gc)) {
        const json_value *blk = json_get(e, "block");
        report_line(r, "%s: block geometry differs: the learner's %s blocks %lld x %lld with a "
                    "scale grid %lld x %lld, the sampler's %s blocks %u x %u with a grid %" PRIu64
                    " x %" PRIu64, name, fmt ? fmt : "?",
                    blk && blk->type == JSON_ARRAY && blk->count == 2 ? (long long)blk->items[0].integer : -1,
                    blk && blk->type == JSON_ARRAY && blk->count == 2 ? (long long)blk->items[1].integer : -1,
                    sshape && sshape->type == JSON_ARRAY && sshape->count == 2 ? (long long)sshape->items[0].integer : -1,
                    sshape && sshape->type == JSON_ARRAY && sshape->count == 2 ? (long long)sshape->items[1].integer : -1,
                    format_name(gemm), mx ? 1u : 128u, mx ? 32u : 128u, gr, gc);
        return PARITY_OK;
    }
    fp8_view v;
    int rc = fp8_view_of(w, gemm, quantizer < 0 ? 0 : quantizer, &v);
    if (rc) return rc;
    /* scale format: storage dtype, powers of two where the learner's rule makes them, finite
     * and positive */
    const char *want_dtype = scales ? entry_str(scales, "dtype") : NULL;
    uint64_t not_pow2 = 0, not_positive = 0;
    for (uint64_t i = 0; i < v.grid_rows * v.grid_cols; i++) {
        const float s = v.scales[i];
        if (!(isfinite(s) && s > 0)) not_positive++;
        else if (f32_bits(s) & 0x007fffffu) not_pow2++;
    }
    const int pow2_rule = learner_mx || learner_q == PARITY_FP8Q_TE_POW2;
    int format_bad = 0;
    if (!want_dtype || strcmp(want_dtype, scale_dtype_name(v.scale_dtype))) {
        report_line(r, "%s: scale format differs: the learner's scales are %s, the sampler's %s%s",
                    name, want_dtype ? want_dtype : "missing", scale_dtype_name(v.scale_dtype),
                    v.scale_dtype == PARITY_DTYPE_BF16 ? " (a cast of the scales the codes were "
                                                         "made with)" : "");
        format_bad = 1;
    }
    if (not_positive) {
        report_line(r, "%s: scale format: %" PRIu64 " of the sampler's scales are not finite and "
                    "positive", name, not_positive);
        format_bad = 1;
    }
    if (pow2_rule && not_pow2) {
        report_line(r, "%s: scale format: the learner's quantizer '%s' makes powers of two, %" PRIu64
                    " of the sampler's %" PRIu64 " scales are not", name, qname ? qname : "?",
                    not_pow2, v.grid_rows * v.grid_cols);
        format_bad = 1;
    }
    char have_c[17], have_s[17];
    snprintf(have_c, sizeof have_c, "%016" PRIx64, view_codes_sum(mv, w, &v));
    snprintf(have_s, sizeof have_s, "%016" PRIx64, view_scales_sum(mv, &v));
    const char *want_c = entry_str(e, "fnv1a64"), *want_s = scales ? entry_str(scales, "fnv1a64") : NULL;
    const int codes_ok = want_c && !strcmp(want_c, have_c), scales_ok = want_s && !strcmp(want_s, have_s);
    if (!format_bad && !(codes_ok && scales_ok)) {
        if (!v.shipped && learner_q >= 0 && v.quantizer != learner_q) {
            /* would the learner's rule on the sampler's values give the learner's codes? */
            fp8_view again;
            int same = -1;
            if (fp8_view_of(w, gemm, learner_q, &again) == PARITY_OK) {
                char c2[17], s2[17];
                snprintf(c2, sizeof c2, "%016" PRIx64, view_codes_sum(mv, w, &again));
                snprintf(s2, sizeof s2, "%016" PRIx64, view_scales_sum(mv, &again));
                same = !strcmp(c2, want_c) && want_s && !strcmp(s2, want_s);
                fp8_view_free(&again);
            }
            report_identity(r, name, parity_fp8_quantizer_name(v.quantizer), qname, same);
        } else {
            report_differs(r, name, codes_ok ? NULL : want_c ? want_c : "", have_c, v.shipped,
                           scales_ok ? NULL : want_s ? want_s : "", have_s);
        }
    }
    fp8_view_free(&v);
    return PARITY_OK;
}

/* The checks of one E2M1 or TERNARY manifest entry against the codes the sampler's policy (pol;
 * NULL: the entry's own format and quantizer) reads for the weight: geometry (format, block,
 * scale grid), scale format, then codes, scales and tensor scale, with the quantizer identity
 * check where the sampler quantizes with another rule. */
static int verify_lowbit_entry(uint32_t mv, const expected *slot, const json_value *e,
                               const parity_policy *pol, report *r) {
    const weight *w = slot->dst;
    const char *name = slot->name;
    const char *fmt = entry_str(e, "format"), *qname = entry_str(e, "quantizer");
    int learner_gemm = -1, learner_q = -1;
    for (int g = PARITY_GEMM_NVFP4; fmt && g <= PARITY_GEMM_TERNARY; g++)
        if (!strcmp(fmt, quant_format_name((uint32_t)g))) learner_gemm = g;
    if (qname && learner_gemm >= 0) parity_quantizer_from_name((uint32_t)learner_gemm, qname, &learner_q);
    clear_error();
    if (w->keep_bf16 || (pol && pol->gemm == PARITY_GEMM_BF16)) {
        report_line(r, "%s: kept in bf16: the learner ships it quantized (%s), the sampler runs it "
                    "in bf16 (%s)", name, fmt ? fmt : "?",
                    w->keep_bf16 ? "the checkpoint's modules_to_not_convert"
                                 : "its policy has no quantized gemm");
        return PARITY_OK;
    }
    const int gemm = pol ? (int)pol->gemm : learner_gemm;
    const int quantizer = pol ? pol->quantizer : learner_q;
    if (gemm < 0 || (!pol && learner_q < 0 && !(w->shipped && w->shipped_gemm == gemm))) {
        report_line(r, "%s: format %s / quantizer %s is not one of the library's: the sampler "
                    "cannot make the learner's codes", name, fmt ? fmt : "?", qname ? qname : "null");
        return PARITY_OK;
    }
    lowbit_view v;
    int rc = lowbit_view_of(w, gemm, quantizer >= 0                  ? quantizer
                                    : gemm == PARITY_GEMM_NVFP4 ? PARITY_QUANT_NVFP4_MODELOPT
                                    : gemm == PARITY_GEMM_MXFP4 ? PARITY_QUANT_MXFP4_OCP
                                                                : PARITY_QUANT_TERNARY_BITNET, &v);
    if (rc) return rc;
    const json_value *scales = json_get(e, "scales");
    const json_value *sshape = scales ? json_get(scales, "shape") : NULL;
    if (!is_lowbit(gemm) || learner_gemm != gemm || !is_pair(json_get(e, "block"), v.block_rows, v.block_cols) ||
        !is_pair(sshape, v.grid_rows, v.grid_cols)) {
        report_line(r, "%s: block geometry differs: the learner's %s, the sampler's %s blocks %"
                    PRIu64 " x %" PRIu64 " with a scale grid %" PRIu64 " x %" PRIu64, name,
                    fmt ? fmt : "?", quant_format_name((uint32_t)gemm) ? quant_format_name((uint32_t)gemm) : "?",
                    v.block_rows, v.block_cols, v.grid_rows, v.grid_cols);
        lowbit_view_free(&v);
        return PARITY_OK;
    }
    const char *want_dtype = scales ? entry_str(scales, "dtype") : NULL;
    if (!want_dtype || strcmp(want_dtype, lowbit_scale_dtype(gemm))) {
        report_line(r, "%s: scale format differs: the learner's scales are %s, the sampler's %s",
                    name, want_dtype ? want_dtype : "missing", lowbit_scale_dtype(gemm));
        lowbit_view_free(&v);
        return PARITY_OK;
    }
    char have_c[17], have_s[17], have_t[9];
    lowbit_sums(mv, w, &v, have_c, have_s, have_t);
    const char *want_c = entry_str(e, "fnv1a64"), *want_s = scales ? entry_str(scales, "fnv1a64") : NULL;
    /* NVFP4's s2 is a field of its own; ternary's s_w is its scales entry */
    const int nv = gemm == PARITY_GEMM_NVFP4;
    const char *want_t = nv ? entry_str(e, "tensor_scale") : NULL;
    const int codes_ok = want_c && !strcmp(want_c, have_c), scales_ok = want_s && !strcmp(want_s, have_s),
              tensor_ok = !nv || (want_t && !strcmp(want_t, have_t));
    if (!(codes_ok && scales_ok && tensor_ok)) {
        if (!v.shipped && learner_q >= 0 && v.quantizer != learner_q) {
            lowbit_view again;
            int same = -1;
            if (lowbit_view_of(w, gemm, learner_q, &again) == PARITY_OK) {
                char c2[17], s2[17], t2[9];
                lowbit_sums(mv, w, &again, c2, s2, t2);
                same = want_c && !strcmp(c2, want_c) && want_s && !strcmp(s2, want_s) &&
                       (!nv || (want_t && !strcmp(t2, want_t)));
                lowbit_view_free(&again);
            }
            report_identity(r, name, parity_quantizer_name(v.quantizer), qname, same);
        } else {
            report_differs(r, name, codes_ok ? NULL : want_c ? want_c : "", have_c, v.shipped,
                           scales_ok ? NULL : want_s ? want_s : "", have_s);
            if (!tensor_ok)
                report_line(r, "%s: tensor scale differs (manifest %s, sampler %s)", name,
                            want_t ? want_t : "missing", have_t);
        }
    }
    lowbit_view_free(&v);
    return PARITY_OK;
}

/* Whether entry e's "shape" is the slot's. */
static int entry_shape_ok(const expected *slot, const json_value *e) {
    const json_value *shape = json_get(e, "shape");
    const uint64_t want[2] = {slot->rows ? slot->dst->rows : slot->dst->cols, slot->dst->cols};
    const size_t ndim = slot->rows ? 2 : 1;
    int ok = shape && shape->type == JSON_ARRAY && shape->count == ndim;
    for (size_t d = 0; ok && d < ndim; d++)
        ok = shape->items[d].type == JSON_NUMBER && shape->items[d].is_int &&
             (uint64_t)shape->items[d].integer == want[d];
    return ok;
}

/* The manifest's own version (1 when it names none), 0 for one this library cannot read. */
static uint32_t manifest_version_of(const json_value *root) {
    const json_value *v = json_get(root, "manifest_version");
    if (!v) return 1;
    return v->type == JSON_NUMBER && v->is_int && checksum_version_known((uint64_t)v->integer)
               ? (uint32_t)v->integer
               : 0;
}

/* The checks of a manifest against a model (entered), on the pool's threads. */
static int verify_manifest(threadpool *pool, const parity_model *m, const parity_policy *pol,
                           const char *path, const json_value *root, report *r) {
    const json_value *tensors = json_get(root, "tensors"), *version = json_get(root, "version");
    if (!tensors || tensors->type != JSON_OBJECT || !version || version->type != JSON_NUMBER ||
        !version->is_int || version->integer < 0)
        return set_error(PARITY_ERR_VERIFY, "%s: not a manifest (wants {\"version\": N, "
                         "\"tensors\": {...}})", path);
    const uint32_t mv = manifest_version_of(root);
    if (!mv)
        return set_error(PARITY_ERR_VERIFY, "%s: \"manifest_version\" is not one this library "
                         "reads (1 or 2)", path);
    const json_value *quant = json_get(root, "quantization");
    const int learner_quantizes = quant && quant->type == JSON_OBJECT;
    size_t n;
    const expected *slots = model_tensors(m, &n);
    /* the checksums of the model's bf16 values that BF16 entries are compared with, first,
     * all on the pool */
    uint64_t *sums = px_malloc((n ? n : 1) * (sizeof *sums + 1), "manifest checksums");
    if (!sums) return PARITY_ERR_OUT_OF_MEMORY;
    unsigned char *want = (unsigned char *)(sums + (n ? n : 1));
    for (size_t i = 0; i < n; i++) {
        const json_value *e = json_get(tensors, slots[i].name);
        const char *dtype = e && e->type == JSON_OBJECT ? entry_str(e, "dtype") : NULL;
        want[i] = dtype && !strcmp(dtype, "BF16") && entry_shape_ok(&slots[i], e);
    }
    int rc = bf16_checksums(pool, mv, m, want, sums);
    if ((uint64_t)version->integer != m->version)
        report_line(r, "version: the manifest has %lld, the model %" PRIu64 " (a stale sync, or "
                    "one applied twice)", (long long)version->integer, m->version);
    for (size_t i = 0; i < n && !rc; i++) {
        const json_value *e = json_get(tensors, slots[i].name);
        if (!e || e->type != JSON_OBJECT) {
            report_line(r, "%s: in the model, not in the manifest", slots[i].name);
            continue;
        }
        const json_value *dtype = json_get(e, "dtype"), *sum = json_get(e, "fnv1a64");
        if (!entry_shape_ok(&slots[i], e)) {
            report_line(r, "%s: shape differs (the model has %s)", slots[i].name,
                        slots[i].shape_doc);
            continue;
        }
        const int f8 = dtype && dtype->type == JSON_STRING && !strcmp(dtype->str, "F8_E4M3");
        const int lowbit = dtype && dtype->type == JSON_STRING &&
                           (!strcmp(dtype->str, "E2M1") || !strcmp(dtype->str, "TERNARY"));
        /* the entry's codes are of the policy's format, else of the format the entry names */
        const char *entry_fmt = entry_str(e, "format");
        int gemm = (f8 || lowbit) && pol ? pol->gemm : PARITY_GEMM_BF16;
        for (int g = PARITY_GEMM_FP8_BLOCK; !pol && (f8 || lowbit) && g <= PARITY_GEMM_TERNARY; g++)
            if (entry_fmt && !strcmp(entry_fmt, quant_format_name((uint32_t)g))) gemm = g;
        if ((rc = entry_values(m, &slots[i], gemm))) break;
        if ((f8 || lowbit) && slots[i].linear && pol && (is_lowbit(pol->gemm) != lowbit) &&
            pol->gemm != PARITY_GEMM_BF16) {
            report_line(r, "%s: format differs: the learner ships %s codes (%s), the sampler's "
                        "policy reads %s", slots[i].name, dtype->str,
                        entry_str(e, "format") ? entry_str(e, "format") : "?",
                        quant_format_name(pol->gemm));
            continue;
        }
        if ((f8 || lowbit) && slots[i].linear && slots[i].dst->master_dropped &&
            !slots[i].dst->keep_bf16 && !(pol && pol->gemm == PARITY_GEMM_BF16)) {
            /* the codes would be quantized from the bf16 cast standing for dropped masters */
            report_line(r, "%s: fp32 masters: the learner ships %s codes (%s) quantized from "
                        "fp32 masters, and the sampler holds only their bf16 cast (the update "
                        "kept no master: PARITY_MASTERS_WHERE_READ): it cannot make the "
                        "learner's codes, none compared", slots[i].name, dtype->str,
                        entry_fmt ? entry_fmt : "?");
            continue;
        }
        if (f8 && slots[i].linear) {
            rc = verify_fp8_entry(mv, &slots[i], e, pol, r);
            continue;
        }
        if (lowbit && slots[i].linear) {
            rc = verify_lowbit_entry(mv, &slots[i], e, pol, r);
            continue;
        }
        if (!dtype || dtype->type != JSON_STRING || strcmp(dtype->str, "BF16")) {
            report_line(r, "%s: dtype is %s in the manifest, BF16 in the model", slots[i].name,
                        dtype && dtype->type == JSON_STRING ? dtype->str : "missing");
            continue;
        }
        if (learner_quantizes && policy_quantizes(pol, &slots[i])) {
            report_line(r, "%s: kept in bf16: the learner keeps it in bf16, the sampler's policy "
                        "quantizes it (%s:%s)", slots[i].name, quant_format_name(pol->gemm),
                        parity_quantizer_name(pol->quantizer));
            continue;
        }
        char have[17];
        snprintf(have, sizeof have, "%016" PRIx64, sums[i]);
        if (!sum || sum->type != JSON_STRING || strcmp(sum->str, have))
            report_line(r, "%s: checksum differs (manifest %s, model %s): the values differ",
                        slots[i].name, sum && sum->type == JSON_STRING ? sum->str : "missing", have);
    }
    for (size_t k = 0; k < tensors->count && !rc; k++)
        if (!model_find_tensor(m, tensors->keys[k]))
            report_line(r, "%s: in the manifest, not in the model", tensors->keys[k]);
    px_free(sums);
    return rc;
}

int parity_model_verify_on(parity_pool *pool, const parity_model *m, const parity_policy *pol,
                           const char *path, char *report_buf, size_t report_size) {
    clear_error();
    if (!m || !path)
        return set_error(PARITY_ERR_INVALID_ARGUMENT, "model or manifest path is NULL");
    int rc = pol ? parity_policy_validate(pol) : PARITY_OK;
    if (rc) return rc;
    if (report_buf && report_size) report_buf[0] = '\0';
    json_doc *doc;
    TRY(read_manifest(path, &doc));
    threadpool *threads = NULL;
    report r = {report_buf, report_size, 0, 0};
    if (!(rc = user_pool_enter(pool, &threads, "parity_model_verify_on"))) {
        if (!(rc = model_enter(m))) {
            rc = verify_manifest(threads, m, pol, path, json_doc_root(doc), &r);
            model_leave(m);
        }
        user_pool_leave(pool, threads);
    }
    json_free(doc);
    if (rc) return rc;
    if (r.count)
        return set_error(PARITY_ERR_VERIFY, "%u difference%s between the model and %s", r.count,
                         r.count == 1 ? "" : "s", path);
    return PARITY_OK;
}

int parity_model_verify_for(const parity_model *m, const parity_policy *pol, const char *path,
                            char *report_buf, size_t report_size) {
    return parity_model_verify_on(NULL, m, pol, path, report_buf, report_size);
}

int parity_model_verify(const parity_model *m, const char *path, char *report_buf,
                        size_t report_size) {
    return parity_model_verify_for(m, NULL, path, report_buf, report_size);
}
