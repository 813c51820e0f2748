/*
 * Kernels: one table per instruction set, each in its own files in lib/kernels/ (compiled with
 * its own flags). kernels_ref.c (portable C) is the specification; every other table
 * (kernels_avx2.c with gemm_avx2.c, kernels_avx512.c with gemm_avx512.c, kernels_avx512bf16.c)
 * must return the same bits for every input, tails and odd sizes included (NaN payloads
 * excepted: which NaN an operation on two NaNs returns follows the compiler's choice of
 * operand order, so an fp32 NaN result is only NaN in every table; bf16 has one NaN, 0x7fc0).
 * Kernels take pointers and sizes; they neither allocate nor start threads. The summation
 * orders below are part of the numerics contract. This header holds the table's type and
 * those orders, the packings of x for the GEMMs, and the ways to the tables (cpu.c).
 *
 * Orders
 * ------
 * dot16 (fp32 dot products, sums of squares, sums of exponentials):
 *   16 lane accumulators, all +0. Element i goes to lane i % 16, in ascending i, as
 *   acc = fmaf(a[i], b[i], acc) (for sums: acc = acc + x[i]). Then the lanes are folded:
 *   l += l + 8 (l < 8), then l += l + 4 (l < 4), then l += l + 2, then l += l + 1:
 *   result = lane 0.
 *
 * pair32 (GEMM on bf16 weights; the order of vdpbf16ps, which equals two sequential fmaf,
 * odd element first):
 *   16 lane accumulators, all +0. Chunk c covers k = 32c .. 32c+31; lane l takes the pair
 *   (k0 = 32c + 2l, k1 = k0 + 1) as acc = fmaf(x[k0], w[k0], fmaf(x[k1], w[k1], acc)),
 *   chunks in ascending c; elements with k >= K are skipped. Then the dot16 fold.
 *   Denormals are flushed, in every step of pair32 and of its fold, as vdpbf16ps does them
 *   (Intel SDM: "DAZ in, FTZ out", whatever MXCSR says): an operand (x, w or the
 *   accumulator) whose magnitude is below 2^-126 reads as a zero of its sign, and a result
 *   that is tiny after rounding (rounded to 24 bits as if the exponent were unbounded, its
 *   magnitude is below 2^-126) becomes a zero of its sign. This is what x86's fma and add
 *   compute with MXCSR.DAZ and MXCSR.FTZ set, which is how the fp32-FMA tables get it;
 *   fma_flushed in kernels_ref.c writes it out in C.
 *
 * Elementwise functions: exp is parity_expf below (the same algorithm in every table);
 * every other elementwise op is a single IEEE operation (or fmaf) in the order written.
 * Nothing but pair32 flushes denormals.
 */
#ifndef PARITY_KERNELS_H
#define PARITY_KERNELS_H

#include <stddef.h>
#include <stdint.h>

#include "parity.h"

/* exp in fp32, the library's own (|error| <= 1 ulp, not correctly rounded), identical in
 * every table: a scalar form for the reference kernels. */
float parity_expf(float x);

typedef struct kernels {
    const char *name;  /* "portable", "avx2", "avx512", "avx512bf16" */

    /* --- reductions (dot16 order) --- */
    float (*dot_f32)(const float *a, const float *b, size_t n);
    float (*dot_f32_bf16)(const float *a, const uint16_t *b, size_t n);  /* b widened */
    /* count dot_f32_bf16 of each of `queries` vectors a + q * lda against bf16 vectors ldb
     * apart (attention scores of a KV head's query heads over a block of the cache's keys):
     * out[q * ldo + j] = dot_f32_bf16(a + q * lda, b + j * ldb, n), each in its own order */
    void (*dots_f32_bf16)(const float *a, size_t lda, size_t queries, const uint16_t *b,
                          size_t ldb, size_t count, size_t n, float *out, size_t ldo);
    /* dots_f32_bf16 on fp32 vectors (a block of widened keys):
     * out[q * ldo + j] = dot_f32(a + q * lda, b + j * ldb, n) */
    void (*dots_f32)(const float *a, size_t lda, size_t queries, const float *b, size_t ldb,
                     size_t count, size_t n, float *out, size_t ldo);
    float (*sum_squares)(const float *x, size_t n);                      /* fmaf(x, x, acc) */
    /* sum of parity_expf(x[i] - m) (the subtraction in fp32, then exp), dot16 order with
     * acc = acc + e. If `out` is not NULL it receives the exponentials. */
    float (*sum_exp)(const float *x, size_t n, float m, float *out);
    /* n >= 1; dot16 lanes, all starting at x[0], step and fold m = (x > m) ? x : m (as
     * vmaxps): NaN only if x[0] is NaN, the sign of a zero maximum fixed by the lanes */
    float (*max_f32)(const float *x, size_t n);

    /* --- elementwise --- */
    void (*round_bf16)(float *x, size_t n);                /* x[i] = round_bf16(x[i]) */
    void (*round_fp16)(float *x, size_t n);                /* x[i] = round_fp16(x[i]) */
    /* x[i] = round_if(after, round_if(before, x[i]) * scale) (FMT_* rounding points of
     * kernel_common.h, FMT_NONE for none; the product in fp32), in one pass over x; if `max`
     * is not NULL (n >= 1), *max = max_f32 of the new x. One row of attention scores: the
     * passes of its softmax between q.k and sum_exp, and after it. */
    void (*scale_round)(float *x, size_t n, float scale, int before, int after, float *max);
    void (*exp_f32)(float *x, size_t n);                   /* x[i] = parity_expf(x[i]) */
    /* o[i] = fmaf(p, v[i], o[i]) (P.V accumulation, one key at a time) */
    void (*axpy_f32)(float *o, float p, const float *v, size_t n);
    void (*axpy_bf16)(float *o, float p, const uint16_t *v, size_t n);
    /* for each of `queries` outputs o_q = o + q * ldo with probabilities p_q = p + q * ldp,
     * count axpy_bf16 in order over bf16 vectors ldv apart (P.V of a KV head's query heads
     * over a block of the cache's values): for j = 0 .. count-1:
     * o_q[i] = fmaf(p_q[j], v[j * ldv + i], o_q[i]) */
    void (*pv_bf16)(float *o, size_t ldo, const float *p, size_t ldp, size_t queries,
                    const uint16_t *v, size_t ldv, size_t count, size_t n);
    /* pv_bf16 on fp32 vectors (a block of widened values): o_q[i] = fmaf(p_q[j], v[j * ldv + i], o_q[i]) */
    void (*pv_f32)(float *o, size_t ldo, const float *p, size_t ldp, size_t queries,
                   const float *v, size_t ldv, size_t count, size_t n);
    void (*widen_bf16)(const uint16_t *src, size_t n, float *dst);  /* dst[i] = src[i] exactly */
    /* Whether attention widens a bf16 block of the cache that several rows read once
     * (widen_bf16, then dots_f32 and pv_f32 for each row) rather than each row reading it as
     * bf16 (dots_f32_bf16, pv_bf16): the same bits either way, a question of speed only. */
    int attn_widens_shared_blocks;
    /* Attention on bf16 dot-product instructions (NULL in tables without them; attention then
     * calls dots_f32_bf16 and pv_bf16). pack_queries_bf16 writes `queries` vectors a + q lda
     * of n floats (a task's query heads, once) into qp, n apart, in the table's layout, and
     * returns a code for dots_packed_bf16, negative where these queries are not for it (not
     * bf16 values, or values it cannot take). dots_packed_bf16(qp, code, a, ...) is
     * dots_f32_bf16(a, ...) bit for bit, qp + q n and the code being those of the packing of
     * a + q lda or of a set of queries that held it. pv_bf16_grained is pv_bf16 bit for bit
     * where every o_q[i] is +0 or was summed only by calls of it that returned 1 (attention's
     * accumulators from their memset on); it returns 0 where it ran pv_bf16 itself, after
     * which an output it touched holds sums it cannot take. */
    int (*pack_queries_bf16)(const float *a, size_t lda, size_t queries, size_t n, uint16_t *qp);
    void (*dots_packed_bf16)(const uint16_t *qp, int code, const float *a, size_t lda,
                             size_t queries, const uint16_t *b, size_t ldb, size_t count,
                             size_t n, float *out, size_t ldo);
    int (*pv_bf16_grained)(float *o, size_t ldo, const float *p, size_t ldp, size_t queries,
                           const uint16_t *v, size_t ldv, size_t count, size_t n);

    /* --- GEMM: y[m][n] = sum_k x[m][k] * w[n][k], for n in [n0, n1), all m < M ---
     * gemm_bf16w: pair32 order. `xp` is x packed by gemm_pack_x (below).
     * gemm_f32w:  dot16 order on fp32 weights; x unpacked (row stride ldx).
     * y is fp32, row stride ldy; no rounding here (the forward rounds). */
    void (*gemm_bf16w)(size_t M, size_t K, const float *xp, const uint16_t *w, size_t ldw,
                       float *y, size_t ldy, size_t n0, size_t n1);
    void (*gemm_f32w)(size_t M, size_t K, const float *x, size_t ldx, const float *w,
                      size_t ldw, float *y, size_t ldy, size_t n0, size_t n1);
    /* gemm_bf16w_tiles: the same outputs as gemm_bf16w, bit for bit, for large M: x packed
     * by gemm_pack_xt (below) in tiles of GEMM_XT_ROWS rows, `panel` scratch of
     * gemm_panel_floats(K) floats owned by the calling thread (its contents are not kept). */
    void (*gemm_bf16w_tiles)(size_t M, size_t K, const float *xt, const uint16_t *w, size_t ldw,
                             float *y, size_t ldy, size_t n0, size_t n1, float *panel);
    /* the M from which gemm.c runs gemm_bf16w_tiles instead of gemm_bf16w (a matter of speed
     * only: the two give the same bits); at least GEMM_XT_ROWS */
    size_t tiles_min_m;
    /* gemm_pack_xt_tiles (below): the same floats in every table */
    void (*pack_xt_tiles)(size_t M, size_t K, const float *x, size_t ldx, float *xt, size_t t0,
                          size_t t1);
    /* pair32 with x in bf16, for tables with bf16 dot-product instructions (NULL in the
     * others). pack_x_bf16 writes rows m0 .. m1-1 of x (row stride ldx, K columns) as bf16
     * rows, row m at xb + m * gemm_packed_row(K) in the order of k, -0 (0x8000) past K; a
     * subnormal may be written as a zero of its sign (pair32 reads it so). It returns 1
     * when every one of those x is a bf16 value (its low 16 bits are zero), else 0, and
     * then xb is not to be used. gemm_bf16xw computes gemm_bf16w's outputs, bit for bit,
     * from such rows, for any M; with round_bf16 nonzero it stores them rounded to bf16 as
     * round_bf16 rounds them (the same bits as round_bf16 over y after the call). */
    int (*pack_x_bf16)(size_t K, const float *x, size_t ldx, uint16_t *xb, size_t m0,
                       size_t m1);
    void (*gemm_bf16xw)(size_t M, size_t K, const uint16_t *xb, const uint16_t *w, size_t ldw,
                        float *y, size_t ldy, size_t n0, size_t n1, int round_bf16);

    /* --- regions, one row, on fp32 buffers that hold bf16 values (fp16 ones under
     * PARITY_COMPUTE_FP16) where the policy rounds; round() below is to that format
     * (kernel_common.h's round_format_of). Under PARITY_COMPUTE_FP32 nothing rounds. ---
     * rmsnorm_residual: s = residual[i] + delta[i] (fp32); residual[i] = round(s) (stream,
     *   in place); out = norm(s or round(s) per norm_input) * w, rounded per norm_weight.
     *   out may alias delta.
     * rmsnorm: out = norm(x) * w; qk != 0 follows policy->qk_norm, else norm_weight.
     *   out may alias x.
     * Norm: ms = sum_squares(s) / dim; r = 1.0f / sqrtf(ms + eps); ROUND_TWICE:
     *   round(w * round(s * r)); ROUND_ONCE: round(w * (s * r)).
     * swiglu: silu(g) = g / (1 + parity_expf(-g)); PER_OP: round(round(silu) * u); FUSED:
     *   round(silu * u). out may alias g or u.
     * rope: x holds n_heads vectors of hd (contiguous, hd apart); cos/sin hold hd/2 values
     *   for this position (already bf16 values when the table is bf16). For i < hd/2,
     *   a = x[i], b = x[i + hd/2]:
     *   PER_OP: x[i] = round(round(a*c) - round(b*s)); x[i+hd/2] = round(round(b*c) + round(a*s))
     *   FUSED:  x[i] = round(a*c - b*s);  x[i+hd/2] = round(b*c + a*s)   (no fmaf: products
     *           rounded to fp32, then the sum) */
    void (*rmsnorm_residual)(const parity_policy *pol, size_t dim, const float *delta,
                             float *residual, const float *w, float eps, float *out);
    void (*rmsnorm)(const parity_policy *pol, int qk, size_t dim, const float *x,
                    const float *w, float eps, float *out);
    void (*swiglu)(const parity_policy *pol, size_t n, const float *g, const float *u,
                   float *out);
    void (*rope)(const parity_policy *pol, size_t n_heads, size_t hd, float *x,
                 const float *cos, const float *sin);

    /* The same four on 16-bit buffers (the public region API), which hold fp16 patterns
     * under PARITY_COMPUTE_FP16 and bf16 patterns otherwise (buffer_format_of): loads widen
     * exactly, stores round to that format (a no-op on values the policy already rounded).
     * Same arithmetic as above. */
    void (*rmsnorm_residual_16)(const parity_policy *pol, size_t dim, const uint16_t *delta,
                                const uint16_t *residual, const uint16_t *w, float eps,
                                uint16_t *residual_out, uint16_t *out);
    void (*rmsnorm_16)(const parity_policy *pol, int qk, size_t dim, const uint16_t *x,
                       const uint16_t *w, float eps, uint16_t *out);
    void (*swiglu_16)(const parity_policy *pol, size_t n, const uint16_t *g, const uint16_t *u,
                      uint16_t *out);
    void (*rope_16)(const parity_policy *pol, size_t n_heads, size_t hd, uint16_t *x,
                    const float *cos, const float *sin);
} kernels;

/* Packs M rows of x (row stride ldx, K columns) for gemm_bf16w: row m occupies
 * gemm_packed_row(K) floats at xp + m * gemm_packed_row(K); chunk c is 32 floats:
 * [x[32c+0], x[32c+2], ..., x[32c+30]] (the 16 even elements) then
 * [x[32c+1], x[32c+3], ..., x[32c+31]] (the 16 odd ones), zero past K. */
static inline size_t gemm_packed_row(size_t K) { return (K + 31) / 32 * 32; }
void gemm_pack_x(size_t M, size_t K, const float *x, size_t ldx, float *xp);

/* Packs x for gemm_bf16w_tiles, one lane of pair32 after the other, so that a kernel can
 * advance the same lane of many rows with one vector: rows in tiles of GEMM_XT_ROWS (tile t
 * holds rows 16t .. 16t+15 and occupies GEMM_XT_ROWS * gemm_packed_row(K) floats at
 * xt + t * GEMM_XT_ROWS * gemm_packed_row(K)); inside a tile, for lane l (0..15), chunk c and
 * step s (0: the odd element k = 32c + 2l + 1, taken first; 1: the even one, k = 32c + 2l),
 * the 16 rows' x[.][k] are at offset ((l * chunks + c) * 2 + s) * 16, zero (+0) past K and
 * past M. gemm_pack_xt_tiles packs tiles [t0, t1) only (threads split the tiles); it is the
 * specification of every table's pack_xt_tiles. */
#define GEMM_XT_ROWS 16
static inline size_t gemm_xt_tiles(size_t M) { return (M + GEMM_XT_ROWS - 1) / GEMM_XT_ROWS; }
static inline size_t gemm_xt_floats(size_t M, size_t K) {
    return gemm_xt_tiles(M) * GEMM_XT_ROWS * gemm_packed_row(K);
}
void gemm_pack_xt_tiles(size_t M, size_t K, const float *x, size_t ldx, float *xt, size_t t0,
                        size_t t1);
/* One row r (0..15) of tile t, chunk c, into the tile at `tile` (gemm_pack_xt_tiles is this
 * for every row and chunk of its tiles; SIMD packs use it where they leave a row). */
void gemm_pack_xt_row(size_t M, size_t K, const float *x, size_t ldx, float *tile, size_t t,
                      size_t c, size_t r);
/* Scratch for one thread's gemm_bf16w_tiles: room for GEMM_PANEL_ROWS weight rows widened to
 * fp32, gemm_panel_stride(K) floats apart (a packed row and one cache line more, so that the
 * rows do not all fall into the same L1 sets); a table's tiles use as many as they need. */
#define GEMM_PANEL_ROWS 32
static inline size_t gemm_panel_stride(size_t K) { return gemm_packed_row(K) + 16; }
static inline size_t gemm_panel_floats(size_t K) { return GEMM_PANEL_ROWS * gemm_panel_stride(K); }

/* The specification (kernels_ref.c). */
extern const kernels kernels_portable;

/* Every other table starts as a copy of kernels_portable, over which its ISA file sets the
 * entries it has: an entry a SIMD file lacks is the specification's, never NULL (but for
 * pack_x_bf16 and gemm_bf16xw, which only tables with bf16 dot products have). cpu.c builds
 * the tables once, at detection. */
#if defined(PARITY_HAVE_AVX2)
void kernels_avx2_set_entries(kernels *t);  /* kernels_avx2.c, gemm_avx2.c */
#endif
#if defined(PARITY_HAVE_AVX512)
void kernels_avx512_set_entries(kernels *t);  /* kernels_avx512.c, gemm_avx512.c, over avx2 */
#endif
#if defined(PARITY_HAVE_AVX512BF16)
void kernels_avx512bf16_set_entries(kernels *t);  /* kernels_avx512bf16.c, over avx512 */
#endif

/* The amx backend (kernels/gemm_amx.c, built with PARITY_HAVE_AMX): x packed into AMX tiles
 * and the tile GEMM. amx_unavailable() (cpu.c) is NULL once the CPU has AMX-BF16 and the OS
 * granted the tile state, else why not; nothing of gemm_amx.c may run before it says NULL. */
const char *amx_unavailable(void);
#if defined(PARITY_HAVE_AMX)
/* Bytes of x[M][K] packed: M and K rounded up to 16 rows and 32 columns. */
size_t amx_packed_x_bytes(size_t M, size_t K);
/* Packs the 16-row blocks mb0 .. mb1-1 of x; returns how many of their rows hold a value
 * that is not a bf16 value (their packing is not to be used). */
size_t amx_pack_x(size_t M, size_t K, const float *x, size_t ldx, uint16_t *xt, size_t mb0,
                  size_t mb1);
/* Columns n0 .. n1-1 (n0 a multiple of 32) of y[M][N] = x . w^T from the packed x. */
void amx_gemm_columns(size_t M, size_t K, const uint16_t *xt, const uint16_t *w, size_t ldw,
                      float *y, size_t ldy, size_t N, size_t n0, size_t n1);
#endif

/* The table of a CPU path in this build (cpu.c), NULL if the build has none for it. Whether
 * this CPU can run it is parity_set_cpu_path()'s answer. */
const kernels *kernel_table(parity_cpu_path path);

/* Whether this build and CPU can run path (cpu.c's detection, as parity_set_cpu_path asks). */
int cpu_path_supported(parity_cpu_path path);
/* Whether the CPU and OS have AVX512_VNNI beside the avx512 path's AVX-512 F, BW, VL, DQ, and
 * this build compiles for it (PARITY_HAVE_AVX512VNNI): the quantized GEMMs' VNNI variants. */
int cpu_has_avx512_vnni(void);
/* Whether the CPU and OS have AVX512_VBMI beside the avx512 path's AVX-512 F, BW, VL, DQ, and
 * this build compiles for it (PARITY_HAVE_AVX512VBMI): the FP8 GEMM's one-row kernel. */
int cpu_has_avx512_vbmi(void);

/* The table of the current CPU path (cpu.c): detected once, PARITY_CPU_PATH or
 * parity_set_cpu_path() force one. Never NULL. */
const kernels *kern(void);

/* A policy's rounding point on n fp32 values with table k: to bf16 under
 * PARITY_COMPUTE_BF16, to fp16 under PARITY_COMPUTE_FP16, nothing under PARITY_COMPUTE_FP32. */
static inline void round_with(const kernels *k, const parity_policy *pol, float *x, size_t n) {
    if (pol->compute == PARITY_COMPUTE_BF16)
        k->round_bf16(x, n);
    else if (pol->compute == PARITY_COMPUTE_FP16)
        k->round_fp16(x, n);
}

/* round_with the current CPU path's table. */
static inline void round_to_policy(const parity_policy *pol, float *x, size_t n) {
    round_with(kern(), pol, x, n);
}

#endif /* PARITY_KERNELS_H */
