#!/usr/bin/env python3
"""What each layer may include (docs/design.md, "What may include what").

Scans every file under include/numattn/<layer>/ and src/<layer>/ for the includes of another
layer: `#include "numattn/<layer>/..."` (or <...>), and the includes relative to src/ or to the
file's own folder (`#include "model/tokenizer_unicode.h"`, `#include "qgemv_simd.h"`). A layer
always includes itself; RULES says what else it may include. Three more rules:
- inside attention/, a method family's folder (FAMILIES: exact, kernel, lowrank, sparse, tensor,
  auto) includes no other family; blocks/ is the floor they share and includes no family;
- bench/ includes nothing from tools/ (the CLI's folder), by an include or by its CMakeLists;
- library code looks no method up by name: no `create_method("...")` with a literal spec in src/
  outside the registry itself (a method object comes from its class or the registry's typed
  factory, an exact sub-problem from blocks/dense_softmax.h).
Prints `file:line: rule` for every line that breaks a rule and exits 1; 0 when there is none.

KNOWN_VIOLATIONS are files that break a rule today and are being fixed by their owners. The list
must shrink to empty: a file on it that no longer breaks a rule fails the check too (take it off
the list).

Usage: include_layers.py REPO_ROOT"""
import pathlib
import re
import sys

# layer: ("only", layers it may include besides itself) or ("not", layers it must not include).
# The strict order at the bottom: core < quant < gguf < arch < (transform, model, ...), and
# model over transform (the weight rewrites take and return arch/ structs, never model/ ones).
RULES = {
    "core": ("only", set()),
    "quant": ("only", {"core"}),
    "gguf": ("only", {"core", "quant"}),
    "arch": ("only", {"core", "quant", "gguf"}),
    "transform": ("not", {"model"}),
    # Attention sits under the layers that run it: the model, the analyses, the distributed
    # runner. Methods of those layers register from their own folders (src/methods.cpp).
    "attention": ("not", {"analysis", "dist", "model", "transform"}),
}

# The method families of attention/ (folders under src/attention and include/numattn/attention).
FAMILIES = {"exact", "kernel", "lowrank", "sparse", "tensor", "auto"}
FLOOR = "blocks"  # shared by every family, includes none

CREATE_BY_NAME = re.compile(r'create_method\(\s*"')
REGISTRY = "src/attention/registry.cpp"

# Files that break a rule today (repository-relative paths). This list must shrink to empty; a
# listed file that no longer breaks a rule makes the check fail, so it cannot go stale.
# path -> what is being done about it.
KNOWN_VIOLATIONS: dict = {}

INCLUDE = re.compile(r'^\s*#\s*include\s*[<"]([^>"]+)[>"]')


def describe(layer):
    kind, layers = RULES[layer]
    if kind == "only":
        allowed = sorted(layers)
        return f"{layer} may include only {', '.join(allowed + [layer]) if allowed else layer}"
    return f"{layer} must not include {', '.join(sorted(layers))}"


def allowed(layer, target):
    if target == layer or layer not in RULES:
        return True
    kind, layers = RULES[layer]
    return target in layers if kind == "only" else target not in layers


def attention_folder(root, path):
    """The folder of attention/ that `path` lies in (a family, the floor, or None at its root)."""
    for base in (root / "src" / "attention", root / "include" / "numattn" / "attention"):
        try:
            rel = path.resolve().relative_to(base.resolve())
        except ValueError:
            continue
        return rel.parts[0] if len(rel.parts) > 1 else None
    return None


def family_rule(root, path, inc):
    """The family rule `path`'s include `inc` breaks, or None."""
    here = attention_folder(root, path)
    if here not in FAMILIES and here != FLOOR:
        return None
    parts = inc.split("/")
    candidates = [path.parent / inc, root / "src" / inc, root / "include" / inc]
    target = None
    for c in candidates:
        if c.exists():
            target = attention_folder(root, c)
            break
    else:
        if len(parts) > 2 and parts[0] == "attention":
            target = parts[1]
        elif len(parts) > 3 and parts[:2] == ["numattn", "attention"]:
            target = parts[2]
    if target is None or target == here or target not in FAMILIES:
        return None
    if here == FLOOR:
        return "blocks/ is the floor of the attention families and includes none of them"
    return f"the attention family {here}/ must not include another family ({target}/); share code through blocks/"


def bench_rule(root, path, inc):
    """Whether bench/ file `path`'s include `inc` names a file of tools/."""
    tools = (root / "tools").resolve()
    for c in (path.parent / inc, root / "tools" / inc, root / inc):
        try:
            c.resolve().relative_to(tools)
        except ValueError:
            continue
        if c.exists() or c == root / inc:
            return True
    return inc.startswith("tools/")


def target_layer(root, path, inc, layers):
    """The layer that include `inc` of file `path` names, or None (the standard library, a
    dependency, a test helper)."""
    parts = inc.split("/")
    if parts[0] == "numattn" and len(parts) > 2 and parts[1] in layers:
        return parts[1]
    # Relative to the including file's folder first (what the compiler tries first), then to src/.
    here = (path.parent / inc).resolve()
    for base in (root / "src", root / "include" / "numattn"):
        try:
            rel = here.relative_to(base.resolve())
        except ValueError:
            continue
        if here.exists() and len(rel.parts) > 1 and rel.parts[0] in layers:
            return rel.parts[0]
    if len(parts) > 1 and parts[0] in layers and (root / "src" / inc).exists():
        return parts[0]
    return None


def main():
    if len(sys.argv) != 2:
        print(__doc__)
        return 2
    root = pathlib.Path(sys.argv[1]).resolve()
    layers = {p.name for base in (root / "include" / "numattn", root / "src") if base.is_dir()
              for p in base.iterdir() if p.is_dir()}
    bad, offending = [], set()
    for layer in sorted(layers):
        for base in (root / "include" / "numattn" / layer, root / "src" / layer):
            for path in sorted(p for p in base.rglob("*") if p.is_file()):
                rel = path.relative_to(root).as_posix()
                try:
                    lines = path.read_text().splitlines()
                except UnicodeDecodeError:
                    continue
                for no, line in enumerate(lines, 1):
                    m = INCLUDE.match(line)
                    if not m:
                        continue
                    target = target_layer(root, path, m.group(1), layers)
                    if target is None or allowed(layer, target):
                        continue
                    offending.add(rel)
                    if rel not in KNOWN_VIOLATIONS:
                        bad.append(f"{rel}:{no}: includes {m.group(1)}: {describe(layer)}")
    # Families of attention/, and library code that finds a method by name.
    for path in sorted(p for base in (root / "src", root / "include" / "numattn") if base.is_dir()
                       for p in base.rglob("*") if p.is_file()):
        rel = path.relative_to(root).as_posix()
        try:
            lines = path.read_text().splitlines()
        except UnicodeDecodeError:
            continue
        for no, line in enumerate(lines, 1):
            m = INCLUDE.match(line)
            why = family_rule(root, path, m.group(1)) if m else None
            if why is None and rel.startswith("src/") and rel != REGISTRY and CREATE_BY_NAME.search(line):
                why = "library code creates no method by name (create_method(\"...\")); use its class or create_exact_method()"
            if why is None:
                continue
            offending.add(rel)
            if rel not in KNOWN_VIOLATIONS:
                bad.append(f"{rel}:{no}: {line.strip()}: {why}")
    # The benchmarks: no include of the CLI's folder, no include path into it.
    for path in sorted(p for p in (root / "bench").rglob("*") if p.is_file()):
        rel = path.relative_to(root).as_posix()
        try:
            lines = path.read_text().splitlines()
        except UnicodeDecodeError:
            continue
        for no, line in enumerate(lines, 1):
            m = INCLUDE.match(line)
            cmake_dir = path.name == "CMakeLists.txt" and "include_directories" in line and "/tools" in line
            if (m and bench_rule(root, path, m.group(1))) or cmake_dir:
                offending.add(rel)
                if rel not in KNOWN_VIOLATIONS:
                    bad.append(f"{rel}:{no}: {line.strip()}: bench/ must not include tools/ (the CLI's folder)")
    for rel in sorted(set(KNOWN_VIOLATIONS) - offending):
        bad.append(f"{rel}: on KNOWN_VIOLATIONS but breaks no rule any more: take it off the list")
    for line in bad:
        print(line)
    known = len(set(KNOWN_VIOLATIONS) & offending)
    print(f"include_layers: {len(bad)} problems ({known} known violations left)")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
