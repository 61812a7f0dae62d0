#!/usr/bin/env bash
# Installs numattn's build and test dependencies from Debian (idempotent; needs root or sudo).
set -euo pipefail
PKGS=(build-essential cmake ninja-build pkg-config python3 python3-numpy python3-pip
      libopenblas-dev libeigen3-dev libfftw3-dev libgtest-dev libgmock-dev libbenchmark-dev
      libcli11-dev nlohmann-json3-dev libfmt-dev zlib1g-dev time
      libsimde-dev
      libopenmpi-dev openmpi-bin)
missing=()
# The Python package (python/): venv and headers for the nanobind extension, pytest.
PKGS+=(python3-venv python3-dev python3-pytest)
# `numattn report`: plots with Debian's matplotlib (scripts/report_plots.py runs under
# /usr/bin/python3), and a headless browser for the test that opens the report's index.html.
PKGS+=(python3-matplotlib chromium)
for p in "${PKGS[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO=sudo
  echo "setup: installing ${missing[*]}" >&2
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

# A virtual environment for the Python package and its tests (.venv, gitignored): Debian's
# python3 with its numpy and pytest (--system-site-packages), plus nanobind from PyPI (pinned; not
# in Debian 12). Scripts use .venv/bin/python, never whatever `python3` comes first on PATH.
# (`pip install .` fetches its own build tools, scikit-build-core and nanobind, into an isolated
# build environment.)
ROOT=$(cd "$(dirname "$0")/.." && pwd)
PY_REQS=("nanobind==3.1.0")
if [ ! -x "$ROOT/.venv/bin/python" ]; then
  echo "setup: creating $ROOT/.venv" >&2
  /usr/bin/python3 -m venv --system-site-packages "$ROOT/.venv"
fi
if ! "$ROOT/.venv/bin/python" - "${PY_REQS[@]}" <<'PYEOF' 2>/dev/null; then
import sys
from importlib.metadata import version
sys.exit(any(version(r.split("==")[0]) != r.split("==")[1] for r in sys.argv[1:]))
PYEOF
  echo "setup: installing ${PY_REQS[*]} into .venv" >&2
  "$ROOT/.venv/bin/python" -m pip install -q --disable-pip-version-check "${PY_REQS[@]}"
fi
