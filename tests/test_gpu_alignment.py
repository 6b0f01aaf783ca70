"""The calls that once left the CUDA context in an error state ("misaligned address"), each
checked against the reference: split-KV partials carved from the scratch pool right after an
LSE of an odd number of floats (1, 3, 5 or 7 query heads at batch 1, with or without
return_lse), an FP8 paged decode at hd256, and a bf16 hd192 causal prefill with the LSE.
Skip cleanly without an sm_90 GPU."""

import pytest

torch = pytest.importorskip("torch")

import fa4_aot  # noqa: E402
from fa4_aot.testing import attention_ref, check_close, dequantize  # noqa: E402

HAS_SM90 = torch.cuda.is_available() and torch.cuda.get_device_capability() == (9, 0)
pytestmark = pytest.mark.skipif(
    not HAS_SM90, reason="needs an sm_90 (Hopper) GPU: the shipped sm_90a cubins run only there")


def _check(out, q, k, v, **kw):
    ref, _ = attention_ref(q, k, v, **kw)
    ref_pt, _ = attention_ref(q, k, v, upcast=False, **kw)
    check_close(out, ref, ref_pt)


@pytest.mark.parametrize("return_lse", [False, True])
@pytest.mark.parametrize("heads", [1, 3, 5, 7, 8])
def test_decode_with_odd_head_counts(heads, return_lse):
    q = torch.randn(1, 1, heads, 128, device="cuda", dtype=torch.bfloat16)
    k = torch.randn(1, 8192, 1, 128, device="cuda", dtype=torch.bfloat16)
    v = torch.randn_like(k)
    res = fa4_aot.attention(q, k, v, causal=True, return_lse=return_lse)
    torch.cuda.synchronize()
    _check(res[0] if return_lse else res, q, k, v, causal=True)


@pytest.mark.parametrize("page", [16, 64])
def test_fp8_paged_decode_hd256(page, monkeypatch):
    monkeypatch.setenv("FA4_AOT_EXPERIMENTAL_FP8", "1")
    e4m3, used = torch.float8_e4m3fn, 1300
    pages = -(-used // page) + 5
    kc = torch.randn(pages, page, 1, 256, device="cuda").to(e4m3)
    vc = torch.randn(pages, page, 1, 256, device="cuda").to(e4m3)
    table = torch.randperm(pages, device="cuda").int()[: -(-used // page)].view(1, -1)
    q = torch.randn(1, 1, 1, 256, device="cuda").to(e4m3)
    ds = torch.full((1, 1), 0.5, device="cuda")
    out = fa4_aot.attention(q, kc, vc, causal=True, page_table=table,
                            seqused_k=torch.tensor([used], dtype=torch.int32, device="cuda"),
                            q_descale=ds, k_descale=ds, v_descale=ds)
    torch.cuda.synchronize()
    k = dequantize(kc[table[0].long()].reshape(1, -1, 1, 256)[:, :used], ds)
    v = dequantize(vc[table[0].long()].reshape(1, -1, 1, 256)[:, :used], ds)
    qf = dequantize(q, ds)
    ref, _ = attention_ref(qf, k, v, causal=True)
    ref_pt, _ = attention_ref(qf.bfloat16(), k.bfloat16(), v.bfloat16(), upcast=False,
                              causal=True)
    check_close(out, ref, ref_pt)


def test_hd192_causal_prefill_with_lse():
    q = torch.randn(1, 4097, 8, 192, device="cuda", dtype=torch.bfloat16)
    k = torch.randn(1, 4097, 4, 192, device="cuda", dtype=torch.bfloat16)
    v = torch.randn_like(k)
    out, lse = fa4_aot.attention(q, k, v, causal=True, return_lse=True)
    torch.cuda.synchronize()
    _check(out, q, k, v, causal=True)
    _, lse_ref = attention_ref(q, k, v, causal=True)
    assert (lse - lse_ref).abs().max().item() < 1e-2
