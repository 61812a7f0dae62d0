/// @file spec_syntax.h
/// The spec-string syntax of registry.h for names of any form: what the model transforms
/// (transform/pipeline.h: `mla(rank=128)`, `tensor.vo_cp(rank=256)`) are parsed with, so that
/// methods and transforms share one parser.
#pragma once

#include <string_view>

#include "numattn/attention/registry.h"

namespace numattn {

/// parse_spec without its method-name rule: the name is any identifier (letters, digits, '_',
/// dots allowed) instead of `family.name`, and `auto` is not rewritten. The same errors
/// otherwise (unbalanced parentheses, `key=value`, a key given twice, an empty value).
ParsedSpec parse_spec_any_name(std::string_view spec);

}  // namespace numattn
