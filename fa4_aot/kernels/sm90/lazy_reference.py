"""Tile.lazy_reference (bf16 prefill kernels without softcap): the unmasked steps take P
against a reference decided by the blocks before them, and a guard after the mainloop
recomputes a warp's rows exactly where P may have overflowed against that reference.

Invariant: a tile's output equals the online softmax's up to rounding whenever every row sum
stays at or below ``LAZY_GUARD``; any other tile leaves a lane's row sum infinite, NaN or above
it, and the warp holding that lane takes :meth:`LazyReference.tile_redo`."""

from __future__ import annotations

import cutlass
import cutlass.cute as cute
from cutlass import Float32, Int64, Uint32

from ..common import RowView, tree_reduce
from .ptx import (GLOBAL_NC, asm_pure, bf16_hi, bf16_lo, bits_f32, f32_bits, frag_col_static,
                  frag_row, hmax2, ld_global_u32, ld_v4, swizzled_offset)
from .state import LAZY_GUARD, RESCALE_THRESHOLD, Frags, Redo, Shape, Softmax, TileInfo


class LazyReference:
    """Mixin of the sm_90a kernel base: the lazy-reference softmax steps and the tile guard."""

    @cute.jit
    def lazy_init(self, f: Frags, scale_log2):
        """Before a tile's unmasked steps: the reference (log2 units) from the exact row max
        of the masked steps before them; row_max holds, until lazy_finish, the running packed
        bf16x2 maximum of the blocks' P (the overflow guard's evidence)."""
        for r in cutlass.range_constexpr(cute.size(f.row_max)):
            f.row_next[r] = Float32(cutlass.select_(
                f.row_max[r] == -Float32.inf, Float32(0.0), f.row_max[r] * scale_log2))
        f.row_pend.fill(1.0)
        f.row_max[0] = Float32(0.0)

    @cute.jit
    def lazy_decide(self, f: Frags):
        """At the start of an unmasked step, once the PV wgmma that reads the previous block's
        P is issued: that P's largest value per row (16-bit maxes, packed, over the quad)
        moves the reference up by its log2 when it exceeds 2^8 (FA4's Blackwell threshold);
        the factor between the two references goes to O (row_scale, next step) and to the
        row sum (lazy_sum). The lane's own maxima also raise the guard's running peak."""
        p32 = cute.recast_tensor(f.tOrP_as_acc, Uint32)
        n = cute.size(p32)
        w0 = tree_reduce(hmax2, [p32[j] for j in range(0, n, 2)])  # row 0's words
        w1 = tree_reduce(hmax2, [p32[j] for j in range(1, n, 2)])  # row 1's
        w = hmax2(asm_pure([w0, w1], "prmt.b32 $0, $1, $2, 0x5410;", "=r,r,r"),
                   asm_pure([w0, w1], "prmt.b32 $0, $1, $2, 0x7632;", "=r,r,r"))
        f.row_max[0] = bits_f32(hmax2(f32_bits(f.row_max[0]), w))
        w = hmax2(w, asm_pure([w], "shfl.sync.bfly.b32 $0, $1, 1, 0x1f, -1;", "=r,r"))
        w = hmax2(w, asm_pure([w], "shfl.sync.bfly.b32 $0, $1, 2, 0x1f, -1;", "=r,r"))
        mx = [bf16_lo(w), bf16_hi(w)]
        for r in cutlass.range_constexpr(2):
            moved = mx[r] > Float32(2.0 ** RESCALE_THRESHOLD)
            ref = f.row_next[r]
            f.row_next[r] = Float32(cutlass.select_(
                moved, ref + cute.math.log2(mx[r], fastmath=True), ref))
            f.row_pend[r] = Float32(cutlass.select_(moved, cute.arch.rcp_approx(mx[r]),
                                                    Float32(1.0)))

    @cute.jit
    def lazy_softmax(self, f: Frags, scale_log2):
        """P of an unmasked block against the reference decided by the blocks before it
        (row_next), so the exponentials start as soon as S is there: no row max of this
        block on the critical path (docs/design.md)."""
        n_cols = cute.size(f.acc_S_mn, mode=[1])
        for r in cutlass.range_constexpr(cute.size(f.acc_S_mn, mode=[0])):
            row = RowView(f.acc_S_mn, r)
            ref = f.row_next[r]
            for c in cutlass.range_constexpr(n_cols):
                row[c] = cute.math.exp2(row[c] * scale_log2 - ref, fastmath=True)
            f.row_tot[r] = tree_reduce(lambda a, b: a + b, [row[c] for c in range(n_cols)])
            f.row_scale[r] = f.row_pend[r]

    @cute.jit
    def lazy_sum(self, f: Frags):
        for r in cutlass.range_constexpr(2):
            f.row_sum[r] = f.row_sum[r] * f.row_pend[r] + f.row_tot[r]

    @cute.jit
    def lazy_finish(self, f: Frags, scale_log2):
        """After the unmasked steps: row_max from the last reference (raw units); the row sum
        made infinite where a block's P went above 2^100 (its O may have overflowed, or its
        reference factor underflowed), for tile_guard."""
        pk = f32_bits(f.row_max[0])
        bad = (bf16_lo(pk) > Float32(LAZY_GUARD)) | (bf16_hi(pk) > Float32(LAZY_GUARD))
        inv_k = cute.arch.rcp_approx(scale_log2)
        for r in cutlass.range_constexpr(2):
            f.row_max[r] = f.row_next[r] * inv_k
            f.row_sum[r] = Float32(cutlass.select_(bad, Float32.inf, f.row_sum[r]))

    @cute.jit
    def tile_guard(self, tidx, f: Frags, t: TileInfo, redo: Redo, shape: Shape, softmax: Softmax,
                   n_range, q_addr):
        """After the mainloop (no wgmma in flight, Q still held): P can overflow against a
        reference left behind by a block whose scores are ~70 nats above the blocks before
        it. Every such case leaves a lane's row sum infinite, NaN or above 2^100 (the last
        block's P is in the row sum; the earlier ones' peaks are in lazy_finish's flag); a
        warp with such a lane recomputes its rows exactly (tile_redo). Ordinary inputs never
        take it."""
        big = Float32(LAZY_GUARD)
        ok = (f.row_sum[0] <= big) & (f.row_sum[1] <= big)
        if not cute.arch.vote_all_sync(ok):
            self.tile_redo(tidx, f, t, redo, shape, softmax, n_range, q_addr)

    @cute.jit
    def tile_redo(self, tidx, f: Frags, t: TileInfo, redo: Redo, shape: Shape, softmax: Softmax,
                  n_range, q_addr):
        """The slow exact path (milliseconds a tile): the thread's two rows, key by key over
        the tile's keys, with FMAs: Q from shared memory, K and V rows from global memory
        (``k_ptr`` / ``v_ptr``; only keys below the document's length are read), the tile's
        mask from BlockInfo.col_limits, the online softmax in the log2 domain, O for the
        thread's own columns. Each lane of a quad computes the row; the first keeps the row
        sum (the epilogue sums it over the quad)."""
        lane = tidx % 32
        n_min, n_max = n_range
        k2 = softmax.softmax_scale_log2
        rb = self.q_row_bytes
        kk = rb // 16
        kv_head = t.head // shape.qhead_per_kvhead
        k_base = redo.k_ptr.toint() + 2 * (Int64(t.k_start) * redo.k_stride_s
                                           + Int64(kv_head) * redo.k_stride_h
                                           + Int64(t.k_b) * redo.k_stride_b)
        v_base = redo.v_ptr.toint() + 2 * (Int64(t.k_start) * redo.v_stride_s
                                           + Int64(kv_head) * redo.v_stride_h
                                           + Int64(t.k_b) * redo.v_stride_b)
        rows = [frag_row(tidx, r) for r in range(2)]  # inside the tile
        lims = [self.binfo.col_limits(t.m_block * self.tile_m + rows[r], 0, t.sq, t.sk,
                                      shape.window_left, shape.window_right) for r in range(2)]
        acc_O = f.acc_O_mn
        n_cols = cute.size(acc_O, mode=[1])
        for r in cutlass.range_constexpr(2):
            for c in cutlass.range_constexpr(n_cols):
                acc_O[r, c] = Float32(0.0)
        # The running max and sum are loop-carried scalars (the DSL carries named values,
        # not list items).
        m0 = -Float32.inf
        m1 = -Float32.inf
        l0 = Float32(0.0)
        l1 = Float32(0.0)
        for j in cutlass.range(n_min * self.tile_n, cutlass.min(n_max * self.tile_n, t.sk),
                               unroll=1):
            s = [Float32(0.0), Float32(0.0)]
            krow = k_base + 2 * Int64(j) * redo.k_stride_s
            for ch in cutlass.range_constexpr(self.hd // 8):
                kw = ld_v4(krow + Int64(ch * 16), GLOBAL_NC)
                qw = [ld_v4(q_addr + swizzled_offset(rows[r], ch % kk, ch // kk,
                                                              self.tile_m, rb))
                      for r in range(2)]
                for e in cutlass.range_constexpr(8):
                    unpack = bf16_lo if e % 2 == 0 else bf16_hi
                    kf = unpack(kw[e // 2])
                    for r in cutlass.range_constexpr(2):
                        s[r] = s[r] + unpack(qw[r][e // 2]) * kf
            sv = [Float32(cutlass.select_((j >= lims[r][0]) & (j < lims[r][1]), s[r],
                                          -Float32.inf)) for r in range(2)]
            m_new = [cute.arch.fmax(m, sv[r]) for r, m in enumerate((m0, m1))]
            base = [Float32(cutlass.select_(m_new[r] == -Float32.inf, Float32(0.0),
                                            m_new[r] * k2)) for r in range(2)]
            c_old = [cute.math.exp2(m * k2 - base[r], fastmath=True)
                     for r, m in enumerate((m0, m1))]
            p = [cute.math.exp2(sv[r] * k2 - base[r], fastmath=True) for r in range(2)]
            l0 = l0 * c_old[0] + p[0]
            l1 = l1 * c_old[1] + p[1]
            m0 = m_new[0]
            m1 = m_new[1]
            vrow = v_base + 2 * Int64(j) * redo.v_stride_s
            for c in cutlass.range_constexpr(0, n_cols, 2):
                w = ld_global_u32(vrow + Int64(2 * (frag_col_static(c) + 2 * (lane % 4))))
                for r in cutlass.range_constexpr(2):
                    acc_O[r, c] = acc_O[r, c] * c_old[r] + p[r] * bf16_lo(w)
                    acc_O[r, c + 1] = acc_O[r, c + 1] * c_old[r] + p[r] * bf16_hi(w)
        first = lane % 4 == 0
        f.row_max[0] = m0
        f.row_max[1] = m1
        f.row_sum[0] = Float32(cutlass.select_(first, l0, Float32(0.0)))
        f.row_sum[1] = Float32(cutlass.select_(first, l1, Float32(0.0)))

