// GGUF v3 writer.
#include <bit>
#include <cstring>
#include <limits>

#include "numattn/core/file_io.h"
#include "numattn/gguf/gguf.h"

// GGUF is little-endian and values are copied with memcpy.
static_assert(std::endian::native == std::endian::little, "numattn GGUF I/O assumes a little-endian host");
#include "numattn/quant/quant.h"

namespace numattn {

namespace {

class ByteSink {
 public:
  std::vector<std::uint8_t> bytes;

  template <class T>
  void put(T v) {
    append(&v, sizeof(T));  // little-endian host
  }
  void put_string(const std::string& s) {
    put<std::uint64_t>(s.size());
    append(s.data(), s.size());
  }
  void append(const void* p, std::size_t n) {
    if (n == 0) return;
    const std::size_t at = bytes.size();
    bytes.resize(at + n);
    std::memcpy(bytes.data() + at, p, n);
  }
  void pad_to(std::uint64_t alignment) {
    while (bytes.size() % alignment) bytes.push_back(0);
  }

  void put_value(const GgufValue& v) {
    switch (v.type()) {
      case GgufType::U8: put(v.get<std::uint8_t>()); return;
      case GgufType::I8: put(v.get<std::int8_t>()); return;
      case GgufType::U16: put(v.get<std::uint16_t>()); return;
      case GgufType::I16: put(v.get<std::int16_t>()); return;
      case GgufType::U32: put(v.get<std::uint32_t>()); return;
      case GgufType::I32: put(v.get<std::int32_t>()); return;
      case GgufType::U64: put(v.get<std::uint64_t>()); return;
      case GgufType::I64: put(v.get<std::int64_t>()); return;
      case GgufType::F32: put(v.get<float>()); return;
      case GgufType::F64: put(v.get<double>()); return;
      case GgufType::BOOL: put<std::uint8_t>(v.as_bool() ? 1 : 0); return;
      case GgufType::STRING: put_string(v.as_string()); return;
      case GgufType::ARRAY: break;
    }
    const GgufType et = v.array_type();
    put<std::uint32_t>(static_cast<std::uint32_t>(et));
    put<std::uint64_t>(v.array_size());
    switch (et) {
      case GgufType::U8: put_span(v.array_view<std::uint8_t>()); return;
      case GgufType::I8: put_span(v.array_view<std::int8_t>()); return;
      case GgufType::U16: put_span(v.array_view<std::uint16_t>()); return;
      case GgufType::I16: put_span(v.array_view<std::int16_t>()); return;
      case GgufType::U32: put_span(v.array_view<std::uint32_t>()); return;
      case GgufType::I32: put_span(v.array_view<std::int32_t>()); return;
      case GgufType::U64: put_span(v.array_view<std::uint64_t>()); return;
      case GgufType::I64: put_span(v.array_view<std::int64_t>()); return;
      case GgufType::F32: put_span(v.array_view<float>()); return;
      case GgufType::F64: put_span(v.array_view<double>()); return;
      case GgufType::BOOL: put_span(v.bool_array_view()); return;
      case GgufType::STRING:
        for (const auto& s : v.string_array_view()) put_string(s);
        return;
      case GgufType::ARRAY:
        for (const auto& item : v.nested_array_view()) put_value(item);
        return;
    }
  }

 private:
  template <class T>
  void put_span(std::span<const T> s) {
    append(s.data(), s.size() * sizeof(T));
  }
};

std::uint64_t tensor_bytes(GgmlType type, const std::vector<std::int64_t>& ne,
                           const std::string& name) {
  NUMATTN_CHECK(!ne.empty() && ne.size() <= 4, "tensor '{}': 1..4 dimensions expected, got {}",
                name, ne.size());
  std::int64_t rows = 1;
  for (std::size_t i = 0; i < ne.size(); ++i) {
    NUMATTN_CHECK(ne[i] >= 0, "tensor '{}': negative dimension {}", name, ne[i]);
    if (i > 0) {
      NUMATTN_CHECK(ne[i] == 0 || rows <= std::numeric_limits<std::int64_t>::max() / ne[i],
                    "tensor '{}': shape too large", name);
      rows *= ne[i];
    }
  }
  const std::int64_t rb = ggml_row_bytes(type, ne[0]);
  NUMATTN_CHECK(rows == 0 || rb <= std::numeric_limits<std::int64_t>::max() / rows,
                "tensor '{}': shape too large", name);
  return static_cast<std::uint64_t>(rb * rows);
}

}  // namespace

GgufWriter::GgufWriter(std::uint32_t alignment) : alignment_(alignment) {
  NUMATTN_CHECK(alignment >= 8 && (alignment & (alignment - 1)) == 0,
                "GGUF alignment must be a power of two >= 8, got {}", alignment);
}

void GgufWriter::set(const std::string& key, GgufValue v) {
  for (auto& kv : kv_)
    if (kv.first == key) {
      kv.second = std::move(v);
      return;
    }
  kv_.emplace_back(key, std::move(v));
}

void GgufWriter::add_tensor(const std::string& name, GgmlType type, std::vector<std::int64_t> ne,
                            std::vector<std::uint8_t> data) {
  for (const auto& t : tensors_)
    NUMATTN_CHECK(t.name != name, "GgufWriter: duplicate tensor name '{}'", name);
  const std::uint64_t want = tensor_bytes(type, ne, name);
  NUMATTN_CHECK(data.size() == want, "tensor '{}' ({} {}): {} data bytes given, {} expected", name,
                ggml_type_name(type), ne.size(), data.size(), want);
  tensors_.push_back({name, type, std::move(ne), std::move(data)});
}

void GgufWriter::add_tensor_f32(const std::string& name, std::vector<std::int64_t> ne,
                                const float* values, GgmlType type) {
  const std::uint64_t bytes = tensor_bytes(type, ne, name);
  std::int64_t n = 1;
  for (auto d : ne) n *= d;
  std::vector<std::uint8_t> data(bytes);
  const std::int64_t rows = ne[0] == 0 ? 0 : n / ne[0];
  const std::int64_t rb = ggml_row_bytes(type, ne[0]);
  for (std::int64_t r = 0; r < rows; ++r)
    quantize_row(type, values + r * ne[0], data.data() + r * rb, ne[0]);
  add_tensor(name, type, std::move(ne), std::move(data));
}

std::vector<std::uint8_t> GgufWriter::to_bytes() const {
  std::vector<std::pair<std::string, GgufValue>> kv = kv_;
  bool has_alignment = false;
  for (auto& p : kv)
    if (p.first == "general.alignment") {
      p.second = GgufValue::u32(alignment_);
      has_alignment = true;
    }
  if (!has_alignment && alignment_ != 32) kv.emplace_back("general.alignment", GgufValue::u32(alignment_));

  ByteSink s;
  s.put<std::uint32_t>(0x46554747);
  s.put<std::uint32_t>(3);
  s.put<std::uint64_t>(tensors_.size());
  s.put<std::uint64_t>(kv.size());
  for (const auto& [key, v] : kv) {
    s.put_string(key);
    s.put<std::uint32_t>(static_cast<std::uint32_t>(v.type()));
    s.put_value(v);
  }
  std::uint64_t offset = 0;
  for (const auto& t : tensors_) {
    s.put_string(t.name);
    s.put<std::uint32_t>(static_cast<std::uint32_t>(t.ne.size()));
    for (auto d : t.ne) s.put<std::uint64_t>(static_cast<std::uint64_t>(d));
    s.put<std::uint32_t>(static_cast<std::uint32_t>(t.type));
    s.put<std::uint64_t>(offset);
    offset += t.data.size();
    offset += (alignment_ - offset % alignment_) % alignment_;
  }
  s.pad_to(alignment_);
  for (const auto& t : tensors_) {
    s.append(t.data.data(), t.data.size());
    s.pad_to(alignment_);
  }
  return std::move(s.bytes);
}

void GgufWriter::write(const std::string& path) const {
  const std::vector<std::uint8_t> b = to_bytes();
  write_file_atomically(path, b.data(), b.size(), "GGUF file");
}

}  // namespace numattn
