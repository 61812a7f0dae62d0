#!/usr/bin/env python3
"""Every test file batched by a unity build (NUMATTN_UNITY) keeps its file-local helpers in
`namespace { namespace NUMATTN_UNITY_ID {` (docs/design.md, "Unity builds on CI"): an anonymous
namespace alone would merge with the other files' of its batch, and two `config()` helpers
would then clash only on CI. Usage: unity_namespaces.py TESTS_DIR [--fix]."""
import pathlib
import re
import sys

# Compiled on their own (tests/CMakeLists.txt: SKIP_UNITY_BUILD_INCLUSION).
UNBATCHED = {"model/llama_header_test.cpp", "support/conformance.cpp", "support/test_util.cpp",
             "support/tiny_llama.cpp"}
OPEN, INNER = "namespace {", "namespace NUMATTN_UNITY_ID {"
CLOSE, INNER_CLOSE = "}  // namespace", "}  // namespace NUMATTN_UNITY_ID"


def fix(text):
    text = re.sub(r"^namespace \{\n(?!namespace NUMATTN_UNITY_ID \{)", OPEN + "\n" + INNER + "\n", text,
                  flags=re.M)
    return re.sub(r"^(?<!" + re.escape(INNER_CLOSE) + r"\n)\}  // namespace\n",
                  INNER_CLOSE + "\n" + CLOSE + "\n", text, flags=re.M)


def main():
    root = pathlib.Path(sys.argv[1])
    bad = []
    for path in sorted(list(root.rglob("*_test.cpp")) + list(root.glob("support/*.cpp"))):
        rel = path.relative_to(root).as_posix()
        if rel in UNBATCHED:
            continue
        lines = path.read_text().splitlines()
        opens = [i for i, l in enumerate(lines) if l == OPEN]
        if all(i + 1 < len(lines) and lines[i + 1] == INNER for i in opens) and \
                sum(l == INNER_CLOSE for l in lines) == len(opens):
            continue
        if "--fix" in sys.argv:
            path.write_text(fix(path.read_text()))
        bad.append(rel)
    for rel in bad:
        print(f"{rel}: an anonymous namespace without `{INNER}` inside it (see docs/design.md)")
    sys.exit(1 if bad and "--fix" not in sys.argv else 0)


if __name__ == "__main__":
    main()
