/// @file cp.h
/// CP (CANDECOMP/PARAFAC) decomposition of a three-way tensor by alternating least squares:
///   X ≈ [[λ; A, B, C]] = Σ_r λ_r a_r ∘ b_r ∘ c_r,   A: n0×R, B: n1×R, C: n2×R, unit columns,
/// (Kolda & Bader 2009); the collaborative-heads scheme of Cordonnier, Loukas & Jaggi (2020) is
/// a CP of the stacked per-head bilinear forms.
///
/// Algorithm (Kolda & Bader 2009, §3.4), one sweep updates each factor in turn by the normal
/// equations of its linear least-squares problem:
///   A ← [X_(0)·(C ⊙ B) + μ·A_old] · (CᵀC ∗ BᵀB + μ·I)⁻¹       (and likewise for B, C)
/// where ⊙ is Khatri–Rao, ∗ the Hadamard product, and μ ≥ 0 the proximal (Tikhonov towards the
/// previous iterate) regularisation of Navasca, De Lathauwer & Kindermann 2008: it keeps the
/// R×R systems positive definite when factors are nearly collinear ("swamps") and leaves the
/// fixed points unchanged. The systems are solved by Cholesky (LAPACK, decomp/dense.h), falling
/// back to the pseudo-inverse when the Gram matrix is singular. Optional line search (Bro 1998):
/// after a sweep, the extrapolated point F + s·(F − F_prev) with s = it^{1/3} is accepted when it
/// fits better.
///
/// Initialisation: `kHosvd` (the leading R left singular vectors of each unfolding, padded with
/// seeded Gaussian columns when R > n_mode: deterministic) or `kRandom` (seeded Gaussian, the
/// counter RNG: the same seed gives the same factors on every machine and thread count).
///
/// Fit = 1 − ‖X − X̂‖_F/‖X‖_F, computed exactly after every sweep from the mode-0 unfolding
/// (one GEMM the size of an MTTKRP; the Gram-matrix shortcut ‖X‖² − 2⟨X, X̂⟩ + ‖X̂‖² would cancel
/// down to about √ε and could not certify a 1e-10 fit). Stops when the fit changes by less than
/// `tolerance` between sweeps or at `max_iterations`.
///
/// Cost per sweep: three MTTKRPs and one residual, O(n0·n1·n2·R) each (dgemm), plus O(R³)
/// solves; line search adds one residual.
///
/// Errors (Eigen style; `compute` never throws for bad data), `info()`:
/// - kInvalidInput: rank < 1, an empty tensor, or a NaN/±inf entry (`message()` names it);
/// - kNumericalIssue: the zero tensor (every rank fits it), a non-finite factor, or a
///   degenerate solution: the rank-one components are nearly collinear, cond of their
///   congruence matrix Γ_rs = (a_rᵀa_s)(b_rᵀb_s)(c_rᵀc_s) above `degeneracy_threshold`
///   (default 1e6), or cancelling: Σλ_r²/‖X̂‖² above `kMaxCancellation` = 10 (near 1 for
///   well-separated components; large when big components cancel each other). That is the signature of a tensor with no best rank-R approximation
///   (border rank < rank, e.g. a∘a∘b + a∘b∘a + b∘a∘a at R = 2: components diverge with
///   cancelling weights) or of an ill-posed rank choice; the factors are still returned;
/// - kNoConvergence: `max_iterations` reached with the fit still moving by more than
///   `tolerance` (the factors of the last sweep are kept and usable).
/// Accessors throw numattn::Error when nothing was computed.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "numattn/decomp/dense.h"
#include "numattn/decomp/tensor3.h"

namespace numattn::decomp {

enum class CpInit { kHosvd, kRandom };

/// Σλ²/‖X̂‖² above this is reported as a degenerate (cancelling) decomposition.
inline constexpr double kMaxCancellation = 10.0;
/// "hosvd" | "random"; throws numattn::Error otherwise.
CpInit parse_cp_init(const std::string& s);

class CpAls {
 public:
  CpAls& set_rank(index_t r);
  CpAls& set_max_iterations(int it);
  /// Stop when |fit_k − fit_{k−1}| < tol (default 1e-12); tol must be finite and >= 0 (Error).
  CpAls& set_tolerance(double tol);
  CpAls& set_init(CpInit init);
  CpAls& set_seed(std::uint64_t seed);
  /// Proximal regularisation μ, relative to the mean diagonal of the Gram system (default 0).
  CpAls& set_regularization(double mu);
  CpAls& set_line_search(bool on);
  CpAls& set_degeneracy_threshold(double cond);

  CpAls& compute(const Tensor3& x);

  dense::Info info() const { return info_; }
  const std::string& message() const { return message_; }
  index_t rank() const { return r_; }
  /// Factor of `mode` (n_mode × R), unit-norm columns, components sorted by weight descending.
  const dense::Matrix& factor(int mode) const;
  /// λ (R), ≥ 0 after sorting (signs are moved into factor 0).
  const dense::Vector& weights() const;
  /// 1 − residual_rel().
  double fit() const;
  /// ‖X − X̂‖_F / ‖X‖_F from the reconstruction, float64.
  double residual_rel() const;
  /// Fit after each sweep, for convergence studies.
  const std::vector<double>& fit_history() const;
  int iterations() const;
  /// cond(Γ) of the congruence matrix of the components (see the file comment).
  double congruence_condition() const;
  /// Σλ_r² / ‖X̂‖²: 1 for orthogonal components, ≫ 1 when components cancel (degeneracy).
  double cancellation() const;
  /// Parameters of the factored form: R·(1 + n0 + n1 + n2).
  std::int64_t parameters() const;
  /// X̂ = [[λ; A, B, C]].
  Tensor3 reconstruct() const;

 private:
  void check() const;
  index_t rank_req_ = 1;
  int max_it_ = 500;
  double tol_ = 1e-12, mu_ = 0, degeneracy_ = 1e6;
  CpInit init_ = CpInit::kHosvd;
  std::uint64_t seed_ = 1;
  bool line_search_ = false;

  bool computed_ = false;
  dense::Info info_ = dense::Info::kInvalidInput;
  std::string message_ = "nothing computed yet";
  index_t r_ = 0;
  std::array<dense::Matrix, 3> f_;
  dense::Vector lambda_;
  std::vector<double> history_;
  int iterations_ = 0;
  double resid_ = 0, congruence_cond_ = 0, cancellation_ = 1;
};

}  // namespace numattn::decomp
