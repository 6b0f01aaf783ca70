"""The parts of README.md and docs/design.md that change with the tree, written from the tree.

    python build_tools/figures.py            # check: exit 1 and name each stale part
    python build_tools/figures.py --write    # rewrite them (the test counts run the suite)

A generated part sits between ``<!-- figures:NAME -->`` and ``<!-- /figures:NAME -->``:

``kernel-choice`` (docs/design.md)  the table of :data:`fa4_aot.plan.KERNEL_CHOICE`.
``spill-excerpt`` (README.md)       rows of ``build_tools/spill_report.py``'s default view of the
                                     committed manifest (header, :data:`EXCERPT_KERNELS`, totals).
``wheel`` (README.md)               the wheel's size (``pip wheel .``).
``tests`` (README.md)               what ``make test`` reports on a CPU-only machine (``--write``
                                     runs the fast suite: minutes).

tests/test_figures.py checks the first two against the real output; tests/test_wheel.py checks
the wheel's size where it builds one; the test counts are checked there against the collected
tests. Nothing here is imported by fa4_aot.
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

README = ROOT / "README.md"
DESIGN = ROOT / "docs" / "design.md"
# The kernels the README's spill-report excerpt shows: one of each kind.
EXCERPT_KERNELS = (
    "combine_sm_90a_bf16_hd128",
    "fwd_sm_100a_bf16_hd128_causal_clc_m128n128s2",
    "fwd_sm_90a_bf16_hd128_causal_steal_m128n160s2",
    "fwd_sm_90a_bf16_hd128_full_steal_m128n176s2",
    "fwd_sm_90a_bf16_hd64_full_steal_m192n128s4",
    "fwd_sm_90a_bf16_hd128_causal_steal_m64n64s3_decode",
    "fwd_sm_90a_bf16_hd256_causal_steal_m128n80s2",
)


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


def spill_excerpt(manifest: Path = ROOT / "artifacts" / "manifest.json") -> str:
    """The README's excerpt of the spill report: its header lines, the rows of
    EXCERPT_KERNELS, an elision line and the report's last lines (the totals)."""
    r = subprocess.run([sys.executable, str(ROOT / "build_tools" / "spill_report.py"),
                        "--manifest", str(manifest)], capture_output=True, text=True,
                       cwd=ROOT, check=True, env=_no_color())
    lines = r.stdout.splitlines()
    rows = {line.split()[0]: line for line in lines[2:] if line.split()[:1]
            and line.split()[0] in EXCERPT_KERNELS}
    body = [line for line in lines if line.split()[:1] and line.split()[0] in EXCERPT_KERNELS]
    n = len([line for line in lines[2:] if line.startswith("   ")])
    tail = lines[lines.index("") if "" in lines else len(lines):]
    return "\n".join(lines[:2] + [rows[k] for k in EXCERPT_KERNELS if k in rows]
                     + [f"   ... ({n} rows)"] + tail) if body else r.stdout


def _no_color() -> dict:
    import os
    return {**os.environ, "NO_COLOR": "1", "COLUMNS": "160"}


def wheel_mb(wheel: Path) -> str:
    return f"{wheel.stat().st_size / 1e6:.1f} MB"


def build_wheel(out: Path) -> Path:
    subprocess.run([sys.executable, "-m", "pip", "wheel", str(ROOT), "--no-deps",
                    "--no-build-isolation", "-q", "-w", str(out)], check=True,
                   capture_output=True)
    (wheel,) = out.glob("*.whl")
    return wheel


def test_counts() -> str:
    """``make test``'s last line on this machine (runs the fast suite)."""
    r = subprocess.run([sys.executable, "-m", "pytest", "tests", "-q", "-p", "no:cacheprovider"],
                       cwd=ROOT, capture_output=True, text=True)
    last = r.stdout.strip().splitlines()[-1]
    m = re.match(r"=*\s*(\d+ passed(?:, \d+ skipped)?)", last)
    if r.returncode or not m:
        raise RuntimeError(f"the fast suite did not pass: {last}")
    return m.group(1)


def region(text: str, name: str) -> str | None:
    """The generated part ``name`` of a document (None without its markers)."""
    m = re.search(rf"<!-- figures:{name} -->\n(.*?)\n?<!-- /figures:{name} -->", text, re.S)
    return m.group(1) if m else None


def replace_region(text: str, name: str, body: str) -> str:
    start, end = f"<!-- figures:{name} -->", f"<!-- /figures:{name} -->"
    i, j = text.index(start) + len(start), text.index(end)
    return text[:i] + "\n" + body + "\n" + text[j:]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--write", action="store_true", help="rewrite the generated parts")
    a = ap.parse_args(argv)
    parts = [(DESIGN, "kernel-choice", kernel_choice_table)]
    stale = []
    for path, name, make in parts:
        text = path.read_text()
        body = make()
        if region(text, name) != body:
            stale.append(f"{path.relative_to(ROOT)}: {name}")
            if a.write:
                path.write_text(replace_region(text, name, body))
    for s in stale:
        print(("rewrote " if a.write else "stale: ") + s)
    return 1 if stale and not a.write else 0


if __name__ == "__main__":
    sys.exit(main())
