// topk_recall: the probe V = I turns any method's output row into its attention row. Checked on
// methods whose attention rows are known in closed form: exact attention and top-k keep every top
// key; a causal sliding window keeps exactly the top keys that fall inside its band.
#include <gtest/gtest.h>

#include <algorithm>
#include <numeric>
#include <vector>

#include "numattn/analysis/metrics.h"
#include "numattn/attention/registry.h"
#include "support/test_util.h"

namespace numattn {
namespace {
namespace NUMATTN_UNITY_ID {

ProblemConfig config(Causal causal, index_t n, index_t nk) {
  ProblemConfig c;
  c.heads = 2;
  c.kv_heads = 1;
  c.n = n;
  c.n_kv = nk;
  c.d = 16;
  c.dv = 8;
  c.seed = 11;
  c.causal = causal;
  return c;
}

TEST(TopkRecall, ExactAttentionAndTopkKeepEveryTopKey) {
  RandomProblem prob(config(Causal::kNone, 96, 130));
  for (const char* spec : {"exact.flash", "sparse.topk(k=8)"}) {
    const RecallMetrics m = topk_recall(*create_method(spec), prob.problem(), 8, 40, 3, ExecContext{2});
    EXPECT_EQ(m.rows, 40) << spec;
    EXPECT_DOUBLE_EQ(m.recall, 1.0) << spec;
  }
}

TEST(TopkRecall, CausalWindowKeepsTheTopKeysInsideItsBand) {
  const index_t n = 120, left = 10, k = 6;
  RandomProblem prob(config(Causal::kTopLeft, n, n));
  const AttentionProblem& p = prob.problem();
  const RecallMetrics m = topk_recall(*create_method("sparse.window(left=10,right=0,sinks=0)"), p, k, n,
                                      5, ExecContext{1});
  // Transcription: for every row, the true top-k of head 0 among keys j ≤ i by float64 logits,
  // and how many of them lie in [i − left, i]; rows with fewer than k visible keys shrink k.
  double sum = 0;
  for (index_t i = 0; i < n; ++i) {
    std::vector<double> s(static_cast<std::size_t>(i + 1));
    for (index_t j = 0; j <= i; ++j) {
      double t = 0;
      for (index_t c = 0; c < p.d_qk(); ++c) t += static_cast<double>(p.q(0, 0, i, c)) * p.k(0, 0, j, c);
      s[static_cast<std::size_t>(j)] = t;
    }
    const index_t kr = std::min(k, i + 1);
    std::vector<index_t> idx(static_cast<std::size_t>(i + 1));
    std::iota(idx.begin(), idx.end(), index_t{0});
    std::sort(idx.begin(), idx.end(), [&](index_t a, index_t b) { return s[a] > s[b]; });
    index_t inside = 0;
    for (index_t t = 0; t < kr; ++t) inside += idx[static_cast<std::size_t>(t)] >= i - left;
    sum += static_cast<double>(inside) / static_cast<double>(kr);
  }
  EXPECT_EQ(m.rows, n);
  EXPECT_NEAR(m.recall, sum / static_cast<double>(n), 1e-12);
  EXPECT_LT(m.recall, 0.9);  // the band misses top keys: the measure can fail
}

TEST(TopkRecall, RefusesBadArguments) {
  RandomProblem prob(config(Causal::kNone, 8, 8));
  EXPECT_THROW(topk_recall(*create_method("exact.flash"), prob.problem(), 0, 4, 1, ExecContext{1}), Error);
  RandomProblem big(config(Causal::kNone, 2, 8193));
  EXPECT_THROW(topk_recall(*create_method("exact.flash"), big.problem(), 4, 2, 1, ExecContext{1}), Error);
}

}  // namespace NUMATTN_UNITY_ID
}  // namespace
}  // namespace numattn
