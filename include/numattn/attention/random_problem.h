/// @file random_problem.h
/// Seeded random attention problems: what `numattn run/bench`, the tests and the benchmarks
/// feed to every method.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "numattn/attention/problem.h"

namespace numattn {

/// Distribution of the random Q, K, V entries.
/// - gaussian: N(0, 1)
/// - uniform:  U[-1, 1)
/// - spiky:    N(0, 1) plus, on ~2% of keys, a large shared component so that a few keys
///             dominate each softmax row (heavy-hitter attention, as in real LLMs).
enum class Dist { kGaussian, kUniform, kSpiky };
Dist parse_dist(const std::string& s);
const char* to_string(Dist d);

struct ProblemConfig {
  index_t batch = 1, heads = 8, kv_heads = 0;  ///< kv_heads 0 = heads
  index_t n = 1024, n_kv = 0;                  ///< n_kv 0 = n
  index_t d = 64, dv = 0;                      ///< dv 0 = d
  Causal causal = Causal::kNone;
  std::optional<double> scale;
  std::uint64_t seed = 0;
  Dist dist = Dist::kGaussian;
  double logit_scale = 1.0;  ///< q is multiplied by this (logits ×X)
  Layout layout = Layout::kBHND;
  bool want_lse = true;
  index_t window_left = -1, window_right = -1;

  index_t eff_kv_heads() const { return kv_heads > 0 ? kv_heads : heads; }
  index_t eff_n_kv() const { return n_kv > 0 ? n_kv : n; }
  index_t eff_dv() const { return dv > 0 ? dv : d; }
};

/// Writes rows [row0, row0 + dst.shape[2]) of tensor `which` ('q', 'k' or 'v') of the random
/// problem `cfg` into `dst` ([B, H, rows, D], any strides with a contiguous last dimension): the
/// values `RandomProblem(cfg)` holds at those rows. Every element is a function of its index in
/// the full tensor (counter RNG), so a rank of a distributed run generates its shard alone and
/// gets the single-process values; RandomProblem itself fills through this function.
void fill_random_rows(const ProblemConfig& cfg, char which, index_t row0, TensorView<float> dst);

/// Owns the buffers of one random problem. Not copyable (views point into it).
class RandomProblem {
 public:
  explicit RandomProblem(const ProblemConfig& cfg);
  RandomProblem(const RandomProblem&) = delete;
  RandomProblem& operator=(const RandomProblem&) = delete;

  /// The problem; `out` and `lse` point at this object's output buffers.
  const AttentionProblem& problem() const { return problem_; }
  AttentionProblem& problem() { return problem_; }
  const ProblemConfig& config() const { return cfg_; }
  /// Sets a boolean or additive `[Nq, Nk]` mask (copied).
  void set_bool_mask(const std::vector<std::uint8_t>& allowed);
  void set_additive_mask(const std::vector<float>& add);
  /// Requests (or drops) the LSE output of the problem.
  void set_lse(bool on);
  /// Bytes of q, k, v, out, lse.
  std::size_t bytes() const;
  std::vector<float>& q_data() { return q_; }
  std::vector<float>& k_data() { return k_; }
  std::vector<float>& v_data() { return v_; }
  std::vector<float>& out_data() { return out_; }

 private:
  ProblemConfig cfg_;
  std::vector<float> q_, k_, v_, out_, lse_, add_mask_;
  std::vector<std::uint8_t> bool_mask_;
  AttentionProblem problem_;
};

}  // namespace numattn
