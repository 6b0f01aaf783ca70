"""Sustained power and SM clock of FA4 and fa4_aot on the same prefill inputs: each kernel back
to back for a few seconds while ``nvidia-smi`` samples power.draw and clocks.sm every 50 ms
(the first quarter of the samples dropped), the providers taken A-B-B-A. Near the GPU's power
cap the clock each kernel gets is set by its energy per cycle (docs/perf-notes.md v14).

    python tools/experiments/power_probe.py B H S D [causal] [--seconds 4]
    python tools/experiments/power_probe.py docs 16384+512*32 16 128 causal
    python tools/experiments/power_probe.py 2 16 8192 128 --l2-budgets 32,8   # fa4_aot only,
        # once per L2 section budget in MB (schedule.choose_section), A-B-B-A
    python tools/experiments/power_probe.py docs 16384+512*32 16 128 causal \
        --variants "base=artifacts;new=.exp/new"   # fa4_aot only, one artifacts folder each
        # (ab_artifacts.py's name=folder[:CONST=value] variants, ';'-separated), A-B-B-A
    python tools/experiments/power_probe.py docs 16384+512*32 16 128 causal --turns 5,20,100
        # first, the providers alternating every N calls (benchlib.round_order), after --soak
        # seconds of the same: how far the clock each one holds is its own at that turn length

In-process A/Bs (``ab_artifacts.py``) alternate the variants every 20 calls: they measure
cycles, not the clock each variant would hold alone at the power cap (docs/perf-notes.md v23).


Needs an NVIDIA GPU with nvidia-smi; upstream FA4 (flash-attn-4) when importable.
"""

import argparse
import functools
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from tools.experiments.prefill_ncu_probe import calls_for  # noqa: E402


def sustained(f, seconds):
    """(µs per call, mean W, mean SM MHz) of ``f`` run back to back for ``seconds``."""
    for _ in range(5):
        f()
    torch.cuda.synchronize()
    smi = _smi()
    start, end = torch.cuda.Event(True), torch.cuda.Event(True)
    t0, n = time.time(), 0
    start.record()
    while time.time() - t0 < seconds:
        for _ in range(10):
            f()
        n += 10
        torch.cuda.synchronize()
    end.record()
    torch.cuda.synchronize()
    watts, mhz = _smi_means(smi, drop=0.25)
    return 1000 * start.elapsed_time(end) / n, watts, mhz


def _smi():
    """nvidia-smi sampling power.draw and clocks.sm every 50 ms until terminated."""
    return subprocess.Popen(["nvidia-smi", "--query-gpu=power.draw,clocks.sm",
                             "--format=csv,noheader,nounits", "-lms", "50"],
                            stdout=subprocess.PIPE, text=True)


def _smi_means(smi, drop=0):
    """(mean W, mean SM MHz) of the samples of a finished ``_smi()``, the first ``drop``
    fraction left out."""
    smi.terminate()
    rows = [[float(x) for x in line.split(",")] for line in smi.communicate()[0].splitlines()
            if line.strip()]
    rows = rows[int(len(rows) * drop):] or [[float("nan")] * 2]
    return statistics.mean(r[0] for r in rows), statistics.mean(r[1] for r in rows)


def soak(calls, per_turn, seconds):
    """Untimed turns of ``per_turn`` calls of each of ``calls`` ({name: call}), in the
    benchmark's round order, for ``seconds``; returns the name that ran last (None if none)."""
    from bench.benchlib import round_order
    names, r, last = list(calls), 0, None
    end = time.time() + seconds
    while time.time() < end:
        for name in round_order(names, r):
            for _ in range(per_turn):
                calls[name]()
            last = name
        torch.cuda.synchronize()
        r += 1
    return last


def alternating(calls, per_turn, rounds, soak_seconds, prime=False):
    """({name: median µs per call}, mean W, mean SM MHz) of the providers taking turns of
    ``per_turn`` calls (benchlib.timed_rounds), timed for ``rounds`` rounds after
    ``soak_seconds`` of untimed turns (:func:`soak`); ``prime``: one untimed call before each
    timed turn (so that the host work of switching artifacts folders, ab_artifacts.Variant,
    stays out of the timing). Each turn is timed as bench_fwd times one (``time_once``)."""
    from bench.bench_fwd import time_once
    from bench.benchlib import timed_rounds

    def turn(name):
        if prime:
            calls[name]()
        return 1000 * time_once(lambda _: calls[name](), per_turn)

    last = soak(calls, per_turn, soak_seconds)
    smi = _smi()
    timed = timed_rounds(list(calls), rounds, turn, first_after=last)
    watts, mhz = _smi_means(smi)
    return {k: statistics.median(t) for k, (t, _) in timed.items()}, watts, mhz


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("shape", nargs="+", help="B H S D [causal] | docs LENS H D [causal]")
    ap.add_argument("--seconds", type=float, default=4.0)
    ap.add_argument("--l2-budgets", help="comma list of MB: fa4_aot alone, once per section "
                    "budget (the launch's L2 section, perf-notes v15)")
    ap.add_argument("--variants", help="';'-separated name=folder[:CONST=value]: fa4_aot "
                    "alone, once per artifacts folder (tools/experiments/ab_artifacts.py)")
    ap.add_argument("--turns", help="comma list of calls per turn: an alternating A/B at each, "
                    "--rounds rounds, after --soak seconds of untimed turns (the bench takes "
                    "20 calls a turn)")
    ap.add_argument("--soak", type=float, default=10.0)
    ap.add_argument("--rounds", type=int, default=12)
    a = ap.parse_args(argv)
    calls = calls_for(a.shape)  # prefill_ncu_probe's inputs and calls
    if a.variants:
        from tools.experiments.ab_artifacts import Variant
        calls = {v.name: _in_variant(v, calls["fa4_aot"])
                 for v in (Variant(*x.split("=", 1)) for x in a.variants.split(";"))}
    if a.l2_budgets:
        calls = {f"{mb}MB": _with_section_budget(calls["fa4_aot"], int(mb) << 20)
                 for mb in a.l2_budgets.split(",")}
    names = list(calls)
    for n in (int(x) for x in a.turns.split(",")) if a.turns else ():
        us, watts, mhz = alternating(calls, n, a.rounds, a.soak)
        print(f"{n:4d} calls a turn: " + ", ".join(f"{k} {t:.1f} us" for k, t in us.items())
              + f" ({names[0]} / {names[-1]} {us[names[0]] / us[names[-1]]:.3f});"
              f" {watts:.0f} W {mhz:.0f} MHz", flush=True)
    for name in names + names[::-1] if a.seconds > 0 else ():
        us, watts, mhz = sustained(calls[name], a.seconds)
        print(f"{name:8s} {us:9.1f} us/call {watts:7.1f} W {mhz:7.0f} MHz", flush=True)


def _in_variant(v, call):
    """``call`` run with variant ``v``'s kernels and launch values (switched to on the first
    call after another variant ran)."""
    def run():
        if type(v).active is not v:
            v.enter()
        return call()
    return run


def _with_section_budget(call, budget):
    """``call`` with fa4_aot's section choice (interface._section) at an L2 budget of
    ``budget`` bytes: the launch plan is rebuilt (memo cleared) on the switch."""
    from fa4_aot import interface, schedule

    def run():
        want = functools.partial(schedule.choose_section, l2_budget=budget)
        if getattr(interface._section, "keywords", None) != want.keywords:
            interface._section = want
            interface.clear_memo()
        return call()
    return run


if __name__ == "__main__":
    main()
