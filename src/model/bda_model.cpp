#include "numattn/model/bda_model.h"

#include <algorithm>
#include <cstring>

#include "numattn/core/error.h"
#include "numattn/core/file_io.h"
#include "numattn/gguf/gguf.h"
#include "numattn/model/mla_model.h"
#include "numattn/quant/quant.h"
#include "numattn/transform/pipeline.h"

namespace numattn {

namespace {

// `m` ([out, cols] row-major, or its transpose [cols, out] when `transposed`) encoded as
// `type`, its bytes kept by `owner`; an empty matrix when numattn cannot write the type or a row
// is not whole blocks of it (the caller keeps float32 then).
QuantMatrix requantize(const float* m, std::int64_t out, std::int64_t cols, bool transposed, GgmlType type,
                       LlamaLayer& owner) {
  const GgmlTypeInfo& ti = ggml_type_info(type);
  if (!ti.quantizable || type == GgmlType::F32 || cols <= 0 || cols % ti.block_elems != 0) return {};
  const std::int64_t row_bytes = cols / ti.block_elems * ti.block_bytes;
  auto b = std::make_shared<std::vector<std::uint8_t>>(static_cast<std::size_t>(out * row_bytes));
  std::vector<float> row(static_cast<std::size_t>(cols));
  for (std::int64_t o = 0; o < out; ++o) {
    for (std::int64_t k = 0; k < cols; ++k)
      row[static_cast<std::size_t>(k)] = transposed ? m[k * out + o] : m[o * cols + k];
    quantize_row(type, row.data(), b->data() + o * row_bytes, cols);
  }
  QuantMatrix q;
  q.cols = cols;
  q.parts.push_back({type, b->data(), out, row_bytes});
  owner.owned_bytes.push_back(std::move(b));
  return q;
}

// Adds `t` to the report's list of coefficient types ("Q4_1", "Q4_1+F32").
void add_type(std::string& list, const std::string& t) {
  if (list.empty()) {
    list = t;
  } else if (("+" + list + "+").find("+" + t + "+") == std::string::npos) {
    list += "+" + t;
  }
}

}  // namespace

BdaCoefStorage parse_bda_coef(const std::string& name) {
  if (name == "q8_0") return BdaCoefStorage::kQ8_0;
  if (name == "source") return BdaCoefStorage::kSource;
  if (name == "f32") return BdaCoefStorage::kF32;
  throw Error(fmt::format("unknown BDA coefficient storage '{}': use q8_0, source or f32", name));
}

ModelBdaReport apply_bda(LlamaModel& model, const std::string& pairs,
                         const transform::BdaOptions& options, BdaCoefStorage coef) {
  transform::BdaOptions opt = options;
  opt.pairs = transform::parse_bda_pairs(pairs);
  const ModelHParams& hp = model.hparams();
  const std::int64_t E = hp.n_embd, D = hp.head_dim, Hq = hp.n_head, Hkv = hp.n_head_kv;
  ModelBdaReport rep;
  rep.pairs = transform::to_string(opt.pairs);
  if (opt.pairs == transform::BdaPairs::kNone) return rep;
  NUMATTN_CHECK(!transform::has_qk(opt.pairs) || !hp.qk_norm,
                "BDA '{}': the QK pair needs scores bilinear in Wq and Wk, but this model normalises q and k per "
                "head after their projections (RMSNorm), so no basis change of Wq, Wk keeps them; the VO pair "
                "(--bda vo) applies", rep.pairs);
  const LlamaWeights& w = model.weights();
  for (const LlamaLayer& L : w.layers)
    NUMATTN_CHECK(!L.v_bd && !(L.mla && (L.mla->uk_bd || !L.mla->uv_bd.empty())),
                  "the model already has BDA applied");
  for (const LlamaLayer& L : w.layers)
    NUMATTN_CHECK(L.vo_rank == 0, "BDA needs Wq|Wk|Wv: this model has factored collaborative VO layers");
  if (model.has_mla()) return apply_bda_mla(model, opt, rep);
  // Transform every layer first, then commit: a refusal leaves the model untouched.
  std::vector<transform::BdaLayer> done;
  done.reserve(w.layers.size());
  for (std::size_t l = 0; l < w.layers.size(); ++l) {
    const LlamaLayer& L = w.layers[l];
    // Weights held in place are dequantized for the transform only (one layer at a time); what
    // it writes (W_o', the BD value projection) is float32, the rest stays in place.
    std::vector<float> qkv_f, wo_f;
    if (!L.wqkv_q.empty()) qkv_f = L.wqkv_q.dequantize();
    if (!L.wo_q.empty()) wo_f = L.wo_q.dequantize();
    transform::AttentionLayerWeights aw;
    aw.d_model = E;
    aw.heads = Hq;
    aw.kv_heads = Hkv;
    aw.head_dim = D;
    aw.rope_dims = hp.n_rot;
    aw.layout = transform::WeightLayout::kOutIn;
    const float* p = L.wqkv_q.empty() ? L.wqkv.data() : qkv_f.data();
    aw.wq = {p, static_cast<std::size_t>(Hq * D * E)};
    aw.wk = {p + Hq * D * E, static_cast<std::size_t>(Hkv * D * E)};
    aw.wv = {p + (Hq + Hkv) * D * E, static_cast<std::size_t>(Hkv * D * E)};
    aw.wo = L.wo_q.empty() ? std::span<const float>(L.wo) : std::span<const float>(wo_f);
    try {
      done.push_back(transform::bda_transform(aw, opt));
    } catch (const Error& e) {
      throw Error(fmt::format("BDA '{}' on layer {}: {}", rep.pairs, l, e.what()));
    }
  }
  model.edit_weights([&](LlamaWeights& ew) {
    for (std::size_t l = 0; l < w.layers.size(); ++l) {
      LlamaLayer& L = ew.layers[l];
      transform::BdaLayer& b = done[l];
      const QuantMatrix wo_src = L.wo_q;
      L.wo = std::move(b.wo);
      L.wo_q = {};
      // V rows now live in v_bd.
      if (L.wqkv_q.empty()) L.wqkv.resize(static_cast<std::size_t>((Hq + Hkv) * D * E));
      // In place: the source value and output tensors' types (V is the last part of Wq|Wk|Wv).
      const bool in_place = !L.wqkv_q.empty();
      const GgmlType vtype = in_place ? L.wqkv_q.parts.back().type : GgmlType::F32;
      const GgmlType otype = wo_src.empty() ? GgmlType::F32 : wo_src.parts.front().type;
      if (in_place) L.wqkv_q = L.wqkv_q.first_rows((Hq + Hkv) * D);
      L.v_bd = std::make_shared<const transform::BdProjection>(std::move(b.v_proj));
      L.v_bd_q = {};
      L.owned_bytes.clear();
      if (in_place && coef != BdaCoefStorage::kF32) {
        const transform::BdProjection& p = *L.v_bd;
        const bool q8 = coef == BdaCoefStorage::kQ8_0;
        L.v_bd_q = requantize(p.rest().data(), p.out_dim(), p.d_in() - p.rank(), true, q8 ? GgmlType::Q8_0 : vtype, L);
        if (otype != GgmlType::F32) L.wo_q = requantize(L.wo.data(), E, Hq * D, false, q8 ? GgmlType::Q8_0 : otype, L);
        if (!L.wo_q.empty()) L.wo.clear(), L.wo.shrink_to_fit();
      }
      add_type(rep.coef_type, L.v_bd_q.empty() ? "F32" : L.v_bd_q.type_string());
      add_type(rep.coef_type, L.wo_q.empty() ? "F32" : L.wo_q.type_string());
      ModelBdaLayerReport lr;
      lr.layer = static_cast<int>(l);
      lr.kappa_max = b.vo.kappa_max;
      lr.fallback_heads = static_cast<int>(b.vo.fallback_heads);
      lr.params_before = b.params_before;
      lr.params_after = b.params_after;
      rep.params_before += lr.params_before;
      rep.params_after += lr.params_after;
      rep.kappa_max = std::max(rep.kappa_max, lr.kappa_max);
      rep.fallback_heads += lr.fallback_heads;
      rep.layers.push_back(lr);
    }
  });
  return rep;
}

namespace {

// Adds one pair's per-head outcome to a layer's report.
void add_pair(ModelBdaLayerReport& lr, const transform::BdaPairReport& pr) {
  lr.kappa_max = std::max(lr.kappa_max, pr.kappa_max);
  lr.fallback_heads += static_cast<int>(pr.fallback_heads);
}

// One BD pair of an MLA layer with the latent (r channels) as the K or V side's input: `heads`
// heads of width dh, each its own KV head, no RoPE, [out, in] weights.
transform::AttentionLayerWeights latent_pair(std::int64_t E, std::int64_t r, std::int64_t heads, std::int64_t dh) {
  transform::AttentionLayerWeights aw;
  aw.d_model = E;
  aw.d_kv = r;
  aw.heads = heads;
  aw.kv_heads = heads;
  aw.head_dim = dh;
  aw.rope_dims = 0;
  aw.layout = transform::WeightLayout::kOutIn;
  return aw;
}

// bda_transform with the layer and head named in its error.
transform::BdaLayer bda_or_explain(const transform::AttentionLayerWeights& aw,
                                   const transform::BdaOptions& opt, const std::string& what) {
  try {
    return transform::bda_transform(aw, opt);
  } catch (const Error& e) {
    throw Error(fmt::format("{}: {}", what, e.what()));
  }
}

// `dst` [out, r] row-major (the [out, in] layout of W_uk and W_uv) = the dense form of `p`,
// whose effective weight is [r, out].
void store_effective(const transform::BdProjection& p, float* dst) {
  const std::vector<float> eff = p.effective_weight();
  const std::int64_t r = p.d_in(), out = p.out_dim();
  for (std::int64_t o = 0; o < out; ++o)
    for (std::int64_t c = 0; c < r; ++c) dst[o * r + c] = eff[static_cast<std::size_t>(c * out + o)];
}

// QK pair of the NoPE part of MLA layer M into N: Q = W_q_nope (E → H·dn), K = W_uk (latent
// r → H·dn), one KV head per query head; no RoPE on this part. W_v/W_o are not rewritten
// (zeros of the right shape). Returns the MACs per token the BD form of W_uk saves.
std::int64_t mla_bda_qk(const MlaLayer& M, MlaLayer& N, std::int64_t E, transform::BdaOptions opt,
                        const std::string& what, ModelBdaLayerReport& lr) {
  const std::int64_t H = M.n_head, r = M.rank, dn = M.d_nope, dr = M.d_rope;
  NUMATTN_CHECK(dn >= 1 && dn <= r,
                "{}: the NoPE width d_nope = {} must be between 1 and the latent rank r = {} (a "
                "basis of d_nope latent channels)", what, dn, r);
  opt.pairs = transform::BdaPairs::kQK;
  transform::AttentionLayerWeights aw = latent_pair(E, r, H, dn);
  const float* qn = M.w_in.data() + (r + dr) * E;
  const std::vector<float> zv(static_cast<std::size_t>(H * dn * r), 0.f), zo(static_cast<std::size_t>(E * H * dn), 0.f);
  aw.wq = {qn, static_cast<std::size_t>(H * dn * E)};
  aw.wk = M.w_uk;
  aw.wv = zv;
  aw.wo = zo;
  transform::BdaLayer b = bda_or_explain(aw, opt, what);
  std::copy(b.wq.begin(), b.wq.end(), N.w_in.begin() + (r + dr) * E);
  store_effective(b.k_proj, N.w_uk.data());  // W_uk'[h] = [I on S | C_hᵀ on S^c]
  N.uk_bd_rest = b.k_proj.parts().rest;
  N.uk_bd = std::make_shared<const transform::BdProjection>(std::move(b.k_proj));
  lr.params_before += H * dn * E + H * dn * r;
  lr.params_after += H * dn * E + N.uk_bd->weight_params();
  add_pair(lr, b.qk);
  return H * dn * r - N.uk_bd->macs_per_token();
}

// VO pair of MLA layer M into N and `wo` ([E, H·dv] float32, rewritten in place): per head h,
// bda_transform of the one-head pair (V = W_uv[h]: latent r → dv, O = W_o,h: dv → E), so each
// head gets its own κ-aware basis S_h (the cache, c, is untouched). Returns the MACs per token
// the BD form of W_uv saves.
std::int64_t mla_bda_vo(const MlaLayer& M, MlaLayer& N, std::vector<float>& wo, std::int64_t E,
                        transform::BdaOptions opt, const std::string& what, ModelBdaLayerReport& lr) {
  const std::int64_t H = M.n_head, r = M.rank, dv = M.d_v;
  NUMATTN_CHECK(dv <= r,
                "{}: the value width d_v = {} exceeds the latent rank r = {}: W_uv[h] has no basis "
                "of d_v latent channels (the VO pair needs d_v <= r)", what, dv, r);
  opt.pairs = transform::BdaPairs::kVO;
  const std::vector<float> zq(static_cast<std::size_t>(dv * E), 0.f), zk(static_cast<std::size_t>(dv * r), 0.f);
  std::vector<float> woh(static_cast<std::size_t>(E * dv));
  std::int64_t saved = 0;
  N.uv_bd.clear();
  N.uv_bd.reserve(static_cast<std::size_t>(H));
  for (std::int64_t h = 0; h < H; ++h) {
    for (std::int64_t e = 0; e < E; ++e)
      std::copy_n(wo.data() + e * H * dv + h * dv, dv, woh.data() + e * dv);
    transform::AttentionLayerWeights aw = latent_pair(E, r, 1, dv);
    aw.wq = zq;
    aw.wk = zk;
    aw.wv = {M.w_uv.data() + h * dv * r, static_cast<std::size_t>(dv * r)};
    aw.wo = woh;
    transform::BdaLayer b = bda_or_explain(aw, opt, fmt::format("{}, head {}", what, h));
    for (std::int64_t e = 0; e < E; ++e)
      std::copy_n(b.wo.data() + e * dv, dv, wo.data() + e * H * dv + h * dv);
    store_effective(b.v_proj, N.w_uv.data() + h * dv * r);  // W_uv'[h] = [I on S_h | C_h on S_h^c]
    add_pair(lr, b.vo);
    saved += dv * r - b.v_proj.macs_per_token();
    lr.params_before += dv * r;
    lr.params_after += b.v_proj.weight_params();
    N.uv_bd.push_back(std::move(b.v_proj));
  }
  // W_o keeps its size: counted on both sides, as for the GQA layers' VO pair.
  lr.params_before += E * H * dv;
  lr.params_after += E * H * dv;
  return saved;
}

}  // namespace

ModelBdaReport apply_bda_mla(LlamaModel& model, const transform::BdaOptions& opt, ModelBdaReport rep) {
  const ModelHParams& hp = model.hparams();
  const std::int64_t E = hp.n_embd;
  const LlamaWeights& w = model.weights();
  // Transform every layer first, then commit: a refusal leaves the model untouched.
  std::vector<std::shared_ptr<const MlaLayer>> done;
  std::vector<std::vector<float>> new_wo(w.layers.size());
  for (std::size_t l = 0; l < w.layers.size(); ++l) {
    const LlamaLayer& Ly = w.layers[l];
    NUMATTN_CHECK(Ly.mla, "BDA on an MLA model: layer {} is not an MLA layer (mixed models are not "
                          "supported)", l);
    const MlaLayer& M = *Ly.mla;
    const std::string what = fmt::format("BDA '{}' on MLA layer {}", rep.pairs, l);
    MlaLayer N = M;
    ModelBdaLayerReport lr;
    lr.layer = static_cast<int>(l);
    if (transform::has_qk(opt.pairs)) rep.macs_saved_per_token += mla_bda_qk(M, N, E, opt, what, lr);
    if (transform::has_vo(opt.pairs)) {
      // W_o in float32 (dequantized when held in place); the rewritten W_o' replaces it.
      std::vector<float>& wo = new_wo[l];
      wo = Ly.wo_q.empty() ? Ly.wo : Ly.wo_q.dequantize();
      rep.macs_saved_per_token += mla_bda_vo(M, N, wo, E, opt, what, lr);
    }
    rep.up_macs_before += M.n_head * (M.d_nope + M.d_v) * M.rank;
    rep.params_before += lr.params_before;
    rep.params_after += lr.params_after;
    rep.kappa_max = std::max(rep.kappa_max, lr.kappa_max);
    rep.fallback_heads += lr.fallback_heads;
    rep.layers.push_back(lr);
    done.push_back(std::make_shared<const MlaLayer>(std::move(N)));
  }
  model.edit_weights([&](LlamaWeights& ew) {
    for (std::size_t l = 0; l < ew.layers.size(); ++l) {
      ew.layers[l].mla = done[l];
      if (transform::has_vo(opt.pairs)) {
        ew.layers[l].wo = std::move(new_wo[l]);
        ew.layers[l].wo_q = {};
      }
    }
  });
  return rep;
}

std::int64_t gguf_block_index(const std::string& name, const std::string& suffix) {
  if (name.rfind("blk.", 0) != 0 || name.size() <= suffix.size() + 4 ||
      name.compare(name.size() - suffix.size(), suffix.size(), suffix) != 0)
    return -1;
  const std::string mid = name.substr(4, name.size() - 4 - suffix.size());
  if (mid.find_first_not_of("0123456789") != std::string::npos || mid.size() > 18) return -1;
  return std::stoll(mid);
}

namespace {
std::vector<std::uint8_t> f32_bytes(const std::vector<float>& v) {
  std::vector<std::uint8_t> b(v.size() * sizeof(float));
  if (!v.empty()) std::memcpy(b.data(), v.data(), b.size());
  return b;
}
std::vector<std::int32_t> to_i32(const std::vector<index_t>& v) {
  return std::vector<std::int32_t>(v.begin(), v.end());
}
}  // namespace

void write_bda_gguf(const GgufFile& source, const LlamaModel& m, const std::string& path,
                    const std::string& transform) {
  check_outputs_distinct({{"converted model", path}}, {{"source model", source.path()}});
  NUMATTN_CHECK(source.architecture() == "llama",
                "write_bda_gguf: the source {} is '{}'; the BDA file layout stores llama models only (apply BDA "
                "to this model at load: --bda)", source.path(), source.architecture());
  NUMATTN_CHECK(!m.has_mla(), "write_bda_gguf: the model has MLA layers, whose BD forms this "
                              "file layout does not store (apply BDA to an MLA model at load)");
  const ModelHParams& hp = m.hparams();
  const std::int64_t E = hp.n_embd, D = hp.head_dim, Hq = hp.n_head;
  GgufWriter out(static_cast<std::uint32_t>(source.alignment()));
  for (const auto& [key, value] : source.metadata())
    if (key != "general.alignment") out.set(key, value);
  if (!transform.empty()) out.set(transform::kTransformKey, GgufValue::string(transform));
  out.set("numattn.bda.pairs", GgufValue::string("vo"));
  out.set("numattn.bda.version", GgufValue::u32(1));
  std::vector<char> bda(static_cast<std::size_t>(hp.n_layer), 0);
  for (std::int64_t l = 0; l < hp.n_layer; ++l)
    bda[static_cast<std::size_t>(l)] = m.weights().layers[static_cast<std::size_t>(l)].v_bd != nullptr;
  for (const GgufTensorInfo& t : source.tensors()) {
    const std::int64_t lv = gguf_block_index(t.name, ".attn_v.weight");
    if (lv >= 0 && lv < hp.n_layer && bda[static_cast<std::size_t>(lv)]) continue;
    const std::int64_t lo = gguf_block_index(t.name, ".attn_output.weight");
    if (lo >= 0 && lo < hp.n_layer && bda[static_cast<std::size_t>(lo)]) {
      out.add_tensor_f32(t.name, {Hq * D, E}, m.weights().layers[static_cast<std::size_t>(lo)].wo.data());
      continue;
    }
    out.add_tensor(t.name, t.type, t.ne,
                   std::vector<std::uint8_t>(t.data, t.data + t.size_bytes));
  }
  for (std::int64_t l = 0; l < hp.n_layer; ++l) {
    const auto& L = m.weights().layers[static_cast<std::size_t>(l)];
    if (!L.v_bd) continue;
    const transform::BdProjection::Parts p = L.v_bd->parts();
    NUMATTN_CHECK(p.rank > 0 && p.bias.empty(), "layer {}: unexpected BD projection form", l);
    const std::string pre = "blk." + std::to_string(l) + ".attn_v_bd.";
    out.set(pre + "perm", GgufValue::array(to_i32(p.perm)));
    out.set(pre + "dense", GgufValue::array(to_i32(p.dense_heads)));
    out.add_tensor(pre + "coef", GgmlType::F32, {p.heads * p.head_dim, p.d_in - p.rank}, f32_bytes(p.rest));
    if (!p.top.empty())
      out.add_tensor(pre + "top", GgmlType::F32,
                     {static_cast<std::int64_t>(p.dense_heads.size()) * p.head_dim, p.rank},
                     f32_bytes(p.top));
  }
  out.write(path);
}

}  // namespace numattn
