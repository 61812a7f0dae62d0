// The metadata keys of numattn's own GGUF architectures (numattn-mla, numattn-tensor, and the BDA
// keys of a llama file) are validated like llama's: for each architecture a small valid file is
// written by numattn's own writer, then every key is edited to a wrong type, removed, and set
// out of range or to an unknown enum value or version; each load must refuse, naming the key and
// the file. The keys the loader looks up are recorded (GgufKeyLog), and one it reads that the
// table below has no case for fails the test, so a new key cannot go in unchecked.
#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <optional>
#include <regex>
#include <set>
#include <string>
#include <vector>

#include "numattn/core/error.h"
#include "numattn/gguf/gguf.h"
#include "numattn/model/bda_model.h"
#include "numattn/model/llama.h"
#include "numattn/model/mla_convert.h"
#include "numattn/model/tensor_convert.h"
#include "numattn/model/tensor_model.h"
#include "numattn/model/tokenizer.h"
#include "support/test_util.h"
#include "support/tiny_llama.h"

namespace numattn {
namespace {
namespace NUMATTN_UNITY_ID {

using test::GgufEdit;

// One edit of one key: `value` (std::nullopt removes the key); the error must name `key`, the
// file and every string of `names`.
struct Bad {
  std::string key;
  std::optional<GgufValue> value;
  std::vector<std::string> names;
};

GgufValue u32(std::uint32_t v) { return GgufValue::u32(v); }
GgufValue i32(std::int32_t v) { return GgufValue::i32(v); }
GgufValue str(const char* s) { return GgufValue::string(s); }
GgufValue f64s(std::vector<double> v) { return GgufValue::array(std::move(v)); }
GgufValue i32s(std::vector<std::int32_t> v) { return GgufValue::array(std::move(v)); }

// The error of loading `path` (in place: read_hparams checks every key before any weight is
// read), or "" when it loads.
std::string load_error(const std::string& path) {
  try {
    LlamaModel::load(path, ExecContext{1}, WeightStorage::kInPlace);
  } catch (const Error& e) {
    return e.what();
  } catch (const std::exception& e) {
    ADD_FAILURE() << path << ": not a numattn::Error: " << e.what();
    return "not a numattn::Error";
  }
  return "";
}

// "blk.3.attn_v_bd.perm" → "blk.N.attn_v_bd.perm", "numattn-mla.mla.rope_theta.1" → "...rope_theta.N".
std::string pattern(const std::string& key) {
  return std::regex_replace(std::regex_replace(key, std::regex(R"(^blk\.\d+\.)"), "blk.N."), std::regex(R"(\.\d+$)"),
                            ".N");
}

// A key of numattn's own formats (the renamed llama keys of its architectures included).
bool own_key(const std::string& k) {
  return k.rfind("numattn-mla.", 0) == 0 || k.rfind("numattn-tensor.", 0) == 0 || k.rfind("numattn.", 0) == 0 ||
         k.find(".attn_v_bd.") != std::string::npos;
}

// The own keys the loader looks up in `path` (present or not), in order, once each.
std::vector<std::string> keys_read(const std::string& path) {
  GgufKeyLog log;
  EXPECT_EQ(load_error(path), "") << path;
  std::vector<std::string> out;
  for (const std::string& k : log.keys())
    if (own_key(k) && std::find(out.begin(), out.end(), k) == out.end()) out.push_back(k);
  return out;
}

// Runs the table on `valid` and the generated wrong-type and missing-key edits of every key the
// loader reads; `optional` lists the key patterns whose removal may load (they have defaults).
void check_arch(const std::string& valid, const std::vector<Bad>& table, const std::set<std::string>& optional) {
  const std::vector<std::string> read = keys_read(valid);
  ASSERT_FALSE(read.empty());
  std::set<std::string> covered;
  for (const Bad& b : table) covered.insert(pattern(b.key));
  for (const std::string& k : read)
    EXPECT_TRUE(covered.count(pattern(k))) << "the loader reads " << k << ", which the table has no case for";
  auto refused = [&](const GgufEdit& e, const std::string& key, const std::vector<std::string>& names,
                     const std::string& what) {
    const std::string path = test::rewrite_gguf(valid, e, "arch_keys_case.gguf");
    const std::string msg = load_error(path);
    SCOPED_TRACE(what + ": " + msg);
    if (msg.empty()) return false;
    EXPECT_NE(msg.find(path), std::string::npos) << "the file is not named";
    EXPECT_NE(msg.find(key), std::string::npos) << "the key is not named";
    for (const std::string& n : names) EXPECT_NE(msg.find(n), std::string::npos) << "'" << n << "' is not named";
    return true;
  };
  for (const Bad& b : table) {
    GgufEdit e;
    e.keys.emplace_back(b.key, b.value);
    EXPECT_TRUE(refused(e, b.key, b.names, b.key + " = " + (b.value ? b.value->to_string() : "(removed)")))
        << b.key << " = " << (b.value ? b.value->to_string() : "(removed)") << " loaded";
  }
  const GgufFile f = GgufFile::open(valid);
  for (const std::string& k : read) {
    const GgufValue* v = f.find(k);
    // Wrong type: a string for a number or an array, a number for a string.
    GgufEdit e;
    e.keys.emplace_back(k, v != nullptr && v->type() == GgufType::STRING ? u32(7) : str("x"));
    EXPECT_TRUE(refused(e, k, {}, k + " of the wrong type")) << k << " of the wrong type loaded";
    if (v == nullptr) continue;
    GgufEdit drop;
    drop.keys.emplace_back(k, std::nullopt);
    const bool r = refused(drop, k, {}, k + " removed");
    EXPECT_TRUE(r || optional.count(pattern(k))) << k << " removed loaded, and it is not optional";
  }
}

// The tiny llama source (E = 32, Hq = 4, Hkv = 2, D = 8, n_rot = 8, F = 64, 2 layers).
const std::string& source() {
  static const std::string p = test::write_gguf(test::make_tiny(false), "arch_keys_src.gguf");
  return p;
}

// The renamed llama keys of an own architecture `arch`, each with an out-of-range edit.
std::vector<Bad> renamed_llama_keys(const std::string& arch) {
  auto k = [&](const char* s) { return arch + "." + s; };
  return {
      {k("embedding_length"), u32(64), {}},
      {k("block_count"), u32(3), {}},
      {k("feed_forward_length"), u32(32), {"ffn_gate.weight"}},
      {k("attention.head_count"), u32(3), {}},
      {k("attention.head_count_kv"), u32(3), {"multiple"}},
      {k("attention.key_length"), u32(16), {}},
      {k("attention.value_length"), u32(4), {}},
      {k("rope.dimension_count"), u32(7), {}},
      {k("rope.freq_base"), GgufValue::f32(0), {}},
      {k("attention.layer_norm_rms_epsilon"), GgufValue::f32(-1e-5f), {}},
      {k("context_length"), u32(0), {}},
      {k("vocab_size"), u32(65), {"token_embd.weight"}},
      {k("rope.scaling.type"), str("linear"), {}},
      // BDA keys belong to llama files only.
      {"numattn.bda.pairs", str("vo"), {"llama files"}},
      {"numattn.bda.version", u32(1), {"llama files"}},
  };
}

const std::set<std::string> kOptionalSuffixes = {"rope.dimension_count", "rope.freq_base",
                                                 "attention.layer_norm_rms_epsilon"};
std::set<std::string> optional_keys(const std::string& arch, std::vector<std::string> own) {
  std::set<std::string> s;
  for (const std::string& x : kOptionalSuffixes) s.insert(arch + "." + x);
  for (std::string& x : own) s.insert(std::move(x));
  return s;
}

TEST(GgufArchKeys, MlaKeysAreCheckedByNameAgainstEachOtherAndTheLayers) {
  const GgufFile src = GgufFile::open(source());
  LlamaModel m = LlamaModel::load(source(), ExecContext{1});
  transform::MlaOptions opt;  // rank 7 of the latent width d_nope + Hkv·D = 8 + 16; d_rope = 8
  opt.rank = 7;
  convert_model_to_mla(m, {}, opt, ExecContext{1});
  const std::string valid = test::temp_path("arch_keys_mla.gguf");
  write_mla_gguf(src, m, opt, valid);
  const std::string p = "numattn-mla.mla.";
  std::vector<Bad> t = {
      {p + "version", u32(3), {"newer numattn"}},
      {p + "version", u32(0), {}},
      {p + "kv_lora_rank", u32(0), {}},
      {p + "kv_lora_rank", u32(1u << 21), {}},
      {p + "kv_lora_rank", u32(8), {"rank_option"}},
      {p + "nope_dim", u32(9), {"head_count_kv"}},
      {p + "nope_dim", u32(1u << 21), {}},
      {p + "rope_dim", u32(3), {"even"}},
      {p + "rope_dim", u32(16), {"rope_dims"}},
      {p + "value_dim", u32(0), {}},
      {p + "value_dim", u32(7), {"head dim"}},
      {p + "softmax_scale", GgufValue::f64(-1.0), {}},
      {p + "softmax_scale", GgufValue::f64(NAN), {}},
      {p + "softmax_scale", GgufValue::f64(0.5), {"1/sqrt"}},
      {p + "freqfold", i32(0), {}},
      {p + "freqfold", i32(3), {"divide"}},
      {p + "freqfold", i32(5), {}},
      {p + "rope_dims", u32(0), {}},
      {p + "rope_dims", u32(7), {"even"}},
      {p + "rope_dims", u32(18), {"head_count_kv"}},
      {p + "rope_dims", u32(16), {"rope_dim"}},
      {p + "rank_option", GgufValue::i64(-1), {}},
      {p + "rank_option", GgufValue::i64(8), {"kv_lora_rank"}},
      {p + "rank_option", GgufValue::i64(0), {"kv_lora_rank"}},
      {p + "rope_theta.0", f64s({1.0, 0.1, 0.01}), {"4"}},
      {p + "rope_theta.0", f64s({1.0, NAN, 0.01, 0.001}), {"element 1"}},
      {p + "rope_theta.1", f64s({2.0, 0.1, 0.01, 0.001}), {"element 0"}},
      {p + "rope_theta.1", GgufValue::string_array({"a", "b", "c", "d"}), {"array of string"}},
      // The GQA keys the MLA keys are checked against.
      {"numattn-mla.attention.head_count_kv", u32(1), {"nope_dim"}},
      {"numattn-mla.rope.dimension_count", u32(4), {"rope_dim"}},
      {"numattn-mla.rope.dimension_count", u32(0), {"rope_dim"}},
      {"numattn-mla.rope.freq_base", GgufValue::f32(500000.f), {"rope_theta.0"}},
      {"numattn-mla.attention.key_length", u32(16), {"value_dim"}},
  };
  for (Bad& b : renamed_llama_keys("numattn-mla")) t.push_back(std::move(b));
  check_arch(valid, t, optional_keys("numattn-mla", {p + "version"}));
}

// Writes the tiny model compressed by `spec` from `src_path` as a numattn-tensor file.
std::string tensor_file(const std::string& src_path, const std::string& spec, const std::string& name) {
  const GgufFile src = GgufFile::open(src_path);
  TensorFactors fac;
  compress_model_tensor(LlamaModel::load(src_path, ExecContext{1}), transform::parse_tensor_spec(spec), ExecContext{1},
                        nullptr, &fac);
  const std::string out = test::temp_path(name);
  write_tensor_gguf(src, fac, out);
  return out;
}

TEST(GgufArchKeys, TensorKeysAreCheckedByName) {
  const std::string p = "numattn-tensor.tensor.";
  const std::set<std::string> optional = optional_keys("numattn-tensor", {p + "version", p + "exec"});
  std::vector<Bad> common = {
      {p + "version", u32(3), {"newer numattn"}},
      {p + "version", u32(0), {}},
      {p + "scheme", str("vo-tt"), {"tucker-heads"}},
      {p + "spec", str("not a spec"), {}},
      {p + "spec", std::nullopt, {"required"}},
  };
  for (Bad& b : renamed_llama_keys("numattn-tensor")) common.push_back(std::move(b));
  {
    SCOPED_TRACE("vo-cp");
    std::vector<Bad> t = common;
    const std::vector<Bad> more = {
        {p + "scheme", str("qk-cp"), {"RoPE"}},
        {p + "scheme", str("tucker-qkvo"), {"rank2"}},
        {p + "rank", u32(0), {}},
        {p + "rank", u32(33), {}},
        {p + "rank", u32(4), {"blk.0.attn_vo_cp.left"}},
        {p + "exec", str("fast"), {"embedded"}},
        {p + "exec", str("factored"), {"spec"}},
        {p + "rank2", u32(5), {"Tucker key"}},
        {p + "layers", u32(1), {"Tucker key"}},
        {p + "spec", str("vo-cp:rank=6"), {"disagrees"}},
        // The issue this guards: a RoPE model's file that lost its RoPE ran without a word.
        {"numattn-tensor.rope.dimension_count", u32(0), {"vo-cp"}},
        {"numattn-tensor.attention.head_count_kv", u32(1), {"blk.0.attn_k.weight"}},
    };
    t.insert(t.end(), more.begin(), more.end());
    check_arch(tensor_file(source(), "vo-cp:rank=5", "arch_keys_vo.gguf"), t, optional);
  }
  {
    SCOPED_TRACE("tucker-qkvo");
    std::vector<Bad> t = common;
    const std::vector<Bad> more = {
        {p + "rank", u32(0), {}},
        {p + "rank", u32(1000), {}},
        {p + "rank2", u32(0), {}},
        {p + "rank2", std::nullopt, {}},
        {p + "layers", u32(3), {}},
        {p + "layers", u32(0), {"tucker.attn_q.cores"}},
        {p + "exec", str("embedded"), {"CP key"}},
        {p + "spec", str("tucker-qkvo:rank=6x6,layers=1"), {"disagrees"}},
    };
    t.insert(t.end(), more.begin(), more.end());
    check_arch(tensor_file(source(), "tucker-qkvo:rank=6x5,layers=1", "arch_keys_tk.gguf"), t, optional);
  }
  {
    SCOPED_TRACE("qk-cp");
    const std::string nope = test::rewrite_gguf(source(), {{{"llama.rope.dimension_count", u32(0)}}, {}, {}},
                                                "arch_keys_nope_src.gguf");
    std::vector<Bad> t = common;
    const std::vector<Bad> more = {
        {p + "rank", u32(0), {}},
        {p + "exec", str("factored"), {"vo-cp"}},
        {"numattn-tensor.rope.dimension_count", u32(8), {"qk-cp"}},
        {p + "rank2", u32(5), {"Tucker key"}},
        {p + "layers", u32(1), {"Tucker key"}},
    };
    t.insert(t.end(), more.begin(), more.end());
    // rope.dimension_count removed means RoPE on all of D: refused for qk-cp, so not optional.
    std::set<std::string> opt = optional;
    opt.erase("numattn-tensor.rope.dimension_count");
    check_arch(tensor_file(nope, "qk-cp:rank=6", "arch_keys_qk.gguf"), t, opt);
  }
  // The writer refuses what the loader would: a RoPE-keeping scheme from a model without RoPE.
  const std::string nope = test::rewrite_gguf(source(), {{{"llama.rope.dimension_count", u32(0)}}, {}, {}},
                                              "arch_keys_nope_src2.gguf");
  EXPECT_THROW(tensor_file(nope, "vo-cp:rank=5", "arch_keys_never.gguf"), Error);
}

TEST(GgufArchKeys, BdaKeysAreCheckedByName) {
  const GgufFile src = GgufFile::open(source());
  LlamaModel m = LlamaModel::load(source(), ExecContext{1});
  apply_bda(m, "vo");
  const std::string valid = test::temp_path("arch_keys_bda.gguf");
  write_bda_gguf(src, m, valid);
  const std::vector<Bad> t = {
      {"numattn.bda.version", u32(2), {"newer numattn"}},
      {"numattn.bda.version", u32(0), {}},
      {"numattn.bda.pairs", str("qk"), {"vo"}},
      {"numattn.bda.pairs", str("none"), {"vo"}},
      {"blk.0.attn_v_bd.perm", i32s(std::vector<std::int32_t>(31, 0)), {"31 values"}},
      {"blk.0.attn_v_bd.perm", i32s(std::vector<std::int32_t>(32, 0)), {"twice"}},
      {"blk.1.attn_v_bd.perm", i32s([] {
         std::vector<std::int32_t> v(32);
         for (int i = 0; i < 32; ++i) v[static_cast<std::size_t>(i)] = i + 1;
         return v;
       }()), {"element 31"}},
      {"blk.1.attn_v_bd.perm", f64s(std::vector<double>(32, 0.0)), {"array of f64"}},
      {"blk.0.attn_v_bd.dense", i32s({1, 0}), {"increasing"}},
      {"blk.0.attn_v_bd.dense", i32s({2}), {}},
      {"blk.0.attn_v_bd.dense", i32s({-1}), {}},
      {"blk.1.attn_v_bd.dense", i32s({0, 1, 1}), {"3 values"}},
  };
  check_arch(valid, t, {});
  // A layer's BD keys without its coefficients.
  GgufEdit e;
  e.drop_tensors.push_back("blk.1.attn_v_bd.coef");
  const std::string path = test::rewrite_gguf(valid, e, "arch_keys_case.gguf");
  const std::string msg = load_error(path);
  EXPECT_NE(msg.find("blk.1.attn_v_bd.coef"), std::string::npos) << msg;
  EXPECT_NE(msg.find(path), std::string::npos) << msg;
}

// The typed accessors of GgufFile and the tokenizer's merges name the key, the file and both types.
TEST(GgufArchKeys, TypeErrorsNameTheKeyTheFileAndBothTypes) {
  const std::string path = test::rewrite_gguf(source(), {{{"x.thetas", str("abc")}, {"x.names", f64s({1.0})}}, {}, {}},
                                              "arch_keys_types.gguf");
  const GgufFile f = GgufFile::open(path);
  auto error = [](auto fn) {
    try {
      fn();
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("accepted");
  };
  for (const std::string& msg : {error([&] { f.get_double_array("x.thetas"); }), error([&] { f.get_int_array("x.thetas"); }),
                                 error([&] { f.get<float>("x.thetas"); }), error([&] { f.get_int("x.thetas"); })}) {
    EXPECT_NE(msg.find(path), std::string::npos) << msg;
    EXPECT_NE(msg.find("x.thetas"), std::string::npos) << msg;
    EXPECT_NE(msg.find("a string"), std::string::npos) << msg;
    EXPECT_NE(msg.find("expected"), std::string::npos) << msg;
  }
  const std::string msg = error([&] { f.get_string_array("x.names"); });
  EXPECT_NE(msg.find("x.names"), std::string::npos) << msg;
  EXPECT_NE(msg.find("an array of f64, expected an array of string"), std::string::npos) << msg;

  const std::string vocab = test::tiny_model_with_vocab();
  const std::string bad_merges = test::rewrite_gguf(
      vocab, {{{"tokenizer.ggml.merges", GgufValue::string_array({"a b", "C!reating"})}}, {}, {}}, "arch_keys_tok.gguf");
  const std::string mm = error([&] { Tokenizer::from_gguf_path(bad_merges); });
  for (const char* s : {"tokenizer.ggml.merges[1]", "C!reating", "'A B'"}) EXPECT_NE(mm.find(s), std::string::npos) << mm;
  EXPECT_NE(mm.find(bad_merges), std::string::npos) << mm;
  const std::string bad_tokens = test::rewrite_gguf(vocab, {{{"tokenizer.ggml.tokens", f64s({1.0})}}, {}, {}},
                                                    "arch_keys_tok.gguf");
  const std::string mt = error([&] { Tokenizer::from_gguf_path(bad_tokens); });
  EXPECT_NE(mt.find("tokenizer.ggml.tokens"), std::string::npos) << mt;
  EXPECT_NE(mt.find(bad_tokens), std::string::npos) << mt;
  const std::string bad_bos = test::rewrite_gguf(vocab, {{{"tokenizer.ggml.bos_token_id", GgufValue::u64(1ull << 32)}}, {}, {}},
                                                 "arch_keys_tok.gguf");
  const std::string mb = error([&] { Tokenizer::from_gguf_path(bad_bos); });
  EXPECT_NE(mb.find("tokenizer.ggml.bos_token_id"), std::string::npos) << mb;
}

}  // namespace NUMATTN_UNITY_ID
}  // namespace
}  // namespace numattn
