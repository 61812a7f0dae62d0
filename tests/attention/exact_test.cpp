// exact.flash and exact.naive against the float64 reference over the test matrix:
// D ∈ {1, 3, 59, 64, 127, 128, 256}, N ∈ {1, 2, 17, 1000, 4097}, GQA ratios 1/2/4/8, all
// causal modes with Nq ≠ Nk, masks, logits ×100, identical keys. Tolerances: docs/numerics.md.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <limits>
#include <memory>
#include <vector>

#include "numattn/attention/registry.h"
#include "support/test_util.h"

namespace numattn {
namespace {
namespace NUMATTN_UNITY_ID {

bool quick() { return std::getenv("NUMATTN_TEST_QUICK") != nullptr; }

/// Checks a result against the reference with the one tolerance definition (accuracy.h).
void expect_exact(const ErrorMetrics& e, const std::string& what) {
  const ExactTolerance tol = exact_f32_tolerance(e.logit_magnitude);
  EXPECT_TRUE(e.finite) << what;
  EXPECT_LE(e.max_scaled_error, tol.max_scaled_error) << what << " L=" << e.logit_magnitude;
  EXPECT_LE(e.rel_fro_error, tol.rel_fro_error) << what << " L=" << e.logit_magnitude;
  EXPECT_LE(e.lse_max_abs_error, tol.lse_max_abs_error) << what << " L=" << e.logit_magnitude;
}

struct Case {
  index_t heads, kv_heads, n, n_kv, d, dv;
  Causal causal;
  double logit_scale = 1.0;
  Layout layout = Layout::kBHND;
};

std::string name(const Case& c) {
  return fmt::format("Hq{}_Hkv{}_N{}_Nk{}_D{}_Dv{}_{}_x{}{}", c.heads, c.kv_heads, c.n, c.n_kv, c.d,
                     c.dv, to_string(c.causal), c.logit_scale, c.layout == Layout::kBNHD ? "_bnhd" : "");
}

/// Runs `spec` on the case, checks it against the reference with the documented tolerance,
/// returns its rel_fro_error.
double check_case(const std::string& spec, const Case& c, std::uint64_t seed, int threads = 2) {
  ProblemConfig cfg;
  cfg.heads = c.heads;
  cfg.kv_heads = c.kv_heads;
  cfg.n = c.n;
  cfg.n_kv = c.n_kv;
  cfg.d = c.d;
  cfg.dv = c.dv;
  cfg.causal = c.causal;
  cfg.logit_scale = c.logit_scale;
  cfg.layout = c.layout;
  cfg.seed = seed;
  RandomProblem prob(cfg);
  auto m = create_method(spec);
  ExecContext ctx{threads};
  m->run(prob.problem(), ctx);
  const index_t rows = c.n * c.heads > 512 ? 192 : c.n * c.heads;
  ReferenceRows ref = reference_sample(prob.problem(), rows, seed + 1, ctx);
  ErrorMetrics e = compare_with_reference(prob.problem(), ref);
  expect_exact(e, spec + " " + name(c));
  return e.rel_fro_error;
}

std::vector<Case> matrix() {
  std::vector<Case> cases;
  const std::vector<index_t> ds = {1, 3, 59, 64, 127, 128, 256};
  std::vector<index_t> ns = {1, 2, 17, 1000, 4097};
  if (quick()) ns = {1, 2, 17, 300};
  const int ratios[] = {1, 2, 4, 8};
  const Causal modes[] = {Causal::kNone, Causal::kTopLeft, Causal::kBottomRight};
  int t = 0;
  for (index_t d : ds)
    for (index_t n : ns) {
      const int g = ratios[t % 4];
      const Causal cm = modes[t % 3];
      const index_t kvh = n >= 1000 ? 1 : 2;
      // Nq ≠ Nk for every other case (more keys, as in decoding, or fewer).
      const index_t nk = (t % 2) ? n + 3 + n / 3 : n;
      const index_t dv = (t % 5 == 4) ? std::max<index_t>(1, d / 2 + 1) : d;
      cases.push_back({kvh * g, kvh, n, nk, d, dv, cm, 1.0, (t % 7 == 3) ? Layout::kBNHD : Layout::kBHND});
      ++t;
    }
  return cases;
}

class ExactMatrix : public ::testing::TestWithParam<std::string> {};

TEST_P(ExactMatrix, MatchesReferenceOverTheMatrix) {
  std::uint64_t seed = test::base_seed();
  for (const Case& c : matrix()) {
    SCOPED_TRACE(name(c));
    check_case(GetParam(), c, seed++);
  }
}

TEST_P(ExactMatrix, HugeLogitsStayFinite) {
  for (Causal cm : {Causal::kNone, Causal::kBottomRight}) {
    for (double ls : {10.0, 100.0}) check_case(GetParam(), {4, 2, 300, 333, 64, 64, cm, ls}, 7);
  }
}

TEST_P(ExactMatrix, FullyMaskedRowsGiveZeroAndMinusInf) {
  ProblemConfig cfg;
  cfg.heads = 4;
  cfg.kv_heads = 2;
  cfg.n = 37;
  cfg.n_kv = 300;
  cfg.d = 16;
  for (MaskKind kind : {MaskKind::kBool, MaskKind::kAdditive}) {
    RandomProblem prob(cfg);
    std::vector<std::uint8_t> allowed(static_cast<std::size_t>(37 * 300), 1);
    std::vector<float> add(allowed.size(), 0.f);
    for (index_t i = 0; i < 37; ++i)
      for (index_t j = 0; j < 300; ++j) {
        const bool hide = (i % 5 == 0) || ((i + j) % 3 == 0);  // rows 0, 5, 10, ... fully hidden
        allowed[static_cast<std::size_t>(i * 300 + j)] = !hide;
        add[static_cast<std::size_t>(i * 300 + j)] =
            hide ? -std::numeric_limits<float>::infinity() : static_cast<float>((i * 7 + j) % 11) * 0.3f;
      }
    if (kind == MaskKind::kBool) prob.set_bool_mask(allowed);
    else prob.set_additive_mask(add);
    auto m = create_method(GetParam());
    m->run(prob.problem(), ExecContext{2});
    const AttentionProblem& p = prob.problem();
    for (index_t h = 0; h < 4; ++h)
      for (index_t i = 0; i < 37; i += 5) {
        for (index_t d = 0; d < 16; ++d) EXPECT_EQ(p.out(0, h, i, d), 0.f);
        EXPECT_EQ(p.lse(0, h, i, 0), -std::numeric_limits<float>::infinity());
      }
    expect_exact(compare_with_reference(p, reference_all(p, ExecContext{2})), "fully masked rows");
  }
}

TEST_P(ExactMatrix, WindowAndCausalWithFewQueries) {
  // Decoding shapes: Nq = 1..3 over a long KV with bottom-right alignment and a window.
  for (index_t nq : {1, 3}) {
    ProblemConfig cfg;
    cfg.heads = 8;
    cfg.kv_heads = 1;
    cfg.n = nq;
    cfg.n_kv = 5000;
    cfg.d = 64;
    cfg.causal = Causal::kBottomRight;
    for (index_t w : {-1, 0, 100}) {
      cfg.window_left = w;
      RandomProblem prob(cfg);
      create_method(GetParam())->run(prob.problem(), ExecContext{2});
      expect_exact(compare_with_reference(prob.problem(), reference_all(prob.problem(), ExecContext{2})),
                   fmt::format("nq={} w={}", nq, w));
    }
  }
}

TEST_P(ExactMatrix, IdenticalKeysGiveTheMeanOfValues) {
  ProblemConfig cfg;
  cfg.heads = 2;
  cfg.n = 50;
  cfg.n_kv = 700;
  cfg.d = 32;
  RandomProblem prob(cfg);
  auto& k = prob.k_data();
  for (index_t h = 0; h < 2; ++h)
    for (index_t j = 1; j < 700; ++j)
      for (index_t d = 0; d < 32; ++d) k[static_cast<std::size_t>((h * 700 + j) * 32 + d)] = k[static_cast<std::size_t>(h * 700 * 32 + d)];
  create_method(GetParam())->run(prob.problem(), ExecContext{2});
  const AttentionProblem& p = prob.problem();
  for (index_t h = 0; h < 2; ++h)
    for (index_t d = 0; d < 32; ++d) {
      double mean = 0;
      for (index_t j = 0; j < 700; ++j) mean += p.v(0, h, j, d);
      mean /= 700;
      for (index_t i = 0; i < 50; ++i) EXPECT_NEAR(p.out(0, h, i, d), mean, 1e-5);
    }
}

TEST_P(ExactMatrix, BitwiseDeterministicAtFixedThreadCount) {
  ProblemConfig cfg;
  cfg.heads = 4;
  cfg.kv_heads = 2;
  cfg.n = 600;
  cfg.n_kv = 900;
  cfg.d = 64;
  cfg.causal = Causal::kBottomRight;
  for (int threads : {1, 2}) {
    RandomProblem a(cfg), b(cfg);
    auto m = create_method(GetParam());
    m->run(a.problem(), ExecContext{threads});
    m->run(b.problem(), ExecContext{threads});
    EXPECT_EQ(a.out_data(), b.out_data()) << threads;
  }
  // Decoding through the split-KV path too.
  cfg.n = 1;
  cfg.n_kv = 20000;
  RandomProblem a(cfg), b(cfg);
  auto m = create_method(GetParam());
  m->run(a.problem(), ExecContext{2});
  m->run(b.problem(), ExecContext{2});
  EXPECT_EQ(a.out_data(), b.out_data());
}

// exact.flash three ways: default kernel choice, key lanes for every problem of up to 64 rows
// per kv head (the decoding kernel on the whole matrix: D tails, Nq > 1, masks, windows),
// and query lanes for every problem (decoding included).
INSTANTIATE_TEST_SUITE_P(Exact, ExactMatrix,
                         ::testing::Values("exact.naive", "exact.flash", "exact.flash(key_lanes=64)",
                                           "exact.flash(key_lanes=0)"),
                         [](const auto& info) {
                           const std::string& p = info.param;
                           return p == "exact.naive" ? std::string("naive")
                                  : p == "exact.flash" ? std::string("flash")
                                  : p.find("=64") != std::string::npos ? std::string("flash_key_lanes")
                                                                       : std::string("flash_query_lanes");
                         });

TEST(ExactFlash, KeyLanesEqualQueryLanesOnDecodeShapes) {
  // Decoding GQA groups (G = 3 as SmolLM2, 4, 1; 9 and 13, the AVX-512 wide kernels' one and
  // two passes) over the KV cache's [position, head, dim] rows, one to three queries, several kv
  // heads per block and, with 96 heads, two blocks per batch (21 kv heads fill 63 of the 64
  // rows, then 11); D with and without a SIMD tail; large
  // logits; split-KV forced; 1 and 2 threads. Key lanes and query lanes must each meet the
  // exact tolerance.
  struct Shape {
    index_t b, hq, hkv, nq, nk, d;
  };
  for (const Shape& s : {Shape{1, 9, 3, 1, 700, 64}, Shape{2, 12, 4, 2, 300, 40}, Shape{1, 96, 32, 1, 129, 64},
                         Shape{1, 4, 1, 3, 1000, 128}, Shape{2, 2, 2, 1, 77, 5}, Shape{1, 9, 1, 1, 500, 72},
                         Shape{2, 26, 2, 1, 99, 33}}) {
    for (const char* split : {"0", "3"})
      for (int threads : {1, 2}) {
        ProblemConfig cfg;
        cfg.batch = s.b;
        cfg.heads = s.hq;
        cfg.kv_heads = s.hkv;
        cfg.n = s.nq;
        cfg.n_kv = s.nk;
        cfg.d = s.d;
        cfg.causal = Causal::kBottomRight;
        cfg.layout = Layout::kBNHD;
        cfg.logit_scale = 30;
        cfg.seed = static_cast<std::uint64_t>(s.hq * 131 + s.nk);
        RandomProblem kl(cfg), ql(cfg);
        const std::string what = fmt::format("B={} Hq={} Hkv={} Nq={} Nk={} D={} split_kv={} threads={}", s.b, s.hq,
                                             s.hkv, s.nq, s.nk, s.d, split, threads);
        create_method(fmt::format("exact.flash(key_lanes=64,split_kv={})", split))->run(kl.problem(), ExecContext{threads});
        create_method(fmt::format("exact.flash(key_lanes=0,split_kv={})", split))->run(ql.problem(), ExecContext{threads});
        const ReferenceRows ref = reference_all(kl.problem(), ExecContext{2});
        expect_exact(compare_with_reference(kl.problem(), ref), "key lanes " + what);
        expect_exact(compare_with_reference(ql.problem(), ref), "query lanes " + what);
      }
  }
}

TEST(ExactFlash, ErrorWithinTwiceNaive) {
  // The FlashAttention acceptance rule: flash's error ≤ 2× the same-precision naive error.
  for (const Case& c : {Case{8, 8, 1024, 1024, 128, 128, Causal::kNone, 10.0},
                        Case{8, 2, 1000, 1500, 64, 64, Causal::kBottomRight, 10.0},
                        Case{4, 4, 777, 777, 59, 59, Causal::kTopLeft, 1.0}}) {
    const double ef = check_case("exact.flash", c, 99);
    const double en = check_case("exact.naive", c, 99);
    EXPECT_LE(ef, std::max(2.0 * en, 4 * kEpsF32)) << name(c);
  }
}

TEST(ExactFlash, SplitKvEqualsSinglePass) {
  ProblemConfig cfg;
  cfg.heads = 8;
  cfg.kv_heads = 2;
  cfg.n = 3;
  cfg.n_kv = 10000;
  cfg.d = 128;
  cfg.causal = Causal::kBottomRight;
  RandomProblem a(cfg), b(cfg);
  create_method("exact.flash(split_kv=1)")->run(a.problem(), ExecContext{1});
  create_method("exact.flash(split_kv=7)")->run(b.problem(), ExecContext{2});
  double worst = 0;
  for (std::size_t i = 0; i < a.out_data().size(); ++i)
    worst = std::max(worst, static_cast<double>(std::abs(a.out_data()[i] - b.out_data()[i])));
  EXPECT_LE(worst, 1e-6);
}

TEST(ExactFlash, ThreadCountChangesResultsOnlyWithinTolerance) {
  ProblemConfig cfg;
  cfg.heads = 3;
  cfg.n = 513;
  cfg.d = 80;
  cfg.causal = Causal::kTopLeft;
  RandomProblem a(cfg), b(cfg);
  create_method("exact.flash")->run(a.problem(), ExecContext{1});
  create_method("exact.flash")->run(b.problem(), ExecContext{3});
  for (std::size_t i = 0; i < a.out_data().size(); ++i)
    ASSERT_NEAR(a.out_data()[i], b.out_data()[i], 1e-6);
}

}  // namespace NUMATTN_UNITY_ID
}  // namespace
}  // namespace numattn
