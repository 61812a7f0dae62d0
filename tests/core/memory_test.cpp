// Checked size arithmetic and the available-memory guard (core/memory.h), and its use by the
// random problems of `run`/`bench` (which had a fixed 64 GB cap and unchecked products).
#include "numattn/core/memory.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include "numattn/attention/random_problem.h"
#include "numattn/core/error.h"
#include "support/test_util.h"

namespace numattn {
namespace {
namespace NUMATTN_UNITY_ID {

using test::MemoryCap;

std::string message_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(Memory, CheckedArithmeticRefusesOverflowAndNegativeSizes) {
  constexpr auto kMax = std::numeric_limits<std::int64_t>::max();
  EXPECT_EQ(checked_mul(1 << 20, 1 << 20, "x"), std::int64_t{1} << 40);
  EXPECT_EQ(checked_mul(0, kMax, "x"), 0);
  EXPECT_EQ(checked_add(kMax - 1, 1, "x"), kMax);
  const std::string m = message_of([] { checked_mul(std::int64_t{1} << 32, std::int64_t{1} << 31, "the KV cache"); });
  EXPECT_NE(m.find("the KV cache"), std::string::npos) << m;
  EXPECT_NE(m.find("4294967296 × 2147483648"), std::string::npos) << m;
  EXPECT_THROW(checked_mul(-1, 4, "x"), Error);
  EXPECT_THROW(checked_add(kMax, 1, "x"), Error);
  EXPECT_THROW(checked_add(-3, 1, "x"), Error);
  std::uint64_t out = 0;
  EXPECT_FALSE(mul_overflows(1ull << 32, 1ull << 31, &out));
  EXPECT_EQ(out, 1ull << 63);
  EXPECT_TRUE(mul_overflows(1ull << 32, 1ull << 32, &out));
}

TEST(Memory, AvailableMemoryIsMeasuredOrOverridden) {
  {
    MemoryCap cap("12345");
    EXPECT_EQ(available_memory_bytes(), 12345u);
    EXPECT_NO_THROW(check_memory(12345, "x"));
    const std::string m = message_of([] { check_memory(12346, "a test buffer"); });
    EXPECT_NE(m.find("a test buffer"), std::string::npos) << m;
    EXPECT_NE(m.find("12346 bytes"), std::string::npos) << m;
    EXPECT_NE(m.find("12345 bytes"), std::string::npos) << m;
    // Its own type, so that bindings can report it as the out-of-memory condition it is.
    EXPECT_THROW(check_memory(12346, "x"), OutOfMemory);
  }
  for (const char* bad : {"12k", "-5", "1e9", " 7", "99999999999999999999999"}) {
    MemoryCap cap(bad);
    const std::string m = message_of([] { available_memory_bytes(); });
    EXPECT_NE(m.find("NUMATTN_MEMORY_AVAILABLE"), std::string::npos) << bad << ": " << m;
  }
  // Measured: a running machine has some memory available, and not more than 2^60 bytes.
  const std::uint64_t now = available_memory_bytes();
  EXPECT_GT(now, 0u);
  EXPECT_LT(now, 1ull << 60);
  EXPECT_EQ(format_bytes(512), "512 B");
  EXPECT_EQ(format_bytes(1536), "1.50 KiB");
  EXPECT_EQ(format_bytes(3ull << 30), "3.00 GiB");
}

TEST(Memory, RandomProblemsAreCheckedAgainstAvailableMemory) {
  ProblemConfig c;
  c.heads = 2;
  c.n = 1000;
  c.d = 10;
  // q, k, v, out: 4 × 2 × 1000 × 10 floats, lse 2 × 1000: 82000 floats, 328000 bytes.
  {
    MemoryCap cap("328000");
    EXPECT_NO_THROW(RandomProblem p(c));
  }
  {
    MemoryCap cap("327999");
    const std::string m = message_of([&] { RandomProblem p(c); });
    EXPECT_NE(m.find("328000 bytes"), std::string::npos) << m;
    EXPECT_NE(m.find("327999 bytes"), std::string::npos) << m;
    EXPECT_NE(m.find("heads=2"), std::string::npos) << m;
  }
  // Sizes whose product overflows int64: refused, never a wrapped-around small allocation.
  c.n = std::int64_t{1} << 40;
  c.d = std::int64_t{1} << 30;
  EXPECT_THROW(RandomProblem p(c), Error);
  // The message names the options as the library knows them, not as CLI flags.
  c.n = 8;
  c.d = 4;
  c.heads = 8;
  c.kv_heads = 3;
  try {
    RandomProblem p(c);
    FAIL();
  } catch (const OptionError& e) {
    EXPECT_EQ(e.option(), "kv_heads");
    EXPECT_EQ(std::string(e.what()).find("--"), std::string::npos) << e.what();
  }
}

TEST(HugePageAllocator, BlocksAreAlignedZeroedAndSurviveGrowth) {
  // Below 2 MiB: operator new; from 2 MiB on: a 2 MiB-aligned mapping (odd sizes too).
  for (const std::size_t n : {std::size_t{0}, std::size_t{1}, std::size_t{1000}, std::size_t{(2u << 20) / 4 - 1},
                              std::size_t{(2u << 20) / 4}, std::size_t{(5u << 20) / 4 + 3}}) {
    std::vector<float, HugePageAllocator<float>> v(n);
    if (n * sizeof(float) >= (std::size_t{2} << 20))
      EXPECT_EQ(reinterpret_cast<std::uintptr_t>(v.data()) % (std::uintptr_t{2} << 20), 0u) << n;
    for (std::size_t i = 0; i < n; i += 4099) ASSERT_EQ(v[i], 0.f) << i;
    if (n > 0) {
      v.back() = 1.5f;
      v.resize(2 * n + 1, 2.f);  // reallocation copies, the old block is returned
      EXPECT_EQ(v[n - 1], 1.5f);
      EXPECT_EQ(v.back(), 2.f);
    }
  }
}

TEST(ScratchBlock, ReleasedBlockIsReusedWhenLargeEnoughAndFreedOnRequest) {
  release_scratch_memory();
  void* first = nullptr;
  {
    const ScratchBlock a(1000);
    first = a.data();
    EXPECT_EQ(reinterpret_cast<std::uintptr_t>(first) % 64, 0u);
    std::fill_n(a.as<char>(), 1000, 'x');
  }
  {
    const ScratchBlock b(900);  // fits the kept block
    EXPECT_EQ(b.data(), first);
    const ScratchBlock c(900);  // in use at the same time: a fresh one
    EXPECT_NE(c.data(), first);
    EXPECT_EQ(reinterpret_cast<std::uintptr_t>(c.data()) % 64, 0u);
  }  // both released: the larger (equal here: the first kept) stays
  {
    const ScratchBlock big(5000);  // larger than the kept block: fresh, and kept afterwards
    EXPECT_EQ(reinterpret_cast<std::uintptr_t>(big.data()) % 64, 0u);
    std::fill_n(big.as<char>(), 5000, 'y');
  }
  EXPECT_EQ(release_scratch_memory(), 5056u);  // rounded up to 64 bytes
  EXPECT_EQ(release_scratch_memory(), 0u);
  // Above the keep limit a block is freed, not kept.
  const MemoryCap cap("40000");
  EXPECT_EQ(scratch_keep_limit(), 10000u);
  { const ScratchBlock huge(20000); }
  EXPECT_EQ(release_scratch_memory(), 0u);
}

}  // namespace NUMATTN_UNITY_ID
}  // namespace
}  // namespace numattn
