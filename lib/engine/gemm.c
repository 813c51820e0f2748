/* GEMM backends. Both give every output element one fixed summation order, whatever M, the
 * tile the element falls in, or the thread that computes it; threads split the output
 * columns, never a reduction.
 *
 *   bf16:     the library's kernels (kernels.h: pair32 order on bf16 weights, dot16 on fp32
 *             weights under PARITY_COMPUTE_FP32 and on the fp16 values, held in fp32, under
 *             PARITY_COMPUTE_FP16), columns split over the pool. A table with
 *             bf16 dot products (avx512bf16) gets x packed as bf16 and runs gemm_bf16xw,
 *             unless some x is not a bf16 value (an fp32 attention output): then the pack
 *             says so and the fp32-FMA kernels run, with the same bits.
 *   openblas: cblas_sgemm on fp32 weights (bf16 widened exactly, the fp32 masters, or the
 *             fp16 values), one
 *             row per call. On Zen, OpenBLAS 0.3.21's sgemm rounds a row differently
 *             depending on where it falls in an M tile (bench/openblas-invariance shows it),
 *             so only calls of one fixed shape (M = 1, the whole N and K) agree bitwise.
 *             OpenBLAS's own threading is the host's to set; it splits N, which was
 *             measured to leave M = 1 results unchanged. */
#if defined(PARITY_HAVE_OPENBLAS)
#include <cblas.h>
#endif
#include <stdatomic.h>
#include <string.h>

#include "gemm.h"
#include "base/alloc.h"
#include "base/errors.h"
#include "base/floats.h"
#include "base/threadpool.h"
#include "gemm_quant.h"
#include "kernels/kernel_common.h"
#include "kernels/kernels.h"

/* Output columns per task: threads take contiguous runs of such blocks (a multiple of every
 * table's tile width in the large-M path). */
#define COLUMN_BLOCK 32
#define TILES_COLUMN_BLOCK 24

typedef struct gemm_job {
    const kernels *k;
    size_t M, K, N;
    const float *x;         /* packed x (bf16 weights) or x with row stride ldx (fp32) */
    size_t ldx;
    const uint16_t *xb;     /* x packed as bf16 rows for gemm_bf16xw, else NULL */
    const uint16_t *w16;    /* weights [N][ldw], starting at the first k of the slice */
    const float *w32;
    size_t ldw;
    float *y;
    size_t ldy;             /* row stride of y */
    float *panels;          /* large-M path: one panel per worker, else NULL */
    size_t panel_floats;
    const gemm_epilogue *ep;  /* or NULL */
} gemm_job;

/* An epilogue that is only the policy's rounding to bf16, which gemm_bf16xw does in its store
 * (the same bits as round_bf16 after it): a bias is added by the epilogue, outside the
 * kernel's flushing of denormals, which would flush a denormal bias or sum. */
static int rounds_in_store(const gemm_job *j) {
    return j->xb && j->ep && !j->ep->bias && j->ep->round &&
           round_format_of(j->ep->round) == FMT_BF16;
}

static void run_epilogue(const gemm_job *j, size_t n0, size_t n1) {
    if (!j->ep || n1 <= n0 || rounds_in_store(j)) return;
    for (size_t m = 0; m < j->M; m++) {
        float *row = j->y + m * j->ldy;
        if (j->ep->bias)
            for (size_t n = n0; n < n1; n++) row[n] += j->ep->bias[n];
        if (j->ep->round) round_with(j->k, j->ep->round, row + n0, n1 - n0);
    }
}

/* Output bytes a task computes before its epilogue runs on them: small enough to be still in
 * L2 (512 KB or more on the x86-64 CPUs seen here, half of it holding the x block of the
 * large-M kernels). Run on a whole range of a large-M GEMM (256 rows x 1536 columns, 1.5 MB),
 * the epilogue re-read its outputs from L3: on a Zen 4 VM (parity-speed, prefill 512 of
 * synthetic:qwen3-0.6b, aligned) the rounding epilogue cost 10-13% of the M = 256 GEMMs' time
 * that way, against 1-2% on pieces of this size. */
#define EPILOGUE_BYTES (96u * 1024u)

static void gemm_piece(const gemm_job *j, size_t n0, size_t n1, unsigned worker) {
    if (j->xb)
        j->k->gemm_bf16xw(j->M, j->K, j->xb, j->w16, j->ldw, j->y, j->ldy, n0, n1,
                          rounds_in_store(j));
    else if (j->panels)
        j->k->gemm_bf16w_tiles(j->M, j->K, j->x, j->w16, j->ldw, j->y, j->ldy, n0, n1,
                               j->panels + worker * j->panel_floats);
    else if (j->w16)
        j->k->gemm_bf16w(j->M, j->K, j->x, j->w16, j->ldw, j->y, j->ldy, n0, n1);
    else
        j->k->gemm_f32w(j->M, j->K, j->x, j->ldx, j->w32, j->ldw, j->y, j->ldy, n0, n1);
    run_epilogue(j, n0, n1);
}

/* The column blocks begin .. end-1: in one call to the kernel, or, with an epilogue that the
 * kernel does not do in its store, in pieces of whole blocks of at most EPILOGUE_BYTES of
 * output each (at least one block), each followed by its epilogue. An output's value does not
 * depend on the columns computed beside it, so the pieces change no bit. */
static void gemm_columns(void *ctx, size_t begin, size_t end, unsigned worker) {
    const gemm_job *j = ctx;
    const size_t block = j->panels ? TILES_COLUMN_BLOCK : COLUMN_BLOCK;
    size_t step = end - begin;
    if (j->ep && j->M && !rounds_in_store(j)) {
        const size_t fit = EPILOGUE_BYTES / (j->M * block * sizeof(float));
        if (fit < step) step = fit ? fit : 1;
    }
    for (size_t b = begin; b < end; b += step) {
        const size_t b1 = b + step < end ? b + step : end;
        gemm_piece(j, b * block, b1 * block < j->N ? b1 * block : j->N, worker);
    }
}

/* Several GEMMs on one x, packed once (gemm_bf16w_group_pool): task t is column block
 * t - first[p] of part p, for the part p whose blocks hold it. One GEMM is a group of one. */
typedef struct gemm_group_job {
    size_t n;
    gemm_job part[GEMM_GROUP_MAX];
    size_t first[GEMM_GROUP_MAX + 1];  /* the parts' first tasks, then the count of all */
} gemm_group_job;

/* Tasks begin .. end-1 of parts laid one after the other (part p's tasks first[p] ..
 * first[p+1]-1, n parts): run(job, p, b, e, worker) on each part's share, b and e counted
 * from its first task. */
static void over_parts(const void *job, size_t n, const size_t *first, size_t begin, size_t end,
                       unsigned worker,
                       void (*run)(const void *, size_t, size_t, size_t, unsigned)) {
    for (size_t p = 0; p < n && begin < end; p++) {
        if (begin >= first[p + 1]) continue;
        const size_t stop = end < first[p + 1] ? end : first[p + 1];
        run(job, p, begin - first[p], stop - first[p], worker);
        begin = stop;
    }
}

static void group_part(const void *job, size_t p, size_t b, size_t e, unsigned worker) {
    gemm_columns((void *)&((const gemm_group_job *)job)->part[p], b, e, worker);
}

static void gemm_group_columns(void *ctx, size_t begin, size_t end, unsigned worker) {
    const gemm_group_job *g = ctx;
    over_parts(g, g->n, g->first, begin, end, worker, group_part);
}

/* The large-M path splits columns statically: each worker's range passes its x blocks once.
 * The small-M path streams weights from memory, where one worker may be slowed down by the
 * other's traffic or by a neighbour: its column blocks go out in chunks of about an eighth
 * of a worker's share, to whichever worker is free. The parts of a group (all of one kind)
 * go as one loop: one dispatch, and the weights of one part follow the last's without a
 * pause. */
static void gemm_group_on_pool(threadpool *pool, gemm_group_job *g) {
    const gemm_job *j = &g->part[0];
    const size_t block = j->panels ? TILES_COLUMN_BLOCK : COLUMN_BLOCK;
    g->first[0] = 0;
    for (size_t p = 0; p < g->n; p++)
        g->first[p + 1] = g->first[p] + (g->part[p].N + block - 1) / block;
    const size_t tasks = g->first[g->n];
    if (j->panels || !j->w16 || (j->xb && j->M >= j->k->tiles_min_m)) {
        pool_run(pool, gemm_group_columns, g, tasks);
        return;
    }
    const size_t shares = 8 * (size_t)pool_size(pool);
    pool_run_dynamic(pool, gemm_group_columns, g, tasks, (tasks + shares - 1) / shares);
}

static void gemm_on_pool(threadpool *pool, const gemm_job *j) {
    gemm_group_job g = {.n = 1, .part = {*j}};
    gemm_group_on_pool(pool, &g);
}

typedef struct pack_job {
    size_t M, K, ldx;
    const float *x;
    float *xp;
} pack_job;

static void pack_rows(void *ctx, size_t begin, size_t end, unsigned worker) {
    (void)worker;
    const pack_job *j = ctx;
    size_t row = gemm_packed_row(j->K);
    gemm_pack_x(end - begin, j->K, j->x + begin * j->ldx, j->ldx, j->xp + begin * row);
}

typedef struct pack_bf16_job {
    size_t K, ldx;
    const float *x;
    uint16_t *xb;
    atomic_int not_bf16;    /* set by a task whose rows hold a value that is not bf16 */
} pack_bf16_job;

static void pack_bf16_rows(void *ctx, size_t begin, size_t end, unsigned worker) {
    (void)worker;
    pack_bf16_job *j = ctx;
    if (!kern()->pack_x_bf16(j->K, j->x, j->ldx, j->xb, begin, end))
        atomic_store_explicit(&j->not_bf16, 1, memory_order_relaxed);
}

static void pack_tiles(void *ctx, size_t begin, size_t end, unsigned worker) {
    (void)worker;
    const pack_job *j = ctx;
    kern()->pack_xt_tiles(j->M, j->K, j->x, j->ldx, j->xp, begin, end);
}

size_t gemm_scratch_xpack_floats(size_t max_rows, size_t max_k) {
    const size_t rows = gemm_packed_row(max_k) * max_rows, tiles = gemm_xt_floats(max_rows, max_k);
    size_t most = rows > tiles ? rows : tiles;
    /* a quantized gemm's activation codes and scales (NVFP4's 1 x 16 blocks need the most) */
    const size_t quant = (linear_quantized_scratch(PARITY_QUANT_NVFP4_MODELOPT, max_rows, max_k) +
                          sizeof(float) - 1) / sizeof(float);
    if (quant > most) most = quant;
#if defined(PARITY_HAVE_AMX)
    /* the amx backend's packed x (M rounded up to 16 rows), where the CPU has it */
    if (!amx_unavailable()) {
        const size_t amx = (amx_packed_x_bytes(max_rows, max_k) + sizeof(float) - 1) / sizeof(float);
        if (amx > most) most = amx;
    }
#endif
    return most;
}

/* Every policy runs on every backend that runs at all: the amx backend's GEMMs that are not
 * bf16 x bf16 are the bf16 backend's. */
int parity_backend_check(int backend) {
    clear_error();
    if (!parity_backend_name(backend))
        return set_error(PARITY_ERR_INVALID_ARGUMENT, "unknown backend %u (bf16 = 0, openblas = 1, "
                         "amx = 2)", (unsigned)backend);
    const char *why = backend == PARITY_BACKEND_AMX ? amx_unavailable() : NULL;
    if (why) return set_error(PARITY_ERR_UNSUPPORTED, "the amx backend is not available: %s", why);
#if !defined(PARITY_HAVE_OPENBLAS)
    if (backend == PARITY_BACKEND_OPENBLAS)
        return set_error(PARITY_ERR_UNSUPPORTED, "the openblas backend is not available: this "
                         "libparity was built without OpenBLAS (meson -Dopenblas=disabled)");
#endif
    return PARITY_OK;
}

#if defined(PARITY_HAVE_AMX)
typedef struct amx_pack_job {
    size_t M, K, ldx;
    const float *x;
    uint16_t *xt;
    atomic_size_t inexact;  /* rows holding a value that is not bf16 */
} amx_pack_job;

static void amx_pack_blocks(void *ctx, size_t begin, size_t end, unsigned worker) {
    (void)worker;
    amx_pack_job *j = ctx;
    const size_t n = amx_pack_x(j->M, j->K, j->x, j->ldx, j->xt, begin, end);
    if (n) atomic_fetch_add_explicit(&j->inexact, n, memory_order_relaxed);
}

typedef struct amx_job {
    size_t M, K, N;
    const uint16_t *xt, *w;
    size_t ldw;
    float *y;
    size_t ldy;
} amx_job;

static void amx_columns(void *ctx, size_t begin, size_t end, unsigned worker) {
    (void)worker;
    const amx_job *j = ctx;
    const size_t n0 = begin * COLUMN_BLOCK, n1 = end * COLUMN_BLOCK < j->N ? end * COLUMN_BLOCK : j->N;
    amx_gemm_columns(j->M, j->K, j->xt, j->w, j->ldw, j->y, j->ldy, j->N, n0, n1);
}

/* A row of x that is all bf16 values. */
static int row_is_bf16(const float *x, size_t K) {
    for (size_t i = 0; i < K; i++) {
        uint32_t u;
        memcpy(&u, &x[i], sizeof u);
        if (u & 0xffffu) return 0;
    }
    return 1;
}

/* The amx backend's GEMM: x packed into tiles over the pool, then the output columns split
 * over the pool as the bf16 backend splits them. Rows with a value that is not bf16 are the
 * bf16 backend's, each computed alone (its bits do not depend on M). */
static void gemm_amx_pool(threadpool *pool, size_t M, size_t K, const float *x, size_t ldx,
                          const uint16_t *w, size_t ldw, float *y, size_t ldy, size_t N,
                          const gemm_scratch *s) {
    amx_pack_job p = {M, K, ldx, x, (uint16_t *)s->xpack, 0};
    pool_run(pool, amx_pack_blocks, &p, (M + 15) / 16);
    const size_t inexact = atomic_load_explicit(&p.inexact, memory_order_relaxed);
    if (inexact == M) {
        gemm_bf16w_pool(pool, M, K, x, ldx, w, ldw, y, ldy, N, s);
        return;
    }
    const amx_job j = {M, K, N, p.xt, w, ldw, y, ldy};
    const size_t tasks = (N + COLUMN_BLOCK - 1) / COLUMN_BLOCK;
    if (M >= 64) {
        pool_run(pool, amx_columns, (void *)&j, tasks);
    } else {
        const size_t shares = 8 * (size_t)pool_size(pool);
        pool_run_dynamic(pool, amx_columns, (void *)&j, tasks, (tasks + shares - 1) / shares);
    }
    if (inexact)
        for (size_t m = 0; m < M; m++)
            if (!row_is_bf16(x + m * ldx, K))
                gemm_bf16w_pool(pool, 1, K, x + m * ldx, ldx, w, ldw, y + m * ldy, ldy, N, s);
}
#endif

/* A bf16-weight GEMM's job on x, all but its weights, output and epilogue: x packed over
 * the pool for the table's kernel (bf16 rows where every value is one, else fp32 rows or
 * tiles). */
static gemm_job gemm_bf16w_packed(threadpool *pool, size_t M, size_t K, const float *x,
                                  size_t ldx, const gemm_scratch *s) {
    const kernels *k = kern();
    gemm_job j = {k, M, K, 0, NULL, 0, NULL, NULL, NULL, 0, NULL, 0, NULL, 0, NULL};
    if (k->gemm_bf16xw) {
        /* the scratch holds M packed fp32 rows, so M bf16 rows fit */
        pack_bf16_job pb = {K, ldx, x, (uint16_t *)s->xpack, 0};
        /* a decode step's row or two is packed by the caller: a pool round trip costs more */
        if (M <= 2)
            pack_bf16_rows(&pb, 0, M, 0);
        else
            pool_run(pool, pack_bf16_rows, &pb, M);
        if (!atomic_load_explicit(&pb.not_bf16, memory_order_relaxed)) {
            j.xb = pb.xb;
            return j;
        }
    }
    pack_job p = {M, K, ldx, x, s->xpack};
    j.x = s->xpack;
    if (M >= k->tiles_min_m) {
        pool_run(pool, pack_tiles, &p, gemm_xt_tiles(M));
        j.panels = s->panels, j.panel_floats = gemm_panel_floats(s->max_k);
    } else {
        pool_run(pool, pack_rows, &p, M);
    }
    return j;
}

void gemm_bf16w_group_pool(threadpool *pool, size_t M, size_t K, const float *x, size_t ldx,
                           size_t n, const gemm_part *parts, const gemm_scratch *s) {
    const gemm_job j = gemm_bf16w_packed(pool, M, K, x, ldx, s);
    gemm_group_job g = {.n = n};
    for (size_t i = 0; i < n; i++) {
        g.part[i] = j;
        g.part[i].N = parts[i].N;
        g.part[i].w16 = parts[i].w;
        g.part[i].ldw = parts[i].ldw;
        g.part[i].y = parts[i].y;
        g.part[i].ldy = parts[i].ldy;
        g.part[i].ep = parts[i].ep;
    }
    gemm_group_on_pool(pool, &g);
}

void gemm_bf16w_pool_packed(threadpool *pool, size_t M, size_t K, const uint16_t *xb,
                            const float *xt, const uint16_t *w, size_t ldw, float *y, size_t ldy,
                            size_t N, const gemm_scratch *s) {
    gemm_job j = {kern(), M, K, N, NULL, 0, NULL, w, NULL, ldw, y, ldy, NULL, 0, NULL};
    if (xb && j.k->gemm_bf16xw) {
        j.xb = xb;
    } else {
        j.x = xt;
        j.panels = s->panels, j.panel_floats = gemm_panel_floats(s->max_k);
    }
    gemm_on_pool(pool, &j);
}

/* The gate and up GEMMs of a SwiGLU MLP and the region after them, task by task: a task's
 * gate columns, then the same up columns (each rounded by its epilogue), then out = swiglu
 * of the two on those columns of every row, while they are in the task's cache. */
typedef struct gemm_swiglu_job {
    gemm_job gate, up;
    const parity_policy *pol;
    float *out;
    size_t ldo;
} gemm_swiglu_job;

static void gemm_swiglu_columns(void *ctx, size_t begin, size_t end, unsigned worker) {
    const gemm_swiglu_job *sj = ctx;
    const gemm_job *g = &sj->gate, *u = &sj->up;
    const size_t block = g->panels ? TILES_COLUMN_BLOCK : COLUMN_BLOCK;
    /* pieces of at most EPILOGUE_BYTES of the two outputs (at least one block) */
    const size_t fit = EPILOGUE_BYTES / (2 * g->M * block * sizeof(float));
    const size_t step = fit == 0 ? 1 : fit < end - begin ? fit : end - begin;
    for (size_t b = begin; b < end; b += step) {
        const size_t b1 = b + step < end ? b + step : end;
        const size_t n0 = b * block, n1 = b1 * block < g->N ? b1 * block : g->N;
        gemm_piece(g, n0, n1, worker);
        gemm_piece(u, n0, n1, worker);
        for (size_t m = 0; m < g->M; m++)
            g->k->swiglu(sj->pol, n1 - n0, g->y + m * g->ldy + n0, u->y + m * u->ldy + n0,
                         sj->out + m * sj->ldo + n0);
    }
}

static void gemm_bf16w_pool_ep(threadpool *pool, size_t M, size_t K, const float *x, size_t ldx,
                               const uint16_t *w, size_t ldw, float *y, size_t ldy, size_t N,
                               const gemm_scratch *s, const gemm_epilogue *ep) {
    const gemm_part part = {w, ldw, N, y, ldy, ep};
    gemm_bf16w_group_pool(pool, M, K, x, ldx, 1, &part, s);
}

void gemm_bf16w_pool(threadpool *pool, size_t M, size_t K, const float *x, size_t ldx,
                     const uint16_t *w, size_t ldw, float *y, size_t ldy, size_t N,
                     const gemm_scratch *s) {
    gemm_bf16w_pool_ep(pool, M, K, x, ldx, w, ldw, y, ldy, N, s, NULL);
}

/* y[M][N] = x[:, k0:k1] . w[:, k0:k1]^T for the weights w and the columns k0 .. k1-1 of x;
 * the epilogue `ep` (or NULL) run by the GEMM's tasks: only on the bf16 backend (the caller
 * runs it otherwise). */
static void gemm_slice(const fwd_ctx *ctx, size_t M, const float *x, size_t ldx,
                       const gemm_weights *w, size_t k0, size_t k1, float *y, size_t ldy,
                       const gemm_epilogue *ep) {
    const size_t N = w->rows, Ks = k1 - k0;
#if defined(PARITY_HAVE_OPENBLAS)
    if (ctx->backend == PARITY_BACKEND_OPENBLAS) {
        const float *w32 = w->f32 + k0;
        for (size_t m = 0; m < M; m++)
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, 1, (blasint)N, (blasint)Ks, 1.0f,
                        x + m * ldx + k0, (blasint)ldx, w32, (blasint)w->ld, 0.0f, y + m * ldy,
                        (blasint)ldy);
        return;
    }
#endif
    if (ctx->pol.compute != PARITY_COMPUTE_BF16) { /* fp32 or fp16 values, held in fp32 */
        const gemm_job j = {kern(), M, Ks, N, x + k0, ldx, NULL, NULL, w->f32 + k0, w->ld, y, ldy,
                            NULL, 0, ep};
        gemm_on_pool(ctx->pool, &j);
        return;
    }
#if defined(PARITY_HAVE_AMX)
    if (ctx->backend == PARITY_BACKEND_AMX) {
        gemm_amx_pool(ctx->pool, M, Ks, x + k0, ldx, w->bf16 + k0, w->ld, y, ldy, N, &ctx->s->gemm);
        return;
    }
#endif
    gemm_bf16w_pool_ep(ctx->pool, M, Ks, x + k0, ldx, w->bf16 + k0, w->ld, y, ldy, N, &ctx->s->gemm,
                       ep);
}

/* linear_weights, then (when round_out) the policy's rounding of y: by the GEMM's tasks where
 * the backend is bf16 and K is not split, else by passes after it. */
static void linear_weights_ep(const fwd_ctx *ctx, size_t M, const float *x, size_t ldx,
                              const gemm_weights *w, const float *bias, int round_out, float *y,
                              size_t ldy) {
    const size_t N = w->rows, K = w->cols;
    if (ctx->split_k <= 1 && ctx->backend == PARITY_BACKEND_BF16) {
        const gemm_epilogue ep = {bias, round_out ? &ctx->pol : NULL};
        gemm_slice(ctx, M, x, ldx, w, 0, K, y, ldy, bias || round_out ? &ep : NULL);
        return;
    }
    if (ctx->split_k > 1) {
        /* kernel-order experiment: K in chunks (multiples of 32), partial sums added in order */
        const size_t chunk = ((K + ctx->split_k - 1) / ctx->split_k + 31) / 32 * 32;
        gemm_slice(ctx, M, x, ldx, w, 0, chunk < K ? chunk : K, y, ldy, NULL);
        for (size_t k0 = chunk; k0 < K; k0 += chunk) {
            gemm_slice(ctx, M, x, ldx, w, k0, k0 + chunk < K ? k0 + chunk : K, ctx->s->partial, N,
                       NULL);
            for (size_t m = 0; m < M; m++)
                for (size_t n = 0; n < N; n++) y[m * ldy + n] += ctx->s->partial[m * N + n];
        }
    } else {
        gemm_slice(ctx, M, x, ldx, w, 0, K, y, ldy, NULL);
    }
    /* the bias joins the fp32 accumulator before the output rounding (a GEMM epilogue) */
    if (bias)
        for (size_t m = 0; m < M; m++)
            for (size_t n = 0; n < N; n++) y[m * ldy + n] += bias[n];
    if (round_out)
        for (size_t m = 0; m < M; m++) round_to_policy(&ctx->pol, y + m * ldy, N);
}

void linear_weights(const fwd_ctx *ctx, size_t M, const float *x, size_t ldx,
                    const gemm_weights *w, const float *bias, float *y, size_t ldy) {
    linear_weights_ep(ctx, M, x, ldx, w, bias, 0, y, ldy);
}

void linear_weights_round_point(const fwd_ctx *ctx, size_t M, const float *x, size_t ldx,
                                const gemm_weights *w, const float *bias, float *y, size_t ldy) {
    linear_weights_ep(ctx, M, x, ldx, w, bias, 1, y, ldy);
}

const float *linear_f32_weights(const fwd_ctx *ctx, const weight *w) {
    if (ctx->pol.compute != PARITY_COMPUTE_BF16) return weight_values(&ctx->pol, w);
    /* read only where the backend uses it: another thread may be widening the weights for an
     * openblas scorer being created meanwhile */
    return ctx->backend == PARITY_BACKEND_OPENBLAS ? w->wide : NULL;
}

static void linear_ep(const fwd_ctx *ctx, size_t M, const float *x, const weight *w,
                      const weight *bias, int round_out, float *y) {
    const quant_weight *wq = quant_weight_for(&ctx->pol, w);
    if (wq) {
        /* the decoder layers' linear layers under an fp8 gemm (lib/engine/gemm_quant.c) */
        linear_quantized(ctx, M, x, w->cols, w, wq,
                   bias && bias->rows ? weight_values(&ctx->pol, bias) : NULL, y, w->rows);
        if (round_out) round_to_policy(&ctx->pol, y, M * w->rows);
        return;
    }
    const gemm_weights gw = {w->rows, w->cols, w->cols, w->bf16, linear_f32_weights(ctx, w)};
    const float *b = NULL;
    if (bias && bias->rows) b = weight_values(&ctx->pol, bias);
    linear_weights_ep(ctx, M, x, w->cols, &gw, b, round_out, y, w->rows);
}

void linear_group_round_point(const fwd_ctx *ctx, size_t M, const float *x, size_t n,
                              const weight *const *w, const weight *const *bias, float *const *y) {
    const size_t K = w[0]->cols;
    /* quantized layers: the activations quantized once, one pool call (gemm_quant.c) */
    const quant_weight *wq[GEMM_GROUP_MAX] = {0};
    int quantized = n <= GEMM_GROUP_MAX && n <= QUANT_GROUP_MAX;
    for (size_t i = 0; i < n && quantized; i++)
        quantized = w[i]->cols == K && (wq[i] = quant_weight_for(&ctx->pol, w[i])) != NULL;
    if (quantized) {
        const float *b[GEMM_GROUP_MAX] = {0};
        size_t ldy[GEMM_GROUP_MAX] = {0};
        for (size_t i = 0; i < n; i++) {
            b[i] = bias[i] && bias[i]->rows ? weight_values(&ctx->pol, bias[i]) : NULL;
            ldy[i] = w[i]->rows;
        }
        linear_quantized_group(ctx, M, x, K, n, w, wq, b, y, ldy);
        for (size_t i = 0; i < n; i++) round_to_policy(&ctx->pol, y[i], M * w[i]->rows);
        return;
    }
    /* the bf16 backend's one-pass GEMMs (not K split, not quantized, bf16 weights) */
    int grouped = n <= GEMM_GROUP_MAX && ctx->backend == PARITY_BACKEND_BF16 &&
                  ctx->split_k <= 1 && ctx->pol.compute == PARITY_COMPUTE_BF16;
    for (size_t i = 0; i < n && grouped; i++)
        grouped = w[i]->cols == K && !quant_weight_for(&ctx->pol, w[i]);
    if (!grouped) {
        for (size_t i = 0; i < n; i++) linear_round_point(ctx, M, x, w[i], bias[i], y[i]);
        return;
    }
    gemm_epilogue ep[GEMM_GROUP_MAX];
    gemm_part parts[GEMM_GROUP_MAX];
    for (size_t i = 0; i < n; i++) {
        const float *b = bias[i] && bias[i]->rows ? weight_values(&ctx->pol, bias[i]) : NULL;
        ep[i] = (gemm_epilogue){b, &ctx->pol};
        parts[i] = (gemm_part){w[i]->bf16, K, w[i]->rows, y[i], w[i]->rows, &ep[i]};
    }
    gemm_bf16w_group_pool(ctx->pool, M, K, x, K, n, parts, &ctx->s->gemm);
}

int linear_swiglu_fused(const fwd_ctx *ctx, size_t M, const float *x, const weight *w_gate,
                        const weight *w_up, float *gate, float *up, float *out) {
    const size_t K = w_gate->cols, N = w_gate->rows;
    if (ctx->backend != PARITY_BACKEND_BF16 || ctx->split_k > 1 ||
        ctx->pol.compute != PARITY_COMPUTE_BF16 || w_up->cols != K || w_up->rows != N ||
        quant_weight_for(&ctx->pol, w_gate) || quant_weight_for(&ctx->pol, w_up) || M == 0)
        return 0;
    const gemm_epilogue ep = {NULL, &ctx->pol};
    gemm_swiglu_job sj = {.pol = &ctx->pol, .out = out, .ldo = N};
    sj.gate = gemm_bf16w_packed(ctx->pool, M, K, x, K, &ctx->s->gemm);
    sj.gate.N = N, sj.gate.w16 = w_gate->bf16, sj.gate.ldw = K;
    sj.gate.y = gate, sj.gate.ldy = N, sj.gate.ep = &ep;
    sj.up = sj.gate;
    sj.up.w16 = w_up->bf16, sj.up.y = up;
    /* split as gemm_group_on_pool splits one GEMM's column blocks */
    const gemm_job *j = &sj.gate;
    const size_t tasks = (N + (j->panels ? TILES_COLUMN_BLOCK : COLUMN_BLOCK) - 1) /
                         (j->panels ? TILES_COLUMN_BLOCK : COLUMN_BLOCK);
    if (j->panels || (j->xb && M >= j->k->tiles_min_m)) {
        pool_run(ctx->pool, gemm_swiglu_columns, &sj, tasks);
    } else {
        const size_t shares = 8 * (size_t)pool_size(ctx->pool);
        pool_run_dynamic(ctx->pool, gemm_swiglu_columns, &sj, tasks, (tasks + shares - 1) / shares);
    }
    return 1;
}

/* ---- a mixture of experts' GEMMs, each expert on its own rows, in one dispatch ----------- */

/* x's rows (ldx apart) packed once for every expert's GEMM, into a job template whose x or xb
 * points at row 0: as bf16 rows for gemm_bf16xw where the table has it and every value is
 * bf16, else as fp32 rows for gemm_bf16w (the two give the same bits, and gemm_bf16w the same
 * as the tiles kernel a large M would run: kernels.h). A few rows are packed by the caller
 * (a pool round trip costs more than packing them). */
static gemm_job experts_packed(const fwd_ctx *ctx, size_t rows, size_t K, const float *x,
                               size_t ldx) {
    const kernels *k = kern();
    const gemm_scratch *s = &ctx->s->gemm;
    gemm_job j = {k, 0, K, 0, NULL, 0, NULL, NULL, NULL, 0, NULL, 0, NULL, 0, NULL};
    const int inline_pack = rows * K <= 32768;
    if (k->gemm_bf16xw) {
        pack_bf16_job pb = {K, ldx, x, (uint16_t *)s->xpack, 0};
        if (inline_pack)
            pack_bf16_rows(&pb, 0, rows, 0);
        else
            pool_run(ctx->pool, pack_bf16_rows, &pb, rows);
        if (!atomic_load_explicit(&pb.not_bf16, memory_order_relaxed)) {
            j.xb = pb.xb;
            return j;
        }
    }
    pack_job p = {rows, K, ldx, x, s->xpack};
    if (inline_pack)
        pack_rows(&p, 0, rows, 0);
    else
        pool_run(ctx->pool, pack_rows, &p, rows);
    j.x = s->xpack;
    return j;
}

/* Expert p's part of a template packed from x's row first[0] on: its rows first[p] ..
 * first[p+1]-1, its weights w (N x K) and its output rows of y (N apart). */
static gemm_job expert_part(const gemm_job *t, const uint32_t *first, size_t p, const weight *w,
                            float *y, const gemm_epilogue *ep) {
    gemm_job j = *t;
    const size_t packed = (first[p] - first[0]) * gemm_packed_row(t->K);
    j.M = first[p + 1] - first[p];
    if (j.xb) j.xb += packed;
    else j.x += packed;
    j.N = w->rows, j.w16 = w->bf16, j.ldw = t->K;
    j.y = y + first[p] * w->rows, j.ldy = w->rows;
    j.ep = ep;
    return j;
}

/* The experts' GEMMs of one dispatch: task t is column block t - first[p] of expert p, a
 * SwiGLU pair (gate and up, then swiglu) or one GEMM (part[p].gate). */
typedef struct experts_job {
    size_t n;
    int swiglu;
    gemm_swiglu_job part[GEMM_EXPERTS_MAX];
    size_t first[GEMM_EXPERTS_MAX + 1];
} experts_job;

static void expert_part_columns(const void *job, size_t p, size_t b, size_t e, unsigned worker) {
    const experts_job *g = job;
    if (g->swiglu)
        gemm_swiglu_columns((void *)&g->part[p], b, e, worker);
    else
        gemm_columns((void *)&g->part[p].gate, b, e, worker);
}

static void experts_columns(void *ctx, size_t begin, size_t end, unsigned worker) {
    const experts_job *g = ctx;
    over_parts(g, g->n, g->first, begin, end, worker, expert_part_columns);
}

/* The column blocks of every part handed out in chunks to whichever worker is free, as
 * gemm_group_on_pool hands out a small M's. */
static void experts_on_pool(threadpool *pool, experts_job *g) {
    g->first[0] = 0;
    for (size_t p = 0; p < g->n; p++)
        g->first[p + 1] = g->first[p] + (g->part[p].gate.N + COLUMN_BLOCK - 1) / COLUMN_BLOCK;
    const size_t tasks = g->first[g->n], shares = 8 * (size_t)pool_size(pool);
    pool_run_dynamic(pool, experts_columns, g, tasks, (tasks + shares - 1) / shares);
}

int linear_experts_runs(const fwd_ctx *ctx, const weight *w) {
    return ctx->backend == PARITY_BACKEND_BF16 && ctx->split_k <= 1 &&
           ctx->pol.compute == PARITY_COMPUTE_BF16 && !quant_weight_for(&ctx->pol, w);
}

void linear_experts_swiglu(const fwd_ctx *ctx, size_t n, const uint32_t *first, const float *x,
                           const weight *const *w_gate, const weight *const *w_up, float *gate,
                           float *up) {
    const size_t K = w_gate[0]->cols;
    const gemm_job t = experts_packed(ctx, first[n] - first[0], K, x + first[0] * K, K);
    const gemm_epilogue ep = {NULL, &ctx->pol};
    experts_job g = {.n = n, .swiglu = 1};
    for (size_t p = 0; p < n; p++) {
        g.part[p].gate = expert_part(&t, first, p, w_gate[p], gate, &ep);
        g.part[p].up = expert_part(&t, first, p, w_up[p], up, &ep);
        g.part[p].pol = &ctx->pol;
        g.part[p].out = g.part[p].gate.y;
        g.part[p].ldo = w_gate[p]->rows;
    }
    experts_on_pool(ctx->pool, &g);
}

void linear_experts(const fwd_ctx *ctx, size_t n, const uint32_t *first, const float *x,
                    const weight *const *w, float *y) {
    const size_t K = w[0]->cols;
    const gemm_job t = experts_packed(ctx, first[n] - first[0], K, x + first[0] * K, K);
    experts_job g = {.n = n, .swiglu = 0};
    for (size_t p = 0; p < n; p++) g.part[p].gate = expert_part(&t, first, p, w[p], y, NULL);
    experts_on_pool(ctx->pool, &g);
}

void linear(const fwd_ctx *ctx, size_t M, const float *x, const weight *w, const weight *bias,
            float *y) {
    linear_ep(ctx, M, x, w, bias, 0, y);
}

void linear_round_point(const fwd_ctx *ctx, size_t M, const float *x, const weight *w,
                        const weight *bias, float *y) {
    linear_ep(ctx, M, x, w, bias, 1, y);
}
