// blocks/select_gather on every CPU path this machine runs: select_top against a stable sort
// (ties, −inf and NaN never taken, +inf first, short and long rows, k ≥ n); gather_logits,
// softmax_gather_values, attend_chosen and panel_scores against float64 loops (odd Dk and Dv,
// strided rows, an additive mask, an empty row, a NaN logit); gather_rows copies exactly.
#include "attention/blocks/select_gather.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <span>
#include <vector>

#include "numattn/core/cpu.h"
#include "numattn/core/rng.h"
#include "support/test_util.h"

namespace numattn {
namespace {
namespace NUMATTN_UNITY_ID {

constexpr float kInf = std::numeric_limits<float>::infinity();
constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();

/// The k largest of s by a stable sort (ties: lower position), −inf and NaN never taken, increasing.
std::vector<std::int32_t> sorted_top(const std::vector<float>& s, index_t k, std::int32_t base) {
  std::vector<std::int32_t> idx;
  for (std::size_t u = 0; u < s.size(); ++u)
    if (s[u] > -kInf) idx.push_back(static_cast<std::int32_t>(u));  // NaN fails the comparison too
  std::stable_sort(idx.begin(), idx.end(), [&](std::int32_t a, std::int32_t b) {
    return s[static_cast<std::size_t>(a)] > s[static_cast<std::size_t>(b)];
  });
  if (static_cast<index_t>(idx.size()) > k) idx.resize(static_cast<std::size_t>(k));
  std::sort(idx.begin(), idx.end());
  for (auto& x : idx) x += base;
  return idx;
}

enum class Row { kGaussian, kFewValues, kHidden, kNaNs, kInfs, kSkewed };

std::vector<float> make_row(Row kind, index_t n, std::uint64_t seed) {
  std::vector<float> s(static_cast<std::size_t>(n));
  fill_normal(std::span<float>(s), seed, 1);
  for (index_t u = 0; u < n; ++u) {
    float& x = s[static_cast<std::size_t>(u)];
    switch (kind) {
      case Row::kGaussian: break;
      case Row::kFewValues: x = std::round(x * 2) / 2; break;  // heavy ties
      case Row::kHidden: if (u % 3 != 0) x = -kInf; break;
      case Row::kNaNs: if (u % 7 == 1) x = kNaN; break;
      case Row::kInfs: if (u % 50 == 3) x = kInf; break;
      case Row::kSkewed: x = std::exp(3 * x); break;  // a long tail, most values near 0
    }
  }
  return s;
}

TEST(SelectGather, SelectTopEqualsAStableSortOnEveryPath) {
  std::uint64_t seed = test::base_seed() + 9100;
  int cases = 0;
  for (CpuPath path : runnable_cpu_paths()) {
    const CpuPathScope scope(path);
    blocks::SelectScratch w;
    for (Row kind : {Row::kGaussian, Row::kFewValues, Row::kHidden, Row::kNaNs, Row::kInfs, Row::kSkewed})
      for (index_t n : {1, 2, 17, 100, 128, 129, 500, 4099})
        for (index_t k : {index_t{1}, index_t{3}, n / 16, n / 4, n / 2, n - 1, n, n + 5}) {
          if (k < 1) continue;
          const std::vector<float> s = make_row(kind, n, ++seed);
          std::vector<std::int32_t> out(static_cast<std::size_t>(std::min(k, n) + 16), -1);
          const index_t c = blocks::select_top(s.data(), n, k, 7, out.data(), w);
          out.resize(static_cast<std::size_t>(c));
          ASSERT_EQ(out, sorted_top(s, k, 7)) << cpu_path_name(path) << " row kind " << static_cast<int>(kind)
                                             << " n " << n << " k " << k;
          ++cases;
        }
  }
  EXPECT_GT(cases, 0);
}

/// Float64 softmax attention of q over the keys idx (+ add[key]), and its LSE.
double reference_row(const std::vector<float>& q, const std::vector<float>& k, index_t ldk, const std::vector<float>& v,
                     index_t ldv, index_t dk, index_t dv, double scale, const std::vector<std::int32_t>& idx,
                     const float* add, std::vector<double>& out) {
  out.assign(static_cast<std::size_t>(dv), 0.0);
  if (idx.empty()) return -INFINITY;
  std::vector<double> l;
  for (std::int32_t j : idx) {
    double x = 0;
    for (index_t d = 0; d < dk; ++d) x += double(q[static_cast<std::size_t>(d)]) * k[static_cast<std::size_t>(j * ldk + d)];
    l.push_back(scale * x + (add ? add[j] : 0.0));
  }
  const double m = *std::max_element(l.begin(), l.end());
  double z = 0;
  for (std::size_t t = 0; t < idx.size(); ++t) {
    const double e = std::exp(l[t] - m);
    z += e;
    for (index_t c = 0; c < dv; ++c) out[static_cast<std::size_t>(c)] += e * v[static_cast<std::size_t>(idx[t] * ldv + c)];
  }
  for (double& x : out) x /= z;
  return m + std::log(z);
}

TEST(SelectGather, GatheredSoftmaxMatchesFloat64OnEveryPath) {
  std::uint64_t seed = test::base_seed() + 9200;
  for (CpuPath path : runnable_cpu_paths()) {
    const CpuPathScope scope(path);
    for (index_t dk : {1, 3, 16, 59, 64, 127, 130})
      for (index_t dv : {1, 5, 64, 70}) {
        const index_t nk = 300, ldk = dk + 3, ldv = dv + 1, rows = 6;
        std::vector<float> k(static_cast<std::size_t>(nk * ldk)), v(static_cast<std::size_t>(nk * ldv)),
            q(static_cast<std::size_t>(rows * dk)), add(static_cast<std::size_t>(nk));
        fill_normal(std::span<float>(k), ++seed, 1);
        fill_normal(std::span<float>(v), seed, 2);
        fill_normal(std::span<float>(q), seed, 3);
        for (index_t j = 0; j < nk; ++j) add[static_cast<std::size_t>(j)] = 0.3f * static_cast<float>(j % 5) - 0.5f;
        const float scale = 0.8f;
        // Row r chooses keys j with (j·(r+2)) % 7 < r (row 0: none), increasing.
        std::vector<std::vector<std::int32_t>> idx(static_cast<std::size_t>(rows));
        for (index_t r = 0; r < rows; ++r)
          for (index_t j = 0; j < nk; ++j)
            if ((j * (r + 2)) % 7 < r) idx[static_cast<std::size_t>(r)].push_back(static_cast<std::int32_t>(j));
        std::vector<float> out(static_cast<std::size_t>(rows * dv)), lse(static_cast<std::size_t>(rows));
        std::vector<blocks::ChosenRow> cr(static_cast<std::size_t>(rows));
        for (index_t r = 0; r < rows; ++r) {
          blocks::ChosenRow& c = cr[static_cast<std::size_t>(r)];
          c.q = q.data() + r * dk;
          c.keys = idx[static_cast<std::size_t>(r)].data();
          c.n = static_cast<index_t>(idx[static_cast<std::size_t>(r)].size());
          c.add = r % 2 ? add.data() : nullptr;
          c.out = out.data() + r * dv;
          c.lse = lse.data() + r;
        }
        blocks::AttendScratch aw;
        blocks::attend_chosen(cr.data(), rows, k.data(), ldk, v.data(), ldv, dk, dv, scale, aw);
        for (index_t r = 0; r < rows; ++r) {
          const auto& ix = idx[static_cast<std::size_t>(r)];
          std::vector<float> qr(q.begin() + r * dk, q.begin() + (r + 1) * dk);
          std::vector<double> ref;
          const double ref_lse = reference_row(qr, k, ldk, v, ldv, dk, dv, scale, ix, r % 2 ? add.data() : nullptr, ref);
          // The single-row entry points, the same keys without the mask.
          std::vector<float> l(ix.size() + 4), o1(static_cast<std::size_t>(dv));
          blocks::gather_logits(qr.data(), dk, k.data(), ldk, ix.data(), static_cast<index_t>(ix.size()), scale, l.data());
          if (r % 2)
            for (std::size_t t = 0; t < ix.size(); ++t) l[t] += add[static_cast<std::size_t>(ix[t])];
          const float lse1 = blocks::softmax_gather_values(l.data(), static_cast<index_t>(ix.size()), v.data(), ldv, dv,
                                                           ix.data(), o1.data());
          const double tol = 1e-5 * (1 + std::sqrt(static_cast<double>(dk)));
          for (index_t c = 0; c < dv; ++c) {
            const double want = ref[static_cast<std::size_t>(c)];
            EXPECT_NEAR(out[static_cast<std::size_t>(r * dv + c)], want, tol * (1 + std::abs(want)))
                << cpu_path_name(path) << " dk " << dk << " dv " << dv << " row " << r;
            EXPECT_NEAR(o1[static_cast<std::size_t>(c)], want, tol * (1 + std::abs(want))) << cpu_path_name(path);
          }
          if (ix.empty()) {
            EXPECT_EQ(lse[static_cast<std::size_t>(r)], -kInf);
            EXPECT_EQ(lse1, -kInf);
          } else {
            EXPECT_NEAR(lse[static_cast<std::size_t>(r)], ref_lse, tol * (1 + std::abs(ref_lse)));
            EXPECT_NEAR(lse1, ref_lse, tol * (1 + std::abs(ref_lse)));
          }
        }
        // A NaN logit makes its row NaN (output and LSE), not an empty row.
        std::vector<float> lnan = {1.f, kNaN, 2.f}, onan(static_cast<std::size_t>(dv));
        const std::vector<std::int32_t> three = {0, 1, 2};
        EXPECT_TRUE(std::isnan(blocks::softmax_gather_values(lnan.data(), 3, v.data(), ldv, dv, three.data(), onan.data())));
        EXPECT_TRUE(std::isnan(onan[0]));
      }
  }
}

TEST(SelectGather, PanelScoresMatchFloat64OnEveryPath) {
  std::uint64_t seed = test::base_seed() + 9300;
  for (CpuPath path : runnable_cpu_paths()) {
    const CpuPathScope scope(path);
    for (index_t dk : {1, 16, 59, 64})
      for (index_t nk : {1, 16, 37, 80})
        for (index_t m : {1, 3, 4, 9}) {
          const index_t ldk = dk + 2, ldq = dk + 1, np = (nk + 15) / 16, lds = 16 * np + 3;
          std::vector<float> k(static_cast<std::size_t>(nk * ldk)), q(static_cast<std::size_t>(m * ldq));
          fill_normal(std::span<float>(k), ++seed, 1);
          fill_normal(std::span<float>(q), seed, 2);
          std::vector<float> kt(static_cast<std::size_t>(16 * dk * np)), s(static_cast<std::size_t>(m * lds));
          blocks::pack_key_panels(k.data(), ldk, nk, dk, kt.data());
          blocks::panel_scores(q.data(), ldq, m, dk, kt.data(), np, -0.5f, s.data(), lds);
          for (index_t r = 0; r < m; ++r)
            for (index_t j = 0; j < 16 * np; ++j) {
              double x = 0;
              if (j < nk)
                for (index_t d = 0; d < dk; ++d) x += double(q[static_cast<std::size_t>(r * ldq + d)]) * k[static_cast<std::size_t>(j * ldk + d)];
              EXPECT_NEAR(s[static_cast<std::size_t>(r * lds + j)], -0.5 * x, 1e-5 * (1 + std::sqrt(static_cast<double>(dk))))
                  << cpu_path_name(path) << " dk " << dk << " nk " << nk << " m " << m << " r " << r << " j " << j;
            }
        }
  }
}

TEST(SelectGather, GatherRowsCopiesTheChosenRowsOnEveryPath) {
  for (CpuPath path : runnable_cpu_paths()) {
    const CpuPathScope scope(path);
    for (index_t d : {1, 7, 16, 64, 70}) {
      const index_t n = 50, ld = d + 5;
      std::vector<float> src(static_cast<std::size_t>(n * ld));
      fill_normal(std::span<float>(src), test::base_seed() + 9400, static_cast<std::uint64_t>(d));
      const std::vector<std::int32_t> idx = {49, 0, 3, 3, 17, 48, 1};
      std::vector<float> dst(idx.size() * static_cast<std::size_t>(d) + 1, -7.f);
      blocks::gather_rows(src.data(), ld, idx.data(), static_cast<index_t>(idx.size()), d, dst.data());
      for (std::size_t t = 0; t < idx.size(); ++t)
        for (index_t c = 0; c < d; ++c)
          ASSERT_EQ(dst[t * static_cast<std::size_t>(d) + static_cast<std::size_t>(c)], src[static_cast<std::size_t>(idx[t] * ld + c)])
              << cpu_path_name(path) << " d " << d;
      EXPECT_EQ(dst.back(), -7.f) << "wrote past the rows";
    }
  }
}

}  // namespace NUMATTN_UNITY_ID
}  // namespace
}  // namespace numattn
