/*
 * libparity's public API, tier "ops": the CPU paths (which SIMD variant of every kernel
 * runs), the region kernels on caller-owned bf16 buffers, and the forward pieces (embedding,
 * linear layer, attention, head) that host learners and engines compose. parity.h includes
 * this header at its end; it includes parity.h for the core (the policy, PARITY_DTYPE_*,
 * parity_score_options), so either may be included first.
 */
#ifndef PARITY_OPS_H
#define PARITY_OPS_H

#include <stddef.h>
#include <stdint.h>

#include "parity.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---------------------------------------------------------------------------------------- */
/* CPU paths                                                                                */
/* ---------------------------------------------------------------------------------------- */

/* Every kernel has a portable C reference, which is its specification, and SIMD variants
 * that must equal it bit for bit. The path is detected once: the best the CPU has, except
 * that avx512bf16 is the default only on AMD CPUs (on Zen 4 vdpbf16ps ran at twice the fp32
 * FMA rate; on Intel Xeons of the 4th and 5th generation at half of it, so there avx512
 * is faster). The environment variable PARITY_CPU_PATH (portable | avx2 | avx512 |
 * avx512bf16) or parity_set_cpu_path() forces one. */
typedef enum parity_cpu_path {
    PARITY_CPU_PORTABLE = 0,
    PARITY_CPU_AVX2 = 1,        /* AVX2 + FMA + F16C */
    PARITY_CPU_AVX512 = 2,      /* AVX-512 F, BW, VL, DQ (and AVX2) */
    PARITY_CPU_AVX512BF16 = 3,  /* AVX512_BF16 (and avx512): the bf16 GEMM on vdpbf16ps */
} parity_cpu_path;

/* The path in use now. */
PARITY_API parity_cpu_path parity_get_cpu_path(void);
/* Name of a path ("portable", "avx2", "avx512", "avx512bf16"). */
PARITY_API const char *parity_cpu_path_name(parity_cpu_path path);
/* The path of a name ("portable", "avx2", "avx512", "avx512bf16"); PARITY_ERR_INVALID_ARGUMENT
 * for another name. */
PARITY_API int parity_cpu_path_from_name(const char *name, parity_cpu_path *out);
/* Force a path. Fails with PARITY_ERR_UNSUPPORTED if this CPU (or OS) lacks it. Process-wide:
 * call it while no other thread is inside the library. Results never depend on it. */
PARITY_API int parity_set_cpu_path(parity_cpu_path path);

/* ---------------------------------------------------------------------------------------- */
/* Region kernels on caller-owned bf16 buffers                                              */
/* ---------------------------------------------------------------------------------------- */
/*
 * For engines that adopt a policy's rounding points without the rest of libparity. Buffers
 * are bf16 bit patterns (uint16_t) — fp16 bit patterns under PARITY_COMPUTE_FP16, whose
 * rounding points round to fp16 — rows contiguous with the given row strides (in
 * elements). They neither allocate nor start threads. Under PARITY_COMPUTE_FP32 the math
 * is fp32 throughout and only the store to the bf16 output rounds.
 */

/* Residual add + RMSNorm over rows of `dim`:
 *   s = residual + delta (fp32);  residual_out = bf16(s)  (the residual stream);
 *   out = RMSNorm(s or bf16(s), per policy->norm_input) * weight, rounded per
 *   policy->norm_weight. residual_out may alias residual; out may alias delta. */
PARITY_API int parity_rmsnorm_residual(const parity_policy *policy, size_t rows, size_t dim,
                                       const uint16_t *delta, size_t delta_stride,
                                       const uint16_t *residual, size_t residual_stride,
                                       const uint16_t *weight, float eps,
                                       uint16_t *residual_out, size_t residual_out_stride,
                                       uint16_t *out, size_t out_stride);

/* RMSNorm without a residual (layer 0's input norm, Qwen3 q/k-norm with
 * `is_qk_norm` != 0, which then follows policy->qk_norm instead of norm_weight).
 * out may alias x. */
PARITY_API int parity_rmsnorm(const parity_policy *policy, int is_qk_norm, size_t rows,
                              size_t dim, const uint16_t *x, size_t x_stride,
                              const uint16_t *weight, float eps, uint16_t *out,
                              size_t out_stride);

/* SwiGLU: out = silu(gate) * up, rounded per policy->swiglu. out may alias gate or up. */
PARITY_API int parity_swiglu(const parity_policy *policy, size_t rows, size_t dim,
                             const uint16_t *gate, size_t gate_stride, const uint16_t *up,
                             size_t up_stride, uint16_t *out, size_t out_stride);

/* RoPE, rotate-half (NeoX) pairing, in place on `rows` tokens x `n_heads` heads x
 * `head_dim`, head vectors contiguous, a token's heads `head_dim` apart, tokens
 * `row_stride` elements apart. positions[rows] are the token positions. The cos/sin tables
 * are computed from `theta` as DESIGN.md describes (default rope; for scaled rope use the
 * model API) and rounded to bf16 or not per policy->rope_table. */
PARITY_API int parity_rope(const parity_policy *policy, size_t rows, size_t n_heads,
                           size_t head_dim, uint16_t *x, size_t row_stride,
                           const int32_t *positions, double theta);

/* A rounding point on fp32 buffers: out[i] = x[i] rounded to nearest even to `dtype`
 * (PARITY_DTYPE_BF16: every NaN -> the quiet NaN of 0x7fc0, as parity_bf16_from_f32;
 * PARITY_DTYPE_F16: beyond fp16's range -> infinity) and widened back to fp32, the kernels'
 * own rounding (the forward's at every rounding point), in one pass. out may be x (in place);
 * otherwise the two must not overlap. */
PARITY_API int parity_round_f32(uint32_t dtype, size_t n, const float *x, float *out);

/* ---------------------------------------------------------------------------------------- */
/* Forward pieces for host learners and engines                                             */
/* ---------------------------------------------------------------------------------------- */
/*
 * The pieces of the forward pass that the region kernels above do not cover, on caller-owned
 * buffers: the embedding gather, the linear layer, causal GQA attention, the head, and a
 * mixture-of-experts layer's router and combine. The model's forward (parity_score, the
 * sampler) runs these same functions, so a host that composes them with the region kernels,
 * rounding at the policy's points, gets the forward's bits exactly (test_ops composes whole
 * Qwen3, Qwen3-MoE and Qwen2-MoE forwards from them and compares them with parity_score bit
 * for bit; python/parity/torch.py's CausalLM is built on them).
 *
 * Activations are fp32 buffers (float); under a bf16 policy the forward holds bf16 values in
 * them, made so at each rounding point (parity_bf16_from_f32 / _to_f32, or the region kernels'
 * bf16 outputs widened; fp16 values and parity_fp16_* under compute "fp16"). Weights are bf16
 * bit patterns (PARITY_DTYPE_BF16) under a policy with compute "bf16", fp16 bit patterns
 * (PARITY_DTYPE_F16, widened exactly into scratch per call) under compute "fp16" and fp32
 * (PARITY_DTYPE_F32, the masters) under compute "fp32"; any other dtype is refused. Rows are
 * `*_stride` elements apart. Outputs must not overlap inputs.
 *
 * Threads: `pool` (parity_pool_create) runs a call on its threads, one call at a time
 * (PARITY_ERR_BUSY for a second thread meanwhile); NULL runs it on the calling thread alone.
 * The bits do not depend on the pool's size. Scratch (packed inputs, a KV cache for attention,
 * logits): a pool keeps its calls' scratch for the next calls (grown as needed, freed with the
 * pool); without a pool a call allocates its own and frees it before returning. A call that
 * fails (PARITY_ERR_OUT_OF_MEMORY included) has written no output.
 */
typedef struct parity_pool parity_pool;

/* A pool of n_threads (1..256) threads, the calling thread included. */
PARITY_API int parity_pool_create(uint32_t n_threads, parity_pool **out);
PARITY_API void parity_pool_free(parity_pool *pool);
/* Its thread count (1 for NULL). */
PARITY_API uint32_t parity_pool_threads(const parity_pool *pool);

/* out[i] = parity_bf16_from_f32(x[i]) for i < n (round to nearest even, every NaN 0x7fc0),
 * in blocks split over `pool` (NULL: the calling thread): a learner's bf16 weights from its
 * fp32 masters. x and out must not overlap. */
PARITY_API int parity_bf16_from_f32_array(parity_pool *pool, size_t n, const float *x,
                                          uint16_t *out);

/* The four region kernels above on fp32 buffers, for a learner that holds its activations in
 * fp32 (16-bit values where the policy rounds): each gives, bit for bit, what its 16-bit
 * call gives on the 16-bit casts of its fp32 inputs (the buffer format: fp16 under
 * PARITY_COMPUTE_FP16, else bf16; round to nearest even, every NaN to the format's one quiet
 * NaN, fp16 overflow to infinity), its outputs widened exactly to fp32. The weight is fp32
 * too (cast once per call). Rows are split over `pool` (NULL: the calling thread); the bits
 * depend neither on the pool nor on the CPU path beyond the 16-bit calls' own. An output may
 * be an input exactly (the same pointer and stride; RoPE in place is out == x) and must
 * otherwise overlap no input and no other output. Scratch: two rows of 16-bit values per
 * thread, the pool's (kept between calls), or the call's own without a pool. */
PARITY_API int parity_rmsnorm_residual_f32(parity_pool *pool, const parity_policy *policy,
                                           size_t rows, size_t dim, const float *delta,
                                           size_t delta_stride, const float *residual,
                                           size_t residual_stride, const float *weight,
                                           float eps, float *residual_out,
                                           size_t residual_out_stride, float *out,
                                           size_t out_stride);
PARITY_API int parity_rmsnorm_f32(parity_pool *pool, const parity_policy *policy,
                                  int is_qk_norm, size_t rows, size_t dim, const float *x,
                                  size_t x_stride, const float *weight, float eps, float *out,
                                  size_t out_stride);
PARITY_API int parity_swiglu_f32(parity_pool *pool, const parity_policy *policy, size_t rows,
                                 size_t dim, const float *gate, size_t gate_stride,
                                 const float *up, size_t up_stride, float *out,
                                 size_t out_stride);
/* RoPE from x into out (rows of n_heads x head_dim, x_stride / out_stride apart; out == x
 * with the same stride rotates in place) at positions[rows], as parity_rope. */
PARITY_API int parity_rope_f32(parity_pool *pool, const parity_policy *policy, size_t rows,
                               size_t n_heads, size_t head_dim, const float *x,
                               size_t x_stride, float *out, size_t out_stride,
                               const int32_t *positions, double theta);

/* out[r][:] = the row tokens[r] of the embedding table [vocab][dim] (rows table_stride apart,
 * dtype PARITY_DTYPE_BF16 or PARITY_DTYPE_F16: widened exactly, or PARITY_DTYPE_F32: copied).
 * PARITY_ERR_TOKEN_RANGE for a token outside [0, vocab). */
PARITY_API int parity_embedding(size_t rows, const int32_t *tokens, size_t vocab, size_t dim,
                                uint32_t dtype, const void *table, size_t table_stride,
                                float *out, size_t out_stride);

/* The linear layer: y[i][j] = sum_t x[i][t] * w[j][t] (+ bias[j]) for i < m, j < n, t < k,
 * in fp32 and unrounded: the caller rounds at the policy's point (the forward rounds every
 * GEMM output once, to bf16). The order of each sum is the backend's (DESIGN.md, "Matmul"):
 * PARITY_BACKEND_BF16 runs pair32 on bf16 weights, dot16 on fp32 weights (compute "fp32")
 * and on fp16 weights widened (compute "fp16");
 * PARITY_BACKEND_OPENBLAS runs one-row cblas_sgemm on fp32 weights (bf16 weights are widened
 * into scratch per call: n * k * 4 bytes). Each y[i][j] depends on row i of x and row j of w
 * alone: not on m, the pool or the CPU path. bias (n fp32 values, or NULL) joins the fp32 sum,
 * as a GEMM epilogue does. Under an fp8 gemm (policy.gemm fp8-block or mxfp8) w is
 * PARITY_DTYPE_F32 (fp32 masters) or PARITY_DTYPE_BF16, quantized per call with the policy's
 * quantizer as the model quantizes its own weights, each row of x quantized as the model's
 * fp8 GEMM does, and the GEMM is the model's (its order and scale products; the backend
 * does not enter): the bits of the model's layer on the same values; bias added after. */
PARITY_API int parity_linear(parity_pool *pool, const parity_policy *policy, uint32_t backend,
                             size_t m, size_t k, size_t n, const float *x, size_t x_stride,
                             uint32_t w_dtype, const void *w, size_t w_stride, const float *bias,
                             float *y, size_t y_stride);

/* The training GEMM on pre-quantized operands (parity_quant.h, "Quantized GEMMs", and the
 * training recipes of python/parity/recipes.py, whose backward GEMMs it runs): y[i][j] for
 * i < m, j < n from a [m][k] and b [n][k], each quantized along k. Both operands of one format:
 *   PARITY_GEMM_MXFP8: element PARITY_FP8_E4M3 or PARITY_FP8_E5M2 per operand (codes one a
 *       byte), E8M0 scale bytes in 1 x 32 blocks along k (parity_mxfp8_quantize_as);
 *   PARITY_GEMM_NVFP4: E2M1 codes one a byte (low nibble, sign 0x8), E4M3 scale codes in
 *       1 x 16 blocks along k, fp32 globals, one per tensor or one per row
 *       (parity_nvfp4_quantize and its 16 x 16 and stochastic forms).
 * Row r's scale of block kb is scales[(r / scale_rows) * scales_stride + kb]: scale_rows 1, or
 * 16 for NVFP4's 16 x 16 weight blocks (one scale row per 16 rows), the last block partial.
 * The arithmetic is the forward's quantized GEMM's: per block, ascending, d = the exact dot
 * of the codes' values rounded once to fp32 (every pair exact: E4M3 x E4M3, E5M2 x E4M3 and
 * E2M1 x E2M1 integer sums fit int64, E5M2 x E5M2 ones are summed in 128 bits), acc = acc +
 * (d * sa) * sb in fp32; NVFP4 then y = RN(acc * RN(ga * gb)). A block with a code that is not
 * finite (E4M3 NaN, E5M2 infinity or NaN) in either operand gives NaN. Threads split the
 * output columns; the bits depend on neither the pool nor the CPU path. (E4M3 x E4M3 and NVFP4
 * with one global on b run on the forward's quantized GEMM kernels, which compute the same.)
 * PARITY_ERR_INVALID_ARGUMENT (naming it) for a NULL pointer, a zero or too large size, a
 * stride below its row, another format or element, formats that differ, scale_rows other
 * than 1 (or 16 under NVFP4), NVFP4 without globals or with per_row_globals not 0 or 1,
 * MXFP8 with globals, or an E2M1 code above 0xf. */
typedef struct parity_quant_operand {
    uint32_t format;          /* PARITY_GEMM_MXFP8 or PARITY_GEMM_NVFP4 */
    uint32_t element;         /* MXFP8: PARITY_FP8_E4M3 or PARITY_FP8_E5M2; NVFP4: 0 */
    const uint8_t *codes;     /* rows of k codes, codes_stride apart */
    size_t codes_stride;
    const uint8_t *scales;    /* E8M0 bytes (MXFP8) or E4M3 codes (NVFP4) */
    size_t scales_stride;     /* bytes between rows of the scale grid, >= the blocks along k */
    uint32_t scale_rows;      /* operand rows per scale row: 1, or 16 (NVFP4 16 x 16) */
    uint32_t per_row_globals; /* NVFP4: 1, globals[row]; 0, globals[0] */
    const float *globals;     /* NVFP4's fp32 global scales; NULL under MXFP8 */
} parity_quant_operand;
PARITY_API int parity_quant_gemm(parity_pool *pool, size_t m, size_t n, size_t k,
                                 const parity_quant_operand *a, const parity_quant_operand *b,
                                 float *y, size_t y_stride);

/* Causal attention of a batch of sequences, each attending to its own positions 0..t, with
 * n_heads query heads sharing n_kv_heads KV heads (query head h reads KV head
 * h / (n_heads / n_kv_heads)), scale head_dim^-0.5, in the policy's attention mode (eager,
 * flash or fp32; fp32 under compute "fp32") with the forward's per-element order (DESIGN.md,
 * "KV cache and attention"). The sequences' rows are concatenated: T = sum of lengths[0 ..
 * n_seqs-1] rows of q [T][n_heads * head_dim] (after q-norm and RoPE), k [T][n_kv_heads *
 * head_dim] (after k-norm and RoPE) and v [T][n_kv_heads * head_dim]; out [T][n_heads *
 * head_dim]. Under compute
 * "bf16", k and v are held as bf16 (round to nearest even, exact for the bf16 values the forward
 * passes), as its KV cache holds them. */
PARITY_API int parity_attention(parity_pool *pool, const parity_policy *policy, size_t n_seqs,
                                const uint32_t *lengths, size_t n_heads, size_t n_kv_heads,
                                size_t head_dim, const float *q, size_t q_stride,
                                const float *k, size_t k_stride, const float *v,
                                size_t v_stride, float *out, size_t out_stride);

/* ---- Backward pieces (a learner's gradients on the library's GEMMs) ----
 *
 * c[i][j] = sum_t a(i, t) * b(j, t) for i < m, j < n, t < k, fp32 and unrounded, where
 * a(i, t) = a[i * a_row_stride + t * a_col_stride] (fp32) and b(j, t) = b[j * b_row_stride +
 * t * b_col_stride] (b_dtype PARITY_DTYPE_BF16: bf16 bit patterns, or PARITY_DTYPE_F32); c's
 * rows c_stride apart. So x W^T is (k_stride, 1, ..., w_stride, 1), and a transposed operand
 * is its strides swapped: a backward's gy^T x is a = gy with strides (1, n_out), b = x with
 * strides (1, n_in), read in place (the library packs what its kernels need into scratch).
 * The order of each sum: a b of bf16 values (PARITY_DTYPE_BF16, or F32 whose every value is a
 * bf16 value) runs parity_linear's bf16-weight GEMM (pair32 on the bf16 backend, under compute
 * "bf16"; where every a is a bf16 value too, as a learner's gradient rounded to bf16, on the
 * CPU's bf16 dot products where it has them, the same bits), any other b its fp32 GEMM (dot16,
 * compute "fp32"); which one depends on all of b,
 * and otherwise c[i][j] depends on row i of a and row j of b alone (not on m, n, the pool or
 * the CPU path). c must not overlap a or b; m, n <= 2^30, k <= 2^24. */
PARITY_API int parity_matmul(parity_pool *pool, size_t m, size_t n, size_t k, const float *a,
                             size_t a_row_stride, size_t a_col_stride, uint32_t b_dtype,
                             const void *b, size_t b_row_stride, size_t b_col_stride, float *c,
                             size_t c_stride);

/* The gradients of causal GQA softmax attention, in fp32, at q, k, v (the layout of
 * parity_attention: the sequences' rows concatenated, query head h reading KV head
 * h / (n_heads / n_kv_heads)) for the output's gradient d_out [T][n_heads * head_dim]:
 * P = softmax(q k^T s) over positions 0..t of the row's sequence (s = head_dim^-0.5, rounded
 * to fp32; the library's exp), dP = d_out v^T, dS = P (dP - rowsum(P dP)) s, and
 * d_q = dS k, d_k = sum over the group's heads of dS^T q, d_v = sum of P^T d_out, each
 * written whole (not accumulated). Whatever attention mode the forward ran, this is the fp32
 * formula's gradient (a learner's straight-through backward). One task per (sequence, KV
 * head) on the pool; within it the group's query heads' rows go together, in blocks of up to
 * 64 positions, through the fp32 GEMM (dot16 products; d_k and d_v summed block after block).
 * The bits do not depend on the pool or on the other sequences. Outputs must not overlap
 * each other or an input. */
PARITY_API int parity_attention_backward(parity_pool *pool, size_t n_seqs,
                                         const uint32_t *lengths, size_t n_heads,
                                         size_t n_kv_heads, size_t head_dim, const float *q,
                                         size_t q_stride, const float *k, size_t k_stride,
                                         const float *v, size_t v_stride, const float *d_out,
                                         size_t d_out_stride, float *d_q, size_t d_q_stride,
                                         float *d_k, size_t d_k_stride, float *d_v,
                                         size_t d_v_stride);

/* RMSNorm's gradient in fp32 (the learner's straight-through backward of the norm regions):
 * for y = x r weight, r = 1 / sqrtf(mean(x x) + eps) per row, the steps of autograd's graph
 * of that formula, in its order of operations: gw = d_out weight, d_x = gw r + (a x + a x)
 * with a = (-0.5 sum(gw x) r^3) / dim, plus d_add[r] (NULL: none; the residual stream's own
 * gradient where s = residual + delta feeds the norm); d_weight[c] (NULL: skipped) = the sum
 * over the rows, in their order, of d_out (x r). Each row's sums run in its order; the bits
 * do not depend on the pool. Outputs must not overlap an input or each other. */
PARITY_API int parity_rmsnorm_backward(parity_pool *pool, size_t rows, size_t dim,
                                       const float *x, size_t x_stride, const float *weight,
                                       float eps, const float *d_out, size_t d_out_stride,
                                       const float *d_add, size_t d_add_stride, float *d_x,
                                       size_t d_x_stride, float *d_weight);

/* parity_rmsnorm_backward at x = residual + delta (the fp32 sum, formed row by row in a
 * worker's scratch: the bits of the call on that sum), for the residual + RMSNorm region
 * whose sum s feeds the norm: d_x is the gradient of s (that of residual and of delta alike).
 * delta, like residual, must not overlap an output. */
PARITY_API int parity_rmsnorm_residual_backward(parity_pool *pool, size_t rows, size_t dim,
                                                const float *residual, size_t residual_stride,
                                                const float *delta, size_t delta_stride,
                                                const float *weight, float eps,
                                                const float *d_out, size_t d_out_stride,
                                                const float *d_add, size_t d_add_stride,
                                                float *d_x, size_t d_x_stride, float *d_weight);

/* SwiGLU's gradient in fp32, y = (gate s) up with s = 1 / (1 + exp(-gate)) (the library's
 * exp): d_up = d_out (gate s), d_gate = gy s + (gy gate) (1 - s) s with gy = d_out up, the
 * steps of autograd's graph of the formula. Elementwise; outputs must not share an element
 * with an input or each other (the two column halves of one [rows, 2 dim] buffer, each
 * through its row stride 2 dim, share none: d_gate and d_up may be those). */
PARITY_API int parity_swiglu_backward(parity_pool *pool, size_t rows, size_t dim,
                                      const float *gate, size_t gate_stride, const float *up,
                                      size_t up_stride, const float *d_out, size_t d_out_stride,
                                      float *d_gate, size_t d_gate_stride, float *d_up,
                                      size_t d_up_stride);

/* RoPE's gradient in fp32 (the learner's straight-through backward of parity_rope and
 * parity_rope_f32): for each row r, head and i < head_dim / 2, with lo = d_out[i] and
 * hi = d_out[i + head_dim / 2] of that head, c = cos[r][i] and s = sin[r][i] (the forward's
 * tables, one row of head_dim / 2 values a row of d_out, table_stride apart, as
 * parity.torch.rope_cos_sin gives them): d_x[i] = lo c + hi s and
 * d_x[i + head_dim / 2] = hi c - lo s, each product rounded to fp32 before the sum (the steps
 * of autograd's graph of the rotation's transpose). Rows are n_heads x head_dim floats,
 * d_out_stride / d_x_stride apart; d_x may be d_out itself (the same pointer and stride) and
 * must not overlap it otherwise, nor the tables. Elementwise: the bits do not depend on the
 * pool. */
PARITY_API int parity_rope_backward(parity_pool *pool, size_t rows, size_t n_heads,
                                    size_t head_dim, const float *d_out, size_t d_out_stride,
                                    const float *cos, const float *sin, size_t table_stride,
                                    float *d_x, size_t d_x_stride);

/* The head, for `rows` positions: s = residual + delta (the last layer's MLP output), the
 * final RMSNorm of s with norm_weight [dim] and eps (the residual + RMSNorm region, per the
 * policy), the lm_head GEMM [vocab][dim] (rows lm_head_stride apart; the logits rounded to bf16
 * unless the policy keeps an fp32 head), then log p(targets[r]) under options' mode
 * (raw, processed, processed-truncated; top_n must be 0) into logprobs[r], as parity_score
 * computes it. Optional (NULL to skip): entropy[r] of the mode's distribution, and logits
 * [rows][vocab] (rows logits_stride apart) as the policy rounds them, before any temperature.
 * norm_weight and lm_head are both of w_dtype. */
PARITY_API int parity_head_logprobs(parity_pool *pool, const parity_policy *policy,
                                    uint32_t backend, const parity_score_options *options,
                                    size_t rows, size_t dim, size_t vocab, const float *residual,
                                    size_t residual_stride, const float *delta,
                                    size_t delta_stride, uint32_t w_dtype,
                                    const void *norm_weight, float eps, const void *lm_head,
                                    size_t lm_head_stride, const int32_t *targets,
                                    float *logprobs, float *entropy, float *logits,
                                    size_t logits_stride);

/* The head's second half: log p(targets[r]) under options' mode (raw, processed,
 * processed-truncated; top_n must be 0) into logprobs[r] from `rows` rows of `vocab` logits
 * (rows logits_stride apart) holding the values as the head holds them after its rounding
 * point (the policy's logits switch: bf16 values, fp16 ones under compute "fp16", or fp32
 * under an fp32 head; the logits parity_head_logprobs returns), exactly as
 * parity_head_logprobs and parity_score compute them from those logits: the same code,
 * the temperature rounded or not per the policy. Optional (NULL to skip): entropy[r] of the
 * mode's distribution. An engine's own logits (e.g. an intermediates dump's) get the
 * log-probs libparity's head would give them. Allocates the log-softmax's work rows (5 floats
 * a vocabulary entry per thread; the logits packed once more unless logits_stride is vocab). */
PARITY_API int parity_logprobs_from_logits(parity_pool *pool, const parity_policy *policy,
                                           const parity_score_options *options, size_t rows,
                                           size_t vocab, const float *logits,
                                           size_t logits_stride, const int32_t *targets,
                                           float *logprobs, float *entropy);

/* Mixture-of-experts routing, as a sparse layer of the forward routes each token (parity.h,
 * "The policy in detail": moe_router, moe_weights): from `rows` rows of n_experts router logits
 * (rows logits_stride apart; the router GEMM's output, rounded where the policy rounds every
 * GEMM output: parity_linear on the bf16 router weight, never quantized, then the rounding
 * point), each row's k experts in slot order (descending probability, ties to the lower
 * index) into ids[r * k + slot] and their weights into weights[r * k + slot] (fp32; bf16
 * values under moe_weights ROUNDED). norm_topk_prob: the config's (nonzero renormalises the k
 * chosen weights). replay: NULL, or rows x k expert ids to take instead of the top-k (each
 * row's distinct and below n_experts, else PARITY_ERR_INVALID_ARGUMENT), whose weights are
 * then computed from these logits under this policy: a routing record's replay. n_experts in
 * 1..4096, k in 1..min(n_experts, 64); a topk-softmax router with norm_topk_prob 0 is
 * PARITY_ERR_POLICY. Allocates 8 bytes an expert of scratch for the call. */
PARITY_API int parity_moe_route(const parity_policy *policy, size_t rows, uint32_t n_experts,
                                uint32_t k, int norm_topk_prob, const float *logits,
                                size_t logits_stride, const uint16_t *replay, uint16_t *ids,
                                float *weights);

/* The mixture-of-experts combine, as a sparse layer of the forward sums its experts (moe_combine
 * of the policy): out[r][h] (h < width, rows width apart) from the k chosen experts' fp32
 * down-projection outputs y[r][slot][h] (unrounded, as parity_linear returns them; contiguous,
 * rows k * width apart), their ids and weights (parity_moe_route's, slot order) and, for a
 * Qwen2-MoE shared expert, its unrounded down-projection output y_shared[r][h] (rows width
 * apart) and its gate's logit shared_gate[r] (the gate GEMM's output, rounded); y_shared and
 * shared_gate both NULL for a model without one. k in 1..64; out must not overlap the inputs.
 * out holds bf16 values (fp16 under compute "fp16"; fp32 under compute "fp32"). */
PARITY_API int parity_moe_combine(const parity_policy *policy, size_t rows, size_t width,
                                  uint32_t k, const uint16_t *ids, const float *weights,
                                  const float *y, const float *y_shared,
                                  const float *shared_gate, float *out);

#ifdef __cplusplus
}
#endif

#endif /* PARITY_OPS_H */
