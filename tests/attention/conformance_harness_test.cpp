// The conformance harness checked on methods whose defects are known: it must fail each one on
// the promise it breaks, and pass honest controls (an approximate method that keeps its
// contract, a randomized one measured as a median over seeds). Without these, a harness that
// checks nothing would look the same as one that works.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <memory>
#include <numeric>
#include <set>

#include "numattn/attention/registry.h"
#include "numattn/core/rng.h"
#include "support/conformance.h"

namespace numattn {
namespace {
namespace NUMATTN_UNITY_ID {

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

/// A method's MethodInfo, renamed into the test family.
MethodInfo renamed(const MethodInfo& base, const std::string& name) {
  MethodInfo m = base;
  m.name = "test." + name;
  m.family = "test";
  return m;
}

/// exact.naive with a defect applied after its forward pass.
enum class NaiveDefect { kNoise, kIgnoresCausal, kZeroesNonFinite };

class BrokenNaive final : public AttentionMethod {
 public:
  BrokenNaive(const MethodInfo* info, NaiveDefect d, double noise)
      : AttentionMethod(ParamValues()), info_(info), defect_(d), noise_(noise), inner_(create_method("exact.naive")) {}
  const MethodInfo& info() const override { return *info_; }
  void forward(const AttentionProblem& p, const ExecContext& ctx) const override {
    if (defect_ == NaiveDefect::kIgnoresCausal) {
      AttentionProblem blind = p;
      blind.causal = Causal::kNone;
      inner_->forward(blind, ctx);
      return;
    }
    inner_->forward(p, ctx);
    const CounterRng rng(7, 0);
    std::uint64_t n = 0;
    for (index_t b = 0; b < p.batch(); ++b)
      for (index_t h = 0; h < p.heads(); ++h)
        for (index_t i = 0; i < p.n_q(); ++i) {
          float* o = p.out.row(b, h, i);
          bool finite = true;
          for (index_t d = 0; d < p.d_v(); ++d, ++n) {
            if (defect_ == NaiveDefect::kNoise) o[d] *= static_cast<float>(1 + noise_ * (2 * rng.uniform(n) - 1));
            finite &= std::isfinite(o[d]);
          }
          if (defect_ == NaiveDefect::kZeroesNonFinite && (!finite || (!p.lse.empty() && std::isnan(p.lse(b, h, i, 0))))) {
            // The pre-hardening behaviour: a row that met NaN or overflow comes back empty.
            std::fill(o, o + p.d_v(), 0.f);
            if (!p.lse.empty()) p.lse(b, h, i, 0) = -std::numeric_limits<float>::infinity();
          }
        }
  }

 private:
  const MethodInfo* info_;
  NaiveDefect defect_;
  double noise_;
  std::unique_ptr<AttentionMethod> inner_;
};

test::MethodFactory naive_factory(const MethodInfo* info, NaiveDefect d, double noise = 0) {
  return [=](const std::string&) { return std::make_unique<BrokenNaive>(info, d, noise); };
}

/// Top-k attention in float64: each query attends to its k largest logits among the keys it
/// sees. Exact at k ≥ Nk; error falls as k grows. Defects break one promise each.
enum class TopKDefect { kNone, kLimitOffByOne, kInverted, kHidesNaN };

class TopK final : public AttentionMethod {
 public:
  TopK(ParamValues pv, const MethodInfo* info, TopKDefect d)
      : AttentionMethod(std::move(pv)), info_(info), defect_(d) {}
  const MethodInfo& info() const override { return *info_; }
  void forward(const AttentionProblem& p, const ExecContext& ctx) const override {
    const index_t k = params_.get_int("k");
    parallel_for(ctx, p.batch() * p.heads() * p.n_q(), [&](std::int64_t t) {
      const index_t i = t % p.n_q(), bh = t / p.n_q(), b = bh / p.heads(), h = bh % p.heads();
      row(p, k, b, h, i);
    });
  }

  static MethodInfo describe(const std::string& name) {
    MethodInfo m;
    m.name = "test." + name;
    m.family = "test";
    m.summary = "top-k attention in float64 (test fixture)";
    m.citation = "test fixture";
    m.time_complexity = m.memory_complexity = "O(Nk)";
    m.params = {{"k", ParamType::kInt, "16", 1, 1e6, {}, "keys kept per query"}};
    m.caps = {.exact = false, .causal = true, .gqa = true, .bool_mask = true, .additive_mask = true,
              .window = true, .lse = true};
    m.accuracy.max_rel_fro_error = [](const BudgetInput& in) {
      const double k = static_cast<double>(in.params.get_int("k")), nk = static_cast<double>(in.problem.n_kv());
      const double exact = exact_f32_tolerance(in.logit_magnitude).rel_fro_error;
      // Dropping keys can cost the whole output when the exact one averages many keys to
      // nearly zero: the bound grows with the fraction of keys dropped, not with 1 - k/Nk.
      return k >= nk ? exact : exact + 2 * std::sqrt(nk / k - 1);
    };
    m.accuracy.limit_case = [](const AttentionProblem& p) {
      return ParamOverrides{{"k", std::to_string(p.n_kv())}};
    };
    m.accuracy.convergence = {"k", true, [](const AttentionProblem& p) {
                                return std::vector<std::string>{"1", "4", "16", "64", std::to_string(p.n_kv())};
                              }};
    m.accuracy.samples = {{{"k", "5"}}};
    return m;
  }

 private:
  void row(const AttentionProblem& p, index_t k, index_t b, index_t h, index_t i) const {
    const index_t hk = h / p.group(), dv = p.d_v();
    float* o = p.out.row(b, h, i);
    const float* q = p.q.row(b, h, i);
    std::vector<std::pair<double, index_t>> keys;
    bool poison = false;
    const KeyRange r = p.key_range(i);
    for (index_t j = r.begin; j < r.end; ++j) {
      if (!p.visible(i, j)) continue;
      double s = 0;
      if (p.mask.kind == MaskKind::kAdditive) {
        const float a = p.mask.additive[i * p.mask.ld + j];
        if (!(a > -std::numeric_limits<float>::infinity())) continue;
        s = a;
      }
      double dot = 0;
      for (index_t d = 0; d < p.d_qk(); ++d) dot += static_cast<double>(q[d]) * p.k.row(b, hk, j)[d];
      s += p.effective_scale() * dot;
      bool finite = std::isfinite(s);
      for (index_t d = 0; d < dv; ++d) finite &= std::isfinite(p.v.row(b, hk, j)[d]);
      if (!finite) {
        if (defect_ == TopKDefect::kHidesNaN) continue;
        poison = true;
      }
      keys.push_back({s, j});
    }
    const auto n = static_cast<index_t>(keys.size());
    if (poison || n == 0) {
      std::fill(o, o + dv, poison ? static_cast<float>(kNaN) : 0.f);
      if (!p.lse.empty()) p.lse(b, h, i, 0) = poison ? static_cast<float>(kNaN) : -std::numeric_limits<float>::infinity();
      return;
    }
    index_t kk = std::min(k, n);
    if (defect_ == TopKDefect::kLimitOffByOne && k >= n && n > 1) kk = n - 1;
    if (defect_ == TopKDefect::kInverted) kk = std::clamp<index_t>(n - k + 1, 1, n);
    std::partial_sort(keys.begin(), keys.begin() + kk, keys.end(), std::greater<>());
    const double m = keys[0].first;
    std::vector<double> acc(static_cast<std::size_t>(dv), 0.0);
    double sum = 0;
    for (index_t t = 0; t < kk; ++t) {
      const double w = std::exp(keys[static_cast<std::size_t>(t)].first - m);
      sum += w;
      const float* v = p.v.row(b, hk, keys[static_cast<std::size_t>(t)].second);
      for (index_t d = 0; d < dv; ++d) acc[static_cast<std::size_t>(d)] += w * v[d];
    }
    for (index_t d = 0; d < dv; ++d) o[d] = static_cast<float>(acc[static_cast<std::size_t>(d)] / sum);
    if (!p.lse.empty()) p.lse(b, h, i, 0) = static_cast<float>(m + std::log(sum));
  }

  const MethodInfo* info_;
  TopKDefect defect_;
};

test::MethodFactory topk_factory(const MethodInfo* info, TopKDefect d) {
  return [=](const std::string& spec) {
    return std::make_unique<TopK>(bind_params(*info, parse_spec(spec).params), info, d);
  };
}

/// A randomized method: exact.naive plus seeded noise of relative size 0.01/√samples, except on
/// `bad_seeds`, where the noise is 0.3 whatever `samples` is (a rare bad draw).
class Jitter final : public AttentionMethod {
 public:
  Jitter(ParamValues pv, const MethodInfo* info, std::set<std::int64_t> bad_seeds)
      : AttentionMethod(std::move(pv)), info_(info), bad_(std::move(bad_seeds)), inner_(create_method("exact.naive")) {}
  const MethodInfo& info() const override { return *info_; }
  void forward(const AttentionProblem& p, const ExecContext& ctx) const override {
    inner_->forward(p, ctx);
    const std::int64_t seed = params_.get_int("seed");
    const double rel = bad_.count(seed) ? 0.3 : 0.01 / std::sqrt(static_cast<double>(params_.get_int("samples")));
    const CounterRng rng(static_cast<std::uint64_t>(seed), 1);
    std::uint64_t n = 0;
    for (index_t b = 0; b < p.batch(); ++b)
      for (index_t h = 0; h < p.heads(); ++h)
        for (index_t i = 0; i < p.n_q(); ++i)
          for (index_t d = 0; d < p.d_v(); ++d, ++n)
            p.out.row(b, h, i)[d] *= static_cast<float>(1 + rel * (2 * rng.uniform(n) - 1));
  }

  static MethodInfo describe() {
    MethodInfo m;
    m.name = "test.jitter";
    m.family = "test";
    m.summary = "exact attention plus seeded noise (test fixture)";
    m.citation = "test fixture";
    m.time_complexity = m.memory_complexity = "O(Nk)";
    m.params = {{"samples", ParamType::kInt, "16", 1, 4096, {}, "noise falls as 1/sqrt(samples)"},
                {"seed", ParamType::kInt, "0", 0, 1000, {}, "noise seed"}};
    m.caps = {.exact = false, .causal = true, .gqa = true, .bool_mask = true, .additive_mask = true,
              .window = true, .lse = true, .randomized = true};
    m.accuracy.max_rel_fro_error = [](const BudgetInput& in) {
      return exact_f32_tolerance(in.logit_magnitude).rel_fro_error +
             0.02 / std::sqrt(static_cast<double>(in.params.get_int("samples")));
    };
    m.accuracy.convergence = {"samples", true, [](const AttentionProblem&) {
                                return std::vector<std::string>{"1", "16", "256"};
                              }};
    m.accuracy.samples = {{{"samples", "3"}}};
    return m;
  }

 private:
  const MethodInfo* info_;
  std::set<std::int64_t> bad_;
  std::unique_ptr<AttentionMethod> inner_;
};

test::MethodFactory jitter_factory(const MethodInfo* info, std::set<std::int64_t> bad) {
  return [=](const std::string& spec) {
    return std::make_unique<Jitter>(bind_params(*info, parse_spec(spec).params), info, bad);
  };
}

const MethodInfo& naive_info() { return *find_method("exact.naive"); }

TEST(ConformanceHarness, FailsAnExactMethodWithNoise) {
  const MethodInfo info = renamed(naive_info(), "noisy");
  const auto v = test::check_budget(info, naive_factory(&info, NaiveDefect::kNoise, 1e-3), {2});
  EXPECT_TRUE(test::has_check(v, "budget")) << test::describe(v);
  EXPECT_TRUE(test::has_check(v, "exact")) << test::describe(v);
}

TEST(ConformanceHarness, PassesTheSameWrapperWithNoiseBelowRounding) {
  const MethodInfo info = renamed(naive_info(), "quiet");
  const auto v = test::check_budget(info, naive_factory(&info, NaiveDefect::kNoise, 1e-9), {2});
  EXPECT_TRUE(v.empty()) << test::describe(v);
}

TEST(ConformanceHarness, FailsAMethodThatIgnoresTheCausalMask) {
  const MethodInfo info = renamed(naive_info(), "causal_blind");
  const auto v = test::check_budget(info, naive_factory(&info, NaiveDefect::kIgnoresCausal), {1});
  EXPECT_TRUE(test::has_check(v, "budget")) << test::describe(v);
  // Only problems with a causal rule are wrong: the failures name them.
  for (const auto& x : v) EXPECT_EQ(x.where.find("'one key'"), std::string::npos) << x.where;
}

TEST(ConformanceHarness, FailsAMethodThatTurnsEdgesIntoEmptyRows) {
  // What exact.flash did before problem.h defined the edges: NaN input or overflow → zero row.
  const MethodInfo info = renamed(naive_info(), "zeroes");
  const auto v = test::check_hostile(info, naive_factory(&info, NaiveDefect::kZeroesNonFinite), {1});
  EXPECT_TRUE(test::has_check(v, "hostile")) << test::describe(v);
  bool overflow = false, nan_input = false;
  for (const auto& x : v) {
    overflow |= x.where.find("scale 1e38") != std::string::npos;
    nan_input |= x.where.find("nan at k[") != std::string::npos;
  }
  EXPECT_TRUE(overflow && nan_input) << test::describe(v);
}

TEST(ConformanceHarness, PassesAnApproximateMethodThatKeepsItsContract) {
  const MethodInfo info = TopK::describe("topk");
  const auto make = topk_factory(&info, TopKDefect::kNone);
  std::vector<test::Violation> v = test::check_declaration(info);
  for (const auto& part : {test::check_budget(info, make, {1, 3}), test::check_limit_case(info, make, {2}),
                           test::check_convergence(info, make), test::check_hostile(info, make, {2})})
    v.insert(v.end(), part.begin(), part.end());
  EXPECT_TRUE(v.empty()) << test::describe(v);
}

TEST(ConformanceHarness, FailsALimitCaseThatIsNotExact) {
  const MethodInfo info = TopK::describe("topk_off_by_one");
  const auto v = test::check_limit_case(info, topk_factory(&info, TopKDefect::kLimitOffByOne), {2});
  EXPECT_TRUE(test::has_check(v, "limit")) << test::describe(v);
}

TEST(ConformanceHarness, FailsErrorThatGrowsWithTheBudget) {
  const MethodInfo info = TopK::describe("topk_inverted");
  const auto v = test::check_convergence(info, topk_factory(&info, TopKDefect::kInverted));
  EXPECT_TRUE(test::has_check(v, "convergence")) << test::describe(v);
}

TEST(ConformanceHarness, FailsAMethodThatHidesNonFiniteInputs) {
  const MethodInfo info = TopK::describe("topk_hides_nan");
  const auto v = test::check_hostile(info, topk_factory(&info, TopKDefect::kHidesNaN), {2});
  EXPECT_TRUE(test::has_check(v, "hostile")) << test::describe(v);
}

TEST(ConformanceHarness, RandomizedMethodsAreHeldToTheMedianOverSeeds) {
  const MethodInfo info = Jitter::describe();
  // One bad seed in five: the median keeps the promise.
  auto v = test::check_budget(info, jitter_factory(&info, {3}), {1});
  auto c = test::check_convergence(info, jitter_factory(&info, {3}));
  v.insert(v.end(), c.begin(), c.end());
  EXPECT_TRUE(v.empty()) << test::describe(v);
  // Three in five: it does not.
  v = test::check_budget(info, jitter_factory(&info, {1, 2, 3}), {1});
  EXPECT_TRUE(test::has_check(v, "budget")) << test::describe(v);
}

TEST(ConformanceHarness, FailsAnIncompleteDeclaration) {
  MethodInfo info = TopK::describe("undeclared");
  info.accuracy = AccuracyContract();
  auto v = test::check_declaration(info);
  EXPECT_TRUE(test::has_check(v, "declaration")) << test::describe(v);
  EXPECT_NE(test::describe(v).find("no error budget"), std::string::npos);
  EXPECT_NE(test::describe(v).find("limit case or a convergence"), std::string::npos);
  EXPECT_NE(test::describe(v).find("non-default samples"), std::string::npos);
  info = Jitter::describe();
  info.params.pop_back();  // no seed
  v = test::check_declaration(info);
  EXPECT_NE(test::describe(v).find("'seed'"), std::string::npos) << test::describe(v);
}

TEST(ConformanceHarness, ParameterSetsReachEveryRangeEnd) {
  const auto sets = test::parameter_sets(*find_method("exact.flash"));
  auto has = [&](const std::string& k, const std::string& v) {
    return std::any_of(sets.begin(), sets.end(), [&](const ParamOverrides& s) {
      return std::find(s.begin(), s.end(), std::make_pair(k, v)) != s.end();
    });
  };
  EXPECT_TRUE(has("block_q", "1") && has("block_q", "4096") && has("block_k", "1") &&
              has("block_k", "65536") && has("split_kv", "1024"));
  EXPECT_TRUE(has("block_k", "7"));  // a declared sample
  EXPECT_EQ(test::spec_with(*find_method("exact.flash"), {{"block_k", "7"}}), "exact.flash(block_k=7)");
}

}  // namespace NUMATTN_UNITY_ID
}  // namespace
}  // namespace numattn
