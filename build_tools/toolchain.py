"""PTX assembler and cubin tools fetched from PyPI wheels (no local CUDA toolkit).

fa4_aot assembles the PTX emitted by the CuTe DSL with a ptxas release the user
picks, and inspects the result with cuobjdump / nvdisasm.  All three binaries are
self-contained executables shipped in NVIDIA's PyPI wheels:

====================  ==================================  ==========================
tool                  wheel                               member inside the wheel
====================  ==================================  ==========================
ptxas 13.x            ``nvidia-cuda-nvcc==13.Y.*``        ``nvidia/cu13/bin/ptxas``
ptxas 12.x            ``nvidia-cuda-nvcc-cu12==12.Y.*``   ``nvidia/cuda_nvcc/bin/ptxas``
cuobjdump             ``nvidia-cuda-cuobjdump==<pin>``    ``nvidia/cu13/bin/cuobjdump``
nvdisasm              ``nvidia-cuda-nvdisasm==<pin>``     ``nvidia/cu13/bin/nvdisasm``
====================  ==================================  ==========================

Every wheel of one major version installs to the same ``bin`` folder, so each tool
version is unpacked into its own cache folder instead of being pip-installed::

    $FA4_AOT_CACHE (default ~/.cache/fa4_aot)/toolchains/<tool>-<full version>/<tool>

A cache hit runs no pip at all.  A miss runs ``pip download`` into a private temp
folder, unpacks the one binary into a private temp folder next to the final one
and renames it into place, so concurrent callers never see a half-written tool
(the loser of a rename race discards its copy and uses the winner's).

The CuTe DSL emits PTX ISA 8.8, which ptxas 12.9 is the first to accept.  ptxas
12.8 (max ISA 8.7) is usable only with ``allow_isa_rewrite=True``: the caller then
lowers the PTX ``.version`` header with :func:`fit_ptx_isa` / :func:`rewrite_ptx_isa`
(ptxas still validates every instruction against the lower ISA).

Stdlib only: importable without cutlass or torch.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tempfile
import warnings
import zipfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

__all__ = [
    "SUPPORTED_PTXAS",
    "DEFAULT_PTXAS",
    "PTX_ISA_BY_PTXAS",
    "ISA_REWRITE_PTXAS",
    "CUOBJDUMP_VERSION",
    "NVDISASM_VERSION",
    "ToolchainError",
    "FetchError",
    "Toolchain",
    "InspectTools",
    "cache_root",
    "check_ptxas_release",
    "required_ptx_isa",
    "rewrite_ptx_isa",
    "fit_ptx_isa",
    "tool_version",
    "version_key",
    "get_toolchain",
    "get_inspect_tools",
    "assemble",
    "run_tool",
]

SUPPORTED_PTXAS = ("12.9", "13.0", "13.1", "13.2", "13.3", "13.4", "13.5")
DEFAULT_PTXAS = "13.1"
# Highest PTX ISA each ptxas release accepts.
PTX_ISA_BY_PTXAS = {
    "12.8": "8.7",
    "12.9": "8.8",
    "13.0": "9.0",
    "13.1": "9.1",
    "13.2": "9.2",
    "13.3": "9.3",
    "13.4": "9.4",
    "13.5": "9.5",
}
# Releases that only work after lowering the PTX header (explicit opt-in).
ISA_REWRITE_PTXAS = ("12.8",)

# Inspection tools: one pinned version for every build (the newest on PyPI when pinned).
CUOBJDUMP_VERSION = "13.5.37"
NVDISASM_VERSION = "13.5.37"

_RELEASE_RE = re.compile(r"release (\d+\.\d+), V(\d+\.\d+\.\d+)")
# What pip prints when it cannot reach an index (it then reports "no matching distribution").
_NETWORK_ERROR_RE = re.compile(r"\[Errno -?\d+\][^'\")]*|Read timed out|Max retries exceeded")
_PTX_VERSION_RE = re.compile(r"^(\s*\.version\s+)(\d+\.\d+)", re.MULTILINE)


class ToolchainError(RuntimeError):
    """A tool could not be fetched, validated or run; the message is for the user."""


class FetchError(ToolchainError):
    """A tool could not be downloaded from PyPI (registry unreachable, no such version...)."""


@dataclass(frozen=True)
class Toolchain:
    """Paths and versions of the tools used for one build."""

    ptxas: Path
    ptxas_version: str  # full, from `ptxas --version`, e.g. "13.1.115"
    ptxas_release: str  # e.g. "13.1"
    cuobjdump: Path
    nvdisasm: Path
    cuobjdump_version: str


@dataclass(frozen=True)
class InspectTools:
    """The cubin inspection tools alone (no ptxas), for looking at finished cubins."""

    cuobjdump: Path
    nvdisasm: Path
    cuobjdump_version: str


# --------------------------------------------------------------------------- versions


def version_key(version: str) -> tuple[int, ...]:
    """Sort key of a dotted version: "13.1.115" → (13, 1, 115)."""
    return tuple(int(p) for p in version.split("."))


def check_ptxas_release(release: str, allow_isa_rewrite: bool = False) -> str:
    """Validate a ptxas release such as "13.1" and return it.

    Raises ToolchainError for unknown releases, and for 12.8 unless
    ``allow_isa_rewrite`` is set.
    """
    release = str(release).strip()
    if release in ISA_REWRITE_PTXAS:
        if not allow_isa_rewrite:
            raise ToolchainError(
                f"ptxas {release} accepts PTX ISA up to {PTX_ISA_BY_PTXAS[release]}, but the "
                f"CuTe DSL emits PTX ISA 8.8: the minimum ptxas is {SUPPORTED_PTXAS[0]} "
                "(or opt in to lowering the PTX header: allow_isa_rewrite=True, --allow-isa-rewrite)"
            )
        return release
    if release not in SUPPORTED_PTXAS:
        raise ToolchainError(
            f"unknown ptxas version {release!r}; valid: {', '.join(SUPPORTED_PTXAS)}"
            f" (and {', '.join(ISA_REWRITE_PTXAS)} with the ISA-rewrite opt-in)"
        )
    return release


def required_ptx_isa(ptx_text: str) -> str:
    """The PTX ISA a module declares in its ``.version X.Y`` directive, e.g. "8.8"."""
    match = _PTX_VERSION_RE.search(ptx_text)
    if match is None:
        raise ToolchainError("PTX text has no .version directive")
    return match.group(2)


def rewrite_ptx_isa(ptx_text: str, isa: str) -> str:
    """Return ``ptx_text`` with its ``.version`` directive set to ``isa``."""
    if not re.fullmatch(r"\d+\.\d+", isa):
        raise ToolchainError(f"not a PTX ISA version: {isa!r}")
    new_text, count = _PTX_VERSION_RE.subn(lambda m: m.group(1) + isa, ptx_text, count=1)
    if count == 0:
        raise ToolchainError("PTX text has no .version directive")
    return new_text


def fit_ptx_isa(ptx_text: str, ptxas_release: str) -> str:
    """Lower the PTX ``.version`` to what ``ptxas_release`` accepts; unchanged if it fits.

    Only meant for the opt-in releases in ISA_REWRITE_PTXAS (check_ptxas_release
    guards that); for a supported release the DSL's PTX always fits.
    """
    max_isa = PTX_ISA_BY_PTXAS[ptxas_release]
    if version_key(required_ptx_isa(ptx_text)) <= version_key(max_isa):
        return ptx_text
    return rewrite_ptx_isa(ptx_text, max_isa)


# --------------------------------------------------------------------------- running


def run_tool(argv: Sequence[str | os.PathLike], what: str | None = None) -> str:
    """Run a tool and return its stdout+stderr; ToolchainError with its output on failure."""
    argv = [str(a) for a in argv]
    what = what or Path(argv[0]).name
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, errors="replace")
    except OSError as exc:
        raise ToolchainError(f"could not run {what}: {exc}") from exc
    output = proc.stdout + proc.stderr
    if proc.returncode != 0:
        # The tool's own reason on the first line (a one-line report shows that line alone):
        # its last error/fatal line, else its last line, e.g. cuobjdump's "File 'x.cubin' does
        # not contain device code" for a truncated cubin.
        lines = [" ".join(ln.split()) for ln in output.splitlines() if ln.strip()]
        errors = [ln for ln in lines if re.search(r"\b(error|fatal)\b", ln, re.I)]
        reason = (errors or lines or ["no output"])[-1]
        raise ToolchainError(
            f"{what} failed (exit {proc.returncode}): {reason}\n"
            f"command: {' '.join(argv)}\n{output.strip()}"
        )
    return output


def tool_version(binary: Path) -> tuple[str, str]:
    """(release, full version) from ``<tool> --version``, e.g. ("13.1", "13.1.115")."""
    text = run_tool([binary, "--version"])
    match = _RELEASE_RE.search(text)
    if match is None:
        raise ToolchainError(f"cannot read the version of {binary} from:\n{text.strip()}")
    return match.group(1), match.group(2)


# --------------------------------------------------------------------------- fetching


def cache_root() -> Path:
    """Folder holding the unpacked tools: $FA4_AOT_CACHE/toolchains (default ~/.cache/fa4_aot)."""
    base = os.environ.get("FA4_AOT_CACHE") or Path.home() / ".cache" / "fa4_aot"
    return Path(base).expanduser() / "toolchains"


def _cached(tool: str, version_glob: str) -> Path | None:
    """Newest cached binary of ``tool`` whose folder matches ``<tool>-<version_glob>``."""
    root = cache_root()
    if not root.is_dir():
        return None
    found = []
    for folder in root.glob(f"{tool}-{version_glob}"):
        version = folder.name[len(tool) + 1 :]
        binary = folder / tool
        if re.fullmatch(r"\d+(\.\d+)+", version) and os.access(binary, os.X_OK):
            found.append((version_key(version), binary))
    return max(found)[1] if found else None


def _pip_download(requirement: str, dest: Path) -> Path:
    """Download one wheel (no deps) into ``dest`` and return its path."""
    argv = [
        sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
        "--disable-pip-version-check", "--no-input", "--progress-bar", "off", "--retries", "2",
        "-d", str(dest), requirement,
    ]  # fmt: skip
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, errors="replace")
    except OSError as exc:
        raise FetchError(f"could not fetch {requirement} from PyPI: {exc}") from exc
    wheels = sorted(dest.glob("*.whl"))
    if proc.returncode != 0 or not wheels:
        output = proc.stderr + proc.stdout
        lines = [" ".join(ln.split()) for ln in output.splitlines() if ln.strip()]
        errors = [ln for ln in lines if ln.startswith("ERROR")] or lines[-1:] or ["no wheel"]
        reason = " / ".join(ln.removeprefix("ERROR: ") for ln in errors)
        if network := _NETWORK_ERROR_RE.search(output):
            reason = f"registry unreachable ({network.group(0).strip()}); {reason}"
        raise FetchError(f"could not fetch {requirement} from PyPI: {reason}")
    return wheels[0]


def _wheel_version(wheel: Path) -> str:
    # Wheel file names are <dist>-<version>-<python>-<abi>-<platform>.whl
    return wheel.name.split("-")[1]


def _fetch(tool: str, requirement: str, version_glob: str) -> Path:
    """Return the cached ``tool`` binary, downloading ``requirement`` on a cache miss."""
    hit = _cached(tool, version_glob)
    if hit is not None:
        return hit
    root = cache_root()
    root.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=f".{tool}-dl-", dir=root) as tmp:
        wheel = _pip_download(requirement, Path(tmp) / "wheel")
        version = _wheel_version(wheel)
        with zipfile.ZipFile(wheel) as zf:
            members = [n for n in zf.namelist() if n.endswith(f"/bin/{tool}")]
            if len(members) != 1:
                raise ToolchainError(f"{wheel.name} has no single bin/{tool} (found {members})")
            staging = Path(tmp) / "unpacked"
            staging.mkdir()
            with zf.open(members[0]) as src, open(staging / tool, "wb") as dst:
                shutil.copyfileobj(src, dst)
        (staging / tool).chmod(0o755)
        final = root / f"{tool}-{version}"
        try:
            os.rename(staging, final)
        except OSError:
            if not os.access(final / tool, os.X_OK):  # not a lost race: a real failure
                raise
    return final / tool


def _ptxas_requirement(release: str) -> str:
    package = "nvidia-cuda-nvcc-cu12" if release.startswith("12.") else "nvidia-cuda-nvcc"
    return f"{package}=={release}.*"


def get_inspect_tools() -> InspectTools:
    """Fetch (or reuse from the cache) the pinned cuobjdump and nvdisasm."""
    cuobjdump = _fetch("cuobjdump", f"nvidia-cuda-cuobjdump=={CUOBJDUMP_VERSION}", CUOBJDUMP_VERSION)
    nvdisasm = _fetch("nvdisasm", f"nvidia-cuda-nvdisasm=={NVDISASM_VERSION}", NVDISASM_VERSION)
    return InspectTools(cuobjdump, nvdisasm, tool_version(cuobjdump)[1])


def get_toolchain(ptxas_release: str = DEFAULT_PTXAS, allow_isa_rewrite: bool = False) -> Toolchain:
    """Fetch (or reuse from the cache) ptxas ``ptxas_release`` plus the pinned cuobjdump/nvdisasm."""
    release = check_ptxas_release(ptxas_release, allow_isa_rewrite)
    if release in ISA_REWRITE_PTXAS:
        warnings.warn(
            f"ptxas {release}: PTX .version headers must be lowered to {PTX_ISA_BY_PTXAS[release]} "
            "(fit_ptx_isa); ptxas then validates the DSL's instructions against an older ISA",
            UserWarning,
            stacklevel=2,
        )
    ptxas = _fetch("ptxas", _ptxas_requirement(release), f"{release}.*")
    got_release, ptxas_version = tool_version(ptxas)
    if got_release != release:
        raise ToolchainError(f"{ptxas} reports release {got_release}, expected {release}")
    tools = get_inspect_tools()
    return Toolchain(
        ptxas=ptxas,
        ptxas_version=ptxas_version,
        ptxas_release=release,
        cuobjdump=tools.cuobjdump,
        nvdisasm=tools.nvdisasm,
        cuobjdump_version=tools.cuobjdump_version,
    )


# --------------------------------------------------------------------------- assembling


def assemble(
    tc: Toolchain,
    ptx_path: str | os.PathLike,
    cubin_path: str | os.PathLike,
    arch: str = "sm_90a",
    opt: str = "-O3",
    extra_args: Sequence[str] = (),
) -> str:
    """Assemble ``ptx_path`` into ``cubin_path`` with ``tc.ptxas``; return the ``-v`` log.

    Runs ``ptxas -arch=<arch> <opt> -v [extra_args] -o <cubin> <ptx>``.  The log
    (stdout and stderr together) is what :func:`inspect_cubin.parse_ptxas_log` reads.
    """
    argv = [tc.ptxas, f"-arch={arch}", opt, "-v", *extra_args, "-o", cubin_path, ptx_path]
    return run_tool(argv, what=f"ptxas {tc.ptxas_version}")
