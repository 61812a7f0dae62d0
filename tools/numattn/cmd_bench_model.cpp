// numattn bench-model: prefill and decode tokens/s of a GGUF model at several context lengths,
// the weight bytes a decode step reads, and the memory-bandwidth roofline measured in the same
// run (a streaming read of a buffer larger than the last-level cache).
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <functional>
#include <iostream>
#include <memory>
#include <optional>

#include "cli_common.h"
#include "commands.h"
#include "mla_cli.h"
#include "tensor_cli.h"
#include "transform_cli.h"
#include "numattn/attention/kv_reads.h"
#include "numattn/gguf/gguf.h"
#include "numattn/model/bda_model.h"
#include "numattn/model/bench_model.h"
#include "numattn/model/data.h"
#include "numattn/model/llama.h"
#include "numattn/model/mla_model.h"
#include "numattn/model/transform_model.h"
#include "numattn/model/tokenizer.h"
#include "numattn/quant/qgemv.h"

namespace numattn::cli {

namespace {
struct BenchModelOptions {
  std::string model = "default", ctx = "0,128,512", weights = "gguf", format = "md",
              activations = "f32", kv = "f16";
  std::vector<std::string> attn;
  std::int64_t decode = 64, warmup = 1;
  int threads = 0, reps = 1;
  double bandwidth_mib = 0;
  TransformCliOptions xf;
};

// "30 × rms+gqa, rms+swiglu": the model's layers as blocks, runs of equal layers counted.
// "30 × rms+gqa, rms+swiglu", or per distinct layer form in order of first appearance
// ("15 × rms+gqa(window 512)+rms, rms+geglu+rms; 3 × rms+gqa+rms, rms+geglu+rms").
std::string block_summary(const LlamaModel& m) {
  std::vector<std::pair<std::string, int>> kinds;
  for (const DecoderLayer& d : m.layers()) {
    const std::int64_t w = d.attn->window();
    const std::string k = fmt::format(
        "{}+{}{}{}, {}+{}{}", d.attn_norm->kind(), d.attn->kind(), w > 0 ? fmt::format("(window {})", w) : "",
        d.attn_post_norm ? "+" + d.attn_post_norm->kind() : "", d.ffn_norm->kind(), d.ffn->kind(),
        d.ffn_post_norm ? "+" + d.ffn_post_norm->kind() : "");
    auto it = std::find_if(kinds.begin(), kinds.end(), [&](const auto& e) { return e.first == k; });
    if (it == kinds.end()) kinds.emplace_back(k, 1);
    else ++it->second;
  }
  std::string out;
  for (const auto& [k, n] : kinds) out += fmt::format("{}{} × {}", out.empty() ? "" : "; ", n, k);
  return out;
}

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}
}  // namespace

void add_bench_model(CLI::App& app) {
  auto o = std::make_shared<BenchModelOptions>();
  auto* sub = app.add_subcommand(
      "bench-model",
      "prefill and decode tokens/s of a GGUF model at several context lengths, bytes read per "
      "decoded token, and the same-run memory-bandwidth roofline");
  sub->add_option("--model", o->model, "GGUF file, or 'default'")->capture_default_str();
  sub->add_option("--ctx", o->ctx,
                  "comma-separated context lengths: each row prefills that many tokens (0 = "
                  "one token, as llama-bench's tg test), then decodes --decode tokens after them")
      ->capture_default_str();
  sub->add_option("--decode", o->decode, "tokens decoded one at a time after each prefill")
      ->capture_default_str();
  sub->add_option("--weights", o->weights,
                  "weight storage: gguf (the file's encoding, in place) or f32 (dequantized)")
      ->capture_default_str()
      ->check(CLI::IsMember({"gguf", "f32"}));
  add_activations_option(*sub, &o->activations, true);
  sub->add_option("--warmup", o->warmup,
                  "untimed decode steps of each model form before any measurement (llama-bench's "
                  "default warm-up is one generated token): the first touch of the mapped "
                  "weights and other first-use costs stay out of the timings")
      ->capture_default_str()
      ->check(CLI::Range(0, 4096));
  sub->add_option("--reps", o->reps, "repetitions of each row (the median is reported)")
      ->capture_default_str()
      ->check(CLI::Range(1, 100));
  sub->add_option("--bandwidth-mib", o->bandwidth_mib,
                  "size of the streaming-read buffer in MiB (0 = twice the last-level cache, at "
                  "least 256 MiB)")
      ->capture_default_str();
  sub->add_option("--kv", o->kv,
                  "comma-separated KV-cache element types, each a form of its own: f16 (as llama.cpp), bf16, f32")
      ->capture_default_str();
  sub->add_option("--attn", o->attn,
                  "attention spec of every layer (repeatable: each spec is a form of its own, measured in the same "
                  "repetitions; default exact.flash)");
  sub->add_option("--transform", o->xf.transform,
                  "model transforms (`numattn transforms`), e.g. \"mla(rank=128)|bda(pairs=vo)\": the model "
                  "is measured before and after each stage (each form, then the form with the stage applied), "
                  "interleaved repetition by repetition");
  add_mla_options(*sub, o->xf.mla);
  sub->add_option("--bda", o->xf.bda, "deprecated alias of --transform \"bda(pairs=...)\": none | vo | qk | qkvo")
      ->capture_default_str()
      ->check(CLI::IsMember({"none", "vo", "qk", "qkvo"}));
  sub->add_option("--bda-coef", o->xf.bda_coef, "deprecated alias of --transform \"bda(coef=...)\": q8_0 | source | f32")
      ->capture_default_str()
      ->check(CLI::IsMember({"q8_0", "source", "f32"}));
  add_tensor_alias_option(*sub, o->xf.tensor);
  add_common(*sub, &o->threads, &o->format);
  sub->callback([o, sub] {
    ExecContext ctx{o->threads};
    const transform::TransformPipeline xp = resolve_transforms(*sub, o->xf);
    const int nt = ctx.num_threads();
    NUMATTN_CHECK_OPTION(o->decode >= 1, "decode", "must be at least 1, got {}", o->decode);
    const std::vector<Activations> acts = check_activations_option(o->activations, o->weights);
    NUMATTN_CHECK_OPTION(o->bandwidth_mib >= 0, "bandwidth-mib", "must be >= 0, got {}",
                         o->bandwidth_mib);
    std::vector<std::int64_t> lens;
    for (const std::string& s : split_list(o->ctx)) {
      std::int64_t v = -1;
      try {
        std::size_t used = 0;
        v = std::stoll(s, &used);
        if (used != s.size()) v = -1;
      } catch (...) {
      }
      NUMATTN_CHECK_OPTION(v >= 0, "ctx", "'{}' is not a context length (a whole number >= 0)", s);
      lens.push_back(v);
    }
    NUMATTN_CHECK_OPTION(!lens.empty(), "ctx", "is empty");
    std::vector<KvType> kvs;
    for (const std::string& s : split_list(o->kv)) {
      NUMATTN_CHECK_OPTION(s == "f16" || s == "bf16" || s == "f32", "kv",
                           "'{}' is not a KV-cache element type (f16, bf16 or f32)", s);
      kvs.push_back(parse_kv_type(s));
    }
    NUMATTN_CHECK_OPTION(!kvs.empty(), "kv", "is empty");
    if (o->attn.empty()) o->attn.push_back(kDefaultModelAttention);
    for (const std::string& a : o->attn) {
      try {
        make_attention_methods(a, 0);
      } catch (const Error& e) {
        throw OptionError("attn", e.what());
      }
    }
    const std::string path = resolve_model_path(o->model);
    const auto t_open = std::chrono::steady_clock::now();
    auto file = std::make_shared<const GgufFile>(GgufFile::open(path));
    const ModelHParams hp = LlamaModel::read_hparams(*file);
    check_transforms(xp, hp, file->architecture() == "numattn-mla");
    const std::string file_transform = file->get_string(transform::kTransformKey, "");
    const double open_s = seconds_since(t_open);
    for (std::int64_t L : lens)
      NUMATTN_CHECK_OPTION(std::max<std::int64_t>(L, 1) + o->decode <= hp.n_ctx_train, "ctx",
                           "{} + {} decoded tokens exceed the model's trained context {}", L,
                           o->decode, hp.n_ctx_train);
    NUMATTN_CHECK_OPTION(1 + o->warmup <= hp.n_ctx_train, "warmup",
                         "1 + {} warm-up tokens exceed the model's trained context {}", o->warmup, hp.n_ctx_train);
    const auto t_load = std::chrono::steady_clock::now();
    LlamaModel loaded = LlamaModel::load(file, ctx, parse_weight_storage(o->weights));
    const double load_s = seconds_since(t_load);
    // --mla-rank: the GQA model and its MLA conversion, measured in the same run (one row each
    // per context length, interleaved per repetition so both see the same machine load).
    struct Form {
      std::string name;
      LlamaModel model;
      KvType kv = KvType::kF32;
      std::string transform;  ///< the stages of --transform applied to it (canonical)
    };
    // A form's transforms, then stage i of the pipeline.
    auto then = [&](const std::string& before, std::size_t i) {
      return before.empty() ? xp.stages[i].spec() : before + "|" + xp.stages[i].spec();
    };
    const std::string mla_exec = xp.mla ? xp.mla->exec : o->xf.mla.exec;
    std::vector<Form> forms;
    std::size_t stage = 0;
    if (xp.mla) {
      LlamaModel mla = loaded;
      const MlaStageResult res = apply_mla_stage(mla, Tokenizer::from_gguf(*file), *xp.mla, ctx, true);
      forms.push_back({"gqa", std::move(loaded), KvType::kF32, ""});
      forms.push_back({fmt::format("mla r={} d_rope={} {}", res.report.rank, res.report.d_rope, mla_exec),
                       std::move(mla), KvType::kF32, then("", stage++)});
    } else {
      if (loaded.has_mla()) loaded.set_mla_exec(parse_mla_exec(mla_exec));
      forms.push_back({loaded.has_mla() ? "mla (file) " + mla_exec : "gqa", std::move(loaded), KvType::kF32, ""});
    }

    // --bda, --tensor: each form followed by its rewrite (copies share the mapped file), so the
    // two are measured in the same repetitions.
    auto add_rewrites = [&](const std::function<Form(const Form&)>& rewrite) {
      std::vector<Form> base = std::move(forms);
      forms.clear();
      for (Form& f : base) {
        Form r = rewrite(f);
        forms.push_back(std::move(f));
        forms.push_back(std::move(r));
      }
    };
    if (xp.bda) {
      add_rewrites([&](const Form& f) {
        Form b{f.name + " + bda " + xp.bda->pairs, f.model, KvType::kF32, then(f.transform, stage)};
        const ModelBdaReport rep = apply_bda(b.model, xp.bda->pairs, {}, parse_bda_coef(xp.bda->coef));
        if (!rep.coef_type.empty()) b.name += " (" + rep.coef_type + ")";
        return b;
      });
      ++stage;
    }
    if (xp.tensor)
      add_rewrites([&](const Form& f) {
        return Form{f.name + " + tensor " + xp.tensor->canonical(), compress_model_tensor(f.model, *xp.tensor, ctx),
                    KvType::kF32, then(f.transform, stage)};
      });

    // --attn, --kv: every form once per attention spec and cache type (copies share the file).
    for (const std::string& a : o->attn)
      check_model_attention("attn", a, hp, 1, std::max<std::int64_t>(*std::max_element(lens.begin(), lens.end()), 1) + o->decode,
                            "decode step's");
    {
      std::vector<Form> base = std::move(forms);
      forms.clear();
      for (const Form& f : base)
        for (const std::string& a : o->attn)
          for (KvType kv : kvs) {
            forms.push_back({f.name, f.model, kv, f.transform});
            forms.back().model.set_attention(a);
            forms.back().model.make_cache(1, kv);  // refuses a type the layers cannot hold
          }
    }

    // --activations f32,q8: every form once per activation precision (copies share the file).
    if (acts.size() > 1 || acts[0] != Activations::kF32) {
      std::vector<Form> base = std::move(forms);
      forms.clear();
      for (const Form& f : base)
        for (Activations a : acts) {
          forms.push_back({f.name, f.model, f.kv, f.transform});
          forms.back().model.set_activations(a);
        }
    }

    // Deterministic tokens: speed does not depend on what they are.
    auto tokens = [&](std::int64_t n, std::int64_t seed) {
      std::vector<std::int32_t> t(static_cast<std::size_t>(n));
      for (std::int64_t i = 0; i < n; ++i)
        t[static_cast<std::size_t>(i)] = static_cast<std::int32_t>((seed * 7919 + i * 104729) % hp.n_vocab);
      return t;
    };
    struct Measured {
      std::size_t form;
      std::int64_t L, n_prompt;
      double prefill, decode, split_share;
      double qkv_prefill, qkv_decode;  ///< seconds per token in the Q/K/V projections (median)
      double attn_decode;              ///< seconds per decoded token in the attention phase (median)
    };
    std::vector<Measured> ms;
    for (const Form& f : forms) {
      if (o->warmup == 0) break;
      KvCache cache = f.model.make_cache(1 + o->warmup, f.kv);
      std::vector<float> logits = f.model.forward(tokens(1, 1), cache, ctx);
      for (std::int64_t i = 0; i < o->warmup; ++i) {
        const auto next = static_cast<std::int32_t>(std::max_element(logits.begin(), logits.end()) - logits.begin());
        logits = f.model.forward({next}, cache, ctx);
      }
    }
    for (std::int64_t L : lens) {
      const std::int64_t n_prompt = std::max<std::int64_t>(L, 1);
      std::vector<std::vector<double>> pre_f(forms.size()), dec_f(forms.size());
      std::vector<GemvSplitStats> split_f(forms.size());
      std::vector<std::vector<double>> qkv_pre_f(forms.size()), qkv_dec_f(forms.size()), attn_dec_f(forms.size());
      for (int r = 0; r < o->reps; ++r)
        for (std::size_t fi = 0; fi < forms.size(); ++fi) {
        const LlamaModel& model = forms[fi].model;
        std::vector<double>& pre_tps = pre_f[fi];
        std::vector<double>& dec_tps = dec_f[fi];
        KvCache cache = model.make_cache(n_prompt + o->decode, forms[fi].kv);
        // The phase profile (ForwardProfile) costs two clock reads per phase: noise next to a
        // decode step's ~5 ms.
        ForwardProfile pre_prof, dec_prof;
        ForwardOptions po;
        po.logits_begin = n_prompt - 1;
        po.profile = &pre_prof;
        auto t0 = std::chrono::steady_clock::now();
        std::vector<float> logits = model.forward(tokens(n_prompt, L), cache, ctx, po);
        pre_tps.push_back(static_cast<double>(n_prompt) / seconds_since(t0));
        const GemvSplitStats split0 = gemv_split_stats();
        ForwardOptions dopt;
        dopt.profile = &dec_prof;
        t0 = std::chrono::steady_clock::now();
        std::int32_t next = 0;
        for (std::int64_t i = 0; i < o->decode; ++i) {
          next = static_cast<std::int32_t>(std::max_element(logits.begin(), logits.end()) - logits.begin());
          logits = model.forward({next}, cache, ctx, dopt);
        }
        dec_tps.push_back(static_cast<double>(o->decode) / seconds_since(t0));
        qkv_pre_f[fi].push_back(pre_prof.qkv_gemm / static_cast<double>(n_prompt));
        qkv_dec_f[fi].push_back(dec_prof.qkv_gemm / static_cast<double>(o->decode));
        attn_dec_f[fi].push_back(dec_prof.attention / static_cast<double>(o->decode));
        const GemvSplitStats split1 = gemv_split_stats();
        split_f[fi].split += split1.split - split0.split;
        split_f[fi].single += split1.single - split0.single;
      }
      for (std::size_t fi = 0; fi < forms.size(); ++fi)
        ms.push_back({fi, L, n_prompt, median(pre_f[fi]), median(dec_f[fi]),
                      split_f[fi].split + split_f[fi].single > 0
                          ? static_cast<double>(split_f[fi].split) /
                                static_cast<double>(split_f[fi].split + split_f[fi].single)
                          : 0.0,
                      median(qkv_pre_f[fi]), median(qkv_dec_f[fi]), median(attn_dec_f[fi])});
    }
    // Peak resident memory of the model's own work, before the bandwidth buffer below exists.
    const std::uint64_t rss = peak_resident_bytes();
    // The roofline: bytes a decode step must read ÷ the rate this machine streams them, both
    // measured in this run. The buffer exceeds the last-level cache so the reads come from
    // memory; a model that fits in that cache may beat this roofline (its weights can stay
    // cached between tokens), which the row's roofline_fraction then shows as > 1.
    const std::uint64_t llc = last_level_cache_bytes();
    const std::uint64_t bw_bytes =
        o->bandwidth_mib > 0 ? static_cast<std::uint64_t>(o->bandwidth_mib * 1024 * 1024)
                             : std::max<std::uint64_t>(2 * llc, std::uint64_t{256} << 20);
    const double bw = measure_read_bandwidth(bw_bytes, 5, ctx);
    std::vector<Row> rows;
    for (const Measured& m : ms) {
      const std::int64_t L = m.L, n_prompt = m.n_prompt;
      const LlamaModel& model = forms[m.form].model;
      const std::uint64_t weight_bytes = model.weight_bytes_per_token(true);
      // KV cache read by the average decode step (every layer's K and V, or its MLA latent
      // rows, in the cache's element type).
      const double mid_ctx = static_cast<double>(n_prompt) + static_cast<double>(o->decode) / 2;
      // The rows each layer's method reads for the decode step's query (a sliding-window layer
      // at most its window's, a sparse method only those it chooses: attention/kv_reads.h).
      double kv_bytes = 0;
      for (std::size_t l = 0; l < model.layers().size(); ++l) {
        const AttentionBlock& a = *model.layers()[l].attn;
        const auto nk = static_cast<index_t>(mid_ctx);
        AttentionProblem dp;  // shapes only
        dp.q = TensorView<const float>(nullptr, {1, hp.n_head, 1, hp.head_dim}, {0, 0, 0, 1});
        dp.k = TensorView<const float>(nullptr, {1, hp.n_head_kv, nk, hp.head_dim}, {0, 0, 0, 1});
        dp.v = dp.k;
        dp.causal = Causal::kBottomRight;
        if (a.window() > 0) dp.window_left = a.window() - 1;
        const index_t rows = kv_rows_read(model.attention(static_cast<int>(l)), dp, 0);
        kv_bytes += static_cast<double>(a.cache_bytes_per_token(forms[m.form].kv)) * static_cast<double>(rows);
      }
      const double bytes_tok = static_cast<double>(weight_bytes) + kv_bytes;
      const double roof = bw / bytes_tok;
      const double dec = m.decode;
      Row row;
      row["model"] = path;
      row["attention"] = forms[m.form].name;
      row["transform"] = forms[m.form].transform;
      if (!file_transform.empty()) row["file_transform"] = file_transform;
      row["attn"] = model.attention_spec();
      row["kv"] = to_string(forms[m.form].kv);
      row["kv_cache_bytes_per_token_layer"] =
          static_cast<double>(model.kv_bytes_per_token(forms[m.form].kv)) / static_cast<double>(hp.n_layer);
      row["weights"] = o->weights;
      row["activations"] = activations_name(model.activations());
      row["cpu_path"] = cpu_path_name(default_cpu_path());
      row["threads"] = nt;
      row["ctx"] = L;
      row["prefill_tokens"] = n_prompt;
      row["prefill_tokens_per_s"] = L > 0 ? Row(m.prefill) : Row();
      row["decode_tokens"] = o->decode;
      row["decode_tokens_per_s"] = dec;
      row["weight_bytes_per_token"] = weight_bytes;
      // What the blocks state (model/blocks/block.h): their forms, the linear weights a token
      // multiplies and the FLOPs of the average decode step.
      row["blocks"] = block_summary(model);
      row["body_weights"] = model.body_weights();
      double flops = 2.0 * static_cast<double>(model.output_weights());
      for (const DecoderLayer& d : model.layers())
        flops += d.attn->flops_per_token(static_cast<std::int64_t>(mid_ctx)) + d.ffn->flops_per_token();
      row["decode_gflops_per_token"] = flops * 1e-9;
      // The Q/K/V projections' share of the profile (the part BD Attention rewrites), per token.
      row["qkv_us_per_token_prefill"] = L > 0 ? Row(m.qkv_prefill * 1e6) : Row();
      row["qkv_us_per_token_decode"] = m.qkv_decode * 1e6;
      row["attn_us_per_token_decode"] = m.attn_decode * 1e6;
      row["kv_bytes_per_token"] = kv_bytes;
      row["bytes_per_token"] = bytes_tok;
      row["read_bandwidth_gbs"] = bw * 1e-9;
      row["bandwidth_buffer_mib"] = static_cast<double>(bw_bytes) / (1024.0 * 1024.0);
      row["llc_mib"] = static_cast<double>(llc) / (1024.0 * 1024.0);
      row["roofline_tokens_per_s"] = roof;
      row["roofline_fraction"] = dec / roof;
      row["decode_gbs"] = dec * bytes_tok * 1e-9;
      // Share of the decode GEMV products split over the threads (quant_linear's tuner).
      row["gemv_split_share"] = m.split_share;
      row["file_mib"] = static_cast<double>(file->file_size()) / (1024.0 * 1024.0);
      row["open_s"] = open_s;
      row["load_s"] = load_s;
      row["peak_rss_mib"] = static_cast<double>(rss) / (1024.0 * 1024.0);
      rows.push_back(row);
    }
    print_table(std::cout, rows, parse_format(o->format), false);
  });
}

NUMATTN_COMMAND(72, add_bench_model);

}  // namespace numattn::cli
