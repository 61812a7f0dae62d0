/// @file text.h
/// Which tokens a model run reads: the one implementation of the rules that `numattn ppl`,
/// `capture`, `analyze`, `generate` and the Python `Model` share.
///
/// - A *text* (a corpus for perplexity, capture or analysis) is tokenized whole, control markers
///   such as `<|im_start|>` taken as plain text, with BOS prepended only when the vocabulary's
///   `tokenizer.ggml.add_bos_token` is set (llama.cpp's rule, `llama_vocab::get_add_bos`).
/// - A *window* of it is `length` tokens from token `offset` of that tokenization; its first token
///   is replaced by BOS per `BosMode` (model/ppl.h), as perplexity does for each chunk.
/// - A *prompt* (generation) is tokenized with control markers recognised, after the chat template
///   of the vocabulary when asked (Tokenizer::chat_prompt: ChatML for SmolLM2, Gemma 3's turns),
///   with the same BOS rule; a chat turn stops at the vocabulary's end-of-turn token.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "numattn/model/ppl.h"
#include "numattn/model/tokenizer.h"

namespace numattn {

/// Whether a text or prompt gets a BOS token in front: the vocabulary's add_bos_token.
bool prepends_bos(const Tokenizer& tok);

/// The tokens of a whole text, as perplexity, capture and analysis read it. Cost: one BPE pass.
std::vector<std::int32_t> encode_text(const Tokenizer& tok, std::string_view text);

/// Throws OptionError("tokens") when a window of `length` tokens is beyond the model's trained
/// context (`<arch>.context_length`), before anything is tokenized or loaded.
void check_window_length(const ModelHParams& hp, std::int64_t length);

/// `length` tokens of `text_tokens` from `offset`, the first replaced by BOS per `bos`.
struct TextWindowTokens {
  std::vector<std::int32_t> tokens;
  bool bos_replaced = false;
};
/// Throws OptionError("offset") for a negative offset, ("tokens") for length < 1 or a window past
/// the end of the text, ("bos") when BOS is asked of a vocabulary without one.
TextWindowTokens cut_text_window(const Tokenizer& tok, const std::vector<std::int32_t>& text_tokens,
                                 std::int64_t offset, std::int64_t length, BosMode bos);

/// Indices of layers (or heads) a run looks at: sorted, duplicates dropped. Throws
/// OptionError(option) for an empty list ("needs at least one {what} index") or an index outside
/// [0, count) ("{what} 31 is out of range: the model has {count_name} = 30 (0..29)").
std::vector<std::int64_t> checked_index_list(std::vector<std::int64_t> indices, const char* option, std::int64_t count,
                                             const char* what, const char* count_name);
/// Every index of [0, count): what "all" selects.
std::vector<std::int64_t> all_indices(std::int64_t count);

/// The tokens of a generation prompt: wrapped in the chat template when `chat` (throws Error when
/// the vocabulary has none), control markers recognised, BOS per prepends_bos.
std::vector<std::int32_t> encode_prompt(const Tokenizer& tok, const std::string& prompt, bool chat);

/// The token that ends greedy generation: the end of the model's turn in a chat (when the
/// vocabulary has one: Gemma's `<end_of_turn>` is not its EOS), else EOS.
std::int32_t generation_stop_id(const Tokenizer& tok, bool chat);

}  // namespace numattn
