/// @file registry.h
/// The method registry and spec strings.
///
/// Grammar (whitespace ignored):
///   spec   := name [ "(" [ param { "," param } ] ")" ]
///   name   := family "." ident            e.g. exact.flash, lowrank.nystrom
///           | "auto"                      short for auto.select
///   param  := ident "=" value             value: number, true/false, identifier, or a nested
///                                         spec (auto.causal(inner=lowrank.nystrom(landmarks=64)));
///                                         only commas outside parentheses separate params
///
/// Every registered method is listed once, in the methods.inc of its layer's folder
/// (`src/attention/methods.inc` for the attention families, `src/analysis/methods.inc` for
/// auto.select, `src/dist/methods.inc` for dist.*); the library's registration unit
/// (src/methods.cpp) composes them, and from there a method reaches the CLI, the conformance
/// tests, the benchmarks and Python by itself.
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "numattn/attention/method.h"

namespace numattn {

/// A spec split into name and raw `key=value` pairs (no schema check yet).
struct ParsedSpec {
  std::string name;
  std::vector<std::pair<std::string, std::string>> params;
};

/// Syntax-only parse. Throws `Error` with the position of the problem.
ParsedSpec parse_spec(std::string_view spec);

/// Splits a list of specs at the `separators` that lie outside parentheses, so that
/// "lowrank.nystrom(landmarks=64,iters=2),exact.flash" is two specs, not three pieces. This is
/// the one splitter of every option that takes several specs (the CLI's comma lists, the
/// per-layer lists of model/llama.h with separators ",;"). Items are returned as written,
/// without the whitespace around them, and are not parsed (parse_spec / create_method do that).
/// Parentheses may nest; only depth 0 separates. Throws `Error` quoting the list and naming the
/// position for: a list with no spec in it (empty or blank), an empty item (a leading,
/// trailing or doubled separator), a ')' with no '(' open, and a '(' never closed.
std::vector<std::string> split_specs(std::string_view list, std::string_view separators = ",");

/// Every registered method's description, in catalogue order.
std::vector<const MethodInfo*> list_methods();
/// The description of `name` ("family.name"), or nullptr.
const MethodInfo* find_method(std::string_view name);

/// Creates a method from a spec string. Unknown names list the registered ones; unknown keys,
/// bad types and out-of-range values list the valid keys with their ranges.
std::unique_ptr<AttentionMethod> create_method(std::string_view spec);

/// `exact.flash` at its default parameters, constructed by its class, not looked up by name: the
/// library's exact float32 attention for library code that needs an exact method object (a
/// fallback, a baseline, the normalisers of the causal recursion, the `run` of an exact
/// sub-problem with its float64 edge handling). A sub-problem that needs no edge handling runs
/// through blocks::dense_softmax_attention (attention/blocks/dense_softmax.h) instead.
std::unique_ptr<AttentionMethod> create_exact_method();

/// Validates raw values against a schema and fills defaults (used by `create_method`).
ParamValues bind_params(const MethodInfo& info,
                        const std::vector<std::pair<std::string, std::string>>& raw);

}  // namespace numattn
