#include "numattn/model/tokenizer.h"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <cmath>
#include <fstream>
#include <optional>
#include <sstream>

#include "numattn/core/error.h"
#include "numattn/gguf/gguf.h"
#include "numattn/model/data.h"
#include "support/test_util.h"

namespace numattn {
namespace {
namespace NUMATTN_UNITY_ID {

// A vocabulary small enough to reason about by hand: the 256 byte symbols, a few merges, and
// two control tokens. Byte symbols use GPT-2's alphabet: ' ' is "Ġ" (U+0120), '\n' is "Ċ".
TokenizerConfig tiny_config(const std::string& pre) {
  TokenizerConfig c;
  c.pre = pre;
  c.tokens = {"<s>", "</s>"};
  c.token_types = {3, 3};
  // All 256 bytes as single symbols (ids 2..257, by byte value), written with GPT-2's
  // alphabet as the tests rebuild it apart from the tokenizer's own table.
  for (int b = 0; b < 256; ++b) {
    c.tokens.push_back(test::gpt2_byte_symbol(b));
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

// Byte b's one-symbol token in tiny_config: ids 2..257 by byte value.
std::int32_t tiny_byte_id(int b) { return 2 + b; }

TEST(Tokenizer, EverySingleByteIsExactlyItsByteToken) {
  for (const char* pre : {"gpt-2", "smollm"}) {
    Tokenizer t(tiny_config(pre));
    for (int b = 0; b < 256; ++b) {
      const std::string x(1, static_cast<char>(b));
      for (bool special : {false, true}) {
        EXPECT_EQ(t.encode(x, false, special), (std::vector<std::int32_t>{tiny_byte_id(b)}))
            << pre << " byte " << b;
      }
      EXPECT_EQ(t.decode({tiny_byte_id(b)}), x);
    }
  }
}

TEST(Tokenizer, InvalidUtf8IsSplitAndRoundTripsByteForByte) {
  Tokenizer t(tiny_config("smollm"));
  using V = std::vector<std::string>;
  // Each invalid byte is its own code point of the punctuation-like class: ` ?[^\s\p{L}\p{N}]+`
  // keeps runs of them (and of punctuation) together, letters and spaces split them off.
  EXPECT_EQ(t.pre_tokenize("a\xff" "b"), (V{"a", "\xff", "b"}));
  EXPECT_EQ(t.pre_tokenize("a \x80\xbf!c"), (V{"a", " \x80\xbf!", "c"}));
  EXPECT_EQ(t.pre_tokenize("\xed\xa0\x80x"), (V{"\xed\xa0\x80", "x"}));  // surrogate U+D800
  for (const std::string& x : V{"\x80", "\xbf\xbf", "\xe2\x82", "\xe2\x82 euro", "\xc0\xaf",
                                "\xe0\x80\xaf", "\xf0\x80\x80\xaf", "\xed\xa0\x80", "\xed\xbf\xbf",
                                "\xf4\x90\x80\x80", "\xf8\x88\x80\x80\x80", "\xfc\x84\x80\x80\x80\x80",
                                "\xfe\xff", "ok\xc3", std::string("\0\xff\0", 3)}) {
    const auto ids = t.encode(x);
    EXPECT_EQ(t.decode(ids), x);
    // No merge in the tiny vocabulary involves these bytes: one byte token per byte.
    if (x.find_first_of(" ok") == std::string::npos) {
      ASSERT_EQ(ids.size(), x.size());
      for (std::size_t k = 0; k < x.size(); ++k)
        EXPECT_EQ(ids[k], tiny_byte_id(static_cast<unsigned char>(x[k])));
    }
  }
}

TEST(Tokenizer, RandomByteStringsRoundTrip) {
  for (const char* pre : {"gpt-2", "smollm"}) {
    Tokenizer t(tiny_config(pre));
    std::uint64_t state = 0x9E3779B97F4A7C15ull;
    auto next = [&] {
      state ^= state << 13;
      state ^= state >> 7;
      state ^= state << 17;
      return state;
    };
    for (int n = 0; n < 300; ++n) {
      std::string x(next() % 48, '\0');
      for (char& c : x) {
        // Mostly bytes that form or break UTF-8 sequences, plus the merge letters and markers.
        static const char kPick[] = "he lo wr d12'<s>\xc3\xa9\xe2\x82\xac\xf0\x9f\x98\x80\x80\xff\n\t";
        c = (next() & 1) ? static_cast<char>(next() & 0xFF) : kPick[next() % (sizeof kPick - 1)];
      }
      EXPECT_EQ(t.decode(t.encode(x, false, false)), x) << pre;
      EXPECT_EQ(t.decode(t.encode(x, false, true)), x) << pre;
    }
  }
}

TEST(Tokenizer, BytesWithoutAByteTokenAreRefusedNotMappedToUnknown) {
  auto c = tiny_config("smollm");
  c.tokens[static_cast<std::size_t>(tiny_byte_id(0xF8))] = "<unused_f8>";
  c.unk_id = 1;  // a control token, as SmolLM2's <|endoftext|>
  Tokenizer t(c);
  EXPECT_EQ(t.decode(t.encode("hello")), "hello");
  try {
    const auto ids = t.encode("ab \xf8 c");
    ADD_FAILURE() << "encoded to " << ids.size() << " ids";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("byte 0xF8 at offset 3 of the text has no token in this "
                                         "vocabulary, which lacks 1 of the 256 byte tokens"),
              std::string::npos)
        << e.what();
  }
  // Inside a special token the byte is no text byte.
  c.tokens.push_back("<\xf8>");
  c.token_types.push_back(3);
  Tokenizer s(c);
  EXPECT_EQ(s.encode("<\xf8>", false, true), (std::vector<std::int32_t>{s.vocab_size() - 1}));
  EXPECT_THROW(s.encode("<\xf8>", false, false), Error);
}

TEST(Tokenizer, EscapedPiecesArePrintableAndReversible) {
  EXPECT_EQ(escape_piece("caf\xc3\xa9 \xf0\x9f\x98\x80"), "caf\xc3\xa9 \xf0\x9f\x98\x80");  // valid
  EXPECT_EQ(escape_piece("a\\b"), "a\\\\b");
  EXPECT_EQ(escape_piece("\n\t\x7f"), "\\x0a\\x09\\x7f");
  EXPECT_EQ(escape_piece("\xc3"), "\\xc3");               // half of é
  EXPECT_EQ(escape_piece("\xa9"), "\\xa9");               // the other half
  EXPECT_EQ(escape_piece("\xed\xa0\x80"), "\\xed\\xa0\\x80");  // surrogate: not UTF-8
  EXPECT_EQ(escape_piece("\xc0\xaf"), "\\xc0\\xaf");        // overlong '/'
  EXPECT_EQ(escape_piece(std::string("\0", 1)), "\\x00");
}

TEST(Tokenizer, RefusesUnsupported) {
  auto c = tiny_config("gpt-2");
  c.model = "bert";
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

// SmolLM2's vocabulary has 235 of the 256 byte tokens. Each present byte is exactly its
// token; each missing one is refused by name (it used to become <|endoftext|>, id 0).
TEST(TokenizerDefaultModel, EverySingleByteIsItsByteTokenOrRefused) {
  auto path = cached(default_model_path);
  if (!path) GTEST_SKIP() << "default model not cached (scripts/fetch_data.sh)";
  Tokenizer t = Tokenizer::from_gguf_path(*path);
  std::vector<int> refused;
  for (int b = 0; b < 256; ++b) {
    const std::string x(1, static_cast<char>(b));
    try {
      const auto ids = t.encode(x, false, false);
      ASSERT_EQ(ids.size(), 1u) << "byte " << b;
      EXPECT_EQ(t.token_type(ids[0]), TokenType::kNormal) << "byte " << b;
      EXPECT_EQ(t.token_to_piece(ids[0]), x) << "byte " << b;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(fmt::format("byte 0x{:02X} at offset 0", b)),
                std::string::npos)
          << e.what();
      refused.push_back(b);
    }
  }
  EXPECT_EQ(refused, (std::vector<int>{0x04, 0x06, 0x13, 0x14, 0x16, 0x1D, 0xC0, 0xC1, 0xF1, 0xF2,
                                       0xF5, 0xF6, 0xF7, 0xF8, 0xF9, 0xFA, 0xFB, 0xFC, 0xFD, 0xFE,
                                       0xFF}));
  // Invalid UTF-8 made of present bytes round-trips.
  for (const std::string& x : {std::string("a\x80" "b"), std::string("\xe2\x82 \xed\xa0\x80"),
                               std::string("\xc3(\xa9")})
    EXPECT_EQ(t.decode(t.encode(x)), x);
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

// SentencePiece (tokenizer.ggml.model = "llama") on a tiny vocabulary: merges by score, the
// higher first, ties to the leftmost pair; the ▁ space rule and the leading space; byte fallback
// for what no token covers; special tokens cut first; decode inverts encode.
TEST(Tokenizer, SentencePieceMergesByScoreWithByteFallback) {
  const std::string sp = "\xE2\x96\x81";  // ▁
  TokenizerConfig c;
  c.model = "llama";
  c.pre = "default";
  //          0        1        2       3    4    5    6          7          8         9
  c.tokens = {"<unk>", "<s>", "</s>", "a", "b", "c", sp, sp + "a", "ab", "bc"};
  c.scores = {0, 0, 0, -1, -1, -1, -1, -2, -3, -0.5f};
  c.token_types = {2, 3, 3, 1, 1, 1, 1, 1, 1, 1};
  for (int b = 0; b < 256; ++b) {
    c.tokens.push_back(fmt::format("<0x{:02X}>", b));
    c.scores.push_back(0);
    c.token_types.push_back(6);
  }
  c.bos_id = 1;
  c.eos_id = 2;
  c.unk_id = 0;
  c.add_space_prefix = false;
  const Tokenizer t(c);
  // "abc": "bc" (score -0.5) beats "ab" (-3): a | bc.
  EXPECT_EQ(t.encode("abc"), (std::vector<std::int32_t>{3, 9}));
  // "abab": the two "ab" pairs tie; the leftmost merges first, then the other one.
  EXPECT_EQ(t.encode("abab"), (std::vector<std::int32_t>{8, 8}));
  // A space is ▁; "▁a" is a token; "d" is not: its byte token.
  EXPECT_EQ(t.encode(" ad"), (std::vector<std::int32_t>{7, 10 + 'd'}));
  // A multi-byte character without a token: one byte token per byte.
  EXPECT_EQ(t.encode("\xC3\xA9"), (std::vector<std::int32_t>{10 + 0xC3, 10 + 0xA9}));
  EXPECT_EQ(t.encode("a", true), (std::vector<std::int32_t>{1, 3}));
  EXPECT_TRUE(t.encode("").empty());
  for (const std::string x : {"abc abc", " d\xC3\xA9\n", "ab</s>bc"}) EXPECT_EQ(t.decode(t.encode(x, false, false)), x);
  // The control token is cut out when parsed as special.
  EXPECT_EQ(t.encode("ab</s>bc"), (std::vector<std::int32_t>{8, 2, 9}));
  // With add_space_prefix the first fragment, and each after a special token, starts with ▁.
  c.add_space_prefix = true;
  const Tokenizer u(c);
  EXPECT_EQ(u.encode("a"), (std::vector<std::int32_t>{7}));
  EXPECT_EQ(u.encode("a</s>a"), (std::vector<std::int32_t>{7, 2, 7}));
  // A byte token whose text is not <0xXX> (a hostile vocabulary) decodes as its text.
  c.tokens[10 + 'q'] = "<0xZZ>";
  EXPECT_EQ(Tokenizer(c).token_to_piece(10 + 'q'), "<0xZZ>");
  c.scores[4] = std::nanf("");
  EXPECT_THROW(Tokenizer{c}, Error);
  c.scores.pop_back();
  EXPECT_THROW(Tokenizer{c}, Error);
}

// Gemma 3's SentencePiece vocabulary (262,144 tokens) on the whole default text against
// llama.cpp's llama-tokenize (llama-cpp-python 0.3.36's llama.cpp; BOS added, special tokens
// parsed): 958,391 ids, their FNV-1a hash, and the start of a short sentence.
TEST(TokenizerGemma3, WholeDefaultTextMatchesLlamaCpp) {
  auto tpath = cached(default_text_path);
  std::optional<std::string> mpath;
  try {
    mpath = resolve_model_path("gemma3");
  } catch (const Error&) {
  }
  if (!mpath || !tpath) GTEST_SKIP() << "Gemma 3 (scripts/fetch_data.sh --what gemma3) or the default text not cached";
  const Tokenizer t = Tokenizer::from_gguf_path(*mpath);
  EXPECT_EQ(t.encode("Hello world, it is a truth universally acknowledged.\n\nThe  end.", true),
            (std::vector<std::int32_t>{2, 9259, 1902, 236764, 625, 563, 496, 9043, 69127, 30285, 236761, 108, 818,
                                       138, 643, 236761}));
  std::ifstream in(*tpath, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  const std::string text = ss.str();
  if (text.size() != 4025029u) GTEST_SKIP() << "cached text has " << text.size() << " bytes, not 4025029";
  const auto ids = t.encode(text, true);
  EXPECT_EQ(ids.size(), 958391u);
  char hex[17];
  std::snprintf(hex, sizeof hex, "%016llx", static_cast<unsigned long long>(fnv1a64(ids)));
  EXPECT_EQ(std::string(hex), "b8c104f6bb6f1643");
  EXPECT_EQ(t.decode(std::vector<std::int32_t>(ids.begin() + 1, ids.end())), text);
}

}  // namespace NUMATTN_UNITY_ID
}  // namespace
}  // namespace numattn
