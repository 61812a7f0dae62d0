#include "dist_cli.h"

#include <sys/resource.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <fstream>

#include "cli_common.h"
#include "numattn/attention/reference.h"
#include "numattn/core/file_io.h"
#include "numattn/core/npy.h"
#include "numattn/dist/comm.h"
#include "numattn/dist/context_parallel.h"

namespace numattn::cli {

namespace {

/// Peak resident set of this process (bytes).
double peak_rss_bytes() {
  rusage ru{};
  getrusage(RUSAGE_SELF, &ru);
  return static_cast<double>(ru.ru_maxrss) * 1024.0;  // Linux reports KiB
}

/// A rank's shard read from .npy files: only its rows are read (seek + read per segment).
class FileShard {
 public:
  FileShard(const DistFiles& f, int rank, int ranks, dist::Partition part) {
    auto open = [&](const std::string& path, const char* what, std::array<index_t, 4>& s) {
      const npy::Info info = npy::read_info(path);
      NUMATTN_CHECK(info.shape.size() >= 2 && info.shape.size() <= 4,
                    "--{}: expected a 2-, 3- or 4-d array ([N,D], [H,N,D] or [B,H,N,D]), got {} dims",
                    what, info.shape.size());
      NUMATTN_CHECK(info.dtype != npy::DType::kInt64, "--{}: '{}' holds int64; q, k and v must be float", what, path);
      std::array<index_t, 4> a{1, 1, 1, 1};
      std::copy(info.shape.begin(), info.shape.end(), a.begin() + static_cast<std::ptrdiff_t>(4 - info.shape.size()));
      // Files in BNHD order hold [B, N, H, D].
      s = f.layout == Layout::kBHND ? a : std::array<index_t, 4>{a[0], a[2], a[1], a[3]};
      return info;
    };
    std::array<index_t, 4> qs{}, ks{}, vs{};
    const npy::Info qi = open(f.q, "q", qs), ki = open(f.k, "k", ks), vi = open(f.v, "v", vs);
    NUMATTN_CHECK(ks[0] == qs[0] && vs[0] == qs[0] && ks[1] == vs[1] && ks[2] == vs[2] && ks[3] == qs[3],
                  "--q/--k/--v shapes do not fit: q [{},{},{},{}], k [{},{},{},{}], v [{},{},{},{}] (as BHND)",
                  qs[0], qs[1], qs[2], qs[3], ks[0], ks[1], ks[2], ks[3], vs[0], vs[1], vs[2], vs[3]);
    sp_.n_q = qs[2];
    sp_.n_kv = ks[2];
    sp_.partition = part;
    sp_.q_rows = dist::shard_segments(qs[2], ranks, rank, part);
    sp_.kv_rows = dist::shard_segments(ks[2], ranks, rank, part);
    const index_t nq = dist::rows_of(sp_.q_rows);
    AttentionProblem& p = sp_.local;
    p.q = read(f.q, qi, qs, sp_.q_rows, f.layout, q_);
    if (f.logit_scale != 1.0)
      for (float& x : q_) x = static_cast<float>(x * f.logit_scale);
    p.k = read(f.k, ki, ks, sp_.kv_rows, f.layout, k_);
    p.v = read(f.v, vi, vs, sp_.kv_rows, f.layout, v_);
    out_.assign(static_cast<std::size_t>(qs[0] * qs[1] * nq * vs[3]), 0.f);
    lse_.assign(static_cast<std::size_t>(qs[0] * qs[1] * nq), 0.f);
    p.out = TensorView<float>::contiguous(out_.data(), {qs[0], qs[1], nq, vs[3]});
    p.lse = TensorView<float>::contiguous(lse_.data(), {qs[0], qs[1], nq, 1});
    p.causal = f.causal;
    p.scale = f.scale;
    p.window_left = f.window_left;
    p.window_right = f.window_right;
  }
  dist::ShardedProblem& sharded() { return sp_; }
  std::size_t bytes() const { return 4 * (q_.size() + k_.size() + v_.size() + out_.size() + lse_.size()); }

 private:
  /// Rows `segs` of a [B, H, N, D] tensor (shape `s`, as BHND) stored in `layout`.
  static TensorView<const float> read(const std::string& path, const npy::Info& info, std::array<index_t, 4> s,
                                      const std::vector<dist::Segment>& segs, Layout layout,
                                      std::vector<float>& buf) {
    const index_t B = s[0], H = s[1], N = s[2], D = s[3], n = dist::rows_of(segs);
    const std::size_t elem = info.dtype == npy::DType::kFloat32 ? 4 : 8;
    buf.resize(static_cast<std::size_t>(B * H * n * D));
    auto dst = TensorView<float>::contiguous(buf.data(), {B, H, n, D});
    const InputFile in(path, ".npy file", kSizedByHeader);
    std::vector<char> raw;
    // One read per contiguous run: (b, h, segment) in BHND, (b, segment) in BNHD.
    auto run = [&](index_t first_elem, index_t count, auto&& place) {
      raw.resize(static_cast<std::size_t>(count) * elem);
      in.read_at(raw.data(), raw.size(),
                 info.data_offset + static_cast<std::uint64_t>(first_elem) * elem);
      for (index_t e = 0; e < count; ++e) {
        float x;
        if (elem == 4) {
          std::memcpy(&x, raw.data() + e * 4, 4);
        } else {
          double y;
          std::memcpy(&y, raw.data() + e * 8, 8);
          x = static_cast<float>(y);
        }
        place(e, x);
      }
    };
    index_t r0 = 0;
    for (const dist::Segment& g : segs) {
      for (index_t b = 0; b < B; ++b) {
        if (layout == Layout::kBHND) {
          for (index_t h = 0; h < H; ++h)
            run(((b * H + h) * N + g.begin) * D, g.size() * D,
                [&](index_t e, float x) { dst(b, h, r0 + e / D, e % D) = x; });
        } else {
          run((b * N + g.begin) * H * D, g.size() * H * D,
              [&](index_t e, float x) { dst(b, e / D % H, r0 + e / (H * D), e % D) = x; });
        }
      }
      r0 += g.size();
    }
    return dst;
  }

  dist::ShardedProblem sp_;
  std::vector<float> q_, k_, v_, out_, lse_;
};

/// Rank 0 receives every rank's rows of `t` ([B, H, n_local, D]) into a global [B, H, N, D]
/// buffer (returned on rank 0, empty elsewhere).
std::vector<float> gather_rows(dist::Comm& comm, const dist::ShardedProblem& sp, TensorView<const float> t) {
  const int R = comm.size();
  const index_t B = t.shape[0], H = t.shape[1], D = t.shape[3], n_local = t.shape[2];
  std::vector<float> mine(static_cast<std::size_t>(B * H * n_local * D));
  for (index_t b = 0; b < B; ++b)
    for (index_t h = 0; h < H; ++h)
      for (index_t i = 0; i < n_local; ++i)
        std::copy_n(t.row(b, h, i), D, mine.data() + ((b * H + h) * n_local + i) * D);
  std::vector<std::size_t> bytes(static_cast<std::size_t>(R)), displs(bytes.size());
  std::size_t total = 0;
  for (int r = 0; r < R; ++r) {
    const index_t n = dist::rows_of(dist::shard_segments(sp.n_q, R, r, sp.partition));
    bytes[static_cast<std::size_t>(r)] = sizeof(float) * static_cast<std::size_t>(B * H * n * D);
    displs[static_cast<std::size_t>(r)] = total;
    total += bytes[static_cast<std::size_t>(r)];
  }
  std::vector<float> all(comm.rank() == 0 ? total / sizeof(float) : 0);
  comm.gatherv(mine.data(), sizeof(float) * mine.size(), all.data(), bytes, displs, 0);
  if (comm.rank() != 0) return {};
  std::vector<float> full(static_cast<std::size_t>(B * H * sp.n_q * D));
  for (int r = 0; r < R; ++r) {
    const auto segs = dist::shard_segments(sp.n_q, R, r, sp.partition);
    const index_t n = dist::rows_of(segs);
    const float* src = all.data() + displs[static_cast<std::size_t>(r)] / sizeof(float);
    for (index_t b = 0; b < B; ++b)
      for (index_t h = 0; h < H; ++h) {
        index_t local = 0;
        for (const dist::Segment& g : segs)
          for (index_t i = g.begin; i < g.end; ++i, ++local)
            std::copy_n(src + ((b * H + h) * n + local) * D, D, full.data() + ((b * H + h) * sp.n_q + i) * D);
      }
  }
  return full;
}

}  // namespace

bool distributed_launch() { return dist::launched_by_mpi(); }

int dist_rank() { return dist::launched_by_mpi() ? dist::world().rank() : 0; }

void check_dist_method(const AttentionMethod& m) {
  if (m.info().family != "dist")
    throw OptionError("method", fmt::format("under mpirun only dist.* methods run (dist.ring, dist.ulysses); "
                                            "'{}' is a single-process method: run it without mpirun",
                                            m.spec()));
}

Row run_distributed(const AttentionMethod& m, const ProblemConfig& cfg, const DistFiles* files,
                    const ExecContext& ctx, int reps, long long check_rows, const std::string& out,
                    const std::string& lse_out) {
  check_dist_method(m);
  dist::Comm& comm = dist::world();
  const int R = comm.size(), me = comm.rank();
  const bool ring = m.info().name == "dist.ring";
  const dist::Partition part =
      ring ? dist::parse_partition(m.params().get_string("partition")) : dist::Partition::kContiguous;
  std::unique_ptr<dist::RandomShard> rs;
  std::unique_ptr<FileShard> fs;
  dist::ShardedProblem* sp = nullptr;
  std::size_t shard_bytes = 0;
  // Local work first, agreed on: a shard that cannot be read, or holds a non-finite value, ends
  // every rank with that rank's message before anyone communicates.
  dist::agree_on(comm, [&] {
    if (files) {
      fs = std::make_unique<FileShard>(*files, me, R, part);
      sp = &fs->sharded();
      shard_bytes = fs->bytes();
    } else {
      rs = std::make_unique<dist::RandomShard>(cfg, me, R, part);
      sp = &rs->sharded();
      shard_bytes = rs->bytes();
    }
    if (!cfg.want_lse) sp->local.lse = {};
    sp->validate(me, R);
    dist::check_shard_finite(*sp);
    const Status s = m.can_run(sp->global_shape());
    NUMATTN_CHECK(s.is_ok(), "{} cannot run this problem: {}", m.spec(), s.reason());
  });
  const AttentionProblem g = sp->global_shape();
  Row row;
  dist::collective_section(comm, [&] {
    std::vector<double> times;
    double wait = 0, total = 0, sent = 0;
    for (int r = 0; r < std::max(1, reps) + (reps > 1 ? 1 : 0); ++r) {  // one warm-up when timing several
      comm.barrier();
      dist::DistStats st;
      if (ring) dist::ring_attention(comm, *sp, ctx, &st);
      else dist::ulysses_attention(comm, *sp, ctx, &st);
      double t = st.total_s;
      comm.allreduce(&t, 1, dist::ReduceOp::kMax);  // the job takes as long as its slowest rank
      if (reps > 1 && r == 0) continue;
      times.push_back(t);
      wait += st.wait_s;
      total += st.total_s;
      sent = st.bytes_sent;
    }
    const double ms = median(times) * 1e3;
    const index_t k = rows_to_check(g, check_rows);
    const dist::DistCheck chk = dist::check_sharded(comm, *sp, k, cfg.seed ^ 0x9e3779b97f4a7c15ull, ctx);
    double maxes[5] = {wait / std::max(total, 1e-30), wait / std::max(1, static_cast<int>(times.size())) * 1e3,
                       sent, static_cast<double>(shard_bytes), peak_rss_bytes()};
    double wait_mean = maxes[0];
    comm.allreduce(maxes, 5, dist::ReduceOp::kMax);
    comm.allreduce(&wait_mean, 1, dist::ReduceOp::kSum);
    row = problem_row(m, g, ctx, files ? Row() : Row(cfg.seed),
                      files ? "files " + files->q + " " + files->k + " " + files->v : random_source(cfg));
    row["ranks"] = R;
    row["partition"] = dist::to_string(part);
    row["time_ms"] = ms;
    row["gflops"] = attention_flops(g) / (ms * 1e-3) * 1e-9;
    row["target"] = "softmax";
    row["rows_checked"] = chk.rows_checked;
    for (const char* c : {"target_rel_fro_error", "rel_fro_error", "max_abs_error", "lse_max_abs_error", "nmse"})
      row[c] = nullptr;
    if (chk.rows_checked > 0) {
      row["target_rel_fro_error"] = chk.rel_fro_error;
      row["rel_fro_error"] = chk.rel_fro_error;
      row["max_abs_error"] = chk.max_abs_error;
      if (!sp->local.lse.empty()) row["lse_max_abs_error"] = chk.lse_max_abs_error;
      row["nmse"] = chk.nmse;
    }
    row["wait_fraction"] = maxes[0];
    row["wait_fraction_mean"] = wait_mean / R;
    row["wait_ms"] = maxes[1];
    row["bytes_sent_per_rank"] = maxes[2];
    row["shard_bytes"] = maxes[3];
    row["peak_rss_bytes"] = maxes[4];
    row["status"] = chk.rows_checked == 0 || chk.passed
                        ? std::string("ok")
                        : fmt::format("failed: the float64 check of {} rows is beyond the exact float32 "
                                      "tolerance (rel_fro_error {:.3g}, L = {:.3g}){}",
                                      chk.rows_checked, chk.rel_fro_error, chk.logit_magnitude,
                                      chk.finite ? "" : "; the output has NaN or Inf");
    if (!out.empty()) {
      auto full = gather_rows(comm, *sp, sp->local.out);
      if (me == 0) npy::write(out, {g.batch(), g.heads(), g.n_q(), g.d_v()}, full.data());
    }
    if (!lse_out.empty()) {
      auto full = gather_rows(comm, *sp, sp->local.lse);
      if (me == 0) npy::write(lse_out, {g.batch(), g.heads(), g.n_q()}, full.data());
    }
  });
  return row;
}

}  // namespace numattn::cli
