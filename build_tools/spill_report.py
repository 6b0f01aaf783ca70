"""Register / spill report for fa4_aot kernels, and ptxas version comparison.

    python build_tools/spill_report.py                      # shipped kernels (artifacts/manifest.json)
    python build_tools/spill_report.py --ptxas 12.9 13.0 13.1   # re-assemble the kept PTX with each
    python build_tools/spill_report.py --diff 13.0 13.1     # only kernels that change between two
    python build_tools/spill_report.py k.sm_90a.ptx x.cubin # files instead of the manifest
    python build_tools/spill_report.py --fail-on-spill      # exit 1 when anything spills

A kernel *spills* when ptxas reports spill bytes or its SASS has LDL/STL (under
setmaxnreg the per-role spills only show as LDL/STL).  When the manifest's PTX is
re-assembled, the shipped figures still count for --fail-on-spill.  Exit status: 0
fine, 1 spills with --fail-on-spill, 2 bad input (one-line error).

The ``warn`` column (``w`` in a matrix cell) names ptxas "Potential Performance Loss" codes,
above all C7512: ptxas serialised the wgmma (each waits for the previous one) — a slowdown
with no spill to show for it.

Library use: :func:`assemble_matrix` assembles PTX files with several ptxas versions
and inspects the cubins (one row per entry × version); :func:`pick_best` chooses a
version for one kernel from its rows.  Row fields::

    kernel, entry, arch, source ("shipped" | "cubin" | "assembled"), path,
    ptxas_version ("13.1.115"), ptxas_release ("13.1"), registers, stack_frame,
    spill_store_bytes, spill_load_bytes, ldl, stl, shared_bytes   (None = unknown),
    ptxas_warnings (["C7512", ...])

Stdlib only (matplotlib is imported for --png alone).
"""

from __future__ import annotations

import argparse
import csv
import io
import json
import os
import re
import sys
import tempfile
from collections.abc import Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as `python build_tools/spill_report.py`
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from build_tools.inspect_cubin import inspect_cubin, ptx_target, verify_ptxas  # noqa: E402
from build_tools.toolchain import (  # noqa: E402
    DEFAULT_PTXAS,
    Toolchain,
    ToolchainError,
    assemble,
    check_ptxas_release,
    fit_ptx_isa,
    get_inspect_tools,
    get_toolchain,
    version_key,
)

__all__ = ["ReportError", "assemble_matrix", "pick_best", "spills", "main"]

DEFAULT_MANIFEST = Path("artifacts/manifest.json")
RESOURCE_FIELDS = (
    "registers", "stack_frame", "spill_store_bytes", "spill_load_bytes", "ldl", "stl", "shared_bytes",
)  # fmt: skip


class ReportError(Exception):
    """Bad input for the report (printed as a one-line error, exit status 2)."""


# --------------------------------------------------------------------------- rows


def _n(value: Any) -> int:
    return value or 0


def spills(row: dict[str, Any]) -> bool:
    """True when the row has spill bytes or any LDL/STL."""
    return any(_n(row.get(k)) > 0 for k in ("spill_store_bytes", "spill_load_bytes", "ldl", "stl"))


def warning_codes(diagnostics: Iterable[str]) -> list[str]:
    """``["(C7512) Potential Performance Loss: ..."]`` -> ``["C7512"]``."""
    return [m.group(1) for d in diagnostics if (m := re.match(r"\((C\d+)\)", d))]


def _row(kernel: str, entry: str, source: str, path: Path, version: str | None, resources: dict,
         diagnostics: Iterable[str] = ()) -> dict:
    return {
        "kernel": kernel,
        "entry": entry,
        "arch": resources.get("arch"),
        "source": source,
        "path": str(path),
        "ptxas_version": version,
        "ptxas_release": ".".join(version.split(".")[:2]) if version else None,
        **{k: resources.get(k) for k in RESOURCE_FIELDS},
        # ptxas performance warnings, e.g. C7512 (wgmma serialised), C7508 (setmaxnreg ignored)
        "ptxas_warnings": warning_codes(diagnostics),
    }


def _entry_rows(info: dict, label: str, source: str, path: Path) -> list[dict]:
    """Rows for the entries of an inspect_cubin() result; label names single-entry files."""
    rows = []
    for entry, res in info["entries"].items():
        kernel = label if len(info["entries"]) == 1 else f"{label}:{entry}"
        rows.append(_row(kernel, entry, source, path, info["ptxas_version"], {"arch": info["arch"], **res},
                         info.get("ptxas_diagnostics", ())))
    return rows


def _file_label(path: Path) -> str:
    """`dir/foo.sm_90a.ptx` → `foo`."""
    name = path.name
    for suffix in (".ptx", ".cubin"):
        name = name.removesuffix(suffix)
    stem, _, arch = name.rpartition(".")
    return stem if stem and arch.startswith("sm_") else name


def _assemble_one(tc: Toolchain, ptx: Path, workdir: Path) -> list[dict]:
    text = ptx.read_text()
    arch = ptx_target(text)
    fitted = fit_ptx_isa(text, tc.ptxas_release)
    src = ptx
    if fitted != text:  # opt-in ISA rewrite (ptxas 12.8)
        src = workdir / f"{ptx.stem}.isa.ptx"
        src.write_text(fitted)
    cubin = workdir / f"{_file_label(ptx)}.{tc.ptxas_version}.cubin"
    log = assemble(tc, src, cubin, arch=arch)
    info = inspect_cubin(tc, cubin, log)
    verify_ptxas(info, tc)
    info["ptxas_version"] = tc.ptxas_version  # ptxas 12.x writes no tkinfo note
    return _entry_rows(info, _file_label(ptx), "assembled", ptx)


def assemble_matrix(
    ptx_paths: Iterable[str | os.PathLike],
    versions: Sequence[str],
    *,
    allow_isa_rewrite: bool = False,
    jobs: int | None = None,
) -> list[dict[str, Any]]:
    """Assemble every PTX file with every ptxas release and inspect the cubins.

    Returns one row per (PTX entry, version), ordered by file, then version as given.
    ``kernel`` is the file's stem (``stem:entry`` for multi-entry files); ``path`` is
    the PTX path.  Work runs in ``jobs`` threads (default: one per core).  Raises
    ToolchainError for unknown versions, fetch or ptxas failures.
    """
    paths = list(dict.fromkeys(Path(p) for p in ptx_paths))
    for version in versions:
        check_ptxas_release(version, allow_isa_rewrite)
    get_inspect_tools()  # once, before the per-version fetches below share it
    pool = ThreadPoolExecutor(max_workers=jobs or os.cpu_count() or 1)
    with pool, tempfile.TemporaryDirectory(prefix="fa4-spill-") as tmp:
        tcs = list(pool.map(lambda v: get_toolchain(v, allow_isa_rewrite), versions))
        tasks = [(tc, ptx, Path(tmp) / f"{i}-{j}") for i, ptx in enumerate(paths) for j, tc in enumerate(tcs)]
        for _, _, workdir in tasks:
            workdir.mkdir()
        results = pool.map(lambda task: _assemble_one(*task), tasks)
        return [row for rows in results for row in rows]


def _aggregate(rows: list[dict]) -> dict[str, dict[str, Any]]:
    """Per ptxas release: total spill bytes, LDL+STL, max registers, ptxas performance warnings
    and the full version."""
    by_release: dict[str, dict[str, Any]] = {}
    for row in rows:
        agg = by_release.setdefault(
            row["ptxas_release"],
            {"version": row["ptxas_version"], "spill": 0, "local_ops": 0, "registers": 0, "warnings": set()},
        )
        agg["warnings"].update(row.get("ptxas_warnings") or ())
        agg["spill"] += _n(row["spill_store_bytes"]) + _n(row["spill_load_bytes"])
        agg["local_ops"] += _n(row["ldl"]) + _n(row["stl"])
        agg["registers"] = max(agg["registers"], _n(row["registers"]))
    return by_release


def pick_best(rows_for_one_kernel: Sequence[dict[str, Any]]) -> tuple[str, str]:
    """Choose a ptxas release for one kernel from its rows (one or more per version).

    Order: no spill bytes first, then no ptxas performance warning (e.g. C7512, serialised
    wgmma), then fewest LDL+STL, then fewest registers, then the newest version.  Returns
    ``(release, reason)``, e.g.
    ``("13.1", "fewest LDL+STL: 0 vs 12 with 13.0")``.
    """
    by_release = _aggregate(list(rows_for_one_kernel))
    if not by_release:
        raise ValueError("pick_best needs at least one row")

    def key(release: str) -> tuple:
        agg = by_release[release]
        newest_first = tuple(-p for p in version_key(agg["version"]))
        return (agg["spill"] > 0, bool(agg["warnings"]), agg["local_ops"], agg["registers"], newest_first)

    ranked = sorted(by_release, key=key)
    best = ranked[0]
    if len(ranked) == 1:
        return best, "only version tried"
    runner = ranked[1]
    b, r = by_release[best], by_release[runner]
    if b["spill"] == 0 and r["spill"] > 0:
        return best, f"no spills ({runner} spills {r['spill']} bytes)"
    if not b["warnings"] and r["warnings"]:
        return best, f"no ptxas performance warning ({runner}: {', '.join(sorted(r['warnings']))})"
    if b["local_ops"] != r["local_ops"]:
        return best, f"fewest LDL+STL: {b['local_ops']} vs {r['local_ops']} with {runner}"
    if b["registers"] != r["registers"]:
        return best, f"fewest registers: {b['registers']} vs {r['registers']} with {runner}"
    return best, f"ties with {runner} on spilling, LDL+STL and registers ({b['registers']}); newest"


# --------------------------------------------------------------------------- inputs


def _manifest_kernels(manifest_path: Path) -> tuple[Path, dict[str, dict]]:
    if not manifest_path.is_file():
        raise ReportError(f"no manifest at {manifest_path} (build first, or pass .ptx/.cubin paths)")
    try:
        manifest = json.loads(manifest_path.read_text())
        kernels = manifest["kernels"]
    except (json.JSONDecodeError, KeyError, TypeError) as exc:
        raise ReportError(f"{manifest_path} is not a fa4_aot manifest: {exc}") from exc
    return manifest_path.parent, kernels


def shipped_rows(manifest_path: Path) -> list[dict]:
    """One row per manifest kernel, from the resources recorded at build time."""
    base, kernels = _manifest_kernels(manifest_path)
    rows = []
    for name, record in kernels.items():
        res = {"arch": record.get("arch"), **record.get("resources", {})}
        rows.append(_row(name, record.get("entry"), "shipped", base / record.get("cubin", ""),
                         record.get("ptxas_version"), res, record.get("ptxas_diagnostics", ())))  # fmt: skip
    return rows


def reassembled_manifest_rows(manifest_path: Path, versions: Sequence[str], **kwargs) -> list[dict]:
    """Re-assemble each manifest kernel's kept PTX; rows are relabelled with kernel names."""
    base, kernels = _manifest_kernels(manifest_path)
    wanted: dict[tuple[Path, str], str] = {}
    for name, record in kernels.items():
        if not record.get("ptx"):
            raise ReportError(f"kernel {name} has no kept PTX in {manifest_path}")
        ptx = base / record["ptx"]
        if not ptx.is_file():
            raise ReportError(f"kernel {name}: PTX {ptx} does not exist")
        wanted[(ptx, record.get("entry"))] = name
    rows = assemble_matrix((ptx for ptx, _ in wanted), versions, **kwargs)
    out = []
    for row in rows:
        ptx = Path(row["path"])
        name = wanted.get((ptx, row["entry"])) or wanted.get((ptx, None))
        if name is not None:
            out.append({**row, "kernel": name})
    return out


def cubin_rows(paths: Sequence[Path]) -> list[dict]:
    """Rows for cubins inspected as they are; each must carry a ptxas tkinfo note."""
    tools = get_inspect_tools()
    rows = []
    for path in paths:
        info = inspect_cubin(tools, path)
        if info["ptxas_version"] is None:
            raise ReportError(
                f"{path} has no .note.nv.tkinfo, so which ptxas built it is unknown (ELF header: "
                f"toolkit {info['elf_toolkit']}; ptxas 12.x and the CuTe DSL's embedded ptxas write "
                "no note); pass its .ptx instead"
            )
        rows.extend(_entry_rows(info, _file_label(path), "cubin", path))
    return rows


# --------------------------------------------------------------------------- output


def _fmt(value: Any) -> str:
    return "-" if value is None else str(value)


def _truncate(text: str, width: int = 64) -> str:
    return text if len(text) <= width else text[: width - 23] + "..." + text[-20:]


def _flat_table(rows: list[dict]) -> tuple[list[str], list[list[str]], list[bool]]:
    headers = ["!", "kernel", "arch", "regs", "stack", "spill st", "spill ld", "LDL", "STL", "smem", "ptxas",
               "warn"]
    body, marks = [], []
    for r in rows:
        bad = spills(r)
        body.append(
            ["!" if bad else "", _truncate(r["kernel"]), _fmt(r["arch"]), _fmt(r["registers"]),
             _fmt(r["stack_frame"]), _fmt(r["spill_store_bytes"]), _fmt(r["spill_load_bytes"]),
             _fmt(r["ldl"]), _fmt(r["stl"]), _fmt(r["shared_bytes"]), _fmt(r["ptxas_version"]),
             ",".join(r.get("ptxas_warnings") or ["-"])]
        )  # fmt: skip
        marks.append(bad)
    return headers, body, marks


def _cell(row: dict) -> str:
    spill = _n(row["spill_store_bytes"]) + _n(row["spill_load_bytes"])
    local_ops = _n(row["ldl"]) + _n(row["stl"])
    return (f"{_fmt(row['registers'])}/{spill}/{local_ops}" + (" !" if spills(row) else "")
            + (" w" if row.get("ptxas_warnings") else ""))


MATRIX_LEGEND = ("cell = registers / spill bytes (stores+loads) / LDL+STL count; ! = spills; "
                 "w = a ptxas performance warning (the table and --format json name the code, "
                 "e.g. C7512: wgmma serialised)")


def _versions(rows: list[dict]) -> list[str]:
    """The full ptxas versions present, oldest first."""
    return sorted({r["ptxas_version"] for r in rows}, key=lambda v: version_key(v) if v else ())


def _by_kernel(rows: list[dict], field: str) -> dict[str, dict[str, dict]]:
    """{kernel: {row[field]: row}}, kernels in first-seen order."""
    grouped: dict[str, dict[str, dict]] = {}
    for r in rows:
        grouped.setdefault(r["kernel"], {})[r[field]] = r
    return grouped


def _matrix_table(rows: list[dict]) -> tuple[list[str], list[list[str]], list[bool]]:
    versions = _versions(rows)
    by_kernel = _by_kernel(rows, "ptxas_version")
    headers = ["!", "kernel", "arch", *versions, "best"]
    body, marks = [], []
    for kernel, cells in by_kernel.items():
        bad = any(spills(r) for r in cells.values())
        best = pick_best(list(cells.values()))[0] if len(cells) > 1 else ""
        arch = next(iter(cells.values()))["arch"]
        body.append(["!" if bad else "", _truncate(kernel), _fmt(arch),
                     *(_cell(cells[v]) if v in cells else "" for v in versions), best])  # fmt: skip
        marks.append(bad)
    return headers, body, marks


def _render(headers: list[str], body: list[list[str]], marks: list[bool], fmt: str, colour: bool) -> str:
    if fmt == "md":
        lines = ["| " + " | ".join(headers) + " |", "|" + "|".join("---" for _ in headers) + "|"]
        lines += ["| " + " | ".join(row) + " |" for row in body]
        return "\n".join(lines)
    widths = [max(len(h), *(len(row[i]) for row in body)) for i, h in enumerate(headers)]
    numeric = [i for i, h in enumerate(headers) if h not in ("!", "kernel", "arch", "best")]

    def line(cells: list[str]) -> str:
        parts = [c.rjust(w) if i in numeric else c.ljust(w) for i, (c, w) in enumerate(zip(cells, widths, strict=True))]
        return "  ".join(parts).rstrip()

    lines = [line(headers), line(["-" * w for w in widths])]
    for row, bad in zip(body, marks, strict=True):
        text = line(row)
        lines.append(f"\033[1;31m{text}\033[0m" if colour and bad else text)
    return "\n".join(lines)


def render(rows: list[dict], fmt: str, matrix: bool, colour: bool = False) -> str:
    """Format rows as ``table``/``md`` (flat or kernel × version matrix), ``json`` or ``csv``."""
    if fmt == "json":
        return json.dumps(rows, indent=2)
    if fmt == "csv":
        buf = io.StringIO()
        writer = csv.DictWriter(buf, fieldnames=list(rows[0]) if rows else ["kernel"], lineterminator="\n")
        writer.writeheader()
        writer.writerows({k: ";".join(v) if isinstance(v, list) else v for k, v in r.items()}
                         for r in rows)
        return buf.getvalue().rstrip("\n")
    if not rows:
        return "(no kernels)"
    table = _matrix_table(rows) if matrix else _flat_table(rows)
    text = _render(*table, fmt, colour)
    return f"{text}\n\n{MATRIX_LEGEND}" if matrix else text


def changed_rows(rows: list[dict], release_a: str, release_b: str) -> list[dict]:
    """Rows of the kernels whose figures differ between two ptxas releases."""
    keep = set()
    for kernel, cells in _by_kernel(rows, "ptxas_release").items():
        a, b = cells.get(release_a), cells.get(release_b)
        if a is None or b is None or any(a[k] != b[k] for k in RESOURCE_FIELDS):
            keep.add(kernel)
    return [r for r in rows if r["kernel"] in keep]


def write_png(rows: list[dict], path: Path) -> None:
    """Heatmap of spill bytes + LDL/STL per kernel × ptxas version, cells annotated."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as exc:
        raise ReportError("--png needs matplotlib (pip install matplotlib)") from exc
    if not rows:
        raise ReportError("--png: no kernels to plot")
    kernels = list(dict.fromkeys(r["kernel"] for r in rows))
    versions = _versions(rows)
    grid = [[0.0] * len(versions) for _ in kernels]
    fig, ax = plt.subplots(figsize=(2 + 1.6 * len(versions), 1 + 0.45 * len(kernels)))
    for r in rows:
        i, j = kernels.index(r["kernel"]), versions.index(r["ptxas_version"])
        badness = _n(r["spill_store_bytes"]) + _n(r["spill_load_bytes"]) + _n(r["ldl"]) + _n(r["stl"])
        grid[i][j] = float(badness)
        ax.text(j, i, _cell(r), ha="center", va="center", fontsize=8)
    ax.imshow(grid, cmap="Reds", aspect="auto", vmin=0)
    ax.set_xticks(range(len(versions)), versions)
    ax.set_yticks(range(len(kernels)), [_truncate(k, 40) for k in kernels], fontsize=8)
    ax.set_xlabel("ptxas")
    ax.set_title(MATRIX_LEGEND, fontsize=8)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


# --------------------------------------------------------------------------- CLI


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="spill_report",
        description="Registers, spills and LDL/STL of fa4_aot kernels, per ptxas version.",
    )
    p.add_argument("paths", nargs="*", type=Path,
                   help=".ptx files (assembled for their .target) or .cubin files (inspected as they are)")
    p.add_argument("--manifest", type=Path, default=DEFAULT_MANIFEST,
                   help=f"manifest to report on when no paths are given (default {DEFAULT_MANIFEST})")
    p.add_argument("--ptxas", nargs="+", metavar="X.Y", help="re-assemble PTX with these ptxas releases")
    p.add_argument("--diff", nargs=2, metavar=("A", "B"), help="only kernels that change between releases A and B")
    p.add_argument("--format", choices=("table", "md", "json", "csv"), default="table")
    p.add_argument("--png", type=Path, metavar="FILE", help="also write a heatmap (needs matplotlib)")
    p.add_argument("--fail-on-spill", action="store_true", help="exit 1 when any kernel spills")
    p.add_argument("--allow-isa-rewrite", action="store_true",
                   help="allow ptxas 12.8 by lowering the PTX .version header (unsafe)")
    p.add_argument("-j", "--jobs", type=int, default=None, help="parallel assemblies (default: cores)")
    return p  # fmt: skip


def _collect(args: argparse.Namespace) -> tuple[list[dict], list[dict], bool]:
    """(rows to show, extra rows that only count for --fail-on-spill, matrix view?)."""
    if args.ptxas and args.diff:
        raise ReportError("use either --ptxas or --diff")
    versions = list(args.diff or args.ptxas or [])
    for version in versions:  # fail before reading or fetching anything
        check_ptxas_release(version, args.allow_isa_rewrite)
    kwargs = {"allow_isa_rewrite": args.allow_isa_rewrite, "jobs": args.jobs}

    if not args.paths:
        if not versions:
            return shipped_rows(args.manifest), [], False
        rows = reassembled_manifest_rows(args.manifest, versions, **kwargs)
        return rows, shipped_rows(args.manifest), True

    for path in args.paths:
        if not path.is_file():
            raise ReportError(f"{path}: no such file")
        if path.suffix not in (".ptx", ".cubin"):
            raise ReportError(f"{path}: expected a .ptx or .cubin file")
    ptx = [p for p in args.paths if p.suffix == ".ptx"]
    rows = cubin_rows([p for p in args.paths if p.suffix == ".cubin"])
    if ptx:
        rows += assemble_matrix(ptx, versions or [DEFAULT_PTXAS], **kwargs)
    return rows, [], len({r["ptxas_version"] for r in rows}) > 1


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        rows, also_checked, matrix = _collect(args)
        if args.diff:
            rows = changed_rows(rows, *args.diff)
        colour = args.format == "table" and sys.stdout.isatty() and "NO_COLOR" not in os.environ
        if args.diff and not rows and args.format in ("table", "md"):
            print(f"no kernel changes between ptxas {args.diff[0]} and {args.diff[1]}")
        else:
            print(render(rows, args.format, matrix, colour))
        if args.png:
            write_png(rows, args.png)
    except (ReportError, ToolchainError, OSError, ValueError) as exc:
        first, *more = str(exc).strip().splitlines() or [repr(exc)]
        print(f"spill_report: error: {first}", file=sys.stderr)
        for extra in more[:8]:  # a ptxas failure: the first lines of its output
            print(f"  {extra}", file=sys.stderr)
        return 2
    if args.fail_on_spill:
        bad = [r for r in also_checked + rows if spills(r)]
        if bad:
            for r in bad:
                print(
                    f"spill_report: {r['source']} {r['kernel']} (ptxas {r['ptxas_version']}) spills: "
                    f"{_fmt(r['spill_store_bytes'])} B stores, {_fmt(r['spill_load_bytes'])} B loads, "
                    f"{_n(r['ldl'])} LDL, {_n(r['stl'])} STL",
                    file=sys.stderr,
                )
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
