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

from build_tools.inspect_cubin import inspect_cubin, parse_ptx_dynamic_smem, ptx_target, verify_ptxas  # noqa: E402
from build_tools.toolchain import (  # noqa: E402
    DEFAULT_PTXAS,
    NVDISASM_VERSION,
    Toolchain,
    ToolchainError,
    assemble,
    cache_root,
    check_ptxas_release,
    fit_ptx_isa,
    get_inspect_tools,
    get_toolchain,
    version_key,
)

__all__ = ["ReportError", "assemble_matrix", "pick_best", "spills", "warning_codes", "label_rows", "main"]

DEFAULT_MANIFEST = Path("artifacts/manifest.json")
RESOURCE_FIELDS = (
    "registers", "stack_frame", "spill_store_bytes", "spill_load_bytes", "ldl", "stl", "lane_loops",
    "shared_bytes",
)  # fmt: skip
PEAK_FIELDS = ("reg_peak", "reg_peak_by_role")
EXIT_SPILL, EXIT_REFUSED, EXIT_FILE_FAILED = 1, 2, 4
PNG_HINT = ("--png needs matplotlib, which this Python ({python}) cannot import: run "
            "`{python} -m pip install -r requirements-build.txt` (or `pip install matplotlib`)")


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


def _row(kernel: str, entry: str | None, source: str, path: Path, version: str | None, resources: dict,
         diagnostics: Iterable[str] = (), *, note: str | None = None, error: str | None = None) -> dict:
    return {
        "kernel": kernel,
        "entry": entry,
        "arch": resources.get("arch"),
        "source": source,
        "path": str(path),
        "ptxas_version": version,
        "ptxas_release": ".".join(version.split(".")[:2]) if version else None,
        **{k: resources.get(k) for k in RESOURCE_FIELDS},
        "dynamic_smem_bytes": resources.get("dynamic_smem_bytes"),
        **{k: resources.get(k) for k in PEAK_FIELDS},
        # ptxas performance warnings, e.g. C7512 (wgmma serialised), C7508 (setmaxnreg ignored)
        "ptxas_warnings": warning_codes(diagnostics),
        "note": note,
        "error": error,
    }


def _error_row(path: Path, source: str, exc: BaseException, version: str | None = None,
               entry: str | None = None, arch: str | None = None) -> dict:
    first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
    return _row(_file_label(path), entry, source, path, version, {"arch": arch},
                error=f"{type(exc).__name__}: {first}")


def _entry_rows(info: dict, source: str, path: Path, extra: dict | None = None,
                note: str | None = None) -> list[dict]:
    """Rows for the entries of an inspect_cubin() result (labels come later: label_rows)."""
    return [_row(entry, entry, source, path, info["ptxas_version"], {"arch": info["arch"], **res, **(extra or {})},
                 info.get("ptxas_diagnostics", ()), note=note)
            for entry, res in info["entries"].items()]  # fmt: skip


def _file_label(path: Path) -> str:
    """`dir/foo.sm_90a.ptx` → `foo`."""
    name = path.name
    for suffix in (".ptx", ".cubin"):
        name = name.removesuffix(suffix)
    stem, _, arch = name.rpartition(".")
    return stem if stem and arch.startswith("sm_") else name


# --------------------------------------------------------------------------- labels

# where the CuTe DSL's mangled argument list starts in an entry name
_DSL_ARGS_RE = re.compile(
    r"_(?:object_at_|CopyAtom|MmaAtom|TiledMma|TiledCopy|[Tt]ensor|None_|Int\d|Float\d|Bool|Constexpr|"
    r"cute_|ptr|gmem|smem)"
)
_CLASS_RE = re.compile(r"([A-Z][A-Za-z0-9]*[a-z][A-Za-z0-9]*)$")
_CONFIG_PATTERNS = (
    ("arch", re.compile(r"(?<![a-z0-9])sm_?(\d{2,3}[af]?)(?![0-9])", re.I)),
    ("dtype", re.compile(r"(?<![a-z0-9])(bf16|fp16|f16|fp8|e4m3|e5m2)(?![a-z0-9])", re.I)),
    ("head_dim", re.compile(r"(?<![a-z0-9])(?:hd|head_?dim)_?(\d{2,3})(?![0-9])", re.I)),
    ("mask", re.compile(r"(?<![a-z0-9])(causal|noncausal|full|local|window)(?![a-z0-9])", re.I)),
)


def entry_base_name(entry: str) -> str:
    """The readable part of a kernel entry name.

    ``fa4aot_<config>_0`` -> ``<config>``; a CuTe DSL name
    ``kernel_cutlass_<function>_<mangled arguments>_<n>`` -> ``<function>``, or the class a
    method belongs to (``..._flash_fwd_sm90FlashAttentionForwardSm90_object_at_...`` ->
    ``FlashAttentionForwardSm90``); anything else is kept whole.
    """
    if m := re.fullmatch(r"fa4aot_(.+)_\d+", entry):
        return m.group(1)
    name = re.sub(r"^(?:kernel_cutlass_|cutlass_)(?:kernel_)?", "", entry)
    if name == entry:
        return entry
    if "_object_at_" in name and (m := _CLASS_RE.search(name.split("_object_at_")[0])):
        return m.group(1)
    cut = _DSL_ARGS_RE.search(name)
    base = name[: cut.start()] if cut and cut.start() > 0 else re.sub(r"_\d+$", "", name)
    return base.strip("_") or entry


def _config_tokens(text: str, have: str) -> list[str]:
    tokens = []
    for _, pattern in _CONFIG_PATTERNS:
        for m in pattern.finditer(text):
            token = m.group(0).strip("_").lower()
            if token.startswith("head"):
                token = f"hd{m.group(1)}"
            if token.startswith("sm") and not token.startswith("sm_"):
                token = f"sm_{m.group(1)}"
            if token not in tokens and token not in have.lower():
                tokens.append(token)
                break
    return tokens


def _display_path(path: str) -> str:
    """The path relative to the current folder when it lies below it, else as given."""
    try:
        rel = os.path.relpath(path)
    except ValueError:
        return path
    return path if rel.startswith("..") else rel


def _identity(row: dict) -> tuple:
    """What makes a kernel distinct: the manifest name, else the file (resolved) and entry."""
    if row["source"] == "shipped":
        return ("manifest", row["kernel"])
    return ("file", os.path.realpath(row["path"]), row["entry"])


def label_rows(rows: list[dict]) -> list[dict]:
    """Give every distinct kernel a unique, readable ``kernel`` label (in place; returns rows).

    Manifest kernels keep their names.  Files: :func:`entry_base_name` plus the configuration
    the entry name and path give (arch, dtype, head_dim, mask) that the name lacks; kernels
    still alike get the shortest path suffix that tells them apart, then their entry name.
    """
    idents = list(dict.fromkeys(_identity(r) for r in rows))
    first = {}
    for r in rows:
        first.setdefault(_identity(r), r)
    labels: dict[tuple, str] = {}
    for ident in idents:
        r = first[ident]
        if ident[0] == "manifest":
            labels[ident] = ident[1]
            continue
        base = entry_base_name(r["entry"]) if r["entry"] else _file_label(Path(r["path"]))
        context = " ".join(filter(None, [r["arch"] or "", r["entry"] or "", _display_path(r["path"])]))
        labels[ident] = " ".join([base, *_config_tokens(context, base)])
    by_label: dict[str, list[tuple]] = {}
    for ident, label in labels.items():
        by_label.setdefault(label, []).append(ident)
    for label, group in by_label.items():
        if len(group) > 1:
            for ident, suffix in _tell_apart({i: first[i] for i in group}).items():
                labels[ident] = f"{label} [{suffix}]"
    seen: dict[str, int] = {}
    for ident in idents:  # last resort: never two kernels under one label
        label = labels[ident]
        seen[label] = seen.get(label, 0) + 1
        if seen[label] > 1:
            labels[ident] = f"{label} #{seen[label]}"
    for r in rows:
        r["kernel"] = labels[_identity(r)]
    return rows


def _tell_apart(group: dict[tuple, dict]) -> dict[tuple, str]:
    """Shortest tags that tell alike-labelled kernels apart: the file kind (ptx/cubin), else
    the shortest folder suffix (+ kind), else the file's path, + the entry name if needed."""
    kind = {i: "cubin" if r["source"] == "cubin" else "ptx" for i, r in group.items()}
    paths = {i: Path(_display_path(r["path"])) for i, r in group.items()}

    def unique(tags: dict) -> bool:
        return len(set(tags.values())) == len(tags)

    if unique(kind):
        return kind
    mixed = len(set(kind.values())) > 1
    depth = max(len(p.parent.parts) for p in paths.values())
    for d in range(1, depth + 1):
        tags = {i: "/".join(p.parent.parts[-d:]) + (f" {kind[i]}" if mixed else "") for i, p in paths.items()}
        if unique(tags):
            return tags
    tags = {i: str(p) for i, p in paths.items()}
    if unique(tags):
        return tags
    return {i: f"{paths[i]}:{r['entry']}" for i, r in group.items()}


# --------------------------------------------------------------------------- assembling


def _manifest_launches(paths: Iterable[Path]) -> dict[str, dict]:
    """{real path of a kept PTX/cubin: its manifest record} for files that a fa4_aot manifest
    (``manifest.json`` in the file's folder or up to two above) lists: their launch ABI is
    known, so their dynamic shared memory is too."""
    found: dict[str, dict] = {}
    manifests = {q / "manifest.json" for p in paths for q in list(Path(p).resolve().parents)[:3]}
    for manifest in manifests:
        try:
            kernels = json.loads(manifest.read_text())["kernels"]
            for record in kernels.values():
                for key in ("ptx", "cubin"):
                    if record.get(key):
                        found[os.path.realpath(manifest.parent / record[key])] = record
        except (OSError, ValueError, KeyError, TypeError, AttributeError):
            continue
    return found


def _with_manifest_launch(rows: list[dict]) -> list[dict]:
    """Fill dynamic_smem_bytes of rows whose file a manifest lists (see _manifest_launches)."""
    launches = _manifest_launches({Path(r["path"]) for r in rows if not r.get("error")})
    for r in rows:
        record = launches.get(os.path.realpath(r["path"]))
        if record and r["entry"] == record.get("entry") and _manifest_dynamic_smem(record) is not None:
            r["dynamic_smem_bytes"] = _manifest_dynamic_smem(record)
    return rows


def _ptx_facts(text: str) -> dict:
    """dynamic_smem_bytes from a PTX module: 0 without `.extern .shared`, else unknown."""
    return {"dynamic_smem_bytes": None if parse_ptx_dynamic_smem(text) else 0}


def _assemble_one(tc: Toolchain, ptx: Path, workdir: Path) -> list[dict]:
    try:
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
        return _entry_rows(info, "assembled", ptx, _ptx_facts(text))
    except (ToolchainError, OSError, ValueError, UnicodeDecodeError) as exc:
        return [_error_row(ptx, "assembled", exc, tc.ptxas_version)]


def assemble_matrix(
    ptx_paths: Iterable[str | os.PathLike],
    versions: Sequence[str],
    *,
    allow_isa_rewrite: bool = False,
    jobs: int | None = None,
) -> list[dict[str, Any]]:
    """Assemble every PTX file with every ptxas release and inspect the cubins.

    Returns one row per (PTX entry, version), ordered by file, then version as given;
    ``path`` is the PTX path and ``kernel`` a unique label (:func:`label_rows`).  A file that
    fails (unreadable, no .target, ptxas error) gives one row per version with ``error`` set.
    Work runs in ``jobs`` threads (default: one per core).  Raises ToolchainError for unknown
    versions or when a toolchain cannot be fetched.
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
        return label_rows([row for rows in results for row in rows])


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
    wgmma), then fewest LDL+STL, then fewest registers, then the newest version.  Rows with
    an ``error`` do not compete.  Returns ``(release, reason)``, e.g.
    ``("13.1", "fewest LDL+STL: 0 vs 12 with 13.0")``.
    """
    by_release = _aggregate([r for r in rows_for_one_kernel if not r.get("error") and r.get("ptxas_release")])
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
    except UnicodeDecodeError as exc:
        raise ReportError(f"{manifest_path} is not a fa4_aot manifest: not text ({exc.reason})") from exc
    except json.JSONDecodeError as exc:
        raise ReportError(f"{manifest_path} is not a fa4_aot manifest: not JSON ({exc})") from exc
    kernels = manifest.get("kernels") if isinstance(manifest, dict) else None
    if not isinstance(kernels, dict) or not all(isinstance(r, dict) for r in kernels.values()):
        raise ReportError(f"{manifest_path} is not a fa4_aot manifest: it has no \"kernels\" table of "
                          "kernel records (build.py writes one)")
    return manifest_path.parent, kernels


def _timing_fields(record: dict, version: str | None) -> dict:
    """A manifest record's measured timings (build_tools/tune.py): ``us`` of ``version``, every
    timed version's µs and the measured choice; all None without a measurement."""
    m = record.get("measured") or {}
    us = m.get("us") or {}
    return {"us": us.get(version) if version else None, "us_measured": dict(us) or None,
            "us_chosen": m.get("chosen")}


def _manifest_dynamic_smem(record: dict) -> int | None:
    launch = record.get("launch") or {}
    return launch.get("dynamic_smem_bytes", record.get("resources", {}).get("shared_bytes"))


_PEAK_CACHE_VERSION = 1


def peak_cache_dir() -> Path:
    """Where the register peaks read from cubins are kept: ``$FA4_AOT_CACHE/toolchains/reg_peaks``
    (default ``~/.cache/fa4_aot/toolchains/reg_peaks``), one JSON file per cubin sha256."""
    return cache_root() / "reg_peaks"


def _peak_cache_file(digest: str) -> Path:
    return peak_cache_dir() / f"{digest}.nvdisasm-{NVDISASM_VERSION}.v{_PEAK_CACHE_VERSION}.json"


def _cached_peaks(digest: str) -> dict | None:
    cache = _peak_cache_file(digest)
    if cache.is_file():
        try:
            return json.loads(cache.read_text())
        except (OSError, json.JSONDecodeError):
            return None
    return None


def _cubin_peaks(tools: Any, cubin: Path, digest: str | None = None) -> dict:
    """{entry: {"reg_peak", "reg_peak_by_role", "shared_bytes"}} of a cubin, cached by sha256
    in :func:`peak_cache_dir` (the SASS of a big kernel takes ~0.5 s to read)."""
    import hashlib

    digest = digest or hashlib.sha256(cubin.read_bytes()).hexdigest()
    cache = _peak_cache_file(digest)
    cached = _cached_peaks(digest)
    if cached is not None:
        return cached
    info = inspect_cubin(tools, cubin)
    peaks = {entry: {"reg_peak": res["reg_peak"], "reg_peak_by_role": res["reg_peak_by_role"],
                     "shared_bytes": res["shared_bytes"]} for entry, res in info["entries"].items()}  # fmt: skip
    try:
        cache.parent.mkdir(parents=True, exist_ok=True)
        tmp = cache.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps(peaks))
        os.replace(tmp, cache)
    except OSError:
        pass
    return peaks


def shipped_rows(manifest_path: Path, peaks: bool = False, jobs: int | None = None) -> list[dict]:
    """One row per manifest kernel, from the resources recorded at build time and its cubin
    (the PTX and the ptxas log are not needed: an installed wheel has neither).

    The manifest's ``resources.shared_bytes`` is the dynamic shared memory of the launch; the
    static figure and the register peaks come from the cubin's SASS: read when cached
    (:func:`peak_cache_dir`), or with ``peaks=True`` (then cached). A kernel whose cubin is
    missing or unreadable gets an ``error`` row saying so."""
    import hashlib

    base, kernels = _manifest_kernels(manifest_path)
    rows = []
    for name, record in kernels.items():
        recorded = record.get("resources") or {}
        res = {"arch": record.get("arch"), **recorded, "shared_bytes": recorded.get("static_shared_bytes"),
               "dynamic_smem_bytes": _manifest_dynamic_smem(record)}  # fmt: skip
        cubin = base / record.get("cubin", f"{name}.cubin")
        row = _row(name, record.get("entry"), "shipped", cubin, record.get("ptxas_version"), res,
                   record.get("ptxas_diagnostics", ()))  # fmt: skip
        row.update(_timing_fields(record, row["ptxas_version"]))
        try:
            if not record.get("cubin"):
                raise ReportError("the manifest record names no cubin")
            digest = hashlib.sha256(cubin.read_bytes()).hexdigest()
        except (OSError, ReportError) as exc:
            reason = f"cubin missing: {cubin}" if isinstance(exc, FileNotFoundError) else str(exc)
            row["error"] = f"{type(exc).__name__}: {reason}" if not isinstance(exc, FileNotFoundError) else reason
            rows.append(row)
            continue
        if record.get("sha256") and record["sha256"] != digest:
            row["note"] = f"the cubin's sha256 is {digest[:12]}, the manifest records {record['sha256'][:12]}"
        row["_sha256"] = digest
        row.update(_timing_fields(record, row["ptxas_version"]))
        if row["reg_peak"] is None:
            row.update((_cached_peaks(digest) or {}).get(row["entry"], {}))
        rows.append(row)
    if peaks:
        todo = [r for r in rows if r["reg_peak"] is None and not r.get("error")]
        if todo:
            tools = get_inspect_tools()
            with ThreadPoolExecutor(max_workers=jobs or os.cpu_count() or 1) as pool:
                found = list(pool.map(lambda r: _peaks_or_error(tools, r), todo))
            for r, figures in zip(todo, found, strict=True):
                r.update(figures)
    for r in rows:
        r.pop("_sha256", None)
    return rows


def _peaks_or_error(tools: Any, row: dict) -> dict:
    try:
        return _cubin_peaks(tools, Path(row["path"]), row.get("_sha256")).get(row["entry"], {})
    except (ToolchainError, OSError) as exc:  # an unreadable cubin fails its row, with the tool's reason
        return {"error": f"{type(exc).__name__}: {exc}".splitlines()[0]}


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
            dyn = _manifest_dynamic_smem(kernels[name])
            out.append({**row, "kernel": name,
                        "dynamic_smem_bytes": dyn if dyn is not None else row["dynamic_smem_bytes"],
                        **_timing_fields(kernels[name], row["ptxas_version"])})
    return out


def cubin_rows(paths: Sequence[Path]) -> list[dict]:
    """Rows for cubins inspected as they are (no ptxas -v log: spill bytes unknown).

    A cubin without a tkinfo note gets a row with ptxas unknown and a note; one that cannot
    be inspected at all gets a row with its error."""
    rows = []
    tools = get_inspect_tools() if paths else None
    for path in paths:
        try:
            info = inspect_cubin(tools, path)
        except (ToolchainError, OSError, ValueError) as exc:
            rows.append(_error_row(path, "cubin", exc))
            continue
        note = None
        if info["ptxas_version"] is None:
            note = (f"no .note.nv.tkinfo: ptxas unknown (ELF header: toolkit {info['elf_toolkit']}); "
                    "pass its .ptx to assemble it with a known ptxas")
        if any(res.get("reg_peak") is None for res in info["entries"].values()):
            why = info.get("reg_peak_error") or "no register life ranges in nvdisasm's output"
            note = "; ".join(filter(None, [note, f"register peak unknown: {why}"]))
        if not info["entries"]:
            rows.append(_error_row(path, "cubin", ValueError("no kernel entries found"), arch=info["arch"]))
            continue
        rows.extend(_entry_rows(info, "cubin", path, {"dynamic_smem_bytes": None}, note))
    return rows


# --------------------------------------------------------------------------- output


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
