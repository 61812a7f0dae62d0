#include "numattn/decomp/basis_decomposition.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>

#include "numattn/core/error.h"
#include "numattn/decomp/dense.h"

namespace numattn::decomp {

namespace {

using ColMatrix = Eigen::MatrixXd;  // column-major: LAPACK's layout
constexpr double kEps64 = std::numeric_limits<double>::epsilon();

std::vector<index_t> complement_of(const std::vector<index_t>& s, index_t m) {
  std::vector<char> in(static_cast<std::size_t>(m), 0);
  for (index_t i : s) in[static_cast<std::size_t>(i)] = 1;
  std::vector<index_t> c;
  c.reserve(static_cast<std::size_t>(m) - s.size());
  for (index_t i = 0; i < m; ++i)
    if (!in[static_cast<std::size_t>(i)]) c.push_back(i);
  return c;
}

MatrixXd take_rows(const MatrixXd& a, const std::vector<index_t>& idx) {
  MatrixXd out(static_cast<index_t>(idx.size()), a.cols());
  for (std::size_t i = 0; i < idx.size(); ++i) out.row(static_cast<index_t>(i)) = a.row(idx[i]);
  return out;
}

// B, C, κ and relative residual of every matrix for one row basis S.
struct Solved {
  std::vector<MatrixXd> b, c;
  std::vector<double> kappa, resid;
  double mean_resid() const {
    double s = 0;
    for (double r : resid) s += r;
    return resid.empty() ? 0 : s / static_cast<double>(resid.size());
  }
};

// C·B = W[S^c,:] for a basis block B (r×n), i.e. Bᵀ·Cᵀ = W[S^c,:]ᵀ (the transposes of the
// row-major blocks are column-major views, no copy). A square block is solved by LU with
// partial pivoting (LAPACK getrf; exact for unimodular integer blocks, whose C is integer); a
// wide one by least squares through column-pivoted Householder QR of Bᵀ (rank-revealing,
// stable). The QR's rank cut is ε·max|R_ii| (about Eigen's "nonzero pivots"): a block that
// singular is reported through κ anyway.
MatrixXd solve_right(const MatrixXd& b, const MatrixXd& rhs) {
  if (rhs.rows() == 0) return MatrixXd(0, b.rows());
  const dense::Solution sol = b.rows() == b.cols() ? dense::lu_solve(b.transpose(), rhs.transpose())
                                                   : dense::lstsq(b.transpose(), rhs.transpose(), kEps64);
  return sol.x.transpose();
}

Solved solve_dense_rows(std::span<const MatrixXd> ws, const std::vector<index_t>& s,
                        const std::vector<index_t>& sc) {
  Solved out;
  for (const MatrixXd& w : ws) {
    MatrixXd b = take_rows(w, s);
    MatrixXd rest = take_rows(w, sc);
    MatrixXd c = solve_right(b, rest);
    const double wn = w.norm();
    const double rn = sc.empty() ? 0.0 : (rest - c * b).norm();
    out.kappa.push_back(condition_number(b));
    out.resid.push_back(wn > 0 ? rn / wn : rn);
    out.b.push_back(std::move(b));
    out.c.push_back(std::move(c));
  }
  return out;
}

// W = U·V, row basis S: C = U[S^c,:]·U[S,:]^{-1}, B = U[S,:]·V; the residual
// ‖(U[S^c,:] − C·U[S,:])·V‖_F uses the r×r Gram matrix V·Vᵀ so W is never formed.
Solved solve_lowrank_rows(std::span<const MatrixXd> us, std::span<const MatrixXd> vs,
                          const std::vector<index_t>& s, const std::vector<index_t>& sc) {
  Solved out;
  for (std::size_t k = 0; k < us.size(); ++k) {
    const MatrixXd& u = us[k];
    const MatrixXd& v = vs[k];
    MatrixXd us_ = take_rows(u, s);
    MatrixXd rest = take_rows(u, sc);
    MatrixXd c = solve_right(us_, rest);
    const MatrixXd g = v * v.transpose();
    const MatrixXd e = rest - c * us_;
    const double en2 = std::max(0.0, (e * g).cwiseProduct(e).sum());
    const double wn2 = std::max(0.0, (u * g).cwiseProduct(u).sum());
    out.kappa.push_back(condition_number(us_));
    out.resid.push_back(wn2 > 0 ? std::sqrt(en2 / wn2) : std::sqrt(en2));
    out.b.push_back(us_ * v);
    out.c.push_back(std::move(c));
  }
  return out;
}

std::vector<index_t> first_rows(index_t m, index_t r) {
  std::vector<index_t> s(static_cast<std::size_t>(r));
  std::iota(s.begin(), s.end(), 0);
  return s;
}
std::vector<index_t> last_rows(index_t m, index_t r) {
  std::vector<index_t> s(static_cast<std::size_t>(r));
  std::iota(s.begin(), s.end(), m - r);
  return s;
}

std::vector<index_t> pivoted_rows(std::span<const MatrixXd> mats, index_t r) {
  const index_t m = mats[0].rows();
  index_t total = 0;
  for (const auto& a : mats) total += a.cols();
  // Columns of Aᵀ are the candidate rows; with several matrices the Frobenius-normalised
  // transposes are stacked so that no matrix dominates by scale alone.
  ColMatrix at(total, m);
  index_t off = 0;
  for (const auto& a : mats) {
    const double nrm = a.norm();
    at.middleRows(off, a.cols()) = a.transpose() / (nrm > 0 ? nrm : 1.0);
    off += a.cols();
  }
  const std::vector<std::int64_t> perm = dense::colpiv_qr(at).perm;
  return std::vector<index_t>(perm.begin(), perm.begin() + r);
}

// Multi-matrix greedy max-min pivoting: a column-pivoted QR whose pivot
// is the row whose *worst* (smallest) residual norm over the matrices is largest, so that no
// single matrix gets a nearly dependent basis row. Plain pivoted QR on the stacked matrices
// maximises a sum instead and can leave one matrix badly conditioned.
std::vector<index_t> maxmin_rows(std::span<const MatrixXd> mats, index_t r) {
  const index_t m = mats[0].rows();
  // Row-major residuals (rows contiguous) and squared row norms kept by downdating
  // (‖res_j‖² −= w_j² after removing direction q), recomputed every few steps and whenever a
  // downdate cancels badly, as LAPACK's pivoted QR does.
  std::vector<MatrixXd> res;
  std::vector<Eigen::VectorXd> norms, ref;
  res.reserve(mats.size());
  for (const auto& a : mats) {
    const double nrm = a.norm();
    res.emplace_back(a / (nrm > 0 ? nrm : 1.0));
    norms.emplace_back(res.back().rowwise().squaredNorm());
    ref.push_back(norms.back());
  }
  std::vector<char> taken(static_cast<std::size_t>(m), 0);
  std::vector<index_t> s;
  Eigen::VectorXd score(m);
  for (index_t step = 0; step < r; ++step) {
    score.setConstant(std::numeric_limits<double>::infinity());
    for (const auto& nk : norms) score = score.cwiseMin(nk);
    index_t best = -1;
    double best_v = -1;
    for (index_t j = 0; j < m; ++j) {
      if (taken[static_cast<std::size_t>(j)]) continue;
      if (score(j) > best_v) best_v = score(j), best = j;
    }
    NUMATTN_ASSERT(best >= 0);
    taken[static_cast<std::size_t>(best)] = 1;
    s.push_back(best);
    for (std::size_t k = 0; k < res.size(); ++k) {
      MatrixXd& rk = res[k];
      Eigen::RowVectorXd q = rk.row(best);
      const double qn = q.norm();
      if (qn > 0) {
        q /= qn;
        const Eigen::VectorXd w = rk * q.transpose();
        rk.noalias() -= w * q;
        norms[k] -= w.cwiseAbs2();
      }
      rk.row(best).setZero();
      norms[k](best) = 0;
      // Recompute when a norm fell below 1e-4 of its last exact value (cancellation) or
      // every 16 steps.
      bool recompute = step % 16 == 15;
      for (index_t j = 0; j < m && !recompute; ++j)
        if (!taken[static_cast<std::size_t>(j)] && norms[k](j) < 1e-4 * ref[k](j)) recompute = true;
      if (recompute) {
        norms[k] = rk.rowwise().squaredNorm();
        ref[k] = norms[k];
      }
    }
  }
  return s;
}

}  // namespace

const char* to_string(ComputationInfo i) {
  switch (i) {
    case ComputationInfo::kSuccess: return "success";
    case ComputationInfo::kNumericalIssue: return "numerical_issue";
    case ComputationInfo::kInvalidInput: return "invalid_input";
  }
  return "?";
}

BdForm parse_form(const std::string& s) {
  if (s == "rows" || s == "row") return BdForm::kRows;
  if (s == "cols" || s == "col" || s == "columns") return BdForm::kCols;
  throw Error(fmt::format("unknown BD form '{}': use rows or cols", s));
}
const char* to_string(BdForm f) { return f == BdForm::kRows ? "rows" : "cols"; }

BasisStrategy parse_strategy(const std::string& s) {
  if (s == "auto" || s == "automatic") return BasisStrategy::kAutomatic;
  if (s == "first") return BasisStrategy::kFirst;
  if (s == "last") return BasisStrategy::kLast;
  if (s == "residual_min" || s == "residual-min") return BasisStrategy::kResidualMin;
  if (s == "pivoted") return BasisStrategy::kPivoted;
  if (s == "maxmin" || s == "max-min") return BasisStrategy::kMaxMin;
  throw Error(fmt::format(
      "unknown basis strategy '{}': use auto, first, last, residual_min, pivoted or maxmin", s));
}
const char* to_string(BasisStrategy s) {
  switch (s) {
    case BasisStrategy::kAutomatic: return "auto";
    case BasisStrategy::kFirst: return "first";
    case BasisStrategy::kLast: return "last";
    case BasisStrategy::kResidualMin: return "residual_min";
    case BasisStrategy::kPivoted: return "pivoted";
    case BasisStrategy::kMaxMin: return "maxmin";
  }
  return "?";
}

BdAccounting bd_accounting(std::int64_t m, std::int64_t n, std::int64_t r) {
  BdAccounting a;
  a.params_dense = a.macs_dense = m * n;
  a.params_lowrank = a.macs_lowrank = r * (m + n);
  a.params_bd = a.macs_bd = r * (m + n - r);
  return a;
}

double condition_number(const MatrixXd& a) {
  return dense::condition_number(a);
}

std::vector<index_t> select_rows(std::span<const MatrixXd> mats, index_t r, BasisStrategy s) {
  NUMATTN_CHECK(!mats.empty(), "basis selection needs at least one matrix");
  const index_t m = mats[0].rows();
  for (const auto& a : mats)
    NUMATTN_CHECK(a.rows() == m, "matrices sharing a basis must have the same number of rows "
                                 "in row form (got {} and {})", m, a.rows());
  NUMATTN_CHECK(r >= 1 && r <= m, "basis size r={} must be in [1, {}]", r, m);
  if (s == BasisStrategy::kAutomatic)
    s = mats.size() == 1 ? BasisStrategy::kPivoted : BasisStrategy::kMaxMin;
  std::vector<index_t> out;
  switch (s) {
    case BasisStrategy::kFirst: out = first_rows(m, r); break;
    case BasisStrategy::kLast: out = last_rows(m, r); break;
    case BasisStrategy::kPivoted: out = pivoted_rows(mats, r); break;
    case BasisStrategy::kMaxMin: out = maxmin_rows(mats, r); break;
    case BasisStrategy::kResidualMin: {
      // The paper's rule (J. Zhao, arXiv 2510.01718, and its official code): the better of
      // first-r and last-r by mean relative residual over the matrices; a tie goes to first-r.
      auto f = first_rows(m, r), l = last_rows(m, r);
      const double rf = solve_dense_rows(mats, f, complement_of(f, m)).mean_resid();
      const double rl = solve_dense_rows(mats, l, complement_of(l, m)).mean_resid();
      out = rl < rf ? l : f;
      break;
    }
    case BasisStrategy::kAutomatic: break;
  }
  std::sort(out.begin(), out.end());
  return out;
}

// ---------------------------------------------------------------------------------------------

BasisDecomposition& BasisDecomposition::set_rank(index_t r) {
  rank_req_ = r;
  tol_ = -1;
  return *this;
}
BasisDecomposition& BasisDecomposition::set_tolerance(double tol) {
  NUMATTN_CHECK(std::isfinite(tol) && tol >= 0, "BasisDecomposition: tolerance {} must be a finite number >= 0", tol);
  tol_ = tol;
  rank_req_ = 0;
  return *this;
}
BasisDecomposition& BasisDecomposition::set_form(BdForm f) {
  form_ = f;
  return *this;
}
BasisDecomposition& BasisDecomposition::set_strategy(BasisStrategy s) {
  strategy_ = s;
  return *this;
}
BasisDecomposition& BasisDecomposition::set_basis(std::vector<index_t> s) {
  forced_ = std::move(s);
  return *this;
}

void BasisDecomposition::reset() {
  info_ = ComputationInfo::kInvalidInput;
  message_.clear();
  computed_ = false;
  used_ = strategy_;
  m_ = n_ = r_ = 0;
  s_.clear();
  sc_.clear();
  b_.clear();
  c_.clear();
  kappa_.clear();
  resid_.clear();
  mk_.clear();
  nk_.clear();
}

void BasisDecomposition::fail(ComputationInfo i, std::string msg) {
  info_ = i;
  message_ = std::move(msg);
}

void BasisDecomposition::check_computed() const {
  NUMATTN_CHECK(computed_, "BasisDecomposition: no result ({}): {}", to_string(info_), message_);
}

BasisDecomposition& BasisDecomposition::compute(const MatrixXd& w) {
  return compute(std::span<const MatrixXd>(&w, 1));
}

BasisDecomposition& BasisDecomposition::compute(std::span<const MatrixXd> ws) {
  reset();
  if (ws.empty()) return fail(ComputationInfo::kInvalidInput, "no matrix given"), *this;
  for (const auto& w : ws) {
    if (w.size() == 0) return fail(ComputationInfo::kInvalidInput, "empty matrix"), *this;
    if (!w.allFinite())
      return fail(ComputationInfo::kInvalidInput, "matrix has NaN or Inf entries"), *this;
  }
  if (form_ == BdForm::kRows) {
    run_rows(ws, {}, false);
  } else {
    std::vector<MatrixXd> t;
    for (const auto& w : ws) t.emplace_back(w.transpose());
    run_rows(t, {}, true);
  }
  return *this;
}

BasisDecomposition& BasisDecomposition::compute_lowrank(const MatrixXd& u, const MatrixXd& v) {
  return compute_lowrank(std::span<const MatrixXd>(&u, 1), std::span<const MatrixXd>(&v, 1));
}

BasisDecomposition& BasisDecomposition::compute_lowrank(std::span<const MatrixXd> us,
                                                        std::span<const MatrixXd> vs) {
  reset();
  if (us.empty() || us.size() != vs.size())
    return fail(ComputationInfo::kInvalidInput, "need as many U factors as V factors (>= 1)"),
           *this;
  for (std::size_t k = 0; k < us.size(); ++k) {
    if (us[k].cols() != vs[k].rows() || us[k].cols() == 0)
      return fail(ComputationInfo::kInvalidInput,
                  fmt::format("factor {}: U is {}x{} and V is {}x{}; need U m×r, V r×n, r >= 1",
                              k, us[k].rows(), us[k].cols(), vs[k].rows(), vs[k].cols())),
             *this;
    if (!us[k].allFinite() || !vs[k].allFinite())
      return fail(ComputationInfo::kInvalidInput, "factor has NaN or Inf entries"), *this;
  }
  if (form_ == BdForm::kRows) {
    run_rows(us, vs, false);
  } else {
    // Wᵀ = Vᵀ·Uᵀ: the column form of W is the row form of Wᵀ with factors (Vᵀ, Uᵀ).
    std::vector<MatrixXd> ut, vt;
    for (std::size_t k = 0; k < us.size(); ++k) {
      ut.emplace_back(vs[k].transpose());
      vt.emplace_back(us[k].transpose());
    }
    run_rows(ut, vt, true);
  }
  return *this;
}

void BasisDecomposition::run_rows(std::span<const MatrixXd> as, std::span<const MatrixXd> vs,
                                  bool transposed) {
  const bool lowrank = !vs.empty();
  const index_t m = as[0].rows();
  const index_t n = lowrank ? vs[0].cols() : as[0].cols();
  for (std::size_t k = 0; k < as.size(); ++k) {
    if (as[k].rows() != m)
      return fail(ComputationInfo::kInvalidInput,
                  fmt::format("matrices sharing a basis need the same {} count: {} vs {}",
                              transposed ? "column" : "row", m, as[k].rows()));
  }

  // Rank: explicit, the factors' inner dimension, or the numerical rank at tolerance.
  index_t r = rank_req_;
  if (lowrank) {
    if (r > 0 && r != as[0].cols())
      return fail(ComputationInfo::kInvalidInput,
                  fmt::format("rank {} differs from the factors' inner dimension {}", r,
                              as[0].cols()));
    r = as[0].cols();
    for (const auto& a : as)
      if (a.cols() != r)
        return fail(ComputationInfo::kInvalidInput, "factors must share the inner dimension");
  } else if (r <= 0) {
    if (tol_ < 0)
      return fail(ComputationInfo::kInvalidInput, "set a rank (set_rank) or a tolerance");
    r = 0;
    for (const auto& a : as) {
      r = std::max<index_t>(r, dense::colpiv_qr(a, tol_).rank);
    }
    if (r == 0) return fail(ComputationInfo::kInvalidInput, "numerical rank is 0 at this tolerance");
  }
  if (r > m)
    return fail(ComputationInfo::kInvalidInput,
                fmt::format("rank {} exceeds the {} {} of the matrix", r, m,
                            transposed ? "columns" : "rows"));
  if (!lowrank)
    for (const auto& a : as)
      if (r > a.cols())
        return fail(ComputationInfo::kInvalidInput,
                    fmt::format("rank {} exceeds min(m, n) = {}", r, std::min(m, a.cols())));

  // Basis.
  std::vector<index_t> s;
  if (!forced_.empty()) {
    s = forced_;
    std::sort(s.begin(), s.end());
    if (static_cast<index_t>(s.size()) != r ||
        std::adjacent_find(s.begin(), s.end()) != s.end() || s.front() < 0 || s.back() >= m)
      return fail(ComputationInfo::kInvalidInput,
                  fmt::format("forced basis must be {} distinct indices in [0, {})", r, m));
    used_ = strategy_;
  } else {
    used_ = strategy_ == BasisStrategy::kAutomatic
                ? (as.size() == 1 ? BasisStrategy::kPivoted : BasisStrategy::kMaxMin)
                : strategy_;
    if (used_ == BasisStrategy::kResidualMin && lowrank) {
      // Residual of W itself (through the factors), as the dense rule does.
      auto f = first_rows(m, r), l = last_rows(m, r);
      const double rf = solve_lowrank_rows(as, vs, f, complement_of(f, m)).mean_resid();
      const double rl = solve_lowrank_rows(as, vs, l, complement_of(l, m)).mean_resid();
      s = rl < rf ? l : f;
    } else {
      // Selection runs on the side whose r×r (or r×n) block is inverted: U for factors.
      s = select_rows(as, r, used_);
    }
  }
  std::vector<index_t> sc = complement_of(s, m);
  Solved sol = lowrank ? solve_lowrank_rows(as, vs, s, sc) : solve_dense_rows(as, s, sc);

  m_ = transposed ? n : m;
  n_ = transposed ? m : n;
  for (std::size_t k = 0; k < as.size(); ++k) {
    const index_t nk = lowrank ? vs[k].cols() : as[k].cols();
    mk_.push_back(transposed ? nk : m);
    nk_.push_back(transposed ? m : nk);
  }
  r_ = r;
  s_ = std::move(s);
  sc_ = std::move(sc);
  for (std::size_t k = 0; k < sol.b.size(); ++k) {
    if (transposed) {
      b_.emplace_back(sol.b[k].transpose());
      c_.emplace_back(sol.c[k].transpose());
    } else {
      b_.push_back(std::move(sol.b[k]));
      c_.push_back(std::move(sol.c[k]));
    }
  }
  kappa_ = std::move(sol.kappa);
  resid_ = std::move(sol.resid);
  computed_ = true;
  info_ = ComputationInfo::kSuccess;
  for (std::size_t k = 0; k < kappa_.size(); ++k) {
    if (!std::isfinite(kappa_[k]) || kappa_[k] * kEps64 >= 1.0 || !c_[k].allFinite()) {
      fail(ComputationInfo::kNumericalIssue,
           fmt::format("basis block of matrix {} is numerically singular (cond = {:.3g}); "
                       "use strategy pivoted/maxmin or a smaller rank", k, kappa_[k]));
      break;
    }
  }
}

const std::vector<index_t>& BasisDecomposition::basis() const {
  check_computed();
  return s_;
}
const std::vector<index_t>& BasisDecomposition::complement() const {
  check_computed();
  return sc_;
}
const MatrixXd& BasisDecomposition::basis_block(index_t k) const {
  check_computed();
  NUMATTN_CHECK(k >= 0 && k < matrices(), "matrix index {} out of range [0, {})", k, matrices());
  return b_[static_cast<std::size_t>(k)];
}
const MatrixXd& BasisDecomposition::coefficients(index_t k) const {
  check_computed();
  NUMATTN_CHECK(k >= 0 && k < matrices(), "matrix index {} out of range [0, {})", k, matrices());
  return c_[static_cast<std::size_t>(k)];
}
double BasisDecomposition::cond_basis(index_t k) const {
  check_computed();
  NUMATTN_CHECK(k >= 0 && k < matrices(), "matrix index {} out of range [0, {})", k, matrices());
  return kappa_[static_cast<std::size_t>(k)];
}
double BasisDecomposition::cond_basis_max() const {
  check_computed();
  return *std::max_element(kappa_.begin(), kappa_.end());
}
double BasisDecomposition::residual_rel(index_t k) const {
  check_computed();
  NUMATTN_CHECK(k >= 0 && k < matrices(), "matrix index {} out of range [0, {})", k, matrices());
  return resid_[static_cast<std::size_t>(k)];
}
double BasisDecomposition::residual_rel_max() const {
  check_computed();
  return *std::max_element(resid_.begin(), resid_.end());
}

MatrixXd BasisDecomposition::reconstruct(index_t k) const {
  const MatrixXd& b = basis_block(k);
  const MatrixXd& c = coefficients(k);
  MatrixXd w(mk_[static_cast<std::size_t>(k)], nk_[static_cast<std::size_t>(k)]);
  if (form_ == BdForm::kRows) {
    const MatrixXd rest = c * b;
    for (std::size_t i = 0; i < s_.size(); ++i) w.row(s_[i]) = b.row(static_cast<index_t>(i));
    for (std::size_t i = 0; i < sc_.size(); ++i) w.row(sc_[i]) = rest.row(static_cast<index_t>(i));
  } else {
    const MatrixXd rest = b * c;
    for (std::size_t i = 0; i < s_.size(); ++i) w.col(s_[i]) = b.col(static_cast<index_t>(i));
    for (std::size_t i = 0; i < sc_.size(); ++i) w.col(sc_[i]) = rest.col(static_cast<index_t>(i));
  }
  return w;
}

MatrixXd BasisDecomposition::apply(const MatrixXd& x, index_t k) const {
  const MatrixXd& b = basis_block(k);
  const MatrixXd& c = coefficients(k);
  const index_t m = mk_[static_cast<std::size_t>(k)], n = nk_[static_cast<std::size_t>(k)];
  NUMATTN_CHECK(x.cols() == m, "apply: x has {} columns, the matrix has {} rows", x.cols(), m);
  if (form_ == BdForm::kRows) {
    // y = (x[:,S] + x[:,S^c]·C)·B
    MatrixXd xs(x.rows(), r_), xc(x.rows(), m - r_);
    for (std::size_t i = 0; i < s_.size(); ++i) xs.col(static_cast<index_t>(i)) = x.col(s_[i]);
    for (std::size_t i = 0; i < sc_.size(); ++i) xc.col(static_cast<index_t>(i)) = x.col(sc_[i]);
    if (xc.cols() > 0) xs.noalias() += xc * c;
    return xs * b;
  }
  // z = x·B; y[:,S] = z; y[:,S^c] = z·C
  const MatrixXd z = x * b;
  const MatrixXd zc = z * c;
  MatrixXd y(x.rows(), n);
  for (std::size_t i = 0; i < s_.size(); ++i) y.col(s_[i]) = z.col(static_cast<index_t>(i));
  for (std::size_t i = 0; i < sc_.size(); ++i) y.col(sc_[i]) = zc.col(static_cast<index_t>(i));
  return y;
}

}  // namespace numattn::decomp
