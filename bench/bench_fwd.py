"""Forward benchmark: fa4_aot (each scheduler) vs cuDNN SDPA and torch flash, one process.

    python bench/bench_fwd.py [--set anchors|imbalanced|all] [--json FILE] [--csv FILE]
                              [--png FILE] [--iters N]

TFLOP/s = 4 * B * H * Sq * Sk * D / t, for causal counting only the unmasked (q, k) pairs
(bottom-right aligned: sum over rows of min(Sk, row + 1 + Sk - Sq)). Times are the median over 3 repeats of
CUDA events around ``--iters`` back-to-back launches after warm-up, rotating over several input sets so
that the inputs are not all resident in L2.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

ANCHORS = [(2, 16, 8192, 128), (2, 32, 8192, 64), (4, 16, 4096, 128), (8, 16, 2048, 128),
           (2, 8, 8192, 256)]
IMBALANCED = [(32, 16, 1024, 128), (16, 16, 2048, 128), (8, 16, 4096, 128), (4, 16, 8192, 128),
              (2, 16, 16384, 128), (32, 16, 1024, 64), (16, 16, 2048, 64), (8, 16, 4096, 64),
              (4, 16, 8192, 64), (2, 16, 16384, 64)]


def flops(b, h, sq, sk, d, causal):
    if not causal:
        pairs = sq * sk
    else:
        off = sk - sq
        pairs = sum(max(0, min(sk, r + 1 + off)) for r in range(sq))
    return 4 * b * h * pairs * d


def time_ms(fn, iters, warmup=3, repeats=3):
    """Median over ``repeats`` of (events around ``iters`` back-to-back launches) / iters, as
    shared/bench/sdpa_baseline.py measures the peers: host launch cost hides behind the GPU
    unless it is longer than the kernel."""
    import torch
    for i in range(warmup):
        fn(i)
    torch.cuda.synchronize()
    per_call = []
    for _ in range(repeats):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        for i in range(iters):
            fn(i)
        e.record()
        e.synchronize()
        per_call.append(s.elapsed_time(e) / iters)
    return statistics.median(per_call)


def run_case(b, h, s, d, causal, iters, providers):
    import torch
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    import fa4_aot
    n_sets = max(1, min(4, (2 << 30) // (3 * b * s * h * d * 2)))
    sets = [tuple(torch.randn(b, s, h, d, device="cuda", dtype=torch.bfloat16) for _ in range(3))
            for _ in range(n_sets)]
    sets_t = [tuple(x.transpose(1, 2) for x in st) for st in sets]  # (B, H, S, D) views for SDPA
    row = {"B": b, "H": h, "S": s, "D": d, "causal": causal}
    fl = flops(b, h, s, s, d, causal)
    for prov in providers:
        if prov.startswith("fa4_aot"):
            # fa4_aot:<scheduler>[:<variant>]  (variants: experiment builds, see build.py)
            _, sched, *var = prov.split(":")
            if d not in (64, 128):
                row[prov] = None
                continue
            fn = lambda i, sched=sched, var=(var[0] if var else ""): fa4_aot.attention(
                *sets[i % n_sets], causal=causal, scheduler=sched, _variant=var)
        else:
            backend = {"cudnn": SDPBackend.CUDNN_ATTENTION, "flash": SDPBackend.FLASH_ATTENTION}[prov]

            def fn(i, backend=backend):
                with sdpa_kernel(backend):
                    F.scaled_dot_product_attention(*sets_t[i % n_sets], is_causal=causal)
        try:
            ms = time_ms(fn, iters)
            row[prov] = round(fl / ms / 1e9, 1)
        except Exception as e:  # a peer may not support a shape
            print(f"  {prov} failed on {row}: {e}", file=sys.stderr)
            row[prov] = None
    return row


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--set", choices=["anchors", "imbalanced", "all"], default="all")
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--providers", default="fa4_aot:single,fa4_aot:static,fa4_aot:steal,cudnn,flash")
    ap.add_argument("--json")
    ap.add_argument("--shapes", help="B,H,S,D[,c] list separated by ';' instead of --set")
    a = ap.parse_args(argv)
    providers = a.providers.split(",")
    cases = []
    if a.set in ("anchors", "all"):
        cases += [(b, h, s, d, c) for b, h, s, d in ANCHORS for c in (False, True)]
    if a.set in ("imbalanced", "all"):
        cases += [(b, h, s, d, True) for b, h, s, d in IMBALANCED]
    if a.shapes:
        cases = []
        for item in a.shapes.split(";"):
            f = item.split(",")
            cases.append((int(f[0]), int(f[1]), int(f[2]), int(f[3]), len(f) > 4 and f[4] == "c"))
    rows = []
    for b, h, s, d, c in cases:
        rows.append(run_case(b, h, s, d, c, a.iters, providers))
        print(json.dumps(rows[-1]), flush=True)
    print()
    hdr = f"{'B':>3} {'H':>3} {'S':>6} {'D':>4} {'causal':>6} " + " ".join(f"{p:>15}" for p in providers)
    print("TFLOP/s (bf16 fwd; causal counts unmasked pairs)")
    print(hdr)
    for r in rows:
        cells = " ".join(f"{(r[p] if r[p] is not None else float('nan')):>15.1f}" for p in providers)
        print(f"{r['B']:>3} {r['H']:>3} {r['S']:>6} {r['D']:>4} {str(r['causal']):>6} {cells}")
    if a.json:
        Path(a.json).write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
