#!/usr/bin/env bash
# compute-sanitizer (racecheck, synccheck, memcheck) on the work-stealing kernel, edge cases.
#   bash bench/sanitize.sh [outdir]
# Cases: fewer tiles than CTAs (1 tile), SM count - 1 / + 1 tiles (131 / 133 on an H200), and
# ~1000 tiles; causal and not; hd256 (two MMA warpgroups without ping-pong); hd64 on its
# 192-row and (causal S = 1k) 128-row tiles; hd128 on its wide tiles (176-key blocks
# non-causal, 160 for the causal long_kv alternative: short queries on a long cache), both
# ending in a partial block;
# O written through the tile's Q stage by CTAs that reuse it (hd128 causal 1k: two Q buffers,
# ~4 tiles per CTA; hd192 / hd256: one Q buffer, 2 tiles per CTA) and through the O buffer that
# the MMA warpgroups hand on by mbarrier (hd128 non-causal 1k, 176-key blocks, ~4 tiles per
# CTA; hd64's 192-row cases above, three warpgroups, up to ~5 tiles per CTA); a decode call
# (packed GQA, split-KV + combine); packed documents on the compact tile order (one long
# document among short ones, causal: the upper half of its m-blocks in sections of two of the
# four heads, the rest with all four; and with 128 heads, whose lower half goes in sections of
# eight too: schedule.light_tiles_limit); scores x60 on the causal 160-key kernel, dense and
# packed (ONE_CALL_SCALE: the lazy reference's exact recomputation reads K/V from global memory
# for the warps its guard flags); and, under memcheck only, bench/bad_inputs.py (malformed
# varlen offsets and paged-KV tables).
# Exit status 1 when any run fails (non-zero status) or compute-sanitizer reports an error or a
# hazard; every log stays in outdir.
set -u
set -f  # the cases are split on spaces, never globbed (docs:1024+64*40)
out=${1:-.}
cases=(
  "1 1 128 128 1 steal"
  "1 1 64 64 0 steal"
  "1 131 128 128 1 steal"
  "1 133 128 64 0 steal"
  "4 16 2048 64 1 steal"
  "4 16 1024 64 1 steal"
  "4 16 1024 128 1 steal"
  "1 133 256 256 1 steal"
  "1 133 256 192 1 steal"
  "1 133 300 128 0 steal"
  "4 16 1024 128 0 steal"
  "1 4 256 128 1 steal 4608"
  "8 32 1 128 1 auto 4096 8"
  "docs:5000+64*40 4 128 1 steal"
  "docs:1600+64*8 128 128 1 steal"
  "x60 1 4 2111 128 1 steal"
  "x60 docs:4001+700+2053+160+5 4 128 1 steal"
)
failed=0
for tool in racecheck synccheck memcheck; do
  for c in "${cases[@]}"; do
    log="$out/sanitize_${tool}_$(echo $c | tr ' :+*' '____').log"
    scale=1
    args=$c
    if [ "${c:0:1}" = x ]; then scale=${c%% *}; scale=${scale:1}; args=${c#* }; fi
    ONE_CALL_SCALE=$scale compute-sanitizer --tool $tool --kernel-name kns=fa4aot --print-limit 20 \
      --report-api-errors no --error-exitcode 1 python3 bench/one_call.py $args > "$log" 2>&1
    rc=$?
    summary=$(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY|hazard' "$log" | tail -1)
    verdict=ok
    # "ERROR SUMMARY: 0 errors" / "RACECHECK SUMMARY: 0 hazards displayed (0 errors, 0 warnings)"
    if [ "$rc" -ne 0 ] || ! grep -q "ok " "$log" \
       || grep -Eq 'ERROR SUMMARY: [1-9]|SUMMARY: [1-9][0-9]* hazard|\([1-9][0-9]* error|, [1-9][0-9]* warning' "$log"; then
      verdict=FAILED
      failed=$((failed + 1))
    fi
    echo "$tool [$c] rc=$rc $verdict :: $summary"
  done
done
log="$out/sanitize_memcheck_bad_inputs.log"
compute-sanitizer --tool memcheck --kernel-name kns=fa4aot --print-limit 20 --report-api-errors no \
  --error-exitcode 1 python3 bench/bad_inputs.py > "$log" 2>&1
rc=$?
verdict=ok
if [ "$rc" -ne 0 ] || ! grep -q "ok " "$log" || grep -Eq 'ERROR SUMMARY: [1-9]' "$log"; then
  verdict=FAILED
  failed=$((failed + 1))
fi
echo "memcheck [bad inputs] rc=$rc $verdict :: $(grep -E 'ERROR SUMMARY' "$log" | tail -1)"
if [ "$failed" -ne 0 ]; then
  echo "sanitize: $failed run(s) FAILED (logs in $out)"
  exit 1
fi
echo "sanitize: all runs clean"
