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
#include "numattn/core/file_io.h"
#include "numattn/gguf/gguf.h"
#include "numattn/model/bda_model.h"
#include "numattn/model/data.h"
#include "numattn/model/llama.h"
#include "numattn/model/mla_convert.h"
#include "numattn/model/mla_model.h"
#include "numattn/model/tensor_convert.h"
#include "numattn/model/tokenizer.h"

namespace numattn::cli {

namespace {
struct ConvertOptions {
  std::string model = "default", bda = "vo", out, format = "md", tensor;
  double kappa_threshold = 1e4;
  int threads = 0;
  bool no_progress = false;
  MlaCliOptions mla;
};
}  // namespace

void add_convert(CLI::App& app) {
  auto o = std::make_shared<ConvertOptions>();
  auto* sub = app.add_subcommand(
      "convert", "rewrite a GGUF Llama model with BD Attention (lossless VO pair), convert its "
                 "attention to MLA (--mla-rank), or compress it with a tensor decomposition "
                 "(--tensor), and write it as GGUF; numattn loads the result like any model");
  sub->add_option("--model", o->model, "GGUF file, or 'default'")->capture_default_str();
  sub->add_option("--bda", o->bda, "pairs to rewrite: vo | qk | qkvo (qk is refused for RoPE "
                                   "models); not with --mla-rank")
      ->capture_default_str()
      ->check(CLI::IsMember({"vo", "qk", "qkvo"}));
  sub->add_option("--kappa-threshold", o->kappa_threshold,
                  "KV heads whose basis block has a larger condition number stay dense")
      ->capture_default_str();
  sub->add_option("--out", o->out,
                  "output GGUF path (written atomically: a failed or killed convert leaves a "
                  "previous file intact; must not be the --model file)")
      ->required();
  sub->add_flag("--no-progress", o->no_progress, "no progress bar on stderr");
  add_mla_options(*sub, o->mla);
  sub->add_option("--tensor", o->tensor,
                  std::string("write the tensor-compressed model (as `ppl --tensor SPEC`) as a "
                              "numattn-tensor GGUF: the float32 factors, every untouched tensor copied "
                              "byte for byte (model/tensor_convert.h); not with --bda/--mla-rank. ") +
                      transform::tensor_spec_grammar());
  add_common(*sub, &o->threads, &o->format);
  sub->callback([o, sub] {
    NUMATTN_CHECK_OPTION(o->kappa_threshold >= 0, "kappa-threshold",
                         "must be >= 0 (below 1 every head stays dense, as κ >= 1; inf keeps none "
                         "dense), got {}", o->kappa_threshold);
    ExecContext ctx{o->threads};
    std::optional<transform::TensorSpec> tspec;
    if (!o->tensor.empty()) {
      tspec = transform::parse_tensor_spec(o->tensor);
      NUMATTN_CHECK_OPTION(sub->count("--bda") == 0 && !o->mla.requested(), "tensor",
                           "cannot be combined with --bda or --mla-rank in one file");
    }
    check_mla_options(*sub, o->mla);
    const std::string path = resolve_model_path(o->model);
    check_output_options(*sub, {{"--out", o->out, OutputKind::kFile}}, {{"--model", path}});
    if (tspec) {
      auto src = std::make_shared<const GgufFile>(GgufFile::open(path));
      NUMATTN_CHECK_OPTION(src->architecture() == "llama", "tensor", "{} is a '{}' model; --tensor needs a plain llama model",
                           path, src->architecture());
      check_tensor_spec(*tspec, LlamaModel::read_hparams(*src));
      const LlamaModel model = LlamaModel::load(src, ctx, WeightStorage::kInPlace);
      TensorModelReport rep;
      TensorFactors fac;
      const LlamaModel compressed = compress_model_tensor(model, *tspec, ctx, &rep, &fac);
      write_tensor_gguf(*src, fac, o->out);
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
      add_tensor_columns(row, rep, o->format == "json");
      row["bytes_source"] = src->file_size();
      row["bytes_out"] = GgufFile::open(o->out).file_size();
      print_table(std::cout, {row}, parse_format(o->format), true);
      return;
    }
    if (o->mla.requested()) {
      NUMATTN_CHECK_OPTION(sub->count("--bda") == 0, "bda",
                           "cannot be combined with --mla-rank in one file (BDA on an MLA model "
                           "runs at load: ppl --model X.gguf --bda qk|vo|qkvo)");
      auto src = std::make_shared<const GgufFile>(GgufFile::open(path));
      check_mla_against_model(o->mla, LlamaModel::read_hparams(*src), src->architecture() == "numattn-mla");
      const Tokenizer tok = Tokenizer::from_gguf(*src);
      // In place: the conversion dequantizes Wq|Wk|Wv one layer at a time, the rest is copied.
      LlamaModel model = LlamaModel::load(src, ctx, WeightStorage::kInPlace);
      const MlaCliResult res = convert_for_cli(model, tok, o->mla, kMlaCalibChunk, ctx, !o->no_progress);
      write_mla_gguf(*src, model, o->mla.options(), o->out);
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
      add_mla_columns(row, o->mla, res);
      row["kv_bytes_per_token"] = back.kv_bytes_per_token();
      row["kv_bytes_per_token_gqa"] = res.report.kv_bytes_gqa;
      row["kv_ratio"] = static_cast<double>(back.kv_bytes_per_token()) / static_cast<double>(res.report.kv_bytes_gqa);
      print_table(std::cout, {row}, parse_format(o->format), true);
      return;
    }
    GgufFile src = GgufFile::open(path);
    NUMATTN_CHECK_OPTION(src.architecture() != "numattn-mla", "bda",
                         "{} is an MLA model: its BDA form is not stored in a file (BDA on an MLA "
                         "model runs at load: ppl --model X.gguf --bda qk|vo|qkvo)", path);
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
