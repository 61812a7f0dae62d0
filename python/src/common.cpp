#include "common.h"

#include <algorithm>
#include <cctype>
#include <cstdlib>
#include <cstring>

#include <fmt/format.h>

#include "numattn/attention/problem.h"
#include "numattn/core/error.h"
#include "numattn/core/memory.h"

namespace numattn::py {

Layout layout_option(const std::string& s) {
  try {
    return parse_layout(s);
  } catch (const Error& e) {
    throw OptionError("layout", e.what());
  }
}

std::string dtype_name(nb::dlpack::dtype t) {
  const char* kind = "?";
  switch (static_cast<nb::dlpack::dtype_code>(t.code)) {
    case nb::dlpack::dtype_code::Int: kind = "int"; break;
    case nb::dlpack::dtype_code::UInt: kind = "uint"; break;
    case nb::dlpack::dtype_code::Float: kind = "float"; break;
    case nb::dlpack::dtype_code::Bfloat: kind = "bfloat"; break;
    case nb::dlpack::dtype_code::Complex: kind = "complex"; break;
    case nb::dlpack::dtype_code::Bool: return "bool";
    default: break;
  }
  return fmt::format("{}{}", kind, t.bits);
}

namespace {

void check_cpu(const AnyArray& a, const char* name) {
  if (a.device_type() != nb::device::cpu::value)
    throw nb::type_error(fmt::format("{}: the array is not in host memory (DLPack device type {}); "
                                     "numattn computes on the CPU: copy it to the host first "
                                     "(e.g. tensor.cpu())",
                                     name, a.device_type())
                             .c_str());
}

std::vector<std::int64_t> shape_of(const AnyArray& a) {
  std::vector<std::int64_t> v(a.ndim());
  for (std::size_t i = 0; i < a.ndim(); ++i) v[i] = static_cast<std::int64_t>(a.shape(i));
  return v;
}
std::vector<std::int64_t> strides_of(const AnyArray& a) {
  std::vector<std::int64_t> v(a.ndim());
  for (std::size_t i = 0; i < a.ndim(); ++i) v[i] = a.stride(i);
  return v;
}

thread_local Activity* t_activity = nullptr;

}  // namespace

Float32Input as_f32_input(const AnyArray& a, const char* name, Layout layout) {
  check_cpu(a, name);
  const nb::dlpack::dtype dt = a.dtype();
  const bool f32 = dt == nb::dtype<float>(), f64 = dt == nb::dtype<double>();
  if (!f32 && !f64)
    throw nb::type_error(fmt::format("{}: dtype {} is not supported: pass float32 (read in place) "
                                     "or float64 (converted to float32)",
                                     name, dtype_name(dt))
                             .c_str());
  const auto r = static_cast<int>(a.ndim());
  NUMATTN_CHECK(r >= 2 && r <= 4,
                "{}: expected a 2-, 3- or 4-d array ([N,D], [H,N,D] or [B,H,N,D]; with "
                "layout='bnhd' [N,H,D] or [B,N,H,D]), got {} dims",
                name, r);
  NUMATTN_CHECK(a.shape(static_cast<std::size_t>(r - 1)) <= 1 || a.stride(static_cast<std::size_t>(r - 1)) == 1,
                "{}: the last axis must be contiguous (stride 1 element), got stride {}: the "
                "kernels read rows of D values; pass numpy.ascontiguousarray({})",
                name, a.stride(static_cast<std::size_t>(r - 1)), name);
  // Memory shape/strides in elements, leading 1s for missing dims.
  std::array<index_t, 4> ms{1, 1, 1, 1}, mst{0, 0, 0, 1};
  for (int i = 0; i < r; ++i) {
    ms[static_cast<std::size_t>(4 - r + i)] = static_cast<index_t>(a.shape(static_cast<std::size_t>(i)));
    mst[static_cast<std::size_t>(4 - r + i)] = a.stride(static_cast<std::size_t>(i));
  }
  mst[3] = 1;  // a last axis of length <= 1 may carry any stride
  for (int i = 3 - r; i >= 0; --i) mst[static_cast<std::size_t>(i)] = ms[static_cast<std::size_t>(i + 1)] * mst[static_cast<std::size_t>(i + 1)];
  Float32Input in;
  in.rank = r;
  in.mem = mem_span(a.data(), shape_of(a), strides_of(a), a.itemsize());
  const bool aligned = reinterpret_cast<std::uintptr_t>(a.data()) % alignof(float) == 0;
  auto logical = [&](const float* p, std::array<index_t, 4> st) {
    // Memory [B,N,H,D] seen as [B,H,N,D]: swap the middle axes (TensorView::bnhd, any strides).
    if (layout == Layout::kBNHD)
      return TensorView<const float>(p, {ms[0], ms[2], ms[1], ms[3]}, {st[0], st[2], st[1], st[3]});
    return TensorView<const float>(p, ms, st);
  };
  if (f32 && aligned) {
    in.view = logical(static_cast<const float*>(a.data()), mst);
    return in;
  }
  // float64 (or a misaligned float32 buffer): one converted C-order copy of the memory shape.
  in.copied = true;
  reserve_array(fmt::format("{} converted to float32", name), {ms.begin() + (4 - r), ms.end()}, sizeof(float));
  in.copy.resize(static_cast<std::size_t>(ms[0] * ms[1] * ms[2] * ms[3]));
  const auto* base = static_cast<const unsigned char*>(a.data());
  const auto isz = static_cast<index_t>(a.itemsize());
  std::size_t at = 0;
  for (index_t i0 = 0; i0 < ms[0]; ++i0)
    for (index_t i1 = 0; i1 < ms[1]; ++i1)
      for (index_t i2 = 0; i2 < ms[2]; ++i2) {
        const unsigned char* row = base + (i0 * mst[0] + i1 * mst[1] + i2 * mst[2]) * isz;
        for (index_t i3 = 0; i3 < ms[3]; ++i3) {
          if (f64) {
            double x;
            std::memcpy(&x, row + i3 * isz, sizeof x);
            in.copy[at++] = static_cast<float>(x);
          } else {
            std::memcpy(&in.copy[at++], row + i3 * isz, sizeof(float));
          }
        }
      }
  in.view = logical(in.copy.data(), {ms[1] * ms[2] * ms[3], ms[2] * ms[3], ms[3], 1});
  return in;
}

void check_f64_matrix(const AnyArray& a, const char* name, std::int64_t& rows, std::int64_t& cols) {
  check_cpu(a, name);
  const nb::dlpack::dtype dt = a.dtype();
  if (dt != nb::dtype<float>() && dt != nb::dtype<double>())
    throw nb::type_error(
        fmt::format("{}: dtype {} is not supported: pass float64 or float32", name, dtype_name(dt)).c_str());
  NUMATTN_CHECK(a.ndim() == 2, "{}: expected a 2-d array (a matrix), got {} dims", name, a.ndim());
  rows = static_cast<std::int64_t>(a.shape(0));
  cols = static_cast<std::int64_t>(a.shape(1));
}

void copy_f64_matrix(const AnyArray& a, double* dst) {
  const bool f64 = a.dtype() == nb::dtype<double>();
  const auto rows = static_cast<std::int64_t>(a.shape(0)), cols = static_cast<std::int64_t>(a.shape(1));
  const auto* base = static_cast<const unsigned char*>(a.data());
  const auto isz = static_cast<std::int64_t>(a.itemsize());
  for (std::int64_t i = 0; i < rows; ++i)
    for (std::int64_t j = 0; j < cols; ++j) {
      const unsigned char* p = base + (i * a.stride(0) + j * a.stride(1)) * isz;
      if (f64) {
        std::memcpy(&dst[i * cols + j], p, sizeof(double));
      } else {
        float x;
        std::memcpy(&x, p, sizeof x);
        dst[i * cols + j] = x;
      }
    }
}

template <class T>
NpArray<T> new_array(const std::vector<std::int64_t>& shape, std::string_view what) {
  reserve_array(what, shape, sizeof(T));
  std::size_t n = 1;
  for (auto s : shape) n *= static_cast<std::size_t>(s);  // checked by reserve_array
  // malloc, not calloc: a freed output's memory is reused by the next call's (glibc raises its
  // mmap threshold to a freed block's size), so repeated calls touch warm pages as the CLI's
  // reused buffers do; calloc hands out fresh zero pages whose first-touch faults land in the
  // kernel's time (≈3% of a 157 ms exact.flash call at B=1, H=8, N=4096, D=64).
  T* data = static_cast<T*>(std::malloc(std::max<std::size_t>(n, 1) * sizeof(T)));
  if (!data) throw std::bad_alloc();
  nb::capsule owner(data, [](void* p) noexcept { std::free(p); });
  std::vector<std::size_t> sh(shape.begin(), shape.end());
  return NpArray<T>(data, sh.size(), sh.data(), owner);
}
template NpArray<float> new_array<float>(const std::vector<std::int64_t>&, std::string_view);
template NpArray<double> new_array<double>(const std::vector<std::int64_t>&, std::string_view);
template NpArray<std::int64_t> new_array<std::int64_t>(const std::vector<std::int64_t>&, std::string_view);
template NpArray<std::int32_t> new_array<std::int32_t>(const std::vector<std::int64_t>&, std::string_view);

const char* current_op() { return t_activity ? t_activity->op : "numattn"; }

void doing(std::string what) {
  if (t_activity) t_activity->what = std::move(what);
}

Activity::Activity(const char* name) : op(name), outer(t_activity) { t_activity = this; }
Activity::~Activity() { t_activity = outer; }

std::string shape_str(const std::vector<std::int64_t>& shape) {
  return fmt::format("[{}]", fmt::join(shape, ", "));
}

std::uint64_t array_bytes(const std::vector<std::int64_t>& shape, std::size_t itemsize, std::string_view what) {
  std::int64_t n = static_cast<std::int64_t>(itemsize);
  for (std::int64_t d : shape) n = checked_mul(n, d, fmt::format("{}: {}", current_op(), what));
  return static_cast<std::uint64_t>(n);
}

void reserve(std::uint64_t bytes, std::string_view what) {
  check_memory(bytes, fmt::format("{}: {}", current_op(), what));
}

void reserve_array(std::string_view what, const std::vector<std::int64_t>& shape, std::size_t itemsize,
                   std::int64_t count) {
  const std::string desc = fmt::format("{} {}", what, shape_str(shape));
  std::vector<std::int64_t> dims = shape;
  dims.push_back(count);
  reserve(array_bytes(dims, itemsize, desc), desc);
}

[[noreturn]] void throw_out_of_memory(const Activity& a, const char* detail) {
  throw OutOfMemory(fmt::format("{}: out of memory ({}) while {}; the sizes come from the arguments' "
                                "shapes (a broadcast view holds a large shape in little memory, "
                                "its result does not)",
                                a.op, detail, a.what));
}

MemSpan mem_span(const void* data, const std::vector<std::int64_t>& shape,
                 const std::vector<std::int64_t>& strides, std::size_t itemsize) {
  auto lo = reinterpret_cast<std::intptr_t>(data), hi = lo;
  for (std::size_t i = 0; i < shape.size(); ++i) {
    if (shape[i] == 0) return {data, data};
    const auto ext = static_cast<std::intptr_t>(shape[i] - 1) * static_cast<std::intptr_t>(strides[i]) *
                     static_cast<std::intptr_t>(itemsize);
    (ext < 0 ? lo : hi) += ext;
  }
  return {reinterpret_cast<const void*>(lo), reinterpret_cast<const void*>(hi + static_cast<std::intptr_t>(itemsize))};
}

bool may_self_overlap(const std::vector<std::int64_t>& shape, const std::vector<std::int64_t>& strides,
                      std::size_t itemsize) {
  std::vector<std::pair<std::int64_t, std::int64_t>> axes;  // (|stride| in bytes, length)
  for (std::size_t i = 0; i < shape.size(); ++i) {
    if (shape[i] == 0) return false;
    if (shape[i] > 1) axes.emplace_back(std::abs(strides[i]) * static_cast<std::int64_t>(itemsize), shape[i]);
  }
  std::sort(axes.begin(), axes.end());
  std::int64_t extent = static_cast<std::int64_t>(itemsize);  // bytes the inner axes span
  for (const auto& [stride, len] : axes) {
    if (stride < extent) return true;
    std::int64_t span = 0;
    // An extent past int64 leaves no larger stride that could overlap it.
    if (__builtin_mul_overflow(stride, len - 1, &span) || __builtin_add_overflow(span, extent, &extent))
      return false;
  }
  return false;
}

void check_interrupt() {
  nb::gil_scoped_acquire gil;
  if (PyErr_CheckSignals() == 0) return;
  Interrupted e;
  PyErr_Fetch(&e.type, &e.value, &e.traceback);
  throw e;
}

namespace {
PyObject* g_error = nullptr;        // numattn.Error(ValueError)
PyObject* g_option_error = nullptr; // numattn.OptionError(numattn.Error)
PyObject* g_nonfinite = nullptr;    // numattn.NonFiniteInputError(numattn.Error)
PyObject* g_oom = nullptr;          // numattn.OutOfMemoryError(numattn.Error, MemoryError)

// Messages quote what the caller gave: a 100k-character spec would be repeated whole. A run of
// more than 256 characters without a blank keeps its first 96 and last 32.
std::string shorten_runs(std::string_view msg) {
  constexpr std::size_t kLong = 256, kHead = 96, kTail = 32;
  std::string out;
  std::size_t i = 0;
  while (i < msg.size()) {
    const std::size_t j = std::min(msg.find_first_of(" \n\t", i), msg.size());
    if (j - i > kLong)
      out += fmt::format("{}…[{} characters]…{}", msg.substr(i, kHead), j - i - kHead - kTail, msg.substr(j - kTail, kTail));
    else
      out += msg.substr(i, j - i);
    if (j < msg.size()) out += msg[j];
    i = j + 1;
  }
  return out;
}

void set_error(PyObject* cls, const char* what, const std::vector<std::pair<const char*, nb::object>>& attrs) {
  // Bytes that are not UTF-8 (a cut through a character, raw bytes a message quotes from a file)
  // become U+FFFD instead of a UnicodeDecodeError in place of the error.
  const std::string msg = shorten_runs(what);
  nb::object text = nb::steal(PyUnicode_DecodeUTF8(msg.c_str(), static_cast<Py_ssize_t>(msg.size()), "replace"));
  if (!text.is_valid()) return;
  nb::object inst = nb::steal(PyObject_CallFunctionObjArgs(cls, text.ptr(), nullptr));
  if (!inst.is_valid()) return;  // the constructor raised: that error stays set
  for (const auto& [k, v] : attrs) nb::setattr(inst, k, v);
  PyErr_SetObject(cls, inst.ptr());
}
}  // namespace

void raise_non_finite(const std::string& message, const std::string& tensor,
                      const std::vector<std::int64_t>& index) {
  nb::list idx;
  for (auto i : index) idx.append(i);
  set_error(g_nonfinite, message.c_str(), {{"tensor", nb::str(tensor.c_str())}, {"index", nb::tuple(idx)}});
  throw nb::python_error();
}

void register_errors(nb::module_& m) {
  g_error = PyErr_NewExceptionWithDoc(
      "numattn.Error",
      "A user mistake reported by numattn (bad shape, spec, option or file): the message names "
      "the thing and the fix. Subclass of ValueError.",
      PyExc_ValueError, nullptr);
  g_option_error = PyErr_NewExceptionWithDoc(
      "numattn.OptionError", "numattn.Error about one named option (attribute `option`).",
      g_error, nullptr);
  g_nonfinite = PyErr_NewExceptionWithDoc(
      "numattn.NonFiniteInputError",
      "A NaN or infinity where the attention semantics refuse one (a value a query reads, or +inf "
      "in an additive mask). Attributes: `tensor` ('q', 'k', 'v' or 'mask') and `index` (the "
      "element's index in the array as passed).",
      g_error, nullptr);
  {
    // A MemoryError to Python's eyes, and a numattn.Error like every refusal numattn reports.
    nb::object bases = nb::make_tuple(nb::handle(g_error), nb::handle(PyExc_MemoryError));
    g_oom = PyErr_NewExceptionWithDoc(
        "numattn.OutOfMemoryError",
        "Not enough memory for a request: refused before allocating (the message names the "
        "operation, what it would allocate, and the bytes requested against those available; "
        "NUMATTN_MEMORY_AVAILABLE caps the latter), or an allocation that failed anyway (named by "
        "the operation and the sizes it was working on). Subclass of numattn.Error and MemoryError.",
        bases.ptr(), nullptr);
  }
  m.attr("Error") = nb::handle(g_error);
  m.attr("OutOfMemoryError") = nb::handle(g_oom);
  m.attr("OptionError") = nb::handle(g_option_error);
  m.attr("NonFiniteInputError") = nb::handle(g_nonfinite);
  nb::register_exception_translator([](const std::exception_ptr& p, void*) {
    try {
      std::rethrow_exception(p);
    } catch (Interrupted& e) {
      PyErr_Restore(e.type, e.value, e.traceback);
    } catch (const NonFiniteInput& e) {
      nb::list idx;
      for (auto i : e.index()) idx.append(i);
      set_error(g_nonfinite, e.what(), {{"tensor", nb::str(e.tensor().c_str())}, {"index", nb::tuple(idx)}});
    } catch (const OutOfMemory& e) {
      set_error(g_oom, e.what(), {});
    } catch (const std::bad_alloc&) {
      // Outside an entry point's body (converting arguments or results): entry() names the
      // operation of everything inside one.
      set_error(g_oom, fmt::format("{}: out of memory (std::bad_alloc) while converting arguments or results "
                                   "between Python and C++", current_op()).c_str(), {});
    } catch (const OptionError& e) {
      set_error(g_option_error, e.what(), {{"option", nb::str(e.option().c_str())}});
    } catch (const Error& e) {
      set_error(g_error, e.what(), {});
    }
  });
}

}  // namespace numattn::py
