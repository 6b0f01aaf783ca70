"""FlashAttention forward for sm_90a (Hopper), written in CuTe DSL for ahead-of-time builds:
the part the prefill and decode kernels share.

CTA = one producer warpgroup + one MMA warpgroup per 64 rows of the m tile:

* warpgroup 0, the producer (24 registers after ``setmaxnreg``): warp 0 issues the TMA loads
  of K and V (one n-block at a time, ``kv_stages`` deep, each on its own ``PipelineTmaAsync``)
  and, in the prefill kernels, of Q (once per tile); the tile indices (``tile_sched.py``) reach
  the other warps through shared-memory slots (prefill: fetched by warp 1, varlen compact
  launches through ``CompactVarlenOrder``; decode: by warp 0 itself);
* the MMA warpgroups (240 registers): each owns 64 rows of the m tile. S = Q K^T with wgmma
  (both operands in shared memory), online softmax in registers, P converted to 16-bit in
  registers and O += P V with wgmma (A from registers).

Key blocks are visited from the last to the first, so the blocks that need the causal or
the sequence-end mask come first and the rest run unmasked.

Masks (compile time): full, causal (bottom-right aligned), local (sliding window
``[row + sk - sq - window_left, row + sk - sq + window_right]``). Variable-length batches are a
runtime mode (``seq_mode`` & ``SeqMode.VARLEN``): q/k/v are packed (total, d, heads, 1) and
each tile reads its document's offsets from ``cu_seqlens_q/k``; ``seqused_q/k``
(``SeqMode.USED_Q``, ``SeqMode.USED_K``) cut a batch entry's rows/keys shorter. Offsets are
clamped to the packed lengths, so malformed offsets can give wrong rows but never a load or
store outside q/k/v/out/lse.

Two kernel classes over :class:`FlashFwdSm90Base`: :class:`~.prefill.FlashFwdSm90Prefill`
(``prefill.py``) and :class:`~.decode.FlashFwdSm90Decode` (``cfg.decode``; packed GQA,
split-KV, paged KV, run-time softcap: ``decode.py``).

Kernel parameters: ``fa4_aot/abi.py`` ``FWD_SM90`` (TMA descriptors + coordinate shapes for
Q, K, V, then the Ptrs, Strides, Shape, Softmax and Redo groups, each a NamedTuple generated
from the spec). Nothing about the device (SM count) is baked in.
"""

from __future__ import annotations

import dataclasses

import cutlass
import cutlass.cute as cute
import cutlass.pipeline as pipeline
import cutlass.utils.hopper_helpers as sm90_utils
from cutlass import Float32, Int32, Int64
from cutlass.cute.nvgpu import cpasync, warpgroup
from cutlass.tensor_utils import LayoutEnum

from fa4_aot.configs import KernelConfig
from fa4_aot.schedule import decode_tile

from ..common import CHAINS4, TREE, BlockInfo, seqlen_info
from ..tile_sched import TILE_SLOTS, AtomicCounterScheduler, TileSchedParams
from .epilogue import Epilogue
from .lazy_reference import LazyReference
from .mainloop import Mainloop
from .ptx import acc_as_a_layout, acc_mn_view, opaque_u32
from .state import (DTYPES, RESCALE_THRESHOLD, Frags, Ptrs, Redo, Shape, Softmax, Strides,
                    TileInfo)


class FlashFwdSm90Base(Mainloop, LazyReference, Epilogue):
    """The kernel skeleton: launch (``__call__``), shared storage and pipelines (``kernel``),
    the tile slots, the MMA warpgroups' tile loop (``consumer``). A kernel class provides
    ``producer`` (warp 0), the class attributes below, and overrides the hooks where its tile
    rows are not one head's consecutive query rows (``tile_coords``, ``packed_rows``,
    ``seq_rows``, ``split_range``, ``query_row``, ``row_target``, ``store``)."""

    # A warp of its own (warp 1) fetches the tile indices, and the producer warp reads them
    # from the slots like the MMA warpgroups (else the producer warp fetches and hands over).
    fetcher_warp: bool
    # Q comes through the producer's TMA into pipe_q's stages (else the MMA warpgroups load it).
    q_by_tma: bool
    # seqlen_info's separate_kv: packed q and packed k/v are separate seq_mode bits.
    separate_kv: bool
    # Softcap as a run-time value (softcap_pre != 0), besides the compile-time softcap kernels.
    runtime_softcap: bool

    def __init__(self, cfg: KernelConfig):
        self.cfg = cfg
        self.dtype = DTYPES[cfg.dtype]
        # Element types of q and k/v in global memory and in the K/V stages: e4m3 in the FP8
        # kernels (cfg.fp8), whose MMA warpgroups convert each K/V stage to ``dtype``.
        self.q_dtype = DTYPES[cfg.q_storage]
        self.kv_dtype = DTYPES[cfg.kv_storage]
        self.convert_kv = bool(cfg.fp8)
        # The MMAs' operand type (the FP8 prefill kernels: e4m3) and whether V is the K-major
        # B operand of O += P V (FP8 wgmma: V transposed by the runtime) rather than MN-major.
        self.mma_dtype = self.dtype
        self.v_k_major = False
        # The epilogue multiplies O by the tile's v_descale (``Frags.conv[1]``; FP8 kernels).
        self.o_descale = False
        self.hd = cfg.head_dim
        self.tile_m = cfg.tile.m
        self.tile_n = cfg.tile.n
        self.kv_stages = cfg.tile.kv_stages
        self.q_stages = cfg.tile.q_stages
        self.causal = cfg.causal
        self.local = cfg.local
        self.sched = cfg.scheduler
        self.trace = cfg.trace
        self.softcap = cfg.softcap
        self.threads = cfg.threads
        self.num_mma_wg = self.tile_m // 64
        assert self.threads == 128 * (1 + self.num_mma_wg)
        # setmaxnreg moves registers inside the CTA's allocation (ptxas gives each thread
        # 64 K / threads, rounded down to 8): what the producer warpgroup gives up must cover
        # what the MMA warpgroups take (the build checks: inspect_cubin.register_budget_problem).
        # Two MMA warpgroups: 128 * (168 - 24) = 256 * (240 - 168). Three (192-row tiles): 128
        # each, the producer's 104 spread over 384 threads -> 160. One (the decode kernels, 256
        # threads): the producer, which also looks up pages, keeps 56.
        self.producer_regs = 56 if self.num_mma_wg == 1 else 24
        base = (65536 // self.threads) // 8 * 8
        spare = (base - self.producer_regs) // self.num_mma_wg
        self.mma_regs = min(240, (base + spare) // 8 * 8)
        self.binfo = BlockInfo(self.tile_m, self.tile_n, self.causal, self.local)
        self.intra_wg_overlap = cfg.tile.overlap
        self.pingpong = cfg.tile.pingpong and self.num_mma_wg >= 2
        self.rescale_early = cfg.tile.rescale_early and self.intra_wg_overlap
        self.reduction = CHAINS4 if cfg.tile.sum_chains else TREE
        self.rescale_threshold = RESCALE_THRESHOLD if cfg.tile.lazy_rescale else None
        # Softmax exponents from raw differences (common.softmax.online_softmax_row): the FP8
        # kernels, whose scale carries the descales (Fp8Inputs).
        self.exact_shift = bool(cfg.fp8)
        # Q's swizzle atom rows: 128 bytes where head_dim is a multiple of 64, else 64 (hd96).
        self.q_row_bytes = 128 if self.hd % 64 == 0 else 64
        # Prefill features (the kernel classes set them): O staged through shared memory
        # (Q's stage, or an O buffer), Tile.edge_width, Tile.lazy_reference.
        self.staged_store = False
        self.o_buffer = False
        self.edge_n = 0
        self.lazy_ref = False

    # ------------------------------------------------------------------ static pieces
    def _mmas_and_layouts(self, kv_rows=None, kv_dtype=None, stages=None):
        """The MMAs and the shared-memory layouts of Q, K and V (K and V in ``kv_dtype`` with
        ``stages`` stages: by default ``dtype``, kv_stages, one stage for a TMA box of
        ``kv_rows`` keys)."""
        dt = self.mma_dtype
        kv_rows = kv_rows or self.tile_n
        qk_tiler = (self.tile_m, kv_rows, self.hd)
        pv_tiler = (self.tile_m, self.hd, kv_rows)
        mma_qk = sm90_utils.make_trivial_tiled_mma(
            dt, dt, warpgroup.OperandMajorMode.K, warpgroup.OperandMajorMode.K, Float32,
            (self.num_mma_wg, 1, 1), (64, self.tile_n),
        )
        v_major = (warpgroup.OperandMajorMode.K if cutlass.const_expr(self.v_k_major)
                   else warpgroup.OperandMajorMode.MN)
        mma_pv = sm90_utils.make_trivial_tiled_mma(
            dt, dt, warpgroup.OperandMajorMode.K, v_major, Float32,
            (self.num_mma_wg, 1, 1), (64, self.hd), warpgroup.OperandSource.RMEM,
        )
        sQ = sm90_utils.make_smem_layout_a(LayoutEnum.ROW_MAJOR, qk_tiler, dt, self.q_stages)
        if stages is None:
            stages = self.kv_stages if kv_rows == self.tile_n else 1
        kd = kv_dtype or dt
        sK = sm90_utils.make_smem_layout_b(LayoutEnum.ROW_MAJOR, qk_tiler, kd, stages)
        sV = sm90_utils.make_smem_layout_b(
            LayoutEnum.ROW_MAJOR if cutlass.const_expr(self.v_k_major) else LayoutEnum.COL_MAJOR,
            pv_tiler, kd, stages)
        return mma_qk, mma_pv, sQ, sK, sV

    def _stage_layouts(self):
        """(sK, sV): the K/V stages the producer's TMA fills (``kv_dtype``, kv_stages) and, with
        ``convert_kv``, the one bf16 K and V buffer each stage is converted into (else None)."""
        _, _, _, sK, sV = self._mmas_and_layouts(kv_dtype=self.kv_dtype)
        if cutlass.const_expr(not self.convert_kv):
            return (sK, sV), None
        _, _, _, cK, cV = self._mmas_and_layouts(stages=1)
        return (sK, sV), (cK, cV)

    # ------------------------------------------------------------------ host side (trace only)
    @cute.jit
    def __call__(
        self,
        mQ: cute.Tensor,  # (seqlen_q, d, heads, batch)
        mK: cute.Tensor,  # (seqlen_k, d, kv_heads, batch)
        mV: cute.Tensor,  # (seqlen_k, d, kv_heads, batch)
        ptrs: Ptrs,
        strides: Strides,
        shape: Shape,
        softmax: Softmax,
        redo: Redo,
        stream,
    ):
        self.launch(mQ, mK, mV, (ptrs, strides, shape, softmax, redo), stream)

    @cute.jit
    def launch(self, mQ, mK, mV, groups, stream):
        """The launch of ``__call__`` (traced): ``groups`` are its launch-ABI groups, in the
        spec's order (FWD_SM90; FWD_SM90_FP8 adds Quant)."""
        dt = self.mma_dtype
        _, _, sQ_layout, _, _ = self._mmas_and_layouts()
        (sK_layout, sV_layout), conv_layouts = self._stage_layouts()
        # V seen as (d, seqlen_k, kv_heads, batch): the B operand of O += P V (MN-major; the
        # FP8 prefill kernels' transposed V, keys innermost: K-major).
        mVt = cute.make_tensor(
            mV.iterator,
            cute.make_layout(
                (mV.shape[1], mV.shape[0], mV.shape[2], mV.shape[3]),
                stride=(mV.stride[1], mV.stride[0], mV.stride[2], mV.stride[3]),
            ),
        )
        g2s = cpasync.CopyBulkTensorTileG2SOp()
        # The Q box in q's own element type (an e4m3 q is loaded by the MMA warpgroups, never
        # through this descriptor).
        sQ_box = sQ_layout
        if cutlass.const_expr(self.q_dtype != dt):
            sQ_box = sm90_utils.make_smem_layout_a(
                LayoutEnum.ROW_MAJOR, (self.tile_m, self.tile_n, self.hd), self.q_dtype, 1)
        tma_q, tQ = cpasync.make_tiled_tma_atom(
            g2s, mQ, cute.slice_(sQ_box, (None, None, 0)), (self.tile_m, self.hd))
        kv_rows = self.tma_kv_rows()
        _, _, _, sK_box, sV_box = self._mmas_and_layouts(kv_rows, kv_dtype=self.kv_dtype)
        tma_k, tK = cpasync.make_tiled_tma_atom(
            g2s, mK, cute.slice_(sK_box, (None, None, 0)), (kv_rows, self.hd))
        tma_v, tV = cpasync.make_tiled_tma_atom(
            g2s, mVt, cute.slice_(sV_box, (None, None, 0)), (self.hd, kv_rows))
        self.q_bytes = cute.size_in_bytes(dt, cute.slice_(sQ_layout, (None, None, 0)))
        self.kv_bytes = cute.size_in_bytes(self.kv_dtype,
                                           cute.slice_(sK_layout, (None, None, 0)))
        kdt = self.kv_dtype
        cK_size = cute.cosize(conv_layouts[0]) if cutlass.const_expr(self.convert_kv) else 0

        @cute.struct
        class SharedStorage:
            mbar_q: cute.struct.MemRange[cutlass.Int64, 2 * self.q_stages]
            mbar_k: cute.struct.MemRange[cutlass.Int64, 2 * self.kv_stages]
            mbar_v: cute.struct.MemRange[cutlass.Int64, 2 * self.kv_stages]
            mbar_tile: cute.struct.MemRange[cutlass.Int64, 2 * TILE_SLOTS]
            # Per slot: the tile index and its (m_block, head, batch, split), decoded once by
            # the warp that fetched it (the readers do no division).
            # ... then (prefill kernels) an mbarrier the producer warp arrives on once a
            # tile's loads are issued (issued_barrier), 8-byte aligned after the slots.
            tile_slot: cute.struct.MemRange[Int32, 8 * TILE_SLOTS + 2]
            sQ: cute.struct.Align[cute.struct.MemRange[dt, cute.cosize(sQ_layout)], 1024]
            sK: cute.struct.Align[cute.struct.MemRange[kdt, cute.cosize(sK_layout)], 1024]
            sV: cute.struct.Align[cute.struct.MemRange[kdt, cute.cosize(sV_layout)], 1024]
            if cutlass.const_expr(self.convert_kv):
                # The bf16 K and V the MMAs read, converted from a stage (FP8 decode kernels).
                cK: cute.struct.Align[cute.struct.MemRange[dt, cK_size], 1024]
                cV: cute.struct.Align[cute.struct.MemRange[dt, cK_size], 1024]
            if cutlass.const_expr(self.o_buffer):
                # The O buffer (64 rows, Q's swizzled layout) and its hand-over: warpgroup w
                # writes once mbar_o[w] completes, and arrives on mbar_o[w + 1] when done.
                mbar_o: cute.struct.MemRange[cutlass.Int64, self.num_mma_wg]
                sO: cute.struct.Align[cute.struct.MemRange[dt, 64 * self.hd], 1024]

        self.shared_storage = SharedStorage
        # 227 KB per CTA on sm_90a: a tile whose buffers exceed it would build but not launch.
        size = SharedStorage.size_in_bytes()
        assert size <= 227 * 1024, f"{self.cfg.name}: shared storage of {size} B > 227 KB"

        self.kernel(tma_q, tQ, tma_k, tK, tma_v, tV, *groups).launch(
            grid=[1, 1, 1],  # the runtime sets the grid
            block=[self.threads, 1, 1],
            stream=stream,
            min_blocks_per_mp=1,
        )

    # ------------------------------------------------------------------ device side
    @cute.kernel
    def kernel(self, tma_q: cute.CopyAtom, tQ: cute.Tensor, tma_k: cute.CopyAtom,
               tK: cute.Tensor, tma_v: cute.CopyAtom, tV: cute.Tensor,
               ptrs: Ptrs, strides: Strides, shape: Shape, softmax: Softmax, redo: Redo,
               quant=None):
        tidx, _, _ = cute.arch.thread_idx()
        warp_idx = cute.arch.make_warp_uniform(cute.arch.warp_idx())
        wg_idx = warp_idx // 4
        mma_qk, mma_pv, sQ_layout, _, _ = self._mmas_and_layouts()
        (sK_layout, sV_layout), conv_layouts = self._stage_layouts()

        smem = cutlass.utils.SmemAllocator()
        storage = smem.allocate(self.shared_storage)

        producer_one = pipeline.CooperativeGroup(pipeline.Agent.Thread, 1)
        consumer_warps = pipeline.CooperativeGroup(pipeline.Agent.Thread, 4 * self.num_mma_wg)
        pipe_q = pipeline.PipelineTmaAsync.create(
            barrier_storage=storage.mbar_q.data_ptr(), num_stages=self.q_stages,
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
            consumer_group=pipeline.CooperativeGroup(
                pipeline.Agent.Thread, 128 * self.num_mma_wg + (32 if self.fetcher_warp else 0)),
            defer_sync=True,
        )
        if cutlass.const_expr(self.fetcher_warp):
            if tidx == 0:
                cute.arch.mbarrier_init(self.issued_barrier(
                    storage.tile_slot.get_tensor(cute.make_layout((8, TILE_SLOTS)))), 1)
                if cutlass.const_expr(self.o_buffer):
                    for w in cutlass.range_constexpr(self.num_mma_wg):
                        cute.arch.mbarrier_init(storage.mbar_o.data_ptr() + w, 128)
        cute.arch.mbarrier_init_fence()
        cute.arch.sync_threads()

        sQ = storage.sQ.get_tensor(sQ_layout.outer, swizzle=sQ_layout.inner)
        sK = storage.sK.get_tensor(sK_layout.outer, swizzle=sK_layout.inner)
        sV = storage.sV.get_tensor(sV_layout.outer, swizzle=sV_layout.inner)
        mma_kv = (sK, sV)
        if cutlass.const_expr(self.convert_kv):
            cK_layout, cV_layout = conv_layouts
            mma_kv = (storage.cK.get_tensor(cK_layout.outer, swizzle=cK_layout.inner),
                      storage.cV.get_tensor(cV_layout.outer, swizzle=cV_layout.inner))
        slots = storage.tile_slot.get_tensor(cute.make_layout((8, TILE_SLOTS)))
        # Packed lengths (the TMA coordinate shapes): varlen offsets are clamped to them.
        totals = (tQ.shape[0], tK.shape[0])
        pipes = (pipe_q, pipe_k, pipe_v, pipe_tile)

        if wg_idx == 0:
            cute.arch.setmaxregister_decrease(self.producer_regs)
            if warp_idx == 0:
                self.producer((tma_q, tQ, tma_k, tK, tma_v, tV), (sQ, sK, sV, slots), pipes,
                              ptrs, strides, shape, totals)
            elif warp_idx == 1:
                if cutlass.const_expr(self.fetcher_warp):
                    self.tile_fetcher(slots, pipe_tile, ptrs, shape, totals)
        else:
            cute.arch.setmaxregister_increase(self.mma_regs)
            o_buf = None
            if cutlass.const_expr(self.o_buffer):
                o_buf = (storage.sO.data_ptr().toint(), storage.mbar_o.data_ptr())
            self.consumer(tidx - 128, (mma_qk, mma_pv), (sQ, *mma_kv, slots), pipes,
                          ptrs, strides, shape, softmax, redo, totals, o_buf,
                          (sK, sV, *mma_kv, quant))

    # ------------------------------------------------------------------ tiles
    @cute.jit
    def tile_coords(self, tile, shape: Shape):
        """Tile index -> (m_block, head, batch, split)."""
        m_block, head, batch = decode_tile(tile, shape.num_m_blocks, shape.num_heads,
                                           shape.section)
        return m_block, head, batch, Int32(0)

    def tile_info(self, coords, ptrs: Ptrs, shape: Shape, totals) -> TileInfo:
        """The tile of coordinates (m_block, head, batch, split) (:meth:`tile_coords`)."""
        return TileInfo(*coords, *seqlen_info(coords[2], shape, ptrs, totals,
                                              separate_kv=self.separate_kv))

    @cute.jit
    def hand_over(self, pipe_tile, tile_state, slots, tile, shape: Shape):
        """Writer warp: the next slot (``tile_state``, not advanced here) <- the tile index and,
        for a tile in range, its coordinates; returns them (garbage past the end)."""
        pipe_tile.producer_acquire(tile_state)
        coords = (Int32(0), Int32(0), Int32(0), Int32(0))
        if tile < shape.num_tiles:
            coords = self.tile_coords(tile, shape)
        if cute.arch.lane_idx() == 0:
            slots[0, tile_state.index] = tile
            for k in cutlass.range_constexpr(4):
                slots[1 + k, tile_state.index] = coords[k]
        pipe_tile.producer_commit(tile_state)
        return coords

    def issued_barrier(self, slots):
        """The mbarrier after the tile slots (``fetcher_warp``): one arrival per tile whose loads
        the producer warp has issued."""
        return cute.recast_ptr(slots.iterator + 8 * TILE_SLOTS, dtype=Int64)

    def get_tile(self, slots, idx):
        """Reader: (tile index, coordinates) from slot ``idx``."""
        return slots[0, idx], tuple(slots[1 + k, idx] for k in range(4))

    def rows_of(self, t: TileInfo, shape: Shape):
        """Rows of the tile's (head, batch) pair (:meth:`packed_rows` of its query rows)."""
        return self.packed_rows(t.sq, shape)

    def packed_rows(self, rows, shape: Shape):
        """Tile rows of ``rows`` query rows: one each."""
        return rows

    def query_row(self, row, shape: Shape):
        """Query row of tile row ``row``: the same."""
        return row

    def tma_kv_rows(self):
        """Keys per TMA box of K and V: the whole n-block."""
        return self.tile_n

    @cute.jit
    def seq_rows(self, row0, shape: Shape):
        """First and last query row of the tile's m-block."""
        return row0, row0 + self.tile_m - 1

    @cute.jit
    def n_block_range(self, t: TileInfo, shape: Shape):
        """[n_min, n_max): the key blocks the tile sees (mask: full, causal or local), then
        :meth:`split_range`."""
        s_lo, s_hi = self.seq_rows(t.m_block * self.tile_m, shape)
        n_min, n_max = self.binfo.n_block_range(t.m_block, t.sq, t.sk, shape.window_left,
                                                shape.window_right, s_lo, s_hi)
        return self.split_range(n_min, n_max, t, shape)

    def split_range(self, n_min, n_max, t: TileInfo, shape: Shape):
        """The tile's part of key blocks [n_min, n_max): all of them."""
        return n_min, n_max

    def scheduler(self, ptrs: Ptrs, shape: Shape, num_tiles=None) -> AtomicCounterScheduler:
        """The tile scheduler over ``num_tiles`` indices (default: the launch's tiles)."""
        return AtomicCounterScheduler(
            self.sched, TileSchedParams(shape.num_m_blocks, shape.section,
                                        shape.num_tiles if num_tiles is None else num_tiles),
            ptrs.sched_ptr)

    @cute.jit
    def skip_empty_tiles(self, tile, ptrs: Ptrs, shape: Shape):
        """varlen: the grid covers the m-blocks of max_seqlen_q for every document, so the
        m-blocks past a shorter document's end hold no rows. The fetcher warp fetches past them
        here instead of handing them on, so their fetches overlap the current tile. (A cheap
        test on cu_seqlens_q only: the consumers skip whatever else turns out empty.)"""
        sched = self.scheduler(ptrs, shape)
        empty = tile < shape.num_tiles
        while empty:
            m_block, head, batch, split = self.tile_coords(tile, shape)
            cq = cute.make_tensor(ptrs.cu_seqlens_q + batch, cute.make_layout(2))
            rows = self.packed_rows(cq[1] - cq[0], shape)
            if m_block * self.tile_m < rows:
                empty = False
            else:
                tile, _ = sched.next(tile)
                empty = tile < shape.num_tiles
        return tile

    # ------------------------------------------------------------------ MMA warpgroups
    def acquire_q(self, tidx, sQ, pipe_q, q_state, t: TileInfo, ptrs: Ptrs, strides: Strides,
                  shape: Shape, f: Frags):
        """This tile's Q in shared memory: waits for the producer's TMA load (``q_by_tma``)."""
        pipe_q.consumer_wait(q_state)

    def make_p_frag(self, acc_S):
        """The register A operand of O += P V: P as 16-bit values, each where its fp32 value
        stands in the accumulator (:func:`~.ptx.acc_as_a_layout`)."""
        return cute.make_rmem_tensor(acc_as_a_layout(acc_S.layout), self.dtype)

    def tile_softmax(self, softmax: Softmax, f: Frags):
        """The Softmax group of the tile in hand (FP8 kernels: scaled by its descales)."""
        return softmax

    def tile_frags(self, f: Frags, t: TileInfo, shape: Shape, staged):
        """The fragments of tile ``t`` (FP8 kernels add its stages and descales: ``conv``).
        ``staged``: (K stages, V stages, the K and V the MMAs read, the Quant group or None)."""
        return f

    @cute.jit
    def consumer(self, tidx, mmas, smem, pipes, ptrs: Ptrs, strides: Strides, shape: Shape,
                 softmax: Softmax, redo: Redo, totals, o_buf=None, staged=None):
        """Per n-block, with intra-warpgroup overlap: issue S(n) = Q K(n)^T and O += P(n+1) V(n+1)
        back to back, run the softmax of S(n) while the PV wgmma runs, then rescale O.
        With two or three MMA warpgroups they take turns issuing (ping-pong, round robin through
        named barriers), so one's softmax overlaps the others' tensor-core work. ``o_buf``
        (``Tile.o_buffer``): (shared address of the O buffer, its hand-over mbarriers).
        ``staged``: see :meth:`tile_frags`."""
        mma_qk, mma_pv = mmas
        sQ, sK, sV, slots = smem
        pipe_q, pipe_k, pipe_v, pipe_tile = pipes
        # The wgmma operands (shared-memory descriptors) are the same for every thread of a
        # warpgroup: partitioned by the warp-uniform warpgroup index, so that ptxas keeps the
        # descriptors in uniform registers (partitioned by tidx, every wgmma of the loop
        # recomputes its descriptor in vector registers and moves it over; docs/design.md).
        wg = self.mma_wg(tidx)
        wg_threads = cute.make_layout(self.num_mma_wg, stride=128)
        thr_qk = mma_qk.get_slice(wg_threads(wg))
        thr_pv = mma_pv.get_slice(wg_threads(wg))
        acc_S = thr_qk.make_fragment_C(thr_qk.partition_shape_C((self.tile_m, self.tile_n)))
        acc_O = thr_pv.make_fragment_C(thr_pv.partition_shape_C((self.tile_m, self.hd)))
        tOrP = self.make_p_frag(acc_S)
        # Coordinates of the accumulator values are computed from tidx where needed (an
        # identity-tensor partition gets hoisted into ~100 live registers and spills).
        acc_S_mn = acc_mn_view(acc_S)
        n_rows = cute.size(acc_S_mn, mode=[0])
        f = Frags(
            mma_qk=mma_qk, mma_pv=mma_pv,
            tSrQ=thr_qk.make_fragment_A(thr_qk.partition_A(sQ)),
            tSrK=thr_qk.make_fragment_B(thr_qk.partition_B(sK)),
            tOrV=thr_pv.make_fragment_B(thr_pv.partition_B(sV)),
            acc_S=acc_S, acc_O=acc_O, tOrP=tOrP,
            tOrP_as_acc=cute.make_tensor(tOrP.iterator, acc_S.layout),
            acc_S_mn=acc_S_mn, acc_O_mn=acc_mn_view(acc_O),
            row_max=cute.make_rmem_tensor(cute.make_layout(n_rows), Float32),
            row_sum=cute.make_rmem_tensor(cute.make_layout(n_rows), Float32),
            row_scale=cute.make_rmem_tensor(cute.make_layout(n_rows), Float32),
            **({n: cute.make_rmem_tensor(cute.make_layout(n_rows), Float32)
                for n in ("row_next", "row_pend", "row_tot")} if self.lazy_ref else {}),
            edge=self.edge_frags(wg_threads(wg), acc_S),
        )

        q_state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Consumer,
                                               self.q_stages)
        k_state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Consumer, self.kv_stages)
        v_state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Consumer, self.kv_stages)
        tile_state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Consumer,
                                                  TILE_SLOTS)

        if wg == 0 and cutlass.const_expr(self.pingpong):
            # Ping-pong: warpgroup 0 issues first.
            cute.arch.barrier_arrive(barrier_id=1, number_of_threads=256)

        o_phase = Int32(0)  # O buffer: parity of this warpgroup's epilogues so far
        running = cutlass.Boolean(True)
        while running:
            pipe_tile.consumer_wait(tile_state)
            tile, coords = self.get_tile(slots, tile_state.index)
            pipe_tile.consumer_release(tile_state)
            tile_state.advance()
            if tile >= shape.num_tiles:
                running = False
            else:
                t_start = Int64(0)
                if cutlass.const_expr(self.trace):
                    t_start = cute.arch.globaltimer()
                t = self.tile_info(coords, ptrs, shape, totals)
                row0 = t.m_block * self.tile_m
                if row0 < self.rows_of(t, shape):
                    n_min, n_max = self.n_block_range(t, shape)
                    f.acc_O.fill(0.0)
                    f.row_max.fill(-Float32.inf)
                    f.row_sum.fill(0.0)
                    f_tile = self.tile_frags(f, t, shape, staged)
                    self.acquire_q(tidx, sQ, pipe_q, q_state, t, ptrs, strides, shape, f_tile)
                    # This tile's Q stage (with two, the producer loads the next tile's Q into
                    # the other one while this tile runs).
                    q_stage = q_state.index if cutlass.const_expr(self.q_stages > 1) else 0
                    f_tile = dataclasses.replace(f_tile,
                                                 tSrQ=f_tile.tSrQ[None, None, None, q_stage])
                    sm_tile = self.tile_softmax(softmax, f_tile)
                    args = (tidx, f_tile, (pipe_k, pipe_v), k_state, v_state, t, (n_min, n_max),
                            shape, sm_tile)
                    if cutlass.const_expr(self.edge_n > 0):
                        # Tile.edge_width: tiles whose first block can be trimmed take a copy
                        # of the mainloop of their own, chosen here, where no wgmma is in
                        # flight (around the trimmed steps inside the mainloop, the branches'
                        # join makes ptxas serialise every wgmma of the kernel: C7511).
                        fits = self.edge_fits(n_max - 1, t, shape)
                        if fits == 1:
                            if n_max - n_min == 1:
                                k_state, v_state = self.mainloop(*args, trim=True, single=True)
                            else:
                                k_state, v_state = self.mainloop(*args, trim=True)
                        if fits == 0:
                            k_state, v_state = self.mainloop(*args)
                    else:
                        k_state, v_state = self.mainloop(*args)
                    if cutlass.const_expr(self.lazy_ref):
                        self.tile_guard(tidx, f, t, redo, shape, sm_tile,
                                        (n_min, n_max), opaque_u32(sQ.iterator.toint())
                                        + q_stage * self.q_bytes)
                    if cutlass.const_expr(self.o_buffer):
                        # O passes through the O buffer: Q is free once the mainloop is done.
                        pipe_q.consumer_release(q_state)
                        q_state.advance()
                        self.epilogue(tidx, f_tile, t, ptrs, strides, shape, sm_tile,
                                      (opaque_u32(o_buf[0]), o_buf[1], o_phase))
                        o_phase = o_phase ^ 1
                    elif cutlass.const_expr(self.staged_store):
                        # O passes through this Q stage: released once it is read back.
                        q_base = opaque_u32(sQ.iterator.toint()) + q_stage * self.q_bytes
                        self.epilogue(tidx, f_tile, t, ptrs, strides, shape, sm_tile, (q_base,))
                        pipe_q.consumer_release(q_state)
                        q_state.advance()
                    else:
                        if cutlass.const_expr(self.q_by_tma):
                            pipe_q.consumer_release(q_state)
                            q_state.advance()
                        self.epilogue(tidx, f_tile, t, ptrs, strides, shape, sm_tile)
                if cutlass.const_expr(self.trace):
                    if tidx == 0:
                        # (SM, CTA, start ns, end ns) of this tile; the tile index is unique.
                        rec = cute.make_tensor(ptrs.trace_ptr + Int64(tile) * 4,
                                               cute.make_layout(4))
                        rec[0] = Int64(cute.arch.smid())
                        rec[1] = Int64(cute.arch.block_idx()[0])
                        rec[2] = t_start
                        rec[3] = cute.arch.globaltimer()


