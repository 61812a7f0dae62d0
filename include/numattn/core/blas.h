/// @file blas.h
/// Thin row-major GEMM wrapper over the linked BLAS (OpenBLAS).
///
/// `C = alpha · op(A) · op(B) + beta · C`, all matrices row-major with leading dimensions in
/// elements. BLAS is kept single-threaded: numattn parallelises above it with `parallel_for`
/// (exec.h), which owns the rule; nothing else in the library sets BLAS's thread count. The one
/// exception is `measure_sgemm_gflops`, whose baseline is multi-threaded GEMM by design.
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

/// Makes the linked BLAS single-threaded if it is not (cheap after the first call). Called by
/// `parallel_for` before it forks and by `sgemm`/`dgemm`, so no caller needs to.
void ensure_serial();

/// The linked BLAS's current thread count (1 whenever numattn code runs).
int threads();

/// Name and version of the linked BLAS, for reports.
const char* library_name();

/// The kernel family the linked OpenBLAS chose at load time (e.g. "SkylakeX", "Prescott").
const char* core_name();

/// The OPENBLAS_CORETYPE that fits this CPU when the linked OpenBLAS did not recognise it and
/// fell back to its generic "Prescott" (SSE3) kernels, or nullptr when no fix is needed.
/// OpenBLAS 0.3.21 (Debian 12) predates Sapphire/Emerald Rapids and runs SSE3 GEMM there, 5–10×
/// below its own AVX-512 kernels. The variable is read when the library loads, so only a program
/// can act on it, by setting it and re-executing itself before any work: the numattn CLI and the
/// benchmark programs do (core/blas_restart.h); the library never does. Results are the
/// same with either kernel family, only speed differs.
const char* recommended_coretype();

/// Measures float32 GEMM throughput of the linked BLAS on `size³` (median of `reps` runs),
/// with `threads` threads in BLAS (set for the measurement, back to one afterwards). The
/// baseline of every efficiency figure. Not to be called while other numattn work runs.
/// @return GFLOP/s under the 2·m·n·k model.
double measure_sgemm_gflops(std::int64_t size, int reps, int threads);

}  // namespace numattn::blas
