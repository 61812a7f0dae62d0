// Registration glue used by method sources (private header).
#pragma once

#include <memory>

#include "numattn/attention/method.h"

/// Defines the two functions the registry table (registry.cpp) references for `Class`, which
/// must have `static const MethodInfo& describe()` and a constructor taking `ParamValues`.
#define NUMATTN_DEFINE_METHOD(Class)                                                 \
  const ::numattn::MethodInfo& numattn_describe_##Class() { return Class::describe(); } \
  std::unique_ptr<::numattn::AttentionMethod> numattn_make_##Class(::numattn::ParamValues p) { \
    return std::make_unique<Class>(std::move(p));                                    \
  }
