// numattn bd: Basis Decomposition of a matrix (or of several sharing one basis) from .npy files.
#include <algorithm>
#include <iostream>
#include <cmath>
#include <memory>
#include <optional>

#include "cli_common.h"
#include "commands.h"
#include "numattn/core/file_io.h"
#include "numattn/core/npy.h"
#include "numattn/decomp/basis_decomposition.h"

namespace numattn::cli {

namespace {

struct BdOptions {
  std::string in, u, v, out_prefix;
  long long rank = 0;
  std::optional<double> tol;
  std::string axis = "rows";
  std::string strategy = "auto";
  std::string format = "json";
  int threads = 0;
};

// A 2-d [m, n] array is one matrix; a 3-d [k, m, n] array is k matrices sharing the basis.
std::vector<decomp::MatrixXd> load_matrices(const std::string& path, const char* what) {
  npy::Array a = npy::read(path);
  NUMATTN_CHECK(a.shape.size() == 2 || a.shape.size() == 3,
                "--{}: expected a 2-d [m, n] or 3-d [k, m, n] array, got {} dims", what,
                a.shape.size());
  const index_t k = a.shape.size() == 3 ? a.shape[0] : 1;
  const index_t m = a.shape[a.shape.size() - 2], n = a.shape.back();
  const std::vector<double> v = a.as_f64();
  std::vector<decomp::MatrixXd> out;
  for (index_t i = 0; i < k; ++i)
    out.emplace_back(Eigen::Map<const decomp::MatrixXd>(v.data() + i * m * n, m, n));
  return out;
}

// Writes k matrices of one shape as [r, c] (k = 1) or [k, r, c].
void write_stack(const std::string& path, const std::vector<const decomp::MatrixXd*>& ms) {
  const index_t r = ms[0]->rows(), c = ms[0]->cols();
  std::vector<double> buf;
  buf.reserve(static_cast<std::size_t>(r * c) * ms.size());
  for (const auto* m : ms) {
    NUMATTN_CHECK(m->rows() == r && m->cols() == c,
                  "{}: the matrices' B/C blocks differ in shape; decompose them separately", path);
    buf.insert(buf.end(), m->data(), m->data() + m->size());
  }
  std::vector<std::int64_t> shape = ms.size() == 1
                                        ? std::vector<std::int64_t>{r, c}
                                        : std::vector<std::int64_t>{static_cast<std::int64_t>(ms.size()), r, c};
  npy::write(path, shape, buf.data());
}

}  // namespace

void add_bd(CLI::App& app) {
  auto o = std::make_shared<BdOptions>();
  auto* sub = app.add_subcommand(
      "bd", "Basis Decomposition W = P·[I; C]·B (rows) or B·[I C]·P (cols) of a .npy matrix, "
            "or of a [k, m, n] stack sharing one basis; writes basis, B and C");
  sub->add_option("--in", o->in, "W as .npy: [m, n], or [k, m, n] for k matrices sharing S");
  sub->add_option("--u", o->u, "low-rank form: U factor .npy ([m, r] or [k, m, r]); W = U·V is never formed");
  sub->add_option("--v", o->v, "low-rank form: V factor .npy ([r, n] or [k, r, n])");
  sub->add_option("--rank", o->rank, "basis size r (0 = from --tol)")->capture_default_str();
  sub->add_option("--tol", o->tol, "numerical rank: |R_ii| > tol·|R_00| of a pivoted QR");
  sub->add_option("--axis", o->axis, "rows (S = rows, W[S^c,:] = C·B) or cols (W[:,S^c] = B·C)")
      ->check(CLI::IsMember({"rows", "cols"}))
      ->capture_default_str();
  sub->add_option("--strategy", o->strategy,
                  "basis rule: auto (pivoted for one matrix, maxmin for several), first, last, "
                  "residual_min, pivoted, maxmin")
      ->capture_default_str();
  sub->add_option("--out-prefix", o->out_prefix,
                  "write PREFIX.basis.npy (int64), PREFIX.B.npy, PREFIX.C.npy (float64)");
  add_common(*sub, &o->threads, &o->format);
  sub->callback([o, sub] {
    NUMATTN_CHECK_OPTION(o->rank >= 0, "rank", "must be >= 0 (0 = from --tol), got {}", o->rank);
    NUMATTN_CHECK_OPTION(!o->tol || (std::isfinite(*o->tol) && *o->tol >= 0), "tol",
                         "must be a finite number >= 0, got {}", o->tol.value_or(0));
    // The prefix itself first (an empty one would write hidden files into the current directory).
    if (sub->count("--out-prefix"))
      check_output_option("--out-prefix", o->out_prefix, OutputKind::kFile);
    check_output_options(*sub,
                         {{"--out-prefix", o->out_prefix + ".basis.npy", OutputKind::kFile},
                          {"--out-prefix", o->out_prefix + ".B.npy", OutputKind::kFile},
                          {"--out-prefix", o->out_prefix + ".C.npy", OutputKind::kFile}},
                         {{"--in", o->in}, {"--u", o->u}, {"--v", o->v}});
    decomp::BasisDecomposition bd;
    bd.set_form(decomp::parse_form(o->axis)).set_strategy(decomp::parse_strategy(o->strategy));
    if (o->rank > 0)
      bd.set_rank(o->rank);
    else if (o->tol)
      bd.set_tolerance(*o->tol);
    const bool lowrank = !o->u.empty() || !o->v.empty();
    NUMATTN_CHECK(lowrank != !o->in.empty(), "give either --in W.npy or --u U.npy --v V.npy");
    std::vector<decomp::MatrixXd> us, vs, ws;
    if (lowrank) {
      NUMATTN_CHECK(!o->u.empty() && !o->v.empty(), "the low-rank form needs both --u and --v");
      us = load_matrices(o->u, "u");
      vs = load_matrices(o->v, "v");
      bd.compute_lowrank(us, vs);
    } else {
      NUMATTN_CHECK(o->rank > 0 || o->tol, "give --rank R or --tol T");
      ws = load_matrices(o->in, "in");
      bd.compute(ws);
    }
    NUMATTN_CHECK(bd.info() != decomp::ComputationInfo::kInvalidInput, "bd: {}", bd.message());
    if (bd.info() == decomp::ComputationInfo::kNumericalIssue)
      std::fprintf(stderr, "warning: %s\n", bd.message().c_str());

    const index_t k = bd.matrices(), r = bd.rank();
    if (!o->out_prefix.empty()) {
      const auto& s = bd.basis();
      npy::write(o->out_prefix + ".basis.npy", {static_cast<std::int64_t>(s.size())}, s.data());
      std::vector<const decomp::MatrixXd*> bs, cs;
      for (index_t i = 0; i < k; ++i) {
        bs.push_back(&bd.basis_block(i));
        cs.push_back(&bd.coefficients(i));
      }
      write_stack(o->out_prefix + ".B.npy", bs);
      write_stack(o->out_prefix + ".C.npy", cs);
    }
    decomp::BdAccounting acc;
    for (index_t i = 0; i < k; ++i) {
      const index_t m = lowrank ? us[static_cast<std::size_t>(i)].rows()
                                : ws[static_cast<std::size_t>(i)].rows();
      const index_t n = lowrank ? vs[static_cast<std::size_t>(i)].cols()
                                : ws[static_cast<std::size_t>(i)].cols();
      const auto a = decomp::bd_accounting(m, n, r);
      acc.params_dense += a.params_dense;
      acc.params_lowrank += a.params_lowrank;
      acc.params_bd += a.params_bd;
      acc.macs_dense += a.macs_dense;
      acc.macs_lowrank += a.macs_lowrank;
      acc.macs_bd += a.macs_bd;
    }
    Row row;
    row["m"] = bd.rows();
    row["n"] = bd.cols();
    row["matrices"] = k;
    row["rank"] = r;
    row["axis"] = o->axis;
    row["form"] = lowrank ? "lowrank" : "dense";
    row["strategy"] = decomp::to_string(bd.strategy_used());
    row["cond_basis"] = bd.cond_basis_max();
    row["residual_rel"] = bd.residual_rel_max();
    row["params_dense"] = acc.params_dense;
    row["params_lowrank"] = acc.params_lowrank;
    row["params_bd"] = acc.params_bd;
    row["macs_dense"] = acc.macs_dense;
    row["macs_bd"] = acc.macs_bd;
    row["info"] = decomp::to_string(bd.info());
    print_table(std::cout, {row}, parse_format(o->format), true);
  });
}

NUMATTN_COMMAND(60, add_bd);

}  // namespace numattn::cli
