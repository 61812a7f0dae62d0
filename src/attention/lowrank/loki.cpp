#include "attention/lowrank/loki.h"

#include <Eigen/Core>

#include <algorithm>
#include <bit>
#include <cstdint>
#include <cmath>
#include <functional>
#include <limits>
#include <vector>

#include "attention/method_def.h"
#include "numattn/core/blas.h"
#include "numattn/core/simd.h"
#include "numattn/decomp/dense.h"

namespace numattn {

namespace {

constexpr index_t kRowBlock = 64;
constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();
constexpr float kNegInf = -std::numeric_limits<float>::infinity();

index_t reduced_rank(double frac, index_t d) {
  return std::clamp<index_t>(static_cast<index_t>(std::ceil(frac * static_cast<double>(d) - 1e-9)), 1, std::max<index_t>(d, 1));
}

/// One (batch, kv head): the PCA basis and the keys in it.
struct KvBasis {
  index_t r = 0;
  std::vector<float> P;     ///< Dk × r, row-major: the leading eigenvectors of Σ kⱼᵀkⱼ
  std::vector<float> kr;    ///< Nk × r: K·P_r
  std::vector<index_t> bad; ///< keys whose k or v row is not finite
  /// With bad keys only: V with those rows zeroed. The P·V product runs over a block's whole key
  /// span, and a hidden key's non-finite value times its weight 0 would still be NaN.
  std::vector<float> vclean;
};

KvBasis make_basis(const AttentionProblem& p, index_t b, index_t hk, index_t r) {
  KvBasis kb;
  kb.r = r;
  const index_t nk = p.n_kv(), d = p.d_qk();
  std::vector<double> kf;  // the finite key rows, float64
  kf.reserve(static_cast<std::size_t>(nk * d));
  index_t rows = 0;
  for (index_t j = 0; j < nk; ++j) {
    const float* k = p.k.row(b, hk, j);
    const bool fin = simd::all_finite(k, d) && simd::all_finite(p.v.row(b, hk, j), p.d_v());
    if (!fin) {
      kb.bad.push_back(j);
      if (!simd::all_finite(k, d)) continue;
    }
    kf.insert(kf.end(), k, k + d);
    ++rows;
  }
  std::vector<double> C(static_cast<std::size_t>(d * d), 0.0);
  if (rows > 0)
    blas::dgemm(blas::Trans::kYes, blas::Trans::kNo, d, d, rows, 1.0, kf.data(), d, kf.data(), d, 0.0, C.data(), d);
  Eigen::Map<Eigen::Matrix<double, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>> Cm(C.data(), d, d);
  const decomp::dense::SymEig eig = decomp::dense::sym_eig(Cm);  // finite rows only: cannot fail
  NUMATTN_ASSERT(eig.info == decomp::dense::Info::kSuccess);
  // Eigenvalues ascend: the leading r eigenvectors are the last r columns, largest first.
  kb.P.resize(static_cast<std::size_t>(d * r));
  for (index_t c = 0; c < d; ++c)
    for (index_t t = 0; t < r; ++t)
      kb.P[static_cast<std::size_t>(c * r + t)] = static_cast<float>(eig.vectors(c, d - 1 - t));
  if (!kb.bad.empty()) {
    const index_t dv = p.d_v();
    kb.vclean.resize(static_cast<std::size_t>(nk * dv));
    for (index_t j = 0; j < nk; ++j) {
      const float* v = p.v.row(b, hk, j);
      const bool fin = simd::all_finite(v, dv);
      for (index_t c = 0; c < dv; ++c) kb.vclean[static_cast<std::size_t>(j * dv + c)] = fin ? v[c] : 0.f;
    }
  }
  kb.kr.resize(static_cast<std::size_t>(nk * r));
  if (nk > 0)
    blas::sgemm(blas::Trans::kNo, blas::Trans::kNo, nk, r, d, 1.f, p.k.row(b, hk, 0), p.k.stride[2], kb.P.data(), r,
                0.f, kb.kr.data(), r);
  return kb;
}

/// Whether row i sees key j (causal rule, window, boolean mask, additive −inf/NaN hide).
bool sees(const AttentionProblem& p, index_t i, index_t j) {
  if (!p.visible(i, j)) return false;
  if (p.mask.kind == MaskKind::kAdditive) return p.mask.additive[i * p.mask.ld + j] > kNegInf;
  return true;
}

/// Monotone map of a float to an unsigned key (larger float, larger key).
inline std::uint32_t order_key(float f) {
  const std::uint32_t u = std::bit_cast<std::uint32_t>(f);
  return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

/// The k-th largest of x (1 ≤ k ≤ x.size()): a radix pass over the top 11 bits of the order
/// keys finds the bin holding it, then nth_element over that bin only (a few elements instead of
/// Nk; selection is Loki's hot loop besides the exact part).
float kth_largest(const std::vector<float>& x, index_t k, std::vector<std::uint32_t>& hist, std::vector<float>& tmp) {
  constexpr int kShift = 21;
  hist.assign(std::size_t{1} << (32 - kShift), 0u);
  for (float f : x) ++hist[order_key(f) >> kShift];
  index_t above = 0;
  std::size_t bin = hist.size();
  while (bin-- > 0) {
    if (above + static_cast<index_t>(hist[bin]) >= k) break;
    above += hist[bin];
  }
  tmp.clear();
  for (float f : x)
    if ((order_key(f) >> kShift) == bin) tmp.push_back(f);
  const index_t need = k - above;  // the need-th largest inside the bin
  std::nth_element(tmp.begin(), tmp.begin() + (need - 1), tmp.end(), std::greater<float>());
  return tmp[static_cast<std::size_t>(need - 1)];
}

struct RowScratch {
  std::vector<std::uint32_t> hist;
  std::vector<float> qr, s, e, sel_scores, tmp, inv;
  std::vector<std::uint8_t> keep;
  std::vector<index_t> vis;
};

}  // namespace

const MethodInfo& LokiAttention::describe() {
  static const MethodInfo info = [] {
    MethodInfo m;
    m.name = "lowrank.loki";
    m.family = "lowrank";
    m.summary = "PCA-reduced scores choose the top-k keys per query; exact softmax over them";
    m.citation = "Singhania, Singh, He, Feizi, Bhatele, Loki: Low-rank Keys for Efficient Sparse Attention, NeurIPS 2024";
    m.time_complexity = "O(Nq·Nk·(Dk+Dv+r)) here (GEMM over the span, unchosen keys masked); Loki's gather form O(Nq·Nk·r + Nq·k·(Dk+Dv))";
    m.memory_complexity = "O(Nk·r) per kv head + O(threads·64·Nk)";
    m.params = {
        {"rank_frac", ParamType::kFloat, "0.25", 0.01, 1, {}, "fraction of Dk kept for the approximate scores (r = ceil(rank_frac·Dk))"},
        {"topk_frac", ParamType::kFloat, "0.25", 0.01, 1, {}, "fraction of each row's visible keys attended (k = ceil(topk_frac·visible)); 1 = exact"},
    };
    m.caps = {.exact = false, .causal = true, .gqa = true, .bool_mask = true, .additive_mask = true,
              .window = true, .lse = false, .decode = false};
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

std::size_t LokiAttention::workspace_bytes(const AttentionProblem& p, const ExecContext& ctx) const {
  const index_t d = p.d_qk(), nk = p.n_kv();
  const auto r = static_cast<std::size_t>(reduced_rank(params().get_float("rank_frac"), d));
  const auto kv = static_cast<std::size_t>(p.batch() * p.kv_heads());
  const auto nt = static_cast<std::size_t>(ctx.num_threads());
  return kv * 4 * (static_cast<std::size_t>(nk) * r + static_cast<std::size_t>(d) * r) +
         std::min(kv, nt) * 8 * static_cast<std::size_t>((nk + 2 * d) * d) +
         nt * (4 * static_cast<std::size_t>(kRowBlock + 3) * static_cast<std::size_t>(nk) + 8 * static_cast<std::size_t>(2 * nk));
}

void LokiAttention::forward(const AttentionProblem& p, const ExecContext& ctx) const {
  const double kfrac = params().get_float("topk_frac");
  const index_t nq = p.n_q(), nk = p.n_kv(), dk = p.d_qk(), dv = p.d_v(), hkv = p.kv_heads();
  const index_t r = reduced_rank(params().get_float("rank_frac"), dk);
  const float scale = static_cast<float>(p.effective_scale());
  std::vector<KvBasis> basis(static_cast<std::size_t>(p.batch() * hkv));
  parallel_for(ctx, static_cast<std::int64_t>(basis.size()), [&](std::int64_t t) {
    basis[static_cast<std::size_t>(t)] = make_basis(p, t / hkv, t % hkv, r);
  });
  const index_t nblk = (nq + kRowBlock - 1) / kRowBlock;
  std::vector<RowScratch> scratch(static_cast<std::size_t>(ctx.num_threads()));
  parallel_for(ctx, p.batch() * p.heads() * nblk, [&](std::int64_t t) {
    const index_t blk = t % nblk, bh = t / nblk, b = bh / p.heads(), h = bh % p.heads(), hk = h / p.group();
    const index_t i0 = blk * kRowBlock, i1 = std::min(nq, i0 + kRowBlock), rows = i1 - i0;
    const KvBasis& kb = basis[static_cast<std::size_t>(b * hkv + hk)];
    RowScratch& w = scratch[worker_slot(scratch.size())];
    // Keys any row of the block may see, and the approximate scores over them (one sgemm).
    index_t j0 = nk, j1 = 0;
    for (index_t i = i0; i < i1; ++i) {
      const KeyRange kr = p.key_range(i);
      if (kr.empty()) continue;
      j0 = std::min(j0, kr.begin);
      j1 = std::max(j1, kr.end);
    }
    const index_t span = std::max<index_t>(j1 - j0, 0);
    const auto sz = static_cast<std::size_t>(rows * std::max<index_t>(span, 1));
    w.qr.resize(static_cast<std::size_t>(rows * r));
    w.s.resize(sz);
    w.e.resize(sz);
    w.keep.resize(static_cast<std::size_t>(std::max<index_t>(span, 1)));
    w.inv.resize(static_cast<std::size_t>(rows));
    if (span > 0) {
      // Approximate logits in the PCA coordinates, and the exact logits of the block's key span.
      blas::sgemm(blas::Trans::kNo, blas::Trans::kNo, rows, r, dk, 1.f, p.q.row(b, h, i0), p.q.stride[2], kb.P.data(), r,
                  0.f, w.qr.data(), r);
      blas::sgemm(blas::Trans::kNo, blas::Trans::kYes, rows, span, r, scale, w.qr.data(), r,
                  kb.kr.data() + j0 * r, r, 0.f, w.s.data(), span);
      blas::sgemm(blas::Trans::kNo, blas::Trans::kYes, rows, span, dk, scale, p.q.row(b, h, i0), p.q.stride[2],
                  p.k.row(b, hk, j0), p.k.stride[2], 0.f, w.e.data(), span);
    }
    for (index_t i = i0; i < i1; ++i) {
      const float* q = p.q.row(b, h, i);
      const float* srow = w.s.data() + (i - i0) * span;
      float* erow = w.e.data() + (i - i0) * span;
      float& inv = w.inv[static_cast<std::size_t>(i - i0)];
      const KeyRange kr = p.key_range(i);
      // Visible keys and their selection scores (approximate logit + additive mask). Without a
      // mask they are the contiguous key range: no per-key test, no index list.
      const bool plain = p.mask.kind == MaskKind::kNone;
      w.vis.clear();
      w.sel_scores.clear();
      if (plain) {
        if (!kr.empty()) w.sel_scores.assign(srow + (kr.begin - j0), srow + (kr.end - j0));
      } else {
        for (index_t j = kr.begin; j < kr.end; ++j) {
          if (!sees(p, i, j)) continue;
          float sc = srow[j - j0];
          if (p.mask.kind == MaskKind::kAdditive) sc += p.mask.additive[i * p.mask.ld + j];
          w.vis.push_back(j);
          w.sel_scores.push_back(sc);
        }
      }
      const index_t nv = static_cast<index_t>(w.sel_scores.size());
      const auto key_at = [&](index_t u) { return plain ? kr.begin + u : w.vis[static_cast<std::size_t>(u)]; };
      // A non-finite value the row reads (q, or a key it sees) must reach its output.
      bool nan = nv > 0 && !simd::all_finite(q, dk);
      for (index_t j : kb.bad) nan |= sees(p, i, j);
      if (nv == 0 || nan) {  // no key: an empty row (0); NaN for run() to settle
        std::fill(erow, erow + span, 0.f);
        inv = nan ? kNaN : 0.f;
        continue;
      }
      // T_i: the k best selection scores (every key above the k-th, then ties in index order).
      const index_t k = std::clamp<index_t>(static_cast<index_t>(std::ceil(kfrac * static_cast<double>(nv) - 1e-9)), 1, nv);
      // Branch-free marking (a quarter of random keys is chosen: a branch would mispredict).
      std::uint8_t* keep = w.keep.data();
      const float* sel = w.sel_scores.data();
      std::fill(keep, keep + span, std::uint8_t{0});
      if (k >= nv) {
        for (index_t u = 0; u < nv; ++u) keep[key_at(u) - j0] = 1;
      } else {
        const float thr = kth_largest(w.sel_scores, k, w.hist, w.tmp);
        index_t above = 0;
        if (plain) {
          std::uint8_t* kk = keep + (kr.begin - j0);
          for (index_t u = 0; u < nv; ++u) kk[u] = sel[u] > thr;
        } else {
          for (index_t u = 0; u < nv; ++u) keep[w.vis[static_cast<std::size_t>(u)] - j0] = sel[u] > thr;
        }
        for (index_t u = 0; u < nv; ++u) above += sel[u] > thr;
        for (index_t u = 0, ties = k - above; u < nv && ties > 0; ++u)
          if (sel[u] == thr) {
            keep[key_at(u) - j0] = 1;
            --ties;
          }
      }
      // Exact softmax over T_i: the other keys of the span get weight 0.
      float m = kNegInf;
      bool finite = true;
      const float* add = p.mask.kind == MaskKind::kAdditive ? p.mask.additive + i * p.mask.ld + j0 : nullptr;
      for (index_t t = 0; t < span; ++t) {
        const float l = erow[t] + (add && keep[t] ? add[t] : 0.f);
        finite &= !keep[t] || std::isfinite(l);
        erow[t] = keep[t] ? l : kNegInf;
        m = std::max(m, erow[t]);
      }
      if (!finite) {  // an overflowing logit or a +inf mask entry: NaN, settled by run()
        std::fill(erow, erow + span, 0.f);
        inv = kNaN;
        continue;
      }
      for (index_t t = 0; t < span; ++t) erow[t] -= m;
      simd::exp_f32(erow, erow, span);
      float z = 0;
      for (index_t t = 0; t < span; ++t) z += erow[t];
      inv = 1.f / z;
    }
    float* o = p.out.row(b, h, i0);
    const index_t ldo = p.out.stride[2];
    const bool clean = !kb.vclean.empty();
    if (span > 0)
      blas::sgemm(blas::Trans::kNo, blas::Trans::kNo, rows, dv, span, 1.f, w.e.data(), span,
                  clean ? kb.vclean.data() + j0 * dv : p.v.row(b, hk, j0), clean ? dv : p.v.stride[2], 0.f, o, ldo);
    for (index_t u = 0; u < rows; ++u) {
      float* orow = o + u * ldo;
      const float f = w.inv[static_cast<std::size_t>(u)];
      if (span == 0 || f == 0.f) std::fill(orow, orow + dv, 0.f);
      else if (std::isnan(f)) std::fill(orow, orow + dv, kNaN);
      else
        for (index_t c = 0; c < dv; ++c) orow[c] *= f;
    }
  });
}

NUMATTN_DEFINE_METHOD(LokiAttention)

}  // namespace numattn
