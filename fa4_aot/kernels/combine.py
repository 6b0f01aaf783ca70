"""Split-KV combine for sm_90a: merges the fp32 partial results of the decode kernels.

With ``num_splits = S`` the forward writes, for every (row, head) pair ``n`` and split ``s``,
the normalised partial output ``O_s[n, :]`` (fp32, ``oacc[s, n, :]``) and its log-sum-exp
``L_s[n]`` (``lseacc[s, n]``). This kernel computes, exactly as one unsplit pass would up to
fp32 rounding::

    L = log(sum_s exp(L_s))          O = sum_s exp(L_s - L) * O_s

and writes O in the output dtype and L, with the output's strides. A split that saw no key has
``L_s = -inf`` (weight 0); a row with no key at all gets O = 0 and L = -inf.

One warp per (row, head) pair, four per CTA: lanes first reduce the split LSEs, then each lane
accumulates ``head_dim / 32`` elements (element ``lane + 32 e``: every load instruction of the
warp reads 128 contiguous bytes). ``n = row * num_heads + head``; ``row`` is
``batch * seqlen_q + query row`` (dense) or the packed row (varlen: seqlen_q = total_q and the
batch strides are 0). Parameters: ``fa4_aot/abi.py`` ``COMBINE_SM90``.
"""

from __future__ import annotations

import math

import cutlass
import cutlass.cute as cute
from cutlass import Float32, Int64

from fa4_aot.abi import COMBINE_SM90
from fa4_aot.configs import KernelConfig

_DTYPES = {"bf16": cutlass.BFloat16, "fp16": cutlass.Float16}
GROUPS = COMBINE_SM90.group_types()
Ptrs, Strides, Shape = (GROUPS[n] for n in ("Ptrs", "Strides", "Shape"))
LOG2_E = math.log2(math.e)


class FlashCombineSm90:
    def __init__(self, cfg: KernelConfig):
        assert cfg.kind == "combine"
        self.dtype = _DTYPES[cfg.dtype]
        self.hd = cfg.head_dim
        self.threads = cfg.threads
        self.warps = self.threads // 32

    @cute.jit
    def __call__(self, ptrs: Ptrs, strides: Strides, shape: Shape, stream):
        self.kernel(ptrs, strides, shape).launch(
            grid=[1, 1, 1], block=[self.threads, 1, 1], stream=stream)  # the runtime sets the grid

    @cute.kernel
    def kernel(self, ptrs: Ptrs, strides: Strides, shape: Shape):
        tidx, _, _ = cute.arch.thread_idx()
        bidx, _, _ = cute.arch.block_idx()
        lane = tidx % 32
        pairs = shape.acc_rows * shape.num_heads
        n = bidx * self.warps + tidx // 32
        if n < pairs:
            ns = shape.num_splits
            lse_acc = cute.make_tensor(ptrs.lseacc_ptr, cute.make_layout(ns * pairs))
            m = -Float32.inf
            for s in cutlass.range(lane, ns, 32, unroll=1):
                m = cute.arch.fmax(m, lse_acc[s * pairs + n])
            for off in (16, 8, 4, 2, 1):
                m = cute.arch.fmax(m, cute.arch.shuffle_sync_bfly(m, offset=off))
            m_safe = m
            if m == -Float32.inf:
                m_safe = Float32(0.0)
            total = Float32(0.0)
            for s in cutlass.range(lane, ns, 32, unroll=1):
                total = total + cute.math.exp2((lse_acc[s * pairs + n] - m_safe) * LOG2_E,
                                               fastmath=True)
            for off in (16, 8, 4, 2, 1):
                total = total + cute.arch.shuffle_sync_bfly(total, offset=off)
            lse = -Float32.inf
            if total > 0.0:
                lse = m_safe + cute.math.log(total, fastmath=True)

            per_lane = (self.hd + 31) // 32
            acc = cute.make_rmem_tensor(cute.make_layout(per_lane), Float32)
            acc.fill(0.0)
            if total > 0.0:
                for s in cutlass.range(ns, unroll=1):
                    w = cute.math.exp2((lse_acc[s * pairs + n] - lse) * LOG2_E, fastmath=True)
                    src = cute.make_tensor(
                        ptrs.oacc_ptr + (Int64(s) * pairs + Int64(n)) * self.hd + Int64(lane),
                        cute.make_layout(per_lane, stride=32))
                    for e in cutlass.range_constexpr(per_lane):
                        if cutlass.const_expr(lane_bound(self.hd, e)):
                            acc[e] = acc[e] + w * src[e]
                        elif lane + 32 * e < self.hd:
                            acc[e] = acc[e] + w * src[e]

            row = n // shape.num_heads
            head = n - row * shape.num_heads
            batch = row // shape.seqlen_q
            s_row = row - batch * shape.seqlen_q
            o_off = (Int64(batch) * strides.o_stride_b + Int64(s_row) * strides.o_stride_s
                     + Int64(head) * strides.o_stride_h + Int64(lane))
            dst = cute.make_tensor(ptrs.o_ptr + o_off, cute.make_layout(per_lane, stride=32))
            for e in cutlass.range_constexpr(per_lane):
                if cutlass.const_expr(lane_bound(self.hd, e)):
                    dst[e] = acc[e].to(self.dtype)
                elif lane + 32 * e < self.hd:
                    dst[e] = acc[e].to(self.dtype)
            if lane == 0:
                lse_off = (Int64(batch) * strides.lse_stride_b + Int64(head) * strides.lse_stride_h
                           + Int64(s_row))
                cute.make_tensor(ptrs.lse_ptr + lse_off, cute.make_layout(1))[0] = lse


def lane_bound(hd: int, e: int) -> bool:
    """Whether element ``lane + 32 e`` is inside the row for every lane (compile time)."""
    return 32 * (e + 1) <= hd
