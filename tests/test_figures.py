"""The generated parts of README.md and docs/design.md (build_tools/figures.py) against what the
tree gives today: a stale part fails here, naming the command that rewrites it. (The wheel's
size: tests/test_wheel.py; the suite's counts: tests/conftest.py, at the end of a whole run.)"""

import pytest

from build_tools import figures

WRITE = "run `python build_tools/figures.py --write`"


def test_kernel_choice_table_is_the_planners():
    assert figures.region(figures.DESIGN.read_text(), "kernel-choice") == \
        figures.kernel_choice_table(), f"docs/design.md#kernel-choice is stale: {WRITE}"


def test_readme_tune_excerpt_is_the_manifests():
    text = figures.README.read_text()
    assert figures.region(text, "tune-excerpt") == figures.tune_excerpt(), \
        f"README.md's excerpt of `tune.py table` is stale: {WRITE}"
    assert figures.region(text, "tune-gain") == figures.tune_gain(), WRITE


def test_readme_spill_excerpt_is_the_reports(tmp_path):
    """Every line of the README's excerpt is the real report's (compared field by field: the
    column widths follow whichever peaks are cached here): its header, the rows of the excerpt's
    kernels (their peaks read first, a few seconds), its last two lines."""
    from build_tools import toolchain as tcm
    try:
        tcm.get_inspect_tools()
    except tcm.ToolchainError as exc:
        pytest.skip(f"cuobjdump/nvdisasm not available: {exc}")
    import json
    manifest = json.loads(figures.MANIFEST.read_text())
    few = tmp_path / "manifest.json"  # the excerpt's kernels alone: --peaks reads (caches) them
    few.write_text(json.dumps({**manifest, "kernels": {
        k: dict(manifest["kernels"][k], cubin=str(figures.MANIFEST.parent /
                                                   manifest["kernels"][k]["cubin"]))
        for k in figures.EXCERPT_KERNELS}}))
    import subprocess
    import sys
    subprocess.run([sys.executable, str(figures.ROOT / "build_tools/spill_report.py"),
                    "--manifest", str(few), "--peaks"], capture_output=True, check=True)
    real = figures.spill_report()
    excerpt = figures.region(figures.README.read_text(), "spill-excerpt")
    assert excerpt is not None, "README.md has no spill-report excerpt"
    lines = excerpt.splitlines()
    assert lines[0] == lines[-1] == "```"
    rows = figures.report_rows(real)
    stale = [ln for ln in lines[1:-1] if ln.split() and not (
        ln.split() in ([r.split() for r in real[:2] + real[-2:]])
        or (ln.split()[0] in rows and ln.split() == rows[ln.split()[0]].split())
        or ln == f"   ... ({len(rows)} rows)")]
    assert not stale, f"README.md's spill-report excerpt is stale ({WRITE}): {stale}"
    assert [ln.split()[0] for ln in lines[3:3 + len(figures.EXCERPT_KERNELS)]] == \
        list(figures.EXCERPT_KERNELS)
