// Helpers of the clustering-method tests (sparse_routing_test, sparse_clustered_test,
// sparse_multipole_test): problems, float64 errors, per-row top-k recall.
#pragma once

#include <algorithm>
#include <cmath>
#include <functional>
#include <numeric>
#include <string>
#include <vector>

#include "numattn/attention/registry.h"
#include "support/method_problem.h"
#include "support/test_util.h"

namespace numattn::cluster_test {

inline ProblemConfig config(index_t h, index_t hk, index_t n, index_t nk, index_t d, std::uint64_t seed,
                            Dist dist = Dist::kGaussian) {
  return test::method_problem(h, hk, n, nk, d, d + 1, Causal::kNone, seed, dist);
}

/// s·q_i·k_j in float64.
inline double logit(const AttentionProblem& p, index_t b, index_t h, index_t i, index_t j) {
  double s = 0;
  for (index_t c = 0; c < p.d_qk(); ++c) s += static_cast<double>(p.q(b, h, i, c)) * p.k(b, h / p.group(), j, c);
  return p.effective_scale() * s;
}

/// ‖out − ref‖_F / ‖ref‖_F over all rows (ref laid out [b][h][i][dv]).
inline double rel_error(const AttentionProblem& p, const std::vector<double>& ref) {
  double num = 0, den = 0;
  std::size_t t = 0;
  for (index_t b = 0; b < p.batch(); ++b)
    for (index_t h = 0; h < p.heads(); ++h)
      for (index_t i = 0; i < p.n_q(); ++i)
        for (index_t c = 0; c < p.d_v(); ++c, ++t) {
          const double e = p.out(b, h, i, c) - ref[t];
          num += e * e;
          den += ref[t] * ref[t];
        }
  return std::sqrt(num / std::max(den, 1e-300));
}

/// rel_fro_error of `spec` on `prob` against the float64 reference.
inline double error_of(const std::string& spec, RandomProblem& prob, int threads = 2) {
  return test::run_error(spec, prob, nullptr, threads);
}

using test::median;

/// Mean over rows (b, h, i) of the fraction of the row's true top-`k` keys (by exact logit) for
/// which `attends(b, h, i, j)` holds: the keys the method attends to exactly.
inline double topk_recall(const AttentionProblem& p, index_t k,
                          const std::function<bool(index_t, index_t, index_t, index_t)>& attends) {
  double sum = 0;
  index_t rows = 0;
  std::vector<index_t> idx(static_cast<std::size_t>(p.n_kv()));
  std::vector<double> l(static_cast<std::size_t>(p.n_kv()));
  k = std::min(k, p.n_kv());
  for (index_t b = 0; b < p.batch(); ++b)
    for (index_t h = 0; h < p.heads(); ++h)
      for (index_t i = 0; i < p.n_q(); ++i) {
        for (index_t j = 0; j < p.n_kv(); ++j) l[static_cast<std::size_t>(j)] = logit(p, b, h, i, j);
        std::iota(idx.begin(), idx.end(), 0);
        std::partial_sort(idx.begin(), idx.begin() + k, idx.end(),
                          [&](index_t a, index_t c) { return l[static_cast<std::size_t>(a)] > l[static_cast<std::size_t>(c)]; });
        index_t hit = 0;
        for (index_t u = 0; u < k; ++u) hit += attends(b, h, i, idx[static_cast<std::size_t>(u)]) ? 1 : 0;
        sum += static_cast<double>(hit) / static_cast<double>(k);
        ++rows;
      }
  return sum / static_cast<double>(std::max<index_t>(rows, 1));
}

}  // namespace numattn::cluster_test
