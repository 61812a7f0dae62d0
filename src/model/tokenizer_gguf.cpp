// Tokenizer construction from GGUF metadata (key names: llama.cpp gguf-py constants.py,
// Keys.Tokenizer).
#include <limits>

#include "numattn/gguf/gguf.h"
#include "numattn/model/tokenizer.h"

namespace numattn {

Tokenizer Tokenizer::from_gguf(const GgufFile& f) {
  TokenizerConfig c;
  c.model = f.get_string("tokenizer.ggml.model");
  NUMATTN_CHECK(c.model == "gpt2" || c.model == "llama",
                "{}: tokenizer.ggml.model is '{}'; supported: byte-level BPE ('gpt2') and SentencePiece "
                "('llama')",
                f.path(), c.model);
  c.pre = f.get_string("tokenizer.ggml.pre", "default");
  c.tokens = f.get_string_array("tokenizer.ggml.tokens");
  if (f.has("tokenizer.ggml.merges")) c.merges = f.get_string_array("tokenizer.ggml.merges");
  if (f.has("tokenizer.ggml.scores"))
    for (double v : f.get_double_array("tokenizer.ggml.scores")) c.scores.push_back(static_cast<float>(v));
  // llama.cpp's default for SentencePiece vocabularies that do not say.
  c.add_space_prefix = f.get_bool("tokenizer.ggml.add_space_prefix", c.model == "llama");
  if (f.has("tokenizer.ggml.token_type")) {
    for (std::int64_t v : f.get_int_array("tokenizer.ggml.token_type")) {
      NUMATTN_CHECK(v >= std::numeric_limits<std::int32_t>::min() && v <= std::numeric_limits<std::int32_t>::max(),
                    "{}: tokenizer.ggml.token_type holds {}, which is not an int32 token type", f.path(), v);
      c.token_types.push_back(static_cast<std::int32_t>(v));
    }
  }
  // Special ids index the vocabulary (-1 = none); checked here, where the key is known.
  auto special = [&](const char* key) {
    const std::int64_t id = f.get_int(key, -1);
    NUMATTN_CHECK(id >= -1 && id < static_cast<std::int64_t>(c.tokens.size()),
                  "{}: {} = {} is outside the vocabulary of {} tokens (tokenizer.ggml.tokens)", f.path(), key, id,
                  c.tokens.size());
    return static_cast<std::int32_t>(id);
  };
  c.bos_id = special("tokenizer.ggml.bos_token_id");
  c.eos_id = special("tokenizer.ggml.eos_token_id");
  c.unk_id = special("tokenizer.ggml.unknown_token_id");
  c.add_bos = f.get_bool("tokenizer.ggml.add_bos_token", false);
  // The vocabulary's own checks (merges, special ids) name the key but cannot know the file.
  try {
    return Tokenizer(std::move(c));
  } catch (const Error& e) {
    throw Error(fmt::format("{}: {}", f.path(), e.what()));
  }
}

Tokenizer Tokenizer::from_gguf_path(const std::string& path) {
  return from_gguf(GgufFile::open(path));
}

}  // namespace numattn
