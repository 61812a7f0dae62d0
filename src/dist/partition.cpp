// Partitions of a sequence across ranks, the sharded problem, and shard-local random inputs.
#include <cmath>
#include <limits>

#include "numattn/core/memory.h"
#include "numattn/core/rng.h"
#include "numattn/dist/context_parallel.h"

namespace numattn::dist {

Partition parse_partition(const std::string& s) {
  if (s == "zigzag") return Partition::kZigzag;
  if (s == "contiguous") return Partition::kContiguous;
  throw Error(fmt::format("unknown partition '{}' (valid: zigzag, contiguous)", s));
}

const char* to_string(Partition p) { return p == Partition::kZigzag ? "zigzag" : "contiguous"; }

namespace {
/// Piece `k` of `n` rows cut into `parts` near-equal pieces (the first n % parts get one more).
Segment piece(index_t n, index_t parts, index_t k) {
  const index_t q = n / parts, r = n % parts;
  const index_t b = k * q + std::min(k, r);
  return {b, b + q + (k < r ? 1 : 0)};
}
}  // namespace

std::vector<Segment> shard_segments(index_t n, int ranks, int rank, Partition part) {
  NUMATTN_CHECK(ranks >= 1 && rank >= 0 && rank < ranks, "rank {} of {} ranks", rank, ranks);
  std::vector<Segment> s;
  if (part == Partition::kContiguous) {
    s.push_back(piece(n, ranks, rank));
  } else {
    // Chunks r and 2R−1−r: for r = R−1 the two are adjacent and join into one segment.
    const Segment a = piece(n, 2 * ranks, rank), b = piece(n, 2 * ranks, 2 * ranks - 1 - rank);
    if (a.end == b.begin) {
      s.push_back({a.begin, b.end});
    } else {
      s.push_back(a);
      s.push_back(b);
    }
  }
  std::erase_if(s, [](const Segment& g) { return g.size() <= 0; });
  return s;
}

index_t rows_of(const std::vector<Segment>& segs) {
  index_t n = 0;
  for (const Segment& g : segs) n += g.size();
  return n;
}

AttentionProblem ShardedProblem::global_shape() const {
  AttentionProblem g;
  g.q.shape = {local.batch(), local.heads(), n_q, local.d_qk()};
  g.k.shape = {local.batch(), local.kv_heads(), n_kv, local.d_qk()};
  g.v.shape = {local.batch(), local.kv_heads(), n_kv, local.d_v()};
  g.out.shape = {local.batch(), local.heads(), n_q, local.d_v()};
  g.scale = local.scale;
  g.causal = local.causal;
  g.mask = local.mask;
  g.window_left = local.window_left;
  g.window_right = local.window_right;
  return g;
}

void ShardedProblem::validate(int rank, int ranks) const {
  NUMATTN_CHECK(n_q >= 1 && n_kv >= 1, "sharded problem: Nq = {} and Nk = {} must be >= 1", n_q, n_kv);
  const auto qs = shard_segments(n_q, ranks, rank, partition), ks = shard_segments(n_kv, ranks, rank, partition);
  auto same = [](const std::vector<Segment>& a, const std::vector<Segment>& b) {
    if (a.size() != b.size()) return false;
    for (std::size_t i = 0; i < a.size(); ++i)
      if (a[i].begin != b[i].begin || a[i].end != b[i].end) return false;
    return true;
  };
  NUMATTN_CHECK(same(qs, q_rows) && same(ks, kv_rows),
                "sharded problem: rank {}'s rows are not its {} shard of Nq = {}, Nk = {}", rank,
                to_string(partition), n_q, n_kv);
  const index_t nq = rows_of(q_rows), nk = rows_of(kv_rows);
  NUMATTN_CHECK(local.q.shape[2] == nq && local.out.shape[2] == nq,
                "sharded problem: rank {} holds {} query rows, but q has {} and out {}", rank, nq,
                local.q.shape[2], local.out.shape[2]);
  NUMATTN_CHECK(local.k.shape[2] == nk && local.v.shape[2] == nk,
                "sharded problem: rank {} holds {} key rows, but k has {} and v {}", rank, nk,
                local.k.shape[2], local.v.shape[2]);
  // Shapes, GQA, strides, scale: problem.h's rules on the local tensors (empty shards aside).
  if (nq > 0 && nk > 0) numattn::validate(local);
  NUMATTN_CHECK(local.mask.kind == MaskKind::kNone || local.mask.ld >= n_kv,
                "sharded problem: the mask must be the global [Nq, Nk] = [{}, {}] one", n_q, n_kv);
}

void check_shard_finite(const ShardedProblem& sp) {
  const AttentionProblem& p = sp.local;
  auto check = [&](const char* name, const TensorView<const float>& t, const std::vector<Segment>& segs) {
    index_t r = 0;
    for (const Segment& g : segs)
      for (index_t i = g.begin; i < g.end; ++i, ++r)
        for (index_t b = 0; b < t.shape[0]; ++b)
          for (index_t h = 0; h < t.shape[1]; ++h) check_finite_row(name, t.row(b, h, r), t.shape[3], {b, h, i});
  };
  check("q", p.q, sp.q_rows);
  check("k", p.k, sp.kv_rows);
  check("v", p.v, sp.kv_rows);
}

RandomShard::RandomShard(const ProblemConfig& c, int rank, int ranks, Partition part) {
  const index_t B = c.batch, H = c.heads, Hk = c.eff_kv_heads(), N = c.n, Nk = c.eff_n_kv(), D = c.d,
                Dv = c.eff_dv();
  NUMATTN_CHECK(B >= 1 && H >= 1 && Hk >= 1 && N >= 1 && Nk >= 1 && D >= 1 && Dv >= 1,
                "problem sizes must be >= 1 (batch={} heads={} kv_heads={} n={} n_kv={} d={} dv={})",
                B, H, Hk, N, Nk, D, Dv);
  NUMATTN_CHECK_OPTION(H % Hk == 0, "kv_heads", "heads ({}) must be a multiple of kv_heads ({})", H, Hk);
  sp_.n_q = N;
  sp_.n_kv = Nk;
  sp_.partition = part;
  sp_.q_rows = shard_segments(N, ranks, rank, part);
  sp_.kv_rows = shard_segments(Nk, ranks, rank, part);
  const index_t nq = rows_of(sp_.q_rows), nk = rows_of(sp_.kv_rows);
  constexpr const char* what = "random shard size";
  const index_t floats = checked_add(
      checked_add(checked_mul(checked_mul(B * H, nq, what), D + Dv, what),
                  checked_mul(checked_mul(B * Hk, nk, what), D + Dv, what), what),
      B * H * nq, what);
  check_memory(static_cast<std::uint64_t>(checked_mul(floats, 4, what)),
               fmt::format("rank {}'s shard of the random problem ({} query and {} key rows)", rank, nq, nk));
  q_.resize(static_cast<std::size_t>(B * H * nq * D));
  k_.resize(static_cast<std::size_t>(B * Hk * nk * D));
  v_.resize(static_cast<std::size_t>(B * Hk * nk * Dv));
  out_.assign(static_cast<std::size_t>(B * H * nq * Dv), 0.f);
  auto qv = TensorView<float>::contiguous(q_.data(), {B, H, nq, D});
  auto kv = TensorView<float>::contiguous(k_.data(), {B, Hk, nk, D});
  auto vv = TensorView<float>::contiguous(v_.data(), {B, Hk, nk, Dv});
  // Segment by segment: a segment's rows are consecutive global rows.
  auto fill = [&](char which, TensorView<float> t, const std::vector<Segment>& segs) {
    index_t r = 0;
    for (const Segment& g : segs) {
      TensorView<float> part = t;
      part.data = t.row(0, 0, r);
      part.shape[2] = g.size();
      fill_random_rows(c, which, g.begin, part);
      r += g.size();
    }
  };
  fill('q', qv, sp_.q_rows);
  fill('k', kv, sp_.kv_rows);
  fill('v', vv, sp_.kv_rows);
  AttentionProblem& p = sp_.local;
  p.q = qv;
  p.k = kv;
  p.v = vv;
  p.out = TensorView<float>::contiguous(out_.data(), {B, H, nq, Dv});
  if (c.want_lse) {
    lse_.assign(static_cast<std::size_t>(B * H * nq), 0.f);
    p.lse = TensorView<float>::contiguous(lse_.data(), {B, H, nq, 1});
  }
  p.scale = c.scale;
  p.causal = c.causal;
  p.window_left = c.window_left;
  p.window_right = c.window_right;
}

std::size_t RandomShard::bytes() const {
  return 4 * (q_.size() + k_.size() + v_.size() + out_.size() + lse_.size());
}

}  // namespace numattn::dist
