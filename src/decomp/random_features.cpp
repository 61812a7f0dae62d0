#include "numattn/decomp/random_features.h"

#include <cmath>

#include "numattn/core/error.h"
#include "numattn/core/rng.h"
#include "numattn/decomp/dense.h"

namespace numattn::decomp {

std::vector<double> gaussian_features(index_t m, index_t d, std::uint64_t seed, std::uint64_t stream) {
  NUMATTN_CHECK(m >= 0 && d >= 0, "random features: M and d must be non-negative, got {} and {}", m, d);
  std::vector<double> w(static_cast<std::size_t>(m * d));
  const CounterRng rng(seed, stream);
  for (std::size_t i = 0; i < w.size(); ++i) w[i] = rng.normal(i);
  return w;
}

std::vector<double> orthogonal_features(index_t m, index_t d, std::uint64_t seed, std::uint64_t stream,
                                        FeatureNorm norm) {
  NUMATTN_CHECK(m >= 0 && d >= 0, "random features: M and d must be non-negative, got {} and {}", m, d);
  std::vector<double> w(static_cast<std::size_t>(m * d));
  if (m == 0 || d == 0) return w;
  const CounterRng rng(seed, stream);
  // Counter layout: block b uses [b·2d², b·2d² + d²) for its Gaussian matrix and the next d² for
  // the d fresh vectors whose norms rescale its rows, so every draw has a fixed index.
  const std::uint64_t dd = static_cast<std::uint64_t>(d) * static_cast<std::uint64_t>(d);
  const index_t blocks = (m + d - 1) / d;
  for (index_t b = 0; b < blocks; ++b) {
    const std::uint64_t base = static_cast<std::uint64_t>(b) * 2 * dd;
    // G row-major: draw i is G(i / d, i % d).
    Eigen::MatrixXd g(d, d);
    for (index_t i = 0; i < d * d; ++i) g(i / d, i % d) = rng.normal(base + static_cast<std::uint64_t>(i));
    dense::Qr qr = dense::qr(g);
    Eigen::MatrixXd& q = qr.q;
    // Q·diag(sign(R_ii)) makes the factorisation unique, and Q Haar distributed.
    for (index_t j = 0; j < d; ++j)
      if (qr.r(j, j) < 0) q.col(j) *= -1.0;
    // Rows of Qᵀ (columns of Q) are the orthonormal directions.
    const index_t rows = std::min(d, m - b * d);
    for (index_t i = 0; i < rows; ++i) {
      double scale = std::sqrt(static_cast<double>(d));
      if (norm == FeatureNorm::kChi) {
        double s2 = 0;
        for (index_t k = 0; k < d; ++k) {
          const double z = rng.normal(base + dd + static_cast<std::uint64_t>(i * d + k));
          s2 += z * z;
        }
        scale = std::sqrt(s2);
      }
      double* out = w.data() + (b * d + i) * d;
      for (index_t k = 0; k < d; ++k) out[k] = scale * q(k, i);
    }
  }
  return w;
}

}  // namespace numattn::decomp
