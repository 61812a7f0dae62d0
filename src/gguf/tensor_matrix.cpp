// append_tensor: a GGUF tensor's rows as a part of a QuantMatrix (gguf/tensor_data.h).
#include "numattn/gguf/tensor_data.h"

#include "numattn/core/error.h"

namespace numattn {

void append_tensor(QuantMatrix& m, const GgufTensorInfo& t) {
  for (std::size_t i = 2; i < t.ne.size(); ++i)
    NUMATTN_CHECK(t.ne[i] == 1, "tensor {} has shape {}: a matrix needs 2 dimensions", t.name,
                  t.shape_string());
  m.append(t.type, t.data, t.n_rows(), t.row_elems(), "tensor " + t.name);
}

}  // namespace numattn
