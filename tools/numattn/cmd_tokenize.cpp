// numattn tokenize: the token ids (and pieces) of a text under a model's tokenizer.
#include <iostream>
#include <memory>

#include "cli_common.h"
#include "commands.h"
#include "numattn/core/error.h"
#include "numattn/core/file_io.h"
#include "numattn/model/data.h"
#include "numattn/model/tokenizer.h"

namespace numattn::cli {

namespace {
struct TokenizeOptions {
  std::string model = "default", text, text_file, format = "json";
  int threads = 0;
  bool add_bos = false, no_special = false, pieces = false;
};
}  // namespace

void add_tokenize(CLI::App& app) {
  auto o = std::make_shared<TokenizeOptions>();
  auto* sub = app.add_subcommand("tokenize", "token ids of a text under a GGUF model's tokenizer");
  sub->add_option("--model", o->model, "GGUF file, or 'default' (the cached SmolLM2-135M)")
      ->capture_default_str();
  auto* text = sub->add_option("--text", o->text, "the text to tokenize");
  // A command-line argument is limited (Linux: 128 KiB), so long texts come from a file.
  auto* text_file =
      sub->add_option("--text-file", o->text_file,
                      "a file whose bytes are the text to tokenize (instead of --text)");
  text->excludes(text_file);
  sub->add_flag("--add-bos", o->add_bos, "prepend the BOS token");
  sub->add_flag("--no-special", o->no_special,
                "treat control-token markers such as <|im_start|> as plain text");
  sub->add_flag("--pieces", o->pieces,
                "also list each token's text, printable in every format: control characters and "
                "bytes that are not valid UTF-8 (part of a multi-byte character) as \\xNN, a "
                "backslash as \\\\");
  add_common(*sub, &o->threads, &o->format);
  sub->callback([o, text, text_file] {
    if (text->count() + text_file->count() != 1)
      throw Error("--text: give the text with --text TEXT or, for a long one, --text-file FILE");
    if (text_file->count()) o->text = read_file(o->text_file, "--text-file");
    const std::string path = resolve_model_path(o->model);
    const Tokenizer tok = Tokenizer::from_gguf_path(path);
    const auto ids = tok.encode(o->text, o->add_bos, !o->no_special);
    Row row;
    row["model"] = path;
    row["n_tokens"] = ids.size();
    row["ids"] = ids;
    if (o->pieces) {
      std::vector<std::string> p;
      for (auto id : ids) p.push_back(escape_piece(tok.token_to_piece(id)));
      row["pieces"] = p;
    }
    print_table(std::cout, {row}, parse_format(o->format), true);
  });
}

NUMATTN_COMMAND(72, add_tokenize);

}  // namespace numattn::cli
