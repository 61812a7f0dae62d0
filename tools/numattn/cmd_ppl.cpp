// numattn ppl: perplexity (llama.cpp protocol) of a GGUF model on a text, with an attention
// spec per layer, optional KL divergence against a baseline spec, and throughput against the
// same-run GEMM roofline.
#include <algorithm>
#include <cmath>
#include <chrono>
#include <cstdio>
#include <iostream>
#include <memory>
#include <optional>

#include "cli_common.h"
#include "commands.h"
#include "dist_cli.h"
#include "mla_cli.h"
#include "tensor_cli.h"
#include "transform_cli.h"
#include "numattn/core/blas.h"
#include "numattn/core/file_io.h"
#include "numattn/core/memory.h"
#include "numattn/dist/ppl.h"
#include "numattn/gguf/gguf.h"
#include "numattn/model/bda_model.h"
#include "numattn/model/data.h"
#include "numattn/model/llama.h"
#include "numattn/model/mla_model.h"
#include "numattn/model/ppl.h"
#include "numattn/model/text.h"
#include "numattn/model/tokenizer.h"
#include "numattn/model/transform_model.h"

namespace numattn::cli {

namespace {
struct PplCliOptions {
  std::string model = "default", text = "default", attn = "exact.flash", baseline, format = "md",
              bos = "auto", weights = "gguf", activations = "f32", kv = "f32";
  std::int64_t ctx = 512, chunks = -1;
  int threads = 0;
  bool no_progress = false, allow_long_ctx = false;
  TransformCliOptions xf;
};
}  // namespace

void add_ppl(CLI::App& app) {
  auto o = std::make_shared<PplCliOptions>();
  auto* sub = app.add_subcommand(
      "ppl", "perplexity of a GGUF model (Llama, Gemma 3) on a text (llama.cpp protocol), KL divergence "
             "against a baseline attention, and tokens/s against the GEMM roofline");
  sub->add_option("--model", o->model, "GGUF file, or 'default'")->capture_default_str();
  sub->add_option("--text", o->text, "UTF-8 text file, or 'default' (Jane Austen)")
      ->capture_default_str();
  sub->add_option("--ctx", o->ctx,
                  "tokens per chunk (the second half is scored); at least 4, at most the "
                  "model's trained context (<arch>.context_length, e.g. llama.context_length) unless --allow-long-ctx")
      ->capture_default_str();
  sub->add_flag("--allow-long-ctx", o->allow_long_ctx,
                "allow --ctx beyond the model's trained context (positions never trained)");
  sub->add_option("--chunks", o->chunks, "chunks to evaluate (-1 = all)")->capture_default_str();
  sub->add_option("--attn", o->attn, "attention spec: one for all layers, one per layer separated by ';', "
                                     "or local:SPEC and/or global:SPEC for the sliding-window or global layers "
                                     "of a model that has both (Gemma 3; the other kind keeps exact.flash); a "
                                     "local layer's method gets the model's window")
      ->capture_default_str();
  sub->add_option("--baseline", o->baseline,
                  "baseline attention spec for kld_mean, kld_p99, top1_agreement (e.g. exact.flash)");
  sub->add_option("--bos", o->bos,
                  "first token of each chunk: auto (replaced by BOS if the vocabulary's "
                  "add_bos_token is set, as llama.cpp), replace (always), keep (never)")
      ->capture_default_str();
  sub->add_option("--weights", o->weights,
                  "weight storage: gguf (the file's encoding, read in place) or f32 (dequantized "
                  "at load: the exactness reference)")
      ->capture_default_str()
      ->check(CLI::IsMember({"gguf", "f32"}));
  add_activations_option(*sub, &o->activations);
  sub->add_option("--kv", o->kv,
                  "KV-cache element type: f32 (the reference), f16 or bf16; with f16 or bf16 the chunks also run "
                  "with a float32 cache, and kld_mean, kld_p99, top1_agreement measure the cache type's cost")
      ->capture_default_str()
      ->check(CLI::IsMember({"f16", "bf16", "f32"}));
  sub->add_flag("--no-progress", o->no_progress, "no progress bar on stderr");
  add_transform_options(*sub, o->xf);
  add_common(*sub, &o->threads, &o->format);
  sub->callback([o, sub] {
    ExecContext ctx{o->threads};
    const int nt = ctx.num_threads();
    PplOptions po;
    po.ctx = o->ctx;
    po.chunks = o->chunks;
    po.allow_long_ctx = o->allow_long_ctx;
    po.attn = o->attn;
    po.baseline = o->baseline;
    po.bos = parse_bos_mode(o->bos);
    po.kv = parse_kv_type(o->kv);
    po.progress = !o->no_progress;
    // Options are checked as soon as what they depend on is known, each before the slow step
    // that follows: the flags alone before any file is opened, then against the model's
    // header before its weights are read, then against the text's length.
    check_ppl_options(po);
    const Activations act = check_activations_option(o->activations, o->weights).at(0);
    NUMATTN_CHECK_OPTION(split_list(o->activations).size() == 1, "activations", "takes one value, got '{}'",
                         o->activations);
    const transform::TransformPipeline xp = resolve_transforms(*sub, o->xf);
    const std::string mpath = resolve_model_path(o->model);
    const std::string tpath = resolve_text_path(o->text);
    const std::string text =
        read_file(tpath, "--text file", kTextInput);  // before the slow model load
    GgufFile file = GgufFile::open(mpath);
    const ModelHParams hp = LlamaModel::read_hparams(file);
    check_ppl_options(po, &hp);
    check_transforms(xp, hp, file.architecture() == "numattn-mla");
    const std::string file_transform = file.get_string(transform::kTransformKey, "");
    // Each method must be able to run the model's problem (a chunk: ctx causal queries, GQA),
    // asked of its own can_run before the weights load.
    check_model_attention("attn", po.attn, hp, po.ctx, po.ctx, "chunk's");
    if (!po.baseline.empty())
      check_model_attention("baseline", po.baseline, hp, po.ctx, po.ctx, "chunk's");
    const Tokenizer tok = Tokenizer::from_gguf(file);
    auto t0 = std::chrono::steady_clock::now();
    // llama.cpp tokenizes the whole file with add_special (BOS only if add_bos_token) and
    // without parsing special-token markers in the text.
    const auto tokens = encode_text(tok, text);
    const double tok_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    check_ppl_options(po, &hp, static_cast<std::int64_t>(tokens.size()));
    t0 = std::chrono::steady_clock::now();
    LlamaModel model = LlamaModel::load(std::make_shared<const GgufFile>(std::move(file)), ctx,
                                        parse_weight_storage(o->weights));
    // The stages of --transform in order, each keeping the model before it as the KL baseline.
    // mla: the GQA model converted at load (model/mla_convert.h); the GQA original is the KL
    // baseline, run with a KV cache of its own shape.
    std::unique_ptr<LlamaModel> gqa;
    MlaStageResult mla;
    if (xp.mla) {
      if (!model.weights().in_place())
        check_memory(4 * static_cast<std::uint64_t>(hp.weight_count(model.weights().output.empty())),
                     "a GQA copy of the model (the KL baseline of mla)");
      gqa = std::make_unique<LlamaModel>(model);
      mla = apply_mla_stage(model, tok, *xp.mla, ctx, po.progress);
    }
    const std::string mla_exec = xp.mla ? xp.mla->exec : o->xf.mla.exec;
    if (model.has_mla()) model.set_mla_exec(parse_mla_exec(mla_exec));
    std::unique_ptr<LlamaModel> dense;
    ModelBdaReport bda;
    if (xp.bda) {
      // The baseline of the KL divergence: a second copy of the model (of every weight with
      // f32 storage; in place, copies share the mapped file).
      if (!model.weights().in_place())
        check_memory(4 * static_cast<std::uint64_t>(hp.weight_count(model.weights().output.empty())),
                     "a dense copy of the model (the KL baseline of bda)");
      dense = std::make_unique<LlamaModel>(model);
      bda = apply_bda(model, xp.bda->pairs, {}, parse_bda_coef(xp.bda->coef));
    }
    // tensor.*: the compressed model replaces the loaded one (after mla, the MLA model), which
    // stays as the KL baseline.
    TensorModelReport tensor;
    if (xp.tensor) {
      if (!model.weights().in_place())
        check_memory(4 * static_cast<std::uint64_t>(hp.weight_count(model.weights().output.empty())),
                     "a dense copy of the model (the KL baseline of tensor)");
      dense = std::make_unique<LlamaModel>(model);
      model = compress_model_tensor(*dense, *xp.tensor, ctx, &tensor);
    }
    // --activations q8: the model (and the baseline of a transform, so that its KL measures the
    // transform alone) multiplies 8-bit activations; without another baseline model, the same
    // model with float32 activations is the KL baseline (in place, the copy shares the file).
    std::unique_ptr<LlamaModel> f32_act;
    if (act != Activations::kF32) {
      if (!dense && !gqa) f32_act = std::make_unique<LlamaModel>(model);
      model.set_activations(act);
      if (dense) dense->set_activations(act);
      if (gqa) gqa->set_activations(act);
    }
    const double load_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    po.baseline_model = dense ? dense.get() : gqa ? gqa.get() : f32_act.get();
    // GEMM throughput of the linked BLAS (1024³ sgemm, BLAS threads = --threads), sampled
    // before the run and after every chunk, so that it sees the same machine load as the
    // forward passes; the median sample is the roofline's FLOP rate.
    std::vector<double> gs{blas::measure_sgemm_gflops(1024, 3, nt)};
    po.after_chunk = [&] { gs.push_back(blas::measure_sgemm_gflops(1024, 1, nt)); };
    // Under mpirun the chunks are split across the ranks (dist/ppl.h); rank 0 prints.
    const bool distributed = distributed_launch();
    // Ctrl-C stops after the chunk in progress, with a message (not under mpirun: a rank that
    // stopped alone would leave the others waiting in the reduction).
    CancelToken cancel;
    std::optional<SigintCancel> on_sigint;
    if (!distributed) {
      on_sigint.emplace(cancel);
      po.cancel = &cancel;
    }
    const PplResult r = distributed ? dist::evaluate_perplexity(dist::world(), model, tokens, tok.bos_id(), tok.add_bos(), po, ctx)
                             : evaluate_perplexity(model, tokens, tok.bos_id(), tok.add_bos(), po, ctx);
    if (dist_rank() != 0) return;
    const double gemm = median(gs);
    // Weights each processed token multiplies through: every layer, plus the output matrix for
    // the share of positions whose logits are computed (ctx - ctx/2 of ctx).
    const double out_share = static_cast<double>(r.ctx - r.ctx / 2) / static_cast<double>(r.ctx);
    const double w_per_tok = static_cast<double>(model.body_weights()) +
                             out_share * static_cast<double>(model.output_weights());
    const double roofline = gemm * 1e9 / (2.0 * w_per_tok);

    Row row;
    row["model"] = mpath;
    row["text"] = tpath;
    row["ctx"] = r.ctx;
    row["chunks"] = r.chunks;
    row["tokens_scored"] = r.tokens_scored;
    row["ppl"] = r.ppl;
    row["ppl_stderr"] = r.ppl_stderr;
    row["kld_mean"] = r.has_baseline ? Row(r.kld_mean) : Row();
    row["kld_p99"] = r.has_baseline ? Row(r.kld_p99) : Row();
    row["top1_agreement"] = r.has_baseline ? Row(r.top1_agreement) : Row();
    row["tokens_per_s"] = r.tokens_per_s;
    row["attn"] = r.attn_spec;
    row["baseline"] = r.has_baseline ? Row(r.baseline_spec) : Row();
    row["ppl_baseline"] = r.has_baseline ? Row(r.ppl_baseline) : Row();
    bool file_bda = false;
    for (const DecoderLayer& d : model.layers()) file_bda |= d.attn->kind() == "bd-v";
    row["transform"] = xp.canonical();
    if (!file_transform.empty()) row["file_transform"] = file_transform;
    row["bda"] = xp.bda ? xp.bda->pairs : (file_bda ? "vo (stored in the file)" : "none");
    const std::int64_t kv_gqa = 2 * hp.n_layer * hp.n_head_kv * hp.head_dim * 4;
    row["kv"] = to_string(r.kv);
    row["baseline_kv"] = r.has_baseline ? Row(to_string(r.baseline_kv)) : Row();
    row["kv_bytes_per_token"] = model.kv_bytes_per_token(r.kv);
    row["kv_bytes_per_token_gqa"] = kv_gqa;
    row["kv_ratio"] = static_cast<double>(model.kv_bytes_per_token(r.kv)) / static_cast<double>(kv_gqa);
    if (model.has_mla()) row["mla_exec"] = mla_exec;
    if (r.has_baseline) {
      // Largest per-token log-prob difference against the baseline (the exactness check of an
      // exact rewrite: ΔPPL alone can hide cancelling errors).
      double dmax = 0;
      for (std::size_t i = 0; i < r.nll.size() && i < r.base_nll.size(); ++i)
        dmax = std::max(dmax, std::abs(r.nll[i] - r.base_nll[i]));
      row["logprob_max_abs_diff"] = dmax;
    }
    if (xp.mla) {
      add_mla_columns(row, *xp.mla, mla);
      if (!dense) {
        row["baseline"] = "GQA model, " + r.baseline_spec;
        row["ppl_rel_change"] = (r.ppl - r.ppl_baseline) / r.ppl_baseline;
      }
    }
    if (xp.bda) {
      row["baseline"] = std::string(model.has_mla() ? "dense MLA model, " : "dense model, ") + r.baseline_spec;
      row["ppl_rel_change"] = (r.ppl - r.ppl_baseline) / r.ppl_baseline;
      row["bda_params_before"] = bda.params_before;
      row["bda_params_after"] = bda.params_after;
      row["bda_params_saved"] = bda.params_saved();
      row["bda_kappa_max"] = bda.kappa_max;
      row["bda_fallback_heads"] = bda.fallback_heads;
      if (!bda.coef_type.empty()) row["bda_coef_type"] = bda.coef_type;
      if (model.has_mla()) {
        // Latent up-projection MACs (W_uk, W_uv): per query token absorbed, per cached token
        // and forward pass naive (model/bda_model.h).
        row["bda_up_macs_per_token_before"] = bda.up_macs_before;
        row["bda_up_macs_per_token_after"] = bda.up_macs_before - bda.macs_saved_per_token;
        row["bda_macs_saved_per_token"] = bda.macs_saved_per_token;
        row["bda_macs_unit"] = mla_exec == "naive" ? "per cached token and forward pass (naive)"
                                                      : "per query token (absorbed)";
      }
    }
    if (xp.tensor) {
      row["baseline"] = "uncompressed model, " + r.baseline_spec;
      row["ppl_rel_change"] = (r.ppl - r.ppl_baseline) / r.ppl_baseline;
      add_tensor_columns(row, tensor, o->format == "json");
    }
    row["gemm_gflops"] = gemm;
    row["gemm_samples"] = gs.size();
    row["roofline_tokens_per_s"] = roofline;
    row["roofline_fraction"] = r.tokens_per_s / roofline;
    row["weights_per_token"] = w_per_tok;
    // The forward pass's own GEMM rate: its linear-layer FLOPs over the time in GEMM phases.
    const ForwardProfile& pf = r.profile;
    const double gemm_time = pf.qkv_gemm + pf.o_gemm + pf.ffn_gemm + pf.output_gemm;
    row["forward_gemm_gflops"] = 2.0 * w_per_tok * static_cast<double>(r.tokens_processed) / gemm_time * 1e-9;
    row["threads"] = nt;
    row["weights"] = o->weights;
    row["activations"] = o->activations;
    if (f32_act) {
      row["baseline"] = "f32 activations, " + r.baseline_spec;
      row["ppl_rel_change"] = (r.ppl - r.ppl_baseline) / r.ppl_baseline;
    }
    if (distributed) row["ranks"] = dist::world().size();
    row["bos"] = o->bos;
    row["tokens_processed"] = r.tokens_processed;
    row["forward_s"] = r.seconds;
    row["load_s"] = load_s;
    row["tokenize_s"] = tok_s;
    const ForwardProfile& p = r.profile;
    Row prof;
    prof["embed"] = p.embed;
    prof["norm"] = p.norm;
    prof["qkv_gemm"] = p.qkv_gemm;
    prof["rope_kv"] = p.rope;
    prof["attention"] = p.attention;
    prof["o_gemm"] = p.o_gemm;
    prof["ffn_gemm"] = p.ffn_gemm;
    prof["ffn_act"] = p.ffn_act;
    prof["output_gemm"] = p.output_gemm;
    prof["sync"] = p.sync;
    if (o->format == "json") {
      row["profile_s"] = prof;
    } else {
      for (auto it = prof.begin(); it != prof.end(); ++it) row["t_" + it.key()] = it.value();
    }
    if (o->format == "md") {
      std::fprintf(stderr, "Final estimate: PPL = %.4f +/- %.5f\n", r.ppl, r.ppl_stderr);
    }
    print_table(std::cout, {row}, parse_format(o->format), true);
  });
}

NUMATTN_COMMAND(70, add_ppl);

}  // namespace numattn::cli
