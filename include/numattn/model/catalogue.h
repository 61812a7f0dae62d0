/// @file catalogue.h
/// The descriptions of the registered attention methods (attention/registry.h) and model
/// transforms (transform/pipeline.h) as JSON: the one source of what `numattn methods`,
/// `numattn transforms` and the Python `numattn.methods()` / `numattn.transforms()` print.
///
/// Each entry comes in two forms built from the same fields: a *description* (structured:
/// parameters as a list of objects, capabilities as booleans), and a *catalogue row* (the table
/// row of `numattn methods` / `numattn transforms` in Markdown or CSV: parameters and
/// capabilities flattened to one line of text). Cost: one method instantiation per entry.
#pragma once

#include <nlohmann/json.hpp>

#include <string>

#include "numattn/attention/method.h"

namespace numattn {

/// name, spec (canonical, defaults filled in), family, summary, citation, time_complexity,
/// memory_complexity, target, params [{name, type (int|float|bool|str), default, min, max (int
/// and float), choices (when any), doc}], capabilities {exact, causal, gqa, bool_mask,
/// additive_mask, window, lse, decode, dk_ne_dv, strided, deterministic, randomized}.
nlohmann::ordered_json method_description(const MethodInfo& m);
/// name, spec, family, target, parameters ("k=default: doc; ..."), capabilities ("exact causal
/// gqa ..."; a causal rule or window that the causal recursion supplies is marked
/// "(recursion)"), time, memory, summary, citation.
nlohmann::ordered_json method_catalogue_row(const MethodInfo& m);

/// name, family, parameters [{name, type (int|float|bool|string), default (null when required),
/// required, min, max (int and float), choices (when any), doc}], cost, summary, citation.
nlohmann::ordered_json transform_description(const MethodInfo& m);
/// As transform_description with parameters flattened to one line ("k=default in [a, b]: doc").
nlohmann::ordered_json transform_catalogue_row(const MethodInfo& m);

/// Every registered method's description, in catalogue order (as_rows: catalogue rows).
nlohmann::ordered_json method_catalogue(bool as_rows);
/// Every registered transform's description, in registry order (as_rows: catalogue rows).
nlohmann::ordered_json transform_catalogue(bool as_rows);

}  // namespace numattn
