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
#include "numattn/gguf/gguf.h"
#include "numattn/model/data.h"
#include "numattn/model/llama.h"
#include "numattn/model/ppl.h"
#include "numattn/model/tokenizer.h"
#include "qkv_source.h"
#include "text_window.h"
#include "transform_cli.h"
#include "numattn/model/transform_model.h"

namespace numattn::cli {

namespace {

struct CaptureOptions {
  TextWindowFlags w;
  std::string out, format = "md";
  bool pre_rope = false;
  int threads = 0;
  TransformCliOptions xf;
};

}  // namespace

void add_capture(CLI::App& app) {
  auto o = std::make_shared<CaptureOptions>();
  auto* sub = app.add_subcommand(
      "capture", "write the Q, K, V that a model's attention layers see on a text as .npy "
                 "files [H,N,D] plus manifest.json (input of run/bench --qkv DIR --layer L)");
  o->w.add_to(*sub, "layers to write: comma-separated indices, or 'all'");
  sub->add_flag("--pre-rope", o->pre_rope, "write q and k before RoPE (default: after, what attention sees)");
  sub->add_option("--out", o->out, "output directory (created if missing)")->required();
  add_transform_options(*sub, o->xf, {false, false, false});
  add_common(*sub, &o->threads, &o->format);
  sub->callback([o, sub] {
    ExecContext ctx{o->threads};
    const transform::TransformPipeline xp = resolve_transforms(*sub, o->xf);
    NUMATTN_CHECK_OPTION(capture_refusal(xp).empty(), "transform", "'{}': {}", xp.canonical(), capture_refusal(xp));
    const auto t_start = std::chrono::steady_clock::now();
    namespace fs = std::filesystem;
    const std::int64_t N = o->w.tokens;
    const TextWindow w = open_text_window(o->w, o->out, "capture", [&](const TextWindow& t) {
      std::vector<NamedPath> outputs;
      for (std::int64_t l : t.layers)
        for (const char* n : {"q", "k", "v"}) {
          const std::string f = qkv_file_name(l, n);
          outputs.push_back({"--out file " + f, (fs::path(o->out) / f).string()});
        }
      outputs.push_back({"--out file manifest.json", (fs::path(o->out) / "manifest.json").string()});
      check_outputs_distinct(outputs, {{"--model", t.model_path}, {"--text", t.text_path}});
      check_transforms(xp, t.hp, t.file.architecture() == "numattn-mla");
      const std::int64_t per_layer =
          checked_mul(checked_mul(t.hp.n_head + 2 * t.hp.n_head_kv, N, "capture size"), t.hp.head_dim, "capture size");
      check_memory(4 * static_cast<std::uint64_t>(per_layer) * t.layers.size(), "the captured q/k/v");
    });
    const ModelHParams& hp = w.hp;
    const std::vector<std::int64_t>& layers = w.layers;
    const std::int64_t Hq = hp.n_head, Hkv = hp.n_head_kv, D = hp.head_dim;
    // Ctrl-C stops the forward pass after the layer it is in, before any file is written.
    CancelToken cancel;
    std::vector<LayerTensors> t;
    {
      SigintCancel on_sigint(cancel);
      t = capture_layers(w, o->pre_rope ? RopeState::kPre : RopeState::kPost, !o->w.no_progress, "capture", ctx, xp,
                         &cancel);
    }
    std::error_code ec;
    fs::create_directories(o->out, ec);
    NUMATTN_CHECK(!ec && fs::is_directory(o->out), "--out: cannot create directory '{}': {}", o->out,
                  ec.message());
    if (!o->w.no_progress) std::fprintf(stderr, "capture: writing %s\n", o->out.c_str());
    Row files = Row::object();
    for (std::size_t i = 0; i < layers.size(); ++i) {
      const std::int64_t l = layers[i];
      const LayerTensors& x = t[i];
      npy::write((fs::path(o->out) / qkv_file_name(l, "q")).string(), {Hq, N, D},
                 (o->pre_rope ? x.q_pre : x.q_post).data());
      npy::write((fs::path(o->out) / qkv_file_name(l, "k")).string(), {Hkv, N, D},
                 (o->pre_rope ? x.k_pre : x.k_post).data());
      npy::write((fs::path(o->out) / qkv_file_name(l, "v")).string(), {Hkv, N, D}, x.v.data());
      files[std::to_string(l)] = {{"q", qkv_file_name(l, "q")},
                                  {"k", qkv_file_name(l, "k")},
                                  {"v", qkv_file_name(l, "v")}};
    }
    Row m;
    m["format"] = "numattn-qkv-capture";
    m["version"] = 1;
    m["model"] = w.model_path;
    m["model_name"] = w.file.get_string("general.name", "");
    m["transform"] = xp.canonical();
    m["text"] = w.text_path;
    m["text_tokens"] = w.text_tokens;
    m["offset"] = o->w.offset;
    m["tokens"] = N;
    m["bos"] = o->w.bos;
    m["bos_replaced"] = w.bos_replaced;
    m["token_ids"] = w.tokens;
    m["layers"] = layers;
    m["n_layer"] = hp.n_layer;
    m["heads"] = Hq;
    m["kv_heads"] = Hkv;
    m["head_dim"] = D;
    m["rope"] = o->pre_rope ? "pre" : "post";
    m["rope_theta"] = hp.rope_base;
    m["rope_dims"] = hp.n_rot;
    m["rope_layout"] = hp.rope_layout == RopeLayout::kAdjacent
                           ? "adjacent pairs (x[2i], x[2i+1]), llama.cpp LLAMA_ROPE_TYPE_NORM"
                           : "halves (x[i], x[i + rope_dims/2]), llama.cpp LLAMA_ROPE_TYPE_NEOX";
    m["scale"] = hp.attn_scale > 0 ? hp.attn_scale : 1.0 / std::sqrt(static_cast<double>(D));
    m["causal"] = "bottom-right";
    // Per captured layer: its RoPE base and its sliding window (0 = none: the layer sees every
    // earlier key; W: query i sees keys i − W + 1 .. i, run/bench --window-left W−1).
    Row theta = Row::object(), window = Row::object();
    for (std::int64_t l : layers) {
      theta[std::to_string(l)] = hp.layer_rope_base(l);
      window[std::to_string(l)] = hp.is_local(l) ? hp.sliding_window : 0;
    }
    m["layer_rope_theta"] = std::move(theta);
    m["layer_window"] = std::move(window);
    if (hp.qk_norm) m["qk_norm"] = "q and k are RMS-normalised per head before RoPE; the pre-RoPE files hold them after it";
    m["shape"] = "[H,N,D] float32; q has the query heads, k and v the KV heads";
    m["files"] = files;
    // Last, so that a manifest always describes complete files.
    const std::string mtext = dump_json(m, 2) + "\n";
    write_file_atomically((fs::path(o->out) / "manifest.json").string(), mtext.data(), mtext.size(),
                          "manifest.json");

    Row row;
    row["out"] = o->out;
    row["model"] = w.model_path;
    row["transform"] = xp.canonical();
    row["text"] = w.text_path;
    row["offset"] = o->w.offset;
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
