"""``build.py --ptxas best``: the tie-break (pure), the candidate list, and a real CPU build of one
small configuration with two candidate ptxas releases (13.0, 13.1) into a temporary folder."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys

import pytest

from build_tools import build as bld
from build_tools import toolchain as tcm
from build_tools.inspect_cubin import parse_tkinfo
from conftest import ROOT

VERSIONS = {"12.9": "12.9.86", "13.0": "13.0.88", "13.1": "13.1.115", "13.2": "13.2.86",
            "13.5": "13.5.37"}


def cand(release: str, regs=168, spill=0, ldl=0, stl=0) -> dict:
    return {"ptxas_version": VERSIONS[release], "registers": regs, "spill_store_bytes": spill,
            "spill_load_bytes": spill, "ldl": ldl, "stl": stl}


# --------------------------------------------------------------------------- tie-break (pure)


def test_no_spill_bytes_beat_fewer_local_ops():
    # 13.0 has no spill bytes but many LDL/STL (role spills); 13.1 spills a little.
    assert bld.choose_ptxas({"13.0": cand("13.0", ldl=40, stl=40),
                             "13.1": cand("13.1", spill=8, ldl=2, stl=2)}) == \
        ("13.0", "no spills (13.1 spills 16 bytes)")


def test_then_fewest_ldl_plus_stl():
    best, reason = bld.choose_ptxas({"12.9": cand("12.9", ldl=3, stl=3),
                                     "13.1": cand("13.1", regs=120, ldl=4, stl=4),
                                     "13.5": cand("13.5", ldl=1, stl=6)})
    assert best == "12.9" and reason == "fewest LDL+STL: 6 vs 7 with 13.5"


def test_then_fewest_registers():
    assert bld.choose_ptxas({"13.0": cand("13.0", regs=154), "13.5": cand("13.5", regs=168)}) == \
        ("13.0", "fewest registers: 154 vs 168 with 13.5")


def test_then_newest_version_compared_numerically():
    best, reason = bld.choose_ptxas({r: cand(r) for r in ("12.9", "13.0", "13.2", "13.1")})
    assert best == "13.2" and reason.endswith("newest")
    assert bld.choose_ptxas({"12.9": cand("12.9"), "13.0": cand("13.0")})[0] == "13.0"


def test_failed_candidates_are_ignored_and_all_failing_is_an_error():
    cands = {"13.0": {"ptxas_version": "13.0.88", "error": "ToolchainError: ptxas crashed"},
             "13.1": cand("13.1", ldl=9)}
    assert bld.choose_ptxas(cands) == ("13.1", "only version tried")
    with pytest.raises(ValueError):
        bld.choose_ptxas({"13.0": cands["13.0"]})


def test_candidate_list():
    assert bld.best_candidates(None) == list(tcm.SUPPORTED_PTXAS)
    assert bld.best_candidates("") == list(tcm.SUPPORTED_PTXAS)
    assert bld.best_candidates(" 13.1, 12.9,13.1 ") == ["12.9", "13.1"]
    with pytest.raises(tcm.ToolchainError, match="12.8"):
        bld.best_candidates("12.8,13.0")
    with pytest.raises(tcm.ToolchainError, match="valid"):
        bld.best_candidates("13.0,14.0")


def test_fingerprint_depends_on_the_candidate_set():
    from fa4_aot.configs import CONFIG_SPACE
    cfg = CONFIG_SPACE[0]
    fps = {bld.kernel_fingerprint(cfg, "src", "4.8.1", key, False)
           for key in ("13.1.115", "best:13.0.88,13.1.115", "best:13.1.115",
                       "best:12.9.86,13.0.88,13.1.115")}
    assert len(fps) == 4


# --------------------------------------------------------------------------- real build

NAME = "fwd_sm_90a_fp16_hd64_full_single_m192n128s4"
NO_DSL = "nvidia-cutlass-dsl not installed (make test installs it)"


def _build(*args, env=None):
    return subprocess.run([sys.executable, str(ROOT / "build_tools/build.py"), *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=600,
                          env={**os.environ, **(env or {})})


@pytest.fixture(scope="module")
def toolchains():
    pytest.importorskip("cutlass", reason=NO_DSL)
    try:
        return {r: tcm.get_toolchain(r) for r in ("13.0", "13.1")}
    except tcm.FetchError as exc:
        pytest.skip(f"PyPI unreachable, cannot fetch ptxas 13.0/13.1: {exc}")


def test_best_build_records_the_choice_and_ships_the_chosen_cubin(toolchains, tmp_path):
    only = f"^{NAME}$"
    r = _build("--ptxas", "best", "--best-candidates", "13.0,13.1", "--only", only,
               "--out", str(tmp_path), "--jobs", "2")
    assert r.returncode == 0, r.stdout + r.stderr
    assert "ptxas best of 13.0." in r.stdout and f"ptxas best: {NAME} -> " in r.stdout
    m = json.loads((tmp_path / "manifest.json").read_text())
    b = m["build"]
    assert b["ptxas_release"] == "best" and b["ptxas_candidates"] == ["13.0", "13.1"]
    assert b["ptxas_candidate_versions"] == {r: t.ptxas_version for r, t in toolchains.items()}

    rec = m["kernels"][NAME]
    choice = rec["ptxas_choice"]
    assert choice["mode"] == "best" and set(choice["candidates"]) == {"13.0", "13.1"}
    for release, c in choice["candidates"].items():
        assert c["ptxas_version"] == toolchains[release].ptxas_version
        assert set(c) == {"ptxas_version", "ptxas_warnings", *bld.CANDIDATE_FIELDS}
        assert c["ptxas_warnings"] == []
        assert c["registers"] > 0 and c["ldl"] >= 0
    chosen = choice["chosen"]
    assert (chosen, choice["reason"]) == bld.choose_ptxas(choice["candidates"])
    assert rec["ptxas_version"] == toolchains[chosen].ptxas_version
    assert {k: rec["resources"][k] for k in bld.CANDIDATE_FIELDS} == \
        {k: choice["candidates"][chosen][k] for k in bld.CANDIDATE_FIELDS}

    # The shipped cubin is the chosen ptxas's: its tkinfo note says so; sha256 is the file's.
    cubin = tmp_path / rec["cubin"]
    elf = tcm.run_tool([toolchains[chosen].cuobjdump, "-elf", cubin])
    tk = parse_tkinfo(elf)
    assert tk["tool"] == "ptxas" and tk["version"] == rec["ptxas_version"]
    assert hashlib.sha256(cubin.read_bytes()).hexdigest() == rec["sha256"]
    assert (tmp_path / rec["ptxas_log"]).read_text().count("Used") >= 1
    assert sorted(p.name for p in (tmp_path / "sm_90a").iterdir()) == sorted(
        [f"{NAME}.cubin", f"{NAME}.ptx", f"{NAME}.ptxas.log"])  # no candidate leftovers

    # Incremental: same candidates -> nothing to do; another candidate set -> rebuilt.
    r2 = _build("--ptxas", "best", "--best-candidates", "13.1,13.0", "--only", only,
                "--out", str(tmp_path), "--jobs", "2")
    assert r2.returncode == 0 and "1 up to date, 0 to build" in r2.stdout, r2.stdout + r2.stderr
    r3 = _build("--ptxas", "best", "--only", only, "--out", str(tmp_path), "--jobs", "2",
                env={bld.BEST_CANDIDATES_ENV: "13.1"})
    assert r3.returncode == 0 and "0 up to date, 1 to build" in r3.stdout, r3.stdout + r3.stderr
    m3 = json.loads((tmp_path / "manifest.json").read_text())
    assert m3["build"]["ptxas_candidates"] == ["13.1"]
    assert m3["kernels"][NAME]["ptxas_choice"]["reason"] == "only version tried"


def test_best_candidates_flag_needs_best_and_refuses_12_8(tmp_path):
    pytest.importorskip("cutlass", reason=NO_DSL)
    r = _build("--ptxas", "13.1", "--best-candidates", "13.0", "--out", str(tmp_path))
    assert r.returncode == 2 and "--best-candidates needs --ptxas best" in r.stderr
    r = _build("--ptxas", "best", "--best-candidates", "12.8,13.0", "--out", str(tmp_path),
               "--only", "nothing")
    assert r.returncode == 2 and "12.8" in r.stderr and "--allow-isa-rewrite" in r.stderr
