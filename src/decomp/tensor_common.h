// Pieces shared by cp.cpp and tucker.cpp (private header).
#pragma once

#include "numattn/decomp/dense.h"
#include "numattn/decomp/tensor3.h"

namespace numattn::decomp::detail {

/// The leading `r` left singular vectors of `m` (rows × r, orthonormal columns) and all the
/// singular values it computed (descending). SVD of `m` when it is at most 8× wider than tall,
/// else eigenvectors of m·mᵀ (see tucker.h). `info` is LAPACK's.
struct Leading {
  dense::Matrix u;
  dense::Vector s;
  dense::Info info = dense::Info::kSuccess;
};
Leading leading_left(const dense::Matrix& m, index_t r);

/// "" when `x` can be decomposed, else why not (empty tensor, the first non-finite entry).
std::string check_input(const Tensor3& x);

}  // namespace numattn::decomp::detail
