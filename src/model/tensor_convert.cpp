#include "numattn/model/tensor_convert.h"

#include <algorithm>

#include "numattn/core/error.h"
#include "numattn/core/file_io.h"
#include "numattn/gguf/gguf.h"
#include "numattn/gguf/gguf_keys.h"
#include "numattn/gguf/tensor_data.h"
#include "numattn/model/bda_model.h"
#include "numattn/transform/pipeline.h"

namespace numattn {

namespace {

constexpr const char* kArch = "numattn-tensor";
// The numattn-tensor layout this build reads (1: model/tensor_convert.h).
constexpr std::int64_t kTensorFormatVersion = 1;
constexpr const char* kAttnKinds[] = {"attn_q", "attn_k", "attn_v", "attn_output"};
constexpr const char* kFfnKinds[] = {"ffn_gate", "ffn_up", "ffn_down"};

std::string key(const char* k) { return std::string(kArch) + ".tensor." + k; }

const char* cp_prefix(transform::TensorScheme s) {
  return s == transform::TensorScheme::kVoCp ? "attn_vo_cp" : "attn_qk_cp";
}
std::string cp_name(transform::TensorScheme s, std::int64_t l, const char* part) {
  return "blk." + std::to_string(l) + "." + cp_prefix(s) + "." + part;
}

/// One Tucker stack of a file: its tensor name prefix and shapes.
struct FileStack {
  std::string prefix;  ///< "tucker.K." or "blk.ℓ.tucker_heads.K."
  TensorStackKind kind;
  std::int64_t r1, r2, bank;
  bool shared;  ///< one core per slice (no coef tensor)
};

/// The stacks of a Tucker scheme, in TensorFactors::stacks order.
std::vector<FileStack> file_stacks(const transform::TensorSpec& sp, const ModelHParams& hp) {
  const bool heads = sp.scheme == transform::TensorScheme::kTuckerHeads;
  const std::vector<TensorStackKind> kinds = tensor_stack_kinds(sp.scheme, hp);
  std::vector<FileStack> out;
  for (std::int64_t l = 0; l < (heads ? hp.n_layer : 1); ++l)
    for (const TensorStackKind& k : kinds) {
      const bool shared = sp.layers == 0 || sp.layers >= k.slices;
      out.push_back({heads ? "blk." + std::to_string(l) + ".tucker_heads." + k.name + "." : "tucker." + std::string(k.name) + ".",
                     k, std::min(sp.rank, k.rows), std::min(sp.rank2, k.cols), shared ? k.slices : sp.layers, shared});
    }
  return out;
}

/// The shape (GGUF ne order) of every factor tensor of a file of this layout, in writing order.
std::vector<std::pair<std::string, std::vector<std::int64_t>>> factor_shapes(const TensorFileLayout& lay,
                                                                             const ModelHParams& hp) {
  const transform::TensorSpec& sp = lay.spec_only.spec;
  std::vector<std::pair<std::string, std::vector<std::int64_t>>> out;
  if (sp.is_cp()) {
    const std::int64_t R = lay.cp_rank;
    for (std::int64_t l = 0; l < hp.n_layer; ++l) {
      out.push_back({cp_name(sp.scheme, l, "left"), {R, hp.n_embd}});
      out.push_back({cp_name(sp.scheme, l, "right"), {R, hp.n_embd}});
      out.push_back({cp_name(sp.scheme, l, "mix"), {R, hp.n_head}});
    }
    return out;
  }
  for (const FileStack& st : file_stacks(sp, hp)) {
    out.push_back({st.prefix + "left", {st.r1, st.kind.rows}});
    out.push_back({st.prefix + "right", {st.r2, st.kind.cols}});
    out.push_back({st.prefix + "cores", {st.r2, st.r1, st.bank}});
    if (!st.shared) out.push_back({st.prefix + "coef", {st.bank, st.kind.slices}});
  }
  return out;
}

std::string shape_str(const std::vector<std::int64_t>& ne) {
  std::string s = "[";
  for (std::size_t i = 0; i < ne.size(); ++i) s += (i ? ", " : "") + std::to_string(ne[i]);
  return s + "]";
}

std::vector<float> read_f32(const GgufFile& f, const std::string& name, const ExecContext& ctx) {
  const GgufTensorInfo& t = f.tensor(name);
  std::vector<float> v(static_cast<std::size_t>(t.n_elements()));
  dequantize_tensor(t, v.data(), ctx, NonFinite::kRefuse);
  return v;
}

}  // namespace

bool TensorFileLayout::drops(const std::string& kind) const {
  switch (spec_only.spec.scheme) {
    case transform::TensorScheme::kVoCp: return kind == "attn_v" || kind == "attn_output";
    case transform::TensorScheme::kQkCp: return kind == "attn_q" || kind == "attn_k";
    default: return rebuilds(kind);
  }
}

bool TensorFileLayout::rebuilds(const std::string& kind) const {
  const auto& kinds = spec_only.spec.scheme == transform::TensorScheme::kTuckerFfn
                          ? std::vector<std::string>(std::begin(kFfnKinds), std::end(kFfnKinds))
                          : std::vector<std::string>(std::begin(kAttnKinds), std::end(kAttnKinds));
  return std::find(kinds.begin(), kinds.end(), kind) != kinds.end();
}

TensorFileLayout read_tensor_file_layout(const GgufFile& f, const ModelHParams& hp) {
  NUMATTN_CHECK(f.architecture() == kArch, "{}: architecture '{}' is not {}", f.path(), f.architecture(), kArch);
  const GgufKeyReader keys(f);
  TensorFileLayout lay;
  transform::TensorSpec& sp = lay.spec_only.spec;
  keys.version(key("version"), kTensorFormatVersion, 1);  // files before the key are version 1
  const std::string scheme = keys.one_of(key("scheme"), {"vo-cp", "qk-cp", "tucker-qkvo", "tucker-ffn", "tucker-heads"},
                                         "the compression scheme (model/tensor_convert.h)");
  for (auto s : {transform::TensorScheme::kVoCp, transform::TensorScheme::kQkCp, transform::TensorScheme::kTuckerQkvo,
                 transform::TensorScheme::kTuckerFfn, transform::TensorScheme::kTuckerHeads})
    if (scheme == transform::to_string(s)) sp.scheme = s;
  auto ranged = [&](const char* k, std::int64_t lo, std::int64_t hi, const std::string& why) {
    return keys.integer(key(k), lo, hi, why);
  };
  const std::int64_t E = hp.n_embd, D = hp.head_dim, Hq = hp.n_head, Hkv = hp.n_head_kv, F = hp.n_ff;
  // qk-cp replaces Q and K by position-free factors, so its model has no RoPE; every other scheme
  // keeps RoPE on Q and K (the models numattn converts apply it), and a file that lost it would
  // run a different model without a word.
  const std::string rot = std::string(kArch) + ".rope.dimension_count";
  if (sp.scheme == transform::TensorScheme::kQkCp && hp.n_rot != 0)
    keys.refuse(rot, fmt::format("{} = qk-cp, but the model applies RoPE to {} Q/K dimensions per head (qk-cp "
                                 "needs position-free Q/K, rope.dimension_count = 0)", key("scheme"), hp.n_rot));
  if (sp.scheme != transform::TensorScheme::kQkCp && hp.n_rot == 0)
    keys.refuse(rot, fmt::format("must be between 2 and the head dim {} for {} = {} (RoPE on Q and K; 0 is qk-cp's)",
                                 D, key("scheme"), scheme));
  if (sp.is_cp()) {
    lay.cp_rank = ranged("rank", 1, Hq * D, fmt::format("the CP rank, at most Hq·D = {}·{}", Hq, D));
    sp.rank = lay.cp_rank;
    const bool vo = sp.scheme == transform::TensorScheme::kVoCp;
    const std::string ex = vo ? keys.one_of_or(key("exec"), "embedded", {"embedded", "factored"},
                                               "how vo-cp runs: embedded (head dim max(D, R)) or factored")
                              : keys.one_of_or(key("exec"), "embedded", {"embedded"},
                                               "factored is vo-cp's alone");
    sp.factored = ex == "factored";
  } else {
    if (keys.has(key("exec"))) keys.refuse(key("exec"), fmt::format("is a CP key; {} = {} has no exec", key("scheme"), scheme));
    const std::int64_t maxdim = sp.scheme == transform::TensorScheme::kTuckerQkvo    ? std::max({Hq * D, Hkv * D, E})
                                : sp.scheme == transform::TensorScheme::kTuckerHeads ? std::max(E, D)
                                                                                     : std::max(F, E);
    const std::string why = fmt::format("a Tucker rank of {} = {}, at most the largest matrix dimension {}",
                                        key("scheme"), scheme, maxdim);
    sp.rank = ranged("rank", 1, maxdim, why);
    sp.rank2 = ranged("rank2", 1, maxdim, why);
    const bool heads = sp.scheme == transform::TensorScheme::kTuckerHeads;
    sp.layers = ranged("layers", 0, heads ? hp.n_head : hp.n_layer,
                       heads ? fmt::format("the head-mode rank, 0 = one core per head, at most {} heads", hp.n_head)
                             : fmt::format("the stack rank, 0 = shared, at most {} layers", hp.n_layer));
  }
  if (sp.is_cp() && keys.has(key("rank2"))) keys.refuse(key("rank2"), fmt::format("is a Tucker key; {} = {} has none", key("scheme"), scheme));
  if (sp.is_cp() && keys.has(key("layers"))) keys.refuse(key("layers"), fmt::format("is a Tucker key; {} = {} has none", key("scheme"), scheme));
  // Every key a factor shape depends on, so a disagreement names them all.
  auto llama_key = [](const char* k) { return std::string(kArch) + "." + k; };
  std::string why = fmt::format("{} = {}, {} = {}", key("scheme"), scheme, key("rank"), sp.rank);
  if (!sp.is_cp()) why += fmt::format(", {} = {}, {} = {}", key("rank2"), sp.rank2, key("layers"), sp.layers);
  why += fmt::format("; {} E = {}, {} Hq = {}, {} Hkv = {}, head dim D = {} ({} or E / Hq), {} F = {}, {} L = {}",
                     llama_key("embedding_length"), E, llama_key("attention.head_count"), Hq,
                     llama_key("attention.head_count_kv"), Hkv, D, llama_key("attention.key_length"),
                     llama_key("feed_forward_length"), F, llama_key("block_count"), hp.n_layer);
  for (const auto& [name, ne] : factor_shapes(lay, hp)) {
    const GgufTensorInfo* t = f.find_tensor(name);
    NUMATTN_CHECK(t != nullptr, "{}: tensor {} is missing ({} needs it)", f.path(), name, why);
    std::vector<std::int64_t> got = t->ne;
    while (got.size() > ne.size() && got.back() == 1) got.pop_back();
    NUMATTN_CHECK(got == ne, "{}: tensor {} has shape {}, expected {} ({})", f.path(), name, t->shape_string(),
                  shape_str(ne), why);
    NUMATTN_CHECK(t->type == GgmlType::F32, "{}: tensor {} has type {}; factor tensors are F32", f.path(), name,
                  ggml_type_name(t->type));
  }
  // The spec is informational, but it is what reports show: it must describe these factors.
  {
    const GgufValue* v = f.find(key("spec"));
    if (v == nullptr) keys.refuse(key("spec"), "the canonical spec of the conversion is required");
    if (v->type() != GgufType::STRING)
      keys.refuse(key("spec"), fmt::format("has type {}, expected a string (a tensor spec)", gguf_type_name(v->type())));
    transform::TensorSpec got;
    try {
      got = transform::parse_tensor_spec(v->as_string());
    } catch (const Error& e) {
      keys.refuse(key("spec"), fmt::format("is not a tensor spec: {}", e.what()));
    }
    const bool same = got.scheme == sp.scheme && got.factored == sp.factored &&
                      (sp.is_cp() ? got.rank == sp.rank || (got.rank == 0 && sp.rank == Hq * D)
                                  : got.rank == sp.rank && got.rank2 == sp.rank2 && got.layers == sp.layers);
    if (!same)
      keys.refuse(key("spec"), fmt::format("disagrees with the file's keys {}, {}, {} (they give {})", key("scheme"),
                                           key("rank"), sp.is_cp() ? key("exec") : key("rank2") + ", " + key("layers"),
                                           sp.canonical()));
  }
  return lay;
}

LlamaModel finish_tensor_model(const GgufFile& f, const ModelHParams& hp, LlamaWeights w, const ExecContext& ctx) {
  const TensorFileLayout lay = read_tensor_file_layout(f, hp);
  TensorFactors fac;
  fac.spec = lay.spec_only.spec;
  const std::int64_t L = hp.n_layer;
  if (fac.spec.is_cp()) {
    for (std::int64_t l = 0; l < L; ++l)
      fac.cp.push_back({lay.cp_rank, read_f32(f, cp_name(fac.spec.scheme, l, "left"), ctx),
                        read_f32(f, cp_name(fac.spec.scheme, l, "right"), ctx),
                        read_f32(f, cp_name(fac.spec.scheme, l, "mix"), ctx)});
  } else {
    for (const FileStack& fs : file_stacks(fac.spec, hp)) {
      TensorFactors::Stack st;
      st.name = fs.kind.name;
      st.rows = fs.kind.rows;
      st.cols = fs.kind.cols;
      st.rank_rows = fs.r1;
      st.rank_cols = fs.r2;
      st.bank = fs.bank;
      st.left = read_f32(f, fs.prefix + "left", ctx);
      st.right = read_f32(f, fs.prefix + "right", ctx);
      st.cores = read_f32(f, fs.prefix + "cores", ctx);
      if (!fs.shared) st.coef = read_f32(f, fs.prefix + "coef", ctx);
      fac.stacks.push_back(std::move(st));
    }
  }
  const TensorSourceRows source = [&](std::int64_t l, const char* kind) {
    return read_f32(f, "blk." + std::to_string(l) + "." + kind + ".weight", ctx);
  };
  return build_tensor_model(hp, std::move(w), fac, source);
}

void write_tensor_gguf(const GgufFile& source, const TensorFactors& fac, const std::string& path,
                       const std::string& transform) {
  check_outputs_distinct({{"converted model", path}}, {{"source model", source.path()}});
  NUMATTN_CHECK(source.architecture() == "llama", "write_tensor_gguf: the source {} is '{}', not a llama model",
                source.path(), source.architecture());
  for (const GgufTensorInfo& t : source.tensors())
    NUMATTN_CHECK(gguf_block_index(t.name, ".attn_v_bd.coef") < 0,
                  "write_tensor_gguf: the source {} is a BDA model (tensor {})", source.path(), t.name);
  const ModelHParams hp = LlamaModel::read_hparams(source);
  const transform::TensorSpec& sp = fac.spec;
  NUMATTN_CHECK(sp.scheme == transform::TensorScheme::kQkCp || hp.n_rot > 0,
                "write_tensor_gguf: {} of a model without RoPE (rope.dimension_count = 0): a numattn-tensor file "
                "of a scheme other than qk-cp keeps RoPE on Q and K, so its loader would refuse this one",
                transform::to_string(sp.scheme));
  TensorFileLayout lay;
  lay.spec_only.spec = sp;
  if (sp.is_cp()) {
    NUMATTN_CHECK(static_cast<std::int64_t>(fac.cp.size()) == hp.n_layer, "write_tensor_gguf: {} CP layers for {} layers",
                  fac.cp.size(), hp.n_layer);
    lay.cp_rank = fac.cp.front().rank;
  } else {
    NUMATTN_CHECK(fac.stacks.size() == file_stacks(sp, hp).size(), "write_tensor_gguf: {} stacks, {} needs {}",
                  fac.stacks.size(), transform::to_string(sp.scheme), file_stacks(sp, hp).size());
  }
  GgufWriter out(static_cast<std::uint32_t>(source.alignment()));
  const std::string pre = std::string(kArch) + ".";
  for (const auto& [k, value] : source.metadata()) {
    if (k == "general.alignment") continue;
    if (k == "general.architecture") {
      out.set(k, GgufValue::string(kArch));
    } else if (k.rfind("llama.", 0) == 0) {
      out.set(pre + k.substr(6), value);
    } else {
      out.set(k, value);
    }
  }
  auto u32 = [](std::int64_t v) { return GgufValue::u32(static_cast<std::uint32_t>(v)); };
  out.set(key("scheme"), GgufValue::string(transform::to_string(sp.scheme)));
  out.set(key("rank"), u32(sp.is_cp() ? lay.cp_rank : sp.rank));
  if (!sp.is_cp()) {
    out.set(key("rank2"), u32(sp.rank2));
    out.set(key("layers"), u32(sp.layers));
  }
  if (sp.factored) out.set(key("exec"), GgufValue::string("factored"));
  out.set(key("spec"), GgufValue::string(sp.canonical()));
  if (!transform.empty()) out.set(transform::kTransformKey, GgufValue::string(transform));
  out.set(key("version"), u32(kTensorFormatVersion));
  for (const GgufTensorInfo& t : source.tensors()) {
    bool dropped = false;
    for (const char* kind : kAttnKinds) dropped |= lay.drops(kind) && gguf_block_index(t.name, std::string(".") + kind + ".weight") >= 0;
    for (const char* kind : kFfnKinds) dropped |= lay.drops(kind) && gguf_block_index(t.name, std::string(".") + kind + ".weight") >= 0;
    if (!dropped) out.add_tensor(t.name, t.type, t.ne, std::vector<std::uint8_t>(t.data, t.data + t.size_bytes));
  }
  // The factors, in the order factor_shapes lists them (its shapes checked against the data).
  std::vector<const std::vector<float>*> data;
  for (const auto& c : fac.cp) data.insert(data.end(), {&c.left, &c.right, &c.mix});
  for (const auto& s : fac.stacks) {
    data.insert(data.end(), {&s.left, &s.right, &s.cores});
    if (!s.coef.empty()) data.push_back(&s.coef);
  }
  const auto shapes = factor_shapes(lay, hp);
  NUMATTN_CHECK(shapes.size() == data.size(), "write_tensor_gguf: {} factor tensors, the layout has {}", data.size(),
                shapes.size());
  for (std::size_t i = 0; i < shapes.size(); ++i) {
    std::int64_t n = 1;
    for (std::int64_t d : shapes[i].second) n *= d;
    NUMATTN_CHECK(static_cast<std::int64_t>(data[i]->size()) == n, "write_tensor_gguf: {} holds {} values, its shape {} {}",
                  shapes[i].first, data[i]->size(), shape_str(shapes[i].second), n);
    out.add_tensor_f32(shapes[i].first, shapes[i].second, data[i]->data());
  }
  out.write(path);
}

}  // namespace numattn
