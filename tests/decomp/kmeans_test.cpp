// k-means (decomp/kmeans.h): recovers well-separated blobs, assignment = nearest centroid in
// float64, Lloyd's inertia never grows with iterations, k = n puts every row in its own cluster,
// empty clusters are re-seeded deterministically, the spherical variant is scale-invariant,
// results are a pure function of (data, seed, stream), and the balanced top-w helper matches a
// sort.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <set>
#include <vector>

#include "numattn/core/rng.h"
#include "numattn/decomp/kmeans.h"

namespace numattn::decomp {
namespace {
namespace NUMATTN_UNITY_ID {

/// `per` points around each of `centres` far-apart means (unit noise), rows interleaved.
std::vector<float> blobs(index_t centres, index_t per, index_t d, double spread, std::uint64_t seed) {
  std::vector<float> noise(static_cast<std::size_t>(centres * per * d)), mu(static_cast<std::size_t>(centres * d));
  fill_normal(std::span<float>(noise), seed, 0);
  fill_normal(std::span<float>(mu), seed, 1);
  std::vector<float> x(noise.size());
  for (index_t i = 0; i < centres * per; ++i)
    for (index_t t = 0; t < d; ++t)
      x[static_cast<std::size_t>(i * d + t)] =
          static_cast<float>(spread * mu[static_cast<std::size_t>((i % centres) * d + t)]) + noise[static_cast<std::size_t>(i * d + t)];
  return x;
}

double sqdist(const float* a, const float* b, index_t d) {
  double s = 0;
  for (index_t t = 0; t < d; ++t) s += (static_cast<double>(a[t]) - b[t]) * (static_cast<double>(a[t]) - b[t]);
  return s;
}

TEST(KMeans, RecoversSeparatedBlobs) {
  const index_t k = 5, per = 40, d = 8;
  const std::vector<float> x = blobs(k, per, d, 30, 11);
  KMeansOptions o;
  o.k = k;
  o.iters = 20;
  const KMeansResult r = kmeans(x.data(), k * per, d, d, o);
  ASSERT_EQ(r.k, k);
  EXPECT_TRUE(r.converged);
  // Rows i and i' belong together iff i ≡ i' (mod k).
  for (index_t i = 0; i < k * per; ++i)
    EXPECT_EQ(r.assign[static_cast<std::size_t>(i)], r.assign[static_cast<std::size_t>(i % k)]) << i;
  std::set<int> labels(r.assign.begin(), r.assign.end());
  EXPECT_EQ(static_cast<index_t>(labels.size()), k);
  for (index_t s : r.sizes) EXPECT_EQ(s, per);
}

TEST(KMeans, AssignmentIsNearestAndInertiaNeverGrows) {
  const index_t n = 300, d = 6;
  const std::vector<float> x = blobs(7, n / 7 + 1, d, 1.5, 12);
  double prev = INFINITY;
  for (int it : {0, 1, 2, 4, 8}) {
    KMeansOptions o;
    o.k = 9;
    o.iters = it;
    o.seed = 3;
    const KMeansResult r = kmeans(x.data(), n, d, d, o);
    double inertia = 0;
    for (index_t i = 0; i < n; ++i) {
      const float* xi = x.data() + i * d;
      double best = INFINITY;
      for (index_t c = 0; c < r.k; ++c) best = std::min(best, sqdist(xi, r.centroids.data() + c * d, d));
      const double mine = sqdist(xi, r.centroids.data() + r.assign[static_cast<std::size_t>(i)] * d, d);
      EXPECT_LE(mine, best + 1e-4 * (1 + best)) << "row " << i << " iters " << it;
      inertia += mine;
    }
    EXPECT_NEAR(r.inertia, inertia, 1e-4 * inertia);
    EXPECT_LE(r.inertia, prev * (1 + 1e-6)) << "iters " << it;
    prev = r.inertia;
    EXPECT_EQ(std::accumulate(r.sizes.begin(), r.sizes.end(), index_t{0}), n);
  }
}

TEST(KMeans, EveryRowItsOwnClusterWhenKEqualsN) {
  const index_t n = 23, d = 5;
  std::vector<float> x(static_cast<std::size_t>(n * d));
  fill_normal(std::span<float>(x), 5, 0);
  for (bool pp : {true, false}) {
    KMeansOptions o;
    o.k = n + 10;  // clamped to n
    o.plusplus = pp;
    const KMeansResult r = kmeans(x.data(), n, d, d, o);
    ASSERT_EQ(r.k, n);
    EXPECT_LT(r.inertia, 1e-5 * n);  // ‖x‖² − 2x·c + ‖c‖² in float32: zero up to rounding
    for (index_t i = 0; i < n; ++i) {
      const int c = r.assign[static_cast<std::size_t>(i)];
      for (index_t t = 0; t < d; ++t) EXPECT_EQ(r.centroids[static_cast<std::size_t>(c * d + t)], x[static_cast<std::size_t>(i * d + t)]);
    }
  }
}

TEST(KMeans, DuplicatesAndEmptyClustersAreDeterministic) {
  // Ten rows with two distinct values and k = 4: two clusters must stay empty or hold copies.
  const index_t n = 10, d = 3;
  std::vector<float> x(static_cast<std::size_t>(n * d));
  for (index_t i = 0; i < n; ++i)
    for (index_t t = 0; t < d; ++t) x[static_cast<std::size_t>(i * d + t)] = i % 2 ? 1.f : -2.f;
  KMeansOptions o;
  o.k = 4;
  o.iters = 5;
  const KMeansResult a = kmeans(x.data(), n, d, d, o), b = kmeans(x.data(), n, d, d, o);
  EXPECT_EQ(a.assign, b.assign);
  EXPECT_EQ(a.centroids, b.centroids);
  EXPECT_EQ(a.inertia, 0.0);
  EXPECT_EQ(std::accumulate(a.sizes.begin(), a.sizes.end(), index_t{0}), n);
  for (float c : a.centroids) EXPECT_TRUE(c == 1.f || c == -2.f);
}

TEST(KMeans, DeterministicPerSeedAndStream) {
  const index_t n = 200, d = 4;
  const std::vector<float> x = blobs(20, 10, d, 1, 13);
  KMeansOptions o;
  o.k = 12;
  o.iters = 3;
  o.seed = 9;
  const KMeansResult a = kmeans(x.data(), n, d, d, o), b = kmeans(x.data(), n, d, d, o);
  EXPECT_EQ(a.centroids, b.centroids);
  o.stream = 1;
  const KMeansResult c = kmeans(x.data(), n, d, d, o);
  EXPECT_NE(a.centroids, c.centroids);
}

TEST(KMeans, SphericalIsScaleInvariantWithUnitCentroids) {
  const index_t n = 120, d = 6;
  std::vector<float> x = blobs(4, 30, d, 3, 14), y = x;
  for (index_t i = 0; i < n; ++i)
    for (index_t t = 0; t < d; ++t) y[static_cast<std::size_t>(i * d + t)] *= static_cast<float>(1 + i % 5);
  KMeansOptions o;
  o.k = 4;
  o.iters = 10;
  o.spherical = true;
  const KMeansResult a = kmeans(x.data(), n, d, d, o), b = kmeans(y.data(), n, d, d, o);
  EXPECT_EQ(a.assign, b.assign);
  for (index_t c = 0; c < a.k; ++c) {
    double n2 = 0;
    for (index_t t = 0; t < d; ++t) n2 += a.centroids[static_cast<std::size_t>(c * d + t)] * a.centroids[static_cast<std::size_t>(c * d + t)];
    EXPECT_NEAR(n2, 1.0, 1e-5);
  }
  EXPECT_GE(a.inertia, 0.0);
}

TEST(KMeans, TopWMembersMatchASort) {
  const index_t n = 57, k = 5, w = 9;
  std::vector<float> s(static_cast<std::size_t>(n * k));
  fill_normal(std::span<float>(s), 15, 0);
  s[3 * k + 1] = s[7 * k + 1] = 9.f;  // a tie: both are taken (lower index first)
  const auto m = top_w_members(s.data(), n, k, w);
  for (index_t c = 0; c < k; ++c) {
    std::vector<index_t> idx(static_cast<std::size_t>(n));
    std::iota(idx.begin(), idx.end(), 0);
    std::stable_sort(idx.begin(), idx.end(), [&](index_t a, index_t b) { return s[a * k + c] > s[b * k + c]; });
    idx.resize(static_cast<std::size_t>(w));
    std::sort(idx.begin(), idx.end());
    EXPECT_EQ(m[static_cast<std::size_t>(c)], idx) << "column " << c;
  }
  EXPECT_TRUE(top_w_members(s.data(), n, k, 0)[0].empty());
  EXPECT_EQ(static_cast<index_t>(top_w_members(s.data(), n, k, n + 3)[2].size()), n);
}

}  // namespace NUMATTN_UNITY_ID
}  // namespace
}  // namespace numattn::decomp
