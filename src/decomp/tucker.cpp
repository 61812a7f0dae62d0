#include "numattn/decomp/tucker.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include <fmt/format.h>

#include "decomp/tensor_common.h"
#include "numattn/core/error.h"

namespace numattn::decomp {

namespace detail {

Leading leading_left(const dense::Matrix& m, index_t r) {
  Leading out;
  const index_t n = m.rows();
  r = std::min(r, n);
  if (m.cols() <= 8 * n) {
    dense::Svd s = dense::svd(m, true);
    out.info = s.info;
    out.s = s.s;
    out.u = dense::Matrix::Zero(n, r);
    const index_t have = std::min<index_t>(r, s.u.cols());
    out.u.leftCols(have) = s.u.leftCols(have);
    if (have < r) {  // fewer columns than the rank asked (a wide-enough request): complete below
      out.s.conservativeResize(r);
      out.s.tail(r - have).setZero();
    }
  } else {
    // A very wide unfolding: the Gram matrix is n×n, its eigenvectors are the left singular
    // vectors and its eigenvalues the squared singular values.
    const dense::Matrix g = matmul(m, m, false, true);
    dense::SymEig e = dense::sym_eig(g, true);
    out.info = e.info;
    out.u.resize(n, r);
    out.s.resize(n);
    for (index_t t = 0; t < n; ++t) out.s(t) = std::sqrt(std::max(0.0, e.values(n - 1 - t)));
    for (index_t t = 0; t < r; ++t) out.u.col(t) = e.vectors.col(n - 1 - t);
  }
  return out;
}

std::string check_input(const Tensor3& x) {
  if (x.size() == 0) return fmt::format("the tensor is empty ({}x{}x{})", x.dim(0), x.dim(1), x.dim(2));
  for (index_t c = 0; c < x.dim(2); ++c)
    for (index_t b = 0; b < x.dim(1); ++b)
      for (index_t a = 0; a < x.dim(0); ++a)
        if (!std::isfinite(x(a, b, c))) return fmt::format("entry ({}, {}, {}) is {}", a, b, c, x(a, b, c));
  return "";
}

}  // namespace detail

TuckerMethod parse_tucker_method(const std::string& s) {
  if (s == "hosvd") return TuckerMethod::kHosvd;
  if (s == "hooi") return TuckerMethod::kHooi;
  throw Error(fmt::format("unknown Tucker method '{}' (valid: hosvd, hooi)", s));
}

Tucker& Tucker::set_ranks(index_t r0, index_t r1, index_t r2) {
  req_ = {r0, r1, r2};
  return *this;
}
Tucker& Tucker::set_method(TuckerMethod m) {
  method_ = m;
  return *this;
}
Tucker& Tucker::set_max_iterations(int it) {
  max_it_ = it;
  return *this;
}
Tucker& Tucker::set_tolerance(double tol) {
  NUMATTN_CHECK(std::isfinite(tol) && tol >= 0, "Tucker: tolerance {} must be a finite number >= 0", tol);
  tol_ = tol;
  return *this;
}
Tucker& Tucker::set_identity_mode0(bool on) {
  identity0_ = on;
  return *this;
}

namespace {

using dense::Matrix;

/// Completes the columns of `u` past `have` to an orthonormal set (Householder QR of [u | I]),
/// for a requested rank above the numerical rank.
void complete_orthonormal(Matrix& u, index_t have) {
  const index_t n = u.rows(), r = u.cols();
  if (have >= r) return;
  Matrix a(n, have + n);
  a.leftCols(have) = u.leftCols(have);
  a.rightCols(n) = Matrix::Identity(n, n);
  const dense::Qr q = dense::qr(a, true);
  u.rightCols(r - have) = q.q.middleCols(have, r - have);
}

/// Leading r left singular vectors of `m` into `u`; returns "" or the reason for kNumericalIssue.
std::string factor_from(const Matrix& m, index_t r, int mode, Matrix& u, dense::Info& info) {
  const detail::Leading l = detail::leading_left(m, r);
  info = l.info;
  if (l.info != dense::Info::kSuccess) return fmt::format("the SVD of the mode-{} unfolding failed", mode);
  u = l.u;
  // Singular values at rounding level relative to σ_max: the rank asked exceeds the numerical
  // multilinear rank of that mode. The directions LAPACK returns there are noise; replace them
  // by an exact orthonormal completion so that the factor stays orthonormal.
  const double smax = l.s.size() > 0 ? l.s(0) : 0.0;
  const double cut = smax * std::numeric_limits<double>::epsilon() * static_cast<double>(std::max(m.rows(), m.cols()));
  index_t have = 0;
  while (have < r && have < l.s.size() && l.s(have) > cut) ++have;
  if (have < r) {
    complete_orthonormal(u, have);
    return fmt::format("mode {}: rank {} exceeds the numerical rank {} of the unfolding", mode, r, have);
  }
  return "";
}

/// X projected on every mode but `skip` (−1: all): X ×_m A_mᵀ.
Tensor3 project(const Tensor3& x, const std::array<Matrix, 3>& f, int skip, bool identity0) {
  Tensor3 y = x;
  for (int m = 0; m < 3; ++m) {
    if (m == skip || (m == 0 && identity0)) continue;
    y = mode_product_t(y, f[static_cast<std::size_t>(m)], m);
  }
  return y;
}

}  // namespace

Tucker& Tucker::compute(const Tensor3& x) {
  computed_ = false;
  history_.clear();
  iterations_ = 0;
  auto fail = [&](dense::Info i, std::string msg) -> Tucker& {
    info_ = i;
    message_ = std::move(msg);
    return *this;
  };
  const std::string bad = detail::check_input(x);
  if (!bad.empty()) return fail(dense::Info::kInvalidInput, "Tucker: " + bad);
  r_ = req_;
  if (identity0_) r_[0] = x.dim(0);
  for (int m = 0; m < 3; ++m) {
    const auto mi = static_cast<std::size_t>(m);
    if (r_[mi] < 1 || r_[mi] > x.dim(m))
      return fail(dense::Info::kInvalidInput,
                  fmt::format("Tucker: rank {} of mode {} is outside [1, {}]", r_[mi], m, x.dim(m)));
  }
  if (max_it_ < 1) return fail(dense::Info::kInvalidInput, "Tucker: max_iterations must be ≥ 1");
  const double xnorm = x.norm();
  std::string issue;
  dense::Info li = dense::Info::kSuccess;
  // HOSVD (also HOOI's start).
  for (int m = 0; m < 3; ++m) {
    const auto mi = static_cast<std::size_t>(m);
    if (m == 0 && identity0_) {
      f_[0] = Matrix::Identity(x.dim(0), x.dim(0));
      continue;
    }
    const std::string why = factor_from(unfold(x, m), r_[mi], m, f_[mi], li);
    if (li != dense::Info::kSuccess) return fail(li, "Tucker: " + why);
    if (!why.empty()) issue = why;
  }
  core_ = project(x, f_, -1, identity0_);
  auto fit_of = [&](const Tensor3& g) {
    if (!(xnorm > 0)) return 1.0;
    const double gn = g.norm() / xnorm;
    return 1 - std::sqrt(std::max(0.0, 1 - gn * gn));
  };
  double fit = fit_of(core_);
  history_.push_back(fit);
  bool converged = method_ == TuckerMethod::kHosvd;
  if (method_ == TuckerMethod::kHooi) {
    for (int it = 1; it <= max_it_; ++it) {
      iterations_ = it;
      std::string last_issue;
      for (int m = identity0_ ? 1 : 0; m < 3; ++m) {
        const auto mi = static_cast<std::size_t>(m);
        const Tensor3 y = project(x, f_, m, identity0_);
        const std::string why = factor_from(unfold(y, m), r_[mi], m, f_[mi], li);
        if (li != dense::Info::kSuccess) return fail(li, "Tucker (HOOI): " + why);
        if (!why.empty()) last_issue = why;
      }
      issue = last_issue;
      core_ = project(x, f_, -1, identity0_);
      const double nf = fit_of(core_);
      history_.push_back(nf);
      const bool done = std::abs(nf - fit) < tol_;
      fit = nf;
      if (done) {
        converged = true;
        break;
      }
    }
  }
  computed_ = true;
  resid_ = relative_error(x, reconstruct());
  if (!(xnorm > 0)) resid_ = 0;
  if (!std::isfinite(resid_)) return fail(dense::Info::kNumericalIssue, "Tucker: the reconstruction is not finite");
  if (!issue.empty())
    return fail(dense::Info::kNumericalIssue,
                "Tucker: " + issue + " (factor completed with orthonormal directions; the fit is unaffected)");
  if (!converged)
    return fail(dense::Info::kNoConvergence,
                fmt::format("Tucker (HOOI) did not converge in {} sweeps (tolerance {:.3g})", max_it_, tol_));
  info_ = dense::Info::kSuccess;
  message_.clear();
  return *this;
}

void Tucker::check() const { NUMATTN_CHECK(computed_, "Tucker: nothing computed ({})", message_); }
const std::array<index_t, 3>& Tucker::ranks() const {
  check();
  return r_;
}
const dense::Matrix& Tucker::factor(int mode) const {
  check();
  NUMATTN_CHECK(mode >= 0 && mode < 3, "Tucker::factor: mode {} is not 0, 1 or 2", mode);
  return f_[static_cast<std::size_t>(mode)];
}
const Tensor3& Tucker::core() const {
  check();
  return core_;
}
double Tucker::fit() const {
  check();
  return 1 - resid_;
}
double Tucker::residual_rel() const {
  check();
  return resid_;
}
const std::vector<double>& Tucker::fit_history() const {
  check();
  return history_;
}
int Tucker::iterations() const {
  check();
  return iterations_;
}
std::int64_t Tucker::parameters() const {
  check();
  std::int64_t p = r_[0] * r_[1] * r_[2];
  for (int m = identity0_ ? 1 : 0; m < 3; ++m) p += f_[static_cast<std::size_t>(m)].rows() * r_[static_cast<std::size_t>(m)];
  return p;
}
Tensor3 Tucker::reconstruct() const {
  check();
  Tensor3 y = core_;
  for (int m = 0; m < 3; ++m) {
    if (m == 0 && identity0_) continue;
    y = mode_product(y, f_[static_cast<std::size_t>(m)], m);
  }
  return y;
}

SharedFactor& SharedFactor::set_ranks(index_t r1, index_t r2) {
  r1_ = r1;
  r2_ = r2;
  return *this;
}
SharedFactor& SharedFactor::set_max_iterations(int it) {
  t_.set_max_iterations(it);
  return *this;
}
SharedFactor& SharedFactor::set_tolerance(double tol) {
  t_.set_tolerance(tol);
  return *this;
}
SharedFactor& SharedFactor::compute(const Tensor3& x) {
  t_.set_ranks(1, r1_, r2_).set_method(TuckerMethod::kHooi).compute(x);
  return *this;
}
dense::Matrix SharedFactor::core(index_t i) const { return t_.core().slice(i); }
dense::Matrix SharedFactor::reconstruct(index_t i) const {
  return matmul(matmul(left(), core(i)), right(), false, true);
}

}  // namespace numattn::decomp
