"""The GPU sweep's pure parts on the CPU: its cases are fixed by their seed, every case is a
valid call that the planner sends where the sweep means it to (through the whole host path
with the fake driver), the kernel cases reach every sm_90a kernel, and a case whose process
hangs is cut off."""

import sys

import pytest

from fa4_aot import sweep
from fa4_aot.configs import CONFIG_SPACE

torch = pytest.importorskip("torch")
import fa4_aot  # noqa: E402
import fakecuda  # noqa: E402
from fa4_aot import interface  # noqa: E402


def test_cases_are_fixed_by_the_seed():
    assert sweep.cases(count=5) == sweep.cases(count=5)
    assert sweep.cases(count=5, seed=1) != sweep.cases(count=5)
    drawn = sweep.cases(count=40)
    assert {c.family for c in drawn} == set(sweep.FAMILIES)
    assert {c.d for c in drawn} == set(sweep.HEAD_DIMS)
    assert {c.dtype for c in drawn} == {"bf16", "fp16", "e4m3kv", "e4m3qkv"}
    assert any(c.h % 2 and c.h > 1 for c in drawn) and any(c.sq % 2 and c.sq > 1 for c in drawn)
    assert {c.head_major for c in drawn} == {False, True}
    assert {c.mask for c in drawn} >= {"none", "causal", "window", "softcap", "causal_softcap"}
    assert all(max(c.sq, c.sk) <= 1100 for c in sweep.cases(count=20, small=True)
               if c.family != "kernels")


def test_every_case_is_valid_and_reaches_its_kernel(monkeypatch):
    monkeypatch.setenv("FA4_AOT_EXPERIMENTAL_FP8", "1")
    fakecuda.install(monkeypatch)
    reached = set()
    with torch.no_grad():
        for c in sweep.cases(count=8):
            args, kw, _ = sweep.make_call(c, device="cpu")
            interface.clear_memo()
            fa4_aot.attention(*args, **kw)
            names = {kl.name.removeprefix("fake_") for p in interface.memo_plans()
                     for kl in p.launches}
            reached |= names
    want = {cfg.name for cfg in CONFIG_SPACE
            if cfg.arch == "sm_90a" and not cfg.trace}
    assert want - reached == set()
    for cfg, c in zip([x for x in CONFIG_SPACE
                       if x.arch == "sm_90a" and x.kind == "fwd" and not x.trace],
                      sweep.kernel_cases()):
        args, kw, _ = sweep.make_call(c, device="cpu")
        interface.clear_memo()
        with torch.no_grad():
            fa4_aot.attention(*args, **kw)
        (plan,) = interface.memo_plans()
        assert plan.launches[0].name == "fake_" + cfg.name, c.describe()


def test_a_hung_case_is_cut_off(tmp_path):
    log = tmp_path / "sweep.jsonl"
    log.write_text("")
    child = [sys.executable, "-c",
             f"open({str(log)!r}, 'a').write('{{}}\\n'); import time; time.sleep(60)"]
    status, logged = sweep._supervise(child, str(log), 0, timeout_s=2)
    assert status is None and logged == 1


def test_summary_counts_crashes_apart():
    recs = [{"family": "dense", "ok": True, "kernels": ["a"]},
            {"family": "dense", "ok": False, "error": "x"},
            {"family": "paged", "ok": False, "crash": True, "error": "y"}]
    table = sweep.summarize(recs).splitlines()
    assert table[1].split() == ["dense", "2", "1", "1", "0", "1"]
    assert table[-1].split() == ["all", "3", "1", "1", "1", "1"]
