#!/usr/bin/env bash
# The README's main job: install dependencies, fetch the default model and text, build the CLI,
# and run `numattn report` on them: error against time and memory of every registered method
# (random and captured Q/K/V), perplexity and KL per causal method, BD Attention (and MLA and
# the spectra/sparsity analysis where this numattn has them), as plots, report.md and index.html.
#
#   scripts/main.sh            # the quick report (a few minutes of measurements on two cores)
#   scripts/main.sh --full     # the thorough one; any other `numattn report` flag passes through
#
# The report goes to $NUMATTN_REPORT_DIR (default out/report); its last line is
# `report: DIR/index.html`.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
scripts/fetch_data.sh   # default model and text, cached and checksummed
# The CLI alone (scripts/test.sh builds the rest: tests, benchmarks, the Python extension).
NUMATTN_BUILD_TARGETS=numattn_cli scripts/build.sh >&2   # build log on stderr
DIR=${NUMATTN_REPORT_DIR:-out/report}
build/bin/numattn report --model default --text default --out "$DIR" "$@"
echo "report: $DIR/index.html"
