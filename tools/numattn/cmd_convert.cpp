// numattn convert: writes a weight-transformed model (BD Attention, GQA → MLA, or tensor-compressed
// weights) as GGUF, which numattn loads back (model/bda_model.h, model/mla_convert.h and
// model/tensor_convert.h document the stored forms).
#include <chrono>
#include <iostream>
#include <memory>
#include <optional>

#include "cli_common.h"
#include "commands.h"
#include "mla_cli.h"
#include "tensor_cli.h"
#include "transform_cli.h"
#include "numattn/core/file_io.h"
#include "numattn/gguf/gguf.h"
#include "numattn/model/bda_model.h"
#include "numattn/model/data.h"
#include "numattn/model/llama.h"
#include "numattn/model/mla_convert.h"
#include "numattn/model/mla_model.h"
#include "numattn/model/tensor_convert.h"
#include "numattn/model/tokenizer.h"
#include "numattn/model/transform_model.h"

namespace numattn::cli {

namespace {
struct ConvertOptions {
  std::string model = "default", out, format = "md";
  double kappa_threshold = 1e4;
  int threads = 0;
  bool no_progress = false;
  TransformCliOptions xf;
};
}  // namespace

void add_convert(CLI::App& app) {
  auto o = std::make_shared<ConvertOptions>();
  auto* sub = app.add_subcommand(
      "convert", "rewrite a GGUF Llama model with one transform (--transform: BD Attention, the "
                 "default, bda(pairs=vo,coef=f32); MLA conversion, mla(...); or a tensor compression, "
                 "tensor.*(...)), and write it as GGUF with the pipeline under numattn.transform; "
                 "numattn loads the result like any model");
  sub->add_option("--model", o->model, "GGUF file, or 'default'")->capture_default_str();
  sub->add_option("--transform", o->xf.transform,
                  "the transform written (`numattn transforms`): one stage, bda(pairs=...,coef=f32) (the "
                  "file stores the BD form in float32), mla(...) or tensor.*(...)");
  sub->add_option("--bda", o->xf.bda, "deprecated alias of --transform \"bda(pairs=...,coef=f32)\": vo | qk | qkvo")
      ->check(CLI::IsMember({"vo", "qk", "qkvo"}));
  sub->add_option("--kappa-threshold", o->kappa_threshold,
                  "KV heads whose basis block has a larger condition number stay dense")
      ->capture_default_str();
  sub->add_option("--out", o->out,
                  "output GGUF path (written atomically: a failed or killed convert leaves a "
                  "previous file intact; must not be the --model file)")
      ->required();
  sub->add_flag("--no-progress", o->no_progress, "no progress bar on stderr");
  add_mla_options(*sub, o->xf.mla);
  add_tensor_alias_option(*sub, o->xf.tensor);
  add_common(*sub, &o->threads, &o->format);
  sub->callback([o, sub] {
    NUMATTN_CHECK_OPTION(o->kappa_threshold >= 0, "kappa-threshold",
                         "must be >= 0 (below 1 every head stays dense, as κ >= 1; inf keeps none "
                         "dense), got {}", o->kappa_threshold);
    ExecContext ctx{o->threads};
    // The older form wrote the BD form in float32 whatever --bda-coef said: its alias says so.
    TransformCliOptions xf = o->xf;
    xf.bda_coef = "f32";
    transform::TransformPipeline xp = resolve_transforms(*sub, xf);
    if (xp.empty()) xp = transform::parse_transforms("bda(pairs=vo,coef=f32)");
    NUMATTN_CHECK_OPTION(xp.stages.size() == 1, "transform",
                         "'{}': one file holds one transform (the file layouts store an MLA, a BDA or a "
                         "tensor-compressed model; BDA on an MLA model runs at load: ppl --model X.gguf "
                         "--transform \"bda(...)\")", xp.canonical());
    NUMATTN_CHECK_OPTION(!xp.bda || xp.bda->coef == "f32", "transform",
                         "'{}': the file stores the BD form in float32: give coef=f32", xp.canonical());
    const std::optional<transform::TensorSpec> tspec = xp.tensor;
    // A file made from a converted file records both pipelines.
    auto recorded = [&](const GgufFile& src) {
      const std::string before = src.get_string(transform::kTransformKey, "");
      return before.empty() ? xp.canonical() : before + "|" + xp.canonical();
    };
    const std::string path = resolve_model_path(o->model);
    check_output_options(*sub, {{"--out", o->out, OutputKind::kFile}}, {{"--model", path}});
    if (tspec) {
      auto src = std::make_shared<const GgufFile>(GgufFile::open(path));
      NUMATTN_CHECK_OPTION(src->architecture() == "llama", "tensor", "{} is a '{}' model; --tensor needs a plain llama model",
                           path, src->architecture());
      check_transforms(xp, LlamaModel::read_hparams(*src), false);
      const LlamaModel model = LlamaModel::load(src, ctx, WeightStorage::kInPlace);
      TensorModelReport rep;
      TensorFactors fac;
      const LlamaModel compressed = compress_model_tensor(model, *tspec, ctx, &rep, &fac);
      write_tensor_gguf(*src, fac, o->out, recorded(*src));
      // Read it back: the rebuilt weights must be the ones the compression ran.
      const LlamaModel back = LlamaModel::load(o->out, ctx, WeightStorage::kInPlace);
      for (std::size_t l = 0; l < back.weights().layers.size(); ++l) {
        const auto& a = compressed.weights().layers[l];
        const auto& b = back.weights().layers[l];
        NUMATTN_CHECK(a.wqkv == b.wqkv && a.wo == b.wo && a.w_gate_up == b.w_gate_up && a.w_down == b.w_down &&
                          back.hparams().head_dim == compressed.hparams().head_dim,
                      "internal error: layer {} of '{}' does not read back as compressed", l, o->out);
      }
      Row row;
      row["model"] = path;
      row["out"] = o->out;
      row["transform"] = recorded(*src);
      add_tensor_columns(row, rep, o->format == "json");
      row["bytes_source"] = src->file_size();
      row["bytes_out"] = GgufFile::open(o->out).file_size();
      print_table(std::cout, {row}, parse_format(o->format), true);
      return;
    }
    if (xp.mla) {
      auto src = std::make_shared<const GgufFile>(GgufFile::open(path));
      check_transforms(xp, LlamaModel::read_hparams(*src), src->architecture() == "numattn-mla");
      const Tokenizer tok = Tokenizer::from_gguf(*src);
      // In place: the conversion dequantizes Wq|Wk|Wv one layer at a time, the rest is copied.
      LlamaModel model = LlamaModel::load(src, ctx, WeightStorage::kInPlace);
      const MlaStageResult res = apply_mla_stage(model, tok, *xp.mla, ctx, !o->no_progress);
      write_mla_gguf(*src, model, res.report.options, o->out, recorded(*src));
      // Read it back: the written file must load and give the same MLA weights.
      LlamaModel back = LlamaModel::load(o->out, ctx, WeightStorage::kInPlace);
      for (std::size_t l = 0; l < back.weights().layers.size(); ++l) {
        const auto& a = *model.weights().layers[l].mla;
        const auto& b = back.weights().layers[l].mla;
        NUMATTN_CHECK(b && a.w_in == b->w_in && a.w_uk == b->w_uk && a.w_uv == b->w_uv &&
                          a.rope_theta == b->rope_theta && a.softmax_scale == b->softmax_scale,
                      "internal error: MLA layer {} of '{}' does not read back as written", l, o->out);
      }
      Row row;
      row["model"] = path;
      row["out"] = o->out;
      row["layers"] = back.hparams().n_layer;
      row["transform"] = recorded(*src);
      add_mla_columns(row, *xp.mla, res);
      row["kv_bytes_per_token"] = back.kv_bytes_per_token();
      row["kv_bytes_per_token_gqa"] = res.report.kv_bytes_gqa;
      row["kv_ratio"] = static_cast<double>(back.kv_bytes_per_token()) / static_cast<double>(res.report.kv_bytes_gqa);
      print_table(std::cout, {row}, parse_format(o->format), true);
      return;
    }
    GgufFile src = GgufFile::open(path);
    NUMATTN_CHECK_OPTION(src.architecture() != "numattn-mla", "bda",
                         "{} is an MLA model: its BDA form is not stored in a file (BDA on an MLA "
                         "model runs at load: ppl --model X.gguf --transform \"bda(...)\")", path);
    LlamaModel model = LlamaModel::load(src, ctx);
    const auto t0 = std::chrono::steady_clock::now();
    transform::BdaOptions opt;
    opt.kappa_threshold = o->kappa_threshold;
    const ModelBdaReport rep = apply_bda(model, xp.bda->pairs, opt, parse_bda_coef(xp.bda->coef));
    const double bda_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    write_bda_gguf(src, model, o->out, recorded(src));
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
    row["transform"] = recorded(src);
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
