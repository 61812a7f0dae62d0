// The registry's table as the registration unit composes it from each layer's list, and the
// typed factory of the exact method that library code uses instead of a name.
#include <gtest/gtest.h>

#include <set>
#include <string>

#include "numattn/attention/random_problem.h"
#include "numattn/attention/registry.h"

namespace numattn {
namespace {
namespace NUMATTN_UNITY_ID {

// Every layer's list reaches the one table, bottom-up: the attention families first, then the
// analysis layer's auto.select, then the dist layer's methods; each name once.
TEST(Registry, TableComposesTheLayersBottomUp) {
  const std::vector<const MethodInfo*> all = list_methods();
  std::set<std::string> names;
  int first_above = -1, i = 0;
  int select = -1, ring = -1, ulysses = -1, causal = -1, last_attention = -1;
  for (const MethodInfo* m : all) {
    EXPECT_TRUE(names.insert(m->name).second) << m->name << " registered twice";
    EXPECT_EQ(find_method(m->name), m);
    if (m->name == "auto.select") select = i;
    else if (m->name == "dist.ring") ring = i;
    else if (m->name == "dist.ulysses") ulysses = i;
    else if (m->name == "auto.causal") causal = i;
    const bool above = m->name == "auto.select" || m->family == "dist";
    if (above && first_above < 0) first_above = i;
    if (!above) last_attention = i;
    ++i;
  }
  ASSERT_GE(select, 0);
  ASSERT_GE(ring, 0);
  ASSERT_GE(ulysses, 0);
  ASSERT_GE(causal, 0);
  EXPECT_LT(last_attention, first_above) << "an attention method after a method of a layer above";
  EXPECT_LT(select, ring);
  EXPECT_LT(ring, ulysses);
  EXPECT_EQ(create_method("auto(tol=0.1)")->spec(), "auto.select(tol=0.1,rows=0,reps=3)");
  EXPECT_EQ(create_method("dist.ulysses")->info().family, "dist");
  try {
    create_method("nope.nothing");
    FAIL() << "an unknown name must throw";
  } catch (const Error& e) {
    // The message lists every layer's methods.
    for (const char* n : {"exact.flash", "auto.select", "dist.ring"})
      EXPECT_NE(std::string(e.what()).find(n), std::string::npos) << e.what();
  }
}

// create_exact_method is exact.flash at its defaults: the same spec and, on a problem with GQA,
// Nq != Nk and a causal rule, bitwise the same output and LSE as the method created by name.
TEST(Registry, ExactMethodIsExactFlashAtItsDefaults) {
  const auto typed = create_exact_method();
  const auto named = create_method("exact.flash");
  EXPECT_EQ(typed->spec(), named->spec());
  EXPECT_EQ(&typed->info(), &named->info());
  EXPECT_TRUE(typed->info().caps.exact);
  ProblemConfig c;
  c.heads = 6, c.kv_heads = 2, c.n = 37, c.n_kv = 53, c.d = 16, c.dv = 8;
  c.causal = Causal::kBottomRight;
  RandomProblem a(c), b(c);
  typed->run(a.problem(), ExecContext{2});
  named->run(b.problem(), ExecContext{2});
  EXPECT_EQ(a.out_data(), b.out_data());
  EXPECT_FALSE(a.problem().lse.empty());
  for (index_t h = 0; h < c.heads; ++h)
    for (index_t r = 0; r < c.n; ++r) ASSERT_EQ(a.problem().lse(0, h, r, 0), b.problem().lse(0, h, r, 0));
}

}  // namespace NUMATTN_UNITY_ID
}  // namespace
}  // namespace numattn
