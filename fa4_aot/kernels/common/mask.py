"""Masking one row of scores: -inf outside the visible column window of
:meth:`BlockInfo.col_limits <fa4_aot.kernels.common.block_info.BlockInfo.col_limits>`."""

from __future__ import annotations

import cutlass
import cutlass.cute as cute
from cutlass import Float32


@cute.jit
def mask_row(row, n_cols: cutlass.Constexpr, col_of, hi, lo=None,
             branch_free: cutlass.Constexpr = False):
    """Set ``row[c]`` to -inf for every ``c < n_cols`` with ``col_of(c) >= hi`` (or, when
    ``lo`` is given, ``col_of(c) < lo``).

    ``row``: anything indexable by the value number ``c`` (a register tensor, or
    :class:`RowView` of a (rows, cols) accumulator view). ``col_of(c)``: the column of value
    ``c`` relative to the base the limits were computed for; a compile-time int for the
    fragments both kernels use (sm_90a wgmma: ``(c // 2) * 8 + c % 2`` from the thread's first
    column; sm_100a tcgen05.ld 32x32b: ``c`` from the block's first column).
    ``branch_free``: one ``select`` per value instead of a predicated store (sm_100a: a staged
    ``if`` per value carries the whole register row through every branch, thousands of SELs
    and spills)."""
    for c in cutlass.range_constexpr(n_cols):
        cs = col_of(c)
        if cutlass.const_expr(branch_free):
            if cutlass.const_expr(lo is None):
                row[c] = Float32(cutlass.select_(cs >= hi, Float32(-Float32.inf), row[c]))
            else:
                row[c] = Float32(cutlass.select_(cs >= hi or cs < lo, Float32(-Float32.inf),
                                                 row[c]))
        else:
            if cutlass.const_expr(lo is None):
                if cs >= hi:
                    row[c] = -Float32.inf
            else:
                if cs >= hi or cs < lo:
                    row[c] = -Float32.inf
