/* RoPE tables and inv_freq (lib/model/rope.c):
 *   (a) the fp32 cos/sin tables against those PyTorch computed (test/data/regions.safetensors:
 *       rope.* theta 1e6 head_dim 128, rope_small.* theta 1e4 head_dim 64);
 *   (b) llama3 and yarn inv_freq against independent double-precision formulas, and yarn
 *       against values transformers' _compute_yarn_parameters printed;
 *   (c) linear scaling = default / factor exactly;
 * and the tables' layout, attention factor, bf16 copies and argument checks. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "base/floats.h"
#include "model/model.h"
#include "checkpoint/safetensors.h"

/* Distance in ulps between two floats of the same sign (+0 and -0 are one point). */
static int64_t ulp_diff(float a, float b) {
    uint32_t ua = f32_bits(a), ub = f32_bits(b);
    int64_t oa = (ua & 0x80000000u) ? -(int64_t)(ua & 0x7fffffffu) : (int64_t)ua;
    int64_t ob = (ub & 0x80000000u) ? -(int64_t)(ub & 0x7fffffffu) : (int64_t)ub;
    return oa > ob ? oa - ob : ob - oa;
}

static parity_config config_with(const char *builtin, uint32_t head_dim, double theta) {
    parity_config c;
    CHECK_OK(parity_config_builtin(builtin, &c));
    c.head_dim = head_dim;
    c.rope_theta = theta;
    return c;
}

static const float *tensor_f32(const st_file *f, const char *name, uint64_t n, float *buf) {
    const st_tensor *t = st_find(f, name);
    CHECK(t && t->dtype == ST_F32 && t->n_elements == n);
    if (!t || t->dtype != ST_F32 || t->n_elements != n) return NULL;
    memcpy(buf, t->data, n * sizeof(float));
    return buf;
}

/* (a) One table pair of regions.safetensors against ours. The file's rows are
 * cat(freqs, freqs): columns i and i + half hold the same value.
 *
 * What was measured (PyTorch 1.13 CPU made the file): about 94% of the values are bitwise
 * equal and the rest 1 ulp apart, because torch's vectorised fp32 cos/sin (SLEEF, 1-ulp
 * accuracy) is not correctly rounded while ours is. Beyond that, one column differs more:
 * for theta 1e6, head_dim 128, i = 37, 1e6 ** (74/128) lies 0.014 ulp from the midpoint
 * between two floats; torch's fp32 pow rounds it to the other neighbour than the correctly
 * rounded pow we use, so its inv_freq[37] is one ulp higher and the angle drifts with the
 * position (up to 256 ulp on cos near its zeros). `pow_column` names that column: its values
 * must match, within 1 ulp, the angles built from the power's other neighbour. */
static void compare_torch_tables(const st_file *f, const char *prefix, uint32_t rows,
                                 uint32_t head_dim, double theta, int pow_column) {
    char name[64];
    uint32_t half = head_dim / 2;
    snprintf(name, sizeof name, "%s.positions", prefix);
    const st_tensor *pt = st_find(f, name);
    CHECK(pt && pt->dtype == ST_I32 && pt->n_elements == rows);
    if (!pt || pt->dtype != ST_I32 || pt->n_elements != rows) return;
    int32_t *pos = malloc(rows * sizeof(int32_t));
    float *cos_t = malloc((size_t)rows * head_dim * sizeof(float));
    float *sin_t = malloc((size_t)rows * head_dim * sizeof(float));
    memcpy(pos, pt->data, rows * sizeof(int32_t));
    int32_t max_pos = 0;
    for (uint32_t r = 0; r < rows; r++) max_pos = pos[r] > max_pos ? pos[r] : max_pos;

    parity_config c = config_with("qwen3-0.6b", head_dim, theta);
    rope_tables t;
    float inv[64], att;
    CHECK_OK(rope_inv_freq(&c, inv, &att));
    CHECK_OK(rope_tables_build(&c, (uint32_t)max_pos + 1, &t));
    snprintf(name, sizeof name, "%s.cos_f32", prefix);
    const float *tc = tensor_f32(f, name, (uint64_t)rows * head_dim, cos_t);
    snprintf(name, sizeof name, "%s.sin_f32", prefix);
    const float *ts = tensor_f32(f, name, (uint64_t)rows * head_dim, sin_t);
    if (tc && ts) {
        size_t n = 0, equal = 0, equal_bf16 = 0, halves_differ = 0;
        int64_t worst = 0, worst_all = 0, worst_alt[2] = {0, 0};
        float alt_inv[2] = {0.0f, 0.0f};
        if (pow_column >= 0) {
            float e = (float)(2 * pow_column) / (float)head_dim;
            float p = (float)pow((double)(float)theta, (double)e);
            alt_inv[0] = 1.0f / nextafterf(p, 0.0f);
            alt_inv[1] = 1.0f / nextafterf(p, INFINITY);
        }
        for (uint32_t r = 0; r < rows; r++)
            for (uint32_t i = 0; i < half; i++) {
                const float *theirs[2] = {tc + (size_t)r * head_dim, ts + (size_t)r * head_dim};
                const float *ours[2] = {t.cos_f32 + (size_t)pos[r] * half,
                                        t.sin_f32 + (size_t)pos[r] * half};
                for (int k = 0; k < 2; k++) {
                    float th = theirs[k][i], ou = ours[k][i];
                    if (f32_bits(th) != f32_bits(theirs[k][i + half])) halves_differ++;
                    int64_t d = ulp_diff(ou, th);
                    n++;
                    equal += f32_bits(ou) == f32_bits(th);
                    equal_bf16 += f32_bits(round_bf16(ou)) == f32_bits(round_bf16(th));
                    if (d > worst_all) worst_all = d;
                    if ((int)i != pow_column) {
                        if (d > worst) worst = d;
                        continue;
                    }
                    for (int a = 0; a < 2; a++) {
                        float angle = (float)pos[r] * alt_inv[a];
                        float v = (float)(k ? sin((double)angle) : cos((double)angle));
                        int64_t da = ulp_diff(v, th);
                        if (da > worst_alt[a]) worst_alt[a] = da;
                    }
                }
            }
        printf("%s (theta %g, head_dim %u, %u positions up to %d): %zu of %zu fp32 cos/sin "
               "bitwise equal to PyTorch's (%.2f%%), max %lld ulp (%lld outside the pow column); "
               "bf16-rounded: %zu of %zu equal\n",
               prefix, theta, head_dim, rows, max_pos, equal, n, 100.0 * equal / n,
               (long long)worst_all, (long long)worst, equal_bf16, n);
        CHECK_INT(halves_differ, 0);
        CHECK((double)equal / (double)n >= 0.94);
        CHECK(worst <= 1);
        if (pow_column >= 0) {
            int64_t best = worst_alt[0] < worst_alt[1] ? worst_alt[0] : worst_alt[1];
            printf("%s column %d: within %lld ulp with the power's other fp32 neighbour\n", prefix,
                   pow_column, (long long)best);
            CHECK(best <= 1);
        }
    }
    rope_tables_free(&t);
    free(pos);
    free(cos_t);
    free(sin_t);
}

static void test_torch_tables(void) {
    char path[1024];
    st_file *f = NULL;
    CHECK_OK(st_open(source_path(path, sizeof path, "test/data/regions.safetensors"), &f));
    if (!f) return;
    compare_torch_tables(f, "rope", 48, 128, 1e6, 37);
    compare_torch_tables(f, "rope_small", 33, 64, 1e4, -1);
    st_close(f);
}

/* The default inv_freq in double: 1 / theta^(2i/d). */
static double inv_freq_double(double theta, uint32_t i, uint32_t dim) {
    return 1.0 / pow(theta, (double)(2 * i) / (double)dim);
}

/* (b) llama3: bands are exact functions of the default inv_freq; the medium band matches the
 * smoothing formula evaluated in double. */
static void test_llama3(void) {
    parity_config c;
    CHECK_OK(parity_config_builtin("llama3.2-1b", &c));
    parity_config d = c;
    d.rope_type = PARITY_ROPE_DEFAULT;
    float got[32], base[32], att = 0.0f;
    CHECK_OK(rope_inv_freq(&c, got, &att));
    CHECK(att == 1.0f);
    CHECK_OK(rope_inv_freq(&d, base, &att));
    int bands[3] = {0, 0, 0};
    int64_t worst = 0;
    for (uint32_t i = 0; i < 32; i++) {
        double inv = inv_freq_double(500000.0, i, 64);
        double wavelen = 2.0 * 3.141592653589793 / inv;
        double want;
        if (wavelen < 8192.0 / 4.0) {
            want = inv;
            bands[0]++;
            CHECK(f32_bits(got[i]) == f32_bits(base[i]));
        } else if (wavelen > 8192.0 / 1.0) {
            want = inv / 32.0;
            bands[2]++;
            CHECK(f32_bits(got[i]) == f32_bits(base[i] / 32.0f));
        } else {
            double smooth = (8192.0 / wavelen - 1.0) / (4.0 - 1.0);
            want = (1.0 - smooth) * inv / 32.0 + smooth * inv;
            bands[1]++;
        }
        int64_t u = ulp_diff(got[i], (float)want);
        if (u > worst) worst = u;
    }
    printf("llama3 (Llama-3.2-1B): %d high / %d medium / %d low frequencies, max %lld ulp from "
           "the double formula\n", bands[0], bands[1], bands[2], (long long)worst);
    CHECK(bands[0] > 0 && bands[1] > 0 && bands[2] > 0);
    CHECK(worst <= 4);
}

/* yarn in double, as _compute_yarn_parameters reads but without fp32 intermediates. */
static void yarn_double(const parity_config *c, double *inv, double *att) {
    uint32_t dim = c->head_dim;
    double factor = c->rope_factor, base = c->rope_theta;
    double omax = c->rope_original_max_position_embeddings;
    double ms = c->rope_mscale, msa = c->rope_mscale_all_dim;
    if (c->rope_attention_factor > 0)
        *att = c->rope_attention_factor;
    else if (ms != 0 && msa != 0)
        *att = (0.1 * ms * log(factor) + 1.0) / (0.1 * msa * log(factor) + 1.0);
    else
        *att = factor <= 1 ? 1.0 : 0.1 * log(factor) + 1.0;
    double low = dim * log(omax / (c->rope_beta_fast * 2 * M_PI)) / (2 * log(base));
    double high = dim * log(omax / (c->rope_beta_slow * 2 * M_PI)) / (2 * log(base));
    if (c->rope_truncate) {
        low = floor(low);
        high = ceil(high);
    }
    low = fmax(low, 0.0);
    high = fmin(high, dim - 1.0);
    if (low == high) high += 0.001;
    for (uint32_t i = 0; i < dim / 2; i++) {
        double ramp = fmin(fmax((i - low) / (high - low), 0.0), 1.0);
        double extra = inv_freq_double(base, i, dim);
        inv[i] = extra / factor * ramp + extra * (1.0 - ramp);
    }
}

/* The fp32 chain differs from the double formula by a few ulp, most where the extrapolation
 * weight 1 - ramp is small and its rounding is large relative to it (as in torch); a wrong
 * formula would be off by far more. */
static void check_yarn_double(const parity_config *c, const char *what) {
    uint32_t half = c->head_dim / 2;
    float got[64], att = 0.0f;
    double want[64], watt = 0.0;
    CHECK_OK(rope_inv_freq(c, got, &att));
    yarn_double(c, want, &watt);
    int64_t worst = 0;
    for (uint32_t i = 0; i < half; i++) {
        int64_t u = ulp_diff(got[i], (float)want[i]);
        if (u > worst) worst = u;
    }
    printf("yarn %s: max %lld ulp from the double formula, attention factor %.9g\n", what,
           (long long)worst, (double)att);
    CHECK(worst <= 8);
    CHECK(att == (float)watt);
}

/* inv_freq printed (%.9e) by transformers' _compute_yarn_parameters for rotary dim 64,
 * theta 1e7, original_max_position_embeddings = max_position_embeddings = 262144, defaults
 * otherwise; as published in a public repository's golden file (gufo
 * rope_scaling_golden.hpp). 10 significant digits identify each fp32 value. Its first
 * YARN_UNSCALED frequencies lie above the ramp (beta_fast's end, which the factor does not
 * move), so they are the unscaled inv_freq, the same under both factors: written once. */
#define YARN_UNSCALED 15
static const double yarn_golden_unscaled[YARN_UNSCALED] = {
    1.000000000e+00, 6.042963862e-01, 3.651741445e-01, 2.206733972e-01, 1.333521456e-01,
    8.058421314e-02, 4.869675264e-02, 2.942727320e-02, 1.778279431e-02, 1.074607857e-02,
    6.493816618e-03, 3.924189601e-03, 2.371373819e-03, 1.433012658e-03, 8.659643354e-04,
};
static const struct {
    float factor;
    double attention_factor;
    double inv_freq_scaled[32 - YARN_UNSCALED];
} yarn_golden[] = {
    {1.5625f, 1.044628710262842,
     {4.997506621e-04, 2.877672960e-04, 1.652974315e-04, 9.469212091e-05, 5.408186553e-05,
      3.078384179e-05, 1.745583177e-05, 9.855529242e-06, 5.955661436e-06, 3.598984449e-06,
      2.174853307e-06, 1.314255996e-06, 7.942002185e-07, 4.799323392e-07, 2.900213474e-07,
      1.752588616e-07, 1.059082990e-07}},
    {4.0f, 1.138629436111989,
     {4.742398160e-04, 2.569350763e-04, 1.373497507e-04, 7.217386883e-05, 3.707224823e-05,
      1.844922372e-05, 8.759770026e-06, 3.849816039e-06, 2.326430149e-06, 1.405853368e-06,
      8.495520660e-07, 5.133812238e-07, 3.102344408e-07, 1.874735602e-07, 1.132895946e-07,
      6.846049416e-08, 4.137042708e-08}},
};

/* Golden row g's inv_freq[i]. */
static double yarn_golden_inv_freq(size_t g, int i) {
    return i < YARN_UNSCALED ? yarn_golden_unscaled[i]
                             : yarn_golden[g].inv_freq_scaled[i - YARN_UNSCALED];
}

static void test_yarn(void) {
    for (size_t g = 0; g < sizeof yarn_golden / sizeof yarn_golden[0]; g++) {
        parity_config c = config_with("qwen3-0.6b", 64, 1e7);
        c.max_position_embeddings = 262144;
        c.rope_type = PARITY_ROPE_YARN;
        c.rope_factor = yarn_golden[g].factor;
        c.rope_original_max_position_embeddings = 262144;
        float got[32], att = 0.0f;
        CHECK_OK(rope_inv_freq(&c, got, &att));
        int equal = 0;
        int64_t worst = 0;
        for (int i = 0; i < 32; i++) {
            float want = (float)yarn_golden_inv_freq(g, i);
            int64_t u = ulp_diff(got[i], want);
            equal += u == 0;
            if (u > worst) worst = u;
        }
        printf("yarn factor %g vs transformers: %d of 32 inv_freq bitwise equal, max %lld ulp; "
               "attention factor %.9g (transformers %.17g)\n", (double)yarn_golden[g].factor,
               equal, (long long)worst, (double)att, yarn_golden[g].attention_factor);
        CHECK(worst <= 1);
        CHECK(att == (float)yarn_golden[g].attention_factor);
        check_yarn_double(&c, "theta 1e7, rotary dim 64");
    }

    parity_config c;
    char path[1024];
    CHECK_OK(parity_config_load(source_path(path, sizeof path, "test/data/configs/qwen3-yarn.json"),
                                &c));
    check_yarn_double(&c, "Qwen3 factor 4 from 32768");
    /* No truncation, mscale pair, explicit betas. */
    CHECK_OK(parity_config_load(
        source_path(path, sizeof path, "test/data/configs/qwen3-yarn-v5.json"), &c));
    check_yarn_double(&c, "no truncate, mscale 0.707/0.707");
    float inv[64], att;
    CHECK_OK(rope_inv_freq(&c, inv, &att));
    CHECK(att == 1.0f); /* mscale == mscale_all_dim: the ratio is exactly 1 */
    c.rope_mscale = 1.0f;
    c.rope_mscale_all_dim = 0.0f; /* one of the pair absent: get_mscale(factor) */
    CHECK_OK(rope_inv_freq(&c, inv, &att));
    CHECK(att == (float)(0.1 * log(40.0) + 1.0));
    c.rope_attention_factor = 1.5f; /* explicit */
    CHECK_OK(rope_inv_freq(&c, inv, &att));
    CHECK(att == 1.5f);
    /* beta_fast == beta_slow with truncation off: low == high, the ramp gets +0.001. */
    c.rope_beta_fast = c.rope_beta_slow = 8.0f;
    check_yarn_double(&c, "low == high");
}

/* (c) linear: the default inv_freq divided by the factor in fp32. */
static void test_linear(void) {
    const float factors[] = {2.0f, 3.0f, 8.0f, 1.7f};
    for (size_t k = 0; k < sizeof factors / sizeof factors[0]; k++) {
        parity_config d = config_with("qwen3-0.6b", 128, 1e6), c = d;
        c.rope_type = PARITY_ROPE_LINEAR;
        c.rope_factor = factors[k];
        float a[64], b[64], att;
        CHECK_OK(rope_inv_freq(&d, a, &att));
        CHECK_OK(rope_inv_freq(&c, b, &att));
        CHECK(att == 1.0f);
        for (int i = 0; i < 64; i++) a[i] = a[i] / factors[k];
        CHECK_BITS_F32(b, a, 64, "linear inv_freq");
    }
}

/* The default inv_freq: correctly rounded fp32 reciprocal of the fp32 power. */
static void test_default(void) {
    parity_config c = config_with("qwen3-0.6b", 128, 1e6);
    float inv[64], att;
    CHECK_OK(rope_inv_freq(&c, inv, &att));
    CHECK(att == 1.0f);
    CHECK(inv[0] == 1.0f);
    int64_t worst = 0;
    for (uint32_t i = 0; i < 64; i++) {
        int64_t u = ulp_diff(inv[i], (float)inv_freq_double(1e6, i, 128));
        if (u > worst) worst = u;
    }
    CHECK(worst <= 1);
}

/* Table layout, attention factor, bf16 copies. */
static void test_tables(void) {
    parity_config c;
    CHECK_OK(parity_config_builtin("tiny", &c));
    c.rope_type = PARITY_ROPE_YARN;
    c.rope_factor = 4.0f;
    c.rope_original_max_position_embeddings = 128;
    float inv[8], att;
    CHECK_OK(rope_inv_freq(&c, inv, &att));
    CHECK(att != 1.0f);
    rope_tables t;
    CHECK_OK(rope_tables_build(&c, 300, &t));
    CHECK_INT(t.n_positions, 300);
    CHECK_INT(t.half, 8);
    size_t bad = 0;
    for (uint32_t p = 0; p < 300; p++)
        for (uint32_t i = 0; i < 8; i++) {
            size_t k = (size_t)p * 8 + i;
            float angle = (float)p * inv[i];
            float cw = (float)cos((double)angle) * att, sw = (float)sin((double)angle) * att;
            bad += f32_bits(t.cos_f32[k]) != f32_bits(cw) || f32_bits(t.sin_f32[k]) != f32_bits(sw);
            bad += f32_bits(t.cos_bf16[k]) != f32_bits(round_bf16(cw));
            bad += f32_bits(t.sin_bf16[k]) != f32_bits(round_bf16(sw));
            bad += (f32_bits(t.cos_bf16[k]) & 0xffffu) != 0;
        }
    CHECK_INT(bad, 0);
    CHECK(t.cos_f32[0] == att && t.sin_f32[0] == 0.0f);
    rope_tables_free(&t);
    CHECK(t.cos_f32 == NULL && t.n_positions == 0);
    rope_tables_free(&t);
    rope_tables_free(NULL);

    /* The longest context of the built-ins (Llama 3.2: 131072 x 32). */
    CHECK_OK(parity_config_builtin("llama3.2-1b", &c));
    CHECK_OK(rope_tables_build(&c, c.max_position_embeddings, &t));
    CHECK(t.cos_f32[0] == 1.0f && t.sin_bf16[(size_t)131071 * 32 + 31] != 0.0f);
    rope_tables_free(&t);

    /* Failures leave the output alone. */
    rope_tables keep = {7, 7, NULL, NULL, NULL, NULL, NULL, NULL};
    CHECK_STATUS(rope_tables_build(&c, 0, &keep), PARITY_ERR_INVALID_ARGUMENT);
    CHECK_STATUS(rope_tables_build(&c, (1u << 24) + 1, &keep), PARITY_ERR_INVALID_ARGUMENT);
    c.head_dim = 63;
    CHECK_STATUS(rope_tables_build(&c, 16, &keep), PARITY_ERR_CONFIG);
    CHECK_STATUS(rope_inv_freq(&c, inv, &att), PARITY_ERR_CONFIG);
    CHECK(keep.n_positions == 7 && keep.half == 7);
    CHECK_STATUS(rope_tables_build(NULL, 16, &keep), PARITY_ERR_INVALID_ARGUMENT);
    CHECK_STATUS(rope_inv_freq(&c, NULL, &att), PARITY_ERR_INVALID_ARGUMENT);
}

int main(void) {
    test_torch_tables();
    test_default();
    test_llama3();
    test_yarn();
    test_linear();
    test_tables();
    return check_report("test_rope");
}
