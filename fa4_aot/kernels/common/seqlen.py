"""Per-batch-entry sequence lengths and offsets (fixed-length, varlen, seqused)."""

from __future__ import annotations

from typing import NamedTuple

import cutlass
import cutlass.cute as cute
from cutlass import Int32

# Bits of the launch value ``seq_mode`` (fa4_aot/abi.py).
SEQ_VARLEN, SEQ_USED_Q, SEQ_USED_K = 1, 2, 4


class SeqlenInfo(NamedTuple):
    """Where one batch entry's rows are: ``q_start``/``k_start`` (first row in the packed
    tensors; 0 without varlen), ``sq``/``sk`` (its lengths) and ``tma_batch`` (the batch
    coordinate of the TMA loads: the batch index, or 0 for packed documents)."""

    q_start: Int32
    k_start: Int32
    sq: Int32
    sk: Int32
    tma_batch: Int32


@cute.jit
def seqlen_info(batch, shape, ptrs=None, totals=None):
    """:class:`SeqlenInfo` of batch entry ``batch``. ``shape``: anything with ``seqlen_q``,
    ``seqlen_k`` (and, with ``ptrs``, ``seq_mode``); ``ptrs``: anything with ``cu_seqlens_q/k``
    and ``seqused_q/k`` (``None``: a kernel without varlen, lengths are the launch's);
    ``totals``: (total_q, total_k), the packed lengths. Offsets from cu_seqlens are clamped
    into [0, packed length] and lengths to >= 0, whatever the offsets say; seqused_q/k only
    shorten."""
    q_start, k_start, sq, sk, tma_b = Int32(0), Int32(0), shape.seqlen_q, shape.seqlen_k, batch
    if cutlass.const_expr(ptrs is not None):
        if shape.seq_mode & SEQ_VARLEN != 0:
            cq = cute.make_tensor(ptrs.cu_seqlens_q + batch, cute.make_layout(2))
            ck = cute.make_tensor(ptrs.cu_seqlens_k + batch, cute.make_layout(2))
            q_start = cutlass.min(cutlass.max(cq[0], Int32(0)), totals[0])
            k_start = cutlass.min(cutlass.max(ck[0], Int32(0)), totals[1])
            sq = cutlass.min(cutlass.max(cq[1], q_start), totals[0]) - q_start
            sk = cutlass.min(cutlass.max(ck[1], k_start), totals[1]) - k_start
            tma_b = Int32(0)
        if shape.seq_mode & SEQ_USED_Q != 0:
            sq = cutlass.min(sq, cutlass.max(cute.make_tensor(
                ptrs.seqused_q + batch, cute.make_layout(1))[0], Int32(0)))
        if shape.seq_mode & SEQ_USED_K != 0:
            sk = cutlass.min(sk, cutlass.max(cute.make_tensor(
                ptrs.seqused_k + batch, cute.make_layout(1))[0], Int32(0)))
    return SeqlenInfo(q_start, k_start, sq, sk, tma_b)
