/* The names of the library's enumerations: every value has one name, every name maps back to
 * its value, and the names a binding or tool accepts are exactly these. Unknown values give
 * NULL, unknown names a status and a message, and the output is left as it was. */
#include "check.h"

typedef const char *(*name_fn)(int);

static void check_names(const char *what, name_fn name_of, int (*from)(const char *, int *),
                        const char *const *expected, size_t n) {
    for (size_t v = 0; v < n; v++) {
        const char *name = name_of((int)v);
        CHECK(name != NULL && strcmp(name, expected[v]) == 0);
        int back = -1;
        CHECK_OK(from(expected[v], &back));
        CHECK_INT(back, v);
    }
    CHECK(name_of((int)n) == NULL);
    CHECK(name_of(-1) == NULL);
    int untouched = 12345;
    CHECK_STATUS(from("no-such-name", &untouched), PARITY_ERR_INVALID_ARGUMENT);
    CHECK_INT(untouched, 12345);
    CHECK(strstr(parity_last_error(), expected[0]) != NULL); /* the message lists the names */
    CHECK_STATUS(from(NULL, &untouched), PARITY_ERR_INVALID_ARGUMENT);
    CHECK_STATUS(from(expected[0], NULL), PARITY_ERR_INVALID_ARGUMENT);
    printf("names: %s ok\n", what);
}

/* Adapters from the typed out-parameters to int (the enums are int-sized). */
static int backend_from(const char *s, int *out) {
    parity_backend v;
    int rc = parity_backend_from_name(s, out ? &v : NULL);
    if (rc == PARITY_OK) *out = (int)v;
    return rc;
}
static int mode_from(const char *s, int *out) {
    parity_logprob_mode v;
    int rc = parity_logprob_mode_from_name(s, out ? &v : NULL);
    if (rc == PARITY_OK) *out = (int)v;
    return rc;
}
static int arch_from(const char *s, int *out) {
    parity_arch v;
    int rc = parity_arch_from_name(s, out ? &v : NULL);
    if (rc == PARITY_OK) *out = (int)v;
    return rc;
}

int main(void) {
    static const char *const backends[] = {"bf16", "openblas", "amx"};
    static const char *const modes[] = {"raw", "processed", "processed-truncated"};
    static const char *const archs[] = {"qwen2", "qwen3", "llama", "ouro"};
    check_names("backends", parity_backend_name, backend_from, backends, 3);
    CHECK_OK(parity_backend_check(PARITY_BACKEND_BF16));
    CHECK_OK(parity_backend_check(PARITY_BACKEND_OPENBLAS));
    const int amx = parity_backend_check(PARITY_BACKEND_AMX);
    CHECK(amx == PARITY_OK || (amx == PARITY_ERR_UNSUPPORTED && strstr(parity_last_error(), "amx")));
    CHECK_STATUS(parity_backend_check(3), PARITY_ERR_INVALID_ARGUMENT);
    check_names("log-prob modes", parity_logprob_mode_name, mode_from, modes, 3);
    check_names("architectures", parity_arch_name, arch_from, archs, 4);

    for (int p = PARITY_CPU_PORTABLE; p <= PARITY_CPU_AVX512BF16; p++) {
        parity_cpu_path back = (parity_cpu_path)-1;
        CHECK_OK(parity_cpu_path_from_name(parity_cpu_path_name((parity_cpu_path)p), &back));
        CHECK_INT(back, p);
    }
    parity_cpu_path untouched = PARITY_CPU_AVX2;
    CHECK_STATUS(parity_cpu_path_from_name("avx1024", &untouched), PARITY_ERR_INVALID_ARGUMENT);
    CHECK_INT(untouched, PARITY_CPU_AVX2);
    return check_report("names");
}
