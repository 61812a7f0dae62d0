// numattn.methods(): the method catalogue (registry.h), as plain dicts.
#include <nanobind/stl/string.h>

#include "common.h"
#include "numattn/attention/registry.h"
#include "numattn/core/blas.h"

namespace numattn::py {

namespace {

const char* type_name(ParamType t) {
  switch (t) {
    case ParamType::kInt: return "int";
    case ParamType::kFloat: return "float";
    case ParamType::kBool: return "bool";
    case ParamType::kString: return "str";
  }
  return "?";
}

nb::dict method_dict(const MethodInfo& m) {
  nb::dict d;
  d["name"] = m.name;
  d["spec"] = create_method(m.name)->spec();
  d["family"] = m.family;
  d["summary"] = m.summary;
  d["citation"] = m.citation;
  d["time_complexity"] = m.time_complexity;
  d["memory_complexity"] = m.memory_complexity;
  d["target"] = create_method(m.name)->target().name();
  nb::list params;
  for (const ParamSpec& p : m.params) {
    nb::dict pd;
    pd["name"] = p.name;
    pd["type"] = type_name(p.type);
    pd["default"] = p.default_value;
    if (p.type == ParamType::kInt || p.type == ParamType::kFloat) {
      pd["min"] = p.min;
      pd["max"] = p.max;
    }
    if (!p.choices.empty()) {
      nb::list c;
      for (const auto& x : p.choices) c.append(x);
      pd["choices"] = c;
    }
    pd["doc"] = p.doc;
    params.append(pd);
  }
  d["params"] = params;
  const Capabilities& c = m.caps;
  nb::dict caps;
  caps["exact"] = c.exact;
  caps["causal"] = c.causal;
  caps["gqa"] = c.gqa;
  caps["bool_mask"] = c.bool_mask;
  caps["additive_mask"] = c.additive_mask;
  caps["window"] = c.window;
  caps["lse"] = c.lse;
  caps["decode"] = c.decode;
  caps["dk_ne_dv"] = c.dk_ne_dv;
  caps["strided"] = c.strided;
  caps["deterministic"] = c.deterministic;
  caps["randomized"] = c.randomized;
  d["capabilities"] = caps;
  return d;
}

}  // namespace

void bind_methods(nb::module_& m) {
  m.def(
      "methods",
      [] {
        nb::list out;
        for (const MethodInfo* info : list_methods()) out.append(method_dict(*info));
        return out;
      },
      R"doc(The method catalogue, in catalogue order (what `numattn methods` prints).

Returns a list of dicts, one per registered method: ``name`` ("family.name"), ``spec`` (the
canonical spec with every default filled in), ``family``, ``summary``, ``citation``,
``time_complexity`` and ``memory_complexity`` (per head), ``target`` (the mechanism it computes
or approximates), ``params`` (name, type, default, min/max or choices, doc) and
``capabilities`` (exact, causal, gqa, bool_mask, additive_mask, window, lse, decode, dk_ne_dv,
strided, deterministic, randomized).)doc");
  m.def(
      "blas_info",
      [] {
        nb::dict d;
        d["library"] = blas::library_name();
        d["core"] = blas::core_name();
        const char* rec = blas::recommended_coretype();
        d["recommended_coretype"] = rec ? nb::cast(std::string(rec)) : nb::none();
        return d;
      },
      R"doc(The linked BLAS (OpenBLAS): ``library`` (its configuration string), ``core`` (the kernel
family it chose when it loaded) and ``recommended_coretype``: the OPENBLAS_CORETYPE that fits
this CPU when OpenBLAS fell back to its generic "Prescott" kernels (5–10× slower GEMM, and
last-bit differences from the numattn CLI, which restarts itself with it), else None. OpenBLAS
reads the variable only when it loads, which in Python is the first ``import numpy``: set it in
the environment before starting Python.)doc");
  m.def(
      "canonical_spec",
      [](const std::string& spec) { return create_method(spec)->spec(); }, nb::arg("spec"),
      R"doc(The canonical form of a method spec (defaults filled in), e.g.
``canonical_spec("lowrank.nystrom")`` gives the spec with its landmark count. Raises numattn.Error
(a ValueError) for an unknown method or a bad parameter, listing the valid ones.)doc");
}

}  // namespace numattn::py
