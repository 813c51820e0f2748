/* Minimal test assertions: a failure prints both sides and where, and the test goes on so
 * that one run shows every failure; main returns check_report(). */
#ifndef PARITY_TEST_CHECK_H
#define PARITY_TEST_CHECK_H

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "parity.h"

static int check_failures, check_count;

#define CHECK(cond)                                                                   \
    do {                                                                              \
        check_count++;                                                                \
        if (!(cond)) {                                                                \
            check_failures++;                                                         \
            fprintf(stderr, "%s:%d: CHECK failed: %s\n", __FILE__, __LINE__, #cond);  \
        }                                                                             \
    } while (0)

#define CHECK_INT(a, b)                                                                    \
    do {                                                                                   \
        long long check_a_ = (long long)(a), check_b_ = (long long)(b);                    \
        check_count++;                                                                     \
        if (check_a_ != check_b_) {                                                        \
            check_failures++;                                                              \
            fprintf(stderr, "%s:%d: %s == %s failed: %lld != %lld\n", __FILE__, __LINE__, #a, \
                    #b, check_a_, check_b_);                                               \
        }                                                                                  \
    } while (0)

/* A library call expected to succeed: on failure prints the status and the message. */
#define CHECK_OK(call)                                                                     \
    do {                                                                                   \
        int check_s_ = (call);                                                             \
        check_count++;                                                                     \
        if (check_s_ != PARITY_OK) {                                                       \
            check_failures++;                                                              \
            fprintf(stderr, "%s:%d: %s failed: %s: %s\n", __FILE__, __LINE__, #call,       \
                    parity_status_name(check_s_), parity_last_error());                    \
        }                                                                                  \
    } while (0)

/* A library call expected to fail with `status`. */
#define CHECK_STATUS(call, status)                                                         \
    do {                                                                                   \
        int check_s_ = (call);                                                             \
        check_count++;                                                                     \
        if (check_s_ != (status)) {                                                        \
            check_failures++;                                                              \
            fprintf(stderr, "%s:%d: %s returned %s, expected %s (message: %s)\n", __FILE__, \
                    __LINE__, #call, parity_status_name(check_s_), parity_status_name(status), \
                    parity_last_error());                                                  \
        }                                                                                  \
    } while (0)

/* Bitwise equality of two float arrays; prints the first differences. */
#define CHECK_BITS_F32(a, b, n, what) check_bits_f32_((a), (b), (n), (what), __FILE__, __LINE__)
static inline void check_bits_f32_(const float *a, const float *b, size_t n, const char *what,
                                   const char *file, int line) {
    size_t bad = 0;
    check_count++;
    for (size_t i = 0; i < n; i++) {
        uint32_t ua, ub;
        memcpy(&ua, a + i, 4);
        memcpy(&ub, b + i, 4);
        if (ua != ub) {
            if (bad < 5)
                fprintf(stderr, "%s:%d: %s: [%zu] %.9g (0x%08" PRIx32 ") != %.9g (0x%08" PRIx32 ")\n",
                        file, line, what, i, a[i], ua, b[i], ub);
            bad++;
        }
    }
    if (bad) {
        check_failures++;
        fprintf(stderr, "%s:%d: %s: %zu of %zu values differ bitwise\n", file, line, what, bad, n);
    }
}

/* Fields of a struct against the values they must hold, a check each, in one call:
 * CHECK_FIELDS(FIELD(c, vocab_size, 256), FIELD(c, rms_norm_eps, 1e-6f)). A field equals its
 * value as `==` has it (integers, floats and doubles all exactly as doubles). */
typedef struct check_field {
    const char *name;
    double got, want;
} check_field;
#define FIELD(s, field, value) {#s "." #field, (double)(s).field, (double)(value)}
#define CHECK_FIELDS(...)                                                              \
    check_fields_((const check_field[]){__VA_ARGS__},                                   \
                  sizeof((const check_field[]){__VA_ARGS__}) / sizeof(check_field),     \
                  __FILE__, __LINE__)
static inline void check_fields_(const check_field *fields, size_t n, const char *file,
                                 int line) {
    for (size_t i = 0; i < n; i++) {
        check_count++;
        if (fields[i].got != fields[i].want) {
            check_failures++;
            fprintf(stderr, "%s:%d: %s == %.17g failed: %.17g\n", file, line, fields[i].name,
                    fields[i].want, fields[i].got);
        }
    }
}

static inline int check_report(const char *name) {
    printf("%s: %d checks, %d failed\n", name, check_count, check_failures);
    return check_failures ? 1 : 0;
}

/* Where the test data is: $PARITY_SOURCE_ROOT (set by meson test), else ".". */
static inline const char *source_root(void) {
    const char *r = getenv("PARITY_SOURCE_ROOT");
    return r ? r : ".";
}

/* `rel` below the source root, written to buf; returns buf. */
static inline char *source_path(char *buf, size_t size, const char *rel) {
    snprintf(buf, size, "%s/%s", source_root(), rel);
    return buf;
}

/* Quick mode ($PARITY_TEST_QUICK set and not "0"; scripts/sanitize.sh sets it): the heavy
 * tests shrink their sweeps so that the suite runs under sanitizers in minutes. */
static inline int quick(void) {
    const char *q = getenv("PARITY_TEST_QUICK");
    return q && *q && strcmp(q, "0") != 0;
}

/* A uniform value in [-1, 1) from a xorshift64 state (nonzero), which it advances. */
static inline float xorshift_uniform(uint64_t *state) {
    uint64_t x = *state;
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    *state = x;
    return (float)((double)(x >> 11) / 4503599627370496.0 - 1.0);
}

/* The CPU paths this machine runs, portable first (at most 4, into out); the current path is
 * left as it was. */
static inline size_t runnable_cpu_paths(parity_cpu_path *out) {
    static const parity_cpu_path all[] = {PARITY_CPU_PORTABLE, PARITY_CPU_AVX2, PARITY_CPU_AVX512,
                                          PARITY_CPU_AVX512BF16};
    const parity_cpu_path saved = parity_get_cpu_path();
    size_t n = 0;
    for (size_t i = 0; i < 4; i++)
        if (parity_set_cpu_path(all[i]) == PARITY_OK) out[n++] = all[i];
    parity_set_cpu_path(saved);
    return n;
}

/* 1 if each of the n floats at y still holds four bytes `byte` (nothing wrote them). */
static inline int floats_hold_byte(const float *y, size_t n, unsigned char byte) {
    const uint32_t want = byte * 0x01010101u;
    for (size_t i = 0; i < n; i++) {
        uint32_t bits;
        memcpy(&bits, y + i, 4);
        if (bits != want) return 0;
    }
    return 1;
}

#endif
