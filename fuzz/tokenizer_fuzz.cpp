// libFuzzer target for the byte-level BPE tokenizer on arbitrary bytes.
//
// Self-contained: the vocabulary is built in (the 256 byte tokens in GPT-2's alphabet, control
// and user-defined tokens, merges over ASCII and UTF-8 byte pairs, some of whose results are
// deliberately missing from the vocabulary). For every input, under both pre-tokenizers:
// - the pre-tokenizer's pieces are non-empty and concatenate to the input;
// - encode then decode gives the input back, with and without special-token parsing, and every
//   id is in the vocabulary;
// - a vocabulary lacking two byte tokens either round-trips or refuses with numattn::Error,
//   and refuses only inputs that hold one of those bytes;
// - escape_piece gives valid UTF-8 that unescapes to the input.
// Seeds: fuzz/corpus/tokenizer/.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <string_view>
#include <vector>

#include "numattn/core/error.h"
#include "numattn/model/tokenizer.h"

namespace {

using numattn::Tokenizer;
using numattn::TokenizerConfig;

// GPT-2's bytes_to_unicode, written independently of the tokenizer's table.
std::string sym(std::string_view bytes) {
  std::string s;
  for (unsigned char b : bytes) {
    std::uint32_t cp = b;
    if (!((b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE)) {
      std::uint32_t next = 256;
      for (int c = 0; c < b; ++c)
        if (!((c >= '!' && c <= '~') || (c >= 0xA1 && c <= 0xAC) || c >= 0xAE)) ++next;
      cp = next;
    }
    if (cp < 0x80) {
      s += static_cast<char>(cp);
    } else {
      s += static_cast<char>(0xC0 | (cp >> 6));
      s += static_cast<char>(0x80 | (cp & 0x3F));
    }
  }
  return s;
}

TokenizerConfig config(const char* pre, bool drop_bytes) {
  TokenizerConfig c;
  c.pre = pre;
  c.tokens = {"<|endoftext|>", "<|im_start|>", "<|im_end|>", "<tool>"};
  c.token_types = {3, 3, 3, 4};
  for (int b = 0; b < 256; ++b) {
    const bool dropped = drop_bytes && (b == 0xF8 || b == 0x04);
    c.tokens.push_back(dropped ? "<unused_" + std::to_string(b) + ">" : sym(std::string(1, static_cast<char>(b))));
    c.token_types.push_back(dropped ? 5 : 1);
  }
  // Merges as byte-string pairs, in rank order; a trailing '!' leaves the result out of the
  // vocabulary (the BPE then falls back to byte tokens).
  const std::vector<std::pair<std::string, std::string>> merges = {
      {"t", "h"},      {"h", "e"},        {"th", "e"},        {" ", "t"},        {" t", "he"},
      {"i", "n"},      {"in", "g"},       {"e", "r"},         {"a", "n"},        {"an", "d"},
      {" ", "a"},      {" a", "nd"},      {"o", "n"},         {"r", "e"},        {"'", "s"},
      {"1", "2"},      {"12", "3"},       {"\n", "\n"},       {" ", " "},        {"  ", "  "},
      {"\xc3", "\xa9"}, {"\xe2\x80", "\x99"}, {"\xe2", "\x80"}, {"\xf0\x9f", "\x98\x80"},
      {"\xf0", "\x9f"}, {"\x98", "\x80"}, {"<", "|"},         {"e", "!"},        {"x", "y!"},
  };
  for (const auto& [a, b] : merges) {
    const bool missing = !b.empty() && b.back() == '!' && b.size() > 1;
    const std::string bb = missing ? b.substr(0, b.size() - 1) : b;
    c.merges.push_back(sym(a) + " " + sym(bb));
    if (!missing) {
      c.tokens.push_back(sym(a + bb));
      c.token_types.push_back(1);
    }
  }
  c.bos_id = 0;
  c.eos_id = 0;
  c.unk_id = 0;
  return c;
}

[[noreturn]] void fail(const char* what, std::string_view in) {
  std::fprintf(stderr, "tokenizer_fuzz: %s (input of %zu bytes)\n", what, in.size());
  std::abort();
}

std::string unescape(std::string_view s) {
  std::string out;
  for (std::size_t k = 0; k < s.size(); ++k) {
    if (s[k] != '\\') {
      out += s[k];
    } else if (k + 1 < s.size() && s[k + 1] == '\\') {
      out += '\\';
      ++k;
    } else if (k + 3 < s.size() && s[k + 1] == 'x') {
      out += static_cast<char>(std::stoi(std::string(s.substr(k + 2, 2)), nullptr, 16));
      k += 3;
    } else {
      fail("escape_piece wrote a lone backslash", s);
    }
  }
  return out;
}

bool valid_utf8(std::string_view s) {
  for (std::size_t i = 0; i < s.size();) {
    const auto b = static_cast<unsigned char>(s[i]);
    std::size_t n = b < 0x80 ? 1 : (b >> 5) == 6 ? 2 : (b >> 4) == 14 ? 3 : (b >> 3) == 30 ? 4 : 0;
    if (n == 0 || i + n > s.size()) return false;
    std::uint32_t cp = n == 1 ? b : b & (0x7F >> n);
    for (std::size_t k = 1; k < n; ++k) {
      const auto c = static_cast<unsigned char>(s[i + k]);
      if ((c & 0xC0) != 0x80) return false;
      cp = (cp << 6) | (c & 0x3F);
    }
    const std::uint32_t min[] = {0, 0, 0x80, 0x800, 0x10000};
    if (cp < min[n] || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return false;
    i += n;
  }
  return true;
}

void round_trip(const Tokenizer& t, std::string_view x) {
  for (bool special : {false, true}) {
    const auto ids = t.encode(x, false, special);
    for (auto id : ids)
      if (id < 0 || id >= t.vocab_size()) fail("id outside the vocabulary", x);
    if (t.decode(ids, true) != x) fail("decode(encode(x)) != x", x);
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  static const Tokenizer gpt2(config("gpt-2", false)), smollm(config("smollm", false)),
      sparse(config("smollm", true));
  const std::string_view x(reinterpret_cast<const char*>(data), size);
  for (const Tokenizer* t : {&gpt2, &smollm}) {
    std::string joined;
    for (const std::string& p : t->pre_tokenize(x)) {
      if (p.empty()) fail("empty pre-tokenizer piece", x);
      joined += p;
    }
    if (joined != x) fail("pre-tokenizer pieces do not concatenate to the input", x);
    round_trip(*t, x);
  }
  try {
    round_trip(sparse, x);
  } catch (const numattn::Error&) {
    if (x.find('\xF8') == std::string_view::npos && x.find('\x04') == std::string_view::npos)
      fail("refused an input whose bytes all have byte tokens", x);
  }
  const std::string e = numattn::escape_piece(x);
  if (!valid_utf8(e)) fail("escape_piece gave invalid UTF-8", x);
  if (unescape(e) != x) fail("escape_piece is not reversible", x);
  return 0;
}
