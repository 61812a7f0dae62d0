#include "numattn/core/blas.h"

#include <cblas.h>

#include <algorithm>
#include <chrono>
#include <mutex>
#include <string_view>
#include <vector>

#include "numattn/core/error.h"
#include "numattn/core/rng.h"
#include "numattn/core/timing.h"

namespace numattn::blas {

namespace {
CBLAS_TRANSPOSE tr(Trans t) { return t == Trans::kYes ? CblasTrans : CblasNoTrans; }

// CBLAS takes int sizes: a larger product would be silently truncated.
void check_dims(std::int64_t m, std::int64_t n, std::int64_t k, std::int64_t lda, std::int64_t ldb,
                std::int64_t ldc) {
  constexpr std::int64_t kMax = 2147483647;
  NUMATTN_CHECK(m <= kMax && n <= kMax && k <= kMax && lda <= kMax && ldb <= kMax && ldc <= kMax,
                "GEMM of {}x{}x{} (leading dimensions {}, {}, {}) exceeds BLAS's 32-bit sizes", m, n,
                k, lda, ldb, ldc);
}

// OpenBLAS starts with one thread per core (or OPENBLAS_NUM_THREADS), and a host program may
// change it; its pool would compete with numattn's own threads for the same cores. Reading the
// count is a plain load, so it is checked on every call; setting it is not thread-safe, hence
// the lock (which also holds off GEMMs while measure_sgemm_gflops runs BLAS threaded).
std::mutex g_mu;
}  // namespace

void ensure_serial() {
  if (openblas_get_num_threads() == 1) return;
  std::lock_guard<std::mutex> lock(g_mu);
  if (openblas_get_num_threads() != 1) openblas_set_num_threads(1);
}

int threads() { return openblas_get_num_threads(); }

void sgemm(Trans ta, Trans tb, std::int64_t m, std::int64_t n, std::int64_t k, float alpha,
           const float* a, std::int64_t lda, const float* b, std::int64_t ldb, float beta,
           float* c, std::int64_t ldc) {
  if (m <= 0 || n <= 0) return;
  check_dims(m, n, k, lda, ldb, ldc);
  ensure_serial();
  cblas_sgemm(CblasRowMajor, tr(ta), tr(tb), static_cast<int>(m), static_cast<int>(n),
              static_cast<int>(k), alpha, a, static_cast<int>(lda), b, static_cast<int>(ldb), beta,
              c, static_cast<int>(ldc));
}

void dgemm(Trans ta, Trans tb, std::int64_t m, std::int64_t n, std::int64_t k, double alpha,
           const double* a, std::int64_t lda, const double* b, std::int64_t ldb, double beta,
           double* c, std::int64_t ldc) {
  if (m <= 0 || n <= 0) return;
  check_dims(m, n, k, lda, ldb, ldc);
  ensure_serial();
  cblas_dgemm(CblasRowMajor, tr(ta), tr(tb), static_cast<int>(m), static_cast<int>(n),
              static_cast<int>(k), alpha, a, static_cast<int>(lda), b, static_cast<int>(ldb), beta,
              c, static_cast<int>(ldc));
}

const char* library_name() { return openblas_get_config(); }

const char* core_name() { return openblas_get_corename(); }

const char* recommended_coretype() {
  if (std::string_view(openblas_get_corename()) != "Prescott") return nullptr;
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
      __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq"))
    return "SKYLAKEX";
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) return "HASWELL";
  return nullptr;
}

double measure_sgemm_gflops(std::int64_t size, int reps, int threads) {
  const std::size_t nn = static_cast<std::size_t>(size * size);
  std::vector<float> a(nn), b(nn), c(nn, 0.f);
  fill_uniform(a, 1, 0, -1, 1);
  fill_uniform(b, 1, 1, -1, 1);
  const int n = static_cast<int>(size);
  // cblas directly: sgemm() would make BLAS serial again.
  auto gemm = [&] {
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, n, n, 1.f, a.data(), n, b.data(), n,
                0.f, c.data(), n);
  };
  std::vector<double> times;
  {
    std::lock_guard<std::mutex> lock(g_mu);
    openblas_set_num_threads(std::max(1, threads));
    gemm();  // warm-up
    for (int r = 0; r < std::max(1, reps); ++r) {
      auto t0 = std::chrono::steady_clock::now();
      gemm();
      times.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    }
    openblas_set_num_threads(1);
  }
  const double med = median(std::move(times));
  return 2.0 * static_cast<double>(size) * size * size / med * 1e-9;
}

}  // namespace numattn::blas
