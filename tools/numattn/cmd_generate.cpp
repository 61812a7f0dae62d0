// numattn generate: greedy decoding with the KV cache (a check that the model is right).
#include <chrono>
#include <cstdio>
#include <iostream>
#include <memory>

#include "cli_common.h"
#include "commands.h"
#include "transform_cli.h"
#include "numattn/gguf/gguf.h"
#include "numattn/model/bench_model.h"
#include "numattn/model/data.h"
#include "numattn/model/llama.h"
#include "numattn/model/text.h"
#include "numattn/model/tokenizer.h"
#include "numattn/model/transform_model.h"
#include "numattn/quant/qgemv.h"

namespace numattn::cli {

namespace {
struct GenerateOptions {
  std::string model = "default", prompt, attn = "exact.flash", format = "md", weights = "gguf",
              activations = "f32", kv = "f16";
  std::int64_t max_tokens = 32;
  int threads = 0;
  bool chat = false;
  TransformCliOptions xf;
};
}  // namespace

void add_generate(CLI::App& app) {
  auto o = std::make_shared<GenerateOptions>();
  auto* sub = app.add_subcommand("generate", "greedy text generation with the KV cache");
  sub->add_option("--model", o->model, "GGUF file, or 'default'")->capture_default_str();
  sub->add_option("--prompt", o->prompt, "prompt text")->required();
  sub->add_option("--max-tokens", o->max_tokens,
                  "tokens to generate (prompt + max-tokens must fit the model's trained context)")
      ->capture_default_str();
  sub->add_option("--attn", o->attn, "attention spec (one, one per layer separated by ';', or local:SPEC / global:SPEC)")
      ->capture_default_str();
  sub->add_option("--weights", o->weights,
                  "weight storage: gguf (the file's encoding, read in place from the mapped file) "
                  "or f32 (dequantized at load: the exactness reference)")
      ->capture_default_str()
      ->check(CLI::IsMember({"gguf", "f32"}));
  add_activations_option(*sub, &o->activations);
  sub->add_option("--kv", o->kv,
                  "KV-cache element type: f16 (as llama.cpp), bf16 or f32 (each key and value rounded once "
                  "to it as it is appended)")
      ->capture_default_str()
      ->check(CLI::IsMember({"f16", "bf16", "f32"}));
  sub->add_flag("--chat", o->chat,
                "wrap the prompt in the chat turns its vocabulary marks (ChatML <|im_start|>... or Gemma <start_of_turn>...) and stop at the end of the model's turn");
  add_transform_options(*sub, o->xf, {false, false, false});
  add_common(*sub, &o->threads, &o->format);
  sub->callback([o, sub] {
    ExecContext ctx{o->threads};
    const transform::TransformPipeline xp = resolve_transforms(*sub, o->xf);
    // Every request check comes before the model's weights are read (a few seconds): the
    // flags alone first, then the prompt's length against the file's trained context.
    check_generation(o->max_tokens);
    const Activations act = check_activations_option(o->activations, o->weights).at(0);
    NUMATTN_CHECK_OPTION(split_list(o->activations).size() == 1, "activations", "takes one value, got '{}'",
                         o->activations);
    try {
      make_attention_methods(o->attn, 0);
    } catch (const Error& e) {
      throw OptionError("attn", e.what());
    }
    const std::string path = resolve_model_path(o->model);
    const auto t_open = std::chrono::steady_clock::now();
    auto file = std::make_shared<const GgufFile>(GgufFile::open(path));
    const ModelHParams hp = LlamaModel::read_hparams(*file);
    check_transforms(xp, hp, file->architecture() == "numattn-mla");
    const Tokenizer tok = Tokenizer::from_gguf(*file);
    const auto ids = encode_prompt(tok, o->prompt, o->chat);
    check_generation(o->max_tokens, static_cast<std::int64_t>(ids.size()), &hp);
    // The prompt's prefill and the decode steps (one query over up to prompt + max-tokens keys)
    // must both be problems every layer's method can run, asked of its can_run before the
    // weights load.
    const auto n_prompt = static_cast<index_t>(ids.size());
    check_model_attention("attn", o->attn, hp, n_prompt, n_prompt, "prompt prefill's");
    check_model_attention("attn", o->attn, hp, 1, n_prompt + o->max_tokens, "decode step's");
    const auto t_load = std::chrono::steady_clock::now();
    LlamaModel model = LlamaModel::load(file, ctx, parse_weight_storage(o->weights));
    apply_transforms(model, tok, xp, ctx, true);
    model.set_attention(o->attn);
    model.set_activations(act);
    KvType kv = parse_kv_type(o->kv);
    model.make_cache(1, kv);  // before the prefill
    const auto t_ready = std::chrono::steady_clock::now();
    const bool md = o->format == "md";
    if (md) {
      std::cout << o->prompt << std::flush;
      if (o->chat) std::cout << "\n";
    }
    const auto t0 = std::chrono::steady_clock::now();
    ForwardProfile prof;
    // Ctrl-C stops after the token being decoded (printed first), with a message.
    CancelToken cancel;
    SigintCancel on_sigint(cancel);
    std::int64_t n_out = 0;
    const auto out = generate_greedy(model, ids, o->max_tokens, generation_stop_id(tok, o->chat), ctx,
                                     [&](std::int32_t id) {
                                       if (md) std::cout << tok.token_to_piece(id, false) << std::flush;
                                       ++n_out;
                                       cancel.check([&] {
                                         if (md) std::cout << std::endl;
                                         return fmt::format("generate: stopped after {} of at most {} tokens",
                                                            n_out, o->max_tokens);
                                       });
                                     },
                                     &prof, kv);
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (md) {
      std::cout << std::endl;
      std::fprintf(stderr,
                   "[%zu prompt + %zu generated tokens in %.2f s, attn %s, weights %s, kv %s%s%s, load %.3f s, "
                   "peak RSS %.1f MiB]\n",
                   ids.size(), out.size(), s, model.attention_spec().c_str(), o->weights.c_str(), to_string(kv),
                   xp.empty() ? "" : ", transform ", xp.canonical().c_str(),
                   std::chrono::duration<double>(t_ready - t_load).count(),
                   static_cast<double>(peak_resident_bytes()) / (1024.0 * 1024.0));
      return;
    }
    Row row;
    row["model"] = path;
    row["prompt"] = o->prompt;
    row["prompt_ids"] = ids;
    row["ids"] = out;
    row["text"] = tok.decode(out, false);
    row["seconds"] = s;
    row["tokens_per_s"] = out.empty() ? 0.0 : static_cast<double>(out.size()) / s;
    row["attn"] = model.attention_spec();
    row["transform"] = xp.canonical();
    row["weights"] = o->weights;
    row["activations"] = o->activations;
    row["kv"] = to_string(kv);
    row["cpu_path"] = cpu_path_name(default_cpu_path());
    // Opening + parsing the file (metadata, tokenizer) and building the model from it.
    row["open_s"] = std::chrono::duration<double>(t_load - t_open).count();
    row["load_s"] = std::chrono::duration<double>(t_ready - t_load).count();
    row["peak_rss_mib"] = static_cast<double>(peak_resident_bytes()) / (1024.0 * 1024.0);
    row["profile_s"] = {{"embed", prof.embed}, {"norm", prof.norm}, {"qkv_gemm", prof.qkv_gemm},
                        {"rope_kv", prof.rope}, {"attention", prof.attention},
                        {"o_gemm", prof.o_gemm}, {"ffn_gemm", prof.ffn_gemm},
                        {"ffn_act", prof.ffn_act}, {"output_gemm", prof.output_gemm}};
    print_table(std::cout, {row}, parse_format(o->format), true);
  });
}

NUMATTN_COMMAND(71, add_generate);

}  // namespace numattn::cli
