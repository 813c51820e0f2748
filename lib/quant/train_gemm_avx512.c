/*
 * The training GEMM's columns compiled with AVX-512 F/BW/VL/DQ (train_gemm_kernel.h's loop,
 * whose int64 block sums the compiler vectorizes with vpmullq): train_gemm_columns_avx512, the
 * bits of the portable train_gemm_columns (every block sum an exact integer).
 */
#include "train_gemm_kernel.h"

void train_gemm_columns_avx512(const train_gemm_job *j, size_t n0, size_t n1) {
    train_columns(j, n0, n1);
}
