/// @file blas.h
/// Thin row-major GEMM wrapper over the linked BLAS (OpenBLAS).
///
/// `C = alpha · op(A) · op(B) + beta · C`, all matrices row-major with leading dimensions in
/// elements. BLAS is kept single-threaded: numattn parallelises above it (see exec.h).
#pragma once

#include <cstdint>

namespace numattn::blas {

enum class Trans { kNo, kYes };

/// float32 GEMM. A is m×k (k×m if transposed), B is k×n (n×k if transposed), C is m×n.
void sgemm(Trans ta, Trans tb, std::int64_t m, std::int64_t n, std::int64_t k, float alpha,
           const float* a, std::int64_t lda, const float* b, std::int64_t ldb, float beta,
           float* c, std::int64_t ldc);
/// float64 GEMM, same conventions.
void dgemm(Trans ta, Trans tb, std::int64_t m, std::int64_t n, std::int64_t k, double alpha,
           const double* a, std::int64_t lda, const double* b, std::int64_t ldb, double beta,
           double* c, std::int64_t ldc);

/// Sets the BLAS library's own thread count (numattn uses 1 and parallelises itself).
void set_threads(int n);

/// Name and version of the linked BLAS, for reports.
const char* library_name();

/// The kernel family the linked OpenBLAS chose at load time (e.g. "SkylakeX", "Prescott").
const char* core_name();

/// The OPENBLAS_CORETYPE that fits this CPU when the linked OpenBLAS did not recognise it and
/// fell back to its generic "Prescott" (SSE3) kernels, or nullptr when no fix is needed.
/// OpenBLAS 0.3.21 (Debian 12) predates Sapphire/Emerald Rapids and runs SSE3 GEMM there, 5–10×
/// below its own AVX-512 kernels; the variable is read when the library loads, so a program
/// must set it and restart itself: restart_with_fast_kernels().
const char* recommended_coretype();

/// Call first thing in main(): when recommended_coretype() is not null, sets OPENBLAS_CORETYPE
/// and re-executes the program with the same arguments (once: the restarted process finds the
/// variable set). An explicit OPENBLAS_CORETYPE, or NUMATTN_KEEP_BLAS_CORE=1, is respected. If
/// exec fails the program goes on with the slow kernels: results are the same, only speed differs.
/// Used by the numattn CLI and the benchmark program, whose efficiency figures are ratios to sgemm.
void restart_with_fast_kernels(char** argv);

/// Measures float32 GEMM throughput of the linked BLAS on `size³` (median of `reps` runs),
/// with `threads` threads in BLAS. The baseline of every efficiency figure.
/// @return GFLOP/s under the 2·m·n·k model.
double measure_sgemm_gflops(std::int64_t size, int reps, int threads);

}  // namespace numattn::blas
