#include "text_window.h"

#include <algorithm>
#include <cstdio>
#include <filesystem>

#include "cli_common.h"
#include "numattn/core/file_io.h"
#include "numattn/core/progress.h"
#include "numattn/model/data.h"
#include "numattn/model/ppl.h"
#include "numattn/model/text.h"
#include "numattn/model/tokenizer.h"
#include "numattn/model/transform_model.h"

namespace numattn::cli {

void TextWindowFlags::add_to(CLI::App& app, const std::string& layers_help) {
  app.add_option("--model", model, "GGUF file, or 'default'")->capture_default_str();
  app.add_option("--text", text, "UTF-8 text file, or 'default' (Jane Austen)")->capture_default_str();
  app.add_option("--tokens", tokens, "N: tokens to run, at most the model's trained context (<arch>.context_length, e.g. llama.context_length)")
      ->capture_default_str();
  app.add_option("--offset", offset,
                 "first token of the window, counted in the tokenized text (as `numattn ppl` tokenizes it)")
      ->capture_default_str();
  app.add_option("--layers", layers, layers_help)->capture_default_str();
  app.add_option("--bos", bos,
                 "first token of the window: auto (replaced by BOS if the vocabulary's add_bos_token is set, "
                 "as ppl does for each chunk), replace, keep")
      ->capture_default_str();
  app.add_flag("--no-progress", no_progress, "no progress notes or bar on stderr");
}

std::vector<std::int64_t> parse_index_list(const std::string& s, const char* option, std::int64_t count,
                                           const char* what, const char* count_name) {
  if (s == "all") return all_indices(count);
  std::vector<std::int64_t> out;
  for (const std::string& item : split_list(s)) {
    std::size_t pos = 0;
    long long v = -1;
    try {
      v = std::stoll(item, &pos);
    } catch (const std::exception&) {
      pos = 0;
    }
    NUMATTN_CHECK_OPTION(pos == item.size() && pos > 0 && v >= 0, option,
                         "'{}' is not a {} index (integers >= 0, comma-separated, or 'all')", item, what);
    out.push_back(v);
  }
  return checked_index_list(std::move(out), option, count, what, count_name);
}

TextWindow open_text_window(const TextWindowFlags& f, const std::string& out, const char* label,
                            const std::function<void(const TextWindow&)>& before_tokenize) {
  // Flags alone first, then against the files' headers, then against the text: every check
  // before the model's weights are read.
  NUMATTN_CHECK_OPTION(f.tokens >= 1, "tokens", "must be at least 1, got {}", f.tokens);
  NUMATTN_CHECK_OPTION(f.offset >= 0, "offset", "must be >= 0, got {}", f.offset);
  const BosMode bos = parse_bos_mode(f.bos);
  const std::string model_path = resolve_model_path(f.model), text_path = resolve_text_path(f.text);
  for (const NamedPath& in : {NamedPath{"--model", model_path}, NamedPath{"--text", text_path}})
    NUMATTN_CHECK_OPTION(!same_file(out, in.path), "out", "'{}' is the {} file: the output directory must not be an input",
                         out, in.what);
  check_output_option("--out", out, OutputKind::kDirectory);
  const std::string text = read_file(text_path, "--text file", kTextInput);
  TextWindow w{model_path, text_path, GgufFile::open(model_path), {}, {}, {}, 0, false};
  w.hp = LlamaModel::read_hparams(w.file);
  w.layers = parse_index_list(f.layers, "layers", w.hp.n_layer, "layer", "n_layer");
  // The caller's checks (outputs that would overwrite an input first) before the window's.
  if (before_tokenize) before_tokenize(w);
  check_window_length(w.hp, f.tokens);

  const Tokenizer tok = Tokenizer::from_gguf(w.file);
  if (!f.no_progress) std::fprintf(stderr, "%s: tokenizing %s\n", label, w.text_path.c_str());
  const auto all = encode_text(tok, text);
  w.text_tokens = static_cast<std::int64_t>(all.size());
  TextWindowTokens cut = cut_text_window(tok, all, f.offset, f.tokens, bos);
  w.tokens = std::move(cut.tokens);
  w.bos_replaced = cut.bos_replaced;
  return w;
}

std::string capture_refusal(const transform::TransformPipeline& p) {
  for (const transform::TransformStage& s : p.stages)
    if (s.info->family != "tensor" || (p.tensor && p.tensor->is_cp()))
      return s.info->name + " replaces the GQA layers whose q, k, v are captured (only tensor.tucker_* keep them)";
  return "";
}

std::vector<LayerTensors> capture_layers(const TextWindow& w, RopeState rope, bool progress, const char* label,
                                         const ExecContext& ctx, const transform::TransformPipeline& transforms,
                                         const CancelToken* cancel) {
  if (progress) std::fprintf(stderr, "%s: loading %s\n", label, w.model_path.c_str());
  LlamaModel model = LlamaModel::load(w.file, ctx);
  const std::string refusal = capture_refusal(transforms);
  NUMATTN_CHECK_OPTION(refusal.empty(), "transform", "{}", refusal);
  if (!transforms.empty()) apply_transforms(model, Tokenizer::from_gguf(w.file), transforms, ctx, progress);
  const auto N = static_cast<index_t>(w.tokens.size());
  const index_t D = w.hp.head_dim;
  std::vector<int> slot(static_cast<std::size_t>(w.hp.n_layer), -1);
  for (std::size_t i = 0; i < w.layers.size(); ++i) slot[static_cast<std::size_t>(w.layers[i])] = static_cast<int>(i);
  std::vector<LayerTensors> out(w.layers.size());
  auto copy = [&](const TensorView<const float>& src, std::vector<float>& dst) {
    const index_t H = src.shape[1];
    dst.resize(static_cast<std::size_t>(H * N * D));
    for (index_t h = 0; h < H; ++h)
      for (index_t i = 0; i < N; ++i)
        for (index_t d = 0; d < D; ++d) dst[static_cast<std::size_t>((h * N + i) * D + d)] = src(0, h, i, d);
  };
  ProgressBar bar(std::string(label) + " forward", w.hp.n_layer,
                  progress ? ProgressBar::Mode::kAuto : ProgressBar::Mode::kOff);
  ForwardOptions fo;
  fo.logits_begin = N;  // no logits are needed
  fo.capture = [&](const QkvCapture& c) {
    bar.set(c.layer + 1, "layer " + std::to_string(c.layer));
    if (cancel)
      cancel->check([&] { return fmt::format("{}: stopped after {} of {} layers", label, c.layer + 1, w.hp.n_layer); });
    const int s = slot[static_cast<std::size_t>(c.layer)];
    if (s < 0) return;
    LayerTensors& t = out[static_cast<std::size_t>(s)];
    if (rope != RopeState::kPre) copy(c.q_post, t.q_post), copy(c.k_post, t.k_post);
    if (rope != RopeState::kPost) copy(c.q_pre, t.q_pre), copy(c.k_pre, t.k_pre);
    copy(c.v, t.v);
  };
  KvCache cache = model.make_cache(N);
  model.forward(w.tokens, cache, ctx, fo);
  bar.finish();
  return out;
}

}  // namespace numattn::cli
