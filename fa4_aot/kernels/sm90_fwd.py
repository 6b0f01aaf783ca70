"""FlashAttention forward for sm_90a (Hopper), written in CuTe DSL for ahead-of-time builds.

CTA = 3 warpgroups (384 threads):

* warpgroup 0, the producer (24 registers after ``setmaxnreg``): warp 0 fetches tile indices
  (see ``tile_sched.py``) and issues the TMA loads of Q (once per tile) and of K and V
  (one n-block at a time, ``kv_stages`` deep, each on its own ``PipelineTmaAsync``);
* warpgroups 1 and 2, the consumers (240 registers): each owns 64 rows of the 128-row m-tile.
  S = Q K^T with wgmma (both operands in shared memory), online softmax in registers,
  P converted to 16-bit in registers and O += P V with wgmma (A from registers).

Key blocks are visited from the last to the first, so the blocks that need the causal or
the sequence-end mask come first and the rest run unmasked.

Masks (compile time): full, causal (bottom-right aligned), local (sliding window
``[row + sk - sq - window_left, row + sk - sq + window_right]``). Variable-length batches are a
runtime mode (``varlen`` = 1): q/k/v are packed (total, d, heads, 1) and each tile reads its
document's offsets from ``cu_seqlens_q/k``; tiles past a document's end do nothing.

Kernel parameters (the launch ABI; ``fa4_aot/abi.py`` describes the same list for the runtime):
TMA descriptors + coordinate shapes for Q, K, V; raw pointers for O, LSE, the scheduler counter
and the trace buffer; O strides; then scalars. Nothing about the device (SM count) is baked in.
"""

from __future__ import annotations


import cutlass
import cutlass.cute as cute
import cutlass.pipeline as pipeline
import cutlass.utils.hopper_helpers as sm90_utils
from cutlass import Float32, Int32, Int64, Uint32
from cutlass._mlir.dialects import llvm
from cutlass.cutlass_dsl import T, dsl_user_op
from cutlass.cute.nvgpu import cpasync, warpgroup
from cutlass.utils import LayoutEnum

from fa4_aot.configs import KernelConfig
from fa4_aot.schedule import decode_tile

from .tile_sched import TILE_SLOTS, first_tile, next_tile

_DTYPES = {"bf16": cutlass.BFloat16, "fp16": cutlass.Float16}


def _acc_mn_view(t: cute.Tensor) -> cute.Tensor:
    """View a wgmma accumulator fragment ((2,2,V),M,N) as (rows, cols) of this thread."""
    s, d = t.layout.shape, t.layout.stride
    layout = cute.make_layout(
        ((s[0][1], s[1]), (s[0][0], s[0][2], s[2])),
        stride=((d[0][1], d[1]), (d[0][0], d[0][2], d[2])),
    )
    return cute.make_tensor(t.iterator, layout)


def _acc_as_a_layout(acc_layout: cute.Layout) -> cute.Layout:
    """Register layout of a 16-bit wgmma A fragment covering the same values as a fp32
    accumulator fragment ((2,2,V),1,1): k16 blocks of (2,2,2) values, V/2 of them."""
    v = acc_layout.shape[0][2]
    return cute.make_layout(((2, 2, 2), 1, v // 2), stride=((1, 2, 4), 0, 8))


@dsl_user_op
def _cvt_pair_pinned(lo: Float32, hi: Float32, ptx_type: str, *, loc=None, ip=None) -> Uint32:
    """(lo, hi) fp32 -> one 32-bit word of two 16-bit values, as a side-effecting asm statement.

    Why not ``.to()``: LLVM sinks a plain conversion down to its use, the O += P V wgmma of the
    next loop iteration, so the 64 fp32 values of P stay live across the back edge next to the
    new S; at head_dim 128 ptxas then runs out of registers and serialises every wgmma (C7512).
    A side-effecting statement stays where it is written (after the wait for the previous PV)."""
    return Uint32(llvm.inline_asm(
        T.i32(),
        [Float32(hi).ir_value(loc=loc, ip=ip), Float32(lo).ir_value(loc=loc, ip=ip)],
        f"cvt.rn.{ptx_type}x2.f32 $0, $1, $2;",
        "=r,f,f",
        has_side_effects=True,
        is_align_stack=False,
        asm_dialect=llvm.AsmDialect.AD_ATT,
    ))


@dsl_user_op
def _tanh_approx(x: Float32, *, loc=None, ip=None) -> Float32:
    """tanh.approx.f32: one MUFU.TANH (the softcap kernels' only extra cost per score)."""
    return Float32(llvm.inline_asm(
        T.f32(), [Float32(x).ir_value(loc=loc, ip=ip)], "tanh.approx.f32 $0, $1;", "=f,f",
        has_side_effects=False, is_align_stack=False, asm_dialect=llvm.AsmDialect.AD_ATT))


def _tree(op, vals):
    """Pairwise reduction (depth log2(n) instead of a chain of n dependent ops)."""
    vals = list(vals)
    while len(vals) > 1:
        nxt = [op(vals[i], vals[i + 1]) for i in range(0, len(vals) - 1, 2)]
        if len(vals) % 2:
            nxt.append(vals[-1])
        vals = nxt
    return vals[0]


def _frag_row(tidx, r):
    """Row (inside the 128-row tile) of row ``r`` (0 or 1) of a wgmma m64 accumulator held by
    consumer thread ``tidx`` (0..255): warpgroup * 64 + warp * 16 + lane / 4 + 8 * r."""
    return (tidx // 128) * 64 + ((tidx % 128) // 32) * 16 + (tidx % 32) // 4 + 8 * r


def _frag_col_static(c: int) -> int:
    """Static part of the column of value ``c`` in an accumulator row (the thread adds
    2 * (lane % 4)): values come in pairs of adjacent columns, pairs 8 columns apart."""
    return (c // 2) * 8 + c % 2


class FlashFwdSm90:
    def __init__(self, cfg: KernelConfig):
        self.cfg = cfg
        self.dtype = _DTYPES[cfg.dtype]
        self.hd = cfg.head_dim
        self.tile_m = cfg.tile.m
        self.tile_n = cfg.tile.n
        self.kv_stages = cfg.tile.kv_stages
        self.causal = cfg.causal
        self.local = cfg.local
        self.sched = cfg.scheduler
        self.trace = cfg.trace
        self.softcap = cfg.softcap
        self.threads = cfg.threads
        self.num_mma_wg = 2
        assert self.tile_m == 64 * self.num_mma_wg
        self.producer_regs = 24
        self.mma_regs = 240
        # Mainloop schedule from the configuration's tile (experiment variants override it).
        self.intra_wg_overlap = cfg.tile.overlap
        self.pingpong = cfg.tile.pingpong
        self.variant_flags = set(filter(None, cfg.variant.split("-")))

    # ------------------------------------------------------------------ host side (trace only)
    @cute.jit
    def __call__(
        self,
        mQ: cute.Tensor,  # (seqlen_q, d, heads, batch)
        mK: cute.Tensor,  # (seqlen_k, d, kv_heads, batch)
        mV: cute.Tensor,  # (seqlen_k, d, kv_heads, batch)
        o_ptr: cute.Pointer,
        lse_ptr: cute.Pointer,
        sched_ptr: cute.Pointer,
        trace_ptr: cute.Pointer,
        cu_q_ptr: cute.Pointer,
        cu_k_ptr: cute.Pointer,
        o_stride_s: Int64,
        o_stride_h: Int64,
        o_stride_b: Int64,
        lse_stride_h: Int64,
        lse_stride_b: Int64,
        seqlen_q: Int32,
        seqlen_k: Int32,
        num_heads: Int32,
        qhead_per_kvhead: Int32,
        num_m_blocks: Int32,
        section: Int32,
        num_tiles: Int32,
        varlen: Int32,
        window_left: Int32,
        window_right: Int32,
        softmax_scale_log2: Float32,
        softmax_scale: Float32,
        softcap_pre: Float32,
        grid_x: Int32,
        stream,
    ):
        dt = self.dtype
        qk_tiler = (self.tile_m, self.tile_n, self.hd)
        pv_tiler = (self.tile_m, self.hd, self.tile_n)
        tiled_mma_qk = sm90_utils.make_trivial_tiled_mma(
            dt, dt, warpgroup.OperandMajorMode.K, warpgroup.OperandMajorMode.K, Float32,
            (self.num_mma_wg, 1, 1), (64, self.tile_n),
        )
        tiled_mma_pv = sm90_utils.make_trivial_tiled_mma(
            dt, dt, warpgroup.OperandMajorMode.K, warpgroup.OperandMajorMode.MN, Float32,
            (self.num_mma_wg, 1, 1), (64, self.hd), warpgroup.OperandSource.RMEM,
        )
        sQ_layout = sm90_utils.make_smem_layout_a(LayoutEnum.ROW_MAJOR, qk_tiler, dt, 1)
        sK_layout = sm90_utils.make_smem_layout_b(LayoutEnum.ROW_MAJOR, qk_tiler, dt, self.kv_stages)
        sV_layout = sm90_utils.make_smem_layout_b(LayoutEnum.COL_MAJOR, pv_tiler, dt, self.kv_stages)

        # V seen as (d, seqlen_k, kv_heads, batch): the MN-major B operand of O += P V.
        mVt = cute.make_tensor(
            mV.iterator,
            cute.make_layout(
                (mV.shape[1], mV.shape[0], mV.shape[2], mV.shape[3]),
                stride=(mV.stride[1], mV.stride[0], mV.stride[2], mV.stride[3]),
            ),
        )
        g2s = cpasync.CopyBulkTensorTileG2SOp()
        tma_q, tQ = cpasync.make_tiled_tma_atom(
            g2s, mQ, cute.slice_(sQ_layout, (None, None, 0)), (self.tile_m, self.hd))
        tma_k, tK = cpasync.make_tiled_tma_atom(
            g2s, mK, cute.slice_(sK_layout, (None, None, 0)), (self.tile_n, self.hd))
        tma_v, tV = cpasync.make_tiled_tma_atom(
            g2s, mVt, cute.slice_(sV_layout, (None, None, 0)), (self.hd, self.tile_n))
        self.q_bytes = cute.size_in_bytes(dt, cute.slice_(sQ_layout, (None, None, 0)))
        self.kv_bytes = cute.size_in_bytes(dt, cute.slice_(sK_layout, (None, None, 0)))

        @cute.struct
        class SharedStorage:
            mbar_q: cute.struct.MemRange[cutlass.Int64, 2]
            mbar_k: cute.struct.MemRange[cutlass.Int64, 2 * self.kv_stages]
            mbar_v: cute.struct.MemRange[cutlass.Int64, 2 * self.kv_stages]
            mbar_tile: cute.struct.MemRange[cutlass.Int64, 2 * TILE_SLOTS]
            tile_slot: cute.struct.MemRange[Int32, TILE_SLOTS]
            sQ: cute.struct.Align[cute.struct.MemRange[dt, cute.cosize(sQ_layout)], 1024]
            sK: cute.struct.Align[cute.struct.MemRange[dt, cute.cosize(sK_layout)], 1024]
            sV: cute.struct.Align[cute.struct.MemRange[dt, cute.cosize(sV_layout)], 1024]

        self.shared_storage = SharedStorage

        self.kernel(
            tma_q, tQ, tma_k, tK, tma_v, tV,
            o_ptr, lse_ptr, sched_ptr, trace_ptr, cu_q_ptr, cu_k_ptr,
            o_stride_s, o_stride_h, o_stride_b, lse_stride_h, lse_stride_b,
            seqlen_q, seqlen_k, num_heads, qhead_per_kvhead,
            num_m_blocks, section, num_tiles, varlen, window_left, window_right,
            softmax_scale_log2, softmax_scale, softcap_pre,
            tiled_mma_qk, tiled_mma_pv, sQ_layout, sK_layout, sV_layout,
        ).launch(
            grid=[grid_x, 1, 1],
            block=[self.threads, 1, 1],
            stream=stream,
            min_blocks_per_mp=1,
        )

    # ------------------------------------------------------------------ device side
    @cute.kernel
    def kernel(
        self,
        tma_q: cute.CopyAtom,
        tQ: cute.Tensor,
        tma_k: cute.CopyAtom,
        tK: cute.Tensor,
        tma_v: cute.CopyAtom,
        tV: cute.Tensor,
        o_ptr: cute.Pointer,
        lse_ptr: cute.Pointer,
        sched_ptr: cute.Pointer,
        trace_ptr: cute.Pointer,
        cu_q_ptr: cute.Pointer,
        cu_k_ptr: cute.Pointer,
        o_stride_s: Int64,
        o_stride_h: Int64,
        o_stride_b: Int64,
        lse_stride_h: Int64,
        lse_stride_b: Int64,
        seqlen_q: Int32,
        seqlen_k: Int32,
        num_heads: Int32,
        qhead_per_kvhead: Int32,
        num_m_blocks: Int32,
        section: Int32,
        num_tiles: Int32,
        varlen: Int32,
        window_left: Int32,
        window_right: Int32,
        softmax_scale_log2: Float32,
        softmax_scale: Float32,
        softcap_pre: Float32,
        tiled_mma_qk: cute.TiledMma,
        tiled_mma_pv: cute.TiledMma,
        sQ_layout: cute.ComposedLayout,
        sK_layout: cute.ComposedLayout,
        sV_layout: cute.ComposedLayout,
    ):
        tidx, _, _ = cute.arch.thread_idx()
        warp_idx = cute.arch.make_warp_uniform(cute.arch.warp_idx())
        wg_idx = warp_idx // 4

        smem = cutlass.utils.SmemAllocator()
        storage = smem.allocate(self.shared_storage)

        producer_one = pipeline.CooperativeGroup(pipeline.Agent.Thread, 1)
        consumer_warps = pipeline.CooperativeGroup(pipeline.Agent.Thread, 4 * self.num_mma_wg)
        pipe_q = pipeline.PipelineTmaAsync.create(
            barrier_storage=storage.mbar_q.data_ptr(), num_stages=1,
            producer_group=producer_one, consumer_group=consumer_warps,
            tx_count=self.q_bytes, defer_sync=True,
        )
        pipe_k = pipeline.PipelineTmaAsync.create(
            barrier_storage=storage.mbar_k.data_ptr(), num_stages=self.kv_stages,
            producer_group=producer_one, consumer_group=consumer_warps,
            tx_count=self.kv_bytes, defer_sync=True,
        )
        pipe_v = pipeline.PipelineTmaAsync.create(
            barrier_storage=storage.mbar_v.data_ptr(), num_stages=self.kv_stages,
            producer_group=producer_one, consumer_group=consumer_warps,
            tx_count=self.kv_bytes, defer_sync=True,
        )
        pipe_tile = pipeline.PipelineAsync.create(
            barrier_storage=storage.mbar_tile.data_ptr(), num_stages=TILE_SLOTS,
            producer_group=pipeline.CooperativeGroup(pipeline.Agent.Thread, 32),
            consumer_group=pipeline.CooperativeGroup(pipeline.Agent.Thread, 128 * self.num_mma_wg),
            defer_sync=True,
        )
        cute.arch.mbarrier_init_fence()
        cute.arch.sync_threads()

        sQ = storage.sQ.get_tensor(sQ_layout.outer, swizzle=sQ_layout.inner)
        sK = storage.sK.get_tensor(sK_layout.outer, swizzle=sK_layout.inner)
        sV = storage.sV.get_tensor(sV_layout.outer, swizzle=sV_layout.inner)
        slots = storage.tile_slot.get_tensor(cute.make_layout(TILE_SLOTS))

        if wg_idx == 0:
            cute.arch.setmaxregister_decrease(self.producer_regs)
            if warp_idx == 0:
                self.producer(
                    tma_q, tQ, tma_k, tK, tma_v, tV, sQ, sK, sV, slots,
                    pipe_q, pipe_k, pipe_v, pipe_tile, sched_ptr, cu_q_ptr, cu_k_ptr,
                    seqlen_q, seqlen_k, num_heads, qhead_per_kvhead,
                    num_m_blocks, section, num_tiles, varlen, window_left, window_right,
                )
        else:
            cute.arch.setmaxregister_increase(self.mma_regs)
            self.consumer(
                tidx - 128, tiled_mma_qk, tiled_mma_pv, sQ, sK, sV, slots,
                pipe_q, pipe_k, pipe_v, pipe_tile,
                o_ptr, lse_ptr, trace_ptr, cu_q_ptr, cu_k_ptr,
                o_stride_s, o_stride_h, o_stride_b, lse_stride_h, lse_stride_b,
                seqlen_q, seqlen_k, num_heads, num_m_blocks, section, num_tiles,
                varlen, window_left, window_right, softmax_scale_log2, softmax_scale, softcap_pre,
            )

    @cute.jit
    def seq_info(self, batch, seqlen_q, seqlen_k, varlen, cu_q_ptr, cu_k_ptr):
        """(q_start, k_start, seqlen_q, seqlen_k, tma_batch) of one batch entry."""
        q_start, k_start, sq, sk, tma_b = Int32(0), Int32(0), seqlen_q, seqlen_k, batch
        if varlen != 0:
            cq = cute.make_tensor(cu_q_ptr + batch, cute.make_layout(2))
            ck = cute.make_tensor(cu_k_ptr + batch, cute.make_layout(2))
            q_start, k_start = cq[0], ck[0]
            sq, sk = cq[1] - q_start, ck[1] - k_start
            tma_b = Int32(0)
        return q_start, k_start, sq, sk, tma_b

    @cute.jit
    def n_block_range(self, m_block, sq, sk, window_left, window_right):
        """[n_min, n_max): the key blocks an m-block sees (mask: full, causal or local)."""
        hi = sk
        lo = Int32(0)
        if cutlass.const_expr(self.causal):
            hi = cutlass.min(sk, (m_block + 1) * self.tile_m + sk - sq)
        if cutlass.const_expr(self.local):
            hi = cutlass.min(sk, (m_block + 1) * self.tile_m + sk - sq + window_right)
            lo = cutlass.max(Int32(0), m_block * self.tile_m + sk - sq - window_left)
        n_max = cutlass.max(Int32(0), (hi + self.tile_n - 1) // self.tile_n)
        n_min = cutlass.min(lo // self.tile_n, n_max)
        return n_min, n_max

    # ------------------------------------------------------------------ producer warp
    @cute.jit
    def producer(
        self, tma_q, tQ, tma_k, tK, tma_v, tV, sQ, sK, sV, slots,
        pipe_q, pipe_k, pipe_v, pipe_tile, sched_ptr, cu_q_ptr, cu_k_ptr,
        seqlen_q, seqlen_k, num_heads, qhead_per_kvhead, num_m_blocks, section, num_tiles,
        varlen, window_left, window_right,
    ):
        cpasync.prefetch_descriptor(tma_q)
        cpasync.prefetch_descriptor(tma_k)
        cpasync.prefetch_descriptor(tma_v)
        q_state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Producer, 1)
        kv_state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Producer, self.kv_stages)
        tile_state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Producer, TILE_SLOTS)
        lane = cute.arch.lane_idx()

        tile = first_tile()
        running = cutlass.Boolean(True)
        while running:
            if varlen != 0 and cutlass.const_expr("xnoskip" not in self.variant_flags):
                tile = self.skip_empty_tiles(tile, num_tiles, num_m_blocks, num_heads, section,
                                             cu_q_ptr, sched_ptr)
            # Hand the tile index to the consumers (an out-of-range index tells them to stop).
            pipe_tile.producer_acquire(tile_state)
            if lane == 0:
                slots[tile_state.index] = tile
            pipe_tile.producer_commit(tile_state)
            tile_state.advance()
            if tile >= num_tiles:
                running = False
            else:
                m_block, head, batch = decode_tile(tile, num_m_blocks, num_heads, section)
                kv_head = head // qhead_per_kvhead
                q_start, k_start, sq, sk, tma_b = self.seq_info(
                    batch, seqlen_q, seqlen_k, varlen, cu_q_ptr, cu_k_ptr)
                valid = m_block * self.tile_m < sq
                # varlen: shift the coordinate tensors to the document's first row.
                gQ = cute.local_tile(cute.domain_offset((q_start, 0), tQ[None, None, head, tma_b]),
                                     (self.tile_m, self.hd), (m_block, 0))
                tQs, tQg = cpasync.tma_partition(
                    tma_q, 0, cute.make_layout(1),
                    cute.group_modes(sQ, 0, 2), cute.group_modes(gQ, 0, 2))
                gK = cute.local_tile(cute.domain_offset((k_start, 0), tK[None, None, kv_head, tma_b]),
                                     (self.tile_n, self.hd), (None, 0))
                tKs, tKg = cpasync.tma_partition(
                    tma_k, 0, cute.make_layout(1),
                    cute.group_modes(sK, 0, 2), cute.group_modes(gK, 0, 2))
                gV = cute.local_tile(cute.domain_offset((0, k_start), tV[None, None, kv_head, tma_b]),
                                     (self.hd, self.tile_n), (0, None))
                tVs, tVg = cpasync.tma_partition(
                    tma_v, 0, cute.make_layout(1),
                    cute.group_modes(sV, 0, 2), cute.group_modes(gV, 0, 2))

                if valid:
                    pipe_q.producer_acquire(q_state)
                    cute.copy(tma_q, tQg, tQs[None, 0],
                              tma_bar_ptr=pipe_q.producer_get_barrier(q_state))
                    q_state.advance()

                n_min, n_max = self.n_block_range(m_block, sq, sk, window_left, window_right)
                if not valid:
                    n_max = n_min
                for i in cutlass.range(n_max - n_min, unroll=1):
                    n_block = n_max - 1 - i
                    pipe_k.producer_acquire(kv_state)
                    cute.copy(tma_k, tKg[None, n_block], tKs[None, kv_state.index],
                              tma_bar_ptr=pipe_k.producer_get_barrier(kv_state))
                    pipe_v.producer_acquire(kv_state)
                    cute.copy(tma_v, tVg[None, n_block], tVs[None, kv_state.index],
                              tma_bar_ptr=pipe_v.producer_get_barrier(kv_state))
                    kv_state.advance()
                # Fetch the next tile once this tile's loads are issued: the consumers are still
                # kv_stages blocks behind, so the atomic's latency stays hidden, and fewer values
                # are live here than before the loop (the producer has 24 registers).
                tile = next_tile(self.sched, tile, num_tiles, sched_ptr)

    @cute.jit
    def skip_empty_tiles(self, tile, num_tiles, num_m_blocks, num_heads, section, cu_q_ptr,
                         sched_ptr):
        """varlen: the grid covers num_m_blocks(max_seqlen_q) m-blocks of every document, so
        the m-blocks past a shorter document's end hold no rows (75 % of the tiles of the zipf
        mix in bench/benchlib.py). The producer fetches past them here instead of handing them
        to the consumers, so their fetches overlap the consumers' current tile."""
        empty = tile < num_tiles
        while empty:
            m_block, head, batch = decode_tile(tile, num_m_blocks, num_heads, section)
            cq = cute.make_tensor(cu_q_ptr + batch, cute.make_layout(2))
            if m_block * self.tile_m < cq[1] - cq[0]:
                empty = False
            else:
                tile = next_tile(self.sched, tile, num_tiles, sched_ptr)
                empty = tile < num_tiles
        return tile

    # ------------------------------------------------------------------ MMA warpgroups
    @cute.jit
    def consumer(
        self, tidx, tiled_mma_qk, tiled_mma_pv, sQ, sK, sV, slots,
        pipe_q, pipe_k, pipe_v, pipe_tile,
        o_ptr, lse_ptr, trace_ptr, cu_q_ptr, cu_k_ptr,
        o_stride_s, o_stride_h, o_stride_b, lse_stride_h, lse_stride_b,
        seqlen_q, seqlen_k, num_heads, num_m_blocks, section, num_tiles,
        varlen, window_left, window_right, softmax_scale_log2, softmax_scale, softcap_pre,
    ):
        """Per n-block, with intra-warpgroup overlap: issue S(n) = Q K(n)^T and O += P(n+1) V(n+1)
        back to back, run the softmax of S(n) while the PV wgmma runs, then rescale O.
        The two MMA warpgroups take turns issuing (ping-pong through named barriers), so one's
        softmax overlaps the other's tensor-core work. Both are compile-time switches
        (``noovl``/``nopp`` variants) so that each can be measured."""
        thr_qk = tiled_mma_qk.get_slice(tidx)
        thr_pv = tiled_mma_pv.get_slice(tidx)
        tSrQ = thr_qk.make_fragment_A(thr_qk.partition_A(sQ))
        tSrK = thr_qk.make_fragment_B(thr_qk.partition_B(sK))
        tOrV = thr_pv.make_fragment_B(thr_pv.partition_B(sV))
        acc_S = thr_qk.make_fragment_C(thr_qk.partition_shape_C((self.tile_m, self.tile_n)))
        acc_O = thr_pv.make_fragment_C(thr_pv.partition_shape_C((self.tile_m, self.hd)))
        tOrP = cute.make_rmem_tensor(_acc_as_a_layout(acc_S.layout), self.dtype)
        tOrP_as_acc = cute.make_tensor(tOrP.iterator, acc_S.layout)

        # Coordinates of the accumulator values are computed from tidx where needed (an
        # identity-tensor partition gets hoisted into ~100 live registers and spills).
        acc_S_mn = _acc_mn_view(acc_S)
        acc_O_mn = _acc_mn_view(acc_O)
        n_rows = cute.size(acc_S_mn, mode=[0])
        row_max = cute.make_rmem_tensor(cute.make_layout(n_rows), Float32)
        row_sum = cute.make_rmem_tensor(cute.make_layout(n_rows), Float32)
        row_scale = cute.make_rmem_tensor(cute.make_layout(n_rows), Float32)

        q_state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Consumer, 1)
        k_state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Consumer, self.kv_stages)
        v_state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Consumer, self.kv_stages)
        tile_state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Consumer, TILE_SLOTS)

        wg = tidx // 128  # 0 or 1 among the MMA warpgroups
        if wg == 0 and cutlass.const_expr(self.pingpong):
            # Ping-pong: warpgroup 0 issues first.
            cute.arch.barrier_arrive(barrier_id=1, number_of_threads=256)

        running = cutlass.Boolean(True)
        while running:
            pipe_tile.consumer_wait(tile_state)
            tile = slots[tile_state.index]
            pipe_tile.consumer_release(tile_state)
            tile_state.advance()
            if tile >= num_tiles:
                running = False
            else:
                t_start = Int64(0)
                if cutlass.const_expr(self.trace):
                    t_start = cute.arch.globaltimer()
                m_block, head, batch = decode_tile(tile, num_m_blocks, num_heads, section)
                q_start, k_start, sq, sk, tma_b = self.seq_info(
                    batch, seqlen_q, seqlen_k, varlen, cu_q_ptr, cu_k_ptr)
                row0 = m_block * self.tile_m
                if row0 < sq:
                    n_min, n_max = self.n_block_range(m_block, sq, sk, window_left, window_right)
                    acc_O.fill(0.0)
                    row_max.fill(-Float32.inf)
                    row_sum.fill(0.0)
                    pipe_q.consumer_wait(q_state)
                    k_state, v_state = self.mainloop(
                        tidx, wg, tiled_mma_qk, tiled_mma_pv, tSrQ, tSrK, tOrV, tOrP,
                        tOrP_as_acc, acc_S, acc_O, acc_S_mn, acc_O_mn, row_max, row_sum,
                        row_scale, pipe_k, pipe_v, k_state, v_state, n_min, n_max, row0, sq, sk,
                        window_left, window_right, softmax_scale_log2, softcap_pre)
                    pipe_q.consumer_release(q_state)
                    q_state.advance()
                    self.epilogue(
                        tidx, acc_O, acc_O_mn, row_max, row_sum, o_ptr, lse_ptr,
                        o_stride_s, o_stride_h, o_stride_b, lse_stride_h, lse_stride_b,
                        m_block, head, batch, q_start, sq, softmax_scale,
                    )
                if cutlass.const_expr(self.trace):
                    if tidx == 0:
                        # (SM, CTA, start ns, end ns) of this tile; the tile index is unique.
                        rec = cute.make_tensor(trace_ptr + Int64(tile) * 4, cute.make_layout(4))
                        rec[0] = Int64(cute.arch.smid())
                        rec[1] = Int64(cute.arch.block_idx()[0])
                        rec[2] = t_start
                        rec[3] = cute.arch.globaltimer()

    @cute.jit
    def mainloop(
        self, tidx, wg, tiled_mma_qk, tiled_mma_pv, tSrQ, tSrK, tOrV, tOrP, tOrP_as_acc,
        acc_S, acc_O, acc_S_mn, acc_O_mn, row_max, row_sum, row_scale,
        pipe_k, pipe_v, k_state, v_state, n_min, n_max, row0, sq, sk,
        window_left, window_right, scale_log2, softcap_pre,
    ):
        """Key blocks n_max-1 down to n_min for one m-tile; returns the advanced K/V states."""
        if cutlass.const_expr(self.intra_wg_overlap):
            if n_max > n_min:
                # First (last-in-sequence) block: always masked.
                self.qk_alone(wg, tiled_mma_qk, acc_S, tSrQ, tSrK, pipe_k, k_state)
                k_state.advance()
                self.apply_softcap(acc_S_mn, softcap_pre)
                self.apply_mask(acc_S_mn, tidx, (n_max - 1) * self.tile_n, row0, sq, sk,
                                window_left, window_right)
                self.online_softmax(acc_S_mn, row_max, row_sum, row_scale, scale_log2)
                self.convert_p(acc_S, tOrP_as_acc)
                for i in cutlass.range(1, n_max - n_min, unroll=1):
                    col0 = (n_max - 1 - i) * self.tile_n
                    pipe_k.consumer_wait(k_state)
                    pipe_v.consumer_wait(v_state)
                    self.pingpong_wait(wg)
                    self.gemm_qk(tiled_mma_qk, acc_S, tSrQ, tSrK, k_state.index)
                    self.gemm_pv(tiled_mma_pv, acc_O, tOrP, tOrV, v_state.index)
                    self.pingpong_signal(wg)
                    warpgroup.wait_group(1)
                    pipe_k.consumer_release(k_state)
                    k_state.advance()
                    self.apply_softcap(acc_S_mn, softcap_pre)
                    if self.block_needs_mask(col0, row0, sq, sk, window_left, window_right):
                        self.apply_mask(acc_S_mn, tidx, col0, row0, sq, sk,
                                        window_left, window_right)
                    self.online_softmax(acc_S_mn, row_max, row_sum, row_scale, scale_log2)
                    warpgroup.wait_group(0)
                    pipe_v.consumer_release(v_state)
                    v_state.advance()
                    self.rescale_o(acc_O_mn, row_scale)
                    self.convert_p(acc_S, tOrP_as_acc)
                # Last PV.
                self.pv_alone(wg, tiled_mma_pv, acc_O, tOrP, tOrV, pipe_v, v_state)
                v_state.advance()
        else:
            for i in cutlass.range(n_max - n_min, unroll=1):
                col0 = (n_max - 1 - i) * self.tile_n
                self.qk_alone(wg, tiled_mma_qk, acc_S, tSrQ, tSrK, pipe_k, k_state)
                k_state.advance()
                self.apply_softcap(acc_S_mn, softcap_pre)
                if i == 0 or self.block_needs_mask(col0, row0, sq, sk, window_left, window_right):
                    self.apply_mask(acc_S_mn, tidx, col0, row0, sq, sk, window_left, window_right)
                self.online_softmax(acc_S_mn, row_max, row_sum, row_scale, scale_log2)
                self.rescale_o(acc_O_mn, row_scale)
                self.convert_p(acc_S, tOrP_as_acc)
                self.pv_alone(wg, tiled_mma_pv, acc_O, tOrP, tOrV, pipe_v, v_state)
                v_state.advance()
        return k_state, v_state

    @cute.jit
    def block_needs_mask(self, col0, row0, sq, sk, window_left, window_right):
        """Whether key block [col0, col0 + tile_n) crosses the sequence end or a mask edge for
        some row of [row0, row0 + tile_m)."""
        need = col0 + self.tile_n > sk
        if cutlass.const_expr(self.causal):
            need = need or (col0 + self.tile_n > row0 + sk - sq + 1)
        if cutlass.const_expr(self.local):
            need = need or (col0 + self.tile_n > row0 + sk - sq + window_right + 1)
            need = need or (col0 < row0 + self.tile_m - 1 + sk - sq - window_left)
        return need

    @cute.jit
    def convert_p(self, acc_S, tOrP_as_acc):
        """P (fp32, in acc_S) -> 16-bit A operand of the PV wgmma, written where it stands."""
        if cutlass.const_expr("xnopin" in self.variant_flags):
            tOrP_as_acc.store(acc_S.load().to(self.dtype))
        else:
            p32 = cute.recast_tensor(tOrP_as_acc, Uint32)
            ptx_type = "bf16" if cutlass.const_expr(self.dtype == cutlass.BFloat16) else "f16"
            for j in cutlass.range_constexpr(cute.size(p32)):
                p32[j] = _cvt_pair_pinned(acc_S[2 * j], acc_S[2 * j + 1], ptx_type)

    # Plain Python helpers (inlined while tracing, like pingpong_wait). The caller advances the
    # pipeline state after each: the tracer carries a state through a loop only when the
    # loop body itself rebinds it (an advance inside a helper escapes the loop).
    def qk_alone(self, wg, tiled_mma_qk, acc_S, tSrQ, tSrK, pipe_k, k_state):
        """S = Q K^T for the next key block, waited for (no PV in flight)."""
        pipe_k.consumer_wait(k_state)
        self.pingpong_wait(wg)
        self.gemm_qk(tiled_mma_qk, acc_S, tSrQ, tSrK, k_state.index)
        self.pingpong_signal(wg)
        warpgroup.wait_group(0)
        pipe_k.consumer_release(k_state)

    def pv_alone(self, wg, tiled_mma_pv, acc_O, tOrP, tOrV, pipe_v, v_state):
        """O += P V for the next value block, waited for (no QK in flight)."""
        pipe_v.consumer_wait(v_state)
        self.pingpong_wait(wg)
        self.gemm_pv(tiled_mma_pv, acc_O, tOrP, tOrV, v_state.index)
        self.pingpong_signal(wg)
        warpgroup.wait_group(0)
        pipe_v.consumer_release(v_state)

    def rescale_o(self, acc_O_mn, row_scale):
        """O *= the online softmax's per-row correction."""
        for r in range(cute.size(acc_O_mn, mode=[0])):  # static sizes: unrolled while tracing
            for c in range(cute.size(acc_O_mn, mode=[1])):
                acc_O_mn[r, c] = acc_O_mn[r, c] * row_scale[r]

    def pingpong_wait(self, wg):
        if cutlass.const_expr(self.pingpong):
            cute.arch.barrier(barrier_id=1 + wg, number_of_threads=256)

    def pingpong_signal(self, wg):
        if cutlass.const_expr(self.pingpong):
            cute.arch.barrier_arrive(barrier_id=2 - wg, number_of_threads=256)

    @cute.jit
    def gemm_qk(self, tiled_mma, acc, tSrQ, tSrK, stage):
        """acc = Q K^T (zero-initialised by the first k-block). A fresh MMA atom per call keeps
        the accumulate flag a local value."""
        warpgroup.fence()
        atom = cute.make_mma_atom(tiled_mma.op)
        for k in cutlass.range_constexpr(cute.size(tSrQ, mode=[2])):
            atom.set(warpgroup.Field.ACCUMULATE, k != 0)
            cute.gemm(atom, acc, tSrQ[None, None, k, 0], tSrK[None, None, k, stage], acc)
        warpgroup.commit_group()

    @cute.jit
    def gemm_pv(self, tiled_mma, acc, tOrP, tOrV, stage):
        """acc += P V."""
        warpgroup.fence()
        atom = cute.make_mma_atom(tiled_mma.op)
        atom.set(warpgroup.Field.ACCUMULATE, True)
        for k in cutlass.range_constexpr(cute.size(tOrP, mode=[2])):
            cute.gemm(atom, acc, tOrP[None, None, k], tOrV[None, None, k, stage], acc)
        warpgroup.commit_group()

    @cute.jit
    def apply_softcap(self, acc_S_mn, softcap_pre):
        """Softcap kernels: S -> tanh(S * softmax_scale / softcap), before the mask (a masked -inf
        must stay -inf). The host then passes softcap * log2(e) and softcap as the softmax's
        scales, so P = exp(softcap * tanh(...) - max) and the LSE come out in the usual units."""
        if cutlass.const_expr(self.softcap):
            for r in cutlass.range_constexpr(cute.size(acc_S_mn, mode=[0])):
                for c in cutlass.range_constexpr(cute.size(acc_S_mn, mode=[1])):
                    acc_S_mn[r, c] = _tanh_approx(acc_S_mn[r, c] * softcap_pre)

    @cute.jit
    def apply_mask(self, acc_S_mn, tidx, col0, row0, sq, sk, window_left, window_right):
        """-inf outside the visible keys: col >= sk; causal: col > row + sk - sq; local: col
        outside [row + sk - sq - window_left, row + sk - sq + window_right]."""
        thr_col = col0 + 2 * (tidx % 4)
        for r in cutlass.range_constexpr(cute.size(acc_S_mn, mode=[0])):
            diag = row0 + _frag_row(tidx, r) + sk - sq - thr_col
            hi = sk - thr_col  # columns c with c < hi are visible (c relative to thr_col)
            lo = Int32(-(1 << 30))
            if cutlass.const_expr(self.causal):
                hi = cutlass.min(hi, diag + 1)
            if cutlass.const_expr(self.local):
                hi = cutlass.min(hi, diag + window_right + 1)
                lo = diag - window_left
            for c in cutlass.range_constexpr(cute.size(acc_S_mn, mode=[1])):
                cs = _frag_col_static(c)
                if cutlass.const_expr(self.local):
                    if cs >= hi or cs < lo:
                        acc_S_mn[r, c] = -Float32.inf
                else:
                    if cs >= hi:
                        acc_S_mn[r, c] = -Float32.inf

    @cute.jit
    def online_softmax(self, acc_S_mn, row_max, row_sum, row_scale, scale_log2):
        """S -> P = exp2(S * scale_log2 - rowmax * scale_log2) in place; row_scale gets the
        factor the running O must be multiplied by."""
        for r in cutlass.range_constexpr(cute.size(acc_S_mn, mode=[0])):
            m_old = row_max[r]
            n_cols = cute.size(acc_S_mn, mode=[1])
            m_new = cute.arch.fmax(m_old, _tree(cute.arch.fmax, [acc_S_mn[r, c] for c in range(n_cols)]))
            m_new = cute.arch.fmax(m_new, cute.arch.shuffle_sync_bfly(m_new, offset=1))
            m_new = cute.arch.fmax(m_new, cute.arch.shuffle_sync_bfly(m_new, offset=2))
            row_max[r] = m_new
            m_safe = m_new
            if m_new == -Float32.inf:
                m_safe = Float32(0.0)
            shift = m_safe * scale_log2
            rescale = cute.math.exp2(m_old * scale_log2 - shift, fastmath=True)
            for c in cutlass.range_constexpr(n_cols):
                acc_S_mn[r, c] = cute.math.exp2(acc_S_mn[r, c] * scale_log2 - shift, fastmath=True)
            s = _tree(lambda a, b: a + b, [acc_S_mn[r, c] for c in range(n_cols)])
            row_sum[r] = row_sum[r] * rescale + s
            row_scale[r] = rescale

    @cute.jit
    def epilogue(self, tidx, acc_O, acc_O_mn, row_max, row_sum, o_ptr, lse_ptr,
                 o_stride_s, o_stride_h, o_stride_b, lse_stride_h, lse_stride_b,
                 m_block, head, batch, q_start, sq, softmax_scale):
        """O /= row sum; LSE = max * scale + log(sum) (or -inf for rows that saw no key)."""
        n_rows = cute.size(acc_O_mn, mode=[0])
        row0 = m_block * self.tile_m
        lse_base = Int64(head) * lse_stride_h + Int64(batch) * lse_stride_b + Int64(q_start)
        for r in cutlass.range_constexpr(n_rows):
            total = row_sum[r]
            total = total + cute.arch.shuffle_sync_bfly(total, offset=1)
            total = total + cute.arch.shuffle_sync_bfly(total, offset=2)
            inv = Float32(0.0)
            lse = -Float32.inf
            if total > 0.0:
                inv = cute.arch.rcp_approx(total)
                lse = row_max[r] * softmax_scale + cute.math.log(total, fastmath=True)
            for c in cutlass.range_constexpr(cute.size(acc_O_mn, mode=[1])):
                acc_O_mn[r, c] = acc_O_mn[r, c] * inv
            row = row0 + _frag_row(tidx, r)
            if tidx % 4 == 0 and row < sq:
                lse_t = cute.make_tensor(lse_ptr + (lse_base + Int64(row)), cute.make_layout(1))
                lse_t[0] = lse

        rO = cute.make_rmem_tensor(acc_O.layout, self.dtype)
        rO.store(acc_O.load().to(self.dtype))
        # Adjacent columns pairs (c, c+1) sit next to each other in the fragment: store them as
        # one 32-bit word. The runtime guarantees 16-byte aligned output strides: tell the
        # compiler, so the 32-bit stores stay 32-bit.
        rO32 = cute.recast_tensor(rO, cutlass.Uint32)
        o_stride_s = cute.assume(o_stride_s, divby=8)
        o_stride_h = cute.assume(o_stride_h, divby=8)
        o_stride_b = cute.assume(o_stride_b, divby=8)
        o_off = (Int64(head) * o_stride_h + Int64(batch) * o_stride_b
                 + Int64(q_start + row0) * o_stride_s)
        rO32_mn = _acc_mn_view(rO32)  # (2 rows, hd/8 column pairs)
        n_pairs = cute.size(rO32_mn, mode=[1])
        for r in cutlass.range_constexpr(cute.size(rO32_mn, mode=[0])):
            rr = _frag_row(tidx, r)
            if row0 + rr < sq:
                # One base pointer per row; the pairs sit at constant offsets from it (so the
                # compiler folds them into the stores instead of keeping one address per value).
                row_ptr = cute.recast_ptr(o_ptr + (o_off + Int64(rr) * o_stride_s),
                                          dtype=cutlass.Uint32)  # 16-byte aligned row start
                gRow = cute.make_tensor(row_ptr + (tidx % 4), cute.make_layout(n_pairs, stride=4))
                for j in cutlass.range_constexpr(n_pairs):
                    gRow[j] = rO32_mn[r, j]
