"""sm_90a forward, prefill kernels: Q by TMA, one or more tiles a CTA (single / static / steal),
tile indices fetched by a warp of their own (warp 1), varlen launches in dense or compact
order (``tile_sched.CompactVarlenOrder``), and the tile options of :class:`fa4_aot.configs.Tile`
(staged_store, o_buffer, edge_width, lazy_reference)."""

from __future__ import annotations

import cutlass
import cutlass.cute as cute
import cutlass.pipeline as pipeline
from cutlass import Int32
from cutlass.cute.nvgpu import cpasync

from fa4_aot.configs import KernelConfig
from fa4_aot.schedule import light_tiles_limit

from ..common import SEQ_VARLEN
from ..tile_sched import STATIC, TILE_SLOTS, CompactVarlenOrder
from .base import FlashFwdSm90Base
from .state import Ptrs, Shape, Strides


class FlashFwdSm90Prefill(FlashFwdSm90Base):
    fetcher_warp = True
    q_by_tma = True
    separate_kv = False
    runtime_softcap = False

    def __init__(self, cfg: KernelConfig):
        assert not cfg.decode, cfg.name
        super().__init__(cfg)
        # O written through this tile's Q buffer (free once the tile's last S wgmma is done;
        # released after the epilogue, so with one Q buffer the next tile's Q load waits for
        # it).
        self.staged_store = cfg.tile.staged_store
        # ... through a 64-row O buffer of its own that the MMA warpgroups take in turn
        # (``Tile.o_buffer``; the Q stage is then released before the epilogue).
        self.o_buffer = self.staged_store and cfg.tile.o_buffer
        # Tile.edge_width: the width a tile's first key block is cut to where its rows see no
        # more of it (0: never). Not in the softcap kernels: the second copy of the mainloop
        # makes the causal 176-key one spill (docs/design.md).
        self.edge_n = (cfg.tile.edge_width
                       if self.intra_wg_overlap and not self.softcap else 0)
        assert self.edge_n % 16 == 0 and self.edge_n < self.tile_n, cfg.tile
        # Tile.lazy_reference: bf16 P only (fp16 P overflows at 2^16, which a row sink's
        # usual margin reaches), kernels without softcap; its exact path reads K/V
        # through k_ptr / v_ptr, contiguous (non-paged) layouts.
        self.lazy_ref = (cfg.tile.lazy_reference and cfg.dtype == "bf16" and self.intra_wg_overlap
                         and not self.softcap)
        if self.lazy_ref and self.sched == "single":
            # One tile a CTA through static's tile loop (the single kernel's grid is the tile
            # count: the next tile, bid + grid, ends it). Compiled as a loop that provably runs
            # once, with the exact recomputation after it, ptxas serialises its wgmmas (C7511;
            # docs/design.md).
            self.sched = STATIC
        # Compact varlen order: light tiles of a causal document above which they go in head
        # sections (schedule.light_tiles_limit).
        self.compact = CompactVarlenOrder(
            self.sched, self.tile_m, self.causal,
            light_tiles_limit(self.tile_m, self.hd, self.dtype.width // 8))

    # ------------------------------------------------------------------ producer warp
    @cute.jit
    def producer(self, tma, smem, pipes, ptrs: Ptrs, strides: Strides, shape: Shape, totals):
        """Warp 0: per tile (from the slots) the TMA loads of Q and of the K/V blocks, last
        block first; then an arrival on :meth:`issued_barrier`."""
        tma_q, tQ, tma_k, tK, tma_v, tV = tma
        sQ, sK, sV, slots = smem
        pipe_q, pipe_k, pipe_v, pipe_tile = pipes
        cpasync.prefetch_descriptor(tma_k)
        cpasync.prefetch_descriptor(tma_v)
        cpasync.prefetch_descriptor(tma_q)
        q_state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Producer,
                                               self.q_stages)
        kv_state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Producer, self.kv_stages)
        # The tiles come from the fetcher warp.
        tile_state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Consumer,
                                                  TILE_SLOTS)
        tile = Int32(0)  # read from the slots at the top of every iteration
        running = cutlass.Boolean(True)
        while running:
            pipe_tile.consumer_wait(tile_state)
            tile, coords = self.get_tile(slots, tile_state.index)
            pipe_tile.consumer_release(tile_state)
            tile_state.advance()
            if tile >= shape.num_tiles:
                running = False
            else:
                t = self.tile_info(coords, ptrs, shape, totals)
                kv_head = t.head // shape.qhead_per_kvhead
                valid = t.m_block * self.tile_m < self.rows_of(t, shape)
                # varlen: shift the coordinate tensor to the document's first row.
                gQ = cute.local_tile(
                    cute.domain_offset((t.q_start, 0), tQ[None, None, t.head, t.q_b]),
                    (self.tile_m, self.hd), (t.m_block, 0))
                tQs, tQg = cpasync.tma_partition(
                    tma_q, 0, cute.make_layout(1),
                    cute.group_modes(sQ, 0, 2), cute.group_modes(gQ, 0, 2))
                if valid:
                    pipe_q.producer_acquire(q_state)
                    cute.copy(tma_q, tQg, tQs[None, q_state.index],
                              tma_bar_ptr=pipe_q.producer_get_barrier(q_state))
                    q_state.advance()


                n_min, n_max = self.n_block_range(t, shape)
                if not valid:
                    n_max = n_min
                gK = cute.local_tile(
                    cute.domain_offset((t.k_start, 0), tK[None, None, kv_head, t.k_b]),
                    (self.tile_n, self.hd), (None, 0))
                tKs, tKg = cpasync.tma_partition(
                    tma_k, 0, cute.make_layout(1),
                    cute.group_modes(sK, 0, 2), cute.group_modes(gK, 0, 2))
                gV = cute.local_tile(
                    cute.domain_offset((0, t.k_start), tV[None, None, kv_head, t.k_b]),
                    (self.hd, self.tile_n), (0, None))
                tVs, tVg = cpasync.tma_partition(
                    tma_v, 0, cute.make_layout(1),
                    cute.group_modes(sV, 0, 2), cute.group_modes(gV, 0, 2))
                for i in cutlass.range(n_max - n_min, unroll=1):
                    n_block = n_max - 1 - i
                    pipe_k.producer_acquire(kv_state)
                    cute.copy(tma_k, tKg[None, n_block], tKs[None, kv_state.index],
                              tma_bar_ptr=pipe_k.producer_get_barrier(kv_state))
                    pipe_v.producer_acquire(kv_state)
                    cute.copy(tma_v, tVg[None, n_block], tVs[None, kv_state.index],
                              tma_bar_ptr=pipe_v.producer_get_barrier(kv_state))
                    kv_state.advance()
                if cute.arch.lane_idx() == 0:
                    # This tile's loads are issued: the fetcher may take the next one.
                    cute.arch.mbarrier_arrive(self.issued_barrier(slots))

    @cute.jit
    def tile_fetcher(self, slots, pipe_tile, ptrs: Ptrs, shape: Shape, totals):
        """Warp 1 of the producer warpgroup: takes tile indices from the scheduler and hands
        them to the producer warp and the MMA warpgroups through the tile slots; the last one
        handed over is out of range (stop). Varlen launches with ``SeqMode.COMPACT`` (mostly
        empty grids) count only the ``total`` non-empty m-blocks: each index becomes the tile
        index the others decode (``CompactVarlenOrder.to_dense``). Other varlen launches skip
        the m-blocks past a document's end (skip_empty_tiles). A warp of its own: the
        producer warp has no registers to spare for this."""
        tile_state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Producer,
                                                  TILE_SLOTS)
        total = shape.num_tiles
        if self.compact.enabled(shape):
            total = self.compact.total(ptrs, shape, totals)
        sched = self.scheduler(ptrs, shape, total)
        c = sched.first()
        if self.compact.enabled(shape):
            if c >= total:  # every CTA makes its one fetch past the end (counter reset)
                c, _ = sched.next(c)
        doc, doc_base, nb = Int32(0), Int32(0), Int32(0)
        if self.compact.enabled(shape):
            nb = self.compact.doc_m_blocks(doc, ptrs, shape, totals)
        issued_phase = Int32(0)
        running = cutlass.Boolean(True)
        while running:
            tile = c
            if self.compact.enabled(shape):
                tile, doc, doc_base, nb = self.compact.to_dense(c, total, doc, doc_base, nb, ptrs,
                                                                shape, totals)
            elif shape.seq_mode & SEQ_VARLEN != 0:
                tile = self.skip_empty_tiles(c, ptrs, shape)
                c = tile
            self.hand_over(pipe_tile, tile_state, slots, tile, shape)
            tile_state.advance()
            if tile >= shape.num_tiles:
                running = False
            else:
                # Take the next tile once the producer warp has issued this one's loads: the
                # CTA claims one tile ahead, not two (docs/design.md: slower on causal
                # launches, and a long tail on the compact order, whose head sections restart
                # at the heaviest m-block).
                cute.arch.mbarrier_wait(self.issued_barrier(slots), issued_phase)
                issued_phase = issued_phase ^ 1
                c, _ = sched.next(c)

