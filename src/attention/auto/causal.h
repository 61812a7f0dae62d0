#pragma once

#include <memory>
#include <vector>

#include "numattn/attention/method.h"

namespace numattn {

/// `auto.causal(inner=SPEC, block=256, lse=auto)`: a causal (and sliding-window) form of any
/// non-causal method, by the recursion of HyperAttention's causal section (Han, Jayaram, Karbasi,
/// Mirrokni, Woodruff, Zandieh, "HyperAttention: Long-context Attention in Near-Linear Time",
/// ICLR 2024, Algorithm 4): for a causal problem split the queries in halves; the first half's
/// keys and the second half's diagonal keys are causal again (recursive), the second half's
/// earlier keys are fully visible and go to the non-causal `inner` method; the partial results are
/// merged by log-sum-exp (blocks/lse_merge.h). Recursion stops at parts with max(rows, keys) ≤
/// `block`, computed exactly (the exact.flash kernel).
///
/// Spec: the inner method is a nested spec in a string parameter, e.g.
/// `auto.causal(inner=lowrank.nystrom(landmarks=64),block=256)`. The spec grammar
/// (registry.h) splits parameters at commas outside parentheses, so a nested spec needs no
/// quoting, and every list option that takes several specs already splits that way. The same
/// recursion also runs by itself: AttentionMethod::run gives it every problem whose causal rule or
/// window a method's kernel lacks (method.h, `causal_recursion`), with that method as `inner`,
/// block 256 and lse=auto, keeping the method's own spec. This wrapper names the causal form
/// explicitly and exposes what the automatic one fixes: the exact block size and the source of the
/// normalisers (lse=sparse.hyper keeps the whole near-linear). The canonical spec spells the
/// inner method (and `lse`) in canonical form, so `create_method(m.spec())` round-trips.
///
/// Decomposition. Each query row i sees the keys lo(i) ≤ j ≤ hi(i) (problem.h): hi(i) = i + off
/// under a causal rule (off = Nk − Nq bottom-right, 0 top-left), i + window_right without one;
/// lo(i) = i + off − window_left with a left window; both unbounded when absent. Starting from
/// all rows × all keys, a rectangle (rows [a, c), keys [ka, kb)) is first trimmed to the rows
/// and keys that see / are seen by something in it, then:
/// - nothing visible: skipped (with a window, blocks entirely outside it are never touched);
/// - max(rows, keys) ≤ `block`: exact softmax over the visible part (flash kernel, the part's own
///   window about its diagonal, so no mask is built); small fully visible blocks too, since an
///   inner call on a few hundred keys costs more than exact attention (Nyström's pseudo-inverse);
/// - every key visible to every row: one call of `inner` (non-causal, no window);
/// - otherwise split: at the key hi(a) when it lies inside (keys before it are visible to every
///   row by the causal edge: HyperAttention's off-diagonal block, and the rest is the square
///   diagonal block), else at the key lo(c−1)+1 when inside (the window's edge, mirrored), else
///   the longer side in halves (rows on a tie: HyperAttention's query halving).
/// On a square causal problem of N = block·2^L rows this is exactly the recursion of the paper:
/// off-diagonal blocks of N/2, ..., 2·block rows by `inner`, the last level's (block rows) and
/// the diagonal blocks exact. Nq ≠ Nk: the diagonal is the problem's (bottom-right or top-left),
/// rows that see no key give 0 and LSE −inf, a decode-like problem (few rows over many keys) is
/// one fully visible block and runs `inner` alone. A non-causal problem without a window is one
/// fully visible block: the method is then `inner` (exact when max(Nq, Nk) ≤ block).
///
/// Normalisers (`lse`). Merging needs each block's log-sum-exp. `inner`: the inner method's own
/// (Capabilities::lse; the log of the normaliser its approximation uses — sparse.routing,
/// sparse.kdeformer, exact methods); an error at construction if it has none. A method spec
/// (e.g. `exact.flash`, `sparse.hyper(block=64,samples=64,min_seq_len=1)`): that method's LSE of
/// the same block, run with V replaced by one zero column (only the normaliser is computed);
/// exact.flash gives the exact normaliser, so a block's weight against the diagonal parts is exact
/// and only the direction of its output is the inner method's (costs the Q·Kᵀ half of exact
/// attention on the off-diagonal blocks); HyperAttention's own estimate (sparse.hyper) keeps the
/// whole near-linear. `auto` (default): `inner` when the inner method gives an LSE, else
/// exact.flash. The merged LSE is an output.
///
/// Targets: softmax, or the Gaussian kernel (lowrank.skyformer): then the exact parts and the
/// normaliser estimates run on augmented inputs q̃ = [q, 1], k̃ = [k, −‖k‖²/2], whose softmax is
/// the normalised Gaussian kernel (target.h); the LSE output is that of the logits
/// s·(q·k − ‖k‖²/2), as the float64 reference defines it for that target. Other targets
/// (polynomial, feature maps) are refused at construction: those methods have their own causal
/// forms.
///
/// Refuses (can_run): boolean and additive masks (an off-diagonal block would need the inner
/// method to take the mask); any off-diagonal block the inner method (or the normaliser method)
/// refuses, with its reason and the block. Inner methods of the `auto` and `dist` families and
/// non-deterministic ones are refused at construction.
///
/// Edges: the NaN/±inf guard of blocks/nonfinite_rows.h runs first on the whole problem; keys no
/// row sees are never handed to any part. Each block is run in turn, each parallel inside (the
/// project's parallel_for over batch × heads × row blocks), then merged into the output rows in
/// float64 (lse_merge_into), in a fixed order: bitwise deterministic at a fixed thread count
/// (the exact parts use exact.flash, whose automatic key splitting depends on it). Many small
/// parallel regions per call: on a machine whose cores are taken by other work it slows down
/// more than exact.flash's single region does.
///
/// Error: the inner method's on blocks smaller than the problem; measured on random and real
/// inputs comparable to the inner method's non-causal error on the same inputs
/// (tests/attention/auto_causal_test.cpp, docs/methods.md). Budget: 2·(inner budget) (+ 2·(the
/// normaliser method's budget) when it is approximate) + the exact float32 tolerance.
/// Limit: an exact inner method gives exact attention.
/// Cost (square causal, N rows): over the levels ℓ = 0 .. log2(N/block) − 2, 2^ℓ inner calls on
/// N/2^(ℓ+1) rows × N/2^(ℓ+1) keys; exact attention on about 1.5·N·block visible pairs (diagonal
/// blocks and the last level); the normalisers (lse=exact.flash: Q·Kᵀ and exp of the
/// off-diagonal pairs, about half the work of exact causal attention; measured 0.56 of
/// exact.flash's time with Dv = 64).
/// The recursion itself, for any inner method: AutoCausalAttention runs it with its `inner` and
/// `lse` methods and `block`; AttentionMethod::run runs it for every method whose own kernel lacks
/// the problem's causal rule or window (method.h, `causal_recursion`), with the method itself as
/// `inner`, `block` = kDefaultBlock and the normalisers of `lse=auto`.
namespace causal_recursion {

/// The exact block size of the automatic recursion (AttentionMethod::run): the default of
/// auto.causal, where an inner call on a block starts to cost less than exact attention on it.
inline constexpr index_t kDefaultBlock = 256;

/// One part of the decomposition: rows [a, c) × keys [ka, kb); `full`: every key visible to
/// every row (run by the inner method), else exact over its visible pairs.
struct Part {
  index_t a, c, ka, kb;
  bool full;
};
/// The decomposition of `p` (shapes, causal rule and window only), in the order the parts run.
std::vector<Part> parts(const AttentionProblem& p, index_t block);
/// The normaliser method of `lse=auto` for `inner`: nullptr when `inner` gives its own LSE, else
/// exact.flash (one shared instance).
const AttentionMethod* auto_lse(const AttentionMethod& inner);
/// Boolean and additive masks refused (they would have to reach the inner method), then every
/// fully visible block of `p` probed with `inner` (and `lse`): their refusals, naming the block.
Status can_run(const AttentionMethod& inner, const AttentionMethod* lse, index_t block, const AttentionProblem& p);
/// Peak scratch of `forward`, the largest of its parts' and its own partial results.
std::size_t workspace_bytes(const AttentionMethod& inner, const AttentionMethod* lse, index_t block,
                            const AttentionProblem& p, const ExecContext& ctx);
/// The cost model of `forward` (AttentionMethod::cost): `inner`'s flops and bytes on each fully
/// visible block, `lse`'s on the same block with one value column, exact attention's on the
/// exact parts, and the merge (one read and write of each part's rows).
CostModel cost(const AttentionMethod& inner, const AttentionMethod* lse, index_t block, const AttentionProblem& p);
/// Computes `p.out` (and `p.lse`) by the recursion; `inner` runs only non-causal, windowless
/// blocks through its `forward`. Assumes `can_run`.
void forward(const AttentionMethod& inner, const AttentionMethod* lse, index_t block, const AttentionProblem& p,
             const ExecContext& ctx);

}  // namespace causal_recursion

class AutoCausalAttention final : public AttentionMethod {
 public:
  explicit AutoCausalAttention(ParamValues p);
  static const MethodInfo& describe();
  const MethodInfo& info() const override { return describe(); }
  Target target() const override;
  Status can_run(const AttentionProblem& p) const override;
  std::size_t workspace_bytes(const AttentionProblem& p, const ExecContext& ctx) const override;
  double flops(const AttentionProblem& p) const override;
  double bytes(const AttentionProblem& p) const override;
  void forward(const AttentionProblem& p, const ExecContext& ctx) const override;

  using Part = causal_recursion::Part;
  /// The decomposition of `p` (shapes, causal rule and window only), in the order the parts run.
  std::vector<Part> parts(const AttentionProblem& p) const;
  const AttentionMethod& inner() const { return *inner_; }
  /// The normaliser method, or nullptr when the inner method's own LSE is used.
  const AttentionMethod* lse_method() const { return lse_.get(); }

 private:
  std::unique_ptr<AttentionMethod> inner_, lse_;
};

}  // namespace numattn
