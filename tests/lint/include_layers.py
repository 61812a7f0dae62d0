#!/usr/bin/env python3
"""What each layer may include (docs/design.md, "What may include what").

Scans every file under include/numattn/<layer>/ and src/<layer>/ for the includes of another
layer: `#include "numattn/<layer>/..."` (or <...>), and the includes relative to src/ or to the
file's own folder (`#include "model/tokenizer_unicode.h"`, `#include "qgemv_simd.h"`). A layer
always includes itself; RULES says what else it may include. Prints `file:line: rule` for every
include that breaks a rule and exits 1; 0 when there is none.

KNOWN_VIOLATIONS are files that break a rule today and are being fixed. The list must shrink to
empty: a file on it that no longer breaks its rule fails the check too (take it off the list).

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
}

# Files that break a rule today (repository-relative paths). This list must shrink to empty; a
# listed file that no longer breaks a rule makes the check fail, so it cannot go stale.
KNOWN_VIOLATIONS = set()

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
    for rel in sorted(KNOWN_VIOLATIONS - offending):
        bad.append(f"{rel}: on KNOWN_VIOLATIONS but breaks no rule any more: take it off the list")
    for line in bad:
        print(line)
    known = len(KNOWN_VIOLATIONS & offending)
    print(f"include_layers: {len(bad)} problems ({known} known violations left)")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
