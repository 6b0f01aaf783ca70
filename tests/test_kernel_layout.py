"""Source layout of the DSL kernels (CPU only, no cutlass import): small modules, the sm_90a
kernel as a package of two classes over a shared base, no lab-version citations in comments."""

from __future__ import annotations

import re
from pathlib import Path

KERNELS = Path(__file__).resolve().parents[1] / "fa4_aot" / "kernels"
MAX_LINES = 800


def _sources():
    files = sorted(KERNELS.rglob("*.py"))
    assert files, KERNELS
    return files


def test_every_kernel_source_is_at_most_800_lines():
    long = {str(p.relative_to(KERNELS)): n for p in _sources()
            if (n := len(p.read_text().splitlines())) > MAX_LINES}
    assert not long, f"over {MAX_LINES} lines: {long}"


def test_sm90_is_a_package_without_the_old_module():
    assert not (KERNELS / "sm90_fwd.py").exists()
    for name in ("__init__", "base", "prefill", "decode", "ptx", "epilogue"):
        assert (KERNELS / "sm90" / f"{name}.py").is_file(), name


def test_no_decode_flag_in_sm90():
    """Prefill and decode are two classes: no run-time-of-tracing ``self.decode`` branches."""
    hits = [f"{p.name}:{i}" for p in sorted((KERNELS / "sm90").rglob("*.py"))
            for i, line in enumerate(p.read_text().splitlines(), 1) if "self.decode" in line]
    assert not hits, hits


def test_no_lab_version_citations():
    """Comments cite docs/design.md, not lab versions ("v12", "perf-notes.md v20"). PTX
    mnemonics such as ``ld.shared.v4.b32`` are not citations."""
    pattern = re.compile(r"(?<![.\w])v[0-9]+\b|perf-notes")
    hits = [f"{p.relative_to(KERNELS)}:{i}: {line.strip()}" for p in _sources()
            for i, line in enumerate(p.read_text().splitlines(), 1) if pattern.search(line)]
    assert not hits, hits
