/* openblas-invariance: is OpenBLAS's sgemm batch-invariant on this CPU?
 *
 * For each K, computes C = A . B^T (row-major, B transposed: the call PyTorch's CPU fp32
 * matmul makes) for M = 1 .. 80 rows and compares every row bitwise with the same row
 * computed alone (M = 1). Prints one line per M: '.' = equal, 'x' = differs. On the Zen
 * kernels of OpenBLAS 0.3.21 rows inside full M tiles differ from M = 1, which is why
 * libparity's openblas backend calls sgemm one row at a time. Also reports whether M = 1
 * calls with different OpenBLAS thread counts agree. Prints JSON with --json. */
#include <cblas.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

extern char *openblas_get_corename(void);
extern char *openblas_get_config(void);
extern int openblas_get_num_threads(void);
extern void openblas_set_num_threads(int);

static float uniform(unsigned *s) {
    *s = *s * 1664525u + 1013904223u;
    return (float)(*s >> 8) / 16777216.0f - 0.5f;
}

int main(int argc, char **argv) {
    int json = argc > 1 && !strcmp(argv[1], "--json");
    const int N = 300, maxM = 80, Ks[] = {64, 256, 1024};
    int differing_total = 0;
    if (!json) printf("OpenBLAS: %s, core %s, %d threads\n", openblas_get_config(),
                      openblas_get_corename(), openblas_get_num_threads());
    else printf("{\"config\": \"%s\", \"core\": \"%s\", \"results\": [", openblas_get_config(),
                openblas_get_corename());
    for (size_t ki = 0; ki < sizeof Ks / sizeof Ks[0]; ki++) {
        const int K = Ks[ki];
        unsigned seed = 1;
        float *A = malloc(sizeof(float) * maxM * K), *B = malloc(sizeof(float) * N * K);
        float *C = malloc(sizeof(float) * maxM * N), *R = malloc(sizeof(float) * maxM * N);
        if (!A || !B || !C || !R) return 1;
        for (int i = 0; i < maxM * K; i++) A[i] = uniform(&seed);
        for (int i = 0; i < N * K; i++) B[i] = uniform(&seed);
        for (int m = 0; m < maxM; m++)
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, 1, N, K, 1.0f, A + m * K, K, B, K,
                        0.0f, R + m * N, N);
        if (!json) printf("\nK = %d, N = %d: rows of an M-row call vs the same row alone\n", K, N);
        for (int M = 1; M <= maxM; M++) {
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, M, N, K, 1.0f, A, K, B, K, 0.0f,
                        C, N);
            int differ = 0;
            char line[128];
            for (int m = 0; m < M; m++) {
                int d = memcmp(C + m * N, R + m * N, sizeof(float) * N) != 0;
                differ += d;
                line[m] = d ? 'x' : '.';
            }
            line[M] = '\0';
            differing_total += differ;
            if (json)
                printf("%s{\"K\": %d, \"M\": %d, \"rows_differing\": %d}", (ki || M > 1) ? ", " : "", K, M, differ);
            else if (M <= 16 || M % 16 == 0 || M == maxM)
                printf("  M = %2d  %s\n", M, line);
        }
        free(A);
        free(B);
        free(C);
        free(R);
    }
    /* M = 1 with 1 and with 2 OpenBLAS threads (this program's own setting, for the test) */
    const int K = 1024, N1 = 3072;
    unsigned seed = 7;
    float *a = malloc(sizeof(float) * K), *b = malloc(sizeof(float) * N1 * K);
    float *c1 = malloc(sizeof(float) * N1), *c2 = malloc(sizeof(float) * N1);
    if (!a || !b || !c1 || !c2) return 1;
    for (int i = 0; i < K; i++) a[i] = uniform(&seed);
    for (int i = 0; i < N1 * K; i++) b[i] = uniform(&seed);
    openblas_set_num_threads(1);
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, 1, N1, K, 1.0f, a, K, b, K, 0.0f, c1, N1);
    openblas_set_num_threads(2);
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, 1, N1, K, 1.0f, a, K, b, K, 0.0f, c2, N1);
    int thread_equal = memcmp(c1, c2, sizeof(float) * N1) == 0;
    if (json)
        printf("], \"rows_differing_total\": %d, \"m1_threads_1_vs_2_equal\": %s}\n",
               differing_total, thread_equal ? "true" : "false");
    else
        printf("\n%d rows differ from their M = 1 result in total\n"
               "M = 1, K = %d, N = %d: 1 vs 2 OpenBLAS threads %s\n",
               differing_total, K, N1, thread_equal ? "bitwise equal" : "DIFFER");
    free(a);
    free(b);
    free(c1);
    free(c2);
    return 0;
}
