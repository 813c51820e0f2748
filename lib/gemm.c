/* GEMM backends. Both give every output element one fixed summation order, whatever M, the
 * tile the element falls in, or the thread that computes it; threads split the output
 * columns, never a reduction.
 *
 *   bf16:     the library's kernels (kernels.h: pair32 order on bf16 weights, dot16 on fp32
 *             weights under PARITY_COMPUTE_FP32), columns split over the pool.
 *   openblas: cblas_sgemm on fp32 weights (bf16 widened exactly, or the fp32 masters), one
 *             row per call. On Zen, OpenBLAS 0.3.21's sgemm rounds a row differently
 *             depending on where it falls in an M tile (bench/openblas-invariance shows it),
 *             so only calls of one fixed shape (M = 1, the whole N and K) agree bitwise.
 *             OpenBLAS's own threading is the host's to set; it splits N, which was
 *             measured to leave M = 1 results unchanged. */
#include <cblas.h>

#include "forward.h"
#include "internal.h"
#include "kernels.h"

/* Output columns per task: threads take contiguous runs of such blocks. */
#define COLUMN_BLOCK 32

typedef struct gemm_job {
    const kernels *k;
    size_t M, K, N;
    const float *x;         /* packed x (bf16 weights) or x with row stride ldx (fp32) */
    size_t ldx;
    const uint16_t *w16;    /* weights [N][ldw], starting at the first k of the slice */
    const float *w32;
    size_t ldw;
    float *y;
} gemm_job;

static void gemm_columns(void *ctx, size_t begin, size_t end, unsigned worker) {
    (void)worker;
    const gemm_job *j = ctx;
    size_t n0 = begin * COLUMN_BLOCK, n1 = end * COLUMN_BLOCK < j->N ? end * COLUMN_BLOCK : j->N;
    if (j->w16)
        j->k->gemm_bf16w(j->M, j->K, j->x, j->w16, j->ldw, j->y, j->N, n0, n1);
    else
        j->k->gemm_f32w(j->M, j->K, j->x, j->ldx, j->w32, j->ldw, j->y, j->N, n0, n1);
}

static void gemm_on_pool(threadpool *pool, const gemm_job *j) {
    pool_run(pool, gemm_columns, (void *)j, (j->N + COLUMN_BLOCK - 1) / COLUMN_BLOCK);
}

void gemm_bf16w_pool(threadpool *pool, size_t M, size_t K, const float *xp, const uint16_t *w,
                     size_t ldw, float *y, size_t N) {
    const gemm_job j = {kern(), M, K, N, xp, 0, w, NULL, ldw, y};
    gemm_on_pool(pool, &j);
}

typedef struct pack_job {
    size_t K, ldx;
    const float *x;
    float *xp;
} pack_job;

static void pack_rows(void *ctx, size_t begin, size_t end, unsigned worker) {
    (void)worker;
    const pack_job *j = ctx;
    size_t row = gemm_packed_row(j->K);
    gemm_pack_x(end - begin, j->K, j->x + begin * j->ldx, j->ldx, j->xp + begin * row);
}

/* y[M][N] = x[:, k0:k1] . w[:, k0:k1]^T: the columns k0 .. k1-1 of x (row stride K) and w. */
static void gemm_slice(const fwd_ctx *ctx, size_t M, const float *x, const weight *w, size_t k0,
                       size_t k1, float *y) {
    const size_t N = w->rows, K = w->cols, Ks = k1 - k0;
    const int fp32 = ctx->pol.compute == PARITY_COMPUTE_FP32;
    if (ctx->backend == PARITY_BACKEND_OPENBLAS) {
        const float *w32 = (fp32 ? weight_f32(w) : w->wide) + k0;
        for (size_t m = 0; m < M; m++)
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, 1, (blasint)N, (blasint)Ks, 1.0f,
                        x + m * K + k0, (blasint)K, w32, (blasint)K, 0.0f, y + m * N, (blasint)N);
        return;
    }
    if (fp32) {
        const gemm_job j = {kern(), M, Ks, N, x + k0, K, NULL, weight_f32(w) + k0, K, y};
        gemm_on_pool(ctx->pool, &j);
        return;
    }
    pack_job p = {Ks, K, x + k0, ctx->s->xpack};
    pool_run(ctx->pool, pack_rows, &p, M);
    gemm_bf16w_pool(ctx->pool, M, Ks, ctx->s->xpack, w->bf16 + k0, K, y, N);
}

void linear(const fwd_ctx *ctx, size_t M, const float *x, const weight *w, const weight *bias,
            float *y) {
    const size_t N = w->rows, K = w->cols;
    if (ctx->split_k > 1) {
        /* kernel-order experiment: K in chunks (multiples of 32), partial sums added in order */
        const size_t chunk = ((K + ctx->split_k - 1) / ctx->split_k + 31) / 32 * 32;
        gemm_slice(ctx, M, x, w, 0, chunk < K ? chunk : K, y);
        for (size_t k0 = chunk; k0 < K; k0 += chunk) {
            gemm_slice(ctx, M, x, w, k0, k0 + chunk < K ? k0 + chunk : K, ctx->s->partial);
            for (size_t i = 0; i < M * N; i++) y[i] += ctx->s->partial[i];
        }
    } else {
        gemm_slice(ctx, M, x, w, 0, K, y);
    }
    if (bias && bias->rows) {
        /* the bias joins the fp32 accumulator before the output rounding (a GEMM epilogue) */
        const int fp32 = ctx->pol.compute == PARITY_COMPUTE_FP32;
        for (size_t m = 0; m < M; m++)
            for (size_t n = 0; n < N; n++)
                y[m * N + n] += fp32 ? weight_f32(bias)[n] : bf16_to_f32(bias->bf16[n]);
    }
}
