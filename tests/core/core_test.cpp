#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <filesystem>
#include <limits>
#include <vector>

#include "numattn/core/blas.h"
#include "numattn/core/exec.h"
#include "numattn/core/npy.h"
#include "numattn/core/rng.h"
#include "numattn/core/cpu.h"
#include "numattn/core/simd.h"
#include "numattn/core/tensor.h"
#include "numattn/core/timing.h"
#include "support/test_util.h"

namespace numattn {
namespace {
namespace NUMATTN_UNITY_ID {

TEST(Rng, SameNumbersForAnyThreadCount) {
  std::vector<float> serial(10007);
  fill_normal(serial, 42, 3);
  for (int threads : {1, 2, 3, 8}) {
    std::vector<float> par(serial.size());
    CounterRng rng(42, 3);
    parallel_for(ExecContext{threads}, static_cast<std::int64_t>(par.size()),
                 [&](std::int64_t i) { par[i] = static_cast<float>(rng.normal(static_cast<std::uint64_t>(i))); });
    EXPECT_EQ(par, serial) << threads;
  }
}

TEST(Rng, NormalMomentsAndStreamsDiffer) {
  std::vector<double> a(200000), b(200000);
  fill_normal(a, 1, 0);
  fill_normal(b, 1, 1);
  double m = 0, v = 0, cross = 0;
  for (std::size_t i = 0; i < a.size(); ++i) m += a[i], v += a[i] * a[i], cross += a[i] * b[i];
  m /= a.size();
  v = v / a.size() - m * m;
  EXPECT_NEAR(m, 0.0, 0.01);
  EXPECT_NEAR(v, 1.0, 0.01);
  EXPECT_NEAR(cross / a.size(), 0.0, 0.01);
}

TEST(Philox, KnownAnswer) {
  // Random123 known-answer vector for philox4x32-10 with all-zero counter and key.
  auto r = philox4x32({0, 0, 0, 0}, {0, 0});
  EXPECT_EQ(r[0], 0x6627e8d5u);
  EXPECT_EQ(r[1], 0xe169c58du);
  EXPECT_EQ(r[2], 0xbc57ac4cu);
  EXPECT_EQ(r[3], 0x9b00dbd8u);
}

TEST(ParallelFor, CoversEveryIndexOnceAndRethrows) {
  std::vector<std::atomic<int>> hits(1000);
  parallel_for(ExecContext{4}, 1000, [&](std::int64_t i) { hits[i]++; });
  for (auto& h : hits) EXPECT_EQ(h.load(), 1);
  EXPECT_THROW(parallel_for(ExecContext{3}, 100,
                            [&](std::int64_t i) {
                              if (i == 57) throw Error("boom");
                            }),
               Error);
}

TEST(Simd, ExpMatchesStdExp) {
  double worst = 0;
  for (double x = -87.0; x <= 88.0; x += 0.0137) {
    const float xf = static_cast<float>(x);
    const double ref = std::exp(static_cast<double>(xf));
    worst = std::max(worst, std::abs(simd::exp_f32(xf) - ref) / ref);
  }
  EXPECT_LT(worst, 4e-7);
  EXPECT_EQ(simd::exp_f32(-INFINITY), 0.0f);
  EXPECT_EQ(simd::exp_f32(-1000.f), 0.0f);
  EXPECT_EQ(simd::exp_f32(0.f), 1.0f);
}

// The array forms run the 8/16-lane overloads and finish in scalar code: on every CPU path, every
// length from 0 to 40 covers whole vectors plus every tail, with values that hit the clamps.
TEST(Simd, ArrayExpAndSiluMulMatchDoubleOnEveryTail) {
  for (CpuPath path : runnable_cpu_paths()) {
  const CpuPathScope scope(path);
  SCOPED_TRACE(cpu_path_name(path));
  for (std::int64_t n = 0; n <= 40; ++n) {
    std::vector<float> x(static_cast<std::size_t>(n)), y(x.size()), u(x.size()), a(x.size());
    for (std::int64_t i = 0; i < n; ++i) {
      const float v = static_cast<float>(std::sin(1.7 * static_cast<double>(i) + 0.3 * static_cast<double>(n)) * 30.0);
      x[static_cast<std::size_t>(i)] = i % 11 == 5 ? -1000.f : i % 13 == 7 ? 95.f : v;
      u[static_cast<std::size_t>(i)] = static_cast<float>(std::cos(0.9 * static_cast<double>(i))) + 0.5f;
    }
    simd::exp_f32(x.data(), y.data(), n);
    simd::silu_mul(x.data(), u.data(), a.data(), n);
    for (std::int64_t i = 0; i < n; ++i) {
      const auto k = static_cast<std::size_t>(i);
      const double xd = x[k];
      const double e = std::exp(std::min(xd, 88.0));
      if (xd < -87.4) {
        EXPECT_EQ(y[k], 0.f) << "n=" << n << " i=" << i;
      } else {
        EXPECT_LE(std::abs(y[k] - e) / e, 4e-7) << "n=" << n << " i=" << i << " x=" << xd;
      }
      // g·σ(g)·u in double, with e^{−g} saturated at e^88 as exp_f32 does.
      const double ref = xd / (1.0 + std::exp(std::min(-xd, 88.0))) * static_cast<double>(u[k]);
      EXPECT_LE(std::abs(a[k] - ref), 1e-6 * std::abs(ref) + 1e-37) << "n=" << n << " i=" << i << " g=" << xd;
    }
    // GeGLU's gate in double: g/2·(1 + tanh z) as stated where 1 + tanh z does not cancel, and
    // by the identity (1 + tanh z)/2 = 1/(1 + e^{−2z}) in the negative tail, where double's
    // 1 + tanh z loses every digit (it is 0 below z ≈ −19).
    simd::gelu_tanh_mul(x.data(), u.data(), a.data(), n);
    for (std::int64_t i = 0; i < n; ++i) {
      const auto k = static_cast<std::size_t>(i);
      const double g = x[k], z = std::sqrt(2.0 / M_PI) * (g + 0.044715 * g * g * g);
      const double half_1p_tanh = z > -1 ? 0.5 * (1.0 + std::tanh(z)) : 1.0 / (1.0 + std::exp(-2.0 * z));
      const double ref = g * half_1p_tanh * static_cast<double>(u[k]);
      // Relative error: a few float32 roundings, plus e^{−2z}'s condition number |2z| times the
      // rounding of its float32 argument.
      // exp_f32 saturates at e^88, so the far tail is g·u/(1 + e^88), not 0.
      EXPECT_LE(std::abs(a[k] - ref), (2e-6 + 2e-7 * std::abs(2 * z)) * std::abs(ref) + 1e-37 * std::abs(g * u[k]))
          << "gelu n=" << n << " i=" << i << " g=" << g;
    }
  }
  // NaN stays NaN in both, in the vector body and in the tail.
  std::vector<float> x(19, 1.f), y(19), a(19);
  x[3] = x[18] = std::nanf("");
  simd::exp_f32(x.data(), y.data(), 19);
  simd::silu_mul(x.data(), x.data(), a.data(), 19);
  std::vector<float> ag(19);
  simd::gelu_tanh_mul(x.data(), x.data(), ag.data(), 19);
  for (std::size_t i : {std::size_t{3}, std::size_t{18}}) {
    EXPECT_TRUE(std::isnan(y[i]));
    EXPECT_TRUE(std::isnan(a[i]));
    EXPECT_TRUE(std::isnan(ag[i]));
  }
  EXPECT_FLOAT_EQ(y[0], std::exp(1.f));
  }
}

TEST(Simd, SumSquaresF64MatchesASequentialSumOnEveryTail) {
  for (CpuPath path : runnable_cpu_paths()) {
  const CpuPathScope scope(path);
  SCOPED_TRACE(cpu_path_name(path));
  for (std::int64_t n = 0; n <= 40; ++n) {
    std::vector<float> x(static_cast<std::size_t>(n));
    for (std::int64_t i = 0; i < n; ++i)
      x[static_cast<std::size_t>(i)] = static_cast<float>(std::sin(0.7 * static_cast<double>(i + n)) * (i % 7 == 3 ? 3e18 : 1.0));
    double ref = 0;
    for (float v : x) ref += static_cast<double>(v) * v;
    EXPECT_NEAR(simd::sum_squares_f64(x.data(), n), ref, 1e-14 * ref) << "n=" << n;
  }
  std::vector<float> big(1000, 3e19f);  // ≈ 9e38 per term: beyond float, fine in double
  const double b = 3e19f;
  EXPECT_NEAR(simd::sum_squares_f64(big.data(), 1000), 1000 * b * b, 1e-12 * 1000 * b * b);
  }
}

// max_f32, exp_shift and dot_f32 on every path and length 0..40 against float64: NaN anywhere
// makes the maximum NaN, exp_shift's sum is the sum of what it stored, and the float32 dot
// product is within n·u·Σ|x·y| of the exact one.
TEST(Simd, MaxExpShiftAndDotMatchDoubleOnEveryTail) {
  for (CpuPath path : runnable_cpu_paths()) {
    const CpuPathScope scope(path);
    SCOPED_TRACE(cpu_path_name(path));
    EXPECT_EQ(simd::max_f32(nullptr, 0), -INFINITY);
    for (std::int64_t n = 1; n <= 40; ++n) {
      std::vector<float> x(static_cast<std::size_t>(n)), y(x.size());
      for (std::int64_t i = 0; i < n; ++i) {
        x[static_cast<std::size_t>(i)] = static_cast<float>(std::sin(2.3 * static_cast<double>(i) + n) * 40.0);
        y[static_cast<std::size_t>(i)] = static_cast<float>(std::cos(1.1 * static_cast<double>(i)) * 3.0);
      }
      const float want_max = *std::max_element(x.begin(), x.end());
      EXPECT_EQ(simd::max_f32(x.data(), n), want_max) << "n=" << n;
      double dot = 0, mag = 0;
      for (std::size_t i = 0; i < x.size(); ++i) {
        dot += static_cast<double>(x[i]) * y[i];
        mag += std::abs(static_cast<double>(x[i]) * y[i]);
      }
      EXPECT_NEAR(simd::dot_f32(x.data(), y.data(), n), dot, static_cast<double>(n) * 0x1p-23 * mag) << "n=" << n;
      std::vector<float> e = x;
      const double z = simd::exp_shift(e.data(), n, -want_max, 0.25f);
      double zsum = 0;
      for (std::size_t i = 0; i < e.size(); ++i) {
        const double ref = std::exp(static_cast<double>(x[i]) - want_max) + 0.25;
        EXPECT_LE(std::abs(e[i] - ref), 4e-7 * ref) << "n=" << n << " i=" << i;
        zsum += e[i];
      }
      EXPECT_NEAR(z, zsum, 1e-6 * zsum) << "n=" << n;
      for (std::int64_t at : {std::int64_t{0}, n / 2, n - 1}) {
        std::vector<float> w = x;
        w[static_cast<std::size_t>(at)] = std::nanf("");
        EXPECT_TRUE(std::isnan(simd::max_f32(w.data(), n))) << "n=" << n << " NaN at " << at;
      }
    }
  }
}

// The path choice itself: names round-trip, portable always runs, scopes nest and restore, a
// path the CPU lacks is refused, and every registered family runs a path at or below the
// library's.
TEST(CpuPaths, ScopesChooseThePathOfEveryFamily) {
  const auto paths = runnable_cpu_paths();
  ASSERT_FALSE(paths.empty());
  EXPECT_EQ(paths.front(), CpuPath::kPortable);
  for (CpuPath p : {CpuPath::kPortable, CpuPath::kAvx2, CpuPath::kAvx512, CpuPath::kAvx512Vnni})
    EXPECT_EQ(parse_cpu_path(cpu_path_name(p)), p);
  EXPECT_THROW(parse_cpu_path("sse9"), Error);
  const CpuPath before = default_cpu_path();
  {
    const CpuPathScope outer(CpuPath::kPortable);
    EXPECT_EQ(default_cpu_path(), CpuPath::kPortable);
    for (const KernelPath& k : kernel_paths(default_cpu_path())) EXPECT_EQ(k.path, CpuPath::kPortable) << k.family;
    {
      const CpuPathScope inner(paths.back());
      EXPECT_EQ(default_cpu_path(), paths.back());
    }
    EXPECT_EQ(default_cpu_path(), CpuPath::kPortable);
  }
  EXPECT_EQ(default_cpu_path(), before);
  for (CpuPath p : {CpuPath::kAvx2, CpuPath::kAvx512, CpuPath::kAvx512Vnni})
    if (!cpu_can_run(p)) EXPECT_THROW(CpuPathScope{p}, Error) << cpu_path_name(p);
  for (const KernelPath& k : kernel_paths(CpuPath::kAvx512Vnni))
    EXPECT_LE(static_cast<int>(k.path), static_cast<int>(CpuPath::kAvx512Vnni)) << k.family;
  const auto fams = kernel_paths(CpuPath::kAvx512);
  EXPECT_TRUE(std::any_of(fams.begin(), fams.end(), [](const KernelPath& k) { return std::string(k.family) == "exact.flash"; }));
}

// The one median every timing, benchmark row and statistic of numattn reports.
TEST(Timing, MedianOfOddAndEvenCountsInAnyOrder) {
  EXPECT_EQ(median({3.0}), 3.0);
  EXPECT_EQ(median({5.0, 1.0, 3.0}), 3.0);
  EXPECT_EQ(median({4.0, 1.0, 3.0, 2.0}), 2.5);  // mean of the two middle values, not the upper one
  EXPECT_EQ(median({-1.0, -1.0, 7.0, 7.0}), 3.0);
  EXPECT_EQ(median({2.0, std::numeric_limits<double>::infinity(), 1.0}), 2.0);
  int calls = 0;
  EXPECT_GE(median_seconds(0, [&] { ++calls; }), 0.0);
  EXPECT_EQ(calls, 1);  // at least one run whatever `reps` says
}

TEST(Tensor, BnhdViewIsAPermutation) {
  std::vector<float> buf(2 * 3 * 4 * 5);
  for (std::size_t i = 0; i < buf.size(); ++i) buf[i] = static_cast<float>(i);
  auto v = TensorView<float>::bnhd(buf.data(), 2, 4, 3, 5);  // memory [2, 3, 4, 5] = [b, n, h, d]
  EXPECT_EQ(v(1, 2, 0, 3), buf[((1 * 3 + 0) * 4 + 2) * 5 + 3]);
  EXPECT_FALSE(v.is_contiguous());
  EXPECT_TRUE(TensorView<float>::contiguous(buf.data(), {2, 3, 4, 5}).is_contiguous());
}

TEST(Blas, SgemmMatchesLoops) {
  const int m = 7, n = 5, k = 3;
  std::vector<float> a(m * k), b(n * k), c(m * n);
  fill_uniform(a, 1, 0, -1, 1);
  fill_uniform(b, 1, 1, -1, 1);
  blas::sgemm(blas::Trans::kNo, blas::Trans::kYes, m, n, k, 2.f, a.data(), k, b.data(), k, 0.f, c.data(), n);
  for (int i = 0; i < m; ++i)
    for (int j = 0; j < n; ++j) {
      double s = 0;
      for (int t = 0; t < k; ++t) s += a[i * k + t] * b[j * k + t];
      EXPECT_NEAR(c[i * n + j], 2 * s, 1e-5);
    }
}

class NpyTest : public ::testing::Test {
 protected:
  test::ScratchDir scratch;
  const std::filesystem::path& dir = scratch.path();
};

TEST_F(NpyTest, RoundTripsAllDtypes) {
  std::vector<float> f = {1.5f, -2.f, 3.25f, 0.f, 1e-30f, -7.f};
  std::vector<double> d = {1e300, -2.5, 3.0};
  std::vector<std::int64_t> i = {-1, 0, 1ll << 40};
  npy::write((dir / "f.npy").string(), {2, 3}, f.data());
  npy::write((dir / "d.npy").string(), {3}, d.data());
  npy::write((dir / "i.npy").string(), {1, 1, 3}, i.data());
  auto af = npy::read((dir / "f.npy").string());
  EXPECT_EQ(af.dtype, npy::DType::kFloat32);
  EXPECT_EQ(af.shape, (std::vector<std::int64_t>{2, 3}));
  EXPECT_EQ(af.f32, f);
  auto ad = npy::read((dir / "d.npy").string());
  EXPECT_EQ(ad.shape, (std::vector<std::int64_t>{3}));
  EXPECT_EQ(ad.f64, d);
  auto ai = npy::read((dir / "i.npy").string());
  EXPECT_EQ(ai.shape, (std::vector<std::int64_t>{1, 1, 3}));
  EXPECT_EQ(ai.i64, i);
}

TEST_F(NpyTest, RejectsBadFiles) {
  auto p = (dir / "bad.npy").string();
  { std::FILE* f = std::fopen(p.c_str(), "wb"); std::fputs("not numpy", f); std::fclose(f); }
  EXPECT_THROW(npy::read(p), Error);
  std::vector<float> x(100, 1.f);
  npy::write(p, {10, 10}, x.data());
  std::filesystem::resize_file(p, std::filesystem::file_size(p) - 8);
  EXPECT_THROW(npy::read(p), Error);
  EXPECT_THROW(npy::read((dir / "missing.npy").string()), Error);
}

}  // namespace NUMATTN_UNITY_ID
}  // namespace
}  // namespace numattn
