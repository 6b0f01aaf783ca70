"""The configuration space and the shared tile decode (CPU)."""

import dataclasses

import pytest

from bench.benchlib import ZIPF_DOCS
from fa4_aot.configs import CONFIG_SPACE, KernelConfig
from fa4_aot.schedule import choose_section, decode_tile, num_n_blocks


def test_names_unique_and_stable():
    names = [c.name for c in CONFIG_SPACE]
    assert len(names) == len(set(names))
    assert KernelConfig("sm_90a", "bf16", 128, True, "steal").name == \
        "fwd_sm_90a_bf16_hd128_causal_steal_m128n128s2"


def test_roundtrip_dict():
    for c in CONFIG_SPACE:
        assert KernelConfig.from_dict(c.to_dict()) == c


@pytest.mark.parametrize("field,value", [("arch", "sm_80"), ("dtype", "fp32"), ("head_dim", 80),
                                         ("scheduler", "magic")])
def test_invalid_config_rejected(field, value):
    kw = dict(arch="sm_90a", dtype="bf16", head_dim=64, causal=False, scheduler="single")
    kw[field] = value
    with pytest.raises(ValueError, match=field):
        KernelConfig(**kw)


def test_softcap_configs_are_named_and_sm90_only():
    c = KernelConfig("sm_90a", "fp16", 256, False, "steal", local=True, softcap=True)
    assert c.name == "fwd_sm_90a_fp16_hd256_local_steal_m128n80s2_softcap"
    assert c.key != KernelConfig("sm_90a", "fp16", 256, False, "steal", local=True).key
    with pytest.raises(ValueError, match="softcap kernels exist on sm_90a only"):
        KernelConfig("sm_100a", "bf16", 128, True, "clc", softcap=True)


def test_shipped_configs_know_nothing_of_experiments():
    import dataclasses

    import fa4_aot.configs as configs
    assert "variant" not in {f.name for f in dataclasses.fields(KernelConfig)}
    assert not hasattr(configs, "VARIANT_FLAGS")
    # an old manifest record with a "variant" key still loads
    d = KernelConfig("sm_90a", "bf16", 128, False, "single").to_dict()
    assert KernelConfig.from_dict({**d, "variant": ""}) == KernelConfig.from_dict(d)


def test_edge_width_only_where_the_kernel_takes_it():
    """Tile.edge_width: 0, or a multiple of 16 (the PV wgmma's k-step) below the key block;
    shipped on the wide hd128 tiles only, 176 keys and the causal 160 (the 128-key causal
    tile's diagonal block is always seen whole by the tile's last row: docs/perf-notes.md
    v28)."""
    trimmed = set()
    for c in CONFIG_SPACE:
        w = c.tile.edge_width
        assert w == 0 or (w % 16 == 0 and 0 < w < c.tile.n), c.name
        if w and c.arch == "sm_90a" and not c.decode and not c.softcap:
            trimmed.add((c.head_dim, c.tile.n))
    assert trimmed == {(128, 176), (128, 160)}


def test_lazy_reference_only_where_measured():
    """Tile.lazy_reference (docs/perf-notes.md v36-v37): on the causal 160-key hd128 tile of
    sm_90a only, the one it was measured on; the kernel takes it for bf16 prefill without
    softcap (FlashFwdSm90.lazy_ref), so the bf16 causal kernels of that tile, whatever the
    scheduler, are the ones that run it."""
    lazy = set()
    for c in CONFIG_SPACE:
        if c.tile.lazy_reference:
            assert c.arch == "sm_90a" and c.causal and c.long_kv, c.name
            assert (c.head_dim, c.tile.n, c.tile.overlap) == (128, 160, True), c.name
            if c.dtype == "bf16" and not c.decode and not c.softcap:
                lazy.add(c.scheduler)
    assert lazy == {"single", "static", "steal"}


@pytest.mark.parametrize("num_m,heads,batch", [(1, 1, 1), (7, 3, 5), (64, 16, 2), (3, 17, 1)])
def test_decode_is_a_bijection_in_lpt_order(num_m, heads, batch):
    for section in {d for d in range(1, heads * batch + 1) if (heads * batch) % d == 0}:
        seen = []
        for idx in range(num_m * heads * batch):
            m, h, b = decode_tile(idx, num_m, heads, section)
            assert 0 <= m < num_m and 0 <= h < heads and 0 <= b < batch
            seen.append((m, h, b))
        assert len(set(seen)) == len(seen)
        # longest first inside each section: m-blocks never increase within a section
        per = num_m * section
        for s0 in range(0, len(seen), per):
            ms = [m for m, _, _ in seen[s0:s0 + per]]
            assert ms == sorted(ms, reverse=True)


def test_choose_section_divides_and_fits():
    for heads, batch, sk in [(16, 2, 8192), (17, 1, 512), (32, 32, 1024), (1, 1, 1 << 20)]:
        s = choose_section(heads, batch, sk, 128, 2)
        assert (heads * batch) % s == 0 and s >= 1
    # 8 MB of K/V per section (perf-notes v15: 32 MB sections read 3x FA4's bytes from DRAM)
    assert choose_section(16, 2, 8192, 128, 2) == 2
    assert choose_section(32, 2, 8192, 64, 2) == 4
    assert choose_section(32, 2, 8192, 128, 2, qhead_per_kvhead=4) == 8
    # causal: at least two heads (one costs 4.6-10 % at hd256, perf-notes v16)
    assert choose_section(8, 2, 8192, 256, 2) == 1
    assert choose_section(8, 2, 8192, 256, 2, causal=True) == 2
    assert choose_section(16, 2, 8192, 128, 2, causal=True) == 2
    assert choose_section(3, 1, 1 << 20, 128, 2, causal=True) == 1  # no divisor 2


def test_num_n_blocks_causal_bottom_right():
    assert num_n_blocks(0, 128, 128, 128, 128, True) == 1
    assert num_n_blocks(0, 128, 128, 100, 300, True) == 3   # sk > sq: shifted diagonal
    assert num_n_blocks(0, 128, 128, 300, 100, True) == 0   # rows 0..127 see no key
    assert num_n_blocks(2, 128, 128, 300, 100, True) == 1
    assert num_n_blocks(5, 128, 128, 1000, 1000, False) == 8


def test_hd64_tall_tile_and_its_128_row_alternative():
    from fa4_aot.configs import CONFIG_SPACE, TILES, TILES_M128
    assert TILES["sm_90a"][64].m == 192 and TILES_M128["sm_90a"][64].m == 128
    alt = KernelConfig("sm_90a", "bf16", 64, True, "steal", m128=True)
    assert alt.name == "fwd_sm_90a_bf16_hd64_causal_steal_m128n128s3" and alt.threads == 384
    assert KernelConfig("sm_90a", "bf16", 64, True, "steal").threads == 512
    assert alt.key != KernelConfig("sm_90a", "bf16", 64, True, "steal").key
    # the wide decode kernels keep the 128-row tile
    assert KernelConfig("sm_90a", "bf16", 64, False, "steal", decode=True, wide=True).tile.m == 128
    for bad in (dict(head_dim=128), dict(decode=True)):
        with pytest.raises(ValueError, match="m128"):
            KernelConfig(**{**dict(arch="sm_90a", dtype="bf16", head_dim=64, causal=False,
                                   scheduler="steal", m128=True), **bad})
    alts = [c for c in CONFIG_SPACE if c.m128]
    assert sorted((c.dtype, c.causal, c.scheduler, c.local, c.softcap) for c in alts) == [
        (dt, causal, "steal", False, False) for dt in ("bf16", "fp16") for causal in (False, True)]


def test_two_q_buffers_where_shared_memory_allows():
    """The next tile's Q loads while a tile runs (sm_90a prefill, v16): hd64/96/128 on 128-key
    blocks; not the 160- and 176-key blocks, hd192/256 (no room) or the decode kernels (they
    load Q themselves); the shared memory bound itself is checked on the built kernels
    (tests/test_manifest_abi.py)."""
    from fa4_aot.configs import CONFIG_SPACE, DECODE_TILES, DECODE_WIDE_TILES
    two = {(c.head_dim, c.tile.n) for c in CONFIG_SPACE
           if c.arch == "sm_90a" and c.tile.q_stages == 2}
    assert two == {(64, 128), (96, 128), (128, 128)}
    for c in CONFIG_SPACE:
        # (the FP8 prefill tile keeps one Q buffer until it has been measured, issue 54)
        if (c.arch != "sm_90a" or c.decode or c.fp8 or c.head_dim > 128
                or c.tile.n != 128):
            assert c.tile.q_stages == 1, c.name
        else:
            assert c.tile.q_stages == 2, c.name
    assert all(t.q_stages == 1 for t in (*DECODE_TILES.values(), *DECODE_WIDE_TILES.values()))


def test_hd128_wide_n_tiles():
    """Non-causal hd128 on 176 keys; the causal kernels' wide alternative (long_kv) is the same
    tile on 160 keys (docs/perf-notes.md v31) with the lazy reference (v37)."""
    from fa4_aot.configs import CONFIG_SPACE, DECODE_TILES, TILES_LONG_KV, TILES_WIDE_N
    assert TILES_WIDE_N["sm_90a"][128].n == 176
    assert TILES_LONG_KV["sm_90a"][128] == dataclasses.replace(TILES_WIDE_N["sm_90a"][128],
                                                               n=160, lazy_reference=True)
    assert KernelConfig("sm_90a", "bf16", 128, False, "single").tile.n == 176
    assert KernelConfig("sm_90a", "bf16", 128, True, "single").tile.n == 128
    assert KernelConfig("sm_90a", "bf16", 128, False, "steal", local=True).tile.n == 128
    assert (KernelConfig("sm_90a", "bf16", 128, False, "steal", decode=True).tile
            == DECODE_TILES[128])
    alt = KernelConfig("sm_90a", "bf16", 128, True, "steal", long_kv=True)
    assert alt.name == "fwd_sm_90a_bf16_hd128_causal_steal_m128n160s2"
    assert alt.key != KernelConfig("sm_90a", "bf16", 128, True, "steal").key
    for bad in (dict(head_dim=64), dict(causal=False), dict(decode=True), dict(trace=True),
                dict(arch="sm_100a", scheduler="clc")):
        with pytest.raises(ValueError, match="long_kv"):
            KernelConfig(**{**dict(arch="sm_90a", dtype="bf16", head_dim=128, causal=True,
                                   scheduler="steal", long_kv=True), **bad})
    # every scheduler (the same tile, so the same bits, whichever runs a call) and softcap
    alts = sorted((c.dtype, c.scheduler, c.softcap) for c in CONFIG_SPACE if c.long_kv)
    assert alts == sorted((dt, s, sc) for dt in ("bf16", "fp16")
                          for s, sc in (("single", False), ("static", False), ("steal", False),
                                        ("single", True), ("steal", True)))


@pytest.mark.parametrize("sq,sk,wide", [(1024, 1024, False), (1536, 1536, False),
                                        (2046, 2046, False), (2048, 2048, True),
                                        (4096, 4096, True), (8192, 8192, True),
                                        (256, 1152, True), (256, 1150, False),
                                        (8192, 1024, False), (2048, 2047, False)])
def test_prefer_long_kv(sq, sk, wide):
    """Causal rows see sk - sq / 2 keys on average; from 1,024 of them the wide-n tile
    (docs/perf-notes.md v32: causal S = 1.5k -1 %, 2k +0.8 % on it)."""
    from fa4_aot.plan import prefer_long_kv
    assert prefer_long_kv(sq, sk) is wide


@pytest.mark.parametrize("s,causal,pairs,short", [
    (1024, True, 512, True),     # causal 1k: a third more work on 192-row tiles
    (1024, False, 512, False),   # 1152 rows for 1024: the tall tile still wins (+10 %, v16)
    (1024, False, 1, True),      # 6 tiles or 8 on 132 SMs: the largest tile decides
    (2048, True, 256, False),
    (8192, True, 64, False),
    (8192, False, 64, False),
    (2048, True, 8, True),       # one wave either way: the largest tile decides
    (4096, False, 1, True),      # 32 tiles or 22 on 132 SMs: the smaller tile finishes first
    (4096, False, 32, False),
])
def test_prefer_m128(s, causal, pairs, short):
    from fa4_aot.plan import prefer_m128
    assert prefer_m128(192, 128, s, s, causal, pairs, 132) is short


def test_tile_cost_counts_rows_times_blocks():
    from fa4_aot.plan import tile_cost
    # 1k causal on 128-row tiles: blocks 1..8 per m-block, 128 rows each, one pair on 1 SM
    assert tile_cost(128, 128, 1024, 1024, True, 1, 1) == 128 * 36
    # 192-row tiles: 2, 3, 5, 6, 8, 8 blocks (the last tile holds 64 rows, padded to 192)
    assert tile_cost(192, 128, 1024, 1024, True, 1, 1) == 192 * 32
    # many SMs: never below the largest tile
    assert tile_cost(192, 128, 1024, 1024, True, 1, 132) == 192 * 8


@pytest.mark.parametrize("num_m,heads,batch", [(1, 1, 1), (7, 3, 5), (4, 16, 2)])
def test_encode_tile_inverts_decode_tile(num_m, heads, batch):
    from fa4_aot.schedule import encode_tile
    for section in {d for d in range(1, heads * batch + 1) if (heads * batch) % d == 0}:
        for idx in range(num_m * heads * batch):
            assert encode_tile(*decode_tile(idx, num_m, heads, section), num_m, heads,
                               section) == idx


def test_compact_tiles_are_the_non_empty_tiles_once_longest_first():
    from fa4_aot.schedule import compact_tiles
    nbs, heads, num_m = [3, 0, 1, 2], 2, 3
    for section in (1, 2):
        order = compact_tiles(nbs, heads, num_m, section)
        got = [decode_tile(i, num_m, heads, section) for i in order]
        assert sorted(got) == sorted((m, h, b) for b, nb in enumerate(nbs) for m in range(nb)
                                     for h in range(heads))
    # section = heads: documents in turn, m-blocks from the last, all heads together
    assert got[:6] == [(2, 0, 0), (2, 1, 0), (1, 0, 0), (1, 1, 0), (0, 0, 0), (0, 1, 0)]
    assert got[6:8] == [(0, 0, 2), (0, 1, 2)]


def test_compact_tiles_section_the_heads_inside_each_document():
    """A long document's heads go in sections (its K/V in L2), each section longest first."""
    from fa4_aot.schedule import compact_tiles
    nbs, heads, num_m, section = [3, 1], 4, 3, 2
    got = [decode_tile(i, num_m, heads, section)
           for i in compact_tiles(nbs, heads, num_m, section)]
    assert got == [(2, 0, 0), (2, 1, 0), (1, 0, 0), (1, 1, 0), (0, 0, 0), (0, 1, 0),
                   (2, 2, 0), (2, 3, 0), (1, 2, 0), (1, 3, 0), (0, 2, 0), (0, 3, 0),
                   (0, 0, 1), (0, 1, 1), (0, 2, 1), (0, 3, 1)]
    with pytest.raises(AssertionError):
        compact_tiles(nbs, 3, num_m, 2)  # a section must divide the heads


def test_compact_tiles_causal_heavy_half_in_sections_then_all_heads():
    """Causal: a document's upper half of m-blocks (rows that see most keys) in head sections,
    then its lower half with all heads together, each part longest first."""
    from fa4_aot.schedule import compact_tiles, heavy_m_blocks
    assert [heavy_m_blocks(nb, True) for nb in (1, 2, 3, 4, 5)] == [1, 1, 2, 2, 3]
    assert heavy_m_blocks(5, False) == 5
    nbs, heads, num_m, section = [4, 1], 4, 4, 2
    got = [decode_tile(i, num_m, heads, section)
           for i in compact_tiles(nbs, heads, num_m, section, causal=True)]
    assert got == [(3, 0, 0), (3, 1, 0), (2, 0, 0), (2, 1, 0),
                   (3, 2, 0), (3, 3, 0), (2, 2, 0), (2, 3, 0),
                   (1, 0, 0), (1, 1, 0), (1, 2, 0), (1, 3, 0),
                   (0, 0, 0), (0, 1, 0), (0, 2, 0), (0, 3, 0),
                   (0, 0, 1), (0, 1, 1), (0, 2, 1), (0, 3, 1)]
    # every non-empty tile once, whatever the section
    nbs = [7, 0, 3, 1, 2]
    for section in (1, 2, 4):
        got = [decode_tile(i, 7, heads, section)
               for i in compact_tiles(nbs, heads, 7, section, causal=True)]
        assert sorted(got) == sorted((m, h, b) for b, nb in enumerate(nbs) for m in range(nb)
                                     for h in range(heads))
    # with all heads in one section, the causal order is the plain longest-first walk
    assert (compact_tiles(nbs, heads, 7, heads, causal=True)
            == compact_tiles(nbs, heads, 7, heads))


def test_compact_tiles_causal_light_half_in_sections_when_its_kv_is_large():
    """Causal: where the lower half's tiles over all heads exceed ``light_limit`` (their K/V
    would not stay in L2), that half goes in head sections too, after the upper half's."""
    from fa4_aot.schedule import compact_tiles, light_tiles_limit
    # 40 MB of K/V: 640 tiles of 128 rows at hd128 (16 heads: 1 x 16k 64 x 16 = 1024 and 12k
    # 768 in sections, 8k 512 not), 853 of 192 rows at hd64 (1 x 16k: 43 x 16 = 688, not)
    assert light_tiles_limit(128, 128, 2) == 640
    assert light_tiles_limit(192, 64, 2) == 853
    nbs, heads, num_m, section = [4, 1], 4, 4, 2
    got = [decode_tile(i, num_m, heads, section)
           for i in compact_tiles(nbs, heads, num_m, section, causal=True, light_limit=7)]
    assert got == [(3, 0, 0), (3, 1, 0), (2, 0, 0), (2, 1, 0),
                   (3, 2, 0), (3, 3, 0), (2, 2, 0), (2, 3, 0),
                   (1, 0, 0), (1, 1, 0), (0, 0, 0), (0, 1, 0),
                   (1, 2, 0), (1, 3, 0), (0, 2, 0), (0, 3, 0),
                   (0, 0, 1), (0, 1, 1), (0, 2, 1), (0, 3, 1)]
    # at the limit (2 light m-blocks x 4 heads = 8): all heads together, as without a limit
    assert (compact_tiles(nbs, heads, num_m, section, causal=True, light_limit=8)
            == compact_tiles(nbs, heads, num_m, section, causal=True))
    # every non-empty tile once, whatever the section and the limit; non-causal ignores it
    nbs = [7, 0, 3, 1, 2, 9]
    for section in (1, 2, 4):
        for limit in (0, 3, 100):
            got = [decode_tile(i, 9, heads, section) for i in
                   compact_tiles(nbs, heads, 9, section, causal=True, light_limit=limit)]
            assert sorted(got) == sorted((m, h, b) for b, nb in enumerate(nbs)
                                         for m in range(nb) for h in range(heads))
        assert (compact_tiles(nbs, heads, 9, section, light_limit=0)
                == compact_tiles(nbs, heads, 9, section))


def test_compact_section_l2_sized_at_least_two_heads_causal():
    from fa4_aot.schedule import compact_section
    # one head of 16k x hd128 is 8 MB of K/V, the L2 budget: one head a section
    assert compact_section(16, 16384, 128, 2) == 1
    assert compact_section(16, 16384, 64, 2) == 2
    assert compact_section(16, 2048, 128, 2) == 8
    assert compact_section(24, 4096, 128, 2, qhead_per_kvhead=3) == 12
    # causal: the dense rule's two heads at least (for the upper half of the m-blocks)
    assert compact_section(16, 16384, 128, 2, causal=True) == 2
    assert compact_section(16, 2048, 128, 2, causal=True) == 8
    assert compact_section(3, 16384, 128, 2, causal=True) == 1


def test_decode_tiles_keep_96kb_in_flight():
    """The 64-row decode kernels read K/V fastest with about 96 KB of them in flight per SM
    (192 KB: -1 to -3 %, 64 KB: up to -6 %, docs/perf-notes.md v17); hd256 kept its 80 x 2
    (160 KB: 96 KB measured neutral there). Three stages or more where that allows, so that
    paged K/V loads issue in one pass."""
    from fa4_aot.configs import DECODE_TILES
    for hd, t in DECODE_TILES.items():
        in_flight = t.kv_stages * t.n * hd * 2 * 2  # K and V, 2-byte elements
        if hd == 256:
            assert in_flight == 160 * 1024
        else:
            assert in_flight == 96 * 1024, (hd, t)
            assert t.kv_stages >= 3 or hd == 192, (hd, t)


def test_early_rescale_on_the_long_row_tiles_and_hd64():
    """O is rescaled under S's wgmmas where tiles have many key blocks (hd64, hd128's 176 keys,
    hd256): +1 to +2.6 % there; the 128-key hd128 tile (short causal rows, windows) keeps the
    rescale after the PV wait (docs/perf-notes.md v18). The 128-row decode kernels are the
    128-row prefill tiles."""
    from fa4_aot.configs import DECODE_TILES, DECODE_WIDE_TILES, TILES, TILES_M128, TILES_WIDE_N
    sm90 = TILES["sm_90a"]
    assert sm90[64].rescale_early and TILES_WIDE_N["sm_90a"][128].rescale_early
    assert sm90[256].rescale_early and TILES_M128["sm_90a"][64].rescale_early
    assert not sm90[128].rescale_early
    assert not any(t.rescale_early for t in DECODE_TILES.values())
    assert [hd for hd, t in DECODE_WIDE_TILES.items() if t.rescale_early] == [64, 256]


def test_every_hd64_kernel_sums_p_in_four_chains_and_rescales_lazily():
    """hd64 (MUFU-bound softmax): the row sum in four chains, +1 to +7 % (v18), and the lazy
    row max, +1.2 to +1.9 % (v22; hd128 lost with it); on every hd64 tile, so that its decode,
    128-row and 192-row kernels compute alike. hd256: the lazy row max on its prefill tile
    (and the 128-row decode form, which is that tile), -1.5 % time under sustained load (v23);
    its 64-row decode tile was not measured with it."""
    from fa4_aot.configs import (DECODE_TILES, DECODE_WIDE_TILES, TILES, TILES_M128,
                                 TILES_WIDE_N)
    tables = [TILES["sm_90a"], TILES_M128["sm_90a"], TILES_WIDE_N["sm_90a"], DECODE_TILES,
              DECODE_WIDE_TILES]
    assert all(t.sum_chains == (hd == 64) for table in tables for hd, t in table.items())
    assert all(t.lazy_rescale == (hd == 64 or (hd == 256 and table is not DECODE_TILES))
               for table in tables for hd, t in table.items())
    assert not any(t.lazy_rescale for t in TILES["sm_100a"].values())


def test_o_stored_through_shared_memory_where_it_measured_faster():
    """O goes to global memory through shared memory (``staged_store``) on every sm_90a
    prefill tile: through the tile's Q buffer on the 128-row tiles of 128 or fewer keys (hd96,
    hd128, hd192, hd256, hd64's 128-row alternative), through an O buffer of its own that the
    MMA warpgroups hand on (``o_buffer``) on hd128's 176-key tile (one Q buffer, long tiles:
    through it -2 to -3 %) and hd64's 192-row tile (through its Q buffer +-1.5 %); not on the
    decode kernels (docs/perf-notes.md v19, v20)."""
    from fa4_aot.configs import DECODE_TILES, DECODE_WIDE_TILES, TILES, TILES_M128, TILES_WIDE_N
    assert [hd for hd, t in TILES["sm_90a"].items() if t.staged_store] == [64, 96, 128, 192, 256]
    assert [hd for hd, t in TILES["sm_90a"].items() if t.o_buffer] == [64]
    assert all(t.staged_store for t in TILES_M128["sm_90a"].values())
    assert all(t.staged_store and t.o_buffer for t in TILES_WIDE_N["sm_90a"].values())
    tables = (TILES_M128["sm_90a"], DECODE_TILES, DECODE_WIDE_TILES)
    assert not any(t.o_buffer for table in tables for t in table.values())
    assert not any(t.staged_store
                   for table in (DECODE_TILES, DECODE_WIDE_TILES) for t in table.values())


@pytest.mark.parametrize("lens", [[2048] * 16, [16384] + [512] * 32, [7], [5, 0, 5],
                                  list(ZIPF_DOCS)])
def test_varlen_length_is_exact_for_one_long_document_and_a_lower_bound_otherwise(lens):
    from fa4_aot.plan import varlen_length
    total, exact = sum(lens), sum(n * n for n in lens) / sum(lens)
    est = varlen_length(total, len(lens), max(lens))
    assert total / len(lens) <= est <= exact + 1e-9
    if len(set(lens[1:])) <= 1:
        assert est == pytest.approx(exact)
    assert varlen_length(total, len(lens), 10 * total) <= total  # max_seqlen past the total
