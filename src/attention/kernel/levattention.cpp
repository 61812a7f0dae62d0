#include "attention/kernel/levattention.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <queue>
#include <vector>

#include "attention/method_def.h"
#include "numattn/core/blas.h"
#include "numattn/core/simd.h"
#include "numattn/decomp/leverage.h"

namespace numattn {

namespace {

constexpr index_t kRowBlock = 64;
constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();
constexpr float kNegInf = -std::numeric_limits<float>::infinity();

/// What the attention phase needs from one (batch, kv head).
struct KvPlan {
  index_t usable = 0;  ///< keys [0, usable) are finite and scored; a row reading key ≥ usable reads a non-finite one (causal) ...
  bool all_bad = false;  ///< ... non-causal: some key is not finite, every row reads it
  std::vector<index_t> keys;       ///< non-causal: U, ascending
  std::vector<float> k, v;         ///< non-causal: K and V rows of U, gathered
  std::vector<index_t> evict;      ///< causal: key j is in U for prefix lengths L with j < L < evict[j]
};

/// Keys any row reads: all of them, or (causal) the prefix of the last row.
index_t keys_in_use(const AttentionProblem& p) {
  if (p.n_q() == 0) return 0;
  return p.causal == Causal::kNone ? p.n_kv() : p.key_range(p.n_q() - 1).end;
}

/// The first key j < n whose k or v row is not finite (n when none).
index_t first_nonfinite_key(const AttentionProblem& p, index_t b, index_t hk, index_t n) {
  for (index_t j = 0; j < n; ++j)
    if (!simd::all_finite(p.k.row(b, hk, j), p.d_qk()) || !simd::all_finite(p.v.row(b, hk, j), p.d_v())) return j;
  return n;
}

std::vector<double> keys_f64(const AttentionProblem& p, index_t b, index_t hk, index_t n) {
  const index_t d = p.d_qk();
  std::vector<double> a(static_cast<std::size_t>(n * d));
  for (index_t j = 0; j < n; ++j) std::copy(p.k.row(b, hk, j), p.k.row(b, hk, j) + d, a.begin() + j * d);
  return a;
}

/// Whether key a ranks above key b: larger score, then lower index (a deterministic order).
struct Better {
  bool operator()(const std::pair<double, index_t>& a, const std::pair<double, index_t>& b) const {
    return a.first > b.first || (a.first == b.first && a.second < b.second);
  }
};

KvPlan plan_kv(const AttentionProblem& p, index_t b, index_t hk, index_t s) {
  KvPlan plan;
  const index_t n = keys_in_use(p), d = p.d_qk(), dv = p.d_v();
  const index_t bad = first_nonfinite_key(p, b, hk, n);
  if (p.causal == Causal::kNone) {
    plan.usable = n;
    if (bad < n) {  // every row reads every key: all rows are NaN, run() names the culprit
      plan.all_bad = true;
      return plan;
    }
    if (s >= n) {
      plan.keys.resize(static_cast<std::size_t>(n));
      for (index_t j = 0; j < n; ++j) plan.keys[static_cast<std::size_t>(j)] = j;
    } else {
      const std::vector<double> a = keys_f64(p, b, hk, n);
      const decomp::LeverageScores l = decomp::leverage_scores(a.data(), n, d, d);
      std::vector<std::pair<double, index_t>> ranked(static_cast<std::size_t>(n));
      for (index_t j = 0; j < n; ++j) ranked[static_cast<std::size_t>(j)] = {l.scores[static_cast<std::size_t>(j)], j};
      std::nth_element(ranked.begin(), ranked.begin() + s, ranked.end(), Better{});
      for (index_t t = 0; t < s; ++t) plan.keys.push_back(ranked[static_cast<std::size_t>(t)].second);
      std::sort(plan.keys.begin(), plan.keys.end());
    }
    const index_t m = static_cast<index_t>(plan.keys.size());
    plan.k.resize(static_cast<std::size_t>(m * d));
    plan.v.resize(static_cast<std::size_t>(m * dv));
    for (index_t t = 0; t < m; ++t) {
      const index_t j = plan.keys[static_cast<std::size_t>(t)];
      std::copy(p.k.row(b, hk, j), p.k.row(b, hk, j) + d, plan.k.begin() + t * d);
      std::copy(p.v.row(b, hk, j), p.v.row(b, hk, j) + dv, plan.v.begin() + t * dv);
    }
    return plan;
  }
  // Causal: online scores of the finite prefix; rows that read further read a non-finite key.
  plan.usable = bad;
  const index_t u = bad;
  constexpr index_t kNever = std::numeric_limits<index_t>::max();
  plan.evict.assign(static_cast<std::size_t>(u), kNever);
  if (s >= u) return plan;
  const std::vector<double> a = keys_f64(p, b, hk, u);
  // The ridge λ sets the scale of "new direction" and must not depend on keys a row does not
  // see: 1e-12·‖k_f‖² of the first nonzero key f. A row that sees keys before f only sees zero
  // keys, whose scores are 0 whatever λ is, so no row's set depends on a key beyond its prefix.
  double norm2 = 0;
  for (index_t j = 0; j < u && norm2 == 0; ++j)
    for (index_t c = 0; c < d; ++c) norm2 += a[static_cast<std::size_t>(j * d + c)] * a[static_cast<std::size_t>(j * d + c)];
  const double lambda = std::max(1e-12 * norm2, std::numeric_limits<double>::min());
  const std::vector<double> score = decomp::online_leverage_scores(a.data(), u, d, d, lambda);
  // The top-s set of each prefix: a heap whose top is the worst member; a key leaves the set
  // when a better one pushes it out (possibly at once).
  std::priority_queue<std::pair<double, index_t>, std::vector<std::pair<double, index_t>>, Better> heap;
  for (index_t j = 0; j < u; ++j) {
    heap.push({score[static_cast<std::size_t>(j)], j});
    if (static_cast<index_t>(heap.size()) > s) {
      plan.evict[static_cast<std::size_t>(heap.top().second)] = j + 1;
      heap.pop();
    }
  }
  return plan;
}

/// Softmax attention of query rows [i0, i1) of head (b, h) over the `c` gathered keys kc/vc;
/// `valid(i, t)` says whether row i attends to gathered key t; rows with `nan_row(i)` are NaN.
template <class Valid, class NanRow>
void attend(const AttentionProblem& p, index_t b, index_t h, index_t i0, index_t i1, const float* kc,
            const float* vc, index_t c, const Valid& valid, const NanRow& nan_row, std::vector<float>& s) {
  const index_t rows = i1 - i0, dk = p.d_qk(), dv = p.d_v();
  float* o = p.out.row(b, h, i0);
  const index_t ldo = p.out.stride[2];
  if (c == 0) {
    for (index_t r = 0; r < rows; ++r) std::fill(o + r * ldo, o + r * ldo + dv, nan_row(i0 + r) ? kNaN : 0.f);
    return;
  }
  s.resize(static_cast<std::size_t>(rows * c));
  blas::sgemm(blas::Trans::kNo, blas::Trans::kYes, rows, c, dk, static_cast<float>(p.effective_scale()),
              p.q.row(b, h, i0), p.q.stride[2], kc, dk, 0.f, s.data(), c);
  std::vector<float> inv(static_cast<std::size_t>(rows));
  for (index_t r = 0; r < rows; ++r) {
    float* sr = s.data() + r * c;
    bool finite = true, any = false;
    float m = kNegInf;
    for (index_t t = 0; t < c; ++t) {
      if (!valid(i0 + r, t)) {
        sr[t] = kNegInf;
        continue;
      }
      any = true;
      finite &= std::isfinite(sr[t]);
      m = std::max(m, sr[t]);
    }
    const bool nan = nan_row(i0 + r);
    if (nan || !any || !finite) {
      // No key: an empty row (0). A non-finite logit (q, scale) or key it reads: NaN, for run().
      std::fill(sr, sr + c, 0.f);
      inv[static_cast<std::size_t>(r)] = nan || (any && !finite) ? kNaN : 0.f;
      continue;
    }
    float sum = 0;
    for (index_t t = 0; t < c; ++t) sr[t] -= m;
    simd::exp_f32(sr, sr, c);
    for (index_t t = 0; t < c; ++t) sum += sr[t];
    inv[static_cast<std::size_t>(r)] = 1.f / sum;
  }
  blas::sgemm(blas::Trans::kNo, blas::Trans::kNo, rows, dv, c, 1.f, s.data(), c, vc, dv, 0.f, o, ldo);
  for (index_t r = 0; r < rows; ++r) {
    float* orow = o + r * ldo;
    const float f = inv[static_cast<std::size_t>(r)];
    if (std::isnan(f)) std::fill(orow, orow + dv, kNaN);
    else
      for (index_t d = 0; d < dv; ++d) orow[d] *= f;
  }
}

}  // namespace

const MethodInfo& LevAttention::describe() {
  static const MethodInfo info = [] {
    MethodInfo m;
    m.name = "kernel.levattention";
    m.family = "kernel";
    m.summary = "softmax over a universal set: the keys of largest leverage score (online scores when causal)";
    m.citation = "Kannan, Bhattacharyya, Kacham, Woodruff, LevAttention: Time, Space and Streaming Efficient Algorithm for Heavy Attentions, ICLR 2025";
    m.time_complexity = "O(Nk·d² + Nq·keys·(Dk+Dv))";
    m.memory_complexity = "O(Nk·Dk) per kv head in flight + O(keys·(Dk+Dv))";
    m.params = {
        {"keys", ParamType::kInt, "32", 1, 1 << 20, {}, "size of the universal set U (keys ≥ Nk: exact)"},
        {"p", ParamType::kInt, "2", 2, 2, {}, "sensitivity exponent of f(x) = |x|^p; 2 = leverage scores (only 2 is implemented)"},
    };
    m.caps = {.exact = false, .causal = true, .gqa = true, .bool_mask = false, .additive_mask = false,
              .window = false, .lse = false, .decode = false};
    AccuracyContract& a = m.accuracy;
    a.max_rel_fro_error = [](const BudgetInput& in) {
      const double s = static_cast<double>(in.params.get_int("keys"));
      const double nk = static_cast<double>(in.problem.n_kv());
      const double exact = exact_f32_tolerance(in.logit_magnitude).rel_fro_error;
      if (s >= nk) return exact;
      // Measured on the conformance matrix, with a margin: flat rows (attention spread over all
      // keys) lose about sqrt(Nk/keys − 1) (the mean of `keys` values against the mean of Nk);
      // peaked rows whose heavy key is not in U lose about ‖v_a − v_b‖/‖v_a‖ ≤ 1.5.
      return 1.5 + 1.5 * std::sqrt(nk / s - 1) + exact;
    };
    a.limit_case = [](const AttentionProblem& p) {
      return ParamOverrides{{"keys", std::to_string(std::max<index_t>(1, p.n_kv()))}};
    };
    a.convergence.param = "keys";
    a.convergence.values = [](const AttentionProblem& p) {
      const index_t n = std::max<index_t>(1, p.n_kv());
      return std::vector<std::string>{std::to_string(std::max<index_t>(1, n / 16)), std::to_string(std::max<index_t>(1, n / 4)),
                                      std::to_string(std::max<index_t>(1, n / 2)), std::to_string(n)};
    };
    a.samples = {{{"keys", "8"}}, {{"keys", "64"}}};
    return m;
  }();
  return info;
}

std::size_t LevAttention::workspace_bytes(const AttentionProblem& p, const ExecContext& ctx) const {
  const auto s = static_cast<std::size_t>(std::min<index_t>(params().get_int("keys"), p.n_kv()));
  const auto nk = static_cast<std::size_t>(p.n_kv()), dk = static_cast<std::size_t>(p.d_qk()),
             dv = static_cast<std::size_t>(p.d_v());
  const auto kv = static_cast<std::size_t>(p.batch() * p.kv_heads());
  const auto nt = static_cast<std::size_t>(ctx.num_threads());
  const std::size_t per_kv = 8 * (nk * (dk + 3) + dk * dk) + 4 * s * (dk + dv);
  const std::size_t per_thread = 4 * (static_cast<std::size_t>(kRowBlock) + s) * (static_cast<std::size_t>(kRowBlock) + dk + dv);
  return kv * (4 * s * (dk + dv) + 8 * nk) + std::min(kv, nt) * per_kv + nt * per_thread;
}

void LevAttention::forward(const AttentionProblem& p, const ExecContext& ctx) const {
  const index_t s = params().get_int("keys");
  const index_t nq = p.n_q(), dk = p.d_qk(), dv = p.d_v(), hkv = p.kv_heads();
  std::vector<KvPlan> plans(static_cast<std::size_t>(p.batch() * hkv));
  parallel_for(ctx, static_cast<std::int64_t>(plans.size()), [&](std::int64_t t) {
    plans[static_cast<std::size_t>(t)] = plan_kv(p, t / hkv, t % hkv, s);
  });
  const index_t nblk = (nq + kRowBlock - 1) / kRowBlock;
  const int nt = ctx.num_threads();
  std::vector<std::vector<float>> ws_s(static_cast<std::size_t>(nt)), ws_k(static_cast<std::size_t>(nt)),
      ws_v(static_cast<std::size_t>(nt));
  parallel_for(ctx, p.batch() * p.heads() * nblk, [&](std::int64_t t) {
    const index_t blk = t % nblk, bh = t / nblk, b = bh / p.heads(), h = bh % p.heads(), hk = h / p.group();
    const index_t i0 = blk * kRowBlock, i1 = std::min(nq, i0 + kRowBlock);
    const KvPlan& plan = plans[static_cast<std::size_t>(b * hkv + hk)];
    const std::size_t w = worker_slot(ws_s.size());
    if (p.causal == Causal::kNone) {
      attend(p, b, h, i0, i1, plan.k.data(), plan.v.data(), static_cast<index_t>(plan.keys.size()),
             [](index_t, index_t) { return true; }, [&](index_t) { return plan.all_bad; }, ws_s[w]);
      return;
    }
    // Causal: the keys in U for some prefix length of this block, gathered once.
    const index_t lmin = p.key_range(i0).end, lmax = p.key_range(i1 - 1).end;
    std::vector<index_t> cand;
    for (index_t j = 0; j < std::min(lmax, plan.usable); ++j)
      if (plan.evict[static_cast<std::size_t>(j)] > lmin) cand.push_back(j);
    const index_t c = static_cast<index_t>(cand.size());
    std::vector<float>& kc = ws_k[w];
    std::vector<float>& vc = ws_v[w];
    kc.resize(static_cast<std::size_t>(c * dk));
    vc.resize(static_cast<std::size_t>(c * dv));
    for (index_t u = 0; u < c; ++u) {
      const index_t j = cand[static_cast<std::size_t>(u)];
      std::copy(p.k.row(b, hk, j), p.k.row(b, hk, j) + dk, kc.begin() + u * dk);
      std::copy(p.v.row(b, hk, j), p.v.row(b, hk, j) + dv, vc.begin() + u * dv);
    }
    attend(
        p, b, h, i0, i1, kc.data(), vc.data(), c,
        [&](index_t i, index_t u) {
          const index_t L = p.key_range(i).end, j = cand[static_cast<std::size_t>(u)];
          return j < L && plan.evict[static_cast<std::size_t>(j)] > L;
        },
        [&](index_t i) { return p.key_range(i).end > plan.usable; }, ws_s[w]);
  });
}

NUMATTN_DEFINE_METHOD(LevAttention)

}  // namespace numattn
