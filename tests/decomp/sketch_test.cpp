// decomp/sketch: CountSketch, TensorSketch and the degree-2 Gaussian sketch: the FFT circular
// convolution equals the direct CountSketch of x^{⊗p}, unbiasedness over seeds, and the variance
// bounds (CountSketch ≤ 2‖x‖²‖y‖²/r, TensorSketch ≤ (3^p − 1)‖q‖^{2p}‖k‖^{2p}/r).
#include "numattn/decomp/sketch.h"

#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "numattn/core/rng.h"
#include "support/test_util.h"

namespace numattn::decomp {
namespace {
namespace NUMATTN_UNITY_ID {

std::vector<double> vec(index_t d, std::uint64_t stream, double scale = 1) {
  std::vector<double> x(static_cast<std::size_t>(d));
  fill_normal(std::span<double>(x), test::base_seed(), stream);
  for (double& v : x) v *= scale;
  return x;
}

double dot(const std::vector<double>& a, const std::vector<double>& b) {
  double s = 0;
  for (std::size_t i = 0; i < a.size(); ++i) s += a[i] * b[i];
  return s;
}

struct Moments {
  double mean = 0, var = 0;
};

template <class F>
Moments moments(int draws, F f) {
  double s = 0, s2 = 0;
  for (int i = 0; i < draws; ++i) {
    const double e = f(i);
    s += e;
    s2 += e * e;
  }
  Moments m;
  m.mean = s / draws;
  m.var = s2 / draws - m.mean * m.mean;
  return m;
}

TEST(Sketch, CountSketchIsUnbiasedWithinItsVarianceBound) {
  const index_t d = 12, r = 8;
  const auto x = vec(d, 1), y = vec(d, 2);
  const int draws = 4000;
  const Moments m = moments(draws, [&](int s) {
    CountSketch c(d, r, test::base_seed() + static_cast<std::uint64_t>(s), 0);
    std::vector<double> a(r), b(r);
    c.apply(x.data(), a.data());
    c.apply(y.data(), b.data());
    return dot(a, b);
  });
  const double bound = 2 * dot(x, x) * dot(y, y) / r;
  EXPECT_NEAR(m.mean, dot(x, y), 4 * std::sqrt(bound / draws));
  EXPECT_LE(m.var, 1.15 * bound);
  CountSketch c(d, r, 1, 2);
  for (index_t j = 0; j < d; ++j) {
    EXPECT_GE(c.hash(j), 0);
    EXPECT_LT(c.hash(j), r);
    EXPECT_EQ(std::abs(c.sign(j)), 1.0);
  }
}

TEST(Sketch, TensorSketchIsTheCountSketchOfTheTensorPower) {
  // IFFT(Π FFT(C_t x)) = Σ over index tuples of Π s_t(j_t) x_{j_t}, placed at Σ h_t(j_t) mod r.
  const index_t d = 5, r = 16;
  const auto x = vec(d, 3);
  for (int p : {1, 2, 3}) {
    TensorSketch ts(d, r, p, 7, 1);
    std::vector<double> got(r), want(r, 0.0);
    ts.apply(x.data(), got.data());
    index_t total = 1;
    for (int t = 0; t < p; ++t) total *= d;
    for (index_t idx = 0; idx < total; ++idx) {
      index_t rest = idx, bucket = 0;
      double v = 1;
      for (int t = 0; t < p; ++t) {
        const index_t j = rest % d;
        rest /= d;
        bucket += ts.count_sketch(t).hash(j);
        v *= ts.count_sketch(t).sign(j) * x[static_cast<std::size_t>(j)];
      }
      want[static_cast<std::size_t>(bucket % r)] += v;
    }
    for (index_t b = 0; b < r; ++b) EXPECT_NEAR(got[static_cast<std::size_t>(b)], want[static_cast<std::size_t>(b)], 1e-12) << p;
  }
}

TEST(Sketch, TensorSketchIsUnbiasedWithinItsVarianceBound) {
  const index_t d = 10, r = 32;
  const auto x = vec(d, 4, 0.5), y = vec(d, 5, 0.5);
  const int draws = 3000;
  for (int p : {2, 3}) {
    const Moments m = moments(draws, [&](int s) {
      TensorSketch ts(d, r, p, test::base_seed() + static_cast<std::uint64_t>(s), 0);
      std::vector<double> a(r), b(r);
      ts.apply(x.data(), a.data());
      ts.apply(y.data(), b.data());
      return dot(a, b);
    });
    const double bound = (std::pow(3.0, p) - 1) * std::pow(dot(x, x) * dot(y, y), p) / r;
    EXPECT_NEAR(m.mean, std::pow(dot(x, y), p), 4 * std::sqrt(bound / draws)) << p;
    EXPECT_LE(m.var, 1.15 * bound) << p;
  }
}

TEST(Sketch, GaussianDegree2SketchIsUnbiased) {
  const index_t d = 8, r = 16;
  const auto x = vec(d, 6, 0.5), y = vec(d, 7, 0.5);
  const int draws = 3000;
  const Moments m = moments(draws, [&](int s) {
    GaussianSketch2 g(d, r, test::base_seed() + static_cast<std::uint64_t>(s), 0);
    std::vector<double> a(r), b(r);
    g.apply(x.data(), a.data());
    g.apply(y.data(), b.data());
    return dot(a, b);
  });
  EXPECT_NEAR(m.mean, dot(x, y) * dot(x, y), 4 * std::sqrt(m.var / draws));
  // The float32 rows path equals the float64 one.
  GaussianSketch2 g(d, r, 3, 1);
  std::vector<float> xf(x.begin(), x.end()), out(r), scratch;
  g.apply_rows(xf.data(), d, 1, 2.f, out.data(), r, scratch);
  std::vector<double> x2(x), ref(r);
  for (double& v : x2) v *= 2;
  g.apply(x2.data(), ref.data());
  for (index_t b = 0; b < r; ++b) EXPECT_NEAR(out[static_cast<std::size_t>(b)], ref[static_cast<std::size_t>(b)], 1e-4 * (1 + std::abs(ref[static_cast<std::size_t>(b)])));
}

}  // namespace NUMATTN_UNITY_ID
}  // namespace
}  // namespace numattn::decomp
