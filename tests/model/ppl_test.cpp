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
namespace NUMATTN_UNITY_ID {

// A small random model built in memory; `zero_output` makes every logit 0 (uniform softmax).
LlamaModel small_model(bool zero_output) {
  ModelHParams h;
  h.n_vocab = 50;
  h.n_embd = 16;
  h.n_layer = 2;
  h.n_ff = 24;
  h.n_head = 4;
  h.n_head_kv = 1;
  h.head_dim = 4;
  h.n_rot = 4;
  h.n_ctx_train = 64;
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
  o.bos = BosMode::kReplace;
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
  const double keep = evaluate_perplexity(m, toks, 7, false, o, ExecContext{1}).ppl;
  EXPECT_NE(keep, r.ppl);
  // auto follows add_bos.
  o.bos = BosMode::kAuto;
  EXPECT_EQ(evaluate_perplexity(m, toks, 7, true, o, ExecContext{1}).ppl, r.ppl);
  EXPECT_EQ(evaluate_perplexity(m, toks, 7, false, o, ExecContext{1}).ppl, keep);
}

TEST(Perplexity, DefaultBosFollowsTheFile) {
  // The file's add_bos_token rule is the default (llama.cpp's): no BOS when it says false.
  LlamaModel m = small_model(false);
  const auto toks = stream(64);
  PplOptions o;
  o.ctx = 20;
  EXPECT_EQ(o.bos, BosMode::kAuto);
  const double dflt_no = evaluate_perplexity(m, toks, 7, false, o, ExecContext{1}).ppl;
  const double dflt_yes = evaluate_perplexity(m, toks, 7, true, o, ExecContext{1}).ppl;
  o.bos = BosMode::kKeep;
  EXPECT_EQ(dflt_no, evaluate_perplexity(m, toks, 7, true, o, ExecContext{1}).ppl);
  o.bos = BosMode::kReplace;
  EXPECT_EQ(dflt_yes, evaluate_perplexity(m, toks, 7, false, o, ExecContext{1}).ppl);
  EXPECT_EQ(parse_bos_mode("auto"), BosMode::kAuto);
  try {
    parse_bos_mode("always");
    FAIL();
  } catch (const OptionError& e) {
    EXPECT_EQ(e.option(), "bos");
  }
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
  EXPECT_NE(r.attn_spec.find("naive"), std::string::npos);
  EXPECT_NE(r.baseline_spec.find("flash"), std::string::npos);
}

TEST(Perplexity, RefusesShortText) {
  LlamaModel m = small_model(false);
  PplOptions o;
  o.ctx = 64;
  EXPECT_THROW(evaluate_perplexity(m, stream(100), 0, false, o, ExecContext{1}), Error);
}

// The option that check_ppl_options (or evaluate_perplexity) names for `o`, "" if none.
std::string refused_option(const PplOptions& o, const ModelHParams* hp = nullptr) {
  try {
    check_ppl_options(o, hp);
  } catch (const OptionError& e) {
    return e.option() + ": " + e.detail();
  }
  return "";
}

TEST(Perplexity, OptionsAreCheckedBeforeAnyWork) {
  const LlamaModel m = small_model(false);  // n_ctx_train 64, 2 layers
  auto with = [](auto change) {
    PplOptions o;
    o.ctx = 32;
    change(o);
    return o;
  };
  EXPECT_EQ(refused_option(with([](PplOptions&) {})), "");
  EXPECT_EQ(refused_option(with([](PplOptions& o) { o.ctx = 0; })).rfind("ctx: ", 0), 0u);
  EXPECT_EQ(refused_option(with([](PplOptions& o) { o.ctx = -512; })).rfind("ctx: ", 0), 0u);
  EXPECT_EQ(refused_option(with([](PplOptions& o) { o.ctx = 3; })).rfind("ctx: ", 0), 0u);
  EXPECT_EQ(refused_option(with([](PplOptions& o) { o.chunks = 0; })).rfind("chunks: ", 0), 0u);
  EXPECT_EQ(refused_option(with([](PplOptions& o) { o.chunks = -2; })).rfind("chunks: ", 0), 0u);
  EXPECT_EQ(refused_option(with([](PplOptions& o) { o.attn = "exact.nope"; })).rfind("attn: ", 0), 0u);
  EXPECT_EQ(refused_option(with([](PplOptions& o) { o.baseline = "exact.flash(x=1)"; })).rfind("baseline: ", 0), 0u);
  // Against the model: a per-layer list of the wrong length, and the trained context.
  const ModelHParams& hp = m.hparams();
  EXPECT_EQ(refused_option(with([](PplOptions& o) { o.attn = "exact.flash;exact.flash;exact.flash"; }), &hp).rfind("attn: ", 0), 0u);
  const std::string longer = refused_option(with([](PplOptions& o) { o.ctx = 65; }), &hp);
  EXPECT_EQ(longer.rfind("ctx: ", 0), 0u) << longer;
  EXPECT_NE(longer.find("64"), std::string::npos) << longer;
  EXPECT_NE(longer.find("llama.context_length"), std::string::npos) << longer;
  EXPECT_NE(longer.find("`allow_long_ctx`"), std::string::npos) << longer;
  EXPECT_EQ(refused_option(with([](PplOptions& o) { o.ctx = 65; o.allow_long_ctx = true; }), &hp), "");
  // evaluate_perplexity applies the same checks.
  PplOptions o = with([](PplOptions& x) { x.ctx = 65; });
  EXPECT_THROW(evaluate_perplexity(m, stream(200), 0, false, o, ExecContext{1}), OptionError);
  o.allow_long_ctx = true;
  EXPECT_NO_THROW(evaluate_perplexity(m, stream(200), 0, false, o, ExecContext{1}));
}

TEST(Perplexity, EvaluationNeverChangesTheModel) {
  // The attention of the evaluation (and of the baseline) is passed per forward call, so an
  // exception in the middle leaves the model as it was; so does a normal run.
  LlamaModel m = small_model(false);
  m.set_attention("exact.reference");
  PplOptions o;
  o.ctx = 16;
  o.attn = "exact.naive";
  o.baseline = "exact.flash";
  int chunks_done = 0;
  o.after_chunk = [&] {
    if (++chunks_done == 2) throw Error("interrupted");
  };
  EXPECT_THROW(evaluate_perplexity(m, stream(100), 0, false, o, ExecContext{2}), Error);
  EXPECT_EQ(chunks_done, 2);
  EXPECT_EQ(m.attention_spec(), "exact.reference");
  o.after_chunk = nullptr;
  const PplResult r = evaluate_perplexity(m, stream(100), 0, false, o, ExecContext{2});
  EXPECT_EQ(m.attention_spec(), "exact.reference");
  EXPECT_NE(r.attn_spec.find("naive"), std::string::npos);
  EXPECT_NE(r.baseline_spec.find("flash"), std::string::npos);
}

TEST(Perplexity, NonFiniteLogitsAreAnErrorNamingThePosition) {
  // Finite weights whose logits overflow float32 (|w_out| = 3e38): the evaluation must fail,
  // naming where, instead of reporting a NaN or infinite perplexity.
  const LlamaModel good = small_model(false);
  LlamaWeights w = good.weights();
  for (float& x : w.output) x = x > 0 ? 3e38f : -3e38f;
  const LlamaModel bad(good.hparams(), std::move(w));
  KvCache c = bad.make_cache(8);
  try {
    bad.forward({1, 2, 3}, c, ExecContext{1});
    FAIL() << "non-finite logits returned";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("non-finite logit"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("position 0"), std::string::npos) << e.what();
  }
  EXPECT_EQ(c.n_past(), 0);  // the cache did not advance
  PplOptions o;
  o.ctx = 16;
  try {
    evaluate_perplexity(bad, stream(100), 0, false, o, ExecContext{1});
    FAIL() << "a perplexity from non-finite logits";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("chunk 0"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("position 8"), std::string::npos) << e.what();
  }
  EXPECT_THROW(generate_greedy(bad, {1, 2, 3}, 2, -1, ExecContext{1}), Error);
}

TEST(Generation, RequestsAreBoundedByTheTrainedContext) {
  const LlamaModel m = small_model(false);  // n_ctx_train 64
  auto refused = [&](std::int64_t max_tokens, std::int64_t prompt) -> std::string {
    try {
      check_generation(max_tokens, prompt, &m.hparams());
    } catch (const OptionError& e) {
      return e.option() + ": " + e.detail();
    }
    return "";
  };
  EXPECT_EQ(refused(1, 63), "");
  EXPECT_EQ(refused(60, 4), "");
  EXPECT_EQ(refused(0, 4).rfind("max_tokens: ", 0), 0u);
  EXPECT_EQ(refused(-5, 4).rfind("max_tokens: ", 0), 0u);
  const std::string huge = refused(5'000'000'000, 4);
  EXPECT_EQ(huge.rfind("max_tokens: ", 0), 0u) << huge;
  EXPECT_NE(huge.find("at most 60"), std::string::npos) << huge;
  EXPECT_NE(huge.find("llama.context_length"), std::string::npos) << huge;
  EXPECT_EQ(refused(1, 64).rfind("prompt: ", 0), 0u);
  EXPECT_EQ(refused(1, 0).rfind("prompt: ", 0), 0u);
  // generate_greedy refuses before allocating a cache for 5e9 positions.
  EXPECT_THROW(generate_greedy(m, {1, 2, 3, 4}, 5'000'000'000, -1, ExecContext{1}), OptionError);
  EXPECT_EQ(generate_greedy(m, {1, 2, 3, 4}, 3, -1, ExecContext{1}).size(), 3u);
}

}  // namespace NUMATTN_UNITY_ID
}  // namespace
}  // namespace numattn

// ---- CLI, on the default model (skipped when it is not cached) ------------------------------

namespace numattn {
namespace {
namespace NUMATTN_UNITY_ID {

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

}  // namespace NUMATTN_UNITY_ID
}  // namespace
}  // namespace numattn
