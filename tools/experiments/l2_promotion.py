"""Time fa4_aot under each L2 promotion of its TMA descriptors, without a rebuild (the promotion
is a descriptor field the runtime encodes from the manifest record), with outputs asserted
bitwise equal across settings. Needs an sm_90 GPU (docs/perf-notes.md v11).

    python tools/experiments/l2_promotion.py [--settings 256B,128B,none,64B] [--rounds 3]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))
from benchlib import round_order  # noqa: E402


def cases():
    import torch
    import fa4_aot
    from bench_decode import paged_inputs
    out = {}
    for b, sk, hk in ((32, 8192, 8), (32, 8192, 32), (8, 32768, 32)):
        q = torch.randn(b, 1, 32, 128, device="cuda", dtype=torch.bfloat16)
        k = torch.randn(b, sk, hk, 128, device="cuda", dtype=torch.bfloat16)
        v = torch.randn_like(k)
        out[f"decode B{b} sk{sk // 1024}k 32/{hk}"] = (
            lambda q=q, k=k, v=v: fa4_aot.attention(q, k, v, causal=True))
    for lab, args in (("paged page16", (32, 1, 8192, 32, 8, 16)),
                      ("chunked prefill page64", (8, 256, 2304, 32, 8, 64))):
        q, kc, vc, table, used, _, _, cu_q = paged_inputs(*args)
        var = {} if cu_q is None else {"cu_seqlens_q": cu_q, "max_seqlen_q": args[1]}
        out[lab] = (lambda q=q, kc=kc, vc=vc, t=table, u=used, var=var: fa4_aot.attention(
            q, kc, vc, causal=True, page_table=t, seqused_k=u, **var))
    for lab, shape, causal in (("prefill 2x16x8k hd128 causal", (2, 8192, 16, 128), True),
                               ("prefill 2x32x8k hd64", (2, 8192, 32, 64), False)):
        q = torch.randn(*shape, device="cuda", dtype=torch.bfloat16)
        k, v = torch.randn_like(q), torch.randn_like(q)
        out[lab] = lambda q=q, k=k, v=v, c=causal: fa4_aot.attention(q, k, v, causal=c)
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--settings", default="256B,128B,none,64B")
    ap.add_argument("--rounds", type=int, default=3)
    a = ap.parse_args(argv)
    import torch
    from fa4_aot import interface
    from bench_decode import time_calls
    manifest = interface.load_manifest()

    def use(setting):
        for rec in manifest.kernels.values():
            for p in rec["launch"]["params"]:
                if p["kind"] == "tensormap":
                    p["l2_promotion"] = setting
        interface._tls.memo.clear()  # new call sites: descriptors encoded with the setting

    settings = a.settings.split(",")
    fns = cases()
    res = {s: {c: [] for c in fns} for s in settings}
    ref = {}
    for rnd in range(a.rounds):
        for s in round_order(settings, rnd):
            use(s)
            for c, f in fns.items():
                o = f()
                time_calls(f, 2)
                if c in ref and not torch.equal(o, ref[c]):
                    print(f"output differs: {c} under {s}")
                    return 1
                ref.setdefault(c, o)
                res[s][c].append(time_calls(f, 20) * 1e3)
    print(f"{'us, best of ' + str(a.rounds):<30}" + "".join(f"{s:>10}" for s in settings))
    for c in fns:
        print(f"{c:<30}" + "".join(f"{min(res[s][c]):10.1f}" for s in settings))
    return 0


if __name__ == "__main__":
    sys.exit(main())
