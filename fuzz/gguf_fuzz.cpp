// libFuzzer target for the GGUF reader and the dequantizers.
//
// Any input must either parse or raise numattn::Error; ASan/UBSan flag everything else
// (out-of-bounds reads, overflow, huge allocations via -rss_limit_mb / -malloc_limit_mb).
// Seeds: fuzz/corpus/gguf/, written by running the target once with the environment variable
// NUMATTN_FUZZ_SEEDS=DIR (a few small valid files: every metadata type, every writable tensor
// type, into DIR).
#include <cstdint>
#include <cstdlib>
#include <string>

#include "numattn/gguf/gguf.h"
#include "numattn/gguf/tensor_data.h"

namespace {

void write_seeds(const std::string& dir) {
  using namespace numattn;
  GgufWriter w;
  w.set("general.architecture", GgufValue::string("llama"));
  w.set("u8", GgufValue::u8(1));
  w.set("i16", GgufValue::i16(-2));
  w.set("u32", GgufValue::u32(3));
  w.set("f32", GgufValue::f32(0.5f));
  w.set("u64", GgufValue::u64(7));
  w.set("f64", GgufValue::f64(0.25));
  w.set("b", GgufValue::boolean(true));
  w.set("s", GgufValue::string("x"));
  w.set("as", GgufValue::string_array({"a", "b c"}));
  w.set("ai", GgufValue::array<std::int32_t>({1, 2, 3}));
  w.set("ab", GgufValue::bool_array({true, false}));
  w.set("an", GgufValue::array_of_arrays({GgufValue::array<float>({1.f})}));
  float x[64];
  for (int i = 0; i < 64; ++i) x[i] = static_cast<float>(i % 11) - 5.f;
  w.add_tensor_f32("f32", {2, 2}, x, GgmlType::F32);
  w.add_tensor_f32("f16", {4}, x, GgmlType::F16);
  w.add_tensor_f32("bf16", {4}, x, GgmlType::BF16);
  w.add_tensor_f32("q8", {32, 2}, x, GgmlType::Q8_0);
  w.add_tensor_f32("q40", {32}, x, GgmlType::Q4_0);
  w.add_tensor_f32("q41", {32}, x, GgmlType::Q4_1);
  w.write(dir + "/seed_all.gguf");
  GgufWriter k(64);
  k.add_tensor("q4k", GgmlType::Q4_K, {256}, std::vector<std::uint8_t>(144, 0x11));
  k.add_tensor("q6k", GgmlType::Q6_K, {256}, std::vector<std::uint8_t>(210, 0x22));
  k.add_tensor("q50", GgmlType::Q5_0, {32}, std::vector<std::uint8_t>(22, 0x33));
  k.add_tensor("q51", GgmlType::Q5_1, {32}, std::vector<std::uint8_t>(24, 0x44));
  k.write(dir + "/seed_kquants.gguf");
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  if (const char* d = std::getenv("NUMATTN_FUZZ_SEEDS")) write_seeds(d);
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace numattn;
  try {
    const GgufFile f = GgufFile::from_bytes(data, size, "fuzz");
    for (const auto& [key, v] : f.metadata()) (void)v.to_string();
    (void)f.get_string("general.architecture", "");
    std::vector<float> buf;
    for (const auto& t : f.tensors()) {
      if (!ggml_type_info(t.type).dequantizable) continue;
      // Data lies inside the input (checked by the parser), so this is bounded by `size`
      // except for element counts of types with more elements than bytes (F16: 2 bytes).
      if (t.n_elements() > (1 << 22)) continue;
      buf.resize(static_cast<std::size_t>(t.n_elements()));
      dequantize_tensor(t, buf.data(), ExecContext{1});
      if (t.n_rows() > 0) dequantize_rows(t, t.n_rows() - 1, 1, buf.data());
    }
  } catch (const Error&) {
    // Expected for malformed input.
  }
  return 0;
}
