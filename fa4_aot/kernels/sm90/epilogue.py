"""Epilogues of the sm_90a forward kernels: O normalised by the row sum, the LSE, and their
stores to out/lse (from registers, or staged through shared memory in whole 16-byte chunks).
Rows past the tile's sequence end are never written."""

from __future__ import annotations

import cutlass
import cutlass.cute as cute
from cutlass import Float32, Int32, Int64

from .ptx import (acc_mn_view, frag_row, ld_v4, opaque_u32, st_global_v4, st_shared_u32,
                  swizzled_offset)
from .state import Frags, Ptrs, Shape, Softmax, Strides, TileInfo


class Epilogue:
    """Mixin of the sm_90a kernel base: the epilogue and its stores. ``row_target`` and
    ``store`` are the hooks a kernel class overrides (packed GQA rows, split-KV partials)."""

    @cute.jit
    def epilogue(self, tidx, f: Frags, t: TileInfo, ptrs: Ptrs, strides: Strides, shape: Shape,
                 softmax: Softmax, stage=None):
        """O /= row sum; LSE = max * scale + log(sum) (or -inf for rows that saw no key).
        Then :meth:`store` writes O and the LSE (``stage``: see :meth:`store_out_staged`)."""
        acc_O_mn = f.acc_O_mn
        n_rows = cute.size(acc_O_mn, mode=[0])
        lse_vals = []
        for r in cutlass.range_constexpr(n_rows):
            total = f.row_sum[r]
            total = total + cute.arch.shuffle_sync_bfly(total, offset=1)
            total = total + cute.arch.shuffle_sync_bfly(total, offset=2)
            inv = Float32(0.0)
            lse = -Float32.inf
            if total > 0.0:
                inv = cute.arch.rcp_approx(total)
                lse = f.row_max[r] * softmax.softmax_scale + cute.math.log(total, fastmath=True)
            if cutlass.const_expr(self.o_descale):  # FP8 kernels: times the tile's v_descale
                inv = inv * f.conv[1]
            for c in cutlass.range_constexpr(cute.size(acc_O_mn, mode=[1])):
                acc_O_mn[r, c] = acc_O_mn[r, c] * inv
            lse_vals.append(lse)
        self.store(tidx, f, t, lse_vals, ptrs, strides, shape, stage)

    @cute.jit
    def store(self, tidx, f: Frags, t: TileInfo, lse_vals, ptrs: Ptrs, strides: Strides,
              shape: Shape, stage):
        """Normalised O and the LSE to out/lse: with ``staged_store`` through shared memory
        (:meth:`store_out_staged`), else from registers (:meth:`store_out`)."""
        if cutlass.const_expr(self.staged_store):
            self.store_out_staged(tidx, f, t, lse_vals, ptrs, strides, shape, stage)
        else:
            self.store_out(tidx, f, t, lse_vals, ptrs, strides, shape)

    @cute.jit
    def row_target(self, tidx, r, t: TileInfo, shape: Shape):
        """(query row inside the batch entry, head) of accumulator row ``r`` of this thread."""
        rr = t.m_block * self.tile_m + frag_row(tidx, r)
        return rr, t.head

    @cute.jit
    def store_out(self, tidx, f: Frags, t: TileInfo, lse_vals, ptrs: Ptrs, strides: Strides,
                  shape: Shape):
        rO = cute.make_rmem_tensor(f.acc_O.layout, self.dtype)
        rO.store(f.acc_O.load().to(self.dtype))
        # Adjacent columns pairs (c, c+1) sit next to each other in the fragment: store them as
        # one 32-bit word. The runtime guarantees 16-byte aligned output strides: tell the
        # compiler, so the 32-bit stores stay 32-bit.
        rO32 = cute.recast_tensor(rO, cutlass.Uint32)
        o_stride_s = cute.assume(strides.o_stride_s, divby=8)
        o_stride_h = cute.assume(strides.o_stride_h, divby=8)
        o_stride_b = cute.assume(strides.o_stride_b, divby=8)
        rO32_mn = acc_mn_view(rO32)  # (2 rows, hd/8 column pairs)
        n_pairs = cute.size(rO32_mn, mode=[1])
        for r in cutlass.range_constexpr(cute.size(rO32_mn, mode=[0])):
            s, head = self.row_target(tidx, r, t, shape)
            if s < t.sq:
                self.store_lse(tidx, s, head, t, lse_vals[r], ptrs, strides)
                # One base pointer per row; the pairs sit at constant offsets from it (so the
                # compiler folds them into the stores instead of keeping one address per value).
                o_off = (Int64(head) * o_stride_h + Int64(t.batch) * o_stride_b
                         + Int64(t.q_start + s) * o_stride_s)
                row_ptr = cute.recast_ptr(ptrs.o_ptr + o_off, dtype=cutlass.Uint32)
                gRow = cute.make_tensor(row_ptr + (tidx % 4), cute.make_layout(n_pairs, stride=4))
                for j in cutlass.range_constexpr(n_pairs):
                    gRow[j] = rO32_mn[r, j]

    @cute.jit
    def store_lse(self, tidx, s, head, t: TileInfo, lse, ptrs: Ptrs, strides: Strides):
        """The LSE of query row ``s`` of ``head``, by one thread of the row's quad."""
        if tidx % 4 == 0:
            lse_off = (Int64(head) * strides.lse_stride_h
                       + Int64(t.batch) * strides.lse_stride_b + Int64(t.q_start + s))
            cute.make_tensor(ptrs.lse_ptr + lse_off, cute.make_layout(1))[0] = lse

    @cute.jit
    def store_out_staged(self, tidx, f: Frags, t: TileInfo, lse_vals, ptrs: Ptrs,
                         strides: Strides, shape: Shape, stage):
        """``store_out`` through shared memory (``Tile.staged_store``): each MMA warpgroup
        writes its 64 rows of O (16-bit) into shared memory, syncs its 128 threads, then copies
        whole 16-byte chunks of rows to global memory: each store instruction writes two to
        four full 128-byte lines instead of eight 16-byte pieces of eight rows (``store_out``:
        four times the store requests, at the tile's end, through the MIO queue that the other
        warpgroups' exponentials use). Rows past the tile's sequence end are not written, as in
        ``store_out``; the values are the same. Plain 32-bit shared stores, not stmatrix: its
        ``.aligned`` form makes ptxas add convergence barriers all over the kernel, and the
        producer warp spills (docs/design.md).

        ``stage`` is ``(q_base,)``: the warpgroup's own rows of this tile's Q stage at shared
        address ``q_base`` (its last S wgmma has completed, and no other warpgroup reads those
        rows); or, with ``Tile.o_buffer``, ``(o_base, mbar_o, phase)``: the 64-row O buffer at
        ``o_base``, which the warpgroups take in turn — warpgroup ``w`` waits for ``mbar_o[w]``
        (completed by the warpgroup before it in the ring, or at once for warpgroup 0's first
        tile) and, once its rows are read back, arrives on ``mbar_o[w + 1]``. ``phase`` is the
        parity of the warpgroup's epilogues so far. mbarriers, not a named barrier's
        arrive/sync: compute-sanitizer's racecheck models the mbarrier hand-over (it reports
        the named-barrier one as a hazard; docs/design.md)."""
        wg = self.mma_wg(tidx)
        # The thread's addresses computed here, not hoisted out of the tile loop into registers
        # that the whole mainloop would carry.
        tidx = opaque_u32(tidx)
        lt = tidx % 128
        lane = tidx % 32
        base = stage[0]
        buf_rows, row_off = self.tile_m, 0  # the Q stage: rows as in the tile
        if cutlass.const_expr(self.o_buffer):
            buf_rows, row_off = 64, wg * 64  # the O buffer: the warpgroup's rows 0..63
        rO = cute.make_rmem_tensor(f.acc_O.layout, self.dtype)
        rO.store(f.acc_O.load().to(self.dtype))
        rO32_mn = acc_mn_view(cute.recast_tensor(rO, cutlass.Uint32))  # (2 rows, hd/8 pairs)
        if cutlass.const_expr(self.o_buffer):
            mbar_o, phase = stage[1], stage[2]
            # Epilogue k of warpgroup w > 0 waits for phase k of mbar_o[w] (warpgroup w - 1's
            # epilogue k); warpgroup 0's for phase k - 1 of mbar_o[0] (the last warpgroup's
            # epilogue k - 1; for k = 0 the fresh barrier's "previous" phase: at once).
            cute.arch.mbarrier_wait(mbar_o + wg, phase ^ (Int32(1) - cutlass.min(wg, Int32(1))))
        if cutlass.const_expr(self.q_stages == 1 or self.o_buffer):
            # One buffer: the warpgroup's reads of it in its previous tile (the copy-out
            # below) come before these writes. (With two Q stages, the other stage's epilogue
            # between them has this barrier.)
            cute.arch.barrier(barrier_id=4 + wg, number_of_threads=128)
        # Each pair (c, c+1) of accumulator row r as one 32-bit word at (row, 8j + 2 (lane % 4)):
        # in a store instruction the warp's eight rows of a pair column fall in eight
        # different 16-byte bank groups (the swizzle), so every store is one wavefront.
        srow = frag_row(tidx, 0) - row_off  # row 0; row 1 is 8 rows down (same swizzle phase)
        rb = self.q_row_bytes
        k = rb // 16
        for j in cutlass.range_constexpr(self.hd // 8):
            addr = base + swizzled_offset(srow, j % k, j // k, buf_rows, rb) + 4 * (lane % 4)
            for r in cutlass.range_constexpr(2):
                st_shared_u32(addr + r * 8 * rb, rO32_mn[r, j])
        for r in cutlass.range_constexpr(2):
            s, head = self.row_target(tidx, r, t, shape)
            if s < t.sq:
                self.store_lse(tidx, s, head, t, lse_vals[r], ptrs, strides)
        cute.arch.barrier(barrier_id=4 + wg, number_of_threads=128)
        # The warpgroup's 64 rows are 64 * hd / 8 chunks of 16 bytes; thread lt copies chunks
        # lt, lt + 128, ... (row = chunk // (hd / 8)).
        chunks = self.hd // 8
        o_stride_s = cute.assume(strides.o_stride_s, divby=8)
        o_stride_h = cute.assume(strides.o_stride_h, divby=8)
        o_stride_b = cute.assume(strides.o_stride_b, divby=8)
        items = [((lt + 128 * i) // chunks, (lt + 128 * i) % chunks)
                 for i in range(64 * chunks // 128)]  # (row of the warpgroup's 64, chunk)
        # All reads first (their latencies overlap), then the stores.
        words = [ld_v4(base + swizzled_offset(wg * 64 - row_off + row, ch % k, ch // k,
                                              buf_rows, rb))
                 for row, ch in items]
        if cutlass.const_expr(self.o_buffer):
            # The reads are done (their values are in registers): the next warpgroup's turn.
            cute.arch.mbarrier_arrive(mbar_o + (wg + 1) % self.num_mma_wg)
        s0 = t.m_block * self.tile_m + wg * 64
        addr = ptrs.o_ptr.toint() + 2 * (Int64(t.head) * o_stride_h + Int64(t.batch) * o_stride_b
                                         + Int64(t.q_start + s0) * o_stride_s)
        for i in cutlass.range_constexpr(len(items)):
            row, ch = items[i]
            if s0 + row < t.sq:
                st_global_v4(addr + 2 * (Int64(row) * o_stride_s + Int64(ch * 8)), words[i])
        if cutlass.const_expr(not self.o_buffer):
            # The producer's next TMA load into this Q stage comes after the release (async
            # proxy after these generic reads).
            cute.arch.fence_view_async_shared()
