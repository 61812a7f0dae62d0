// The decode products' thread split (quant/qgemv.h, GemvSplitTuner and quant_linear): the
// tuner follows synthetic timings (the faster choice wins, a change of load is followed within
// a bounded number of products, size groups are independent), and whichever way quant_linear
// runs a product its result is bitwise the single-threaded one.
#include <gtest/gtest.h>

#include <cstdlib>
#include <cstring>
#include <random>
#include <thread>
#include <vector>

#include "numattn/quant/qgemv.h"
#include "numattn/quant/quant.h"

namespace numattn {
namespace {
namespace NUMATTN_UNITY_ID {

// Drives `t` for `calls` products of `bytes`, each taking cost(split) seconds per byte;
// returns how many were split.
template <class Cost>
int drive(GemvSplitTuner& t, std::uint64_t bytes, int calls, Cost cost) {
  int split = 0;
  for (int i = 0; i < calls; ++i) {
    const bool s = t.choose(bytes);
    split += s ? 1 : 0;
    t.record(bytes, s, cost(s) * static_cast<double>(bytes));
  }
  return split;
}

TEST(GemvSplitTuner, TakesTheFasterChoiceAndKeepsExploring) {
  const std::uint64_t bytes = 300000;
  {
    GemvSplitTuner t;  // splitting halves the time: an idle machine
    const int split = drive(t, bytes, 4000, [](bool s) { return s ? 1e-10 : 2e-10; });
    EXPECT_GE(split, 4000 - 2 * static_cast<int>(GemvSplitTuner::kWarmup) -
                         static_cast<int>(GemvSplitTuner::kTrial) * 4000 / 16);
    EXPECT_LT(split, 4000);  // the other choice is still tried now and then
    EXPECT_NEAR(t.mean_seconds_per_byte(bytes, true), 1e-10, 1e-16);
    EXPECT_NEAR(t.mean_seconds_per_byte(bytes, false), 2e-10, 1e-16);
  }
  {
    GemvSplitTuner t;  // every split waits a time slice: a loaded machine
    const int split = drive(t, bytes, 4000, [](bool s) { return s ? 2e-9 : 2e-10; });
    EXPECT_LE(split, static_cast<int>(GemvSplitTuner::kWarmup +
                                      GemvSplitTuner::kTrial * 4000 / 16));
    EXPECT_GT(split, 0);
  }
  // Trials of a choice confirmed slower back off: over the last 2048 products of a steady
  // machine only every kMaxInterval-th starts one.
  GemvSplitTuner t;
  drive(t, bytes, 4000, [](bool s) { return s ? 1e-10 : 2e-10; });
  const int single = 2048 - drive(t, bytes, 2048, [](bool s) { return s ? 1e-10 : 2e-10; });
  const int trials = 2048 / static_cast<int>(GemvSplitTuner::kMaxInterval);
  EXPECT_GE(single, static_cast<int>(GemvSplitTuner::kTrial) * (trials - 1));
  EXPECT_LE(single, static_cast<int>(GemvSplitTuner::kTrial) * (trials + 1));
}

TEST(GemvSplitTuner, FollowsAChangeOfLoad) {
  const std::uint64_t bytes = 1 << 20;
  GemvSplitTuner t;
  auto idle = [](bool s) { return s ? 1e-10 : 2e-10; };
  auto busy = [](bool s) { return s ? 3e-9 : 2e-10; };
  drive(t, bytes, 3000, idle);
  // Load arrives while splitting: the split choice's own measurements show it at once.
  int lag = 0;
  while (lag < 100 && t.choose(bytes)) {
    t.record(bytes, true, busy(true) * static_cast<double>(bytes));
    ++lag;
  }
  EXPECT_LT(lag, 5);
  drive(t, bytes, 3000, busy);
  // Load leaves while running single: found by the next trial, within the longest interval.
  lag = 0;
  for (int run = 0; lag < 4 * static_cast<int>(GemvSplitTuner::kMaxInterval); ++lag) {
    const bool s = t.choose(bytes);
    t.record(bytes, s, idle(s) * static_cast<double>(bytes));
    run = s ? run + 1 : 0;
    if (run == 8) break;  // eight splits in a row: it switched
  }
  EXPECT_LT(lag, static_cast<int>(GemvSplitTuner::kMaxInterval + GemvSplitTuner::kTrial) + 10);
}

// Drives a fresh tuner for `calls` products: one thread takes 1.6e-10 s per byte, a split
// 1e-10 except every `period`-th split, which stalls at 1e-9. Returns how many were split.
int drive_with_stalls(int calls, int period) {
  const std::uint64_t bytes = 400000;
  GemvSplitTuner t;
  int splits = 0;
  for (int i = 0; i < calls; ++i) {
    const bool s = t.choose(bytes);
    const double cost = !s ? 1.6e-10 : (splits % period == period - 1) ? 1e-9 : 1e-10;
    splits += s ? 1 : 0;
    t.record(bytes, s, cost * static_cast<double>(bytes));
  }
  return splits;
}

TEST(GemvSplitTuner, IgnoresRareStalls) {
  // One split in 32 stalls 10× (a vCPU the host took away for a moment); splitting is still
  // faster in total (mean 1.28e-10 against 1.6e-10 s per byte), but a running mean would
  // flee to one thread after every stall until the next trial.
  EXPECT_GT(drive_with_stalls(4000, 32), 4000 * 9 / 10);
  // Stalls in half the splits are load, not noise: one thread wins.
  EXPECT_LT(drive_with_stalls(4000, 2), 4000 / 10);
}

TEST(GemvSplitTuner, SizeGroupsAreIndependent) {
  GemvSplitTuner t;
  // Small products lose by splitting (fork cost), large ones win: both hold at once.
  auto cost_small = [](bool s) { return s ? 4e-10 : 2e-10; };
  auto cost_large = [](bool s) { return s ? 1e-10 : 2e-10; };
  int small_split = 0, large_split = 0;
  for (int i = 0; i < 2000; ++i) {
    small_split += drive(t, 40000, 1, cost_small);
    large_split += drive(t, 1000000, 1, cost_large);
  }
  EXPECT_LT(small_split, 2000 / 8);
  EXPECT_GT(large_split, 2000 - 2000 / 8);
  EXPECT_EQ(t.mean_seconds_per_byte(5000000, true), 0.0);  // a group never run
}

// A Q8_0 matrix of random blocks (finite scales).
std::vector<std::uint8_t> q8_rows(std::int64_t rows, std::int64_t cols, std::mt19937& g) {
  const std::int64_t rb = ggml_row_bytes(GgmlType::Q8_0, cols);
  std::vector<std::uint8_t> b(static_cast<std::size_t>(rows * rb));
  std::uniform_int_distribution<int> byte(0, 255);
  for (auto& v : b) v = static_cast<std::uint8_t>(byte(g));
  for (std::int64_t r = 0; r < rows; ++r)
    for (std::int64_t k = 0; k < cols / 32; ++k) {
      const std::uint16_t h = fp32_to_fp16(0.01f * static_cast<float>(byte(g) - 128));
      std::memcpy(b.data() + r * rb + k * 34, &h, 2);
    }
  return b;
}

TEST(GemvSplit, QuantLinearIsBitwiseTheSameSplitOrNot) {
  std::mt19937 g(5);
  std::normal_distribution<float> nd(0.f, 1.f);
  const char* env = std::getenv("NUMATTN_GEMV_SPLIT");
  const bool tuned = env == nullptr || *env == '\0' || std::strcmp(env, "auto") == 0;
  for (std::int64_t rows : {32, 37, 211, 1000}) {
    const std::int64_t cols = 256;
    std::vector<std::uint8_t> data = q8_rows(rows, cols, g);
    QuantMatrix m;
    m.cols = cols;
    m.parts.push_back({GgmlType::Q8_0, data.data(), rows, ggml_row_bytes(GgmlType::Q8_0, cols)});
    for (std::int64_t n : {1, 3}) {
      std::vector<float> x(static_cast<std::size_t>(n * cols));
      for (auto& v : x) v = nd(g);
      for (CpuPath path : available_cpu_paths()) {
        std::vector<float> ref(static_cast<std::size_t>(n * rows));
        quant_gemv(m, 0, rows, x.data(), n, cols, ref.data(), rows, false, path);
        // A fresh thread has a fresh tuner, whose warm-up alternates split and single.
        std::thread th([&] {
          reset_gemv_split_stats();
          for (int call = 0; call < 12; ++call) {
            std::vector<float> y(static_cast<std::size_t>(n * rows), -1.f);
            quant_linear(ExecContext{2}, m, x.data(), n, y.data(), false, 0, path);
            for (std::size_t i = 0; i < y.size(); ++i)
              ASSERT_EQ(std::memcmp(&y[i], &ref[i], sizeof(float)), 0)
                  << "rows=" << rows << " n=" << n << " path=" << cpu_path_name(path)
                  << " call=" << call << " i=" << i;
          }
          const GemvSplitStats s = gemv_split_stats();
          EXPECT_EQ(s.split + s.single, 12u);
          if (tuned) {
            EXPECT_GE(s.split, GemvSplitTuner::kWarmup);
            EXPECT_GE(s.single, GemvSplitTuner::kWarmup);
          }
          std::vector<float> y(static_cast<std::size_t>(n * rows));
          quant_linear(ExecContext{1}, m, x.data(), n, y.data(), false, 0, path);
          EXPECT_EQ(gemv_split_stats().single, s.single + 1);  // one thread never splits
        });
        th.join();
      }
    }
  }
}

}  // namespace NUMATTN_UNITY_ID
}  // namespace
}  // namespace numattn
