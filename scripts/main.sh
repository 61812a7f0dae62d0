#!/usr/bin/env bash
# The README's main job: install dependencies, build, and print the benchmark table of the
# registered methods at the default shape.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
scripts/fetch_data.sh   # default model and text, cached and checksummed
scripts/build.sh
echo "## numattn bench (B=1, H=8, N=4096, D=128, non-causal and causal, all cores)"
build/bin/numattn bench --n 4096 --d 128 --heads 8 --causal none,top-left --reps 3 --format md
