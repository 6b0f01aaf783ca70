"""Online softmax, one query row at a time (log2 domain, as FlashAttention does it)."""

from __future__ import annotations

import cutlass
import cutlass.cute as cute
from cutlass import Float32


class RowView:
    """Row ``r`` of a (rows, cols) register view, indexable by column number: lets the row
    helpers below work on a wgmma accumulator's ``acc_mn[r, c]`` and on a flat register row
    alike (it only forwards indices while the kernel is traced)."""

    def __init__(self, tensor, r: int):
        self.tensor = tensor
        self.r = r

    def __getitem__(self, c):
        return self.tensor[self.r, c]

    def __setitem__(self, c, value):
        self.tensor[self.r, c] = value

    # A row written inside a runtime ``if`` is carried through it: flatten to the tensor.
    def __extract_mlir_values__(self):
        return cutlass.extract_mlir_values(self.tensor)

    def __new_from_mlir_values__(self, values):
        return RowView(cutlass.new_from_mlir_values(self.tensor, values), self.r)


def tree_reduce(op, vals):
    """Pairwise reduction (depth log2(n) instead of a chain of n dependent ops)."""
    vals = list(vals)
    while len(vals) > 1:
        nxt = [op(vals[i], vals[i + 1]) for i in range(0, len(vals) - 1, 2)]
        if len(vals) % 2:
            nxt.append(vals[-1])
        vals = nxt
    return vals[0]


def _combine4(op, acc):
    return op(op(acc[0], acc[1]), op(acc[2], acc[3]))


# Reduction orders (compile time). The order fixes the rounding of the row sum, so a kernel
# keeps its order; the same order on every scheduler gives bitwise-identical outputs.
TREE = "tree"      # pairwise tree over the row (sm_90a)
CHAINS4 = "chains4"  # four interleaved chains (value c into chain c % 4), then ((0,1),(2,3)) (sm_100a)


def _exponent(x, m_safe, shift, scale_log2, exact_shift: bool):
    """exp2's argument for score ``x`` (online_softmax_row's ``exact_shift``)."""
    if exact_shift:
        return (x - m_safe) * scale_log2
    return x * scale_log2 - shift


@cute.jit
def online_softmax_row(row, n_cols: cutlass.Constexpr, row_max, row_sum, scale_log2,
                       reduction: cutlass.Constexpr = TREE, quad_lanes: cutlass.Constexpr = False,
                       rescale_threshold: cutlass.Constexpr = None,
                       exact_shift: cutlass.Constexpr = False):
    """One online-softmax step for one query row over one key block, in place:
    ``row[c] <- exp2(row[c] * scale_log2 - m_new * scale_log2)`` (m_new: the running max
    including this block; a row that has seen only -inf uses 0 so that exp2 gives 0, not NaN).

    ``row_max``/``row_sum``: the running max (raw scores) and sum before this block.
    ``quad_lanes``: the row is spread over the 4 lanes of a quad (sm_90a wgmma fragment): the
    block max is completed with two butterfly shuffles (the row sum stays per lane).
    Returns ``(m_new, sum_new, rescale)``: ``rescale`` = exp2((m_old - m_new) * scale_log2),
    the factor the running O must be multiplied by (``sum_new = row_sum * rescale + sum(P)``).

    ``rescale_threshold`` (log2 units, or None): the running max moves only when this block
    raises it by more than the threshold; otherwise the old max is kept, P may reach
    2^threshold (harmless in fp32 and in 16-bit P) and ``rescale`` is exactly 1, so the
    caller can skip O's rescale where a whole warp kept its max (:func:`warp_needs_rescale`).
    The same softmax against another reference point; a row still at -inf takes any finite
    max. Each row decides alone: its bits do not depend on the other rows of its warp.

    ``exact_shift``: the exponents as ``(row[c] - m_new) * scale_log2`` (an FADD and an FMUL a
    value instead of one FFMA) and ``rescale`` as ``(m_old - m_new) * scale_log2``. The FFMA
    form subtracts the rounded ``m_new * scale_log2``, whose rounding error (half an ulp of a
    value that grows with the scale) scales P's largest value by up to 2^(ulp / 2) and, through
    the rescale, compounds from block to block: harmless for the usual scales, but an FP8
    kernel's scale carries q_descale * k_descale (up to 1e8 and more), where P must stay in
    e4m3's range and O's rescales must not overflow. With exact shifts P <= 1 and rescale <= 1
    for any scale."""
    if cutlass.const_expr(reduction == TREE):
        m_blk = tree_reduce(cute.arch.fmax, [row[c] for c in range(n_cols)])
    else:
        mx = [row[0], row[1], row[2], row[3]]
        for c in cutlass.range_constexpr(4, n_cols):
            mx[c % 4] = cute.arch.fmax(mx[c % 4], row[c])
        m_blk = _combine4(cute.arch.fmax, mx)
    m_new = cute.arch.fmax(row_max, m_blk)
    if cutlass.const_expr(quad_lanes):
        m_new = cute.arch.fmax(m_new, cute.arch.shuffle_sync_bfly(m_new, offset=1))
        m_new = cute.arch.fmax(m_new, cute.arch.shuffle_sync_bfly(m_new, offset=2))
    if cutlass.const_expr(rescale_threshold is not None):
        # -inf - -inf is NaN (not moved: m stays -inf); finite - -inf is +inf (moved).
        moved = (m_new - row_max) * scale_log2 > Float32(rescale_threshold)
        if not moved:
            m_new = row_max
    m_safe = m_new
    if m_new == -Float32.inf:
        m_safe = Float32(0.0)
    shift = m_safe * scale_log2
    if cutlass.const_expr(rescale_threshold is None):
        rescale = cute.math.exp2(_exponent(row_max, m_safe, shift, scale_log2, exact_shift),
                                 fastmath=True)
    else:
        rescale = Float32(1.0)
        if moved:
            rescale = cute.math.exp2(_exponent(row_max, m_safe, shift, scale_log2, exact_shift),
                                     fastmath=True)
    if cutlass.const_expr(reduction == TREE):
        for c in cutlass.range_constexpr(n_cols):
            row[c] = cute.math.exp2(_exponent(row[c], m_safe, shift, scale_log2, exact_shift),
                                    fastmath=True)
        s = tree_reduce(lambda a, b: a + b, [row[c] for c in range(n_cols)])
    else:
        sm = [Float32(0.0), Float32(0.0), Float32(0.0), Float32(0.0)]
        for c in cutlass.range_constexpr(n_cols):
            p = cute.math.exp2(_exponent(row[c], m_safe, shift, scale_log2, exact_shift),
                               fastmath=True)
            row[c] = p
            sm[c % 4] = sm[c % 4] + p
        s = _combine4(lambda a, b: a + b, sm)
    return m_new, row_sum * rescale + s, rescale


@cute.jit
def warp_needs_rescale(row_scale, n_rows: cutlass.Constexpr):
    """Whether some row of this warp has a rescale factor other than 1 (warp-uniform)."""
    any_row = row_scale[0] != Float32(1.0)
    for r in cutlass.range_constexpr(1, n_rows):
        any_row = any_row | (row_scale[r] != Float32(1.0))
    return cute.arch.vote_any_sync(any_row)


@cute.jit
def finalize_row(row_max, row_sum, softmax_scale):
    """``(inv, lse)`` of a finished row: O is multiplied by ``inv`` = 1 / sum;
    ``lse = max * softmax_scale + ln(sum)``. A row that saw no visible key (sum 0) gets
    ``inv = 0`` (O = 0) and ``lse = -inf``. ``row_sum`` must already be the full row's sum
    (sm_90a: reduced over the quad first)."""
    lse = -Float32.inf
    inv = Float32(0.0)
    if row_sum > Float32(0.0):
        inv = cute.arch.rcp_approx(row_sum)
        lse = row_max * softmax_scale + cute.math.log(row_sum, fastmath=True)
    return inv, lse
