"""Run one fa4_aot forward a few times (for ncu / compute-sanitizer).

    python bench/one_call.py B H S D [causal] [scheduler] [seqlen_k] [heads_k]

(S is seqlen_q; seqlen_k defaults to S and heads_k to H: "8 32 1 128 1 auto 4096 8" is a
decode call, packed GQA with split-KV.)

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
sk = int(sys.argv[7]) if len(sys.argv) > 7 else s
hk = int(sys.argv[8]) if len(sys.argv) > 8 else h
q = torch.randn(b, s, h, d, device="cuda", dtype=torch.bfloat16)
k, v = (torch.randn(b, sk, hk, d, device="cuda", dtype=torch.bfloat16) for _ in range(2))
for _ in range(2):
    out = fa4_aot.attention(q, k, v, causal=causal, scheduler=sched)
torch.cuda.synchronize()
from fa4_aot import interface  # noqa: E402  (which kernels ran, for the log)
names = sorted({kl.name for e in interface._tls.memo.values()
                for kl in interface.derive_launches(e.call).launches})
print("ok", out.float().abs().mean().item(), " ".join(names))
