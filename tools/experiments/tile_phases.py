"""What a tile costs beyond its key blocks (docs/perf-notes.md v29). Needs an sm_90 GPU.

``sweep``: one profiled call each of the non-causal 176-key kernel at a fixed tile count
(3 x 11 heads x 16,384 queries = 4,224 tiles, 32 per CTA on 132 SMs) with 176 * n keys, for
ncu's cycles (the per-block and per-tile costs are the slope and intercept over n):

    ncu --profile-from-start off --clock-control base --metrics sm__cycles_elapsed.max \\
        python tools/experiments/tile_phases.py sweep

``trace``: the phases of every tile of a dense causal call, from warp 0 of warpgroup 0 of each
CTA: Q wait and prologue, mainloop (fitted as a + b * key blocks), epilogue, and the time to the
CTA's next tile. Needs a trace build of the 176-key tile with two more stamps
(``patches/tile_phase_trace.diff``, on 714b352):

    git worktree add /tmp/tp 714b352 && git -C /tmp/tp apply \\
        $PWD/tools/experiments/patches/tile_phase_trace.diff
    (cd /tmp/tp && $OLDPWD/.venv/bin/python tools/experiments/variants.py n176-q1-re-ss-ob-e96 \\
        --only 'fwd_sm_90a_bf16_hd128_causal_steal.*trace' --out $OLDPWD/.exp/tp)
    FA4_AOT_ARTIFACTS=.exp/tp python tools/experiments/tile_phases.py trace

The patched kernel records per tile (CTA << 32 | Q-wait ns, mainloop end, start, end) in the
trace buffer instead of (SM, CTA, start, end); the shipped trace kernels are not changed.
"""

import collections
import statistics
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
import fa4_aot  # noqa: E402
from fa4_aot.schedule import choose_section, decode_tile, num_n_blocks  # noqa: E402

KEYS = 176  # the key block of the kernels measured


def sweep():
    b, h, sq = 3, 11, 16384
    q = torch.randn(b, sq, h, 128, device="cuda", dtype=torch.bfloat16)
    for n in (4, 8, 16, 32):
        k = torch.randn(b, KEYS * n, h, 128, device="cuda", dtype=torch.bfloat16)
        v = torch.randn_like(k)
        for _ in range(3):
            fa4_aot.attention(q, k, v)
        torch.cuda.synchronize()
        torch.cuda.profiler.start()
        fa4_aot.attention(q, k, v)
        torch.cuda.synchronize()
        torch.cuda.profiler.stop()
        print(f"n = {n}: 4,224 tiles of {n} key blocks profiled", flush=True)


def trace():
    for b, h, s in ((1, 16, 16384), (2, 16, 8192)):
        q, k, v = (torch.randn(b, s, h, 128, device="cuda", dtype=torch.bfloat16)
                   for _ in range(3))
        nmb = s // 128
        tr = torch.zeros(nmb * h * b, 4, dtype=torch.int64, device="cuda")
        for _ in range(5):
            fa4_aot.attention(q, k, v, causal=True, _trace=tr)
        torch.cuda.synchronize()
        sec = choose_section(h, b, s, 128, 2, 1, True)
        per_cta = collections.defaultdict(list)
        for idx, (r0, t_main, t0, t1) in enumerate(tr.cpu().tolist()):
            m, _, _ = decode_tile(idx, nmb, h, sec)
            n = num_n_blocks(m, 128, KEYS, s, s, True)
            per_cta[r0 >> 32].append((t0, t0 + (r0 & 0xFFFFFFFF), t_main, t1, n))
        rows, gaps = [], []
        for tiles in per_cta.values():
            tiles.sort()
            for i, (t0, tq, tm, t1, n) in enumerate(tiles):
                rows.append((n, tq - t0, tm - tq, t1 - tm))
                if i + 1 < len(tiles):
                    gaps.append(tiles[i + 1][0] - t1)
        per_block, a = statistics.linear_regression([r[0] for r in rows], [r[2] for r in rows])
        print(f"causal {b}x{h}x{s}x128, {len(rows)} tiles (ns; warp 0 of warpgroup 0):")
        print(f"  Q wait + prologue  median {statistics.median(r[1] for r in rows):6.0f}")
        print(f"  mainloop           {a:6.0f} + {per_block:.0f} per key block")
        print(f"  epilogue           median {statistics.median(r[3] for r in rows):6.0f}")
        print(f"  to the next tile   median {statistics.median(gaps):6.0f}")


if __name__ == "__main__":
    {"sweep": sweep, "trace": trace}[sys.argv[1] if len(sys.argv) > 1 else "trace"]()
