#include "numattn/model/blocks/gqa_attention.h"

#include <algorithm>

#include "model/blocks/linear.h"
#include "numattn/model/llama.h"
#include "numattn/quant/quant.h"

namespace numattn {

GqaAttention::GqaAttention(const LlamaLayer& layer, const ModelHParams& hp, std::int64_t index)
    : L_(&layer),
      E_(hp.n_embd),
      Hq_(hp.n_head),
      Hkv_(hp.n_head_kv),
      D_(hp.head_dim),
      n_rot_(hp.n_rot),
      window_(hp.is_local(index) ? hp.sliding_window : 0),
      rope_layout_(hp.rope_layout),
      attn_scale_(hp.attn_scale),
      rms_eps_(hp.rms_eps) {}

std::int64_t GqaAttention::weights() const { return in_rows() * E_ + E_ * wo_cols() + extra_weights(); }

std::uint64_t GqaAttention::weight_bytes() const {
  return blocks::Weight{&L_->wqkv, &L_->wqkv_q, in_rows(), E_}.bytes() +
         blocks::Weight{&L_->wo, &L_->wo_q, E_, wo_cols()}.bytes() + extra_weight_bytes();
}

double GqaAttention::flops_per_token(std::int64_t n_ctx) const {
  const std::int64_t keys = window_ > 0 ? std::min(n_ctx, window_) : n_ctx;
  return 2.0 * static_cast<double>(weights()) +
         2.0 * static_cast<double>(Hq_ * keys * (D_ + head_value_width()));
}

std::int64_t GqaAttention::scratch_per_token(const ForwardStep& st) const {
  return R() + Hq_ * head_value_width() + (st.capture ? (Hq_ + Hkv_) * D_ : 0) + extra_scratch();
}

void GqaAttention::project_rows(const ForwardStep& st, const float* xn, std::int64_t t0, std::int64_t t1,
                                float* rows, std::int64_t ld) const {
  blocks::linear(st.rows_ctx, st.act, xn + t0 * E_, t1 - t0, blocks::Weight{&L_->wqkv, &L_->wqkv_q, in_rows(), E_},
                 rows, false, ld);
}

void GqaAttention::project(const ForwardStep& st, const float* xn, std::int64_t t0, std::int64_t t1,
                           const LayerCache& cache, float* scratch, bool main) const {
  const std::int64_t R = this->R(), Hq = Hq_, Hkv = Hkv_, D = D_, half = st.rope_half;
  project_rows(st, xn, t0, t1, scratch + t0 * R, R);
  st.lap(main, &ForwardProfile::qkv_gemm);
  float* pre = scratch + pre_offset(st);
  const std::int64_t vw = value_cache_width();
  const bool qk_norm = !L_->attn_q_norm.empty();
  const float* cs = window_ > 0 ? st.rope_cos_local : st.rope_cos;
  const float* sn = window_ > 0 ? st.rope_sin_local : st.rope_sin;
  for (std::int64_t t = t0; t < t1; ++t) {
    float* row = scratch + t * R;
    if (qk_norm) {
      blocks::rms_norm_rows(row, L_->attn_q_norm.data(), row, Hq, D, rms_eps_);
      blocks::rms_norm_rows(row + Hq * D, L_->attn_k_norm.data(), row + Hq * D, Hkv, D, rms_eps_);
    }
    if (st.capture) std::copy_n(row, (Hq + Hkv) * D, pre + t * (Hq + Hkv) * D);
    // RoPE on the Q and K heads of the token, in place.
    const float* c = cs + t * half;
    const float* s = sn + t * half;
    for (std::int64_t hh = 0; hh < Hq + Hkv; ++hh) {
      float* v = row + hh * D;
      if (rope_layout_ == RopeLayout::kAdjacent) {
        for (std::int64_t i = 0; i < half; ++i) {
          const float a = v[2 * i], b = v[2 * i + 1];
          v[2 * i] = a * c[i] - b * s[i];
          v[2 * i + 1] = a * s[i] + b * c[i];
        }
      } else {
        for (std::int64_t i = 0; i < half; ++i) {
          const float a = v[i], b = v[i + half];
          v[i] = a * c[i] - b * s[i];
          v[i + half] = a * s[i] + b * c[i];
        }
      }
    }
    // Append the token's key and value rows to the cache (rounded once to its element type).
    if (cache.type == KvType::kF32) {
      std::copy_n(row + Hq * D, Hkv * D, cache.k + (st.pos0 + t) * Hkv * D);
      std::copy_n(row + (Hq + Hkv) * D, vw, cache.v + (st.pos0 + t) * vw);
    } else {
      std::uint16_t (*round)(float) = cache.type == KvType::kF16 ? fp32_to_fp16 : fp32_to_bf16;
      std::transform(row + Hq * D, row + (Hq + Hkv) * D, cache.k16 + (st.pos0 + t) * Hkv * D, round);
      std::transform(row + (Hq + Hkv) * D, row + (Hq + Hkv) * D + vw, cache.v16 + (st.pos0 + t) * vw, round);
    }
  }
  st.lap(main, &ForwardProfile::rope);
}

void GqaAttention::attend(const ForwardStep& st, const AttentionMethod& method, const LayerCache& cache,
                          float* scratch) const {
  const std::int64_t N = st.n_tokens, nk = st.pos0 + N, R = this->R(), Hq = Hq_, Hkv = Hkv_, D = D_;
  const std::int64_t vw = head_value_width();
  AttentionProblem p;
  p.q = TensorView<const float>(scratch, {1, Hq, N, D}, {N * R, D, R, 1});
  p.k = TensorView<const float>(cache.k, {1, Hkv, nk, D}, {nk * Hkv * D, D, Hkv * D, 1});
  // Shared values: every KV head reads the one value row (head stride 0).
  p.v = shared_values() ? TensorView<const float>(cache.v, {1, Hkv, nk, vw}, {nk * vw, 0, vw, 1})
                        : TensorView<const float>(cache.v, {1, Hkv, nk, D}, {nk * Hkv * D, D, Hkv * D, 1});
  p.out = TensorView<float>(scratch + att_offset(st), {1, Hq, N, vw}, {N * Hq * vw, vw, Hq * vw, 1});
  if (cache.type != KvType::kF32) {  // the views give shapes and strides; the halves the data
    p.k.data = nullptr;
    p.v.data = nullptr;
    p.half = HalfKv{cache.type, cache.k16, cache.v16};
  }
  p.causal = Causal::kBottomRight;
  if (window_ > 0) p.window_left = window_ - 1;
  if (attn_scale_ > 0) p.scale = attn_scale_;
  // A decode step's attention gets the team only from ~1 MFLOP of exact attention on (Nk ≈
  // 430 for SmolLM2), where reading the KV cache with every core pays for waking them; below,
  // a method that forks per head would spend more on the fork than on the work. exact.flash
  // applies the same bound itself.
  const double att_flops = 2.0 * static_cast<double>(Hq * N * (window_ > 0 ? std::min(nk, window_) : nk) * (D + vw));
  const ExecContext ctx = st.by_tokens || att_flops >= 1e6 ? st.team : ExecContext{1};
  if (p.half_kv() && !method.info().caps.half_kv) {
    // A method that reads float32 only: a float32 copy of the rows the queries see.
    const WidenedKv w = widen_kv(p);
    return method.run(w.problem, ctx);
  }
  method.run(p, ctx);
}

void GqaAttention::output_rows(const ForwardStep& st, const float* att, std::int64_t t0, std::int64_t t1, float* x,
                               float*) const {
  blocks::linear(st.rows_ctx, st.act, att + t0 * wo_cols(), t1 - t0, blocks::Weight{&L_->wo, &L_->wo_q, E_, wo_cols()},
                 x + t0 * E_, true);
}

void GqaAttention::output(const ForwardStep& st, std::int64_t t0, std::int64_t t1, float* scratch, float* x,
                          bool main) const {
  output_rows(st, scratch + att_offset(st), t0, t1, x, scratch);
  st.lap(main, &ForwardProfile::o_gemm);
}

void GqaAttention::capture(const ForwardStep& st, int layer, const float* xn, const float* scratch,
                           const CaptureFn& fn) const {
  const std::int64_t N = st.n_tokens, R = this->R(), Hq = Hq_, Hkv = Hkv_, D = D_, W = (Hq + Hkv) * D;
  const float* pre = scratch + pre_offset(st);
  QkvCapture c;
  c.layer = layer;
  c.pos0 = st.pos0;
  c.xn = xn;
  c.q_pre = TensorView<const float>(pre, {1, Hq, N, D}, {N * W, D, W, 1});
  c.k_pre = TensorView<const float>(pre + Hq * D, {1, Hkv, N, D}, {N * W, D, W, 1});
  c.q_post = TensorView<const float>(scratch, {1, Hq, N, D}, {N * R, D, R, 1});
  c.k_post = TensorView<const float>(scratch + Hq * D, {1, Hkv, N, D}, {N * R, D, R, 1});
  c.v = TensorView<const float>(scratch + (Hq + Hkv) * D, {1, Hkv, N, D}, {N * R, D, R, 1});
  fn(c);
}

void AttentionBlock::capture(const ForwardStep& st, int layer, const float* xn, const float*,
                             const CaptureFn& fn) const {
  QkvCapture c;
  c.layer = layer;
  c.pos0 = st.pos0;
  c.xn = xn;
  fn(c);
}

}  // namespace numattn
