"""sm_100a GPU tests: skip everywhere here (there is no Blackwell GPU in this project)."""

import pytest

torch = pytest.importorskip("torch")

import fa4_aot  # noqa: E402
from fa4_aot.testing import attention_ref, check_close  # noqa: E402

pytestmark = pytest.mark.skipif(
    not (torch.cuda.is_available() and torch.cuda.get_device_capability() == (10, 0)),
    reason="needs an sm_100 (Blackwell B200) GPU: the sm_100a kernels are built and inspected "
           "on the CPU but have never run on hardware")


@pytest.mark.parametrize("sched", ["clc", "static"])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("d", [64, 128])
def test_sm100_matches_reference(sched, causal, d):
    q = torch.randn(2, 1000, 4, d, device="cuda", dtype=torch.bfloat16)
    k = torch.randn(2, 1000, 2, d, device="cuda", dtype=torch.bfloat16)
    v = torch.randn_like(k)
    out = fa4_aot.attention(q, k, v, causal=causal, scheduler=sched)
    ref, _ = attention_ref(q, k, v, causal=causal)
    ref_pt, _ = attention_ref(q, k, v, causal=causal, upcast=False)
    check_close(out, ref, ref_pt)


def test_clc_and_static_bitwise_identical():
    q = torch.randn(1, 4097, 3, 128, device="cuda", dtype=torch.bfloat16)
    a = fa4_aot.attention(q, q, q, causal=True, scheduler="clc")
    b = fa4_aot.attention(q, q, q, causal=True, scheduler="static")
    assert torch.equal(a, b)
