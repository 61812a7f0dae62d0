// numattn capture: the Q, K, V a model's attention layers see on a text, written as .npy files
// with a manifest, so that every method can be measured on real attention inputs
// (`run/bench --qkv DIR --layer L`, qkv_source.h).
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <iostream>
#include <memory>
#include <set>

#include "cli_common.h"
#include "commands.h"
#include "numattn/core/file_io.h"
#include "numattn/core/memory.h"
#include "numattn/core/npy.h"
#include "numattn/model/data.h"
#include "numattn/model/gguf.h"
#include "numattn/model/llama.h"
#include "numattn/model/ppl.h"
#include "numattn/model/tokenizer.h"
#include "qkv_source.h"

namespace numattn::cli {

namespace {

struct CaptureOptions {
  std::string model = "default", text = "default", layers = "0", out, bos = "auto", format = "md";
  std::int64_t tokens = 2048, offset = 0;
  bool pre_rope = false, no_progress = false;
  int threads = 0;
};

// "0,15,29" or "all"; each entry an integer >= 0 (the range is checked against the model).
std::vector<std::int64_t> parse_layers(const std::string& s) {
  std::vector<std::int64_t> out;
  if (s == "all") return out;  // filled in from n_layer
  for (const std::string& item : split_list(s)) {
    std::size_t pos = 0;
    long long v = -1;
    try {
      v = std::stoll(item, &pos);
    } catch (const std::exception&) {
      pos = 0;
    }
    NUMATTN_CHECK_OPTION(pos == item.size() && pos > 0 && v >= 0, "layers",
                         "'{}' is not a layer index (integers >= 0, comma-separated, or 'all')", item);
    out.push_back(v);
  }
  NUMATTN_CHECK_OPTION(!out.empty(), "layers", "needs at least one layer index (or 'all')");
  std::sort(out.begin(), out.end());
  out.erase(std::unique(out.begin(), out.end()), out.end());
  return out;
}

}  // namespace

void add_capture(CLI::App& app) {
  auto o = std::make_shared<CaptureOptions>();
  auto* sub = app.add_subcommand(
      "capture", "write the Q, K, V that a model's attention layers see on a text as .npy "
                 "files [H,N,D] plus manifest.json (input of run/bench --qkv DIR --layer L)");
  sub->add_option("--model", o->model, "GGUF file, or 'default'")->capture_default_str();
  sub->add_option("--text", o->text, "UTF-8 text file, or 'default' (Jane Austen)")
      ->capture_default_str();
  sub->add_option("--tokens", o->tokens,
                  "N: tokens to run, at most the model's trained context (llama.context_length)")
      ->capture_default_str();
  sub->add_option("--offset", o->offset,
                  "first token of the window, counted in the tokenized text (as `numattn ppl` "
                  "tokenizes it)")
      ->capture_default_str();
  sub->add_option("--layers", o->layers, "layers to write: comma-separated indices, or 'all'")
      ->capture_default_str();
  sub->add_flag("--pre-rope", o->pre_rope, "write q and k before RoPE (default: after, what attention sees)");
  sub->add_option("--bos", o->bos,
                  "first token of the window: auto (replaced by BOS if the vocabulary's "
                  "add_bos_token is set, as ppl does for each chunk), replace, keep")
      ->capture_default_str();
  sub->add_option("--out", o->out, "output directory (created if missing)")->required();
  sub->add_flag("--no-progress", o->no_progress, "no progress lines on stderr");
  add_common(*sub, &o->threads, &o->format);
  sub->callback([o] {
    ExecContext ctx{o->threads};
    const auto t_start = std::chrono::steady_clock::now();
    // Flags alone first, then against the files' headers, then against the text: every check
    // before the model's weights are read.
    NUMATTN_CHECK_OPTION(o->tokens >= 1, "tokens", "must be at least 1, got {}", o->tokens);
    NUMATTN_CHECK_OPTION(o->offset >= 0, "offset", "must be >= 0, got {}", o->offset);
    const BosMode bos = parse_bos_mode(o->bos);
    std::vector<std::int64_t> layers = parse_layers(o->layers);
    const std::string mpath = resolve_model_path(o->model);
    const std::string tpath = resolve_text_path(o->text);
    namespace fs = std::filesystem;
    std::error_code ec;
    for (const NamedPath& in : {NamedPath{"--model", mpath}, NamedPath{"--text", tpath}})
      NUMATTN_CHECK_OPTION(!same_file(o->out, in.path), "out",
                           "'{}' is the {} file: the output directory must not be an input",
                           o->out, in.what);
    if (fs::exists(o->out, ec))
      NUMATTN_CHECK_OPTION(fs::is_directory(o->out, ec), "out",
                           "'{}' exists and is not a directory", o->out);
    const std::string text = read_file(tpath, "--text file");
    GgufFile file = GgufFile::open(mpath);
    const LlamaHParams hp = LlamaModel::read_hparams(file);
    if (layers.empty())
      for (std::int64_t l = 0; l < hp.n_layer; ++l) layers.push_back(l);
    for (std::int64_t l : layers)
      NUMATTN_CHECK_OPTION(l < hp.n_layer, "layers",
                           "layer {} is out of range: the model has n_layer = {} layers (0..{})", l,
                           hp.n_layer, hp.n_layer - 1);
    std::vector<NamedPath> outputs;
    for (std::int64_t l : layers)
      for (const char* t : {"q", "k", "v"}) {
        const std::string f = qkv_file_name(l, t);
        outputs.push_back({"--out file " + f, (fs::path(o->out) / f).string()});
      }
    outputs.push_back({"--out file manifest.json", (fs::path(o->out) / "manifest.json").string()});
    check_outputs_distinct(outputs, {{"--model", mpath}, {"--text", tpath}});
    NUMATTN_CHECK_OPTION(o->tokens <= hp.n_ctx_train, "tokens",
                         "{} tokens is beyond the model's trained context of {} "
                         "(llama.context_length)",
                         o->tokens, hp.n_ctx_train);
    const std::int64_t Hq = hp.n_head, Hkv = hp.n_head_kv, D = hp.head_dim, N = o->tokens;
    const auto per_layer = static_cast<std::uint64_t>(
        checked_mul(checked_mul(Hq + 2 * Hkv, N, "capture size"), D, "capture size"));
    check_memory(4 * per_layer * layers.size(), "the captured q/k/v");

    auto note = [&](const std::string& s) {
      if (!o->no_progress) std::fprintf(stderr, "capture: %s\n", s.c_str());
    };
    const Tokenizer tok = Tokenizer::from_gguf(file);
    note("tokenizing " + tpath);
    // As `numattn ppl`: the whole file, BOS only if add_bos_token, control markers as text.
    const auto all = tok.encode(text, tok.add_bos(), false);
    const auto n_text = static_cast<std::int64_t>(all.size());
    NUMATTN_CHECK_OPTION(o->offset <= n_text && N <= n_text - o->offset, "tokens",
                         "the text has {} tokens: --offset {} + --tokens {} = {} is beyond it",
                         n_text, o->offset, N, o->offset + N);
    std::vector<std::int32_t> window(all.begin() + o->offset, all.begin() + o->offset + N);
    const bool replace = bos == BosMode::kReplace || (bos == BosMode::kAuto && tok.add_bos());
    NUMATTN_CHECK(!replace || tok.bos_id() >= 0, "--bos {}: the vocabulary has no BOS token", o->bos);
    if (replace) window[0] = tok.bos_id();

    note(fmt::format("loading {}", mpath));
    const LlamaModel model = LlamaModel::load(file, ctx);
    std::vector<int> slot(static_cast<std::size_t>(hp.n_layer), -1);
    for (std::size_t i = 0; i < layers.size(); ++i) slot[static_cast<std::size_t>(layers[i])] = static_cast<int>(i);
    std::vector<std::vector<float>> q(layers.size()), k(layers.size()), v(layers.size());
    auto copy = [&](const TensorView<const float>& src, std::vector<float>& dst) {
      const index_t H = src.shape[1];
      dst.resize(static_cast<std::size_t>(H * N * D));
      for (index_t h = 0; h < H; ++h)
        for (index_t i = 0; i < N; ++i)
          for (index_t d = 0; d < D; ++d)
            dst[static_cast<std::size_t>((h * N + i) * D + d)] = src(0, h, i, d);
    };
    ForwardOptions fo;
    fo.logits_begin = N;  // no logits are needed
    fo.capture = [&](const QkvCapture& c) {
      if (!o->no_progress) {
        std::fprintf(stderr, "\rcapture: forward pass, layer %d/%lld", c.layer + 1,
                     static_cast<long long>(hp.n_layer));
        if (c.layer + 1 == hp.n_layer) std::fprintf(stderr, "\n");
      }
      const int s = slot[static_cast<std::size_t>(c.layer)];
      if (s < 0) return;
      copy(o->pre_rope ? c.q_pre : c.q_post, q[static_cast<std::size_t>(s)]);
      copy(o->pre_rope ? c.k_pre : c.k_post, k[static_cast<std::size_t>(s)]);
      copy(c.v, v[static_cast<std::size_t>(s)]);
    };
    KvCache cache = model.make_cache(N);
    model.forward(window, cache, ctx, fo);

    fs::create_directories(o->out, ec);
    NUMATTN_CHECK(!ec && fs::is_directory(o->out), "--out: cannot create directory '{}': {}", o->out,
                  ec.message());
    note("writing " + o->out);
    Row files = Row::object();
    for (std::size_t i = 0; i < layers.size(); ++i) {
      const std::int64_t l = layers[i];
      npy::write((fs::path(o->out) / qkv_file_name(l, "q")).string(), {Hq, N, D}, q[i].data());
      npy::write((fs::path(o->out) / qkv_file_name(l, "k")).string(), {Hkv, N, D}, k[i].data());
      npy::write((fs::path(o->out) / qkv_file_name(l, "v")).string(), {Hkv, N, D}, v[i].data());
      files[std::to_string(l)] = {{"q", qkv_file_name(l, "q")},
                                  {"k", qkv_file_name(l, "k")},
                                  {"v", qkv_file_name(l, "v")}};
    }
    Row m;
    m["format"] = "numattn-qkv-capture";
    m["version"] = 1;
    m["model"] = mpath;
    m["model_name"] = file.get_string("general.name", "");
    m["text"] = tpath;
    m["text_tokens"] = n_text;
    m["offset"] = o->offset;
    m["tokens"] = N;
    m["bos"] = o->bos;
    m["bos_replaced"] = replace;
    m["token_ids"] = window;
    m["layers"] = layers;
    m["n_layer"] = hp.n_layer;
    m["heads"] = Hq;
    m["kv_heads"] = Hkv;
    m["head_dim"] = D;
    m["rope"] = o->pre_rope ? "pre" : "post";
    m["rope_theta"] = hp.rope_base;
    m["rope_dims"] = hp.n_rot;
    m["rope_layout"] = "adjacent pairs (x[2i], x[2i+1]), llama.cpp LLAMA_ROPE_TYPE_NORM";
    m["scale"] = 1.0 / std::sqrt(static_cast<double>(D));
    m["causal"] = "bottom-right";
    m["shape"] = "[H,N,D] float32; q has the query heads, k and v the KV heads";
    m["files"] = files;
    // Last, so that a manifest always describes complete files.
    const std::string mtext = dump_json(m, 2) + "\n";
    write_file_atomically((fs::path(o->out) / "manifest.json").string(), mtext.data(), mtext.size(),
                          "manifest.json");

    Row row;
    row["out"] = o->out;
    row["model"] = mpath;
    row["text"] = tpath;
    row["offset"] = o->offset;
    row["tokens"] = N;
    row["layers"] = layers;
    row["heads"] = Hq;
    row["kv_heads"] = Hkv;
    row["head_dim"] = D;
    row["rope"] = o->pre_rope ? "pre" : "post";
    row["files"] = 3 * layers.size() + 1;
    row["seconds"] = std::chrono::duration<double>(std::chrono::steady_clock::now() - t_start).count();
    print_table(std::cout, {row}, parse_format(o->format), true);
  });
}

NUMATTN_COMMAND(73, add_capture);

}  // namespace numattn::cli
