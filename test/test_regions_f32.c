/*
 * The region kernels on fp32 buffers (parity_rmsnorm_residual_f32, parity_rmsnorm_f32,
 * parity_swiglu_f32, parity_rope_f32) against their 16-bit calls on the 16-bit casts of the
 * same inputs, widened: bit for bit, on every CPU path, under policies of each rounding
 * choice and of each buffer format (bf16, fp16, compute fp32), with a NULL pool and pools of
 * 1, 2 and 3 threads, in place where an output may be an input, on inputs that are 16-bit
 * values and on inputs that are not (and NaN, infinities, subnormals). The array cast
 * parity_bf16_from_f32_array against parity_bf16_from_f32, element by element. Then the
 * argument checks.
 */
#include <math.h>
#include <string.h>

#include "check.h"
#include "base/floats.h"

static uint64_t rng_state = 0x9e3779b97f4a7c15ull;

static uint32_t next_u32(void) {
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return (uint32_t)(rng_state >> 11);
}

/* A value in about [-scale, scale]; every 61st a special one (NaN, +-inf, a subnormal, a
 * large value, -0). With `exact`, rounded to the buffer format, as a learner's activations
 * are at a rounding point. */
static float sample(float scale, int exact, int fp16) {
    const uint32_t u = next_u32();
    float x = ((float)(u % 2000001u) / 1000000.0f - 1.0f) * scale;
    switch (u % 61u) {
    case 0: x = NAN; break;
    case 1: x = INFINITY; break;
    case 2: x = -INFINITY; break;
    case 3: x = 1e-40f; break;
    case 4: x = 7e4f; break;
    case 5: x = -0.0f; break;
    default: break;
    }
    if (exact) x = fp16 ? round_fp16(x) : round_bf16(x);
    return x;
}

static float *values(size_t n, float scale, int exact, int fp16) {
    float *p = malloc(n * sizeof(float));
    if (!p) exit(2);
    for (size_t i = 0; i < n; i++) p[i] = sample(scale, exact, fp16);
    return p;
}

static float *copy_of(const float *x, size_t n) {
    float *p = malloc(n * sizeof(float));
    if (!p) exit(2);
    memcpy(p, x, n * sizeof(float));
    return p;
}

/* The 16-bit casts the 16-bit API's caller makes (fp16 under compute fp16, else bf16). */
static uint16_t *narrow(const float *x, size_t n, int fp16) {
    uint16_t *p = malloc(n * sizeof(uint16_t));
    if (!p) exit(2);
    for (size_t i = 0; i < n; i++) p[i] = fp16 ? f16_from_f32(x[i]) : bf16_from_f32(x[i]);
    return p;
}

static float *widen(const uint16_t *x, size_t n, int fp16) {
    float *p = malloc(n * sizeof(float));
    if (!p) exit(2);
    for (size_t i = 0; i < n; i++) p[i] = fp16 ? f16_to_f32(x[i]) : bf16_to_f32(x[i]);
    return p;
}

static int same_bits(const float *a, const float *b, size_t n) {
    for (size_t i = 0; i < n; i++)
        if (f32_bits(a[i]) != f32_bits(b[i])) {
            fprintf(stderr, "  element %zu: %08x != %08x\n", i, (unsigned)f32_bits(a[i]),
                    (unsigned)f32_bits(b[i]));
            return 0;
        }
    return 1;
}

#define N_POOLS 4
static parity_pool *pools[N_POOLS]; /* NULL, 1, 2, 3 threads */

static void run_shape(const parity_policy *pol, size_t rows, size_t dim, int exact) {
    const int fp16 = pol->compute == PARITY_COMPUTE_FP16;
    const size_t n = rows * dim, ld = dim + 3; /* the strided calls' rows ld apart */
    float *delta = values(n, 4.0f, exact, fp16), *res = values(n, 8.0f, exact, fp16);
    float *w = values(dim, 1.5f, exact, fp16);
    uint16_t *d16 = narrow(delta, n, fp16), *r16 = narrow(res, n, fp16);
    uint16_t *w16 = narrow(w, dim, fp16);
    uint16_t *ro16 = malloc(n * 2), *o16 = malloc(n * 2);
    if (!ro16 || !o16) exit(2);

    /* residual + RMSNorm */
    CHECK_OK(parity_rmsnorm_residual(pol, rows, dim, d16, dim, r16, dim, w16, 1e-6f, ro16, dim,
                                     o16, dim));
    float *want_res = widen(ro16, n, fp16), *want_out = widen(o16, n, fp16);
    float *got_res = malloc(n * 4), *got_out = malloc(n * 4);
    if (!got_res || !got_out) exit(2);
    for (int p = 0; p < N_POOLS; p++) {
        memset(got_res, 0xa5, n * 4);
        memset(got_out, 0xa5, n * 4);
        CHECK_OK(parity_rmsnorm_residual_f32(pools[p], pol, rows, dim, delta, dim, res, dim, w,
                                             1e-6f, got_res, dim, got_out, dim));
        CHECK(same_bits(want_res, got_res, n));
        CHECK(same_bits(want_out, got_out, n));
    }
    /* in place (residual_out on residual, out on delta), rows ld apart */
    float *d_ld = calloc(rows * ld, 4), *r_ld = calloc(rows * ld, 4);
    if (!d_ld || !r_ld) exit(2);
    for (size_t r = 0; r < rows; r++) {
        memcpy(d_ld + r * ld, delta + r * dim, dim * 4);
        memcpy(r_ld + r * ld, res + r * dim, dim * 4);
    }
    CHECK_OK(parity_rmsnorm_residual_f32(pools[2], pol, rows, dim, d_ld, ld, r_ld, ld, w, 1e-6f,
                                         r_ld, ld, d_ld, ld));
    for (size_t r = 0; r < rows; r++) {
        CHECK(same_bits(want_res + r * dim, r_ld + r * ld, dim));
        CHECK(same_bits(want_out + r * dim, d_ld + r * ld, dim));
    }

    /* RMSNorm, both switches */
    for (int qk = 0; qk < 2; qk++) {
        CHECK_OK(parity_rmsnorm(pol, qk, rows, dim, d16, dim, w16, 1e-6f, o16, dim));
        float *want = widen(o16, n, fp16);
        for (int p = 0; p < N_POOLS; p++) {
            memset(got_out, 0xa5, n * 4);
            CHECK_OK(parity_rmsnorm_f32(pools[p], pol, qk, rows, dim, delta, dim, w, 1e-6f,
                                        got_out, dim));
            CHECK(same_bits(want, got_out, n));
        }
        float *x = copy_of(delta, n);
        CHECK_OK(parity_rmsnorm_f32(pools[3], pol, qk, rows, dim, x, dim, w, 1e-6f, x, dim));
        CHECK(same_bits(want, x, n));
        free(x);
        free(want);
    }

    /* SwiGLU, and in place on gate and on up */
    CHECK_OK(parity_swiglu(pol, rows, dim, d16, dim, r16, dim, o16, dim));
    float *want_sw = widen(o16, n, fp16);
    for (int p = 0; p < N_POOLS; p++) {
        memset(got_out, 0xa5, n * 4);
        CHECK_OK(parity_swiglu_f32(pools[p], pol, rows, dim, delta, dim, res, dim, got_out, dim));
        CHECK(same_bits(want_sw, got_out, n));
    }
    for (int on_up = 0; on_up < 2; on_up++) {
        float *g = copy_of(delta, n), *u = copy_of(res, n);
        CHECK_OK(parity_swiglu_f32(pools[2], pol, rows, dim, g, dim, u, dim, on_up ? u : g, dim));
        CHECK(same_bits(want_sw, on_up ? u : g, n));
        free(g);
        free(u);
    }

    free(delta), free(res), free(w), free(d16), free(r16), free(w16), free(ro16), free(o16);
    free(want_res), free(want_out), free(got_res), free(got_out), free(d_ld), free(r_ld);
    free(want_sw);
}

static void run_rope(const parity_policy *pol, size_t rows, size_t heads, size_t hd,
                     double theta, int exact) {
    const int fp16 = pol->compute == PARITY_COMPUTE_FP16;
    const size_t width = heads * hd, n = rows * width, ld = width + 5;
    float *x = values(n, 3.0f, exact, fp16);
    int32_t *pos = malloc(rows * sizeof(int32_t));
    if (!pos) exit(2);
    for (size_t r = 0; r < rows; r++) pos[r] = (int32_t)(next_u32() % 40000u);
    uint16_t *x16 = narrow(x, n, fp16);
    CHECK_OK(parity_rope(pol, rows, heads, hd, x16, width, pos, theta));
    float *want = widen(x16, n, fp16), *got = malloc(n * 4);
    if (!got) exit(2);
    for (int p = 0; p < N_POOLS; p++) {
        memset(got, 0xa5, n * 4);
        CHECK_OK(parity_rope_f32(pools[p], pol, rows, heads, hd, x, width, got, width, pos,
                                 theta));
        CHECK(same_bits(want, got, n));
    }
    float *in_place = calloc(rows * ld, 4);
    if (!in_place) exit(2);
    for (size_t r = 0; r < rows; r++) memcpy(in_place + r * ld, x + r * width, width * 4);
    CHECK_OK(parity_rope_f32(pools[2], pol, rows, heads, hd, in_place, ld, in_place, ld, pos,
                             theta));
    for (size_t r = 0; r < rows; r++) CHECK(same_bits(want + r * width, in_place + r * ld, width));
    free(x), free(pos), free(x16), free(want), free(got), free(in_place);
}

static void test_bf16_array(void) {
    const size_t sizes[] = {1, 15, 16384, 16385, 100003};
    for (size_t s = 0; s < sizeof sizes / sizeof sizes[0]; s++) {
        const size_t n = sizes[s];
        float *x = values(n, 1e3f, 0, 0);
        /* every rounding case at the bf16 boundary: ties to even both ways, just off them */
        for (size_t i = 0; i + 4 < n && i < 64; i += 4) {
            const uint32_t base = 0x3f800000u + (uint32_t)i * 0x10000u;
            x[i] = f32_from_bits(base | 0x8000u);
            x[i + 1] = f32_from_bits(base | 0x18000u);
            x[i + 2] = f32_from_bits(base | 0x7fffu);
            x[i + 3] = f32_from_bits(base | 0x8001u);
        }
        uint16_t *got = malloc(n * 2);
        if (!got) exit(2);
        for (int p = 0; p < N_POOLS; p++) {
            memset(got, 0xa5, n * 2);
            CHECK_OK(parity_bf16_from_f32_array(pools[p], n, x, got));
            size_t bad = 0;
            for (size_t i = 0; i < n; i++) bad += got[i] != parity_bf16_from_f32(x[i]);
            CHECK_INT(bad, 0);
        }
        free(x);
        free(got);
    }
    float x[8] = {0};
    uint16_t out[8];
    CHECK_OK(parity_bf16_from_f32_array(NULL, 0, x, out));
    CHECK_STATUS(parity_bf16_from_f32_array(NULL, 8, NULL, out), PARITY_ERR_INVALID_ARGUMENT);
    CHECK_STATUS(parity_bf16_from_f32_array(NULL, 8, x, NULL), PARITY_ERR_INVALID_ARGUMENT);
    CHECK_STATUS(parity_bf16_from_f32_array(NULL, 8, x, (uint16_t *)(x + 2)),
                 PARITY_ERR_INVALID_ARGUMENT);
    CHECK_STATUS(parity_bf16_from_f32_array(NULL, SIZE_MAX / 2, x, out),
                 PARITY_ERR_INVALID_ARGUMENT);
}

static void test_arguments(void) {
    parity_policy pol;
    CHECK_OK(parity_policy_from_name("aligned", &pol));
    float buf[64] = {0}, out[64], w[8] = {1, 1, 1, 1, 1, 1, 1, 1};
    int32_t pos[4] = {0, 1, 2, -1};
    const int bad = PARITY_ERR_INVALID_ARGUMENT;
    CHECK_STATUS(parity_rmsnorm_residual_f32(NULL, NULL, 2, 8, buf, 8, buf + 16, 8, w, 1e-6f,
                                             out, 8, out + 16, 8), bad);
    CHECK_STATUS(parity_rmsnorm_residual_f32(NULL, &pol, 0, 8, buf, 8, buf + 16, 8, w, 1e-6f,
                                             out, 8, out + 16, 8), bad);
    CHECK_STATUS(parity_rmsnorm_residual_f32(NULL, &pol, 2, 8, buf, 4, buf + 16, 8, w, 1e-6f,
                                             out, 8, out + 16, 8), bad);
    CHECK_STATUS(parity_rmsnorm_residual_f32(NULL, &pol, 2, 8, buf, 8, buf + 16, 8, NULL, 1e-6f,
                                             out, 8, out + 16, 8), bad);
    CHECK_STATUS(parity_rmsnorm_residual_f32(NULL, &pol, 2, 8, buf, 8, buf + 16, 8, w, 0.0f,
                                             out, 8, out + 16, 8), bad);
    /* outputs overlapping each other, an input partly, or the weight */
    CHECK_STATUS(parity_rmsnorm_residual_f32(NULL, &pol, 2, 8, buf, 8, buf + 16, 8, w, 1e-6f,
                                             out, 8, out + 8, 8), bad);
    CHECK_STATUS(parity_rmsnorm_residual_f32(NULL, &pol, 2, 8, buf, 8, buf + 16, 8, w, 1e-6f,
                                             buf + 4, 8, out, 8), bad);
    CHECK_STATUS(parity_rmsnorm_residual_f32(NULL, &pol, 2, 8, buf, 8, buf + 16, 8, buf + 40,
                                             1e-6f, buf + 32, 8, out, 8), bad);
    CHECK_STATUS(parity_rmsnorm_residual_f32(NULL, &pol, 2, 8, buf, 8, buf + 16, 8, w, 1e-6f,
                                             buf + 16, 16, out, 8), bad);
    CHECK_OK(parity_rmsnorm_residual_f32(NULL, &pol, 2, 8, buf, 8, buf + 16, 8, w, 1e-6f,
                                         buf + 16, 8, buf, 8));
    CHECK_STATUS(parity_rmsnorm_f32(NULL, &pol, 1, 2, 8, buf, 8, w, 1e-6f, buf + 1, 8), bad);
    CHECK_STATUS(parity_rmsnorm_f32(NULL, &pol, 1, 2, 8, buf, 8, NULL, 1e-6f, out, 8), bad);
    CHECK_STATUS(parity_rmsnorm_f32(NULL, &pol, 1, 2, 8, buf, 8, w, NAN, out, 8), bad);
    CHECK_STATUS(parity_swiglu_f32(NULL, &pol, 2, 8, buf, 8, buf + 16, 8, buf + 20, 8), bad);
    CHECK_STATUS(parity_swiglu_f32(NULL, &pol, 2, 0, buf, 8, buf + 16, 8, out, 8), bad);
    CHECK_STATUS(parity_swiglu_f32(NULL, &pol, 2, 8, NULL, 8, buf + 16, 8, out, 8), bad);
    CHECK_STATUS(parity_rope_f32(NULL, &pol, 4, 2, 4, buf, 8, out, 8, pos, 1e4), bad);
    CHECK_STATUS(parity_rope_f32(NULL, &pol, 3, 2, 3, buf, 6, out, 6, pos, 1e4), bad);
    CHECK_STATUS(parity_rope_f32(NULL, &pol, 3, 2, 4, buf, 8, out, 8, pos, -1.0), bad);
    CHECK_STATUS(parity_rope_f32(NULL, &pol, 3, 2, 4, buf, 8, buf + 4, 8, pos, 1e4), bad);
    CHECK_STATUS(parity_rope_f32(NULL, &pol, 3, 2, 4, buf, 8, out, 4, pos, 1e4), bad);
    CHECK_STATUS(parity_rope_f32(NULL, &pol, 3, 2, 4, buf, 8, out, 8, NULL, 1e4), bad);
    CHECK_OK(parity_rope_f32(NULL, &pol, 3, 2, 4, buf, 8, buf, 8, pos, 1e4));
}

int main(void) {
    static const char *const policies[] = {"aligned", "hf-eager", "vllm", "fp32",
                                           "hf-eager+fp16", "aligned+fp16"};
    pools[0] = NULL;
    for (int p = 1; p < N_POOLS; p++) CHECK_OK(parity_pool_create((uint32_t)p, &pools[p]));
    parity_cpu_path paths[4] = {PARITY_CPU_PORTABLE, PARITY_CPU_AVX2, PARITY_CPU_AVX512,
                                PARITY_CPU_AVX512BF16};
    for (int c = 0; c < 4; c++) {
        const char *name = parity_cpu_path_name(paths[c]);
        if (parity_set_cpu_path(paths[c]) != PARITY_OK) {
            printf("path %s: not available here, skipped\n", name);
            continue;
        }
        printf("path %s:", name);
        for (size_t i = 0; i < sizeof policies / sizeof policies[0]; i++) {
            parity_policy pol;
            CHECK_OK(parity_policy_from_name(policies[i], &pol));
            printf(" %s", policies[i]);
            for (int exact = 0; exact < 2; exact++) {
                run_shape(&pol, 37, 256, exact);
                run_shape(&pol, 5, 1001, exact);
                run_shape(&pol, 1, 7, exact);
                run_rope(&pol, 29, 4, 64, 1e6, exact);
                run_rope(&pol, 3, 3, 10, 1e4, exact);
            }
        }
        printf("\n");
    }
    test_bf16_array();
    test_arguments();
    for (int p = 1; p < N_POOLS; p++) parity_pool_free(pools[p]);
    return check_report("test_regions_f32");
}
