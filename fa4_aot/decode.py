"""Host rules of the decode / short-query path (pure Python: no torch, no CUDA).

The decode kernels (``KernelConfig.decode``) pack the ``g = heads // kv_heads`` query heads
of one KV head into the rows of a 64-row m tile (packed GQA: K and V are read once per KV head)
and can cut each tile's key range into ``num_splits`` parts (split-KV, flash-decoding), merged
by the combine kernel. See ``fa4_aot/kernels/sm90_fwd.py`` and ``combine.py``.
"""

from __future__ import annotations

DECODE_TILE_M = 64
# The decode path serves calls whose packed rows (seqlen_q * group) fill at most this many
# rows, and GQA calls whose query heads would leave the prefill kernels' 128-row tiles mostly
# empty (:func:`packing_pays`). Calls with more packed rows than one 64-row tile take the
# 128-row decode kernels (:func:`use_wide_tile`).
MAX_PACKED_ROWS = 128
PREFILL_TILE_M = 128
MAX_SPLITS = 128
# Split only while each split keeps at least this many key blocks: a split costs a tile
# start-up (Q load, pipeline fill), the combine reads its partial result again, and the
# combine is a second launch (~6 us of host time: small calls are host-bound).
MIN_BLOCKS_PER_SPLIT = 8


def use_decode_kernels(seqlen_q: int, group: int, num_splits: int | None,
                       scheduler: str, trace: bool = False) -> bool:
    """Whether a call runs on the decode kernels: short queries (seqlen_q * group <= 128
    packed rows), GQA calls that packing serves better (:func:`packing_pays`), or any call
    that asks for num_splits > 1; work stealing only (the decode kernels are built for
    ``steal``, which ``auto`` picks)."""
    if trace or scheduler not in ("auto", "steal"):
        return False
    if num_splits is not None and num_splits > 1:
        return True
    return seqlen_q * group <= MAX_PACKED_ROWS or packing_pays(seqlen_q, group)


def packing_pays(seqlen_q: int, group: int) -> bool:
    """Packing the ``group`` query heads of a KV head into shared 128-row tiles at least
    halves the tiles, each of which reads the KV head's K and V: ``ceil(seqlen_q * group /
    128)`` packed against ``group * ceil(seqlen_q / 128)`` in the prefill kernels (one query
    head per tile). E.g. 16 query tokens of 16 heads per KV head: 2 tiles against 16 tiles of
    16 rows (H200, hd128, 64 x 4k keys: 733 us unpacked, FA4 134; docs/perf-notes.md v17)."""
    packed = -(-seqlen_q * group // PREFILL_TILE_M)
    plain = group * -(-seqlen_q // PREFILL_TILE_M)
    return group > 1 and 2 * packed <= plain


def use_wide_tile(seqlen_q: int, group: int) -> bool:
    """More packed rows than one 64-row decode tile: the 128-row decode kernels, which read a
    KV head's K/V once per 128 rows where the 64-row ones read them once per 64 (H200, hd128,
    64 x 4k keys, 8 query heads per KV head, 16 tokens: 349 us on two 64-row tiles;
    docs/perf-notes.md v17)."""
    return seqlen_q * group > DECODE_TILE_M


def choose_num_splits(tiles: int, n_blocks: int, num_sms: int) -> int:
    """Split count for ``tiles`` (m tile, KV head, batch) work items of ``n_blocks`` key blocks.

    No split while the tiles alone give the persistent grid 80 % of a wave or more (work
    stealing balances the rest). Otherwise the smallest split count whose work items fill the
    SMs' waves within 5 % of the best candidate (items / (waves * SMs): the decode tiles are
    equal, so a last wave half full costs half a wave), never fewer than
    :data:`MIN_BLOCKS_PER_SPLIT` key blocks per split and never more than :data:`MAX_SPLITS`.
    Examples on 132 SMs (hd128, 128-key blocks): B=32 x 8 KV heads, 8k keys -> 1;
    B=8 x 8 KV heads, 32k keys -> 2; B=1 x 8 KV heads, 128k keys -> 16."""
    if tiles <= 0 or n_blocks <= 1 or tiles * 5 >= num_sms * 4:
        return 1
    top = max(1, min(n_blocks // MIN_BLOCKS_PER_SPLIT, MAX_SPLITS))

    def fill(s):
        items = tiles * s
        return items / (-(-items // num_sms) * num_sms)

    best = max(fill(s) for s in range(1, top + 1))
    return next(s for s in range(1, top + 1) if fill(s) >= 0.95 * best)


def split_ranges(n_min: int, n_max: int, num_splits: int) -> list[tuple[int, int]]:
    """The key-block range of each split (the kernels' rule, mirrored for the tests): equal
    parts of ceil((n_max - n_min) / num_splits) blocks, trailing splits possibly empty."""
    per = -(-(n_max - n_min) // num_splits) if num_splits else 0
    out = []
    for s in range(num_splits):
        lo = min(n_min + s * per, n_max)
        out.append((lo, min(lo + per, n_max)))
    return out
