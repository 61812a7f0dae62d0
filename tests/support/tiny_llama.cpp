#include "support/tiny_llama.h"

#include <cmath>

#include "numattn/core/error.h"
#include "numattn/core/rng.h"
#include "support/test_util.h"

namespace numattn::test {

// A tiny random Llama: 2 layers, GQA (4 query heads over 2 KV heads), vocabulary 64.
ModelHParams tiny_hparams() {
  ModelHParams h;
  h.n_vocab = 64;
  h.n_embd = 32;
  h.n_layer = 2;
  h.n_ff = 64;
  h.n_head = 4;
  h.n_head_kv = 2;
  h.head_dim = 8;
  h.n_rot = 8;
  h.rope_base = 10000.0;
  h.rms_eps = 1e-5;
  h.n_ctx_train = 256;
  return h;
}

std::vector<float> randn(std::size_t n, std::uint64_t stream, float scale) {
  std::vector<float> v(n);
  fill_normal(v, 1234, stream);
  for (float& x : v) x *= scale;
  return v;
}

const std::vector<float>& TinyTensors::get(const std::string& n) const {
  for (const auto& [name, d] : t)
    if (name == n) return d;
  throw Error("no tensor " + n);
}

TinyTensors make_tiny(bool tied) { return make_tiny(tied, tiny_hparams()); }

TinyTensors make_tiny(bool tied, const ModelHParams& hp) {
  TinyTensors T;
  T.hp = hp;
  const auto& h = T.hp;
  const std::int64_t E = h.n_embd, D = h.head_dim, F = h.n_ff;
  std::uint64_t s = 0;
  auto add = [&](const std::string& name, std::int64_t in, std::int64_t out, float scale,
                 float offset = 0.f) {
    auto v = randn(static_cast<std::size_t>(in * out), s++, scale);
    for (float& x : v) x += offset;
    T.t.emplace_back(name, std::move(v));
    T.shape.emplace_back(in, out);
  };
  add("token_embd.weight", E, h.n_vocab, 1.0f);
  add("output_norm.weight", E, 1, 0.1f, 1.0f);
  if (!tied) add("output.weight", E, h.n_vocab, 0.3f);
  const float ws = 1.0f / std::sqrt(static_cast<float>(E));
  for (int l = 0; l < h.n_layer; ++l) {
    const std::string p = "blk." + std::to_string(l) + ".";
    add(p + "attn_norm.weight", E, 1, 0.1f, 1.0f);
    add(p + "attn_q.weight", E, h.n_head * D, 2 * ws);
    add(p + "attn_k.weight", E, h.n_head_kv * D, 2 * ws);
    add(p + "attn_v.weight", E, h.n_head_kv * D, ws);
    add(p + "attn_output.weight", h.n_head * D, E, ws);
    add(p + "ffn_norm.weight", E, 1, 0.1f, 1.0f);
    add(p + "ffn_gate.weight", E, F, ws);
    add(p + "ffn_up.weight", E, F, ws);
    add(p + "ffn_down.weight", F, E, 1.0f / std::sqrt(static_cast<float>(F)));
  }
  return T;
}

TinyTensors make_tiny_gemma() {
  ModelHParams h = tiny_hparams();
  h.n_layer = 3;
  h.n_ff = 48;
  h.n_head = 4;
  h.n_head_kv = 1;
  h.head_dim = 16;
  h.n_rot = 16;
  h.rms_eps = 1e-6;
  TinyTensors T = make_tiny(true, h);
  T.arch = "gemma3";
  const std::int64_t E = h.n_embd, D = h.head_dim;
  std::uint64_t s = 100;
  auto add = [&](const std::string& name, std::int64_t n) {
    auto v = randn(static_cast<std::size_t>(n), s++, 0.2f);
    for (float& x : v) x += 1.f;
    T.t.emplace_back(name, std::move(v));
    T.shape.emplace_back(n, 1);
  };
  for (int l = 0; l < h.n_layer; ++l) {
    const std::string p = "blk." + std::to_string(l) + ".";
    add(p + "attn_q_norm.weight", D);
    add(p + "attn_k_norm.weight", D);
    add(p + "post_attention_norm.weight", E);
    add(p + "post_ffw_norm.weight", E);
  }
  T.extra_keys = {{"gemma3.attention.key_length", GgufValue::u32(16)},
                  {"gemma3.attention.value_length", GgufValue::u32(16)},
                  {"gemma3.attention.sliding_window", GgufValue::u32(4)},
                  {"gemma3.attention.sliding_window_pattern", GgufValue::u32(2)},
                  {"gemma3.rope.freq_base_swa", GgufValue::f32(100.f)},
                  {"gemma3.final_logit_softcapping", GgufValue::f32(30.f)}};
  return T;
}

std::string write_gguf(const TinyTensors& T, const std::string& name, GgmlType type) {
  const auto& h = T.hp;
  GgufWriter w;
  auto K = [&](const char* field) { return T.arch + "." + field; };
  w.set("general.architecture", GgufValue::string(T.arch));
  w.set(K("context_length"), GgufValue::u32(static_cast<std::uint32_t>(h.n_ctx_train)));
  w.set(K("embedding_length"), GgufValue::u32(static_cast<std::uint32_t>(h.n_embd)));
  w.set(K("block_count"), GgufValue::u32(static_cast<std::uint32_t>(h.n_layer)));
  w.set(K("feed_forward_length"), GgufValue::u32(static_cast<std::uint32_t>(h.n_ff)));
  w.set(K("attention.head_count"), GgufValue::u32(static_cast<std::uint32_t>(h.n_head)));
  w.set(K("attention.head_count_kv"), GgufValue::u32(static_cast<std::uint32_t>(h.n_head_kv)));
  w.set(K("rope.dimension_count"), GgufValue::u32(static_cast<std::uint32_t>(h.n_rot)));
  w.set(K("rope.freq_base"), GgufValue::f32(static_cast<float>(h.rope_base)));
  w.set(K("attention.layer_norm_rms_epsilon"), GgufValue::f32(static_cast<float>(h.rms_eps)));
  for (const auto& [k, v] : T.extra_keys) w.set(k, v);
  for (std::size_t i = 0; i < T.t.size(); ++i) {
    const auto [in, out] = T.shape[i];
    const bool vec = out == 1;
    std::vector<std::int64_t> ne = vec ? std::vector<std::int64_t>{in} : std::vector<std::int64_t>{in, out};
    w.add_tensor_f32(T.t[i].first, ne, T.t[i].second.data(), vec ? GgmlType::F32 : type);
  }
  const std::string path = temp_path(name);
  w.write(path);
  return path;
}

std::string rewrite_gguf(const std::string& src, const GgufEdit& edit, const std::string& name) {
  const GgufFile f = GgufFile::open(src);
  GgufWriter w(static_cast<std::uint32_t>(f.alignment()));
  auto edited = [&](const std::string& key) -> const std::optional<GgufValue>* {
    for (const auto& [k, v] : edit.keys)
      if (k == key) return &v;
    return nullptr;
  };
  for (const auto& [key, value] : f.metadata()) {
    if (key == "general.alignment") continue;
    const auto* e = edited(key);
    if (!e) w.set(key, value);
    else if (e->has_value()) w.set(key, **e);
  }
  for (const auto& [key, value] : edit.keys)
    if (value && !f.has(key)) w.set(key, *value);
  auto replaced = [&](const std::string& tname) {
    for (const auto& t : edit.tensors)
      if (t.name == tname) return true;
    for (const auto& d : edit.drop_tensors)
      if (d == tname) return true;
    return false;
  };
  for (const GgufTensorInfo& t : f.tensors())
    if (!replaced(t.name))
      w.add_tensor(t.name, t.type, t.ne, std::vector<std::uint8_t>(t.data, t.data + t.size_bytes));
  for (const auto& t : edit.tensors) w.add_tensor_f32(t.name, t.ne, t.data.data(), t.type);
  const std::string path = temp_path(name);
  w.write(path);
  return path;
}

const TinyTensors& tiny_tensors() {
  static const TinyTensors T = make_tiny(false);
  return T;
}

const std::string kTinyChars = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ .,!?;:'-\n";

std::string add_tiny_vocab(const std::string& base, const std::string& name, const std::string& model_name) {
  // BPE symbols: ' ' is "Ġ", '\n' is "Ċ".
  std::vector<std::string> vocab{"<s>", "</s>"};
  for (char c : kTinyChars) vocab.push_back(c == ' ' ? "Ġ" : c == '\n' ? "Ċ" : std::string(1, c));
  EXPECT_EQ(vocab.size(), 64u);
  GgufEdit e;
  e.keys.emplace_back("tokenizer.ggml.model", GgufValue::string("gpt2"));
  e.keys.emplace_back("tokenizer.ggml.pre", GgufValue::string("gpt-2"));
  e.keys.emplace_back("tokenizer.ggml.tokens", GgufValue::string_array(vocab));
  e.keys.emplace_back("tokenizer.ggml.bos_token_id", GgufValue::u32(0));
  e.keys.emplace_back("tokenizer.ggml.eos_token_id", GgufValue::u32(1));
  e.keys.emplace_back("tokenizer.ggml.add_bos_token", GgufValue::boolean(true));
  e.keys.emplace_back("general.name", GgufValue::string(model_name));
  return rewrite_gguf(base, e, name);
}

std::string tiny_model_with_vocab() {
  static const std::string path =
      add_tiny_vocab(write_gguf(tiny_tensors(), "capture_tiny_base.gguf"), "capture_tiny_vocab.gguf", "tiny");
  return path;
}

std::string tiny_text(std::size_t n) {
  const std::string words = "it is a truth universally acknowledged, that a single man in "
                            "possession of a good fortune, must be in want of a wife.\n";
  std::string s;
  while (s.size() < n) s += words;
  return s.substr(0, n);
}

}  // namespace numattn::test
