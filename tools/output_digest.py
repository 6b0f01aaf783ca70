"""Did a change alter any output bit? Hashes of a seeded set of fa4_aot calls. (sm_90 GPU.)

For host-side refactors and rebuilds that must not change results: run it on the tree before
and after (the same GPU; an old tree's ``fa4_aot`` can be put first on ``PYTHONPATH``, with
``FA4_AOT_ARTIFACTS`` naming the artifacts folder) and compare the two files.

    python -m tools.output_digest before.json            # on the old tree
    python -m tools.output_digest after.json --compare before.json

The calls: bf16 and fp16, head dims 64-256, dense (all schedulers), causal, windows, softcap,
softmax_scale, GQA, varlen (empty and one-token documents), decode (split-KV, seqused_k,
softcap), paged KV (page 16/64/256, chunked prefill) and four bad inputs (the error text is
hashed too). Each entry holds the sha256 prefixes of the output and the LSE. The file also
records the host time of a small call (1x128x1x64, median of 5 x 3,000 calls, enqueue only).
"""

from __future__ import annotations

import argparse
import hashlib
import itertools
import json
import time

import torch

import fa4_aot

DEV = "cuda"


def _hash(t):
    return hashlib.sha256(t.contiguous().view(torch.uint8).cpu().numpy().tobytes()).hexdigest()[:16]


def _rnd(*shape, dt=torch.bfloat16):
    return torch.randn(*shape, device=DEV, dtype=dt)


def digest() -> dict:
    torch.manual_seed(0)
    res = {}

    def run(name, q, k, v, **kw):
        try:
            o, lse = fa4_aot.attention(q, k, v, return_lse=True, **kw)
            torch.cuda.synchronize()
            res[name] = [_hash(o), _hash(lse)]
        except Exception as e:  # noqa: BLE001 - a changed error is a changed output
            res[name] = f"{type(e).__name__}: {e}"[:200]

    for dt, tn in ((torch.bfloat16, "bf16"), (torch.float16, "fp16")):
        for d in (64, 96, 128, 192, 256):
            for b, s, hq, hk in ((2, 1000, 8, 8), (1, 4111, 4, 2)):
                q, k, v = (_rnd(b, s, n, d, dt=dt) for n in (hq, hk, hk))
                for causal in (False, True):
                    for sched in ("auto", "single", "static"):
                        run(f"{tn} d{d} {b}x{s} {hq}/{hk} c{int(causal)} {sched}", q, k, v,
                            causal=causal, scheduler=sched)
                    run(f"{tn} d{d} {b}x{s} c{int(causal)} softcap", q, k, v, causal=causal,
                        softcap=30.0)
                run(f"{tn} d{d} {b}x{s} win", q, k, v, window_size=(256, 64))
                run(f"{tn} d{d} {b}x{s} cwin", q, k, v, causal=True, window_size=(300, -1))
                run(f"{tn} d{d} {b}x{s} scale", q, k, v, causal=True, softmax_scale=0.3)
            lens = [700, 1, 0, 2300, 160, 5]
            cu = torch.tensor([0, *itertools.accumulate(lens)], dtype=torch.int32, device=DEV)
            q, k, v = _rnd(sum(lens), 8, d, dt=dt), _rnd(sum(lens), 2, d, dt=dt), _rnd(
                sum(lens), 2, d, dt=dt)
            for causal in (False, True):
                run(f"{tn} d{d} varlen c{int(causal)}", q, k, v, causal=causal, cu_seqlens_q=cu,
                    cu_seqlens_k=cu, max_seqlen_q=max(lens), max_seqlen_k=max(lens))
            for sq in (1, 4):
                q, k, v = _rnd(3, sq, 32, d, dt=dt), _rnd(3, 5000, 8, d, dt=dt), _rnd(
                    3, 5000, 8, d, dt=dt)
                used = torch.tensor([5000, 17, 2222], dtype=torch.int32, device=DEV)
                run(f"{tn} d{d} decode sq{sq}", q, k, v, causal=True)
                run(f"{tn} d{d} decode sq{sq} split3", q, k, v, causal=True, num_splits=3)
                run(f"{tn} d{d} decode sq{sq} seqused", q, k, v, causal=True, seqused_k=used)
                run(f"{tn} d{d} decode sq{sq} softcap", q, k, v, softcap=20.0)
            for page in (16, 64, 256):
                npg = 4096 // page * 3 + 5
                kc, vc = _rnd(npg, page, 4, d, dt=dt), _rnd(npg, page, 4, d, dt=dt)
                pt = torch.randperm(npg, device=DEV)[: 3 * (4096 // page)].view(3, -1).int()
                used = torch.tensor([4096, 100, 3000], dtype=torch.int32, device=DEV)
                run(f"{tn} d{d} paged p{page}", _rnd(3, 2, 16, d, dt=dt), kc, vc, causal=True,
                    page_table=pt, seqused_k=used)
                lq = [37, 1, 300]
                cuq = torch.tensor([0, *itertools.accumulate(lq)], dtype=torch.int32, device=DEV)
                run(f"{tn} d{d} paged chunked p{page}", _rnd(sum(lq), 16, d, dt=dt), kc, vc,
                    causal=True, page_table=pt, seqused_k=used, cu_seqlens_q=cuq,
                    max_seqlen_q=max(lq))
    q = _rnd(1, 128, 1, 64)
    for name, args, kw in (("bad dtype", (q, q.float(), q), {}),
                           ("bad window", (q, q, q), {"window_size": (1,)}),
                           ("bad splits", (q, q, q), {"num_splits": 0}),
                           ("bad scale", (q, q, q), {"softmax_scale": -1.0})):
        try:
            fa4_aot.attention(*args, **kw)
            res[name] = "no error"
        except Exception as e:  # noqa: BLE001
            res[name] = f"{type(e).__name__}: {e}"
    res["_host_us"] = _host_us()
    return res


def _host_us() -> float:
    q = _rnd(1, 128, 1, 64)
    for _ in range(200):
        fa4_aot.attention(q, q, q)
    torch.cuda.synchronize()
    times = []
    for _ in range(5):
        t0 = time.perf_counter()
        for _ in range(3000):
            fa4_aot.attention(q, q, q)
        times.append((time.perf_counter() - t0) / 3000 * 1e6)
        torch.cuda.synchronize()
    return sorted(times)[2]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out", help="write the digest here (JSON)")
    ap.add_argument("--compare", help="a digest of the tree before; exit 1 if any call differs")
    a = ap.parse_args(argv)
    res = digest()
    with open(a.out, "w") as f:
        json.dump(res, f, indent=0, sort_keys=True)
    print(f"{len(res) - 1} calls, host {res['_host_us']:.2f} us per small call")
    if a.compare:
        with open(a.compare) as f:
            old = json.load(f)
        diff = sorted(k for k in old if k != "_host_us" and res.get(k) != old[k])
        print(f"{len(diff)} of {len(old) - 1} calls differ from {a.compare}; host "
              f"{old['_host_us']:.2f} -> {res['_host_us']:.2f} us" + "".join(
                  f"\n  {k}" for k in diff[:20]))
        return 1 if diff else 0
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
