// The ggml type table: block size, bytes per block and name of each type id.
#include "numattn/quant/ggml_types.h"

#include <cctype>
#include <limits>

#include "numattn/core/error.h"

namespace numattn {

namespace {

// Facts per ggml type id (ggml-common.h / ggml.c type traits). Ids without an entry are unknown.
struct TypeRow {
  std::uint32_t id;
  GgmlTypeInfo info;
};
const TypeRow kTypes[] = {
    {0, {"F32", 1, 4, true, true}},        {1, {"F16", 1, 2, true, true}},
    {2, {"Q4_0", 32, 18, true, true}},     {3, {"Q4_1", 32, 20, true, true}},
    {6, {"Q5_0", 32, 22, true, false}},    {7, {"Q5_1", 32, 24, true, false}},
    {8, {"Q8_0", 32, 34, true, true}},     {9, {"Q8_1", 32, 36, false, false}},
    {10, {"Q2_K", 256, 84, false, false}}, {11, {"Q3_K", 256, 110, false, false}},
    {12, {"Q4_K", 256, 144, true, false}}, {13, {"Q5_K", 256, 176, true, false}},
    {14, {"Q6_K", 256, 210, true, false}}, {15, {"Q8_K", 256, 292, false, false}},
    {16, {"IQ2_XXS", 256, 66, false, false}}, {17, {"IQ2_XS", 256, 74, false, false}},
    {18, {"IQ3_XXS", 256, 98, false, false}}, {19, {"IQ1_S", 256, 50, false, false}},
    {20, {"IQ4_NL", 32, 18, false, false}},   {21, {"IQ3_S", 256, 110, false, false}},
    {22, {"IQ2_S", 256, 82, false, false}},   {23, {"IQ4_XS", 256, 136, false, false}},
    {24, {"I8", 1, 1, false, false}},      {25, {"I16", 1, 2, false, false}},
    {26, {"I32", 1, 4, false, false}},     {27, {"I64", 1, 8, false, false}},
    {28, {"F64", 1, 8, false, false}},     {29, {"IQ1_M", 256, 56, false, false}},
    {30, {"BF16", 1, 2, true, true}},      {34, {"TQ1_0", 256, 54, false, false}},
    {35, {"TQ2_0", 256, 66, false, false}}, {39, {"MXFP4", 32, 17, false, false}},
};

}  // namespace

const GgmlTypeInfo* ggml_type_info(std::uint32_t t) {
  for (const auto& r : kTypes)
    if (r.id == t) return &r.info;
  return nullptr;
}

const GgmlTypeInfo& ggml_type_info(GgmlType t) {
  const GgmlTypeInfo* p = ggml_type_info(static_cast<std::uint32_t>(t));
  NUMATTN_CHECK(p != nullptr, "unknown ggml tensor type id {}", static_cast<std::uint32_t>(t));
  return *p;
}

std::string ggml_type_name(GgmlType t) {
  const GgmlTypeInfo* p = ggml_type_info(static_cast<std::uint32_t>(t));
  return p ? std::string(p->name) : fmt::format("type#{}", static_cast<std::uint32_t>(t));
}

GgmlType parse_ggml_type(std::string_view name) {
  std::string up(name);
  for (char& c : up) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  for (const auto& r : kTypes)
    if (up == r.info.name) return static_cast<GgmlType>(r.id);
  throw Error(fmt::format("unknown ggml type '{}' (expected e.g. F32, F16, BF16, Q8_0, Q4_0, Q4_1)",
                          name));
}

std::int64_t ggml_row_bytes(GgmlType t, std::int64_t ne0) {
  const GgmlTypeInfo& ti = ggml_type_info(t);
  NUMATTN_CHECK(ne0 >= 0 && ne0 % ti.block_elems == 0,
                "a row of {} elements is not a whole number of {} blocks ({} elements each)", ne0,
                ti.name, ti.block_elems);
  const std::int64_t blocks = ne0 / ti.block_elems;
  NUMATTN_CHECK(blocks <= std::numeric_limits<std::int64_t>::max() / ti.block_bytes,
                "row of {} elements of {} is too large", ne0, ti.name);
  return blocks * ti.block_bytes;
}

}  // namespace numattn
