"""build_tools.toolchain without network: version rules, PTX ISA helpers, the cache,
the PyPI fetch (with fake wheels and a pip that has nowhere to look) and assemble()
(with a stand-in ptxas).  The real tools are exercised in test_spill_report.py."""

from __future__ import annotations

import os
import stat
import threading
import zipfile
from pathlib import Path

import pytest

from build_tools import toolchain as tcm
from build_tools.toolchain import (
    FetchError,
    Toolchain,
    ToolchainError,
    assemble,
    check_ptxas_release,
    fit_ptx_isa,
    get_toolchain,
    required_ptx_isa,
    rewrite_ptx_isa,
)

FIXTURES = Path(__file__).parent / "fixtures"
WG_PTX = (FIXTURES / "wg_gemm.sm_90a.ptx").read_text()


@pytest.fixture
def cache(tmp_path, monkeypatch) -> Path:
    """An empty FA4_AOT_CACHE; returns its toolchains/ folder."""
    monkeypatch.setenv("FA4_AOT_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache" / "toolchains"


def fake_tool(path: Path, version: str, body: str = "") -> Path:
    """A shell script that answers --version like an NVIDIA tool, else runs ``body``."""
    release = ".".join(version.split(".")[:2])
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(
        "#!/bin/sh\n"
        'if [ "$1" = "--version" ]; then\n'
        f'  echo "Cuda compilation tools, release {release}, V{version}"; exit 0\n'
        "fi\n" + body
    )
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return path


def no_pip(*args, **kwargs):
    raise AssertionError("pip must not run on a cache hit")


# --------------------------------------------------------------------------- versions


def test_supported_releases_pass():
    for release in tcm.SUPPORTED_PTXAS:
        assert check_ptxas_release(release) == release
    assert tcm.DEFAULT_PTXAS in tcm.SUPPORTED_PTXAS
    assert set(tcm.SUPPORTED_PTXAS) <= set(tcm.PTX_ISA_BY_PTXAS)


def test_unknown_release_lists_valid_ones():
    with pytest.raises(ToolchainError) as err:
        check_ptxas_release("14.0")
    assert "'14.0'" in str(err.value)
    for release in tcm.SUPPORTED_PTXAS:
        assert release in str(err.value)


def test_12_8_needs_opt_in_and_names_the_minimum():
    with pytest.raises(ToolchainError, match=r"minimum ptxas is 12\.9"):
        check_ptxas_release("12.8")
    assert check_ptxas_release("12.8", allow_isa_rewrite=True) == "12.8"


def test_12_8_opt_in_warns(cache, monkeypatch):
    fake_tool(cache / "ptxas-12.8.93" / "ptxas", "12.8.93")
    fake_tool(cache / f"cuobjdump-{tcm.CUOBJDUMP_VERSION}" / "cuobjdump", tcm.CUOBJDUMP_VERSION)
    fake_tool(cache / f"nvdisasm-{tcm.NVDISASM_VERSION}" / "nvdisasm", tcm.NVDISASM_VERSION)
    monkeypatch.setattr(tcm, "_pip_download", no_pip)
    with pytest.warns(UserWarning, match="lowered to 8.7"):
        tc = get_toolchain("12.8", allow_isa_rewrite=True)
    assert tc.ptxas_version == "12.8.93"


# --------------------------------------------------------------------------- PTX ISA


def test_required_ptx_isa_of_dsl_ptx():
    assert required_ptx_isa(WG_PTX) == "8.8"
    with pytest.raises(ToolchainError, match=".version"):
        required_ptx_isa(".target sm_90a\n")


def test_rewrite_ptx_isa_changes_only_the_header():
    rewritten = rewrite_ptx_isa(WG_PTX, "8.7")
    assert required_ptx_isa(rewritten) == "8.7"
    changed = [(a, b) for a, b in zip(WG_PTX.splitlines(), rewritten.splitlines(), strict=True) if a != b]
    assert changed == [(".version 8.8", ".version 8.7")]
    assert len(rewritten) == len(WG_PTX)
    with pytest.raises(ToolchainError):
        rewrite_ptx_isa(WG_PTX, "eight")


def test_fit_ptx_isa_lowers_only_when_needed():
    assert fit_ptx_isa(WG_PTX, "13.1") is WG_PTX
    assert fit_ptx_isa(WG_PTX, "12.9") is WG_PTX
    assert required_ptx_isa(fit_ptx_isa(WG_PTX, "12.8")) == "8.7"


# --------------------------------------------------------------------------- cache


def test_cache_hit_runs_no_pip_and_picks_newest_patch(cache, monkeypatch):
    fake_tool(cache / "ptxas-13.1.80" / "ptxas", "13.1.80")
    fake_tool(cache / "ptxas-13.1.115" / "ptxas", "13.1.115")
    fake_tool(cache / "ptxas-13.10.1" / "ptxas", "13.10.1")  # another release: ignored
    (cache / "ptxas-13.1.999").mkdir()  # half-made folder without a binary: ignored
    fake_tool(cache / f"cuobjdump-{tcm.CUOBJDUMP_VERSION}" / "cuobjdump", tcm.CUOBJDUMP_VERSION)
    fake_tool(cache / f"nvdisasm-{tcm.NVDISASM_VERSION}" / "nvdisasm", tcm.NVDISASM_VERSION)
    monkeypatch.setattr(tcm, "_pip_download", no_pip)

    tc = get_toolchain("13.1")
    assert tc.ptxas == cache / "ptxas-13.1.115" / "ptxas"
    assert (tc.ptxas_version, tc.ptxas_release) == ("13.1.115", "13.1")
    assert tc.cuobjdump_version == tcm.CUOBJDUMP_VERSION
    assert tc.nvdisasm == cache / f"nvdisasm-{tcm.NVDISASM_VERSION}" / "nvdisasm"


def test_cached_binary_reporting_another_release_is_rejected(cache, monkeypatch):
    fake_tool(cache / "ptxas-13.1.115" / "ptxas", "13.0.88")
    monkeypatch.setattr(tcm, "_pip_download", no_pip)
    with pytest.raises(ToolchainError, match="reports release 13.0"):
        get_toolchain("13.1")


def test_cache_root_default_and_override(monkeypatch, tmp_path):
    monkeypatch.delenv("FA4_AOT_CACHE", raising=False)
    assert tcm.cache_root() == Path.home() / ".cache" / "fa4_aot" / "toolchains"
    monkeypatch.setenv("FA4_AOT_CACHE", str(tmp_path))
    assert tcm.cache_root() == tmp_path / "toolchains"


# --------------------------------------------------------------------------- fetch


def fake_pip_download(member: str, calls: list, barrier: threading.Barrier | None = None):
    """A _pip_download stand-in writing a wheel with one fake binary at ``member``."""

    def download(requirement: str, dest: Path) -> Path:
        calls.append(requirement)
        if barrier is not None:
            barrier.wait(timeout=10)  # every caller misses the cache before anyone renames
        dest.mkdir(parents=True, exist_ok=True)
        wheel = dest / "nvidia_cuda_nvcc-13.1.115-py3-none-manylinux2014_x86_64.whl"
        with zipfile.ZipFile(wheel, "w") as zf:
            zf.writestr("nvidia/cu13/include/fatbinary_section.h", "")
            zf.writestr(member, "#!/bin/sh\necho 'Cuda compilation tools, release 13.1, V13.1.115'\n")
        return wheel

    return download


def test_fetch_unpacks_only_the_binary(cache, monkeypatch):
    calls: list = []
    monkeypatch.setattr(tcm, "_pip_download", fake_pip_download("nvidia/cu13/bin/ptxas", calls))
    ptxas = tcm._fetch("ptxas", "nvidia-cuda-nvcc==13.1.*", "13.1.*")
    assert ptxas == cache / "ptxas-13.1.115" / "ptxas"
    assert os.access(ptxas, os.X_OK)
    assert sorted(p.name for p in cache.iterdir()) == ["ptxas-13.1.115"]  # no temp leftovers
    assert [p.name for p in ptxas.parent.iterdir()] == ["ptxas"]
    assert calls == ["nvidia-cuda-nvcc==13.1.*"]
    assert tcm._fetch("ptxas", "nvidia-cuda-nvcc==13.1.*", "13.1.*") == ptxas
    assert len(calls) == 1  # second call: cache hit


def test_fetch_finds_12x_wheel_layout(cache, monkeypatch):
    monkeypatch.setattr(tcm, "_pip_download", fake_pip_download("nvidia/cuda_nvcc/bin/ptxas", []))
    assert tcm._fetch("ptxas", "x", "13.1.*").name == "ptxas"


def test_wheel_without_the_binary_is_an_error(cache, monkeypatch):
    monkeypatch.setattr(tcm, "_pip_download", fake_pip_download("nvidia/cu13/bin/nvlink", []))
    with pytest.raises(ToolchainError, match="no single bin/ptxas"):
        tcm._fetch("ptxas", "x", "13.1.*")


def test_parallel_fetches_agree(cache, monkeypatch):
    callers = 4
    calls: list = []
    barrier = threading.Barrier(callers)
    monkeypatch.setattr(tcm, "_pip_download", fake_pip_download("nvidia/cu13/bin/ptxas", calls, barrier))
    results, errors = [], []

    def fetch():
        try:
            results.append(tcm._fetch("ptxas", "nvidia-cuda-nvcc==13.1.*", "13.1.*"))
        except Exception as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=fetch) for _ in range(callers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    assert len(calls) == callers  # all missed the cache at once...
    assert set(results) == {cache / "ptxas-13.1.115" / "ptxas"}  # ...and all got the one copy
    assert sorted(p.name for p in cache.iterdir()) == ["ptxas-13.1.115"]


def test_pip_failure_is_a_plain_fetch_error(cache, monkeypatch, tmp_path):
    # A pip with no index and an empty find-links folder: fails at once, offline.
    empty = tmp_path / "empty-index"
    empty.mkdir()
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    monkeypatch.setenv("PIP_FIND_LINKS", str(empty))
    with pytest.raises(FetchError) as err:
        get_toolchain("13.1")
    message = str(err.value)
    assert message.startswith("could not fetch nvidia-cuda-nvcc==13.1.* from PyPI: ")
    assert "No matching distribution" in message
    assert "\n" not in message
    assert not list(cache.glob("ptxas-*"))


# --------------------------------------------------------------------------- assemble


def fake_toolchain(tmp_path: Path, ptxas_body: str) -> Toolchain:
    ptxas = fake_tool(tmp_path / "ptxas", "13.1.115", ptxas_body)
    return Toolchain(ptxas, "13.1.115", "13.1", tmp_path / "cuobjdump", tmp_path / "nvdisasm", "13.5.37")


def test_assemble_command_line_and_log(tmp_path):
    # The stand-in echoes its arguments like a -v log and writes the output file.
    body = 'echo "ptxas info    : args $*" >&2\nwhile [ $# -gt 1 ]; do [ "$1" = "-o" ] && touch "$2"; shift; done\n'
    tc = fake_toolchain(tmp_path, body)
    log = assemble(tc, tmp_path / "k.ptx", tmp_path / "k.cubin", extra_args=["-lineinfo"])
    assert f"args -arch=sm_90a -O3 -v -lineinfo -o {tmp_path / 'k.cubin'} {tmp_path / 'k.ptx'}" in log
    assert (tmp_path / "k.cubin").exists()
    log = assemble(tc, tmp_path / "k.ptx", tmp_path / "k.cubin", arch="sm_100a", opt="-O2")
    assert "args -arch=sm_100a -O2 -v -o" in log


def test_assemble_failure_carries_ptxas_stderr(tmp_path):
    tc = fake_toolchain(tmp_path, "echo \"ptxas fatal   : Unresolved extern function 'x'\" >&2\nexit 255\n")
    with pytest.raises(ToolchainError) as err:
        assemble(tc, tmp_path / "k.ptx", tmp_path / "k.cubin")
    assert "ptxas 13.1.115 failed (exit 255)" in str(err.value)
    assert "Unresolved extern function 'x'" in str(err.value)
