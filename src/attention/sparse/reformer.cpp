#include <algorithm>
#include "attention/sparse/reformer.h"

#include <cmath>
#include <limits>

#include "attention/method_def.h"
#include "numattn/attention/blocks/linear_attention.h"
#include "numattn/attention/blocks/lse_merge.h"
#include "numattn/attention/blocks/lsh.h"
#include "numattn/attention/blocks/nonfinite_rows.h"
#include "numattn/attention/blocks/tile_softmax.h"

namespace numattn {

namespace reformer {

index_t auto_buckets(index_t n, index_t chunk) {
  const double x = 2.0 * static_cast<double>(n) / static_cast<double>(std::max<index_t>(chunk, 1));
  if (x < 2) return 1;
  return index_t{1} << std::min(20, static_cast<int>(std::floor(std::log2(x))));
}

Round plan_round(const float* q, index_t ldq, index_t nq, const float* k, index_t ldk, index_t nk, index_t d,
                 index_t buckets, index_t chunk, std::uint64_t seed, std::uint64_t stream, bool causal, index_t off) {
  Round R;
  R.chunk = std::max<index_t>(chunk, 1);
  R.nchunks = (nk + R.chunk - 1) / R.chunk;
  const index_t dirs = buckets <= 1 ? 0 : (buckets + 1) / 2;
  const auto range = static_cast<std::uint32_t>(std::max<index_t>(2 * dirs, 1));
  std::vector<std::uint32_t> qc(static_cast<std::size_t>(nq), 0u), kc(static_cast<std::size_t>(nk), 0u);
  if (dirs > 0) {
    const std::vector<float> r = blocks::lsh_projections(d, dirs, seed, stream);
    std::vector<float> proj(static_cast<std::size_t>(std::max(nq, nk) * dirs));
    std::vector<std::int32_t> codes(static_cast<std::size_t>(std::max(nq, nk)));
    auto hash = [&](const float* x, index_t ld, index_t n, std::vector<std::uint32_t>& out) {
      if (n == 0) return;
      blocks::lsh_project(x, n, ld, d, r.data(), dirs, proj.data());
      blocks::angular_codes(proj.data(), n, dirs, codes.data());
      for (index_t i = 0; i < n; ++i) out[static_cast<std::size_t>(i)] = static_cast<std::uint32_t>(codes[static_cast<std::size_t>(i)]);
    };
    hash(q, ldq, nq, qc);
    hash(k, ldk, nk, kc);
  }
  R.key_order.resize(static_cast<std::size_t>(nk));
  R.key_pos.resize(static_cast<std::size_t>(nk));
  R.query_order.resize(static_cast<std::size_t>(nq));
  R.query_chunk.resize(static_cast<std::size_t>(nq));
  blocks::stable_sort_by_key(kc.data(), nk, range, R.key_order.data());
  blocks::invert_permutation(R.key_order.data(), nk, R.key_pos.data());
  blocks::stable_sort_by_key(qc.data(), nq, range, R.query_order.data());
  // First sorted position of each bucket among the keys.
  std::vector<index_t> start(static_cast<std::size_t>(range) + 1, 0);
  for (std::uint32_t c : kc) ++start[c + 1];
  for (std::size_t c = 1; c < start.size(); ++c) start[c] += start[c - 1];
  for (index_t i = 0; i < nq; ++i) {
    const std::uint32_t c = qc[static_cast<std::size_t>(i)];
    const index_t pos = causal ? i + off : (nq > 0 ? i * nk / nq : 0);
    const index_t* b0 = R.key_order.data() + start[c];
    const index_t* b1 = R.key_order.data() + start[c + 1];
    const index_t t = start[c] + (std::lower_bound(b0, b1, pos) - b0);
    R.query_chunk[static_cast<std::size_t>(i)] = std::clamp<index_t>(t / R.chunk, 0, std::max<index_t>(R.nchunks - 1, 0));
  }
  return R;
}

}  // namespace reformer

namespace {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

std::uint64_t round_stream(index_t h, index_t r) { return static_cast<std::uint64_t>(h) * 256 + static_cast<std::uint64_t>(r); }

/// Normalised q rows of (b, h): n × d.
void normalised_queries(const AttentionProblem& p, index_t b, index_t h, float* out) {
  const index_t d = p.d_qk();
  for (index_t i = 0; i < p.n_q(); ++i) {
    const float* q = p.q.row(b, h, i);
    double n2 = 0;
    for (index_t c = 0; c < d; ++c) n2 += static_cast<double>(q[c]) * q[c];
    const double inv = n2 > 0 ? 1.0 / std::sqrt(n2) : 0.0;
    for (index_t c = 0; c < d; ++c) out[i * d + c] = static_cast<float>(q[c] * inv);
  }
}

double budget(const BudgetInput& in) {
  const AttentionProblem& p = in.problem;
  const double exact = exact_f32_tolerance(in.logit_magnitude).rel_fro_error;
  const bool shared = in.params.get_bool("shared_qk");
  // One window holds every key (one bucket, or one chunk): exact.
  if (!shared && in.params.get_int("chunk") >= p.n_kv()) return exact;
  // An empirical envelope (median over 5 seeds on the conformance matrix, at least 2× above every
  // measured error): a flat row averages Nk values to nearly 0, an average over the k ≤ 2·chunk·
  // rounds keys of the windows is off by about ‖v‖/√k, so the relative error grows like √(Nk/k)
  // (measured 21.9 for one decode row over Nk = 2000 at chunk = 1; 3.8 at the defaults); rows
  // whose heavy keys hash elsewhere add about 1. Shared QK computes another mechanism (keys =
  // normalised queries, no self-attention): its change is added.
  const double nk = static_cast<double>(std::max<index_t>(p.n_kv(), 1));
  const double k = std::min(nk, 2.0 * static_cast<double>(in.params.get_int("chunk") * in.params.get_int("rounds")));
  return (shared ? 4.0 : 1.5) + 2.5 * std::sqrt(nk / k) + exact;
}

}  // namespace

const MethodInfo& ReformerAttention::describe() {
  static const MethodInfo info = [] {
    MethodInfo m;
    m.name = "sparse.reformer";
    m.family = "sparse";
    m.summary = "Reformer: angular-LSH sorted chunks (own + previous), rounds merged with the duplicate-count correction";
    m.citation = "Kitaev, Kaiser, Levskaya, Reformer: The Efficient Transformer, ICLR 2020";
    m.time_complexity = "O(rounds·N·(Dk·buckets/2 + 2·chunk·(Dk+Dv+rounds)))";
    m.memory_complexity = "O(rounds·N·(Dv+4)) per head";
    m.params = {
        {"buckets", ParamType::kInt, "0", 0, 4096, {}, "angular LSH buckets (even; 0 = 2^⌊log2(2N/chunk)⌋, 1 = no hashing)"},
        {"rounds", ParamType::kInt, "1", 1, 8, {}, "hashing rounds, merged over the union with the duplicate correction"},
        {"chunk", ParamType::kInt, "64", 1, 1 << 20, {}, "sorted keys per chunk; a query sees its chunk and the previous one"},
        {"shared_qk", ParamType::kBool, "false", 0, 0, {}, "keys = normalised queries, no self-attention (needs Nq = Nk)"},
        {"seed", ParamType::kInt, "0", 0, 2147483647, {}, "seed of the projections"},
    };
    // Causal rules and windows by the causal recursion (reformer.h): the native sorted-chunk form
    // lets a future key's bucket move earlier keys between chunks.
    m.caps = {.exact = false, .causal = false, .gqa = true, .bool_mask = false, .additive_mask = false,
              .window = false, .lse = true, .decode = false, .dk_ne_dv = true, .strided = true,
              .deterministic = true, .randomized = true};
    AccuracyContract& a = m.accuracy;
    a.max_rel_fro_error = budget;
    a.limit_case = [](const AttentionProblem& p) {
      return ParamOverrides{{"buckets", "1"}, {"rounds", "1"}, {"chunk", std::to_string(std::max<index_t>(p.n_kv(), 1))}};
    };
    a.convergence.param = "chunk";
    a.convergence.values = [](const AttentionProblem& p) {
      return std::vector<std::string>{"8", "16", "32", "64", std::to_string(std::max<index_t>(p.n_kv(), 65))};
    };
    a.samples = {{{"rounds", "4"}, {"chunk", "16"}},
                 {{"rounds", "2"}, {"chunk", "8"}, {"buckets", "8"}},
                 {{"shared_qk", "true"}, {"rounds", "2"}, {"chunk", "16"}}};
    return m;
  }();
  return info;
}

Status ReformerAttention::can_run(const AttentionProblem& p) const {
  // It reads q: judge the float32 problem run() makes of half-precision Q / output.
  if (p.has_half_q() || p.has_half_out()) return can_run(widen_io(p).problem);
  // The recursion's blocks would take their own rows' queries as keys, not those of the keys'
  // positions.
  if (params_.get_bool("shared_qk") && (p.causal != Causal::kNone || p.has_window()))
    return Status::unsupported(
        "sparse.reformer(shared_qk=true) has no causal or sliding-window form: its keys are the problem's own queries, "
        "and the causal recursion's off-diagonal blocks would hash the queries of other positions");
  Status s = AttentionMethod::can_run(p);
  if (!s.is_ok()) return s;
  if (params_.get_bool("shared_qk") && p.n_q() != p.n_kv())
    return Status::unsupported("sparse.reformer(shared_qk=true) uses the queries as keys: it needs Nq == Nk");
  return Status::ok();
}

std::vector<float> ReformerAttention::keys(const AttentionProblem& p, index_t b, index_t h) const {
  const index_t d = p.d_qk();
  if (params_.get_bool("shared_qk")) {
    std::vector<float> k(static_cast<std::size_t>(p.n_q() * d));
    normalised_queries(p, b, h, k.data());
    return k;
  }
  const index_t nk = blocks::keys_read(p);
  std::vector<float> k(static_cast<std::size_t>(nk * d));
  for (index_t j = 0; j < nk; ++j) std::copy_n(p.k.row(b, h / p.group(), j), d, k.data() + j * d);
  return k;
}

std::vector<reformer::Round> ReformerAttention::plan(const AttentionProblem& p, index_t b, index_t h) const {
  const bool shared = params_.get_bool("shared_qk");
  const index_t rounds = params_.get_int("rounds"), chunk = params_.get_int("chunk");
  const index_t nk = shared ? p.n_q() : blocks::keys_read(p), d = p.d_qk();
  const index_t buckets = params_.get_int("buckets") == 0 ? reformer::auto_buckets(nk, chunk) : params_.get_int("buckets");
  const std::vector<float> k = keys(p, b, h);
  std::vector<reformer::Round> out;
  for (index_t r = 0; r < rounds; ++r)
    out.push_back(reformer::plan_round(p.q.row(b, h, 0), p.q.stride[2], p.n_q(), k.data(), d, nk, d, buckets, chunk,
                                       static_cast<std::uint64_t>(params_.get_int("seed")), round_stream(h, r),
                                       false, -1));
  return out;
}

std::size_t ReformerAttention::workspace_bytes(const AttentionProblem& p, const ExecContext& ctx) const {
  const auto rounds = static_cast<std::size_t>(params_.get_int("rounds"));
  const auto bh = static_cast<std::size_t>(p.batch() * p.heads());
  const auto n = static_cast<std::size_t>(std::max(p.n_q(), p.n_kv()));
  const auto c = static_cast<std::size_t>(std::min<index_t>(params_.get_int("chunk"), std::max(p.n_kv(), index_t{1})));
  return bh * rounds * n * (4 * static_cast<std::size_t>(p.d_v()) + 8 + 32) + bh * n * 4 * static_cast<std::size_t>(p.d_qk()) +
         static_cast<std::size_t>(ctx.num_threads()) * 4 * (3 * c * (static_cast<std::size_t>(p.d_qk() + p.d_v())) + 2 * c * n);
}

void ReformerAttention::forward(const AttentionProblem& p, const ExecContext& ctx) const {
  if (blocks::mark_rows_reading_nonfinite(p, ctx)) return;
  const bool shared = params_.get_bool("shared_qk");
  const index_t B = p.batch(), H = p.heads(), nq = p.n_q(), dk = p.d_qk(), dv = p.d_v();
  const index_t nk = shared ? nq : blocks::keys_read(p);
  const int R = static_cast<int>(params_.get_int("rounds"));
  const float scale = static_cast<float>(p.effective_scale());

  // Keys per (b, h): the problem's rows, or the normalised queries (shared QK).
  std::vector<std::vector<float>> khat(static_cast<std::size_t>(shared ? B * H : 0));
  std::vector<reformer::Round> plans(static_cast<std::size_t>(B * H * R));
  parallel_for(ctx, B * H, [&](std::int64_t t) {
    const index_t b = t / H, h = t % H;
    std::vector<reformer::Round> pr = plan(p, b, h);
    for (int r = 0; r < R; ++r) plans[static_cast<std::size_t>(t * R + r)] = std::move(pr[static_cast<std::size_t>(r)]);
    if (shared) khat[static_cast<std::size_t>(t)] = keys(p, b, h);
  });
  auto key_row = [&](index_t b, index_t h, index_t j) -> const float* {
    return shared ? khat[static_cast<std::size_t>(b * H + h)].data() + j * dk : p.k.row(b, h / p.group(), j);
  };

  // Work items: (head, round, chunk) with its run of sorted queries.
  struct Item {
    index_t bh, r, c, s0, s1;
  };
  std::vector<Item> items;
  for (index_t t = 0; t < B * H; ++t)
    for (int r = 0; r < R; ++r) {
      const reformer::Round& P = plans[static_cast<std::size_t>(t * R + r)];
      index_t s = 0;
      while (s < nq) {
        const index_t c = P.query_chunk[static_cast<std::size_t>(P.query_order[static_cast<std::size_t>(s)])];
        index_t e = s;
        while (e < nq && P.query_chunk[static_cast<std::size_t>(P.query_order[static_cast<std::size_t>(e)])] == c) ++e;
        items.push_back({t, r, c, s, e});
        s = e;
      }
    }
  std::vector<float> part_o(static_cast<std::size_t>(B * H * R * nq * dv));
  std::vector<double> part_l(static_cast<std::size_t>(B * H * R * nq), -std::numeric_limits<double>::infinity());
  struct Scratch {
    std::vector<float> qg, kg, vg, o, tile;
    std::vector<double> l;
    reformer::WindowCounts counts;
  };
  std::vector<float> log_count(static_cast<std::size_t>(R) + 1, 0.f);  // log N for N = 1..R
  for (int r = 1; r <= R; ++r) log_count[static_cast<std::size_t>(r)] = std::log(static_cast<float>(r));
  std::vector<Scratch> scratch(static_cast<std::size_t>(ctx.num_threads()));
  parallel_for(ctx, static_cast<std::int64_t>(items.size()), [&](std::int64_t it) {
    const Item& I = items[static_cast<std::size_t>(it)];
    const index_t b = I.bh / H, h = I.bh % H, hk = h / p.group();
    const reformer::Round& P = plans[static_cast<std::size_t>(I.bh * R + I.r)];
    Scratch& w = scratch[worker_slot(scratch.size())];
    const index_t rows = I.s1 - I.s0, w0 = P.window_begin(I.c), w1 = P.window_end(I.c), keys = w1 - w0;
    w.qg.resize(static_cast<std::size_t>(rows * dk));
    w.kg.resize(static_cast<std::size_t>(keys * dk));
    w.vg.resize(static_cast<std::size_t>(keys * dv));
    w.o.resize(static_cast<std::size_t>(rows * dv));
    w.l.resize(static_cast<std::size_t>(rows));
    for (index_t u = 0; u < rows; ++u)
      std::copy_n(p.q.row(b, h, P.query_order[static_cast<std::size_t>(I.s0 + u)]), dk, w.qg.data() + u * dk);
    for (index_t t = 0; t < keys; ++t) {
      const index_t j = P.key_order[static_cast<std::size_t>(w0 + t)];
      std::copy_n(key_row(b, h, j), dk, w.kg.data() + t * dk);
      std::copy_n(p.v.row(b, hk, j), dv, w.vg.data() + t * dv);
    }
    // Duplicate counts (log N_ij subtracted; a key of this window is in this round's, N ≥ 1).
    if (R > 1) w.counts.prepare(plans, static_cast<std::size_t>(I.bh * R), R, P, w0, keys);
    const blocks::TileAdjust adjust = [&](index_t u, float* row) {
      const index_t i = P.query_order[static_cast<std::size_t>(I.s0 + u)];
      if (R > 1) {
        const std::int32_t* n = w.counts.row(plans, static_cast<std::size_t>(I.bh * R), R, i);
        for (index_t t = 0; t < keys; ++t) row[t] -= log_count[static_cast<std::size_t>(n[t])];
      }
      if (shared)
        for (index_t t = 0; t < keys; ++t)
          if (P.key_order[static_cast<std::size_t>(w0 + t)] == i) row[t] = kNegInf;
    };
    blocks::tile_softmax(w.qg.data(), dk, rows, w.kg.data(), dk, w.vg.data(), dv, keys, dk, dv, scale,
                         (shared || R > 1) ? &adjust : nullptr, w.o.data(), dv, w.l.data(), w.tile);
    for (index_t u = 0; u < rows; ++u) {
      const index_t i = P.query_order[static_cast<std::size_t>(I.s0 + u)];
      const std::size_t at = static_cast<std::size_t>((I.bh * R + I.r) * nq + i);
      std::copy_n(w.o.data() + u * dv, dv, part_o.data() + at * dv);
      part_l[at] = w.l[static_cast<std::size_t>(u)];
    }
  });

  // Merge the rounds; rows left without a visible key attend to their diagonal key.
  parallel_for(ctx, B * H, [&](std::int64_t t) {
    const index_t b = t / H, h = t % H, hk = h / p.group();
    std::vector<const float*> outs(static_cast<std::size_t>(R));
    std::vector<double> ls(static_cast<std::size_t>(R));
    for (index_t i = 0; i < nq; ++i) {
      for (int r = 0; r < R; ++r) {
        const std::size_t at = static_cast<std::size_t>((t * R + r) * nq + i);
        outs[static_cast<std::size_t>(r)] = part_o.data() + at * dv;
        ls[static_cast<std::size_t>(r)] = part_l[at];
      }
      float* o = p.out.row(b, h, i);
      double l = blocks::lse_merge(outs.data(), ls.data(), R, dv, o);
      const index_t jd = std::min(i, nk - 1);
      if (l == -std::numeric_limits<double>::infinity() && jd >= 0) {
        const float* q = p.q.row(b, h, i);
        const float* k = key_row(b, h, jd);
        double s = 0;
        for (index_t c = 0; c < dk; ++c) s += static_cast<double>(q[c]) * k[c];
        l = s * p.effective_scale();
        std::copy_n(p.v.row(b, hk, jd), dv, o);
      }
      if (!p.lse.empty()) p.lse(b, h, i, 0) = static_cast<float>(l);
    }
  });
}

double ReformerAttention::flops(const AttentionProblem& p) const {
  // Per round: random rotations for the bucket ids (Dk·buckets/2 per row), then each query over
  // two chunks of keys.
  const index_t chunk = params_.get_int("chunk");
  const double buckets = static_cast<double>(params_.get_int("buckets") == 0 ? reformer::auto_buckets(p.n_kv(), chunk)
                                                                               : params_.get_int("buckets"));
  const double rounds = static_cast<double>(params_.get_int("rounds"));
  const double bh = static_cast<double>(p.batch() * p.heads()), dk = static_cast<double>(p.d_qk()),
               dv = static_cast<double>(p.d_v());
  const double n = static_cast<double>(p.n_q() + p.n_kv());
  return bh * rounds * (n * dk * buckets + 2 * static_cast<double>(p.n_q()) * 2 * static_cast<double>(chunk) * (dk + dv));
}

NUMATTN_DEFINE_METHOD(ReformerAttention)

}  // namespace numattn
