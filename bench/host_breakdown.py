"""Where the host time of one small fa4_aot call goes (GPU): the whole call, its parts timed
alone, and a cProfile of the call; then a decode step whose K/V are one key longer than the
last call's (a dynamic KV cache: new shapes and strides every call) against the same call
repeated (a memo hit), with retargeting (docs/design.md#the-runtime-and-the-host-path) and with
every new length prepared in full. Prints tables; no file.

    python bench/host_breakdown.py [--n 20000]
"""

from __future__ import annotations

import argparse
import cProfile
import io
import pstats
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def per_call(fn, n):
    fn()
    t = time.perf_counter()
    for _ in range(n):
        fn()
    return (time.perf_counter() - t) / n * 1e6


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=20000)
    a = ap.parse_args(argv)
    import torch
    import torch.nn.functional as F

    import fa4_aot
    from fa4_aot import interface
    n = a.n
    q = torch.randn(1, 128, 1, 64, device="cuda", dtype=torch.bfloat16)
    k, v = torch.randn_like(q), torch.randn_like(q)
    qb, kb, vb = (x.transpose(1, 2) for x in (q, k, v))
    fa4_aot.attention(q, k, v)
    (e,) = [x for x in interface.prepared_calls() if x.plan.call.q[0] == (1, 128, 1, 64)]
    from fa4_aot import runtime
    from fa4_aot.manifest import load_manifest
    dev, idx = q.device, q.device.index
    out = torch.empty_like(q)
    lse = torch.empty(1, 1, 128, device="cuda")
    addrs = [0] * len(runtime.ADDRESSES)  # the call's address record, by name
    for name, t in (("q_ptr", q), ("k_ptr", k), ("v_ptr", v), ("o_ptr", out), ("lse_ptr", lse)):
        addrs[runtime.SLOT[name]] = t.data_ptr()
    launcher = e.launchers[0]
    extra = []
    try:  # A/B: the same launch through a per-context CUfunction, and through ctypes
        drv = runtime._driver()
        name, rec = e.plan.launches[0].name, e.plan.launches[0].record
        kernel = runtime.get_kernel(idx, name, load_manifest().cubin_bytes(name), rec)
        func = runtime._check(drv.cuKernelGetFunction(kernel), "cuKernelGetFunction")
        extra.append(("  launch, CUfunction (cuKernelGetFunction)",
                      lambda: drv.cuLaunchKernelEx(launcher.cfg, func, launcher.params, 0)))
        extra.append(("  launch, CUkernel (as shipped)",
                      lambda: drv.cuLaunchKernelEx(launcher.cfg, launcher.func, launcher.params,
                                                   0)))
        import ctypes
        res = drv.cuGetProcAddress(b"cuLaunchKernelEx", 12000, 0)
        pfn = int(res[1])
        cfn = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p,
                               ctypes.c_void_p)(pfn)
        cptr, fptr = launcher.cfg.getPtr(), int(launcher.func)
        extra.append(("  launch, ctypes pfn (cuGetProcAddress)",
                      lambda: cfn(cptr, fptr, launcher.params, None)))
    except Exception as ex:  # noqa: BLE001
        print(f"A/B launches skipped: {type(ex).__name__}: {ex}")
    rows = [
        ("fa4_aot.attention (whole call)", lambda: fa4_aot.attention(q, k, v)),
        ("fa4_aot.attention return_lse=True", lambda: fa4_aot.attention(q, k, v,
                                                                         return_lse=True)),
        ("torch.ops.fa4_aot.fwd (whole call)",
         lambda: torch.ops.fa4_aot.fwd(q, k, v, [None] * 5, [0, 0, -1, -1, 0], False, None,
                                       "auto", 0.0)),  # OpTensors, OpSizes
        ("sdpa (default dispatch)", lambda: F.scaled_dot_product_attention(qb, kb, vb)),
        ("  raw stream", lambda: torch._C._cuda_getCurrentRawStream(idx)),
        ("  torch.empty out", lambda: torch.empty((1, 128, 1, 64), dtype=torch.bfloat16,
                                                  device=dev)),
        ("  torch.empty lse", lambda: torch.empty((1, 1, 128), dtype=torch.float32, device=dev)),
        ("  q.new_empty out", lambda: q.new_empty((1, 128, 1, 64))),
        ("  torch.empty_like out", lambda: torch.empty_like(q)),
        ("  3 data_ptr", lambda: (q.data_ptr(), k.data_ptr(), v.data_ptr())),
        ("  launcher (patch + cuLaunchKernelEx)", lambda: launcher(addrs)),
        ("  is_compiling", torch.compiler.is_compiling),
        ("  capture check", torch.cuda.is_current_stream_capturing),
    ] + extra
    res = []
    for name, fn in rows:
        torch.cuda.synchronize()
        res.append((name, per_call(fn, n)))
        torch.cuda.synchronize()
    pr = cProfile.Profile()
    pr.enable()
    for _ in range(n):
        fa4_aot.attention(q, k, v)
    pr.disable()
    torch.cuda.synchronize()
    s = io.StringIO()
    pstats.Stats(pr, stream=s).sort_stats("tottime").print_stats(12)
    print(s.getvalue())
    w = max(len(r[0]) for r in res)
    print(f"host breakdown, 1x128x1x64 bf16, {n} calls each (us per call, host clock, no sync)")
    for name, us in res:
        print(f"{name:<{w}}  {us:7.2f}")
    calls = min(n, 2000)
    hit, grown = length_change(calls)
    form_key = interface._form_key
    interface._form_key = lambda key: None  # no forms: every new length prepared in full
    try:
        _, full = length_change(calls)
    finally:
        interface._form_key = form_key
    print(f"decode 1x1 q, 32/8 heads, hd128, K/V from 2048 keys (us per call, host clock)\n"
          f"  memo hit (same call)                        {hit:7.2f}\n"
          f"  K/V one key longer each call (retargeted)   {grown:7.2f}  ({grown / hit:.2f}x)\n"
          f"  the same, each prepared in full             {full:7.2f}  ({full / hit:.2f}x)")


def length_change(n: int):
    """(memo hit, a call whose K/V grew by one key since the last call), us per call: a
    transformers dynamic-cache decode step at batch 1 (q (1, 1, 32, 128); K/V (1, S, 8, 128)
    views of fresh (1, 8, S, 128) tensors, so their strides change with S too)."""
    import torch

    import fa4_aot
    h, hk, d, s0 = 32, 8, 128, 2048
    q = torch.randn(1, 1, h, d, device="cuda", dtype=torch.bfloat16)
    flat = torch.randn(hk * (s0 + n + 1) * d, device="cuda", dtype=torch.bfloat16)
    kv = [flat[:hk * s * d].view(1, hk, s, d).transpose(1, 2) for s in range(s0, s0 + n + 1)]
    fa4_aot.attention(q, kv[0], kv[0], causal=True)
    hit = per_call(lambda: fa4_aot.attention(q, kv[0], kv[0], causal=True), n)
    it = iter(kv[1:])

    def grown():
        x = next(it)
        fa4_aot.attention(q, x, x, causal=True)
    torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(n):
        grown()
    us = (time.perf_counter() - t) / n * 1e6
    torch.cuda.synchronize()
    return hit, us


if __name__ == "__main__":
    main()
