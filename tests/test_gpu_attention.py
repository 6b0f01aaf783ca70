"""GPU correctness tests (skip cleanly without an sm_90 GPU)."""

import math

import pytest

torch = pytest.importorskip("torch")

import fa4_aot  # noqa: E402
from fa4_aot.testing import attention_ref, check_close  # noqa: E402

HAS_SM90 = torch.cuda.is_available() and torch.cuda.get_device_capability() == (9, 0)
pytestmark = pytest.mark.skipif(
    not HAS_SM90, reason="needs an sm_90 (Hopper) GPU: the shipped sm_90a cubins run only there")

DTYPES = [torch.bfloat16, torch.float16]
SCHEDS = ["single", "static", "steal"]


def _run_and_check(b, sq, sk, h, hk, d, dtype, causal, sched, seed=0):
    g = torch.Generator(device="cuda").manual_seed(seed)
    q = torch.randn(b, sq, h, d, device="cuda", dtype=dtype, generator=g)
    k = torch.randn(b, sk, hk, d, device="cuda", dtype=dtype, generator=g)
    v = torch.randn(b, sk, hk, d, device="cuda", dtype=dtype, generator=g)
    poisoned = torch.full_like(q, float("nan"))
    out, lse = fa4_aot.attention(q, k, v, causal=causal, return_lse=True, scheduler=sched,
                                 out=poisoned)
    ref, lse_ref = attention_ref(q, k, v, causal=causal)
    ref_pt, _ = attention_ref(q, k, v, causal=causal, upcast=False)
    check_close(out, ref, ref_pt)
    finite = torch.isfinite(lse_ref)
    assert torch.equal(torch.isfinite(lse), finite), "LSE -inf pattern differs"
    assert (lse[finite] - lse_ref[finite]).abs().max().item() < 1e-2 if finite.any() else True
    return out


SHAPES = [  # b, sq, sk, h, hk
    (1, 1, 1, 1, 1),
    (2, 17, 17, 3, 3),
    (1, 127, 255, 2, 1),
    (2, 1000, 1000, 4, 2),
    (1, 257, 100, 2, 2),     # seqlen_q > seqlen_k: causal rows fully masked
    (1, 4097, 4097, 2, 2),
]


@pytest.mark.parametrize("dtype", DTYPES, ids=["bf16", "fp16"])
@pytest.mark.parametrize("d", [64, 128])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_matches_reference(shape, causal, d, dtype):
    b, sq, sk, h, hk = shape
    _run_and_check(b, sq, sk, h, hk, d, dtype, causal, "auto")


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("shape", [(1, 128, 128, 1, 1), (1, 64, 64, 1, 1), (3, 999, 1500, 5, 5),
                                   (2, 2048, 2048, 67, 67)], ids=lambda s: "x".join(map(str, s)))
def test_schedulers_bitwise_identical(shape, causal):
    b, sq, sk, h, hk = shape
    outs = [_run_and_check(b, sq, sk, h, hk, 128, torch.bfloat16, causal, s) for s in SCHEDS]
    for s, o in zip(SCHEDS[1:], outs[1:]):
        assert torch.equal(o, outs[0]), f"{s} differs from single"


def test_fresh_inputs_each_seed():
    for seed in range(3):
        _run_and_check(2, 333, 333, 3, 3, 64, torch.bfloat16, True, "steal", seed=seed)


def test_steal_many_launches_and_graph():
    q = torch.randn(2, 700, 4, 128, device="cuda", dtype=torch.bfloat16)
    k = torch.randn_like(q)
    v = torch.randn_like(q)
    ref = fa4_aot.attention(q, k, v, causal=True, scheduler="single")
    for i in range(200):
        out = fa4_aot.attention(q, k, v, causal=True, scheduler="steal")
        assert torch.equal(out, ref), f"launch {i}"
    static_out = torch.empty_like(q)
    g = torch.cuda.CUDAGraph()
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        fa4_aot.attention(q, k, v, causal=True, scheduler="steal")  # warm (loads the cubin)
        with torch.cuda.graph(g, stream=s):
            static_out.copy_(fa4_aot.attention(q, k, v, causal=True, scheduler="steal"))
    torch.cuda.current_stream().wait_stream(s)
    for _ in range(100):
        static_out.fill_(float("nan"))
        g.replay()
        torch.cuda.synchronize()
        assert torch.equal(static_out, ref)


def test_softmax_scale_and_lse():
    q = torch.randn(1, 300, 2, 64, device="cuda", dtype=torch.float16)
    k = torch.randn(1, 300, 2, 64, device="cuda", dtype=torch.float16)
    v = torch.randn_like(k)
    out, lse = fa4_aot.attention(q, k, v, softmax_scale=0.3, return_lse=True)
    ref, lse_ref = attention_ref(q, k, v, softmax_scale=0.3)
    ref_pt, _ = attention_ref(q, k, v, softmax_scale=0.3, upcast=False)
    check_close(out, ref, ref_pt)
    assert (lse - lse_ref).abs().max().item() < 1e-2
    assert not math.isnan(lse.sum().item())
