// The threading rules of core/exec.h: thread counts checked at entry, nested loops on the
// calling worker, BLAS serial whenever numattn code runs.
#include <gtest/gtest.h>

#include <cblas.h>

#include <atomic>
#include <mutex>
#include <set>
#include <vector>

#include "numattn/core/blas.h"
#include "numattn/core/error.h"
#include "numattn/core/exec.h"

namespace numattn {
namespace {
namespace NUMATTN_UNITY_ID {

TEST(ExecContext, RejectsNegativeAndHugeThreadCounts) {
  EXPECT_THROW(ExecContext{-1}.num_threads(), Error);
  EXPECT_THROW(ExecContext{max_threads() + 1}.num_threads(), Error);
  EXPECT_THROW(ExecContext{100000}.num_threads(), Error);
  EXPECT_THROW(parallel_for(ExecContext{100000}, 10, [](std::int64_t) {}), Error);
  EXPECT_EQ(ExecContext{0}.num_threads(), hardware_threads());
  EXPECT_EQ(ExecContext{3}.num_threads(), 3);
  EXPECT_GE(max_threads(), 256);
  try {
    (void)ExecContext{-4}.num_threads();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("-4"), std::string::npos) << e.what();
  }
}

TEST(ParallelFor, ThreadIndexIsUniquePerRunningWorker) {
  std::vector<std::set<int>> seen(4);
  std::mutex mu;
  parallel_for(ExecContext{4}, 4, [&](std::int64_t i) {
    std::lock_guard<std::mutex> lock(mu);
    seen[static_cast<std::size_t>(i)].insert(thread_index());
  });
  std::set<int> all;
  for (auto& s : seen) {
    ASSERT_EQ(s.size(), 1u);
    all.insert(*s.begin());
  }
  EXPECT_EQ(all, (std::set<int>{0, 1, 2, 3}));
  EXPECT_EQ(thread_index(), 0);
}

TEST(ParallelFor, NestedLoopRunsOnTheCallingWorkerAndKeepsItsIndex) {
  constexpr int kOuter = 3, kInner = 50;
  std::vector<std::vector<int>> inner_index(kOuter, std::vector<int>(kInner, -1));
  std::vector<int> outer_index(kOuter, -1), after(kOuter, -1);
  std::atomic<int> inner_hits{0};
  parallel_for(ExecContext{kOuter}, kOuter, [&](std::int64_t o) {
    outer_index[static_cast<std::size_t>(o)] = thread_index();
    parallel_for(ExecContext{4}, kInner, [&](std::int64_t i) {
      inner_index[static_cast<std::size_t>(o)][static_cast<std::size_t>(i)] = thread_index();
      ++inner_hits;
    });
    after[static_cast<std::size_t>(o)] = thread_index();  // restored, not reset to 0
  });
  EXPECT_EQ(inner_hits.load(), kOuter * kInner);
  for (int o = 0; o < kOuter; ++o) {
    EXPECT_EQ(outer_index[o], o);
    EXPECT_EQ(after[o], o);
    for (int i = 0; i < kInner; ++i) EXPECT_EQ(inner_index[o][i], o);
  }
  EXPECT_EQ(thread_index(), 0);
}

TEST(ParallelFor, NestedExceptionReachesTheCaller) {
  EXPECT_THROW(parallel_for(ExecContext{2}, 2,
                            [](std::int64_t) {
                              parallel_for(ExecContext{2}, 4, [](std::int64_t i) {
                                if (i == 3) throw Error("inner");
                              });
                            }),
               Error);
  EXPECT_EQ(thread_index(), 0);
}

TEST(Blas, SerialWheneverNumattnRuns) {
  openblas_set_num_threads(2);  // as a host program might
  blas::ensure_serial();
  EXPECT_EQ(blas::threads(), 1);
  // The sgemm baseline runs BLAS threaded and restores the rule afterwards.
  blas::measure_sgemm_gflops(64, 1, 2);
  EXPECT_EQ(blas::threads(), 1);
  std::vector<float> a(16, 1.f), c(16, 0.f);
  parallel_for(ExecContext{2}, 2, [&](std::int64_t i) {
    if (i == 0) {
      EXPECT_EQ(blas::threads(), 1);
      blas::sgemm(blas::Trans::kNo, blas::Trans::kNo, 4, 4, 4, 1.f, a.data(), 4, a.data(), 4, 0.f,
                  c.data(), 4);
    }
  });
  EXPECT_EQ(c[0], 4.f);
}

TEST(Blas, RefusesSizesBeyondThirtyTwoBits) {
  float x = 0;
  EXPECT_THROW(blas::sgemm(blas::Trans::kNo, blas::Trans::kNo, std::int64_t{1} << 31, 1, 1, 1.f,
                           &x, 1, &x, 1, 0.f, &x, 1),
               Error);
}

}  // namespace NUMATTN_UNITY_ID
}  // namespace
}  // namespace numattn
