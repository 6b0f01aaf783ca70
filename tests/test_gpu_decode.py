"""GPU tests of the decode path: packed GQA + split-KV + the combine kernel, seqused_k, varlen
keys (skip cleanly without an sm_90 GPU)."""

import pytest

torch = pytest.importorskip("torch")

import fa4_aot  # noqa: E402
from conftest import memo_plan  # noqa: E402
from fa4_aot.testing import attention_ref, check_close  # noqa: E402

HAS_SM90 = torch.cuda.is_available() and torch.cuda.get_device_capability() == (9, 0)
pytestmark = pytest.mark.skipif(
    not HAS_SM90, reason="needs an sm_90 (Hopper) GPU: the shipped sm_90a cubins run only there")

H = 8  # query heads


def _inputs(b, sq, sk, h, hk, d, dtype=torch.bfloat16, seed=0):
    g = torch.Generator(device="cuda").manual_seed(seed)
    q = torch.randn(b, sq, h, d, device="cuda", dtype=dtype, generator=g)
    k = torch.randn(b, sk, hk, d, device="cuda", dtype=dtype, generator=g)
    v = torch.randn(b, sk, hk, d, device="cuda", dtype=dtype, generator=g)
    return q, k, v


def _check(out, lse, q, k, v, **kw):
    ref, lse_ref = attention_ref(q, k, v, **kw)
    ref_pt, _ = attention_ref(q, k, v, upcast=False, **kw)
    check_close(out, ref, ref_pt)
    finite = torch.isfinite(lse_ref)
    assert torch.equal(torch.isfinite(lse), finite), "LSE -inf pattern differs"
    if finite.any():
        assert (lse[finite] - lse_ref[finite]).abs().max().item() < 1e-2


MASKS = {"full": {}, "causal": {"causal": True}, "window": {"window_size": (300, 0)}}


@pytest.mark.parametrize("mask", list(MASKS))
@pytest.mark.parametrize("group", [1, 4, 8])
@pytest.mark.parametrize("sk", [1, 17, 1000, 8191, 32768])
@pytest.mark.parametrize("sq", [1, 2, 4, 7, 16])
def test_decode_matches_reference(sq, sk, group, mask):
    b = 2
    q, k, v = _inputs(b, sq, sk, H, H // group, 128, seed=sq * 7 + sk)
    out = torch.full_like(q, float("nan"))
    out, lse = fa4_aot.attention(q, k, v, return_lse=True, out=out, **MASKS[mask])
    _check(out, lse, q, k, v, **MASKS[mask])


@pytest.mark.parametrize("d", [64, 96, 128, 192, 256])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
def test_decode_head_dims(d, dtype):
    q, k, v = _inputs(3, 3, 2000, 8, 2, d, dtype)
    out, lse = fa4_aot.attention(q, k, v, causal=True, return_lse=True, num_splits=5)
    _check(out, lse, q, k, v, causal=True)


@pytest.mark.parametrize("num_splits", [1, 2, 3, 7, 16, 33, 64])
def test_forced_splits_correct_and_close_to_unsplit(num_splits):
    q, k, v = _inputs(2, 4, 5000, 32, 8, 128)
    out, lse = fa4_aot.attention(q, k, v, causal=True, return_lse=True, num_splits=num_splits)
    _check(out, lse, q, k, v, causal=True)
    one, lse1 = fa4_aot.attention(q, k, v, causal=True, return_lse=True, num_splits=1)
    # The combine is fp32: split and unsplit differ by output rounding only.
    assert (out.float() - one.float()).abs().max().item() <= 2 ** -7 * one.float().abs().max().item()
    assert (lse - lse1).abs().max().item() < 1e-4


def test_more_splits_than_key_blocks():
    q, k, v = _inputs(1, 1, 300, 8, 8, 128)  # 3 key blocks, 64 splits: most splits are empty
    out, lse = fa4_aot.attention(q, k, v, return_lse=True, num_splits=64)
    _check(out, lse, q, k, v)


def test_softcap_decode():
    q, k, v = _inputs(2, 2, 3000, 16, 4, 128)
    for ns in (1, 4):
        out, lse = fa4_aot.attention(q, k, v, causal=True, softcap=15.0, return_lse=True,
                                     num_splits=ns)
        _check(out, lse, q, k, v, causal=True, softcap=15.0)


@pytest.mark.parametrize("softcap", [0.0, 15.0])
@pytest.mark.parametrize("mask", list(MASKS))
@pytest.mark.parametrize("d", [64, 128, 256])
def test_wide_decode_kernels(d, mask, softcap):
    """Many packed rows (seqlen_q * group > 128) with forced splits run on the 128-row decode
    kernels: their three-run mainloop (masked / unmasked / below a window's edge); with a
    softcap (a run-time value there) every block takes the masked run, which caps."""
    q, k, v = _inputs(2, 100, 1500, 16, 4, d, seed=d)
    kw = dict(MASKS[mask], **({"softcap": softcap} if softcap else {}))
    out, lse = fa4_aot.attention(q, k, v, return_lse=True, num_splits=2, **kw)
    _check(out, lse, q, k, v, **kw)


@pytest.mark.parametrize("num_splits", [1, 4])
def test_seqused_k(num_splits):
    b, sk = 4, 3000
    q, k, v = _inputs(b, 1, sk, 16, 4, 128)
    used = torch.tensor([0, 1, 1024, 2999], dtype=torch.int32, device="cuda")
    out = torch.full_like(q, float("nan"))
    out, lse = fa4_aot.attention(q, k, v, causal=True, return_lse=True, seqused_k=used,
                                 num_splits=num_splits, out=out)
    for i, n in enumerate(used.tolist()):
        ref, lse_ref = attention_ref(q[i:i + 1], k[i:i + 1, :n], v[i:i + 1, :n], causal=True)
        if n == 0:
            assert (out[i] == 0).all() and torch.isinf(lse[i]).all()
            continue
        ref_pt, _ = attention_ref(q[i:i + 1], k[i:i + 1, :n], v[i:i + 1, :n], causal=True,
                                  upcast=False)
        check_close(out[i:i + 1], ref, ref_pt)
        assert (lse[i] - lse_ref[0]).abs().max().item() < 1e-2


def test_varlen_keys_decode():
    lens_k = [1, 700, 4096, 129, 3000]
    b, h, hk, d = len(lens_k), 32, 8, 128
    cu_k = torch.tensor([0] + list(torch.tensor(lens_k).cumsum(0)), dtype=torch.int32,
                        device="cuda")
    cu_q = torch.arange(b + 1, dtype=torch.int32, device="cuda")
    q = torch.randn(b, h, d, device="cuda", dtype=torch.bfloat16)
    k = torch.randn(sum(lens_k), hk, d, device="cuda", dtype=torch.bfloat16)
    v = torch.randn_like(k)
    for ns in (None, 1, 6):
        out, lse = fa4_aot.attention(q, k, v, causal=True, return_lse=True, cu_seqlens_q=cu_q,
                                     cu_seqlens_k=cu_k, max_seqlen_q=1, max_seqlen_k=max(lens_k),
                                     num_splits=ns)
        for i, n in enumerate(lens_k):
            s = sum(lens_k[:i])
            qi, ki, vi = q[i:i + 1, None], k[None, s:s + n], v[None, s:s + n]
            ref, lse_ref = attention_ref(qi, ki, vi, causal=True)
            ref_pt, _ = attention_ref(qi, ki, vi, causal=True, upcast=False)
            check_close(out[i:i + 1, None], ref, ref_pt)
            assert (lse[:, i] - lse_ref[0, :, 0]).abs().max().item() < 1e-2


def test_decode_graph_capture_and_custom_op():
    q, k, v = _inputs(8, 1, 4096, 32, 8, 128)
    ref = fa4_aot.attention(q, k, v, causal=True, num_splits=4)
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        fa4_aot.attention(q, k, v, causal=True, num_splits=4)
    torch.cuda.current_stream().wait_stream(s)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = fa4_aot.attention(q, k, v, causal=True, num_splits=4)
    for _ in range(3):
        graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(out, ref)
    o2, _ = torch.ops.fa4_aot.fwd(q, k, v, [None] * 5, [0, 0, -1, -1, 0], True, None, "auto",
                                  0.0)
    check_close(o2, *[attention_ref(q, k, v, causal=True, upcast=u)[0] for u in (True, False)])


@pytest.mark.parametrize("d", [64, 128])
def test_packed_gqa_rows_bitwise_equal_to_unpacked(d):
    # Packing a KV head's query heads into one tile changes no row's arithmetic: the same
    # call with K/V repeated per query head (no packing) gives the same bits (64 packed rows:
    # the 64-row decode kernel either way).
    q, k, v = _inputs(2, 8, 3000, 64, 8, d)
    packed = fa4_aot.attention(q, k, v, causal=True, num_splits=1)
    plain = fa4_aot.attention(q, k.repeat_interleave(8, dim=2), v.repeat_interleave(8, dim=2),
                              causal=True, num_splits=1)
    assert torch.equal(packed, plain)
    if d == 64:  # hd64: the decode and prefill kernels share the key block (128 keys)
        assert torch.equal(packed, fa4_aot.attention(q, k, v, causal=True, scheduler="single"))


@pytest.mark.parametrize("d", [64, 128, 256])
@pytest.mark.parametrize("sq,h,hk", [(16, 64, 8), (16, 32, 2), (40, 32, 4), (3, 48, 1)])
@pytest.mark.parametrize("mask", ["causal", "window"])
def test_short_gqa_queries_on_the_128_row_decode_kernels(sq, h, hk, d, mask):
    """More packed rows than one 64-row tile, without splits: the 128-row decode kernels
    (contiguous K/V, one tile or several per KV head; 48 query heads of one KV head: 144
    packed rows, a partial second tile)."""
    from fa4_aot import interface
    q, k, v = _inputs(2, sq, 1500, h, hk, d)
    interface.clear_memo()
    out, lse = fa4_aot.attention(q, k, v, return_lse=True, **MASKS[mask])
    main = memo_plan().launches[0]  # (+ the combine when split)
    assert main.record["config"]["decode"] and main.record["launch"]["tile"]["m"] == 128
    _check(out, lse, q, k, v, **MASKS[mask])


@pytest.mark.parametrize("num_splits", [2, 5])
def test_forced_splits_on_long_queries_use_the_wide_decode_kernels(num_splits):
    q, k, v = _inputs(2, 300, 3000, 8, 4, 128)  # 600 packed rows: the 128-row decode form
    out, lse = fa4_aot.attention(q, k, v, causal=True, return_lse=True, num_splits=num_splits)
    _check(out, lse, q, k, v, causal=True)


@pytest.mark.parametrize("h,hk,sq", [(12, 4, 5), (24, 4, 30), (6, 2, 50)])
def test_groups_that_do_not_divide_the_tile(h, hk, sq):
    # Groups of 3 and 6 query heads: an m tile of packed rows holds partial groups (its rows
    # start mid-group), in the 64-row and the 128-row (wide) decode kernels.
    q, k, v = _inputs(2, sq, 1500, h, hk, 128)
    out, lse = fa4_aot.attention(q, k, v, causal=True, return_lse=True, num_splits=2)
    _check(out, lse, q, k, v, causal=True)
