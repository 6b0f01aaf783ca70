"""How would a kernel with another tile or mainloop schedule do? Builds it (CPU only).

Build experiment variants of the kernels: the shipped configurations with another tile or
mainloop schedule, into a separate artifacts folder, for side-by-side measurements.

    python -m tools.variants noovl-nopp --only 'sm_90a_bf16_hd128_full_single' \\
        --out /tmp/exp_noovl_nopp [--ptxas 13.1] [--jobs 1]
    FA4_AOT_ARTIFACTS=/tmp/exp_noovl_nopp python bench/bench_fwd.py ...

A variant is ``-``-joined tokens that override fields of ``fa4_aot.configs.Tile``:

``ovl`` / ``noovl``  the sm_90a overlapped mainloop (S(n) and PV(n+1) together) on / off
``pp`` / ``nopp``    the sm_90a warpgroup ping-pong on / off
``re`` / ``nore``    the sm_90a early O rescale (under S's wgmmas) on / off
``ss`` / ``noss``    the sm_90a O stores through shared memory (``Tile.staged_store``) on / off
``ob`` / ``noob``    ... through an O buffer of their own instead of the Q stage (``Tile.o_buffer``)
``lr`` / ``nolr``    the sm_90a lazy row-max update (``Tile.lazy_rescale``) on / off
``eN``               the sm_90a first key block cut to N columns where it can be
                     (``Tile.edge_width``; ``e0``: off)
``sN``               N K/V pipeline stages
``qN``               N Q buffers (1 or 2; sm_90a prefill)
``nN``               an n tile of N keys (a multiple of 16)
``mN``               an m tile of N rows (64, 128 or 192 on sm_90a: one MMA warpgroup per 64)

How: the tile tables (``configs.TILES``, ``TILES_WIDE_N``, ``TILES_LONG_KV``, ``TILES_M128``,
``DECODE_TILES`` and ``DECODE_WIDE_TILES``) are patched in this process and,
through ``$FA4_AOT_EXPERIMENT_VARIANT``, in every compile worker, and then the ordinary build
(``build_tools/build.py``'s ``build``) runs. The output folder is a complete artifacts folder
(manifest, cubins, PTX): its kernels have the shipped configurations' keys with the variant's
tile, so the runtime selects them when ``FA4_AOT_ARTIFACTS`` points there. The shipped
configurations, the build and the runtime know nothing of variants.

Ablations that needed kernel code (the P conversion as a plain ``.to()``, docs/perf-notes.md
v7; varlen tiles handed to the consumers instead of skipped, v8) were kernel switches in the
sources of their time; their rows in docs/perf-notes.md name the commit that had them.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

ENV = "FA4_AOT_EXPERIMENT_VARIANT"


def tile_overrides(variant: str) -> dict:
    """``"noovl-s3"`` -> ``{"overlap": False, "kv_stages": 3}``."""
    out = {}
    for tok in filter(None, variant.split("-")):
        if tok in ("ovl", "noovl"):
            out["overlap"] = tok == "ovl"
        elif tok in ("pp", "nopp"):
            out["pingpong"] = tok == "pp"
        elif tok in ("re", "nore"):
            out["rescale_early"] = tok == "re"
        elif tok == "c4":
            out["sum_chains"] = True
        elif tok in ("ss", "noss"):
            out["staged_store"] = tok == "ss"
        elif tok in ("ob", "noob"):
            out["o_buffer"] = tok == "ob"
        elif tok in ("lr", "nolr"):
            out["lazy_rescale"] = tok == "lr"
        elif re.fullmatch(r"e(0|16|32|48|64|80|96|112|128|144|160)", tok):
            out["edge_width"] = int(tok[1:])
        elif re.fullmatch(r"q[12]", tok):
            out["q_stages"] = int(tok[1:])
        elif re.fullmatch(r"s[1-9]", tok):
            out["kv_stages"] = int(tok[1:])
        elif re.fullmatch(r"m(64|128|192)", tok):
            out["m"] = int(tok[1:])
        elif re.fullmatch(r"n(16|32|48|64|80|96|112|128|144|160|176|192)", tok):
            out["n"] = int(tok[1:])
        else:
            raise ValueError(f"unknown kernel variant token {tok!r} "
                             "(ovl, noovl, pp, nopp, re, nore, c4, ss, noss, ob, noob, lr, nolr, "
                             "eN, qN, sN, nN, mN)")
    return out


def apply(variant: str) -> None:
    """Patch the tile tables of this process (every arch and head_dim)."""
    from fa4_aot import configs
    over = tile_overrides(variant)
    tables = [*configs.TILES.values(), *configs.TILES_WIDE_N.values(),
              *configs.TILES_LONG_KV.values(), *configs.TILES_M128.values(),
              configs.DECODE_TILES, configs.DECODE_WIDE_TILES]
    for table in tables:
        for hd, t in list(table.items()):
            table[hd] = dataclasses.replace(t, **over)


def shared_names(only: str | None = None) -> dict:
    """Kernel names that more than one configuration of the (patched) config space gets, with
    those configurations: a variant that gives two tables the same tile (``m192`` at hd128:
    the 128- and 176-key tables) gives their configurations one name, and the build's
    manifest, keyed by name, keeps one of the records."""
    from fa4_aot import configs
    by_name: dict = {}
    for c in configs.CONFIG_SPACE:
        if not only or re.search(only, c.name):  # build.build's --only filter
            by_name.setdefault(c.name, []).append(c)
    return {n: cs for n, cs in by_name.items() if len(cs) > 1}


def _compile_worker(cfg_dict: dict, ptx_path: str) -> dict:
    """build.py's compile worker, in a fresh process: patch, then compile as usual."""
    apply(os.environ[ENV])
    from build_tools.dsl_compile import compile_to_ptx
    return compile_to_ptx(cfg_dict, ptx_path)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("variant", help="tokens joined by '-', e.g. noovl-nopp-s3")
    ap.add_argument("--out", type=Path, required=True, help="artifacts folder to write")
    ap.add_argument("--only", help="regex over configuration names")
    ap.add_argument("--ptxas", default="13.1")
    ap.add_argument("--jobs", type=int, default=1)
    ap.add_argument("--force", action="store_true")
    a = ap.parse_args(argv)
    if a.out.resolve() == (ROOT / "artifacts").resolve():
        ap.error("--out must not be the shipped artifacts/ folder")
    tile_overrides(a.variant)  # validate before building anything
    os.environ[ENV] = a.variant
    apply(a.variant)
    for name, cs in shared_names(a.only).items():
        print(f"variants: {len(cs)} configurations share the name {name} (keys "
              f"{[c.key for c in cs]}); the manifest keeps one of them "
              f"(tools/fill_variant.py adds the shipped kernels for the others)",
              file=sys.stderr)
    from build_tools import build
    build._compile_worker = _compile_worker  # the pool pickles it by reference
    return build.build(a.ptxas, a.out, a.only, a.jobs, a.force, False)


if __name__ == "__main__":
    sys.exit(main())
