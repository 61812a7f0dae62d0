#include "numattn/core/exec.h"

#include <algorithm>
#include <exception>
#include <mutex>
#include <thread>
#include <vector>

#include "numattn/core/blas.h"
#include "numattn/core/error.h"

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

int max_threads() { return std::max(256, 4 * hardware_threads()); }

int ExecContext::num_threads() const {
  NUMATTN_CHECK(threads >= 0 && threads <= max_threads(),
                "thread count {} is out of range: use 1..{} (0 = all {} hardware threads)", threads,
                max_threads(), hardware_threads());
  return threads > 0 ? threads : hardware_threads();
}

namespace {
thread_local int t_thread_index = 0;
thread_local bool t_in_parallel = false;

// Sets the calling thread's worker state for the duration of one chunk and restores the
// previous state afterwards (the OpenMP master thread outlives the region).
class WorkerScope {
 public:
  explicit WorkerScope(int index) : index_(t_thread_index), inside_(t_in_parallel) {
    t_thread_index = index;
    t_in_parallel = true;
  }
  ~WorkerScope() {
    t_thread_index = index_;
    t_in_parallel = inside_;
  }
  WorkerScope(const WorkerScope&) = delete;
  WorkerScope& operator=(const WorkerScope&) = delete;

 private:
  int index_;
  bool inside_;
};
}  // namespace

int thread_index() { return t_thread_index; }

std::size_t worker_slot(std::size_t slots) {
  NUMATTN_CHECK(slots > 0, "worker_slot: a call needs at least one scratch slot");
  return static_cast<std::size_t>(t_thread_index) % slots;
}

void parallel_for(const ExecContext& ctx, std::int64_t n,
                  const std::function<void(std::int64_t)>& fn) {
  if (n <= 0) return;
  int nt = ctx.num_threads();
  if (nt > n) nt = static_cast<int>(n);
  // A nested loop would either oversubscribe the cores (std::thread) or get a team of one
  // whose worker 0 aliases the outer worker 0 (OpenMP): run it here, on this worker.
  if (nt <= 1 || t_in_parallel) {
    for (std::int64_t i = 0; i < n; ++i) fn(i);
    return;
  }
  blas::ensure_serial();  // before forking: BLAS must not start threads inside the region
  std::exception_ptr first;
  std::mutex mu;
  // Contiguous static chunks: item i always lands on the same thread for a given count.
  auto body = [&](int t) {
    WorkerScope scope(t);
    std::int64_t lo = n * t / nt, hi = n * (t + 1) / nt;
    try {
      for (std::int64_t i = lo; i < hi; ++i) fn(i);
    } catch (...) {
      std::lock_guard<std::mutex> lock(mu);
      if (!first) first = std::current_exception();
    }
  };
#ifdef NUMATTN_HAS_OPENMP
  // The runtime may grant fewer threads than asked (OMP_THREAD_LIMIT, OMP_DYNAMIC): the granted
  // ones then take the missing chunks in turn, so every chunk still runs exactly once.
#pragma omp parallel num_threads(nt)
  for (int t = omp_get_thread_num(); t < nt; t += omp_get_num_threads()) body(t);
#else
  std::vector<std::thread> pool;
  for (int t = 1; t < nt; ++t) pool.emplace_back(body, t);
  body(0);
  for (auto& th : pool) th.join();
#endif
  if (first) std::rethrow_exception(first);
}

}  // namespace numattn
