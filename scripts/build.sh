#!/usr/bin/env bash
# Configures and builds numattn into ${BUILD_DIR:-build} (Release, native, tests and benchmarks).
# NUMATTN_BUILD_TARGETS="t1 t2" builds only those targets (scripts/main.sh: the CLI alone).
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD_DIR=${BUILD_DIR:-build}
# The Python extension when scripts/setup.sh made .venv with nanobind (a later
# -DNUMATTN_BUILD_PYTHON=OFF in "$@" wins, as the sanitizer pass of scripts/test.sh passes).
PY_ARGS=()
if [ -x .venv/bin/python ] && .venv/bin/python -c "import nanobind" 2>/dev/null; then
  PY_ARGS=(-DNUMATTN_BUILD_PYTHON=ON "-DPython_EXECUTABLE=$PWD/.venv/bin/python")
fi
cmake -S . -B "$BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE=Release "${PY_ARGS[@]}" "$@" >/dev/null
TARGETS=()
for t in ${NUMATTN_BUILD_TARGETS:-}; do TARGETS+=(--target "$t"); done
cmake --build "$BUILD_DIR" -j "$(nproc)" "${TARGETS[@]}"
