"""``torch.ops.fa4_aot.fwd``: the forward as a torch.library custom op with a fake (meta)
implementation, so ``torch.compile(fullgraph=True)`` traces models that call
:func:`fa4_aot.attention` and CUDA graphs capture it like any other op."""

from __future__ import annotations

from typing import Optional

import torch

from .interface import forward


@torch.library.custom_op("fa4_aot::fwd", mutates_args=(), device_types="cuda")
def fwd(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
        cu_seqlens_q: Optional[torch.Tensor], cu_seqlens_k: Optional[torch.Tensor],
        max_seqlen_q: int, max_seqlen_k: int, causal: bool, softmax_scale: Optional[float],
        window_left: int, window_right: int, scheduler: str,
        softcap: float) -> tuple[torch.Tensor, torch.Tensor]:
    return forward(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, causal,
                   softmax_scale, window_left, window_right, scheduler, softcap)


@fwd.register_fake
def _(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, causal, softmax_scale,
      window_left, window_right, scheduler, softcap):
    out = torch.empty_like(q, memory_format=torch.contiguous_format)
    if cu_seqlens_q is not None:
        lse = q.new_empty((q.shape[1], q.shape[0]), dtype=torch.float32)
    else:
        lse = q.new_empty((q.shape[0], q.shape[2], q.shape[1]), dtype=torch.float32)
    return out, lse
