/// @file cancel.h
/// Cooperative cancellation of the library's long loops.
///
/// A `CancelToken` is handed to a long-running library call (perplexity's chunk loop, a capture's
/// forward pass, greedy generation's decode steps); the loop calls `check` between its units of
/// work (a chunk, a layer, a token), never inside one, so a cancelled call leaves the model and
/// its caches as a failed call would: nothing half-written is kept. Two ways to cancel:
/// - `request()` from anywhere, a signal handler included (it only stores to a lock-free atomic):
///   the next `check` throws `Cancelled`;
/// - a poll callback given at construction, run by every `check`: it may throw its own exception
///   (the Python binding's raises KeyboardInterrupt after running Python's signal handlers) or call
///   `request()`.
/// Cost: one atomic load per check, plus the poll.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <string>

#include "numattn/core/error.h"

namespace numattn {

/// Thrown by `CancelToken::check` once cancellation was requested. `where()` names the loop and the
/// unit it stopped after ("ppl: after chunk 3 of 10").
class Cancelled : public Error {
 public:
  explicit Cancelled(const std::string& where) : Error("cancelled: " + where), where_(where) {}
  const std::string& where() const { return where_; }

 private:
  std::string where_;
};

class CancelToken {
 public:
  CancelToken() = default;
  /// `poll` runs at every check (from the thread that runs the loop, never inside a parallel region).
  explicit CancelToken(std::function<void()> poll) : poll_(std::move(poll)) {}
  CancelToken(const CancelToken&) = delete;
  CancelToken& operator=(const CancelToken&) = delete;

  /// Async-signal-safe.
  void request() noexcept { requested_.store(true, std::memory_order_relaxed); }
  bool requested() const noexcept { return requested_.load(std::memory_order_relaxed); }
  /// Runs the poll, then throws Cancelled(where()) if cancellation was requested. `where` is built
  /// only then.
  template <class Where>
  void check(Where&& where) const {
    if (poll_) poll_();
    if (requested()) throw Cancelled(std::string(where()));
  }
  void check(const char* where) const {
    check([where] { return std::string(where); });
  }

 private:
  std::function<void()> poll_;
  std::atomic<bool> requested_{false};
};

/// While alive, SIGINT (Ctrl-C) requests cancellation of `token` instead of killing the process; a
/// second SIGINT before the loop reaches its next check falls back to the previous handler (so a
/// loop stuck in one long unit can still be killed). The previous handler is restored on
/// destruction. A process that ignores SIGINT (a shell's background job) keeps ignoring it. One at
/// a time per process; for command-line front-ends.
class SigintCancel {
 public:
  explicit SigintCancel(CancelToken& token);
  ~SigintCancel();
  SigintCancel(const SigintCancel&) = delete;
  SigintCancel& operator=(const SigintCancel&) = delete;

 private:
  void (*previous_)(int) = nullptr;
};

}  // namespace numattn
