// Basis Decomposition: losslessness in float64, the bit-exact integer construction
// W_k = [L; D·L], selection rules on a near-singular first-r block, error reporting.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "numattn/core/error.h"
#include "numattn/core/rng.h"
#include "numattn/decomp/basis_decomposition.h"
#include "numattn/decomp/cp.h"
#include "numattn/decomp/tucker.h"
#include "support/test_util.h"

namespace numattn::decomp {
namespace {
namespace NUMATTN_UNITY_ID {

MatrixXd randn(index_t rows, index_t cols, std::uint64_t seed, std::uint64_t stream) {
  std::vector<double> v(static_cast<std::size_t>(rows * cols));
  fill_normal(v, seed, stream);
  return Eigen::Map<MatrixXd>(v.data(), rows, cols);
}

double rel(const MatrixXd& a, const MatrixXd& b) { return (a - b).norm() / b.norm(); }

const BasisStrategy kAll[] = {BasisStrategy::kFirst, BasisStrategy::kLast,
                              BasisStrategy::kResidualMin, BasisStrategy::kPivoted,
                              BasisStrategy::kMaxMin, BasisStrategy::kAutomatic};

// Checks reconstruct, residual and apply of every matrix against the dense W_k.
void expect_lossless(const BasisDecomposition& bd, const std::vector<MatrixXd>& ws,
                     const std::string& what) {
  ASSERT_EQ(bd.info(), ComputationInfo::kSuccess) << what << ": " << bd.message();
  for (std::size_t k = 0; k < ws.size(); ++k) {
    const index_t kk = static_cast<index_t>(k);
    EXPECT_LE(rel(bd.reconstruct(kk), ws[k]), 1e-12) << what << " matrix " << k;
    EXPECT_LE(bd.residual_rel(kk), 1e-12) << what << " matrix " << k;
    const MatrixXd x = randn(5, ws[k].rows(), 9, 9);
    EXPECT_LE(rel(bd.apply(x, kk), x * ws[k]), 1e-12) << what << " apply, matrix " << k;
    EXPECT_TRUE(std::isfinite(bd.cond_basis(kk)));
  }
}

TEST(BasisDecomposition, LosslessInFloat64AllStrategiesAndForms) {
  const std::uint64_t seed = test::base_seed();
  const index_t r = 6;
  for (BdForm form : {BdForm::kRows, BdForm::kCols}) {
    for (BasisStrategy s : kAll) {
      // Three matrices of rank r sharing m rows (row form) or n columns (column form).
      std::vector<MatrixXd> us, vs, ws;
      for (int k = 0; k < 3; ++k) {
        const index_t m = form == BdForm::kRows ? 40 : 31 + 3 * k;
        const index_t n = form == BdForm::kRows ? 29 + 2 * k : 40;
        us.push_back(randn(m, r, seed, 10 + k));
        vs.push_back(randn(r, n, seed, 20 + k));
        ws.push_back(us.back() * vs.back());
      }
      const std::string tag = std::string(to_string(form)) + "/" + to_string(s);
      BasisDecomposition one, many, lr_one, lr_many, tol;
      one.set_rank(r).set_form(form).set_strategy(s).compute(ws[0]);
      expect_lossless(one, {ws[0]}, tag + " dense single");
      many.set_rank(r).set_form(form).set_strategy(s).compute(ws);
      expect_lossless(many, ws, tag + " dense shared");
      lr_one.set_form(form).set_strategy(s).compute_lowrank(us[0], vs[0]);
      expect_lossless(lr_one, {ws[0]}, tag + " low-rank single");
      lr_many.set_form(form).set_strategy(s).compute_lowrank(us, vs);
      expect_lossless(lr_many, ws, tag + " low-rank shared");
      tol.set_tolerance(1e-10).set_form(form).set_strategy(s).compute(ws);
      EXPECT_EQ(tol.rank(), r) << tag;
      expect_lossless(tol, ws, tag + " rank from tolerance");
      // Shapes of B and C.
      if (form == BdForm::kRows) {
        EXPECT_EQ(one.basis_block().rows(), r);
        EXPECT_EQ(one.coefficients().rows(), one.rows() - r);
        EXPECT_EQ(one.coefficients().cols(), r);
      } else {
        EXPECT_EQ(one.basis_block().cols(), r);
        EXPECT_EQ(one.coefficients().rows(), r);
        EXPECT_EQ(one.coefficients().cols(), one.cols() - r);
      }
      EXPECT_EQ(static_cast<index_t>(one.basis().size()), r);
      EXPECT_EQ(static_cast<index_t>(one.complement().size()),
                (form == BdForm::kRows ? one.rows() : one.cols()) - r);
    }
  }
}

// Tolerances out of their domain are refused where they are set, by every decomposition that
// takes one (NaN used to mean "no tolerance" to callers that tested tol >= 0).
TEST(BasisDecomposition, NonFiniteOrNegativeTolerancesAreRefused) {
  for (double bad : {std::nan(""), -1.0, std::numeric_limits<double>::infinity()}) {
    EXPECT_THROW(BasisDecomposition().set_tolerance(bad), Error) << bad;
    EXPECT_THROW(CpAls().set_tolerance(bad), Error) << bad;
    EXPECT_THROW(Tucker().set_tolerance(bad), Error) << bad;
  }
  EXPECT_NO_THROW(BasisDecomposition().set_tolerance(0));
  EXPECT_NO_THROW(CpAls().set_tolerance(0));
  EXPECT_NO_THROW(Tucker().set_tolerance(1e-3));
}

TEST(BasisDecomposition, AutomaticResolvesToPivotedOrMaxmin) {
  const MatrixXd a = randn(20, 4, 1, 1) * randn(4, 10, 1, 2);
  BasisDecomposition bd;
  bd.set_rank(4).compute(a);
  EXPECT_EQ(bd.strategy_used(), BasisStrategy::kPivoted);
  std::vector<MatrixXd> two{a, a * 2.0};
  bd.compute(two);
  EXPECT_EQ(bd.strategy_used(), BasisStrategy::kMaxMin);
}

TEST(BasisDecomposition, Accounting) {
  // Storage: dense m·n, UV r(m+n), BD r(m+n−r).
  const BdAccounting a = bd_accounting(768, 768, 64);
  EXPECT_EQ(a.params_dense, 768 * 768);
  EXPECT_EQ(a.params_lowrank, 64 * 1536);
  EXPECT_EQ(a.params_bd, 64 * (1536 - 64));
  EXPECT_EQ(a.macs_bd, a.params_bd);
  // Low-rank LLaMA-2-7B example: 4096², r = 1024 saves 1024/8192 = 12.5 %.
  const BdAccounting b = bd_accounting(4096, 4096, 1024);
  EXPECT_DOUBLE_EQ(1.0 - static_cast<double>(b.params_bd) / b.params_lowrank, 0.125);
}

// Integer construction: W_k = [L; D·L] with L unit lower-triangular and D integer. With S = first r
// the coefficients are exactly Dᵀ and BDA logits equal MHA logits bit for bit in float64.
TEST(BasisDecomposition, BitExactIntegerConstruction) {
  const index_t d = 24, dh = 5, n = 7;
  CounterRng rng(test::base_seed(), 77);
  std::uint64_t ctr = 0;
  auto small_int = [&](int lo, int hi) {
    return static_cast<double>(lo + static_cast<int>(rng.uniform(ctr++) * (hi - lo + 1)));
  };
  MatrixXd l = MatrixXd::Identity(dh, dh);
  for (index_t i = 0; i < dh; ++i)
    for (index_t j = 0; j < i; ++j) l(i, j) = small_int(-1, 1);
  MatrixXd dm(d - dh, dh);
  for (index_t i = 0; i < dm.rows(); ++i)
    for (index_t j = 0; j < dh; ++j) dm(i, j) = small_int(-2, 2);
  MatrixXd wk(d, dh);
  wk.topRows(dh) = l;
  wk.bottomRows(d - dh) = dm * l;
  MatrixXd wq(d, dh), x(n, d);
  for (index_t i = 0; i < d; ++i)
    for (index_t j = 0; j < dh; ++j) wq(i, j) = small_int(-3, 3);
  for (index_t i = 0; i < n; ++i)
    for (index_t j = 0; j < d; ++j) x(i, j) = small_int(-3, 3);

  // M = W_q·W_kᵀ in column form from its factors (U = W_q, V = W_kᵀ).
  BasisDecomposition bd;
  bd.set_form(BdForm::kCols).set_strategy(BasisStrategy::kFirst).compute_lowrank(wq, wk.transpose());
  ASSERT_EQ(bd.info(), ComputationInfo::kSuccess);
  const MatrixXd& c = bd.coefficients();  // r × (d − r)
  const MatrixXd dt = dm.transpose();
  ASSERT_EQ(c.rows(), dt.rows());
  ASSERT_EQ(c.cols(), dt.cols());
  for (index_t i = 0; i < c.rows(); ++i)
    for (index_t j = 0; j < c.cols(); ++j) ASSERT_EQ(c(i, j), dt(i, j)) << i << "," << j;
  EXPECT_EQ(bd.basis_block(), wq * l.transpose());

  // Logits: MHA Q·Kᵀ against BDA Q'·K'ᵀ, K' = X[:,S] + X[:,S^c]·Cᵀ, Q' = X·B.
  const MatrixXd q = x * wq, k = x * wk;
  const MatrixXd kp = x.leftCols(dh) + x.rightCols(d - dh) * c.transpose();
  const MatrixXd qp = x * bd.basis_block();
  const MatrixXd mha = q * k.transpose(), bda = qp * kp.transpose();
  ASSERT_EQ(std::memcmp(mha.data(), bda.data(), sizeof(double) * static_cast<std::size_t>(mha.size())), 0);
  EXPECT_EQ(bd.cond_basis(), condition_number(l));
}

// Selection-rule case: head 0's first-r rows nearly collinear (κ ≈ 1e7).
std::vector<MatrixXd> near_singular_heads(index_t d, index_t dh, index_t heads, std::uint64_t seed) {
  std::vector<MatrixXd> hs;
  for (index_t h = 0; h < heads; ++h) hs.push_back(randn(d, dh, seed, 40 + h));
  const MatrixXd noise = randn(dh, dh, seed, 99);
  for (index_t i = 1; i < dh; ++i) hs[0].row(i) = hs[0].row(0) + 1e-7 * noise.row(i);
  return hs;
}

TEST(BasisDecomposition, NearSingularFirstBlockIsAvoided) {
  const index_t d = 64, dh = 8, heads = 4;
  const auto hs = near_singular_heads(d, dh, heads, test::base_seed());
  BasisDecomposition first;
  first.set_rank(dh).set_strategy(BasisStrategy::kFirst).compute(hs);
  EXPECT_GT(first.cond_basis(0), 1e6) << "the construction must be near-singular";

  std::vector<index_t> first_r(static_cast<std::size_t>(dh));
  for (index_t i = 0; i < dh; ++i) first_r[static_cast<std::size_t>(i)] = i;
  for (BasisStrategy s : {BasisStrategy::kResidualMin, BasisStrategy::kPivoted, BasisStrategy::kMaxMin}) {
    BasisDecomposition bd;
    bd.set_rank(dh).set_strategy(s).compute(hs);
    ASSERT_EQ(bd.info(), ComputationInfo::kSuccess) << to_string(s);
    EXPECT_NE(bd.basis(), first_r) << to_string(s);
    if (s != BasisStrategy::kPivoted)  // stacked pivoted QR only avoids it partly (docs/bd.md)
      EXPECT_LT(bd.cond_basis_max(), 1e4) << to_string(s);
  }
  BasisDecomposition rmin;
  rmin.set_rank(dh).set_strategy(BasisStrategy::kResidualMin).compute(hs);
  std::vector<index_t> last_r;
  for (index_t i = d - dh; i < d; ++i) last_r.push_back(i);
  EXPECT_EQ(rmin.basis(), last_r) << "residual_min must pick last-r";
  // One matrix: column-pivoted QR is well conditioned.
  BasisDecomposition piv;
  piv.set_rank(dh).set_strategy(BasisStrategy::kPivoted).compute(hs[0]);
  EXPECT_LT(piv.cond_basis(), 1e4);
  // Same through the low-rank form (factors U = W_k^h, V = random).
  std::vector<MatrixXd> vs;
  for (index_t h = 0; h < heads; ++h) vs.push_back(randn(dh, 30, 5, 60 + h));
  BasisDecomposition lr;
  lr.set_strategy(BasisStrategy::kMaxMin).compute_lowrank(hs, vs);
  EXPECT_NE(lr.basis(), first_r);
  EXPECT_LT(lr.cond_basis_max(), 1e4);
}

TEST(BasisDecomposition, MaxminBeatsResidualMinOnRandomHeads) {
  // Expected: 5–30× lower worst-head κ than the better of first/last on random weights.
  const index_t d = 256, dh = 32, heads = 8;
  std::vector<MatrixXd> hs;
  for (index_t h = 0; h < heads; ++h) hs.push_back(randn(d, dh, test::base_seed(), 200 + h));
  BasisDecomposition a, b;
  a.set_rank(dh).set_strategy(BasisStrategy::kResidualMin).compute(hs);
  b.set_rank(dh).set_strategy(BasisStrategy::kMaxMin).compute(hs);
  EXPECT_LT(b.cond_basis_max() * 2, a.cond_basis_max());
}

TEST(BasisDecomposition, ReportsInvalidInputAndNumericalIssues) {
  const MatrixXd a = randn(10, 3, 1, 1) * randn(3, 8, 1, 2);
  BasisDecomposition bd;
  EXPECT_EQ(bd.info(), ComputationInfo::kInvalidInput);
  EXPECT_THROW(bd.basis(), Error);
  bd.set_rank(9).compute(a);  // rank > min(m, n)
  EXPECT_EQ(bd.info(), ComputationInfo::kInvalidInput);
  EXPECT_FALSE(bd.message().empty());
  MatrixXd nan = a;
  nan(2, 2) = std::nan("");
  bd.set_rank(3).compute(nan);
  EXPECT_EQ(bd.info(), ComputationInfo::kInvalidInput);
  bd.set_rank(0).compute(a);  // neither rank nor tolerance
  EXPECT_EQ(bd.info(), ComputationInfo::kInvalidInput);
  // A dependent forced basis: rows 0 and 1 equal.
  MatrixXd dep = a;
  dep.row(1) = dep.row(0);
  bd.set_rank(3).set_basis({0, 1, 2}).compute(dep);
  EXPECT_EQ(bd.info(), ComputationInfo::kNumericalIssue) << bd.message();
  EXPECT_FALSE(bd.cond_basis() < 1e15);
  EXPECT_THROW(parse_strategy("best"), Error);
  EXPECT_THROW(parse_form("diag"), Error);
}

}  // namespace NUMATTN_UNITY_ID
}  // namespace
}  // namespace numattn::decomp
