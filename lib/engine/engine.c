/* The engine under the scorer and the sampler (engine.h). */
#include <stdio.h>
#include <string.h>

#include "engine.h"
#include "base/alloc.h"
#include "base/errors.h"
#include "base/in_use.h"
#include "profile.h"
#include "scratch.h"
#include "kernels/kernels.h"
#include "model/config.h"

void engine_default_settings(uint32_t *n_threads, uint32_t *backend, parity_policy *policy) {
    *n_threads = 1;
    *backend = PARITY_BACKEND_BF16;
    parity_policy_from_name("aligned", policy);
}

int engine_check(const parity_policy *pol, uint32_t backend, uint32_t n_threads) {
    TRY(parity_policy_validate(pol));
    TRY(parity_backend_check((int)backend)); /* known, and this CPU runs it */
    if (n_threads > 256)
        return set_error(PARITY_ERR_INVALID_ARGUMENT, "n_threads %u is more than 256", n_threads);
    return PARITY_OK;
}

int engine_weight_needs(const parity_policy *pol, uint32_t backend) {
    /* fp32 masters (or bf16 widened) under fp32, fp16 values under fp16, and the widened
     * bf16 weights the openblas backend streams under bf16 */
    return pol->compute == PARITY_COMPUTE_FP16 ? MODEL_NEED_FP16
           : pol->compute == PARITY_COMPUTE_FP32 || backend == PARITY_BACKEND_OPENBLAS
               ? MODEL_NEED_WIDE
               : 0;
}

int engine_prepare_weights(const parity_model *m, const parity_policy *pol, uint32_t backend) {
    int need = engine_weight_needs(pol, backend);
    const int fp8 = pol->gemm != PARITY_GEMM_BF16;
    /* the values of shipped codes: for a bf16 GEMM and for fp32 or fp16 weights (a quantizer
     * of another format asks for them itself, in model_prepare_quant) */
    if (!fp8 || need) need |= MODEL_NEED_VALUES;
    /* fp32 compute reads every weight's master where it has one: none may be dropped */
    if (pol->compute == PARITY_COMPUTE_FP32) need |= MODEL_NEED_MASTERS;
    if (!need && !fp8) return PARITY_OK;
    TRY(model_enter(m));
    int rc = model_prepare((parity_model *)m, need);
    /* the fp8 copies of the decoder layers' linear weights with the policy's quantizer */
    if (!rc && fp8) rc = model_prepare_quant((parity_model *)m, pol->quantizer);
    model_leave(m);
    return rc;
}

/* The table: the engine's own buffers, then the extras. Returns the count. */
static size_t engine_layout(engine *e, const parity_config *c, const engine_params *p,
                            const engine_buf *extra, size_t n_extra, engine_buf *b) {
    const uint64_t R = p->max_rows, V = c->vocab_size;
    const engine_buf own[] = {
        {(void **)&e->rows, R, sizeof *e->rows, 0, "batch rows"},
        {(void **)&e->out_rows, R, sizeof *e->out_rows, 0, "batch rows"},
        {(void **)&e->logits, R * V, sizeof *e->logits, 1, "logits"},
        {(void **)&e->work, (uint64_t)p->n_threads * p->works * dist_work_floats(V), sizeof *e->work, 1, "log-softmax work"},
    };
    const size_t n_own = sizeof own / sizeof own[0];
    memcpy(b, own, sizeof own);
    memcpy(b + n_own, extra, n_extra * sizeof *extra);
    return n_own + n_extra;
}

uint64_t engine_bytes(const parity_config *c, const engine_params *p, size_t object_size,
                      const engine_buf *extra, size_t n_extra) {
    engine e;
    engine_buf b[ENGINE_MAX_BUFS];
    size_t n = engine_layout(&e, c, p, extra, n_extra, b);
    uint64_t total = object_size + pool_bytes(p->n_threads) +
                     kv_cache_bytes(c, p->kv_cells, kv_cells_fp32(&p->policy)) +
                     fwd_scratch_bytes(c, p->max_rows, p->max_ctx, p->n_threads, p->split_k > 1);
    for (size_t i = 0; i < n; i++) total += b[i].count * b[i].size;
    return total;
}

void engine_free(engine *e) {
    pool_free(e->pool);
    e->pool = NULL;
    kv_cache_free(&e->kv);
    fwd_scratch_free(&e->scratch);
    for (size_t i = 0; i < e->n_bufs; i++) {
        px_free(*e->bufs[i].p);
        *e->bufs[i].p = NULL;
    }
    e->n_bufs = 0;
}

int engine_init(engine *e, const parity_model *m, const engine_params *p, const engine_buf *extra,
                size_t n_extra) {
    const parity_config *c = &m->config;
    e->model = m;
    e->p = *p;
    atomic_init(&e->in_use, 0);
    e->n_bufs = engine_layout(e, c, p, extra, n_extra, e->bufs);
    for (size_t i = 0; i < e->n_bufs; i++) *e->bufs[i].p = NULL;
    int rc = pool_create(p->n_threads, &e->pool);
    if (!rc) rc = kv_cache_init(&e->kv, c, p->kv_cells, kv_cells_fp32(&p->policy), p->prefault);
    if (!rc)
        rc = fwd_scratch_init(&e->scratch, c, p->max_rows, p->max_ctx, p->n_threads,
                              p->split_k > 1, p->prefault);
    for (size_t i = 0; !rc && i < e->n_bufs; i++) {
        const engine_buf *b = &e->bufs[i];
        uint64_t bytes;
        if (mul_overflows(b->count, b->size, &bytes) || bytes > SIZE_MAX) {
            rc = set_error(PARITY_ERR_OUT_OF_MEMORY, "%s: %llu x %llu bytes is too large", b->what,
                           (unsigned long long)b->count, (unsigned long long)b->size);
            break;
        }
        *b->p = b->large ? px_huge_alloc((size_t)bytes, b->what)
                         : px_calloc((size_t)b->count, (size_t)b->size, b->what);
        if (!*b->p)
            rc = PARITY_ERR_OUT_OF_MEMORY;
        else if (p->prefault)
            memset(*b->p, 0, (size_t)bytes);  /* zeroed or not initialised: zeros either way */
    }
    if (rc) engine_free(e);
    return rc;
}

int engine_enter(engine *e, const char *what, double *t0) {
    if (!e) return set_error(PARITY_ERR_INVALID_ARGUMENT, "%s is NULL", what);
    TRY(object_enter(&e->in_use, what));
    if (t0) *t0 = e->profiling ? profile_now() : 0.0;
    return PARITY_OK;
}

int engine_leave(engine *e, const double *t0, int status) {
    if (t0 && e->profiling) {
        e->prof.calls++;
        e->prof.call_s += profile_now() - *t0;
    }
    object_leave(&e->in_use);
    return status;
}

fwd_ctx engine_fwd_ctx(engine *e) {
    return (fwd_ctx){e->model, &e->model->config, e->p.policy, e->p.backend, e->pool, &e->kv,
                     &e->scratch, 0, 0, e->profiling ? &e->prof : NULL,
                     PARITY_LOOP_KV_LAST_EXITED, NULL, NULL};
}

/* ---- profiling ----------------------------------------------------------------------------- */

int engine_set_profiling(engine *e, const char *what, int on) {
    clear_error();
    TRY(engine_enter(e, what, NULL));
    e->profiling = on != 0;
    memset(&e->prof, 0, sizeof e->prof);
    pool_set_timing(e->pool, on);
    return engine_leave(e, NULL, PARITY_OK);
}

int engine_profile(const engine *e, const char *what, parity_profile *out) {
    clear_error();
    if (!e || !out) return set_error(PARITY_ERR_INVALID_ARGUMENT, "%s or output is NULL", what);
    if (out->size != sizeof *out)
        return set_error(PARITY_ERR_INVALID_ARGUMENT,
                         "profile.size is %u, this library expects %zu", out->size, sizeof *out);
    memset(out, 0, sizeof *out);
    out->size = sizeof *out;
    out->enabled = (uint32_t)e->profiling;
    out->calls = e->prof.calls;
    out->forwards = e->prof.forwards;
    out->rows = e->prof.rows;
    out->call_seconds = e->prof.call_s;
    for (int i = 0; i < PARITY_PHASE_COUNT; i++) out->phase_seconds[i] = e->prof.phase_s[i];
    pool_timing(e->pool, &out->dispatch_seconds, &out->loops);
    return PARITY_OK;
}

/* ---- objects on an engine ---------------------------------------------------------------- */

/* Room for either kind's resolved params. */
typedef union any_params {
    parity_scorer_params scorer;
    parity_sampler_params sampler;
} any_params;

static engine *engine_of(const engine_kind *k, void *object) {
    return (engine *)((char *)object + k->engine_offset);
}

static int resolve(const engine_kind *k, const parity_model *m, const void *params,
                   any_params *resolved, engine_params *ep) {
    if (!m || !params) return set_error(PARITY_ERR_INVALID_ARGUMENT, "model or params is NULL");
    uint32_t size;
    memcpy(&size, params, sizeof size);
    if (size != k->params_size)
        return set_error(PARITY_ERR_INVALID_ARGUMENT,
                         "params.size is %u, this library expects %zu: initialise the params "
                         "with parity_%s_default_params()",
                         size, k->params_size, k->name);
    int rc = k->resolve(m, params, resolved, ep);
    if (!rc) rc = engine_check(&ep->policy, ep->backend, ep->n_threads);
    /* top-k-then-softmax renormalises the chosen weights: not the meaning of a model whose
     * norm_topk_prob is false */
    if (!rc && config_is_moe(&m->config) && !m->config.norm_topk_prob &&
        ep->policy.moe_router == PARITY_MOE_ROUTER_TOPK_SOFTMAX)
        rc = set_error(PARITY_ERR_POLICY,
                       "policy moe_router topk-softmax renormalises the chosen experts' "
                       "weights, and this model's norm_topk_prob is false");
    return rc;
}

/* An object's params resolved, its engine's params, and the bytes it would take. */
typedef struct sized {
    any_params resolved;
    engine_params ep;
    uint64_t bytes;
} sized;

/* Checks the call (`out`: the caller's output pointer) and sizes the object. */
static int size_object(const engine_kind *k, const parity_model *m, const void *params,
                       const void *out, sized *z) {
    if (!out) return set_error(PARITY_ERR_INVALID_ARGUMENT, "output is NULL");
    TRY(resolve(k, m, params, &z->resolved, &z->ep));
    engine_buf b[ENGINE_MAX_BUFS];
    size_t n = k->bufs(k->layout, &m->config, &z->resolved, &z->ep, b);
    z->bytes = engine_bytes(&m->config, &z->ep, k->object_size, b, n);
    return PARITY_OK;
}

int engine_object_bytes(const engine_kind *k, const parity_model *m, const void *params,
                        uint64_t *bytes) {
    sized z;
    int rc = size_object(k, m, params, bytes, &z);
    if (rc == PARITY_OK) *bytes = z.bytes;
    return rc;
}

int engine_object_create(const engine_kind *k, const parity_model *m, const void *params,
                         void *out) {
    sized z;
    TRY(size_object(k, m, params, out, &z));
    const any_params *resolved = &z.resolved;
    const engine_params *ep = &z.ep;

    /* what the object will hold, against the caller's ceiling, before anything is taken */
    if (ep->max_memory && z.bytes > ep->max_memory) {
        char sizes[160];
        k->describe(resolved, sizes, sizeof sizes);
        return set_error(PARITY_ERR_MEMORY_LIMIT,
                         "the %s needs %llu bytes of KV cache, scratch and tables (%s), more "
                         "than max_memory = %llu",
                         k->name, (unsigned long long)z.bytes, sizes,
                         (unsigned long long)ep->max_memory);
    }
    TRY(engine_prepare_weights(m, &ep->policy, ep->backend));

    void *object = px_calloc(1, k->object_size, k->name);
    if (!object) return PARITY_ERR_OUT_OF_MEMORY;
    memcpy((char *)object + k->params_offset, resolved, k->params_size);
    engine_buf b[ENGINE_MAX_BUFS];
    size_t n = k->bufs(object, &m->config, resolved, ep, b);
    const int rc = engine_init(engine_of(k, object), m, ep, b, n);
    if (rc) {
        px_free(object);
        return rc;
    }
    k->start(object, m);
    memcpy(out, &object, sizeof object); /* into the caller's typed pointer */
    return PARITY_OK;
}

void engine_object_free(const engine_kind *k, void *object) {
    if (!object) return;
    engine_free(engine_of(k, object));
    px_free(object);
}
