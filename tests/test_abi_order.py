"""The launch ABI's parameter ORDER is proved on the CPU (fa4_aot/abi.py, build_tools/abi_probe.py).

Sizes and alignments alone cannot tell seqlen_q from seqlen_k; these tests compile a probe
kernel per spec that stores each argument at its spec position, read the PTX back, and show
that a copy of the spec with two same-size parameters swapped fails the check."""

import dataclasses
import json
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("cutlass", reason="needs nvidia-cutlass-dsl (the build venv: make test)")

from build_tools.abi_probe import check_order  # noqa: E402
from fa4_aot import abi  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
FAMILIES = sorted(abi.SPECS)


@pytest.fixture(scope="module")
def probe_maps():
    """{family: {offset: PTX param index}}; one subprocess per spec (the DSL compiles one
    probe per process)."""
    out = {}
    for fam in FAMILIES:
        code = ("import json\n"
                "from fa4_aot import abi\n"
                "from build_tools.abi_probe import probe_ptx, stored_param_at\n"
                "print(json.dumps(stored_param_at(probe_ptx(abi.SPECS[%r]))))" % fam)
        res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                             timeout=300, cwd=ROOT)
        assert res.returncode == 0, res.stderr[-2000:]
        out[fam] = {int(k): v for k, v in json.loads(res.stdout.strip().splitlines()[-1]).items()}
    return out


@pytest.mark.parametrize("family", FAMILIES)
def test_spec_order_is_ptx_order(probe_maps, family):
    spec = abi.SPECS[family]
    at = probe_maps[family]
    assert len(at) == len(list(spec.args()))
    assert check_order(spec, at) == []


def _swap(spec, group, i, j):
    groups = list(spec.groups)
    g = next(k for k, x in enumerate(groups) if x.name == group)
    args = list(groups[g].args)
    assert args[i].kind == args[j].kind  # same size: invisible to the size/alignment check
    args[i], args[j] = args[j], args[i]
    groups[g] = dataclasses.replace(groups[g], args=tuple(args))
    return dataclasses.replace(spec, groups=tuple(groups))


def test_swapped_same_size_parameters_fail_the_check(probe_maps):
    spec = abi.FWD_SM90
    names = [a.name for a in spec.groups[2].args]
    bad = _swap(spec, "Shape", names.index("seqlen_q"), names.index("seqlen_k"))
    # The size/alignment check of the PTX entry cannot see it ...
    good_params = abi.ptx_params(spec, "bf16", 128, 128, 128)
    bad_params = abi.ptx_params(bad, "bf16", 128, 128, 128)
    assert abi.check_against_ptx(bad_params, good_params) == []
    # ... the order check does.
    assert sorted(check_order(spec, probe_maps[spec.family], bad)) == ["seqlen_k", "seqlen_q"]


def test_kernels_take_the_spec_arguments_in_order():
    from fa4_aot.kernels.combine import FlashCombineSm90
    from fa4_aot.kernels.sm90 import FlashFwdSm90Decode, FlashFwdSm90Prefill
    from fa4_aot.kernels.sm100_fwd import FlashFwdSm100
    for spec, kernel in ((abi.FWD_SM90, FlashFwdSm90Prefill), (abi.FWD_SM90, FlashFwdSm90Decode),
                         (abi.FWD_SM100, FlashFwdSm100), (abi.COMBINE_SM90, FlashCombineSm90)):
        assert abi.check_signature(spec, kernel.__call__) == []
    swapped = dataclasses.replace(abi.FWD_SM90, groups=abi.FWD_SM90.groups[::-1])
    assert abi.check_signature(swapped, FlashFwdSm90Prefill.__call__)
