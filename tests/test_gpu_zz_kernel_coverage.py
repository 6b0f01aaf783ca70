"""Every sm_90a kernel of the manifest is launched by the GPU suite (fa4_aot counts launches
under FA4_AOT_COUNT_LAUNCHES, which tests/conftest.py sets). Runs after every other test
(conftest orders it last) and only when the whole GPU suite was collected."""

import pytest
from conftest import FULL_GPU_SUITE

torch = pytest.importorskip("torch")

HAS_SM90 = torch.cuda.is_available() and torch.cuda.get_device_capability() == (9, 0)


def test_every_sm90_kernel_was_launched(request):
    if not HAS_SM90:
        pytest.skip("needs an sm_90 (Hopper) GPU: the shipped sm_90a cubins run only there")
    if not request.config.stash.get(FULL_GPU_SUITE, False):
        pytest.skip("only meaningful when the whole GPU suite runs (no -k/-m selection, every "
                    "tests/test_gpu_*.py collected)")
    from fa4_aot.interface import launch_counts
    from fa4_aot.manifest import load_manifest
    counts = launch_counts()
    assert counts is not None, "FA4_AOT_COUNT_LAUNCHES was not set when fa4_aot was imported"
    kernels = {n for n, r in load_manifest().kernels.items() if r["arch"] == "sm_90a"}
    never = sorted(kernels - set(counts))
    assert not never, f"{len(never)} of {len(kernels)} sm_90a kernels never launched: {never}"

