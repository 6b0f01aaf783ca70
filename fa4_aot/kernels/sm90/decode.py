"""sm_90a forward, decode kernels (``cfg.decode``): packed GQA, split-KV, paged KV.

* packed GQA: the ``g = qhead_per_kvhead`` query heads of one KV head share an m tile; packed
  row ``R`` is query row ``R // g`` of head ``kv_head * g + R % g``. Tiles are counted per KV
  head, so K and V are read once per KV head. Q is loaded by the MMA warpgroups themselves
  with 16-byte cp.async (the packed rows are not one TMA box);
* split-KV: a tile's key blocks are cut into ``num_splits`` contiguous ranges, one tile index
  each; with ``num_splits > 1`` every tile writes its normalised fp32 O and its LSE to the
  partial buffers and ``combine.py`` merges them;
* paged KV (``page_size != 0``): K and V come in TMA boxes of ``kv_box_rows`` keys, each from
  its page (``page_table``);
* softcap is a run-time value (``softcap_pre != 0``);
* the producer warp fetches the tiles itself (no fetcher warp; no compact varlen order);
  packed q (``SeqMode.VARLEN``) and packed k/v (``SeqMode.VARLEN_K``) are separate modes."""

from __future__ import annotations

import cutlass
import cutlass.cute as cute
import cutlass.pipeline as pipeline
from cutlass import Int32, Int64
from cutlass.cute.nvgpu import cpasync

from fa4_aot.abi import KV_CHUNK
from fa4_aot.configs import KernelConfig
from fa4_aot.schedule import decode_tile

from ..common import SEQ_VARLEN
from ..tile_sched import TILE_SLOTS
from .base import FlashFwdSm90Base
from .ptx import frag_row, in_order, swapped
from .state import Frags, Ptrs, Shape, Strides, TileInfo


class FlashFwdSm90Decode(FlashFwdSm90Base):
    fetcher_warp = False
    q_by_tma = False
    separate_kv = True
    runtime_softcap = True

    def __init__(self, cfg: KernelConfig):
        assert cfg.decode, cfg.name
        super().__init__(cfg)
        self.q_stages = 1  # the Q buffer the MMA warpgroups fill

    # ------------------------------------------------------------------ tiles (packed GQA)
    @cute.jit
    def tile_coords(self, tile, shape: Shape):
        """Tile index -> (m_block, KV head, batch, split); the split index is folded into the
        batch index (batch-major)."""
        m_block, head, bs = decode_tile(tile, shape.num_m_blocks,
                                        shape.num_heads // shape.qhead_per_kvhead,
                                        shape.section)
        batch = bs // shape.num_splits
        return m_block, head, batch, bs - batch * shape.num_splits

    def packed_rows(self, rows, shape: Shape):
        """Tile rows of ``rows`` query rows: one per query head of the group."""
        return rows * shape.qhead_per_kvhead

    def query_row(self, row, shape: Shape):
        """Query row of packed row ``row``."""
        return row // shape.qhead_per_kvhead

    @cute.jit
    def seq_rows(self, row0, shape: Shape):
        """First and last query row of the tile's m-block (packed rows / group)."""
        return row0 // shape.qhead_per_kvhead, (row0 + self.tile_m - 1) // shape.qhead_per_kvhead

    def split_range(self, n_min, n_max, t: TileInfo, shape: Shape):
        """Split-KV: the tile's split of key blocks [n_min, n_max)."""
        per = (n_max - n_min + shape.num_splits - 1) // shape.num_splits
        n_min = cutlass.min(n_min + t.split * per, n_max)
        n_max = cutlass.min(n_min + per, n_max)
        return n_min, n_max

    def tma_kv_rows(self):
        """Keys per TMA box of K and V: KV_CHUNK (a block is loaded in boxes, paged or not)."""
        return KV_CHUNK

    @cute.jit
    def row_target(self, tidx, r, t: TileInfo, shape: Shape):
        """(query row inside the batch entry, head) of accumulator row ``r`` of this thread."""
        rr = t.m_block * self.tile_m + frag_row(tidx, r)
        s = rr // shape.qhead_per_kvhead
        return s, t.head * shape.qhead_per_kvhead + (rr - s * shape.qhead_per_kvhead)

    # ------------------------------------------------------------------ producer warp
    @cute.jit
    def producer(self, tma, smem, pipes, ptrs: Ptrs, strides: Strides, shape: Shape, totals):
        """Warp 0: fetches the tiles and hands them over (:meth:`hand_over`), then issues each
        tile's K and V loads (Q: :meth:`load_q_packed`, by the MMA warpgroups)."""
        _, _, tma_k, tK, tma_v, tV = tma
        _, sK, sV, slots = smem
        _, pipe_k, pipe_v, pipe_tile = pipes
        cpasync.prefetch_descriptor(tma_k)
        cpasync.prefetch_descriptor(tma_v)
        kv_state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Producer, self.kv_stages)
        # This warp fetches the tiles itself and hands them on (after issuing a tile's loads,
        # so the fetch's latency stays hidden).
        tile_state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Producer,
                                                  TILE_SLOTS)
        sched = self.scheduler(ptrs, shape)
        tile = sched.first()
        running = cutlass.Boolean(True)
        while running:
            if shape.seq_mode & SEQ_VARLEN != 0:
                tile = self.skip_empty_tiles(tile, ptrs, shape)
            coords = self.hand_over(pipe_tile, tile_state, slots, tile, shape)
            tile_state.advance()
            if tile >= shape.num_tiles:
                running = False
            else:
                t = self.tile_info(coords, ptrs, shape, totals)
                kv_head = t.head  # packed GQA: tiles are counted per KV head
                valid = t.m_block * self.tile_m < self.rows_of(t, shape)
                n_min, n_max = self.n_block_range(t, shape)
                if not valid:
                    n_max = n_min
                # Paged KV: lane c holds the page and the row of box c of a block, looked
                # up one block ahead (the table read's latency stays off the issue path);
                # K and V share them.
                page_nxt, row_nxt = self.block_pages(n_max - 1, t, ptrs, strides, shape)
                for i in cutlass.range(n_max - n_min, unroll=1):
                    n_block = n_max - 1 - i
                    page = (page_nxt, row_nxt)
                    page_nxt, row_nxt = self.block_pages(n_block - 1, t, ptrs, strides,
                                                         shape)
                    loads = ((tma_k, tK, sK, pipe_k.producer_get_barrier(kv_state)),
                             (tma_v, tV, sV, pipe_v.producer_get_barrier(kv_state)))
                    where = (n_block, kv_state.index, t, kv_head, page, shape)
                    if self.merged_kv_loads(shape):
                        pipe_k.producer_acquire(kv_state)
                        pipe_v.producer_acquire(kv_state)
                        self.load_kv_boxes(loads, (True, True), where)
                    else:
                        pipe_k.producer_acquire(kv_state)
                        self.load_kv_boxes(loads, (True, False), where)
                        pipe_v.producer_acquire(kv_state)
                        self.load_kv_boxes(loads, (False, True), where)
                    kv_state.advance()
                # The next tile, once this tile's loads are issued: the consumers are still
                # kv_stages blocks behind, so the atomic's latency stays hidden.
                tile, _ = sched.next(tile)


    @cute.jit
    def block_pages(self, n_block, t: TileInfo, ptrs: Ptrs, strides: Strides, shape: Shape):
        """Paged KV: lane ``c`` of the producer warp gets (page, row in the page) of TMA box
        ``c`` (``kv_box_rows`` keys) of key block ``n_block``: ``page_table[batch, key //
        page_size]``, ``key % page_size`` (the column clamped into the table; a page index
        outside the cache makes TMA fill zeros, never read outside k/v). Contiguous K/V:
        (``k_b``, 0)."""
        page = t.k_b
        row = Int32(0)
        if shape.page_size != 0:
            c = cutlass.min(cute.arch.lane_idx(), Int32(self.tile_n) // shape.kv_box_rows - 1)
            key = cutlass.max(n_block * self.tile_n + c * shape.kv_box_rows, Int32(0))
            col = key // shape.page_size
            row = key - col * shape.page_size
            col = cutlass.min(col, shape.pages_per_seq - 1)
            page = cute.make_tensor(
                ptrs.page_table + (Int64(t.batch) * strides.page_table_stride + Int64(col)),
                cute.make_layout(1))[0]
        return page, row

    def merged_kv_loads(self, shape: Shape):
        """Paged KV in the decode kernels with 3+ stages: one pass over the boxes for K and V
        (one page shuffle and one set of coordinates per box instead of two), both stages
        acquired first: the producer warp's issue rate is the limit there (docs/design.md).
        With 2 stages, waiting for the V slot (released a block later than K's) before issuing
        K delays K (docs/design.md), so 2-stage kernels issue K and V in separate passes."""
        if cutlass.const_expr(self.kv_stages >= 3):
            return shape.page_size != 0
        return False

    @cute.jit
    def load_kv_boxes(self, loads, which: cutlass.Constexpr, where):
        """Decode kernels: key block ``n_block`` of K and/or V (``which``) in TMA boxes of
        ``kv_box_rows`` keys (one box per block for contiguous K/V; with paged KV boxes that
        never cross a page), each from its own place: contiguous rows ``k_start + key`` of
        batch entry ``k_b``, or with paged KV (``page_size != 0``) the (page, row) that lane
        ``c`` of ``pages`` holds for box ``c`` (:meth:`block_pages`). The stage is laid out in
        KV_CHUNK-key pieces, each swizzle panel holding all keys of the block, so a box of
        kv_box_rows keys issued at piece ``c * kv_box_rows / KV_CHUNK`` fills exactly its
        pieces (the descriptor's box sets the rows moved; the instruction names only its first
        piece)."""
        n_block, stage, t, kv_head, (pages, rows), shape = where
        box = shape.kv_box_rows
        step = box // KV_CHUNK
        for c in cutlass.range(Int32(self.tile_n) // box, unroll=1):
            row = t.k_start + n_block * self.tile_n + c * box
            page = pages
            if shape.page_size != 0:
                row = cute.arch.shuffle_sync(rows, c)
                page = cute.arch.shuffle_sync(pages, c)
            for is_v in cutlass.range_constexpr(2):
                if cutlass.const_expr(which[is_v]):
                    tma, tX, sX, bar = loads[is_v]
                    # K is (keys, d); V is seen as (d, keys): the same box, coordinates swapped.
                    kd = swapped if is_v == 1 else in_order
                    g = cute.local_tile(
                        cute.domain_offset(kd(row, 0), tX[None, None, kv_head, page]),
                        kd(KV_CHUNK, self.hd), (0, 0))
                    sc = cute.local_tile(sX[None, None, stage], kd(KV_CHUNK, self.hd),
                                         kd(c * step, 0))
                    ts, tg = cpasync.tma_partition(tma, 0, cute.make_layout(1),
                                                   cute.group_modes(sc, 0, 2),
                                                   cute.group_modes(g, 0, 2))
                    cute.copy(tma, tg, ts, tma_bar_ptr=bar)

    # ------------------------------------------------------------------ MMA warpgroups
    def acquire_q(self, tidx, sQ, pipe_q, q_state, t: TileInfo, ptrs: Ptrs, strides: Strides,
                  shape: Shape, f: Frags):
        """This tile's Q in shared memory: loaded by the warpgroup (:meth:`load_q_packed`)."""
        self.load_q_packed(tidx, sQ, t, ptrs, strides, shape, f)

    def copy_q_chunk(self, g2s, ptrs: Ptrs, off, dst, f: Frags):
        """Eight elements of q at element offset ``off`` into ``dst`` (shared memory): one
        16-byte cp.async."""
        src = cute.make_tensor(ptrs.q_ptr + off, cute.make_layout(8))
        cute.copy(g2s, src, dst)

    @cute.jit
    def load_q_packed(self, tidx, sQ, t: TileInfo, ptrs: Ptrs, strides: Strides, shape: Shape,
                      f: Frags):
        """The warpgroup copies its 64 packed rows of Q into shared memory with
        16-byte cp.async (all in flight at once; rows past the tile's end are zero), waits for
        them and makes them visible to wgmma. Its previous tile's wgmmas have completed (the
        mainloop ends on wait_group(0))."""
        g = shape.qhead_per_kvhead
        wg = self.mma_wg(tidx)
        lt = tidx % 128
        chunks = self.hd // 8  # 16-byte chunks per row
        # Thread lt copies chunk lt % chunks of rows lt // chunks, + step, + 2 step, ... of the
        # warpgroup's 64 (the threads past step * chunks idle when chunks does not divide 128).
        # The row's (query row, head) advance without a division per copy: these copies run
        # on the MMA warpgroups' issue slots (docs/design.md).
        step = 128 // chunks
        ch = lt % chunks
        r = lt // chunks
        if lt >= step * chunks:
            r = Int32(64)  # idle
        q_s = cute.assume(strides.q_stride_s, divby=8)
        q_h = cute.assume(strides.q_stride_h, divby=8)
        q_b = cute.assume(strides.q_stride_b, divby=8)
        base = (Int64(t.batch) * q_b + Int64(t.q_start) * q_s + Int64(t.head * g) * q_h
                + Int64(ch * 8))
        rows_valid = t.sq * g
        rr = t.m_block * self.tile_m + wg * 64 + r
        s_row = rr // g
        h_row = rr - s_row * g
        ds = step // g
        dh = step - ds * g
        sQ2 = sQ[None, None, 0]
        g2s = cute.make_copy_atom(cpasync.CopyG2SOp(), self.dtype, num_bits_per_copy=128)
        # A run-time loop: unrolled, the per-iteration addresses are hoisted out of the tile
        # loop and spill at head_dim 256.
        for _ in cutlass.range((64 + step - 1) // step, unroll=1):
            if r < 64:
                dst = cute.local_tile(sQ2, (1, 8), (wg * 64 + r, ch))[0, None]
                if rr < rows_valid:
                    off = cute.assume(base + Int64(s_row) * q_s + Int64(h_row) * q_h, divby=8)
                    self.copy_q_chunk(g2s, ptrs, off, dst, f)
                else:
                    zeros = cute.make_rmem_tensor(cute.make_layout(8), self.dtype)
                    zeros.fill(0.0)
                    cute.autovec_copy(zeros, dst)
            r = r + step
            rr = rr + step
            s_row = s_row + ds
            h_row = h_row + dh
            if h_row >= g:
                h_row = h_row - g
                s_row = s_row + 1
        cute.arch.cp_async_commit_group()
        cute.arch.cp_async_wait_group(0)
        cute.arch.fence_view_async_shared()
        cute.arch.barrier(barrier_id=3 + wg, number_of_threads=128)

    @cute.jit
    def store(self, tidx, f: Frags, t: TileInfo, lse_vals, ptrs: Ptrs, strides: Strides,
              shape: Shape, stage):
        """With num_splits > 1 to the fp32 partial buffers for the combine kernel, else to
        out/lse."""
        if shape.num_splits > 1:
            self.store_partial(tidx, f, t, lse_vals, ptrs, shape)
        else:
            self.store_out(tidx, f, t, lse_vals, ptrs, strides, shape)

    @cute.jit
    def store_partial(self, tidx, f: Frags, t: TileInfo, lse_vals, ptrs: Ptrs, shape: Shape):
        """Split-KV: normalised fp32 O to oacc (num_splits, acc_rows, heads, d) and the LSE to
        lseacc (num_splits, acc_rows, heads); acc row = batch * seqlen_q + row (dense) or
        q_start + row (varlen)."""
        acc_O_mn = f.acc_O_mn
        n_cols = cute.size(acc_O_mn, mode=[1])
        row_base = t.batch * shape.seqlen_q
        if shape.seq_mode & SEQ_VARLEN != 0:
            row_base = t.q_start
        for r in cutlass.range_constexpr(cute.size(acc_O_mn, mode=[0])):
            s, head = self.row_target(tidx, r, t, shape)
            if s < t.sq:
                n = ((Int64(t.split) * shape.acc_rows + Int64(row_base + s)) * shape.num_heads
                     + Int64(head))
                if tidx % 4 == 0:
                    cute.make_tensor(ptrs.lseacc_ptr + n, cute.make_layout(1))[0] = lse_vals[r]
                gRow = cute.make_tensor(ptrs.oacc_ptr + (n * self.hd + Int64(2 * (tidx % 4))),
                                        cute.make_layout((2, n_cols // 2), stride=(1, 8)))
                for c in cutlass.range_constexpr(n_cols):
                    gRow[c % 2, c // 2] = acc_O_mn[r, c]
