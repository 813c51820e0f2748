/* The forward's types: a batch's rows and a looped row's exit rule and state, the scratch,
 * the profile's counters and the context that every piece of the forward reads. Types only,
 * no function: a piece of the forward includes them without seeing any other piece. */
#ifndef PARITY_ENGINE_FORWARD_TYPES_H
#define PARITY_ENGINE_FORWARD_TYPES_H

#include <stddef.h>
#include <stdint.h>

#include "base/threadpool.h"
#include "model/model.h"
#include "parity.h"

/* A looped model's row in a forward: the depth it runs to (0: its exit rule decides), its
 * exit distribution so far, and whether it has exited. */
typedef struct loop_state {
    float remaining;   /* survival mass: the product of (1 - lambda) over the loops run */
    float cdf_sum;     /* the sum of the exit probabilities so far (fp32, as torch.cumsum) */
    uint32_t target;   /* 1..loops, 0 = decided by the exit rule */
    uint32_t exited;   /* its output has been taken (h_exit) */
} loop_state;

/* ---- a batch ------------------------------------------------------------------------------
 * One row = one token of one sequence at one position. A row attends to positions 0..pos of
 * its sequence (the cells its block table names); rows of the same sequence in one batch
 * must come in position order, and positions before the batch's first row must already be in
 * the cache. */
/* A looped model's exit rule for one row (the threshold rule: parity_sampling). */
typedef struct fwd_exit {
    float threshold;              /* exit after the first loop whose exit CDF >= threshold */
    uint32_t min_depth, max_depth; /* 1 <= min_depth <= max_depth <= loops */
} fwd_exit;

typedef struct fwd_row {
    int32_t token;
    uint32_t pos;
    const uint32_t *blocks;
    /* Looped models (config_loops > 1, or arch ouro), ignored by the others. In: the loops
     * the row runs, 1..loops (0 = all), unless `exit` names a rule, which then decides it
     * from the gate after each loop. Out: the loops whose output the row's logits read (its
     * exit depth). */
    uint32_t depth;
    const fwd_exit *exit;
    /* Mixture-of-experts models, ignored by the others: NULL, or the row's experts in each
     * sparse layer, [sparse layers][num_experts_per_tok] in slot order. route_replay: taken
     * instead of the router's top-k (the weights still come from the router); route_record:
     * written with the experts the row ran. */
    const uint16_t *route_replay;
    uint16_t *route_record;
} fwd_row;

/* The bf16-weight GEMM's scratch: x packed in either layout (gemm_scratch_xpack_floats of the
 * largest M and K), and one weight panel of gemm_panel_floats(max_k) floats per worker. */
typedef struct gemm_scratch {
    float *xpack;
    float *panels;
    size_t max_k;
} gemm_scratch;

/* Scratch for batches of up to max_rows rows and contexts up to max_ctx positions. */
typedef struct fwd_scratch {
    uint32_t max_rows, max_ctx;
    float *h;       /* [max_rows][hidden]       the residual stream */
    float *delta;   /* [max_rows][hidden]       a sublayer's output, added to h */
    float *xn;      /* [max_rows][hidden]       a norm's output, the next GEMM's input */
    float *q;       /* [max_rows][heads*hd]     queries */
    float *k, *v;   /* [max_rows][kv_heads*hd]  this batch's keys and values */
    float *att;     /* [max_rows][heads*hd]     attention output */
    float *gate;    /* [max_rows][intermediate] */
    float *up;      /* [max_rows][intermediate] */
    gemm_scratch gemm; /* packed GEMM input, per-worker weight panels */
    float *scores;  /* [workers][ATTN_TASK_ROWS][group][max_ctx] attention scores / probabilities */
    float *pv;      /* [workers][attn_pv_floats(group, head_dim)] attention accumulators, sums, blocks */
    uint32_t *attn_fresh; /* [max_rows] per row: the first position of its sequence in the forward */
    float *partial; /* [max_rows][widest GEMM output] split-K partial sums (only when asked) */
    /* looped models only (NULL otherwise): */
    float *h_exit;  /* [max_rows][hidden]       each row's output at its exit loop */
    struct loop_state *loop_state; /* [max_rows] per row: its target and exit distribution */
    fwd_row *loop_rows; /* [max_rows]           the rows still running a loop, packed */
    uint32_t *loop_slot; /* [max_rows]          the batch row of each of them */
    /* mixture-of-experts models only (NULL otherwise): */
    float *moe_logits;  /* [max_rows][experts]  router logits */
    uint16_t *moe_ids;  /* [max_rows][k]        each row's experts, slot order */
    float *moe_weights; /* [max_rows][k]        and their weights */
    uint32_t *moe_order; /* [max_rows * k]      (row, slot) pairs grouped by expert */
    uint32_t *moe_count; /* [experts + 1]       where each expert's pairs start in moe_order */
    float *moe_x;       /* [max_rows][hidden]   the rows of one expert, gathered */
    float *moe_out;     /* [max_rows][hidden]   one expert's down projection of them */
    float *moe_y;       /* [max_rows][k][hidden] each slot's down projection, fp32 */
    float *moe_shared;  /* [max_rows][hidden]   the shared expert's down projection, fp32 */
    float *moe_gate;    /* [max_rows]           the shared expert's gate logit */
    float *moe_route;   /* moe_route_scratch_floats(experts) */
} fwd_scratch;

/* A profile's counters (parity_profile), kept by an engine while profiling is on. */
typedef struct fwd_profile {
    double phase_s[PARITY_PHASE_COUNT];
    uint64_t calls, forwards, rows;
    double call_s;
} fwd_profile;

/* Everything a forward needs besides the batch. */
typedef struct fwd_ctx {
    const parity_model *model;  /* NULL in a kernel entry point (ops.c) */
    const parity_config *config;  /* the shapes: the model's, or a kernel entry point's */
    parity_policy pol;
    uint32_t backend;       /* parity_backend */
    threadpool *pool;
    struct kv_cache *kv;    /* kvcache.h */
    fwd_scratch *s;
    /* kernel-order experiments (parity_sampler_params): 0 = the contract's orders */
    uint32_t split_k, split_kv;
    fwd_profile *prof;      /* NULL unless the caller profiles (parity_*_set_profiling) */
    uint32_t loop_kv;       /* parity_loop_kv: looped models' K/V after a row's exit depth */
    /* Looped models, the dense learner's readouts (the scorer's): NULL, or every row's output
     * after every loop it runs, loop_out[loop][row][hidden] (rows s->max_rows apart), and the
     * exit distribution of the rows with a fixed depth, loop_pdf[row][loop] (p of each loop
     * they run; a model with an exit gate) */
    float *loop_out;
    float *loop_pdf;
} fwd_ctx;

#endif /* PARITY_ENGINE_FORWARD_TYPES_H */
