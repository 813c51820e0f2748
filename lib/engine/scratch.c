/* The forward's scratch buffers: their sizes for a model and a batch, in one table from which
 * both the reported bytes and the allocations are made. */
#include "scratch.h"

#include <string.h>

#include "attention.h"
#include "base/alloc.h"
#include "base/errors.h"
#include "gemm.h"
#include "kernels/kernels.h"
#include "kernels/moe.h"
#include "model/model.h"

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
    /* the widest MLP: the dense one, a routed expert, the shared expert */
    uint64_t inter = c->intermediate_size;
    if (c->moe_intermediate_size > inter) inter = c->moe_intermediate_size;
    if (c->shared_expert_intermediate_size > inter) inter = c->shared_expert_intermediate_size;
    uint64_t kmax = c->hidden_size > inter ? c->hidden_size : inter;
    if (q > kmax) kmax = q;
    uint64_t nmax = kmax > c->vocab_size ? kmax : c->vocab_size; /* widest GEMM output */
    if (c->num_experts > nmax) nmax = c->num_experts;            /* a router's logits */
    const int looped = c->arch == PARITY_ARCH_OURO;
    const uint64_t E = c->num_experts, k = c->num_experts_per_tok, /* 0 for dense models */
        shared = c->shared_expert_intermediate_size;
    s->gemm.max_k = (size_t)kmax;
    const scratch_buf bufs[] = {
        {(void **)&s->h, R * c->hidden_size, "residual stream", 0},
        {(void **)&s->delta, R * c->hidden_size, "sublayer output", 0},
        {(void **)&s->xn, R * c->hidden_size, "norm output", 0},
        {(void **)&s->q, R * q, "queries", 0},
        {(void **)&s->k, R * kvw, "keys", 0},
        {(void **)&s->v, R * kvw, "values", 0},
        {(void **)&s->att, R * q, "attention output", 0},
        {(void **)&s->gate, R * inter, "gate projection", 0},
        {(void **)&s->up, R * inter, "up projection", 0},
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
        {(void **)&s->moe_logits, R * E, "router logits", 0},
        {(void **)&s->moe_ids, R * k, "routed experts", sizeof(uint16_t)},
        {(void **)&s->moe_weights, R * k, "routing weights", 0},
        {(void **)&s->moe_order, R * k, "rows by expert", sizeof(uint32_t)},
        {(void **)&s->moe_count, E ? E + 1 : 0, "rows per expert", sizeof(uint32_t)},
        {(void **)&s->moe_x, E ? R * c->hidden_size : 0, "an expert's rows", 0},
        {(void **)&s->moe_out, E ? R * c->hidden_size : 0, "an expert's output", 0},
        {(void **)&s->moe_y, R * k * c->hidden_size, "experts' outputs", 0},
        {(void **)&s->moe_shared, shared ? R * c->hidden_size : 0, "shared expert's output", 0},
        {(void **)&s->moe_gate, shared ? R : 0, "shared expert's gate", 0},
        {(void **)&s->moe_route, E ? moe_route_scratch_floats((uint32_t)E) : 0, "router", 0},
    };
    memcpy(b, bufs, sizeof bufs);
    return sizeof bufs / sizeof bufs[0];
}

#define MAX_SCRATCH_BUFS 32

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
                    (void **)&s->loop_rows, (void **)&s->loop_slot, (void **)&s->moe_logits,
                    (void **)&s->moe_ids, (void **)&s->moe_weights, (void **)&s->moe_order,
                    (void **)&s->moe_count, (void **)&s->moe_x, (void **)&s->moe_out,
                    (void **)&s->moe_y, (void **)&s->moe_shared, (void **)&s->moe_gate,
                    (void **)&s->moe_route};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) {
        px_free(*all[i]);
        *all[i] = NULL;
    }
}
