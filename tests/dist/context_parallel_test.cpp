// Single-process tests of the dist layer: partitions, shard-local random inputs, the pair plan
// of ring attention, the one-rank communicator and the dist methods on one rank. The MPI tests
// (2 and 4 ranks) are tests/dist/*_mpi.cpp, run by ctest through mpirun.
#include <gtest/gtest.h>

#include <algorithm>
#include <set>

#include "dist/ring_detail.h"
#include "numattn/analysis/metrics.h"
#include "numattn/attention/accuracy.h"
#include "numattn/attention/reference.h"
#include "numattn/attention/registry.h"
#include "numattn/dist/comm.h"
#include "numattn/dist/context_parallel.h"
#include "numattn/dist/ppl.h"
#include "support/tiny_llama.h"

namespace numattn::dist {
namespace {
namespace NUMATTN_UNITY_ID {

TEST(DistPartition, EveryRowOnceAndZigzagBalancesCausalWork) {
  for (Partition part : {Partition::kContiguous, Partition::kZigzag})
    for (index_t n : {1, 2, 3, 7, 17, 64, 1000})
      for (int R : {1, 2, 3, 4, 8}) {
        std::vector<int> owner(static_cast<std::size_t>(n), -1);
        for (int r = 0; r < R; ++r) {
          const auto segs = shard_segments(n, R, r, part);
          index_t prev_end = -1;
          for (const Segment& s : segs) {
            EXPECT_GT(s.size(), 0);
            EXPECT_GT(s.begin, prev_end) << "segments in increasing order";
            prev_end = s.end;
            for (index_t i = s.begin; i < s.end; ++i) {
              EXPECT_EQ(owner[static_cast<std::size_t>(i)], -1) << "row " << i << " twice";
              owner[static_cast<std::size_t>(i)] = r;
            }
          }
        }
        for (index_t i = 0; i < n; ++i) EXPECT_GE(owner[static_cast<std::size_t>(i)], 0) << "row " << i << " missing";
      }
  // Causal work (visible pairs) per rank at N = 4096, 4 ranks: zigzag within 0.1% of the mean,
  // contiguous off by a factor of 7 between the first and the last rank.
  auto work = [](Partition part, int r) {
    double w = 0;
    for (const Segment& s : shard_segments(4096, 4, r, part))
      for (index_t i = s.begin; i < s.end; ++i) w += static_cast<double>(i + 1);
    return w;
  };
  const double mean = 4096.0 * 4097.0 / 2 / 4;
  for (int r = 0; r < 4; ++r) EXPECT_NEAR(work(Partition::kZigzag, r) / mean, 1.0, 1e-3);
  EXPECT_GT(work(Partition::kContiguous, 3) / work(Partition::kContiguous, 0), 6.0);
  EXPECT_THROW(parse_partition("striped"), Error);
}

TEST(DistPartition, RandomShardHoldsTheSingleProcessValues) {
  for (Dist dist : {Dist::kGaussian, Dist::kUniform, Dist::kSpiky})
    for (Layout layout : {Layout::kBHND, Layout::kBNHD}) {
      ProblemConfig c;
      c.batch = 2, c.heads = 4, c.kv_heads = 2, c.n = 23, c.n_kv = 31, c.d = 5, c.dv = 3;
      c.seed = 11, c.dist = dist, c.layout = layout, c.logit_scale = 3.0;
      RandomProblem full(c);
      const AttentionProblem& fp = full.problem();
      for (int R : {1, 3}) {
        for (int r = 0; r < R; ++r) {
          RandomShard sh(c, r, R, Partition::kZigzag);
          const ShardedProblem& sp = sh.sharded();
          sp.validate(r, R);
          auto same = [&](TensorView<const float> a, TensorView<const float> f, const std::vector<Segment>& segs) {
            index_t lr = 0;
            for (const Segment& s : segs)
              for (index_t i = s.begin; i < s.end; ++i, ++lr)
                for (index_t b = 0; b < a.shape[0]; ++b)
                  for (index_t h = 0; h < a.shape[1]; ++h)
                    for (index_t d = 0; d < a.shape[3]; ++d)
                      ASSERT_EQ(a(b, h, lr, d), f(b, h, i, d)) << to_string(dist) << " row " << i;
          };
          same(sp.local.q, fp.q, sp.q_rows);
          same(sp.local.k, fp.k, sp.kv_rows);
          same(sp.local.v, fp.v, sp.kv_rows);
        }
      }
    }
}

// The pair plan computes exactly the visible (query, key) pairs: brute force over offsets,
// alignments, windows and segment placements.
TEST(DistRing, PairPlanCoversExactlyTheVisiblePairs) {
  struct W {
    index_t l, r;
  };
  int checked = 0;
  for (Causal causal : {Causal::kNone, Causal::kTopLeft, Causal::kBottomRight})
    for (W w : {W{-1, -1}, W{0, -1}, W{3, -1}, W{-1, 2}, W{2, 0}, W{5, 4}, W{0, 0}})
      for (index_t nq : {9, 16})
        for (index_t nk : {9, 16}) {
          AttentionProblem g;
          g.q.shape = {1, 1, nq, 4};
          g.k.shape = g.v.shape = {1, 1, nk, 4};
          g.causal = causal;
          g.window_left = w.l;
          g.window_right = w.r;
          for (index_t qb = 0; qb < nq; qb += 3)
            for (index_t qe : {qb + 1, std::min(nq, qb + 4), nq})
              for (index_t kb = 0; kb < nk; kb += 2)
                for (index_t ke : {kb + 1, std::min(nk, kb + 5), nk}) {
                  if (qe > nq || ke > nk || qe <= qb || ke <= kb) continue;
                  const PairPlan pl = plan_pair(g, {qb, qe}, {kb, ke});
                  // The kernel's view: rows [a, ...), keys [b, ...), causal none, its window.
                  AttentionProblem sub;
                  sub.q.shape = {1, 1, qe - qb - pl.a, 4};
                  sub.k.shape = sub.v.shape = {1, 1, ke - kb - pl.b, 4};
                  sub.window_left = pl.window_left;
                  sub.window_right = pl.window_right;
                  for (index_t i = qb; i < qe; ++i)
                    for (index_t j = kb; j < ke; ++j) {
                      const bool want = g.visible(i, j);
                      const index_t si = i - qb - pl.a, sj = j - kb - pl.b;
                      const bool got = pl.run && si >= 0 && sj >= 0 && sub.visible(si, sj);
                      ASSERT_EQ(got, want) << "causal " << to_string(causal) << " window " << w.l << "," << w.r
                                           << " q[" << qb << "," << qe << ") k[" << kb << "," << ke << ") i=" << i
                                           << " j=" << j;
                    }
                  ++checked;
                }
        }
  EXPECT_GT(checked, 1000);
}

TEST(DistComm, OneRankCommunicatorAndAgreement) {
  Comm& c = self_comm();
  EXPECT_EQ(c.size(), 1);
  EXPECT_EQ(c.rank(), 0);
  EXPECT_NO_THROW(agree(c, ""));
  try {
    agree(c, "bad shard");
    FAIL() << "agree must throw when a rank failed";
  } catch (const AgreedError& e) {
    EXPECT_STREQ(e.what(), "bad shard");
  }
  int x = 0;
  EXPECT_THROW(c.isend(&x, sizeof x, 1, 0), Error);
  std::vector<float> a = {1, 2, 3}, b(3);
  c.alltoallv(a.data(), {12}, {0}, b.data(), {12}, {0});
  EXPECT_EQ(b, a);
}

// On one rank the sharded API equals the float64 reference to the exact float32 tolerance, for
// Nq != Nk, both alignments, a window, GQA and both partitions (the registry-wide conformance
// test covers masks and the edge inputs through dist.ring's forward).
TEST(DistRing, OneRankShardedRunsAreExact) {
  for (Partition part : {Partition::kZigzag, Partition::kContiguous})
    for (Causal causal : {Causal::kNone, Causal::kTopLeft, Causal::kBottomRight})
      for (index_t wl : {-1, 7}) {
        ProblemConfig c;
        c.heads = 4, c.kv_heads = 2, c.n = 45, c.n_kv = 70, c.d = 16, c.dv = 8, c.causal = causal;
        c.window_left = wl;
        c.seed = 5;
        RandomShard sh(c, 0, 1, part);
        ShardedProblem& sp = sh.sharded();
        for (auto alg : {0, 1}) {
          if (alg == 0) ring_attention(self_comm(), sp, ExecContext{2});
          else {
            ShardedProblem cp = sp;
            cp.partition = Partition::kContiguous;
            cp.q_rows = shard_segments(c.n, 1, 0, cp.partition);
            cp.kv_rows = shard_segments(c.n_kv, 1, 0, cp.partition);
            ulysses_attention(self_comm(), cp, ExecContext{2});
          }
          const ReferenceRows ref = reference_all(sp.local, ExecContext{2});
          const ErrorMetrics m = compare_with_reference(sp.local, ref);
          const ExactTolerance tol = exact_f32_tolerance(m.logit_magnitude);
          EXPECT_LE(m.max_scaled_error, tol.max_scaled_error) << (alg ? "ulysses " : "ring ") << to_string(part);
          EXPECT_LE(m.lse_max_abs_error, tol.lse_max_abs_error);
        }
        // The float64 check over the ring agrees: passes here, fails on a corrupted row.
        ring_attention(self_comm(), sp, ExecContext{1});
        EXPECT_TRUE(check_sharded(self_comm(), sp, 1000, 3, ExecContext{1}).passed);
        sp.local.out(0, 1, 20, 3) += 0.01f;
        const DistCheck bad = check_sharded(self_comm(), sp, 1000, 3, ExecContext{1});
        EXPECT_EQ(bad.rows_checked, 4 * 45);
        EXPECT_FALSE(bad.passed);
        EXPECT_NEAR(bad.max_abs_error, 0.01, 1e-4);
      }
}

TEST(DistRing, NonFiniteShardInputIsNamedWithGlobalIndices) {
  ProblemConfig c;
  c.heads = 2, c.n = 40, c.d = 4;
  RandomShard sh(c, 1, 2, Partition::kZigzag);  // rows [10, 20) and [20, 30)
  ShardedProblem& sp = sh.sharded();
  const_cast<float*>(sp.local.k.row(0, 1, 12))[2] = std::nanf("");
  try {
    check_shard_finite(sp);
    FAIL();
  } catch (const NonFiniteInput& e) {
    EXPECT_EQ(e.tensor(), "k");
    EXPECT_EQ(e.index(), (std::vector<index_t>{0, 1, 22, 2}));
  }
}

TEST(DistMethods, RegisteredAndRefusingWhatTheyCannotDo) {
  const auto ring = create_method("dist.ring");
  EXPECT_EQ(ring->spec(), "dist.ring(partition=zigzag)");
  EXPECT_TRUE(ring->info().caps.exact);
  const auto uly = create_method("dist.ulysses");
  ProblemConfig c;
  c.heads = 4, c.kv_heads = 1, c.n = 33, c.d = 8;
  RandomProblem rp(c);
  EXPECT_TRUE(uly->can_run(rp.problem()).is_ok());  // one rank: any kv_heads
  EXPECT_FALSE(ulysses_can_run(rp.problem(), 2).is_ok());
  EXPECT_NE(ulysses_can_run(rp.problem(), 2).reason().find("kv_heads (1) must be a multiple of the 2 ranks"),
            std::string::npos);
}

// The methods that communicate are known by their capability, not their name: exactly the dist
// family has it, and a distributed perplexity refuses them wherever they appear in the per-layer
// list of attn or baseline, before any chunk runs, while any other list runs.
TEST(DistMethods, CommunicatingIsACapabilityThatDistributedPplRefuses) {
  int communicating = 0;
  for (const MethodInfo* info : list_methods()) {
    EXPECT_EQ(info->caps.communicates, info->family == "dist") << info->name;
    communicating += info->caps.communicates;
  }
  EXPECT_EQ(communicating, 2);

  LlamaModel m = LlamaModel::load(test::write_gguf(test::make_tiny(false), "tiny_dist_ppl.gguf"), ExecContext{1});
  std::vector<std::int32_t> toks(40);
  for (std::size_t i = 0; i < toks.size(); ++i) toks[i] = static_cast<std::int32_t>((i * 7 + 3) % 64);
  for (const auto& [attn, baseline] : std::vector<std::pair<std::string, std::string>>{
           {"dist.ring", ""},
           {"exact.flash;dist.ulysses", ""},
           {"exact.flash", "dist.ring(partition=contiguous)"}}) {
    PplOptions o;
    o.ctx = 16;
    o.attn = attn;
    o.baseline = baseline;
    try {
      (void)evaluate_perplexity(self_comm(), m, toks, 1, false, o, ExecContext{1});
      ADD_FAILURE() << attn << " / " << baseline << " must be refused";
    } catch (const OptionError& e) {
      EXPECT_NE(std::string(e.what()).find("cannot run inside a distributed ppl"), std::string::npos) << e.what();
    }
  }
  PplOptions o;
  o.ctx = 16;
  o.attn = "exact.flash;exact.naive";
  o.baseline = "exact.flash";
  EXPECT_GT(evaluate_perplexity(self_comm(), m, toks, 1, false, o, ExecContext{1}).ppl, 1.0);
}

}  // namespace NUMATTN_UNITY_ID
}  // namespace
}  // namespace numattn::dist
