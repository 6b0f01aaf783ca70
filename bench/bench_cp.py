"""Context-parallel attention benchmark (issue 18): fa4_aot.distributed.context_parallel_attention
on N GPUs against single-GPU fa4_aot on the same total problem.

    export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1
    torchrun --nproc-per-node 2 bench/bench_cp.py [--json docs/bench_h200.json]
        [--seqlen 131072] [--heads 16] [--heads-k 0] [--head-dim 128] [--batch 1] [--no-causal]
        [--comm ring,allgather] [--iters 5] [--repeats 5]

Default problem: 1 x 128k tokens, 16 heads, hd128, bf16, causal. Every rank builds the whole
problem from one seed and takes its zigzag shard (fa4_aot.distributed.shard).
Time: CUDA events around ``iters`` back-to-back calls / iters, after a barrier, median over
``repeats`` taken round the providers in turn (``benchlib.round_order``). The CP time
of a repeat is the slowest rank's; the single-GPU time is the fastest rank's (every rank times
the whole problem on its own GPU at the same moment), so the scaling efficiency is not
flattered. TFLOP/s = 4*B*H*D*(visible (q, k) pairs) / t (causal: S(S+1)/2 pairs), for CP the
whole problem's FLOPs over the CP time (per GPU: divided by N). Scaling efficiency =
(t_single / t_cp) / N. Correctness: the gathered CP output and single-GPU fa4_aot are both
checked on sampled query rows against an fp32 reference by the FlashAttention rule
(fa4_aot.testing.check_close), and against each other.

``--json`` merges a ``cp`` group into the file (rows with group / label / case / providers;
providers ``fa4_aot:cp<N>`` (ring), ``fa4_aot:cp<N>:allgather`` and ``fa4_aot``, each with
``ms`` and ``tflops``, the CP ones also ``tflops_per_gpu``, ``speedup_vs_fa4_aot`` and
``scaling_efficiency``); the rows of every other group are kept. ``--merge-from FILE --json F``
(no GPU) copies the cp rows of a file written elsewhere into F. A short table is printed last.
``--device cpu`` runs the script on gloo with the reference attention (a smoke test, not a
benchmark).
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import platform
import statistics
import sys
from pathlib import Path

os.environ["NCCL_NVLS_ENABLE"] = "0"  # never NVLink multicast on the lent machines
os.environ["TORCH_SYMM_MEM_DISABLE_MULTICAST"] = "1"

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import benchlib as bl  # noqa: E402

GROUP = "cp"


def cp_rows(case, world, results, scaling, meta_note=""):
    """Rows for the bench file. ``results``: provider -> dict(ms, method, note, max_diff,
    mismatch, error, gpus)."""
    flops = case.flops()
    provs = {}
    for p, r in results.items():
        t = bl.tflops(flops, r.get("ms"))
        gpus = r.get("gpus", 1)
        d = {"ms": r.get("ms"), "method": r.get("method", ""), "note": r.get("note", meta_note),
             "max_diff": r.get("max_diff"), "mismatch": bool(r.get("mismatch", False)),
             "error": r.get("error", ""),
             "tflops": None if t is None else round(t, 2),
             "tflops_per_gpu": None if t is None else round(t / gpus, 2), "gpus": gpus}
        if p in scaling:
            d.update(scaling[p])
        provs[p] = d
    return [{"group": GROUP, "label": case.label, "case": case.to_dict(), "providers": provs}]


def merge_into_file(path, rows, meta):
    """Replace the ``cp`` rows of the bench file, keep every other group and the file's meta
    (this run's meta goes to meta.group_meta.cp)."""
    p = Path(path)
    doc = json.loads(p.read_text()) if p.is_file() else {"rows": [], "providers": []}
    doc["rows"] = [r for r in doc.get("rows", []) if r.get("group") != GROUP] + rows
    doc.setdefault("meta", {}).setdefault("group_meta", {})[GROUP] = meta
    doc.setdefault("providers", [])
    p.write_text(json.dumps(doc, indent=1))
    return doc


def _num(x):
    return "n/a" if x is None else f"{x:.1f}"


def table(rows) -> str:
    lines = [f"{'case':<34} {'provider':<24} {'ms':>9} {'TFLOP/s':>8} {'per GPU':>8} "
             f"{'speedup':>8} {'effic.':>7}"]
    for row in rows:
        for p, r in row["providers"].items():
            sp, ef = r.get("speedup_vs_fa4_aot"), r.get("scaling_efficiency")
            ms = r.get("ms")
            lines.append(
                f"{row['label']:<34} {p:<24} {'n/a' if ms is None else f'{ms:9.2f}':>9} "
                f"{_num(r.get('tflops')):>8} {_num(r.get('tflops_per_gpu')):>8} "
                f"{'' if sp is None else f'{sp:.2f}x':>8} {'' if ef is None else f'{100 * ef:.1f}%':>7}"
                + ("  MISMATCH" if r.get("mismatch") else "") + (f"  {r['error']}" if r.get("error")
                                                                 else ""))
    return "\n".join(lines)


# ------------------------------------------------------------------------------- GPU part
def sampled_check(out, q, k, v, causal, rows, what):
    """The FA rule (check_close) on the query rows ``rows`` of the whole problem: fp32 reference
    and the same math in the input dtype, computed for those rows only."""
    import torch
    from fa4_aot.testing import check_close
    b, s, h, d = q.shape
    hk = k.shape[2]
    scale = 1.0 / math.sqrt(d)
    errs = []
    for lo in range(0, len(rows), 64):
        idx = rows[lo:lo + 64]
        ref, ref_pt = [], []
        for up in (True, False):
            qq = q[:, idx].float() if up else q[:, idx]
            kk = (k.float() if up else k).repeat_interleave(h // hk, dim=2)
            vv = (v.float() if up else v).repeat_interleave(h // hk, dim=2)
            sc = torch.einsum("bqhd,bkhd->bhqk", qq * scale, kk)
            if causal:
                col = torch.arange(s, device=q.device).view(1, -1)
                sc = sc.masked_fill(col > idx.view(-1, 1), float("-inf"))
            p = torch.softmax(sc, dim=-1)
            o = torch.einsum("bhqk,bkhd->bqhd", p.to(vv.dtype), vv)
            (ref if up else ref_pt).append(o)
            del sc, p, kk, vv
        errs.append(check_close(out[:, idx], ref[0], ref_pt[0], what=what))
    return max(e for e, _ in errs), max(bd for _, bd in errs)


def _nccl_version(torch):
    try:
        v = torch.cuda.nccl.version()
    except Exception:  # noqa: BLE001
        return None
    return ".".join(map(str, v)) if isinstance(v, (tuple, list)) else str(v)


def _sync(dev):
    import torch
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)


def _ref_attention(q, k, v, causal=False, softmax_scale=None, window_size=(-1, -1), **kw):
    """--device cpu (a smoke test of this script, not a benchmark): the fp32 reference, output in
    the input dtype, same (out, lse) layouts as fa4_aot.attention(return_lse=True)."""
    from fa4_aot.testing import attention_ref
    o, lse = attention_ref(q, k, v, causal=causal, softmax_scale=softmax_scale,
                           window_size=window_size, **kw)
    return o.to(q.dtype), lse


def time_calls(fn, iters, dev):
    import time

    if dev.type != "cuda":
        t0 = time.perf_counter()
        for _ in range(iters):
            fn()
        return (time.perf_counter() - t0) * 1e3 / iters
    return bl.event_time(fn, iters)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--json")
    ap.add_argument("--seqlen", type=int, default=131072)
    ap.add_argument("--heads", type=int, default=16)
    ap.add_argument("--heads-k", type=int, default=0)
    ap.add_argument("--head-dim", type=int, default=128)
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--dtype", default="bf16", choices=["bf16", "fp16"])
    ap.add_argument("--no-causal", action="store_true")
    ap.add_argument("--comm", default="ring,allgather")
    ap.add_argument("--iters", type=int, default=5)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--check-rows", type=int, default=256)
    ap.add_argument("--device", default="cuda", choices=["cuda", "cpu"],
                    help="cpu: gloo and the reference attention -- a smoke test of the script")
    ap.add_argument("--merge-from", metavar="FILE",
                    help="no run: copy the cp rows of FILE (a bench file written by a run "
                         "elsewhere) into --json, keeping its other groups, and print the table")
    a = ap.parse_args(argv)
    if a.merge_from:
        if not a.json:
            ap.error("--merge-from needs --json (the file to merge into)")
        src = json.loads(Path(a.merge_from).read_text())
        rows = [r for r in src.get("rows", []) if r.get("group") == GROUP]
        if not rows:
            ap.error(f"no '{GROUP}' rows in {a.merge_from}")
        merge_into_file(a.json, rows, src.get("meta", {}).get("group_meta", {}).get(GROUP, {}))
        print(f"merged {len(rows)} '{GROUP}' row(s) from {a.merge_from} into {a.json}")
        print(table(rows))
        return 0
    comms = [c.strip() for c in a.comm.split(",") if c.strip()]
    if not comms or not set(comms) <= {"ring", "allgather"}:
        ap.error(f"--comm: a comma list of ring, allgather; got {a.comm!r}")

    import torch
    import torch.distributed as dist
    import fa4_aot
    from fa4_aot import distributed as cp

    local = int(os.environ.get("LOCAL_RANK", "0"))
    if a.device == "cuda":
        torch.cuda.set_device(local)
        dev = torch.device("cuda", local)
        dist.init_process_group("nccl", device_id=dev)
        attn_fn, single_fn = None, lambda: fa4_aot.attention(q, k, v, causal=causal)
    else:
        dev = torch.device("cpu")
        dist.init_process_group("gloo")
        attn_fn, single_fn = _ref_attention, lambda: _ref_attention(q, k, v, causal=causal)[0]
    rank, world = dist.get_rank(), dist.get_world_size()
    causal = not a.no_causal
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}[a.dtype]
    b, s, h, d = a.batch, a.seqlen, a.heads, a.head_dim
    hk = a.heads_k or h
    kilo = f"{s // 1024}k" if s % 1024 == 0 else str(s)
    label = (f"{'causal ' if causal else ''}{kilo} {b}x{h}x{d}" + (f" gqa{hk}" if hk != h else "")
             + f" ({world} GPUs)")
    case = bl.Case(GROUP, label, h, d, causal, batch=b, seqlen_q=s, seqlen_k=s,
                   heads_k=0 if hk == h else hk)

    g = torch.Generator(device=dev).manual_seed(0)
    q = torch.randn(b, s, h, d, device=dev, dtype=dtype, generator=g)
    k = torch.randn(b, s, hk, d, device=dev, dtype=dtype, generator=g)
    v = torch.randn(b, s, hk, d, device=dev, dtype=dtype, generator=g)
    qs, ks, vs = (cp.shard(x, rank, world) for x in (q, k, v))
    cp_name = {"ring": f"fa4_aot:cp{world}", "allgather": f"fa4_aot:cp{world}:allgather"}
    fns = {cp_name[c]: (lambda c=c: cp.context_parallel_attention(
        qs, ks, vs, causal=causal, seqlen=s, comm=c, attn_fn=attn_fn)) for c in comms}
    fns["fa4_aot"] = single_fn
    provs = list(fns)
    method = {cp_name["ring"]: "ring P2P (batch_isend_irecv on a side stream)",
              cp_name["allgather"]: "all-gather K/V", "fa4_aot": "fa4_aot (1 GPU)"}
    results = {p: {"method": method[p], "gpus": 1 if p == "fa4_aot" else world} for p in provs}

    # correctness (and warm-up: cubin loads, NCCL communicators)
    rows_chk = torch.unique(torch.cat([
        torch.arange(min(32, s)), torch.arange(max(0, s - 32), s),
        torch.randint(0, s, (max(0, a.check_rows - 64),),
                      generator=torch.Generator().manual_seed(1))
    ])).to(dev)
    single = fns["fa4_aot"]()
    for p in provs:
        out, failed = None, 0.0
        try:
            out = single if p == "fa4_aot" else cp.all_gather_unshard(fns[p](), seqlen=s)
        except Exception as e:  # noqa: BLE001 -- recorded, the provider is not timed
            failed = 1.0
            results[p]["error"] = f"rank {rank}: {type(e).__name__}: {e}"
            results[p]["note"] = f"failed: {type(e).__name__}"
        flag = torch.tensor([failed], device=dev)
        dist.all_reduce(flag, op=dist.ReduceOp.MAX)  # every rank drops a provider that failed
        if flag.item():
            results[p].setdefault("note", "failed on another rank")
            continue
        if rank == 0:
            try:
                err, bound = sampled_check(out, q, k, v, causal, rows_chk, p)
                results[p]["note"] = f"sampled rows: max|out-ref| {err:.2e} <= {bound:.2e}"
            except AssertionError as e:
                results[p]["mismatch"] = True
                results[p]["note"] = str(e)
            except Exception as e:  # noqa: BLE001 -- e.g. out of memory in the reference
                results[p]["note"] = f"sampled check not done: {type(e).__name__}: {e}"
            results[p]["max_diff"] = (out.float() - single.float()).abs().max().item()
            results[p]["note"] += f"; max|out-fa4_aot| {results[p]['max_diff']:.2e}"
        del out
    provs = [p for p in provs if not results[p].get("note", "").startswith("failed")]
    _sync(dev)
    dist.barrier()
    for p in provs:
        fns[p]()
    _sync(dev)

    def turn(p):
        dist.barrier()
        _sync(dev)
        ms = time_calls(fns[p], a.iters, dev)
        t = torch.tensor([ms if p != "fa4_aot" else -ms], device=dev, dtype=torch.float64)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)  # CP: slowest rank; single: fastest rank
        return abs(t.item())

    timed = bl.timed_rounds(provs, a.repeats, turn, first_after=provs[-1])
    for p, (times, after) in timed.items():
        results[p]["ms"] = statistics.median(times)
        results[p]["samples"] = bl.samples(times, after)

    t1 = results["fa4_aot"].get("ms")
    scaling = {}
    for p in provs:
        if p != "fa4_aot" and t1:
            sp = t1 / results[p]["ms"]
            scaling[p] = {"speedup_vs_fa4_aot": round(sp, 4),
                          "scaling_efficiency": round(sp / world, 4)}
    rows = cp_rows(case, world, results, scaling)

    if rank == 0:
        meta = {"date": datetime.datetime.now().isoformat(timespec="seconds"),
                "host": platform.node(), "torch": torch.__version__,
                "nccl": _nccl_version(torch),
                "device": torch.cuda.get_device_name(dev) if dev.type == "cuda" else "cpu",
                "gpus": world,
                "fa4_aot": fa4_aot.__version__, "iters": a.iters, "repeats": a.repeats,
                "dtype": a.dtype, "timing": __doc__.split("Time: ")[1].split(" Correctness")[0]
                .replace("\n", " "),
                "env": {k: os.environ.get(k) for k in ("NCCL_NVLS_ENABLE",
                                                       "TORCH_SYMM_MEM_DISABLE_MULTICAST")}}
        if a.json:
            merge_into_file(a.json, rows, meta)
            print(f"wrote group '{GROUP}' into {a.json} (other groups kept)")
        for p in results:
            print(f"{p}: {results[p].get('note', '')}" + (f" ({results[p]['error']})"
                                                          if results[p].get("error") else ""))
        print(bl.FORMULA)
        print(table(rows))
    dist.barrier()
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
