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
    double x = v.get<double>();
    if (std::isnan(x)) return "nan";
    if (std::isinf(x)) return x > 0 ? "inf" : "-inf";
    return fmt::format("{:.6g}", x);
  }
  return dump_json(v);
}

std::string dump_json(const Row& v, int indent) {
  return v.dump(indent, ' ', false, Row::error_handler_t::replace);
}

namespace {
// JSON has no NaN/Inf: they become null (NaN) or a string ("inf"/"-inf").
Row json_safe(const Row& r) {
  Row o = Row::object();
  for (auto it = r.begin(); it != r.end(); ++it) {
    const Row& v = it.value();
    if (v.is_number_float() && !std::isfinite(v.get<double>())) {
      double x = v.get<double>();
      o[it.key()] = std::isnan(x) ? Row() : Row(x > 0 ? "inf" : "-inf");
    } else {
      o[it.key()] = v;
    }
  }
  return o;
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
