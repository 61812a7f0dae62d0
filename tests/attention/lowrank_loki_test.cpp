// lowrank.loki against a float64 transcription of Loki (Singhania et al., NeurIPS 2024): PCA basis
// of the calibration keys (leading eigenvectors of KᵀK over the keys before the frontier of a
// block of 32 rows, rounded down to a multiple of 128; all keys without one), approximate scores in r
// coordinates, the top
// ceil(f·visible) keys per row, exact softmax over them; causal and masked variants against the
// dense masked computation; limits (topk_frac = 1 exact; rank_frac = 1 = exact top-k attention);
// error falling with topk_frac.
#include <gtest/gtest.h>

#include <Eigen/Core>

#include <algorithm>
#include <bit>
#include <cmath>
#include <numeric>
#include <vector>

#include "attention/lowrank/loki.h"
#include "numattn/attention/registry.h"
#include "numattn/decomp/dense.h"
#include "support/method_problem.h"
#include "support/test_util.h"

namespace numattn {
namespace {
namespace NUMATTN_UNITY_ID {

using Mat = Eigen::MatrixXd;

ProblemConfig config(index_t h, index_t hk, index_t n, index_t nk, index_t d, Causal c, std::uint64_t seed) {
  return test::method_problem(h, hk, n, nk, d, d + 1, c, seed, Dist::kGaussian, false);
}

/// The float64 Loki output of every row; `use_true_scores` selects by the exact logits instead.
/// `chosen` (if given) receives each row's T_i, increasing, rows in (b, h, i) order.
std::vector<double> transcription(const AttentionProblem& p, double rank_frac, double topk_frac, bool use_true_scores = false,
                                  std::vector<std::vector<index_t>>* chosen = nullptr) {
  const index_t nk = p.n_kv(), d = p.d_qk(), dv = p.d_v();
  const index_t r = static_cast<index_t>(std::ceil(rank_frac * static_cast<double>(d) - 1e-9));
  std::vector<double> out;
  for (index_t b = 0; b < p.batch(); ++b)
    for (index_t h = 0; h < p.heads(); ++h) {
      const index_t hk = h / p.group();
      Mat K(nk, d);
      for (index_t j = 0; j < nk; ++j)
        for (index_t c = 0; c < d; ++c) K(j, c) = p.k(b, hk, j, c);
      for (index_t i = 0; i < p.n_q(); ++i) {
        // The calibration keys [0, L) of row i's block of 32 rows: all keys when every row of
        // the block sees the last one, else the block's smallest frontier rounded down to a
        // multiple of 128 (to a power of two below 128).
        index_t first = nk;
        for (index_t u = i / 32 * 32; u < std::min(p.n_q(), i / 32 * 32 + 32); ++u)
          if (!p.key_range(u).empty()) first = std::min(first, p.key_range(u).end);
        const index_t len = first >= nk    ? nk
                            : first >= 128 ? first / 128 * 128
                                           : static_cast<index_t>(std::bit_floor(static_cast<std::uint64_t>(first)));
        const Mat Kc = K.topRows(len);
        const Mat P = decomp::dense::sym_eig(Kc.transpose() * Kc).vectors.rightCols(r);  // the leading r (order within is irrelevant)
        const Mat KP = K * P;
        Eigen::VectorXd q(d);
        for (index_t c = 0; c < d; ++c) q(c) = p.q(b, h, i, c);
        const Eigen::VectorXd qp = P.transpose() * q;
        std::vector<index_t> vis;
        std::vector<double> sel, logit;
        for (index_t j = 0; j < nk; ++j) {
          if (!p.visible(i, j)) continue;
          double add = 0;
          if (p.mask.kind == MaskKind::kAdditive) {
            add = p.mask.additive[i * p.mask.ld + j];
            if (!(add > -INFINITY)) continue;
          }
          vis.push_back(j);
          const double exact = p.effective_scale() * K.row(j).dot(q) + add;
          sel.push_back(use_true_scores ? exact : p.effective_scale() * KP.row(j).dot(qp) + add);
          logit.push_back(exact);
        }
        const index_t nv = static_cast<index_t>(vis.size());
        std::vector<double> o(static_cast<std::size_t>(dv), 0.0);
        if (nv > 0) {
          const index_t k = std::clamp<index_t>(static_cast<index_t>(std::ceil(topk_frac * static_cast<double>(nv) - 1e-9)), 1, nv);
          std::vector<index_t> idx(static_cast<std::size_t>(nv));
          std::iota(idx.begin(), idx.end(), 0);
          std::stable_sort(idx.begin(), idx.end(), [&](index_t a, index_t c) {
            return sel[static_cast<std::size_t>(a)] > sel[static_cast<std::size_t>(c)];
          });
          idx.resize(static_cast<std::size_t>(k));
          if (chosen) {
            std::vector<index_t> keys;
            for (index_t u : idx) keys.push_back(vis[static_cast<std::size_t>(u)]);
            std::sort(keys.begin(), keys.end());
            chosen->push_back(keys);
          }
          double m = -INFINITY, z = 0;
          for (index_t u : idx) m = std::max(m, logit[static_cast<std::size_t>(u)]);
          for (index_t u : idx) {
            const double w = std::exp(logit[static_cast<std::size_t>(u)] - m);
            z += w;
            for (index_t c = 0; c < dv; ++c) o[static_cast<std::size_t>(c)] += w * p.v(b, hk, vis[static_cast<std::size_t>(u)], c);
          }
          for (double& x : o) x /= z;
        }
        if (chosen && nv == 0) chosen->emplace_back();
        out.insert(out.end(), o.begin(), o.end());
      }
    }
  return out;
}

double rel_error(const AttentionProblem& p, const std::vector<double>& ref) {
  double num = 0, den = 0;
  std::size_t t = 0;
  for (index_t b = 0; b < p.batch(); ++b)
    for (index_t h = 0; h < p.heads(); ++h)
      for (index_t i = 0; i < p.n_q(); ++i)
        for (index_t c = 0; c < p.d_v(); ++c, ++t) {
          const double e = p.out(b, h, i, c) - ref[t];
          num += e * e;
          den += ref[t] * ref[t];
        }
  return std::sqrt(num / std::max(den, 1e-300));
}

TEST(Loki, EqualsItsFloat64Transcription) {
  // Short rows (one nth_element), and long ones (the sampled bracket of blocks/select_gather, the
  // gathered keys in several chunks), the selected keys themselves checked too.
  struct Shape {
    index_t h, hk, n, nk, d;
    double rank, topk;
  };
  for (const Shape& s : {Shape{4, 2, 45, 80, 16, 0.25, 0.2}, Shape{3, 1, 150, 700, 24, 0.125, 0.1}, Shape{2, 2, 70, 900, 59, 0.5, 0.3}})
    for (Causal c : {Causal::kNone, Causal::kTopLeft, Causal::kBottomRight}) {
      RandomProblem prob(config(s.h, s.hk, s.n, s.nk, s.d, c, test::base_seed() + static_cast<std::uint64_t>(c) + 10 * s.nk));
      const AttentionProblem& p = prob.problem();
      const auto spec = fmt::format("lowrank.loki(rank_frac={},topk_frac={})", s.rank, s.topk);
      const auto m = create_method(spec);
      m->run(p, ExecContext{3});
      std::vector<std::vector<index_t>> chosen;
      EXPECT_LT(rel_error(p, transcription(p, s.rank, s.topk, false, &chosen)), 1e-5) << spec << " " << to_string(c);
      const auto& loki = dynamic_cast<const LokiAttention&>(*m);
      std::size_t row = 0, same = 0;
      for (index_t b = 0; b < p.batch(); ++b)
        for (index_t h = 0; h < p.heads(); ++h)
          for (index_t i = 0; i < p.n_q(); ++i, ++row) same += loki.chosen_keys(p, b, h, i) == chosen[row];
      EXPECT_EQ(same, chosen.size()) << spec << " " << to_string(c) << ": rows whose T_i differs from the float64 one";
    }
}

TEST(Loki, PoisonedFutureKeysNeverReachTheOutput) {
  // Under a causal rule a row chooses among the keys it sees and gathers only those: future keys
  // set to 1e30 (k and v) never enter its output, which stays a convex combination of the values
  // it sees. Nor do they enter its basis (calibrated on keys before its block's frontier): its
  // choice is that of the clean problem.
  for (Causal c : {Causal::kTopLeft, Causal::kBottomRight})
    for (index_t t : {0, 13, 40}) {
      RandomProblem prob(config(4, 2, 70, 90, 16, c, test::base_seed() + 300 + static_cast<std::uint64_t>(t)));
      const AttentionProblem& p = prob.problem();
      const index_t off = p.diag_offset();
      const auto m = create_method("lowrank.loki(rank_frac=0.25,topk_frac=0.3)");
      const auto& loki = dynamic_cast<const LokiAttention&>(*m);
      std::vector<std::vector<index_t>> clean;
      for (index_t b = 0; b < p.batch(); ++b)
        for (index_t h = 0; h < p.heads(); ++h)
          for (index_t i = 0; i <= t; ++i) clean.push_back(loki.chosen_keys(p, b, h, i));
      for (index_t b = 0; b < p.batch(); ++b)
        for (index_t hk = 0; hk < p.kv_heads(); ++hk)
          for (index_t j = std::max<index_t>(t + off + 1, 0); j < p.n_kv(); ++j) {
            float* k = prob.k_data().data() + (p.k.row(b, hk, j) - p.k.data);
            float* v = prob.v_data().data() + (p.v.row(b, hk, j) - p.v.data);
            std::fill(k, k + p.d_qk(), 1e30f);
            std::fill(v, v + p.d_v(), 1e30f);
          }
      m->run(p, ExecContext{2});
      std::size_t row = 0;
      for (index_t b = 0; b < p.batch(); ++b)
        for (index_t h = 0; h < p.heads(); ++h)
          for (index_t i = 0; i <= t; ++i, ++row) {
            const std::vector<index_t> keys = loki.chosen_keys(p, b, h, i);
            EXPECT_EQ(keys, clean[row]) << to_string(c) << " row " << i;
            for (index_t j : keys) ASSERT_LE(j, i + off) << to_string(c) << " row " << i;
            for (index_t d = 0; d < p.d_v(); ++d) {
              double lo = INFINITY, hi = -INFINITY;
              for (index_t j = 0; j <= i + off; ++j) lo = std::min<double>(lo, p.v(b, h / p.group(), j, d)), hi = std::max<double>(hi, p.v(b, h / p.group(), j, d));
              const double o = p.out(b, h, i, d);
              ASSERT_TRUE(o >= lo - 1e-5 && o <= hi + 1e-5) << to_string(c) << " row " << i << " value " << o;
            }
          }
    }
}

TEST(Loki, MaskedAndWindowedVariantsEqualTheDenseMaskedComputation) {
  RandomProblem prob(config(2, 1, 40, 60, 16, Causal::kBottomRight, test::base_seed() + 7));
  std::vector<std::uint8_t> allowed(40 * 60);
  for (std::size_t t = 0; t < allowed.size(); ++t) allowed[t] = (t * 7 + t / 60) % 5 != 0;
  prob.set_bool_mask(allowed);
  create_method("lowrank.loki(rank_frac=0.5,topk_frac=0.3)")->run(prob.problem(), ExecContext{2});
  EXPECT_LT(rel_error(prob.problem(), transcription(prob.problem(), 0.5, 0.3)), 1e-5);

  ProblemConfig cfg = config(2, 2, 50, 50, 8, Causal::kNone, test::base_seed() + 8);
  cfg.window_left = 9;
  cfg.window_right = 4;
  RandomProblem win(cfg);
  std::vector<float> add(50 * 50);
  for (std::size_t t = 0; t < add.size(); ++t) add[t] = t % 11 == 0 ? -INFINITY : 0.1f * static_cast<float>(t % 7);
  win.set_additive_mask(add);
  create_method("lowrank.loki(rank_frac=0.25,topk_frac=0.5)")->run(win.problem(), ExecContext{2});
  EXPECT_LT(rel_error(win.problem(), transcription(win.problem(), 0.25, 0.5)), 1e-5);
}

TEST(Loki, LimitCases) {
  // topk_frac = 1: exact softmax attention, whatever the rank.
  RandomProblem prob(config(3, 1, 37, 64, 32, Causal::kTopLeft, test::base_seed() + 9));
  create_method("lowrank.loki(rank_frac=0.01,topk_frac=1)")->run(prob.problem(), ExecContext{2});
  const ErrorMetrics e = compare_with_reference(prob.problem(), reference_all(prob.problem(), ExecContext{2}));
  EXPECT_LE(e.rel_fro_error, exact_f32_tolerance(e.logit_magnitude).rel_fro_error);
  EXPECT_LE(e.max_scaled_error, exact_f32_tolerance(e.logit_magnitude).max_scaled_error);
  // rank_frac = 1: the reduced scores are the exact ones, so Loki is exact top-k attention.
  create_method("lowrank.loki(rank_frac=1,topk_frac=0.25)")->run(prob.problem(), ExecContext{2});
  EXPECT_LT(rel_error(prob.problem(), transcription(prob.problem(), 1, 0.25, true)), 1e-5);
}

TEST(Loki, ErrorFallsAsTopkGrows) {
  std::vector<double> med;
  for (double f : {0.05, 0.15, 0.4, 0.8}) {
    std::vector<double> e;
    for (std::uint64_t s = 0; s < 5; ++s) {
      ProblemConfig cfg = config(2, 2, 48, 200, 32, Causal::kNone, test::base_seed() + 20 + s);
      cfg.dist = Dist::kSpiky;
      RandomProblem prob(cfg);
      create_method(fmt::format("lowrank.loki(topk_frac={})", f))->run(prob.problem(), ExecContext{2});
      e.push_back(compare_with_reference(prob.problem(), reference_all(prob.problem(), ExecContext{2})).rel_fro_error);
    }
    std::sort(e.begin(), e.end());
    med.push_back(e[2]);
  }
  for (std::size_t i = 1; i < med.size(); ++i) EXPECT_LT(med[i], med[i - 1]) << "step " << i;
}

}  // namespace NUMATTN_UNITY_ID
}  // namespace
}  // namespace numattn
