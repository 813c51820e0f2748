/* What every benchmark here times with: a monotonic clock in seconds, the comparison that
 * sorts repetitions for their median, and the synthetic prompt the model benchmarks run. */
#ifndef PARITY_BENCH_CLOCK_H
#define PARITY_BENCH_CLOCK_H

#include <stdint.h>
#include <time.h>

static inline double bench_now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

/* qsort's comparison of doubles, ascending. */
static inline int bench_cmp_double(const void *a, const void *b) {
    const double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* n pseudo-random token ids below vocab (a fixed LCG seed: every run and build times the
 * same prompt). */
static inline void bench_prompt(int32_t *p, uint32_t n, uint32_t vocab) {
    uint64_t x = 12345;
    for (uint32_t i = 0; i < n; i++) {
        x = x * 6364136223846793005ull + 1442695040888963407ull;
        p[i] = (int32_t)((x >> 33) % vocab);
    }
}

#endif
