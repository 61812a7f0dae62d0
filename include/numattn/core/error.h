/// @file error.h
/// Errors and status values.
///
/// Two tiers, as in faiss:
/// - `NUMATTN_CHECK(cond, fmt, args...)` throws `numattn::Error` for a *user* mistake (bad shape,
///   bad spec string, corrupt file). The message names the thing and the fix.
///   `NUMATTN_CHECK_OPTION(cond, "option", fmt, args...)` throws its subclass `OptionError`,
///   which names the option of a library call that is wrong (the CLI maps it to its flag).
/// - `NUMATTN_ASSERT(cond)` guards internal invariants: it prints and aborts, always on.
/// Expected "cannot do this" answers are `Status` values and never throw.
#pragma once

#include <fmt/format.h>

#include <cstdio>
#include <cstdlib>
#include <stdexcept>
#include <string>
#include <utility>

namespace numattn {

/// The one exception type of the library. What a user did wrong, and how to fix it.
class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& what) : std::runtime_error(what) {}
};

/// A user mistake in one named option of a library call. The option is named as its field
/// (e.g. `ctx` of PplOptions, `max_tokens` of generation): library code never speaks in CLI
/// flag names. The CLI, whose flags are those names spelled `--with-dashes`, reports it as
/// `error: --ctx: <detail>` (tools/numattn/main.cpp). Another option that the detail mentions
/// (e.g. the override that would allow the value) is written in backquotes, `allow_long_ctx`,
/// so that the CLI can spell it as its flag too.
class OptionError : public Error {
 public:
  OptionError(std::string option, std::string detail)
      : Error(option + ": " + detail), option_(std::move(option)), detail_(std::move(detail)) {}
  const std::string& option() const { return option_; }
  const std::string& detail() const { return detail_; }

 private:
  std::string option_, detail_;
};

/// Result of a "can you do this?" question: ok, or a reason a person can read.
class Status {
 public:
  static Status ok() { return Status(); }
  static Status unsupported(std::string reason) { return Status(std::move(reason)); }

  bool is_ok() const { return reason_.empty(); }
  explicit operator bool() const { return is_ok(); }
  /// Empty when ok.
  const std::string& reason() const { return reason_; }

 private:
  Status() = default;
  explicit Status(std::string reason) : reason_(std::move(reason)) {
    if (reason_.empty()) reason_ = "unsupported";
  }
  std::string reason_;
};

namespace detail {
[[noreturn]] inline void assert_fail(const char* cond, const char* file, int line) {
  std::fprintf(stderr, "numattn: internal error: assertion '%s' failed at %s:%d\n", cond, file,
               line);
  std::abort();
}
}  // namespace detail

}  // namespace numattn

#define NUMATTN_CHECK(cond, ...)                                     \
  do {                                                               \
    if (!(cond)) throw ::numattn::Error(::fmt::format(__VA_ARGS__)); \
  } while (0)

/// Throws numattn::OptionError for option `option` (a string) when `cond` is false.
#define NUMATTN_CHECK_OPTION(cond, option, ...)                                      \
  do {                                                                               \
    if (!(cond)) throw ::numattn::OptionError((option), ::fmt::format(__VA_ARGS__)); \
  } while (0)

#define NUMATTN_ASSERT(cond) \
  do {                       \
    if (!(cond)) ::numattn::detail::assert_fail(#cond, __FILE__, __LINE__); \
  } while (0)
