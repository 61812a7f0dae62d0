#include "numattn/model/blocks/mla_attention.h"

#include <algorithm>

#include "model/blocks/linear.h"
#include "numattn/model/llama.h"
#include "numattn/model/mla_model.h"
#include "numattn/quant/quant.h"

namespace numattn {

MlaAttention::MlaAttention(const LlamaLayer& layer, const ModelHParams& hp)
    : L_(&layer), E_(hp.n_embd), Hq_(hp.n_head) {}

std::int64_t MlaAttention::weights() const { return L_->mla->weights(E_) + E_ * Hq_ * L_->mla->d_v; }

std::uint64_t MlaAttention::weight_bytes() const {
  const MlaLayer& M = *L_->mla;
  const std::uint64_t own = M.quantized() ? M.q_proj.bytes() + M.q_up.bytes() + M.q_uv.bytes()
                                          : 4 * static_cast<std::uint64_t>(M.weights(E_));
  return own +
         blocks::Weight{&L_->wo, &L_->wo_q, E_, Hq_ * L_->mla->d_v}.bytes();
}

double MlaAttention::flops_per_token(std::int64_t n_ctx) const {
  const MlaLayer& M = *L_->mla;
  return 2.0 * static_cast<double>(weights()) +
         2.0 * static_cast<double>(Hq_ * n_ctx * (2 * M.rank + M.d_rope));
}

CacheShape MlaAttention::cache_shape() const { return {L_->mla->cache_width(), 0}; }

MlaAttention::Layout MlaAttention::layout(const ForwardStep& st) const {
  const MlaLayer& M = *L_->mla;
  const std::int64_t N = st.n_tokens;
  Layout l{};
  l.qw = mla_query_width(M, st.mla_exec);
  l.ow = mla_out_width(M, st.mla_exec);
  const std::int64_t pw = mla_proj_width(M, st.mla_exec);
  l.proj = 0;
  l.q = N * pw;
  l.lat = l.q + N * l.qw;
  l.att = l.lat + N * l.ow;
  l.rows = l.att + N * Hq_ * M.d_v;
  l.total = pw + l.qw + l.ow + Hq_ * M.d_v + M.cache_width();
  return l;
}

std::int64_t MlaAttention::scratch_per_token(const ForwardStep& st) const { return layout(st).total; }

void MlaAttention::project(const ForwardStep& st, const float* xn, std::int64_t t0, std::int64_t t1,
                           const LayerCache& cache, float* scratch, bool main) const {
  const MlaLayer& M = *L_->mla;
  const Layout l = layout(st);
  const std::int64_t W = M.cache_width(), n = t1 - t0;
  // A half cache gets the rows through scratch, rounded once to its element type.
  const bool half = cache.type != KvType::kF32;
  float* rows = half ? scratch + l.rows + t0 * W : cache.k + (st.pos0 + t0) * W;
  mla_project(M, st.mla_exec, xn + t0 * E_, n, E_, st.pos0 + t0, rows, scratch + l.q + t0 * l.qw,
              scratch + l.proj + t0 * mla_proj_width(M, st.mla_exec), st.rows_ctx, st.act);
  if (half)
    std::transform(rows, rows + n * W, cache.k16 + (st.pos0 + t0) * W,
                   cache.type == KvType::kF16 ? fp32_to_fp16 : fp32_to_bf16);
  st.lap(main, &ForwardProfile::qkv_gemm);
}

void MlaAttention::attend(const ForwardStep& st, const AttentionMethod& method, const LayerCache& cache,
                          float* scratch) const {
  const MlaLayer& M = *L_->mla;
  const Layout l = layout(st);
  const bool absorbed = st.mla_exec == MlaExec::kAbsorbed;
  const std::int64_t nk = st.pos0 + st.n_tokens;
  // Naive execution rebuilds keys and values of all cached tokens: worth the team even in decode.
  // Absorbed, as GqaAttention: from ~1 MFLOP a decode step's attention pays for waking the team.
  const double att_flops = 2.0 * static_cast<double>(Hq_ * st.n_tokens * nk * (2 * M.rank + M.d_rope));
  const bool team = st.by_tokens || !absorbed || att_flops >= 1e6;
  mla_attend(M, st.mla_exec, scratch + l.q, st.n_tokens, cache.k, nk, method, team ? st.team : ExecContext{1},
             scratch + (absorbed ? l.lat : l.att), HalfKv{cache.type, cache.k16, cache.k16});
}

void MlaAttention::output(const ForwardStep& st, std::int64_t t0, std::int64_t t1, float* scratch, float* x,
                          bool main) const {
  const MlaLayer& M = *L_->mla;
  const Layout l = layout(st);
  const std::int64_t aw = Hq_ * M.d_v;
  if (st.mla_exec == MlaExec::kAbsorbed) {
    mla_up_values(M, scratch + l.lat + t0 * l.ow, t1 - t0, scratch + l.att + t0 * aw, st.rows_ctx);
    st.lap(main, &ForwardProfile::attention);
  }
  blocks::linear(st.rows_ctx, st.act, scratch + l.att + t0 * aw, t1 - t0, blocks::Weight{&L_->wo, &L_->wo_q, E_, aw},
                 x + t0 * E_, true);
  st.lap(main, &ForwardProfile::o_gemm);
}

}  // namespace numattn
