// parallel_for whose failure does not depend on the schedule (private header).
#pragma once

#include <cstdint>
#include <exception>
#include <mutex>

#include "numattn/core/exec.h"

namespace numattn::detail {

/// Runs `fn(t)` for every t in [0, n) on `ctx`; when calls throw, rethrows the exception of the
/// smallest t. A bad input is usually read by many rows, so the error names the same element
/// whatever the thread count and whichever thread failed first.
template <class F>
void parallel_for_ordered_errors(const ExecContext& ctx, std::int64_t n, const F& fn) {
  std::mutex mu;
  std::int64_t first = n;
  std::exception_ptr err;
  parallel_for(ctx, n, [&](std::int64_t t) {
    try {
      fn(t);
    } catch (...) {
      std::lock_guard<std::mutex> lock(mu);
      if (t < first) first = t, err = std::current_exception();
    }
  });
  if (err) std::rethrow_exception(err);
}

}  // namespace numattn::detail
