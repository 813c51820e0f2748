/* The KV cache: its storage, and the store of a batch's keys and values into it. */
#include "kvcache.h"

#include <string.h>

#include "base/alloc.h"
#include "base/errors.h"
#include "base/floats.h"
#include "base/threadpool.h"
#include "model/config.h"
#include "model/model.h"

/* Whole blocks: a block's cells are laid out head by head (kvcache.h). */
static uint64_t whole_blocks(uint32_t n_cells) {
    return ((uint64_t)n_cells + KV_BLOCK - 1) / KV_BLOCK * KV_BLOCK;
}

uint64_t kv_cache_bytes(const parity_config *c, uint32_t n_cells, int fp32) {
    return 2ull * config_kv_planes(c) * whole_blocks(n_cells) * c->num_key_value_heads * c->head_dim * (fp32 ? 4 : 2);
}

int kv_cache_init(kv_cache *kv, const parity_config *c, uint32_t n_cells, int fp32, int prefault) {
    memset(kv, 0, sizeof *kv);
    kv->n_layers = config_kv_planes(c);
    kv->n_cells = (uint32_t)whole_blocks(n_cells);
    kv->width = c->num_key_value_heads * c->head_dim;
    kv->head_dim = c->head_dim;
    kv->fp32 = fp32;
    uint64_t bytes = kv_cache_bytes(c, n_cells, fp32) / 2;
    if (bytes > SIZE_MAX)
        return set_error(PARITY_ERR_OUT_OF_MEMORY, "KV cache of %u positions is too large", n_cells);
    /* streamed at every step like the weights: in huge pages where the OS gives them */
    kv->k = px_huge_alloc((size_t)bytes, "KV cache (keys)");
    kv->v = kv->k ? px_huge_alloc((size_t)bytes, "KV cache (values)") : NULL;
    if (!kv->v) {
        kv_cache_free(kv);
        return PARITY_ERR_OUT_OF_MEMORY;
    }
    if (prefault) {
        memset(kv->k, 0, (size_t)bytes);
        memset(kv->v, 0, (size_t)bytes);
    }
    return PARITY_OK;
}

void kv_cache_free(kv_cache *kv) {
    px_free(kv->k);
    px_free(kv->v);
    kv->k = kv->v = NULL;
}

/* ---- the store of a batch's keys and values ---------------------------------------------- */

typedef struct kv_store_job {
    const fwd_ctx *ctx;
    uint32_t layer;
    const fwd_row *rows;
    const float *k, *v;
    size_t k_stride, v_stride;
} kv_store_job;

static void kv_store_rows(void *p, size_t begin, size_t end, unsigned worker) {
    (void)worker;
    const kv_store_job *j = p;
    const kv_cache *kv = j->ctx->kv;
    const size_t w = kv->width, hd = kv->head_dim;
    for (size_t r = begin; r < end; r++)
        for (size_t h = 0; h < w / hd; h++) {
            const size_t off = kv_offset(kv, j->layer, j->rows[r].blocks, j->rows[r].pos, h);
            const float *kh = j->k + r * j->k_stride + h * hd, *vh = j->v + r * j->v_stride + h * hd;
            if (kv->fp32) {
                memcpy((float *)kv->k + off, kh, hd * sizeof(float));
                memcpy((float *)kv->v + off, vh, hd * sizeof(float));
            } else {
                /* exact for the forward: its K and V already hold bf16 values */
                uint16_t *kd = (uint16_t *)kv->k + off, *vd = (uint16_t *)kv->v + off;
                for (size_t i = 0; i < hd; i++) kd[i] = bf16_from_f32(kh[i]);
                for (size_t i = 0; i < hd; i++) vd[i] = bf16_from_f32(vh[i]);
            }
        }
}

/* Each row writes its own position's cells: the rows go over the pool (a decode step's one
 * row is stored by the caller: a pool round trip costs more). */
void kv_store(const fwd_ctx *ctx, uint32_t layer, size_t n_rows, const fwd_row *rows,
              const float *k, size_t k_stride, const float *v, size_t v_stride) {
    kv_store_job j = {ctx, layer, rows, k, v, k_stride, v_stride};
    if (n_rows <= 1)
        kv_store_rows(&j, 0, n_rows, 0);
    else
        pool_run(ctx->pool, kv_store_rows, &j, n_rows);
}
