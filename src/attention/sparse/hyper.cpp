#include "attention/sparse/hyper.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "attention/method_def.h"
#include "numattn/attention/blocks/dense_softmax.h"
#include "numattn/attention/blocks/linear_attention.h"
#include "numattn/attention/blocks/lsh.h"
#include "numattn/attention/blocks/lse_merge.h"
#include "numattn/attention/blocks/nonfinite_rows.h"
#include "numattn/attention/blocks/tile_softmax.h"
#include "numattn/core/rng.h"

namespace numattn {

namespace {

constexpr double kNegInfD = -std::numeric_limits<double>::infinity();
constexpr float kNegInf = -std::numeric_limits<float>::infinity();

/// Everything one (batch, query head) needs.
struct Head {
  const AttentionProblem& p;
  index_t b, h, hk;
  index_t block, samples, min_seq_len;
  std::uint64_t seed;
  float scale;
  std::vector<std::uint32_t> qrank, krank;  ///< Gray ranks of all query rows / keys read
  std::uint32_t range;                      ///< 2^bits
  float* out;                               ///< p.out rows of (b, h)
  index_t ldo;
  std::vector<double> lse;                  ///< per query row
};

/// Per-thread scratch of the non-causal routine.
struct Scratch {
  std::vector<index_t> qperm, kperm;
  std::vector<std::uint32_t> sub;
  std::vector<float> qs, ks, vs, o, tile;
  std::vector<double> l;
  std::vector<index_t> draws;
  std::vector<float> bias;
};

std::uint64_t draw_stream(const AttentionProblem& p, index_t b, index_t h, std::uint64_t node) {
  return (std::uint64_t{1} << 63) | (static_cast<std::uint64_t>(b * p.heads() + h) << 32) | (node & 0xffffffffu);
}

void draw_positions(std::uint64_t seed, std::uint64_t stream, index_t m, index_t n, std::vector<index_t>& u) {
  const CounterRng rng(seed, stream);
  u.resize(static_cast<std::size_t>(m));
  for (index_t t = 0; t < m; ++t)
    u[static_cast<std::size_t>(t)] =
        std::min<index_t>(n - 1, static_cast<index_t>(rng.uniform(static_cast<std::uint64_t>(t)) * static_cast<double>(n)));
}

std::vector<std::uint32_t> gray_ranks(const float* x, index_t rows, index_t ld, index_t d, const std::vector<float>& r,
                                      index_t bits) {
  std::vector<float> proj(static_cast<std::size_t>(rows * bits));
  std::vector<std::uint32_t> codes(static_cast<std::size_t>(rows));
  if (rows > 0) {
    blocks::lsh_project(x, rows, ld, d, r.data(), bits, proj.data());
    blocks::simhash_codes(proj.data(), rows, bits, codes.data());
  }
  for (auto& c : codes) c = blocks::gray_rank(c);
  return codes;
}

/// Exact attention of rows [qa, qb) over keys [ka, kb) (causal: the part's bottom-right rule, which
/// is the global j ≤ i + off when kb = qb + off), by the flash kernel; (o, lse) to `o` (ld) and `l`.
void exact_part(const Head& H, index_t qa, index_t qb, index_t ka, index_t kb, bool causal, float* o, index_t ldo,
                double* l) {
  const AttentionProblem& p = H.p;
  const index_t nq = qb - qa, nk = kb - ka;
  if (nq <= 0) return;
  if (nk <= 0) {
    for (index_t i = 0; i < nq; ++i) {
      std::fill(o + i * ldo, o + i * ldo + p.d_v(), 0.f);
      l[i] = kNegInfD;
    }
    return;
  }
  thread_local std::vector<float> lse;
  lse.resize(static_cast<std::size_t>(nq));
  AttentionProblem sub;
  sub.q = TensorView<const float>(p.q.row(H.b, H.h, qa), {1, 1, nq, p.d_qk()}, {0, 0, p.q.stride[2], 1});
  sub.k = TensorView<const float>(p.k.row(H.b, H.hk, ka), {1, 1, nk, p.d_qk()}, {0, 0, p.k.stride[2], 1});
  sub.v = TensorView<const float>(p.v.row(H.b, H.hk, ka), {1, 1, nk, p.d_v()}, {0, 0, p.v.stride[2], 1});
  sub.out = TensorView<float>(o, {1, 1, nq, p.d_v()}, {0, 0, ldo, 1});
  sub.lse = TensorView<float>(lse.data(), {1, 1, nq, 1}, {0, 0, 1, 1});
  sub.scale = p.effective_scale();
  sub.causal = causal ? Causal::kBottomRight : Causal::kNone;
  blocks::dense_softmax_attention(sub, ExecContext{1});
  for (index_t i = 0; i < nq; ++i) l[i] = lse[static_cast<std::size_t>(i)];
}

/// The non-causal routine (see the header) for rows [qa, qb) over keys [ka, kb): (o, lse) of row
/// qa + r to o + r·ldo and l[r].
void noncausal(const Head& H, index_t qa, index_t qb, index_t ka, index_t kb, std::uint64_t node, float* o,
               index_t ldo, double* l) {
  const AttentionProblem& p = H.p;
  const index_t nq = qb - qa, nk = kb - ka, dk = p.d_qk(), dv = p.d_v();
  if (nq <= 0) return;
  // Strictly below min_seq_len, as the official forward_no_causal_mask: the off-diagonal parts of
  // the causal recursion's last level (N/2 = min_seq_len rows) are approximated. (The whole problem
  // is exact when max(Nq, Nk) ≤ min_seq_len: forward checks that first.)
  if (nk <= H.block || std::max(nq, nk) < H.min_seq_len) {
    exact_part(H, qa, qb, ka, kb, false, o, ldo, l);
    return;
  }
  thread_local Scratch w;
  // Sort queries and keys of the part by (Gray rank, index).
  w.qperm.resize(static_cast<std::size_t>(nq));
  w.kperm.resize(static_cast<std::size_t>(nk));
  blocks::stable_sort_by_key(H.qrank.data() + qa, nq, H.range, w.qperm.data());
  blocks::stable_sort_by_key(H.krank.data() + ka, nk, H.range, w.kperm.data());
  const index_t nb = (nk + H.block - 1) / H.block;
  const index_t m = H.samples;
  draw_positions(H.seed, draw_stream(p, H.b, H.h, node), m, nk, w.draws);
  // Gathered rows: sorted queries; per block its keys followed by the m drawn keys.
  w.qs.resize(static_cast<std::size_t>(nq * dk));
  for (index_t s = 0; s < nq; ++s)
    std::copy_n(p.q.row(H.b, H.h, qa + w.qperm[static_cast<std::size_t>(s)]), dk, w.qs.data() + s * dk);
  const index_t maxk = (nk + nb - 1) / nb + m;
  w.ks.resize(static_cast<std::size_t>(maxk * dk));
  w.vs.resize(static_cast<std::size_t>(maxk * dv));
  w.o.resize(static_cast<std::size_t>(((nq + nb - 1) / nb) * dv));
  w.l.resize(static_cast<std::size_t>((nq + nb - 1) / nb));
  w.bias.resize(static_cast<std::size_t>(m));
  for (index_t beta = 0; beta < nb; ++beta) {
    const index_t k0 = beta * nk / nb, k1 = (beta + 1) * nk / nb;
    const index_t q0 = beta * nq / nb, q1 = (beta + 1) * nq / nb;
    if (q1 <= q0) continue;
    const index_t bk = k1 - k0;
    for (index_t t = 0; t < bk; ++t) {
      const index_t j = ka + w.kperm[static_cast<std::size_t>(k0 + t)];
      std::copy_n(p.k.row(H.b, H.hk, j), dk, w.ks.data() + t * dk);
      std::copy_n(p.v.row(H.b, H.hk, j), dv, w.vs.data() + t * dv);
    }
    index_t outside = 0;
    for (index_t t = 0; t < m; ++t) {
      const index_t u = w.draws[static_cast<std::size_t>(t)];
      outside += u < k0 || u >= k1;
    }
    index_t keys = bk;
    if (outside > 0) {
      // log(n_rem/m'): the draws outside the block are uniform over the n_rem keys outside it.
      const float up = static_cast<float>(std::log(static_cast<double>(nk - bk) / static_cast<double>(outside)));
      for (index_t t = 0; t < m; ++t) {
        const index_t u = w.draws[static_cast<std::size_t>(t)];
        const index_t j = ka + w.kperm[static_cast<std::size_t>(u)];
        std::copy_n(p.k.row(H.b, H.hk, j), dk, w.ks.data() + (bk + t) * dk);
        std::copy_n(p.v.row(H.b, H.hk, j), dv, w.vs.data() + (bk + t) * dv);
        w.bias[static_cast<std::size_t>(t)] = (u < k0 || u >= k1) ? up : kNegInf;
      }
      keys += m;
    }
    const blocks::TileAdjust adjust = [&](index_t, float* row) {
      float* sr = row + bk;
      const float* bias = w.bias.data();
      for (index_t t = 0; t < m; ++t) sr[t] += bias[t];
    };
    blocks::tile_softmax(w.qs.data() + q0 * dk, dk, q1 - q0, w.ks.data(), dk, w.vs.data(), dv, keys, dk, dv, H.scale,
                         keys > bk ? &adjust : nullptr, w.o.data(), dv, w.l.data(), w.tile);
    for (index_t s = q0; s < q1; ++s) {
      const index_t r = w.qperm[static_cast<std::size_t>(s)];
      std::copy_n(w.o.data() + (s - q0) * dv, dv, o + r * ldo);
      l[r] = w.l[static_cast<std::size_t>(s - q0)];
    }
  }
}

/// Causal part: rows [qa, qb) over keys [ka, qb + off) under j ≤ i + off (see the header).
void causal(const Head& H, index_t qa, index_t qb, index_t ka, std::uint64_t node, float* o, index_t ldo, double* l) {
  const index_t off = H.p.diag_offset();
  const index_t kb = qb + off, nq = qb - qa, nk = kb - ka, dv = H.p.d_v();
  if (nq <= 0) return;
  if (std::max(nq, nk) <= H.min_seq_len) {
    exact_part(H, qa, qb, ka, kb, true, o, ldo, l);
    return;
  }
  if (nq == 1) {  // one row sees all of [ka, kb)
    noncausal(H, qa, qb, ka, kb, node, o, ldo, l);
    return;
  }
  const index_t qm = qa + nq / 2, km = qm + off;
  causal(H, qa, qm, ka, 2 * node, o, ldo, l);
  float* o2 = o + (qm - qa) * ldo;
  double* l2 = l + (qm - qa);
  causal(H, qm, qb, km, 2 * node + 1, o2, ldo, l2);
  // The off-diagonal block: rows [qm, qb) over keys [ka, km), all visible.
  std::vector<float> ot(static_cast<std::size_t>((qb - qm) * dv));
  std::vector<double> lt(static_cast<std::size_t>(qb - qm));
  noncausal(H, qm, qb, ka, km, node, ot.data(), dv, lt.data());
  for (index_t r = 0; r < qb - qm; ++r)
    blocks::lse_merge_into(o2 + r * ldo, l2[r], ot.data() + r * dv, lt[static_cast<std::size_t>(r)], dv);
}

double budget(const BudgetInput& in) {
  const AttentionProblem& p = in.problem;
  const double exact = exact_f32_tolerance(in.logit_magnitude).rel_fro_error;
  const index_t n = std::max(p.n_q(), p.n_kv());
  if (in.params.get_int("min_seq_len") >= n || in.params.get_int("block") >= p.n_kv()) return exact;
  // An empirical envelope (median over 5 seeds on the conformance matrix, at least 2× above every
  // measured error): a flat row averages Nk values to nearly 0, an estimate over k = block +
  // samples keys is off by about ‖v‖/√k, so the relative error grows like √(Nk/k) (measured 9.9
  // for one decode row over Nk = 2000 at block = samples = 16; 2.8 at the defaults, min_seq_len 1);
  // rows whose heavy keys hash into other blocks add about 1.
  const double nk = static_cast<double>(std::max<index_t>(p.n_kv(), 1));
  const double k = std::min(nk, static_cast<double>(in.params.get_int("block") + in.params.get_int("samples")));
  return 1.5 + 2.5 * std::sqrt(nk / k) + exact;
}

}  // namespace

const MethodInfo& HyperAttention::describe() {
  static const MethodInfo info = [] {
    MethodInfo m;
    m.name = "sparse.hyper";
    m.family = "sparse";
    m.summary = "HyperAttention: SimHash-sorted (Gray order) diagonal blocks plus uniformly sampled keys, LSE-merged; causal by recursion";
    m.citation = "Han, Jayaram, Karbasi, Mirrokni, Woodruff, Zandieh, HyperAttention: Long-context Attention in Near-Linear Time, ICLR 2024";
    m.time_complexity = "O(N·(block+samples)·(Dk+Dv)) non-causal; causal O(N·log(N/min_seq_len)·(block+samples)·(Dk+Dv) + N·min_seq_len·(Dk+Dv))";
    m.memory_complexity = "O(N·(Dk+Dv)) gathered rows per thread + O(Nq·Dv) per recursion level";
    m.params = {
        {"block", ParamType::kInt, "256", 1, 1 << 20, {}, "keys per sorted block (query block = Nq/blocks); ≥ Nk = exact"},
        {"samples", ParamType::kInt, "256", 0, 1 << 16, {}, "uniformly drawn keys (with replacement) for the residual"},
        {"bits", ParamType::kInt, "7", 1, 16, {}, "SimHash sign projections (2^bits buckets, Gray order)"},
        {"min_seq_len", ParamType::kInt, "4096", 1, 1 << 30, {},
         "parts with max(rows, keys) ≤ this are exact (recursion base); ≥ N = exact"},
        {"seed", ParamType::kInt, "0", 0, 2147483647, {}, "seed of the projections and draws"},
    };
    m.caps = {.exact = false, .causal = true, .gqa = true, .bool_mask = false, .additive_mask = false,
              .window = false, .lse = true, .decode = false, .dk_ne_dv = true, .strided = true,
              .deterministic = true, .randomized = true};
    AccuracyContract& a = m.accuracy;
    a.max_rel_fro_error = budget;
    a.limit_case = [](const AttentionProblem& p) {
      return ParamOverrides{{"min_seq_len", std::to_string(std::max<index_t>({p.n_q(), p.n_kv(), 1}))}};
    };
    // On the harness's convergence problem (48 × 160) the default min_seq_len makes every value
    // exact; sparse_hyper_test checks the fall with block at min_seq_len = 16.
    a.convergence.param = "block";
    a.convergence.values = [](const AttentionProblem&) { return std::vector<std::string>{"16", "64", "256"}; };
    a.samples = {{{"min_seq_len", "16"}, {"block", "16"}, {"samples", "16"}},
                 {{"min_seq_len", "32"}, {"block", "32"}, {"samples", "0"}, {"bits", "3"}},
                 {{"min_seq_len", "16"}}};
    return m;
  }();
  return info;
}

std::vector<std::uint32_t> HyperAttention::ranks(const AttentionProblem& p, index_t b, index_t h, bool keys,
                                                 index_t n) const {
  const index_t bits = params_.get_int("bits"), hk = h / p.group();
  const std::vector<float> r = blocks::lsh_projections(p.d_qk(), bits, static_cast<std::uint64_t>(params_.get_int("seed")),
                                                       static_cast<std::uint64_t>(hk));
  return keys ? gray_ranks(p.k.row(b, hk, 0), n, p.k.stride[2], p.d_qk(), r, bits)
              : gray_ranks(p.q.row(b, h, 0), n, p.q.stride[2], p.d_qk(), r, bits);
}

std::vector<index_t> HyperAttention::draws(const AttentionProblem& p, index_t b, index_t h, std::uint64_t node,
                                           index_t n_k) const {
  std::vector<index_t> u;
  draw_positions(static_cast<std::uint64_t>(params_.get_int("seed")), draw_stream(p, b, h, node),
                 params_.get_int("samples"), n_k, u);
  return u;
}

std::size_t HyperAttention::workspace_bytes(const AttentionProblem& p, const ExecContext& ctx) const {
  const auto nt = static_cast<std::size_t>(std::min<index_t>(ctx.num_threads(), p.batch() * p.heads()));
  const index_t nmax = std::max(p.n_q(), p.n_kv());
  const auto n = static_cast<std::size_t>(nmax);
  const auto keys = static_cast<std::size_t>(std::min(params_.get_int("block"), p.n_kv()) +
                                             std::min(params_.get_int("samples"), index_t{1} << 16));
  const auto rows = std::min(n, keys);
  const auto d = static_cast<std::size_t>(p.d_qk() + p.d_v());
  return nt * (4 * (n * d + rows * keys + keys * d) + 24 * n + 8 * n * static_cast<std::size_t>(p.d_v()));
}

void HyperAttention::forward(const AttentionProblem& p, const ExecContext& ctx) const {
  if (blocks::mark_rows_reading_nonfinite(p, ctx)) return;
  const index_t nq = p.n_q(), nk = blocks::keys_read(p);
  const index_t msl = params_.get_int("min_seq_len");
  if (std::max(p.n_q(), p.n_kv()) <= msl) {  // the official fallback: exact attention
    AttentionProblem sub = p;
    sub.scale = p.effective_scale();
    blocks::dense_softmax_attention(sub, ctx);
    return;
  }
  const index_t bits = params_.get_int("bits");
  const auto seed = static_cast<std::uint64_t>(params_.get_int("seed"));
  std::vector<std::vector<float>> proj(static_cast<std::size_t>(p.kv_heads()));
  for (index_t hk = 0; hk < p.kv_heads(); ++hk)
    proj[static_cast<std::size_t>(hk)] = blocks::lsh_projections(p.d_qk(), bits, seed, static_cast<std::uint64_t>(hk));
  parallel_for(ctx, p.batch() * p.heads(), [&](std::int64_t t) {
    const index_t b = t / p.heads(), h = t % p.heads(), hk = h / p.group();
    Head H{p, b, h, hk, params_.get_int("block"), params_.get_int("samples"), msl, seed,
           static_cast<float>(p.effective_scale()), {}, {}, std::uint32_t{1} << bits, p.out.row(b, h, 0),
           p.out.stride[2], std::vector<double>(static_cast<std::size_t>(nq), kNegInfD)};
    const std::vector<float>& r = proj[static_cast<std::size_t>(hk)];
    H.qrank = gray_ranks(p.q.row(b, h, 0), nq, p.q.stride[2], p.d_qk(), r, bits);
    H.krank = gray_ranks(p.k.row(b, hk, 0), nk, p.k.stride[2], p.d_qk(), r, bits);
    double* l = H.lse.data();
    if (p.causal == Causal::kNone) {
      noncausal(H, 0, nq, 0, nk, 1, H.out, H.ldo, l);
    } else {
      const index_t off = p.diag_offset();
      const index_t q0 = std::clamp<index_t>(-off, 0, nq);               // rows before q0 see no key
      const index_t q1 = std::clamp<index_t>(p.n_kv() - off, q0, nq);    // rows from q1 see every key
      for (index_t i = 0; i < q0; ++i) std::fill(H.out + i * H.ldo, H.out + i * H.ldo + p.d_v(), 0.f);
      causal(H, q0, q1, 0, 1, H.out + q0 * H.ldo, H.ldo, l + q0);
      noncausal(H, q1, nq, 0, p.n_kv(), 0, H.out + q1 * H.ldo, H.ldo, l + q1);
    }
    if (!p.lse.empty())
      for (index_t i = 0; i < nq; ++i) p.lse(b, h, i, 0) = static_cast<float>(l[i]);
  });
}

NUMATTN_DEFINE_METHOD(HyperAttention)

}  // namespace numattn
