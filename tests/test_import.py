"""`import fa4_aot` must not load cutlass, nor touch the GPU (torch is imported — it brings
cuda.bindings with it in recent versions — but CUDA is not initialised)."""

import importlib.util
import subprocess
import sys

import pytest

from conftest import ROOT


@pytest.mark.skipif(importlib.util.find_spec("torch") is None,
                    reason="torch is not installed (fa4_aot's runtime needs it)")
def test_import_loads_no_cutlass_and_no_cuda_context():
    code = (
        "import sys; import fa4_aot; "
        "bad = sorted(m for m in sys.modules if m.split('.')[0] == 'cutlass'); "
        "import torch; assert not torch.cuda.is_initialized(); "
        "print(bad); assert not bad, bad"
    )
    r = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr


def test_runtime_modules_never_import_cutlass():
    # Only fa4_aot/kernels (build-time sources) may import cutlass.
    for path in (ROOT / "fa4_aot").glob("*.py"):
        text = path.read_text()
        assert "import cutlass" not in text and "from cutlass" not in text, path
