"""Accuracy on inputs whose row max keeps moving, by FA's rule (``fa4_aot.testing``), for the
kernels in ``$FA4_AOT_ARTIFACTS`` (or the installed ones): the lazy row max (``Tile.lazy_rescale``,
docs/perf-notes.md v22) against the kernels of another folder, run once per folder.

    FA4_AOT_ARTIFACTS=artifacts python tools/experiments/moving_max_accuracy.py 64 128

Cases (1 x 4 heads x 2048 keys, bf16): plain randn; scores x3, x5, x10; keys scaled up toward
the first keys (the kernels visit key blocks last to first, so the max keeps rising) or toward
the last; one outlier key. Prints error, bound and error/bound per case; exits 1 on a failure.
"""

from __future__ import annotations

import math
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
import fa4_aot  # noqa: E402
from fa4_aot.testing import attention_ref  # noqa: E402

CASES = ("randn", "x3", "x5", "x10", "rising", "falling", "outlier")


def inputs(kind: str, d: int, s: int = 2048, h: int = 4):
    g = torch.Generator(device="cuda").manual_seed(0)
    q, k, v = (torch.randn(1, s, h, d, device="cuda", generator=g) for _ in range(3))
    pos = torch.arange(s, device="cuda").view(1, s, 1, 1) / s
    if kind.startswith("x"):
        q = q * int(kind[1:])
    elif kind == "rising":
        k = k * (1 + 6 * (1 - pos))
    elif kind == "falling":
        k = k * (1 + 6 * pos)
    elif kind == "outlier":
        k[:, 3] = 3 * q[:, -1]
    return tuple(x.bfloat16() for x in (q, k, v))


def main() -> int:
    dims = [int(a) for a in sys.argv[1:]] or [64, 128, 256]
    failures = 0
    print(f"{'case':28s} {'err':>9s} {'bound':>9s} {'ratio':>6s} {'lse err':>8s}")
    for d in dims:
        for causal in (False, True):
            for kind in CASES:
                q, k, v = inputs(kind, d)
                o, lse = fa4_aot.attention(q, k, v, causal=causal, return_lse=True)
                ref, lse_ref = attention_ref(q, k, v, causal=causal)
                ref_pt, _ = attention_ref(q, k, v, causal=causal, upcast=False)
                ref, ref_pt = ref.float(), ref_pt.float()
                err = (o.float() - ref).abs().max().item()
                bound = (2 * (ref_pt - ref).abs().max().item()
                         + 2 * ((ref + 0.3 - 0.3) - ref).abs().max().item())
                lse_err = (lse - lse_ref).abs().max().item()
                ok = err <= bound and not math.isnan(err) and lse_err < 1e-2
                failures += not ok
                name = f"hd{d} {'causal' if causal else 'full'} {kind}"
                print(f"{name:28s} {err:9.2e} {bound:9.2e} {err / bound:6.2f} {lse_err:8.1e}"
                      f"{'' if ok else '  FAIL'}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
