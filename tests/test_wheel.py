"""The wheel `pip install .` builds: cubins + manifest (no PTX, no ptxas logs), at most 8 MB,
numpy among its requirements; and the spill report of the installed artifacts still lists every
kernel, read from the manifest records and the cubins. ~5 s on 2 cores, offline."""

import json
import subprocess
import sys
import zipfile

import pytest

from conftest import ROOT

MAX_WHEEL_BYTES = 8 * 1000 * 1000


@pytest.fixture(scope="module")
def wheel(tmp_path_factory):
    pytest.importorskip("setuptools")
    from build_tools.figures import build_wheel
    return build_wheel(tmp_path_factory.mktemp("dist"))


def test_readme_states_the_wheels_size(wheel):
    """README.md's figure (build_tools/figures.py writes it) within 0.1 MB of the real size."""
    from build_tools.figures import README, region
    said = region(README.read_text(), "wheel")
    assert said and said.endswith(" MB"), "README.md has no figures:wheel part"
    assert abs(float(said[:-3]) - wheel.stat().st_size / 1e6) <= 0.1, (
        f"README.md says the wheel is {said}, it is {wheel.stat().st_size / 1e6:.2f} MB: run "
        "`python build_tools/figures.py --write`")


def test_wheel_ships_cubins_and_manifest_only(wheel):
    size = wheel.stat().st_size
    assert size <= MAX_WHEEL_BYTES, f"wheel is {size / 1e6:.1f} MB"
    names = zipfile.ZipFile(wheel).namelist()
    shipped = [n for n in names if n.startswith("fa4_aot/_artifacts/")]
    assert not [n for n in shipped if n.endswith((".ptx", ".log", ".tmp"))]
    manifest = json.loads((ROOT / "artifacts/manifest.json").read_text())
    expected = {f"fa4_aot/_artifacts/{rec['cubin']}" for rec in manifest["kernels"].values()}
    assert expected <= set(shipped)
    assert "fa4_aot/_artifacts/manifest.json" in shipped
    meta = zipfile.ZipFile(wheel).read(
        next(n for n in names if n.endswith(".dist-info/METADATA"))).decode()
    requires = [ln.split(":", 1)[1].strip().split()[0].split(">")[0].split("=")[0]
                for ln in meta.splitlines() if ln.startswith("Requires-Dist:")]
    # torch warns "Failed to initialize NumPy" on import without numpy
    assert {"torch", "numpy"} <= set(requires), requires


def test_spill_report_of_the_installed_artifacts(wheel, tmp_path):
    zipfile.ZipFile(wheel).extractall(tmp_path)
    installed = tmp_path / "fa4_aot/_artifacts/manifest.json"
    r = subprocess.run([sys.executable, str(ROOT / "build_tools/spill_report.py"), "--manifest",
                        str(installed), "--format", "json"],
                       cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    rows = json.loads(r.stdout)
    kernels = json.loads(installed.read_text())["kernels"]
    assert sorted(row["kernel"] for row in rows) == sorted(kernels)
    assert all(row["registers"] and row["error"] is None for row in rows)
    table = subprocess.run([sys.executable, str(ROOT / "build_tools/spill_report.py"),
                            "--manifest", str(installed)],
                           cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert table.returncode == 0, table.stderr
    assert table.stdout.rstrip().splitlines()[-1].startswith(f"{len(kernels)} kernels")
