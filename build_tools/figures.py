"""The parts of README.md and docs/design.md that change with the tree, written from the tree.

    python build_tools/figures.py            # check: exit 1 and name each stale part
    python build_tools/figures.py --write    # rewrite them (runs the fast suite: minutes)

A generated part sits between ``<!-- figures:NAME -->`` and ``<!-- /figures:NAME -->``:

``kernel-choice`` (docs/design.md)  the table of :data:`fa4_aot.plan.KERNEL_CHOICE`.
``spill-excerpt`` (README.md)       ``build_tools/spill_report.py --peaks``'s default view of the
                                     committed manifest: its header, the rows of
                                     :data:`EXCERPT_KERNELS`, its last two lines.
``tune-excerpt``, ``tune-gain``      ``build_tools/tune.py table`` of the committed manifest:
  (README.md)                        the rows of :data:`TUNE_FAMILIES`; what the measured pick
                                     buys over always-newest.
``wheel`` (README.md)               the size of the wheel ``pip install .`` builds.
``tests`` (README.md)               the fast suite's counts on a CPU-only machine.

Checked against the real output by the tests: tests/test_figures.py (the table, the excerpt),
tests/test_figures.py (the tune excerpt), tests/test_wheel.py (the size, within 0.1 MB),
tests/conftest.py (the counts, at the end of a
whole run of ``tests/`` without a GPU). Without ``--write`` the slow parts (the suite, the
wheel) are left out of the check.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

README = ROOT / "README.md"
DESIGN = ROOT / "docs" / "design.md"
MANIFEST = ROOT / "artifacts" / "manifest.json"
# The kernels of the README's spill-report excerpt: one of each kind.
EXCERPT_KERNELS = (
    "combine_sm_90a_bf16_hd128",
    "fwd_sm_100a_bf16_hd128_causal_clc_m128n128s2",
    "fwd_sm_90a_bf16_hd128_causal_steal_m128n160s2",
    "fwd_sm_90a_bf16_hd128_full_steal_m128n176s2",
    "fwd_sm_90a_bf16_hd64_full_steal_m192n128s4",
    "fwd_sm_90a_bf16_hd128_causal_steal_m64n64s3_decode",
    "fwd_sm_90a_bf16_hd256_causal_steal_m128n80s2",
)
# The kernel families of the README's excerpt of `tune.py table`.
TUNE_FAMILIES = ("hd64 full steal", "hd128 causal long_kv steal", "hd128 decode causal",
                 "hd128 full steal", "hd256 full steal")
TESTS_PATTERN = r"(\d+) passed, (\d+) skipped"


def _cell(text: str) -> str:
    return " ".join(text.split()).replace("|", "\\|")


def kernel_choice_table() -> str:
    """docs/design.md#kernel-choice: one line per row of plan.KERNEL_CHOICE."""
    from fa4_aot.plan import KERNEL_CHOICE
    lines = ["| row | form | kernel | tile | rules | why |", "|---|---|---|---|---|---|"]
    for i, row in enumerate(KERNEL_CHOICE):
        kernel = ", ".join(f"`{k}`" if v is True else f"`{k}={v!r}`"
                           for k, v in row.kernel.items() if v is not False)
        form = f"`{row.form}`" + (" (optional)" if row.optional else "")
        rules = "; ".join(_cell(rule.__doc__) for rule in row.rules)
        lines.append(f"| {i} | {form} | {kernel or 'the call’s'} | `{row.tile}` | {rules} | "
                     f"{_cell(row.why)} |")
    return "\n".join(lines)


def spill_report(*args: str) -> list[str]:
    """The lines of ``spill_report.py`` (no colour) on the committed manifest."""
    r = subprocess.run([sys.executable, str(ROOT / "build_tools" / "spill_report.py"),
                        "--manifest", str(MANIFEST), *args], capture_output=True, text=True,
                       cwd=ROOT, env={**os.environ, "NO_COLOR": "1"})
    if r.returncode:
        raise RuntimeError(f"spill_report failed: {r.stderr.strip()}")
    return r.stdout.splitlines()


def report_rows(lines: list[str]) -> dict:
    """{kernel: its row} of a spill report's table."""
    return {ln.split()[0]: ln for ln in lines[2:] if ln.startswith("   ") and ln.split()}


def spill_excerpt(lines: list[str]) -> str:
    """The README's excerpt of a spill report (``lines``: a ``--peaks`` run's)."""
    rows = report_rows(lines)
    return "\n".join(["```", *lines[:2], *(rows[k] for k in EXCERPT_KERNELS),
                      f"   ... ({len(rows)} rows)", "", *lines[-2:], "```"])


def _tune_table() -> list[str]:
    from build_tools.tune import table
    return table(MANIFEST).splitlines()


def tune_excerpt() -> str:
    """The README's excerpt of ``tune.py table``: its header and the TUNE_FAMILIES rows."""
    lines = _tune_table()
    rows = {ln.split(" | ")[0][2:]: ln for ln in lines[2:] if ln.startswith("| ")}
    return "\n".join(lines[:2] + [rows[f] for f in TUNE_FAMILIES])


def tune_gain() -> str:
    """What the measured pick buys over always-newest (``tune.py table``'s geometric mean)."""
    m = re.search(r"speedup over always-newest ([+-][\d.]+%)", "\n".join(_tune_table()))
    return m.group(1) if m else "?"


def build_wheel(dist: Path) -> Path:
    """The wheel of this tree in ``dist`` (from a copy of setup.py and fa4_aot, artifacts/
    linked: setuptools writes build/ and *.egg-info next to setup.py, not in the work tree)."""
    src = Path(tempfile.mkdtemp(prefix="fa4aot_wheel_src_"))
    try:
        shutil.copy2(ROOT / "setup.py", src / "setup.py")
        shutil.copytree(ROOT / "fa4_aot", src / "fa4_aot",
                        ignore=shutil.ignore_patterns("__pycache__", "_artifacts"))
        os.symlink(ROOT / "artifacts", src / "artifacts")
        r = subprocess.run([sys.executable, "-m", "pip", "wheel", str(src), "--no-deps",
                            "--no-build-isolation", "--no-index", "-q", "-w", str(dist)],
                           cwd=src, capture_output=True, text=True, timeout=300)
        if r.returncode:
            raise RuntimeError(f"pip wheel failed: {r.stdout}{r.stderr}")
    finally:
        shutil.rmtree(src, ignore_errors=True)
    (wheel,) = dist.glob("fa4_aot-*.whl")
    return wheel


def wheel_mb(wheel: Path) -> str:
    return f"{wheel.stat().st_size / 1e6:.1f} MB"


def suite_counts() -> str:
    """"N passed, M skipped": the fast suite's counts here (runs it)."""
    r = subprocess.run([sys.executable, "-m", "pytest", "tests", "-q", "-p", "no:cacheprovider"],
                       cwd=ROOT, capture_output=True, text=True,
                       env={**os.environ, "FA4_AOT_FIGURES": "1"})
    last = r.stdout.strip().splitlines()[-1] if r.stdout.strip() else ""
    m = re.search(TESTS_PATTERN, last)
    if r.returncode or not m:
        raise RuntimeError(f"the fast suite did not pass: {last or r.stderr[-500:]}")
    return m.group(0)


def region(text: str, name: str) -> str | None:
    """The generated part ``name`` of a document (None without its markers); a part on lines
    of its own is returned without the newlines around it."""
    m = re.search(rf"<!-- figures:{name} -->(.*?)<!-- /figures:{name} -->", text, re.S)
    if m is None:
        return None
    body = m.group(1)
    return body[1:-1] if body.startswith("\n") and body.endswith("\n") else body


def replace_region(text: str, name: str, body: str) -> str:
    start, end = f"<!-- figures:{name} -->", f"<!-- /figures:{name} -->"
    i, j = text.index(start) + len(start), text.index(end)
    if text[i:j].startswith("\n"):
        body = f"\n{body}\n"
    return text[:i] + body + text[j:]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--write", action="store_true",
                    help="rewrite the generated parts (runs the fast suite and builds the wheel)")
    a = ap.parse_args(argv)
    parts = [(DESIGN, "kernel-choice", kernel_choice_table),
             (README, "tune-excerpt", tune_excerpt), (README, "tune-gain", tune_gain),
             (README, "spill-excerpt", lambda: spill_excerpt(spill_report("--peaks")))]
    if a.write:
        dist = Path(tempfile.mkdtemp(prefix="fa4aot_wheel_"))
        parts += [(README, "wheel", lambda: wheel_mb(build_wheel(dist))),
                  (README, "tests", suite_counts)]
    stale = []
    for path, name, make in parts:
        body = make()
        text = path.read_text()
        if region(text, name) != body:
            stale.append(f"{path.relative_to(ROOT)}: {name}")
            if a.write:
                path.write_text(replace_region(text, name, body))
    for s in stale:
        print(("rewrote " if a.write else "stale: ") + s)
    return 1 if stale and not a.write else 0


if __name__ == "__main__":
    sys.exit(main())
