"""One call each of FA4 and fa4_aot on the same prefill inputs, warm-ups outside the profiled
range, for ncu side by side. Needs an sm_90 GPU; upstream FA4 (flash-attn-4) when importable:

    ncu --profile-from-start off --clock-control none --section SpeedOfLight \\
        --section WarpStateStats --section InstructionStats \\
        python tools/experiments/prefill_ncu_probe.py B H S D [causal]
"""

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
import fa4_aot  # noqa: E402
try:
    from flash_attn.cute.interface import flash_attn_func
except ImportError:  # fa4_aot alone
    flash_attn_func = None

b, h, s, d = (int(x) for x in sys.argv[1:5])
causal = len(sys.argv) > 5 and sys.argv[5] == "causal"
q, k, v = (torch.randn(b, s, h, d, device="cuda", dtype=torch.bfloat16) for _ in range(3))
calls = [lambda: fa4_aot.attention(q, k, v, causal=causal)]
if flash_attn_func is not None:
    calls.insert(0, lambda: flash_attn_func(q, k, v, causal=causal))
for _ in range(3):
    for f in calls:
        f()
torch.cuda.synchronize()
torch.cuda.profiler.start()
for f in calls:
    f()
torch.cuda.synchronize()
torch.cuda.profiler.stop()
