// The edge semantics of problem.h below the harness: the reference's refusals and their order,
// the -inf logit that the softmax would drop without a trace (the +inf-in-K bug), the split-KV
// path of exact.flash, AttentionMethod::run's settling of non-finite rows, scale validation.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <memory>

#include "numattn/attention/registry.h"
#include "numattn/core/simd.h"
#include "support/test_util.h"

namespace numattn {
namespace {
namespace NUMATTN_UNITY_ID {

constexpr float kInf = std::numeric_limits<float>::infinity();
constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();

ProblemConfig small(index_t heads, index_t kv_heads, index_t n, index_t nk, index_t d) {
  ProblemConfig cfg;
  cfg.heads = heads;
  cfg.kv_heads = kv_heads;
  cfg.n = n;
  cfg.n_kv = nk;
  cfg.d = d;
  cfg.seed = test::base_seed();
  return cfg;
}

float& at(std::vector<float>& data, const TensorView<const float>& view, index_t b, index_t h, index_t n, index_t d) {
  return data[static_cast<std::size_t>(view.row(b, h, n) + d - data.data())];
}

/// The NonFiniteInput `fn` throws, or a failure.
template <class F>
NonFiniteInput refusal(F fn) {
  try {
    fn();
  } catch (const NonFiniteInput& e) {
    return e;
  }
  ADD_FAILURE() << "no NonFiniteInput thrown";
  return NonFiniteInput("none", {}, 0);
}

TEST(Edges, ReferenceNamesTheFirstElementTheFirstRowReadsWhateverTheThreads) {
  RandomProblem prob(small(2, 1, 12, 40, 8));
  const AttentionProblem& p = prob.problem();
  at(prob.k_data(), p.k, 0, 0, 30, 2) = kNaN;
  at(prob.k_data(), p.k, 0, 0, 5, 7) = -kInf;  // row 0 reads key 5 before key 30
  at(prob.v_data(), p.v, 0, 0, 3, 1) = kInf;   // v is read after every k of the row
  for (int threads : {1, 3}) {
    const NonFiniteInput e = refusal([&] { reference_all(p, ExecContext{threads}); });
    EXPECT_EQ(e.tensor(), "k");
    EXPECT_EQ(e.index(), (std::vector<index_t>{0, 0, 5, 7}));
    EXPECT_NE(std::string(e.what()).find("k[0,0,5,7] is -inf"), std::string::npos) << e.what();
  }
}

TEST(Edges, QueriesThatSeeNoKeyReadNothing) {
  ProblemConfig cfg = small(1, 1, 4, 6, 4);
  RandomProblem prob(cfg);
  std::vector<std::uint8_t> allowed(24, 1);
  for (int j = 0; j < 6; ++j) allowed[static_cast<std::size_t>(2 * 6 + j)] = 0;  // row 2 sees nothing
  prob.set_bool_mask(allowed);
  at(prob.q_data(), prob.problem().q, 0, 0, 2, 1) = kNaN;
  for (const char* spec : {"exact.reference", "exact.naive", "exact.flash"}) {
    create_method(spec)->run(prob.problem(), ExecContext{2});
    for (index_t d = 0; d < 4; ++d) EXPECT_EQ(prob.problem().out(0, 0, 2, d), 0.f) << spec;
    EXPECT_EQ(prob.problem().lse(0, 0, 2, 0), -kInf) << spec;
  }
}

TEST(Edges, GarbageInKeysNoQuerySeesLeavesAnEmptyRowEmpty) {
  // Kernels multiply zero weights by the hidden key's NaN (0·NaN = NaN), so the row that sees
  // nothing comes out NaN and is settled in float64: it must stay 0 / -inf, with no error.
  RandomProblem prob(small(2, 1, 6, 40, 8));
  std::vector<std::uint8_t> allowed(6 * 40, 1);
  for (int i = 0; i < 6; ++i) allowed[static_cast<std::size_t>(i * 40 + 6)] = 0;  // key 6: nobody
  for (int j = 0; j < 40; ++j) allowed[static_cast<std::size_t>(2 * 40 + j)] = 0;  // row 2: nothing
  prob.set_bool_mask(allowed);
  at(prob.v_data(), prob.problem().v, 0, 0, 6, 3) = kNaN;
  at(prob.k_data(), prob.problem().k, 0, 0, 6, 1) = -kInf;
  const ReferenceRows ref = reference_all(prob.problem(), ExecContext{1});
  for (const char* spec : {"exact.reference", "exact.naive", "exact.flash"}) {
    create_method(spec)->run(prob.problem(), ExecContext{2});
    const ErrorMetrics e = compare_with_reference(prob.problem(), ref);
    const ExactTolerance tol = exact_f32_tolerance(e.logit_magnitude);
    EXPECT_LE(e.rel_fro_error, tol.rel_fro_error) << spec;
    EXPECT_LE(e.lse_max_abs_error, tol.lse_max_abs_error) << spec;
    for (index_t h = 0; h < 2; ++h) {
      for (index_t d = 0; d < 8; ++d) EXPECT_EQ(prob.problem().out(0, h, 2, d), 0.f) << spec;
      EXPECT_EQ(prob.problem().lse(0, h, 2, 0), -kInf) << spec;
    }
  }
}

TEST(Edges, AMinusInfLogitIsNotDroppedSilently) {
  // k = -inf against all-positive queries gives every logit of that key -inf: a softmax drops
  // it without a NaN anywhere (before, +inf in K zeroed rows and -inf vanished).
  for (const char* spec : {"exact.naive", "exact.flash", "exact.flash(split_kv=4,block_k=16)", "exact.flash(key_lanes=64)",
                           "exact.flash(key_lanes=64,split_kv=4,block_k=16)"}) {
    for (float bad : {-kInf, kInf}) {
      RandomProblem prob(small(8, 1, 1, 300, 16));
      for (float& x : prob.q_data()) x = std::abs(x) + 0.1f;
      at(prob.k_data(), prob.problem().k, 0, 0, 123, 4) = bad;
      const NonFiniteInput e = refusal([&] { create_method(spec)->run(prob.problem(), ExecContext{2}); });
      EXPECT_EQ(e.index(), (std::vector<index_t>{0, 0, 123, 4})) << spec << " " << bad;
    }
  }
}

TEST(Edges, SplitKvPartialsCarryNonFiniteValuesToTheMerge) {
  for (const std::string t : {"q", "k", "v"})
    for (float bad : {kNaN, kInf, -kInf}) {
      RandomProblem prob(small(8, 2, 2, 2000, 32));
      prob.problem().causal = Causal::kBottomRight;
      const AttentionProblem& p = prob.problem();
      const std::vector<index_t> idx = t == "q" ? std::vector<index_t>{0, 5, 1, 9} : std::vector<index_t>{0, 1, 1500, 9};
      float& x = t == "q"   ? at(prob.q_data(), p.q, idx[0], idx[1], idx[2], idx[3])
                 : t == "k" ? at(prob.k_data(), p.k, idx[0], idx[1], idx[2], idx[3])
                            : at(prob.v_data(), p.v, idx[0], idx[1], idx[2], idx[3]);
      x = bad;
      for (const char* spec : {"exact.flash(split_kv=7)", "exact.flash(split_kv=7,key_lanes=64)"}) {
        const NonFiniteInput e = refusal([&] { create_method(spec)->run(prob.problem(), ExecContext{3}); });
        EXPECT_EQ(e.tensor(), t) << spec;
        EXPECT_EQ(e.index(), idx) << spec << " " << t << " " << bad;
      }
    }
}

/// exact.naive's MethodInfo under another name, with a defect after its forward pass.
class NanOnFiniteInputs final : public AttentionMethod {
 public:
  explicit NanOnFiniteInputs(bool exact) : AttentionMethod(ParamValues()), inner_(create_method("exact.naive")) {
    info_ = inner_->info();
    info_.name = "test.nan_row";
    info_.caps.exact = exact;
  }
  const MethodInfo& info() const override { return info_; }
  void forward(const AttentionProblem& p, const ExecContext& ctx) const override {
    inner_->forward(p, ctx);
    if (!bug) return;
    p.out(0, 0, 3, 1) = kNaN;
  }
  bool bug = true;

 private:
  MethodInfo info_;
  std::unique_ptr<AttentionMethod> inner_;
};

std::string error_of(const AttentionMethod& m, const AttentionProblem& p) {
  try {
    m.run(p, ExecContext{2});
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(Edges, RunReportsANonFiniteRowFromFiniteInputsAsABugInTheMethod) {
  RandomProblem prob(small(2, 2, 8, 8, 4));
  const NanOnFiniteInputs m(true);
  const std::string e = error_of(m, prob.problem());
  EXPECT_NE(e.find("internal error: test.nan_row returned a non-finite value in query row [b,h,i] = [0,0,3]"),
            std::string::npos) << e;
}

TEST(Edges, OverflowIsComputedInFloat64ByExactMethodsAndRefusedByOthers) {
  ProblemConfig cfg = small(2, 2, 8, 8, 4);
  cfg.scale = 1e38;
  cfg.want_lse = false;
  RandomProblem prob(cfg);
  NanOnFiniteInputs exact(true), approx(false);
  exact.bug = approx.bug = false;  // exact.naive itself: its logits overflow float32
  EXPECT_EQ(error_of(exact, prob.problem()), "");
  const ErrorMetrics e = compare_with_reference(prob.problem(), reference_all(prob.problem(), ExecContext{1}));
  EXPECT_EQ(e.max_abs_error, 0.0);  // one-hot rows, computed in float64 and rounded once
  const std::string msg = error_of(approx, prob.problem());
  EXPECT_NE(msg.find("test.nan_row cannot compute query row [b,h,i] = [0,0,0] in float32 (logits up to"),
            std::string::npos) << msg;
  EXPECT_NE(msg.find("it has no float64 path"), std::string::npos) << msg;
}

TEST(Edges, AnLseBeyondFloat32IsRefusedWithTheRowAndItsValue) {
  ProblemConfig cfg = small(1, 1, 3, 5, 4);
  cfg.scale = 1e38;
  RandomProblem prob(cfg);
  std::fill(prob.q_data().begin(), prob.q_data().end(), 1.f);  // every logit is 4e38
  std::fill(prob.k_data().begin(), prob.k_data().end(), 1.f);
  for (const char* spec : {"exact.reference", "exact.naive", "exact.flash"}) {
    const std::string msg = error_of(*create_method(spec), prob.problem());
    EXPECT_NE(msg.find("the log-sum-exp of query row [b,h,i] = [0,0,0] is "), std::string::npos) << msg;
    EXPECT_NE(msg.find("beyond the float32 range of the lse output (±3.403e+38)"), std::string::npos) << msg;
  }
}

TEST(Edges, ValidateRefusesAScaleBeyondFloat32) {
  RandomProblem prob(small(1, 1, 2, 2, 2));
  prob.problem().scale = 1e39;
  try {
    validate(prob.problem());
    ADD_FAILURE() << "scale 1e39 accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("scale 1e+39 must be finite and at most 3.403e+38"), std::string::npos) << e.what();
  }
  prob.problem().scale = -3e38;  // negative and large is a valid float32 scale
  EXPECT_NO_THROW(validate(prob.problem()));
}

TEST(Edges, ValidateRefusesAWindowBelowMinusOne) {
  RandomProblem prob(small(1, 1, 4, 4, 2));
  for (auto [l, r] : {std::pair<index_t, index_t>{-2, -1}, {-1, -7}, {3, -2}}) {
    prob.problem().window_left = l;
    prob.problem().window_right = r;
    try {
      validate(prob.problem());
      ADD_FAILURE() << "window " << l << ", " << r << " accepted";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("must be >= 0 (keys on that side of the diagonal) or -1"),
                std::string::npos) << e.what();
    }
  }
  prob.problem().window_left = -1;
  prob.problem().window_right = 0;
  EXPECT_NO_THROW(validate(prob.problem()));
}

TEST(Edges, AllFiniteSeesEveryNonFiniteValueAtEveryPosition) {
  std::vector<float> x(37, 1.f);
  x[5] = -0.f;
  x[6] = std::numeric_limits<float>::denorm_min();
  x[7] = std::numeric_limits<float>::max();
  x[8] = -std::numeric_limits<float>::max();
  EXPECT_TRUE(simd::all_finite(x.data(), 37));
  EXPECT_TRUE(simd::all_finite(x.data(), 0));
  for (float bad : {kNaN, kInf, -kInf, -kNaN})
    for (std::size_t i = 0; i < x.size(); ++i) {
      std::vector<float> y = x;
      y[i] = bad;
      EXPECT_FALSE(simd::all_finite(y.data(), 37)) << i << " " << bad;
    }
}

}  // namespace NUMATTN_UNITY_ID
}  // namespace
}  // namespace numattn
