/*
 * The learner's backward pieces (parity_ops.h, "Backward pieces"): parity_matmul, a GEMM that
 * reads either operand through row and column strides (so gy^T x and gy W need no transposed
 * copies on the caller's side) on the library's own GEMMs, and parity_attention_backward, the
 * gradients of causal GQA softmax attention in fp32, one task per (sequence, KV head) on the
 * pool, each a few GEMMs over the whole head group's rows.
 */
#include <math.h>
#include <stdatomic.h>
#include <string.h>

#include "args.h"
#include "base/alloc.h"
#include "base/errors.h"
#include "base/floats.h"
#include "gemm.h"
#include "kernels/kernels.h"
#include "ops_call.h"

/* ---- argument checks ---------------------------------------------------------------------- */

/* The bytes [*lo, *hi) that rows x cols elements of `size` bytes at p, rows row_stride and
 * columns col_stride elements apart, span; nonzero if that does not fit in the address space. */
static int span_of(const void *p, size_t rows, size_t cols, size_t row_stride, size_t col_stride,
                   size_t size, uintptr_t *lo, uintptr_t *hi) {
    uint64_t r, cl, last, bytes;
    if (mul_overflows(rows - 1, row_stride, &r) || mul_overflows(cols - 1, col_stride, &cl) ||
        r > UINT64_MAX - cl || (last = r + cl) > (SIZE_MAX - 1) / size ||
        mul_overflows(last + 1, size, &bytes) || (uintptr_t)p > UINTPTR_MAX - bytes)
        return 1;
    *lo = (uintptr_t)p;
    *hi = (uintptr_t)p + (uintptr_t)bytes;
    return 0;
}

static int overlaps(uintptr_t lo0, uintptr_t hi0, uintptr_t lo1, uintptr_t hi1) {
    return lo0 < hi1 && lo1 < hi0;
}

/* Whether two fp32 matrices of rows x dim, rows s0 and s1 floats apart, whose spans are
 * [lo0, hi0) and [lo1, hi1), share an element: not when the spans are apart, nor when they
 * have one row stride s >= dim and the columns of one start at least dim past the other's
 * (modulo s) and end within the row (the two halves of a [rows, 2 dim] buffer, read or written
 * through their stride); in any other case of overlapping spans, yes. */
static int rows_overlap(uintptr_t lo0, uintptr_t hi0, size_t s0, uintptr_t lo1, uintptr_t hi1,
                        size_t s1, size_t dim) {
    if (!overlaps(lo0, hi0, lo1, hi1)) return 0;
    const uintptr_t gap = lo0 < lo1 ? lo1 - lo0 : lo0 - lo1;
    if (s0 != s1 || dim > s0 || gap % 4) return 1;
    const size_t off = (size_t)(gap / 4 % s0);
    return off < dim || off + dim > s0;
}

/* ---- gathering an operand into rows ------------------------------------------------------- */

/* Rows of an operand read through strides, written contiguous (row stride `cols`): as fp32,
 * or as bf16 bit patterns from bf16 ones (fp32 sources of bf16 values are packed instead,
 * pack_bf16 below). */
typedef struct gather_job {
    size_t rows, cols, row_stride, col_stride;
    const void *src;
    uint32_t src_dtype;     /* PARITY_DTYPE_BF16 or PARITY_DTYPE_F32 */
    float *f32;             /* or NULL */
    uint16_t *bf16;         /* or NULL (an fp32 source: NULL) */
} gather_job;

#define GATHER_TILE 64

/* One tile (rows r0 .. r1-1, columns c0 .. c1-1), each loop free of the dtype tests; the inner
 * loop runs along whichever of the source's dimensions is the closer together. */
static void gather_tile(const gather_job *j, size_t r0, size_t r1, size_t c0, size_t c1) {
    const size_t rs = j->row_stride, cs = j->col_stride, cols = j->cols;
    const int along_rows = rs < cs;
#define GATHER_LOOPS(BODY)                                                                 \
    if (along_rows) {                                                                      \
        for (size_t c = c0; c < c1; c++)                                                   \
            for (size_t r = r0; r < r1; r++) BODY                                          \
    } else {                                                                               \
        for (size_t r = r0; r < r1; r++)                                                   \
            for (size_t c = c0; c < c1; c++) BODY                                          \
    }
    if (j->src_dtype == PARITY_DTYPE_BF16) {
        const uint16_t *src = j->src;
        if (j->bf16) {
            GATHER_LOOPS({ j->bf16[r * cols + c] = src[r * rs + c * cs]; })
        }
        if (j->f32) {
            GATHER_LOOPS({ j->f32[r * cols + c] = bf16_to_f32(src[r * rs + c * cs]); })
        }
    } else {
        const float *src = j->src;
        GATHER_LOOPS({ j->f32[r * cols + c] = src[r * rs + c * cs]; })
    }
#undef GATHER_LOOPS
}

static void gather_rows(void *ctx, size_t begin, size_t end, unsigned worker) {
    (void)worker;
    const gather_job *j = ctx;
    const size_t r0 = begin * GATHER_TILE, r1 = end * GATHER_TILE < j->rows ? end * GATHER_TILE
                                                                            : j->rows;
    for (size_t c0 = 0; c0 < j->cols; c0 += GATHER_TILE)
        gather_tile(j, r0, r1, c0, c0 + GATHER_TILE < j->cols ? c0 + GATHER_TILE : j->cols);
}

/* Gathers on the pool. */
static void gather(threadpool *pool, gather_job *j) {
    pool_run(pool, gather_rows, j, (j->rows + GATHER_TILE - 1) / GATHER_TILE);
}

/* ---- packing a for the bf16-weight GEMM straight from its strides ---------------------------- */

/* a (m x k fp32 values read through strides) packed for gemm_bf16w_pool_packed in one pass:
 * as bf16 rows (xb, pack_x_bf16's layout: row i at xb + i * gemm_packed_row(k), -0 past k),
 * valid only if every value is a bf16 value; or as tiles (xt, gemm_pack_xt_tiles' layout,
 * +0 past k and m). a with rows 1 apart and columns farther (a transposed tensor, as gy^T
 * is) is packed by columns: a task takes PACK_A_COLS columns of every row, each column a
 * contiguous run of a, read in order (a pass by rows would read a line of each of a's rows
 * and wait on memory for every one); otherwise by rows, PACK_A_ROWS (whole tiles) a task,
 * contiguous rows through the table's own packs. */
#define PACK_A_ROWS (4 * GEMM_XT_ROWS)
#define PACK_A_COLS 64
/* By columns, the column PACK_A_AHEAD on is asked for a line (16 rows) at a time while a
 * column is packed: each column is a short run of memory that the hardware prefetchers,
 * left alone, take up too late (measured on a Zen 4 VM, 256 and 768 rows of 4,281 columns
 * from sources out of cache: 2.2-2.8x faster; 2 to 12 columns ahead all alike) */
#define PACK_A_AHEAD 4

typedef struct pack_a_job {
    const kernels *kt;
    size_t m, k, rs, cs;
    const float *a;
    uint16_t *xb;
    float *xt;
    atomic_int not_bf16;    /* set where a value is not a bf16 value: the other tasks stop */
} pack_a_job;

/* Whether a is packed by columns (see above). */
static int by_columns(const pack_a_job *j) { return j->rs < j->cs; }

/* Where element c of a row goes in a tile: lane (c % 32) / 2 of chunk c / 32, step 0 for
 * the odd element (taken first), 1 for the even one; in floats, of a tile's 16 rows. */
static size_t tile_offset(size_t c, size_t chunks) {
    return ((((c % 32) / 2) * chunks + c / 32) * 2 + 1 - c % 2) * GEMM_XT_ROWS;
}

/* Tasks [begin, end): column blocks (by columns) or row blocks of the bf16 rows. */
static void pack_a_bf16(void *ctx, size_t begin, size_t end, unsigned worker) {
    (void)worker;
    pack_a_job *j = ctx;
    const size_t P = gemm_packed_row(j->k), rs = j->rs, cs = j->cs, m = j->m, k = j->k;
    const uint32_t *src = (const uint32_t *)j->a;
    uint16_t *xb = j->xb;
    for (size_t t = begin; t < end; t++) {
        if (atomic_load_explicit(&j->not_bf16, memory_order_relaxed)) return;
        uint32_t odd = 0;
        if (by_columns(j)) {
            const size_t c0 = t * PACK_A_COLS, c1 = c0 + PACK_A_COLS < P ? c0 + PACK_A_COLS : P;
            /* two columns at a time (c0 and P are even): a row's two are side by side */
            for (size_t c = c0; c < c1; c += 2) {
                const uint32_t *lo = c < k ? src + c * cs : NULL, *hi = c + 1 < k ? lo + cs : NULL;
                uint16_t *out = xb + c;
                if (hi) {
                    const uint32_t *ahead = c + PACK_A_AHEAD + 1 < k ? lo + PACK_A_AHEAD * cs
                                                                       : NULL;
                    for (size_t i = 0; i < m; i++) {
                        if (ahead && i % 16 == 0) {
                            __builtin_prefetch(ahead + i * rs);
                            __builtin_prefetch(ahead + cs + i * rs);
                        }
                        const uint32_t u = lo[i * rs], v = hi[i * rs];
                        odd |= (u | v) & 0xffffu;
                        out[i * P] = (uint16_t)(u >> 16);
                        out[i * P + 1] = (uint16_t)(v >> 16);
                    }
                } else {
                    for (size_t i = 0; i < m; i++) {
                        const uint32_t u = lo ? lo[i * rs] : 0x80000000u;
                        odd |= u & 0xffffu;
                        out[i * P] = (uint16_t)(u >> 16);
                        out[i * P + 1] = 0x8000u;
                    }
                }
            }
        } else {
            const size_t i0 = t * PACK_A_ROWS, i1 = i0 + PACK_A_ROWS < m ? i0 + PACK_A_ROWS : m;
            if (cs == 1 && j->kt->pack_x_bf16) {
                odd = !j->kt->pack_x_bf16(k, j->a, rs, xb, i0, i1);
            } else {
                for (size_t i = i0; i < i1; i++) {
                    for (size_t c = 0; c < k; c++) {
                        const uint32_t u = src[i * rs + c * cs];
                        odd |= u & 0xffffu;
                        xb[i * P + c] = (uint16_t)(u >> 16);
                    }
                    for (size_t c = k; c < P; c++) xb[i * P + c] = 0x8000u;
                }
            }
        }
        if (odd) {
            atomic_store_explicit(&j->not_bf16, 1, memory_order_relaxed);
            return;
        }
    }
}

/* Tasks [begin, end): column blocks (by columns) or row blocks of the tiles. */
static void pack_a_tiles(void *ctx, size_t begin, size_t end, unsigned worker) {
    (void)worker;
    pack_a_job *j = ctx;
    const size_t P = gemm_packed_row(j->k), chunks = P / 32, rs = j->rs, cs = j->cs;
    const size_t m = j->m, k = j->k, tiles = gemm_xt_tiles(m), tile = GEMM_XT_ROWS * P;
    if (!by_columns(j)) {
        const size_t per = PACK_A_ROWS / GEMM_XT_ROWS;
        const size_t t0 = begin * per, t1 = end * per < tiles ? end * per : tiles;
        if (cs == 1) {
            j->kt->pack_xt_tiles(m, k, j->a, rs, j->xt, t0, t1);
            return;
        }
        for (size_t t = t0; t < t1; t++)
            for (size_t c = 0; c < P; c++) {
                float *dst = j->xt + t * tile + tile_offset(c, chunks);
                for (size_t r = 0; r < GEMM_XT_ROWS; r++) {
                    const size_t i = t * GEMM_XT_ROWS + r;
                    dst[r] = i < m && c < k ? j->a[i * rs + c * cs] : 0.0f;
                }
            }
        return;
    }
    for (size_t c = begin * PACK_A_COLS; c < end * PACK_A_COLS && c < P; c++) {
        float *dst = j->xt + tile_offset(c, chunks);
        size_t i = 0;
        if (c < k) {
            const float *col = j->a + c * cs;
            const float *ahead = c + PACK_A_AHEAD < k ? col + PACK_A_AHEAD * cs : NULL;
            for (; i < m; i++) {
                if (ahead && i % 16 == 0) __builtin_prefetch(ahead + i * rs);
                dst[i / GEMM_XT_ROWS * tile + i % GEMM_XT_ROWS] = col[i * rs];
            }
        }
        for (; i < tiles * GEMM_XT_ROWS; i++) dst[i / GEMM_XT_ROWS * tile + i % GEMM_XT_ROWS] = 0.0f;
    }
}

static size_t pack_tasks(const pack_a_job *j) {
    return by_columns(j) ? (gemm_packed_row(j->k) + PACK_A_COLS - 1) / PACK_A_COLS
                         : (j->m + PACK_A_ROWS - 1) / PACK_A_ROWS;
}

/* m rows of k values read through strides, packed over the pool as bf16 rows
 * gemm_packed_row(k) apart into out; 1 if every value was a bf16 value, else 0 (out is then
 * not to be used). */
static int pack_bf16(threadpool *pool, size_t m, size_t k, const float *src, size_t rs,
                     size_t cs, uint16_t *out) {
    pack_a_job j = {kern(), m, k, rs, cs, src, out, NULL, 0};
    atomic_init(&j.not_bf16, 0);
    pool_run(pool, pack_a_bf16, &j, pack_tasks(&j));
    return !atomic_load(&j.not_bf16);
}

/* a packed for the bf16-weight GEMM into s's xpack: as bf16 rows (returned in *xb) where the
 * table has bf16 dot products and every value is a bf16 value, else as tiles (*xt) where m
 * is large enough for them; neither (both NULL): the caller gathers a itself. */
static void pack_a(threadpool *pool, size_t m, size_t k, const float *a, size_t rs, size_t cs,
                   const gemm_scratch *s, const uint16_t **xb, const float **xt) {
    pack_a_job j = {kern(), m, k, rs, cs, a, NULL, s->xpack, 0};
    *xb = NULL, *xt = NULL;
    if (j.kt->gemm_bf16xw && pack_bf16(pool, m, k, a, rs, cs, (uint16_t *)s->xpack)) {
        *xb = (const uint16_t *)s->xpack;
        return;
    }
    if (m >= j.kt->tiles_min_m) {
        pool_run(pool, pack_a_tiles, &j, pack_tasks(&j));
        *xt = j.xt;
    }
}

/* ---- the GEMM ----------------------------------------------------------------------------- */

int parity_matmul(parity_pool *pool, size_t m, size_t n, size_t k, const float *a,
                  size_t a_row_stride, size_t a_col_stride, uint32_t b_dtype, const void *b,
                  size_t b_row_stride, size_t b_col_stride, float *c, size_t c_stride) {
    static const char fn[] = "parity_matmul";
    clear_error();
    TRY(arg_shape(fn, m, k));
    if (n == 0) return set_error(PARITY_ERR_INVALID_ARGUMENT, "%s: n is 0", fn);
    TRY(arg_ptr(fn, a, "a"));
    TRY(arg_ptr(fn, b, "b"));
    TRY(arg_ptr(fn, c, "c"));
    if (b_dtype != PARITY_DTYPE_BF16 && b_dtype != PARITY_DTYPE_F32)
        return set_error(PARITY_ERR_INVALID_ARGUMENT, "%s: b has dtype %u; it must be "
                         "PARITY_DTYPE_BF16 or PARITY_DTYPE_F32", fn, b_dtype);
    if (k > (1u << 24) || n > (1u << 30) || m > (1u << 30))
        return set_error(PARITY_ERR_INVALID_ARGUMENT, "%s: m %zu, n %zu or k %zu is too large",
                         fn, m, n, k);
    TRY(arg_rows(fn, m, n, c_stride, "c"));
    uintptr_t alo, ahi, blo, bhi, clo, chi;
    if (span_of(a, m, k, a_row_stride, a_col_stride, 4, &alo, &ahi) ||
        span_of(b, n, k, b_row_stride, b_col_stride, b_dtype == PARITY_DTYPE_BF16 ? 2 : 4, &blo,
                &bhi))
        return set_error(PARITY_ERR_INVALID_ARGUMENT, "%s: the strides of %s reach past the "
                         "address space", fn,
                         span_of(a, m, k, a_row_stride, a_col_stride, 4, &alo, &ahi) ? "a" : "b");
    if (span_of(c, m, n, c_stride, 1, 4, &clo, &chi))
        return set_error(PARITY_ERR_INVALID_ARGUMENT, "%s: c reaches past the address space", fn);
    if (overlaps(clo, chi, alo, ahi) || overlaps(clo, chi, blo, bhi))
        return set_error(PARITY_ERR_INVALID_ARGUMENT, "%s: c overlaps %s", fn,
                         overlaps(clo, chi, alo, ahi) ? "a" : "b");
    parity_policy bf16_pol, f32_pol;
    TRY(parity_policy_from_name("aligned", &bf16_pol));  /* only the compute switch matters */
    TRY(parity_policy_from_name("fp32", &f32_pol));

    op_call call;
    TRY(op_begin(&call, pool, fn));
    int rc = PARITY_OK;
    fwd_scratch s = {0};
    gemm_weights gw = {n, k, b_row_stride, NULL, NULL};
    /* b: its bf16 rows as they are, else packed or gathered (as bf16 where every value is
     * one: fp32 b straight from its strides, as a is below) */
    if (b_dtype == PARITY_DTYPE_BF16 && b_col_stride == 1) {
        gw.bf16 = b;
    } else {
        gather_job g = {n, k, b_row_stride, b_col_stride, b, b_dtype, NULL, NULL};
        const size_t P = gemm_packed_row(k);
        g.bf16 = op_alloc(&call, (uint64_t)n * P, 2, "b as bf16 rows");
        if (g.bf16 && b_dtype == PARITY_DTYPE_F32 &&
            pack_bf16(call.pool, n, k, b, b_row_stride, b_col_stride, g.bf16)) {
            gw.bf16 = g.bf16;
            gw.ld = P;
        } else if (g.bf16 && b_dtype == PARITY_DTYPE_BF16) {
            gather(call.pool, &g);
            gw.bf16 = g.bf16;
            gw.ld = k;
        } else if (g.bf16 && b_col_stride == 1) {
            gw.f32 = b;
        } else if (g.bf16) {
            g.bf16 = NULL;
            g.f32 = op_alloc(&call, (uint64_t)n * k, 4, "b as fp32 rows");
            if (g.f32) gather(call.pool, &g);
            gw.f32 = g.f32;
            gw.ld = k;
        }
        if (!gw.bf16 && !gw.f32) rc = PARITY_ERR_OUT_OF_MEMORY;
    }
    /* a: packed straight from its strides where the bf16-weight GEMM can take it so */
    const uint16_t *xb = NULL;
    const float *xt = NULL;
    if (!rc && gw.bf16) {
        rc = gemm_scratch_of(&call, m, k, &s.gemm);
        if (!rc) pack_a(call.pool, m, k, a, a_row_stride, a_col_stride, &s.gemm, &xb, &xt);
        if (xb || xt) {
            gemm_bf16w_pool_packed(call.pool, m, k, xb, xt, gw.bf16, gw.ld, c, c_stride, n,
                                   &s.gemm);
            op_end(&call);
            return PARITY_OK;
        }
    }
    /* else: its rows as they are, or gathered */
    const float *x = a;
    size_t ldx = a_row_stride;
    if (!rc && a_col_stride != 1) {
        gather_job g = {m, k, a_row_stride, a_col_stride, a, PARITY_DTYPE_F32, NULL, NULL};
        g.f32 = op_alloc(&call, (uint64_t)m * k, 4, "a as rows");
        if (g.f32) gather(call.pool, &g);
        x = g.f32;
        ldx = k;
        if (!x) rc = PARITY_ERR_OUT_OF_MEMORY;
    }
    const parity_policy *pol = gw.bf16 ? &bf16_pol : &f32_pol;
    if (!rc) {
        const fwd_ctx ctx = op_ctx(&call, pol, PARITY_BACKEND_BF16, NULL, &s, NULL);
        linear_weights(&ctx, m, x, ldx, &gw, NULL, c, c_stride);
    }
    op_end(&call);
    return rc;
}

/* ---- the attention backward ----------------------------------------------------------------- */

/* Query rows per block: the block's scores, their gradient and its transpose for every head of
 * the group (3 x group x rows x longest floats a worker) stay within ATTN_GRAD_FLOATS; and at
 * most ATTN_GRAD_ROWS, so that the causal mask skips the keys past each block. */
#define ATTN_GRAD_ROWS 64
/* Query rows per GEMM of the scores and their gradient, each over the keys up to its last row's
 * (fewer masked-out products than the whole block's). */
#define ATTN_SCORE_ROWS 16
#define ATTN_GRAD_FLOATS (1u << 22)

typedef struct attn_grad_job {
    const kernels *kt;
    size_t n_kv, group, hd, block, longest;
    const uint32_t *lengths;
    const size_t *first;    /* each sequence's first row */
    const float *q, *k, *v, *go;
    size_t qs, ks, vs, gos;
    float *gq, *gk, *gv;
    size_t gqs, gks, gvs;
    float scale;
    float *work;
    size_t work_floats;     /* a worker's */
} attn_grad_job;

/* dst[c * ldd + i] = src[i * lds + c] for i < rows, c < cols: TRANSPOSE_ROWS source rows at
 * a time, so that the reads stay within that many cache lines and each column's writes are
 * contiguous. */
#define TRANSPOSE_ROWS 8

static void transpose(const float *src, size_t lds, size_t rows, size_t cols, float *dst,
                      size_t ldd) {
    for (size_t i0 = 0; i0 < rows; i0 += TRANSPOSE_ROWS) {
        const size_t i1 = i0 + TRANSPOSE_ROWS < rows ? i0 + TRANSPOSE_ROWS : rows;
        for (size_t c = 0; c < cols; c++)
            for (size_t i = i0; i < i1; i++) dst[c * ldd + i] = src[i * lds + c];
    }
}

/* One (sequence, KV head): its group's query heads' rows in blocks of j->block positions. */
static void attn_grad_task(const attn_grad_job *j, size_t seq, size_t kvh, float *work) {
    const kernels *kt = j->kt;
    const size_t n = j->lengths[seq], row0 = j->first[seq], G = j->group, D = j->hd;
    const size_t L = j->longest, R = j->block;
    float *S = work, *dP = S + G * R * L, *T = dP + G * R * L, *KT = T + G * R * L;
    float *XT = KT + D * L, *acc = XT + D * G * R;
    const float *K = j->k + row0 * j->ks + kvh * D, *V = j->v + row0 * j->vs + kvh * D;
    float *gk = j->gk + row0 * j->gks + kvh * D, *gv = j->gv + row0 * j->gvs + kvh * D;
    transpose(K, j->ks, n, D, KT, L);
    for (size_t c = 0; c < n; c++) {
        memset(gk + c * j->gks, 0, D * sizeof(float));
        memset(gv + c * j->gvs, 0, D * sizeof(float));
    }
    for (size_t r0 = 0; r0 < n; r0 += R) {
        const size_t r1 = r0 + R < n ? r0 + R : n, rb = r1 - r0, M = G * rb;
        /* S = Q K^T and dP = dO V^T, head after head, ATTN_SCORE_ROWS rows at a time over
         * the keys up to their last (each score a D-long sum: the same bits however the rows
         * are split; the keys past a row's own are zeroed below) */
        for (size_t h = 0; h < G; h++) {
            const size_t head = kvh * G + h;
            for (size_t s0 = r0; s0 < r1; s0 += ATTN_SCORE_ROWS) {
                const size_t s1 = s0 + ATTN_SCORE_ROWS < r1 ? s0 + ATTN_SCORE_ROWS : r1;
                const size_t at = h * rb * L + (s0 - r0) * L;
                kt->gemm_f32w(s1 - s0, D, j->q + (row0 + s0) * j->qs + head * D, j->qs, K,
                              j->ks, S + at, L, 0, s1);
                kt->gemm_f32w(s1 - s0, D, j->go + (row0 + s0) * j->gos + head * D, j->gos, V,
                              j->vs, dP + at, L, 0, s1);
            }
        }
        /* P = softmax(S scale) over the keys 0 .. r; dS = P (dP - rowsum(P dP)) scale */
        for (size_t row = 0; row < M; row++) {
            const size_t r = r0 + row % rb, live = r + 1;
            float *p = S + row * L, *ds = dP + row * L;
            for (size_t c = 0; c < live; c++) p[c] *= j->scale;
            const float mx = kt->max_f32(p, live);
            const float sum = kt->sum_exp(p, live, mx, p);
            for (size_t c = 0; c < live; c++) p[c] /= sum;
            const float dot = kt->dot_f32(p, ds, live);
            for (size_t c = 0; c < live; c++) ds[c] = p[c] * (ds[c] - dot) * j->scale;
            for (size_t c = live; c < r1; c++) p[c] = ds[c] = 0.0f;
        }
        /* dQ = dS K, head after head (KT holds K^T), ATTN_SCORE_ROWS rows at a time over the
         * keys up to their last: the keys left out hold dS = +0, whose products add nothing
         * to dot16's lanes (each starts at +0, so none is -0), for finite K */
        for (size_t h = 0; h < G; h++)
            for (size_t s0 = r0; s0 < r1; s0 += ATTN_SCORE_ROWS) {
                const size_t s1 = s0 + ATTN_SCORE_ROWS < r1 ? s0 + ATTN_SCORE_ROWS : r1;
                kt->gemm_f32w(s1 - s0, s1, dP + h * rb * L + (s0 - r0) * L, L, KT, L,
                              j->gq + (row0 + s0) * j->gqs + (kvh * G + h) * D, j->gqs, 0, D);
            }
        /* dK += dS^T Q and dV += P^T dO over the block's rows of every head of the group */
        for (int pass = 0; pass < 2; pass++) {
            const float *by = pass ? S : dP, *with = pass ? j->go : j->q;
            const size_t lw = pass ? j->gos : j->qs;
            float *out = pass ? gv : gk;
            const size_t lo = pass ? j->gvs : j->gks;
            for (size_t h = 0; h < G; h++) {
                transpose(by + h * rb * L, L, rb, r1, T + h * rb, M);
                transpose(with + (row0 + r0) * lw + (kvh * G + h) * D, lw, rb, D, XT + h * rb,
                          M);
            }
            kt->gemm_f32w(r1, M, T, M, XT, M, acc, D, 0, D);
            for (size_t c = 0; c < r1; c++)
                for (size_t d = 0; d < D; d++) out[c * lo + d] += acc[c * D + d];
        }
    }
}

static void attn_grad_tasks(void *ctx, size_t begin, size_t end, unsigned worker) {
    const attn_grad_job *j = ctx;
    for (size_t t = begin; t < end; t++)
        attn_grad_task(j, t / j->n_kv, t % j->n_kv, j->work + worker * j->work_floats);
}

int parity_attention_backward(parity_pool *pool, size_t n_seqs, const uint32_t *lengths,
                              size_t n_heads, size_t n_kv_heads, size_t head_dim, const float *q,
                              size_t q_stride, const float *k, size_t k_stride, const float *v,
                              size_t v_stride, const float *d_out, size_t d_out_stride,
                              float *d_q, size_t d_q_stride, float *d_k, size_t d_k_stride,
                              float *d_v, size_t d_v_stride) {
    static const char fn[] = "parity_attention_backward";
    clear_error();
    const void *ptrs[] = {lengths, q, k, v, d_out, d_q, d_k, d_v};
    static const char *const names[] = {"lengths", "q", "k", "v", "d_out", "d_q", "d_k", "d_v"};
    for (size_t i = 0; i < sizeof ptrs / sizeof ptrs[0]; i++) TRY(arg_ptr(fn, ptrs[i], names[i]));
    uint64_t total;
    uint32_t longest;
    TRY(arg_attention(fn, n_seqs, lengths, n_heads, n_kv_heads, head_dim, &total, &longest));
    if (total > (1u << 28) || n_seqs > (1u << 28))
        return set_error(PARITY_ERR_TOO_LONG, "%s: %llu positions in all is too many", fn,
                         (unsigned long long)total);
    const size_t T = (size_t)total, qw = n_heads * head_dim, kvw = n_kv_heads * head_dim;
    const float *in[] = {q, k, v, d_out};
    const size_t in_stride[] = {q_stride, k_stride, v_stride, d_out_stride};
    const size_t in_width[] = {qw, kvw, kvw, qw};
    float *out[] = {d_q, d_k, d_v};
    const size_t out_stride[] = {d_q_stride, d_k_stride, d_v_stride};
    const size_t out_width[] = {qw, kvw, kvw};
    uintptr_t lo[7], hi[7];
    for (size_t i = 0; i < 7; i++) {
        const void *p = i < 4 ? (const void *)in[i] : (const void *)out[i - 4];
        const size_t stride = i < 4 ? in_stride[i] : out_stride[i - 4];
        const size_t width = i < 4 ? in_width[i] : out_width[i - 4];
        TRY(arg_rows(fn, T, width, stride, names[i + 1]));
        span_of(p, T, width, stride, 1, 4, &lo[i], &hi[i]);  /* fits: arg_rows checked it */
    }
    for (size_t o = 4; o < 7; o++)
        for (size_t i = 0; i < o; i++)
            if (overlaps(lo[o], hi[o], lo[i], hi[i]))
                return set_error(PARITY_ERR_INVALID_ARGUMENT, "%s: %s overlaps %s", fn,
                                 names[o + 1], names[i + 1]);

    const size_t G = n_heads / n_kv_heads, L = longest, D = head_dim;
    size_t R = ATTN_GRAD_FLOATS / (3 * G * L);
    if (R > ATTN_GRAD_ROWS) R = ATTN_GRAD_ROWS;
    if (R > L) R = L;
    if (R < 1) R = 1;
    op_call call;
    TRY(op_begin(&call, pool, fn));
    const size_t workers = pool_size(call.pool);
    attn_grad_job j = {kern(), n_kv_heads, G, D, R, L, lengths, NULL, q, k, v, d_out,
                       q_stride, k_stride, v_stride, d_out_stride, d_q, d_k, d_v, d_q_stride,
                       d_k_stride, d_v_stride, (float)(1.0 / sqrt((double)D)), NULL,
                       3 * G * R * L + D * L + D * G * R + L * D};
    size_t *first = op_alloc(&call, n_seqs, sizeof *first, "sequence offsets");
    j.work = first ? op_alloc(&call, (uint64_t)workers * j.work_floats, sizeof(float),
                              "attention backward scratch")
                   : NULL;
    const int rc = j.work ? PARITY_OK : PARITY_ERR_OUT_OF_MEMORY;
    if (!rc) {
        for (size_t i = 0, at = 0; i < n_seqs; at += lengths[i], i++) first[i] = at;
        j.first = first;
        pool_run_dynamic(call.pool, attn_grad_tasks, &j, n_seqs * n_kv_heads, 1);
    }
    op_end(&call);
    return rc;
}

/* ---- the regions' backward ------------------------------------------------------------------ */

typedef struct region_grad_job {
    const kernels *kt;
    size_t rows, dim;
    const float *x, *w, *g, *add;   /* rmsnorm: x, weight, d_out, d_add; swiglu: gate, up, d_out */
    size_t xs, gs, as, ws;          /* swiglu: ws is up's row stride */
    float eps;
    float *dx, *dw, *inv;           /* swiglu: dx = d_gate, dw = d_up (rows dws apart) */
    size_t dxs, dws;
    float *work;                    /* swiglu: dim floats a worker; rmsnorm with x2: RMS_ROWS
                                     * rows of dim floats a worker, x + x2 */
    const float *x2;                /* rmsnorm: NULL, or the second addend of x (x + x2) */
    size_t x2s;
} region_grad_job;

#define REGION_GRAD_ROWS 16

/* RMSNorm rows: autograd's steps of y = x r w, r = rsqrt(mean(x x) + eps), in its order of
 * operations (sums in the row's order): gxw = g w; gx = gxw r + (a x + a x) with
 * a = (-0.5 sum(gxw x) r^3) / dim; plus d_add; each row's r kept for the weight's gradient.
 * Rows go RMS_ROWS at a time, their sums side by side (each still in its own row's order),
 * so that the chains of additions overlap instead of waiting on each other. */
#define RMS_ROWS 4

static void rmsnorm_grad_rows(void *ctx, size_t begin, size_t end, unsigned worker) {
    const region_grad_job *j = ctx;
    const size_t r1 = end * REGION_GRAD_ROWS < j->rows ? end * REGION_GRAD_ROWS : j->rows;
    const size_t dim = j->dim;
    const float *restrict w = j->w;
    float *sums = j->x2 ? j->work + (size_t)worker * RMS_ROWS * dim : NULL;
    for (size_t r0 = begin * REGION_GRAD_ROWS; r0 < r1; r0 += RMS_ROWS) {
        const size_t n = r1 - r0 < RMS_ROWS ? r1 - r0 : RMS_ROWS;
        const float *x[RMS_ROWS], *g[RMS_ROWS];
        float ss[RMS_ROWS] = {0}, t[RMS_ROWS] = {0}, inv[RMS_ROWS];
        /* a group short of rows repeats its last one, whose sums are then not used */
        for (size_t i = 0; i < RMS_ROWS; i++) {
            const size_t r = r0 + (i < n ? i : n - 1);
            x[i] = j->x + r * j->xs, g[i] = j->g + r * j->gs;
            if (sums) {  /* x + x2, the fp32 sum, in the worker's rows */
                const float *restrict a = x[i], *restrict b = j->x2 + r * j->x2s;
                float *restrict row = sums + i * dim;
                for (size_t d = 0; d < dim; d++) row[d] = a[d] + b[d];
                x[i] = row;
            }
        }
        for (size_t d = 0; d < dim; d++)
            for (size_t i = 0; i < RMS_ROWS; i++) ss[i] += x[i][d] * x[i][d];
        for (size_t i = 0; i < RMS_ROWS; i++) inv[i] = 1.0f / sqrtf(ss[i] / (float)dim + j->eps);
        for (size_t d = 0; d < dim; d++)
            for (size_t i = 0; i < RMS_ROWS; i++) t[i] += (g[i][d] * w[d]) * x[i][d];
        for (size_t i = 0; i < n; i++) {
            const float a = -0.5f * t[i] * (inv[i] * inv[i] * inv[i]) / (float)dim;
            const float *restrict xi = x[i], *restrict gi = g[i];
            float *restrict dx = j->dx + (r0 + i) * j->dxs;
            for (size_t d = 0; d < dim; d++)
                dx[d] = (gi[d] * w[d]) * inv[i] + (a * xi[d] + a * xi[d]);
            if (j->add) {
                const float *restrict ad = j->add + (r0 + i) * j->as;
                for (size_t d = 0; d < dim; d++) dx[d] += ad[d];
            }
            j->inv[r0 + i] = inv[i];
        }
    }
}

/* The weight's gradient, columns [begin, end) x 16: sum over the rows, in their order, of
 * g (x r) (autograd's y1 = x r, then g y1 summed over the rows). */
static void rmsnorm_grad_weight(void *ctx, size_t begin, size_t end, unsigned worker) {
    (void)worker;
    const region_grad_job *j = ctx;
    const size_t c0 = begin * 16, c1 = end * 16 < j->dim ? end * 16 : j->dim;
    float *restrict dw = j->dw;
    for (size_t c = c0; c < c1; c++) dw[c] = 0.0f;
    for (size_t r = 0; r < j->rows; r++) {
        const float *restrict x = j->x + r * j->xs, *restrict g = j->g + r * j->gs;
        const float inv = j->inv[r];
        if (j->x2) {
            const float *restrict x2 = j->x2 + r * j->x2s;
            for (size_t c = c0; c < c1; c++) dw[c] += g[c] * ((x[c] + x2[c]) * inv);
        } else {
            for (size_t c = c0; c < c1; c++) dw[c] += g[c] * (x[c] * inv);
        }
    }
}

/* parity_rmsnorm_backward of x, or with x2 of x + x2 (parity_rmsnorm_residual_backward, whose
 * names fn and x_name give the messages). */
static int rmsnorm_backward(const char *fn, parity_pool *pool, size_t rows, size_t dim,
                            const float *x, size_t x_stride, const char *x_name, const float *x2,
                            size_t x2_stride, const float *weight, float eps, const float *d_out,
                            size_t d_out_stride, const float *d_add, size_t d_add_stride,
                            float *d_x, size_t d_x_stride, float *d_weight) {
    clear_error();
    TRY(arg_shape(fn, rows, dim));
    TRY(arg_ptr(fn, x, x_name));
    TRY(arg_ptr(fn, weight, "weight"));
    TRY(arg_ptr(fn, d_out, "d_out"));
    TRY(arg_ptr(fn, d_x, "d_x"));
    TRY(arg_eps(fn, eps));
    TRY(arg_rows(fn, rows, dim, x_stride, x_name));
    if (x2) TRY(arg_rows(fn, rows, dim, x2_stride, "delta"));
    TRY(arg_rows(fn, rows, dim, d_out_stride, "d_out"));
    if (d_add) TRY(arg_rows(fn, rows, dim, d_add_stride, "d_add"));
    TRY(arg_rows(fn, rows, dim, d_x_stride, "d_x"));
    enum { N_BUFS = 6, D_X = 5 };
    uintptr_t lo[N_BUFS], hi[N_BUFS];
    const void *bufs[N_BUFS] = {x, d_out, d_add ? (const void *)d_add : (const void *)x, weight,
                                x2 ? (const void *)x2 : (const void *)x, d_x};
    const size_t strides[N_BUFS] = {x_stride, d_out_stride, d_add ? d_add_stride : x_stride, 0,
                                    x2 ? x2_stride : x_stride, d_x_stride};
    const char *const names[N_BUFS] = {x_name, "d_out", "d_add", "weight", "delta", "d_x"};
    for (size_t i = 0; i < N_BUFS; i++)
        span_of(bufs[i], i == 3 ? 1 : rows, dim, strides[i], 1, 4, &lo[i], &hi[i]);
    for (size_t i = 0; i < D_X; i++)
        if (overlaps(lo[D_X], hi[D_X], lo[i], hi[i]) ||
            (d_weight && overlaps((uintptr_t)d_weight, (uintptr_t)(d_weight + dim), lo[i], hi[i])))
            return set_error(PARITY_ERR_INVALID_ARGUMENT, "%s: %s overlaps %s", fn,
                             overlaps(lo[D_X], hi[D_X], lo[i], hi[i]) ? "d_x" : "d_weight",
                             names[i]);
    if (d_weight && overlaps((uintptr_t)d_weight, (uintptr_t)(d_weight + dim), lo[D_X], hi[D_X]))
        return set_error(PARITY_ERR_INVALID_ARGUMENT, "%s: d_weight overlaps d_x", fn);
    op_call call;
    TRY(op_begin(&call, pool, fn));
    region_grad_job j = {kern(), rows, dim, x, weight, d_out, d_add, x_stride, d_out_stride,
                         d_add_stride, 0, eps, d_x, d_weight, NULL, d_x_stride, 0, NULL,
                         x2, x2_stride};
    j.inv = op_alloc(&call, rows, sizeof(float), "rows' inverse RMS");
    if (j.inv && x2)
        j.work = op_alloc(&call, (uint64_t)pool_size(call.pool) * RMS_ROWS * dim, sizeof(float),
                          "rows of residual + delta");
    const int rc = j.inv && (!x2 || j.work) ? PARITY_OK : PARITY_ERR_OUT_OF_MEMORY;
    if (!rc) {
        const size_t tasks = (rows + REGION_GRAD_ROWS - 1) / REGION_GRAD_ROWS;
        pool_run(call.pool, rmsnorm_grad_rows, &j, tasks);
        if (d_weight) pool_run(call.pool, rmsnorm_grad_weight, &j, (dim + 15) / 16);
    }
    op_end(&call);
    return rc;
}

int parity_rmsnorm_backward(parity_pool *pool, size_t rows, size_t dim, const float *x,
                            size_t x_stride, const float *weight, float eps, const float *d_out,
                            size_t d_out_stride, const float *d_add, size_t d_add_stride,
                            float *d_x, size_t d_x_stride, float *d_weight) {
    return rmsnorm_backward("parity_rmsnorm_backward", pool, rows, dim, x, x_stride, "x", NULL,
                            0, weight, eps, d_out, d_out_stride, d_add, d_add_stride, d_x,
                            d_x_stride, d_weight);
}

int parity_rmsnorm_residual_backward(parity_pool *pool, size_t rows, size_t dim,
                                     const float *residual, size_t residual_stride,
                                     const float *delta, size_t delta_stride,
                                     const float *weight, float eps, const float *d_out,
                                     size_t d_out_stride, const float *d_add,
                                     size_t d_add_stride, float *d_x, size_t d_x_stride,
                                     float *d_weight) {
    static const char fn[] = "parity_rmsnorm_residual_backward";
    clear_error();
    TRY(arg_ptr(fn, residual, "residual"));
    TRY(arg_ptr(fn, delta, "delta"));  /* NULL would be parity_rmsnorm_backward's call */
    return rmsnorm_backward(fn, pool, rows, dim, residual,
                            residual_stride, "residual", delta, delta_stride, weight, eps, d_out,
                            d_out_stride, d_add, d_add_stride, d_x, d_x_stride, d_weight);
}

/* SwiGLU rows: autograd's steps of y = (g s) u, s = sigmoid(g) = 1 / (1 + exp(-g)) (the
 * library's exp): d_up = go (g s); gy1 = go u; d_gate = gy1 s + (gy1 g) (1 - s) s. */
static void swiglu_grad_rows(void *ctx, size_t begin, size_t end, unsigned worker) {
    const region_grad_job *j = ctx;
    float *s = j->work + worker * j->dim;
    const size_t r1 = end * REGION_GRAD_ROWS < j->rows ? end * REGION_GRAD_ROWS : j->rows;
    for (size_t r = begin * REGION_GRAD_ROWS; r < r1; r++) {
        const float *restrict g = j->x + r * j->xs, *restrict u = j->w + r * j->ws;
        const float *restrict go = j->g + r * j->gs;
        float *restrict dg = j->dx + r * j->dxs, *restrict du = j->dw + r * j->dws;
        for (size_t d = 0; d < j->dim; d++) s[d] = -g[d];
        j->kt->exp_f32(s, j->dim);
        for (size_t d = 0; d < j->dim; d++) {
            const float sg = 1.0f / (1.0f + s[d]), gy1 = go[d] * u[d];
            du[d] = go[d] * (g[d] * sg);
            dg[d] = gy1 * sg + (gy1 * g[d]) * (1.0f - sg) * sg;
        }
    }
}

int parity_swiglu_backward(parity_pool *pool, size_t rows, size_t dim, const float *gate,
                           size_t gate_stride, const float *up, size_t up_stride,
                           const float *d_out, size_t d_out_stride, float *d_gate,
                           size_t d_gate_stride, float *d_up, size_t d_up_stride) {
    static const char fn[] = "parity_swiglu_backward";
    clear_error();
    TRY(arg_shape(fn, rows, dim));
    const void *ptrs[5] = {gate, up, d_out, d_gate, d_up};
    const size_t strides[5] = {gate_stride, up_stride, d_out_stride, d_gate_stride, d_up_stride};
    static const char *const names[5] = {"gate", "up", "d_out", "d_gate", "d_up"};
    uintptr_t lo[5], hi[5];
    for (size_t i = 0; i < 5; i++) {
        TRY(arg_ptr(fn, ptrs[i], names[i]));
        TRY(arg_rows(fn, rows, dim, strides[i], names[i]));
        span_of(ptrs[i], rows, dim, strides[i], 1, 4, &lo[i], &hi[i]);
    }
    for (size_t o = 3; o < 5; o++)
        for (size_t i = 0; i < o; i++)
            if (rows_overlap(lo[o], hi[o], strides[o], lo[i], hi[i], strides[i], dim))
                return set_error(PARITY_ERR_INVALID_ARGUMENT, "%s: %s overlaps %s", fn, names[o],
                                 names[i]);
    op_call call;
    TRY(op_begin(&call, pool, fn));
    region_grad_job j = {kern(), rows, dim, gate, up, d_out, NULL, gate_stride, d_out_stride, 0,
                         up_stride, 0.0f, d_gate, d_up, NULL, d_gate_stride, d_up_stride, NULL,
                         NULL, 0};
    j.work = op_alloc(&call, (uint64_t)pool_size(call.pool) * dim, sizeof(float), "sigmoids");
    const int rc = j.work ? PARITY_OK : PARITY_ERR_OUT_OF_MEMORY;
    if (!rc)
        pool_run(call.pool, swiglu_grad_rows, &j, (rows + REGION_GRAD_ROWS - 1) / REGION_GRAD_ROWS);
    op_end(&call);
    return rc;
}
