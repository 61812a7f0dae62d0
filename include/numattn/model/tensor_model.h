/// @file tensor_model.h
/// Tensor compression (transform/tensor_heads.h) applied to a whole Llama model at load:
/// `numattn ppl --tensor SPEC`.
///
/// Execution: the compressed model is run as an ordinary Llama model whose weights are rebuilt,
/// in float32, from the float64 factors, so it computes the compressed model's function up to
/// float32 summation order; the parameter counts reported are those of the factored form. The
/// factored execution (fewer GEMM FLOPs) is not implemented.
/// - `tucker-qkvo` / `tucker-ffn`: each weight kind (W_q, W_k, W_v, W_o; W_gate, W_up, W_down)
///   of all L layers is one stack (L × out × in), compressed by transform::compress_stack with
///   ranks (min(R1, out), min(R2, in)); the rebuilt W_s replace the originals (same shapes).
/// - `vo-cp` (collaborative VO heads, per layer): the rewrite y_i = Σ_h O'·diag(μ_h)·Σ_j
///   P_h(i,j)·V'x_j needs value heads of width R, which a Llama layer of head dim D cannot hold
///   when R > D. It is embedded exactly into a Llama model of head dim D' = max(D, R): query and
///   key heads are zero-padded to D' (RoPE rotates only the first n_rot ≤ D dimensions, and the
///   zero dimensions add nothing to q·k), the query weights are scaled by sqrt(D'/D) so that the
///   default scale 1/sqrt(D') equals the original 1/sqrt(D), every KV head's value rows are V'
///   (zero-padded to D'), and head h's output block of W_o is O'·diag(μ_h). The embedded model
///   costs more than the original (its KV cache holds Hkv·2·D' floats per token and layer), so
///   its speed says nothing about the factored form; its function is the compressed model's.
/// - `qk-cp` (collaborative QK heads): refused when the model applies RoPE to Q/K dimensions
///   (n_rot > 0, every Llama GGUF; the error names RoPE). With n_rot = 0 the same embedding holds
///   Q'_h = sqrt(D'/D)·diag(μ_h)·W̃_Qᵀ and one shared K' = W̃_Kᵀ (R rows) per KV head, with V and
///   W_o zero-padded. On MLA models its place is the NoPE part W_q_nope[h]·W_uk[h] (not done).
/// Refused (numattn::Error): a model with BDA or MLA layers; ranks out of range.
/// Cost: float64 copies of the weights concerned (tucker-ffn: 3·L·F·E doubles, 0.6 GB for
/// SmolLM2-135M), the decompositions (work items in parallel over `ctx`'s threads: layers for
/// CP, weight kinds for Tucker).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "numattn/core/exec.h"
#include "numattn/model/llama.h"
#include "numattn/transform/tensor_heads.h"

namespace numattn {

/// One decomposition: a layer (CP) or a weight kind over the layers (Tucker).
struct TensorPartReport {
  std::string name;  ///< "layer 3" or "attn_q"
  double fit = 1;
  int iterations = 0;
  decomp::dense::Info info = decomp::dense::Info::kSuccess;
  std::string message;
  std::int64_t rank_rows = 0, rank_cols = 0;  ///< CP: R, R; Tucker: the clamped (R1, R2)
  std::int64_t params_before = 0, params_after = 0;
};

struct TensorModelReport {
  transform::TensorSpec spec;
  std::vector<TensorPartReport> parts;
  std::int64_t params_before = 0, params_after = 0;  ///< the weights the scheme compresses
  double fit_min = 1, fit_mean = 1;
  int not_converged = 0;  ///< parts whose decomposition stopped at `iters` still moving
  std::int64_t exec_head_dim = 0;  ///< head dim of the model that runs (D' for vo-cp)
  double seconds = 0;
};

/// The refusals that depend only on the spec and the hyper-parameters (qk-cp on RoPE dimensions,
/// CP rank above Hq·D, Tucker ranks above the scheme's largest matrix dimension, layers above L):
/// callable before the weights are read. Throws numattn::OptionError("tensor", ...).
void check_tensor_spec(const transform::TensorSpec& spec, const LlamaHParams& hp);

/// The compressed model (see the file comment); `model` is not changed. Throws numattn::Error for
/// a refusal (qk-cp on RoPE dimensions, BDA/MLA models, ranks out of range).
LlamaModel compress_model_tensor(const LlamaModel& model, const transform::TensorSpec& spec,
                                 const ExecContext& ctx, TensorModelReport* report = nullptr);

}  // namespace numattn
