"""The build's progress lines, ETA and one-line verdicts (moved out of build.py).

``progress_line`` (one line per finished configuration, with the elapsed time and an ETA:
:class:`BuildEta` for the build, the measured rate for others), ``format_duration``,
``build_verdict`` (the last line of ``make build``), ``reproducibility_verdict`` (the last line
of ``make reproducible``) and ``_display_path`` (a path relative to the repository root).
build.py re-exports every name here.
"""

from __future__ import annotations

import statistics
import time
from pathlib import Path

from build_tools.report_rows import warning_codes

ROOT = Path(__file__).resolve().parent.parent

# A full rebuild of the 253 configurations with 2 jobs on a 2-core machine takes the Makefile's
# FULL_REBUILD_MINUTES, i.e. ~6.2 s of one core per configuration (DSL compile + ptxas +
# inspection; 786 s for all 253 with 2 jobs). What a build assumes before any kernel of it or of
# the manifest it updates has a measured time (BuildEta).
SECONDS_PER_CONFIG_CORE = 6.2


def format_duration(seconds: float) -> str:
    """``7 -> "7s"``, ``185 -> "3m05s"``, ``3725 -> "1h02m"``."""
    s = max(0, int(round(seconds)))
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s // 3600}h{s % 3600 // 60:02d}m"


def eta_seconds(done: int, total: int, elapsed: float) -> float | None:
    """Remaining time at the rate so far (None before the first configuration finishes)."""
    if done <= 0 or total <= 0:
        return None
    return elapsed / done * max(total - done, 0)


def estimate_seconds(n_configs: int, jobs: int) -> float:
    """A first guess for ``n_configs`` configurations over ``jobs`` processes."""
    if n_configs <= 0:
        return 0.0
    return SECONDS_PER_CONFIG_CORE * n_configs / max(1, min(jobs, n_configs))


class BuildEta:
    """The time a build has left: each configuration still to build costs its own measured
    seconds (its manifest record's ``build_seconds``, from an earlier build of it), else the
    mean time of the kernels this run has finished, else that of the manifest's records (a
    resumed build: those its interrupted run finished), else SECONDS_PER_CONFIG_CORE; the sum
    spread over ``min(jobs, left)`` processes. (The rate of the run so far, used before, jumped
    on a resumed build from 12 to 33 minutes.)"""

    def __init__(self, names, jobs: int, records: dict):
        self.jobs = max(1, jobs)
        self.left = {n: (records.get(n) or {}).get("build_seconds") for n in names}
        self.known = [r["build_seconds"] for r in records.values() if r.get("build_seconds")]
        self.measured: list[float] = []

    def finished(self, name: str, seconds: float | None):
        self.left.pop(name, None)
        if seconds:
            self.measured.append(seconds)

    def seconds(self) -> float:
        if not self.left:
            return 0.0
        typical = statistics.fmean(self.measured or self.known or [SECONDS_PER_CONFIG_CORE])
        work = sum(s if s else typical for s in self.left.values())
        return work / min(self.jobs, len(self.left))


def progress_line(done: int, total: int, name: str, status: str, elapsed: float,
                  eta: float | None = None) -> str:
    """``eta``: the seconds left (:class:`BuildEta`); None: from the rate so far."""
    width = 24
    fill = int(width * done / max(total, 1))
    if eta is None:
        eta = eta_seconds(done, total, elapsed)
    when = format_duration(elapsed) + (
        "" if done >= total or eta is None else f", ETA {format_duration(eta)}")
    return f"[{'#' * fill}{'.' * (width - fill)}] {done}/{total} {status:<6} {name}  ({when})"


def _progress(done: int, total: int, name: str, status: str, t0: float,
              eta: float | None = None):
    print(progress_line(done, total, name, status, time.time() - t0, eta), flush=True)


def _display_path(path: Path) -> str:
    try:
        return Path(path).resolve().relative_to(ROOT).as_posix()
    except ValueError:
        return str(path)


def build_verdict(manifest: dict, manifest_path: Path, failures=()) -> str:
    """The build's last line: ``169 kernels: 0 spill, 0 ptxas warnings, manifest
    artifacts/manifest.json``. A kernel spills when ptxas -v reports spill bytes or its SASS
    has LDL/STL; a ptxas warning is a coded diagnostic (C7512 & co.)."""
    kernels = manifest.get("kernels", {})

    def spills(rec):
        res = rec.get("resources", {})
        return any(res.get(k) for k in ("spill_store_bytes", "spill_load_bytes", "ldl", "stl"))

    def named(names):
        names = sorted(names)
        if not names:
            return ""
        return " (" + ", ".join(names[:3]) + (f", +{len(names) - 3} more" if len(names) > 3
                                              else "") + ")"

    spilling = [n for n, r in kernels.items() if spills(r)]
    warned = [n for n, r in kernels.items() if warning_codes(r.get("ptxas_diagnostics", ()))]
    line = (f"{len(kernels)} kernel{'s' if len(kernels) != 1 else ''}: "
            f"{len(spilling)} spill{named(spilling)}, "
            f"{len(warned)} ptxas warning{'s' if len(warned) != 1 else ''}{named(warned)}, "
            f"manifest {_display_path(manifest_path)}")
    b = manifest.get("build", {})
    if b.get("ptx_isa_rewritten"):
        line += (f"; PTX ISA rewritten to {b.get('ptx_isa_accepted')} for ptxas "
                 f"{b.get('ptxas_release')} (ALLOW_ISA_REWRITE)")
    failures = sorted(failures)
    if failures:
        line = (f"FAILED: {len(failures)} configuration{'s' if len(failures) > 1 else ''} did "
                f"not build{named(failures)}; " + line)
    return line


def reproducibility_verdict(identical: int, different, failed, manifest_path: Path,
                            build_record: dict) -> str:
    """The last line of ``make reproducible``."""
    different, failed = sorted(different), sorted(failed)
    total = identical + len(different) + len(failed)
    where = _display_path(manifest_path)
    if not different and not failed and total:
        return (f"reproducible: {identical} of {total} cubins identical to {where} (sha256; "
                f"ptxas {build_record.get('ptxas_version')}, nvidia-cutlass-dsl "
                f"{build_record.get('cutlass_dsl_version')})")
    parts = []
    if different:
        parts.append(f"{len(different)} differ (" + ", ".join(different[:3])
                     + (f", +{len(different) - 3} more" if len(different) > 3 else "") + ")")
    if failed:
        parts.append(f"{len(failed)} did not build (" + ", ".join(failed[:3])
                     + (f", +{len(failed) - 3} more" if len(failed) > 3 else "") + ")")
    if not total:
        parts.append("nothing was checked")
    return f"NOT reproducible: of {total} kernels, " + "; ".join(parts) + f" against {where}"
