// Registry-wide conformance: every registered method, on a list of problems, either refuses
// through can_run with a reason or runs and satisfies the contract: finite output, canonical
// spec round trip, bitwise determinism at a fixed thread count (when it claims it), declared
// workspace, and — for exact methods — the float64 reference within docs/numerics.md.
#include <gtest/gtest.h>

#include <memory>

#include "numattn/attention/registry.h"
#include "support/test_util.h"

namespace numattn {
namespace {

std::vector<std::string> all_names() {
  std::vector<std::string> v;
  for (const MethodInfo* m : list_methods()) v.push_back(m->name);
  return v;
}

std::vector<ProblemConfig> shapes() {
  std::vector<ProblemConfig> v;
  auto add = [&](index_t h, index_t hk, index_t n, index_t nk, index_t d, index_t dv, Causal c,
                 double ls = 1.0, Layout lay = Layout::kBHND) {
    ProblemConfig cfg;
    cfg.heads = h;
    cfg.kv_heads = hk;
    cfg.n = n;
    cfg.n_kv = nk;
    cfg.d = d;
    cfg.dv = dv;
    cfg.causal = c;
    cfg.logit_scale = ls;
    cfg.layout = lay;
    v.push_back(cfg);
  };
  add(2, 2, 1, 1, 1, 1, Causal::kNone);
  add(2, 1, 2, 2, 3, 3, Causal::kTopLeft);
  add(4, 2, 17, 40, 59, 59, Causal::kBottomRight);
  add(4, 4, 40, 17, 16, 8, Causal::kTopLeft);
  add(8, 1, 130, 130, 64, 64, Causal::kNone, 1.0, Layout::kBNHD);
  add(2, 2, 257, 300, 32, 32, Causal::kNone, 100.0);
  add(3, 3, 1, 2000, 128, 128, Causal::kBottomRight);
  return v;
}

class Conformance : public ::testing::TestWithParam<std::string> {};

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

TEST_P(Conformance, RunsOrRefusesEveryShape) {
  auto m = create_method(GetParam());
  const Capabilities& caps = m->info().caps;
  int ran = 0;
  for (ProblemConfig cfg : shapes()) {
    cfg.seed = test::base_seed();
    cfg.want_lse = caps.lse;
    RandomProblem a(cfg);
    const AttentionProblem& p = a.problem();
    Status s = m->can_run(p);
    if (!s.is_ok()) {
      EXPECT_FALSE(s.reason().empty());
      EXPECT_THROW(m->run(p, ExecContext{2}), Error);
      continue;
    }
    ++ran;
    m->run(p, ExecContext{2});
    ErrorMetrics e = compare_with_reference(p, reference_all(p, ExecContext{2}));
    EXPECT_TRUE(e.finite) << p.describe();
    if (caps.exact) {
      EXPECT_LE(e.rel_fro_error, 1e-5 * (1 + cfg.logit_scale)) << p.describe();
      if (caps.lse) {
        EXPECT_LE(e.lse_max_abs_error, 1e-4 * (1 + cfg.logit_scale)) << p.describe();
      }
    }
    if (caps.deterministic) {
      RandomProblem b(cfg);
      m->run(b.problem(), ExecContext{2});
      EXPECT_EQ(a.out_data(), b.out_data()) << p.describe();
    }
    EXPECT_LT(m->workspace_bytes(p, ExecContext{2}), std::size_t{1} << 34);
  }
  if (caps.exact) {
    EXPECT_EQ(ran, static_cast<int>(shapes().size())) << "exact methods run every shape";
  }
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
  if (!caps.causal) {
    cfg.causal = Causal::kTopLeft;
    RandomProblem a(cfg);
    EXPECT_FALSE(m->can_run(a.problem()).is_ok());
  }
}

INSTANTIATE_TEST_SUITE_P(Registry, Conformance, ::testing::ValuesIn(all_names()),
                         [](const auto& info) {
                           std::string s = info.param;
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

}  // namespace
}  // namespace numattn
