// blocks::flash_attention_selected on every CPU path this machine runs: each (batch, kv head,
// query) group attends exactly to the key ranges its selector gives (intersected with each row's
// visible range), checked against a float64 loop over those keys: random, empty, single-key,
// adjacent and whole selections; GQA ratios including a group wider than one 64-row block;
// Nq > 1 (a prefill) and Nq > Nk (rows with no visible key); causal; float32 and binary16 K/V;
// one and two threads and forced splits (the partial states merged by log-sum-exp).
#include "numattn/attention/blocks/flash.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "numattn/attention/random_problem.h"
#include "numattn/core/cpu.h"
#include "numattn/core/rng.h"
#include "numattn/quant/quant.h"
#include "support/test_util.h"

namespace numattn {
namespace {
namespace NUMATTN_UNITY_ID {

/// A deterministic selection of group (b, hk, qi): sorted disjoint ranges of [0, nk) drawn from
/// the group's own counter, or none, or all, or one key, depending on the group.
std::vector<KeyRange> selection(index_t nk, index_t b, index_t hk, index_t qi, std::uint64_t seed) {
  std::vector<KeyRange> out;
  const std::uint64_t g = seed * 1000003u + static_cast<std::uint64_t>((b * 97 + hk) * 131 + qi);
  switch (g % 7) {
    case 0: return out;                   // nothing selected
    case 1: out.push_back({0, nk}); return out;  // everything
    case 2: out.push_back({nk / 2, nk / 2 + 1}); return out;  // one key
    default: break;
  }
  std::uint64_t state = g;
  index_t at = 0;
  while (at < nk) {
    state = state * 6364136223846793005ULL + 1442695040888963407ULL;
    const index_t gap = static_cast<index_t>((state >> 33) % 23), len = 1 + static_cast<index_t>((state >> 13) % 40);
    const index_t b0 = at + gap, e0 = std::min(nk, b0 + len);
    if (b0 >= nk) break;
    // Adjacent ranges stay separate on purpose (gap 0): the kernel must not double count.
    out.push_back({b0, e0});
    at = e0;
  }
  return out;
}

struct Case {
  index_t batch, hq, hkv, nq, nk, d, dv;
  Causal causal;
};

TEST(FlashSelected, AttendsExactlyTheSelectedKeysOnEveryPath) {
  const std::vector<Case> cases = {
      {1, 9, 3, 1, 1000, 64, 64, Causal::kNone},         // SmolLM2's decode step
      {2, 8, 2, 1, 300, 59, 33, Causal::kBottomRight},   // G = 4, odd D, Dk != Dv
      {1, 4, 4, 5, 129, 16, 16, Causal::kTopLeft},       // Nq > 1 causal
      {1, 6, 2, 7, 3, 8, 8, Causal::kTopLeft},           // Nq > Nk: rows with no visible key
      {1, 80, 1, 2, 200, 32, 32, Causal::kBottomRight},  // G = 80: two row blocks per group
      {1, 1, 1, 1, 1, 64, 64, Causal::kNone},            // one key
  };
  const std::uint64_t seed0 = test::base_seed() + 7700;
  int checked = 0;
  for (CpuPath path : runnable_cpu_paths()) {
    const CpuPathScope scope(path);
    for (std::size_t ci = 0; ci < cases.size(); ++ci) {
      const Case& c = cases[ci];
      ProblemConfig cfg;
      cfg.batch = c.batch, cfg.heads = c.hq, cfg.kv_heads = c.hkv, cfg.n = c.nq, cfg.n_kv = c.nk, cfg.d = c.d,
      cfg.dv = c.dv, cfg.causal = c.causal, cfg.seed = seed0 + ci, cfg.logit_scale = ci == 1 ? 30.0 : 1.0;
      RandomProblem rp(cfg);
      for (const bool half : {false, true}) {
        std::vector<std::uint16_t> k16, v16;
        AttentionProblem p = rp.problem();
        if (half) {
          for (float x : rp.k_data()) k16.push_back(fp32_to_fp16(x));
          for (float x : rp.v_data()) v16.push_back(fp32_to_fp16(x));
          p.k.data = nullptr, p.v.data = nullptr;
          p.half = HalfKv{KvType::kF16, k16.data(), v16.data()};
        }
        const auto key = [&](index_t b, index_t h, index_t j, index_t d) -> double {
          return half ? fp16_to_fp32(k16[static_cast<std::size_t>(((b * c.hkv + h) * c.nk + j) * c.d + d)])
                      : rp.problem().k(b, h, j, d);
        };
        const auto val = [&](index_t b, index_t h, index_t j, index_t d) -> double {
          return half ? fp16_to_fp32(v16[static_cast<std::size_t>(((b * c.hkv + h) * c.nk + j) * c.dv + d)])
                      : rp.problem().v(b, h, j, d);
        };
        for (const int threads : {1, 2})
          for (const index_t split : {index_t{0}, index_t{3}}) {
            const blocks::SelectKeys sel = [&](index_t b, index_t hk, index_t qi, std::vector<KeyRange>& out) {
              out = selection(c.nk, b, hk, qi, seed0 + ci);
            };
            blocks::FlashConfig fc;
            fc.split_kv = split;
            fc.block_k = ci % 2 ? 16 : 256;
            blocks::flash_attention_selected(p, sel, fc, ExecContext{threads});
            const index_t G = c.hq / c.hkv;
            for (index_t b = 0; b < c.batch; ++b)
              for (index_t h = 0; h < c.hq; ++h)
                for (index_t i = 0; i < c.nq; ++i) {
                  const KeyRange vis = p.key_range(i);
                  std::vector<double> s;
                  std::vector<index_t> js;
                  for (const KeyRange& r : selection(c.nk, b, h / G, i, seed0 + ci))
                    for (index_t j = std::max(r.begin, vis.begin); j < std::min(r.end, vis.end); ++j) {
                      double dot = 0;
                      for (index_t d = 0; d < c.d; ++d) dot += static_cast<double>(p.q(b, h, i, d)) * key(b, h / G, j, d);
                      s.push_back(dot * p.effective_scale());
                      js.push_back(j);
                    }
                  const float* o = p.out.row(b, h, i);
                  const std::string where = std::string(cpu_path_name(path)) + " case " + std::to_string(ci) +
                                            (half ? " f16" : " f32") + " threads " + std::to_string(threads) +
                                            " split " + std::to_string(split) + " b,h,i " + std::to_string(b) +
                                            "," + std::to_string(h) + "," + std::to_string(i);
                  if (s.empty()) {
                    for (index_t d = 0; d < c.dv; ++d) ASSERT_EQ(o[d], 0.f) << where;
                    ASSERT_EQ(p.lse(b, h, i, 0), -std::numeric_limits<float>::infinity()) << where;
                    continue;
                  }
                  const double mx = *std::max_element(s.begin(), s.end());
                  double l = 0;
                  for (double x : s) l += std::exp(x - mx);
                  for (index_t d = 0; d < c.dv; ++d) {
                    double acc = 0;
                    for (std::size_t u = 0; u < s.size(); ++u) acc += std::exp(s[u] - mx) * val(b, h / G, js[u], d);
                    ASSERT_NEAR(o[d], acc / l, 2e-5 * (1 + std::abs(acc / l))) << where << " d " << d;
                  }
                  ASSERT_NEAR(p.lse(b, h, i, 0), mx + std::log(l), 2e-5 * (1 + std::abs(mx))) << where;
                  ++checked;
                }
          }
      }
    }
  }
  EXPECT_GT(checked, 1000);
}

}  // namespace NUMATTN_UNITY_ID
}  // namespace
}  // namespace numattn
