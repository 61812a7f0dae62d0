#include "numattn/model/blocks/bdv_attention.h"

#include <algorithm>
#include <vector>

#include "model/blocks/linear.h"
#include "numattn/model/llama.h"

namespace numattn {

BdvAttention::BdvAttention(const LlamaLayer& layer, const ModelHParams& hp, std::int64_t index) : GqaAttention(layer, hp, index) {}

std::int64_t BdvAttention::extra_weights() const { return L_->v_bd->weight_params(); }

std::uint64_t BdvAttention::extra_weight_bytes() const {
  const transform::BdProjection& p = *L_->v_bd;
  if (L_->v_bd_q.empty()) return 4 * static_cast<std::uint64_t>(p.weight_params());
  // Quantized coefficients, plus the dense heads' float32 basis blocks.
  return L_->v_bd_q.bytes() + 4 * static_cast<std::uint64_t>(p.weight_params() - (p.d_in() - p.rank()) * p.out_dim());
}

void BdvAttention::project_rows(const ForwardStep& st, const float* xn, std::int64_t t0, std::int64_t t1, float* rows,
                                std::int64_t ld) const {
  const transform::BdProjection& p = *L_->v_bd;
  const std::int64_t n = t1 - t0, qk = (Hq_ + Hkv_) * D_;
  float* v = rows + qk;  // the value slots of the Q|K rows
  const blocks::Weight wqk{&L_->wqkv, &L_->wqkv_q, qk, E_};
  if (L_->v_bd_q.empty()) {
    // Float32 coefficients: the stacked Q|K product, then the fused BD projection.
    blocks::linear(st.rows_ctx, st.act, xn + t0 * E_, n, wqk, rows, false, ld);
    p.project(xn + t0 * E_, n, E_, v, ld, transform::InputOrder::kOriginal, ExecContext{1});
    return;
  }
  // Quantized coefficients: gather xn into its basis channels S and the rest S^c (permutation()
  // order) and fill V' with the basis part; then xn[S^c]·C_stack accumulates onto it.
  const std::int64_t r = p.rank(), c = p.d_in() - r, out = p.out_dim();
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
  const blocks::Weight wc{nullptr, &L_->v_bd_q, out, c};
  const int nt = st.rows_ctx.num_threads();
  if (n > kQuantGemvMaxBatch || st.act != Activations::kF32 || nt <= 1 || L_->wqkv_q.empty()) {
    blocks::linear(st.rows_ctx, st.act, xn + t0 * E_, n, wqk, rows, false, ld);
    blocks::linear(st.rows_ctx, st.act, xr.data(), n, wc, v, true, ld);
    return;
  }
  // A decode step: both products in one fork, thread i taking the i-th share of each matrix's
  // rows (in whole 16-row slices), so the threads read about equal bytes.
  const CpuPath path = default_cpu_path();
  const float* xrow = xr.data();  // this thread's buffer (thread_local: the workers have their own)
  const std::int64_t s1 = (qk + 15) / 16, s2 = (out + 15) / 16;
  parallel_for(st.rows_ctx, nt, [&](std::int64_t i) {
    const std::int64_t a0 = std::min(qk, s1 * i / nt * 16), a1 = std::min(qk, s1 * (i + 1) / nt * 16);
    const std::int64_t b0 = std::min(out, s2 * i / nt * 16), b1 = std::min(out, s2 * (i + 1) / nt * 16);
    if (a1 > a0) quant_gemv(L_->wqkv_q, a0, a1, xn + t0 * E_, n, E_, rows, ld, false, path);
    if (b1 > b0) quant_gemv(L_->v_bd_q, b0, b1, xrow, n, c, v, ld, true, path);
  });
}

}  // namespace numattn
