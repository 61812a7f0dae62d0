#include "numattn/model/blocks/bdv_attention.h"

#include <vector>

#include "model/blocks/linear.h"
#include "numattn/model/llama.h"

namespace numattn {

BdvAttention::BdvAttention(const LlamaLayer& layer, const ModelHParams& hp) : GqaAttention(layer, hp) {}

std::int64_t BdvAttention::extra_weights() const { return L_->v_bd->weight_params(); }

std::uint64_t BdvAttention::extra_weight_bytes() const {
  const transform::BdProjection& p = *L_->v_bd;
  if (L_->v_bd_q.empty()) return 4 * static_cast<std::uint64_t>(p.weight_params());
  // Quantized coefficients, plus the dense heads' float32 basis blocks.
  return L_->v_bd_q.bytes() + 4 * static_cast<std::uint64_t>(p.weight_params() - (p.d_in() - p.rank()) * p.out_dim());
}

void BdvAttention::project_values(const ForwardStep& st, const float* xn, std::int64_t t0, std::int64_t t1,
                                  float* rows, std::int64_t ld) const {
  const transform::BdProjection& p = *L_->v_bd;
  float* v = rows + (Hq_ + Hkv_) * D_;  // the value slots of the Q|K rows
  if (L_->v_bd_q.empty()) {
    // Float32 coefficients: the fused BD projection.
    p.project(xn + t0 * E_, t1 - t0, E_, v, ld, transform::InputOrder::kOriginal, ExecContext{1});
    return;
  }
  // Quantized coefficients: gather xn into its basis channels S and the rest S^c (permutation()
  // order), fill V' with the basis part, then accumulate xn[S^c]·C_stack with quant_linear, as
  // every other product with weights held in place (split over the team in a decode step).
  const std::int64_t n = t1 - t0, r = p.rank(), c = p.d_in() - r;
  thread_local std::vector<float> xs, xr;
  xs.resize(static_cast<std::size_t>(n * r));
  xr.resize(static_cast<std::size_t>(n * c));
  const std::vector<index_t>& perm = p.permutation();
  for (std::int64_t t = 0; t < n; ++t) {
    const float* x = xn + (t0 + t) * E_;
    for (std::int64_t k = 0; k < r; ++k) xs[static_cast<std::size_t>(t * r + k)] = x[perm[static_cast<std::size_t>(k)]];
    for (std::int64_t k = 0; k < c; ++k)
      xr[static_cast<std::size_t>(t * c + k)] = x[perm[static_cast<std::size_t>(r + k)]];
  }
  p.fill_basis(xs.data(), n, r, v, ld);
  blocks::linear(st.rows_ctx, st.act, xr.data(), n, blocks::Weight{nullptr, &L_->v_bd_q, p.out_dim(), c}, v, true, ld);
}

}  // namespace numattn
