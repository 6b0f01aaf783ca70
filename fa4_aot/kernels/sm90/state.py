"""What the warps of the sm_90a forward kernels carry while tracing: the launch-ABI groups,
the tile in hand (:class:`TileInfo`), the MMA warpgroup's fragments (:class:`Frags`), and the
numeric thresholds of the softmax variants."""

from __future__ import annotations

from dataclasses import dataclass

import cutlass

from fa4_aot.abi import FWD_SM90

DTYPES = {"bf16": cutlass.BFloat16, "fp16": cutlass.Float16, "e4m3": cutlass.Float8E4M3FN}
GROUPS = FWD_SM90.group_types()
Ptrs, Strides, Shape, Softmax, Redo = (GROUPS[n] for n in ("Ptrs", "Strides", "Shape", "Softmax",
                                                          "Redo"))
# Tile.lazy_rescale: a row's running max moves only when a key block raises it by more than
# 2^8 (log2 units; docs/design.md).
RESCALE_THRESHOLD = 8.0
# Tile.lazy_reference: a tile whose P went above 2^100 somewhere is recomputed exactly (P past
# 2^128 overflows; an O of P * V sums past it too, and a reference factor below 2^-126 is
# flushed to 0).
LAZY_GUARD = 2.0 ** 100


# Frozen dataclasses: the DSL treats a frozen object that a loop body only reads (calls methods
# of its members) as read-only, instead of as a loop-carried value.
@dataclass(frozen=True, eq=False)
class TileInfo:
    """What the warps know about the tile in hand (plain Python: built while tracing)."""

    m_block: object
    head: object
    batch: object
    split: object
    q_start: object
    k_start: object
    sq: object
    sk: object
    q_b: object  # batch coordinate of q (0 for packed documents)
    k_b: object  # batch coordinate of k/v (0 for packed documents)


@dataclass(frozen=True, eq=False)
class Frags:
    """The MMA warpgroup's operands, accumulators and softmax state."""

    mma_qk: object
    mma_pv: object
    tSrQ: object
    tSrK: object
    tOrV: object
    acc_S: object
    acc_O: object
    tOrP: object
    tOrP_as_acc: object
    acc_S_mn: object
    acc_O_mn: object
    row_max: object
    row_sum: object
    row_scale: object
    # Tile.lazy_reference: per row, the reference of the next block's P (log2 units), the
    # factor from the previous reference to it, and the block's P sum.
    row_next: object = None
    row_pend: object = None
    row_tot: object = None
    # Tile.edge_width: (MMA op, accumulator) of S's wgmmas on a trimmed first block.
    edge: tuple = ()
    # FP8 kernels, of the tile in hand: (q_descale * k_descale, v_descale, ...); the decode
    # kernels add their e4m3 K and V stages and the bf16 K and V the MMAs read.
    conv: tuple = ()
