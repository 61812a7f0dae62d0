#include "numattn/model/tokenizer.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <optional>
#include <queue>

#include "model/tokenizer_unicode.h"
#include "numattn/core/error.h"

namespace numattn {

namespace {

// SentencePiece's stand-in for a space, U+2581 "▁" in UTF-8.
constexpr std::string_view kSpmSpace = "\xE2\x96\x81";

// ---- UTF-8 ----------------------------------------------------------------------------------

void append_utf8(std::string& s, std::uint32_t cp) {
  if (cp < 0x80) {
    s += static_cast<char>(cp);
  } else if (cp < 0x800) {
    s += static_cast<char>(0xC0 | (cp >> 6));
    s += static_cast<char>(0x80 | (cp & 0x3F));
  } else if (cp < 0x10000) {
    s += static_cast<char>(0xE0 | (cp >> 12));
    s += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    s += static_cast<char>(0x80 | (cp & 0x3F));
  } else {
    s += static_cast<char>(0xF0 | (cp >> 18));
    s += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
    s += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    s += static_cast<char>(0x80 | (cp & 0x3F));
  }
}

// Decodes one code point at `s[i]`; returns its byte length. An invalid sequence (a lone
// continuation byte, a truncated sequence, an overlong form, a surrogate, a code point above
// U+10FFFF, bytes 0xF8..0xFF) yields one byte with the sentinel code point below, which no
// character class contains (it splits like punctuation, as llama.cpp's U+FFFD does), so
// malformed input still round-trips byte for byte.
constexpr std::uint32_t kInvalidCp = 0xFFFFFFFFu;
std::size_t decode_utf8(std::string_view s, std::size_t i, std::uint32_t& cp) {
  const auto b0 = static_cast<unsigned char>(s[i]);
  auto cont = [&](std::size_t k) {
    return i + k < s.size() && (static_cast<unsigned char>(s[i + k]) & 0xC0) == 0x80;
  };
  auto c = [&](std::size_t k) { return static_cast<std::uint32_t>(s[i + k]) & 0x3F; };
  if (b0 < 0x80) {
    cp = b0;
    return 1;
  }
  if ((b0 & 0xE0) == 0xC0 && cont(1)) {
    cp = ((b0 & 0x1Fu) << 6) | c(1);
    if (cp >= 0x80) return 2;
  } else if ((b0 & 0xF0) == 0xE0 && cont(1) && cont(2)) {
    cp = ((b0 & 0x0Fu) << 12) | (c(1) << 6) | c(2);
    if (cp >= 0x800 && (cp < 0xD800 || cp > 0xDFFF)) return 3;
  } else if ((b0 & 0xF8) == 0xF0 && cont(1) && cont(2) && cont(3)) {
    cp = ((b0 & 0x07u) << 18) | (c(1) << 12) | (c(2) << 6) | c(3);
    if (cp >= 0x10000 && cp <= 0x10FFFF) return 4;
  }
  cp = kInvalidCp;
  return 1;
}

// ---- GPT-2 byte alphabet ---------------------------------------------------------------------

// GPT-2's bytes_to_unicode: printable Latin-1 bytes stand for themselves, the other 68 bytes
// are shifted to U+0100.. in byte order, so every byte has a visible, non-space character.
struct ByteAlphabet {
  std::array<std::uint32_t, 256> to_cp{};
  std::array<std::string, 256> to_utf8;
  std::unordered_map<std::uint32_t, unsigned char> from_cp;
  ByteAlphabet() {
    std::uint32_t next = 256;
    for (int b = 0; b < 256; ++b) {
      const bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE);
      to_cp[b] = printable ? static_cast<std::uint32_t>(b) : next++;
      append_utf8(to_utf8[b], to_cp[b]);
      from_cp[to_cp[b]] = static_cast<unsigned char>(b);
    }
  }
};

const ByteAlphabet& alphabet() {
  static const ByteAlphabet a;
  return a;
}

// ---- pre-tokenizer ---------------------------------------------------------------------------

struct Cp {
  std::uint32_t cp;
  std::size_t byte;  // offset of its first byte in the fragment
};

bool letter(std::uint32_t cp) { return cp != kInvalidCp && is_letter(cp); }
bool number(std::uint32_t cp) { return cp != kInvalidCp && is_number(cp); }
bool space(std::uint32_t cp) { return cp != kInvalidCp && is_space(cp); }
bool other(std::uint32_t cp) { return !space(cp) && !letter(cp) && !number(cp); }

// One match of the GPT-2 pattern
//   's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
// starting at code point `i` of `c[0, n)`, with backtracking written out by hand: returns the
// end of the match (always > i). The piece boundaries act as the end of text, as in both
// llama.cpp and HF, which run the pattern on each piece of the previous split separately.
// Cost O(match length): the three ` ?X+` classes are disjoint, so at most one run is scanned,
// and the whitespace alternatives scan the same run once; a text is thus split in linear time
// whatever its runs of one letter, digit, space or punctuation mark.
std::size_t gpt2_match(const Cp* c, std::size_t i, std::size_t n) {
  auto at = [&](std::size_t k) { return k < n ? c[k].cp : kInvalidCp - 1; };  // past end: none
  const std::uint32_t c0 = at(i);
  if (c0 == '\'' && i + 1 < n) {
    const std::uint32_t c1 = at(i + 1);
    if (c1 == 's' || c1 == 't' || c1 == 'm' || c1 == 'd') return i + 2;
    if (i + 2 < n) {
      const std::uint32_t c2 = at(i + 2);
      if ((c1 == 'r' && c2 == 'e') || (c1 == 'v' && c2 == 'e') || (c1 == 'l' && c2 == 'l'))
        return i + 3;
    }
  }
  // ` ?X+` for the three classes: the optional ASCII space, then a maximal run of the class.
  const std::size_t j0 = (c0 == ' ' && i + 1 < n) ? i + 1 : i;
  auto run = [&](bool (*cls)(std::uint32_t)) -> std::size_t {
    if (j0 >= n || !cls(at(j0))) return 0;
    std::size_t j = j0;
    while (j < n && cls(at(j))) ++j;
    return j;
  };
  if (std::size_t e = run(letter)) return e;
  if (std::size_t e = run(number)) return e;
  if (std::size_t e = run(other)) return e;
  // Without the optional space (only matters when c0 is the space itself: a lone ' ' before
  // another space is handled below as whitespace).
  if (space(c0)) {
    std::size_t j = i;
    while (j < n && space(at(j))) ++j;
    // \s+(?!\S): the whole run if it reaches the end, else all but its last character
    // (which then starts the next word), provided that leaves at least one.
    if (j == n) return j;
    if (j - 1 > i) return j - 1;
    return j;  // \s+
  }
  return i + 1;  // not reachable for valid classes; keeps progress guaranteed
}

// ---- BPE candidate queue ----------------------------------------------------------------------

// A min-heap of 64-bit keys with four children per node (a d-ary heap, Johnson, "Priority
// queues with update and finding minimum spanning trees", Inf. Process. Lett. 1975). Against a
// binary heap it has half the depth, and a node's four children share one cache line, so a pop
// from a heap of millions of entries (a word of a million bytes) takes about half as many cache
// misses; below that size both are cache-resident and cost the same.
class QuadHeap {
 public:
  bool empty() const { return v_.empty(); }
  /// Appends without restoring the heap order; heapify() must follow before top/pop.
  void append(std::uint64_t x) { v_.push_back(x); }
  /// Bottom-up construction, O(size).
  void heapify() {
    if (v_.size() < 2) return;
    for (std::size_t i = (v_.size() - 2) / 4 + 1; i-- > 0;) sift_down(i, v_[i]);
  }
  void push(std::uint64_t x) {
    std::size_t i = v_.size();
    v_.push_back(x);
    while (i > 0) {
      const std::size_t p = (i - 1) / 4;
      if (v_[p] <= x) break;
      v_[i] = v_[p];
      i = p;
    }
    v_[i] = x;
  }
  std::uint64_t pop() {
    const std::uint64_t top = v_.front();
    const std::uint64_t last = v_.back();
    v_.pop_back();
    if (!v_.empty()) sift_down(0, last);
    return top;
  }

 private:
  // Places x at the hole i, moving smaller children up.
  void sift_down(std::size_t i, std::uint64_t x) {
    const std::size_t n = v_.size();
    for (;;) {
      const std::size_t c = 4 * i + 1;
      if (c >= n) break;
      std::size_t m = c;
      const std::size_t end = std::min(c + 4, n);
      for (std::size_t k = c + 1; k < end; ++k)
        if (v_[k] < v_[m]) m = k;
      if (v_[m] >= x) break;
      v_[i] = v_[m];
      i = m;
    }
    v_[i] = x;
  }

  std::vector<std::uint64_t> v_;
};

}  // namespace

// ---- Tokenizer -------------------------------------------------------------------------------

Tokenizer::Tokenizer(TokenizerConfig cfg) : cfg_(std::move(cfg)) {
  NUMATTN_CHECK(cfg_.model == "gpt2" || cfg_.model == "llama",
                "tokenizer model '{}' is not supported: byte-level BPE ('gpt2') and SentencePiece ('llama') "
                "are implemented (WordPiece 'bert', 'rwkv' and 't5' are not)",
                cfg_.model);
  NUMATTN_CHECK(cfg_.scores.empty() || cfg_.scores.size() == cfg_.tokens.size(),
                "tokenizer.ggml.scores has {} entries for {} tokens", cfg_.scores.size(), cfg_.tokens.size());
  for (std::size_t i = 0; i < cfg_.scores.size(); ++i)
    NUMATTN_CHECK(std::isfinite(cfg_.scores[i]), "tokenizer.ggml.scores[{}] = {} is not finite (a merge priority)", i,
                  cfg_.scores[i]);
  static const char* kDigitSplit[] = {"smollm", "starcoder", "refact", "command-r", "codeshell"};
  static const char* kPlain[] = {"gpt-2", "gpt2", "default", "mpt", "olmo"};
  bool known = false;
  for (const char* p : kDigitSplit)
    if (cfg_.pre == p) known = split_digits_ = true;
  for (const char* p : kPlain)
    if (cfg_.pre == p) known = true;
  NUMATTN_CHECK(known || spm(),
                "pre-tokenizer '{}' is not supported; supported: smollm, starcoder, refact, "
                "command-r, codeshell, gpt-2, default, mpt, olmo",
                cfg_.pre);
  const auto n = static_cast<std::int32_t>(cfg_.tokens.size());
  NUMATTN_CHECK(n > 0, "tokenizer has an empty vocabulary");
  NUMATTN_CHECK(cfg_.token_types.empty() || cfg_.token_types.size() == cfg_.tokens.size(),
                "tokenizer.ggml.token_type has {} entries for {} tokens", cfg_.token_types.size(),
                cfg_.tokens.size());
  for (std::int32_t id : {cfg_.bos_id, cfg_.eos_id, cfg_.unk_id})
    NUMATTN_CHECK(id >= -1 && id < n, "special token id {} is outside the vocabulary of {}", id,
                  n);
  token_to_id_.reserve(cfg_.tokens.size());
  for (std::int32_t i = 0; i < n; ++i) token_to_id_.emplace(cfg_.tokens[i], i);  // first wins
  merge_rank_.reserve(cfg_.merges.size());
  for (std::size_t r = 0; r < cfg_.merges.size(); ++r) {
    const std::string& m = cfg_.merges[r];
    const auto sp = m.find(' ');
    NUMATTN_CHECK(sp != std::string::npos && sp > 0 && sp + 1 < m.size() &&
                      m.find(' ', sp + 1) == std::string::npos,
                  "tokenizer.ggml.merges[{}] = '{}' is not of the form 'A B' (two symbols joined by one "
                  "space)", r, m);
    merge_rank_.emplace(m, static_cast<std::int32_t>(r));
    max_merge_bytes_ = std::max(max_merge_bytes_, m.size());
  }
  for (int b = 0; b < 256; ++b) {
    // SentencePiece's byte-fallback tokens are "<0xXX>"; byte-level BPE's are the byte's
    // printable stand-in.
    auto it = token_to_id_.find(spm() ? fmt::format("<0x{:02X}>", b) : alphabet().to_utf8[b]);
    byte_token_[b] = it == token_to_id_.end() ? -1 : it->second;
  }
  for (std::int32_t i = 0; i < n; ++i) {
    const TokenType t = token_type(i);
    if ((t == TokenType::kControl || t == TokenType::kUserDefined) && !cfg_.tokens[i].empty())
      specials_.push_back(i);
  }
  std::stable_sort(specials_.begin(), specials_.end(), [&](std::int32_t a, std::int32_t b) {
    return cfg_.tokens[a].size() > cfg_.tokens[b].size();
  });
}

const std::string& Tokenizer::token_text(std::int32_t id) const {
  NUMATTN_CHECK(id >= 0 && id < vocab_size(), "token id {} is outside the vocabulary of {}", id,
                vocab_size());
  return cfg_.tokens[static_cast<std::size_t>(id)];
}

TokenType Tokenizer::token_type(std::int32_t id) const {
  if (cfg_.token_types.empty()) return TokenType::kNormal;
  return static_cast<TokenType>(cfg_.token_types[static_cast<std::size_t>(id)]);
}

std::vector<std::string> Tokenizer::pre_tokenize(std::string_view text) const {
  std::vector<Cp> cps;
  for (std::size_t i = 0; i < text.size();) {
    std::uint32_t cp;
    const std::size_t len = decode_utf8(text, i, cp);
    cps.push_back({cp, i});
    i += len;
  }
  // First split (digit-splitting pre-tokenizers): every \p{N} code point is its own piece.
  std::vector<std::pair<std::size_t, std::size_t>> pieces;  // code point ranges
  if (split_digits_) {
    std::size_t start = 0;
    for (std::size_t k = 0; k < cps.size(); ++k) {
      if (number(cps[k].cp)) {
        if (k > start) pieces.emplace_back(start, k);
        pieces.emplace_back(k, k + 1);
        start = k + 1;
      }
    }
    if (start < cps.size()) pieces.emplace_back(start, cps.size());
  } else if (!cps.empty()) {
    pieces.emplace_back(0, cps.size());
  }
  std::vector<std::string> out;
  auto byte_at = [&](std::size_t k) { return k < cps.size() ? cps[k].byte : text.size(); };
  for (auto [b, e] : pieces) {
    // The GPT-2 pattern on the sub-range, whose end acts as end of text.
    const Cp* sub = cps.data() + b;
    for (std::size_t i = 0; i < e - b;) {
      const std::size_t j = gpt2_match(sub, i, e - b);
      out.emplace_back(text.substr(byte_at(b + i), byte_at(b + j) - byte_at(b + i)));
      i = j;
    }
  }
  return out;
}

void Tokenizer::bpe_piece(std::string_view piece, std::vector<std::int32_t>& out) const {
  // Byte-pair encoding (Sennrich, Haddow & Birch, "Neural Machine Translation of Rare Words with
  // Subword Units", ACL 2016) as GPT-2 applies it (Radford et al., "Language Models are
  // Unsupervised Multitask Learners", 2019): merge the adjacent pair of lowest merge rank, the
  // leftmost one among equal ranks, until no adjacent pair is a merge. Rescanning the word for
  // each merge costs O(n^2) for a word of n bytes (a long run of one letter, a base64 blob, a
  // minified line); here the symbols form a doubly linked list over the piece's bytes and the
  // candidate pairs sit in a min-heap (QuadHeap) keyed by (rank, offset of the left symbol). A
  // merge changes only the pairs touching it: the (at most two) new ones are pushed and the old
  // ones stay in the heap, recognised as stale when they come to the top (lazy deletion). Each
  // merge removes a symbol, so there are fewer than n merges and 3n pushes: O(n log n) time and
  // O(n) memory. The result is the rescan's, merge for merge: every live adjacent pair has a heap
  // entry, and a symbol keeps the offset of its first byte, so (rank, offset) orders the live
  // pairs exactly as "lowest rank, then leftmost" does.
  const std::size_t n = piece.size();
  if (n == 0) return;
  NUMATTN_CHECK(n < kNoSymbol,
                "a pre-tokenized word of {} bytes is longer than the {} bytes the "
                "tokenizer's symbol indices can address",
                n, kNoSymbol - 1);
  const ByteAlphabet& ab = alphabet();
  // The piece in the byte alphabet (1 or 2 UTF-8 bytes per input byte); a symbol is the slice
  // enc[off, off + len), and the live symbols tile enc in list order. len = 0 marks a symbol
  // merged into its left neighbour; rank is the merge rank of the pair (this, next), -1 if that
  // pair is no merge.
  struct Sym {
    std::uint32_t off, len, prev, next;
    std::int32_t rank;
  };
  std::string enc;
  enc.reserve(2 * n);
  std::vector<Sym> sym(n);
  for (std::size_t k = 0; k < n; ++k) {
    const std::string& u = ab.to_utf8[static_cast<unsigned char>(piece[k])];
    sym[k] = {static_cast<std::uint32_t>(enc.size()), static_cast<std::uint32_t>(u.size()),
              k == 0 ? kNoSymbol : static_cast<std::uint32_t>(k - 1),
              k + 1 < n ? static_cast<std::uint32_t>(k + 1) : kNoSymbol, -1};
    enc += u;
  }
  const std::string_view encv = enc;
  auto text = [&](std::uint32_t k) { return encv.substr(sym[k].off, sym[k].len); };

  // Heap entries are (rank << 32 | offset of the left symbol), so integer order is (rank,
  // offset) order, in 8 bytes. An entry is stale once its left symbol was merged away or the
  // pair starting there changed; a changed pair has another rank (a rank names one "A B"
  // string, and a symbol's text only grows), so "sym[left].rank == rank" tells a live entry.
  QuadHeap heap;
  std::string key;  // "A B", reused so that a lookup does not allocate
  // Sets the rank of the pair starting at symbol l; if it is a merge, returns its heap key.
  auto rank_pair = [&](std::uint32_t l) -> std::optional<std::uint64_t> {
    if (l == kNoSymbol) return std::nullopt;
    Sym& s = sym[l];
    s.rank = -1;
    if (s.next == kNoSymbol) return std::nullopt;
    if (std::size_t{s.len} + sym[s.next].len + 1 > max_merge_bytes_) return std::nullopt;
    key.assign(text(l)).append(1, ' ').append(text(s.next));
    auto it = merge_rank_.find(key);
    if (it == merge_rank_.end()) return std::nullopt;
    s.rank = it->second;
    return static_cast<std::uint64_t>(s.rank) << 32 | l;
  };
  for (std::size_t k = 0; k + 1 < n; ++k)
    if (auto e = rank_pair(static_cast<std::uint32_t>(k))) heap.append(*e);
  heap.heapify();
  while (!heap.empty()) {
    const std::uint64_t top = heap.pop();
    const auto left = static_cast<std::uint32_t>(top);
    Sym& l = sym[left];
    if (l.len == 0 || l.rank != static_cast<std::int32_t>(top >> 32)) continue;  // stale
    Sym& r = sym[l.next];
    l.len += r.len;
    l.next = r.next;
    if (r.next != kNoSymbol) sym[r.next].prev = left;
    r.len = 0;
    if (auto e = rank_pair(l.prev)) heap.push(*e);
    if (auto e = rank_pair(left)) heap.push(*e);
  }

  for (std::uint32_t k = 0; k != kNoSymbol; k = sym[k].next) {
    key.assign(text(k));
    auto it = token_to_id_.find(key);
    if (it != token_to_id_.end()) {
      out.push_back(it->second);
      continue;
    }
    // Not in the vocabulary: one token per byte (encode() checked that each byte has one).
    for (std::size_t j = 0; j < key.size();) {
      std::uint32_t cp;
      j += decode_utf8(key, j, cp);
      auto b = ab.from_cp.find(cp);
      NUMATTN_ASSERT(b != ab.from_cp.end() && byte_token_[b->second] >= 0);
      out.push_back(byte_token_[b->second]);
    }
  }
}

void Tokenizer::encode_fragment(
    std::string_view text, std::vector<std::int32_t>& out,
    std::unordered_map<std::string, std::vector<std::int32_t>>& cache) const {
  for (const std::string& piece : pre_tokenize(text)) {
    // Words recur in prose, so their ids are memoised within one encode() call. Long pieces
    // (a base64 blob, a run of one character) rarely recur; memoising them would only hold a
    // second copy of the text, so they are encoded afresh.
    if (piece.size() > kMaxMemoisedPiece) {
      bpe_piece(piece, out);
      continue;
    }
    auto it = cache.find(piece);
    if (it == cache.end()) {
      std::vector<std::int32_t> ids;
      bpe_piece(piece, ids);
      it = cache.emplace(piece, std::move(ids)).first;
    }
    out.insert(out.end(), it->second.begin(), it->second.end());
  }
}

std::vector<std::int32_t> Tokenizer::encode(std::string_view text, bool add_bos,
                                            bool parse_special) const {
  std::vector<std::int32_t> out;
  if (add_bos) {
    NUMATTN_CHECK(cfg_.bos_id >= 0, "add_bos requested but the vocabulary has no BOS token");
    out.push_back(cfg_.bos_id);
  }
  // Fragments: either a special token (id >= 0) or raw text (id = -1).
  struct Frag {
    std::int32_t id;
    std::string_view text;
  };
  std::vector<Frag> frags{{-1, text}};
  for (std::int32_t sid : specials_) {
    if (!parse_special && token_type(sid) == TokenType::kControl) continue;
    const std::string& st = cfg_.tokens[static_cast<std::size_t>(sid)];
    std::vector<Frag> next;
    for (const Frag& f : frags) {
      if (f.id >= 0) {
        next.push_back(f);
        continue;
      }
      std::string_view rest = f.text;
      for (std::size_t pos; (pos = rest.find(st)) != std::string_view::npos;) {
        if (pos > 0) next.push_back({-1, rest.substr(0, pos)});
        next.push_back({sid, {}});
        rest = rest.substr(pos + st.size());
      }
      if (!rest.empty()) next.push_back({-1, rest});
    }
    frags.swap(next);
  }
  // Every byte of the plain text must have its byte token: the unknown token (often a control
  // token such as <|endoftext|>) would silently change the text, and dropping bytes would too.
  for (const Frag& f : frags) {
    if (f.id >= 0) continue;
    for (std::size_t k = 0; k < f.text.size(); ++k) {
      const auto b = static_cast<unsigned char>(f.text[k]);
      if (byte_token_[b] >= 0) continue;
      int missing = 0;
      for (std::int32_t t : byte_token_) missing += t < 0;
      throw Error(fmt::format(
          "byte 0x{:02X} at offset {} of the text has no token in this vocabulary, which lacks "
          "{} of the 256 byte tokens{}",
          b, static_cast<std::size_t>(f.text.data() - text.data()) + k, missing,
          b >= 0x80 ? " (if the text is not UTF-8, convert it, e.g. iconv -f latin1 -t utf-8)"
                    : ""));
    }
  }
  if (spm()) {
    // A fragment after BOS, a special token or the start gets the leading space (when the
    // vocabulary asks for it); spaces become ▁; the fragment is merged whole.
    bool after_special = true;
    std::string buf;
    for (const Frag& f : frags) {
      if (f.id >= 0) {
        out.push_back(f.id);
        after_special = true;
        continue;
      }
      buf.clear();
      if (cfg_.add_space_prefix && after_special) buf += kSpmSpace;
      for (char ch : f.text) {
        if (ch == ' ') buf += kSpmSpace;
        else buf += ch;
      }
      spm_piece(buf, out);
      after_special = false;
    }
    return out;
  }
  std::unordered_map<std::string, std::vector<std::int32_t>> cache;
  for (const Frag& f : frags) {
    if (f.id >= 0) out.push_back(f.id);
    else encode_fragment(f.text, out, cache);
  }
  return out;
}

void Tokenizer::spm_piece(std::string_view piece, std::vector<std::int32_t>& out) const {
  // Symbols are UTF-8 characters (length from the lead byte's high nibble, cut at the end);
  // candidate pairs sit in a max-heap by (score, then leftmost), stale entries are recognised
  // by their length when they come to the top (a symbol only grows): O(n log n).
  const std::size_t n = piece.size();
  if (n == 0) return;
  NUMATTN_CHECK(n < kNoSymbol, "a text fragment of {} bytes is longer than the {} bytes the tokenizer's symbol "
                "indices can address", n, kNoSymbol - 1);
  struct Sym {
    std::uint32_t off, len, prev, next;
  };
  std::vector<Sym> sym;
  sym.reserve(n);
  static constexpr std::uint8_t kLen[16] = {1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 3, 4};
  for (std::size_t off = 0; off < n;) {
    const std::size_t len = std::min<std::size_t>(kLen[static_cast<unsigned char>(piece[off]) >> 4], n - off);
    const auto k = static_cast<std::uint32_t>(sym.size());
    sym.push_back({static_cast<std::uint32_t>(off), static_cast<std::uint32_t>(len), k == 0 ? kNoSymbol : k - 1,
                   off + len < n ? k + 1 : kNoSymbol});
    off += len;
  }
  struct Pair {
    float score;
    std::uint32_t left, right, size;
  };
  // Max-heap: higher score first, then the smaller left index.
  auto below = [](const Pair& a, const Pair& b) {
    return a.score < b.score || (a.score == b.score && a.left > b.left);
  };
  std::priority_queue<Pair, std::vector<Pair>, decltype(below)> heap(below);
  std::string key;  // reused so that a lookup does not allocate
  auto try_pair = [&](std::uint32_t l, std::uint32_t r) {
    if (l == kNoSymbol || r == kNoSymbol) return;
    const std::uint32_t size = sym[l].len + sym[r].len;
    key.assign(piece.substr(sym[l].off, size));
    auto it = token_to_id_.find(key);
    if (it == token_to_id_.end()) return;
    heap.push({cfg_.scores.empty() ? 0.f : cfg_.scores[static_cast<std::size_t>(it->second)], l, r, size});
  };
  for (std::uint32_t k = 1; k < sym.size(); ++k) try_pair(k - 1, k);
  while (!heap.empty()) {
    const Pair p = heap.top();
    heap.pop();
    Sym& l = sym[p.left];
    Sym& r = sym[p.right];
    if (l.len == 0 || r.len == 0 || l.len + r.len != p.size) continue;  // stale
    l.len += r.len;
    r.len = 0;
    l.next = r.next;
    if (r.next != kNoSymbol) sym[r.next].prev = p.left;
    try_pair(l.prev, p.left);
    try_pair(p.left, l.next);
  }
  for (std::uint32_t k = 0; k != kNoSymbol; k = sym[k].next) {
    key.assign(piece.substr(sym[k].off, sym[k].len));
    auto it = token_to_id_.find(key);
    if (it != token_to_id_.end()) {
      out.push_back(it->second);
      continue;
    }
    // Not a token: its bytes' fallback tokens (encode() checked that each byte has one).
    for (char ch : key) out.push_back(byte_token_[static_cast<unsigned char>(ch)]);
  }
}

std::string Tokenizer::token_to_piece(std::int32_t id, bool render_special) const {
  const std::string& t = token_text(id);
  switch (token_type(id)) {
    case TokenType::kControl:
    case TokenType::kUnknown:
      return render_special ? t : std::string();
    case TokenType::kUserDefined:
      return t;  // stored verbatim, not in the byte alphabet
    default:
      break;
  }
  if (spm()) {
    // "<0xXX>" is its byte; ▁ is a space.
    // A byte token's text is "<0xXX>"; one that is not (a hostile vocabulary) decodes as its text.
    auto hex = [](char ch) {
      return ch >= '0' && ch <= '9' ? ch - '0' : ch >= 'A' && ch <= 'F' ? ch - 'A' + 10 : ch >= 'a' && ch <= 'f' ? ch - 'a' + 10 : -1;
    };
    if (token_type(id) == TokenType::kByte && t.size() == 6 && t.rfind("<0x", 0) == 0 && t[5] == '>' &&
        hex(t[3]) >= 0 && hex(t[4]) >= 0)
      return std::string(1, static_cast<char>(hex(t[3]) * 16 + hex(t[4])));
    std::string out;
    for (std::size_t k = 0; k < t.size();) {
      if (t.compare(k, kSpmSpace.size(), kSpmSpace) == 0) {
        out += ' ';
        k += 3;
      } else {
        out += t[k++];
      }
    }
    return out;
  }
  const ByteAlphabet& ab = alphabet();
  std::string out;
  for (std::size_t k = 0; k < t.size();) {
    std::uint32_t cp;
    const std::size_t len = decode_utf8(t, k, cp);
    auto b = ab.from_cp.find(cp);
    if (b != ab.from_cp.end()) out += static_cast<char>(b->second);
    else out.append(t, k, len);  // not a byte-alphabet character: keep its UTF-8
    k += len;
  }
  return out;
}

std::string escape_piece(std::string_view bytes) {
  std::string out;
  for (std::size_t k = 0; k < bytes.size();) {
    std::uint32_t cp;
    const std::size_t len = decode_utf8(bytes, k, cp);
    if (cp == '\\') out += "\\\\";
    else if (cp != kInvalidCp && cp >= 0x20 && cp != 0x7F) out.append(bytes, k, len);
    else out += fmt::format("\\x{:02x}", static_cast<unsigned char>(bytes[k]));
    k += len;
  }
  return out;
}

std::string Tokenizer::decode(const std::vector<std::int32_t>& ids, bool render_special) const {
  std::string out;
  for (std::int32_t id : ids) out += token_to_piece(id, render_special);
  return out;
}

std::int32_t Tokenizer::turn_end_id() const {
  for (const char* t : {"<end_of_turn>", "<|im_end|>"})
    if (auto it = token_to_id_.find(t); it != token_to_id_.end()) return it->second;
  return -1;
}

std::string Tokenizer::chat_prompt(const std::string& user) const {
  if (token_to_id_.count("<start_of_turn>") && token_to_id_.count("<end_of_turn>"))
    return "<start_of_turn>user\n" + user + "<end_of_turn>\n<start_of_turn>model\n";
  if (token_to_id_.count("<|im_start|>") && token_to_id_.count("<|im_end|>"))
    return "<|im_start|>user\n" + user + "<|im_end|>\n<|im_start|>assistant\n";
  throw Error("this vocabulary has no chat turn tokens (neither Gemma's <start_of_turn>/<end_of_turn> nor "
              "ChatML's <|im_start|>/<|im_end|>): the model has no chat format to wrap a prompt in");
}

}  // namespace numattn
