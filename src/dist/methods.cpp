#include "dist/methods.h"

#include <algorithm>

#include "attention/method_def.h"

namespace numattn::dist {

namespace {

/// This rank's shard of a whole problem: views when one rank holds everything, else copies of
/// its rows.
class ShardOf {
 public:
  ShardOf(const AttentionProblem& p, int rank, int ranks, Partition part) {
    sp_.n_q = p.n_q();
    sp_.n_kv = p.n_kv();
    sp_.partition = part;
    sp_.q_rows = shard_segments(p.n_q(), ranks, rank, part);
    sp_.kv_rows = shard_segments(p.n_kv(), ranks, rank, part);
    sp_.local = p;
    if (ranks == 1) return;  // the segments cover every row in order: the problem's own views
    auto take = [](TensorView<const float> t, const std::vector<Segment>& segs, std::vector<float>& buf) {
      const index_t n = rows_of(segs), d = t.shape[3];
      buf.resize(static_cast<std::size_t>(t.shape[0] * t.shape[1] * n * d));
      auto dst = TensorView<float>::contiguous(buf.data(), {t.shape[0], t.shape[1], n, d});
      for (index_t b = 0; b < t.shape[0]; ++b)
        for (index_t h = 0; h < t.shape[1]; ++h) {
          index_t r = 0;
          for (const Segment& s : segs)
            for (index_t i = s.begin; i < s.end; ++i, ++r) std::copy_n(t.row(b, h, i), d, dst.row(b, h, r));
        }
      return TensorView<const float>(dst);
    };
    sp_.local.q = take(p.q, sp_.q_rows, q_);
    sp_.local.k = take(p.k, sp_.kv_rows, k_);
    sp_.local.v = take(p.v, sp_.kv_rows, v_);
    const index_t nq = rows_of(sp_.q_rows);
    out_.assign(static_cast<std::size_t>(p.batch() * p.heads() * nq * p.d_v()), 0.f);
    sp_.local.out = TensorView<float>::contiguous(out_.data(), {p.batch(), p.heads(), nq, p.d_v()});
    if (!p.lse.empty()) {
      lse_.assign(static_cast<std::size_t>(p.batch() * p.heads() * nq), 0.f);
      sp_.local.lse = TensorView<float>::contiguous(lse_.data(), {p.batch(), p.heads(), nq, 1});
    }
  }
  const ShardedProblem& sharded() const { return sp_; }

  /// Every rank's rows of out (and lse) into `p` on every rank: rank r broadcasts its shard.
  void share(Comm& comm, const AttentionProblem& p) const {
    const int R = comm.size();
    if (R == 1) return;
    const index_t B = p.batch(), H = p.heads(), dv = p.d_v();
    const index_t per = dv + (p.lse.empty() ? 0 : 1);
    for (int r = 0; r < R; ++r) {
      const auto segs = shard_segments(p.n_q(), R, r, sp_.partition);
      const index_t n = rows_of(segs);
      std::vector<float> buf(static_cast<std::size_t>(B * H * n * per));
      auto walk = [&](auto&& fn) {
        std::size_t o = 0;
        for (index_t b = 0; b < B; ++b)
          for (index_t h = 0; h < H; ++h) {
            index_t local = 0;
            for (const Segment& s : segs)
              for (index_t i = s.begin; i < s.end; ++i, ++local, o += static_cast<std::size_t>(per)) fn(b, h, i, local, buf.data() + o);
          }
      };
      if (r == comm.rank())
        walk([&](index_t b, index_t h, index_t, index_t local, float* x) {
          std::copy_n(sp_.local.out.row(b, h, local), dv, x);
          if (per > dv) x[dv] = sp_.local.lse(b, h, local, 0);
        });
      comm.broadcast(buf.data(), sizeof(float) * buf.size(), r);
      walk([&](index_t b, index_t h, index_t i, index_t, const float* x) {
        std::copy_n(x, dv, p.out.row(b, h, i));
        if (per > dv) p.lse(b, h, i, 0) = x[dv];
      });
    }
  }

 private:
  ShardedProblem sp_;
  std::vector<float> q_, k_, v_, out_, lse_;
};

std::size_t shard_bytes(const AttentionProblem& p, int R) {
  const auto nq = static_cast<std::size_t>((p.n_q() + R - 1) / R), nk = static_cast<std::size_t>((p.n_kv() + R - 1) / R);
  const auto B = static_cast<std::size_t>(p.batch()), H = static_cast<std::size_t>(p.heads()),
             Hk = static_cast<std::size_t>(p.kv_heads()), dk = static_cast<std::size_t>(p.d_qk()),
             dv = static_cast<std::size_t>(p.d_v());
  return R == 1 ? 0 : 4 * (B * H * nq * (dk + dv + 1) + B * Hk * nk * (dk + dv));
}

}  // namespace

const MethodInfo& RingAttention::describe() {
  static const MethodInfo info = [] {
    MethodInfo m;
    m.name = "dist.ring";
    m.family = "dist";
    m.summary =
        "context-parallel exact attention: K/V shards travel around the ranks (non-blocking, "
        "overlapped with exact.flash tiles), partials merged through LSE; zig-zag causal balance";
    m.citation = "Liu et al., Ring Attention with Blockwise Transformers, ICLR 2024";
    m.time_complexity = "O(Nq·Nk·(Dk+Dv)/R) per rank (about half with causal), R steps";
    m.memory_complexity =
        "O(B·Nk/R·(Dk+Dv)) for two K/V blocks of one KV head + O(B·G·Nq/R·Dv) partials";
    m.params = {{"partition", ParamType::kString, "zigzag", 0, 0, {"zigzag", "contiguous"},
                 "how rows are split across ranks: zigzag (chunks r and 2R-1-r, causal work "
                 "balanced) or contiguous"}};
    m.caps = {.exact = true, .causal = true, .gqa = true, .bool_mask = true, .additive_mask = true,
              .window = true, .lse = true, .decode = false, .communicates = true};
    m.accuracy = AccuracyContract::exact({{{"partition", "contiguous"}}});
    return m;
  }();
  return info;
}

std::size_t RingAttention::workspace_bytes(const AttentionProblem& p, const ExecContext& ctx) const {
  const int R = world().size();
  const auto B = static_cast<std::size_t>(p.batch()), G = static_cast<std::size_t>(p.group()),
             dk = static_cast<std::size_t>(p.d_qk()), dv = static_cast<std::size_t>(p.d_v());
  const auto nk = static_cast<std::size_t>((p.n_kv() + R - 1) / R), nq = static_cast<std::size_t>((p.n_q() + R - 1) / R);
  (void)ctx;
  return shard_bytes(p, R) + 4 * (R > 1 ? 2 : 1) * B * nk * (dk + dv) + 4 * B * G * nq * (dv + 1) +
         8 * B * static_cast<std::size_t>(p.heads()) * nq;
}

void RingAttention::forward(const AttentionProblem& p, const ExecContext& ctx) const {
  Comm& comm = world();
  const ShardOf shard(p, comm.rank(), comm.size(), partition());
  collective_section(comm, [&] {
    ring_attention(comm, shard.sharded(), ctx);
    shard.share(comm, p);
  });
}

const MethodInfo& UlyssesAttention::describe() {
  static const MethodInfo info = [] {
    MethodInfo m;
    m.name = "dist.ulysses";
    m.family = "dist";
    m.summary =
        "context-parallel exact attention by head: all-to-all from sequence shards to head "
        "shards, exact.flash on the whole sequence, all-to-all back; needs Hkv % ranks == 0";
    m.citation = "Jacobs et al., DeepSpeed Ulysses, arXiv:2309.14509, 2023";
    m.time_complexity = "O(Nq·Nk·(Dk+Dv)/R) per rank (about half with causal)";
    m.memory_complexity = "O(B·(Hq·Nq·(Dk+Dv) + Hkv·Nk·(Dk+Dv))/R) for the exchanged shards";
    m.caps = {.exact = true, .causal = true, .gqa = true, .bool_mask = true, .additive_mask = true,
              .window = true, .lse = true, .decode = false, .communicates = true};
    m.accuracy = AccuracyContract::exact();
    return m;
  }();
  return info;
}

Status UlyssesAttention::can_run(const AttentionProblem& p) const {
  const Status s = AttentionMethod::can_run(p);
  if (!s.is_ok()) return s;
  return ulysses_can_run(p, world().size());
}

std::size_t UlyssesAttention::workspace_bytes(const AttentionProblem& p, const ExecContext&) const {
  const int R = world().size();
  const auto B = static_cast<std::size_t>(p.batch()), H = static_cast<std::size_t>(p.heads()),
             Hk = static_cast<std::size_t>(p.kv_heads()), dk = static_cast<std::size_t>(p.d_qk()),
             dv = static_cast<std::size_t>(p.d_v()), nq = static_cast<std::size_t>(p.n_q()),
             nk = static_cast<std::size_t>(p.n_kv());
  const auto r = static_cast<std::size_t>(R);
  // Head-sharded q, k, v, out, lse of the whole sequence, plus one send/receive staging buffer.
  const std::size_t full = 4 * B * (H * nq * (dk + dv + 1) + Hk * nk * (dk + dv)) / r;
  return shard_bytes(p, R) + full + 4 * B * H * nq * std::max(dk, dv) / r;
}

void UlyssesAttention::forward(const AttentionProblem& p, const ExecContext& ctx) const {
  Comm& comm = world();
  const ShardOf shard(p, comm.rank(), comm.size(), Partition::kContiguous);
  collective_section(comm, [&] {
    ulysses_attention(comm, shard.sharded(), ctx);
    shard.share(comm, p);
  });
}

}  // namespace numattn::dist

// The registry (attention/registry.cpp) declares these in namespace numattn.
namespace numattn {
using dist::RingAttention;
using dist::UlyssesAttention;
NUMATTN_DEFINE_METHOD(RingAttention)
NUMATTN_DEFINE_METHOD(UlyssesAttention)
}  // namespace numattn
