/*
 * CPU path selection: which kernel table kern() returns.
 *
 * Detected once (pthread_once): AVX2 needs the AVX2, FMA and F16C instructions (cpuid) and
 * an OS that saves the SSE and AVX register state (OSXSAVE, then XCR0 bits 1 and 2); AVX-512
 * needs AVX2 as well, AVX-512 F, DQ, BW and VL, and an OS that also saves the opmask and
 * zmm state (XCR0 bits 5, 6 and 7); AVX512_BF16 needs AVX-512 and the AVX512_BF16 bit
 * (cpuid leaf 7, subleaf 1, eax bit 5). The best path the CPU has is the default, except
 * that avx512bf16 is the default only on AMD CPUs: vdpbf16ps ran at twice the rate of a zmm
 * fp32 fma on Zen 4 and at half of it on Intel Xeons of the 4th and 5th generation, where
 * the avx512 table's fp32 fmas are faster (parity.h). The environment variable
 * PARITY_CPU_PATH (portable | avx2 | avx512 | avx512bf16) forces a path at that point;
 * parity_set_cpu_path() forces one later. Results never depend on the path: the tables are
 * bitwise equal (kernels.h).
 */
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "base/errors.h"
#include "base/nametable.h"
#include "kernels.h"

#if defined(PARITY_HAVE_AVX2)
#include <cpuid.h>
#endif

static pthread_once_t detect_once = PTHREAD_ONCE_INIT;
static int have_avx2, have_avx512, have_avx512bf16, have_avx512vnni, have_avx512vbmi, is_amd;
/* Read by every kernel call: atomic so that a parity_set_cpu_path() is not a data race,
 * relaxed because the tables do not change after detection. */
static _Atomic(const kernels *) current;

#if defined(PARITY_HAVE_AVX2)
/* kernels_portable with the AVX2 entries over it: written once by detect(), read-only after. */
static kernels avx2_table;
#endif
#if defined(PARITY_HAVE_AVX512)
/* avx2_table with the AVX-512 entries over it. */
static kernels avx512_table;
#endif
#if defined(PARITY_HAVE_AVX512BF16)
/* avx512_table with the AVX512_BF16 entries over it. */
static kernels avx512bf16_table;
#endif

/* The name of each path, indexed by parity_cpu_path. */
static const char *const path_names[] = {
    [PARITY_CPU_PORTABLE] = "portable",
    [PARITY_CPU_AVX2] = "avx2",
    [PARITY_CPU_AVX512] = "avx512",
    [PARITY_CPU_AVX512BF16] = "avx512bf16",
};
#define N_PATHS (sizeof path_names / sizeof path_names[0])

/* The path of a name, without touching the thread's error message (detect() runs inside
 * other calls). The names are a table of named entries (nametable.c). */
static int path_of(const char *name, parity_cpu_path *out) {
    const char *const *e = name_table_find(path_names, N_PATHS, sizeof path_names[0], name,
                                           strlen(name));
    if (e) *out = (parity_cpu_path)(e - path_names);
    return e != NULL;
}

/* "portable, avx2, avx512", for messages. */
static void path_list(char *buf, size_t size) {
    name_table_list(path_names, N_PATHS, sizeof path_names[0], buf, size);
}

#if defined(PARITY_HAVE_AVX2)
static int detect_avx2(void) {
    unsigned a, b, c, d;
    if (!__get_cpuid(1, &a, &b, &c, &d)) return 0;
    const unsigned fma = 1u << 12, osxsave = 1u << 27, avx = 1u << 28, f16c = 1u << 29;
    if ((c & (fma | osxsave | avx | f16c)) != (fma | osxsave | avx | f16c)) return 0;
    /* XCR0: bit 1 = SSE state, bit 2 = AVX state, both saved by the OS. */
    unsigned xcr0_lo, xcr0_hi;
    __asm__ volatile("xgetbv" : "=a"(xcr0_lo), "=d"(xcr0_hi) : "c"(0));
    (void)xcr0_hi;
    if ((xcr0_lo & 6u) != 6u) return 0;
    if (!__get_cpuid_count(7, 0, &a, &b, &c, &d)) return 0;
    return (b & (1u << 5)) != 0;  /* AVX2 */
}
#endif

#if defined(PARITY_HAVE_AVX512)
static int detect_avx512(void) {
    unsigned a, b, c, d;
    if (!detect_avx2()) return 0;
    /* XCR0: SSE, AVX, opmask, upper halves of zmm0-15, zmm16-31, all saved by the OS */
    unsigned xcr0_lo, xcr0_hi;
    __asm__ volatile("xgetbv" : "=a"(xcr0_lo), "=d"(xcr0_hi) : "c"(0));
    (void)xcr0_hi;
    if ((xcr0_lo & 0xe6u) != 0xe6u) return 0;
    if (!__get_cpuid_count(7, 0, &a, &b, &c, &d)) return 0;
    const unsigned f = 1u << 16, dq = 1u << 17, bw = 1u << 30, vl = 1u << 31;
    return (b & (f | dq | bw | vl)) == (f | dq | bw | vl);
}
#endif

#if defined(PARITY_HAVE_AVX512VNNI) || defined(PARITY_HAVE_AVX512VBMI)
/* Whether the avx512 path's AVX-512 is there and CPUID leaf 7's ECX has bit `bit`
 * (AVX512_VNNI: 11, AVX512_VBMI: 1). */
static int detect_avx512_ecx7(unsigned bit) {
    unsigned a, b, c, d;
    if (!detect_avx512()) return 0;
    if (!__get_cpuid_count(7, 0, &a, &b, &c, &d)) return 0;
    return (c & (1u << bit)) != 0;
}
#endif

#if defined(PARITY_HAVE_AVX512BF16)
static int detect_avx512bf16(void) {
    unsigned a, b, c, d;
    if (!detect_avx512()) return 0;
    if (!__get_cpuid_count(7, 0, &a, &b, &c, &d) || a < 1) return 0; /* a: the last subleaf */
    if (!__get_cpuid_count(7, 1, &a, &b, &c, &d)) return 0;
    return (a & (1u << 5)) != 0;
}

/* "AuthenticAMD" in cpuid leaf 0 (ebx, edx, ecx). */
static int detect_amd(void) {
    unsigned a, b, c, d;
    if (!__get_cpuid(0, &a, &b, &c, &d)) return 0;
    return b == 0x68747541u && d == 0x69746e65u && c == 0x444d4163u;
}
#endif

static const kernels *table_of(parity_cpu_path path) {
    switch (path) {
    case PARITY_CPU_PORTABLE:
        return &kernels_portable;
    case PARITY_CPU_AVX2:
#if defined(PARITY_HAVE_AVX2)
        return &avx2_table;
#else
        return NULL;
#endif
    case PARITY_CPU_AVX512:
#if defined(PARITY_HAVE_AVX512)
        return &avx512_table;
#else
        return NULL;
#endif
    case PARITY_CPU_AVX512BF16:
#if defined(PARITY_HAVE_AVX512BF16)
        return &avx512bf16_table;
#else
        return NULL;
#endif
    }
    return NULL;
}

static int supported(parity_cpu_path path) {
    switch (path) {
    case PARITY_CPU_PORTABLE:
        return 1;
    case PARITY_CPU_AVX2:
        return have_avx2;
    case PARITY_CPU_AVX512:
        return have_avx512;
    case PARITY_CPU_AVX512BF16:
        return have_avx512bf16;
    }
    return 0;
}

/* Why a path is not available, for messages. */
static const char *missing(parity_cpu_path path) {
    switch (path) {
    case PARITY_CPU_AVX512BF16:
        return table_of(path) ? "this CPU or OS lacks AVX512_BF16 (or AVX-512 F/DQ/BW/VL, AVX2)"
                              : "this build has no AVX512_BF16 kernels";
    case PARITY_CPU_AVX512:
        return table_of(path) ? "this CPU or OS lacks AVX-512 F/DQ/BW/VL (or AVX2)"
                              : "this build has no AVX-512 kernels";
    default:
        return table_of(path) ? "this CPU or OS lacks AVX2, FMA or F16C"
                              : "this build has no AVX2 kernels";
    }
}

static void detect(void) {
    /* Each table's entries are set by its own translation unit, compiled with that table's
     * ISA flags: the compiler may use those instructions even there (it vectorised the
     * avx512 one with zmm stores), so a table is filled only on a CPU that has its ISA. */
#if defined(PARITY_HAVE_AVX2)
    avx2_table = kernels_portable;
    have_avx2 = detect_avx2();
    if (have_avx2) kernels_avx2_set_entries(&avx2_table);
#endif
#if defined(PARITY_HAVE_AVX512)
    avx512_table = avx2_table;
    have_avx512 = detect_avx512();
    if (have_avx512) kernels_avx512_set_entries(&avx512_table);
#endif
#if defined(PARITY_HAVE_AVX512VNNI)
    have_avx512vnni = detect_avx512_ecx7(11);
#endif
#if defined(PARITY_HAVE_AVX512VBMI)
    have_avx512vbmi = detect_avx512_ecx7(1);
#endif
#if defined(PARITY_HAVE_AVX512BF16)
    avx512bf16_table = avx512_table;
    have_avx512bf16 = detect_avx512bf16();
    if (have_avx512bf16) kernels_avx512bf16_set_entries(&avx512bf16_table);
    is_amd = detect_amd();
#endif
    parity_cpu_path best = have_avx512bf16 && is_amd ? PARITY_CPU_AVX512BF16
                           : have_avx512             ? PARITY_CPU_AVX512
                           : have_avx2               ? PARITY_CPU_AVX2
                                                     : PARITY_CPU_PORTABLE;
    parity_cpu_path path = best;

    const char *env = getenv("PARITY_CPU_PATH");
    parity_cpu_path forced;
    if (env && *env) {
        if (!path_of(env, &forced)) {
            char list[64];
            path_list(list, sizeof list);
            log_message(PARITY_LOG_WARN, "PARITY_CPU_PATH=%s is not a path (%s); using %s", env,
                        list, path_names[best]);
        } else if (!supported(forced)) {
            log_message(PARITY_LOG_WARN, "PARITY_CPU_PATH=%s: %s; using %s", env,
                        missing(forced), path_names[best]);
        } else {
            path = forced;
        }
    }
    atomic_store_explicit(&current, table_of(path), memory_order_relaxed);
    log_message(PARITY_LOG_DEBUG, "cpu path: %s", path_names[path]);
}

int cpu_path_supported(parity_cpu_path path) {
    pthread_once(&detect_once, detect);
    return table_of(path) && supported(path);
}

int cpu_has_avx512_vnni(void) {
    pthread_once(&detect_once, detect);
    return have_avx512vnni;
}

int cpu_has_avx512_vbmi(void) {
    pthread_once(&detect_once, detect);
    return have_avx512vbmi;
}

const kernels *kernel_table(parity_cpu_path path) {
    pthread_once(&detect_once, detect);
    return table_of(path);
}

const kernels *kern(void) {
    pthread_once(&detect_once, detect);
    return atomic_load_explicit(&current, memory_order_relaxed);
}

parity_cpu_path parity_get_cpu_path(void) {
    const kernels *k = kern();
    for (size_t p = 0; p < N_PATHS; p++)
        if (table_of((parity_cpu_path)p) == k) return (parity_cpu_path)p;
    return PARITY_CPU_PORTABLE;
}

const char *parity_cpu_path_name(parity_cpu_path path) {
    if ((size_t)path < N_PATHS) return path_names[path];
    return "unknown";
}

int parity_cpu_path_from_name(const char *name, parity_cpu_path *out) {
    clear_error();
    if (!name || !out) return set_error(PARITY_ERR_INVALID_ARGUMENT, "CPU path name or output is NULL");
    if (path_of(name, out)) return PARITY_OK;
    char list[64];
    path_list(list, sizeof list);
    return set_error(PARITY_ERR_INVALID_ARGUMENT, "'%s' is not a CPU path (%s)", name, list);
}

int parity_set_cpu_path(parity_cpu_path path) {
    clear_error();
    pthread_once(&detect_once, detect);
    if ((size_t)path >= N_PATHS)
        return set_error(PARITY_ERR_INVALID_ARGUMENT, "parity_set_cpu_path: %d is not a CPU path",
                         (int)path);
    if (!supported(path))
        return set_error(PARITY_ERR_UNSUPPORTED,
                         "parity_set_cpu_path: path \"%s\" is not available: %s",
                         path_names[path], missing(path));
    atomic_store_explicit(&current, table_of(path), memory_order_relaxed);
    return PARITY_OK;
}

/* ---- AMX (the amx backend) ----------------------------------------------------------------
 * AMX-BF16 needs cpuid leaf 7 edx bits 24 (AMX-TILE) and 22 (AMX-BF16), an OS that saves
 * the tile state (XCR0 bits 17 and 18), and, on Linux, the process's permission to use it:
 * arch_prctl(ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA), asked once. Without the permission
 * the first tile instruction would kill the process (SIGILL), so the backend is refused. */
#if defined(PARITY_HAVE_AMX)
#include <errno.h>
#include <sys/syscall.h>
#include <unistd.h>
#endif

static pthread_once_t amx_once = PTHREAD_ONCE_INIT;
static const char *amx_missing = "this build has no AMX kernels";

static void amx_detect(void) {
#if defined(PARITY_HAVE_AMX)
    unsigned a, b, c, d;
    if (!__get_cpuid_count(7, 0, &a, &b, &c, &d) || !(d & (1u << 24)) || !(d & (1u << 22))) {
        amx_missing = "this CPU lacks AMX-TILE or AMX-BF16";
        return;
    }
    if (!detect_avx512()) {
        amx_missing = "this CPU or OS lacks AVX-512 F/DQ/BW/VL, which the amx backend packs with";
        return;
    }
    unsigned xcr0_lo, xcr0_hi;
    __asm__ volatile("xgetbv" : "=a"(xcr0_lo), "=d"(xcr0_hi) : "c"(0));
    (void)xcr0_hi;
    if ((xcr0_lo & (3u << 17)) != (3u << 17)) {
        amx_missing = "the OS does not enable the AMX tile state (XCR0 bits 17, 18)";
        return;
    }
#if defined(__linux__)
    const long arch_req_xcomp_perm = 0x1023, xfeature_xtiledata = 18;
    if (syscall(SYS_arch_prctl, arch_req_xcomp_perm, xfeature_xtiledata) != 0) {
        amx_missing = errno == EPERM || errno == EINVAL || errno == ENOSYS
                          ? "the OS refused the AMX tile permission (arch_prctl "
                            "ARCH_REQ_XCOMP_PERM)"
                          : "the AMX tile permission request (arch_prctl ARCH_REQ_XCOMP_PERM) "
                            "failed";
        return;
    }
#endif
    amx_missing = NULL;
#endif
}

const char *amx_unavailable(void) {
    pthread_once(&amx_once, amx_detect);
    return amx_missing;
}
