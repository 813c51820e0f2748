/* The backward pieces (parity_matmul, parity_attention_backward, parity_rmsnorm_backward,
 * parity_swiglu_backward) and the rounding point parity_round_f32: parity_matmul gives
 * parity_linear's bits (the bf16-weight GEMM for b of bf16 values, given as bf16 or as fp32;
 * the fp32 GEMM for other b) for operands read through any strides (transposed, padded rows,
 * a broadcast column), and is near a double-precision product; with a of bf16 values too
 * (the learner's bf16 gradients) it is pair32 written out here, bit for bit; parity_attention_backward is
 * near the double-precision softmax-attention gradients, a sequence's gradients the same bits
 * alone or in a batch, with padded rows or not, on one thread or a pool of two; both give the
 * same bits on every CPU path; the norm's and SwiGLU's gradients are near their double
 * formulas, the same bits with a pool, padded rows and on every CPU path; parity_round_f32 is
 * parity_bf16_from_f32 / parity_fp16_from_f32 widened, in place or not, on every CPU path;
 * bad arguments get a status and a message, with no output written. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"

static uint64_t rng_state = 0x9e3779b97f4a7c15ull;

/* A uniform value in [-1, 1) (xorshift64). */
static float uniform(void) {
    uint64_t x = rng_state;
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    rng_state = x;
    return (float)((double)(x >> 11) / 4503599627370496.0 - 1.0);
}

static float *random_floats(size_t n) {
    float *x = malloc(n * sizeof *x);
    for (size_t i = 0; i < n; i++) x[i] = uniform();
    return x;
}

static float bf16_value(float x) { return parity_bf16_to_f32(parity_bf16_from_f32(x)); }

/* The CPU paths this machine runs, portable first. */
static size_t cpu_paths(parity_cpu_path *out) { return runnable_cpu_paths(out); }

/* ---- parity_matmul ---------------------------------------------------------------------- */

enum { MM_M = 37, MM_N = 45, MM_K = 70, MM_BIG_M = 300 };

/* max |c - ref| / max |ref| against the double-precision a b^T (a, b row-major). */
static double matmul_error(size_t m, size_t n, size_t k, const float *a, const float *b,
                           const float *c) {
    double worst = 0, scale = 0;
    for (size_t i = 0; i < m; i++)
        for (size_t j = 0; j < n; j++) {
            double s = 0;
            for (size_t t = 0; t < k; t++) s += (double)a[i * k + t] * b[j * k + t];
            worst = fmax(worst, fabs(c[i * n + j] - s));
            scale = fmax(scale, fabs(s));
        }
    return worst / scale;
}

/* A way of passing parity_matmul its operands: (a, its strides), (b, its dtype and strides),
 * the bits expected. */
typedef struct matmul_way {
    const float *a;
    size_t ars, acs;
    uint32_t dtype;
    const void *b;
    size_t brs, bcs;
    const float *want;
    const char *what;
} matmul_way;

/* Each way's output against its expected bits (c: m x n scratch). */
static void check_ways(parity_pool *pool, size_t m, size_t n, size_t k, const matmul_way *ways,
                       size_t count, float *c) {
    for (size_t w = 0; w < count; w++) {
        memset(c, 0xab, m * n * 4);
        CHECK_OK(parity_matmul(pool, m, n, k, ways[w].a, ways[w].ars, ways[w].acs, ways[w].dtype,
                               ways[w].b, ways[w].brs, ways[w].bcs, c, n));
        CHECK_BITS_F32(c, ways[w].want, m * n, ways[w].what);
    }
}

/* One GEMM shape: every way of passing the operands against parity_linear's bits. */
static void matmul_case(parity_pool *pool, size_t m, size_t n, size_t k) {
    parity_policy aligned, fp32;
    CHECK_OK(parity_policy_from_name("aligned", &aligned));
    CHECK_OK(parity_policy_from_name("fp32", &fp32));
    float *a = random_floats(m * k), *bf = random_floats(n * k), *bv = malloc(n * k * 4);
    uint16_t *b16 = malloc(n * k * 2), *b16t = malloc(n * k * 2);
    float *at = malloc(m * k * 4), *bvt = malloc(n * k * 4), *bft = malloc(n * k * 4);
    float *ref16 = malloc(m * n * 4), *ref32 = malloc(m * n * 4), *c = malloc(m * n * 4);
    const size_t pad = k + 3;
    float *apad = calloc(m * pad, 4);
    for (size_t i = 0; i < n * k; i++) {
        b16[i] = parity_bf16_from_f32(bf[i]);
        bv[i] = parity_bf16_to_f32(b16[i]);
    }
    for (size_t i = 0; i < m; i++)
        for (size_t t = 0; t < k; t++) {
            at[t * m + i] = a[i * k + t];
            apad[i * pad + t] = a[i * k + t];
        }
    for (size_t j = 0; j < n; j++)
        for (size_t t = 0; t < k; t++) {
            b16t[t * n + j] = b16[j * k + t];
            bvt[t * n + j] = bv[j * k + t];
            bft[t * n + j] = bf[j * k + t];
        }
    CHECK_OK(parity_linear(NULL, &aligned, PARITY_BACKEND_BF16, m, k, n, a, k, PARITY_DTYPE_BF16,
                           b16, k, NULL, ref16, n));
    CHECK_OK(parity_linear(NULL, &fp32, PARITY_BACKEND_BF16, m, k, n, a, k, PARITY_DTYPE_F32, bf,
                           k, NULL, ref32, n));
    CHECK(matmul_error(m, n, k, a, bv, ref16) < 1e-5);
    CHECK(matmul_error(m, n, k, a, bf, ref32) < 1e-5);
    const matmul_way ways[] = {
        {a, k, 1, PARITY_DTYPE_BF16, b16, k, 1, ref16, "bf16 b, rows"},
        {at, 1, m, PARITY_DTYPE_BF16, b16, k, 1, ref16, "a transposed"},
        {a, k, 1, PARITY_DTYPE_BF16, b16t, 1, n, ref16, "bf16 b transposed"},
        {at, 1, m, PARITY_DTYPE_BF16, b16t, 1, n, ref16, "both transposed"},
        {apad, pad, 1, PARITY_DTYPE_BF16, b16, k, 1, ref16, "a's rows padded"},
        {a, k, 1, PARITY_DTYPE_F32, bv, k, 1, ref16, "fp32 b of bf16 values"},
        {at, 1, m, PARITY_DTYPE_F32, bvt, 1, n, ref16, "fp32 b of bf16 values, transposed"},
        {a, k, 1, PARITY_DTYPE_F32, bf, k, 1, ref32, "fp32 b"},
        {at, 1, m, PARITY_DTYPE_F32, bft, 1, n, ref32, "fp32 b, both transposed"},
    };
    check_ways(pool, m, n, k, ways, sizeof ways / sizeof ways[0], c);
    /* a broadcast column (column stride 0): a(i, t) = a[i][0] */
    for (size_t i = 0; i < m; i++)
        for (size_t t = 0; t < k; t++) at[i * k + t] = a[i * k];
    CHECK_OK(parity_linear(NULL, &aligned, PARITY_BACKEND_BF16, m, k, n, at, k,
                           PARITY_DTYPE_BF16, b16, k, NULL, ref16, n));
    CHECK_OK(parity_matmul(pool, m, n, k, a, k, 0, PARITY_DTYPE_BF16, b16, k, 1, c, n));
    CHECK_BITS_F32(c, ref16, m * n, "a column broadcast");
    free(a), free(bf), free(bv), free(b16), free(b16t), free(at), free(bvt), free(bft);
    free(ref16), free(ref32), free(c), free(apad);
}

/* pair32 (kernels.h) of a and b, rows of k values, written out: 16 lanes from +0, lane l
 * taking the pair (32c + 2l, 32c + 2l + 1) of chunk c as fmaf(a0, b0, fmaf(a1, b1, acc)) (an
 * element past k skipped), then the dot16 fold. Denormals, which pair32 flushes, do not arise
 * from the operands used here (bf16 values of magnitude 2^-40 or more, products and sums far
 * from 2^-126). */
static float pair32_ref(const float *a, const float *b, size_t k) {
    float lane[16] = {0};
    for (size_t c = 0; c < k; c += 32)
        for (size_t l = 0; l < 16; l++) {
            const size_t k0 = c + 2 * l, k1 = k0 + 1;
            float acc = lane[l];
            if (k1 < k) acc = fmaf(a[k1], b[k1], acc);
            if (k0 < k) acc = fmaf(a[k0], b[k0], acc);
            lane[l] = acc;
        }
    for (size_t half = 8; half; half /= 2)
        for (size_t l = 0; l < half; l++) lane[l] += lane[l + half];
    return lane[0];
}

/* bf16(x), kept away from the denormals pair32 flushes (|x| >= 2^-40, else 2^-40 of its sign). */
static float bf16_normal(float x) {
    const float floor = 0x1p-40f;
    return bf16_value(fabsf(x) >= floor ? x : copysignf(floor, x));
}

/* The learner's bf16-gradient GEMMs (CausalLM(gradients="bf16")): a of bf16 values (the
 * gradient rounded) against bf16 b, a read as rows (gy W) or transposed (gy^T x), b as bf16
 * or fp32 of bf16 values, in rows or transposed: every way gives pair32_ref's bits. */
static void matmul_bf16_case(parity_pool *pool, size_t m, size_t n, size_t k) {
    float *a = random_floats(m * k), *b = random_floats(n * k), *at = malloc(m * k * 4);
    float *bt = malloc(n * k * 4), *want = malloc(m * n * 4), *c = malloc(m * n * 4);
    uint16_t *b16 = malloc(n * k * 2), *b16t = malloc(n * k * 2);
    for (size_t i = 0; i < m * k; i++) a[i] = bf16_normal(a[i]);
    for (size_t i = 0; i < n * k; i++) {
        b[i] = bf16_normal(b[i]);
        b16[i] = parity_bf16_from_f32(b[i]);
    }
    for (size_t t = 0; t < k; t++) {
        for (size_t i = 0; i < m; i++) at[t * m + i] = a[i * k + t];
        for (size_t j = 0; j < n; j++) {
            bt[t * n + j] = b[j * k + t];
            b16t[t * n + j] = b16[j * k + t];
        }
    }
    for (size_t i = 0; i < m; i++)
        for (size_t j = 0; j < n; j++) want[i * n + j] = pair32_ref(a + i * k, b + j * k, k);
    const matmul_way ways[] = {
        {a, k, 1, PARITY_DTYPE_BF16, b16, k, 1, want, "bf16 a, rows"},
        {at, 1, m, PARITY_DTYPE_BF16, b16, k, 1, want, "bf16 a transposed"},
        {a, k, 1, PARITY_DTYPE_BF16, b16t, 1, n, want, "bf16 a, bf16 b transposed"},
        {at, 1, m, PARITY_DTYPE_F32, bt, 1, n, want,
         "bf16 a, fp32 b of bf16 values, both transposed"},
    };
    check_ways(pool, m, n, k, ways, sizeof ways / sizeof ways[0], c);
    free(a), free(b), free(at), free(bt), free(want), free(c), free(b16), free(b16t);
}

static void test_matmul(parity_pool *pool2) {
    parity_cpu_path paths[4];
    const size_t n_paths = cpu_paths(paths);
    const parity_cpu_path saved = parity_get_cpu_path();
    for (size_t p = 0; p < n_paths; p++) {
        CHECK_OK(parity_set_cpu_path(paths[p]));
        matmul_case(NULL, MM_M, MM_N, MM_K);
        matmul_case(pool2, MM_M, MM_N, MM_K);
        matmul_case(pool2, MM_BIG_M, MM_N, MM_K);  /* the large-M GEMM */
        matmul_case(NULL, 1, 3, 1);
        matmul_bf16_case(NULL, MM_M, MM_N, MM_K);
        matmul_bf16_case(pool2, MM_BIG_M, MM_N, MM_K + 1);  /* an odd k, a padded pair */
        matmul_bf16_case(pool2, MM_N, MM_M, 3 * MM_K);
        matmul_bf16_case(NULL, 1, 3, 1);
    }
    parity_set_cpu_path(saved);
}

/* ---- parity_attention_backward ------------------------------------------------------------ */

/* The gradients in double precision, rows contiguous: P = softmax(q k^T / sqrt(hd)) causal
 * per sequence, dP = g v^T, dS = P (dP - rowsum(P dP)) / sqrt(hd), dq = dS k, dk = dS^T q,
 * dv = P^T g. */
static void attention_grad_ref(size_t n_seqs, const uint32_t *lengths, size_t nh, size_t nkv,
                               size_t hd, const float *q, const float *k, const float *v,
                               const float *g, double *dq, double *dk, double *dv) {
    const size_t group = nh / nkv, qw = nh * hd, kvw = nkv * hd;
    size_t total = 0;
    for (size_t s = 0; s < n_seqs; s++) total += lengths[s];
    memset(dq, 0, total * qw * sizeof *dq);
    memset(dk, 0, total * kvw * sizeof *dk);
    memset(dv, 0, total * kvw * sizeof *dv);
    const double scale = 1.0 / sqrt((double)hd);
    double *p = malloc(total * sizeof *p), *dp = malloc(total * sizeof *dp);
    size_t at = 0;
    for (size_t s = 0; s < n_seqs; s++) {
        const size_t n = lengths[s];
        for (size_t h = 0; h < nh; h++) {
            const size_t j = h / group;
            for (size_t r = 0; r < n; r++) {
                const float *qr = q + (at + r) * qw + h * hd, *gr = g + (at + r) * qw + h * hd;
                double mx = -INFINITY, sum = 0, dot = 0;
                for (size_t c = 0; c <= r; c++) {
                    double sc = 0, d = 0;
                    for (size_t e = 0; e < hd; e++) {
                        sc += (double)qr[e] * k[(at + c) * kvw + j * hd + e];
                        d += (double)gr[e] * v[(at + c) * kvw + j * hd + e];
                    }
                    p[c] = sc * scale;
                    dp[c] = d;
                    mx = fmax(mx, p[c]);
                }
                for (size_t c = 0; c <= r; c++) sum += p[c] = exp(p[c] - mx);
                for (size_t c = 0; c <= r; c++) dot += (p[c] /= sum) * dp[c];
                for (size_t c = 0; c <= r; c++) {
                    const double ds = p[c] * (dp[c] - dot) * scale;
                    for (size_t e = 0; e < hd; e++) {
                        dq[(at + r) * qw + h * hd + e] += ds * k[(at + c) * kvw + j * hd + e];
                        dk[(at + c) * kvw + j * hd + e] += ds * qr[e];
                        dv[(at + c) * kvw + j * hd + e] += p[c] * gr[e];
                    }
                }
            }
        }
        at += n;
    }
    free(p), free(dp);
}

/* ||x - ref|| / ||ref|| */
static double rel_error(const float *x, const double *ref, size_t n) {
    double e = 0, r = 0;
    for (size_t i = 0; i < n; i++) {
        e += (x[i] - ref[i]) * (x[i] - ref[i]);
        r += ref[i] * ref[i];
    }
    return sqrt(e / r);
}

typedef struct attn_case {
    size_t n_seqs, nh, nkv, hd;
    uint32_t lengths[4];
} attn_case;

/* The case's gradients into dq, dk, dv (rows contiguous), with rows padded by `pad` elements
 * on both sides of the call when pad > 0. */
static void attention_grads(parity_pool *pool, const attn_case *a, const float *q,
                            const float *k, const float *v, const float *g, size_t pad,
                            float *dq, float *dk, float *dv) {
    const size_t qw = a->nh * a->hd, kvw = a->nkv * a->hd;
    size_t T = 0;
    for (size_t s = 0; s < a->n_seqs; s++) T += a->lengths[s];
    if (!pad) {
        CHECK_OK(parity_attention_backward(pool, a->n_seqs, a->lengths, a->nh, a->nkv, a->hd, q,
                                           qw, k, kvw, v, kvw, g, qw, dq, qw, dk, kvw, dv, kvw));
        return;
    }
    const size_t qs = qw + pad, ks = kvw + pad;
    float *buf[7];
    const float *src[4] = {q, k, v, g};
    const size_t width[7] = {qw, kvw, kvw, qw, qw, kvw, kvw};
    for (size_t i = 0; i < 7; i++) {
        buf[i] = malloc(T * (width[i] + pad) * 4);
        memset(buf[i], 0x5a, T * (width[i] + pad) * 4);
        if (i < 4)
            for (size_t r = 0; r < T; r++)
                memcpy(buf[i] + r * (width[i] + pad), src[i] + r * width[i], width[i] * 4);
    }
    CHECK_OK(parity_attention_backward(pool, a->n_seqs, a->lengths, a->nh, a->nkv, a->hd, buf[0],
                                       qs, buf[1], ks, buf[2], ks, buf[3], qs, buf[4], qs, buf[5],
                                       ks, buf[6], ks));
    float *out[3] = {dq, dk, dv};
    for (size_t i = 4; i < 7; i++)
        for (size_t r = 0; r < T; r++) {
            memcpy(out[i - 4] + r * width[i], buf[i] + r * (width[i] + pad), width[i] * 4);
            uint32_t bits;
            memcpy(&bits, buf[i] + r * (width[i] + pad) + width[i], 4);
            CHECK_INT(bits, 0x5a5a5a5au);  /* the padding untouched */
        }
    for (size_t i = 0; i < 7; i++) free(buf[i]);
}

static void attention_case(parity_pool *pool2, const attn_case *a) {
    const size_t qw = a->nh * a->hd, kvw = a->nkv * a->hd;
    size_t T = 0;
    for (size_t s = 0; s < a->n_seqs; s++) T += a->lengths[s];
    float *q = random_floats(T * qw), *k = random_floats(T * kvw), *v = random_floats(T * kvw);
    float *g = random_floats(T * qw);
    for (size_t i = 0; i < T * qw; i++) q[i] = bf16_value(q[i] * 2);
    for (size_t i = 0; i < T * kvw; i++) k[i] = bf16_value(k[i] * 2), v[i] = bf16_value(v[i]);
    double *rq = malloc(T * qw * 8), *rk = malloc(T * kvw * 8), *rv = malloc(T * kvw * 8);
    attention_grad_ref(a->n_seqs, a->lengths, a->nh, a->nkv, a->hd, q, k, v, g, rq, rk, rv);
    float *dq[2], *dk[2], *dv[2];
    for (int i = 0; i < 2; i++)
        dq[i] = malloc(T * qw * 4), dk[i] = malloc(T * kvw * 4), dv[i] = malloc(T * kvw * 4);
    parity_cpu_path paths[4];
    const size_t n_paths = cpu_paths(paths);
    const parity_cpu_path saved = parity_get_cpu_path();
    for (size_t p = 0; p < n_paths; p++) {
        CHECK_OK(parity_set_cpu_path(paths[p]));
        float **o = dq + (p > 0), **ok = dk + (p > 0), **ov = dv + (p > 0);
        attention_grads(NULL, a, q, k, v, g, 0, *o, *ok, *ov);
        CHECK(rel_error(*o, rq, T * qw) < 1e-5);
        CHECK(rel_error(*ok, rk, T * kvw) < 1e-5);
        CHECK(rel_error(*ov, rv, T * kvw) < 1e-5);
        if (p) {  /* the bits of the portable path */
            CHECK_BITS_F32(dq[1], dq[0], T * qw, "dq, CPU path");
            CHECK_BITS_F32(dk[1], dk[0], T * kvw, "dk, CPU path");
            CHECK_BITS_F32(dv[1], dv[0], T * kvw, "dv, CPU path");
        }
        /* a pool of two, and padded rows: the same bits */
        attention_grads(pool2, a, q, k, v, g, 7, dq[1], dk[1], dv[1]);
        CHECK_BITS_F32(dq[1], dq[0], T * qw, "dq, pool and padded rows");
        CHECK_BITS_F32(dk[1], dk[0], T * kvw, "dk, pool and padded rows");
        CHECK_BITS_F32(dv[1], dv[0], T * kvw, "dv, pool and padded rows");
        /* each sequence alone: the same bits as in the batch */
        size_t at = 0;
        for (size_t s = 0; s < a->n_seqs; s++) {
            attn_case one = {1, a->nh, a->nkv, a->hd, {a->lengths[s]}};
            attention_grads(pool2, &one, q + at * qw, k + at * kvw, v + at * kvw, g + at * qw, 0,
                            dq[1], dk[1], dv[1]);
            CHECK_BITS_F32(dq[1], dq[0] + at * qw, a->lengths[s] * qw, "dq, sequence alone");
            CHECK_BITS_F32(dk[1], dk[0] + at * kvw, a->lengths[s] * kvw, "dk, sequence alone");
            CHECK_BITS_F32(dv[1], dv[0] + at * kvw, a->lengths[s] * kvw, "dv, sequence alone");
            at += a->lengths[s];
        }
    }
    parity_set_cpu_path(saved);
    for (int i = 0; i < 2; i++) free(dq[i]), free(dk[i]), free(dv[i]);
    free(q), free(k), free(v), free(g), free(rq), free(rk), free(rv);
}

static void test_attention_backward(parity_pool *pool2) {
    /* sequences across the 64-position blocks, one of length 1; GQA groups of 2 and 3, MHA */
    const attn_case cases[] = {{4, 4, 2, 64, {37, 5, 150, 1}},
                               {2, 3, 1, 24, {65, 64}},
                               {1, 2, 2, 17, {9}}};
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) attention_case(pool2, &cases[i]);
}

static int untouched(const float *y, size_t n);

/* ---- the rounding point ------------------------------------------------------------------ */

static void test_round(void) {
    enum { N = 1000 };
    float x[N], out[N], in_place[N];
    for (size_t i = 0; i < N; i++) x[i] = uniform() * powf(2.0f, (float)(i % 60) - 30.0f);
    const uint32_t specials[] = {0x7f800000u, 0xff800000u, 0x7fc00001u, 0xffc00000u, 0x00000001u,
                                 0x80000003u, 0x3f808000u, 0x3f818000u, 0x477fe000u, 0x47800000u,
                                 0x387fc000u, 0x33000000u, 0x7f7fffffu};
    for (size_t i = 0; i < sizeof specials / sizeof specials[0]; i++)
        memcpy(x + i, specials + i, 4);
    x[20] = 65520.0f, x[21] = -65519.0f, x[22] = 1e-7f;
    parity_cpu_path paths[4];
    const size_t n_paths = cpu_paths(paths);
    const parity_cpu_path saved = parity_get_cpu_path();
    for (size_t p = 0; p < n_paths; p++) {
        CHECK_OK(parity_set_cpu_path(paths[p]));
        for (uint32_t dtype = PARITY_DTYPE_BF16; dtype <= PARITY_DTYPE_F16; dtype++) {
            float want[N];
            for (size_t i = 0; i < N; i++)
                want[i] = dtype == PARITY_DTYPE_BF16
                              ? parity_bf16_to_f32(parity_bf16_from_f32(x[i]))
                              : parity_fp16_to_f32(parity_fp16_from_f32(x[i]));
            CHECK_OK(parity_round_f32(dtype, N, x, out));
            CHECK_BITS_F32(out, want, N, dtype ? "fp16 rounding" : "bf16 rounding");
            memcpy(in_place, x, sizeof x);
            CHECK_OK(parity_round_f32(dtype, N, in_place, in_place));
            CHECK_BITS_F32(in_place, want, N, "in place");
        }
    }
    parity_set_cpu_path(saved);
    CHECK_OK(parity_round_f32(PARITY_DTYPE_BF16, 0, x, out));
    memset(out, 0xab, sizeof out);
    CHECK_STATUS(parity_round_f32(PARITY_DTYPE_F32, N, x, out), PARITY_ERR_INVALID_ARGUMENT);
    CHECK_STATUS(parity_round_f32(PARITY_DTYPE_BF16, N, NULL, out), PARITY_ERR_INVALID_ARGUMENT);
    CHECK_STATUS(parity_round_f32(PARITY_DTYPE_BF16, N, x, NULL), PARITY_ERR_INVALID_ARGUMENT);
    CHECK_STATUS(parity_round_f32(PARITY_DTYPE_BF16, N - 1, x, x + 1),
                 PARITY_ERR_INVALID_ARGUMENT);
    CHECK(strstr(parity_last_error(), "overlaps") != NULL);
    CHECK_STATUS(parity_round_f32(PARITY_DTYPE_BF16, SIZE_MAX / 2, x, out),
                 PARITY_ERR_INVALID_ARGUMENT);
    CHECK(untouched(out, N));
}

/* ---- the norm's and SwiGLU's gradients ------------------------------------------------------ */

enum { RG_ROWS = 37, RG_DIM = 70, RG_PAD = 5 };

/* The case's outputs with rows `stride` >= RG_DIM apart (inputs copied into such rows). */
static void region_grads(parity_pool *pool, size_t stride, const float *x, const float *w,
                         const float *g, const float *add, float *dx, float *dw, float *dg,
                         float *du) {
    const size_t n = RG_ROWS * stride;
    float *xs = calloc(n, 4), *gs = calloc(n, 4), *as = calloc(n, 4), *ws = calloc(n, 4);
    float *o1 = malloc(n * 4), *o2 = malloc(n * 4);
    memset(o1, 0x5a, n * 4), memset(o2, 0x5a, n * 4);
    for (size_t r = 0; r < RG_ROWS; r++) {
        memcpy(xs + r * stride, x + r * RG_DIM, RG_DIM * 4);
        memcpy(gs + r * stride, g + r * RG_DIM, RG_DIM * 4);
        memcpy(as + r * stride, add + r * RG_DIM, RG_DIM * 4);
        memcpy(ws + r * stride, w + r * RG_DIM, RG_DIM * 4);  /* SwiGLU's up */
    }
    CHECK_OK(parity_rmsnorm_backward(pool, RG_ROWS, RG_DIM, xs, stride, w, 1e-6f, gs, stride, as,
                                     stride, o1, stride, dw));
    for (size_t r = 0; r < RG_ROWS; r++) memcpy(dx + r * RG_DIM, o1 + r * stride, RG_DIM * 4);
    CHECK_OK(parity_swiglu_backward(pool, RG_ROWS, RG_DIM, xs, stride, ws, stride, gs, stride,
                                    o1, stride, o2, stride));
    for (size_t r = 0; r < RG_ROWS; r++) {
        memcpy(dg + r * RG_DIM, o1 + r * stride, RG_DIM * 4);
        memcpy(du + r * RG_DIM, o2 + r * stride, RG_DIM * 4);
        for (size_t c = RG_DIM; c < stride; c++) {
            uint32_t bits;
            memcpy(&bits, o2 + r * stride + c, 4);
            CHECK_INT(bits, 0x5a5a5a5au);  /* past the row: untouched */
        }
    }
    free(xs), free(gs), free(as), free(ws), free(o1), free(o2);
}

static void test_region_grads(parity_pool *pool2) {
    const size_t n = RG_ROWS * RG_DIM;
    float *x = random_floats(n), *w = random_floats(n), *g = random_floats(n);
    float *add = random_floats(n);
    for (size_t i = 0; i < n; i++) x[i] *= 3.0f;
    /* the double formulas */
    double *rx = malloc(n * 8), rw[RG_DIM] = {0}, *rg = malloc(n * 8), *ru = malloc(n * 8);
    for (size_t r = 0; r < RG_ROWS; r++) {
        const float *xr = x + r * RG_DIM, *gr = g + r * RG_DIM;
        double ss = 0, t = 0;
        for (size_t c = 0; c < RG_DIM; c++) ss += (double)xr[c] * xr[c];
        const double inv = 1.0 / sqrt(ss / RG_DIM + (double)1e-6f);
        for (size_t c = 0; c < RG_DIM; c++) t += (double)gr[c] * w[c] * xr[c];
        for (size_t c = 0; c < RG_DIM; c++) {
            rx[r * RG_DIM + c] = gr[c] * (double)w[c] * inv -
                                 xr[c] * inv * inv * inv * t / RG_DIM + add[r * RG_DIM + c];
            rw[c] += (double)gr[c] * xr[c] * inv;
            const double s = 1.0 / (1.0 + exp(-(double)xr[c])), u = w[r * RG_DIM + c];
            ru[r * RG_DIM + c] = gr[c] * xr[c] * s;
            rg[r * RG_DIM + c] = gr[c] * u * s * (1.0 + xr[c] * (1.0 - s));
        }
    }
    float *dx[2], dw[2][RG_DIM], *dg[2], *du[2];
    for (int i = 0; i < 2; i++) dx[i] = malloc(n * 4), dg[i] = malloc(n * 4), du[i] = malloc(n * 4);
    parity_cpu_path paths[4];
    const size_t n_paths = cpu_paths(paths);
    const parity_cpu_path saved = parity_get_cpu_path();
    for (size_t p = 0; p < n_paths; p++) {
        CHECK_OK(parity_set_cpu_path(paths[p]));
        const int o = p > 0;
        region_grads(NULL, RG_DIM, x, w, g, add, dx[o], dw[o], dg[o], du[o]);
        CHECK(rel_error(dx[o], rx, n) < 1e-5);
        CHECK(rel_error(dw[o], rw, RG_DIM) < 1e-5);
        CHECK(rel_error(dg[o], rg, n) < 1e-5);
        CHECK(rel_error(du[o], ru, n) < 1e-5);
        if (o) {
            CHECK_BITS_F32(dx[1], dx[0], n, "norm d_x, CPU path");
            CHECK_BITS_F32(dw[1], dw[0], RG_DIM, "norm d_weight, CPU path");
            CHECK_BITS_F32(dg[1], dg[0], n, "swiglu d_gate, CPU path");
            CHECK_BITS_F32(du[1], du[0], n, "swiglu d_up, CPU path");
        }
        region_grads(pool2, RG_DIM + RG_PAD, x, w, g, add, dx[1], dw[1], dg[1], du[1]);
        CHECK_BITS_F32(dx[1], dx[0], n, "norm d_x, pool and padded rows");
        CHECK_BITS_F32(dw[1], dw[0], RG_DIM, "norm d_weight, pool and padded rows");
        CHECK_BITS_F32(dg[1], dg[0], n, "swiglu d_gate, pool and padded rows");
        CHECK_BITS_F32(du[1], du[0], n, "swiglu d_up, pool and padded rows");
    }
    parity_set_cpu_path(saved);
    /* without d_add: d_add's values less; without d_weight: d_x the same */
    CHECK_OK(parity_rmsnorm_backward(pool2, RG_ROWS, RG_DIM, x, RG_DIM, w, 1e-6f, g, RG_DIM, NULL,
                                     0, dx[1], RG_DIM, NULL));
    for (size_t i = 0; i < n; i++) rx[i] -= add[i];
    CHECK(rel_error(dx[1], rx, n) < 1e-5);
    free(x), free(w), free(g), free(add), free(rx), free(rg), free(ru);
    for (int i = 0; i < 2; i++) free(dx[i]), free(dg[i]), free(du[i]);
}

/* ---- bad arguments ------------------------------------------------------------------------ */

static int untouched(const float *y, size_t n) {
    for (size_t i = 0; i < n; i++) {
        uint32_t bits;
        memcpy(&bits, y + i, 4);
        if (bits != 0xababababu) return 0;
    }
    return 1;
}

static void test_bad_arguments(void) {
    const int E = PARITY_ERR_INVALID_ARGUMENT;
    float a[64], c[64];
    uint16_t b[64] = {0};
    for (size_t i = 0; i < 64; i++) a[i] = (float)i;
    memset(c, 0xab, sizeof c);
    CHECK_STATUS(parity_matmul(NULL, 0, 2, 2, a, 2, 1, PARITY_DTYPE_BF16, b, 2, 1, c, 2), E);
    CHECK_STATUS(parity_matmul(NULL, 2, 0, 2, a, 2, 1, PARITY_DTYPE_BF16, b, 2, 1, c, 2), E);
    CHECK_STATUS(parity_matmul(NULL, 2, 2, 0, a, 2, 1, PARITY_DTYPE_BF16, b, 2, 1, c, 2), E);
    CHECK_STATUS(parity_matmul(NULL, 2, 2, 2, NULL, 2, 1, PARITY_DTYPE_BF16, b, 2, 1, c, 2), E);
    CHECK_STATUS(parity_matmul(NULL, 2, 2, 2, a, 2, 1, PARITY_DTYPE_BF16, NULL, 2, 1, c, 2), E);
    CHECK_STATUS(parity_matmul(NULL, 2, 2, 2, a, 2, 1, PARITY_DTYPE_BF16, b, 2, 1, NULL, 2), E);
    CHECK_STATUS(parity_matmul(NULL, 2, 2, 2, a, 2, 1, PARITY_DTYPE_F16, b, 2, 1, c, 2), E);
    CHECK(strstr(parity_last_error(), "dtype") != NULL);
    CHECK_STATUS(parity_matmul(NULL, 2, 3, 2, a, 2, 1, PARITY_DTYPE_BF16, b, 2, 1, c, 2), E);
    CHECK_STATUS(parity_matmul(NULL, 2, 2, 2, a, SIZE_MAX / 2, 1, PARITY_DTYPE_BF16, b, 2, 1, c,
                               2), E);
    CHECK(strstr(parity_last_error(), "address space") != NULL);
    CHECK_STATUS(parity_matmul(NULL, 2, 2, 2, a, 2, SIZE_MAX / 3, PARITY_DTYPE_F32, a + 8, 2, 1,
                               c, 2), E);
    CHECK(untouched(c, 64));
    /* c overlapping a or b */
    CHECK_STATUS(parity_matmul(NULL, 2, 2, 2, a, 2, 1, PARITY_DTYPE_F32, a + 8, 2, 1, a + 3, 2),
                 E);
    CHECK(strstr(parity_last_error(), "overlaps a") != NULL);
    CHECK_STATUS(parity_matmul(NULL, 2, 2, 2, c, 2, 1, PARITY_DTYPE_F32, a + 8, 2, 1, a + 9, 2),
                 E);
    CHECK(strstr(parity_last_error(), "overlaps b") != NULL);
    for (size_t i = 0; i < 64; i++) CHECK(a[i] == (float)i);

    /* parity_attention_backward: lengths {2, 3}, 2 heads, 1 KV head, head_dim 2: T = 5 */
    const uint32_t lens[2] = {2, 3}, empty[2] = {2, 0};
    float q[20], kv[10], dq[20], dk[10], dv[10];
    for (size_t i = 0; i < 20; i++) q[i] = 0.25f * (float)i;
    for (size_t i = 0; i < 10; i++) kv[i] = -0.5f * (float)i;
    memset(dq, 0xab, sizeof dq), memset(dk, 0xab, sizeof dk), memset(dv, 0xab, sizeof dv);
    CHECK_STATUS(parity_attention_backward(NULL, 2, NULL, 2, 1, 2, q, 4, kv, 2, kv, 2, q, 4, dq,
                                           4, dk, 2, dv, 2), E);
    CHECK_STATUS(parity_attention_backward(NULL, 2, lens, 2, 1, 2, q, 4, kv, 2, kv, 2, q, 4, dq,
                                           4, NULL, 2, dv, 2), E);
    CHECK_STATUS(parity_attention_backward(NULL, 0, lens, 2, 1, 2, q, 4, kv, 2, kv, 2, q, 4, dq,
                                           4, dk, 2, dv, 2), PARITY_ERR_EMPTY_INPUT);
    CHECK_STATUS(parity_attention_backward(NULL, 2, empty, 2, 1, 2, q, 4, kv, 2, kv, 2, q, 4, dq,
                                           4, dk, 2, dv, 2), PARITY_ERR_EMPTY_INPUT);
    CHECK_STATUS(parity_attention_backward(NULL, 2, lens, 3, 2, 2, q, 6, kv, 4, kv, 4, q, 6, dq,
                                           6, dk, 4, dv, 4), E);
    CHECK(strstr(parity_last_error(), "multiple") != NULL);
    CHECK_STATUS(parity_attention_backward(NULL, 2, lens, 2, 1, 0, q, 4, kv, 2, kv, 2, q, 4, dq,
                                           4, dk, 2, dv, 2), E);
    CHECK_STATUS(parity_attention_backward(NULL, 2, lens, 2, 1, 2, q, 3, kv, 2, kv, 2, q, 4, dq,
                                           4, dk, 2, dv, 2), E);
    CHECK(strstr(parity_last_error(), "q") != NULL);
    CHECK_STATUS(parity_attention_backward(NULL, 2, lens, 2, 1, 2, q, 4, kv, 2, kv, 2, q, 4, dq,
                                           4, dk, 2, dk, 2), E);
    CHECK(strstr(parity_last_error(), "d_v overlaps d_k") != NULL);
    CHECK_STATUS(parity_attention_backward(NULL, 2, lens, 2, 1, 2, q, 4, kv, 2, kv, 2, q, 4, q,
                                           4, dk, 2, dv, 2), E);
    CHECK(strstr(parity_last_error(), "d_q overlaps q") != NULL);
    CHECK(untouched(dq, 20) && untouched(dk, 10) && untouched(dv, 10));
    /* a pool that another thread is in: PARITY_ERR_BUSY is the caller's to see (test_ops);
     * here the call itself works on a good input */
    CHECK_OK(parity_attention_backward(NULL, 2, lens, 2, 1, 2, q, 4, kv, 2, kv, 2, q, 4, dq, 4,
                                       dk, 2, dv, 2));
    for (size_t i = 0; i < 20; i++) CHECK(isfinite(dq[i]));

    /* the norm's and SwiGLU's gradients: 2 rows of 4 */
    float x[8], w[4] = {1, 2, 3, 4}, g[8], o[8], o2[8], dw[4];
    for (size_t i = 0; i < 8; i++) x[i] = (float)i - 3.5f, g[i] = 0.5f * (float)i;
    memset(o, 0xab, sizeof o), memset(o2, 0xab, sizeof o2), memset(dw, 0xab, sizeof dw);
    CHECK_STATUS(parity_rmsnorm_backward(NULL, 0, 4, x, 4, w, 1e-6f, g, 4, NULL, 0, o, 4, dw), E);
    CHECK_STATUS(parity_rmsnorm_backward(NULL, 2, 4, NULL, 4, w, 1e-6f, g, 4, NULL, 0, o, 4, dw),
                 E);
    CHECK_STATUS(parity_rmsnorm_backward(NULL, 2, 4, x, 4, NULL, 1e-6f, g, 4, NULL, 0, o, 4, dw),
                 E);
    CHECK_STATUS(parity_rmsnorm_backward(NULL, 2, 4, x, 4, w, -1.0f, g, 4, NULL, 0, o, 4, dw), E);
    CHECK_STATUS(parity_rmsnorm_backward(NULL, 2, 4, x, 3, w, 1e-6f, g, 4, NULL, 0, o, 4, dw), E);
    CHECK_STATUS(parity_rmsnorm_backward(NULL, 2, 4, x, 4, w, 1e-6f, g, 4, g, 2, o, 4, dw), E);
    CHECK_STATUS(parity_rmsnorm_backward(NULL, 2, 4, x, 4, w, 1e-6f, g, 4, NULL, 0, g, 4, dw), E);
    CHECK(strstr(parity_last_error(), "d_x overlaps d_out") != NULL);
    CHECK_STATUS(parity_rmsnorm_backward(NULL, 2, 4, x, 4, w, 1e-6f, g, 4, NULL, 0, o, 4, o + 4),
                 E);
    CHECK(strstr(parity_last_error(), "d_weight overlaps d_x") != NULL);
    CHECK_STATUS(parity_rmsnorm_backward(NULL, 2, 4, x, 4, w, 1e-6f, g, 4, NULL, 0, o, 4, w), E);
    CHECK(strstr(parity_last_error(), "d_weight overlaps weight") != NULL);
    CHECK(untouched(o, 8) && untouched(dw, 4));
    CHECK_STATUS(parity_swiglu_backward(NULL, 2, 0, x, 4, g, 4, g, 4, o, 4, o2, 4), E);
    CHECK_STATUS(parity_swiglu_backward(NULL, 2, 4, x, 4, NULL, 4, g, 4, o, 4, o2, 4), E);
    CHECK_STATUS(parity_swiglu_backward(NULL, 2, 4, x, 4, g, 4, g, 3, o, 4, o2, 4), E);
    CHECK_STATUS(parity_swiglu_backward(NULL, 2, 4, x, 4, g, 4, g, 4, o, 4, o, 4), E);
    CHECK(strstr(parity_last_error(), "d_up overlaps d_gate") != NULL);
    CHECK_STATUS(parity_swiglu_backward(NULL, 2, 4, x, 4, g, 4, g, 4, x, 4, o2, 4), E);
    CHECK(strstr(parity_last_error(), "d_gate overlaps gate") != NULL);
    /* one row of 4 floats: the two halves' columns meet (2 past 0, stride 4 < 2 + 2) */
    CHECK_STATUS(parity_swiglu_backward(NULL, 1, 2, x, 4, g, 4, g, 4, o, 4, o + 1, 4), E);
    CHECK(strstr(parity_last_error(), "d_up overlaps d_gate") != NULL);
    /* strides that differ, or a column offset that runs past the row: refused */
    CHECK_STATUS(parity_swiglu_backward(NULL, 2, 2, x, 4, g, 4, g, 4, o, 4, o + 2, 3), E);
    CHECK_STATUS(parity_swiglu_backward(NULL, 2, 2, x, 4, g, 4, g, 4, o, 4, o + 3, 4), E);
    CHECK(strstr(parity_last_error(), "d_up overlaps d_gate") != NULL);
    CHECK(untouched(o, 8) && untouched(o2, 8));
    /* the two halves of one buffer [2 rows, 2 x 2], each through its stride 4: the values of
     * separate buffers */
    float sep_g[4], sep_u[4], both[8];
    CHECK_OK(parity_swiglu_backward(NULL, 2, 2, x, 4, x + 2, 4, g, 2, sep_g, 2, sep_u, 2));
    CHECK_OK(parity_swiglu_backward(NULL, 2, 2, x, 4, x + 2, 4, g, 2, both, 4, both + 2, 4));
    for (size_t r = 0; r < 2; r++) {
        CHECK_BITS_F32(both + 4 * r, sep_g + 2 * r, 2, "swiglu d_gate, the left half");
        CHECK_BITS_F32(both + 4 * r + 2, sep_u + 2 * r, 2, "swiglu d_up, the right half");
    }
}

int main(void) {
    parity_pool *pool2 = NULL;
    CHECK_OK(parity_pool_create(2, &pool2));
    test_bad_arguments();
    test_round();
    test_region_grads(pool2);
    test_matmul(pool2);
    test_attention_backward(pool2);
    parity_pool_free(pool2);
    return check_report("train_ops");
}
