/* The KV cache's storage and the forward's scratch buffers. */
#include "forward.h"
#include "base/internal.h"
#include "kernels/kernels.h"
#include "model/config.h"

/* Whole blocks: a block's cells are laid out head by head (forward.h). */
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

/* The scratch buffers and their sizes in floats, in one table for allocation and accounting. */
typedef struct scratch_buf {
    void **p;
    uint64_t n;          /* elements */
    const char *what;
    size_t size;         /* bytes an element; 0 = a float */
} scratch_buf;

static size_t elem_size(const scratch_buf *b) { return b->size ? b->size : sizeof(float); }

static size_t scratch_layout(fwd_scratch *s, const parity_config *c, uint32_t max_rows,
                             uint32_t max_ctx, unsigned n_workers, int split_k, scratch_buf *b) {
    const uint64_t R = max_rows, q = (uint64_t)c->num_attention_heads * c->head_dim,
                   kvw = (uint64_t)c->num_key_value_heads * c->head_dim,
                   group = c->num_attention_heads / c->num_key_value_heads; /* query heads per KV head */
    uint64_t kmax = c->hidden_size > c->intermediate_size ? c->hidden_size : c->intermediate_size;
    if (q > kmax) kmax = q;
    const uint64_t nmax = kmax > c->vocab_size ? kmax : c->vocab_size; /* widest GEMM output */
    const int looped = c->arch == PARITY_ARCH_OURO;
    s->gemm.max_k = (size_t)kmax;
    const scratch_buf bufs[] = {
        {(void **)&s->h, R * c->hidden_size, "residual stream", 0},
        {(void **)&s->delta, R * c->hidden_size, "sublayer output", 0},
        {(void **)&s->xn, R * c->hidden_size, "norm output", 0},
        {(void **)&s->q, R * q, "queries", 0},
        {(void **)&s->k, R * kvw, "keys", 0},
        {(void **)&s->v, R * kvw, "values", 0},
        {(void **)&s->att, R * q, "attention output", 0},
        {(void **)&s->gate, R * c->intermediate_size, "gate projection", 0},
        {(void **)&s->up, R * c->intermediate_size, "up projection", 0},
        {(void **)&s->gemm.xpack, gemm_scratch_xpack_floats(R, kmax), "packed GEMM input", 0},
        {(void **)&s->gemm.panels, (uint64_t)n_workers * gemm_panel_floats(kmax), "GEMM weight panels", 0},
        {(void **)&s->scores, (uint64_t)n_workers * ATTN_TASK_ROWS * group * max_ctx, "attention scores", 0},
        {(void **)&s->pv, (uint64_t)n_workers * attn_pv_floats(group, c->head_dim), "attention accumulators", 0},
        {(void **)&s->attn_fresh, R, "attention rows' first positions", sizeof(uint32_t)},
        {(void **)&s->partial, split_k ? R * nmax : 0, "split-K partial sums", 0},
        {(void **)&s->h_exit, looped ? R * c->hidden_size : 0, "exit-loop outputs", 0},
        {(void **)&s->loop_state, looped ? R : 0, "exit distributions", sizeof(loop_state)},
        {(void **)&s->loop_rows, looped ? R : 0, "loop rows", sizeof(fwd_row)},
        {(void **)&s->loop_slot, looped ? R : 0, "loop rows", sizeof(uint32_t)},
    };
    memcpy(b, bufs, sizeof bufs);
    return sizeof bufs / sizeof bufs[0];
}

#define MAX_SCRATCH_BUFS 20

uint64_t fwd_scratch_bytes(const parity_config *c, uint32_t max_rows, uint32_t max_ctx,
                           unsigned n_workers, int split_k) {
    fwd_scratch s;
    scratch_buf b[MAX_SCRATCH_BUFS] = {{0}};
    size_t n = scratch_layout(&s, c, max_rows, max_ctx, n_workers, split_k, b);
    uint64_t total = 0;
    for (size_t i = 0; i < n; i++) total += b[i].n * elem_size(&b[i]);
    return total;
}

int fwd_scratch_init(fwd_scratch *s, const parity_config *c, uint32_t max_rows,
                     uint32_t max_ctx, unsigned n_workers, int split_k, int prefault) {
    memset(s, 0, sizeof *s);
    s->max_rows = max_rows;
    s->max_ctx = max_ctx;
    scratch_buf b[MAX_SCRATCH_BUFS] = {{0}};
    size_t n = scratch_layout(s, c, max_rows, max_ctx, n_workers, split_k, b);
    for (size_t i = 0; i < n; i++) {
        if (b[i].n == 0) continue;
        if (b[i].n > SIZE_MAX / elem_size(&b[i])) {
            fwd_scratch_free(s);
            return set_error(PARITY_ERR_OUT_OF_MEMORY, "%s: too large", b[i].what);
        }
        *b[i].p = px_huge_alloc((size_t)b[i].n * elem_size(&b[i]), b[i].what);
        if (!*b[i].p) {
            fwd_scratch_free(s);
            return PARITY_ERR_OUT_OF_MEMORY;
        }
        if (prefault) memset(*b[i].p, 0, (size_t)b[i].n * elem_size(&b[i]));
    }
    return PARITY_OK;
}

/* Every buffer of scratch_layout's list (keep the two lists the same). */
void fwd_scratch_free(fwd_scratch *s) {
    void **all[] = {(void **)&s->h, (void **)&s->delta, (void **)&s->xn, (void **)&s->q,
                    (void **)&s->k, (void **)&s->v, (void **)&s->att, (void **)&s->gate,
                    (void **)&s->up, (void **)&s->gemm.xpack, (void **)&s->gemm.panels,
                    (void **)&s->scores, (void **)&s->pv, (void **)&s->attn_fresh,
                    (void **)&s->partial, (void **)&s->h_exit, (void **)&s->loop_state,
                    (void **)&s->loop_rows, (void **)&s->loop_slot};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) {
        px_free(*all[i]);
        *all[i] = NULL;
    }
}
