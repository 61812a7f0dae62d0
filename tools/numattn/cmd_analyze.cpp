// numattn analyze: the structure of a model's attention on a text, per layer and head, in float64
// (spectra of Q, K, V, S, A, P; ranks; row entropy, top-k mass, sinks; the §9 sparsity panels;
// the survey's §9 findings checked), and with --predict what that structure says each
// registered low-rank or sparse method can reach, against what it reaches. Each layer is analysed
// as the model computes it: its softmax scale, and its sliding window on local layers.
// docs/analysis.md.
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <iterator>
#include <iostream>
#include <memory>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "cli_common.h"
#include "commands.h"
#include "numattn/analysis/predict.h"
#include "numattn/analysis/spectra.h"
#include "numattn/attention/registry.h"
#include "numattn/core/file_io.h"
#include "numattn/core/memory.h"
#include "numattn/core/progress.h"
#include "text_window.h"

namespace numattn::cli {

namespace {

struct AnalyzeOptions {
  TextWindowFlags w;
  std::string heads = "all", out, format = "md", methods;
  bool predict = false;
  int threads = 0;
};

// A CSV file written line by line through an AtomicFile (file_io.h): the target appears only
// complete, at `close`.
class CsvFile {
 public:
  CsvFile(const std::string& path, const std::string& header) : f_(path, "--out file") { buf_ = header + "\n"; }
  template <class... A>
  void line(fmt::format_string<A...> f, A&&... a) {
    fmt::format_to(std::back_inserter(buf_), f, std::forward<A>(a)...);
    buf_ += '\n';
    if (buf_.size() > (1u << 20)) f_.write(buf_), buf_.clear();
  }
  void close() {
    f_.write(buf_);
    f_.commit();
  }

 private:
  AtomicFile f_;
  std::string buf_;
};

nlohmann::ordered_json to_json(const analysis::Matrix& m) {
  nlohmann::ordered_json g = nlohmann::ordered_json::array();
  for (std::int64_t i = 0; i < m.rows(); ++i) {
    nlohmann::ordered_json r = nlohmann::ordered_json::array();
    for (std::int64_t j = 0; j < m.cols(); ++j) r.push_back(m(i, j));
    g.push_back(r);
  }
  return g;
}

std::vector<double> to_double(const std::vector<float>& v) { return {v.begin(), v.end()}; }

const char* const kFiles[] = {"spectra.csv", "stats.csv", "rows.csv", "panels.json", "analysis.json", "predict.csv"};

}  // namespace

void add_analyze(CLI::App& app) {
  auto o = std::make_shared<AnalyzeOptions>();
  o->w.tokens = 309;  // the survey's §9 experiment
  o->w.layers = "all";
  auto* sub = app.add_subcommand(
      "analyze", "structure of a model's attention on a text, per layer and head, in float64: singular values and "
                 "ranks of Q, K, V, QK^T, A = exp(S), P; row entropy, top-k mass, attention sinks; the survey's §9 "
                 "findings; with --predict, predicted vs measured error of low-rank and sparse methods "
                 "(docs/analysis.md)");
  o->w.add_to(*sub, "layers to analyse: comma-separated indices, or 'all'");
  sub->add_option("--heads", o->heads, "query heads to analyse (KV heads: those they read): comma-separated, or 'all'")
      ->capture_default_str();
  sub->add_option("--out", o->out,
                  "output directory (created if missing): spectra.csv, stats.csv, rows.csv, panels.json, "
                  "analysis.json, predict.csv")
      ->required();
  sub->add_flag("--predict", o->predict,
                "also write predict.csv: per head and method, the lower bound on its error from the spectrum or "
                "top-k mass of P, against its measured error");
  sub->add_option("--methods", o->methods,
                  "methods for --predict, specs separated by ';' or by ',' outside parentheses "
                  "(default: lowrank.svd rank 8/32, lowrank.nystrom 16/64, "
                  "sparse.topk 8/32, lowrank.loki, sparse.window(left=32,sinks=4)); each must be "
                  "one whose budget "
                  "bounds its error (predict.h)");
  add_common(*sub, &o->threads, &o->format);
  sub->callback([o] {
    ExecContext ctx{o->threads};
    const auto t_start = std::chrono::steady_clock::now();
    namespace fs = std::filesystem;
    const Format format = parse_format(o->format);
    std::vector<std::string> specs;
    if (o->predict) {
      if (o->methods.empty()) {
        specs = analysis::default_predict_specs();
      } else {
        specs = split_spec_option("methods", o->methods, ";,");
      }
      // Every spec must parse and carry a budget: checked on a 2-token problem before any work.
      for (const std::string& s : specs) {
        try {
          (void)analysis::method_budget(*create_method(s), 2, 2);
        } catch (const Error& e) {
          throw OptionError("methods", e.what());
        }
      }
    } else {
      NUMATTN_CHECK_OPTION(o->methods.empty(), "methods", "only applies with `predict`");
    }
    const std::int64_t N = o->w.tokens;
    std::vector<std::int64_t> heads;
    const TextWindow w = open_text_window(o->w, o->out, "analyze", [&](const TextWindow& t) {
      heads = parse_index_list(o->heads, "heads", t.hp.n_head, "head", "n_head");
      std::vector<NamedPath> outputs;
      for (const char* f : kFiles) outputs.push_back({std::string("--out file ") + f, (fs::path(o->out) / f).string()});
      check_outputs_distinct(outputs, {{"--model", t.model_path}, {"--text", t.text_path}});
      // float64 per thread: S, A, P, exp(S − max S) and an SVD's copy and work, about 8 N×N.
      NUMATTN_CHECK_OPTION(N <= 4096, "tokens",
                           "analyze forms the {}×{} attention matrices of each head in float64 and takes their SVDs; "
                           "at most 4096 tokens",
                           N, N);
      const auto per_layer = static_cast<std::uint64_t>(
          checked_mul(checked_mul(t.hp.n_head + 2 * t.hp.n_head_kv, N, "capture size"), t.hp.head_dim, "capture size"));
      check_memory(2 * 4 * per_layer * t.layers.size() +
                       static_cast<std::uint64_t>(ctx.num_threads()) * 8 * 8 * static_cast<std::uint64_t>(N * N),
                   "analyze (the captured q/k/v, both RoPE states, and float64 N×N matrices per thread)");
    });
    const ModelHParams& hp = w.hp;
    const std::int64_t Hq = hp.n_head, Hkv = hp.n_head_kv, D = hp.head_dim;
    // The model's softmax scale and each layer's sliding window (0 = a global layer), as its
    // forward pass uses them.
    const double scale = hp.attn_scale > 0 ? hp.attn_scale : 1.0 / std::sqrt(static_cast<double>(D));
    auto layer_window = [&](std::int64_t layer) { return hp.is_local(layer) ? hp.sliding_window : std::int64_t{0}; };
    const bool progress = !o->w.no_progress;
    const std::vector<LayerTensors> captured = capture_layers(w, RopeState::kBoth, progress, "analyze", ctx);

    std::error_code ec;
    fs::create_directories(o->out, ec);
    NUMATTN_CHECK(!ec && fs::is_directory(o->out), "--out: cannot create directory '{}': {}", o->out, ec.message());
    auto path = [&](const char* f) { return (fs::path(o->out) / f).string(); };
    CsvFile spectra(path("spectra.csv"), "layer,head,matrix,index,sigma");
    CsvFile stats(path("stats.csv"), "layer,head,matrix,rank_rel_1e-2,rank_energy_90,stable_rank,sigma1,n");
    CsvFile rows(path("rows.csv"),
                 "layer,head,entropy_mean,entropy_min,entropy_max,topk_mass_k8,topk_mass_k32,topk_mass_k_0.1n,"
                 "sink_columns");
    std::unique_ptr<CsvFile> predict;
    if (o->predict)
      predict = std::make_unique<CsvFile>(path("predict.csv"),
                                          "layer,head,method,param,predicted_error,measured_error,metric,bound,causal,"
                                          "output_rel_fro_error,budget_excess,window");
    nlohmann::ordered_json panels = nlohmann::ordered_json::array();
    std::vector<analysis::LayerAnalysis> all;
    std::int64_t predict_rows = 0, bound_violations = 0;
    nlohmann::ordered_json skipped = nlohmann::ordered_json::array();  // per layer and method

    ProgressBar bar("analyze", static_cast<std::int64_t>(w.layers.size()),
                    progress ? ProgressBar::Mode::kAuto : ProgressBar::Mode::kOff);
    for (std::size_t li = 0; li < w.layers.size(); ++li) {
      const std::int64_t layer = w.layers[li];
      const LayerTensors& t = captured[li];
      analysis::LayerQkv lq;
      lq.heads = Hq, lq.kv_heads = Hkv, lq.n = N, lq.d = D, lq.window = layer_window(layer);
      lq.q_pre = to_double(t.q_pre), lq.k_pre = to_double(t.k_pre), lq.q_post = to_double(t.q_post);
      lq.k_post = to_double(t.k_post), lq.v = to_double(t.v);
      analysis::LayerAnalysis la = analysis::analyze_layer(lq, scale, heads, ctx);
      for (const analysis::HeadSpectrum& s : la.spectra) {
        for (std::int64_t i = 0; i < s.sigma.size(); ++i)
          spectra.line("{},{},{},{},{:.10g}", layer, s.head, s.matrix, i + 1, s.sigma[i]);
        stats.line("{},{},{},{},{},{:.10g},{:.10g},{}", layer, s.head, s.matrix, s.stats.rank_rel, s.stats.rank_energy,
                   s.stats.stable_rank, s.stats.sigma1, s.stats.n);
      }
      for (const analysis::HeadRows& r : la.rows) {
        rows.line("{},{},{:.10g},{:.10g},{:.10g},{:.10g},{:.10g},{:.10g},{}", layer, r.head, r.entropy_mean,
                  r.entropy_min, r.entropy_max, r.topk_mass_k8, r.topk_mass_k32, r.topk_mass_frac10,
                  fmt::format("{}", fmt::join(r.sinks, " ")));
        nlohmann::ordered_json p;
        p["layer"] = layer;
        p["head"] = r.head;
        p["grid"] = to_json(r.panel);
        p["block_grid"] = to_json(r.block_grid);
        p["sinks"] = r.sinks;
        panels.push_back(std::move(p));
      }
      if (o->predict) {
        // Heads one after the other, each method parallel inside: methods size per-thread scratch
        // by their own context, which a nested call (keeping the outer worker's index) would break.
        std::vector<std::vector<analysis::PredictRow>> res(heads.size());
        for (std::size_t i = 0; i < heads.size(); ++i) {
          const std::int64_t h = heads[i], g = h / (Hq / Hkv);
          res[i] = analysis::predict_head(analysis::head_matrix(lq.q_post, h, N, D),
                                          analysis::head_matrix(lq.k_post, g, N, D),
                                          analysis::head_matrix(lq.v, g, N, D), scale, specs, ctx, lq.window);
        }
        for (std::size_t i = 0; i < heads.size(); ++i)
          for (const analysis::PredictRow& r : res[i]) {
            if (!r.skipped.empty()) {
              // The same for every head of the layer: one entry per layer and method.
              if (i == 0)
                skipped.push_back({{"layer", layer}, {"method", r.method}, {"window", lq.window}, {"reason", r.skipped}});
              continue;
            }
            // Bounds hold up to the float32 rounding of the method's P̂ (docs/numerics.md).
            const bool bound = r.budget_excess <= 0;
            predict->line("{},{},\"{}\",\"{}\",{:.10g},{:.10g},{},{},{},{:.10g},{},{}", layer, heads[i], r.method,
                          r.param, r.predicted, r.measured, r.metric, bound ? "true" : "false", r.causal,
                          r.output_rel_fro, r.budget_excess, r.window);
            ++predict_rows;
            bound_violations += bound && r.measured < r.predicted - 1e-4;
          }
      }
      all.push_back(std::move(la));
      bar.set(static_cast<std::int64_t>(li) + 1, "layer " + std::to_string(layer));
    }
    bar.finish();
    if (progress)
      for (const auto& sk : skipped)
        std::fprintf(stderr, "analyze: --predict: layer %lld (window %lld): %s skipped: %s\n",
                     static_cast<long long>(sk["layer"].get<std::int64_t>()),
                     static_cast<long long>(sk["window"].get<std::int64_t>()), sk["method"].get<std::string>().c_str(),
                     sk["reason"].get<std::string>().c_str());
    spectra.close();
    stats.close();
    rows.close();
    if (predict) predict->close();

    nlohmann::ordered_json pj;
    pj["tokens"] = N;
    pj["panel"] = "grid: the top-left 20x20 block of the causal P, each row divided by its largest entry (survey Fig. 5); "
                  "block_grid: mean of P over each block of a 20x20 partition of the whole matrix";
    pj["panels"] = std::move(panels);
    const std::string ptext = dump_json(pj) + "\n";
    write_file_atomically(path("panels.json"), ptext.data(), ptext.size(), "panels.json");

    nlohmann::ordered_json a;
    a["format"] = "numattn-analysis";
    a["version"] = 1;
    a["model"] = w.model_path;
    a["model_name"] = w.file.get_string("general.name", "");
    a["text"] = w.text_path;
    a["offset"] = o->w.offset;
    a["tokens"] = N;
    a["bos_replaced"] = w.bos_replaced;
    a["layers"] = w.layers;
    a["heads"] = heads;
    a["n_head"] = Hq;
    a["n_head_kv"] = Hkv;
    a["head_dim"] = D;
    a["scale"] = scale;
    a["causal"] = "bottom-right";
    nlohmann::ordered_json windows = nlohmann::ordered_json::object();
    for (std::int64_t layer : w.layers) windows[std::to_string(layer)] = layer_window(layer);
    a["layer_window"] = std::move(windows);
    a["window_rule"] = "a layer with window W > 0 (sliding-window attention): query i sees keys i-W+1..i; 0 = no "
                       "window (keys 0..i)";
    a["precision"] = "float64 analysis of the float32 Q/K/V of the model's forward pass";
    a["a_scaling"] = "a: exp(S - rowmax) (row i divided by exp(max_j S_ij)); the findings use exp(S - max S), a "
                     "scalar multiple of exp(S)";
    a["sink_rule"] = "key j is a sink when c_j = mean over rows of P_ij is >= 0.1 and >= 4 times the c_j of "
                   "uniform attention over the visible keys";
    a["findings"] = analysis::section9_findings(all, N, D);
    if (o->predict) {
      a["predict"] = {{"methods", specs}, {"rows", predict_rows}, {"bound_violations", bound_violations}};
      if (!skipped.empty()) a["predict"]["skipped"] = std::move(skipped);
    }
    a["seconds"] = std::chrono::duration<double>(std::chrono::steady_clock::now() - t_start).count();
    const std::string atext = dump_json(a, 2) + "\n";
    write_file_atomically(path("analysis.json"), atext.data(), atext.size(), "analysis.json");

    if (format == Format::kJson) {
      std::cout << atext;
      return;
    }
    std::vector<Row> table;
    for (const auto& f : a["findings"]) {
      Row r;
      r["id"] = f["id"];
      r["holds"] = f["holds"].is_string() ? f["holds"].get<std::string>() : f["holds"].dump();
      r["statement"] = f["statement"];
      table.push_back(r);
    }
    print_table(std::cout, table, format);
    if (progress) std::fprintf(stderr, "analyze: wrote %s (%.1f s)\n", o->out.c_str(), a["seconds"].get<double>());
  });
}

NUMATTN_COMMAND(74, add_analyze);

}  // namespace numattn::cli
