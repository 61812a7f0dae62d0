#include "attention/lowrank/wildcat.h"

#include <Eigen/Core>

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "attention/method_def.h"
#include "numattn/core/blas.h"
#include "numattn/core/simd.h"
#include "numattn/decomp/rpcholesky.h"

namespace numattn {

namespace {

constexpr index_t kRowBlock = 64;
constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();
constexpr float kNegInf = -std::numeric_limits<float>::infinity();
/// A row whose denominator is below this fraction of Σ|terms| falls back to exact attention.
constexpr float kCancel = 1e-3f;
/// Automatic τ² = kTauGain·max‖k‖/max‖q‖ (see wildcat.h): the radius balance times 2, the best
/// of 1, 2, 4, 8, 16 over Gaussian and spiky inputs (N = 1024, D = 64, logits ×1 and ×10).
constexpr double kTauGain = 2.0;

/// The compressed keys and values of one (batch, kv head).
struct Coreset {
  bool bad = false;          ///< a k or v entry is not finite: every row reads it
  index_t r = 0;             ///< coreset size
  std::vector<float> ks;     ///< r × Dk: K_S, in pivot order
  std::vector<float> bias;   ///< r: −(β/τ²)‖kₛ‖²/2 (0 in the exact limit)
  std::vector<float> x;      ///< r × (Dv + 1): [W·V | W·1], up to a common positive factor
};

double norm2(const float* x, index_t n) {
  double s = 0;
  for (index_t i = 0; i < n; ++i) s += static_cast<double>(x[i]) * x[i];
  return s;
}

Coreset compress(const AttentionProblem& p, index_t b, index_t hk, index_t rank, double tau, std::uint64_t seed) {
  Coreset cs;
  const index_t n = p.n_kv(), d = p.d_qk(), dv = p.d_v();
  for (index_t j = 0; j < n && !cs.bad; ++j)
    cs.bad = !simd::all_finite(p.k.row(b, hk, j), d) || !simd::all_finite(p.v.row(b, hk, j), dv);
  if (cs.bad || n == 0) return cs;
  if (rank >= n) {  // every key, W = I: exact attention through the same apply step
    cs.r = n;
    cs.ks.resize(static_cast<std::size_t>(n * d));
    cs.x.resize(static_cast<std::size_t>(n * (dv + 1)));
    cs.bias.assign(static_cast<std::size_t>(n), 0.f);
    for (index_t j = 0; j < n; ++j) {
      std::copy(p.k.row(b, hk, j), p.k.row(b, hk, j) + d, cs.ks.begin() + j * d);
      std::copy(p.v.row(b, hk, j), p.v.row(b, hk, j) + dv, cs.x.begin() + j * (dv + 1));
      cs.x[static_cast<std::size_t>(j * (dv + 1) + dv)] = 1.f;
    }
    return cs;
  }
  // τ² and the kernel's coefficient c = β/τ².
  double rk = 0, rq = 0;
  std::vector<double> kn2(static_cast<std::size_t>(n));
  for (index_t j = 0; j < n; ++j) rk = std::max(rk, kn2[static_cast<std::size_t>(j)] = norm2(p.k.row(b, hk, j), d));
  for (index_t h = hk * p.group(); h < (hk + 1) * p.group(); ++h)
    for (index_t i = 0; i < p.n_q(); ++i) {
      const double q2 = norm2(p.q.row(b, h, i), d);
      if (std::isfinite(q2)) rq = std::max(rq, q2);
    }
  const double tau2 = tau > 0 ? tau * tau : (rk > 0 && rq > 0 ? kTauGain * std::sqrt(rk / rq) : 1.0);
  const double c = std::abs(p.effective_scale()) / tau2;
  std::vector<double> K(static_cast<std::size_t>(n * d)), half(static_cast<std::size_t>(n)), logw(static_cast<std::size_t>(n));
  for (index_t j = 0; j < n; ++j) {
    std::copy(p.k.row(b, hk, j), p.k.row(b, hk, j) + d, K.begin() + j * d);
    half[static_cast<std::size_t>(j)] = 0.5 * c * kn2[static_cast<std::size_t>(j)];
    logw[static_cast<std::size_t>(j)] = 2 * half[static_cast<std::size_t>(j)];
  }
  const std::vector<double> ones(static_cast<std::size_t>(n), 1.0);
  decomp::RpCholeskyOptions opt;
  opt.rank = rank;
  opt.seed = seed;
  opt.stream = static_cast<std::uint64_t>(b * p.kv_heads() + hk);
  opt.log_weight = logw;
  // Columns of the Gaussian kernel G̃ = exp(c·kᵢ·kⱼ − hᵢ − hⱼ) = exp(−c‖kᵢ − kⱼ‖²/2): one
  // matrix-vector product (vectorised) and n exps per pivot.
  const Eigen::Map<const Eigen::Matrix<double, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>> Km(K.data(), n, d);
  const decomp::RpCholeskyResult f = decomp::rp_cholesky(n, ones, [&](index_t s, double* col) {
    Eigen::Map<Eigen::VectorXd> cv(col, n);
    cv.noalias() = Km * Km.row(s).transpose();
    const double hs = half[static_cast<std::size_t>(s)];
    for (index_t i = 0; i < n; ++i) col[i] = std::min(1.0, std::exp(c * col[i] - half[static_cast<std::size_t>(i)] - hs));
  }, opt);
  const index_t r = static_cast<index_t>(f.pivots.size());
  cs.r = r;
  // [W·V | W·1] ∝ F̃_S⁻ᵀ·F̃ᵀ·D'·[V | 1], D'ⱼ = exp(hⱼ − max h) ≤ 1.
  const double hmax = *std::max_element(half.begin(), half.end());
  Eigen::MatrixXd DV(n, dv + 1);
  for (index_t j = 0; j < n; ++j) {
    const double w = std::exp(half[static_cast<std::size_t>(j)] - hmax);
    const float* vr = p.v.row(b, hk, j);
    for (index_t t = 0; t < dv; ++t) DV(j, t) = w * vr[t];
    DV(j, dv) = w;
  }
  Eigen::MatrixXd FS(r, r);
  for (index_t t = 0; t < r; ++t) FS.row(t) = f.factor.row(f.pivots[static_cast<std::size_t>(t)]);
  const Eigen::MatrixXd M = f.factor.transpose() * DV;  // r × (Dv + 1)
  const Eigen::MatrixXd X = FS.triangularView<Eigen::Lower>().transpose().solve(M);
  cs.ks.resize(static_cast<std::size_t>(r * d));
  cs.bias.resize(static_cast<std::size_t>(r));
  cs.x.resize(static_cast<std::size_t>(r * (dv + 1)));
  for (index_t t = 0; t < r; ++t) {
    const index_t s = f.pivots[static_cast<std::size_t>(t)];
    std::copy(p.k.row(b, hk, s), p.k.row(b, hk, s) + d, cs.ks.begin() + t * d);
    cs.bias[static_cast<std::size_t>(t)] = static_cast<float>(-half[static_cast<std::size_t>(s)]);
    for (index_t u = 0; u <= dv; ++u) cs.x[static_cast<std::size_t>(t * (dv + 1) + u)] = static_cast<float>(X(t, u));
  }
  return cs;
}

/// Exact softmax attention of one query row over all keys (the fallback for a cancelling
/// denominator), float64 accumulation.
void exact_row(const AttentionProblem& p, index_t b, index_t h, index_t i, float* o) {
  const index_t hk = h / p.group(), n = p.n_kv(), d = p.d_qk(), dv = p.d_v();
  const double scale = p.effective_scale();
  const float* q = p.q.row(b, h, i);
  std::vector<double> l(static_cast<std::size_t>(n)), acc(static_cast<std::size_t>(dv), 0.0);
  double m = -std::numeric_limits<double>::infinity();
  for (index_t j = 0; j < n; ++j) {
    const float* k = p.k.row(b, hk, j);
    double s = 0;
    for (index_t t = 0; t < d; ++t) s += static_cast<double>(q[t]) * k[t];
    l[static_cast<std::size_t>(j)] = scale * s;
    m = std::max(m, scale * s);
  }
  double z = 0;
  for (index_t j = 0; j < n; ++j) {
    const double w = std::exp(l[static_cast<std::size_t>(j)] - m);
    z += w;
    const float* v = p.v.row(b, hk, j);
    for (index_t t = 0; t < dv; ++t) acc[static_cast<std::size_t>(t)] += w * v[t];
  }
  for (index_t t = 0; t < dv; ++t) o[t] = static_cast<float>(acc[static_cast<std::size_t>(t)] / z);
}

}  // namespace

const MethodInfo& WildcatAttention::describe() {
  static const MethodInfo info = [] {
    MethodInfo m;
    m.name = "lowrank.wildcat";
    m.family = "lowrank";
    m.summary = "weighted coreset: RPCholesky pivots of exp(β/τ²·KKᵀ), Nyström weights, attention over r keys";
    m.citation = "Schröder and Mackey, WildCat: Near-Linear Attention in Theory and Practice, arXiv 2602.10056, 2026";
    m.time_complexity = "O(Nk·r·(Dk + r + Dv) + Nq·r·(Dk+Dv))";
    m.memory_complexity = "O(Nk·(r + Dk)) per kv head in flight + O(r·(Dk+Dv))";
    m.params = {
        {"rank", ParamType::kInt, "64", 1, 1 << 20, {}, "coreset size r (RPCholesky pivots; rank ≥ Nk: exact)"},
        {"tau", ParamType::kFloat, "0", 0, 4, {}, "scale τ of the Nyström kernel exp(β/τ²·k·k'); 0 = τ² = max‖k‖/max‖q‖"},
        {"seed", ParamType::kInt, "0", 0, 2147483647, {}, "seed of the pivot draws"},
    };
    m.caps = {.exact = false, .causal = false, .gqa = true, .bool_mask = false, .additive_mask = false,
              .window = false, .lse = false, .decode = false, .randomized = true};
    AccuracyContract& a = m.accuracy;
    a.max_rel_fro_error = [](const BudgetInput& in) {
      const index_t r = in.params.get_int("rank");
      const double exact = exact_f32_tolerance(in.logit_magnitude).rel_fro_error;
      if (r >= in.problem.n_kv()) return exact;
      // Measured on the conformance matrix, with a margin. On flat rows a coreset of r keys
      // behaves like attention to r of Nk keys, about sqrt(Nk/r − 1) off; on peaked rows the
      // Nyström weights can miss the heavy key, about ‖v_a − v_b‖/‖v_a‖ ≲ 1.5.
      const double nk = static_cast<double>(in.problem.n_kv());
      return 1.5 + 1.5 * std::sqrt(nk / static_cast<double>(r) - 1) + exact;
    };
    a.limit_case = [](const AttentionProblem& p) {
      return ParamOverrides{{"rank", std::to_string(std::max<index_t>(1, p.n_kv()))}};
    };
    a.convergence.param = "rank";
    a.convergence.values = [](const AttentionProblem& p) {
      const index_t n = std::max<index_t>(1, p.n_kv());
      return std::vector<std::string>{std::to_string(std::max<index_t>(1, n / 16)), std::to_string(std::max<index_t>(1, n / 4)),
                                      std::to_string(std::max<index_t>(1, n / 2)), std::to_string(n)};
    };
    a.samples = {{{"rank", "8"}}, {{"rank", "32"}, {"tau", "1"}}};
    return m;
  }();
  return info;
}

std::size_t WildcatAttention::workspace_bytes(const AttentionProblem& p, const ExecContext& ctx) const {
  const auto r = static_cast<std::size_t>(std::min<index_t>(params().get_int("rank"), p.n_kv()));
  const auto nk = static_cast<std::size_t>(p.n_kv()), dk = static_cast<std::size_t>(p.d_qk()),
             dv = static_cast<std::size_t>(p.d_v());
  const auto kv = static_cast<std::size_t>(p.batch() * p.kv_heads());
  const auto nt = static_cast<std::size_t>(ctx.num_threads());
  const std::size_t per_kv = 8 * (nk * (r + dk + dv + 6) + r * (r + dv + 1));
  return kv * 4 * r * (dk + dv + 2) + std::min(kv, nt) * per_kv +
         nt * 4 * static_cast<std::size_t>(kRowBlock) * (r + dv + 1);
}

void WildcatAttention::forward(const AttentionProblem& p, const ExecContext& ctx) const {
  const index_t rank = params().get_int("rank");
  const double tau = params().get_float("tau");
  const auto seed = static_cast<std::uint64_t>(params().get_int("seed"));
  const index_t nq = p.n_q(), dv = p.d_v(), dk = p.d_qk(), hkv = p.kv_heads();
  std::vector<Coreset> sets(static_cast<std::size_t>(p.batch() * hkv));
  parallel_for(ctx, static_cast<std::int64_t>(sets.size()), [&](std::int64_t t) {
    sets[static_cast<std::size_t>(t)] = compress(p, t / hkv, t % hkv, rank, tau, seed);
  });
  const index_t nblk = (nq + kRowBlock - 1) / kRowBlock;
  std::vector<std::vector<float>> ws_a(static_cast<std::size_t>(ctx.num_threads())),
      ws_o(static_cast<std::size_t>(ctx.num_threads()));
  std::atomic<std::int64_t> fallbacks{0};
  parallel_for(ctx, p.batch() * p.heads() * nblk, [&](std::int64_t t) {
    const index_t blk = t % nblk, bh = t / nblk, b = bh / p.heads(), h = bh % p.heads(), hk = h / p.group();
    const index_t i0 = blk * kRowBlock, rows = std::min(nq, i0 + kRowBlock) - i0;
    const Coreset& cs = sets[static_cast<std::size_t>(b * hkv + hk)];
    const index_t r = cs.r;
    if (cs.bad || r == 0) {  // a non-finite key every row reads: NaN for run(); no keys: empty rows
      for (index_t i = 0; i < rows; ++i) std::fill(p.out.row(b, h, i0 + i), p.out.row(b, h, i0 + i) + dv, cs.bad ? kNaN : 0.f);
      return;
    }
    std::vector<float>& a = ws_a[worker_slot(ws_a.size())];
    std::vector<float>& o = ws_o[worker_slot(ws_o.size())];
    a.resize(static_cast<std::size_t>(rows * r));
    o.resize(static_cast<std::size_t>(rows * (dv + 1)));
    blas::sgemm(blas::Trans::kNo, blas::Trans::kYes, rows, r, dk, static_cast<float>(p.effective_scale()),
                p.q.row(b, h, i0), p.q.stride[2], cs.ks.data(), dk, 0.f, a.data(), r);
    std::vector<char> nan_row(static_cast<std::size_t>(rows), 0);
    for (index_t i = 0; i < rows; ++i) {
      float* ar = a.data() + i * r;
      float m = kNegInf;
      for (index_t s = 0; s < r; ++s) {
        ar[s] += cs.bias[static_cast<std::size_t>(s)];
        m = std::max(m, ar[s]);
      }
      if (!simd::all_finite(ar, r)) {  // non-finite q or float32 overflow: NaN, for run()
        nan_row[static_cast<std::size_t>(i)] = 1;
        std::fill(ar, ar + r, 0.f);
        continue;
      }
      for (index_t s = 0; s < r; ++s) ar[s] -= m;
      simd::exp_f32(ar, ar, r);
    }
    blas::sgemm(blas::Trans::kNo, blas::Trans::kNo, rows, dv + 1, r, 1.f, a.data(), r, cs.x.data(), dv + 1, 0.f,
                o.data(), dv + 1);
    for (index_t i = 0; i < rows; ++i) {
      float* out = p.out.row(b, h, i0 + i);
      if (nan_row[static_cast<std::size_t>(i)]) {
        std::fill(out, out + dv, kNaN);
        continue;
      }
      const float* orow = o.data() + i * (dv + 1);
      const float den = orow[dv];
      float mag = 0;
      const float* ar = a.data() + i * r;
      for (index_t s = 0; s < r; ++s) mag += ar[s] * std::abs(cs.x[static_cast<std::size_t>(s * (dv + 1) + dv)]);
      if (!(den > kCancel * mag)) {
        exact_row(p, b, h, i0 + i, out);
        fallbacks.fetch_add(1, std::memory_order_relaxed);
        continue;
      }
      const float inv = 1.f / den;
      for (index_t u = 0; u < dv; ++u) out[u] = orow[u] * inv;
    }
  });
  fallback_rows_.fetch_add(fallbacks.load());
}

double WildcatAttention::flops(const AttentionProblem& p) const {
  // Per kv head the coreset: pivoted Cholesky of the key kernel (Nk·r·(Dk + r)) and the weights
  // on the values (Nk·r·Dv); per query head its logits and output over the r selected keys.
  const double r = static_cast<double>(std::min<index_t>(params_.get_int("rank"), p.n_kv()));
  const double bk = static_cast<double>(p.batch() * p.kv_heads()), bh = static_cast<double>(p.batch() * p.heads());
  const double nk = static_cast<double>(p.n_kv()), dk = static_cast<double>(p.d_qk()), dv = static_cast<double>(p.d_v());
  return bk * 2 * nk * r * (dk + r + dv) + bh * 2 * static_cast<double>(p.n_q()) * r * (dk + dv);
}

NUMATTN_DEFINE_METHOD(WildcatAttention)

}  // namespace numattn
