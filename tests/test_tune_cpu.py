"""``make tune``'s CPU half (build_tools/tune.py prepare / apply), the choice rule, the spill
report's timing columns and ``build.py --ptxas tuned`` with its reproducibility check. The GPU
half (``tune.py measure``) needs an sm_90 GPU: here only its shape table is checked."""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
import sys

import pytest

from build_tools import build as bld
from build_tools import spill_report, tune
from build_tools import toolchain as tcm
from conftest import ROOT

SHIPPED = json.loads((ROOT / "artifacts/manifest.json").read_text())
V130, V131, V135 = "13.0.88", "13.1.115", "13.5.37"
SMALL = ("combine_sm_90a_fp16_hd64", "fwd_sm_90a_fp16_hd64_full_single_m192n128s4")


# --------------------------------------------------------------------------- pure


def test_every_sm90_kernel_has_a_representative_call():
    families = {}
    for name, rec in SHIPPED["kernels"].items():
        if rec["arch"] != "sm_90a":
            continue
        cfg = rec["config"]
        s = tune.shape_for(cfg)
        families.setdefault(s["family"], []).append(name)
        assert s["head_dim"] == cfg["head_dim"] and s["dtype"] == cfg["dtype"]
        assert (s["window"] is not None) == cfg["local"]
        assert (s["softcap"] > 0) == cfg["softcap"] and s["trace"] == cfg["trace"]
        if s["family"] == "prefill":
            assert s["scheduler"] == cfg["scheduler"] and s["causal"] == (cfg["causal"])
        else:
            assert s["scheduler"] == "steal"
        if cfg["decode"]:
            rows = s["seqlen_q"] * s["heads"] // s["heads_k"]
            assert rows <= cfg["tile"]["m"]  # one packed tile of the kernel's height
        json.dumps(s)
    assert set(families) == {"prefill", "decode", "decode_wide", "combine"}
    assert len(families["combine"]) == 10


def test_choice_fastest_then_fewest_spills_then_newest():
    choose = tune.choose_measured
    chosen, why = choose({V130: 100.0, V131: 104.0, V135: 103.0})
    assert chosen == V130 and why.startswith("fastest") and "3.0%" in why
    # within 1 %: a tie, the newest wins when nobody spills
    chosen, why = choose({V130: 100.0, V131: 100.5, V135: 100.9})
    assert chosen == V135 and "newest" in why
    # a tie is won by the fewest spills first
    res = {V130: {"ldl": 0}, V131: {"ldl": 4, "stl": 4}, V135: {"spill_store_bytes": 8}}
    chosen, why = choose({V130: 100.4, V131: 100.0, V135: 100.2}, resources=res)
    assert chosen == V130 and "fewest spills" in why
    # the measured spread widens the noise band
    assert choose({V130: 100.0, V135: 102.0})[0] == V130
    assert choose({V130: 100.0, V135: 102.0}, spread=0.03)[0] == V135
    assert choose({V131: 50.0}) == (V131, "only version timed")
    with pytest.raises(ValueError):
        choose({})


# --------------------------------------------------------------------------- prepare


@pytest.fixture(scope="module")
def toolchains():
    try:
        return {r: tcm.get_toolchain(r) for r in ("13.0", "13.1")}
    except tcm.FetchError as exc:
        pytest.skip(f"PyPI unreachable, cannot fetch ptxas 13.0/13.1: {exc}")


def _tune(*args):
    return subprocess.run([sys.executable, str(ROOT / "build_tools/tune.py"), *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=300)


def test_prepare_assembles_each_candidate_into_a_loadable_folder(toolchains, tmp_path):
    only = "^(" + "|".join(SMALL) + ")$"
    r = _tune("prepare", "--candidates", "13.0,13.1", "--only", only, "--out", str(tmp_path))
    assert r.returncode == 0, r.stdout + r.stderr
    assert "13.1.115: the shipped cubins" in r.stdout  # the shipped set is that candidate
    assert [p.name for p in tmp_path.iterdir()] == [V130]
    folder = tmp_path / V130
    assert sorted(p.name for p in (folder / "sm_90a").iterdir()) == sorted(f"{n}.cubin"
                                                                          for n in SMALL)
    m = json.loads((folder / "manifest.json").read_text())
    assert m["build"]["ptxas_version"] == V130 and m["build"]["tune_candidate"]
    for name in SMALL:
        rec, ship = m["kernels"][name], SHIPPED["kernels"][name]
        assert rec["ptxas_version"] == V130 and rec["launch"] == ship["launch"]
        assert rec["config"] == ship["config"] and rec["entry"] == ship["entry"]
        data = (folder / rec["cubin"]).read_bytes()
        assert hashlib.sha256(data).hexdigest() == rec["sha256"]
        ptx = (ROOT / "artifacts" / ship["ptx"]).read_bytes()
        assert rec["ptx_sha256"] == hashlib.sha256(ptx).hexdigest()
    # The runtime's loader reads it; the overlay falls back to the shipped set.
    from fa4_aot.manifest import Manifest, load_manifest
    cand = Manifest(folder)
    assert cand.cubin_bytes(SMALL[0])[:4] == b"\x7fELF"
    over = tune.Overlay(cand, load_manifest(str(ROOT / "artifacts")))
    name, rec = over.find("sm_90a", "fp16", 64, True, "steal", decode=True, wide=True)
    assert rec == SHIPPED["kernels"][name] and over.cubin_bytes(SMALL[1]) == \
        cand.cubin_bytes(SMALL[1])
    assert [label for label, _ in tune.candidate_sets(tmp_path)] == ["shipped", V130]
    # Cached: nothing assembled again.
    r2 = _tune("prepare", "--candidates", "13.0,13.1", "--only", only, "--out", str(tmp_path))
    assert r2.returncode == 0 and "2 cached, 0 to assemble" in r2.stdout, r2.stdout + r2.stderr


# --------------------------------------------------------------------------- apply, report


def _small_artifacts(tmp_path, names):
    """A copy of the shipped manifest reduced to ``names``, with their cubins."""
    out = tmp_path / "art"
    (out / "sm_90a").mkdir(parents=True)
    # as built, before any tuning (the committed manifest may carry measured blocks)
    kernels = {n: {k: v for k, v in SHIPPED["kernels"][n].items() if k != "measured"}
               for n in names}
    for rec in kernels.values():
        shutil.copy(ROOT / "artifacts" / rec["cubin"], out / rec["cubin"])
    (out / "manifest.json").write_text(json.dumps({**SHIPPED, "kernels": kernels}))
    return out


def _fake_measured(path, table):
    kernels = {}
    for name, us in table.items():
        kernels[name] = {"shape": tune.shape_for(SHIPPED["kernels"][name]["config"]),
                         "us": us, "spread": 0.002,
                         "resources": {v: {"registers": 128, "spill_store_bytes": 0,
                                           "spill_load_bytes": 0, "ldl": 0, "stl": 0}
                                       for v in us}}
    path.write_text(json.dumps({"gpu": "NVIDIA H200", "torch": "2.11", "kernels": kernels}))


def test_apply_writes_measured_and_the_report_shows_it(tmp_path):
    names = ["fwd_sm_90a_bf16_hd64_causal_steal_m192n128s4", SMALL[1], SMALL[0]]
    art = _small_artifacts(tmp_path, names)
    _fake_measured(tmp_path / "measured.json", {
        names[0]: {V130: 400.0, V131: 420.0, V135: 419.0},  # 13.0 clearly fastest
        names[1]: {V130: 200.0, V131: 200.2, V135: 200.1},  # a tie: the newest
    })
    r = _tune("apply", "--measured", str(tmp_path / "measured.json"),
              "--manifest", str(art / "manifest.json"))
    assert r.returncode == 0, r.stdout + r.stderr
    assert "2 of 3 sm_90a kernels have >= 2 ptxas versions timed" in r.stdout
    m = json.loads((art / "manifest.json").read_text())
    k = m["kernels"]
    assert k[names[0]]["measured"]["chosen"] == V130
    assert k[names[0]]["measured"]["chosen_release"] == "13.0"
    assert k[names[0]]["measured"]["gpu"] == "NVIDIA H200"
    assert k[names[1]]["measured"]["chosen"] == V135
    assert "measured" not in k[names[2]]
    for n in names:  # nothing else changed
        assert ({f: v for f, v in k[n].items() if f != "measured"}
                    == {f: v for f, v in SHIPPED["kernels"][n].items() if f != "measured"})

    text = spill_report.render(spill_report.shipped_rows(art / "manifest.json"), "table", False)
    lines = text.splitlines()
    head = lines[0]
    assert "µs" in head and "pick" in head and "dyn smem" not in head and "warn" not in head
    assert max(len(ln) for ln in lines[:5]) <= spill_report.WIDTH
    row0 = next(ln for ln in lines if names[0] in ln)
    assert "420.0" in row0 and "13.0 -4.8%" in row0
    row1 = next(ln for ln in lines if names[1] in ln)
    assert "200.2" in row1 and "13.5 -0.0%" in row1
    row2 = next(ln for ln in lines if names[2] in ln)
    assert row2.rstrip().endswith("-")
    assert "pick: the ptxas tune.py picked (the fastest" in " ".join(text.split())
    # the matrix cells (--ptxas / --diff) carry the µs of each version, * = the choice
    rows = spill_report.shipped_rows(art / "manifest.json")
    for r_ in rows:
        r_.update(spill_report._timing_fields(m["kernels"][r_["kernel"]], V130))
        r_["ptxas_version"], r_["ptxas_release"] = V130, "13.0"
    matrix = spill_report.render(rows, "table", True)
    assert "400.0µs*" in matrix and "µs = the manifest's measured median" in matrix


# --------------------------------------------------------------------------- --ptxas tuned


def test_tuned_build_uses_the_measured_choice_and_reproduces(toolchains, tmp_path):
    pytest.importorskip("cutlass", reason="nvidia-cutlass-dsl not installed")
    name = SMALL[1]
    out = tmp_path / "out"
    out.mkdir()
    # The manifest to rebuild says 13.0 measured fastest for this kernel.
    rec = {**SHIPPED["kernels"][name], "measured": {
        "us": {V130: 10.0, V131: 11.0}, "chosen": V130, "chosen_release": "13.0",
        "reason": "fastest", "gpu": "NVIDIA H200", "shape": {}}}
    (out / "manifest.json").write_text(json.dumps({**SHIPPED, "kernels": {name: rec}}))
    r = subprocess.run([sys.executable, str(ROOT / "build_tools/build.py"), "--ptxas", "tuned",
                        "--out", str(out), "--only", f"^{name}$", "--jobs", "1"], cwd=ROOT,
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    m = json.loads((out / "manifest.json").read_text())
    new = m["kernels"][name]
    assert m["build"]["ptxas_release"] == "tuned"
    assert new["ptxas_version"] == V130
    assert new["ptxas_choice"] == {"mode": "tuned", "chosen": "13.0", "reason": "measured: fastest"}
    assert new["measured"]["chosen"] == V130
    # the same PTX as the shipped kernel: only ptxas differs
    assert (out / new["ptx"]).read_bytes() == (ROOT / "artifacts" / new["ptx"]).read_bytes()
    # Reproducible from the manifest: the same ptxas per kernel, the same bytes.
    assert bld.check_reproducible(None, 1, f"^{name}$", committed_path=out / "manifest.json") == 0


def test_table_summarises_families_and_the_gain_over_newest(tmp_path):
    names = ["fwd_sm_90a_bf16_hd64_causal_steal_m192n128s4", "fwd_sm_90a_fp16_hd64_causal_steal_m192n128s4"]
    kernels = {}
    for n, us in zip(names, ({V130: 400.0, V131: 420.0, V135: 440.0},
                             {V130: 300.0, V131: 300.0, V135: 300.0})):
        chosen, why = tune.choose_measured(us)
        kernels[n] = {**SHIPPED["kernels"][n], "measured": {
            "us": us, "chosen": chosen, "reason": why, "gpu": "NVIDIA H200",
            "resources": {v: {"registers": 168} for v in us}}}
    path = tmp_path / "manifest.json"
    path.write_text(json.dumps({**SHIPPED, "kernels": kernels}))
    text = tune.table(path)
    assert "| hd64 causal steal | 2 | 168 / 0 / 346.4 |" in text  # geomean of 400 and 300
    assert "168 / 0 / 300.0 *" not in text and "ptxas 13.5" in text
    assert "for 1 kernels" in text and "+4.88%" in text  # sqrt(440/400) - 1 over newest


# --------------------------------------------------------------------------- measure's host path


@pytest.mark.parametrize("name", [
    "combine_sm_90a_bf16_hd128",
    "fwd_sm_90a_bf16_hd128_causal_steal_m128n128s3_decode",
    "fwd_sm_90a_fp16_hd64_local_steal_m64n128s3_decode",
    "fwd_sm_90a_bf16_hd128_causal_static_m128n128s2_trace",
    "fwd_sm_90a_fp16_hd96_local_steal_m128n128s2_softcap",
    "fwd_sm_90a_bf16_hd64_causal_steal_m128n128s3",
])
def test_measure_forces_the_kernel_and_times_its_launch_alone(monkeypatch, name):
    """tune.measure's host path on CPU tensors with the fake driver (tests/fakecuda.py): the
    call, prepared against the candidate's manifest with the kernel forced
    (fa4_aot.interface.prepare), runs that kernel (a combine kernel: after its decode kernel),
    and the timed callable launches exactly that one kernel with the call's grid."""
    torch = pytest.importorskip("torch")
    import fakecuda
    from fa4_aot import interface
    from fa4_aot.manifest import load_manifest
    if name not in SHIPPED["kernels"]:
        pytest.skip(f"{name} is not shipped")
    drv = fakecuda.install(monkeypatch)
    man = tune.Overlay(None, load_manifest(str(ROOT / "artifacts")))
    shape = tune.shape_for(SHIPPED["kernels"][name]["config"])
    small = {**shape, "batch": 2, "seqlen_q": min(shape["seqlen_q"], 256),
             "seqlen_k": 512}
    dt = {"bf16": torch.bfloat16, "fp16": torch.float16}[shape["dtype"]]
    q = torch.randn(small["batch"], small["seqlen_q"], small["heads"], small["head_dim"], dtype=dt)
    k = torch.randn(small["batch"], small["seqlen_k"], small["heads_k"], small["head_dim"],
                    dtype=dt)
    before = len(drv.launches)
    prep = tune._prepare_launch(name, small, man, q, k, k)
    launched = prep.launch["launches"]
    assert name in launched and len(drv.launches) - before == len(launched)
    if SHIPPED["kernels"][name]["config"]["kind"] == "combine":
        assert launched[-1] == name and len(launched) == 2
    n = len(drv.launches)
    prep()
    prep()
    assert len(drv.launches) == n + 2
    assert list(drv.launches[-1]["grid"]) == prep.launch["grid"]
    assert not interface.prepared_calls()  # prepared outside the memo
