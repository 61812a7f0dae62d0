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
  bool causal = false;         ///< both causal alignments
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
  /// capabilities; methods add their own limits. Never throws for a valid problem.
  virtual Status can_run(const AttentionProblem& p) const;
  /// The mechanism this method computes or approximates (target.h), at its parameters. Softmax
  /// unless the method replaces it; `AccuracyContract` promises are about this target.
  virtual Target target() const { return Target::softmax(); }
  /// FLOPs of `forward` on `p` under the method's own FLOP model, the numerator of every
  /// GFLOP/s and efficiency figure. Softmax attention's model (`attention_flops`) unless the
  /// method computes another mechanism whose work that model does not count (tensor.simplicial:
  /// key pairs, not query–key products).
  virtual double flops(const AttentionProblem& p) const { return attention_flops(p); }
  /// Peak scratch memory `forward` allocates for `p` on `ctx` (bytes), beyond inputs/outputs.
  virtual std::size_t workspace_bytes(const AttentionProblem& p, const ExecContext& ctx) const {
    return 0;
  }
  /// Computes `p.out` (and `p.lse` when requested). Assumes `validate(p)` and `can_run(p)`.
  /// Needs no checks of its own for the edges of problem.h, only this: a NaN or ±inf met on the
  /// way (input, overflow) must reach the row's output or LSE instead of vanishing (a NaN logit
  /// hidden as if masked, an infinite logit dropped, a NaN normaliser read as an empty row).
  /// `run` settles such rows.
  virtual void forward(const AttentionProblem& p, const ExecContext& ctx) const = 0;

  /// validate + can_run (throws `Error` with the reason) + forward, then the edge check of
  /// problem.h: rows that came out non-finite are traced to a refused input (`NonFiniteInput`),
  /// to a float32 overflow (exact methods: recomputed in float64; others: `Error`), or to an LSE
  /// beyond float32 (`Error`). Costs one pass over the output when nothing is wrong.
  void run(const AttentionProblem& p, const ExecContext& ctx) const;

 protected:
  ParamValues params_;
};

}  // namespace numattn
