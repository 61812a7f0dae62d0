/// @file method.h
/// The one interface every attention method implements, and its self-description.
///
/// A method is created from a spec string by the registry (registry.h); its parameters are
/// declared as a schema (`ParamSpec`) that one generic parser validates, so `spec()` is the
/// canonical identity of an experiment and `create(m.spec())` round-trips.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "numattn/attention/accuracy.h"
#include "numattn/attention/problem.h"
#include "numattn/attention/target.h"
#include "numattn/core/error.h"
#include "numattn/core/exec.h"

namespace numattn {

enum class ParamType { kInt, kFloat, kBool, kString };

/// One declared parameter: name, type, default, range (numbers) or choices (strings), doc.
struct ParamSpec {
  std::string name;
  ParamType type = ParamType::kInt;
  std::string default_value;
  double min = 0, max = 0;                ///< inclusive range for kInt / kFloat
  std::vector<std::string> choices;       ///< allowed values for kString (empty = any)
  std::string doc;
};

/// What a method can do. The registry-wide tests and the CLI read these; `can_run` is the
/// per-problem answer.
struct Capabilities {
  bool exact = false;          ///< equals softmax attention up to rounding
  /// Both causal alignments by the method's own kernel. Without it (and likewise without
  /// `window`), `run` still computes causal and sliding-window problems when the method can be the
  /// inner method of the causal recursion (AttentionMethod::causal_recursion).
  bool causal = false;
  bool gqa = true;             ///< Hq != Hkv
  bool bool_mask = false;
  bool additive_mask = false;
  bool window = false;         ///< sliding window
  bool lse = false;            ///< log-sum-exp output
  bool decode = false;         ///< has a fast path for few queries over a long KV
  bool dk_ne_dv = true;        ///< Dk != Dv
  bool strided = true;         ///< arbitrary strides (last dim contiguous)
  bool deterministic = true;   ///< bitwise-equal results across runs at a fixed thread count
  bool randomized = false;     ///< draws from the seeded RNG (has a `seed` parameter)
  bool half_kv = false;        ///< reads half-precision K/V (problem.h HalfKv)
  /// Reads half-precision Q and writes half-precision output natively (problem.h HalfQ,
  /// HalfOut); `run` converts for the others.
  bool half_io = false;
  /// Honours a mask that varies over batch and query head (problem.h Mask::stride_b, stride_h).
  bool head_mask = false;
  /// Collective across ranks (dist.*, dist/context_parallel.h): under mpirun every rank must call
  /// it together, so it cannot run inside work that ranks split among themselves (a distributed
  /// perplexity), inside another method, or as an advise candidate.
  bool communicates = false;
};

struct MethodInfo {
  std::string name;            ///< "family.name", e.g. "exact.flash"
  std::string family;          ///< exact | sparse | lowrank | kernel | latent | tensor
  std::string summary;         ///< one line
  std::string citation;        ///< one line
  std::string time_complexity;    ///< per head, e.g. "O(Nq·Nk·(Dk+Dv))"
  std::string memory_complexity;  ///< extra memory beyond inputs and output
  std::vector<ParamSpec> params;
  Capabilities caps;
  /// Its error promise (accuracy.h); the conformance test holds the method to it.
  AccuracyContract accuracy;
};

/// Validated parameter values of one method, in schema order.
class ParamValues {
 public:
  ParamValues() = default;
  ParamValues(const std::vector<ParamSpec>* schema, std::map<std::string, std::string> values)
      : schema_(schema), values_(std::move(values)) {}
  std::int64_t get_int(const std::string& name) const;
  double get_float(const std::string& name) const;
  bool get_bool(const std::string& name) const;
  const std::string& get_string(const std::string& name) const;
  /// "k1=v1,k2=v2" in schema order with every default filled in ("" when no parameters).
  std::string canonical() const;

 private:
  const std::string& raw(const std::string& name) const;
  const std::vector<ParamSpec>* schema_ = nullptr;
  std::map<std::string, std::string> values_;
};

/// A method's own cost model of one call: what `bench` turns into a predicted time (FLOPs at the
/// same-run sgemm rate, bytes at the same-run memory bandwidth, the larger of the two).
struct CostModel {
  double flops = 0;  ///< floating-point operations, a multiply-add counting 2
  double bytes = 0;  ///< bytes moved to or from memory at least
};

/// Bytes every method moves on `p` at least: q, k, v (and the mask) read once, the output (and
/// LSE) written once, float32.
double attention_io_bytes(const AttentionProblem& p);

/// Scratch that a method's default byte model assumes stays in cache (a core's L2); beyond it,
/// its workspace is written to memory and read back once.
inline constexpr double kCacheResidentBytes = 1 << 20;

/// Base class of every attention method.
///
/// Life cycle: the registry constructs it from validated parameters; `forward` is `const`,
/// allocates only its declared workspace and may be called concurrently.
class AttentionMethod {
 public:
  explicit AttentionMethod(ParamValues params) : params_(std::move(params)) {}
  virtual ~AttentionMethod() = default;

  virtual const MethodInfo& info() const = 0;
  /// Canonical spec: `name` or `name(k=v,...)` with all defaults filled in.
  std::string spec() const;
  const ParamValues& params() const { return params_; }

  /// Whether this method can run `p`, and why not. The default checks the declared
  /// capabilities (a causal rule or a window the kernel lacks: the causal recursion's own refusals,
  /// masks, and the method's refusals of each fully visible block); methods add their own limits.
  /// Never throws for a valid problem.
  virtual Status can_run(const AttentionProblem& p) const;

  /// Whether the method can be the inner method of the causal recursion (src/attention/auto/causal.h;
  /// Han, Jayaram, Karbasi, Mirrokni, Woodruff, Zandieh, "HyperAttention: Long-context Attention in
  /// Near-Linear Time", ICLR 2024, Algorithm 4), which `run` then applies to every problem whose
  /// causal rule or sliding window its kernel lacks (`Capabilities::causal`, `window`): the
  /// problem is split into square diagonal parts computed exactly (max(rows, keys) ≤ 256, the
  /// exact.flash kernel) and fully visible off-diagonal blocks given to this method's non-causal
  /// `forward`, merged by log-sum-exp (normalisers: the method's own LSE when it has one, else
  /// exact.flash's). The method keeps its name, spec and parameters. It needs a target whose blocks
  /// merge that way (softmax, or the Gaussian kernel on augmented inputs), determinism, and not to
  /// be of the auto or dist families (they have their own causal forms). Boolean and additive
  /// masks are refused on such problems; a row reads no key it does not see, so future keys
  /// (poisoned, NaN) never reach it. Cost: that of auto.causal (auto/causal.h).
  bool causal_recursion() const;
  /// Whether `run` computes `p` by the causal recursion: `p` has a causal rule or a window that
  /// the kernel lacks, and `causal_recursion()`.
  bool runs_by_recursion(const AttentionProblem& p) const;
  /// Causal problems run, natively or by the recursion: `caps.causal || causal_recursion()`.
  bool runs_causal() const { return info().caps.causal || causal_recursion(); }
  /// The mechanism this method computes or approximates (target.h), at its parameters. Softmax
  /// unless the method replaces it; `AccuracyContract` promises are about this target.
  virtual Target target() const { return Target::softmax(); }
  /// FLOPs of `forward` on `p` under the method's own FLOP model, the numerator of every
  /// GFLOP/s and efficiency figure. Softmax attention's model (`attention_flops`) unless the
  /// method computes another mechanism whose work that model does not count (tensor.simplicial:
  /// key pairs, not query–key products).
  virtual double flops(const AttentionProblem& p) const { return attention_flops(p); }
  /// Bytes `forward` must move to or from memory on `p` under the method's own model, the
  /// memory side of `bench`'s predicted time: `attention_io_bytes(p)` plus, when its one-thread
  /// workspace exceeds kCacheResidentBytes, that workspace written once and read back once.
  /// Methods whose intermediates are streamed several times override it.
  virtual double bytes(const AttentionProblem& p) const;
  /// The cost model of what `run` does on `p`: `flops(p)` and `bytes(p)`, or, for a problem
  /// given to the causal recursion (`runs_by_recursion`), the sum over its parts: the method's
  /// model on each fully visible block, the normaliser method's on the same blocks (V of one
  /// column), and exact attention (attention_flops, attention_io_bytes) on the exact parts.
  CostModel cost(const AttentionProblem& p) const;
  /// Peak scratch memory `forward` allocates for `p` on `ctx` (bytes), beyond inputs/outputs.
  virtual std::size_t workspace_bytes(const AttentionProblem& p, const ExecContext& ctx) const {
    return 0;
  }
  /// Computes `p.out` (and `p.lse` when requested). Assumes `validate(p)` and `can_run(p)`, and
  /// that `p` has no causal rule or window the kernel lacks (`run` gives those to the recursion).
  /// Needs no checks of its own for the edges of problem.h, only this: a NaN or ±inf met on the
  /// way (input, overflow) must reach the row's output or LSE instead of vanishing (a NaN logit
  /// hidden as if masked, an infinite logit dropped, a NaN normaliser read as an empty row).
  /// `run` settles such rows.
  virtual void forward(const AttentionProblem& p, const ExecContext& ctx) const = 0;

  /// validate + can_run (throws `Error` with the reason) + forward (or the causal recursion around
  /// it, `runs_by_recursion`), then the edge check of
  /// problem.h: rows that came out non-finite are traced to a refused input (`NonFiniteInput`),
  /// to a float32 overflow (exact methods: recomputed in float64; others: `Error`), or to an LSE
  /// beyond float32 (`Error`). Costs one pass over the output when nothing is wrong.
  void run(const AttentionProblem& p, const ExecContext& ctx) const;

 protected:
  ParamValues params_;
};

}  // namespace numattn
