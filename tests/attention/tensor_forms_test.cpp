// The tensor attention forms that are functions (tensor_forms.h): HOT mode-wise and axial
// attention against their dense N1N2 × N1N2 forms, TPA with MHA / MQA / GQA as special cases,
// multi-linear attention against the materialised N×N×N oracle.
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <vector>

#include "numattn/attention/problem.h"
#include "numattn/attention/reference.h"
#include "numattn/attention/tensor_forms.h"
#include "numattn/core/rng.h"
#include "support/test_util.h"

namespace numattn {
namespace {
namespace NUMATTN_UNITY_ID {

std::vector<float> randf(std::size_t n, std::uint64_t stream, float scale = 1.0f) {
  std::vector<float> x(n);
  fill_normal(x, test::base_seed() + 1500, stream);
  for (float& v : x) v *= scale;
  return x;
}

/// max |a − b| / max(1, max|b|): float32 results against float64 oracles.
template <class A>
double scaled_diff(const A& a, const std::vector<double>& b) {
  double worst = 0, big = 1;
  for (double x : b) big = std::max(big, std::abs(x));
  for (std::size_t i = 0; i < b.size(); ++i) worst = std::max(worst, std::abs(static_cast<double>(a[i]) - b[i]));
  return worst / big;
}

TEST(TensorForms, HotModewiseEqualsTheDenseKroneckerForm) {
  for (auto [n1, n2, d, dv] : {std::array<index_t, 4>{5, 7, 3, 4}, {1, 6, 2, 2}, {9, 4, 8, 5}}) {
    const auto sz = static_cast<std::size_t>(n1 * n2);
    const auto q = randf(sz * d, 1, 2.0f), k = randf(sz * d, 2, 2.0f), v = randf(sz * dv, 3);
    std::vector<float> fast(sz * dv), dense(sz * dv);
    hot_modewise_attention(q.data(), k.data(), v.data(), n1, n2, d, dv, fast.data());
    hot_dense_attention(q.data(), k.data(), v.data(), n1, n2, d, dv, dense.data());
    const std::vector<double> ref = hot_reference(q.data(), k.data(), v.data(), n1, n2, d, dv);
    // Logits up to ~|q||k|·s: the exact float32 tolerance at that magnitude.
    const double tol = exact_f32_tolerance(20).max_scaled_error;
    EXPECT_LE(scaled_diff(fast, ref), tol) << n1 << "x" << n2;
    EXPECT_LE(scaled_diff(dense, ref), tol) << n1 << "x" << n2;
  }
  EXPECT_THROW(hot_modewise_attention(nullptr, nullptr, nullptr, 0, 2, 2, 2, nullptr), Error);
}

TEST(TensorForms, AxialAttentionEqualsItsDenseForm) {
  for (bool causal : {false, true})
    for (auto [n1, n2, d, dv] : {std::array<index_t, 4>{6, 5, 4, 3}, {3, 9, 16, 16}}) {
      const auto sz = static_cast<std::size_t>(n1 * n2);
      const auto q = randf(sz * d, 4), k = randf(sz * d, 5), v = randf(sz * dv, 6);
      std::vector<float> out(sz * dv);
      axial_attention(q.data(), k.data(), v.data(), n1, n2, d, dv, causal, out.data(), ExecContext{2});
      const std::vector<double> ref = axial_reference(q.data(), k.data(), v.data(), n1, n2, d, dv, causal);
      EXPECT_LE(scaled_diff(out, ref), exact_f32_tolerance(20).max_scaled_error) << "causal " << causal;
    }
}

/// Factors of a non-contextual TPA whose K (or V) slices are those of a GQA layer with `groups`
/// kv heads: R = groups, a_{n,g,h} = G·[h in group g], b_{n,g} = kv head g's row n.
void gqa_factors(const std::vector<float>& kv, index_t n, index_t heads, index_t groups, index_t dh,
                 std::vector<float>& a, std::vector<float>& b) {
  a.assign(static_cast<std::size_t>(n * groups * heads), 0.0f);
  b.assign(static_cast<std::size_t>(n * groups * dh), 0.0f);
  const index_t per = heads / groups;
  for (index_t t = 0; t < n; ++t)
    for (index_t g = 0; g < groups; ++g) {
      for (index_t h = g * per; h < (g + 1) * per; ++h) a[static_cast<std::size_t>((t * groups + g) * heads + h)] = static_cast<float>(groups);
      for (index_t c = 0; c < dh; ++c) b[static_cast<std::size_t>((t * groups + g) * dh + c)] = kv[static_cast<std::size_t>((g * n + t) * dh + c)];
    }
}

TEST(TensorForms, TpaHasMhaMqaAndGqaAsSpecialCases) {
  const index_t n = 23, heads = 6, dh = 8;
  for (index_t groups : {index_t{6}, index_t{1}, index_t{3}})  // MHA, MQA, GQA
    for (bool causal : {false, true}) {
      const auto q = randf(static_cast<std::size_t>(heads * n * dh), 7);
      const auto k = randf(static_cast<std::size_t>(groups * n * dh), 8);
      const auto v = randf(static_cast<std::size_t>(groups * n * dh), 9);
      std::vector<float> qa, qb, ka, kb, va, vb;
      gqa_factors(q, n, heads, heads, dh, qa, qb);
      gqa_factors(k, n, heads, groups, dh, ka, kb);
      gqa_factors(v, n, heads, groups, dh, va, vb);
      const TpaFactors fq{qa.data(), qb.data(), heads}, fk{ka.data(), kb.data(), groups}, fv{va.data(), vb.data(), groups};
      std::vector<float> out(static_cast<std::size_t>(heads * n * dh));
      tpa_attention(fq, fk, fv, n, heads, dh, causal, out.data(), ExecContext{2});
      // The GQA layer itself, through the project's float64 reference.
      AttentionProblem p;
      std::vector<float> dummy(out.size());
      p.q = TensorView<const float>::contiguous(q.data(), {1, heads, n, dh});
      p.k = TensorView<const float>::contiguous(k.data(), {1, groups, n, dh});
      p.v = TensorView<const float>::contiguous(v.data(), {1, groups, n, dh});
      p.out = TensorView<float>::contiguous(dummy.data(), {1, heads, n, dh});
      p.causal = causal ? Causal::kTopLeft : Causal::kNone;
      const ReferenceRows ref = reference_all(p, ExecContext{1});
      const double tol = exact_f32_tolerance(ref.logit_magnitude).max_scaled_error;
      EXPECT_LE(scaled_diff(out, ref.out), tol) << "groups " << groups;
      EXPECT_LE(scaled_diff(out, tpa_reference(fq, fk, fv, n, heads, dh, causal)), tol) << "groups " << groups;
    }
  // Cache accounting: R_K = R_V = 2 at H = 32, Dh = 128 keeps (2+2)(32+128) of 2·32·128 floats.
  EXPECT_EQ(tpa_cache_bytes(10, 32, 128, 2, 2), 4u * 10 * 4 * 160);
  EXPECT_EQ(mha_cache_bytes(10, 32, 128), 4u * 10 * 2 * 32 * 128);
}

TEST(TensorForms, TpaContextualFactorsMatchTheOracle) {
  const index_t n = 17, heads = 4, dh = 6, rq = 3, rk = 2, rv = 2;
  const auto qa = randf(static_cast<std::size_t>(n * rq * heads), 10), qb = randf(static_cast<std::size_t>(n * rq * dh), 11);
  const auto ka = randf(static_cast<std::size_t>(n * rk * heads), 12), kb = randf(static_cast<std::size_t>(n * rk * dh), 13);
  const auto va = randf(static_cast<std::size_t>(n * rv * heads), 14), vb = randf(static_cast<std::size_t>(n * rv * dh), 15);
  const TpaFactors fq{qa.data(), qb.data(), rq}, fk{ka.data(), kb.data(), rk}, fv{va.data(), vb.data(), rv};
  std::vector<float> out(static_cast<std::size_t>(heads * n * dh));
  tpa_attention(fq, fk, fv, n, heads, dh, true, out.data(), ExecContext{1});
  EXPECT_LE(scaled_diff(out, tpa_reference(fq, fk, fv, n, heads, dh, true)), exact_f32_tolerance(20).max_scaled_error);
  EXPECT_THROW(tpa_attention({qa.data(), qb.data(), 0}, fk, fv, n, heads, dh, true, out.data(), ExecContext{1}), Error);
}

TEST(TensorForms, MultilinearContractionEqualsTheMaterialisedTensor) {
  for (auto [n, r, dout] : {std::array<index_t, 3>{7, 3, 4}, {1, 1, 1}, {12, 5, 9}}) {
    auto randd = [&](std::size_t sz, std::uint64_t stream) {
      std::vector<double> x(sz);
      fill_normal(x, test::base_seed() + 1550, stream);
      return x;
    };
    const auto q = randd(static_cast<std::size_t>(n * r), 1), k = randd(static_cast<std::size_t>(n * r), 2),
               v = randd(static_cast<std::size_t>(n * r), 3), g = randd(static_cast<std::size_t>(r), 4),
               w = randd(static_cast<std::size_t>(n * n * dout), 5);
    const auto fast = multilinear_attention(q.data(), k.data(), v.data(), g.data(), w.data(), n, r, dout);
    const auto ref = multilinear_reference(q.data(), k.data(), v.data(), g.data(), w.data(), n, r, dout);
    double num = 0, den = 0;
    for (std::size_t i = 0; i < ref.size(); ++i) {
      num += (fast[i] - ref[i]) * (fast[i] - ref[i]);
      den += ref[i] * ref[i];
    }
    EXPECT_LE(std::sqrt(num / den), 1e-13) << "N = " << n;
  }
}

}  // namespace NUMATTN_UNITY_ID
}  // namespace
}  // namespace numattn
