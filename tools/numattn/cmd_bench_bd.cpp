// numattn bench-bd: the fused BD projection kernel against the dense projection X·W, timed in
// the same run, alternating, medians.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <iostream>
#include <limits>
#include <memory>

#include "cli_common.h"
#include "commands.h"
#include "numattn/core/blas.h"
#include "numattn/core/rng.h"
#include "numattn/transform/bd_projection_builder.h"

namespace numattn::cli {

namespace {

struct BenchBdOptions {
  std::string d = "512", head_dim = "128", heads = "0", tokens = "8192";
  int threads = 0;
  std::string format = "md";
  int reps = 9;
  std::uint64_t seed = 0;
  long long block_rows = 0;
  std::string order = "permuted";
  std::string strategy = "auto";
  long long gemm_size = 1024;
};

double ms_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace

void add_bench_bd(CLI::App& app) {
  auto o = std::make_shared<BenchBdOptions>();
  auto* sub = app.add_subcommand(
      "bench-bd",
      "time the fused BD projection X[:,S^c]·C_stack + broadcast(X[:,S]) against dense X·W "
      "(same run, alternating, medians); rows = product of the lists");
  sub->add_option("--d", o->d, "input dimension d (comma-separated list)")->capture_default_str();
  sub->add_option("--head-dim", o->head_dim, "head dimension dh = basis size (list)")
      ->capture_default_str();
  sub->add_option("--heads", o->heads, "heads H (list; 0 = d / head_dim, i.e. MHA)")
      ->capture_default_str();
  sub->add_option("--tokens", o->tokens, "tokens n (list)")->capture_default_str();
  add_common(*sub, &o->threads, &o->format);
  sub->add_option("--reps", o->reps, "timed repetitions of each kernel (median)")
      ->check(CLI::Range(1, 1000000))
      ->capture_default_str();
  sub->add_option("--seed", o->seed, "seed of the random weights and inputs")->capture_default_str();
  sub->add_option("--block-rows", o->block_rows,
                  "token rows per parallel block (0 = tokens / threads)")
      ->capture_default_str();
  sub->add_option("--order", o->order,
                  "input channel order given to the BD kernel: permuted (offline permutation, "
                  "the default) or original (the kernel gathers)")
      ->check(CLI::IsMember({"permuted", "original"}))
      ->capture_default_str();
  sub->add_option("--strategy", o->strategy, "basis strategy (auto = maxmin for several heads)")
      ->capture_default_str();
  sub->add_option("--gemm-size", o->gemm_size, "size of the same-run sgemm baseline")
      ->capture_default_str();
  sub->callback([o] {
    ExecContext ctx{o->threads};
    const auto strategy = decomp::parse_strategy(o->strategy);
    const auto order = o->order == "original" ? transform::InputOrder::kOriginal
                                              : transform::InputOrder::kPermuted;
    const double sgemm = blas::measure_sgemm_gflops(o->gemm_size, 3, ctx.num_threads());
    std::vector<Row> rows;
    for (const auto& ds : split_list(o->d))
      for (const auto& dhs : split_list(o->head_dim))
        for (const auto& hs : split_list(o->heads)) {
          const index_t d = std::stoll(ds), dh = std::stoll(dhs);
          index_t h = std::stoll(hs);
          NUMATTN_CHECK(d >= 1 && dh >= 1 && dh < d, "need 1 <= head_dim < d (got d={}, head_dim={})",
                        d, dh);
          if (h <= 0) h = d / dh;
          NUMATTN_CHECK(h >= 1, "heads must be >= 1");
          const index_t out = h * dh;
          // Random N(0, 1/d) weights, BD built in float64 (no fallback: timing the BD path).
          std::vector<double> w64(static_cast<std::size_t>(d * out));
          fill_normal(w64, o->seed, 1);
          for (auto& v : w64) v /= std::sqrt(static_cast<double>(d));
          decomp::MatrixXd w = Eigen::Map<decomp::MatrixXd>(w64.data(), d, out);
          std::vector<float> w32(w64.begin(), w64.end());
          std::vector<transform::BdHeadReport> rep;
          std::vector<decomp::MatrixXd> blocks;
          std::fprintf(stderr, "bench-bd: BD of %lld x %lld (%lld heads) ...\n",
                       static_cast<long long>(d), static_cast<long long>(out),
                       static_cast<long long>(h));
          auto bd = transform::build_bd_projection(
              d, h, dh, w, {}, strategy, std::numeric_limits<double>::infinity(), &rep, &blocks);
          auto dense = transform::BdProjection::dense(d, h, dh, w32);
          bd.set_block_rows(o->block_rows);
          dense.set_block_rows(o->block_rows);
          double kmax = 0;
          for (const auto& r : rep) kmax = std::max(kmax, r.kappa);

          for (const auto& ts : split_list(o->tokens)) {
            const index_t n = std::stoll(ts);
            NUMATTN_CHECK(n >= 1, "tokens must be >= 1");
            std::vector<float> x(static_cast<std::size_t>(n * d)), xp(x.size());
            fill_normal(x, o->seed, 2);
            const auto& perm = bd.permutation();
            for (index_t t = 0; t < n; ++t)
              for (index_t k = 0; k < d; ++k)
                xp[static_cast<std::size_t>(t * d + k)] =
                    x[static_cast<std::size_t>(t * d + perm[static_cast<std::size_t>(k)])];
            const float* xbd = order == transform::InputOrder::kPermuted ? xp.data() : x.data();
            std::vector<float> yd(static_cast<std::size_t>(n * out)), yb(yd.size());
            auto run_dense = [&] {
              dense.project(x.data(), n, d, yd.data(), out, transform::InputOrder::kOriginal, ctx);
            };
            auto run_bd = [&] { bd.project(xbd, n, d, yb.data(), out, order, ctx); };
            run_dense();
            run_bd();
            std::vector<double> td, tb;
            for (int r = 0; r < std::max(1, o->reps); ++r) {
              // Alternate which kernel goes first so drift on a shared machine hits both.
              for (int k = 0; k < 2; ++k) {
                const bool dense_now = (k == 0) == (r % 2 == 0);
                auto t0 = std::chrono::steady_clock::now();
                if (dense_now) run_dense(); else run_bd();
                (dense_now ? td : tb).push_back(ms_since(t0));
              }
            }
            // Check: Y'_h = Y_h·T_h, i.e. Y'_h·W_h[S,:] = Y_h, on a few rows in float64.
            double num = 0, den = 0;
            for (index_t t = 0; t < std::min<index_t>(n, 8); ++t)
              for (index_t hh = 0; hh < h; ++hh) {
                Eigen::RowVectorXd yp(dh), yref(dh);
                for (index_t j = 0; j < dh; ++j) {
                  yp(j) = yb[static_cast<std::size_t>(t * out + hh * dh + j)];
                  double acc = 0;
                  for (index_t k = 0; k < d; ++k)
                    acc += static_cast<double>(x[static_cast<std::size_t>(t * d + k)]) *
                           w(k, hh * dh + j);
                  yref(j) = acc;
                }
                const Eigen::RowVectorXd back = yp * blocks[static_cast<std::size_t>(hh)];
                num += (back - yref).squaredNorm();
                den += yref.squaredNorm();
              }
            const double dms = median(td), bms = median(tb);
            // Paired ratios: each rep times both kernels back to back, so a slow phase of a
            // shared machine hits both; their median is less noisy than a ratio of medians.
            std::vector<double> ratios;
            for (std::size_t i = 0; i < td.size(); ++i) ratios.push_back(td[i] / tb[i]);
            const double flops = 2.0 * static_cast<double>(n) * d * out;
            Row row;
            row["d"] = d;
            row["head_dim"] = dh;
            row["heads"] = h;
            row["tokens"] = n;
            row["threads"] = ctx.num_threads();
            row["dense_ms"] = dms;
            row["bd_ms"] = bms;
            row["speedup"] = dms / bms;
            row["theory"] = static_cast<double>(d) / static_cast<double>(d - dh);
            row["speedup_paired"] = median(ratios);
            row["speedup_best"] = *std::min_element(td.begin(), td.end()) /
                                  *std::min_element(tb.begin(), tb.end());
            row["dense_gflops"] = flops / (dms * 1e-3) * 1e-9;
            row["dense_efficiency"] = flops / (dms * 1e-3) * 1e-9 / sgemm;
            row["sgemm_gflops"] = sgemm;
            row["kappa_max"] = kmax;
            row["check_rel_err"] = den > 0 ? std::sqrt(num / den) : 0.0;
            row["order"] = o->order;
            row["reps"] = o->reps;
            rows.push_back(row);
          }
        }
    print_table(std::cout, rows, parse_format(o->format));
  });
}

NUMATTN_COMMAND(61, add_bench_bd);

}  // namespace numattn::cli
