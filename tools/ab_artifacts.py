"""Is kernel variant B faster than A, and bitwise equal? An in-process A/B of artifacts folders.

Run from the repo root on an sm_90 GPU. The variants are taken in turn every round in one
process, so clock and thermal drift hit them alike (separate processes moved ±5 % between runs), in the
orders of bench/benchlib.py's round_order (each variant in every position and after every other
equally often; with three variants or more the earlier order, reversed every other round,
favoured the middle one: docs/perf-notes.md v24).

    python -m tools.ab_artifacts base=artifacts vl=.exp/h128 \\
        --shapes '2,16,8192,128;2,16,8192,128,c;docs:16384+512*32,16,128,c' --rounds 9

A shape is ``B,H,S,D[,c|wN]`` (dense, ``c``: causal, ``wN``: sliding window (N, 0)),
``docs:LENS,H,D[,c]``: packed documents
of the ``+``-joined lengths (``N*k``: k documents of N tokens), q/k/v varlen, or
``paged:B,SQ,SK,H,HK,PAGE``: causal attention of B sequences of SQ new tokens (varlen q when
SQ > 1) against SK keys in a shuffled paged cache (bench/bench_decode.py's paged cases, hd128),
or ``kv:B,SQ,SK,H,HK[,D]``: the same with contiguous (B, SK, HK, D) K/V (decode shapes; D
128 unless given).

A variant ``name=folder:kernel=K`` forces a kernel on every call of its folder: K a planner
form (a row family of ``fa4_aot.plan.KERNEL_CHOICE``: ``wide=artifacts:kernel=long_kv`` runs
the shipped 160-key kernels whatever ``prefer_long_kv`` says) or a manifest kernel name. Each
(shape, variant) is prepared once through ``fa4_aot.interface.prepare`` with the variant's
manifest and kernel, and timed through ``PreparedCall.launch``: nothing of fa4_aot is patched.
A variant folder may hold only the kernels it changes (built with
``python -m tools.variants ... --only ...``, completed by ``python -m tools.fill_variant``);
every call of a shape must find its kernel there. Outputs are compared bitwise against the
first variant's. Prints median TFLOP/s per variant and the ratio to the first (with the spread
over rounds).
"""

from __future__ import annotations

import argparse
import itertools
import statistics
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
from fa4_aot import interface, manifest
from fa4_aot.validate import Args
from bench.benchlib import doc_lens, round_order, visible_pairs
from bench.bench_decode import paged_inputs


class Variant:
    """``name=folder`` or ``name=folder:kernel=K``: an artifacts folder, and a kernel (planner
    form or manifest name) forced on its calls."""

    def __init__(self, name: str, spec: str):
        root, _, opts = spec.partition(":")
        self.name, self.man = name, manifest.load_manifest(str(Path(root).resolve()))
        self.kernel = None
        for kv in filter(None, opts.split(",")):
            k, v = kv.split("=", 1)
            if k != "kernel":
                raise SystemExit(f"variant {name}: unknown option {k!r} (kernel=FORM|NAME)")
            self.kernel = v

    def prepare(self, a: Args):
        """This variant's prepared call of ``a`` (run it with ``.launch(args)``)."""
        return interface.prepare(a, manifest=self.man, kernel=self.kernel)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("variants", nargs="+", help="name=artifacts folder")
    ap.add_argument("--shapes", required=True, help="B,H,S,D[,c] separated by ';'")
    ap.add_argument("--rounds", type=int, default=9)
    ap.add_argument("--iters", type=int, default=20)
    a = ap.parse_args(argv)
    variants = [Variant(*v.split("=", 1)) for v in a.variants]
    print(f"{'shape':34s}" + "".join(f"{v.name:>18s}" for v in variants))
    for spec in a.shapes.split(";"):
        kw, f = {}, spec.split(",")
        if spec.startswith("docs:"):
            lens = doc_lens(f[0][5:])
            h, d = int(f[1]), int(f[2])
            causal = len(f) > 3 and f[3] == "c"
            cu = torch.tensor([0] + list(itertools.accumulate(lens)), dtype=torch.int32,
                              device="cuda")
            kw = dict(cu_seqlens_q=cu, cu_seqlens_k=cu, max_seqlen_q=max(lens),
                      max_seqlen_k=max(lens))
            sets = [tuple(torch.randn(sum(lens), h, d, device="cuda", dtype=torch.bfloat16)
                          for _ in range(3)) for _ in range(2)]
            flops = 4 * h * d * sum(visible_pairs(n, n, causal) for n in lens)
            label = f"docs {f[0][5:]} hd{d}{' c' if causal else ''}"
        elif spec.startswith("paged:"):
            b, sq, sk, h, hk, page = (int(x) for x in [f[0][6:]] + f[1:6])
            q, kc, vc, table, used, _, _, cu_q = paged_inputs(b, sq, sk, h, hk, page)
            causal, d = True, q.shape[-1]
            kw = dict(page_table=table, seqused_k=used)
            if cu_q is not None:
                kw.update(cu_seqlens_q=cu_q, max_seqlen_q=sq)
            sets = [(q, kc, vc), (q, kc, vc)]
            flops = 4 * h * d * b * visible_pairs(sq, sk, True)
            label = f"paged {b}x{sq}/{sk} {h}/{hk} p{page}"
        elif spec.startswith("kv:"):
            b, sq, sk, h, hk = (int(x) for x in [f[0][3:]] + f[1:5])
            causal, d = True, int(f[5]) if len(f) > 5 else 128
            sets = [(torch.randn(b, sq, h, d, device="cuda", dtype=torch.bfloat16),
                     *(torch.randn(b, sk, hk, d, device="cuda", dtype=torch.bfloat16)
                       for _ in range(2))) for _ in range(2)]
            flops = 4 * h * d * b * visible_pairs(sq, sk, True)
            label = f"kv {b}x{sq}/{sk} {h}/{hk} hd{d}"
        else:
            b, h, s, d = (int(x) for x in f[:4])
            causal = len(f) > 4 and f[4] == "c"
            sets = [tuple(torch.randn(b, s, h, d, device="cuda", dtype=torch.bfloat16)
                          for _ in range(3)) for _ in range(2)]
            flops = 4 * b * h * d * visible_pairs(s, s, causal)
            label = f"{b}x{h}x{s}x{d}{' c' if causal else ''}"
            if len(f) > 4 and f[4].startswith("w"):  # ``wN``: sliding window (N, 0)
                left = int(f[4][1:])
                kw = dict(window_size=(left, 0))
                flops = 4 * b * h * d * visible_pairs(s, s, window=(left, 0))
                label = f"{b}x{h}x{s}x{d} w({left},0)"
        args = [Args(q=qs, k=ks, v=vs, causal=causal, **kw) for qs, ks, vs in sets]
        calls = {v.name: v.prepare(args[0]) for v in variants}
        ref, times = None, {v.name: [] for v in variants}
        for r in range(a.rounds):
            for v in round_order(variants, r):
                call = calls[v.name]
                with torch.no_grad():
                    out = call.launch(args[0])[0]
                    if ref is None:
                        ref = out
                    elif r == 0 and not torch.equal(out, ref):
                        print(f"  {v.name}: output differs from {variants[0].name} "
                              f"(max {(out.float() - ref.float()).abs().max().item():.3g})")
                    start, end = torch.cuda.Event(True), torch.cuda.Event(True)
                    start.record()
                    for i in range(a.iters):
                        call.launch(args[i % 2])
                    end.record()
                    torch.cuda.synchronize()
                times[v.name].append(start.elapsed_time(end) / a.iters)
        base = statistics.median(times[variants[0].name])
        cells = []
        for v in variants:
            t = statistics.median(times[v.name])
            cells.append(f"{flops / t / 1e9:7.1f} ({base / t:.3f})")
        print(f"{label:34s}" + "".join(f"{c:>18s}" for c in cells), flush=True)


if __name__ == "__main__":
    main()
