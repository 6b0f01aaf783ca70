"""Decode probes of docs/perf-notes.md v17 (hd128, causal, one query token, 32 query heads):

    python tools/experiments/decode_probe.py [A][B][C]

A: batch 16-40 of MHA 32/32 with 8k keys (3.9-9.7 waves of the persistent grid), fa4_aot
   against upstream FA4 (when importable): does either step at whole waves?
B: K/V laid out head-major (a (B, H, S, D) tensor seen through a transpose, so each CTA streams
   contiguous memory) against the usual (B, S, H, D), MHA and GQA 32/8: DRAM page locality?
C: forced ``num_splits`` 1-6 and 8 on eight shapes of 256-2,048 tiles (fa4_aot only).

µs per call: CUDA events around 10 calls, median of 5 rounds taken round the providers
(bench_decode's measure, in benchlib's round_order). Needs an sm_90 GPU.
"""

import statistics
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
import fa4_aot  # noqa: E402
from bench.bench_decode import measure, providers_available  # noqa: E402

PROVIDERS = providers_available(["fa4_aot", "fa4"])  # FA4 when importable (else a note)


def timed(fns, rounds=5, iters=10):
    """{name: callable} -> {name: µs per call}: bench_decode's measure (round the providers in
    turn), medians; a provider that raised is left out."""
    res = measure(fns, rounds, iters)
    return {n: statistics.median(r["times"]) * 1e3 for n, r in res.items() if r["times"]}


def inputs(b, sk, hk, head_major=False):
    q = torch.randn(b, 1, 32, 128, device="cuda", dtype=torch.bfloat16)
    if head_major:
        k, v = (torch.randn(b, hk, sk, 128, device="cuda", dtype=torch.bfloat16).transpose(1, 2)
                for _ in range(2))
    else:
        k, v = (torch.randn(b, sk, hk, 128, device="cuda", dtype=torch.bfloat16)
                for _ in range(2))
    return q, k, v


def providers(q, k, v):
    return {n: (lambda f=f: f(q, k, v)) for n, f in PROVIDERS.items()}


def row(label, t):
    return f"{label:28s}" + "".join(f"  {n} {x:8.1f}" for n, x in t.items())


def main(mode):
    if "A" in mode:
        print("A: batch sweep, MHA 32/32, 8k keys (us)")
        for b in (16, 20, 24, 28, 30, 31, 32, 33, 34, 36, 40):
            t = timed(providers(*inputs(b, 8192, 32)))
            print(row(f"B{b} ({b * 32 / 132:.2f} waves)", t), flush=True)
    if "B" in mode:
        print("B: K/V layout, B=32, 8k keys (us)")
        for hk in (32, 8):
            for hm in (False, True):
                t = timed(providers(*inputs(32, 8192, hk, hm)))
                print(row(f"32/{hk} {'head-major' if hm else '(B, S, H, D)'}", t), flush=True)
    if "C" in mode:
        print("C: forced num_splits (us)")
        for b, sk, hk in ((32, 8192, 32), (16, 8192, 32), (24, 8192, 32), (40, 8192, 32),
                          (48, 8192, 32), (64, 4096, 32), (8, 32768, 32), (32, 8192, 8)):
            q, k, v = inputs(b, sk, hk)
            t = timed({f"s{s}": (lambda s=s: fa4_aot.attention(q, k, v, causal=True,
                                                                num_splits=s))
                       for s in (1, 2, 3, 4, 5, 6, 8)})
            print(row(f"B{b} x {sk // 1024}k, 32/{hk}", t), flush=True)
            del q, k, v
            torch.cuda.empty_cache()


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "ABC")
