// numattn gguf-info: dumps a GGUF file's header, metadata and tensor table.
#include <cmath>
#include <iostream>
#include <map>
#include <memory>

#include "cli_common.h"
#include "commands.h"
#include "numattn/gguf/gguf.h"
#include "numattn/gguf/tensor_data.h"
#include "numattn/transform/pipeline.h"
#include "numattn/model/data.h"

namespace numattn::cli {

namespace {

struct GgufInfoOptions {
  std::string model = "default";
  std::string format = "md";
  int threads = 0;
  bool no_tensors = false;
  bool stats = false;
  bool full_arrays = false;
  std::size_t max_chars = 60;
};

// A metadata value as JSON. Arrays longer than `limit` become {count, head} unless full.
nlohmann::ordered_json value_json(const GgufValue& v, bool full) {
  switch (v.type()) {
    case GgufType::STRING: return v.as_string();
    case GgufType::BOOL: return v.as_bool();
    case GgufType::F32:
    case GgufType::F64: return v.as_double();
    case GgufType::U64: return v.as_uint();
    case GgufType::ARRAY: break;
    default: return v.as_int();
  }
  const std::size_t n = v.array_size();
  const std::size_t show = full ? n : std::min<std::size_t>(n, 16);
  nlohmann::ordered_json items = nlohmann::ordered_json::array();
  const GgufType et = v.array_type();
  if (et == GgufType::STRING) {
    for (std::size_t i = 0; i < show; ++i) items.push_back(v.string_array_view()[i]);
  } else if (et == GgufType::ARRAY) {
    for (std::size_t i = 0; i < show; ++i) items.push_back(value_json(v.nested_array_view()[i], full));
  } else if (et == GgufType::BOOL) {
    for (std::size_t i = 0; i < show; ++i) items.push_back(v.bool_array_view()[i] != 0);
  } else {
    const auto d = v.double_array();
    for (std::size_t i = 0; i < show; ++i) items.push_back(d[i]);
  }
  if (show == n) return items;
  return {{"count", n}, {"head", items}};
}

struct Stats {
  double min = 0, max = 0, rms = 0;
  std::int64_t non_finite = 0;
};

Stats tensor_stats(const GgufTensorInfo& t, const ExecContext& ctx) {
  const auto& ti = ggml_type_info(t.type);
  Stats s;
  if (!ti.dequantizable) return s;
  const std::vector<float> x = dequantize_tensor(t, ctx);
  double ss = 0;
  s.min = x.empty() ? 0 : x[0];
  s.max = s.min;
  for (float f : x) {
    if (!std::isfinite(f)) {
      ++s.non_finite;
      continue;
    }
    s.min = std::min<double>(s.min, f);
    s.max = std::max<double>(s.max, f);
    ss += static_cast<double>(f) * f;
  }
  s.rms = x.empty() ? 0 : std::sqrt(ss / static_cast<double>(x.size()));
  return s;
}

void run_gguf_info(const GgufInfoOptions& o) {
  const std::string path = resolve_model_path(o.model);
  const GgufFile f = GgufFile::open(path);
  const ExecContext ctx{o.threads};
  const Format fmt = parse_format(o.format);

  std::vector<Row> tensor_rows;
  std::map<std::string, std::pair<std::int64_t, std::uint64_t>> by_type;  // count, bytes
  for (const auto& t : f.tensors()) {
    auto& bt = by_type[ggml_type_name(t.type)];
    ++bt.first;
    bt.second += t.size_bytes;
    if (o.no_tensors) continue;
    Row r;
    r["name"] = t.name;
    r["type"] = ggml_type_name(t.type);
    r["shape"] = t.shape_string();
    r["elements"] = t.n_elements();
    r["offset"] = t.offset;
    r["bytes"] = t.size_bytes;
    if (o.stats) {
      const Stats s = tensor_stats(t, ctx);
      r["min"] = s.min;
      r["max"] = s.max;
      r["rms"] = s.rms;
      r["non_finite"] = s.non_finite;
    }
    tensor_rows.push_back(std::move(r));
  }

  // The pipeline `convert` recorded (transform/pipeline.h), read back through the parser: its
  // canonical form, or why it does not parse.
  std::string xform = f.get_string(transform::kTransformKey, "");
  if (!xform.empty()) {
    try {
      xform = transform::parse_transforms(xform).canonical();
    } catch (const Error& e) {
      xform += fmt::format(" (does not parse: {})", e.what());
    }
  }
  if (fmt == Format::kJson) {
    nlohmann::ordered_json j;
    j["file"] = path;
    j["version"] = f.version();
    j["file_size"] = f.file_size();
    j["alignment"] = f.alignment();
    j["data_offset"] = f.data_offset();
    j["metadata_count"] = f.metadata().size();
    j["tensor_count"] = f.tensors().size();
    if (!xform.empty()) j["transform"] = xform;
    nlohmann::ordered_json md = nlohmann::ordered_json::object();
    for (const auto& [k, v] : f.metadata()) {
      nlohmann::ordered_json e;
      e["type"] = v.is_array() ? "array[" + gguf_type_name(v.array_type()) + "]" : gguf_type_name(v.type());
      e["value"] = value_json(v, o.full_arrays);
      md[k] = e;
    }
    j["metadata"] = md;
    nlohmann::ordered_json types = nlohmann::ordered_json::object();
    for (const auto& [name, cb] : by_type) types[name] = {{"tensors", cb.first}, {"bytes", cb.second}};
    j["tensor_types"] = types;
    if (!o.no_tensors) j["tensors"] = tensor_rows;
    std::cout << dump_json(j, 2) << "\n";
    return;
  }
  if (fmt == Format::kCsv) {  // CSV: the tensor table only (one schema per output)
    print_table(std::cout, tensor_rows, fmt);
    return;
  }
  std::cout << "# " << path << "\n\n"
            << "GGUF v" << f.version() << ", " << f.file_size() << " bytes, alignment "
            << f.alignment() << ", data at byte " << f.data_offset() << ", " << f.metadata().size()
            << " metadata keys, " << f.tensors().size() << " tensors\n\n";
  if (!xform.empty()) std::cout << "Made by the model transforms " << xform << "\n\n";
  std::cout << "## metadata\n\n";
  std::vector<Row> kv_rows;
  for (const auto& [k, v] : f.metadata()) {
    Row r;
    r["key"] = k;
    r["type"] = v.is_array() ? "array[" + gguf_type_name(v.array_type()) + "]" : gguf_type_name(v.type());
    // Markdown cells cannot hold a bare '|' (tokens such as "<|im_start|>" have them).
    std::string text = v.to_string(o.max_chars), esc;
    for (char c : text) esc += c == '|' ? std::string("\\|") : std::string(1, c);
    r["value"] = esc;
    kv_rows.push_back(std::move(r));
  }
  print_table(std::cout, kv_rows, fmt);
  std::cout << "\n## tensor types\n\n";
  std::vector<Row> type_rows;
  for (const auto& [name, cb] : by_type) {
    Row r;
    r["type"] = name;
    r["tensors"] = cb.first;
    r["bytes"] = cb.second;
    type_rows.push_back(std::move(r));
  }
  print_table(std::cout, type_rows, fmt);
  if (!o.no_tensors) {
    std::cout << "\n## tensors\n\n";
    print_table(std::cout, tensor_rows, fmt);
  }
}

}  // namespace

void add_gguf_info(CLI::App& app) {
  auto o = std::make_shared<GgufInfoOptions>();
  auto* sub = app.add_subcommand(
      "gguf-info", "dump a GGUF file: header, metadata (every key, typed) and tensor infos "
                   "(md: all tables; csv: the tensor table; json: one object)");
  sub->add_option("--model", o->model, "GGUF file, or 'default' (the cached default model)")
      ->capture_default_str();
  add_common(*sub, &o->threads, &o->format);
  sub->add_flag("--no-tensors", o->no_tensors, "omit the per-tensor table");
  sub->add_flag("--stats", o->stats, "dequantize every tensor and report min/max/rms");
  sub->add_flag("--full-arrays", o->full_arrays, "json: print arrays in full (default: first 16)");
  sub->add_option("--max-chars", o->max_chars, "md: truncate metadata values to this many chars")
      ->capture_default_str();
  sub->callback([o] { run_gguf_info(*o); });
}

NUMATTN_COMMAND(80, add_gguf_info);

}  // namespace numattn::cli
