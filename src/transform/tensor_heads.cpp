#include "numattn/transform/tensor_heads.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <map>

#include <fmt/format.h>

#include "numattn/core/error.h"
#include "numattn/decomp/cp.h"
#include "numattn/decomp/tensor3.h"
#include "numattn/decomp/tucker.h"

namespace numattn::transform {

using decomp::dense::Matrix;

const char* to_string(TensorScheme s) {
  switch (s) {
    case TensorScheme::kVoCp: return "vo-cp";
    case TensorScheme::kQkCp: return "qk-cp";
    case TensorScheme::kTuckerQkvo: return "tucker-qkvo";
    case TensorScheme::kTuckerFfn: return "tucker-ffn";
    case TensorScheme::kTuckerHeads: return "tucker-heads";
  }
  return "?";
}

const char* tensor_spec_grammar() {
  return "SCHEME:key=value,... with SCHEME vo-cp | qk-cp (collaborative heads, CP rank: rank=R, "
         "R >= 1, or 0 = exact block form; iters=N, seed=S; vo-cp: exec=embedded|factored) or "
         "tucker-qkvo | tucker-ffn (each "
         "weight kind stacked over the layers: rank=R or R1xR2 (>= 1, clamped per kind to the "
         "matrix's rows/cols), layers=L (stack rank; default all = shared factors), iters=N) or "
         "tucker-heads (per layer and weight kind, the heads × E × D tensor: rank=RE or RExRD, "
         "clamped to E and D, heads=H' (head-mode rank; default all = one core per head), iters=N)";
}

namespace {

std::int64_t parse_int(const std::string& key, const std::string& v, const std::string& spec) {
  char* end = nullptr;
  errno = 0;
  const long long x = std::strtoll(v.c_str(), &end, 10);
  NUMATTN_CHECK_OPTION(!v.empty() && end == v.c_str() + v.size() && errno == 0, "tensor",
                       "'{}': {}={} is not an integer ({})", spec, key, v, tensor_spec_grammar());
  return x;
}

}  // namespace

TensorSpec parse_tensor_spec(const std::string& s) {
  TensorSpec t;
  const auto colon = s.find(':');
  const std::string name = s.substr(0, colon);
  if (name == "vo-cp") {
    t.scheme = TensorScheme::kVoCp;
  } else if (name == "qk-cp") {
    t.scheme = TensorScheme::kQkCp;
  } else if (name == "tucker-qkvo") {
    t.scheme = TensorScheme::kTuckerQkvo;
  } else if (name == "tucker-ffn") {
    t.scheme = TensorScheme::kTuckerFfn;
  } else if (name == "tucker-heads") {
    t.scheme = TensorScheme::kTuckerHeads;
  } else {
    throw OptionError("tensor", fmt::format("unknown scheme '{}' in '{}' ({})", name, s,
                                            tensor_spec_grammar()));
  }
  std::map<std::string, std::string> kv;
  if (colon != std::string::npos) {
    std::string rest = s.substr(colon + 1);
    std::size_t b = 0;
    while (b <= rest.size()) {
      const std::size_t e = std::min(rest.find(',', b), rest.size());
      const std::string item = rest.substr(b, e - b);
      const auto eq = item.find('=');
      NUMATTN_CHECK_OPTION(eq != std::string::npos && eq > 0, "tensor", "'{}': '{}' is not key=value ({})",
                           s, item, tensor_spec_grammar());
      const std::string key = item.substr(0, eq);
      NUMATTN_CHECK_OPTION(kv.count(key) == 0, "tensor", "'{}': {} given twice", s, key);
      kv[key] = item.substr(eq + 1);
      b = e + 1;
    }
  }
  NUMATTN_CHECK_OPTION(kv.count("rank") == 1, "tensor", "'{}' needs rank=... ({})", s, tensor_spec_grammar());
  for (const auto& [key, v] : kv) {
    if (key == "rank") {
      const auto x = v.find('x');
      if (x != std::string::npos) {
        NUMATTN_CHECK_OPTION(!t.is_cp(), "tensor", "'{}': a CP rank is one number, got {}", s, v);
        t.rank = parse_int(key, v.substr(0, x), s);
        t.rank2 = parse_int(key, v.substr(x + 1), s);
      } else {
        t.rank = parse_int(key, v, s);
        t.rank2 = t.is_cp() ? 0 : t.rank;
      }
    } else if (key == (t.scheme == TensorScheme::kTuckerHeads ? "heads" : "layers") && !t.is_cp()) {
      t.layers = parse_int(key, v, s);
      NUMATTN_CHECK_OPTION(t.layers >= 1, "tensor", "'{}': {}={} must be at least 1", s, key, t.layers);
    } else if (key == "iters") {
      const auto it = parse_int(key, v, s);
      NUMATTN_CHECK_OPTION(it >= 1 && it <= 100000, "tensor", "'{}': iters={} must be in [1, 100000]", s, it);
      t.iters = static_cast<int>(it);
    } else if (key == "exec" && t.scheme == TensorScheme::kVoCp) {
      NUMATTN_CHECK_OPTION(v == "factored" || v == "embedded", "tensor", "'{}': exec={} is not factored or embedded",
                           s, v);
      t.factored = v == "factored";
    } else if (key == "seed" && t.is_cp()) {
      t.seed = static_cast<std::uint64_t>(parse_int(key, v, s));
    } else {
      throw OptionError("tensor", fmt::format("'{}': unknown key '{}' for {} ({})", s, key, name,
                                              tensor_spec_grammar()));
    }
  }
  if (t.is_cp()) {
    NUMATTN_CHECK_OPTION(t.rank >= 0, "tensor", "'{}': CP rank {} must be >= 0 (0 = exact block form)", s, t.rank);
  } else {
    NUMATTN_CHECK_OPTION(t.rank >= 1 && t.rank2 >= 1, "tensor", "'{}': Tucker ranks {}x{} must be >= 1",
                         s, t.rank, t.rank2);
  }
  return t;
}

std::string TensorSpec::canonical() const {
  std::string r = fmt::format("{}:rank={}", to_string(scheme), rank);
  if (!is_cp()) {
    if (rank2 != rank) r += fmt::format("x{}", rank2);
    if (layers > 0) r += fmt::format(",{}={}", scheme == TensorScheme::kTuckerHeads ? "heads" : "layers", layers);
  }
  r += fmt::format(",iters={}", iterations());
  if (is_cp() && seed != 1) r += fmt::format(",seed={}", seed);
  if (factored) r += ",exec=factored";
  return r;
}

Matrix CollabHeads::head(std::int64_t h) const {
  NUMATTN_CHECK(h >= 0 && h < mix.rows(), "collaborative head {} out of [0, {})", h, mix.rows());
  return decomp::matmul(left * mix.row(h).transpose().asDiagonal(), right, false, true);
}

namespace {

// What a decomposition object (CpAls, SharedFactor, Tucker) says of its run, copied into a
// compression result; bad input (not a numerical outcome) is an error.
template <class Result, class Decomposition>
void take_outcome(Result& out, const Decomposition& d, const char* what) {
  NUMATTN_CHECK(d.info() != decomp::dense::Info::kInvalidInput, "{}: {}", what, d.message());
  out.info = d.info();
  out.message = d.message();
  out.iterations = d.iterations();
  out.fit = d.fit();
}

/// Orthonormal basis (thin QR) of the columns of `a` when it has fewer columns than rows, else
/// an empty matrix (no projection).
Matrix span_basis(const Matrix& a) {
  if (a.cols() >= a.rows()) return Matrix();
  auto q = decomp::dense::qr(a);
  NUMATTN_CHECK(q.info == decomp::dense::Info::kSuccess, "collaborative heads: QR of the head factors failed ({})",
                decomp::dense::to_string(q.info));
  return q.q;
}

}  // namespace

CollabHeads collaborative_heads(std::span<const Matrix> left, std::span<const Matrix> right,
                                const CollabOptions& opt) {
  const auto H = static_cast<std::int64_t>(left.size()), G = static_cast<std::int64_t>(right.size());
  NUMATTN_CHECK(H >= 1 && G >= 1 && H % G == 0,
                "collaborative heads: {} heads over {} groups (the heads must be a multiple of the groups)", H, G);
  const std::int64_t n = left[0].rows(), D = left[0].cols(), m = right[0].cols();
  for (std::int64_t h = 0; h < H; ++h)
    NUMATTN_CHECK(left[h].rows() == n && left[h].cols() == D && left[h].allFinite(),
                  "collaborative heads: head {}'s factor is {}×{} (expected {}×{}, finite)", h,
                  left[h].rows(), left[h].cols(), n, D);
  for (std::int64_t g = 0; g < G; ++g)
    NUMATTN_CHECK(right[g].rows() == D && right[g].cols() == m && right[g].allFinite(),
                  "collaborative heads: group {}'s factor is {}×{} (expected {}×{}, finite)", g,
                  right[g].rows(), right[g].cols(), D, m);
  NUMATTN_CHECK(opt.rank >= 0, "collaborative heads: rank {} must be >= 0 (0 = the exact block form)", opt.rank);
  const std::int64_t per = H / G;
  CollabHeads out;
  out.params_before = H * n * D + G * D * m;
  if (opt.rank == 0) {
    const std::int64_t R = H * D;
    out.block_form = true;
    out.left.resize(n, R);
    out.right.resize(m, R);
    out.mix = Matrix::Zero(H, R);
    for (std::int64_t h = 0; h < H; ++h) {
      out.left.middleCols(h * D, D) = left[h];
      out.right.middleCols(h * D, D) = right[h / per].transpose();
      out.mix.block(h, h * D, 1, D).setOnes();
    }
    out.params_after = R * (n + m + H);
    return out;
  }
  // Project on the spans of the factors (lossless, see the header), then CP-ALS.
  Matrix lcat(n, H * D), rcat(m, G * D);
  for (std::int64_t h = 0; h < H; ++h) lcat.middleCols(h * D, D) = left[h];
  for (std::int64_t g = 0; g < G; ++g) rcat.middleCols(g * D, D) = right[g].transpose();
  const Matrix ql = span_basis(lcat), qr = span_basis(rcat);
  std::vector<Matrix> slices(static_cast<std::size_t>(H));
  for (std::int64_t h = 0; h < H; ++h) {
    const Matrix l = ql.size() ? decomp::matmul(ql, left[h], true, false) : left[h];
    const Matrix r = qr.size() ? decomp::matmul(right[h / per], qr) : right[h / per];
    slices[static_cast<std::size_t>(h)] = decomp::matmul(l, r);
  }
  const decomp::Tensor3 t = decomp::Tensor3::from_slices(slices);
  decomp::CpAls cp;
  cp.set_rank(opt.rank)
      .set_max_iterations(opt.max_iterations)
      .set_tolerance(opt.tolerance)
      .set_seed(opt.seed)
      .set_init(decomp::CpInit::kHosvd)
      .set_line_search(true)
      .compute(t);
  take_outcome(out, cp, "collaborative heads");
  const Matrix& b = cp.factor(1);
  const Matrix& c = cp.factor(2);
  out.left = ql.size() ? decomp::matmul(ql, b) : b;
  out.right = qr.size() ? decomp::matmul(qr, c) : c;
  out.mix = cp.factor(0) * cp.weights().asDiagonal();
  out.params_after = opt.rank * (n + m + H);
  return out;
}

MlaLayerWeights collaborative_qk_mla(const MlaLayerWeights& w, std::int64_t E, const CollabOptions& opt,
                                     CollabHeads* heads) {
  using RowMajorD = Eigen::Matrix<double, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
  const std::int64_t H = w.n_head, dn = w.d_nope, r = w.rank;
  NUMATTN_CHECK(dn >= 1, "collaborative QK on MLA: the layer has no NoPE dimensions (d_nope = 0)");
  NUMATTN_CHECK(H >= 1 && r >= 1 && E >= 1 && static_cast<std::int64_t>(w.w_q_nope.size()) == H * dn * E &&
                    static_cast<std::int64_t>(w.w_uk.size()) == H * dn * r,
                "collaborative QK on MLA: W_q_nope has {} values and W_uk {}, expected {}·{}·{} and {}·{}·{}",
                w.w_q_nope.size(), w.w_uk.size(), H, dn, E, H, dn, r);
  NUMATTN_CHECK(opt.rank <= H * dn, "collaborative QK on MLA: rank {} exceeds the block form's Hq·d_nope = {}·{} = {}",
                opt.rank, H, dn, H * dn);
  std::vector<Matrix> left, right;
  for (std::int64_t h = 0; h < H; ++h) {
    left.push_back(Eigen::Map<const RowMajorD>(w.w_q_nope.data() + h * dn * E, dn, E).transpose());
    right.push_back(Eigen::Map<const RowMajorD>(w.w_uk.data() + h * dn * r, dn, r));
  }
  CollabHeads c = collaborative_heads(left, right, opt);
  const std::int64_t R = c.rank();
  MlaLayerWeights out = w;
  out.d_nope = R;
  out.w_q_nope.resize(static_cast<std::size_t>(H * R * E));
  out.w_uk.resize(static_cast<std::size_t>(H * R * r));
  for (std::int64_t h = 0; h < H; ++h) {
    Eigen::Map<RowMajorD>(out.w_q_nope.data() + h * R * E, R, E) = c.mix.row(h).transpose().asDiagonal() * c.left.transpose();
    Eigen::Map<RowMajorD>(out.w_uk.data() + h * R * r, R, r) = c.right.transpose();
  }
  if (heads) *heads = std::move(c);
  return out;
}

StackCompression compress_stack(std::span<const Matrix> mats, const StackOptions& opt) {
  const auto S = static_cast<std::int64_t>(mats.size());
  NUMATTN_CHECK(S >= 1, "stacked compression: no matrices");
  const std::int64_t rows = mats[0].rows(), cols = mats[0].cols();
  for (std::int64_t s = 0; s < S; ++s)
    NUMATTN_CHECK(mats[s].rows() == rows && mats[s].cols() == cols && mats[s].allFinite(),
                  "stacked compression: matrix {} is {}×{} (expected {}×{}, finite)", s, mats[s].rows(),
                  mats[s].cols(), rows, cols);
  NUMATTN_CHECK(opt.rank_rows >= 1 && opt.rank_rows <= rows && opt.rank_cols >= 1 && opt.rank_cols <= cols,
                "stacked compression: ranks {}x{} outside [1, {}]x[1, {}]", opt.rank_rows, opt.rank_cols, rows, cols);
  NUMATTN_CHECK(opt.stack_rank >= 0 && opt.stack_rank <= S,
                "stacked compression: stack rank {} outside [1, {}] (0 = shared factors)", opt.stack_rank, S);
  const decomp::Tensor3 x = decomp::Tensor3::from_slices(mats);
  StackCompression out;
  out.params_before = S * rows * cols;
  const std::int64_t r1 = opt.rank_rows, r2 = opt.rank_cols;
  if (opt.stack_rank == 0 || opt.stack_rank == S) {
    decomp::SharedFactor sf;
    sf.set_ranks(r1, r2).set_max_iterations(opt.max_iterations).set_tolerance(opt.tolerance).compute(x);
    take_outcome(out, sf, "stacked compression");
    out.params_after = sf.parameters();
    out.left = sf.left();
    out.right = sf.right();
    for (std::int64_t s = 0; s < S; ++s) {
      out.approx.push_back(sf.reconstruct(s));
      out.cores.push_back(sf.core(s));
    }
  } else {
    decomp::Tucker tk;
    tk.set_ranks(opt.stack_rank, r1, r2)
        .set_method(decomp::TuckerMethod::kHooi)
        .set_max_iterations(opt.max_iterations)
        .set_tolerance(opt.tolerance)
        .compute(x);
    take_outcome(out, tk, "stacked compression");
    out.params_after = tk.parameters();
    out.coef = tk.factor(0);
    out.left = tk.factor(1);
    out.right = tk.factor(2);
    for (std::int64_t k = 0; k < opt.stack_rank; ++k) out.cores.push_back(tk.core().slice(k));
    const decomp::Tensor3 r = tk.reconstruct();
    for (std::int64_t s = 0; s < S; ++s) out.approx.push_back(r.slice(s));
  }
  for (std::int64_t s = 0; s < S; ++s) {
    const double nrm = mats[s].norm();
    const double err = (mats[s] - out.approx[static_cast<std::size_t>(s)]).norm();
    out.slice_fit.push_back(nrm > 0 ? 1 - err / nrm : (err == 0 ? 1.0 : -INFINITY));
  }
  return out;
}

}  // namespace numattn::transform
