"""Register / spill report for fa4_aot kernels and any other PTX or cubin, per ptxas version.

    python build_tools/spill_report.py                      # shipped kernels (artifacts/manifest.json)
    python build_tools/spill_report.py --peaks              # ... reading every register peak from the SASS
    python build_tools/spill_report.py --wide               # every column, whole paths
    python build_tools/spill_report.py --ptxas 12.9 13.0 13.1   # re-assemble the kept PTX with each
    python build_tools/spill_report.py --diff 13.0 13.1     # only kernels that change between two
    python build_tools/spill_report.py --ptxas 13.0 13.1 13.5 --diff 13.0 13.1  # all three, changed only
    python build_tools/spill_report.py a/k.sm_90a.ptx x.cubin   # files instead of the manifest
    python build_tools/spill_report.py --fail-on-spill      # exit 1 when anything spills

A kernel *spills* when ptxas reports spill bytes or its SASS has LDL/STL (under
setmaxnreg the per-role spills only show as LDL/STL).  When the manifest's PTX is
re-assembled, the shipped figures still count for --fail-on-spill.

Rows: one per kernel (file path + entry; a manifest kernel by name) and ptxas version, never
merged: two files named alike in different folders are two rows.  The label (``kernel``) is the
manifest name, else the entry name shortened to the function or class the CuTe DSL mangled into
it (``kernel_cutlass_wg_gemm_kernel_CopyAtom_...`` -> ``wg_gemm_kernel``, FA4's
``..._flash_fwd_sm90FlashAttentionForwardSm90_object_at_...`` -> ``FlashAttentionForwardSm90``)
plus the configuration read from the name and path (arch, dtype, ``hd128``, causal/full), else
the shortest path suffix that tells it apart.  Every format has a ``path`` column.

``peak`` is the highest register the SASS keeps live + 1 (R0..R<peak-1>): under ``setmaxnreg``
``regs`` is only the launch budget.  ``roles`` shows ``peak/budget`` for each setmaxnreg region
(launch budget first), e.g. ``38/168 22/24 224/240``: how close each warp role is to its budget.
``smem`` is static shared memory from the cubin; ``dyn smem`` the dynamic shared memory a launch
requests: from the manifest's launch ABI, 0 when the PTX declares no ``.extern .shared``, ``?``
when it does and the size is only known at launch.  ``?`` = unknown, ``-`` = none.

The default table fits 160 columns: spill bytes and LDL/STL as store/load pairs, the stack and
U-loops columns only when some kernel has one, no path column for a manifest's own cubins
(``<folder>/<arch>/<kernel>.cubin``), long labels and paths cut in the middle (``…``); ``--wide``
shows every column whole.  Notes follow the table, and the last line is the totals:
``253 kernels, 0 spilling, max 240 registers, ptxas 13.1.115``.  ``json`` and ``csv`` carry
every field of every row.

The manifest report needs the manifest and the cubins only (an installed wheel has no PTX or
ptxas logs).  ``peak``, ``roles`` and ``smem`` come from a cubin's SASS: ``--peaks`` reads them
(~0.5 s a kernel) and keeps them in ``$FA4_AOT_CACHE/toolchains/reg_peaks`` (default
``~/.cache/fa4_aot/toolchains/reg_peaks``, one file per cubin sha256); from then on every report
shows them without ``--peaks``.

A file (or a manifest's cubin) that is missing or cannot be read, assembled or inspected gets a
row with its ``error`` (the tool's own message, e.g. cuobjdump's) and the run goes on.  Options
and paths come in any order (``--ptxas 13.0 13.1 k.ptx``: k.ptx is a path).  A closed pipe
(``| head``) ends the output quietly.  Exit status, a sum of:
  0  all fine
  1  some kernel spills (only with --fail-on-spill)
  2  the run was refused (bad arguments, unknown ptxas, no manifest or not one: one-line error,
     no report)
     or --png could not be written (the reason and the fix on stderr)
  4  some input file failed (its row says why; so does a manifest kernel whose cubin is missing)
e.g. 5 = a spill and a failed file.

The ``warn`` column (``w`` in a matrix cell) names ptxas "Potential Performance Loss" codes,
above all C7512: ptxas serialised the wgmma (each waits for the previous one) — a slowdown
with no spill to show for it.

Library use: :func:`assemble_matrix` assembles PTX files with several ptxas versions
and inspects the cubins (one row per entry × version); :func:`pick_best` chooses a
version for one kernel from its rows.  Row fields::

    kernel (label), entry, arch, source ("shipped" | "cubin" | "assembled"), path,
    ptxas_version ("13.1.115"), ptxas_release ("13.1"), registers, stack_frame,
    spill_store_bytes, spill_load_bytes, ldl, stl, shared_bytes, dynamic_smem_bytes,
    reg_peak, reg_peak_by_role ([{"setmaxnreg": N | None, "peak": n, "instructions": n}]),
    ptxas_warnings (["C7512", ...]), note, error        (None = unknown / no error)

Stdlib only (matplotlib is imported for --png alone).
"""

from __future__ import annotations

import argparse
import os
import re
import sys
from collections.abc import Sequence
from pathlib import Path

if __package__ in (None, ""):  # run as `python build_tools/spill_report.py`
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from build_tools.inspect_cubin import inspect_cubin, parse_ptx_dynamic_smem, ptx_target, verify_ptxas  # noqa: E402,F401
from build_tools.report_inputs import (  # noqa: E402,F401  (re-exported)
    _PEAK_CACHE_VERSION,
    _assemble_one,
    _cached_peaks,
    _cubin_peaks,
    _manifest_dynamic_smem,
    _manifest_kernels,
    _manifest_launches,
    _peak_cache_file,
    _peaks_or_error,
    _ptx_facts,
    _timing_fields,
    _with_manifest_launch,
    assemble_matrix,
    cubin_rows,
    peak_cache_dir,
    reassembled_manifest_rows,
    shipped_rows,
)
from build_tools.report_rows import (  # noqa: E402,F401  (re-exported)
    _CLASS_RE,
    _CONFIG_PATTERNS,
    _DSL_ARGS_RE,
    PEAK_FIELDS,
    RESOURCE_FIELDS,
    ReportError,
    _aggregate,
    _config_tokens,
    _display_path,
    _entry_rows,
    _error_row,
    _file_label,
    _identity,
    _n,
    _row,
    _tell_apart,
    entry_base_name,
    label_rows,
    pick_best,
    spills,
    warning_codes,
)
from build_tools.report_table import (  # noqa: E402,F401  (re-exported)
    MATRIX_LEGEND,
    MATRIX_TIMING_LEGEND,
    MAX_ERROR_NOTES,
    PNG_HINT,
    TIMING_NOTE,
    WIDTH,
    _by_kernel,
    _cell,
    _fastest,
    _fit,
    _flat_table,
    _fmt,
    _footnotes,
    _is_manifest_cubin,
    _matrix_table,
    _pair,
    _render,
    _roles,
    _short,
    _short_path,
    _sum_known,
    _us,
    _versions,
    _wrap,
    changed_rows,
    render,
    totals_line,
    write_png,
)
from build_tools.toolchain import DEFAULT_PTXAS, ToolchainError, check_ptxas_release  # noqa: E402

__all__ = ["ReportError", "assemble_matrix", "pick_best", "spills", "warning_codes", "label_rows", "main"]

DEFAULT_MANIFEST = Path("artifacts/manifest.json")
EXIT_SPILL, EXIT_REFUSED, EXIT_FILE_FAILED = 1, 2, 4


# --------------------------------------------------------------------------- CLI


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="spill_report",
        description="Registers (budget and true peak), spills and LDL/STL of any PTX or cubin, per ptxas version.",
        epilog="exit status (a sum): 0 fine; 1 a kernel spills (with --fail-on-spill); 2 the run was refused "
               "(bad arguments/manifest, unknown ptxas) or --png failed; 4 some input file failed (its row "
               "says why)",
    )
    p.add_argument("paths", nargs="*", type=Path,
                   help=".ptx files (assembled for their .target) or .cubin files (inspected as they are)")
    p.add_argument("--manifest", type=Path, default=DEFAULT_MANIFEST,
                   help=f"manifest to report on when no paths are given (default {DEFAULT_MANIFEST})")
    p.add_argument("--ptxas", nargs="+", metavar="X.Y", help="re-assemble PTX with these ptxas releases")
    p.add_argument("--diff", nargs=2, metavar=("A", "B"),
                   help="only kernels that change between releases A and B (A and B are assembled too; "
                        "combines with --ptxas)")
    p.add_argument("--peaks", action="store_true",
                   help="manifest report: read the shipped cubins' SASS for the true register peaks and "
                        "static smem (~0.5 s per kernel the first time; cached in "
                        "$FA4_AOT_CACHE/toolchains/reg_peaks, default ~/.cache/fa4_aot/toolchains/reg_peaks, "
                        "and shown by default from then on); files always get them")
    p.add_argument("--wide", action="store_true",
                   help=f"table: every column (stack, spill stores and loads, LDL, STL, U-loops, path) and whole "
                        f"paths; by default the table fits {WIDTH} columns")
    p.add_argument("--format", choices=("table", "md", "json", "csv"), default="table")
    p.add_argument("--png", type=Path, metavar="FILE", help="also write a heatmap (needs matplotlib)")
    p.add_argument("--fail-on-spill", action="store_true", help="exit 1 when any kernel spills")
    p.add_argument("--allow-isa-rewrite", action="store_true",
                   help="allow ptxas 12.8 by lowering the PTX .version header (unsafe)")
    p.add_argument("-j", "--jobs", type=int, default=None, help="parallel assemblies (default: cores)")
    return p  # fmt: skip


_RELEASE_ARG = re.compile(r"^\d+\.\d+$")


def _parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    """Options and paths in any order: ``--ptxas 13.0 13.1 a.ptx`` and ``--diff 13.0 13.1 a.ptx``
    leave ``a.ptx`` a path (a --ptxas value that is not a release X.Y is one)."""
    parser = _parser()
    args = parser.parse_intermixed_args(argv)
    if args.ptxas:
        releases = [v for v in args.ptxas if _RELEASE_ARG.match(v)]
        taken = [v for v in args.ptxas if not _RELEASE_ARG.match(v)]
        if taken and (taken[0].endswith((".ptx", ".cubin")) or os.path.exists(taken[0])):
            args.ptxas = releases
            args.paths = [*map(Path, taken), *args.paths]
            if not releases:
                parser.error("--ptxas needs at least one release X.Y before the paths")
    return args


def _collect(args: argparse.Namespace) -> tuple[list[dict], list[dict], bool]:
    """(rows to show, extra rows that only count for --fail-on-spill, matrix view?)."""
    versions = list(dict.fromkeys([*(args.ptxas or []), *(args.diff or [])]))
    for version in versions:  # fail before reading or fetching anything
        check_ptxas_release(version, args.allow_isa_rewrite)
    kwargs = {"allow_isa_rewrite": args.allow_isa_rewrite, "jobs": args.jobs}

    if not args.paths:
        if not versions:
            return shipped_rows(args.manifest, peaks=args.peaks, jobs=args.jobs), [], False
        rows = reassembled_manifest_rows(args.manifest, versions, **kwargs)
        return rows, shipped_rows(args.manifest), True

    for path in args.paths:
        if path.suffix not in (".ptx", ".cubin"):
            raise ReportError(f"{path}: expected a .ptx or .cubin file")
    missing = [p for p in args.paths if not p.is_file()]
    if len(missing) == len(args.paths):
        raise ReportError(f"{missing[0]}: no such file")
    ptx = [p for p in args.paths if p.suffix == ".ptx" and p.is_file()]
    rows = [_error_row(p, "file", FileNotFoundError(f"{p}: no such file")) for p in missing]
    rows += cubin_rows([p for p in args.paths if p.suffix == ".cubin" and p.is_file()])
    if ptx:
        rows += assemble_matrix(ptx, versions or [DEFAULT_PTXAS], **kwargs)
    label_rows(_with_manifest_launch(rows))
    return rows, [], len({r["ptxas_version"] for r in rows if not r.get("error")}) > 1


def _print(text: str) -> None:
    """Print to stdout; a reader that stopped early (``| head``) ends the output quietly."""
    try:
        print(text, flush=True)
    except BrokenPipeError:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())  # the exit's flush writes nowhere, no error
        os.close(devnull)


def main(argv: Sequence[str] | None = None) -> int:
    args = _parse_args(argv)
    status = 0
    try:
        rows, also_checked, matrix = _collect(args)
        if args.diff:
            rows = changed_rows(rows, *args.diff)
        colour = args.format == "table" and sys.stdout.isatty() and "NO_COLOR" not in os.environ
        if args.diff and not rows and args.format in ("table", "md"):
            _print(f"no kernel changes between ptxas {args.diff[0]} and {args.diff[1]}")
        else:
            _print(render(rows, args.format, matrix, colour, wide=args.wide))
    except (ReportError, ToolchainError, OSError, ValueError) as exc:
        first, *more = str(exc).strip().splitlines() or [repr(exc)]
        print(f"spill_report: error: {first}", file=sys.stderr)
        for extra in more[:8]:  # a ptxas failure: the first lines of its output
            print(f"  {extra}", file=sys.stderr)
        return EXIT_REFUSED
    failed = [r for r in rows if r.get("error")]
    for r in failed[:MAX_ERROR_NOTES]:
        print(f"spill_report: {r['kernel']} ({_display_path(r['path'])}) failed: {r['error']}", file=sys.stderr)
    if len(failed) > MAX_ERROR_NOTES:
        print(f"spill_report: ... and {len(failed) - MAX_ERROR_NOTES} more failed, {len(failed)} of {len(rows)} "
              "rows in all (--format json has each reason)", file=sys.stderr)
    if failed:
        status |= EXIT_FILE_FAILED
    if args.png:
        try:
            write_png(rows, args.png)
        except (ReportError, OSError, ValueError) as exc:
            print(f"spill_report: --png not written: {exc}", file=sys.stderr)
            status |= EXIT_REFUSED
    if args.fail_on_spill:
        bad = [r for r in also_checked + rows if spills(r)]
        for r in bad:
            print(
                f"spill_report: {r['source']} {r['kernel']} (ptxas {r['ptxas_version']}) spills: "
                f"{_fmt(r['spill_store_bytes'])} B stores, {_fmt(r['spill_load_bytes'])} B loads, "
                f"{_n(r['ldl'])} LDL, {_n(r['stl'])} STL",
                file=sys.stderr,
            )
        if bad:
            status |= EXIT_SPILL
    return status


if __name__ == "__main__":
    sys.exit(main())
