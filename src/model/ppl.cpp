#include "numattn/model/ppl.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <limits>

#include "numattn/core/error.h"
#include "numattn/core/progress.h"
#include "numattn/model/llama.h"

namespace numattn {

BosMode parse_bos_mode(const std::string& s) {
  if (s == "replace") return BosMode::kReplace;
  if (s == "auto") return BosMode::kAuto;
  if (s == "keep") return BosMode::kKeep;
  throw OptionError("bos", "must be auto, replace or keep, got '" + s + "'");
}

const char* to_string(BosMode m) {
  switch (m) {
    case BosMode::kAuto: return "auto";
    case BosMode::kReplace: return "replace";
    case BosMode::kKeep: return "keep";
  }
  return "?";
}

void log_softmax(const float* logits, std::int64_t n, std::vector<double>& out) {
  out.resize(static_cast<std::size_t>(n));
  double mx = -std::numeric_limits<double>::infinity();
  for (std::int64_t i = 0; i < n; ++i) mx = std::max(mx, static_cast<double>(logits[i]));
  double s = 0;
  for (std::int64_t i = 0; i < n; ++i) s += std::exp(static_cast<double>(logits[i]) - mx);
  const double lse = mx + std::log(s);
  for (std::int64_t i = 0; i < n; ++i) out[static_cast<std::size_t>(i)] = logits[i] - lse;
}

namespace {

// Spec errors of option `option` as OptionError, so that a caller sees which spec was bad.
AttentionMethods option_methods(const char* option, const std::string& spec, std::int64_t n_layer,
                                const std::vector<std::uint8_t>& local = {}) {
  try {
    return make_attention_methods(spec, n_layer, local);
  } catch (const OptionError&) {
    throw;
  } catch (const Error& e) {
    throw OptionError(option, e.what());
  }
}

}  // namespace

void check_ppl_options(const PplOptions& opt, const ModelHParams* hp, std::int64_t n_tokens) {
  NUMATTN_CHECK_OPTION(opt.ctx >= 4, "ctx", "a chunk needs at least 4 tokens, got {}", opt.ctx);
  NUMATTN_CHECK_OPTION(opt.chunks == -1 || opt.chunks >= 1, "chunks",
                       "must be -1 (all that fit) or at least 1, got {}", opt.chunks);
  const std::int64_t n_layer = hp ? hp->n_layer : 0;
  const std::vector<std::uint8_t> no_local, &local = hp ? hp->local_layers : no_local;
  option_methods("attn", opt.attn, n_layer, local);
  if (!opt.baseline.empty()) option_methods("baseline", opt.baseline, n_layer, local);
  if (hp)
    NUMATTN_CHECK_OPTION(opt.ctx <= hp->n_ctx_train || opt.allow_long_ctx, "ctx",
                         "{} tokens is beyond the model's trained context of {} "
                         "({}): positions past it were never trained; set "
                         "`allow_long_ctx` to evaluate them anyway",
                         opt.ctx, hp->n_ctx_train, hp->key(hparam_key::kContext));
  if (n_tokens >= 0)
    NUMATTN_CHECK(n_tokens / 2 >= opt.ctx,
                  "the text has {} tokens; perplexity with ctx {} needs at least twice that "
                  "(two chunks)",
                  n_tokens, opt.ctx);
}

PplResult evaluate_perplexity(const LlamaModel& model, const std::vector<std::int32_t>& tokens,
                              std::int32_t bos_id, bool add_bos, const PplOptions& opt,
                              const ExecContext& ctx) {
  const auto n_tok = static_cast<std::int64_t>(tokens.size());
  check_ppl_options(opt, &model.hparams(), n_tok);
  const std::int64_t n_ctx = opt.ctx;
  std::int64_t n_chunk = n_tok / n_ctx;
  if (opt.chunks >= 1) n_chunk = std::min(n_chunk, opt.chunks);
  const bool replace = opt.bos == BosMode::kReplace || (opt.bos == BosMode::kAuto && add_bos);
  NUMATTN_CHECK(!replace || bos_id >= 0, "BOS replacement asked for but the vocabulary has no BOS");
  const std::int64_t first = n_ctx / 2;
  const std::int64_t V = model.hparams().n_vocab;
  const std::int64_t n_rows = n_ctx - 1 - first;  // scored positions per chunk

  const bool kl = !opt.baseline.empty() || opt.baseline_model != nullptr || opt.kv != opt.baseline_kv;
  const LlamaModel& base_model = opt.baseline_model ? *opt.baseline_model : model;
  if (opt.baseline_model) {
    const ModelHParams &a = model.hparams(), &b = opt.baseline_model->hparams();
    // The head dim may differ (a tensor-compressed model embedded with wider heads,
    // model/tensor_model.h): the baseline runs with a cache of its own shape.
    NUMATTN_CHECK(a.n_vocab == b.n_vocab && a.n_layer == b.n_layer && a.n_embd == b.n_embd &&
                      a.n_head == b.n_head && a.n_head_kv == b.n_head_kv,
                  "the baseline model has other hyper-parameters than the evaluated one");
  }
  // The chunk's final hidden rows, then their logits in blocks of at most ~256 MiB (a whole
  // chunk's logits for a 262 144-token vocabulary at ctx 8192 would be 8.6 GB).
  ForwardOptions fo;
  fo.logits_begin = first;
  fo.hidden = true;
  fo.attention = option_methods("attn", opt.attn, model.hparams().n_layer, model.hparams().local_layers);
  ForwardOptions fb;
  fb.logits_begin = first;
  fb.hidden = true;
  const std::int64_t block_rows = std::clamp<std::int64_t>((std::int64_t{256} << 20) / (4 * V), 16, std::max<std::int64_t>(n_rows, 16));
  fb.attention = opt.baseline.empty() ? fo.attention
                                      : option_methods("baseline", opt.baseline, model.hparams().n_layer,
                                                       model.hparams().local_layers);
  KvCache cache = model.make_cache(n_ctx, opt.kv);
  // A baseline model of another form (an MLA model's GQA original) has a cache of its own
  // shape; a baseline of another cache type, one of its own type.
  KvCache base_cache;
  const bool own_base_cache = opt.baseline_model != nullptr || opt.kv != opt.baseline_kv;
  if (own_base_cache) base_cache = base_model.make_cache(n_ctx, opt.baseline_kv);

  PplResult r;
  r.attn_spec = attention_spec(fo.attention, model.hparams().local_layers);
  if (kl) r.baseline_spec = attention_spec(fb.attention, model.hparams().local_layers);
  r.ctx = n_ctx;
  r.chunks = n_chunk;
  r.has_baseline = kl;
  r.kv = opt.kv;
  r.baseline_kv = opt.baseline_kv;
  fo.profile = &r.profile;
  double nll_sum = 0;  // running, for the progress bar (the statistics: summarize_perplexity)
  std::vector<double> row_nll(static_cast<std::size_t>(n_rows)), row_kld(row_nll.size()),
      row_base_nll(row_nll.size());
  std::vector<std::uint8_t> row_agree(row_nll.size());
  ProgressBar bar("chunks", n_chunk, opt.progress ? ProgressBar::Mode::kAuto : ProgressBar::Mode::kOff);
  for (std::int64_t c = 0; c < n_chunk; ++c) {
    if (opt.cancel) opt.cancel->check([&] { return fmt::format("ppl: stopped after {} of {} chunks", c, n_chunk); });
    if (opt.run_chunk && !opt.run_chunk(c)) continue;
    std::vector<std::int32_t> chunk(tokens.begin() + c * n_ctx, tokens.begin() + (c + 1) * n_ctx);
    if (replace) chunk[0] = bos_id;
    // Which chunk a forward error (a non-finite logit) happened in: its position alone
    // does not say where in the text it is.
    auto run = [&](const LlamaModel& m, const ForwardOptions& o, const char* which, bool base) {
      KvCache& kv = base && own_base_cache ? base_cache : cache;
      kv.clear();
      try {
        return m.forward(chunk, kv, ctx, o);
      } catch (const Error& e) {
        throw Error(fmt::format("perplexity chunk {} of {} (text tokens {}..{}), {} pass: {}", c,
                                n_chunk, c * n_ctx, (c + 1) * n_ctx - 1, which, e.what()));
      }
    };
    const std::int64_t E = model.hparams().n_embd;
    auto t0 = std::chrono::steady_clock::now();
    const std::vector<float> hidden = run(model, fo, "evaluated", false);
    r.seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    std::vector<float> base_hidden;
    if (kl) base_hidden = run(base_model, fb, "baseline", true);
    for (std::int64_t b0 = 0; b0 < n_rows; b0 += block_rows) {
      const std::int64_t nb = std::min(block_rows, n_rows - b0);
      auto logits_of = [&](const LlamaModel& m, const std::vector<float>& h, const char* which) {
        try {
          return m.logits_from_hidden(h.data() + b0 * E, nb, ctx, first + b0);
        } catch (const Error& e) {
          throw Error(fmt::format("perplexity chunk {} of {} (text tokens {}..{}), {} pass: {}", c, n_chunk,
                                  c * n_ctx, (c + 1) * n_ctx - 1, which, e.what()));
        }
      };
      t0 = std::chrono::steady_clock::now();
      const std::vector<float> logits = logits_of(model, hidden, "evaluated");
      const double dt = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      r.seconds += dt;
      r.profile.output_gemm += dt;
      std::vector<float> base;
      if (kl) base = logits_of(base_model, base_hidden, "baseline");
      // Row j - first of the logits (position j) predicts token j + 1.
      parallel_for(ctx, nb, [&](std::int64_t bi) {
        const std::int64_t i = b0 + bi;
        std::vector<double> lp, lb;
        const std::int32_t target = chunk[static_cast<std::size_t>(first + i + 1)];
        log_softmax(logits.data() + bi * V, V, lp);
        row_nll[static_cast<std::size_t>(i)] = -lp[static_cast<std::size_t>(target)];
        if (!kl) return;
        log_softmax(base.data() + bi * V, V, lb);
        row_base_nll[static_cast<std::size_t>(i)] = -lb[static_cast<std::size_t>(target)];
        double d = 0;
        std::int64_t am = 0, bm = 0;
        for (std::int64_t v = 0; v < V; ++v) {
          const auto k = static_cast<std::size_t>(v);
          d += std::exp(lb[k]) * (lb[k] - lp[k]);
          if (lp[k] > lp[static_cast<std::size_t>(am)]) am = v;
          if (lb[k] > lb[static_cast<std::size_t>(bm)]) bm = v;
        }
        row_kld[static_cast<std::size_t>(i)] = std::max(d, 0.0);  // rounding can go below 0
        row_agree[static_cast<std::size_t>(i)] = am == bm;
      });
    }
    for (std::int64_t i = 0; i < n_rows; ++i) {
      const double v = row_nll[static_cast<std::size_t>(i)];
      nll_sum += v;
      r.nll.push_back(v);
      if (kl) {
        r.kld.push_back(row_kld[static_cast<std::size_t>(i)]);
        r.agree.push_back(row_agree[static_cast<std::size_t>(i)]);
        r.base_nll.push_back(row_base_nll[static_cast<std::size_t>(i)]);
      }
    }
    r.tokens_processed += n_ctx;
    if (opt.after_chunk) opt.after_chunk();
    if (bar.enabled()) {
      char status[96];
      std::snprintf(status, sizeof status, "ppl %.4f  %.0f tok/s",
                    std::exp(nll_sum / static_cast<double>(r.nll.size())),
                    static_cast<double>(r.tokens_processed) / r.seconds);
      bar.set(c + 1, status);
    }
  }
  bar.finish();
  summarize_perplexity(r);
  return r;
}

void summarize_perplexity(PplResult& r) {
  if (r.nll.empty()) return;  // a rank of a distributed run given no chunk
  double nll_sum = 0, nll2_sum = 0, base_nll_sum = 0;
  for (double v : r.nll) {
    nll_sum += v;
    nll2_sum += v * v;
  }
  const auto n = static_cast<double>(r.nll.size());
  r.tokens_scored = static_cast<std::int64_t>(r.nll.size());
  r.nll_mean = nll_sum / n;
  r.ppl = std::exp(r.nll_mean);
  const double var = nll2_sum / n - r.nll_mean * r.nll_mean;
  r.ppl_stderr = (var > 0 && n > 1) ? r.ppl * std::sqrt(var / (n - 1)) : 0.0;
  r.tokens_per_s = static_cast<double>(r.tokens_processed) / r.seconds;
  if (r.has_baseline) {
    NUMATTN_CHECK(r.kld.size() == r.nll.size() && r.agree.size() == r.nll.size() &&
                      r.base_nll.size() == r.nll.size(),
                  "summarize_perplexity: {} scored tokens but {} KL values", r.nll.size(), r.kld.size());
    double s = 0;
    std::int64_t agree = 0;
    for (std::size_t i = 0; i < r.kld.size(); ++i) {
      s += r.kld[i];
      agree += r.agree[i];
      base_nll_sum += r.base_nll[i];
    }
    r.kld_mean = s / n;
    std::vector<double> sorted = r.kld;
    std::sort(sorted.begin(), sorted.end());
    const double pos = 0.99 * (n - 1);
    const auto lo = static_cast<std::size_t>(std::floor(pos));
    const std::size_t hi = std::min(lo + 1, sorted.size() - 1);
    r.kld_p99 = sorted[lo] + (pos - static_cast<double>(lo)) * (sorted[hi] - sorted[lo]);
    r.top1_agreement = static_cast<double>(agree) / n;
    r.ppl_baseline = std::exp(base_nll_sum / n);
  }
}

}  // namespace numattn
