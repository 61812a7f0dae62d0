// Shared test support: the problem shapes of the method tests.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "numattn/analysis/metrics.h"
#include "numattn/attention/random_problem.h"
#include "numattn/attention/reference.h"
#include "numattn/attention/registry.h"

namespace numattn::test {

/// The problem shape of a method test: `hq` query heads on `hk` KV heads, Nq = `n`, Nk = `nk`,
/// Dk = `d`, Dv = `dv`, an LSE output only when asked (most approximate methods give none).
inline ProblemConfig method_problem(index_t hq, index_t hk, index_t n, index_t nk, index_t d, index_t dv, Causal c,
                                    std::uint64_t seed, Dist dist = Dist::kGaussian, bool want_lse = false) {
  ProblemConfig cfg;
  cfg.heads = hq;
  cfg.kv_heads = hk;
  cfg.n = n;
  cfg.n_kv = nk;
  cfg.d = d;
  cfg.dv = dv;
  cfg.causal = c;
  cfg.seed = seed;
  cfg.want_lse = want_lse;
  cfg.dist = dist;
  return cfg;
}

/// Runs `spec` on `prob` and returns its rel_fro_error against the float64 result of the method's
/// own target over all rows (`lse_err`: receives lse_max_abs_error).
inline double run_error(const std::string& spec, RandomProblem& prob, double* lse_err = nullptr, int threads = 2) {
  const auto m = create_method(spec);
  m->run(prob.problem(), ExecContext{threads});
  const ErrorMetrics e =
      compare_with_reference(prob.problem(), reference_all(prob.problem(), ExecContext{threads}, m->target()));
  if (lse_err) *lse_err = e.lse_max_abs_error;
  return e.rel_fro_error;
}

/// The same against reference rows computed once (seed sweeps on one problem).
inline double run_error(const std::string& spec, RandomProblem& prob, const ReferenceRows& ref, int threads = 2) {
  create_method(spec)->run(prob.problem(), ExecContext{threads});
  return compare_with_reference(prob.problem(), ref).rel_fro_error;
}

/// The median (mean of the two middle values for an even count).
inline double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const std::size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

/// How `expect_rows_ignore_future_keys` poisons a key row: scaled by 1e3 (keeps angular and
/// SimHash codes, so hashing methods form the same buckets) or set to 1e30 (huge but finite).
enum class KeyPoison { kScaleBy1e3, kSetTo1e30 };

/// Causal rows never read future keys: runs `spec` on `prob`, then poisons every key after row
/// t's diagonal in every batch entry and KV head (k as `kp` says, v = 1e30), runs again and asserts
/// that rows 0..t of every query head come out bitwise unchanged, LSE included when requested.
inline void expect_rows_ignore_future_keys(const std::string& spec, RandomProblem& prob, index_t t,
                                           KeyPoison kp = KeyPoison::kScaleBy1e3) {
  const AttentionProblem& p = prob.problem();
  const auto m = create_method(spec);
  m->run(p, ExecContext{2});
  const std::vector<float> before = prob.out_data();
  std::vector<float> lse_before;
  if (!p.lse.empty())
    for (index_t b = 0; b < p.batch(); ++b)
      for (index_t h = 0; h < p.heads(); ++h)
        for (index_t i = 0; i < p.n_q(); ++i) lse_before.push_back(p.lse(b, h, i, 0));
  const index_t off = p.diag_offset();
  for (index_t b = 0; b < p.batch(); ++b)
    for (index_t h = 0; h < p.kv_heads(); ++h)
      for (index_t j = std::max<index_t>(t + off + 1, 0); j < p.n_kv(); ++j) {
        float* k = prob.k_data().data() + (p.k.row(b, h, j) - p.k.data);
        float* v = prob.v_data().data() + (p.v.row(b, h, j) - p.v.data);
        for (index_t d = 0; d < p.d_qk(); ++d) k[d] = kp == KeyPoison::kScaleBy1e3 ? k[d] * 1e3f : 1e30f;
        for (index_t d = 0; d < p.d_v(); ++d) v[d] = 1e30f;
      }
  m->run(p, ExecContext{2});
  std::size_t row = 0;
  for (index_t b = 0; b < p.batch(); ++b)
    for (index_t h = 0; h < p.heads(); ++h)
      for (index_t i = 0; i < p.n_q(); ++i, ++row) {
        if (i > t) continue;
        for (index_t d = 0; d < p.d_v(); ++d)
          ASSERT_EQ(p.out(b, h, i, d), before[static_cast<std::size_t>(p.out.row(b, h, i) + d - p.out.data)])
              << spec << " " << to_string(p.causal) << " head " << h << " row " << i;
        if (!lse_before.empty()) ASSERT_EQ(p.lse(b, h, i, 0), lse_before[row]) << spec << " row " << i;
      }
}

}  // namespace numattn::test
