// The library's registration unit: the registry's table, composed from each layer's list of
// methods, bottom-up (attention, then analysis, then dist). It is the only source that sees every
// layer, so no layer's folder refers to a layer above it; the registry (attention/registry.cpp)
// reads the table through registered_methods().
#include "attention/method_def.h"

namespace numattn {

#define NUMATTN_METHOD(Class)                   \
  const MethodInfo& numattn_describe_##Class(); \
  std::unique_ptr<AttentionMethod> numattn_make_##Class(ParamValues p);
#include "attention/methods.inc"
#include "analysis/methods.inc"
#include "dist/methods.inc"
#undef NUMATTN_METHOD

const std::vector<MethodEntry>& registered_methods() {
  static const std::vector<MethodEntry> table = {
#define NUMATTN_METHOD(Class) {&numattn_describe_##Class, &numattn_make_##Class},
#include "attention/methods.inc"
#include "analysis/methods.inc"
#include "dist/methods.inc"
#undef NUMATTN_METHOD
  };
  return table;
}

}  // namespace numattn
