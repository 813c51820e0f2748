/*
 * The quantized formats' SIMD variants (quant/format.h, QUANT_SIMD_*) against their portable
 * entries, the specification, bit for bit: every rule's activation quantizer on rows holding
 * zero, tie, NaN, infinite, saturating, tiny and denormal blocks, at odd lengths and partial
 * blocks; every format's GEMM column kernel over decode (few rows) and prefill (many rows)
 * shapes, odd K, partial blocks, NaN activations, column ranges that start and end anywhere,
 * writing nothing outside them; ternary's GEMM also past one row block of its SIMD kernels and
 * on extreme codes up to and past the longest rows they sum in int32; the FP8 GEMMs on codes and
 * scales written directly (every code, zero, NaN, saturated and subnormal blocks, extreme block
 * scales) at one row and a few. Also which entry each
 * CPU path runs (the fallback from a variant a format lacks to the next narrower one, then the
 * portable entry).
 *
 * Equality is bitwise, with one allowance on fp32 outputs: two NaNs are equal whatever their
 * payloads, as in test_kernels. Arrays are allocated at their exact size, so that a read or
 * write past the end shows under AddressSanitizer.
 */
#include <math.h>

#include "check.h"
#include "base/floats.h"
#include "kernels/kernels.h"
#include "quant/codecs.h"
#include "quant/dot.h"
#include "quant/quant_weight.h"
#include "quant/rules.h"

/* ---- random inputs ------------------------------------------------------------------------ */

static uint64_t rng = 0x2545f4914f6cdd1dull;

static uint64_t rand_u64(void) {
    uint64_t z = (rng += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static double rand_unit(void) { return (double)(rand_u64() >> 11) * 0x1p-53; }

static float rand_normal(void) {
    const double u = rand_unit() + 0x1p-60, v = rand_unit();
    return (float)(sqrt(-2.0 * log(u)) * cos(6.283185307179586 * v));
}

/* The largest element value of format f (E4M3 448, E2M1 6, ternary activations 127). */
static float element_max(const quant_format *f) {
    return f->element == QUANT_ELEMENT_E4M3 ? 448.0f : f->element == QUANT_ELEMENT_E2M1 ? 6.0f
                                                                                        : 127.0f;
}

/* A value halfway between two neighbouring elements of format f, at unit scale: a tie for a
 * block whose scale comes out as 1 (its largest value the element maximum). */
static float element_tie(const quant_format *f) {
    static const float e2m1_ties[] = {0.25f, 0.75f, 1.25f, 1.75f, 2.5f, 3.5f, 5.0f};
    if (f->element == QUANT_ELEMENT_E2M1) return e2m1_ties[rand_u64() % 7];
    if (f->element == QUANT_ELEMENT_TERNARY) return (float)(rand_u64() % 127) + 0.5f;
    /* E4M3: a random code's value plus half its spacing (3 mantissa bits) */
    const int e = (int)(rand_u64() % 14) - 6;
    const float m = 8.0f + (float)(rand_u64() % 8);
    return ldexpf(m + 0.5f, e - 3);
}

/* The kinds of block written into a row. */
enum {
    BLOCK_NORMAL,    /* gaussian, with a random magnitude per block */
    BLOCK_ZERO,      /* every value +0 or -0 */
    BLOCK_TIES,      /* midpoints of the element grid, the block's scale a power of two */
    BLOCK_NAN,       /* gaussian with one NaN */
    BLOCK_INF,       /* gaussian with one infinity */
    BLOCK_HUGE,      /* near FLT_MAX: scales saturate */
    BLOCK_TINY,      /* denormals and values near them */
    BLOCK_OUTLIER,   /* gaussian and one value 10^4 times larger */
    BLOCK_KINDS
};

/* Fills n values of one block of kind `kind` for format f. */
static void fill_block(const quant_format *f, int kind, float *x, size_t n) {
    const float mag = ldexpf(1.0f, (int)(rand_u64() % 40) - 20);
    const float pow2 = ldexpf(1.0f, (int)(rand_u64() % 20) - 10);
    for (size_t i = 0; i < n; i++) {
        switch (kind) {
        case BLOCK_ZERO:
            x[i] = rand_u64() & 1 ? -0.0f : 0.0f;
            break;
        case BLOCK_TIES:
            x[i] = (rand_u64() & 1 ? -1.0f : 1.0f) * element_tie(f) * pow2;
            break;
        case BLOCK_HUGE:
            x[i] = rand_normal() * 1e38f;
            break;
        case BLOCK_TINY:
            x[i] = rand_normal() * 1e-39f;
            break;
        default:
            x[i] = rand_normal() * mag;
        }
    }
    const size_t at = (size_t)(rand_u64() % n);
    if (kind == BLOCK_TIES) x[at] = element_max(f) * pow2; /* the block's scale: pow2 */
    if (kind == BLOCK_NAN) x[at] = NAN;
    if (kind == BLOCK_INF) x[at] = rand_u64() & 1 ? -INFINITY : INFINITY;
    if (kind == BLOCK_OUTLIER) x[at] *= 1e4f;
}

/* Fills rows x cols values (row stride ld): blocks of `block` values (the whole row without
 * blocks) of random kinds; specials only where `specials`, else normal, zero, ties, tiny and
 * outlier blocks. */
static void fill_rows(const quant_format *f, size_t rows, size_t cols, float *x, size_t ld,
                      int specials) {
    const size_t block = f->block_cols ? f->block_cols : cols;
    for (size_t r = 0; r < rows; r++)
        for (size_t c0 = 0; c0 < cols; c0 += block) {
            const size_t n = cols - c0 < block ? cols - c0 : block;
            int kind = (int)(rand_u64() % BLOCK_KINDS);
            if (!specials && (kind == BLOCK_NAN || kind == BLOCK_INF || kind == BLOCK_HUGE))
                kind = BLOCK_NORMAL;
            if (rand_u64() % 3 == 0) kind = BLOCK_NORMAL;
            fill_block(f, kind, x + r * ld + c0, n);
        }
}

/* ---- bitwise comparison ------------------------------------------------------------------- */

static int same_f32(float a, float b) {
    uint32_t ua, ub;
    memcpy(&ua, &a, 4);
    memcpy(&ub, &b, 4);
    return ua == ub || (isnan(a) && isnan(b));
}

/* Bitwise equality of n floats (NaN equal to NaN), reporting the first difference. */
static void check_floats(const char *what, const char *where, const float *want,
                         const float *got, size_t n) {
    check_count++;
    for (size_t i = 0; i < n; i++)
        if (!same_f32(want[i], got[i])) {
            check_failures++;
            fprintf(stderr, "%s: %s differs at %zu: %a (portable) != %a\n", where, what, i,
                    (double)want[i], (double)got[i]);
            return;
        }
}

static void check_bytes(const char *what, const char *where, const uint8_t *want,
                        const uint8_t *got, size_t n) {
    check_count++;
    for (size_t i = 0; i < n; i++)
        if (want[i] != got[i]) {
            check_failures++;
            fprintf(stderr, "%s: %s differs at %zu: 0x%02x (portable) != 0x%02x\n", where, what,
                    i, want[i], got[i]);
            return;
        }
}

static void *alloc_exact(size_t bytes) {
    void *p = malloc(bytes ? bytes : 1);
    if (!p) {
        fprintf(stderr, "out of memory\n");
        exit(1);
    }
    return p;
}

/* A weight's N x K codes one a byte (as quantize_weight writes them) packed as format f holds
 * them (quant_weight.h), in an array of their exact size. */
static uint8_t *held_codes(const quant_format *f, const uint8_t *codes, size_t N, size_t K) {
    const size_t row_bytes = quant_weight_row_bytes(f, K);
    uint8_t *held = alloc_exact(N * row_bytes);
    for (size_t n = 0; n < N; n++) quant_codes_pack_row(f, codes + n * K, K, held + n * row_bytes);
    return held;
}

static const char *const variant_names[QUANT_SIMD_VARIANTS] = {"avx2", "avx512", "avx512vnni"};

/* ---- activation quantizers ---------------------------------------------------------------- */

/* Rule r's activations of M x K values through its format's portable quantize_rows and
 * through `rows_fn`, compared bitwise: codes, block scales, row scales. */
static void compare_rows(const quant_rule *r, quant_fn *rows_fn, const char *variant, size_t M,
                         size_t K, int specials) {
    const quant_format *f = r->format;
    const size_t nb = f->block_cols ? (K + f->block_cols - 1) / f->block_cols : 0;
    const size_t ld = K + (size_t)(rand_u64() % 3);
    float *x = alloc_exact(M * ld * sizeof *x);
    fill_rows(f, M, K, x, ld, specials);
    uint8_t *q0 = alloc_exact(M * K), *q1 = alloc_exact(M * K);
    float *s0 = alloc_exact((M * nb + 1) * sizeof(float)), *s1 = alloc_exact((M * nb + 1) * 4);
    float *t0 = alloc_exact(M * sizeof(float)), *t1 = alloc_exact(M * sizeof(float));
    memset(q1, 0xa5, M * K);
    memset(s1, 0xa5, (M * nb + 1) * 4);
    memset(t1, 0xa5, M * 4);
    memset(q0, 0x5a, M * K);
    memset(s0, 0xa5, (M * nb + 1) * 4);
    memset(t0, 0xa5, M * 4);
    f->quantize_rows(r, M, K, x, ld, q0, K, s0, t0);
    rows_fn(r, M, K, x, ld, q1, K, s1, t1);
    char where[160];
    snprintf(where, sizeof where, "%s quantize_rows %s M=%zu K=%zu%s", r->api_name, variant, M,
             K, specials ? " (specials)" : "");
    check_bytes("codes", where, q0, q1, M * K);
    check_floats("block scales", where, s0, s1, M * nb);
    if (f->has_tensor_scale) check_floats("row scales", where, t0, t1, M);
    free(x);
    free(q0);
    free(q1);
    free(s0);
    free(s1);
    free(t0);
    free(t1);
}

static const size_t row_lengths[] = {1,  2,  15, 16,  17,  31,  32,  33,  63,  64,
                                     65, 96, 127, 128, 129, 160, 255, 256, 300, 1031};

static int test_rows(const quant_rule *r, const quant_simd *s, const char *variant) {
    if (!s->quantize_rows) return 0;
    for (size_t i = 0; i < sizeof row_lengths / sizeof row_lengths[0]; i++)
        for (int rep = 0; rep < 6; rep++) {
            const size_t M = 1 + (size_t)(rand_u64() % 5);
            compare_rows(r, s->quantize_rows, variant, M, row_lengths[i], rep & 1);
        }
    return 1;
}

/* ---- GEMMs -------------------------------------------------------------------------------- */

/* Job j0 through format f's portable column kernel over [0, N), and j1 (the same but its y)
 * through `columns` over column ranges that split [0, N) at random points. */
static void run_portable_and_split(const quant_format *f, quant_gemm_fn *columns,
                                   const quant_gemm_job *j0, const quant_gemm_job *j1,
                                   size_t N) {
    f->gemm_columns(j0, 0, N);
    for (size_t n0 = 0; n0 < N;) {
        const size_t n1 = n0 + 1 + (size_t)(rand_u64() % (N - n0));
        columns(j1, n0, n1);
        n0 = n1;
    }
}

/* y = x W^T for rule r, M x K activations against N x K weights, through the portable column
 * kernel and through `columns` over column ranges that split [0, N) at random points; every
 * output compared bitwise, and the columns outside [0, N) of y (ldy > N) left untouched. */
static void compare_gemm(const quant_rule *r, quant_gemm_fn *columns, const char *variant,
                         size_t M, size_t N, size_t K) {
    const quant_format *f = r->format;
    const size_t nb = f->block_cols ? (K + f->block_cols - 1) / f->block_cols : 0;
    float *w = alloc_exact(N * K * sizeof *w), *x = alloc_exact(M * K * sizeof *x);
    fill_rows(f, N, K, w, K, 0);
    fill_rows(f, M, K, x, K, 1);
    /* the weight through the format's portable quantize_weight, from fp32 values */
    const size_t wscales = (size_t)quant_scale_count(f, N, K);
    uint8_t *codes = alloc_exact(N * K);
    float *ws = alloc_exact(wscales * sizeof(float)), wt = 0.0f;
    f->quantize_weight(r, N, K, w, K, codes, K, ws, &wt);
    /* E4M3 weights from a checkpoint may hold NaN codes (0x7f, 0xff), which no quantizer of
     * finite values writes: a few, in a third of the GEMMs, so that a weight column's NaN
     * block is compared too */
    if (f->element == QUANT_ELEMENT_E4M3 && rand_u64() % 3 == 0)
        for (size_t i = 0; i < 1 + N * K / 512; i++)
            codes[rand_u64() % (N * K)] = rand_u64() & 1 ? 0x7f : 0xff;
    /* then held as the format holds them (quant_weight.h: E2M1 two a byte, ...) */
    const size_t row_bytes = quant_weight_row_bytes(f, K);
    uint8_t *wq = alloc_exact(N * row_bytes);
    for (size_t n = 0; n < N; n++) quant_codes_pack_row(f, codes + n * K, K, wq + n * row_bytes);
    /* and the scales as held: fp32, or the format's bytes (quant_weight.h); in a third of the
     * E2M1 GEMMs random bytes, every value a byte can hold (E4M3 subnormals, the NaN codes,
     * E8M0's 2^-127 and infinity), so that the kernels' conversions meet each */
    uint8_t *scale_bytes = f->scale_bytes == 1 ? alloc_exact(wscales) : NULL;
    const int any_bytes = rand_u64() % 3 == 0;
    for (size_t i = 0; scale_bytes && i < wscales; i++)
        scale_bytes[i] = any_bytes ? (uint8_t)rand_u64() : quant_scale_byte(f, ws[i]);
    uint8_t *xq = alloc_exact(M * K);
    float *xs = alloc_exact((M * nb + 1) * sizeof(float)), *xt = alloc_exact(M * sizeof(float));
    f->quantize_rows(r, M, K, x, K, xq, K, xs, xt);
    const size_t ldy = N + 3;
    float *y0 = alloc_exact(M * ldy * sizeof(float)), *y1 = alloc_exact(M * ldy * sizeof(float));
    for (size_t i = 0; i < M * ldy; i++) y0[i] = y1[i] = -1234.5f;
    quant_gemm_job j0 = {M, K, nb, f->block_cols, r, xq, xs, xt, wq, row_bytes, {ws}, nb, wt, y0,
                         ldy};
    if (scale_bytes) j0.ws_codes = scale_bytes;
    quant_gemm_job j1 = j0;
    j1.y = y1;
    run_portable_and_split(f, columns, &j0, &j1, N);
    char where[160];
    snprintf(where, sizeof where, "%s gemm %s M=%zu N=%zu K=%zu", r->api_name, variant, M, N, K);
    check_floats("y", where, y0, y1, M * ldy);
    /* the portable blocked kernel reads packed codes as it reads them one a byte: the same
     * job on the codes one a byte, under the format as if it held 8 bits a code */
    if (f->code_bits != 8 && f->gemm_columns == quant_gemm_blocked) {
        quant_format bytewise = *f;
        bytewise.code_bits = 8;
        quant_rule bytewise_rule = *r;
        bytewise_rule.format = &bytewise;
        float *y2 = alloc_exact(M * ldy * sizeof(float));
        for (size_t i = 0; i < M * ldy; i++) y2[i] = -1234.5f;
        quant_gemm_job j2 = j0;
        j2.rule = &bytewise_rule;
        j2.wq = codes;
        j2.w_row_bytes = K;
        j2.y = y2;
        quant_gemm_blocked(&j2, 0, N);
        snprintf(where, sizeof where, "%s gemm portable packed/bytes M=%zu N=%zu K=%zu",
                 r->api_name, M, N, K);
        check_floats("y", where, y2, y0, M * ldy);
        free(y2);
    }
    free(w);
    free(x);
    free(codes);
    free(wq);
    free(ws);
    free(scale_bytes);
    free(xq);
    free(xs);
    free(xt);
    free(y0);
    free(y1);
}

static int test_gemm(const quant_rule *r, const quant_simd *s, const char *variant) {
    if (!s->gemm_columns) return 0;
    static const size_t Ks[] = {1,  15,  16,  17,  31,  32,  33,  63,   64,  65,
                                100, 128, 129, 256, 300, 1024, 1025, 1057};
    static const size_t Ms[] = {1, 2, 3, 4, 5, 8, 16, 17, 33, 70};
    static const size_t Ns[] = {1, 3, 16, 37, 130};
    for (size_t k = 0; k < sizeof Ks / sizeof Ks[0]; k++)
        for (size_t m = 0; m < sizeof Ms / sizeof Ms[0]; m++) {
            const size_t N = Ns[rand_u64() % (sizeof Ns / sizeof Ns[0])];
            compare_gemm(r, s->gemm_columns, variant, Ms[m], N, Ks[k]);
        }
    /* a prefill shape: many rows, K past 1031 with a partial last block, columns past one
     * fp8-block weight block row */
    compare_gemm(r, s->gemm_columns, variant, 97, 133, 1100);
    /* rows past one pass (32) along a K of several of the E2M1 kernels' panel segments (1024
     * codes on AVX-512, 2048 on AVX2), a partial last block and a partial last tile */
    compare_gemm(r, s->gemm_columns, variant, 40, 37, 4135);
    /* a decode row and two rows along a K longer than the kernel's stack holds at once */
    compare_gemm(r, s->gemm_columns, variant, 1, 21, 8300);
    compare_gemm(r, s->gemm_columns, variant, 2, 19, 4200);
    /* one activation row (the AVX-512 E2M1 and the ternary kernels' decode loops up to 16384
     * codes, the tiles past it): rows ending anywhere in a chunk, columns past a group of 16,
     * a third of them on random scale bytes (E2M1: subnormal, NaN and extreme scales) */
    for (int rep = 0; rep < 8; rep++)
        compare_gemm(r, s->gemm_columns, variant, 1, 1 + (size_t)(rand_u64() % 40),
                     1 + (size_t)(rand_u64() % 4200));
    compare_gemm(r, s->gemm_columns, variant, 1, 33, 16384);
    compare_gemm(r, s->gemm_columns, variant, 1, 33, 16385);
    /* last blocks ending 2 or 3 codes into a quad of K (the AVX-512 tile's pairs are codes 4q,
     * 4q + 2 and 4q + 1, 4q + 3): 130 = 128 + 2, 98 = 3 x 32 + 2, 163 = 5 x 32 + 3 */
    for (size_t m = 1; m <= 9; m += 8) {
        compare_gemm(r, s->gemm_columns, variant, m, 37, 130);
        compare_gemm(r, s->gemm_columns, variant, m, 37, 98);
        compare_gemm(r, s->gemm_columns, variant, m, 37, 163);
    }
    return 1;
}

/* Ternary's GEMM on codes written directly, at the ends of their ranges: activation codes
 * all -128 or all 127 (or random), weight codes all 1 or all -1 (or random), so that every
 * partial sum of a tile is as large as it can be; the weight codes held four a byte
 * (quant_weight.h) with random fields in their last group's padding, which no kernel may read
 * as codes. The portable kernel gives y from D = sum x w of the codes one a byte, summed here
 * in int64; `columns` gives its bits. */
static void compare_ternary_codes(const quant_rule *r, quant_gemm_fn *columns,
                                  const char *variant, size_t M, size_t N, size_t K) {
    const quant_format *f = r->format;
    uint8_t *xq = alloc_exact(M * K), *wq = alloc_exact(N * K);
    float *xt = alloc_exact(M * sizeof(float));
    const int xkind = (int)(rand_u64() % 3), wkind = (int)(rand_u64() % 3);
    for (size_t i = 0; i < M * K; i++)
        xq[i] = xkind == 0 ? 0x80 : xkind == 1 ? 0x7f : (uint8_t)rand_u64();
    for (size_t i = 0; i < N * K; i++)
        wq[i] = wkind == 0 ? 0x01 : wkind == 1 ? 0xff : (uint8_t)(int8_t)(rand_u64() % 3 - 1);
    for (size_t m = 0; m < M; m++) xt[m] = 127.0f / (float)(1 + rand_u64() % 1000);
    uint8_t *held = held_codes(f, wq, N, K);
    const size_t row_bytes = quant_weight_row_bytes(f, K);
    for (size_t n = 0; n < N; n++)
        for (size_t c = K; c < row_bytes * 4; c++) { /* codes K .. of the last group */
            uint8_t *b = held + n * row_bytes + c / 64 * 16 + c % 16;
            const unsigned shift = (unsigned)(c % 64 / 16 * 2);
            *b = (uint8_t)((*b & ~(3u << shift)) | (unsigned)(rand_u64() & 3) << shift);
        }
    const size_t ldy = N + 1;
    float *y0 = alloc_exact(M * ldy * sizeof(float)), *y1 = alloc_exact(M * ldy * sizeof(float));
    float *want = alloc_exact(M * ldy * sizeof(float));
    for (size_t i = 0; i < M * ldy; i++) y0[i] = y1[i] = want[i] = -1234.5f;
    const float s_w = 0.37f;
    for (size_t m = 0; m < M; m++)
        for (size_t n = 0; n < N; n++) {
            int64_t d = 0;
            for (size_t k = 0; k < K; k++) d += (int8_t)xq[m * K + k] * (int8_t)wq[n * K + k];
            want[m * ldy + n] =
                r->tensor_scale == QUANT_SCALE_BF16
                    ? round_bf16(round_bf16((float)d) / round_bf16(s_w * xt[m]))
                    : (float)d / (s_w * xt[m]);
        }
    quant_gemm_job j0 = {M, K, 0, 0, r, xq, NULL, xt, held, row_bytes, {NULL}, 0, s_w, y0, ldy};
    quant_gemm_job j1 = j0;
    j1.y = y1;
    f->gemm_columns(&j0, 0, N);
    columns(&j1, 0, N);
    char where[160];
    snprintf(where, sizeof where, "%s gemm %s codes (x kind %d, w kind %d) M=%zu N=%zu K=%zu",
             r->api_name, variant, xkind, wkind, M, N, K);
    check_floats("y of the codes one a byte", where, want, y0, M * ldy);
    check_floats("y", where, y0, y1, M * ldy);
    free(xq);
    free(wq);
    free(held);
    free(xt);
    free(y0);
    free(y1);
    free(want);
}

/* Ternary's GEMM where the small shapes do not reach: activation rows past one row block of
 * the SIMD kernels (ternary_simd.h: at most 256 rows, fewer for long K), weight rows that the
 * row tiles of 4 read unpacked a column group at a time, a tile's columns at a time (2065
 * codes on AVX-512) or held (8300 codes on AVX-512; a tile's columns on AVX2), and extreme
 * codes up to and past TERNARY_MAX_K (2^22, where the SIMD kernels give the rows to the
 * portable kernel). */
static void test_ternary_extra(const quant_rule *r, const quant_simd *s, const char *variant) {
    if (!s->gemm_columns) return;
    compare_gemm(r, s->gemm_columns, variant, 300, 21, 64);
    compare_gemm(r, s->gemm_columns, variant, 263, 5, 2048 + 17);
    compare_gemm(r, s->gemm_columns, variant, 10, 19, 8300);
    for (int rep = 0; rep < 6; rep++)
        compare_ternary_codes(r, s->gemm_columns, variant, 1 + (size_t)(rand_u64() % 6),
                              1 + (size_t)(rand_u64() % 20), 4096 + (size_t)(rand_u64() % 200));
    /* one activation row (the AVX-512 kernels' decode loop up to 16384 codes, the tiles past
     * it): extreme codes over rows ending anywhere in a held line of 64 bytes */
    for (int rep = 0; rep < 6; rep++)
        compare_ternary_codes(r, s->gemm_columns, variant, 1, 1 + (size_t)(rand_u64() % 40),
                              1 + (size_t)(rand_u64() % 4200));
    compare_ternary_codes(r, s->gemm_columns, variant, 1, 17, 16384);
    compare_ternary_codes(r, s->gemm_columns, variant, 1, 17, 16385);
    compare_ternary_codes(r, s->gemm_columns, variant, 2, 3, ((size_t)1 << 22) + 1);
    compare_ternary_codes(r, s->gemm_columns, variant, 1, 2, (size_t)1 << 22);
}

/* ---- the FP8 GEMMs on codes written directly -------------------------------------------- */

/* A block of n E4M3 codes of one kind: random bytes (every code: subnormals, the NaN codes
 * 0x7f and 0xff, the saturated 0x7e and 0xfe), zeros (either sign), saturated codes, subnormal
 * codes only, or random bytes with one NaN code. */
static void fp8_block_codes(uint8_t *c, size_t n, int kind) {
    for (size_t i = 0; i < n; i++) {
        const uint8_t sign = (uint8_t)(rand_u64() & 0x80);
        c[i] = kind == 1   ? sign
               : kind == 2 ? (uint8_t)(sign | 0x7e)
               : kind == 3 ? (uint8_t)(sign | (rand_u64() & 7))
                           : (uint8_t)rand_u64();
    }
    if (kind == 4) c[rand_u64() % n] = rand_u64() & 1 ? 0x7f : 0xff;
}

/* A block scale: for MX rules a power of two 2^-127 .. 2^127 (E8M0's values, 2^-127 an fp32
 * subnormal); otherwise a random fp32 of a random exponent, or one of the edges: the least
 * normal and a subnormal fp32, the largest finite, zero, a negative scale. */
static float fp8_block_scale(int mx) {
    if (mx) return ldexpf(1.0f, (int)(rand_u64() % 255) - 127);
    switch (rand_u64() % 8) {
    case 0: return 0x1p-126f;
    case 1: return 1e-40f;
    case 2: return 3.4e38f;
    case 3: return 0.0f;
    case 4: return -(float)ldexp(1.0 + (double)(rand_u64() % 1000) / 1000.0, -20);
    default:
        return (float)ldexp(1.0 + (double)(rand_u64() % 1000000) / 1000000.0,
                            (int)(rand_u64() % 60) - 30);
    }
}

/* The FP8 GEMM of rule r on codes and scales written directly, M rows against N columns of K
 * codes, each activation and weight block (1 x bc) of a random kind (fp8_block_codes): the
 * portable kernel and `columns` (over column ranges that split [0, N) at random points) give
 * the same bits. The one-row kernel's edges (fp8_row_avx512.c): every code's double, products
 * and sums as large and as small as the codes make them, NaN and zero blocks, extreme scales,
 * rows ending anywhere in a chunk of 64 codes. */
static void compare_fp8_codes(const quant_rule *r, quant_gemm_fn *columns, const char *variant,
                              size_t M, size_t N, size_t K) {
    const quant_format *f = r->format;
    const size_t bc = f->block_cols, nb = (K + bc - 1) / bc;
    const int mx = f->gemm == PARITY_GEMM_MXFP8;
    uint8_t *xq = alloc_exact(M * K), *wq = alloc_exact(N * K);
    for (size_t m = 0; m < M; m++)
        for (size_t k0 = 0; k0 < K; k0 += bc)
            fp8_block_codes(xq + m * K + k0, K - k0 < bc ? K - k0 : bc, (int)(rand_u64() % 6));
    for (size_t n = 0; n < N; n++)
        for (size_t k0 = 0; k0 < K; k0 += bc)
            fp8_block_codes(wq + n * K + k0, K - k0 < bc ? K - k0 : bc, (int)(rand_u64() % 6));
    const size_t wscales = (size_t)quant_scale_count(f, N, K);
    float *xs = alloc_exact(M * nb * sizeof(float)), *ws = alloc_exact(wscales * sizeof(float));
    float *xt = alloc_exact(M * sizeof(float));
    for (size_t i = 0; i < M * nb; i++) xs[i] = fp8_block_scale(mx);
    for (size_t i = 0; i < wscales; i++) ws[i] = fp8_block_scale(mx);
    for (size_t m = 0; m < M; m++) xt[m] = 1.0f;
    const size_t ldy = N + 2;
    float *y0 = alloc_exact(M * ldy * sizeof(float)), *y1 = alloc_exact(M * ldy * sizeof(float));
    for (size_t i = 0; i < M * ldy; i++) y0[i] = y1[i] = -1234.5f;
    quant_gemm_job j0 = {M, K, nb, bc, r, xq, xs, xt, wq, K, {ws}, nb, 0.0f, y0, ldy};
    quant_gemm_job j1 = j0;
    j1.y = y1;
    run_portable_and_split(f, columns, &j0, &j1, N);
    char where[160];
    snprintf(where, sizeof where, "%s gemm %s codes M=%zu N=%zu K=%zu", r->api_name, variant, M,
             N, K);
    check_floats("y", where, y0, y1, M * ldy);
    free(xq);
    free(wq);
    free(xs);
    free(ws);
    free(xt);
    free(y0);
    free(y1);
}

static void test_fp8_codes(const quant_rule *r, const quant_simd *s, const char *variant) {
    if (!s->gemm_columns) return;
    static const size_t Ks[] = {1, 31, 32, 33, 63, 64, 65, 127, 128, 129, 191, 257, 1000, 3072};
    for (size_t k = 0; k < sizeof Ks / sizeof Ks[0]; k++)
        for (int rep = 0; rep < 3; rep++)
            compare_fp8_codes(r, s->gemm_columns, variant, 1, 1 + (size_t)(rand_u64() % 40),
                              Ks[k]);
    for (int rep = 0; rep < 12; rep++)
        compare_fp8_codes(r, s->gemm_columns, variant, 1 + (size_t)(rand_u64() % 2) * 2,
                          1 + (size_t)(rand_u64() % 140), 1 + (size_t)(rand_u64() % 4200));
    /* the one-row kernel's longest row (8192 codes) and one past it (the tiles) */
    compare_fp8_codes(r, s->gemm_columns, variant, 1, 9, 8192);
    compare_fp8_codes(r, s->gemm_columns, variant, 1, 9, 8193);
}

/* ---- the E2M1 GEMMs' fused chain step ---------------------------------------------------- */

static int imax(int a, int b) { return a > b ? a : b; }

/* The magnitude of E2M1 weight scale byte b (E4M3 for NVFP4's blocks of 16, else E8M0). */
static double weight_scale_value(int e4m3, uint8_t b) {
    return fabs((double)(e4m3 ? e4m3_to_f32(b) : e8m0_to_f32(b)));
}

/* An activation scale of at most `bits` significant bits (exactly that many where `exact`)
 * times 2^e, of random sign in a quarter of them. */
static float scale_of_bits(int bits, int exact, int e) {
    const uint64_t half = (uint64_t)1 << (bits - 1);
    const uint64_t m = half + (exact && bits > 1 ? (rand_u64() % (half / 2)) * 2 + 1
                                                 : rand_u64() % half);
    const float v = (float)ldexp((double)m / (double)half, e);
    return rand_u64() % 4 ? v : -v;
}

/* The E2M1 GEMM of rule r on codes and scales written directly, at the bounds of the SIMD
 * kernels' fused chain step (e2m1_lanes.h: it runs where every nonzero scale and product of
 * scales is within [2^-124, 2^116] and the activation scales have at most 7 significant bits;
 * by an exponent add where they are nonzero powers of two and no weight scale is zero):
 * weight scale bytes over a narrow random range (E8M0 down to 2^-127 and up to 2^127; in a
 * sixth of the GEMMs one NaN or infinity code, in another an E4M3 zero), then per pass of 32
 * rows activation scales that put the largest product of scales about 2^115, 2^116 or 2^117
 * or the least about 2^-123, 2^-124, 2^-125 or 2^-146 (so the fused and the spec's steps meet
 * on both sides of each bound), or of 8 to 12 or 24 significant bits, powers of two, zero,
 * E8M0's 2^-127, infinite, ordinary; codes saturated (|S| at its largest, so that sums reach
 * infinity) or random. Compared bitwise with the portable kernel. The activation scales stay
 * where a_s / 4 is exact (at least 2^-124, or 2^-127), as every quantizer's are: the SIMD
 * kernels' spec steps compute d a_s as S (a_s / 4) (e2m1_lanes.h). M rows: 70 (the tiles'
 * passes) or 1 (the AVX-512 one-row kernel, whose NVFP4 bounds are nonzero activation scales
 * in [2^-115, 2^107] against any E4M3 weight scale: half of its GEMMs put 2^-9 and 448 among
 * the weight scale bytes, and its activation scales may lie about either bound). */
static void compare_e2m1_edges(const quant_rule *r, quant_gemm_fn *columns, const char *variant,
                               size_t M) {
    const quant_format *f = r->format;
    const int e4m3 = f->block_cols == 16;
    static const size_t Ks[] = {67, 300, 1057, 2100};
    const size_t N = 37, K = Ks[rand_u64() % 4], bc = f->block_cols;
    const size_t nb = (K + bc - 1) / bc;
    uint8_t *xq = alloc_exact(M * K), *codes = alloc_exact(N * K), *bytes = alloc_exact(N * nb);
    const uint8_t *rows_of[2] = {xq, codes};
    for (int side = 0; side < 2; side++)
        for (size_t row = 0; row < (side ? N : M); row++) {
            const int kind = (int)(rand_u64() % 3); /* all +6, all -6, random */
            for (size_t k = 0; k < K; k++)
                ((uint8_t *)rows_of[side])[row * K + k] =
                    kind == 0 ? 0x7 : kind == 1 ? 0xf : (uint8_t)(rand_u64() & 0xf);
        }
    const unsigned base = e4m3 ? (unsigned)(rand_u64() % 0x7f) : (unsigned)(rand_u64() % 255);
    const unsigned top = e4m3 ? 0x7e : 0xfe;
    double least = INFINITY, most = 0;
    for (size_t i = 0; i < N * nb; i++) {
        const unsigned b = base + (unsigned)(rand_u64() % 4);
        bytes[i] = (uint8_t)((b > top ? top : b) | (e4m3 && rand_u64() % 4 == 0 ? 0x80 : 0));
        const double v = weight_scale_value(e4m3, bytes[i]);
        if (v > 0 && v < least) least = v;
        if (v > most) most = v;
    }
    /* one row (the AVX-512 one-row kernel's bounds, nvfp4_row_fusable): in half of them the
     * E4M3 extremes 2^-9 and 448 among the bytes, beside activation scales (kind 8) about
     * 2^-115 and 2^107 */
    if (M == 1 && e4m3 && rand_u64() % 2)
        for (size_t i = 0; i < N * nb; i += 1 + (size_t)(rand_u64() % 8)) {
            bytes[i] = (uint8_t)((rand_u64() % 2 ? 0x01 : 0x7e) | (rand_u64() % 4 ? 0 : 0x80));
            const double v = weight_scale_value(e4m3, bytes[i]);
            if (v > 0 && v < least) least = v;
            if (v > most) most = v;
        }
    if (rand_u64() % 6 == 0) bytes[rand_u64() % (N * nb)] = e4m3 && rand_u64() % 2 ? 0x7f : 0xff;
    /* E4M3's zero scales (an all-zero weight block's) beside power-of-two activation scales */
    if (e4m3 && rand_u64() % 6 == 0) bytes[rand_u64() % (N * nb)] = rand_u64() % 2 ? 0x00 : 0x80;
    float *xs = alloc_exact(M * nb * sizeof(float)), *xt = alloc_exact(M * sizeof(float));
    for (size_t m0 = 0; m0 < M; m0 += 32) {
        /* delta -22 puts the least product in the denormals (where E8M0 reaches) */
        const int kind = (int)(rand_u64() % (M == 1 ? 9 : 8));
        int delta = rand_u64() % 4 ? (int)(rand_u64() % 3) - 1 : -22;
        /* one row: also products of scales past fp32's range (2^128 and up), where an
         * exponent add of unbounded bytes would carry into the sign */
        if (M == 1 && rand_u64() % 4 == 0) delta = 12 + (int)(rand_u64() % 4);
        const int bits = rand_u64() % 2 ? 7 : 1; /* of the ordinary scales: 1, powers of two */
        /* of the scales at the bounds: 7 bits, at one row also powers of two (MXFP4's
         * exponent add there, mxfp4_row_bounds) */
        const int ends_bits = M == 1 && rand_u64() % 2 ? 1 : 7;
        for (size_t i = m0 * nb; i < (m0 + 32 < M ? m0 + 32 : M) * nb; i++) {
            int e_w;
            switch (kind) {
            case 0: /* the largest product of scales in [2^(115 + delta), 2^(117 + delta)) */
                frexp(most > 0 ? most : 1.0, &e_w);
                xs[i] = scale_of_bits(ends_bits, 0, 116 - e_w + delta);
                break;
            case 1: /* the least in [2^(-124 + delta), 2^(-122 + delta)) */
                frexp(least < INFINITY ? least : 1.0, &e_w);
                xs[i] = scale_of_bits(ends_bits, 0, imax(-124, -124 - (e_w - 1) + delta));
                break;
            case 2: /* 8 .. 12 or 24 significant bits: NVFP4's products need 12 + 4 + 8 */
                xs[i] = scale_of_bits(rand_u64() % 6 ? 8 + (int)(rand_u64() % 5) : 24, 1,
                                      (int)(rand_u64() % 20) - 10);
                break;
            case 3:
                xs[i] = rand_u64() % 3 ? 0.0f : rand_u64() % 2 ? -0.0f : scale_of_bits(4, 0, -3);
                break;
            case 4:
                xs[i] = i % 7 ? scale_of_bits(4, 0, 0) : 0x1p-127f; /* E8M0's least */
                break;
            case 5:
                xs[i] = i % 11 ? scale_of_bits(4, 0, 2) : INFINITY;
                break;
            case 8: /* in [2^-116, 2^-113) or [2^107, 2^110): a power of two or 7 bits */
                xs[i] = scale_of_bits(rand_u64() % 2 ? 1 : 7, 0,
                                      (rand_u64() % 2 ? -116 : 107) + (int)(rand_u64() % 3));
                break;
            default:
                xs[i] = scale_of_bits(bits, 0, (int)(rand_u64() % 40) - 20);
            }
        }
    }
    for (size_t m = 0; m < M; m++) xt[m] = 1.0f;
    const size_t row_bytes = quant_weight_row_bytes(f, K), ldy = N + 2;
    uint8_t *wq = held_codes(f, codes, N, K);
    float *y0 = alloc_exact(M * ldy * sizeof(float)), *y1 = alloc_exact(M * ldy * sizeof(float));
    for (size_t i = 0; i < M * ldy; i++) y0[i] = y1[i] = -1234.5f;
    quant_gemm_job j0 = {M, K, nb, bc, r, xq, xs, xt, wq, row_bytes, {NULL}, nb, 1.0f, y0, ldy};
    j0.ws_codes = bytes;
    quant_gemm_job j1 = j0;
    j1.y = y1;
    run_portable_and_split(f, columns, &j0, &j1, N);
    char where[160];
    snprintf(where, sizeof where, "%s gemm %s scale edges (base 0x%02x) M=%zu N=%zu K=%zu",
             r->api_name, variant, base, M, N, K);
    check_floats("y", where, y0, y1, M * ldy);
    free(xq);
    free(codes);
    free(bytes);
    free(xs);
    free(xt);
    free(wq);
    free(y0);
    free(y1);
}

/* ---- which entry each path runs ----------------------------------------------------------- */

/* The entry path p should run for format f: its widest variant's at or below the path's, else
 * the portable one (format.h). */
static void check_dispatch(const quant_format *f) {
    const parity_cpu_path saved = parity_get_cpu_path();
    static const parity_cpu_path paths[] = {PARITY_CPU_PORTABLE, PARITY_CPU_AVX2,
                                            PARITY_CPU_AVX512, PARITY_CPU_AVX512BF16};
    for (size_t i = 0; i < sizeof paths / sizeof paths[0]; i++) {
        if (parity_set_cpu_path(paths[i]) != PARITY_OK) continue;
        int top = -1;
        if (paths[i] == PARITY_CPU_AVX2) top = QUANT_SIMD_AVX2;
        if (paths[i] >= PARITY_CPU_AVX512)
            top = cpu_has_avx512_vnni() ? QUANT_SIMD_AVX512VNNI : QUANT_SIMD_AVX512;
        quant_fn *rows = f->quantize_rows;
        quant_gemm_fn *gemm = f->gemm_columns;
        for (int v = 0; v <= top; v++) {
            if (f->simd[v].quantize_rows) rows = f->simd[v].quantize_rows;
            if (f->simd[v].gemm_columns) gemm = f->simd[v].gemm_columns;
        }
        CHECK(quant_rows_entry(f) == rows);
        CHECK(quant_gemm_entry(f) == gemm);
    }
    CHECK_OK(parity_set_cpu_path(saved));
}

int main(void) {
    static const uint32_t gemms[] = {PARITY_GEMM_FP8_BLOCK, PARITY_GEMM_MXFP8, PARITY_GEMM_NVFP4,
                                     PARITY_GEMM_MXFP4, PARITY_GEMM_TERNARY};
    for (size_t g = 0; g < sizeof gemms / sizeof gemms[0]; g++) {
        const quant_format *f = quant_format_row(gemms[g]);
        CHECK(f != NULL);
        if (!f) continue;
        check_dispatch(f);
        for (int v = 0; v < QUANT_SIMD_VARIANTS; v++) {
            const quant_simd *s = quant_simd_variant(f, v);
            if (!s) {
                printf("%-9s %-10s: not on this CPU or build\n", f->name, variant_names[v]);
                continue;
            }
            int rows = 0, gemm = 0;
            for (int q = 0; q < QUANTIZERS; q++) {
                const quant_rule *r = quant_rule_of(q);
                if (r->format != f) continue;
                rows += test_rows(r, s, variant_names[v]);
                gemm += test_gemm(r, s, variant_names[v]);
                if (f->element == QUANT_ELEMENT_TERNARY) test_ternary_extra(r, s, variant_names[v]);
                if (f->element == QUANT_ELEMENT_E4M3) test_fp8_codes(r, s, variant_names[v]);
                if (f->element == QUANT_ELEMENT_E2M1 && s->gemm_columns)
                    for (int rep = 0; rep < 40; rep++) {
                        compare_e2m1_edges(r, s->gemm_columns, variant_names[v], 70);
                        compare_e2m1_edges(r, s->gemm_columns, variant_names[v], 1);
                    }
            }
            printf("%-9s %-10s: activation quantizer compared under %d rule(s), GEMM under %d\n",
                   f->name, variant_names[v], rows, gemm);
        }
    }
    return check_report("test_quant_kernels");
}
