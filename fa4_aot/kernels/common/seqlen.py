"""Per-batch-entry sequence lengths and offsets (fixed-length or varlen)."""

from __future__ import annotations

from typing import NamedTuple

import cutlass
import cutlass.cute as cute
from cutlass import Int32


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
def seqlen_info(batch, seqlen_q, seqlen_k, varlen=None, cu_q_ptr=None, cu_k_ptr=None):
    """:class:`SeqlenInfo` of batch entry ``batch``. ``varlen`` (runtime Int32, nonzero = packed
    documents described by the int32 offsets ``cu_q_ptr``/``cu_k_ptr``) may be ``None`` for
    kernels without varlen support."""
    q_start, k_start, sq, sk, tma_b = Int32(0), Int32(0), seqlen_q, seqlen_k, batch
    if cutlass.const_expr(varlen is not None):
        if varlen != 0:
            cq = cute.make_tensor(cu_q_ptr + batch, cute.make_layout(2))
            ck = cute.make_tensor(cu_k_ptr + batch, cute.make_layout(2))
            q_start, k_start = cq[0], ck[0]
            sq, sk = cq[1] - q_start, ck[1] - k_start
            tma_b = Int32(0)
    return SeqlenInfo(q_start, k_start, sq, sk, tma_b)

