#include "numattn/core/exec.h"

#include <exception>
#include <mutex>
#include <thread>

#ifdef NUMATTN_HAS_OPENMP
#include <omp.h>
#endif

namespace numattn {

int hardware_threads() {
#ifdef NUMATTN_HAS_OPENMP
  return omp_get_num_procs();
#else
  unsigned n = std::thread::hardware_concurrency();
  return n ? static_cast<int>(n) : 1;
#endif
}

int ExecContext::num_threads() const { return threads > 0 ? threads : hardware_threads(); }

namespace {
thread_local int t_thread_index = 0;
}

int thread_index() { return t_thread_index; }

void parallel_for(const ExecContext& ctx, std::int64_t n,
                  const std::function<void(std::int64_t)>& fn) {
  if (n <= 0) return;
  int nt = ctx.num_threads();
  if (nt > n) nt = static_cast<int>(n);
  if (nt <= 1) {
    for (std::int64_t i = 0; i < n; ++i) fn(i);
    return;
  }
  std::exception_ptr first;
  std::mutex mu;
  // Contiguous static chunks: item i always lands on the same thread for a given count.
  auto body = [&](int t) {
    t_thread_index = t;
    std::int64_t lo = n * t / nt, hi = n * (t + 1) / nt;
    try {
      for (std::int64_t i = lo; i < hi; ++i) fn(i);
    } catch (...) {
      std::lock_guard<std::mutex> lock(mu);
      if (!first) first = std::current_exception();
    }
    t_thread_index = 0;
  };
#ifdef NUMATTN_HAS_OPENMP
#pragma omp parallel num_threads(nt)
  body(omp_get_thread_num());
#else
  std::vector<std::thread> pool;
  for (int t = 1; t < nt; ++t) pool.emplace_back(body, t);
  body(0);
  for (auto& th : pool) th.join();
#endif
  if (first) std::rethrow_exception(first);
}

}  // namespace numattn
