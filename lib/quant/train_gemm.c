/*
 * The training GEMM (train_gemm.h) in portable C: its specification, which every CPU path
 * runs. The block dot is exact for every pair of element formats: each code's value is an
 * integer k times a power of two u (E4M3: |k| <= 448 * 2^9 < 2^18, u = 2^-9; E5M2: |k| <= 57344
 * * 2^16 < 2^32, u = 2^-16; E2M1: |k| <= 12, u = 2^-1), so a block's dot is the integer
 * S = sum k_a k_b times u_a u_b. With at most 32 terms: E4M3 x E4M3 terms are below 2^36,
 * E5M2 x E4M3 below 2^50 and those with E2M1 below 2^36, so S is exact in int64 (below 2^55);
 * an E5M2 x E5M2 term is below 2^64 and S is summed exactly in 128 bits (the positive and the
 * negative terms apart, each a pair of uint64). Then d = RN_fp32(S) * u_a u_b: one rounding
 * (|S| < 2^53: S and S u_a u_b are exact in double and the cast to float rounds to nearest
 * even; beyond, the rounding is written out on S's bits, train_gemm_kernel.h), and the power
 * of two is exact (a nonzero |S u_a u_b| lies in [2^-32, 2^70)).
 * The order of a block's terms is therefore free; the blocks' is fixed: acc = acc + (d * sa)
 * * sb, ascending, in fp32, as the forward's quantized GEMM (dot.c); then NVFP4's globals,
 * y = RN(acc * RN(ga * gb)), as the forward applies its alpha. The operands are decoded once
 * per call (each code's k as int64, each block's scale value and non-finite flag), so that
 * the inner loop is integer multiply-adds over contiguous rows, in cache-sized output tiles.
 */
#include <math.h>
#include <pthread.h>

#include "train_gemm.h"
#include "train_gemm_kernel.h"

#include "codecs.h"
#include "parity.h"

/* Per element format: k of every code (0 for a non-finite one), whether the code is not
 * finite, and the unit's exponent. */
typedef struct element_table {
    int64_t k[256];
    uint8_t bad[256];
    int unit_exp;
} element_table;

static element_table tables[3];
static float e8m0_value[256], e4m3_value[256];
static pthread_once_t tables_once = PTHREAD_ONCE_INIT;

static void fill_tables(void) {
    static const int unit_exp[3] = {-9, -16, -1};
    for (int t = 0; t < 3; t++) tables[t].unit_exp = unit_exp[t];
    for (int c = 0; c < 256; c++) {
        const uint8_t code = (uint8_t)c;
        const float v[3] = {e4m3_to_f32(code), minifloat_to_f32(&MINIFLOAT_E5M2, code),
                            c < 16 ? e2m1_to_f32(code) : NAN};
        for (int t = 0; t < 3; t++) {
            tables[t].bad[c] = !isfinite(v[t]);
            tables[t].k[c] = tables[t].bad[c] ? 0 : (int64_t)ldexp((double)v[t], -unit_exp[t]);
        }
        e8m0_value[c] = e8m0_to_f32(code);
        e4m3_value[c] = e4m3_to_f32(code);
    }
}

size_t train_decoded_bytes(size_t rows, size_t K, size_t block) {
    const size_t nblocks = (K + block - 1) / block;
    return rows * K * sizeof(int64_t) + rows * nblocks * (sizeof(float) + 1);
}

void train_gemm_decode(const train_operand *o, size_t rows, size_t K, size_t block, void *bytes,
                       train_decoded *d) {
    pthread_once(&tables_once, fill_tables);
    const element_table *t = &tables[o->element];
    const size_t nblocks = (K + block - 1) / block;
    d->k = bytes;
    d->scale = (float *)(void *)(d->k + rows * K);
    d->bad = (uint8_t *)(d->scale + rows * nblocks);
    d->unit_exp = t->unit_exp;
    for (size_t r = 0; r < rows; r++) {
        const uint8_t *codes = o->codes + r * o->codes_stride;
        const uint8_t *scales = o->scales + (r / o->scale_rows) * o->scales_stride;
        for (size_t kb = 0; kb < nblocks; kb++) {
            const size_t k0 = kb * block, k1 = k0 + block < K ? k0 + block : K;
            unsigned bad = 0;
            for (size_t i = k0; i < k1; i++) {
                d->k[r * K + i] = t->k[codes[i]];
                bad |= t->bad[codes[i]];
            }
            d->bad[r * nblocks + kb] = (uint8_t)bad;
            d->scale[r * nblocks + kb] =
                o->element == TRAIN_E2M1 ? e4m3_value[scales[kb]] : e8m0_value[scales[kb]];
        }
    }
}

void train_gemm_columns(const train_gemm_job *j, size_t n0, size_t n1) { train_columns(j, n0, n1); }

train_columns_fn *train_gemm_columns_entry(void) {
#if defined(PARITY_HAVE_AVX512)
    const parity_cpu_path p = parity_get_cpu_path();
    if (p == PARITY_CPU_AVX512 || p == PARITY_CPU_AVX512BF16) return train_gemm_columns_avx512;
#endif
    return train_gemm_columns;
}
