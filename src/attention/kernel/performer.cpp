#include "attention/kernel/performer.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <memory>

#include "attention/method_def.h"
#include "numattn/attention/blocks/dense_softmax.h"
#include "numattn/attention/blocks/linear_attention.h"
#include "numattn/attention/blocks/performer_features.h"
#include "numattn/core/blas.h"
#include "numattn/core/simd.h"

namespace numattn {

namespace {

constexpr float kEps = 1e-6f;             // the official numerical_stabilizer
constexpr double kLogitRefusal = 1e6;     // |s|·max‖q‖·max‖k‖ beyond which we refuse
constexpr index_t kCausalChunk = 32;      // b of the block algorithm: measured fastest at N = 16384 (16–128 tried)
constexpr double kMaxKeyExponent = 60;    // key features ≤ e^60 (E_j − shift): Nk·e^60·max|v| stays in float32

double budget(const BudgetInput& in) {
  if (in.params.get_int("features") == 0) return exact_f32_tolerance(in.logit_magnitude).rel_fro_error;
  // An empirical envelope, not a theorem: on Gaussian inputs with unit entries ‖√s·x‖² ≈ √d, where
  // the PRF variance (∝ e^{2‖x‖²}/M) swamps the estimate, and the error relative to ‖Y‖_F grows
  // with the number of keys (flat rows average the values away, the noise does not). Calibrated on
  // the conformance matrix (median over 5 seeds), at least 2× above every measured error:
  // positive/hyperbolic at most 0.5·√Nk + 1.5 (measured 7.6 at Nk = 2000, D = 128; 1.0 on
  // logits ×100), trig (signed, clamped denominators) 10·√Nk + 10 (measured 73 at Nk = 130).
  const double nk = static_cast<double>(std::max<index_t>(in.problem.n_kv(), 1));
  if (in.params.get_string("kernel") == "trig") return 10 * std::sqrt(nk) + 10;
  return 0.5 * std::sqrt(nk) + 1.5;
}

}  // namespace

const MethodInfo& PerformerAttention::describe() {
  static const MethodInfo info = [] {
    MethodInfo m;
    m.name = "kernel.performer";
    m.family = "kernel";
    m.summary = "FAVOR+ random features for the softmax kernel (positive/hyperbolic/trig, orthogonal)";
    m.citation = "Choromanski et al., Rethinking Attention with Performers, ICLR 2021";
    m.time_complexity = "O(N·M·(Dk+Dv))";
    m.memory_complexity = "O(Nk·M) key features + O(M·Dv) states per head";
    m.params = {
        {"features", ParamType::kInt, "256", 0, 1024, {},
         "M: random directions ω (2M features for trig/hyperbolic); 0 = M → ∞, exp(q·k) evaluated exactly"},
        {"orthogonal", ParamType::kBool, "true", 0, 0, {}, "orthogonal blocks with χ_d row norms (else i.i.d. Gaussian)"},
        {"kernel", ParamType::kString, "positive", 0, 0, {"positive", "trig", "hyperbolic"}, "feature map"},
        {"redraw", ParamType::kString, "head", 0, 0, {"head", "shared"},
         "independent ω per KV head, or one draw shared by all heads"},
        {"causal_algo", ParamType::kString, "block", 0, 0, {"block", "prefix"},
         "causal: block lower-triangular GEMMs or token-level prefix sums"},
        {"seed", ParamType::kInt, "0", 0, 2147483647, {}, "seed of the random directions"},
    };
    m.caps = {.exact = false, .causal = true, .gqa = true, .bool_mask = false, .additive_mask = false,
              .window = false, .lse = false, .decode = true, .dk_ne_dv = true, .strided = true,
              .deterministic = true, .randomized = true};
    m.accuracy.max_rel_fro_error = budget;
    // The limit M → ∞ (features = 0): the estimator's expectation exp(q·k), i.e. softmax itself.
    // No convergence sweep is declared: on the harness's convergence problem (logits ×2, D = 32,
    // ‖√s·q‖² ≈ 23) the PRF variance ∝ e^{2‖x‖²}/M keeps the error near 1.2 from M = 8 to 4096
    // (measured); kernel_performer_test checks the fall with M where the variance is moderate.
    m.accuracy.limit_case = [](const AttentionProblem&) { return ParamOverrides{{"features", "0"}}; };
    m.accuracy.samples = {{{"kernel", "hyperbolic"}, {"features", "64"}},
                          {{"orthogonal", "false"}, {"causal_algo", "prefix"}}};
    return m;
  }();
  return info;
}

PerformerAttention::Kernel PerformerAttention::kernel() const {
  const std::string& k = params_.get_string("kernel");
  return k == "trig" ? Kernel::kTrig : k == "hyperbolic" ? Kernel::kHyperbolic : Kernel::kPositive;
}

std::vector<double> PerformerAttention::directions(index_t d, index_t hk) const {
  const index_t stream = params_.get_string("redraw") == "head" ? hk : 0;
  return blocks::performer_directions(params_.get_int("features"), d,
                                      static_cast<std::uint64_t>(params_.get_int("seed")),
                                      static_cast<std::uint64_t>(stream), params_.get_bool("orthogonal"));
}

void PerformerAttention::features_f64(Kernel kernel, const std::vector<double>& w, index_t m, const double* x,
                                      index_t d, double* phi) {
  double n2 = 0;
  for (index_t k = 0; k < d; ++k) n2 += x[k] * x[k];
  n2 /= 2;
  for (index_t r = 0; r < m; ++r) {
    double u = 0;
    for (index_t k = 0; k < d; ++k) u += w[static_cast<std::size_t>(r * d + k)] * x[k];
    switch (kernel) {
      case Kernel::kPositive: phi[r] = std::exp(u - n2) / std::sqrt(static_cast<double>(m)); break;
      case Kernel::kHyperbolic:
        phi[r] = std::exp(u - n2) / std::sqrt(2.0 * m);
        phi[m + r] = std::exp(-u - n2) / std::sqrt(2.0 * m);
        break;
      case Kernel::kTrig:
        phi[r] = std::exp(n2) * std::sin(u) / std::sqrt(static_cast<double>(m));
        phi[m + r] = std::exp(n2) * std::cos(u) / std::sqrt(static_cast<double>(m));
        break;
    }
  }
}

Status PerformerAttention::can_run(const AttentionProblem& p) const {
  // It reads q: judge the float32 problem run() makes of half-precision Q / output.
  if (p.has_half_q() || p.has_half_out()) return can_run(widen_io(p).problem);
  Status s = AttentionMethod::can_run(p);
  if (!s.is_ok()) return s;
  if (!(p.effective_scale() >= 0)) return Status::unsupported("kernel.performer needs scale ≥ 0 (x ← x·√scale)");
  return Status::ok();
}

std::size_t PerformerAttention::workspace_bytes(const AttentionProblem& p, const ExecContext& ctx) const {
  if (params_.get_int("features") == 0) return blocks::dense_softmax_workspace_bytes(p, ctx.num_threads());
  const index_t m = params_.get_int("features"), f = kernel() == Kernel::kPositive ? m : 2 * m;
  blocks::LinearAttentionConfig cfg;
  cfg.feature_dim = f;
  cfg.chunk = kCausalChunk;
  const std::size_t keys = static_cast<std::size_t>(p.batch() * p.kv_heads() * blocks::keys_read(p) * f);
  return 4 * (keys + static_cast<std::size_t>(p.kv_heads() * m * p.d_qk())) +
         8 * static_cast<std::size_t>(p.batch() * p.kv_heads() * blocks::keys_read(p)) +
         blocks::linear_attention_workspace(p, cfg, ctx);
}

void PerformerAttention::forward(const AttentionProblem& p, const ExecContext& ctx) const {
  if (params_.get_int("features") == 0) {  // M → ∞: exp(q·k) exactly, by the exact flash kernel
    blocks::dense_softmax_attention(p, ctx);
    return;
  }
  const index_t m = params_.get_int("features"), d = p.d_qk();
  const Kernel ker = kernel();
  const index_t f = ker == Kernel::kPositive ? m : 2 * m;  // feature columns
  const double s = p.effective_scale(), rs = std::sqrt(s);
  // √s folded into the directions: ω·(√s x) = (√s ω)·x. One matrix per KV head (or one shared).
  const bool shared = params_.get_string("redraw") == "shared";
  const index_t ndir = shared ? 1 : p.kv_heads();
  // Stored transposed (d × M) so that the projections are NN GEMMs (faster in OpenBLAS than NT).
  std::vector<float> dirs(static_cast<std::size_t>(ndir * m * d));
  for (index_t hk = 0; hk < ndir; ++hk) {  // cached draws: a loop, not another parallel region
    const std::vector<double> w = directions(d, hk);
    float* out = dirs.data() + hk * m * d;
    for (index_t r = 0; r < m; ++r)
      for (index_t k = 0; k < d; ++k) out[k * m + r] = static_cast<float>(rs * w[static_cast<std::size_t>(r * d + k)]);
  }
  auto dir_of = [&](index_t hk) { return dirs.data() + (shared ? 0 : hk * m * d); };

  constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();
  // P = X Wᵀ into columns [0, m) of rows with stride f.
  auto project = [&](const float* x, index_t ldx, index_t rows, index_t hk, float* out) {
    blas::sgemm(blas::Trans::kNo, blas::Trans::kNo, rows, m, d, 1.f, x, ldx, dir_of(hk), m, 0.f, out, f);
  };
  auto half_norm2 = [&](const float* x) {
    double n2 = 0;
    for (index_t k = 0; k < d; ++k) n2 += static_cast<double>(x[k]) * x[k];
    return 0.5 * s * n2;
  };
  // A row holding P in [0, m) becomes: trig [sin P, cos P]·e^offset; positive/hyperbolic
  // exp(E − max E + offset) + ε with E = P (or [P, −P]): the ‖x‖²/2 of the exponent is constant
  // along the row, so it cancels against the row maximum exactly and is carried by `offset`.
  // Returns max E (NaN when the row is not finite: its features become NaN).
  auto finish = [&](float* row, float offset) -> float {
    if (!simd::all_finite(row, m)) {
      std::fill(row, row + f, kNaN);
      return kNaN;
    }
    if (ker == Kernel::kTrig) {
      const float w = simd::exp_f32(offset);  // NaN offset (a non-finite key) stays NaN
      for (index_t r = 0; r < m; ++r) {
        const float u = row[r];
        row[m + r] = w * std::cos(u);
        row[r] = w * std::sin(u);
      }
      return 0.f;
    }
    if (ker == Kernel::kHyperbolic)
      for (index_t r = 0; r < m; ++r) row[m + r] = -row[r];
    const float mx = simd::max_f32(row, f);
    simd::exp_shift(row, f, offset - mx, kEps);
    return mx;
  };

  // Keys: project; the exponent's maximum per key E_j (max E − s‖k‖²/2, or s‖k‖²/2 for trig's
  // weight); then features with offset = −(s‖k‖²/2 + c), one shift c per head (it cancels).
  // The official stabiliser takes c = max_j E_j over every key: a later key then changes the
  // features, and the outputs, of earlier rows. Here c = max E_j over the keys that every row
  // reading a key sees (all keys without a causal rule: the official shift; the first key of a
  // square causal problem; the shared prefix of a decode-like one), so no row depends on a key
  // it does not see. A key with E_j − c > kMaxKeyExponent would leave float32 sums: a row that
  // sees one is refused below.
  const index_t nk = blocks::keys_read(p), nbk = p.batch() * p.kv_heads();
  // Key features of every head: 4·B·Hkv·Nk·f bytes, the largest buffer here. Reused by the calling
  // thread across calls (a fresh one costs a page fault and a kernel page clear per 4 KiB, ~20% of
  // a large call); uninitialised: the projection below writes every element.
  thread_local std::vector<float> key_buffer;
  const std::size_t key_floats = static_cast<std::size_t>(nbk * nk * f);
  if (key_buffer.size() < key_floats) {
    key_buffer = std::vector<float>();
    key_buffer.reserve(key_floats);
    key_buffer.resize(key_floats);
  }
  float* const keys_data = key_buffer.data();
  std::vector<double> key_exp(static_cast<std::size_t>(nbk * nk));
  std::vector<double> key_norm(static_cast<std::size_t>(nbk * nk), 0.0);  // s‖k‖²/2 of finite keys
  constexpr index_t kSeg = 512;
  const index_t nseg = (nk + kSeg - 1) / kSeg;
  parallel_for(ctx, nbk * nseg, [&](std::int64_t t) {
    const index_t bk = t / nseg, j0 = (t % nseg) * kSeg, rows = std::min(kSeg, nk - j0);
    const index_t b = bk / p.kv_heads(), hk = bk % p.kv_heads();
    float* out = keys_data + (bk * nk + j0) * f;
    project(p.k.row(b, hk, j0), p.k.stride[2], rows, hk, out);
    for (index_t r = 0; r < rows; ++r) {
      const float* row = out + r * f;
      const std::size_t at = static_cast<std::size_t>(bk * nk + j0 + r);
      const double n2h = half_norm2(p.k.row(b, hk, j0 + r));
      if (std::isfinite(n2h)) key_norm[at] = n2h;
      if (!simd::all_finite(row, m) || !std::isfinite(n2h)) {
        key_exp[at] = std::numeric_limits<double>::quiet_NaN();
        continue;
      }
      float mx = simd::max_f32(row, m);
      if (ker == Kernel::kHyperbolic) {
        float mn = mx;
        for (index_t c = 0; c < m; ++c) mn = std::min(mn, row[c]);
        mx = std::max(mx, -mn);
      }
      key_exp[at] = ker == Kernel::kTrig ? n2h : static_cast<double>(mx) - n2h;
    }
  });
  // Per head: the shift c, and the running maxima of E_j and of s‖k‖²/2 over the keys j' ≤ j
  // (finite ones), which bound each query's features and logits by the keys it sees.
  index_t common = nk;  // keys every row that sees a key sees
  for (index_t i = 0; i < p.n_q(); ++i) {
    const KeyRange kr = p.key_range(i);
    if (!kr.empty()) common = std::min(common, kr.end);
  }
  std::vector<double> head_shift(static_cast<std::size_t>(nbk), 0.0);
  std::vector<double> key_top(static_cast<std::size_t>(nbk * nk));
  for (index_t bk = 0; bk < nbk; ++bk) {
    double c = -std::numeric_limits<double>::infinity(), top = c;
    for (index_t j = 0; j < nk; ++j) {
      const std::size_t at = static_cast<std::size_t>(bk * nk + j);
      if (std::isfinite(key_exp[at])) top = std::max(top, key_exp[at]);
      if (j < common) c = top;
      key_top[at] = top;
      if (j > 0) key_norm[at] = std::max(key_norm[at], key_norm[at - 1]);
    }
    head_shift[static_cast<std::size_t>(bk)] = std::isfinite(c) ? c : 0.0;
  }
  parallel_for(ctx, nbk * nseg, [&](std::int64_t t) {
    const index_t bk = t / nseg, j0 = (t % nseg) * kSeg, rows = std::min(kSeg, nk - j0);
    for (index_t r = 0; r < rows; ++r) {
      const std::size_t at = static_cast<std::size_t>(bk * nk + j0 + r);
      const double e = key_exp[at];
      // E_j − c; the row maximum is then added back in `finish`: exp(E − max E + (max E − c)).
      const float off = static_cast<float>(e - head_shift[static_cast<std::size_t>(bk)]);  // NaN stays NaN
      finish(keys_data + at * f, off);
    }
  });

  // Queries: each row shifted by its own maximum (offset 0).
  blocks::FeatureFn query = [&](index_t b, index_t h, index_t i0, index_t rows, float* psi) {
    project(p.q.row(b, h, i0), p.q.stride[2], rows, h / p.group(), psi);
    const index_t bk = b * p.kv_heads() + h / p.group();
    for (index_t r = 0; r < rows; ++r) {
      const index_t seen = p.causal == Causal::kNone ? nk : p.key_range(i0 + r).end;
      const double kn2 = seen > 0 ? key_norm[static_cast<std::size_t>(bk * nk + seen - 1)] : 0.0;
      const double kmax = std::sqrt(2 * kn2 / std::max(s, 1e-300));
      const double qn = std::sqrt(2 * half_norm2(p.q.row(b, h, i0 + r)) / std::max(s, 1e-300));
      NUMATTN_CHECK(!(s * qn * kmax > kLogitRefusal) || !std::isfinite(qn),  // non-finite: NaN features
                    "kernel.performer: |scale|·‖q‖·max‖k‖ = {:.3g} (query row [b,h,i] = [{},{},{}], over the keys it "
                    "sees) exceeds {:.0e}; random features carry no information about such logits (and float32 "
                    "projections lose them); reduce the scale or the magnitude of q and k",
                    s * qn * kmax, b, h, i0 + r, kLogitRefusal);
      const double top = seen > 0 ? key_top[static_cast<std::size_t>(bk * nk + seen - 1)] : 0.0;
      NUMATTN_CHECK(!(top - head_shift[static_cast<std::size_t>(bk)] > kMaxKeyExponent),
                    "kernel.performer: query row [b,h,i] = [{},{},{}] sees a key whose feature exponent is {:.3g} above "
                    "the stabiliser's shift (the largest over the keys every row sees): its features would exceed "
                    "e^{:.0f} and leave float32 sums; reduce the spread of the key norms",
                    b, h, i0 + r, top - head_shift[static_cast<std::size_t>(bk)], kMaxKeyExponent);
      finish(psi + r * f, 0.f);
    }
  };
  blocks::LinearAttentionConfig cfg;
  cfg.feature_dim = f;
  cfg.chunk = kCausalChunk;
  cfg.causal_algo = params_.get_string("causal_algo") == "prefix" ? blocks::CausalAlgo::kPrefix : blocks::CausalAlgo::kBlock;
  cfg.den = ker == Kernel::kTrig ? blocks::Denominator{0, true} : blocks::Denominator{};
  blocks::linear_attention(p, cfg, query, keys_data, ctx);
}

double PerformerAttention::flops(const AttentionProblem& p) const {
  // Features of every query and key (M projections of Dk, then exp), the key–value state
  // (Nk·M·Dv and the normaliser) and every query against it (Nq·M·Dv); the causal block form
  // (blocks/linear_attention.h) adds each chunk's own b × b block of feature products and values.
  const double m = static_cast<double>(params_.get_int("features"));
  const double bh = static_cast<double>(p.batch() * p.heads()), nq = static_cast<double>(p.n_q()),
               nk = static_cast<double>(p.n_kv()), dk = static_cast<double>(p.d_qk()), dv = static_cast<double>(p.d_v());
  const bool block = p.causal != Causal::kNone && params_.get_string("causal_algo") == "block";
  const double diag = block ? 2 * nq * static_cast<double>(kCausalChunk) * (m + dv + 1) : 0;
  return bh * (2 * (nq + nk) * m * dk + 2 * (nk + nq) * m * (dv + 1) + diag);
}

NUMATTN_DEFINE_METHOD(PerformerAttention)

}  // namespace numattn
