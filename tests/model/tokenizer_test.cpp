#include "numattn/model/tokenizer.h"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <fstream>
#include <optional>
#include <sstream>

#include "numattn/core/error.h"
#include "numattn/model/data.h"
#include "numattn/model/gguf.h"

namespace numattn {
namespace {

// A vocabulary small enough to reason about by hand: the 256 byte symbols, a few merges, and
// two control tokens. Byte symbols use GPT-2's alphabet: ' ' is "Ġ" (U+0120), '\n' is "Ċ".
TokenizerConfig tiny_config(const std::string& pre) {
  TokenizerConfig c;
  c.pre = pre;
  c.tokens = {"<s>", "</s>"};
  c.token_types = {3, 3};
  // All 256 bytes as single symbols (ids 2..257, by byte value), written with GPT-2's
  // alphabet rebuilt here independently of the tokenizer's own table.
  std::uint32_t next = 256;
  for (int b = 0; b < 256; ++b) {
    const bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE);
    const std::uint32_t cp = printable ? static_cast<std::uint32_t>(b) : next++;
    std::string s;
    if (cp < 0x80) {
      s += static_cast<char>(cp);
    } else {
      s += static_cast<char>(0xC0 | (cp >> 6));
      s += static_cast<char>(0x80 | (cp & 0x3F));
    }
    c.tokens.push_back(s);
    c.token_types.push_back(1);
  }
  // Merges, in rank order, and the tokens they create.
  c.merges = {"h e", "l l", "he ll", "hell o", "Ġ w", "Ġw o", "Ġwo r", "Ġwor l", "Ġworl d", "1 2"};
  for (const char* t : {"he", "ll", "hell", "hello", "Ġw", "Ġwo", "Ġwor", "Ġworl", "Ġworld", "12"}) {
    c.tokens.push_back(t);
    c.token_types.push_back(1);
  }
  c.bos_id = 0;
  c.eos_id = 1;
  return c;
}

std::int32_t id_of(const Tokenizer& t, const std::string& s) {
  for (std::int32_t i = 0; i < t.vocab_size(); ++i)
    if (t.token_text(i) == s) return i;
  return -1;
}

TEST(Tokenizer, TinyVocabularyMerges) {
  Tokenizer t(tiny_config("gpt-2"));
  auto ids = t.encode("hello world");
  ASSERT_EQ(ids.size(), 2u);
  EXPECT_EQ(ids[0], id_of(t, "hello"));
  EXPECT_EQ(ids[1], id_of(t, "Ġworld"));
  EXPECT_EQ(t.decode(ids), "hello world");
  // No merge applies: one token per byte.
  auto hx = t.encode("hx");
  ASSERT_EQ(hx.size(), 2u);
  EXPECT_EQ(t.token_text(hx[0]), "h");
  // gpt-2 keeps digit runs together, so the "1 2" merge applies; smollm splits every digit.
  EXPECT_EQ(t.encode("12").size(), 1u);
  Tokenizer s(tiny_config("smollm"));
  EXPECT_EQ(s.encode("12").size(), 2u);
  EXPECT_EQ(s.encode("hello world"), ids);
}

TEST(Tokenizer, SpecialTokens) {
  Tokenizer t(tiny_config("gpt-2"));
  auto ids = t.encode("<s>hello</s>", false, true);
  ASSERT_EQ(ids.size(), 3u);
  EXPECT_EQ(ids[0], 0);
  EXPECT_EQ(ids[1], id_of(t, "hello"));
  EXPECT_EQ(ids[2], 1);
  EXPECT_EQ(t.decode(ids, true), "<s>hello</s>");
  EXPECT_EQ(t.decode(ids, false), "hello");
  // Without special parsing the markers are plain text.
  auto plain = t.encode("<s>hello</s>", false, false);
  EXPECT_GT(plain.size(), 3u);
  EXPECT_EQ(t.decode(plain), "<s>hello</s>");
  // add_bos prepends.
  auto b = t.encode("hello", true);
  ASSERT_EQ(b.size(), 2u);
  EXPECT_EQ(b[0], 0);
}

TEST(Tokenizer, PreTokenizerSplits) {
  Tokenizer g(tiny_config("gpt-2"));
  using V = std::vector<std::string>;
  EXPECT_EQ(g.pre_tokenize("Hello world"), (V{"Hello", " world"}));
  EXPECT_EQ(g.pre_tokenize("it's  two"), (V{"it", "'s", " ", " two"}));
  EXPECT_EQ(g.pre_tokenize("a\n\nb"), (V{"a", "\n", "\n", "b"}));  // \s+(?!\S) then \s+
  EXPECT_EQ(g.pre_tokenize("x   "), (V{"x", "   "}));
  EXPECT_EQ(g.pre_tokenize("x 123!!"), (V{"x", " 123", "!!"}));
  EXPECT_EQ(g.pre_tokenize("café ünï"), (V{"café", " ünï"}));
  Tokenizer s(tiny_config("smollm"));
  EXPECT_EQ(s.pre_tokenize("x 123!!"), (V{"x", " ", "1", "2", "3", "!!"}));
  EXPECT_EQ(s.pre_tokenize("x²"), (V{"x", "²"}));  // ² is \p{N} (No)
}

TEST(Tokenizer, RoundTripUnicodeAndBytes) {
  Tokenizer t(tiny_config("smollm"));
  for (const std::string& s : std::vector<std::string>{"", " ", "hello world", "Ελληνικά 中文 😀👍🏽 ½", "tabs\t\tand\r\nCRLF  ",
                        std::string("\xff\xfe invalid \xc3", 13)}) {
    EXPECT_EQ(t.decode(t.encode(s)), s);
  }
}

TEST(Tokenizer, RefusesUnsupported) {
  auto c = tiny_config("gpt-2");
  c.model = "llama";
  EXPECT_THROW(Tokenizer{c}, Error);
  c = tiny_config("qwen2");
  try {
    Tokenizer t(c);
    FAIL() << "expected a refusal";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("qwen2"), std::string::npos);
  }
}

// ---- against the independent implementation (HF tokenizers), on the real vocabulary --------

std::optional<std::string> cached(std::string (*fn)()) {
  try {
    return fn();
  } catch (const Error&) {
    return std::nullopt;
  }
}

nlohmann::json load_fixtures() {
  std::ifstream f(std::string(NUMATTN_SOURCE_DIR) + "/tests/data/tokenizer_fixtures.json");
  EXPECT_TRUE(f.good());
  return nlohmann::json::parse(f);
}

std::uint64_t fnv1a64(const std::vector<std::int32_t>& ids) {
  std::uint64_t h = 0xcbf29ce484222325ull;
  for (std::int32_t id : ids) {
    const auto u = static_cast<std::uint32_t>(id);
    for (int k = 0; k < 4; ++k) {
      h ^= (u >> (8 * k)) & 0xFF;
      h *= 0x100000001b3ull;
    }
  }
  return h;
}

TEST(TokenizerDefaultModel, MatchesHuggingFaceFixtures) {
  auto path = cached(default_model_path);
  if (!path) GTEST_SKIP() << "default model not cached (scripts/fetch_data.sh)";
  GgufFile f = GgufFile::open(*path);
  Tokenizer t = Tokenizer::from_gguf(f);
  EXPECT_EQ(t.pre(), "smollm");
  EXPECT_EQ(t.vocab_size(), 49152);
  const auto fx = load_fixtures();
  int n = 0;
  for (const auto& c : fx["cases"]) {
    const std::string text = c["text"];
    const auto want = c["ids"].get<std::vector<std::int32_t>>();
    EXPECT_EQ(t.encode(text), want) << "text: " << text;
    // Round trip (control tokens render as their text).
    EXPECT_EQ(t.decode(want), text);
    ++n;
  }
  EXPECT_GE(n, 20);
}

TEST(TokenizerDefaultModel, WholeDefaultTextMatchesHuggingFace) {
  auto mpath = cached(default_model_path);
  auto tpath = cached(default_text_path);
  if (!mpath || !tpath) GTEST_SKIP() << "default model or text not cached";
  const auto fx = load_fixtures();
  if (!fx.contains("default_text")) GTEST_SKIP() << "fixtures have no whole-text hash";
  std::ifstream in(*tpath, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  const std::string text = ss.str();
  const auto& d = fx["default_text"];
  if (text.size() != d["bytes"].get<std::size_t>())
    GTEST_SKIP() << "cached text has " << text.size() << " bytes, fixture was made from "
                 << d["bytes"].get<std::size_t>();
  Tokenizer t = Tokenizer::from_gguf_path(*mpath);
  const auto ids = t.encode(text);
  EXPECT_EQ(static_cast<std::int64_t>(ids.size()), d["n_tokens"].get<std::int64_t>());
  char hex[17];
  std::snprintf(hex, sizeof hex, "%016llx", static_cast<unsigned long long>(fnv1a64(ids)));
  EXPECT_EQ(std::string(hex), d["fnv1a64_ids"].get<std::string>());
  EXPECT_EQ(t.decode(ids), text);
}

}  // namespace
}  // namespace numattn
