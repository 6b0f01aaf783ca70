"""The spill report's inputs (moved out of spill_report.py): the rows of what it reports on.

A manifest's shipped kernels (``shipped_rows``: the recorded resources plus the register peaks
read from each cubin's SASS, kept in ``peak_cache_dir``), a manifest's kept PTX re-assembled
with other ptxas releases (``reassembled_manifest_rows``), PTX files assembled with each release
(``assemble_matrix``) and cubins inspected as they are (``cubin_rows``); a file or cubin that
is missing or that ptxas / cuobjdump / nvdisasm cannot handle becomes a row with its error, and a
manifest that is missing or not one raises ``ReportError``. spill_report.py re-exports every
name here.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import time
from collections.abc import Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor, as_completed
from pathlib import Path
from typing import Any

from build_tools.inspect_cubin import inspect_cubin, parse_ptx_dynamic_smem, ptx_target, verify_ptxas
from build_tools.report_rows import ReportError, _entry_rows, _error_row, _file_label, _row, label_rows
from build_tools.toolchain import (
    NVDISASM_VERSION,
    Toolchain,
    ToolchainError,
    assemble,
    cache_root,
    check_ptxas_release,
    fit_ptx_isa,
    get_inspect_tools,
    get_toolchain,
)


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
            _read_peaks(get_inspect_tools(), todo, jobs)
    for r in rows:
        r.pop("_sha256", None)
    return rows


def _read_peaks(tools: Any, todo: list[dict], jobs: int | None) -> None:
    """Read the SASS peaks of ``todo`` (rows, updated in place) in parallel, saying how far it
    got on stderr (a whole manifest takes minutes): on a terminal one line rewritten per
    cubin, else a line per tenth."""
    from build_tools.progress import eta_seconds, format_duration
    tty, t0, shown = sys.stderr.isatty(), time.time(), 0
    with ThreadPoolExecutor(max_workers=jobs or os.cpu_count() or 1) as pool:
        futures = {pool.submit(_peaks_or_error, tools, r): r for r in todo}
        for done, fut in enumerate(as_completed(futures), 1):
            futures[fut].update(fut.result())
            if not tty and done * 10 // len(todo) == shown * 10 // len(todo) and done < len(todo):
                continue
            shown, elapsed = done, time.time() - t0
            eta = eta_seconds(done, len(todo), elapsed)
            line = (f"spill_report --peaks: {done}/{len(todo)} cubins read from the SASS "
                    f"({format_duration(elapsed)}"
                    + (f", ETA {format_duration(eta)})" if done < len(todo) else ")"))
            end = "\n" if not tty or done == len(todo) else ""
            print(("\r" if tty else "") + line, end=end, file=sys.stderr, flush=True)


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
