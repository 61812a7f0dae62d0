/// @file bd_projection.h
/// The fused BD projection kernel: the identity side of a BDA pair (K for QK, V for VO).
///
/// A multi-head projection Y = X·W + b, W ∈ R^{d×(H·dh)} (head h owns columns h·dh..h·dh+dh),
/// is rewritten per head as Y'_h = Y_h·T_h with T_h = W_h[S,:]^{-1} and one basis S of dh input
/// channels shared by all heads (BD Attention, J. Zhao, arXiv 2510.01718, Algorithms 2–3):
///
///   Y' = X[:,S^c]·C_stack + broadcast_h(X[:,S]) + b',   C_stack ∈ R^{(d−dh)×(H·dh)},
///   C_h = W_h[S^c,:]·W_h[S,:]^{-1},  b'_h = b_h·T_h.
///
/// Because S is shared, X[:,S] is one n×dh block added to every head, and the rest is ONE GEMM
/// with inner dimension d−dh instead of d: the projection saves dh/d of its MACs and weights
/// (ideal speed-up d/(d−dh): 1.333 for 512/128). The input channels are permuted offline to
/// [S, S^c] so that both parts are contiguous column ranges of X.
///
/// Kernel (measured choice, see docs/bd.md): per token block, the output is pre-filled with
/// the identity part X[:,S] (+ b'), then OpenBLAS sgemm accumulates X[:,S^c]·C_stack onto it
/// with beta = 1. The pre-fill replaces the C := beta·C pass that sgemm makes anyway, so the
/// identity part is free up to one read of X[:,S].
///
/// Mixed heads: a head whose basis block is too ill-conditioned (κ above the caller's
/// threshold) is kept dense: its columns of C_stack hold W_h[S^c,:], its output is pre-filled
/// with X[:,S]·W_h[S,:] (a small extra GEMM, dh·dh MACs per token) and it gets Y_h, not Y'_h.
///
/// Parallelism: with ctx.threads > 1, `parallel_for` over token blocks and BLAS set to one
/// thread inside (exec.h; this sets the global OpenBLAS thread count to 1). With ExecContext{1}
/// the kernel makes one block and leaves the BLAS thread count alone, which is what a caller
/// that runs BLAS multi-threaded (model/llama.h's prefill GEMMs) should pass.
///
/// This header is the float32 runtime only and pulls in no Eigen, so the model headers that
/// hold a BdProjection stay light; the float64 builder that computes one from a weight matrix
/// (Eigen-based) is transform/bd_projection_builder.h.
#pragma once

#include <span>
#include <vector>

#include "numattn/core/exec.h"
#include "numattn/core/tensor.h"

namespace numattn::transform {

/// Channel order of the X handed to `BdProjection::project`.
/// - kOriginal: the model's own order; the kernel gathers each token block into [S, S^c] order
///   (a copy of n·d floats, about dh/(H·dh) of the GEMM's memory traffic).
/// - kPermuted: the producer of X already emits channels in `permutation()` order (e.g. an MLA
///   down-projection whose output rows were permuted offline): no copy at all.
enum class InputOrder { kOriginal, kPermuted };

class BdProjection {
 public:
  BdProjection() = default;

  /// A plain dense projection Y = X·W + b (the "no BD" case and the benchmark baseline).
  /// `w` is d_in × (heads·head_dim) row-major, `bias` empty or heads·head_dim.
  static BdProjection dense(index_t d_in, index_t heads, index_t head_dim,
                            std::span<const float> w, std::span<const float> bias = {});

  /// Y = projection of X: `x` is tokens × d_in (row stride `ldx`), `y` tokens × out_dim()
  /// (row stride `ldy`), float32. Cost: tokens·(d_in−r)·out + tokens·r·(dense heads' columns)
  /// MACs, plus tokens·out adds. Thread-safe (const), allocates only the gather buffer.
  void project(const float* x, index_t tokens, index_t ldx, float* y, index_t ldy,
               InputOrder order, const ExecContext& ctx) const;

  /// The basis part of `project` for a caller that runs the GEMM part its own way (a model
  /// whose coefficients C_stack are held quantized): y = X[:,S] (+ b') for BD heads, b +
  /// X[:,S]·W_h[S,:] for dense heads, where `xs` holds the tokens' S channels in permutation()
  /// order (row stride ldxs). Adding X[:,S^c]·C_stack (rest(), rows in permutation() order)
  /// completes Y'. Throws numattn::Error for a dense projection (rank() == 0).
  void fill_basis(const float* xs, index_t tokens, index_t ldxs, float* y, index_t ldy) const;
  /// C_stack, (d_in − r) × out row-major (rows S^c in permutation() order; dense heads' columns
  /// W_h[S^c,:]); for a dense projection the full d_in × out W.
  const std::vector<float>& rest() const { return r_ > 0 ? rest_ : full_; }

  index_t d_in() const { return d_; }
  index_t heads() const { return heads_; }
  index_t head_dim() const { return dh_; }
  index_t out_dim() const { return heads_ * dh_; }
  /// r = |S| = head_dim when BD is used, 0 for a dense projection.
  index_t rank() const { return r_; }
  bool is_bd() const { return r_ > 0; }
  /// permutation()[k] = original input channel stored at position k: [S (sorted), S^c (sorted)].
  const std::vector<index_t>& permutation() const { return perm_; }
  /// Whether head h is kept dense.
  bool head_dense(index_t h) const { return dense_[static_cast<std::size_t>(h)] != 0; }
  index_t dense_head_count() const { return static_cast<index_t>(dense_list_.size()); }
  /// float32 weights stored (C_stack + dense heads' top blocks, or the full W).
  index_t weight_params() const;
  /// MACs per token of the GEMM part.
  index_t macs_per_token() const;
  /// The dense float32 matrix this projection applies, d_in × out row-major in the ORIGINAL
  /// channel order: W_h·T_h for BD heads (rows S = identity, rows S^c = C_h), W_h for dense
  /// heads. For checks, or to fold V' = X·W_v·T into a stacked dense GEMM when speed does
  /// not matter (the fused kernel is what saves the dh/d MACs).
  std::vector<float> effective_weight() const;
  /// The stored form of a BD projection, for serialisation (model/bda_model.h writes it to
  /// GGUF). `perm` = permutation(); `dense_heads` = heads kept dense, ascending; `rest` =
  /// C_stack (d_in − r) × out row-major; `top` = r × (|dense_heads|·head_dim); `bias` empty or
  /// out. A dense projection has r = 0 and `rest` = the full d_in × out matrix.
  struct Parts {
    index_t d_in = 0, heads = 0, head_dim = 0, rank = 0;
    std::vector<index_t> perm, dense_heads;
    std::vector<float> rest, top, bias;
  };
  Parts parts() const;
  /// Rebuilds a projection from `parts()`; every size and index is checked (a corrupt file
  /// gives numattn::Error, never a crash).
  static BdProjection from_parts(Parts parts);

  /// Rows per parallel block (0 = tokens / threads, one block per thread).
  void set_block_rows(index_t rows) { block_rows_ = rows; }

 private:
  index_t d_ = 0, heads_ = 0, dh_ = 0, r_ = 0;
  index_t block_rows_ = 0;
  std::vector<index_t> perm_;
  std::vector<char> dense_;
  std::vector<index_t> dense_list_;
  std::vector<float> full_;  ///< r_ == 0: W, d × out
  std::vector<float> rest_;  ///< r_ > 0: C_stack, (d−r) × out (dense heads: W_h[S^c,:])
  std::vector<float> top_;   ///< r_ > 0: W_h[S,:] of dense heads, r × (n_dense·dh)
  std::vector<float> bias_;  ///< empty or out
};

}  // namespace numattn::transform
