// sparse.quest beyond the registry-wide conformance: the page summaries it keeps across decode
// steps give bitwise the result of summaries computed afresh, half-precision K/V give bitwise the
// result on the widened copy, and it reads sinks, recent keys, chosen pages and summaries only.
#include <gtest/gtest.h>

#include <cstring>
#include <vector>

#include "numattn/attention/kv_reads.h"
#include "numattn/attention/registry.h"
#include "numattn/core/rng.h"
#include "numattn/quant/quant.h"
#include "support/test_util.h"

namespace numattn {
namespace {
namespace NUMATTN_UNITY_ID {

constexpr const char* kSpec = "sparse.quest(page=8,pages=3,sinks=2,recent=8)";

/// A KV cache of `cap` positions of [position, kv head, dim] rows (float32 and f16 copies) and
/// one query row per step; problem(n) is the decode step over its first n positions.
struct Cache {
  index_t hq = 6, hkv = 2, d = 24, cap = 120;
  std::vector<float> q, k, v, out;
  std::vector<std::uint16_t> k16, v16;
  explicit Cache(std::uint64_t seed) {
    auto fill = [&](std::vector<float>& x, std::size_t n, std::uint64_t stream) {
      x.resize(n);
      fill_normal(std::span<float>(x), seed, stream);
    };
    fill(q, static_cast<std::size_t>(hq * d), 0);
    fill(k, static_cast<std::size_t>(cap * hkv * d), 1);
    fill(v, static_cast<std::size_t>(cap * hkv * d), 2);
    for (float x : k) k16.push_back(fp32_to_fp16(x));
    for (float x : v) v16.push_back(fp32_to_fp16(x));
    out.assign(static_cast<std::size_t>(hq * d), 0.f);
  }
  AttentionProblem problem(index_t n, bool half) {
    AttentionProblem p;
    p.q = TensorView<const float>(q.data(), {1, hq, 1, d}, {hq * d, d, hq * d, 1});
    p.k = TensorView<const float>(half ? nullptr : k.data(), {1, hkv, n, d}, {n * hkv * d, d, hkv * d, 1});
    p.v = TensorView<const float>(half ? nullptr : v.data(), {1, hkv, n, d}, {n * hkv * d, d, hkv * d, 1});
    p.out = TensorView<float>(out.data(), {1, hq, 1, d}, {hq * d, d, hq * d, 1});
    p.causal = Causal::kBottomRight;
    if (half) p.half = HalfKv{KvType::kF16, k16.data(), v16.data()};
    return p;
  }
};

TEST(SparseQuest, KeptSummariesEqualFreshOnesStepByStep) {
  for (bool half : {false, true}) {
    SCOPED_TRACE(half ? "f16" : "f32");
    Cache c(test::base_seed() + 2800);
    const auto kept = create_method(kSpec);  // one instance over the whole decode
    for (index_t n = 30; n < c.cap; ++n) {
      kept->run(c.problem(n, half), ExecContext{2});
      const std::vector<float> a = c.out;
      create_method(kSpec)->run(c.problem(n, half), ExecContext{2});
      ASSERT_EQ(std::memcmp(a.data(), c.out.data(), a.size() * sizeof(float)), 0) << "n = " << n;
    }
  }
}

TEST(SparseQuest, HalvesGiveTheResultOfTheirWidenedCopy) {
  Cache c(test::base_seed() + 2801);
  for (index_t n : {1, 17, 64, 119}) {
    const auto m = create_method(kSpec);
    m->run(c.problem(n, true), ExecContext{1});
    const std::vector<float> a = c.out;
    const WidenedKv w = widen_kv(c.problem(n, true));
    create_method(kSpec)->run(w.problem, ExecContext{1});
    EXPECT_EQ(std::memcmp(a.data(), c.out.data(), a.size() * sizeof(float)), 0) << "n = " << n;
  }
}

TEST(SparseQuest, ReadsSinksRecentPagesAndSummaries) {
  Cache c(test::base_seed() + 2802);
  const auto m = create_method(kSpec);
  // Up to 2 + 8 + 3·8 = 34 keys a row sees all of them; beyond, those plus ⌈2·Dk / (Dk + Dv)⌉
  // rows per page for its summaries (one here, Dk = Dv, in the cache's element type).
  EXPECT_EQ(kv_rows_read(*m, c.problem(20, false), 0), 20);
  EXPECT_EQ(kv_rows_read(*m, c.problem(34, false), 0), 34);
  EXPECT_EQ(kv_rows_read(*m, c.problem(100, false), 0), 34 + 13);
  EXPECT_EQ(kv_rows_read(*m, c.problem(100, true), 0), 34 + 13);
}

}  // namespace NUMATTN_UNITY_ID
}  // namespace
}  // namespace numattn
