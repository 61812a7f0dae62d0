// Shared test support: seeds, scratch files, commands.
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <optional>
#include <string>

#include "numattn/analysis/metrics.h"
#include "numattn/attention/accuracy.h"
#include "numattn/attention/random_problem.h"
#include "numattn/attention/reference.h"

namespace numattn::test {

/// Base seed of randomized tests; override with NUMATTN_TEST_SEED to reproduce a failure.
inline std::uint64_t base_seed() {
  const char* s = std::getenv("NUMATTN_TEST_SEED");
  return s ? std::strtoull(s, nullptr, 10) : 20261129ull;
}

/// Tolerances: one definition, `exact_f32_tolerance` and `AccuracyContract`
/// (numattn/attention/accuracy.h), stated in docs/numerics.md; no test spells its own.
/// float32 machine epsilon, for tests of other layers that scale their own bounds by it.
using numattn::kEpsF32;

/// A fresh directory private to the running test: <tmp>/numattn_<suite>_<test>_<pid>. ctest runs
/// tests in parallel processes, so a fixed name shared by two tests races (one test's clean-up
/// deleting the other's files). Removed, without throwing, when the object goes out of scope.
class ScratchDir {
 public:
  ScratchDir();
  ~ScratchDir();
  ScratchDir(const ScratchDir&) = delete;
  ScratchDir& operator=(const ScratchDir&) = delete;
  const std::filesystem::path& path() const { return path_; }
  /// path() / name, as a string.
  std::string file(const std::string& name) const { return (path_ / name).string(); }

 private:
  std::filesystem::path path_;
};

/// Sets environment variable `name` to `value` for its scope (restoring the previous value),
/// e.g. NUMATTN_MEMORY_AVAILABLE to stand in for a machine with little memory.
class ScopedEnv {
 public:
  ScopedEnv(std::string name, const std::string& value);
  ~ScopedEnv();
  ScopedEnv(const ScopedEnv&) = delete;
  ScopedEnv& operator=(const ScopedEnv&) = delete;

 private:
  std::string name_;
  std::optional<std::string> old_;
};

/// A machine with `bytes` of available memory (core/memory.h) for the scope of a test.
struct MemoryCap : ScopedEnv {
  explicit MemoryCap(const std::string& bytes) : ScopedEnv("NUMATTN_MEMORY_AVAILABLE", bytes) {}
};

/// <tmp>/numattn_<pid>_<name>: a file name no other test process uses; removed at process exit.
std::string temp_path(const std::string& name);

/// Runs a captured command, returns exit status; stdout into *out.
int run_command(const std::string& cmd, std::string* out);

/// `s` without the CLI's informational lines (those starting with "numattn: ", such as the
/// OpenBLAS kernel restart notice), so a test can check that stderr starts with "error: ".
std::string strip_notes(const std::string& s);

/// GPT-2's bytes_to_unicode for byte b (0..255), as UTF-8: printable Latin-1 bytes stand for
/// themselves, the other 68 take code points 256, 257, ... in byte order. Written apart from the
/// tokenizer's own table, for the tests to build vocabularies with.
std::string gpt2_byte_symbol(int b);

/// One call of the numattn CLI built with the tests: exit status, stdout and stderr together
/// (informational lines stripped).
struct CliResult {
  int rc = 0;
  std::string out;
};
/// Runs `numattn <args>` (args as a shell would split them) with stderr merged into stdout.
CliResult cli(const std::string& args);
/// Expects `numattn <args>` to fail with exit status 1 and an output that starts with
/// "error: ", contains every string of `must_contain` and not `must_not_contain` (when given).
void expect_cli_error(const std::string& args, const std::vector<std::string>& must_contain,
                      const std::string& must_not_contain = "");

}  // namespace numattn::test
