/// @file tensor_model.h
/// Tensor compression (transform/tensor_heads.h) applied to a whole Llama model at load:
/// `numattn ppl --tensor SPEC`.
///
/// Execution: the compressed model is run as an ordinary Llama model whose weights are rebuilt
/// from the factors rounded to float32 (TensorFactors, products in float64, stored as float32),
/// so it computes the compressed model's function up to float32 summation order; the parameter
/// counts reported are those of the factored form. A `numattn-tensor` GGUF file
/// (model/tensor_convert.h) stores those same float32 factors and is rebuilt by the same
/// function (build_tensor_model), so a written file runs bitwise the model `ppl --tensor` runs.
/// A factored execution exists for vo-cp only (`exec=factored`, below); the other schemes run dense.
/// - `tucker-qkvo` / `tucker-ffn`: each weight kind (W_q, W_k, W_v, W_o; W_gate, W_up, W_down)
///   of all L layers is one stack (L × out × in), compressed by transform::compress_stack with
///   ranks (min(R1, out), min(R2, in)); the rebuilt W_s replace the originals (same shapes).
/// - `tucker-heads`: per layer, each of W_q, W_k, W_v, W_o is the heads × E × D tensor of its
///   per-head blocks (E × D each: W_q,h ᵀ, W_o's columns of head h), compressed by
///   transform::compress_stack with ranks (min(R_E, E), min(R_D, D)) and head-mode rank `heads`
///   (≥ the kind's head count: one core per head). Full ranks (E, D) reproduce the weights.
/// - `vo-cp` (collaborative VO heads, per layer): the rewrite y_i = Σ_h O'·diag(μ_h)·Σ_j
///   P_h(i,j)·V'x_j needs value heads of width R, which a Llama layer of head dim D cannot hold
///   when R > D. It is embedded exactly into a Llama model of head dim D' = max(D, R): query and
///   key heads are zero-padded to D' (RoPE rotates only the first n_rot ≤ D dimensions, and the
///   zero dimensions add nothing to q·k), the query weights are scaled by sqrt(D'/D) so that the
///   default scale 1/sqrt(D') equals the original 1/sqrt(D), every KV head's value rows are V'
///   (zero-padded to D'), and head h's output block of W_o is O'·diag(μ_h). The embedded model
///   costs more than the original (its KV cache holds Hkv·2·D' floats per token and layer), so
///   its speed says nothing about the factored form; its function is the compressed model's.
///   With `exec=factored` (TensorSpec::factored) vo-cp runs in its factored layer form instead
///   (LlamaLayer::vo_mix, model/llama.h): wqkv = [Wq; Wk; V'], wo = O' [E, R], per-head mixing
///   vectors; the cache holds Hkv·D keys and one R-wide value row per token; head dim stays D.
/// - `qk-cp` (collaborative QK heads): refused when the model applies RoPE to Q/K dimensions
///   (n_rot > 0, every Llama GGUF; the error names RoPE). With n_rot = 0 the same embedding holds
///   Q'_h = sqrt(D'/D)·diag(μ_h)·W̃_Qᵀ and one shared K' = W̃_Kᵀ (R rows) per KV head, with V and
///   W_o zero-padded.
/// - `qk-cp` on an MLA model (model/mla_model.h, e.g. `ppl --mla-rank R --tensor qk-cp:...`):
///   applied to the NoPE part, T_h = W_q_nope[h]ᵀ·W_uk[h] (E × r) per layer, by
///   transform::collaborative_qk_mla; each MLA layer keeps its form with d_nope → R (the MLA
///   layer runs in float32 from the float64 result). The other schemes are refused on MLA models.
/// Refused (numattn::Error): a model with BDA layers (or BDA on MLA layers); vo-cp/tucker on MLA;
/// ranks out of range.
/// Cost: float64 copies of the weights concerned (tucker-ffn: 3·L·F·E doubles, 0.6 GB for
/// SmolLM2-135M), the decompositions (work items in parallel over `ctx`'s threads: layers for
/// CP, weight kinds for Tucker).
#pragma once

#include <cstdint>
#include <functional>
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

/// The float32 factors a compressed model is rebuilt from (and a numattn-tensor file stores).
/// Matrices are row-major float32.
struct TensorFactors {
  transform::TensorSpec spec;
  /// Collaborative heads of one layer: T_h ≈ left·diag(mix(h, :))·rightᵀ (transform::CollabHeads).
  struct Cp {
    std::int64_t rank = 0;
    std::vector<float> left;   ///< [E, R]: VO: O'; QK: W̃_Q
    std::vector<float> right;  ///< [E, R]: VO: V'ᵀ; QK: W̃_K
    std::vector<float> mix;    ///< [Hq, R]
  };
  /// One weight kind over the L layers: W_l ≈ left·C_l·rightᵀ (transform::StackCompression).
  struct Stack {
    std::string name;  ///< the GGUF tensor kind: attn_q, attn_k, attn_v, attn_output, ffn_gate, ffn_up, ffn_down
    std::int64_t rows = 0, cols = 0, rank_rows = 0, rank_cols = 0;
    std::int64_t bank = 0;     ///< number of cores (the slices for shared factors, ℓ for Tucker)
    std::vector<float> left;   ///< [rows, R1]
    std::vector<float> right;  ///< [cols, R2]
    std::vector<float> cores;  ///< [bank, R1, R2]
    std::vector<float> coef;   ///< [slices, bank] (Tucker), or empty: slice s uses core s
  };
  std::vector<Cp> cp;         ///< one per layer (vo-cp, qk-cp)
  /// One per weight kind (tucker-qkvo: 4, tucker-ffn: 3), or per layer and kind, layer-major
  /// (tucker-heads: 4·L; slices are heads, `coef` [heads, bank]).
  std::vector<Stack> stacks;
};

/// One weight kind of a Tucker scheme. tucker-qkvo/-ffn: slice s is rows [r0, r0 + rows) of
/// layer s's matrix (slices = L). tucker-heads: per layer, slice h is head h's block as an E × D
/// matrix (W_q/W_k/W_v: rows r0 + h·D.. transposed; W_o: columns h·D..; slices = its heads).
struct TensorStackKind {
  const char* name;  ///< GGUF tensor kind ("attn_q", ..., "ffn_down")
  int matrix;        ///< 0 wqkv, 1 wo, 2 w_gate_up, 3 w_down
  std::int64_t r0, rows, cols;
  std::int64_t slices;  ///< matrices in one stack
};
/// The weight kinds `scheme` (tucker-qkvo, tucker-ffn or tucker-heads) stacks, for the model `hp`.
std::vector<TensorStackKind> tensor_stack_kinds(transform::TensorScheme scheme, const ModelHParams& hp);

/// The original attention matrices of one layer, dequantized to float32 row-major [out, in]:
/// `kind` is attn_q, attn_k, attn_v or attn_output. build_tensor_model asks for the ones a CP
/// scheme keeps (vo-cp: attn_q, attn_k; qk-cp: attn_v, attn_output).
using TensorSourceRows = std::function<std::vector<float>(std::int64_t layer, const char* kind)>;

/// The compressed model from `base` (the model's weights; the group the scheme rebuilds,
/// attention for vo-cp/qk-cp/tucker-qkvo or FFN for tucker-ffn, is replaced whole, so it may be
/// empty in `base`) and the factors `f`; `source` gives the kept attention matrices of a CP
/// scheme. `hp` is the source model's; vo-cp/qk-cp return a model of head dim max(D, R).
/// Throws numattn::Error when the factors do not match `hp` (count or size).
LlamaModel build_tensor_model(const ModelHParams& hp, LlamaWeights base, const TensorFactors& f,
                              const TensorSourceRows& source);

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
/// callable before the weights are read. `mla`: the model is (or will be) an MLA model, where
/// only qk-cp applies (on the NoPE part; its rank is checked against Hq·d_nope at compression).
/// Throws numattn::OptionError("tensor", ...).
void check_tensor_spec(const transform::TensorSpec& spec, const ModelHParams& hp, bool mla = false);

/// The compressed model (see the file comment); `model` is not changed. Throws numattn::Error for
/// a refusal (qk-cp on RoPE dimensions, BDA/MLA models, ranks out of range).
/// `factors`, when given, receives the float32 factors the model is rebuilt from.
LlamaModel compress_model_tensor(const LlamaModel& model, const transform::TensorSpec& spec,
                                 const ExecContext& ctx, TensorModelReport* report = nullptr,
                                 TensorFactors* factors = nullptr);

}  // namespace numattn
