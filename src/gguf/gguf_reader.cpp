// GGUF reader: memory-maps a file and parses it with every size checked before use.
//
// The rule that keeps hostile files harmless: before reading N items or allocating for them,
// check that N times the *smallest* encoded size of one item fits in the bytes that remain.
// Memory use is then bounded by a small constant times the file size, whatever the counts say.
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <bit>
#include <cstring>
#include <limits>

#include "numattn/gguf/gguf.h"

#include "numattn/core/file_io.h"
#include "numattn/core/memory.h"

// GGUF is little-endian and values are copied with memcpy.
static_assert(std::endian::native == std::endian::little, "numattn GGUF I/O assumes a little-endian host");

namespace numattn {

// ---- mapping -----------------------------------------------------------------------------------

struct GgufFile::Mapping {
  const std::uint8_t* data = nullptr;
  std::size_t size = 0;
  void* mmap_base = nullptr;        // set when memory-mapped
  std::vector<std::uint8_t> owned;  // set when parsed from a copy

  ~Mapping() {
    if (mmap_base) ::munmap(mmap_base, size);
  }
};

GgufFile::GgufFile(GgufFile&&) noexcept = default;
GgufFile& GgufFile::operator=(GgufFile&&) noexcept = default;
GgufFile::~GgufFile() = default;

// ---- tensor info helpers ---------------------------------------------------------------------

std::int64_t GgufTensorInfo::n_elements() const {
  std::int64_t n = 1;
  for (auto d : ne) n *= d;  // the parser checked this cannot overflow
  return n;
}

std::int64_t GgufTensorInfo::n_rows() const {
  std::int64_t n = 1;
  for (std::size_t i = 1; i < ne.size(); ++i) n *= ne[i];
  return n;
}

std::int64_t GgufTensorInfo::row_bytes() const { return ggml_row_bytes(type, row_elems()); }

const std::uint8_t* GgufTensorInfo::row(std::int64_t r) const {
  NUMATTN_CHECK(r >= 0 && r < n_rows(), "tensor '{}': row {} out of range [0, {})", name, r,
                n_rows());
  return data + static_cast<std::size_t>(r) * static_cast<std::size_t>(row_bytes());
}

std::string GgufTensorInfo::shape_string() const {
  std::string s = "[";
  for (std::size_t i = 0; i < ne.size(); ++i) s += (i ? ", " : "") + std::to_string(ne[i]);
  return s + "]";
}

// ---- parser ------------------------------------------------------------------------------------

namespace {
constexpr std::uint32_t kMagic = 0x46554747;  // "GGUF" read as a little-endian u32
constexpr int kMaxArrayDepth = 8;             // nesting guard against stack exhaustion
constexpr std::uint32_t kMaxDims = 4;         // GGML_MAX_DIMS
}  // namespace

class GgufParser {
 public:
  GgufParser(const std::uint8_t* p, std::uint64_t size, const std::string& name)
      : p_(p), size_(size), name_(name) {}

  void parse(GgufFile& f) {
    const std::uint32_t magic = read<std::uint32_t>("magic");
    if (magic != kMagic)
      fail_at(0, "not a GGUF file (magic bytes {:02x} {:02x} {:02x} {:02x}, expected 47 47 55 46 "
                 "= \"GGUF\")",
              p_[0], p_[1], p_[2], p_[3]);
    const std::uint32_t version = read<std::uint32_t>("version");
    if (version > 0xFFFF && (version & 0xFFFF) == 0)
      fail_at(4, "big-endian GGUF (version bytes {:08x}) is not supported", version);
    if (version < 1 || version > 3) fail_at(4, "unsupported GGUF version {} (1, 2 or 3 expected)", version);
    v1_ = version == 1;
    f.version_ = version;

    const std::uint64_t n_tensors = read_count("tensor_count");
    const std::uint64_t n_kv = read_count("metadata_kv_count");
    // Smallest key/value: empty key (length field) + type + 1-byte value.
    check_count(n_kv, count_bytes() + 4 + 1, "metadata_kv_count");
    f.kv_.reserve(n_kv);
    for (std::uint64_t i = 0; i < n_kv; ++i) {
      const std::uint64_t at = pos_;
      std::string key = read_string("metadata key");
      const GgufType t = read_type("metadata value type");
      GgufValue v = read_value(t, 0);
      if (f.kv_index_.count(key)) fail_at(at, "duplicate metadata key '{}'", key);
      f.kv_index_.emplace(key, f.kv_.size());
      f.kv_.emplace_back(std::move(key), std::move(v));
    }

    f.alignment_ = 32;
    if (const GgufValue* a = f.find("general.alignment")) {
      if (a->type() != GgufType::U32)
        fail_at(pos_, "general.alignment must be a u32, got {}", gguf_type_name(a->type()));
      const std::uint32_t al = a->get<std::uint32_t>();
      if (al == 0 || (al & (al - 1)) != 0)
        fail_at(pos_, "general.alignment = {} is not a power of two", al);
      f.alignment_ = al;
    }

    // Smallest tensor info: empty name + n_dims + one dim + type + offset.
    check_count(n_tensors, count_bytes() + 4 + count_bytes() + 4 + 8, "tensor_count");
    f.tensors_.reserve(n_tensors);
    for (std::uint64_t i = 0; i < n_tensors; ++i) f.tensors_.push_back(read_tensor_info(f, i));

    // The data section starts at the next multiple of the alignment.
    const std::uint64_t end_infos = pos_;
    const std::uint64_t pad = (f.alignment_ - end_infos % f.alignment_) % f.alignment_;
    f.data_offset_ = end_infos + pad;  // cannot overflow: end_infos <= size_ < 2^63
    const std::uint64_t data_size = f.data_offset_ <= size_ ? size_ - f.data_offset_ : 0;
    if (n_tensors > 0 && f.data_offset_ > size_)
      fail_at(end_infos, "truncated: the data section would start at byte {} past the end", f.data_offset_);

    for (auto& t : f.tensors_) {
      if (t.offset % f.alignment_ != 0)
        fail(fmt::format("tensor '{}': data offset {} is not a multiple of the alignment {}",
                         t.name, t.offset, f.alignment_));
      if (t.offset > data_size || t.size_bytes > data_size - t.offset)
        fail(fmt::format("tensor '{}': data [{}, +{}) lies outside the {}-byte data section "
                         "(file truncated or offset corrupt)",
                         t.name, t.offset, t.size_bytes, data_size));
      t.data = p_ + f.data_offset_ + t.offset;
    }
  }

 private:
  template <class... A>
  [[noreturn]] void fail_at(std::uint64_t at, fmt::format_string<A...> f, A&&... a) {
    throw Error(fmt::format("{}: corrupt GGUF at byte {}: {}", name_, at,
                            fmt::format(f, std::forward<A>(a)...)));
  }
  [[noreturn]] void fail(const std::string& msg) {
    throw Error(fmt::format("{}: corrupt GGUF: {}", name_, msg));
  }

  std::uint64_t remaining() const { return size_ - pos_; }
  std::uint64_t count_bytes() const { return v1_ ? 4 : 8; }

  void need(std::uint64_t n, const char* what) {
    if (n > remaining())
      fail_at(pos_, "truncated: {} needs {} bytes, only {} remain", what, n, remaining());
  }
  // `count` items of at least `min_bytes` each must fit in what remains.
  void check_count(std::uint64_t count, std::uint64_t min_bytes, const char* what) {
    if (count > remaining() / min_bytes)
      fail_at(pos_, "{} = {} cannot fit in the {} remaining bytes (corrupt or hostile count)",
              what, count, remaining());
  }

  template <class T>
  T read(const char* what) {
    need(sizeof(T), what);
    T v;
    std::memcpy(&v, p_ + pos_, sizeof(T));  // host is little-endian (x86-64, aarch64)
    pos_ += sizeof(T);
    return v;
  }
  std::uint64_t read_count(const char* what) {
    return v1_ ? read<std::uint32_t>(what) : read<std::uint64_t>(what);
  }
  std::string read_string(const char* what) {
    const std::uint64_t len = read_count(what);
    need(len, what);
    std::string s(reinterpret_cast<const char*>(p_ + pos_), static_cast<std::size_t>(len));
    pos_ += len;
    return s;
  }
  GgufType read_type(const char* what) {
    const std::uint64_t at = pos_;
    const std::uint32_t t = read<std::uint32_t>(what);
    if (t > static_cast<std::uint32_t>(GgufType::F64)) fail_at(at, "unknown {} {}", what, t);
    return static_cast<GgufType>(t);
  }

  static std::uint64_t min_value_bytes(GgufType t, std::uint64_t count_bytes) {
    switch (t) {
      case GgufType::U8: case GgufType::I8: case GgufType::BOOL: return 1;
      case GgufType::U16: case GgufType::I16: return 2;
      case GgufType::U32: case GgufType::I32: case GgufType::F32: return 4;
      case GgufType::U64: case GgufType::I64: case GgufType::F64: return 8;
      case GgufType::STRING: return count_bytes;
      case GgufType::ARRAY: return 4 + count_bytes;
    }
    return 1;
  }

  template <class T>
  GgufValue read_numeric_array(std::uint64_t n) {
    std::vector<T> v(static_cast<std::size_t>(n));  // n·sizeof(T) bytes were checked to remain
    if (n) std::memcpy(v.data(), p_ + pos_, static_cast<std::size_t>(n) * sizeof(T));
    pos_ += n * sizeof(T);
    return GgufValue::array(std::move(v));
  }

  GgufValue read_value(GgufType t, int depth) {
    switch (t) {
      case GgufType::U8: return GgufValue::u8(read<std::uint8_t>("u8 value"));
      case GgufType::I8: return GgufValue::i8(read<std::int8_t>("i8 value"));
      case GgufType::U16: return GgufValue::u16(read<std::uint16_t>("u16 value"));
      case GgufType::I16: return GgufValue::i16(read<std::int16_t>("i16 value"));
      case GgufType::U32: return GgufValue::u32(read<std::uint32_t>("u32 value"));
      case GgufType::I32: return GgufValue::i32(read<std::int32_t>("i32 value"));
      case GgufType::U64: return GgufValue::u64(read<std::uint64_t>("u64 value"));
      case GgufType::I64: return GgufValue::i64(read<std::int64_t>("i64 value"));
      case GgufType::F32: return GgufValue::f32(read<float>("f32 value"));
      case GgufType::F64: return GgufValue::f64(read<double>("f64 value"));
      case GgufType::BOOL: {
        const std::uint64_t at = pos_;
        const std::uint8_t b = read<std::uint8_t>("bool value");
        if (b > 1) fail_at(at, "bool value {} is neither 0 nor 1", b);
        return GgufValue::boolean(b != 0);
      }
      case GgufType::STRING: return GgufValue::string(read_string("string value"));
      case GgufType::ARRAY: break;
    }
    if (depth >= kMaxArrayDepth) fail_at(pos_, "arrays nested deeper than {}", kMaxArrayDepth);
    const GgufType et = read_type("array element type");
    const std::uint64_t n = read_count("array length");
    check_count(n, min_value_bytes(et, count_bytes()), "array length");
    switch (et) {
      case GgufType::U8: return read_numeric_array<std::uint8_t>(n);
      case GgufType::I8: return read_numeric_array<std::int8_t>(n);
      case GgufType::U16: return read_numeric_array<std::uint16_t>(n);
      case GgufType::I16: return read_numeric_array<std::int16_t>(n);
      case GgufType::U32: return read_numeric_array<std::uint32_t>(n);
      case GgufType::I32: return read_numeric_array<std::int32_t>(n);
      case GgufType::U64: return read_numeric_array<std::uint64_t>(n);
      case GgufType::I64: return read_numeric_array<std::int64_t>(n);
      case GgufType::F32: return read_numeric_array<float>(n);
      case GgufType::F64: return read_numeric_array<double>(n);
      case GgufType::BOOL: {
        std::vector<bool> v(static_cast<std::size_t>(n));
        for (std::uint64_t i = 0; i < n; ++i) {
          const std::uint64_t at = pos_;
          const std::uint8_t b = read<std::uint8_t>("bool value");
          if (b > 1) fail_at(at, "bool value {} is neither 0 nor 1", b);
          v[i] = b != 0;
        }
        return GgufValue::bool_array(v);
      }
      case GgufType::STRING: {
        std::vector<std::string> v;
        v.reserve(static_cast<std::size_t>(n));
        for (std::uint64_t i = 0; i < n; ++i) v.push_back(read_string("string array element"));
        return GgufValue::string_array(std::move(v));
      }
      case GgufType::ARRAY: {
        std::vector<GgufValue> v;
        v.reserve(static_cast<std::size_t>(n));
        for (std::uint64_t i = 0; i < n; ++i) v.push_back(read_value(GgufType::ARRAY, depth + 1));
        return GgufValue::array_of_arrays(std::move(v));
      }
    }
    fail_at(pos_, "unreachable array type");
  }

  GgufTensorInfo read_tensor_info(GgufFile& f, std::uint64_t index) {
    const std::uint64_t at = pos_;
    GgufTensorInfo t;
    t.name = read_string("tensor name");
    if (f.tensor_index_.count(t.name)) fail_at(at, "duplicate tensor name '{}'", t.name);
    const std::uint32_t n_dims = read<std::uint32_t>("tensor n_dims");
    if (n_dims < 1 || n_dims > kMaxDims)
      fail_at(at, "tensor '{}' has {} dimensions (1..{} supported)", t.name, n_dims, kMaxDims);
    // The product of max(ne, 1) must fit in int64, so that every partial product (rows,
    // elements) does too, even when a zero dimension makes the total 0.
    std::uint64_t n_el = 1, n_nonzero = 1;
    for (std::uint32_t d = 0; d < n_dims; ++d) {
      const std::uint64_t ne = read_count("tensor dimension");
      if (ne > static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max()) ||
          mul_overflows(n_nonzero, ne == 0 ? 1 : ne, &n_nonzero) ||
          n_nonzero > static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max()))
        fail_at(at, "tensor '{}': the element count overflows int64 (dimension {} = {})", t.name,
                d, ne);
      n_el *= ne;  // <= n_nonzero
      t.ne.push_back(static_cast<std::int64_t>(ne));
    }
    const std::uint64_t type_at = pos_;
    const std::uint32_t type = read<std::uint32_t>("tensor type");
    const GgmlTypeInfo* ti = ggml_type_info(type);
    if (!ti) fail_at(type_at, "tensor '{}' has unknown ggml type id {}", t.name, type);
    t.type = static_cast<GgmlType>(type);
    if (t.ne[0] % ti->block_elems != 0)
      fail_at(at, "tensor '{}': ne[0] = {} is not a multiple of the {} block size {}", t.name,
              t.ne[0], ti->name, ti->block_elems);
    // Bytes = (n_el / block_elems) · block_bytes, checked (cf. CVE-2026-33298).
    if (mul_overflows(n_el / static_cast<std::uint64_t>(ti->block_elems),
                      static_cast<std::uint64_t>(ti->block_bytes), &t.size_bytes))
      fail_at(at, "tensor '{}': the byte size overflows", t.name);
    t.offset = read<std::uint64_t>("tensor offset");
    f.tensor_index_.emplace(t.name, static_cast<std::size_t>(index));
    return t;
  }

  const std::uint8_t* p_;
  std::uint64_t size_;
  std::uint64_t pos_ = 0;
  const std::string& name_;
  bool v1_ = false;
};

// ---- GgufFile ----------------------------------------------------------------------------------

GgufFile GgufFile::open(const std::string& path) {
  // A regular file only (a FIFO is never opened, a device never mapped); its size bounds every
  // table and tensor the parser accepts, and must fit the address space to be mapped.
  const InputFile in(path, "GGUF file", kSizedByHeader);
  in.check_mappable();
  auto m = std::make_unique<Mapping>();
  m->size = static_cast<std::size_t>(in.size());
  if (m->size > 0) {
    void* base = ::mmap(nullptr, m->size, PROT_READ, MAP_PRIVATE, in.fd(), 0);
    if (base == MAP_FAILED) {
      const int e = errno;
      throw Error(fmt::format("cannot mmap GGUF file '{}' ({}): {}", path, format_bytes(m->size),
                              std::strerror(e)));
    }
    m->mmap_base = base;
    m->data = static_cast<const std::uint8_t*>(base);
  }
  // The mapping keeps the file alive after `in` closes it.
  GgufFile f;
  f.path_ = path;
  f.size_ = m->size;
  f.map_ = std::move(m);
  if (f.size_ < 8) throw Error(fmt::format("{}: not a GGUF file ({} bytes, too short)", path, f.size_));
  GgufParser(f.map_->data, f.size_, f.path_).parse(f);
  return f;
}

GgufFile GgufFile::from_bytes(const void* data, std::size_t size, std::string name) {
  GgufFile f;
  f.path_ = std::move(name);
  auto m = std::make_unique<Mapping>();
  m->owned.assign(static_cast<const std::uint8_t*>(data), static_cast<const std::uint8_t*>(data) + size);
  m->data = m->owned.data();
  m->size = size;
  f.size_ = size;
  f.map_ = std::move(m);
  if (f.size_ < 8) throw Error(fmt::format("{}: not a GGUF file ({} bytes, too short)", f.path_, f.size_));
  GgufParser(f.map_->data, f.size_, f.path_).parse(f);
  return f;
}

namespace {
thread_local GgufKeyLog* t_key_log = nullptr;
}  // namespace

GgufKeyLog::GgufKeyLog() : outer_(t_key_log) { t_key_log = this; }
GgufKeyLog::~GgufKeyLog() { t_key_log = outer_; }
void GgufKeyLog::record(std::string_view key) {
  for (GgufKeyLog* l = t_key_log; l != nullptr; l = l->outer_) l->keys_.emplace_back(key);
}

const GgufValue* GgufFile::find(std::string_view key) const {
  if (t_key_log != nullptr) GgufKeyLog::record(key);
  auto it = kv_index_.find(std::string(key));
  return it == kv_index_.end() ? nullptr : &kv_[it->second].second;
}

const GgufValue& GgufFile::at(std::string_view key) const {
  const GgufValue* v = find(key);
  NUMATTN_CHECK(v != nullptr, "{}: metadata key '{}' is missing", path_, key);
  return *v;
}

namespace {
// Re-throws a value-type error with the key and file named.
template <class F>
auto with_key(const std::string& path, std::string_view key, F fn) -> decltype(fn()) {
  try {
    return fn();
  } catch (const Error& e) {
    throw Error(fmt::format("{}: metadata key '{}': {}", path, key, e.what()));
  }
}
}  // namespace

std::string GgufFile::get_string(std::string_view key) const {
  const GgufValue& v = at(key);
  return with_key(path_, key, [&] { return v.as_string(); });
}
std::string GgufFile::get_string(std::string_view key, std::string def) const {
  const GgufValue* v = find(key);
  return v ? with_key(path_, key, [&] { return v->as_string(); }) : def;
}
std::int64_t GgufFile::get_int(std::string_view key) const {
  const GgufValue& v = at(key);
  return with_key(path_, key, [&] { return v.as_int(); });
}
std::int64_t GgufFile::get_int(std::string_view key, std::int64_t def) const {
  const GgufValue* v = find(key);
  return v ? with_key(path_, key, [&] { return v->as_int(); }) : def;
}
double GgufFile::get_double(std::string_view key) const {
  const GgufValue& v = at(key);
  return with_key(path_, key, [&] { return v.as_double(); });
}
double GgufFile::get_double(std::string_view key, double def) const {
  const GgufValue* v = find(key);
  return v ? with_key(path_, key, [&] { return v->as_double(); }) : def;
}
bool GgufFile::get_bool(std::string_view key, bool def) const {
  const GgufValue* v = find(key);
  return v ? with_key(path_, key, [&] { return v->as_bool(); }) : def;
}
const std::vector<std::string>& GgufFile::get_string_array(std::string_view key) const {
  const GgufValue& v = at(key);
  return with_key(path_, key, [&]() -> const std::vector<std::string>& { return v.string_array_view(); });
}
std::vector<std::int64_t> GgufFile::get_int_array(std::string_view key) const {
  const GgufValue& v = at(key);
  return with_key(path_, key, [&] { return v.int_array(); });
}
std::vector<double> GgufFile::get_double_array(std::string_view key) const {
  const GgufValue& v = at(key);
  return with_key(path_, key, [&] { return v.double_array(); });
}

void GgufFile::rethrow_for_key(std::string_view key, const Error& e) const {
  throw Error(fmt::format("{}: metadata key '{}': {}", path_, key, e.what()));
}

const GgufTensorInfo* GgufFile::find_tensor(std::string_view name) const {
  auto it = tensor_index_.find(std::string(name));
  return it == tensor_index_.end() ? nullptr : &tensors_[it->second];
}

const GgufTensorInfo& GgufFile::tensor(std::string_view name) const {
  const GgufTensorInfo* t = find_tensor(name);
  NUMATTN_CHECK(t != nullptr, "{}: tensor '{}' not found ({} tensors in the file)", path_, name,
                tensors_.size());
  return *t;
}

}  // namespace numattn
