#include "attention/kernel/linear.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "attention/method_def.h"
#include "numattn/attention/blocks/linear_attention.h"

namespace numattn {

namespace {

constexpr index_t kChunk = 128;

bool is_relu(const ParamValues& p) { return p.get_string("feature") == "relu"; }

/// φ(√s·x), float64 (the target's definition).
void phi64(bool relu, const double* x, index_t d, double scale, double* out) {
  const double rs = std::sqrt(scale);
  for (index_t k = 0; k < d; ++k) {
    const double u = rs * x[k];
    out[k] = relu ? std::max(u, 0.0) : (u > 0 ? u + 1 : std::exp(u));
  }
}

}  // namespace

const MethodInfo& LinearKernelAttention::describe() {
  static const MethodInfo info = [] {
    MethodInfo m;
    m.name = "kernel.linear";
    m.family = "kernel";
    m.summary = "linear attention with a fixed feature map elu(x)+1 or relu(x) (replaces softmax)";
    m.citation = "Katharopoulos et al., Transformers are RNNs: Fast Autoregressive Transformers with Linear Attention, ICML 2020";
    m.time_complexity = "O(N·Dk·Dv)";
    m.memory_complexity = "O(Nk·Dk) key features + O(Dk·Dv) states per head";
    m.params = {{"feature", ParamType::kString, "elu1", 0, 0, {"elu1", "relu"}, "φ: elu(x)+1 or relu(x), x ← x·√scale"}};
    m.caps = {.exact = false, .causal = true, .gqa = true, .bool_mask = false, .additive_mask = false,
              .window = false, .lse = false, .decode = true, .dk_ne_dv = true, .strided = true,
              .deterministic = true, .randomized = false};
    // It computes its target exactly, up to float32 rounding: the exact tolerance everywhere.
    m.accuracy.max_rel_fro_error = [](const BudgetInput& in) {
      return exact_f32_tolerance(in.logit_magnitude).rel_fro_error;
    };
    m.accuracy.limit_case = [](const AttentionProblem&) { return ParamOverrides{}; };
    m.accuracy.samples = {{{"feature", "relu"}}};
    return m;
  }();
  return info;
}

Target LinearKernelAttention::target() const {
  const bool relu = is_relu(params_);
  return Target::feature(
      relu ? "relu" : "elu+1",
      [relu](const double* x, index_t d, double scale, double* out) { phi64(relu, x, d, scale, out); },
      [](index_t d) { return d; });
}

Status LinearKernelAttention::can_run(const AttentionProblem& p) const {
  Status s = AttentionMethod::can_run(p);
  if (!s.is_ok()) return s;
  if (!(p.effective_scale() >= 0)) return Status::unsupported("kernel.linear needs scale ≥ 0 (x ← x·√scale)");
  return Status::ok();
}

std::size_t LinearKernelAttention::workspace_bytes(const AttentionProblem& p, const ExecContext& ctx) const {
  blocks::LinearAttentionConfig cfg;
  cfg.feature_dim = p.d_qk();
  cfg.chunk = kChunk;
  return 4 * static_cast<std::size_t>(p.batch() * p.kv_heads() * blocks::keys_read(p) * p.d_qk()) +
         blocks::linear_attention_workspace(p, cfg, ctx);
}

void LinearKernelAttention::forward(const AttentionProblem& p, const ExecContext& ctx) const {
  const bool relu = is_relu(params_);
  const index_t d = p.d_qk();
  const double s = p.effective_scale();
  const float rs = static_cast<float>(std::sqrt(s));
  const blocks::InputNorms n = blocks::input_norms(p, ctx);
  // φ(q)·φ(k) ≤ (√d + √s‖q‖)(√d + √s‖k‖); Nk of them times max|v| must stay in float32.
  const double rd = std::sqrt(static_cast<double>(d)), w = (rd + std::sqrt(s) * n.q) * (rd + std::sqrt(s) * n.k);
  const double bound = static_cast<double>(std::max<index_t>(p.n_kv(), 1)) * w * std::max(1.0, n.v);
  NUMATTN_CHECK(bound <= 1e36,
                "kernel.linear: Nk·(√d + √s·max‖q‖)(√d + √s·max‖k‖)·max(1, max|v|) = {:.3g} exceeds the float32 "
                "bound 1e36; reduce the scale or the magnitude of q, k, v",
                bound);
  auto rows_phi = [&](const TensorView<const float>& x, index_t b, index_t h, index_t r0, index_t rows, float* out) {
    for (index_t r = 0; r < rows; ++r) {
      const float* xr = x.row(b, h, r0 + r);
      float* o = out + r * d;
      for (index_t k = 0; k < d; ++k) {
        const float u = rs * xr[k];
        // φ(−inf) would be a finite 0: a non-finite input must reach the output as NaN (problem.h).
        o[k] = !std::isfinite(xr[k]) ? std::numeric_limits<float>::quiet_NaN()
               : relu                ? (u > 0 ? u : 0.f)
                                     : (u > 0 ? u + 1 : std::exp(u));
      }
    }
  };
  const std::vector<float> keys = blocks::key_features(
      p, d, [&](index_t b, index_t hk, index_t r0, index_t rows, float* out) { rows_phi(p.k, b, hk, r0, rows, out); },
      ctx);
  blocks::LinearAttentionConfig cfg;
  cfg.feature_dim = d;
  cfg.chunk = kChunk;
  blocks::linear_attention(
      p, cfg, [&](index_t b, index_t h, index_t r0, index_t rows, float* out) { rows_phi(p.q, b, h, r0, rows, out); },
      keys.data(), ctx);
}

double LinearKernelAttention::flops(const AttentionProblem& p) const {
  // φ of every query and key, the state Σ φ(k)·vᵀ (Nk·Dk·Dv) and every query against it; causal
  // (the block form, blocks/linear_attention.h): each chunk's own b × b block too.
  const double bh = static_cast<double>(p.batch() * p.heads()), dk = static_cast<double>(p.d_qk()),
               dv = static_cast<double>(p.d_v());
  const double diag = p.causal != Causal::kNone ? 2 * static_cast<double>(p.n_q() * kChunk) * (dk + dv + 1) : 0;
  return bh * (2 * static_cast<double>(p.n_q() + p.n_kv()) * dk * (dv + 1) + diag);
}

NUMATTN_DEFINE_METHOD(LinearKernelAttention)

}  // namespace numattn
