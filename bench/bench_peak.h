/* The FMA peak of the instruction the active CPU path's bf16 GEMM runs: a register-only loop
 * of 10 independent fma chains (latency 4 x 2 units needs 8), ymm on the avx2 path, zmm on
 * the avx512 path (pair32 is two fp32 fmas per bf16 pair on both, so this is the GEMM's
 * peak). Shared by gemm-bench and parity-speed. */
#ifndef PARITY_BENCH_PEAK_H
#define PARITY_BENCH_PEAK_H

#include "parity.h"

#if defined(__x86_64__)
#include <immintrin.h>

/* Ten named accumulators, not an array: an array would be stored back on every iteration. */
#define BENCH_FMA_LOOP(T, SET1, FMA, STORE, LANES)                                           \
    T a0 = SET1(1.0f), a1 = SET1(2.0f), a2 = SET1(3.0f), a3 = SET1(4.0f), a4 = SET1(5.0f);    \
    T a5 = SET1(6.0f), a6 = SET1(7.0f), a7 = SET1(8.0f), a8 = SET1(9.0f), a9 = SET1(10.0f);   \
    const T m = SET1(0.999999f), c = SET1(1e-6f);                                             \
    for (long it = 0; it < iters; it++) {                                                     \
        a0 = FMA(a0, m, c), a1 = FMA(a1, m, c), a2 = FMA(a2, m, c), a3 = FMA(a3, m, c);       \
        a4 = FMA(a4, m, c), a5 = FMA(a5, m, c), a6 = FMA(a6, m, c), a7 = FMA(a7, m, c);       \
        a8 = FMA(a8, m, c), a9 = FMA(a9, m, c);                                               \
        /* keeps the chains in registers and the loop from being folded */                    \
        __asm__ volatile("" : "+v"(a0), "+v"(a1), "+v"(a2), "+v"(a3), "+v"(a4), "+v"(a5),     \
                         "+v"(a6), "+v"(a7), "+v"(a8), "+v"(a9));                             \
    }                                                                                         \
    float out[LANES];                                                                         \
    STORE(out, a0);                                                                           \
    double s = out[0];                                                                        \
    STORE(out, a9);                                                                           \
    return s + out[0];

__attribute__((target("avx2,fma"))) static double bench_fma_loop_ymm(long iters) {
    BENCH_FMA_LOOP(__m256, _mm256_set1_ps, _mm256_fmadd_ps, _mm256_storeu_ps, 8)
}

__attribute__((target("avx512f"))) static double bench_fma_loop_zmm(long iters) {
    BENCH_FMA_LOOP(__m512, _mm512_set1_ps, _mm512_fmadd_ps, _mm512_storeu_ps, 16)
}
#endif

/* fp32 lanes of the peak loop for the current CPU path: 16 (avx512), 8 (avx2), 0 (none). */
static inline int bench_fma_lanes(void) {
#if defined(__x86_64__)
    const parity_cpu_path p = parity_get_cpu_path();
    if (p == PARITY_CPU_AVX512 && __builtin_cpu_supports("avx512f")) return 16;
    if (p != PARITY_CPU_PORTABLE && __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma"))
        return 8;
#endif
    return 0;
}

/* The instruction the peak loop runs, for tables and JSON. */
static inline const char *bench_fma_instruction(int lanes) {
    return lanes == 16 ? "vfmadd231ps zmm (AVX-512F)"
           : lanes == 8 ? "vfmadd231ps ymm (AVX2 FMA)"
                        : "none (portable path)";
}

/* Runs the loop `iters` times; returns a sink (its value means nothing). Flops done:
 * iters * BENCH_FMA_FLOPS_PER_ITER(lanes). */
#define BENCH_FMA_FLOPS_PER_ITER(lanes) (10.0 * 2.0 * (double)(lanes))
static inline double bench_fma_loop(long iters, int lanes) {
#if defined(__x86_64__)
    if (lanes == 16) return bench_fma_loop_zmm(iters);
    if (lanes == 8) return bench_fma_loop_ymm(iters);
#endif
    return (double)iters;
}

#endif
