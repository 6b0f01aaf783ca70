"""Tile order shared by the host, the tests and every kernel.

A forward launch covers ``num_m_blocks x num_heads x batch`` output tiles. Each kernel turns a
linear tile index into ``(m_block, head, batch)`` with :func:`decode_tile`; the same function
runs on Python ints here (tests, trace rendering) and on DSL ``Int32`` values inside the
kernels (it uses only ``*``, ``//`` and ``-``), so host and kernels share one decode.

Order (longest-processing-time first, L2-aware; docs/design.md#l2-sections):

* The ``num_heads * batch`` (head, batch) pairs are cut into *sections* of ``section`` pairs,
  ``section`` dividing ``num_heads * batch`` exactly (no ragged tail, so no branch in the
  decode). Sections run one after another, so the K/V of the heads in flight fit in L2.
* Inside a section, m-blocks go from the last (the heaviest under a causal mask: it sees the
  most keys) to the first, and for each m-block all pairs of the section in turn.

For non-causal attention every tile costs the same and the order only serves L2 reuse.
Mostly empty varlen grids are walked in a compact order of their own (:func:`compact_tiles`):
documents in turn, each one's heads in sections (:func:`compact_section`; under a causal mask
the upper half of its m-blocks first, then the lower half, in sections too where that half's
K/V over all heads would not stay in L2, else with all heads together).

Which kernel a call runs, and its launch values, are the planner's (``fa4_aot/plan.py``).
"""

from __future__ import annotations

# K/V bytes a section may hold: far below the L2, whose two partitions serve about a wave of
# tiles each streaming its head's K/V at its own pace; more costs DRAM traffic and, at the
# power cap, clock (docs/design.md#l2-sections).
L2_BUDGET_BYTES = 8 * 1024 * 1024

# Causal calls keep at least two heads per section: one head's tiles ordered heaviest to
# lightest leave a light tail before the next head's heaviest (docs/design.md#l2-sections).
CAUSAL_MIN_SECTION = 2


def decode_tile(idx, num_m_blocks, num_heads, section):
    """Linear tile index -> (m_block, head, batch). Works on ints and on DSL Int32."""
    per_section = num_m_blocks * section
    sec = idx // per_section
    r = idx - sec * per_section
    m_rev = r // section
    hb = sec * section + (r - m_rev * section)
    m_block = num_m_blocks - 1 - m_rev
    batch = hb // num_heads
    head = hb - batch * num_heads
    return m_block, head, batch


def encode_tile(m_block, head, batch, num_m_blocks, num_heads, section):
    """(m_block, head, batch) -> linear tile index: the inverse of :func:`decode_tile` (ints
    and DSL Int32)."""
    hb = batch * num_heads + head
    sec = hb // section
    return (sec * (num_m_blocks * section) + (num_m_blocks - 1 - m_block) * section
            + (hb - sec * section))


def heavy_m_blocks(nb, causal: bool):
    """The m-blocks of a document of ``nb`` that the compact order takes first, in head
    sections: all of them, or under a causal mask the upper half (``nb - nb // 2``: rows that
    see at least half of the document's keys). Ints and DSL Int32."""
    return nb - nb // 2 if causal else nb


# The lower half of a causal document's m-blocks goes with all heads together (its light tiles
# last) unless the K/V those tiles read over all heads exceeds this: then in head sections
# too, after the upper half's (fewer DRAM reads; docs/design.md#l2-sections).
LIGHT_ALL_HEADS_BYTES = 40 * 1024 * 1024


def light_tiles_limit(tile_m: int, head_dim: int, elem_bytes: int) -> int:
    """Light tiles (lower-half m-blocks x heads) of a causal document above which the compact
    order takes them in head sections: :data:`LIGHT_ALL_HEADS_BYTES` of K/V (a tile's rows see
    at most ``tile_m`` keys more than the previous m-block's; counted per query head, so GQA
    calls are sectioned a little early). A compile-time constant of each kernel."""
    return LIGHT_ALL_HEADS_BYTES // (tile_m * 2 * head_dim * elem_bytes)


def compact_tiles(doc_m_blocks, num_heads: int, num_m_blocks: int, section: int,
                  causal: bool = False, light_limit: int | None = None) -> list[int]:
    """Varlen launches with ``seq_mode`` bit 16 (python mirror of the sm_90a producer's
    ``compact_to_dense``): compact index ``c`` -> the tile index of :func:`decode_tile`'s
    order. Only non-empty m-blocks are counted: documents in order; inside a document, first
    its :func:`heavy_m_blocks` with the heads in groups of ``section`` (a divisor of
    ``num_heads`` on such launches, :func:`compact_section`), each group's m-blocks from the
    last (the longest under a causal mask) down, the group's heads together; then (causal) the
    other m-blocks the same way, in groups of ``section`` where there are more than
    ``light_limit`` such tiles (:func:`light_tiles_limit`; ``None``: never), else all heads in
    one group."""
    assert num_heads % section == 0, (num_heads, section)
    out = []
    for doc, nb in enumerate(doc_m_blocks):
        heavy = heavy_m_blocks(nb, causal)
        light = nb - heavy
        light_sec = (section if light_limit is not None and light * num_heads > light_limit
                     else num_heads)
        for m_base, span, sec in ((0, heavy, section), (heavy, light, light_sec)):
            for first in range(0, num_heads, sec):
                for m_rev in range(span):
                    for head in range(first, first + sec):
                        out.append(encode_tile(nb - 1 - m_base - m_rev, head, doc, num_m_blocks,
                                               num_heads, section))
    return out


def choose_section(num_heads: int, batch: int, seqlen_k: int, head_dim: int, elem_bytes: int,
                   qhead_per_kvhead: int = 1, causal: bool = False,
                   l2_budget: int = L2_BUDGET_BYTES) -> int:
    """Largest divisor of ``num_heads * batch`` whose K/V working set fits the L2 budget;
    causal calls take at least :data:`CAUSAL_MIN_SECTION` heads where a divisor allows,
    whatever the budget."""
    hb = num_heads * batch
    kv_bytes_per_q_head = 2 * seqlen_k * head_dim * elem_bytes / max(qhead_per_kvhead, 1)
    cap = max(CAUSAL_MIN_SECTION if causal else 1,
              int(l2_budget // max(kv_bytes_per_q_head, 1)))
    best = 1
    d = 1
    while d * d <= hb:
        if hb % d == 0:
            for c in (d, hb // d):
                if best < c <= cap:
                    best = c
        d += 1
    return best


def compact_section(num_heads: int, seqlen_k: int, head_dim: int, elem_bytes: int,
                    qhead_per_kvhead: int = 1, causal: bool = False) -> int:
    """Heads per section of the compact varlen order (:func:`compact_tiles`), a divisor of
    ``num_heads``, sized as :func:`choose_section` sizes a dense call of one sequence of the
    longest document's length (under a causal mask only the upper half of each document's
    m-blocks goes in sections; docs/design.md#l2-sections)."""
    return choose_section(num_heads, 1, seqlen_k, head_dim, elem_bytes, qhead_per_kvhead, causal)


def num_n_blocks(m_block: int, tile_m: int, tile_n: int, seqlen_q: int, seqlen_k: int,
                 causal: bool) -> int:
    """Key blocks an m-block visits (python mirror of the kernels' loop bound)."""
    if causal:
        hi = min(seqlen_k, (m_block + 1) * tile_m + seqlen_k - seqlen_q)
    else:
        hi = seqlen_k
    return max(0, -(-hi // tile_n))


def split_ranges(n_min: int, n_max: int, num_splits: int) -> list[tuple[int, int]]:
    """The key-block range of each split (the kernels' split-KV rule, mirrored for the tests):
    equal parts of ceil((n_max - n_min) / num_splits) blocks, trailing splits possibly empty."""
    per = -(-(n_max - n_min) // num_splits) if num_splits else 0
    out = []
    for s in range(num_splits):
        lo = min(n_min + s * per, n_max)
        out.append((lo, min(lo + per, n_max)))
    return out
