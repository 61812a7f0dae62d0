// libFuzzer target for the .npy reader (npy::read_bytes, the same code path as npy::read).
//
// Any input must either parse or raise numattn::Error; ASan/UBSan flag everything else. A
// parsed array must be self-consistent: the vector of its dtype holds exactly numel() values
// and the others are empty. Seeds: fuzz/corpus/npy/.
#include <cstdint>
#include <cstdlib>

#include "numattn/core/error.h"
#include "numattn/core/npy.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace numattn;
  try {
    const npy::Array a = npy::read_bytes(data, size, "fuzz.npy");
    const auto n = static_cast<std::size_t>(a.numel());
    const std::size_t held = a.f32.size() + a.f64.size() + a.i64.size();
    const std::size_t mine = a.dtype == npy::DType::kFloat32   ? a.f32.size()
                             : a.dtype == npy::DType::kFloat64 ? a.f64.size()
                                                               : a.i64.size();
    if (held != n || mine != n) std::abort();
    if (a.as_f32().size() != n || a.as_f64().size() != n) std::abort();
  } catch (const Error&) {
    // Expected for malformed input.
  }
  return 0;
}
