// sparse.topk against a float64 transcription (top-k visible keys per row by the exact float64
// logits, softmax over them), recall of each row's true top-k (1 up to float32 ties), the limit
// k ≥ N (exact attention), error falling as k grows, causal rows never reading future keys,
// and KV-cache decoding in the tiny Llama (prefill = decode). select=block against its own
// float64 transcription (block geometry, sampled rows, estimated mass, chosen keys, output) on
// the dense causal path and the per-row path (windows, masks), exact at k ≥ Nk, future keys
// never read, and the hostile inputs of the conformance harness.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <string>
#include <vector>

#include "attention/sparse/topk.h"
#include "numattn/attention/registry.h"
#include "sparse_decode_util.h"
#include "support/conformance.h"
#include "support/method_problem.h"
#include "support/test_util.h"

namespace numattn {
namespace {
namespace NUMATTN_UNITY_ID {

constexpr double kNegInf = -std::numeric_limits<double>::infinity();

ProblemConfig config(index_t h, index_t hk, index_t n, index_t nk, index_t d, Causal c, std::uint64_t seed) {
  return test::method_problem(h, hk, n, nk, d, d + 2, c, test::base_seed() + seed, Dist::kGaussian, true);
}

std::string spec(index_t k) { return "sparse.topk(k=" + std::to_string(k) + ")"; }

/// Float64 logits of the keys row (b, h, i) sees (−inf for the others, and for additive −inf).
std::vector<double> logits(const AttentionProblem& p, index_t b, index_t h, index_t i) {
  std::vector<double> s(static_cast<std::size_t>(p.n_kv()), kNegInf);
  for (index_t j = 0; j < p.n_kv(); ++j) {
    if (!p.visible(i, j)) continue;
    double a = 0;
    if (p.mask.kind == MaskKind::kAdditive) {
      a = p.mask.additive[i * p.mask.ld + j];
      if (!(a > kNegInf)) continue;
    }
    double x = 0;
    for (index_t c = 0; c < p.d_qk(); ++c) x += double(p.q(b, h, i, c)) * p.k(b, h / p.group(), j, c);
    s[static_cast<std::size_t>(j)] = p.effective_scale() * x + a;
  }
  return s;
}

/// The row's true top-k keys (float64 logits; ties: lower index), increasing.
std::vector<index_t> true_topk(const std::vector<double>& s, index_t k) {
  std::vector<index_t> idx;
  for (index_t j = 0; j < static_cast<index_t>(s.size()); ++j)
    if (s[static_cast<std::size_t>(j)] > kNegInf) idx.push_back(j);
  std::stable_sort(idx.begin(), idx.end(), [&](index_t a, index_t c) { return s[static_cast<std::size_t>(a)] > s[static_cast<std::size_t>(c)]; });
  if (static_cast<index_t>(idx.size()) > k) idx.resize(static_cast<std::size_t>(k));
  std::sort(idx.begin(), idx.end());
  return idx;
}

TEST(SparseTopk, MatchesTheFloat64TranscriptionWithFullRecall) {
  struct Shape {
    index_t h, hk, n, nk, d;
    Causal c;
    index_t wl = -1;
    bool additive = false;
  };
  const Shape shapes[] = {{4, 2, 70, 70, 16, Causal::kBottomRight}, {2, 2, 20, 90, 8, Causal::kBottomRight},
                          {3, 1, 45, 30, 8, Causal::kTopLeft},      {2, 1, 33, 50, 5, Causal::kNone},
                          {2, 2, 40, 40, 8, Causal::kNone, 9},      {2, 2, 30, 41, 8, Causal::kBottomRight, -1, true}};
  int n = 0;
  double recall_sum = 0, rows = 0, recall_min = 1;
  for (const Shape& s : shapes)
    for (index_t k : {1, 3, 8, 25}) {
      ProblemConfig cfg = config(s.h, s.hk, s.n, s.nk, s.d, s.c, ++n);
      cfg.window_left = s.wl;
      RandomProblem prob(cfg);
      if (s.additive) {
        std::vector<float> add(static_cast<std::size_t>(s.n * s.nk));
        for (std::size_t u = 0; u < add.size(); ++u) add[u] = u % 7 == 0 ? -INFINITY : float(u % 5) * 0.3f - 0.6f;
        prob.set_additive_mask(add);
      }
      const AttentionProblem& p = prob.problem();
      create_method(spec(k))->run(p, ExecContext{2});
      double worst = 0, worst_lse = 0;
      for (index_t b = 0; b < p.batch(); ++b)
        for (index_t h = 0; h < p.heads(); ++h)
          for (index_t i = 0; i < p.n_q(); ++i) {
            const std::vector<double> sc = logits(p, b, h, i);
            const std::vector<index_t> want = true_topk(sc, k);
            const std::vector<index_t> got = TopkAttention::selected_keys(p, b, h, i, k);
            // Recall: the fraction of the row's true top-k that the method attends to.
            if (!want.empty()) {
              index_t hit = 0;
              for (index_t j : want) hit += std::binary_search(got.begin(), got.end(), j);
              const double rc = double(hit) / double(want.size());
              recall_sum += rc, rows += 1, recall_min = std::min(recall_min, rc);
            }
            // Transcription: softmax over the true top-k, in float64.
            std::vector<double> o(static_cast<std::size_t>(p.d_v()), 0.0);
            double lse = kNegInf;
            if (!want.empty()) {
              double m = kNegInf, z = 0;
              for (index_t j : want) m = std::max(m, sc[static_cast<std::size_t>(j)]);
              for (index_t j : want) {
                const double w = std::exp(sc[static_cast<std::size_t>(j)] - m);
                z += w;
                for (index_t e = 0; e < p.d_v(); ++e) o[static_cast<std::size_t>(e)] += w * p.v(b, h / p.group(), j, e);
              }
              for (double& x : o) x /= z;
              lse = m + std::log(z);
            }
            for (index_t e = 0; e < p.d_v(); ++e)
              worst = std::max(worst, std::abs(p.out(b, h, i, e) - o[static_cast<std::size_t>(e)]) / (1 + std::abs(o[static_cast<std::size_t>(e)])));
            if (lse == kNegInf) EXPECT_EQ(p.lse(b, h, i, 0), kNegInf);
            else worst_lse = std::max(worst_lse, std::abs(p.lse(b, h, i, 0) - lse) / (1 + std::abs(lse)));
          }
      EXPECT_LT(worst, 1e-5) << spec(k) << " shape " << n;
      EXPECT_LT(worst_lse, 1e-6) << spec(k) << " shape " << n;
    }
  std::printf("sparse.topk recall of the true top-k over %.0f rows: mean %.6f, min %.3f\n", rows, recall_sum / rows, recall_min);
  EXPECT_EQ(recall_min, 1.0);  // Gaussian logits have no float32 near-ties here
}

TEST(SparseTopk, KAtLeastNIsExactAttention) {
  for (Causal c : {Causal::kNone, Causal::kTopLeft, Causal::kBottomRight}) {
    RandomProblem prob(config(4, 2, 50, 70, 16, c, 50));
    const ReferenceRows ref = reference_all(prob.problem(), ExecContext{2});
    for (index_t k : {70, 1000}) {
      create_method(spec(k))->run(prob.problem(), ExecContext{2});
      const ErrorMetrics e = compare_with_reference(prob.problem(), ref);
      const ExactTolerance tol = exact_f32_tolerance(ref.logit_magnitude);
      EXPECT_LE(e.rel_fro_error, tol.rel_fro_error) << k;
      EXPECT_LE(e.max_scaled_error, tol.max_scaled_error) << k;
      EXPECT_LE(e.lse_max_abs_error, tol.lse_max_abs_error) << k;
    }
  }
}

TEST(SparseTopk, ErrorFallsAsKGrows) {
  const index_t ks[] = {1, 8, 32, 128, 256};
  std::vector<double> med;
  for (index_t k : ks) {
    std::vector<double> err;
    for (int seed = 0; seed < 5; ++seed) {
      ProblemConfig cfg = config(2, 1, 256, 256, 32, Causal::kBottomRight, 100 + seed);
      cfg.logit_scale = 2;
      RandomProblem prob(cfg);
      const ReferenceRows ref = reference_all(prob.problem(), ExecContext{2});
      create_method(spec(k))->run(prob.problem(), ExecContext{2});
      err.push_back(compare_with_reference(prob.problem(), ref).rel_fro_error);
    }
    std::sort(err.begin(), err.end());
    med.push_back(err[2]);
  }
  for (std::size_t i = 1; i < med.size(); ++i) EXPECT_LT(med[i], med[i - 1]) << i;
  EXPECT_LT(med.back(), 1e-5);
  std::printf("sparse.topk causal N=256 logits x2, median rel_fro_error at k=1/8/32/128/256: %.3g %.3g %.3g %.3g %.3g\n",
              med[0], med[1], med[2], med[3], med[4]);
}

TEST(SparseTopk, CausalRowsNeverReadFutureKeys) {
  for (Causal c : {Causal::kTopLeft, Causal::kBottomRight})
    for (index_t k : {1, 7, 200}) {
      const ProblemConfig cfg = config(4, 2, 70, 90, 16, c, 300);
      for (index_t i : {0, 13, 40, 69}) {
        RandomProblem bad(cfg);
        test::expect_rows_ignore_future_keys(spec(k), bad, i, test::KeyPoison::kSetTo1e30);
      }
    }
}

TEST(SparseTopk, KvCacheDecodeEqualsPrefill) {
  const test::TinyTensors T = test::make_tiny(false);
  const LlamaModel m = LlamaModel::load(test::write_gguf(T, "tiny_topk.gguf"), ExecContext{2});
  const auto toks = test::decode_tokens(40, 12);
  for (index_t k : {4, 16}) {
    const test::DecodeRun r = test::prefill_vs_decode(m, spec(k), toks, 9);
    EXPECT_LT(test::max_abs_diff(r.prefill, r.decode), 1e-4) << k;
  }
  const test::DecodeRun t = test::prefill_vs_decode(m, spec(4), toks, 39);
  const test::DecodeRun e = test::prefill_vs_decode(m, "exact.flash", toks, 39);
  EXPECT_GT(test::max_abs_diff(t.prefill, e.prefill), 1e-3);
}

// ---------------------------------------------------------------------------------------------
// select=block

struct BlockSpec {
  index_t k, block, local, samples;
  double mass = 0;
  std::string str() const {
    return "sparse.topk(k=" + std::to_string(k) + ",select=block,block=" + std::to_string(block) +
           ",local=" + std::to_string(local) + ",samples=" + std::to_string(samples) +
           ",mass=" + std::to_string(mass) + ")";
  }
};

/// Whether row i sees key j (causal rule, window, boolean mask, additive −inf/NaN hide).
bool sees(const AttentionProblem& p, index_t i, index_t j) {
  if (!p.visible(i, j)) return false;
  return p.mask.kind != MaskKind::kAdditive || p.mask.additive[i * p.mask.ld + j] > kNegInf;
}

/// Float64 transcription of select=block, written from the method's description (topk.h) apart
/// from the fast code: per block of `block` rows and GQA group, far keys [begin, near) and near
/// keys [near, end) with begin/end the extremes of the rows' key ranges and near = min row end −
/// local (clamped); `samples` rows per head evenly spread (rounded to nearest), their softmax over
/// the far keys they see summed into a_j; the k far keys of largest a_j (ties: lower index). With
/// mass = ε > 0 (top-p) the sampled rows' softmax runs over the keys before the block's first row
/// end (far and near) instead, and of the far keys sorted by decreasing a_j (ties: lower index)
/// the shortest prefix, at most k long, whose left-out a_j sum to at most ε times the number of
/// sampled rows is kept. Each row: softmax over the chosen far keys and the near keys it sees.
/// Returns the outputs (b, h, i, d order) and each row's keys, increasing.
std::vector<double> block_transcription(const AttentionProblem& p, const BlockSpec& bs,
                                        std::vector<std::vector<index_t>>& keys_of_row) {
  const index_t nq = p.n_q(), g = p.group(), dv = p.d_v();
  std::vector<double> out(static_cast<std::size_t>(p.batch() * p.heads() * nq * dv), 0.0);
  keys_of_row.assign(static_cast<std::size_t>(p.batch() * p.heads() * nq), {});
  for (index_t b = 0; b < p.batch(); ++b)
    for (index_t hk = 0; hk < p.kv_heads(); ++hk)
      for (index_t i0 = 0; i0 < nq; i0 += bs.block) {
        const index_t i1 = std::min(nq, i0 + bs.block), rows = i1 - i0;
        index_t begin = p.n_kv(), end = 0, emin = p.n_kv();
        bool any = false;
        for (index_t i = i0; i < i1; ++i) {
          const KeyRange r = p.key_range(i);
          if (r.empty()) continue;
          any = true;
          begin = std::min(begin, r.begin), end = std::max(end, r.end), emin = std::min(emin, r.end);
        }
        if (!any) continue;
        const index_t near = std::clamp(emin - bs.local, begin, emin);
        std::vector<index_t> far;
        if (near - begin <= bs.k) {
          for (index_t j = begin; j < near; ++j) far.push_back(j);
        } else {
          std::vector<double> a(static_cast<std::size_t>(near - begin), 0.0);
          const index_t ns = std::min(bs.samples, rows), send = bs.mass > 0 ? emin : near;
          index_t counted = 0;
          for (index_t h = hk * g; h < (hk + 1) * g; ++h)
            for (index_t t = 0; t < ns; ++t) {
              const index_t i = i0 + (ns == 1 ? rows / 2 : static_cast<index_t>(std::llround(double(t) * double(rows - 1) / double(ns - 1))));
              if (p.key_range(i).empty()) continue;
              const std::vector<double> s = logits(p, b, h, i);  // −inf for hidden keys
              double m = kNegInf;
              for (index_t j = begin; j < send; ++j) m = std::max(m, s[static_cast<std::size_t>(j)]);
              if (m == kNegInf) continue;
              ++counted;
              double z = 0;
              for (index_t j = begin; j < send; ++j) z += std::exp(s[static_cast<std::size_t>(j)] - m);
              for (index_t j = begin; j < near; ++j) a[static_cast<std::size_t>(j - begin)] += std::exp(s[static_cast<std::size_t>(j)] - m) / z;
            }
          std::vector<index_t> idx(a.size());
          std::iota(idx.begin(), idx.end(), 0);
          std::stable_sort(idx.begin(), idx.end(), [&](index_t x, index_t y) { return a[static_cast<std::size_t>(x)] > a[static_cast<std::size_t>(y)]; });
          index_t keep = bs.k;
          if (bs.mass > 0 && counted > 0) {
            // Shortest prefix, at most k, whose left-out mass is at most ε·(sampled rows).
            double left = 0;
            for (double x : a) left += x;
            keep = 0;
            while (keep < bs.k && left > bs.mass * double(counted)) left -= a[static_cast<std::size_t>(idx[static_cast<std::size_t>(keep++)])];
          }
          idx.resize(static_cast<std::size_t>(keep));
          std::sort(idx.begin(), idx.end());
          for (index_t u : idx) far.push_back(begin + u);
        }
        for (index_t h = hk * g; h < (hk + 1) * g; ++h)
          for (index_t i = i0; i < i1; ++i) {
            const std::vector<double> s = logits(p, b, h, i);
            auto& keys = keys_of_row[static_cast<std::size_t>((b * p.heads() + h) * nq + i)];
            for (index_t j : far)
              if (sees(p, i, j)) keys.push_back(j);
            for (index_t j = near; j < end; ++j)
              if (sees(p, i, j)) keys.push_back(j);
            if (keys.empty()) continue;
            double m = kNegInf, z = 0;
            for (index_t j : keys) m = std::max(m, s[static_cast<std::size_t>(j)]);
            double* o = out.data() + ((b * p.heads() + h) * nq + i) * dv;
            for (index_t j : keys) {
              const double w = std::exp(s[static_cast<std::size_t>(j)] - m);
              z += w;
              for (index_t e = 0; e < dv; ++e) o[e] += w * p.v(b, hk, j, e);
            }
            for (index_t e = 0; e < dv; ++e) o[e] /= z;
          }
      }
  return out;
}

TEST(SparseTopkBlock, EqualsItsFloat64Transcription) {
  struct Case {
    index_t h, hk, n, nk, d;
    Causal c;
    BlockSpec bs;
    index_t wl = -1, wr = -1;
    int mask = 0;  // 1 boolean, 2 additive
  };
  const Case cases[] = {
      {6, 2, 130, 130, 16, Causal::kBottomRight, {20, 32, 16, 4}},     // the dense causal path
      {3, 3, 70, 200, 8, Causal::kBottomRight, {33, 16, 8, 3}},        // Nq < Nk, MHA
      {4, 1, 90, 60, 12, Causal::kTopLeft, {9, 16, 4, 2}},             // Nq > Nk: empty rows, per-row path
      {2, 2, 50, 170, 8, Causal::kNone, {40, 16, 10, 5}},              // full rows
      {4, 2, 100, 100, 8, Causal::kBottomRight, {12, 16, 6, 3}, 40, -1},  // a window: per-row path
      {2, 1, 64, 90, 8, Causal::kBottomRight, {15, 8, 5, 2}, -1, -1, 1},   // a boolean mask
      {2, 2, 60, 80, 8, Causal::kNone, {10, 16, 7, 3}, -1, -1, 2},         // an additive mask
      // top-p: the dense causal path, Nq < Nk, a window, both masks
      {6, 2, 130, 130, 16, Causal::kBottomRight, {40, 32, 16, 4, 0.05}},
      {3, 3, 70, 200, 8, Causal::kBottomRight, {60, 16, 8, 3, 0.2}},
      {4, 2, 100, 100, 8, Causal::kBottomRight, {30, 16, 6, 3, 0.1}, 40, -1},
      {2, 1, 64, 90, 8, Causal::kBottomRight, {25, 8, 5, 2, 0.1}, -1, -1, 1},
      {2, 2, 60, 80, 8, Causal::kNone, {30, 16, 7, 3, 0.02}, -1, -1, 2},
  };
  int n = 100;
  for (const Case& c : cases) {
    ProblemConfig cfg = config(c.h, c.hk, c.n, c.nk, c.d, c.c, ++n);
    cfg.window_left = c.wl;
    cfg.window_right = c.wr;
    cfg.logit_scale = 2;
    RandomProblem prob(cfg);
    if (c.mask == 1) {
      std::vector<std::uint8_t> allowed(static_cast<std::size_t>(c.n * c.nk));
      for (std::size_t u = 0; u < allowed.size(); ++u) allowed[u] = (u * 7 + u / 13) % 5 != 0;
      prob.set_bool_mask(allowed);
    } else if (c.mask == 2) {
      std::vector<float> add(static_cast<std::size_t>(c.n * c.nk));
      for (std::size_t u = 0; u < add.size(); ++u) add[u] = u % 11 == 0 ? -INFINITY : 0.2f * float(u % 7) - 0.6f;
      prob.set_additive_mask(add);
    }
    const AttentionProblem& p = prob.problem();
    const auto m = create_method(c.bs.str());
    m->run(p, ExecContext{2});
    std::vector<std::vector<index_t>> keys;
    const std::vector<double> ref = block_transcription(p, c.bs, keys);
    const auto& topk = dynamic_cast<const TopkAttention&>(*m);
    double worst = 0;
    std::size_t row = 0, same = 0;
    for (index_t b = 0; b < p.batch(); ++b)
      for (index_t h = 0; h < p.heads(); ++h)
        for (index_t i = 0; i < p.n_q(); ++i, ++row) {
          std::vector<index_t> got = topk.block_keys_of_row(p, b, h, i);
          std::sort(got.begin(), got.end());
          same += got == keys[row];
          for (index_t e = 0; e < p.d_v(); ++e) {
            const double want = ref[row * static_cast<std::size_t>(p.d_v()) + static_cast<std::size_t>(e)];
            worst = std::max(worst, std::abs(p.out(b, h, i, e) - want) / (1 + std::abs(want)));
          }
        }
    EXPECT_EQ(same, keys.size()) << c.bs.str() << " case " << n << ": rows whose keys differ from the float64 choice";
    EXPECT_LT(worst, 1e-5) << c.bs.str() << " case " << n;
  }
}

TEST(SparseTopkBlock, KAtLeastNkIsExactAttention) {
  for (Causal c : {Causal::kNone, Causal::kTopLeft, Causal::kBottomRight})
    for (index_t wl : {-1, 9}) {
      ProblemConfig cfg = config(6, 2, 75, 90, 16, c, 400);
      cfg.window_left = wl;
      RandomProblem prob(cfg);
      const ReferenceRows ref = reference_all(prob.problem(), ExecContext{2});
      create_method(BlockSpec{90, 16, 4, 2}.str())->run(prob.problem(), ExecContext{2});
      const ErrorMetrics e = compare_with_reference(prob.problem(), ref);
      const ExactTolerance tol = exact_f32_tolerance(ref.logit_magnitude);
      EXPECT_LE(e.rel_fro_error, tol.rel_fro_error) << to_string(c) << " window " << wl;
      EXPECT_LE(e.max_scaled_error, tol.max_scaled_error) << to_string(c) << " window " << wl;
      EXPECT_LE(e.lse_max_abs_error, tol.lse_max_abs_error) << to_string(c) << " window " << wl;
    }
}

TEST(SparseTopkBlock, CausalRowsNeverReadFutureKeys) {
  // Far keys precede every row of the block and the sampled rows score only those, so keys after
  // row t's diagonal reach neither the choice nor the output of rows 0..t (bitwise, LSE included).
  for (Causal c : {Causal::kTopLeft, Causal::kBottomRight})
    for (const BlockSpec& bs : {BlockSpec{5, 16, 4, 3}, BlockSpec{12, 8, 0, 1}, BlockSpec{20, 16, 6, 3, 0.1}})
      for (index_t i : {0, 13, 40, 69}) {
        RandomProblem bad(config(4, 2, 70, 90, 16, c, 500));
        test::expect_rows_ignore_future_keys(bs.str(), bad, i, test::KeyPoison::kSetTo1e30);
      }
}

TEST(SparseTopkBlock, FollowsTheEdgeSemanticsAndItsBudget) {
  // The registry-wide harness on select=block with small blocks (the hostile problem has 9 rows
  // and 23 keys): every spec it builds is turned into that mode.
  const test::MethodFactory block_mode = [](const std::string& spec) {
    std::string s = spec;
    const auto swap = [&](const std::string& from, const std::string& to) {
      const auto at = s.find(from);
      if (at != std::string::npos) s.replace(at, from.size(), to);
    };
    swap("select=exact", "select=block");
    swap("block=64", "block=4");
    swap("local=64", "local=2");
    swap("samples=4", "samples=2");
    swap("k=64", "k=3");
    return create_method(s);
  };
  const MethodInfo& info = TopkAttention::describe();
  auto v = test::check_hostile(info, block_mode);
  EXPECT_TRUE(v.empty()) << test::describe(v);
  v = test::check_limit_case(info, block_mode);
  EXPECT_TRUE(v.empty()) << test::describe(v);
}

}  // namespace NUMATTN_UNITY_ID
}  // namespace
}  // namespace numattn
