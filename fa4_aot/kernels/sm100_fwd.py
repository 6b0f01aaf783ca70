"""FlashAttention forward for sm_100a (Blackwell), written in CuTe DSL for ahead-of-time builds.

Nothing in this file has run on hardware: it is compiled to PTX on a CPU box, assembled with a
PyPI ptxas and inspected (registers, spills, SASS). Treat it as unverified until a B200 run.

CTA = 7 warps (224 threads), one CTA per SM (the shared-memory footprint forces it, see
``_check_one_cta_per_sm``), no cluster (the launch is a plain grid; CLC treats every CTA as a
cluster of one):

* warps 0-3, softmax: thread ``t`` owns row ``t`` of the 128-row m-tile (TMEM lane ``t``).
  It loads its row of S = Q K^T from tensor memory (``tcgen05.ld``), masks, runs the online
  softmax in registers, rescales its row of O in tensor memory when the row max grew, writes
  P (16-bit) back to tensor memory and finally normalizes O and stores O and LSE to global
  memory with plain stores (O: 16-byte stores, one row per thread; like the sm_90a kernel it
  relies on the runtime's 16-byte aligned O pointer and strides). Warp 0 also allocates and
  frees the tensor memory.
* warp 4, MMA: one elected thread issues ``tcgen05.mma``: S(i) = Q K(i)^T into one of two S
  buffers, and O += P(i) V(i) with P read from tensor memory. S(i+1) is issued before
  PV(i), so the tensor core computes the next S while the softmax warps work on the current one.
* warp 5, load: TMA loads of Q (once per tile) and of K and V (one n-block at a time,
  ``kv_stages`` deep, each on its own ``PipelineTmaUmma``).
* warp 6, scheduler (``clc`` only): issues ``clusterlaunchcontrol.try_cancel`` (the CLC
  protocol is in ``tile_sched.py``). In ``static`` mode it has nothing to do and returns at once.

Tensor memory (512 columns, 32-bit each, 128 lanes = rows): S0 at column 0, S1 at 128, O at
256 (``head_dim`` columns), P at 384 (64 columns: two 16-bit values per column).

Key blocks are visited from the last to the first, so the blocks that need the causal or the
sequence-end mask come first and the rest run unmasked (the same order as the sm_90a kernel).

Kernel parameters (launch ABI): the 22 runtime parameters of the base list of
``fa4_aot.abi.fwd_params`` (``extended=False``: the sm_90a list without its varlen, window,
LSE-stride and softcap parameters): TMA descriptor + coordinate shape for Q, K, V; pointers O,
LSE, sched, trace; three Int64 O strides; seven Int32; two Float32; nothing after them. ``__call__`` and
``kernel`` take them as the NamedTuple groups of ``fa4_aot.abi.FWD_SM100`` (``Ptrs``,
``Strides``, ``Shape``, ``Softmax``: their fields are the parameters, in order); inside, the
warps get what they use (``Gmem``: O, LSE and ``common.OStrides``; ``tile_sched.ClcScheduler``
with its ``TileSchedParams``). The shared/tensor-memory layouts passed to ``kernel`` are static and
produce no PTX parameter, and the two tiled MMAs are rebuilt inside the kernel (passed as
arguments they would become 32-byte runtime parameters holding MMA-descriptor state).
``sched_ptr`` and ``trace_ptr`` are accepted but unused. The TMA boxes are those of the sm_90a
kernel: 64 (head_dim chunk, 128-byte swizzle) x 128 rows for Q, K and V (V described as
(d, seqlen_k, heads, batch)), two boxes per operand at head_dim 128. Block (224, 1, 1)
(``.reqntid``), no cluster attribute needed.

Tile scheduling: ``tile_sched.ClcScheduler`` (``static``: tile += gridDim.x; ``clc``: cluster
launch control, its protocol is described in ``fa4_aot/kernels/tile_sched.py``). Every warp
walks the same tile sequence; warp 6 issues the CLC queries.

Exit / deadlock rules (all modes):

* No ``setmaxnreg``: 224 threads x 255 registers fit the register file, so no warp has to
  wait for another warp's register release and there is no warpgroup-collective
  ``setmaxnreg`` that an early-exiting warp could leave unmatched.
* Every mbarrier wait has a matching arrive on every path: all warps walk the same tile
  sequence (CLC: the same responses; static: tile += gridDim.x); a tile with no key block
  (causal, query rows above the first key) is skipped by load and MMA warps and written as
  O = 0, LSE = -inf by the softmax warps without touching any pipeline.
* The load warp waits (``producer_tail``) for the MMA warp's last ``tcgen05.commit`` arrivals
  on the Q/K/V *empty* barriers, so no asynchronous arrive is pending when the CTA exits.
* The softmax warps wait for the last PV of every tile (P *empty*, signalled by
  ``tcgen05.commit`` after that PV) before reading O; the MMA warp issues nothing after the
  last PV of its last tile. Tensor memory is freed by warp 0 after a named barrier that the
  four softmax warps wait on and the MMA warp arrives on after its loop.
"""

from __future__ import annotations

from typing import NamedTuple, Optional

import cutlass
import cutlass.cute as cute
import cutlass.pipeline as pipeline
import cutlass.utils.blackwell_helpers as sm100_utils
from cutlass import Float32, Int32
from cutlass._mlir import ir
from cutlass._mlir.dialects import nvvm as _nvvm
from cutlass.cute.nvgpu import cpasync, tcgen05
from cutlass.cutlass_dsl import dsl_user_op

from fa4_aot.abi import FWD_SM100

from .common import CHAINS4, BlockInfo, OStrides, finalize_row, mask_row, online_softmax_row
from .tile_sched import CLC, STATIC, ClcScheduler, TileSchedParams

_DTYPES = {"bf16": cutlass.BFloat16, "fp16": cutlass.Float16}
# The launch-ABI groups (fa4_aot/abi.py FWD_SM100): NamedTuples whose fields are the kernel
# parameters, in order.
_GROUPS = FWD_SM100.group_types()
Ptrs, Strides, Shape, Softmax = (_GROUPS[n] for n in ("Ptrs", "Strides", "Shape", "Softmax"))


class Gmem(NamedTuple):
    """What the softmax warps write: output rows (``o_strides``) and the LSE."""

    o_ptr: cute.Pointer
    lse_ptr: cute.Pointer
    o_strides: OStrides


class TmaLoads(NamedTuple):
    """TMA atom and coordinate tensor per operand."""

    tma_q: cute.CopyAtom
    tQ: cute.Tensor
    tma_k: cute.CopyAtom
    tK: cute.Tensor
    tma_v: cute.CopyAtom
    tV: cute.Tensor


class SmemLayouts(NamedTuple):
    """Static shared-memory layouts (Q, K and V stages) and the P operand layout."""

    sQ: cute.ComposedLayout
    sK: cute.ComposedLayout
    sV: cute.ComposedLayout
    tP: cute.ComposedLayout


class Smem(NamedTuple):
    sQ: cute.Tensor
    sK: cute.Tensor
    sV: cute.Tensor


class Pipes(NamedTuple):
    """Q/K/V: load -> MMA (TMA transactions; empty: tcgen05.commit). S: MMA -> softmax.
    P: softmax -> MMA (empty: tcgen05.commit after PV)."""

    q: pipeline.PipelineTmaUmma
    k: pipeline.PipelineTmaUmma
    v: pipeline.PipelineTmaUmma
    s: pipeline.PipelineUmmaAsync
    p: pipeline.PipelineAsyncUmma


class _SoftmaxViews(NamedTuple):
    """Per-thread tensor-memory copies (tcgen05.ld/st 32x32b: thread t <-> lane/row t) and
    register fragments of one softmax thread, built once per CTA."""

    ld_S: object   # S: tensor memory -> registers
    tSt: object    # this thread's S row in tensor memory (buffer 0)
    tSc: object    # (row, column) of each value of rS
    rS: object     # S / P row, fp32
    st_P: object   # P: registers -> tensor memory
    tPt: object
    rP: object     # P row, 16-bit values packed in 32-bit registers (rP16 aliases it)
    rP16: object
    ld_O: object   # O chunks: tensor memory <-> registers
    st_O: object
    tOt_ld: object
    tOt_st: object
    rO: object
    rO16: object
    row_local: object  # this thread's row inside the tile (== TMEM lane)


@dsl_user_op
def _tcgen05_fence_before(*, loc: Optional[ir.Location] = None,
                          ip: Optional[ir.InsertionPoint] = None) -> None:
    """``tcgen05.fence::before_thread_sync``: order this thread's prior tcgen05 ops (ld/st)
    before the following mbarrier arrive / barrier."""
    _nvvm.tcgen05_fence(_nvvm.Tcgen05FenceKind.BEFORE_THREAD_SYNC, loc=loc, ip=ip)


@dsl_user_op
def _tcgen05_fence_after(*, loc: Optional[ir.Location] = None,
                         ip: Optional[ir.InsertionPoint] = None) -> None:
    """``tcgen05.fence::after_thread_sync``: order the following tcgen05 ops after the
    preceding mbarrier wait / barrier."""
    _nvvm.tcgen05_fence(_nvvm.Tcgen05FenceKind.AFTER_THREAD_SYNC, loc=loc, ip=ip)


class FlashFwdSm100:
    # The tensor-memory map below assumes 128 x 128 tiles; the MMA is 128 x 128 x 16 (QK) and
    # 128 x head_dim x 16 (PV), cta_group::1. Tile shape and K/V ring depth come from
    # fa4_aot.configs.TILES (the depth also keeps dynamic shared memory above half an SM, so
    # one CTA per SM, needed by the 512-column TMEM allocation, see _check_one_cta_per_sm).
    TILE_M = 128
    TILE_N = 128

    SOFTMAX_WARPS = (0, 1, 2, 3)
    MMA_WARP = 4
    LOAD_WARP = 5
    SCHED_WARP = 6
    NUM_WARPS = 7
    THREADS = 32 * NUM_WARPS
    CLUSTER = (1, 1, 1)

    # Tensor memory map (32-bit columns).
    TMEM_COLS = 512
    TMEM_S0 = 0
    TMEM_S_STRIDE = 128  # S1 = S0 + 128
    TMEM_O = 256
    TMEM_P = 384
    S_STAGES = 2

    # Named barriers (0 is __syncthreads): tensor-memory free.
    TMEM_FREE_BAR = 1
    # O is read from tensor memory, rescaled and stored in chunks of this many columns.
    O_CHUNK = 32

    def __init__(self, cfg):
        self.cfg = cfg
        self.dtype = _DTYPES[cfg.dtype]
        self.hd = cfg.head_dim
        self.causal = cfg.causal
        self.sched = cfg.scheduler
        if self.sched not in (CLC, STATIC):
            raise ValueError(f"sm_100a kernel supports schedulers 'clc' and 'static', got {self.sched!r}")
        # The configuration space (fa4_aot/configs.py TILES) is the source of truth.
        self.tile_m, self.tile_n, self.kv_stages = cfg.tile.m, cfg.tile.n, cfg.tile.kv_stages
        if (self.tile_m, self.tile_n) != (self.TILE_M, self.TILE_N):
            raise ValueError(f"sm_100a kernel: the tensor-memory map needs {self.TILE_M}x"
                             f"{self.TILE_N} tiles, configs.TILES has {self.tile_m}x{self.tile_n}")
        self.threads = self.THREADS
        self.block_info = BlockInfo(self.tile_m, self.tile_n, self.causal)
        assert self.TMEM_O + self.hd <= self.TMEM_P
        assert self.TMEM_P + self.TILE_N // 2 <= self.TMEM_COLS

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
        stream,
    ):
        dt = self.dtype
        cta_group = tcgen05.CtaGroup.ONE
        qk_tiler = (self.tile_m, self.tile_n, self.hd)
        pv_tiler = (self.tile_m, self.hd, self.tile_n)
        tiled_mma_qk, tiled_mma_pv = self._make_tiled_mmas()
        layouts = SmemLayouts(
            sm100_utils.make_smem_layout_a(tiled_mma_qk, qk_tiler, dt, 1),
            sm100_utils.make_smem_layout_b(tiled_mma_qk, qk_tiler, dt, self.kv_stages),
            sm100_utils.make_smem_layout_b(tiled_mma_pv, pv_tiler, dt, self.kv_stages),
            sm100_utils.make_smem_layout_a(tiled_mma_pv, pv_tiler, dt, 1))

        # V seen as (d, seqlen_k, kv_heads, batch): the MN-major B operand of O += P V.
        mVt = cute.make_tensor(
            mV.iterator,
            cute.make_layout(
                (mV.shape[1], mV.shape[0], mV.shape[2], mV.shape[3]),
                stride=(mV.stride[1], mV.stride[0], mV.stride[2], mV.stride[3]),
            ),
        )
        cluster_vmnk = cute.tiled_divide(
            cute.make_layout(self.CLUSTER), (tiled_mma_qk.thr_id.shape,)).shape
        g2s = cpasync.CopyBulkTensorTileG2SOp(cta_group)
        sQ_one = cute.select(layouts.sQ, mode=[0, 1, 2])
        sK_one = cute.select(layouts.sK, mode=[0, 1, 2])
        sV_one = cute.select(layouts.sV, mode=[0, 1, 2])
        tma_q, tQ = cute.nvgpu.make_tiled_tma_atom_A(
            g2s, mQ, sQ_one, qk_tiler, tiled_mma_qk, cluster_vmnk)
        tma_k, tK = cute.nvgpu.make_tiled_tma_atom_B(
            g2s, mK, sK_one, qk_tiler, tiled_mma_qk, cluster_vmnk)
        tma_v, tV = cute.nvgpu.make_tiled_tma_atom_B(
            g2s, mVt, sV_one, pv_tiler, tiled_mma_pv, cluster_vmnk)
        self.q_bytes = cute.size_in_bytes(dt, sQ_one)
        self.k_bytes = cute.size_in_bytes(dt, sK_one)
        self.v_bytes = cute.size_in_bytes(dt, sV_one)

        @cute.struct
        class SharedStorage:
            mbar_q: cute.struct.MemRange[cutlass.Int64, 2]
            mbar_k: cute.struct.MemRange[cutlass.Int64, 2 * self.kv_stages]
            mbar_v: cute.struct.MemRange[cutlass.Int64, 2 * self.kv_stages]
            mbar_s: cute.struct.MemRange[cutlass.Int64, 2 * self.S_STAGES]
            mbar_p: cute.struct.MemRange[cutlass.Int64, 2]
            mbar_clc: cute.struct.MemRange[cutlass.Int64, 2]
            clc_response: cute.struct.Align[
                cute.struct.MemRange[Int32, ClcScheduler.RESPONSE_BYTES // 4], 16]
            tmem_holder: Int32
            sQ: cute.struct.Align[cute.struct.MemRange[dt, cute.cosize(layouts.sQ)], 1024]
            sK: cute.struct.Align[cute.struct.MemRange[dt, cute.cosize(layouts.sK)], 1024]
            sV: cute.struct.Align[cute.struct.MemRange[dt, cute.cosize(layouts.sV)], 1024]

        self.shared_storage = SharedStorage
        self._check_one_cta_per_sm(SharedStorage)

        # The groups flatten into the kernel parameters, fields in order (fa4_aot/abi.py).
        self.kernel(tma_q, tQ, tma_k, tK, tma_v, tV, ptrs, strides, shape, softmax,
                    layouts).launch(
            grid=[1, 1, 1],  # the runtime sets the grid
            block=[self.threads, 1, 1],
            stream=stream,
            min_blocks_per_mp=1,
        )

    def _make_tiled_mmas(self):
        """QK: A = Q (smem, K-major), B = K (smem, K-major). PV: A = P (tensor memory,
        K-major), B = V (smem, MN-major: head_dim contiguous). fp32 accumulators in TMEM.
        Built on the host (for the smem layouts and TMA atoms) and again inside the kernel: a
        TiledMma passed as a kernel argument would become a 32-byte runtime parameter (the
        instruction descriptor state) that the AOT runtime would have to fill."""
        dt = self.dtype
        cta_group = tcgen05.CtaGroup.ONE
        qk = sm100_utils.make_trivial_tiled_mma(
            dt, dt, tcgen05.OperandMajorMode.K, tcgen05.OperandMajorMode.K, Float32,
            cta_group, (self.tile_m, self.tile_n))
        pv = sm100_utils.make_trivial_tiled_mma(
            dt, dt, tcgen05.OperandMajorMode.K, tcgen05.OperandMajorMode.MN, Float32,
            cta_group, (self.tile_m, self.hd), tcgen05.OperandSource.TMEM)
        return qk, pv

    def _check_one_cta_per_sm(self, storage_cls) -> None:
        # Each CTA allocates all 512 TMEM columns. A second co-resident CTA would block in
        # tcgen05.alloc until the first one frees them; forbid co-residency instead: two CTAs
        # need 2 x (smem + 1 KiB reserved) <= 228 KiB, so more than 113 KiB each rules it out.
        size = storage_cls.size_in_bytes()
        assert 113 * 1024 < size <= 227 * 1024, f"shared storage of {size} B"
        self.smem_bytes = size

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
        ptrs: Ptrs,
        strides: Strides,
        shape: Shape,
        softmax: Softmax,
        layouts: SmemLayouts,
    ):
        tidx, _, _ = cute.arch.thread_idx()
        warp_idx = cute.arch.make_warp_uniform(cute.arch.warp_idx())
        tiled_mma_qk, tiled_mma_pv = self._make_tiled_mmas()

        if warp_idx == self.LOAD_WARP:
            cpasync.prefetch_descriptor(tma_q)
            cpasync.prefetch_descriptor(tma_k)
            cpasync.prefetch_descriptor(tma_v)

        smem = cutlass.utils.SmemAllocator()
        storage = smem.allocate(self.shared_storage)
        pipes = self._make_pipelines(storage)
        sched = ClcScheduler.create(
            self.sched, TileSchedParams(shape.num_m_blocks, shape.section, shape.num_tiles),
            storage.mbar_clc.data_ptr(), storage.clc_response.data_ptr(), readers=self.threads)

        # Tensor memory: warp 0 allocates all 512 columns (one CTA per SM) and gives up the
        # permit at once; the address travels through shared memory across __syncthreads.
        if warp_idx == 0:
            cute.arch.alloc_tmem(self.TMEM_COLS, storage.tmem_holder.ptr, arch="sm_100")
            cute.arch.relinquish_tmem_alloc_permit()
        _tcgen05_fence_before()
        cute.arch.mbarrier_init_fence()
        cute.arch.sync_threads()
        _tcgen05_fence_after()

        smem_t = Smem(storage.sQ.get_tensor(layouts.sQ.outer, swizzle=layouts.sQ.inner),
                      storage.sK.get_tensor(layouts.sK.outer, swizzle=layouts.sK.inner),
                      storage.sV.get_tensor(layouts.sV.outer, swizzle=layouts.sV.inner))

        if warp_idx < self.MMA_WARP:
            tmem_ptr = cute.arch.retrieve_tmem_ptr(Float32, 16, storage.tmem_holder.ptr)
            self.softmax_warps(
                tidx, tiled_mma_qk, tiled_mma_pv, tmem_ptr, pipes, sched,
                Gmem(ptrs.o_ptr, ptrs.lse_ptr,
                     OStrides(strides.o_stride_s, strides.o_stride_h, strides.o_stride_b)),
                shape, softmax)
            # All softmax warps are done with tensor memory, and the MMA warp has issued its
            # last MMA (which the softmax warps saw complete): free it.
            pipeline.NamedBarrier(barrier_id=self.TMEM_FREE_BAR,
                                  num_threads=32 * (len(self.SOFTMAX_WARPS) + 1)).arrive_and_wait()
            _tcgen05_fence_after()
            if warp_idx == 0:
                cute.arch.dealloc_tmem(tmem_ptr, self.TMEM_COLS, arch="sm_100")
        if warp_idx == self.MMA_WARP:
            tmem_ptr = cute.arch.retrieve_tmem_ptr(Float32, 16, storage.tmem_holder.ptr)
            self.mma_warp(tiled_mma_qk, tiled_mma_pv, tmem_ptr, smem_t, layouts.tP, pipes,
                          sched, shape)
            _tcgen05_fence_before()
            pipeline.NamedBarrier(barrier_id=self.TMEM_FREE_BAR,
                                  num_threads=32 * (len(self.SOFTMAX_WARPS) + 1)).arrive()
        if warp_idx == self.LOAD_WARP:
            self.load_warp(TmaLoads(tma_q, tQ, tma_k, tK, tma_v, tV), tiled_mma_qk,
                           tiled_mma_pv, smem_t, pipes, sched, shape)
        if warp_idx == self.SCHED_WARP:
            if cutlass.const_expr(self.sched == CLC):
                sched.producer_loop()

    def _make_pipelines(self, storage) -> Pipes:
        """The five pipelines; barriers are initialized by warp 0 inside create() (one fence
        + __syncthreads follow in the kernel)."""
        one = pipeline.CooperativeGroup(pipeline.Agent.Thread, 1)
        softmax_threads = pipeline.CooperativeGroup(
            pipeline.Agent.Thread, 32 * len(self.SOFTMAX_WARPS))
        return Pipes(
            q=pipeline.PipelineTmaUmma.create(
                num_stages=1, producer_group=one, consumer_group=one, tx_count=self.q_bytes,
                barrier_storage=storage.mbar_q.data_ptr(), defer_sync=True),
            k=pipeline.PipelineTmaUmma.create(
                num_stages=self.kv_stages, producer_group=one, consumer_group=one,
                tx_count=self.k_bytes, barrier_storage=storage.mbar_k.data_ptr(),
                defer_sync=True),
            v=pipeline.PipelineTmaUmma.create(
                num_stages=self.kv_stages, producer_group=one, consumer_group=one,
                tx_count=self.v_bytes, barrier_storage=storage.mbar_v.data_ptr(),
                defer_sync=True),
            # S: MMA -> softmax (full: tcgen05.commit; empty: 128 softmax threads after
            # tcgen05.ld).
            s=pipeline.PipelineUmmaAsync.create(
                num_stages=self.S_STAGES, producer_group=one, consumer_group=softmax_threads,
                barrier_storage=storage.mbar_s.data_ptr(), defer_sync=True),
            # P: softmax -> MMA (full: 128 softmax threads after tcgen05.st and the O rescale;
            # empty: tcgen05.commit after PV, i.e. "PV done: O and P may be touched again").
            p=pipeline.PipelineAsyncUmma.create(
                num_stages=1, producer_group=softmax_threads, consumer_group=one,
                barrier_storage=storage.mbar_p.data_ptr(), defer_sync=True),
        )

    # ------------------------------------------------------------------ load warp
    @cute.jit
    def load_warp(self, loads: TmaLoads, tiled_mma_qk, tiled_mma_pv, smem: Smem, pipes: Pipes,
                  sched: ClcScheduler, shape: Shape):
        thr_qk = tiled_mma_qk.get_slice(0)
        thr_pv = tiled_mma_pv.get_slice(0)
        q_state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Producer, 1)
        kv_state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Producer, self.kv_stages)
        pipe_q, pipe_k, pipe_v = pipes.q, pipes.k, pipes.v
        tma_q, tQ, tma_k, tK, tma_v, tV = loads

        tile, sched_state = sched.first(), sched.init_state()
        while tile < sched.num_tiles:
            m_block, head, batch = sched.params.decode(tile, shape.num_heads)
            kv_head = head // shape.qhead_per_kvhead
            _, n_max = self.block_info.n_block_range(m_block, shape.seqlen_q, shape.seqlen_k)
            if n_max > 0:
                # (TILE_M, hd, RestM, 1) -> MMA partition -> TMA partition ((atom, rest), RestM, 1)
                gQ = cute.flat_divide(tQ[None, None, head, batch], (self.tile_m, self.hd))
                tQs, tQg = cpasync.tma_partition(
                    tma_q, 0, cute.make_layout(1),
                    cute.group_modes(smem.sQ, 0, 3), cute.group_modes(thr_qk.partition_A(gQ), 0, 3))
                gK = cute.flat_divide(tK[None, None, kv_head, batch], (self.tile_n, self.hd))
                tKs, tKg = cpasync.tma_partition(
                    tma_k, 0, cute.make_layout(1),
                    cute.group_modes(smem.sK, 0, 3), cute.group_modes(thr_qk.partition_B(gK), 0, 3))
                gV = cute.flat_divide(tV[None, None, kv_head, batch], (self.hd, self.tile_n))
                tVs, tVg = cpasync.tma_partition(
                    tma_v, 0, cute.make_layout(1),
                    cute.group_modes(smem.sV, 0, 3), cute.group_modes(thr_pv.partition_B(gV), 0, 3))

                pipe_q.producer_acquire(q_state)
                cute.copy(tma_q, tQg[None, m_block, 0], tQs[None, 0],
                          tma_bar_ptr=pipe_q.producer_get_barrier(q_state))
                q_state.advance()
                for i in cutlass.range(n_max, unroll=1):
                    n_block = n_max - 1 - i
                    pipe_k.producer_acquire(kv_state)
                    cute.copy(tma_k, tKg[None, n_block, 0], tKs[None, kv_state.index],
                              tma_bar_ptr=pipe_k.producer_get_barrier(kv_state))
                    pipe_v.producer_acquire(kv_state)
                    cute.copy(tma_v, tVg[None, 0, n_block], tVs[None, kv_state.index],
                              tma_bar_ptr=pipe_v.producer_get_barrier(kv_state))
                    kv_state.advance()
            tile, sched_state = sched.next(tile, sched_state)
        # Wait for the MMA warp's last tcgen05.commit arrivals on the empty barriers.
        pipe_q.producer_tail(q_state)
        pipe_k.producer_tail(kv_state.clone())
        pipe_v.producer_tail(kv_state)

    # ------------------------------------------------------------------ MMA warp
    @cute.jit
    def mma_warp(self, tiled_mma_qk, tiled_mma_pv, tmem_ptr, smem: Smem, tP_layout,
                 pipes: Pipes, sched: ClcScheduler, shape: Shape):
        thr_qk = tiled_mma_qk.get_slice(0)
        thr_pv = tiled_mma_pv.get_slice(0)
        tSrQ = thr_qk.make_fragment_A(smem.sQ)  # (MMA, MMA_M, MMA_K, 1)
        tSrK = thr_qk.make_fragment_B(smem.sK)  # (MMA, MMA_N, MMA_K, STAGES)
        tOrV = thr_pv.make_fragment_B(smem.sV)  # (MMA, MMA_N, MMA_K, STAGES)
        acc_S_layout = thr_qk.make_fragment_C(
            thr_qk.partition_shape_C((self.tile_m, self.tile_n))).layout
        acc_O_layout = thr_pv.make_fragment_C(
            thr_pv.partition_shape_C((self.tile_m, self.hd))).layout
        tOtO = cute.make_tensor(tmem_ptr + self.TMEM_O, acc_O_layout)
        # P as the tensor-memory A operand of PV: 16-bit, K-major, at column TMEM_P.
        tP = cute.make_tensor(tmem_ptr, tP_layout.outer)
        tOrP0 = thr_pv.make_fragment_A(tP)[None, None, None, 0]
        tOrP = cute.make_tensor(
            cute.recast_ptr(tmem_ptr + self.TMEM_P, dtype=tOrP0.element_type), tOrP0.layout)
        n_k_qk = cute.size(tSrQ, mode=[2])
        n_k_pv = cute.size(tOrP, mode=[2])

        q_state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Consumer, 1)
        k_state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Consumer, self.kv_stages)
        v_state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Consumer, self.kv_stages)
        s_state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Producer, self.S_STAGES)
        p_state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Consumer, 1)
        pipe_q, pipe_k, pipe_v, pipe_s, pipe_p = pipes

        tile, sched_state = sched.first(), sched.init_state()
        while tile < sched.num_tiles:
            m_block, head, batch = sched.params.decode(tile, shape.num_heads)
            _, n_max = self.block_info.n_block_range(m_block, shape.seqlen_q, shape.seqlen_k)
            if n_max > 0:
                pipe_q.consumer_wait(q_state)
                # S(0)
                tiled_mma_qk, k_state, s_state = self._issue_qk(
                    tiled_mma_qk, tmem_ptr, acc_S_layout, tSrQ, tSrK, n_k_qk,
                    pipe_k, pipe_s, k_state, s_state)
                if n_max == 1:
                    pipe_q.consumer_release(q_state)
                for i in cutlass.range(n_max, unroll=1):
                    # S(i+1) first: the tensor core works on it while softmax(i) runs.
                    if i + 1 < n_max:
                        tiled_mma_qk, k_state, s_state = self._issue_qk(
                            tiled_mma_qk, tmem_ptr, acc_S_layout, tSrQ, tSrK, n_k_qk,
                            pipe_k, pipe_s, k_state, s_state)
                        if i + 2 == n_max:
                            # Q's last reader has been issued; the commit frees Q when done.
                            pipe_q.consumer_release(q_state)
                    # O (+)= P(i) V(i)
                    tiled_mma_pv, v_state, p_state = self._issue_pv(
                        tiled_mma_pv, tOtO, tOrP, tOrV, n_k_pv, i > 0,
                        pipe_v, pipe_p, v_state, p_state)
                q_state.advance()
            tile, sched_state = sched.next(tile, sched_state)

    @cute.jit
    def _issue_qk(self, tiled_mma_qk, tmem_ptr, acc_S_layout, tSrQ, tSrK, n_k_qk,
                  pipe_k, pipe_s, k_state, s_state):
        pipe_k.consumer_wait(k_state)
        pipe_s.producer_acquire(s_state)
        _tcgen05_fence_after()
        tStS = cute.make_tensor(
            tmem_ptr + (self.TMEM_S0 + s_state.index * self.TMEM_S_STRIDE), acc_S_layout)
        for k in cutlass.range_constexpr(n_k_qk):
            tiled_mma_qk.set(tcgen05.Field.ACCUMULATE, k != 0)
            cute.gemm(tiled_mma_qk, tStS, tSrQ[None, None, k, 0],
                      tSrK[None, None, k, k_state.index], tStS)
        pipe_s.producer_commit(s_state)
        pipe_k.consumer_release(k_state)
        k_state.advance()
        s_state.advance()
        return tiled_mma_qk, k_state, s_state

    @cute.jit
    def _issue_pv(self, tiled_mma_pv, tOtO, tOrP, tOrV, n_k_pv, accumulate,
                  pipe_v, pipe_p, v_state, p_state):
        pipe_p.consumer_wait(p_state)
        pipe_v.consumer_wait(v_state)
        _tcgen05_fence_after()
        for k in cutlass.range_constexpr(n_k_pv):
            if cutlass.const_expr(k == 0):
                tiled_mma_pv.set(tcgen05.Field.ACCUMULATE, accumulate)
            else:
                tiled_mma_pv.set(tcgen05.Field.ACCUMULATE, True)
            cute.gemm(tiled_mma_pv, tOtO, tOrP[None, None, k],
                      tOrV[None, None, k, v_state.index], tOtO)
        pipe_v.consumer_release(v_state)
        # P empty = this PV (and every earlier MMA of this thread) completed.
        pipe_p.consumer_release(p_state)
        v_state.advance()
        p_state.advance()
        return tiled_mma_pv, v_state, p_state

    # ------------------------------------------------------------------ softmax warps
    @cute.jit
    def softmax_warps(self, tidx, tiled_mma_qk, tiled_mma_pv, tmem_ptr, pipes: Pipes,
                      sched: ClcScheduler, gmem: Gmem, shape: Shape, softmax: Softmax):
        """Per tile: for each key block, S row -> registers, mask, online softmax, O rescale,
        P -> tensor memory; then the epilogue (O, LSE to global memory)."""
        v = self._softmax_views(tidx, tiled_mma_qk, tiled_mma_pv, tmem_ptr)
        s_state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Consumer, self.S_STAGES)
        p_state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Producer, 1)
        pipe_s, pipe_p = pipes.s, pipes.p

        tile, sched_state = sched.first(), sched.init_state()
        while tile < sched.num_tiles:
            m_block, head, batch = sched.params.decode(tile, shape.num_heads)
            _, n_max = self.block_info.n_block_range(m_block, shape.seqlen_q, shape.seqlen_k)
            row0 = m_block * self.tile_m
            row = row0 + v.row_local
            # Columns >= limit are masked for this thread's row.
            _, limit = self.block_info.col_limits(row, 0, shape.seqlen_q, shape.seqlen_k)
            row_max = Float32(-Float32.inf)
            row_sum = Float32(0.0)
            for i in cutlass.range(n_max, unroll=1):
                col0 = (n_max - 1 - i) * self.tile_n
                s_state = self._load_s(v, pipe_s, s_state)
                # Mask only the blocks that reach the sequence end or the diagonal.
                if self.block_info.block_needs_mask(col0, row0, shape.seqlen_q, shape.seqlen_k):
                    mask_row(v.rS, cute.size(v.rS), lambda e: v.tSc[e][1], limit - col0,
                             branch_free=True)
                row_max, row_sum, rescale = online_softmax_row(
                    v.rS, cute.size(v.rS), row_max, row_sum, softmax.softmax_scale_log2, CHAINS4)
                v.rP16.store(v.rS.load().to(self.dtype))
                p_state = self._store_p(v, pipe_p, p_state, rescale, i > 0)

            inv, lse = finalize_row(row_max, row_sum, softmax.softmax_scale)
            # The runtime guarantees 16-byte aligned output strides (multiples of 8 elements).
            # (Attached here, not before the loop: a value the loop carries loses it.)
            o_row = gmem.o_ptr + gmem.o_strides.assume_aligned().offset(head, batch, row)
            self._store_o(v, pipe_p, p_state, n_max > 0, inv, o_row, row < shape.seqlen_q)
            if row < shape.seqlen_q:
                lse_t = cute.make_tensor(
                    gmem.lse_ptr + ((batch * shape.num_heads + head) * shape.seqlen_q + row),
                    cute.make_layout(1))
                lse_t[0] = lse
            _tcgen05_fence_before()

            tile, sched_state = sched.next(tile, sched_state)

    def _softmax_views(self, tidx, tiled_mma_qk, tiled_mma_pv, tmem_ptr) -> _SoftmaxViews:
        """Tensor-memory copies (tcgen05.ld/st 32x32b: thread t <-> lane/row t) and the
        register fragments of one softmax thread."""
        dt = self.dtype
        thr_qk = tiled_mma_qk.get_slice(0)
        thr_pv = tiled_mma_pv.get_slice(0)
        acc_S_layout = thr_qk.make_fragment_C(
            thr_qk.partition_shape_C((self.tile_m, self.tile_n))).layout
        acc_O_layout = thr_pv.make_fragment_C(
            thr_pv.partition_shape_C((self.tile_m, self.hd))).layout
        tStS = cute.make_tensor(tmem_ptr + self.TMEM_S0, acc_S_layout)
        cS = thr_qk.partition_C(cute.make_identity_tensor((self.tile_m, self.tile_n)))

        # S row -> registers: 32x32b, 32 columns per instruction, 4 instructions.
        ld_S = tcgen05.make_tmem_copy(
            cute.make_copy_atom(tcgen05.copy.Ld32x32bOp(tcgen05.copy.Repetition(32)), Float32),
            tStS)
        thr_ld_S = ld_S.get_slice(tidx)
        tSt = thr_ld_S.partition_S(tStS)
        tSc = thr_ld_S.partition_D(cS)
        rS = cute.make_rmem_tensor(tSc.shape, Float32)

        # P registers -> tensor memory: the 16-bit P row packed two per 32-bit column.
        p_cols = self.tile_n * dt.width // 32
        tStP = cute.make_tensor(
            tmem_ptr + self.TMEM_P, cute.composition(acc_S_layout, cute.make_layout((128, p_cols))))
        cP = cute.make_tensor(cS.iterator, cute.composition(cS.layout, cute.make_layout((128, p_cols))))
        st_P = tcgen05.make_tmem_copy(
            cute.make_copy_atom(tcgen05.copy.St32x32bOp(tcgen05.copy.Repetition(32)), Float32),
            tStP)
        thr_st_P = st_P.get_slice(tidx)
        tPt = thr_st_P.partition_D(tStP)
        rP = cute.make_rmem_tensor(thr_st_P.partition_S(cP).shape, Float32)
        rP16 = cute.make_tensor(cute.recast_ptr(rP.iterator, dtype=dt), rS.layout)

        # O row chunks of O_CHUNK columns, for the rescale and the epilogue.
        oc = self.O_CHUNK
        tOtO = cute.make_tensor(
            tmem_ptr + self.TMEM_O, cute.composition(acc_O_layout, cute.make_layout((128, oc))))
        cO_full = thr_pv.partition_C(cute.make_identity_tensor((self.tile_m, self.hd)))
        cO = cute.make_tensor(cO_full.iterator,
                              cute.composition(cO_full.layout, cute.make_layout((128, oc))))
        ld_O = tcgen05.make_tmem_copy(
            cute.make_copy_atom(tcgen05.copy.Ld32x32bOp(tcgen05.copy.Repetition(oc)), Float32),
            tOtO)
        st_O = tcgen05.make_tmem_copy(
            cute.make_copy_atom(tcgen05.copy.St32x32bOp(tcgen05.copy.Repetition(oc)), Float32),
            tOtO)
        thr_ld_O = ld_O.get_slice(tidx)
        thr_st_O = st_O.get_slice(tidx)
        tOt_ld = thr_ld_O.partition_S(tOtO)
        tOt_st = thr_st_O.partition_D(tOtO)
        tOc = thr_ld_O.partition_D(cO)
        rO = cute.make_rmem_tensor(tOc.shape, Float32)
        rO16 = cute.make_rmem_tensor(tOc.shape, dt)

        # Register e of an O chunk holds column e of the chunk (the 16-byte stores rely on it).
        for e in range(cute.size(tOc)):
            assert tOc[e][1] == e, "unexpected tcgen05.ld 32x32b register order"
        return _SoftmaxViews(ld_S, tSt, tSc, rS, st_P, tPt, rP, rP16, ld_O, st_O, tOt_ld, tOt_st,
                             rO, rO16, tSc[0][0])

    @cute.jit
    def _load_s(self, v: _SoftmaxViews, pipe_s, s_state):
        """S(i): tensor memory -> v.rS, then hand the S buffer back to the MMA warp."""
        pipe_s.consumer_wait(s_state)
        _tcgen05_fence_after()
        tSt_i = cute.make_tensor(v.tSt.iterator + s_state.index * self.TMEM_S_STRIDE,
                                 v.tSt.layout)
        cute.copy(v.ld_S, tSt_i, v.rS)
        cute.arch.fence_view_async_tmem_load()
        _tcgen05_fence_before()
        pipe_s.consumer_release(s_state)
        s_state.advance()
        return s_state

    @cute.jit
    def _store_p(self, v: _SoftmaxViews, pipe_p, p_state, rescale, rescale_o):
        """Wait for PV(i-1) (then O may be rescaled and P overwritten), rescale O when
        ``rescale_o`` and some row of the warp changed its max, write P (v.rP) to tensor
        memory and hand it to the MMA warp."""
        pipe_p.producer_acquire(p_state)
        _tcgen05_fence_after()
        if rescale_o:
            # tcgen05.ld/st are warp-collective: skip only if the whole warp may.
            if cute.arch.vote_any_sync(rescale != Float32(1.0)):
                for j in cutlass.range_constexpr(self.hd // self.O_CHUNK):
                    cute.copy(v.ld_O, self._o_chunk(v.tOt_ld, j), v.rO)
                    cute.arch.fence_view_async_tmem_load()
                    v.rO.store(v.rO.load() * rescale)
                    cute.copy(v.st_O, v.rO, self._o_chunk(v.tOt_st, j))
        cute.copy(v.st_P, v.rP, v.tPt)
        cute.arch.fence_view_async_tmem_store()
        _tcgen05_fence_before()
        pipe_p.producer_commit(p_state)
        p_state.advance()
        return p_state

    @cute.jit
    def _store_o(self, v: _SoftmaxViews, pipe_p, p_state, has_keys, inv, o_row, row_valid):
        """This thread's output row: O * inv from tensor memory (after the last PV), or zeros
        for a tile with no key block. The runtime guarantees 16-byte aligned output strides
        and data pointer: ``O_CHUNK`` columns = four 16-byte stores per chunk."""
        oc = self.O_CHUNK
        gO_row = cute.make_tensor(o_row, cute.make_layout(self.hd))
        rO16_flat = cute.make_tensor(v.rO16.iterator, cute.make_layout(oc))
        if has_keys:
            # PV(last) done (P empty); do not advance: the next tile's first acquire of
            # the same phase returns at once.
            pipe_p.producer_acquire(p_state)
            _tcgen05_fence_after()
            for j in cutlass.range_constexpr(self.hd // self.O_CHUNK):
                cute.copy(v.ld_O, self._o_chunk(v.tOt_ld, j), v.rO)
                cute.arch.fence_view_async_tmem_load()
                v.rO16.store((v.rO.load() * inv).to(self.dtype))
                if row_valid:
                    cute.autovec_copy(
                        rO16_flat, cute.make_tensor(gO_row.iterator + j * oc, cute.make_layout(oc)))
        else:
            # No key block: O = 0, LSE = -inf, no pipeline involved.
            v.rO16.fill(0.0)
            if row_valid:
                for j in cutlass.range_constexpr(self.hd // self.O_CHUNK):
                    cute.autovec_copy(
                        rO16_flat, cute.make_tensor(gO_row.iterator + j * oc, cute.make_layout(oc)))

    def _o_chunk(self, t, j: int):
        """Columns [j * O_CHUNK, (j + 1) * O_CHUNK) of a tensor-memory O partition."""
        return cute.make_tensor(t.iterator + j * self.O_CHUNK, t.layout)
