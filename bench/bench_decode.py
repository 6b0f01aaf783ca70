"""Decode and paged-KV benchmark: fa4_aot (packed GQA + split-KV, paged KV) vs upstream FA4 and cuDNN.

    python bench/bench_decode.py [--set decode,paged,fp8] [--json docs/bench_h200.json]
                                 [--repeats 5] [--iters 20] [--providers fa4_aot,fa4,cudnn]
                                 [--filter TEXT]

Cases (bf16, hd128, causal = bottom-right aligned, the decode convention): B=32 x 8k keys,
B=8 x 32k keys, B=1 x 128k keys; seqlen_q 1 and 4; GQA 32 query / 8 KV heads and MHA 32/32.
Each row records ``kv_bytes`` (bytes of K and V read once) and, per provider, the time, the
achieved bandwidth kv_bytes / t (TB/s) and TFLOP/s (4 * H * D * visible pairs / t).

Timing: CUDA events around ``--iters`` back-to-back calls / iters, median over ``--repeats``,
the repeats taken round the providers in turn (bench/benchlib.py's round_order; ``samples``:
each repeat with the provider that ran just before it). Outputs of
every provider are checked against fa4_aot's (relative max difference, ``!`` when > 2e-2).
``--json`` merges the ``decode`` / ``paged`` groups into the file (other groups are kept).

``paged`` group: the B=32 x 8k, GQA 32/8 decode case with K/V in a shuffled page pool (page
16 and 128; fa4_aot with ``page_table`` + ``seqused_k``, ``fa4_aot:contig`` = the same data as
a contiguous cache, ``fa4`` = FA4's ``flash_attn_varlen_func(page_table=...)``) and a
chunked-prefill mix (8 sequences of 2,048 cached tokens, pages of 64, 128 and 256, each with a
new chunk of 256 query tokens packed with cu_seqlens_q, causal). Needs a GPU.

``fp8`` group (issue 54's rows): fa4_aot with an e4m3 KV cache (``fa4_aot``; ``:qkv`` rows
with an e4m3 q too) against fa4_aot in bf16 on the same values (``bf16``: the e4m3 values
widened, descales 1, so the outputs agree to bf16 rounding) - decode B=32 x 8k 32/8
contiguous and paged (page 16), B=8 x 32k, B=1 x 128k, and the prefill shape 2x16x8k hd128
(the FP8 prefill kernels; their time includes the per-call transpose of V); ``speedup`` =
bf16 time / fp8 time. Plus torch's ``_scaled_mm`` e4m3 8192^3 as the FP8 matmul limit (TFLOP/s).
The group sets FA4_AOT_EXPERIMENTAL_FP8=1 for itself (docs/design.md#fp8).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from bench.benchlib import event_time, samples, timed_rounds  # noqa: E402

CASES = [  # (batch, seqlen_q, seqlen_k, heads, kv_heads)
    (b, sq, sk, 32, hk)
    for (b, sk) in ((32, 8192), (8, 32768), (1, 131072))
    for sq in (1, 4)
    for hk in (8, 32)
]
HEAD_DIM = 128
HBM_TBS = 4.8  # H200 datasheet


def label(b, sq, sk, h, hk):
    return f"B{b} sq{sq} sk{sk // 1024}k {h}/{hk}"


def kv_bytes(b, sk, hk, d=HEAD_DIM, elem=2):
    return 2 * b * sk * hk * d * elem


def visible_pairs(sq, sk):  # causal, bottom-right: row i sees sk - sq + i + 1 keys
    return sum(min(sk, sk - sq + i + 1) for i in range(sq))


def providers_available(names):
    out = {}
    for p in names:
        if p == "fa4_aot":
            import fa4_aot
            out[p] = lambda q, k, v: fa4_aot.attention(q, k, v, causal=True)
        elif p == "fa4":
            try:
                from flash_attn.cute.interface import flash_attn_func
            except Exception as e:  # noqa: BLE001 - report and skip
                print(f"fa4 skipped: {type(e).__name__}: {e}")
                continue
            out[p] = lambda q, k, v, f=flash_attn_func: _first(f(q, k, v, causal=True))
        elif p == "cudnn":
            out[p] = _cudnn
        else:
            raise SystemExit(f"unknown provider {p!r}")
    return out


def _first(x):
    return x[0] if isinstance(x, tuple) else x


def _cudnn(q, k, v):
    import torch
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel
    sq, sk = q.shape[1], k.shape[1]
    # Bottom-right causal mask as a boolean mask would cost a mask read; for sq == 1 it is
    # no mask at all, for sq > 1 the last sq rows of a causal (sk x sk) block.
    mask = None
    if sq > 1:
        mask = torch.ones(sq, sk, dtype=torch.bool, device=q.device).tril(sk - sq)
    with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
        o = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2),
                                           v.transpose(1, 2), attn_mask=mask,
                                           enable_gqa=k.shape[2] != q.shape[2])
    return o.transpose(1, 2)


def time_calls(fn, iters):
    return event_time(fn, iters)


PAGED_CASES = [  # (label, batch, seqlen_q (per sequence), cached keys, heads, kv_heads, page)
    ("decode B32 sk8k 32/8 page16", 32, 1, 8192, 32, 8, 16),
    ("decode B32 sk8k 32/8 page128", 32, 1, 8192, 32, 8, 128),
    ("chunked prefill 8x(2k+256) page64", 8, 256, 2048 + 256, 32, 8, 64),
    ("chunked prefill 8x(2k+256) page128", 8, 256, 2048 + 256, 32, 8, 128),
    ("chunked prefill 8x(2k+256) page256", 8, 256, 2048 + 256, 32, 8, 256),
]


def paged_inputs(b, sq, sk, h, hk, page):
    """q packed as (b * sq, h, d) with cu_seqlens_q when sq > 1 (chunked prefill), else
    (b, 1, h, d); k/v in a shuffled pool of pages; the same k/v contiguous (b, sk, hk, d)."""
    import torch
    d = HEAD_DIM
    pages = -(-sk // page)
    perm = torch.randperm(b * pages, device="cuda").to(torch.int32)
    table = perm.view(b, pages).contiguous()
    kc = torch.randn(b * pages, page, hk, d, device="cuda", dtype=torch.bfloat16)
    vc = torch.randn_like(kc)
    k = kc[perm.long()].view(b, pages * page, hk, d)[:, :sk].contiguous()
    v = vc[perm.long()].view(b, pages * page, hk, d)[:, :sk].contiguous()
    used = torch.full((b,), sk, dtype=torch.int32, device="cuda")
    if sq > 1:
        q = torch.randn(b * sq, h, d, device="cuda", dtype=torch.bfloat16)
        cu_q = uniform_offsets(b, sq)
    else:
        q = torch.randn(b, 1, h, d, device="cuda", dtype=torch.bfloat16)
        cu_q = None
    return q, kc, vc, table, used, k, v, cu_q


def paged_providers(names, sq, inp):
    import fa4_aot
    q, kc, vc, table, used, k, v, cu_q = inp
    var = {} if cu_q is None else {"cu_seqlens_q": cu_q, "max_seqlen_q": sq}
    out = {}
    for p in names:
        if p == "fa4_aot":
            out[p] = lambda: fa4_aot.attention(q, kc, vc, causal=True, page_table=table,
                                               seqused_k=used, **var)
            if cu_q is None:  # the same data, contiguous
                out["fa4_aot:contig"] = lambda: fa4_aot.attention(q, k, v, causal=True)
            else:
                cu_k = uniform_offsets(cu_q.numel() - 1, k.shape[1])
                kp, vp = k.reshape(-1, *k.shape[2:]), v.reshape(-1, *v.shape[2:])
                out["fa4_aot:contig"] = lambda: fa4_aot.attention(
                    q, kp, vp, causal=True, cu_seqlens_k=cu_k, max_seqlen_k=k.shape[1], **var)
        elif p == "fa4":
            try:
                from flash_attn.cute.interface import flash_attn_varlen_func as f
            except Exception as e:  # noqa: BLE001
                print(f"fa4 skipped: {type(e).__name__}: {e}")
                continue
            out[p] = lambda f=f: _first(f(q, kc, vc, page_table=table, seqused_k=used,
                                          causal=True, **var))
    return out


def uniform_offsets(n, step):
    """int32 cu_seqlens of ``n`` packed sequences of ``step`` tokens each, on the GPU."""
    import torch
    return torch.arange(0, n * step + 1, step, dtype=torch.int32, device="cuda")


FP8_CASES = [  # (label, batch, seqlen_q, seqlen_k, heads, kv_heads, page, e4m3 q, causal[, d])
    ("decode B32 sk8k 32/8", 32, 1, 8192, 32, 8, 0, False, True),
    ("decode B32 sk8k 32/8 page16", 32, 1, 8192, 32, 8, 16, False, True),
    ("decode B32 sk8k 32/8 :qkv", 32, 1, 8192, 32, 8, 0, True, True),
    ("decode B8 sk32k 32/8", 8, 1, 32768, 32, 8, 0, False, True),
    ("decode B1 sk128k 32/8", 1, 1, 131072, 32, 8, 0, False, True),
    ("prefill 2x16x8k :qkv", 2, 8192, 8192, 16, 16, 0, True, False),
    ("prefill 2x16x8k causal :qkv", 2, 8192, 8192, 16, 16, 0, True, True),
    ("prefill 2x16x8k", 2, 8192, 8192, 16, 16, 0, False, False),
    ("prefill 2x16x8k causal", 2, 8192, 8192, 16, 16, 0, False, True),
    ("prefill 4x32/8x4k causal", 4, 4096, 4096, 32, 8, 0, False, True),
    ("prefill 2x8x8k causal hd256", 2, 8192, 8192, 8, 8, 0, False, True, 256),
    # chunked prefill: 512 new tokens of each of 8 sequences over 8k paged keys (page 64)
    ("chunked 8x512 over 8k page64", 8, 512, 8192, 32, 8, 64, False, True),
]


def fp8_inputs(b, sq, sk, h, hk, page, fp8_q, causal, d=HEAD_DIM):
    """(fp8 call, bf16 call) on the same values: e4m3 K/V (and q) with descales 1, and their
    exact bf16 widening; paged: a shuffled pool of pages with page_table + seqused_k, and with
    more than one query a sequence, q packed with cu_seqlens_q (chunked prefill)."""
    import torch
    import fa4_aot
    e4m3 = torch.float8_e4m3fn
    q8 = torch.randn(b, sq, h, d, device="cuda").to(e4m3)
    ones = torch.ones(b, hk, device="cuda")
    paged = {}
    if page:
        pages = -(-sk // page)
        k8 = torch.randn(b * pages, page, hk, d, device="cuda").to(e4m3)
        paged = {"page_table": torch.randperm(b * pages, device="cuda").int().view(b, pages),
                 "seqused_k": torch.full((b,), sk, dtype=torch.int32, device="cuda")}
        if sq > 1:
            q8 = q8.view(b * sq, h, d)
            paged.update(cu_seqlens_q=uniform_offsets(b, sq), max_seqlen_q=sq)
    else:
        k8 = torch.randn(b, sk, hk, d, device="cuda").to(e4m3)
    v8 = torch.randn_like(k8, dtype=torch.float32).to(e4m3)
    q = q8 if fp8_q else q8.to(torch.bfloat16)
    qb, kb, vb = (x.to(torch.bfloat16) for x in (q8, k8, v8))
    qd = ones if fp8_q else None
    return {"fa4_aot": lambda: fa4_aot.attention(q, k8, v8, causal=causal, q_descale=qd,
                                                 k_descale=ones, v_descale=ones, **paged),
            "bf16": lambda: fa4_aot.attention(qb, kb, vb, causal=causal, **paged)}


def scaled_mm_tflops(n=8192, iters=20):
    """torch._scaled_mm on e4m3 n x n x n (bf16 out): the FP8 matmul rate, TFLOP/s."""
    import torch
    a = torch.randn(n, n, device="cuda").to(torch.float8_e4m3fn)
    bt = torch.randn(n, n, device="cuda").to(torch.float8_e4m3fn).t()
    one = torch.ones((), device="cuda")
    f = lambda: torch._scaled_mm(a, bt, one, one, out_dtype=torch.bfloat16)  # noqa: E731
    for _ in range(3):
        f()
    ms = statistics.median(event_time(f, iters) for _ in range(5))
    return 2 * n ** 3 / (ms * 1e-3) / 1e12


def run_fp8(a):
    import os

    import torch
    from fa4_aot.validate import FP8_ENV
    os.environ[FP8_ENV] = "1"
    rows = []
    for (lab, b, sq, sk, h, hk, page, fp8_q, causal, *dim) in FP8_CASES:
        if a.filter and a.filter not in lab:
            continue
        d = dim[0] if dim else HEAD_DIM
        res = measure(fp8_inputs(b, sq, sk, h, hk, page, fp8_q, causal, d), a.repeats, a.iters)
        kvb = kv_bytes(b, sk, hk, d, elem=1)
        flops = 4 * h * d * b * (visible_pairs(sq, sk) if causal else sq * sk)
        prov = _summarise(res, kvb, flops)
        f8, bf = prov["fa4_aot"].get("us"), prov["bf16"].get("us")
        rows.append({"group": "fp8", "label": lab,
                     "case": {"batch": b, "seqlen_q": sq, "seqlen_k": sk, "heads": h,
                              "kv_heads": hk, "head_dim": d, "causal": causal,
                              "page_size": page, "dtype": "e4m3" if fp8_q else "bf16+e4m3kv",
                              "kv_bytes": kvb, "flops": flops},
                     "providers": prov,
                     "speedup": round(bf / f8, 3) if f8 and bf else None})
        print_row(rows[-1], list(res))
        torch.cuda.empty_cache()
    if not a.filter or a.filter in "scaled_mm":
        t = scaled_mm_tflops()
        rows.append({"group": "fp8", "label": "limit: torch._scaled_mm e4m3 8192^3",
                     "case": {"m": 8192, "n": 8192, "k": 8192, "dtype": "e4m3"},
                     "providers": {"scaled_mm": {"tflops": round(t, 1)}}})
        print(f"{rows[-1]['label']:<34} {t:.0f} TFLOP/s", flush=True)
    return rows, ["fa4_aot", "bf16"]


def fp8_table(rows) -> str:
    lines = [f"{'case':<34} {'fp8 us':>9} {'bf16 us':>9} {'speedup':>8} {'fp8 TB/s':>9}"]
    for row in rows:
        pr = row["providers"]
        if "scaled_mm" in pr:
            lines.append(f"{row['label']:<34} {pr['scaled_mm']['tflops']:9.0f} TFLOP/s")
            continue
        f8, bf = pr.get("fa4_aot", {}), pr.get("bf16", {})
        sp = row.get("speedup")
        lines.append(f"{row['label']:<34} {f8.get('us') or float('nan'):9.1f} "
                     f"{bf.get('us') or float('nan'):9.1f} "
                     f"{(f'{sp:.2f}x' if sp else '-'):>8} {f8.get('tb_s') or float('nan'):9.2f}")
    return "\n".join(lines)


def run_paged(a):
    import torch
    names = [p.strip() for p in a.providers.split(",") if p.strip() and p.strip() != "cudnn"]
    rows, provs_seen = [], []
    for (lab, b, sq, sk, h, hk, page) in PAGED_CASES:
        if a.filter and a.filter not in lab:
            continue
        inp = paged_inputs(b, sq, sk, h, hk, page)
        fns = paged_providers(names, sq, inp)
        res = measure(fns, a.repeats, a.iters)
        kvb = kv_bytes(b, sk, hk)
        flops = 4 * h * HEAD_DIM * b * visible_pairs(sq, sk)
        rows.append({"group": "paged", "label": lab,
                     "case": {"batch": b, "seqlen_q": sq, "seqlen_k": sk, "heads": h,
                              "kv_heads": hk, "head_dim": HEAD_DIM, "causal": True,
                              "page_size": page, "dtype": "bf16", "kv_bytes": kvb,
                              "flops": flops},
                     "providers": _summarise(res, kvb, flops)})
        provs_seen += [p for p in res if p not in provs_seen]
        print_row(rows[-1], list(res))
        del inp, fns
        torch.cuda.empty_cache()
    return rows, provs_seen


def measure(fns, repeats, iters):
    """{provider: callable} -> {provider: {"times", "after", "max_diff", "note"}}: every
    provider's output checked against the first one's (relative max difference), two warm-ups,
    then the repeats taken round the providers in turn (``benchlib.timed_rounds``; ``after``:
    the provider that ran just before each repeat). A provider that raises is recorded with its
    error and not timed."""
    import torch
    res, ok, ref = {}, {}, None
    for p, f in fns.items():
        try:
            out = f()
            torch.cuda.synchronize()
            ref = out.float() if ref is None else ref
            res[p] = {"times": [], "note": "",
                      "max_diff": ((out.float() - ref).abs().max() / ref.abs().max()).item()}
            for _ in range(2):
                time_calls(f, 3)
            ok[p] = f
        except Exception as e:  # noqa: BLE001 - a provider that cannot run this case
            res[p] = {"times": [], "note": f"{type(e).__name__}: {str(e)[:120]}"}
    timed = timed_rounds(list(ok), repeats, lambda p: time_calls(ok[p], iters),
                         first_after=next(reversed(ok), None))
    for p, (times, after) in timed.items():
        res[p]["times"], res[p]["after"] = times, after
    return res


def _summarise(res, kvb, flops):
    out = {}
    for p, r in res.items():
        ms = statistics.median(r["times"]) if r["times"] else None
        out[p] = {"ms": ms, "us": None if ms is None else round(ms * 1e3, 2),
                  "tb_s": None if ms is None else round(kvb / (ms * 1e-3) / 1e12, 3),
                  "tflops": None if ms is None else round(flops / (ms * 1e-3) / 1e12, 2),
                  "max_diff": r.get("max_diff"), "note": r["note"]}
        if r["times"]:
            out[p]["samples"] = samples(r["times"], r["after"])
    return out


def run(a):
    import torch
    provs = providers_available([p.strip() for p in a.providers.split(",") if p.strip()])
    rows = []
    for case in CASES:
        b, sq, sk, h, hk = case
        lab = label(*case)
        if a.filter and a.filter not in lab:
            continue
        q = torch.randn(b, sq, h, HEAD_DIM, device="cuda", dtype=torch.bfloat16)
        k = torch.randn(b, sk, hk, HEAD_DIM, device="cuda", dtype=torch.bfloat16)
        v = torch.randn_like(k)
        res = measure({p: (lambda f=f, q=q, k=k, v=v: f(q, k, v)) for p, f in provs.items()},
                      a.repeats, a.iters)
        kvb = kv_bytes(b, sk, hk)
        flops = 4 * h * HEAD_DIM * b * visible_pairs(sq, sk)
        prov_out = _summarise(res, kvb, flops)
        rows.append({"group": "decode", "label": lab,
                     "case": {"batch": b, "seqlen_q": sq, "seqlen_k": sk, "heads": h,
                              "kv_heads": hk, "head_dim": HEAD_DIM, "causal": True,
                              "dtype": "bf16", "kv_bytes": kvb, "flops": flops},
                     "providers": prov_out})
        print_row(rows[-1], list(provs))
        del q, k, v
        torch.cuda.empty_cache()
    return rows, list(provs)


def print_row(row, provs):
    cells = []
    for p in provs:
        r = row["providers"].get(p, {})
        if r.get("us") is None:
            cells.append(f"{p}: -")
        else:
            bad = "!" if (r.get("max_diff") or 0) > 2e-2 else ""
            cells.append(f"{p}: {r['us']:8.1f} us {r['tb_s']:5.2f} TB/s{bad}")
    print(f"{row['label']:<34} " + " | ".join(cells), flush=True)


def table(rows, provs) -> str:
    lines = [f"{'case':<34} {'KV GB':>6} " + " ".join(f"{p + ' us':>16} {'TB/s':>5}" for p in provs)
             + "  fa4_aot/fa4  %HBM"]
    for row in rows:
        pr = row["providers"]
        cells = []
        for p in provs:
            r = pr.get(p, {})
            cells.append(f"{r.get('us') or float('nan'):16.1f} {r.get('tb_s') or float('nan'):5.2f}")
        a, f = pr.get("fa4_aot", {}).get("us"), pr.get("fa4", {}).get("us")
        ratio = f"{f / a:11.2f}x" if a and f else f"{'-':>12}"
        hbm = pr.get("fa4_aot", {}).get("tb_s")
        lines.append(f"{row['label']:<34} {row['case']['kv_bytes'] / 1e9:6.2f} " + " ".join(cells)
                     + f"  {ratio} {100 * hbm / HBM_TBS if hbm else float('nan'):4.0f}%")
    return "\n".join(lines)


def merge_json(path, group, rows, provs, meta):
    """Replace ``group``'s rows in the benchmark file, keep every other group; this run's meta
    goes to ``meta.group_meta[group]``, where bench_fwd.py's merge keeps it."""
    p = Path(path)
    doc = json.loads(p.read_text()) if p.is_file() else {"rows": [], "providers": []}
    doc["rows"] = [r for r in doc.get("rows", []) if r.get("group") != group] + rows
    doc["providers"] = list(dict.fromkeys(list(doc.get("providers", [])) + provs))
    doc.setdefault("meta", {}).setdefault("group_meta", {})[group] = meta
    p.write_text(json.dumps(doc, indent=1))


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--json")
    ap.add_argument("--providers", default="fa4_aot,fa4,cudnn")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--filter")
    ap.add_argument("--set", default="decode,paged")
    a = ap.parse_args(argv)
    runs = {"decode": run, "paged": run_paged, "fp8": run_fp8}
    groups = [g.strip() for g in a.set.split(",") if g.strip()]
    unknown = [g for g in groups if g not in runs]
    if unknown:
        raise SystemExit(f"--set: unknown group {unknown[0]!r}; groups: {', '.join(runs)}")
    import torch
    import datetime
    meta = {"device": torch.cuda.get_device_name(), "torch": torch.__version__,
            "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
            "command": "python bench/bench_decode.py " + " ".join(argv if argv is not None
                                                                 else sys.argv[1:]),
            "iters": a.iters, "repeats": a.repeats, "hbm_tb_s": HBM_TBS}
    try:
        from importlib.metadata import version
        meta["flash_attn"] = version("flash-attn-4")
    except Exception:  # noqa: BLE001
        pass
    tables = []
    for group in groups:
        rows, provs = runs[group](a)
        if a.json:
            merge_json(a.json, group, rows, provs, meta)
        tables.append(fp8_table(rows) if group == "fp8" else table(rows, provs))
    print()
    print("\n\n".join(tables))


if __name__ == "__main__":
    main()
