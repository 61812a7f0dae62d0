// Tokenizer construction from GGUF metadata (key names: llama.cpp gguf-py constants.py,
// Keys.Tokenizer).
#include "numattn/model/gguf.h"
#include "numattn/model/tokenizer.h"

namespace numattn {

Tokenizer Tokenizer::from_gguf(const GgufFile& f) {
  TokenizerConfig c;
  c.model = f.get_string("tokenizer.ggml.model");
  NUMATTN_CHECK(c.model == "gpt2",
                "{}: tokenizer.ggml.model is '{}'; only byte-level BPE ('gpt2') is supported",
                f.path(), c.model);
  c.pre = f.get_string("tokenizer.ggml.pre", "default");
  c.tokens = f.at("tokenizer.ggml.tokens").string_array_view();
  if (const GgufValue* m = f.find("tokenizer.ggml.merges")) c.merges = m->string_array_view();
  if (const GgufValue* t = f.find("tokenizer.ggml.token_type")) {
    for (std::int64_t v : t->int_array()) c.token_types.push_back(static_cast<std::int32_t>(v));
  }
  c.bos_id = static_cast<std::int32_t>(f.get_int("tokenizer.ggml.bos_token_id", -1));
  c.eos_id = static_cast<std::int32_t>(f.get_int("tokenizer.ggml.eos_token_id", -1));
  c.unk_id = static_cast<std::int32_t>(f.get_int("tokenizer.ggml.unknown_token_id", -1));
  c.add_bos = f.get_bool("tokenizer.ggml.add_bos_token", false);
  return Tokenizer(std::move(c));
}

Tokenizer Tokenizer::from_gguf_path(const std::string& path) {
  return from_gguf(GgufFile::open(path));
}

}  // namespace numattn
