/// @file tensor.h
/// Strided tensor views and a small owning tensor.
///
/// Data convention for the whole library: a rank-4 view has a shape `[d0, d1, d2, d3]` and
/// strides counted in *elements* (not bytes). Attention tensors are logically
/// `[batch, heads, tokens, dim]`; a BNHD buffer (`[batch, tokens, heads, dim]` in memory) is
/// viewed as BHND by permuting strides (`TensorView::bnhd`), so both layouts work without
/// copies. The last dimension must have stride 1 for the fast kernels (they refuse otherwise).
#pragma once

#include <array>
#include <type_traits>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "numattn/core/error.h"

namespace numattn {

using index_t = std::int64_t;

/// Non-owning rank-4 strided view. `T` may be const-qualified.
template <class T>
struct TensorView {
  T* data = nullptr;
  std::array<index_t, 4> shape{0, 0, 0, 0};
  std::array<index_t, 4> stride{0, 0, 0, 0};

  TensorView() = default;
  TensorView(T* p, std::array<index_t, 4> s, std::array<index_t, 4> st)
      : data(p), shape(s), stride(st) {}
  /// Conversion to a const view.
  template <class U>
    requires std::is_same_v<const U, T>
  TensorView(const TensorView<U>& o) : data(o.data), shape(o.shape), stride(o.stride) {}

  /// Dense row-major `[d0, d1, d2, d3]` over `p`.
  static TensorView contiguous(T* p, std::array<index_t, 4> s) {
    return TensorView(p, s, {s[1] * s[2] * s[3], s[2] * s[3], s[3], 1});
  }
  /// A BNHD buffer (`[b, n, h, d]` in memory) viewed as `[b, h, n, d]`.
  static TensorView bnhd(T* p, index_t b, index_t h, index_t n, index_t d) {
    return TensorView(p, {b, h, n, d}, {n * h * d, d, h * d, 1});
  }

  bool empty() const { return data == nullptr; }
  index_t numel() const { return shape[0] * shape[1] * shape[2] * shape[3]; }
  T& operator()(index_t i, index_t j, index_t k, index_t l) const {
    return data[i * stride[0] + j * stride[1] + k * stride[2] + l * stride[3]];
  }
  /// Pointer to row `(i, j, k, :)`.
  T* row(index_t i, index_t j, index_t k) const {
    return data + i * stride[0] + j * stride[1] + k * stride[2];
  }
  bool is_contiguous() const {
    return stride[3] == 1 && stride[2] == shape[3] && stride[1] == shape[2] * shape[3] &&
           stride[0] == shape[1] * shape[2] * shape[3];
  }
};

/// Owning dense row-major tensor of rank up to 4 (unused leading dims are 1).
template <class T>
class Tensor {
 public:
  Tensor() = default;
  explicit Tensor(std::array<index_t, 4> shape, T fill = T{}) : shape_(shape) {
    for (auto s : shape) NUMATTN_CHECK(s >= 0, "tensor shape must be non-negative, got {}", s);
    data_.assign(static_cast<std::size_t>(shape[0] * shape[1] * shape[2] * shape[3]), fill);
  }
  TensorView<T> view() { return TensorView<T>::contiguous(data_.data(), shape_); }
  TensorView<const T> view() const {
    return TensorView<const T>::contiguous(data_.data(), shape_);
  }
  T* data() { return data_.data(); }
  const T* data() const { return data_.data(); }
  std::size_t size() const { return data_.size(); }
  const std::array<index_t, 4>& shape() const { return shape_; }
  std::vector<T>& vec() { return data_; }
  const std::vector<T>& vec() const { return data_; }

 private:
  std::array<index_t, 4> shape_{0, 0, 0, 0};
  std::vector<T> data_;
};

}  // namespace numattn
