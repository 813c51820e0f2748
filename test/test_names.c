/* The names of the library's enumerations: every value has one name, every name maps back to
 * its value, and the names a binding or tool accepts are exactly these. Unknown values give
 * NULL, unknown names a status and a message, and the output is left as it was. Quantizer
 * names are unique within their gemm format, so their pair takes the format too. */
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

/* The quantizers: one enum whose values run through the gemm formats in order (rules appended
 * later follow them), one pair of names (a name is unique within its format only), and the
 * deprecated fp8 pair agreeing with it on the fp8 rules. */
static void check_quantizer_names(void) {
    static const struct {
        uint32_t gemm;
        parity_quantizer first, last;
        const char *names[5]; /* first's name, then the next values' */
    } formats[] = {
        {PARITY_GEMM_FP8_BLOCK, PARITY_FP8Q_DEEPSEEK, PARITY_FP8Q_TE_POW2,
         {"deepseek", "sglang", "te", "deepgemm", "te-pow2"}},
        {PARITY_GEMM_MXFP8, PARITY_FP8Q_MX_OCP, PARITY_FP8Q_MX_RCEIL, {"ocp", "te"}},
        {PARITY_GEMM_NVFP4, PARITY_QUANT_NVFP4_MODELOPT, PARITY_QUANT_NVFP4_TORCHAO,
         {"modelopt", "te", "torchao"}},
        {PARITY_GEMM_MXFP4, PARITY_QUANT_MXFP4_OCP, PARITY_QUANT_MXFP4_MICROXCALING,
         {"ocp", "rceil", "microxcaling"}},
        {PARITY_GEMM_TERNARY, PARITY_QUANT_TERNARY_BITNET, PARITY_QUANT_TERNARY_ONEBITLLMS,
         {"bitnet", "hf-bitlinear", "onebitllms"}},
        /* appended later, after every format's first rules */
        {PARITY_GEMM_NVFP4, PARITY_QUANT_NVFP4_TE_2D, PARITY_QUANT_NVFP4_TE_2D, {"te-2d"}},
    };
    int next = 0;
    for (size_t f = 0; f < sizeof formats / sizeof formats[0]; f++)
        for (int q = (int)formats[f].first; q <= (int)formats[f].last; q++) {
            CHECK_INT(q, next++);
            const char *expected = formats[f].names[q - (int)formats[f].first];
            const char *name = parity_quantizer_name(q);
            CHECK(name != NULL && strcmp(name, expected) == 0);
            int back = -1;
            CHECK_OK(parity_quantizer_from_name(formats[f].gemm, expected, &back));
            CHECK_INT(back, q);
            if (formats[f].gemm != PARITY_GEMM_FP8_BLOCK && formats[f].gemm != PARITY_GEMM_MXFP8) {
                CHECK(parity_fp8_quantizer_name(q) == NULL);
                continue;
            }
            const char *fp8_name = parity_fp8_quantizer_name(q);
            CHECK(fp8_name != NULL && strcmp(fp8_name, expected) == 0);
            back = -1;
            CHECK_OK(parity_fp8_quantizer_from_name(formats[f].gemm == PARITY_GEMM_MXFP8, expected,
                                                    &back));
            CHECK_INT(back, q);
        }
    CHECK_INT(next, 17);
    CHECK(parity_quantizer_name(next) == NULL);
    CHECK(parity_quantizer_name(-1) == NULL);
    int untouched = 12345;
    CHECK_STATUS(parity_quantizer_from_name(PARITY_GEMM_NVFP4, "deepseek", &untouched),
                 PARITY_ERR_POLICY);
    CHECK_INT(untouched, 12345);
    CHECK(strstr(parity_last_error(), "modelopt") != NULL); /* the message lists the names */
    CHECK_STATUS(parity_quantizer_from_name(PARITY_GEMM_BF16, "te", &untouched), PARITY_ERR_POLICY);
    CHECK_STATUS(parity_quantizer_from_name(PARITY_GEMM_MXFP8, NULL, &untouched),
                 PARITY_ERR_INVALID_ARGUMENT);
    CHECK_INT(untouched, 12345);
    printf("names: quantizers ok\n");
}

int main(void) {
    static const char *const backends[] = {"bf16", "openblas", "amx"};
    static const char *const modes[] = {"raw", "processed", "processed-truncated"};
    static const char *const archs[] = {"qwen2", "qwen3", "llama", "ouro", "qwen3_moe",
                                        "qwen2_moe"};
    check_names("backends", parity_backend_name, backend_from, backends, 3);
    CHECK_OK(parity_backend_check(PARITY_BACKEND_BF16));
#if defined(PARITY_HAVE_OPENBLAS)
    CHECK_OK(parity_backend_check(PARITY_BACKEND_OPENBLAS));
#else /* meson -Dopenblas=disabled: refused, and the message says why */
    CHECK_STATUS(parity_backend_check(PARITY_BACKEND_OPENBLAS), PARITY_ERR_UNSUPPORTED);
    CHECK(strstr(parity_last_error(), "without OpenBLAS") != NULL);
#endif
    const int amx = parity_backend_check(PARITY_BACKEND_AMX);
    CHECK(amx == PARITY_OK || (amx == PARITY_ERR_UNSUPPORTED && strstr(parity_last_error(), "amx")));
    CHECK_STATUS(parity_backend_check(3), PARITY_ERR_INVALID_ARGUMENT);
    check_names("log-prob modes", parity_logprob_mode_name, mode_from, modes, 3);
    check_names("architectures", parity_arch_name, arch_from, archs, 6);
    check_quantizer_names();

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
