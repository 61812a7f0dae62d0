#include "numattn/arch/hparams.h"

#include <algorithm>
#include <cmath>

#include "numattn/core/error.h"
#include "numattn/core/memory.h"

namespace numattn {

std::int64_t ModelHParams::layer_weights() const {
  return qkv_rows() * n_embd + n_embd * n_head * head_dim + 3 * n_ff * n_embd;
}

std::int64_t ModelHParams::weight_count(bool tied) const {
  constexpr const char* what =
      "llama weight count from embedding_length, block_count, feed_forward_length, head_count, "
      "head_count_kv, key_length and the vocabulary";
  auto mul = [&](std::int64_t a, std::int64_t b) { return checked_mul(a, b, what); };
  auto add = [&](std::int64_t a, std::int64_t b) { return checked_add(a, b, what); };
  const std::int64_t qkv = mul(add(n_head, mul(2, n_head_kv)), head_dim);
  std::int64_t layer = add(mul(2, n_embd), mul(qkv, n_embd));      // norms, Wq|Wk|Wv
  layer = add(layer, mul(n_embd, mul(n_head, head_dim)));         // Wo
  layer = add(layer, mul(3, mul(n_ff, n_embd)));                  // gate, up, down
  if (qk_norm) layer = add(layer, mul(2, head_dim));               // q and k norms
  if (post_norms) layer = add(layer, mul(2, n_embd));              // post-attention and post-FFN norms
  const std::int64_t emb = mul(n_vocab, n_embd);
  return add(add(add(emb, n_embd), mul(n_layer, layer)), tied ? 0 : emb);
}

std::string ModelHParams::attention_extras() const {
  std::string s;
  auto add = [&](const char* what) { s += (s.empty() ? "" : ", ") + std::string(what); };
  if (qk_norm) add("per-head q/k RMSNorm");
  if (rope_layout == RopeLayout::kHalves) add("RoPE over halves (NEOX)");
  if (std::any_of(local_layers.begin(), local_layers.end(), [](std::uint8_t f) { return f != 0; }))
    add("sliding-window layers");
  if (attn_scale > 0 && std::abs(attn_scale * std::sqrt(static_cast<double>(head_dim)) - 1) > 1e-12)
    add("a softmax scale other than 1/√D");
  return s;
}

void ModelHParams::validate(const std::string& source) const {
  const std::string at = source.empty() ? "" : source + ": ";
  auto at_least_1 = [&](std::int64_t v, const std::string& k, const char* field) {
    NUMATTN_CHECK(v >= 1, "{}{} ({}) = {}: must be at least 1", at, k, field, v);
  };
  at_least_1(n_vocab, "rows of token_embd.weight", "n_vocab");
  at_least_1(n_embd, key(hparam_key::kEmbd), "n_embd");
  at_least_1(n_layer, key(hparam_key::kBlocks), "n_layer");
  at_least_1(n_ff, key(hparam_key::kFf), "n_ff");
  at_least_1(n_head, key(hparam_key::kHeads), "n_head");
  at_least_1(n_head_kv, key(hparam_key::kHeadsKv), "n_head_kv");
  at_least_1(head_dim, key(hparam_key::kKeyLength), "head_dim");
  NUMATTN_CHECK(n_head % n_head_kv == 0,
                "{}{} = {} is not a multiple of {} = {}: grouped-query attention needs whole groups",
                at, key(hparam_key::kHeads), n_head, key(hparam_key::kHeadsKv), n_head_kv);
  NUMATTN_CHECK(n_rot >= 0 && n_rot % 2 == 0 && n_rot <= head_dim,
                "{}{} (n_rot) = {}: must be even and between 0 and the head dim {}", at, key(hparam_key::kRot),
                n_rot, head_dim);
  NUMATTN_CHECK(std::isfinite(rms_eps) && rms_eps > 0 && rms_eps < 1,
                "{}{} (rms_eps) = {}: must be finite and in (0, 1)", at, key(hparam_key::kRmsEps), rms_eps);
  NUMATTN_CHECK(std::isfinite(rope_base) && rope_base > 0,
                "{}{} (rope_base) = {}: must be finite and positive", at, key(hparam_key::kRopeBase), rope_base);
  NUMATTN_CHECK(n_ctx_train >= 1 && n_ctx_train <= kMaxContextLength,
                "{}{} (n_ctx_train) = {}: must be between 1 and {}", at, key(hparam_key::kContext), n_ctx_train,
                kMaxContextLength);
  NUMATTN_CHECK(std::isfinite(embed_scale) && embed_scale > 0, "{}embedding scale {}: must be finite and positive", at,
                embed_scale);
  NUMATTN_CHECK(std::isfinite(attn_scale) && attn_scale >= 0, "{}attention scale {}: must be finite and >= 0", at,
                attn_scale);
  NUMATTN_CHECK(std::isfinite(logit_softcap) && logit_softcap >= 0, "{}{} = {}: must be finite and >= 0", at,
                key(hparam_key::kLogitSoftcap), logit_softcap);
  NUMATTN_CHECK(std::isfinite(rope_base_local) && rope_base_local > 0, "{}{} = {}: must be finite and positive", at,
                key(hparam_key::kRopeBaseLocal), rope_base_local);
  NUMATTN_CHECK(local_layers.empty() || static_cast<std::int64_t>(local_layers.size()) == n_layer,
                "{}{} gives {} layers, but {} = {}", at, key(hparam_key::kSlidingWindowPattern), local_layers.size(),
                key(hparam_key::kBlocks), n_layer);
  const bool any_local = std::any_of(local_layers.begin(), local_layers.end(), [](std::uint8_t f) { return f != 0; });
  NUMATTN_CHECK(!any_local || (sliding_window >= 1 && sliding_window <= kMaxContextLength),
                "{}{} = {}: local layers need a window of 1 to {} tokens", at, key(hparam_key::kSlidingWindow),
                sliding_window, kMaxContextLength);
  weight_count(false);  // every weight size fits in 64 bits (throws otherwise)
}

}  // namespace numattn
