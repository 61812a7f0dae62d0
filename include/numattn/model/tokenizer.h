/// @file tokenizer.h
/// Byte-level BPE (GPT-2 style) and SentencePiece tokenizers, built from GGUF tokenizer metadata.
///
/// Protocol (the one llama.cpp's `llama-vocab.cpp` and Hugging Face `tokenizers` implement for
/// `tokenizer.ggml.model = "gpt2"`):
/// 1. special tokens are cut out of the text as whole tokens: user-defined tokens (type 4)
///    always, control tokens (type 3) only when `parse_special`; longer ones win;
/// 2. the pre-tokenizer named by `tokenizer.ggml.pre` splits each remaining fragment with its
///    regex list, applied in sequence (each regex splits the pieces of the previous one; the
///    text between matches is kept as pieces too);
/// 3. each piece's UTF-8 bytes are mapped to GPT-2's printable `bytes_to_unicode` alphabet
///    (space → `Ġ`, newline → `Ċ`) and the adjacent pair with the lowest merge rank is merged
///    until no ranked pair remains (ties: leftmost first);
/// 4. the symbols are looked up in the vocabulary (a missing symbol falls back to its byte
///    tokens).
/// Any byte sequence is accepted, valid UTF-8 or not: an invalid sequence (lone continuation
/// byte, truncated or overlong sequence, surrogate, 0xF8..0xFF) is split byte by byte and
/// pre-tokenized like punctuation, and each byte still maps to its own byte token, so
/// `decode(encode(x)) == x`. A vocabulary may lack some byte tokens (SmolLM2's lacks 21 bytes
/// that valid UTF-8 text rarely or never contains: 0x04 0x06 0x13 0x14 0x16 0x1D 0xC0 0xC1 0xF1
/// 0xF2 0xF5..0xFF); a text holding such a byte is refused by `encode` with an Error naming the
/// byte and its offset. The unknown token is never produced: in GGUF files it is often a
/// control token (SmolLM2: `<|endoftext|>`), which would silently change the text.
/// Decoding maps normal tokens back through the byte alphabet; control tokens render as their
/// text when asked to (`render_special`), else as nothing.
///
/// SentencePiece vocabularies (`tokenizer.ggml.model = "llama"`: Llama 2, Gemma) take the path
/// llama.cpp's SPM tokenizer takes (Kudo & Richardson, "SentencePiece", 2018, its BPE model):
/// step 1 as above; each raw fragment gets a leading space when `add_space_prefix` and it
/// follows BOS, a special token or the start; spaces become `▁` (U+2581); the fragment is split
/// into UTF-8 characters (a byte whose lead nibble says more bytes than remain ends the text)
/// and the adjacent pair whose concatenation is a token of highest score is merged (ties: the
/// leftmost), until no adjacent pair forms a token; a symbol that is not a token becomes its
/// byte tokens `<0xXX>`. There is no pre-tokenizer: a fragment is merged whole. Decoding maps
/// `▁` back to a space and `<0xXX>` to its byte.
///
/// Supported pre-tokenizers (byte-level BPE): `gpt-2` (and its aliases `default`, `mpt`, `olmo`) and `smollm`
/// (also `starcoder`, `refact`, `command-r`, `codeshell`, which llama.cpp treats identically):
/// `\p{N}` (every digit alone), then
/// `'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+`.
/// Other `tokenizer.ggml.model` / `pre` values are refused by name.
///
/// Cost: O(n log n) time and O(n) memory for a text of n bytes, whatever its content (a long run
/// of one character or a base64 blob is one pre-tokenized piece): the special-token cut is one
/// linear scan per special token, the pre-tokenizer is linear, and each piece of m bytes is
/// merged in O(m log m) with a linked list of symbols and a min-heap of candidate pairs (about
/// 0.2 s for a million-byte run of one letter with SmolLM2's vocabulary). Pieces of up to 256
/// bytes are memoised within one `encode` call, so prose costs about one hash lookup per word.
/// A piece of 2^32 - 1 bytes or more is refused with an Error.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace numattn {

class GgufFile;

/// GGUF `tokenizer.ggml.token_type` values.
enum class TokenType : std::int32_t {
  kUndefined = 0,
  kNormal = 1,
  kUnknown = 2,
  kControl = 3,
  kUserDefined = 4,
  kUnused = 5,
  kByte = 6,
};

/// Everything a tokenizer is built from, as plain vectors (what the GGUF metadata holds).
struct TokenizerConfig {
  std::string model = "gpt2";  ///< tokenizer.ggml.model
  std::string pre = "gpt-2";   ///< tokenizer.ggml.pre
  std::vector<std::string> tokens;
  std::vector<std::string> merges;          ///< "A B", rank = index (gpt2)
  std::vector<float> scores;                ///< per token (llama/SPM: the merge priority); empty = 0
  bool add_space_prefix = true;             ///< tokenizer.ggml.add_space_prefix (SPM)
  std::vector<std::int32_t> token_types;    ///< empty = all normal
  std::int32_t bos_id = -1, eos_id = -1, unk_id = -1;
  bool add_bos = false;                     ///< tokenizer.ggml.add_bos_token
};

/// `bytes` (e.g. a token's piece) as printable UTF-8 text from which every byte can be
/// recovered: valid UTF-8 characters from U+0020 on, except U+007F, stand for themselves; a
/// backslash is written `\\`; every other byte (a control character, or a byte that is not
/// part of valid UTF-8, such as a token holding half of a multi-byte character) is written
/// `\xNN` (lowercase hex). `numattn tokenize --pieces` prints pieces this way in every format.
std::string escape_piece(std::string_view bytes);

class Tokenizer {
 public:
  /// Validates the config (model and pre-tokenizer supported, ids in range, merge syntax).
  explicit Tokenizer(TokenizerConfig cfg);

  /// Reads `tokenizer.ggml.*` from an opened GGUF file.
  static Tokenizer from_gguf(const GgufFile& file);
  /// Opens a GGUF file and reads its tokenizer only.
  static Tokenizer from_gguf_path(const std::string& path);

  /// Token ids of `text` (any bytes). `add_bos` prepends BOS; `parse_special` recognises
  /// control tokens (e.g. `<|im_start|>`) written in the text. Throws `numattn::Error` for a
  /// byte without a byte token in this vocabulary (see above).
  std::vector<std::int32_t> encode(std::string_view text, bool add_bos = false,
                                   bool parse_special = true) const;
  /// The text of `ids` (exact inverse of `encode` for text without special tokens).
  std::string decode(const std::vector<std::int32_t>& ids, bool render_special = true) const;
  /// The bytes one token stands for (empty for a control token unless `render_special`).
  std::string token_to_piece(std::int32_t id, bool render_special = true) const;

  /// `user` as one user turn followed by the opening of the model's turn, in the chat format
  /// this vocabulary's control tokens mark: Gemma's `<start_of_turn>user\n…<end_of_turn>\n
  /// <start_of_turn>model\n` or ChatML's `<|im_start|>user\n…<|im_end|>\n<|im_start|>assistant\n`.
  /// Throws numattn::Error when the vocabulary has neither.
  std::string chat_prompt(const std::string& user) const;
  /// The token that ends a turn in that chat format (`<end_of_turn>` or `<|im_end|>`), -1 if none.
  std::int32_t turn_end_id() const;

  /// The pre-tokenizer's split of `text` (step 2 only), for tests and debugging.
  std::vector<std::string> pre_tokenize(std::string_view text) const;

  std::int32_t vocab_size() const { return static_cast<std::int32_t>(cfg_.tokens.size()); }
  std::int32_t bos_id() const { return cfg_.bos_id; }
  std::int32_t eos_id() const { return cfg_.eos_id; }
  bool add_bos() const { return cfg_.add_bos; }
  const std::string& pre() const { return cfg_.pre; }
  const std::string& token_text(std::int32_t id) const;
  TokenType token_type(std::int32_t id) const;

 private:
  void encode_fragment(std::string_view text, std::vector<std::int32_t>& out,
                       std::unordered_map<std::string, std::vector<std::int32_t>>& cache) const;
  void bpe_piece(std::string_view piece, std::vector<std::int32_t>& out) const;
  void spm_piece(std::string_view piece, std::vector<std::int32_t>& out) const;
  bool spm() const { return cfg_.model == "llama"; }

  TokenizerConfig cfg_;
  bool split_digits_ = false;  ///< the `\p{N}` pre-split of smollm & co
  std::unordered_map<std::string, std::int32_t> token_to_id_;
  std::unordered_map<std::string, std::int32_t> merge_rank_;  ///< key "A B"
  std::vector<std::int32_t> specials_;  ///< control + user-defined ids, longest text first
  std::int32_t byte_token_[256];        ///< id of each byte's one-symbol token, -1 if none
  std::size_t max_merge_bytes_ = 0;     ///< longest "A B" merge string
  static constexpr std::uint32_t kNoSymbol = 0xFFFFFFFFu;  ///< list end in bpe_piece
  static constexpr std::size_t kMaxMemoisedPiece = 256;     ///< longer pieces are not memoised
};

}  // namespace numattn
