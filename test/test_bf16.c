/* bf16 conversions, exhaustively: fp32 -> bf16 on all 2^32 inputs against PyTorch's rule
 * (u + 0x7fff + ((u >> 16) & 1)) >> 16, every NaN -> 0x7fc0, both the public function and
 * every kernel table's round_bf16 (the rounding point of the forward); bf16 -> fp32 on all
 * 65536 patterns against a decoding written from the format (sign, exponent, fraction).
 * The 2^32 sweeps are split across two threads. */
#include <math.h>
#include <pthread.h>
#include <string.h>

#include "check.h"
#include "base/floats.h"
#include "kernels/kernels.h"

typedef struct sweep {
    uint64_t begin, end;  /* input bit patterns [begin, end) */
    const kernels *table; /* NULL: parity_bf16_from_f32; else the table's round_bf16 */
    uint64_t bad;
    uint32_t first_bad;
} sweep;

/* The rule, written out once more. */
static uint16_t want_bf16(uint32_t u) {
    if ((u & 0x7fffffffu) > 0x7f800000u) return 0x7fc0u;
    return (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

/* Inputs visited: every one (1), or in quick mode one in a prime number, which still meets
 * every low-half pattern (ties included) since the step is odd. */
static uint64_t step = 1;

static void *sweep_from_f32(void *arg) {
    sweep *s = arg;
    enum { BLOCK = 4096 };
    float x[BLOCK];
    uint32_t got[BLOCK], u[BLOCK];
    for (uint64_t v = s->begin; v < s->end; v += BLOCK * step) {
        size_t n = 0;
        for (; n < BLOCK && v + n * step < s->end; n++) u[n] = (uint32_t)(v + n * step);
        for (size_t i = 0; i < n; i++) x[i] = f32_from_bits(u[i]);
        if (s->table) {
            s->table->round_bf16(x, n);
            /* the value must be a bf16: low half zero (else got exceeds 16 bits) */
            for (size_t i = 0; i < n; i++)
                got[i] = f32_bits(x[i]) >> 16 | (f32_bits(x[i]) & 0xffffu) << 16;
        } else {
            for (size_t i = 0; i < n; i++) got[i] = parity_bf16_from_f32(x[i]);
        }
        size_t bad = 0;
        for (size_t i = 0; i < n; i++) bad += got[i] != want_bf16(u[i]);
        if (bad && !s->bad)
            for (size_t i = n; i-- > 0;)
                if (got[i] != want_bf16(u[i])) s->first_bad = u[i];
        s->bad += bad;
    }
    return NULL;
}

/* One exhaustive sweep, split across two threads. */
static void sweep_all(const kernels *table, const char *what) {
    sweep parts[2] = {{0, 1ull << 31, table, 0, 0}, {1ull << 31, 1ull << 32, table, 0, 0}};
    pthread_t th;
    CHECK(pthread_create(&th, NULL, sweep_from_f32, &parts[1]) == 0);
    sweep_from_f32(&parts[0]);
    pthread_join(th, NULL);
    for (int i = 0; i < 2; i++) {
        if (parts[i].bad)
            fprintf(stderr, "%s: %" PRIu64 " wrong, first 0x%08" PRIx32 "\n", what, parts[i].bad,
                    parts[i].first_bad);
        CHECK_INT(parts[i].bad, 0);
    }
}

/* The value of a bf16 pattern from its fields: (-1)^s 2^(e-127) (1 + f/128), subnormals
 * 2^-126 (f/128), e = 255 infinities and NaNs. */
static float decode_bf16(uint16_t h) {
    int sign = h >> 15, e = (h >> 7) & 0xff, f = h & 0x7f;
    float mag;
    if (e == 255)
        mag = f ? NAN : INFINITY;
    else if (e == 0)
        mag = ldexpf((float)f, -126 - 7);
    else
        mag = ldexpf((float)(128 + f), e - 127 - 7);
    return sign ? -mag : mag;
}

int main(void) {
    if (quick()) step = 31;
    /* fp32 -> bf16 on every input: the public function, then the kernel tables */
    sweep_all(NULL, "parity_bf16_from_f32");
    sweep_all(&kernels_portable, "round_bf16 (portable)");
#if defined(PARITY_HAVE_AVX2)
    if (parity_set_cpu_path(PARITY_CPU_AVX2) == PARITY_OK)
        sweep_all(kernel_table(PARITY_CPU_AVX2), "round_bf16 (avx2)");
#endif
#if defined(PARITY_HAVE_AVX512)
    if (parity_set_cpu_path(PARITY_CPU_AVX512) == PARITY_OK)
        sweep_all(kernel_table(PARITY_CPU_AVX512), "round_bf16 (avx512)");
#endif

    /* a few by hand: ties to even, overflow to inf, NaN sign and payload dropped */
    CHECK_INT(parity_bf16_from_f32(1.0f), 0x3f80);
    CHECK_INT(parity_bf16_from_f32(1.00390625f), 0x3f80);           /* 1 + 2^-8: tie, even */
    CHECK_INT(parity_bf16_from_f32(1.01171875f), 0x3f82);           /* 1 + 3 * 2^-8: tie, up */
    CHECK_INT(parity_bf16_from_f32(f32_from_bits(0x7f7f8000u)), 0x7f80); /* tie, odd: -> inf */
    CHECK_INT(parity_bf16_from_f32(f32_from_bits(0x7f7f7fffu)), 0x7f7f); /* below the tie */
    CHECK_INT(parity_bf16_from_f32(f32_from_bits(0x00008000u)), 0x0000); /* subnormal tie, even */
    CHECK_INT(parity_bf16_from_f32(f32_from_bits(0x7f800001u)), 0x7fc0); /* signalling NaN */
    CHECK_INT(parity_bf16_from_f32(-0.0f), 0x8000);
    CHECK_INT(parity_bf16_from_f32(-NAN), 0x7fc0);

    /* bf16 -> fp32 on every pattern: exact, and the round trip is the identity */
    int bad_value = 0, bad_bits = 0, bad_trip = 0;
    for (uint32_t h = 0; h < 65536; h++) {
        float x = parity_bf16_to_f32((uint16_t)h);
        uint32_t u;
        memcpy(&u, &x, 4);
        if (u != h << 16) bad_bits++;
        float want = decode_bf16((uint16_t)h);
        if (isnan(want) ? !isnan(x) : (x != want || signbit(x) != signbit(want))) bad_value++;
        if (!isnan(x) && parity_bf16_from_f32(x) != h) bad_trip++;
    }
    CHECK_INT(bad_bits, 0);
    CHECK_INT(bad_value, 0);
    CHECK_INT(bad_trip, 0);

    return check_report("test_bf16");
}
