"""FA4 and fa4_aot taking turns of N calls, as the benchmark times them, with each call of a
turn timed on its own: how the ratio moves from a turn's first calls to its last, and with
what ran before the turn (the other provider, the benchmark's cuDNN peer: for packed documents
a low-power loop of one SDPA call per document, or an idle gap).

    python tools/experiments/turn_probe.py docs 16384+512*32 16 128 causal \\
        --modes steady,cudnn,gap50,gap200 [--calls 20] [--rounds 18] [--soak 3]

``steady``: FA4 and fa4_aot alternate (benchlib.round_order); ``cudnn``: the two and the
benchmark's cuDNN peer on the same problem (``bench_fwd.build``: for packed documents one SDPA
call per document) in a Williams order, each provider's turns reported after the peer's and
after the other's; ``gapMS``: MS of idle host time before every turn. Prints, per mode, the
median per-call µs of calls 1-3, 4-10, 11-N and the whole turn, and FA4 / fa4_aot for each.
Needs an sm_90 GPU and upstream FA4 (flash-attn-4).
"""

import argparse
import itertools
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from bench.benchlib import Case, doc_lens, timed_rounds  # noqa: E402
from tools.experiments.power_probe import soak  # noqa: E402
from tools.experiments.prefill_ncu_probe import calls_for  # noqa: E402

SEGMENTS = ((0, 3), (3, 10), (10, None))  # calls 1-3, 4-10, 11-N of a turn


def segment_means(per_call, segments=SEGMENTS):
    """Per-call times of one turn -> the mean of each segment, then of the whole turn."""
    out = [statistics.fmean(per_call[a:b]) for a, b in segments]
    return out + [statistics.fmean(per_call)]


def summarize(turns, segments=SEGMENTS):
    """[per-call times of each turn] -> the median over turns of each segment_means entry."""
    rows = [segment_means(t, segments) for t in turns]
    return [statistics.median(col) for col in zip(*rows)]


def cudnn_peer(shape):
    """The benchmark's cuDNN peer (``bench_fwd.build``, inside its ``provider_context``) on
    ``B H S D [causal]`` or ``docs LENS H D [causal]``, as a call without arguments that goes
    round the benchmark's input sets as its repeats do."""
    from bench.bench_fwd import Env, Inputs, build, provider_context
    causal = shape[-1] == "causal"
    if shape[0] == "docs":
        case = Case("probe", "probe", int(shape[2]), int(shape[3]), causal,
                    docs=tuple(doc_lens(shape[1])))
    else:
        b, h, s, d = (int(x) for x in shape[:4])
        case = Case("probe", "probe", h, d, causal, batch=b, seqlen_q=s, seqlen_k=s)
    fn, _ = build(Env(["cudnn"]), "cudnn", case, Inputs(case, torch.bfloat16), "auto")
    calls = itertools.count()

    def run():
        with provider_context("cudnn"):
            fn(next(calls))
    return run


def timed_turn(f, n):
    """Per-call µs of ``n`` back-to-back calls (an event between each two)."""
    ev = [torch.cuda.Event(enable_timing=True) for _ in range(n + 1)]
    ev[0].record()
    for i in range(n):
        f()
        ev[i + 1].record()
    ev[-1].synchronize()
    return [1000 * ev[i].elapsed_time(ev[i + 1]) for i in range(n)]


def run_mode(mode, calls, peer, n, rounds, soak_seconds):
    """{(provider, 'all' | 'after cudnn' | 'after other'): [per-call times of each turn]} of
    FA4 and fa4_aot for one mode (the cuDNN peer's turns are not reported)."""
    fs = dict(calls, cudnn=peer) if mode == "cudnn" else dict(calls)
    gap = float(mode[3:]) / 1000 if mode.startswith("gap") else 0.0

    def turn(name):
        if gap:
            torch.cuda.synchronize()
            time.sleep(gap)
        return timed_turn(fs[name], n)

    timed = timed_rounds(list(fs), rounds, turn, first_after=soak(fs, n, soak_seconds))
    out = {}
    for name in calls:
        turns, after = timed[name]
        out[(name, "all")] = turns
        if mode == "cudnn":
            for t, before in zip(turns, after):
                key = (name, "after cudnn" if before == "cudnn" else "after other")
                out.setdefault(key, []).append(t)
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("shape", nargs="+", help="B H S D [causal] | docs LENS H D [causal]")
    ap.add_argument("--modes", default="steady,cudnn,gap50")
    ap.add_argument("--calls", type=int, default=20, help="calls a turn (the benchmark's 20)")
    ap.add_argument("--rounds", type=int, default=18)
    ap.add_argument("--soak", type=float, default=3.0)
    a = ap.parse_args(argv)
    calls = calls_for(a.shape)
    if "fa4" not in calls:
        sys.exit("turn_probe: upstream FA4 (flash-attn-4) is not importable")
    peer = cudnn_peer(a.shape)
    print(f"{'mode':8s} {'turns':13s} FA4 / fa4_aot µs a call: calls 1-3, 4-10, "
          f"11-{a.calls}, all; ratio")
    for mode in a.modes.split(","):
        res = run_mode(mode, calls, peer, a.calls, a.rounds, a.soak)
        for label in ("all", "after cudnn", "after other"):
            if ("fa4", label) not in res:
                continue
            f4, ours = summarize(res[("fa4", label)]), summarize(res[("fa4_aot", label)])
            print(f"{mode:8s} {label:13s} " + " ".join(f"{x:7.1f}" for x in f4) + " | "
                  + " ".join(f"{x:7.1f}" for x in ours) + " | "
                  + " ".join(f"{x / y:.3f}" for x, y in zip(f4, ours)), flush=True)


if __name__ == "__main__":
    main()
