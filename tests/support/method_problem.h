// Shared test support: the problem shapes of the method tests.
#pragma once

#include <cstdint>

#include "numattn/attention/random_problem.h"

namespace numattn::test {

/// The problem shape of a method test: `hq` query heads on `hk` KV heads, Nq = `n`, Nk = `nk`,
/// Dk = `d`, Dv = `dv`, no LSE output (the approximate methods do not produce one).
inline ProblemConfig method_problem(index_t hq, index_t hk, index_t n, index_t nk, index_t d, index_t dv, Causal c,
                                    std::uint64_t seed, Dist dist = Dist::kGaussian) {
  ProblemConfig cfg;
  cfg.heads = hq;
  cfg.kv_heads = hk;
  cfg.n = n;
  cfg.n_kv = nk;
  cfg.d = d;
  cfg.dv = dv;
  cfg.causal = c;
  cfg.seed = seed;
  cfg.want_lse = false;
  cfg.dist = dist;
  return cfg;
}

}  // namespace numattn::test
