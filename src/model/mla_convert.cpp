#include "numattn/model/mla_convert.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <memory>

#include "numattn/core/blas.h"
#include "numattn/core/error.h"
#include "numattn/core/file_io.h"
#include "numattn/core/memory.h"
#include "numattn/gguf/gguf.h"
#include "numattn/model/bda_model.h"
#include "numattn/model/mla_model.h"
#include "numattn/transform/pipeline.h"

namespace numattn {

namespace {

// Thrown by the capture hook once the wanted layer is seen: the layers after it would only cost.
struct StopAfterLayer {};

/// Σ_t xn_t xn_tᵀ / T of layer `only` (or of every layer when `only` < 0) of `model` (any mix of
/// GQA and MLA layers) over `tokens`, in chunks from an empty cache.
std::vector<transform::MlaCalibration> layer_input_stats(
    const LlamaModel& model, const std::vector<std::int32_t>& tokens, std::int64_t chunk, std::int64_t only,
    const ExecContext& ctx, const std::function<void(std::int64_t, std::int64_t)>& on_chunk) {
  const ModelHParams& hp = model.hparams();
  const auto T = static_cast<std::int64_t>(tokens.size());
  NUMATTN_CHECK(T >= 1, "MLA calibration needs at least one token");
  NUMATTN_CHECK(chunk >= 1, "MLA calibration chunk of {} tokens: must be at least 1", chunk);
  const std::int64_t E = hp.n_embd, L = only < 0 ? hp.n_layer : 1;
  check_memory(static_cast<std::uint64_t>(checked_mul(checked_mul(L, E * E, "calibration size"), 8,
                                                      "calibration size")),
               fmt::format("the MLA calibration statistics ({} layers × {}² float64)", L, E));
  std::vector<transform::MlaCalibration> cal(static_cast<std::size_t>(L));
  for (auto& c : cal) c.xn_cov.assign(static_cast<std::size_t>(E * E), 0.0);
  const std::int64_t n_chunks = (T + chunk - 1) / chunk;
  KvCache cache = model.make_cache(std::min(chunk, T));
  std::vector<double> xd;
  for (std::int64_t c = 0; c < n_chunks; ++c) {
    const std::int64_t b = c * chunk, e = std::min(T, b + chunk), n = e - b;
    cache.clear();
    ForwardOptions fo;
    fo.logits_begin = n;  // no logits: only the layer inputs are wanted
    fo.capture = [&](const QkvCapture& cap) {
      if (only >= 0 && cap.layer != only) return;
      xd.assign(cap.xn, cap.xn + n * E);
      // Σ xn xnᵀ over the chunk's tokens, accumulated in float64: Xᵀ·X with X [n, E].
      blas::dgemm(blas::Trans::kYes, blas::Trans::kNo, E, E, n, 1.0, xd.data(), E, xd.data(), E,
                  1.0, cal[static_cast<std::size_t>(only < 0 ? cap.layer : 0)].xn_cov.data(), E);
      if (only >= 0) throw StopAfterLayer{};
    };
    try {
      model.forward(std::vector<std::int32_t>(tokens.begin() + b, tokens.begin() + e), cache, ctx, fo);
    } catch (const StopAfterLayer&) {
    }
    if (on_chunk) on_chunk(c + 1, n_chunks);
  }
  for (auto& c : cal) {
    for (double& v : c.xn_cov) v /= static_cast<double>(T);
    c.tokens = T;
  }
  return cal;
}

void check_convertible(const LlamaModel& model, const std::vector<transform::MlaCalibration>& calib) {
  const ModelHParams& hp = model.hparams();
  NUMATTN_CHECK(calib.empty() || static_cast<std::int64_t>(calib.size()) == hp.n_layer,
                "MLA conversion: {} calibration entries for {} layers", calib.size(), hp.n_layer);
  NUMATTN_CHECK(hp.attention_extras().empty(),
                "MLA conversion (TransMLA) rebuilds Llama-form keys from a latent; this model's attention has {}, "
                "which that form does not express (a per-head norm of k cannot be applied to a shared latent)",
                hp.attention_extras());
}

/// Layer l of `model` (GQA) converted with `calib`.
std::shared_ptr<const MlaLayer> convert_one(const LlamaModel& model, std::size_t l,
                                            const transform::MlaCalibration& calib,
                                            const transform::MlaOptions& opt, transform::MlaConversionStats& st) {
  const ModelHParams& hp = model.hparams();
  const std::int64_t E = hp.n_embd, D = hp.head_dim, Hq = hp.n_head, Hkv = hp.n_head_kv;
  const LlamaLayer& L = model.weights().layers[l];
  NUMATTN_CHECK(!L.mla && !L.v_bd && L.vo_rank == 0, "MLA conversion of layer {}: the layer is already {}", l,
                L.mla ? "MLA" : L.v_bd ? "BDA" : "factored collaborative VO");
  // Wq|Wk|Wv rows in float64 (dequantized one layer at a time when held in place).
  std::vector<float> f;
  const float* p = L.wqkv.data();
  if (!L.wqkv_q.empty()) {
    f = L.wqkv_q.dequantize();
    p = f.data();
  }
  const std::vector<double> wq(p, p + Hq * D * E), wk(p + Hq * D * E, p + (Hq + Hkv) * D * E),
      wv(p + (Hq + Hkv) * D * E, p + (Hq + 2 * Hkv) * D * E);
  MlaLayerWeights mw;
  try {
    mw = transform::convert_layer_to_mla(hp, wq, wk, wv, calib, opt, &st);
  } catch (const OptionError&) {
    throw;
  } catch (const Error& e) {
    throw Error(fmt::format("MLA conversion of layer {}: {}", l, e.what()));
  }
  NUMATTN_CHECK(mw.n_head == Hq && mw.d_v == D,
                "MLA conversion of layer {}: {} heads of value width {}, the model's W_o needs {} × {}",
                l, mw.n_head, mw.d_v, Hq, D);
  return std::make_shared<const MlaLayer>(MlaLayer::from_weights(mw, E));
}

void install(LlamaModel& model, std::size_t l, std::shared_ptr<const MlaLayer> layer) {
  model.edit_weights([&](LlamaWeights& ew) {
    LlamaLayer& L = ew.layers[l];
    L.mla = std::move(layer);
    L.wqkv.clear();
    L.wqkv.shrink_to_fit();
    L.wqkv_q = {};
  });
}

void finish_report(MlaModelReport& rep, const LlamaModel& model, std::chrono::steady_clock::time_point t0) {
  const MlaLayer& m0 = *model.weights().layers.front().mla;
  rep.rank = m0.rank;
  rep.d_nope = m0.d_nope;
  rep.d_rope = m0.d_rope;
  rep.d_v = m0.d_v;
  rep.kv_bytes_mla = model.kv_bytes_per_token();
  rep.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace

MlaCalibMode parse_mla_calib_mode(const std::string& s) {
  if (s == "two_pass") return MlaCalibMode::kTwoPass;
  if (s == "sequential") return MlaCalibMode::kSequential;
  if (s == "one_pass") return MlaCalibMode::kOnePass;
  throw OptionError("calib_mode", fmt::format("'{}' is not two_pass, sequential or one_pass", s));
}

std::vector<transform::MlaCalibration> calibrate_mla(
    const LlamaModel& model, const std::vector<std::int32_t>& tokens, std::int64_t chunk,
    const ExecContext& ctx, const std::function<void(std::int64_t, std::int64_t)>& on_chunk) {
  NUMATTN_CHECK(!model.has_mla(), "MLA calibration runs the GQA model; this one already has MLA layers");
  return layer_input_stats(model, tokens, chunk, -1, ctx, on_chunk);
}

MlaModelReport convert_model_to_mla(LlamaModel& model,
                                    const std::vector<transform::MlaCalibration>& calib,
                                    const transform::MlaOptions& opt, const ExecContext& ctx,
                                    const std::function<void(std::int64_t, std::int64_t)>& on_layer) {
  (void)ctx;
  const auto t0 = std::chrono::steady_clock::now();
  check_convertible(model, calib);
  const ModelHParams& hp = model.hparams();
  MlaModelReport rep;
  rep.options = opt;
  rep.kv_bytes_gqa = model.kv_bytes_per_token();
  std::vector<std::shared_ptr<const MlaLayer>> done;
  for (std::size_t l = 0; l < model.weights().layers.size(); ++l) {
    transform::MlaConversionStats st;
    done.push_back(convert_one(model, l, calib.empty() ? transform::MlaCalibration{} : calib[l], opt, st));
    rep.layers.push_back(st);
    if (on_layer) on_layer(static_cast<std::int64_t>(l) + 1, hp.n_layer);
  }
  model.edit_weights([&](LlamaWeights& ew) {
    for (std::size_t l = 0; l < ew.layers.size(); ++l) {
      LlamaLayer& L = ew.layers[l];
      L.mla = done[l];
      L.wqkv.clear();
      L.wqkv.shrink_to_fit();
      L.wqkv_q = {};
    }
  });
  finish_report(rep, model, t0);
  return rep;
}

void add_latent_statistics(const LlamaModel& model, std::vector<transform::MlaCalibration>& calib,
                           const std::vector<std::int32_t>& tokens, std::int64_t chunk,
                           const transform::MlaOptions& opt, const ExecContext& ctx) {
  NUMATTN_CHECK(static_cast<std::int64_t>(calib.size()) == model.hparams().n_layer,
                "MLA calibration: {} entries for {} layers", calib.size(), model.hparams().n_layer);
  transform::MlaOptions removal = opt;
  removal.rank = 0;  // RoPE removed, nothing truncated
  LlamaModel removed = model;
  convert_model_to_mla(removed, calib, removal, ctx);
  std::vector<transform::MlaCalibration> second = layer_input_stats(removed, tokens, chunk, -1, ctx, {});
  for (std::size_t l = 0; l < calib.size(); ++l) calib[l].latent_xn_cov = std::move(second[l].xn_cov);
}

MlaModelReport convert_model_to_mla_sequential(LlamaModel& model, const std::vector<std::int32_t>& tokens,
                                               std::int64_t chunk, const transform::MlaOptions& opt,
                                               const ExecContext& ctx,
                                               const std::function<void(std::int64_t, std::int64_t)>& on_layer) {
  const auto t0 = std::chrono::steady_clock::now();
  NUMATTN_CHECK(!model.has_mla(), "MLA conversion runs on a GQA model; this one already has MLA layers");
  check_convertible(model, {});
  const ModelHParams& hp = model.hparams();
  MlaModelReport rep;
  rep.options = opt;
  rep.kv_bytes_gqa = model.kv_bytes_per_token();
  LlamaModel work = model;  // all or nothing: `model` changes only at the end
  for (std::size_t l = 0; l < work.weights().layers.size(); ++l) {
    const std::vector<transform::MlaCalibration> cal =
        layer_input_stats(work, tokens, chunk, static_cast<std::int64_t>(l), ctx, {});
    transform::MlaConversionStats st;
    install(work, l, convert_one(work, l, cal.front(), opt, st));
    rep.layers.push_back(st);
    if (on_layer) on_layer(static_cast<std::int64_t>(l) + 1, hp.n_layer);
  }
  model = std::move(work);
  finish_report(rep, model, t0);
  return rep;
}

void write_mla_gguf(const GgufFile& source, const LlamaModel& m, const transform::MlaOptions& opt,
                    const std::string& path, const std::string& transform) {
  check_outputs_distinct({{"converted model", path}}, {{"source model", source.path()}});
  const ModelHParams& hp = m.hparams();
  const std::int64_t E = hp.n_embd, H = hp.n_head;
  NUMATTN_CHECK(source.architecture() == "llama", "write_mla_gguf: the source {} is '{}', not a llama model",
                source.path(), source.architecture());
  const auto& layers = m.weights().layers;
  NUMATTN_CHECK(!layers.empty() && layers.front().mla, "write_mla_gguf: the model has no MLA layers");
  const MlaLayer& m0 = *layers.front().mla;
  for (std::size_t l = 0; l < layers.size(); ++l) {
    const auto& M = layers[l].mla;
    NUMATTN_CHECK(M && M->rank == m0.rank && M->d_nope == m0.d_nope && M->d_rope == m0.d_rope &&
                      M->d_v == m0.d_v && M->softmax_scale == m0.softmax_scale && !M->uk_bd &&
                      M->uv_bd.empty(),
                  "write_mla_gguf: layer {} is not an MLA layer of layer 0's shape (the file format "
                  "has one set of MLA dimensions)", l);
    NUMATTN_CHECK(M->d_v == hp.head_dim, "write_mla_gguf: value width {} differs from the head dim {}",
                  M->d_v, hp.head_dim);
  }
  // The loader checks the option keys against the layers (model/llama.cpp, read_mla_dims): the
  // layers must be what convert_model_to_mla makes from this model with `opt`.
  const std::int64_t Hkv = hp.n_head_kv, D = hp.head_dim, full = m0.d_nope + Hkv * D;
  std::int64_t rope_dims = 0;
  std::vector<double> theta;
  try {
    rope_dims = transform::mla_rope_dims(hp, opt);
    theta = transform::mla_rope_theta(hp, opt.freqfold, rope_dims);
  } catch (const OptionError& e) {
    throw Error(fmt::format("write_mla_gguf: the options do not fit the model: {}", e.what()));
  }
  NUMATTN_CHECK(opt.rank >= 0 && m0.d_rope == rope_dims && m0.d_nope == Hkv * D - m0.d_rope &&
                    m0.rank == (opt.rank == 0 || opt.rank > full ? full : opt.rank) &&
                    m0.softmax_scale == 1.0 / std::sqrt(static_cast<double>(D)),
                "write_mla_gguf: the MLA layers (r = {}, d_nope = {}, d_rope = {}) are not what the conversion "
                "makes from this model (Hkv = {}, D = {}, n_rot = {}) with rank {}, freqfold {}, rope_dims {}: the "
                "file's keys would disagree with its layers",
                m0.rank, m0.d_nope, m0.d_rope, Hkv, D, hp.n_rot, opt.rank, opt.freqfold, rope_dims);
  for (std::size_t l = 0; l < layers.size(); ++l)
    NUMATTN_CHECK(layers[l].mla->rope_theta == theta,
                  "write_mla_gguf: layer {}'s RoPE frequencies are not those of freqfold {}, rope_dims {}", l,
                  opt.freqfold, rope_dims);
  GgufWriter out(static_cast<std::uint32_t>(source.alignment()));
  const std::string pre = "numattn-mla.";
  for (const auto& [key, value] : source.metadata()) {
    if (key == "general.alignment") continue;
    if (key == "general.architecture") {
      out.set(key, GgufValue::string("numattn-mla"));
    } else if (key.rfind("llama.", 0) == 0) {
      out.set(pre + key.substr(6), value);
    } else {
      out.set(key, value);
    }
  }
  if (!transform.empty()) out.set(transform::kTransformKey, GgufValue::string(transform));
  auto u32 = [](std::int64_t v) { return GgufValue::u32(static_cast<std::uint32_t>(v)); };
  out.set(pre + "mla.version", u32(2));  // the layout above; the loader refuses newer ones
  out.set(pre + "mla.kv_lora_rank", u32(m0.rank));
  out.set(pre + "mla.nope_dim", u32(m0.d_nope));
  out.set(pre + "mla.rope_dim", u32(m0.d_rope));
  out.set(pre + "mla.value_dim", u32(m0.d_v));
  out.set(pre + "mla.softmax_scale", GgufValue::f64(m0.softmax_scale));
  out.set(pre + "mla.freqfold", GgufValue::i32(opt.freqfold));
  out.set(pre + "mla.rope_dims", u32(rope_dims));
  out.set(pre + "mla.rank_option", GgufValue::i64(opt.rank));
  for (std::size_t l = 0; l < layers.size(); ++l)
    out.set(pre + "mla.rope_theta." + std::to_string(l), GgufValue::array(layers[l].mla->rope_theta));
  for (const GgufTensorInfo& t : source.tensors()) {
    if (gguf_block_index(t.name, ".attn_q.weight") >= 0 || gguf_block_index(t.name, ".attn_k.weight") >= 0 ||
        gguf_block_index(t.name, ".attn_v.weight") >= 0)
      continue;
    out.add_tensor(t.name, t.type, t.ne, std::vector<std::uint8_t>(t.data, t.data + t.size_bytes));
  }
  for (std::size_t l = 0; l < layers.size(); ++l) {
    const MlaLayer& M = *layers[l].mla;
    const std::int64_t r = M.rank, dn = M.d_nope, dr = M.d_rope, dv = M.d_v;
    const std::string p = "blk." + std::to_string(l) + ".";
    out.add_tensor_f32(p + "attn_kv_a_mqa.weight", {E, r + dr}, M.w_in.data());
    std::vector<float> q(static_cast<std::size_t>(H * (dn + dr) * E));
    const float* qn = M.w_in.data() + (r + dr) * E;
    const float* qr = qn + H * dn * E;
    for (std::int64_t h = 0; h < H; ++h) {
      std::copy_n(qn + h * dn * E, dn * E, q.begin() + h * (dn + dr) * E);
      std::copy_n(qr + h * dr * E, dr * E, q.begin() + (h * (dn + dr) + dn) * E);
    }
    out.add_tensor_f32(p + "attn_q.weight", {E, H * (dn + dr)}, q.data());
    std::vector<float> kvb(static_cast<std::size_t>(H * (dn + dv) * r));
    for (std::int64_t h = 0; h < H; ++h) {
      std::copy_n(M.w_uk.data() + h * dn * r, dn * r, kvb.begin() + h * (dn + dv) * r);
      std::copy_n(M.w_uv.data() + h * dv * r, dv * r, kvb.begin() + (h * (dn + dv) + dn) * r);
    }
    out.add_tensor_f32(p + "attn_kv_b.weight", {r, H * (dn + dv)}, kvb.data());
  }
  out.write(path);
}

}  // namespace numattn
