#include "numattn/model/blocks/gated_ffn.h"

#include "model/blocks/linear.h"
#include "numattn/core/simd.h"
#include "numattn/model/llama.h"

namespace numattn {

std::uint64_t GatedFfn::weight_bytes() const {
  return blocks::Weight{&L_->w_gate_up, &L_->w_gate_up_q, 2 * F_, E_}.bytes() +
         blocks::Weight{&L_->w_down, &L_->w_down_q, E_, F_}.bytes();
}

void GatedFfn::forward(const ForwardStep& st, const float* xn, std::int64_t t0, std::int64_t t1, float* scratch,
                        float* x, bool main) const {
  const std::int64_t n = t1 - t0, E = E_, F = F_;
  float* gu = scratch + t0 * 2 * F;                      // [N, 2F]: gate | up
  float* act = scratch + st.n_tokens * 2 * F + t0 * F;   // [N, F]
  blocks::linear(st.rows_ctx, st.act, xn + t0 * E, n, blocks::Weight{&L_->w_gate_up, &L_->w_gate_up_q, 2 * F, E},
                 gu, false);
  st.lap(main, &ForwardProfile::ffn_gemm);
  const auto gate = gate_ == FfnGate::kSilu ? &simd::silu_mul : &simd::gelu_tanh_mul;
  for (std::int64_t t = 0; t < n; ++t) gate(gu + t * 2 * F, gu + t * 2 * F + F, act + t * F, F);
  st.lap(main, &ForwardProfile::ffn_act);
  blocks::linear(st.rows_ctx, st.act, act, n, blocks::Weight{&L_->w_down, &L_->w_down_q, E, F}, x + t0 * E, true);
  st.lap(main, &ForwardProfile::ffn_gemm);
}

}  // namespace numattn
