"""Decode / short-query benchmark: fa4_aot (packed GQA + split-KV) vs upstream FA4 and cuDNN SDPA.

    python bench/bench_decode.py [--json docs/bench_h200.json] [--repeats 5] [--iters 20]
                                 [--providers fa4_aot,fa4,cudnn] [--filter TEXT]

Cases (bf16, hd128, causal = bottom-right aligned, the decode convention): B=32 x 8k keys,
B=8 x 32k keys, B=1 x 128k keys; seqlen_q 1 and 4; GQA 32 query / 8 KV heads and MHA 32/32.
Each row records ``kv_bytes`` (bytes of K and V read once) and, per provider, the time, the
achieved bandwidth kv_bytes / t (TB/s) and TFLOP/s (4 * H * D * visible pairs / t).

Timing: CUDA events around ``--iters`` back-to-back calls / iters, median over ``--repeats``,
the repeats taken round the providers in turn (order reversed every other round). Outputs of
every provider are checked against fa4_aot's (relative max difference, ``!`` when > 2e-2).
``--json`` merges the ``decode`` group into the file (other groups are kept). Needs a GPU.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

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
    import torch  # noqa: F401
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
    import torch
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(iters):
        fn()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / iters


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
        res, ref = {}, None
        fns = {}
        for p, f in provs.items():
            try:
                out = f(q, k, v)
                torch.cuda.synchronize()
                fns[p] = (lambda f=f: f(q, k, v))
                if ref is None:
                    ref = out.float()
                diff = ((out.float() - ref).abs().max() / ref.abs().max()).item()
                res[p] = {"times": [], "max_diff": diff, "note": ""}
                for _ in range(2):
                    time_calls(fns[p], 3)
            except Exception as e:  # noqa: BLE001 - a provider that cannot run this case
                res[p] = {"times": [], "note": f"{type(e).__name__}: {str(e)[:120]}"}
        order = list(fns)
        for r in range(a.repeats):
            for p in (order if r % 2 == 0 else order[::-1]):
                res[p]["times"].append(time_calls(fns[p], a.iters))
        kvb = kv_bytes(b, sk, hk)
        flops = 4 * h * HEAD_DIM * b * visible_pairs(sq, sk)
        prov_out = {}
        for p, r in res.items():
            ms = statistics.median(r["times"]) if r["times"] else None
            prov_out[p] = {"ms": ms, "us": None if ms is None else round(ms * 1e3, 2),
                           "tb_s": None if ms is None else round(kvb / (ms * 1e-3) / 1e12, 3),
                           "tflops": None if ms is None else round(flops / (ms * 1e-3) / 1e12, 2),
                           "max_diff": r.get("max_diff"), "note": r["note"]}
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
    print(f"{row['label']:<24} " + " | ".join(cells), flush=True)


def table(rows, provs) -> str:
    lines = [f"{'case':<24} {'KV GB':>6} " + " ".join(f"{p + ' us':>12} {'TB/s':>5}" for p in provs)
             + "  fa4_aot/fa4  %HBM"]
    for row in rows:
        pr = row["providers"]
        cells = []
        for p in provs:
            r = pr.get(p, {})
            cells.append(f"{r.get('us') or float('nan'):12.1f} {r.get('tb_s') or float('nan'):5.2f}")
        a, f = pr.get("fa4_aot", {}).get("us"), pr.get("fa4", {}).get("us")
        ratio = f"{f / a:11.2f}x" if a and f else f"{'-':>12}"
        hbm = pr.get("fa4_aot", {}).get("tb_s")
        lines.append(f"{row['label']:<24} {row['case']['kv_bytes'] / 1e9:6.2f} " + " ".join(cells)
                     + f"  {ratio} {100 * hbm / HBM_TBS if hbm else float('nan'):4.0f}%")
    return "\n".join(lines)


def merge_json(path, group, rows, provs, meta):
    """Replace ``group``'s rows in the benchmark file, keep every other group."""
    p = Path(path)
    doc = json.loads(p.read_text()) if p.is_file() else {"rows": [], "providers": []}
    doc["rows"] = [r for r in doc.get("rows", []) if r.get("group") != group] + rows
    doc["providers"] = list(dict.fromkeys(list(doc.get("providers", [])) + provs))
    doc.setdefault("meta", {})[group] = meta
    p.write_text(json.dumps(doc, indent=1))


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--json")
    ap.add_argument("--providers", default="fa4_aot,fa4,cudnn")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--filter")
    a = ap.parse_args(argv)
    import torch
    rows, provs = run(a)
    meta = {"device": torch.cuda.get_device_name(), "torch": torch.__version__,
            "iters": a.iters, "repeats": a.repeats, "hbm_tb_s": HBM_TBS}
    if a.json:
        merge_json(a.json, "decode", rows, provs, meta)
    print()
    print(table(rows, provs))


if __name__ == "__main__":
    main()
