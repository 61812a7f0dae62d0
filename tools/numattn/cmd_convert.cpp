// numattn convert: writes a weight-transformed model (today: BD Attention) as GGUF, which
// numattn loads back (model/bda_model.h documents the stored form).
#include <chrono>
#include <iostream>
#include <memory>

#include "cli_common.h"
#include "commands.h"
#include "numattn/core/file_io.h"
#include "numattn/model/bda_model.h"
#include "numattn/model/data.h"
#include "numattn/model/gguf.h"
#include "numattn/model/llama.h"

namespace numattn::cli {

namespace {
struct ConvertOptions {
  std::string model = "default", bda = "vo", out, format = "md";
  double kappa_threshold = 1e4;
  int threads = 0;
};
}  // namespace

void add_convert(CLI::App& app) {
  auto o = std::make_shared<ConvertOptions>();
  auto* sub = app.add_subcommand(
      "convert", "rewrite a GGUF Llama model with BD Attention (lossless VO pair) and write it "
                 "as GGUF; numattn loads the result like any model");
  sub->add_option("--model", o->model, "GGUF file, or 'default'")->capture_default_str();
  sub->add_option("--bda", o->bda, "pairs to rewrite: vo | qk | qkvo (qk is refused for RoPE models)")
      ->capture_default_str()
      ->check(CLI::IsMember({"vo", "qk", "qkvo"}));
  sub->add_option("--kappa-threshold", o->kappa_threshold,
                  "KV heads whose basis block has a larger condition number stay dense")
      ->capture_default_str();
  sub->add_option("--out", o->out,
                  "output GGUF path (written atomically: a failed or killed convert leaves a "
                  "previous file intact; must not be the --model file)")
      ->required();
  add_common(*sub, &o->threads, &o->format);
  sub->callback([o] {
    ExecContext ctx{o->threads};
    const std::string path = resolve_model_path(o->model);
    check_outputs_distinct({{"--out", o->out}}, {{"--model", path}});
    GgufFile src = GgufFile::open(path);
    LlamaModel model = LlamaModel::load(src, ctx);
    const auto t0 = std::chrono::steady_clock::now();
    transform::BdaOptions opt;
    opt.kappa_threshold = o->kappa_threshold;
    const ModelBdaReport rep = apply_bda(model, o->bda, opt);
    const double bda_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    write_bda_gguf(src, model, o->out);
    // Read it back: the written file must load and give the same weights.
    LlamaModel back = LlamaModel::load(o->out, ctx, WeightStorage::kF32);
    for (std::size_t l = 0; l < back.weights().layers.size(); ++l) {
      const auto& a = model.weights().layers[l];
      const auto& b = back.weights().layers[l];
      NUMATTN_CHECK(b.v_bd && a.wo == b.wo && a.v_bd->effective_weight() == b.v_bd->effective_weight(),
                    "internal error: layer {} of '{}' does not read back as written", l, o->out);
    }
    Row row;
    row["model"] = path;
    row["out"] = o->out;
    row["bda"] = rep.pairs;
    row["layers"] = rep.layers.size();
    row["params_before"] = rep.params_before;
    row["params_after"] = rep.params_after;
    row["params_saved"] = rep.params_saved();
    row["kappa_max"] = rep.kappa_max;
    row["fallback_heads"] = rep.fallback_heads;
    row["transform_s"] = bda_s;
    print_table(std::cout, {row}, parse_format(o->format), true);
  });
}

NUMATTN_COMMAND(75, add_convert);

}  // namespace numattn::cli
