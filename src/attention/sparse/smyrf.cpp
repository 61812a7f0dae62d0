#include "attention/sparse/smyrf.h"

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

namespace numattn {

namespace {

constexpr index_t kAutoClusterSize = 64;  // the reference code's q/k cluster size
// Logits up to |scale|·max‖q‖·max‖k‖ must stay finite in float32 partial sums (half of FLT_MAX,
// as problem.h's bound for kernels); beyond it the method refuses with an Error.
constexpr double kLogitLimit = 1.7e38;
constexpr double kMinParallelFlops = 8e6;  // below: one thread (exact.flash's rule)

/// Largest ‖x_row‖ over the rows of head (b, h) (inputs are finite: the guard ran).
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

/// The `rounds` sorted orders (rounds × n: sorted position → row) of the lifted rows of head
/// (b, h) of x. `f` multiplies the rows (s/M for queries, 1/M for keys): the lift divided by M,
/// so every lifted vector has norm 1 and nothing overflows.
std::vector<index_t> lifted_orders(const TensorView<const float>& x, index_t b, index_t h, double f, bool query,
                                   const std::vector<float>& dirs, index_t rounds) {
  const index_t n = x.shape[2], d = x.shape[3], dl = d + 2;
  std::vector<float> lifted(static_cast<std::size_t>(n * dl));
  for (index_t j = 0; j < n; ++j) {
    const float* r = x.row(b, h, j);
    float* o = lifted.data() + j * dl;
    double n2 = 0;
    for (index_t c = 0; c < d; ++c) {
      const double u = f * r[c];
      o[c] = static_cast<float>(u);
      n2 += u * u;
    }
    const auto tail = static_cast<float>(std::sqrt(std::max(0.0, 1.0 - n2)));
    o[d] = query ? 0.f : tail;
    o[d + 1] = query ? tail : 0.f;
  }
  std::vector<float> proj(static_cast<std::size_t>(n * rounds)), col(static_cast<std::size_t>(n));
  blocks::lsh_project(lifted.data(), n, dl, dl, dirs.data(), rounds, proj.data());
  std::vector<index_t> orders(static_cast<std::size_t>(rounds * n));
  for (index_t r = 0; r < rounds; ++r) {
    for (index_t j = 0; j < n; ++j) col[static_cast<std::size_t>(j)] = proj[static_cast<std::size_t>(j * rounds + r)];
    blocks::stable_argsort(col.data(), n, orders.data() + r * n);
  }
  return orders;
}

/// Norms of one call: M_Q (scaled) and M_K per (batch, kv head).
struct Norms {
  std::vector<double> mq, mk;
  double lift_factor(index_t t) const {  // 1/M, M = sqrt(M_Q² + M_K²) (1 for all-zero inputs)
    const double m = std::sqrt(mq[static_cast<std::size_t>(t)] * mq[static_cast<std::size_t>(t)] +
                               mk[static_cast<std::size_t>(t)] * mk[static_cast<std::size_t>(t)]);
    return m > 0 ? 1.0 / m : 1.0;
  }
};

Norms norms_of(const AttentionProblem& p, const ExecContext& ctx) {
  const index_t hkv = p.kv_heads(), g = p.group();
  const double s = std::abs(p.effective_scale());
  Norms n;
  n.mq.assign(static_cast<std::size_t>(p.batch() * hkv), 0.0);
  n.mk.assign(n.mq.size(), 0.0);
  parallel_for(ctx, p.batch() * hkv, [&](std::int64_t t) {
    const index_t b = t / hkv, hk = t % hkv;
    n.mk[static_cast<std::size_t>(t)] = max_norm(p.k, b, hk);
    double mq = 0;
    for (index_t h = hk * g; h < (hk + 1) * g; ++h) mq = std::max(mq, max_norm(p.q, b, h));
    n.mq[static_cast<std::size_t>(t)] = s * mq;
  });
  return n;
}

}  // namespace

const MethodInfo& SmyrfAttention::describe() {
  static const MethodInfo info = [] {
    MethodInfo m;
    m.name = "sparse.smyrf";
    m.family = "sparse";
    m.summary = "asymmetric-LSH balanced clusters (sorted projections), exact softmax per cluster, rounds merged by softmax mass";
    m.citation = "Daras, Kitaev, Odena, Dimakis, SMYRF: Efficient Attention using Asymmetric Clustering, NeurIPS 2020";
    m.time_complexity = "O(H·N·(Dk + log N) + H·Nq·(Nk/L)·(Dk+Dv)), H rounds, L clusters";
    m.memory_complexity = "O(H·(Nq+Nk)) orders per head + O(N·Dk) per thread";
    m.params = {
        {"clusters", ParamType::kInt, "0", 0, 65536, {},
         "L: clusters per round (equal groups of sorted queries and keys); 0 = ceil(Nk/64); 1 = exact"},
        {"rounds", ParamType::kInt, "8", 1, 64, {}, "H: independent hashing rounds, merged by softmax mass"},
        {"seed", ParamType::kInt, "0", 0, 2147483647, {}, "seed of the projection directions"},
    };
    m.caps = {.exact = false, .causal = false, .gqa = true, .bool_mask = false, .additive_mask = false,
              .window = false, .lse = false, .decode = false, .dk_ne_dv = true, .strided = true,
              .deterministic = true, .randomized = true};
    AccuracyContract& a = m.accuracy;
    a.max_rel_fro_error = [](const BudgetInput& in) {
      const double exact = exact_f32_tolerance(in.logit_magnitude).rel_fro_error;
      const AttentionProblem& p = in.problem;
      index_t l = in.params.get_int("clusters");
      if (l == 0) l = (p.n_kv() + kAutoClusterSize - 1) / kAutoClusterSize;
      l = std::clamp<index_t>(l, 1, std::max<index_t>(1, std::min(p.n_q(), p.n_kv())));
      if (l == 1) return exact;
      // A flat row averaged over f·n of its n keys is off by about sqrt(1/f − 1) relative to its
      // (small) exact norm (see lowrank.loki), f = 1 − (1 − 1/L)^H the expected fraction of keys
      // met over H independent rounds; peaked rows (logits ×100, spiky) err less when the lift
      // finds their heavy keys. Measured on the conformance matrix and N = 1024 Gaussian/spiky
      // problems (median over 5 seeds): at most 1.1·sqrt(1/f − 1) + 0.3 (1.34 at N = 1024 with
      // the defaults, 9.3 with L = N); the budget is 2× that.
      const double f = 1 - std::pow(1 - 1 / static_cast<double>(l), static_cast<double>(in.params.get_int("rounds")));
      return 0.6 + 2.5 * std::sqrt(std::max(0.0, 1 / f - 1)) + exact;
    };
    a.limit_case = [](const AttentionProblem&) { return ParamOverrides{{"clusters", "1"}}; };
    a.convergence.param = "clusters";
    a.convergence.error_falls_as_it_grows = false;
    a.convergence.values = [](const AttentionProblem&) {
      return std::vector<std::string>{"1", "2", "4", "8", "16"};
    };
    a.samples = {{{"clusters", "4"}, {"rounds", "2"}}, {{"rounds", "1"}}};
    return m;
  }();
  return info;
}

Status SmyrfAttention::can_run(const AttentionProblem& p) const {
  // It reads q: judge the float32 problem run() makes of half-precision Q / output.
  if (p.has_half_q() || p.has_half_out()) return can_run(widen_io(p).problem);
  return AttentionMethod::can_run(p);
}

index_t SmyrfAttention::clusters_for(const AttentionProblem& p) const {
  index_t l = params_.get_int("clusters");
  if (l == 0) l = (p.n_kv() + kAutoClusterSize - 1) / kAutoClusterSize;
  return std::clamp<index_t>(l, 1, std::max<index_t>(1, std::min(p.n_q(), p.n_kv())));
}

index_t SmyrfAttention::rounds_for(const AttentionProblem& p) const {
  return clusters_for(p) == 1 ? 1 : params_.get_int("rounds");
}

std::vector<float> SmyrfAttention::directions(index_t d_lifted, index_t rounds, index_t hk) const {
  return blocks::lsh_projections(d_lifted, rounds, static_cast<std::uint64_t>(params_.get_int("seed")),
                                 static_cast<std::uint64_t>(hk));
}

void SmyrfAttention::lift_query(const double* q, index_t d, double mq, double mk, double* out) {
  double n2 = 0;
  for (index_t c = 0; c < d; ++c) {
    out[c] = q[c];
    n2 += q[c] * q[c];
  }
  out[d] = 0;
  out[d + 1] = std::sqrt(std::max(0.0, mq * mq + mk * mk - n2));
}

void SmyrfAttention::lift_key(const double* k, index_t d, double mq, double mk, double* out) {
  double n2 = 0;
  for (index_t c = 0; c < d; ++c) {
    out[c] = k[c];
    n2 += k[c] * k[c];
  }
  out[d] = std::sqrt(std::max(0.0, mq * mq + mk * mk - n2));
  out[d + 1] = 0;
}

std::vector<SmyrfAttention::Round> SmyrfAttention::assignment(const AttentionProblem& p, index_t b, index_t h) const {
  const index_t hk = h / p.group(), t = b * p.kv_heads() + hk, nq = p.n_q(), nk = p.n_kv();
  const index_t l = clusters_for(p), rounds = rounds_for(p);
  const Norms n = norms_of(p, ExecContext{1});
  const double f = n.lift_factor(t);
  const std::vector<float> dirs = directions(p.d_qk() + 2, rounds, hk);
  const std::vector<index_t> qo = lifted_orders(p.q, b, h, p.effective_scale() * f, true, dirs, rounds);
  const std::vector<index_t> ko = lifted_orders(p.k, b, hk, f, false, dirs, rounds);
  std::vector<Round> out(static_cast<std::size_t>(rounds));
  for (index_t r = 0; r < rounds; ++r) {
    Round& rd = out[static_cast<std::size_t>(r)];
    rd.query_cluster.resize(static_cast<std::size_t>(nq));
    rd.key_cluster.resize(static_cast<std::size_t>(nk));
    for (index_t g = 0; g < l; ++g) {
      for (index_t s = g * nq / l; s < (g + 1) * nq / l; ++s) rd.query_cluster[static_cast<std::size_t>(qo[r * nq + s])] = g;
      for (index_t s = g * nk / l; s < (g + 1) * nk / l; ++s) rd.key_cluster[static_cast<std::size_t>(ko[r * nk + s])] = g;
    }
  }
  return out;
}

std::size_t SmyrfAttention::workspace_bytes(const AttentionProblem& p, const ExecContext& ctx) const {
  const auto nq = static_cast<std::size_t>(p.n_q()), nk = static_cast<std::size_t>(p.n_kv());
  const auto l = static_cast<std::size_t>(clusters_for(p)), r = static_cast<std::size_t>(rounds_for(p));
  const auto dk = static_cast<std::size_t>(p.d_qk()), dv = static_cast<std::size_t>(p.d_v());
  const auto bh = static_cast<std::size_t>(p.batch() * p.heads()), bk = static_cast<std::size_t>(p.batch() * p.kv_heads());
  const auto nt = static_cast<std::size_t>(ctx.num_threads());
  const std::size_t orders = 8 * r * (bh * nq + bk * nk) + 8 * bh * nq;
  const std::size_t lift = std::min(nt, bh + bk) * 4 * std::max(nq, nk) * (dk + 2 + 2 * r);
  const std::size_t gather = nt * 4 * ((nq / l + 1) * (dk + dv + 1) + (nk / l + 1) * (dk + dv));
  return orders + lift + gather;
}

void SmyrfAttention::forward(const AttentionProblem& p, const ExecContext& ctx) const {
  const index_t B = p.batch(), H = p.heads(), hkv = p.kv_heads(), G = p.group();
  const index_t nq = p.n_q(), nk = p.n_kv(), dk = p.d_qk(), dv = p.d_v();
  const index_t l = clusters_for(p), rounds = rounds_for(p);
  // Small problems run on one thread (as exact.flash): a parallel region costs more than them.
  const double flops = 2.0 * static_cast<double>(rounds * B * H * nq) * static_cast<double>((nk + l - 1) / l) *
                       static_cast<double>(dk + dv);
  const ExecContext run{flops < kMinParallelFlops ? 1 : ctx.num_threads()};
  if (blocks::mark_rows_reading_nonfinite(p, run)) return;  // NaN rows for run() to name
  if (nq == 0) return;
  if (nk == 0) {  // no key: every row is empty
    for (index_t b = 0; b < B; ++b)
      for (index_t h = 0; h < H; ++h)
        for (index_t i = 0; i < nq; ++i) std::fill(p.out.row(b, h, i), p.out.row(b, h, i) + dv, 0.f);
    return;
  }
  const double s = p.effective_scale();
  const Norms norms = norms_of(p, run);
  for (std::size_t t = 0; t < norms.mq.size(); ++t)
    NUMATTN_CHECK(norms.mq[t] * norms.mk[t] <= kLogitLimit,
                  "sparse.smyrf: logits up to |scale|·max‖q‖·max‖k‖ = {:.3g} exceed the float32 range of its kernels "
                  "({:.3g}); reduce the scale or the magnitude of q and k",
                  norms.mq[t] * norms.mk[t], kLogitLimit);

  // Sorted orders of every round: keys per (batch, kv head), queries per (batch, head).
  std::vector<std::vector<float>> dirs(static_cast<std::size_t>(hkv));
  for (index_t hk = 0; hk < hkv; ++hk) dirs[static_cast<std::size_t>(hk)] = directions(dk + 2, rounds, hk);
  std::vector<std::vector<index_t>> korder(static_cast<std::size_t>(B * hkv)), qorder(static_cast<std::size_t>(B * H));
  parallel_for(run, B * hkv + B * H, [&](std::int64_t t) {
    if (t < B * hkv) {
      const index_t b = t / hkv, hk = t % hkv;
      korder[static_cast<std::size_t>(t)] =
          lifted_orders(p.k, b, hk, norms.lift_factor(t), false, dirs[static_cast<std::size_t>(hk)], rounds);
    } else {
      const index_t u = t - B * hkv, b = u / H, h = u % H, hk = h / G;
      qorder[static_cast<std::size_t>(u)] = lifted_orders(p.q, b, h, s * norms.lift_factor(b * hkv + hk), true,
                                                          dirs[static_cast<std::size_t>(hk)], rounds);
    }
  });

  // Per round: dense softmax on each (query group, key group) pair, gathered contiguous, merged
  // into the output rows by log-sum-exp in round order (bitwise the same for any thread count).
  // Within a round each row belongs to exactly one cluster, so no two clusters write one row.
  struct Scratch {
    std::vector<float> q, k, v, o, lse;
  };
  std::vector<Scratch> scratch(static_cast<std::size_t>(run.num_threads()));
  std::vector<double> acc_lse(static_cast<std::size_t>(B * H * nq));
  auto cluster = [&](index_t bh, index_t r, index_t g) {
    const index_t b = bh / H, h = bh % H, hk = h / G;
    const index_t* qo = qorder[static_cast<std::size_t>(bh)].data() + r * nq;
    const index_t* ko = korder[static_cast<std::size_t>(b * hkv + hk)].data() + r * nk;
    const index_t q0 = g * nq / l, q1 = (g + 1) * nq / l, k0 = g * nk / l, k1 = (g + 1) * nk / l;
    const index_t rq = q1 - q0, rk = k1 - k0;
    Scratch& w = scratch[worker_slot(scratch.size())];
    w.q.resize(static_cast<std::size_t>(rq * dk));
    w.k.resize(static_cast<std::size_t>(rk * dk));
    w.v.resize(static_cast<std::size_t>(rk * dv));
    w.o.resize(static_cast<std::size_t>(rq * dv));
    w.lse.resize(static_cast<std::size_t>(rq));
    for (index_t u = 0; u < rq; ++u) std::memcpy(w.q.data() + u * dk, p.q.row(b, h, qo[q0 + u]), sizeof(float) * dk);
    for (index_t u = 0; u < rk; ++u) {
      std::memcpy(w.k.data() + u * dk, p.k.row(b, hk, ko[k0 + u]), sizeof(float) * dk);
      std::memcpy(w.v.data() + u * dv, p.v.row(b, hk, ko[k0 + u]), sizeof(float) * dv);
    }
    AttentionProblem sub;
    sub.q = TensorView<const float>::contiguous(w.q.data(), {1, 1, rq, dk});
    sub.k = TensorView<const float>::contiguous(w.k.data(), {1, 1, rk, dk});
    sub.v = TensorView<const float>::contiguous(w.v.data(), {1, 1, rk, dv});
    sub.out = TensorView<float>::contiguous(w.o.data(), {1, 1, rq, dv});
    sub.lse = TensorView<float>::contiguous(w.lse.data(), {1, 1, rq, 1});
    sub.scale = s;
    blocks::dense_softmax_attention(sub, ExecContext{1});  // nested: runs on this worker
    for (index_t u = 0; u < rq; ++u) {
      const index_t i = qo[q0 + u];
      float* o = p.out.row(b, h, i);
      const float* src = w.o.data() + u * dv;
      double& al = acc_lse[static_cast<std::size_t>(bh * nq + i)];
      if (r == 0) {
        std::memcpy(o, src, sizeof(float) * dv);
        al = w.lse[static_cast<std::size_t>(u)];
      } else {
        blocks::lse_merge_into(o, al, src, w.lse[static_cast<std::size_t>(u)], dv);
      }
    }
  };
  if (B * H >= 2 * run.num_threads()) {
    // Enough heads to share out: one parallel region, each head's rounds inside (a region per
    // round costs a fork and join each, up to a scheduler quantum on a loaded machine).
    parallel_for(run, B * H, [&](std::int64_t bh) {
      for (index_t r = 0; r < rounds; ++r)
        for (index_t g = 0; g < l; ++g) cluster(bh, r, g);
    });
  } else {
    for (index_t r = 0; r < rounds; ++r)
      parallel_for(run, B * H * l, [&](std::int64_t t) { cluster(t / l, r, t % l); });
  }
}

double SmyrfAttention::flops(const AttentionProblem& p) const {
  // Per round: the asymmetric transform and one projection per row, a sort, and each query over
  // the Nk/L keys of its balanced cluster.
  const double l = static_cast<double>(clusters_for(p)), rounds = static_cast<double>(rounds_for(p));
  const double bh = static_cast<double>(p.batch() * p.heads()), nq = static_cast<double>(p.n_q()),
               nk = static_cast<double>(p.n_kv()), dk = static_cast<double>(p.d_qk()), dv = static_cast<double>(p.d_v());
  const double n = nq + nk;
  return bh * rounds * (2 * n * (dk + 2) + n * std::log2(std::max(2.0, n)) + 2 * nq * (nk / l) * (dk + dv));
}

NUMATTN_DEFINE_METHOD(SmyrfAttention)

}  // namespace numattn
