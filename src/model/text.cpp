#include "numattn/model/text.h"

#include <algorithm>

#include "numattn/core/error.h"

namespace numattn {

bool prepends_bos(const Tokenizer& tok) { return tok.add_bos(); }

std::vector<std::int32_t> encode_text(const Tokenizer& tok, std::string_view text) {
  // A corpus may quote a chat log: its markers are text, not turns.
  return tok.encode(text, prepends_bos(tok), false);
}

void check_window_length(const ModelHParams& hp, std::int64_t length) {
  NUMATTN_CHECK_OPTION(length <= hp.n_ctx_train, "tokens", "{} tokens is beyond the model's trained context of {} ({})",
                       length, hp.n_ctx_train, hp.key(hparam_key::kContext));
}

TextWindowTokens cut_text_window(const Tokenizer& tok, const std::vector<std::int32_t>& text_tokens,
                                 std::int64_t offset, std::int64_t length, BosMode bos) {
  NUMATTN_CHECK_OPTION(length >= 1, "tokens", "must be at least 1, got {}", length);
  NUMATTN_CHECK_OPTION(offset >= 0, "offset", "must be >= 0, got {}", offset);
  const auto n_text = static_cast<std::int64_t>(text_tokens.size());
  NUMATTN_CHECK_OPTION(offset <= n_text && length <= n_text - offset, "tokens",
                       "the text has {} tokens: `offset` {} + `tokens` {} = {} is beyond it", n_text, offset, length,
                       offset + length);
  TextWindowTokens w;
  w.tokens.assign(text_tokens.begin() + offset, text_tokens.begin() + offset + length);
  w.bos_replaced = bos == BosMode::kReplace || (bos == BosMode::kAuto && prepends_bos(tok));
  NUMATTN_CHECK_OPTION(!w.bos_replaced || tok.bos_id() >= 0, "bos", "the vocabulary has no BOS token to put first ({})", to_string(bos));
  if (w.bos_replaced) w.tokens[0] = tok.bos_id();
  return w;
}

std::vector<std::int64_t> checked_index_list(std::vector<std::int64_t> indices, const char* option, std::int64_t count,
                                             const char* what, const char* count_name) {
  NUMATTN_CHECK_OPTION(!indices.empty(), option, "needs at least one {} index (or 'all')", what);
  for (std::int64_t v : indices)
    NUMATTN_CHECK_OPTION(v >= 0 && v < count, option, "{} {} is out of range: the model has {} = {} (0..{})", what, v,
                         count_name, count, count - 1);
  std::sort(indices.begin(), indices.end());
  indices.erase(std::unique(indices.begin(), indices.end()), indices.end());
  return indices;
}

std::vector<std::int64_t> all_indices(std::int64_t count) {
  std::vector<std::int64_t> out(static_cast<std::size_t>(std::max<std::int64_t>(count, 0)));
  for (std::int64_t i = 0; i < count; ++i) out[static_cast<std::size_t>(i)] = i;
  return out;
}

std::vector<std::int32_t> encode_prompt(const Tokenizer& tok, const std::string& prompt, bool chat) {
  return tok.encode(chat ? tok.chat_prompt(prompt) : prompt, prepends_bos(tok), true);
}

std::int32_t generation_stop_id(const Tokenizer& tok, bool chat) {
  return chat && tok.turn_end_id() >= 0 ? tok.turn_end_id() : tok.eos_id();
}

}  // namespace numattn
