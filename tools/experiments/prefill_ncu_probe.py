"""One call each of FA4 and fa4_aot on the same prefill inputs, warm-ups outside the profiled
range, for ncu side by side. Needs an sm_90 GPU; upstream FA4 (flash-attn-4) when importable:

    ncu --profile-from-start off --clock-control none --section SpeedOfLight \\
        --section WarpStateStats --section InstructionStats \\
        python tools/experiments/prefill_ncu_probe.py B H S D [causal]
        python tools/experiments/prefill_ncu_probe.py docs 16384+512*32 16 128 [causal]
"""

import itertools
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
import fa4_aot  # noqa: E402
from bench.benchlib import doc_lens  # noqa: E402
try:
    from flash_attn.cute.interface import flash_attn_func, flash_attn_varlen_func
except ImportError:  # fa4_aot alone
    flash_attn_func = flash_attn_varlen_func = None


def profile_once(calls, warmups=3):
    """Each call ``warmups`` times outside the profiled range, then once each inside it
    (``ncu --profile-from-start off`` profiles exactly those)."""
    for _ in range(warmups):
        for f in calls:
            f()
    torch.cuda.synchronize()
    torch.cuda.profiler.start()
    for f in calls:
        f()
    torch.cuda.synchronize()
    torch.cuda.profiler.stop()


def inputs_for(argv):
    """``(q, k, v, causal, kw)`` for ``B H S D [causal]`` (dense) or ``docs LENS H D [causal]``
    (packed documents: ``kw`` holds the varlen arguments), bf16 on the GPU."""
    if argv[0] == "docs":
        lens = doc_lens(argv[1])
        h, d = int(argv[2]), int(argv[3])
        causal = len(argv) > 4 and argv[4] == "causal"
        q, k, v = (torch.randn(sum(lens), h, d, device="cuda", dtype=torch.bfloat16)
                   for _ in range(3))
        cu = torch.tensor([0] + list(itertools.accumulate(lens)), dtype=torch.int32,
                          device="cuda")
        kw = dict(cu_seqlens_q=cu, cu_seqlens_k=cu, max_seqlen_q=max(lens),
                  max_seqlen_k=max(lens))
    else:
        b, h, s, d = (int(x) for x in argv[:4])
        causal = len(argv) > 4 and argv[4] == "causal"
        q, k, v = (torch.randn(b, s, h, d, device="cuda", dtype=torch.bfloat16)
                   for _ in range(3))
        kw = {}
    return q, k, v, causal, kw


def calls_for(argv):
    """``{provider: call}`` on :func:`inputs_for`'s inputs (varlen calls of both for packed
    documents): FA4 first when importable, then fa4_aot."""
    q, k, v, causal, kw = inputs_for(argv)
    fa4 = flash_attn_varlen_func if kw else flash_attn_func
    calls = {}
    if fa4 is not None:
        calls["fa4"] = lambda: fa4(q, k, v, causal=causal, **kw)
    calls["fa4_aot"] = lambda: fa4_aot.attention(q, k, v, causal=causal, **kw)
    return calls


def main(argv):
    profile_once(list(calls_for(argv).values()))


if __name__ == "__main__":
    main(sys.argv[1:])
