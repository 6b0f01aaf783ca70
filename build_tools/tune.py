"""Pick ptxas by measured speed: build every sm_90a kernel with each candidate ptxas, time them
all on a GPU in one process, record the timings in the manifest and choose per kernel.

    python build_tools/tune.py prepare --candidates 13.0,13.1,13.5 [--only REGEX] [--out build/tune]
    python build_tools/tune.py measure [--tune-dir build/tune] [--out build/tune/measured.json]
                                       [--repeats 7] [--iters 10] [--only REGEX]
    python build_tools/tune.py apply [--measured build/tune/measured.json]
                                     [--manifest artifacts/manifest.json]
    python build_tools/tune.py table [--manifest artifacts/manifest.json]   # the README's table

``prepare`` (CPU, no GPU, no DSL compile): the PTX does not depend on ptxas, so each candidate
assembles the committed PTX (``artifacts/sm_90a/*.ptx``) exactly as ``build.py`` does
(``_assemble_checked`` + ``_record``) into ``<out>/<ptxas version>/``: a self-contained
artifacts folder (``manifest.json`` + ``sm_90a/<kernel>.cubin``; no PTX, no logs) that
``fa4_aot.manifest.Manifest`` loads. Cached: a kernel whose cubin is there for the same PTX
(sha256) is not assembled again. A candidate whose full ptxas version is the one every selected
shipped kernel was built with is the shipped set itself: no folder (``measure`` times
``artifacts/`` for it). Parallel over the cores; Ctrl-C keeps what finished.

``measure`` (GPU: torch + fa4_aot + cuda-python; no cutlass, no PTX): for every sm_90a kernel of
the shipped manifest and every candidate (the shipped cubins + every ``<tune-dir>/*/``), one
representative call that runs exactly that kernel (``fa4_aot.interface.prepare`` with the
candidate's manifest and the kernel forced; :data:`SHAPES`), only that kernel's launch timed:
CUDA events around ``--iters`` back-to-back launches, candidates interleaved in one process
(build_tools.timing.round_order), the median of
``--repeats``. A combine kernel is timed alone on the partials of a split-KV decode call
(``SHAPES["combine"]``); a decode kernel the planner splits is timed without its combine.
Outputs of the candidates are compared (the same PTX: expected bitwise equal);
a difference is reported and recorded. Writes JSON: the GPU, torch, and per kernel its shape,
``us`` = {ptxas version: median µs}, ``spread`` (the largest (p75 - p25) / median of a
candidate), the candidates' registers and spills.

``apply`` (CPU): per kernel, ``measured`` = {us, shape, gpu, spread, chosen, reason} goes into
the manifest record (nothing else changes). The choice (:func:`choose_measured`): the fastest;
candidates within ``max(1 %, spread)`` of it are ties, won by the fewest spills (spill bytes +
LDL/STL), then the newest ptxas. ``make build PTXAS=tuned`` then ships each kernel's
``measured.chosen``; ``make reproducible`` rebuilds it from the manifest.
"""

from __future__ import annotations

import argparse
import concurrent.futures as cf
import hashlib
import json
import os
import re
import signal
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

ARCH = "sm_90a"
DEFAULT_CANDIDATES = "13.0,13.1,13.5"
TUNE_DIR = ROOT / "build" / "tune"
SHIPPED = ROOT / "artifacts"
NOISE_FLOOR = 0.01  # candidates within 1 % (or the measured spread, if larger) tie
SOFTCAP = 50.0

# Representative calls, per kernel family (head_dim and dtype are the kernel's).
SHAPES = {
    "prefill": {"batch": 2, "seqlen_q": 4096, "seqlen_k": 4096, "heads": 16, "heads_k": 16},
    "decode": {"batch": 16, "seqlen_q": 1, "seqlen_k": 8192, "heads": 32, "heads_k": 8},
    "decode_wide": {"batch": 8, "seqlen_q": 16, "seqlen_k": 8192, "heads": 32, "heads_k": 4},
    # the split-KV merge: a wide decode call split 16 ways; only the combine launch is timed
    "combine": {"batch": 64, "seqlen_q": 16, "seqlen_k": 8192, "heads": 32, "heads_k": 4,
                "num_splits": 16},
}
WINDOW = (512, 0)


def release_of(version: str) -> str:
    """``"13.1.115"`` -> ``"13.1"``."""
    return ".".join(str(version).split(".")[:2])


def _vkey(version: str) -> tuple:
    return tuple(int(p) for p in re.findall(r"\d+", str(version)))


def shape_for(cfg: dict) -> dict:
    """The representative call of a kernel configuration (a manifest record's ``config``):
    JSON-able, everything :func:`_call` needs."""
    if cfg.get("kind") == "combine":
        family = "combine"
    elif cfg.get("decode"):
        family = "decode_wide" if cfg.get("wide") else "decode"
    else:
        family = "prefill"
    s = {"family": family, **SHAPES[family], "head_dim": cfg["head_dim"], "dtype": cfg["dtype"],
         "causal": bool(cfg.get("causal")) or family == "combine",
         "window": list(WINDOW) if cfg.get("local") else None,
         "softcap": SOFTCAP if cfg.get("softcap") else 0.0,
         "scheduler": "steal" if family != "prefill" else cfg["scheduler"],
         "trace": bool(cfg.get("trace"))}
    if cfg.get("local"):
        s["causal"] = False  # a causal window is local with window_right = 0
    return s


def spill_score(res: dict) -> int:
    return sum(int(res.get(k) or 0) for k in ("spill_store_bytes", "spill_load_bytes", "ldl", "stl"))


def choose_measured(us: dict, spread: float = 0.0, resources: dict | None = None,
                    floor: float = NOISE_FLOOR) -> tuple[str, str]:
    """Pick a ptxas version from ``{version: µs}``: the fastest, unless others are within
    ``max(floor, spread)`` of it: then, among those, the fewest spills (``resources[version]``:
    spill bytes + LDL/STL), then the newest. Returns ``(version, reason)``."""
    timed = {v: t for v, t in us.items() if t is not None}
    if not timed:
        raise ValueError("no candidate was timed")
    resources = resources or {}
    fastest = min(timed, key=lambda v: (timed[v], tuple(-p for p in _vkey(v))))
    t0 = timed[fastest]
    noise = max(floor, spread or 0.0)
    ties = [v for v, t in timed.items() if t <= t0 * (1 + noise)]
    if len(timed) == 1:
        return fastest, "only version timed"
    if len(ties) == 1:
        runner = min((v for v in timed if v != fastest), key=lambda v: timed[v])
        return fastest, (f"fastest: {t0:.1f} µs, {timed[runner] / t0 - 1:.1%} ahead of "
                         f"{release_of(runner)} (noise {noise:.1%})")
    best = min(ties, key=lambda v: (spill_score(resources.get(v, {})),
                                    tuple(-p for p in _vkey(v))))
    spills = {spill_score(resources.get(v, {})) for v in ties}
    why = "fewest spills" if len(spills) > 1 else "newest"
    return best, (f"within noise ({noise:.1%}) of the fastest ({release_of(fastest)}, "
                  f"{t0:.1f} µs): {', '.join(release_of(v) for v in sorted(ties, key=_vkey))}"
                  f" tie -> {why}")


# =========================================================================== prepare (CPU)


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _selected(shipped: dict, only: str | None) -> dict:
    return {n: r for n, r in sorted(shipped["kernels"].items())
            if r.get("arch") == ARCH and (not only or re.search(only, n))}


def prepare(candidates: list[str], only: str | None, out: Path, jobs: int,
            artifacts: Path = SHIPPED) -> int:
    from build_tools import build as bld
    from build_tools import toolchain as tcm
    from fa4_aot.configs import KernelConfig

    shipped = json.loads((artifacts / "manifest.json").read_text())
    kernels = _selected(shipped, only)
    if not kernels:
        print(f"error: no {ARCH} kernel matches --only {only!r}", file=sys.stderr)
        return 2
    try:
        tcs = {rel: tcm.get_toolchain(tcm.check_ptxas_release(rel)) for rel in candidates}
    except tcm.ToolchainError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    out.mkdir(parents=True, exist_ok=True)
    folders, todo, cached = {}, [], 0
    for rel, tc in tcs.items():
        if all(r.get("ptxas_version") == tc.ptxas_version for r in kernels.values()):
            print(f"ptxas {tc.ptxas_version}: the shipped cubins ({bld._display_path(artifacts)}); "
                  "measure times them, nothing to assemble")
            continue
        folder = out / tc.ptxas_version
        (folder / ARCH).mkdir(parents=True, exist_ok=True)
        mpath = folder / "manifest.json"
        man = json.loads(mpath.read_text()) if mpath.exists() else {}
        have = man.get("kernels", {})
        build = {**shipped.get("build", {}), "ptxas_release": rel,
                 "ptxas_version": tc.ptxas_version, "ptx_isa_accepted":
                 tcm.PTX_ISA_BY_PTXAS[rel], "cuobjdump_version": tc.cuobjdump_version,
                 "tune_candidate": True}
        folders[tc.ptxas_version] = {"path": mpath, "build": build, "kernels": dict(have),
                                     "dirty": False}
        for name, rec in kernels.items():
            ptx = artifacts / rec["ptx"]
            old = have.get(name)
            cubin = folder / ARCH / f"{name}.cubin"
            if old and cubin.exists() and old.get("ptx_sha256") and (
                    not ptx.exists() or old["ptx_sha256"] == _sha(ptx.read_bytes())) and \
                    old.get("sha256") == _sha(cubin.read_bytes()):
                cached += 1
                continue
            if not ptx.exists():
                print(f"error: {name}: no PTX at {ptx}", file=sys.stderr)
                return 2
            todo.append((tc, name, rec, ptx, cubin))
    print(f"tune prepare: {len(kernels)} {ARCH} kernels x {len(folders)} candidate folder(s) "
          f"({', '.join(folders) or 'none'}): {cached} cached, {len(todo)} to assemble; "
          f"{jobs} job(s)", flush=True)

    def one(task):
        tc, name, rec, ptx, cubin = task
        cfg = KernelConfig.from_dict(rec["config"])
        text = ptx.read_text()
        with tempfile.TemporaryDirectory(prefix=".tune-", dir=cubin.parent) as tmp:
            tmp_cubin = Path(tmp) / cubin.name
            info = bld._assemble_checked(cfg, tc, ptx, text, tmp_cubin, Path(tmp) / "log",
                                         False, rec["entry"])
            new = bld._record(cfg, tc, info, {"entry": rec["entry"], "dynamic_smem_bytes":
                                              rec["launch"]["dynamic_smem_bytes"]}, text)
            os.replace(tmp_cubin, cubin)
        new.pop("ptxas_log", None)
        new["ptx"] = None  # the PTX stays in the shipped folder
        new["ptx_sha256"] = _sha(text.encode())
        return tc.ptxas_version, name, new

    def flush(force=False):
        for f in folders.values():
            if f["dirty"] or force:
                bld.write_manifest(f["path"], {"schema_version": bld.SCHEMA_VERSION,
                                               "build": f["build"], "kernels": f["kernels"]})
                f["dirty"] = False

    t0, last, done, failed = time.time(), 0.0, 0, []
    pool = cf.ThreadPoolExecutor(max_workers=max(1, jobs))
    with bld._signals_interrupt():
        try:
            futs = {pool.submit(one, t): t for t in todo}
            for fut in cf.as_completed(futs):
                tc, name = futs[fut][0], futs[fut][1]
                try:
                    ver, name, rec = fut.result()
                    folders[ver]["kernels"][name] = rec
                    folders[ver]["dirty"] = True
                    status = "ok"
                except Exception as e:  # one kernel failing must not stop the others
                    failed.append((tc.ptxas_version, name, f"{type(e).__name__}: {e}"))
                    status = "FAILED"
                done += 1
                if time.time() - last > 5 or done == len(todo):
                    flush()
                    last = time.time()
                print(bld.progress_line(done, len(todo), f"{name} (ptxas {tc.ptxas_version})",
                                        status, time.time() - t0), flush=True)
        except bld._Interrupted as e:
            pool.shutdown(wait=False, cancel_futures=True)
            flush()
            print(f"tune prepare: interrupted ({signal.Signals(e.signum).name}); {done} of "
                  f"{len(todo)} assembled and kept, run again for the rest", file=sys.stderr,
                  flush=True)
            return 128 + e.signum
    pool.shutdown()
    flush(force=True)
    for ver, f in folders.items():
        size = sum(p.stat().st_size for p in (out / ver).rglob("*") if p.is_file())
        print(f"{bld._display_path(out / ver)}: {len(f['kernels'])} kernels, "
              f"{size / 2**20:.1f} MiB")
    for ver, name, why in failed:
        print(f"FAILED {name} (ptxas {ver}): {why}", file=sys.stderr)
    print(f"tune prepare: done in {time.time() - t0:.0f}s; next, on an sm_90 GPU: "
          f"python build_tools/tune.py measure --tune-dir {bld._display_path(out)}")
    return 1 if failed else 0


# =========================================================================== measure (GPU)


class Overlay:
    """A candidate's kernels over the shipped manifest (a candidate folder may hold only some
    kernels; the combine timing's decode kernel comes from wherever it is): what the planner and
    ``fa4_aot.interface`` need of a ``Manifest``."""

    def __init__(self, top, base):
        self.top, self.base = top, base
        self.kernels = {**base.kernels, **(top.kernels if top is not None else {})}

    def find(self, *args, **kwargs):
        name, _ = self.base.find(*args, **kwargs)
        return name, self.kernels[name]

    def cubin_bytes(self, name):
        src = self.top if self.top is not None and name in self.top.kernels else self.base
        return src.cubin_bytes(name)


def candidate_sets(tune_dir: Path, shipped_root: Path = SHIPPED):
    """[(label, Manifest or None)]: the shipped set first (None: the base itself), then every
    candidate folder under ``tune_dir``, oldest ptxas first."""
    from fa4_aot.manifest import Manifest
    sets = [("shipped", None)]
    for m in sorted(tune_dir.glob("*/manifest.json"), key=lambda p: _vkey(p.parent.name)):
        sets.append((m.parent.name, Manifest(m.parent)))
    return sets


def _inputs(shape: dict, cache: dict):
    import torch
    key = json.dumps({k: v for k, v in shape.items() if k not in ("scheduler", "softcap",
                                                                  "window", "trace")},
                     sort_keys=True)
    if key not in cache:
        cache.clear()  # one shape's tensors at a time
        dt = {"bf16": torch.bfloat16, "fp16": torch.float16}[shape["dtype"]]
        g = torch.Generator(device="cuda").manual_seed(0)
        b, sq, sk, h, hk, d = (shape[k] for k in ("batch", "seqlen_q", "seqlen_k", "heads",
                                                  "heads_k", "head_dim"))
        q = torch.randn(b, sq, h, d, device="cuda", dtype=dt, generator=g)
        k = torch.randn(b, sk, hk, d, device="cuda", dtype=dt, generator=g)
        v = torch.randn(b, sk, hk, d, device="cuda", dtype=dt, generator=g)
        cache[key] = (q, k, v)
    return cache[key]


def _args(shape: dict, q, k, v, record: dict):
    """The fa4_aot call of ``shape`` on q, k, v (fa4_aot.validate.Args; a trace kernel's call
    gets its trace buffer and an ``out``)."""
    import torch

    from fa4_aot.validate import Args
    kw = {}
    if shape["window"]:
        kw["window_size"] = tuple(shape["window"])
    if shape.get("num_splits"):
        kw["num_splits"] = shape["num_splits"]
    if shape["trace"]:
        tiles = -(-shape["seqlen_q"] // record["launch"]["tile"]["m"]) * shape["heads"] * \
            shape["batch"]
        kw["trace"] = torch.zeros((tiles, 4), dtype=torch.int64, device=q.device)
        kw["out"] = torch.empty_like(q)
    return Args(q=q, k=k, v=v, causal=shape["causal"], scheduler=shape["scheduler"],
                softcap=shape["softcap"], **kw)


class _Prepared:
    """One (kernel, candidate): the launcher of exactly that kernel, its addresses, and what
    keeps them alive."""

    def __init__(self, launcher, addrs, keep, out, launch):
        self.launcher, self.addrs, self.keep, self.out = launcher, addrs, keep, out
        self.launch = launch  # grid and split count of the timed launch, for the record

    def __call__(self):
        self.launcher(self.addrs)


def _prepare_launch(name: str, shape: dict, man, q, k, v) -> _Prepared:
    """Prepare the call of ``shape`` against the manifest ``man`` with ``name`` forced (for a
    combine kernel: its decode kernel, the combine being the call's second launch) through
    ``fa4_aot.interface.prepare``, run it once, and return the launcher of ``name`` with that
    call's addresses."""
    import torch

    from fa4_aot import interface
    rec = man.kernels[name]
    cfg = rec["config"]
    forced = name
    if cfg.get("kind") == "combine":
        forced, _ = man.find(ARCH, cfg["dtype"], cfg["head_dim"], True, "steal", decode=True,
                             wide=True)
    a = _args(shape, q, k, v, rec)
    call = interface.prepare(a, manifest=man, kernel=forced)
    with torch.no_grad():
        out, lse, addrs = call.launch(a, want_lse=True)
    names = [kl.name for kl in call.plan.launches]
    if name not in names:
        raise RuntimeError(f"{name}: the call launched {names}")
    i = names.index(name)
    launch = {"grid": list(call.plan.launches[i].grid),
              "num_splits": call.plan.launches[i].values.get("num_splits"), "launches": names}
    # out and lse of this call stay alive with the launcher: their addresses are in it
    return _Prepared(call.launchers[i], addrs, (out, lse, a, call), out, launch)


def measure(tune_dir: Path, out_path: Path, repeats: int, iters: int, only: str | None,
            shipped_root: Path = SHIPPED) -> int:
    import torch

    from build_tools.timing import event_time, round_order
    from fa4_aot import interface
    from fa4_aot.manifest import load_manifest

    if not torch.cuda.is_available() or torch.cuda.get_device_capability() != (9, 0):
        print("error: tune measure needs an sm_90 GPU (H100/H200)", file=sys.stderr)
        return 2
    base = load_manifest(str(shipped_root.resolve()))
    names = [n for n, r in sorted(base.kernels.items())
             if r["arch"] == ARCH and (not only or re.search(only, n))]
    sets = candidate_sets(tune_dir, shipped_root)
    variants = [(label, Overlay(m, base)) for label, m in sets]
    gpu = torch.cuda.get_device_name()
    print(f"tune measure: {len(names)} kernels x {len(variants)} candidate sets "
          f"({', '.join(label for label, _ in variants)}) on {gpu}; {repeats} repeats of {iters} "
          "launches", flush=True)
    result = {"gpu": gpu, "torch": torch.__version__, "repeats": repeats, "iters": iters,
              "shapes": SHAPES, "window": list(WINDOW), "softcap": SOFTCAP, "kernels": {},
              "mismatches": [], "failed": {}}
    cache, t0 = {}, time.time()

    def write():  # atomically, every 20 kernels too: a run cut short keeps what it timed
        out_path.parent.mkdir(parents=True, exist_ok=True)
        tmp = out_path.with_name(out_path.name + ".tmp")
        tmp.write_text(json.dumps(result, indent=1, sort_keys=True) + "\n")
        os.replace(tmp, out_path)

    for i, name in enumerate(names):
        rec = base.kernels[name]
        shape = shape_for(rec["config"])
        try:
            q, k, v = _inputs(shape, cache)
            preps, res = {}, {}
            for _, man in variants:
                krec = man.kernels[name]
                ver = krec["ptxas_version"]
                if ver in preps:  # the same ptxas in two sets: time it once
                    continue
                preps[ver] = _prepare_launch(name, shape, man, q, k, v)
                r = krec["resources"]
                res[ver] = {"registers": r["registers"], **{f: r.get(f, 0) for f in (
                    "spill_store_bytes", "spill_load_bytes", "ldl", "stl")},
                    "sha256": krec["sha256"]}
            torch.cuda.synchronize()
            ref_ver = next(iter(preps))
            ref = preps[ref_ver].out
            diff = {}
            for ver, p in preps.items():
                if ver != ref_ver and not torch.equal(p.out, ref):
                    diff[ver] = float((p.out.float() - ref.float()).abs().max())
            for p in preps.values():
                p(), p()  # warm: clocks, caches, the module's first launch
            times = {ver: [] for ver in preps}
            for r in range(repeats):
                for ver in round_order(list(preps), r):
                    times[ver].append(event_time(preps[ver], iters) * 1000.0)  # µs
            us = {ver: statistics.median(ts) for ver, ts in times.items()}
            spread = 0.0
            for ver, ts in times.items():
                qs = statistics.quantiles(ts, n=4) if len(ts) > 1 else [ts[0]] * 3
                spread = max(spread, (qs[2] - qs[0]) / us[ver])
            entry = {"shape": shape, "launch": preps[ref_ver].launch,
                     "us": {v: round(t, 3) for v, t in us.items()},
                     "spread": round(spread, 4), "resources": res}
            if diff:
                entry["output_differs"] = {"reference": ref_ver, "max_abs": diff}
                result["mismatches"].append(name)
            result["kernels"][name] = entry
            del preps
        except Exception as e:  # noqa: BLE001 - one kernel failing must not lose the others
            result["failed"][name] = f"{type(e).__name__}: {e}"
            print(f"FAILED {name}: {type(e).__name__}: {e}", flush=True)
        finally:
            interface.clear_memo()
        if (i + 1) % 20 == 0 or i + 1 == len(names):
            write()
            print(f"[{i + 1}/{len(names)}] {time.time() - t0:.0f}s  last: {name} "
                  + " ".join(f"{release_of(v)}={t:.1f}us" for v, t in
                             result["kernels"].get(name, {}).get("us", {}).items()), flush=True)
    write()
    print(f"wrote {out_path}: {len(result['kernels'])} kernels timed, "
          f"{len(result['failed'])} failed, {len(result['mismatches'])} with differing outputs "
          f"({time.time() - t0:.0f}s)")
    return 1 if result["failed"] else 0


# =========================================================================== apply (CPU)


def apply(measured_path: Path, manifest_path: Path) -> int:
    from build_tools.build import write_manifest
    data = json.loads(measured_path.read_text())
    man = json.loads(manifest_path.read_text())
    kernels = man["kernels"]
    applied, skipped, changed = 0, [], []
    for name, m in sorted(data["kernels"].items()):
        rec = kernels.get(name)
        if rec is None:
            skipped.append(name)
            continue
        us = {v: t for v, t in m["us"].items()}
        chosen, reason = choose_measured(us, m.get("spread", 0.0), m.get("resources"))
        measured = {"us": us, "shape": m["shape"], "gpu": data.get("gpu"),
                    "spread": m.get("spread", 0.0), "chosen": chosen,
                    "chosen_release": release_of(chosen), "reason": reason}
        if m.get("resources"):
            measured["resources"] = {v: {k: r.get(k) for k in ("registers", "spill_store_bytes",
                                                               "spill_load_bytes", "ldl", "stl")}
                                     for v, r in m["resources"].items()}
        if m.get("output_differs"):
            measured["output_differs"] = m["output_differs"]
        rec["measured"] = measured
        applied += 1
        if chosen != rec.get("ptxas_version"):
            changed.append((name, rec.get("ptxas_version"), chosen, reason))
    write_manifest(manifest_path, man)
    sm90 = [n for n, r in kernels.items() if r.get("arch") == ARCH]
    covered = [n for n in sm90 if len((kernels[n].get("measured") or {}).get("us", {})) >= 2]
    print(f"tune apply: {applied} kernels' timings written to {manifest_path} "
          f"({len(covered)} of {len(sm90)} {ARCH} kernels have >= 2 ptxas versions timed)")
    for name, old, new, reason in changed[:20]:
        print(f"  {name}: shipped {old}, fastest {new} ({reason})")
    if len(changed) > 20:
        print(f"  ... and {len(changed) - 20} more (spill_report.py shows every kernel's)")
    if skipped:
        print(f"  not in the manifest (skipped): {', '.join(skipped[:5])}"
              + (f", +{len(skipped) - 5} more" if len(skipped) > 5 else ""))
    print(f"{len(changed)} kernel(s) would change ptxas; `make build PTXAS=tuned` ships the "
          "chosen ones")
    return 0


# =========================================================================== table (README)


def family_of(cfg: dict) -> str:
    """``hd128 causal steal``, ``hd64 decode wide``, ``hd96 combine``... (both dtypes)."""
    if cfg.get("kind") == "combine":
        return f"hd{cfg['head_dim']} combine"
    parts = [f"hd{cfg['head_dim']}"]
    if cfg.get("decode"):
        parts.append("decode wide" if cfg.get("wide") else "decode")
    parts.append("local" if cfg.get("local") else "causal" if cfg.get("causal") else "full")
    parts += [f for f in ("softcap", "m128", "long_kv", "trace") if cfg.get(f)]
    if not cfg.get("decode"):
        parts.append(cfg["scheduler"])
    return " ".join(parts)


def _geomean(xs):
    import math
    return math.exp(sum(math.log(x) for x in xs) / len(xs)) if xs else None


def table(manifest_path: Path) -> str:
    """Markdown: per kernel family (both dtypes) and ptxas, the max registers, the kernels that
    spill and the geometric-mean µs; ``*`` marks the ptxas the family's kernels chose most; then
    what the measured pick bought over always-newest and over the shipped build."""
    kernels = json.loads(manifest_path.read_text())["kernels"]
    timed = {n: r for n, r in kernels.items() if r.get("arch") == ARCH and
             len((r.get("measured") or {}).get("us", {})) >= 2}
    if not timed:
        return "(no measured timings in the manifest: run `make tune`)"
    versions = sorted({v for r in timed.values() for v in r["measured"]["us"]}, key=_vkey)
    fams: dict = {}
    for n, r in sorted(timed.items()):
        fams.setdefault(family_of(r["config"]), []).append(r)
    head = ["kernel family", "n"] + [f"ptxas {release_of(v)}: regs / spilling / µs" for v in versions]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for fam, recs in sorted(fams.items(), key=lambda kv: (int(kv[0].split()[0][2:]), kv[0])):
        votes = [r["measured"]["chosen"] for r in recs]
        top = max(set(votes), key=lambda v: (votes.count(v), _vkey(v)))
        cells = []
        for v in versions:
            res = [(r["measured"].get("resources") or {}).get(v, {}) for r in recs]
            us = [r["measured"]["us"][v] for r in recs if v in r["measured"]["us"]]
            if not us:
                cells.append("-")
                continue
            regs = max((x.get("registers") or 0 for x in res), default=0)
            spilling = sum(1 for x in res if spill_score(x))
            mark = " *" if v == top else ""
            cells.append(f"{regs or '?'} / {spilling} / {_geomean(us):.1f}{mark}")
        lines.append(f"| {fam} | {len(recs)} | " + " | ".join(cells) + " |")
    newest = versions[-1]
    vs_newest = [r["measured"]["us"][newest] / r["measured"]["us"][r["measured"]["chosen"]]
                 for r in timed.values() if newest in r["measured"]["us"]]
    vs_shipped = [r["measured"]["us"][r["ptxas_version"]] / r["measured"]["us"][r["measured"]["chosen"]]
                  for r in timed.values() if r.get("ptxas_version") in r["measured"]["us"]]
    changed = sum(1 for r in timed.values() if r["measured"]["chosen"] != newest)
    best = max(timed.items(), key=lambda kv: kv[1]["measured"]["us"].get(newest, 0) /
               kv[1]["measured"]["us"][kv[1]["measured"]["chosen"]])
    gpu = next(iter(timed.values()))["measured"].get("gpu")
    lines += ["", f"{len(timed)} sm_90a kernels timed on {gpu}; * = the ptxas most of the family's "
              "kernels chose. The measured pick differs from the newest ptxas "
              f"({release_of(newest)}) for {changed} kernels: geometric-mean speedup over "
              f"always-newest {(_geomean(vs_newest) - 1):+.2%} (largest {max(vs_newest) - 1:+.1%}, "
              f"{best[0]}), over the shipped build {(_geomean(vs_shipped) - 1):+.2%}."]
    return "\n".join(lines)


# =========================================================================== CLI


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("prepare", help="CPU: assemble every sm_90a kernel with each candidate")
    p.add_argument("--candidates", default=os.environ.get("PTXAS_CANDIDATES") or
                   DEFAULT_CANDIDATES)
    p.add_argument("--only", help="regex over kernel names")
    p.add_argument("--out", type=Path, default=TUNE_DIR)
    p.add_argument("--artifacts", type=Path, default=SHIPPED, help=argparse.SUPPRESS)
    p.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    m = sub.add_parser("measure", help="GPU: time every kernel of every candidate")
    m.add_argument("--tune-dir", type=Path, default=TUNE_DIR)
    m.add_argument("--out", type=Path, default=None, help="default <tune-dir>/measured.json")
    m.add_argument("--repeats", type=int, default=7)
    m.add_argument("--iters", type=int, default=10)
    m.add_argument("--only", help="regex over kernel names")
    a = sub.add_parser("apply", help="CPU: write the timings and choices into the manifest")
    a.add_argument("--measured", type=Path, default=TUNE_DIR / "measured.json")
    a.add_argument("--manifest", type=Path, default=SHIPPED / "manifest.json")
    t = sub.add_parser("table", help="the README's table: family x ptxas -> regs, spills, µs")
    t.add_argument("--manifest", type=Path, default=SHIPPED / "manifest.json")
    args = ap.parse_args(argv)
    if args.cmd == "table":
        print(table(args.manifest))
        return 0
    if args.cmd == "prepare":
        cands = [c.strip() for c in args.candidates.split(",") if c.strip()]
        return prepare(cands, args.only, args.out, args.jobs, args.artifacts)
    if args.cmd == "measure":
        return measure(args.tune_dir, args.out or args.tune_dir / "measured.json",
                       args.repeats, args.iters, args.only)
    return apply(args.measured, args.manifest)


if __name__ == "__main__":
    code = main()
    if code > 128:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    sys.exit(code)
