#!/usr/bin/env python3
"""Checks what instructions the compiler put where (core/isa_begin.h, core/cpu.h).

A build without NUMATTN_NATIVE must run on any x86-64-v3 CPU: only the dispatched variant
translation units (*_avx512.cpp, *_avx512vnni.cpp) may contain AVX-512 or VNNI instructions,
and within them only in functions that nothing else can call by mistake: local symbols or names
inside a variant namespace (`::avx512::`). A weak or global function compiled for AVX-512 outside
those (an inline function or template instantiated after a target pragma) could be picked by the
linker for a caller on a CPU without AVX-512.

Usage:
  isa_objects.py objects DIR   every *.o under DIR (a target's CMakeFiles/<t>.dir)
  isa_objects.py elf FILE...   a linked program or shared object (the Python extension): the
                               symbol rule only (the file no longer says which unit a function
                               came from)
Exit status 0 when clean, 1 with a list of offenders, 77 (skip) without objdump or nm."""
import pathlib
import re
import shutil
import subprocess
import sys

# EVEX-only state: zmm and opmask registers, xmm/ymm 16-31, masking, broadcasts, rounding.
AVX512 = re.compile(r"%zmm|%k[0-7]\b|%[xy]mm(1[6-9]|2[0-9]|3[01])\b|\{%k[1-7]\}|\{1to\d+\}|\{r[nduz]-sae\}|\{sae\}")
VNNI = re.compile(r"\bvpdpb[us]sds?\b|\bvpdpw[us]sds?\b")
VARIANT_UNIT = re.compile(r"_avx512(vnni)?\.cpp\.o$")
VNNI_UNIT = re.compile(r"_avx512vnni\.cpp\.o$")


def functions(path):
    """{mangled name: (uses AVX-512, uses VNNI)} of the functions objdump disassembles."""
    out = subprocess.run(["objdump", "-d", "--no-show-raw-insn", str(path)], capture_output=True, text=True,
                         check=True).stdout
    res, name = {}, None
    for line in out.splitlines():
        m = re.match(r"^[0-9a-f]+ <(.+)>:$", line)
        if m:
            name = m.group(1)
            res.setdefault(name, [False, False])
            continue
        if name is None or "\t" not in line:
            continue
        ins = line.split("\t", 1)[1]
        if AVX512.search(ins):
            res[name][0] = True
        if VNNI.search(ins):
            res[name][1] = True
    return res


def bindings(path):
    """{mangled name: nm type letter} (t = local text, T = global, W = weak)."""
    out = subprocess.run(["nm", str(path)], capture_output=True, text=True, check=True).stdout
    b = {}
    for line in out.splitlines():
        parts = line.split()
        if len(parts) == 3:
            b[parts[2]] = parts[1]
    return b


def demangle(names):
    if not names:
        return {}
    out = subprocess.run(["c++filt"], input="\n".join(names), capture_output=True, text=True).stdout.splitlines()
    return dict(zip(names, out))


def shared_symbol_offenders(path, fns):
    """AVX-512 functions that another unit could link to: global or weak, outside ::avx512::."""
    b = bindings(path)
    hot = [n for n, (a, v) in fns.items() if a or v]
    names = demangle(hot)
    bad = []
    for n in hot:
        base = n.split(".")[0]  # objdump's clones: name.cold, name.part.0
        kind = b.get(n, b.get(base, "t"))
        if kind.islower() and kind not in "wvu":
            continue  # a local symbol (weak, unique and upper-case kinds are visible to other units)
        if "::avx512::" in names[n] or "::avx512vnni::" in names[n]:
            continue
        bad.append(f"{path}: {names[n]} ({kind}) has AVX-512/VNNI code and is visible to other units")
    return bad


def check_objects(root):
    bad, variant_fns = [], 0
    objs = sorted(pathlib.Path(root).rglob("*.o"))
    if not objs:
        print(f"isa_objects: no object files under {root}")
        return 1
    for o in objs:
        fns = functions(o)
        name = o.as_posix()
        if VARIANT_UNIT.search(name):
            variant_fns += sum(1 for a, _ in fns.values() if a)
            if not VNNI_UNIT.search(name):
                for n, (a, v) in fns.items():
                    if v:
                        bad.append(f"{o}: {demangle([n])[n]} uses VNNI in a unit without VNNI")
            bad += shared_symbol_offenders(o, fns)
            continue
        for n, (a, v) in fns.items():
            if a or v:
                bad.append(f"{o}: {demangle([n])[n]} has {'AVX-512' if a else 'VNNI'} instructions outside "
                           "the dispatched variant units")
    for line in bad:
        print(line)
    print(f"isa_objects: {len(objs)} objects, {variant_fns} AVX-512 functions in the variant units, "
          f"{len(bad)} offenders")
    return 1 if bad else 0


def check_elf(files):
    bad, total = [], 0
    for f in files:
        fns = functions(f)
        total += sum(1 for a, v in fns.values() if a or v)
        bad += shared_symbol_offenders(f, fns)
    for line in bad:
        print(line)
    print(f"isa_objects: {total} AVX-512/VNNI functions, {len(bad)} visible outside a variant")
    return 1 if bad else 0


def main():
    if not (shutil.which("objdump") and shutil.which("nm") and shutil.which("c++filt")):
        print("isa_objects: objdump, nm or c++filt missing: skipped")
        return 77
    if len(sys.argv) >= 3 and sys.argv[1] == "objects":
        return check_objects(sys.argv[2])
    if len(sys.argv) >= 3 and sys.argv[1] == "elf":
        return check_elf(sys.argv[2:])
    print(__doc__)
    return 2


if __name__ == "__main__":
    sys.exit(main())
