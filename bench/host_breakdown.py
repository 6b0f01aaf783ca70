"""Where the host time of one small fa4_aot call goes (GPU): the whole call, its parts timed
alone, and a cProfile of the call; then a decode step whose K/V are one key longer than the
last call's (a dynamic KV cache: new shapes and strides every call) against the same call
repeated (a memo hit), with retargeting (docs/design.md#the-runtime-and-the-host-path) and with
every new length prepared in full. Prints tables; no file.

    python bench/host_breakdown.py [--n 20000]
    python bench/host_breakdown.py --cpu   # no GPU: the length-change table only, on CPU
                                           # tensors through tests/fakecuda.py's driver

``--cpu`` times the Python of the host path (the installed manifest, a fake launch and a fake
descriptor encoder), not the driver's or the allocator's part: a regression check of the miss
path between GPU runs, not a figure for the README.
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
    ap.add_argument("--cpu", action="store_true",
                    help="the length-change table on the CPU with a fake driver (no GPU)")
    a = ap.parse_args(argv)
    if a.cpu:
        return length_change_table(min(a.n, 2000), "cpu")
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
    length_change_table(min(n, 2000), "cuda")


def length_change_table(calls: int, device: str):
    from fa4_aot import interface
    undo = _fake_cuda() if device == "cpu" else None
    try:
        hit, grown = length_change(calls, device)
        form_key = interface._form_key
        interface._form_key = lambda key: None  # no forms: every new length prepared in full
        try:
            _, full = length_change(calls, device)
        finally:
            interface._form_key = form_key
    finally:
        if undo is not None:
            undo.undo()
            interface.clear_memo()  # its entries launch through the fake driver
    print(f"decode 1x1 q, 32/8 heads, hd128, K/V from 2048 keys (us per call, host clock"
          f"{', CPU tensors, fake driver' if device == 'cpu' else ''})\n"
          f"  memo hit (same call)                        {hit:7.2f}\n"
          f"  K/V one key longer each call (retargeted)   {grown:7.2f}  ({grown / hit:.2f}x)\n"
          f"  the same, each prepared in full             {full:7.2f}  ({full / hit:.2f}x)")


def _fake_cuda():
    """tests/fakecuda.py's driver under the installed manifest (its fake one where none is
    built), descriptors encoded by a ctypes call as on a GPU (of a stand-in that only writes
    the address): the undo handle."""
    import ctypes

    from _pytest.monkeypatch import MonkeyPatch

    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
    import fakecuda

    from fa4_aot import interface, runtime
    from fa4_aot.manifest import ManifestError, load_manifest
    mp = MonkeyPatch()
    drv = fakecuda.install(mp)
    drv.record = False

    def encode(out, dtype, rank, address, *rest):
        ctypes.cast(out, ctypes.POINTER(ctypes.c_uint64))[3] = address or 0
        return 0
    fn = ctypes.CFUNCTYPE(ctypes.c_int, *runtime._ENCODE_ARGS)(encode)
    mp.setattr(runtime, "_encoder", (fn, {x: 0 for x in (*runtime._TMA_DTYPE, *runtime._SWIZZLE,
                                                       *runtime._L2, *runtime._OOB)}, 0))
    try:
        manifest = load_manifest()
        mp.setattr(interface, "load_manifest", lambda: manifest)
    except ManifestError as e:
        print(f"(no built manifest: {e}; the fake one)")
    return mp


def length_change(n: int, device: str = "cuda"):
    """(memo hit, a call whose K/V grew by one key since the last call), us per call: a
    transformers dynamic-cache decode step at batch 1 (q (1, 1, 32, 128); K/V (1, S, 8, 128)
    views of fresh (1, 8, S, 128) tensors, so their strides change with S too)."""
    import torch

    import fa4_aot
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    h, hk, d, s0 = 32, 8, 128, 2048
    q = torch.randn(1, 1, h, d, device=device, dtype=torch.bfloat16)
    flat = torch.randn(hk * (s0 + n + 1) * d, device=device, dtype=torch.bfloat16)
    kv = [flat[:hk * s * d].view(1, hk, s, d).transpose(1, 2) for s in range(s0, s0 + n + 1)]
    fa4_aot.attention(q, kv[0], kv[0], causal=True)
    hit = per_call(lambda: fa4_aot.attention(q, kv[0], kv[0], causal=True), n)
    it = iter(kv[1:])

    def grown():
        x = next(it)
        fa4_aot.attention(q, x, x, causal=True)
    sync()
    t = time.perf_counter()
    for _ in range(n):
        grown()
    us = (time.perf_counter() - t) / n * 1e6
    sync()
    return hit, us


if __name__ == "__main__":
    main()
