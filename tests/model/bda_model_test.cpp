// BD Attention applied to a whole model: losslessness of the VO pair on the tiny Llama,
// RoPE refusal of the QK pair, and the GGUF round trip of a converted model.
#include "numattn/model/bda_model.h"

#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>

#include "numattn/gguf/gguf.h"
#include "numattn/model/ppl.h"
#include "support/test_util.h"
#include "support/tiny_llama.h"

namespace numattn {
namespace {
namespace NUMATTN_UNITY_ID {

std::vector<std::int32_t> tokens(std::size_t n) {
  std::vector<std::int32_t> t(n);
  for (std::size_t i = 0; i < n; ++i) t[i] = static_cast<std::int32_t>((i * 37 + 11) % 64);
  return t;
}

std::vector<float> run(const LlamaModel& m, const std::vector<std::int32_t>& t) {
  KvCache c = m.make_cache(static_cast<std::int64_t>(t.size()));
  return m.forward(t, c, ExecContext{2});
}

double max_diff(const std::vector<float>& a, const std::vector<float>& b) {
  double d = 0;
  for (std::size_t i = 0; i < a.size(); ++i) d = std::max(d, static_cast<double>(std::abs(a[i] - b[i])));
  return d;
}

TEST(ModelBda, VoPairIsLosslessOnTheTinyModel) {
  const auto path = test::write_gguf(test::make_tiny(false), "bda_tiny.gguf");
  LlamaModel dense = LlamaModel::load(path);
  LlamaModel bda = dense;
  const ModelBdaReport rep = apply_bda(bda, "vo");
  ASSERT_EQ(rep.layers.size(), 2u);
  // V projections shrink by head_dim/d_model: 2 layers × 2 KV heads × 8 × 8 weights.
  EXPECT_EQ(rep.params_saved(), 2 * 2 * 8 * 8);
  EXPECT_EQ(rep.fallback_heads, 0);
  const auto t = tokens(40);
  const auto a = run(dense, t), b = run(bda, t);
  // κ-scaled float32 bound of docs/bd.md (c = 8) on logits of magnitude ~10, with margin.
  EXPECT_LE(max_diff(a, b), 8 * test::kEpsF32 * std::max(1.0, rep.kappa_max) * 100);
  // KV-cache decoding of the BDA model equals its batched prefill.
  KvCache c = bda.make_cache(40);
  std::vector<float> step;
  bda.forward({t.begin(), t.begin() + 39}, c, ExecContext{1});
  step = bda.forward({t[39]}, c, ExecContext{1});
  const std::vector<float> last(b.end() - 64, b.end());
  EXPECT_LE(max_diff(step, last), 1e-4);
}

TEST(ModelBda, QkPairIsRefusedByNameForRope) {
  const auto path = test::write_gguf(test::make_tiny(true), "bda_tiny_qk.gguf");
  LlamaModel m = LlamaModel::load(path);
  const auto before = run(m, tokens(16));
  for (const char* pairs : {"qk", "qkvo"}) {
    try {
      apply_bda(m, pairs);
      FAIL() << pairs << " must be refused";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("RoPE"), std::string::npos) << e.what();
    }
  }
  EXPECT_EQ(run(m, tokens(16)), before);  // untouched after the refusal
  EXPECT_THROW(apply_bda(m, "kv"), Error);
}

TEST(ModelBda, ConvertedGgufLoadsBackBitForBit) {
  const auto path = test::write_gguf(test::make_tiny(false), "bda_src.gguf", GgmlType::Q8_0);
  GgufFile src = GgufFile::open(path);
  LlamaModel m = LlamaModel::load(src);
  apply_bda(m, "vo");
  const std::string out = test::temp_path("bda_out.gguf");
  write_bda_gguf(src, m, out);
  GgufFile f = GgufFile::open(out);
  EXPECT_EQ(f.get_string("numattn.bda.pairs"), "vo");
  EXPECT_EQ(f.find_tensor("blk.0.attn_v.weight"), nullptr);
  ASSERT_NE(f.find_tensor("blk.1.attn_v_bd.coef"), nullptr);
  LlamaModel back = LlamaModel::load(f);
  for (const auto& L : back.weights().layers) ASSERT_TRUE(L.v_bd);
  const auto t = tokens(33);
  EXPECT_EQ(run(back, t), run(m, t));
  // Evaluating the converted file runs through the same perplexity path.
  PplOptions po;
  po.ctx = 16;
  const PplResult r = evaluate_perplexity(back, tokens(64), 1, false, po, ExecContext{1});
  EXPECT_TRUE(std::isfinite(r.ppl));
}

TEST(ModelBda, WritingOverTheSourceModelIsRefused) {
  const auto path = test::write_gguf(test::make_tiny(false), "bda_self.gguf", GgmlType::Q8_0);
  GgufFile src = GgufFile::open(path);
  LlamaModel m = LlamaModel::load(src);
  apply_bda(m, "vo");
  const auto size = std::filesystem::file_size(path);
  const std::filesystem::path p(path);
  for (const std::string& out : {path, (p.parent_path() / "." / p.filename()).string()}) {
    try {
      write_bda_gguf(src, m, out);
      ADD_FAILURE() << "overwrote the source model " << out;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("is the same file as the input source model"),
                std::string::npos)
          << e.what();
    }
  }
  EXPECT_EQ(std::filesystem::file_size(path), size);
  EXPECT_EQ(GgufFile::open(path).find_tensor("blk.0.attn_v_bd.coef"), nullptr);
}

TEST(ModelBda, CorruptBdaTensorsAreRejected) {
  const auto path = test::write_gguf(test::make_tiny(false), "bda_src2.gguf");
  GgufFile src = GgufFile::open(path);
  LlamaModel m = LlamaModel::load(src);
  apply_bda(m, "vo");
  const std::string out = test::temp_path("bda_bad.gguf");
  write_bda_gguf(src, m, out);
  // Rewrite with a permutation that repeats a channel.
  GgufFile good = GgufFile::open(out);
  GgufWriter w;
  for (const auto& [k, v] : good.metadata()) {
    if (k == "blk.0.attn_v_bd.perm") {
      std::vector<std::int32_t> p(32, 0);
      w.set(k, GgufValue::array(p));
    } else {
      w.set(k, v);
    }
  }
  for (const auto& t : good.tensors())
    w.add_tensor(t.name, t.type, t.ne, std::vector<std::uint8_t>(t.data, t.data + t.size_bytes));
  const std::string bad = test::temp_path("bda_bad2.gguf");
  w.write(bad);
  EXPECT_THROW(LlamaModel::load(bad), Error);
}

}  // namespace NUMATTN_UNITY_ID
}  // namespace
}  // namespace numattn
