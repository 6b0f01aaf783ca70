#!/usr/bin/env bash
# Everything GPU-side in one device call, logs packed into one file:
#   bash bench/gpu_all.sh OUTDIR [step ...]
# steps (default: tests sweep memcheck): tests (the GPU suite, pytest), sweep (python -m
# fa4_aot.sweep, 100 cases a family + one call per kernel), memcheck (bench/memcheck_sweep.sh),
# sanitize (bench/sanitize.sh: racecheck/synccheck/memcheck on the scheduler edge cases),
# host (bench/host_breakdown.py: a call's host time, a length change against a memo hit),
# fp8 (bench/bench_decode.py --set fp8 into OUTDIR/bench_<card>.json, a copy of docs' file).
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
    # deselected: the tests that read artifacts' PTX (left behind by bench/fa4_carry.sh to fit
    # the 64 MiB carry; CI runs them) and the fresh-clone build (no package index on the box)
    tests) python3 -m pytest tests -q -x -rs -p no:cacheprovider \
             --deselect tests/test_sm100.py::test_clc_in_ptx_and_launch_record \
             --deselect tests/test_inspect.py::test_shipped_kernels_register_budgets_hold \
             --deselect tests/test_newcomer.py::test_readme_command_on_a_fresh_clone \
             > "$out/logs/tests.log" 2>&1; rc=$?
           line=$(tail -1 "$out/logs/tests.log") ;;
    sweep) python3 -m fa4_aot.sweep --cases "${SWEEP_CASES:-100}" --out "$out/logs/sweep" \
             > "$out/logs/sweep.log" 2>&1; rc=$?
           line=$(tail -1 "$out/logs/sweep.log") ;;
    memcheck) bash bench/memcheck_sweep.sh "$out/logs/memcheck" "${MEMCHECK_CASES:-50}" \
                > "$out/logs/memcheck.log" 2>&1; rc=$?
              line=$(tail -1 "$out/logs/memcheck.log") ;;
    sanitize) bash bench/sanitize.sh "$out/logs" > "$out/logs/sanitize.log" 2>&1; rc=$?
              line=$(tail -1 "$out/logs/sanitize.log") ;;
    host) python3 bench/host_breakdown.py --n "${HOST_CALLS:-5000}" > "$out/logs/host.log" 2>&1
          rc=$?; line=$(tail -3 "$out/logs/host.log" | tr -s ' ' | paste -sd';') ;;
    fp8) card=$(nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H200 && echo h200 || echo h100)
         cp "docs/bench_$card.json" "$out/" 2>/dev/null
         python3 bench/bench_decode.py --set fp8 --json "$out/bench_$card.json" \
           > "$out/logs/fp8.log" 2>&1; rc=$?
         line=$(tail -1 "$out/logs/fp8.log") ;;
    *) echo "unknown step $step"; rc=2; line="" ;;
  esac
  verdicts+=("$step rc=$rc $(( $(date +%s) - start )) s :: $line")
done
tar czf "$out/gpu_logs.tar.gz" -C "$out" logs
for v in "${verdicts[@]}"; do echo "$v"; done
