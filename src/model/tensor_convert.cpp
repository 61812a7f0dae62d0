#include "numattn/model/tensor_convert.h"

#include <algorithm>

#include "numattn/core/error.h"
#include "numattn/core/file_io.h"
#include "numattn/model/bda_model.h"
#include "numattn/model/gguf.h"
#include "numattn/model/quant.h"

namespace numattn {

namespace {

constexpr const char* kArch = "numattn-tensor";
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
std::vector<FileStack> file_stacks(const transform::TensorSpec& sp, const LlamaHParams& hp) {
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
                                                                             const LlamaHParams& hp) {
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

TensorFileLayout read_tensor_file_layout(const GgufFile& f, const LlamaHParams& hp) {
  NUMATTN_CHECK(f.architecture() == kArch, "{}: architecture '{}' is not {}", f.path(), f.architecture(), kArch);
  TensorFileLayout lay;
  transform::TensorSpec& sp = lay.spec_only.spec;
  const std::string scheme = f.get_string(key("scheme"));
  bool known = false;
  for (auto s : {transform::TensorScheme::kVoCp, transform::TensorScheme::kQkCp, transform::TensorScheme::kTuckerQkvo,
                 transform::TensorScheme::kTuckerFfn, transform::TensorScheme::kTuckerHeads})
    if (scheme == transform::to_string(s)) sp.scheme = s, known = true;
  NUMATTN_CHECK(known, "{}: {} = '{}' is not one of vo-cp, qk-cp, tucker-qkvo, tucker-ffn, tucker-heads", f.path(), key("scheme"),
                scheme);
  auto ranged = [&](const char* k, std::int64_t lo, std::int64_t hi, const std::string& why) {
    const std::int64_t v = f.get_int(key(k));
    NUMATTN_CHECK(v >= lo && v <= hi, "{}: {} = {} must be between {} and {} ({})", f.path(), key(k), v, lo, hi, why);
    return v;
  };
  const std::int64_t E = hp.n_embd, D = hp.head_dim, Hq = hp.n_head, Hkv = hp.n_head_kv, F = hp.n_ff;
  if (sp.is_cp()) {
    lay.cp_rank = ranged("rank", 1, Hq * D, fmt::format("the CP rank, at most Hq·D = {}·{}", Hq, D));
    sp.rank = lay.cp_rank;
    const std::string ex = f.get_string(key("exec"), "embedded");
    NUMATTN_CHECK(ex == "embedded" || (ex == "factored" && sp.scheme == transform::TensorScheme::kVoCp),
                  "{}: {} = '{}' must be embedded (or factored, for vo-cp)", f.path(), key("exec"), ex);
    sp.factored = ex == "factored";
    NUMATTN_CHECK(sp.scheme != transform::TensorScheme::kQkCp || hp.n_rot == 0,
                  "{}: {} = qk-cp, but the model applies RoPE to {} Q/K dimensions per head (qk-cp needs "
                  "position-free Q/K)", f.path(), key("scheme"), hp.n_rot);
  } else {
    const std::int64_t maxdim = sp.scheme == transform::TensorScheme::kTuckerQkvo    ? std::max({Hq * D, Hkv * D, E})
                                : sp.scheme == transform::TensorScheme::kTuckerHeads ? std::max(E, D)
                                                                                     : std::max(F, E);
    const std::string why = fmt::format("a Tucker rank, at most the largest matrix dimension {}", maxdim);
    sp.rank = ranged("rank", 1, maxdim, why);
    sp.rank2 = ranged("rank2", 1, maxdim, why);
    const bool heads = sp.scheme == transform::TensorScheme::kTuckerHeads;
    sp.layers = ranged("layers", 0, heads ? hp.n_head : hp.n_layer,
                       heads ? fmt::format("the head-mode rank, 0 = one core per head, at most {} heads", hp.n_head)
                             : fmt::format("the stack rank, 0 = shared, at most {} layers", hp.n_layer));
  }
  const std::string why = fmt::format("{} = {}, {} = {}, E = {}, Hq = {}, {} layers", key("scheme"), scheme, key("rank"),
                                      sp.rank, E, Hq, hp.n_layer);
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
  return lay;
}

LlamaModel finish_tensor_model(const GgufFile& f, const LlamaHParams& hp, LlamaWeights w, const ExecContext& ctx) {
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

void write_tensor_gguf(const GgufFile& source, const TensorFactors& fac, const std::string& path) {
  check_outputs_distinct({{"converted model", path}}, {{"source model", source.path()}});
  NUMATTN_CHECK(source.architecture() == "llama", "write_tensor_gguf: the source {} is '{}', not a llama model",
                source.path(), source.architecture());
  for (const GgufTensorInfo& t : source.tensors())
    NUMATTN_CHECK(gguf_block_index(t.name, ".attn_v_bd.coef") < 0,
                  "write_tensor_gguf: the source {} is a BDA model (tensor {})", source.path(), t.name);
  const LlamaHParams hp = LlamaModel::read_hparams(source);
  const transform::TensorSpec& sp = fac.spec;
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
