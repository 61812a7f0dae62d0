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
#include "analysis/auto_select.h"
#include "numattn/analysis/estimate.h"
#include "numattn/analysis/metrics.h"
#include "numattn/attention/reference.h"
#include "numattn/attention/registry.h"
#include "numattn/core/memory.h"
#include "numattn/quant/quant.h"

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

// A q, k or v array as the problem reads it: float32 in place (float64 converted once), or
// float16 / bfloat16 in place, with `f32.view` giving shape and strides over a null pointer and
// `half_data` the elements (the HalfKv convention of problem.h).
struct QkvInput {
  Float32Input f32;
  KvType half = KvType::kF32;
  const std::uint16_t* half_data = nullptr;
  bool is_half() const { return half != KvType::kF32; }
};

// f16 / bf16 from a DLPack dtype; kF32 for anything else.
KvType half_type(nb::dlpack::dtype dt) {
  const auto code = static_cast<nb::dlpack::dtype_code>(dt.code);
  if (dt.bits == 16 && dt.lanes == 1 && code == nb::dlpack::dtype_code::Float) return KvType::kF16;
  if (dt.bits == 16 && dt.lanes == 1 && code == nb::dlpack::dtype_code::Bfloat) return KvType::kBf16;
  return KvType::kF32;
}

QkvInput read_qkv(const AnyArray& a, const char* name, Layout layout) {
  QkvInput in;
  in.half = half_type(a.dtype());
  if (!in.is_half()) {
    if (a.dtype() != nb::dtype<float>() && a.dtype() != nb::dtype<double>() && a.device_type() == nb::device::cpu::value)
      throw nb::type_error(fmt::format("{}: dtype {} is not supported: pass float32 (read in place), "
                                       "float16 or bfloat16 (read in place by methods that can, else "
                                       "converted) or float64 (converted to float32)",
                                       name, dtype_name(a.dtype()))
                               .c_str());
    in.f32 = as_f32_input(a, name, layout);
    return in;
  }
  if (a.device_type() != nb::device::cpu::value)
    throw nb::type_error(fmt::format("{}: the array is not in host memory; numattn computes on the CPU: "
                                     "copy it to the host first (e.g. tensor.cpu())", name).c_str());
  const auto r = static_cast<int>(a.ndim());
  NUMATTN_CHECK(r >= 2 && r <= 4, "{}: expected a 2-, 3- or 4-d array, got {} dims", name, r);
  NUMATTN_CHECK(a.shape(static_cast<std::size_t>(r - 1)) <= 1 || a.stride(static_cast<std::size_t>(r - 1)) == 1,
                "{}: the last axis must be contiguous (stride 1 element), got stride {}", name,
                a.stride(static_cast<std::size_t>(r - 1)));
  NUMATTN_CHECK(reinterpret_cast<std::uintptr_t>(a.data()) % alignof(std::uint16_t) == 0,
                "{}: the buffer is not aligned for 16-bit elements", name);
  std::array<index_t, 4> ms{1, 1, 1, 1}, st{0, 0, 0, 1};
  std::vector<std::int64_t> shape(a.ndim()), strides(a.ndim());
  for (int i = 0; i < r; ++i) {
    const auto u = static_cast<std::size_t>(i);
    shape[u] = static_cast<std::int64_t>(a.shape(u));
    strides[u] = a.stride(u);
    ms[static_cast<std::size_t>(4 - r + i)] = shape[u];
    st[static_cast<std::size_t>(4 - r + i)] = strides[u];
  }
  st[3] = 1;
  for (int i = 3 - r; i >= 0; --i) st[static_cast<std::size_t>(i)] = ms[static_cast<std::size_t>(i + 1)] * st[static_cast<std::size_t>(i + 1)];
  in.f32.rank = r;
  in.f32.mem = mem_span(a.data(), shape, strides, 2);
  in.f32.view = layout == Layout::kBNHD
                    ? TensorView<const float>(nullptr, {ms[0], ms[2], ms[1], ms[3]}, {st[0], st[2], st[1], st[3]})
                    : TensorView<const float>(nullptr, ms, st);
  in.half_data = static_cast<const std::uint16_t*>(a.data());
  return in;
}

// A half-precision input as a contiguous float32 copy (exact: every half value is a float32),
// for the arrays the problem cannot read in half precision.
void widen_input(QkvInput& in, const char* name) {
  if (!in.is_half()) return;
  const auto s = in.f32.view.shape;
  const auto st = in.f32.view.stride;
  reserve_array(fmt::format("{} converted to float32", name), {s[0], s[1], s[2], s[3]}, sizeof(float));
  in.f32.copy.resize(static_cast<std::size_t>(s[0] * s[1] * s[2] * s[3]));
  float* dst = in.f32.copy.data();
  for (index_t b = 0; b < s[0]; ++b)
    for (index_t h = 0; h < s[1]; ++h)
      for (index_t n = 0; n < s[2]; ++n, dst += s[3])
        widen_row(in.half_data + b * st[0] + h * st[1] + n * st[2], in.half, s[3], dst);
  in.f32.view = TensorView<const float>::contiguous(in.f32.copy.data(), s);
  in.f32.copied = true;
  in.half = KvType::kF32;
  in.half_data = nullptr;
}

// The half-precision q / out pointers of the slice of `p` that starts at batch b, query head h
// (for_each_slice: a per-(batch, head) mask that the method cannot read whole).
void offset_half_io(AttentionProblem& s, const AttentionProblem& p, index_t b, index_t h) {
  if (p.half_q.data) s.half_q.data = p.half_q.data + b * p.q.stride[0] + h * p.q.stride[1];
  if (p.half_out.data) s.half_out.data = p.half_out.data + b * p.out.stride[0] + h * p.out.stride[1];
}

// Inputs of one problem, kept alive while it runs: the views point into the caller's arrays or
// into the copies held here.
struct Inputs {
  QkvInput q, k, v;
  Layout layout = Layout::kBHND, out_layout = Layout::kBHND;
  std::vector<std::uint8_t> bool_mask;
  std::vector<float> add_mask;
  MemSpan mask_mem;  // the caller's mask when read in place
  // The mask's strides over batch and query head (elements; 0 = the same for all). The problem's
  // Mask has one [Nq, Nk] plane: a mask that differs across batches or heads is run one
  // (batch, head) slice at a time (for_each_slice).
  index_t mask_sb = 0, mask_sh = 0;
  AttentionProblem p;  // q, k, v, scale, causal, mask, window (out/lse set by the caller)
};

// The mask broadcast against [B, Hq, Nq, Nk] with NumPy's rules (trailing axes aligned, an axis
// of 1 repeats): read in place when its dtype is bool or float32 and its rows are contiguous
// keys, else converted once into a buffer that keeps its broadcast axes at length 1.
void read_mask(Inputs& in, const AnyArray& m) {
  AttentionProblem& p = in.p;
  if (m.device_type() != nb::device::cpu::value)
    throw nb::type_error("mask: the array is not in host memory; copy it to the host first");
  const std::array<index_t, 4> full{p.q.shape[0], p.q.shape[1], p.q.shape[2], p.k.shape[2]};
  const int r = static_cast<int>(m.ndim());
  std::vector<std::int64_t> mshape(m.ndim());
  for (std::size_t i = 0; i < m.ndim(); ++i) mshape[i] = static_cast<std::int64_t>(m.shape(i));
  NUMATTN_CHECK_OPTION(r >= 2 && r <= 4, "mask",
                       "must be 2-, 3- or 4-d, broadcastable to [B, Hq, Nq, Nk] = [{}], got shape [{}]",
                       fmt::join(full, ", "), fmt::join(mshape, ", "));
  std::array<index_t, 4> ms{1, 1, 1, 1}, st{0, 0, 0, 0};
  for (int i = 0; i < r; ++i) {
    const auto a = static_cast<std::size_t>(4 - r + i);
    ms[a] = mshape[static_cast<std::size_t>(i)];
    st[a] = ms[a] == 1 ? 0 : m.stride(static_cast<std::size_t>(i));
    NUMATTN_CHECK_OPTION(ms[a] == 1 || ms[a] == full[a], "mask",
                         "shape [{}] does not broadcast to [B, Hq, Nq, Nk] = [{}] (each axis must be 1 "
                         "or the problem's; h is the query head)",
                         fmt::join(mshape, ", "), fmt::join(full, ", "));
  }
  const index_t nq = full[2], nk = full[3];
  const auto dt = m.dtype();
  const auto code = static_cast<nb::dlpack::dtype_code>(dt.code);
  const bool is_bool = code == nb::dlpack::dtype_code::Bool || code == nb::dlpack::dtype_code::Int ||
                       code == nb::dlpack::dtype_code::UInt;
  const bool f32 = dt == nb::dtype<float>(), f64 = dt == nb::dtype<double>();
  const KvType h16 = half_type(dt);
  if (!is_bool && !f32 && !f64 && h16 == KvType::kF32)
    throw nb::type_error("mask: dtype not supported: pass bool or integer (nonzero = visible) or "
                         "float16/bfloat16/float32/float64 (additive: added to the logit, -inf hides the key)");
  // In place: one element per key (stride 1 along Nk), rows at least Nk apart (or one row), and
  // a dtype the kernels read.
  const bool rows_ok = (nk <= 1 || st[3] == 1) && (ms[3] == nk) &&
                       (nq == 1 || (ms[2] == nq && st[2] >= nk) || ms[2] == 1);
  const bool aligned = reinterpret_cast<std::uintptr_t>(m.data()) % alignof(float) == 0;
  in.mask_sb = st[0];
  in.mask_sh = st[1];
  const index_t ld = nq == 1 ? nk : st[2];
  if (rows_ok && is_bool && code == nb::dlpack::dtype_code::Bool && dt.bits == 8) {
    p.mask = {MaskKind::kBool, static_cast<const std::uint8_t*>(m.data()), nullptr, ld};
  } else if (rows_ok && f32 && aligned) {
    p.mask = {MaskKind::kAdditive, nullptr, static_cast<const float*>(m.data()), ld};
  } else {
    // The converted copy: [Bm, Hm, Nq, Nk] with Bm, Hm the mask's own (1 where it broadcasts).
    const index_t bm = ms[0], hm = ms[1];
    const index_t plane = nq * nk;
    const std::size_t count = static_cast<std::size_t>(bm * hm * plane);
    // The copy's shape as the caller wrote the mask (its rank), for messages.
    const std::vector<std::int64_t> full_copy{bm, hm, nq, nk};
    const std::vector<std::int64_t> copy_shape(full_copy.end() - r, full_copy.end());
    auto at = [&](index_t b, index_t h, index_t i, index_t j) {
      return static_cast<const unsigned char*>(m.data()) +
             (b * st[0] + h * st[1] + i * st[2] + j * st[3]) * static_cast<index_t>(m.itemsize());
    };
    if (is_bool) {
      reserve_array("the mask as bool", copy_shape, 1);
      in.bool_mask.resize(count);
      const auto isz = m.itemsize();
      std::size_t o = 0;
      for (index_t b = 0; b < bm; ++b)
        for (index_t h = 0; h < hm; ++h)
          for (index_t i = 0; i < nq; ++i)
            for (index_t j = 0; j < nk; ++j) {
              const unsigned char* e = at(b, h, i, j);
              bool nz = false;
              for (std::size_t t = 0; t < isz; ++t) nz = nz || e[t] != 0;
              in.bool_mask[o++] = nz;
            }
      p.mask = {MaskKind::kBool, in.bool_mask.data(), nullptr, nk};
    } else {
      reserve_array("the mask as float32", copy_shape, 4);
      in.add_mask.resize(count);
      std::size_t o = 0;
      for (index_t b = 0; b < bm; ++b)
        for (index_t h = 0; h < hm; ++h)
          for (index_t i = 0; i < nq; ++i)
            for (index_t j = 0; j < nk; ++j) {
              const unsigned char* e = at(b, h, i, j);
              float x;
              if (f64) {
                double d;
                std::memcpy(&d, e, sizeof d);
                x = static_cast<float>(d);
              } else if (h16 != KvType::kF32) {
                std::uint16_t u;
                std::memcpy(&u, e, sizeof u);
                widen_row(&u, h16, 1, &x);
              } else {
                std::memcpy(&x, e, sizeof x);
              }
              in.add_mask[o++] = x;
            }
      p.mask = {MaskKind::kAdditive, nullptr, in.add_mask.data(), nk};
    }
    in.mask_sb = bm == 1 ? 0 : hm * plane;
    in.mask_sh = hm == 1 ? 0 : plane;
    p.mask.stride_b = in.mask_sb, p.mask.stride_h = in.mask_sh;
    return;
  }
  p.mask.stride_b = in.mask_sb, p.mask.stride_h = in.mask_sh;
  std::vector<std::int64_t> sts(m.ndim());
  for (std::size_t i = 0; i < m.ndim(); ++i) sts[i] = m.stride(i);
  in.mask_mem = mem_span(m.data(), mshape, sts, m.itemsize());
}

void read_inputs(Inputs& in, const AnyArray& q, const AnyArray& k, const AnyArray& v,
                 const CausalArg& causal, const std::optional<AnyArray>& mask,
                 std::optional<double> scale, const Window& window, const std::string& layout,
                 const std::optional<std::string>& out_layout = std::nullopt, bool native_half_q = false) {
  in.layout = layout_option(layout);
  in.out_layout = in.layout;
  if (out_layout) {
    try {
      in.out_layout = parse_layout(*out_layout);
    } catch (const Error& e) {
      throw OptionError("out_layout", e.what());
    }
  }
  in.q = read_qkv(q, "q", in.layout);
  in.k = read_qkv(k, "k", in.layout);
  in.v = read_qkv(v, "v", in.layout);
  // Half-precision K and V are read in place when both have the same type (HalfKv); q in half
  // precision too where the library reads it (HalfQ) and the caller asks for it, else it is
  // widened.
  AttentionProblem& p = in.p;
  if (native_half_q && in.q.is_half()) p.half_q = HalfQ{in.q.half, in.q.half_data};
  else widen_input(in.q, "q");
  if (in.k.half != in.v.half) {
    widen_input(in.k, "k");
    widen_input(in.v, "v");
  }
  p.q = in.q.f32.view;
  p.k = in.k.f32.view;
  p.v = in.v.f32.view;
  if (in.k.is_half()) p.half = {in.k.half, in.k.half_data, in.v.half_data};
  p.scale = scale;
  p.causal = to_causal(causal);
  if (window) {
    NUMATTN_CHECK_OPTION(window->first >= -1 && window->second >= -1, "window",
                         "({}, {}): each side is a key count >= 0, or -1 for unbounded",
                         window->first, window->second);
    p.window_left = window->first;
    p.window_right = window->second;
  }
  if (mask) read_mask(in, *mask);
}

// Calls f(sub-problem, b0, h0) for each slice of `p` over which the mask is one [Nq, Nk] plane:
// `p` itself when the mask is shared by all batches and heads, or when the library reads a mask
// per (batch, head) and `m` (null: the float64 reference) can run it; else one slice per batch
// (and per query head when the mask differs across heads; the slice reads kv head h / group).
template <class F>
void for_each_slice(const Inputs& in, const AttentionProblem& p, const AttentionMethod* m, F&& f) {
  if ((in.mask_sb == 0 && in.mask_sh == 0) ||
      m == nullptr || m->can_run(p).is_ok()) {
    f(p, index_t{0}, index_t{0});
    return;
  }
  const index_t nb = in.mask_sb != 0 ? p.batch() : 1, nh = in.mask_sh != 0 ? p.heads() : 1;
  const index_t bs = in.mask_sb != 0 ? 1 : p.batch(), hs = in.mask_sh != 0 ? 1 : p.heads();
  auto slice = [](auto view, index_t b, index_t h, index_t bn, index_t hn) {
    auto* d = view.data ? view.data + b * view.stride[0] + h * view.stride[1] : view.data;
    return decltype(view)(d, {bn, hn, view.shape[2], view.shape[3]}, view.stride);
  };
  for (index_t b = 0; b < nb; ++b)
    for (index_t h = 0; h < nh; ++h) {
      AttentionProblem s = p;
      const index_t hk = in.mask_sh != 0 ? h / p.group() : 0, hks = in.mask_sh != 0 ? 1 : p.kv_heads();
      s.q = slice(p.q, b, h, bs, hs);
      s.k = slice(p.k, b, hk, bs, hks);
      s.v = slice(p.v, b, hk, bs, hks);
      s.out = slice(p.out, b, h, bs, hs);
      if (p.lse.data) s.lse = slice(p.lse, b, h, bs, hs);
      if (p.half_kv()) {
        s.half.k = p.half.k + b * p.k.stride[0] + hk * p.k.stride[1];
        s.half.v = p.half.v + b * p.v.stride[0] + hk * p.v.stride[1];
      }
      offset_half_io(s, p, b, h);
      const index_t off = b * in.mask_sb + h * in.mask_sh;
      if (s.mask.allowed) s.mask.allowed += off;
      if (s.mask.additive) s.mask.additive += off;
      s.mask.stride_b = 0, s.mask.stride_h = 0;
      f(static_cast<const AttentionProblem&>(s), b, h);
    }
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
  std::vector<std::int64_t> full = in.out_layout == Layout::kBHND
                                       ? std::vector<std::int64_t>{s[0], s[1], s[2], dv}
                                       : std::vector<std::int64_t>{s[0], s[2], s[1], dv};
  return {full.end() - in.q.f32.rank, full.end()};
}
std::vector<std::int64_t> lse_shape(const Inputs& in) {
  const auto& s = in.p.q.shape;
  const std::vector<std::int64_t> full{s[0], s[1], s[2]};
  return {full.end() - (in.q.f32.rank - 1), full.end()};
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
  if (in.out_layout == Layout::kBNHD)
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
    const Float32Input& t = (e.tensor() == "q" ? in.q : e.tensor() == "k" ? in.k : in.v).f32;
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

// Rounds the float32 result `src` (logical [B, H, Nq, Dv], contiguous) into the caller's
// half-precision output `dst` (logical view over 16-bit elements, data = the caller's memory).
void round_output(const TensorView<const float>& src, const TensorView<float>& dst_shape, std::uint16_t* dst,
                  KvType type) {
  const auto& s = src.shape;
  const auto& st = dst_shape.stride;
  for (index_t b = 0; b < s[0]; ++b)
    for (index_t h = 0; h < s[1]; ++h)
      for (index_t n = 0; n < s[2]; ++n) {
        const float* r = src.data + b * src.stride[0] + h * src.stride[1] + n * src.stride[2];
        std::uint16_t* o = dst + b * st[0] + h * st[1] + n * st[2];
        for (index_t d = 0; d < s[3]; ++d) o[d] = type == KvType::kF16 ? fp32_to_fp16(r[d]) : fp32_to_bf16(r[d]);
      }
}

nb::object attention(const AnyArray& q, const AnyArray& k, const AnyArray& v,
                     const std::string& method, const CausalArg& causal,
                     const std::optional<AnyArray>& mask, std::optional<double> scale,
                     const Window& window, const std::string& layout, bool return_lse,
                     std::optional<int> threads, std::optional<nb::ndarray<>> out,
                     const std::optional<std::string>& out_layout, bool return_info,
                     std::optional<std::int64_t> estimate_rows) {
  const ExecContext ctx{threads.value_or(0)};
  ctx.num_threads();  // refuses a bad count before any work
  NUMATTN_CHECK_OPTION(!estimate_rows || *estimate_rows >= 0, "estimate_rows",
                       "{}: a row count >= 1, or 0 for the automatic max(32, sqrt(B*Hq*Nq))",
                       estimate_rows.value_or(0));
  std::unique_ptr<AttentionMethod> m;
  try {
    m = create_method(method);
  } catch (const OptionError&) {
    throw;
  } catch (const Error& e) {
    throw OptionError("method", e.what());
  }
  // Half-precision q and out are handed to the library as they are, except for an error
  // estimate, whose float64 rows compare a float32 output.
  const bool native_half = !estimate_rows;
  Inputs in;
  read_inputs(in, q, k, v, causal, mask, scale, window, layout, out_layout, native_half);
  AttentionProblem& p = in.p;
  const index_t dv = p.v.shape[3];
  const std::vector<std::int64_t> oshape = memory_shape(in, dv);
  doing(fmt::format("preparing {} on {}", m->spec(), in_shapes(in)));
  validate_before_output(p);
  nb::object result;
  // A half-precision out= is computed into float32 and rounded once into the caller's array.
  std::vector<float> out32;
  std::uint16_t* out16 = nullptr;
  KvType out_type = KvType::kF32;
  TensorView<float> out16_view;
  if (out) {
    const nb::ndarray<>& o = *out;
    out_type = half_type(o.dtype());
    if (o.device_type() != nb::device::cpu::value || (o.dtype() != nb::dtype<float>() && out_type == KvType::kF32))
      throw nb::type_error("out: must be a writable float32, float16 or bfloat16 array in host memory");
    const std::size_t isz = out_type == KvType::kF32 ? sizeof(float) : 2;
    std::vector<std::int64_t> shape(o.ndim()), strides(o.ndim());
    for (std::size_t i = 0; i < o.ndim(); ++i) shape[i] = static_cast<std::int64_t>(o.shape(i)), strides[i] = o.stride(i);
    NUMATTN_CHECK_OPTION(shape == oshape, "out", "must have shape [{}] (q's rank, out_layout, Dv of v), got [{}]",
                         fmt::join(oshape, ", "), fmt::join(shape, ", "));
    NUMATTN_CHECK_OPTION(o.ndim() == 0 || shape.back() <= 1 || strides.back() == 1, "out",
                         "the last axis must be contiguous (stride 1), got stride {}", strides.back());
    NUMATTN_CHECK_OPTION(reinterpret_cast<std::uintptr_t>(o.data()) % isz == 0, "out",
                         "the buffer is not aligned for its element type");
    // Every element of out is written once, by one thread, while q, k, v are read: two
    // elements of out on the same memory (a stride of 0, axes that interleave) would race and
    // keep whichever write came last, and out on an input's memory would change what is read.
    NUMATTN_CHECK_OPTION(!may_self_overlap(shape, strides, isz), "out",
                         "its elements overlap one another (strides [{}] over shape [{}], in elements): "
                         "pass an array whose elements are distinct memory, e.g. numpy.empty",
                         fmt::join(strides, ", "), fmt::join(shape, ", "));
    const MemSpan om = mem_span(o.data(), shape, strides, isz);
    for (const auto* t : {&in.q, &in.k, &in.v})
      if (!t->f32.copied)
        NUMATTN_CHECK_OPTION(!om.overlaps(t->f32.mem), "out",
                             "shares memory with {}: the output must not overlap an input",
                             t == &in.q ? "q" : t == &in.k ? "k" : "v");
    NUMATTN_CHECK_OPTION(!om.overlaps(in.mask_mem), "out",
                         "shares memory with the mask: the output must not overlap an input");
    if (out_type == KvType::kF32) {
      p.out = logical_view(static_cast<float*>(o.data()), in, shape, strides);
    } else if (native_half) {
      p.half_out = HalfOut{out_type, static_cast<std::uint16_t*>(o.data())};
      p.out = logical_view(static_cast<float*>(nullptr), in, shape, strides);
    } else {
      out16 = static_cast<std::uint16_t*>(o.data());
      out16_view = logical_view(static_cast<float*>(nullptr), in, shape, strides);
      const auto& ls = out16_view.shape;
      reserve_array("the float32 output before rounding", {ls[0], ls[1], ls[2], ls[3]}, sizeof(float));
      out32.resize(static_cast<std::size_t>(ls[0] * ls[1] * ls[2] * ls[3]));
      p.out = TensorView<float>::contiguous(out32.data(), ls);
    }
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
  // Half-precision K/V go to the methods that read them (Capabilities::half_kv) as they are, to
  // the others through widen_kv (only the keys some query row sees are converted).
  std::optional<WidenedKv> widened;
  const bool widen = p.half_kv() && !m->info().caps.half_kv;
  // The method's own scratch, as it declares it (the exact kernels: a few rows per thread).
  reserve(m->workspace_bytes(p, ctx), fmt::format("the workspace of {} on {}", m->spec(), p.describe()));
  doing(fmt::format("running {} on {}", m->spec(), p.describe()));
  if (PyErr_CheckSignals() != 0) throw nb::python_error();
  std::string chosen = m->spec();
  std::optional<ErrorEstimate> est;
  run_released(in, [&] {
    const AttentionProblem* run_p = &p;
    if (widen) {
      widened.emplace(widen_kv(p));
      run_p = &widened->problem;
    }
    for_each_slice(in, *run_p, m.get(), [&](const AttentionProblem& s, index_t, index_t) { m->run(s, ctx); });
    if (return_info) {
      if (const auto* a = dynamic_cast<const AutoSelectAttention*>(m.get())) chosen = a->choose(*run_p, ctx)->spec();
      if (estimate_rows) {
        // The estimate samples rows of the whole problem: with a mask that differs across
        // batches or heads it is taken per slice and the slices' bounds are not combined, so
        // it is refused there (below).
        if (in.mask_sb == 0 && in.mask_sh == 0) {
          ErrorEstimateOptions opt;
          opt.rows = static_cast<index_t>(*estimate_rows);
          // The float64 rows read float32 K/V: half-precision ones are widened for them.
          if (run_p->half_kv()) {
            const WidenedKv w = widen_kv(*run_p);
            est = estimate_error(w.problem, opt, ctx);
          } else {
            est = estimate_error(*run_p, opt, ctx);
          }
        }
      }
    }
    if (out16) round_output(p.out, out16_view, out16, out_type);
  });
  if (PyErr_CheckSignals() != 0) throw nb::python_error();
  if (!return_info) {
    if (return_lse) return nb::make_tuple(result, lse_obj);
    return result;
  }
  nb::dict info;
  info["method"] = chosen;
  if (estimate_rows) {
    NUMATTN_CHECK_OPTION(est.has_value(), "estimate_rows",
                         "an error estimate needs a mask shared by all batches and heads (this one "
                         "differs across them)");
    info["est_rel_error"] = est->rel_error;
    info["est_rel_error_hi"] = est->rel_error_hi;
    info["est_rows"] = est->rows;
    info["est_level"] = est->level;
  }
  if (return_lse) return nb::make_tuple(result, lse_obj, info);
  return nb::make_tuple(result, info);
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
  if (p.half_kv()) {  // the float64 rows read float32 K/V (every half value is a float32)
    widen_input(in.k, "k");
    widen_input(in.v, "v");
    p.k = in.k.f32.view;
    p.v = in.v.f32.view;
    p.half = {};
  }
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
  run_released(in, [&] {
    for_each_slice(in, p, nullptr, [&](const AttentionProblem& sp, index_t b0, index_t h0) {
      reference_rows(sp, ctx, o.data() + b0 * st[0] + h0 * st[1], st,
                     lse ? lse + (b0 * p.heads() + h0) * p.n_q() : nullptr);
    });
  });
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
memory, float32, float64, float16 or bfloat16, any strides as long as the last axis is
contiguous. float32 arrays are read in place (no copy, strided views included); float64 ones are
converted to float32 once (the kernels compute in float32); float16/bfloat16 K and V (both of
one type) are read in place by the methods that can (exact.flash and the flash-based ones) and
converted for the others; float16/bfloat16 q (and out=) go to the library as they are where it
reads them, else q is converted to float32 and the float32 output rounded once. GQA/MQA: Hq % Hkv == 0,
query head h reads kv head h // (Hq // Hkv).
causal: False/"none", True/"top-left" (key j visible from query i iff j <= i), "bottom-right"
(j <= i + Nk - Nq, a KV-cache decode). mask: broadcastable to [B, Hq, Nq, Nk] by NumPy's rules
(2-d [Nq, Nk], 3-d [Hq, Nq, Nk], 4-d; an axis of 1 repeats; h is the query head), bool or integer
(nonzero = visible) or float (additive, -inf hides the key); bool and float32 masks whose rows
are contiguous keys are read in place, other dtypes converted once. A mask that differs across
batches or heads goes to the method as it is where the method reads such masks, else the method
runs one (batch, head) slice at a time. scale: default 1/sqrt(Dk).
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
        nb::arg("out_layout") = nb::none(), nb::arg("return_info") = false,
        nb::arg("estimate_rows") = nb::none(),
        (std::string(R"doc(Attention through a registered method (numattn.methods()), the same
computation as ``numattn run --method SPEC --q q.npy --k k.npy --v v.npy`` (bit for bit at the
same thread count).

Returns the output as a float32 NumPy array shaped like ``q`` with Dv last (in ``out_layout``,
default ``layout``), or ``(out, lse)`` with ``return_lse=True`` (lse: float32 [B, Hq, Nq], natural
log, with q's leading dims). ``out=`` writes into a given array of that shape instead: float32,
or float16/bfloat16 (computed in float32, rounded to nearest even once), any strides, last axis
contiguous, not overlapping the inputs. The result supports DLPack (``torch.from_dlpack(out)``).
``return_info=True`` appends a dict: ``method`` (the spec that ran; for ``auto(tol=E)`` the
method it chose for this shape) and, with ``estimate_rows`` (0 = max(32, sqrt(B·Hq·Nq))), the
a-posteriori error estimate of this output against float64 softmax attention from that many rows
computed exactly: ``est_rel_error``, ``est_rel_error_hi`` (one-sided bound at ``est_level`` =
0.95), ``est_rows`` (analysis/estimate.h; cost O(rows·Nk·(Dk+Dv))).
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
  m.def(
      "release_scratch_memory", [] { return numattn::release_scratch_memory(); },
      R"doc(Frees the scratch block numattn keeps between calls and returns its size in bytes.

A call that needs a large temporary block (exact.flash packing strided float32 K/V, as
``numattn.torch`` receives them from a [B, N, H, D] tensor) keeps it afterwards, one block of at
most 1 GiB or a quarter of the available memory, so that the next call (the next layer) does
not fault in fresh pages; this returns it to the system.)doc");
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
