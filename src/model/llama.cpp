#include "numattn/model/llama.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <limits>

#include "numattn/attention/registry.h"
#include "numattn/core/blas.h"
#include "numattn/core/error.h"
#include "numattn/core/memory.h"
#include "numattn/arch/arch.h"
#include "numattn/core/simd.h"
#include "numattn/gguf/gguf.h"
#include "numattn/gguf/gguf_keys.h"
#include "numattn/gguf/tensor_data.h"
#include "numattn/model/blocks/bdv_attention.h"
#include "numattn/model/blocks/factored_vo_attention.h"
#include "numattn/model/blocks/gqa_attention.h"
#include "numattn/model/blocks/mla_attention.h"
#include "numattn/model/blocks/rms_norm.h"
#include "numattn/model/blocks/gated_ffn.h"
#include "numattn/model/mla_model.h"
#include "model/blocks/linear.h"
#include "numattn/model/tensor_convert.h"
#include "numattn/transform/mla.h"

namespace numattn {

namespace {

// Tensors per layer (norms, q, k, v or its BD form, o, gate, up, down).
constexpr std::int64_t kTensorsPerLayer = 9;

// Tensor `name` must exist, have ne = {in} (out == 0: a vector) or {in, out} (GGUF order; any
// trailing dimensions 1, as llama.cpp accepts) and a type numattn can dequantize. `why` says
// which keys give the expected shape, so a disagreement names both sides.
void check_tensor(const GgufFile& f, const std::string& name, std::int64_t in, std::int64_t out,
                  const std::string& why) {
  const GgufTensorInfo* t = f.find_tensor(name);
  NUMATTN_CHECK(t != nullptr, "{}: tensor {} is missing (the llama hyper-parameters need it)",
                f.path(), name);
  auto dim = [&](std::size_t i) { return i < t->ne.size() ? t->ne[i] : 1; };
  NUMATTN_CHECK(dim(0) == in && dim(1) == (out == 0 ? 1 : out) && dim(2) == 1 && dim(3) == 1,
                "{}: tensor {} has shape {}, but the hyper-parameters give {} ({}): the file's "
                "metadata disagrees with its tensors",
                f.path(), name, t->shape_string(),
                out == 0 ? fmt::format("[{}]", in) : fmt::format("[{}, {}]", in, out), why);
  NUMATTN_CHECK(ggml_type_info(t->type).dequantizable,
                "{}: tensor {} has type {}, which numattn cannot dequantize", f.path(), name,
                ggml_type_name(t->type));
}

// Dequantizes a tensor that read_hparams has checked, refusing non-finite weights.
void load_tensor(const GgufFile& f, const std::string& name, std::vector<float>& dst,
                 std::int64_t n, const ExecContext& ctx) {
  const GgufTensorInfo& t = f.tensor(name);
  NUMATTN_ASSERT(t.n_elements() == n);
  dst.resize(static_cast<std::size_t>(n));
  dequantize_tensor(t, dst.data(), ctx, NonFinite::kRefuse);
}
void load_tensor(const GgufFile& f, const std::string& name, float* dst, std::int64_t n,
                 const ExecContext& ctx) {
  const GgufTensorInfo& t = f.tensor(name);
  NUMATTN_ASSERT(t.n_elements() == n);
  dequantize_tensor(t, dst, ctx, NonFinite::kRefuse);
}

// The norms an architecture adds to a layer (ModelHParams::qk_norm, post_norms), float32 in
// both weight storages; layer prefix `p`, shapes checked by read_hparams.
void load_extra_norms(const GgufFile& f, const std::string& p, const ModelHParams& hp, LlamaLayer& L,
                      const ExecContext& ctx) {
  if (hp.qk_norm) {
    load_tensor(f, p + "attn_q_norm.weight", L.attn_q_norm, hp.head_dim, ctx);
    load_tensor(f, p + "attn_k_norm.weight", L.attn_k_norm, hp.head_dim, ctx);
  }
  if (hp.post_norms) {
    load_tensor(f, p + "post_attention_norm.weight", L.attn_post_norm, hp.n_embd, ctx);
    load_tensor(f, p + "post_ffw_norm.weight", L.ffn_post_norm, hp.n_embd, ctx);
  }
}

// The BDA keys of a llama file (model/bda_model.h): `numattn.bda.version` (the layout this build
// reads: 1), `numattn.bda.pairs` (the pairs the layout stores: only "vo"; QK forms of MLA models are
// made at load), and per BD layer the channel permutation and the dense-head list, which must
// come with the layer's `attn_v_bd.coef` tensor and it with them.
constexpr std::int64_t kBdaFormatVersion = 1;
constexpr const char* kBdaVersion = "numattn.bda.version";
constexpr const char* kBdaPairs = "numattn.bda.pairs";

// Refuses BDA keys or tensors where they do not belong and checks the file-wide keys of a BDA
// file. Returns whether the file is one.
bool check_bda_file(const GgufFile& f, const std::string& arch, std::int64_t n_layer) {
  const GgufKeyReader keys(f);
  std::string coef;  // the first layer's BD tensor, if any
  for (std::int64_t l = 0; l < n_layer && coef.empty(); ++l)
    if (f.find_tensor("blk." + std::to_string(l) + ".attn_v_bd.coef")) coef = "blk." + std::to_string(l) + ".attn_v_bd.coef";
  const bool keyed = keys.has(kBdaVersion) || keys.has(kBdaPairs);
  if (coef.empty() && !keyed) return false;
  if (arch != "llama")
    throw Error(fmt::format("{}: {} in a '{}' file: BD Attention files are llama files (model/bda_model.h); "
                            "apply BDA to this model at load instead", f.path(),
                            keyed ? (keys.has(kBdaVersion) ? kBdaVersion : kBdaPairs) : "tensor " + coef, arch));
  keys.version(kBdaVersion, kBdaFormatVersion);
  keys.one_of(kBdaPairs, {"vo"},
              "the pairs whose BD form the file stores; this layout stores the VO pair only (qk and qkvo are "
              "applied at load)");
  return true;
}

// The validated permutation and dense-head list of BD layer prefix `p` (E channels, Hkv heads).
struct BdaLayerKeys {
  std::vector<std::int64_t> perm, dense;
};
BdaLayerKeys read_bda_layer(const GgufFile& f, const std::string& p, std::int64_t E, std::int64_t Hkv) {
  const GgufKeyReader keys(f);
  const std::string pk = p + "attn_v_bd.perm", dk = p + "attn_v_bd.dense";
  BdaLayerKeys k;
  k.perm = keys.integers(pk, static_cast<std::size_t>(E), static_cast<std::size_t>(E), 0, E - 1,
                         "the input channels in [S, S^c] order: a permutation of 0 .. embedding_length − 1");
  std::vector<char> seen(static_cast<std::size_t>(E), 0);
  for (std::int64_t c : k.perm)
    if (seen[static_cast<std::size_t>(c)]++)
      keys.refuse(pk, fmt::format("lists channel {} twice: not a permutation of 0 .. {}", c, E - 1));
  k.dense = keys.integers(dk, 0, static_cast<std::size_t>(Hkv), 0, Hkv - 1,
                          "the KV heads kept dense, each at most once, at most head_count_kv of them");
  for (std::size_t i = 1; i < k.dense.size(); ++i)
    if (k.dense[i] <= k.dense[i - 1]) keys.refuse(dk, "must list KV heads in increasing order, each once");
  return k;
}

// The fused BD projection of the VO pair a BDA file stores for layer prefix `p` instead of
// attn_v (model/bda_model.h); float32 in both weight storages.
std::shared_ptr<const transform::BdProjection> load_v_bd(const GgufFile& f, const std::string& p, std::int64_t E,
                                                        std::int64_t Hkv, std::int64_t D, const ExecContext& ctx) {
  transform::BdProjection::Parts parts;
  parts.d_in = E;
  parts.heads = Hkv;
  parts.head_dim = D;
  parts.rank = D;
  const BdaLayerKeys k = read_bda_layer(f, p, E, Hkv);
  for (std::int64_t c : k.perm) parts.perm.push_back(c);
  for (std::int64_t c : k.dense) parts.dense_heads.push_back(c);
  load_tensor(f, p + "attn_v_bd.coef", parts.rest, (E - D) * Hkv * D, ctx);
  const auto nd = static_cast<std::int64_t>(parts.dense_heads.size());
  if (nd > 0) load_tensor(f, p + "attn_v_bd.top", parts.top, D * nd * D, ctx);
  return std::make_shared<const transform::BdProjection>(transform::BdProjection::from_parts(std::move(parts)));
}

// The MLA keys of a `numattn-mla` file (model/mla_convert.h), each read through GgufKeyReader
// with its range, then checked against each other and against the file's GQA hyper-parameters
// `hp` the way convert_layer_to_mla relates them: d_v = D, d_rope = rope_heads·n_rot,
// d_nope = Hkv·D − d_rope, r = the latent width d_nope + Hkv·D cut to rank_option, softmax
// scale 1/sqrt(D). So the informational options and the renamed GQA keys (head_count_kv,
// rope.dimension_count, which size KV-cache comparisons) cannot disagree with the layers.
struct MlaFileDims {
  std::int64_t rank = 0, d_nope = 0, d_rope = 0, d_v = 0;
  std::int64_t freqfold = 1, rope_dims = 0, rank_option = 0;
  double scale = 0;
};
constexpr std::int64_t kMaxMlaDim = std::int64_t{1} << 20;
// The numattn-mla layouts this build reads (model/mla_convert.h): 2; 1 (rope_heads instead of
// rope_dims, FreqFold at the group's mean frequency) only where both agree, freqfold 1.
constexpr std::int64_t kMlaFormatVersion = 2;
constexpr const char* kMla = "numattn-mla.mla.";
std::string mla_key(const char* k) { return std::string(kMla) + k; }

MlaFileDims read_mla_dims(const GgufFile& f, const ModelHParams& hp) {
  const GgufKeyReader keys(f);
  MlaFileDims d;
  const std::int64_t version = keys.version(mla_key("version"), kMlaFormatVersion, 1);  // files before the key are version 1
  const std::int64_t D = hp.head_dim, Hkv = hp.n_head_kv, pairs = hp.n_rot / 2;
  const std::string dims = fmt::format("an MLA dimension, at most {}", kMaxMlaDim);
  d.rank = keys.integer(mla_key("kv_lora_rank"), 1, kMaxMlaDim, dims);
  d.d_nope = keys.integer(mla_key("nope_dim"), 0, kMaxMlaDim, dims);
  d.d_rope = keys.integer(mla_key("rope_dim"), 0, kMaxMlaDim, dims);
  d.d_v = keys.integer(mla_key("value_dim"), 1, kMaxMlaDim, dims);
  d.scale = keys.number(mla_key("softmax_scale"), 0, true, std::numeric_limits<double>::infinity(), "");
  d.freqfold = keys.integer(mla_key("freqfold"), 1, std::max<std::int64_t>(1, pairs),
                            fmt::format("RoPE frequencies folded together, at most the n_rot/2 = {} of "
                                        "numattn-mla.rope.dimension_count", pairs));
  if (version >= 2 || keys.has(mla_key("rope_dims"))) {
    d.rope_dims = keys.integer(mla_key("rope_dims"), 2, Hkv * hp.n_rot,
                               "RoPE dims kept, at most numattn-mla.attention.head_count_kv × numattn-mla.rope.dimension_count");
    if (d.rope_dims % 2 != 0) keys.refuse(mla_key("rope_dims"), "must be even (RoPE rotates pairs)");
  } else {
    d.rope_dims = hp.n_rot * keys.integer(mla_key("rope_heads"), 1, Hkv,
                                          "KV heads' worth of RoPE dims kept, at most numattn-mla.attention.head_count_kv");
  }
  if (version < 2 && d.freqfold != 1)
    keys.refuse(mla_key("freqfold"), "is above 1 in a version-1 file, whose FreqFold rotated at the group's mean "
                                     "frequency: convert the model again");
  d.rank_option = keys.integer(mla_key("rank_option"), 0, std::numeric_limits<std::int64_t>::max(),
                               "the conversion's rank, 0 = the full latent width");
  if (pairs % d.freqfold != 0)
    keys.refuse(mla_key("freqfold"), fmt::format("does not divide the {} RoPE frequencies (n_rot/2, "
                                                 "numattn-mla.rope.dimension_count = {})", pairs, hp.n_rot));
  if (d.d_v != D)
    keys.refuse(mla_key("value_dim"), fmt::format("must equal the head dim {} (numattn-mla.attention.key_length, or "
                                                  "numattn-mla.embedding_length / numattn-mla.attention.head_count): "
                                                  "the conversion keeps W_o", D));
  if (d.d_rope % 2 != 0) keys.refuse(mla_key("rope_dim"), "must be even (RoPE rotates pairs)");
  if (d.d_rope != d.rope_dims)
    keys.refuse(mla_key("rope_dim"), fmt::format("must be the conversion's rope_dims {} ({}, or rope_heads × n_rot "
                                                 "in a version-1 file)", d.rope_dims, mla_key("rope_dims")));
  if (d.d_nope != Hkv * D - d.d_rope)
    keys.refuse(mla_key("nope_dim"), fmt::format("must be head_count_kv × head dim − rope_dim = {} × {} − {} = {} "
                                                 "(numattn-mla.attention.head_count_kv = {})",
                                                 Hkv, D, d.d_rope, Hkv * D - d.d_rope, Hkv));
  if (d.d_nope + d.d_rope < 1) keys.refuse(mla_key("nope_dim"), "nope_dim + rope_dim = 0: the keys would be empty");
  const std::int64_t full = d.d_nope + Hkv * D;
  const std::int64_t want = d.rank_option == 0 || d.rank_option > full ? full : d.rank_option;
  if (d.rank != want)
    keys.refuse(mla_key("kv_lora_rank"), fmt::format("must be {} ({} = {} of the latent width nope_dim + "
                                                     "head_count_kv × head dim = {}; 0 or more = all of it)",
                                                     want, mla_key("rank_option"), d.rank_option, full));
  const double scale = 1.0 / std::sqrt(static_cast<double>(D));
  if (std::abs(d.scale - scale) > 1e-12 * scale)
    keys.refuse(mla_key("softmax_scale"), fmt::format("must be 1/sqrt(head dim {}) = {}, the GQA model's scale", D, scale));
  return d;
}

// The per-layer RoPE frequencies `numattn-mla.mla.rope_theta.ℓ`: d_rope/2 values, those the
// conversion derives from rope.freq_base, rope.dimension_count, freqfold and rope_dims.
std::vector<double> read_mla_theta(const GgufFile& f, std::int64_t l, const ModelHParams& hp, const MlaFileDims& d) {
  const GgufKeyReader keys(f);
  const std::string k = mla_key("rope_theta.") + std::to_string(l);
  const std::vector<double> th = keys.numbers(k, static_cast<std::size_t>(d.d_rope / 2), 0, true,
                                              std::numeric_limits<double>::infinity(),
                                              "one frequency per RoPE pair, rope_dim / 2 of them");
  const std::vector<double> want = transform::mla_rope_theta(hp, static_cast<int>(d.freqfold), d.rope_dims);
  for (std::size_t i = 0; i < th.size(); ++i)
    if (std::abs(th[i] - want[i]) > 1e-12 * want[i])
      keys.refuse(k, fmt::format("element {} = {} must be {}, the frequency {} = {} and {} = {} give from "
                                 "numattn-mla.rope.freq_base = {} and numattn-mla.rope.dimension_count = {}",
                                 i, th[i], want[i], mla_key("freqfold"), d.freqfold, mla_key("rope_dims"),
                                 d.rope_dims, hp.rope_base, hp.n_rot));
  return th;
}

// One MLA layer of a numattn-mla file (shapes checked by read_hparams), in float32.
std::shared_ptr<const MlaLayer> load_mla_layer(const GgufFile& f, std::int64_t l, const ModelHParams& hp,
                                               const MlaFileDims& d, const ExecContext& ctx) {
  const std::string p = "blk." + std::to_string(l) + ".";
  const std::int64_t E = hp.n_embd, H = hp.n_head, r = d.rank, dn = d.d_nope, dr = d.d_rope, dv = d.d_v;
  MlaLayer M;
  M.n_head = H;
  M.rank = r;
  M.d_nope = dn;
  M.d_rope = dr;
  M.d_v = dv;
  M.softmax_scale = d.scale;
  M.rope_theta = read_mla_theta(f, l, hp, d);
  M.w_in.resize(static_cast<std::size_t>(M.in_rows() * E));
  load_tensor(f, p + "attn_kv_a_mqa.weight", M.w_in.data(), (r + dr) * E, ctx);
  std::vector<float> q, kvb;
  load_tensor(f, p + "attn_q.weight", q, H * (dn + dr) * E, ctx);
  float* qn = M.w_in.data() + (r + dr) * E;
  float* qr = qn + H * dn * E;
  for (std::int64_t h = 0; h < H; ++h) {
    std::copy_n(q.data() + h * (dn + dr) * E, dn * E, qn + h * dn * E);
    std::copy_n(q.data() + (h * (dn + dr) + dn) * E, dr * E, qr + h * dr * E);
  }
  load_tensor(f, p + "attn_kv_b.weight", kvb, H * (dn + dv) * r, ctx);
  M.w_uk.resize(static_cast<std::size_t>(H * dn * r));
  M.w_uv.resize(static_cast<std::size_t>(H * dv * r));
  for (std::int64_t h = 0; h < H; ++h) {
    std::copy_n(kvb.data() + h * (dn + dv) * r, dn * r, M.w_uk.data() + h * dn * r);
    std::copy_n(kvb.data() + (h * (dn + dv) + dn) * r, dv * r, M.w_uv.data() + h * dv * r);
  }
  return std::make_shared<const MlaLayer>(std::move(M));
}

}  // namespace

double ForwardProfile::total() const {
  return embed + norm + qkv_gemm + rope + attention + o_gemm + ffn_gemm + ffn_act + output_gemm +
         sync;
}

KvCache::KvCache(const ModelHParams& hp, std::int64_t max_tokens, KvType type)
    : KvCache(std::vector<CacheShape>(static_cast<std::size_t>(hp.n_layer),
                                      CacheShape{hp.n_head_kv * hp.head_dim, hp.n_head_kv * hp.head_dim}),
              max_tokens, type) {}

KvCache::KvCache(const std::vector<CacheShape>& layers, std::int64_t max_tokens, KvType type)
    : capacity_(max_tokens), type_(type), shapes_(layers) {
  NUMATTN_CHECK(max_tokens > 0, "KV cache capacity must be positive, got {}", max_tokens);
  constexpr const char* what = "KV cache size";
  std::int64_t per_token = 0;
  for (const CacheShape& c : layers) {
    NUMATTN_CHECK(c.k >= 0 && c.v >= 0, "KV cache: layer widths {} (keys), {} (values)", c.k, c.v);
    per_token = checked_add(per_token, checked_add(c.k, c.v, what), what);
  }
  const int elem = kv_type_bytes(type);
  const std::int64_t bytes = checked_mul(checked_mul(per_token, max_tokens, what), elem, what);
  bytes_per_token_ = checked_mul(per_token, elem, what);
  check_memory(static_cast<std::uint64_t>(bytes),
               fmt::format("a KV cache of {} positions ({} elements per position over {} layers, {})", max_tokens,
                           per_token, layers.size(), to_string(type)));
  // Layer after layer, K then V, each array on a 64-byte boundary.
  std::size_t end = 0;
  auto place = [&](std::int64_t width) {
    if (width == 0) return static_cast<std::size_t>(-1);
    const std::size_t at = end;
    end += (static_cast<std::size_t>(max_tokens * width * elem) + 63) / 64 * 64;
    return at;
  };
  for (const CacheShape& c : layers) {
    k_at_.push_back(place(c.k));
    v_at_.push_back(place(c.v));
  }
  store_.resize(end);
}

AttentionMethods make_attention_methods(const std::string& spec, std::int64_t n_layer,
                                        const std::vector<std::uint8_t>& local) {
  const auto specs = split_spec_list(spec);
  // Selector entries `local:SPEC` / `global:SPEC` name the layers by kind.
  std::string by_kind[2];  // [0] global, [1] local
  std::size_t selectors = 0;
  for (const std::string& sp : specs) {
    for (int kind = 0; kind < 2; ++kind) {
      const std::string prefix = kind ? "local:" : "global:";
      if (sp.rfind(prefix, 0) != 0) continue;
      NUMATTN_CHECK(by_kind[kind].empty(), "attention spec list names the {} layers twice ('{}')",
                    kind ? "local" : "global", spec);
      by_kind[kind] = sp.substr(prefix.size());
      NUMATTN_CHECK(!by_kind[kind].empty(), "'{}' names no method", sp);
      ++selectors;
    }
  }
  AttentionMethods a;
  if (selectors > 0) {
    NUMATTN_CHECK(selectors == specs.size(),
                  "attention spec list '{}' mixes layer selectors (local:SPEC, global:SPEC) with plain specs; "
                  "give either one spec for all layers, one per layer, or selectors only", spec);
    for (const std::string& sp : by_kind)
      if (!sp.empty()) create_method(sp);  // checked even without a model
    if (n_layer <= 0) return a;
    const bool any_local = std::any_of(local.begin(), local.end(), [](std::uint8_t f) { return f != 0; });
    NUMATTN_CHECK(by_kind[1].empty() || any_local,
                  "'local:{}': this model has no local (sliding-window) layers; use one spec for all layers",
                  by_kind[1]);
    NUMATTN_CHECK(by_kind[0].empty() || !std::all_of(local.begin(), local.end(), [](std::uint8_t f) { return f != 0; }) ||
                      local.empty(),
                  "'global:{}': every layer of this model is local (sliding-window)", by_kind[0]);
    for (std::int64_t l = 0; l < n_layer; ++l) {
      const bool is_local = !local.empty() && local[static_cast<std::size_t>(l)] != 0;
      const std::string& sp = by_kind[is_local ? 1 : 0];
      a.push_back(create_method(sp.empty() ? std::string(kDefaultModelAttention) : sp));
    }
    return a;
  }
  NUMATTN_CHECK(n_layer <= 0 || specs.size() == 1 || static_cast<std::int64_t>(specs.size()) == n_layer,
                "attention spec list has {} entries; give one for all layers, one per layer ({}), or "
                "local:SPEC / global:SPEC for the layers of each kind",
                specs.size(), n_layer);
  for (const auto& sp : specs) a.push_back(create_method(sp));
  // One instance per layer even for one spec: a method may keep per-instance state (auto.select
  // remembers its layer's choice).
  if (n_layer > 0 && a.size() == 1)
    for (std::int64_t l = 1; l < n_layer; ++l) a.push_back(create_method(specs.front()));
  return a;
}

std::string attention_spec(const AttentionMethods& methods, const std::vector<std::uint8_t>& local) {
  NUMATTN_CHECK(!methods.empty(), "no attention methods");
  std::string first = methods.front()->spec(), all;
  bool same = true;
  for (std::size_t l = 0; l < methods.size(); ++l) {
    const std::string sp = methods[l]->spec();
    same = same && sp == first;
    all += (l ? ";" : "") + sp;
  }
  if (same) return first;
  // One spec per kind of layer: the selector form (make_attention_methods reads it back).
  if (local.size() == methods.size()) {
    std::string kind[2];
    bool per_kind = true;
    for (std::size_t l = 0; l < methods.size() && per_kind; ++l) {
      std::string& k = kind[local[l] != 0 ? 1 : 0];
      const std::string sp = methods[l]->spec();
      if (k.empty()) k = sp;
      per_kind = k == sp;
    }
    if (per_kind && !kind[0].empty() && !kind[1].empty()) return "global:" + kind[0] + ";local:" + kind[1];
  }
  return all;
}

std::vector<std::string> split_spec_list(const std::string& specs) {
  return split_specs(specs, ",;");
}

LlamaModel::LlamaModel(ModelHParams hp, LlamaWeights w) : hp_(hp), w_(std::move(w)) {
  hp_.validate();
  check_shapes();
  mla_exec_ = MlaExec::kAbsorbed;
  auto freqs = [&](double base) {
    std::vector<double> f(static_cast<std::size_t>(hp_.n_rot / 2));
    for (std::int64_t i = 0; i < hp_.n_rot / 2; ++i)
      f[static_cast<std::size_t>(i)] = std::pow(base, -2.0 * static_cast<double>(i) / static_cast<double>(hp_.n_rot));
    return f;
  };
  rope_inv_freq_ = freqs(hp_.rope_base);
  if (!hp_.local_layers.empty()) rope_inv_freq_local_ = freqs(hp_.rope_base_local);
  set_attention(kDefaultModelAttention);
  build_blocks();
}

namespace {

// The block families: how the layers of an architecture's family become blocks
// (arch/arch.h's ArchSpec::family). A Llama layer's attention form follows its weights: an MLA
// layer (mla set), a BD-V layer (v_bd set), factored VO heads (vo_rank > 0), else GQA.
using BlockBuilder = std::vector<DecoderLayer> (*)(const ModelHParams&, const LlamaWeights&);

std::vector<DecoderLayer> build_llama_blocks(const ModelHParams& hp, const LlamaWeights& w) {
  std::vector<DecoderLayer> layers;
  for (std::size_t l = 0; l < w.layers.size(); ++l) {
    const LlamaLayer& L = w.layers[l];
    const auto index = static_cast<std::int64_t>(l);
    DecoderLayer d;
    d.attn_norm = std::make_shared<RmsNorm>(&L.attn_norm, hp.rms_eps);
    if (L.mla) {
      d.attn = std::make_shared<MlaAttention>(L, hp);
    } else if (L.v_bd) {
      d.attn = std::make_shared<BdvAttention>(L, hp, index);
    } else if (L.vo_rank > 0) {
      d.attn = std::make_shared<FactoredVoAttention>(L, hp, index);
    } else {
      d.attn = std::make_shared<GqaAttention>(L, hp, index);
    }
    d.ffn_norm = std::make_shared<RmsNorm>(&L.ffn_norm, hp.rms_eps);
    d.ffn = std::make_shared<GatedFfn>(L, hp.n_embd, hp.n_ff, hp.ffn_gate);
    if (hp.post_norms) {
      d.attn_post_norm = std::make_shared<RmsNorm>(&L.attn_post_norm, hp.rms_eps);
      d.ffn_post_norm = std::make_shared<RmsNorm>(&L.ffn_post_norm, hp.rms_eps);
    }
    layers.push_back(std::move(d));
  }
  return layers;
}

struct BlockFamily {
  std::string_view family;
  BlockBuilder build;
};
constexpr BlockFamily kBlockFamilies[] = {{"llama", &build_llama_blocks}};

}  // namespace

void LlamaModel::build_blocks() {
  // Every model of this class is of the llama family (read_hparams refuses the others).
  const BlockFamily& f = kBlockFamilies[0];
  layers_ = f.build(hp_, w_);
  output_norm_ = std::make_shared<RmsNorm>(&w_.output_norm, hp_.rms_eps);
}

LlamaModel::LlamaModel(const LlamaModel& o)
    : hp_(o.hp_), w_(o.w_), rope_inv_freq_(o.rope_inv_freq_), rope_inv_freq_local_(o.rope_inv_freq_local_), attn_(o.attn_), mla_exec_(o.mla_exec_), act_(o.act_) {
  build_blocks();
}

LlamaModel::LlamaModel(LlamaModel&& o) noexcept
    : hp_(std::move(o.hp_)),
      w_(std::move(o.w_)),
      rope_inv_freq_(std::move(o.rope_inv_freq_)),
      rope_inv_freq_local_(std::move(o.rope_inv_freq_local_)),
      attn_(std::move(o.attn_)),
      mla_exec_(o.mla_exec_),
      act_(o.act_) {
  build_blocks();
}

LlamaModel& LlamaModel::operator=(const LlamaModel& o) {
  if (this != &o) *this = LlamaModel(o);
  return *this;
}

LlamaModel& LlamaModel::operator=(LlamaModel&& o) noexcept {
  hp_ = std::move(o.hp_);
  w_ = std::move(o.w_);
  rope_inv_freq_ = std::move(o.rope_inv_freq_);
  rope_inv_freq_local_ = std::move(o.rope_inv_freq_local_);
  attn_ = std::move(o.attn_);
  mla_exec_ = o.mla_exec_;
  act_ = o.act_;
  build_blocks();
  return *this;
}

void LlamaModel::edit_weights(const std::function<void(LlamaWeights&)>& edit) {
  edit(w_);
  check_shapes();
  build_blocks();
}

void LlamaModel::check_shapes() const {
  const auto& h = hp_;  // validated: the products below cannot overflow
  auto need = [](const std::vector<float>& v, std::int64_t n, const std::string& what) {
    NUMATTN_CHECK(static_cast<std::int64_t>(v.size()) == n, "{} has {} values, expected {}", what,
                  v.size(), n);
  };
  // A matrix [out, in]: float32 of out·in values, or in place with those rows and columns.
  auto mat = [&](const std::vector<float>& v, const QuantMatrix& q, std::int64_t out,
                 std::int64_t in, const std::string& what) {
    if (q.empty()) return need(v, out * in, what);
    NUMATTN_CHECK(v.empty(), "{} is held both as float32 and in place", what);
    NUMATTN_CHECK(q.rows() == out && q.cols == in, "{} is [{}, {}] in place, expected [{}, {}]",
                  what, q.rows(), q.cols, out, in);
    NUMATTN_CHECK(w_.file != nullptr, "{} is held in place without its file", what);
  };
  mat(w_.token_embd, w_.token_embd_q, h.n_vocab, h.n_embd, "token_embd");
  need(w_.output_norm, h.n_embd, "output_norm");
  if (!w_.tied()) mat(w_.output, w_.output_q, h.n_vocab, h.n_embd, "output");
  NUMATTN_CHECK(static_cast<std::int64_t>(w_.layers.size()) == h.n_layer, "{} layers given, expected {}",
                w_.layers.size(), h.n_layer);
  for (std::size_t l = 0; l < w_.layers.size(); ++l) {
    const auto& L = w_.layers[l];
    const std::string p = "layer " + std::to_string(l) + " ";
    need(L.attn_norm, h.n_embd, p + "attn_norm");
    need(L.attn_q_norm, h.qk_norm ? h.head_dim : 0, p + "attn_q_norm");
    need(L.attn_k_norm, h.qk_norm ? h.head_dim : 0, p + "attn_k_norm");
    need(L.attn_post_norm, h.post_norms ? h.n_embd : 0, p + "attn_post_norm");
    need(L.ffn_post_norm, h.post_norms ? h.n_embd : 0, p + "ffn_post_norm");
    if (L.mla) {
      const MlaLayer& M = *L.mla;
      NUMATTN_CHECK(L.wqkv.empty() && L.wqkv_q.empty() && !L.v_bd,
                    "{}is an MLA layer but also holds Q/K/V weights", p);
      NUMATTN_CHECK(M.n_head == h.n_head, "{}MLA layer has {} heads, the model {}", p, M.n_head, h.n_head);
      NUMATTN_CHECK(M.rank >= 1 && M.d_v >= 1 && M.d_nope >= 0 && M.d_rope >= 0 && M.d_rope % 2 == 0 &&
                        M.d_nope + M.d_rope >= 1 && std::isfinite(M.softmax_scale) && M.softmax_scale > 0 &&
                        static_cast<std::int64_t>(M.rope_theta.size()) == M.d_rope / 2,
                    "{}MLA layer has inconsistent sizes (rank {}, d_nope {}, d_rope {}, d_v {})", p,
                    M.rank, M.d_nope, M.d_rope, M.d_v);
      need(M.w_in, M.in_rows() * h.n_embd, p + "MLA input projections");
      need(M.w_uk, M.n_head * M.d_nope * M.rank, p + "MLA W_uk");
      need(M.w_uv, M.n_head * M.d_v * M.rank, p + "MLA W_uv");
      NUMATTN_CHECK(M.uv_bd.empty() || static_cast<std::int64_t>(M.uv_bd.size()) == M.n_head,
                    "{}MLA layer has {} BD value projections for {} heads", p, M.uv_bd.size(), M.n_head);
      for (const transform::BdProjection& b : M.uv_bd)
        NUMATTN_CHECK(b.d_in() == M.rank && b.heads() == 1 && b.head_dim() == M.d_v,
                      "{}MLA BD value projection is {}→{}×{}, expected {}→1×{}", p, b.d_in(),
                      b.heads(), b.head_dim(), M.rank, M.d_v);
      mat(L.wo, L.wo_q, h.n_embd, h.n_head * M.d_v, p + "wo");
      need(L.ffn_norm, h.n_embd, p + "ffn_norm");
      mat(L.w_gate_up, L.w_gate_up_q, 2 * h.n_ff, h.n_embd, p + "w_gate_up");
      mat(L.w_down, L.w_down_q, h.n_embd, h.n_ff, p + "w_down");
      continue;
    }
    const std::int64_t vr = L.vo_rank;
    NUMATTN_CHECK(vr == 0 || (!L.v_bd && static_cast<std::int64_t>(L.vo_mix.size()) == h.n_head * vr),
                  "{}factored VO layer has {} mixing values (not Hq × R) or a BD projection", p, L.vo_mix.size());
    mat(L.wqkv, L.wqkv_q,
        vr > 0    ? (h.n_head + h.n_head_kv) * h.head_dim + vr
        : L.v_bd ? (h.n_head + h.n_head_kv) * h.head_dim
                  : h.qkv_rows(),
        h.n_embd, p + "wqkv");
    if (L.v_bd)
      NUMATTN_CHECK(L.v_bd->d_in() == h.n_embd && L.v_bd->heads() == h.n_head_kv &&
                        L.v_bd->head_dim() == h.head_dim,
                    "{}BD value projection is {}→{}×{}, expected {}→{}×{}", p, L.v_bd->d_in(),
                    L.v_bd->heads(), L.v_bd->head_dim(), h.n_embd, h.n_head_kv, h.head_dim);
    mat(L.wo, L.wo_q, h.n_embd, vr > 0 ? vr : h.n_head * h.head_dim, p + "wo");
    need(L.ffn_norm, h.n_embd, p + "ffn_norm");
    mat(L.w_gate_up, L.w_gate_up_q, 2 * h.n_ff, h.n_embd, p + "w_gate_up");
    mat(L.w_down, L.w_down_q, h.n_embd, h.n_ff, p + "w_down");
  }
}

void LlamaModel::set_activations(Activations a) {
  NUMATTN_CHECK(a == Activations::kF32 || w_.in_place(),
                "8-bit activations (q8) need weights held in their GGUF encoding (--weights gguf): "
                "this model's weights are float32 (--weights f32, the exactness reference), whose "
                "products always take float32 activations");
  act_ = a;
}

const char* weight_storage_name(WeightStorage s) {
  return s == WeightStorage::kF32 ? "f32" : "gguf";
}

WeightStorage parse_weight_storage(const std::string& name) {
  if (name == "gguf") return WeightStorage::kInPlace;
  if (name == "f32") return WeightStorage::kF32;
  throw Error(fmt::format("unknown weight storage '{}': use gguf (in place, the file's encoding) "
                          "or f32 (dequantized at load)", name));
}

LlamaModel LlamaModel::load(const std::string& path, const ExecContext& ctx, WeightStorage storage) {
  return load(std::make_shared<const GgufFile>(GgufFile::open(path)), ctx, storage);
}

LlamaModel LlamaModel::load(std::shared_ptr<const GgufFile> file, const ExecContext& ctx,
                            WeightStorage storage) {
  NUMATTN_CHECK(file != nullptr, "LlamaModel::load: no file");
  const GgufFile& f = *file;
  const ModelHParams hp = read_hparams(f);  // shapes and types of every tensor below checked
  const bool in_place = storage == WeightStorage::kInPlace;
  const bool tied = f.find_tensor("output.weight") == nullptr;
  // Every size below is a checked tensor's: weight_count(tied) bounds them all.
  if (!in_place)
    check_memory(static_cast<std::uint64_t>(checked_mul(hp.weight_count(tied), 4, "model weight bytes")),
                 fmt::format("loading {} ({} float32 weights)", f.path(), hp.weight_count(tied)));
  const std::int64_t E = hp.n_embd, D = hp.head_dim, Hkv = hp.n_head_kv;
  const bool mla = f.architecture() == "numattn-mla";
  const MlaFileDims md = mla ? read_mla_dims(f, hp) : MlaFileDims{};
  // A numattn-tensor file (model/tensor_convert.h): the kinds it rebuilds are left to it.
  const bool tens = f.architecture() == "numattn-tensor";
  const TensorFileLayout tl = tens ? read_tensor_file_layout(f, hp) : TensorFileLayout{};
  auto keep = [&](const char* kind) { return !tens || !tl.rebuilds(kind); };
  // One weight matrix made of the row blocks `names` (stacked in order): held in place in the
  // file's encoding, or dequantized to float32.
  auto matrix = [&](QuantMatrix& qm, std::vector<float>& fm, std::initializer_list<std::string> names) {
    if (in_place) {
      for (const std::string& n : names) append_tensor(qm, f.tensor(n));
      return;
    }
    std::int64_t total = 0;
    for (const std::string& n : names) total += f.tensor(n).n_elements();
    fm.resize(static_cast<std::size_t>(total));
    std::int64_t at = 0;
    for (const std::string& n : names) {
      const std::int64_t c = f.tensor(n).n_elements();
      load_tensor(f, n, fm.data() + at, c, ctx);
      at += c;
    }
  };
  LlamaWeights w;
  matrix(w.token_embd_q, w.token_embd, {"token_embd.weight"});
  load_tensor(f, "output_norm.weight", w.output_norm, E, ctx);
  if (!tied) matrix(w.output_q, w.output, {"output.weight"});
  w.layers.resize(static_cast<std::size_t>(hp.n_layer));
  for (std::int64_t l = 0; l < hp.n_layer; ++l) {
    auto& L = w.layers[static_cast<std::size_t>(l)];
    const std::string p = "blk." + std::to_string(l) + ".";
    load_tensor(f, p + "attn_norm.weight", L.attn_norm, E, ctx);
    load_tensor(f, p + "ffn_norm.weight", L.ffn_norm, E, ctx);
    load_extra_norms(f, p, hp, L, ctx);
    if (mla) {
      // MLA projections are float32 arithmetic of their own (model/mla_model.h).
      L.mla = load_mla_layer(f, l, hp, md, ctx);
    } else if (keep("attn_q")) {
      if (f.find_tensor(p + "attn_v_bd.coef")) {
        // A BDA file (model/bda_model.h) stores the VO pair's fused projection instead of
        // attn_v; the BD projection is float32 arithmetic of its own (transform/bd_projection.h).
        matrix(L.wqkv_q, L.wqkv, {p + "attn_q.weight", p + "attn_k.weight"});
        L.v_bd = load_v_bd(f, p, E, Hkv, D, ctx);
      } else {
        matrix(L.wqkv_q, L.wqkv, {p + "attn_q.weight", p + "attn_k.weight", p + "attn_v.weight"});
      }
    }
    if (keep("attn_output")) matrix(L.wo_q, L.wo, {p + "attn_output.weight"});
    if (keep("ffn_gate")) {
      matrix(L.w_gate_up_q, L.w_gate_up, {p + "ffn_gate.weight", p + "ffn_up.weight"});
      matrix(L.w_down_q, L.w_down, {p + "ffn_down.weight"});
    }
  }
  if (in_place) w.file = file;
  if (tens) return finish_tensor_model(f, hp, std::move(w), ctx);
  return LlamaModel(hp, std::move(w));
}

ModelHParams LlamaModel::read_hparams(const GgufFile& f) {
  const std::string arch = f.architecture();
  const ArchSpec* spec = find_architecture(arch);
  NUMATTN_CHECK(spec != nullptr && spec->family == "llama",
                "{}: architecture '{}' is not supported; the forward pass implements {}", f.path(), arch,
                supported_architectures());
  auto K = [&](const char* field) { return arch_key(arch, field); };
  ModelHParams hp = read_model_hparams(f);
  const std::int64_t E = hp.n_embd, D = hp.head_dim, F = hp.n_ff, Hq = hp.n_head,
                     Hkv = hp.n_head_kv, V = hp.n_vocab;
  NUMATTN_CHECK(f.get_int(K(hparam_key::kVocab), V) == V, "{}: {} = {} disagrees with the {} rows of tensor "
                "token_embd.weight", f.path(), K(hparam_key::kVocab), f.get_int(K(hparam_key::kVocab), V), V);
  if (const GgufValue* toks = f.find("tokenizer.ggml.tokens"); toks && toks->is_array())
    NUMATTN_CHECK(static_cast<std::int64_t>(toks->array_size()) == V,
                  "{}: the vocabulary tokenizer.ggml.tokens has {} tokens, but tensor "
                  "token_embd.weight has {} rows: token ids would index past the embeddings",
                  f.path(), toks->array_size(), V);
  // Each layer needs its own tensors: a cheap bound before looking for them one by one.
  const auto n_tensors = static_cast<std::int64_t>(f.tensors().size());
  const bool tens = arch == "numattn-tensor";
  // A numattn-tensor file keeps at least the two norms and three matrices of a layer.
  const std::int64_t per_layer = tens ? 5 : kTensorsPerLayer;
  NUMATTN_CHECK(hp.n_layer <= (n_tensors - 2) / per_layer,
                "{}: {} = {}, but the file has only {} tensors ({} per layer are needed)", f.path(),
                K(hparam_key::kBlocks), hp.n_layer, n_tensors, per_layer);
  // Its own keys and factor tensors (validated there); the per-layer tensors it drops are not checked.
  const TensorFileLayout tl = tens ? read_tensor_file_layout(f, hp) : TensorFileLayout{};
  auto stored = [&](const char* kind) { return !tens || !tl.drops(kind); };

  const bool mla = arch == "numattn-mla";
  const MlaFileDims md = mla ? read_mla_dims(f, hp) : MlaFileDims{};
  const bool bda = check_bda_file(f, arch, hp.n_layer);
  const std::string e_why = fmt::format("{} = {}", K(hparam_key::kEmbd), E);
  const std::string hd = f.has(K(hparam_key::kKeyLength)) ? std::string(K(hparam_key::kKeyLength)) : "embedding_length / head_count";
  const std::string q_why = fmt::format("{}; {} = {} × head dim {} ({})", e_why, K(hparam_key::kHeads), Hq, D, hd);
  const std::string kv_why = fmt::format("{}; {} = {} × head dim {} ({})", e_why, K(hparam_key::kHeadsKv), Hkv, D, hd);
  const std::string f_why = fmt::format("{}; {} = {}", e_why, K(hparam_key::kFf), F);
  check_tensor(f, "token_embd.weight", E, V, e_why);
  check_tensor(f, "output_norm.weight", E, 0, e_why);
  if (f.find_tensor("output.weight")) check_tensor(f, "output.weight", E, V, e_why + ", vocabulary of token_embd.weight");
  for (std::int64_t l = 0; l < hp.n_layer; ++l) {
    const std::string p = "blk." + std::to_string(l) + ".";
    check_tensor(f, p + "attn_norm.weight", E, 0, e_why);
    check_tensor(f, p + "ffn_norm.weight", E, 0, e_why);
    if (hp.qk_norm) {
      const std::string d_why = fmt::format("the head dim {} ({})", D, hd);
      check_tensor(f, p + "attn_q_norm.weight", D, 0, d_why);
      check_tensor(f, p + "attn_k_norm.weight", D, 0, d_why);
    }
    if (hp.post_norms) {
      check_tensor(f, p + "post_attention_norm.weight", E, 0, e_why);
      check_tensor(f, p + "post_ffw_norm.weight", E, 0, e_why);
    }
    if (mla) {
      const std::int64_t r = md.rank, dn = md.d_nope, dr = md.d_rope, dv = md.d_v;
      const std::string m_why = fmt::format("{}; numattn-mla.mla.* r = {}, d_nope = {}, d_rope = {}, d_v = {}, "
                                            "{} heads", e_why, r, dn, dr, dv, Hq);
      check_tensor(f, p + "attn_kv_a_mqa.weight", E, r + dr, m_why);
      check_tensor(f, p + "attn_q.weight", E, Hq * (dn + dr), m_why);
      check_tensor(f, p + "attn_kv_b.weight", r, Hq * (dn + dv), m_why);
      check_tensor(f, p + "attn_output.weight", Hq * dv, E, m_why);
      read_mla_theta(f, l, hp, md);
      check_tensor(f, p + "ffn_gate.weight", E, F, f_why);
      check_tensor(f, p + "ffn_up.weight", E, F, f_why);
      check_tensor(f, p + "ffn_down.weight", F, E, f_why);
      continue;
    }
    if (stored("attn_q")) check_tensor(f, p + "attn_q.weight", E, Hq * D, q_why);
    if (stored("attn_k")) check_tensor(f, p + "attn_k.weight", E, Hkv * D, kv_why);
    if (bda && f.find_tensor(p + "attn_v_bd.coef")) {
      // A BDA layer (model/bda_model.h).
      NUMATTN_CHECK(E > D, "{}: BDA layer {} needs {} > head dim ({} <= {})", f.path(), l, K(hparam_key::kEmbd), E, D);
      check_tensor(f, p + "attn_v_bd.coef", Hkv * D, E - D, kv_why + " (BD coefficients)");
      const auto nd = static_cast<std::int64_t>(read_bda_layer(f, p, E, Hkv).dense.size());
      if (nd > 0) check_tensor(f, p + "attn_v_bd.top", nd * D, D, kv_why + " (BD dense heads)");
    } else if (bda && (f.has(p + "attn_v_bd.perm") || f.has(p + "attn_v_bd.dense"))) {
      throw Error(fmt::format("{}: {} is set, but tensor {}attn_v_bd.coef, the layer's BD coefficients, is missing",
                              f.path(), f.has(p + "attn_v_bd.perm") ? p + "attn_v_bd.perm" : p + "attn_v_bd.dense", p));
    } else if (stored("attn_v")) {
      check_tensor(f, p + "attn_v.weight", E, Hkv * D, kv_why);
    }
    if (stored("attn_output")) check_tensor(f, p + "attn_output.weight", Hq * D, E, q_why);
    if (stored("ffn_gate")) {
      check_tensor(f, p + "ffn_gate.weight", E, F, f_why);
      check_tensor(f, p + "ffn_up.weight", E, F, f_why);
      check_tensor(f, p + "ffn_down.weight", F, E, f_why);
    }
  }
  return hp;
}

LlamaModel LlamaModel::load(const GgufFile& f, const ExecContext& ctx) {
  // A non-owning pointer: float32 storage keeps no reference to the file.
  return load(std::shared_ptr<const GgufFile>(std::shared_ptr<const GgufFile>(), &f), ctx, WeightStorage::kF32);
}

const float* LlamaModel::output_matrix() const {
  if (!w_.output.empty()) return w_.output.data();
  return w_.output_q.empty() && !w_.token_embd.empty() ? w_.token_embd.data() : nullptr;
}

std::uint64_t LlamaModel::weight_bytes_per_token(bool with_output) const {
  std::uint64_t b = 0;
  for (const DecoderLayer& d : layers_) b += d.attn->weight_bytes() + d.ffn->weight_bytes();
  if (with_output)
    b += w_.tied() ? blocks::Weight{&w_.token_embd, &w_.token_embd_q, hp_.n_vocab, hp_.n_embd}.bytes()
                   : blocks::Weight{&w_.output, &w_.output_q, hp_.n_vocab, hp_.n_embd}.bytes();
  return b;
}

KvCache LlamaModel::make_cache(std::int64_t max_tokens, KvType type) const {
  std::vector<CacheShape> shapes;
  for (std::size_t l = 0; l < layers_.size(); ++l) {
    const AttentionBlock& a = *layers_[l].attn;
    NUMATTN_CHECK(a.supports_cache(type),
                  "layer {} is a {} layer, whose KV cache keeps float32 rows: a {} cache is not available for "
                  "this model (use a f32 cache, --kv f32)",
                  l, a.kind(), to_string(type));
    shapes.push_back(a.cache_shape());
  }
  return KvCache(shapes, max_tokens, type);
}

std::int64_t LlamaModel::kv_bytes_per_token(KvType type) const {
  std::int64_t b = 0;
  for (const DecoderLayer& d : layers_) b += d.attn->cache_bytes_per_token(type);
  return b;
}

bool LlamaModel::has_mla() const {
  return std::any_of(layers_.begin(), layers_.end(), [](const DecoderLayer& d) { return d.attn->kind() == "mla"; });
}

std::int64_t LlamaModel::body_weights() const {
  std::int64_t b = 0;
  for (const DecoderLayer& d : layers_) b += d.attn->weights() + d.ffn->weights();
  return b;
}

void LlamaModel::set_attention(const std::string& spec) {
  attn_ = make_attention_methods(spec, hp_.n_layer, hp_.local_layers);
}

std::string LlamaModel::attention_spec() const { return numattn::attention_spec(attn_, hp_.local_layers); }

// The buffers and steps of one forward call: the token rows x and xn [N, E], each layer's
// attention scratch (two, alternating: a layer's rows live from its project to its output, while
// the next layer's project runs in the same region), the feed-forward scratch, the RoPE table.
struct LlamaModel::Call {
  const LlamaModel& m;
  KvCache& cache;
  const AttentionMethods& attn;
  const ForwardOptions& opt;
  ForwardStep st;
  std::vector<float> x, xn, y, cs, sn, cs_local, sn_local, ffn;
  std::vector<float> scratch[2];
  int nt = 1;

  Call(const LlamaModel& model, const std::vector<std::int32_t>& tokens, KvCache& c, const ExecContext& ctx,
       const ForwardOptions& o)
      : m(model), cache(c), attn(o.attention.empty() ? model.attn_ : o.attention), opt(o) {
    check(tokens);
    const ModelHParams& h = m.hp_;
    const std::int64_t N = static_cast<std::int64_t>(tokens.size()), E = h.n_embd;
    nt = ctx.num_threads();
    st.n_tokens = N;
    st.pos0 = cache.n_past_;
    st.team = ctx;
    // A prefill gives each thread a contiguous block of tokens for everything but attention
    // (norms, products on its rows, RoPE, the FFN), so a layer has two synchronisation points:
    // before attention (which needs every token's K/V) and after it. A decode step (few tokens)
    // runs the row work on one thread and splits each product over output features instead.
    st.by_tokens = nt > 1 && N >= 16 * nt;
    st.rows_ctx = st.by_tokens ? ExecContext{1} : ctx;
    st.act = m.act_;
    st.mla_exec = m.mla_exec_;
    st.capture = static_cast<bool>(opt.capture);
    st.profile = opt.profile;
    st.t0 = std::chrono::steady_clock::now();
    st.rope_half = h.n_rot / 2;
    std::int64_t a_max = 0, f_max = 0;
    for (const DecoderLayer& d : m.layers_) {
      a_max = std::max(a_max, d.attn->scratch_per_token(st));
      f_max = std::max(f_max, d.ffn->scratch_per_token());
    }
    constexpr const char* what = "forward activation size";
    const std::int64_t n_out = N - opt.logits_begin;
    const bool post = std::any_of(m.layers_.begin(), m.layers_.end(), [](const DecoderLayer& d) {
      return d.attn_post_norm != nullptr || d.ffn_post_norm != nullptr;
    });
    const std::int64_t per_token = (post ? 3 : 2) * E + 2 * a_max + f_max + 4 * st.rope_half;
    const std::int64_t floats =
        checked_add(checked_mul(N, per_token, what), checked_mul(n_out, opt.hidden ? E : h.n_vocab, what), what);
    check_memory(static_cast<std::uint64_t>(checked_mul(floats, 4, what)),
                 fmt::format("a forward pass of {} tokens ({} rows of logits)", N, n_out));
    x.resize(static_cast<std::size_t>(N * E));
    xn.resize(x.size());
    if (post) y.resize(x.size());
    ffn.resize(static_cast<std::size_t>(N * f_max));
    for (auto& sc : scratch) sc.resize(static_cast<std::size_t>(N * a_max));
    embed(tokens);
  }

  void check(const std::vector<std::int32_t>& tokens) const {
    const ModelHParams& h = m.hp_;
    const auto N = static_cast<std::int64_t>(tokens.size());
    NUMATTN_CHECK(N > 0, "forward needs at least one token");
    NUMATTN_CHECK(cache.shapes_.size() == m.layers_.size(), "KV cache was made for another model ({} layers, not {})",
                  cache.shapes_.size(), m.layers_.size());
    for (std::size_t l = 0; l < m.layers_.size(); ++l) {
      const CacheShape want = m.layers_[l].attn->cache_shape(), got = cache.shapes_[l];
      NUMATTN_CHECK(want == got,
                    "KV cache was made for another model (layer {} is {} here, holding {} + {} floats per "
                    "token, but {} + {} in the cache)",
                    l, m.layers_[l].attn->kind(), want.k, want.v, got.k, got.v);
    }
    NUMATTN_CHECK(cache.n_past_ + N <= cache.capacity_, "KV cache holds {} positions; {} + {} do not fit",
                  cache.capacity_, cache.n_past_, N);
    NUMATTN_CHECK(opt.logits_begin >= 0 && opt.logits_begin <= N, "logits_begin {} outside [0, {}]",
                  opt.logits_begin, N);
    for (std::int32_t t : tokens)
      NUMATTN_CHECK(t >= 0 && t < h.n_vocab, "token id {} outside the vocabulary of {}", t, h.n_vocab);
    NUMATTN_CHECK(static_cast<std::int64_t>(attn.size()) == h.n_layer,
                  "forward: {} attention methods given for {} layers (make_attention_methods)", attn.size(),
                  h.n_layer);
  }

  // Embeddings of the tokens, and cos/sin of every (token, frequency), shared by all layers.
  void embed(const std::vector<std::int32_t>& tokens) {
    const LlamaWeights& w = m.w_;
    const std::int64_t N = st.n_tokens, E = m.hp_.n_embd, half = st.rope_half;
    for (std::int64_t t = 0; t < N; ++t) {
      const std::int64_t id = tokens[static_cast<std::size_t>(t)];
      if (w.token_embd_q.empty()) {
        std::copy_n(w.token_embd.data() + id * E, E, x.data() + t * E);
      } else {
        w.token_embd_q.dequantize_rows(id, id + 1, x.data() + t * E);
      }
    }
    if (m.hp_.embed_scale != 1.0) {
      const auto sc = static_cast<float>(m.hp_.embed_scale);
      for (float& v : x) v *= sc;
    }
    auto table = [&](const std::vector<double>& freq, std::vector<float>& c, std::vector<float>& s) {
      c.resize(static_cast<std::size_t>(N * half));
      s.resize(c.size());
      for (std::int64_t t = 0; t < N; ++t)
        for (std::int64_t i = 0; i < half; ++i) {
          const double th = static_cast<double>(st.pos0 + t) * freq[static_cast<std::size_t>(i)];
          c[static_cast<std::size_t>(t * half + i)] = static_cast<float>(std::cos(th));
          s[static_cast<std::size_t>(t * half + i)] = static_cast<float>(std::sin(th));
        }
    };
    table(m.rope_inv_freq_, cs, sn);
    st.rope_cos = cs.data();
    st.rope_sin = sn.data();
    if (!m.rope_inv_freq_local_.empty()) {
      table(m.rope_inv_freq_local_, cs_local, sn_local);
      st.rope_cos_local = cs_local.data();
      st.rope_sin_local = sn_local.data();
    }
    st.lap(true, &ForwardProfile::embed);
  }

  LayerCache layer_cache(std::size_t l) {
    const int i = static_cast<int>(l);
    return {cache.k(i), cache.v(i), cache.shapes_[l], cache.type_, cache.k16(i), cache.v16(i)};
  }

  // Token rows [t0, t1) of layer l before attention: norm, projections, cache rows.
  void pre(std::size_t l, std::int64_t t0, std::int64_t t1, bool main) {
    const DecoderLayer& d = m.layers_[l];
    const std::int64_t E = m.hp_.n_embd;
    d.attn_norm->apply(x.data() + t0 * E, xn.data() + t0 * E, t1 - t0);
    st.lap(main, &ForwardProfile::norm);
    d.attn->project(st, xn.data(), t0, t1, layer_cache(l), scratch[l % 2].data(), main);
  }

  // Token rows [t0, t1) of layer l after attention: output projection, norm, feed-forward.
  void post(std::size_t l, std::int64_t t0, std::int64_t t1, bool main) {
    const DecoderLayer& d = m.layers_[l];
    const std::int64_t E = m.hp_.n_embd;
    if (d.attn_post_norm) {
      std::fill(y.begin() + t0 * E, y.begin() + t1 * E, 0.f);
      d.attn->output(st, t0, t1, scratch[l % 2].data(), y.data(), main);
      add_normed(*d.attn_post_norm, t0, t1, main);
    } else {
      d.attn->output(st, t0, t1, scratch[l % 2].data(), x.data(), main);
    }
    d.ffn_norm->apply(x.data() + t0 * E, xn.data() + t0 * E, t1 - t0);
    st.lap(main, &ForwardProfile::norm);
    if (d.ffn_post_norm) {
      std::fill(y.begin() + t0 * E, y.begin() + t1 * E, 0.f);
      d.ffn->forward(st, xn.data(), t0, t1, ffn.data(), y.data(), main);
      add_normed(*d.ffn_post_norm, t0, t1, main);
    } else {
      d.ffn->forward(st, xn.data(), t0, t1, ffn.data(), x.data(), main);
    }
  }

  // x rows [t0, t1) += norm(y rows): a post-norm's residual add.
  void add_normed(const NormBlock& norm, std::int64_t t0, std::int64_t t1, bool main) {
    const std::int64_t E = m.hp_.n_embd;
    norm.apply(y.data() + t0 * E, y.data() + t0 * E, t1 - t0);
    for (std::int64_t i = t0 * E; i < t1 * E; ++i) x[static_cast<std::size_t>(i)] += y[static_cast<std::size_t>(i)];
    st.lap(main, &ForwardProfile::norm);
  }

  // Runs f(t0, t1, main) on each thread's token block (or once on all tokens), and books the
  // time the first thread then waits for the others as synchronisation.
  template <class F>
  void region(F&& f) {
    const std::int64_t N = st.n_tokens;
    if (!st.by_tokens) return f(0, N, true);
    parallel_for(st.team, nt, [&](std::int64_t p) { f(N * p / nt, N * (p + 1) / nt, p == 0); });
    st.lap(true, &ForwardProfile::sync);
  }

  std::vector<float> logits();
};

void ForwardStep::lap(bool main, double ForwardProfile::*slot) const {
  if (!main || profile == nullptr) return;
  const auto t1 = std::chrono::steady_clock::now();
  profile->*slot += std::chrono::duration<double>(t1 - t0).count();
  t0 = t1;
}

namespace {

// The first non-finite value of rows [n, width] as an error naming its position (pos0 + row)
// and column, or nothing. float32 weights are finite (checked at load), so a NaN/Inf in the
// logits or the final hidden rows comes from the attention method, an overflow, or (in place,
// where load scans nothing) a non-finite weight; a perplexity or a greedy choice made from it
// would be garbage that looks like a result. One pass, small next to the product that made them.
// `attn` (may be null) names the attention in the message; its spec is built only on an error.
void refuse_non_finite(const std::vector<float>& out, std::int64_t width, std::int64_t pos0, std::int64_t first,
                       const char* what, const AttentionMethods* attn, const std::vector<std::uint8_t>& local) {
  const auto bad = std::find_if(out.begin(), out.end(), [](float v) { return !std::isfinite(v); });
  if (bad == out.end()) return;
  const std::string attention = attn ? attention_spec(*attn, local) : "";
  const auto i = static_cast<std::int64_t>(bad - out.begin());
  const std::int64_t row = first + i / width;
  throw Error(fmt::format(
      "non-finite {} {} at position {} (token {} of this call), {} {}{}: the forward pass overflowed, the "
      "attention method returned a non-finite value, or a weight is not finite (--weights f32 scans them at load)",
      what, *bad, pos0 + row, row, std::string(what) == "logit" ? "vocabulary index" : "feature", i % width,
      attention.empty() ? "" : ", with attention " + attention));
}

}  // namespace

std::vector<float> LlamaModel::Call::logits() {
  const ModelHParams& h = m.hp_;
  const std::int64_t E = h.n_embd, n_out = st.n_tokens - opt.logits_begin;
  if (opt.hidden) {
    std::vector<float> out(static_cast<std::size_t>(n_out * E));
    if (n_out > 0) m.output_norm_->apply(x.data() + opt.logits_begin * E, out.data(), n_out);
    st.lap(true, &ForwardProfile::norm);
    refuse_non_finite(out, E, st.pos0, opt.logits_begin, "hidden value", &attn, h.local_layers);
    return out;
  }
  std::vector<float> out(static_cast<std::size_t>(n_out * h.n_vocab));
  if (n_out > 0) {
    m.output_norm_->apply(x.data() + opt.logits_begin * E, xn.data(), n_out);
    st.lap(true, &ForwardProfile::norm);
    m.project_logits(xn.data(), n_out, st.team, out.data());
    st.lap(true, &ForwardProfile::output_gemm);
  }
  refuse_non_finite(out, h.n_vocab, st.pos0, opt.logits_begin, "logit", &attn, h.local_layers);
  return out;
}

void LlamaModel::project_logits(const float* hidden, std::int64_t n, const ExecContext& ctx, float* out) const {
  const ModelHParams& h = hp_;
  const std::int64_t E = h.n_embd;
  // Split over the vocabulary: each thread streams its part of the output matrix once.
  const blocks::Weight W = w_.tied() ? blocks::Weight{&w_.token_embd, &w_.token_embd_q, h.n_vocab, E}
                                     : blocks::Weight{&w_.output, &w_.output_q, h.n_vocab, E};
  blocks::linear(ctx, act_, hidden, n, W, out, false);
  if (h.logit_softcap > 0) {
    const auto c = static_cast<float>(h.logit_softcap);
    for (std::int64_t i = 0; i < n * h.n_vocab; ++i) out[i] = c * std::tanh(out[i] / c);
  }
}

std::vector<float> LlamaModel::logits_from_hidden(const float* hidden, std::int64_t n, const ExecContext& ctx,
                                                  std::int64_t pos0) const {
  NUMATTN_CHECK(n >= 0, "logits_from_hidden: {} rows", n);
  constexpr const char* what = "logits size";
  check_memory(static_cast<std::uint64_t>(checked_mul(checked_mul(n, hp_.n_vocab, what), 4, what)),
               fmt::format("{} rows of logits", n));
  std::vector<float> out(static_cast<std::size_t>(n * hp_.n_vocab));
  if (n > 0) project_logits(hidden, n, ctx, out.data());
  refuse_non_finite(out, hp_.n_vocab, pos0, 0, "logit", nullptr, hp_.local_layers);
  return out;
}

std::vector<float> LlamaModel::forward(const std::vector<std::int32_t>& tokens, KvCache& cache,
                                       const ExecContext& ctx, const ForwardOptions& opt) const {
  Call c(*this, tokens, cache, ctx, opt);
  const std::size_t n_layer = layers_.size();
  c.region([&](std::int64_t t0, std::int64_t t1, bool main) { c.pre(0, t0, t1, main); });
  for (std::size_t l = 0; l < n_layer; ++l) {
    const AttentionBlock& a = *layers_[l].attn;
    float* scratch = c.scratch[l % 2].data();
    if (opt.capture) a.capture(c.st, static_cast<int>(l), c.xn.data(), scratch, opt.capture);
    a.attend(c.st, *c.attn[l], c.layer_cache(l), scratch);
    c.st.lap(true, &ForwardProfile::attention);
    c.region([&](std::int64_t t0, std::int64_t t1, bool main) {
      c.post(l, t0, t1, main);
      if (l + 1 < n_layer) c.pre(l + 1, t0, t1, main);
    });
  }
  std::vector<float> logits = c.logits();
  cache.n_past_ = c.st.pos0 + c.st.n_tokens;  // only now: after a throw the cache still ends where it did
  return logits;
}

void check_generation(std::int64_t max_tokens, std::int64_t prompt_tokens, const ModelHParams* hp) {
  NUMATTN_CHECK_OPTION(max_tokens >= 1, "max_tokens", "must be at least 1, got {}", max_tokens);
  if (hp == nullptr || prompt_tokens < 0) return;
  NUMATTN_CHECK_OPTION(prompt_tokens >= 1, "prompt", "is empty (it encodes to no token)");
  const std::int64_t n_ctx = hp->n_ctx_train;
  NUMATTN_CHECK_OPTION(prompt_tokens < n_ctx, "prompt",
                       "has {} tokens, but the model's trained context ({}) is {} tokens and "
                       "generation needs room for at least one more",
                       prompt_tokens, hp->key(hparam_key::kContext), n_ctx);
  NUMATTN_CHECK_OPTION(max_tokens <= n_ctx - prompt_tokens, "max_tokens",
                       "{} new tokens after a prompt of {} exceed the model's trained context ({}) "
                       "of {} tokens; at most {} fit",
                       max_tokens, prompt_tokens, hp->key(hparam_key::kContext), n_ctx, n_ctx - prompt_tokens);
}

std::vector<std::int32_t> generate_greedy(const LlamaModel& m, const std::vector<std::int32_t>& prompt,
                                          std::int64_t max_tokens, std::int32_t eos_id,
                                          const ExecContext& ctx,
                                          const std::function<void(std::int32_t)>& on_token,
                                          ForwardProfile* profile, KvType kv) {
  check_generation(max_tokens, static_cast<std::int64_t>(prompt.size()), &m.hparams());
  std::vector<std::int32_t> out;
  KvCache cache = m.make_cache(static_cast<std::int64_t>(prompt.size()) + max_tokens, kv);
  const std::int64_t V = m.hparams().n_vocab;
  ForwardOptions opt;
  opt.logits_begin = static_cast<std::int64_t>(prompt.size()) - 1;
  opt.profile = profile;
  std::vector<float> logits = m.forward(prompt, cache, ctx, opt);
  for (std::int64_t i = 0; i < max_tokens; ++i) {
    const auto best = static_cast<std::int32_t>(
        std::max_element(logits.begin(), logits.begin() + V) - logits.begin());
    out.push_back(best);
    if (on_token) on_token(best);
    if (best == eos_id || i + 1 == max_tokens) break;
    ForwardOptions one;
    one.profile = profile;
    logits = m.forward({best}, cache, ctx, one);
  }
  return out;
}

}  // namespace numattn
