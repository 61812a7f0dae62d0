// Shared pieces of the Python extension numattn._numattn: array conversion (NumPy / DLPack
// producers to TensorView, without copies where the kernels can read the memory), new NumPy
// outputs, the exception mapping, and Ctrl-C checks from C++ loops.
//
// Adding a binding area (e.g. the tensor decompositions) is one file: write
// `void bind_<area>(nb::module_& m)` in python/src/bind_<area>.cpp, declare it below and call
// it from module.cpp. Every .cpp in this folder is compiled (python/CMakeLists.txt).
#pragma once

#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>

#include <array>
#include <cstdint>
#include <new>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "numattn/attention/problem.h"

#include "numattn/core/tensor.h"

namespace numattn::py {

namespace nb = nanobind;

/// Any array on the CPU, read-only access, any dtype and strides (checked by the converters).
using AnyArray = nb::ndarray<nb::ro>;
/// A NumPy array we create and own through a capsule.
template <class T>
using NpArray = nb::ndarray<nb::numpy, T>;

// --- Memory: sizes from the caller's arrays are checked before they are allocated. ---
//
// An array argument may be a broadcast view (numpy.broadcast_to, stride 0) that holds a huge
// shape in a few bytes: every buffer sized from shapes is sized with checked products and
// reserved against available memory (core/memory.h) first, and a std::bad_alloc that still
// escapes an entry point is reported with the operation and what it was allocating.

/// The Python name of the entry point running on this thread ("numattn" outside one).
const char* current_op();
/// Records what the running entry point is doing now ("running exact.flash on B=1, ..."), for
/// the message of an allocation that fails anyway.
void doing(std::string what);
/// Bytes of an array of `shape` with elements of `itemsize` bytes; an int64 overflow raises
/// numattn::Error naming `what` and the shape.
std::uint64_t array_bytes(const std::vector<std::int64_t>& shape, std::size_t itemsize, std::string_view what);
/// check_memory prefixed by the running entry point: numattn::OutOfMemory "numattn.attention:
/// <what> needs X of memory, but only Y are available".
void reserve(std::uint64_t bytes, std::string_view what);
/// reserve() for an array: "<what> [shape]" of `count` arrays of `itemsize`-byte elements.
void reserve_array(std::string_view what, const std::vector<std::int64_t>& shape, std::size_t itemsize,
                   std::int64_t count = 1);
/// "[1, 8, 2000000000, 64]".
std::string shape_str(const std::vector<std::int64_t>& shape);

/// The running entry point (a thread's innermost), set by entry().
struct Activity {
  const char* op;             ///< the Python name, "numattn.attention"
  std::string what = "reading its arguments";
  Activity* outer = nullptr;  ///< the entry point this one runs inside, if any
  explicit Activity(const char* name);
  ~Activity();
  Activity(const Activity&) = delete;
  Activity& operator=(const Activity&) = delete;
};
/// numattn::OutOfMemory "<op>: out of memory (<detail>) while <what>".
[[noreturn]] void throw_out_of_memory(const Activity& a, const char* detail);

/// Runs an entry point's body `f()` as `op`: a std::bad_alloc (or the std::length_error of an
/// impossible container size) that escapes it becomes numattn::OutOfMemory naming `op` and what
/// the body last said it was doing (doing()).
template <class F>
decltype(auto) entry(const char* op, F&& f) {
  Activity a(op);
  try {
    return f();
  } catch (const std::bad_alloc&) {
    throw_out_of_memory(a, "std::bad_alloc");
  } catch (const std::length_error& e) {
    throw_out_of_memory(a, e.what());
  }
}
/// A function or member function as a binding that runs it through entry(op, ...).
template <class R, class... A>
auto guarded(const char* op, R (*f)(A...)) {
  return [op, f](A... a) -> R { return entry(op, [&]() -> R { return f(std::forward<A>(a)...); }); };
}
template <class R, class C, class... A>
auto guarded(const char* op, R (C::*f)(A...) const) {
  return [op, f](const C& self, A... a) -> R {
    return entry(op, [&]() -> R { return (self.*f)(std::forward<A>(a)...); });
  };
}
template <class R, class C, class... A>
auto guarded(const char* op, R (C::*f)(A...)) {
  return [op, f](C& self, A... a) -> R { return entry(op, [&]() -> R { return (self.*f)(std::forward<A>(a)...); }); };
}

// --- Memory spans, for the aliasing checks of outputs. ---

/// Lowest byte and one past the highest byte that `shape`/`strides` (in elements) reach from
/// `data`; [data, data) for an empty array.
struct MemSpan {
  const void* begin = nullptr;
  const void* end = nullptr;
  bool overlaps(const MemSpan& o) const { return begin < o.end && o.begin < end; }
};
MemSpan mem_span(const void* data, const std::vector<std::int64_t>& shape,
                 const std::vector<std::int64_t>& strides, std::size_t itemsize);
/// Whether two elements of the array may be the same memory (a stride of 0 over an axis of
/// length > 1, or axes that interleave): the sufficient test NumPy uses for internal overlap,
/// axes sorted by |stride|, each stride at least the extent of the axes inside it.
bool may_self_overlap(const std::vector<std::int64_t>& shape, const std::vector<std::int64_t>& strides,
                      std::size_t itemsize);

/// "float32", "bfloat16", "bool": a DLPack dtype as error messages name it.
std::string dtype_name(nb::dlpack::dtype t);

/// numattn::parse_layout, its error raised as an OptionError of the `layout` keyword.
Layout layout_option(const std::string& s);

/// A float32 view of a caller's array as logical [B, H, N, D]. 2- and 3-d arrays get leading 1s
/// ([N, D], [H, N, D]; in bnhd order [N, H, D]), as `numattn run --q file.npy` reads files.
/// `view` points into the caller's memory (zero copy) when the array is float32, on the CPU,
/// aligned, with a contiguous last axis; float64 is converted into `copy` (the kernels compute
/// in float32), which `copied` reports.
struct Float32Input {
  TensorView<const float> view;
  std::vector<float> copy;
  int rank = 4;
  bool copied = false;
  MemSpan mem;  ///< the caller's memory span (aliasing checks)
};
/// Throws nb::type_error for a dtype other than float32/float64 or a non-CPU device, and
/// numattn::Error (ValueError) for a bad rank or a last axis that is not contiguous.
Float32Input as_f32_input(const AnyArray& a, const char* name, Layout layout);

/// The shape of a 2-d float32/float64 array in host memory (TypeError / numattn::Error otherwise).
void check_f64_matrix(const AnyArray& a, const char* name, std::int64_t& rows, std::int64_t& cols);
/// Copies a matrix that passed check_f64_matrix into `dst`, row-major, as float64.
void copy_f64_matrix(const AnyArray& a, double* dst);

/// A new C-contiguous NumPy array of `shape`, owned by a capsule, with uninitialised contents:
/// every caller writes every element (an attention method writes its whole output: the
/// conformance harness poisons outputs to check it). Its size is reserved first (reserve(),
/// naming `what`).
template <class T>
NpArray<T> new_array(const std::vector<std::int64_t>& shape, std::string_view what = "the result");
extern template NpArray<float> new_array<float>(const std::vector<std::int64_t>&, std::string_view);
extern template NpArray<double> new_array<double>(const std::vector<std::int64_t>&, std::string_view);
extern template NpArray<std::int64_t> new_array<std::int64_t>(const std::vector<std::int64_t>&, std::string_view);
extern template NpArray<std::int32_t> new_array<std::int32_t>(const std::vector<std::int64_t>&, std::string_view);

/// Thrown from inside a C++ loop when Python has a pending signal (Ctrl-C): carries the Python
/// exception the signal handler raised (KeyboardInterrupt) back to the binding, which restores
/// it. Not a std::exception, so that no numattn code that catches errors can swallow it.
struct Interrupted {
  PyObject* type = nullptr;
  PyObject* value = nullptr;
  PyObject* traceback = nullptr;
};
/// Called with the GIL released, between chunks of a long loop: takes the GIL for a moment,
/// runs Python's signal handlers, and throws Interrupted if one raised.
void check_interrupt();

/// Registers numattn.Error (ValueError), numattn.OptionError and numattn.NonFiniteInputError
/// and the translator that maps numattn's C++ exceptions onto them.
void register_errors(nb::module_& m);
/// Raises numattn.NonFiniteInputError with `tensor` and `index` attributes.
[[noreturn]] void raise_non_finite(const std::string& message, const std::string& tensor,
                                   const std::vector<std::int64_t>& index);

// One function per binding area (module.cpp calls them in this order).
void bind_methods(nb::module_& m);
void bind_attention(nb::module_& m);
void bind_decomp(nb::module_& m);
void bind_model(nb::module_& m);

}  // namespace numattn::py
