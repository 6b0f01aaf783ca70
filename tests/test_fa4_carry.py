"""bench/fa4_carry.sh (the working tree made small enough for the FA4 device calls), in a
throwaway git repository (CPU)."""

import shutil
import subprocess

import pytest

from conftest import ROOT

pytestmark = pytest.mark.skipif(shutil.which("git") is None, reason="needs git")


def _git(repo, *args):
    subprocess.run(["git", *args], cwd=repo, check=True, capture_output=True)


def _run(repo, step):
    return subprocess.run(["bash", "bench/fa4_carry.sh", step], cwd=repo, capture_output=True,
                          text=True)


def test_empties_and_restores_committed_artifacts(tmp_path):
    repo = tmp_path / "r"
    (repo / "bench").mkdir(parents=True)
    (repo / "artifacts" / "sm_90a").mkdir(parents=True)
    shutil.copy(ROOT / "bench" / "fa4_carry.sh", repo / "bench")
    for name in ("manifest.json", "sm_90a/k.cubin", "sm_90a/k.ptx"):
        (repo / "artifacts" / name).write_text(name)
    _git(repo, "init", "-q")
    _git(repo, "add", "-A")
    _git(repo, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "x")
    art = repo / "artifacts"

    assert _run(repo, "call1").returncode == 0
    assert not any(p.is_file() for p in art.rglob("*"))
    r = _run(repo, "call2")
    assert r.returncode == 0 and "MiB" in r.stdout
    assert sorted(p.name for p in art.rglob("*") if p.is_file()) == ["k.cubin", "manifest.json"]
    assert _run(repo, "restore").returncode == 0
    assert (art / "sm_90a" / "k.ptx").read_text() == "sm_90a/k.ptx"

    (art / "sm_90a" / "k.cubin").write_text("a new build, not committed")
    r = _run(repo, "call1")
    assert r.returncode == 1 and "uncommitted" in r.stderr
    assert (art / "sm_90a" / "k.cubin").read_text() == "a new build, not committed"
    assert _run(repo, "bogus").returncode == 2
