#include "numattn/core/blas.h"

#include <cblas.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <string_view>
#include <vector>

#include <unistd.h>

#include "numattn/core/rng.h"

namespace numattn::blas {

namespace {
CBLAS_TRANSPOSE tr(Trans t) { return t == Trans::kYes ? CblasTrans : CblasNoTrans; }
}  // namespace

void sgemm(Trans ta, Trans tb, std::int64_t m, std::int64_t n, std::int64_t k, float alpha,
           const float* a, std::int64_t lda, const float* b, std::int64_t ldb, float beta,
           float* c, std::int64_t ldc) {
  if (m <= 0 || n <= 0) return;
  cblas_sgemm(CblasRowMajor, tr(ta), tr(tb), static_cast<int>(m), static_cast<int>(n),
              static_cast<int>(k), alpha, a, static_cast<int>(lda), b, static_cast<int>(ldb), beta,
              c, static_cast<int>(ldc));
}

void dgemm(Trans ta, Trans tb, std::int64_t m, std::int64_t n, std::int64_t k, double alpha,
           const double* a, std::int64_t lda, const double* b, std::int64_t ldb, double beta,
           double* c, std::int64_t ldc) {
  if (m <= 0 || n <= 0) return;
  cblas_dgemm(CblasRowMajor, tr(ta), tr(tb), static_cast<int>(m), static_cast<int>(n),
              static_cast<int>(k), alpha, a, static_cast<int>(lda), b, static_cast<int>(ldb), beta,
              c, static_cast<int>(ldc));
}

void set_threads(int n) { openblas_set_num_threads(n < 1 ? 1 : n); }

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

void restart_with_fast_kernels(char** argv) {
  if (std::getenv("OPENBLAS_CORETYPE") || std::getenv("NUMATTN_KEEP_BLAS_CORE")) return;
  const char* core = recommended_coretype();
  if (!core) return;
  ::setenv("OPENBLAS_CORETYPE", core, 1);
  ::execv("/proc/self/exe", argv);
}

double measure_sgemm_gflops(std::int64_t size, int reps, int threads) {
  const std::size_t nn = static_cast<std::size_t>(size * size);
  std::vector<float> a(nn), b(nn), c(nn, 0.f);
  fill_uniform(a, 1, 0, -1, 1);
  fill_uniform(b, 1, 1, -1, 1);
  set_threads(threads);
  sgemm(Trans::kNo, Trans::kNo, size, size, size, 1.f, a.data(), size, b.data(), size, 0.f,
        c.data(), size);  // warm-up
  std::vector<double> times;
  for (int r = 0; r < std::max(1, reps); ++r) {
    auto t0 = std::chrono::steady_clock::now();
    sgemm(Trans::kNo, Trans::kNo, size, size, size, 1.f, a.data(), size, b.data(), size, 0.f,
          c.data(), size);
    times.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  set_threads(1);
  std::sort(times.begin(), times.end());
  double med = times[times.size() / 2];
  return 2.0 * static_cast<double>(size) * size * size / med * 1e-9;
}

}  // namespace numattn::blas
