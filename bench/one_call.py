"""Run one fa4_aot forward a few times (for ncu / compute-sanitizer).

    python bench/one_call.py B H S D [causal] [scheduler] [seqlen_k] [heads_k]
    python bench/one_call.py docs:LENS H D [causal] [scheduler]

(S is seqlen_q; seqlen_k defaults to S and heads_k to H: "8 32 1 128 1 auto 4096 8" is a
decode call, packed GQA with split-KV. ``docs:1024+64*40`` packs documents of those lengths,
``N*k`` being k documents of N tokens, into one varlen call.)

``ONE_CALL_SCALE=60`` multiplies the scores by 60 (q scaled): on the bf16 causal 160-key kernels
the lazy reference's tile-end guard then sends warps to its exact recomputation from global K/V
(docs/perf-notes.md v37).

(An experiment variant: build it with tools/experiments/variants.py and point
FA4_AOT_ARTIFACTS at its folder.)
"""
import itertools
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
import torch  # noqa: E402

import fa4_aot  # noqa: E402
from bench.benchlib import doc_lens  # noqa: E402

args, kw = sys.argv[1:], {}
if args[0].startswith("docs:"):
    lens = doc_lens(args[0][5:])
    cu = torch.tensor([0] + list(itertools.accumulate(lens)), dtype=torch.int32, device="cuda")
    kw = dict(cu_seqlens_q=cu, cu_seqlens_k=cu, max_seqlen_q=max(lens), max_seqlen_k=max(lens))
    args = ["1", args[1], str(sum(lens)), *args[2:]]  # packed: one row of sum(lens) tokens
b, h, s, d = (int(x) for x in args[0:4])
causal = len(args) > 4 and args[4] in ("1", "causal", "true")
sched = args[5] if len(args) > 5 else "auto"
sk = int(args[6]) if len(args) > 6 else s
hk = int(args[7]) if len(args) > 7 else h
q = (torch.randn(b, s, h, d, device="cuda") * float(os.environ.get("ONE_CALL_SCALE", "1"))).bfloat16()
k, v = (torch.randn(b, sk, hk, d, device="cuda", dtype=torch.bfloat16) for _ in range(2))
if kw:
    q, k, v = q[0], k[0], v[0]
for _ in range(2):
    out = fa4_aot.attention(q, k, v, causal=causal, scheduler=sched, **kw)
torch.cuda.synchronize()
from fa4_aot import interface  # noqa: E402  (which kernels ran, for the log)
names = sorted({kl.name for p in interface.memo_plans() for kl in p.launches})
print("ok", out.float().abs().mean().item(), " ".join(names))
