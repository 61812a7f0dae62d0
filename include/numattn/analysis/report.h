/// @file report.h
/// Tables of results printed as Markdown, CSV or JSON with one schema.
///
/// A row is an ordered JSON object; the column set is the union of keys in first-seen order.
/// Numbers are printed with fixed rules (`%.6g`-style in md/csv, full precision in JSON), so
/// tests can match output lines. A number that is not finite (NaN, ±inf) is written as JSON
/// `null` and as an empty md/csv cell, the same as a value that was not measured: a column
/// always holds a number or nothing. Whoever fills a row says why a value is missing in the
/// row's `status` (see `error_status` in the CLI).
#pragma once

#include <nlohmann/json.hpp>

#include <iosfwd>
#include <string>
#include <vector>

namespace numattn {

enum class Format { kMarkdown, kCsv, kJson };

/// "md" | "csv" | "json"; throws on anything else.
Format parse_format(const std::string& s);

using Row = nlohmann::ordered_json;

/// Prints `rows`. JSON: one array of objects (or the single object when `single`).
void print_table(std::ostream& os, const std::vector<Row>& rows, Format f, bool single = false);

/// One cell as text (md/csv): numbers `%.6g`, strings as is, null and non-finite numbers as "",
/// arrays and objects as JSON (`dump_json`).
std::string cell_text(const Row& v);

/// `v` as JSON text (`indent` < 0: one line). Strings hold arbitrary bytes (paths, prompts,
/// GGUF metadata) but JSON needs UTF-8: bytes that are not valid UTF-8 are written as U+FFFD
/// instead of throwing. Every JSON that numattn prints goes through here.
std::string dump_json(const Row& v, int indent = -1);

}  // namespace numattn
