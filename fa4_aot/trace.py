"""Schedule traces: run the trace variant of the sm_90a kernel and get, per output tile,
(SM id, CTA index, start ns, end ns) read from %globaltimer. ``bench/trace_render.py`` draws
them as a per-SM timeline.

The trace kernels are their own configurations (bf16, head_dim 128, causal, one per
scheduler) on the 128-key tile; the fast path never records anything. A causal call whose rows
see ``plan.LONG_KV_KEYS`` keys or more runs untraced on the 160-key tile, so there the
traced output may differ from the untraced one in the last bits. The grid, tile and section
come from the planner (:func:`fa4_aot.interface.plan_call`): what the traced launch runs.
"""

from __future__ import annotations

from . import interface
from .validate import Args


def capture(q, k, v, scheduler: str = "steal", causal: bool = True):
    """Run one traced forward. Returns (out, trace (num_tiles, 4) int64 on the CPU, meta)."""
    import torch
    b, sq, h, d = q.shape
    a = Args(q=q, k=k, v=v, causal=causal, scheduler=scheduler, out=torch.empty_like(q),
             trace=torch.empty((0, 4), dtype=torch.int64, device=q.device))
    (launch,) = interface.plan_call(a).launches
    values = launch.values
    buf = torch.zeros((values["num_tiles"], 4), dtype=torch.int64, device=q.device)
    out = interface.attention(q, k, v, causal=causal, scheduler=scheduler, out=a.out, _trace=buf)
    torch.cuda.synchronize(q.device)
    meta = {"scheduler": scheduler, "causal": causal, "num_m_blocks": values["num_m_blocks"],
            "heads": h, "batch": b, "seqlen": sq, "head_dim": d,
            "tile_m": launch.record["launch"]["tile"]["m"], "num_sms": interface.num_sms(q.device),
            "section": values["section"]}
    return out, buf.cpu(), meta

