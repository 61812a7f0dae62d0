/// @file gguf.h
/// GGUF reader and writer (versions 2 and 3, little-endian; version 1 is read too).
///
/// File layout (spec: ggml-org/ggml docs/gguf.md):
/// ```
/// u32 magic "GGUF"; u32 version; u64 tensor_count; u64 metadata_kv_count
/// kv[metadata_kv_count]:   string key; u32 value_type; value
/// info[tensor_count]:      string name; u32 n_dims; u64 ne[n_dims]; u32 ggml_type; u64 offset
/// zero padding up to `general.alignment` (default 32), then the data section
/// string = u64 length + bytes (no NUL); array = u32 elem_type, u64 count, elements (may nest)
/// ```
/// (Version 1 stores string lengths, counts and dims as u32.)
///
/// Shapes are in **GGUF/ggml order**: `ne[0]` is the innermost, contiguous dimension. A PyTorch
/// Linear weight `[out, in]` appears as `ne = {in, out}`: each of the `out` rows holds `in`
/// elements, and quantization blocks run along `ne[0]`.
///
/// Safety: `GgufFile` validates everything against the file size before using it. Every count
/// and length is checked to fit in the bytes that remain *before* anything is allocated, sizes
/// are computed with overflow checks, tensor data ranges must lie inside the data section and
/// respect the alignment. A corrupt, truncated or hostile file raises `numattn::Error` naming
/// the file, the byte offset and what is wrong; it never crashes or allocates unboundedly.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <variant>
#include <vector>

#include "numattn/core/error.h"
#include "numattn/quant/ggml_types.h"

namespace numattn {

/// GGUF metadata value types (ids as stored).
enum class GgufType : std::uint32_t {
  U8 = 0, I8 = 1, U16 = 2, I16 = 3, U32 = 4, I32 = 5, F32 = 6, BOOL = 7, STRING = 8,
  ARRAY = 9, U64 = 10, I64 = 11, F64 = 12,
};
/// "u8", "i32", "string", "array", ...
std::string gguf_type_name(GgufType t);

/// One metadata value: a scalar, a string, or an array of one element type (arrays may nest).
///
/// Typed getters check the stored type and throw numattn::Error on a mismatch (the message
/// names the stored and requested types); `as_int`/`as_uint`/`as_double` accept any numeric
/// type and check the value is representable.
class GgufValue {
 public:
  GgufValue() = default;  ///< an empty u8 0

  // Scalars.
  static GgufValue u8(std::uint8_t v);
  static GgufValue i8(std::int8_t v);
  static GgufValue u16(std::uint16_t v);
  static GgufValue i16(std::int16_t v);
  static GgufValue u32(std::uint32_t v);
  static GgufValue i32(std::int32_t v);
  static GgufValue u64(std::uint64_t v);
  static GgufValue i64(std::int64_t v);
  static GgufValue f32(float v);
  static GgufValue f64(double v);
  static GgufValue boolean(bool v);
  static GgufValue string(std::string v);
  // Arrays. `T` is one of uint8_t..int64_t, float, double; bool arrays use `bool_array`.
  template <class T>
  static GgufValue array(std::vector<T> v);
  static GgufValue bool_array(const std::vector<bool>& v);
  static GgufValue string_array(std::vector<std::string> v);
  /// An array of arrays; every item must be an array (GGUF nests arrays only).
  static GgufValue array_of_arrays(std::vector<GgufValue> items);

  GgufType type() const { return type_; }
  bool is_array() const { return type_ == GgufType::ARRAY; }
  /// Element type of an array (throws if not an array).
  GgufType array_type() const;
  /// Number of elements of an array (throws if not an array).
  std::size_t array_size() const;

  /// The exact stored scalar type; `T` one of uint8_t..int64_t, float, double, bool.
  template <class T>
  T get() const;
  /// Any integer (or bool) scalar, as int64 / uint64 (throws if out of range or not integral).
  std::int64_t as_int() const;
  std::uint64_t as_uint() const;
  /// Any numeric scalar as double.
  double as_double() const;
  bool as_bool() const { return get<bool>(); }
  /// A string value (view into this object).
  const std::string& as_string() const;

  /// A numeric array of exactly element type `T` (uint8_t..int64_t, float, double).
  template <class T>
  std::span<const T> array_view() const;
  /// A bool array (one byte per element, 0/1).
  std::span<const std::uint8_t> bool_array_view() const;
  /// An array of strings.
  const std::vector<std::string>& string_array_view() const;
  /// An array of arrays.
  const std::vector<GgufValue>& nested_array_view() const;
  /// Any integer array converted to int64 (e.g. token types stored as i32 or u32).
  std::vector<std::int64_t> int_array() const;
  /// Any numeric array converted to double.
  std::vector<double> double_array() const;

  /// Short human-readable form: scalars in full, strings quoted (truncated past `max_chars`),
  /// arrays as `[type; count] first items...`.
  std::string to_string(std::size_t max_chars = 60) const;

 private:
  friend class GgufParser;
  using Storage =
      std::variant<std::uint64_t, std::int64_t, double, std::string, std::vector<std::uint8_t>,
                   std::vector<std::int8_t>, std::vector<std::uint16_t>, std::vector<std::int16_t>,
                   std::vector<std::uint32_t>, std::vector<std::int32_t>, std::vector<float>,
                   std::vector<std::uint64_t>, std::vector<std::int64_t>, std::vector<double>,
                   std::vector<std::string>, std::vector<GgufValue>>;
  GgufType type_ = GgufType::U8;
  GgufType elem_ = GgufType::U8;  // arrays only
  Storage v_{std::uint64_t{0}};
};

/// One tensor of a GGUF file. `data` points into the memory-mapped file and stays valid while
/// the GgufFile that produced it lives.
struct GgufTensorInfo {
  std::string name;
  GgmlType type = GgmlType::F32;
  std::vector<std::int64_t> ne;  ///< GGUF order, ne[0] fastest; 1..4 dims, each >= 1
  std::uint64_t offset = 0;      ///< relative to the data section
  std::uint64_t size_bytes = 0;  ///< ne[0]/block·block_bytes·ne[1]·ne[2]·ne[3]
  const std::uint8_t* data = nullptr;

  /// Product of all ne.
  std::int64_t n_elements() const;
  /// Elements per row (= ne[0]).
  std::int64_t row_elems() const { return ne.empty() ? 0 : ne[0]; }
  /// Number of rows (= product of ne[1..]).
  std::int64_t n_rows() const;
  /// Bytes per row.
  std::int64_t row_bytes() const;
  /// Pointer to row `r` (0 <= r < n_rows()).
  const std::uint8_t* row(std::int64_t r) const;
  /// "[576, 49152]"
  std::string shape_string() const;
};

/// A parsed, read-only GGUF file (memory-mapped, or a caller-owned buffer).
/// Move-only; tensor data pointers stay valid while the object lives.
class GgufFile {
 public:
  /// Memory-maps and parses `path`. Throws numattn::Error if the file cannot be opened or is
  /// not a valid GGUF file.
  static GgufFile open(const std::string& path);
  /// Parses a copy of `size` bytes at `data` (tests, fuzzing). `name` appears in errors.
  static GgufFile from_bytes(const void* data, std::size_t size, std::string name = "<memory>");

  GgufFile(GgufFile&&) noexcept;
  GgufFile& operator=(GgufFile&&) noexcept;
  GgufFile(const GgufFile&) = delete;
  GgufFile& operator=(const GgufFile&) = delete;
  ~GgufFile();

  const std::string& path() const { return path_; }
  std::uint32_t version() const { return version_; }
  std::uint64_t file_size() const { return size_; }
  /// `general.alignment` or 32.
  std::uint64_t alignment() const { return alignment_; }
  /// Byte offset of the data section in the file.
  std::uint64_t data_offset() const { return data_offset_; }

  /// All key/value pairs in file order.
  const std::vector<std::pair<std::string, GgufValue>>& metadata() const { return kv_; }
  /// The value of `key`, or nullptr.
  const GgufValue* find(std::string_view key) const;
  bool has(std::string_view key) const { return find(key) != nullptr; }
  /// The value of `key`; throws numattn::Error naming the key when it is missing.
  const GgufValue& at(std::string_view key) const;
  /// Typed scalar of `key` (exact type; throws if missing or mismatched).
  template <class T>
  T get(std::string_view key) const {
    const GgufValue& v = at(key);
    try {
      return v.get<T>();
    } catch (const Error& e) {
      rethrow_for_key(key, e);
    }
  }
  /// Convenience: `key` as string / any-integer / any-number, or `def` when missing
  /// (a present key of the wrong type still throws).
  std::string get_string(std::string_view key) const;
  std::string get_string(std::string_view key, std::string def) const;
  std::int64_t get_int(std::string_view key) const;
  std::int64_t get_int(std::string_view key, std::int64_t def) const;
  double get_double(std::string_view key) const;
  double get_double(std::string_view key, double def) const;
  bool get_bool(std::string_view key, bool def) const;
  /// Arrays of `key` (throw if missing or of another element type): strings; any integer type
  /// as int64; any numeric type as double.
  const std::vector<std::string>& get_string_array(std::string_view key) const;
  std::vector<std::int64_t> get_int_array(std::string_view key) const;
  std::vector<double> get_double_array(std::string_view key) const;
  // Every typed accessor above names the file, the key, the type found and the type expected
  // when the value does not fit (GgufValue's own errors know neither the key nor the file).
  /// `general.architecture` (throws if missing).
  std::string architecture() const { return get_string("general.architecture"); }

  /// All tensors in file order.
  const std::vector<GgufTensorInfo>& tensors() const { return tensors_; }
  /// Tensor `name`, or nullptr.
  const GgufTensorInfo* find_tensor(std::string_view name) const;
  /// Tensor `name`; throws numattn::Error naming it when missing.
  const GgufTensorInfo& tensor(std::string_view name) const;

 private:
  GgufFile() = default;
  friend class GgufParser;
  /// Throws `e` again with the file and `key` named.
  [[noreturn]] void rethrow_for_key(std::string_view key, const Error& e) const;
  struct Mapping;
  std::unique_ptr<Mapping> map_;
  std::string path_;
  std::uint64_t size_ = 0;
  std::uint32_t version_ = 0;
  std::uint64_t alignment_ = 32;
  std::uint64_t data_offset_ = 0;
  std::vector<std::pair<std::string, GgufValue>> kv_;
  std::unordered_map<std::string, std::size_t> kv_index_;
  std::vector<GgufTensorInfo> tensors_;
  std::unordered_map<std::string, std::size_t> tensor_index_;
};

/// While alive, records every metadata key looked up on this thread through GgufFile::find (and
/// so through every accessor of GgufFile), present or not, in lookup order. Tests use it to check
/// that a table of hostile edits covers every key a loader reads. Instances nest.
class GgufKeyLog {
 public:
  GgufKeyLog();
  ~GgufKeyLog();
  GgufKeyLog(const GgufKeyLog&) = delete;
  GgufKeyLog& operator=(const GgufKeyLog&) = delete;
  const std::vector<std::string>& keys() const { return keys_; }
  /// Called by GgufFile::find.
  static void record(std::string_view key);

 private:
  std::vector<std::string> keys_;
  GgufKeyLog* outer_ = nullptr;
};

/// Builds a GGUF v3 file: metadata of every type, tensors given as raw bytes of any type or as
/// float32 data quantized on the way (F32, F16, BF16, Q8_0, Q4_0, Q4_1). Tensor data is padded
/// to the alignment; `general.alignment` is written when it is not the default 32.
class GgufWriter {
 public:
  /// `alignment` must be a power of two and a multiple of 8 (GGUF requires it).
  explicit GgufWriter(std::uint32_t alignment = 32);

  /// Sets (or replaces) a metadata key; keys keep their first insertion order.
  void set(const std::string& key, GgufValue v);
  /// Adds a tensor from raw bytes; `data.size()` must equal the type's size for `ne`.
  void add_tensor(const std::string& name, GgmlType type, std::vector<std::int64_t> ne,
                  std::vector<std::uint8_t> data);
  /// Adds a tensor from float32 values (`n_elements(ne)` of them, ne[0] fastest), stored as
  /// `type` (quantized with quantize_row; ne[0] must be a multiple of the block size).
  void add_tensor_f32(const std::string& name, std::vector<std::int64_t> ne, const float* values,
                      GgmlType type = GgmlType::F32);

  /// The whole file as bytes.
  std::vector<std::uint8_t> to_bytes() const;
  /// Writes the file atomically (core/file_io.h: on any failure the previous file at `path`
  /// is left unchanged). Throws numattn::Error on I/O failure, naming the path and the reason.
  void write(const std::string& path) const;

 private:
  struct Tensor {
    std::string name;
    GgmlType type;
    std::vector<std::int64_t> ne;
    std::vector<std::uint8_t> data;
  };
  std::uint32_t alignment_;
  std::vector<std::pair<std::string, GgufValue>> kv_;
  std::vector<Tensor> tensors_;
};

}  // namespace numattn
