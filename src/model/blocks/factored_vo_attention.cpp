#include "numattn/model/blocks/factored_vo_attention.h"

#include <algorithm>

#include "model/blocks/linear.h"
#include "numattn/model/llama.h"

namespace numattn {

FactoredVoAttention::FactoredVoAttention(const LlamaLayer& layer, const ModelHParams& hp, std::int64_t index)
    : GqaAttention(layer, hp, index), rank_(layer.vo_rank) {}

void FactoredVoAttention::output_rows(const ForwardStep& st, const float* att, std::int64_t t0, std::int64_t t1,
                                      float* x, float* scratch) const {
  // z = Σ_h μ_h ⊙ o_h (Hq·R per token), then O'·z (E·R) instead of W_o.
  const std::int64_t vr = rank_, aw = Hq_ * vr;
  float* vz = scratch + extra_offset(st);
  for (std::int64_t t = t0; t < t1; ++t) {
    float* z = vz + t * vr;
    std::fill_n(z, vr, 0.f);
    for (std::int64_t hh = 0; hh < Hq_; ++hh) {
      const float* o = att + t * aw + hh * vr;
      const float* mu = L_->vo_mix.data() + hh * vr;
      for (std::int64_t i = 0; i < vr; ++i) z[i] += mu[i] * o[i];
    }
  }
  blocks::linear(st.rows_ctx, st.act, vz + t0 * vr, t1 - t0, blocks::Weight{&L_->wo, &L_->wo_q, E_, vr}, x + t0 * E_,
                 true);
}

void FactoredVoAttention::capture(const ForwardStep& st, int layer, const float* xn, const float* scratch,
                                  const CaptureFn& fn) const {
  // No per-head values of width D: the capture carries xn only.
  AttentionBlock::capture(st, layer, xn, scratch, fn);
}

}  // namespace numattn
