#include "numattn/model/ppl.h"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <cmath>

#include "numattn/core/error.h"
#include "numattn/core/rng.h"
#include "numattn/model/data.h"
#include "support/test_util.h"

namespace numattn {
namespace {

// A small random model built in memory; `zero_output` makes every logit 0 (uniform softmax).
LlamaModel small_model(bool zero_output) {
  LlamaHParams h;
  h.n_vocab = 50;
  h.n_embd = 16;
  h.n_layer = 2;
  h.n_ff = 24;
  h.n_head = 4;
  h.n_head_kv = 1;
  h.head_dim = 4;
  h.n_rot = 4;
  LlamaWeights w;
  std::uint64_t s = 0;
  auto rnd = [&](std::int64_t n, float scale, float off = 0.f) {
    std::vector<float> v(static_cast<std::size_t>(n));
    fill_normal(v, 99, s++);
    for (float& x : v) x = x * scale + off;
    return v;
  };
  w.token_embd = rnd(h.n_vocab * h.n_embd, 1.f);
  w.output_norm = rnd(h.n_embd, 0.1f, 1.f);
  w.output = zero_output ? std::vector<float>(static_cast<std::size_t>(h.n_vocab * h.n_embd), 0.f)
                         : rnd(h.n_vocab * h.n_embd, 0.5f);
  for (int l = 0; l < h.n_layer; ++l) {
    LlamaLayer L;
    L.attn_norm = rnd(h.n_embd, 0.1f, 1.f);
    L.ffn_norm = rnd(h.n_embd, 0.1f, 1.f);
    L.wqkv = rnd(h.qkv_rows() * h.n_embd, 0.5f);
    L.wo = rnd(h.n_embd * h.n_head * h.head_dim, 0.25f);
    L.w_gate_up = rnd(2 * h.n_ff * h.n_embd, 0.25f);
    L.w_down = rnd(h.n_embd * h.n_ff, 0.2f);
    w.layers.push_back(std::move(L));
  }
  return LlamaModel(h, std::move(w));
}

std::vector<std::int32_t> stream(std::size_t n) {
  CounterRng r(3, 0);
  std::vector<std::int32_t> t(n);
  for (std::size_t i = 0; i < n; ++i) t[i] = static_cast<std::int32_t>(r.uniform(i) * 50) % 50;
  return t;
}

TEST(Perplexity, UniformLogitsGiveVocabularySize) {
  LlamaModel m = small_model(true);
  PplOptions o;
  o.ctx = 16;
  const PplResult r = evaluate_perplexity(m, stream(100), 0, false, o, ExecContext{2});
  EXPECT_EQ(r.chunks, 6);  // 100 / 16, remainder dropped
  EXPECT_EQ(r.tokens_scored, 6 * (16 - 1 - 8));
  EXPECT_NEAR(r.ppl, 50.0, 1e-9 * 50);
  EXPECT_NEAR(r.ppl_stderr, 0.0, 1e-5);  // E[x²]−E[x]² cancels to rounding
}

TEST(Perplexity, MatchesDirectComputationAndStderrFormula) {
  LlamaModel m = small_model(false);
  const auto toks = stream(64);
  PplOptions o;
  o.ctx = 20;
  o.chunks = 2;
  const PplResult r = evaluate_perplexity(m, toks, 7, false, o, ExecContext{1});
  ASSERT_EQ(r.tokens_scored, 2 * 9);
  // Recompute: chunk c, first token replaced by BOS (7), score positions 10..18 -> 11..19.
  std::vector<double> nll;
  for (int c = 0; c < 2; ++c) {
    std::vector<std::int32_t> ch(toks.begin() + c * 20, toks.begin() + (c + 1) * 20);
    ch[0] = 7;
    KvCache kv = m.make_cache(20);
    const auto lg = m.forward(ch, kv, ExecContext{1});
    std::vector<double> row;
    for (int j = 10; j < 19; ++j) {
      log_softmax(lg.data() + j * 50, 50, row);
      nll.push_back(-row[static_cast<std::size_t>(ch[j + 1])]);
    }
  }
  double s = 0, s2 = 0;
  for (double v : nll) s += v, s2 += v * v;
  const double n = static_cast<double>(nll.size()), mean = s / n;
  EXPECT_NEAR(r.ppl, std::exp(mean), 1e-4 * std::exp(mean));
  EXPECT_NEAR(r.ppl_stderr, std::exp(mean) * std::sqrt((s2 / n - mean * mean) / (n - 1)), 1e-4);
  // keep: the first token is not replaced, so results differ.
  o.bos = BosMode::kKeep;
  EXPECT_NE(evaluate_perplexity(m, toks, 7, false, o, ExecContext{1}).ppl, r.ppl);
  // auto follows add_bos.
  o.bos = BosMode::kAuto;
  EXPECT_EQ(evaluate_perplexity(m, toks, 7, true, o, ExecContext{1}).ppl, r.ppl);
}

TEST(Perplexity, KlAgainstBaseline) {
  LlamaModel m = small_model(false);
  PplOptions o;
  o.ctx = 32;
  o.attn = "exact.naive";
  o.baseline = "exact.flash";
  const PplResult r = evaluate_perplexity(m, stream(128), 0, false, o, ExecContext{2});
  EXPECT_TRUE(r.has_baseline);
  EXPECT_LT(r.kld_mean, 1e-9);
  EXPECT_LT(r.kld_p99, 1e-9);
  EXPECT_EQ(r.top1_agreement, 1.0);
  EXPECT_NEAR(r.ppl, r.ppl_baseline, 1e-5 * r.ppl);
  EXPECT_NE(m.attention_spec().find("naive"), std::string::npos);  // restored after baseline
}

TEST(Perplexity, RefusesShortText) {
  LlamaModel m = small_model(false);
  PplOptions o;
  o.ctx = 64;
  EXPECT_THROW(evaluate_perplexity(m, stream(100), 0, false, o, ExecContext{1}), Error);
}

}  // namespace
}  // namespace numattn

// ---- CLI, on the default model (skipped when it is not cached) ------------------------------

namespace numattn {
namespace {

bool default_data_cached() {
  try {
    default_model_path();
    default_text_path();
    return true;
  } catch (const Error&) {
    return false;
  }
}

TEST(PerplexityCli, JsonFieldsOnTheDefaultModel) {
  if (!default_data_cached()) GTEST_SKIP() << "default model/text not cached";
  std::string out;
  const int rc = test::run_command(std::string(NUMATTN_CLI_PATH) +
                                       " ppl --model default --text default --ctx 64 --chunks 2"
                                       " --attn exact.naive --baseline exact.flash --threads 2"
                                       " --format json --no-progress",
                                   &out);
  ASSERT_EQ(rc, 0) << out;
  const auto j = nlohmann::json::parse(out);
  for (const char* k : {"model", "text", "ctx", "chunks", "tokens_scored", "ppl", "ppl_stderr",
                        "kld_mean", "kld_p99", "top1_agreement", "tokens_per_s", "attn",
                        "gemm_gflops", "roofline_tokens_per_s"})
    EXPECT_TRUE(j.contains(k)) << k;
  EXPECT_EQ(j["tokens_scored"], 2 * (64 - 1 - 32));
  EXPECT_TRUE(std::isfinite(j["ppl"].get<double>()));
  EXPECT_GT(j["ppl"].get<double>(), 1.0);
  EXPECT_LT(j["kld_mean"].get<double>(), 1e-6);
  EXPECT_GE(j["top1_agreement"].get<double>(), 0.999);
}

TEST(PerplexityCli, TokenizeAndGenerate) {
  if (!default_data_cached()) GTEST_SKIP() << "default model not cached";
  std::string out;
  ASSERT_EQ(test::run_command(std::string(NUMATTN_CLI_PATH) +
                                  " tokenize --model default --text 'Hello world'",
                              &out),
            0);
  EXPECT_EQ(nlohmann::json::parse(out)["ids"], (std::vector<int>{19556, 905}));
  ASSERT_EQ(test::run_command(std::string(NUMATTN_CLI_PATH) +
                                  " generate --model default --prompt 'The capital of France is'"
                                  " --max-tokens 3 --threads 2 --format json",
                              &out),
            0);
  EXPECT_NE(nlohmann::json::parse(out)["text"].get<std::string>().find("Paris"), std::string::npos);
}

}  // namespace
}  // namespace numattn
