/// @file npy.h
/// NumPy `.npy` files (format 1.0–3.0): float32, float64, int64, little-endian, C order.
/// For interchange with NumPy and PyTorch. Fortran-order and other dtypes are refused by name.
#pragma once

#include <cstdint>
#include <string>
#include <variant>
#include <vector>

namespace numattn::npy {

enum class DType { kFloat32, kFloat64, kInt64 };

/// An array read from a `.npy` file. Exactly one of the vectors is filled, per `dtype`.
struct Array {
  DType dtype = DType::kFloat32;
  std::vector<std::int64_t> shape;
  std::vector<float> f32;
  std::vector<double> f64;
  std::vector<std::int64_t> i64;
  std::int64_t numel() const;
  /// The values as float32 / float64 whatever the stored dtype (int64 converted).
  std::vector<float> as_f32() const;
  std::vector<double> as_f64() const;
};

/// Reads a `.npy` file. Throws `numattn::Error` on a bad or unsupported file.
Array read(const std::string& path);

void write(const std::string& path, const std::vector<std::int64_t>& shape, const float* data);
void write(const std::string& path, const std::vector<std::int64_t>& shape, const double* data);
void write(const std::string& path, const std::vector<std::int64_t>& shape,
           const std::int64_t* data);

}  // namespace numattn::npy
