"""Which key blocks an m-block visits, which of them need the mask, and the visible column
window of one query row. Compile-time: tile shape and mask kind; runtime: lengths, window."""

from __future__ import annotations

import cutlass
import cutlass.cute as cute
from cutlass import Int32

# "No lower bound" for the visible-column window of masks without one (far below any column).
NO_LOWER_BOUND = -(1 << 30)


class BlockInfo:
    """Masks (compile time, from the kernel configuration): full; ``causal`` (bottom-right
    aligned: row ``i`` sees keys ``j <= i + sk - sq``); ``local`` (sliding window: keys in
    ``[i + sk - sq - window_left, i + sk - sq + window_right]``). Every mask also hides keys
    ``j >= sk`` (the sequence end). ``window_left``/``window_right`` are only read by local
    masks; the other kernels may pass ``None``."""

    def __init__(self, tile_m: int, tile_n: int, causal: bool, local: bool = False):
        assert not (causal and local), "causal windows are local masks with window_right = 0"
        self.tile_m = tile_m
        self.tile_n = tile_n
        self.causal = causal
        self.local = local

    @cute.jit
    def n_block_range(self, m_block, sq, sk, window_left=None, window_right=None,
                      row_lo=None, row_hi=None):
        """[n_min, n_max): the key blocks m-block ``m_block`` sees (n_max may be 0). The query
        rows are ``m_block * tile_m`` ... ``+ tile_m - 1`` unless ``row_lo``/``row_hi`` (first
        and last query row, inclusive) are given: a kernel whose tile rows are not consecutive
        query rows (packed GQA) passes its own range."""
        hi = sk
        lo = Int32(0)
        if cutlass.const_expr(row_lo is None):
            if cutlass.const_expr(self.causal):
                hi = cutlass.min(sk, (m_block + 1) * self.tile_m + sk - sq)
            if cutlass.const_expr(self.local):
                hi = cutlass.min(sk, (m_block + 1) * self.tile_m + sk - sq + window_right)
                lo = cutlass.max(Int32(0), m_block * self.tile_m + sk - sq - window_left)
        else:
            if cutlass.const_expr(self.causal):
                hi = cutlass.min(sk, row_hi + 1 + sk - sq)
            if cutlass.const_expr(self.local):
                hi = cutlass.min(sk, row_hi + 1 + sk - sq + window_right)
                lo = cutlass.max(Int32(0), row_lo + sk - sq - window_left)
        n_max = cutlass.max(Int32(0), (hi + self.tile_n - 1) // self.tile_n)
        n_min = cutlass.min(lo // self.tile_n, n_max)
        return n_min, n_max

    @cute.jit
    def block_needs_mask(self, col0, row0, sq, sk, window_left=None, window_right=None,
                         row_last=None):
        """Whether key block [col0, col0 + tile_n) crosses the sequence end or a mask edge for
        some query row of [row0, row_last] (``row_last`` defaults to ``row0 + tile_m - 1``;
        a kernel whose tile rows are not consecutive query rows passes its own range)."""
        need = col0 + self.tile_n > sk
        if cutlass.const_expr(self.causal):
            need = need or (col0 + self.tile_n > row0 + sk - sq + 1)
        if cutlass.const_expr(self.local):
            last = row0 + self.tile_m - 1
            if cutlass.const_expr(row_last is not None):
                last = row_last
            need = need or (col0 + self.tile_n > row0 + sk - sq + window_right + 1)
            need = need or (col0 < last + sk - sq - window_left)
        return need

    @cute.jit
    def unmasked_range(self, n_min, n_max, row_lo, row_hi, sq, sk, window_left=None,
                       window_right=None):
        """[u_lo, u_hi) inside [n_min, n_max): the key blocks that need no mask for any query
        row of [row_lo, row_hi] (:meth:`block_needs_mask` is False exactly there). Lets a
        kernel run its steady state in a loop without the mask test (one basic block, which
        ptxas schedules better)."""
        hi_col = sk
        if cutlass.const_expr(self.causal):
            hi_col = cutlass.min(sk, row_lo + sk - sq + 1)
        if cutlass.const_expr(self.local):
            hi_col = cutlass.min(sk, row_lo + sk - sq + window_right + 1)
        u_hi = cutlass.min(n_max, cutlass.max(n_min, cutlass.max(hi_col, Int32(0)) // self.tile_n))
        u_lo = n_min
        if cutlass.const_expr(self.local):
            lo_col = cutlass.max(row_hi + sk - sq - window_left, Int32(0))
            u_lo = cutlass.min(u_hi, cutlass.max(n_min, (lo_col + self.tile_n - 1) // self.tile_n))
        return u_lo, u_hi

    @cute.jit
    def col_limits(self, row, col_base, sq, sk, window_left=None, window_right=None):
        """(lo, hi): column ``col_base + c`` is visible to query row ``row`` iff
        ``lo <= c < hi`` (``lo`` is :data:`NO_LOWER_BOUND` unless the mask is local).
        ``col_base`` may be a block's first column, a thread's first column, or 0 (then the
        limits are absolute and a block subtracts its ``col0`` from them)."""
        diag = row + sk - sq - col_base
        hi = sk - col_base
        lo = Int32(NO_LOWER_BOUND)
        if cutlass.const_expr(self.causal):
            hi = cutlass.min(hi, diag + 1)
        if cutlass.const_expr(self.local):
            hi = cutlass.min(hi, diag + window_right + 1)
            lo = diag - window_left
        return lo, hi
