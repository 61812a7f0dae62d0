#include "attention/lowrank/loki.h"

#include <Eigen/Core>

#include <algorithm>
#include <bit>
#include <cfloat>
#include <cstdint>
#include <cmath>
#include <functional>
#include <limits>
#include <vector>

#include "attention/blocks/select_gather.h"
#include "attention/method_def.h"
#include "numattn/core/blas.h"
#include "numattn/core/simd.h"
#include "numattn/decomp/dense.h"

namespace numattn {

namespace {

constexpr index_t kRowBlock = 32;  // query rows per task: their approximate scores stay in L2
constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();
constexpr float kNegInf = -std::numeric_limits<float>::infinity();

index_t reduced_rank(double frac, index_t d) {
  return std::clamp<index_t>(static_cast<index_t>(std::ceil(frac * static_cast<double>(d) - 1e-9)), 1, std::max<index_t>(d, 1));
}

/// One PCA basis of a (batch, kv head) and the keys in it.
struct KvBasis {
  index_t r = 0;
  std::vector<float> P;     ///< Dk × r, row-major: the leading eigenvectors of Σ_{j<L} kⱼᵀkⱼ
  std::vector<float> krt;   ///< K·P_r of the keys [0, E) its rows read, in panels of 16 keys (blocks::pack_key_panels)
};

/// Calibration granularity: a causal block's basis uses all but fewer than kCalibStep of the keys
/// before its frontier (bases every kCalibStep keys; powers of two below that). The most recent
/// keys matter: on SmolLM2-135M layer 15 (N = 8192, causal) steps of 512 / 256 / 128 / 64 gave
/// rel_fro_error 0.074 / 0.068 / 0.058 / 0.052 (every key, future ones included: 0.063).
constexpr index_t kCalibStep = 128;

/// Which bases a problem needs. A block of query rows takes its basis from keys [0, L) that lie
/// before the frontier of every one of its rows (seen, or left of a window), so that no key a
/// row does not see shapes its choice: with F the smallest key_range end of the block's rows
/// (those that see a key), L = Nk when F = Nk (every row sees the last key: no causal rule or
/// right window), else F rounded down to a multiple of kCalibStep (to a power of two below it).
/// About Nk/kCalibStep + log2(kCalibStep) bases per kv head; their Gram matrices are running sums
/// (O(Nk·Dk²) in all), each projects the keys up to the last one its blocks see.
struct BasisPlan {
  std::vector<index_t> len;     ///< L of each basis, increasing
  std::vector<index_t> end;     ///< E: keys [0, E) projected (the largest key_range end of its rows)
  std::vector<int> of_block;    ///< the basis of each row block (−1: its rows see no key)
};

BasisPlan plan_bases(const AttentionProblem& p, index_t row_block) {
  const index_t nq = p.n_q(), nk = p.n_kv(), nblk = (nq + row_block - 1) / row_block;
  std::vector<index_t> len_of(static_cast<std::size_t>(nblk), -1), end_of(static_cast<std::size_t>(nblk), 0);
  std::vector<index_t> lens;
  for (index_t blk = 0; blk < nblk; ++blk) {
    index_t first = nk, last = 0;
    bool any = false;
    for (index_t i = blk * row_block; i < std::min(nq, (blk + 1) * row_block); ++i) {
      const KeyRange kr = p.key_range(i);
      if (kr.empty()) continue;
      any = true;
      first = std::min(first, kr.end);
      last = std::max(last, kr.end);
    }
    if (!any) continue;
    const index_t L = first >= nk          ? nk
                      : first >= kCalibStep ? first / kCalibStep * kCalibStep
                                            : static_cast<index_t>(std::bit_floor(static_cast<std::uint64_t>(first)));
    len_of[static_cast<std::size_t>(blk)] = L;
    end_of[static_cast<std::size_t>(blk)] = last;
    lens.push_back(L);
  }
  std::sort(lens.begin(), lens.end());
  lens.erase(std::unique(lens.begin(), lens.end()), lens.end());
  BasisPlan bp;
  bp.len = lens;
  bp.end.assign(lens.size(), 0);
  bp.of_block.assign(static_cast<std::size_t>(nblk), -1);
  for (index_t blk = 0; blk < nblk; ++blk) {
    if (len_of[static_cast<std::size_t>(blk)] < 0) continue;
    const auto at = std::lower_bound(lens.begin(), lens.end(), len_of[static_cast<std::size_t>(blk)]) - lens.begin();
    bp.of_block[static_cast<std::size_t>(blk)] = static_cast<int>(at);
    bp.end[static_cast<std::size_t>(at)] = std::max(bp.end[static_cast<std::size_t>(at)], end_of[static_cast<std::size_t>(blk)]);
  }
  return bp;
}

/// Keys j < n whose k or v row is not finite: a row that sees one is NaN.
std::vector<index_t> nonfinite_keys(const AttentionProblem& p, index_t b, index_t hk) {
  std::vector<index_t> bad;
  for (index_t j = 0; j < p.n_kv(); ++j)
    if (!simd::all_finite(p.k.row(b, hk, j), p.d_qk()) || !simd::all_finite(p.v.row(b, hk, j), p.d_v())) bad.push_back(j);
  return bad;
}

/// Σ_{j<L} kⱼᵀkⱼ over the finite keys, for each L of `lens` (increasing), as running sums in
/// float64: Dk × Dk row-major each.
std::vector<std::vector<double>> prefix_grams(const AttentionProblem& p, index_t b, index_t hk,
                                              const std::vector<index_t>& lens) {
  const index_t d = p.d_qk();
  std::vector<std::vector<double>> out;
  std::vector<double> C(static_cast<std::size_t>(d * d), 0.0), kf;
  index_t from = 0;
  for (index_t L : lens) {
    kf.clear();
    index_t rows = 0;
    for (index_t j = from; j < L; ++j) {
      const float* k = p.k.row(b, hk, j);
      if (!simd::all_finite(k, d)) continue;
      kf.insert(kf.end(), k, k + d);
      ++rows;
    }
    if (rows > 0)
      blas::dgemm(blas::Trans::kYes, blas::Trans::kNo, d, d, rows, 1.0, kf.data(), d, kf.data(), d, 1.0, C.data(), d);
    out.push_back(C);
    from = L;
  }
  return out;
}

/// The basis of the Gram matrix `gram` (Dk × Dk), and the keys [0, end) in it.
KvBasis make_basis(const AttentionProblem& p, index_t b, index_t hk, index_t r, std::vector<double> gram, index_t end) {
  KvBasis kb;
  kb.r = r;
  const index_t d = p.d_qk();
  Eigen::Map<Eigen::Matrix<double, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>> Cm(gram.data(), d, d);
  const decomp::dense::SymEig eig = decomp::dense::sym_eig(Cm);  // finite rows only: cannot fail
  NUMATTN_ASSERT(eig.info == decomp::dense::Info::kSuccess);
  // Eigenvalues ascend: the leading r eigenvectors are the last r columns, largest first.
  kb.P.resize(static_cast<std::size_t>(d * r));
  for (index_t c = 0; c < d; ++c)
    for (index_t t = 0; t < r; ++t)
      kb.P[static_cast<std::size_t>(c * r + t)] = static_cast<float>(eig.vectors(c, d - 1 - t));
  std::vector<float> kr(static_cast<std::size_t>(end * r));
  if (end > 0)
    blas::sgemm(blas::Trans::kNo, blas::Trans::kNo, end, r, d, 1.f, p.k.row(b, hk, 0), p.k.stride[2], kb.P.data(), r,
                0.f, kr.data(), r);
  kb.krt.resize(static_cast<std::size_t>(16 * r * ((end + 15) / 16)));
  blocks::pack_key_panels(kr.data(), r, end, r, kb.krt.data());
  return kb;
}

/// Whether row i sees key j (causal rule, window, boolean mask, additive −inf/NaN hide).
bool sees(const AttentionProblem& p, index_t b, index_t h, index_t i, index_t j) {
  if (!p.visible(b, h, i, j)) return false;
  if (p.mask.kind == MaskKind::kAdditive) return p.mask_row(b, h, i).additive[j] > kNegInf;
  return true;
}

/// Room for one row's chosen keys when the block's key span is `span` (select_top's slack included).
index_t key_capacity(index_t span, double kfrac) {
  return std::min<index_t>(span, static_cast<index_t>(std::ceil(kfrac * static_cast<double>(span))) + 1) + 16;
}

enum class RowKind : std::uint8_t { kEmpty, kNaN, kChosen };

struct Scratch {
  std::vector<float> qr, s, sel;
  std::vector<std::int32_t> keys;  ///< the block's chosen keys, row after row (capacity `cap` each)
  std::vector<blocks::ChosenRow> rows;
  std::vector<RowKind> kinds;
  blocks::SelectScratch sw;
  blocks::AttendScratch aw;
};

/// Where a block's approximate scores lie: row i − i0 at w.s + (i − i0)·ld, key j at offset
/// j − origin, for the keys [begin, end) any row of the block sees.
struct BlockScores {
  index_t begin = 0, end = 0, origin = 0, ld = 0;
};

/// Approximate scores of rows [i0, i1) of query head h over the block's key span:
/// sign(scale)·(q_i P_r)·(k_j P_r), by the packed-panel kernel (blocks::panel_scores: r-long dot
/// products, no per-block packing). Ranking needs only the sign of the scale; leaving out its
/// magnitude keeps huge scales from overflowing.
BlockScores block_scores(const AttentionProblem& p, const KvBasis& kb, index_t b, index_t h, index_t i0, index_t i1,
                         Scratch& w) {
  const index_t rows = i1 - i0, r = kb.r;
  BlockScores bs;
  bs.begin = p.n_kv();
  for (index_t i = i0; i < i1; ++i) {
    const KeyRange kr = p.key_range(i);
    if (kr.empty()) continue;
    bs.begin = std::min(bs.begin, kr.begin);
    bs.end = std::max(bs.end, kr.end);
  }
  if (bs.end <= bs.begin) return bs;
  const index_t pb = bs.begin / 16, pe = (bs.end + 15) / 16;
  bs.origin = 16 * pb;
  bs.ld = 16 * (pe - pb);
  w.qr.resize(static_cast<std::size_t>(rows * r));
  w.s.resize(static_cast<std::size_t>(rows * bs.ld));
  const float sgn = p.effective_scale() < 0 ? -1.f : 1.f;
  blas::sgemm(blas::Trans::kNo, blas::Trans::kNo, rows, r, p.d_qk(), 1.f, p.q.row(b, h, i0), p.q.stride[2], kb.P.data(),
              r, 0.f, w.qr.data(), r);
  blocks::panel_scores(w.qr.data(), r, rows, r, kb.krt.data() + pb * 16 * r, pe - pb, sgn, w.s.data(), bs.ld);
  return bs;
}

/// Loki's choice for row i (T_i, written to out[0..*count), increasing): the
/// ceil(topk_frac·visible) keys of largest approximate logit, with `srow[j]` the row's scores
/// (block_scores) of key j. `out` has room for key_capacity(span) entries.
RowKind choose_row(const AttentionProblem& p, const std::vector<index_t>& bad, index_t b, index_t h, index_t i,
                   const float* srow, double kfrac, Scratch& w, std::int32_t* out, index_t* count) {
  const KeyRange kr = p.key_range(i);
  if (kr.empty()) return RowKind::kEmpty;
  const index_t n = kr.end - kr.begin;
  const float* cand = srow + kr.begin;
  index_t nv = n;
  if (p.mask.kind != MaskKind::kNone) {
    // Selection scores of the visible keys: approximate logit + additive mask (float64, then
    // clamped: an overflow must not read as a hidden key); −inf for the hidden ones.
    const double as = std::abs(p.effective_scale());
    w.sel.resize(static_cast<std::size_t>(n));
    nv = 0;
    for (index_t j = kr.begin; j < kr.end; ++j) {
      float& x = w.sel[static_cast<std::size_t>(j - kr.begin)];
      if (!sees(p, b, h, i, j)) {
        x = kNegInf;
        continue;
      }
      double y = as * srow[j];
      if (p.mask.kind == MaskKind::kAdditive) y += p.mask_row(b, h, i).additive[j];
      x = static_cast<float>(std::clamp(y, -static_cast<double>(FLT_MAX), static_cast<double>(FLT_MAX)));
      ++nv;
    }
    cand = w.sel.data();
  }
  if (nv == 0) return RowKind::kEmpty;
  // A non-finite value the row reads (q, or a key it sees) must reach its output.
  if (!simd::all_finite(p.q.row(b, h, i), p.d_qk())) return RowKind::kNaN;
  for (index_t j : bad)
    if (sees(p, b, h, i, j)) return RowKind::kNaN;
  const index_t k = std::clamp<index_t>(static_cast<index_t>(std::ceil(kfrac * static_cast<double>(nv) - 1e-9)), 1, nv);
  *count = blocks::select_top(cand, n, k, static_cast<std::int32_t>(kr.begin), out, w.sw);
  // Nothing chosen among visible keys: the approximate scores overflowed (an Error from run()).
  return *count > 0 ? RowKind::kChosen : RowKind::kNaN;
}

}  // namespace

const MethodInfo& LokiAttention::describe() {
  static const MethodInfo info = [] {
    MethodInfo m;
    m.name = "lowrank.loki";
    m.family = "lowrank";
    m.summary = "PCA-reduced scores choose the top-k keys per query; exact softmax over them";
    m.citation = "Singhania, Singh, He, Feizi, Bhatele, Loki: Low-rank Keys for Efficient Sparse Attention, NeurIPS 2024";
    m.time_complexity = "O(Nq·Nk·r + Nq·Nk + Nq·k·(Dk+Dv)) (gather form: reduced scores, selection, exact part over k chosen keys) + O(Nk·Dk²) basis";
    m.memory_complexity = "O(Nk·r) per kv head + O(threads·32·(Hq/Hkv)·Nk)";
    m.params = {
        {"rank_frac", ParamType::kFloat, "0.25", 0.01, 1, {}, "fraction of Dk kept for the approximate scores (r = ceil(rank_frac·Dk))"},
        {"topk_frac", ParamType::kFloat, "0.25", 0.01, 1, {}, "fraction of each row's visible keys attended (k = ceil(topk_frac·visible)); 1 = exact"},
    };
    m.caps = {.exact = false, .causal = true, .gqa = true, .bool_mask = true, .additive_mask = true,
              .window = true, .lse = false, .decode = false, .head_mask = true};
    AccuracyContract& a = m.accuracy;
    a.max_rel_fro_error = [](const BudgetInput& in) {
      const double f = in.params.get_float("topk_frac");
      const double exact = exact_f32_tolerance(in.logit_magnitude).rel_fro_error;
      if (f >= 1) return exact;
      // Measured on the conformance matrix, with a margin: a row whose weight is spread evenly
      // over its n visible keys, averaged over k = f·n of them, is off by about sqrt(1/f − 1)
      // (the mean of k values against the mean of n); peaked rows lose less, unless the
      // reduced scores rank the heavy key out (then about ‖v_a − v_b‖/‖v_a‖ ≲ 1.5).
      return 0.5 + 1.5 * std::sqrt(1 / f - 1) + exact;
    };
    a.limit_case = [](const AttentionProblem&) { return ParamOverrides{{"topk_frac", "1"}}; };
    a.convergence.param = "topk_frac";
    a.convergence.values = [](const AttentionProblem&) {
      return std::vector<std::string>{"0.05", "0.125", "0.25", "0.5", "1"};
    };
    a.samples = {{{"rank_frac", "0.125"}, {"topk_frac", "0.125"}}, {{"rank_frac", "1"}, {"topk_frac", "0.5"}}};
    return m;
  }();
  return info;
}

double LokiAttention::flops(const AttentionProblem& p) const {
  const double kfrac = params().get_float("topk_frac");
  const index_t dk = p.d_qk(), dv = p.d_v();
  const auto r = static_cast<double>(reduced_rank(params().get_float("rank_frac"), dk));
  double per_head = 2.0 * static_cast<double>(p.n_q()) * static_cast<double>(dk) * r;  // q·P_r
  for (index_t i = 0; i < p.n_q(); ++i) {
    const KeyRange kr = p.key_range(i);
    if (kr.empty()) continue;
    const auto n = static_cast<double>(kr.end - kr.begin);
    const double k = std::clamp(std::ceil(kfrac * n - 1e-9), 1.0, n);
    per_head += 2.0 * (r * n + k * static_cast<double>(dk + dv));  // reduced scores; exact part
  }
  // The bases per kv head: the running Gram sums Σ_{j<L} kⱼᵀkⱼ up to the largest L, and K·P_r of
  // the keys [0, E) of each basis.
  const BasisPlan bp = plan_bases(p, kRowBlock);
  double basis = bp.len.empty() ? 0 : 2.0 * static_cast<double>(bp.len.back() * dk * dk);
  for (index_t e : bp.end) basis += 2.0 * static_cast<double>(e * dk) * r;
  return static_cast<double>(p.batch()) * (static_cast<double>(p.heads()) * per_head + static_cast<double>(p.kv_heads()) * basis);
}

std::size_t LokiAttention::workspace_bytes(const AttentionProblem& p, const ExecContext& ctx) const {
  const auto d = static_cast<std::size_t>(p.d_qk()), nk = static_cast<std::size_t>(p.n_kv());
  const auto r = static_cast<std::size_t>(reduced_rank(params().get_float("rank_frac"), p.d_qk()));
  const auto kv = static_cast<std::size_t>(p.batch() * p.kv_heads());
  const auto nt = static_cast<std::size_t>(ctx.num_threads());
  const auto rb = static_cast<std::size_t>(kRowBlock);
  // Bases (P_r, K·P_r and its packed panels) and their float64 Gram matrices, the float64 keys of
  // the Gram sums being built, and per thread one head's scores and reduced queries, the group's
  // chosen keys and their logits, and one row's selection buffers.
  const BasisPlan bp = plan_bases(p, kRowBlock);
  std::size_t projected = 0;
  for (index_t e : bp.end) projected += static_cast<std::size_t>(e) * r + d * r + 16 * r + 2 * d * d;
  const auto g = static_cast<std::size_t>(p.group());
  return kv * 4 * projected + std::min(kv, nt) * 8 * (nk * d) +
         nt * 4 * (rb * (nk + 16 + r) + g * rb * (nk + 16) * 2 + 6 * (nk + 32));
}

void LokiAttention::forward(const AttentionProblem& p, const ExecContext& ctx) const {
  const double kfrac = params().get_float("topk_frac");
  const index_t nq = p.n_q(), dk = p.d_qk(), dv = p.d_v(), hkv = p.kv_heads();
  const index_t r = reduced_rank(params().get_float("rank_frac"), dk);
  const float scale = static_cast<float>(p.effective_scale());
  const BasisPlan bp = plan_bases(p, kRowBlock);
  const index_t nb = static_cast<index_t>(bp.len.size());
  std::vector<KvBasis> basis(static_cast<std::size_t>(p.batch() * hkv * nb));
  std::vector<std::vector<index_t>> bad(static_cast<std::size_t>(p.batch() * hkv));
  std::vector<std::vector<std::vector<double>>> grams(bad.size());
  parallel_for(ctx, static_cast<std::int64_t>(bad.size()), [&](std::int64_t t) {
    bad[static_cast<std::size_t>(t)] = nonfinite_keys(p, t / hkv, t % hkv);
    grams[static_cast<std::size_t>(t)] = prefix_grams(p, t / hkv, t % hkv, bp.len);
  });
  parallel_for(ctx, static_cast<std::int64_t>(basis.size()), [&](std::int64_t t) {
    const index_t bkv = t / nb, l = t % nb;
    basis[static_cast<std::size_t>(t)] = make_basis(p, bkv / hkv, bkv % hkv, r,
                                                    std::move(grams[static_cast<std::size_t>(bkv)][static_cast<std::size_t>(l)]),
                                                    bp.end[static_cast<std::size_t>(l)]);
  });
  // Tasks: (batch, kv head, block of rows), the group's query heads together, so that the keys
  // they gather are read once for all of them. Blocks in the order 0, last, 1, last − 1, ...:
  // causal blocks grow with their index, and parallel_for's static chunks get equal work.
  const index_t nblk = (nq + kRowBlock - 1) / kRowBlock, g = p.group(), nkv = p.batch() * hkv;
  std::vector<Scratch> scratch(static_cast<std::size_t>(ctx.num_threads()));
  parallel_for(ctx, nkv * nblk, [&](std::int64_t t) {
    const index_t z = t / nkv, bkv = t % nkv, b = bkv / hkv, hk = bkv % hkv;
    const index_t blk = z % 2 == 0 ? z / 2 : nblk - 1 - z / 2;
    const index_t i0 = blk * kRowBlock, i1 = std::min(nq, i0 + kRowBlock), rows = i1 - i0;
    const int l = bp.of_block[static_cast<std::size_t>(blk)];
    Scratch& w = scratch[worker_slot(scratch.size())];
    if (l < 0) {  // no row of the block sees a key
      for (index_t h = hk * g; h < (hk + 1) * g; ++h)
        for (index_t i = i0; i < i1; ++i) std::fill(p.out.row(b, h, i), p.out.row(b, h, i) + dv, 0.f);
      return;
    }
    const KvBasis& kb = basis[static_cast<std::size_t>(bkv * nb + l)];
    w.rows.assign(static_cast<std::size_t>(g * rows), blocks::ChosenRow{});
    w.kinds.assign(static_cast<std::size_t>(g * rows), RowKind::kEmpty);
    index_t cap = 0;
    for (index_t h = hk * g; h < (hk + 1) * g; ++h) {
      const BlockScores bs = block_scores(p, kb, b, h, i0, i1, w);
      const index_t span = bs.end - bs.begin;
      if (h == hk * g) {  // every head of the group has the same key span
        cap = key_capacity(std::max<index_t>(span, 0), kfrac);
        w.keys.resize(static_cast<std::size_t>(g * rows * cap));
      }
      for (index_t i = i0; i < i1; ++i) {
        const auto u = static_cast<std::size_t>((h - hk * g) * rows + (i - i0));
        blocks::ChosenRow& row = w.rows[u];
        row.q = p.q.row(b, h, i);
        row.out = p.out.row(b, h, i);
        row.keys = w.keys.data() + static_cast<index_t>(u) * cap;
        row.add = p.mask_row(b, h, i).additive;
        if (span > 0)
          w.kinds[u] = choose_row(p, bad[static_cast<std::size_t>(bkv)], b, h, i, w.s.data() + (i - i0) * bs.ld - bs.origin, kfrac, w,
                                  w.keys.data() + static_cast<index_t>(u) * cap, &row.n);
        if (w.kinds[u] != RowKind::kChosen) row.n = 0;
      }
    }
    // Exact softmax over each T_i: full-dimensional logits of the chosen keys, gathered.
    blocks::attend_chosen(w.rows.data(), g * rows, p.k.row(b, hk, 0), p.k.stride[2], p.v.row(b, hk, 0), p.v.stride[2],
                          dk, dv, scale, w.aw);
    for (index_t u = 0; u < g * rows; ++u)  // NaN for run() to settle
      if (w.kinds[static_cast<std::size_t>(u)] == RowKind::kNaN) {
        float* o = p.out.row(b, hk * g + u / rows, i0 + u % rows);
        std::fill(o, o + dv, kNaN);
      }
  });
}

std::vector<index_t> LokiAttention::chosen_keys(const AttentionProblem& p, index_t b, index_t h, index_t i) const {
  const index_t r = reduced_rank(params().get_float("rank_frac"), p.d_qk());
  const BasisPlan bp = plan_bases(p, kRowBlock);
  const int l = bp.of_block[static_cast<std::size_t>(i / kRowBlock)];
  if (l < 0) return {};
  const KvBasis kb = make_basis(p, b, h / p.group(), r,
                                prefix_grams(p, b, h / p.group(), bp.len)[static_cast<std::size_t>(l)],
                                bp.end[static_cast<std::size_t>(l)]);
  const std::vector<index_t> bad = nonfinite_keys(p, b, h / p.group());
  Scratch w;
  index_t cnt = 0;
  const BlockScores bs = block_scores(p, kb, b, h, i, i + 1, w);
  const index_t span = bs.end - bs.begin;
  std::vector<index_t> keys;
  const double kfrac = params().get_float("topk_frac");
  w.keys.resize(static_cast<std::size_t>(key_capacity(span, kfrac)));
  if (span > 0 && choose_row(p, bad, b, h, i, w.s.data() - bs.origin, kfrac, w, w.keys.data(), &cnt) == RowKind::kChosen)
    keys.assign(w.keys.begin(), w.keys.begin() + cnt);
  std::sort(keys.begin(), keys.end());
  return keys;
}

NUMATTN_DEFINE_METHOD(LokiAttention)

}  // namespace numattn
