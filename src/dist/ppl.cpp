#include "numattn/dist/ppl.h"

#include <algorithm>

#include "numattn/attention/registry.h"
#include "numattn/model/llama.h"

namespace numattn::dist {

namespace {

/// Whether a method of the per-layer spec list `specs` (model/llama.h) is collective across
/// ranks. Nested specs need no look: auto.causal refuses such an inner method itself.
bool communicates(const std::string& specs) {
  if (specs.empty()) return false;  // no baseline
  for (const std::string& item : split_spec_list(specs))
    if (const MethodInfo* info = find_method(parse_spec(item).name); info && info->caps.communicates)
      return true;
  return false;
}

}  // namespace

PplResult evaluate_perplexity(Comm& comm, const LlamaModel& model, const std::vector<std::int32_t>& tokens,
                              std::int32_t bos_id, bool add_bos, const PplOptions& opt, const ExecContext& ctx) {
  const int R = comm.size(), me = comm.rank();
  // Every rank checks the same options on the same inputs, so a bad option fails on all alike.
  for (const std::string* spec : {&opt.attn, &opt.baseline})
    if (communicates(*spec))
      throw OptionError(spec == &opt.attn ? "attn" : "baseline",
                        "dist.* attention cannot run inside a distributed ppl (each rank evaluates "
                        "other chunks); use exact.flash, or run ppl without mpirun");
  PplOptions mine = opt;
  mine.run_chunk = [&](std::int64_t c) { return c % R == me && (!opt.run_chunk || opt.run_chunk(c)); };
  if (me != 0) mine.progress = false;
  PplResult r;
  std::string err;
  try {
    r = numattn::evaluate_perplexity(model, tokens, bos_id, add_bos, mine, ctx);
  } catch (const std::exception& e) {
    err = e.what();
  }
  agree(comm, err);  // a failing chunk (non-finite logit) ends every rank with its message

  // Per-token values of this rank, chunk by chunk: nll, then kld, base_nll, agree as doubles.
  const std::int64_t rows = r.ctx - 1 - r.ctx / 2;  // scored positions per chunk
  const int cols = r.has_baseline ? 4 : 1;
  const std::size_t mine_n = r.nll.size();
  std::vector<double> send(mine_n * static_cast<std::size_t>(cols));
  for (std::size_t i = 0; i < mine_n; ++i) {
    double* x = send.data() + i * static_cast<std::size_t>(cols);
    x[0] = r.nll[i];
    if (cols > 1) x[1] = r.kld[i], x[2] = r.base_nll[i], x[3] = r.agree[i];
  }
  std::vector<std::size_t> bytes(static_cast<std::size_t>(R)), displs(bytes.size());
  std::size_t total = 0;
  for (int q = 0; q < R; ++q) {
    std::int64_t chunks = 0;
    for (std::int64_t c = q; c < r.chunks; c += R)
      if (!opt.run_chunk || opt.run_chunk(c)) ++chunks;
    bytes[static_cast<std::size_t>(q)] = sizeof(double) * static_cast<std::size_t>(chunks * rows * cols);
    displs[static_cast<std::size_t>(q)] = total;
    total += bytes[static_cast<std::size_t>(q)];
  }
  NUMATTN_ASSERT(bytes[static_cast<std::size_t>(me)] == sizeof(double) * send.size());
  std::vector<double> all(me == 0 ? total / sizeof(double) : 0);
  comm.gatherv(send.data(), sizeof(double) * send.size(), all.data(), bytes, displs, 0);
  double sums[2] = {static_cast<double>(r.tokens_processed), 0};
  double secs = r.seconds;
  comm.allreduce(sums, 1, ReduceOp::kSum);
  comm.allreduce(&secs, 1, ReduceOp::kMax);

  PplResult out = r;
  out.tokens_processed = static_cast<std::int64_t>(sums[0]);
  out.seconds = secs;
  out.nll.clear();
  out.kld.clear();
  out.base_nll.clear();
  out.agree.clear();
  if (me == 0) {
    // Chunk order: chunk c is rank c mod R's (c / R)-th chunk.
    std::vector<std::size_t> next(static_cast<std::size_t>(R));
    for (int q = 0; q < R; ++q) next[static_cast<std::size_t>(q)] = displs[static_cast<std::size_t>(q)] / sizeof(double);
    for (std::int64_t c = 0; c < r.chunks; ++c) {
      if (opt.run_chunk && !opt.run_chunk(c)) continue;
      std::size_t& at = next[static_cast<std::size_t>(c % R)];
      for (std::int64_t i = 0; i < rows; ++i, at += static_cast<std::size_t>(cols)) {
        out.nll.push_back(all[at]);
        if (cols > 1) {
          out.kld.push_back(all[at + 1]);
          out.base_nll.push_back(all[at + 2]);
          out.agree.push_back(static_cast<std::uint8_t>(all[at + 3]));
        }
      }
    }
    summarize_perplexity(out);
  }
  // The statistics on every rank (the callers may print or check them anywhere).
  double stats[9] = {static_cast<double>(out.tokens_scored), out.nll_mean, out.ppl, out.ppl_stderr,
                     out.kld_mean, out.kld_p99, out.top1_agreement, out.ppl_baseline, out.tokens_per_s};
  comm.broadcast(stats, sizeof stats, 0);
  out.tokens_scored = static_cast<std::int64_t>(stats[0]);
  out.nll_mean = stats[1], out.ppl = stats[2], out.ppl_stderr = stats[3], out.kld_mean = stats[4];
  out.kld_p99 = stats[5], out.top1_agreement = stats[6], out.ppl_baseline = stats[7], out.tokens_per_s = stats[8];
  return out;
}

}  // namespace numattn::dist
