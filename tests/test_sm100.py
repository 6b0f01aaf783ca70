"""The sm_100a (Blackwell) kernels: built and inspected here, never run (no Blackwell GPU)."""

import json

import pytest

from conftest import ROOT

MANIFEST = json.loads((ROOT / "artifacts/manifest.json").read_text())
SM100 = {n: r for n, r in MANIFEST["kernels"].items() if r["arch"] == "sm_100a"}


def test_sm100_kernels_shipped():
    scheds = {(r["config"]["dtype"], r["config"]["head_dim"], r["config"]["causal"],
               r["config"]["scheduler"]) for r in SM100.values()}
    assert scheds == {(dt, hd, c, s) for dt in ("bf16", "fp16") for hd in (64, 128)
                      for c in (False, True) for s in ("clc", "static")}


@pytest.mark.parametrize("name", sorted(SM100))
def test_clc_in_ptx_and_launch_record(name):
    rec = SM100[name]
    ptx = (ROOT / "artifacts" / rec["ptx"]).read_text()
    assert ".target sm_100a" in ptx
    has_clc = "clusterlaunchcontrol.try_cancel" in ptx and "clusterlaunchcontrol.query_cancel" in ptx
    assert has_clc == (rec["config"]["scheduler"] == "clc")
    launch = rec["launch"]
    assert launch["block"] == [224, 1, 1] and launch["cluster"] == [1, 1, 1]
    assert launch["grid"]["rule"] == ("tiles" if rec["config"]["scheduler"] == "clc" else "persistent")
    assert not launch["needs_counter"]
    assert rec["resources"]["spill_store_bytes"] == 0


def test_sass_has_getnextworkid():
    """The CLC query becomes UGETNEXTWORKID in the SASS (needs nvdisasm from PyPI)."""
    from build_tools.toolchain import ToolchainError, get_inspect_tools, run_tool
    try:
        tools = get_inspect_tools()
    except ToolchainError as e:
        pytest.skip(f"nvdisasm not available: {e}")
    for name, rec in SM100.items():
        sass = run_tool([tools.nvdisasm, "-c", ROOT / "artifacts" / rec["cubin"]])
        assert ("UGETNEXTWORKID" in sass) == (rec["config"]["scheduler"] == "clc"), name


def test_selection_on_a_blackwell_device(monkeypatch):
    torch = pytest.importorskip("torch")
    from fa4_aot import interface
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (10, 0))
    name, rec = interface.select_kernel(torch.device("cuda", 0), torch.bfloat16, 128, True)
    assert rec["arch"] == "sm_100a" and rec["config"]["scheduler"] == "clc"
    assert rec["launch"]["dynamic_smem_bytes"] > 0 and rec["launch"]["cluster"] == [1, 1, 1]
    _, rec = interface.select_kernel(torch.device("cuda", 0), torch.float16, 64, False, "static")
    assert rec["config"]["scheduler"] == "static" and rec["arch"] == "sm_100a"
    _, rec = interface.select_kernel(torch.device("cuda", 0), torch.float16, 64, False, "steal")
    assert rec["config"]["scheduler"] == "clc"  # work stealing on Blackwell is CLC
    with pytest.raises(ValueError, match="not available on sm_100a"):
        interface.select_kernel(torch.device("cuda", 0), torch.float16, 64, False, "single")
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (8, 0))
    with pytest.raises(RuntimeError, match="compute capability 8.0"):
        interface.select_kernel(torch.device("cuda", 0), torch.float16, 64, False)


def test_sm100_source_structure():
    """Readable units (issue 11): no kernel function takes more than 12 parameters, the K/V
    depth comes from configs.TILES only, the CLC scheduler lives behind tile_sched's interface."""
    import ast
    src = (ROOT / "fa4_aot/kernels/sm100_fwd.py").read_text()
    for node in ast.walk(ast.parse(src)):
        if isinstance(node, ast.FunctionDef):
            n = len(node.args.args) + len(node.args.kwonlyargs)
            assert n <= 12, f"{node.name} takes {n} parameters"
    assert "KV_STAGES" not in src and "issue_clc_query" not in src
    sched = (ROOT / "fa4_aot/kernels/tile_sched.py").read_text()
    assert "class ClcScheduler(TileScheduler)" in sched
    assert "class AtomicCounterScheduler(TileScheduler)" in sched
