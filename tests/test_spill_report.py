"""build_tools/spill_report.py: report formats and errors on a synthetic manifest (no
network), version picking, and an end-to-end run with ptxas 13.0 and 13.1 fetched from
PyPI (skipped, saying why, when PyPI cannot be reached; cached in $FA4_AOT_CACHE)."""

from __future__ import annotations

import csv
import io
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from build_tools import spill_report as sr
from build_tools import toolchain as tcm
from build_tools.inspect_cubin import parse_ptx_entries
from build_tools.spill_report import assemble_matrix, changed_rows, main, pick_best, render

ROOT = Path(__file__).resolve().parents[1]
FIXTURES = Path(__file__).parent / "fixtures"
WG_PTX = FIXTURES / "wg_gemm.sm_90a.ptx"
PRESSURE_PTX = FIXTURES / "pressure_maxnreg32.sm_90a.ptx"
(WG_ENTRY,) = parse_ptx_entries(WG_PTX.read_text())


def resources(regs=168, spill_st=0, spill_ld=0, ldl=0, stl=0):
    return {"registers": regs, "stack_frame": spill_st, "spill_store_bytes": spill_st,
            "spill_load_bytes": spill_ld, "ldl": ldl, "stl": stl, "shared_bytes": 164864}  # fmt: skip


def kernel_record(name: str, res: dict, entry: str | None = None, ptx: str | None = None) -> dict:
    return {
        "config": {"head_dim": 128},
        "arch": "sm_90a",
        "entry": entry or f"fa4aot_{name}_0",
        "ptx": ptx or f"sm_90a/{name}.ptx",
        "cubin": f"sm_90a/{name}.cubin",
        "sha256": "0" * 64,
        "ptxas_version": "13.1.115",
        "resources": res,
    }


def write_manifest(folder: Path, kernels: dict, cubins: bool = True) -> Path:
    """A manifest of these records; with ``cubins``, a stand-in file at each record's cubin path
    (the report reads the cubin of every kernel: its sha256 finds cached peaks)."""
    folder.mkdir(parents=True, exist_ok=True)
    if cubins:
        for name, record in kernels.items():
            cubin = folder / record["cubin"]
            cubin.parent.mkdir(parents=True, exist_ok=True)
            cubin.write_bytes(f"not a real cubin: {name}".encode())
    path = folder / "manifest.json"
    build = {"ptxas_version": "13.1.115", "ptxas_release": "13.1"}
    path.write_text(json.dumps({"schema_version": 1, "build": build, "kernels": kernels}))
    return path


@pytest.fixture
def manifest(tmp_path) -> Path:
    return write_manifest(tmp_path / "artifacts", {
        "fwd_clean": kernel_record("fwd_clean", resources()),
        "fwd_role_spill": kernel_record("fwd_role_spill", resources(regs=240, ldl=12, stl=8)),
        "fwd_spill": kernel_record("fwd_spill", resources(regs=255, spill_st=64, spill_ld=96, ldl=4, stl=4)),
    })  # fmt: skip


def run(capsys, *argv) -> tuple[int, str, str]:
    rc = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return rc, out, err


# --------------------------------------------------------------------------- formats


def test_table_marks_spilling_kernels(capsys, manifest):
    rc, out, err = run(capsys, "--manifest", manifest)
    assert rc == 0 and err == ""
    lines = out.splitlines()
    header = [h.strip() for h in lines[0].split("  ") if h.strip()]
    # the default view: spill bytes and LDL/STL as pairs; stack shown (not all 0); no U-loops
    # (unknown in this manifest) and no path column (every path is <arch>/<kernel>.cubin)
    assert header == ["!", "kernel", "arch", "regs", "peak", "roles (peak/budget)", "stack", "spill st/ld",
                      "LDL/STL", "smem", "dyn smem", "ptxas", "warn"]  # fmt: skip
    table, _, footer = out.partition("\n\n")
    rows = {line.split()[1] if line.startswith("!") else line.split()[0]: line for line in table.splitlines()[2:]}
    assert "--peaks` reads them" in footer  # says how to get what the manifest does not record
    assert "cubins: " in footer and "--wide" in footer
    assert rows["fwd_clean"].startswith(" ")
    assert rows["fwd_role_spill"].startswith("!")  # LDL/STL alone count as spilling
    assert rows["fwd_spill"].startswith("!")
    # peaks and static smem are unknown without --peaks: "?", never 0; dyn smem from the manifest
    assert rows["fwd_spill"].split()[1:] == ["fwd_spill", "sm_90a", "255", "?", "?", "64", "64/96", "4/4",
                                             "?", "164864", "13.1.115", "-"]  # fmt: skip
    assert lines[-1] == "3 kernels, 2 spilling, max 255 registers, ptxas 13.1.115"  # totals, last
    assert max(map(len, lines)) <= 160
    assert "\033[" not in out  # not a terminal: no colour
    rc, wide, _ = run(capsys, "--manifest", manifest, "--wide")
    header = [h.strip() for h in wide.splitlines()[0].split("  ") if h.strip()]
    assert header == ["!", "kernel", "arch", "regs", "peak", "roles (peak/budget)", "stack", "spill st",
                      "spill ld", "LDL", "STL", "U-loops", "smem", "dyn smem", "ptxas", "warn",
                      "path"]  # fmt: skip
    spill = next(ln for ln in wide.splitlines() if " fwd_spill " in ln)
    assert spill.split()[-1] == str(manifest.parent / "sm_90a" / "fwd_spill.cubin")


def test_default_view_fits_160_columns_and_shortens_long_names(capsys, tmp_path):
    long = "fwd_" + "_".join(["very_long_configuration_name"] * 6)
    path = write_manifest(tmp_path / "a" / ("deep_folder_" * 8), {long: kernel_record(long, resources())})
    rc, out, _ = run(capsys, "--manifest", path)
    assert rc == 0 and max(map(len, out.splitlines())) <= 160, out
    assert "…" in out.splitlines()[2]
    rc, out, _ = run(capsys, "--manifest", path, "--wide")
    assert long in out and str(path.parent) in out


def test_peaks_are_shown_when_cached(capsys, manifest, tmp_path, monkeypatch):
    import hashlib

    monkeypatch.setenv("FA4_AOT_CACHE", str(tmp_path / "cache"))
    cubin = manifest.parent / "sm_90a" / "fwd_clean.cubin"
    digest = hashlib.sha256(cubin.read_bytes()).hexdigest()
    cache = sr._peak_cache_file(digest)
    assert cache.parent == tmp_path / "cache" / "toolchains" / "reg_peaks" == sr.peak_cache_dir()
    cache.parent.mkdir(parents=True)
    cache.write_text(json.dumps({"fa4aot_fwd_clean_0": {
        "reg_peak": 150, "shared_bytes": 1024,
        "reg_peak_by_role": [{"setmaxnreg": None, "peak": 40, "instructions": 9},
                             {"setmaxnreg": 240, "peak": 150, "instructions": 90}]}}))
    rc, out, _ = run(capsys, "--manifest", manifest)
    clean = next(ln for ln in out.splitlines() if ln.split()[:1] == ["fwd_clean"])
    assert clean.split()[:7] == ["fwd_clean", "sm_90a", "168", "150", "40/168", "150/240", "0"]
    assert "not read yet for 2 kernels" in out  # the other two: the hint, with the cache folder
    assert str(tmp_path / "cache" / "toolchains" / "reg_peaks") in out.replace("\n  ", " ")


def test_missing_cubins_fail_with_the_reason(capsys, tmp_path):
    path = write_manifest(tmp_path, {f"k{i}": kernel_record(f"k{i}", resources()) for i in range(8)},
                          cubins=False)
    (tmp_path / "sm_90a").mkdir()
    (tmp_path / "sm_90a" / "k0.cubin").write_bytes(b"x")
    for extra, n_failed in (((), 7), (("--peaks",), 8)):
        rc, out, err = run(capsys, "--manifest", path, *extra)
        assert rc == 4, err
        assert f"k1 (" in err and f"cubin missing: {tmp_path / 'sm_90a' / 'k1.cubin'}" in err
        assert f"... and {n_failed - 5} more failed, {n_failed} of 8 rows in all" in err
        assert out.splitlines()[-1] == \
            f"8 kernels, 0 spilling, {n_failed} failed, max 168 registers, ptxas 13.1.115"
    # --peaks reads k0, not a cubin: cuobjdump's own reason
    assert "k0 (" in err and "Invalid fatbin header" in err


def test_peaks_say_how_far_they_got(capsys, tmp_path):
    """--peaks reads every cubin's SASS (minutes for a whole manifest): stderr says how far it
    got, a line per tenth when it is not a terminal, the last one without an ETA."""
    try:
        tcm.get_inspect_tools()
    except tcm.ToolchainError as exc:
        pytest.skip(f"cuobjdump/nvdisasm not available: {exc}")
    path = write_manifest(tmp_path, {f"k{i}": kernel_record(f"k{i}", resources())
                                     for i in range(20)})
    rc, out, err = run(capsys, "--manifest", path, "--peaks", "--jobs", "2")
    progress = [ln for ln in err.splitlines() if ln.startswith("spill_report --peaks: ")]
    assert [ln.split()[2] for ln in progress] == [f"{2 * i}/20" for i in range(1, 11)]
    assert "ETA" in progress[0] and "ETA" not in progress[-1]
    assert out.splitlines()[-1].startswith("20 kernels")  # the table is on stdout, whole


def test_empty_manifest_is_refused_with_the_reason(capsys, tmp_path):
    for text in ("{}", "[]", '{"kernels": [1]}'):
        (tmp_path / "manifest.json").write_text(text)
        rc, out, err = run(capsys, "--manifest", tmp_path / "manifest.json")
        assert rc == 2 and out == ""
        assert 'is not a fa4_aot manifest: it has no "kernels" table' in err and err.count("\n") == 1


def test_broken_pipe_is_quiet(manifest):
    proc = subprocess.run(f"'{sys.executable}' '{ROOT / 'build_tools/spill_report.py'}' --manifest '{manifest}' "
                          "--format json | head -1; exit ${PIPESTATUS[0]}",
                          shell=True, executable="bash", capture_output=True, text=True)  # fmt: skip
    assert proc.returncode == 0 and proc.stdout == "[\n" and proc.stderr == "", proc.stderr


def test_paths_after_ptxas_and_diff_are_paths():
    args = sr._parse_args(["--ptxas", "13.0", "13.1", str(WG_PTX)])
    assert args.ptxas == ["13.0", "13.1"] and args.paths == [WG_PTX]
    args = sr._parse_args([str(WG_PTX), "--diff", "13.0", "13.1", str(PRESSURE_PTX)])
    assert args.diff == ["13.0", "13.1"] and args.paths == [WG_PTX, PRESSURE_PTX]
    args = sr._parse_args(["--diff", "13.0", "13.1", str(WG_PTX), "--ptxas", "12.9", "x.cubin"])
    assert args.ptxas == ["12.9"] and args.paths == [Path("x.cubin"), WG_PTX]


def test_colour_only_on_spilling_rows(manifest):
    rows = sr.shipped_rows(manifest)
    coloured = [line for line in render(rows, "table", matrix=False, colour=True).splitlines() if "\033[" in line]
    assert len(coloured) == 2 and all("spill" in line for line in coloured)


def test_markdown(capsys, manifest):
    rc, out, _ = run(capsys, "--manifest", manifest, "--format", "md")
    lines = out.partition("\n\n")[0].splitlines()
    assert rc == 0
    assert lines[0].startswith("| ! | kernel | arch | regs |") and set(lines[1]) == {"|", "-"}
    assert len(lines) == 2 + 3 and "| ! | fwd_spill | sm_90a | 255 |" in out


def test_json(capsys, manifest):
    rc, out, _ = run(capsys, "--manifest", manifest, "--format", "json")
    rows = {r["kernel"]: r for r in json.loads(out)}
    assert rc == 0 and set(rows) == {"fwd_clean", "fwd_role_spill", "fwd_spill"}
    r = rows["fwd_role_spill"]
    assert (r["source"], r["entry"], r["ptxas_version"], r["ptxas_release"]) == (
        "shipped", "fa4aot_fwd_role_spill_0", "13.1.115", "13.1")
    assert (r["registers"], r["ldl"], r["stl"], r["spill_store_bytes"]) == (240, 12, 8, 0)
    assert r["path"] == str(manifest.parent / "sm_90a" / "fwd_role_spill.cubin")


def test_csv(capsys, manifest):
    rc, out, _ = run(capsys, "--manifest", manifest, "--format", "csv")
    rows = list(csv.DictReader(io.StringIO(out)))
    assert rc == 0 and [r["kernel"] for r in rows] == ["fwd_clean", "fwd_role_spill", "fwd_spill"]
    assert rows[2]["spill_load_bytes"] == "96" and rows[0]["arch"] == "sm_90a"


def test_fail_on_spill_names_the_kernels(capsys, manifest, tmp_path):
    rc, _, err = run(capsys, "--manifest", manifest, "--fail-on-spill")
    assert rc == 1
    assert "fwd_role_spill (ptxas 13.1.115) spills: 0 B stores, 0 B loads, 12 LDL, 8 STL" in err
    assert "fwd_spill" in err and "fwd_clean" not in err
    clean = write_manifest(tmp_path / "clean", {"fwd_clean": kernel_record("fwd_clean", resources())})
    assert run(capsys, "--manifest", clean, "--fail-on-spill")[0] == 0


def test_png_heatmap(capsys, manifest, tmp_path):
    pytest.importorskip("matplotlib")
    png = tmp_path / "spills.png"
    rc, _, _ = run(capsys, "--manifest", manifest, "--png", png)
    assert rc == 0 and png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_png_without_matplotlib(capsys, manifest, tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # makes `import matplotlib` fail
    rc, out, err = run(capsys, "--manifest", manifest, "--png", tmp_path / "x.png")
    assert rc == 2 and "needs matplotlib" in err and "pip install -r requirements-build.txt" in err
    assert "fwd_clean" in out  # the report itself is still printed
    # --fail-on-spill's status is kept: 1 (spills) + 2 (no png)
    rc, _, err = run(capsys, "--manifest", manifest, "--png", tmp_path / "x.png", "--fail-on-spill")
    assert rc == 3 and "fwd_spill" in err and "needs matplotlib" in err


def test_build_requirements_carry_matplotlib():
    reqs = (ROOT / "requirements-build.txt").read_text().split()
    assert any(r.split("=")[0].split(">")[0] == "matplotlib" for r in reqs)


def test_runs_as_a_script_with_the_default_manifest(manifest):
    # `python build_tools/spill_report.py` from a folder holding artifacts/manifest.json
    proc = subprocess.run([sys.executable, str(ROOT / "build_tools" / "spill_report.py"), "--format", "json"],
                          cwd=manifest.parents[1], capture_output=True, text=True)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert len(json.loads(proc.stdout)) == 3


# --------------------------------------------------------------------------- errors


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--manifest", "{tmp}/none.json"], "no manifest at"),
        (["--manifest", "{tmp}/bad.json"], "is not a fa4_aot manifest"),
        (["{tmp}/missing.ptx"], "missing.ptx: no such file"),
        (["{tmp}/bad.json"], "expected a .ptx or .cubin file"),
        (["--ptxas", "13.9", str(WG_PTX)], "unknown ptxas version '13.9'; valid: 12.9, 13.0"),
        (["--ptxas", "12.8", str(WG_PTX)], "the minimum ptxas is 12.9"),
        (["--ptxas", "13.1", "--diff", "13.0", "13.9", str(WG_PTX)], "unknown ptxas version '13.9'"),
    ],
)
def test_bad_input_is_one_line_exit_2(capsys, tmp_path, argv, message):
    (tmp_path / "bad.json").write_text("{not json")
    rc, out, err = run(capsys, *(a.format(tmp=tmp_path) for a in argv))
    assert rc == 2 and out == ""
    assert err.startswith("spill_report: error: ") and message in err
    assert err.count("\n") == 1 and "Traceback" not in err


def test_manifest_kernel_without_kept_ptx(capsys, tmp_path):
    record = kernel_record("k", resources())
    del record["ptx"]
    path = write_manifest(tmp_path, {"k": record})
    rc, _, err = run(capsys, "--manifest", path, "--ptxas", "13.1")
    assert rc == 2 and "kernel k has no kept PTX" in err


# --------------------------------------------------------------------------- picking


def row(release: str, regs=90, spill=0, ldl=0, stl=0, entry="e") -> dict:
    version = {"12.9": "12.9.86", "13.0": "13.0.88", "13.1": "13.1.115", "13.2": "13.2.86"}[release]
    return {"kernel": "k", "entry": entry, "arch": "sm_90a", "ptxas_version": version, "ptxas_release": release,
            **resources(regs, spill, spill, ldl, stl)}  # fmt: skip


def test_pick_best_prefers_no_spills_over_fewer_local_ops():
    rows = [row("13.0", spill=0, ldl=30), row("13.1", spill=8, ldl=2)]
    assert pick_best(rows) == ("13.0", "no spills (13.1 spills 16 bytes)")


def test_pick_best_then_fewest_local_ops_then_registers_then_newest():
    assert pick_best([row("13.0", ldl=4), row("13.1", ldl=2, stl=3)]) == ("13.0", "fewest LDL+STL: 4 vs 5 with 13.1")
    assert pick_best([row("12.9", regs=96), row("13.1", regs=90), row("13.0", regs=90)])[0] == "13.1"
    assert pick_best([row("12.9", regs=88), row("13.1", regs=90)]) == (
        "12.9", "fewest registers: 88 vs 90 with 13.1")
    best, reason = pick_best([row("13.2"), row("13.0"), row("13.1")])
    assert best == "13.2" and reason.endswith("newest")
    assert pick_best([row("13.1")]) == ("13.1", "only version tried")


def test_pick_best_avoids_ptxas_performance_warnings():
    warned = {**row("13.1", regs=80), "ptxas_warnings": ["C7512"]}
    assert pick_best([warned, row("13.0", regs=90)]) == (
        "13.0", "no ptxas performance warning (13.1: C7512)")
    spilling = {**row("13.0", spill=8), "ptxas_warnings": []}
    assert pick_best([warned, spilling])[0] == "13.1"  # spills still rank first


def test_pick_best_sums_entries_of_one_version():
    rows = [row("13.0", ldl=1, entry="a"), row("13.0", ldl=1, entry="b"), row("13.1", ldl=3, entry="a"),
            row("13.1", entry="b")]  # fmt: skip
    assert pick_best(rows)[0] == "13.0"  # 2 vs 3 LDL in total


def test_changed_rows_keeps_only_differing_kernels():
    rows = [row("13.0") | {"kernel": "same"}, row("13.1") | {"kernel": "same"},
            row("13.0") | {"kernel": "diff"}, row("13.1", regs=96) | {"kernel": "diff"}]  # fmt: skip
    assert {r["kernel"] for r in changed_rows(rows, "13.0", "13.1")} == {"diff"}


def test_matrix_render():
    rows = [row("13.0", spill=4) | {"path": "k.ptx"}, row("13.1") | {"path": "k.ptx"}]
    text = render(rows, "table", matrix=True)
    header, _, line = text.splitlines()[:3]
    assert header.split() == ["!", "kernel", "arch", "13.0.88", "13.1.115", "best", "peak", "roles",
                              "(peak/budget)", "path"]  # fmt: skip
    assert line.split() == ["!", "k", "sm_90a", "90/8/0", "!", "90/0/0", "13.1", "?", "?", "k.ptx"]
    assert " ".join(sr.MATRIX_LEGEND.split()) in " ".join(text.split())
    assert text.splitlines()[-1] == "1 kernel, 1 spilling, max 90 registers, ptxas 13.0.88, 13.1.115"


def test_matrix_never_shows_unknown_as_zero():
    """A cubin has no ptxas -v log: spill bytes unknown -> '?', not 0 (issue 17)."""
    cubin = row("13.1", regs=128) | {"spill_store_bytes": None, "spill_load_bytes": None, "path": "x.cubin"}
    assert sr._cell(cubin) == "128/?/0"
    assert sr._cell(cubin | {"ldl": None, "stl": None}) == "128/?/?"
    text = render([cubin, row("13.0") | {"kernel": "k2", "path": "y.ptx"}], "table", matrix=True)
    assert "128/?/0" in text and "128/0/0" not in text
    assert sr._cell(cubin | {"error": "ValueError: bad"}) == "error"


# --------------------------------------------------------------------------- real toolchains


@pytest.fixture(scope="module")
def toolchains() -> dict:
    """ptxas 13.0 and 13.1 (+ cuobjdump/nvdisasm) from PyPI, or a skip saying why."""
    try:
        return {release: tcm.get_toolchain(release) for release in ("13.0", "13.1")}
    except tcm.FetchError as exc:
        pytest.skip(f"PyPI unreachable, cannot fetch the toolchains: {exc}")


def test_real_toolchains_are_cached(toolchains, monkeypatch):
    assert toolchains["13.0"].ptxas_version.startswith("13.0.")
    assert toolchains["13.1"].ptxas_version.startswith("13.1.")
    assert toolchains["13.1"].cuobjdump_version == tcm.CUOBJDUMP_VERSION

    def no_pip(*args):
        raise AssertionError("cache hit expected")

    monkeypatch.setattr(tcm, "_pip_download", no_pip)
    assert tcm.get_toolchain("13.1") == toolchains["13.1"]


def test_end_to_end_two_versions(toolchains, capsys):
    rows = assemble_matrix([PRESSURE_PTX, WG_PTX], ["13.0", "13.1"])
    assert [(r["kernel"], r["ptxas_release"]) for r in rows] == [
        ("reverse_kernel sm_90a", "13.0"), ("pressure_kernel sm_90a", "13.0"),
        ("reverse_kernel sm_90a", "13.1"), ("pressure_kernel sm_90a", "13.1"),
        ("wg_gemm_kernel sm_90a", "13.0"), ("wg_gemm_kernel sm_90a", "13.1"),
    ]  # fmt: skip
    by_key = {(r["kernel"], r["ptxas_release"]): r for r in rows}
    for release, tc in toolchains.items():
        wg = by_key[("wg_gemm_kernel sm_90a", release)]
        assert wg["ptxas_version"] == tc.ptxas_version and wg["source"] == "assembled"
        assert (wg["registers"], wg["ldl"], wg["stl"], wg["spill_store_bytes"]) == (232, 0, 0, 0)
        # the launch budget is 232, the SASS touches R0..R87; per setmaxnreg region peak/budget
        assert wg["reg_peak"] == 88 and sr._roles(wg) == "3/232 1/40 88/232"
        assert wg["dynamic_smem_bytes"] is None  # `.extern .shared`: sized at launch, unknown
        pressure = by_key[("pressure_kernel sm_90a", release)]
        assert pressure["spill_store_bytes"] > 0 and pressure["ldl"] > 0 and pressure["registers"] == 32
        assert pressure["reg_peak"] == 30 and pressure["reg_peak_by_role"] == []
        assert pressure["dynamic_smem_bytes"] == 0  # no `.extern .shared`
    assert pick_best([r for r in rows if r["kernel"].startswith("wg_gemm")])[0] == "13.1"

    rc, out, _ = run(capsys, PRESSURE_PTX, WG_PTX, "--ptxas", "13.0", "13.1")
    assert rc == 0
    assert out.splitlines()[0].split()[:6] == ["!", "kernel", "arch", toolchains["13.0"].ptxas_version,
                                               toolchains["13.1"].ptxas_version, "best"]  # fmt: skip
    assert "232/0/0" in out and " ".join(sr.MATRIX_LEGEND.split()) in " ".join(out.split())
    assert "3/232 1/40 88/232" in out and max(map(len, out.splitlines())) <= 160

    rc, _, err = run(capsys, PRESSURE_PTX, WG_PTX, "--ptxas", "13.0", "13.1", "--fail-on-spill")
    assert rc == 1 and "pressure_kernel" in err and "wg_gemm" not in err

    rc, out, _ = run(capsys, WG_PTX, "--diff", "13.0", "13.1", "--format", "json")
    assert rc == 0 and json.loads(out) == []  # same figures from both versions
    # --ptxas and --diff combine (issue 19): all versions assembled, only changed kernels kept
    rc, out, _ = run(capsys, PRESSURE_PTX, WG_PTX, "--ptxas", "13.0", "13.1", "--diff", "13.0", "13.1",
                     "--format", "json")  # fmt: skip
    assert rc == 0 and {r["ptxas_release"] for r in json.loads(out)} <= {"13.0", "13.1"}
    assert all(not r["kernel"].startswith("wg_gemm") for r in json.loads(out))


def test_manifest_reassembly_uses_kernel_names(toolchains, capsys, tmp_path):
    shutil.copy(WG_PTX, tmp_path / "wg.ptx")
    path = write_manifest(tmp_path, {"fwd_wg": kernel_record("fwd_wg", resources(), WG_ENTRY, "wg.ptx")})
    data = json.loads(path.read_text())
    data["kernels"]["fwd_wg"]["launch"] = {"dynamic_smem_bytes": 99328}
    path.write_text(json.dumps(data))
    rc, out, _ = run(capsys, "--manifest", path, "--ptxas", "13.0", "13.1", "--format", "json")
    rows = json.loads(out)
    assert rc == 0 and [(r["kernel"], r["ptxas_release"]) for r in rows] == [("fwd_wg", "13.0"), ("fwd_wg", "13.1")]
    assert all(r["dynamic_smem_bytes"] == 99328 and r["reg_peak"] == 88 for r in rows)  # ABI known


def test_cubins_inspected_directly(toolchains, capsys):
    """A cubin with a tkinfo note and one without (the DSL's embedded ptxas) in one run: both
    reported, the second with ptxas unknown and a note; nothing aborts (issue 17)."""
    with_note, without = FIXTURES / "pressure_maxnreg32.ptxas-13.1.115.cubin", FIXTURES / "wg_gemm.dsl-embedded.cubin"
    rc, out, err = run(capsys, with_note, without, "--format", "json")
    rows = {r["entry"]: r for r in json.loads(out)}
    assert rc == 0 and err == ""
    pressure = next(r for e, r in rows.items() if "pressure_kernel" in e)
    assert (pressure["ldl"], pressure["stl"], pressure["ptxas_version"]) == (168, 126, "13.1.115")
    assert pressure["spill_store_bytes"] is None  # no -v log for a finished cubin
    assert pressure["reg_peak"] == 30 and pressure["path"] == str(with_note)
    wg = rows[WG_ENTRY]
    assert wg["ptxas_version"] is None and wg["registers"] == 232 and wg["error"] is None
    assert "no .note.nv.tkinfo" in wg["note"] and "toolkit 12.9" in wg["note"]
    assert wg["reg_peak"] is None and "register peak unknown" in wg["note"]  # old-format ELF

    rc, out, _ = run(capsys, with_note, without)  # two ptxas versions (13.1.115, unknown): a matrix
    assert out.splitlines()[0].split()[3:6] == ["13.1.115", "ptxas", "?"]
    line = next(ln for ln in out.splitlines() if ln.lstrip(" !").startswith("wg_gemm_kernel"))
    assert line.split()[2:5] == ["sm_90a", "232/?/0", "?"]  # spill bytes and peak unknown, never 0
    assert "note: wg_gemm_kernel" in out
    rc, out, _ = run(capsys, with_note, without, "--format", "csv")
    assert rc == 0 and "path" in out.splitlines()[0].split(",")


def test_same_stem_in_two_folders_are_two_rows(toolchains, capsys):
    """Two different kernels, same file name and entry name, in two folders (FA4's dumps look
    like this): two rows, two labels, the path in every format (issue 17)."""
    a, b = FIXTURES / "same_stem" / "a" / "kernel.sm_90a.ptx", FIXTURES / "same_stem" / "b" / "kernel.sm_90a.ptx"
    rc, out, _ = run(capsys, a, b, "--format", "json")
    rows = json.loads(out)
    assert rc == 0 and len(rows) == 2 and rows[0]["entry"] == rows[1]["entry"]
    assert [r["kernel"] for r in rows] == ["wg_gemm_kernel sm_90a [a]", "wg_gemm_kernel sm_90a [b]"]
    assert [r["registers"] for r in rows] == [232, 90]  # b ignores setmaxnreg (no .minnctapersm)
    assert [r["path"] for r in rows] == [str(a), str(b)]
    for fmt in ("table", "md", "csv"):
        rc, out, _ = run(capsys, a, b, "--format", fmt)
        assert rc == 0 and "[a]" in out and "[b]" in out and "same_stem/b/kernel.sm_90a.ptx" in out
    rc, out, _ = run(capsys, a, b, "--ptxas", "13.0", "13.1")  # matrix: two lines too
    assert sum("wg_gemm_kernel sm_90a [" in ln for ln in out.splitlines()) == 2


def test_png_of_file_kernels(toolchains, capsys, tmp_path):
    pytest.importorskip("matplotlib")
    png = tmp_path / "m.png"
    a, b = FIXTURES / "same_stem" / "a" / "kernel.sm_90a.ptx", FIXTURES / "same_stem" / "b" / "kernel.sm_90a.ptx"
    rc, _, _ = run(capsys, a, b, "--ptxas", "13.0", "13.1", "--png", png)
    assert rc == 0 and png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_failed_file_is_a_row_and_the_run_goes_on(toolchains, capsys, tmp_path):
    bad_cubin = tmp_path / "broken.cubin"
    bad_cubin.write_bytes(b"not an ELF file")
    bad_ptx = tmp_path / "broken.sm_90a.ptx"
    bad_ptx.write_text(WG_PTX.read_text().replace("setmaxnreg.inc.sync.aligned.u32", "setmaxnreg.bogus.u32"))
    rc, out, err = run(capsys, bad_cubin, bad_ptx, PRESSURE_PTX, "--format", "json")
    rows = json.loads(out)
    assert rc == 4  # a file failed; the others are reported
    errors = {Path(r["path"]).name: r["error"] for r in rows if r["error"]}
    assert set(errors) == {"broken.cubin", "broken.sm_90a.ptx"} and "ptxas" in errors["broken.sm_90a.ptx"]
    assert any(r["kernel"].startswith("pressure_kernel") and r["ldl"] for r in rows)
    assert "broken.cubin" in err and "failed" in err
    rc, out, _ = run(capsys, bad_cubin, PRESSURE_PTX, "--fail-on-spill")
    assert rc == 1 + 4 and "E  broken" in out  # spills and a failed file, both told


def test_dsl_named_kernel_gets_a_readable_label(toolchains, capsys, tmp_path):
    """An FA4-style entry name: the class and the configuration in the folder name."""
    fa4_entry = ("kernel_cutlass_kernel_flash_attncuteflash_fwd_sm90FlashAttentionForwardSm90_object_at__"
                 "tensor0000o11101213_tensor0000o11101213_None_None__0")
    folder = tmp_path / "sm_90a_bf16_hd128_causal"
    folder.mkdir()
    ptx = folder / "cutlass___call___flash_attncuteflash_fwd_sm90_None_00883.sm_90a.ptx"
    ptx.write_text(WG_PTX.read_text().replace(WG_ENTRY, fa4_entry))
    rc, out, _ = run(capsys, ptx, FIXTURES / "same_stem" / "a" / "kernel.sm_90a.ptx", "--format", "json")
    labels = [r["kernel"] for r in json.loads(out)]
    assert rc == 0 and labels == ["FlashAttentionForwardSm90 sm_90a bf16 hd128 causal", "wg_gemm_kernel sm_90a"]


def test_ptxas_failure_carries_its_message(toolchains, tmp_path):
    bad = tmp_path / "bad.ptx"
    bad.write_text(WG_PTX.read_text().replace("setmaxnreg.inc.sync.aligned.u32", "setmaxnreg.bogus.u32"))
    with pytest.raises(tcm.ToolchainError, match=r"ptxas 13\.1\.\d+ failed(.|\n)*bad\.ptx"):
        tcm.assemble(toolchains["13.1"], bad, tmp_path / "bad.cubin")


# --------------------------------------------------------------------------- build --ptxas best


def test_pick_best_newest_is_numeric_not_lexical():
    def bare(release: str, version: str) -> dict:
        return {"ptxas_release": release, "ptxas_version": version, **resources()}

    assert pick_best([bare("12.9", "12.9.86"), bare("13.0", "13.0.88")])[0] == "13.0"
    assert pick_best([bare("13.9", "13.9.1"), bare("13.10", "13.10.0")])[0] == "13.10"


def test_best_manifest_shows_each_kernels_chosen_ptxas(capsys, tmp_path):
    """A `build.py --ptxas best` manifest: kernels carry different ptxas versions and a
    ptxas_choice record; the report shows each kernel's own version and still flags spills."""
    clean = kernel_record("fwd_clean", resources()) | {"ptxas_version": "13.5.37"}
    spill = kernel_record("fwd_spill", resources(spill_st=8, spill_ld=8, ldl=2, stl=2)) | {
        "ptxas_version": "12.9.86"}
    for rec, chosen in ((clean, "13.5"), (spill, "12.9")):
        rec["ptxas_choice"] = {"mode": "best", "chosen": chosen, "reason": "only version tried",
                               "candidates": {chosen: {"ptxas_version": rec["ptxas_version"]}}}
    path = write_manifest(tmp_path, {"fwd_clean": clean, "fwd_spill": spill})
    data = json.loads(path.read_text())
    data["build"] |= {"ptxas_release": "best", "ptxas_version": "best",
                      "ptxas_candidates": ["12.9", "13.5"]}
    path.write_text(json.dumps(data))
    rc, out, _ = run(capsys, "--manifest", path, "--format", "json")
    rows = {r["kernel"]: r for r in json.loads(out)}
    assert rc == 0
    assert (rows["fwd_clean"]["ptxas_release"], rows["fwd_spill"]["ptxas_release"]) == ("13.5", "12.9")
    rc, _, err = run(capsys, "--manifest", path, "--fail-on-spill")
    assert rc == 1 and "fwd_spill (ptxas 12.9.86)" in err and "fwd_clean" not in err


def test_ptxas_performance_warnings_are_shown(capsys, manifest, tmp_path):
    """A kernel whose ptxas log carried C7512 (wgmma serialised) is named in every format."""
    data = json.loads(Path(manifest).read_text())
    name = next(iter(data["kernels"]))
    data["kernels"][name]["ptxas_diagnostics"] = [
        "(C7512) Potential Performance Loss: wgmma.mma_async instructions are serialized due to "
        "insufficient register resources for the function 'x'"]
    path = manifest  # next to its cubins
    path.write_text(json.dumps(data))
    rows = {r["kernel"]: r for r in sr.shipped_rows(path)}
    assert rows[name]["ptxas_warnings"] == ["C7512"]
    assert all(r["ptxas_warnings"] == [] for k, r in rows.items() if k != name)
    rc, out, _ = run(capsys, "--manifest", path)
    line = next(ln for ln in out.splitlines() if f" {name} " in ln)
    assert rc == 0 and line.split()[-1] == "C7512"  # warn: the last column of the default view
    rc, out, _ = run(capsys, "--manifest", path, "--format", "csv")
    assert "C7512" in out and "[" not in out
    assert sr._cell(rows[name]).endswith(" w")
