#include "numattn/model/transform_model.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <limits>

#include "numattn/core/error.h"
#include "numattn/core/file_io.h"
#include "numattn/core/progress.h"
#include "numattn/model/data.h"
#include "numattn/model/mla_model.h"
#include "numattn/model/ppl.h"

namespace numattn {

void check_transforms(const transform::TransformPipeline& p, const ModelHParams& hp, bool file_is_mla) {
  if (p.mla) {
    const transform::MlaStage& m = *p.mla;
    NUMATTN_CHECK_OPTION(!file_is_mla, "transform", "mla: the model is already an MLA model (numattn-mla)");
    NUMATTN_CHECK_OPTION(hp.attention_extras().empty(), "transform",
                         "mla: MLA conversion (TransMLA) applies to Llama-form attention; this model's has {} "
                         "(a per-head norm of k after its projection cannot be applied to a shared latent)",
                         hp.attention_extras());
    NUMATTN_CHECK_OPTION(m.options.rope_heads <= hp.n_head_kv, "transform",
                         "mla: rope_heads={} exceeds the model's {} KV heads ({})", m.options.rope_heads,
                         hp.n_head_kv, hp.key(hparam_key::kHeadsKv));
    NUMATTN_CHECK_OPTION(m.options.rope_dims <= hp.n_head_kv * hp.n_rot, "transform",
                         "mla: rope_dims={} exceeds the model's {} RoPE dims (KV heads × n_rot = {} × {})",
                         m.options.rope_dims, hp.n_head_kv * hp.n_rot, hp.n_head_kv, hp.n_rot);
    NUMATTN_CHECK_OPTION(hp.n_rot >= 2 && (hp.n_rot / 2) % m.options.freqfold == 0, "transform",
                         "mla: freqfold={} does not divide the model's {} RoPE frequencies (n_rot/2)",
                         m.options.freqfold, hp.n_rot / 2);
    parse_mla_calib_mode(m.calib_mode);
  }
  if (p.tensor) {
    try {
      check_tensor_spec(*p.tensor, hp, p.mla.has_value() || file_is_mla);
    } catch (const OptionError& e) {
      throw OptionError("transform", e.detail());
    }
  }
}

std::vector<transform::MlaOptions> mla_budget_candidates(const ModelHParams& hp, double budget) {
  NUMATTN_CHECK_OPTION(budget > 0 && budget <= 1, "budget", "must be in (0, 1], a fraction of the GQA cache, got {}",
                       budget);
  const std::int64_t Hkv = hp.n_head_kv, D = hp.head_dim, n_rot = hp.n_rot, pairs = n_rot / 2;
  const auto cache = static_cast<std::int64_t>(std::llround(budget * static_cast<double>(2 * Hkv * D)));
  std::vector<std::int64_t> dims;
  for (std::int64_t d = n_rot / 4; d < n_rot; d *= 2)
    if (d >= 2 && d % 2 == 0) dims.push_back(d);
  for (std::int64_t h = 1; h <= Hkv; ++h) dims.push_back(h * n_rot);
  std::vector<transform::MlaOptions> out;
  for (std::int64_t d : dims) {
    const std::int64_t full = Hkv * D - d + Hkv * D, rank = cache - d;
    if (rank < 1 || rank > full) continue;  // beyond the full width the cache would not be used
    for (int m = 1; m <= std::min<std::int64_t>(pairs, kMaxBudgetFreqfold); m *= 2) {
      if (pairs % m != 0) break;
      if (d == Hkv * n_rot && m > 1) break;  // every dim kept: the frequencies are exact at any M
      transform::MlaOptions o;
      o.rank = rank;
      o.rope_dims = d;
      o.freqfold = m;
      out.push_back(o);
    }
  }
  NUMATTN_CHECK_OPTION(!out.empty(), "budget",
                       "{} is {} numbers per token and layer, too few for a latent of rank >= 1 beside {} RoPE dims",
                       budget, cache, dims.front());
  return out;
}

namespace {

/// The balance multiplier b of the latent's PCA (transform/mla.h step 4) with the lowest
/// perplexity on the calibration tokens, among 1, √2, 2, 2√2 (1 when nothing is truncated).
double choose_balance(const LlamaModel& model, const Tokenizer& tok, const std::vector<std::int32_t>& toks,
                      const std::vector<transform::MlaCalibration>& cal, const transform::MlaOptions& opt,
                      MlaExec exec, const ExecContext& ctx, MlaStageResult& r) {
  const ModelHParams& hp = model.hparams();
  const std::int64_t d_rope = transform::mla_rope_dims(hp, opt);
  const std::int64_t full = 2 * hp.n_head_kv * hp.head_dim - d_rope;
  if (opt.rank == 0 || opt.rank >= full) return 1;
  // Scored on the statistics at hand (two-pass, or one-pass for calib_mode sequential, whose
  // own statistics would cost a pass per layer and candidate); the choice then converts as
  // calib_mode says.
  PplOptions po;
  po.ctx = std::min<std::int64_t>(kMlaCalibChunk, static_cast<std::int64_t>(toks.size()) / 2);
  NUMATTN_CHECK_OPTION(po.ctx >= 4, "balance", "balance=0 scores candidates on the calibration tokens: {} are "
                       "too few (calib_tokens >= 8), or give balance=b", toks.size());
  double best = std::numeric_limits<double>::infinity(), pick = 1;
  for (const double b : {1.0, std::sqrt(2.0), 2.0, 2 * std::sqrt(2.0)}) {
    transform::MlaOptions c = opt;
    c.balance = b;
    LlamaModel m = model;
    convert_model_to_mla(m, cal, c, ctx);
    m.set_mla_exec(exec);
    const double ppl = evaluate_perplexity(m, toks, tok.bos_id(), tok.add_bos(), po, ctx).ppl;
    r.balance_candidates.push_back({b, ppl});
    fmt::print(stderr, "mla balance {:.4f}: calibration ppl {:.4f}\n", b, ppl);
    if (ppl < best) best = ppl, pick = b;
  }
  fmt::print(stderr, "mla balance: chose {:.4f}\n", pick);
  return pick;
}

}  // namespace

MlaStageResult apply_mla_stage(LlamaModel& model, const Tokenizer& tok, const transform::MlaStage& s,
                               const ExecContext& ctx, bool progress) {
  NUMATTN_CHECK_OPTION(!model.has_mla(), "transform", "mla: the model is already an MLA model");
  MlaStageResult r;
  const std::string text = read_file(resolve_text_path(s.calib), "mla calib file", kTextInput);
  auto toks = tok.encode(text, false, false);
  NUMATTN_CHECK_OPTION(!toks.empty(), "transform", "mla: the calibration text {} encodes to no token", s.calib);
  const auto n = std::min<std::int64_t>(s.calib_tokens, static_cast<std::int64_t>(toks.size()));
  toks.erase(toks.begin(), toks.end() - n);
  const auto mode = progress ? ProgressBar::Mode::kAuto : ProgressBar::Mode::kOff;
  const MlaCalibMode calib_mode = parse_mla_calib_mode(s.calib_mode);
  const auto t0 = std::chrono::steady_clock::now();
  std::vector<transform::MlaCalibration> cal;
  if (calib_mode != MlaCalibMode::kSequential || s.budget > 0 || s.options.balance == 0) {
    ProgressBar bar("mla calibration", (n + kMlaCalibChunk - 1) / kMlaCalibChunk, mode);
    cal = calibrate_mla(model, toks, kMlaCalibChunk, ctx, [&](std::int64_t done, std::int64_t) { bar.set(done); });
  }
  r.calib_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  r.calib_tokens = n;
  // The source W_q of each layer (in place: bytes in the mapped file that the model keeps), which
  // the quantized MLA query reads through its factored form.
  const MlaWeights storage = parse_mla_weights(s.weights);
  const MlaExec exec = parse_mla_exec(s.exec);
  std::vector<QuantMatrix> source_wq;
  const ModelHParams& hp = model.hparams();
  for (const LlamaLayer& L : model.weights().layers)
    source_wq.push_back(L.wqkv_q.empty() ? QuantMatrix{} : L.wqkv_q.first_rows(hp.n_head * hp.head_dim));
  transform::MlaOptions opt = s.options;
  // balance 0 is chosen last, for the options converted; until then every conversion uses 1.
  const bool search_balance = opt.balance == 0;
  if (search_balance) opt.balance = 1;
  if (s.budget > 0) {
    // Candidates scored by perplexity on the calibration tokens only, each converted with the
    // one-pass statistics (one forward pass shared by all, where a sequential calibration per
    // candidate would cost L/2 passes each); the choice is then converted as calib_mode says.
    PplOptions po;
    po.ctx = std::min<std::int64_t>(kMlaCalibChunk, n / 2);
    NUMATTN_CHECK_OPTION(po.ctx >= 4, "budget", "the search scores candidates on the calibration tokens: {} are "
                         "too few (calib_tokens >= 8)", n);
    const std::vector<transform::MlaOptions> cands = mla_budget_candidates(model.hparams(), s.budget);
    double best = std::numeric_limits<double>::infinity();
    for (const transform::MlaOptions& c : cands) {
      LlamaModel m = model;
      convert_model_to_mla(m, cal, c, ctx);
      m.set_mla_exec(exec);
      const double ppl = evaluate_perplexity(m, toks, tok.bos_id(), tok.add_bos(), po, ctx).ppl;
      r.candidates.push_back({c, ppl});
      fmt::print(stderr, "mla budget {}: rank={} rope_dims={} freqfold={}: calibration ppl {:.4f}\n", s.budget,
                 c.rank, c.rope_dims, c.freqfold, ppl);
      if (ppl < best) {
        best = ppl;
        opt = c;
      }
    }
    fmt::print(stderr, "mla budget {}: chose rank={} rope_dims={} freqfold={}\n", s.budget, opt.rank,
               opt.rope_dims, opt.freqfold);
    opt.balance = search_balance ? 1 : s.options.balance;  // the candidates were scored at 1
  }
  if (calib_mode == MlaCalibMode::kTwoPass && opt.rank != 0) {
    const auto t1 = std::chrono::steady_clock::now();
    add_latent_statistics(model, cal, toks, kMlaCalibChunk, opt, ctx);
    r.calib_s += std::chrono::duration<double>(std::chrono::steady_clock::now() - t1).count();
  }
  if (search_balance) opt.balance = choose_balance(model, tok, toks, cal, opt, exec, ctx, r);
  ProgressBar bar("mla conversion", model.hparams().n_layer, mode);
  auto on_layer = [&](std::int64_t done, std::int64_t) { bar.set(done, "layers"); };
  r.report = calib_mode == MlaCalibMode::kSequential
                 ? convert_model_to_mla_sequential(model, toks, kMlaCalibChunk, opt, ctx, on_layer)
                 : convert_model_to_mla(model, cal, opt, ctx, on_layer);
  quantize_mla_model(model, source_wq, storage);
  model.set_mla_exec(exec);
  return r;
}

TransformReport apply_transforms(LlamaModel& model, const Tokenizer& tok, const transform::TransformPipeline& p,
                                 const ExecContext& ctx, bool progress) {
  check_transforms(p, model.hparams(), model.has_mla());
  TransformReport r;
  if (p.mla) r.mla = apply_mla_stage(model, tok, *p.mla, ctx, progress);
  if (p.bda) r.bda = apply_bda(model, p.bda->pairs, {}, parse_bda_coef(p.bda->coef));
  if (p.tensor) {
    TensorModelReport rep;
    model = compress_model_tensor(model, *p.tensor, ctx, &rep);
    r.tensor = rep;
  }
  return r;
}

}  // namespace numattn
