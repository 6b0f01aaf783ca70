"""Run one fa4_aot forward a few times (for ncu / compute-sanitizer).

    python bench/one_call.py B H S D [causal] [scheduler]

(An experiment variant: build it with tools/experiments/variants.py and point
FA4_AOT_ARTIFACTS at its folder.)
"""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
import torch  # noqa: E402

import fa4_aot  # noqa: E402

b, h, s, d = (int(x) for x in sys.argv[1:5])
causal = len(sys.argv) > 5 and sys.argv[5] in ("1", "causal", "true")
sched = sys.argv[6] if len(sys.argv) > 6 else "auto"
q, k, v = (torch.randn(b, s, h, d, device="cuda", dtype=torch.bfloat16) for _ in range(3))
for _ in range(2):
    out = fa4_aot.attention(q, k, v, causal=causal, scheduler=sched)
torch.cuda.synchronize()
print("ok", out.float().abs().mean().item())
