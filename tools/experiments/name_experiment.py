"""Does ptxas treat a kernel differently when its entry name contains "cutlass"?

Upstream CUTLASS issue #3389 reports heavier ptxas spilling for kernels whose name contains
"cutlass" (the CuTe DSL names entries ``kernel_cutlass_...`` by default). fa4_aot ships neutral
names (``fa4aot_<config>_0``). This script measures the difference:

    python tools/experiments/name_experiment.py                 # default configs and ptxas set
    python tools/experiments/name_experiment.py --configs 'bf16_hd128_causal_steal_m' --ptxas 13.1 13.5
    python tools/experiments/name_experiment.py --ptx /tmp/upstream.sm_100a.ptx   # rename-only test
    python tools/experiments/name_experiment.py --format json > results.json

For every configuration it compiles the kernel twice with the CuTe DSL (one process each):
the build's ``compile_to_ptx`` gives ``fa4aot_<config>_0``, and the same compile with the DSL's
``cutlass`` name component kept (this script patches ``set_name_prefix`` in its worker process;
the build itself has no such switch) gives ``fa4aot_<config>_cutlass_0``. It checks that the two PTX files
differ only in that name, assembles both with each ptxas release, and compares: registers,
spill bytes (``ptxas -v``), LDL/STL counts, and the SASS (``nvdisasm -c``) with the entry name
replaced by a placeholder: how many instruction lines differ, and the L1 distance between the
two opcode histograms. A *control* name of the same length without the substring (``cutlass``
→ ``ctrlxyz``, renamed in the PTX text) tells a "cutlass"-specific effect from any renaming
perturbing ptxas. ``--ptx FILE`` runs the same comparison on any PTX by renaming its entries
textually (``cutlass`` → ``neutral``/``ctrlxyz``, or appending ``_cutlass``/``_ctrlxyz`` when the
name has no ``cutlass``), which isolates ptxas from the DSL entirely.

Nothing is written to the repository; ``--keep DIR`` keeps the PTX/cubins/SASS.
"""

from __future__ import annotations

import argparse
import concurrent.futures as cf
import difflib
import json
import os
import re
import shutil
import sys
import tempfile
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from build_tools import toolchain as tcm  # noqa: E402
from build_tools.inspect_cubin import (  # noqa: E402
    _SASS_INSN_RE, inspect_cubin, parse_ptx_entries, ptx_target)

DEFAULT_CONFIGS = (
    "^fwd_sm_90a_bf16_hd128_causal_steal_m128n128s2$",
    "^fwd_sm_90a_bf16_hd64_full_single_m128n128s3$",
    "^fwd_sm_100a_bf16_hd128_causal_clc_m128n128s2$",
    "^fwd_sm_100a_bf16_hd64_full_static_m128n128s4$",
)
DEFAULT_PTXAS = ("12.9", "13.0", "13.1", "13.5")
NAMES = ("neutral", "cutlass", "control")
CONTROL_TOKEN = "ctrlxyz"  # same length as "cutlass", not containing it
PLACEHOLDER = "ENTRY"

_PRED_RE = re.compile(r"^@!?U?P[T0-9]+\s+")


# --------------------------------------------------------------------------- pure helpers


def sass_instructions(sass_text: str, names: list[str]) -> list[str]:
    """The instruction lines of ``nvdisasm -c`` output, addresses dropped, the entry ``names``
    replaced by a placeholder (so two kernels that differ only in name compare equal)."""
    out = []
    for line in sass_text.splitlines():
        m = _SASS_INSN_RE.match(line)  # the build's SASS line pattern (address, predicate, op)
        if m:
            insn = f"{m['pred'] or ''}{m['op']}{m['args']}"
            for name in names:
                insn = insn.replace(name, PLACEHOLDER)
            out.append(" ".join(insn.split()))
    return out


def opcode_histogram(instructions: list[str]) -> Counter:
    """Opcode (with modifiers, e.g. ``SYNCS.EXCH.64``) → count; predicates ignored."""
    hist: Counter = Counter()
    for insn in instructions:
        body = _PRED_RE.sub("", insn)
        if body:
            hist[body.split()[0]] += 1
    return hist


def histogram_distance(a: Counter, b: Counter) -> int:
    """L1 distance: how many instructions would have to change opcode/appear/disappear."""
    return sum(abs(a[k] - b[k]) for k in set(a) | set(b))


def changed_lines(a: list[str], b: list[str]) -> int:
    """How many instruction lines of the longer stream have no counterpart in the other:
    ``max(len) - matched`` after a difflib alignment (0 = identical)."""
    if a == b:
        return 0
    blocks = difflib.SequenceMatcher(None, a, b, autojunk=False).get_matching_blocks()
    return max(len(a), len(b)) - sum(blk.size for blk in blocks)


def variant_name(entry: str, variant: str) -> str:
    """The entry name for one variant: ``cutlass`` keeps/adds the substring, ``neutral``
    replaces it by ``neutral`` (or keeps a name without it), ``control`` replaces it by
    ``ctrlxyz`` (or appends ``_ctrlxyz`` where ``cutlass`` appends ``_cutlass``)."""
    if variant == "cutlass":
        return entry if "cutlass" in entry else f"{entry}_cutlass"
    token = {"neutral": "neutral", "control": CONTROL_TOKEN}[variant]
    if "cutlass" in entry:
        return entry.replace("cutlass", token)
    return entry if variant == "neutral" else f"{entry}_{token}"


def rename_entries(ptx_text: str, variant: str) -> tuple[str, dict[str, str]]:
    """Rename every ``.entry`` of a PTX module (see :func:`variant_name`); returns
    (new text, {old: new})."""
    mapping = {entry: variant_name(entry, variant) for entry in parse_ptx_entries(ptx_text)}
    # Identifiers that start with the entry name are renamed too (its ``<entry>_param_N``
    # parameters), as the DSL does; longer names first so no name is cut by a prefix.
    for old in sorted(mapping, key=len, reverse=True):
        if mapping[old] != old:
            ptx_text = re.sub(rf"(?<![\w$]){re.escape(old)}", mapping[old], ptx_text)
    return ptx_text, mapping


def normalized_ptx(ptx_text: str) -> str:
    """PTX with every entry name replaced by the placeholder and header comments dropped."""
    for entry in parse_ptx_entries(ptx_text):
        ptx_text = ptx_text.replace(entry, PLACEHOLDER)
    return "\n".join(ln for ln in ptx_text.splitlines() if not ln.startswith("//"))


# --------------------------------------------------------------------------- work


def _compile_worker(cfg_dict: dict, out_ptx: str, neutral: bool) -> dict:
    """One configuration per process. ``neutral=False``: keep the DSL's ``cutlass`` name
    component by patching, in this process only, the kernels' ``set_name_prefix`` and the
    build's expected entry name."""
    from build_tools import dsl_compile
    if not neutral:
        from fa4_aot.kernels.sm90_fwd import FlashFwdSm90
        from fa4_aot.kernels.sm100_fwd import FlashFwdSm100
        for k in (FlashFwdSm90, FlashFwdSm100):
            orig = k.kernel.set_name_prefix

            def keep_cutlass(name, *, remove_cutlass_symbol=False, keep_mangled_name=True,
                             _orig=orig):
                _orig(name, remove_cutlass_symbol=False, keep_mangled_name=keep_mangled_name)
            k.kernel.set_name_prefix = keep_cutlass
        dsl_compile.entry_name = lambda cfg: f"{dsl_compile.ENTRY_PREFIX}{cfg.name}_cutlass_0"
    return dsl_compile.compile_to_ptx(cfg_dict, out_ptx)


def _assemble(tc: tcm.Toolchain, ptx: Path, cubin: Path) -> dict:
    text = ptx.read_text()
    log = tcm.assemble(tc, ptx, cubin, arch=ptx_target(text))
    info = inspect_cubin(tc, cubin, log)
    names = list(parse_ptx_entries(text))
    sass = tcm.run_tool([tc.nvdisasm, "-c", cubin])
    cubin.with_suffix(".sass").write_text(sass)
    insns = sass_instructions(sass, names)
    res = {k: 0 for k in ("registers", "spill_store_bytes", "spill_load_bytes", "ldl", "stl")}
    for entry in names:  # one entry for our kernels; sum/max for multi-entry modules
        e = info["entries"][entry]
        res["registers"] = max(res["registers"], e["registers"] or 0)
        for k in ("spill_store_bytes", "spill_load_bytes", "ldl", "stl"):
            res[k] += e[k] or 0
    return {**res, "entries": names, "instructions": insns, "cubin_bytes": info["size_bytes"]}


def _pair_row(label: str, tc: tcm.Toolchain, r: dict[str, dict], ptx_same: bool | None) -> dict:
    a, b, c = r["neutral"], r["cutlass"], r["control"]
    ha, hb, hc = (opcode_histogram(x["instructions"]) for x in (a, b, c))
    diff = sorted(((k, hb[k] - ha[k]) for k in set(ha) | set(hb) if ha[k] != hb[k]),
                  key=lambda kv: -abs(kv[1]))
    return {
        "kernel": label,
        "ptxas": tc.ptxas_version,
        "ptx_identical_beyond_name": ptx_same,
        **{f"{k}_{n}": r[n][k] for n in NAMES
           for k in ("registers", "spill_store_bytes", "spill_load_bytes", "ldl", "stl")},
        **{f"instructions_{n}": len(r[n]["instructions"]) for n in NAMES},
        "sass_identical_beyond_name": a["instructions"] == b["instructions"],
        "sass_lines_differing": changed_lines(a["instructions"], b["instructions"]),
        "opcode_histogram_l1": histogram_distance(ha, hb),
        "opcode_changes_cutlass_minus_neutral": dict(diff[:8]),
        "control_sass_identical_to_neutral": c["instructions"] == a["instructions"],
        "control_sass_identical_to_cutlass": c["instructions"] == b["instructions"],
        "control_opcode_histogram_l1_vs_neutral": histogram_distance(ha, hc),
        "entries": {n: r[n]["entries"] for n in NAMES},
    }


def run(configs: list[str], ptx_files: list[Path], versions: list[str], work: Path,
        jobs: int) -> list[dict]:
    from fa4_aot.configs import CONFIG_SPACE

    chosen = [c for c in CONFIG_SPACE if any(re.search(rx, c.name) for rx in configs)]
    if configs and not chosen:
        raise SystemExit(f"name_experiment: no configuration matches {configs}")
    pairs: list[tuple[str, dict[str, Path], bool | None]] = []

    # 1. DSL compiles: each configuration with both names, one process per compile.
    with cf.ProcessPoolExecutor(max_workers=jobs, max_tasks_per_child=1) as pool:
        futs = {(c.name, n): pool.submit(_compile_worker, c.to_dict(),
                                         str(work / f"{c.name}.{n}.{c.arch}.ptx"), n == "neutral")
                for c in chosen for n in NAMES[:2]}
        for (name, n), fut in futs.items():
            fut.result()
    for c in chosen:
        paths = {n: work / f"{c.name}.{n}.{c.arch}.ptx" for n in NAMES}
        cutlass_text = paths["cutlass"].read_text()
        paths["control"].write_text(rename_entries(cutlass_text, "control")[0])
        same = normalized_ptx(paths["neutral"].read_text()) == normalized_ptx(cutlass_text)
        pairs.append((c.name, paths, same))

    # 2. Rename-only pairs for given PTX files (upstream kernels...).
    for i, ptx in enumerate(ptx_files):
        text = ptx.read_text()
        stem = ptx.name.removesuffix(".ptx")
        paths = {}
        for n in NAMES:
            renamed, _ = rename_entries(text, n)
            paths[n] = work / f"file{i}.{n}.{stem}.ptx"
            paths[n].write_text(renamed)
        pairs.append((f"{ptx.name} (renamed)", paths, True))

    # 3. Assemble everything with every ptxas.
    tcs = [tcm.get_toolchain(v) for v in versions]
    with cf.ThreadPoolExecutor(max_workers=jobs) as pool:
        futs = {(i, j, n): pool.submit(_assemble, tc, paths[n],
                                       paths[n].with_suffix(f".{tc.ptxas_version}.cubin"))
                for i, (_, paths, _) in enumerate(pairs) for j, tc in enumerate(tcs)
                for n in NAMES}
        rows = []
        for i, (label, _, same) in enumerate(pairs):
            for j, tc in enumerate(tcs):
                rows.append(_pair_row(label, tc, {n: futs[(i, j, n)].result() for n in NAMES},
                                      same))
    return rows


def render_md(rows: list[dict]) -> str:
    def fmt(r, get) -> str:
        a, b = get(r, "neutral"), get(r, "cutlass")
        return str(a) if a == b else f"**{a} / {b}**"

    def control(r) -> str:
        if r["control_sass_identical_to_neutral"]:
            return "= neutral"
        if r["control_sass_identical_to_cutlass"]:
            return "**= cutlass**"
        return f"neither (L1 {r['control_opcode_histogram_l1_vs_neutral']} vs neutral)"

    head = ("| kernel | ptxas | PTX same beyond name | registers | spill bytes st+ld | LDL+STL "
            "| SASS instructions | SASS lines unmatched | opcode-histogram L1 | control name |")
    lines = [head, "|" + "---|" * 10]
    for r in rows:
        lines.append(
            f"| {r['kernel']} | {r['ptxas']} | {_yn(r['ptx_identical_beyond_name'])} "
            f"| {fmt(r, lambda r, n: r[f'registers_{n}'])} "
            f"| {fmt(r, lambda r, n: r[f'spill_store_bytes_{n}'] + r[f'spill_load_bytes_{n}'])} "
            f"| {fmt(r, lambda r, n: r[f'ldl_{n}'] + r[f'stl_{n}'])} "
            f"| {fmt(r, lambda r, n: r[f'instructions_{n}'])} "
            f"| {r['sass_lines_differing']} | {r['opcode_histogram_l1']} | {control(r)} |")
    lines.append("")
    lines.append("cells: one number when both names give it, else **neutral / cutlass**; SASS "
                 "compared with the entry name masked; control name = the cutlass name with "
                 f"`cutlass` -> `{CONTROL_TOKEN}`")
    changes = [r for r in rows if r["opcode_changes_cutlass_minus_neutral"]]
    if changes:
        lines.append("")
        lines.append("largest opcode-count changes, cutlass minus neutral:")
        for r in changes:
            delta = r["opcode_changes_cutlass_minus_neutral"]
            top = ", ".join(f"{k} {v:+d}" for k, v in delta.items())
            lines.append(f"- {r['kernel']}, ptxas {r['ptxas']}: {top}")
    return "\n".join(lines)


def _yn(v) -> str:
    return "-" if v is None else ("yes" if v else "**no**")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--configs", nargs="*", default=list(DEFAULT_CONFIGS),
                    help="regexes over configuration names (default: %(default)s); "
                         "pass none (--configs) to skip the DSL compiles")
    ap.add_argument("--ptx", nargs="*", type=Path, default=[],
                    help="PTX files to compare by renaming their entries")
    ap.add_argument("--ptxas", nargs="+", default=list(DEFAULT_PTXAS), metavar="X.Y")
    ap.add_argument("--format", choices=("md", "json"), default="md")
    ap.add_argument("--keep", type=Path, help="keep PTX, cubins and SASS in this folder")
    ap.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    a = ap.parse_args(argv)
    for v in a.ptxas:
        tcm.check_ptxas_release(v)
    for p in a.ptx:
        if not p.is_file():
            ap.error(f"{p}: no such file")
    work = Path(tempfile.mkdtemp(prefix="fa4aot_name_")) if a.keep is None else a.keep
    work.mkdir(parents=True, exist_ok=True)
    try:
        rows = run(a.configs, a.ptx, a.ptxas, work, a.jobs)
    finally:
        if a.keep is None:
            shutil.rmtree(work, ignore_errors=True)
    if a.format == "json":
        print(json.dumps(rows, indent=1))
    else:
        print(render_md(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
