"""Capture schedule traces on the GPU (one per scheduler) and render them.

    python bench/trace_capture.py [--shape B,H,S] [--out DIR]

Runs the trace variant of the sm_90a kernel (bf16, head_dim 128, causal) with each scheduler,
saves DIR/trace_<scheduler>.npy + .json and renders DIR/trace_<scheduler>.png with
bench/trace_render.py; prints the per-scheduler summary last.
"""

import argparse
import json
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE))


def main(argv=None):
    import numpy as np
    import torch

    import tracelib as tl
    from fa4_aot.trace import capture

    ap = argparse.ArgumentParser()
    ap.add_argument("--shape", default="8,16,2048", help="B,H,S (causal, head_dim 128)")
    ap.add_argument("--out", default=".")
    a = ap.parse_args(argv)
    b, h, s = (int(x) for x in a.shape.split(","))
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    q, k, v = (torch.randn(b, s, h, 128, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    lines = []
    for sched in ("single", "static", "steal"):
        capture(q, k, v, scheduler=sched)  # warm-up (cubin load)
        _, tr, meta = capture(q, k, v, scheduler=sched)
        arr = tr.numpy()
        np.save(out / f"trace_{sched}.npy", arr)
        (out / f"trace_{sched}.json").write_text(json.dumps(meta))
        st = tl.trace_stats(arr, num_sms=meta["num_sms"])
        tl.plot_trace(arr, out / f"trace_{sched}.png", meta=meta, num_sms=meta["num_sms"],
                      stats=st, title=f"{sched}: causal B={b} H={h} S={s} D=128 bf16")
        lines.append(tl.format_trace_stats(st, title=sched))
    print("\n".join(lines))


if __name__ == "__main__":
    main()
