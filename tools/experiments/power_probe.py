"""Sustained power and SM clock of FA4 and fa4_aot on the same prefill inputs: each kernel back
to back for a few seconds while ``nvidia-smi`` samples power.draw and clocks.sm every 50 ms
(the first quarter of the samples dropped), the providers taken A-B-B-A. Near the GPU's power
cap the clock each kernel gets is set by its energy per cycle (docs/perf-notes.md v14).

    python tools/experiments/power_probe.py B H S D [causal] [--seconds 4]
    python tools/experiments/power_probe.py docs 16384+512*32 16 128 causal

Needs an NVIDIA GPU with nvidia-smi; upstream FA4 (flash-attn-4) when importable.
"""

import argparse
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
    smi = subprocess.Popen(["nvidia-smi", "--query-gpu=power.draw,clocks.sm",
                            "--format=csv,noheader,nounits", "-lms", "50"],
                           stdout=subprocess.PIPE, text=True)
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
    smi.terminate()
    rows = [[float(x) for x in line.split(",")] for line in smi.communicate()[0].splitlines()
            if line.strip()]
    rows = rows[len(rows) // 4:]
    return (1000 * start.elapsed_time(end) / n, statistics.mean(r[0] for r in rows),
            statistics.mean(r[1] for r in rows))


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("shape", nargs="+", help="B H S D [causal] | docs LENS H D [causal]")
    ap.add_argument("--seconds", type=float, default=4.0)
    a = ap.parse_args(argv)
    calls = calls_for(a.shape)  # prefill_ncu_probe's inputs and calls
    names = list(calls)
    for name in names + names[::-1]:
        us, watts, mhz = sustained(calls[name], a.seconds)
        print(f"{name:8s} {us:9.1f} us/call {watts:7.1f} W {mhz:7.0f} MHz", flush=True)


if __name__ == "__main__":
    main()
