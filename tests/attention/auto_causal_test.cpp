// auto.causal (HyperAttention's causal recursion, Han et al., ICLR 2024, around any non-causal
// method): the nested spec and its refusals; the decomposition is the paper's recursion on square
// problems and covers every visible pair exactly once (both alignments, Nq ≠ Nk, windows), never
// touching a block outside the window; an exact inner method gives exact attention (GQA, Dk ≠ Dv,
// logits ×100, rows that see nothing, BNHD, LSE); future keys poisoned with huge values or NaN
// never reach a row that does not see them; every method that refuses causal problems on its own
// runs causally through it with an error comparable to its non-causal error on the same inputs.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <set>
#include <tuple>
#include <vector>

#include "attention/auto/causal.h"
#include "numattn/analysis/metrics.h"
#include "numattn/attention/reference.h"
#include "numattn/attention/registry.h"
#include "support/conformance.h"
#include "support/method_problem.h"
#include "support/test_util.h"

namespace numattn {
namespace {
namespace NUMATTN_UNITY_ID {

using Part = AutoCausalAttention::Part;

std::unique_ptr<AutoCausalAttention> make(const std::string& spec) {
  auto m = create_method(spec);
  auto* c = dynamic_cast<AutoCausalAttention*>(m.get());
  EXPECT_NE(c, nullptr) << spec;
  m.release();
  return std::unique_ptr<AutoCausalAttention>(c);
}

std::string error_of(const std::string& spec) {
  try {
    create_method(spec);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(AutoCausal, SpecNestsTheInnerMethodAndRoundTrips) {
  const auto m = create_method(" auto.causal ( inner = lowrank.nystrom( landmarks = 16 , iters=4 ) , block=32 ) ");
  EXPECT_EQ(m->spec(),
            "auto.causal(inner=lowrank.nystrom(landmarks=16,pinv=newton_schulz,iters=4),block=32,"
            "lse=exact.flash(block_q=64,block_k=256,split_kv=0,key_lanes=-1))");
  EXPECT_EQ(create_method(m->spec())->spec(), m->spec());
  const ParsedSpec ps = parse_spec(m->spec());
  ASSERT_EQ(ps.params.size(), 3u);
  EXPECT_EQ(ps.params[0].second, "lowrank.nystrom(landmarks=16,pinv=newton_schulz,iters=4)");
  // An inner method with its own LSE uses it; lse=exact.flash overrides.
  EXPECT_EQ(create_method("auto.causal(inner=sparse.routing)")->params().get_string("lse"), "inner");
  EXPECT_NE(create_method("auto.causal(inner=sparse.routing,lse=exact.flash)")->params().get_string("lse"), "inner");
  // Spec lists split around the nested parentheses.
  const auto list = split_specs("auto.causal(inner=lowrank.nystrom(landmarks=8),block=4),exact.flash");
  ASSERT_EQ(list.size(), 2u);
  EXPECT_EQ(create_method(list[0])->params().get_int("block"), 4);
}

TEST(AutoCausal, RefusesInnerMethodsItCannotWrap) {
  EXPECT_NE(error_of("auto.causal(inner=lowrank.nystrom(landmarks=8)").find("unbalanced"), std::string::npos);
  EXPECT_NE(error_of("auto.causal(inner=lowrank.nystrom(landmarks=8)))").find("unbalanced"), std::string::npos);
  EXPECT_NE(error_of("auto.causal(inner=lowrank.nope)").find("unknown method"), std::string::npos);
  EXPECT_NE(error_of("auto.causal(inner=lowrank.nystrom(landmarks=0))").find("out of range"), std::string::npos);
  EXPECT_NE(error_of("auto.causal(inner=auto.select)").find("'auto' family"), std::string::npos);
  EXPECT_NE(error_of("auto.causal(inner=dist.ring)").find("'dist' family"), std::string::npos);
  EXPECT_NE(error_of("auto.causal(inner=kernel.linear)").find("own causal mode"), std::string::npos);
  EXPECT_NE(error_of("auto.causal(inner=lowrank.nystrom,lse=inner)").find("gives no log-sum-exp"), std::string::npos);
  EXPECT_NE(error_of("auto.causal(lse=lowrank.linformer)").find("gives no log-sum-exp"), std::string::npos);
}

/// The parts of `spec` on a problem of the given shape (shapes and rules only).
std::vector<Part> parts_of(const std::string& spec, index_t nq, index_t nk, Causal c, index_t wl = -1, index_t wr = -1) {
  ProblemConfig cfg = test::method_problem(1, 1, nq, nk, 2, 2, c, 1);
  cfg.window_left = wl;
  cfg.window_right = wr;
  RandomProblem prob(cfg);
  return make(spec)->parts(prob.problem());
}

TEST(AutoCausal, DecompositionIsHyperAttentionsRecursion) {
  // N = 1024, block 128: off-diagonal blocks of 512 and 256 rows by the inner method (levels 0
  // and 1), the 128-row ones (level 2) and the diagonal blocks exact.
  for (Causal c : {Causal::kTopLeft, Causal::kBottomRight}) {
    const auto parts = parts_of("auto.causal(block=128)", 1024, 1024, c);
    std::set<std::tuple<index_t, index_t, index_t, index_t>> full, exact;
    for (const Part& t : parts) (t.full ? full : exact).insert({t.a, t.c, t.ka, t.kb});
    const decltype(full) want_full = {{512, 1024, 0, 512}, {256, 512, 0, 256}, {768, 1024, 512, 768}};
    EXPECT_EQ(full, want_full);
    ASSERT_EQ(exact.size(), 8u + 4u);
    for (index_t t = 0; t < 8; ++t) EXPECT_TRUE(exact.count({128 * t, 128 * t + 128, 128 * t, 128 * t + 128})) << t;
    for (index_t t = 0; t < 4; ++t)
      EXPECT_TRUE(exact.count({256 * t + 128, 256 * t + 256, 256 * t, 256 * t + 128})) << t;
  }
  // A decode-like problem is one fully visible block; so is a non-causal one above the block size.
  const auto dec = parts_of("auto.causal(block=64)", 3, 500, Causal::kBottomRight);
  ASSERT_EQ(dec.size(), 2u);  // rows 0..2 see keys 0..497 (full), the last 2 keys partly
  EXPECT_TRUE(dec[0].full);
  const auto nc = parts_of("auto.causal(block=64)", 100, 300, Causal::kNone);
  ASSERT_EQ(nc.size(), 1u);
  EXPECT_TRUE(nc[0].full);
  EXPECT_FALSE(parts_of("auto.causal(block=300)", 100, 300, Causal::kNone)[0].full);
}

// Every visible pair is in exactly one part (a fully visible one, or an exact one whose own window
// shows it); full parts hold only visible pairs; an exact part's window about its diagonal shows
// exactly the visible pairs; no part is entirely hidden.
TEST(AutoCausal, PartsCoverEveryVisiblePairOnce) {
  int shapes = 0;
  for (index_t nq : {1, 2, 17, 40, 129})
    for (index_t nk : {1, 3, 17, 40, 100})
      for (Causal c : {Causal::kNone, Causal::kTopLeft, Causal::kBottomRight})
        for (index_t wl : {-1, 0, 3, 30})
          for (index_t wr : {-1, 0, 5})
            for (index_t block : {1, 4, 16}) {
              if (c != Causal::kNone && wr >= 0 && wr != 0) continue;  // no effect under causal
              ProblemConfig cfg = test::method_problem(1, 1, nq, nk, 2, 2, c, 1);
              cfg.window_left = wl;
              cfg.window_right = wr;
              RandomProblem prob(cfg);
              const AttentionProblem& p = prob.problem();
              const auto parts = make("auto.causal(block=" + std::to_string(block) + ")")->parts(p);
              std::vector<int> cover(static_cast<std::size_t>(nq * nk), 0);
              const std::string at = ::testing::PrintToString(std::make_tuple(nq, nk, to_string(c), wl, wr, block));
              for (const Part& t : parts) {
                ASSERT_TRUE(t.a >= 0 && t.a < t.c && t.c <= nq && t.ka >= 0 && t.ka < t.kb && t.kb <= nk) << at;
                const index_t hi = c != Causal::kNone ? t.a + p.diag_offset() - t.ka : (wr >= 0 ? t.a + wr - t.ka : -1);
                const index_t lo = wl >= 0 ? t.ka - (t.a + p.diag_offset() - wl) : -1;
                if (!t.full) {
                  ASSERT_TRUE(hi == -1 ? c == Causal::kNone && wr < 0 : hi >= 0) << at;
                  ASSERT_GE(lo, -1) << at;
                }
                bool any = false;
                for (index_t i = t.a; i < t.c; ++i)
                  for (index_t j = t.ka; j < t.kb; ++j) {
                    const bool vis = p.visible(i, j);
                    any |= vis;
                    if (t.full) {
                      ASSERT_TRUE(vis) << at << " full part holds a hidden pair " << i << "," << j;
                    } else {
                      const index_t ii = i - t.a, jj = j - t.ka;
                      const bool shown = (hi < 0 || jj <= ii + hi) && (lo < 0 || jj >= ii - lo);
                      ASSERT_EQ(shown, vis) << at << " exact part's window at " << i << "," << j;
                    }
                    if (vis) ++cover[static_cast<std::size_t>(i * nk + j)];
                  }
                ASSERT_TRUE(any) << at << " a part with nothing visible";
              }
              for (index_t i = 0; i < nq; ++i)
                for (index_t j = 0; j < nk; ++j)
                  ASSERT_EQ(cover[static_cast<std::size_t>(i * nk + j)], p.visible(i, j) ? 1 : 0) << at << " pair " << i << "," << j;
              ++shapes;
            }
  EXPECT_GT(shapes, 1000);
}

// With a window, the parts stay near the band: blocks outside it are skipped, so the area of the
// parts grows with N·(window + block), not N².
TEST(AutoCausal, WindowedPartsStayNearTheBand) {
  for (Causal c : {Causal::kTopLeft, Causal::kNone}) {
    const auto parts = parts_of("auto.causal(block=32)", 4096, 4096, c, 200, c == Causal::kNone ? 100 : -1);
    double area = 0;
    int full = 0;
    for (const Part& t : parts) {
      area += double(t.c - t.a) * double(t.kb - t.ka);
      full += t.full;
    }
    EXPECT_LT(area, 4.0 * 4096 * (300 + 32)) << to_string(c);
    EXPECT_GT(full, 0);
  }
}

void expect_exact(const std::string& spec, ProblemConfig cfg) {
  RandomProblem prob(cfg);
  const AttentionProblem& p = prob.problem();
  create_method(spec)->run(p, ExecContext{2});
  const ReferenceRows ref = reference_all(p, ExecContext{2});
  const ErrorMetrics e = compare_with_reference(p, ref);
  const ExactTolerance tol = exact_f32_tolerance(ref.logit_magnitude);
  const std::string at = fmt::format("{} on Hq={} Hkv={} Nq={} Nk={} Dk={} Dv={} {} window {}/{} x{}", spec, cfg.heads,
                                     cfg.eff_kv_heads(), cfg.n, cfg.eff_n_kv(), cfg.d, cfg.eff_dv(), to_string(cfg.causal),
                                     cfg.window_left, cfg.window_right, cfg.logit_scale);
  EXPECT_TRUE(e.finite) << at;
  EXPECT_LE(e.max_scaled_error, tol.max_scaled_error) << at;
  EXPECT_LE(e.rel_fro_error, tol.rel_fro_error) << at;
  if (cfg.want_lse) {
    EXPECT_LE(e.lse_max_abs_error, tol.lse_max_abs_error) << at;
  }
}

TEST(AutoCausal, ExactInnerMethodGivesExactAttention) {
  for (const char* inner : {"exact.naive", "exact.flash"})
    for (index_t block : {1, 8, 64}) {
      const std::string spec = fmt::format("auto.causal(inner={},block={})", inner, block);
      for (Causal c : {Causal::kTopLeft, Causal::kBottomRight}) {
        expect_exact(spec, test::method_problem(6, 2, 200, 200, 24, 8, c, 11, Dist::kGaussian, true));
        expect_exact(spec, test::method_problem(4, 4, 77, 300, 16, 16, c, 12, Dist::kSpiky, true));
        // Nq > Nk: bottom-right rows before Nq − Nk see no key (0, LSE −inf).
        expect_exact(spec, test::method_problem(2, 1, 300, 77, 16, 33, c, 13, Dist::kGaussian, true));
        ProblemConfig big = test::method_problem(2, 2, 150, 150, 32, 32, c, 14, Dist::kGaussian, true);
        big.logit_scale = 100;
        expect_exact(spec, big);
        ProblemConfig win = test::method_problem(3, 1, 180, 260, 16, 16, c, 15, Dist::kGaussian, true);
        win.window_left = 37;
        win.layout = Layout::kBNHD;
        expect_exact(spec, win);
      }
      ProblemConfig band = test::method_problem(2, 2, 190, 190, 16, 16, Causal::kNone, 16, Dist::kGaussian, true);
      band.window_left = 20;
      band.window_right = 9;
      expect_exact(spec, band);
      expect_exact(spec, test::method_problem(2, 1, 1, 400, 16, 16, Causal::kBottomRight, 17, Dist::kGaussian, true));
    }
}

const char* const kNine[] = {
    "lowrank.nystrom(landmarks=32)", "lowrank.linformer(k=64)", "lowrank.skyformer(landmarks=64)",
    "lowrank.wildcat(rank=32)",      "sparse.smyrf",            "sparse.routing",
    "sparse.clustered(clusters=16)", "sparse.kdeformer(samples=64,bucket=32)",
    "sparse.scatterbrain(features=64,chunk=32)"};

// Keys after row t's diagonal set to huge values (k × 1e3 or 1e30, v = 1e30): rows ≤ t unchanged,
// bit for bit, LSE included, for every wrapped method.
TEST(AutoCausal, NeverReadsFutureKeys) {
  // Not lowrank.skyformer: poisoned keys this large exceed the norms its Gaussian kernel accepts,
  // and it refuses the whole problem (can_run reads every key).
  std::vector<std::string> inners;
  for (const char* x : kNine)
    if (std::string(x).rfind("lowrank.skyformer", 0) != 0) inners.push_back(x);
  inners.push_back("exact.naive");
  int kept = 0;
  for (const std::string& inner : inners)
    for (Causal c : {Causal::kTopLeft, Causal::kBottomRight}) {
      RandomProblem prob(test::method_problem(4, 2, 300, 340, 16, 16, c, 21, Dist::kGaussian, true));
      const std::string spec = "auto.causal(inner=" + inner + ",block=16)";
      if (!create_method(spec)->can_run(prob.problem()).is_ok()) prob.set_lse(false);
      test::expect_rows_ignore_future_keys(spec, prob, 170, test::KeyPoison::kScaleBy1e3);
      // k = v = 1e30: rows after t see them; methods that work in float32 may refuse such inputs
      // (an Error giving their bounds, problem.h), the others must leave rows ≤ t unchanged.
      RandomProblem again(test::method_problem(4, 2, 300, 340, 16, 16, c, 22, Dist::kGaussian, false));
      try {
        test::expect_rows_ignore_future_keys(spec, again, 93, test::KeyPoison::kSetTo1e30);
        ++kept;
      } catch (const NonFiniteInput& e) {
        ADD_FAILURE() << spec << ": " << e.what();
      } catch (const Error& e) {
        std::printf("%s refuses k = v = 1e30: %.90s...\n", spec.c_str(), e.what());
      }
    }
  EXPECT_GE(kept, 10);
}

// NaN in keys no row sees (top-left, Nq < Nk) is never read; NaN in a key row j sees reaches
// exactly the rows that see it (forward; the other rows are not NaN), and run names it.
TEST(AutoCausal, NonFiniteKeysReachOnlyTheRowsThatSeeThem) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  for (const char* inner : {"lowrank.nystrom(landmarks=16)", "sparse.routing", "exact.naive"}) {
    const std::string spec = fmt::format("auto.causal(inner={},block=16)", inner);
    const auto m = create_method(spec);
    RandomProblem clean(test::method_problem(3, 1, 200, 260, 16, 16, Causal::kTopLeft, 31));
    m->run(clean.problem(), ExecContext{2});
    RandomProblem bad(test::method_problem(3, 1, 200, 260, 16, 16, Causal::kTopLeft, 31));
    const AttentionProblem& p = bad.problem();
    for (index_t j = 200; j < 260; ++j) {
      bad.k_data()[static_cast<std::size_t>(p.k.row(0, 0, j) - p.k.data)] = nan;
      bad.v_data()[static_cast<std::size_t>(p.v.row(0, 0, j) + 3 - p.v.data)] = nan;
    }
    m->run(p, ExecContext{2});
    EXPECT_EQ(bad.out_data(), clean.out_data()) << spec;

    const index_t j = 120;
    bad.k_data()[static_cast<std::size_t>(p.k.row(0, 0, j) + 2 - p.k.data)] = nan;
    m->forward(p, ExecContext{2});
    for (index_t h = 0; h < 3; ++h)
      for (index_t i = 0; i < 200; ++i) {
        const float x = p.out(0, h, i, 0);
        if (i < j) {
          EXPECT_FALSE(std::isnan(x)) << spec << " row " << i;
        } else {
          EXPECT_TRUE(std::isnan(x)) << spec << " row " << i;
        }
      }
    try {
      m->run(p, ExecContext{2});
      ADD_FAILURE() << spec << ": no NonFiniteInput";
    } catch (const NonFiniteInput& e) {
      EXPECT_EQ(e.tensor(), "k");
      EXPECT_EQ(e.index(), (std::vector<index_t>{0, 0, j, 2}));
    }
  }
}

// Every method that refuses causal problems on its own runs causally through auto.causal, with an
// error (against its own target) comparable to its non-causal error on the same inputs.
TEST(AutoCausal, EveryNonCausalMethodRunsCausallyWithComparableError) {
  std::printf("%-44s %8s %10s %10s %10s\n", "inner (N = 1024, H = 4/2, D = 64, block 128)", "dist", "non-causal",
              "causal", "lse=hyper");
  for (const char* inner : kNine)
    for (Dist dist : {Dist::kGaussian, Dist::kSpiky}) {
      ProblemConfig cfg = test::method_problem(4, 2, 1024, 1024, 64, 64, Causal::kNone, 41, dist);
      RandomProblem plain(cfg);
      const double e0 = test::run_error(inner, plain);
      cfg.causal = Causal::kBottomRight;
      RandomProblem causal(cfg);
      const std::string spec = fmt::format("auto.causal(inner={},block=128)", inner);
      ASSERT_TRUE(create_method(inner)->info().caps.causal == false) << inner;
      const double e1 = test::run_error(spec, causal);
      const double e2 = test::run_error(
          fmt::format("auto.causal(inner={},block=128,lse=sparse.hyper(block=64,samples=64,min_seq_len=1))", inner), causal);
      std::printf("%-44s %8s %10.4f %10.4f %10.4f\n", inner, to_string(dist), e0, e1, e2);
      EXPECT_LE(e1, 1.25 * e0 + 0.02) << spec << " on " << to_string(dist);
      EXPECT_TRUE(std::isfinite(e2));
    }
}

// The Gaussian kernel (lowrank.skyformer): at its limit the wrapped form is the causal Gaussian
// target, output and LSE.
TEST(AutoCausal, GaussianTargetIsKeptExactPartsAndLse) {
  RandomProblem prob(test::method_problem(2, 1, 130, 150, 16, 8, Causal::kBottomRight, 51, Dist::kGaussian, true));
  const AttentionProblem& p = prob.problem();
  const auto m = create_method("auto.causal(inner=lowrank.skyformer(landmarks=280,gamma=0,pinv=exact),block=16)");
  EXPECT_EQ(m->target().kind, TargetKind::kGaussian);
  m->run(p, ExecContext{2});
  const ErrorMetrics e = compare_with_reference(p, reference_all(p, ExecContext{2}, Target::gaussian()));
  EXPECT_LT(e.rel_fro_error, 1e-3);
  EXPECT_LT(e.lse_max_abs_error, 1e-3);
}

TEST(AutoCausal, RefusesMasksAndBlocksTheInnerMethodRefuses) {
  RandomProblem prob(test::method_problem(2, 2, 64, 64, 8, 8, Causal::kTopLeft, 61));
  prob.set_bool_mask(std::vector<std::uint8_t>(64 * 64, 1));
  const Status s = create_method("auto.causal(block=8)")->can_run(prob.problem());
  EXPECT_FALSE(s.is_ok());
  EXPECT_NE(s.reason().find("boolean masks"), std::string::npos) << s.reason();
  // Linformer's identity projection needs k ≥ Nk: no block of more than 8 keys qualifies.
  RandomProblem plain(test::method_problem(2, 2, 64, 64, 8, 8, Causal::kTopLeft, 62));
  const Status r =
      create_method("auto.causal(inner=lowrank.linformer(k=8,projection=identity),block=8)")->can_run(plain.problem());
  EXPECT_FALSE(r.is_ok());
  EXPECT_NE(r.reason().find("fully visible block of rows [16, 32) × keys [0, 16)"), std::string::npos) << r.reason();
  EXPECT_NE(r.reason().find("needs k ≥ Nk"), std::string::npos) << r.reason();
}


// ---- The causal recursion applied by AttentionMethod::run to every method (method.h) ----

/// A problem of `cfg`'s shape that `m` claims: GQA only when it takes GQA, Dv = Dk when it needs
/// them equal, an LSE output when it gives one.
ProblemConfig claimed(const AttentionMethod& m, ProblemConfig cfg) {
  const Capabilities& c = m.info().caps;
  if (!c.gqa) cfg.kv_heads = cfg.heads;
  if (!c.dk_ne_dv) cfg.dv = cfg.d;
  cfg.want_lse = c.lse;
  return cfg;
}

/// The last key row `t` sees (problem.h's edges).
index_t last_key_seen(const AttentionProblem& p, index_t t) {
  if (p.causal != Causal::kNone) return t + p.diag_offset();
  return p.window_right >= 0 ? t + p.window_right : p.n_kv() - 1;
}

enum class Poison { kScaleBy1e3, kSetTo1e30, kNegateK, kNaN };

/// Outputs (and LSE) of rows 0..t of every head after `m` runs on `prob` whose keys after row t's
/// last visible key are poisoned as `how` says (v = 1e30; kNegateK: v = −2v; kNaN: NaN).
std::vector<float> rows_up_to(const AttentionMethod& m, const ProblemConfig& cfg, index_t t, Poison how) {
  RandomProblem prob(cfg);
  const AttentionProblem& p = prob.problem();
  const float nan = std::numeric_limits<float>::quiet_NaN();
  for (index_t b = 0; b < p.batch(); ++b)
    for (index_t h = 0; h < p.kv_heads(); ++h)
      for (index_t j = std::max<index_t>(last_key_seen(p, t) + 1, 0); j < p.n_kv(); ++j) {
        float* k = prob.k_data().data() + (p.k.row(b, h, j) - p.k.data);
        float* v = prob.v_data().data() + (p.v.row(b, h, j) - p.v.data);
        for (index_t d = 0; d < p.d_qk(); ++d)
          k[d] = how == Poison::kScaleBy1e3 ? k[d] * 1e3f
                 : how == Poison::kSetTo1e30 ? 1e30f
                 : how == Poison::kNegateK   ? -2 * k[d]
                                             : nan;
        for (index_t d = 0; d < p.d_v(); ++d)
          v[d] = how == Poison::kNaN ? nan : how == Poison::kNegateK ? -2 * v[d] : 1e30f;
      }
  m.run(p, ExecContext{2});
  std::vector<float> got;
  for (index_t b = 0; b < p.batch(); ++b)
    for (index_t h = 0; h < p.heads(); ++h)
      for (index_t i = 0; i <= t; ++i) {
        got.insert(got.end(), p.out.row(b, h, i), p.out.row(b, h, i) + p.d_v());
        if (!p.lse.empty()) got.push_back(p.lse(b, h, i, 0));
      }
  return got;
}

struct PoisonCase {
  const char* name;
  ProblemConfig cfg;
  index_t t;  ///< rows 0..t are compared
  bool nan_ok;  ///< no row sees the poisoned keys (NaN poison allowed)
};

std::vector<PoisonCase> poison_cases() {
  std::vector<PoisonCase> v;
  v.push_back({"bottom-right Nq<Nk GQA D=33 Dv=17", test::method_problem(4, 2, 300, 700, 33, 17, Causal::kBottomRight, 71), 150, false});
  v.push_back({"top-left Nq<Nk MQA D=19", test::method_problem(3, 1, 530, 611, 19, 19, Causal::kTopLeft, 72), 529, true});
  v.push_back({"bottom-right Nq>Nk D=64", test::method_problem(2, 2, 700, 520, 64, 64, Causal::kBottomRight, 73), 400, false});
  v.push_back({"top-left square N=613", test::method_problem(2, 1, 613, 613, 16, 16, Causal::kTopLeft, 74), 300, false});
  ProblemConfig win = test::method_problem(2, 2, 600, 600, 16, 16, Causal::kNone, 75);
  win.window_left = 100;
  win.window_right = 40;
  v.push_back({"window 100/40 N=600", win, 350, false});
  return v;
}

// Native causal forms whose earlier rows still change when later keys change (docs/methods.md,
// "Causal forms"): none. A new leak fails the test until it is fixed or listed here.
const std::set<std::string> kKnownLeaks = {};

// Every registered method runs causal problems (both alignments, Nq ≠ Nk, GQA, odd sizes), and
// sliding-window ones when it claims windows or runs by the recursion; rows never read keys
// beyond their frontier: poisoned future keys (k × 1e3 and k = 1e30 with v = 1e30; k = −2k with
// v = −2v; NaN where no row sees them) leave rows 0..t bitwise equal to a clean run, and finite — every
// method run by the causal recursion, and every native form but those of kKnownLeaks.
TEST(CausalRecursion, EveryMethodRunsCausalProblemsWithoutReadingFutureKeys) {
  int checked = 0;
  std::set<std::string> leaks;
  for (const MethodInfo* info : list_methods()) {
    const auto m = create_method(info->name);
    EXPECT_TRUE(m->runs_causal()) << info->name;
    for (const PoisonCase& pc : poison_cases()) {
      const ProblemConfig cfg = claimed(*m, pc.cfg);
      const bool windowed = cfg.window_left >= 0 || cfg.window_right >= 0;
      const std::string at = fmt::format("{} on {}", m->spec(), pc.name);
      {
        RandomProblem probe(cfg);
        const Status s = m->can_run(probe.problem());
        // A window without a causal rule: the recursion gives one to every method it applies to;
        // the others run it natively or refuse it with a reason (kernel.linear: no window;
        // tensor.simplicial: its windows end at the diagonal).
        if (windowed && !m->causal_recursion() && !s.is_ok()) {
          EXPECT_FALSE(s.reason().empty()) << at;
          continue;
        }
        ASSERT_TRUE(s.is_ok()) << at << ": " << s.reason();
      }
      const std::vector<float> clean = rows_up_to(*m, cfg, pc.t, Poison::kNegateK);
      RandomProblem plain(cfg);
      m->run(plain.problem(), ExecContext{2});
      std::vector<float> want;
      const AttentionProblem& p = plain.problem();
      for (index_t b = 0; b < p.batch(); ++b)
        for (index_t h = 0; h < p.heads(); ++h)
          for (index_t i = 0; i <= pc.t; ++i) {
            want.insert(want.end(), p.out.row(b, h, i), p.out.row(b, h, i) + p.d_v());
            if (!p.lse.empty()) want.push_back(p.lse(b, h, i, 0));
          }
      // Bitwise for deterministic methods; auto.select (which times its candidates, so may pick
      // another exact method on the next call) within the exact tolerance of its candidates.
      const auto same = [&](const std::vector<float>& got, const char* what) {
        ASSERT_EQ(got.size(), want.size()) << at;
        if (info->caps.deterministic) {
          if (std::memcmp(got.data(), want.data(), want.size() * sizeof(float)) != 0) {
            leaks.insert(info->name);
            std::printf("%s: rows 0..%lld changed under poison %s\n", at.c_str(), static_cast<long long>(pc.t), what);
          }
          return;
        }
        for (std::size_t i = 0; i < want.size(); ++i)
          if (got[i] != want[i])  // equal infinities (the LSE of a row that sees nothing) pass
            ASSERT_NEAR(got[i], want[i], 1e-4 * (1 + std::fabs(want[i]))) << at << ", poison " << what << " at " << i;
      };
      same(clean, "k = -2k");
      for (const float x : want) ASSERT_TRUE(std::isfinite(x) || x == -std::numeric_limits<float>::infinity()) << at;
      for (const Poison how : {Poison::kScaleBy1e3, Poison::kSetTo1e30, Poison::kNaN}) {
        if (how == Poison::kNaN && !pc.nan_ok) continue;
        try {
          same(rows_up_to(*m, cfg, pc.t, how), how == Poison::kScaleBy1e3  ? "k x 1e3"
                                               : how == Poison::kSetTo1e30 ? "k = 1e30"
                                                                           : "NaN");
        } catch (const NonFiniteInput& e) {
          ADD_FAILURE() << at << ": a row read a poisoned key: " << e.what();
        } catch (const std::exception& e) {
          // Huge finite keys: rows after t see them, and a float32 method may refuse such inputs
          // (its stated bounds; tensor.simplicial's overflow check also fires on v = 1e30);
          // rows 0..t are then unobservable, not wrong.
          EXPECT_NE(how, Poison::kNaN) << at << ": " << e.what();
          std::printf("%s refuses poison %d: %.100s...\n", at.c_str(), static_cast<int>(how), e.what());
          continue;
        }
      }
      ++checked;
    }
    if (!leaks.count(info->name)) continue;
    EXPECT_TRUE(info->caps.causal) << info->name << ": a method run by the causal recursion read a future key";
  }
  EXPECT_GE(checked, 4 * static_cast<int>(list_methods().size()));
  EXPECT_EQ(leaks, kKnownLeaks);
}

// A method run by the recursion at its limit case (its budget ≥ the keys of any block) is exact
// attention on causal problems, within the exact float32 tolerance.
TEST(CausalRecursion, LimitCasesStayExactOnCausalProblems) {
  int ran = 0;
  for (const MethodInfo* info : list_methods()) {
    if (!info->accuracy.limit_case) continue;
    for (Causal c : {Causal::kTopLeft, Causal::kBottomRight}) {
      const auto plain = create_method(info->name);
      if (plain->info().caps.causal) continue;  // native forms: the conformance suite's business
      ProblemConfig cfg = claimed(*plain, test::method_problem(4, 2, 290, 600, 32, 32, c, 81));
      RandomProblem prob(cfg);
      const AttentionProblem& p = prob.problem();
      const std::string spec = test::spec_with(*info, info->accuracy.limit_case(p));
      const auto m = create_method(spec);
      ASSERT_TRUE(m->runs_by_recursion(p)) << spec;
      m->run(p, ExecContext{2});
      const ReferenceRows ref = reference_all(p, ExecContext{2}, m->target());
      const ErrorMetrics e = compare_with_reference(p, ref);
      const ExactTolerance tol = exact_f32_tolerance(ref.logit_magnitude);
      EXPECT_TRUE(e.finite) << spec;
      EXPECT_LE(e.rel_fro_error, tol.rel_fro_error) << spec << " " << to_string(c);
      EXPECT_LE(e.max_scaled_error, tol.max_scaled_error) << spec << " " << to_string(c);
      if (cfg.want_lse) {
        EXPECT_LE(e.lse_max_abs_error, tol.lse_max_abs_error) << spec;
      }
      ++ran;
    }
  }
  EXPECT_GE(ran, 18);  // the nine methods whose kernels are non-causal, both alignments
}

// The recursion keeps the method's identity and refuses what it cannot fix, saying why.
TEST(CausalRecursion, KeepsTheSpecAndRefusesMasks) {
  const auto m = create_method("lowrank.nystrom(landmarks=32)");
  EXPECT_FALSE(m->info().caps.causal);
  EXPECT_TRUE(m->causal_recursion());
  EXPECT_EQ(m->spec(), "lowrank.nystrom(landmarks=32,pinv=newton_schulz,iters=6)");
  RandomProblem prob(test::method_problem(2, 2, 64, 64, 8, 8, Causal::kTopLeft, 91));
  EXPECT_TRUE(m->runs_by_recursion(prob.problem()));
  prob.set_bool_mask(std::vector<std::uint8_t>(64 * 64, 1));
  const Status s = m->can_run(prob.problem());
  EXPECT_FALSE(s.is_ok());
  EXPECT_NE(s.reason().find("boolean masks"), std::string::npos) << s.reason();
  // A feature-map method has its own causal form, and no window: the recursion cannot give it one.
  const auto lin = create_method("kernel.linear");
  EXPECT_FALSE(lin->causal_recursion());
  ProblemConfig win = test::method_problem(2, 2, 64, 64, 8, 8, Causal::kTopLeft, 92);
  win.window_left = 8;
  RandomProblem w(win);
  const Status r = lin->can_run(w.problem());
  EXPECT_FALSE(r.is_ok());
  EXPECT_NE(r.reason().find("causal recursion cannot stand in"), std::string::npos) << r.reason();
}

}  // namespace NUMATTN_UNITY_ID
}  // namespace
}  // namespace numattn
