/// @file exec.h
/// Execution context and the library's one parallel loop.
///
/// Kernels never start threads: a driver calls `parallel_for` over independent work items
/// (batch × heads × query blocks). Partitioning is static and each item is computed by one
/// thread with a fixed reduction order, so results are bitwise reproducible for a given
/// thread count.
///
/// `parallel_for` owns the process-wide threading rule: numattn's threads are the only ones.
/// BLAS runs single-threaded (blas.h keeps OpenBLAS at one thread; `parallel_for` makes sure of
/// it before it forks) and Eigen never parallelises (EIGEN_DONT_PARALLELIZE). A `parallel_for`
/// called inside another one runs serially on the calling worker, whose `thread_index()` it keeps.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>

namespace numattn {

/// The largest thread count an `ExecContext` accepts: max(256, 4 × hardware threads).
/// More threads than cores only adds scheduling overhead; far more exhausts the runtime.
int max_threads();

/// Where and how to run. `threads == 0` means all hardware threads; a negative count or one
/// above `max_threads()` is an error (`numattn::Error`, raised by `num_threads()`).
struct ExecContext {
  int threads = 0;
  /// The effective thread count (resolves `threads == 0`); throws on an invalid count.
  int num_threads() const;
};

/// Number of hardware threads available to this process.
int hardware_threads();

/// Runs `fn(i)` for every `i` in `[0, n)` on `ctx.num_threads()` threads, static schedule in
/// contiguous chunks. The first exception thrown by any `fn` is rethrown after all threads
/// joined; none escapes the parallel region. Nested calls run serially on the calling worker.
void parallel_for(const ExecContext& ctx, std::int64_t n, const std::function<void(std::int64_t)>& fn);

/// Index of the calling worker inside the outermost `parallel_for`, in `[0, threads)`
/// (0 outside one). Per-worker scratch indexed by it is never shared by two running threads.
int thread_index();

/// The slot of per-call scratch (`slots` entries, one per thread of the call's own ExecContext)
/// the calling worker uses: `thread_index() % slots`. A method called inside another
/// `parallel_for` with a smaller context runs its loop serially on one outer worker whose index
/// may be ≥ `slots`; the scratch is local to the call, so any one slot is then private to it.
/// Without nesting, thread_index() < slots and this is thread_index().
std::size_t worker_slot(std::size_t slots);

}  // namespace numattn
