"""Per-batch-entry sequence lengths and offsets (fixed-length, varlen, seqused, paged KV)."""

from __future__ import annotations

from typing import NamedTuple

import cutlass
import cutlass.cute as cute
from cutlass import Int32

from fa4_aot.abi import SeqMode

# Bits of the launch value ``seq_mode``: fa4_aot.abi.SeqMode, as plain ints (the kernels test
# them against a DSL Int32).
SEQ_VARLEN = int(SeqMode.VARLEN)
SEQ_USED_Q = int(SeqMode.USED_Q)
SEQ_USED_K = int(SeqMode.USED_K)
SEQ_VARLEN_K = int(SeqMode.VARLEN_K)
SEQ_COMPACT = int(SeqMode.COMPACT)


class SeqlenInfo(NamedTuple):
    """Where one batch entry's rows are: ``q_start``/``k_start`` (first row in the packed
    tensors; 0 without varlen), ``sq``/``sk`` (its lengths) and ``q_b``/``k_b`` (the batch
    coordinate of q and of k/v: the batch index, or 0 for packed documents)."""

    q_start: Int32
    k_start: Int32
    sq: Int32
    sk: Int32
    q_b: Int32
    k_b: Int32


@cute.jit
def clamped_doc(cu_ptr, batch, total):
    """(start, length) of document ``batch``: cu_seqlens[batch], cu_seqlens[batch + 1] clamped
    into [0, total], the length never negative."""
    cu = cute.make_tensor(cu_ptr + batch, cute.make_layout(2))
    start = cutlass.min(cutlass.max(cu[0], Int32(0)), total)
    return start, cutlass.min(cutlass.max(cu[1], start), total) - start


@cute.jit
def seqlen_info(batch, shape, ptrs=None, totals=None, separate_kv: cutlass.Constexpr = False):
    """:class:`SeqlenInfo` of batch entry ``batch``. ``shape``: anything with ``seqlen_q``,
    ``seqlen_k`` (and, with ``ptrs``, ``seq_mode``); ``ptrs``: anything with ``cu_seqlens_q/k``
    and ``seqused_q/k`` (``None``: a kernel without varlen, lengths are the launch's);
    ``totals``: (total_q, total_k), the packed lengths. Offsets from cu_seqlens are clamped
    into [0, packed length] and lengths to >= 0, whatever the offsets say; seqused_q/k only
    shorten. ``separate_kv`` (compile time): packed q (SeqMode.VARLEN) and packed k/v
    (SeqMode.VARLEN_K) are separate modes (decode kernels: paged KV with packed queries); else
    SeqMode.VARLEN means both (the runtime sets both bits), which keeps fewer values live."""
    q_start, k_start, sq, sk = Int32(0), Int32(0), shape.seqlen_q, shape.seqlen_k
    q_b, k_b = batch, batch
    if cutlass.const_expr(ptrs is not None):
        if cutlass.const_expr(separate_kv):
            if shape.seq_mode & SEQ_VARLEN != 0:
                q_start, sq = clamped_doc(ptrs.cu_seqlens_q, batch, totals[0])
                q_b = Int32(0)
            if shape.seq_mode & SEQ_VARLEN_K != 0:
                k_start, sk = clamped_doc(ptrs.cu_seqlens_k, batch, totals[1])
                k_b = Int32(0)
        else:
            if shape.seq_mode & SEQ_VARLEN != 0:
                q_start, sq = clamped_doc(ptrs.cu_seqlens_q, batch, totals[0])
                k_start, sk = clamped_doc(ptrs.cu_seqlens_k, batch, totals[1])
                q_b, k_b = Int32(0), Int32(0)
        if shape.seq_mode & SEQ_USED_Q != 0:
            sq = cutlass.min(sq, cutlass.max(cute.make_tensor(
                ptrs.seqused_q + batch, cute.make_layout(1))[0], Int32(0)))
        if shape.seq_mode & SEQ_USED_K != 0:
            sk = cutlass.min(sk, cutlass.max(cute.make_tensor(
                ptrs.seqused_k + batch, cute.make_layout(1))[0], Int32(0)))
    return SeqlenInfo(q_start, k_start, sq, sk, q_b, k_b)
