#include "attention/sparse/kdeformer.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "attention/method_def.h"
#include "numattn/attention/blocks/dense_softmax.h"
#include "numattn/attention/blocks/lse_merge.h"
#include "numattn/attention/blocks/lsh.h"
#include "numattn/attention/blocks/nonfinite_rows.h"
#include "numattn/core/blas.h"
#include "numattn/core/rng.h"

namespace numattn {

namespace {

constexpr double kNegInf = -std::numeric_limits<double>::infinity();
// Logits up to |scale|·max‖q‖·max‖k‖ must stay finite in float32 partial sums (half of FLT_MAX,
// as problem.h's bound for kernels); beyond it the method refuses with an Error.
constexpr double kLogitLimit = 1.7e38;
constexpr double kMinParallelFlops = 8e6;  // below: one thread (exact.flash's rule)
constexpr int kPowerIters = 100;            // power iteration cap (the official code runs 20)
constexpr std::uint64_t kSampleStream = std::uint64_t{1} << 40;  // draws: streams apart from the hashes'

double max_norm(const TensorView<const float>& x, index_t b, index_t h) {
  double m = 0;
  for (index_t j = 0; j < x.shape[2]; ++j) {
    const float* r = x.row(b, h, j);
    double n2 = 0;
    for (index_t c = 0; c < x.shape[3]; ++c) n2 += static_cast<double>(r[c]) * r[c];
    m = std::max(m, n2);
  }
  return std::sqrt(m);
}

/// Stable order of the n rows of head (b, h) of x by the Gray rank of their SimHash codes under
/// the d × bits directions `dirs`; `flip` negates the projections (a negative scale).
std::vector<index_t> simhash_order(const TensorView<const float>& x, index_t b, index_t h, const std::vector<float>& dirs,
                                   index_t bits, bool flip) {
  const index_t n = x.shape[2];
  std::vector<float> proj(static_cast<std::size_t>(n * bits));
  if (n > 0) blocks::lsh_project(x.row(b, h, 0), n, x.stride[2], x.shape[3], dirs.data(), bits, proj.data());
  if (flip)
    for (float& v : proj) v = -v;
  std::vector<std::uint32_t> codes(static_cast<std::size_t>(n));
  blocks::simhash_codes(proj.data(), n, bits, codes.data());
  for (std::uint32_t& c : codes) c = blocks::gray_rank(c);
  std::vector<index_t> order(static_cast<std::size_t>(n));
  blocks::stable_sort_by_key(codes.data(), n, std::uint32_t{1} << bits, order.data());
  return order;
}

}  // namespace

const MethodInfo& KdeformerAttention::describe() {
  static const MethodInfo info = [] {
    MethodInfo m;
    m.name = "sparse.kdeformer";
    m.family = "sparse";
    m.summary = "SimHash (Gray-ordered) block-diagonal attention + residual keys importance-sampled by ‖[v|1]‖, ratio estimator";
    m.citation = "Zandieh, Han, Daliri, Karbasi, KDEformer: Accelerating Transformers via Kernel Density Estimation, ICML 2023";
    m.time_complexity = "O(N·Dk·bits + Nq·(Nk/nb + min(m, Nk))·(Dk+Dv) + Nk·Dv²), nb = ceil(Nk/bucket)";
    m.memory_complexity = "O(N) orders per head + O((Nq/nb)·(min(m,Nk) + Dk + Dv)) per thread";
    m.params = {
        {"samples", ParamType::kInt, "800", 0, 16384, {}, "m: residual keys drawn with replacement (the official default 800); 0 = blocks only"},
        {"bits", ParamType::kInt, "7", 1, 16, {}, "SimHash directions (2^bits buckets, Gray order); the official default 7"},
        {"bucket", ParamType::kInt, "128", 1, 1048576, {}, "keys per LSH block (nb = ceil(Nk/bucket) blocks); ≥ Nk = exact"},
        {"seed", ParamType::kInt, "0", 0, 2147483647, {}, "seed of the hash directions and the draws"},
    };
    m.caps = {.exact = false, .causal = false, .gqa = true, .bool_mask = false, .additive_mask = false,
              .window = false, .lse = true, .decode = false, .dk_ne_dv = true, .strided = true,
              .deterministic = true, .randomized = true};
    AccuracyContract& a = m.accuracy;
    a.max_rel_fro_error = [](const BudgetInput& in) {
      const double exact = exact_f32_tolerance(in.logit_magnitude).rel_fro_error;
      const AttentionProblem& p = in.problem;
      const index_t nk = p.n_kv(), bucket = in.params.get_int("bucket");
      if (bucket >= nk) return exact;
      // Flat rows err most (their exact output is a small average of many values). With m > 0
      // draws the residual's Monte Carlo noise dominates: about sqrt(Nk/m) relative to the exact
      // row (the block's Nk/nb keys help little); with m = 0 the row averages its Nk/nb block
      // keys instead of all Nk: about sqrt(Nk/(Nk/nb)). Model sqrt(Nk/c) with c = m + (Nk/nb)/16
      // (m > 0) or Nk/nb (m = 0); measured on the conformance matrix and on N = 1024–4096
      // Gaussian/spiky inputs at logits ×1 and ×2 (medians over 3–5 seeds): at most 1.0× the
      // model (12.9 at N = 4096, m = 16; 19 at N = 1024, bucket 1, m = 0), peaked rows less. The
      // budget is 2× the model + 0.5.
      const index_t nb = (nk + bucket - 1) / bucket;
      const index_t m = in.params.get_int("samples");
      const double blk = static_cast<double>(nk) / static_cast<double>(nb);
      const double c = m > 0 ? static_cast<double>(m) + blk / 16 : blk;
      return 0.5 + 2 * std::sqrt(static_cast<double>(nk) / c) + exact;
    };
    a.limit_case = [](const AttentionProblem& p) {
      return ParamOverrides{{"bucket", std::to_string(std::max<index_t>(1, p.n_kv()))}};
    };
    a.convergence.param = "samples";
    a.convergence.values = [](const AttentionProblem&) {
      return std::vector<std::string>{"4", "32", "256", "2048"};
    };
    a.samples = {{{"samples", "64"}, {"bits", "3"}, {"bucket", "16"}}, {{"samples", "2000"}, {"bucket", "32"}}};
    return m;
  }();
  return info;
}

Status KdeformerAttention::can_run(const AttentionProblem& p) const {
  // It reads q: judge the float32 problem run() makes of half-precision Q / output.
  if (p.has_half_q() || p.has_half_out()) return can_run(widen_io(p).problem);
  return AttentionMethod::can_run(p);
}

index_t KdeformerAttention::blocks_for(const AttentionProblem& p) const {
  const index_t bucket = params_.get_int("bucket");
  return std::max<index_t>(1, (p.n_kv() + bucket - 1) / bucket);
}

std::vector<double> KdeformerAttention::sampling_probabilities(const AttentionProblem& p, index_t b, index_t hk) {
  const index_t nk = p.n_kv(), dv = p.d_v(), w = dv + 1;
  std::vector<double> prob(static_cast<std::size_t>(nk));
  if (nk == 0) return prob;
  // V̄ = [V | 1], scaled by a power of two σ when |v| > 1 (exact; keeps the float32 Gram finite
  // for values near FLT_MAX): λ_max(V̄ᵀV̄) = σ²·λ_max of the scaled Gram.
  double vmax = 0;
  for (index_t j = 0; j < nk; ++j) {
    const float* v = p.v.row(b, hk, j);
    for (index_t c = 0; c < dv; ++c) vmax = std::max(vmax, std::abs(static_cast<double>(v[c])));
  }
  const double sigma = vmax > 1 ? std::ldexp(1.0, std::ilogb(vmax) + 1) : 1.0;
  std::vector<float> vs(static_cast<std::size_t>(nk * w));
  std::vector<double> norm(static_cast<std::size_t>(nk));
  for (index_t j = 0; j < nk; ++j) {
    const float* v = p.v.row(b, hk, j);
    double n2 = 1;
    for (index_t c = 0; c < dv; ++c) {
      n2 += static_cast<double>(v[c]) * v[c];
      vs[static_cast<std::size_t>(j * w + c)] = static_cast<float>(v[c] / sigma);
    }
    vs[static_cast<std::size_t>(j * w + dv)] = static_cast<float>(1 / sigma);
    norm[static_cast<std::size_t>(j)] = std::sqrt(n2);
  }
  std::vector<float> gram(static_cast<std::size_t>(w * w));
  blas::sgemm(blas::Trans::kYes, blas::Trans::kNo, w, w, nk, 1.f, vs.data(), w, vs.data(), w, 0.f, gram.data(), w);
  // Power iteration from the all-ones vector (Gram ≥ 0 entrywise in its last row and column:
  // not orthogonal to the leading eigenvector), to relative change 1e-10.
  std::vector<double> x(static_cast<std::size_t>(w), 1.0 / std::sqrt(static_cast<double>(w))), y(x.size());
  double lambda = 0;
  for (int it = 0; it < kPowerIters; ++it) {
    double n2 = 0;
    for (index_t r = 0; r < w; ++r) {
      double s = 0;
      for (index_t c = 0; c < w; ++c) s += static_cast<double>(gram[static_cast<std::size_t>(r * w + c)]) * x[static_cast<std::size_t>(c)];
      y[static_cast<std::size_t>(r)] = s;
      n2 += s * s;
    }
    const double next = std::sqrt(n2);
    if (!(next > 0)) break;
    for (index_t r = 0; r < w; ++r) x[static_cast<std::size_t>(r)] = y[static_cast<std::size_t>(r)] / next;
    const bool done = std::abs(next - lambda) <= 1e-10 * next;
    lambda = next;
    if (done) break;
  }
  lambda *= sigma * sigma;
  const double uniform = 1.0 / static_cast<double>(nk);
  double total = 0;
  for (index_t j = 0; j < nk; ++j) {
    double& pj = prob[static_cast<std::size_t>(j)];
    pj = (lambda > 0 ? norm[static_cast<std::size_t>(j)] / lambda : 0.0) + uniform;
    total += pj;
  }
  for (double& pj : prob) pj /= total;
  return prob;
}

KdeformerAttention::KeyPlan KdeformerAttention::key_plan(const AttentionProblem& p, index_t b, index_t hk) const {
  const index_t nk = p.n_kv(), bits = params_.get_int("bits"), nb = blocks_for(p);
  const auto seed = static_cast<std::uint64_t>(params_.get_int("seed"));
  KeyPlan kp;
  kp.order = simhash_order(p.k, b, hk, blocks::lsh_projections(p.d_qk(), bits, seed, static_cast<std::uint64_t>(hk)), bits, false);
  kp.block.resize(static_cast<std::size_t>(nk));
  for (index_t g = 0; g < nb; ++g)
    for (index_t s = g * nk / nb; s < (g + 1) * nk / nb; ++s) kp.block[static_cast<std::size_t>(kp.order[static_cast<std::size_t>(s)])] = g;
  const index_t m = params_.get_int("samples");
  if (m == 0 || nb == 1 || nk == 0) return kp;  // one block: every draw would be dropped
  const std::vector<double> prob = sampling_probabilities(p, b, hk);
  std::vector<double> cdf(prob.size());
  double acc = 0;
  for (std::size_t j = 0; j < prob.size(); ++j) cdf[j] = acc += prob[j];
  std::vector<index_t> count(static_cast<std::size_t>(nk), 0);
  const CounterRng rng(seed, kSampleStream + static_cast<std::uint64_t>(b * p.kv_heads() + hk));
  for (index_t t = 0; t < m; ++t) {
    const double u = rng.uniform(static_cast<std::uint64_t>(t)) * acc;
    const auto j = std::min<index_t>(nk - 1, std::upper_bound(cdf.begin(), cdf.end(), u) - cdf.begin());
    ++count[static_cast<std::size_t>(j)];
  }
  for (index_t j = 0; j < nk; ++j) {
    const index_t c = count[static_cast<std::size_t>(j)];
    if (c == 0) continue;
    kp.sample.push_back(j);
    kp.weight.push_back(static_cast<double>(c) / (static_cast<double>(m) * prob[static_cast<std::size_t>(j)]));
  }
  return kp;
}

std::vector<index_t> KdeformerAttention::query_order(const AttentionProblem& p, index_t b, index_t h) const {
  const index_t bits = params_.get_int("bits");
  const auto seed = static_cast<std::uint64_t>(params_.get_int("seed"));
  const index_t hk = h / p.group();
  return simhash_order(p.q, b, h, blocks::lsh_projections(p.d_qk(), bits, seed, static_cast<std::uint64_t>(hk)), bits,
                       p.effective_scale() < 0);
}

std::size_t KdeformerAttention::workspace_bytes(const AttentionProblem& p, const ExecContext& ctx) const {
  const auto nq = static_cast<std::size_t>(p.n_q()), nk = static_cast<std::size_t>(p.n_kv());
  const auto nb = static_cast<std::size_t>(blocks_for(p));
  const auto dk = static_cast<std::size_t>(p.d_qk()), dv = static_cast<std::size_t>(p.d_v());
  const auto u = std::min(nk, static_cast<std::size_t>(params_.get_int("samples")));
  const auto bh = static_cast<std::size_t>(p.batch() * p.heads()), bk = static_cast<std::size_t>(p.batch() * p.kv_heads());
  const auto nt = static_cast<std::size_t>(ctx.num_threads());
  const std::size_t plans = bk * (8 * 4 * nk + 16 * u) + bh * 8 * nq;
  const std::size_t build = std::min(nt, bh + bk) * (4 * (nk + nq) * (dv + 2 + 16) + 16 * nk);
  const std::size_t rq = nq / nb + 1, rk = nk / nb + 1;
  const std::size_t per_thread = 4 * (rq * (dk + 2 * dv + 3) + rk * (dk + dv) + u * (dk + dv + 1));
  return plans + build + nt * per_thread;
}

void KdeformerAttention::forward(const AttentionProblem& p, const ExecContext& ctx) const {
  const index_t B = p.batch(), H = p.heads(), hkv = p.kv_heads(), G = p.group();
  const index_t nq = p.n_q(), nk = p.n_kv(), dk = p.d_qk(), dv = p.d_v();
  const index_t nb = blocks_for(p);
  // Small problems run on one thread (as exact.flash): a parallel region costs more than them.
  const double flops = 2.0 * static_cast<double>(B * H * nq) *
                       static_cast<double>((nk + nb - 1) / nb + std::min<index_t>(nk, params_.get_int("samples"))) *
                       static_cast<double>(dk + dv);
  const ExecContext run{flops < kMinParallelFlops ? 1 : ctx.num_threads()};
  if (blocks::mark_rows_reading_nonfinite(p, run)) return;  // NaN rows for run() to name
  const bool want_lse = !p.lse.empty();
  if (nq == 0) return;
  if (nk == 0) {  // no key: every row is empty
    for (index_t b = 0; b < B; ++b)
      for (index_t h = 0; h < H; ++h)
        for (index_t i = 0; i < nq; ++i) {
          std::fill(p.out.row(b, h, i), p.out.row(b, h, i) + dv, 0.f);
          if (want_lse) p.lse(b, h, i, 0) = -std::numeric_limits<float>::infinity();
        }
    return;
  }
  const double s = p.effective_scale();

  // Hashes, orders and draws: keys per (batch, kv head), queries per (batch, head).
  std::vector<KeyPlan> kplan(static_cast<std::size_t>(B * hkv));
  std::vector<std::vector<index_t>> qorder(static_cast<std::size_t>(B * H));
  std::vector<double> qnorm(static_cast<std::size_t>(B * H)), knorm(static_cast<std::size_t>(B * hkv));
  parallel_for(run, B * hkv + B * H, [&](std::int64_t t) {
    if (t < B * hkv) {
      kplan[static_cast<std::size_t>(t)] = key_plan(p, t / hkv, t % hkv);
      knorm[static_cast<std::size_t>(t)] = max_norm(p.k, t / hkv, t % hkv);
    } else {
      const index_t u = t - B * hkv;
      qorder[static_cast<std::size_t>(u)] = query_order(p, u / H, u % H);
      qnorm[static_cast<std::size_t>(u)] = max_norm(p.q, u / H, u % H);
    }
  });
  for (index_t b = 0; b < B; ++b)
    for (index_t h = 0; h < H; ++h) {
      const double bound = std::abs(s) * qnorm[static_cast<std::size_t>(b * H + h)] *
                           knorm[static_cast<std::size_t>(b * hkv + h / G)];
      NUMATTN_CHECK(bound <= kLogitLimit,
                    "sparse.kdeformer: logits up to |scale|·max‖q‖·max‖k‖ = {:.3g} exceed the float32 range of its "
                    "kernels ({:.3g}); reduce the scale or the magnitude of q and k",
                    bound, kLogitLimit);
    }

  struct Scratch {
    std::vector<float> q, k, v, o, lse, ks, vs, os, lses;
  };
  std::vector<Scratch> scratch(static_cast<std::size_t>(run.num_threads()));
  auto view = [](const float* x, index_t rows, index_t cols) {
    return TensorView<const float>::contiguous(x, {1, 1, rows, cols});
  };
  auto mview = [](float* x, index_t rows, index_t cols) { return TensorView<float>::contiguous(x, {1, 1, rows, cols}); };

  parallel_for(run, B * H * nb, [&](std::int64_t t) {
    const index_t g = t % nb, bh = t / nb, b = bh / H, h = bh % H, hk = h / G;
    const std::vector<index_t>& qo = qorder[static_cast<std::size_t>(bh)];
    const KeyPlan& kp = kplan[static_cast<std::size_t>(b * hkv + hk)];
    const index_t q0 = g * nq / nb, q1 = (g + 1) * nq / nb, k0 = g * nk / nb, k1 = (g + 1) * nk / nb;
    const index_t rq = q1 - q0, rk = k1 - k0;
    if (rq == 0) return;
    Scratch& w = scratch[worker_slot(scratch.size())];
    // The block: exact softmax of its queries over its keys, as (output, LSE).
    w.q.resize(static_cast<std::size_t>(rq * dk));
    w.k.resize(static_cast<std::size_t>(rk * dk));
    w.v.resize(static_cast<std::size_t>(rk * dv));
    w.o.resize(static_cast<std::size_t>(rq * dv));
    w.lse.resize(static_cast<std::size_t>(rq));
    for (index_t u = 0; u < rq; ++u)
      std::memcpy(w.q.data() + u * dk, p.q.row(b, h, qo[static_cast<std::size_t>(q0 + u)]), sizeof(float) * dk);
    for (index_t u = 0; u < rk; ++u) {
      const index_t j = kp.order[static_cast<std::size_t>(k0 + u)];
      std::memcpy(w.k.data() + u * dk, p.k.row(b, hk, j), sizeof(float) * dk);
      std::memcpy(w.v.data() + u * dv, p.v.row(b, hk, j), sizeof(float) * dv);
    }
    AttentionProblem sub;
    sub.q = view(w.q.data(), rq, dk);
    sub.k = view(w.k.data(), rk, dk);
    sub.v = view(w.v.data(), rk, dv);
    sub.out = mview(w.o.data(), rq, dv);
    sub.lse = mview(w.lse.data(), rq, 1);
    sub.scale = s;
    blocks::dense_softmax_attention(sub, ExecContext{1});  // nested: runs on this worker

    // The residual: the drawn keys outside this block, weight w_j. Folded into the values as
    // [w_j/W·v_j | w_j/W] (W = the largest kept weight): softmax over plain logits then gives
    // Σ e^ℓ w v / Σ e^ℓ·(…) in the first Dv columns and Σ e^ℓ w / (W·Σ e^ℓ) in the last, so
    // num/den = o[:Dv]/o[Dv] and log den = lse + log o[Dv] + log W, all normalised (no overflow
    // for any weight or value magnitude, no mask).
    index_t kept = 0;
    double wmax = 0;
    for (std::size_t t2 = 0; t2 < kp.sample.size(); ++t2)
      if (kp.block[static_cast<std::size_t>(kp.sample[t2])] != g) {
        ++kept;
        wmax = std::max(wmax, kp.weight[t2]);
      }
    if (kept > 0) {
      const index_t dw = dv + 1;
      w.ks.resize(static_cast<std::size_t>(kept * dk));
      w.vs.resize(static_cast<std::size_t>(kept * dw));
      w.os.resize(static_cast<std::size_t>(rq * dw));
      w.lses.resize(static_cast<std::size_t>(rq));
      index_t u = 0;
      for (std::size_t t2 = 0; t2 < kp.sample.size(); ++t2) {
        const index_t j = kp.sample[t2];
        if (kp.block[static_cast<std::size_t>(j)] == g) continue;
        const double a = kp.weight[t2] / wmax;
        std::memcpy(w.ks.data() + u * dk, p.k.row(b, hk, j), sizeof(float) * dk);
        const float* v = p.v.row(b, hk, j);
        float* dst = w.vs.data() + u * dw;
        for (index_t c = 0; c < dv; ++c) dst[c] = static_cast<float>(a * v[c]);
        dst[dv] = static_cast<float>(a);
        ++u;
      }
      sub.k = view(w.ks.data(), kept, dk);
      sub.v = view(w.vs.data(), kept, dw);
      sub.out = mview(w.os.data(), rq, dw);
      sub.lse = mview(w.lses.data(), rq, 1);
      blocks::dense_softmax_attention(sub, ExecContext{1});
    }
    const double log_wmax = kept > 0 ? std::log(wmax) : 0.0;
    for (index_t u = 0; u < rq; ++u) {
      const index_t i = qo[static_cast<std::size_t>(q0 + u)];
      float* o = p.out.row(b, h, i);
      std::memcpy(o, w.o.data() + u * dv, sizeof(float) * dv);
      double lse = w.lse[static_cast<std::size_t>(u)];
      if (kept > 0) {
        float* r = w.os.data() + u * (dv + 1);
        const double den = r[dv];
        const double lr = static_cast<double>(w.lses[static_cast<std::size_t>(u)]) + std::log(den) + log_wmax;
        for (index_t c = 0; c < dv; ++c) r[c] = static_cast<float>(r[c] / den);
        blocks::lse_merge_into(o, lse, r, lr, dv);
      }
      if (want_lse) p.lse(b, h, i, 0) = static_cast<float>(lse);
    }
  });
}

KdeformerAttention::KdeLift KdeformerAttention::kde_lift(const double* k, index_t n, index_t d, const double* x) {
  KdeLift lift;
  std::vector<double> t(static_cast<std::size_t>(n));
  double m = kNegInf;
  for (index_t i = 0; i < n; ++i) {
    double n2 = 0;
    for (index_t c = 0; c < d; ++c) n2 += k[i * d + c] * k[i * d + c];
    t[static_cast<std::size_t>(i)] = (x[i] > 0 ? std::log(x[i]) : kNegInf) + n2 / 2;  // log(x_i e^{‖k_i‖²/2})
    m = std::max(m, t[static_cast<std::size_t>(i)]);
  }
  double sum = 0;
  for (double ti : t) sum += ti == kNegInf ? 0.0 : std::exp(ti - m);
  lift.log_c = m + std::log(sum);
  lift.y.resize(static_cast<std::size_t>(n));
  for (index_t i = 0; i < n; ++i) {
    const double ti = t[static_cast<std::size_t>(i)];
    // x_i e^{‖k_i‖²/2} e^{y_i²/2} = C  ⇔  y_i² = 2(log C − t_i) ≥ 0 (clamped: rounding).
    lift.y[static_cast<std::size_t>(i)] =
        ti == kNegInf ? std::numeric_limits<double>::infinity() : std::sqrt(std::max(0.0, 2 * (lift.log_c - ti)));
  }
  return lift;
}

double KdeformerAttention::exp_kde(const double* q, const double* k, index_t n, index_t d, const double* x) {
  double s = 0;
  for (index_t i = 0; i < n; ++i) {
    double dot = 0;
    for (index_t c = 0; c < d; ++c) dot += q[c] * k[i * d + c];
    s += x[i] * std::exp(dot);
  }
  return s;
}

double KdeformerAttention::gaussian_kde(const double* q, const double* k, index_t n, index_t d, const KdeLift& lift) {
  double s = 0;
  for (index_t i = 0; i < n; ++i) {
    const double y = lift.y[static_cast<std::size_t>(i)];
    if (std::isinf(y)) continue;
    double d2 = y * y;  // ‖q̃ − k̃_i‖² = ‖q − k_i‖² + (0 − y_i)²
    for (index_t c = 0; c < d; ++c) d2 += (q[c] - k[i * d + c]) * (q[c] - k[i * d + c]);
    s += std::exp(-d2 / 2);
  }
  return n > 0 ? s / static_cast<double>(n) : 0.0;
}

double KdeformerAttention::exp_kde_lifted(const double* q, const double* k, index_t n, index_t d, const KdeLift& lift) {
  double q2 = 0;
  for (index_t c = 0; c < d; ++c) q2 += q[c] * q[c];
  return std::exp(q2 / 2 + lift.log_c) * static_cast<double>(n) * gaussian_kde(q, k, n, d, lift);
}

double KdeformerAttention::flops(const AttentionProblem& p) const {
  // SimHash codes of every row, each query over its LSH block (Nk/nb keys) and the shared samples,
  // and the value-norm sampling distribution (Nk·Dv² for the values' Gram, per the paper's ‖v‖).
  const double nb = static_cast<double>(blocks_for(p)), bits = static_cast<double>(params_.get_int("bits"));
  const double m = static_cast<double>(std::min<index_t>(params_.get_int("samples"), p.n_kv()));
  const double bh = static_cast<double>(p.batch() * p.heads()), nq = static_cast<double>(p.n_q()),
               nk = static_cast<double>(p.n_kv()), dk = static_cast<double>(p.d_qk()), dv = static_cast<double>(p.d_v());
  return bh * (2 * (nq + nk) * dk * bits + 2 * nq * (nk / nb + m) * (dk + dv) + 2 * nk * dv * dv);
}

NUMATTN_DEFINE_METHOD(KdeformerAttention)

}  // namespace numattn
