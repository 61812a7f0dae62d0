// numattn._numattn: the compiled half of the numattn Python package (python/numattn/ re-exports
// it). One bind_<area>() per source file; see common.h for how to add one.
#include "common.h"

NB_MODULE(_numattn, m) {
  m.doc() = "numattn: attention computed, approximated and studied numerically (C++ core).";
  numattn::py::register_errors(m);
  numattn::py::bind_methods(m);
  numattn::py::bind_attention(m);
  numattn::py::bind_decomp(m);
  numattn::py::bind_model(m);
}
