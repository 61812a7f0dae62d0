// Uses numattn through its installed headers and library: the registry, one exact method
// against the float64 reference, and a Basis Decomposition (Eigen + LAPACK), so that every
// dependency the package config promises is needed at link time. Exits non-zero on failure.
#include <cstdio>
#include <vector>

#include "numattn/analysis/metrics.h"
#include "numattn/attention/accuracy.h"
#include "numattn/attention/reference.h"
#include "numattn/attention/registry.h"
#include "numattn/core/rng.h"
#include "numattn/decomp/basis_decomposition.h"

int main() {
  using namespace numattn;
  const auto methods = list_methods();
  if (methods.size() < 2) {
    std::fprintf(stderr, "only %zu methods registered\n", methods.size());
    return 1;
  }
  const index_t B = 1, H = 2, N = 33, D = 16;
  std::vector<float> q(B * H * N * D), k(q.size()), v(q.size()), out(q.size());
  CounterRng rng(7, 0);
  for (std::size_t i = 0; i < q.size(); ++i) {
    q[i] = static_cast<float>(rng.normal(3 * i));
    k[i] = static_cast<float>(rng.normal(3 * i + 1));
    v[i] = static_cast<float>(rng.normal(3 * i + 2));
  }
  AttentionProblem p;
  p.q = TensorView<const float>::contiguous(q.data(), {B, H, N, D});
  p.k = TensorView<const float>::contiguous(k.data(), {B, H, N, D});
  p.v = TensorView<const float>::contiguous(v.data(), {B, H, N, D});
  p.out = TensorView<float>::contiguous(out.data(), {B, H, N, D});
  p.causal = Causal::kTopLeft;
  const ExecContext ctx{2};
  create_method("exact.flash")->run(p, ctx);
  const ErrorMetrics m = compare_with_reference(p, reference_all(p, ctx));
  const double tol = exact_f32_tolerance(m.logit_magnitude).rel_fro_error;

  decomp::MatrixXd w(6, 4);
  for (int i = 0; i < 6; ++i)
    for (int j = 0; j < 4; ++j) w(i, j) = (i + 1) * (j + 2) + (i == j ? 1.0 : 0.0);  // rank 4
  decomp::BasisDecomposition bd;
  bd.set_rank(4).compute(w);
  const bool bd_ok = bd.info() == decomp::ComputationInfo::kSuccess && bd.residual_rel() < 1e-10;

  std::printf("numattn_consumer: %zu methods; exact.flash rel_fro_error %.3g (tolerance %.3g); "
              "BD rank 4 residual %.3g\n",
              methods.size(), m.rel_fro_error, tol, bd_ok ? bd.residual_rel() : -1.0);
  return (m.rel_fro_error <= tol && bd_ok) ? 0 : 1;
}
