#include "attention/lowrank/skyformer.h"

#include <Eigen/Core>

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <vector>

#include "attention/method_def.h"
#include "numattn/attention/blocks/dense_softmax.h"
#include "numattn/attention/blocks/nonfinite_rows.h"
#include "numattn/core/blas.h"
#include "numattn/core/rng.h"
#include "numattn/core/simd.h"
#include "numattn/decomp/dense.h"
#include "numattn/decomp/pinv.h"

namespace numattn {

namespace {

using MatD = Eigen::Matrix<double, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
using MatF = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;

constexpr index_t kKeyChunk = 1024;  // keys per C_K block
constexpr index_t kRowBlock = 256;   // query rows per work item
constexpr double kExactRcond = 1e-6;
constexpr std::uint64_t kStreamTag = 0x536b79666f726d00ull;  // "Skyform\0"

index_t total_landmarks(const ParamValues& pv, const AttentionProblem& p) {
  return std::min<index_t>(pv.get_int("landmarks"), p.n_q() + p.n_kv());
}

bool is_limit(const ParamValues& pv, const AttentionProblem& p) {
  return pv.get_int("landmarks") >= p.n_q() + p.n_kv() && pv.get_float("gamma") == 0.0 &&
         pv.get_string("pinv") == "exact";
}

/// `count` distinct indices of [0, n), uniformly (partial Fisher–Yates on counter draws), sorted.
std::vector<index_t> sample_rows(index_t n, index_t count, const CounterRng& rng) {
  std::vector<index_t> perm(static_cast<std::size_t>(n));
  std::iota(perm.begin(), perm.end(), index_t{0});
  for (index_t i = 0; i < count; ++i) {
    const auto span = static_cast<double>(n - i);
    const index_t j = i + std::min<index_t>(n - i - 1, static_cast<index_t>(rng.uniform(static_cast<std::uint64_t>(i)) * span));
    std::swap(perm[static_cast<std::size_t>(i)], perm[static_cast<std::size_t>(j)]);
  }
  perm.resize(static_cast<std::size_t>(count));
  std::sort(perm.begin(), perm.end());
  return perm;
}

/// Budget against the Gaussian target: 3 + 20/sqrt(m) (m = landmarks used), calibrated (median over
/// 5 seeds) on the conformance matrix and on N = 512–4096 Gaussian and spiky problems, see
/// describe(): measured 5.98 at m = 1 (budget 23), 2.48 at m = 16 (8), 0.60 at m = 128 (4.8),
/// and about 1.0 at every m with logits ×100 (queries far from every landmark: the estimated
/// normalisers vanish and those rows come out 0). The limit case is exact.
double skyformer_budget(const BudgetInput& in) {
  if (is_limit(in.params, in.problem)) return exact_f32_tolerance(in.logit_magnitude).rel_fro_error;
  const double m = static_cast<double>(std::max<index_t>(1, total_landmarks(in.params, in.problem)));
  return 3.0 + 20.0 / std::sqrt(m);
}

}  // namespace

const MethodInfo& SkyformerAttention::describe() {
  static const MethodInfo info = [] {
    MethodInfo m;
    m.name = "lowrank.skyformer";
    m.family = "lowrank";
    m.summary = "Skyformer: Gaussian-kernel attention by Nyström on the symmetrised kernel matrix, rows normalised";
    m.citation = "Chen, Zeng, Ji, Yang, Skyformer: Remodel Self-Attention with Gaussian Kernel and Nyström Method, NeurIPS 2021";
    m.time_complexity = "O((Nq+Nk)·m·(Dk+Dv) + iters·m³)";
    m.memory_complexity = "O(B·Hq·m·(Dk+Dv) + threads·(1024·m + m²))";
    m.params = {
        {"landmarks", ParamType::kInt, "128", 1, 1 << 20, {}, "landmark rows m of [Q;K], half from each (≥ Nq+Nk: all)"},
        {"gamma", ParamType::kFloat, "0.1", 0, 10, {}, "regulariser γ added to the landmark kernel block"},
        {"pinv", ParamType::kString, "newton_schulz", 0, 0, {"newton_schulz", "exact"},
         "pseudo-inverse of the rescaled landmark block: Newton–Schulz in float32, or SVD in float64"},
        {"iters", ParamType::kInt, "6", 0, 12, {}, "Newton–Schulz iterations (pinv=newton_schulz)"},
        {"seed", ParamType::kInt, "0", 0, 2147483647, {}, "seed of the landmark sample (drawn per batch and head)"},
    };
    m.caps = {.exact = false, .causal = false, .gqa = true, .bool_mask = false, .additive_mask = false,
              .window = false, .lse = false, .decode = false, .randomized = true};
    m.accuracy.max_rel_fro_error = skyformer_budget;
    m.accuracy.limit_case = [](const AttentionProblem& p) {
      return ParamOverrides{{"landmarks", std::to_string(p.n_q() + p.n_kv())}, {"gamma", "0"}, {"pinv", "exact"}};
    };
    m.accuracy.convergence.param = "landmarks";
    m.accuracy.convergence.values = [](const AttentionProblem& p) {
      std::vector<std::string> v;
      for (index_t x : {8, 32, 128}) if (x < p.n_q() + p.n_kv()) v.push_back(std::to_string(x));
      v.push_back(std::to_string(p.n_q() + p.n_kv()));
      return v;
    };
    m.accuracy.samples = {{{"landmarks", "16"}, {"gamma", "0.01"}}};
    return m;
  }();
  return info;
}

SkyformerAttention::Landmarks SkyformerAttention::landmarks(const AttentionProblem& p, index_t b, index_t h) const {
  const index_t m = total_landmarks(params_, p), nq = p.n_q(), nk = p.n_kv();
  index_t mq = std::min(m / 2, nq);
  const index_t mk = std::min(m - mq, nk);
  mq = std::min(m - mk, nq);
  const auto seed = static_cast<std::uint64_t>(params_.get_int("seed"));
  const auto stream = kStreamTag + 2 * static_cast<std::uint64_t>(b * p.heads() + h);
  return {sample_rows(nq, mq, CounterRng(seed, stream)), sample_rows(nk, mk, CounterRng(seed, stream + 1))};
}

Status SkyformerAttention::can_run(const AttentionProblem& p) const {
  // It reads q: judge the float32 problem run() makes of half-precision Q / output.
  if (p.has_half_q() || p.has_half_out()) return can_run(widen_io(p).problem);
  Status base = AttentionMethod::can_run(p);
  if (!base.is_ok()) return base;
  const double s = p.effective_scale();
  if (!(s > 0))
    return Status::unsupported(fmt::format("lowrank.skyformer needs a positive scale for its Gaussian kernel (scale = {})", s));
  // Largest finite s·‖x‖² over q and k rows (non-finite rows are run()'s business).
  double worst = 0;
  auto scan = [&](const TensorView<const float>& t) {
    for (index_t b = 0; b < t.shape[0]; ++b)
      for (index_t h = 0; h < t.shape[1]; ++h)
        for (index_t n = 0; n < t.shape[2]; ++n) {
          const float* x = t.row(b, h, n);
          double n2 = 0;
          for (index_t d = 0; d < t.shape[3]; ++d) n2 += static_cast<double>(x[d]) * x[d];
          if (std::isfinite(n2)) worst = std::max(worst, s * n2);
        }
  };
  scan(p.q);
  scan(p.k);
  if (params_.get_string("pinv") == "newton_schulz" && total_landmarks(params_, p) > kMaxNsLandmarks)
    return Status::unsupported(fmt::format(
        "lowrank.skyformer(pinv=newton_schulz) uses at most {} landmarks (here min(landmarks, Nq+Nk) = {}): "
        "its 4·iters float32 products of m×m matrices cost 8·iters·m³ flops per head; use pinv=exact "
        "(one symmetric eigendecomposition) for more",
        kMaxNsLandmarks, total_landmarks(params_, p)));
  if (worst > kMaxScaledNorm2)
    return Status::unsupported(fmt::format(
        "lowrank.skyformer: scale·max(‖q‖², ‖k‖²) = {:.3g} exceeds {:.0e}; its float32 kernel exponent "
        "x·y − ‖x‖²/2 − ‖y‖²/2 would carry a rounding error above 0.1 (reduce the scale or the input magnitude)",
        worst, kMaxScaledNorm2));
  return Status::ok();
}

std::size_t SkyformerAttention::workspace_bytes(const AttentionProblem& p, const ExecContext& ctx) const {
  const auto m = static_cast<std::size_t>(total_landmarks(params_, p));
  const auto bh = static_cast<std::size_t>(p.batch() * p.heads());
  return sizeof(float) * bh * m * static_cast<std::size_t>(p.d_qk() + p.d_v() + 2) +
         static_cast<std::size_t>(ctx.num_threads()) * (sizeof(float) * (kKeyChunk + kRowBlock) * (m + 1) +
                                                         sizeof(double) * 4 * m * m);
}

void SkyformerAttention::forward(const AttentionProblem& p, const ExecContext& ctx) const {
  if (blocks::mark_rows_reading_nonfinite(p, ctx)) return;
  const index_t B = p.batch(), H = p.heads(), G = p.group(), nq = p.n_q(), nk = p.n_kv(), dk = p.d_qk(), dv = p.d_v();
  const double s = p.effective_scale();
  if (nq == 0) return;
  if (nk == 0 || is_limit(params_, p)) {
    // Â = A: normalised Gaussian attention = softmax of s·(q·k − ‖k‖²/2), as [q,1]·[k,−‖k‖²/2].
    std::vector<float> qa(static_cast<std::size_t>(B * H * nq * (dk + 1))), ka(static_cast<std::size_t>(B * p.kv_heads() * nk * (dk + 1)));
    for (index_t b = 0; b < B; ++b) {
      for (index_t h = 0; h < H; ++h)
        for (index_t i = 0; i < nq; ++i) {
          float* dst = qa.data() + ((b * H + h) * nq + i) * (dk + 1);
          std::copy_n(p.q.row(b, h, i), dk, dst);
          dst[dk] = 1.f;
        }
      for (index_t h = 0; h < p.kv_heads(); ++h)
        for (index_t j = 0; j < nk; ++j) {
          float* dst = ka.data() + ((b * p.kv_heads() + h) * nk + j) * (dk + 1);
          const float* k = p.k.row(b, h, j);
          double n2 = 0;
          for (index_t d = 0; d < dk; ++d) n2 += static_cast<double>(k[d]) * k[d];
          std::copy_n(k, dk, dst);
          dst[dk] = static_cast<float>(-0.5 * n2);
        }
    }
    AttentionProblem sub;
    sub.q = TensorView<float>::contiguous(qa.data(), {B, H, nq, dk + 1});
    sub.k = TensorView<float>::contiguous(ka.data(), {B, p.kv_heads(), nk, dk + 1});
    sub.v = p.v;
    sub.out = p.out;
    sub.scale = s;
    blocks::dense_softmax_attention(sub, ctx);
    return;
  }

  const index_t m = total_landmarks(params_, p);
  const double gamma = params_.get_float("gamma");
  const bool exact_pinv = params_.get_string("pinv") == "exact";
  const int iters = static_cast<int>(params_.get_int("iters"));
  const float c = static_cast<float>(std::sqrt(s));
  const index_t dw = dv + 1;
  // Per (b, h): landmarks X_S = sqrt(s)·rows (m×dk), their half squared norms, W = D·Z·D·C_Kᵀ[V|1].
  std::vector<float> xs(static_cast<std::size_t>(B * H * m * dk)), xs2(static_cast<std::size_t>(B * H * m)),
      w(static_cast<std::size_t>(B * H * m * dw));

  parallel_for(ctx, B * H, [&](std::int64_t t) {
    const index_t b = t / H, h = t % H, hk = h / G;
    const Landmarks lm = landmarks(p, b, h);
    float* x = xs.data() + t * m * dk;
    float* x2 = xs2.data() + t * m;
    MatD xsd(m, dk);
    index_t r = 0;
    for (index_t i : lm.q_rows) {
      for (index_t d = 0; d < dk; ++d) xsd(r, d) = static_cast<double>(c) * p.q.row(b, h, i)[d];
      ++r;
    }
    for (index_t j : lm.k_rows) {
      for (index_t d = 0; d < dk; ++d) xsd(r, d) = static_cast<double>(c) * p.k.row(b, hk, j)[d];
      ++r;
    }
    for (index_t a = 0; a < m; ++a) {
      for (index_t d = 0; d < dk; ++d) x[a * dk + d] = static_cast<float>(xsd(a, d));
      x2[a] = static_cast<float>(0.5 * xsd.row(a).squaredNorm());
    }
    // T = C_Kᵀ·[V | 1] over key chunks: C_K(j, a) = exp(c·k_j·x_a − s‖k_j‖²/2 − ‖x_a‖²/2).
    std::vector<float> ck(static_cast<std::size_t>(kKeyChunk * m)), tv(static_cast<std::size_t>(m * dv), 0.f);
    std::vector<double> t1(static_cast<std::size_t>(m), 0.0);
    for (index_t j0 = 0; j0 < nk; j0 += kKeyChunk) {
      const index_t wdt = std::min(kKeyChunk, nk - j0);
      blas::sgemm(blas::Trans::kNo, blas::Trans::kYes, wdt, m, dk, c, p.k.row(b, hk, j0), p.k.stride[2], x, dk, 0.f,
                  ck.data(), m);
      for (index_t j = 0; j < wdt; ++j) {
        const float* kr = p.k.row(b, hk, j0 + j);
        double n2 = 0;
        for (index_t d = 0; d < dk; ++d) n2 += static_cast<double>(kr[d]) * kr[d];
        const float hk2 = static_cast<float>(0.5 * s * n2);
        float* row = ck.data() + j * m;
        for (index_t a = 0; a < m; ++a) row[a] = simd::exp_f32(row[a] - hk2 - x2[a]);
        for (index_t a = 0; a < m; ++a) t1[static_cast<std::size_t>(a)] += row[a];
      }
      blas::sgemm(blas::Trans::kYes, blas::Trans::kNo, m, dv, wdt, 1.f, ck.data(), m, p.v.row(b, hk, j0), p.v.stride[2],
                  j0 == 0 ? 0.f : 1.f, tv.data(), dv);
    }
    // STAS = κ(X_S, X_S) + γI in float64 from differences; D = diag(STAS·1)^(−1/2).
    // ‖x_a − x_e‖² = ‖x_a‖² + ‖x_e‖² − 2·x_a·x_e (float64 GEMM; the cancellation costs ε₆₄·‖x‖²).
    const Eigen::VectorXd n2 = xsd.rowwise().squaredNorm();
    MatD stas = xsd * xsd.transpose();
    for (index_t a = 0; a < m; ++a)
      for (index_t e = 0; e < m; ++e) stas(a, e) = std::exp(std::min(0.0, stas(a, e) - 0.5 * (n2(a) + n2(e))));
    stas.diagonal().array() += gamma;
    const Eigen::VectorXd dsc = stas.rowwise().sum().array().rsqrt();
    const MatD scaled = dsc.asDiagonal() * stas * dsc.asDiagonal();
    MatD z;
    if (exact_pinv) {
      // The rescaled block is symmetric PSD: its Moore–Penrose inverse from the symmetric
      // eigendecomposition (several times cheaper than an SVD), same cut-off as pinv_svd.
      // (Finite: a problem with a non-finite input returned at the top.)
      const decomp::dense::SymEig eig = decomp::dense::sym_eig(scaled);
      const Eigen::VectorXd& lam = eig.values;
      const double cut = kExactRcond * lam.cwiseAbs().maxCoeff();
      Eigen::VectorXd inv(lam.size());
      for (Eigen::Index i = 0; i < lam.size(); ++i) inv(i) = std::abs(lam(i)) > cut ? 1.0 / lam(i) : 0.0;
      z = eig.vectors * inv.asDiagonal() * eig.vectors.transpose();
    } else {
      decomp::NewtonSchulzPinv<float> ns(iters);
      ns.compute(scaled.cast<float>());
      z = ns.pinv().cast<double>();
    }
    MatD tw(m, dw);
    tw.leftCols(dv) = Eigen::Map<const MatF>(tv.data(), m, dv).cast<double>();
    tw.col(dv) = Eigen::Map<const Eigen::VectorXd>(t1.data(), m);
    const MatD wm = dsc.asDiagonal() * (z * (dsc.asDiagonal() * tw));
    Eigen::Map<MatF>(w.data() + t * m * dw, m, dw) = wm.cast<float>();
  });

  // Queries: a_i = row-max-rescaled C_Q row (exp(c·q_i·x_a − ‖x_a‖²/2), the exp(−s‖q_i‖²/2)
  // factor cancels), out_i = (a_i·W_v) / (a_i·W_1).
  const index_t nblk = (nq + kRowBlock - 1) / kRowBlock;
  parallel_for(ctx, B * H * nblk, [&](std::int64_t t) {
    const index_t bh = t / nblk, blk = t % nblk, b = bh / H, h = bh % H;
    const index_t i0 = blk * kRowBlock, rows = std::min(kRowBlock, nq - i0);
    const float* x = xs.data() + bh * m * dk;
    const float* x2 = xs2.data() + bh * m;
    std::vector<float> a(static_cast<std::size_t>(rows * m)), o(static_cast<std::size_t>(rows * dw));
    blas::sgemm(blas::Trans::kNo, blas::Trans::kYes, rows, m, dk, c, p.q.row(b, h, i0), p.q.stride[2], x, dk, 0.f,
                a.data(), m);
    for (index_t r = 0; r < rows; ++r) {
      float* row = a.data() + r * m;
      float mx = -std::numeric_limits<float>::infinity();
      for (index_t e = 0; e < m; ++e) mx = std::max(mx, row[e] -= x2[e]);
      for (index_t e = 0; e < m; ++e) row[e] = simd::exp_f32(row[e] - mx);
    }
    blas::sgemm(blas::Trans::kNo, blas::Trans::kNo, rows, dw, m, 1.f, a.data(), m, w.data() + bh * m * dw, dw, 0.f,
                o.data(), dw);
    for (index_t r = 0; r < rows; ++r) {
      const float* orow = o.data() + r * dw;
      float* dst = p.out.row(b, h, i0 + r);
      // Not positive: the signed estimate failed, the row is 0. A ratio that overflows from
      // finite parts is the same failure; non-finite parts (an overflow upstream, e.g. C_Kᵀ·V
      // with values near FLT_MAX) stay non-finite for run() to report.
      const float den = orow[dv];
      bool upstream = !std::isfinite(den);
      for (index_t d = 0; d < dv; ++d) upstream |= !std::isfinite(orow[d]);
      if (upstream) {
        std::fill(dst, dst + dv, std::numeric_limits<float>::quiet_NaN());
        continue;
      }
      bool ok = den > 0.f;
      for (index_t d = 0; d < dv && ok; ++d) ok = std::isfinite(dst[d] = orow[d] / den);
      if (!ok) std::fill(dst, dst + dv, 0.f);
    }
  });
}

double SkyformerAttention::flops(const AttentionProblem& p) const {
  // Kernel columns of the m landmarks of [Q; K] for every query and key, C_Kᵀ·V, the m×m
  // pseudo-inverse (Newton–Schulz: about 8·m³ per iteration; exact: SVD, about 22·m³), and the
  // products back to every query.
  const double bh = static_cast<double>(p.batch() * p.heads()), m = static_cast<double>(total_landmarks(params_, p)),
               n = static_cast<double>(p.n_q() + p.n_kv()), dk = static_cast<double>(p.d_qk()),
               dv = static_cast<double>(p.d_v());
  const double pinv = params_.get_string("pinv") == "exact" ? 22 * m * m * m
                                                            : 8.0 * static_cast<double>(params_.get_int("iters")) * m * m * m;
  return bh * (2 * n * m * dk + 2 * static_cast<double>(p.n_kv()) * m * dv + pinv + 2 * m * m * dv +
               2 * static_cast<double>(p.n_q()) * m * (dv + 1));
}

NUMATTN_DEFINE_METHOD(SkyformerAttention)

}  // namespace numattn
