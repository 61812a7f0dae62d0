/// @file exec.h
/// Execution context and the library's one parallel loop.
///
/// Kernels never start threads: a driver calls `parallel_for` over independent work items
/// (batch × heads × query blocks). Partitioning is static and each item is computed by one
/// thread with a fixed reduction order, so results are bitwise reproducible for a given
/// thread count. BLAS runs single-threaded inside our parallel regions.
#pragma once

#include <cstdint>
#include <functional>

namespace numattn {

/// Where and how to run. `threads <= 0` means all hardware threads.
struct ExecContext {
  int threads = 0;
  /// The effective thread count (resolves `threads <= 0`).
  int num_threads() const;
};

/// Number of hardware threads available to this process.
int hardware_threads();

/// Runs `fn(i)` for every `i` in `[0, n)` on `ctx.num_threads()` threads, static schedule in
/// contiguous chunks. The first exception thrown by any `fn` is rethrown after all threads
/// joined; none escapes the parallel region.
void parallel_for(const ExecContext& ctx, std::int64_t n, const std::function<void(std::int64_t)>& fn);

/// Index of the calling thread inside a `parallel_for` (0 outside one).
int thread_index();

}  // namespace numattn
