"""Chunked prefill over a paged cache against the same data contiguous (issue 15): the time per
page size, then (``--ncu``) one call each of the paged (page 64) and the contiguous case for
ncu (``ncu --profile-from-start off``; ``--ncu paged``: the paged call alone, e.g. for an
artifacts folder holding only the decode kernels). bench/bench_decode.py's inputs: 8 sequences of
2,048 cached + 256 new tokens, 32/8 heads, hd128, causal.

    python tools/experiments/paged_probe.py [--ncu [paged]]
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from bench.bench_decode import paged_inputs, paged_providers, time_calls  # noqa: E402
from tools.experiments.prefill_ncu_probe import profile_once  # noqa: E402

B, SQ, SK, H, HK = 8, 256, 2048 + 256, 32, 8


def calls_for(page):
    """(paged call, the same data contiguous): bench/bench_decode.py's fa4_aot providers."""
    fns = paged_providers(["fa4_aot"], SQ, paged_inputs(B, SQ, SK, H, HK, page))
    return fns["fa4_aot"], fns["fa4_aot:contig"]


def main(argv):
    if "--ncu" in argv:
        calls = calls_for(64)
        profile_once(calls[:1] if "paged" in argv else calls)
        return
    rows = {}
    pairs = {p: calls_for(p) for p in (16, 32, 64, 128, 256)}
    for _ in range(5):
        for p, (paged, contig) in pairs.items():
            for name, f in ((f"page {p}", paged), ("contiguous", contig)):
                for _ in range(2):
                    f()
                rows.setdefault(name, []).append(time_calls(f, 20) * 1e3)
    for name, ts in rows.items():
        print(f"{name:12s} {sorted(ts)[len(ts) // 2]:7.1f} us")


if __name__ == "__main__":
    main(sys.argv[1:])
