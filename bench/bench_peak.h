/* The peaks of the instructions the CPU paths' bf16 GEMMs run (and the integer dots of the
 * quantized GEMMs, below): register-only loops of 10
 * independent chains (latency 4 x 2 units needs 8) of vfmadd231ps ymm (the avx2 path),
 * vfmadd231ps zmm (avx512) and vdpbf16ps zmm (avx512bf16). A bf16 pair is two fp32 fmas
 * (4 flops) on every path, so each loop's GFLOP/s is its path's GEMM peak: an fp32 fma
 * counts 2 flops per lane, a vdpbf16ps 4 (two products and two adds). And the amx backend's
 * tdpbf16ps (2 flops per product). Shared by gemm-bench and parity-speed. */
#ifndef PARITY_BENCH_PEAK_H
#define PARITY_BENCH_PEAK_H

#include "parity.h"

#include <string.h>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

typedef enum bench_peak_kind {
    BENCH_PEAK_NONE = 0,     /* the portable path: no peak loop */
    BENCH_PEAK_FMA_YMM,
    BENCH_PEAK_FMA_ZMM,
    BENCH_PEAK_DPBF16_ZMM,
    BENCH_PEAK_AMX_BF16,     /* the amx backend's tdpbf16ps (needs the OS's tile permission) */
    BENCH_PEAK_DPWSSD_ZMM,   /* vpdpwssd zmm (AVX512_VNNI): the FP8 GEMM's int16 digit dots */
    BENCH_PEAK_DPBUSD_ZMM,   /* vpdpbusd zmm (AVX512_VNNI): the 4-bit and ternary GEMMs' */
    BENCH_PEAK_KINDS
} bench_peak_kind;

#if defined(__x86_64__)
/* Ten named accumulators, not an array: an array would be stored back on every iteration.
 * STEP(a) is one instruction on chain a. */
#define BENCH_PEAK_LOOP(T, INIT, STEP, STORE, LANES)                                          \
    T a0 = INIT(1.0f), a1 = INIT(2.0f), a2 = INIT(3.0f), a3 = INIT(4.0f), a4 = INIT(5.0f);    \
    T a5 = INIT(6.0f), a6 = INIT(7.0f), a7 = INIT(8.0f), a8 = INIT(9.0f), a9 = INIT(10.0f);   \
    for (long it = 0; it < iters; it++) {                                                     \
        a0 = STEP(a0), a1 = STEP(a1), a2 = STEP(a2), a3 = STEP(a3), a4 = STEP(a4);            \
        a5 = STEP(a5), a6 = STEP(a6), a7 = STEP(a7), a8 = STEP(a8), a9 = STEP(a9);            \
        /* keeps the chains in registers and the loop from being folded */                    \
        __asm__ volatile("" : "+v"(a0), "+v"(a1), "+v"(a2), "+v"(a3), "+v"(a4), "+v"(a5),     \
                         "+v"(a6), "+v"(a7), "+v"(a8), "+v"(a9));                             \
    }                                                                                         \
    float out[LANES];                                                                         \
    STORE(out, a0);                                                                           \
    double s = out[0];                                                                        \
    STORE(out, a9);                                                                           \
    return s + out[0];

__attribute__((target("avx2,fma"))) static double bench_peak_loop_fma_ymm(long iters) {
    const __m256 m = _mm256_set1_ps(0.999999f), c = _mm256_set1_ps(1e-6f);
#define FMA_YMM_STEP(a) _mm256_fmadd_ps(a, m, c)
    BENCH_PEAK_LOOP(__m256, _mm256_set1_ps, FMA_YMM_STEP, _mm256_storeu_ps, 8)
#undef FMA_YMM_STEP
}

__attribute__((target("avx512f"))) static double bench_peak_loop_fma_zmm(long iters) {
    const __m512 m = _mm512_set1_ps(0.999999f), c = _mm512_set1_ps(1e-6f);
#define FMA_ZMM_STEP(a) _mm512_fmadd_ps(a, m, c)
    BENCH_PEAK_LOOP(__m512, _mm512_set1_ps, FMA_ZMM_STEP, _mm512_storeu_ps, 16)
#undef FMA_ZMM_STEP
}

/* acc += 1 * 2^-20 + 1 * 2^-20 per lane and step: 40 after 2e7 steps, far from overflow. */
__attribute__((target("avx512f,avx512bf16"))) static double bench_peak_loop_dpbf16_zmm(long iters) {
    const __m512bh x = (__m512bh)_mm512_set1_epi16(0x3f80), w = (__m512bh)_mm512_set1_epi16(0x3580);
#define DPBF16_STEP(a) _mm512_dpbf16_ps(a, x, w)
    BENCH_PEAK_LOOP(__m512, _mm512_set1_ps, DPBF16_STEP, _mm512_storeu_ps, 16)
#undef DPBF16_STEP
}

/* The integer dots the quantized GEMMs run (lib/quant: FP8 three vpdpwssd a pair of K, E2M1 and
 * ternary one vpdpbusd four codes), counted as the flops are: 2 a product (its multiply and its
 * add), so that their rates compare with the bf16 loops': a vpdpwssd is 64 (16 lanes x 2
 * products), a vpdpbusd 128 (16 x 4). Operands small enough that no lane overflows. */
__attribute__((target("avx512f,avx512vnni"))) static double bench_peak_loop_dpwssd_zmm(long iters) {
    const __m512i x = _mm512_set1_epi16(1), w = _mm512_set1_epi16(1);
#define DPWSSD_STEP(a) _mm512_dpwssd_epi32(a, x, w)
#define DPI_INIT(v) _mm512_set1_epi32((int)(v))
#define DPI_STORE(out, a) _mm512_storeu_ps(out, _mm512_cvtepi32_ps(a))
    BENCH_PEAK_LOOP(__m512i, DPI_INIT, DPWSSD_STEP, DPI_STORE, 16)
#undef DPWSSD_STEP
}

__attribute__((target("avx512f,avx512vnni"))) static double bench_peak_loop_dpbusd_zmm(long iters) {
    const __m512i x = _mm512_set1_epi8(1), w = _mm512_set1_epi8(1);
#define DPBUSD_STEP(a) _mm512_dpbusd_epi32(a, x, w)
    BENCH_PEAK_LOOP(__m512i, DPI_INIT, DPBUSD_STEP, DPI_STORE, 16)
#undef DPBUSD_STEP
#undef DPI_INIT
#undef DPI_STORE
}

/* A tile op takes 16 cycles where an fma takes half of one: the AMX loop runs iters / 16 of
 * its iterations, and bench_peak_flops_per_iter counts per requested iteration. */
#define BENCH_PEAK_AMX_SCALE 16

/* The AMX tile configuration (palette 1): bytes per row and rows of each tile. */
typedef struct bench_tile_config {
    unsigned char palette, start_row, reserved[14];
    unsigned short colsb[16];
    unsigned char rows[16];
} bench_tile_config;

/* tdpbf16ps on four independent 16 x 16 accumulators (tiles 0-3) from two A tiles and two B
 * tiles (4-7), 16384 flops each (16 x 16 outputs x 32 products x 2); the tiles hold 1.0 and
 * 2^-20 in bf16, so the sums stay far from overflow. The tile state is the thread's: set up
 * and released here. */

__attribute__((target("amx-tile,amx-bf16"))) static double bench_peak_loop_amx_bf16(long iters) {
    bench_tile_config cfg;
    memset(&cfg, 0, sizeof cfg);
    cfg.palette = 1;
    for (int t = 0; t < 8; t++) cfg.colsb[t] = 64, cfg.rows[t] = 16;
    static unsigned short ones[16 * 32], small[16 * 32];
    for (int i = 0; i < 16 * 32; i++) ones[i] = 0x3f80, small[i] = 0x3580;
    float out[16 * 16];
    _tile_loadconfig(&cfg);
    _tile_zero(0);
    _tile_zero(1);
    _tile_zero(2);
    _tile_zero(3);
    _tile_loadd(4, ones, 64);
    _tile_loadd(5, ones, 64);
    _tile_loadd(6, small, 64);
    _tile_loadd(7, small, 64);
    for (long it = 0; it < iters; it++) {
        /* 10 instructions per iteration, as the other loops */
        _tile_dpbf16ps(0, 4, 6);
        _tile_dpbf16ps(1, 4, 7);
        _tile_dpbf16ps(2, 5, 6);
        _tile_dpbf16ps(3, 5, 7);
        _tile_dpbf16ps(0, 5, 7);
        _tile_dpbf16ps(1, 5, 6);
        _tile_dpbf16ps(2, 4, 7);
        _tile_dpbf16ps(3, 4, 6);
        _tile_dpbf16ps(0, 4, 7);
        _tile_dpbf16ps(1, 5, 6);
    }
    _tile_stored(0, out, 64);
    _tile_release();
    return out[0];
}
#endif

/* Whether this CPU runs kind k's loop. */
static inline int bench_peak_available(bench_peak_kind k) {
#if defined(__x86_64__)
    switch (k) {
    case BENCH_PEAK_FMA_YMM:
        return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
    case BENCH_PEAK_FMA_ZMM:
        return __builtin_cpu_supports("avx512f");
    case BENCH_PEAK_DPBF16_ZMM:
        return __builtin_cpu_supports("avx512bf16");
    case BENCH_PEAK_DPWSSD_ZMM:
    case BENCH_PEAK_DPBUSD_ZMM:
        return __builtin_cpu_supports("avx512vnni");
    case BENCH_PEAK_AMX_BF16:
        /* the library asks the OS for the tile state on the backend's first check */
        return parity_backend_check(PARITY_BACKEND_AMX) == PARITY_OK;
    default:
        return 0;
    }
#else
    (void)k;
    return 0;
#endif
}

/* The instruction CPU path p's bf16 GEMM runs (NONE on the portable path). */
static inline bench_peak_kind bench_peak_of_path(parity_cpu_path p) {
    const bench_peak_kind k = p == PARITY_CPU_AVX512BF16 ? BENCH_PEAK_DPBF16_ZMM
                              : p == PARITY_CPU_AVX512   ? BENCH_PEAK_FMA_ZMM
                              : p == PARITY_CPU_AVX2     ? BENCH_PEAK_FMA_YMM
                                                         : BENCH_PEAK_NONE;
    return bench_peak_available(k) ? k : BENCH_PEAK_NONE;
}

/* The active path's. */
static inline bench_peak_kind bench_peak_active(void) {
    return bench_peak_of_path(parity_get_cpu_path());
}

/* For tables and JSON: each kind's instruction, and a short key. */
static const struct {
    const char *instruction, *key;
} bench_peak_names[BENCH_PEAK_KINDS] = {
    [BENCH_PEAK_NONE] = {"none (portable path)", "none"},
    [BENCH_PEAK_FMA_YMM] = {"vfmadd231ps ymm (AVX2 FMA)", "fma_ymm"},
    [BENCH_PEAK_FMA_ZMM] = {"vfmadd231ps zmm (AVX-512F)", "fma_zmm"},
    [BENCH_PEAK_DPBF16_ZMM] = {"vdpbf16ps zmm (AVX512_BF16)", "dpbf16_zmm"},
    [BENCH_PEAK_AMX_BF16] = {"tdpbf16ps (AMX-BF16)", "amx_bf16"},
    [BENCH_PEAK_DPWSSD_ZMM] = {"vpdpwssd zmm (AVX512_VNNI)", "dpwssd_zmm"},
    [BENCH_PEAK_DPBUSD_ZMM] = {"vpdpbusd zmm (AVX512_VNNI)", "dpbusd_zmm"},
};

static inline const char *bench_peak_instruction(bench_peak_kind k) {
    return bench_peak_names[k < BENCH_PEAK_KINDS ? k : BENCH_PEAK_NONE].instruction;
}

static inline const char *bench_peak_key(bench_peak_kind k) {
    return bench_peak_names[k < BENCH_PEAK_KINDS ? k : BENCH_PEAK_NONE].key;
}

/* Flops of one iteration of kind k's loop (10 instructions). */
static inline double bench_peak_flops_per_iter(bench_peak_kind k) {
    return k == BENCH_PEAK_FMA_YMM      ? 10.0 * 2 * 8
           : k == BENCH_PEAK_FMA_ZMM    ? 10.0 * 2 * 16
           : k == BENCH_PEAK_DPBF16_ZMM ? 10.0 * 4 * 16
           : k == BENCH_PEAK_AMX_BF16   ? 10.0 * 16 * 16 * 32 * 2 / BENCH_PEAK_AMX_SCALE
           : k == BENCH_PEAK_DPWSSD_ZMM ? 10.0 * 2 * 2 * 16
           : k == BENCH_PEAK_DPBUSD_ZMM ? 10.0 * 2 * 4 * 16
                                        : 0.0;
}

/* Runs kind k's loop `iters` times; returns a sink (its value means nothing). */
static inline double bench_peak_loop(long iters, bench_peak_kind k) {
#if defined(__x86_64__)
    if (k == BENCH_PEAK_FMA_YMM) return bench_peak_loop_fma_ymm(iters);
    if (k == BENCH_PEAK_FMA_ZMM) return bench_peak_loop_fma_zmm(iters);
    if (k == BENCH_PEAK_DPBF16_ZMM) return bench_peak_loop_dpbf16_zmm(iters);
    if (k == BENCH_PEAK_AMX_BF16) return bench_peak_loop_amx_bf16(iters / BENCH_PEAK_AMX_SCALE);
    if (k == BENCH_PEAK_DPWSSD_ZMM) return bench_peak_loop_dpwssd_zmm(iters);
    if (k == BENCH_PEAK_DPBUSD_ZMM) return bench_peak_loop_dpbusd_zmm(iters);
#endif
    return (double)iters;
}

#endif
