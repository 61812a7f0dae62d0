#include "attention/lowrank/nystrom.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "attention/method_def.h"
#include "numattn/attention/blocks/dense_softmax.h"
#include "numattn/attention/blocks/nonfinite_rows.h"
#include "numattn/decomp/pinv.h"

namespace numattn {

namespace {

using MatF = decomp::NewtonSchulzPinv<float>::Matrix;
using MatD = decomp::NewtonSchulzPinv<double>::Matrix;

/// pinv=exact: singular values of F2 below this fraction of the largest are below the float32
/// resolution of F1 and F3 and are treated as zero (ε·m would amplify their rounding by 1e10).
constexpr double kExactRcond = 1e-6;

/// Segment means of the n rows of `x` (row stride ld, width d) into m near-equal segments,
/// accumulated in float64 (a mean of finite floats is finite; their float32 sum may not be).
void segment_means(const float* x, index_t ld, index_t n, index_t d, index_t m, float* out) {
  std::vector<double> acc(static_cast<std::size_t>(d));
  for (index_t t = 0; t < m; ++t) {
    const index_t r0 = t * n / m, r1 = (t + 1) * n / m;
    std::fill(acc.begin(), acc.end(), 0.0);
    for (index_t r = r0; r < r1; ++r)
      for (index_t c = 0; c < d; ++c) acc[static_cast<std::size_t>(c)] += x[r * ld + c];
    const double inv = 1.0 / static_cast<double>(r1 - r0);
    for (index_t c = 0; c < d; ++c) out[t * d + c] = static_cast<float>(acc[static_cast<std::size_t>(c)] * inv);
  }
}

/// Budget, calibrated on the conformance matrix and on N = 1024–4096 Gaussian and spiky problems
/// (docs in describe()), with a safety factor of at least 3:
/// - landmarks ≥ Nk: exact (the float32 tolerance);
/// - newton_schulz: 2·(1 + L/100), doubled for each iteration beyond 6 (more steps invert the
///   small singular values of an ill-conditioned F2 and amplify the Nyström inconsistency;
///   measured: 0.55 at N = 130 Gaussian, 1.8 with logits ×100, 42 there with 12 iterations);
/// - exact: 1e5. The Moore–Penrose inverse (cut-off 1e-6·σ_max) of an ill-conditioned F2
///   multiplies F1 and F3 rows that are not in its row and column spaces: measured 11 on
///   Gaussian N = 130 and 2.3e4 with logits ×100. It is kept as the unregularised reference
///   for the iteration, not as a usable setting.
double nystrom_budget(const BudgetInput& in) {
  const AttentionProblem& p = in.problem;
  const index_t m = in.params.get_int("landmarks");
  if (m >= p.n_kv()) return exact_f32_tolerance(in.logit_magnitude).rel_fro_error;
  if (in.params.get_string("pinv") == "exact") return 1e5;
  const auto extra = std::max<std::int64_t>(0, in.params.get_int("iters") - 6);
  return 2.0 * (1.0 + in.logit_magnitude / 100.0) * std::ldexp(1.0, static_cast<int>(extra));
}

}  // namespace

const MethodInfo& NystromAttention::describe() {
  static const MethodInfo info = [] {
    MethodInfo m;
    m.name = "lowrank.nystrom";
    m.family = "lowrank";
    m.summary = "Nyströmformer: segment-mean landmarks, F1·pinv(F2)·(F3·V) (training-free, non-causal)";
    m.citation = "Xiong et al., Nyströmformer: A Nyström-Based Algorithm for Approximating Self-Attention, AAAI 2021";
    m.time_complexity = "O((Nq+Nk)·m·(Dk+Dv) + iters·m³)";
    m.memory_complexity = "O(B·Hq·m·(Dk+Dv) + threads·m²)";
    m.params = {
        {"landmarks", ParamType::kInt, "64", 1, 1 << 20, {}, "number of segment-mean landmarks m (≥ Nk: exact)"},
        {"pinv", ParamType::kString, "newton_schulz", 0, 0, {"newton_schulz", "exact"},
         "pseudo-inverse of F2: Newton–Schulz iteration in float32, or SVD in float64"},
        {"iters", ParamType::kInt, "6", 0, 12, {}, "Newton–Schulz iterations (pinv=newton_schulz)"},
    };
    m.caps = {.exact = false, .causal = false, .gqa = true, .bool_mask = false, .additive_mask = false,
              .window = false, .lse = false, .decode = false};
    m.accuracy.max_rel_fro_error = nystrom_budget;
    m.accuracy.limit_case = [](const AttentionProblem& p) {
      return ParamOverrides{{"landmarks", std::to_string(std::max<index_t>(1, p.n_kv()))}};
    };
    m.accuracy.convergence.param = "landmarks";
    m.accuracy.convergence.values = [](const AttentionProblem& p) {
      std::vector<std::string> v;
      for (index_t x : {4, 16, 64}) if (x < p.n_kv()) v.push_back(std::to_string(x));
      v.push_back(std::to_string(p.n_kv()));
      return v;
    };
    m.accuracy.samples = {{{"landmarks", "16"}}, {{"pinv", "exact"}, {"landmarks", "16"}}, {{"iters", "3"}}};
    return m;
  }();
  return info;
}

Status NystromAttention::can_run(const AttentionProblem& p) const {
  // It reads q: judge the float32 problem run() makes of half-precision Q / output.
  if (p.has_half_q() || p.has_half_out()) return can_run(widen_io(p).problem);
  return AttentionMethod::can_run(p);
}

std::size_t NystromAttention::workspace_bytes(const AttentionProblem& p, const ExecContext& ctx) const {
  const index_t m = params_.get_int("landmarks");
  if (m >= p.n_kv()) return 0;
  const auto bh = static_cast<std::size_t>(p.batch() * p.heads());
  const auto mm = static_cast<std::size_t>(m);
  return sizeof(float) * bh * mm * static_cast<std::size_t>(2 * p.d_qk() + 2 * p.d_v()) +
         static_cast<std::size_t>(ctx.num_threads()) * sizeof(double) * 6 * mm * mm;
}

void NystromAttention::forward(const AttentionProblem& p, const ExecContext& ctx) const {
  if (blocks::mark_rows_reading_nonfinite(p, ctx)) return;
  const index_t B = p.batch(), H = p.heads(), G = p.group();
  const index_t nq = p.n_q(), nk = p.n_kv(), dk = p.d_qk(), dv = p.d_v();
  const index_t m = params_.get_int("landmarks");
  const double s = p.effective_scale();
  if (m >= nk || nk == 0 || nq == 0) {  // limit case: K̃ = K, F1 = P (see the header)
    AttentionProblem sub = p;
    sub.scale = s;
    sub.lse = {};
    blocks::dense_softmax_attention(sub, ctx);
    return;
  }
  const index_t mq = std::min(m, nq), mk = m;
  const bool exact_pinv = params_.get_string("pinv") == "exact";
  const int iters = static_cast<int>(params_.get_int("iters"));

  // Landmarks: Q̃ per query head [B,H,mq,dk]; K̃ per kv head, copied to each query head of its
  // group [B,H,mk,dk] so that the last attention (queries over landmark keys, values W per
  // query head) is a plain multi-head problem.
  std::vector<float> qt(static_cast<std::size_t>(B * H * mq * dk)), kt(static_cast<std::size_t>(B * H * mk * dk));
  parallel_for(ctx, B * H, [&](std::int64_t t) {
    const index_t b = t / H, h = t % H;
    segment_means(p.q.row(b, h, 0), p.q.stride[2], nq, dk, mq, qt.data() + t * mq * dk);
    if (h % G == 0)
      segment_means(p.k.row(b, h / G, 0), p.k.stride[2], nk, dk, mk, kt.data() + t * mk * dk);
  });
  parallel_for(ctx, B * H, [&](std::int64_t t) {
    if (t % G == 0) return;
    std::copy_n(kt.data() + (t - t % G) * mk * dk, mk * dk, kt.data() + t * mk * dk);
  });
  const auto view = [&](float* d, index_t rows, index_t cols) {
    return TensorView<float>::contiguous(d, {B, H, rows, cols});
  };

  // F3·V = softmax(s·Q̃Kᵀ)·V: landmark queries over all keys (GQA as in p).
  std::vector<float> f3v(static_cast<std::size_t>(B * H * mq * dv));
  {
    AttentionProblem sub;
    sub.q = view(qt.data(), mq, dk);
    sub.k = p.k;
    sub.v = p.v;
    sub.out = view(f3v.data(), mq, dv);
    sub.scale = s;
    blocks::dense_softmax_attention(sub, ctx);
  }

  // W = pinv(F2)·(F3·V), F2 = softmax(s·Q̃K̃ᵀ) (mq×mk), per head; W overwrites a [B,H,mk,dv] buffer.
  std::vector<float> w(static_cast<std::size_t>(B * H * mk * dv));
  parallel_for(ctx, B * H, [&](std::int64_t t) {
    const Eigen::Map<const Eigen::Matrix<float, -1, -1, Eigen::RowMajor>> qm(qt.data() + t * mq * dk, mq, dk);
    const Eigen::Map<const Eigen::Matrix<float, -1, -1, Eigen::RowMajor>> km(kt.data() + t * mk * dk, mk, dk);
    MatD f2 = (qm.cast<double>() * km.cast<double>().transpose()) * s;
    for (index_t i = 0; i < mq; ++i) {
      f2.row(i).array() = (f2.row(i).array() - f2.row(i).maxCoeff()).exp();
      f2.row(i) /= f2.row(i).sum();
    }
    const Eigen::Map<const Eigen::Matrix<float, -1, -1, Eigen::RowMajor>> f3vm(f3v.data() + t * mq * dv, mq, dv);
    Eigen::Map<Eigen::Matrix<float, -1, -1, Eigen::RowMajor>> wm(w.data() + t * mk * dv, mk, dv);
    if (exact_pinv) {
      wm = (decomp::pinv_svd(f2, kExactRcond) * f3vm.cast<double>()).cast<float>();
    } else {
      decomp::NewtonSchulzPinv<float> ns(iters);
      ns.compute(f2.cast<float>());
      wm.noalias() = ns.pinv() * f3vm;
    }
  });

  // Ŷ = F1·W = softmax(s·QK̃ᵀ)·W: all queries over the landmark keys.
  AttentionProblem sub;
  sub.q = p.q;
  sub.k = view(kt.data(), mk, dk);
  sub.v = view(w.data(), mk, dv);
  sub.out = p.out;
  sub.scale = s;
  blocks::dense_softmax_attention(sub, ctx);
}

double NystromAttention::flops(const AttentionProblem& p) const {
  // Landmark queries over all keys (F3·V), F2 (m×m), its pseudo-inverse (Newton–Schulz: about
  // 8·m³ per iteration, four m×m products; exact: SVD, about 22·m³), W = pinv·F3V, and every query
  // over the landmark keys (F1·W). Limit (m ≥ Nk): exact attention.
  const index_t m = params_.get_int("landmarks");
  if (m >= p.n_kv() || p.n_q() == 0) return attention_flops(p);
  const double bh = static_cast<double>(p.batch() * p.heads()), nq = static_cast<double>(p.n_q()),
               nk = static_cast<double>(p.n_kv()), mq = static_cast<double>(std::min(m, p.n_q())),
               mk = static_cast<double>(m), dk = static_cast<double>(p.d_qk()), dv = static_cast<double>(p.d_v());
  const double pinv = params_.get_string("pinv") == "exact" ? 22 * mk * mk * mk
                                                            : 8.0 * static_cast<double>(params_.get_int("iters")) * mk * mk * mk;
  return bh * (2 * mq * nk * (dk + dv) + 2 * mq * mk * dk + pinv + 2 * mk * mq * dv + 2 * nq * mk * (dk + dv));
}

NUMATTN_DEFINE_METHOD(NystromAttention)

}  // namespace numattn
