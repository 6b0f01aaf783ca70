"""The seeded random sweep (fa4_aot.sweep) as GPU tests: random calls of every form and one
call per sm_90a kernel, each synchronised and checked against an fp32 reference with
FlashAttention's rule. Skip cleanly without an sm_90 GPU. The longer run, with each case in a
process of its own so that a crash is pinned to its call: ``python -m fa4_aot.sweep``."""

import pytest

from fa4_aot import sweep

torch = pytest.importorskip("torch")

HAS_SM90 = torch.cuda.is_available() and torch.cuda.get_device_capability() == (9, 0)
pytestmark = pytest.mark.skipif(
    not HAS_SM90, reason="needs an sm_90 (Hopper) GPU: the shipped sm_90a cubins run only there")

RANDOM_CASES = 30  # per random family


@pytest.fixture(autouse=True)
def _fp8_enabled(monkeypatch):
    from fa4_aot.validate import FP8_ENV
    monkeypatch.setenv(FP8_ENV, "1")


@pytest.mark.parametrize("family", sweep.FAMILIES)
def test_sweep_family(family):
    """Every case of the family (RANDOM_CASES random ones; ``kernels``: one per kernel), each
    synchronised and checked; the failures are listed together."""
    failed = []
    for case in sweep.cases((family,), count=RANDOM_CASES):
        rec = sweep.run_case(case)
        if not rec["ok"]:
            failed.append(f"{rec['error']}\n    {rec['case']}\n    kernels: {rec['kernels']}")
    assert not failed, f"{len(failed)} {family} cases failed:\n" + "\n".join(failed)
