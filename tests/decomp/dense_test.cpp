// Dense float64 factorisations (decomp/dense.h, LAPACK): reconstruction to 1e-12·‖A‖,
// orthogonality, known spectra, rank-deficient, empty and 1×1 inputs, NaN reported, solves.
// Checks are plain loops (no Eigen products): this file stays cheap to compile.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <limits>
#include <sstream>
#include <string>
#include <vector>

#include "numattn/core/error.h"
#include "numattn/core/rng.h"
#include "numattn/decomp/dense.h"
#include "support/test_util.h"

namespace numattn::decomp::dense {
namespace {
namespace NUMATTN_UNITY_ID {

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

Matrix randn(Eigen::Index m, Eigen::Index n, std::uint64_t stream) {
  const CounterRng rng(test::base_seed(), stream);
  Matrix a(m, n);
  for (Eigen::Index j = 0; j < n; ++j)
    for (Eigen::Index i = 0; i < m; ++i) a(i, j) = rng.normal(static_cast<std::uint64_t>(j * m + i));
  return a;
}

Matrix mul(const Matrix& a, const Matrix& b) {
  Matrix c = Matrix::Zero(a.rows(), b.cols());
  for (Eigen::Index j = 0; j < b.cols(); ++j)
    for (Eigen::Index k = 0; k < a.cols(); ++k)
      for (Eigen::Index i = 0; i < a.rows(); ++i) c(i, j) += a(i, k) * b(k, j);
  return c;
}

double fro(const Matrix& a) {
  double s = 0;
  for (Eigen::Index j = 0; j < a.cols(); ++j)
    for (Eigen::Index i = 0; i < a.rows(); ++i) s += a(i, j) * a(i, j);
  return std::sqrt(s);
}

double diff(const Matrix& a, const Matrix& b) {
  EXPECT_EQ(a.rows(), b.rows());
  EXPECT_EQ(a.cols(), b.cols());
  Matrix d = a;
  for (Eigen::Index j = 0; j < a.cols(); ++j)
    for (Eigen::Index i = 0; i < a.rows(); ++i) d(i, j) -= b(i, j);
  return fro(d);
}

Matrix transpose(const Matrix& a) {
  Matrix t(a.cols(), a.rows());
  for (Eigen::Index j = 0; j < a.cols(); ++j)
    for (Eigen::Index i = 0; i < a.rows(); ++i) t(j, i) = a(i, j);
  return t;
}

/// ‖QᵀQ − I‖_F for the columns of q.
double orth_error(const Matrix& q) {
  Matrix g = mul(transpose(q), q);
  for (Eigen::Index i = 0; i < g.rows(); ++i) g(i, i) -= 1;
  return fro(g);
}

Matrix scale_cols(Matrix u, const Vector& s) {
  for (Eigen::Index j = 0; j < s.size(); ++j)
    for (Eigen::Index i = 0; i < u.rows(); ++i) u(i, j) *= s(j);
  return u;
}

/// Rank-r m×n matrix: product of m×r and r×n Gaussians.
Matrix low_rank(Eigen::Index m, Eigen::Index n, Eigen::Index r, std::uint64_t stream) {
  return mul(randn(m, r, stream), randn(r, n, stream + 100));
}

void expect_svd_ok(const Matrix& a, const Svd& f, double tol) {
  const Eigen::Index k = std::min(a.rows(), a.cols());
  ASSERT_EQ(f.info, Info::kSuccess);
  ASSERT_EQ(f.s.size(), k);
  ASSERT_EQ(f.u.rows(), a.rows());
  ASSERT_EQ(f.u.cols(), k);
  ASSERT_EQ(f.vt.rows(), k);
  ASSERT_EQ(f.vt.cols(), a.cols());
  EXPECT_LE(diff(mul(scale_cols(f.u, f.s), f.vt), a), tol * fro(a));
  for (Eigen::Index i = 0; i < k; ++i) {
    EXPECT_GE(f.s(i), 0.0);
    if (i > 0) EXPECT_LE(f.s(i), f.s(i - 1));
  }
}

TEST(DenseSvd, ReconstructsAndIsOrthogonalTallWideSquare) {
  for (auto [m, n] : {std::pair<Eigen::Index, Eigen::Index>{9, 5}, {5, 9}, {17, 17}, {64, 3}}) {
    const Matrix a = randn(m, n, static_cast<std::uint64_t>(m * 100 + n));
    for (SvdAlgorithm alg : {SvdAlgorithm::kDivideAndConquer, SvdAlgorithm::kJacobi}) {
      const Svd f = svd(a, true, alg);
      expect_svd_ok(a, f, 1e-12);
      EXPECT_LE(orth_error(f.u), 1e-12) << m << "x" << n;
      EXPECT_LE(orth_error(transpose(f.vt)), 1e-12) << m << "x" << n;
      // Values only: the same numbers.
      const Vector s = singular_values(a, alg);
      ASSERT_EQ(s.size(), f.s.size());
      for (Eigen::Index i = 0; i < s.size(); ++i) EXPECT_NEAR(s(i), f.s(i), 1e-13 * f.s(0));
    }
    // The two algorithms agree on the values.
    const Vector sd = singular_values(a), sj = singular_values(a, SvdAlgorithm::kJacobi);
    for (Eigen::Index i = 0; i < sd.size(); ++i) EXPECT_NEAR(sd(i), sj(i), 1e-13 * sd(0));
  }
}

TEST(DenseSvd, KnownMatrices) {
  // [[2, 0], [0, −3]]: σ = (3, 2).
  Matrix a(2, 2);
  a << 2, 0, 0, -3;
  Vector s = singular_values(a);
  EXPECT_NEAR(s(0), 3, 1e-15);
  EXPECT_NEAR(s(1), 2, 1e-15);
  EXPECT_NEAR(condition_number(a), 1.5, 1e-15);
  // [[1, 1], [1, 1], [0, 0]]: rank 1, σ = (2, 0).
  Matrix b(3, 2);
  b << 1, 1, 1, 1, 0, 0;
  const Svd f = svd(b);
  expect_svd_ok(b, f, 1e-15);
  EXPECT_NEAR(f.s(0), 2, 1e-15);
  EXPECT_LE(f.s(1), 1e-15);
  EXPECT_NEAR(spectral_norm(b), 2, 1e-15);
  // 1×1: σ = |a|, U·Vᵀ = sign(a).
  Matrix c(1, 1);
  c << -4.5;
  const Svd g = svd(c);
  expect_svd_ok(c, g, 1e-15);
  EXPECT_EQ(g.s(0), 4.5);
  EXPECT_EQ(g.u(0, 0) * g.vt(0, 0), -1.0);
  EXPECT_EQ(condition_number(c), 1.0);
}

TEST(DenseSvd, RankDeficient) {
  const Matrix a = low_rank(20, 12, 4, 7);
  const Svd f = svd(a);
  expect_svd_ok(a, f, 1e-12);
  EXPECT_LE(orth_error(f.u), 1e-12);  // dgesdd: orthonormal even on the null directions
  EXPECT_LE(orth_error(transpose(f.vt)), 1e-12);
  for (Eigen::Index i = 4; i < 12; ++i) EXPECT_LE(f.s(i), 1e-13 * f.s(0)) << i;
  EXPECT_GT(f.s(3), 1e-3 * f.s(0));
  EXPECT_GT(condition_number(a), 1e12);
  const Svd j = svd(a, true, SvdAlgorithm::kJacobi);
  for (Eigen::Index i = 0; i < 4; ++i) EXPECT_NEAR(j.s(i), f.s(i), 1e-13 * f.s(0));
  // Exactly singular: κ = +inf.
  EXPECT_EQ(condition_number(Matrix::Zero(3, 3)), std::numeric_limits<double>::infinity());
}

TEST(DenseSvd, EmptyAndNonFinite) {
  for (auto [m, n] : {std::pair<Eigen::Index, Eigen::Index>{0, 3}, {3, 0}, {0, 0}}) {
    const Svd f = svd(Matrix(m, n));
    EXPECT_EQ(f.info, Info::kSuccess);
    EXPECT_EQ(f.s.size(), 0);
    EXPECT_EQ(f.u.rows(), m);
    EXPECT_EQ(f.u.cols(), 0);
    EXPECT_EQ(f.vt.rows(), 0);
    EXPECT_EQ(f.vt.cols(), n);
    EXPECT_EQ(spectral_norm(Matrix(m, n)), 0.0);
    EXPECT_EQ(condition_number(Matrix(m, n)), 1.0);
    const Matrix p = pinv(Matrix(m, n));
    EXPECT_EQ(p.rows(), n);
    EXPECT_EQ(p.cols(), m);
  }
  for (double bad : {kNaN, std::numeric_limits<double>::infinity()}) {
    Matrix a = randn(4, 3, 3);
    a(2, 1) = bad;
    for (SvdAlgorithm alg : {SvdAlgorithm::kDivideAndConquer, SvdAlgorithm::kJacobi}) {
      const Svd f = svd(a, true, alg);
      EXPECT_EQ(f.info, Info::kInvalidInput);
      ASSERT_EQ(f.s.size(), 3);
      EXPECT_TRUE(std::isnan(f.s(0)));
      EXPECT_TRUE(std::isnan(f.u(0, 0)));
      EXPECT_TRUE(std::isnan(f.vt(0, 0)));
    }
    EXPECT_TRUE(std::isnan(spectral_norm(a)));
    EXPECT_EQ(condition_number(a), std::numeric_limits<double>::infinity());
    EXPECT_TRUE(std::isnan(pinv(a)(0, 0)));
  }
  EXPECT_STREQ(to_string(Info::kInvalidInput), "invalid_input");
}

TEST(DensePinv, MoorePenroseConditions) {
  for (const Matrix& a : {randn(7, 4, 11), randn(4, 7, 12), low_rank(9, 8, 3, 13)}) {
    const Matrix x = pinv(a);
    ASSERT_EQ(x.rows(), a.cols());
    ASSERT_EQ(x.cols(), a.rows());
    const Matrix ax = mul(a, x), xa = mul(x, a);
    EXPECT_LE(diff(mul(ax, a), a), 1e-12 * fro(a));
    EXPECT_LE(diff(mul(xa, x), x), 1e-12 * fro(x));
    EXPECT_LE(diff(ax, transpose(ax)), 1e-12 * fro(ax));
    EXPECT_LE(diff(xa, transpose(xa)), 1e-12 * fro(xa));
  }
  // Rank one u·vᵀ: A⁺ = v·uᵀ / (‖u‖²‖v‖²).
  Matrix u(3, 1), v(2, 1);
  u << 1, 2, 2;
  v << 3, 4;
  const Matrix x = pinv(mul(u, transpose(v)));
  const Matrix want = mul(v, transpose(u)) / (9.0 * 25.0);
  EXPECT_LE(diff(x, want), 1e-15);
}

TEST(DenseSymEig, DecomposesAndReadsTheLowerTriangle) {
  Matrix a(2, 2);
  a << 2, 1, 1, 2;
  SymEig e = sym_eig(a);
  ASSERT_EQ(e.info, Info::kSuccess);
  EXPECT_NEAR(e.values(0), 1, 1e-15);
  EXPECT_NEAR(e.values(1), 3, 1e-15);
  // A random symmetric matrix, garbage above the diagonal.
  const Matrix g = randn(12, 12, 21);
  Matrix s = mul(g, transpose(g));
  for (Eigen::Index i = 0; i < 12; ++i) s(i, i) -= 10;  // indefinite
  Matrix lower_only = s;
  for (Eigen::Index j = 1; j < 12; ++j)
    for (Eigen::Index i = 0; i < j; ++i) lower_only(i, j) = 1e6;
  e = sym_eig(lower_only);
  ASSERT_EQ(e.info, Info::kSuccess);
  for (Eigen::Index i = 1; i < 12; ++i) EXPECT_LE(e.values(i - 1), e.values(i));
  EXPECT_LE(orth_error(e.vectors), 1e-12);
  EXPECT_LE(diff(mul(s, e.vectors), scale_cols(e.vectors, e.values)), 1e-12 * fro(s));
  const SymEig v = sym_eig(lower_only, false);
  for (Eigen::Index i = 0; i < 12; ++i) EXPECT_NEAR(v.values(i), e.values(i), 1e-12 * fro(s));
  // Empty, 1×1, NaN (in the lower triangle only counts).
  EXPECT_EQ(sym_eig(Matrix(0, 0)).values.size(), 0);
  Matrix one(1, 1);
  one << -2;
  EXPECT_EQ(sym_eig(one).values(0), -2.0);
  EXPECT_EQ(std::abs(sym_eig(one).vectors(0, 0)), 1.0);
  Matrix bad = s;
  bad(0, 5) = kNaN;  // upper: ignored
  EXPECT_EQ(sym_eig(bad).info, Info::kSuccess);
  bad(5, 0) = kNaN;
  e = sym_eig(bad);
  EXPECT_EQ(e.info, Info::kInvalidInput);
  EXPECT_TRUE(std::isnan(e.values(0)));
  EXPECT_TRUE(std::isnan(e.vectors(0, 0)));
  EXPECT_THROW(sym_eig(Matrix(2, 3)), Error);
}

TEST(DenseQr, ThinFactorsReconstruct) {
  for (auto [m, n] : {std::pair<Eigen::Index, Eigen::Index>{10, 4}, {4, 10}, {6, 6}, {1, 1}}) {
    const Matrix a = randn(m, n, static_cast<std::uint64_t>(300 + m * 10 + n));
    const Qr f = qr(a);
    const Eigen::Index k = std::min(m, n);
    ASSERT_EQ(f.info, Info::kSuccess);
    ASSERT_EQ(f.q.rows(), m);
    ASSERT_EQ(f.q.cols(), k);
    ASSERT_EQ(f.r.rows(), k);
    ASSERT_EQ(f.r.cols(), n);
    EXPECT_LE(diff(mul(f.q, f.r), a), 1e-12 * fro(a));
    EXPECT_LE(orth_error(f.q), 1e-12);
    for (Eigen::Index j = 0; j < n; ++j)
      for (Eigen::Index i = j + 1; i < k; ++i) EXPECT_EQ(f.r(i, j), 0.0);
    // Without Q: the same R.
    EXPECT_EQ(diff(qr(a, false).r, f.r), 0.0);
  }
  const Qr e = qr(Matrix(0, 4));
  EXPECT_EQ(e.q.rows(), 0);
  EXPECT_EQ(e.r.rows(), 0);
  EXPECT_EQ(e.r.cols(), 4);
  Matrix bad = randn(3, 3, 5);
  bad(1, 1) = kNaN;
  EXPECT_EQ(qr(bad).info, Info::kInvalidInput);
  EXPECT_TRUE(std::isnan(qr(bad).r(0, 0)));
}

TEST(DenseColPivQr, PivotsRevealRank) {
  // Columns 3 and 5 are combinations of 0, 1, 2 (rank 3); column 4 is the largest.
  Matrix a = randn(8, 6, 31);
  for (Eigen::Index i = 0; i < 8; ++i) {
    a(i, 4) *= 10;
    a(i, 3) = a(i, 0) - 2 * a(i, 1);
    a(i, 5) = 0.5 * a(i, 2) + 0.1 * a(i, 4);
  }
  ColPivQr f = colpiv_qr(a, -1, true);
  ASSERT_EQ(f.info, Info::kSuccess);
  EXPECT_EQ(f.perm[0], 4);  // Businger–Golub: the largest column first
  EXPECT_EQ(f.rank, 4);     // columns 0, 1, 2, 4 (3 and 5 are combinations of them)
  // A·P = Q·R.
  Matrix ap(8, 6);
  std::vector<int> seen(6, 0);
  for (Eigen::Index j = 0; j < 6; ++j) {
    ++seen[static_cast<std::size_t>(f.perm[static_cast<std::size_t>(j)])];
    ap.col(j) = a.col(f.perm[static_cast<std::size_t>(j)]);
  }
  for (int c : seen) EXPECT_EQ(c, 1);
  EXPECT_LE(diff(mul(f.q, f.r), ap), 1e-12 * fro(a));
  EXPECT_LE(orth_error(f.q), 1e-12);
  for (Eigen::Index i = 1; i < 6; ++i) EXPECT_LE(std::abs(f.r(i, i)), std::abs(f.r(i - 1, i - 1)) * (1 + 1e-12));
  // A looser threshold cuts more; an exactly zero matrix has rank 0.
  EXPECT_EQ(colpiv_qr(low_rank(10, 7, 3, 32)).rank, 3);
  EXPECT_EQ(colpiv_qr(Matrix::Zero(4, 4)).rank, 0);
  Matrix graded = Matrix::Zero(4, 4);
  for (Eigen::Index i = 0; i < 4; ++i) graded(i, i) = std::pow(10.0, -3.0 * static_cast<double>(i));
  EXPECT_EQ(colpiv_qr(graded).rank, 4);
  EXPECT_EQ(colpiv_qr(graded, 1e-4).rank, 2);
  f = colpiv_qr(Matrix(0, 3));
  EXPECT_EQ(f.rank, 0);
  EXPECT_EQ(f.perm.size(), 3u);
  Matrix bad = a;
  bad(0, 0) = kNaN;
  EXPECT_EQ(colpiv_qr(bad).info, Info::kInvalidInput);
}

TEST(DenseSolve, LuCholeskyAndLeastSquares) {
  const Matrix a = randn(9, 9, 41), b = randn(9, 3, 42);
  Solution s = lu_solve(a, b);
  ASSERT_EQ(s.info, Info::kSuccess);
  EXPECT_LE(diff(mul(a, s.x), b), 1e-10 * fro(b));
  // SPD: Cholesky; the same answer as LU.
  Matrix spd = mul(transpose(a), a);
  for (Eigen::Index i = 0; i < 9; ++i) spd(i, i) += 1;
  const Solution c = cholesky_solve(spd, b), l = lu_solve(spd, b);
  ASSERT_EQ(c.info, Info::kSuccess);
  EXPECT_LE(diff(mul(spd, c.x), b), 1e-11 * fro(b));
  EXPECT_LE(diff(c.x, l.x), 1e-11 * fro(l.x));
  // Exactly singular (LU) and indefinite (Cholesky): reported, NaN out.
  Matrix sing = a;
  sing.col(4).setZero();
  s = lu_solve(sing, b);
  EXPECT_EQ(s.info, Info::kNumericalIssue);
  EXPECT_TRUE(std::isnan(s.x(0, 0)));
  Matrix indef = spd;
  indef(3, 3) = -1;
  s = cholesky_solve(indef, b);
  EXPECT_EQ(s.info, Info::kNumericalIssue);
  EXPECT_TRUE(std::isnan(s.x(0, 0)));
  Matrix bad = b;
  bad(2, 2) = kNaN;
  EXPECT_EQ(lu_solve(a, bad).info, Info::kInvalidInput);
  EXPECT_EQ(cholesky_solve(spd, bad).info, Info::kInvalidInput);
  EXPECT_EQ(lstsq(a, bad).info, Info::kInvalidInput);
  EXPECT_THROW(lu_solve(a, randn(4, 1, 1)), Error);
  EXPECT_EQ(lu_solve(Matrix(0, 0), Matrix(0, 2)).x.cols(), 2);

  // Tall least squares: the normal equations Aᵀ(AX − B) = 0, and X = A⁺B.
  const Matrix t = randn(15, 5, 43), tb = randn(15, 2, 44);
  s = lstsq(t, tb);
  ASSERT_EQ(s.info, Info::kSuccess);
  EXPECT_EQ(s.rank, 5);
  Matrix res = mul(t, s.x) - tb;
  EXPECT_LE(fro(mul(transpose(t), res)), 1e-12 * fro(t) * fro(tb));
  EXPECT_LE(diff(s.x, mul(pinv(t), tb)), 1e-12 * fro(s.x));
  // Square: the LU answer.
  EXPECT_LE(diff(lstsq(a, b).x, lu_solve(a, b).x), 1e-10 * fro(lu_solve(a, b).x));
  // Rank-deficient: the basic solution (zeros off the pivot columns), still optimal.
  const Matrix d = low_rank(12, 6, 3, 45), db = randn(12, 1, 46);
  s = lstsq(d, db);
  EXPECT_EQ(s.rank, 3);
  int zeros = 0;
  for (Eigen::Index i = 0; i < 6; ++i) zeros += s.x(i, 0) == 0.0;
  EXPECT_EQ(zeros, 3);
  res = mul(d, s.x) - db;
  EXPECT_LE(fro(mul(transpose(d), res)), 1e-10 * fro(d) * fro(db));
  // Underdetermined, full row rank: an exact solution.
  const Matrix w = randn(3, 7, 47), wb = randn(3, 2, 48);
  EXPECT_LE(diff(mul(w, lstsq(w, wb).x), wb), 1e-12 * fro(wb));
}

// The compile-time rule of docs/design.md: Eigen's decompositions are instantiated in
// src/decomp/dense.cpp only (each other TU that does so costs CI minutes under ASan).
TEST(DenseApi, NoOtherFileUsesEigenDecompositions) {
  namespace fs = std::filesystem;
  const std::vector<std::string> banned = {
      "<Eigen/Dense>", "<Eigen/SVD>", "<Eigen/QR>", "<Eigen/Eigenvalues>", "<Eigen/LU>", "<Eigen/Cholesky>",
      "<Eigen/Eigen>", "BDCSVD<", "JacobiSVD<", "SelfAdjointEigenSolver<", "HouseholderQR<", "PartialPivLU<",
      "FullPivLU<", "LDLT<", "LLT<", "CompleteOrthogonalDecomposition<", ".ldlt()", ".llt()", ".inverse()",
      ".partialPivLu()", ".fullPivLu()", ".jacobiSvd(", ".bdcSvd(", ".householderQr()", ".colPivHouseholderQr()",
      ".completeOrthogonalDecomposition()", ".determinant()"};
  const fs::path root(NUMATTN_SOURCE_DIR);
  for (const char* dir : {"src", "include", "tests", "tools", "bench", "fuzz"}) {
    if (!fs::exists(root / dir)) continue;
    for (const auto& e : fs::recursive_directory_iterator(root / dir)) {
      const std::string ext = e.path().extension().string();
      if (!e.is_regular_file() || (ext != ".cpp" && ext != ".h" && ext != ".cu")) continue;
      const std::string name = e.path().filename().string();
      if (name == "dense.h" || name == "dense.cpp" || name == "dense_test.cpp") continue;
      std::ifstream f(e.path());
      std::stringstream ss;
      ss << f.rdbuf();
      const std::string text = ss.str();
      for (const std::string& b : banned)
        EXPECT_EQ(text.find(b), std::string::npos)
            << e.path() << " uses " << b << ": call decomp/dense.h instead (docs/design.md)";
    }
  }
}

}  // namespace NUMATTN_UNITY_ID
}  // namespace
}  // namespace numattn::decomp::dense
