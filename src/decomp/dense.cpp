#include "numattn/decomp/dense.h"

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <limits>

#include "numattn/core/blas.h"
#include "numattn/core/error.h"

// LAPACK from the linked OpenBLAS (Fortran ABI: every argument by pointer, 32-bit integers as
// in Debian's libopenblas0, and one hidden length argument per CHARACTER argument, appended at
// the end, which gfortran-built code may read). Declared here so that no LAPACKE package is
// needed; only this file calls them.
extern "C" {
using lapack_len = std::size_t;
void dgesdd_(const char* jobz, const int* m, const int* n, double* a, const int* lda, double* s, double* u,
             const int* ldu, double* vt, const int* ldvt, double* work, const int* lwork, int* iwork, int* info,
             lapack_len);
void dgesvd_(const char* jobu, const char* jobvt, const int* m, const int* n, double* a, const int* lda, double* s,
             double* u, const int* ldu, double* vt, const int* ldvt, double* work, const int* lwork, int* info,
             lapack_len, lapack_len);
void dgesvj_(const char* joba, const char* jobu, const char* jobv, const int* m, const int* n, double* a,
             const int* lda, double* sva, const int* mv, double* v, const int* ldv, double* work, const int* lwork,
             int* info, lapack_len, lapack_len, lapack_len);
void dsyevd_(const char* jobz, const char* uplo, const int* n, double* a, const int* lda, double* w, double* work,
             const int* lwork, int* iwork, const int* liwork, int* info, lapack_len, lapack_len);
void dgeqrf_(const int* m, const int* n, double* a, const int* lda, double* tau, double* work, const int* lwork,
             int* info);
void dorgqr_(const int* m, const int* n, const int* k, double* a, const int* lda, const double* tau, double* work,
             const int* lwork, int* info);
void dgeqp3_(const int* m, const int* n, double* a, const int* lda, int* jpvt, double* tau, double* work,
             const int* lwork, int* info);
void dormqr_(const char* side, const char* trans, const int* m, const int* n, const int* k, const double* a,
             const int* lda, const double* tau, double* c, const int* ldc, double* work, const int* lwork, int* info,
             lapack_len, lapack_len);
void dtrtrs_(const char* uplo, const char* trans, const char* diag, const int* n, const int* nrhs, const double* a,
             const int* lda, double* b, const int* ldb, int* info, lapack_len, lapack_len, lapack_len);
void dgesv_(const int* n, const int* nrhs, double* a, const int* lda, int* ipiv, double* b, const int* ldb, int* info);
void dpotrf_(const char* uplo, const int* n, double* a, const int* lda, int* info, lapack_len);
void dpotrs_(const char* uplo, const int* n, const int* nrhs, const double* a, const int* lda, double* b,
             const int* ldb, int* info, lapack_len);
}

namespace numattn::decomp::dense {

namespace {

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();
constexpr double kEps = std::numeric_limits<double>::epsilon();

// LAPACK takes 32-bit sizes; a larger matrix would be silently truncated.
int to_int(Eigen::Index v, const char* what) {
  NUMATTN_CHECK(v >= 0 && v <= std::numeric_limits<int>::max(), "dense {}: size {} exceeds LAPACK's 32-bit sizes",
                what, v);
  return static_cast<int>(v);
}

// Optimal workspace from a LAPACK size query (lwork = -1 writes it to work[0]).
int query_size(double w) { return std::max(1, static_cast<int>(std::ceil(w))); }

bool finite(const ConstRef& a) { return a.size() == 0 || a.allFinite(); }

Matrix nan_matrix(Eigen::Index r, Eigen::Index c) { return Matrix::Constant(r, c, kNaN); }

Info from_lapack(int info, Info on_positive) {
  // info < 0 is an illegal argument: a bug here, never the caller's data.
  NUMATTN_ASSERT(info >= 0);
  return info == 0 ? Info::kSuccess : on_positive;
}

}  // namespace

const char* to_string(Info i) {
  switch (i) {
    case Info::kSuccess: return "success";
    case Info::kNumericalIssue: return "numerical_issue";
    case Info::kNoConvergence: return "no_convergence";
    case Info::kInvalidInput: return "invalid_input";
  }
  return "?";
}

// ---------------------------------------------------------------------------------------------
// SVD

namespace {

// One-sided Jacobi (dgesvj) of a tall m×n block (m ≥ n ≥ 1), overwritten by U·Σ's directions:
// U (m×n) in w, V (n×n) in v.
int gesvj_tall(Matrix& w, Vector& s, Matrix* v) {
  const int mi = to_int(w.rows(), "svd"), ni = to_int(w.cols(), "svd");
  const char joba = 'G', jobu = v ? 'U' : 'N', jobv = v ? 'V' : 'N';
  if (v) v->resize(ni, ni);
  const int mv = 0, ldv = v ? ni : 1, lwork = std::max(6, mi + ni);
  std::vector<double> work(static_cast<std::size_t>(lwork));
  double vdummy = 0;
  int info = 0;
  s.resize(ni);
  dgesvj_(&joba, &jobu, &jobv, &mi, &ni, w.data(), &mi, s.data(), &mv, v ? v->data() : &vdummy, &ldv, work.data(),
          &lwork, &info, 1, 1, 1);
  // The values are work[0]·sva (the scale guards against overflow; almost always 1). dgesvj
  // sorts them in decreasing order.
  if (info >= 0 && work[0] != 1.0) s *= work[0];
  return info;
}

int svd_jacobi(const ConstRef& a, bool vectors, Svd& out) {
  const bool tall = a.rows() >= a.cols();
  Matrix w = tall ? Matrix(a) : Matrix(a.transpose());
  Matrix v;
  const int info = gesvj_tall(w, out.s, vectors ? &v : nullptr);
  if (!vectors) return info;
  // Tall: A = W·Σ·Vᵀ. Wide: Aᵀ = W·Σ·Vᵀ, so A = V·Σ·Wᵀ.
  if (tall) {
    out.u = std::move(w);
    out.vt = v.transpose();
  } else {
    out.u = std::move(v);
    out.vt = w.transpose();
  }
  return info;
}

}  // namespace

Svd svd(const ConstRef& a, bool vectors, SvdAlgorithm alg) {
  const Eigen::Index m = a.rows(), n = a.cols(), k = std::min(m, n);
  Svd out;
  if (!finite(a)) {
    out.info = Info::kInvalidInput;
    out.s = Vector::Constant(k, kNaN);
    if (vectors) out.u = nan_matrix(m, k), out.vt = nan_matrix(k, n);
    return out;
  }
  if (k == 0) {
    out.s.resize(0);
    if (vectors) out.u = Matrix::Zero(m, 0), out.vt = Matrix::Zero(0, n);
    return out;
  }
  blas::ensure_serial();
  if (alg == SvdAlgorithm::kJacobi) {
    out.info = from_lapack(svd_jacobi(a, vectors, out), Info::kNoConvergence);
    return out;
  }
  const int mi = to_int(m, "svd"), ni = to_int(n, "svd"), ki = static_cast<int>(k);
  Matrix w = a;  // destroyed by LAPACK
  out.s.resize(k);
  if (vectors) out.u.resize(m, k), out.vt.resize(k, n);
  double* u = vectors ? out.u.data() : nullptr;
  double* vt = vectors ? out.vt.data() : nullptr;
  const int ldu = vectors ? mi : 1, ldvt = vectors ? ki : 1;
  const char job = vectors ? 'S' : 'N';
  // Divide and conquer (dgesdd) is several times faster than QR iteration (dgesvd) for the
  // vectors; in the rare case its iteration fails, the slower dgesvd gets a second try.
  std::vector<int> iwork(static_cast<std::size_t>(8 * k));
  double wq = 0;
  int lwork = -1, info = 0;
  dgesdd_(&job, &mi, &ni, w.data(), &mi, out.s.data(), u, &ldu, vt, &ldvt, &wq, &lwork, iwork.data(), &info, 1);
  NUMATTN_ASSERT(info == 0);
  lwork = query_size(wq);
  std::vector<double> work(static_cast<std::size_t>(lwork));
  dgesdd_(&job, &mi, &ni, w.data(), &mi, out.s.data(), u, &ldu, vt, &ldvt, work.data(), &lwork, iwork.data(), &info,
          1);
  if (info > 0) {
    w = a;
    lwork = -1;
    dgesvd_(&job, &job, &mi, &ni, w.data(), &mi, out.s.data(), u, &ldu, vt, &ldvt, &wq, &lwork, &info, 1, 1);
    NUMATTN_ASSERT(info == 0);
    lwork = query_size(wq);
    work.assign(static_cast<std::size_t>(lwork), 0.0);
    dgesvd_(&job, &job, &mi, &ni, w.data(), &mi, out.s.data(), u, &ldu, vt, &ldvt, work.data(), &lwork, &info, 1, 1);
  }
  out.info = from_lapack(info, Info::kNoConvergence);
  return out;
}

Vector singular_values(const ConstRef& a, SvdAlgorithm alg) { return svd(a, false, alg).s; }

double spectral_norm(const ConstRef& a, SvdAlgorithm alg) {
  if (a.size() == 0) return 0.0;
  return singular_values(a, alg)(0);
}

double condition_number(const ConstRef& a) {
  if (a.size() == 0) return 1.0;
  if (!finite(a)) return std::numeric_limits<double>::infinity();
  const Vector s = singular_values(a);
  const double smax = s(0), smin = s(s.size() - 1);
  if (!(smax > 0) || !(smin > 0)) return std::numeric_limits<double>::infinity();
  return smax / smin;
}

Matrix pinv(const ConstRef& a, double rcond) {
  const Eigen::Index m = a.rows(), n = a.cols();
  if (a.size() == 0) return Matrix::Zero(n, m);
  const Svd f = svd(a, true);
  if (f.info != Info::kSuccess) return nan_matrix(n, m);
  const double tol = (rcond < 0 ? kEps * static_cast<double>(std::max(m, n)) : rcond) * f.s(0);
  // A⁺ = V·diag(1/σ)·Uᵀ over the kept values: scale the rows of Vᵀ, then one GEMM.
  Eigen::Index keep = 0;
  while (keep < f.s.size() && f.s(keep) > tol) ++keep;
  Matrix out = Matrix::Zero(n, m);
  if (keep == 0) return out;
  Matrix svt = f.vt.topRows(keep);
  for (Eigen::Index i = 0; i < keep; ++i) svt.row(i) /= f.s(i);
  // out (n×m) = svtᵀ·U_keepᵀ. The BLAS wrapper is row-major, and a column-major matrix read as
  // row-major is its transpose: compute outᵀ = U_keep·svt (m×n, row-major = out column-major)
  // from Uᵀ (row-major k×m, first `keep` rows) and svtᵀ (row-major n×keep), both transposed.
  blas::dgemm(blas::Trans::kYes, blas::Trans::kYes, m, n, keep, 1.0, f.u.data(), m, svt.data(), keep, 0.0, out.data(),
              n);
  return out;
}

// ---------------------------------------------------------------------------------------------
// Symmetric eigendecomposition

SymEig sym_eig(const ConstRef& a, bool vectors) {
  NUMATTN_CHECK(a.rows() == a.cols(), "dense sym_eig: matrix is {}x{}, must be square", a.rows(), a.cols());
  const Eigen::Index n = a.rows();
  SymEig out;
  // Only the lower triangle is read, as LAPACK reads it (the upper may hold anything).
  bool fin = true;
  for (Eigen::Index j = 0; j < n && fin; ++j)
    for (Eigen::Index i = j; i < n; ++i)
      if (!std::isfinite(a(i, j))) {
        fin = false;
        break;
      }
  if (!fin) {
    out.info = Info::kInvalidInput;
    out.values = Vector::Constant(n, kNaN);
    if (vectors) out.vectors = nan_matrix(n, n);
    return out;
  }
  if (n == 0) {
    out.values.resize(0);
    if (vectors) out.vectors.resize(0, 0);
    return out;
  }
  const int ni = to_int(n, "sym_eig");
  Matrix w = a;
  out.values.resize(n);
  const char job = vectors ? 'V' : 'N', uplo = 'L';
  blas::ensure_serial();
  double wq = 0;
  int iq = 0, lwork = -1, liwork = -1, info = 0;
  dsyevd_(&job, &uplo, &ni, w.data(), &ni, out.values.data(), &wq, &lwork, &iq, &liwork, &info, 1, 1);
  NUMATTN_ASSERT(info == 0);
  lwork = query_size(wq);
  liwork = std::max(1, iq);
  std::vector<double> work(static_cast<std::size_t>(lwork));
  std::vector<int> iwork(static_cast<std::size_t>(liwork));
  dsyevd_(&job, &uplo, &ni, w.data(), &ni, out.values.data(), work.data(), &lwork, iwork.data(), &liwork, &info, 1,
          1);
  out.info = from_lapack(info, Info::kNoConvergence);
  if (vectors) out.vectors = std::move(w);
  return out;
}

// ---------------------------------------------------------------------------------------------
// QR

namespace {

// R (k×n upper trapezoidal) from LAPACK's packed factor, and Q (m×k) from its reflectors.
void unpack_qr(const Matrix& f, const std::vector<double>& tau, bool want_q, Matrix& q, Matrix& r) {
  const Eigen::Index m = f.rows(), n = f.cols(), k = std::min(m, n);
  r = Matrix::Zero(k, n);
  for (Eigen::Index j = 0; j < n; ++j)
    for (Eigen::Index i = 0; i <= std::min(j, k - 1); ++i) r(i, j) = f(i, j);
  if (!want_q) return;
  q = f.leftCols(k);
  if (k == 0) return;
  const int mi = static_cast<int>(m), ki = static_cast<int>(k);
  double wq = 0;
  int lwork = -1, info = 0;
  dorgqr_(&mi, &ki, &ki, q.data(), &mi, tau.data(), &wq, &lwork, &info);
  NUMATTN_ASSERT(info == 0);
  lwork = query_size(wq);
  std::vector<double> work(static_cast<std::size_t>(lwork));
  dorgqr_(&mi, &ki, &ki, q.data(), &mi, tau.data(), work.data(), &lwork, &info);
  NUMATTN_ASSERT(info == 0);
}

// dgeqp3 on w (overwritten by the packed factor); perm 0-based.
void geqp3(Matrix& w, std::vector<double>& tau, std::vector<std::int64_t>& perm) {
  const Eigen::Index m = w.rows(), n = w.cols();
  const int mi = to_int(m, "colpiv_qr"), ni = to_int(n, "colpiv_qr");
  tau.assign(static_cast<std::size_t>(std::min(m, n)), 0.0);
  std::vector<int> jpvt(static_cast<std::size_t>(n), 0);  // 0: every column is free to move
  perm.assign(static_cast<std::size_t>(n), 0);
  if (m == 0 || n == 0) {
    for (Eigen::Index j = 0; j < n; ++j) perm[static_cast<std::size_t>(j)] = j;
    return;
  }
  double wq = 0;
  int lwork = -1, info = 0;
  dgeqp3_(&mi, &ni, w.data(), &mi, jpvt.data(), tau.data(), &wq, &lwork, &info);
  NUMATTN_ASSERT(info == 0);
  lwork = query_size(wq);
  std::vector<double> work(static_cast<std::size_t>(lwork));
  dgeqp3_(&mi, &ni, w.data(), &mi, jpvt.data(), tau.data(), work.data(), &lwork, &info);
  NUMATTN_ASSERT(info == 0);
  for (Eigen::Index j = 0; j < n; ++j) perm[static_cast<std::size_t>(j)] = jpvt[static_cast<std::size_t>(j)] - 1;
}

// #{i : |R_ii| > threshold·max|R_ii|} of a packed pivoted factor.
std::int64_t pivoted_rank(const Matrix& f, double threshold) {
  const Eigen::Index k = std::min(f.rows(), f.cols());
  if (k == 0) return 0;
  if (threshold < 0) threshold = kEps * static_cast<double>(k);
  double mx = 0;
  for (Eigen::Index i = 0; i < k; ++i) mx = std::max(mx, std::abs(f(i, i)));
  std::int64_t r = 0;
  for (Eigen::Index i = 0; i < k; ++i) r += std::abs(f(i, i)) > threshold * mx;
  return r;
}

}  // namespace

Qr qr(const ConstRef& a, bool want_q) {
  const Eigen::Index m = a.rows(), n = a.cols(), k = std::min(m, n);
  Qr out;
  if (!finite(a)) {
    out.info = Info::kInvalidInput;
    out.r = nan_matrix(k, n);
    if (want_q) out.q = nan_matrix(m, k);
    return out;
  }
  Matrix w = a;
  std::vector<double> tau(static_cast<std::size_t>(k));
  if (k > 0) {
    const int mi = to_int(m, "qr"), ni = to_int(n, "qr");
    blas::ensure_serial();
    double wq = 0;
    int lwork = -1, info = 0;
    dgeqrf_(&mi, &ni, w.data(), &mi, tau.data(), &wq, &lwork, &info);
    NUMATTN_ASSERT(info == 0);
    lwork = query_size(wq);
    std::vector<double> work(static_cast<std::size_t>(lwork));
    dgeqrf_(&mi, &ni, w.data(), &mi, tau.data(), work.data(), &lwork, &info);
    NUMATTN_ASSERT(info == 0);
  }
  unpack_qr(w, tau, want_q, out.q, out.r);
  return out;
}

ColPivQr colpiv_qr(const ConstRef& a, double threshold, bool want_q) {
  const Eigen::Index m = a.rows(), n = a.cols(), k = std::min(m, n);
  ColPivQr out;
  if (!finite(a)) {
    out.info = Info::kInvalidInput;
    out.r = nan_matrix(k, n);
    if (want_q) out.q = nan_matrix(m, k);
    out.perm.resize(static_cast<std::size_t>(n));
    for (Eigen::Index j = 0; j < n; ++j) out.perm[static_cast<std::size_t>(j)] = j;
    return out;
  }
  Matrix w = a;
  std::vector<double> tau;
  blas::ensure_serial();
  geqp3(w, tau, out.perm);
  out.rank = pivoted_rank(w, threshold);
  unpack_qr(w, tau, want_q, out.q, out.r);
  return out;
}

// ---------------------------------------------------------------------------------------------
// Solves

Solution lu_solve(const ConstRef& a, const ConstRef& b) {
  NUMATTN_CHECK(a.rows() == a.cols() && b.rows() == a.rows(),
                "dense lu_solve: A is {}x{} and B is {}x{}; need A n×n and B n×p", a.rows(), a.cols(), b.rows(),
                b.cols());
  const Eigen::Index n = a.rows(), p = b.cols();
  Solution out;
  out.rank = n;
  if (!finite(a) || !finite(b)) {
    out.info = Info::kInvalidInput;
    out.x = nan_matrix(n, p);
    return out;
  }
  out.x = b;
  if (n == 0 || p == 0) return out;
  const int ni = to_int(n, "lu_solve"), pi = to_int(p, "lu_solve");
  Matrix w = a;
  std::vector<int> ipiv(static_cast<std::size_t>(n));
  int info = 0;
  blas::ensure_serial();
  dgesv_(&ni, &pi, w.data(), &ni, ipiv.data(), out.x.data(), &ni, &info);
  out.info = from_lapack(info, Info::kNumericalIssue);
  if (info > 0) out.x.setConstant(kNaN);  // U(info, info) is exactly 0: no solution computed
  return out;
}

Solution cholesky_solve(const ConstRef& a, const ConstRef& b) {
  NUMATTN_CHECK(a.rows() == a.cols() && b.rows() == a.rows(),
                "dense cholesky_solve: A is {}x{} and B is {}x{}; need A n×n and B n×p", a.rows(), a.cols(),
                b.rows(), b.cols());
  const Eigen::Index n = a.rows(), p = b.cols();
  Solution out;
  out.rank = n;
  if (!finite(a) || !finite(b)) {
    out.info = Info::kInvalidInput;
    out.x = nan_matrix(n, p);
    return out;
  }
  out.x = b;
  if (n == 0 || p == 0) return out;
  const int ni = to_int(n, "cholesky_solve"), pi = to_int(p, "cholesky_solve");
  Matrix w = a;
  const char uplo = 'L';
  int info = 0;
  blas::ensure_serial();
  dpotrf_(&uplo, &ni, w.data(), &ni, &info, 1);
  if (info > 0) {
    out.info = Info::kNumericalIssue;
    out.x.setConstant(kNaN);
    return out;
  }
  NUMATTN_ASSERT(info == 0);
  dpotrs_(&uplo, &ni, &pi, w.data(), &ni, out.x.data(), &ni, &info, 1);
  NUMATTN_ASSERT(info == 0);
  return out;
}

Solution lstsq(const ConstRef& a, const ConstRef& b, double threshold) {
  NUMATTN_CHECK(b.rows() == a.rows(), "dense lstsq: A is {}x{} and B is {}x{}; need the same row count", a.rows(),
                a.cols(), b.rows(), b.cols());
  const Eigen::Index m = a.rows(), n = a.cols(), p = b.cols(), k = std::min(m, n);
  Solution out;
  if (!finite(a) || !finite(b)) {
    out.info = Info::kInvalidInput;
    out.x = nan_matrix(n, p);
    return out;
  }
  out.x = Matrix::Zero(n, p);
  if (k == 0 || p == 0) return out;
  Matrix w = a;
  std::vector<double> tau;
  std::vector<std::int64_t> perm;
  blas::ensure_serial();
  geqp3(w, tau, perm);
  const std::int64_t rk = pivoted_rank(w, threshold);
  out.rank = rk;
  if (rk == 0) return out;
  // c = Qᵀ·B (all k reflectors), then R[0:rk, 0:rk]·z = c[0:rk], x[perm[j]] = z[j].
  const int mi = static_cast<int>(m), pi = to_int(p, "lstsq"), ki = static_cast<int>(k), ri = static_cast<int>(rk);
  Matrix c = b;
  const char side = 'L', trans = 'T';
  double wq = 0;
  int lwork = -1, info = 0;
  dormqr_(&side, &trans, &mi, &pi, &ki, w.data(), &mi, tau.data(), c.data(), &mi, &wq, &lwork, &info, 1, 1);
  NUMATTN_ASSERT(info == 0);
  lwork = query_size(wq);
  std::vector<double> work(static_cast<std::size_t>(lwork));
  dormqr_(&side, &trans, &mi, &pi, &ki, w.data(), &mi, tau.data(), c.data(), &mi, work.data(), &lwork, &info, 1, 1);
  NUMATTN_ASSERT(info == 0);
  const char up = 'U', no = 'N', nonunit = 'N';
  dtrtrs_(&up, &no, &nonunit, &ri, &pi, w.data(), &mi, c.data(), &mi, &info, 1, 1, 1);
  // R[i, i] ≠ 0 for i < rank by the rank test, so dtrtrs cannot report singularity.
  NUMATTN_ASSERT(info == 0);
  for (std::int64_t j = 0; j < rk; ++j) out.x.row(perm[static_cast<std::size_t>(j)]) = c.row(j);
  return out;
}

}  // namespace numattn::decomp::dense
