"""The spill report's rows, their labels and the per-kernel ptxas choice (moved out of spill_report.py).

A row is one kernel entry × one ptxas version (``_row``: the fields the spill_report docstring
lists; ``_error_row`` for a file that failed); ``spills`` and ``warning_codes`` read it;
``label_rows`` gives every distinct kernel a unique readable label (``entry_base_name`` plus the
configuration its name and path give); ``pick_best`` chooses a ptxas release for one kernel from
its rows (build.py's ``--ptxas best`` uses it). It imports nothing of the report's other
modules; spill_report.py re-exports every name here.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from build_tools.toolchain import version_key

RESOURCE_FIELDS = (
    "registers", "stack_frame", "spill_store_bytes", "spill_load_bytes", "ldl", "stl", "lane_loops",
    "shared_bytes",
)  # fmt: skip
PEAK_FIELDS = ("reg_peak", "reg_peak_by_role")


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

# --------------------------------------------------------------------------- choosing a ptxas


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
