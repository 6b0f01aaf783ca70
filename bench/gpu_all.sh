#!/usr/bin/env bash
# Everything GPU-side in one device call, logs packed into one file:
#   bash bench/gpu_all.sh OUTDIR [step ...]
# steps (default: tests sweep memcheck): tests (the GPU suite, pytest), sweep (python -m
# fa4_aot.sweep, 100 cases a family + one call per kernel), memcheck (bench/memcheck_sweep.sh),
# sanitize (bench/sanitize.sh: racecheck/synccheck/memcheck on the scheduler edge cases).
# Prints a short verdict per step last; OUTDIR/gpu_logs.tar.gz holds every log.
set -u
out=${1:?usage: bash bench/gpu_all.sh OUTDIR [step ...]}
shift
steps=${*:-tests sweep memcheck}
export PYTHONUNBUFFERED=1
mkdir -p "$out/logs"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader | tee "$out/logs/device.txt"
verdicts=()
for step in $steps; do
  start=$(date +%s)
  case $step in
    tests) python3 -m pytest tests -q -x -rs -p no:cacheprovider > "$out/logs/tests.log" 2>&1; rc=$?
           line=$(tail -1 "$out/logs/tests.log") ;;
    sweep) python3 -m fa4_aot.sweep --cases "${SWEEP_CASES:-100}" --out "$out/logs/sweep" \
             > "$out/logs/sweep.log" 2>&1; rc=$?
           line=$(tail -1 "$out/logs/sweep.log") ;;
    memcheck) bash bench/memcheck_sweep.sh "$out/logs/memcheck" "${MEMCHECK_CASES:-50}" \
                > "$out/logs/memcheck.log" 2>&1; rc=$?
              line=$(tail -1 "$out/logs/memcheck.log") ;;
    sanitize) bash bench/sanitize.sh "$out/logs" > "$out/logs/sanitize.log" 2>&1; rc=$?
              line=$(tail -1 "$out/logs/sanitize.log") ;;
    *) echo "unknown step $step"; rc=2; line="" ;;
  esac
  verdicts+=("$step rc=$rc $(( $(date +%s) - start )) s :: $line")
done
tar czf "$out/gpu_logs.tar.gz" -C "$out" logs
for v in "${verdicts[@]}"; do echo "$v"; done
