#include "numattn/transform/pipeline.h"

#include <algorithm>

#include <fmt/format.h>

#include "numattn/attention/registry.h"
#include "numattn/attention/spec_syntax.h"
#include "numattn/core/error.h"

namespace numattn::transform {

namespace {

// A parameter whose default is empty must be given (a rank has no sensible default).
ParamSpec number_param(ParamType type, std::string name, std::string def, double lo, double hi, std::string doc) {
  ParamSpec p;
  p.name = std::move(name);
  p.type = type;
  p.default_value = std::move(def);
  p.min = lo;
  p.max = hi;
  p.doc = std::move(doc);
  return p;
}

ParamSpec int_param(std::string name, std::string def, double lo, double hi, std::string doc) {
  return number_param(ParamType::kInt, std::move(name), std::move(def), lo, hi, std::move(doc));
}

ParamSpec float_param(std::string name, std::string def, double lo, double hi, std::string doc) {
  return number_param(ParamType::kFloat, std::move(name), std::move(def), lo, hi, std::move(doc));
}

ParamSpec choice_param(std::string name, std::string def, std::vector<std::string> choices, std::string doc) {
  ParamSpec p;
  p.name = std::move(name);
  p.type = ParamType::kString;
  p.default_value = std::move(def);
  p.choices = std::move(choices);
  p.doc = std::move(doc);
  return p;
}

constexpr double kMaxRank = 65536;
constexpr double kMaxSeed = 9007199254740992.0;  // 2^53: every integer below is a double

MethodInfo info(std::string name, std::string family, std::string summary, std::string citation,
                std::string cost, std::vector<ParamSpec> params) {
  MethodInfo m;
  m.name = std::move(name);
  m.family = std::move(family);
  m.summary = std::move(summary);
  m.citation = std::move(citation);
  m.time_complexity = std::move(cost);
  m.params = std::move(params);
  return m;
}

MethodInfo tensor_info(TensorScheme s) {
  const bool cp = s == TensorScheme::kVoCp || s == TensorScheme::kQkCp;
  std::vector<ParamSpec> ps;
  if (cp) {
    ps.push_back(int_param("rank", "", 0, kMaxRank,
                           "CP rank R shared by the heads; 0 = the exact block form R = H·D"));
  } else {
    const bool heads = s == TensorScheme::kTuckerHeads;
    ps.push_back(int_param("rank", "", 1, kMaxRank,
                           heads ? "R_E, the rank of the model-width mode (clamped to E)"
                                 : "R1, the rank of the rows (clamped per weight kind to its rows)"));
    ps.push_back(int_param("rank2", "0", 0, kMaxRank,
                           heads ? "R_D, the rank of the head-width mode (clamped to D); 0 = rank"
                                 : "R2, the rank of the columns (clamped to its columns); 0 = rank"));
    if (heads)
      ps.push_back(int_param("heads", "0", 0, kMaxRank,
                             "head-mode rank; 0 (or >= the head count) = one core per head"));
    else
      ps.push_back(int_param("layers", "0", 0, kMaxRank,
                             "stack rank over the layers; 0 = all layers (shared factors)"));
  }
  ps.push_back(int_param("iters", cp ? "25" : "10", 1, 100000, cp ? "CP-ALS sweeps" : "HOOI sweeps"));
  if (cp)
    ps.push_back(int_param("seed", "1", 0, kMaxSeed,
                           "seed of the random columns that pad the HOSVD start when needed"));
  if (s == TensorScheme::kVoCp)
    ps.push_back(choice_param("exec", "embedded", {"embedded", "factored"},
                              "embedded: exact embedding at head dim max(D, R); factored: shared "
                              "R-wide value rows (model/tensor_model.h)"));
  switch (s) {
    case TensorScheme::kVoCp:
      return info("tensor.vo_cp", "tensor",
                  "collaborative VO heads: CP of every head's W_O,h·W_V,g(h), one shared value projection",
                  "Cordonnier, Loukas, Jaggi, \"Multi-Head Attention: Collaborate Instead of "
                  "Concatenate\", arXiv 2006.16362, 2020",
                  "CP-ALS per layer O(H·k_n·k_m·R) per sweep", std::move(ps));
    case TensorScheme::kQkCp:
      return info("tensor.qk_cp", "tensor",
                  "collaborative QK heads (position-free dimensions only: the NoPE part of an MLA model)",
                  "Cordonnier, Loukas, Jaggi, \"Multi-Head Attention: Collaborate Instead of "
                  "Concatenate\", arXiv 2006.16362, 2020",
                  "CP-ALS per layer O(H·k_n·k_m·R) per sweep", std::move(ps));
    case TensorScheme::kTuckerQkvo:
      return info("tensor.tucker_qkvo", "tensor",
                  "W_q, W_k, W_v, W_o each stacked over the layers, Tucker / shared factors",
                  "Ren et al., \"Exploring Extreme Parameter Compression for Pre-trained Language "
                  "Models\", ICLR 2022",
                  "HOSVD then HOOI O(size·(R1 + R2)) per sweep", std::move(ps));
    case TensorScheme::kTuckerFfn:
      return info("tensor.tucker_ffn", "tensor",
                  "W_gate, W_up, W_down each stacked over the layers, Tucker / shared factors",
                  "Ren et al., \"Exploring Extreme Parameter Compression for Pre-trained Language "
                  "Models\", ICLR 2022",
                  "HOSVD then HOOI O(size·(R1 + R2)) per sweep", std::move(ps));
    case TensorScheme::kTuckerHeads:
      return info("tensor.tucker_heads", "tensor",
                  "per layer, W_q, W_k, W_v, W_o each as a heads × E × D tensor, Tucker",
                  "Luo et al., TRAWL, 2024; Ren et al., \"Exploring Extreme Parameter Compression "
                  "for Pre-trained Language Models\", ICLR 2022",
                  "HOSVD then HOOI per layer and weight kind", std::move(ps));
  }
  NUMATTN_ASSERT(false);
  return {};
}

constexpr TensorScheme kSchemes[] = {TensorScheme::kVoCp, TensorScheme::kQkCp, TensorScheme::kTuckerQkvo,
                                     TensorScheme::kTuckerFfn, TensorScheme::kTuckerHeads};

const std::vector<MethodInfo>& catalogue() {
  static const std::vector<MethodInfo> all = [] {
    std::vector<MethodInfo> v;
    v.push_back(info(
        "mla", "mla",
        "GQA → multi-head latent attention at load: RoRoPE, FreqFold, RoPE removal, balanced joint "
        "PCA of the NoPE keys and values, calibrated on a text",
        "Meng, Tang, Tang, Yao, Sun, Zhang, \"TransMLA: Multi-Head Latent Attention Is All You "
        "Need\", arXiv 2502.07864, NeurIPS 2025",
        "O(Hkv·D·E²) + O((Hkv·D)³) per layer, after a calibration forward pass",
        {int_param("rank", "-1", -1, kMaxRank,
                   "latent rank r of the NoPE keys and values; 0 = the full width (exact when "
                   "every RoPE dim is kept); -1 = chosen by budget (give rank or budget)"),
         int_param("rope_heads", "1", 1, 4096,
                   "KV heads' worth of RoPE dims kept in the shared RoPE key: rope_dims = rope_heads·n_rot"),
         int_param("rope_dims", "0", 0, 1 << 20,
                   "RoPE dims kept in the shared RoPE key, any even number up to Hkv·n_rot (0 = from "
                   "rope_heads)"),
         int_param("freqfold", "1", 1, 4096, "adjacent RoPE frequencies folded into one (must divide n_rot/2)"),
         float_param("balance", "0", 0, 1000,
                     "multiplier b of the key/value balance α = b·α₀ in the latent's PCA (α₀ = ratio of the "
                     "RMS entries of the NoPE keys and the values; b > 1 favours the values); 0 = chosen "
                     "by perplexity on the calibration tokens among 1, √2, 2, 2√2 (when rank truncates)"),
         float_param("budget", "0", 0, 1,
                     "KV cache per token and layer as a fraction of GQA's 2·Hkv·D, in (0, 1]: rank, "
                     "rope_dims and freqfold are chosen by perplexity on the calibration tokens "
                     "(model/transform_model.h); 0 = off"),
         [] {
           ParamSpec p;
           p.name = "calib";
           p.type = ParamType::kString;
           p.default_value = "default";
           p.doc = "calibration text file ('default' = the default text; its last calib_tokens tokens "
                   "are used)";
           return p;
         }(),
         int_param("calib_tokens", "2048", 1, 1e9, "calibration tokens"),
         choice_param("calib_mode", "two_pass", {"two_pass", "sequential", "one_pass"},
                      "two_pass: RoRoPE from the original model, the latent's PCA from the model after RoPE "
                      "removal (TransMLA's order); sequential: layer l on the model with layers < l converted; "
                      "one_pass: every layer on the original model (model/mla_convert.h)"),
         choice_param("exec", "absorbed", {"absorbed", "naive"},
                      "absorbed: W_uk on the query side, decode reads only the latent cache; naive: "
                      "k_nope and v rebuilt from the cache"),
         choice_param("weights", "f32", {"f32", "q8_0", "source"},
                      "storage of the converted projections that the absorbed execution reads: float32 "
                      "(the conversion as computed: the exact merge stays exact), Q8_0, or the source "
                      "model's types (both read the source W_q in place) "
                      "(model/mla_model.h quantize_mla_layer)")}));
    v.push_back(info(
        "bda", "bda",
        "BD Attention: each Q/K or V/O pair rewritten through a basis of its own rows (exact up to "
        "rounding; qk needs position-free Q/K dimensions)",
        "J. Zhao, \"Accelerating Attention with Basis Decomposition\", arXiv 2510.01718, 2025",
        "a pivoted QR per KV head and pair",
        {choice_param("pairs", "vo", {"vo", "qk", "qkvo"}, "pairs rewritten"),
         choice_param("coef", "q8_0", {"q8_0", "source", "f32"},
                      "storage of the VO pair's coefficients and W_o' when the weights stay quantized "
                      "(model/bda_model.h)")}));
    for (TensorScheme s : kSchemes) v.push_back(tensor_info(s));
    return v;
  }();
  return all;
}

std::string names() {
  std::string s;
  for (const MethodInfo& m : catalogue()) s += (s.empty() ? "" : ", ") + m.name;
  return s;
}

std::int64_t get(const ParamValues& p, const char* k) { return p.get_int(k); }

}  // namespace

const std::vector<const MethodInfo*>& list_transforms() {
  static const std::vector<const MethodInfo*> v = [] {
    std::vector<const MethodInfo*> out;
    for (const MethodInfo& m : catalogue()) out.push_back(&m);
    return out;
  }();
  return v;
}

const MethodInfo* find_transform(std::string_view name) {
  for (const MethodInfo& m : catalogue())
    if (m.name == name) return &m;
  return nullptr;
}

std::string TransformStage::spec() const {
  const std::string c = params.canonical();
  return c.empty() ? info->name : info->name + "(" + c + ")";
}

std::string TransformPipeline::canonical() const {
  std::string s;
  for (const TransformStage& st : stages) s += (s.empty() ? "" : "|") + st.spec();
  return s;
}

TransformPipeline parse_transforms(std::string_view pipeline) {
  TransformPipeline out;
  if (pipeline.find_first_not_of(" \t\n\r") == std::string_view::npos) return out;
  for (const std::string& item : split_specs(pipeline, "|")) {
    const ParsedSpec ps = parse_spec_any_name(item);
    const MethodInfo* info = find_transform(ps.name);
    NUMATTN_CHECK(info != nullptr, "transform pipeline '{}': unknown transform '{}' (registered: {}; see "
                  "`numattn transforms`)", pipeline, ps.name, names());
    for (const ParamSpec& p : info->params)
      NUMATTN_CHECK(!p.default_value.empty() ||
                        std::any_of(ps.params.begin(), ps.params.end(), [&](const auto& kv) { return kv.first == p.name; }),
                    "transform pipeline '{}': {} needs {}=... ({})", pipeline, info->name, p.name, p.doc);
    TransformStage st{info, bind_params(*info, ps.params)};
    const ParamValues& v = st.params;
    auto refuse_after = [&](bool bad, const char* what) {
      NUMATTN_CHECK(!bad, "transform pipeline '{}': {} {}", pipeline, info->name, what);
    };
    if (info->family == "mla") {
      refuse_after(out.mla.has_value(), "is given twice");
      refuse_after(out.bda || out.tensor,
                   "must come first: it converts a GQA model, and bda / tensor.* run on its result");
      MlaStage m;
      m.options.rank = get(v, "rank");
      m.options.rope_heads = static_cast<int>(get(v, "rope_heads"));
      m.options.rope_dims = get(v, "rope_dims");
      m.options.freqfold = static_cast<int>(get(v, "freqfold"));
      m.options.balance = v.get_float("balance");
      m.budget = v.get_float("budget");
      m.calib = v.get_string("calib");
      m.calib_tokens = get(v, "calib_tokens");
      m.calib_mode = v.get_string("calib_mode");
      m.exec = v.get_string("exec");
      m.weights = v.get_string("weights");
      // By value, not by presence, so that the canonical form (every default written) parses back.
      NUMATTN_CHECK_OPTION(!(m.budget > 0 && (m.options.rank != -1 || m.options.rope_heads != 1 ||
                                               m.options.rope_dims != 0 || m.options.freqfold != 1)),
                           "budget", "chooses rank, rope_dims and freqfold: give it without them, or give rank");
      NUMATTN_CHECK(m.budget > 0 || m.options.rank >= 0, "transform pipeline '{}': mla needs rank=... (latent "
                    "rank r, 0 = the full width) or budget=... (a fraction of the GQA cache in (0, 1]; 0 = off)", pipeline);
      NUMATTN_CHECK_OPTION(m.options.rope_dims == 0 || m.options.rope_heads == 1, "rope_dims",
                           "give rope_dims or rope_heads (rope_heads = h stands for rope_dims = h·n_rot), not both");
      NUMATTN_CHECK_OPTION(m.options.rope_dims % 2 == 0, "rope_dims",
                           "must be even (RoPE rotates pairs), got {}", m.options.rope_dims);
      out.mla = m;
    } else if (info->family == "bda") {
      refuse_after(out.bda.has_value(), "is given twice");
      refuse_after(out.tensor.has_value(), "cannot be combined with a tensor.* transform");
      out.bda = BdaStage{v.get_string("pairs"), v.get_string("coef")};
    } else {
      refuse_after(out.tensor.has_value(), "follows another tensor.* transform: give one");
      refuse_after(out.bda.has_value(), "cannot be combined with bda");
      TensorSpec t;
      for (TensorScheme s : kSchemes)
        if (tensor_info(s).name == info->name) t.scheme = s;
      t.rank = get(v, "rank");
      if (t.is_cp()) {
        t.iters = static_cast<int>(get(v, "iters"));
        t.seed = static_cast<std::uint64_t>(get(v, "seed"));
        if (t.scheme == TensorScheme::kVoCp) t.factored = v.get_string("exec") == "factored";
      } else {
        t.rank2 = get(v, "rank2") == 0 ? t.rank : get(v, "rank2");
        t.layers = get(v, t.scheme == TensorScheme::kTuckerHeads ? "heads" : "layers");
        t.iters = static_cast<int>(get(v, "iters"));
      }
      NUMATTN_CHECK(!out.mla || t.scheme == TensorScheme::kQkCp,
                    "transform pipeline '{}': after mla only tensor.qk_cp applies (collaborative QK on "
                    "the MLA NoPE part); {} compresses the GQA model's weights",
                    pipeline, info->name);
      out.tensor = t;
    }
    out.stages.push_back(std::move(st));
  }
  return out;
}

std::string tensor_transform_spec(const TensorSpec& t) {
  std::string s = fmt::format("tensor.{}(rank={}", to_string(t.scheme), t.rank);
  std::replace(s.begin(), s.end(), '-', '_');
  if (!t.is_cp()) {
    if (t.rank2 != t.rank) s += fmt::format(",rank2={}", t.rank2);
    if (t.layers > 0)
      s += fmt::format(",{}={}", t.scheme == TensorScheme::kTuckerHeads ? "heads" : "layers", t.layers);
  }
  if (t.iters > 0) s += fmt::format(",iters={}", t.iters);
  if (t.is_cp() && t.seed != 1) s += fmt::format(",seed={}", t.seed);
  if (t.factored) s += ",exec=factored";
  return s + ")";
}

}  // namespace numattn::transform
