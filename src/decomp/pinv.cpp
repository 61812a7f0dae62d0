#include "numattn/decomp/pinv.h"

#include "numattn/core/blas.h"
#include "numattn/decomp/dense.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <type_traits>

namespace numattn::decomp {

const char* to_string(PinvInfo i) {
  switch (i) {
    case PinvInfo::kSuccess: return "success";
    case PinvInfo::kNoConvergence: return "no convergence";
    case PinvInfo::kNumericalIssue: return "numerical issue";
  }
  return "?";
}

namespace {

/// c = alpha·a·b + beta·c for row-major matrices, through the linked BLAS (Eigen's own GEMM is
/// several times slower for the float m×m products here).
template <typename M>
void gemm(const M& a, const M& b, double alpha, double beta, M& c) {
  if (a.rows() == 0 || b.cols() == 0) return;
  if constexpr (std::is_same_v<typename M::Scalar, float>)
    blas::sgemm(blas::Trans::kNo, blas::Trans::kNo, a.rows(), b.cols(), a.cols(), static_cast<float>(alpha), a.data(),
                a.cols(), b.data(), b.cols(), static_cast<float>(beta), c.data(), c.cols());
  else
    blas::dgemm(blas::Trans::kNo, blas::Trans::kNo, a.rows(), b.cols(), a.cols(), alpha, a.data(), a.cols(), b.data(),
                b.cols(), beta, c.data(), c.cols());
}

}  // namespace

template <typename Scalar>
double NewtonSchulzPinv<Scalar>::one_sided_residual(const Matrix& c) const {
  // The product of the smaller size is the one that can reach the identity (full rank). Through
  // BLAS, not Eigen's product: Eigen's GEMM templates would cost this file a minute of compile.
  const bool left = c.rows() <= c.cols();
  Matrix r = Matrix::Identity(left ? c.rows() : c.cols(), left ? c.rows() : c.cols());
  if (left) gemm(c, z_, -1.0, 1.0, r);
  else gemm(z_, c, -1.0, 1.0, r);
  return static_cast<double>(r.norm());
}

template <typename Scalar>
NewtonSchulzPinv<Scalar>& NewtonSchulzPinv<Scalar>::compute(const Eigen::Ref<const Matrix>& c) {
  const Eigen::Index m = c.rows();
  // ‖C‖₁ = max column sum of |C|, ‖C‖∞ = max row sum of |C|.
  const double norm1 = static_cast<double>(c.cwiseAbs().colwise().sum().maxCoeff());
  const double norm_inf = static_cast<double>(c.cwiseAbs().rowwise().sum().maxCoeff());
  const double denom = norm1 * norm_inf;
  if (!(denom > 0) || !std::isfinite(denom)) {
    // C = 0: its pseudo-inverse is 0 (exactly reached); non-finite C: report it.
    z_ = Matrix::Zero(c.cols(), m);
    if (!std::isfinite(denom)) z_.setConstant(std::numeric_limits<Scalar>::quiet_NaN());
    initial_residual_ = residual_ = std::isfinite(denom) ? 0.0 : std::nan("");
    info_ = std::isfinite(denom) ? PinvInfo::kNoConvergence : PinvInfo::kNumericalIssue;
    return *this;
  }
  z_ = c.transpose() * static_cast<Scalar>(1.0 / denom);
  const Matrix cm = c;  // contiguous row-major copy for BLAS
  initial_residual_ = one_sided_residual(cm);
  Matrix cz(m, m), t(m, m), u(m, m), znew(c.cols(), m);
  const Matrix eye = Matrix::Identity(m, m);
  for (int it = 0; it < iterations_; ++it) {
    gemm(cm, z_, 1.0, 0.0, cz);
    // t = 7I − CZ; u = 15I − CZ·t; t = 13I − CZ·u; Z = ¼ Z t.
    t = -cz;
    t.diagonal().array() += Scalar(7);
    u = Scalar(15) * eye;
    gemm(cz, t, -1.0, 1.0, u);
    t = Scalar(13) * eye;
    gemm(cz, u, -1.0, 1.0, t);
    gemm(z_, t, 0.25, 0.0, znew);
    z_.swap(znew);
  }
  residual_ = one_sided_residual(cm);
  if (!std::isfinite(residual_)) info_ = PinvInfo::kNumericalIssue;
  else info_ = residual_ <= tolerance_ ? PinvInfo::kSuccess : PinvInfo::kNoConvergence;
  return *this;
}

template class NewtonSchulzPinv<float>;
template class NewtonSchulzPinv<double>;

Eigen::Matrix<double, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor> pinv_svd(
    const Eigen::Ref<const Eigen::Matrix<double, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>>& c,
    double rcond) {
  using M = Eigen::Matrix<double, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
  return M(dense::pinv(c, rcond));
}

}  // namespace numattn::decomp
