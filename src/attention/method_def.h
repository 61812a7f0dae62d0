// Registration glue used by method sources and by the registration unit (private header).
#pragma once

#include <memory>
#include <vector>

#include "numattn/attention/method.h"

/// Defines the two functions the registry table (src/methods.cpp) references for `Class`, which
/// must have `static const MethodInfo& describe()` and a constructor taking `ParamValues`.
#define NUMATTN_DEFINE_METHOD(Class)                                                 \
  const ::numattn::MethodInfo& numattn_describe_##Class() { return Class::describe(); } \
  std::unique_ptr<::numattn::AttentionMethod> numattn_make_##Class(::numattn::ParamValues p) { \
    return std::make_unique<Class>(std::move(p));                                    \
  }

namespace numattn {

/// One registered method: its description and its factory.
struct MethodEntry {
  const MethodInfo& (*describe)();
  std::unique_ptr<AttentionMethod> (*make)(ParamValues);
};

/// Every registered method in catalogue order. Defined by the library's registration unit
/// (src/methods.cpp), the one place that sees every layer: it composes the lists of
/// src/attention/methods.inc, src/analysis/methods.inc and src/dist/methods.inc bottom-up, so the
/// registry (attention layer) reaches the methods of the layers above it only through the link.
const std::vector<MethodEntry>& registered_methods();

}  // namespace numattn
