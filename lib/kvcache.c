/* The KV cache's storage and the forward's scratch buffers. */
#include "forward.h"
#include "internal.h"
#include "kernels.h"

int kv_cache_init(kv_cache *kv, const parity_config *c, uint32_t n_cells, int fp32) {
    memset(kv, 0, sizeof *kv);
    kv->n_layers = c->num_hidden_layers;
    kv->n_cells = n_cells;
    kv->width = c->num_key_value_heads * c->head_dim;
    kv->fp32 = fp32;
    uint64_t bytes;
    if (mul_overflows((uint64_t)kv->n_layers * n_cells, (uint64_t)kv->width * (fp32 ? 4 : 2), &bytes) ||
        bytes > SIZE_MAX)
        return set_error(PARITY_ERR_OUT_OF_MEMORY, "KV cache of %u positions is too large", n_cells);
    kv->k = px_aligned_alloc((size_t)bytes, "KV cache (keys)");
    kv->v = kv->k ? px_aligned_alloc((size_t)bytes, "KV cache (values)") : NULL;
    if (!kv->v) {
        kv_cache_free(kv);
        return PARITY_ERR_OUT_OF_MEMORY;
    }
    return PARITY_OK;
}

void kv_cache_free(kv_cache *kv) {
    px_free(kv->k);
    px_free(kv->v);
    kv->k = kv->v = NULL;
}

int fwd_scratch_init(fwd_scratch *s, const parity_config *c, uint32_t max_rows,
                     uint32_t max_ctx, unsigned n_workers, int split_k) {
    memset(s, 0, sizeof *s);
    s->max_rows = max_rows;
    s->max_ctx = max_ctx;
    const size_t R = max_rows, q = (size_t)c->num_attention_heads * c->head_dim,
                 kvw = (size_t)c->num_key_value_heads * c->head_dim;
    size_t kmax = c->hidden_size > c->intermediate_size ? c->hidden_size : c->intermediate_size;
    if (q > kmax) kmax = q;
    size_t nmax = kmax > c->vocab_size ? kmax : c->vocab_size; /* widest GEMM output */
    struct {
        float **p;
        size_t n;
        const char *what;
    } bufs[] = {
        {&s->h, R * c->hidden_size, "residual stream"},
        {&s->delta, R * c->hidden_size, "sublayer output"},
        {&s->xn, R * c->hidden_size, "norm output"},
        {&s->q, R * q, "queries"},
        {&s->k, R * kvw, "keys"},
        {&s->v, R * kvw, "values"},
        {&s->att, R * q, "attention output"},
        {&s->gate, R * c->intermediate_size, "gate projection"},
        {&s->up, R * c->intermediate_size, "up projection"},
        {&s->xpack, R * gemm_packed_row(kmax), "packed GEMM input"},
        {&s->scores, (size_t)n_workers * max_ctx, "attention scores"},
        {&s->pv, (size_t)n_workers * 2 * c->head_dim, "attention accumulators"},
        {&s->partial, split_k ? R * nmax : 0, "split-K partial sums"},
    };
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) {
        if (bufs[i].n == 0) continue;
        *bufs[i].p = px_aligned_alloc(bufs[i].n * sizeof(float), bufs[i].what);
        if (!*bufs[i].p) {
            fwd_scratch_free(s);
            return PARITY_ERR_OUT_OF_MEMORY;
        }
    }
    return PARITY_OK;
}

void fwd_scratch_free(fwd_scratch *s) {
    float **all[] = {&s->h, &s->delta, &s->xn, &s->q, &s->k, &s->v, &s->att,
                     &s->gate, &s->up, &s->xpack, &s->scores, &s->pv, &s->partial};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) {
        px_free(*all[i]);
        *all[i] = NULL;
    }
}
