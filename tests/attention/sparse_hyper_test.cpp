// sparse.hyper (HyperAttention, Han et al., ICLR 2024): the non-causal routine against a float64
// transcription using the method's own Gray ranks and draws; limits (min_seq_len ≥ N, block ≥ Nk)
// equal exact attention, causal too; the error falls as the block grows; the sampled residual's
// numerator and normaliser are unbiased; top-k recall of the sorted blocks; causal rows
// never read future keys (poisoned keys and values).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <vector>

#include "attention/sparse/hyper.h"
#include "numattn/attention/registry.h"
#include "support/method_problem.h"
#include "support/test_util.h"

namespace numattn {
namespace {
namespace NUMATTN_UNITY_ID {

using test::median;
using test::run_error;

ProblemConfig config(index_t h, index_t hk, index_t n, index_t nk, index_t d, Causal c, std::uint64_t seed) {
  return test::method_problem(h, hk, n, nk, d, d + 3, c, test::base_seed() + seed, Dist::kGaussian, true);
}

/// Float64 transcription of the non-causal routine on (b, h) with the method's ranks and draws.
void transcription(const HyperAttention& m, const AttentionProblem& p, index_t b, index_t h, index_t block,
                   std::vector<double>& out, std::vector<double>& lse) {
  const index_t nq = p.n_q(), nk = p.n_kv(), dk = p.d_qk(), dv = p.d_v(), hk = h / p.group();
  const double s = p.effective_scale();
  auto sorted = [](const std::vector<std::uint32_t>& r) {
    std::vector<index_t> o(r.size());
    std::iota(o.begin(), o.end(), 0);
    std::stable_sort(o.begin(), o.end(), [&](index_t a, index_t c) { return r[a] < r[c]; });
    return o;
  };
  const std::vector<index_t> qo = sorted(m.ranks(p, b, h, false, nq)), ko = sorted(m.ranks(p, b, h, true, nk));
  const std::vector<index_t> u = m.draws(p, b, h, 1, nk);
  const index_t nb = (nk + block - 1) / block;
  out.assign(static_cast<std::size_t>(nq * dv), 0.0);
  lse.assign(static_cast<std::size_t>(nq), 0.0);
  for (index_t beta = 0; beta < nb; ++beta) {
    const index_t k0 = beta * nk / nb, k1 = (beta + 1) * nk / nb;
    std::vector<std::pair<index_t, double>> keys;  // (key, weight factor)
    for (index_t t = k0; t < k1; ++t) keys.push_back({ko[t], 1.0});
    index_t outside = 0;
    for (index_t x : u) outside += x < k0 || x >= k1;
    for (index_t x : u)
      if (x < k0 || x >= k1) keys.push_back({ko[x], double(nk - (k1 - k0)) / double(outside)});
    for (index_t sq = beta * nq / nb; sq < (beta + 1) * nq / nb; ++sq) {
      const index_t i = qo[sq];
      std::vector<double> l;
      double mx = -1e300;
      for (auto [j, f] : keys) {
        double d = 0;
        for (index_t c = 0; c < dk; ++c) d += double(p.q(b, h, i, c)) * p.k(b, hk, j, c);
        l.push_back(s * d + std::log(f));
        mx = std::max(mx, l.back());
      }
      double z = 0;
      for (std::size_t t = 0; t < keys.size(); ++t) {
        const double w = std::exp(l[t] - mx);
        z += w;
        for (index_t c = 0; c < dv; ++c) out[i * dv + c] += w * p.v(b, hk, keys[t].first, c);
      }
      for (index_t c = 0; c < dv; ++c) out[i * dv + c] /= z;
      lse[i] = mx + std::log(z);
    }
  }
}

TEST(SparseHyper, NonCausalMatchesFloat64Transcription) {
  for (index_t nk : {180, 200}) {
    RandomProblem prob(config(4, 2, 200, nk, 24, Causal::kNone, 1));
    const AttentionProblem& p = prob.problem();
    const auto m = create_method("sparse.hyper(block=32,samples=24,bits=5,min_seq_len=16,seed=3)");
    m->run(p, ExecContext{3});
    double worst = 0, worst_lse = 0;
    for (index_t h = 0; h < p.heads(); ++h) {
      std::vector<double> o, l;
      transcription(dynamic_cast<const HyperAttention&>(*m), p, 0, h, 32, o, l);
      for (index_t i = 0; i < p.n_q(); ++i) {
        for (index_t c = 0; c < p.d_v(); ++c)
          worst = std::max(worst, std::abs(o[i * p.d_v() + c] - p.out(0, h, i, c)) / (1 + std::abs(o[i * p.d_v() + c])));
        worst_lse = std::max(worst_lse, std::abs(l[i] - p.lse(0, h, i, 0)));
      }
    }
    EXPECT_LT(worst, 2e-5) << "nk " << nk;
    EXPECT_LT(worst_lse, 2e-5) << "nk " << nk;
  }
}

TEST(SparseHyper, LimitsAreExact) {
  const double tol = exact_f32_tolerance(10).rel_fro_error;
  for (Causal c : {Causal::kNone, Causal::kTopLeft, Causal::kBottomRight})
    for (auto [n, nk] : {std::pair<index_t, index_t>{150, 150}, {90, 170}, {170, 90}}) {
      RandomProblem prob(config(2, 1, n, nk, 16, c, 2));
      double le = 0;
      EXPECT_LT(run_error("sparse.hyper(min_seq_len=170,block=8)", prob, &le), tol) << to_string(c) << n << "x" << nk;
      EXPECT_LT(le, 1e-4);
      EXPECT_LT(run_error("sparse.hyper(min_seq_len=4,block=170,samples=8)", prob, &le), tol)
          << to_string(c) << n << "x" << nk;
      EXPECT_LT(le, 1e-4);
    }
}

TEST(SparseHyper, ErrorFallsAsTheBlockGrows) {
  std::vector<double> med;
  ProblemConfig cfg = config(2, 2, 512, 512, 32, Causal::kNone, 3);
  cfg.dist = Dist::kSpiky;
  RandomProblem prob(cfg);
  const ReferenceRows ref = reference_all(prob.problem(), ExecContext{2});
  for (index_t block : {16, 64, 256}) {
    std::vector<double> e;
    for (int seed = 1; seed <= 5; ++seed)
      e.push_back(run_error(fmt::format("sparse.hyper(block={},samples=32,min_seq_len=16,seed={})", block, seed), prob, ref));
    med.push_back(median(e));
  }
  std::printf("hyper median rel_fro_error at block 16/64/256 (N=512, spiky): %.3g %.3g %.3g\n", med[0], med[1], med[2]);
  EXPECT_LT(med[1], med[0]);
  EXPECT_LT(med[2], med[1]);
}

// Given the blocks, exp(lse)·o (numerator) and exp(lse) (normaliser) are unbiased.
TEST(SparseHyper, SampledResidualIsUnbiased) {
  RandomProblem prob(config(1, 1, 64, 64, 8, Causal::kNone, 4));
  const AttentionProblem& p = prob.problem();
  std::vector<double> ref(static_cast<std::size_t>(p.d_v()));
  const index_t i = 5;
  const double lz = reference_row(p, 0, 0, i, ref.data());
  const int seeds = 400;
  double zsum = 0, z2 = 0;
  std::vector<double> nsum(ref.size(), 0.0);
  for (int seed = 0; seed < seeds; ++seed) {
    create_method(fmt::format("sparse.hyper(block=16,samples=8,bits=3,min_seq_len=1,seed={})", seed))
        ->run(p, ExecContext{1});
    const double z = std::exp(double(p.lse(0, 0, i, 0)) - lz);  // Ẑ/Z
    zsum += z;
    z2 += z * z;
    for (index_t c = 0; c < p.d_v(); ++c) nsum[c] += z * p.out(0, 0, i, c);
  }
  const double mean = zsum / seeds, sd = std::sqrt(std::max(0.0, z2 / seeds - mean * mean) / seeds);
  EXPECT_NEAR(mean, 1.0, 4 * sd + 1e-3);
  double err = 0, nrm = 0;
  for (index_t c = 0; c < p.d_v(); ++c) {
    err += std::pow(nsum[c] / seeds - ref[c], 2);
    nrm += ref[c] * ref[c];
  }
  EXPECT_LT(std::sqrt(err / nrm), 0.15);  // Monte Carlo over 400 seeds
}

// Fraction of each row's true top-8 keys inside its own sorted block (attended exactly), on spiky
// inputs (heavy keys shared by all rows: hashing gains little) and on keys near the queries
// (k_j = q_π(j) + noise: the structure LSH exploits).
double block_recall(const AttentionProblem& p, const HyperAttention& hm, index_t blk) {
  const index_t n = p.n_q(), nb = n / blk, topk = 8, d = p.d_qk();
  double recall = 0;
  for (index_t h = 0; h < p.heads(); ++h) {
    const auto qr = hm.ranks(p, 0, h, false, n), kr = hm.ranks(p, 0, h, true, n);
    std::vector<index_t> qo(n), ko(n), kblock(n), qblock(n);
    std::iota(qo.begin(), qo.end(), 0);
    std::iota(ko.begin(), ko.end(), 0);
    std::stable_sort(qo.begin(), qo.end(), [&](index_t a, index_t c) { return qr[a] < qr[c]; });
    std::stable_sort(ko.begin(), ko.end(), [&](index_t a, index_t c) { return kr[a] < kr[c]; });
    for (index_t t = 0; t < n; ++t) {
      kblock[ko[t]] = t * nb / n;
      qblock[qo[t]] = t * nb / n;
    }
    for (index_t i = 0; i < n; ++i) {
      std::vector<std::pair<double, index_t>> sc;
      for (index_t j = 0; j < n; ++j) {
        double s = 0;
        for (index_t c = 0; c < d; ++c) s += double(p.q(0, h, i, c)) * p.k(0, h / p.group(), j, c);
        sc.push_back({-s, j});
      }
      std::partial_sort(sc.begin(), sc.begin() + topk, sc.end());
      for (index_t t = 0; t < topk; ++t) recall += kblock[sc[t].second] == qblock[i];
    }
  }
  return recall / double(p.heads() * n * topk);
}

TEST(SparseHyper, TopKRecallOfTheBlocks) {
  const index_t n = 1024, blk = 64;
  const auto m = create_method("sparse.hyper(block=64,min_seq_len=16,bits=7)");
  const auto& hm = dynamic_cast<const HyperAttention&>(*m);
  ProblemConfig cfg = config(2, 2, n, n, 32, Causal::kNone, 5);
  cfg.dist = Dist::kSpiky;
  RandomProblem spiky(cfg);
  cfg.dist = Dist::kGaussian;
  RandomProblem near(cfg);
  for (index_t h = 0; h < 2; ++h)  // k_j = q_{(7j+3) mod n} + 0.3·noise
    for (index_t j = 0; j < n; ++j)
      for (index_t c = 0; c < 32; ++c) {
        float& k = near.k_data()[static_cast<std::size_t>(near.problem().k.row(0, h, j) + c - near.problem().k.data)];
        k = near.problem().q(0, h, (7 * j + 3) % n, c) + 0.3f * k;
      }
  const double rs = block_recall(spiky.problem(), hm, blk), rn = block_recall(near.problem(), hm, blk);
  std::printf("hyper top-8 recall of the sorted blocks (N=1024, block=64): spiky %.3f, keys near queries %.3f "
              "(uniform: %.3f)\n", rs, rn, double(blk) / n);
  EXPECT_GT(rs, 1.1 * blk / n);
  EXPECT_GT(rn, 2.0 * blk / n);
}

// Keys after row t's diagonal poisoned (K scaled by 1e3: same SimHash codes; V = 1e30): rows ≤ t
// are unchanged.
TEST(SparseHyper, CausalNeverReadsFutureKeys) {
  for (Causal c : {Causal::kTopLeft, Causal::kBottomRight}) {
    RandomProblem prob(config(2, 2, 300, 340, 16, c, 6));
    test::expect_rows_ignore_future_keys("sparse.hyper(block=16,samples=16,min_seq_len=20,seed=2)", prob, 170);
  }
}

}  // namespace NUMATTN_UNITY_ID
}  // namespace
}  // namespace numattn
