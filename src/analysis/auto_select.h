#pragma once

#include <map>
#include <memory>
#include <mutex>
#include <tuple>

#include "numattn/attention/method.h"

namespace numattn {

/// `auto.select(tol=0, rows=0, reps=3)`, also written `auto(tol=E)`: the method `advise`
/// (analysis/advise.h) picks on the problem it is given, measured there, then used. It lives in
/// the analysis layer, beside advise, and is registered from src/analysis/methods.inc.
///
/// The first time an instance runs a problem of a given shape (B, Hq, Hkv, Nq, Nk, Dk, Dv,
/// causal rule, window, mask kind) it runs the selection on that very problem: every registered
/// approximate method at its default and along its budget parameter (advise's bisection of the
/// budget ladder), each output's error estimated from one shared sample of rows computed exactly
/// (`rows`; 0 = max(32, √(B·Hq·Nq)), estimate.h), each timed against exact.flash (median of
/// `reps`), and keeps the fastest whose upper bound est_rel_error_hi ≤ tol and that beats
/// exact.flash, or exact.flash when none does (always at tol = 0: no approximation can promise a
/// zero error). It prints the choice to stderr once, then computes with the chosen method; later
/// problems of the same shape reuse the choice without measuring again. In a model
/// (model/llama.h, make_attention_methods) each layer gets its own instance, so each layer picks
/// its own method on its first forward; the stderr line numbers the selections in the order they
/// happen, which in the first forward pass is the layer order.
///
/// Error: what the chosen method's bound promises at level 0.95 on the first problem of the
/// shape (est_rel_error_hi ≤ tol), not a guarantee for later inputs of that shape; the search
/// keeps the cheapest value whose bound passes, so the choice's true error sits near tol (it
/// exceeded it by up to 5% on SmolLM2's layer 15 at N = 8192, docs/methods.md). Cost: the
/// selection, once per shape (about (1 + reps)·(Σ probed candidates' time) + the sample's
/// reference rows), then the chosen method's. Not deterministic across runs (the choice depends
/// on timings); thread-safe (the selection is serialised). Capabilities are exact.flash's, the
/// fallback; candidates that cannot run the problem (a mask, an LSE request) are skipped.
class AutoSelectAttention final : public AttentionMethod {
 public:
  using AttentionMethod::AttentionMethod;
  static const MethodInfo& describe();
  const MethodInfo& info() const override { return describe(); }
  void forward(const AttentionProblem& p, const ExecContext& ctx) const override;
  /// The chosen method's workspace once `p`'s shape was selected; before that the largest of
  /// exact.flash's and every candidate's the selection will run (advise_candidates).
  std::size_t workspace_bytes(const AttentionProblem& p, const ExecContext& ctx) const override;
  /// The method chosen for `p`'s shape (selecting it if this shape was not seen yet).
  std::shared_ptr<const AttentionMethod> choose(const AttentionProblem& p, const ExecContext& ctx) const;

 private:
  using ShapeKey = std::tuple<index_t, index_t, index_t, index_t, index_t, index_t, index_t, int,
                              index_t, index_t, int>;
  static ShapeKey key_of(const AttentionProblem& p);
  mutable std::mutex mu_;
  mutable std::map<ShapeKey, std::shared_ptr<const AttentionMethod>> chosen_;
};

}  // namespace numattn
