"""Tile order shared by the host, the tests and every kernel.

A forward launch covers ``num_m_blocks x num_heads x batch`` output tiles. Each kernel turns a
linear tile index into ``(m_block, head, batch)`` with :func:`decode_tile`; the same function
runs on Python ints here (tests, trace rendering) and on DSL ``Int32`` values inside the
kernels (it uses only ``*``, ``//`` and ``-``), so the decode the H200 exercises is the decode
the sm_100a CLC kernel uses.

Order (longest-processing-time first, L2-aware):

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
"""

from __future__ import annotations

# K/V bytes a section may hold. Far below the 50 MB L2: the persistent CTAs work on about one
# wave of consecutive tiles at a time, each streaming its head's whole K/V at its own pace, and
# the L2 is two partitions. At 32 MB (8 heads of 8k x hd128) ncu measured 643 MB read from
# DRAM per 2x16x8k non-causal call against FA4's 202 MB; the HBM power that costs lowers the SM
# clock at the H200's power cap. 8 MB under sustained load: non-causal hd64 / hd128 / hd256
# -2.0 to -2.5 % time, causal hd128 -0.5 % (docs/perf-notes.md v15); ncu: 210 MB (v16).
L2_BUDGET_BYTES = 8 * 1024 * 1024

# Causal calls keep at least two heads per section. One head's causal tiles ordered heaviest to
# lightest before the next head's heaviest cost time: 2x8x8k hd256 causal -10 %, 4x8x8k -4.6 %
# (8 MB = one head there), 8k hd128 causal -1.4 to -2 % at 4 MB (docs/perf-notes.md v15, v16).
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
# last, v23) unless the K/V those tiles read over all heads exceeds this: then in head sections
# too, after the upper half's. hd128, 16 heads (ncu, docs/perf-notes.md v25): 1 x 16k + 32 x
# 512 (64 MB) DRAM reads 691 -> 479 MB (FA4: 446), the zipf mix (its 12k document: 48 MB)
# 656 -> 551 MB; the same cycles, -0.2 to -0.6 % time under sustained load. hd64's 16k (32 MB)
# read 242 -> 236 MB and measured -1.2 % in-process: it keeps the all-heads walk, as 8 x 4k
# does (16 MB; a tail of lighter tiles).
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
    longest document's length. Non-causal (every m-block in sections): hd128 1x16k + 32x512
    and the zipf mix +2.6 / +3.3 % against all heads at once (docs/perf-notes.md v21). Causal,
    where only the upper half of each document's m-blocks goes in sections: the same cycles
    (in-process A/B +-0.5 %), half the DRAM reads (1x16k + 32x512 hd128: 1,340 -> 691 MB), and
    under sustained load a higher clock at the H200's power cap: 1x16k + 32x512 hd128 -2.9 %
    time, zipf -1.4 %, hd64 -1.7 % (v23). Sections over all of a causal document's m-blocks
    had left heavy tiles to the end of the document (-0.3 to -2 %, v21)."""
    return choose_section(num_heads, 1, seqlen_k, head_dim, elem_bytes, qhead_per_kvhead, causal)


def num_n_blocks(m_block: int, tile_m: int, tile_n: int, seqlen_q: int, seqlen_k: int,
                 causal: bool) -> int:
    """Key blocks an m-block visits (python mirror of the kernels' loop bound)."""
    if causal:
        hi = min(seqlen_k, (m_block + 1) * tile_m + seqlen_k - seqlen_q)
    else:
        hi = seqlen_k
    return max(0, -(-hi // tile_n))


# Causal calls whose rows see at least this many keys on average take the wide-n causal kernel
# (configs.TILES_LONG_KV, ``KernelConfig.long_kv``). hd128, 176 against 128 keys, in-process
# A/B (docs/perf-notes.md v15): causal S = 1k -9 %, 2k -5 %, 3k -2 %, 4k -1 to +1 %, 6k +1 %,
# 8k +2 %, 16k +2 % (rows seeing S / 2 keys on average). Since the wide tile writes O through
# an O buffer of its own (v20), 176 against 128 keys: S = 4k -0.8 %, 5k +2.0 %, 6k +3.4 %,
# packed documents zipf +2.3 % (rows seeing ~2.7k keys by varlen_length), 8 x 4k +0.8 %,
# 12 x 3k +0.9 %: the threshold moved from 3,072 to 2,560 keys. With the first key block cut
# to the columns its rows see (v28) and the causal wide tile on 160 keys (v31), 160 against 128
# keys, in-process, two runs (v32): S = 1k -5 %, 1.5k -1 %, 2k +0.8 %, 2.5k +0.5 / +3.7 %,
# 3k +2 %, 4k +3.2 / +4.1 %, packed 16 x 2k +2.0 / +2.4 %, 32 x 1k -0.3 / -0.8 %; alone at the
# power cap the same time from 2k up (2k -0.3 %, 16 x 2k -0.2 %, 4k +0.6 %), 1.5k -2.3 %: the
# threshold moved from 2,560 to 1,024 keys.
LONG_KV_KEYS = 1024


def prefer_long_kv(seqlen_q: float, seqlen_k: float) -> bool:
    """Whether a causal call (mask bottom-right aligned) is cheaper on the wide-n kernel: its
    rows see ``seqlen_k - seqlen_q / 2`` keys on average (all but a diagonal block unmasked);
    wider blocks cost more on the diagonal and less in the steady state. Varlen calls pass
    :func:`varlen_length` of q and of k."""
    return seqlen_k - seqlen_q / 2 >= LONG_KV_KEYS


def varlen_length(total: int, docs: int, max_len: int) -> float:
    """The document length the launch rules take for a packed batch: sum(L^2) / sum(L), the
    length of the document an average token is in (a causal row sees half of it on average),
    estimated from what the host has without reading the device offsets: the longest document
    (``max_len``, at most ``total``) and the other ``docs - 1`` of equal length — exact for such
    mixes, a lower bound for the others, never below the mean ``total / docs``. The mean alone
    undercounts a mix of one long and many short documents: 16k + 32 x 512 has a mean of 993
    tokens, half its tokens in the 16k document (8,448 here), and ran 2.5 % faster on the wide-n
    kernel (docs/perf-notes.md v18)."""
    if docs <= 1 or total <= 0:
        return float(max(total, 0))
    longest = min(max_len, total)
    rest = total - longest
    return max(total / docs, (longest * longest + rest * rest / (docs - 1)) / total)


# What a taller m tile gains per unit of work on sm_90a (hd64, 192 against 128 rows). Measured
# on 13 shapes (causal and not, S = 512 to 16k, one process, docs/perf-notes.md v16): the time
# ratio times the work ratio of tile_cost gives 1.22 to 1.28, median 1.25 (v12 had measured
# 1.15 before the three warpgroups took turns; 1.12 then sent non-causal S = 512 / 1k to the
# 128-row tile, 11-13 % slower).
TALL_TILE_GAIN = 1.25


def tile_cost(tile_m: int, tile_n: int, seqlen_q: int, seqlen_k: int, causal: bool,
              pairs: int, sms: int) -> float:
    """Work of one launch in (row x key block) units, as the SMs see it: the tiles' rows
    (padding included) times the key blocks each visits, spread over ``sms`` persistent CTAs
    but never less than the largest tile."""
    per_pair, largest = 0, 0
    for m in range(-(-seqlen_q // tile_m)):
        w = tile_m * num_n_blocks(m, tile_m, tile_n, seqlen_q, seqlen_k, causal)
        per_pair += w
        largest = max(largest, w)
    return max(per_pair * pairs / sms, largest)


def prefer_m128(tall_m: int, tile_n: int, seqlen_q: int, seqlen_k: int, causal: bool,
                pairs: int, sms: int) -> bool:
    """Whether the 128-row alternative beats a ``tall_m``-row tile (full or causal masks;
    ``pairs`` = heads x batch): it does where rounding the sequence to the taller tile adds
    more work than :data:`TALL_TILE_GAIN` pays back (causal S = 1k: a third more; 8k: 3 %)."""
    short = tile_cost(128, tile_n, seqlen_q, seqlen_k, causal, pairs, sms)
    tall = tile_cost(tall_m, tile_n, seqlen_q, seqlen_k, causal, pairs, sms)
    return short < tall / TALL_TILE_GAIN
