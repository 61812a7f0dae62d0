// The dist family of the method registry: context-parallel exact attention (context_parallel.h)
// behind the AttentionMethod interface.
#pragma once

#include "numattn/attention/method.h"
#include "numattn/dist/context_parallel.h"

namespace numattn::dist {

/// `dist.ring(partition=zigzag|contiguous)` and `dist.ulysses` as registry methods.
///
/// `forward(p)` takes the whole problem, as every method does. On one rank (no MPI, or a
/// process not started by mpirun) it runs the algorithm with one rank: ring attention then
/// computes each (query segment, key segment) pair of its partition with exact.flash and merges
/// them through LSE, which is how the registry-wide tests hold it to the exact contract. Under
/// mpirun with R > 1 ranks it is collective: every rank must call it with the same problem,
/// from the thread that initialised MPI; each rank computes its shard's rows and every rank
/// ends with the whole output (R broadcasts). `numattn run/bench` under mpirun instead give each
/// rank only its shard (context_parallel.h's sharded API), which is what saves memory.
class RingAttention final : public AttentionMethod {
 public:
  using AttentionMethod::AttentionMethod;
  static const MethodInfo& describe();
  const MethodInfo& info() const override { return describe(); }
  std::size_t workspace_bytes(const AttentionProblem& p, const ExecContext& ctx) const override;
  void forward(const AttentionProblem& p, const ExecContext& ctx) const override;
  Partition partition() const { return parse_partition(params_.get_string("partition")); }
};

class UlyssesAttention final : public AttentionMethod {
 public:
  using AttentionMethod::AttentionMethod;
  static const MethodInfo& describe();
  const MethodInfo& info() const override { return describe(); }
  Status can_run(const AttentionProblem& p) const override;
  std::size_t workspace_bytes(const AttentionProblem& p, const ExecContext& ctx) const override;
  void forward(const AttentionProblem& p, const ExecContext& ctx) const override;
};

}  // namespace numattn::dist
