/* Weight updates from a learner (parity_model_update: values, or block-FP8 codes and scales),
 * the model's version, and a probe of log-probs checking that they arrived intact. The
 * manifests of per-tensor checksums are manifest.c's. */
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "base/alloc.h"
#include "base/errors.h"
#include "base/floats.h"
#include "checkpoint/json.h"
#include "checkpoint/layout_fp8_block.h"
#include "model/model.h"
#include "model/weights.h"
#include "sampling.h"
#include "user_pool.h"

uint64_t parity_model_version(const parity_model *m) {
    if (!m) return 0;
    if (pthread_rwlock_rdlock((pthread_rwlock_t *)&m->use_lock) != 0) return m->version;
    uint64_t v = m->version;
    pthread_rwlock_unlock((pthread_rwlock_t *)&m->use_lock);
    return v;
}

/* ---- updates -------------------------------------------------------------------------------- */

/* A checked tensor waiting to go in. Values (BF16, F16 or F32) are cast into the buffers the
 * weight holds where the model owns them (a cast or copy from loading, a synthetic model's, an
 * earlier update's), else into new ones allocated before anything changes (bf16_new for a
 * weight read from a mapped checkpoint or held as codes alone, master_new for F16/F32 values
 * where the model owns no master yet, unless PARITY_MASTERS_WHERE_READ drops it: drop_master);
 * the casts run once no call runs. An F8_E4M3 update
 * (ship) brings its codes and scales (sv) and their dequantized values (master, bf16) in new
 * buffers: the values go in where the weight holds values when the update commits (a reader
 * asked for them), else they are dropped and the weight holds the codes alone; its
 * weight_scale_inv entry is not a tensor of its own (scale_entry). */
typedef struct staged {
    weight *w;
    int scan;                             /* values, their format checked: scanned and cast */
    tensor_source src;
    uint16_t *bf16_new;
    float *master_new;
    int drop_master;                      /* F16/F32 values cast to bf16, no master kept */
    int scale_entry;
    int ship;
    shipped_values sv;
    float *master;
    uint16_t *bf16;
    quant_weight *shipped;                /* the struct for w->shipped where w has none yet */
    quant_weight *quant_new[QUANTIZERS]; /* copies a weight leaving its shipped codes needs */
} staged;

/* The index of the update named `name`, or n. */
static size_t find_update(const parity_tensor_data *t, size_t n, const char *name) {
    for (size_t i = 0; i < n; i++)
        if (t[i].name && !strcmp(t[i].name, name)) return i;
    return n;
}

static const char SCALE_SUFFIX[] = "_scale_inv";

/* Whether `name` is "<weight>_scale_inv"; the weight's name into base. */
static int scale_base(const char *name, char *base, size_t size) {
    const size_t n = strlen(name), k = sizeof SCALE_SUFFIX - 1;
    if (n <= k || strcmp(name + n - k, SCALE_SUFFIX) || n - k >= size) return 0;
    memcpy(base, name, n - k);
    base[n - k] = '\0';
    return 1;
}

/* Checks and converts update i of an F8_E4M3 weight with its scales (the entry named
 * "<name>_scale_inv" in the same update). */
static int stage_shipped(parity_model *m, const parity_tensor_data *tensors, size_t n, size_t i,
                         const expected *slot, const char *where, staged *st) {
    const parity_tensor_data *t = &tensors[i];
    weight *w = slot->dst;
    if (!slot->linear || w->keep_bf16)
        return set_error(PARITY_ERR_TENSOR_DTYPE, "%s: F8_E4M3 codes for a tensor that %s", where,
                         slot->linear ? "the checkpoint keeps in bf16 (modules_to_not_convert)"
                                      : "is not a decoder layer's linear weight (only those are "
                                        "quantized)");
    char sname[160], swhere[192];
    snprintf(sname, sizeof sname, "%s%s", t->name, SCALE_SUFFIX);
    snprintf(swhere, sizeof swhere, "update of '%s'", sname);
    const size_t k = find_update(tensors, n, sname);
    const tensor_source codes = {where, t->dtype, "F8_E4M3", t->ndim, t->shape, t->data, 0};
    tensor_source scales = {0};
    if (k < n)
        scales = (tensor_source){swhere, tensors[k].dtype, NULL, tensors[k].ndim, tensors[k].shape,
                                 tensors[k].data, 0};
    int rc = shipped_import(&codes, k < n ? &scales : NULL, slot, m->ckpt.scale_ue8m0, &st->sv);
    if (rc) return rc;
    st->ship = 1;
    const uint64_t count = (uint64_t)slot->rows * slot->cols;
    st->master = px_huge_alloc(count * 4, "dequantized weights (fp32)");
    st->bf16 = st->master ? px_huge_alloc(count * 2, "dequantized weights (bf16)") : NULL;
    if (!st->bf16) return PARITY_ERR_OUT_OF_MEMORY;
    quant_weight imported = {.codes = st->sv.codes, .scales = st->sv.scales};
    const weight shipped = {.rows = slot->rows, .cols = slot->cols, .shipped = &imported,
                            .shipped_gemm = PARITY_GEMM_FP8_BLOCK};
    shipped_dequantize(&shipped, st->master, st->bf16);
    /* a model an fp16 policy reads must be able to hold the dequantized values in fp16 */
    for (uint64_t j = 0; w->fp16 && j < count; j++)
        if (isinf(round_fp16(st->master[j])))
            return set_error(PARITY_ERR_TENSOR_NONFINITE, "%s: element %" PRIu64 " dequantizes to "
                             "%g, beyond fp16's range, which the fp16 policy cannot hold", where, j,
                             (double)st->master[j]);
    if (!w->shipped && !(st->shipped = px_calloc(1, sizeof *st->shipped, "fp8 weight")))
        return PARITY_ERR_OUT_OF_MEMORY;
    return PARITY_OK;
}

/* Frees what an update that failed staged for st; the quantized copies it made (owned by the
 * model, never installed) go too. */
static void staged_free(parity_model *m, staged *st) {
    shipped_values_free(&st->sv);
    px_free(st->master);
    px_free(st->bf16);
    px_free(st->shipped);
    px_free(st->bf16_new);
    px_free(st->master_new);
    for (int q = 0; q < QUANTIZERS; q++)
        if (st->quant_new[q]) {
            model_disown(m, st->quant_new[q]->codes);
            model_disown(m, st->quant_new[q]->scales);
            model_disown(m, st->quant_new[q]);
        }
}

/* Shipped codes into the weight (buffers taken over by the model; room reserved), with their
 * values where the weight held values (else it holds the codes alone, as loaded). */
static void commit_shipped(parity_model *m, staged *st) {
    weight *w = st->w;
    const int held_values = w->bf16 != NULL;
    model_disown(m, w->bf16);
    model_disown(m, w->master);
    if (w->shipped) {
        model_disown(m, w->shipped->codes);
        model_disown(m, w->shipped->scales);
    } else {
        w->shipped = model_own(m, st->shipped);
        st->shipped = NULL;
    }
    w->shipped->codes = model_own(m, st->sv.codes);
    w->shipped->scales = model_own(m, st->sv.scales);
    w->master = held_values ? model_own(m, st->master) : NULL;
    w->bf16 = held_values ? model_own(m, st->bf16) : NULL;
    if (!held_values) {
        px_free(st->master);
        px_free(st->bf16);
    }
    st->master = NULL;
    st->bf16 = NULL;
    w->shipped_gemm = PARITY_GEMM_FP8_BLOCK;
    w->shipped_scale_dtype = st->sv.scale_dtype;
    w->master_dropped = 0; /* its values are the codes' from now on */
    st->sv = (shipped_values){0};
}

/* The staged tensors' values cut into ranges of at most RANGE_VALUES, the tasks of the scan
 * for finiteness and of the casts on the pool: a tensor's ranges spread over every worker (the
 * embedding is a quarter of a 0.6B model's values), and the first write of a new buffer's
 * pages, where the cost of a first update lies, is shared by the workers too. */
enum { RANGE_VALUES = 1 << 20 };

typedef struct value_range {
    size_t tensor;
    uint64_t begin, count;
} value_range;

typedef struct staged_run {
    staged *st;
    const value_range *ranges;
    unsigned char *finite;  /* the scan: 1 where all the range's values are finite */
} staged_run;

static uint64_t staged_count(const staged *st) { return (uint64_t)st->w->rows * st->w->cols; }

/* The source's values from value `begin` on. */
static tensor_source source_from(const tensor_source *src, uint64_t begin) {
    tensor_source at = *src;
    at.data = (const uint8_t *)src->data + begin * (src->dtype == PARITY_DTYPE_F32 ? 4 : 2);
    return at;
}

static void scan_ranges(void *ctx, size_t begin, size_t end, unsigned worker) {
    (void)worker;
    const staged_run *r = ctx;
    for (size_t i = begin; i < end; i++) {
        const value_range *v = &r->ranges[i];
        const tensor_source at = source_from(&r->st[v->tensor].src, v->begin);
        r->finite[i] = (unsigned char)tensor_values_finite(&at, v->count);
    }
}

/* Casts each range into the buffers its weight will hold: the new ones, else its own. */
static void convert_ranges(void *ctx, size_t begin, size_t end, unsigned worker) {
    (void)worker;
    const staged_run *r = ctx;
    for (size_t i = begin; i < end; i++) {
        const value_range *v = &r->ranges[i];
        const staged *st = &r->st[v->tensor];
        uint16_t *bf16 = st->bf16_new ? st->bf16_new : (uint16_t *)st->w->bf16;
        float *master = st->src.dtype == PARITY_DTYPE_BF16 || st->drop_master ? NULL
                        : st->master_new ? st->master_new
                                         : (float *)st->w->master;
        const tensor_source at = source_from(&st->src, v->begin);
        tensor_convert_into(&at, v->count, bf16 + v->begin, master ? master + v->begin : NULL);
    }
}

/* The ranges of the staged tensors whose values are to be scanned (scan), in order; NULL when
 * out of memory. */
static value_range *staged_ranges(const staged *st, size_t n, size_t *n_ranges) {
    size_t k = 0;
    for (size_t i = 0; i < n; i++)
        if (st[i].scan) k += (size_t)((staged_count(&st[i]) + RANGE_VALUES - 1) / RANGE_VALUES);
    value_range *ranges = px_malloc((k ? k : 1) * (sizeof *ranges + 1), "update ranges");
    if (!ranges) return NULL;
    k = 0;
    for (size_t i = 0; i < n; i++)
        for (uint64_t b = 0; st[i].scan && b < staged_count(&st[i]); b += RANGE_VALUES) {
            const uint64_t left = staged_count(&st[i]) - b;
            ranges[k++] = (value_range){i, b, left < RANGE_VALUES ? left : RANGE_VALUES};
        }
    *n_ranges = k;
    return ranges;
}

/* Whether F16/F32 values for st's weight leave a master in the model under `masters`: always
 * under PARITY_MASTERS_KEEP; under PARITY_MASTERS_WHERE_READ where the weight holds one (an
 * F32/F16 checkpoint's, an earlier update's) or a copy the model has built, or this update
 * builds (quant_new), is made from it. */
static int keeps_master(const parity_model *m, const staged *st, uint32_t masters) {
    if (masters == PARITY_MASTERS_KEEP || st->w->master || model_reads_master(m, st->w)) return 1;
    for (int q = 0; q < QUANTIZERS; q++)
        if (st->quant_new[q]) return 1;
    return 0;
}

/* A new fp32 master for st's values (ordinary pages, as below). */
static int staged_master_alloc(staged *st) {
    st->master_new = px_aligned_alloc(staged_count(st) * 4, "updated weights (fp32 masters)");
    return st->master_new ? PARITY_OK : PARITY_ERR_OUT_OF_MEMORY;
}

/* New buffers for the values whose weight has none the model owns, in ordinary pages, not
 * huge ones (px_huge_alloc): their first write, by the casts on the pool, is most of what a
 * first update costs, and on a VM whose host takes back the guest's free memory (free page
 * reporting) new 2 MB pages cost about five times the system time of 4 KB ones (DESIGN.md,
 * "Weight updates"), while reading the weights from huge pages did not measurably speed the
 * calls after a scorer's first ("Large buffers"). No master where `masters` drops it: the
 * 4 bytes a value that a learner's first sync of a bf16 model would otherwise write. */
static int staged_alloc(parity_model *m, staged *st, uint32_t masters) {
    const uint64_t count = staged_count(st);
    if (!model_owns(m, st->w->bf16) &&
        !(st->bf16_new = px_aligned_alloc(count * 2, "updated weights (bf16)")))
        return PARITY_ERR_OUT_OF_MEMORY;
    if (st->src.dtype == PARITY_DTYPE_BF16 || model_owns(m, st->w->master)) return PARITY_OK;
    if (!keeps_master(m, st, masters)) {
        st->drop_master = 1;
        return PARITY_OK;
    }
    return staged_master_alloc(st);
}

int parity_model_update(parity_model *m, const parity_tensor_data *tensors, size_t n) {
    return parity_model_update_on(NULL, m, tensors, n);
}

int parity_model_update_on(parity_pool *pool, parity_model *m, const parity_tensor_data *tensors,
                           size_t n) {
    return parity_model_update_with(pool, m, tensors, n, PARITY_MASTERS_KEEP);
}

int parity_model_update_with(parity_pool *pool, parity_model *m, const parity_tensor_data *tensors,
                             size_t n, uint32_t masters) {
    clear_error();
    if (!m || (!tensors && n))
        return set_error(PARITY_ERR_INVALID_ARGUMENT, "model or tensors is NULL");
    if (masters != PARITY_MASTERS_KEEP && masters != PARITY_MASTERS_WHERE_READ)
        return set_error(PARITY_ERR_INVALID_ARGUMENT, "masters is %u: PARITY_MASTERS_KEEP (0) or "
                         "PARITY_MASTERS_WHERE_READ (1)", masters);
    if (n == 0) return set_error(PARITY_ERR_EMPTY_INPUT, "no tensors to update");
    threadpool *threads;
    TRY(user_pool_enter(pool, &threads, "parity_model_update_on"));
    staged *st = px_calloc(n, sizeof *st, "staged tensors");
    int rc = st ? PARITY_OK : PARITY_ERR_OUT_OF_MEMORY;
    /* everything is checked, and every new buffer allocated, before anything changes */
    for (size_t i = 0; i < n && !rc; i++) {
        const parity_tensor_data *t = &tensors[i];
        if (!t->name) {
            rc = set_error(PARITY_ERR_INVALID_ARGUMENT, "update %zu has no name", i);
            break;
        }
        for (size_t j = 0; j < i && !rc; j++)
            if (!strcmp(tensors[j].name, t->name))
                rc = set_error(PARITY_ERR_ST_DUPLICATE, "update of '%s': listed twice", t->name);
        if (rc) break;
        const expected *slot = model_find_tensor(m, t->name);
        char base[160];
        if (!slot && scale_base(t->name, base, sizeof base)) {
            /* the scales of an F8_E4M3 weight in the same update go in with it */
            const size_t k = find_update(tensors, n, base);
            if (k == n || tensors[k].dtype != PARITY_DTYPE_F8_E4M3)
                rc = set_error(PARITY_ERR_TENSOR_UNEXPECTED, "update of '%s': block scales without "
                               "the F8_E4M3 codes of '%s' in the same update", t->name, base);
            st[i].scale_entry = 1;
            continue;
        }
        if (!slot) {
            rc = set_error(PARITY_ERR_TENSOR_UNEXPECTED, "update of '%s': the model has no such tensor",
                           t->name);
            break;
        }
        char where[160];
        snprintf(where, sizeof where, "update of '%s'", t->name);
        if (t->ndim != 1 && t->ndim != 2) {
            rc = set_error(PARITY_ERR_TENSOR_SHAPE, "%s: ndim is %u, the model's tensors have 1 or 2",
                           where, t->ndim);
            break;
        }
        weight *w = st[i].w = slot->dst;
        if (t->dtype == PARITY_DTYPE_F8_E4M3) {
            rc = stage_shipped(m, tensors, n, i, slot, where, &st[i]);
            continue;
        }
        const tensor_source src = {where, t->dtype, NULL, t->ndim, t->shape, t->data, 0};
        st[i].src = src;
        st[i].src.where = NULL;  /* `where` is this loop's buffer: only the checks print it */
        rc = tensor_check_format(&src, slot);
        st[i].scan = !rc; /* its values scanned below, all at once */
        /* a model an fp16 policy reads must be able to hold the new values in fp16 */
        if (!rc && w->fp16) rc = tensor_check_fp16(&src, (uint64_t)w->rows * w->cols);
        /* values for a weight that held shipped codes: the policies of their format that read
         * those quantize the new values with their own rules from now on */
        if (!rc) rc = quant_copies_unshipped(m, w, -1, st[i].quant_new, NULL);
    }
    /* the values, scanned on the pool in ranges; a tensor that is not finite fails with
     * tensor_check's message, as the first failure in the order given (the loop above stopped
     * at any other, after the format checks that come first) */
    size_t n_ranges = 0;
    value_range *ranges = st ? staged_ranges(st, n, &n_ranges) : NULL;
    if (!ranges && !rc) rc = PARITY_ERR_OUT_OF_MEMORY;
    staged_run run = {st, ranges, ranges ? (unsigned char *)(ranges + n_ranges) : NULL};
    if (ranges) {
        pool_run_dynamic(threads, scan_ranges, &run, n_ranges, 1);
        for (size_t r = 0; r < n_ranges; r++)
            if (!run.finite[r]) {
                const size_t i = ranges[r].tensor;
                char where[160];
                snprintf(where, sizeof where, "update of '%s'", tensors[i].name);
                tensor_source src = st[i].src;
                src.where = where;
                rc = tensor_check(&src, model_find_tensor(m, tensors[i].name));
                break;
            }
    }
    /* the new buffers: out of memory here changes nothing either */
    for (size_t i = 0; !rc && i < n; i++)
        if (st[i].scan) rc = staged_alloc(m, &st[i], masters);
    /* room in the owned list, so that the swap below cannot fail */
    if (!rc && !model_reserve_owned(m, 5 * n)) rc = PARITY_ERR_OUT_OF_MEMORY;
    int locked = 0;
    if (!rc && pthread_rwlock_trywrlock(&m->use_lock) != 0)
        rc = set_error(PARITY_ERR_BUSY, "a scorer or sampler of this model is inside a call: "
                       "weights can only be updated while no call runs");
    else if (!rc)
        locked = 1;
    /* under the lock, still before anything changes: a scorer or sampler made while the
     * update staged (its copies are built under the shared lock) reads the masters it reads
     * from now on, so none of those is dropped after all */
    for (size_t i = 0; !rc && i < n; i++)
        if (st[i].drop_master && keeps_master(m, &st[i], masters)) {
            st[i].drop_master = 0;
            rc = staged_master_alloc(&st[i]);
        }
    /* the values a requantization widens bf16 values into, so that it cannot fail (sized for
     * bf16 values: the update may replace a master with them; under the lock, so that the
     * copies of a quantizer prepared while the update staged count too) */
    float *fp8_rows = NULL;
    size_t most = 0;
    for (size_t i = 0; !rc && i < n; i++)
        for (int q = 0; q < QUANTIZERS && st[i].w; q++)
            if (st[i].w->quant[q] || st[i].quant_new[q]) {
                const weight as_bf16 = {.rows = st[i].w->rows, .cols = st[i].w->cols};
                const size_t f = quant_scratch_floats(&as_bf16, q);
                if (f > most) most = f;
            }
    if (!rc && most && !(fp8_rows = px_malloc(most * sizeof(float), "quantization rows")))
        rc = PARITY_ERR_OUT_OF_MEMORY;
    if (rc) {
        if (locked) pthread_rwlock_unlock(&m->use_lock);
        for (size_t i = 0; st && i < n; i++) staged_free(m, &st[i]);
        px_free(st);
        px_free(ranges);
        px_free(fp8_rows);
        user_pool_leave(pool, threads);
        return rc;
    }
    /* the casts, in ranges on the pool: into the buffers the weights own, overwriting their
     * old values now that nothing can fail, and into the new ones */
    pool_run_dynamic(threads, convert_ranges, &run, n_ranges, 1);
    for (size_t i = 0; i < n; i++) {
        weight *w = st[i].w;
        if (st[i].scale_entry) continue;
        if (st[i].ship) {
            commit_shipped(m, &st[i]);
        } else {
            if (st[i].bf16_new) { /* the old values were not the model's to write (mapped) */
                model_disown(m, w->bf16);
                w->bf16 = model_own(m, st[i].bf16_new);
            }
            if (st[i].src.dtype == PARITY_DTYPE_BF16) {
                model_disown(m, w->master);  /* BF16 values have no fp32 master */
                w->master = NULL;
            } else if (st[i].master_new) {   /* kept, and written in place, from now on */
                model_disown(m, w->master);
                w->master = model_own(m, st[i].master_new);
            }
            /* the bf16 cast alone stands for F16/F32 values whose master was dropped */
            w->master_dropped = (uint8_t)st[i].drop_master;
        }
        if (!st[i].ship && w->shipped) { /* values replace the shipped codes */
            model_disown(m, w->shipped->codes);
            model_disown(m, w->shipped->scales);
            model_disown(m, w->shipped);
            w->shipped = NULL;
            for (int q = 0; q < QUANTIZERS; q++)
                if (st[i].quant_new[q]) w->quant[q] = st[i].quant_new[q];
        }
        /* the fp32 copies a backend or policy reads, in place */
        if (w->wide) weight_widen_into(w, w->wide);
        if (w->fp16) weight_fp16_into(w, w->fp16);
        for (int q = 0; q < QUANTIZERS; q++) /* requantized from the new values */
            if (w->quant[q]) quant_weight_quantize(w, q, w->quant[q], fp8_rows);
    }
    if (m->config.tie_word_embeddings) m->lm_head = m->embed;
    m->version++;
    pthread_rwlock_unlock(&m->use_lock);
    px_free(st);
    px_free(ranges);
    px_free(fp8_rows);
    user_pool_leave(pool, threads);
    return PARITY_OK;
}

/* ---- the probe --------------------------------------------------------------------------- */

int parity_scorer_probe(parity_scorer *scorer, const int32_t *tokens, uint32_t len,
                        const float *expected_lp) {
    clear_error();
    if (!scorer || !tokens || !expected_lp)
        return set_error(PARITY_ERR_INVALID_ARGUMENT, "scorer, tokens or expected is NULL");
    if (len < 2) return set_error(PARITY_ERR_EMPTY_INPUT, "a probe needs at least 2 tokens");
    float *got = px_malloc((size_t)(len - 1) * sizeof *got, "probe log-probs");
    if (!got) return PARITY_ERR_OUT_OF_MEMORY;
    parity_score_options o;
    parity_score_default_options(&o);
    int rc = parity_score(scorer, &o, tokens, &len, 1, got, NULL, NULL, NULL);
    if (!rc) {
        uint32_t differ = 0, first = 0;
        double worst = 0;
        for (uint32_t t = 0; t + 1 < len; t++)
            if (f32_bits(got[t]) != f32_bits(expected_lp[t])) {
                if (!differ++) first = t;
                double d = fabs((double)got[t] - (double)expected_lp[t]);
                if (!(d <= worst)) worst = d;
            }
        if (differ)
            rc = set_error(PARITY_ERR_VERIFY,
                           "probe: %u of %u log-probs differ from the learner's (first at "
                           "position %u, max |difference| %.9g): the weights, policy or "
                           "backend do not match",
                           differ, len - 1, first + 1, worst);
    }
    px_free(got);
    return rc;
}
