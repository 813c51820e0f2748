/* The amx backend's GEMM (parity_linear with PARITY_BACKEND_AMX), on a CPU with AMX-BF16 and
 * the OS's tile permission; elsewhere the backend must be refused with
 * PARITY_ERR_UNSUPPORTED and a reason, and the rest is skipped (exit 77).
 *
 * What the backend promises (parity.h, DESIGN.md "The amx backend"), checked bitwise:
 *   - a row's outputs do not depend on the rows beside it, on its place in a row block, on
 *     M, on the pool, on which output columns are computed together, or on strides;
 *   - exact sums come out exact, through K and N tails (zero padding adds nothing);
 *   - a row holding a value that is not bf16 gets the bf16 backend's bits, and leaves the
 *     other rows' bits alone;
 *   - it is another arithmetic than the bf16 backend's pair32 (some outputs differ), within
 *     fp32 accumulation error of the exact sum;
 *   - denormal bf16 inputs are read as zero;
 *   - policies without bf16 GEMMs (compute fp32, fp16) get the bf16 backend's bits. */
#include <math.h>

#include "check.h"

static uint64_t rng = 0x9e3779b97f4a7c15ull;
static uint64_t next_u64(void) {
    rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
    return rng;
}
/* A bf16 value, normal(0, scale)-ish (sum of uniforms). */
static float random_bf16(float scale) {
    double s = 0;
    for (int i = 0; i < 4; i++) s += (double)(next_u64() >> 11) / 9007199254740992.0 - 0.5;
    return parity_bf16_to_f32(parity_bf16_from_f32((float)(s * 1.7320508 * scale)));
}

static float *floats(size_t n) { return calloc(n ? n : 1, sizeof(float)); }
static uint16_t *bf16s(size_t n) { return calloc(n ? n : 1, sizeof(uint16_t)); }

static parity_policy aligned;
static parity_pool *pool2;

static int linear(parity_pool *pool, uint32_t backend, size_t M, size_t K, size_t N,
                  const float *x, size_t ldx, const uint16_t *w, size_t ldw, float *y, size_t ldy) {
    return parity_linear(pool, &aligned, backend, M, K, N, x, ldx, PARITY_DTYPE_BF16, w, ldw, NULL,
                         y, ldy);
}

/* Small integers: every partial sum is an integer below 2^24, so any order gives the exact
 * sum; K and N are not multiples of the tiles. */
static void check_exact(void) {
    const size_t M = 37, K = 1001, N = 53;
    float *x = floats(M * K), *y = floats(M * N);
    uint16_t *w = bf16s(N * K);
    for (size_t i = 0; i < M * K; i++) x[i] = (float)((int)(next_u64() % 15) - 7);
    for (size_t i = 0; i < N * K; i++) w[i] = parity_bf16_from_f32((float)((int)(next_u64() % 9) - 4));
    CHECK_OK(linear(pool2, PARITY_BACKEND_AMX, M, K, N, x, K, w, K, y, N));
    size_t wrong = 0;
    for (size_t m = 0; m < M; m++)
        for (size_t n = 0; n < N; n++) {
            double s = 0;
            for (size_t k = 0; k < K; k++) s += (double)x[m * K + k] * parity_bf16_to_f32(w[n * K + k]);
            if ((double)y[m * N + n] != s) wrong++;
        }
    CHECK_INT(wrong, 0);
    free(x), free(y), free(w);
}

/* One row's bits whatever surrounds it. */
static void check_invariance(size_t M, size_t K, size_t N) {
    float *x = floats(M * K), *y = floats(M * N), *y1 = floats(N), *yb = floats(3 * M * N);
    float *xb = floats(3 * M * (K + 3));
    uint16_t *w = bf16s(N * K);
    for (size_t i = 0; i < M * K; i++) x[i] = random_bf16(1.0f);
    for (size_t i = 0; i < N * K; i++) w[i] = parity_bf16_from_f32(random_bf16(0.05f));
    CHECK_OK(linear(pool2, PARITY_BACKEND_AMX, M, K, N, x, K, w, K, y, N));
    char what[128];
    /* each row alone, on the caller's thread */
    for (size_t m = 0; m < M; m++) {
        CHECK_OK(linear(NULL, PARITY_BACKEND_AMX, 1, K, N, x + m * K, K, w, K, y1, N));
        snprintf(what, sizeof what, "M %zu K %zu N %zu: row %zu alone", M, K, N, m);
        CHECK_BITS_F32(y1, y + m * N, N, what);
    }
    /* the rows in reverse, each between two random rows (other tile positions, M = 3M), x
     * and y with other strides */
    const size_t ldx = K + 3, ldy = N + 5;
    float *yw = floats(3 * M * ldy);
    for (size_t m = 0; m < M; m++) {
        const size_t at = 3 * (M - 1 - m) + 1;
        memcpy(xb + at * ldx, x + m * K, K * sizeof *x);
        for (size_t k = 0; k < K; k++) {
            xb[(at - 1) * ldx + k] = random_bf16(2.0f);
            xb[(at + 1) * ldx + k] = random_bf16(0.5f);
        }
    }
    CHECK_OK(linear(pool2, PARITY_BACKEND_AMX, 3 * M, K, N, xb, ldx, w, K, yw, ldy));
    size_t bad = 0;
    for (size_t m = 0; m < M; m++)
        bad += memcmp(yw + (3 * (M - 1 - m) + 1) * ldy, y + m * N, N * sizeof *y) != 0;
    snprintf(what, sizeof what, "M %zu K %zu N %zu: rows reversed among others", M, K, N);
    CHECK_INT(bad, 0);
    if (bad) fprintf(stderr, "  (%s)\n", what);
    /* the columns from 16 on, as a matrix of their own: other column blocks and tiles */
    if (N > 16) {
        CHECK_OK(linear(pool2, PARITY_BACKEND_AMX, M, K, N - 16, x, K, w + 16 * K, K, yb, N - 16));
        bad = 0;
        for (size_t m = 0; m < M; m++)
            bad += memcmp(yb + m * (N - 16), y + m * N + 16, (N - 16) * sizeof *y) != 0;
        CHECK_INT(bad, 0);
    }
    free(x), free(y), free(y1), free(yb), free(xb), free(yw), free(w);
}

/* Another arithmetic than pair32, near the exact sum; a row that is not bf16 is the bf16
 * backend's, alone. */
static void check_against_bf16_backend(void) {
    const size_t M = 20, K = 1024, N = 96;
    float *x = floats(M * K), *ya = floats(M * N), *yb = floats(M * N), *yc = floats(M * N);
    uint16_t *w = bf16s(N * K);
    for (size_t i = 0; i < M * K; i++) x[i] = random_bf16(1.0f);
    for (size_t i = 0; i < N * K; i++) w[i] = parity_bf16_from_f32(random_bf16(0.05f));
    CHECK_OK(linear(pool2, PARITY_BACKEND_AMX, M, K, N, x, K, w, K, ya, N));
    CHECK_OK(linear(pool2, PARITY_BACKEND_BF16, M, K, N, x, K, w, K, yb, N));
    size_t differ = 0, far = 0;
    for (size_t m = 0; m < M; m++)
        for (size_t n = 0; n < N; n++) {
            double s = 0, a = 0;
            for (size_t k = 0; k < K; k++) {
                const double p = (double)x[m * K + k] * parity_bf16_to_f32(w[n * K + k]);
                s += p, a += fabs(p);
            }
            differ += ya[m * N + n] != yb[m * N + n];
            /* fp32 accumulation: at most about K roundings of 2^-24 of the running |sum| */
            far += fabs((double)ya[m * N + n] - s) > (double)K * 0x1p-24 * a;
        }
    printf("amx vs bf16 backend: %zu of %zu outputs differ\n", differ, M * N);
    CHECK(differ > 0);
    CHECK_INT(far, 0);

    /* row 3 holds fp32 values that are not bf16: its outputs are the bf16 backend's, and
     * every other row's are unchanged */
    for (size_t k = 0; k < K; k++) x[3 * K + k] = random_bf16(1.0f) * 1.0009765625f + 1e-3f;
    CHECK_OK(linear(pool2, PARITY_BACKEND_AMX, M, K, N, x, K, w, K, yc, N));
    CHECK_OK(linear(NULL, PARITY_BACKEND_BF16, 1, K, N, x + 3 * K, K, w, K, yb + 3 * N, N));
    CHECK_BITS_F32(yc + 3 * N, yb + 3 * N, N, "a row that is not bf16: the bf16 backend's bits");
    for (size_t m = 0; m < M; m++)
        if (m != 3) CHECK_BITS_F32(yc + m * N, ya + m * N, N, "rows beside one that is not bf16");
    /* every row not bf16: the bf16 backend's bits throughout */
    for (size_t i = 0; i < M * K; i++) x[i] += 1e-3f;
    CHECK_OK(linear(pool2, PARITY_BACKEND_AMX, M, K, N, x, K, w, K, yc, N));
    CHECK_OK(linear(pool2, PARITY_BACKEND_BF16, M, K, N, x, K, w, K, yb, N));
    CHECK_BITS_F32(yc, yb, M * N, "no row bf16: the bf16 backend's bits");
    free(x), free(ya), free(yb), free(yc), free(w);
}

/* Denormal bf16 inputs count as zero (the tile unit's DAZ): a row of denormals against
 * weights gives +0, and denormals beside normal values change nothing. */
static void check_denormals(void) {
    const size_t K = 64, N = 16;
    float x[2 * 64], y[2 * 16];
    uint16_t w[16 * 64];
    for (size_t i = 0; i < N * K; i++) w[i] = parity_bf16_from_f32(random_bf16(1.0f) + 2.0f);
    for (size_t k = 0; k < K; k++) {
        x[k] = parity_bf16_to_f32((uint16_t)(1 + k % 0x7f)); /* positive denormals */
        x[K + k] = k % 2 ? random_bf16(1.0f) : parity_bf16_to_f32((uint16_t)(0x8000 | (1 + k)));
    }
    CHECK_OK(linear(NULL, PARITY_BACKEND_AMX, 2, K, N, x, K, w, K, y, N));
    size_t nonzero = 0;
    for (size_t n = 0; n < N; n++) nonzero += y[n] != 0.0f;
    CHECK_INT(nonzero, 0);
    float x2[64], y2[16];
    for (size_t k = 0; k < K; k++) x2[k] = k % 2 ? x[K + k] : 0.0f;
    CHECK_OK(linear(NULL, PARITY_BACKEND_AMX, 1, K, N, x2, K, w, K, y2, N));
    CHECK_BITS_F32(y + N, y2, N, "denormal inputs read as zero");
}

/* Compute fp32 and fp16 have no bf16 GEMM: the amx backend gives the bf16 backend's bits. */
static void check_other_formats(void) {
    const size_t M = 9, K = 100, N = 40;
    float *x = floats(M * K), *ya = floats(M * N), *yb = floats(M * N), *w32 = floats(N * K);
    uint16_t *w16 = bf16s(N * K);
    for (size_t i = 0; i < M * K; i++) x[i] = random_bf16(1.0f) * 1.001f;
    for (size_t i = 0; i < N * K; i++) {
        w32[i] = random_bf16(0.05f);
        w16[i] = parity_fp16_from_f32(w32[i]);
    }
    static const char *const pols[] = {"fp32", "hf-eager+fp16"};
    for (int i = 0; i < 2; i++) {
        parity_policy p;
        CHECK_OK(parity_policy_from_name(pols[i], &p));
        const uint32_t dt = i == 0 ? PARITY_DTYPE_F32 : PARITY_DTYPE_F16;
        const void *w = i == 0 ? (const void *)w32 : (const void *)w16;
        CHECK_OK(parity_linear(pool2, &p, PARITY_BACKEND_AMX, M, K, N, x, K, dt, w, K, NULL, ya, N));
        CHECK_OK(parity_linear(pool2, &p, PARITY_BACKEND_BF16, M, K, N, x, K, dt, w, K, NULL, yb, N));
        CHECK_BITS_F32(ya, yb, M * N, pols[i]);
    }
    free(x), free(ya), free(yb), free(w32), free(w16);
}

int main(void) {
    CHECK_OK(parity_policy_from_name("aligned", &aligned));
    float x[32] = {0}, y[16];
    uint16_t w[16 * 32] = {0};
    const int rc = linear(NULL, PARITY_BACKEND_AMX, 1, 32, 16, x, 32, w, 32, y, 16);
    if (rc != PARITY_OK) {
        CHECK_INT(rc, PARITY_ERR_UNSUPPORTED);
        CHECK(strstr(parity_last_error(), "amx backend is not available") != NULL);
        printf("amx: skipped: %s\n", parity_last_error());
        check_report("amx");
        return check_failures ? 1 : 77;
    }
    CHECK_OK(parity_pool_create(2, &pool2));
    check_exact();
    check_invariance(45, 333, 50);
    check_invariance(17, 64, 16);
    check_invariance(70, 1024, 130);
    check_invariance(1, 96, 200);
    check_against_bf16_backend();
    check_denormals();
    check_other_formats();
    parity_pool_free(pool2);
    return check_report("amx");
}
