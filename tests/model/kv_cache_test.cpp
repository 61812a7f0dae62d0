// Half-precision KV caches (KvCache's type): the element size in every byte count, decode over
// the halves equal to a prefill over the same rounded rows (exact.flash's key lanes read them in
// place, its prefill a widened copy; other methods a widened copy), the cost of the rounding
// bounded against the float32 cache, and layers that keep float32 rows refusing a half cache.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "numattn/core/error.h"
#include "numattn/model/llama.h"
#include "numattn/model/mla_convert.h"
#include "numattn/model/ppl.h"
#include "support/test_util.h"
#include "support/tiny_llama.h"

namespace numattn {
namespace {
namespace NUMATTN_UNITY_ID {

std::vector<std::int32_t> tokens(std::size_t n, std::int32_t vocab) {
  std::vector<std::int32_t> t(n);
  for (std::size_t i = 0; i < n; ++i) t[i] = static_cast<std::int32_t>((i * 37 + 11) % static_cast<std::size_t>(vocab));
  return t;
}

double max_abs_diff(const std::vector<float>& a, const std::vector<float>& b) {
  EXPECT_EQ(a.size(), b.size());
  double e = 0;
  for (std::size_t i = 0; i < std::min(a.size(), b.size()); ++i) e = std::max(e, double(std::abs(a[i] - b[i])));
  return e;
}

TEST(KvCacheHalf, BytesCountTheElementSize) {
  const test::TinyTensors T = test::make_tiny(false);
  const LlamaModel m = LlamaModel::load(test::write_gguf(T, "kv_bytes.gguf"), ExecContext{1});
  const std::int64_t f32 = m.kv_bytes_per_token();
  EXPECT_EQ(f32, T.hp.n_layer * 2 * T.hp.n_head_kv * T.hp.head_dim * 4);
  for (KvType t : {KvType::kF16, KvType::kBf16}) {
    EXPECT_EQ(m.kv_bytes_per_token(t), f32 / 2);
    const KvCache c = m.make_cache(10, t);
    EXPECT_EQ(c.bytes_per_token(), f32 / 2);
    EXPECT_EQ(c.type(), t);
  }
  EXPECT_EQ(m.make_cache(10).bytes_per_token(), f32);
}

// Every layer's arrays share one mapping: each starts on a 64-byte boundary, holds
// capacity·width elements of its type without touching another's, and a layer with no rows of
// a kind (an MLA layer's values) or a cache of the other type gives null.
TEST(KvCacheLayout, LayerArraysAreAlignedDisjointAndNullWhereAbsent) {
  const std::vector<CacheShape> shapes{{3, 5}, {7, 0}, {0, 0}, {1, 64}, {33, 33}};
  for (KvType t : {KvType::kF32, KvType::kF16, KvType::kBf16}) {
    for (std::int64_t cap : {1, 3, 1000, 4000}) {  // 4000: float32 over 2 MiB, a huge-page mapping
      KvCache c(shapes, cap, t);
      const std::size_t elem = static_cast<std::size_t>(kv_type_bytes(t));
      std::vector<std::pair<const char*, const char*>> spans;
      for (int l = 0; l < static_cast<int>(shapes.size()); ++l) {
        const bool f32 = t == KvType::kF32;
        const void* k = f32 ? static_cast<void*>(c.k(l)) : static_cast<void*>(c.k16(l));
        const void* v = f32 ? static_cast<void*>(c.v(l)) : static_cast<void*>(c.v16(l));
        EXPECT_EQ(f32 ? static_cast<void*>(c.k16(l)) : static_cast<void*>(c.k(l)), nullptr);
        EXPECT_EQ(f32 ? static_cast<void*>(c.v16(l)) : static_cast<void*>(c.v(l)), nullptr);
        for (auto [p, w] : {std::pair{k, shapes[l].k}, std::pair{v, shapes[l].v}}) {
          if (w == 0) {
            EXPECT_EQ(p, nullptr) << "layer " << l;
            continue;
          }
          ASSERT_NE(p, nullptr) << "layer " << l;
          EXPECT_EQ(reinterpret_cast<std::uintptr_t>(p) % 64, 0u) << "layer " << l;
          const char* b = static_cast<const char*>(p);
          spans.emplace_back(b, b + static_cast<std::size_t>(cap * w) * elem);
          // Writable end to end (ASan would see an array running past the mapping).
          std::fill(const_cast<char*>(b), const_cast<char*>(spans.back().second), char(l + 1));
        }
      }
      std::sort(spans.begin(), spans.end());
      for (std::size_t i = 1; i < spans.size(); ++i) EXPECT_LE(spans[i - 1].second, spans[i].first);
      // Each array still holds its own bytes after every other was written.
      for (int l = 0; l < static_cast<int>(shapes.size()); ++l) {
        const char* k = t == KvType::kF32 ? reinterpret_cast<const char*>(c.k(l)) : reinterpret_cast<const char*>(c.k16(l));
        if (k != nullptr)
          EXPECT_TRUE(std::all_of(k, k + static_cast<std::size_t>(cap * shapes[l].k) * elem,
                                  [&](char x) { return x == char(l + 1); }))
              << "layer " << l;
      }
    }
  }
}

TEST(KvCacheHalf, DecodeOverHalvesEqualsPrefillAndStaysNearFloat32) {
  const test::TinyTensors T = test::make_tiny(false);
  const ExecContext ctx{2};
  LlamaModel m = LlamaModel::load(test::write_gguf(T, "kv_half.gguf"), ctx);
  const auto toks = tokens(40, static_cast<std::int32_t>(T.hp.n_vocab));
  KvCache f = m.make_cache(40);
  const std::vector<float> ref32 = m.forward(toks, f, ctx);
  double big = 0;
  for (float x : ref32) big = std::max(big, double(std::abs(x)));
  for (KvType t : {KvType::kF32, KvType::kF16, KvType::kBf16})
    for (const char* spec : {"exact.flash", "exact.naive", "sparse.window(left=9,sinks=3)"}) {
      SCOPED_TRACE(fmt::format("{} {}", to_string(t), spec));
      m.set_attention(spec);
      KvCache full = m.make_cache(40, t);
      const std::vector<float> pre = m.forward(toks, full, ctx);
      // A prefill of 5 tokens, then one at a time: every K/V row was rounded the same way.
      KvCache c = m.make_cache(40, t);
      std::vector<float> got = m.forward({toks.begin(), toks.begin() + 5}, c, ctx);
      for (std::size_t i = 5; i < toks.size(); ++i) {
        const auto one = m.forward({toks[i]}, c, ctx);
        got.insert(got.end(), one.begin(), one.end());
      }
      // Summation order only (float32, relative to the logits' size).
      // float32: summation order only. Half precision: a K or V element that float32 summation
      // order moves across a rounding boundary (prefill and decode multiply the weights in
      // other orders) changes by one unit u of the half type, which moves later logits by up
      // to about u times their size. (The kernels themselves: exact_half_kv_test.cpp, bitwise.)
      const double u = t == KvType::kF16 ? 0x1p-11 : t == KvType::kBf16 ? 0x1p-8 : 0.0;
      EXPECT_LT(max_abs_diff(got, pre), (2e-6 + 2 * u) * std::max(1.0, big));
      // The rounding of K and V (relative error u) moves the logits by a few u times their size;
      // exact attention only (the window is not exact).
      if (std::string(spec) != "exact.flash" || t == KvType::kF32) continue;
      const double d = max_abs_diff(pre, ref32);
      EXPECT_GT(d, 0.0);  // the cache is really rounded
      EXPECT_LT(d, 8 * u * big);
    }
}

TEST(KvCacheHalf, PerplexityReportsTheCostOfTheCacheType) {
  const test::TinyTensors T = test::make_tiny(false);
  const ExecContext ctx{2};
  const LlamaModel m = LlamaModel::load(test::write_gguf(T, "kv_ppl.gguf"), ctx);
  const auto toks = tokens(64, static_cast<std::int32_t>(T.hp.n_vocab));
  PplOptions o;
  o.ctx = 16;
  o.chunks = 2;
  o.bos = BosMode::kKeep;
  const PplResult f32 = evaluate_perplexity(m, toks, -1, false, o, ctx);
  EXPECT_FALSE(f32.has_baseline);
  o.kv = KvType::kF16;
  const PplResult f16 = evaluate_perplexity(m, toks, -1, false, o, ctx);
  ASSERT_TRUE(f16.has_baseline);
  EXPECT_EQ(f16.kv, KvType::kF16);
  EXPECT_EQ(f16.baseline_kv, KvType::kF32);
  EXPECT_DOUBLE_EQ(f16.ppl_baseline, f32.ppl);  // the baseline is the float32 run
  EXPECT_GT(f16.kld_mean, 0.0);
  EXPECT_LT(f16.kld_mean, 1e-4);
}

TEST(KvCacheHalf, MlaLayersTakeAHalfCache) {
  const test::TinyTensors T = test::make_tiny(false);
  LlamaModel mm = LlamaModel::load(test::write_gguf(T, "kv_mla.gguf"), ExecContext{1});
  transform::MlaOptions opt;
  convert_model_to_mla(mm, {}, opt, ExecContext{1});
  for (KvType t : {KvType::kF16, KvType::kBf16}) {
    const KvCache c = mm.make_cache(8, t);
    EXPECT_EQ(c.bytes_per_token(), mm.kv_bytes_per_token(KvType::kF32) / 2);
    EXPECT_EQ(c.bytes_per_token(), mm.kv_bytes_per_token(t));
  }
}

}  // namespace NUMATTN_UNITY_ID
}  // namespace
}  // namespace numattn
