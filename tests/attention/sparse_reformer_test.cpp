// sparse.reformer (Kitaev et al., ICLR 2020): the rounds' merge with the duplicate-count correction
// equals a float64 softmax over the union of the windows (the method's own plan), shared QK
// included; causal problems by the causal recursion (shared QK refuses them); limits (one bucket
// and chunk ≥ N: exact; shared QK: full shared-QK attention with the self-mask); error falls as
// rounds and chunk grow; top-k recall grows with rounds; causal rows never read future keys
// (poisoned keys and values).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <set>
#include <vector>

#include "attention/sparse/reformer.h"
#include "numattn/attention/registry.h"
#include "support/method_problem.h"
#include "support/test_util.h"

namespace numattn {
namespace {
namespace NUMATTN_UNITY_ID {

using test::median;
using test::run_error;

ProblemConfig config(index_t h, index_t hk, index_t n, index_t nk, index_t d, Causal c, std::uint64_t seed) {
  return test::method_problem(h, hk, n, nk, d, d + 2, c, test::base_seed() + seed, Dist::kGaussian, true);
}

/// The keys query i of (b, h) attends to: the union of its windows, minus hidden ones.
std::set<index_t> union_keys(const std::vector<reformer::Round>& plan, const AttentionProblem& p, index_t i,
                             bool shared) {
  std::set<index_t> keys;
  for (const reformer::Round& R : plan) {
    const index_t c = R.query_chunk[i];
    for (index_t t = R.window_begin(c); t < R.window_end(c); ++t) {
      const index_t j = R.key_order[t];
      if (shared && j == i) continue;
      keys.insert(j);
    }
  }
  return keys;
}

/// Float64 softmax of row i over `keys` (rows of `k`, Dk each); key min(i, count − 1) when empty.
double softmax_row(const AttentionProblem& p, index_t b, index_t h, index_t i, std::set<index_t> keys,
                   const std::vector<float>& k, std::vector<double>& o) {
  const index_t dk = p.d_qk(), dv = p.d_v(), hk = h / p.group();
  if (keys.empty()) keys.insert(std::min<index_t>(i, static_cast<index_t>(k.size()) / dk - 1));
  std::vector<double> l;
  double mx = -1e300;
  for (index_t j : keys) {
    double d = 0;
    for (index_t c = 0; c < dk; ++c) d += double(p.q(b, h, i, c)) * k[j * dk + c];
    l.push_back(d * p.effective_scale());
    mx = std::max(mx, l.back());
  }
  o.assign(static_cast<std::size_t>(dv), 0.0);
  double z = 0;
  std::size_t t = 0;
  for (index_t j : keys) {
    const double w = std::exp(l[t++] - mx);
    z += w;
    for (index_t c = 0; c < dv; ++c) o[c] += w * p.v(b, hk, j, c);
  }
  for (double& x : o) x /= z;
  return mx + std::log(z);
}

void expect_transcription(const std::string& spec, RandomProblem& prob, bool shared) {
  const AttentionProblem& p = prob.problem();
  const auto m = create_method(spec);
  m->run(p, ExecContext{3});
  const auto& rm = dynamic_cast<const ReformerAttention&>(*m);
  double worst = 0, worst_lse = 0;
  for (index_t h = 0; h < p.heads(); ++h) {
    const auto plan = rm.plan(p, 0, h);
    const std::vector<float> k = rm.keys(p, 0, h);
    for (index_t i = 0; i < p.n_q(); ++i) {
      std::vector<double> o;
      const double l = softmax_row(p, 0, h, i, union_keys(plan, p, i, shared), k, o);
      for (index_t c = 0; c < p.d_v(); ++c) worst = std::max(worst, std::abs(o[c] - p.out(0, h, i, c)) / (1 + std::abs(o[c])));
      worst_lse = std::max(worst_lse, std::abs(l - p.lse(0, h, i, 0)));
    }
  }
  EXPECT_LT(worst, 2e-5) << spec;
  EXPECT_LT(worst_lse, 2e-5) << spec;
}

TEST(SparseReformer, RoundsMergeExactlyOverTheUnion) {
  {
    RandomProblem prob(config(4, 2, 160, 160, 16, Causal::kNone, 1));
    expect_transcription("sparse.reformer(rounds=3,chunk=12,seed=5)", prob, false);
  }
  {
    RandomProblem prob(config(2, 1, 90, 130, 16, Causal::kNone, 2));
    expect_transcription("sparse.reformer(rounds=4,chunk=8,buckets=8)", prob, false);
  }
  RandomProblem shared_nc(config(2, 1, 120, 120, 16, Causal::kNone, 5));
  expect_transcription("sparse.reformer(rounds=2,chunk=10,shared_qk=true)", shared_nc, true);
}

// Causal problems run by the causal recursion (the sorted chunks of all keys would let a future
// key move earlier keys between chunks); shared QK, whose keys are the problem's queries, has no
// causal form and says so.
TEST(SparseReformer, CausalProblemsRunByTheRecursionAndSharedQkRefusesThem) {
  for (Causal c : {Causal::kTopLeft, Causal::kBottomRight}) {
    RandomProblem prob(config(2, 2, 300, 350, 16, c, 3));
    EXPECT_TRUE(create_method("sparse.reformer")->runs_by_recursion(prob.problem())) << to_string(c);
    RandomProblem square(config(2, 1, 300, 300, 16, c, 5));
    const Status s = create_method("sparse.reformer(shared_qk=true)")->can_run(square.problem());
    ASSERT_FALSE(s.is_ok()) << to_string(c);
    EXPECT_NE(s.reason().find("no causal"), std::string::npos) << s.reason();
  }
}

TEST(SparseReformer, LimitsAreExact) {
  const double tol = exact_f32_tolerance(10).rel_fro_error;
  for (Causal c : {Causal::kNone, Causal::kTopLeft, Causal::kBottomRight}) {
    RandomProblem prob(config(2, 1, 70, 110, 16, c, 6));
    EXPECT_LT(run_error("sparse.reformer(buckets=1,chunk=110)", prob), tol) << to_string(c);
    EXPECT_LT(run_error("sparse.reformer(buckets=16,rounds=3,chunk=110)", prob), tol) << to_string(c);
  }
  // Shared QK, one bucket, chunk ≥ N: full attention over k_j = q_j/‖q_j‖ without the self-key
  // (written apart from the plan).
  RandomProblem prob(config(2, 2, 50, 50, 8, Causal::kNone, 7));
  const AttentionProblem& p = prob.problem();
  create_method("sparse.reformer(buckets=1,chunk=64,shared_qk=true)")->run(p, ExecContext{2});
  double worst = 0;
  for (index_t h = 0; h < 2; ++h) {
    std::vector<float> k(50 * 8);
    for (index_t j = 0; j < 50; ++j) {
      double n2 = 0;
      for (index_t c = 0; c < 8; ++c) n2 += double(p.q(0, h, j, c)) * p.q(0, h, j, c);
      for (index_t c = 0; c < 8; ++c) k[j * 8 + c] = static_cast<float>(p.q(0, h, j, c) / std::sqrt(n2));
    }
    for (index_t i = 0; i < 50; ++i) {
      std::set<index_t> keys;
      for (index_t j = 0; j < 50; ++j)
        if (j != i) keys.insert(j);
      std::vector<double> o;
      softmax_row(p, 0, h, i, keys, k, o);
      for (index_t c = 0; c < p.d_v(); ++c) worst = std::max(worst, std::abs(o[c] - p.out(0, h, i, c)));
    }
  }
  EXPECT_LT(worst, 1e-5);
}

TEST(SparseReformer, ErrorAndRecallImproveWithRounds) {
  std::vector<double> med, rec;
  ProblemConfig cfg = config(2, 2, 512, 512, 32, Causal::kNone, 8);
  cfg.dist = Dist::kSpiky;
  RandomProblem prob(cfg);
  const AttentionProblem& p = prob.problem();
  const ReferenceRows ref = reference_all(p, ExecContext{2});
  for (int rounds : {1, 2, 4, 8}) {
    std::vector<double> e;
    double recall = 0;
    for (int seed = 1; seed <= 5; ++seed) {
      const std::string spec = fmt::format("sparse.reformer(rounds={},chunk=32,seed={})", rounds, seed);
      e.push_back(run_error(spec, prob, ref));
      // Recall: fraction of each row's true top-8 keys inside the union of its windows.
      const auto m = create_method(spec);
      const auto& rm = dynamic_cast<const ReformerAttention&>(*m);
      for (index_t h = 0; h < 2; ++h) {
        const auto plan = rm.plan(p, 0, h);
        for (index_t i = 0; i < 512; i += 8) {
          const std::set<index_t> u = union_keys(plan, p, i, false);
          std::vector<std::pair<double, index_t>> sc;
          for (index_t j = 0; j < 512; ++j) {
            double d = 0;
            for (index_t c = 0; c < 32; ++c) d += double(p.q(0, h, i, c)) * p.k(0, h, j, c);
            sc.push_back({-d, j});
          }
          std::partial_sort(sc.begin(), sc.begin() + 8, sc.end());
          for (int t = 0; t < 8; ++t) recall += u.count(sc[t].second);
        }
      }
    }
    med.push_back(median(e));
    rec.push_back(recall / (5 * 2 * 64 * 8));
  }
  std::printf("reformer (N=512, chunk=32, spiky) rounds 1/2/4/8: median rel_fro_error %.3g %.3g %.3g %.3g, "
              "top-8 recall %.3f %.3f %.3f %.3f (uniform window: %.3f)\n",
              med[0], med[1], med[2], med[3], rec[0], rec[1], rec[2], rec[3], 64.0 / 512);
  for (std::size_t r = 1; r < med.size(); ++r) {
    EXPECT_LT(med[r], med[r - 1]);
    EXPECT_GT(rec[r], rec[r - 1]);
  }
  EXPECT_GT(rec[0], 1.5 * 64.0 / 512);
  EXPECT_GT(rec[3], 0.6);
}

TEST(SparseReformer, ErrorFallsAsTheChunkGrows) {
  std::vector<double> med;
  RandomProblem prob(config(2, 2, 512, 512, 32, Causal::kNone, 9));
  const ReferenceRows ref = reference_all(prob.problem(), ExecContext{2});
  for (int chunk : {16, 64, 256}) {
    std::vector<double> e;
    for (int seed = 1; seed <= 5; ++seed)
      e.push_back(run_error(fmt::format("sparse.reformer(rounds=2,chunk={},seed={})", chunk, seed), prob, ref));
    med.push_back(median(e));
  }
  std::printf("reformer (N=512) chunk 16/64/256: median rel_fro_error %.3g %.3g %.3g\n", med[0], med[1], med[2]);
  EXPECT_LT(med[1], med[0]);
  EXPECT_LT(med[2], med[1]);
}

// Keys after row t's diagonal poisoned (K scaled by 1e3; V = 1e30): rows ≤ t are unchanged
// (problems large enough that the recursion gives blocks to the LSH attention).
TEST(SparseReformer, CausalNeverReadsFutureKeys) {
  for (Causal c : {Causal::kTopLeft, Causal::kBottomRight}) {
    RandomProblem prob(config(2, 2, 600, 700, 16, c, 10));
    test::expect_rows_ignore_future_keys("sparse.reformer(rounds=3,chunk=16,seed=2)", prob, 420);
  }
}

}  // namespace NUMATTN_UNITY_ID
}  // namespace
}  // namespace numattn
