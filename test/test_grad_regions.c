/* The learner's backward pieces parity_rope_backward (grad_regions.c) and
 * parity_rmsnorm_residual_backward (train_ops.c): parity_rope_backward gives, bit for bit, the rotation's
 * transpose written out here (each product rounded to fp32, then the sum), as autograd forms
 * it from the forward's formula, on padded rows and in place, with infinities, NaNs, signed
 * zeros and subnormals, on one thread or a pool of two and on every CPU path; a version that
 * fuses the multiply and add does not match it; parity_rmsnorm_residual_backward gives
 * parity_rmsnorm_backward's bits on the sum residual + delta, with or without d_add and
 * d_weight, padded rows, a pool and on every CPU path; bad arguments of both get a status and
 * a message, with no output written. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"

static uint64_t rng_state = 0x2545f4914f6cdd1dull;

static float uniform(void) { return xorshift_uniform(&rng_state); }

/* ---- parity_rope_backward --------------------------------------------------------------- */

/* The reference: autograd's graph of lo' = a c - b s, hi' = b c + a s transposed, each product
 * rounded to fp32 (fused: one rounding, the wrong answer). Rows of g are `stride` apart, the
 * tables' rows `half` apart; out is rows x width, dense. */
static void rope_grad_ref(size_t rows, size_t heads, size_t hd, const float *g, size_t stride,
                          const float *c, const float *s, float *out, int fused) {
    const size_t half = hd / 2, width = heads * hd;
    for (size_t r = 0; r < rows; r++)
        for (size_t h = 0; h < heads; h++)
            for (size_t i = 0; i < half; i++) {
                const float lo = g[r * stride + h * hd + i], hi = g[r * stride + h * hd + half + i];
                const float ci = c[r * half + i], si = s[r * half + i];
                float a, b;
                if (fused) {
                    a = fmaf(lo, ci, hi * si);
                    b = fmaf(hi, ci, -(lo * si));
                } else {
                    const float lc = lo * ci, hs = hi * si, hc = hi * ci, ls = lo * si;
                    a = lc + hs;
                    b = hc - ls;
                }
                out[r * width + h * hd + i] = a;
                out[r * width + h * hd + half + i] = b;
            }
}

/* Values that test the rounding: mostly random, with every 13th an infinity, every 17th a NaN,
 * every 19th a signed zero and every 23rd a subnormal. */
static void special_values(float *x, size_t n, float scale) {
    for (size_t i = 0; i < n; i++) {
        x[i] = uniform() * scale;
        if (i % 13 == 5) x[i] = i % 2 ? INFINITY : -INFINITY;
        if (i % 17 == 7) x[i] = NAN;
        if (i % 19 == 3) x[i] = i % 2 ? -0.0f : 0.0f;
        if (i % 23 == 11) x[i] = 1e-40f * (i % 2 ? -1.0f : 1.0f);
    }
}

/* 1 if the two float arrays agree bit for bit, NaNs matching any NaN (their payloads are the
 * hardware's). */
static int same_bits(const float *a, const float *b, size_t n) {
    for (size_t i = 0; i < n; i++) {
        if (isnan(a[i]) && isnan(b[i])) continue;
        if (memcmp(a + i, b + i, 4)) return 0;
    }
    return 1;
}

static void rope_case(parity_pool *pool2, size_t rows, size_t heads, size_t hd, size_t pad,
                      int specials) {
    const size_t half = hd / 2, width = heads * hd, stride = width + pad;
    float *g = malloc(rows * stride * 4), *c = malloc(rows * half * 4), *s = malloc(rows * half * 4);
    float *ref = malloc(rows * width * 4), *fused = malloc(rows * width * 4);
    float *out = malloc(rows * stride * 4), *dense = malloc(rows * width * 4);
    for (size_t i = 0; i < rows * stride; i++) g[i] = uniform() * 4.0f;
    for (size_t i = 0; i < rows * half; i++) c[i] = uniform(), s[i] = uniform();
    if (specials) {
        special_values(g, rows * stride, 4.0f);
        special_values(c, rows * half, 1.0f);
    }
    rope_grad_ref(rows, heads, hd, g, stride, c, s, ref, 0);
    rope_grad_ref(rows, heads, hd, g, stride, c, s, fused, 1);
    parity_cpu_path paths[4];
    const size_t n_paths = runnable_cpu_paths(paths), saved = parity_get_cpu_path();
    for (size_t p = 0; p < n_paths; p++) {
        parity_set_cpu_path(paths[p]);
        for (int in_place = 0; in_place < 2; in_place++)
            for (int use_pool = 0; use_pool < 2; use_pool++) {
                memset(out, 0x5a, rows * stride * 4);
                const float *src = g;
                if (in_place) memcpy(out, g, rows * stride * 4), src = out;
                CHECK_OK(parity_rope_backward(use_pool ? pool2 : NULL, rows, heads, hd, src,
                                              stride, c, s, half, out, stride));
                for (size_t r = 0; r < rows; r++) {
                    memcpy(dense + r * width, out + r * stride, width * 4);
                    for (size_t k = width; k < stride; k++) {
                        uint32_t bits;
                        memcpy(&bits, out + r * stride + k, 4);
                        /* past the row: untouched (in place, the input's own padding) */
                        if (in_place) CHECK(!memcmp(&bits, g + r * stride + k, 4));
                        else CHECK_INT(bits, 0x5a5a5a5au);
                    }
                }
                CHECK(same_bits(dense, ref, rows * width));
            }
    }
    parity_set_cpu_path((parity_cpu_path)saved);
    /* the check can fail: a fused multiply-add rounds differently somewhere in a big case */
    if (rows * width >= 4096 && !specials) CHECK(!same_bits(fused, ref, rows * width));
    free(g), free(c), free(s), free(ref), free(fused), free(out), free(dense);
}

static void test_rope_backward(parity_pool *pool2) {
    static const size_t shapes[][4] = {{1, 1, 2, 0}, {3, 2, 8, 5}, {37, 3, 64, 0},
                                       {70, 4, 64, 3}, {129, 2, 128, 1}, {9, 5, 130, 7}};
    for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++)
        for (int specials = 0; specials < 2; specials++)
            rope_case(pool2, shapes[i][0], shapes[i][1], shapes[i][2], shapes[i][3], specials);
}

/* 1 if none of the n floats was written (they hold 0x7f bytes). */
static int untouched(const float *y, size_t n) { return floats_hold_byte(y, n, 0x7f); }

static void test_rope_bad_arguments(void) {
    const parity_status E = PARITY_ERR_INVALID_ARGUMENT;
    float g[16] = {0}, c[4] = {0}, s[4] = {0}, o[32];
    memset(o, 0x7f, sizeof o);
    CHECK_STATUS(parity_rope_backward(NULL, 2, 2, 4, NULL, 8, c, s, 2, o, 8), E);
    CHECK(strstr(parity_last_error(), "d_out is NULL") != NULL);
    CHECK_STATUS(parity_rope_backward(NULL, 2, 2, 4, g, 8, NULL, s, 2, o, 8), E);
    CHECK(strstr(parity_last_error(), "cos is NULL") != NULL);
    CHECK_STATUS(parity_rope_backward(NULL, 2, 2, 4, g, 8, c, NULL, 2, o, 8), E);
    CHECK(strstr(parity_last_error(), "sin is NULL") != NULL);
    CHECK_STATUS(parity_rope_backward(NULL, 2, 2, 4, g, 8, c, s, 2, NULL, 8), E);
    CHECK(strstr(parity_last_error(), "d_x is NULL") != NULL);
    CHECK_STATUS(parity_rope_backward(NULL, 0, 2, 4, g, 8, c, s, 2, o, 8), E);
    CHECK(strstr(parity_last_error(), "rows is 0") != NULL);
    CHECK_STATUS(parity_rope_backward(NULL, 2, 0, 4, g, 8, c, s, 2, o, 8), E);
    CHECK(strstr(parity_last_error(), "n_heads is 0") != NULL);
    CHECK_STATUS(parity_rope_backward(NULL, 2, 2, 3, g, 8, c, s, 2, o, 8), E);
    CHECK(strstr(parity_last_error(), "even") != NULL);
    CHECK_STATUS(parity_rope_backward(NULL, 2, 2, 0, g, 8, c, s, 2, o, 8), E);
    CHECK_STATUS(parity_rope_backward(NULL, 2, SIZE_MAX / 2, 4, g, 8, c, s, 2, o, 8), E);
    CHECK(strstr(parity_last_error(), "overflow") != NULL);
    CHECK_STATUS(parity_rope_backward(NULL, 2, 2, 4, g, 7, c, s, 2, o, 8), E);
    CHECK(strstr(parity_last_error(), "d_out stride 7") != NULL);
    CHECK_STATUS(parity_rope_backward(NULL, 2, 2, 4, g, 8, c, s, 1, o, 8), E);
    CHECK(strstr(parity_last_error(), "cos stride 1") != NULL);
    CHECK_STATUS(parity_rope_backward(NULL, 2, 2, 4, g, 8, c, s, 2, o, 6), E);
    CHECK(strstr(parity_last_error(), "d_x stride 6") != NULL);
    CHECK_STATUS(parity_rope_backward(NULL, 3, 2, 4, g, SIZE_MAX / 2, c, s, 2, o, 8), E);
    CHECK(strstr(parity_last_error(), "address space") != NULL);
    /* in place only with the same stride; no overlap with another input */
    CHECK_STATUS(parity_rope_backward(NULL, 2, 2, 4, o, 8, c, s, 2, o, 12), E);
    CHECK(strstr(parity_last_error(), "aliases d_out") != NULL);
    CHECK_STATUS(parity_rope_backward(NULL, 2, 2, 4, o + 4, 8, c, s, 2, o, 8), E);
    CHECK(strstr(parity_last_error(), "d_x overlaps d_out without being it") != NULL);
    CHECK_STATUS(parity_rope_backward(NULL, 2, 2, 4, g, 8, o + 12, s, 2, o, 8), E);
    CHECK(strstr(parity_last_error(), "d_x overlaps cos") != NULL);
    CHECK_STATUS(parity_rope_backward(NULL, 2, 2, 4, g, 8, c, o + 15, 2, o, 8), E);
    CHECK(strstr(parity_last_error(), "d_x overlaps sin") != NULL);
    CHECK(untouched(o, 32));
    /* tables right after d_x's last row do not overlap it */
    CHECK_OK(parity_rope_backward(NULL, 2, 2, 4, g, 8, o + 16, o + 20, 2, o, 8));
}

/* ---- parity_rmsnorm_residual_backward ---------------------------------------------------- */

/* parity_rmsnorm_residual_backward(residual, delta) against parity_rmsnorm_backward on the
 * sum residual + delta formed here: the same bits for d_x and d_weight. */
static void rmsnorm_residual_case(parity_pool *pool2, size_t rows, size_t dim, size_t pad,
                                  int with_add) {
    const size_t stride = dim + pad, n = rows * stride;
    float *h = malloc(n * 4), *d = malloc(n * 4), *s = malloc(n * 4), *g = malloc(n * 4);
    float *add = malloc(n * 4), *w = malloc(dim * 4), *ref = malloc(n * 4), *out = malloc(n * 4);
    float *ref_w = malloc(dim * 4), *out_w = malloc(dim * 4);
    for (size_t i = 0; i < n; i++) {
        h[i] = uniform() * 3.0f, d[i] = uniform() * 0.5f, g[i] = uniform(), add[i] = uniform();
        s[i] = h[i] + d[i];
    }
    for (size_t i = 0; i < dim; i++) w[i] = uniform() + 1.0f;
    CHECK_OK(parity_rmsnorm_backward(NULL, rows, dim, s, stride, w, 1e-6f, g, stride,
                                     with_add ? add : NULL, stride, ref, stride, ref_w));
    parity_cpu_path paths[4];
    const size_t n_paths = runnable_cpu_paths(paths), saved = parity_get_cpu_path();
    for (size_t p = 0; p < n_paths; p++) {
        parity_set_cpu_path(paths[p]);
        for (int use_pool = 0; use_pool < 2; use_pool++)
            for (int weight = 0; weight < 2; weight++) {
                memset(out, 0x5a, n * 4);
                memset(out_w, 0x5a, dim * 4);
                CHECK_OK(parity_rmsnorm_residual_backward(
                    use_pool ? pool2 : NULL, rows, dim, h, stride, d, stride, w, 1e-6f, g,
                    stride, with_add ? add : NULL, stride, out, stride, weight ? out_w : NULL));
                for (size_t r = 0; r < rows; r++) {
                    CHECK_BITS_F32(out + r * stride, ref + r * stride, dim, "d_x");
                    for (size_t c = dim; c < stride; c++) {
                        uint32_t bits;
                        memcpy(&bits, out + r * stride + c, 4);
                        CHECK_INT(bits, 0x5a5a5a5au);  /* past the row: untouched */
                    }
                }
                if (weight) CHECK_BITS_F32(out_w, ref_w, dim, "d_weight");
                else for (size_t c = 0; c < dim; c++) CHECK(!memcmp(out_w + c, "ZZZZ", 4));
            }
    }
    parity_set_cpu_path((parity_cpu_path)saved);
    free(h), free(d), free(s), free(g), free(add), free(w), free(ref), free(out), free(ref_w);
    free(out_w);
}

static void test_rmsnorm_residual_backward(parity_pool *pool2) {
    static const size_t shapes[][3] = {{1, 1, 0}, {3, 7, 2}, {37, 64, 0}, {70, 256, 5},
                                       {129, 33, 1}};
    for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++)
        for (int with_add = 0; with_add < 2; with_add++)
            rmsnorm_residual_case(pool2, shapes[i][0], shapes[i][1], shapes[i][2], with_add);
}

static void test_rmsnorm_residual_bad_arguments(void) {
    const parity_status E = PARITY_ERR_INVALID_ARGUMENT;
    float h[8] = {1, 2, 3, 4, 5, 6, 7, 8}, d[8] = {0}, w[4] = {1, 1, 1, 1}, g[8] = {0};
    float o[16], dw[4];
    memset(o, 0x7f, sizeof o);
    memset(dw, 0x7f, sizeof dw);
    CHECK_STATUS(parity_rmsnorm_residual_backward(NULL, 2, 4, NULL, 4, d, 4, w, 1e-6f, g, 4,
                                                  NULL, 0, o, 4, dw), E);
    CHECK(strstr(parity_last_error(), "parity_rmsnorm_residual_backward: residual is NULL"));
    CHECK_STATUS(parity_rmsnorm_residual_backward(NULL, 2, 4, h, 4, NULL, 4, w, 1e-6f, g, 4,
                                                  NULL, 0, o, 4, dw), E);
    CHECK(strstr(parity_last_error(), "delta is NULL") != NULL);
    CHECK_STATUS(parity_rmsnorm_residual_backward(NULL, 2, 4, h, 4, d, 3, w, 1e-6f, g, 4,
                                                  NULL, 0, o, 4, dw), E);
    CHECK(strstr(parity_last_error(), "delta stride 3") != NULL);
    CHECK_STATUS(parity_rmsnorm_residual_backward(NULL, 2, 4, h, 2, d, 4, w, 1e-6f, g, 4,
                                                  NULL, 0, o, 4, dw), E);
    CHECK(strstr(parity_last_error(), "residual stride 2") != NULL);
    CHECK_STATUS(parity_rmsnorm_residual_backward(NULL, 0, 4, h, 4, d, 4, w, 1e-6f, g, 4,
                                                  NULL, 0, o, 4, dw), E);
    CHECK_STATUS(parity_rmsnorm_residual_backward(NULL, 2, 4, h, 4, d, 4, w, 0.0f, g, 4,
                                                  NULL, 0, o, 4, dw), E);
    CHECK(strstr(parity_last_error(), "eps") != NULL);
    CHECK_STATUS(parity_rmsnorm_residual_backward(NULL, 2, 4, h, 4, o + 2, 4, w, 1e-6f, g, 4,
                                                  NULL, 0, o + 8, 4, dw), E);
    CHECK(strstr(parity_last_error(), "d_x overlaps delta") != NULL);
    CHECK_STATUS(parity_rmsnorm_residual_backward(NULL, 2, 4, h, 4, o, 4, w, 1e-6f, g, 4,
                                                  NULL, 0, o + 8, 4, o + 6), E);
    CHECK(strstr(parity_last_error(), "d_weight overlaps delta") != NULL);
    CHECK_STATUS(parity_rmsnorm_residual_backward(NULL, 2, 4, o, 4, d, 4, w, 1e-6f, g, 4,
                                                  NULL, 0, o + 4, 4, dw), E);
    CHECK(strstr(parity_last_error(), "d_x overlaps residual") != NULL);
    CHECK(untouched(o, 16) && untouched(dw, 4));
}

int main(void) {
    parity_pool *pool2 = NULL;
    CHECK_OK(parity_pool_create(2, &pool2));
    test_rope_bad_arguments();
    test_rope_backward(pool2);
    test_rmsnorm_residual_bad_arguments();
    test_rmsnorm_residual_backward(pool2);
    parity_pool_free(pool2);
    return check_report("grad_regions");
}
