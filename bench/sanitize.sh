#!/usr/bin/env bash
# compute-sanitizer (racecheck, synccheck, memcheck) on the work-stealing kernel, edge cases.
#   bash bench/sanitize.sh [outdir]
# Cases: fewer tiles than CTAs (1 tile), SM count - 1 / + 1 tiles (131 / 133 on an H200), and
# ~1000 tiles; causal and not.
set -u
out=${1:-.}
cases=(
  "1 1 128 128 1 steal"
  "1 1 64 64 0 steal"
  "1 131 128 128 1 steal"
  "1 133 128 64 0 steal"
  "4 16 2048 64 1 steal"
)
for tool in racecheck synccheck memcheck; do
  for c in "${cases[@]}"; do
    log="$out/sanitize_${tool}_$(echo $c | tr ' ' '_').log"
    compute-sanitizer --tool $tool --kernel-name kns=fa4aot --print-limit 20 --report-api-errors no \
      python3 bench/one_call.py $c > "$log" 2>&1
    echo "$tool [$c] rc=$? :: $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY|hazard' "$log" | tail -1)"
  done
done
