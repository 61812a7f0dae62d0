#include "numattn/model/bda_model.h"

#include <cstring>

#include "numattn/core/error.h"
#include "numattn/core/file_io.h"
#include "numattn/model/gguf.h"
#include "numattn/model/mla_model.h"

namespace numattn {

ModelBdaReport apply_bda(LlamaModel& model, const std::string& pairs,
                         const transform::BdaOptions& options) {
  transform::BdaOptions opt = options;
  opt.pairs = transform::parse_bda_pairs(pairs);
  const LlamaHParams& hp = model.hparams();
  const std::int64_t E = hp.n_embd, D = hp.head_dim, Hq = hp.n_head, Hkv = hp.n_head_kv;
  ModelBdaReport rep;
  rep.pairs = transform::to_string(opt.pairs);
  if (opt.pairs == transform::BdaPairs::kNone) return rep;
  LlamaWeights& w = model.mutable_weights();
  for (const LlamaLayer& L : w.layers)
    NUMATTN_CHECK(!L.v_bd && !(L.mla && L.mla->uk_bd), "the model already has BDA applied");
  if (model.has_mla()) return apply_bda_mla(model, opt, rep);
  // Transform every layer first, then commit: a refusal leaves the model untouched.
  std::vector<transform::BdaLayer> done;
  done.reserve(w.layers.size());
  for (std::size_t l = 0; l < w.layers.size(); ++l) {
    const LlamaLayer& L = w.layers[l];
    // Weights held in place are dequantized for the transform only (one layer at a time); what
    // it writes (W_o', the BD value projection) is float32, the rest stays in place.
    std::vector<float> qkv_f, wo_f;
    if (!L.wqkv_q.empty()) {
      qkv_f.resize(static_cast<std::size_t>(L.wqkv_q.rows() * E));
      L.wqkv_q.dequantize_rows(0, L.wqkv_q.rows(), qkv_f.data());
    }
    if (!L.wo_q.empty()) {
      wo_f.resize(static_cast<std::size_t>(L.wo_q.rows() * L.wo_q.cols));
      L.wo_q.dequantize_rows(0, L.wo_q.rows(), wo_f.data());
    }
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
  for (std::size_t l = 0; l < w.layers.size(); ++l) {
    LlamaLayer& L = w.layers[l];
    transform::BdaLayer& b = done[l];
    L.wo = std::move(b.wo);
    L.wo_q = {};
    // V rows now live in v_bd.
    if (L.wqkv_q.empty()) {
      L.wqkv.resize(static_cast<std::size_t>((Hq + Hkv) * D * E));
    } else {
      L.wqkv_q = L.wqkv_q.first_rows((Hq + Hkv) * D);
    }
    L.v_bd = std::make_shared<const transform::BdProjection>(std::move(b.v_proj));
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
  return rep;
}

ModelBdaReport apply_bda_mla(LlamaModel& model, const transform::BdaOptions& opt, ModelBdaReport rep) {
  const LlamaHParams& hp = model.hparams();
  const std::int64_t E = hp.n_embd;
  NUMATTN_CHECK(!transform::has_vo(opt.pairs),
                "BDA '{}' on an MLA model: the VO pair (W_uv[h] with its W_o block) is not "
                "implemented for MLA layers; use --bda qk (the NoPE QK pair)", rep.pairs);
  LlamaWeights& w = model.mutable_weights();
  std::vector<std::shared_ptr<const MlaLayer>> done;
  for (std::size_t l = 0; l < w.layers.size(); ++l) {
    const LlamaLayer& Ly = w.layers[l];
    NUMATTN_CHECK(Ly.mla, "BDA on an MLA model: layer {} is not an MLA layer (mixed models are not "
                          "supported)", l);
    const MlaLayer& M = *Ly.mla;
    const std::int64_t H = M.n_head, r = M.rank, dn = M.d_nope, dr = M.d_rope;
    NUMATTN_CHECK(dn >= 1 && dn <= r,
                  "BDA qk on MLA layer {}: the NoPE width d_nope = {} must be between 1 and the "
                  "latent rank r = {} (a basis of d_nope latent channels)", l, dn, r);
    // QK pair of the NoPE part: Q = W_q_nope (E → H·dn), K = W_uk (latent r → H·dn), one KV head
    // per query head; no RoPE on this part. W_v/W_o are not rewritten (zeros of the right shape).
    transform::AttentionLayerWeights aw;
    aw.d_model = E;
    aw.d_kv = r;
    aw.heads = H;
    aw.kv_heads = H;
    aw.head_dim = dn;
    aw.rope_dims = 0;
    aw.layout = transform::WeightLayout::kOutIn;
    const float* qn = M.w_in.data() + (r + dr) * E;
    const std::vector<float> zv(static_cast<std::size_t>(H * dn * r), 0.f), zo(static_cast<std::size_t>(E * H * dn), 0.f);
    aw.wq = {qn, static_cast<std::size_t>(H * dn * E)};
    aw.wk = M.w_uk;
    aw.wv = zv;
    aw.wo = zo;
    transform::BdaLayer b;
    try {
      b = transform::bda_transform(aw, opt);
    } catch (const Error& e) {
      throw Error(fmt::format("BDA '{}' on MLA layer {}: {}", rep.pairs, l, e.what()));
    }
    MlaLayer N = M;
    std::copy(b.wq.begin(), b.wq.end(), N.w_in.begin() + (r + dr) * E);
    // W_uk'[h] (dense form, [H·dn, r]) from the projection's effective [r, H·dn] weight.
    const std::vector<float> eff = b.k_proj.effective_weight();
    for (std::int64_t o = 0; o < H * dn; ++o)
      for (std::int64_t c = 0; c < r; ++c)
        N.w_uk[static_cast<std::size_t>(o * r + c)] = eff[static_cast<std::size_t>(c * H * dn + o)];
    N.uk_bd_rest = b.k_proj.parts().rest;
    N.uk_bd = std::make_shared<const transform::BdProjection>(std::move(b.k_proj));
    ModelBdaLayerReport lr;
    lr.layer = static_cast<int>(l);
    lr.kappa_max = b.qk.kappa_max;
    lr.fallback_heads = static_cast<int>(b.qk.fallback_heads);
    lr.params_before = H * dn * E + H * dn * r;
    lr.params_after = H * dn * E + N.uk_bd->weight_params();
    rep.params_before += lr.params_before;
    rep.params_after += lr.params_after;
    rep.kappa_max = std::max(rep.kappa_max, lr.kappa_max);
    rep.fallback_heads += lr.fallback_heads;
    rep.macs_saved_per_token += H * dn * r - N.uk_bd->macs_per_token();
    rep.layers.push_back(lr);
    done.push_back(std::make_shared<const MlaLayer>(std::move(N)));
  }
  for (std::size_t l = 0; l < w.layers.size(); ++l) w.layers[l].mla = done[l];
  return rep;
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

void write_bda_gguf(const GgufFile& source, const LlamaModel& m, const std::string& path) {
  check_outputs_distinct({{"converted model", path}}, {{"source model", source.path()}});
  const LlamaHParams& hp = m.hparams();
  const std::int64_t E = hp.n_embd, D = hp.head_dim, Hq = hp.n_head;
  GgufWriter out(static_cast<std::uint32_t>(source.alignment()));
  for (const auto& [key, value] : source.metadata())
    if (key != "general.alignment") out.set(key, value);
  out.set("numattn.bda.pairs", GgufValue::string("vo"));
  out.set("numattn.bda.version", GgufValue::u32(1));
  std::vector<char> bda(static_cast<std::size_t>(hp.n_layer), 0);
  for (std::int64_t l = 0; l < hp.n_layer; ++l)
    bda[static_cast<std::size_t>(l)] = m.weights().layers[static_cast<std::size_t>(l)].v_bd != nullptr;
  auto layer_of = [](const std::string& name, const std::string& suffix) -> std::int64_t {
    if (name.rfind("blk.", 0) != 0 || name.size() <= suffix.size() ||
        name.compare(name.size() - suffix.size(), suffix.size(), suffix) != 0)
      return -1;
    const std::string mid = name.substr(4, name.size() - 4 - suffix.size());
    if (mid.empty() || mid.find_first_not_of("0123456789") != std::string::npos) return -1;
    return std::stoll(mid);
  };
  for (const GgufTensorInfo& t : source.tensors()) {
    const std::int64_t lv = layer_of(t.name, ".attn_v.weight");
    if (lv >= 0 && lv < hp.n_layer && bda[static_cast<std::size_t>(lv)]) continue;
    const std::int64_t lo = layer_of(t.name, ".attn_output.weight");
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
