// decomp/random_features: orthogonality inside blocks, the row norms of both scalings, the
// marginal N(0, I) moments of χ-scaled rows, and independence of the draws from anything but
// (seed, stream).
#include "numattn/decomp/random_features.h"

#include <gtest/gtest.h>

#include <cmath>

#include "support/test_util.h"

namespace numattn::decomp {
namespace {
namespace NUMATTN_UNITY_ID {

double dot(const std::vector<double>& w, index_t d, index_t a, index_t b) {
  double s = 0;
  for (index_t k = 0; k < d; ++k) s += w[static_cast<std::size_t>(a * d + k)] * w[static_cast<std::size_t>(b * d + k)];
  return s;
}

TEST(RandomFeatures, OrthogonalBlocksAndNorms) {
  const index_t d = 16, m = 40;  // two full blocks and a partial one of 8 rows
  const auto w = orthogonal_features(m, d, test::base_seed(), 3, FeatureNorm::kSqrtD);
  ASSERT_EQ(w.size(), static_cast<std::size_t>(m * d));
  for (index_t a = 0; a < m; ++a) {
    EXPECT_NEAR(dot(w, d, a, a), static_cast<double>(d), 1e-10);
    for (index_t b = a + 1; b < m; ++b)
      if (a / d == b / d) EXPECT_NEAR(dot(w, d, a, b), 0.0, 1e-10) << a << " " << b;
  }
  const auto chi = orthogonal_features(m, d, test::base_seed(), 3, FeatureNorm::kChi);
  for (index_t a = 0; a < m; ++a)
    for (index_t b = a + 1; b < m; ++b)
      if (a / d == b / d) EXPECT_NEAR(dot(chi, d, a, b), 0.0, 1e-9);
  EXPECT_EQ(chi, orthogonal_features(m, d, test::base_seed(), 3, FeatureNorm::kChi));
  EXPECT_NE(chi, orthogonal_features(m, d, test::base_seed(), 4, FeatureNorm::kChi));
}

TEST(RandomFeatures, ChiScaledRowsAreMarginallyStandardNormal) {
  // E[w_k²] = 1 and E[‖w‖²] = d for N(0, I_d) rows: the mean over many draws.
  const index_t d = 8, m = 8;
  double sum_sq = 0, sum_first = 0;
  const int draws = 400;
  for (int s = 0; s < draws; ++s) {
    const auto w = orthogonal_features(m, d, test::base_seed() + static_cast<std::uint64_t>(s), 0);
    for (index_t a = 0; a < m; ++a) {
      sum_sq += dot(w, d, a, a);
      sum_first += w[static_cast<std::size_t>(a * d)];
    }
  }
  const double n = static_cast<double>(draws) * m;
  EXPECT_NEAR(sum_sq / n, static_cast<double>(d), 0.15 * d / 4);  // sd of χ²_8 is 4: 4/√3200 ≪ 0.3
  EXPECT_NEAR(sum_first / n, 0.0, 0.06);
  const auto g = gaussian_features(1000, 4, test::base_seed(), 9);
  double mean = 0, var = 0;
  for (double x : g) mean += x;
  mean /= static_cast<double>(g.size());
  for (double x : g) var += (x - mean) * (x - mean);
  var /= static_cast<double>(g.size());
  EXPECT_NEAR(mean, 0.0, 0.05);
  EXPECT_NEAR(var, 1.0, 0.07);
}

}  // namespace NUMATTN_UNITY_ID
}  // namespace
}  // namespace numattn::decomp
