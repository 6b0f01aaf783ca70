"""One call each of FA4 and fa4_aot on the same decode inputs (B=32 x 8k keys, MHA 32/32 and
GQA 32/8, hd128, causal, distinct K and V), warm-ups outside the profiled range. Needs an sm_90
GPU and upstream FA4 (flash-attn-4) importable:

    ncu --profile-from-start off --clock-control none --section SpeedOfLight \\
        --section MemoryWorkloadAnalysis --section WarpStateStats \\
        python tools/experiments/decode_ncu_probe.py
"""

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
import fa4_aot  # noqa: E402
from tools.experiments.prefill_ncu_probe import profile_once  # noqa: E402
from flash_attn.cute.interface import flash_attn_func  # noqa: E402

for hk in (32, 8):
    q = torch.randn(32, 1, 32, 128, device="cuda", dtype=torch.bfloat16)
    k = torch.randn(32, 8192, hk, 128, device="cuda", dtype=torch.bfloat16)
    v = torch.randn_like(k)
    calls = (lambda: flash_attn_func(q, k, v, causal=True),
             lambda: fa4_aot.attention(q, k, v, causal=True))
    profile_once(calls)
    del q, k, v
