// The a-posteriori error estimate (analysis/estimate.h): the t quantile, the stratified design,
// the ratio estimator and its bound on outputs whose true error is known exactly (computed over
// every row in float64 here), its edges; and the selection built on it (advise.h, auto.select).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <map>
#include <set>
#include <vector>

#include "analysis/auto_select.h"
#include "numattn/analysis/advise.h"
#include "numattn/analysis/estimate.h"
#include "numattn/analysis/metrics.h"
#include "numattn/attention/random_problem.h"
#include "numattn/attention/reference.h"
#include "numattn/attention/registry.h"
#include "numattn/core/rng.h"
#include "numattn/model/llama.h"
#include "support/tiny_llama.h"

namespace numattn {
namespace {
namespace NUMATTN_UNITY_ID {

bool quick() { return std::getenv("NUMATTN_TEST_QUICK") != nullptr; }

ProblemConfig config(index_t heads, index_t n, Causal c, std::uint64_t seed, Dist dist = Dist::kGaussian) {
  ProblemConfig cfg;
  cfg.heads = heads;
  cfg.kv_heads = heads > 1 ? heads / 2 : 1;
  cfg.n = n;
  cfg.d = 16;
  cfg.causal = c;
  cfg.seed = seed;
  cfg.dist = dist;
  cfg.want_lse = false;
  return cfg;
}

// The true relative Frobenius error of p.out over every row.
double true_error(const AttentionProblem& p) {
  return compare_with_reference(p, reference_all(p, ExecContext{1})).rel_fro_error;
}

TEST(StudentT, QuantilesMatchTables) {
  // Values from standard tables (e.g. Abramowitz & Stegun table 26.10), to 6 digits.
  EXPECT_NEAR(student_t_quantile(0.95, 1), 6.313752, 1e-5);
  EXPECT_NEAR(student_t_quantile(0.95, 2), 2.919986, 1e-5);
  EXPECT_NEAR(student_t_quantile(0.95, 3), 2.353363, 1e-5);
  EXPECT_NEAR(student_t_quantile(0.95, 10), 1.812461, 1e-5);
  EXPECT_NEAR(student_t_quantile(0.975, 30), 2.042272, 1e-5);
  EXPECT_NEAR(student_t_quantile(0.95, 31), 1.695519, 1e-5);
  EXPECT_NEAR(student_t_quantile(0.95, 2000), 1.645616, 1e-4);
  EXPECT_NEAR(student_t_quantile(0.05, 10), -1.812461, 1e-5);
  EXPECT_THROW(student_t_quantile(1.0, 3), Error);
  EXPECT_THROW(student_t_quantile(0.9, 0), Error);
}

TEST(StratifiedRows, CoverHeadsAndPositionsWithWeightsSummingToTheRows) {
  RandomProblem prob(config(4, 100, Causal::kNone, 1));
  const AttentionProblem& p = prob.problem();
  for (index_t m : {1, 3, 4, 10, 32, 399}) {
    const auto d = stratified_rows(p, m, 7);
    ASSERT_EQ(static_cast<index_t>(d.size()), m);
    double w = 0;
    std::set<std::tuple<index_t, index_t, index_t>> seen;
    std::set<index_t> heads;
    for (const WeightedRow& r : d) {
      w += r.weight;
      seen.insert({r.row.b, r.row.h, r.row.i});
      heads.insert(r.row.h);
    }
    EXPECT_EQ(static_cast<index_t>(seen.size()), m) << "rows are distinct";
    EXPECT_EQ(static_cast<index_t>(heads.size()), std::min<index_t>(m, 4)) << "every head once m >= heads";
    if (m >= 4) {
      EXPECT_NEAR(w, 400.0, 1e-9) << m;
    }  // Σ segment sizes = every row
    // The same seed, the same design.
    const auto again = stratified_rows(p, m, 7);
    for (std::size_t k = 0; k < d.size(); ++k) EXPECT_EQ(d[k].row.i, again[k].row.i);
  }
  // 32 rows over 4 heads: 8 per head, one in each eighth of the positions.
  const auto d = stratified_rows(p, 32, 3);
  for (index_t h = 0; h < 4; ++h) {
    std::vector<index_t> rows;
    for (const WeightedRow& r : d)
      if (r.row.h == h) rows.push_back(r.row.i);
    ASSERT_EQ(rows.size(), 8u);
    for (std::size_t j = 0; j < 8; ++j) {
      EXPECT_GE(rows[j], static_cast<index_t>(j) * 100 / 8);
      EXPECT_LT(rows[j], static_cast<index_t>(j + 1) * 100 / 8);
    }
  }
  EXPECT_EQ(stratified_rows(p, 5000, 1).size(), 400u);  // more than there are: every row once
}

// An output with a known error: the exact result plus noise whose size varies by row (a
// heavy-ish tail: a few rows carry much of the error), so the error is known exactly.
struct Perturbed {
  double truth;
};
Perturbed perturb(AttentionProblem& p, std::uint64_t seed, double scale) {
  const ReferenceRows ref = reference_all(p, ExecContext{1});
  const CounterRng rng(seed, 99);
  std::uint64_t c = 0;
  double num = 0, den = 0;
  std::size_t t = 0;
  for (index_t b = 0; b < p.batch(); ++b)
    for (index_t h = 0; h < p.heads(); ++h)
      for (index_t i = 0; i < p.n_q(); ++i, ++t) {
        // Row scale: log-normal (σ = 0.5), so some rows carry several times the error of others.
        const double rs = scale * std::exp(0.5 * rng.normal(c++));
        float* o = p.out.row(b, h, i);
        for (index_t d = 0; d < p.d_v(); ++d) {
          const double y = ref.out[t * static_cast<std::size_t>(p.d_v()) + static_cast<std::size_t>(d)];
          o[d] = static_cast<float>(y + rs * rng.normal(c++));
          const double e = static_cast<double>(o[d]) - y;
          num += e * e;
          den += y * y;
        }
      }
  return {std::sqrt(num / den)};
}

TEST(ErrorEstimate, BoundCoversAndEstimateIsCloseOnKnownErrors) {
  const int trials = quick() ? 20 : 60;
  int covered = 0, close = 0;
  for (int s = 0; s < trials; ++s) {
    RandomProblem prob(config(4, 256, s % 2 ? Causal::kBottomRight : Causal::kNone, 100 + s));
    AttentionProblem& p = prob.problem();
    const double truth = perturb(p, 1000 + s, 1e-3).truth;
    const ErrorEstimate e = estimate_error(p, {32, 0.95, static_cast<std::uint64_t>(s)}, ExecContext{1});
    // 32 rows, 8 per head; under a causal rule also the refinement of each head's first segment.
    if (s % 2) {
      EXPECT_GT(e.rows, 32);
    } else {
      EXPECT_EQ(e.rows, 32);
    }
    EXPECT_GE(e.rel_error_hi, e.rel_error);
    covered += truth <= e.rel_error_hi;
    close += e.rel_error <= 2 * truth && truth <= 2 * e.rel_error;
  }
  // A 95% bound: far below 90% coverage over 100 problems would mean the statistic is wrong.
  EXPECT_GE(covered, trials * 85 / 100) << covered << "/" << trials;
  EXPECT_GE(close, trials * 90 / 100) << close << "/" << trials;
}

// A method wrong on few rows: the exact output plus noise only on the rows that see fewer than
// 16 keys (as a top-k or low-rank method is wrong where the visible keys are few against its
// budget), or only on one head with a heavy-tailed row scale.
double perturb_rows(AttentionProblem& p, std::uint64_t seed, bool early_rows) {
  const ReferenceRows ref = reference_all(p, ExecContext{1});
  const CounterRng rng(seed, 77);
  std::uint64_t c = 0;
  double num = 0, den = 0;
  std::size_t t = 0;
  for (index_t b = 0; b < p.batch(); ++b)
    for (index_t h = 0; h < p.heads(); ++h)
      for (index_t i = 0; i < p.n_q(); ++i, ++t) {
        const KeyRange kr = p.key_range(i);
        const bool wrong = early_rows ? kr.end - kr.begin < 16 : h == 1;
        const double rs = wrong ? 0.3 * std::exp(0.5 * rng.normal(c++)) : 0.0;
        float* o = p.out.row(b, h, i);
        for (index_t d = 0; d < p.d_v(); ++d) {
          const double y = ref.out[t * static_cast<std::size_t>(p.d_v()) + static_cast<std::size_t>(d)];
          o[d] = static_cast<float>(y + rs * rng.normal(c++));
          num += (static_cast<double>(o[d]) - y) * (static_cast<double>(o[d]) - y);
          den += y * y;
        }
      }
  return std::sqrt(num / den);
}

TEST(ErrorEstimate, CoversErrorsConcentratedInFewRows) {
  const int trials = quick() ? 16 : 40;
  for (const bool early : {true, false}) {
    int covered = 0, close = 0;
    for (int s = 0; s < trials; ++s) {
      // Errors in the first 15 rows of 512 (3% of them) under a causal rule; or in one head of 4.
      RandomProblem prob(config(4, 512, early ? Causal::kBottomRight : Causal::kNone, 300 + s));
      AttentionProblem& p = prob.problem();
      const double truth = perturb_rows(p, 500 + s, early);
      const ErrorEstimate e = estimate_error(p, {0, 0.95, static_cast<std::uint64_t>(s)}, ExecContext{1});
      if (early) {
        // The design splits the first segment where the visible keys double: the 15 rows are
        // seen in every head (rows 0, 1, 2–3, 4–7, 8–15 are segments of their own).
        EXPECT_GE(e.rows, auto_estimate_rows(p) + 4 * 4);
      }
      covered += truth <= e.rel_error_hi;
      close += e.rel_error <= 2 * truth && truth <= 2 * e.rel_error;
    }
    // A 95% bound on a heavy-tailed few-row error: 85% of 40 is what it reaches; a design that
    // missed the early rows covers in under half of the runs.
    EXPECT_GE(covered, trials * 80 / 100) << (early ? "early rows " : "one head ") << covered << "/" << trials;
    EXPECT_GE(close, trials * 90 / 100) << (early ? "early rows " : "one head ") << close << "/" << trials;
  }
}

TEST(ErrorEstimate, FiellerBoundIsInfiniteWhenTheNormIsInOneRow) {
  // One sampled row holds all of ‖O‖²: the denominator's own uncertainty is as large as itself,
  // and no finite bound holds at level 0.95 (the linearised bound would have been finite).
  std::vector<double> e(40, 1e-4), n(40, 0.0), w(40, 10.0);
  n[7] = 1e6;
  const ErrorEstimate r = ratio_estimate(e, n, w, 400, 0.95);
  EXPECT_TRUE(std::isfinite(r.rel_error));
  EXPECT_TRUE(std::isinf(r.rel_error_hi));
  // Evenly spread norms and errors: a finite bound just above the estimate.
  std::fill(n.begin(), n.end(), 1.0);
  const ErrorEstimate even = ratio_estimate(e, n, w, 400, 0.95);
  EXPECT_NEAR(even.rel_error, 1e-2, 1e-12);
  EXPECT_NEAR(even.rel_error_hi, 1e-2, 1e-9);
}

TEST(ErrorEstimate, OnRealApproximationsAgainstTheFullCheck) {
  const ExecContext ctx{2};
  int covered = 0, close = 0, total = 0;
  for (const char* spec : {"sparse.window(left=32,right=32,sinks=2)", "lowrank.nystrom(landmarks=16)",
                           "sparse.topk(k=16)", "kernel.performer(features=64)"}) {
    for (std::uint64_t seed = 0; seed < (quick() ? 2u : 5u); ++seed) {
      RandomProblem prob(config(4, 200, seed % 2 ? Causal::kBottomRight : Causal::kNone, seed,
                                seed % 3 == 2 ? Dist::kSpiky : Dist::kGaussian));
      const auto m = create_method(spec);
      if (!m->can_run(prob.problem()).is_ok()) continue;
      m->run(prob.problem(), ctx);
      const double truth = true_error(prob.problem());
      const ErrorEstimate e = estimate_error(prob.problem(), {32, 0.95, seed}, ctx);
      ++total;
      covered += truth <= e.rel_error_hi;
      close += e.rel_error <= 2 * truth && truth <= 2 * e.rel_error;
    }
  }
  ASSERT_GT(total, 0);
  EXPECT_GE(covered, total * 8 / 10) << covered << "/" << total;
  EXPECT_GE(close, total * 8 / 10) << close << "/" << total;
}

TEST(ErrorEstimate, Edges) {
  const ExecContext ctx{1};
  RandomProblem prob(config(2, 40, Causal::kNone, 5));
  AttentionProblem& p = prob.problem();
  const double truth = perturb(p, 3, 1e-2).truth;
  // Every row computed: the estimate is the truth and the bound equals it.
  const ErrorEstimate all = estimate_error(p, {80, 0.95, 0}, ctx);
  EXPECT_NEAR(all.rel_error, truth, 1e-12 * truth);
  EXPECT_EQ(all.rel_error_hi, all.rel_error);
  // One row: no variance estimate, an infinite bound.
  const ErrorEstimate one = estimate_error(p, {1, 0.95, 0}, ctx);
  EXPECT_TRUE(std::isfinite(one.rel_error));
  EXPECT_TRUE(std::isinf(one.rel_error_hi));
  // An exact output: zero and zero.
  create_method("exact.reference")->run(p, ctx);
  const ErrorEstimate zero = estimate_error(p, {8, 0.95, 0}, ctx);
  EXPECT_LT(zero.rel_error, 1e-7);
  EXPECT_LT(zero.rel_error_hi, 1e-6);
  // A non-finite output row: NaN, not a number that looks like an answer.
  p.out.row(0, 0, 0)[0] = std::nanf("");
  const ErrorEstimate bad = estimate_error(p, {80, 0.95, 0}, ctx);
  EXPECT_TRUE(std::isnan(bad.rel_error) && std::isnan(bad.rel_error_hi));
  EXPECT_THROW(estimate_error(p, {-1, 0.95, 0}, ctx), Error);
  // 0 rows: the automatic size, max(32, sqrt(B·Hq·Nq)) = 32 here (80 rows: every row).
  EXPECT_EQ(estimate_error(p, {0, 0.95, 0}, ctx).rows, 32);
  EXPECT_THROW(estimate_error(p, {8, 1.5, 0}, ctx), Error);
}

TEST(ErrorEstimate, HugeLogitsAndOddSizes) {
  // Logits ×100 (one key dominates each row) and odd sizes: an exact output estimates to ~0 with a
  // finite bound; the design never repeats a row.
  for (const index_t n : {1, 2, 17, 301}) {
    ProblemConfig cfg = config(3, n, Causal::kBottomRight, 11);
    cfg.kv_heads = 1;
    cfg.logit_scale = 100;
    RandomProblem prob(cfg);
    AttentionProblem& p = prob.problem();
    create_method("exact.flash")->run(p, ExecContext{1});
    const ErrorEstimate e = estimate_error(p, {0, 0.95, 3}, ExecContext{1});
    EXPECT_LT(e.rel_error, 1e-5) << n;
    EXPECT_LT(e.rel_error_hi, 1e-4) << n;
    const auto d = stratified_rows(p, 0, 3);
    std::set<std::tuple<index_t, index_t, index_t>> seen;
    for (const WeightedRow& r : d) seen.insert({r.row.b, r.row.h, r.row.i});
    EXPECT_EQ(seen.size(), d.size()) << n;
  }
}

TEST(ErrorEstimate, FullyMaskedAndZeroRows) {
  // Rows with no visible key have a zero reference: counted in the numerator only.
  const std::vector<double> e{0, 1e-6, 4e-6, 0}, n{0, 1, 1, 0}, w{1, 1, 1, 1};
  const ErrorEstimate r = ratio_estimate(e, n, w, 100, 0.95);
  EXPECT_EQ(r.zero_norm_rows, 2);
  EXPECT_NEAR(r.rel_error, std::sqrt(5e-6 / 2), 1e-15);
  EXPECT_GT(r.rel_error_hi, r.rel_error);
  // Every sampled reference zero: 0 without error, +inf with.
  const std::vector<double> z{0, 0}, some{0, 1e-3};
  EXPECT_EQ(ratio_estimate(z, z, std::vector<double>{1, 1}, 10, 0.95).rel_error, 0.0);
  EXPECT_TRUE(std::isinf(ratio_estimate(some, z, std::vector<double>{1, 1}, 10, 0.95).rel_error));
  // A boolean mask that hides every key from some rows: the method returns zeros there.
  ProblemConfig cfg = config(2, 64, Causal::kNone, 9);
  RandomProblem prob(cfg);
  AttentionProblem& p = prob.problem();
  std::vector<std::uint8_t> mask(64 * 64, 1);
  for (index_t i = 0; i < 64; i += 2)
    for (index_t j = 0; j < 64; ++j) mask[static_cast<std::size_t>(i * 64 + j)] = 0;
  p.mask = {MaskKind::kBool, mask.data(), nullptr, 64};
  create_method("exact.flash")->run(p, ExecContext{1});
  const ErrorEstimate m = estimate_error(p, {32, 0.95, 1}, ExecContext{1});
  EXPECT_GT(m.zero_norm_rows, 0);
  EXPECT_LT(m.rel_error, 1e-5);
}

TEST(Advise, ReportsExactInDisguiseAndPicksOnlyWhatMeetsTheTolerance) {
  RandomProblem prob(config(4, 256, Causal::kBottomRight, 3));
  AttentionProblem& p = prob.problem();
  AdviseOptions opt;
  opt.tol = 0.05;
  opt.reps = 1;
  opt.methods = {"sparse.window", "sparse.topk", "lowrank.nystrom"};
  const Advice a = advise(p, opt, ExecContext{2});
  EXPECT_EQ(a.baseline.status, "ok");
  EXPECT_GT(a.baseline.seconds, 0);
  bool disguised = false;
  for (const AdviseCandidate& c : a.candidates) {
    // The default window (256 keys on each side) covers every key a causal row of 256 sees: exact
    // softmax, measured, never an approximation.
    if (c.spec.rfind("sparse.window(left=256,", 0) == 0) {
      EXPECT_EQ(c.kind, "exact") << c.status;
      disguised = true;
    }
    if (c.meets) {
      EXPECT_EQ(c.kind, "approximate");
      EXPECT_LE(c.estimate.rel_error_hi, opt.tol);
      EXPECT_LT(c.seconds, a.baseline.seconds);
    }
  }
  EXPECT_TRUE(disguised);
  if (const AdviseCandidate* c = a.chosen()) {
    // The choice is the fastest that meets the tolerance, and its true error is near its estimate.
    for (const AdviseCandidate& x : a.candidates)
      if (x.meets) {
        EXPECT_LE(c->seconds, x.seconds);
      }
    create_method(c->spec)->run(p, ExecContext{2});
    EXPECT_LE(true_error(p), 4 * opt.tol);
  }
  // clusters=0 is "automatic", not the one-cluster limit case; clusters=1 is exact.
  RandomProblem nc(config(4, 128, Causal::kNone, 5));
  EXPECT_EQ(exact_in_disguise(*create_method("sparse.routing(clusters=0)"), nc.problem()), "");
  EXPECT_NE(exact_in_disguise(*create_method("sparse.window(left=256,right=256)"), nc.problem()), "");
  EXPECT_NE(exact_in_disguise(*create_method("sparse.routing(clusters=1)"), nc.problem()), "");
  // Tolerance 0: nothing approximate can promise it.
  opt.tol = 0;
  EXPECT_EQ(advise(p, opt, ExecContext{2}).chosen(), nullptr);
  opt.tol = -1;
  EXPECT_THROW(advise(p, opt, ExecContext{2}), Error);
}

// The left of a window probed by advise, from its spec.
index_t left_of(const std::string& spec) {
  const auto params = parse_spec(spec).params;
  for (const auto& [k, v] : params)
    if (k == "left") return std::stoll(v);
  return -1;
}

TEST(Advise, BudgetLaddersFollowTheConvergenceParameter) {
  // sparse.window on a causal problem: the error falls as `left` grows (the missing keys of each
  // row), exact from left = N - 1. The ladder is 1, 2, 4, ..., 512 (below the limit Nq + Nk).
  RandomProblem prob(config(4, 1024, Causal::kBottomRight, 21));
  AttentionProblem& p = prob.problem();
  const auto ladder = budget_ladder(*find_method("sparse.window"), p);
  ASSERT_EQ(ladder.size(), 11u);
  EXPECT_EQ(left_of(ladder.front()), 1);
  EXPECT_EQ(left_of(ladder.back()), 1024);
  EXPECT_TRUE(budget_ladder(*find_method("kernel.linear"), p).empty()) << "another target: defaults only";
  // Methods whose error falls as the parameter shrinks: the ladder runs downwards.
  const auto clusters = budget_ladder(*find_method("sparse.smyrf"), p);
  ASSERT_GE(clusters.size(), 2u);
  EXPECT_NE(clusters.front().find("clusters=1024"), std::string::npos) << clusters.front();
  EXPECT_NE(clusters.back().find("clusters=2"), std::string::npos) << clusters.back();

  // advise probes only the default and ladder values.
  AdviseOptions opt;
  opt.tol = 0.3;
  opt.reps = 1;
  opt.methods = {"sparse.window"};
  const Advice a = advise(p, opt, ExecContext{2});
  ASSERT_FALSE(a.candidates.empty());
  for (const AdviseCandidate& c : a.candidates)
    EXPECT_TRUE(c.spec == create_method("sparse.window")->spec() ||
                std::find(ladder.begin(), ladder.end(), c.spec) != ladder.end())
        << c.spec;
}

TEST(Advise, BudgetSearchFindsTheCheapestValueOnAKnownErrorCurve) {
  // A fake method family with error 2^-i at ladder index i: with tol 0.01 the answer is i = 7.
  const std::size_t n = 11;
  std::vector<std::size_t> probed;
  auto curve = [&](std::size_t slow_from) {
    return [&probed, slow_from](std::size_t i) {
      probed.push_back(i);
      return BudgetProbe{true, std::ldexp(1.0, -static_cast<int>(i)) <= 0.01, i >= slow_from};
    };
  };
  EXPECT_EQ(search_budget(0, n, n, 8, curve(n)), 7u);
  EXPECT_LE(probed.size(), 4u) << "bisection: ceil(log2(12)) probes";
  EXPECT_NE(std::find(probed.begin(), probed.end(), 6u), probed.end()) << "the cheaper neighbour was tried";
  // Bracketed by a default that meets the tolerance (index 9), or one that does not (index 3).
  probed.clear();
  EXPECT_EQ(search_budget(0, 9, n, 8, curve(n)), 7u);
  probed.clear();
  EXPECT_EQ(search_budget(4, n, n, 8, curve(n)), 7u);
  // Every value from index 5 on is slower than exact: the search stops there without an answer.
  probed.clear();
  EXPECT_EQ(search_budget(0, n, n, 8, curve(5)), n);
  // Out of probes: the best bracket so far; a probe that cannot run ends the search.
  probed.clear();
  EXPECT_EQ(search_budget(0, n, n, 1, curve(n)), n);  // index 5 misses; nothing known accurate
  EXPECT_EQ(search_budget(0, n, n, 8, [](std::size_t) { return BudgetProbe{false, false, false}; }), n);
  EXPECT_THROW(search_budget(5, 3, n, 8, curve(n)), Error);
}

TEST(AutoSelect, SpecAliasAndToleranceZeroPicksExact) {
  auto m = create_method("auto(tol=0)");
  EXPECT_EQ(m->spec(), "auto.select(tol=0,rows=0,reps=3)");
  EXPECT_EQ(create_method(m->spec())->spec(), m->spec());
  RandomProblem prob(config(4, 128, Causal::kBottomRight, 4));
  m->run(prob.problem(), ExecContext{2});
  EXPECT_LT(true_error(prob.problem()), 1e-5);
  EXPECT_THROW(create_method("auto(tol=-1)"), Error);
}

TEST(AutoSelect, PicksOncePerShapeAndMeetsItsBudget) {
  RandomProblem prob(config(2, 128, Causal::kBottomRight, 8));
  auto m = create_method("auto(tol=0.05,reps=1)");
  const ExecContext ctx{2};
  // Before the selection: at least the largest candidate's workspace (the selection runs them).
  std::size_t most = 0;
  for (const std::string& spec : advise_candidates(prob.problem(), AdviseOptions{}))
    if (const auto c = create_method(spec); c->can_run(prob.problem()).is_ok())
      most = std::max(most, c->workspace_bytes(prob.problem(), ctx));
  EXPECT_GT(most, 0u);
  EXPECT_GE(m->workspace_bytes(prob.problem(), ctx), most);
  m->run(prob.problem(), ctx);
  EXPECT_LE(true_error(prob.problem()), 4 * 0.05);
  // After it: exactly the chosen method's.
  const auto& sel = dynamic_cast<const AutoSelectAttention&>(*m);
  EXPECT_EQ(m->workspace_bytes(prob.problem(), ctx),
            sel.choose(prob.problem(), ctx)->workspace_bytes(prob.problem(), ctx));
  // Same shape again: the remembered choice (no second selection).
  m->run(prob.problem(), ExecContext{2});
  EXPECT_LE(true_error(prob.problem()), 4 * 0.05);
}

TEST(AutoSelect, InAModelEveryLayerHasItsOwnInstanceAndToleranceZeroIsExact) {
  const test::TinyTensors T = test::make_tiny(false);
  const LlamaModel m = LlamaModel::load(test::write_gguf(T, "tiny_auto.gguf"), ExecContext{2});
  const auto n_layer = m.hparams().n_layer;
  ForwardOptions a, e;
  a.attention = make_attention_methods("auto(tol=0)", n_layer);
  e.attention = make_attention_methods("exact.flash", n_layer);
  ASSERT_EQ(static_cast<std::int64_t>(a.attention.size()), n_layer);
  EXPECT_NE(a.attention[0].get(), a.attention[1].get()) << "one instance per layer";
  EXPECT_EQ(attention_spec(a.attention), "auto.select(tol=0,rows=0,reps=3)");
  std::vector<std::int32_t> toks;
  for (int t = 0; t < 24; ++t) toks.push_back((t * 7 + 3) % 64);
  KvCache ca = m.make_cache(24), ce = m.make_cache(24);
  const std::vector<float> la = m.forward(toks, ca, ExecContext{2}, a), le = m.forward(toks, ce, ExecContext{2}, e);
  ASSERT_EQ(la.size(), le.size());
  for (std::size_t v = 0; v < la.size(); ++v) ASSERT_EQ(la[v], le[v]) << v;
}

}  // namespace NUMATTN_UNITY_ID
}  // namespace
}  // namespace numattn
