// The conformance harness: holds an attention method to its MethodInfo (capabilities and
// AccuracyContract, include/numattn/attention/accuracy.h) and to the edge semantics of
// problem.h. tests/attention/conformance_test.cpp runs it on every registered method;
// tests/attention/conformance_harness_test.cpp runs it on deliberately broken methods and
// checks that it fails them.
//
// Every error is measured against the method's own target (target.h) in float64: softmax
// attention for most, the Gaussian or polynomial kernel or a feature map for the methods that
// replace softmax.
//
// Every check returns the promises the method broke (empty: it keeps them), so a test can
// assert either way.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "numattn/attention/method.h"
#include "numattn/attention/random_problem.h"

namespace numattn::test {

/// Makes a configured method from a spec string.
using MethodFactory = std::function<std::unique_ptr<AttentionMethod>(const std::string& spec)>;
/// `create_method`.
MethodFactory registry_factory();

/// One broken promise: which check, where (spec, problem, threads), what was measured.
struct Violation {
  std::string check;  ///< declaration | refusal | budget | exact | determinism | limit | convergence | hostile
  std::string where;
  std::string detail;
};
/// One line per violation, for test failure messages.
std::string describe(const std::vector<Violation>& v);
/// Whether some violation has this `check`.
bool has_check(const std::vector<Violation>& v, const std::string& check);

/// `name` or `name(k=v,...)` with `overrides` over the defaults of `info`.
std::string spec_with(const MethodInfo& info, const ParamOverrides& overrides);

/// The parameter sets the budget check runs: the defaults, the contract's samples, and each
/// numeric parameter alone at both ends of its range, each bool flipped, each string choice.
std::vector<ParamOverrides> parameter_sets(const MethodInfo& info);

/// Randomized methods are measured as the median over this many seeds (seed = 1, 2, ...).
inline constexpr int kSeeds = 5;
/// Along a convergence sweep the median error may grow by this factor per step (noise) on top of
/// the exact float32 tolerance, and must end at most `kConvergenceGain` times where it began.
inline constexpr double kConvergenceSlack = 1.1;
inline constexpr double kConvergenceGain = 0.9;

/// The contract is complete: a budget; for approximate methods a limit case or a convergence
/// parameter; named parameters exist; randomized methods have a `seed`.
std::vector<Violation> check_declaration(const MethodInfo& info);

/// Over parameter_sets × a problem matrix (the defaults at every thread count of `threads`, the
/// other parameter sets at its last) (GQA, both causal alignments, Nq ≠ Nk, Dk ≠ Dv, D and
/// N from 1 to 2000, BNHD strides, logits ×100, spiky inputs, boolean masks with empty rows,
/// additive masks with -inf/NaN/-1e30 entries, a sliding window) × `threads`: a refused problem
/// gives a reason and `run` throws; otherwise the output is finite, within the budget (exact
/// methods: within every exact float32 tolerance), bitwise repeatable when deterministic, and
/// exact methods run every problem.
std::vector<Violation> check_budget(const MethodInfo& info, const MethodFactory& make,
                                    const std::vector<int>& threads = {1, 2, 3});

/// At `limit_case(p)` the method meets every exact float32 tolerance (each seed, randomized).
std::vector<Violation> check_limit_case(const MethodInfo& info, const MethodFactory& make,
                                        const std::vector<int>& threads = {1, 2, 3});

/// Along `convergence.values(p)`, ordered so that the budget grows, the median error over seeds
/// does not grow by more than kConvergenceSlack per step (beyond the exact tolerance) and ends
/// at most kConvergenceGain times where it began (unless it began within the exact tolerance).
std::vector<Violation> check_convergence(const MethodInfo& info, const MethodFactory& make);

/// Hostile inputs (problem.h, "Edges"), at each thread count:
/// - NaN, +inf, -inf in q, k and v where a query reads them: `NonFiniteInput` naming the tensor
///   and the element; the same values in keys no query sees (causal, boolean mask): ignored,
///   also by a query that sees no key at all;
/// - additive mask NaN / -inf / -1e30 entries and a fully hidden row: hidden keys, as the
///   reference; +inf: `NonFiniteInput` naming mask [i, j];
/// - logits beyond float32 (scale 1e38): with an LSE an `Error`, without one the right answer
///   (exact methods; others may refuse with an `Error`); logits near 1e37, v near FLT_MAX and
///   dot products whose float32 partial sums overflow: the right answer, finite.
std::vector<Violation> check_hostile(const MethodInfo& info, const MethodFactory& make,
                                     const std::vector<int>& threads = {1, 2, 3});

/// Masks that vary over batch and query head (problem.h Mask::stride_b, stride_h): a padding
/// mask [B, 1, Nq, Nk] and one broadcast over queries too ([B, 1, 1, Nk], ld = 0), a per-head
/// additive ALiBi bias [1, Hq, Nq, Nk] under a causal rule, a row fully hidden in one (b, h)
/// only, and GQA with a per-query-head boolean mask. A method with `Capabilities::head_mask`
/// is held to its budget (exact: the exact tolerances) against the float64 reference; one without
/// must refuse with a reason, and `run` must throw.
std::vector<Violation> check_head_masks(const MethodInfo& info, const MethodFactory& make,
                                        const std::vector<int>& threads = {1, 2});

/// Half-precision Q and output (problem.h HalfQ, HalfOut), f16 and bf16, BHND and BNHD, with f32
/// and half K/V where the method reads them: the result on the rounded inputs `x̂` is compared with
/// the float32 path on the same `x̂`. A method without `Capabilities::half_io` (run converts)
/// must give exactly the float32 path's output rounded once; a half_io method, with e32 the
/// float32 path's error against float64 on x̂, must stay within 2·e32 (float32 output) or
/// 2·e32 + u·|ref| elementwise (half output; u = 2^-11 f16, 2^-8 bf16) of the float64 reference.
/// An infinite or NaN half value in Q that a query reads raises `NonFiniteInput` naming q.
std::vector<Violation> check_half_io(const MethodInfo& info, const MethodFactory& make,
                                     const std::vector<int>& threads = {1, 2});

}  // namespace numattn::test
