// numattn.methods() and numattn.transforms(): the catalogues (model/catalogue.h), as plain dicts.
#include <nanobind/stl/string.h>

#include "common.h"
#include "numattn/attention/registry.h"
#include "numattn/core/blas.h"
#include "numattn/model/catalogue.h"

namespace numattn::py {

namespace {

// The library's JSON (model/catalogue.h) as Python objects: dicts keep its key order.
nb::object to_python(const nlohmann::ordered_json& j) {
  switch (j.type()) {
    case nlohmann::json::value_t::null: return nb::none();
    case nlohmann::json::value_t::boolean: return nb::bool_(j.get<bool>());
    case nlohmann::json::value_t::number_integer: return nb::int_(j.get<std::int64_t>());
    case nlohmann::json::value_t::number_unsigned: return nb::int_(j.get<std::uint64_t>());
    case nlohmann::json::value_t::number_float: return nb::float_(j.get<double>());
    case nlohmann::json::value_t::string: return nb::str(j.get_ref<const std::string&>().c_str());
    case nlohmann::json::value_t::array: {
      nb::list l;
      for (const auto& x : j) l.append(to_python(x));
      return l;
    }
    case nlohmann::json::value_t::object: {
      nb::dict d;
      for (const auto& [k, v] : j.items()) d[nb::str(k.c_str())] = to_python(v);
      return d;
    }
    default: break;
  }
  throw Error("numattn: a catalogue entry holds a JSON value of no Python type");
}

}  // namespace

void bind_methods(nb::module_& m) {
  m.def(
      "methods",
      [] { return nb::borrow<nb::list>(to_python(method_catalogue(false))); },
      R"doc(The method catalogue, in catalogue order (what `numattn methods` prints).

Returns a list of dicts, one per registered method: ``name`` ("family.name"), ``spec`` (the
canonical spec with every default filled in), ``family``, ``summary``, ``citation``,
``time_complexity`` and ``memory_complexity`` (per head), ``target`` (the mechanism it computes
or approximates), ``params`` (name, type, default, min/max or choices, doc) and
``capabilities`` (exact, causal, gqa, bool_mask, additive_mask, window, lse, decode, dk_ne_dv,
strided, deterministic, randomized).)doc");
  m.def(
      "transforms", [] { return nb::borrow<nb::list>(to_python(transform_catalogue(false))); },
      R"doc(The model transforms of ``Model.load(transform=...)``, in registry order (what `numattn
transforms --format json` prints): a list of dicts ``name``, ``family``, ``parameters`` (name,
type, default (None when required), required, min/max or choices, doc), ``cost``, ``summary``,
``citation``.)doc");
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
