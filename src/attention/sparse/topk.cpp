#include "attention/sparse/topk.h"

#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>
#include <vector>

#include "attention/blocks/select_gather.h"
#include "attention/method_def.h"
#include "attention/sparse/kept_keys_budget.h"
#include "numattn/attention/blocks/dense_softmax.h"
#include "numattn/core/blas.h"
#include "numattn/core/simd.h"

namespace numattn {

namespace {

constexpr index_t kRowBlock = 64;  // query rows per task of the exact selection
constexpr float kNegInf = -std::numeric_limits<float>::infinity();
constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();

// ---------------------------------------------------------------------------------------------
// select=exact: every visible logit by one sgemm per block, exact top-k per row.

struct Scratch {
  std::vector<float> s;                  ///< rows × span logits
  std::vector<float> w;                  ///< chosen weights
  std::vector<std::int32_t> sel;         ///< chosen keys, row after row (`cap` each), increasing
  std::vector<index_t> count;            ///< chosen keys per row
  std::vector<std::uint8_t> bad;         ///< row saw a non-finite logit
  index_t cap = 0;
  blocks::SelectScratch sw;
};

/// Logits of rows [i0, i1) of (b, h) over their visible key span and each row's top-k keys
/// (ws.sel + r·ws.cap, ws.count[r] of them; ws.bad[r] when a visible logit is not finite).
/// Returns the span start.
index_t select_block(const AttentionProblem& p, index_t b, index_t h, index_t i0, index_t i1, index_t k,
                     Scratch& ws) {
  const index_t rows = i1 - i0, hk = h / p.group(), dk = p.d_qk();
  index_t j0 = p.n_kv(), j1 = 0;
  for (index_t i = i0; i < i1; ++i) {
    const KeyRange kr = p.key_range(i);
    if (kr.empty()) continue;
    j0 = std::min(j0, kr.begin);
    j1 = std::max(j1, kr.end);
  }
  ws.count.assign(static_cast<std::size_t>(rows), 0);
  ws.bad.assign(static_cast<std::size_t>(rows), 0);
  if (j0 >= j1) return 0;
  const index_t span = j1 - j0;
  ws.cap = std::min(k, span) + 16;
  ws.sel.resize(static_cast<std::size_t>(rows * ws.cap));
  ws.s.resize(static_cast<std::size_t>(rows * span));
  blas::sgemm(blas::Trans::kNo, blas::Trans::kYes, rows, span, dk, static_cast<float>(p.effective_scale()),
              p.q.row(b, h, i0), p.q.stride[2], p.k.row(b, hk, j0), p.k.stride[2], 0.f, ws.s.data(), span);
  for (index_t r = 0; r < rows; ++r) {
    const index_t i = i0 + r;
    float* s = ws.s.data() + r * span - j0;  // s[j], j in [j0, j1)
    const KeyRange kr = p.key_range(i);
    if (kr.empty()) continue;
    // Hidden keys become -inf; a visible key's logit that is not finite (NaN or ±inf input,
    // +inf mask, float32 overflow) flags the row so that it comes out NaN and run() settles it.
    bool finite = true;
    if (p.mask.kind == MaskKind::kNone) {
      finite = simd::all_finite(s + kr.begin, kr.end - kr.begin);
    } else {
      const MaskRow m = p.mask_row(b, h, i);
      for (index_t j = kr.begin; j < kr.end; ++j) {
        if (m.allowed && !m.allowed[j]) {
          s[j] = kNegInf;
          continue;
        }
        if (m.additive) {
          const float a = m.additive[j];
          if (!(a > kNegInf)) {
            s[j] = kNegInf;
            continue;
          }
          s[j] += a;
        }
        finite &= std::isfinite(s[j]);
      }
    }
    if (!finite) {
      ws.bad[static_cast<std::size_t>(r)] = 1;
      continue;
    }
    // The k largest visible logits (ties: lower index), increasing.
    ws.count[static_cast<std::size_t>(r)] =
        blocks::select_top(s + kr.begin, kr.end - kr.begin, k, static_cast<std::int32_t>(kr.begin),
                           ws.sel.data() + r * ws.cap, ws.sw);
  }
  return j0;
}

void forward_exact(const AttentionProblem& p, const ExecContext& ctx, index_t k) {
  const index_t nq = p.n_q(), dv = p.d_v(), H = p.heads();
  const index_t nblk = (nq + kRowBlock - 1) / kRowBlock;
  std::vector<Scratch> scratch(static_cast<std::size_t>(ctx.num_threads()));
  parallel_for(ctx, p.batch() * H * nblk, [&](std::int64_t t) {
    const index_t blk = t % nblk, bh = t / nblk, b = bh / H, h = bh % H, hk = h / p.group();
    const index_t i0 = blk * kRowBlock, i1 = std::min(nq, i0 + kRowBlock);
    // Inside an outer parallel_for this runs serially on the outer worker, whose index may
    // exceed this context's thread count; only one thread then uses this call's scratch.
    Scratch& ws = scratch[worker_slot(scratch.size())];
    const index_t j0 = select_block(p, b, h, i0, i1, k, ws);
    const index_t span = ws.s.empty() ? 0 : static_cast<index_t>(ws.s.size()) / (i1 - i0);
    for (index_t i = i0; i < i1; ++i) {
      const auto r = static_cast<std::size_t>(i - i0);
      float* o = p.out.row(b, h, i);
      float lse = kNegInf;
      const index_t n = ws.count[r];
      const std::int32_t* sel = ws.sel.data() + static_cast<index_t>(r) * ws.cap;
      if (ws.bad[r]) {
        std::fill(o, o + dv, kNaN);
        lse = kNaN;
      } else if (n == 0) {
        std::fill(o, o + dv, 0.f);
      } else {
        // The chosen keys' logits are already computed: softmax over them, gathered values.
        const float* s = ws.s.data() + static_cast<index_t>(r) * span - j0;
        ws.w.resize(static_cast<std::size_t>(n));
        for (index_t c = 0; c < n; ++c) ws.w[static_cast<std::size_t>(c)] = s[sel[c]];
        lse = blocks::softmax_gather_values(ws.w.data(), n, p.v.row(b, hk, 0), p.v.stride[2], dv, sel, o);
      }
      if (!p.lse.empty()) p.lse(b, h, i, 0) = lse;
    }
  });
}

// ---------------------------------------------------------------------------------------------
// select=block: one choice of keys per block of query rows and GQA group (see topk.h).

struct BlockParams {
  index_t k, block, local, samples;
  double mass;  ///< 0: k far keys; > 0: the fewest far keys (at most k) leaving at most this mass uncovered
};

/// Per (batch, kv head): its keys packed in panels of 16 for the sampled rows' logits
/// (blocks::pack_key_panels, once per call rather than per block), and the keys whose k or v row
/// is not finite. One parallel loop over chunks of keys.
struct KvPrep {
  index_t panel = 0;  ///< floats per kv head in kt
  std::vector<float> kt;
  std::vector<std::vector<index_t>> bad;
};

KvPrep prepare_kv(const AttentionProblem& p, const ExecContext& ctx) {
  constexpr index_t kChunk = 1024;  // keys per task (a multiple of 16)
  const index_t nk = p.n_kv(), dk = p.d_qk(), hkv = p.kv_heads(), nkv = p.batch() * hkv;
  const index_t nchunk = std::max<index_t>((nk + kChunk - 1) / kChunk, 1);
  KvPrep kp;
  kp.panel = 16 * ((nk + 15) / 16) * dk;
  kp.kt.resize(static_cast<std::size_t>(nkv * kp.panel));
  std::vector<std::vector<index_t>> bad(static_cast<std::size_t>(nkv * nchunk));
  parallel_for(ctx, nkv * nchunk, [&](std::int64_t t) {
    const index_t bkv = t / nchunk, c = t % nchunk, b = bkv / hkv, hk = bkv % hkv;
    const index_t j0 = c * kChunk, j1 = std::min(nk, j0 + kChunk);
    if (j0 >= j1) return;
    blocks::pack_key_panels(p.k.row(b, hk, j0), p.k.stride[2], j1 - j0, dk, kp.kt.data() + bkv * kp.panel + j0 * dk);
    for (index_t j = j0; j < j1; ++j)
      if (!simd::all_finite(p.k.row(b, hk, j), dk) || !simd::all_finite(p.v.row(b, hk, j), p.d_v()))
        bad[static_cast<std::size_t>(t)].push_back(j);
  });
  kp.bad.resize(static_cast<std::size_t>(nkv));
  for (index_t t = 0; t < nkv * nchunk; ++t)
    kp.bad[static_cast<std::size_t>(t / nchunk)].insert(kp.bad[static_cast<std::size_t>(t / nchunk)].end(),
                                                        bad[static_cast<std::size_t>(t)].begin(), bad[static_cast<std::size_t>(t)].end());
  return kp;
}

/// Whether row i of (b, query head h) sees key j (causal rule, window, boolean mask, additive
/// −inf/NaN hide).
bool sees(const AttentionProblem& p, index_t b, index_t h, index_t i, index_t j) {
  if (!p.visible(b, h, i, j)) return false;
  if (p.mask.kind == MaskKind::kAdditive) return p.mask_row(b, h, i).additive[j] > kNegInf;
  return true;
}

struct BlockScratch {
  std::vector<float> qs, s, a, kcat, vcat;
  std::vector<std::int32_t> far, keys, order;
  std::vector<index_t> samp;  ///< sampled rows, as h·Nq + i
  std::vector<blocks::ChosenRow> rows;
  std::vector<std::uint8_t> nan_row;
  blocks::SelectScratch sw;
  blocks::AttendScratch aw;
};

/// Where a block's keys lie: far keys [begin, near) compete for the k slots, near keys
/// [near, end) are attended by every row that sees them.
struct BlockKeys {
  index_t begin = 0, near = 0, end = 0;
  index_t shared = 0;  ///< keys [begin, shared) precede every row of a causal block (the smallest row end)
  bool any = false;    ///< some row of the block sees a key
  bool dense = false;  ///< no mask or window, every row sees [begin, its end), the ends step by 1 or
                       ///< are all equal: the block is one dense causal (or full) sub-problem
};

BlockKeys block_keys(const AttentionProblem& p, index_t i0, index_t i1, index_t local) {
  BlockKeys bk;
  index_t emin = p.n_kv();
  bk.begin = p.n_kv();
  bool empty_row = false;
  for (index_t i = i0; i < i1; ++i) {
    const KeyRange kr = p.key_range(i);
    if (kr.empty()) {
      empty_row = true;
      continue;
    }
    bk.any = true;
    bk.begin = std::min(bk.begin, kr.begin);
    bk.end = std::max(bk.end, kr.end);
    emin = std::min(emin, kr.end);
  }
  if (!bk.any) return bk;
  bk.shared = emin;
  bk.near = std::clamp(emin - local, bk.begin, emin);
  bool dense = !empty_row && p.mask.kind == MaskKind::kNone && p.window_left < 0 && p.window_right < 0;
  for (index_t i = i0; i < i1 && dense; ++i) {
    const KeyRange kr = p.key_range(i);
    const bool stepping = kr.end == bk.end - (i1 - 1 - i), full = kr.end == bk.end;
    dense = kr.begin == bk.begin && (p.causal == Causal::kNone ? full : stepping);
  }
  bk.dense = dense;
  return bk;
}

/// The block's far keys (w.far, increasing). mass = 0: the k of largest estimated attention
/// mass a_j = Σ_{sampled rows i} softmax_i(j) over the far keys, sampled rows = `samples` rows
/// evenly spread over the block in each head of the group. mass = ε > 0 (top-p): a_j from each
/// sampled row's softmax over the far keys and the near keys before the block's first row end
/// (keys that precede every row of a causal block, so that no row's choice reads its future), so that
/// (1/m)·Σ_{j not kept} a_j estimates the mass the rows lose; the far keys in decreasing a_j
/// (ties: lower index), the fewest whose loss is at most ε, at most k. All far keys when there
/// are at most k. `kt`: the kv head's keys packed in panels (blocks::pack_key_panels).
index_t choose_far(const AttentionProblem& p, index_t b, index_t hk, index_t i0, index_t i1, const BlockKeys& bk,
                   const BlockParams& prm, const float* kt, BlockScratch& w) {
  const index_t nfar = bk.near - bk.begin, dk = p.d_qk(), g = p.group(), rows = i1 - i0;
  w.far.resize(static_cast<std::size_t>(std::min(prm.k, nfar) + 16));
  if (nfar <= prm.k) {
    for (index_t j = 0; j < nfar; ++j) w.far[static_cast<std::size_t>(j)] = static_cast<std::int32_t>(bk.begin + j);
    return nfar;
  }
  // The sampled rows (distinct, finite q, seeing a key), gathered.
  std::vector<index_t>& sr = w.samp;
  sr.clear();
  const index_t ns = std::min(prm.samples, rows);
  for (index_t h = hk * g; h < (hk + 1) * g; ++h)
    for (index_t t = 0; t < ns; ++t) {
      const index_t i = i0 + (ns == 1 ? rows / 2 : (t * (rows - 1) + (ns - 1) / 2) / (ns - 1));
      if (p.key_range(i).empty() || !simd::all_finite(p.q.row(b, h, i), dk)) continue;
      sr.push_back(h * p.n_q() + i);
    }
  const auto m = static_cast<index_t>(sr.size());
  w.qs.resize(static_cast<std::size_t>(std::max<index_t>(m, 1) * dk));
  for (index_t u = 0; u < m; ++u) {
    const index_t h = sr[static_cast<std::size_t>(u)] / p.n_q(), i = sr[static_cast<std::size_t>(u)] % p.n_q();
    std::copy(p.q.row(b, h, i), p.q.row(b, h, i) + dk, w.qs.data() + u * dk);
  }
  // Their logits over the panels that hold the keys they normalise over (kt: the kv head's
  // packed keys): the far keys, and with mass > 0 the near keys before the block too.
  const bool top_p = prm.mass > 0;
  const index_t send = top_p ? bk.shared : bk.near;  // keys [begin, send) enter each row's softmax
  const index_t pb = bk.begin / 16, pe = (send + 15) / 16, lds = 16 * (pe - pb);
  w.s.resize(static_cast<std::size_t>(std::max<index_t>(m, 1) * lds));
  w.a.assign(static_cast<std::size_t>(nfar), 0.f);
  blocks::panel_scores(w.qs.data(), dk, m, dk, kt + pb * 16 * dk, pe - pb, static_cast<float>(p.effective_scale()),
                       w.s.data(), lds);
  index_t counted = 0;  // sampled rows whose softmax entered a
  for (index_t u = 0; u < m; ++u) {
    const index_t h = sr[static_cast<std::size_t>(u)] / p.n_q(), i = sr[static_cast<std::size_t>(u)] % p.n_q();
    float* s = w.s.data() + u * lds - 16 * pb;  // s[j]
    if (!bk.dense) {
      for (index_t j = bk.begin; j < send; ++j) {
        if (!sees(p, b, h, i, j)) s[j] = kNegInf;
        else if (p.mask.kind == MaskKind::kAdditive) s[j] += p.mask_row(b, h, i).additive[j];
      }
    }
    const index_t ns_keys = send - bk.begin;
    const float mx = simd::max_f32(s + bk.begin, ns_keys);
    if (!(std::abs(mx) < std::numeric_limits<float>::infinity())) continue;  // sees no key, or a NaN one
    const double z = simd::exp_shift(s + bk.begin, ns_keys, -mx);
    const auto inv = static_cast<float>(1 / z);
    float* a = w.a.data();
    const float* e = s + bk.begin;
    for (index_t j = 0; j < nfar; ++j) a[j] += e[j] * inv;
    ++counted;
  }
  const index_t nk = blocks::select_top(w.a.data(), nfar, prm.k, static_cast<std::int32_t>(bk.begin), w.far.data(), w.sw);
  if (!top_p || counted == 0) return nk;
  // Top-p: drop the lightest of the k while the estimated loss stays at most ε.
  double lost = 0;
  for (index_t j = 0; j < nfar; ++j) lost += w.a[static_cast<std::size_t>(j)];
  w.order.resize(static_cast<std::size_t>(nk));
  for (index_t c = 0; c < nk; ++c) {
    const std::int32_t j = w.far[static_cast<std::size_t>(c)];
    lost -= w.a[static_cast<std::size_t>(j - bk.begin)];
    w.order[static_cast<std::size_t>(c)] = j;
  }
  const double budget = prm.mass * static_cast<double>(counted);
  std::sort(w.order.begin(), w.order.end(), [&](std::int32_t x, std::int32_t y) {
    const float ax = w.a[static_cast<std::size_t>(x - bk.begin)], ay = w.a[static_cast<std::size_t>(y - bk.begin)];
    return ax < ay || (ax == ay && x > y);  // lightest first; ties: higher index first
  });
  index_t drop = 0;
  while (drop < nk && lost + w.a[static_cast<std::size_t>(w.order[static_cast<std::size_t>(drop)] - bk.begin)] <= budget)
    lost += w.a[static_cast<std::size_t>(w.order[static_cast<std::size_t>(drop++)] - bk.begin)];
  std::sort(w.order.begin() + drop, w.order.end());
  std::copy(w.order.begin() + drop, w.order.end(), w.far.begin());
  return nk - drop;
}

void forward_block(const AttentionProblem& p, const ExecContext& ctx, const BlockParams& prm) {
  const index_t nq = p.n_q(), dk = p.d_qk(), dv = p.d_v(), g = p.group(), hkv = p.kv_heads();
  const index_t nblk = (nq + prm.block - 1) / prm.block;
  const KvPrep kp = prepare_kv(p, ctx);
  const float scale = static_cast<float>(p.effective_scale());
  const index_t nkv = p.batch() * hkv;
  std::vector<BlockScratch> scratch(static_cast<std::size_t>(ctx.num_threads()));
  parallel_for(ctx, nkv * nblk, [&](std::int64_t t) {
    // Blocks in the order 0, last, 1, last − 1, ...: causal blocks grow with their index, and
    // the static chunks of parallel_for then get equal shares of work.
    const index_t z = t / nkv, bkv = t % nkv, b = bkv / hkv, hk = bkv % hkv;
    const index_t blk = z % 2 == 0 ? z / 2 : nblk - 1 - z / 2;
    const index_t i0 = blk * prm.block, i1 = std::min(nq, i0 + prm.block), rows = i1 - i0;
    BlockScratch& w = scratch[worker_slot(scratch.size())];
    const BlockKeys bk = block_keys(p, i0, i1, prm.local);
    const std::vector<index_t>& badk = kp.bad[static_cast<std::size_t>(bkv)];
    // A row that sees a non-finite k or v row reads it: NaN, for run() to settle.
    // So does a dense row (it sees keys) whose q row is not finite.
    w.nan_row.assign(static_cast<std::size_t>(g * rows), 0);
    for (index_t u = 0; u < g * rows; ++u) {
      const index_t h = hk * g + u / rows, i = i0 + u % rows;
      std::uint8_t& nan = w.nan_row[static_cast<std::size_t>(u)];
      if (bk.dense) nan = !simd::all_finite(p.q.row(b, h, i), dk);
      for (index_t j : badk)
        if (!nan && sees(p, b, h, i, j)) nan = 1;
    }
    if (!bk.any) {
      for (index_t h = hk * g; h < (hk + 1) * g; ++h)
        for (index_t i = i0; i < i1; ++i) {
          std::fill(p.out.row(b, h, i), p.out.row(b, h, i) + dv, 0.f);
          if (!p.lse.empty()) p.lse(b, h, i, 0) = kNegInf;
        }
      return;
    }
    const index_t nf = choose_far(p, b, hk, i0, i1, bk, prm, kp.kt.data() + bkv * kp.panel, w);
    const index_t nnear = bk.end - bk.near, nk = nf + nnear;
    if (bk.dense) {
      // One dense sub-problem: the group's rows over [chosen far keys | near keys], causal
      // bottom-right (row i sees every far key and the near keys up to its own end), run by
      // the exact.flash kernel.
      w.kcat.resize(static_cast<std::size_t>(nk * dk));
      w.vcat.resize(static_cast<std::size_t>(nk * dv));
      w.far.resize(static_cast<std::size_t>(nk));
      for (index_t c = nf; c < nk; ++c) w.far[static_cast<std::size_t>(c)] = static_cast<std::int32_t>(bk.near + (c - nf));
      blocks::gather_rows(p.k.row(b, hk, 0), p.k.stride[2], w.far.data(), nk, dk, w.kcat.data());
      blocks::gather_rows(p.v.row(b, hk, 0), p.v.stride[2], w.far.data(), nk, dv, w.vcat.data());
      AttentionProblem sub;
      sub.q = TensorView<const float>(p.q.row(b, hk * g, i0), {1, g, rows, dk}, {0, p.q.stride[1], p.q.stride[2], 1});
      sub.k = TensorView<const float>::contiguous(w.kcat.data(), {1, 1, nk, dk});
      sub.v = TensorView<const float>::contiguous(w.vcat.data(), {1, 1, nk, dv});
      sub.out = TensorView<float>(p.out.row(b, hk * g, i0), {1, g, rows, dv}, {0, p.out.stride[1], p.out.stride[2], 1});
      if (!p.lse.empty())
        sub.lse = TensorView<float>(p.lse.row(b, hk * g, i0), {1, g, rows, 1}, {0, p.lse.stride[1], p.lse.stride[2], 1});
      sub.scale = p.effective_scale();
      sub.causal = p.causal == Causal::kNone ? Causal::kNone : Causal::kBottomRight;
      blocks::dense_softmax_attention(sub, ExecContext{1});
    } else {
      // Any other shape: each row attends to the chosen far keys and the near keys it sees.
      const index_t cap = nk;
      w.keys.resize(static_cast<std::size_t>(g * rows * std::max<index_t>(cap, 1)));
      w.rows.assign(static_cast<std::size_t>(g * rows), blocks::ChosenRow{});
      for (index_t u = 0; u < g * rows; ++u) {
        const index_t h = hk * g + u / rows, i = i0 + u % rows;
        blocks::ChosenRow& row = w.rows[static_cast<std::size_t>(u)];
        std::int32_t* keys = w.keys.data() + u * cap;
        row.q = p.q.row(b, h, i);
        row.out = p.out.row(b, h, i);
        row.lse = p.lse.empty() ? nullptr : &p.lse(b, h, i, 0);
        row.keys = keys;
        row.add = p.mask_row(b, h, i).additive;
        if (p.key_range(i).empty()) continue;
        for (index_t c = 0; c < nf; ++c)
          if (sees(p, b, h, i, w.far[static_cast<std::size_t>(c)])) keys[row.n++] = w.far[static_cast<std::size_t>(c)];
        for (index_t j = bk.near; j < bk.end; ++j)
          if (sees(p, b, h, i, j)) keys[row.n++] = static_cast<std::int32_t>(j);
        if (!simd::all_finite(row.q, dk)) w.nan_row[static_cast<std::size_t>(u)] = row.n > 0;
      }
      blocks::attend_chosen(w.rows.data(), g * rows, p.k.row(b, hk, 0), p.k.stride[2], p.v.row(b, hk, 0), p.v.stride[2],
                            dk, dv, scale, w.aw);
    }
    for (index_t u = 0; u < g * rows; ++u)
      if (w.nan_row[static_cast<std::size_t>(u)]) {
        const index_t h = hk * g + u / rows, i = i0 + u % rows;
        std::fill(p.out.row(b, h, i), p.out.row(b, h, i) + dv, kNaN);
        if (!p.lse.empty()) p.lse(b, h, i, 0) = kNaN;
      }
  });
}

BlockParams block_params(const ParamValues& v) {
  return {v.get_int("k"), v.get_int("block"), v.get_int("local"), v.get_int("samples"), v.get_float("mass")};
}

}  // namespace

const MethodInfo& TopkAttention::describe() {
  static const MethodInfo info = [] {
    MethodInfo m;
    m.name = "sparse.topk";
    m.family = "sparse";
    m.summary = "top-k keys per query, exact softmax over them: chosen by every exact logit (select=exact) or per block of rows by sampled rows' attention (select=block)";
    m.citation = "Gupta, Dar, Goodman, Ciprut, Berant, Memory-efficient Transformers via Top-k Attention, 2021; select=block: the vertical-slash pattern of Jiang et al., MInference 1.0, NeurIPS 2024";
    m.time_complexity = "exact: O(Nq·Nk·Dk + Nq·Nk + Nq·k·Dv); block: O((samples·Hq/block)·Nq·Nk·Dk + Nq·(k + local + block)·(Dk+Dv)); about half with causal";
    m.memory_complexity = "exact: O(threads·64·Nk); block: O(threads·(samples·Hq/Hkv + 1)·Nk + threads·(k + local + block)·(Dk+Dv))";
    m.params = {
        {"k", ParamType::kInt, "64", 1, 1e9, {}, "keys attended per query row (exact: ties to the lower index; block: far keys per block of rows)"},
        {"select", ParamType::kString, "exact", 0, 0, {"exact", "block"}, "how the keys are chosen: exact = each row's k largest logits (all logits computed); block = per block of rows and GQA group, the k far keys of largest attention mass among sampled rows, plus the local keys"},
        {"block", ParamType::kInt, "64", 1, 1e9, {}, "select=block: query rows sharing one choice of keys"},
        {"local", ParamType::kInt, "64", 0, 1e9, {}, "select=block: the last keys before a block's first row that every row of the block attends (with the block's own diagonal keys)"},
        {"samples", ParamType::kInt, "4", 1, 1e9, {}, "select=block: rows per query head whose exact softmax over the far keys estimates their attention mass"},
        {"mass", ParamType::kFloat, "0", 0, 1, {}, "select=block: 0 = keep k far keys; > 0 = top-p: the fewest far keys (at most k, in decreasing estimated mass) whose dropped mass, estimated as the sampled rows' mean softmax mass over the keys before the block's first row (far and local), is at most this fraction"},
    };
    m.caps = {.exact = false, .causal = true, .gqa = true, .bool_mask = true, .additive_mask = true,
              .window = true, .lse = true, .decode = false, .head_mask = true};
    AccuracyContract& a = m.accuracy;
    a.max_rel_fro_error = [](const BudgetInput& in) {
      const index_t k = in.params.get_int("k");
      if (in.params.get_string("select") == "block") {
        // Each row keeps the block's far keys and the near keys it sees: at least k + local + 1 of
        // its visible keys, or all. The choice is the block's, not the row's, so a row can miss
        // its own heaviest keys: a wider envelope than the exact choice (calibrated on the
        // conformance matrix with a margin of 2).
        // With mass > 0 the far keys kept can be none: only the local ones are sure.
        const index_t kept = (in.params.get_float("mass") > 0 ? 0 : k) + in.params.get_int("local") + 1;
        return sparse_detail::kept_keys_budget(in, 2.0, 2.0, [&](index_t, KeyRange) { return kept; });
      }
      // Calibrated on the conformance matrix (see kept_keys_budget): measured errors are at most
      // 0.73 (window) and 0.62 (topk) times 1 + sqrt(n/c − 1), worst on the 2000-key decode row.
      return sparse_detail::kept_keys_budget(in, 1.5, 1.5, [&](index_t, KeyRange) { return k; });
    };
    a.limit_case = [](const AttentionProblem& p) {
      return ParamOverrides{{"k", std::to_string(std::max<index_t>(p.n_kv(), 1))}, {"mass", "0"}};
    };
    a.convergence.param = "k";
    a.convergence.values = [](const AttentionProblem& p) {
      const index_t n = std::max<index_t>(p.n_kv(), 8);
      return std::vector<std::string>{"1", std::to_string(n / 8), std::to_string(n / 2), std::to_string(n)};
    };
    a.samples = {{{"k", "3"}}, {{"k", "17"}}, {{"k", "9"}, {"select", "block"}, {"block", "16"}, {"local", "8"}, {"samples", "2"}},
                 {{"k", "9"}, {"select", "block"}, {"block", "16"}, {"local", "8"}, {"samples", "2"}, {"mass", "0.1"}}};
    return m;
  }();
  return info;
}

std::vector<index_t> TopkAttention::selected_keys(const AttentionProblem& p, index_t b, index_t h, index_t i,
                                                  index_t k) {
  Scratch ws;
  const index_t i0 = i / kRowBlock * kRowBlock, i1 = std::min(p.n_q(), i0 + kRowBlock);
  select_block(p, b, h, i0, i1, k, ws);
  const std::int32_t* sel = ws.sel.data() + (i - i0) * ws.cap;
  return {sel, sel + ws.count[static_cast<std::size_t>(i - i0)]};
}

std::vector<index_t> TopkAttention::block_keys_of_row(const AttentionProblem& p, index_t b, index_t h, index_t i) const {
  const BlockParams prm = block_params(params());
  const index_t i0 = i / prm.block * prm.block, i1 = std::min(p.n_q(), i0 + prm.block);
  const BlockKeys bk = block_keys(p, i0, i1, prm.local);
  std::vector<index_t> keys;
  if (!bk.any) return keys;
  BlockScratch w;
  const index_t hk = h / p.group();
  std::vector<float> kt(static_cast<std::size_t>(16 * ((p.n_kv() + 15) / 16) * p.d_qk()));
  blocks::pack_key_panels(p.k.row(b, hk, 0), p.k.stride[2], p.n_kv(), p.d_qk(), kt.data());
  const index_t nf = choose_far(p, b, hk, i0, i1, bk, prm, kt.data(), w);
  for (index_t c = 0; c < nf; ++c)
    if (sees(p, b, h, i, w.far[static_cast<std::size_t>(c)])) keys.push_back(w.far[static_cast<std::size_t>(c)]);
  for (index_t j = bk.near; j < bk.end; ++j)
    if (sees(p, b, h, i, j)) keys.push_back(j);
  return keys;
}

double TopkAttention::flops(const AttentionProblem& p) const {
  const index_t k = params().get_int("k"), dk = p.d_qk(), dv = p.d_v();
  double per_head = 0;
  if (params().get_string("select") == "exact") {
    for (index_t i = 0; i < p.n_q(); ++i) {  // every visible logit, then k values
      const KeyRange kr = p.key_range(i);
      const index_t n = std::max<index_t>(kr.end - kr.begin, 0);
      per_head += 2.0 * (static_cast<double>(n) * static_cast<double>(dk) + static_cast<double>(std::min(n, k)) * static_cast<double>(dv));
    }
    return static_cast<double>(p.batch() * p.heads()) * per_head;
  }
  const BlockParams prm = block_params(params());
  for (index_t i0 = 0; i0 < p.n_q(); i0 += prm.block) {
    const index_t i1 = std::min(p.n_q(), i0 + prm.block);
    const BlockKeys bk = block_keys(p, i0, i1, prm.local);
    if (!bk.any) continue;
    const index_t nfar = bk.near - bk.begin, nf = std::min(nfar, k);
    if (nfar > k)  // the sampled rows' logits over the far keys
      per_head += 2.0 * static_cast<double>(std::min(prm.samples, i1 - i0)) * static_cast<double>(nfar) * static_cast<double>(dk);
    for (index_t i = i0; i < i1; ++i) {  // each row: the chosen far keys and the near keys it sees
      const KeyRange kr = p.key_range(i);
      if (kr.empty()) continue;
      const index_t near = std::max<index_t>(std::min(kr.end, bk.end) - std::max(kr.begin, bk.near), 0);
      per_head += 2.0 * static_cast<double>(nf + near) * static_cast<double>(dk + dv);
    }
  }
  return static_cast<double>(p.batch() * p.heads()) * per_head;
}

std::size_t TopkAttention::workspace_bytes(const AttentionProblem& p, const ExecContext& ctx) const {
  const auto nk = static_cast<std::size_t>(p.n_kv()), nt = static_cast<std::size_t>(ctx.num_threads());
  const auto k = static_cast<std::size_t>(std::min<index_t>(params().get_int("k"), p.n_kv()));
  if (params().get_string("select") == "exact")
    return nt * (sizeof(float) * (kRowBlock + 1) * nk + sizeof(float) * k + sizeof(std::int32_t) * kRowBlock * (k + 16) +
                 sizeof(std::int32_t) * 2 * (nk + 16));
  const BlockParams prm = block_params(params());
  const auto g = static_cast<std::size_t>(p.group()), rows = static_cast<std::size_t>(std::min(prm.block, p.n_q()));
  const auto m = g * static_cast<std::size_t>(std::min(prm.samples, prm.block));
  const std::size_t keys = std::min(nk, k + static_cast<std::size_t>(prm.local) + rows);
  const auto d = static_cast<std::size_t>(p.d_qk() + p.d_v());
  return nt * (sizeof(float) * ((m + 2) * nk + m * static_cast<std::size_t>(p.d_qk()) + keys * d) +
               sizeof(std::int32_t) * (3 * nk + 48)) +
         (p.mask.kind == MaskKind::kNone && p.window_left < 0 && p.window_right < 0
              ? 0
              : nt * g * rows * (sizeof(std::int32_t) + sizeof(float)) * keys);
}

void TopkAttention::forward(const AttentionProblem& p, const ExecContext& ctx) const {
  if (params().get_string("select") == "exact") forward_exact(p, ctx, params().get_int("k"));
  else forward_block(p, ctx, block_params(params()));
}

NUMATTN_DEFINE_METHOD(TopkAttention)

}  // namespace numattn
