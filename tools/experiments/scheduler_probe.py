"""The three sm_90a schedulers (``single``, ``static``, ``steal``) on the same inputs: outputs
checked bitwise against ``steal``, then either one warm call of each for ncu or each
scheduler alone under sustained load (µs / W / MHz / J per call, A-B-C-C-B-A; power_probe's
``sustained``). Which scheduler reads the fewest K/V sectors from L2, and what that is worth
at the power cap (docs/perf-notes.md v32).

    python tools/experiments/scheduler_probe.py sustained 2 16 8192 128 [causal]
    python tools/experiments/scheduler_probe.py sustained docs 16384+512*32 16 128 [causal]
    ncu --profile-from-start off --clock-control none \\
        --metrics lts__t_sectors_srcunit_tex_op_read.sum,dram__bytes_read.sum,sm__cycles_elapsed.max \\
        python tools/experiments/scheduler_probe.py ncu 2 16 8192 128
"""

import argparse
import functools
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
import fa4_aot  # noqa: E402
from fa4_aot.configs import SCHEDULERS_BY_ARCH  # noqa: E402
from tools.experiments.power_probe import sustained  # noqa: E402
from tools.experiments.prefill_ncu_probe import inputs_for, profile_once  # noqa: E402

SCHEDULERS = SCHEDULERS_BY_ARCH["sm_90a"]


def scheduler_calls(shape):
    """``{scheduler: call}`` on prefill_ncu_probe's inputs (``B H S D [causal]`` or ``docs LENS
    H D [causal]``), one set for all three."""
    q, k, v, causal, kw = inputs_for(shape)
    return {s: functools.partial(fa4_aot.attention, q, k, v, causal=causal, scheduler=s, **kw)
            for s in SCHEDULERS}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("mode", choices=("ncu", "sustained"))
    ap.add_argument("shape", nargs="+", help="B H S D [causal] | docs LENS H D [causal]")
    ap.add_argument("--seconds", type=float, default=2.5)
    a = ap.parse_args(argv)
    calls = scheduler_calls(a.shape)
    ref = calls["steal"]()
    for name, f in calls.items():
        if not torch.equal(f(), ref):
            raise SystemExit(f"scheduler {name}: output differs from steal's")
    if a.mode == "ncu":
        profile_once(list(calls.values()))
        return
    for name in (*SCHEDULERS, *reversed(SCHEDULERS)):
        us, watts, mhz = sustained(calls[name], a.seconds)
        print(f"{name:7s} {us:9.1f} us/call {watts:6.1f} W {mhz:6.0f} MHz "
              f"{us * watts / 1e6:.4f} J/call", flush=True)


if __name__ == "__main__":
    main()
