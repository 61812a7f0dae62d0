// Registry-wide conformance: every registered method is held to its MethodInfo by the harness
// of tests/support/conformance.h — its declared error budget over a problem matrix with
// non-default parameters and 1, 2 and 3 threads, its limit case, its convergence parameter, the
// edge semantics of problem.h on hostile inputs — plus the canonical spec round trip, on the
// library's CPU path; the budget, limit case and edge semantics again on every other path this
// CPU runs (core/cpu.h). A new method is checked here by its line in methods.inc and its
// MethodInfo, nothing else.
#include <gtest/gtest.h>

#include <cstring>
#include <memory>
#include <ostream>

#include "numattn/attention/registry.h"
#include "numattn/core/cpu.h"
#include "numattn/core/exec.h"
#include "support/conformance.h"
#include "support/test_util.h"

namespace numattn {
namespace {
namespace NUMATTN_UNITY_ID {

std::vector<std::string> all_names() {
  std::vector<std::string> v;
  for (const MethodInfo* m : list_methods()) v.push_back(m->name);
  return v;
}

class Conformance : public ::testing::TestWithParam<std::string> {
 protected:
  const MethodInfo& info() const { return *find_method(GetParam()); }
};

TEST_P(Conformance, SpecRoundTrips) {
  auto m = create_method(GetParam());
  EXPECT_EQ(create_method(m->spec())->spec(), m->spec());
  const MethodInfo& info = m->info();
  EXPECT_EQ(info.name, GetParam());
  EXPECT_FALSE(info.family.empty());
  EXPECT_EQ(info.name.rfind(info.family + ".", 0), 0u) << "name must start with the family";
  EXPECT_FALSE(info.summary.empty());
  EXPECT_FALSE(info.citation.empty());
  EXPECT_FALSE(info.time_complexity.empty());
  EXPECT_FALSE(info.memory_complexity.empty());
  for (const ParamSpec& p : info.params) EXPECT_FALSE(p.doc.empty()) << p.name;
}

TEST_P(Conformance, DeclaresItsAccuracyContract) {
  const auto v = test::check_declaration(info());
  EXPECT_TRUE(v.empty()) << test::describe(v);
}

TEST_P(Conformance, KeepsItsBudgetOverTheMatrix) {
  const auto v = test::check_budget(info(), test::registry_factory());
  EXPECT_TRUE(v.empty()) << test::describe(v);
}

TEST_P(Conformance, IsExactInItsLimitCase) {
  const auto v = test::check_limit_case(info(), test::registry_factory());
  EXPECT_TRUE(v.empty()) << test::describe(v);
}

TEST_P(Conformance, ErrorFallsAsItsBudgetGrows) {
  const auto v = test::check_convergence(info(), test::registry_factory());
  EXPECT_TRUE(v.empty()) << test::describe(v);
}

TEST_P(Conformance, FollowsTheEdgeSemanticsOnHostileInputs) {
  const auto v = test::check_hostile(info(), test::registry_factory());
  EXPECT_TRUE(v.empty()) << test::describe(v);
}

TEST_P(Conformance, HonoursMasksThatVaryOverBatchAndHead) {
  const auto v = test::check_head_masks(info(), test::registry_factory());
  EXPECT_TRUE(v.empty()) << test::describe(v);
}

TEST_P(Conformance, ReadsHalfPrecisionQueriesAndWritesHalfPrecisionOutput) {
  const auto v = test::check_half_io(info(), test::registry_factory());
  EXPECT_TRUE(v.empty()) << test::describe(v);
}

TEST_P(Conformance, RefusesWhatItDoesNotClaim) {
  auto m = create_method(GetParam());
  const Capabilities& caps = m->info().caps;
  ProblemConfig cfg;
  cfg.heads = 4;
  cfg.kv_heads = 2;
  cfg.n = 8;
  cfg.d = 8;
  if (!caps.gqa) {
    RandomProblem a(cfg);
    EXPECT_FALSE(m->can_run(a.problem()).is_ok());
  }
  if (!m->runs_causal()) {  // neither its kernel nor the causal recursion (method.h)
    cfg.causal = Causal::kTopLeft;
    RandomProblem a(cfg);
    EXPECT_FALSE(m->can_run(a.problem()).is_ok());
  }
}

TEST_P(Conformance, RunsInsideAnOuterParallelLoop) {
  // A driver may call a method from inside its own parallel_for (over layers, heads, problems):
  // the method's loop then runs serially on the outer worker, whose thread_index() can exceed
  // the method's own thread count; its per-call scratch must still be in bounds and private
  // (core/exec.h worker_slot). Each outer item gets its own instance and problem; every output
  // must equal the same call made outside any loop, bit for bit.
  auto probe = create_method(GetParam());
  ProblemConfig cfg;
  cfg.heads = 2;
  cfg.n = 96;
  cfg.d = 16;
  cfg.want_lse = probe->info().caps.lse;
  {
    RandomProblem a(cfg);
    if (!probe->can_run(a.problem()).is_ok()) cfg.causal = Causal::kBottomRight;
  }
  RandomProblem solo(cfg);
  if (!probe->can_run(solo.problem()).is_ok()) GTEST_SKIP() << "runs neither a plain nor a causal problem";
  constexpr int kOuter = 4;
  for (const int inner : {1, 3}) {
    probe->run(solo.problem(), ExecContext{inner});
    const std::vector<float> want = solo.out_data();
    std::vector<std::unique_ptr<RandomProblem>> probs;
    std::vector<std::unique_ptr<AttentionMethod>> methods;
    for (int i = 0; i < kOuter; ++i) {
      probs.push_back(std::make_unique<RandomProblem>(cfg));
      methods.push_back(create_method(GetParam()));
    }
    parallel_for(ExecContext{2}, kOuter, [&](std::int64_t i) {
      methods[static_cast<std::size_t>(i)]->run(probs[static_cast<std::size_t>(i)]->problem(), ExecContext{inner});
    });
    for (int i = 0; i < kOuter; ++i) {
      const std::vector<float>& got = probs[static_cast<std::size_t>(i)]->out_data();
      ASSERT_EQ(got.size(), want.size());
      EXPECT_EQ(std::memcmp(got.data(), want.data(), want.size() * sizeof(float)), 0)
          << "outer item " << i << ", inner threads " << inner;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Registry, Conformance, ::testing::ValuesIn(all_names()),
                         [](const auto& info) {
                           std::string s = info.param;
                           for (char& c : s)
                             if (!std::isalnum(static_cast<unsigned char>(c))) c = '_';
                           return s;
                         });

// The same method on every other instruction-set path this CPU runs: the attention kernels have
// portable, avx2 and avx512 variants (avx512vnni runs avx512's), and each is held to the
// method's budget, limit case and edge semantics, masks varying over (b, h) and half-precision Q and
// output where it runs.
struct PathCase {
  std::string method;
  CpuPath path;
};

void PrintTo(const PathCase& c, std::ostream* os) { *os << c.method << " on " << cpu_path_name(c.path); }

std::vector<PathCase> other_path_cases() {
  std::vector<PathCase> v;
  const CpuPath own = family_path(default_cpu_path(), CpuPath::kAvx512);
  for (CpuPath p : runnable_cpu_paths()) {
    if (p == CpuPath::kAvx512Vnni || p == own) continue;
    for (const std::string& name : all_names()) v.push_back({name, p});
  }
  return v;
}

class ConformanceOnPath : public ::testing::TestWithParam<PathCase> {};

TEST_P(ConformanceOnPath, KeepsItsBudgetLimitCaseAndEdgeSemantics) {
  const CpuPathScope scope(GetParam().path);
  const MethodInfo& info = *find_method(GetParam().method);
  auto v = test::check_budget(info, test::registry_factory());
  EXPECT_TRUE(v.empty()) << test::describe(v);
  v = test::check_limit_case(info, test::registry_factory());
  EXPECT_TRUE(v.empty()) << test::describe(v);
  v = test::check_hostile(info, test::registry_factory());
  EXPECT_TRUE(v.empty()) << test::describe(v);
  v = test::check_head_masks(info, test::registry_factory(), {2});
  EXPECT_TRUE(v.empty()) << test::describe(v);
  v = test::check_half_io(info, test::registry_factory(), {2});
  EXPECT_TRUE(v.empty()) << test::describe(v);
}

GTEST_ALLOW_UNINSTANTIATED_PARAMETERIZED_TEST(ConformanceOnPath);
INSTANTIATE_TEST_SUITE_P(OtherPaths, ConformanceOnPath, ::testing::ValuesIn(other_path_cases()),
                         [](const auto& info) {
                           std::string s = info.param.method + "_" + cpu_path_name(info.param.path);
                           for (char& c : s)
                             if (!std::isalnum(static_cast<unsigned char>(c))) c = '_';
                           return s;
                         });

TEST(Spec, ParsesAndCanonicalises) {
  auto ps = parse_spec(" exact.flash ( block_q = 32 , block_k=128 ) ");
  EXPECT_EQ(ps.name, "exact.flash");
  ASSERT_EQ(ps.params.size(), 2u);
  EXPECT_EQ(ps.params[0].first, "block_q");
  EXPECT_EQ(ps.params[0].second, "32");
  auto m = create_method("exact.flash(block_k=128,block_q=32)");
  EXPECT_EQ(m->spec(), create_method("exact.flash( block_q=32, block_k=128 )")->spec());
  EXPECT_EQ(create_method("exact.naive")->spec(), "exact.naive");
  EXPECT_EQ(create_method("exact.naive()")->spec(), "exact.naive");
}

std::string error_of(const std::string& spec) {
  try {
    create_method(spec);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(Spec, ErrorsNameTheProblemAndListValidKeys) {
  EXPECT_NE(error_of("exact.flash(blockq=3)").find("valid keys of exact.flash: block_q"), std::string::npos);
  EXPECT_NE(error_of("exact.flash(block_q=0)").find("out of range"), std::string::npos);
  EXPECT_NE(error_of("exact.flash(block_q=abc)").find("not an integer"), std::string::npos);
  EXPECT_NE(error_of("exact.flash(block_q=4.5)").find("not an integer"), std::string::npos);
  EXPECT_NE(error_of("exact.flash(block_q=4,block_q=5)").find("given twice"), std::string::npos);
  EXPECT_NE(error_of("exact.flash(block_q)").find("key=value"), std::string::npos);
  EXPECT_NE(error_of("exact.flash(block_q=4").find("missing closing"), std::string::npos);
  EXPECT_NE(error_of("exact.nope").find("registered: exact.reference"), std::string::npos);
  EXPECT_NE(error_of("flash").find("family.name"), std::string::npos);
  EXPECT_NE(error_of("").find("empty"), std::string::npos);
  EXPECT_NE(error_of("exact.naive(x=1)").find("takes no parameters"), std::string::npos);
}

TEST(Problem, ValidateRejectsInconsistentShapes) {
  ProblemConfig cfg;
  cfg.heads = 4;
  cfg.n = 8;
  cfg.d = 8;
  RandomProblem a(cfg);
  AttentionProblem p = a.problem();
  p.k.shape[3] = 7;
  EXPECT_THROW(validate(p), Error);
  p = a.problem();
  p.k.shape[1] = 3;  // 4 % 3 != 0
  p.v.shape[1] = 3;
  EXPECT_THROW(validate(p), Error);
  p = a.problem();
  p.out.shape[3] = 9;
  EXPECT_THROW(validate(p), Error);
  p = a.problem();
  p.q.stride[3] = 2;
  EXPECT_THROW(validate(p), Error);
  EXPECT_THROW(create_method("exact.flash")->run(p, ExecContext{1}), Error);
}

TEST(Problem, KeyRangesFollowTheConventions) {
  AttentionProblem p;
  float dummy = 0;
  p.q = TensorView<const float>(&dummy, {1, 1, 3, 1}, {3, 3, 1, 1});
  p.k = TensorView<const float>(&dummy, {1, 1, 5, 1}, {5, 5, 1, 1});
  p.causal = Causal::kTopLeft;
  EXPECT_EQ(p.key_range(0).end, 1);
  EXPECT_EQ(p.key_range(2).end, 3);
  p.causal = Causal::kBottomRight;
  EXPECT_EQ(p.key_range(0).end, 3);
  EXPECT_EQ(p.key_range(2).end, 5);
  p.window_left = 1;
  EXPECT_EQ(p.key_range(2).begin, 3);
  p.causal = Causal::kNone;
  p.window_left = 0;
  p.window_right = 0;
  EXPECT_EQ(p.key_range(1).begin, 1);
  EXPECT_EQ(p.key_range(1).end, 2);
}

}  // namespace NUMATTN_UNITY_ID
}  // namespace
}  // namespace numattn
