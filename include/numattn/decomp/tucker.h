/// @file tucker.h
/// Tucker decomposition of a three-way tensor, and the shared-factor model of stacked matrices.
///
/// Tucker (Kolda & Bader 2009): X ≈ G ×_0 A0 ×_1 A1 ×_2 A2 = [[G; A0, A1, A2]], with
/// A_n (n_n × r_n) having orthonormal columns and core G (r0 × r1 × r2).
/// - `kHosvd` (De Lathauwer, De Moor & Vandewalle 2000): A_n = the r_n leading left singular
///   vectors of X_(n); G = X ×_0 A0ᵀ ×_1 A1ᵀ ×_2 A2ᵀ. Quasi-optimal: its error is at most √3
///   times the best rank-(r0, r1, r2) error. Exact (to rounding) when the multilinear ranks are
///   at most (r0, r1, r2).
/// - `kHooi` (higher-order orthogonal iteration, De Lathauwer et al. 2000b): starts from HOSVD,
///   then A_n ← leading r_n left singular vectors of (X ×_{m≠n} A_mᵀ)_(n) until the fit changes
///   by less than `tolerance`. The fit never decreases (each step maximises ‖G‖ over one factor).
/// With orthonormal factors ‖X − X̂‖² = ‖X‖² − ‖G‖²; the final residual is recomputed from the
/// reconstruction.
///
/// Shared-factor model (Ren et al. ICLR 2022; TRAWL), for a stack of matrices X_i = X(i, :, :):
///   X_i ≈ B · G_i · Cᵀ,  B: n1×R1, C: n2×R2 orthonormal, G_i: R1×R2 per matrix.
/// It is Tucker with mode 0 uncompressed (A0 = I); B and C come from HOOI with A0 fixed to I,
/// G_i = Bᵀ X_i C. Full Tucker with r0 < n0 is the "bank of core slices" variant
/// X_i ≈ B (Σ_k A0(i,k) G_k) Cᵀ (the core slices G_k are shared; only A0(i,k) depends on i).
///
/// Leading singular vectors: LAPACK SVD of the unfolding when it has at most 8× more columns than
/// rows; otherwise the eigenvectors of X_(n)X_(n)ᵀ (dgemm + dsyevd), which costs O(n_n²·size/n_n)
/// and is accurate while the kept singular values are well above √ε·σ_max.
///
/// Cost: HOSVD O(size·Σ n_n) ; HOOI per sweep O(size·(r0 + r1 + r2)) for the projections plus
/// the SVDs of the small projected unfoldings.
///
/// Errors, `info()` (Eigen style, compute never throws for bad data): kInvalidInput for a rank
/// outside [1, n_n], an empty tensor or a non-finite entry; kNumericalIssue when an SVD fails or
/// a kept singular value is 0 relative to σ_max·ε·n (the requested rank exceeds the tensor's
/// multilinear rank: the factor is then completed with arbitrary orthonormal directions and the
/// fit is still exact, so this is a report, not a failure of the result); kNoConvergence when
/// HOOI hits `max_iterations` with the fit still moving. Accessors throw numattn::Error before a
/// compute.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "numattn/decomp/dense.h"
#include "numattn/decomp/tensor3.h"

namespace numattn::decomp {

enum class TuckerMethod { kHosvd, kHooi };
/// "hosvd" | "hooi"; throws numattn::Error otherwise.
TuckerMethod parse_tucker_method(const std::string& s);

class Tucker {
 public:
  Tucker& set_ranks(index_t r0, index_t r1, index_t r2);
  Tucker& set_method(TuckerMethod m);
  Tucker& set_max_iterations(int it);
  /// HOOI stops when the fit changes by less than tol (default 1e-12); finite and >= 0 (Error).
  Tucker& set_tolerance(double tol);
  /// Mode 0 kept uncompressed with A0 = I (rank r0 ignored): the shared-factor model.
  Tucker& set_identity_mode0(bool on);

  Tucker& compute(const Tensor3& x);

  dense::Info info() const { return info_; }
  const std::string& message() const { return message_; }
  const std::array<index_t, 3>& ranks() const;
  const dense::Matrix& factor(int mode) const;
  const Tensor3& core() const;
  double fit() const;
  double residual_rel() const;
  const std::vector<double>& fit_history() const;
  int iterations() const;
  /// r0·r1·r2 + Σ n_n·r_n (with the identity mode 0: n0·r1·r2 + n1·r1 + n2·r2).
  std::int64_t parameters() const;
  Tensor3 reconstruct() const;

 private:
  void check() const;
  std::array<index_t, 3> req_{1, 1, 1};
  TuckerMethod method_ = TuckerMethod::kHooi;
  int max_it_ = 100;
  double tol_ = 1e-12;
  bool identity0_ = false;

  bool computed_ = false;
  dense::Info info_ = dense::Info::kInvalidInput;
  std::string message_ = "nothing computed yet";
  std::array<index_t, 3> r_{0, 0, 0};
  std::array<dense::Matrix, 3> f_;
  Tensor3 core_;
  std::vector<double> history_;
  int iterations_ = 0;
  double resid_ = 0;
};

/// X_i ≈ B·G_i·Cᵀ for the slices X_i = X(i, :, :) (see the file comment).
class SharedFactor {
 public:
  SharedFactor& set_ranks(index_t r1, index_t r2);
  SharedFactor& set_max_iterations(int it);
  SharedFactor& set_tolerance(double tol);
  SharedFactor& compute(const Tensor3& x);

  dense::Info info() const { return t_.info(); }
  const std::string& message() const { return t_.message(); }
  /// B (n1 × R1) and C (n2 × R2), orthonormal columns.
  const dense::Matrix& left() const { return t_.factor(1); }
  const dense::Matrix& right() const { return t_.factor(2); }
  /// G_i (R1 × R2).
  dense::Matrix core(index_t i) const;
  /// B·G_i·Cᵀ.
  dense::Matrix reconstruct(index_t i) const;
  double residual_rel() const { return t_.residual_rel(); }
  double fit() const { return t_.fit(); }
  int iterations() const { return t_.iterations(); }
  /// n0·R1·R2 + n1·R1 + n2·R2.
  std::int64_t parameters() const { return t_.parameters(); }

 private:
  index_t r1_ = 1, r2_ = 1;
  Tucker t_ = Tucker().set_identity_mode0(true);
};

}  // namespace numattn::decomp
