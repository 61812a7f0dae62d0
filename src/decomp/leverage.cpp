#include "numattn/decomp/leverage.h"

#include <Eigen/Core>

#include <algorithm>
#include <cmath>
#include <limits>

#include "numattn/core/error.h"
#include "numattn/decomp/dense.h"

namespace numattn::decomp {

namespace {

void check_input(const double* a, index_t n, index_t d, index_t lda, const char* what) {
  NUMATTN_CHECK(n >= 0 && d >= 0 && (n == 0 || lda >= d), "{}: bad shape n={} d={} lda={}", what, n, d, lda);
  for (index_t i = 0; i < n; ++i)
    for (index_t j = 0; j < d; ++j)
      NUMATTN_CHECK(std::isfinite(a[i * lda + j]), "{}: entry [{}, {}] is {}; leverage scores need finite rows",
                    what, i, j, a[i * lda + j]);
}

}  // namespace

LeverageScores leverage_scores(const double* a, index_t n, index_t d, index_t lda, double rank_tol) {
  check_input(a, n, d, lda, "leverage_scores");
  LeverageScores out;
  out.scores.assign(static_cast<std::size_t>(n), 0.0);
  if (n == 0 || d == 0) return out;
  // Fast path for well-conditioned A (the usual case for attention keys, n ≫ d): the Gram matrix
  // G = AᵀA = V·Λ·Vᵀ by one BLAS-3 product, and ℓⱼ = ‖aⱼ·V·Λ^{-1/2}‖². Forming G squares the
  // condition number, so it is used only when λ_min ≥ 1e-8·λ_max (κ(A) ≤ 1e4): the scores are
  // then accurate to about ε₆₄·κ² ≤ 1e-8 and every σ is far above the rank tolerance.
  const Eigen::Map<const Eigen::Matrix<double, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>, 0, Eigen::OuterStride<>>
      Am(a, n, d, Eigen::OuterStride<>(lda));
  if (n >= d) {
    const Eigen::MatrixXd G = Am.transpose() * Am;
    const dense::SymEig eig = dense::sym_eig(G);
    const Eigen::VectorXd& lam = eig.values;  // ascending
    if (eig.info == dense::Info::kSuccess && lam(d - 1) > 0 && lam(0) >= 1e-8 * lam(d - 1)) {
      out.rank = d;
      const Eigen::MatrixXd B = eig.vectors * lam.cwiseSqrt().cwiseInverse().asDiagonal();
      const Eigen::MatrixXd L = Am * B;
      for (index_t i = 0; i < n; ++i)
        out.scores[static_cast<std::size_t>(i)] = std::clamp(L.row(i).squaredNorm(), 0.0, 1.0);
      return out;
    }
  }
  const Eigen::MatrixXd A = Am;  // column-major: LAPACK's layout
  // A = Q·R, then R = U_R·Σ·Vᵀ: the left singular vectors of A are Q·U_R, and their rows'
  // norms are those of A·V·Σ⁻¹ — computed from A without forming Q or AᵀA.
  const Eigen::MatrixXd R = dense::qr(A, false).r;  // min(n, d) × d, upper trapezoidal
  const dense::Svd svd = dense::svd(R);
  NUMATTN_ASSERT(svd.info == dense::Info::kSuccess);  // finite input (checked above)
  const Eigen::VectorXd& sigma = svd.s;
  const double tol = (rank_tol < 0 ? static_cast<double>(std::max(n, d)) * std::numeric_limits<double>::epsilon()
                                   : rank_tol) * (sigma.size() ? sigma(0) : 0.0);
  index_t rho = 0;
  while (rho < sigma.size() && sigma(rho) > tol && sigma(rho) > 0) ++rho;
  out.rank = rho;
  if (rho == 0) return out;
  const Eigen::MatrixXd B = svd.vt.topRows(rho).transpose() * sigma.head(rho).cwiseInverse().asDiagonal();
  const Eigen::MatrixXd L = A * B;  // n × ρ: the rows of the truncated U
  for (index_t i = 0; i < n; ++i)
    out.scores[static_cast<std::size_t>(i)] = std::clamp(L.row(i).squaredNorm(), 0.0, 1.0);
  return out;
}

std::vector<double> online_leverage_scores(const double* a, index_t n, index_t d, index_t lda, double lambda) {
  check_input(a, n, d, lda, "online_leverage_scores");
  NUMATTN_CHECK(lambda > 0 && std::isfinite(lambda), "online_leverage_scores: lambda must be > 0 (got {})", lambda);
  const auto dd = static_cast<std::size_t>(d);
  // Lower Cholesky factor L of M = λI + Σ aᵀa, column-major: L[i + k·d] = L(i, k), i ≥ k.
  std::vector<double> L(dd * dd, 0.0), z(dd), x(dd);
  for (index_t k = 0; k < d; ++k) L[static_cast<std::size_t>(k * d + k)] = std::sqrt(lambda);
  std::vector<double> out(static_cast<std::size_t>(n));
  for (index_t row = 0; row < n; ++row) {
    const double* ar = a + row * lda;
    // u = a·M⁻¹·aᵀ = ‖L⁻¹aᵀ‖² (column-oriented forward solve); then ℓ = u / (1 + u), the score
    // against M + aᵀa by Sherman–Morrison.
    std::copy(ar, ar + d, z.begin());
    double u = 0;
    for (index_t k = 0; k < d; ++k) {
      const double* col = L.data() + k * d;
      const double zk = z[static_cast<std::size_t>(k)] / col[k];
      z[static_cast<std::size_t>(k)] = zk;
      u += zk * zk;
      for (index_t i = k + 1; i < d; ++i) z[static_cast<std::size_t>(i)] -= col[i] * zk;
    }
    out[static_cast<std::size_t>(row)] = u / (1 + u);
    // Rank-one update L·Lᵀ + aᵀa (Givens rotations, column by column).
    std::copy(ar, ar + d, x.begin());
    for (index_t k = 0; k < d; ++k) {
      double* col = L.data() + k * d;
      const double xk = x[static_cast<std::size_t>(k)];
      if (xk == 0) continue;
      const double lkk = col[k], r = std::hypot(lkk, xk), c = r / lkk, s = xk / lkk;
      col[k] = r;
      for (index_t i = k + 1; i < d; ++i) {
        col[i] = (col[i] + s * x[static_cast<std::size_t>(i)]) / c;
        x[static_cast<std::size_t>(i)] = c * x[static_cast<std::size_t>(i)] - s * col[i];
      }
    }
  }
  return out;
}

}  // namespace numattn::decomp
