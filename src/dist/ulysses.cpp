// Ulysses: all-to-all from sequence shards to head shards, local exact attention on the whole
// sequence, all-to-all back (context_parallel.h).
#include <chrono>

#include "numattn/attention/blocks/dense_softmax.h"
#include "numattn/dist/context_parallel.h"

namespace numattn::dist {

namespace {
using Clock = std::chrono::steady_clock;
double since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }
}  // namespace

Status ulysses_can_run(const AttentionProblem& g, int ranks) {
  if (g.kv_heads() % ranks != 0)
    return Status::unsupported(fmt::format(
        "Ulysses gives each rank whole KV heads: kv_heads ({}) must be a multiple of the {} ranks "
        "(use dist.ring)",
        g.kv_heads(), ranks));
  return Status::ok();
}

void ulysses_attention(Comm& comm, const ShardedProblem& sp, const ExecContext& ctx, DistStats* stats) {
  const auto t_start = Clock::now();
  const int R = comm.size(), me = comm.rank();
  sp.validate(me, R);
  NUMATTN_CHECK(sp.partition == Partition::kContiguous,
                "Ulysses needs the contiguous partition (each rank's rows one segment), got {}",
                to_string(sp.partition));
  const AttentionProblem& p = sp.local;
  const AttentionProblem g = sp.global_shape();
  const Status can = ulysses_can_run(g, R);
  NUMATTN_CHECK(can.is_ok(), "{}", can.reason());
  const index_t B = p.batch(), H = p.heads(), Hk = p.kv_heads(), dk = p.d_qk(), dv = p.d_v();
  const index_t Hr = H / R, Hkr = Hk / R;  // heads per rank after the exchange
  std::vector<Segment> q_seg(static_cast<std::size_t>(R)), k_seg(q_seg.size());
  for (int r = 0; r < R; ++r) {
    const auto qs = shard_segments(sp.n_q, R, r, sp.partition), ks = shard_segments(sp.n_kv, R, r, sp.partition);
    q_seg[static_cast<std::size_t>(r)] = qs.empty() ? Segment{} : qs[0];
    k_seg[static_cast<std::size_t>(r)] = ks.empty() ? Segment{} : ks[0];
  }
  const index_t nq = p.q.shape[2];
  DistStats st;

  // The head-sharded full sequences are stored [N, B, heads, D] (sequence-major), so that each
  // source rank's rows are one contiguous run: the all-to-all writes them in place.
  auto seq_major = [](float* data, index_t b, index_t h, index_t n, index_t d) {
    return TensorView<float>(data, {b, h, n, d}, {h * d, d, b * h * d, 1});
  };
  // Sends rows of `t` (this rank's shard) for every destination's heads and receives every
  // source's rows for this rank's heads into `full` ([N, B, hr, D]).
  auto exchange = [&](TensorView<const float> t, index_t hr, const std::vector<Segment>& segs,
                      index_t n, std::vector<float>& full) {
    const index_t n_local = t.shape[2], d = t.shape[3];
    std::vector<float> send(static_cast<std::size_t>(n_local * B * hr * d * R));
    std::vector<std::size_t> sb(static_cast<std::size_t>(R)), sd(sb.size()), rb(sb.size()), rd(sb.size());
    for (int r = 0; r < R; ++r) {
      const std::size_t off = static_cast<std::size_t>(r) * static_cast<std::size_t>(n_local * B * hr * d);
      for (index_t i = 0; i < n_local; ++i)
        for (index_t b = 0; b < B; ++b)
          for (index_t h = 0; h < hr; ++h)
            std::copy_n(t.row(b, r * hr + h, i), d, send.data() + off + static_cast<std::size_t>(((i * B + b) * hr + h) * d));
      sb[static_cast<std::size_t>(r)] = sizeof(float) * static_cast<std::size_t>(n_local * B * hr * d);
      sd[static_cast<std::size_t>(r)] = sizeof(float) * off;
      const Segment s = segs[static_cast<std::size_t>(r)];
      rb[static_cast<std::size_t>(r)] = sizeof(float) * static_cast<std::size_t>(s.size() * B * hr * d);
      rd[static_cast<std::size_t>(r)] = sizeof(float) * static_cast<std::size_t>(s.begin * B * hr * d);
      if (r != me) st.bytes_sent += static_cast<double>(sb[static_cast<std::size_t>(r)]);
    }
    full.resize(static_cast<std::size_t>(n * B * hr * d));
    const auto t0 = Clock::now();
    comm.alltoallv(send.data(), sb, sd, full.data(), rb, rd);
    st.wait_s += since(t0);
  };
  std::vector<float> qf, kf, vf;
  exchange(p.q, Hr, q_seg, sp.n_q, qf);
  exchange(p.k, Hkr, k_seg, sp.n_kv, kf);
  exchange(p.v, Hkr, k_seg, sp.n_kv, vf);

  // Exact attention on the whole sequence for this rank's heads: the global problem's causal
  // rule, window and mask apply as they are, since rows and keys are in global order.
  std::vector<float> of(static_cast<std::size_t>(sp.n_q * B * Hr * dv)), lf(static_cast<std::size_t>(sp.n_q * B * Hr));
  AttentionProblem loc;
  loc.q = seq_major(qf.data(), B, Hr, sp.n_q, dk);
  loc.k = seq_major(kf.data(), B, Hkr, sp.n_kv, dk);
  loc.v = seq_major(vf.data(), B, Hkr, sp.n_kv, dv);
  loc.out = seq_major(of.data(), B, Hr, sp.n_q, dv);
  loc.lse = seq_major(lf.data(), B, Hr, sp.n_q, 1);
  loc.scale = g.effective_scale();
  loc.causal = g.causal;
  loc.mask = g.mask;
  loc.window_left = g.window_left;
  loc.window_right = g.window_right;
  if (Hr > 0) blocks::dense_softmax_attention(loc, ctx);
  qf = {}, kf = {}, vf = {};

  // Back: rank r's rows of this rank's heads, [n_r, B, Hr, Dv] runs of `of` (and of `lf`).
  auto back = [&](const std::vector<float>& full, index_t d, auto&& store) {
    std::vector<std::size_t> sb(static_cast<std::size_t>(R)), sd(sb.size()), rb(sb.size()), rd(sb.size());
    for (int r = 0; r < R; ++r) {
      const Segment s = q_seg[static_cast<std::size_t>(r)];
      sb[static_cast<std::size_t>(r)] = sizeof(float) * static_cast<std::size_t>(s.size() * B * Hr * d);
      sd[static_cast<std::size_t>(r)] = sizeof(float) * static_cast<std::size_t>(s.begin * B * Hr * d);
      rb[static_cast<std::size_t>(r)] = sizeof(float) * static_cast<std::size_t>(nq * B * Hr * d);
      rd[static_cast<std::size_t>(r)] = static_cast<std::size_t>(r) * rb[static_cast<std::size_t>(r)];
      if (r != me) st.bytes_sent += static_cast<double>(sb[static_cast<std::size_t>(r)]);
    }
    std::vector<float> recv(static_cast<std::size_t>(R * nq * B * Hr * d));
    const auto t0 = Clock::now();
    comm.alltoallv(full.data(), sb, sd, recv.data(), rb, rd);
    st.wait_s += since(t0);
    for (int r = 0; r < R; ++r)
      for (index_t i = 0; i < nq; ++i)
        for (index_t b = 0; b < B; ++b)
          for (index_t h = 0; h < Hr; ++h)
            store(b, r * Hr + h, i, recv.data() + static_cast<std::size_t>((((r * nq + i) * B + b) * Hr + h) * d));
  };
  back(of, dv, [&](index_t b, index_t h, index_t i, const float* src) { std::copy_n(src, dv, p.out.row(b, h, i)); });
  if (!p.lse.empty()) back(lf, 1, [&](index_t b, index_t h, index_t i, const float* src) { p.lse(b, h, i, 0) = *src; });
  st.steps = 2;
  st.total_s = since(t_start);
  if (stats) *stats = st;
}

}  // namespace numattn::dist
