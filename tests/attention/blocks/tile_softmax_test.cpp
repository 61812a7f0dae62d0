// blocks/tile_softmax: (o, lse) against a float64 softmax with the same adjusted logits (a bias,
// hidden keys), strided rows, a fully hidden row (0, −inf) and a NaN logit (NaN row).
#include "numattn/attention/blocks/tile_softmax.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <span>
#include <vector>

#include "numattn/core/rng.h"
#include "support/test_util.h"

namespace numattn {
namespace {
namespace NUMATTN_UNITY_ID {

TEST(TileSoftmax, MatchesFloat64WithAdjustedLogits) {
  const index_t rows = 7, keys = 37, dk = 5, dv = 3, ldq = 9, ldk = 6, ldv = 4, ldo = 5;
  std::vector<float> q(rows * ldq), k(keys * ldk), v(keys * ldv), o(rows * ldo, -1.f);
  fill_normal(std::span<float>(q), test::base_seed(), 1);
  fill_normal(std::span<float>(k), test::base_seed(), 2);
  fill_normal(std::span<float>(v), test::base_seed(), 3);
  const float scale = 0.7f;
  auto bias = [](index_t r, index_t j) -> double {
    if (r == 4) return -std::numeric_limits<double>::infinity();  // a fully hidden row
    if ((r + j) % 5 == 0) return -std::numeric_limits<double>::infinity();
    return 0.1 * static_cast<double>(j % 3);
  };
  const blocks::TileAdjust adjust = [&](index_t r, float* l) {
    for (index_t j = 0; j < keys; ++j) l[j] += static_cast<float>(bias(r, j));
  };
  std::vector<double> lse(rows);
  std::vector<float> scratch;
  blocks::tile_softmax(q.data(), ldq, rows, k.data(), ldk, v.data(), ldv, keys, dk, dv, scale, &adjust, o.data(), ldo,
                       lse.data(), scratch);
  for (index_t r = 0; r < rows; ++r) {
    std::vector<double> l(keys);
    double m = -std::numeric_limits<double>::infinity();
    for (index_t j = 0; j < keys; ++j) {
      double d = 0;
      for (index_t c = 0; c < dk; ++c) d += double(q[r * ldq + c]) * k[j * ldk + c];
      l[j] = scale * d + bias(r, j);
      m = std::max(m, l[j]);
    }
    if (r == 4) {
      EXPECT_EQ(lse[r], -std::numeric_limits<double>::infinity());
      for (index_t c = 0; c < dv; ++c) EXPECT_EQ(o[r * ldo + c], 0.f);
      continue;
    }
    double z = 0;
    std::vector<double> want(dv, 0.0);
    for (index_t j = 0; j < keys; ++j) {
      const double w = std::exp(l[j] - m);
      z += w;
      for (index_t c = 0; c < dv; ++c) want[c] += w * v[j * ldv + c];
    }
    EXPECT_NEAR(lse[r], m + std::log(z), 1e-5);
    for (index_t c = 0; c < dv; ++c) EXPECT_NEAR(o[r * ldo + c], want[c] / z, 1e-5) << r << "," << c;
  }
  // A NaN logit reaches its row (and only its row).
  const blocks::TileAdjust poison = [&](index_t r, float* l) {
    if (r == 2) l[3] = std::numeric_limits<float>::quiet_NaN();
  };
  blocks::tile_softmax(q.data(), ldq, rows, k.data(), ldk, v.data(), ldv, keys, dk, dv, scale, &poison, o.data(), ldo,
                       lse.data(), scratch);
  EXPECT_TRUE(std::isnan(o[2 * ldo]));
  EXPECT_TRUE(std::isnan(lse[2]));
  EXPECT_TRUE(std::isfinite(o[1 * ldo]));
}

}  // namespace NUMATTN_UNITY_ID
}  // namespace
}  // namespace numattn
