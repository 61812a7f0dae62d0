// numattn.BasisDecomposition: decomp/basis_decomposition.h for NumPy matrices.
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <algorithm>
#include <cstring>
#include <optional>

#include "common.h"
#include "numattn/decomp/basis_decomposition.h"

namespace numattn::py {

namespace {

using decomp::MatrixXd;

// `work_copies`: how many more matrices of this size the computation that follows makes (the
// basis selection factorises a working copy), reserved with the copy itself.
MatrixXd to_matrix(const AnyArray& a, const char* name, int work_copies = 0) {
  std::int64_t r = 0, c = 0;
  check_f64_matrix(a, name, r, c);
  reserve_array(fmt::format("{} as float64{}", name, work_copies ? " and its working copy" : ""), {r, c},
                sizeof(double), 1 + work_copies);
  MatrixXd m(r, c);  // row-major, as copy_f64_matrix writes
  copy_f64_matrix(a, m.data());
  return m;
}

// New NumPy arrays (copies: the matrices are small next to the work that made them), returned
// as objects so that properties do not apply their reference_internal policy to them.
nb::object to_numpy(const MatrixXd& m) {
  NpArray<double> a = new_array<double>({m.rows(), m.cols()}, "the result matrix");
  if (m.size() > 0) std::memcpy(a.data(), m.data(), static_cast<std::size_t>(m.size()) * sizeof(double));
  return nb::cast(a);
}

nb::object to_numpy(const std::vector<index_t>& v) {
  NpArray<std::int64_t> a = new_array<std::int64_t>({static_cast<std::int64_t>(v.size())});
  for (std::size_t i = 0; i < v.size(); ++i) a.data()[i] = v[i];
  return nb::cast(a);
}

// One matrix or a sequence of matrices (sharing one basis).
std::vector<MatrixXd> matrices(nb::handle w, const char* name) {
  std::vector<MatrixXd> out;
  AnyArray a;
  if (nb::try_cast(w, a, false)) {
    out.push_back(to_matrix(a, name, 1));
    return out;
  }
  if (!nb::isinstance<nb::sequence>(w) || nb::isinstance<nb::str>(w))
    throw nb::type_error(fmt::format("{}: expected a 2-d array or a list of 2-d arrays", name).c_str());
  std::size_t i = 0;
  for (nb::handle item : w) {
    AnyArray x;
    if (!nb::try_cast(item, x, false))
      throw nb::type_error(fmt::format("{}[{}]: expected a 2-d array", name, i).c_str());
    out.push_back(to_matrix(x, fmt::format("{}[{}]", name, i).c_str(), 1));
    ++i;
  }
  NUMATTN_CHECK(!out.empty(), "{}: the list of matrices is empty", name);
  return out;
}

class PyBd {
 public:
  PyBd(nb::handle w, std::optional<std::int64_t> rank, const std::string& strategy,
       const std::string& form, std::optional<double> tolerance,
       std::optional<std::vector<std::int64_t>> basis, std::optional<nb::handle> factor_v) {
    entry("numattn.BasisDecomposition", [&] {
      configure(rank, strategy, form, tolerance, basis, factor_v.has_value());
      std::vector<MatrixXd> ws = matrices(w, factor_v ? "U" : "W");
      if (basis) {
        // Indices of rows (row form) or columns (column form) of the matrices, each once.
        const bool rows = bd_.form() == decomp::BdForm::kRows;
        const std::int64_t limit = rows ? ws[0].rows() : ws[0].cols();
        std::vector<std::int64_t> sorted = *basis;
        std::sort(sorted.begin(), sorted.end());
        for (std::size_t i = 0; i < sorted.size(); ++i) {
          NUMATTN_CHECK_OPTION(sorted[i] >= 0 && sorted[i] < limit, "basis",
                               "index {} is not a {} index of the {}×{} matrix (0 to {})", sorted[i],
                               rows ? "row" : "column", ws[0].rows(), ws[0].cols(), limit - 1);
          NUMATTN_CHECK_OPTION(i == 0 || sorted[i] != sorted[i - 1], "basis", "index {} is given twice", sorted[i]);
        }
      }
      doing(fmt::format("decomposing {} matri{} of shape [{}, {}] ({} strategy)", ws.size(),
                              ws.size() == 1 ? "x" : "ces", ws[0].rows(), ws[0].cols(), strategy));
      if (factor_v) {
        std::vector<MatrixXd> vs = matrices(*factor_v, "V");
        NUMATTN_CHECK(vs.size() == ws.size(), "U and V: {} factors U but {} factors V", ws.size(), vs.size());
        nb::gil_scoped_release release;
        bd_.compute_lowrank(std::span<const MatrixXd>(ws), std::span<const MatrixXd>(vs));
      } else {
        nb::gil_scoped_release release;
        bd_.compute(std::span<const MatrixXd>(ws));
      }
      NUMATTN_CHECK(bd_.info() == decomp::ComputationInfo::kSuccess, "BasisDecomposition: {} ({})",
                    bd_.message(), decomp::to_string(bd_.info()));
    });
  }

  // Ŵ_k, m×n, and its NumPy copy.
  nb::object reconstruct(index_t k) const {
    return entry("BasisDecomposition.reconstruct", [&] {
      checked(k);
      doing(fmt::format("reconstructing W_{} {}", k, shape_str({bd_.rows(), bd_.cols()})));
      reserve_array(fmt::format("W_{} and its NumPy copy", k), {bd_.rows(), bd_.cols()}, sizeof(double), 2);
      return to_numpy(bd_.reconstruct(k));
    });
  }

  // x·W_k: x copied to float64 (t×m), the product (t×n) and its NumPy copy.
  nb::object apply(const AnyArray& x, index_t k) const {
    return entry("BasisDecomposition.apply", [&] {
      checked(k);
      MatrixXd xm = to_matrix(x, "x");
      doing(fmt::format("computing x·W_{} {}", k, shape_str({xm.rows(), bd_.cols()})));
      reserve_array(fmt::format("x·W_{} and its NumPy copy", k), {xm.rows(), bd_.cols()}, sizeof(double), 2);
      return to_numpy(bd_.apply(xm, k));
    });
  }

  const decomp::BasisDecomposition& bd() const { return bd_; }
  index_t checked(index_t k) const {
    NUMATTN_CHECK_OPTION(k >= 0 && k < bd_.matrices(), "k", "matrix index {} out of range [0, {})", k,
                         bd_.matrices());
    return k;
  }

 private:
  void configure(std::optional<std::int64_t> rank, const std::string& strategy,
                 const std::string& form, std::optional<double> tolerance,
                 const std::optional<std::vector<std::int64_t>>& basis, bool factored) {
    // Factored input W = U·V has rank U.cols() (compute_lowrank ignores a rank).
    NUMATTN_CHECK_OPTION(factored || rank || tolerance || basis, "rank",
                         "give rank=r, tolerance=t (numerical rank) or basis=[indices]");
    if (tolerance) bd_.set_tolerance(*tolerance);
    if (rank) {
      NUMATTN_CHECK_OPTION(*rank >= 1, "rank", "must be >= 1, got {}", *rank);
      bd_.set_rank(*rank);
    }
    bd_.set_form(decomp::parse_form(form));
    bd_.set_strategy(decomp::parse_strategy(strategy));
    if (basis) {
      bd_.set_basis(std::vector<index_t>(basis->begin(), basis->end()));
      if (!rank) bd_.set_rank(static_cast<index_t>(basis->size()));
    }
  }
  decomp::BasisDecomposition bd_;
};

}  // namespace

void bind_decomp(nb::module_& m) {
  nb::class_<PyBd>(m, "BasisDecomposition", R"doc(Basis Decomposition (BD) of a matrix of exact rank r,
or of several matrices that share one basis index set (J. Zhao, "Accelerating Attention with
Basis Decomposition", arXiv 2510.01718; docs/bd.md).

Row form (``form="rows"``), W in R^{m×n}: S = r row indices with W[S,:] independent, then
B = W[S,:] (r×n) and C = W[S^c,:]·B^+ ((m−r)×r), so W[S^c,:] = C·B exactly when rank W = r.
Column form (``form="cols"``): B = W[:,S] (m×r), C (r×(n−r)) with W[:,S^c] = B·C.
Everything is computed in float64 from pivoted factorisations (LAPACK); in floating point the
error is amplified by κ = cond(basis block), reported as ``cond``, and the basis rule
(``strategy``) keeps the worst κ small: "auto" (pivoted for one matrix, maxmin for several),
"first", "last", "residual_min", "pivoted" (column-pivoted QR), "maxmin".

Arguments: ``W`` a 2-d array or a list of them (float64 or float32, copied to float64);
``rank`` r ≥ 1, or ``tolerance`` (numerical rank from a pivoted QR), or ``basis`` (forced indices).
Cost: selection O(r·m·Σn), solves O(r²·(m+n)) per matrix. Raises numattn.Error for bad input or a
numerically singular basis (κ·eps ≥ 1).)doc")
      .def(nb::init<nb::handle, std::optional<std::int64_t>, const std::string&, const std::string&,
                    std::optional<double>, std::optional<std::vector<std::int64_t>>,
                    std::optional<nb::handle>>(),
           nb::arg("W"), nb::arg("rank") = nb::none(), nb::kw_only(), nb::arg("strategy") = "auto",
           nb::arg("form") = "rows", nb::arg("tolerance") = nb::none(), nb::arg("basis") = nb::none(),
           nb::arg("V") = nb::none(),
           "Decomposes W (or W_k = W[k]). With ``V=``, W is the left factor U of W = U·V (m×r and "
           "r×n; W is never formed and the rank is U's column count).")
      .def_prop_ro("rank", [](const PyBd& s) { return s.bd().rank(); }, "r")
      .def_prop_ro("shape", [](const PyBd& s) { return nb::make_tuple(s.bd().rows(), s.bd().cols()); },
                   "(m, n) of matrix 0")
      .def_prop_ro("matrices", [](const PyBd& s) { return s.bd().matrices(); }, "number of matrices sharing S")
      .def_prop_ro("form", [](const PyBd& s) { return std::string(decomp::to_string(s.bd().form())); })
      .def_prop_ro("strategy", [](const PyBd& s) { return std::string(decomp::to_string(s.bd().strategy_used())); },
                   "the basis rule actually used ('auto' resolved)")
      .def_prop_ro("basis", [](const PyBd& s) { return to_numpy(s.bd().basis()); },
                   "S, sorted ascending (row indices in row form, column indices in column form)")
      .def_prop_ro("complement", [](const PyBd& s) { return to_numpy(s.bd().complement()); }, "S^c, sorted ascending")
      .def_prop_ro("basis_block", [](const PyBd& s) { return to_numpy(s.bd().basis_block(0)); },
                   "B of matrix 0: r×n (rows) or m×r (cols); basis_block_of(k) for matrix k")
      .def_prop_ro("coefficients", [](const PyBd& s) { return to_numpy(s.bd().coefficients(0)); },
                   "C of matrix 0: (m−r)×r (rows) or r×(n−r) (cols); coefficients_of(k) for matrix k")
      .def("basis_block_of", [](const PyBd& s, index_t k) { return to_numpy(s.bd().basis_block(s.checked(k))); }, nb::arg("k"))
      .def("coefficients_of", [](const PyBd& s, index_t k) { return to_numpy(s.bd().coefficients(s.checked(k))); }, nb::arg("k"))
      .def_prop_ro("cond", [](const PyBd& s) { return s.bd().cond_basis_max(); },
                   "κ of the basis block, worst over the matrices (conds: per matrix)")
      .def_prop_ro("conds", [](const PyBd& s) {
        std::vector<double> c;
        for (index_t k = 0; k < s.bd().matrices(); ++k) c.push_back(s.bd().cond_basis(k));
        return c;
      })
      .def_prop_ro("residual", [](const PyBd& s) { return s.bd().residual_rel_max(); },
                   "‖W − Ŵ‖_F / ‖W‖_F in float64, worst over the matrices (residuals: per matrix)")
      .def_prop_ro("residuals", [](const PyBd& s) {
        std::vector<double> c;
        for (index_t k = 0; k < s.bd().matrices(); ++k) c.push_back(s.bd().residual_rel(k));
        return c;
      })
      .def_prop_ro("accounting", [](const PyBd& s) {
        const decomp::BdAccounting a = s.bd().accounting();
        nb::dict d;
        d["params_dense"] = a.params_dense, d["params_lowrank"] = a.params_lowrank, d["params_bd"] = a.params_bd;
        d["macs_dense"] = a.macs_dense, d["macs_lowrank"] = a.macs_lowrank, d["macs_bd"] = a.macs_bd;
        return d;
      }, "storage and multiply-accumulates per input row of matrix 0: dense m·n, low-rank r(m+n), BD r(m+n−r)")
      .def("reconstruct", &PyBd::reconstruct,
           nb::arg("k") = 0, "Ŵ_k = P·[I; C]·B (rows) or B·[I C]·P (cols), m×n; costs (m−r)·r·n MACs")
      .def("apply", &PyBd::apply, nb::arg("x"), nb::arg("k") = 0,
           "x·W_k through BD for x of shape (t, m): r(m+n−r) MACs per row instead of m·n")
      .def("__repr__", [](const PyBd& s) {
        return fmt::format("BasisDecomposition(shape=({}, {}), rank={}, form='{}', strategy='{}', cond={:.3g}, residual={:.3g})",
                           s.bd().rows(), s.bd().cols(), s.bd().rank(), decomp::to_string(s.bd().form()),
                           decomp::to_string(s.bd().strategy_used()), s.bd().cond_basis_max(), s.bd().residual_rel_max());
      });
}

}  // namespace numattn::py
