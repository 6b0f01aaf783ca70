"""Are the kernels accurate when the row max keeps moving? Run on an sm_90 GPU, repo root.

Accuracy on inputs whose row max keeps moving, by FA's rule (``fa4_aot.testing``), for the
kernels in ``$FA4_AOT_ARTIFACTS`` (or the installed ones): the lazy row max (``Tile.lazy_rescale``,
docs/perf-notes.md v22) against the kernels of another folder, run once per folder.

    FA4_AOT_ARTIFACTS=artifacts python -m tools.moving_max_accuracy 64 128
    FA4_AOT_ARTIFACTS=.exp/lz10 python -m tools.moving_max_accuracy 128 --kinds
        randn,x10,x30,x60,rising,outlier   (v36: x30 and x60 overflow an unguarded lazy reference)

Cases (1 x 4 heads x 2048 keys, bf16): ``fa4_aot.testing.moving_max_inputs`` (plain randn;
scores x3, x5, x10; keys scaled up toward the first keys, which the kernels visit last, or
toward the last; one outlier key). Prints error, bound and error/bound per case; exits 1 on a
failure.
"""

from __future__ import annotations

import math
import sys

import fa4_aot
from fa4_aot.testing import (MOVING_MAX_KINDS, attention_ref, error_and_bound,
                             moving_max_inputs)


def main() -> int:
    args = sys.argv[1:]
    kinds = MOVING_MAX_KINDS
    if "--kinds" in args:
        i = args.index("--kinds")
        kinds = tuple(args[i + 1].split(","))
        del args[i:i + 2]
    dims = [int(a) for a in args] or [64, 128, 256]
    failures = 0
    print(f"{'case':28s} {'err':>9s} {'bound':>9s} {'ratio':>6s} {'lse err':>8s}")
    for d in dims:
        for causal in (False, True):
            for kind in kinds:
                q, k, v = moving_max_inputs(kind, d, 2048, 4)
                o, lse = fa4_aot.attention(q, k, v, causal=causal, return_lse=True)
                ref, lse_ref = attention_ref(q, k, v, causal=causal)
                ref_pt, _ = attention_ref(q, k, v, causal=causal, upcast=False)
                err, _, bound = error_and_bound(o, ref, ref_pt)
                lse_err = (lse - lse_ref).abs().max().item()
                ok = err <= bound and not math.isnan(err) and lse_err < 1e-2
                failures += not ok
                name = f"hd{d} {'causal' if causal else 'full'} {kind}"
                print(f"{name:28s} {err:9.2e} {bound:9.2e} {err / bound:6.2f} {lse_err:8.1e}"
                      f"{'' if ok else '  FAIL'}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
