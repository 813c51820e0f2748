/* What the x86 SIMD kernel files share (included only by files compiled with AVX2 or more):
 * the always-inline marker, the denormal flushing of the pair32 entries, the 8 x 8 fp32
 * transpose on ymm and the next-panel prefetch of the large-M GEMMs. */
#ifndef PARITY_KERNELS_X86_H
#define PARITY_KERNELS_X86_H

#include <immintrin.h>
#include <stddef.h>

#define ALWAYS_INLINE static inline __attribute__((always_inline))

/* pair32 flushes denormals (kernels.h) exactly as x86's fma and add do with MXCSR.DAZ (bit
 * 6) and MXCSR.FTZ (bit 15) set. A pair32 entry sets both, calls its body, and puts the
 * caller's MXCSR back; the body is a PAIR32_BODY function (never inlined), so that no
 * floating-point operation of it can be scheduled across the switch. */
#define PAIR32_BODY static __attribute__((noinline))
#define MXCSR_DAZ_FTZ 0x8040u

static inline unsigned pair32_flush_begin(void) {
    const unsigned saved = _mm_getcsr();
    _mm_setcsr(saved | MXCSR_DAZ_FTZ);
    return saved;
}

static inline void pair32_flush_end(unsigned saved) { _mm_setcsr(saved); }

/* A pair32 entry's whole body: `call` (of a PAIR32_BODY function) with MXCSR.DAZ|FTZ set, the
 * caller's MXCSR put back after it. */
#define PAIR32_FLUSHED(call)                                                                   \
    do {                                                                                       \
        const unsigned pair32_saved_mxcsr = pair32_flush_begin();                              \
        call;                                                                                  \
        pair32_flush_end(pair32_saved_mxcsr);                                                  \
    } while (0)

/* 8 x 8 transpose: out[i] lane j = in[j] lane i. */
ALWAYS_INLINE void transpose8(const __m256 in[8], __m256 out[8]) {
    const __m256 t0 = _mm256_unpacklo_ps(in[0], in[1]), t1 = _mm256_unpackhi_ps(in[0], in[1]);
    const __m256 t2 = _mm256_unpacklo_ps(in[2], in[3]), t3 = _mm256_unpackhi_ps(in[2], in[3]);
    const __m256 t4 = _mm256_unpacklo_ps(in[4], in[5]), t5 = _mm256_unpackhi_ps(in[4], in[5]);
    const __m256 t6 = _mm256_unpacklo_ps(in[6], in[7]), t7 = _mm256_unpackhi_ps(in[6], in[7]);
    const __m256 u0 = _mm256_shuffle_ps(t0, t2, 0x44), u1 = _mm256_shuffle_ps(t0, t2, 0xee);
    const __m256 u2 = _mm256_shuffle_ps(t1, t3, 0x44), u3 = _mm256_shuffle_ps(t1, t3, 0xee);
    const __m256 u4 = _mm256_shuffle_ps(t4, t6, 0x44), u5 = _mm256_shuffle_ps(t4, t6, 0xee);
    const __m256 u6 = _mm256_shuffle_ps(t5, t7, 0x44), u7 = _mm256_shuffle_ps(t5, t7, 0xee);
    out[0] = _mm256_permute2f128_ps(u0, u4, 0x20), out[1] = _mm256_permute2f128_ps(u1, u5, 0x20);
    out[2] = _mm256_permute2f128_ps(u2, u6, 0x20), out[3] = _mm256_permute2f128_ps(u3, u7, 0x20);
    out[4] = _mm256_permute2f128_ps(u0, u4, 0x31), out[5] = _mm256_permute2f128_ps(u1, u5, 0x31);
    out[6] = _mm256_permute2f128_ps(u2, u6, 0x31), out[7] = _mm256_permute2f128_ps(u3, u7, 0x31);
}

/* The next panel's weight rows, asked into L2 a few lines at a time while the current panel
 * is computed: widening them then reads L2, not memory. One call per lane pass. */
typedef struct panel_prefetch {
    const char *w;              /* the first weight row of the next panel; NULL: none */
    size_t ld_bytes, lines_per_row, lines, next, per_slot;
} panel_prefetch;

static inline void panel_prefetch_some(panel_prefetch *pf) {
    for (size_t i = 0; i < pf->per_slot && pf->next < pf->lines; i++, pf->next++) {
        const size_t r = pf->next / pf->lines_per_row, c = pf->next % pf->lines_per_row;
        _mm_prefetch(pf->w + r * pf->ld_bytes + c * 64, _MM_HINT_T1);
    }
}

#endif
