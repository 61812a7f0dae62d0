// Hostile and corrupt model files, and the resource bounds of the model layer: every
// hyper-parameter is validated against the tensors before anything is allocated, non-finite
// weights and numerics are refused at load, and big allocations are checked against the
// available memory (NUMATTN_MEMORY_AVAILABLE stands in for a small machine).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <limits>
#include <optional>
#include <string>
#include <vector>

#include "numattn/core/error.h"
#include "numattn/gguf/gguf.h"
#include "numattn/model/llama.h"
#include "support/test_util.h"
#include "support/tiny_llama.h"

namespace numattn {
namespace {
namespace NUMATTN_UNITY_ID {

using test::GgufEdit;
using test::MemoryCap;

// The error LlamaModel::load raises for `path`; a load that succeeds or throws anything but a
// numattn::Error (std::bad_alloc, std::length_error, ...) fails the test.
std::string load_error(const std::string& path, WeightStorage storage = WeightStorage::kInPlace) {
  try {
    LlamaModel::load(path, ExecContext{2}, storage);
  } catch (const Error& e) {
    return e.what();
  } catch (const std::exception& e) {
    ADD_FAILURE() << path << ": not a numattn::Error: " << e.what();
    return "";
  }
  ADD_FAILURE() << path << " loaded";
  return "";
}


const std::string& base_gguf() {
  static const std::string path = test::write_gguf(test::make_tiny(false), "limits_base.gguf");
  return path;
}

struct Case {
  const char* what;
  GgufEdit edit;
  std::vector<std::string> must_name;  // substrings of the error
};

GgufValue u32(std::uint32_t v) { return GgufValue::u32(v); }

std::vector<Case> hyper_parameter_cases() {
  const float nan = std::numeric_limits<float>::quiet_NaN(), inf = std::numeric_limits<float>::infinity();
  std::vector<Case> c;
  auto key = [&](const char* what, const char* k, std::optional<GgufValue> v,
                 std::vector<std::string> names) {
    Case x{what, {}, std::move(names)};
    x.edit.keys.emplace_back(k, std::move(v));
    c.push_back(std::move(x));
  };
  // Sizes far beyond the tensors: refused by the shape check, before any allocation.
  key("embedding 2^22", "llama.embedding_length", u32(1u << 22), {"llama.embedding_length", "token_embd.weight"});
  key("embedding u32 max", "llama.embedding_length", u32(0xffffffffu), {"llama.embedding_length"});
  key("embedding 0", "llama.embedding_length", u32(0), {"llama.embedding_length", "at least 1"});
  key("embedding negative", "llama.embedding_length", GgufValue::i32(-32), {"llama.embedding_length"});
  key("embedding 2^63", "llama.embedding_length", GgufValue::u64(1ull << 63), {"llama.embedding_length"});
  key("embedding missing", "llama.embedding_length", std::nullopt, {"llama.embedding_length"});
  key("blocks 0", "llama.block_count", u32(0), {"llama.block_count"});
  key("blocks 10^6", "llama.block_count", u32(1000000), {"llama.block_count", "tensors"});
  key("blocks 3 of 2", "llama.block_count", u32(3), {"llama.block_count"});
  key("ff 2^30", "llama.feed_forward_length", u32(1u << 30), {"llama.feed_forward_length", "blk.0.ffn_gate.weight"});
  key("ff negative", "llama.feed_forward_length", GgufValue::i64(-64), {"llama.feed_forward_length"});
  key("heads do not divide E", "llama.attention.head_count", u32(3), {"llama.attention.head_count", "llama.embedding_length"});
  key("heads 0", "llama.attention.head_count", u32(0), {"llama.attention.head_count"});
  key("heads 2^31", "llama.attention.head_count", u32(1u << 31), {"llama.attention.head_count"});
  key("kv heads do not divide", "llama.attention.head_count_kv", u32(3), {"llama.attention.head_count_kv", "multiple"});
  key("kv heads 0", "llama.attention.head_count_kv", u32(0), {"llama.attention.head_count_kv"});
  key("kv heads > heads", "llama.attention.head_count_kv", u32(8), {"llama.attention.head_count_kv"});
  key("head dim vs tensors", "llama.attention.key_length", u32(16), {"llama.attention.key_length", "blk.0.attn_q.weight"});
  key("head dim huge", "llama.attention.key_length", u32(1u << 30), {"llama.attention.key_length"});
  key("value length", "llama.attention.value_length", u32(4), {"llama.attention.value_length"});
  key("n_rot > head dim", "llama.rope.dimension_count", u32(10), {"llama.rope.dimension_count"});
  key("n_rot odd", "llama.rope.dimension_count", u32(7), {"llama.rope.dimension_count"});
  key("n_rot negative", "llama.rope.dimension_count", GgufValue::i32(-2), {"llama.rope.dimension_count"});
  key("vocab_size", "llama.vocab_size", u32(65), {"llama.vocab_size", "token_embd.weight"});
  key("tokenizer vocabulary", "tokenizer.ggml.tokens",
      GgufValue::string_array(std::vector<std::string>(65, "x")), {"tokenizer.ggml.tokens", "token_embd.weight"});
  key("context 2^40", "llama.context_length", GgufValue::u64(1ull << 40), {"llama.context_length"});
  key("context 0", "llama.context_length", u32(0), {"llama.context_length"});
  key("context missing", "llama.context_length", std::nullopt, {"llama.context_length"});
  // Numerics of the forward pass.
  key("rms_eps nan", "llama.attention.layer_norm_rms_epsilon", GgufValue::f32(nan), {"layer_norm_rms_epsilon"});
  key("rms_eps inf", "llama.attention.layer_norm_rms_epsilon", GgufValue::f32(inf), {"layer_norm_rms_epsilon"});
  key("rms_eps negative", "llama.attention.layer_norm_rms_epsilon", GgufValue::f32(-1e-5f), {"layer_norm_rms_epsilon"});
  key("rms_eps zero", "llama.attention.layer_norm_rms_epsilon", GgufValue::f32(0), {"layer_norm_rms_epsilon"});
  key("freq_base zero", "llama.rope.freq_base", GgufValue::f32(0), {"llama.rope.freq_base"});
  key("freq_base negative", "llama.rope.freq_base", GgufValue::f32(-10000), {"llama.rope.freq_base"});
  key("freq_base nan", "llama.rope.freq_base", GgufValue::f32(nan), {"llama.rope.freq_base"});
  key("freq_base inf", "llama.rope.freq_base", GgufValue::f32(inf), {"llama.rope.freq_base"});
  // Tensors that disagree with valid keys.
  {
    Case x{"missing tensor", {}, {"blk.1.ffn_down.weight", "missing"}};
    x.edit.drop_tensors.push_back("blk.1.ffn_down.weight");
    c.push_back(std::move(x));
  }
  {
    Case x{"3-d tensor", {}, {"blk.0.attn_k.weight", "[32, 8, 2]"}};
    x.edit.tensors.push_back({"blk.0.attn_k.weight", {32, 8, 2}, std::vector<float>(512, 0.f)});
    c.push_back(std::move(x));
  }
  {
    Case x{"transposed tensor", {}, {"blk.1.ffn_down.weight", "[32, 64]", "llama.feed_forward_length"}};
    x.edit.tensors.push_back({"blk.1.ffn_down.weight", {32, 64}, std::vector<float>(2048, 0.f)});
    c.push_back(std::move(x));
  }
  return c;
}

TEST(ModelLimits, EveryHostileHyperParameterIsRefusedByName) {
  for (const Case& c : hyper_parameter_cases()) {
    SCOPED_TRACE(c.what);
    const std::string path = test::rewrite_gguf(base_gguf(), c.edit, "limits_case.gguf");
    const std::string msg = load_error(path);
    for (const auto& s : c.must_name) EXPECT_NE(msg.find(s), std::string::npos) << msg;
    // Nothing was read past the header: read_hparams alone refuses it too.
    EXPECT_THROW(LlamaModel::read_hparams(GgufFile::open(path)), Error);
  }
}

TEST(ModelLimits, UndequantizableTensorTypeIsRefusedBeforeAllocation) {
  GgufEdit e;
  const std::string good = base_gguf();
  const GgufFile f = GgufFile::open(good);
  GgufWriter w;
  for (const auto& [k, v] : f.metadata()) w.set(k, v);
  for (const auto& t : f.tensors()) {
    if (t.name == "blk.0.ffn_up.weight") {
      w.add_tensor(t.name, GgmlType::I32, t.ne, std::vector<std::uint8_t>(t.size_bytes, 0));
    } else {
      w.add_tensor(t.name, t.type, t.ne, std::vector<std::uint8_t>(t.data, t.data + t.size_bytes));
    }
  }
  const std::string path = test::temp_path("limits_i32.gguf");
  w.write(path);
  const std::string msg = load_error(path);
  EXPECT_NE(msg.find("blk.0.ffn_up.weight"), std::string::npos) << msg;
  EXPECT_NE(msg.find("I32"), std::string::npos) << msg;
}

TEST(ModelLimits, NonFiniteWeightsAreRefusedWithTensorAndIndex) {
  const float nan = std::numeric_limits<float>::quiet_NaN(), inf = std::numeric_limits<float>::infinity();
  // F32 storage: the exact element is named (ne {32, 64}: row 3, column 5).
  {
    test::TinyTensors T = test::make_tiny(false);
    std::vector<float> w = T.get("blk.1.ffn_up.weight");
    w[3 * 32 + 5] = nan;
    w[7 * 32 + 1] = inf;  // later in the tensor: the first one is reported
    GgufEdit e;
    e.tensors.push_back({"blk.1.ffn_up.weight", {32, 64}, w});
    const std::string path = test::rewrite_gguf(base_gguf(), e, "limits_nan.gguf");
    const std::string msg = load_error(path, WeightStorage::kF32);
    EXPECT_NE(msg.find("blk.1.ffn_up.weight"), std::string::npos) << msg;
    // In place nothing is scanned at load (that would read every weight); the forward pass
    // refuses the non-finite logits the weight produces, naming the position.
    const LlamaModel m = LlamaModel::load(path, ExecContext{1});
    KvCache c = m.make_cache(4);
    try {
      m.forward({1, 2}, c, ExecContext{1});
      ADD_FAILURE() << "non-finite weight gave finite logits";
    } catch (const Error& err) {
      EXPECT_NE(std::string(err.what()).find("non-finite logit"), std::string::npos) << err.what();
    }
    EXPECT_NE(msg.find("row 3, column 5"), std::string::npos) << msg;
    EXPECT_NE(msg.find("nan"), std::string::npos) << msg;
  }
  // A norm vector (1-d) with +inf, and a quantized file whose block scale overflowed.
  {
    GgufEdit e;
    std::vector<float> g(32, 1.f);
    g[31] = inf;
    e.tensors.push_back({"output_norm.weight", {32}, g});
    const std::string msg = load_error(test::rewrite_gguf(base_gguf(), e, "limits_inf.gguf"));  // norms are copied
    EXPECT_NE(msg.find("output_norm.weight"), std::string::npos) << msg;
    EXPECT_NE(msg.find("column 31"), std::string::npos) << msg;
  }
  {
    test::TinyTensors T = test::make_tiny(false);
    for (auto& [name, d] : T.t)
      if (name == "blk.0.attn_q.weight") d[100] = inf;
    const std::string msg = load_error(test::write_gguf(T, "limits_q8_inf.gguf", GgmlType::Q8_0), WeightStorage::kF32);
    EXPECT_NE(msg.find("blk.0.attn_q.weight"), std::string::npos) << msg;
  }
}

TEST(ModelLimits, InMemoryModelsAreValidatedToo) {
  const auto T = test::make_tiny(false);
  const LlamaModel good = LlamaModel::load(test::write_gguf(T, "limits_mem.gguf"));
  auto refused = [&](auto change, const char* name) {
    ModelHParams hp = good.hparams();
    change(hp);
    try {
      LlamaModel m(hp, good.weights());
      ADD_FAILURE() << "accepted";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(name), std::string::npos) << e.what();
    }
  };
  refused([](ModelHParams& h) { h.rms_eps = std::nan(""); }, "rms_eps");
  refused([](ModelHParams& h) { h.rope_base = 0; }, "rope_base");
  refused([](ModelHParams& h) { h.n_ctx_train = 0; }, "n_ctx_train");
  refused([](ModelHParams& h) { h.n_head_kv = 3; }, "head_count_kv");
  refused([](ModelHParams& h) { h.n_vocab = std::int64_t{1} << 62; }, "overflows");
}

TEST(ModelLimits, LoadIsRefusedWhenTheWeightsDoNotFitInMemory) {
  const std::string path = base_gguf();
  const LlamaModel m = LlamaModel::load(path);  // fits without the cap
  const std::int64_t bytes = 4 * m.hparams().weight_count(false);
  MemoryCap cap(std::to_string(bytes - 1));
  // In place, the weights need no memory of their own: the load succeeds under the cap.
  EXPECT_NO_THROW(LlamaModel::load(path, ExecContext{2}));
  const std::string msg = load_error(path, WeightStorage::kF32);
  EXPECT_NE(msg.find(path), std::string::npos) << msg;
  EXPECT_NE(msg.find(std::to_string(bytes) + " bytes"), std::string::npos) << msg;
  EXPECT_NE(msg.find(std::to_string(bytes - 1) + " bytes"), std::string::npos) << msg;
}

TEST(ModelLimits, KvCacheAndForwardBuffersAreCheckedAgainstMemory) {
  const LlamaModel m = LlamaModel::load(base_gguf());
  // 2 layers × K,V × 2 KV heads × 8 dims × 4 bytes = 256 bytes per position.
  {
    MemoryCap cap("25600");
    EXPECT_NO_THROW(m.make_cache(100));
    try {
      m.make_cache(101);
      ADD_FAILURE() << "a 25856-byte cache fit in 25600 bytes";
    } catch (const Error& e) {
      const std::string msg = e.what();
      EXPECT_NE(msg.find("KV cache of 101 positions"), std::string::npos) << msg;
      EXPECT_NE(msg.find("25856 bytes"), std::string::npos) << msg;
      EXPECT_NE(msg.find("25600 bytes"), std::string::npos) << msg;
    }
  }
  // Capacities whose byte size overflows are refused by the checked arithmetic.
  EXPECT_THROW(m.make_cache(std::numeric_limits<std::int64_t>::max() / 4), Error);
  EXPECT_THROW(m.make_cache(0), Error);
  // A forward pass of 64 tokens with all logits: 64 × 64 logits alone are 16 KiB.
  KvCache c = m.make_cache(64);
  std::vector<std::int32_t> toks(64, 1);
  {
    MemoryCap cap("16384");
    try {
      m.forward(toks, c, ExecContext{1});
      ADD_FAILURE() << "the forward pass fit";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("forward pass of 64 tokens"), std::string::npos) << e.what();
    }
    EXPECT_EQ(c.n_past(), 0);
  }
  EXPECT_NO_THROW(m.forward(toks, c, ExecContext{1}));
}

}  // namespace NUMATTN_UNITY_ID
}  // namespace
}  // namespace numattn
