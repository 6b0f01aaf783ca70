"""Quick GPU smoke check: a few shapes, error vs the fp32 reference, per scheduler.

    python bench/smoke.py

Exit status 1 when any case prints BAD (error above the bound, or NaN in the output).
"""
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
import torch  # noqa: E402

import fa4_aot  # noqa: E402
from fa4_aot.testing import attention_ref  # noqa: E402

CASES = [  # b, sq, sk, h, hk, d, causal
    (1, 128, 128, 1, 1, 128, False),
    (1, 128, 128, 1, 1, 64, False),
    (2, 1000, 1000, 4, 2, 128, False),
    (2, 1000, 1000, 4, 2, 128, True),
    (1, 257, 100, 2, 2, 64, True),
]


def main() -> int:
    torch.manual_seed(0)
    bad = 0
    for b, sq, sk, h, hk, d, causal in CASES:
        q = torch.randn(b, sq, h, d, device="cuda", dtype=torch.bfloat16)
        k = torch.randn(b, sk, hk, d, device="cuda", dtype=torch.bfloat16)
        v = torch.randn(b, sk, hk, d, device="cuda", dtype=torch.bfloat16)
        ref, lse_ref = attention_ref(q, k, v, causal=causal)
        ref_pt, _ = attention_ref(q, k, v, causal=causal, upcast=False)
        bound = 2 * (ref_pt.float() - ref).abs().max().item() + 1e-6
        for sched in ("single", "static", "steal"):
            t = time.time()
            out, lse = fa4_aot.attention(q, k, v, causal=causal, return_lse=True, scheduler=sched)
            torch.cuda.synchronize()
            err = (out.float() - ref).abs().max().item()
            fin = torch.isfinite(lse_ref)
            lerr = (lse - lse_ref)[fin].abs().max().item() if fin.any() else 0.0
            nan = torch.isnan(out).any().item()
            ok = err <= bound and not nan
            bad += not ok
            print(f"b{b} sq{sq} sk{sk} h{h}/{hk} d{d} causal={causal} {sched:6s} "
                  f"err={err:.2e} bound={bound:.2e} lse_err={lerr:.2e} nan={nan} "
                  f"{'OK' if ok else 'BAD'} ({time.time() - t:.2f}s)", flush=True)
    if bad:
        print(f"smoke: {bad} case(s) BAD", flush=True)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
