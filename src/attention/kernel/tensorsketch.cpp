#include "attention/kernel/tensorsketch.h"

#include <cmath>
#include <limits>
#include <memory>
#include <vector>

#include "attention/method_def.h"
#include "numattn/attention/blocks/linear_attention.h"
#include "numattn/core/simd.h"
#include "numattn/decomp/sketch.h"

namespace numattn {

namespace {

constexpr index_t kChunk = 128;

double budget(const BudgetInput& in) {
  if (in.params.get_bool("exact")) return exact_f32_tolerance(in.logit_magnitude).rel_fro_error;
  // From the variance bound, not a calibration: each weight's estimate has standard deviation
  // ≤ √((3^p − 1)/r)·(s·‖q‖·‖k‖)^p; a row sums Nk of them over a denominator ≥ 1 (the clamp and
  // the "1 +"), so the error relative to the output is at most about 1 + √((3^p−1)/r)·B^p·Nk with
  // B = s·max‖q‖·max‖k‖ (finite rows). Signed estimates of sums of p-th powers are that poor: the
  // measured errors reach 1e3–1e12 on the conformance matrix (logits ×100, degree 4), within it.
  const AttentionProblem& p = in.problem;
  const int deg = static_cast<int>(in.params.get_int("degree"));
  const double r = static_cast<double>(in.params.get_int("sketch"));
  auto max_norm = [](const TensorView<const float>& x) {
    double best = 0;
    for (index_t b = 0; b < x.shape[0]; ++b)
      for (index_t h = 0; h < x.shape[1]; ++h)
        for (index_t i = 0; i < x.shape[2]; ++i) {
          double n2 = 0;
          for (index_t k = 0; k < x.shape[3]; ++k) n2 += static_cast<double>(x(b, h, i, k)) * x(b, h, i, k);
          if (std::isfinite(n2)) best = std::max(best, std::sqrt(n2));
        }
    return best;
  };
  const double bnd = std::abs(p.effective_scale()) * max_norm(p.q) * max_norm(p.k);
  return 1 + std::sqrt((std::pow(3.0, deg) - 1) / r) * std::pow(bnd, deg) * static_cast<double>(p.n_kv());
}

}  // namespace

const MethodInfo& TensorSketchAttention::describe() {
  static const MethodInfo info = [] {
    MethodInfo m;
    m.name = "kernel.tensorsketch";
    m.family = "kernel";
    m.summary = "polynomial attention with TensorSketch features (CountSketch + real FFT; replaces softmax)";
    m.citation = "Pham and Pagh, Fast and Scalable Polynomial Kernels via Explicit Feature Maps, KDD 2013";
    m.time_complexity = "O(N·p·(Dk + r·log r) + N·r·Dv)";
    m.memory_complexity = "O(Nk·r + r·Dv) per head";
    m.params = {
        {"degree", ParamType::kInt, "2", 2, 4, {}, "p: 2 or 4 (even)"},
        {"sketch", ParamType::kInt, "256", 16, 1024, {}, "r: sketch size (FFT length)"},
        {"exact", ParamType::kBool, "false", 0, 0, {}, "exact tensor features (x·y)^p: the limit case, quadratic"},
        {"seed", ParamType::kInt, "0", 0, 2147483647, {}, "seed of the CountSketch hashes"},
    };
    m.caps = {.exact = false, .causal = true, .gqa = true, .bool_mask = false, .additive_mask = false,
              .window = false, .lse = false, .decode = true, .dk_ne_dv = true, .strided = true,
              .deterministic = true, .randomized = true};
    m.accuracy.max_rel_fro_error = budget;
    m.accuracy.limit_case = [](const AttentionProblem&) { return ParamOverrides{{"exact", "true"}}; };
    m.accuracy.convergence.param = "sketch";
    m.accuracy.convergence.values = [](const AttentionProblem&) {
      return std::vector<std::string>{"16", "64", "256", "1024"};
    };
    m.accuracy.samples = {{{"degree", "4"}, {"sketch", "64"}}};
    return m;
  }();
  return info;
}

Target TensorSketchAttention::target() const {
  return Target::polynomial(static_cast<int>(params_.get_int("degree")), 1.0);
}

Status TensorSketchAttention::can_run(const AttentionProblem& p) const {
  Status s = AttentionMethod::can_run(p);
  if (!s.is_ok()) return s;
  if (params_.get_int("degree") % 2 != 0)
    return Status::unsupported("kernel.tensorsketch: degree must be even (the target's 1 + Σ(s·q·k)^p must be positive)");
  if (!(p.effective_scale() >= 0)) return Status::unsupported("kernel.tensorsketch needs scale ≥ 0 (x ← x·√scale)");
  return Status::ok();
}

namespace {
blocks::LinearAttentionConfig config(const ParamValues& params) {
  blocks::LinearAttentionConfig cfg;
  cfg.feature_dim = params.get_int("sketch");
  cfg.chunk = kChunk;
  cfg.den.clamp_nonneg = true;  // signed estimates: out = Σ w v / (α·β + max(Σ w, 0))
  return cfg;
}
}  // namespace

std::size_t TensorSketchAttention::workspace_bytes(const AttentionProblem& p, const ExecContext& ctx) const {
  if (params_.get_bool("exact")) return blocks::exact_polynomial_workspace(p, ctx);
  return blocks::sketched_polynomial_workspace(p, config(params_), ctx);
}

void TensorSketchAttention::forward(const AttentionProblem& p, const ExecContext& ctx) const {
  const int degree = static_cast<int>(params_.get_int("degree"));
  if (params_.get_bool("exact")) {
    blocks::exact_polynomial_attention(p, degree, 1.0, ctx);
    return;
  }
  const index_t r = params_.get_int("sketch"), d = p.d_qk();
  const auto seed = static_cast<std::uint64_t>(params_.get_int("seed"));
  const double rs = std::sqrt(p.effective_scale());
  std::vector<std::unique_ptr<decomp::TensorSketch>> ts;
  for (index_t hk = 0; hk < p.kv_heads(); ++hk)
    ts.push_back(std::make_unique<decomp::TensorSketch>(d, r, degree, seed, static_cast<std::uint64_t>(hk)));
  auto phi = [&](const TensorView<const float>& x, index_t b, index_t h, index_t hk, index_t r0, index_t rows,
                 float* out) { ts[static_cast<std::size_t>(hk)]->apply_rows(x.row(b, h, r0), x.stride[2], rows, rs, out, r); };
  blocks::sketched_polynomial_attention(p, config(params_), phi, "kernel.tensorsketch", ctx);
}

NUMATTN_DEFINE_METHOD(TensorSketchAttention)

}  // namespace numattn
