#!/usr/bin/env bash
# compute-sanitizer memcheck over every kernel family: per family ~50 seeded calls of the sweep
# (fa4_aot.sweep --small: lengths <= 1100), and one call of every sm_90a kernel (family
# "kernels"), each family in one process under memcheck (only fa4_aot's kernels instrumented).
#   bash bench/memcheck_sweep.sh [outdir] [cases per family]
# Exit status 1 when a run fails or memcheck reports an error; every log stays in outdir.
set -u
out=${1:-memcheck_out}
n=${2:-50}
mkdir -p "$out"
failed=0
for fam in dense varlen decode paged split chunked fp8 kernels; do
  log="$out/memcheck_$fam.log"
  start=$(date +%s)
  FA4_AOT_EXPERIMENTAL_FP8=1 compute-sanitizer --tool memcheck --kernel-name kns=fa4aot \
    --report-api-errors no \
    --print-limit 20 --error-exitcode 1 \
    python3 -m fa4_aot.sweep --family "$fam" --cases "$n" --small --inline --out "$out/$fam" \
    > "$log" 2>&1
  rc=$?
  summary=$(grep -E 'ERROR SUMMARY' "$log" | tail -1)
  verdict=ok
  if [ "$rc" -ne 0 ] || grep -Eq 'ERROR SUMMARY: [1-9]' "$log"; then
    verdict=FAILED
    failed=$((failed + 1))
  fi
  calls=$(wc -l < "$out/$fam/sweep.jsonl" 2>/dev/null || echo 0)
  echo "memcheck [$fam] calls=$calls rc=$rc $verdict $(( $(date +%s) - start )) s :: $summary"
done
if [ "$failed" -ne 0 ]; then
  echo "memcheck_sweep: $failed famil(ies) FAILED (logs in $out)"
  exit 1
fi
echo "memcheck_sweep: every family clean"
