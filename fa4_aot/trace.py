"""Schedule traces: run the trace variant of the sm_90a kernel and get, per output tile,
(SM id, CTA index, start ns, end ns) read from %globaltimer. ``bench/trace_render.py`` draws
them as a per-SM timeline.

The trace kernels are their own configurations (bf16, head_dim 128, causal, one per
scheduler) on the 128-key tile; the fast path never records anything. A causal call whose rows
see ``plan.LONG_KV_KEYS`` keys or more runs untraced on the 160-key tile, so there the
traced output may differ from the untraced one in the last bits.
"""

from __future__ import annotations

from .interface import attention, select_kernel
from .schedule import choose_section


def capture(q, k, v, scheduler: str = "steal", causal: bool = True):
    """Run one traced forward. Returns (out, trace (num_tiles, 4) int64 on the CPU, meta)."""
    import torch
    b, sq, h, d = q.shape
    _, rec = select_kernel(q.device, q.dtype, d, causal, scheduler, trace=True)
    tile_m = rec["launch"]["tile"]["m"]
    num_m = -(-sq // tile_m)
    buf = torch.zeros((num_m * h * b, 4), dtype=torch.int64, device=q.device)
    out = attention(q, k, v, causal=causal, scheduler=scheduler, out=torch.empty_like(q),
                    _trace=buf)
    torch.cuda.synchronize(q.device)
    meta = {"scheduler": scheduler, "causal": causal, "num_m_blocks": num_m, "heads": h,
            "batch": b, "seqlen": sq, "head_dim": d, "tile_m": tile_m,
            "num_sms": torch.cuda.get_device_properties(q.device).multi_processor_count,
            "section": choose_section(h, b, k.shape[1], d, q.element_size(), h // k.shape[2])}
    return out, buf.cpu(), meta

