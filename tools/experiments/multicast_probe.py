"""K/V multicast over a cluster of two CTAs against the shipped kernel, same order, same
inputs: outputs bitwise, in-process time, and sustained µs / W / MHz / J per call
(docs/perf-notes.md v26). Dense calls only: the two CTAs of a cluster must hold adjacent
m-blocks of one head (``single`` scheduler, one head per section, an even number of m-blocks).
Causal (``--causal``), rank 1 holds the lower m-block and loads the union of the two key
ranges; it passes on (waits for and releases) the one block only its peer needs.

Build the experiment kernels (a git worktree, the patch, two kernels):

    git worktree add /tmp/mc HEAD
    git -C /tmp/mc apply $PWD/tools/experiments/patches/kv_multicast_pair.diff
    (cd /tmp/mc && $OLDPWD/.venv/bin/python build_tools/build.py \\
        --only 'fwd_sm_90a_bf16_hd128_(full|causal)_single_m128n176s2$' --out $OLDPWD/.exp/mc)

then on an sm_90 GPU (this script sets the launch cluster of the folder's patched kernels to
(2, 1, 1)):

    python tools/experiments/fill_variant.py .exp/mc   # the shipped 128-key kernels (causal lookups)
    python tools/experiments/multicast_probe.py .exp/mc 2 16 8192 128 [--causal] [--ncu] [--seconds 3]

The patch: K is loaded by cluster rank 0 and V by rank 1, each ``multicast::cluster`` to both
CTAs; the K/V pipelines' empty barriers count the consumer warps of both CTAs
(``PipelineTmaAsync`` with a (1, 2, 1, 1) cluster layout); a cluster barrier after the
mbarrier inits; the producer waits for every stage's release (both CTAs) before it exits.
``--scheduler steal``: the kernels built with ``FA4_AOT_PAIR_STEAL=1`` (the ``steal`` kernels
instead of ``single``): the cluster's rank 0 steals pairs of tiles from the counter and hands
the peer its tile through a 16-byte mailbox per cluster in global memory (sequence number and
acknowledgement; rank 1 clears it after the last tile); this script enlarges the counter buffer
for the mailboxes. ``--ncu``: one warm call of each, for ``ncu --profile-from-start off``;
``--seconds 0``: no sustained part; ``--iters``: calls per variant and round in the A/B
(``power_probe.alternating``); ``--soak``: seconds of untimed turns first.
"""

from __future__ import annotations

import argparse
import itertools
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("folder", help="artifacts folder of the multicast kernel")
    ap.add_argument("shape", nargs=4, type=int, help="B H S D")
    ap.add_argument("--causal", action="store_true")
    ap.add_argument("--scheduler", default="single", choices=("single", "steal"),
                    help="steal: the pair-steal build (FA4_AOT_PAIR_STEAL=1), whose mailboxes "
                         "live in an enlarged counter buffer")
    ap.add_argument("--ncu", action="store_true")
    ap.add_argument("--seconds", type=float, default=3.0)
    ap.add_argument("--rounds", type=int, default=8)
    ap.add_argument("--iters", type=int, default=20, help="calls per variant and round")
    ap.add_argument("--soak", type=float, default=0.0,
                    help="seconds of untimed A/B turns before the timed ones (a GPU as warm as "
                         "in a long benchmark run: near the power cap, leakage at its height)")
    a = ap.parse_args(argv)

    # The patched kernels (those that differ from the shipped ones) launch in clusters of two.
    man = Path(a.folder) / "manifest.json"
    m = json.loads(man.read_text())
    shipped = json.loads((ROOT / "artifacts" / "manifest.json").read_text())["kernels"]
    for name, r in m["kernels"].items():
        if shipped.get(name, {}).get("sha256") != r["sha256"]:
            r["launch"]["cluster"] = [2, 1, 1]
    man.write_text(json.dumps(m, indent=1))

    import torch
    import fa4_aot
    from fa4_aot import interface
    from tools.experiments.ab_artifacts import Variant
    from tools.experiments.power_probe import alternating, sustained

    interface._section = lambda *args, **kw: 1  # adjacent m-blocks of one head side by side
    if a.scheduler == "steal":  # the counter, then a 16-byte mailbox per cluster from byte 64
        dev = torch.cuda.current_device()
        interface._counters[(dev, torch.cuda.current_stream().cuda_stream)] = torch.zeros(
            4096, dtype=torch.int32, device="cuda")
    b, h, s, d = a.shape
    torch.manual_seed(0)
    sets = [tuple(torch.randn(b, s, h, d, device="cuda", dtype=torch.bfloat16)
                  for _ in range(3)) for _ in range(2)]
    variants = [Variant("base", str(ROOT / "artifacts")), Variant("mc", a.folder)]
    flops = 4 * b * h * s * s * d // (2 if a.causal else 1)

    def call(v, i=0):
        def f():
            if Variant.active is not v:
                v.enter()
            return fa4_aot.attention(*sets[i % 2], causal=a.causal, scheduler=a.scheduler)
        return f

    outs = [call(v)().clone() for v in variants]
    torch.cuda.synchronize()
    print(f"bitwise equal: {torch.equal(*outs)}", flush=True)
    if a.ncu:
        for v in variants:
            f = call(v)
            for _ in range(3):
                f()
            torch.cuda.synchronize()
            torch.cuda.profiler.start()
            f()
            torch.cuda.synchronize()
            torch.cuda.profiler.stop()
        return

    def turns(v):  # the two input sets in turn
        n = itertools.count()
        return lambda: call(v, next(n))()

    us, watts, mhz = alternating({v.name: turns(v) for v in variants}, a.iters, a.rounds, a.soak,
                                 prime=True)
    print(f"during the A/B: {watts:.0f} W {mhz:.0f} MHz")
    for name, t in us.items():
        print(f"{b}x{h}x{s}x{d} {name:5s} {flops / t / 1e6:7.1f} TFLOP/s "
              f"({us['base'] / t:.3f})", flush=True)
    for v in (variants + variants[::-1]) if a.seconds > 0 else ():
        us, watts, mhz = sustained(call(v), a.seconds)
        print(f"{v.name:5s} {us:9.1f} us/call {watts:7.1f} W {mhz:7.0f} MHz "
              f"{us * watts / 1e6:.4f} J/call", flush=True)


if __name__ == "__main__":
    main()
