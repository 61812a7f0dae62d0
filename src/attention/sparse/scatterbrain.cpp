#include <algorithm>
#include "attention/sparse/scatterbrain.h"

#include <cmath>
#include <limits>

#include "attention/method_def.h"
#include "numattn/attention/blocks/nonfinite_rows.h"
#include "numattn/attention/blocks/performer_features.h"
#include "numattn/core/blas.h"
#include "numattn/core/simd.h"

namespace numattn {

namespace {

constexpr double kLogitRefusal = 1e6;  // as kernel.performer
constexpr double kNegInfD = -std::numeric_limits<double>::infinity();

double budget(const BudgetInput& in) {
  const AttentionProblem& p = in.problem;
  const double exact = exact_f32_tolerance(in.logit_magnitude).rel_fro_error;
  if (in.params.get_int("chunk") >= p.n_kv()) return exact;
  // An empirical envelope (median over 5 seeds on the conformance matrix, at least 2× above every
  // measured error), of the same form as sparse.reformer's: the sparse part is exact on at most
  // k = 2·chunk·rounds keys per row, the random features' estimate of the others is noisy, so a
  // flat row is off by about √(Nk/k) relative to its small norm (measured 2.2 at chunk = 1, Nk = 130).
  const double nk = static_cast<double>(std::max<index_t>(p.n_kv(), 1));
  const double k = std::min(nk, 2.0 * static_cast<double>(in.params.get_int("chunk") * in.params.get_int("rounds")));
  return 1.5 + 2.5 * std::sqrt(nk / k) + exact;
}

float row_max(const float* x, index_t n) {
  float m = -std::numeric_limits<float>::infinity();
  for (index_t i = 0; i < n; ++i) m = x[i] > m ? x[i] : m;
  return m;
}

}  // namespace

const MethodInfo& ScatterbrainAttention::describe() {
  static const MethodInfo info = [] {
    MethodInfo m;
    m.name = "sparse.scatterbrain";
    m.family = "sparse";
    m.summary = "Scatterbrain: Performer φ+ low rank plus an exact sparse correction on LSH-collision pairs";
    m.citation = "Chen, Dao, Winsor, Song, Rudra, Ré, Scatterbrain: Unifying Sparse and Low-rank Attention, NeurIPS 2021";
    m.time_complexity = "O(N·M·(Dk+Dv) + rounds·N·2·chunk·(Dk+Dv+M))";
    m.memory_complexity = "O(N·M) features + O(rounds·N·Dv) per head";
    m.params = {
        {"features", ParamType::kInt, "256", 0, 1024, {}, "M: Performer φ+ directions (0 = pure sparse)"},
        {"buckets", ParamType::kInt, "0", 0, 4096, {}, "angular LSH buckets (0 = 2^⌊log2(2N/chunk)⌋, 1 = no hashing)"},
        {"rounds", ParamType::kInt, "1", 1, 8, {}, "hashing rounds (collision pairs = union of the windows)"},
        {"chunk", ParamType::kInt, "64", 1, 1 << 20, {}, "sorted keys per chunk (a query's pairs: its chunk and the previous one)"},
        {"seed", ParamType::kInt, "0", 0, 2147483647, {}, "seed of the hashes and features"},
    };
    m.caps = {.exact = false, .causal = false, .gqa = true, .bool_mask = false, .additive_mask = false,
              .window = false, .lse = false, .decode = false, .dk_ne_dv = true, .strided = true,
              .deterministic = true, .randomized = true};
    AccuracyContract& a = m.accuracy;
    a.max_rel_fro_error = budget;
    a.limit_case = [](const AttentionProblem& p) {
      return ParamOverrides{{"buckets", "1"}, {"chunk", std::to_string(std::max<index_t>(p.n_kv(), 1))}};
    };
    a.convergence.param = "chunk";
    a.convergence.values = [](const AttentionProblem& p) {
      return std::vector<std::string>{"8", "16", "32", "64", std::to_string(std::max<index_t>(p.n_kv(), 65))};
    };
    a.samples = {{{"features", "0"}, {"chunk", "16"}},
                 {{"features", "64"}, {"rounds", "2"}, {"chunk", "16"}},
                 {{"rounds", "3"}, {"chunk", "8"}, {"buckets", "4"}}};
    return m;
  }();
  return info;
}

Status ScatterbrainAttention::can_run(const AttentionProblem& p) const {
  // It reads q: judge the float32 problem run() makes of half-precision Q / output.
  if (p.has_half_q() || p.has_half_out()) return can_run(widen_io(p).problem);
  Status s = AttentionMethod::can_run(p);
  if (!s.is_ok()) return s;
  if (!(p.effective_scale() >= 0)) return Status::unsupported("sparse.scatterbrain needs scale ≥ 0 (x ← x·√scale)");
  return Status::ok();
}

std::vector<double> ScatterbrainAttention::directions(index_t d, index_t hk) const {
  // kernel.performer's default draw (orthogonal, one per KV head) for the same features and seed.
  return blocks::performer_directions(params_.get_int("features"), d,
                                      static_cast<std::uint64_t>(params_.get_int("seed")),
                                      static_cast<std::uint64_t>(hk), true);
}

std::vector<reformer::Round> ScatterbrainAttention::plan(const AttentionProblem& p, index_t b, index_t h) const {
  const index_t rounds = params_.get_int("rounds"), chunk = params_.get_int("chunk"), nk = p.n_kv();
  const index_t buckets = params_.get_int("buckets") == 0 ? reformer::auto_buckets(nk, chunk) : params_.get_int("buckets");
  std::vector<reformer::Round> out;
  for (index_t r = 0; r < rounds; ++r)
    out.push_back(reformer::plan_round(p.q.row(b, h, 0), p.q.stride[2], p.n_q(), p.k.row(b, h / p.group(), 0),
                                       p.k.stride[2], nk, p.d_qk(), buckets, chunk,
                                       static_cast<std::uint64_t>(params_.get_int("seed")),
                                       static_cast<std::uint64_t>(h) * 256 + static_cast<std::uint64_t>(r), false, 0));
  return out;
}

std::size_t ScatterbrainAttention::workspace_bytes(const AttentionProblem& p, const ExecContext& ctx) const {
  const auto M = static_cast<std::size_t>(params_.get_int("features"));
  const auto rounds = static_cast<std::size_t>(params_.get_int("rounds"));
  const auto bh = static_cast<std::size_t>(p.batch() * p.heads());
  const auto n = static_cast<std::size_t>(std::max(p.n_q(), p.n_kv()));
  const auto dv = static_cast<std::size_t>(p.d_v());
  const auto c = static_cast<std::size_t>(std::min<index_t>(params_.get_int("chunk"), std::max(p.n_kv(), index_t{1})));
  return bh * n * 4 * (2 * M + dv) + bh * (rounds + 1) * n * (8 * dv + 24 + 40) +
         static_cast<std::size_t>(ctx.num_threads()) * 4 * (4 * c * (M + static_cast<std::size_t>(p.d_qk()) + dv) + 6 * c * n);
}

void ScatterbrainAttention::forward(const AttentionProblem& p, const ExecContext& ctx) const {
  if (blocks::mark_rows_reading_nonfinite(p, ctx)) return;
  const index_t B = p.batch(), H = p.heads(), Hk = p.kv_heads(), nq = p.n_q(), nk = p.n_kv(), dk = p.d_qk(),
                dv = p.d_v();
  const int R = static_cast<int>(params_.get_int("rounds"));
  const index_t chunk = std::max<index_t>(params_.get_int("chunk"), 1);
  const double s = p.effective_scale(), rs = std::sqrt(s);
  const index_t M = params_.get_int("features");
  const bool lowrank = M > 0 && chunk < nk;  // chunk ≥ Nk: every pair collides, L cancels exactly

  std::vector<reformer::Round> plans(static_cast<std::size_t>(B * H * R));
  parallel_for(ctx, B * H, [&](std::int64_t t) {
    std::vector<reformer::Round> pr = plan(p, t / H, t % H);
    for (int r = 0; r < R; ++r) plans[static_cast<std::size_t>(t * R + r)] = std::move(pr[static_cast<std::size_t>(r)]);
  });

  // Low-rank part: shifted features Φ̃ (queries: row max a_i; keys: head max b), states Φ̃_Kᵀ[V|1].
  std::vector<float> wt, kfeat, qfeat, state, lnum;
  std::vector<double> qshift, lden;  // qshift: a_i + b − log M per (b, h, i)
  if (lowrank) {
    double qmax = 0, kmax = 0;
    for (index_t b = 0; b < B; ++b) {
      for (index_t h = 0; h < H; ++h)
        for (index_t i = 0; i < nq; ++i) {
          const float* x = p.q.row(b, h, i);
          double n2 = 0;
          for (index_t c = 0; c < dk; ++c) n2 += static_cast<double>(x[c]) * x[c];
          qmax = std::max(qmax, std::sqrt(n2));
        }
      for (index_t h = 0; h < Hk; ++h)
        for (index_t j = 0; j < nk; ++j) {
          const float* x = p.k.row(b, h, j);
          double n2 = 0;
          for (index_t c = 0; c < dk; ++c) n2 += static_cast<double>(x[c]) * x[c];
          kmax = std::max(kmax, std::sqrt(n2));
        }
    }
    NUMATTN_CHECK(!(s * qmax * kmax > kLogitRefusal),
                  "sparse.scatterbrain: |scale|·max‖q‖·max‖k‖ = {:.3g} exceeds {:.0e}; its random features carry no "
                  "information about such logits; reduce the scale or the magnitude of q and k (or use features=0)",
                  s * qmax * kmax, kLogitRefusal);
    wt.resize(static_cast<std::size_t>(Hk * dk * M));
    for (index_t hk = 0; hk < Hk; ++hk) {
      const std::vector<double> w = directions(dk, hk);
      for (index_t r = 0; r < M; ++r)
        for (index_t c = 0; c < dk; ++c)
          wt[static_cast<std::size_t>((hk * dk + c) * M + r)] = static_cast<float>(rs * w[static_cast<std::size_t>(r * dk + c)]);
    }
    // E = X·(√s Wᵀ) − s‖x‖²/2, row by row.
    auto exponents = [&](const float* x, index_t ld, index_t rows, index_t hk, float* e) {
      if (rows == 0) return;
      blas::sgemm(blas::Trans::kNo, blas::Trans::kNo, rows, M, dk, 1.f, x, ld, wt.data() + hk * dk * M, M, 0.f, e, M);
      for (index_t i = 0; i < rows; ++i) {
        double n2 = 0;
        for (index_t c = 0; c < dk; ++c) n2 += static_cast<double>(x[i * ld + c]) * x[i * ld + c];
        const float h2 = static_cast<float>(0.5 * s * n2);
        for (index_t r = 0; r < M; ++r) e[i * M + r] -= h2;
      }
    };
    kfeat.resize(static_cast<std::size_t>(B * Hk * nk * M));
    state.resize(static_cast<std::size_t>(B * Hk * M * (dv + 1)));
    std::vector<double> kshift(static_cast<std::size_t>(B * Hk));
    parallel_for(ctx, B * Hk, [&](std::int64_t t) {
      const index_t b = t / Hk, hk = t % Hk;
      float* e = kfeat.data() + t * nk * M;
      exponents(p.k.row(b, hk, 0), p.k.stride[2], nk, hk, e);
      const float mx = row_max(e, nk * M);
      kshift[static_cast<std::size_t>(t)] = mx;
      for (index_t u = 0; u < nk * M; ++u) e[u] = simd::exp_f32(e[u] - mx);
      float* st = state.data() + t * M * (dv + 1);
      blas::sgemm(blas::Trans::kYes, blas::Trans::kNo, M, dv, nk, 1.f, e, M, p.v.row(b, hk, 0), p.v.stride[2], 0.f, st, dv);
      float* z = st + M * dv;
      std::vector<double> zz(static_cast<std::size_t>(M), 0.0);
      for (index_t j = 0; j < nk; ++j)
        for (index_t r = 0; r < M; ++r) zz[static_cast<std::size_t>(r)] += e[j * M + r];
      for (index_t r = 0; r < M; ++r) z[r] = static_cast<float>(zz[static_cast<std::size_t>(r)]);
    });
    qfeat.resize(static_cast<std::size_t>(B * H * nq * M));
    qshift.resize(static_cast<std::size_t>(B * H * nq));
    lnum.resize(static_cast<std::size_t>(B * H * nq * dv));
    lden.resize(static_cast<std::size_t>(B * H * nq));
    parallel_for(ctx, B * H, [&](std::int64_t t) {
      const index_t b = t / H, h = t % H, hk = h / p.group(), bk = b * Hk + hk;
      float* e = qfeat.data() + t * nq * M;
      exponents(p.q.row(b, h, 0), p.q.stride[2], nq, hk, e);
      for (index_t i = 0; i < nq; ++i) {
        float* row = e + i * M;
        const float mx = row_max(row, M);
        for (index_t r = 0; r < M; ++r) row[r] = simd::exp_f32(row[r] - mx);
        qshift[static_cast<std::size_t>(t * nq + i)] =
            static_cast<double>(mx) + kshift[static_cast<std::size_t>(bk)] - std::log(static_cast<double>(M));
      }
      const float* st = state.data() + bk * M * (dv + 1);
      blas::sgemm(blas::Trans::kNo, blas::Trans::kNo, nq, dv, M, 1.f, e, M, st, dv, 0.f, lnum.data() + t * nq * dv, dv);
      for (index_t i = 0; i < nq; ++i) {
        double d = 0;
        for (index_t r = 0; r < M; ++r) d += static_cast<double>(e[i * M + r]) * st[M * dv + r];
        lden[static_cast<std::size_t>(t * nq + i)] = d;
      }
    });
  }

  // Sparse pieces per (head, round, chunk run): C_ij = (e^{s_ij − c_i} − e^{λ_i − c_i}·L̃_ij)/N_ij
  // (λ_i the low-rank frame), and the softmax-only terms A_ij = e^{s_ij − c_i}/N_ij for the fallback.
  struct Item {
    index_t bh, r, c, s0, s1;
  };
  std::vector<Item> items;
  for (index_t t = 0; t < B * H; ++t)
    for (int r = 0; r < R; ++r) {
      const reformer::Round& P = plans[static_cast<std::size_t>(t * R + r)];
      index_t a = 0;
      while (a < nq) {
        const index_t c = P.query_chunk[static_cast<std::size_t>(P.query_order[static_cast<std::size_t>(a)])];
        index_t e = a;
        while (e < nq && P.query_chunk[static_cast<std::size_t>(P.query_order[static_cast<std::size_t>(e)])] == c) ++e;
        items.push_back({t, r, c, a, e});
        a = e;
      }
    }
  const std::size_t np = static_cast<std::size_t>(B * H * R * nq);
  std::vector<float> snum(np * static_cast<std::size_t>(dv)), anum(np * static_cast<std::size_t>(dv));
  std::vector<double> sden(np), aden(np), sshift(np, kNegInfD);
  struct Scratch {
    std::vector<float> qg, kg, vg, fq, fk, sl, ll, o;
    reformer::WindowCounts counts;
  };
  std::vector<Scratch> scratch(static_cast<std::size_t>(ctx.num_threads()));
  parallel_for(ctx, static_cast<std::int64_t>(items.size()), [&](std::int64_t it) {
    const Item& I = items[static_cast<std::size_t>(it)];
    const index_t b = I.bh / H, h = I.bh % H, hk = h / p.group();
    const reformer::Round& P = plans[static_cast<std::size_t>(I.bh * R + I.r)];
    Scratch& w = scratch[worker_slot(scratch.size())];
    const index_t rows = I.s1 - I.s0, w0 = P.window_begin(I.c), keys = P.window_end(I.c) - w0;
    auto qi = [&](index_t u) { return P.query_order[static_cast<std::size_t>(I.s0 + u)]; };
    auto kj = [&](index_t t) { return P.key_order[static_cast<std::size_t>(w0 + t)]; };
    w.qg.resize(static_cast<std::size_t>(rows * dk));
    w.kg.resize(static_cast<std::size_t>(keys * dk));
    w.vg.resize(static_cast<std::size_t>(keys * dv));
    w.sl.resize(static_cast<std::size_t>(rows * keys));
    w.o.resize(static_cast<std::size_t>(rows * dv));
    for (index_t u = 0; u < rows; ++u) std::copy_n(p.q.row(b, h, qi(u)), dk, w.qg.data() + u * dk);
    for (index_t t = 0; t < keys; ++t) {
      std::copy_n(p.k.row(b, hk, kj(t)), dk, w.kg.data() + t * dk);
      std::copy_n(p.v.row(b, hk, kj(t)), dv, w.vg.data() + t * dv);
    }
    blas::sgemm(blas::Trans::kNo, blas::Trans::kYes, rows, keys, dk, static_cast<float>(s), w.qg.data(), dk,
                w.kg.data(), dk, 0.f, w.sl.data(), keys);
    if (lowrank) {
      const index_t bk = b * Hk + hk;
      w.fq.resize(static_cast<std::size_t>(rows * M));
      w.fk.resize(static_cast<std::size_t>(keys * M));
      w.ll.resize(static_cast<std::size_t>(rows * keys));
      for (index_t u = 0; u < rows; ++u) std::copy_n(qfeat.data() + (I.bh * nq + qi(u)) * M, M, w.fq.data() + u * M);
      for (index_t t = 0; t < keys; ++t) std::copy_n(kfeat.data() + (bk * nk + kj(t)) * M, M, w.fk.data() + t * M);
      blas::sgemm(blas::Trans::kNo, blas::Trans::kYes, rows, keys, M, 1.f, w.fq.data(), M, w.fk.data(), M, 0.f,
                  w.ll.data(), keys);
    }
    // Row frames and the two coefficient matrices: w.sl ← A terms, w.ll ← C terms.
    if (R > 1) w.counts.prepare(plans, static_cast<std::size_t>(I.bh * R), R, P, w0, keys);
    for (index_t u = 0; u < rows; ++u) {
      const index_t i = qi(u);
      const std::int32_t* cnt = R > 1 ? w.counts.row(plans, static_cast<std::size_t>(I.bh * R), R, i) : nullptr;
      const std::size_t at = static_cast<std::size_t>((I.bh * R + I.r) * nq + i);
      float* sr = w.sl.data() + u * keys;
      const double lam = lowrank ? qshift[static_cast<std::size_t>(I.bh * nq + i)] : kNegInfD;
      double c = lam;
      for (index_t t = 0; t < keys; ++t) c = std::max(c, static_cast<double>(sr[t]));
      const float fl = static_cast<float>(std::exp(lam - c));
      float* lr = lowrank ? w.ll.data() + u * keys : nullptr;
      double da = 0, dc = 0;
      for (index_t t = 0; t < keys; ++t) {
        float a = simd::exp_f32(static_cast<float>(sr[t] - c));
        const float inv_n = cnt ? 1.f / static_cast<float>(cnt[t]) : 1.f;
        a *= inv_n;
        float cc = a;
        if (lr) {
          const float l = fl * lr[t] * inv_n;
          cc = a - l;
          lr[t] = cc;
        }
        sr[t] = a;
        da += a;
        dc += cc;
      }
      sshift[at] = c;
      aden[at] = da;
      sden[at] = dc;
    }
    blas::sgemm(blas::Trans::kNo, blas::Trans::kNo, rows, dv, keys, 1.f, w.sl.data(), keys, w.vg.data(), dv, 0.f,
                w.o.data(), dv);
    for (index_t u = 0; u < rows; ++u)
      std::copy_n(w.o.data() + u * dv, dv, anum.data() + static_cast<std::size_t>((I.bh * R + I.r) * nq + qi(u)) * dv);
    if (lowrank)
      blas::sgemm(blas::Trans::kNo, blas::Trans::kNo, rows, dv, keys, 1.f, w.ll.data(), keys, w.vg.data(), dv, 0.f,
                  w.o.data(), dv);
    for (index_t u = 0; u < rows; ++u)
      std::copy_n(w.o.data() + u * dv, dv, snum.data() + static_cast<std::size_t>((I.bh * R + I.r) * nq + qi(u)) * dv);
  });

  // Combine the pieces of each row relative to its largest frame.
  parallel_for(ctx, B * H, [&](std::int64_t t) {
    const index_t b = t / H, h = t % H;
    std::vector<double> num(static_cast<std::size_t>(dv)), numa(static_cast<std::size_t>(dv));
    for (index_t i = 0; i < nq; ++i) {
      double top = lowrank ? qshift[static_cast<std::size_t>(t * nq + i)] : kNegInfD;
      for (int r = 0; r < R; ++r) top = std::max(top, sshift[static_cast<std::size_t>((t * R + r) * nq + i)]);
      std::fill(num.begin(), num.end(), 0.0);
      std::fill(numa.begin(), numa.end(), 0.0);
      double den = 0, dena = 0;
      if (lowrank) {
        const double f = std::exp(qshift[static_cast<std::size_t>(t * nq + i)] - top);
        const float* ln = lnum.data() + (t * nq + i) * dv;
        for (index_t c = 0; c < dv; ++c) num[static_cast<std::size_t>(c)] += f * ln[c];
        den += f * lden[static_cast<std::size_t>(t * nq + i)];
      }
      for (int r = 0; r < R; ++r) {
        const std::size_t at = static_cast<std::size_t>((t * R + r) * nq + i);
        const double f = std::exp(sshift[at] - top);
        const float* sn = snum.data() + at * dv;
        const float* an = anum.data() + at * dv;
        for (index_t c = 0; c < dv; ++c) {
          num[static_cast<std::size_t>(c)] += f * sn[c];
          numa[static_cast<std::size_t>(c)] += f * an[c];
        }
        den += f * sden[at];
        dena += f * aden[at];
      }
      float* o = p.out.row(b, h, i);
      const bool ok = den > 0 && std::isfinite(den);
      const double inv = ok ? 1.0 / den : (dena > 0 ? 1.0 / dena : std::numeric_limits<double>::quiet_NaN());
      const std::vector<double>& src = ok ? num : numa;
      for (index_t c = 0; c < dv; ++c) o[c] = static_cast<float>(src[static_cast<std::size_t>(c)] * inv);
    }
  });
}

double ScatterbrainAttention::flops(const AttentionProblem& p) const {
  // Performer's features and state (M features) plus, per LSH round, each query over two chunks
  // of keys with the low-rank estimate of each of those pairs subtracted (M more per pair).
  const double m = static_cast<double>(params_.get_int("features")), rounds = static_cast<double>(params_.get_int("rounds"));
  const index_t chunk = params_.get_int("chunk");
  const double buckets = static_cast<double>(params_.get_int("buckets") == 0 ? reformer::auto_buckets(p.n_kv(), chunk)
                                                                               : params_.get_int("buckets"));
  const double bh = static_cast<double>(p.batch() * p.heads()), nq = static_cast<double>(p.n_q()),
               nk = static_cast<double>(p.n_kv()), dk = static_cast<double>(p.d_qk()), dv = static_cast<double>(p.d_v());
  return bh * (2 * (nq + nk) * m * (dk + dv + 1) + rounds * ((nq + nk) * dk * buckets +
                                                             2 * nq * 2 * static_cast<double>(chunk) * (dk + dv + m)));
}

NUMATTN_DEFINE_METHOD(ScatterbrainAttention)

}  // namespace numattn
