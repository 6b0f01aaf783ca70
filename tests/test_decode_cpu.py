"""Decode path on the CPU: the split heuristic, the routing rule, and the launch values of the
decode kernels (packed GQA, split-KV + combine, paged KV, seqused) through the whole host path
with a fake driver (tests/fakecuda.py)."""

import pytest

from fa4_aot.plan import (MIN_BLOCKS_PER_SPLIT, choose_num_splits, use_decode_kernels,
                          use_wide_tile)
from fa4_aot.schedule import split_ranges

torch = pytest.importorskip("torch")
import fa4_aot  # noqa: E402
import fakecuda  # noqa: E402
from conftest import memo_plan  # noqa: E402


@pytest.mark.parametrize("tiles,n_blocks,sms,want", [
    (256, 64, 132, 1),    # B=32 x 8 KV heads, 8k keys: 97 % of two waves already
    (64, 256, 132, 2),    # B=8 x 8 KV heads, 32k keys: 128 items, one full wave
    (8, 1024, 132, 16),   # B=1 x 8 KV heads, 128k keys
    (1024, 64, 132, 1),
    (4, 3, 132, 1),       # too few key blocks to split
])
def test_split_heuristic_examples(tiles, n_blocks, sms, want):
    assert choose_num_splits(tiles, n_blocks, sms) == want


@pytest.mark.parametrize("tiles", [1, 3, 7, 20, 64, 100])
@pytest.mark.parametrize("n_blocks", [1, 5, 64, 1000])
def test_split_heuristic_bounds(tiles, n_blocks):
    s = choose_num_splits(tiles, n_blocks, 132)
    assert 1 <= s <= max(1, n_blocks // MIN_BLOCKS_PER_SPLIT)


@pytest.mark.parametrize("n_min,n_max,splits", [(0, 64, 5), (3, 10, 64), (0, 1, 1), (7, 7, 3)])
def test_split_ranges_cover_every_block_once(n_min, n_max, splits):
    ranges = split_ranges(n_min, n_max, splits)
    assert len(ranges) == splits
    covered = [b for lo, hi in ranges for b in range(lo, hi)]
    assert covered == list(range(n_min, n_max))


def test_routing_rule():
    assert use_decode_kernels(1, 4, None, "auto")
    assert use_decode_kernels(16, 8, None, "steal")
    assert use_decode_kernels(17, 8, None, "auto")      # 136 packed rows: 2 tiles against 8
    assert use_decode_kernels(16, 16, None, "auto")     # 2 tiles against 16
    assert use_decode_kernels(64, 4, None, "auto")      # 2 tiles against 4
    assert not use_decode_kernels(100, 4, None, "auto")  # 4 tiles either way
    assert not use_decode_kernels(50, 3, None, "auto")   # 2 against 3: not half
    assert not use_decode_kernels(256, 8, None, "auto")  # 16 either way
    assert not use_decode_kernels(129, 1, None, "auto")  # no group to pack
    assert use_decode_kernels(4096, 1, 4, "auto")               # asked for splits
    assert not use_decode_kernels(1, 4, None, "single")
    assert not use_decode_kernels(1, 4, None, "auto", trace=True)
    # the 128-row decode kernels once the packed rows pass one 64-row tile
    assert not use_wide_tile(1, 64) and not use_wide_tile(8, 8)
    assert use_wide_tile(16, 8) and use_wide_tile(65, 1) and use_wide_tile(16, 16)


@pytest.mark.parametrize("sq,h,hk,m,m_blocks", [(8, 64, 8, 64, 1), (16, 64, 8, 128, 1),
                                                 (16, 32, 2, 128, 2), (100, 16, 4, 128, 1)])
def test_short_gqa_queries_take_the_packed_tiles(monkeypatch, sq, h, hk, m, m_blocks):
    """Packed rows past one 64-row tile take the 128-row decode kernels; GQA calls whose query
    heads would leave the 128-row prefill tiles mostly empty are packed too; the rest keep the
    prefill kernels (one query head per tile)."""
    fakecuda.install(monkeypatch)
    q = torch.randn(2, sq, h, 128, dtype=torch.bfloat16)
    k = torch.randn(2, 1000, hk, 128, dtype=torch.bfloat16)
    with torch.no_grad():
        fa4_aot.attention(q, k, k, causal=True)
    main = memo_plan().launches[0]
    packed = main.record["launch"]["pack_gqa"]
    assert packed == use_decode_kernels(sq, h // hk, None, "auto")
    assert main.record["launch"]["tile"]["m"] == m
    assert main.values["num_m_blocks"] == m_blocks


def _launches(drv):
    return [l for l in drv.launches]


def test_decode_call_packs_gqa_and_splits(monkeypatch):
    from fa4_aot import interface
    drv = fakecuda.install(monkeypatch)
    b, sk, h, hk, d = 2, 4096, 8, 2, 128
    q = torch.randn(b, 1, h, d, dtype=torch.bfloat16)
    k = torch.randn(b, sk, hk, d, dtype=torch.bfloat16)
    with torch.no_grad():
        fa4_aot.attention(q, k, k, causal=True, num_splits=4)
    (entry,) = interface.prepared_calls()
    plan = entry.plan
    main, comb = plan.launches
    assert main.record["launch"]["pack_gqa"] and main.record["launch"]["tile"]["m"] == 64
    v = main.values
    # one 64-row tile of 1 x 4 packed rows per (KV head, batch), times 4 splits
    assert (v["num_m_blocks"], v["num_tiles"], v["num_splits"]) == (1, 1 * hk * b * 4, 4)
    assert v["acc_rows"] == b * 1 and v["seq_mode"] == 0
    assert plan.acc_shapes == ((4, b, h, d), (4, b, h))
    assert comb.name.startswith("fake_combine") and comb.grid == (-(-b * h // 4), 1, 1)
    assert comb.values["num_splits"] == 4 and comb.values["num_heads"] == h
    assert len(drv.launches) == 2
    # both launches see the same partial buffers: the main kernel writes, the combine reads
    assert entry.pooled is not None and len(entry.pooled) == 3


def test_paged_call_values(monkeypatch):
    fakecuda.install(monkeypatch)
    b, h, hk, d, ps, pages = 3, 8, 2, 128, 32, 5
    q = torch.randn(b, 2, h, d, dtype=torch.bfloat16)
    cache = torch.randn(20, ps, hk, d, dtype=torch.bfloat16)
    table = torch.zeros(b, pages, dtype=torch.int32)
    used = torch.tensor([1, 40, 160], dtype=torch.int32)
    with torch.no_grad():
        fa4_aot.attention(q, cache, cache, causal=True, page_table=table, seqused_k=used,
                          num_splits=1)
    (main,) = memo_plan().launches
    v = main.values
    assert (v["page_size"], v["pages_per_seq"], v["page_table_stride"]) == (ps, pages, pages)
    assert v["seqlen_k"] == pages * ps and v["k_rows"] == ps and v["k_batch"] == 20
    assert v["seq_mode"] == 4  # seqused_k; k/v not packed
    k_box = next(p for p in main.record["launch"]["params"] if p["name"] == "tma_k")["box"]
    assert k_box[1] == "kv_box_rows" and v["kv_box_rows"] == ps  # a box never crosses a page


def test_chunked_prefill_varlen_q_with_paged_kv(monkeypatch):
    fakecuda.install(monkeypatch)
    q = torch.randn(9, 4, 64, dtype=torch.bfloat16)
    cache = torch.randn(8, 16, 1, 64, dtype=torch.bfloat16)
    cu = torch.tensor([0, 4, 9], dtype=torch.int32)
    with torch.no_grad():
        fa4_aot.attention(q, cache, cache, causal=True, cu_seqlens_q=cu, max_seqlen_q=5,
                          page_table=torch.zeros(2, 3, dtype=torch.int32),
                          seqused_k=torch.tensor([20, 48], dtype=torch.int32))
    v = memo_plan().launches[0].values
    assert v["seq_mode"] == 1 | 4 and v["acc_rows"] == 9 and v["cu_seqlens_k"] == 0


@pytest.mark.parametrize("page,hd,want", [
    (None, 128, 64), (None, 192, 64), (None, 256, 80),  # contiguous: one box per key block
    (16, 128, 16), (32, 128, 32), (48, 128, 16), (64, 128, 64), (128, 128, 64),
    (256, 128, 64), (64, 192, 64), (112, 192, 16), (160, 256, 80), (64, 64, 64),
    (96, 64, 32), (48, 96, 16)])
def test_decode_kv_box_rows(monkeypatch, page, hd, want):
    """The decode kernels' K/V TMA box: the whole key block for contiguous K/V; with pages the
    largest box dividing both the page and the block (never crossing a page). The
    descriptors are encoded with it (the record names the launch value)."""
    drv = fakecuda.install(monkeypatch)
    b, hk = 2, 2
    q = torch.randn(b, 1, 8, hd, dtype=torch.bfloat16)
    kw = {}
    if page is None:
        k = torch.randn(b, 300, hk, hd, dtype=torch.bfloat16)
    else:
        k = torch.randn(6, page, hk, hd, dtype=torch.bfloat16)
        kw = dict(page_table=torch.zeros(b, 3, dtype=torch.int32),
                  seqused_k=torch.tensor([5, 3 * page], dtype=torch.int32))
    with torch.no_grad():
        fa4_aot.attention(q, k, k, causal=True, num_splits=1, **kw)
    (main,) = memo_plan().launches
    assert main.values["kv_box_rows"] == want
    tile = main.record["launch"]["tile"]
    assert tile["n"] % want == 0 and want % 16 == 0 and (page is None or page % want == 0)
    assert {box[1] for box in drv.boxes} == {tile["m"], want}  # rows of the Q and K/V boxes


@pytest.mark.parametrize("kw,exc,match", [
    ({"num_splits": 0}, ValueError, "num_splits"),
    ({"num_splits": 1000}, ValueError, "num_splits"),
    ({"num_splits": 2.0}, ValueError, "num_splits"),
    ({"page_table": "table"}, TypeError, "page_table"),
    ({"page_table": torch.zeros(2, 3, dtype=torch.int64)}, TypeError, "page_table"),
    ({"page_table": torch.zeros(3, 3, dtype=torch.int32)}, ValueError, "page_table"),
    ({"page_table": torch.zeros(2, 3, dtype=torch.int32)}, ValueError, "seqused_k"),
    ({"seqused_k": torch.zeros(3, dtype=torch.int32)}, ValueError, "seqused_k"),
    ({"seqused_q": torch.zeros(2, dtype=torch.float32)}, TypeError, "seqused_q"),
    ({"num_splits": 2, "scheduler": "single"}, ValueError, "scheduler"),
])
def test_decode_argument_errors(monkeypatch, kw, exc, match):
    fakecuda.install(monkeypatch)
    q = torch.randn(2, 1, 4, 64, dtype=torch.bfloat16)
    k = torch.randn(2, 32, 4, 64, dtype=torch.bfloat16)
    with pytest.raises(exc, match=match), torch.no_grad():
        fa4_aot.attention(q, k, k, **kw)


def test_page_size_must_be_a_multiple_of_16(monkeypatch):
    fakecuda.install(monkeypatch)
    q = torch.randn(2, 1, 4, 64, dtype=torch.bfloat16)
    cache = torch.randn(4, 8, 4, 64, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="multiple of 16"), torch.no_grad():
        fa4_aot.attention(q, cache, cache, page_table=torch.zeros(2, 2, dtype=torch.int32),
                          seqused_k=torch.ones(2, dtype=torch.int32))


def test_seqused_refused_on_kernels_without_it(monkeypatch):
    # sm_100a kernels take neither varlen nor seqused: refused by name, never ignored.
    fakecuda.install(monkeypatch, arch="sm_100a")
    q = torch.randn(2, 256, 4, 128, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="seqused"), torch.no_grad():
        fa4_aot.attention(q, q, q, seqused_k=torch.ones(2, dtype=torch.int32))


def test_many_packed_rows_take_the_wide_decode_kernels(monkeypatch):
    # Chunked prefill over a paged cache with 200 x 4 packed rows: the 128-row decode form
    # (two MMA warpgroups); a decode-sized call stays on the 64-row form.
    from fa4_aot import interface
    fakecuda.install(monkeypatch)
    cache = torch.randn(8, 16, 2, 64, dtype=torch.bfloat16)
    table = torch.zeros(1, 8, dtype=torch.int32)
    used = torch.tensor([128], dtype=torch.int32)
    for sq, m in ((200, 128), (4, 64)):
        interface.clear_memo()
        q = torch.randn(1, sq, 8, 64, dtype=torch.bfloat16)
        with torch.no_grad():
            fa4_aot.attention(q, cache, cache, causal=True, page_table=table, seqused_k=used)
        (main,) = memo_plan().launches
        assert main.record["launch"]["tile"]["m"] == m and main.record["config"]["decode"]
        assert main.record["config"]["wide"] == (m == 128)
        assert main.values["num_m_blocks"] == -(-sq * 4 // m)


@pytest.mark.parametrize("kw", [{"num_splits": 2},
                                 {"page_table": torch.zeros(2, 2, dtype=torch.int32),
                                  "seqused_k": torch.ones(2, dtype=torch.int32)}])
def test_splits_and_paging_refused_off_sm90(monkeypatch, kw):
    fakecuda.install(monkeypatch, arch="sm_100a")
    q = torch.randn(2, 1, 4, 64, dtype=torch.bfloat16)
    k = torch.randn(2, 32, 4, 64, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match=r"(split-KV|paged KV)\) kernels exist on sm_90a only; "
                                         "this device is sm_100a"), torch.no_grad():
        fa4_aot.attention(q, k, k, **kw)


def test_kv_l2_promotion_per_kernel_family():
    """The decode kernels' K/V descriptors promote L2 fills to 128 bytes (their reads stream
    from HBM once: 256-byte promotion cost them 7-9 %); the prefill kernels keep 256."""
    from fa4_aot import abi
    from fa4_aot.configs import CONFIG_SPACE
    seen = set()
    for cfg in CONFIG_SPACE:
        if cfg.kind != "fwd" or cfg.arch != "sm_90a":
            continue
        promo = {p["tensor"]: p["l2_promotion"] for p in abi.launch_record(cfg, 0)["params"]
                 if p["kind"] == "tensormap"}
        want = "128B" if cfg.decode else "256B"
        assert promo == {"q": "256B", "k": want, "v": want}, cfg.name
        seen.add(cfg.decode)
    assert seen == {True, False}
