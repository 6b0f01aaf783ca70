"""Build the shipped artifact set: CuTe DSL -> PTX -> ptxas (chosen version) -> cubin -> manifest.

    python build_tools/build.py [--ptxas 13.1|best|tuned] [--best-candidates 13.0,13.1] [--only REGEX]
                                [--jobs N] [--force] [--allow-isa-rewrite] [--out artifacts]
                                [--check-reproducible] [--report]

Every configuration of ``fa4_aot.configs.CONFIG_SPACE`` is compiled in its own process (the DSL
names entries with a per-process counter), in parallel over the cores. A configuration is
rebuilt only when its fingerprint changes: kernel sources, nvidia-cutlass-dsl version, ptxas
version (with ``--ptxas best``: the full versions of every candidate), configuration.
``--check-reproducible`` rebuilds everything into a temporary folder and compares each cubin's
sha256 with the committed manifest (exit 1 on a difference). Both print one progress line per
configuration with an ETA and end with a one-line verdict (``build_verdict``:
"169 kernels: 0 spill, 0 ptxas warnings, manifest artifacts/manifest.json";
``reproducibility_verdict``); ``--report`` runs the spill report before the verdict.

The manifest is rewritten (atomically: temp file + rename) after every finished kernel, so an
interrupted build keeps what it finished. Ctrl-C (SIGINT) or SIGTERM ends the compile workers at
once and the build with one line ("fa4_aot build: interrupted (SIGINT); 32 of 253 kernels kept
in artifacts/manifest.json, run again to build the rest") and exit status 128 + the signal
(130 for Ctrl-C, 143 for SIGTERM); the next run builds only the missing kernels. A compile
worker that dies (killed, out of memory) fails its configuration alone, named, like a compile
error; the build goes on and exits 1.

``--ptxas best`` assembles each configuration's PTX with every candidate ptxas (default: all of
``toolchain.SUPPORTED_PTXAS``, i.e. 12.9 and 13.0 ... 13.5; restrict with ``--best-candidates``
or ``$FA4_AOT_BEST_CANDIDATES``) and ships, per kernel, the cubin of the candidate that ranks
first by (``spill_report.pick_best``):

  1. no spill bytes (ptxas -v spill stores + loads == 0) before any spill bytes;
  2. then no ptxas performance warning ("Potential Performance Loss", C7512 & co.) before any;
  3. then the fewest LDL + STL instructions in the SASS (role spills under setmaxnreg);
  4. then the fewest registers;
  5. then the newest ptxas.

The kernel's manifest record then carries ``ptxas_choice = {"mode": "best", "chosen": release,
"candidates": {release: {ptxas_version, registers, spill_store_bytes, spill_load_bytes, ldl,
stl} | {ptxas_version, error}}, "reason": ...}`` and the build record says ``"ptxas_release":
"best"`` with the releases tried in ``ptxas_candidates``. A candidate that fails to assemble is
recorded with its error and skipped; the kernel fails only when every candidate fails. ptxas
12.8 (PTX ISA rewrite) is never a candidate.

``--ptxas tuned`` assembles each kernel with the ptxas that ``build_tools/tune.py`` measured
fastest for it (its record's ``measured.chosen``, read from the manifest being rebuilt; 13.1
where there is none) and records ``ptxas_choice = {"mode": "tuned", "chosen": release,
"reason": ...}`` and the ``measured`` block; its fingerprint names that one ptxas, so a kernel
already built with it is kept, and ``--check-reproducible`` rebuilds each kernel with the ptxas
its committed record names. A rebuilt kernel whose PTX did not change keeps its ``measured``.
"""

from __future__ import annotations

import argparse
import concurrent.futures as cf
import hashlib
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from build_tools import toolchain as tcm  # noqa: E402
from build_tools.inspect_cubin import (  # noqa: E402
    inspect_cubin, parse_ptx_entries, register_budget_problem, verify_ptxas)
from build_tools.progress import (  # noqa: E402,F401  (re-exported: tests, tune.py)
    SECONDS_PER_CONFIG_CORE, BuildEta, _display_path, _progress, build_verdict, estimate_seconds,
    eta_seconds, format_duration, progress_line, reproducibility_verdict)
from build_tools.spill_report import pick_best, warning_codes  # noqa: E402
from build_tools.workers import (  # noqa: E402,F401  (re-exported: tune.py, tests)
    _WORKER_BOOT, KILL_WORKER_ENV, BuildInterrupted, _Interrupted, _signals_interrupt, _worker_main,
    _worker_target, _WorkerPool)
from fa4_aot import abi  # noqa: E402
from fa4_aot.configs import CONFIG_SPACE, KernelConfig  # noqa: E402

SCHEMA_VERSION = 1
BEST = "best"  # --ptxas best: per kernel, the best of several ptxas releases
TUNED = "tuned"  # --ptxas tuned: per kernel, the ptxas measured fastest (build_tools/tune.py)
BEST_CANDIDATES_ENV = "FA4_AOT_BEST_CANDIDATES"
CANDIDATE_FIELDS = ("registers", "spill_store_bytes", "spill_load_bytes", "ldl", "stl")
CUTLASS_DSL_PIN = "4.8.1"
# Everything a kernel's binary depends on, besides the toolchain versions.
SOURCE_FILES = sorted(
    [*ROOT.glob("fa4_aot/kernels/**/*.py"), ROOT / "fa4_aot/schedule.py",
     ROOT / "fa4_aot/configs.py", ROOT / "fa4_aot/abi.py", ROOT / "build_tools/dsl_compile.py"])


def source_fingerprint() -> str:
    h = hashlib.sha256()
    for f in SOURCE_FILES:
        h.update(f.relative_to(ROOT).as_posix().encode() + b"\0" + f.read_bytes() + b"\0")
    return h.hexdigest()


def kernel_fingerprint(cfg: KernelConfig, src_fp: str, dsl_version: str, ptxas_version: str,
                       isa_rewrite: bool) -> str:
    blob = json.dumps([cfg.to_dict(), src_fp, dsl_version, ptxas_version, isa_rewrite],
                      sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()


def _compile_worker(cfg_dict: dict, ptx_path: str) -> dict:
    # Fresh process per configuration (max_tasks_per_child=1).
    from build_tools.dsl_compile import compile_to_ptx
    return compile_to_ptx(cfg_dict, ptx_path)


def _installed_dsl_version() -> str:
    from importlib.metadata import PackageNotFoundError, version
    try:
        return version("nvidia-cutlass-dsl")
    except PackageNotFoundError:
        raise SystemExit("error: nvidia-cutlass-dsl is not installed; run `make build` "
                         "(it creates the build virtualenv) or "
                         f"`pip install nvidia-cutlass-dsl=={CUTLASS_DSL_PIN}`")


def _assemble_checked(cfg: KernelConfig, tc: tcm.Toolchain, ptx_path: Path, ptx_text: str,
                      cubin: Path, log_path: Path, isa_rewrite: bool, entry: str) -> dict:
    """ptxas one PTX into ``cubin`` (its -v log to ``log_path``), inspect it, check the entry
    and that ``tc``'s ptxas built it. Returns the inspect_cubin() result."""
    asm_input = ptx_path
    if isa_rewrite:
        fitted = tcm.fit_ptx_isa(ptx_text, tc.ptxas_release)
        if fitted != ptx_text:
            asm_input = cubin.parent / f"{cfg.name}.isa-rewritten.ptx"
            asm_input.write_text(fitted)
    log = tcm.assemble(tc, asm_input, cubin, arch=cfg.arch)
    if asm_input != ptx_path:
        asm_input.unlink()
    log_path.write_text(log)
    info = inspect_cubin(tc, cubin, log)
    if entry not in info["entries"]:
        raise RuntimeError(f"{cfg.name}: entry {entry} missing from the cubin")
    verify_ptxas(info, tc)
    return info


def _record(cfg: KernelConfig, tc: tcm.Toolchain, info: dict, compiled: dict,
            ptx_text: str) -> dict:
    """The manifest record of one kernel whose cubin/log are at out/<arch>/<name>.*"""
    entry = compiled["entry"]
    launch = abi.launch_record(cfg, compiled["dynamic_smem_bytes"])
    problems = abi.check_against_ptx(launch["params"], parse_ptx_entries(ptx_text)[entry])
    if problems:
        raise RuntimeError(f"{cfg.name}: launch ABI does not match the PTX entry:\n  "
                           + "\n  ".join(problems))
    res = info["entries"][entry]
    budget = register_budget_problem(ptx_text, res["registers"], launch["block"][0])
    if budget:
        raise RuntimeError(f"{cfg.name}: {budget}")
    return {
        "config": cfg.to_dict(),
        "arch": cfg.arch,
        "entry": entry,
        "ptx": f"{cfg.arch}/{cfg.name}.ptx",
        "cubin": f"{cfg.arch}/{cfg.name}.cubin",
        "ptxas_log": f"{cfg.arch}/{cfg.name}.ptxas.log",
        "sha256": info["sha256"],
        "ptxas_version": info["ptxas_version"] or tc.ptxas_version,
        "ptxas_diagnostics": info["ptxas_diagnostics"],
        "resources": {
            "registers": res["registers"],
            "stack_frame": res["stack_frame"],
            "spill_store_bytes": res["spill_store_bytes"],
            "spill_load_bytes": res["spill_load_bytes"],
            "ldl": res["ldl"],
            "stl": res["stl"],
            "lane_loops": res["lane_loops"],
            "shared_bytes": compiled["dynamic_smem_bytes"],
            "threads": launch["block"][0] * launch["block"][1] * launch["block"][2],
        },
        "launch": launch,
    }


def build_one(cfg: KernelConfig, tc: tcm.Toolchain, out: Path, isa_rewrite: bool,
              compiled: dict) -> dict:
    """ptxas + inspection for one configuration whose PTX is already at out/<arch>/<name>.ptx."""
    kdir = out / cfg.arch
    ptx_path = kdir / f"{cfg.name}.ptx"
    ptx_text = ptx_path.read_text()
    info = _assemble_checked(cfg, tc, ptx_path, ptx_text, kdir / f"{cfg.name}.cubin",
                             kdir / f"{cfg.name}.ptxas.log", isa_rewrite, compiled["entry"])
    return _record(cfg, tc, info, compiled, ptx_text)


def ptxas_versions(build_record: dict, kernels: dict) -> dict:
    """The build record as its kernels have it: when their ptxas versions disagree (a partial
    rebuild with another ptxas keeps the others' records), ``ptxas_version`` says "mixed"
    (a one-release build; ``best``/``tuned`` name their mode) and ``ptxas_versions`` how many
    kernels carry each."""
    counts: dict = {}
    for rec in kernels.values():
        v = rec.get("ptxas_version")
        counts[v] = counts.get(v, 0) + 1
    if len(counts) <= 1:
        return build_record
    mixed = {**build_record, "ptxas_versions": {str(v): n for v, n in sorted(
        counts.items(), key=lambda kv: str(kv[0]))}}
    if build_record.get("ptxas_release") not in (BEST, TUNED):
        mixed["ptxas_version"] = "mixed"
    return mixed


def write_manifest(path: Path, manifest: dict) -> None:
    """Write the manifest atomically (temp file + rename): a reader, or a build interrupted
    at any moment, sees the previous complete manifest or the new one."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        tmp.write_text(json.dumps(manifest, indent=1, sort_keys=True) + "\n")
        os.replace(tmp, path)
    finally:
        if tmp.exists():
            tmp.unlink()



# --------------------------------------------------------------------------- --ptxas best


def best_candidates(spec: str | None) -> list[str]:
    """Candidate releases for ``--ptxas best``: ``spec`` ("13.0,13.1") or every supported
    release; validated, de-duplicated, oldest first. 12.8 (ISA rewrite) is refused."""
    releases = [r.strip() for r in (spec or "").split(",") if r.strip()]
    releases = releases or list(tcm.SUPPORTED_PTXAS)
    for r in releases:
        if r in tcm.ISA_REWRITE_PTXAS:
            raise tcm.ToolchainError(
                f"ptxas {r} cannot be a --ptxas best candidate (it needs the PTX ISA rewrite); "
                f"build with it explicitly: --ptxas {r} --allow-isa-rewrite")
        tcm.check_ptxas_release(r)
    return sorted(dict.fromkeys(releases), key=tcm.version_key)


def choose_ptxas(candidates: dict[str, dict]) -> tuple[str, str]:
    """Pick the release to ship from ``{release: {ptxas_version, registers, spill_store_bytes,
    spill_load_bytes, ldl, stl, ptxas_warnings}}`` (entries with an ``error`` are ignored).

    The order is spill_report.pick_best's: no spill bytes first, then no ptxas performance
    warning, then the fewest LDL+STL, then the fewest registers, then the newest ptxas.
    Returns ``(release, reason)``."""
    rows = [{"ptxas_release": rel, **c} for rel, c in candidates.items() if "error" not in c]
    if not rows:
        raise ValueError("no candidate assembled")
    return pick_best(rows)


def build_one_best(cfg: KernelConfig, tcs: dict[str, tcm.Toolchain], out: Path, compiled: dict,
                   pool: cf.Executor) -> dict:
    """Assemble one configuration's PTX with every candidate ptxas (in ``pool``), ship the
    best cubin at out/<arch>/<name>.cubin and return its record with ``ptxas_choice``."""
    kdir = out / cfg.arch
    ptx_path = kdir / f"{cfg.name}.ptx"
    ptx_text = ptx_path.read_text()
    entry = compiled["entry"]
    with tempfile.TemporaryDirectory(prefix=f".{cfg.name}.best-", dir=kdir) as tmp:
        work = Path(tmp)
        futs = {rel: pool.submit(_assemble_checked, cfg, tc, ptx_path, ptx_text,
                                 work / f"{rel}.cubin", work / f"{rel}.ptxas.log", False, entry)
                for rel, tc in tcs.items()}
        infos, candidates = {}, {}
        for rel, fut in futs.items():
            try:
                infos[rel] = fut.result()
            except Exception as e:  # one ptxas failing must not hide what the others did
                first = (str(e).strip().splitlines() or [""])[0]
                candidates[rel] = {"ptxas_version": tcs[rel].ptxas_version,
                                   "error": f"{type(e).__name__}: {first}"}
                continue
            res = infos[rel]["entries"][entry]
            candidates[rel] = {"ptxas_version": tcs[rel].ptxas_version,
                               **{k: res[k] for k in CANDIDATE_FIELDS},
                               "ptxas_warnings": warning_codes(infos[rel]["ptxas_diagnostics"])}
        if not infos:
            raise RuntimeError(f"{cfg.name}: every ptxas candidate failed: " + "; ".join(
                f"{rel}: {c['error']}" for rel, c in candidates.items()))
        chosen, reason = choose_ptxas(candidates)
        failed = [rel for rel, c in candidates.items() if "error" in c]
        if failed:
            reason += f"; failed to assemble: {', '.join(failed)}"
        os.replace(work / f"{chosen}.cubin", kdir / f"{cfg.name}.cubin")
        os.replace(work / f"{chosen}.ptxas.log", kdir / f"{cfg.name}.ptxas.log")
    rec = _record(cfg, tcs[chosen], infos[chosen], compiled, ptx_text)
    rec["ptxas_choice"] = {"mode": BEST, "chosen": chosen, "candidates": candidates,
                           "reason": reason}
    return rec


# --------------------------------------------------------------------------- --ptxas tuned

TUNED_DEFAULT = tcm.DEFAULT_PTXAS  # kernels without a measurement


def tuned_choices(kernels: dict) -> dict[str, tuple[str, str, dict]]:
    """``{kernel: (release, reason, measured)}`` of the manifest records that carry a
    ``measured`` choice (build_tools/tune.py apply)."""
    out = {}
    for name, rec in kernels.items():
        m = rec.get("measured") or {}
        chosen = m.get("chosen_release") or (".".join(str(m["chosen"]).split(".")[:2])
                                             if m.get("chosen") else None)
        if chosen:
            tcm.check_ptxas_release(chosen)
            out[name] = (chosen, f"measured: {m.get('reason', 'fastest')}", m)
    return out



def ptxas_argument_error(value: str | None, allow_isa_rewrite: bool = False) -> str | None:
    """What is wrong with a PTXAS / --ptxas value, for the user (None when it is fine)."""
    valid = (f"valid: {', '.join(tcm.SUPPORTED_PTXAS)} or {BEST} (per kernel, the best of "
             f"those) or {TUNED} (per kernel, the measured fastest: make tune); "
             f"{', '.join(tcm.ISA_REWRITE_PTXAS)} only with ALLOW_ISA_REWRITE=1")
    v = (value or "").strip()
    if not v:
        return f"PTXAS is empty: name a ptxas release, e.g. `make build PTXAS={tcm.DEFAULT_PTXAS}`; " \
            + valid
    if v in tcm.ISA_REWRITE_PTXAS and not allow_isa_rewrite:
        return (f"PTXAS={v}: ptxas {v} accepts PTX ISA up to {tcm.PTX_ISA_BY_PTXAS[v]}, but the "
                f"CuTe DSL emits PTX ISA {tcm.PTX_ISA_BY_PTXAS[tcm.SUPPORTED_PTXAS[0]]}, so the "
                f"oldest usable ptxas is {tcm.SUPPORTED_PTXAS[0]}. To assemble with {v} anyway, "
                f"lowering the PTX .version header (warned, recorded in the manifest): "
                f"`make build PTXAS={v} ALLOW_ISA_REWRITE=1` "
                f"(build.py --ptxas {v} --allow-isa-rewrite)")
    if v not in (BEST, TUNED) and v not in tcm.SUPPORTED_PTXAS and v not in tcm.ISA_REWRITE_PTXAS:
        return f"PTXAS={v!r} is not a ptxas release this build knows; " + valid
    return None


def build(ptxas: str, out: Path, only: str | None, jobs: int, force: bool,
          allow_isa_rewrite: bool, candidates: str | None = None, report: bool = False,
          verdict: bool = True, tuned_from: Path | None = None) -> int:
    """``ptxas`` is a release, ``"best"`` or ``"tuned"``; ``candidates`` ("13.0,13.1")
    restricts ``best``; ``tuned_from``: the manifest whose ``measured.chosen`` picks each
    kernel's ptxas for ``tuned`` (default: out/manifest.json, else artifacts/manifest.json).
    ``report``: run the spill report on the written manifest; ``verdict``: end with the one-line
    verdict (build_verdict), printed last."""
    dsl_version = _installed_dsl_version()
    if dsl_version != CUTLASS_DSL_PIN:
        print(f"warning: nvidia-cutlass-dsl {dsl_version} installed, pinned {CUTLASS_DSL_PIN}",
              file=sys.stderr)
    best, tuned = ptxas == BEST, ptxas == TUNED
    tuned_records: dict = {}
    try:
        if tuned:
            if tuned_from is None:
                tuned_from = out / "manifest.json"
                if not tuned_from.exists():
                    tuned_from = ROOT / "artifacts" / "manifest.json"
            tuned_records = tuned_choices(json.loads(Path(tuned_from).read_text())["kernels"])
            releases = sorted({rel for rel, _, _ in tuned_records.values()} | {TUNED_DEFAULT},
                              key=tcm.version_key)
            with cf.ThreadPoolExecutor(max_workers=len(releases)) as fetch:
                tcs = dict(zip(releases, fetch.map(tcm.get_toolchain, releases)))
            tc = None
        elif best:
            releases = best_candidates(candidates)
            with cf.ThreadPoolExecutor(max_workers=len(releases)) as fetch:
                tcs = dict(zip(releases, fetch.map(tcm.get_toolchain, releases)))
            tc = None
        else:
            tc = tcm.get_toolchain(ptxas, allow_isa_rewrite=allow_isa_rewrite)
    except tcm.ToolchainError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    isa_rewrite = ptxas in tcm.ISA_REWRITE_PTXAS
    # What the fingerprint knows of ptxas: its full version, or every candidate's.
    ptxas_key = ("best:" + ",".join(t.ptxas_version for t in tcs.values())) if best \
        else None if tuned else tc.ptxas_version

    def tuned_release(name: str) -> tuple[str, str, dict | None]:
        return tuned_records.get(name, (TUNED_DEFAULT, f"no measurement: {TUNED_DEFAULT}", None))
    if isa_rewrite:
        print(f"WARNING: ptxas {ptxas} accepts PTX ISA {tcm.PTX_ISA_BY_PTXAS[ptxas]} only; the "
              f"DSL emits {tcm.PTX_ISA_BY_PTXAS['12.9']}. Rewriting the .version header as you "
              "asked (ALLOW_ISA_REWRITE=1 / --allow-isa-rewrite). ptxas still validates every "
              "instruction; the manifest records the rewrite.", file=sys.stderr)

    space = list(CONFIG_SPACE)
    configs = [c for c in space if not only or re.search(only, c.name)]
    if not configs:
        print(f"error: --only {only!r} matches no configuration", file=sys.stderr)
        return 2
    out.mkdir(parents=True, exist_ok=True)
    manifest_path = out / "manifest.json"
    old = json.loads(manifest_path.read_text()) if manifest_path.exists() else {}
    old_kernels = old.get("kernels", {})
    src_fp = source_fingerprint()

    todo, kept = [], {}
    for cfg in configs:
        key = tcs[tuned_release(cfg.name)[0]].ptxas_version if tuned else ptxas_key
        fp = kernel_fingerprint(cfg, src_fp, dsl_version, key, isa_rewrite)
        rec = old_kernels.get(cfg.name)
        if (not force and rec and rec.get("fingerprint") == fp
                and (out / rec["cubin"]).exists() and (out / rec["ptx"]).exists()):
            if tuned:  # the same cubin: say why it is this ptxas
                rel, reason, measured = tuned_release(cfg.name)
                rec = {**rec, "ptxas_choice": {"mode": TUNED, "chosen": rel, "reason": reason}}
                if measured is not None:
                    rec["measured"] = measured
            kept[cfg.name] = rec
        else:
            todo.append((cfg, fp))
    eta = BuildEta([cfg.name for cfg, _ in todo], jobs, old_kernels)
    print(f"fa4_aot build: {len(configs)} configurations, {len(kept)} up to date, "
          f"{len(todo)} to build; ptxas "
          + (f"best of {', '.join(t.ptxas_version for t in tcs.values())}" if best
             else f"tuned (per kernel, measured fastest of {', '.join(tcs)}; unmeasured: "
             f"{TUNED_DEFAULT})" if tuned else tc.ptxas_version) + f", nvidia-cutlass-dsl {dsl_version}"
          + (f"; {jobs} job{'s' if jobs != 1 else ''}, first estimate "
             f"~{format_duration(eta.seconds())}" if todo else ""),
          flush=True)

    t0 = time.time()
    results, failures = {}, {}
    for arch in {c.arch for c, _ in todo}:
        (out / arch).mkdir(parents=True, exist_ok=True)
    known = {c.name for c in space}
    if best or tuned:
        first = next(iter(tcs.values()))
        build_record = {
            "cutlass_dsl_version": dsl_version,
            "ptxas_release": ptxas,
            "ptxas_version": ptxas,  # per kernel: kernels[*].ptxas_version / ptxas_choice
            "ptxas_candidates": list(tcs),
            "ptxas_candidate_versions": {rel: t.ptxas_version for rel, t in tcs.items()},
            # every candidate accepts this much (the oldest candidate's maximum)
            "ptx_isa_accepted": tcm.PTX_ISA_BY_PTXAS[first.ptxas_release],
            "ptx_isa_rewritten": False,
            "cuobjdump_version": first.cuobjdump_version,
            "source_fingerprint": src_fp,
            "abi_version": abi.ABI_VERSION,
        }
        if tuned:
            build_record["tuned_default"] = TUNED_DEFAULT
    else:
        build_record = {
            "cutlass_dsl_version": dsl_version,
            "ptxas_release": tc.ptxas_release,
            "ptxas_version": tc.ptxas_version,
            "ptx_isa_accepted": tcm.PTX_ISA_BY_PTXAS[tc.ptxas_release],
            "ptx_isa_rewritten": isa_rewrite,
            "cuobjdump_version": tc.cuobjdump_version,
            "source_fingerprint": src_fp,
            "abi_version": abi.ABI_VERSION,
        }

    def current_manifest() -> dict:
        # Records of kernels still to build keep their old (stale) fingerprint: rebuilt next run.
        kernels = {**{k: v for k, v in old_kernels.items() if k not in results}, **kept,
                   **results}
        kernels = {k: kernels[k] for k in sorted(kernels) if k in known}
        return {"schema_version": SCHEMA_VERSION, "build": ptxas_versions(build_record, kernels),
                "kernels": kernels}

    def finished(cfg, fp, compiled):
        """ptxas + inspection of one compiled configuration; its record goes into the
        manifest on disk at once (an interrupted build keeps every finished kernel)."""
        started = time.time()
        try:
            if best:
                rec = build_one_best(cfg, tcs, out, compiled, asm_pool)
            elif tuned:
                rel, reason, measured = tuned_release(cfg.name)
                rec = build_one(cfg, tcs[rel], out, False, compiled)
                rec["ptxas_choice"] = {"mode": TUNED, "chosen": rel, "reason": reason}
                if measured is not None:
                    rec["measured"] = measured
            else:
                rec = build_one(cfg, tc, out, isa_rewrite, compiled)
        except Exception as e:  # a failing configuration must not stop the others
            failed(cfg, f"{type(e).__name__}: {e}")
            return
        rec["fingerprint"] = fp
        rec["build_seconds"] = round(compiled.get("seconds", 0.0) + time.time() - started, 1)
        old_rec = old_kernels.get(cfg.name) or {}
        if "measured" not in rec and old_rec.get("measured") and (
                old_rec.get("sha256") == rec.get("sha256") or old_rec.get("fingerprint") ==
                kernel_fingerprint(cfg, src_fp, dsl_version, old_rec.get("ptxas_version"),
                                   isa_rewrite)):
            # The same cubin (a source change that left this kernel's code alone) or the same
            # PTX: its timings still hold.
            rec["measured"] = old_rec["measured"]
        results[cfg.name] = rec
        write_manifest(manifest_path, current_manifest())
        warn = warning_codes(rec.get("ptxas_diagnostics", ()))
        eta.finished(cfg.name, rec["build_seconds"])
        _progress(len(results) + len(failures), len(todo), cfg.name,
                  "ok" + (f", ptxas warns {','.join(warn)}" if warn else ""), t0, eta.seconds())

    def failed(cfg, why):
        failures[cfg.name] = why
        eta.finished(cfg.name, None)
        _progress(len(results) + len(failures), len(todo), cfg.name, "FAILED", t0, eta.seconds())

    # --ptxas best: the candidate assemblies of a configuration run in these threads.
    asm_pool = cf.ThreadPoolExecutor(max_workers=max(jobs, 1)) if best else None
    workers = _WorkerPool(jobs, _compile_worker)
    with _signals_interrupt():  # a second signal during the cleanup below is ignored
        try:
            if todo:  # the manifest on disk names this build's toolchain from the start
                write_manifest(manifest_path, current_manifest())
            workers.run([(cfg, fp, str(out / cfg.arch / f"{cfg.name}.ptx")) for cfg, fp in todo],
                        finished, failed)
        except _Interrupted as e:
            workers.kill()
            if asm_pool is not None:
                asm_pool.shutdown(wait=False, cancel_futures=True)
            write_manifest(manifest_path, current_manifest())
            raise BuildInterrupted(
                e.signum, f"fa4_aot build: interrupted ({signal.Signals(e.signum).name}); "
                f"{len(kept) + len(results)} of {len(configs)} kernels kept in "
                f"{_display_path(manifest_path)}, run again to build the rest") from None
        finally:
            workers.close()
    if asm_pool is not None:
        asm_pool.shutdown()

    manifest = current_manifest()
    kernels = manifest["kernels"]
    write_manifest(manifest_path, manifest)
    print(f"wrote {manifest_path} ({len(kernels)} kernels) in {time.time() - t0:.0f}s")
    for name, rec in sorted(results.items()):
        if best:
            choice = rec["ptxas_choice"]
            print(f"ptxas best: {name} -> {choice['chosen']} ({choice['reason']})")
    for name, err in sorted(failures.items()):
        print(f"FAILED {name}: {err}", file=sys.stderr)
    rc = 1 if failures else 0
    if report:
        sys.stdout.flush()
        sys.stderr.flush()
        r = subprocess.run([sys.executable, str(ROOT / "build_tools/spill_report.py"),
                            "--manifest", str(manifest_path)], cwd=ROOT)
        if r.returncode:
            print(f"error: the spill report failed (exit {r.returncode})", file=sys.stderr)
            rc = rc or r.returncode
    if verdict:
        sys.stderr.flush()
        print(build_verdict(manifest, manifest_path, failures), flush=True)
    return rc




def check_reproducible(ptxas: str | None, jobs: int, only: str | None,
                       candidates: str | None = None,
                       committed_path: Path = ROOT / "artifacts/manifest.json") -> int:
    """Rebuild into a temp dir and compare sha256s with the committed manifest. ``ptxas``
    None: the committed build's release (and, for ``best``, its candidates)."""
    committed = json.loads(committed_path.read_text())
    cb = committed.get("build", {})
    if ptxas is None:
        ptxas = cb.get("ptxas_release") or tcm.DEFAULT_PTXAS
        if ptxas == BEST and candidates is None:
            candidates = ",".join(cb.get("ptxas_candidates", ())) or None
    expected = [c.name for c in CONFIG_SPACE if not only or re.search(only, c.name)]
    print(f"reproducibility check: rebuilding {len(expected)} configurations from scratch with "
          f"ptxas {ptxas} and comparing each cubin's sha256 with {_display_path(committed_path)}",
          flush=True)
    with tempfile.TemporaryDirectory(prefix="fa4aot_repro_") as tmp:
        try:
            rc = build(ptxas, Path(tmp), only, jobs, True, False, candidates=candidates,
                       verdict=False, tuned_from=committed_path)
        except BuildInterrupted as e:
            raise BuildInterrupted(e.signum, "fa4_aot reproducibility check: interrupted ("
                                   f"{signal.Signals(e.signum).name}); nothing was compared") \
                from None
        fresh_path = Path(tmp) / "manifest.json"
        if not fresh_path.exists():  # the build stopped before writing anything
            return rc or 1
        fresh = json.loads(fresh_path.read_text())
        different, identical = [], 0
        for name, rec in fresh["kernels"].items():
            old = committed["kernels"].get(name)
            if old is None:
                print(f"NOT COMMITTED {name}")
                different.append(name)
            elif old["sha256"] != rec["sha256"]:
                same_ptx = (committed_path.parent / old["ptx"]).read_bytes() == \
                    (Path(tmp) / rec["ptx"]).read_bytes()
                why = ("PTX identical: ptxas output differs" if same_ptx
                       else "PTX differs: the DSL compile is not reproducible or sources changed")
                print(f"MISMATCH {name}: committed {old['sha256'][:12]} rebuilt "
                      f"{rec['sha256'][:12]} ({why})")
                different.append(name)
            else:
                print(f"same {name} {rec['sha256'][:12]}")
                identical += 1
        failed = [n for n in expected if n not in fresh["kernels"]]
        if not only:  # committed kernels the configuration space no longer has
            for name in sorted(set(committed["kernels"]) - set(expected)):
                print(f"NOT IN THE CONFIGURATION SPACE {name} (committed, not rebuilt)")
                different.append(name)
        print(reproducibility_verdict(identical, different, failed, committed_path,
                                      fresh.get("build", {})), flush=True)
        return 1 if (different or failed or rc) else 0


def main(argv=None) -> int:
    """The command line; SIGINT / SIGTERM end it with one line and 128 + the signal."""
    try:
        return _main(argv)
    except BuildInterrupted as e:
        sys.stdout.flush()
        print(e.message, file=sys.stderr, flush=True)
        return e.exit_code
    except KeyboardInterrupt:  # before or after the build loop
        sys.stdout.flush()
        print("fa4_aot build: interrupted (SIGINT)", file=sys.stderr, flush=True)
        return 128 + signal.SIGINT


def _main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--ptxas", default=None,
                    help=f"ptxas release ({', '.join(tcm.SUPPORTED_PTXAS)}; default $PTXAS, else "
                         f"{tcm.DEFAULT_PTXAS}; with --check-reproducible the committed "
                         f"manifest's), or '{BEST}': assemble every kernel with each "
                         "candidate release and ship, per kernel, the one with no spill bytes, "
                         "then no ptxas performance warning, then the fewest LDL+STL, then the "
                         "fewest registers, then the newest ptxas (the manifest records every "
                         f"candidate and the reason), or '{TUNED}': per kernel, the ptxas its "
                         "manifest record's measured.chosen names (build_tools/tune.py; "
                         f"{TUNED_DEFAULT} where none)")
    ap.add_argument("--best-candidates", metavar="X.Y,X.Y",
                    help=f"with --ptxas {BEST}: the releases to try (default "
                         f"${BEST_CANDIDATES_ENV}, else all of "
                         f"{','.join(tcm.SUPPORTED_PTXAS)})")
    ap.add_argument("--out", type=Path, default=ROOT / "artifacts")
    ap.add_argument("--only", help="regex over configuration names")
    ap.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--force", action="store_true", help="rebuild even if up to date")
    ap.add_argument("--allow-isa-rewrite", action="store_true",
                    help="allow ptxas 12.8 by rewriting the PTX .version header (loudly warned)")
    ap.add_argument("--check-reproducible", action="store_true",
                    help="rebuild everything into a temporary folder and compare each cubin's "
                         "sha256 with artifacts/manifest.json (exit 1 on a difference)")
    ap.add_argument("--report", action="store_true",
                    help="run the spill report on the written manifest before the verdict line")
    a = ap.parse_args(argv)
    if a.ptxas is not None or not a.check_reproducible:
        if a.ptxas is None:
            a.ptxas = os.environ.get("PTXAS") or tcm.DEFAULT_PTXAS
        problem = ptxas_argument_error(a.ptxas, a.allow_isa_rewrite)
        if problem:
            print(f"error: {problem}", file=sys.stderr)
            return 2
        a.ptxas = a.ptxas.strip()
    if a.best_candidates is not None and a.ptxas != BEST:
        print(f"error: --best-candidates needs --ptxas {BEST} (got --ptxas {a.ptxas})",
              file=sys.stderr)
        return 2
    candidates = a.best_candidates if a.best_candidates is not None \
        else os.environ.get(BEST_CANDIDATES_ENV)
    if a.check_reproducible:
        return check_reproducible(a.ptxas, a.jobs, a.only, candidates)
    return build(a.ptxas, a.out, a.only, a.jobs, a.force, a.allow_isa_rewrite, candidates,
                 report=a.report)


if __name__ == "__main__":
    code = main()
    if code > 128:  # interrupted: end now, without waiting for threads still running ptxas
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    sys.exit(code)
