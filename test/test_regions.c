/*
 * The public region API against known answers computed with PyTorch
 * (test/data/regions.safetensors, made by test/data/reference/tools/make_region_vectors.py):
 * residual + RMSNorm, q/k-norm, SwiGLU and RoPE under the three modes of the vectors, each
 * mapped to its policy switches, on every CPU path. PyTorch's reductions and vectorised
 * exp/cos can differ from ours in the last fp32 bit, which may flip a rare bf16 rounding, so
 * the bar is: >= 99.9% of the elements bitwise equal and the rest within one bf16 ulp. A
 * policy run against another mode's answers must miss by far more, or the bar would prove
 * nothing. Then the argument checks.
 */
#include <math.h>
#include <string.h>

#include "check.h"
#include "base/floats.h"
#include "checkpoint/safetensors.h"

static st_file *vectors;

/* A copy of tensor `name` (the mapping is read-only and not necessarily aligned), which must
 * hold `n` elements of `dtype`. */
static void *tensor(const char *name, st_dtype dtype, size_t n) {
    const st_tensor *t = st_find(vectors, name);
    if (!t || t->dtype != dtype || t->n_elements != n) {
        fprintf(stderr, "regions.safetensors: %s missing or not %s[%zu]\n", name,
                st_dtype_name(dtype), n);
        check_failures++;
        return calloc(n ? n : 1, st_dtype_size(dtype));
    }
    void *p = malloc(n * st_dtype_size(dtype));
    if (!p) exit(2);
    memcpy(p, t->data, n * st_dtype_size(dtype));
    return p;
}

/* ---- modes ------------------------------------------------------------------------------ */

enum { HF, VLLM, ALIGNED, N_MODES };
static const char *const mode_names[N_MODES] = {"hf_bf16", "vllm", "aligned"};

/* The policy switches each mode of the vectors stands for (README of the reference data). */
static parity_policy mode_policy(int mode) {
    static const struct {
        uint8_t norm_input, norm_round, rope_table, rope_apply, swiglu;
    } modes[N_MODES] = {
        [HF] = {PARITY_NORM_INPUT_ROUNDED, PARITY_NORM_ROUND_TWICE, PARITY_ROPE_TABLE_BF16,
                PARITY_ROPE_PER_OP, PARITY_SWIGLU_PER_OP},
        [VLLM] = {PARITY_NORM_INPUT_FP32, PARITY_NORM_ROUND_TWICE, PARITY_ROPE_TABLE_BF16,
                  PARITY_ROPE_FUSED, PARITY_SWIGLU_FUSED},
        [ALIGNED] = {PARITY_NORM_INPUT_FP32, PARITY_NORM_ROUND_ONCE, PARITY_ROPE_TABLE_FP32,
                     PARITY_ROPE_FUSED, PARITY_SWIGLU_FUSED},
    };
    parity_policy p;
    memset(&p, 0, sizeof p);
    p.compute = PARITY_COMPUTE_BF16;
    p.norm_input = modes[mode].norm_input;
    p.norm_weight = p.qk_norm = modes[mode].norm_round;
    p.rope_table = modes[mode].rope_table;
    p.rope_apply = modes[mode].rope_apply;
    p.swiglu = modes[mode].swiglu;
    return p;
}

/* The two modes a policy is run against the other's answers in, and the other of each. */
static const int hf_and_aligned[2] = {HF, ALIGNED};
static int other_mode(int mode) { return mode == HF ? ALIGNED : HF; }

/* ---- agreement -------------------------------------------------------------------------- */

typedef struct agreement {
    size_t n, equal, one_ulp, worse;
} agreement;

static int32_t bf16_order(uint16_t h) { return h & 0x8000 ? -(int32_t)(h & 0x7fff) : h; }

static agreement compare(const uint16_t *want, const uint16_t *got, size_t n) {
    agreement a = {n, 0, 0, 0};
    for (size_t i = 0; i < n; i++) {
        int32_t d = bf16_order(want[i]) - bf16_order(got[i]);
        if (want[i] == got[i])
            a.equal++;
        else if (d == 1 || d == -1)
            a.one_ulp++;
        else
            a.worse++;
    }
    return a;
}

static double pct(size_t k, size_t n) { return 100.0 * (double)k / (double)n; }

/* The known-answer bar; prints the figures. */
static void expect_match(const char *region, const char *what, int mode, const char *path,
                         agreement a) {
    printf("  %-12s %-13s %-8s %-8s %7zu values: %8.4f%% bitwise, %zu within 1 ulp, %zu worse\n",
           region, what, mode_names[mode], path, a.n, pct(a.equal, a.n), a.one_ulp, a.worse);
    check_count++;
    if (pct(a.equal, a.n) < 99.9 || a.worse) {
        check_failures++;
        fprintf(stderr, "%s %s %s (%s): below the bar\n", region, what, mode_names[mode], path);
    }
}

/* A policy against another mode's answers: must miss on far more than 0.1%. */
static void expect_miss(const char *region, const char *what, agreement a) {
    printf("  %-12s %s: %.2f%% differ (must be > 1%%)\n", region, what,
           100.0 - pct(a.equal, a.n));
    CHECK(100.0 - pct(a.equal, a.n) > 1.0);
}

static void expect_miss_mode(const char *region, int policy_mode, int ref_mode, agreement a) {
    char what[96];
    snprintf(what, sizeof what, "%s policy vs %s answers", mode_names[policy_mode],
             mode_names[ref_mode]);
    expect_miss(region, what, a);
}

/* ---- the vectors' tensors --------------------------------------------------------------- */

/* Region `name`'s input `field` ("name.field"), n elements of dtype. */
static void *input(const char *name, const char *field, st_dtype dtype, size_t n) {
    char key[96];
    snprintf(key, sizeof key, "%s.%s", name, field);
    return tensor(key, dtype, n);
}

/* Region `name`'s answer `field` under `mode` ("name.mode.field"), n bf16 values. */
static uint16_t *answer(const char *name, int mode, const char *field, size_t n) {
    char key[96];
    snprintf(key, sizeof key, "%s.%s.%s", name, mode_names[mode], field);
    return tensor(key, ST_BF16, n);
}

/* `got`, computed under `mode`'s policy, against that mode's answer `field`: the bar. */
static void expect_answer(const char *name, const char *field, int mode, const char *path,
                          const uint16_t *got, size_t n) {
    uint16_t *want = answer(name, mode, field, n);
    expect_match(name, field, mode, path, compare(want, got, n));
    free(want);
}

/* `out`, computed under policy_mode's policy, against ref_mode's answer "out": a miss. */
static void expect_other_answer_missed(const char *name, int policy_mode, int ref_mode,
                                       const uint16_t *out, size_t n) {
    uint16_t *other = answer(name, ref_mode, "out", n);
    expect_miss_mode(name, policy_mode, ref_mode, compare(other, out, n));
    free(other);
}

/* n bf16 values of output space. */
static uint16_t *bf16_out(size_t n) {
    uint16_t *out = malloc(n * 2);
    if (!out) exit(2);
    return out;
}

/* ---- the regions ------------------------------------------------------------------------ */

static const float EPS = 1e-6f; /* the vectors' metadata: "*.eps": "1e-06" */

static void run_resnorm(const char *name, size_t rows, size_t dim, const char *path) {
    size_t n = rows * dim;
    uint16_t *delta = input(name, "delta", ST_BF16, n);
    uint16_t *residual = input(name, "residual", ST_BF16, n);
    uint16_t *weight = input(name, "weight", ST_BF16, dim);
    uint16_t *res_out = bf16_out(n), *out = bf16_out(n);
    for (int mode = 0; mode < N_MODES; mode++) {
        parity_policy pol = mode_policy(mode);
        CHECK_OK(parity_rmsnorm_residual(&pol, rows, dim, delta, dim, residual, dim, weight, EPS,
                                         res_out, dim, out, dim));
        expect_answer(name, "residual_out", mode, path, res_out, n);
        expect_answer(name, "out", mode, path, out, n);
    }
    if (strcmp(path, "portable") == 0) {
        /* the hf policy against the aligned answers, and the reverse */
        for (int m = 0; m < 2; m++) {
            int pm = hf_and_aligned[m];
            parity_policy pol = mode_policy(pm);
            CHECK_OK(parity_rmsnorm_residual(&pol, rows, dim, delta, dim, residual, dim, weight,
                                             EPS, res_out, dim, out, dim));
            expect_other_answer_missed(name, pm, other_mode(pm), out, n);
        }
    }
    free(delta), free(residual), free(weight), free(res_out), free(out);
}

static void run_qknorm(const char *path) {
    const size_t rows = 256, dim = 128, n = rows * dim;
    uint16_t *x = tensor("qknorm.x", ST_BF16, n), *w = tensor("qknorm.weight", ST_BF16, dim);
    uint16_t *out = bf16_out(n);
    for (int i = 0; i < 2; i++) {
        int mode = hf_and_aligned[i];
        parity_policy pol = mode_policy(mode);
        /* only qk_norm must matter: norm_weight set to the other choice */
        pol.norm_weight = pol.qk_norm == PARITY_NORM_ROUND_TWICE ? PARITY_NORM_ROUND_ONCE
                                                                 : PARITY_NORM_ROUND_TWICE;
        CHECK_OK(parity_rmsnorm(&pol, 1, rows, dim, x, dim, w, EPS, out, dim));
        expect_answer("qknorm", "out", mode, path, out, n);
        /* the same policy as a plain RMSNorm follows norm_weight: the other mode's answer */
        if (strcmp(path, "portable") == 0) {
            CHECK_OK(parity_rmsnorm(&pol, 0, rows, dim, x, dim, w, EPS, out, dim));
            char what[64];
            snprintf(what, sizeof what, "%s policy as a plain norm (is_qk_norm 0)",
                     mode_names[mode]);
            uint16_t *want = answer("qknorm", mode, "out", n);
            expect_miss("qknorm", what, compare(want, out, n));
            free(want);
        }
    }
    free(x), free(w), free(out);
}

static void run_swiglu(const char *name, size_t rows, size_t dim, const char *path) {
    size_t n = rows * dim;
    uint16_t *g = input(name, "gate", ST_BF16, n);
    uint16_t *u = input(name, "up", ST_BF16, n);
    uint16_t *out = bf16_out(n);
    for (int i = 0; i < 2; i++) {
        int mode = hf_and_aligned[i];
        parity_policy pol = mode_policy(mode);
        CHECK_OK(parity_swiglu(&pol, rows, dim, g, dim, u, dim, out, dim));
        expect_answer(name, "out", mode, path, out, n);
        if (strcmp(path, "portable") == 0)
            expect_other_answer_missed(name, mode, other_mode(mode), out, n);
    }
    free(g), free(u), free(out);
}

/* Our fp32 cos/sin (as parity_rope computes them: DESIGN.md section 3) against PyTorch's
 * tables in the file: informative, the outputs are what is checked. */
static void compare_rope_tables(const char *name, size_t T, size_t hd, double theta,
                                const int32_t *pos) {
    float *cs = input(name, "cos_f32", ST_F32, T * hd);
    float *sn = input(name, "sin_f32", ST_F32, T * hd);
    size_t equal = 0, n = 0;
    for (size_t t = 0; t < T; t++)
        for (size_t i = 0; i < hd / 2; i++) {
            float p = (float)pow((double)(float)theta, (double)((float)(2 * i) / (float)hd));
            float angle = (float)pos[t] * (1.0f / p);
            float c = (float)cos((double)angle), s = (float)sin((double)angle);
            /* PyTorch's table is cat(freqs, freqs): both halves hold the same value */
            const float *ct = cs + t * hd, *st = sn + t * hd;
            equal += f32_bits(c) == f32_bits(ct[i]) && f32_bits(c) == f32_bits(ct[i + hd / 2]);
            equal += f32_bits(s) == f32_bits(st[i]) && f32_bits(s) == f32_bits(st[i + hd / 2]);
            n += 2;
        }
    printf("  %-12s fp32 cos/sin tables vs PyTorch's: %.2f%% bitwise\n", name, pct(equal, n));
    free(cs), free(sn);
}

static void run_rope(const char *name, size_t T, size_t H, size_t hd, double theta,
                     const char *path) {
    size_t n = T * H * hd;
    uint16_t *x = input(name, "x", ST_BF16, n);
    int32_t *pos = input(name, "positions", ST_I32, T);
    uint16_t *out = bf16_out(n);
    if (strcmp(path, "portable") == 0) compare_rope_tables(name, T, hd, theta, pos);
    for (int mode = 0; mode < N_MODES; mode++) {
        parity_policy pol = mode_policy(mode);
        memcpy(out, x, n * 2);
        CHECK_OK(parity_rope(&pol, T, H, hd, out, H * hd, pos, theta));
        expect_answer(name, "out", mode, path, out, n);
        if (strcmp(path, "portable") == 0)
            expect_other_answer_missed(name, mode, other_mode(mode), out, n);
    }
    free(x), free(pos), free(out);
}

/* ---- argument checks ------------------------------------------------------------------ */

static void test_arguments(void) {
    parity_policy pol = mode_policy(HF), bad = pol;
    bad.compute = 3; /* no such compute */
    uint16_t a[64] = {0}, b[64] = {0}, w[16], o[64], r[64];
    for (int i = 0; i < 16; i++) w[i] = 0x3f80;
    int32_t pos[4] = {0, 1, 2, 3};
    const int E = PARITY_ERR_INVALID_ARGUMENT;

    CHECK_OK(parity_rmsnorm_residual(&pol, 4, 16, a, 16, b, 16, w, EPS, r, 16, o, 16));
    CHECK_STATUS(parity_rmsnorm_residual(NULL, 4, 16, a, 16, b, 16, w, EPS, r, 16, o, 16), E);
    CHECK(strlen(parity_last_error()) > 0);
    CHECK_STATUS(parity_rmsnorm_residual(&bad, 4, 16, a, 16, b, 16, w, EPS, r, 16, o, 16),
                 PARITY_ERR_POLICY);
    CHECK_STATUS(parity_rmsnorm_residual(&pol, 4, 16, NULL, 16, b, 16, w, EPS, r, 16, o, 16), E);
    CHECK_STATUS(parity_rmsnorm_residual(&pol, 4, 16, a, 16, b, 16, NULL, EPS, r, 16, o, 16), E);
    CHECK_STATUS(parity_rmsnorm_residual(&pol, 4, 16, a, 16, b, 16, w, EPS, NULL, 16, o, 16), E);
    CHECK_STATUS(parity_rmsnorm_residual(&pol, 0, 16, a, 16, b, 16, w, EPS, r, 16, o, 16), E);
    CHECK_STATUS(parity_rmsnorm_residual(&pol, 4, 0, a, 16, b, 16, w, EPS, r, 16, o, 16), E);
    CHECK_STATUS(parity_rmsnorm_residual(&pol, 4, 16, a, 15, b, 16, w, EPS, r, 16, o, 16), E);
    CHECK_STATUS(parity_rmsnorm_residual(&pol, 4, 16, a, 16, b, 16, w, EPS, r, 16, o, 8), E);
    CHECK_STATUS(parity_rmsnorm_residual(&pol, 4, 16, a, 16, b, 16, w, 0.0f, r, 16, o, 16), E);
    CHECK_STATUS(parity_rmsnorm_residual(&pol, 4, 16, a, 16, b, 16, w, NAN, r, 16, o, 16), E);
    CHECK_STATUS(parity_rmsnorm_residual(&pol, 4, 16, a, 16, b, 16, w, INFINITY, r, 16, o, 16), E);
    CHECK_STATUS(parity_rmsnorm_residual(&pol, 4, 16, a, 16, b, 16, w, EPS, r, 16, r, 16), E);
    CHECK_STATUS(parity_rmsnorm_residual(&pol, 2, 16, a, 16, b, 32, w, EPS, b, 16, o, 16), E);
    CHECK_STATUS(parity_rmsnorm_residual(&pol, 2, 16, a, 32, b, 16, w, EPS, r, 16, a, 16), E);
    /* exact aliasing is allowed */
    CHECK_OK(parity_rmsnorm_residual(&pol, 4, 16, a, 16, b, 16, w, EPS, b, 16, a, 16));

    CHECK_OK(parity_rmsnorm(&pol, 0, 4, 16, a, 16, w, EPS, o, 16));
    CHECK_OK(parity_rmsnorm(&pol, 1, 4, 16, a, 16, w, EPS, a, 16));
    CHECK_STATUS(parity_rmsnorm(NULL, 0, 4, 16, a, 16, w, EPS, o, 16), E);
    CHECK_STATUS(parity_rmsnorm(&bad, 0, 4, 16, a, 16, w, EPS, o, 16), PARITY_ERR_POLICY);
    CHECK_STATUS(parity_rmsnorm(&pol, 0, 4, 16, NULL, 16, w, EPS, o, 16), E);
    CHECK_STATUS(parity_rmsnorm(&pol, 0, 4, 16, a, 16, NULL, EPS, o, 16), E);
    CHECK_STATUS(parity_rmsnorm(&pol, 0, 4, 16, a, 16, w, EPS, NULL, 16), E);
    CHECK_STATUS(parity_rmsnorm(&pol, 0, 0, 16, a, 16, w, EPS, o, 16), E);
    CHECK_STATUS(parity_rmsnorm(&pol, 0, 4, 0, a, 16, w, EPS, o, 16), E);
    CHECK_STATUS(parity_rmsnorm(&pol, 0, 4, 16, a, 10, w, EPS, o, 16), E);
    CHECK_STATUS(parity_rmsnorm(&pol, 0, 4, 16, a, 16, w, -1.0f, o, 16), E);
    CHECK_STATUS(parity_rmsnorm(&pol, 0, 2, 16, a, 16, w, EPS, a, 32), E);

    CHECK_OK(parity_swiglu(&pol, 4, 16, a, 16, b, 16, o, 16));
    CHECK_OK(parity_swiglu(&pol, 4, 16, a, 16, b, 16, b, 16));
    CHECK_STATUS(parity_swiglu(NULL, 4, 16, a, 16, b, 16, o, 16), E);
    CHECK_STATUS(parity_swiglu(&bad, 4, 16, a, 16, b, 16, o, 16), PARITY_ERR_POLICY);
    CHECK_STATUS(parity_swiglu(&pol, 4, 16, NULL, 16, b, 16, o, 16), E);
    CHECK_STATUS(parity_swiglu(&pol, 4, 16, a, 16, NULL, 16, o, 16), E);
    CHECK_STATUS(parity_swiglu(&pol, 4, 16, a, 16, b, 16, NULL, 16), E);
    CHECK_STATUS(parity_swiglu(&pol, 0, 16, a, 16, b, 16, o, 16), E);
    CHECK_STATUS(parity_swiglu(&pol, 4, 0, a, 16, b, 16, o, 16), E);
    CHECK_STATUS(parity_swiglu(&pol, 4, 16, a, 16, b, 12, o, 16), E);
    CHECK_STATUS(parity_swiglu(&pol, 2, 16, a, 32, b, 16, a, 16), E);
    CHECK_STATUS(parity_swiglu(&pol, 3, 16, a, 16, b, 16, o, SIZE_MAX / 2), E); /* overflows */

    CHECK_OK(parity_rope(&pol, 4, 2, 8, a, 16, pos, 1e4));
    CHECK_STATUS(parity_rope(NULL, 4, 2, 8, a, 16, pos, 1e4), E);
    CHECK_STATUS(parity_rope(&bad, 4, 2, 8, a, 16, pos, 1e4), PARITY_ERR_POLICY);
    CHECK_STATUS(parity_rope(&pol, 4, 2, 8, NULL, 16, pos, 1e4), E);
    CHECK_STATUS(parity_rope(&pol, 4, 2, 8, a, 16, NULL, 1e4), E);
    CHECK_STATUS(parity_rope(&pol, 0, 2, 8, a, 16, pos, 1e4), E);
    CHECK_STATUS(parity_rope(&pol, 4, 0, 8, a, 16, pos, 1e4), E);
    CHECK_STATUS(parity_rope(&pol, 4, 2, 0, a, 16, pos, 1e4), E);
    CHECK_STATUS(parity_rope(&pol, 4, 2, 7, a, 16, pos, 1e4), E);
    CHECK_STATUS(parity_rope(&pol, 1, 1, 1026, a, 1026, pos, 1e4), E);
    CHECK_STATUS(parity_rope(&pol, 4, 2, 8, a, 15, pos, 1e4), E);
    CHECK_STATUS(parity_rope(&pol, 4, 2, 8, a, 16, pos, 0.0), E);
    CHECK_STATUS(parity_rope(&pol, 4, 2, 8, a, 16, pos, -1e4), E);
    CHECK_STATUS(parity_rope(&pol, 4, 2, 8, a, 16, pos, NAN), E);
    CHECK_STATUS(parity_rope(&pol, 4, 2, 8, a, 16, pos, 1e300), E);
    /* a negative position: nothing is rotated, not even the rows before it */
    int32_t neg[4] = {5, 6, -1, 7};
    for (int i = 0; i < 64; i++) a[i] = (uint16_t)(0x3f80 + i);
    memcpy(o, a, sizeof a);
    CHECK_STATUS(parity_rope(&pol, 4, 2, 8, a, 16, neg, 1e4), E);
    CHECK(memcmp(o, a, sizeof a) == 0);
    /* position 0 is the identity under every policy */
    CHECK_OK(parity_rope(&pol, 1, 2, 8, a, 16, pos, 1e4));
    CHECK(memcmp(o, a, 32) == 0);
}

int main(void) {
    char path[4096];
    snprintf(path, sizeof path, "%s/test/data/regions.safetensors", source_root());
    int s = st_open(path, &vectors);
    if (s) {
        fprintf(stderr, "%s: %s: %s\n", path, parity_status_name(s), parity_last_error());
        return 1;
    }

    parity_cpu_path paths[4] = {PARITY_CPU_PORTABLE, PARITY_CPU_AVX2, PARITY_CPU_AVX512,
                                PARITY_CPU_AVX512BF16};
    for (int p = 0; p < 4; p++) {
        const char *name = parity_cpu_path_name(paths[p]);
        if (parity_set_cpu_path(paths[p]) != PARITY_OK) {
            printf("path %s: not available here, skipped\n", name);
            continue;
        }
        printf("path %s:\n", name);
        run_resnorm("resnorm", 64, 1024, name);
        run_resnorm("resnorm_odd", 9, 1000, name);
        run_qknorm(name);
        run_swiglu("swiglu", 32, 3072, name);
        run_swiglu("swiglu_odd", 7, 1001, name);
        run_rope("rope", 48, 8, 128, 1e6, name);
        run_rope("rope_small", 33, 3, 64, 1e4, name);
    }
    test_arguments();

    st_close(vectors);
    return check_report("test_regions");
}
