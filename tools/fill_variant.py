"""Which shipped kernels does an experiment folder lack? Copies them in (CPU only, repo root).

Fill an experiment artifacts folder with the shipped kernels it lacks (by configuration key),
so that every call of a shape finds its kernel there (``python -m tools.ab_artifacts``). A causal call looks up the 128-key kernel before it moves to the 176-key one
(docs/design.md#kernel-choice), so a folder holding only a patched 176-key kernel fails on
the first lookup; and ``variants.py m192-...`` at hd128 gives the 128- and 176-key tables the
same tile, hence the same kernel name, and keeps one of the two records.

    python -m tools.fill_variant .exp/x2 [.exp/other ...] [--match sm_90a_bf16_hd128]
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def main(argv=None):
    from fa4_aot.configs import KernelConfig
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("folders", nargs="+")
    ap.add_argument("--match", default="sm_90a_bf16_hd128",
                    help="copy only shipped kernels whose name contains this")
    a = ap.parse_args(argv)
    shipped = json.loads((ROOT / "artifacts" / "manifest.json").read_text())["kernels"]
    for folder in map(Path, a.folders):
        path = folder / "manifest.json"
        m = json.loads(path.read_text())
        keys = {KernelConfig.from_dict(r["config"]).key for r in m["kernels"].values()}
        added = 0
        for name, r in shipped.items():
            if (a.match not in name or name in m["kernels"]
                    or KernelConfig.from_dict(r["config"]).key in keys):
                continue
            m["kernels"][name] = r
            (folder / r["cubin"]).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy(ROOT / "artifacts" / r["cubin"], folder / r["cubin"])
            added += 1
        path.write_text(json.dumps(m, indent=1))
        print(f"{folder}: {added} shipped kernels added")


if __name__ == "__main__":
    main()
