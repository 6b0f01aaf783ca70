"""Device code the sm_90a and sm_100a forward kernels share (CuTe DSL, build time only).

Everything here takes the values it works on as arguments (fragment views, rows, DSL scalars)
and keeps compile-time choices (tile shape, mask kind, reduction order) as Python values, so
that each kernel calls it from code written in its own fragment layout. ``@cute.jit`` helpers
are inlined into the calling kernel while it is traced.

Masks and key-block bounds — :class:`BlockInfo` (``block_info.py``)
    ``BlockInfo(tile_m, tile_n, causal, local=False)``; compile-time.
    ``.n_block_range(m_block, sq, sk, window_left=None, window_right=None, row_lo=None,
    row_hi=None) -> (n_min, n_max)``
        the key blocks [n_min, n_max) an m-block visits (causal bottom-right, local window,
        sequence end); ``row_lo``/``row_hi``: the tile's first/last query row when they are not
        ``m_block * tile_m + [0, tile_m)`` (packed GQA). Split-KV ranges stay in the kernel.
    ``.block_needs_mask(col0, row0, sq, sk, window_left=None, window_right=None,
    row_last=None) -> Boolean``
        whether key block ``col0`` needs masking for some query row of [row0, row_last]
        (default ``row0 + tile_m - 1``; decode kernels pass their packed rows' range).
    ``.col_limits(row, col_base, sq, sk, window_left=None, window_right=None) -> (lo, hi)``
        column ``col_base + c`` is visible to query ``row`` iff ``lo <= c < hi`` (``lo`` is
        ``NO_LOWER_BOUND`` unless local). sm_90a: ``col_base`` = the thread's first column
        ``col0 + 2 * (tidx % 4)``, one call per fragment row; sm_100a: ``col_base`` = 0 once
        per tile (absolute limits), the block subtracts its ``col0``.

``mask_row(row, n_cols, col_of, hi, lo=None, branch_free=False)`` (``mask.py``)
    -inf where ``col_of(c) >= hi`` (or ``< lo``). ``row`` is indexable by value number:
    a flat register row (sm_100a) or ``RowView(acc_S_mn, r)`` (sm_90a); ``col_of(c)`` is the
    value's column relative to ``col_base`` (sm_90a: ``(c // 2) * 8 + c % 2``).
    ``branch_free`` selects instead of a predicated store (sm_100a).

Online softmax (``softmax.py``)
    ``RowView(tensor, r)``: row ``r`` of a (rows, cols) register view, indexable by column.
    ``tree_reduce(op, vals)``: pairwise reduction.
    ``online_softmax_row(row, n_cols, row_max, row_sum, scale_log2, reduction=TREE,
    quad_lanes=False, rescale_threshold=None) -> (m_new, sum_new, rescale)``: one block of
        the online softmax in place (row <- P); ``reduction`` TREE (sm_90a) or CHAINS4
        (sm_100a) fixes the rounding order; ``quad_lanes``: the row is spread over a quad
        (sm_90a: two butterfly shuffles complete the max); ``rescale_threshold``: the row's
        max moves only when it grows by more than that (log2 units), else ``rescale`` is 1.
    ``warp_needs_rescale(row_scale, n_rows)``: whether some row of the warp has a factor other
        than 1 (a warp vote: O's rescale is skipped when none has).
    ``finalize_row(row_max, row_sum, softmax_scale) -> (inv, lse)``: 1/sum and the LSE
        (0 and -inf for a row that saw no key); ``row_sum`` already reduced over the quad.

Sequence info (``seqlen.py``)
    ``SeqlenInfo(q_start, k_start, sq, sk, q_b, k_b)`` (NamedTuple) and
    ``seqlen_info(batch, shape, ptrs=None, totals=None, separate_kv=False)``: a batch entry's
    offsets, lengths and q / k-v batch coordinates; ``shape``/``ptrs`` are the launch-ABI
    groups (``seq_mode``: ``fa4_aot.abi.SeqMode`` bits, as ints ``SEQ_VARLEN``, ``SEQ_USED_Q``,
    ``SEQ_USED_K``, ``SEQ_VARLEN_K``, ``SEQ_COMPACT``; cu_seqlens offsets clamped into the
    packed lengths ``totals``, seqused only shortens); ``ptrs=None``: a kernel without varlen.
    ``clamped_doc(cu_ptr, batch, total)``: one document's (start, length), clamped.

Output addressing (``output.py``)
    ``OStrides(s, h, b)`` (NamedTuple of Int64): ``.assume_aligned()`` attaches the runtime's
    16-byte promise (strides divisible by ``O_STRIDE_DIVBY`` = 8 elements);
    ``.offset(head, batch, row)`` = ``head*h + batch*b + row*s`` (Int64).

Runtime scalars travel in the launch-ABI groups (``fa4_aot.abi``: ``Ptrs``, ``Strides``,
``Shape``, ``Softmax``, NamedTuples generated from the spec); the scheduler's are
``fa4_aot.kernels.tile_sched.TileSchedParams(num_m_blocks, section, num_tiles)``.
"""

from .block_info import NO_LOWER_BOUND, BlockInfo
from .mask import mask_row
from .output import O_STRIDE_DIVBY, OStrides
from .seqlen import (SEQ_COMPACT, SEQ_USED_K, SEQ_USED_Q, SEQ_VARLEN, SEQ_VARLEN_K, SeqlenInfo,
                     clamped_doc, seqlen_info)
from .softmax import (CHAINS4, TREE, RowView, finalize_row, online_softmax_row, tree_reduce,
                      warp_needs_rescale)

__all__ = [
    "BlockInfo", "NO_LOWER_BOUND", "mask_row", "OStrides", "O_STRIDE_DIVBY", "SeqlenInfo",
    "seqlen_info", "clamped_doc", "SEQ_COMPACT", "SEQ_VARLEN", "SEQ_USED_Q", "SEQ_USED_K",
    "SEQ_VARLEN_K", "RowView", "tree_reduce", "TREE", "CHAINS4", "online_softmax_row",
    "finalize_row", "warp_needs_rescale",
]
