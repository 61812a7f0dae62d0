#include "numattn/decomp/cp.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include <fmt/format.h>

#include "decomp/tensor_common.h"
#include "numattn/core/error.h"
#include "numattn/core/rng.h"

namespace numattn::decomp {

CpInit parse_cp_init(const std::string& s) {
  if (s == "hosvd") return CpInit::kHosvd;
  if (s == "random") return CpInit::kRandom;
  throw Error(fmt::format("unknown CP initialisation '{}' (valid: hosvd, random)", s));
}

CpAls& CpAls::set_rank(index_t r) {
  rank_req_ = r;
  return *this;
}
CpAls& CpAls::set_max_iterations(int it) {
  max_it_ = it;
  return *this;
}
CpAls& CpAls::set_tolerance(double tol) {
  NUMATTN_CHECK(std::isfinite(tol) && tol >= 0, "CpAls: tolerance {} must be a finite number >= 0", tol);
  tol_ = tol;
  return *this;
}
CpAls& CpAls::set_init(CpInit init) {
  init_ = init;
  return *this;
}
CpAls& CpAls::set_seed(std::uint64_t seed) {
  seed_ = seed;
  return *this;
}
CpAls& CpAls::set_regularization(double mu) {
  mu_ = mu;
  return *this;
}
CpAls& CpAls::set_line_search(bool on) {
  line_search_ = on;
  return *this;
}
CpAls& CpAls::set_degeneracy_threshold(double cond) {
  degeneracy_ = cond;
  return *this;
}

namespace {

using dense::Matrix;
using dense::Vector;

/// Column norms of `f` into λ, columns scaled to unit norm (zero columns stay zero, λ = 0).
Vector normalise_columns(Matrix& f) {
  Vector lam(f.cols());
  for (index_t r = 0; r < f.cols(); ++r) {
    const double n = f.col(r).norm();
    lam(r) = n;
    if (n > 0) f.col(r) /= n;
  }
  return lam;
}

Matrix hadamard(const Matrix& a, const Matrix& b) { return a.cwiseProduct(b); }

/// Gram of the two factors other than `mode`, Hadamard-multiplied (the ALS normal matrix).
Matrix other_grams(const std::array<Matrix, 3>& f, int mode) {
  Matrix g = Matrix::Ones(f[0].cols(), f[0].cols());
  for (int m = 0; m < 3; ++m)
    if (m != mode) g = hadamard(g, matmul(f[static_cast<std::size_t>(m)], f[static_cast<std::size_t>(m)], true, false));
  return g;
}

/// X_(mode)·(F_k ⊙ F_j), k > j the two other modes (the MTTKRP), `xu` = X_(mode).
Matrix mttkrp(const Matrix& xu, const std::array<Matrix, 3>& f, int mode) {
  const int j = mode == 0 ? 1 : 0, k = mode == 2 ? 1 : 2;
  return matmul(xu, khatri_rao(f[static_cast<std::size_t>(k)], f[static_cast<std::size_t>(j)]));
}

/// ‖X_(0) − F0·diag(λ)·(F2 ⊙ F1)ᵀ‖_F, exact (one GEMM of the size of an MTTKRP).
double residual_norm(const Matrix& x0, const std::array<Matrix, 3>& f, const Vector& lam) {
  Matrix a = f[0] * lam.asDiagonal();
  Matrix r = x0 - matmul(a, khatri_rao(f[2], f[1]), false, true);
  return r.norm();
}

}  // namespace

CpAls& CpAls::compute(const Tensor3& x) {
  computed_ = false;
  history_.clear();
  iterations_ = 0;
  const std::string bad = detail::check_input(x);
  auto fail = [&](dense::Info i, std::string msg) -> CpAls& {
    info_ = i;
    message_ = std::move(msg);
    return *this;
  };
  if (rank_req_ < 1) return fail(dense::Info::kInvalidInput, fmt::format("CP rank {} must be ≥ 1", rank_req_));
  if (max_it_ < 1) return fail(dense::Info::kInvalidInput, fmt::format("CP max_iterations {} must be ≥ 1", max_it_));
  if (!bad.empty()) return fail(dense::Info::kInvalidInput, "CP: " + bad);
  r_ = rank_req_;
  const double xnorm = x.norm();
  if (!(xnorm > 0)) {
    for (int m = 0; m < 3; ++m) f_[static_cast<std::size_t>(m)] = Matrix::Zero(x.dim(m), r_);
    lambda_ = Vector::Zero(r_);
    computed_ = true;
    resid_ = 0;
    return fail(dense::Info::kNumericalIssue, "CP of the zero tensor: every rank-R tensor of zero weights fits it");
  }
  // Unfoldings computed once; each sweep reuses them.
  const std::array<Matrix, 3> xu = {unfold(x, 0), unfold(x, 1), unfold(x, 2)};

  // Initialisation.
  for (int m = 0; m < 3; ++m) {
    const index_t n = x.dim(m);
    Matrix f(n, r_);
    std::vector<double> g(static_cast<std::size_t>(n * r_));
    fill_normal(g, seed_, 0xc9 + static_cast<std::uint64_t>(m));
    f = Eigen::Map<Matrix>(g.data(), n, r_);
    if (init_ == CpInit::kHosvd) {
      const detail::Leading l = detail::leading_left(xu[static_cast<std::size_t>(m)], std::min(n, r_));
      if (l.info != dense::Info::kSuccess)
        return fail(l.info, fmt::format("CP: the SVD of the mode-{} unfolding failed ({})", m, to_string(l.info)));
      f.leftCols(l.u.cols()) = l.u;
    }
    normalise_columns(f);
    f_[static_cast<std::size_t>(m)] = f;
  }
  lambda_ = Vector::Ones(r_);

  double fit_prev = -std::numeric_limits<double>::infinity();
  bool converged = false;
  double fit = 0;
  for (int it = 1; it <= max_it_; ++it) {
    iterations_ = it;
    const std::array<Matrix, 3> before = f_;
    const Vector before_lam = lambda_;
    for (int m = 0; m < 3; ++m) {
      const auto mi = static_cast<std::size_t>(m);
      Matrix v = other_grams(f_, m);
      Matrix rhs = mttkrp(xu[mi], f_, m);
      if (mu_ > 0) {
        // Proximal term towards the current iterate, μ relative to the mean Gram diagonal.
        const double mu = mu_ * v.trace() / static_cast<double>(r_);
        v.diagonal().array() += mu;
        rhs += mu * (f_[mi] * lambda_.asDiagonal());
      }
      dense::Solution s = dense::cholesky_solve(v, rhs.transpose());
      Matrix fnew = s.info == dense::Info::kSuccess ? Matrix(s.x.transpose()) : matmul(rhs, dense::pinv(v));
      lambda_ = normalise_columns(fnew);
      f_[mi] = fnew;
    }
    fit = 1 - residual_norm(xu[0], f_, lambda_) / xnorm;
    if (line_search_ && it >= 3) {
      // Bro's extrapolation along the last sweep's step; kept only when it fits better.
      const double step = std::cbrt(static_cast<double>(it));
      std::array<Matrix, 3> ext;
      ext[0] = f_[0] * lambda_.asDiagonal() + step * (f_[0] * lambda_.asDiagonal() - before[0] * before_lam.asDiagonal());
      for (int m = 1; m < 3; ++m) {
        const auto mi = static_cast<std::size_t>(m);
        ext[mi] = f_[mi] + step * (f_[mi] - before[mi]);
        normalise_columns(ext[mi]);
      }
      Vector ext_lam = normalise_columns(ext[0]);
      const double ext_fit = 1 - residual_norm(xu[0], ext, ext_lam) / xnorm;
      if (std::isfinite(ext_fit) && ext_fit > fit) {
        f_ = ext;
        lambda_ = ext_lam;
        fit = ext_fit;
      }
    }
    history_.push_back(fit);
    if (!std::isfinite(fit)) break;
    if (std::abs(fit - fit_prev) < tol_) {
      converged = true;
      break;
    }
    fit_prev = fit;
  }

  // Canonical form: λ ≥ 0 (signs into factor 0), components by decreasing weight.
  for (index_t r = 0; r < r_; ++r)
    if (lambda_(r) < 0) {
      lambda_(r) = -lambda_(r);
      f_[0].col(r) *= -1;
    }
  std::vector<index_t> order(static_cast<std::size_t>(r_));
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](index_t a, index_t b) { return lambda_(a) > lambda_(b); });
  std::array<Matrix, 3> sorted;
  Vector slam(r_);
  for (int m = 0; m < 3; ++m) sorted[static_cast<std::size_t>(m)].resize(x.dim(m), r_);
  for (index_t t = 0; t < r_; ++t) {
    slam(t) = lambda_(order[static_cast<std::size_t>(t)]);
    for (int m = 0; m < 3; ++m)
      sorted[static_cast<std::size_t>(m)].col(t) = f_[static_cast<std::size_t>(m)].col(order[static_cast<std::size_t>(t)]);
  }
  f_ = sorted;
  lambda_ = slam;
  computed_ = true;
  resid_ = residual_norm(xu[0], f_, lambda_) / xnorm;

  Matrix gamma = Matrix::Ones(r_, r_);
  for (int m = 0; m < 3; ++m)
    gamma = hadamard(gamma, matmul(f_[static_cast<std::size_t>(m)], f_[static_cast<std::size_t>(m)], true, false));
  congruence_cond_ = dense::condition_number(gamma);
  const double fitted2 = lambda_.dot(gamma * lambda_);  // ‖X̂‖² = λᵀΓλ (R×R, not a GEMM)
  cancellation_ = fitted2 > 0 ? lambda_.squaredNorm() / fitted2 : 1.0;

  if (!std::isfinite(resid_) || !lambda_.allFinite())
    return fail(dense::Info::kNumericalIssue, "CP-ALS produced non-finite factors (the normal equations broke down)");
  if (!(congruence_cond_ <= degeneracy_) || !(cancellation_ <= kMaxCancellation))
    return fail(dense::Info::kNumericalIssue,
                fmt::format("degenerate CP: the {} rank-one components are nearly collinear and cancel (cond of "
                            "their congruence matrix {:.3g}, limit {:.3g}; Σλ²/‖X̂‖² = {:.3g}, limit {:g}; largest "
                            "weight {:.3g}·‖X‖); the tensor may have no best rank-{} approximation, or the rank is "
                            "too high",
                            r_, congruence_cond_, degeneracy_, cancellation_, kMaxCancellation, lambda_(0) / xnorm, r_));
  if (!converged)
    return fail(dense::Info::kNoConvergence,
                fmt::format("CP-ALS did not converge in {} sweeps (last fit change {:.3g} ≥ tolerance {:.3g})", max_it_,
                            history_.size() >= 2 ? std::abs(history_.back() - history_[history_.size() - 2]) : 0.0,
                            tol_));
  info_ = dense::Info::kSuccess;
  message_.clear();
  return *this;
}

void CpAls::check() const { NUMATTN_CHECK(computed_, "CpAls: nothing computed ({})", message_); }
const dense::Matrix& CpAls::factor(int mode) const {
  check();
  NUMATTN_CHECK(mode >= 0 && mode < 3, "CpAls::factor: mode {} is not 0, 1 or 2", mode);
  return f_[static_cast<std::size_t>(mode)];
}
const dense::Vector& CpAls::weights() const {
  check();
  return lambda_;
}
double CpAls::fit() const {
  check();
  return 1 - resid_;
}
double CpAls::residual_rel() const {
  check();
  return resid_;
}
const std::vector<double>& CpAls::fit_history() const {
  check();
  return history_;
}
int CpAls::iterations() const {
  check();
  return iterations_;
}
double CpAls::congruence_condition() const {
  check();
  return congruence_cond_;
}
double CpAls::cancellation() const {
  check();
  return cancellation_;
}
std::int64_t CpAls::parameters() const {
  check();
  return r_ * (1 + f_[0].rows() + f_[1].rows() + f_[2].rows());
}
Tensor3 CpAls::reconstruct() const {
  check();
  const Matrix a = f_[0] * lambda_.asDiagonal();
  return fold(matmul(a, khatri_rao(f_[2], f_[1]), false, true), 0, {f_[0].rows(), f_[1].rows(), f_[2].rows()});
}

}  // namespace numattn::decomp
