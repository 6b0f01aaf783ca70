"""The MMA warpgroups' mainloop of the sm_90a forward kernels: per key block S = Q K^T, the
softmax of S in registers, O += P V, with intra-warpgroup overlap and ping-pong between the
MMA warpgroups.

Key blocks are visited from the last to the first, so the blocks that need the causal or the
sequence-end mask come first and the rest run unmasked. Hooks the kernel classes provide:
``seq_rows``, ``query_row`` (the query row of a tile row), ``runtime_softcap`` (class
attribute: softcap as a run-time value, ``softcap_pre != 0``)."""

from __future__ import annotations

import cutlass
import cutlass.cute as cute
import cutlass.utils.hopper_helpers as sm90_utils
from cutlass import Float32, Int32, Uint32
from cutlass.cute.nvgpu import warpgroup

from ..common import RowView, mask_row, online_softmax_row, warp_needs_rescale
from .ptx import cvt_pair_pinned, frag_col_static, frag_row, tanh_approx
from .state import Frags, Shape, Softmax, TileInfo


class Mainloop:
    """Mixin of the sm_90a kernel base: the mainloop and the per-block steps."""

    @cute.jit
    def mainloop(self, tidx, f: Frags, pipes, k_state, v_state, t: TileInfo, n_range,
                 shape: Shape, softmax: Softmax, trim: cutlass.Constexpr = False,
                 single: cutlass.Constexpr = False):
        """Key blocks n_max-1 down to n_min for one m-tile; returns the advanced K/V states.
        ``trim`` (Tile.edge_width): the first block's S and PV wgmmas cover only its first
        ``edge_n`` columns (the caller has checked that no row of the tile sees more; the
        other columns of S hold -inf, their P is 0); ``single``: the tile has that one key
        block (else at least two)."""
        pipe_k, pipe_v = pipes
        n_min, n_max = n_range
        wg = self.mma_wg(tidx)
        row0 = t.m_block * self.tile_m
        scale_log2 = softmax.softmax_scale_log2
        if cutlass.const_expr(self.intra_wg_overlap):
            if n_max > n_min:
                # First (last-in-sequence) block: always masked.
                self.qk_alone(wg, f, pipe_k, k_state, trim)
                k_state.advance()
                self.apply_softcap(f.acc_S_mn, softmax.softcap_pre)
                self.apply_mask(f.acc_S_mn, tidx, (n_max - 1) * self.tile_n, row0, t, shape)
                self.online_softmax(f, scale_log2)
                self.convert_p(f)
                # The other blocks (n_max - 2 down to n_min) in three runs: those that need
                # the mask near the diagonal / sequence end, the unmasked steady state (its own
                # loop without the mask test, so ptxas schedules the row max ahead of the wait
                # for the PV wgmma; docs/design.md), those below a window's left edge.
                u_lo, u_hi = self.unmasked_blocks(n_min, n_max, t, shape)
                if cutlass.const_expr(self.runtime_softcap):
                    # A run-time softcap (softcap_pre != 0) sends every block through the
                    # masked run, which caps; the other runs never do. (A run-time softcap
                    # test in each run takes the producer's TMA operands out of uniform
                    # registers: every TMA issue becomes a loop over the lanes; docs/design.md.)
                    if softmax.softcap_pre != Float32(0.0):
                        u_lo, u_hi = n_min, n_min
                first = n_max - 1  # the blocks below it are left
                if cutlass.const_expr(trim and not single):
                    # The second block's step (peeled off) issues the trimmed block's PV.
                    self.overlap_block(tidx, f, pipes, k_state, v_state, n_max - 2, t, shape,
                                       softmax, True, trim=True)
                    k_state.advance()
                    v_state.advance()
                    first = n_max - 2
                top = cutlass.min(u_hi, first)
                for i in cutlass.range(cutlass.max(first - cutlass.max(u_hi, n_min), 0),
                                       unroll=1):
                    self.overlap_block(tidx, f, pipes, k_state, v_state, first - 1 - i, t,
                                       shape, softmax, True)
                    k_state.advance()
                    v_state.advance()
                if cutlass.const_expr(self.lazy_ref):
                    self.lazy_init(f, scale_log2)
                for i in cutlass.range(top - u_lo, unroll=1):
                    self.overlap_block(tidx, f, pipes, k_state, v_state, top - 1 - i, t,
                                       shape, softmax, False, capped=not self.runtime_softcap)
                    k_state.advance()
                    v_state.advance()
                if cutlass.const_expr(self.lazy_ref):
                    self.lazy_finish(f, scale_log2)
                if cutlass.const_expr(self.local):
                    bottom = cutlass.min(u_lo, top)
                    for i in cutlass.range(bottom - n_min, unroll=1):
                        self.overlap_block(tidx, f, pipes, k_state, v_state, bottom - 1 - i,
                                           t, shape, softmax, True, capped=not self.runtime_softcap)
                        k_state.advance()
                        v_state.advance()
                # Last PV.
                if cutlass.const_expr(self.rescale_early):
                    self.rescale_o(f)
                self.pv_alone(wg, f, pipe_v, v_state, trim and single)
                v_state.advance()
        else:
            for i in cutlass.range(n_max - n_min, unroll=1):
                col0 = (n_max - 1 - i) * self.tile_n
                self.qk_alone(wg, f, pipe_k, k_state)
                k_state.advance()
                self.apply_softcap(f.acc_S_mn, softmax.softcap_pre)
                if i == 0 or self.block_needs_mask(col0, row0, t, shape):
                    self.apply_mask(f.acc_S_mn, tidx, col0, row0, t, shape)
                self.online_softmax(f, scale_log2)
                self.rescale_o(f)
                self.convert_p(f)
                self.pv_alone(wg, f, pipe_v, v_state)
                v_state.advance()
        return k_state, v_state

    def overlap_block(self, tidx, f: Frags, pipes, k_state, v_state, n_block, t: TileInfo,
                      shape: Shape, softmax: Softmax, masked: bool, capped: bool = True,
                      trim: bool = False):
        """One steady-state step of the overlapped mainloop: S = Q K(n_block)^T and O += P V of
        the previous block issued together, the softmax of S while the PV wgmma runs, then O
        rescaled and P converted. ``masked``: apply the mask; ``capped``: apply the softcap
        (as configured: always in softcap kernels, when softcap_pre != 0 with a run-time
        softcap).
        Both are decided while tracing. The caller advances both pipeline states (see
        :meth:`qk_alone`). ``trim``: the PV wgmmas take only the first ``edge_n`` keys (the
        previous block was a trimmed first block).

        With ping-pong, V is waited for after S's wgmmas are issued (its load was issued after
        K's): the tensor cores work on S meanwhile, and the other warpgroups' turns do not
        wait on this one's V (docs/design.md). Without ping-pong (hd256, 64-row decode) both
        are waited for first (docs/design.md).

        ``rescale_early`` (Tile): O is multiplied by the previous block's correction between
        the two issues, under S's wgmmas, instead of after the wait for PV; the mainloop does
        the same once more before the last PV. Each O value sees the same multiplications and
        additions in the same order either way."""
        pipe_k, pipe_v = pipes
        wg = self.mma_wg(tidx)
        pipe_k.consumer_wait(k_state)
        if cutlass.const_expr(not self.pingpong):
            pipe_v.consumer_wait(v_state)
        self.pingpong_wait(wg)
        self.gemm_qk(f, k_state.index)
        if cutlass.const_expr(self.rescale_early):
            self.rescale_o(f)
        if cutlass.const_expr(self.pingpong):
            pipe_v.consumer_wait(v_state)
        self.gemm_pv(f, v_state.index, trim)
        self.pingpong_signal(wg)
        # Tile.lazy_reference: the unmasked steps take P against a reference decided by the
        # blocks before (lazy_softmax) instead of this block's row max.
        lazy = self.lazy_ref and not masked
        if cutlass.const_expr(lazy):
            # The previous block's P (in tOrP, read by the PV wgmma just issued): its largest
            # value decides this block's reference, while the wgmmas run.
            self.lazy_decide(f)
        warpgroup.wait_group(1)
        pipe_k.consumer_release(k_state)
        if cutlass.const_expr(capped):
            self.apply_softcap(f.acc_S_mn, softmax.softcap_pre)
        if cutlass.const_expr(masked):
            self.apply_mask(f.acc_S_mn, tidx, n_block * self.tile_n, t.m_block * self.tile_m,
                            t, shape)
        if cutlass.const_expr(lazy):
            self.lazy_softmax(f, softmax.softmax_scale_log2)
        else:
            self.online_softmax(f, softmax.softmax_scale_log2)
        warpgroup.wait_group(0)
        if cutlass.const_expr(lazy):
            self.lazy_sum(f)
        pipe_v.consumer_release(v_state)
        if cutlass.const_expr(not self.rescale_early):
            self.rescale_o(f)
        self.convert_p(f)

    @cute.jit
    def unmasked_blocks(self, n_min, n_max, t: TileInfo, shape: Shape):
        """[u_lo, u_hi): the tile's key blocks that need no mask (BlockInfo.unmasked_range)."""
        s_lo, s_hi = self.seq_rows(t.m_block * self.tile_m, shape)
        return self.binfo.unmasked_range(n_min, n_max, s_lo, s_hi, t.sq, t.sk, shape.window_left,
                                         shape.window_right)

    @cute.jit
    def block_needs_mask(self, col0, row0, t: TileInfo, shape: Shape):
        """Whether key block [col0, col0 + tile_n) crosses the sequence end or a mask edge for
        some row of the m tile."""
        s_lo, s_hi = self.seq_rows(row0, shape)
        return self.binfo.block_needs_mask(col0, s_lo, t.sq, t.sk, shape.window_left,
                                           shape.window_right, s_hi)

    @cute.jit
    def convert_p(self, f: Frags):
        """P (fp32, in acc_S) -> 16-bit A operand of the PV wgmma, written where it stands."""
        p32 = cute.recast_tensor(f.tOrP_as_acc, Uint32)
        ptx_type = "bf16" if cutlass.const_expr(self.dtype == cutlass.BFloat16) else "f16"
        for j in cutlass.range_constexpr(cute.size(p32)):
            p32[j] = cvt_pair_pinned(f.acc_S[2 * j], f.acc_S[2 * j + 1], ptx_type)

    # Plain Python helpers (inlined while tracing, like pingpong_wait). The caller advances the
    # pipeline state after each: the tracer carries a state through a loop only when the
    # loop body itself rebinds it (an advance inside a helper escapes the loop).
    def mma_wg(self, tidx):
        """Index of the MMA warpgroup of consumer thread ``tidx``, marked warp-uniform (named
        barrier ids and wgmma descriptors derived from it stay in uniform registers)."""
        return cute.arch.make_warp_uniform(tidx // 128)

    def qk_alone(self, wg, f: Frags, pipe_k, k_state, trim=False):
        """S = Q K^T for the next key block, waited for (no PV in flight); ``trim``: see
        :meth:`gemm_qk`."""
        self.gemm_alone(wg, f, pipe_k, k_state, self.gemm_qk, trim)

    def pv_alone(self, wg, f: Frags, pipe_v, v_state, trim=False):
        """O += P V for the next value block, waited for (no QK in flight); ``trim``: see
        :meth:`gemm_pv`."""
        self.gemm_alone(wg, f, pipe_v, v_state, self.gemm_pv, trim)

    def gemm_alone(self, wg, f: Frags, pipe, state, gemm, trim):
        """``gemm`` on stage ``state`` of ``pipe`` in this warpgroup's ping-pong turn, waited
        for; the stage is released after it."""
        pipe.consumer_wait(state)
        self.pingpong_wait(wg)
        gemm(f, state.index, trim)
        self.pingpong_signal(wg)
        warpgroup.wait_group(0)
        pipe.consumer_release(state)

    @cute.jit
    def rescale_o(self, f: Frags):
        """O *= the online softmax's per-row correction. With ``lazy_rescale``, skipped when
        no row of the warp moved its max (every factor exactly 1)."""
        if cutlass.const_expr(self.rescale_threshold is None):
            self._scale_o_rows(f)
        elif warp_needs_rescale(f.row_scale, cute.size(f.acc_O_mn, mode=[0])):
            self._scale_o_rows(f)

    def _scale_o_rows(self, f: Frags):
        for r in range(cute.size(f.acc_O_mn, mode=[0])):  # static sizes: unrolled while tracing
            for c in range(cute.size(f.acc_O_mn, mode=[1])):
                f.acc_O_mn[r, c] = f.acc_O_mn[r, c] * f.row_scale[r]

    def pingpong_wait(self, wg):
        if cutlass.const_expr(self.pingpong):
            cute.arch.barrier(barrier_id=1 + wg, number_of_threads=256)

    def pingpong_signal(self, wg):
        """The next warpgroup's turn (round robin over two or three)."""
        if cutlass.const_expr(self.pingpong):
            if cutlass.const_expr(self.num_mma_wg == 2):
                cute.arch.barrier_arrive(barrier_id=2 - wg, number_of_threads=256)
            else:
                cute.arch.barrier_arrive(barrier_id=1 + (wg + 1) % self.num_mma_wg,
                                         number_of_threads=256)

    @cute.jit
    def gemm_qk(self, f: Frags, stage, trim: cutlass.Constexpr = False):
        """acc = Q K^T (zero-initialised by the first k-block). A fresh MMA atom per call keeps
        the accumulate flag a local value. ``trim`` (Tile.edge_width): only the block's first
        ``edge_n`` columns, by wgmmas of that width."""
        op, acc = f.mma_qk.op, f.acc_S
        if cutlass.const_expr(trim):
            op, acc = f.edge
            # The columns past it: -inf (the mask would overwrite them, but the compiler
            # cannot see that, and their stale values would stay live through the wgmmas,
            # taking registers the wgmma pipeline needs: C7511).
            for c in cutlass.range_constexpr(cute.size(acc), cute.size(f.acc_S)):
                f.acc_S[c] = -Float32.inf
        warpgroup.fence()
        atom = cute.make_mma_atom(op)
        for k in cutlass.range_constexpr(cute.size(f.tSrQ, mode=[2])):
            atom.set(warpgroup.Field.ACCUMULATE, k != 0)
            cute.gemm(atom, acc, f.tSrQ[None, None, k], f.tSrK[None, None, k, stage], acc)
        warpgroup.commit_group()

    @cute.jit
    def gemm_pv(self, f: Frags, stage, trim: cutlass.Constexpr = False):
        """acc += P V (``trim``: over the block's first ``edge_n`` keys only)."""
        warpgroup.fence()
        atom = cute.make_mma_atom(f.mma_pv.op)
        atom.set(warpgroup.Field.ACCUMULATE, True)
        n_k = self.edge_n // 16 if cutlass.const_expr(trim) else cute.size(f.tOrP, mode=[2])
        for k in cutlass.range_constexpr(n_k):
            cute.gemm(atom, f.acc_O, f.tOrP[None, None, k], f.tOrV[None, None, k, stage], f.acc_O)
        warpgroup.commit_group()

    # ---------------------------------------------------------------- Tile.edge_width
    def edge_frags(self, wg_thread, acc_S):
        """(MMA op, accumulator) of S's wgmmas at ``edge_n`` columns, or () without trimming.
        The accumulator is acc_S's first columns: a wgmma m64nN accumulator holds its columns
        in groups of 8, one after another, so a narrower one's registers are a prefix of a
        wider one's. The K operand descriptors are the full block's (same start, same row
        stride)."""
        if cutlass.const_expr(self.edge_n == 0):
            return ()
        mma = sm90_utils.make_trivial_tiled_mma(
            self.dtype, self.dtype, warpgroup.OperandMajorMode.K, warpgroup.OperandMajorMode.K,
            Float32, (self.num_mma_wg, 1, 1), (64, self.edge_n))
        thr = mma.get_slice(wg_thread)
        layout = thr.make_fragment_C(thr.partition_shape_C((self.tile_m, self.edge_n))).layout
        return (mma.op, cute.make_tensor(acc_S.iterator, layout))

    @cute.jit
    def edge_fits(self, n_block, t: TileInfo, shape: Shape):
        """1 if no row of the tile sees key block ``n_block`` past its first ``edge_n``
        columns (the tile's last row sees the most), else 0 (warp-uniform). One answer per
        CTA: with one per warpgroup (their last rows 64 apart) the two ping-pong warpgroups
        would often run different copies of the mainloop at once and stall on instruction
        fetch (docs/design.md)."""
        last_row = t.m_block * self.tile_m + self.tile_m - 1
        _, hi = self.binfo.col_limits(last_row, n_block * self.tile_n, t.sq, t.sk,
                                      shape.window_left, shape.window_right)
        fits = Int32(0)
        if hi <= self.edge_n:
            fits = Int32(1)
        return cute.arch.make_warp_uniform(fits)

    @cute.jit
    def apply_softcap(self, acc_S_mn, softcap_pre):
        """Softcap: S -> tanh(S * softmax_scale / softcap), before the mask (a masked -inf must
        stay -inf). The host then passes softcap * log2(e) and softcap as the softmax's scales,
        so P = exp(softcap * tanh(...) - max) and the LSE come out in the usual units. Softcap
        kernels always cap; kernels with a run-time softcap cap when softcap_pre != 0."""
        if cutlass.const_expr(self.softcap):
            self._tanh_all(acc_S_mn, softcap_pre)
        elif cutlass.const_expr(self.runtime_softcap):
            if softcap_pre != Float32(0.0):
                self._tanh_all(acc_S_mn, softcap_pre)

    def _tanh_all(self, acc_S_mn, softcap_pre):
        for r in range(cute.size(acc_S_mn, mode=[0])):
            for c in range(cute.size(acc_S_mn, mode=[1])):
                acc_S_mn[r, c] = tanh_approx(acc_S_mn[r, c] * softcap_pre)

    @cute.jit
    def apply_mask(self, acc_S_mn, tidx, col0, row0, t: TileInfo, shape: Shape):
        """-inf outside the visible keys: col >= sk; causal: col > row + sk - sq; local: col
        outside [row + sk - sq - window_left, row + sk - sq + window_right]. ``row`` is the
        query row (:meth:`query_row`)."""
        thr_col = col0 + 2 * (tidx % 4)
        for r in cutlass.range_constexpr(cute.size(acc_S_mn, mode=[0])):
            row = self.query_row(row0 + frag_row(tidx, r), shape)
            lo, hi = self.binfo.col_limits(row, thr_col, t.sq, t.sk, shape.window_left,
                                           shape.window_right)
            mask_row(RowView(acc_S_mn, r), cute.size(acc_S_mn, mode=[1]), frag_col_static, hi,
                     lo if cutlass.const_expr(self.local) else None)

    @cute.jit
    def online_softmax(self, f: Frags, scale_log2):
        """S -> P = exp2(S * scale_log2 - rowmax * scale_log2) in place; row_scale gets the
        factor the running O must be multiplied by."""
        for r in cutlass.range_constexpr(cute.size(f.acc_S_mn, mode=[0])):
            m_new, s_new, rescale = online_softmax_row(
                RowView(f.acc_S_mn, r), cute.size(f.acc_S_mn, mode=[1]), f.row_max[r],
                f.row_sum[r], scale_log2, self.reduction, quad_lanes=True,
                rescale_threshold=self.rescale_threshold, exact_shift=self.exact_shift)
            f.row_max[r] = m_new
            f.row_sum[r] = s_new
            f.row_scale[r] = rescale

    # ------------------------------------------------------------------ epilogue
