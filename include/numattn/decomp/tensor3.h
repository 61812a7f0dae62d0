/// @file tensor3.h
/// A dense float64 three-way tensor and the multilinear algebra the tensor decompositions
/// (cp.h, tucker.h) and the tensor attention forms need: mode-n unfolding and folding, mode-n
/// products, the Khatri–Rao product (Kolda & Bader 2009 conventions).
///
/// Storage: X(a, b, c) for a < n0, b < n1, c < n2 lives at `a + n0·(b + n1·c)` (mode 0 fastest),
/// so the mode-0 unfolding X_(0) (n0 × n1·n2) is the buffer itself in column-major order and
/// X_(2) is its transpose seen as (n0·n1 × n2). The mode-n unfolding puts X(a, b, c) in row
/// i_n and orders the columns with the remaining modes, lower mode fastest (Kolda & Bader):
///   X_(0)[a, b + n1·c],  X_(1)[b, a + n0·c],  X_(2)[c, a + n0·b].
/// With this ordering X_(0) = A·diag(λ)·(C ⊙ B)ᵀ for a CP tensor [[λ; A, B, C]] (⊙ = Khatri–Rao)
/// and X_(n) = A_n·G_(n)·(A_k ⊗ A_j)ᵀ for a Tucker tensor, k > j the other two modes.
///
/// Matrices are `dense::Matrix` (column-major float64, decomp/dense.h); every product goes
/// through blas::dgemm (no Eigen GEMM templates: compile time, docs/design.md).
#pragma once

#include <array>
#include <span>
#include <vector>

#include "numattn/core/tensor.h"
#include "numattn/decomp/dense.h"

namespace numattn::decomp {

class Tensor3 {
 public:
  Tensor3() = default;
  /// Zero tensor of shape n0 × n1 × n2 (each ≥ 0).
  Tensor3(index_t n0, index_t n1, index_t n2);
  /// X(i, :, :) = mats[i]: the survey's fold({M_i}) stacking along mode 0 (all mats the same
  /// shape). Throws numattn::Error on an empty list or mismatched shapes.
  static Tensor3 from_slices(std::span<const dense::Matrix> mats);

  index_t dim(int mode) const { return dims_[static_cast<std::size_t>(mode)]; }
  const std::array<index_t, 3>& dims() const { return dims_; }
  index_t size() const { return dims_[0] * dims_[1] * dims_[2]; }
  double& operator()(index_t a, index_t b, index_t c) { return data_[offset(a, b, c)]; }
  double operator()(index_t a, index_t b, index_t c) const { return data_[offset(a, b, c)]; }
  double* data() { return data_.data(); }
  const double* data() const { return data_.data(); }
  /// X(i, :, :) as an n1 × n2 matrix.
  dense::Matrix slice(index_t i) const;

  /// Frobenius norm, computed with scaling (no overflow for large entries).
  double norm() const;
  bool all_finite() const;

 private:
  std::size_t offset(index_t a, index_t b, index_t c) const {
    return static_cast<std::size_t>(a + dims_[0] * (b + dims_[1] * c));
  }
  std::array<index_t, 3> dims_{0, 0, 0};
  std::vector<double> data_;
};

/// X_(mode): dim(mode) × (size / dim(mode)), column order as in the file comment.
dense::Matrix unfold(const Tensor3& x, int mode);
/// Inverse of unfold: the tensor of shape `dims` whose mode-`mode` unfolding is `m`.
Tensor3 fold(const dense::Matrix& m, int mode, const std::array<index_t, 3>& dims);
/// Y = X ×_mode M with M of shape J × dim(mode): Y_(mode) = M·X_(mode). O(J·size) flops.
/// Throws numattn::Error when M.cols() != dim(mode).
Tensor3 mode_product(const Tensor3& x, const dense::Matrix& m, int mode);
/// X ×_mode Mᵀ (M of shape dim(mode) × J): the projection Tucker uses, without a transpose copy.
Tensor3 mode_product_t(const Tensor3& x, const dense::Matrix& m, int mode);
/// Khatri–Rao (column-wise Kronecker) product: column r is a_r ⊗ b_r, row index i·rows(b) + j
/// holds a(i, r)·b(j, r). Throws numattn::Error when the column counts differ.
dense::Matrix khatri_rao(const dense::Matrix& a, const dense::Matrix& b);
/// ‖X − Y‖_F / ‖X‖_F in float64 (+inf when X = 0 and Y ≠ 0, 0 when both are 0).
double relative_error(const Tensor3& x, const Tensor3& y);

/// C = op(A)·op(B) through blas::dgemm for column-major float64 matrices.
dense::Matrix matmul(const dense::Matrix& a, const dense::Matrix& b, bool trans_a = false,
                     bool trans_b = false);

}  // namespace numattn::decomp
