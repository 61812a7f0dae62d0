// Collective tests of the dist layer, run under mpirun with 2 and 4 ranks (tests/dist/
// CMakeLists.txt). Every rank builds the same small problem whole (the generator is a counter
// RNG), runs the distributed algorithm on its shard, and checks its own rows against
// exact.flash and the float64 reference on the whole problem.
#include <gtest/gtest.h>

#include <cmath>

#include "numattn/analysis/metrics.h"
#include "numattn/attention/accuracy.h"
#include "numattn/attention/reference.h"
#include "numattn/attention/registry.h"
#include "numattn/dist/comm.h"
#include "numattn/dist/context_parallel.h"

namespace numattn::dist {
namespace {

struct Case {
  index_t heads, kv_heads, n, n_kv, d, dv;
  Causal causal;
  index_t window_left = -1, window_right = -1;
  double logit_scale = 1.0;
};

std::string name(const Case& c) {
  return fmt::format("H={} Hkv={} N={} Nk={} D={} Dv={} causal={} window=({},{}) logits x{}", c.heads, c.kv_heads,
                     c.n, c.n_kv, c.d, c.dv, to_string(c.causal), c.window_left, c.window_right, c.logit_scale);
}

ProblemConfig config(const Case& c) {
  ProblemConfig p;
  p.heads = c.heads, p.kv_heads = c.kv_heads, p.n = c.n, p.n_kv = c.n_kv, p.d = c.d, p.dv = c.dv;
  p.causal = c.causal, p.window_left = c.window_left, p.window_right = c.window_right;
  p.logit_scale = c.logit_scale;
  p.seed = 21;
  return p;
}

// Nq != Nk, uneven shards (N not a multiple of 2R), GQA, windows, both alignments, large logits.
const std::vector<Case>& cases() {
  static const std::vector<Case> cs = {
      {4, 4, 256, 256, 32, 32, Causal::kTopLeft},
      {4, 2, 203, 203, 16, 16, Causal::kNone},
      {4, 4, 77, 190, 16, 8, Causal::kBottomRight},
      {4, 4, 190, 77, 8, 16, Causal::kTopLeft},
      {8, 4, 131, 131, 24, 24, Causal::kTopLeft, 20, -1},
      {4, 4, 100, 100, 16, 16, Causal::kNone, 9, 5},
      {4, 4, 128, 128, 16, 16, Causal::kTopLeft, -1, -1, 30.0},
      {4, 4, 9, 9, 4, 4, Causal::kTopLeft},  // fewer rows than 2R chunks at 4 ranks: empty shards
  };
  return cs;
}

/// This rank's rows of `sp` against the whole problem's exact.flash output and float64
/// reference: max elementwise error within the exact tolerance; with `bitwise`, equal to flash.
void expect_rows(const ShardedProblem& sp, RandomProblem& full, const ReferenceRows& ref, const std::string& what,
                 bool bitwise) {
  AttentionProblem& fp = full.problem();
  const index_t B = fp.batch(), H = fp.heads(), dv = fp.d_v(), N = fp.n_q();
  const ExactTolerance tol = exact_f32_tolerance(ref.logit_magnitude);
  double worst = 0, worst_lse = 0;
  bool equal = true;
  index_t lr = 0;
  for (const Segment& s : sp.q_rows)
    for (index_t i = s.begin; i < s.end; ++i, ++lr)
      for (index_t b = 0; b < B; ++b)
        for (index_t h = 0; h < H; ++h) {
          const std::size_t row = static_cast<std::size_t>((b * H + h) * N + i);
          for (index_t d = 0; d < dv; ++d) {
            const double r = ref.out[row * static_cast<std::size_t>(dv) + static_cast<std::size_t>(d)];
            const float got = sp.local.out(b, h, lr, d);
            worst = std::max(worst, std::abs(got - r) / std::max(1.0, std::abs(r)));
            equal &= got == fp.out(b, h, i, d);
          }
          const double gl = sp.local.lse(b, h, lr, 0), rl = ref.lse[row];
          worst_lse = std::max(worst_lse, gl == rl ? 0.0 : std::abs(gl - rl));
          equal &= sp.local.lse(b, h, lr, 0) == fp.lse(b, h, i, 0);
        }
  EXPECT_LE(worst, tol.max_scaled_error) << what;
  EXPECT_LE(worst_lse, tol.lse_max_abs_error) << what;
  if (bitwise) {
    EXPECT_TRUE(equal) << what << ": not bitwise equal to exact.flash";
  }
}

TEST(DistMpi, RingEqualsSingleProcessOnEveryShard) {
  Comm& comm = world();
  const auto flash = create_method("exact.flash");
  for (const Case& c : cases()) {
    RandomProblem full(config(c));
    flash->run(full.problem(), ExecContext{1});
    const ReferenceRows ref = reference_all(full.problem(), ExecContext{1});
    for (Partition part : {Partition::kZigzag, Partition::kContiguous}) {
      RandomShard sh(config(c), comm.rank(), comm.size(), part);
      DistStats st;
      ring_attention(comm, sh.sharded(), ExecContext{1}, &st);
      expect_rows(sh.sharded(), full, ref, "ring " + std::string(to_string(part)) + " " + name(c), false);
      EXPECT_EQ(st.steps, comm.size() * c.kv_heads);
      // K/V in pieces of at most 13 rows (several messages per rank and head, uneven pieces).
      ring_attention(comm, sh.sharded(), ExecContext{1}, &st, 13);
      expect_rows(sh.sharded(), full, ref, "ring in pieces " + std::string(to_string(part)) + " " + name(c), false);
      EXPECT_GE(st.total_s, st.wait_s);
      // The float64 check over the ring passes on the correct result.
      const DistCheck chk = check_sharded(comm, sh.sharded(), 64, 9, ExecContext{1});
      EXPECT_TRUE(chk.passed) << name(c) << " rel_fro " << chk.rel_fro_error;
      EXPECT_EQ(chk.rows_checked, std::min<index_t>(64, c.heads * c.n));
    }
  }
}

// Ulysses runs exact.flash on whole sequences of whole KV-head groups: on one thread (no
// split-KV) every row is computed exactly as the single process computes it.
TEST(DistMpi, UlyssesIsBitwiseTheSingleProcessFlash) {
  Comm& comm = world();
  const auto flash = create_method("exact.flash");
  for (const Case& c : cases()) {
    if (c.kv_heads % comm.size() != 0) continue;
    RandomProblem full(config(c));
    flash->run(full.problem(), ExecContext{1});
    RandomShard sh(config(c), comm.rank(), comm.size(), Partition::kContiguous);
    ulysses_attention(comm, sh.sharded(), ExecContext{1});
    expect_rows(sh.sharded(), full, reference_all(full.problem(), ExecContext{1}), "ulysses " + name(c), true);
  }
  // Refused alike on every rank, before any message: no hang.
  ProblemConfig bad = config(cases()[0]);
  bad.kv_heads = 1;
  RandomShard sh(bad, comm.rank(), comm.size(), Partition::kContiguous);
  EXPECT_THROW(ulysses_attention(comm, sh.sharded(), ExecContext{1}), Error);
}

// The registry methods under mpirun: every rank passes the whole problem and gets the whole
// output (masks included: each rank reads its rows of the global mask).
TEST(DistMpi, RegistryMethodsGiveEveryRankTheWholeOutput) {
  for (const char* spec : {"dist.ring", "dist.ring(partition=contiguous)", "dist.ulysses"}) {
    const auto m = create_method(spec);
    ProblemConfig c = config({4, 4, 61, 83, 16, 16, Causal::kBottomRight});
    RandomProblem rp(c);
    std::vector<std::uint8_t> allowed(static_cast<std::size_t>(61 * 83));
    for (std::size_t i = 0; i < allowed.size(); ++i) allowed[i] = (i * 7 + i / 83) % 5 != 0;
    rp.set_bool_mask(allowed);
    m->run(rp.problem(), ExecContext{1});
    const ReferenceRows ref = reference_all(rp.problem(), ExecContext{1});
    const ErrorMetrics e = compare_with_reference(rp.problem(), ref);
    const ExactTolerance tol = exact_f32_tolerance(e.logit_magnitude);
    EXPECT_LE(e.max_scaled_error, tol.max_scaled_error) << spec;
    EXPECT_LE(e.lse_max_abs_error, tol.lse_max_abs_error) << spec;
  }
}

// A rank that fails on its own input: every rank gets the same AgreedError naming it.
TEST(DistMpi, OneRankFailingEndsEveryRankWithItsMessage) {
  Comm& comm = world();
  const int bad = comm.size() - 1;
  ProblemConfig c = config(cases()[0]);
  RandomShard sh(c, comm.rank(), comm.size(), Partition::kZigzag);
  if (comm.rank() == bad) const_cast<float*>(sh.sharded().local.v.row(0, 2, 3))[1] = INFINITY;
  try {
    agree_on(comm, [&] { check_shard_finite(sh.sharded()); });
    ADD_FAILURE() << "no rank saw the failure";
  } catch (const AgreedError& e) {
    const std::string msg = e.what();
    EXPECT_EQ(msg.rfind(fmt::format("rank {}: ", bad), 0), 0u) << msg;
    EXPECT_NE(msg.find("v"), std::string::npos) << msg;
  }
  // And the job goes on: the communicator is still usable.
  std::int64_t one = 1;
  comm.allreduce(&one, 1, ReduceOp::kSum);
  EXPECT_EQ(one, comm.size());
}

}  // namespace
}  // namespace numattn::dist
