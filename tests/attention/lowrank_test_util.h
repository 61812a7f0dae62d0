// Helpers shared by the lowrank.* method tests: one head of a problem as float64 Eigen matrices,
// dense float64 transcriptions of the formulas, error measures.
#pragma once

#include <Eigen/Core>

#include <algorithm>
#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include "numattn/attention/random_problem.h"
#include "numattn/attention/registry.h"
#include "numattn/decomp/dense.h"
#include "support/method_problem.h"
#include "support/test_util.h"

namespace numattn::test {

using Mat = Eigen::Matrix<double, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;

/// Rows [0, n) of head (b, h) of a q/k/v/out view as a float64 matrix.
template <class T>
Mat head_matrix(const TensorView<T>& t, index_t b, index_t h) {
  Mat m(t.shape[2], t.shape[3]);
  for (index_t i = 0; i < t.shape[2]; ++i)
    for (index_t d = 0; d < t.shape[3]; ++d) m(i, d) = static_cast<double>(t.row(b, h, i)[d]);
  return m;
}

/// Row-wise softmax of s (max subtracted), in place.
inline Mat row_softmax(Mat s) {
  for (Eigen::Index i = 0; i < s.rows(); ++i) {
    s.row(i).array() = (s.row(i).array() - s.row(i).maxCoeff()).exp();
    s.row(i) /= s.row(i).sum();
  }
  return s;
}

/// ‖a − b‖_F / ‖b‖_F.
inline double rel_fro(const Mat& a, const Mat& b) { return (a - b).norm() / b.norm(); }

inline ProblemConfig small_config(index_t heads, index_t kv_heads, index_t n, index_t nk, index_t d,
                                  std::uint64_t seed, double logit_scale = 1.0, Dist dist = Dist::kGaussian) {
  ProblemConfig cfg;
  cfg.heads = heads;
  cfg.kv_heads = kv_heads;
  cfg.n = n;
  cfg.n_kv = nk;
  cfg.d = d;
  cfg.seed = seed;
  cfg.logit_scale = logit_scale;
  cfg.dist = dist;
  cfg.want_lse = false;
  return cfg;
}

}  // namespace numattn::test
