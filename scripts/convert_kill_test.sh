#!/usr/bin/env bash
# SIGKILL test of numattn's atomic output (include/numattn/core/file_io.h).
#
#   scripts/convert_kill_test.sh [TRIALS=20] [WORKDIR]
#   env: NUMATTN (default build/bin/numattn), MODEL (default "default"), SEED (random order)
#
# Makes a previous target (a converted model that differs from what the test's convert writes:
# --kappa-threshold 1 keeps every head dense), measures when a full
# `numattn convert --model MODEL --bda vo --out TARGET` renames its output into place, then
# TRIALS times starts that convert and SIGKILLs it (by its pid) at a random point before the
# rename: odd trials while it loads and transforms, even trials while its temporary is being
# written or synced (once the temporary holds a random fraction of the file's size). After each kill TARGET must be byte-identical (sha256)
# to the previous version.
# A kill that lands after the rename (timing jitter) must leave the complete new file instead;
# it is reported as such and the previous version is put back. Temporaries the kill left
# (named .TARGET.numattn-tmp.PID.N) are reported and removed.
# Prints one line per trial and a summary; exits 1 on any corrupt or changed target.
set -euo pipefail

TRIALS=${1:-20}
NUMATTN=${NUMATTN:-build/bin/numattn}
MODEL=${MODEL:-default}
[[ -n "${SEED:-}" ]] && RANDOM=$SEED
[[ -x "$NUMATTN" ]] || { echo "error: $NUMATTN is not built (cmake --build build)" >&2; exit 2; }

if [[ -n "${2:-}" ]]; then
  WORK=$2
  mkdir -p "$WORK"
else
  WORK=$(mktemp -d "${TMPDIR:-/tmp}/numattn_kill.XXXXXX")
  trap 'rm -rf "$WORK"' EXIT
fi
TARGET=$WORK/target.gguf
NEW=$WORK/complete_new.gguf
PREV=$WORK/previous_copy.gguf

now() { date +%s.%N; }
sha() { sha256sum "$1" | cut -c1-64; }
# Run in the background as the binary itself (not a shell function), so that $! is its pid.
CONVERT=("$NUMATTN" convert --model "$MODEL" --bda vo --format json)
leftovers() { find "$WORK" -maxdepth 1 -name ".${1:-target}.gguf.numattn-tmp.*" -printf '%f %s\n'; }

echo "building the previous target and the expected new file in $WORK"
"${CONVERT[@]}" --out "$TARGET" --kappa-threshold 1 >/dev/null
cp "$TARGET" "$PREV"
PREV_SHA=$(sha "$TARGET")
# A complete run onto a copy of the target: its output and the time of its rename.
cp "$PREV" "$NEW"
ino0=$(stat -c %i "$NEW")
t0=$(now)
"${CONVERT[@]}" --out "$NEW" >/dev/null &
pid=$!
t_temp="" t_rename=""
while kill -0 "$pid" 2>/dev/null; do
  if [[ -z "$t_temp" && -n "$(leftovers complete_new)" ]]; then t_temp=$(echo "$(now) - $t0" | bc -l); fi
  if [[ -z "$t_rename" && "$(stat -c %i "$NEW")" != "$ino0" ]]; then
    t_rename=$(echo "$(now) - $t0" | bc -l)
  fi
  sleep 0.01
done
wait "$pid"
t_total=$(echo "$(now) - $t0" | bc -l)
[[ -n "$t_rename" && -n "$t_temp" ]] || { echo "error: did not see the temporary and the rename" >&2; exit 2; }
NEW_SHA=$(sha "$NEW")
NEW_SIZE=$(stat -c %s "$NEW")
[[ "$NEW_SHA" != "$PREV_SHA" ]] || { echo "error: the new and previous files are identical" >&2; exit 2; }
printf 'previous %.16s…  new %.16s…  convert %.2f s: temporary from %.2f s, renamed at %.2f s\n' \
  "$PREV_SHA" "$NEW_SHA" "$t_total" "$t_temp" "$t_rename"

intact=0 late=0 bad=0 temps=0
for ((i = 1; i <= TRIALS; i++)); do
  "${CONVERT[@]}" --out "$TARGET" >/dev/null 2>&1 &
  pid=$!
  start=$(now)
  if ((i % 2)); then
    # A random point before the temporary appears (this run may be faster than the first).
    deadline=$(echo "$start + $t_temp * 0.9 * $RANDOM / 32768" | bc -l)
    while kill -0 "$pid" 2>/dev/null && [[ -z "$(leftovers)" ]] &&
      (($(echo "$(now) < $deadline" | bc -l))); do
      sleep 0.01
    done
  else
    want=$((NEW_SIZE / 32768 * RANDOM))
    while kill -0 "$pid" 2>/dev/null; do
      size=$(leftovers | awk '{print $2; exit}')
      [[ -n "$size" && "$size" -ge "$want" ]] && break
      sleep 0.002
    done
  fi
  delay=$(echo "$(now) - $start" | bc -l)
  phase="load/transform"
  size=$(leftovers | awk '{print $2; exit}')
  [[ -n "$size" ]] && phase="temp at $((size * 100 / NEW_SIZE))%"
  if kill -KILL "$pid" 2>/dev/null; then how="SIGKILL"; else how="exited first"; fi
  wait "$pid" 2>/dev/null || true
  got=$(sha "$TARGET")
  left=$(leftovers)
  nleft=0
  [[ -n "$left" ]] && nleft=$(echo "$left" | wc -l)
  temps=$((temps + nleft))
  if [[ "$got" == "$PREV_SHA" ]]; then
    verdict="target intact (sha256 = previous)"
    intact=$((intact + 1))
  elif [[ "$got" == "$NEW_SHA" ]]; then
    verdict="target = complete new file (kill after the rename)"
    late=$((late + 1))
    cp "$PREV" "$TARGET"
  else
    verdict="FAIL: target is neither the previous nor the new file (sha256 $got)"
    bad=$((bad + 1))
    cp "$PREV" "$TARGET"
  fi
  printf 'trial %2d/%d: %s at %5.2f s (%s): %s; leftover temporaries: %d%s\n' "$i" "$TRIALS" \
    "$how" "$delay" "$phase" "$verdict" "$nleft" "${left:+ ($(echo "$left" | tr '\n' ' ' | sed 's/ $//') bytes, removed)}"
  find "$WORK" -maxdepth 1 -name ".target.gguf.numattn-tmp.*" -delete
done

echo "summary: $TRIALS trials: $intact target intact, $late killed after the rename (complete new" \
  "file), $bad corrupt; $temps leftover temporaries (removed)"
[[ $bad -eq 0 && $intact -gt 0 ]]
