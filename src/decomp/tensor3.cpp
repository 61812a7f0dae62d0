#include "numattn/decomp/tensor3.h"

#include <cmath>
#include <limits>

#include "numattn/core/blas.h"
#include "numattn/core/error.h"

namespace numattn::decomp {

Tensor3::Tensor3(index_t n0, index_t n1, index_t n2) : dims_{n0, n1, n2} {
  NUMATTN_CHECK(n0 >= 0 && n1 >= 0 && n2 >= 0, "Tensor3: negative dimension {}x{}x{}", n0, n1, n2);
  data_.assign(static_cast<std::size_t>(n0 * n1 * n2), 0.0);
}

Tensor3 Tensor3::from_slices(std::span<const dense::Matrix> mats) {
  NUMATTN_CHECK(!mats.empty(), "Tensor3::from_slices: no matrices given");
  const index_t n1 = mats[0].rows(), n2 = mats[0].cols();
  Tensor3 x(static_cast<index_t>(mats.size()), n1, n2);
  for (std::size_t i = 0; i < mats.size(); ++i) {
    NUMATTN_CHECK(mats[i].rows() == n1 && mats[i].cols() == n2,
                  "Tensor3::from_slices: matrix {} is {}x{}, matrix 0 is {}x{}; all must have one shape", i,
                  mats[i].rows(), mats[i].cols(), n1, n2);
    for (index_t c = 0; c < n2; ++c)
      for (index_t b = 0; b < n1; ++b) x(static_cast<index_t>(i), b, c) = mats[i](b, c);
  }
  return x;
}

dense::Matrix Tensor3::slice(index_t i) const {
  NUMATTN_CHECK(i >= 0 && i < dims_[0], "Tensor3::slice: index {} outside [0, {})", i, dims_[0]);
  dense::Matrix m(dims_[1], dims_[2]);
  for (index_t c = 0; c < dims_[2]; ++c)
    for (index_t b = 0; b < dims_[1]; ++b) m(b, c) = (*this)(i, b, c);
  return m;
}

double Tensor3::norm() const {
  // Scaled sum of squares (as LAPACK's dnrm2): no overflow for entries near DBL_MAX.
  double scale = 0, ssq = 1;
  for (double v : data_) {
    if (v == 0) continue;
    const double a = std::abs(v);
    if (scale < a) {
      ssq = 1 + ssq * (scale / a) * (scale / a);
      scale = a;
    } else {
      ssq += (a / scale) * (a / scale);
    }
  }
  return scale * std::sqrt(ssq);
}

bool Tensor3::all_finite() const {
  for (double v : data_)
    if (!std::isfinite(v)) return false;
  return true;
}

dense::Matrix unfold(const Tensor3& x, int mode) {
  NUMATTN_CHECK(mode >= 0 && mode < 3, "unfold: mode {} is not 0, 1 or 2", mode);
  const index_t n0 = x.dim(0), n1 = x.dim(1), n2 = x.dim(2);
  if (mode == 0) return Eigen::Map<const dense::Matrix>(x.data(), n0, n1 * n2);
  if (mode == 2) return Eigen::Map<const dense::Matrix>(x.data(), n0 * n1, n2).transpose();
  dense::Matrix m(n1, n0 * n2);
  for (index_t c = 0; c < n2; ++c)
    for (index_t b = 0; b < n1; ++b)
      for (index_t a = 0; a < n0; ++a) m(b, a + n0 * c) = x(a, b, c);
  return m;
}

Tensor3 fold(const dense::Matrix& m, int mode, const std::array<index_t, 3>& dims) {
  NUMATTN_CHECK(mode >= 0 && mode < 3, "fold: mode {} is not 0, 1 or 2", mode);
  const index_t n0 = dims[0], n1 = dims[1], n2 = dims[2];
  NUMATTN_CHECK(m.rows() == dims[static_cast<std::size_t>(mode)] && m.rows() * m.cols() == n0 * n1 * n2,
                "fold: a {}x{} matrix is not the mode-{} unfolding of a {}x{}x{} tensor", m.rows(), m.cols(), mode,
                n0, n1, n2);
  Tensor3 x(n0, n1, n2);
  if (mode == 0) {
    std::copy(m.data(), m.data() + m.size(), x.data());
  } else if (mode == 2) {
    Eigen::Map<dense::Matrix>(x.data(), n0 * n1, n2) = m.transpose();
  } else {
    for (index_t c = 0; c < n2; ++c)
      for (index_t b = 0; b < n1; ++b)
        for (index_t a = 0; a < n0; ++a) x(a, b, c) = m(b, a + n0 * c);
  }
  return x;
}

dense::Matrix matmul(const dense::Matrix& a, const dense::Matrix& b, bool trans_a, bool trans_b) {
  const index_t m = trans_a ? a.cols() : a.rows(), k = trans_a ? a.rows() : a.cols();
  const index_t kb = trans_b ? b.cols() : b.rows(), n = trans_b ? b.rows() : b.cols();
  NUMATTN_CHECK(k == kb, "matmul: inner dimensions {} and {} differ", k, kb);
  dense::Matrix c = dense::Matrix::Zero(m, n);
  if (m == 0 || n == 0 || k == 0) return c;
  // A column-major X is the row-major Xᵀ: compute Cᵀ = op(B)ᵀ·op(A)ᵀ in row-major terms.
  blas::dgemm(trans_b ? blas::Trans::kYes : blas::Trans::kNo, trans_a ? blas::Trans::kYes : blas::Trans::kNo, n, m,
              k, 1.0, b.data(), b.rows(), a.data(), a.rows(), 0.0, c.data(), m);
  return c;
}

Tensor3 mode_product(const Tensor3& x, const dense::Matrix& m, int mode) {
  NUMATTN_CHECK(mode >= 0 && mode < 3, "mode_product: mode {} is not 0, 1 or 2", mode);
  NUMATTN_CHECK(m.cols() == x.dim(mode), "mode_product: a {}x{} matrix cannot act on mode {} of size {}", m.rows(),
                m.cols(), mode, x.dim(mode));
  std::array<index_t, 3> dims = x.dims();
  dims[static_cast<std::size_t>(mode)] = m.rows();
  return fold(matmul(m, unfold(x, mode)), mode, dims);
}

Tensor3 mode_product_t(const Tensor3& x, const dense::Matrix& m, int mode) {
  NUMATTN_CHECK(mode >= 0 && mode < 3, "mode_product_t: mode {} is not 0, 1 or 2", mode);
  NUMATTN_CHECK(m.rows() == x.dim(mode), "mode_product_t: a {}x{} matrix cannot act (transposed) on mode {} of size {}",
                m.rows(), m.cols(), mode, x.dim(mode));
  std::array<index_t, 3> dims = x.dims();
  dims[static_cast<std::size_t>(mode)] = m.cols();
  return fold(matmul(m, unfold(x, mode), true, false), mode, dims);
}

dense::Matrix khatri_rao(const dense::Matrix& a, const dense::Matrix& b) {
  NUMATTN_CHECK(a.cols() == b.cols(), "khatri_rao: column counts {} and {} differ", a.cols(), b.cols());
  dense::Matrix k(a.rows() * b.rows(), a.cols());
  for (index_t r = 0; r < a.cols(); ++r)
    for (index_t i = 0; i < a.rows(); ++i)
      for (index_t j = 0; j < b.rows(); ++j) k(i * b.rows() + j, r) = a(i, r) * b(j, r);
  return k;
}

double relative_error(const Tensor3& x, const Tensor3& y) {
  NUMATTN_CHECK(x.dims() == y.dims(), "relative_error: shapes differ");
  Tensor3 d(x.dim(0), x.dim(1), x.dim(2));
  for (index_t t = 0; t < x.size(); ++t) d.data()[t] = x.data()[t] - y.data()[t];
  const double nx = x.norm(), nd = d.norm();
  if (nx == 0) return nd == 0 ? 0.0 : std::numeric_limits<double>::infinity();
  return nd / nx;
}

}  // namespace numattn::decomp
