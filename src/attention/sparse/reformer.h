#pragma once

#include <algorithm>
#include <cstdint>
#include <vector>

#include "numattn/attention/method.h"

namespace numattn {

namespace reformer {

/// The LSH chunk windows of one head and one hashing round (Reformer's bucketing; also the
/// sparse support of sparse.scatterbrain).
///
/// Queries and keys are hashed with the same angular LSH (blocks/lsh.h: `buckets` buckets,
/// buckets/2 Gaussian directions; an odd count above 1 is rounded up to even; 1 = no hashing) and
/// each is stably sorted by (bucket, index). Keys are cut into chunks of `chunk` sorted positions.
/// Query i is placed where its (bucket, position p_i) falls in the sorted keys: t_i = (# keys in
/// lower buckets) + (# keys of its bucket with index < p_i), chunk c_i = min(⌊t_i/chunk⌋, chunks−1),
/// with p_i = i + off (causal: its diagonal) or ⌊i·Nk/Nq⌋ (non-causal). With shared QK (keys =
/// normalised queries, same buckets) t_i is the sorted position of key i: Reformer's joint sort.
/// Query i attends to the sorted key positions of its chunk and the previous one (no wrap-around),
/// across buckets, as trax/HF do.
struct Round {
  index_t chunk = 1, nchunks = 0;
  std::vector<index_t> key_order;    ///< sorted position → key index
  std::vector<index_t> key_pos;      ///< key index → sorted position
  std::vector<index_t> query_order;  ///< sorted position → query row (chunks ascend along it)
  std::vector<index_t> query_chunk;  ///< query row → its chunk
  index_t window_begin(index_t c) const { return std::max<index_t>(c - 1, 0) * chunk; }
  index_t window_end(index_t c) const {
    return std::min<index_t>((c + 1) * chunk, static_cast<index_t>(key_order.size()));
  }
};

/// Reformer's automatic bucket count 2^⌊log2(2·n/chunk)⌋ (at least 1).
index_t auto_buckets(index_t n, index_t chunk);

/// Plans one round: q is nq × d (row stride ldq), k is nk × d (ldk); projections of (seed,
/// stream); `off` is the causal diagonal offset, or −1 for the proportional placement.
Round plan_round(const float* q, index_t ldq, index_t nq, const float* k, index_t ldk, index_t nk, index_t d,
                 index_t buckets, index_t chunk, std::uint64_t seed, std::uint64_t stream, bool causal, index_t off);

/// Duplicate counts N_ij of the paper for the keys of one window (sorted positions [w0, w0 + keys)
/// of round `P`): N_ij = the number of rounds (of `count`, starting at `rounds[first]`) whose window
/// for query i holds key j. `prepare` once per window, `row` per query.
struct WindowCounts {
  std::vector<index_t> pos;        ///< count × keys: the window's keys' sorted positions per round
  std::vector<std::int32_t> cnt;   ///< keys: N_ij of the last row
  index_t keys = 0;
  void prepare(const std::vector<Round>& rounds, std::size_t first, int count, const Round& P, index_t w0, index_t n) {
    keys = n;
    pos.resize(static_cast<std::size_t>(count * n));
    cnt.resize(static_cast<std::size_t>(n));
    for (int r = 0; r < count; ++r) {
      const Round& R = rounds[first + static_cast<std::size_t>(r)];
      for (index_t t = 0; t < n; ++t)
        pos[static_cast<std::size_t>(r * n + t)] = R.key_pos[static_cast<std::size_t>(P.key_order[static_cast<std::size_t>(w0 + t)])];
    }
  }
  const std::int32_t* row(const std::vector<Round>& rounds, std::size_t first, int count, index_t i) {
    std::fill(cnt.begin(), cnt.end(), 0);
    for (int r = 0; r < count; ++r) {
      const Round& R = rounds[first + static_cast<std::size_t>(r)];
      const index_t c = R.query_chunk[static_cast<std::size_t>(i)], lo = R.window_begin(c), hi = R.window_end(c);
      const index_t* p = pos.data() + r * keys;
      std::int32_t* n = cnt.data();
      for (index_t t = 0; t < keys; ++t) n[t] += (p[t] >= lo) & (p[t] < hi);
    }
    return cnt.data();
  }
};

}  // namespace reformer

/// `sparse.reformer(buckets=0, rounds=1, chunk=64, shared_qk=false, seed=0)`: Reformer's LSH
/// attention (Kitaev, Kaiser, Levskaya, ICLR 2020). Defaults are HF's (chunk
/// 64, one hash); buckets = 0 is the automatic 2^⌊log2(2N/chunk)⌋.
///
/// Per (batch, query head) and round r (angular projections drawn per (head, round), shared by q
/// and k, which live in the same space): the windows of `reformer::Round`; query i attends with
/// exact logits s_ij = scale·q_i·k_j to the keys W_r(i) of its window. Rounds are merged with the
/// paper's duplicate-count correction: in round r the logit of key j is s_ij − log N_ij, N_ij =
/// the number of rounds whose window holds j for i, so that Σ_r Σ_{j∈W_r(i)} e^{s_ij}/N_ij =
/// Σ_{j∈P_i} e^{s_ij} over the union P_i = ∪_r W_r(i): the log-sum-exp merge of the rounds
/// (blocks/lse_merge.h) is then exact softmax attention over P_i, and the LSE output is the true
/// log Σ_{j∈P_i} e^{s_ij}.
///
/// shared_qk = true (the paper's shared-QK model; needs Nq = Nk): the problem's k is ignored,
/// keys are k_j = q_j/‖q_j‖ of the same query head (logits scale·q_i·q_j/‖q_j‖; a zero q row gives
/// a zero key), values from the problem's v. A token does not attend to itself (logit −inf)
/// unless nothing else is visible to it (below). This changes the mechanism: its error against
/// softmax(QKᵀ) measures that change.
///
/// A row whose windows hold no key it may attend to (shared QK: only itself) attends to the key
/// j = min(i, Nk − 1) alone (its self-key with shared QK), so its output is defined.
///
/// Causal rules and sliding windows: by the causal recursion (auto/causal.h; method.h,
/// `causal_recursion`): the LSH attention above on each fully visible off-diagonal block, exact
/// diagonal blocks, merged with this method's own LSE. Not the paper's causal form (sort all
/// keys by bucket, chunk, mask j > i inside the windows): there a future key's bucket shifts the
/// sorted positions, hence the chunks, of earlier keys, so a future key changes which past keys
/// an earlier row attends to. shared_qk = true has no causal form (refused: the recursion's
/// blocks would take their own rows' queries as keys).
///
/// Target: softmax. Limit: buckets = 1 and chunk ≥ Nk (one window holds every key), one round,
/// shared_qk = false: exact attention. No masks, no window.
/// Cost per head: O(rounds·(N·Dk·buckets/2 + N·2·chunk·(Dk+Dv) + N·2·chunk·rounds)) (hash,
/// attention, duplicate counts); memory O(rounds·N·(Dv + 4)).
class ReformerAttention final : public AttentionMethod {
 public:
  using AttentionMethod::AttentionMethod;
  static const MethodInfo& describe();
  const MethodInfo& info() const override { return describe(); }
  Status can_run(const AttentionProblem& p) const override;
  std::size_t workspace_bytes(const AttentionProblem& p, const ExecContext& ctx) const override;
  double flops(const AttentionProblem& p) const override;
  void forward(const AttentionProblem& p, const ExecContext& ctx) const override;

  /// The rounds of query head (b, h) exactly as forward plans them (for tests).
  std::vector<reformer::Round> plan(const AttentionProblem& p, index_t b, index_t h) const;
  /// The keys of query head (b, h) as forward uses them: the problem's k rows, or the normalised q
  /// rows with shared_qk; `count` × Dk row-major (for tests).
  std::vector<float> keys(const AttentionProblem& p, index_t b, index_t h) const;
};

}  // namespace numattn
