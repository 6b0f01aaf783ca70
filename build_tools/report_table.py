"""The spill report's output (moved out of spill_report.py): rows rendered as text or a heatmap.

``render`` formats rows as a ``table`` (fitted to ``WIDTH`` columns unless ``wide``) or ``md``,
flat or as a kernel × ptxas version matrix (``--ptxas`` / ``--diff``: ``_cell`` per version,
``MATRIX_LEGEND``), followed by the notes and the totals line (``totals_line``), or as ``json`` /
``csv``; ``changed_rows`` keeps the kernels that differ between two releases (``--diff``);
``write_png`` draws the matrix as a heatmap (matplotlib). spill_report.py re-exports every name
here.
"""

from __future__ import annotations

import csv
import io
import json
import sys
from pathlib import Path
from typing import Any

from build_tools.report_inputs import peak_cache_dir
from build_tools.report_rows import RESOURCE_FIELDS, ReportError, _display_path, _n, pick_best, spills
from build_tools.toolchain import version_key

PNG_HINT = ("--png needs matplotlib, which this Python ({python}) cannot import: run "
            "`{python} -m pip install -r requirements-build.txt` (or `pip install matplotlib`)")


def _fmt(value: Any) -> str:
    return "?" if value is None else str(value)


def _roles(row: dict) -> str:
    """``peak/budget`` per setmaxnreg region, launch budget first: ``38/168 22/24 224/240``."""
    roles = row.get("reg_peak_by_role")
    if roles is None or row.get("error"):
        return "?"
    if not roles:
        return "-"
    return " ".join(f"{r['peak']}/{_fmt(row.get('registers') if r['setmaxnreg'] is None else r['setmaxnreg'])}"
                    for r in roles)


WIDTH = 160  # the default table fits this many columns (--wide: every column, paths whole)


def _short(text: str, width: int) -> str:
    """``text`` cut in the middle to ``width`` characters (``abc…xyz``)."""
    if len(text) <= width:
        return text
    if width <= 1:
        return text[:width]
    head = (width - 1) // 2
    return text[: head] + "…" + text[len(text) - (width - 1 - head):]


def _short_path(path: str, width: int) -> str:
    """A path cut to ``width``: the file name and as many folders before it as fit (``…/a/b.ptx``)."""
    if len(path) <= width:
        return path
    parts = Path(path).parts
    tail = parts[-1]
    for part in reversed(parts[:-1]):
        if len(part) + 1 + len(tail) + 2 > width:
            break
        tail = f"{part}/{tail}"
    return _short(f"…/{tail}", width)


def _us(value: Any) -> str:
    return "-" if value is None else f"{value:.1f}"


def _fastest(row: dict) -> str:
    """The measured choice against the shipped cubin: ``=`` (the shipped ptxas),
    ``13.0 -2.1%`` (13.0 measured that much faster), ``-`` (not measured)."""
    chosen, times = row.get("us_chosen"), row.get("us_measured") or {}
    if not chosen or chosen not in times:
        return "-"
    if chosen == row.get("ptxas_version"):
        return "="
    release = ".".join(chosen.split(".")[:2])
    mine = row.get("us")
    return release if not mine else f"{release} {times[chosen] / mine - 1:+.1%}"


TIMING_NOTE = ("µs: the kernel's median time on its representative call, measured on a GPU by "
               "build_tools/tune.py (the shape and GPU: the manifest's measured block); pick: the "
               "ptxas tune.py picked (the fastest; ties within noise: fewest spills, then newest), its time against "
               "the shipped cubin's, = when that is the shipped ptxas; -: not measured")


def _is_manifest_cubin(row: dict) -> bool:
    """A shipped row whose path is the build's <manifest folder>/<arch>/<kernel>.cubin."""
    p = Path(row["path"])
    return row.get("source") == "shipped" and p.name == f"{row['kernel']}.cubin" and p.parent.name == (row["arch"] or "")


def _pair(a: Any, b: Any) -> str:
    return f"{_fmt(a)}/{_fmt(b)}"


def _flat_table(rows: list[dict], wide: bool = False) -> tuple[list[str], list[list[str]], list[bool]]:
    headers = ["!", "kernel", "arch", "regs", "peak", "roles (peak/budget)", "stack", "spill st", "spill ld",
               "LDL", "STL", "U-loops", "smem", "dyn smem", "ptxas", "warn", "path"]
    body, marks = [], []
    for r in rows:
        bad = spills(r) or bool(r.get("error"))
        if r.get("error"):
            body.append(["E", r["kernel"], _fmt(r["arch"]), *["?"] * 11, _fmt(r["ptxas_version"]), "-",
                         _display_path(r["path"])])
        else:
            body.append(
                ["!" if spills(r) else "", r["kernel"], _fmt(r["arch"]), _fmt(r["registers"]), _fmt(r.get("reg_peak")),
                 _roles(r), _fmt(r["stack_frame"]), _fmt(r["spill_store_bytes"]), _fmt(r["spill_load_bytes"]),
                 _fmt(r["ldl"]), _fmt(r["stl"]), _fmt(r.get("lane_loops")), _fmt(r["shared_bytes"]),
                 _fmt(r.get("dynamic_smem_bytes")),
                 _fmt(r["ptxas_version"]), ",".join(r.get("ptxas_warnings") or ["-"]), _display_path(r["path"])]
            )  # fmt: skip
        marks.append(bad)
    if any(r.get("us_measured") for r in rows):  # build_tools/tune.py timings: µs, pick
        at = headers.index("path")
        headers[at:at] = ["µs", "pick"]
        for cells, r in zip(body, rows, strict=True):
            cells[at:at] = [_us(r.get("us")), _fastest(r)]
    if wide:
        return headers, body, marks
    # The default view: spill bytes and LDL/STL as store/load pairs, no all-zero stack or U-loops
    # column, no path column when every path is the manifest's <arch>/<kernel>.cubin.
    col = {h: i for i, h in enumerate(headers)}
    drop = {"spill st", "spill ld", "LDL", "STL"}
    for name in ("stack", "U-loops"):
        if all(cells[col[name]] in ("0", "?") for cells in body):
            drop.add(name)
    if all(_is_manifest_cubin(r) for r in rows):
        drop.add("path")
    if "µs" in col:  # room for the timings: dynamic shared memory (and warn, when no kernel
        drop.add("dyn smem")  # has a ptxas warning) are in --wide
        if all(cells[col["warn"]] == "-" for cells in body):
            drop.add("warn")
    narrow_headers, narrow_body = [], [[] for _ in body]
    for h in headers:
        if h == "spill st":
            narrow_headers.append("spill st/ld")
            for out, cells in zip(narrow_body, body, strict=True):
                out.append(f"{cells[col['spill st']]}/{cells[col['spill ld']]}")
        elif h == "LDL":
            narrow_headers.append("LDL/STL")
            for out, cells in zip(narrow_body, body, strict=True):
                out.append(f"{cells[col['LDL']]}/{cells[col['STL']]}")
        if h in drop:
            continue
        narrow_headers.append(h)
        for out, cells in zip(narrow_body, body, strict=True):
            out.append(cells[col[h]])
    return narrow_headers, narrow_body, marks


def _fit(headers: list[str], body: list[list[str]], width: int) -> list[list[str]]:
    """Shorten the path, then the kernel, then the roles column until a row fits ``width``."""

    def total(bdy):
        return sum(max(len(h), *(len(row[i]) for row in bdy)) for i, h in enumerate(headers)) + 2 * (len(headers) - 1)

    if not body or total(body) <= width:
        return body
    for name, floor, cut in (("path", 24, _short_path), ("kernel", 32, _short), ("roles (peak/budget)", 12, _short)):
        if name not in headers:
            continue
        i = headers.index(name)
        over = total(body) - width
        if over <= 0:
            break
        current = max(len(headers[i]), *(len(row[i]) for row in body))
        target = max(floor, current - over)
        body = [[cut(c, target) if j == i else c for j, c in enumerate(row)] for row in body]
    return body


def _sum_known(*values: Any) -> int | None:
    return None if all(v is None for v in values) else sum(_n(v) for v in values)


def _cell(row: dict) -> str:
    """``registers/spill bytes/LDL+STL`` with ``?`` for what is unknown (e.g. ``128/?/0`` for a
    cubin: no ptxas log, so no spill bytes); ``error`` when the file failed."""
    if row.get("error"):
        return "error"
    spill = _sum_known(row["spill_store_bytes"], row["spill_load_bytes"])
    local_ops = _sum_known(row["ldl"], row["stl"])
    return (f"{_fmt(row['registers'])}/{_fmt(spill)}/{_fmt(local_ops)}" + (" !" if spills(row) else "")
            + (" w" if row.get("ptxas_warnings") else "")
            + (f" {row['us']:.1f}µs" + ("*" if row.get("us_chosen") == row["ptxas_version"] else "")
               if row.get("us") is not None else ""))


MATRIX_LEGEND = ("cell = registers / spill bytes (stores+loads) / LDL+STL count; ? = unknown; ! = spills; "
                 "w = a ptxas performance warning (the table and --format json name the code, "
                 "e.g. C7512: wgmma serialised)")
MATRIX_TIMING_LEGEND = ("µs = the manifest's measured median time of that ptxas's cubin (build_tools/tune.py), "
                        "* = the ptxas measured fastest (ties within noise: fewest spills, then newest)")


def _versions(rows: list[dict]) -> list[str | None]:
    """The full ptxas versions present, oldest first (None = unknown, last)."""
    known = sorted({r["ptxas_version"] for r in rows if r["ptxas_version"]}, key=version_key)
    return known + ([None] if any(r["ptxas_version"] is None for r in rows) else [])


def _by_kernel(rows: list[dict], field: str) -> dict[str, dict[Any, dict]]:
    """{kernel label: {row[field]: row}}, kernels in first-seen order (labels are unique)."""
    grouped: dict[str, dict[Any, dict]] = {}
    for r in rows:
        grouped.setdefault(r["kernel"], {})[r[field]] = r
    return grouped


def _matrix_table(rows: list[dict]) -> tuple[list[str], list[list[str]], list[bool]]:
    versions = _versions(rows)
    by_kernel = _by_kernel(rows, "ptxas_version")
    headers = ["!", "kernel", "arch", *(v or "ptxas ?" for v in versions), "best", "peak", "roles (peak/budget)",
               "path"]
    body, marks = [], []
    for kernel, cells in by_kernel.items():
        bad = any(spills(r) or r.get("error") for r in cells.values())
        good = [r for r in cells.values() if not r.get("error") and r.get("ptxas_release")]
        best = pick_best(good)[0] if len(good) > 1 else ""
        some = next((r for r in cells.values() if not r.get("error")), next(iter(cells.values())))
        peaks = sorted({str(r["reg_peak"]) for r in cells.values() if r.get("reg_peak") is not None})
        roles = list(dict.fromkeys(_roles(r) for r in cells.values() if not r.get("error")))
        body.append(["!" if bad else "", kernel, _fmt(some["arch"]),
                     *(_cell(cells[v]) if v in cells else "" for v in versions), best,
                     ",".join(peaks) or "?", ", ".join(roles) or "?",
                     _display_path(some.get("path") or "?")])  # fmt: skip
        marks.append(bad)
    return headers, body, marks


def _render(headers: list[str], body: list[list[str]], marks: list[bool], fmt: str, colour: bool,
            width: int | None = None) -> str:
    if width and fmt == "table":
        body = _fit(headers, body, width)
    if fmt == "md":
        lines = ["| " + " | ".join(headers) + " |", "|" + "|".join("---" for _ in headers) + "|"]
        lines += ["| " + " | ".join(c.replace("|", "\\|") for c in row) + " |" for row in body]
        return "\n".join(lines)
    widths = [max(len(h), *(len(row[i]) for row in body)) for i, h in enumerate(headers)]
    left = ("!", "kernel", "arch", "best", "roles (peak/budget)", "path")
    numeric = [i for i, h in enumerate(headers) if h not in left]

    def line(cells: list[str]) -> str:
        parts = [c.rjust(w) if i in numeric else c.ljust(w) for i, (c, w) in enumerate(zip(cells, widths, strict=True))]
        return "  ".join(parts).rstrip()

    lines = [line(headers), line(["-" * w for w in widths])]
    for row, bad in zip(body, marks, strict=True):
        text = line(row)
        lines.append(f"\033[1;31m{text}\033[0m" if colour and bad else text)
    return "\n".join(lines)


MAX_ERROR_NOTES = 5


def _footnotes(rows: list[dict]) -> list[str]:
    notes = []
    unread = [r for r in rows if r.get("source") == "shipped" and r.get("reg_peak") is None and not r.get("error")]
    if unread:
        notes.append(f"peak, roles, smem: ? = not read yet for {len(unread)} kernel{'s' if len(unread) > 1 else ''}: "
                     "`spill_report.py --peaks` reads them from the cubins' SASS (~0.5 s a kernel, once; then "
                     f"shown by default, cached in {_display_path(str(peak_cache_dir()))})")
    if any(_n(r.get("lane_loops")) for r in rows):
        notes.append("U-loops: BRA.U.ANY loops, instructions that need warp-uniform operands (TMA issues) "
                     "which ptxas could not prove uniform, issued once per distinct lane value")
    errors = 0
    for r in rows:
        for what in ("error", "note"):
            if r.get(what):
                if what == "error":
                    errors += 1
                    if errors > MAX_ERROR_NOTES:
                        continue
                text = f"{what}: {r['kernel']} ({_display_path(r['path'])}"
                text += f", ptxas {r['ptxas_version']}): " if r.get("ptxas_version") else "): "
                notes.append(text + r[what])
    if errors > MAX_ERROR_NOTES:
        notes.append(f"... and {errors - MAX_ERROR_NOTES} more errors (rows marked E; --format json has each)")
    return list(dict.fromkeys(notes))


def totals_line(rows: list[dict]) -> str:
    """The report's last line: ``253 kernels, 0 spilling, max 240 registers, ptxas 13.1.115``
    (+ how many failed, when some did)."""
    kernels = list(dict.fromkeys(r["kernel"] for r in rows))
    spilling = {r["kernel"] for r in rows if spills(r)}
    failed = {r["kernel"] for r in rows if r.get("error")}
    regs = [r["registers"] for r in rows if r.get("registers") is not None]
    versions = [v for v in _versions(rows) if v]
    parts = [f"{len(kernels)} kernel{'s' if len(kernels) != 1 else ''}", f"{len(spilling)} spilling"]
    if failed:
        parts.append(f"{len(failed)} failed")
    parts.append(f"max {max(regs)} registers" if regs else "max registers ?")
    parts.append("ptxas " + (", ".join(versions) if versions else "?"))
    return ", ".join(parts)


def _wrap(line: str, width: int) -> str:
    import textwrap

    return "\n".join(textwrap.wrap(line, width, subsequent_indent="  ", break_on_hyphens=False,
                                    break_long_words=True)) or line


def render(rows: list[dict], fmt: str, matrix: bool, colour: bool = False, wide: bool = False) -> str:
    """Format rows as ``table``/``md`` (flat or kernel × version matrix, then notes and a totals
    line), ``json`` or ``csv``. A ``table`` fits 160 columns unless ``wide``."""
    if fmt == "json":
        return json.dumps(rows, indent=2)
    if fmt == "csv":
        buf = io.StringIO()
        fields = list(rows[0]) if rows else ["kernel", "path"]
        writer = csv.DictWriter(buf, fieldnames=fields, lineterminator="\n")
        writer.writeheader()
        for r in rows:
            out = {k: ";".join(v) if isinstance(v, list) and all(isinstance(x, str) for x in v) else v
                   for k, v in r.items()}  # fmt: skip
            out["reg_peak_by_role"] = _roles(r).replace(" ", ";") if not r.get("error") else None
            writer.writerow(out)
        return buf.getvalue().rstrip("\n")
    if not rows:
        return "(no kernels)"
    table = _matrix_table(rows) if matrix else _flat_table(rows, wide)
    text = _render(*table, fmt, colour, width=None if wide else WIDTH)
    notes = _footnotes(rows)
    timed = any(r.get("us_measured") for r in rows)
    if matrix:
        notes.insert(0, MATRIX_LEGEND)
        if timed:
            notes.insert(1, MATRIX_TIMING_LEGEND)
    elif timed:
        notes.append(TIMING_NOTE)
    if not matrix and not wide and all(_is_manifest_cubin(r) for r in rows):
        folder = _display_path(str(Path(rows[0]["path"]).parent.parent))
        notes.append(f"cubins: {folder}/<arch>/<kernel>.cubin; --wide shows every column (stack, U-loops, paths)")
    elif not wide:
        notes.append("--wide shows every column and whole paths")
    if notes:
        text += "\n\n" + "\n".join(notes if wide else [_wrap(n, WIDTH) for n in notes])
    return text + "\n" + totals_line(rows)


def changed_rows(rows: list[dict], release_a: str, release_b: str) -> list[dict]:
    """Rows of the kernels whose figures differ between two ptxas releases (every version's
    rows of such a kernel are kept)."""
    keep = set()
    for kernel, cells in _by_kernel(rows, "ptxas_release").items():
        a, b = cells.get(release_a), cells.get(release_b)
        if a is None or b is None or any(a.get(k) != b.get(k) for k in (*RESOURCE_FIELDS, "reg_peak", "error")):
            keep.add(kernel)
    return [r for r in rows if r["kernel"] in keep]


def write_png(rows: list[dict], path: Path) -> None:
    """Heatmap of spill bytes + LDL/STL per kernel × ptxas version, cells annotated."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as exc:
        raise ReportError(PNG_HINT.format(python=sys.executable)) from exc
    if not rows:
        raise ReportError("--png: no kernels to plot")
    import textwrap

    kernels = list(dict.fromkeys(r["kernel"] for r in rows))
    versions = _versions(rows)
    grid = [[0.0] * len(versions) for _ in kernels]
    label_chars = min(max(len(k) for k in kernels), 48)
    width = max(6.0, 0.09 * label_chars + 1.5 * len(versions) + 1.0)
    fig, ax = plt.subplots(figsize=(width, 1.8 + 0.4 * len(kernels)), layout="constrained")
    for r in rows:
        i, j = kernels.index(r["kernel"]), versions.index(r["ptxas_version"])
        badness = _n(r["spill_store_bytes"]) + _n(r["spill_load_bytes"]) + _n(r["ldl"]) + _n(r["stl"])
        grid[i][j] = float(badness)
        ax.text(j, i, _cell(r), ha="center", va="center", fontsize=8)
    ax.imshow(grid, cmap="Reds", aspect="auto", vmin=0)
    ax.set_xticks(range(len(versions)), [v or "ptxas ?" for v in versions])
    ax.set_yticks(range(len(kernels)), ["\n".join(textwrap.wrap(k, 48)) or k for k in kernels], fontsize=8)
    ax.set_xlabel("ptxas")
    # the legend as a figure title, wrapped to the figure's width (about 14 characters an inch at 8 pt)
    fig.suptitle("\n".join(textwrap.wrap(MATRIX_LEGEND, max(40, int(width * 14)))), fontsize=8, x=0.01,
                 ha="left")  # fmt: skip
    fig.savefig(path, dpi=110)
    plt.close(fig)
