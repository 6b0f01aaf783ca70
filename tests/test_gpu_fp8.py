"""GPU tests of the FP8 kernels (FA3's descales) against the FA rule with ref = the fp32
attention of the dequantized inputs (e4m3 * descale) and out_pt = what the kernels compute in
lower precision: for the decode kernels (e4m3 K/V converted exactly to bf16, bf16 MMAs and P)
the bf16 attention of bf16(e4m3 * descale); for the prefill kernels (FP8 wgmmas) FA3's FP8
rule emulated in fp32, P rounded to e4m3 (``fa4_aot.testing.fp8_attention_ref``). Skip
cleanly without an sm_90 GPU."""

import pytest

torch = pytest.importorskip("torch")

import fa4_aot  # noqa: E402
from conftest import memo_plan  # noqa: E402
from fa4_aot.testing import check_close, check_close_lower, fp8_references  # noqa: E402

HAS_SM90 = torch.cuda.is_available() and torch.cuda.get_device_capability() == (9, 0)
pytestmark = pytest.mark.skipif(
    not HAS_SM90, reason="needs an sm_90 (Hopper) GPU: the shipped sm_90a cubins run only there")

E4M3 = torch.float8_e4m3fn


@pytest.fixture(autouse=True)
def _fp8_enabled(monkeypatch):
    from fa4_aot.validate import FP8_ENV
    monkeypatch.setenv(FP8_ENV, "1")


def _case(b, sq, sk, h, hk, d, fp8_q, scale=(1.0, 1.0, 1.0), seed=0, fill=None):
    g = torch.Generator(device="cuda").manual_seed(seed)
    q = torch.randn(b, sq, h, d, device="cuda", generator=g)
    k = torch.randn(b, sk, hk, d, device="cuda", generator=g)
    v = torch.randn(b, sk, hk, d, device="cuda", generator=g)
    if fill is not None:
        q, k, v = (torch.full_like(x, fill) for x in (q, k, v))
    ds = [torch.rand(b, hk, device="cuda", generator=g) * 0.5 + 0.75 for _ in range(3)]
    ds = [x * s for x, s in zip(ds, scale)]
    k8, v8 = k.to(E4M3), v.to(E4M3)
    q_in = q.to(E4M3) if fp8_q else q.bfloat16()
    return q_in, k8, v8, ds


def _check(out, q_in, k8, v8, ds, fp8_q, **kw):
    """The decode kernels' rule: out_pt is the bf16 attention of the dequantized inputs."""
    assert fp8_q == (q_in.dtype == E4M3)
    ref, (ref_pt,), _ = fp8_references(q_in, k8, v8, ds, **kw)
    check_close(out, ref, ref_pt)


@pytest.mark.parametrize("fp8_q", [False, True], ids=["bf16_q", "e4m3_q"])
@pytest.mark.parametrize("d", [64, 128, 256])
@pytest.mark.parametrize("mask", ["full", "causal", "window", "softcap"])
@pytest.mark.parametrize("sq,sk,group", [(1, 1, 4), (1, 1000, 4), (4, 8191, 8), (16, 300, 1)])
def test_fp8_decode_matches_reference(fp8_q, d, mask, sq, sk, group):
    kw = {"full": {}, "causal": {"causal": True}, "window": {"window_size": (200, 0)},
          "softcap": {"causal": True, "softcap": 5.0}}[mask]  # the descales into softcap_pre
    q, k8, v8, ds = _case(2, sq, sk, 8, 8 // group, d, fp8_q, seed=sq + sk + d)
    out = fa4_aot.attention(q, k8, v8, q_descale=ds[0] if fp8_q else None, k_descale=ds[1],
                            v_descale=ds[2], **kw)
    assert out.dtype == torch.bfloat16
    _check(out, q, k8, v8, ds, fp8_q, **kw)


@pytest.mark.parametrize("scale", [1e-3, 1e3])
@pytest.mark.parametrize("fp8_q", [False, True], ids=["bf16_q", "e4m3_q"])
def test_fp8_extreme_descales(scale, fp8_q):
    q, k8, v8, ds = _case(3, 2, 2000, 8, 2, 128, fp8_q, scale=(scale,) * 3)
    out = fa4_aot.attention(q, k8, v8, causal=True, num_splits=4,
                            q_descale=ds[0] if fp8_q else None, k_descale=ds[1], v_descale=ds[2])
    _check(out, q, k8, v8, ds, fp8_q, causal=True)


@pytest.mark.parametrize("fill", [0.0, 448.0, -448.0])
def test_fp8_zero_and_saturating_inputs(fill):
    q, k8, v8, ds = _case(2, 1, 700, 8, 2, 128, True, fill=fill)
    out = fa4_aot.attention(q, k8, v8, q_descale=ds[0], k_descale=ds[1], v_descale=ds[2])
    _check(out, q, k8, v8, ds, True)


def test_fp8_paged_split_and_expanded_descales():
    """vLLM's call: an e4m3 paged cache (shuffled pages of 16), per-layer descales expanded to
    (batch, heads_k), seqused_k, causal decode of 1 new token."""
    b, h, hk, d, page, pages = 4, 32, 8, 128, 16, 40
    g = torch.Generator(device="cuda").manual_seed(1)
    used = torch.tensor([1, 17, 400, 640], dtype=torch.int32, device="cuda")
    kc = torch.randn(b * pages, page, hk, d, device="cuda", generator=g).to(E4M3)
    vc = torch.randn(b * pages, page, hk, d, device="cuda", generator=g).to(E4M3)
    table = torch.randperm(b * pages, device="cuda", generator=g).int().view(b, pages)
    q = torch.randn(b, 1, h, d, device="cuda", generator=g).bfloat16()
    kd = torch.tensor(0.37, device="cuda").expand(b, hk)
    vd = torch.tensor(1.9, device="cuda").expand(b, hk)
    out = fa4_aot.attention(q, kc, vc, causal=True, page_table=table, seqused_k=used,
                            k_descale=kd, v_descale=vd)
    for i in range(b):
        n = int(used[i])
        k = kc[table[i]].reshape(1, -1, hk, d)[:, :n]
        v = vc[table[i]].reshape(1, -1, hk, d)[:, :n]
        _check(out[i:i + 1], q[i:i + 1], k, v, (None, kd[i:i + 1], vd[i:i + 1]), False,
               causal=True)


@pytest.mark.parametrize("fp8_q", [True, False], ids=["e4m3_q", "bf16_q"])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("b,s,h,hk", [(2, 1000, 8, 8), (1, 4096, 16, 4), (3, 333, 4, 1)])
@pytest.mark.parametrize("scale", [1.0, 1e-4, 1e-3, 1e3, 1e4])
def test_fp8_prefill_matches_the_fp8_rule(causal, b, s, h, hk, scale, fp8_q):
    """The FP8 prefill kernels (dense e4m3 k, v and e4m3 q, or a bf16 q quantized per call;
    FP8 wgmmas, P in e4m3)."""
    q, k8, v8, ds = _case(b, s, s, h, hk, 128, fp8_q, scale=(scale,) * 3, seed=s + h)
    if not fp8_q:
        q, ds[0] = q * scale, None
    fa4_aot.interface.clear_memo()
    out = fa4_aot.attention(q, k8, v8, causal=causal, q_descale=ds[0], k_descale=ds[1],
                            v_descale=ds[2])
    assert "_decode_" not in memo_plan().launches[0].name  # the FP8 prefill kernel ran
    ref, pts, _ = fp8_references(q, k8, v8, ds, emulate=True, causal=causal)
    check_close_lower(out, ref, pts)


@pytest.mark.parametrize("prefill", [False, True], ids=["decode", "prefill"])
@pytest.mark.parametrize("which,value", [("q", 0.0), ("k", 0.0), ("v", 0.0),
                                         ("q", float("nan")), ("k", float("inf")),
                                         ("v", float("inf")), ("k", float("nan"))])
def test_fp8_zero_and_nonfinite_descales(prefill, which, value):
    """A zero q/k descale makes every score 0 (uniform attention), a zero v descale a zero
    output; a NaN or infinite descale makes the output of its (batch, KV head) non-finite and
    leaves every other row as it is (docs/design.md#fp8)."""
    sq = 300 if prefill else 2
    q, k8, v8, ds = _case(2, sq, 700, 8, 2, 128, True, seed=5)
    ds[{"q": 0, "k": 1, "v": 2}[which]][1, 0] = value
    out = fa4_aot.attention(q, k8, v8, q_descale=ds[0], k_descale=ds[1], v_descale=ds[2])
    torch.cuda.synchronize()
    hit = out[1, :, :4]  # batch 1, the query heads of KV head 0
    rest = torch.cat([out[0].flatten(), out[1, :, 4:].flatten()])
    assert torch.isfinite(rest).all()
    if value != value or value == float("inf"):
        assert not torch.isfinite(hit).any()
        return
    assert torch.isfinite(hit).all()
    ref, pts, _ = fp8_references(q, k8, v8, ds, emulate=prefill)
    check_close_lower(out, ref, pts)
