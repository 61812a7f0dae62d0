// Ring attention: K/V shards travel around the ranks; each rank merges its partial results
// exactly through log-sum-exp (context_parallel.h).
#include <algorithm>
#include <chrono>
#include <cmath>
#include <limits>

#include "dist/ring_detail.h"
#include "numattn/attention/blocks/dense_softmax.h"
#include "numattn/attention/blocks/lse_merge.h"
#include "numattn/dist/context_parallel.h"

namespace numattn::dist {

namespace {

constexpr double kNegInf = -std::numeric_limits<double>::infinity();
using Clock = std::chrono::steady_clock;

double since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

}  // namespace

PairPlan plan_pair(const AttentionProblem& g, Segment qs, Segment ks) {
  PairPlan pl;
  const index_t nq = qs.size(), nk = ks.size();
  if (nq <= 0 || nk <= 0) return pl;
  const bool causal = g.causal != Causal::kNone;
  // Visible: i + off − L ≤ j ≤ i + off + U (global), with U = 0 when causal (the window's right
  // edge cannot reach past the diagonal then), else the window's right edge; L its left edge.
  const bool has_u = causal || g.window_right >= 0, has_l = g.window_left >= 0;
  const index_t U = causal ? 0 : g.window_right, L = g.window_left;
  const index_t c0 = qs.begin + g.diag_offset() - ks.begin;  // j_local ≤ i_local + c0 + U
  if (has_u && (nq - 1) + c0 + U < 0) return pl;             // every key after every row's edge
  if (has_l && c0 - L > nk - 1) return pl;                    // every key before every row's edge
  pl.run = true;
  const bool all_u = !has_u || c0 + U >= nk - 1, all_l = !has_l || (nq - 1) + c0 - L <= 0;
  if (all_u && all_l) return pl;  // the whole block is visible to every row: no window
  // Drop the rows above the first visible diagonal (a) and the keys left of every row's window
  // (b); then the visible band is a window about the kernel's own diagonal, t = a − b + c0.
  pl.a = has_u ? std::max<index_t>(0, -U - c0) : 0;
  pl.b = has_l ? std::max<index_t>(0, c0 - L) : 0;
  const index_t t = pl.a - pl.b + c0;
  pl.window_right = has_u ? t + U : -1;
  pl.window_left = has_l ? L - t : -1;
  NUMATTN_ASSERT((!has_u || pl.window_right >= 0) && (!has_l || pl.window_left >= 0));
  NUMATTN_ASSERT(pl.a < nq && pl.b < nk);
  return pl;
}

void attend_pair(const AttentionProblem& g, const PairPlan& pl, Segment qs, Segment ks,
                 TensorView<const float> q, TensorView<const float> k, TensorView<const float> v,
                 TensorView<float> out, TensorView<float> lse, const ExecContext& ctx) {
  AttentionProblem sub;
  auto rows = [](auto t, index_t from) {
    t.data = t.row(0, 0, from);
    t.shape[2] -= from;
    return t;
  };
  sub.q = rows(q, pl.a);
  sub.k = rows(k, pl.b);
  sub.v = rows(v, pl.b);
  sub.out = rows(out, pl.a);
  sub.lse = rows(lse, pl.a);
  sub.scale = g.effective_scale();
  sub.causal = Causal::kNone;
  sub.window_left = pl.window_left;
  sub.window_right = pl.window_right;
  if (g.mask.kind != MaskKind::kNone) {
    sub.mask = g.mask;
    // The block's rows and columns of every (b, h) mask (Mask::stride_b and stride_h carry over).
    const index_t off = (qs.begin + pl.a) * g.mask.ld + ks.begin + pl.b;
    if (g.mask.kind == MaskKind::kBool) sub.mask.allowed += off;
    else sub.mask.additive += off;
  }
  blocks::dense_softmax_attention(sub, ctx);
}

KvRing::KvRing(Comm& comm, const ShardedProblem& sp, index_t max_rows) : comm_(comm), sp_(sp) {
  const int R = comm.size();
  index_t nk_max = 0;
  for (int r = 0; r < R; ++r) {
    segs_.push_back(shard_segments(sp.n_kv, R, r, sp.partition));
    nk_max = std::max(nk_max, rows_of(segs_.back()));
  }
  pieces_ = static_cast<int>(std::max<index_t>(1, (nk_max + max_rows - 1) / std::max<index_t>(1, max_rows)));
  // A piece takes ceil(size / P) rows of each segment (at most two segments).
  index_t rows = 0;
  for (const auto& segs : segs_) {
    index_t r = 0;
    for (const Segment& s : segs) r += (s.size() + pieces_ - 1) / pieces_;
    rows = std::max(rows, r);
  }
  const AttentionProblem& p = sp.local;
  // A block is packed [B, nk, Dk] keys then [B, nk, Dv] values: one message per step.
  cur_.buf.resize(static_cast<std::size_t>(p.batch() * rows * (p.d_qk() + p.d_v())));
  if (R > 1) nxt_.buf.resize(cur_.buf.size());
}

std::vector<Segment> KvRing::piece_segments(int r, int piece) const {
  // Piece j is the j-th part of every segment, not of the rank's rows in order: with zigzag a
  // step then pairs an early and a late piece as the whole block does, and the ranks' work per
  // step stays balanced (cutting the rows in order gave one rank twice the other's work on half
  // of the steps, all of it waited for).
  std::vector<Segment> out;
  for (const Segment& s : segs_[static_cast<std::size_t>(r)]) {
    const index_t n = s.size(), q = n / pieces_, rem = n % pieces_;
    const index_t lo = piece * q + std::min<index_t>(piece, rem), hi = lo + q + (piece < rem ? 1 : 0);
    if (lo < hi) out.push_back({s.begin + lo, s.begin + hi});
  }
  return out;
}

void KvRing::rotate(index_t hk, int piece, const Visit& visit, DistStats& st) {
  const int R = comm_.size(), me = comm_.rank();
  const AttentionProblem& p = sp_.local;
  const index_t B = p.batch(), dk = p.d_qk(), dv = p.d_v();
  auto views = [&](Block& blk) {
    float* k = blk.buf.data();
    float* v = k + B * blk.nk * dk;
    return std::pair{TensorView<const float>(k, {B, 1, blk.nk, dk}, {blk.nk * dk, 0, dk, 1}),
                     TensorView<const float>(v, {B, 1, blk.nk, dv}, {blk.nk * dv, 0, dv, 1})};
  };
  {
    // This rank's rows of the piece, packed: local rows [first, first + nk) of the shard.
    const std::vector<Segment> mine = piece_segments(me, piece);
    cur_.nk = rows_of(mine);
    auto [k, v] = views(cur_);
    index_t j = 0;
    for (const Segment& g : mine) {
      // Local row of global row g.begin in the shard.
      index_t local = 0;
      for (const Segment& s : sp_.kv_rows) {
        if (g.begin >= s.begin && g.begin < s.end) {
          local += g.begin - s.begin;
          break;
        }
        local += s.size();
      }
      for (index_t b = 0; b < B; ++b)
        for (index_t t = 0; t < g.size(); ++t) {
          std::copy_n(p.k.row(b, hk, local + t), dk, const_cast<float*>(k.row(b, 0, j + t)));
          std::copy_n(p.v.row(b, hk, local + t), dv, const_cast<float*>(v.row(b, 0, j + t)));
        }
      j += g.size();
    }
  }
  const int prev = (me - 1 + R) % R, next = (me + 1) % R;
  for (int s = 0; s < R; ++s) {
    const int src = (me - s + R) % R;  // whose block cur_ holds
    Comm::Request sreq = 0, rreq = 0;
    if (s + 1 < R) {
      // Post the exchange first, so that it proceeds while `visit` computes.
      const int from = (me - s - 1 + 2 * R) % R;
      nxt_.nk = rows_of(piece_segments(from, piece));
      const int tag = static_cast<int>((hk * pieces_ + piece) % 32768);
      rreq = comm_.irecv(nxt_.buf.data(), sizeof(float) * static_cast<std::size_t>(B * nxt_.nk * (dk + dv)), prev, tag);
      const std::size_t bytes = sizeof(float) * static_cast<std::size_t>(B * cur_.nk * (dk + dv));
      sreq = comm_.isend(cur_.buf.data(), bytes, next, tag);
      st.bytes_sent += static_cast<double>(bytes);
    }
    auto [k, v] = views(cur_);
    visit(src, piece_segments(src, piece), k, v);
    if (s + 1 < R) {
      st.wait_s += comm_.wait(sreq);
      st.wait_s += comm_.wait(rreq);
      std::swap(cur_, nxt_);
    }
  }
  st.steps += R;
}

void ring_attention(Comm& comm, const ShardedProblem& sp, const ExecContext& ctx, DistStats* stats,
                    index_t piece_rows) {
  const auto t_start = Clock::now();
  const int R = comm.size(), me = comm.rank();
  sp.validate(me, R);
  const AttentionProblem& p = sp.local;
  const AttentionProblem g = sp.global_shape();
  const index_t B = p.batch(), H = p.heads(), Hk = p.kv_heads(), G = p.group(), dk = p.d_qk(),
                dv = p.d_v(), nq = p.q.shape[2];
  DistStats st;
  // Local row offset of each query segment, and the partial buffers (one segment's rows of one
  // GQA group: the largest sub-problem output).
  std::vector<index_t> q_off;
  index_t seg_max = 0;
  for (index_t o = 0; const Segment& s : sp.q_rows) q_off.push_back(o), o += s.size(), seg_max = std::max(seg_max, s.size());
  std::vector<float> part_out(static_cast<std::size_t>(B * G * seg_max * dv)),
      part_lse(static_cast<std::size_t>(B * G * seg_max));
  std::vector<double> acc_lse(static_cast<std::size_t>(B * H * nq), kNegInf);
  NUMATTN_CHECK(piece_rows >= 1, "ring attention: piece_rows must be >= 1, got {}", piece_rows);
  KvRing ring(comm, sp, piece_rows);
  for (index_t hk = 0; hk < Hk; ++hk)
    for (int piece = 0; piece < ring.pieces(); ++piece) {
    ring.rotate(hk, piece, [&](int, const std::vector<Segment>& segs, TensorView<const float> k_all,
                        TensorView<const float> v_all) {
      // This rank's query segments against the block, pair by pair, merged in step order.
      index_t koff = 0;
      for (const Segment& ks : segs) {
        for (std::size_t qi = 0; qi < sp.q_rows.size(); ++qi) {
          const Segment qs = sp.q_rows[qi];
          const PairPlan pl = plan_pair(g, qs, ks);
          if (!pl.run) continue;
          TensorView<const float> q = p.q;
          q.data = p.q.row(0, hk * G, q_off[qi]);
          q.shape = {B, G, qs.size(), dk};
          TensorView<const float> k = k_all, v = v_all;
          k.data = k_all.row(0, 0, koff);
          v.data = v_all.row(0, 0, koff);
          k.shape[2] = v.shape[2] = ks.size();
          const auto o = TensorView<float>::contiguous(part_out.data(), {B, G, qs.size(), dv});
          const auto l = TensorView<float>::contiguous(part_lse.data(), {B, G, qs.size(), 1});
          attend_pair(g, pl, qs, ks, q, k, v, o, l, ctx);
          // Rows above `a` saw no key of the pair and were not written.
          parallel_for(ctx, B * G, [&](std::int64_t bg) {
            const index_t b = bg / G, h = hk * G + bg % G;
            for (index_t i = pl.a; i < qs.size(); ++i) {
              const index_t li = q_off[qi] + i;
              blocks::lse_merge_into(p.out.row(b, h, li), acc_lse[static_cast<std::size_t>((b * H + h) * nq + li)],
                                     o.row(b, bg % G, i), l(b, bg % G, i, 0), dv);
            }
          });
        }
        koff += ks.size();
      }
    }, st);
  }
  // Rows that saw no key anywhere: output 0, lse −inf (problem.h).
  parallel_for(ctx, B * H, [&](std::int64_t bh) {
    const index_t b = bh / H, h = bh % H;
    for (index_t i = 0; i < nq; ++i) {
      const double l = acc_lse[static_cast<std::size_t>((b * H + h) * nq + i)];
      if (l == kNegInf) std::fill_n(p.out.row(b, h, i), dv, 0.f);
      if (!p.lse.empty()) p.lse(b, h, i, 0) = static_cast<float>(l);
    }
  });
  st.total_s = since(t_start);
  if (stats) *stats = st;
}

}  // namespace numattn::dist
