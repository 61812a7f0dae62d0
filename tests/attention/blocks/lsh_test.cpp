// blocks/lsh and blocks/lse_merge: hash codes against their definitions (float64, written apart),
// the Gray-order adjacency, SimHash's collision probability 1 − θ/π over seeds, the sorts'
// stability, and the log-sum-exp merge's disjoint-support identity and edge rows.
#include "numattn/attention/blocks/lsh.h"

#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <limits>
#include <numeric>
#include <span>
#include <vector>

#include "numattn/attention/blocks/lse_merge.h"
#include "numattn/core/rng.h"
#include "support/test_util.h"

namespace numattn {
namespace {
namespace NUMATTN_UNITY_ID {

using namespace blocks;

std::vector<float> normal(index_t n, std::uint64_t stream) {
  std::vector<float> x(static_cast<std::size_t>(n));
  fill_normal(std::span<float>(x), test::base_seed(), stream);
  return x;
}

TEST(Lsh, ProjectionsAreDeterministicPerStream) {
  EXPECT_EQ(lsh_projections(8, 5, 7, 3), lsh_projections(8, 5, 7, 3));
  EXPECT_NE(lsh_projections(8, 5, 7, 3), lsh_projections(8, 5, 7, 4));
}

TEST(Lsh, AngularAndSimHashMatchTheirDefinitions) {
  const index_t rows = 37, d = 12, k = 6, ld = 15;
  std::vector<float> x = normal(rows * ld, 1);
  const std::vector<float> r = lsh_projections(d, k, 11, 0);
  std::vector<float> proj(static_cast<std::size_t>(rows * k));
  lsh_project(x.data(), rows, ld, d, r.data(), k, proj.data());
  std::vector<std::int32_t> ang(rows);
  std::vector<std::uint32_t> sim(rows);
  angular_codes(proj.data(), rows, k, ang.data());
  simhash_codes(proj.data(), rows, k, sim.data());
  for (index_t i = 0; i < rows; ++i) {
    std::vector<double> h(2 * k);
    for (index_t c = 0; c < k; ++c) {
      double s = 0;
      for (index_t t = 0; t < d; ++t) s += double(x[i * ld + t]) * r[t * k + c];
      EXPECT_NEAR(proj[i * k + c], s, 1e-5 * (1 + std::abs(s)));
      h[c] = s;
      h[k + c] = -s;
    }
    const auto want = std::max_element(h.begin(), h.end()) - h.begin();
    EXPECT_EQ(ang[i], want) << "row " << i;
    std::uint32_t code = 0;
    for (index_t c = 0; c < k; ++c) code |= (h[c] > 0 ? 1u : 0u) << c;
    EXPECT_EQ(sim[i], code) << "row " << i;
  }
  // Positive scaling leaves the angular code unchanged; negation maps c ↔ c ± k.
  for (index_t i = 0; i < rows * k; ++i) proj[i] *= -3.0f;
  std::vector<std::int32_t> neg(rows);
  angular_codes(proj.data(), rows, k, neg.data());
  for (index_t i = 0; i < rows; ++i) EXPECT_EQ(neg[i], (ang[i] + k) % (2 * k));
}

TEST(Lsh, NonFiniteInputsGiveValidCodes) {
  const float nan = std::numeric_limits<float>::quiet_NaN(), inf = std::numeric_limits<float>::infinity();
  const std::vector<float> proj = {nan, nan, nan, inf, -inf, 1.0f};
  std::vector<std::int32_t> a(2);
  angular_codes(proj.data(), 2, 3, a.data());
  EXPECT_EQ(a[0], 0);
  EXPECT_TRUE(a[1] >= 0 && a[1] < 6);
  std::vector<std::int64_t> e(6);
  e2lsh_codes(proj.data(), 6, 0.5, 2.5, e.data());
  EXPECT_EQ(e[0], 0);
  EXPECT_EQ(e[3], 0);
  EXPECT_EQ(e[5], 0);  // ⌊(1 + 0.5)/2.5⌋
}

TEST(Lsh, E2lshIsTheFloorOfTheShiftedProjection) {
  const std::vector<float> p = {-3.1f, -0.2f, 0.0f, 2.4f, 2.6f, 1e30f};
  std::vector<std::int64_t> c(p.size());
  e2lsh_codes(p.data(), index_t(p.size()), 0.1, 2.5, c.data());
  EXPECT_EQ(c[0], -2);
  EXPECT_EQ(c[1], -1);
  EXPECT_EQ(c[2], 0);
  EXPECT_EQ(c[3], 1);
  EXPECT_EQ(c[4], 1);
  EXPECT_EQ(c[5], std::int64_t{1} << 62);
}

TEST(Lsh, GrayRankInvertsGrayCodeAndNeighboursDifferInOneBit) {
  // The recursive definition perm(1) = [0,1], perm(n) = [perm(n−1), reverse(perm(n−1)) + 2^{n−1}].
  std::vector<std::uint32_t> perm = {0, 1};
  for (int n = 2; n <= 8; ++n) {
    const std::size_t half = perm.size();
    for (std::size_t i = 0; i < half; ++i) perm.push_back(perm[half - 1 - i] + (1u << (n - 1)));
  }
  ASSERT_EQ(perm.size(), 256u);
  for (std::uint32_t i = 0; i < 256; ++i) {
    EXPECT_EQ(gray_code(i), perm[i]);
    EXPECT_EQ(gray_rank(perm[i]), i);
    if (i > 0) EXPECT_EQ(std::popcount(perm[i] ^ perm[i - 1]), 1);
  }
  EXPECT_EQ(gray_rank(gray_code(0xDEADBEEFu)), 0xDEADBEEFu);
}

TEST(Lsh, SimHashBitAgreementIsOneMinusAngleOverPi) {
  // Two fixed unit vectors at angle θ; over 4000 independent directions the fraction of agreeing
  // bits estimates 1 − θ/π with standard error ≤ 0.008: assert within 4 standard errors.
  const index_t d = 16, k = 4000;
  std::vector<float> xy(2 * d, 0.0f);
  const double theta = 1.1;
  xy[0] = 1.0f;
  xy[d + 0] = float(std::cos(theta));
  xy[d + 1] = float(std::sin(theta));
  const std::vector<float> r = lsh_projections(d, k, test::base_seed(), 9);
  std::vector<float> proj(2 * k);
  lsh_project(xy.data(), 2, d, d, r.data(), k, proj.data());
  index_t agree = 0;
  for (index_t b = 0; b < k; ++b) agree += (proj[b] > 0) == (proj[k + b] > 0);
  EXPECT_NEAR(double(agree) / k, 1 - theta / M_PI, 4 * 0.008);
}

TEST(Lsh, SortsAreStable) {
  const std::vector<std::uint32_t> keys = {3, 1, 3, 0, 1, 3, 0};
  std::vector<index_t> perm(keys.size()), inv(keys.size());
  stable_sort_by_key(keys.data(), index_t(keys.size()), 4, perm.data());
  EXPECT_EQ(perm, (std::vector<index_t>{3, 6, 1, 4, 0, 2, 5}));
  invert_permutation(perm.data(), index_t(perm.size()), inv.data());
  for (std::size_t s = 0; s < perm.size(); ++s) EXPECT_EQ(inv[perm[s]], index_t(s));
  EXPECT_THROW(stable_sort_by_key(keys.data(), index_t(keys.size()), 3, perm.data()), Error);

  const float nan = std::numeric_limits<float>::quiet_NaN();
  const std::vector<float> v = {0.5f, nan, -1.0f, 0.5f, nan, -2.0f};
  std::vector<index_t> p(v.size());
  stable_argsort(v.data(), index_t(v.size()), p.data());
  EXPECT_EQ(p, (std::vector<index_t>{5, 2, 0, 3, 1, 4}));
}

/// Softmax of scores s over a key subset, float64: (out, lse).
std::pair<std::vector<double>, double> partial(const std::vector<double>& s, const std::vector<double>& v,
                                               index_t dv, const std::vector<index_t>& keys) {
  double m = -std::numeric_limits<double>::infinity();
  for (index_t j : keys) m = std::max(m, s[j]);
  std::vector<double> o(dv, 0.0);
  double z = 0;
  for (index_t j : keys) {
    const double w = std::exp(s[j] - m);
    z += w;
    for (index_t c = 0; c < dv; ++c) o[c] += w * v[j * dv + c];
  }
  for (double& x : o) x /= z;
  return {o, m + std::log(z)};
}

TEST(LseMerge, DisjointSupportsMergeToTheFullSoftmax) {
  const index_t n = 40, dv = 5;
  std::vector<double> s(n), v(n * dv);
  const CounterRng rng(test::base_seed(), 21);
  for (index_t j = 0; j < n; ++j) s[j] = 30 * rng.normal(j);  // spiky: wide logit range
  for (index_t i = 0; i < n * dv; ++i) v[i] = rng.normal(1000 + i);
  std::vector<index_t> all(n), a, b, c;
  std::iota(all.begin(), all.end(), 0);
  for (index_t j = 0; j < n; ++j) (j % 3 == 0 ? a : j % 3 == 1 ? b : c).push_back(j);
  const auto [want, want_lse] = partial(s, v, dv, all);
  std::vector<std::vector<float>> outs;
  std::vector<double> lses;
  for (const auto* set : {&a, &b, &c}) {
    const auto [o, l] = partial(s, v, dv, *set);
    outs.emplace_back(o.begin(), o.end());
    lses.push_back(l);
  }
  const float* ptrs[3] = {outs[0].data(), outs[1].data(), outs[2].data()};
  std::vector<float> out(dv);
  const double lse = lse_merge(ptrs, lses.data(), 3, dv, out.data());
  EXPECT_NEAR(lse, want_lse, 1e-12 * std::abs(want_lse));
  for (index_t c2 = 0; c2 < dv; ++c2) EXPECT_NEAR(out[c2], want[c2], 1e-6);
  // Two-way merges in sequence give the same row.
  std::vector<float> acc(dv, 123.0f);
  double acc_lse = -std::numeric_limits<double>::infinity();
  for (int r = 0; r < 3; ++r) lse_merge_into(acc.data(), acc_lse, ptrs[r], lses[r], dv);
  EXPECT_NEAR(acc_lse, want_lse, 1e-12 * std::abs(want_lse));
  for (index_t c2 = 0; c2 < dv; ++c2) EXPECT_NEAR(acc[c2], want[c2], 1e-6);
}

TEST(LseMerge, EmptyAndNonFinitePartials) {
  const double ninf = -std::numeric_limits<double>::infinity();
  const float nanf = std::numeric_limits<float>::quiet_NaN();
  std::vector<float> garbage = {nanf, nanf}, one = {1.0f, 2.0f}, out(2);
  const float* ptrs[2] = {garbage.data(), one.data()};
  double lses[2] = {ninf, 0.5};
  EXPECT_DOUBLE_EQ(lse_merge(ptrs, lses, 2, 2, out.data()), 0.5);  // empty partial never read
  EXPECT_EQ(out, one);
  lses[1] = ninf;
  EXPECT_EQ(lse_merge(ptrs, lses, 2, 2, out.data()), ninf);  // all empty: zero row
  EXPECT_EQ(out, (std::vector<float>{0.0f, 0.0f}));
  lses[0] = std::numeric_limits<double>::quiet_NaN();
  lses[1] = 0.0;
  EXPECT_TRUE(std::isnan(lse_merge(ptrs, lses, 2, 2, out.data())));
  EXPECT_TRUE(std::isnan(out[0]));
  // A NaN inside a contributing row reaches the output.
  std::vector<float> bad = {nanf, 1.0f};
  const float* p2[2] = {bad.data(), one.data()};
  double l2[2] = {0.0, 0.0};
  lse_merge(p2, l2, 2, 2, out.data());
  EXPECT_TRUE(std::isnan(out[0]));
  EXPECT_FLOAT_EQ(out[1], 1.5f);
}

}  // namespace NUMATTN_UNITY_ID
}  // namespace
}  // namespace numattn
