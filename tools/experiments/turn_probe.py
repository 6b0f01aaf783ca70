"""FA4 and fa4_aot taking turns of N calls, as the benchmark times them, with each call of a
turn timed on its own: how the ratio moves from a turn's first calls to its last, and with
what ran before the turn (the other provider, a low-power turn of one SDPA call per document
as the benchmark's cuDNN peer, or an idle gap).

    python tools/experiments/turn_probe.py docs 16384+512*32 16 128 causal \\
        --modes steady,cudnn,gap50,gap200 [--calls 20] [--rounds 18] [--soak 3]

``steady``: FA4 and fa4_aot alternate (benchlib.round_order); ``cudnn``: the two and the
per-document SDPA loop (cuDNN backend) in a Williams order, each provider's turns reported
after the loop's and after the other's; ``gapMS``: MS of idle host time before every turn.
Prints, per mode, the median per-call µs of calls 1-3, 4-10, 11-N and the whole turn, and
FA4 / fa4_aot for each. Needs an sm_90 GPU and upstream FA4 (flash-attn-4).
"""

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from bench.benchlib import doc_lens, round_order  # noqa: E402
from tools.experiments.prefill_ncu_probe import calls_for, inputs_for  # noqa: E402

SEGMENTS = ((0, 3), (3, 10), (10, None))  # calls 1-3, 4-10, 11-N of a turn


def segment_means(per_call, segments=SEGMENTS):
    """Per-call times of one turn -> the mean of each segment, then of the whole turn."""
    out = [statistics.fmean(per_call[a:b]) for a, b in segments]
    return out + [statistics.fmean(per_call)]


def summarize(turns, segments=SEGMENTS):
    """[per-call times of each turn] -> the median over turns of each segment_means entry."""
    rows = [segment_means(t, segments) for t in turns]
    return [statistics.median(col) for col in zip(*rows)]


def sdpa_per_document(q, k, v, causal, lens):
    """The benchmark's cuDNN peer for packed documents: one SDPA call per document."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    def run():
        s = 0
        with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
            for n in lens:
                qq, kk, vv = (t[s:s + n].transpose(0, 1).unsqueeze(0) for t in (q, k, v))
                torch.nn.functional.scaled_dot_product_attention(qq, kk, vv, is_causal=causal)
                s += n
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


def run_mode(mode, calls, filler, n, rounds, soak):
    """{(provider, 'after X'): [per-call times of each turn]} for one mode."""
    fs = dict(calls)
    if mode == "cudnn":
        fs["cudnn"] = filler
    gap = float(mode[3:]) / 1000 if mode.startswith("gap") else 0.0
    names = list(fs)
    end, r, prev = time.time() + soak, 0, None
    while time.time() < end:
        for name in round_order(names, r):
            for _ in range(n):
                fs[name]()
            prev = name
        r += 1
    torch.cuda.synchronize()
    out = {}
    for r in range(rounds):
        for name in round_order(names, r):
            if gap:
                torch.cuda.synchronize()
                time.sleep(gap)
            t = timed_turn(fs[name], n)
            if name != "cudnn":
                out.setdefault((name, "all"), []).append(t)
                if mode == "cudnn":
                    before = "cudnn" if prev == "cudnn" else "other"
                    out.setdefault((name, f"after {before}"), []).append(t)
            prev = name
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
    q, k, v, causal, kw = inputs_for(a.shape)
    lens = doc_lens(a.shape[1]) if a.shape[0] == "docs" else [q.shape[1]] * q.shape[0]
    if not kw:  # dense (B, S, H, D): the documents are the batch entries, one after another
        q, k, v = (t.flatten(0, 1) for t in (q, k, v))
    filler = sdpa_per_document(q, k, v, causal, lens)
    print(f"{'mode':8s} {'turns':13s} FA4 / fa4_aot µs a call: calls 1-3, 4-10, "
          f"11-{a.calls}, all; ratio")
    for mode in a.modes.split(","):
        res = run_mode(mode, calls, filler, a.calls, a.rounds, a.soak)
        for label in ("all", "after cudnn", "after other"):
            if ("fa4", label) not in res:
                continue
            f4, ours = summarize(res[("fa4", label)]), summarize(res[("fa4_aot", label)])
            print(f"{mode:8s} {label:13s} " + " ".join(f"{x:7.1f}" for x in f4) + " | "
                  + " ".join(f"{x:7.1f}" for x in ours) + " | "
                  + " ".join(f"{x / y:.3f}" for x, y in zip(f4, ours)), flush=True)


if __name__ == "__main__":
    main()
