// model/text.h (which tokens a run reads), model/catalogue.h (the method and transform catalogues)
// and core/cancel.h (cooperative cancellation of the long loops). The text rules are checked
// against what `numattn ppl`, `capture` and `generate` did inline before they called the library
// (Tokenizer calls written out here), on the tiny vocabulary and on the cached SmolLM2 and Gemma 3
// vocabularies (skipped when not cached).
#include "numattn/model/text.h"

#include <gtest/gtest.h>

#include <csignal>
#include <cstdlib>
#include <fstream>
#include <optional>

#include "numattn/attention/registry.h"
#include "numattn/core/cancel.h"
#include "numattn/gguf/gguf.h"
#include "numattn/model/catalogue.h"
#include "numattn/model/data.h"
#include "numattn/model/llama.h"
#include "numattn/model/ppl.h"
#include "numattn/transform/pipeline.h"
#include "support/test_util.h"
#include "support/tiny_llama.h"

namespace numattn {
namespace {
namespace NUMATTN_UNITY_ID {

template <class F>
void expect_option_error(F&& f, const std::string& option, const std::vector<std::string>& must_contain) {
  try {
    f();
    ADD_FAILURE() << "no OptionError(" << option << ")";
  } catch (const OptionError& e) {
    EXPECT_EQ(e.option(), option) << e.what();
    for (const std::string& m : must_contain) EXPECT_NE(e.detail().find(m), std::string::npos) << e.what();
  }
}

std::optional<std::string> cached(const char* file) {
  const char* home = std::getenv("HOME");
  if (!home) return std::nullopt;
  std::string p = std::string(home) + "/.cache/numattn/" + file;
  return std::ifstream(p).good() ? std::optional<std::string>(p) : std::nullopt;
}

// A vocabulary and texts it can encode (the tiny one has one token per character of its prose).
struct Vocab {
  Tokenizer tok;
  std::vector<std::string> texts, prompts;
};

std::vector<Vocab> vocabularies() {
  std::vector<Vocab> v;
  v.push_back({Tokenizer::from_gguf_path(test::tiny_model_with_vocab()),
               {test::tiny_text(300), test::tiny_text(7), ""},
               {test::tiny_text(20), ""}});
  const std::vector<std::string> texts{
      test::tiny_text(300),
      "It is a truth universally acknowledged, that a single man in possession of a good fortune, must be "
      "in want of a wife.\n\n<|im_start|>user\nquoted<|im_end|>\n<start_of_turn>model\n",
      "a", ""};
  for (const char* f : {"SmolLM2-135M-Instruct.Q4_1.gguf", "gemma-3-270m-q4_k_m.gguf"})
    if (auto p = cached(f))
      v.push_back({Tokenizer::from_gguf_path(*p), texts, {"Hello, who are you?", "<|im_start|>x", ""}});
  return v;
}

TEST(TextWindow, TextTokensAreTheOldInlineRule) {
  for (const Vocab& v : vocabularies())
    for (const std::string& s : v.texts) {
      const Tokenizer& tok = v.tok;
      // ppl / capture / analyze / Python before: the whole text, BOS per add_bos_token, markers as text.
      EXPECT_EQ(encode_text(tok, s), tok.encode(s, tok.add_bos(), false));
      EXPECT_EQ(prepends_bos(tok), tok.add_bos());
    }
}

TEST(TextWindow, WindowsAreTheOldInlineRule) {
  for (const Vocab& v : vocabularies()) {
    const Tokenizer& tok = v.tok;
    const std::vector<std::int32_t> all = encode_text(tok, v.texts[0] + v.texts[1]);
    const auto n = static_cast<std::int64_t>(all.size());
    ASSERT_GE(n, 20);
    for (BosMode mode : {BosMode::kAuto, BosMode::kReplace, BosMode::kKeep})
      for (auto [offset, length] : std::vector<std::pair<std::int64_t, std::int64_t>>{
               {0, 1}, {0, 7}, {3, 10}, {n - 5, 5}, {0, n}, {n - 1, 1}}) {
        // open_text_window (CLI) and Model.capture (Python) before.
        std::vector<std::int32_t> want(all.begin() + offset, all.begin() + offset + length);
        const bool replace = mode == BosMode::kReplace || (mode == BosMode::kAuto && tok.add_bos());
        if (replace) want[0] = tok.bos_id();
        const TextWindowTokens w = cut_text_window(tok, all, offset, length, mode);
        EXPECT_EQ(w.tokens, want) << to_string(mode) << " offset " << offset << " length " << length;
        EXPECT_EQ(w.bos_replaced, replace);
      }
    expect_option_error([&] { cut_text_window(tok, all, 0, n + 1, BosMode::kAuto); }, "tokens",
                              {std::to_string(n) + " tokens", "`offset` 0 + `tokens` " + std::to_string(n + 1)});
    expect_option_error([&] { cut_text_window(tok, all, n, 1, BosMode::kAuto); }, "tokens", {"is beyond it"});
    expect_option_error([&] { cut_text_window(tok, all, -1, 1, BosMode::kAuto); }, "offset", {">= 0"});
    expect_option_error([&] { cut_text_window(tok, all, 0, 0, BosMode::kAuto); }, "tokens", {"at least 1"});
  }
}

TEST(TextWindow, PromptsAreTheOldInlineRule) {
  for (const Vocab& v : vocabularies()) {
    const Tokenizer& tok = v.tok;
    const bool has_chat = tok.turn_end_id() >= 0;
    for (const std::string& p : v.prompts) {
      // `numattn generate` and Model.generate before.
      EXPECT_EQ(encode_prompt(tok, p, false), tok.encode(p, tok.add_bos(), true));
      if (has_chat) EXPECT_EQ(encode_prompt(tok, p, true), tok.encode(tok.chat_prompt(p), tok.add_bos(), true));
    }
    EXPECT_EQ(generation_stop_id(tok, false), tok.eos_id());
    EXPECT_EQ(generation_stop_id(tok, true), has_chat ? tok.turn_end_id() : tok.eos_id());
  }
}

TEST(TextWindow, LengthWithinTheTrainedContext) {
  const ModelHParams hp = test::tiny_hparams();
  EXPECT_NO_THROW(check_window_length(hp, hp.n_ctx_train));
  expect_option_error([&] { check_window_length(hp, hp.n_ctx_train + 1); }, "tokens",
                      {"beyond the model's trained context of " + std::to_string(hp.n_ctx_train), "context_length"});
}

TEST(TextWindow, IndexLists) {
  EXPECT_EQ(checked_index_list({15, 0, 15, 29}, "layers", 30, "layer", "n_layer"),
            (std::vector<std::int64_t>{0, 15, 29}));
  EXPECT_EQ(all_indices(3), (std::vector<std::int64_t>{0, 1, 2}));
  EXPECT_TRUE(all_indices(0).empty());
  expect_option_error([] { checked_index_list({0, 30}, "layers", 30, "layer", "n_layer"); }, "layers",
                      {"layer 30 is out of range: the model has n_layer = 30 (0..29)"});
  expect_option_error([] { checked_index_list({-1}, "heads", 9, "head", "n_head"); }, "heads", {"head -1"});
  expect_option_error([] { checked_index_list({}, "layers", 30, "layer", "n_layer"); }, "layers",
                      {"at least one layer index"});
}

TEST(TextWindow, ChatTemplatesOfTheDefaultModels) {
  if (auto p = cached("SmolLM2-135M-Instruct.Q4_1.gguf")) {
    const Tokenizer tok = Tokenizer::from_gguf_path(*p);
    const auto ids = encode_prompt(tok, "Hi", true);
    EXPECT_EQ(tok.decode(ids, true), "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n");
    EXPECT_EQ(tok.token_to_piece(generation_stop_id(tok, true), true), "<|im_end|>");
  }
  if (auto p = cached("gemma-3-270m-q4_k_m.gguf")) {
    const Tokenizer tok = Tokenizer::from_gguf_path(*p);
    const auto ids = encode_prompt(tok, "Hi", true);
    ASSERT_TRUE(tok.add_bos());
    EXPECT_EQ(ids.front(), tok.bos_id());
    EXPECT_EQ(tok.decode({ids.begin() + 1, ids.end()}, true),
              "<start_of_turn>user\nHi<end_of_turn>\n<start_of_turn>model\n");
    EXPECT_EQ(tok.token_to_piece(generation_stop_id(tok, true), true), "<end_of_turn>");
  }
}

// ---- catalogue ------------------------------------------------------------------------------

TEST(Catalogue, OneEntryPerRegisteredMethodAndTransform) {
  const auto methods = list_methods();
  const nlohmann::ordered_json d = method_catalogue(false), rows = method_catalogue(true);
  ASSERT_EQ(d.size(), methods.size());
  ASSERT_EQ(rows.size(), methods.size());
  for (std::size_t i = 0; i < methods.size(); ++i) {
    EXPECT_EQ(d[i]["name"], methods[i]->name);
    EXPECT_EQ(rows[i]["spec"], d[i]["spec"]);
    EXPECT_EQ(d[i]["spec"], create_method(methods[i]->name)->spec());
    EXPECT_EQ(d[i]["params"].size(), methods[i]->params.size());
    EXPECT_EQ(d[i]["capabilities"]["exact"].get<bool>(), methods[i]->caps.exact);
    EXPECT_TRUE(rows[i]["parameters"].is_string());
    // "exact" leads the capability text exactly when the method is exact.
    EXPECT_EQ(rows[i]["capabilities"].get<std::string>().rfind("exact", 0) == 0, methods[i]->caps.exact);
  }
  const auto& xf = transform::list_transforms();
  const nlohmann::ordered_json t = transform_catalogue(false), trows = transform_catalogue(true);
  ASSERT_EQ(t.size(), xf.size());
  for (std::size_t i = 0; i < xf.size(); ++i) {
    EXPECT_EQ(t[i]["name"], xf[i]->name);
    ASSERT_EQ(t[i]["parameters"].size(), xf[i]->params.size());
    for (std::size_t j = 0; j < xf[i]->params.size(); ++j)
      EXPECT_EQ(t[i]["parameters"][j]["required"].get<bool>(), xf[i]->params[j].default_value.empty());
    EXPECT_TRUE(trows[i]["parameters"].is_string());
  }
}

// ---- cancellation ---------------------------------------------------------------------------

// A token whose poll requests cancellation at its n-th check.
struct CancelAfter {
  int n, polls = 0;
  CancelToken token{[this] {
    if (++polls == n) token.request();
  }};
  explicit CancelAfter(int n_) : n(n_) {}
};

TEST(Cancel, TokenThrowsOnlyOnceRequested) {
  CancelToken t;
  EXPECT_NO_THROW(t.check("x"));
  t.request();
  try {
    t.check("loop: stopped after 3");
    FAIL() << "no Cancelled";
  } catch (const Cancelled& e) {
    EXPECT_EQ(e.where(), "loop: stopped after 3");
    EXPECT_STREQ(e.what(), "cancelled: loop: stopped after 3");
  }
}

TEST(Cancel, PerplexityStopsAfterNChunks) {
  const GgufFile file = GgufFile::open(test::tiny_model_with_vocab());
  const LlamaModel m = LlamaModel::load(file, ExecContext{1});
  const Tokenizer tok = Tokenizer::from_gguf(file);
  const auto tokens = encode_text(tok, test::tiny_text(400));
  PplOptions po;
  po.ctx = 16;
  ASSERT_GE(static_cast<std::int64_t>(tokens.size()) / po.ctx, 4);
  CancelAfter c(3);  // checked before chunks 0, 1, 2: two chunks run
  po.cancel = &c.token;
  int chunks_run = 0;
  po.after_chunk = [&] { ++chunks_run; };
  try {
    evaluate_perplexity(m, tokens, tok.bos_id(), tok.add_bos(), po, ExecContext{1});
    FAIL() << "no Cancelled";
  } catch (const Cancelled& e) {
    EXPECT_NE(e.where().find("ppl: stopped after 2 of "), std::string::npos) << e.what();
  }
  EXPECT_EQ(chunks_run, 2);
  // Without a request the same run completes.
  CancelToken never;
  po.cancel = &never;
  EXPECT_GT(evaluate_perplexity(m, tokens, tok.bos_id(), tok.add_bos(), po, ExecContext{1}).ppl, 0.0);
}

TEST(Cancel, GenerationStopsAfterNTokens) {
  const GgufFile file = GgufFile::open(test::tiny_model_with_vocab());
  const LlamaModel m = LlamaModel::load(file, ExecContext{1});
  const Tokenizer tok = Tokenizer::from_gguf(file);
  CancelAfter c(4);
  std::vector<std::int32_t> seen;
  EXPECT_THROW(generate_greedy(m, encode_prompt(tok, "the ", false), 20, -1, ExecContext{1},
                               [&](std::int32_t id) {
                                 seen.push_back(id);
                                 c.token.check("generate");
                               }),
               Cancelled);
  EXPECT_EQ(seen.size(), 4u);
}

TEST(Cancel, SigintRequestsCancellationWhileGuarded) {
  CancelToken t;
  {
    SigintCancel guard(t);
    std::raise(SIGINT);  // handled: the process lives on
    EXPECT_TRUE(t.requested());
    EXPECT_THROW(t.check("x"), Cancelled);
  }
  // The previous disposition is back (the test runner's default); not raised again here.
  void (*h)(int) = std::signal(SIGINT, SIG_DFL);
  EXPECT_EQ(h, SIG_DFL);
}

}  // namespace NUMATTN_UNITY_ID
}  // namespace
}  // namespace numattn
