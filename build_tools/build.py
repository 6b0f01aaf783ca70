"""Build the shipped artifact set: CuTe DSL -> PTX -> ptxas (chosen version) -> cubin -> manifest.

    python build_tools/build.py [--ptxas 13.1] [--only REGEX] [--jobs N] [--force]
                                [--allow-isa-rewrite] [--out artifacts] [--check-reproducible]

Every configuration of ``fa4_aot.configs.CONFIG_SPACE`` is compiled in its own process (the DSL
names entries with a per-process counter), in parallel over the cores. A configuration is
rebuilt only when its fingerprint changes: kernel sources, nvidia-cutlass-dsl version, ptxas
version, configuration. ``--check-reproducible`` rebuilds everything into a temporary folder
and compares each cubin's sha256 with the committed manifest (exit 1 on a difference).
"""

from __future__ import annotations

import argparse
import concurrent.futures as cf
import dataclasses
import hashlib
import json
import os
import re
import shutil
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from build_tools import toolchain as tcm  # noqa: E402
from build_tools.inspect_cubin import inspect_cubin, parse_ptx_entries, verify_ptxas  # noqa: E402
from fa4_aot import abi  # noqa: E402
from fa4_aot.configs import CONFIG_SPACE, KernelConfig  # noqa: E402

SCHEMA_VERSION = 1
CUTLASS_DSL_PIN = "4.8.1"
# Everything a kernel's binary depends on, besides the toolchain versions.
SOURCE_FILES = sorted(
    [*ROOT.glob("fa4_aot/kernels/*.py"), ROOT / "fa4_aot/schedule.py",
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


def build_one(cfg: KernelConfig, tc: tcm.Toolchain, out: Path, isa_rewrite: bool,
              compiled: dict) -> dict:
    """ptxas + inspection for one configuration whose PTX is already at out/<arch>/<name>.ptx."""
    kdir = out / cfg.arch
    ptx_path = kdir / f"{cfg.name}.ptx"
    ptx_text = ptx_path.read_text()
    asm_input = ptx_path
    if isa_rewrite:
        fitted = tcm.fit_ptx_isa(ptx_text, tc.ptxas_release)
        if fitted != ptx_text:
            asm_input = kdir / f"{cfg.name}.isa-rewritten.ptx"
            asm_input.write_text(fitted)
    cubin = kdir / f"{cfg.name}.cubin"
    log = tcm.assemble(tc, asm_input, cubin, arch=cfg.arch)
    if asm_input != ptx_path:
        asm_input.unlink()
    (kdir / f"{cfg.name}.ptxas.log").write_text(log)
    info = inspect_cubin(tc, cubin, log)
    entry = compiled["entry"]
    if entry not in info["entries"]:
        raise RuntimeError(f"{cfg.name}: entry {entry} missing from the cubin")
    verify_ptxas(info, tc)
    launch = abi.launch_record(cfg, compiled["dynamic_smem_bytes"])
    problems = abi.check_against_ptx(launch["params"], parse_ptx_entries(ptx_text)[entry])
    if problems:
        raise RuntimeError(f"{cfg.name}: launch ABI does not match the PTX entry:\n  "
                           + "\n  ".join(problems))
    res = info["entries"][entry]
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
            "shared_bytes": compiled["dynamic_smem_bytes"],
            "threads": launch["block"][0] * launch["block"][1] * launch["block"][2],
        },
        "launch": launch,
    }


def _progress(done: int, total: int, name: str, status: str, t0: float):
    width = 24
    fill = int(width * done / max(total, 1))
    line = f"[{'#' * fill}{'.' * (width - fill)}] {done}/{total} {status:<6} {name}  ({time.time() - t0:.0f}s)"
    print(line, flush=True)


def build(ptxas: str, out: Path, only: str | None, jobs: int, force: bool,
          allow_isa_rewrite: bool, variants: list[str] = ()) -> int:
    dsl_version = _installed_dsl_version()
    if dsl_version != CUTLASS_DSL_PIN:
        print(f"warning: nvidia-cutlass-dsl {dsl_version} installed, pinned {CUTLASS_DSL_PIN}",
              file=sys.stderr)
    try:
        tc = tcm.get_toolchain(ptxas, allow_isa_rewrite=allow_isa_rewrite)
    except tcm.ToolchainError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    isa_rewrite = ptxas in tcm.ISA_REWRITE_PTXAS
    if isa_rewrite:
        print(f"WARNING: ptxas {ptxas} accepts PTX ISA {tcm.PTX_ISA_BY_PTXAS[ptxas]} only; the "
              f"DSL emits {tcm.PTX_ISA_BY_PTXAS['12.9']}. Rewriting the .version header as you "
              "asked (--allow-isa-rewrite). ptxas still validates every instruction; the "
              "manifest records the rewrite.", file=sys.stderr)

    space = list(CONFIG_SPACE)
    for v in variants:  # experiment builds: the same configurations with a kernel variant
        space += [dataclasses.replace(c, variant=v) for c in CONFIG_SPACE if not c.trace]
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
        fp = kernel_fingerprint(cfg, src_fp, dsl_version, tc.ptxas_version, isa_rewrite)
        rec = old_kernels.get(cfg.name)
        if (not force and rec and rec.get("fingerprint") == fp
                and (out / rec["cubin"]).exists() and (out / rec["ptx"]).exists()):
            kept[cfg.name] = rec
        else:
            todo.append((cfg, fp))
    print(f"fa4_aot build: {len(configs)} configurations, {len(kept)} up to date, "
          f"{len(todo)} to build; ptxas {tc.ptxas_version}, nvidia-cutlass-dsl {dsl_version}",
          flush=True)

    t0 = time.time()
    results, failures = {}, {}
    for arch in {c.arch for c, _ in todo}:
        (out / arch).mkdir(parents=True, exist_ok=True)
    with cf.ProcessPoolExecutor(max_workers=jobs, max_tasks_per_child=1) as pool:
        futs = {pool.submit(_compile_worker, cfg.to_dict(),
                            str(out / cfg.arch / f"{cfg.name}.ptx")): (cfg, fp)
                for cfg, fp in todo}
        done = 0
        for fut in cf.as_completed(futs):
            cfg, fp = futs[fut]
            done += 1
            try:
                rec = build_one(cfg, tc, out, isa_rewrite, fut.result())
                rec["fingerprint"] = fp
                results[cfg.name] = rec
                _progress(done, len(todo), cfg.name, "ok", t0)
            except Exception as e:  # a failing configuration must not stop the others
                failures[cfg.name] = f"{type(e).__name__}: {e}"
                _progress(done, len(todo), cfg.name, "FAILED", t0)

    kernels = {**{k: v for k, v in old_kernels.items() if k not in results}, **kept, **results}
    known = {c.name for c in space}
    kernels = {k: kernels[k] for k in sorted(kernels) if k in known}
    manifest = {
        "schema_version": SCHEMA_VERSION,
        "build": {
            "cutlass_dsl_version": dsl_version,
            "ptxas_release": tc.ptxas_release,
            "ptxas_version": tc.ptxas_version,
            "ptx_isa_accepted": tcm.PTX_ISA_BY_PTXAS[tc.ptxas_release],
            "ptx_isa_rewritten": isa_rewrite,
            "cuobjdump_version": tc.cuobjdump_version,
            "source_fingerprint": src_fp,
            "abi_version": abi.ABI_VERSION,
        },
        "kernels": kernels,
    }
    manifest_path.write_text(json.dumps(manifest, indent=1, sort_keys=True) + "\n")
    print(f"wrote {manifest_path} ({len(kernels)} kernels) in {time.time() - t0:.0f}s")
    for name, err in sorted(failures.items()):
        print(f"FAILED {name}: {err}", file=sys.stderr)
    return 1 if failures else 0


def check_reproducible(ptxas: str, jobs: int, only: str | None) -> int:
    """Rebuild into a temp dir and compare sha256s with the committed manifest."""
    committed = json.loads((ROOT / "artifacts/manifest.json").read_text())
    with tempfile.TemporaryDirectory(prefix="fa4aot_repro_") as tmp:
        rc = build(ptxas, Path(tmp), only, jobs, True, False)
        fresh = json.loads((Path(tmp) / "manifest.json").read_text())
        bad = 0
        for name, rec in fresh["kernels"].items():
            old = committed["kernels"].get(name)
            if old is None:
                print(f"NOT COMMITTED {name}")
                bad += 1
            elif old["sha256"] != rec["sha256"]:
                same_ptx = (ROOT / "artifacts" / old["ptx"]).read_bytes() == \
                    (Path(tmp) / rec["ptx"]).read_bytes()
                why = ("PTX identical: ptxas output differs" if same_ptx
                       else "PTX differs: the DSL compile is not reproducible or sources changed")
                print(f"MISMATCH {name}: committed {old['sha256'][:12]} rebuilt "
                      f"{rec['sha256'][:12]} ({why})")
                bad += 1
            else:
                print(f"same {name} {rec['sha256'][:12]}")
        print(f"reproducibility: {len(fresh['kernels']) - bad} identical, {bad} different")
        return 1 if (bad or rc) else 0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--ptxas", default=os.environ.get("PTXAS") or tcm.DEFAULT_PTXAS,
                    help=f"ptxas release ({', '.join(tcm.SUPPORTED_PTXAS)}; default "
                         f"{tcm.DEFAULT_PTXAS})")
    ap.add_argument("--out", type=Path, default=ROOT / "artifacts")
    ap.add_argument("--only", help="regex over configuration names")
    ap.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--force", action="store_true", help="rebuild even if up to date")
    ap.add_argument("--allow-isa-rewrite", action="store_true",
                    help="allow ptxas 12.8 by rewriting the PTX .version header (loudly warned)")
    ap.add_argument("--check-reproducible", action="store_true")
    ap.add_argument("--variants", default="",
                    help="comma-separated experimental kernel variants to build too (use with "
                         "--out elsewhere; see FlashFwdSm90 for the tokens)")
    a = ap.parse_args(argv)
    if a.check_reproducible:
        return check_reproducible(a.ptxas, a.jobs, a.only)
    variants = [v for v in a.variants.split(",") if v]
    return build(a.ptxas, a.out, a.only, a.jobs, a.force, a.allow_isa_rewrite, variants)


if __name__ == "__main__":
    sys.exit(main())
