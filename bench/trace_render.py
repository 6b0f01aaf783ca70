"""Render a schedule trace: per-SM timeline PNG + summary statistics.

    python bench/trace_render.py TRACE.npy|TRACE.pt [--meta META.json] [--out PNG]
                                 [--color-by auto|m_block|cta|head|batch|order] [--num-sms N]
                                 [--json STATS.json]
    python bench/trace_render.py --synthetic [--scheduler single|static|steal|all]
                                 [--shape B,H,S,D] [--no-causal] [--num-sms 132] [--out PNG]

A trace is the buffer the trace kernel variant fills: int64 (num_tiles, 4) with
(smid, cta_index, t_start_ns, t_end_ns) per output tile, from %globaltimer, indexed by tile id;
tiles never run stay all zero. Save it with numpy.save(path, buf.cpu().numpy()) or
torch.save(buf, path); only the array is needed.

Metadata (optional JSON; every key optional): num_m_blocks, heads, batch (counts: needed to colour
by m_block / head / batch through fa4_aot.schedule.decode_tile), section (the decode's section;
recomputed from seqlen_k + head_dim when absent, else taken as heads*batch), scheduler (title),
num_sms (SMs that got no tile count as idle), label (title); or explicit per-tile lists m_block,
head, batch_index (e.g. a varlen decode).

Timeline: y = SM id (concurrent CTAs on one SM are drawn in sub-rows), x = us since the first
tile start, one bar per tile; the red dashed line marks the moment the first SM ran out of work.
Printed last: tiles run, CTAs, SMs used, makespan, per-SM busy fraction (union of the SM's tile
intervals / makespan), idle SM-time, idle tail (first SM idle -> end), tile durations.
--synthetic fabricates a trace (list scheduling of the kernels' tile order under a simple cost
model) so that the renderer can be tried without a GPU; with --scheduler all it renders one PNG
per scheduler and prints a comparison table.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import tracelib as tl  # noqa: E402


def load_trace(path):
    """numpy array (num_tiles, 4) from a .npy / .npz / .pt file."""
    import numpy as np
    path = Path(path)
    if path.suffix == ".pt":
        import torch
        obj = torch.load(path, map_location="cpu", weights_only=True)
        if isinstance(obj, dict):  # {'trace': tensor, ...}
            obj = obj.get("trace", next(iter(obj.values())))
        arr = obj.cpu().numpy() if hasattr(obj, "cpu") else np.asarray(obj)
    elif path.suffix == ".npz":
        z = np.load(path)
        arr = z["trace"] if "trace" in z.files else z[z.files[0]]
    else:
        arr = np.load(path)
    return tl.trace_array(arr)


def compare_table(results) -> str:
    """results: list of (name, stats)."""
    hdr = (f"{'scheduler':<10} {'makespan us':>11} {'busy mean':>9} {'busy min':>8} "
           f"{'idle tail us':>12} {'tail %':>6} {'CTAs':>5} {'tiles':>6}")
    lines = [hdr, "-" * len(hdr)]
    for name, st in results:
        if not st.get("tiles_run"):
            lines.append(f"{name:<10} (no tile ran)")
            continue
        lines.append(f"{name:<10} {st['makespan_us']:>11.1f} {st['busy_mean']:>9.3f} "
                     f"{st['busy_min']:>8.3f} {st['tail_us']:>12.1f} "
                     f"{100 * st['tail_frac']:>6.1f} {st['ctas']:>5} "
                     f"{st['tiles_run']:>6}")
    return "\n".join(lines)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("trace", nargs="?", help=".npy / .npz / .pt file with the (num_tiles, 4) buffer")
    ap.add_argument("--meta", help="metadata JSON (see above)")
    ap.add_argument("--out", help="PNG path (default: next to the trace, or trace_<sched>.png)")
    ap.add_argument("--color-by", default="auto",
                    choices=["auto", "m_block", "cta", "head", "batch", "order"])
    ap.add_argument("--num-sms", type=int)
    ap.add_argument("--json", help="write the statistics as JSON")
    ap.add_argument("--synthetic", action="store_true", help="fabricate a trace (no GPU)")
    ap.add_argument("--scheduler", default="steal", choices=["single", "static", "steal", "all"])
    ap.add_argument("--shape", default="2,16,4096,128", help="synthetic B,H,S,D")
    ap.add_argument("--no-causal", dest="causal", action="store_false")
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args(argv)

    if a.synthetic:
        b, h, s, d = (int(x) for x in a.shape.split(","))
        scheds = ["single", "static", "steal"] if a.scheduler == "all" else [a.scheduler]
        results, stats_out = [], {}
        for sched in scheds:
            tr, meta = tl.synthetic_trace(sched, num_sms=a.num_sms or 132,
                                          num_m_blocks=-(-s // 128), heads=h, batch=b,
                                          causal=a.causal, seqlen=s, head_dim=d, seed=a.seed)
            if a.out and len(scheds) == 1:
                out = a.out
            elif a.out:
                p = Path(a.out)
                out = str(p.with_name(f"{p.stem}_{sched}{p.suffix or '.png'}"))
            else:
                out = f"trace_synthetic_{sched}.png"
            st = tl.trace_stats(tr, meta["num_sms"])
            tl.plot_trace(tr, out, meta, color_by=a.color_by, stats=st,
                          title=f"SYNTHETIC schedule trace — scheduler: {sched} — {meta['label']}")
            print(f"wrote {out}")
            results.append((sched, st))
            stats_out[sched] = st
        if a.json:
            Path(a.json).write_text(json.dumps(stats_out, indent=1))
            print(f"wrote {a.json}")
        print()
        if len(results) == 1:
            print(tl.format_trace_stats(results[0][1], f"synthetic trace, scheduler "
                                                       f"{results[0][0]}"))
        else:
            print(compare_table(results))
        return 0

    if not a.trace:
        ap.error("give a trace file, or --synthetic")
    arr = load_trace(a.trace)
    meta = json.loads(Path(a.meta).read_text()) if a.meta else {}
    if a.num_sms:
        meta["num_sms"] = a.num_sms
    if "num_m_blocks" in meta and "section" not in meta and "m_block" not in meta \
            and not ("seqlen_k" in meta and "head_dim" in meta):
        print("note: metadata has no section (nor seqlen_k + head_dim): decoding tiles with "
              "one section of heads*batch")
    out = a.out or str(Path(a.trace).with_suffix(".png"))
    st = tl.trace_stats(arr, meta.get("num_sms"))
    tl.plot_trace(arr, out, meta, color_by=a.color_by, stats=st)
    print(f"wrote {out}")
    if a.json:
        Path(a.json).write_text(json.dumps(st, indent=1))
        print(f"wrote {a.json}")
    print()
    print(tl.format_trace_stats(st, f"trace {a.trace} (scheduler {meta.get('scheduler', '?')})"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
