/*
 * Kernel tables: every SIMD table against the portable one (the specification), bit for
 * bit, on random inputs of many sizes (tails included) with special values (signed zeros,
 * subnormals, huge magnitudes, infinities, NaNs); the portable GEMMs and reductions against
 * literal transcriptions of the orders in kernels.h; GEMM rows independent of M; the
 * accuracy of parity_expf over every fp32 in [-104, 89]; and the public region API giving
 * the same bits on every CPU path.
 *
 * Equality is bitwise, with one allowance on fp32 outputs: two NaNs are equal whatever
 * their payloads (which NaN an operation on two NaNs returns is the compiler's choice of
 * operand order, not part of the contract). bf16 outputs hold one NaN (0x7fc0) and are
 * compared strictly. Arrays are allocated at their exact size, so that a read or write past
 * the end shows under AddressSanitizer.
 */
#include <math.h>
#include <string.h>
#if defined(PARITY_HAVE_AVX512BF16)
#include <immintrin.h>
#endif
#include <pthread.h>

#include "check.h"
#include "base/floats.h"
#include "kernels/kernel_common.h"
#include "kernels/kernels.h"

/* ---- random inputs ------------------------------------------------------------------------ */

static uint64_t rng = 0x9e3779b97f4a7c15ull;

static uint64_t rand_u64(void) {
    uint64_t z = (rng += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static double rand_unit(void) { return (double)(rand_u64() >> 11) * 0x1p-53; }

static float rand_normal(void) {
    double u = rand_unit(), v = rand_unit();
    return (float)(sqrt(-2.0 * log(u + 0x1p-60)) * cos(6.283185307179586 * v));
}

static float from_bits(uint32_t u) { return f32_from_bits(u); }

/* Input modes: plain values; plus finite specials; plus infinities and NaNs. */
enum { PLAIN = 0, FINITE_SPECIALS = 1, ALL_SPECIALS = 2, N_MODES = 3 };
static const char *const mode_names[N_MODES] = {"plain", "finite specials", "all specials"};

static float special_value(int mode) {
    static const uint32_t finite[] = {
        0x00000000u, 0x80000000u, 0x00000001u, 0x80000001u, 0x007fffffu, 0x00400000u,
        0x00800000u, 0x7f7fffffu, 0xff7fffffu, 0x7149f2cau /* 1e30 */, 0x0da24260u /* 1e-30 */,
        0x3f800000u, 0xbf800000u, 0x4b000000u /* 2^23 */,
    };
    static const uint32_t nonfinite[] = {
        0x7f800000u, 0xff800000u, 0x7fc00000u, 0xffc00000u, 0x7fa00001u, 0x7fc12345u,
    };
    size_t nf = sizeof finite / sizeof finite[0], nn = sizeof nonfinite / sizeof nonfinite[0];
    uint64_t r = rand_u64();
    if (mode == ALL_SPECIALS && r % 3 == 0) return from_bits(nonfinite[(r >> 8) % nn]);
    if (r % 5 == 1) /* a random subnormal */
        return from_bits((uint32_t)((r >> 8) & 0x807fffffu));
    return from_bits(finite[(r >> 8) % nf]);
}

/* Values of scale ~`scale`, one in 8 replaced by a special (per mode). */
static void fill_f32(float *x, size_t n, int mode, float scale) {
    for (size_t i = 0; i < n; i++)
        x[i] = (mode != PLAIN && rand_u64() % 8 == 0) ? special_value(mode) : rand_normal() * scale;
}

/* The same, rounded to bf16 values (as the region kernels' inputs are). */
static void fill_f32_bf16(float *x, size_t n, int mode, float scale) {
    fill_f32(x, n, mode, scale);
    for (size_t i = 0; i < n; i++) x[i] = round_bf16(x[i]);
}

static void fill_bf16(uint16_t *x, size_t n, int mode, float scale) {
    for (size_t i = 0; i < n; i++) {
        float v;
        fill_f32(&v, 1, mode, scale);
        /* keep a NaN's payload bits (bf16_from_f32 would make it 0x7fc0) */
        x[i] = isnan(v) ? (uint16_t)(f32_bits(v) >> 16 | 0x40) : bf16_from_f32(v);
    }
}

static void *xmalloc(size_t n) {
    void *p = malloc(n ? n : 1);
    if (!p) {
        fprintf(stderr, "out of memory\n");
        exit(2);
    }
    return p;
}

/* n floats from xmalloc. */
static float *floats(size_t n) { return xmalloc(n * sizeof(float)); }

/* ---- comparisons -------------------------------------------------------------------------- */

static long nan_payload_diffs;

/* Bitwise, but NaN == NaN (see the top of the file). */
static int same_f32(float a, float b) {
    if (f32_bits(a) == f32_bits(b)) return 1;
    if (isnan(a) && isnan(b)) {
        nan_payload_diffs++;
        return 1;
    }
    return 0;
}

static int check_f32(const float *want, const float *got, size_t n, const char *what,
                     const char *table, size_t size, int mode) {
    size_t bad = 0;
    check_count++;
    for (size_t i = 0; i < n; i++) {
        if (same_f32(want[i], got[i])) continue;
        if (bad < 3)
            fprintf(stderr, "%s [%s, n=%zu, %s]: [%zu] 0x%08x != 0x%08x (%.9g vs %.9g)\n", what,
                    table, size, mode_names[mode], i, f32_bits(want[i]), f32_bits(got[i]),
                    want[i], got[i]);
        bad++;
    }
    if (bad) check_failures++;
    return bad == 0;
}

static int check_bf16(const uint16_t *want, const uint16_t *got, size_t n, const char *what,
                      const char *table, size_t size, int mode) {
    size_t bad = 0;
    check_count++;
    for (size_t i = 0; i < n; i++) {
        if (want[i] == got[i]) continue;
        if (bad < 3)
            fprintf(stderr, "%s [%s, n=%zu, %s]: [%zu] 0x%04x != 0x%04x\n", what, table, size,
                    mode_names[mode], i, want[i], got[i]);
        bad++;
    }
    if (bad) check_failures++;
    return bad == 0;
}

/* ---- literal transcriptions of kernels.h's orders ---------------------------------------- */

static float spec_fold(float acc[16]) {
    for (int step = 8; step >= 1; step /= 2)
        for (int l = 0; l < step; l++) acc[l] += acc[l + step];
    return acc[0];
}

static float spec_dot16(const float *a, const float *b, size_t n) {
    float acc[16] = {0};
    for (size_t i = 0; i < n; i++) acc[i % 16] = fmaf(a[i], b[i], acc[i % 16]);
    return spec_fold(acc);
}

/* pair32's denormal rule (kernels.h), written apart from kernels_ref.c: subnormal operands
 * read as zeros of their sign; a result is flushed when it is subnormal, or when it is
 * 2^-126 but the exact value, rounded to 24 bits with an unbounded exponent, lies below:
 * that rounding is the fma of the operands with the smaller of a and b scaled by 2^32. */
static float spec_daz(float v) { return fpclassify(v) == FP_SUBNORMAL ? copysignf(0.0f, v) : v; }

static float spec_fma_ftz(float a, float b, float c) {
    a = spec_daz(a), b = spec_daz(b), c = spec_daz(c);
    const float r = fmaf(a, b, c);
    if (fpclassify(r) == FP_SUBNORMAL) return copysignf(0.0f, r);
    if (fabsf(r) == 0x1p-126f) {
        const float u = fabsf(a) <= fabsf(b) ? fmaf(ldexpf(a, 32), b, ldexpf(c, 32))
                                             : fmaf(a, ldexpf(b, 32), ldexpf(c, 32));
        if (fabsf(u) < 0x1p-94f) return copysignf(0.0f, r);
    }
    return r;
}

/* pair32 on the unpacked x row: lane l of chunk c, odd element first, k >= K skipped, then
 * the fold, every step under the denormal rule. */
static float spec_pair32(const float *x, const uint16_t *w, size_t K) {
    float acc[16] = {0};
    for (size_t c = 0; 32 * c < K; c++) {
        for (size_t l = 0; l < 16; l++) {
            size_t k0 = 32 * c + 2 * l, k1 = k0 + 1;
            if (k1 < K) acc[l] = spec_fma_ftz(x[k1], bf16_to_f32(w[k1]), acc[l]);
            if (k0 < K) acc[l] = spec_fma_ftz(x[k0], bf16_to_f32(w[k0]), acc[l]);
        }
    }
    for (int step = 8; step >= 1; step /= 2)
        for (int l = 0; l < step; l++) acc[l] = spec_fma_ftz(acc[l], 1.0f, acc[l + step]);
    return acc[0];
}

/* ---- sizes -------------------------------------------------------------------------------- */

static size_t sizes[160];
static size_t n_sizes;

static void make_sizes(void) {
    /* quick mode: every tail length of the 8- and 16-wide loops, fewer long rows */
    const size_t dense = quick() ? 40 : 70, sparse_step = quick() ? 23 : 5;
    for (size_t n = 1; n <= dense; n++) sizes[n_sizes++] = n;
    for (size_t n = dense + 1; n <= 300; n += sparse_step) sizes[n_sizes++] = n;
    static const size_t big[] = {511, 512, 513, 1000, 1001, 4096, 4097};
    for (size_t i = 0; i < sizeof big / sizeof big[0]; i++) sizes[n_sizes++] = big[i];
}

/* ---- reductions and elementwise kernels -------------------------------------------------- */

static void test_vector_kernels(const kernels *t) {
    const kernels *p = &kernels_portable;
    for (size_t si = 0; si < n_sizes; si++) {
        size_t n = sizes[si];
        float *a = floats(n), *b = floats(n);
        uint16_t *bh = xmalloc(n * sizeof *bh);
        float *o1 = floats(n), *o2 = floats(n);
        for (int mode = 0; mode < N_MODES; mode++) {
            fill_f32(a, n, mode, 2.0f);
            fill_f32(b, n, mode, 1.0f);
            fill_bf16(bh, n, mode, 1.0f);
            float r1, r2;

            r1 = p->dot_f32(a, b, n), r2 = t->dot_f32(a, b, n);
            check_f32(&r1, &r2, 1, "dot_f32", t->name, n, mode);
            r1 = p->dot_f32_bf16(a, bh, n), r2 = t->dot_f32_bf16(a, bh, n);
            check_f32(&r1, &r2, 1, "dot_f32_bf16", t->name, n, mode);
            r1 = p->sum_squares(a, n), r2 = t->sum_squares(a, n);
            check_f32(&r1, &r2, 1, "sum_squares", t->name, n, mode);
            r1 = p->max_f32(a, n), r2 = t->max_f32(a, n);
            check_f32(&r1, &r2, 1, "max_f32", t->name, n, mode);

            /* sum_exp around the row's max (softmax), and around values that overflow or
             * underflow every term */
            const float shifts[] = {p->max_f32(a, n), 0.0f, -100.0f, 120.0f};
            for (size_t s = 0; s < sizeof shifts / sizeof shifts[0]; s++) {
                r1 = p->sum_exp(a, n, shifts[s], o1);
                r2 = t->sum_exp(a, n, shifts[s], o2);
                check_f32(&r1, &r2, 1, "sum_exp", t->name, n, mode);
                check_f32(o1, o2, n, "sum_exp out", t->name, n, mode);
                r2 = t->sum_exp(a, n, shifts[s], NULL);
                check_f32(&r1, &r2, 1, "sum_exp (out NULL)", t->name, n, mode);
            }

            memcpy(o1, a, n * sizeof *a), memcpy(o2, a, n * sizeof *a);
            p->round_bf16(o1, n), t->round_bf16(o2, n);
            check_f32(o1, o2, n, "round_bf16", t->name, n, mode);

            /* scale_round at every pair of rounding points, with and without the max */
            for (int f = 0; f < 9; f++) {
                const int before = f % 3, after = f / 3;
                const float sc = f % 2 ? 0.08838834764831845f : (mode == PLAIN ? 1.0f / rand_normal() : special_value(mode));
                memcpy(o1, a, n * sizeof *a), memcpy(o2, a, n * sizeof *a);
                p->scale_round(o1, n, sc, before, after, &r1);
                t->scale_round(o2, n, sc, before, after, &r2);
                check_f32(o1, o2, n, "scale_round", t->name, n, mode);
                check_f32(&r1, &r2, 1, "scale_round max", t->name, n, mode);
                r2 = t->max_f32(o1, n);
                check_f32(&r1, &r2, 1, "scale_round max = max_f32 of the result", t->name, n, mode);
                memcpy(o2, a, n * sizeof *a);
                t->scale_round(o2, n, sc, before, after, NULL);
                check_f32(o1, o2, n, "scale_round (max NULL)", t->name, n, mode);
            }

            fill_f32(o1, n, mode, 30.0f);
            memcpy(o2, o1, n * sizeof *o1);
            p->exp_f32(o1, n), t->exp_f32(o2, n);
            check_f32(o1, o2, n, "exp_f32", t->name, n, mode);

            float pv = mode == PLAIN ? rand_normal() : special_value(mode);
            memcpy(o1, b, n * sizeof *b), memcpy(o2, b, n * sizeof *b);
            p->axpy_f32(o1, pv, a, n), t->axpy_f32(o2, pv, a, n);
            check_f32(o1, o2, n, "axpy_f32", t->name, n, mode);
            memcpy(o1, b, n * sizeof *b), memcpy(o2, b, n * sizeof *b);
            p->axpy_bf16(o1, pv, bh, n), t->axpy_bf16(o2, pv, bh, n);
            check_f32(o1, o2, n, "axpy_bf16", t->name, n, mode);

            const float pw[4] = {pv, rand_normal(), mode == PLAIN ? rand_normal() : -pv, 0.25f};

            /* a block of the cache's keys / values, bf16 and widened: count vectors ld apart
             * (ld > n, so that a kernel that read past n would take the wrong elements), read
             * by 1 to 9 query vectors lda apart (attention passes a run of rows' query heads
             * in one call: several pairs and an odd one), their scores ldo apart */
            const size_t ld = n + 3, count = 1 + (n + (size_t)mode) % 31;
            const size_t Q = 1 + (n + (size_t)mode) % 9, lda = n + 1, ldo = count + 2;
            uint16_t *blk16 = xmalloc(count * ld * sizeof *blk16);
            float *blk = xmalloc(count * ld * sizeof *blk), *blk2 = xmalloc(count * ld * sizeof *blk2);
            float *aq = xmalloc(Q * lda * sizeof *aq), *pj = xmalloc(Q * ldo * sizeof *pj);
            float *oq1 = xmalloc(Q * lda * sizeof *oq1), *oq2 = xmalloc(Q * lda * sizeof *oq2);
            float *ob = xmalloc(Q * lda * sizeof *ob), s1[9 * 33], s2[9 * 33];
            fill_f32(aq, Q * lda, mode, 1.0f);
            memcpy(aq, a, n * sizeof *a);
            fill_f32(ob, Q * lda, mode, 1.0f);
            fill_bf16(blk16, count * ld, mode, 0.75f);
            p->widen_bf16(blk16, count * ld, blk), t->widen_bf16(blk16, count * ld, blk2);
            check_f32(blk, blk2, count * ld, "widen_bf16", t->name, n, mode);
            for (size_t i = 0; i < count * ld; i++) blk2[i] = bf16_to_f32(blk16[i]);
            check_f32(blk2, blk, count * ld, "widen_bf16 (portable) = bf16 values", t->name, n, mode);
            memset(s1, 0, sizeof s1), memset(s2, 0, sizeof s2);
            p->dots_f32(aq, lda, Q, blk, ld, count, n, s1, ldo);
            t->dots_f32(aq, lda, Q, blk, ld, count, n, s2, ldo);
            check_f32(s1, s2, Q * ldo, "dots_f32", t->name, n, mode);
            for (size_t q = 0; q < Q; q++)
                for (size_t j = 0; j < count; j++) s2[q * ldo + j] = p->dot_f32_bf16(aq + q * lda, blk16 + j * ld, n);
            check_f32(s2, s1, Q * ldo, "dots_f32 (portable) = dot_f32_bf16 of the bf16 keys", t->name, n, mode);
            t->dots_f32_bf16(aq, lda, Q, blk16, ld, count, n, s2, ldo);
            check_f32(s1, s2, Q * ldo, "dots_f32_bf16 = dots_f32 of the widened keys", t->name, n, mode);
            p->dots_f32_bf16(aq, lda, Q, blk16, ld, count, n, s2, ldo);
            check_f32(s1, s2, Q * ldo, "dots_f32_bf16 (portable) = dots_f32 of the widened keys", t->name, n, mode);
            for (size_t j = 0; j < Q * ldo; j++) pj[j] = j % 3 ? rand_normal() : pw[j % 4];
            memcpy(oq1, ob, Q * lda * sizeof *ob), memcpy(oq2, ob, Q * lda * sizeof *ob);
            p->pv_f32(oq1, lda, pj, ldo, Q, blk, ld, count, n);
            t->pv_f32(oq2, lda, pj, ldo, Q, blk, ld, count, n);
            check_f32(oq1, oq2, Q * lda, "pv_f32", t->name, n, mode);
            memcpy(oq2, ob, Q * lda * sizeof *ob);
            for (size_t q = 0; q < Q; q++)
                for (size_t j = 0; j < count; j++) p->axpy_bf16(oq2 + q * lda, pj[q * ldo + j], blk16 + j * ld, n);
            check_f32(oq2, oq1, Q * lda, "pv_f32 (portable) = axpy_bf16 in order", t->name, n, mode);
            memcpy(oq2, ob, Q * lda * sizeof *ob);
            t->pv_bf16(oq2, lda, pj, ldo, Q, blk16, ld, count, n);
            check_f32(oq1, oq2, Q * lda, "pv_bf16 = pv_f32 of the widened values", t->name, n, mode);
            memcpy(oq2, ob, Q * lda * sizeof *ob);
            p->pv_bf16(oq2, lda, pj, ldo, Q, blk16, ld, count, n);
            check_f32(oq1, oq2, Q * lda, "pv_bf16 (portable) = pv_f32 of the widened values", t->name, n, mode);
            free(blk16), free(blk), free(blk2), free(pj), free(aq), free(oq1), free(oq2), free(ob);
        }
        free(a), free(b), free(bh), free(o1), free(o2);
    }
}

/* ---- attention blocks on bf16 queries ------------------------------------------------------ */

/* A bf16 value of random sign, a random 7-bit mantissa and an exponent in [lo, lo + span]
 * (2^lo where `at_lo`); zero one time in 8. */
static float bf16_with_exponent(int lo, int span, int at_lo) {
    const uint64_t r = rand_u64();
    if (!at_lo && r % 8 == 0) return r & 8 ? -0.0f : 0.0f;
    const int e = at_lo ? lo : lo + (int)((r >> 8) % (uint64_t)(span + 1));
    const float m = at_lo ? 1.0f : 1.0f + (float)((r >> 20) % 128) / 128.0f;
    return (r >> 40) % 2 ? -ldexpf(m, e) : ldexpf(m, e);
}

/* Attention's P.V over count positions as attend_run runs it: blocks of up to 16 positions
 * in order from outputs at +0, through the table's pv_bf16_grained while it returns 1, then
 * pv_bf16 (or pv_bf16 throughout, where the table has no grained form). */
static void pv_blocks(const kernels *t, float *o, size_t ldo, const float *p, size_t ldp,
                      size_t queries, const uint16_t *v, size_t ldv, size_t count, size_t n) {
    int grained = t->pv_bf16_grained != NULL;
    for (size_t j0 = 0; j0 < count; j0 += 16) {
        const size_t len = count - j0 < 16 ? count - j0 : 16;
        if (grained)
            grained = t->pv_bf16_grained(o, ldo, p + j0, ldp, queries, v + j0 * ldv, ldv, len, n);
        else
            t->pv_bf16(o, ldo, p + j0, ldp, queries, v + j0 * ldv, ldv, len, n);
    }
}

/* Attention's q.k as attend_run runs it: the queries packed once where the table packs them,
 * then every block of up to 16 keys. */
static void dots_blocks(const kernels *t, const float *a, size_t lda, size_t queries,
                        const uint16_t *b, size_t ldb, size_t count, size_t n, float *out,
                        size_t ldo, uint16_t *qp) {
    const int code = t->pack_queries_bf16 ? t->pack_queries_bf16(a, lda, queries, n, qp) : -1;
    for (size_t j0 = 0; j0 < count; j0 += 16) {
        const size_t len = count - j0 < 16 ? count - j0 : 16;
        if (code >= 0)
            t->dots_packed_bf16(qp, code, a, lda, queries, b + j0 * ldb, ldb, len, n, out + j0, ldo);
        else
            t->dots_f32_bf16(a, lda, queries, b + j0 * ldb, ldb, len, n, out + j0, ldo);
    }
}

/* Attention's q.k and P.V where the queries and the probabilities are bf16 values, as the
 * presets' rounded q and P are (the avx512bf16 table runs them on vdpbf16ps there, which
 * flushes denormals: it must fall back wherever one could arise, and give dot16's and
 * pv_bf16's bits elsewhere), run as attend_run runs them (dots_blocks, pv_blocks): every
 * table against the portable one's dots_f32_bf16 and pv_bf16, for 1 to 40 queries, 1 to 40
 * positions and n a multiple of 32 or not, over plain values, the specials, values whose
 * least exponents sit on either side of what vdpbf16ps can take without meeting a denormal
 * (products and partial sums near 2^-126), tinier ones, denormal inputs beside large values
 * (normal products that vdpbf16ps would zero), and products that overflow. */
static void test_attention_bf16_values(const kernels *const *tables, int n_tables) {
    static const size_t ns[] = {32, 64, 96, 128, 256, 100, 288};
    static const size_t queries[] = {1, 3, 8, 9, 12, 16, 32, 33, 40};
    static const size_t counts[] = {1, 2, 3, 5, 15, 16, 17, 31, 40};
    const kernels *p = &kernels_portable;
    enum { R_PLAIN, R_FINITE, R_ALL, R_NEAR_DENORMAL, R_TINY, R_OVERFLOW, R_DENORMAL_BESIDE_LARGE, N_REGIMES };
    for (size_t ni = 0; ni < sizeof ns / sizeof ns[0]; ni++)
        for (size_t qi = 0; qi < sizeof queries / sizeof queries[0]; qi++)
            for (int regime = 0; regime < N_REGIMES; regime++) {
                const size_t n = ns[ni], Q = queries[qi];
                const size_t count = counts[(ni + qi + (size_t)regime) % (sizeof counts / sizeof counts[0])];
                const size_t lda = n + 5, ldb = n + 3, ldo = count + 2, ldp = count + 1;
                const int mode = regime == R_FINITE ? FINITE_SPECIALS : regime == R_ALL ? ALL_SPECIALS : PLAIN;
                float *a = xmalloc(Q * lda * sizeof *a), *pr = xmalloc(Q * ldp * sizeof *pr);
                float *o1 = xmalloc(Q * lda * sizeof *o1), *o2 = xmalloc(Q * lda * sizeof *o2);
                float *s1 = xmalloc(Q * ldo * sizeof *s1), *s2 = xmalloc(Q * ldo * sizeof *s2);
                uint16_t *b = xmalloc(count * ldb * sizeof *b), *qp = xmalloc(Q * n * sizeof *qp);
                if (regime == R_NEAR_DENORMAL) {
                    /* least exponents e1 + e2 = -112 + d, d in -1..1: 142 biased, vdpbf16ps's
                     * limit, or one either side (queries and keys; probabilities and the
                     * values, every other vector) */
                    const int d = (int)(rand_u64() % 3) - 1, eq = -56 + d / 2, ek = -112 + d - eq;
                    const int ep = -50 + d / 2, ev = -112 + d - ep;
                    for (size_t i = 0; i < Q * lda; i++) a[i] = bf16_with_exponent(eq, 12, i == 7);
                    for (size_t i = 0; i < count * ldb; i++)
                        b[i] = bf16_from_f32(bf16_with_exponent(i / ldb % 2 ? ev : ek, 12, i == 5 || i == ldb + 9));
                    for (size_t i = 0; i < Q * ldp; i++) pr[i] = fabsf(bf16_with_exponent(ep, 12, i == 3));
                } else if (regime == R_TINY) {
                    /* least exponents anywhere in -80..-40: products down in the denormals */
                    const int eq = -80 + (int)(rand_u64() % 41), ek = -80 + (int)(rand_u64() % 41);
                    for (size_t i = 0; i < Q * lda; i++) a[i] = bf16_with_exponent(eq, 10, i == 1);
                    for (size_t i = 0; i < count * ldb; i++) b[i] = bf16_from_f32(bf16_with_exponent(ek, 10, i == 2));
                    for (size_t i = 0; i < Q * ldp; i++) pr[i] = fabsf(bf16_with_exponent(eq, 10, i == 1));
                } else if (regime == R_DENORMAL_BESIDE_LARGE) {
                    /* one operand large (least exponent 2^20: the exponents add up to far more
                     * than 142 against anything) and the other holding denormals, which
                     * vdpbf16ps reads as zeros while their products with the large values
                     * are normal: queries or probabilities large, or keys and values */
                    const int big_first = (int)(rand_u64() % 2);
                    for (size_t i = 0; i < Q * lda; i++)
                        a[i] = big_first                       ? bf16_with_exponent(20, 6, 0)
                               : i % 5 == 2 || i / lda == 1 ? ldexpf(3, -132)  /* query 1: all denormal */
                                                            : bf16_with_exponent(-10, 6, 0);
                    for (size_t i = 0; i < count * ldb; i++)
                        b[i] = !big_first                      ? bf16_from_f32(bf16_with_exponent(20, 6, 0))
                               : i % 7 == 3 || i / ldb == 0 ? 0x0003  /* key 0: all denormal */
                                                            : bf16_from_f32(bf16_with_exponent(-10, 6, 0));
                    for (size_t i = 0; i < Q * ldp; i++)
                        pr[i] = big_first ? fabsf(bf16_with_exponent(20, 6, 0)) : i % 5 == 2 ? ldexpf(3, -132) : fabsf(bf16_with_exponent(-10, 6, 0));
                } else if (regime == R_OVERFLOW) {
                    for (size_t i = 0; i < Q * lda; i++) a[i] = bf16_with_exponent(60, 6, 0);
                    for (size_t i = 0; i < count * ldb; i++) b[i] = bf16_from_f32(bf16_with_exponent(60, 6, 0));
                    for (size_t i = 0; i < Q * ldp; i++) pr[i] = fabsf(bf16_with_exponent(60, 6, 0));
                } else {
                    fill_f32_bf16(a, Q * lda, mode, 1.0f);
                    fill_bf16(b, count * ldb, mode, 0.75f);
                    fill_f32_bf16(pr, Q * ldp, mode, 0.3f);
                    for (size_t i = 0; i < Q * ldp; i++) pr[i] = mode == PLAIN ? fabsf(pr[i]) : pr[i];
                }
                memset(s1, 0, Q * ldo * sizeof *s1);
                p->dots_f32_bf16(a, lda, Q, b, ldb, count, n, s1, ldo);
                memset(o1, 0, Q * lda * sizeof *o1);
                p->pv_bf16(o1, lda, pr, ldp, Q, b, ldb, count, n);
                for (int t = 0; t < n_tables; t++) {
                    memcpy(s2, s1, Q * ldo * sizeof *s1);
                    for (size_t q = 0; q < Q; q++)
                        for (size_t j = 0; j < count; j++) s2[q * ldo + j] = 12345.0f;
                    dots_blocks(tables[t], a, lda, Q, b, ldb, count, n, s2, ldo, qp);
                    check_f32(s1, s2, Q * ldo, "q.k on bf16 queries", tables[t]->name, n, mode);
                    memset(o2, 0, Q * lda * sizeof *o2);
                    pv_blocks(tables[t], o2, lda, pr, ldp, Q, b, ldb, count, n);
                    check_f32(o1, o2, Q * lda, "P.V on bf16 probabilities", tables[t]->name, n, mode);
                }
                free(a), free(pr), free(o1), free(o2), free(s1), free(s2), free(b), free(qp);
            }
}

/* Two products that cancel to one unit of their granule (129 * 129 - 128 * 130 = 1): with
 * the least exponents 2^-56 (queries, probabilities) and 2^-57 or 2^-56 (keys, values) the
 * granule is 2^-127, a denormal that vdpbf16ps would flush, or 2^-126, a normal number. Each
 * pair sits where one dot16 chain (elements 0 and 16) or one output element (positions 0
 * and 1) meets it, for 8 queries, the fewest the avx512bf16 table packs. */
static void test_attention_cancellations(const kernels *const *tables, int n_tables) {
    const kernels *p = &kernels_portable;
    const size_t n = 32, Q = 8, count = 2;
    for (int kexp = -64; kexp <= -63; kexp++) {
        float a[8 * 32] = {0}, pr[8 * 2], o1[8 * 32] = {0}, o2[8 * 32], s1[8 * 2], s2[8 * 2];
        uint16_t kb[2 * 32] = {0}, vb[2 * 32] = {0}, qp[8 * 32];
        for (size_t q = 0; q < Q; q++) {
            a[q * n] = ldexpf(129, -63), a[q * n + 16] = -ldexpf(128, -63);
            pr[q * 2] = ldexpf(129, -63), pr[q * 2 + 1] = ldexpf(128, -63);
        }
        kb[0] = bf16_from_f32(ldexpf(129, kexp)), kb[16] = bf16_from_f32(ldexpf(130, kexp));
        for (size_t i = 0; i < n; i++)
            vb[i] = bf16_from_f32(ldexpf(129, kexp)), vb[n + i] = bf16_from_f32(-ldexpf(130, kexp));
        p->dots_f32_bf16(a, n, Q, kb, n, 1, n, s1, 2);
        CHECK(f32_bits(s1[0]) == f32_bits(ldexpf(1, kexp - 63)));  /* the chain keeps it */
        p->pv_bf16(o1, n, pr, 2, Q, vb, n, count, n);
        CHECK(f32_bits(o1[0]) == f32_bits(ldexpf(1, kexp - 63)));
        for (int t = 0; t < n_tables; t++) {
            dots_blocks(tables[t], a, n, Q, kb, n, 1, n, s2, 2, qp);
            for (size_t q = 0; q < Q; q++)
                check_f32(s1, s2 + 2 * q, 1, "q.k cancelling to one granule", tables[t]->name, n, PLAIN);
            memset(o2, 0, sizeof o2);
            pv_blocks(tables[t], o2, n, pr, 2, Q, vb, n, count, n);
            check_f32(o1, o2, Q * n, "P.V cancelling to one granule", tables[t]->name, n, PLAIN);
        }
    }
}

/* The portable reductions against the literal orders (and round_bf16 against its rule). */
static void test_portable_orders(void) {
    const kernels *p = &kernels_portable;
    for (size_t si = 0; si < n_sizes; si++) {
        size_t n = sizes[si];
        float *a = xmalloc(n * sizeof *a), *b = xmalloc(n * sizeof *b);
        fill_f32(a, n, FINITE_SPECIALS, 1.0f);
        fill_f32(b, n, PLAIN, 1.0f);
        float r1 = spec_dot16(a, b, n), r2 = p->dot_f32(a, b, n);
        check_f32(&r1, &r2, 1, "dot16 literal", "portable", n, FINITE_SPECIALS);
        r1 = spec_dot16(a, a, n), r2 = p->sum_squares(a, n);
        check_f32(&r1, &r2, 1, "sum_squares literal", "portable", n, FINITE_SPECIALS);
        float mx = a[0];
        for (size_t i = 0; i < n; i++) mx = a[i] > mx ? a[i] : mx;
        r2 = p->max_f32(a, n);
        CHECK(mx == r2); /* the value (the sign of a zero max depends on the lanes) */
        free(a), free(b);
    }
    /* scale_round: its definition, element by element */
    for (size_t si = 0; si < n_sizes; si++) {
        const size_t n = sizes[si];
        float *a = xmalloc(n * sizeof *a), *x = xmalloc(n * sizeof *x);
        fill_f32(a, n, ALL_SPECIALS, 3.0f);
        memcpy(x, a, n * sizeof *a);
        float mx;
        p->scale_round(x, n, 0.0883883f, FMT_BF16, FMT_FP16, &mx);
        for (size_t i = 0; i < n; i++) a[i] = round_fp16(round_bf16(a[i]) * 0.0883883f);
        check_f32(a, x, n, "scale_round literal", "portable", n, ALL_SPECIALS);
        const float want = p->max_f32(a, n);
        check_f32(&want, &mx, 1, "scale_round max literal", "portable", n, ALL_SPECIALS);
        free(a), free(x);
    }
    float x[3] = {1.00390625f, -NAN, from_bits(0x7f7f8000u)};
    p->round_bf16(x, 3);
    CHECK_INT(f32_bits(x[0]), 0x3f800000u);
    CHECK_INT(f32_bits(x[1]), 0x7fc00000u);
    CHECK_INT(f32_bits(x[2]), 0x7f800000u);
}

/* Sums whose every product rounds to -0: a lane accumulator holds -0, and a partial block
 * must leave it so (a padded lane that added +0 would turn it into +0, and the result into +0
 * when all 16 lanes are -0). */
static void test_negative_zero_sums(const kernels *const *tables, int n_tables) {
    const float neg = -0x1p-80f, pos = 0x1p-80f; /* product -2^-160: rounds to -0 */
    enum { N = 29 };                              /* blocks of 16, 8 and 4 columns, a single one */
    for (size_t n = 1; n <= 100; n++) {
        float *a = xmalloc(n * sizeof *a), *b = xmalloc(N * n * sizeof *b);
        float *xp = xmalloc(gemm_packed_row(n) * sizeof *xp);
        uint16_t *bh = xmalloc(N * n * sizeof *bh), *xb = xmalloc(gemm_packed_row(n) * sizeof *xb);
        for (size_t i = 0; i < n; i++) a[i] = neg;
        for (size_t i = 0; i < N * n; i++) b[i] = pos, bh[i] = bf16_from_f32(pos);
        gemm_pack_x(1, n, a, n, xp);
        float want[2 + 3 * N], got[2 + 3 * N];
        want[0] = kernels_portable.dot_f32(a, b, n);
        want[1] = kernels_portable.dot_f32_bf16(a, bh, n);
        kernels_portable.gemm_bf16w(1, n, xp, bh, n, want + 2, N, 0, N);
        kernels_portable.gemm_f32w(1, n, a, n, b, n, want + 2 + N, N, 0, N);
        kernels_portable.dots_f32(a, n, 1, b, n, N, n, want + 2 + 2 * N, N);
        /* every lane holds -0 once each has an element: n >= 16 (dot16), n >= 31 (pair32) */
        CHECK_INT(f32_bits(want[0]), n >= 16 ? 0x80000000u : 0u);
        CHECK_INT(f32_bits(want[2]), n >= 31 ? 0x80000000u : 0u);
        for (int t = 0; t < n_tables; t++) {
            got[0] = tables[t]->dot_f32(a, b, n);
            got[1] = tables[t]->dot_f32_bf16(a, bh, n);
            tables[t]->gemm_bf16w(1, n, xp, bh, n, got + 2, N, 0, N);
            tables[t]->gemm_f32w(1, n, a, n, b, n, got + 2 + N, N, 0, N);
            tables[t]->dots_f32(a, n, 1, b, n, N, n, got + 2 + 2 * N, N);
            check_f32(want, got, 2 + 3 * N, "-0 sums (dot_f32, dot_f32_bf16, gemm_bf16w, "
                      "gemm_f32w, dots_f32; 29 columns each)", tables[t]->name, n, PLAIN);
            if (!tables[t]->gemm_bf16xw) continue;
            CHECK_INT(tables[t]->pack_x_bf16(n, a, n, xb, 0, 1), 1);
            tables[t]->gemm_bf16xw(1, n, xb, bh, n, got + 2, N, 0, N, 0);
            check_f32(want + 2, got + 2, N, "-0 sums (gemm_bf16xw, 29 columns)", tables[t]->name,
                      n, PLAIN);
        }
        free(a), free(b), free(xp), free(bh), free(xb);
    }
}

/* max over -1, +0, -0 and NaN (never first, then once first): which zero wins and whether
 * a NaN is seen depend on the lanes, so the tables must keep the same lanes. */
static void test_max_zeros(const kernels *const *tables, int n_tables) {
    static const uint32_t vals[] = {0xbf800000u, 0x00000000u, 0x80000000u, 0x7fc00000u};
    for (size_t si = 0; si < n_sizes && sizes[si] <= 300; si++) {
        size_t n = sizes[si];
        float *x = xmalloc(n * sizeof *x);
        for (int first_nan = 0; first_nan < 2; first_nan++)
            for (int rep = 0; rep < 8; rep++) {
                for (size_t i = 0; i < n; i++) x[i] = from_bits(vals[rand_u64() % 4]);
                x[0] = first_nan ? NAN : from_bits(vals[rand_u64() % 3]);
                float want = kernels_portable.max_f32(x, n);
                CHECK(first_nan ? isnan(want) : !isnan(want));
                for (int t = 0; t < n_tables; t++) {
                    float got = tables[t]->max_f32(x, n);
                    check_f32(&want, &got, 1, "max_f32 of zeros", tables[t]->name, n, PLAIN);
                }
            }
        free(x);
    }
}

/* ---- exp: every table against the portable one, and the accuracy ------------------------ */

typedef struct exp_sweep {
    uint64_t begin, end;       /* bit patterns [begin, end) */
    uint32_t stride;           /* every pattern (1) or a sample */
    int measure;               /* also compare with (float)exp((double)x) */
    uint64_t n, exact, off;    /* values measured, correctly rounded; table mismatches */
    uint64_t max_ulp;
    float worst;
} exp_sweep;

/* The tables to compare with parity_expf, and the one measured (the fastest). */
static const kernels *exp_tables[4];
static int n_exp_tables;
static const kernels *exp_measured;

/* Distance in ulps between two non-NaN floats (the integers that order the floats). */
static uint64_t ulp_distance(float a, float b) {
    int64_t ia = (int64_t)(f32_bits(a) & 0x7fffffffu), ib = (int64_t)(f32_bits(b) & 0x7fffffffu);
    if (f32_bits(a) >> 31) ia = -ia;
    if (f32_bits(b) >> 31) ib = -ib;
    return (uint64_t)(ia > ib ? ia - ib : ib - ia);
}

/* The portable exp costs ten libm fmaf calls per value: on the exhaustive ranges it runs on
 * one value in 13 (EXP_CHECK_EVERY), the other tables on all of them. */
#define EXP_CHECK_EVERY 13

static void *exp_sweep_run(void *arg) {
    exp_sweep *s = arg;
    enum { BLOCK = 4096 };
    float x[BLOCK], got[4][BLOCK]; /* got[0] also serves when only portable exists */
    for (uint64_t u = s->begin; u < s->end;) {
        size_t n = 0;
        for (; n < BLOCK && u < s->end; n++, u += s->stride) x[n] = from_bits((uint32_t)u);
        for (int t = 0; t < n_exp_tables; t++) {
            memcpy(got[t], x, n * sizeof *x);
            exp_tables[t]->exp_f32(got[t], n);
        }
        size_t every = s->measure ? EXP_CHECK_EVERY : 1;
        for (size_t i = 0; n_exp_tables && i < n; i += every) {
            float want = parity_expf(x[i]);
            for (int t = 0; t < n_exp_tables; t++)
                if (f32_bits(got[t][i]) != f32_bits(want)) s->off++;
        }
        if (!s->measure) continue;
        float *y = got[n_exp_tables ? n_exp_tables - 1 : 0];
        if (exp_measured == &kernels_portable) {
            memcpy(y, x, n * sizeof *x);
            kernels_portable.exp_f32(y, n);
        }
        for (size_t i = 0; i < n; i++) {
            /* Most floats of the range are tiny, and for |x| < 2^-25 exp(x) lies within
             * (1 - 2^-25, 1 + 2^-24 (1 - 2^-25)), strictly inside the rounding interval of
             * 1: the reference is 1 there (checked on a sample), which halves the test. */
            float ref;
            if (fabsf(x[i]) < 0x1p-25f) {
                ref = 1.0f;
                if ((f32_bits(x[i]) & 0xfffu) == 0 && (float)exp((double)x[i]) != 1.0f) s->off++;
            } else {
                ref = (float)exp((double)x[i]);
            }
            uint64_t d = ulp_distance(y[i], ref);
            s->n++;
            if (d == 0) s->exact++;
            if (d > s->max_ulp) s->max_ulp = d, s->worst = x[i];
        }
    }
    return NULL;
}

static void test_exp(const kernels *const *tables, int n_tables) {
    for (int t = 0; t < n_tables; t++) exp_tables[n_exp_tables++] = tables[t];
    exp_measured = n_tables ? tables[n_tables - 1] : &kernels_portable;

    /* Every fp32 in [-104, 89] (the two signs in two threads), and one pattern in 61 of the
     * rest (overflow, underflow, infinities, NaNs). The accuracy is measured on the last
     * table, which equals parity_expf wherever it is checked. With the portable table alone
     * (no SIMD here) one pattern in 8 of the range, to keep the test within its time; in
     * quick mode one in 61 everywhere. */
    const uint64_t pos_end = f32_bits(89.0f) + 1ull, neg_begin = 0x80000000ull,
                   neg_end = f32_bits(-104.0f) + 1ull;
    const uint32_t stride = quick() ? 61 : n_tables ? 1 : 8;
    exp_sweep sw[4] = {
        {0, pos_end, stride, 1, 0, 0, 0, 0, 0},
        {neg_begin, neg_end, stride, 1, 0, 0, 0, 0, 0},
        {pos_end, neg_begin, 61, 0, 0, 0, 0, 0, 0},
        {neg_end, 1ull << 32, 61, 0, 0, 0, 0, 0, 0},
    };
    pthread_t th;
    CHECK(pthread_create(&th, NULL, exp_sweep_run, &sw[1]) == 0);
    exp_sweep_run(&sw[0]);
    exp_sweep_run(&sw[2]);
    pthread_join(th, NULL);
    exp_sweep_run(&sw[3]);

    uint64_t n = sw[0].n + sw[1].n, exact = sw[0].exact + sw[1].exact;
    exp_sweep *w = sw[0].max_ulp >= sw[1].max_ulp ? &sw[0] : &sw[1];
    printf("parity_expf (%s) over %s %" PRIu64 " fp32 in [-104, 89] against "
           "(float)exp((double)x): max error %" PRIu64 " ulp (at %a), %.4f%% correctly rounded\n",
           exp_measured->name, stride == 1 ? "all" : "a sample of", n, w->max_ulp,
           (double)w->worst, 100.0 * (double)exact / (double)n);
    CHECK(w->max_ulp <= 1);
    CHECK_INT(sw[0].off + sw[1].off + sw[2].off + sw[3].off, 0);

    /* the edges, by hand */
    CHECK_INT(f32_bits(parity_expf(0.0f)), 0x3f800000u);
    CHECK_INT(f32_bits(parity_expf(-0.0f)), 0x3f800000u);
    CHECK_INT(f32_bits(parity_expf(-INFINITY)), 0u);
    CHECK_INT(f32_bits(parity_expf(INFINITY)), 0x7f800000u);
    CHECK(isnan(parity_expf(NAN)));
    CHECK_INT(f32_bits(parity_expf(0x1.62e42ep+6f)), f32_bits((float)exp(0x1.62e42ep+6)));
    CHECK_INT(f32_bits(parity_expf(0x1.62e430p+6f)), 0x7f800000u);     /* first inf */
    CHECK_INT(f32_bits(parity_expf(-0x1.9fe368p+6f)), 1u);             /* 2^-149 */
    CHECK_INT(f32_bits(parity_expf(-0x1.9fe36ap+6f)), 0u);             /* below: 0 */
    CHECK_INT(f32_bits(parity_expf(-100.0f)), f32_bits((float)exp(-100.0))); /* subnormal */
}

/* ---- GEMM ------------------------------------------------------------------------------- */

#define SENTINEL 0x4b1dcafeu /* finite: a stray write of a NaN would not match it */

/* One GEMM problem: x [M][K] (row stride ldx) and its packed form, bf16 and fp32 weights
 * [N][K] (row stride ldw), outputs [M][ldy]. */
typedef struct gemm_case {
    size_t M, K, N, ldx, ldw, ldy, row;
    float *x, *xp, *wf;
    uint16_t *w;
    int mode;
} gemm_case;

static void fill_sentinel(float *y, size_t n) {
    for (size_t i = 0; i < n; i++) y[i] = from_bits(SENTINEL);
}

/* A table's pair32 on bf16 x (pack_x_bf16, gemm_bf16xw): the pack refuses g's x, which is
 * not made of bf16 values, and packs x rounded to bf16 (specials kept) as the bf16 bits in
 * order, -0 past K, subnormals possibly as zeros of their sign; gemm_bf16xw on that gives
 * the specification's gemm_bf16w on the same rounded x, for the whole batch and for each
 * row alone. */
static void check_gemm_bf16xw(const gemm_case *g, const kernels *k, size_t n0, size_t n1,
                              float *y2, float *y3) {
    const size_t M = g->M, K = g->K, ldy = g->ldy, row = g->row;
    char what[96];
    uint16_t *xb = xmalloc(M * row * sizeof *xb);
    float *xr = xmalloc(M * g->ldx * sizeof *xr), *xrp = xmalloc(M * row * sizeof *xrp);
    float *y1 = xmalloc(M * ldy * sizeof *y1);
    int any_not_bf16 = 0;
    for (size_t m = 0; m < M; m++)
        for (size_t i = 0; i < K; i++) {
            const float v = g->x[m * g->ldx + i];
            any_not_bf16 |= (f32_bits(v) & 0xffffu) != 0;
            xr[m * g->ldx + i] = isnan(v) ? from_bits((f32_bits(v) & 0xffff0000u) | 0x00400000u)
                                          : round_bf16(v);
        }
    if (any_not_bf16) CHECK_INT(k->pack_x_bf16(K, g->x, g->ldx, xb, 0, M), 0);
    /* two calls over halves of the rows, as threads split them */
    CHECK_INT(k->pack_x_bf16(K, xr, g->ldx, xb, 0, M / 2), 1);
    CHECK_INT(k->pack_x_bf16(K, xr, g->ldx, xb, M / 2, M), 1);
    size_t bad = 0;
    for (size_t m = 0; m < M; m++)
        for (size_t i = 0; i < row; i++) {
            const uint16_t got = xb[m * row + i];
            const uint16_t want = i < K ? (uint16_t)(f32_bits(xr[m * g->ldx + i]) >> 16) : 0x8000u;
            const int zero_of_subnormal = (want & 0x7f80u) == 0 && got == (want & 0x8000u);
            const int nan = (want & 0x7fffu) > 0x7f80u && (got & 0x7fffu) > 0x7f80u;
            bad += got != want && !zero_of_subnormal && !nan;
        }
    if (bad) fprintf(stderr, "%s: pack_x_bf16 M=%zu K=%zu: %zu values wrong\n", k->name, M, K, bad);
    CHECK_INT(bad, 0);
    gemm_pack_x(M, K, xr, g->ldx, xrp);
    fill_sentinel(y1, M * ldy);
    kernels_portable.gemm_bf16w(M, K, xrp, g->w, g->ldw, y1, ldy, n0, n1);
    /* plain, then rounding in the store: round_bf16 over the computed columns afterwards, and
     * nothing else written */
    for (int rnd = 0; rnd < 2; rnd++) {
        if (rnd)
            for (size_t m = 0; m < M; m++) kernels_portable.round_bf16(y1 + m * ldy + n0, n1 - n0);
        fill_sentinel(y2, M * ldy), fill_sentinel(y3, M * ldy);
        k->gemm_bf16xw(M, K, xb, g->w, g->ldw, y2, ldy, n0, n1, rnd);
        snprintf(what, sizeof what, "gemm_bf16xw%s M=%zu [%zu,%zu)", rnd ? " rounded" : "", M,
                 n0, n1);
        check_f32(y1, y2, M * ldy, what, k->name, K, g->mode);
        for (size_t m = 0; m < M; m++)
            k->gemm_bf16xw(1, K, xb + m * row, g->w, g->ldw, y3 + m * ldy, ldy, n0, n1, rnd);
        snprintf(what, sizeof what, "gemm_bf16xw%s rows alone M=%zu [%zu,%zu)",
                 rnd ? " rounded" : "", M, n0, n1);
        check_f32(y1, y3, M * ldy, what, k->name, K, g->mode);
    }
    free(xb), free(xr), free(xrp), free(y1);
}

/* Which weights a GEMM check runs on: g's bf16 w (gemm_bf16w, pair32 on the packed x) or its
 * fp32 wf (gemm_f32w, dot16 on x). */
enum { BF16_W, F32_W };

/* Table k's GEMM on `which` weights for rows [m0, m0 + M) of g, into y (row stride g->ldy). */
static void run_gemm_w(const kernels *k, int which, const gemm_case *g, size_t m0, size_t M,
                       float *y, size_t n0, size_t n1) {
    if (which == F32_W)
        k->gemm_f32w(M, g->K, g->x + m0 * g->ldx, g->ldx, g->wf, g->ldw, y, g->ldy, n0, n1);
    else
        k->gemm_bf16w(M, g->K, g->xp + m0 * g->row, g->w, g->ldw, y, g->ldy, n0, n1);
}

/* The specification of that GEMM's output at row m, column n: the literal dot16 or pair32. */
static float spec_gemm_w(int which, const gemm_case *g, size_t m, size_t n) {
    if (which == F32_W) return spec_dot16(g->x + m * g->ldx, g->wf + n * g->ldw, g->K);
    return spec_pair32(g->x + m * g->ldx, g->w + n * g->ldw, g->K);
}

/* gemm_bf16w's large-M form on table k: its packing is the specification's, float for float,
 * and its outputs are gemm_bf16w's (y1); then gemm_bf16xw where the table has it. */
static void check_gemm_bf16w_tiles(const gemm_case *g, const kernels *k, size_t n0, size_t n1,
                                   const float *y1, float *y2, float *y3) {
    size_t M = g->M, K = g->K, ldy = g->ldy;
    char what[96];
    const size_t nxt = gemm_xt_floats(M, K), tiles = gemm_xt_tiles(M);
    float *xt = xmalloc(nxt * sizeof *xt), *xt_ref = xmalloc(nxt * sizeof *xt);
    float *panel = xmalloc(gemm_panel_floats(K) * sizeof *panel);
    fill_sentinel(xt, nxt), fill_sentinel(xt_ref, nxt);
    gemm_pack_xt_tiles(M, K, g->x, g->ldx, xt_ref, 0, tiles);
    k->pack_xt_tiles(M, K, g->x, g->ldx, xt, 0, tiles / 2);
    k->pack_xt_tiles(M, K, g->x, g->ldx, xt, tiles / 2, tiles);
    if (memcmp(xt, xt_ref, nxt * sizeof *xt) != 0)
        fprintf(stderr, "%s: pack_xt_tiles M=%zu K=%zu differs from the specification\n",
                k->name, M, K);
    CHECK(memcmp(xt, xt_ref, nxt * sizeof *xt) == 0);
    fill_sentinel(y3, M * ldy), fill_sentinel(panel, gemm_panel_floats(K));
    k->gemm_bf16w_tiles(M, K, xt, g->w, g->ldw, y3, ldy, n0, n1, panel);
    snprintf(what, sizeof what, "gemm_bf16w_tiles M=%zu [%zu,%zu)", M, n0, n1);
    check_f32(y1, y3, M * ldy, what, k->name, K, g->mode);
    free(xt), free(xt_ref), free(panel);
    if (k->gemm_bf16xw) check_gemm_bf16xw(g, k, n0, n1, y2, y3);
}

/* gemm_bf16w or gemm_f32w (`which`) over the columns [n0, n1): the portable kernel against
 * the literal specification, the columns outside untouched; every table against it, for the
 * whole batch and for each row alone (M = 1); for gemm_bf16w, the large-M form too. */
static void check_gemm_w(const gemm_case *g, int which, const kernels *const *tables,
                         int n_tables, size_t n0, size_t n1, float *y1, float *y2, float *y3) {
    const char *name = which == F32_W ? "gemm_f32w" : "gemm_bf16w";
    size_t M = g->M, K = g->K, ldy = g->ldy;
    char what[96];
    fill_sentinel(y1, M * ldy);
    run_gemm_w(&kernels_portable, which, g, 0, M, y1, n0, n1);
    for (size_t m = 0; m < M; m++)
        for (size_t n = 0; n < g->N; n++) {
            float want = n >= n0 && n < n1 ? spec_gemm_w(which, g, m, n) : from_bits(SENTINEL);
            snprintf(what, sizeof what, "%s literal M=%zu [%zu,%zu) m=%zu n=%zu", name, M, n0,
                     n1, m, n);
            check_f32(&want, &y1[m * ldy + n], 1, what, "portable", K, g->mode);
        }
    for (int t = 0; t < n_tables; t++) {
        fill_sentinel(y2, M * ldy), fill_sentinel(y3, M * ldy);
        run_gemm_w(tables[t], which, g, 0, M, y2, n0, n1);
        snprintf(what, sizeof what, "%s M=%zu [%zu,%zu)", name, M, n0, n1);
        check_f32(y1, y2, M * ldy, what, tables[t]->name, K, g->mode);
        for (size_t m = 0; m < M; m++) run_gemm_w(tables[t], which, g, m, 1, y3 + m * ldy, n0, n1);
        snprintf(what, sizeof what, "%s rows alone M=%zu [%zu,%zu)", name, M, n0, n1);
        check_f32(y2, y3, M * ldy, what, tables[t]->name, K, g->mode);
        if (which == BF16_W) check_gemm_bf16w_tiles(g, tables[t], n0, n1, y1, y2, y3);
    }
}

#if defined(PARITY_HAVE_AVX512BF16)
/* A bf16 value with a biased exponent in [lo, hi] (one in 16 is 0 or a subnormal: exponent
 * field 0), random sign and mantissa. */
static uint16_t rand_bf16_in(int lo, int hi) {
    const uint64_t r = rand_u64();
    const uint32_t e = r % 16 == 0 ? 0 : (uint32_t)(lo + (int)((r >> 8) % (uint64_t)(hi - lo + 1)));
    return (uint16_t)(((r >> 20) & 1) << 15 | e << 7 | ((r >> 24) & 0x7f));
}

/* The hardware fact pair32's denormal rule rests on: vdpbf16ps equals two of pair32's
 * flushed fmas (spec_fma_ftz), odd element first, lane by lane. Inputs are aimed at the
 * denormal range (products and accumulators near 2^-126) and spread over all exponents;
 * results compared bitwise, NaN payloads aside. */
__attribute__((target("avx512f,avx512bf16"))) static void test_vdpbf16ps_is_pair32(void) {
    static const int ranges[4][4] = {{0, 80, 0, 20}, {40, 90, 0, 10}, {60, 70, 0, 3}, {0, 255, 0, 255}};
    long lanes = 0, differ = 0, nan_payloads = 0;
    for (int it = 0; it < 400000; it++) {
        const int *rg = ranges[it % 4];
        uint32_t xa[16], wa[16], acc[16], out[16];
        for (int l = 0; l < 16; l++) {
            xa[l] = rand_bf16_in(rg[0], rg[1]) | (uint32_t)rand_bf16_in(rg[0], rg[1]) << 16;
            wa[l] = rand_bf16_in(rg[0], rg[1]) | (uint32_t)rand_bf16_in(rg[0], rg[1]) << 16;
            const uint32_t e = (uint32_t)rg[2] + (uint32_t)(rand_u64() % (uint64_t)(rg[3] - rg[2] + 1));
            acc[l] = ((uint32_t)rand_u64() & 0x807fffffu) | e << 23;
        }
        const __m512 r = _mm512_dpbf16_ps(_mm512_loadu_ps((const float *)acc),
                                          (__m512bh)_mm512_loadu_si512(xa),
                                          (__m512bh)_mm512_loadu_si512(wa));
        _mm512_storeu_ps((float *)out, r);
        for (int l = 0; l < 16; l++) {
            const float x0 = from_bits(xa[l] << 16), x1 = from_bits(xa[l] & 0xffff0000u);
            const float w0 = from_bits(wa[l] << 16), w1 = from_bits(wa[l] & 0xffff0000u);
            const float want = spec_fma_ftz(x0, w0, spec_fma_ftz(x1, w1, from_bits(acc[l])));
            lanes++;
            if (f32_bits(want) == out[l]) continue;
            if (isnan(want) && isnan(from_bits(out[l]))) {
                nan_payloads++;
                continue;
            }
            if (differ++ < 3)
                fprintf(stderr, "vdpbf16ps: acc 0x%08x x 0x%08x w 0x%08x: 0x%08x, pair32 0x%08x\n",
                        acc[l], xa[l], wa[l], out[l], f32_bits(want));
        }
    }
    printf("vdpbf16ps against pair32's two flushed fmas (odd element first): %ld lanes aimed at "
           "the denormal range, %ld differ (NaN payloads aside: %ld)\n", lanes, differ, nan_payloads);
    CHECK_INT(differ, 0);
}
#endif

/* pair32's denormal rule on hand-made pairs (K = 4: lane 0 takes k = 1 then 0, lane 1 takes
 * k = 3 then 2), each with the bits IEEE arithmetic without flushing would give, so that a
 * table that does not flush, flushes before rounding, or does not flush in the fold fails
 * here. */
static void test_pair32_denormals(const kernels *const *tables, int n_tables) {
    static const struct {
        const char *what;
        float x[4], w[4];
        uint32_t want, ieee;
    } cases[] = {
        /* 2^-126 - 0.75 * 2^-150: gradual underflow rounds it to 2^-126, 24 bits with an
         * unbounded exponent to 2^-126 - 2^-150, which is tiny */
        {"tiny after rounding", {-0x1.8p-76f, 0x1p-63f, 0, 0}, {0x1p-75f, 0x1p-63f, 0, 0},
         0x00000000u, 0x00800000u},
        /* 2^-126 - 2^-152 rounds to 2^-126 either way: not tiny, kept */
        {"2^-126 after rounding", {-0x1p-76f, 0x1p-63f, 0, 0}, {0x1p-76f, 0x1p-63f, 0, 0},
         0x00800000u, 0x00800000u},
        {"subnormal x", {0, 0x1p-133f, 0, 0}, {0, 0x1p100f, 0, 0}, 0x00000000u, 0x2f000000u},
        {"subnormal bf16 w", {0, 0x1p100f, 0, 0}, {0, 0x1p-130f, 0, 0}, 0x00000000u,
         0x30800000u},
        /* the odd product 2^-130 is flushed before the even one (2^-126) joins it */
        {"subnormal accumulator", {0x1p-63f, 0x1p-65f, 0, 0}, {0x1p-63f, 0x1p-65f, 0, 0},
         0x00800000u, 0x00880000u},
        /* lanes 2^-125 and -1.5 * 2^-126 meet in the fold's last add: 2^-127, flushed */
        {"subnormal fold", {0, 0x1p-62f, 0, -0x1.8p-63f}, {0, 0x1p-63f, 0, 0x1p-63f},
         0x00000000u, 0x00400000u},
        /* -2^-140 flushed to -0, which the fold's adds with the +0 lanes make +0 */
        {"negative tiny result", {0x1p-70f, 0, 0, 0}, {-0x1p-70f, 0, 0, 0}, 0x00000000u,
         0x80000200u},
    };
    const size_t K = 4, n_cases = sizeof cases / sizeof cases[0];
    float xp[32], y, xt[GEMM_XT_ROWS * 32];
    uint16_t xb[32];
    float *panel = xmalloc(gemm_panel_floats(K) * sizeof *panel);
    for (size_t i = 0; i < n_cases; i++) {
        uint16_t w[4];
        for (size_t k = 0; k < K; k++) {
            w[k] = bf16_from_f32(cases[i].w[k]);
            CHECK_INT(f32_bits(bf16_to_f32(w[k])), f32_bits(cases[i].w[k])); /* exact bf16 */
        }
        const float ieee = fmaf(cases[i].x[2], cases[i].w[2], fmaf(cases[i].x[3], cases[i].w[3], 0))
                         + fmaf(cases[i].x[0], cases[i].w[0], fmaf(cases[i].x[1], cases[i].w[1], 0));
        CHECK_INT(f32_bits(ieee), cases[i].ieee);
        CHECK_INT(f32_bits(spec_pair32(cases[i].x, w, K)), cases[i].want);
        gemm_pack_x(1, K, cases[i].x, K, xp);
        gemm_pack_xt_tiles(1, K, cases[i].x, K, xt, 0, 1);
        for (int t = -1; t < n_tables; t++) {
            const kernels *k = t < 0 ? &kernels_portable : tables[t];
            char what[96];
            snprintf(what, sizeof what, "pair32 denormals, gemm_bf16w: %s", cases[i].what);
            const float want = from_bits(cases[i].want);
            k->gemm_bf16w(1, K, xp, w, K, &y, 1, 0, 1);
            check_f32(&want, &y, 1, what, k->name, K, FINITE_SPECIALS);
            snprintf(what, sizeof what, "pair32 denormals, gemm_bf16w_tiles: %s", cases[i].what);
            k->gemm_bf16w_tiles(1, K, xt, w, K, &y, 1, 0, 1, panel);
            check_f32(&want, &y, 1, what, k->name, K, FINITE_SPECIALS);
            if (!k->gemm_bf16xw) continue;
            snprintf(what, sizeof what, "pair32 denormals, gemm_bf16xw: %s", cases[i].what);
            CHECK_INT(k->pack_x_bf16(K, cases[i].x, K, xb, 0, 1), 1);
            k->gemm_bf16xw(1, K, xb, w, K, &y, 1, 0, 1, 0);
            check_f32(&want, &y, 1, what, k->name, K, FINITE_SPECIALS);
            snprintf(what, sizeof what, "pair32 denormals, gemm_bf16xw rounded: %s", cases[i].what);
            float want_rounded = want;
            kernels_portable.round_bf16(&want_rounded, 1);
            k->gemm_bf16xw(1, K, xb, w, K, &y, 1, 0, 1, 1);
            check_f32(&want_rounded, &y, 1, what, k->name, K, FINITE_SPECIALS);
        }
    }
    free(panel);
}

/* One GEMM shape under one value mode, over the given column ranges [n0, n1). */
static void gemm_shape(const kernels *const *tables, int n_tables, size_t M, size_t K, size_t N,
                       int mode, const size_t (*ranges)[2], size_t n_ranges) {
    gemm_case g;
    g.M = M, g.K = K, g.N = N, g.mode = mode;
    /* odd strides; for odd K the weight rows are packed tight */
    g.ldx = g.K + 3, g.ldw = g.K + (g.K % 2 ? 0 : 5), g.ldy = g.N + 2;
    g.row = gemm_packed_row(g.K);
    /* exactly what the rows need: the last row ends at the allocation's end */
    size_t nx = (g.M - 1) * g.ldx + g.K, nw = (g.N - 1) * g.ldw + g.K;
    g.x = xmalloc(nx * sizeof *g.x), g.xp = xmalloc(g.M * g.row * sizeof *g.xp);
    g.w = xmalloc(nw * sizeof *g.w), g.wf = xmalloc(nw * sizeof *g.wf);
    float *y1 = xmalloc(g.M * g.ldy * sizeof *y1);
    float *y2 = xmalloc(g.M * g.ldy * sizeof *y2);
    float *y3 = xmalloc(g.M * g.ldy * sizeof *y3);
    fill_f32(g.x, nx, mode, 1.0f);
    fill_bf16(g.w, nw, mode, 0.05f);
    fill_f32(g.wf, nw, mode, 0.05f);
    gemm_pack_x(g.M, g.K, g.x, g.ldx, g.xp);
    for (size_t ri = 0; ri < n_ranges; ri++) {
        size_t n0 = ranges[ri][0], n1 = ranges[ri][1];
        check_gemm_w(&g, BF16_W, tables, n_tables, n0, n1, y1, y2, y3);
        check_gemm_w(&g, F32_W, tables, n_tables, n0, n1, y1, y2, y3);
    }
    free(g.x), free(g.xp), free(g.w), free(g.wf), free(y1), free(y2), free(y3);
}

static void test_gemm(const kernels *const *tables, int n_tables) {
    static const size_t Ms[] = {1, 2, 3, 5, 8, 9, 13, 16, 17};
    /* 4097 with M = 13 spans two row blocks of the AVX2 kernel */
    static const size_t Ks[] = {0, 1, 7, 31, 32, 33, 64, 100, 257, 1000, 4097};
    /* column ranges [n0, n1) of N = 11: all, odd bounds, one column, empty */
    static const size_t ranges[][2] = {{0, 11}, {1, 10}, {3, 8}, {5, 6}, {7, 11}, {4, 4}};
    for (size_t mi = 0; mi < sizeof Ms / sizeof Ms[0]; mi++)
        for (size_t ki = 0; ki < sizeof Ks / sizeof Ks[0]; ki++)
            for (int mode = 0; mode < N_MODES; mode++)
                gemm_shape(tables, n_tables, Ms[mi], Ks[ki], 11, mode, ranges,
                           sizeof ranges / sizeof ranges[0]);
    /* larger shapes: several blocks of x rows (of K chunks, of output columns) in the AVX2
     * kernels' prefill path, and row tiles of every height */
    static const size_t big_Ms[] = {4, 40, 100}, big_Ks[] = {33, 1000, 4097};
    /* (the AVX2 large-M path: 40 and 100 rows are 3 and 7 tiles of 16, the last partial;
     * 70 columns are 11 tiles of 6 and 4 columns left) */
    static const size_t big_ranges[][2] = {{0, 70}, {5, 67}};
    for (size_t mi = 0; mi < 3; mi++)
        for (size_t ki = 0; ki < 3; ki++)
            gemm_shape(tables, n_tables, big_Ms[mi], big_Ks[ki], 70, 0, big_ranges, 2);

    /* a decode step's row against many columns (the tables' row-after-row M = 1 paths
     * take 16 weight rows at a time), every value mode */
    static const size_t wide_ranges[][2] = {{0, 40}, {3, 37}};
    static const size_t wide_Ks[] = {31, 1000};
    for (size_t ki = 0; ki < 2; ki++)
        for (int mode = 0; mode < N_MODES; mode++)
            gemm_shape(tables, n_tables, 1, wide_Ks[ki], 40, mode, wide_ranges, 2);

    /* the packed layout itself */
    float x[35], xp[64];
    for (int i = 0; i < 35; i++) x[i] = (float)(i + 1);
    gemm_pack_x(1, 35, x, 35, xp);
    CHECK(xp[0] == 1.0f && xp[1] == 3.0f && xp[15] == 31.0f && xp[16] == 2.0f && xp[31] == 32.0f);
    CHECK(xp[32] == 33.0f && xp[33] == 35.0f && xp[34] == 0.0f && xp[48] == 34.0f);
    CHECK(xp[49] == 0.0f && xp[63] == 0.0f);
}

/* ---- regions ---------------------------------------------------------------------------- */

/* Every combination of the switches the region kernels read. */
/* Every combination of the region switches under each compute (bf16, fp32, fp16). */
#define N_POLICIES 96
static parity_policy policy_variant(int v) {
    parity_policy p;
    memset(&p, 0, sizeof p);
    p.compute = (uint8_t)(v % 3);
    const int b = v / 3;
    p.norm_input = (uint8_t)(b & 1);
    p.norm_weight = (uint8_t)(b >> 1 & 1);
    p.qk_norm = (uint8_t)(b >> 2 & 1);
    p.rope_apply = (uint8_t)(b >> 3 & 1);
    p.swiglu = (uint8_t)(b >> 4 & 1);
    return p;
}

/* A RoPE table value as the forward holds it under a policy with a rounded table. */
static float table_value(const parity_policy *pol, float x) {
    return pol->compute == PARITY_COMPUTE_BF16   ? round_bf16(x)
           : pol->compute == PARITY_COMPUTE_FP16 ? round_fp16(x)
                                                 : x;
}

/* The 16-bit buffers of a policy hold fp16 patterns under PARITY_COMPUTE_FP16, else bf16. */
static int fp16_buffers(const parity_policy *pol) { return pol->compute == PARITY_COMPUTE_FP16; }
static float load16(const parity_policy *pol, uint16_t h) {
    return fp16_buffers(pol) ? f16_to_f32(h) : bf16_to_f32(h);
}
static uint16_t store16(const parity_policy *pol, float x) {
    return fp16_buffers(pol) ? f16_from_f32(x) : bf16_from_f32(x);
}

/* bf16 patterns of x[0..n) as fp16 patterns of the same values (rounded where they do not
 * fit; a NaN stays a NaN, its payload kept where it can be). */
static void bf16_to_fp16_patterns(const uint16_t *x, size_t n, uint16_t *out) {
    for (size_t i = 0; i < n; i++) {
        float v = bf16_to_f32(x[i]);
        out[i] = isnan(v) ? (uint16_t)(0x7c00u | (x[i] & 0x8000u) | 0x200u | (x[i] & 0x3fu))
                          : f16_from_f32(v);
    }
}

static void test_regions_f32(const kernels *t) {
    const kernels *p = &kernels_portable;
    for (size_t si = 0; si < n_sizes; si++) {
        size_t n = sizes[si];
        float *d = floats(n), *res = floats(n), *w = floats(n), *u = floats(n);
        float *r1 = floats(n), *r2 = floats(n), *o1 = floats(n), *o2 = floats(n);
        for (int mode = 0; mode < N_MODES; mode++) {
            /* bf16 values most of the time (what the forward passes), raw fp32 sometimes */
            void (*fill)(float *, size_t, int, float) = si % 3 ? fill_f32_bf16 : fill_f32;
            fill(d, n, mode, 1.0f), fill(res, n, mode, 3.0f), fill(w, n, mode, 1.0f);
            fill(u, n, mode, 1.0f);
            float eps = si % 2 ? 1e-6f : 1e-5f;
            for (int v = 0; v < N_POLICIES; v++) {
                parity_policy pol = policy_variant(v);
                char what[64];

                memcpy(r1, res, n * sizeof *res), memcpy(r2, res, n * sizeof *res);
                p->rmsnorm_residual(&pol, n, d, r1, w, eps, o1);
                t->rmsnorm_residual(&pol, n, d, r2, w, eps, o2);
                snprintf(what, sizeof what, "rmsnorm_residual policy %d", v);
                check_f32(r1, r2, n, what, t->name, n, mode);
                check_f32(o1, o2, n, what, t->name, n, mode);
                /* out aliasing delta */
                memcpy(r2, res, n * sizeof *res), memcpy(o2, d, n * sizeof *d);
                t->rmsnorm_residual(&pol, n, o2, r2, w, eps, o2);
                snprintf(what, sizeof what, "rmsnorm_residual out=delta policy %d", v);
                check_f32(o1, o2, n, what, t->name, n, mode);

                for (int qk = 0; qk < 2; qk++) {
                    p->rmsnorm(&pol, qk, n, res, w, eps, o1);
                    memcpy(o2, res, n * sizeof *res);
                    t->rmsnorm(&pol, qk, n, o2, w, eps, o2); /* in place */
                    snprintf(what, sizeof what, "rmsnorm qk=%d policy %d", qk, v);
                    check_f32(o1, o2, n, what, t->name, n, mode);
                }

                /* gate of a wider range, so that exp over- and underflows */
                for (size_t i = 0; i < n; i++) r1[i] = d[i] * 12.0f;
                p->swiglu(&pol, n, r1, u, o1);
                memcpy(o2, u, n * sizeof *u);
                t->swiglu(&pol, n, r1, o2, o2); /* out aliasing up */
                snprintf(what, sizeof what, "swiglu policy %d", v);
                check_f32(o1, o2, n, what, t->name, n, mode);

                if (n % 2 == 0) {
                    /* n = n_heads * hd for the heads that divide it: hd = n, n/2 */
                    for (size_t heads = 1; heads <= 2 && n % (2 * heads) == 0; heads++) {
                        size_t hd = n / heads;
                        memcpy(o1, res, n * sizeof *res), memcpy(o2, res, n * sizeof *res);
                        /* cos/sin: hd/2 values of [-1, 1] (d and w reused as tables) */
                        for (size_t i = 0; i < hd / 2; i++) {
                            r1[i] = table_value(&pol, cosf(d[i]));
                            r2[i] = table_value(&pol, sinf(d[i]));
                            if (mode == ALL_SPECIALS && i % 7 == 3) r2[i] = special_value(mode);
                        }
                        p->rope(&pol, heads, hd, o1, r1, r2);
                        t->rope(&pol, heads, hd, o2, r1, r2);
                        snprintf(what, sizeof what, "rope heads=%zu policy %d", heads, v);
                        check_f32(o1, o2, n, what, t->name, n, mode);
                    }
                }
            }
        }
        free(d), free(res), free(w), free(r1), free(r2), free(o1), free(o2), free(u);
    }
}

static void test_regions_bf16(const kernels *t) {
    const kernels *p = &kernels_portable;
    for (size_t si = 0; si < n_sizes; si++) {
        size_t n = sizes[si];
        uint16_t *d = xmalloc(n * 2), *res = xmalloc(n * 2), *w = xmalloc(n * 2);
        uint16_t *r1 = xmalloc(n * 2), *r2 = xmalloc(n * 2);
        uint16_t *o1 = xmalloc(n * 2), *o2 = xmalloc(n * 2);
        uint16_t *g = xmalloc(n * 2);
        /* the same values as fp16 patterns, for the fp16 policies */
        uint16_t *d16 = xmalloc(n * 2), *res16 = xmalloc(n * 2), *w16 = xmalloc(n * 2);
        uint16_t *g16 = xmalloc(n * 2);
        float *cs = xmalloc(n / 2 * sizeof *cs + 4), *sn = xmalloc(n / 2 * sizeof *sn + 4);
        for (int mode = 0; mode < N_MODES; mode++) {
            fill_bf16(d, n, mode, 1.0f), fill_bf16(res, n, mode, 3.0f), fill_bf16(w, n, mode, 1.0f);
            fill_bf16(g, n, mode, 5.0f);
            bf16_to_fp16_patterns(d, n, d16), bf16_to_fp16_patterns(res, n, res16);
            bf16_to_fp16_patterns(w, n, w16), bf16_to_fp16_patterns(g, n, g16);
            uint16_t *const bf[4] = {d, res, w, g};
            float eps = 1e-6f;
            for (int v = 0; v < N_POLICIES; v++) {
                parity_policy pol = policy_variant(v);
                char what[64];
                if (fp16_buffers(&pol)) d = d16, res = res16, w = w16, g = g16;
                else d = bf[0], res = bf[1], w = bf[2], g = bf[3];

                p->rmsnorm_residual_16(&pol, n, d, res, w, eps, r1, o1);
                t->rmsnorm_residual_16(&pol, n, d, res, w, eps, r2, o2);
                snprintf(what, sizeof what, "rmsnorm_residual_16 policy %d", v);
                check_bf16(r1, r2, n, what, t->name, n, mode);
                check_bf16(o1, o2, n, what, t->name, n, mode);
                /* residual_out aliasing residual, out aliasing delta */
                memcpy(r2, res, n * 2), memcpy(o2, d, n * 2);
                t->rmsnorm_residual_16(&pol, n, o2, r2, w, eps, r2, o2);
                snprintf(what, sizeof what, "rmsnorm_residual_16 aliased policy %d", v);
                check_bf16(r1, r2, n, what, t->name, n, mode);
                check_bf16(o1, o2, n, what, t->name, n, mode);

                for (int qk = 0; qk < 2; qk++) {
                    p->rmsnorm_16(&pol, qk, n, res, w, eps, o1);
                    memcpy(o2, res, n * 2);
                    t->rmsnorm_16(&pol, qk, n, o2, w, eps, o2);
                    snprintf(what, sizeof what, "rmsnorm_16 qk=%d policy %d", qk, v);
                    check_bf16(o1, o2, n, what, t->name, n, mode);
                }

                p->swiglu_16(&pol, n, g, d, o1);
                memcpy(o2, g, n * 2);
                t->swiglu_16(&pol, n, o2, d, o2); /* out aliasing gate */
                snprintf(what, sizeof what, "swiglu_16 policy %d", v);
                check_bf16(o1, o2, n, what, t->name, n, mode);

                if (n % 2 == 0) {
                    for (size_t heads = 1; heads <= 3; heads++) {
                        if (n % (2 * heads)) continue;
                        size_t hd = n / heads;
                        for (size_t i = 0; i < hd / 2; i++) {
                            float a = load16(&pol, g[i]);
                            cs[i] = table_value(&pol, cosf(a));
                            sn[i] = table_value(&pol, sinf(a));
                        }
                        memcpy(o1, res, n * 2), memcpy(o2, res, n * 2);
                        p->rope_16(&pol, heads, hd, o1, cs, sn);
                        t->rope_16(&pol, heads, hd, o2, cs, sn);
                        snprintf(what, sizeof what, "rope_16 heads=%zu policy %d", heads, v);
                        check_bf16(o1, o2, n, what, t->name, n, mode);
                    }
                }
            }
            d = bf[0], res = bf[1], w = bf[2], g = bf[3];
        }
        free(d), free(res), free(w), free(r1), free(r2), free(o1), free(o2), free(g);
        free(d16), free(res16), free(w16), free(g16);
        free(cs), free(sn);
    }
}

/* The portable region kernels against kernels.h's formulas, transcribed once more. */
static float rnd(int fmt, float x) { return fmt == 1 ? round_bf16(x) : fmt == 2 ? round_fp16(x) : x; }

static void test_region_formulas(void) {
    const size_t n = 37, hd = 10;
    uint16_t bd[37], bres[37], bw[37], bg[37], hd_[37], hres[37], hw[37], hg[37], r1[37], o1[37];
    float cs[5], sn[5];
    fill_bf16(bd, n, PLAIN, 1.0f), fill_bf16(bres, n, PLAIN, 3.0f), fill_bf16(bw, n, PLAIN, 1.0f);
    fill_bf16(bg, n, PLAIN, 4.0f);
    bf16_to_fp16_patterns(bd, n, hd_), bf16_to_fp16_patterns(bres, n, hres);
    bf16_to_fp16_patterns(bw, n, hw), bf16_to_fp16_patterns(bg, n, hg);
    for (int v = 0; v < N_POLICIES; v++) {
        parity_policy pol = policy_variant(v);
        /* the format every rounding point rounds to: none, bf16 or fp16 */
        const int f = pol.compute == PARITY_COMPUTE_BF16 ? 1 : pol.compute == PARITY_COMPUTE_FP16 ? 2 : 0;
        const int h = fp16_buffers(&pol);
        const uint16_t *d = h ? hd_ : bd, *res = h ? hres : bres, *w = h ? hw : bw, *g = h ? hg : bg;
        size_t bad = 0;

        kernels_portable.rmsnorm_residual_16(&pol, n, d, res, w, 1e-6f, r1, o1);
        float s[37], acc[16] = {0};
        const int rounded_in = pol.norm_input == PARITY_NORM_INPUT_ROUNDED ? f : 0;
        for (size_t i = 0; i < n; i++) {
            s[i] = load16(&pol, res[i]) + load16(&pol, d[i]);
            float x = rnd(rounded_in, s[i]);
            acc[i % 16] = fmaf(x, x, acc[i % 16]);
        }
        float r = 1.0f / sqrtf(spec_fold(acc) / (float)n + 1e-6f);
        for (size_t i = 0; i < n; i++) {
            float x = rnd(rounded_in, s[i]);
            float wi = load16(&pol, w[i]);
            float o = f && pol.norm_weight == PARITY_NORM_ROUND_TWICE ? wi * rnd(f, x * r)
                                                                       : wi * (x * r);
            bad += r1[i] != store16(&pol, s[i]) || o1[i] != store16(&pol, o);
        }

        kernels_portable.swiglu_16(&pol, n, g, d, o1);
        for (size_t i = 0; i < n; i++) {
            float gi = load16(&pol, g[i]), ui = load16(&pol, d[i]);
            float silu = gi / (1.0f + parity_expf(-gi));
            float o = f && pol.swiglu == PARITY_SWIGLU_PER_OP ? rnd(f, silu) * ui : silu * ui;
            bad += o1[i] != store16(&pol, o);
        }

        for (size_t i = 0; i < hd / 2; i++) {
            cs[i] = table_value(&pol, cosf((float)i));
            sn[i] = table_value(&pol, sinf((float)i));
        }
        memcpy(o1, res, 3 * hd * 2);
        kernels_portable.rope_16(&pol, 3, hd, o1, cs, sn);
        const int per_op = pol.rope_apply == PARITY_ROPE_PER_OP ? f : 0;
        for (size_t hh = 0; hh < 3; hh++)
            for (size_t i = 0; i < hd / 2; i++) {
                float a = load16(&pol, res[hh * hd + i]), b = load16(&pol, res[hh * hd + i + hd / 2]);
                float x0 = rnd(per_op, rnd(per_op, a * cs[i]) - rnd(per_op, b * sn[i]));
                float x1 = rnd(per_op, rnd(per_op, b * cs[i]) + rnd(per_op, a * sn[i]));
                bad += o1[hh * hd + i] != store16(&pol, x0);
                bad += o1[hh * hd + i + hd / 2] != store16(&pol, x1);
            }
        if (bad) fprintf(stderr, "region formulas, policy %d: %zu values differ\n", v, bad);
        CHECK_INT(bad, 0);
    }
}

/* ---- the public region API on every CPU path -------------------------------------------- */

static void run_public_regions(const parity_policy *pol, uint16_t *out, size_t rows, size_t dim,
                               const uint16_t *a, const uint16_t *b, const uint16_t *w,
                               const int32_t *pos) {
    size_t st = dim + 3; /* strides past the row: the gap must stay untouched */
    uint16_t *o = out;
    CHECK_OK(parity_rmsnorm_residual(pol, rows, dim, a, st, b, st, w, 1e-6f, o, st,
                                     o + rows * st, st));
    o += 2 * rows * st;
    for (int qk = 0; qk < 2; qk++, o += rows * st) {
        memcpy(o, b, rows * st * 2);
        CHECK_OK(parity_rmsnorm(pol, qk, rows, dim, o, st, w, 1e-6f, o, st));
    }
    memcpy(o, b, rows * st * 2);
    CHECK_OK(parity_swiglu(pol, rows, dim, a, st, o, st, o, st));
    o += rows * st;
    memcpy(o, b, rows * st * 2);
    CHECK_OK(parity_rope(pol, rows, 2, dim / 2, o, st, pos, 1e6));
}

static void test_public_paths(int have_avx2, int have_avx512) {
    const size_t rows = 5, dim = 300, st = dim + 3, total = 6 * rows * st;
    uint16_t *a = xmalloc(rows * st * 2), *b = xmalloc(rows * st * 2), *w = xmalloc(dim * 2);
    uint16_t *o1 = xmalloc(total * 2), *o2 = xmalloc(total * 2);
    int32_t pos[5] = {0, 1, 17, 4095, 40000};
    fill_bf16(a, rows * st, PLAIN, 2.0f), fill_bf16(b, rows * st, PLAIN, 1.0f);
    fill_bf16(w, dim, PLAIN, 1.0f);
    const char *const *presets = parity_policy_preset_names();
    const char *names[16];
    size_t n_names = 0;
    for (; presets[n_names] && n_names < 12; n_names++) names[n_names] = presets[n_names];
    names[n_names++] = "hf-eager+fp16", names[n_names++] = "vllm+fp16";
    names[n_names++] = "sglang+fp16", names[n_names] = NULL;
    for (size_t i = 0; names[i]; i++) {
        parity_policy pol;
        CHECK_OK(parity_policy_from_name(names[i], &pol));
        memset(o1, 0xab, total * 2), memset(o2, 0xab, total * 2);
        CHECK_OK(parity_set_cpu_path(PARITY_CPU_PORTABLE));
        CHECK_INT(parity_get_cpu_path(), PARITY_CPU_PORTABLE);
        run_public_regions(&pol, o1, rows, dim, a, b, w, pos);
        if (!have_avx2) continue;
        CHECK_OK(parity_set_cpu_path(PARITY_CPU_AVX2));
        CHECK_INT(parity_get_cpu_path(), PARITY_CPU_AVX2);
        run_public_regions(&pol, o2, rows, dim, a, b, w, pos);
        check_bf16(o1, o2, total, names[i], "public API, avx2", dim, PLAIN);
        if (!have_avx512) continue;
        memset(o2, 0xab, total * 2);
        CHECK_OK(parity_set_cpu_path(PARITY_CPU_AVX512));
        CHECK_INT(parity_get_cpu_path(), PARITY_CPU_AVX512);
        run_public_regions(&pol, o2, rows, dim, a, b, w, pos);
        check_bf16(o1, o2, total, names[i], "public API, avx512", dim, PLAIN);
    }
    free(a), free(b), free(w), free(o1), free(o2);
}

int main(void) {
    make_sizes();
    CHECK(strcmp(parity_cpu_path_name(PARITY_CPU_PORTABLE), "portable") == 0);
    CHECK(strcmp(parity_cpu_path_name(PARITY_CPU_AVX2), "avx2") == 0);
    CHECK(strcmp(parity_cpu_path_name(PARITY_CPU_AVX512), "avx512") == 0);
    CHECK(strcmp(parity_cpu_path_name(PARITY_CPU_AVX512BF16), "avx512bf16") == 0);
    CHECK_STATUS(parity_set_cpu_path((parity_cpu_path)7), PARITY_ERR_INVALID_ARGUMENT);

    const kernels *tables[4];
    int n_tables = 0, have_avx2 = 0, have_avx512 = 0;
#if defined(PARITY_HAVE_AVX2)
    if (parity_set_cpu_path(PARITY_CPU_AVX2) == PARITY_OK) {
        tables[n_tables++] = kernel_table(PARITY_CPU_AVX2);
        have_avx2 = 1;
    } else {
        printf("avx2: not supported here (%s): only the portable table is tested\n",
               parity_last_error());
    }
#else
    CHECK_STATUS(parity_set_cpu_path(PARITY_CPU_AVX2), PARITY_ERR_UNSUPPORTED);
#endif
#if defined(PARITY_HAVE_AVX512)
    if (parity_set_cpu_path(PARITY_CPU_AVX512) == PARITY_OK) {
        tables[n_tables++] = kernel_table(PARITY_CPU_AVX512);
        have_avx512 = 1;
    } else {
        printf("avx512: not supported here (%s): not tested\n", parity_last_error());
    }
#else
    CHECK_STATUS(parity_set_cpu_path(PARITY_CPU_AVX512), PARITY_ERR_UNSUPPORTED);
#endif
#if defined(PARITY_HAVE_AVX512BF16)
    if (parity_set_cpu_path(PARITY_CPU_AVX512BF16) == PARITY_OK)
        tables[n_tables++] = kernel_table(PARITY_CPU_AVX512BF16);
    else
        printf("avx512bf16: not supported here (%s): not tested\n", parity_last_error());
#else
    CHECK_STATUS(parity_set_cpu_path(PARITY_CPU_AVX512BF16), PARITY_ERR_UNSUPPORTED);
#endif

    test_portable_orders();
    test_region_formulas();
    for (int t = 0; t < n_tables; t++) {
        test_vector_kernels(tables[t]);
        test_regions_f32(tables[t]);
        test_regions_bf16(tables[t]);
    }
    test_gemm(tables, n_tables);
    test_pair32_denormals(tables, n_tables);
    test_attention_bf16_values(tables, n_tables);
    test_attention_cancellations(tables, n_tables);
#if defined(PARITY_HAVE_AVX512BF16)
    if (parity_set_cpu_path(PARITY_CPU_AVX512BF16) == PARITY_OK) test_vdpbf16ps_is_pair32();
#endif
    test_negative_zero_sums(tables, n_tables);
    test_max_zeros(tables, n_tables);
    test_public_paths(have_avx2, have_avx512);
    test_exp(tables, n_tables);

    printf("tables tested against portable:");
    for (int t = 0; t < n_tables; t++) printf(" %s", tables[t]->name);
    printf("%s; NaN outputs with another payload (allowed): %ld\n", n_tables ? "" : " none",
           nan_payload_diffs);
    return check_report("test_kernels");
}
