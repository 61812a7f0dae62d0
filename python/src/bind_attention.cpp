// numattn.attention / numattn.reference / numattn.error: one attention problem from NumPy or
// DLPack arrays, through a registered method or the float64 reference, and the error metrics.
#include <nanobind/stl/optional.h>
#include <nanobind/stl/pair.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/variant.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <exception>
#include <optional>
#include <variant>

#include "common.h"
#include "numattn/analysis/metrics.h"
#include "numattn/attention/reference.h"
#include "numattn/attention/registry.h"

namespace numattn::py {

namespace {

using CausalArg = std::variant<bool, std::string>;
using Window = std::optional<std::pair<std::int64_t, std::int64_t>>;

Causal to_causal(const CausalArg& c) {
  if (const bool* b = std::get_if<bool>(&c)) return *b ? Causal::kTopLeft : Causal::kNone;
  try {
    return parse_causal(std::get<std::string>(c));
  } catch (const Error& e) {
    throw OptionError("causal", std::string(e.what()) + " (or True = 'top-left', False = 'none')");
  }
}

// Inputs of one problem, kept alive while it runs: the views point into the caller's arrays or
// into the copies held here.
struct Inputs {
  Float32Input q, k, v;
  Layout layout = Layout::kBHND;
  std::vector<std::uint8_t> bool_mask;
  std::vector<float> add_mask;
  MemSpan mask_mem;  // the caller's mask when read in place
  AttentionProblem p;  // q, k, v, scale, causal, mask, window (out/lse set by the caller)
};

void read_inputs(Inputs& in, const AnyArray& q, const AnyArray& k, const AnyArray& v,
                 const CausalArg& causal, const std::optional<AnyArray>& mask,
                 std::optional<double> scale, const Window& window, const std::string& layout) {
  in.layout = layout_option(layout);
  in.q = as_f32_input(q, "q", in.layout);
  in.k = as_f32_input(k, "k", in.layout);
  in.v = as_f32_input(v, "v", in.layout);
  AttentionProblem& p = in.p;
  p.q = in.q.view;
  p.k = in.k.view;
  p.v = in.v.view;
  p.scale = scale;
  p.causal = to_causal(causal);
  if (window) {
    NUMATTN_CHECK_OPTION(window->first >= -1 && window->second >= -1, "window",
                         "({}, {}): each side is a key count >= 0, or -1 for unbounded",
                         window->first, window->second);
    p.window_left = window->first;
    p.window_right = window->second;
  }
  if (!mask) return;
  const AnyArray& m = *mask;
  if (m.device_type() != nb::device::cpu::value)
    throw nb::type_error("mask: the array is not in host memory; copy it to the host first");
  const index_t nq = p.q.shape[2], nk = p.k.shape[2];
  NUMATTN_CHECK_OPTION(m.ndim() == 2 && static_cast<index_t>(m.shape(0)) == nq &&
                           static_cast<index_t>(m.shape(1)) == nk,
                       "mask", "must be a [Nq, Nk] = [{}, {}] array (shared by all batches and heads)",
                       nq, nk);
  const auto dt = m.dtype();
  const auto code = static_cast<nb::dlpack::dtype_code>(dt.code);
  const bool row_contig = nk <= 1 || m.stride(1) == 1;
  const MemSpan mem = mem_span(m.data(), {nq, nk}, {m.stride(0), m.stride(1)}, m.itemsize());
  auto at = [&](index_t i, index_t j) {
    return static_cast<const unsigned char*>(m.data()) +
           (i * m.stride(0) + j * m.stride(1)) * static_cast<index_t>(m.itemsize());
  };
  if (code == nb::dlpack::dtype_code::Bool || code == nb::dlpack::dtype_code::Int ||
      code == nb::dlpack::dtype_code::UInt) {
    // Boolean: nonzero = the key is visible. NumPy bools are bytes 0/1: read in place.
    if (code == nb::dlpack::dtype_code::Bool && dt.bits == 8 && row_contig && m.stride(0) >= nk) {
      p.mask = {MaskKind::kBool, static_cast<const std::uint8_t*>(m.data()), nullptr, m.stride(0)};
      in.mask_mem = mem;
      return;
    }
    reserve_array("the mask as bool", {nq, nk}, 1);
    in.bool_mask.resize(static_cast<std::size_t>(nq * nk));
    const auto isz = m.itemsize();
    for (index_t i = 0; i < nq; ++i)
      for (index_t j = 0; j < nk; ++j) {
        const unsigned char* e = at(i, j);
        bool nz = false;
        for (std::size_t b = 0; b < isz; ++b) nz = nz || e[b] != 0;
        in.bool_mask[static_cast<std::size_t>(i * nk + j)] = nz;
      }
    p.mask = {MaskKind::kBool, in.bool_mask.data(), nullptr, nk};
    return;
  }
  const bool f32 = dt == nb::dtype<float>(), f64 = dt == nb::dtype<double>();
  if (!f32 && !f64)
    throw nb::type_error("mask: dtype not supported: pass bool or integer (nonzero = visible) or "
                         "float32/float64 (additive: added to the logit, -inf hides the key)");
  const bool aligned = reinterpret_cast<std::uintptr_t>(m.data()) % alignof(float) == 0;
  if (f32 && aligned && row_contig && m.stride(0) >= nk) {
    p.mask = {MaskKind::kAdditive, nullptr, static_cast<const float*>(m.data()), m.stride(0)};
    in.mask_mem = mem;
    return;
  }
  reserve_array("the mask as float32", {nq, nk}, 4);
  in.add_mask.resize(static_cast<std::size_t>(nq * nk));
  for (index_t i = 0; i < nq; ++i)
    for (index_t j = 0; j < nk; ++j) {
      float x;
      if (f64) {
        double d;
        std::memcpy(&d, at(i, j), sizeof d);
        x = static_cast<float>(d);
      } else {
        std::memcpy(&x, at(i, j), sizeof x);
      }
      in.add_mask[static_cast<std::size_t>(i * nk + j)] = x;
    }
  p.mask = {MaskKind::kAdditive, nullptr, in.add_mask.data(), nk};
}

// The shapes are checked before any output is sized from them: validate() wants an out view
// of the right shape, a placeholder that nothing writes through.
void validate_before_output(AttentionProblem& p) {
  static float dummy = 0;
  p.out = TensorView<float>(&dummy, {p.q.shape[0], p.q.shape[1], p.q.shape[2], p.v.shape[3]}, {0, 0, 0, 1});
  validate(p);
}

// "q [1, 8, 100, 64], k [...], v [...]" as the caller passed them (before validation).
std::string in_shapes(const Inputs& in) {
  auto one = [](const char* n, const TensorView<const float>& t) {
    return fmt::format("{} [{}]", n, fmt::join(t.shape, ", "));
  };
  return one("q", in.p.q) + ", " + one("k", in.p.k) + ", " + one("v", in.p.v) + " (as [B, H, N, D])";
}

// The output's memory shape (as the caller holds it: q's rank and layout) for logical
// [B, H, Nq, Dv].
std::vector<std::int64_t> memory_shape(const Inputs& in, index_t dv) {
  const auto& s = in.p.q.shape;
  std::vector<std::int64_t> full = in.layout == Layout::kBHND
                                       ? std::vector<std::int64_t>{s[0], s[1], s[2], dv}
                                       : std::vector<std::int64_t>{s[0], s[2], s[1], dv};
  return {full.end() - in.q.rank, full.end()};
}
std::vector<std::int64_t> lse_shape(const Inputs& in) {
  const auto& s = in.p.q.shape;
  const std::vector<std::int64_t> full{s[0], s[1], s[2]};
  return {full.end() - (in.q.rank - 1), full.end()};
}

// A logical [B,H,Nq,Dv] view over memory of `shape`/`strides` (elements) in the caller's layout.
template <class T>
TensorView<T> logical_view(T* data, const Inputs& in, const std::vector<std::int64_t>& shape,
                           const std::vector<std::int64_t>& strides) {
  std::array<index_t, 4> ms{1, 1, 1, 1}, st{0, 0, 0, 1};
  const int r = static_cast<int>(shape.size());
  for (int i = 0; i < r; ++i) {
    ms[static_cast<std::size_t>(4 - r + i)] = shape[static_cast<std::size_t>(i)];
    st[static_cast<std::size_t>(4 - r + i)] = strides[static_cast<std::size_t>(i)];
  }
  st[3] = 1;
  for (int i = 3 - r; i >= 0; --i) st[static_cast<std::size_t>(i)] = ms[static_cast<std::size_t>(i + 1)] * st[static_cast<std::size_t>(i + 1)];
  if (in.layout == Layout::kBNHD)
    return TensorView<T>(data, {ms[0], ms[2], ms[1], ms[3]}, {st[0], st[2], st[1], st[3]});
  return TensorView<T>(data, ms, st);
}

std::vector<std::int64_t> c_strides(const std::vector<std::int64_t>& shape) {
  std::vector<std::int64_t> st(shape.size(), 1);
  for (int i = static_cast<int>(shape.size()) - 2; i >= 0; --i)
    st[static_cast<std::size_t>(i)] = st[static_cast<std::size_t>(i + 1)] * shape[static_cast<std::size_t>(i + 1)];
  return st;
}

// A NonFiniteInput from the library names [b, h, n, d] of the logical view; re-raise it with
// the index of the element in the array the caller passed (its rank and layout).
[[noreturn]] void rethrow_non_finite(const NonFiniteInput& e, const Inputs& in) {
  std::vector<std::int64_t> at(e.index().begin(), e.index().end());
  if (e.tensor() != "mask") {
    const Float32Input& t = e.tensor() == "q" ? in.q : e.tensor() == "k" ? in.k : in.v;
    if (in.layout == Layout::kBNHD && at.size() == 4) std::swap(at[1], at[2]);
    if (at.size() == 4) at.erase(at.begin(), at.begin() + (4 - t.rank));
  }
  std::string idx;
  for (auto x : at) idx += (idx.empty() ? "" : ", ") + std::to_string(x);
  raise_non_finite(fmt::format("{} (element [{}] of the array passed as {})", e.what(), idx, e.tensor()),
                   e.tensor(), at);
}

// Runs `fn` with the GIL released; numattn exceptions cross back as they are (the translator
// maps them), NonFiniteInput gets the caller's indices.
template <class F>
void run_released(const Inputs& in, F&& fn) {
  std::exception_ptr err;
  {
    nb::gil_scoped_release release;
    try {
      fn();
    } catch (...) {
      err = std::current_exception();
    }
  }
  if (!err) return;
  try {
    std::rethrow_exception(err);
  } catch (const NonFiniteInput& e) {
    rethrow_non_finite(e, in);
  }
}

nb::object attention(const AnyArray& q, const AnyArray& k, const AnyArray& v,
                     const std::string& method, const CausalArg& causal,
                     const std::optional<AnyArray>& mask, std::optional<double> scale,
                     const Window& window, const std::string& layout, bool return_lse,
                     std::optional<int> threads, std::optional<nb::ndarray<>> out) {
  const ExecContext ctx{threads.value_or(0)};
  ctx.num_threads();  // refuses a bad count before any work
  std::unique_ptr<AttentionMethod> m;
  try {
    m = create_method(method);
  } catch (const OptionError&) {
    throw;
  } catch (const Error& e) {
    throw OptionError("method", e.what());
  }
  Inputs in;
  read_inputs(in, q, k, v, causal, mask, scale, window, layout);
  AttentionProblem& p = in.p;
  const index_t dv = p.v.shape[3];
  const std::vector<std::int64_t> oshape = memory_shape(in, dv);
  doing(fmt::format("preparing {} on {}", m->spec(), in_shapes(in)));
  validate_before_output(p);
  nb::object result;
  if (out) {
    const nb::ndarray<>& o = *out;
    if (o.device_type() != nb::device::cpu::value || o.dtype() != nb::dtype<float>())
      throw nb::type_error("out: must be a writable float32 array in host memory");
    std::vector<std::int64_t> shape(o.ndim()), strides(o.ndim());
    for (std::size_t i = 0; i < o.ndim(); ++i) shape[i] = static_cast<std::int64_t>(o.shape(i)), strides[i] = o.stride(i);
    NUMATTN_CHECK_OPTION(shape == oshape, "out", "must have shape [{}] (q's rank and layout, Dv of v), got [{}]",
                         fmt::join(oshape, ", "), fmt::join(shape, ", "));
    NUMATTN_CHECK_OPTION(o.ndim() == 0 || shape.back() <= 1 || strides.back() == 1, "out",
                         "the last axis must be contiguous (stride 1), got stride {}", strides.back());
    NUMATTN_CHECK_OPTION(reinterpret_cast<std::uintptr_t>(o.data()) % alignof(float) == 0, "out",
                         "the buffer is not aligned for float32");
    // Every element of out is written once, by one thread, while q, k, v are read: two
    // elements of out on the same memory (a stride of 0, axes that interleave) would race and
    // keep whichever write came last, and out on an input's memory would change what is read.
    NUMATTN_CHECK_OPTION(!may_self_overlap(shape, strides, sizeof(float)), "out",
                         "its elements overlap one another (strides [{}] over shape [{}], in elements): "
                         "pass an array whose elements are distinct memory, e.g. numpy.empty",
                         fmt::join(strides, ", "), fmt::join(shape, ", "));
    const MemSpan om = mem_span(o.data(), shape, strides, sizeof(float));
    for (const auto* t : {&in.q, &in.k, &in.v})
      if (!t->copied)
        NUMATTN_CHECK_OPTION(!om.overlaps(t->mem), "out",
                             "shares memory with {}: the output must not overlap an input",
                             t == &in.q ? "q" : t == &in.k ? "k" : "v");
    NUMATTN_CHECK_OPTION(!om.overlaps(in.mask_mem), "out",
                         "shares memory with the mask: the output must not overlap an input");
    p.out = logical_view(static_cast<float*>(o.data()), in, shape, strides);
    result = nb::cast(o);
  } else {
    NpArray<float> o = new_array<float>(oshape, "the output");
    p.out = logical_view(o.data(), in, oshape, c_strides(oshape));
    result = nb::cast(o);
  }
  nb::object lse_obj = nb::none();
  if (return_lse) {
    NpArray<float> l = new_array<float>(lse_shape(in), "the log-sum-exp");
    p.lse = TensorView<float>::contiguous(l.data(), {p.q.shape[0], p.q.shape[1], p.q.shape[2], 1});
    lse_obj = nb::cast(l);
  }
  // The method's own scratch, as it declares it (the exact kernels: a few rows per thread).
  reserve(m->workspace_bytes(p, ctx), fmt::format("the workspace of {} on {}", m->spec(), p.describe()));
  doing(fmt::format("running {} on {}", m->spec(), p.describe()));
  if (PyErr_CheckSignals() != 0) throw nb::python_error();
  run_released(in, [&] { m->run(p, ctx); });
  if (PyErr_CheckSignals() != 0) throw nb::python_error();
  if (return_lse) return nb::make_tuple(result, lse_obj);
  return result;
}

// Float64 reference rows in chunks, so that Ctrl-C is seen between chunks; the first failing
// row in (b, h, i) order is the one reported, as reference_all does.
void reference_rows(const AttentionProblem& p, const ExecContext& ctx, double* out,
                    const std::vector<std::int64_t>& ostrides_bhn, double* lse) {
  const index_t B = p.batch(), H = p.heads(), N = p.n_q(), dv = p.d_v();
  const index_t total = B * H * N;
  const index_t chunk = std::max<index_t>(64, 4096 * 64 / std::max<index_t>(1, p.n_kv()));
  std::vector<double> row(static_cast<std::size_t>(dv));
  for (index_t c0 = 0; c0 < total; c0 += chunk) {
    const index_t c1 = std::min(total, c0 + chunk);
    std::vector<std::exception_ptr> errs(static_cast<std::size_t>(c1 - c0));
    std::vector<std::vector<double>> scratch(static_cast<std::size_t>(ctx.num_threads()),
                                             std::vector<double>(static_cast<std::size_t>(dv)));
    parallel_for(ctx, c1 - c0, [&](std::int64_t t) {
      const index_t f = c0 + t, i = f % N, bh = f / N, b = bh / H, h = bh % H;
      std::vector<double>& r = scratch[static_cast<std::size_t>(thread_index())];
      try {
        const double l = reference_row(p, b, h, i, r.data());
        double* dst = out + b * ostrides_bhn[0] + h * ostrides_bhn[1] + i * ostrides_bhn[2];
        std::copy(r.begin(), r.end(), dst);
        if (lse) lse[f] = l;
      } catch (...) {
        errs[static_cast<std::size_t>(t)] = std::current_exception();
      }
    });
    for (auto& e : errs)
      if (e) std::rethrow_exception(e);
    check_interrupt();
  }
}

nb::object reference(const AnyArray& q, const AnyArray& k, const AnyArray& v,
                     const CausalArg& causal, const std::optional<AnyArray>& mask,
                     std::optional<double> scale, const Window& window, const std::string& layout,
                     bool return_lse, std::optional<int> threads) {
  const ExecContext ctx{threads.value_or(0)};
  ctx.num_threads();
  Inputs in;
  read_inputs(in, q, k, v, causal, mask, scale, window, layout);
  AttentionProblem& p = in.p;
  const index_t dv = p.v.shape[3];
  validate_before_output(p);  // reference_row never touches p.out
  doing(fmt::format("computing the float64 reference on {}", p.describe()));
  const std::vector<std::int64_t> oshape = memory_shape(in, dv);
  NpArray<double> o = new_array<double>(oshape, "the float64 output");
  const TensorView<double> ov = logical_view(o.data(), in, oshape, c_strides(oshape));
  const std::vector<std::int64_t> st{ov.stride[0], ov.stride[1], ov.stride[2]};
  nb::object lse_obj = nb::none();
  double* lse = nullptr;
  if (return_lse) {
    NpArray<double> l = new_array<double>(lse_shape(in), "the float64 log-sum-exp");
    lse = l.data();
    lse_obj = nb::cast(l);
  }
  nb::object result = nb::cast(o);
  run_released(in, [&] { reference_rows(p, ctx, o.data(), st, lse); });
  if (return_lse) return nb::make_tuple(result, lse_obj);
  return result;
}

nb::dict error_metrics(const AnyArray& approx, const AnyArray& exact,
                       const std::optional<AnyArray>& approx_lse,
                       const std::optional<AnyArray>& exact_lse) {
  if (approx.dtype() != nb::dtype<float>())
    throw nb::type_error("approx: must be float32 (a method's output); the metrics measure the "
                         "float32 result against a float64 reference");
  // Both read through as_f32_input's shape rules; exact is taken in float64.
  Float32Input a = as_f32_input(approx, "approx", Layout::kBHND);
  std::vector<std::int64_t> es(exact.ndim());
  for (std::size_t i = 0; i < exact.ndim(); ++i) es[i] = static_cast<std::int64_t>(exact.shape(i));
  std::vector<std::int64_t> as(approx.ndim());
  for (std::size_t i = 0; i < approx.ndim(); ++i) as[i] = static_cast<std::int64_t>(approx.shape(i));
  NUMATTN_CHECK(es == as, "exact: shape [{}] differs from approx's [{}]", fmt::join(es, ", "),
                fmt::join(as, ", "));
  // exact's rows, in float64 (the reference's own precision).
  const auto& s = a.view.shape;
  doing(fmt::format("comparing arrays of shape {}", shape_str(as)));
  // exact in float64 and one (b, h, i) row index per row of Dv values.
  reserve(array_bytes({s[0], s[1], s[2], s[3] + 4}, sizeof(double), "exact"),
          fmt::format("exact {} as float64, with its row indices and LSEs", shape_str(as)));
  ReferenceRows ref;
  ref.out.reserve(static_cast<std::size_t>(a.view.numel()));
  {
    if (exact.device_type() != nb::device::cpu::value)
      throw nb::type_error("exact: the array is not in host memory");
    const bool f32 = exact.dtype() == nb::dtype<float>(), f64 = exact.dtype() == nb::dtype<double>();
    if (!f32 && !f64) throw nb::type_error("exact: must be float64 (numattn.reference) or float32");
    const int r = static_cast<int>(exact.ndim());
    std::array<std::int64_t, 4> st{0, 0, 0, 0};
    for (int i = 0; i < r; ++i) st[static_cast<std::size_t>(4 - r + i)] = exact.stride(static_cast<std::size_t>(i));
    const auto* base = static_cast<const unsigned char*>(exact.data());
    const auto isz = static_cast<std::int64_t>(exact.itemsize());
    for (index_t b = 0; b < s[0]; ++b)
      for (index_t h = 0; h < s[1]; ++h)
        for (index_t i = 0; i < s[2]; ++i) {
          ref.rows.push_back({b, h, i});
          for (index_t d = 0; d < s[3]; ++d) {
            const unsigned char* e = base + (b * st[0] + h * st[1] + i * st[2] + d * st[3]) * isz;
            if (f64) {
              double x;
              std::memcpy(&x, e, sizeof x);
              ref.out.push_back(x);
            } else {
              float x;
              std::memcpy(&x, e, sizeof x);
              ref.out.push_back(x);
            }
          }
        }
  }
  AttentionProblem p;
  p.out = TensorView<float>(const_cast<float*>(a.view.data), a.view.shape, a.view.stride);
  p.v = TensorView<const float>(a.view.data, {s[0], 1, 1, s[3]}, {0, 0, 0, 1});  // d_v() only
  std::vector<float> al;
  if (approx_lse.has_value() != exact_lse.has_value())
    throw OptionError(approx_lse ? "exact_lse" : "approx_lse", "approx_lse and exact_lse go together");
  if (approx_lse) {
    std::int64_t n = s[0] * s[1] * s[2];
    auto flat = [&](const AnyArray& x, const char* name, auto push) {
      NUMATTN_CHECK(x.dtype() == nb::dtype<float>() || x.dtype() == nb::dtype<double>(),
                    "{}: must be float32 or float64", name);
      const std::int64_t size = static_cast<std::int64_t>(x.size());
      NUMATTN_CHECK(size == n, "{}: has {} values, expected one per row ({})", name, size, n);
      NUMATTN_CHECK(x.ndim() >= 1, "{}: must be an array", name);
      // C order over any strides.
      std::vector<std::int64_t> idx(x.ndim(), 0);
      for (std::int64_t t = 0; t < n; ++t) {
        std::int64_t off = 0;
        for (std::size_t d = 0; d < x.ndim(); ++d) off += idx[d] * x.stride(d);
        const auto* e = static_cast<const unsigned char*>(x.data()) + off * static_cast<std::int64_t>(x.itemsize());
        double val;
        if (x.dtype() == nb::dtype<double>()) std::memcpy(&val, e, sizeof val);
        else {
          float f;
          std::memcpy(&f, e, sizeof f);
          val = f;
        }
        push(val);
        for (int d = static_cast<int>(x.ndim()) - 1; d >= 0; --d) {
          if (++idx[static_cast<std::size_t>(d)] < static_cast<std::int64_t>(x.shape(static_cast<std::size_t>(d)))) break;
          idx[static_cast<std::size_t>(d)] = 0;
        }
      }
    };
    flat(*approx_lse, "approx_lse", [&](double x) { al.push_back(static_cast<float>(x)); });
    flat(*exact_lse, "exact_lse", [&](double x) { ref.lse.push_back(x); });
    p.lse = TensorView<float>::contiguous(al.data(), {s[0], s[1], s[2], 1});
  } else {
    ref.lse.assign(ref.rows.size(), 0.0);
  }
  const ErrorMetrics m = compare_with_reference(p, ref);
  nb::dict d;
  d["rel_fro_error"] = m.rel_fro_error;
  d["max_abs_error"] = m.max_abs_error;
  d["nmse"] = m.nmse;
  d["max_scaled_error"] = m.max_scaled_error;
  d["lse_max_abs_error"] = approx_lse ? nb::cast(m.lse_max_abs_error) : nb::none();
  d["finite"] = m.finite;
  d["rows_checked"] = m.rows_checked;
  return d;
}

constexpr const char* kProblemDoc = R"doc(
Arrays: ``q`` [B, Hq, Nq, Dk], ``k`` [B, Hkv, Nk, Dk], ``v`` [B, Hkv, Nk, Dv] (``layout="bnhd"``:
[B, N, H, D]); 2- and 3-d arrays get leading 1s. Any NumPy array or DLPack producer in host
memory, float32 or float64, any strides as long as the last axis is contiguous. float32 arrays
are read in place (no copy, strided views included); float64 ones are converted to float32
once (the kernels compute in float32). GQA/MQA: Hq % Hkv == 0, query head h reads kv head
h // (Hq // Hkv).
causal: False/"none", True/"top-left" (key j visible from query i iff j <= i), "bottom-right"
(j <= i + Nk - Nq, a KV-cache decode). mask: [Nq, Nk], bool or integer (nonzero = visible) or
float (additive, -inf hides the key), shared by batches and heads. scale: default 1/sqrt(Dk).
window: (left, right) keys about the causal diagonal, -1 = unbounded. threads: None = all
cores. A row with no visible key gives 0 and LSE -inf.
Errors: numattn.Error (a ValueError) naming the problem, numattn.NonFiniteInputError for a NaN
or infinity a query reads (attributes tensor, index), TypeError for a dtype or device numattn
cannot read. The GIL is released while it computes.)doc";

}  // namespace

void bind_attention(nb::module_& m) {
  m.def("attention", guarded("numattn.attention", &attention), nb::arg("q"), nb::arg("k"), nb::arg("v"),
        nb::arg("method") = "exact.flash", nb::kw_only(), nb::arg("causal") = false,
        nb::arg("mask") = nb::none(), nb::arg("scale") = nb::none(),
        nb::arg("window") = nb::none(), nb::arg("layout") = "bhnd", nb::arg("return_lse") = false,
        nb::arg("threads") = nb::none(), nb::arg("out").noconvert() = nb::none(),
        (std::string(R"doc(Attention through a registered method (numattn.methods()), the same
computation as ``numattn run --method SPEC --q q.npy --k k.npy --v v.npy`` (bit for bit at the
same thread count).

Returns the output as a float32 NumPy array shaped like ``q`` with Dv last (in ``layout``), or
``(out, lse)`` with ``return_lse=True`` (lse: float32 [B, Hq, Nq], natural log, with q's leading
dims). ``out=`` writes into a given float32 array of that shape instead (any strides, last axis
contiguous, not overlapping the inputs). The result supports DLPack
(``torch.from_dlpack(out)``).
Cost: the method's (``numattn.methods()``: time_complexity); exact.flash O(B·Hq·Nq·Nk·(Dk+Dv)).)doc") +
         kProblemDoc)
            .c_str());
  m.def("reference", guarded("numattn.reference", &reference), nb::arg("q"), nb::arg("k"), nb::arg("v"), nb::kw_only(),
        nb::arg("causal") = false, nb::arg("mask") = nb::none(), nb::arg("scale") = nb::none(),
        nb::arg("window") = nb::none(), nb::arg("layout") = "bhnd", nb::arg("return_lse") = false,
        nb::arg("threads") = nb::none(),
        (std::string(R"doc(The float64 oracle (``exact.reference``): softmax attention of the float32
inputs computed row by row in double precision (logits, running maximum, normaliser and output
all accumulate in float64; docs/numerics.md).

Returns a float64 array shaped like ``attention``'s output, or ``(out, lse)`` with
``return_lse=True`` (lse float64). Cost O(Nk·(Dk+Dv)) per query row, in rows of chunks between
which Ctrl-C is honoured.)doc") +
         kProblemDoc)
            .c_str());
  m.def("error", guarded("numattn.error", &error_metrics), nb::arg("approx"), nb::arg("exact"), nb::kw_only(),
        nb::arg("approx_lse") = nb::none(), nb::arg("exact_lse") = nb::none(),
        R"doc(Error metrics of a float32 result against the float64 reference, named as everywhere
in numattn (docs/numerics.md):

- ``rel_fro_error`` = ‖Ô − O‖_F / ‖O‖_F (0 when both are zero)
- ``max_abs_error`` = max |Ô − O|
- ``nmse`` = ‖Ô − O‖²_F / ‖O‖²_F
- ``max_scaled_error`` = max |Ô − O| / max(1, |O|)
- ``lse_max_abs_error`` = max |LSE^ − LSE| (equal infinities count as 0), when both LSEs are given
- ``finite`` (no NaN/inf in approx) and ``rows_checked``.

``approx``: float32, 2- to 4-d (last axis = Dv, contiguous); ``exact``: the same shape, float64
(``numattn.reference``) or float32. Returns a dict.)doc");
}

}  // namespace numattn::py
