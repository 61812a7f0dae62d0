// Internal: the flash block's blocking, scheduling and online softmax
// (include/numattn/attention/blocks/flash.h), written once and compiled per instruction-set
// variant (core/isa_begin.h) by flash_portable.cpp, flash_avx2.cpp and flash_avx512.cpp;
// flash.cpp calls the variant of the library's CPU path. The SIMD width W (4, 8 or 16 lanes) shapes the plan (rows per block, key lanes), so
// everything that depends on it is here.
#pragma once

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdlib>
#include <limits>
#include <memory>
#include <new>
#include <thread>
#include <utility>
#include <vector>

#include "attention/blocks/flash_ops.h"
#include "numattn/attention/method.h"
#include "numattn/core/exec.h"
#include "numattn/core/memory.h"
#include "numattn/core/simd.h"
#include "numattn/core/tensor.h"
#include "numattn/quant/quant.h"

#include "core/isa_begin.h"
#include "core/simd_vec.h"
#if NUMATTN_ISA_COMPILED
#include "attention/blocks/flash_kernels.h"
#endif

namespace numattn::flash::NUMATTN_ISA_NS {

#if NUMATTN_ISA_COMPILED

namespace {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();
/// Output rows up to this length are rounded to half precision from a stack buffer.
constexpr index_t kMaxDvHalfRow = 256;

/// 64-byte aligned float buffer (the kernels use aligned vector loads).
class AlignedFloats {
 public:
  AlignedFloats() = default;
  explicit AlignedFloats(std::size_t n) { resize(n); }
  void resize(std::size_t n) {
    if (n <= n_) return;
    const std::size_t bytes = (n * sizeof(float) + 63) / 64 * 64;
    p_.reset(static_cast<float*>(::operator new(bytes, std::align_val_t{64})));
    n_ = n;
  }
  float* data() const { return p_.get(); }

 private:
  struct Free {
    void operator()(float* p) const { ::operator delete(p, std::align_val_t{64}); }
  };
  std::unique_ptr<float, Free> p_;
  std::size_t n_ = 0;
};

/// The blocking of one problem. Rows of a (batch, kv head) pair are the G·Nq (query, head)
/// pairs of its GQA group in query-major order (row r = query r / G of head r % G), so the
/// query heads that share a K/V tile are processed together and read it once.
struct Plan {
  index_t G = 1;        ///< query heads per kv head
  index_t rows = 0;     ///< G·Nq rows per (b, kv head)
  int ci = 1;           ///< query vectors per block
  index_t br = 0;       ///< block rows = ci·W (lanes; the last block may be partial)
  index_t bk = 0;       ///< keys per tile
  index_t nblk = 0;     ///< blocks per (b, kv head)
  index_t items = 0;    ///< B·⌈Hkv/hpi⌉·nblk
  index_t splits = 1;   ///< key-range splits per block (split-KV)
  int threads = 1;      ///< threads actually used
  index_t hpi = 1;      ///< kv heads per item (key lanes: as many as 64 rows hold; else 1)
  bool key_lanes = false;  ///< the block's rows in scratch rows, keys and dims in lanes (attend_rows)
  index_t lds = 0;         ///< row stride of the logit tile in key lanes (block_k rounded up to W)
};

/// Key lanes by default for up to half a SIMD vector of rows per kv head. Measured on the 2-core
/// Zen 3 VM (AVX2, W = 8), 1 thread, decode (Nq = 1), D = 64, `numattn bench --layout bnhd`,
/// µs per call at Nk = 256 / 2048, query lanes → key lanes: G = 1: 17.6 / 106 → 7.4 / 38;
/// G = 3 (Hq = 9): 49 / 308 → 30 / 209; G = 4: 15.6 / 110 → 12.7 / 67; G = 6: 12.4 / 107 →
/// 18.8 / 118; G = 8: 17.3 / 103 → 15.5 / 140. AVX-512 (W = 16) is assumed to scale alike.
index_t auto_key_lanes() { return W / 2; }

/// Below this many flops (upper bound) a problem runs on one thread (see make_plan). Key
/// lanes (decoding) stream K and V at about the speed one core reads memory, so a second
/// core pays off sooner: a SmolLM2 layer (9 heads, Nk = 512, 1.2 MFLOP) decodes in ~40 µs on
/// one core.
constexpr double kMinParallelFlops = 8e6;
constexpr double kMinParallelFlopsKeyLanes = 1e6;

/// Fewest keys of a split-KV piece of a key-lane (decoding) block, see make_plan.
constexpr index_t kMinKeysPerPiece = 1024;

Plan make_plan(const AttentionProblem& p, const blocks::FlashConfig& cfg, int threads) {
  Plan pl;
  pl.G = p.group();
  pl.rows = pl.G * p.n_q();
  const index_t kl = cfg.key_lanes;
  // A decode step (one query row per head) stays in key lanes up to a whole vector of rows per
  // kv head: every key is then read once for all of them (an MLA layer's 9 query heads over its
  // one latent head), where query lanes would pad the rows to a block and, for a half cache,
  // widen every key tile first.
  const index_t auto_kl = p.n_q() == 1 ? W : auto_key_lanes();
  pl.key_lanes = pl.rows <= (kl < 0 ? auto_kl : kl);
  // Key lanes take all rows of several kv heads as one block (at most 64 = kMaxCI·W rows):
  // with the KV cache's [position, kv head, dim] rows, a tile of keys is then one contiguous
  // stream of memory instead of one strided pass per kv head.
  pl.hpi = pl.key_lanes ? std::min<index_t>(p.kv_heads(), kMaxCI * W / pl.rows) : 1;
  const index_t want = pl.key_lanes ? pl.hpi * pl.rows : std::min<index_t>(cfg.block_q, pl.rows);
  pl.ci = static_cast<int>(std::clamp<index_t>((want + W - 1) / W, 1, kMaxCI));
  pl.br = pl.ci * W;
  pl.bk = std::clamp<index_t>(cfg.block_k, 1, p.n_kv());
  pl.lds = (pl.bk + W - 1) / W * W;
  pl.nblk = (pl.rows + pl.br - 1) / pl.br;
  pl.items = p.batch() * ((p.kv_heads() + pl.hpi - 1) / pl.hpi) * pl.nblk;
  // Small problems run on one thread: a parallel region costs ~10 µs to fork and join on an
  // idle machine and up to a scheduler period (milliseconds) on a loaded one, which is more
  // than the whole work below ~8 MFLOP (~60 µs on one core). Bound: every row sees every key.
  const double flops_bound = 2.0 * static_cast<double>(p.batch() * p.heads() * p.n_q()) *
                             static_cast<double>(p.n_kv()) * static_cast<double>(p.d_qk() + p.d_v());
  pl.threads = flops_bound < (pl.key_lanes ? kMinParallelFlopsKeyLanes : kMinParallelFlops) ? 1 : std::max(1, threads);
  threads = pl.threads;
  index_t s = cfg.split_kv;
  if (s == 0) {
    // Few blocks (decoding): split each block's key range so that every thread gets about
    // eight pieces, fine enough for the shared-counter schedule to even out a thread that the
    // OS delays; one thread gains nothing from splitting. Key-lane pieces keep at least
    // kMinKeysPerPiece keys (but every thread gets one): each costs a few µs of setup and
    // merging (an MLA decode step at Nk = 4096 on 2 threads: 16 pieces 132 µs, 4 pieces 114 µs).
    s = 1;
    if (threads > 1 && pl.items < 2 * threads) {
      index_t want = 8 * threads;
      if (pl.key_lanes) want = std::clamp<index_t>(p.n_kv() / kMinKeysPerPiece, threads, want);
      s = (want + pl.items - 1) / pl.items;
    }
  }
  pl.splits = std::clamp<index_t>(s, 1, std::max<index_t>(1, (p.n_kv() + pl.bk - 1) / pl.bk));
  return pl;
}

/// A pass of the key-lane kernels over a tile: rows [r0, r0 + nr) of the block, all of one kv
/// head whose keys and values start at k and v.
struct RowPass {
  index_t r0, nr;
  const void* k;  ///< kv_elem<T> of the attend_rows<T> that made it
  const void* v;
};

/// Keys / values of (b, kv head h) from position 0, in the problem's element type T.
template <KvType T>
const kv_elem<T>* k_rows(const AttentionProblem& p, index_t b, index_t h) {
  if constexpr (T == KvType::kF32) return p.k.row(b, h, 0);
  else return p.k16_row(b, h, 0);
}
template <KvType T>
const kv_elem<T>* v_rows(const AttentionProblem& p, index_t b, index_t h) {
  if constexpr (T == KvType::kF32) return p.v.row(b, h, 0);
  else return p.v16_row(b, h, 0);
}

/// Query row (b, h, i) as float32: in place, or (half-precision Q) converted into `tmp` (Dk
/// floats) as the block's tile is loaded.
inline const float* q_row(const AttentionProblem& p, index_t b, index_t h, index_t i, float* tmp) {
  if (!p.has_half_q()) return p.q.row(b, h, i);
  widen_row(p.q16_row(b, h, i), p.half_q.type, p.d_qk(), tmp);
  return tmp;
}

/// A run of `n` keys from `key0` placed at column `col` of a key-lane logit tile.
struct TileSeg {
  index_t key0, n, col;
};

/// Per-thread scratch of one block (key lanes: qt holds q rows, s holds [br][lds] logits and
/// orow the [br][Dv] output rows).
struct Scratch {
  AlignedFloats qt, s, ot, m, l, orow;
  std::vector<float> qrow;  ///< one half-precision q row in float32
  std::vector<index_t> qi, head;
  std::vector<MaskRow> mrow;  ///< each lane's mask row (AttentionProblem::mask_row)
  std::vector<RowPass> passes;
  std::vector<TileSeg> segs;  ///< segments of packed tiles (attend_rows_over)
  std::vector<index_t> seg_first, seg_cols;  ///< first segment and width of each packed tile
  std::vector<index_t> kb, ke;  ///< visible key range of each lane (kb ≥ ke: none)
  AlignedFloats ktile, vtile;  ///< one tile of half-precision K / V rows widened (query lanes)
  void reserve(const AttentionProblem& p, const Plan& pl) {
    const auto br = static_cast<std::size_t>(pl.br);
    if (p.half_kv() && !pl.key_lanes) {
      ktile.resize(static_cast<std::size_t>(pl.bk * p.d_qk()));
      vtile.resize(static_cast<std::size_t>(pl.bk * p.d_v()));
    }
    qt.resize(static_cast<std::size_t>(p.d_qk()) * br);
    s.resize(static_cast<std::size_t>(pl.lds) * br);
    ot.resize(static_cast<std::size_t>(p.d_v()) * br);
    if (pl.key_lanes) orow.resize(static_cast<std::size_t>(p.d_v()) * br);
    m.resize(br);
    l.resize(br);
    if (p.has_half_q()) qrow.resize(static_cast<std::size_t>(p.d_qk()));
    qi.resize(br);
    head.resize(br);
    mrow.resize(br);
    kb.resize(br);
    ke.resize(br);
  }
};

/// Running softmax state of a block: per-lane max `m`, normaliser `l`, accumulator `ot`.
struct State {
  float* m;
  float* l;
  float* ot;
};

/// One work item: rows [r0, r0 + nrows) of batch b from kv head hk on. Row gr of the item
/// (row_of) belongs to kv head hk + gr / Plan::rows, and within it to the (query, head) pair
/// gr mod Plan::rows in query-major order.
struct Item {
  index_t b, hk, r0, nrows;
};

Item item_of(const AttentionProblem& p, const Plan& pl, index_t w) {
  const index_t groups = (p.kv_heads() + pl.hpi - 1) / pl.hpi;
  const index_t blk = w % pl.nblk, bg = w / pl.nblk;
  const index_t r0 = blk * pl.br, hk = bg % groups * pl.hpi;
  const index_t nrows = pl.key_lanes ? std::min(pl.hpi, p.kv_heads() - hk) * pl.rows : std::min(pl.br, pl.rows - r0);
  return {bg / groups, hk, r0, nrows};
}

/// Query index and query head of row r of an item.
struct RowId {
  index_t qi, head;
};

RowId row_of(const Plan& pl, const Item& it, index_t r) {
  const index_t gr = it.r0 + r, kvh = it.hk + gr / pl.rows, g = gr % pl.rows;
  return {g / pl.G, kvh * pl.G + g % pl.G};
}

/// Union of the visible key ranges of the item's rows ([0, 0) when none is visible).
KeyRange item_keys(const AttentionProblem& p, const Plan& pl, const Item& it) {
  index_t lo = p.n_kv(), hi = 0;
  const index_t i_first = it.nrows > pl.rows ? 0 : row_of(pl, it, 0).qi;
  const index_t i_last = it.nrows > pl.rows ? p.n_q() - 1 : row_of(pl, it, it.nrows - 1).qi;
  for (index_t i = i_first; i <= i_last; ++i) {
    const KeyRange kr = p.key_range(i);
    if (kr.empty()) continue;
    lo = std::min(lo, kr.begin);
    hi = std::max(hi, kr.end);
  }
  return lo < hi ? KeyRange{lo, hi} : KeyRange{0, 0};
}

/// Key range of split `s` of an item whose visible keys are `all` (chunks of whole tiles).
KeyRange split_keys(const Plan& pl, KeyRange all, index_t s) {
  const index_t n = all.end - all.begin;
  const index_t chunk = ((n + pl.splits - 1) / pl.splits + pl.bk - 1) / pl.bk * pl.bk;
  const index_t b = std::min(all.end, all.begin + s * chunk);
  return {b, std::min(all.end, b + chunk)};
}

/// The logit s of key `key` under mask row m (AttentionProblem::mask_row): -inf where the mask
/// hides the key (false; -inf or NaN entries), else s plus the additive entry. +inf or a NaN
/// logit of a visible key stays non-finite (the row is settled by run()).
inline float masked_logit(const MaskRow& m, index_t key, float s) {
  if (m.allowed) return m.allowed[key] ? s : kNegInf;
  if (m.additive) {
    const float a = m.additive[key];
    return !(a > kNegInf) || s == kNegInf ? kNegInf : s + a;
  }
  return s;
}

/// Hides the logits of a boundary tile (keys [j0, j0 + cols)) that the causal rule, window or
/// masks hide, applies the additive mask, and returns the tile's per-lane maximum in `vmax`.
template <int CI>
void mask_tile(const AttentionProblem& p, const Scratch& ws, index_t nrows, index_t j0,
               index_t cols, float* s, R* vmax) {
  constexpr int BR = CI * W;
  const index_t* kb = ws.kb.data();
  const index_t* ke = ws.ke.data();
  const MaskRow* mrow = ws.mrow.data();
  for (index_t j = 0; j < cols; ++j) {
    float* srow = s + j * BR;
    const index_t key = j0 + j;
    for (int r = 0; r < BR; ++r)
      if (key < kb[r] || key >= ke[r]) srow[r] = kNegInf;
    if (p.mask.kind != MaskKind::kNone)
      for (index_t r = 0; r < nrows; ++r) srow[r] = masked_logit(mrow[r], key, srow[r]);
    for (int c = 0; c < CI; ++c) vmax[c] = Vec::max(vmax[c], Vec::load(srow + c * W));
  }
}

/// Sets the lanes (query index, head, visible key range clipped to `keys`) of the item's rows
/// and of the padding lanes up to `br` (empty range), and returns the union of the ranges
/// ([keys.end, keys.begin) when no row sees a key).
KeyRange set_lanes(const AttentionProblem& p, const Plan& pl, const Item& it, KeyRange keys, index_t br,
                   Scratch& ws) {
  index_t lo = keys.end, hi = keys.begin;
  for (index_t r = 0; r < br; ++r) {
    ws.kb[r] = 1;
    ws.ke[r] = 0;
    if (r >= it.nrows) continue;
    const RowId id = row_of(pl, it, r);
    ws.qi[r] = id.qi;
    ws.head[r] = id.head;
    ws.mrow[r] = p.mask_row(it.b, id.head, id.qi);
    const KeyRange kr = p.key_range(ws.qi[r]);
    const index_t b = std::max(kr.begin, keys.begin), e = std::min(kr.end, keys.end);
    if (b >= e) continue;
    ws.kb[r] = b;
    ws.ke[r] = e;
    lo = std::min(lo, b);
    hi = std::max(hi, e);
  }
  return {lo, hi};
}

/// Calls f(j0, cols, full) for the key tiles of [span.begin, span.end) that some of the n rows
/// sees; `full`: every row sees every key of the tile and there is no mask. The span is cut at
/// the edges of the key range that every row sees, so that causal or window boundaries get
/// narrow masked tiles of their own instead of masking (and computing) a whole block_k-wide
/// tile around the diagonal; within a segment the tiles have equal widths (≤ block_k), since a
/// 1-key remainder tile would still pay a whole tile's fixed costs (softmax statistics,
/// loading and storing the accumulator).
template <class F>
void for_each_tile(const AttentionProblem& p, const Scratch& ws, index_t n, KeyRange span, index_t bk, F&& f) {
  const index_t lo = span.begin, hi = span.end;
  index_t fb = lo, fe = hi;
  for (index_t r = 0; r < n; ++r) fb = std::max(fb, ws.kb[r]), fe = std::min(fe, ws.ke[r]);
  const index_t cut1 = std::clamp(fb, lo, hi), cut2 = std::clamp(fe, cut1, hi);
  const bool has_mask = p.mask.kind != MaskKind::kNone;
  for (index_t j0 = lo; j0 < hi;) {
    const index_t seg_end = j0 < cut1 ? cut1 : j0 < cut2 ? cut2 : hi;
    const index_t left = seg_end - j0, ntiles = (left + bk - 1) / bk;
    const index_t cols = (left + ntiles - 1) / ntiles, j1 = j0 + cols;
    const index_t jt = j0;
    j0 = j1;
    bool any = false, full = !has_mask;
    for (index_t r = 0; r < n; ++r) {
      any |= ws.kb[r] < j1 && ws.ke[r] > jt;
      full &= ws.kb[r] <= jt && ws.ke[r] >= j1;
    }
    if (any) f(jt, cols, full);
  }
}

/// Attends the item's rows to keys [keys.begin, keys.end) into `st` (reset first).
template <int CI>
void attend_block(const AttentionProblem& p, const Plan& pl, const Item& it, KeyRange keys,
                  Scratch& ws, State st) {
  constexpr int BR = CI * W;
  const index_t dk = p.d_qk(), dv = p.d_v(), n = it.nrows;
  const float scale = static_cast<float>(p.effective_scale());
  const KeyRange span = set_lanes(p, pl, it, keys, BR, ws);

  // qt = scale·Qᵀ (zero in the padding lanes, whose results are never read).
  float* qt = ws.qt.data();
  for (index_t r = 0; r < BR; ++r) {
    if (r < n) {
      const float* q = q_row(p, it.b, ws.head[r], ws.qi[r], ws.qrow.data());
      for (index_t d = 0; d < dk; ++d) qt[d * BR + r] = scale * q[d];
    } else {
      for (index_t d = 0; d < dk; ++d) qt[d * BR + r] = 0.f;
    }
  }
  for (int r = 0; r < BR; ++r) st.m[r] = kNegInf, st.l[r] = 0.f;
  std::fill(st.ot, st.ot + dv * BR, 0.f);
  R vlow[CI];  // smallest raw logit per lane over all tiles
  for (int c = 0; c < CI; ++c) vlow[c] = Vec::set1(std::numeric_limits<float>::infinity());

  // Half-precision K/V: each tile's rows are widened (exactly) into scratch as the tile is
  // reached, so no float32 copy of the cache is made; the block's 16–64 query rows then use
  // each widened row, which keeps the conversions under 1% of the tile's FLOPs.
  const bool half = p.half_kv();
  const float* kbase = half ? nullptr : p.k.row(it.b, it.hk, 0);
  const float* vbase = half ? nullptr : p.v.row(it.b, it.hk, 0);
  const index_t ldk = half ? dk : p.k.stride[2], ldv = half ? dv : p.v.stride[2];
  float* s = ws.s.data();
  for_each_tile(p, ws, n, span, pl.bk, [&](index_t jt, index_t cols, bool full) {
    R vmax[CI], mu[CI], corr[CI];
    for (int c = 0; c < CI; ++c) vmax[c] = Vec::set1(kNegInf);
    const float* kt = nullptr;
    const float* vt = nullptr;
    if (half) {
      for (index_t j = 0; j < cols; ++j) {
        widen_row(p.k16_row(it.b, it.hk, jt + j), p.half.type, dk, ws.ktile.data() + j * dk);
        widen_row(p.v16_row(it.b, it.hk, jt + j), p.half.type, dv, ws.vtile.data() + j * dv);
      }
      kt = ws.ktile.data(), vt = ws.vtile.data();
    } else {
      kt = kbase + jt * ldk, vt = vbase + jt * ldv;
    }
    qk_tile<CI>(qt, dk, kt, ldk, cols, s, vmax, vlow);
    if (!full) {
      for (int c = 0; c < CI; ++c) vmax[c] = Vec::set1(kNegInf);
      mask_tile<CI>(p, ws, n, jt, cols, s, vmax);
    }
    // Online softmax: m' = max(m, tile max); rescale by exp(m − m'); a lane that has seen
    // nothing yet keeps m' = -inf and uses 0 as its shift so that exp gives 0, not NaN.
    bool rescale = false;
    for (int c = 0; c < CI; ++c) {
      const R mo = Vec::load(st.m + c * W);
      const R mn = Vec::max(mo, vmax[c]);
      mu[c] = Vec::neginf_to_zero(mn);
      corr[c] = Vec::exp_cut(Vec::sub(mo, mu[c]));
      Vec::store(st.m + c * W, mn);
    }
    {
      alignas(64) float cbuf[BR];
      for (int c = 0; c < CI; ++c) Vec::store(cbuf + c * W, corr[c]);
      for (int r = 0; r < BR; ++r) rescale |= cbuf[r] != 1.f;
    }
    // One query vector at a time, two independent sums: with all CI vectors in flight, AVX2's
    // 16 registers cannot hold the shifts, the sums and the exp's constants at once.
    R sum[CI];
    for (int c = 0; c < CI; ++c) {
      const R m = mu[c];
      R a0 = Vec::zero(), a1 = Vec::zero();
      float* sc = s + c * W;
      index_t j = 0;
      for (; j + 2 <= cols; j += 2) {
        const R e0 = Vec::exp_cut(Vec::sub(Vec::load(sc + j * BR), m));
        const R e1 = Vec::exp_cut(Vec::sub(Vec::load(sc + (j + 1) * BR), m));
        Vec::store(sc + j * BR, e0);
        Vec::store(sc + (j + 1) * BR, e1);
        a0 = Vec::add(a0, e0);
        a1 = Vec::add(a1, e1);
      }
      if (j < cols) {
        const R e0 = Vec::exp_cut(Vec::sub(Vec::load(sc + j * BR), m));
        Vec::store(sc + j * BR, e0);
        a0 = Vec::add(a0, e0);
      }
      sum[c] = Vec::add(a0, a1);
    }
    for (int c = 0; c < CI; ++c)
      Vec::store(st.l + c * W, Vec::fmadd(Vec::load(st.l + c * W), corr[c], sum[c]));
    pv_tile<CI>(s, cols, vt, ldv, dv, st.ot, corr, rescale);
  });
  // A -inf logit (from an infinite input or float32 overflow) got weight 0 without a trace:
  // make the lane's normaliser NaN so that run() settles the row. NaN and +inf logits need
  // nothing here: exp_cut, the rescale and P·V carry them into l and ot.
  for (int c = 0; c < CI; ++c)
    Vec::store(st.l + c * W, Vec::add(Vec::load(st.l + c * W), Vec::nan_where_neginf(vlow[c])));
}

/// exp_cut of one value (a row's rescale factor in key lanes).
float exp_cut1(float x) {
  alignas(64) float b[W];
  Vec::store(b, Vec::exp_cut(Vec::set1(x)));
  return b[0];
}

/// Hides the logits s[0, cols) of lane r (keys j0 + ·) that the causal rule, window or masks
/// hide and applies the additive mask: mask_tile for one row of a key-lane tile.
void mask_row(const Scratch& ws, index_t r, index_t j0, index_t cols, float* s) {
  const index_t kb = ws.kb[r], ke = ws.ke[r];
  const MaskRow& m = ws.mrow[r];
  for (index_t j = 0; j < cols; ++j) {
    const index_t key = j0 + j;
    s[j] = key < kb || key >= ke ? kNegInf : masked_logit(m, key, s[j]);
  }
}

/// f.template operator()<n>() for a pass of n rows, kRowsPerPass < n ≤ kMaxWideRows (the wide
/// kernels: AVX-512 only; elsewhere passes never exceed kRowsPerPass rows).
template <class F>
inline void wide_tile(index_t n, F&& f) {
  if constexpr (kMaxWideRows > kRowsPerPass) {
    [&]<int... I>(std::integer_sequence<int, I...>) {
      ((n == kRowsPerPass + 1 + I ? (f.template operator()<kRowsPerPass + 1 + I>(), 0) : 0), ...);
    }(std::make_integer_sequence<int, kMaxWideRows - kRowsPerPass>{});
  }
}

/// attend_block in key lanes (flash_kernels.h, "Key lanes"): the same online softmax, per row,
/// reading keys and values of type T in place, over the sorted disjoint ranges[0..nr) in turn.
template <KvType T>
void attend_rows_over(const AttentionProblem& p, const Plan& pl, const Item& it, const KeyRange* ranges,
                      index_t nr, Scratch& ws, State st) {
  const index_t dk = p.d_qk(), dv = p.d_v(), n = it.nrows, br = pl.br, lds = pl.lds;
  const float scale = static_cast<float>(p.effective_scale());
  set_lanes(p, pl, it, nr > 0 ? ranges[0] : KeyRange{0, 0}, br, ws);

  float* q = ws.qt.data();
  for (index_t r = 0; r < n; ++r) {
    const float* qr = q_row(p, it.b, ws.head[r], ws.qi[r], ws.qrow.data());
    for (index_t d = 0; d < dk; ++d) q[r * dk + d] = scale * qr[d];
  }
  for (index_t r = 0; r < br; ++r) st.m[r] = kNegInf, st.l[r] = 0.f;
  float* o = ws.orow.data();
  std::fill(o, o + n * dv, 0.f);
  // Smallest raw logit and rescale factor of each row (n ≤ 64 = kMaxCI·W).
  float low[kMaxCI * W], corr[kMaxCI * W];
  std::fill(low, low + n, std::numeric_limits<float>::infinity());

  // Rows per kv head in this block: Plan::rows, or fewer when the block holds one group's rows
  // (forward_selected).
  const index_t ldk = p.k.stride[2], ldv = p.v.stride[2], rpk = std::min(pl.rows, n);
  float* s = ws.s.data();
  constexpr int NR = kRowsPerPass;
  std::vector<RowPass>& passes = ws.passes;
  passes.clear();
  // A kv head's rows in as few passes as NR allows (the wide kernels' kMaxWideRows beyond NR
  // rows), of balanced sizes (G = 4 on AVX2: 2 + 2, not 3 + 1, whose one-row pass would cost
  // as many loads as a three-row one).
  const index_t per_pass = rpk <= NR ? NR : kMaxWideRows;
  const index_t npass = (rpk + per_pass - 1) / per_pass;
  for (index_t h0 = 0; h0 < n; h0 += rpk) {
    const index_t kvh = it.hk + h0 / rpk;
    for (index_t i = 0; i < npass; ++i) {
      const index_t a = h0 + rpk * i / npass, b = h0 + rpk * (i + 1) / npass;
      passes.push_back({a, b - a, k_rows<T>(p, it.b, kvh), v_rows<T>(p, it.b, kvh)});
    }
  }
  // A tile is one or more segments of keys (key0, n) laid side by side from column `col` of the
  // logit rows: one range's tile, or several short ranges packed into one tile (one softmax
  // update for up to block_k selected keys); `jt` is the first segment's first key.
  using Seg = TileSeg;
  const auto tile_of = [&](const Seg* segs, int nseg, index_t cols, bool full) {
    const index_t jt = segs[0].key0;
    for (const RowPass& ps : passes) {
      const float* qr = q + ps.r0 * dk;
      for (int g = 0; g < nseg; ++g) {
        float* sr = s + ps.r0 * lds + segs[g].col;
        const kv_elem<T>* kt = static_cast<const kv_elem<T>*>(ps.k) + segs[g].key0 * ldk;
        const index_t c = segs[g].n;
        switch (ps.nr) {
          case 1: qk_rows_tile<1, T>(qr, dk, dk, kt, ldk, c, sr, lds); break;
          case 2: qk_rows_tile<2, T>(qr, dk, dk, kt, ldk, c, sr, lds); break;
          case 3: qk_rows_tile<3, T>(qr, dk, dk, kt, ldk, c, sr, lds); break;
          default:
            if (ps.nr <= NR) qk_rows_tile<NR, T>(qr, dk, dk, kt, ldk, c, sr, lds);
            else wide_tile(ps.nr, [&]<int N>() { qk_wide_tile<N, T>(qr, dk, dk, kt, ldk, c, sr, lds); });
            break;
        }
      }
    }
    const index_t padded = (cols + W - 1) / W * W;
    bool rescale = false;
    for (index_t r = 0; r < n; ++r) {
      float* sr = s + r * lds;
      // Raw minimum (for the -inf check, as vlow in attend_block), then the visible maximum.
      R vmin = Vec::set1(std::numeric_limits<float>::infinity()), vmax = Vec::set1(kNegInf);
      index_t j = 0;
      for (; j + W <= cols; j += W) {
        const R x = Vec::load(sr + j);
        vmin = Vec::min(vmin, x);
        vmax = Vec::max(vmax, x);
      }
      alignas(64) float b[W];
      Vec::store(b, vmin);
      float lo = *std::min_element(b, b + W);
      for (index_t t = j; t < cols; ++t) lo = std::min(lo, sr[t]);
      low[r] = std::min(low[r], lo);
      float mx = kNegInf;
      if (full) {
        Vec::store(b, vmax);
        for (int c = 0; c < W; ++c) mx = std::max(mx, b[c]);
        for (index_t t = j; t < cols; ++t) mx = std::max(mx, sr[t]);
      } else {
        mask_row(ws, r, jt, cols, sr);
        for (index_t t = 0; t < cols; ++t) mx = std::max(mx, sr[t]);
      }
      // Online softmax, as in attend_block: a row that has seen nothing keeps m = -inf and
      // shifts by 0, so that exp gives 0, not NaN.
      const float mn = std::max(st.m[r], mx);
      const float mu = mn == kNegInf ? 0.f : mn;
      corr[r] = exp_cut1(st.m[r] - mu);
      rescale |= corr[r] != 1.f;
      st.m[r] = mn;
      std::fill(sr + cols, sr + padded, kNegInf);  // exp gives 0 there
      const R vmu = Vec::set1(mu);
      R sum = Vec::zero();
      for (index_t t = 0; t < padded; t += W) {
        const R e = Vec::exp_cut(Vec::sub(Vec::load(sr + t), vmu));
        Vec::store(sr + t, e);
        sum = Vec::add(sum, e);
      }
      st.l[r] = st.l[r] * corr[r] + Vec::hsum(sum);
    }
    for (const RowPass& ps : passes) {
      float* orow = o + ps.r0 * dv;
      const float* cr = corr + ps.r0;
      for (int g = 0; g < nseg; ++g) {
        const float* pr = s + ps.r0 * lds + segs[g].col;
        const kv_elem<T>* vt = static_cast<const kv_elem<T>*>(ps.v) + segs[g].key0 * ldv;
        const index_t c = segs[g].n;
        const bool rs = rescale && g == 0;  // the old accumulator is rescaled once per tile
        switch (ps.nr) {
          case 1: pv_rows_tile<1, T>(pr, lds, c, vt, ldv, dv, orow, dv, cr, rs); break;
          case 2: pv_rows_tile<2, T>(pr, lds, c, vt, ldv, dv, orow, dv, cr, rs); break;
          case 3: pv_rows_tile<3, T>(pr, lds, c, vt, ldv, dv, orow, dv, cr, rs); break;
          default:
            if (ps.nr <= NR) pv_rows_tile<NR, T>(pr, lds, c, vt, ldv, dv, orow, dv, cr, rs);
            else wide_tile(ps.nr, [&]<int N>() { pv_rows_tile<N, T>(pr, lds, c, vt, ldv, dv, orow, dv, cr, rs); });
            break;
        }
      }
    }
  };
  // Several ranges that every row sees whole, without a mask (a sparse method's selection for
  // one query): packed into tiles of up to block_k keys. Otherwise each range by its own tiles.
  bool packed = nr > 1 && p.mask.kind == MaskKind::kNone;
  for (index_t i = 0; packed && i < nr; ++i)
    for (index_t r = 0; r < n; ++r) {
      const KeyRange vr = p.key_range(ws.qi[r]);
      packed &= vr.begin <= ranges[i].begin && ranges[i].end <= vr.end;
    }
  if (!packed) {
    for (index_t i = 0; i < nr; ++i)
      for_each_tile(p, ws, n, set_lanes(p, pl, it, ranges[i], br, ws), pl.bk,
                    [&](index_t jt, index_t cols, bool full) {
                      const Seg one{jt, cols, 0};
                      tile_of(&one, 1, cols, full);
                    });
  } else {
    // All tiles' segments first (tile t: segs[first[t], first[t+1])), so that the rows of
    // tile t+1 are prefetched while tile t is computed: selected ranges are short and scattered
    // over the cache, where the hardware prefetcher, which follows one stream, does not reach.
    std::vector<Seg>& segs = ws.segs;
    std::vector<index_t>& first = ws.seg_first;
    segs.clear();
    first.assign(1, 0);
    std::vector<index_t>& ncols = ws.seg_cols;
    ncols.clear();
    index_t i = 0, off = 0;
    while (i < nr) {
      index_t cols = 0;
      while (i < nr && cols < pl.bk) {
        const index_t take = std::min(pl.bk - cols, ranges[i].end - ranges[i].begin - off);
        if (take > 0) segs.push_back({ranges[i].begin + off, take, cols});
        cols += take;
        off += take;
        if (ranges[i].begin + off >= ranges[i].end) ++i, off = 0;
      }
      if (cols > 0) first.push_back(static_cast<index_t>(segs.size())), ncols.push_back(cols);
    }
    const index_t ntiles = static_cast<index_t>(ncols.size());
    const auto prefetch = [&](index_t t) {
      if (t >= ntiles) return;
      const std::size_t kb = sizeof(kv_elem<T>) * static_cast<std::size_t>(dk),
                        vb = sizeof(kv_elem<T>) * static_cast<std::size_t>(dv);
      for (const RowPass& ps : passes) {
        if (ps.r0 != 0) break;  // one pass per kv head reads its rows; rows of one head suffice
        for (index_t g = first[t]; g < first[t + 1]; ++g)
          for (index_t j = segs[g].key0; j < segs[g].key0 + segs[g].n; ++j) {
            const char* kr = reinterpret_cast<const char*>(static_cast<const kv_elem<T>*>(ps.k) + j * ldk);
            const char* vr = reinterpret_cast<const char*>(static_cast<const kv_elem<T>*>(ps.v) + j * ldv);
            for (std::size_t b = 0; b < kb; b += 64) __builtin_prefetch(kr + b);
            for (std::size_t b = 0; b < vb; b += 64) __builtin_prefetch(vr + b);
          }
      }
    };
    prefetch(0);
    for (index_t t = 0; t < ntiles; ++t) {
      prefetch(t + 1);
      tile_of(segs.data() + first[t], static_cast<int>(first[t + 1] - first[t]), ncols[t], true);
    }
  }
  // The -inf check of attend_block, and the state in its layout (lanes = rows) for
  // merge_state and finish_block.
  for (index_t r = 0; r < n; ++r)
    if (low[r] == kNegInf) st.l[r] = std::numeric_limits<float>::quiet_NaN();
  for (index_t r = 0; r < br; ++r) {
    const float* orow = o + r * dv;
    if (r < n)
      for (index_t d = 0; d < dv; ++d) st.ot[d * br + r] = orow[d];
    else
      for (index_t d = 0; d < dv; ++d) st.ot[d * br + r] = 0.f;
  }
}

template <KvType T>
void attend_rows(const AttentionProblem& p, const Plan& pl, const Item& it, KeyRange keys, Scratch& ws, State st) {
  attend_rows_over<T>(p, pl, it, &keys, 1, ws, st);
}

/// Writes out = ot / l and lse = m + log l for the item's rows (a half-precision output row
/// rounded once from its float32 values).
void finish_block(const AttentionProblem& p, const Plan& pl, const Item& it, const State& st) {
  const index_t dv = p.d_v(), br = pl.br;
  float row16[kMaxDvHalfRow];
  std::vector<float> long_row;
  float* tmp = row16;
  if (p.has_half_out() && dv > kMaxDvHalfRow) long_row.resize(static_cast<std::size_t>(dv)), tmp = long_row.data();
  for (index_t r = 0; r < it.nrows; ++r) {
    const RowId id = row_of(pl, it, r);
    const index_t i = id.qi, h = id.head;
    // l ≥ 1 for a row that saw a key (its maximum has weight 1), 0 for an empty row, NaN for a
    // row run() must settle; NaN must reach the output.
    const float l = st.l[r];
    const float inv = l == 0.f ? 0.f : 1.f / l;
    float* o = p.has_half_out() ? tmp : p.out.row(it.b, h, i);
    for (index_t d = 0; d < dv; ++d) o[d] = st.ot[d * br + r] * inv;
    if (p.has_half_out()) narrow_row(o, p.half_out.type, dv, p.out16_row(it.b, h, i));
    if (!p.lse.empty()) p.lse(it.b, h, i, 0) = l == 0.f ? kNegInf : st.m[r] + std::log(l);
  }
}

/// dst ← merge(dst, src) through log-sum-exp: both scaled to the larger maximum.
void merge_state(const Plan& pl, index_t dv, State dst, const State& src) {
  const index_t br = pl.br;
  for (index_t c = 0; c < br / W; ++c) {
    const R ma = Vec::load(dst.m + c * W), mb = Vec::load(src.m + c * W);
    const R mn = Vec::max(ma, mb), mu = Vec::neginf_to_zero(mn);
    const R ca = Vec::exp_cut(Vec::sub(ma, mu)), cb = Vec::exp_cut(Vec::sub(mb, mu));
    Vec::store(dst.l + c * W, Vec::fmadd(Vec::load(dst.l + c * W), ca,
                                         Vec::mul(Vec::load(src.l + c * W), cb)));
    Vec::store(dst.m + c * W, mn);
    for (index_t d = 0; d < dv; ++d) {
      float* a = dst.ot + d * br + c * W;
      Vec::store(a, Vec::fmadd(Vec::load(a), ca, Vec::mul(Vec::load(src.ot + d * br + c * W), cb)));
    }
  }
}

/// Split-KV partial states, one per work unit (item, split): the thread that completes an
/// item's last split merges them in split order (exact through LSE) and writes the rows, inside
/// the same parallel region (a second region would add one more fork/join, which on a loaded
/// machine can cost a scheduling quantum).
class SplitStates {
 public:
  SplitStates(const Plan& pl, index_t units, index_t dv) : pl_(pl), dv_(dv) {
    if (pl.splits == 1) return;
    partial_.resize(static_cast<std::size_t>(units) * per_unit());
    done_ = std::make_unique<std::atomic<index_t>[]>(static_cast<std::size_t>(pl.items));
    for (index_t w = 0; w < pl.items; ++w) done_[static_cast<std::size_t>(w)].store(0);
  }
  State state(index_t u) {
    float* base = partial_.data() + static_cast<std::size_t>(u) * per_unit();
    const auto br = static_cast<std::size_t>(pl_.br);
    return State{base, base + br, base + 2 * br};
  }
  /// Counts one finished split of item w; the last one merges and finishes the item.
  void finish_if_last(const AttentionProblem& p, const Plan& pl, const Item& it, index_t w) {
    if (done_[static_cast<std::size_t>(w)].fetch_add(1, std::memory_order_acq_rel) + 1 != pl.splits) return;
    const State dst = state(w * pl.splits);
    for (index_t s2 = 1; s2 < pl.splits; ++s2) merge_state(pl, dv_, dst, state(w * pl.splits + s2));
    finish_block(p, pl, it, dst);
  }

 private:
  std::size_t per_unit() const { return static_cast<std::size_t>(pl_.br) * static_cast<std::size_t>(dv_ + 2); }
  const Plan& pl_;
  index_t dv_;
  AlignedFloats partial_;
  std::unique_ptr<std::atomic<index_t>[]> done_;
};

using BlockFn = void (*)(const AttentionProblem&, const Plan&, const Item&, KeyRange, Scratch&, State);

template <int CI>
constexpr BlockFn block_fn_for(int ci) {
  if constexpr (CI > kMaxCI) {
    return nullptr;
  } else {
    return ci == CI ? &attend_block<CI> : block_fn_for<CI + 1>(ci);
  }
}

/// Whether the query-lane kernels run on packed K/V (forward_packed): float32 rows not adjacent
/// in memory ([B, N, H, D] storage, k.stride[2] = H·D) that more than one block of the
/// (b, kv head) re-reads. Half-precision rows are widened per tile instead (attend_block).
bool packs_panels(const AttentionProblem& p, const Plan& pl) {
  if (pl.key_lanes || p.half_kv()) return false;
  return pl.nblk > 1 && (p.k.stride[2] != p.d_qk() || p.v.stride[2] != p.d_v());
}

std::size_t workspace_bytes(const AttentionProblem& p, const blocks::FlashConfig& cfg, int threads) {
  const Plan pl = make_plan(p, cfg, threads);
  // The packed float32 K and V rows (forward_packed).
  const std::size_t widened =
      packs_panels(p, pl)
          ? sizeof(float) * static_cast<std::size_t>(p.batch() * p.kv_heads() * p.n_kv() * (p.d_qk() + p.d_v())) + 128
          : 0;
  const auto br = static_cast<std::size_t>(pl.br);
  const std::size_t tiles = p.half_kv() && !pl.key_lanes
                                ? sizeof(float) * static_cast<std::size_t>(pl.bk * (p.d_qk() + p.d_v()))
                                : 0;
  const std::size_t per_thread =
      sizeof(float) * br * static_cast<std::size_t>(p.d_qk() + pl.lds + (pl.key_lanes ? 2 : 1) * p.d_v() + 2) +
      4 * sizeof(index_t) * br + tiles;
  const auto units = static_cast<std::size_t>(pl.items * pl.splits);
  std::size_t partial = 2 * sizeof(index_t) * units;  // schedule: costs and order
  if (pl.splits > 1)
    partial += sizeof(float) * br * units * static_cast<std::size_t>(p.d_v() + 2) +
               sizeof(index_t) * static_cast<std::size_t>(pl.items);
  return per_thread * static_cast<std::size_t>(pl.threads) + partial + widened;
}

void forward(const AttentionProblem& p, const blocks::FlashConfig& cfg, const ExecContext& ctx);

/// The query-lane kernels over packed K/V: the visible K and V rows of every (batch, kv head)
/// panel are copied into contiguous float32 rows in one parallel pass, O(B·Hkv·Nk·(Dk+Dv)) against the O(B·Hq·Nq·Nk·(Dk+Dv)) of attending to them,
/// and the kernels run on the copy.
///
/// Why: every block of query rows streams its panel's whole K and V through the cache. Rows
/// H·D floats apart ([B, N, H, D] storage) put 2 rows of 256 bytes on a 4 KiB page and map onto
/// a few cache sets, so the stream takes a TLB miss every other row, the hardware prefetcher
/// (which stays within a page) follows it poorly, and a tile's rows evict each other; packed,
/// the same rows are one dense stream. One panel at a time would need a smaller copy but a
/// parallel region per panel, and on a shared machine each region's end waits for its slowest
/// thread (measured 1.2× the contiguous time under load, against ~1.0 for one pass).
void forward_packed(const AttentionProblem& p, const blocks::FlashConfig& cfg, const ExecContext& ctx) {
  const index_t B = p.batch(), Hk = p.kv_heads(), nq = p.n_q(), nk = p.n_kv(), dk = p.d_qk(), dv = p.d_v();
  index_t lo = nk, hi = 0;  // the keys some row sees
  for (index_t i = 0; i < nq; ++i) {
    const KeyRange r = p.key_range(i);
    if (!r.empty()) lo = std::min(lo, r.begin), hi = std::max(hi, r.end);
  }
  check_memory(static_cast<std::uint64_t>(B * Hk * nk * (dk + dv)) * 4,
               fmt::format("exact.flash: a contiguous float32 copy of strided K/V ({})", p.describe()));
  // One kept block (ScratchBlock) for both: a call per layer reuses it instead of faulting in
  // fresh pages, which would cost five times the copy.
  const std::size_t kn = static_cast<std::size_t>(B * Hk * nk * dk), kn64 = (kn + 15) / 16 * 16;
  const ScratchBlock block(sizeof(float) * (kn64 + static_cast<std::size_t>(B * Hk * nk * dv)));
  float* const kdata = block.as<float>();
  float* const vdata = kdata + kn64;
  constexpr index_t kChunk = 256;  // rows per packing task
  const index_t chunks = hi > lo ? (hi - lo + kChunk - 1) / kChunk : 0;
  parallel_for(ctx, B * Hk * chunks, [&](std::int64_t t) {
    const index_t c = t % chunks, bh = t / chunks, b = bh / Hk, hk = bh % Hk;
    const index_t j0 = lo + c * kChunk, j1 = std::min(hi, j0 + kChunk);
    float* kd = kdata + bh * nk * dk;
    float* vd = vdata + bh * nk * dv;
    for (index_t j = j0; j < j1; ++j) {
      std::copy_n(p.k.row(b, hk, j), dk, kd + j * dk);
      std::copy_n(p.v.row(b, hk, j), dv, vd + j * dv);
    }
  });
  AttentionProblem s = p;
  s.k = TensorView<const float>::contiguous(kdata, {B, Hk, nk, dk});
  s.v = TensorView<const float>::contiguous(vdata, {B, Hk, nk, dv});
  forward(s, cfg, ctx);
}

void forward(const AttentionProblem& p, const blocks::FlashConfig& cfg, const ExecContext& ctx) {
  const Plan pl = make_plan(p, cfg, ctx.num_threads());
  // Half-precision K/V: the key-lane kernels (decoding) read them in place, the query-lane
  // kernels widen them per tile; strided float32 rows that several blocks re-read are packed.
  if (packs_panels(p, pl)) return forward_packed(p, cfg, ctx);
  const int threads = pl.threads;
  const ExecContext run_ctx{threads};
  const BlockFn block = !pl.key_lanes                      ? block_fn_for<1>(pl.ci)
                        : p.half.type == KvType::kF16  ? &attend_rows<KvType::kF16>
                        : p.half.type == KvType::kBf16 ? &attend_rows<KvType::kBf16>
                                                       : &attend_rows<KvType::kF32>;
  const index_t units = pl.items * pl.splits, dv = p.d_v();

  // Work units (item, split) are handed out one at a time from a shared counter: on a machine
  // shared with other jobs a thread that is descheduled simply takes fewer units. Order: by
  // (batch, kv head), so that consecutive units stream the same K/V (a global heaviest-first
  // order interleaves all heads and measured 20% slower for causal N = 4096 from cache misses),
  // and heaviest first within it, so the run ends on light units. Each unit writes only its
  // own output rows (or its own partial state, merged in split order by whichever thread ends
  // the item's last split), so the result does not depend on which thread ran which unit: it
  // is bitwise reproducible for a given thread count.
  std::vector<index_t> order(static_cast<std::size_t>(units));
  {
    std::vector<index_t> cost(static_cast<std::size_t>(units));
    for (index_t w = 0; w < pl.items; ++w) {
      const KeyRange all = item_keys(p, pl, item_of(p, pl, w));
      for (index_t s = 0; s < pl.splits; ++s) {
        const KeyRange kr = split_keys(pl, all, s);
        cost[static_cast<std::size_t>(w * pl.splits + s)] = kr.end - kr.begin + 16;
      }
    }
    for (index_t u = 0; u < units; ++u) order[static_cast<std::size_t>(u)] = u;
    const index_t per_head = pl.nblk * pl.splits;
    std::stable_sort(order.begin(), order.end(), [&](index_t a, index_t b) {
      if (a / per_head != b / per_head) return a / per_head < b / per_head;
      return cost[static_cast<std::size_t>(a)] > cost[static_cast<std::size_t>(b)];
    });
  }
  std::atomic<index_t> next{0};

  SplitStates parts(pl, units, dv);

  parallel_for(run_ctx, threads, [&](std::int64_t) {
    Scratch ws;
    ws.reserve(p, pl);
    for (index_t k = next.fetch_add(1); k < units; k = next.fetch_add(1)) {
      const index_t u = order[static_cast<std::size_t>(k)];
      const index_t w = u / pl.splits, s = u % pl.splits;
      const Item it = item_of(p, pl, w);
      const KeyRange all = item_keys(p, pl, it);
      if (pl.splits == 1) {
        const State st{ws.m.data(), ws.l.data(), ws.ot.data()};
        block(p, pl, it, all, ws, st);
        finish_block(p, pl, it, st);
        continue;
      }
      block(p, pl, it, split_keys(pl, all, s), ws, parts.state(u));
      parts.finish_if_last(p, pl, it, w);
    }
  });
}

void forward_selected(const AttentionProblem& p, const blocks::SelectKeys& select, const blocks::FlashConfig& cfg,
                      const ExecContext& ctx) {
  // One group = the G rows of one (batch, kv head, query), in key lanes whatever G·Nq is: its
  // keys are its own, so rows of different queries share no tile.
  Plan pl;
  pl.G = p.group();
  pl.rows = pl.G * p.n_q();
  pl.key_lanes = true;
  pl.hpi = 1;
  pl.ci = static_cast<int>(std::clamp<index_t>((pl.G + W - 1) / W, 1, kMaxCI));
  pl.br = pl.ci * W;
  pl.bk = std::clamp<index_t>(cfg.block_k, 1, std::max<index_t>(1, p.n_kv()));
  pl.lds = (pl.bk + W - 1) / W * W;
  const index_t groups = p.batch() * p.kv_heads() * p.n_q();
  pl.nblk = (pl.G + pl.br - 1) / pl.br;  // blocks per group (G > 64 rows)
  pl.items = groups * pl.nblk;
  const double flops_bound = 2.0 * static_cast<double>(p.batch() * p.heads() * p.n_q()) *
                             static_cast<double>(p.n_kv()) * static_cast<double>(p.d_qk() + p.d_v());
  pl.threads = flops_bound < kMinParallelFlopsKeyLanes ? 1 : std::max(1, ctx.num_threads());
  // Few groups (a decode step): split each group's keys so that every thread gets about two
  // units. Not more: a group's few hundred selected keys then stay in runs of several tiles,
  // whose next tile is prefetched while one is computed, and fewer partial states are merged.
  index_t sp = cfg.split_kv;
  if (sp == 0) sp = pl.threads > 1 && pl.items < 2 * pl.threads ? (2 * pl.threads + pl.items - 1) / pl.items : 1;
  pl.splits = std::max<index_t>(1, sp);
  using Over = void (*)(const AttentionProblem&, const Plan&, const Item&, const KeyRange*, index_t, Scratch&, State);
  const Over attend = p.half.type == KvType::kF16    ? &attend_rows_over<KvType::kF16>
                      : p.half.type == KvType::kBf16 ? &attend_rows_over<KvType::kBf16>
                                                     : &attend_rows_over<KvType::kF32>;
  const index_t units = pl.items * pl.splits, dv = p.d_v();
  const auto item = [&](index_t w) {
    const index_t g = w / pl.nblk, blk = w % pl.nblk, qi = g % p.n_q(), bh = g / p.n_q();
    return Item{bh / p.kv_heads(), bh % p.kv_heads(), qi * pl.G + blk * pl.br, std::min(pl.br, pl.G - blk * pl.br)};
  };

  // A group's ranges are chosen once, by the first thread that needs them (or, while it waits
  // for another thread to finish choosing, any group nobody has claimed yet).
  std::vector<std::vector<KeyRange>> chosen(static_cast<std::size_t>(groups));
  std::unique_ptr<std::atomic<int>[]> state = std::make_unique<std::atomic<int>[]>(static_cast<std::size_t>(groups));
  for (index_t g = 0; g < groups; ++g) state[static_cast<std::size_t>(g)].store(0);
  std::atomic<index_t> unclaimed{0};
  const auto choose = [&](index_t g) {
    const index_t bh = g / p.n_q();
    select(bh / p.kv_heads(), bh % p.kv_heads(), g % p.n_q(), chosen[static_cast<std::size_t>(g)]);
    state[static_cast<std::size_t>(g)].store(2, std::memory_order_release);
  };
  const auto claim = [&](index_t g) {
    int expect = 0;
    return state[static_cast<std::size_t>(g)].compare_exchange_strong(expect, 1, std::memory_order_acq_rel);
  };
  const auto ensure = [&](index_t g) {
    if (state[static_cast<std::size_t>(g)].load(std::memory_order_acquire) == 2) return;
    if (claim(g)) return choose(g);
    while (state[static_cast<std::size_t>(g)].load(std::memory_order_acquire) != 2) {
      const index_t o = unclaimed.fetch_add(1);
      if (o < groups && claim(o)) choose(o);
      else if (o >= groups) std::this_thread::yield();
    }
  };

  SplitStates parts(pl, units, dv);
  std::atomic<index_t> next{0};
  parallel_for(ExecContext{pl.threads}, pl.threads, [&](std::int64_t) {
    Scratch ws;
    ws.reserve(p, pl);
    std::vector<KeyRange> piece;
    for (index_t u = next.fetch_add(1); u < units; u = next.fetch_add(1)) {
      const index_t w = u / pl.splits, sidx = u % pl.splits, g = w / pl.nblk;
      const Item it = item(w);
      ensure(g);
      const std::vector<KeyRange>& all = chosen[static_cast<std::size_t>(g)];
      if (pl.splits == 1) {
        const State st{ws.m.data(), ws.l.data(), ws.ot.data()};
        attend(p, pl, it, all.data(), static_cast<index_t>(all.size()), ws, st);
        finish_block(p, pl, it, st);
        continue;
      }
      // Split sidx takes the keys [sidx·chunk, (sidx+1)·chunk) of the ranges laid end to end.
      index_t total = 0;
      for (const KeyRange& r : all) total += r.end - r.begin;
      const index_t chunk = (total + pl.splits - 1) / pl.splits, c0 = sidx * chunk, c1 = std::min(total, c0 + chunk);
      piece.clear();
      index_t at = 0;
      for (const KeyRange& r : all) {
        const index_t len = r.end - r.begin, b = std::max(c0, at), e = std::min(c1, at + len);
        if (b < e) piece.push_back({r.begin + (b - at), r.begin + (e - at)});
        at += len;
      }
      attend(p, pl, it, piece.data(), static_cast<index_t>(piece.size()), ws, parts.state(u));
      parts.finish_if_last(p, pl, it, w);
    }
  });
}

}  // namespace

#endif  // NUMATTN_ISA_COMPILED

}  // namespace numattn::flash::NUMATTN_ISA_NS

#include "core/isa_end.h"

namespace numattn::flash::NUMATTN_ISA_NS {
const Ops* ops() {
#if NUMATTN_ISA_COMPILED
  static constexpr Ops k{workspace_bytes, forward, forward_selected};
  return &k;
#else
  return nullptr;
#endif
}
}  // namespace numattn::flash::NUMATTN_ISA_NS
