#include "numattn/analysis/report.h"

#include <cmath>
#include <ostream>

#include "numattn/core/error.h"

namespace numattn {

Format parse_format(const std::string& s) {
  if (s == "md" || s == "markdown") return Format::kMarkdown;
  if (s == "csv") return Format::kCsv;
  if (s == "json") return Format::kJson;
  throw Error(fmt::format("unknown format '{}' (valid: md, csv, json)", s));
}

std::string cell_text(const Row& v) {
  if (v.is_null()) return "";
  if (v.is_string()) return v.get<std::string>();
  if (v.is_boolean()) return v.get<bool>() ? "true" : "false";
  if (v.is_number_integer()) return std::to_string(v.get<long long>());
  if (v.is_number()) {
    const double x = v.get<double>();
    return std::isfinite(x) ? fmt::format("{:.6g}", x) : "";
  }
  return dump_json(v);
}

std::string dump_json(const Row& v, int indent) {
  return v.dump(indent, ' ', false, Row::error_handler_t::replace);
}

namespace {
// JSON has no NaN or Inf: every non-finite number becomes null, as it prints empty in md/csv.
Row json_safe(const Row& v) {
  if (v.is_number_float()) return std::isfinite(v.get<double>()) ? v : Row();
  if (v.is_object()) {
    Row o = Row::object();
    for (auto it = v.begin(); it != v.end(); ++it) o[it.key()] = json_safe(it.value());
    return o;
  }
  if (v.is_array()) {
    Row a = Row::array();
    for (const Row& x : v) a.push_back(json_safe(x));
    return a;
  }
  return v;
}
}  // namespace

void print_table(std::ostream& os, const std::vector<Row>& rows, Format f, bool single) {
  if (f == Format::kJson) {
    if (single && rows.size() == 1) {
      os << dump_json(json_safe(rows[0]), 2) << "\n";
    } else {
      Row arr = Row::array();
      for (const Row& r : rows) arr.push_back(json_safe(r));
      os << dump_json(arr, 2) << "\n";
    }
    return;
  }
  std::vector<std::string> cols;
  for (const Row& r : rows)
    for (auto it = r.begin(); it != r.end(); ++it)
      if (std::find(cols.begin(), cols.end(), it.key()) == cols.end()) cols.push_back(it.key());
  auto get = [](const Row& r, const std::string& k) { return r.contains(k) ? cell_text(r[k]) : ""; };
  if (f == Format::kCsv) {
    for (std::size_t c = 0; c < cols.size(); ++c) os << (c ? "," : "") << cols[c];
    os << "\n";
    for (const Row& r : rows) {
      for (std::size_t c = 0; c < cols.size(); ++c) {
        std::string t = get(r, cols[c]);
        if (t.find_first_of(",\"") != std::string::npos) {
          std::string q = "\"";
          for (char ch : t) q += (ch == '"') ? std::string("\"\"") : std::string(1, ch);
          t = q + "\"";
        }
        os << (c ? "," : "") << t;
      }
      os << "\n";
    }
    return;
  }
  os << "|";
  for (auto& c : cols) os << " " << c << " |";
  os << "\n|";
  for (std::size_t c = 0; c < cols.size(); ++c) os << "---|";
  os << "\n";
  for (const Row& r : rows) {
    os << "|";
    for (auto& c : cols) os << " " << get(r, c) << " |";
    os << "\n";
  }
}

}  // namespace numattn
