#!/usr/bin/env bash
# The README's test command: install dependencies, build, run the whole test suite, then the
# suite again under AddressSanitizer + UndefinedBehaviorSanitizer.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
scripts/fetch_data.sh || echo "test: scripts/fetch_data.sh failed; tests that need the "\
  "default model/text will skip" >&2
# NUMATTN_UNITY: the CLI and the tests compile in batches (a clean build of them costs a third;
# cmake/NumattnOptions.cmake). Both passes build from scratch on CI.
scripts/build.sh -DNUMATTN_UNITY=ON
# Includes the pytest suite (python_pytest, when scripts/setup.sh's .venv has nanobind) and the
# CMake package test (install_find_package); the sanitizer pass builds neither.
ctest --test-dir build --output-on-failure -j 2
# The PyTorch and transformers sections of the pytest suite (python/tests/test_torch.py and
# test_hf.py) skip in the run above, whose .venv has neither: they are opt-in, since torch's PyPI
# wheel needs about 5 GB of CUDA libraries to import (the bare wheel alone took 9.5 min to install
# on the CI machine), beyond what a CI run can spend. NUMATTN_TORCH_TESTS=1 installs torch,
# transformers, gguf and accelerate into .venv-torch and runs them; NUMATTN_TORCH_PYTHON=PATH runs
# them with an interpreter that already has these (the same Python version as .venv).
if [ "${NUMATTN_TORCH_TESTS:-0}" = 1 ] || [ -n "${NUMATTN_TORCH_PYTHON:-}" ]; then
  torch_py="${NUMATTN_TORCH_PYTHON:-}"
  if [ -z "$torch_py" ]; then
    [ -x .venv-torch/bin/python ] || python3 -m venv .venv-torch
    .venv-torch/bin/pip install -q torch transformers gguf accelerate pytest numpy
    torch_py=.venv-torch/bin/python
  fi
  PYTHONPATH=build/python NUMATTN_SOURCE_DIR="$PWD" NUMATTN_CLI=build/bin/numattn \
    "$torch_py" python/tests/run_pytest.py -q -p no:cacheprovider python/tests/test_torch.py python/tests/test_hf.py
fi
if [ "${NUMATTN_SKIP_SANITIZERS:-0}" != 1 ]; then
  # -O1 -g1: sanitizer builds at -O2 -g cost twice the compile time (Eigen-heavy files 3 min
  # each) for no extra checking; -g1 keeps the line tables the reports need.
  BUILD_DIR=build-asan scripts/build.sh -DCMAKE_BUILD_TYPE=RelWithDebInfo \
    -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O1 -g1 -DNDEBUG" \
    -DNUMATTN_SANITIZE="address;undefined" -DNUMATTN_BUILD_BENCHMARKS=OFF \
    -DNUMATTN_BUILD_PYTHON=OFF -DNUMATTN_UNITY=ON
  # report.browser (a whole quick report, then headless Chromium on it: ~4 min under ASan) ran in
  # the Release pass; the report's own code runs under the sanitizers in the ReportCli tests.
  ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1 NUMATTN_TEST_QUICK=1 \
    ctest --test-dir build-asan --output-on-failure -j 2 -E '^report[.]browser$'
fi
