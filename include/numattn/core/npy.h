/// @file npy.h
/// NumPy `.npy` files (format 1.0–3.0): float32, float64, int64, little-endian, C order.
/// For interchange with NumPy and PyTorch. Fortran-order and other dtypes are refused by name.
///
/// Reading is strict, for files from untrusted sources. The header is parsed by a bounded,
/// non-recursive parser of the Python dict literal numpy writes: exactly the keys `'descr'`,
/// `'fortran_order'` and `'shape'`, in any order, each once; single or double quotes; optional
/// whitespace; a trailing comma; shapes such as `(5,)`, `(2, 3)` or `()` (a scalar); the
/// Python 2 suffix `L` on dimensions. The reader throws `numattn::Error`, naming the file, the
/// key or dimension index and the limit, for: a bad magic or version (1.0, 2.0, 3.0 only); a
/// header length beyond the file or above 1 MiB; unknown, missing or repeated keys, or any other
/// text; a dtype other than `<f4`, `<f8`, `<i8` (big-endian and structured dtypes included);
/// Fortran order; negative dimensions, dimensions that do not fit in int64, more than 64
/// dimensions, or a shape whose byte size overflows int64; and a payload shorter or longer than
/// the shape says.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <variant>
#include <vector>

namespace numattn::npy {

enum class DType { kFloat32, kFloat64, kInt64 };

/// An array read from a `.npy` file. Exactly one of the vectors is filled, per `dtype`.
struct Array {
  DType dtype = DType::kFloat32;
  std::vector<std::int64_t> shape;  ///< empty for a 0-d (scalar) array, which holds 1 value
  std::vector<float> f32;
  std::vector<double> f64;
  std::vector<std::int64_t> i64;
  std::int64_t numel() const;
  /// The values as float32 / float64 whatever the stored dtype (int64 converted).
  std::vector<float> as_f32() const;
  std::vector<double> as_f64() const;
};

/// Reads a `.npy` file (see the file comment for what is refused). Throws `numattn::Error`.
Array read(const std::string& path);

/// What `read` would return, without the payload: dtype, shape, and the byte offset of the
/// payload in the file, so that a caller can read a part of it (a distributed run reads each
/// rank's rows). Same checks and errors as `read`, payload length included.
struct Info {
  DType dtype = DType::kFloat32;
  std::vector<std::int64_t> shape;
  std::uint64_t data_offset = 0;
};
Info read_info(const std::string& path);

/// Parses a whole `.npy` file held in memory; `name` stands for the file in messages. Same
/// rules and errors as `read` (used by the fuzzer and by tests).
Array read_bytes(const void* data, std::size_t size, const std::string& name);

/// Writes a `.npy` file (format 1.0) atomically (core/file_io.h: the previous file survives any
/// error). `shape` entries must be >= 0; `data` holds the product of `shape` values.
void write(const std::string& path, const std::vector<std::int64_t>& shape, const float* data);
void write(const std::string& path, const std::vector<std::int64_t>& shape, const double* data);
void write(const std::string& path, const std::vector<std::int64_t>& shape,
           const std::int64_t* data);

}  // namespace numattn::npy
