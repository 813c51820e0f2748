/*
 * The forward's pieces as public calls on caller-owned buffers (parity.h, "Forward pieces"):
 * the embedding gather, the linear layer, causal GQA attention and the head (final residual
 * + norm + lm_head + log-softmax of given tokens). Each builds a forward context over the
 * caller's buffers and runs the very functions forward() runs (embed_rows, linear_weights,
 * kv_store + attention, forward_head, dist_build), so a host that composes them with the
 * region kernels gets the forward's bits, with nothing to keep in step.
 *
 * Scratch (packed GEMM input, weight panels, a KV cache for attention, logits) is the pool's,
 * kept from call to call, or the call's own without a pool; a failed call changes no output.
 */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "args.h"
#include "attention.h"
#include "base/alloc.h"
#include "base/errors.h"
#include "base/floats.h"
#include "base/in_use.h"
#include "gemm.h"
#include "gemm_quant.h"
#include "kvcache.h"
#include "layer.h"
#include "ops_call.h"
#include "scratch.h"
#include "kernels/kernels.h"
#include "model/model.h"
#include "quant/codecs.h"
#include "quant/dot.h"
#include "quant/quant_weight.h"
#include "quant/rules.h"
#include "quant/train_gemm.h"
#include "sampling.h"
#include "user_pool.h"

/* A pool keeps the scratch of its calls for the next ones: the k-th buffer a call asks for is
 * the pool's k-th, grown when too small (a learner calls the same pieces with the same
 * shapes layer after layer: without it, every call would page-fault its scratch in anew). */
struct parity_pool {
    threadpool *pool;
    atomic_int in_use;
    void *scratch[OPS_MAX_SCRATCH];
    size_t scratch_bytes[OPS_MAX_SCRATCH];
};

int parity_pool_create(uint32_t n_threads, parity_pool **out) {
    clear_error();
    if (!out) return set_error(PARITY_ERR_INVALID_ARGUMENT, "parity_pool_create: out is NULL");
    *out = NULL;
    if (n_threads < 1 || n_threads > 256)
        return set_error(PARITY_ERR_INVALID_ARGUMENT,
                         "parity_pool_create: n_threads %u is not in 1..256", n_threads);
    parity_pool *p = px_calloc(1, sizeof *p, "thread pool");
    if (!p) return PARITY_ERR_OUT_OF_MEMORY;
    atomic_init(&p->in_use, 0);
    int rc = pool_create(n_threads, &p->pool);
    if (rc) {
        px_free(p);
        return rc;
    }
    *out = p;
    return PARITY_OK;
}

void parity_pool_free(parity_pool *p) {
    if (!p) return;
    pool_free(p->pool);
    for (size_t i = 0; i < OPS_MAX_SCRATCH; i++) px_free(p->scratch[i]);
    px_free(p);
}

uint32_t parity_pool_threads(const parity_pool *p) { return p ? pool_size(p->pool) : 1; }

int user_pool_enter(parity_pool *pool, threadpool **out, const char *fn) {
    if (pool) {
        TRY(object_enter(&pool->in_use, "parity_pool"));
        *out = pool->pool;
        return PARITY_OK;
    }
    const int rc = pool_create(1, out);
    return rc ? set_error(rc, "%s: cannot create a one-thread pool", fn) : PARITY_OK;
}

void user_pool_leave(parity_pool *pool, threadpool *taken) {
    if (pool) object_leave(&pool->in_use);
    else pool_free(taken);
}

/* ---- one call: the pool (the caller's, or a one-thread one), scratch, the FP environment -- */

int op_begin(op_call *c, parity_pool *pool, const char *fn) {
    memset(c, 0, sizeof *c);
    if (pool) {
        TRY(object_enter(&pool->in_use, "parity_pool"));
        c->user = pool;
        c->pool = pool->pool;
    } else {
        int rc = pool_create(1, &c->pool);
        if (rc) return set_error(rc, "%s: cannot create a one-thread pool", fn);
    }
    c->fp_saved = fp_env_enter();
    return PARITY_OK;
}

void op_end(op_call *c) {
    fp_env_restore(c->fp_saved);
    if (c->user) {
        object_leave(&c->user->in_use);
    } else {
        for (size_t i = 0; i < c->n_scratch; i++) px_free(c->scratch[i]);
        pool_free(c->pool);
    }
}

/* ops_call.h says what it returns. */
void *op_alloc(op_call *c, uint64_t n, size_t size, const char *what) {
    uint64_t bytes;
    if (c->n_scratch == OPS_MAX_SCRATCH) {
        set_error(PARITY_ERR_OUT_OF_MEMORY, "%s: more scratch buffers than a call holds", what);
        return NULL;
    }
    if (mul_overflows(n, size, &bytes) || bytes > SIZE_MAX - 64) {
        set_error(PARITY_ERR_OUT_OF_MEMORY, "%s: %llu x %zu bytes is too large", what,
                  (unsigned long long)n, size);
        return NULL;
    }
    if (!bytes) bytes = 64;
    const size_t k = c->n_scratch;
    if (c->user) {
        parity_pool *p = c->user;
        if (p->scratch_bytes[k] < bytes) {
            px_free(p->scratch[k]);
            p->scratch[k] = px_aligned_alloc((size_t)bytes, what);
            p->scratch_bytes[k] = p->scratch[k] ? (size_t)bytes : 0;
            if (!p->scratch[k]) return NULL;
        }
        c->n_scratch++;
        return p->scratch[k];
    }
    void *q = px_aligned_alloc((size_t)bytes, what);
    if (q) c->scratch[c->n_scratch++] = q;
    return q;
}

static int check_backend(const char *fn, uint32_t backend) {
    return error_prefixed(fn, parity_backend_check((int)backend));
}

/* The weight dtype a policy reads: BF16 under PARITY_COMPUTE_BF16, F16 under _FP16, F32
 * under _FP32. */
static uint32_t weight_dtype_of(const parity_policy *pol) {
    return pol->compute == PARITY_COMPUTE_FP32   ? PARITY_DTYPE_F32
           : pol->compute == PARITY_COMPUTE_FP16 ? PARITY_DTYPE_F16
                                                 : PARITY_DTYPE_BF16;
}

static int check_weight_dtype(const char *fn, const parity_policy *pol, uint32_t dtype,
                              const char *what) {
    static const char *const compute[] = {"bf16", "fp32", "fp16"};
    static const char *const dtypes[] = {"BF16", "F16", "F32"};
    const uint32_t want = weight_dtype_of(pol);
    if (dtype != want)
        return set_error(PARITY_ERR_INVALID_ARGUMENT,
                         "%s: %s has dtype %u; a policy with compute \"%s\" reads %s weights "
                         "(PARITY_DTYPE_%s)",
                         fn, what, dtype, compute[pol->compute], compute[pol->compute],
                         dtypes[want]);
    return PARITY_OK;
}

/* The value of weight element i of dtype `dtype` (checked by check_weight_dtype), in fp32. */
static float weight_element(uint32_t dtype, const void *w, size_t i) {
    return dtype == PARITY_DTYPE_F32   ? ((const float *)w)[i]
           : dtype == PARITY_DTYPE_F16 ? f16_to_f32(((const uint16_t *)w)[i])
                                       : bf16_to_f32(((const uint16_t *)w)[i]);
}

/* The GEMM weights of a call: what the backend streams (the bf16 backend: bf16 values as
 * they are, or the fp32 values under PARITY_COMPUTE_FP32; fp16 weights widened into scratch
 * under PARITY_COMPUTE_FP16 and bf16 ones on openblas). */
static int gemm_weights_of(op_call *c, const parity_policy *pol, uint32_t backend, size_t n,
                           size_t k, const void *w, size_t ldw, gemm_weights *out) {
    *out = (gemm_weights){n, k, ldw, NULL, NULL};
    if (pol->compute == PARITY_COMPUTE_FP32) {
        out->f32 = w;
    } else if (backend == PARITY_BACKEND_OPENBLAS || pol->compute == PARITY_COMPUTE_FP16) {
        float *wide = op_alloc(c, (uint64_t)n * k, sizeof(float), "weights widened to fp32");
        if (!wide) return PARITY_ERR_OUT_OF_MEMORY;
        const uint32_t dtype = weight_dtype_of(pol);
        for (size_t r = 0; r < n; r++)
            for (size_t i = 0; i < k; i++) wide[r * k + i] = weight_element(dtype, w, r * ldw + i);
        out->f32 = wide;
        out->ld = k;
    } else {
        out->bf16 = w;
    }
    return PARITY_OK;
}

/* The GEMM scratch of M rows of K columns over `workers` workers. */
int gemm_scratch_of(op_call *c, size_t M, size_t K, gemm_scratch *g) {
    g->max_k = K;
    g->xpack = op_alloc(c, gemm_scratch_xpack_floats(M, K), sizeof(float), "packed GEMM input");
    g->panels = g->xpack ? op_alloc(c, (uint64_t)pool_size(c->pool) * gemm_panel_floats(K),
                                    sizeof(float), "GEMM weight panels")
                         : NULL;
    return g->panels ? PARITY_OK : PARITY_ERR_OUT_OF_MEMORY;
}

fwd_ctx op_ctx(const op_call *c, const parity_policy *pol, uint32_t backend,
                      const parity_config *shape, fwd_scratch *s, kv_cache *kv) {
    return (fwd_ctx){NULL, shape, *pol, backend, c->pool, kv, s, 0, 0, NULL,
                     PARITY_LOOP_KV_LAST_EXITED, NULL, NULL};
}

/* ---- the embedding gather ------------------------------------------------------------------ */

int parity_embedding(size_t rows, const int32_t *tokens, size_t vocab, size_t dim, uint32_t dtype,
                     const void *table, size_t table_stride, float *out, size_t out_stride) {
    static const char fn[] = "parity_embedding";
    clear_error();
    TRY(arg_shape(fn, rows, dim));
    TRY(arg_ptr(fn, tokens, "tokens"));
    TRY(arg_ptr(fn, table, "table"));
    TRY(arg_ptr(fn, out, "out"));
    if (vocab == 0) return set_error(PARITY_ERR_INVALID_ARGUMENT, "%s: vocab is 0", fn);
    if (dtype > PARITY_DTYPE_F32)
        return set_error(PARITY_ERR_INVALID_ARGUMENT, "%s: table dtype %u is not PARITY_DTYPE_BF16, "
                         "PARITY_DTYPE_F16 or PARITY_DTYPE_F32", fn, dtype);
    TRY(arg_rows(fn, vocab, dim, table_stride, "table"));
    TRY(arg_rows(fn, rows, dim, out_stride, "out"));
    for (size_t r = 0; r < rows; r++)
        if (tokens[r] < 0 || (uint64_t)tokens[r] >= vocab)
            return set_error(PARITY_ERR_TOKEN_RANGE, "%s: row %zu: token id %d is outside the "
                             "vocabulary [0, %zu)", fn, r, tokens[r], vocab);
    if (dtype == PARITY_DTYPE_F16) {
        for (size_t r = 0; r < rows; r++)
            for (size_t i = 0; i < dim; i++)
                out[r * out_stride + i] =
                    weight_element(dtype, table, (size_t)tokens[r] * table_stride + i);
        return PARITY_OK;
    }
    embed_rows(rows, tokens, dim, dtype == PARITY_DTYPE_BF16 ? table : NULL,
               dtype == PARITY_DTYPE_F32 ? table : NULL, table_stride, out, out_stride);
    return PARITY_OK;
}

/* ---- the linear layer ------------------------------------------------------------------------ */

int parity_linear(parity_pool *pool, const parity_policy *policy, uint32_t backend, size_t m,
                  size_t k, size_t n, const float *x, size_t x_stride, uint32_t w_dtype,
                  const void *w, size_t w_stride, const float *bias, float *y, size_t y_stride) {
    static const char fn[] = "parity_linear";
    clear_error();
    TRY(arg_policy(fn, policy));
    const int fp8 = policy->gemm != PARITY_GEMM_BF16;
    TRY(check_backend(fn, backend));
    TRY(arg_shape(fn, m, k));
    if (n == 0) return set_error(PARITY_ERR_INVALID_ARGUMENT, "%s: n is 0", fn);
    TRY(arg_ptr(fn, x, "x"));
    TRY(arg_ptr(fn, w, "w"));
    TRY(arg_ptr(fn, y, "y"));
    if (fp8 && w_dtype != PARITY_DTYPE_F32 && w_dtype != PARITY_DTYPE_BF16)
        return set_error(PARITY_ERR_INVALID_ARGUMENT, "%s: w has dtype %u; a quantized gemm quantizes "
                         "fp32 masters (PARITY_DTYPE_F32) or bf16 values (PARITY_DTYPE_BF16)",
                         fn, w_dtype);
    if (!fp8) TRY(check_weight_dtype(fn, policy, w_dtype, "w"));
    TRY(arg_rows(fn, m, k, x_stride, "x"));
    TRY(arg_rows(fn, n, k, w_stride, "w"));
    TRY(arg_rows(fn, m, n, y_stride, "y"));
    if ((const void *)y == (const void *)x || (const void *)y == w)
        return set_error(PARITY_ERR_INVALID_ARGUMENT, "%s: y aliases %s", fn,
                         (const void *)y == (const void *)x ? "x" : "w");
    if (k > (1u << 24) || n > (1u << 30))
        return set_error(PARITY_ERR_INVALID_ARGUMENT, "%s: k %zu or n %zu is too large", fn, k, n);

    op_call c;
    TRY(op_begin(&c, pool, fn));
    fwd_scratch s = {0};
    if (fp8) {
        /* the weights quantized with the policy's rule, as the model quantizes its own (from
         * the fp32 masters, or from the bf16 values widened), then the model's quantized GEMM */
        const int q = policy->quantizer;
        /* bf16 values widened: 128 rows at a time for the fp8 rules, all for the others */
        const int master = w_dtype != PARITY_DTYPE_BF16;
        const size_t wide = quant_weight_scratch_floats(q, n, k, master);
        quant_weight wq = {.codes = op_alloc(&c, quant_weight_code_bytes(quant_rule_of(q)->format,
                                                                          n, k),
                                             1, "quantized weight codes")};
        wq.scales = wq.codes ? op_alloc(&c, quant_weight_scale_bytes(quant_rule_of(q)->format, n,
                                                                     k),
                                        1, "quantized weight scales")
                             : NULL;
        float *rows = wq.scales && wide ? op_alloc(&c, wide, sizeof(float), "quantized weight rows")
                                        : NULL;
        /* the activations' codes and scales (linear_quantized puts them in the GEMM scratch) */
        s.gemm.xpack = wq.scales && (rows || !wide)
                           ? op_alloc(&c, linear_quantized_scratch(q, m, k), 1, "activation codes")
                           : NULL;
        int rc = s.gemm.xpack ? PARITY_OK : PARITY_ERR_OUT_OF_MEMORY;
        if (!rc) {
            quant_weight_quantize_values(q, n, k, master ? (const float *)w : NULL,
                                         master ? NULL : (const uint16_t *)w, w_stride, &wq, rows);
            const weight shape = {.rows = (uint32_t)n, .cols = (uint32_t)k};
            const fwd_ctx ctx = op_ctx(&c, policy, backend, NULL, &s, NULL);
            linear_quantized(&ctx, m, x, x_stride, &shape, &wq, bias, y, y_stride);
        }
        op_end(&c);
        return rc;
    }
    gemm_weights gw;
    int rc = gemm_weights_of(&c, policy, backend, n, k, w, w_stride, &gw);
    if (!rc && backend != PARITY_BACKEND_OPENBLAS && policy->compute == PARITY_COMPUTE_BF16)
        rc = gemm_scratch_of(&c, m, k, &s.gemm);
    if (!rc) {
        const fwd_ctx ctx = op_ctx(&c, policy, backend, NULL, &s, NULL);
        linear_weights(&ctx, m, x, x_stride, &gw, bias, y, y_stride);
    }
    op_end(&c);
    return rc;
}

/* ---- the training GEMM on pre-quantized operands ------------------------------------------ */

/* The checks of one operand of rows x k codes (name "a" or "b"), and its kernel form. */
static int quant_operand_of(const char *fn, const char *name, const parity_quant_operand *o,
                            size_t rows, size_t k, train_operand *out) {
    if (!o) return set_error(PARITY_ERR_INVALID_ARGUMENT, "%s: %s is NULL", fn, name);
    const int nvfp4 = o->format == PARITY_GEMM_NVFP4;
    if (!nvfp4 && o->format != PARITY_GEMM_MXFP8)
        return set_error(PARITY_ERR_INVALID_ARGUMENT, "%s: %s's format %u is neither "
                         "PARITY_GEMM_MXFP8 nor PARITY_GEMM_NVFP4", fn, name, o->format);
    if (!nvfp4 && o->element != PARITY_FP8_E4M3 && o->element != PARITY_FP8_E5M2)
        return set_error(PARITY_ERR_INVALID_ARGUMENT, "%s: %s's element %u is neither "
                         "PARITY_FP8_E4M3 nor PARITY_FP8_E5M2", fn, name, o->element);
    if (nvfp4 && o->element != 0)
        return set_error(PARITY_ERR_INVALID_ARGUMENT, "%s: %s's element %u: NVFP4 codes are "
                         "E2M1 (element 0)", fn, name, o->element);
    if (!o->codes || !o->scales)
        return set_error(PARITY_ERR_INVALID_ARGUMENT, "%s: %s's %s is NULL", fn, name,
                         o->codes ? "scales" : "codes");
    const size_t block = nvfp4 ? 16 : 32, nblocks = (k + block - 1) / block;
    if (o->codes_stride < k || o->scales_stride < nblocks)
        return set_error(PARITY_ERR_INVALID_ARGUMENT, "%s: %s's codes_stride %zu or "
                         "scales_stride %zu is below its row (%zu codes, %zu scales)", fn, name,
                         o->codes_stride, o->scales_stride, k, nblocks);
    if (o->scale_rows != 1 && !(nvfp4 && o->scale_rows == 16))
        return set_error(PARITY_ERR_INVALID_ARGUMENT, "%s: %s's scale_rows %u is not 1%s", fn,
                         name, o->scale_rows, nvfp4 ? " or 16" : "");
    if (nvfp4 && (!o->globals || o->per_row_globals > 1))
        return set_error(PARITY_ERR_INVALID_ARGUMENT, "%s: %s: NVFP4 needs globals (NULL here) "
                         "and per_row_globals 0 or 1 (%u)", fn, name, o->per_row_globals);
    if (!nvfp4 && o->globals)
        return set_error(PARITY_ERR_INVALID_ARGUMENT, "%s: %s: MXFP8 has no global scales "
                         "(globals must be NULL)", fn, name);
    if (nvfp4)
        for (size_t r = 0; r < rows; r++)
            for (size_t c = 0; c < k; c++)
                if (o->codes[r * o->codes_stride + c] > 0xf)
                    return set_error(PARITY_ERR_INVALID_ARGUMENT, "%s: %s's code [%zu][%zu] is "
                                     "0x%02x, not an E2M1 code (0x0 .. 0xf)", fn, name, r, c,
                                     o->codes[r * o->codes_stride + c]);
    *out = (train_operand){nvfp4 ? TRAIN_E2M1
                                 : o->element == PARITY_FP8_E5M2 ? TRAIN_E5M2 : TRAIN_E4M3,
                           o->codes, o->codes_stride, o->scales, o->scales_stride,
                           o->scale_rows, nvfp4 ? o->globals : NULL, (int)o->per_row_globals};
    return PARITY_OK;
}

/* The columns [n0, n1) with the current CPU path's kernel (train_gemm_columns_entry). */
typedef struct train_run {
    const train_gemm_job *job;
    train_columns_fn *columns;
} train_run;

static void train_columns(void *p, size_t n0, size_t n1, unsigned worker) {
    (void)worker;
    const train_run *r = p;
    r->columns(r->job, n0, n1);
}

/* An operand's codes as rows exactly k apart: its own buffer when they are, else a copy into
 * the call's scratch (NULL, with the status set, when that cannot be allocated). */
static const uint8_t *codes_packed(op_call *c, const train_operand *o, size_t rows, size_t k) {
    if (o->codes_stride == k) return o->codes;
    uint8_t *p = op_alloc(c, (uint64_t)rows * k, 1, "operand codes");
    if (p)
        for (size_t r = 0; r < rows; r++) memcpy(p + r * k, o->codes + r * o->codes_stride, k);
    return p;
}

/* An operand's block scales as the fp32 values the forward's GEMM reads (E8M0 powers of two,
 * or NVFP4's E4M3 values), one row of the grid per operand row. */
static float *scale_values(op_call *c, const train_operand *o, size_t rows, size_t nblocks) {
    float *s = op_alloc(c, (uint64_t)rows * nblocks, sizeof(float), "operand scales");
    if (s)
        for (size_t r = 0; r < rows; r++) {
            const uint8_t *row = o->scales + (r / o->scale_rows) * o->scales_stride;
            for (size_t kb = 0; kb < nblocks; kb++)
                s[r * nblocks + kb] =
                    o->element == TRAIN_E2M1 ? e4m3_to_f32(row[kb]) : e8m0_to_f32(row[kb]);
        }
    return s;
}

static void forward_columns(void *p, size_t n0, size_t n1, unsigned worker) {
    (void)worker;
    const quant_gemm_job *j = p;
    quant_gemm_entry(j->rule->format)(j, n0, n1);
}

/* The operand pairs the forward's quantized GEMM takes as they are: E4M3 x E4M3 MX operands
 * (the MXFP8 format's row), and NVFP4 ones whose b has one global. */
static int forward_gemm_fits(const train_gemm_job *t) {
    if (t->a.element == TRAIN_E2M1) return !t->b.per_row_globals;
    return t->a.element == TRAIN_E4M3 && t->b.element == TRAIN_E4M3;
}

/* Such a pair on the forward's GEMM (dot.c and its SIMD variants, the current CPU path's),
 * a as the activations (codes one a byte, fp32 block scales, NVFP4's globals per row) and b as
 * the weight (codes as the format holds them, block scales as it holds them, one global): its
 * arithmetic is the training GEMM's (exact block dots rounded once, the fp32 chain of the
 * scale products, then RN(acc * RN(ga * gb))), so the bits are train_gemm_columns'
 * (test_train_gemm checks both against one reference), at the forward's speed. */
static int quant_gemm_forward(op_call *c, const train_gemm_job *t) {
    const int nvfp4 = t->a.element == TRAIN_E2M1;
    const quant_rule *rule = quant_rule_of(nvfp4 ? PARITY_QUANT_NVFP4_TE : PARITY_FP8Q_MX_RCEIL);
    const quant_format *f = rule->format; /* the rule's format row is all the GEMM reads */
    const size_t nblocks = (t->K + t->block - 1) / t->block;
    const size_t row_bytes = quant_weight_row_bytes(f, t->K);
    const uint8_t *xq = codes_packed(c, &t->a, t->M, t->K);
    const float *xs = xq ? scale_values(c, &t->a, t->M, nblocks) : NULL;
    const uint8_t *wq = NULL;
    if (xs && nvfp4) {
        uint8_t *packed = op_alloc(c, (uint64_t)t->N * row_bytes, 1, "packed operand codes");
        for (size_t r = 0; packed && r < t->N; r++)
            quant_codes_pack_row(f, t->b.codes + r * t->b.codes_stride, t->K,
                                 packed + r * row_bytes);
        wq = packed;
    } else if (xs) {
        wq = codes_packed(c, &t->b, t->N, t->K);
    }
    /* b's scales: fp32 values (MXFP8), or E4M3 bytes one grid row per operand row (NVFP4) */
    const float *ws = wq && !nvfp4 ? scale_values(c, &t->b, t->N, nblocks) : NULL;
    uint8_t *ws_codes = wq && nvfp4 ? op_alloc(c, (uint64_t)t->N * nblocks, 1, "operand scales")
                                    : NULL;
    float *xt = ws_codes ? op_alloc(c, t->M, sizeof(float), "operand globals") : NULL;
    if (nvfp4 ? !xt : !ws) return PARITY_ERR_OUT_OF_MEMORY;
    if (nvfp4) {
        for (size_t r = 0; r < t->N; r++)
            memcpy(ws_codes + r * nblocks,
                   t->b.scales + (r / t->b.scale_rows) * t->b.scales_stride, nblocks);
        for (size_t m = 0; m < t->M; m++) xt[m] = t->a.globals[t->a.per_row_globals ? m : 0];
    }
    quant_gemm_job j = {t->M, t->K, nblocks, t->block, rule, xq, xs, xt, wq, row_bytes, {ws},
                        nblocks, nvfp4 ? t->b.globals[0] : 0.0f, t->y, t->ldy};
    if (nvfp4) j.ws_codes = ws_codes;
    pool_run(c->pool, forward_columns, &j, t->N);
    return PARITY_OK;
}

int parity_quant_gemm(parity_pool *pool, size_t m, size_t n, size_t k,
                      const parity_quant_operand *a, const parity_quant_operand *b, float *y,
                      size_t y_stride) {
    static const char fn[] = "parity_quant_gemm";
    clear_error();
    if (m == 0 || n == 0 || k == 0)
        return set_error(PARITY_ERR_INVALID_ARGUMENT, "%s: m %zu, n %zu, k %zu (each at least "
                         "1)", fn, m, n, k);
    if (k > (1u << 24) || n > (1u << 30) || m > (1u << 30))
        return set_error(PARITY_ERR_INVALID_ARGUMENT, "%s: m %zu, n %zu or k %zu is too large",
                         fn, m, n, k);
    train_gemm_job job = {.M = m, .N = n, .K = k, .y = y, .ldy = y_stride};
    TRY(quant_operand_of(fn, "a", a, m, k, &job.a));
    TRY(quant_operand_of(fn, "b", b, n, k, &job.b));
    if (a->format != b->format)
        return set_error(PARITY_ERR_INVALID_ARGUMENT, "%s: a is %s, b %s: both operands must "
                         "be of one format", fn, a->format == PARITY_GEMM_NVFP4 ? "NVFP4" : "MXFP8",
                         b->format == PARITY_GEMM_NVFP4 ? "NVFP4" : "MXFP8");
    TRY(arg_ptr(fn, y, "y"));
    TRY(arg_rows(fn, m, n, y_stride, "y"));
    job.block = a->format == PARITY_GEMM_NVFP4 ? 16 : 32;
    op_call c;
    TRY(op_begin(&c, pool, fn));
    if (forward_gemm_fits(&job)) {
        const int rc = quant_gemm_forward(&c, &job);
        op_end(&c);
        return rc;
    }
    /* both operands decoded once (each code's integer, each block's scale), then the columns */
    void *da = op_alloc(&c, train_decoded_bytes(m, k, job.block), 1, "decoded operand a");
    void *db = da ? op_alloc(&c, train_decoded_bytes(n, k, job.block), 1, "decoded operand b")
                  : NULL;
    if (db) {
        train_gemm_decode(&job.a, m, k, job.block, da, &job.da);
        train_gemm_decode(&job.b, n, k, job.block, db, &job.db);
        train_run run = {&job, train_gemm_columns_entry()};
        pool_run(c.pool, train_columns, &run, n);
    }
    op_end(&c);
    return db ? PARITY_OK : PARITY_ERR_OUT_OF_MEMORY;
}

/* ---- causal GQA attention -------------------------------------------------------------------- */

int parity_attention(parity_pool *pool, const parity_policy *policy, size_t n_seqs,
                     const uint32_t *lengths, size_t n_heads, size_t n_kv_heads, size_t head_dim,
                     const float *q, size_t q_stride, const float *k, size_t k_stride,
                     const float *v, size_t v_stride, float *out, size_t out_stride) {
    static const char fn[] = "parity_attention";
    clear_error();
    const arg_buf bufs[] = {{lengths, "lengths", 0, 0}, {q, "q", 0, 0}, {k, "k", 0, 0},
                            {v, "v", 0, 0}, {out, "out", 0, 0}};
    TRY(arg_buffers(fn, policy, sizeof bufs / sizeof bufs[0], bufs));
    uint64_t total, cells = 0;
    uint32_t longest;
    TRY(arg_attention(fn, n_seqs, lengths, n_heads, n_kv_heads, head_dim, &total, &longest));
    for (size_t i = 0; i < n_seqs; i++)
        cells += (lengths[i] + (uint64_t)KV_BLOCK - 1) / KV_BLOCK * KV_BLOCK;
    if (cells > (1u << 28))
        return set_error(PARITY_ERR_TOO_LONG, "%s: %llu positions in all is too many", fn,
                         (unsigned long long)total);
    const size_t qw = n_heads * head_dim, kvw = n_kv_heads * head_dim;
    TRY(arg_rows(fn, (size_t)total, qw, q_stride, "q"));
    TRY(arg_rows(fn, (size_t)total, kvw, k_stride, "k"));
    TRY(arg_rows(fn, (size_t)total, kvw, v_stride, "v"));
    TRY(arg_rows(fn, (size_t)total, qw, out_stride, "out"));
    if ((const void *)out == (const void *)q || (const void *)out == (const void *)k ||
        (const void *)out == (const void *)v)
        return set_error(PARITY_ERR_INVALID_ARGUMENT, "%s: out aliases an input", fn);

    /* the shapes attention() reads, a one-layer KV cache of whole blocks per sequence */
    parity_config shape = {0};
    shape.num_hidden_layers = 1;
    shape.num_attention_heads = (uint32_t)n_heads;
    shape.num_key_value_heads = (uint32_t)n_kv_heads;
    shape.head_dim = (uint32_t)head_dim;
    const int fp32 = kv_cells_fp32(policy);
    const size_t group = n_heads / n_kv_heads, T = (size_t)total;

    op_call c;
    TRY(op_begin(&c, pool, fn));
    const size_t workers = pool_size(c.pool);
    kv_cache kv;
    fwd_scratch s = {0};
    s.max_ctx = longest;
    fwd_row *rows = op_alloc(&c, T, sizeof *rows, "attention rows");
    uint32_t *blocks = rows ? op_alloc(&c, cells / KV_BLOCK, sizeof *blocks, "block table") : NULL;
    s.scores = blocks ? op_alloc(&c, (uint64_t)workers * ATTN_TASK_ROWS * group * longest,
                                 sizeof(float), "attention scores") : NULL;
    s.pv = s.scores ? op_alloc(&c, (uint64_t)workers * attn_pv_floats(group, head_dim),
                               sizeof(float), "attention accumulators") : NULL;
    s.attn_fresh = s.pv ? op_alloc(&c, T, sizeof(uint32_t), "attention rows' first positions")
                        : NULL;
    const float *qc = q;
    float *att = out;
    if (s.pv && q_stride != qw) {
        float *packed = op_alloc(&c, (uint64_t)T * qw, sizeof(float), "queries");
        if (packed)
            for (size_t r = 0; r < T; r++) memcpy(packed + r * qw, q + r * q_stride, qw * 4);
        qc = packed;
    }
    if (s.pv && qc && out_stride != qw)
        att = op_alloc(&c, (uint64_t)T * qw, sizeof(float), "attention output");
    /* the cache of kv_cache_init's layout (one layer), in the call's scratch */
    const uint64_t kv_half = kv_cache_bytes(&shape, (uint32_t)cells, fp32) / 2;
    kv = (kv_cache){1, (uint32_t)cells, (uint32_t)kvw, (uint32_t)head_dim, fp32, NULL, NULL};
    if (s.attn_fresh && qc && att) kv.k = op_alloc(&c, kv_half, 1, "attention keys");
    if (kv.k) kv.v = op_alloc(&c, kv_half, 1, "attention values");
    const int rc = kv.v ? PARITY_OK : PARITY_ERR_OUT_OF_MEMORY;
    if (!rc) {
        for (size_t b = 0; b < cells / KV_BLOCK; b++) blocks[b] = (uint32_t)b;
        size_t at = 0, block = 0;
        for (size_t i = 0; i < n_seqs; i++) {
            for (uint32_t t = 0; t < lengths[i]; t++)
                rows[at++] = (fwd_row){0, t, blocks + block, 0, NULL, NULL, NULL};
            block += (lengths[i] + KV_BLOCK - 1) / KV_BLOCK;
        }
        const fwd_ctx ctx = op_ctx(&c, policy, PARITY_BACKEND_BF16, &shape, &s, &kv);
        kv_store(&ctx, 0, T, rows, k, k_stride, v, v_stride);
        attention(&ctx, 0, T, rows, qc, att);
        if (att != out)
            for (size_t r = 0; r < T; r++) memcpy(out + r * out_stride, att + r * qw, qw * 4);
    }
    op_end(&c);
    return rc;
}

/* ---- the head ------------------------------------------------------------------------------ */

typedef struct head_lp_job {
    const parity_policy *pol;
    dist_params dp;
    const float *logits;
    size_t V;
    const int32_t *targets;
    float *work;            /* [workers][dist_work_floats(V)] */
    float *logprobs, *entropy;
} head_lp_job;

static void job_head_logprobs(void *p, size_t begin, size_t end, unsigned worker) {
    const head_lp_job *j = p;
    const dist_work w = dist_work_at(j->work + (size_t)worker * dist_work_floats(j->V), j->V);
    for (size_t r = begin; r < end; r++) {
        dist d;
        dist_build(j->pol, &j->dp, j->logits + r * j->V, j->V, &w, &d);
        j->logprobs[r] = dist_logprob(&d, &w, j->targets[r]);
        if (j->entropy) j->entropy[r] = dist_entropy(&d, &w, j->V);
    }
}

/* The options of a head call (parity_head_logprobs, parity_logprobs_from_logits): their size,
 * no alternatives asked for, the mode's parameters valid for the vocabulary; *dp the
 * distribution's parameters. */
static int check_head_options(const char *fn, const parity_score_options *options, size_t vocab,
                              dist_params *dp) {
    TRY(arg_ptr(fn, options, "options"));
    if (options->size != sizeof *options)
        return set_error(PARITY_ERR_INVALID_ARGUMENT,
                         "%s: options.size is %u, this library expects %zu: initialise the "
                         "options with parity_score_default_options()",
                         fn, options->size, sizeof *options);
    if (options->top_n)
        return set_error(PARITY_ERR_INVALID_ARGUMENT, "%s: options.top_n must be 0 (this call "
                         "reports no alternatives; parity_score does)", fn);
    if (vocab == 0 || vocab > (1u << 30))
        return set_error(PARITY_ERR_INVALID_ARGUMENT, "%s: vocab %zu is not in 1..2^30", fn, vocab);
    *dp = (dist_params){options->mode, options->temperature, options->top_k, options->top_p,
                        options->min_p};
    return error_prefixed(fn, dist_params_check(dp, (uint32_t)vocab));
}

/* Every target in [0, vocab). */
static int check_targets(const char *fn, size_t rows, const int32_t *targets, size_t vocab) {
    for (size_t r = 0; r < rows; r++)
        if (targets[r] < 0 || (uint64_t)targets[r] >= vocab)
            return set_error(PARITY_ERR_TOKEN_RANGE, "%s: row %zu: target token id %d is outside "
                             "the vocabulary [0, %zu)", fn, r, targets[r], vocab);
    return PARITY_OK;
}

int parity_head_logprobs(parity_pool *pool, const parity_policy *policy, uint32_t backend,
                         const parity_score_options *options, size_t rows, size_t dim,
                         size_t vocab, const float *residual, size_t residual_stride,
                         const float *delta, size_t delta_stride, uint32_t w_dtype,
                         const void *norm_weight, float eps, const void *lm_head,
                         size_t lm_head_stride, const int32_t *targets, float *logprobs,
                         float *entropy, float *logits, size_t logits_stride) {
    static const char fn[] = "parity_head_logprobs";
    clear_error();
    TRY(arg_policy(fn, policy));
    TRY(check_backend(fn, backend));
    dist_params dp;
    TRY(check_head_options(fn, options, vocab, &dp));
    TRY(arg_shape(fn, rows, dim));
    TRY(arg_ptr(fn, residual, "residual"));
    TRY(arg_ptr(fn, delta, "delta"));
    TRY(arg_ptr(fn, norm_weight, "norm_weight"));
    TRY(arg_ptr(fn, lm_head, "lm_head"));
    TRY(arg_ptr(fn, targets, "targets"));
    TRY(arg_ptr(fn, logprobs, "logprobs"));
    TRY(arg_eps(fn, eps));
    TRY(check_weight_dtype(fn, policy, w_dtype, "the weights"));
    TRY(arg_rows(fn, rows, dim, residual_stride, "residual"));
    TRY(arg_rows(fn, rows, dim, delta_stride, "delta"));
    TRY(arg_rows(fn, vocab, dim, lm_head_stride, "lm_head"));
    if (logits) TRY(arg_rows(fn, rows, vocab, logits_stride, "logits"));
    TRY(check_targets(fn, rows, targets, vocab));

    op_call c;
    TRY(op_begin(&c, pool, fn));
    const size_t workers = pool_size(c.pool);
    fwd_scratch s = {0};
    gemm_weights head;
    /* the residual stream and the sublayer output are the head's own copies (it updates
     * them in place), then the norm output, the logits and the per-worker work buffers */
    float *h = op_alloc(&c, (uint64_t)rows * dim, sizeof(float), "residual stream");
    float *d = h ? op_alloc(&c, (uint64_t)rows * dim, sizeof(float), "sublayer output") : NULL;
    float *xn = d ? op_alloc(&c, (uint64_t)rows * dim, sizeof(float), "norm output") : NULL;
    float *lg = xn ? op_alloc(&c, (uint64_t)rows * vocab, sizeof(float), "logits") : NULL;
    float *work = lg ? op_alloc(&c, (uint64_t)workers * dist_work_floats(vocab), sizeof(float),
                                "log-prob work") : NULL;
    float *norm = work ? op_alloc(&c, dim, sizeof(float), "norm weight") : NULL;
    int rc = norm ? gemm_weights_of(&c, policy, backend, vocab, dim, lm_head, lm_head_stride, &head)
              : PARITY_ERR_OUT_OF_MEMORY;
    if (!rc && backend != PARITY_BACKEND_OPENBLAS && policy->compute == PARITY_COMPUTE_BF16)
        rc = gemm_scratch_of(&c, rows, dim, &s.gemm);
    if (!rc) {
        for (size_t r = 0; r < rows; r++) {
            memcpy(h + r * dim, residual + r * residual_stride, dim * sizeof *h);
            memcpy(d + r * dim, delta + r * delta_stride, dim * sizeof *d);
        }
        for (size_t i = 0; i < dim; i++) norm[i] = weight_element(w_dtype, norm_weight, i);
        const fwd_ctx ctx = op_ctx(&c, policy, backend, NULL, &s, NULL);
        forward_head(&ctx, rows, d, h, norm, eps, xn, &head, lg);
        head_lp_job j = {policy, dp, lg, vocab, targets, work, logprobs, entropy};
        pool_run(c.pool, job_head_logprobs, &j, rows);
        if (logits)
            for (size_t r = 0; r < rows; r++)
                memcpy(logits + r * logits_stride, lg + r * vocab, vocab * sizeof *lg);
    }
    op_end(&c);
    return rc;
}

/* The head's second half on the caller's logits, as parity_head_logprobs runs it on its own. */
int parity_logprobs_from_logits(parity_pool *pool, const parity_policy *policy,
                                const parity_score_options *options, size_t rows, size_t vocab,
                                const float *logits, size_t logits_stride,
                                const int32_t *targets, float *logprobs, float *entropy) {
    static const char fn[] = "parity_logprobs_from_logits";
    clear_error();
    TRY(arg_policy(fn, policy));
    dist_params dp;
    TRY(check_head_options(fn, options, vocab, &dp));
    if (rows == 0) return set_error(PARITY_ERR_INVALID_ARGUMENT, "%s: rows is 0", fn);
    TRY(arg_ptr(fn, logits, "logits"));
    TRY(arg_ptr(fn, targets, "targets"));
    TRY(arg_ptr(fn, logprobs, "logprobs"));
    TRY(arg_rows(fn, rows, vocab, logits_stride, "logits"));
    TRY(check_targets(fn, rows, targets, vocab));

    op_call c;
    TRY(op_begin(&c, pool, fn));
    const size_t workers = pool_size(c.pool);
    /* the rows packed vocab apart, as the head's logits are, unless they are already */
    float *packed = logits_stride == vocab ? NULL
                                           : op_alloc(&c, (uint64_t)rows * vocab, sizeof(float),
                                                      "logits");
    float *work = packed || logits_stride == vocab
                      ? op_alloc(&c, (uint64_t)workers * dist_work_floats(vocab), sizeof(float),
                                 "log-prob work")
                      : NULL;
    const int rc = work ? PARITY_OK : PARITY_ERR_OUT_OF_MEMORY;
    if (!rc) {
        if (packed)
            for (size_t r = 0; r < rows; r++)
                memcpy(packed + r * vocab, logits + r * logits_stride, vocab * sizeof *packed);
        const float *lg = packed ? packed : logits;
        head_lp_job j = {policy, dp, lg, vocab, targets, work, logprobs, entropy};
        pool_run(c.pool, job_head_logprobs, &j, rows);
    }
    op_end(&c);
    return rc;
}
