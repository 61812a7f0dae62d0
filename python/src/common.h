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
#include <string>
#include <vector>

#include "numattn/core/tensor.h"

namespace numattn::py {

namespace nb = nanobind;

/// Any array on the CPU, read-only access, any dtype and strides (checked by the converters).
using AnyArray = nb::ndarray<nb::ro>;
/// A NumPy array we create and own through a capsule.
template <class T>
using NpArray = nb::ndarray<nb::numpy, T>;

/// Memory order of a rank-4 attention tensor as the caller holds it.
enum class Layout { kBHND, kBNHD };
/// "bhnd" | "bnhd" (case-insensitive); numattn::Error otherwise.
Layout parse_layout(const std::string& s);

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
  const void* mem_begin = nullptr;  ///< the caller's memory span (aliasing checks)
  const void* mem_end = nullptr;
};
/// Throws nb::type_error for a dtype other than float32/float64 or a non-CPU device, and
/// numattn::Error (ValueError) for a bad rank or a last axis that is not contiguous.
Float32Input as_f32_input(const AnyArray& a, const char* name, Layout layout);

/// A float64 matrix (rows × cols, row-major copy) from a 2-d float32/float64 array.
std::vector<double> as_f64_matrix(const AnyArray& a, const char* name, std::int64_t& rows,
                                  std::int64_t& cols);

/// A new C-contiguous NumPy array of `shape`, owned by a capsule, with uninitialised contents:
/// every caller writes every element (an attention method writes its whole output: the
/// conformance harness poisons outputs to check it).
template <class T>
NpArray<T> new_array(const std::vector<std::int64_t>& shape);
extern template NpArray<float> new_array<float>(const std::vector<std::int64_t>&);
extern template NpArray<double> new_array<double>(const std::vector<std::int64_t>&);
extern template NpArray<std::int64_t> new_array<std::int64_t>(const std::vector<std::int64_t>&);
extern template NpArray<std::int32_t> new_array<std::int32_t>(const std::vector<std::int64_t>&);

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
