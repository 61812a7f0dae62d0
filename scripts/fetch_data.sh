#!/usr/bin/env bash
# Fetches and caches numattn's default model and text (SHA-256 checked; offline after the
# first run). Cache: ${NUMATTN_CACHE:-$HOME/.cache/numattn}. Prints NUMATTN_MODEL=... and
# NUMATTN_TEXT=... on stdout. Set NUMATTN_SKIP_FETCH=1 to skip (tests that need the data then
# skip themselves). Extra arguments go to scripts/fetch_data.py (e.g. --what model).
set -euo pipefail
cd "$(dirname "$0")/.."
if [ "${NUMATTN_SKIP_FETCH:-0}" = 1 ]; then
  echo "fetch_data: skipped (NUMATTN_SKIP_FETCH=1)" >&2
  exit 0
fi
export NUMATTN_CACHE="${NUMATTN_CACHE:-$HOME/.cache/numattn}"
python3 scripts/fetch_data.py --cache "$NUMATTN_CACHE" "$@"
