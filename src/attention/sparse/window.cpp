#include "attention/sparse/window.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <limits>
#include <memory>
#include <optional>
#include <vector>

#include "attention/method_def.h"
#include "attention/sparse/kept_keys_budget.h"
#include "numattn/attention/blocks/dense_softmax.h"
#include "numattn/attention/blocks/lse_merge.h"
#include "numattn/core/blas.h"

namespace numattn {

namespace {

constexpr index_t kRowBlock = 256;
constexpr double kNegInf = -std::numeric_limits<double>::infinity();

/// The band and sink sizes in force on `p`: the method's band narrowed by the problem's own
/// window (-1 there = unbounded).
struct Band {
  index_t left, right, sinks;
};

Band band_of(const AttentionProblem& p, const ParamValues& pv) {
  Band b{pv.get_int("left"), pv.get_int("right"), std::min<index_t>(pv.get_int("sinks"), p.n_kv())};
  if (p.window_left >= 0) b.left = std::min(b.left, p.window_left);
  if (p.window_right >= 0) b.right = std::min(b.right, p.window_right);
  return b;
}

/// Whether row i has a sink key outside its band (only such rows need the sink pass).
bool needs_sinks(const AttentionProblem& p, const Band& bd, index_t i) {
  if (bd.sinks <= 0) return false;
  const index_t d = i + p.diag_offset();
  return d - bd.left > 0 || d + bd.right + 1 < bd.sinks;
}

/// Logit of key j for row (b, h, i) in float64, with the additive mask; nullopt when the mask
/// hides the key (−inf or NaN entry).
std::optional<double> logit(const AttentionProblem& p, index_t b, index_t h, index_t i, index_t j) {
  double a = 0;
  if (p.mask.kind == MaskKind::kAdditive) {
    a = p.mask_row(b, h, i).additive[j];
    if (!(a > kNegInf)) return std::nullopt;
  }
  const float* q = p.q.row(b, h, i);
  const float* k = p.k.row(b, h / p.group(), j);
  double dot = 0;
  for (index_t c = 0; c < p.d_qk(); ++c) dot += static_cast<double>(q[c]) * k[c];
  return p.effective_scale() * dot + a;
}

/// Softmax of row (b, h, i) over `keys` with float64 logits `s`, merged with a partial result
/// (normalised output `o`, log-normaliser `lw`: −inf when empty) by log-sum-exp; writes `o` and
/// `lse`. A non-finite logit (NaN, an infinite input, a +inf mask entry) makes the row NaN so
/// that run() settles it: dropping it like a hidden key would hide a refused input.
void softmax_merge(const AttentionProblem& p, index_t b, index_t h, const std::vector<index_t>& keys,
                   const std::vector<double>& s, double lw, float* o, float& lse, std::vector<double>& acc) {
  const index_t dv = p.d_v(), hk = h / p.group();
  bool bad = std::isnan(lw);
  double m = lw;
  for (double x : s) bad |= !std::isfinite(x), m = std::max(m, x);
  if (bad) {
    std::fill(o, o + dv, std::numeric_limits<float>::quiet_NaN());
    lse = std::numeric_limits<float>::quiet_NaN();
    return;
  }
  if (m == kNegInf) {  // nothing visible: the empty row of problem.h
    std::fill(o, o + dv, 0.f);
    lse = -std::numeric_limits<float>::infinity();
    return;
  }
  const double ww = lw == kNegInf ? 0.0 : std::exp(lw - m);
  double total = ww;
  acc.assign(static_cast<std::size_t>(dv), 0.0);
  if (ww > 0)
    for (index_t d = 0; d < dv; ++d) acc[static_cast<std::size_t>(d)] = ww * o[d];
  for (std::size_t c = 0; c < keys.size(); ++c) {
    const double w = std::exp(s[c] - m);
    total += w;
    const float* v = p.v.row(b, hk, keys[c]);
    // 0·inf is NaN: a non-finite value of an attended key reaches the row even at weight 0.
    for (index_t d = 0; d < dv; ++d) acc[static_cast<std::size_t>(d)] += w * v[d];
  }
  const double inv = 1.0 / total;  // total ≥ 1: the maximum's own weight
  for (index_t d = 0; d < dv; ++d) o[d] = static_cast<float>(acc[static_cast<std::size_t>(d)] * inv);
  lse = static_cast<float>(m + std::log(total));
}

/// Whether row (b, h, i)'s output (and LSE, when `p` has one) is finite.
bool row_finite(const AttentionProblem& p, index_t b, index_t h, index_t i) {
  if (!p.lse.empty() && std::isnan(p.lse(b, h, i, 0))) return false;
  const float* o = p.out.row(b, h, i);
  for (index_t e = 0; e < p.d_v(); ++e)
    if (!std::isfinite(o[e])) return false;
  return true;
}

struct RowScratch {
  std::vector<double> s, acc;
  std::vector<float> x, sl, os;
  std::vector<index_t> keys;
};

/// Merges the sink keys outside the band into row i's band result (normalised `o`, `lse`) in
/// float32, from the row's sink logits `sl[j] = scale·q_i·k_j` (j < sinks, one sgemm per row
/// block). A non-finite logit of an attended sink makes the row NaN; the caller then recomputes
/// it in float64 (exact_row_f64), which tells a refused input from a float32 overflow.
void merge_sinks(const AttentionProblem& p, const Band& bd, index_t b, index_t h, index_t i, const float* sl,
                 float* o, float& lse, RowScratch& w) {
  const index_t dv = p.d_v(), hk = h / p.group();
  const KeyRange kr = p.key_range(i);
  const index_t d = i + p.diag_offset();
  w.keys.clear();
  w.x.clear();
  bool bad = std::isnan(lse);
  float m = -std::numeric_limits<float>::infinity();
  const MaskRow mr = p.mask_row(b, h, i);
  for (index_t j = kr.begin; j < std::min(kr.end, bd.sinks); ++j) {
    if (j >= d - bd.left && j <= d + bd.right) continue;  // in the band: flash's
    if (mr.allowed && !mr.allowed[j]) continue;
    float x = sl[j];
    if (mr.additive) {
      const float a = mr.additive[j];
      if (!(a > -std::numeric_limits<float>::infinity())) continue;  // -inf or NaN hides the key
      x += a;
    }
    bad |= !std::isfinite(x);
    m = std::max(m, x);
    w.keys.push_back(j);
    w.x.push_back(x);
  }
  if (w.keys.empty()) return;
  if (bad) {
    std::fill(o, o + dv, std::numeric_limits<float>::quiet_NaN());
    lse = std::numeric_limits<float>::quiet_NaN();
    return;
  }
  // The sinks' own partial result (o_s, l_s), then the exact merge of the two disjoint key
  // sets through log-sum-exp (exact for disjoint supports; blocks::lse_merge).
  float total = 0;
  w.os.assign(static_cast<std::size_t>(dv), 0.f);
  for (std::size_t c = 0; c < w.keys.size(); ++c) {
    const float wt = std::exp(w.x[c] - m);  // m ≥ every sink logit
    total += wt;
    const float* v = p.v.row(b, hk, w.keys[c]);
    for (index_t e = 0; e < dv; ++e) w.os[static_cast<std::size_t>(e)] += wt * v[e];
  }
  const float inv = 1.f / total;
  for (float& x : w.os) x *= inv;
  double merged = lse;
  blocks::lse_merge_into(o, merged, w.os.data(), static_cast<double>(m) + std::log(static_cast<double>(total)), dv);
  lse = static_cast<float>(merged);
}

/// Row (b, h, i) over band ∪ sinks entirely in float64: for rows the float32 band pass left
/// non-finite. exact.flash leaves a row NaN for run() to settle in float64 when it meets an
/// infinite logit, also one of a key a boolean mask hides or one that overflowed float32;
/// run() does that only for exact methods. Here the row is recomputed over exactly the keys this
/// method attends to, so only a non-finite input the row reads stays NaN.
void exact_row_f64(const AttentionProblem& p, const Band& bd, index_t b, index_t h, index_t i, float& lse,
                   RowScratch& w) {
  w.s.clear();
  w.keys.clear();
  for (index_t j : WindowAttention::attended_keys(p, b, h, i, bd.left, bd.right, bd.sinks)) {
    const std::optional<double> x = logit(p, b, h, i, j);
    if (!x) continue;
    w.s.push_back(*x);
    w.keys.push_back(j);
  }
  softmax_merge(p, b, h, w.keys, w.s, kNegInf, p.out.row(b, h, i), lse, w.acc);
}

}  // namespace

const MethodInfo& WindowAttention::describe() {
  static const MethodInfo info = [] {
    MethodInfo m;
    m.name = "sparse.window";
    m.family = "sparse";
    m.summary =
        "sliding-window band plus attention sinks (first keys), exact softmax over them; "
        "exact.flash on the band (only its tiles), sinks merged by log-sum-exp";
    m.citation =
        "Beltagy, Peters, Cohan, Longformer, 2020; Xiao, Tian, Chen, Han, Lewis, Efficient Streaming "
        "Language Models with Attention Sinks (StreamingLLM), ICLR 2024";
    m.time_complexity = "O(Nq·(left+right+1+sinks)·(Dk+Dv)); causal O(Nq·(left+1+sinks)·(Dk+Dv))";
    m.memory_complexity = "exact.flash's workspace + Nq floats per query head (band LSE, with sinks)";
    m.params = {
        {"left", ParamType::kInt, "256", 0, 1e9, {}, "keys before the diagonal in the band"},
        {"right", ParamType::kInt, "256", 0, 1e9, {},
         "keys after the diagonal in the band (no effect under a causal rule)"},
        {"sinks", ParamType::kInt, "4", 0, 4096, {}, "first keys every row attends to (attention sinks)"},
    };
    m.caps = {.exact = false, .causal = true, .gqa = true, .bool_mask = true, .additive_mask = true,
              .window = true, .lse = true, .decode = true, .half_kv = true, .head_mask = true};
    AccuracyContract& a = m.accuracy;
    a.max_rel_fro_error = [](const BudgetInput& in) {
      const Band bd = band_of(in.problem, in.params);
      const AttentionProblem& p = in.problem;
      // Calibrated on the conformance matrix (see kept_keys_budget): measured errors are at most
      // 0.73 (window) and 0.62 (topk) times 1 + sqrt(n/c − 1), worst on the 2000-key decode row.
      return sparse_detail::kept_keys_budget(in, 1.5, 1.5, [&](index_t i, KeyRange r) {
        const index_t d = i + p.diag_offset();
        const index_t lo = std::max(r.begin, d - bd.left), hi = std::min(r.end, d + bd.right + 1);
        index_t c = std::max<index_t>(0, hi - lo);
        for (index_t j = r.begin; j < std::min(r.end, bd.sinks); ++j) c += j < lo || j >= hi;
        return c;
      });
    };
    a.limit_case = [](const AttentionProblem& p) {
      const std::string w = std::to_string(p.n_q() + p.n_kv());
      return ParamOverrides{{"left", w}, {"right", w}};
    };
    a.convergence.param = "left";
    a.convergence.values = [](const AttentionProblem& p) {
      const index_t n = p.n_q() + p.n_kv();
      return std::vector<std::string>{"0", std::to_string(n / 8), std::to_string(n / 2), std::to_string(n)};
    };
    a.samples = {{{"left", "3"}, {"right", "0"}, {"sinks", "2"}},
                 {{"left", "16"}, {"right", "0"}, {"sinks", "0"}},
                 {{"left", "7"}, {"right", "5"}, {"sinks", "9"}}};
    return m;
  }();
  return info;
}

std::vector<index_t> WindowAttention::attended_keys(const AttentionProblem& p, index_t i, index_t left,
                                                    index_t right, index_t sinks) {
  NUMATTN_ASSERT(p.mask.shared());
  return attended_keys(p, 0, 0, i, left, right, sinks);
}

std::vector<index_t> WindowAttention::attended_keys(const AttentionProblem& p, index_t b, index_t h, index_t i,
                                                    index_t left, index_t right, index_t sinks) {
  std::vector<index_t> keys;
  const index_t d = i + p.diag_offset();
  for (index_t j = 0; j < p.n_kv(); ++j) {
    const bool band = j >= d - left && j <= d + right;
    if ((band || j < sinks) && p.visible(b, h, i, j)) keys.push_back(j);
  }
  return keys;
}

index_t WindowAttention::keys_read(const AttentionProblem& p, index_t i) const {
  const Band bd = band_of(p, params());
  const KeyRange r = p.key_range(i);
  const index_t d = i + p.diag_offset();
  const index_t lo = std::max(r.begin, d - bd.left), hi = std::min(r.end, d + bd.right + 1);
  index_t c = std::max<index_t>(0, hi - lo);
  for (index_t j = r.begin; j < std::min(r.end, bd.sinks); ++j) c += j < lo || j >= hi;
  return c;
}

std::size_t WindowAttention::workspace_bytes(const AttentionProblem& p, const ExecContext& ctx) const {
  const Band bd = band_of(p, params());
  AttentionProblem sub = p;
  sub.window_left = bd.left;
  sub.window_right = bd.right;
  // Sink logits of a row block per thread, and the band's LSE when the caller wants none.
  std::size_t extra = sizeof(float) * static_cast<std::size_t>(ctx.num_threads() * kRowBlock * bd.sinks);
  if (bd.sinks > 0 && p.lse.empty())
    extra += sizeof(float) * static_cast<std::size_t>(p.batch() * p.heads() * p.n_q());
  return blocks::dense_softmax_workspace_bytes(sub, ctx.num_threads()) + extra;
}

void WindowAttention::forward(const AttentionProblem& p, const ExecContext& ctx) const {
  const Band bd = band_of(p, params());
  const index_t nq = p.n_q(), B = p.batch(), H = p.heads();
  bool any_sinks = false;
  for (index_t i = 0; i < nq && !any_sinks; ++i) any_sinks = needs_sinks(p, bd, i);

  // The band: flash with the window narrowed (it skips tiles outside it).
  AttentionProblem sub = p;
  sub.window_left = bd.left;
  sub.window_right = bd.right;
  std::vector<float> lse_tmp;
  if (any_sinks && p.lse.empty()) {
    lse_tmp.resize(static_cast<std::size_t>(B * H * nq));
    sub.lse = TensorView<float>(lse_tmp.data(), {B, H, nq, 1}, {H * nq, nq, 1, 1});
  }
  blocks::dense_softmax_attention(sub, ctx);

  // Half-precision K/V: flash reads the band in place; the sink pass reads a float32 copy of
  // the `sinks` first rows only (views of the problem's shape, strides over that copy), so a
  // decode step still reads nothing outside band ∪ sinks.
  AttentionProblem ps = p;
  std::vector<float> sink_k, sink_v;
  if (p.half_kv() && any_sinks) {
    const index_t Hk = p.kv_heads(), S = bd.sinks, dk = p.d_qk();
    sink_k.resize(static_cast<std::size_t>(B * Hk * S * dk));
    sink_v.resize(static_cast<std::size_t>(B * Hk * S * p.d_v()));
    for (index_t b = 0; b < B; ++b)
      for (index_t h = 0; h < Hk; ++h)
        for (index_t j = 0; j < S; ++j) {
          widen_row(p.k16_row(b, h, j), p.half.type, dk, sink_k.data() + ((b * Hk + h) * S + j) * dk);
          widen_row(p.v16_row(b, h, j), p.half.type, p.d_v(), sink_v.data() + ((b * Hk + h) * S + j) * p.d_v());
        }
    ps.k = TensorView<const float>(sink_k.data(), p.k.shape, {Hk * S * dk, S * dk, dk, 1});
    ps.v = TensorView<const float>(sink_v.data(), p.v.shape, {Hk * S * p.d_v(), S * p.d_v(), p.d_v(), 1});
    ps.half = HalfKv{};
  }
  std::atomic<bool> widen_rows{false};  // half K/V: rows to recompute on a float32 copy

  // Per row: the sinks outside the band (at most `sinks` keys) merged into the band's result;
  // then rows left non-finite recomputed in float64 (see exact_row_f64). The scan is O(Nq·Dv)
  // per head, as run()'s own check.
  const index_t nblk = (nq + kRowBlock - 1) / kRowBlock;
  const float scale = static_cast<float>(p.effective_scale());
  parallel_for(ctx, B * H * nblk, [&](std::int64_t t) {
    const index_t blk = t % nblk, bh = t / nblk, b = bh / H, h = bh % H;
    const index_t i0 = blk * kRowBlock, i1 = std::min(nq, i0 + kRowBlock);
    RowScratch w;
    // Sink logits of the block's rows: one (rows × sinks) sgemm, when some row needs them.
    bool block_sinks = false;
    for (index_t i = i0; i < i1 && !block_sinks; ++i) block_sinks = needs_sinks(p, bd, i);
    if (block_sinks) {
      w.sl.resize(static_cast<std::size_t>((i1 - i0) * bd.sinks));
      blas::sgemm(blas::Trans::kNo, blas::Trans::kYes, i1 - i0, bd.sinks, p.d_qk(), scale, p.q.row(b, h, i0),
                  p.q.stride[2], ps.k.row(b, h / p.group(), 0), ps.k.stride[2], 0.f, w.sl.data(), bd.sinks);
    }
    float dummy = 0;
    for (index_t i = i0; i < i1; ++i) {
      float& lse = sub.lse.empty() ? dummy : sub.lse(b, h, i, 0);
      float* o = p.out.row(b, h, i);
      if (block_sinks && needs_sinks(p, bd, i))
        merge_sinks(ps, bd, b, h, i, w.sl.data() + (i - i0) * bd.sinks, o, lse, w);
      if (row_finite(sub, b, h, i)) continue;
      if (p.half_kv()) widen_rows = true;
      else exact_row_f64(p, bd, b, h, i, lse, w);
    }
  });
  if (!widen_rows) return;
  const WidenedKv wide = widen_kv(p);
  RowScratch w;
  float dummy = 0;
  for (index_t b = 0; b < B; ++b)
    for (index_t h = 0; h < H; ++h)
      for (index_t i = 0; i < nq; ++i)
        if (!row_finite(sub, b, h, i))
          exact_row_f64(wide.problem, bd, b, h, i, sub.lse.empty() ? dummy : sub.lse(b, h, i, 0), w);
}

NUMATTN_DEFINE_METHOD(WindowAttention)

}  // namespace numattn
