/* What every benchmark here times with: a monotonic clock in seconds, and the comparison
 * that sorts repetitions for their median. */
#ifndef PARITY_BENCH_CLOCK_H
#define PARITY_BENCH_CLOCK_H

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

#endif
