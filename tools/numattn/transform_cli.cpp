#include "transform_cli.h"

#include <cstdio>

#include "tensor_cli.h"
#include "numattn/core/error.h"
#include "numattn/transform/tensor_heads.h"

namespace numattn::cli {

void add_transform_options(CLI::App& sub, TransformCliOptions& o, TransformAliases aliases) {
  sub.add_option("--transform", o.transform,
                 "model transforms applied at load, left to right, separated by '|': e.g. "
                 "\"mla(rank=128,rope_heads=1)|bda(pairs=qk)\" or \"tensor.vo_cp(rank=256,iters=8)\" "
                 "(`numattn transforms` lists them and their parameters)");
  if (aliases.mla) add_mla_options(sub, o.mla);
  if (aliases.bda) {
    sub.add_option("--bda", o.bda, "deprecated alias of --transform \"bda(pairs=...)\": none | vo | qk | qkvo")
        ->capture_default_str()
        ->check(CLI::IsMember({"none", "vo", "qk", "qkvo"}));
    sub.add_option("--bda-coef", o.bda_coef,
                   "deprecated alias of --transform \"bda(coef=...)\": q8_0 | source | f32")
        ->capture_default_str()
        ->check(CLI::IsMember({"q8_0", "source", "f32"}));
  }
  if (aliases.tensor) add_tensor_alias_option(sub, o.tensor);
}

transform::TransformPipeline resolve_transforms(const CLI::App& sub, const TransformCliOptions& o) {
  auto given = [&](const char* f) {
    try {
      return sub.count(f) > 0;
    } catch (const CLI::OptionNotFound&) {
      return false;
    }
  };
  std::string alias_flags;
  for (const char* f : {"--mla-rank", "--freqfold", "--rope-heads", "--calib", "--calib-tokens", "--bda",
                        "--bda-coef", "--tensor"})
    if (given(f)) alias_flags += (alias_flags.empty() ? "" : " ") + std::string(f);
  try {
    if (given("--transform")) {
      NUMATTN_CHECK_OPTION(alias_flags.empty(), "transform", "give the transforms once: {} {} the older form of "
                           "--transform (put them in the pipeline)", alias_flags,
                           alias_flags.find(' ') == std::string::npos ? "is" : "are");
      transform::TransformPipeline p = transform::parse_transforms(o.transform);
      NUMATTN_CHECK_OPTION(!p.mla || !given("--mla-exec"), "transform",
                           "--mla-exec next to an mla stage: give exec= in mla(...)");
      return p;
    }
    if (alias_flags.empty()) return {};
    std::string spec = mla_alias_spec(sub, o.mla);
    if (o.bda != "none") spec += (spec.empty() ? "" : "|") + fmt::format("bda(pairs={},coef={})", o.bda, o.bda_coef);
    if (!o.tensor.empty())
      spec += (spec.empty() ? "" : "|") + transform::tensor_transform_spec(transform::parse_tensor_spec(o.tensor));
    transform::TransformPipeline p = transform::parse_transforms(spec);
    if (!p.empty())
      std::fprintf(stderr, "numattn: %s %s deprecated; the same: --transform \"%s\"\n", alias_flags.c_str(),
                   alias_flags.find(' ') == std::string::npos ? "is" : "are", p.canonical().c_str());
    return p;
  } catch (const OptionError&) {
    throw;  // names its own flag (an alias's, or --transform)
  } catch (const Error& e) {
    throw OptionError("transform", e.what());
  }
}

}  // namespace numattn::cli
