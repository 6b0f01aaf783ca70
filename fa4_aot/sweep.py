"""A seeded random sweep of valid calls, each checked against an fp32 reference.

    python -m fa4_aot.sweep --cases 150 --out sweep_logs       # on an H100/H200
    python -m fa4_aot.sweep --family paged --cases 50 --inline  # one process (compute-sanitizer)

Case ``i`` of family ``f`` is drawn from ``random.Random(f"{seed}:{f}:{i}")``: the same list on
every machine and run. Every axis a call can take is drawn: head dim (64, 96, 128, 192, 256),
bf16 / fp16 / e4m3 K/V (bf16 or e4m3 q, descales 1e-4 .. 1e4), token-major or head-major
q/k/v, lengths 1 .. 4097 (odd, powers of two and their neighbours, seqlen_q != seqlen_k),
1 .. 64 query heads (odd counts too) on any divisor as KV heads, no mask / causal / sliding
window / softcap, ``return_lse``, a preallocated NaN-filled ``out``, and the forms
(:data:`FAMILIES`): dense prefill (every scheduler), varlen, decode (short queries: the
packed-GQA kernels), paged KV (pages 16 .. 256, permuted, seqused_k), split-KV, chunked
prefill (packed queries over a paged cache), FP8 on each of them; family ``kernels`` adds one
call per sm_90a kernel of the configuration space (:func:`kernel_case`).

Each call is synchronised before its check, so a fault is pinned to the call that caused it;
the check is FlashAttention's rule (:func:`fa4_aot.testing.check_close_lower`) on the output
and a tolerance on the LSE. Without ``--inline`` the cases run in a child process and a case
that leaves the CUDA context in an error state is recorded as ``crash`` (one that hangs, as
``hang``) and the sweep goes on from the next case in a fresh child. Drawing needs no torch;
the CPU tests run every case through the host path with a fake driver.
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import json
import math
import os
import random
import subprocess
import sys
import time
import traceback
import zlib
from dataclasses import dataclass

FAMILIES = ("dense", "varlen", "decode", "paged", "split", "chunked", "fp8", "kernels")
HEAD_DIMS = (64, 96, 128, 192, 256)
FP8_HEAD_DIMS = (64, 128, 256)
MAX_REF_ELEMS = 1 << 27  # scores of the reference (batch * heads * sq * sk), fp32
EXIT_FAILED_CASE = 3  # the child's exit status after a case it could not finish
CASE_TIMEOUT_S = 180  # a case still running after this is recorded as a hang
FP8_DRAW_OFFSET = 1_000_000  # an FP8 case draws its form's case of this index + its own
HOPPER_SMS = 132  # H100 / H200 SXM: the device the kernel cases choose their lengths for


@dataclass(frozen=True)
class Case:
    family: str
    index: int
    dtype: str  # "bf16" / "fp16" / "e4m3kv" (bf16 q, e4m3 k/v) / "e4m3qkv"
    d: int
    b: int
    sq: int  # per batch entry (varlen / chunked: max_seqlen_q)
    sk: int
    h: int
    hk: int
    mask: str  # "none" / "causal" / "window" / "softcap" / "causal_softcap"
    window: tuple = (-1, -1)
    softcap: float = 0.0
    lse: bool = False
    out: bool = False  # pass a NaN-filled preallocated out
    scheduler: str = "auto"
    num_splits: int | None = None
    page: int = 0  # page size (paged / chunked)
    docs_q: tuple = ()  # varlen / chunked: query rows per document
    docs_k: tuple = ()  # varlen: keys per document; paged / chunked: seqused_k
    descale: float = 1.0  # FP8: the order of magnitude of the descales
    head_major: bool = False  # q/k/v as (b, h, s, d) storage seen through .transpose(1, 2)

    @property
    def causal(self) -> bool:
        return self.mask in ("causal", "causal_softcap")

    def describe(self) -> str:
        """The fields that differ from their defaults (the draw's arguments)."""
        return " ".join(f"{f.name}={getattr(self, f.name)}" for f in dataclasses.fields(self)
                        if f.default is dataclasses.MISSING
                        or getattr(self, f.name) != f.default)


# ------------------------------------------------------------------------------ drawing
def _length(r: random.Random, hi: int = 4097) -> int:
    kind = r.random()
    if kind < 0.35:
        return r.randint(1, hi)
    p = 1 << r.randint(0, max(0, hi.bit_length() - 1))
    if kind < 0.6:
        return min(p, hi)
    return max(1, min(hi, p + r.choice((-1, 1))))


def _heads(r: random.Random) -> tuple:
    h = r.choice((1, 2, 3, 4, 5, 7, 8, 9, 12, 16, 28, 32, 40, 64) + tuple(range(1, 65, 2)))
    divisors = [x for x in range(1, h + 1) if h % x == 0]
    return h, r.choice(divisors)


def _mask(r: random.Random) -> tuple:
    mask = r.choice(("none", "causal", "window", "softcap", "causal_softcap"))
    window = (-1, -1)
    if mask == "window":
        window = r.choice(((r.randint(0, 600), 0), (r.randint(0, 600), r.randint(0, 600)),
                           (-1, r.randint(0, 300)), (r.randint(0, 300), -1)))
    softcap = r.choice((5.0, 15.0, 30.0, 50.0)) if "softcap" in mask else 0.0
    return mask, window, softcap


def _fit(b, h, sq, sk):
    """Shrink (b, sq, sk) until the reference's score matrix fits MAX_REF_ELEMS."""
    while b * h * sq * sk > MAX_REF_ELEMS:
        if b > 1:
            b -= 1
        elif sq >= sk and sq > 1:
            sq = max(1, sq // 2 + (sq & 1))
        else:
            sk = max(1, sk // 2 + (sk & 1))
    return b, sq, sk


def _docs(r: random.Random, n: int, hi: int) -> tuple:
    return tuple(_length(r, hi) if r.random() < 0.8 else r.randint(0, 3) for _ in range(n))


def draw(family: str, index: int, seed: int = 0, small: bool = False) -> Case:
    """Case ``index`` of ``family`` (``small``: lengths <= 1100, for compute-sanitizer)."""
    if family not in FAMILIES or family == "kernels":  # kernels: kernel_cases()
        raise ValueError(f"family must be one of {FAMILIES[:-1]}, got {family!r}")
    r = random.Random(f"{seed}:{family}:{index}")
    hi = 1100 if small else 4097
    d = r.choice(HEAD_DIMS)
    dtype = r.choice(("bf16", "bf16", "fp16"))
    h, hk = _heads(r)
    mask, window, softcap = _mask(r)
    kw = dict(family=family, index=index, dtype=dtype, d=d, h=h, hk=hk, mask=mask,
              window=window, softcap=softcap, lse=r.random() < 0.5, out=r.random() < 0.5,
              head_major=r.random() < 0.3)
    if family == "dense":
        b, sq, sk = _fit(r.randint(1, 4), h, _length(r, hi), _length(r, hi))
        sched = r.choice(("auto", "auto", "single", "static", "steal"))
        if "softcap" in mask and sched == "static":
            sched = "single"
        return Case(b=b, sq=sq, sk=sk, scheduler=sched, **kw)
    doc_hi = min(hi, math.isqrt(MAX_REF_ELEMS // h))  # one document's reference fits
    if family == "varlen":
        n = r.randint(1, 6)
        dq = _docs(r, n, doc_hi)
        dk = dq if r.random() < 0.6 else _docs(r, n, doc_hi)
        return Case(b=n, sq=max(dq), sk=max(dk), docs_q=dq, docs_k=dk,
                    scheduler=r.choice(("auto", "single", "static", "steal"))
                    if "softcap" not in mask else "auto", **kw)
    if family == "decode":
        b = r.randint(1, 8)
        sq = r.choice((1, 1, 2, 3, 4, 5, 8, 16))
        b, sq, sk = _fit(b, h, sq, _length(r, hi * 2 if not small else hi))
        return Case(b=b, sq=sq, sk=sk, **kw)
    if family == "split":
        b, sq, sk = _fit(r.randint(1, 4), h, r.choice((1, 2, 5, 17, 64, 130)), _length(r, hi))
        return Case(b=b, sq=sq, sk=sk, num_splits=r.choice((2, 3, 4, 7, 16, 33)), **kw)
    page = r.choice((16, 32, 48, 64, 128, 256))
    if family == "paged":
        b = r.randint(1, 6)
        used = _docs(r, b, hi)
        sq = r.choice((1, 1, 2, 4, 7, 16, 64, 130))
        b, sq, _ = _fit(b, h, sq, max(max(used), 1))
        used = used[:b]
        return Case(b=b, sq=sq, sk=max(max(used), 1), page=page, docs_k=used,
                    num_splits=r.choice((None, None, 1, 3)), **kw)
    if family == "chunked":
        n = r.randint(1, 4)
        dq = tuple(min(x, 600) for x in _docs(r, n, doc_hi))
        used = tuple(max(q, _length(r, doc_hi)) for q in dq)  # the chunk: the cache's last rows
        return Case(b=n, sq=max(dq), sk=max(used), page=page, docs_q=dq, docs_k=used, **kw)
    # fp8: e4m3 k/v (bf16 or e4m3 q) on every form, descales from 1e-4 to 1e4
    form = r.choice(("dense", "dense", "decode", "paged", "split", "chunked", "varlen"))
    base = draw(form, FP8_DRAW_OFFSET + index, seed, small)
    return dataclasses.replace(base, family="fp8", index=index, d=r.choice(FP8_HEAD_DIMS),
                               dtype=r.choice(("e4m3kv", "e4m3qkv")), scheduler="auto",
                               descale=10.0 ** r.choice((0, 0, 0, -3, 3, -4, 4)))


def kernel_case(cfg, index: int = 0, small: bool = False) -> Case:
    """A call the planner sends to the sm_90a kernel ``cfg`` (a :class:`fa4_aot.configs.
    KernelConfig`, not a trace or combine kernel; the combine kernel runs after every split
    decode kernel), its free axes drawn from ``random.Random(cfg.name)``."""
    from .plan import PREFILL_TILE_M, prefer_long_kv, prefer_m128
    r = random.Random(f"{cfg.name}:{index}")
    hi = 1100 if small else 4097
    dtype = "e4m3" + cfg.fp8 if cfg.fp8 else cfg.dtype
    mask = "window" if cfg.local else "causal" if cfg.causal else "none"
    window = (r.randint(0, 500), r.choice((0, r.randint(0, 300)))) if cfg.local else (-1, -1)
    kw = dict(family="kernels", index=index, dtype=dtype, d=cfg.head_dim, mask=mask,
              window=window, softcap=r.choice((5.0, 30.0)) if cfg.softcap else 0.0,
              lse=r.random() < 0.5, out=r.random() < 0.5, scheduler=cfg.scheduler)
    if cfg.decode:  # packed GQA: at most 64 rows (128 for the wide form, forced splits)
        hk = r.choice((1, 2, 3))
        if cfg.wide:
            g = r.choice((2, 3, 4))
            sq = r.randint(64 // g + 1, 128 // g)
            return Case(b=r.randint(1, 3), sq=sq, sk=_length(r, hi), h=g * hk, hk=hk,
                        num_splits=r.choice((2, 3, 5)), **kw)
        sq = r.choice((1, 2, 3))
        g = r.choice((1, 3, 5, 8, 16))
        return Case(b=r.randint(1, 4), sq=sq, sk=_length(r, hi), h=g * hk, hk=hk,
                    num_splits=r.choice((None, 1, 4)), **kw)
    from .configs import TILES, TILES_LONG_KV, TILES_M128
    long_kv_dims = TILES_LONG_KV.get(cfg.arch, {})
    tall = TILES[cfg.arch][cfg.head_dim]  # the tile whose 128-row alternative is m128
    for _ in range(1000):  # no GQA (the prefill kernels at any length); lengths on which the
        h = r.choice((1, 2, 3, 5, 8, 16, 24))  # planner takes this kernel's tile
        if cfg.long_kv:
            sq = r.randint(PREFILL_TILE_M + 1, 2500)
            sk = sq + r.randint(0, 800)
        else:
            sq, sk = r.randint(PREFILL_TILE_M + 1, 3000), r.randint(200, 3000)
        if h * sq * sk > MAX_REF_ELEMS:
            continue
        if cfg.causal and cfg.head_dim in long_kv_dims and prefer_long_kv(sq, sk) != cfg.long_kv:
            continue
        if (cfg.head_dim in TILES_M128.get(cfg.arch, {}) and cfg.scheduler == "steal"
                and not (cfg.local or cfg.softcap)
                and prefer_m128(tall.m, tall.n, sq, sk, cfg.causal, h, HOPPER_SMS) != cfg.m128):
            continue
        break
    return Case(b=1, sq=sq, sk=sk, h=h, hk=h, **kw)


def kernel_cases(small: bool = False):
    """One call per sm_90a kernel of the configuration space (trace kernels aside: their
    ``_trace`` argument is a test hook)."""
    from .configs import CONFIG_SPACE
    return [kernel_case(cfg, i, small) for i, cfg in enumerate(
        c for c in CONFIG_SPACE
        if c.arch == "sm_90a" and c.kind == "fwd" and not c.trace)]


def cases(families=FAMILIES, count: int = 50, seed: int = 0, small: bool = False):
    """``count`` cases of each random family, interleaved by index, then (family
    ``kernels``) one call per kernel: the same list on every run."""
    drawn = [draw(f, i, seed, small) for i in range(count) for f in families if f != "kernels"]
    return drawn + (kernel_cases(small) if "kernels" in families else [])


# ------------------------------------------------------------------------------ running
def make_call(c: Case, device="cuda"):
    """((q, k, v), keyword arguments, reference pieces) of case ``c``: inputs drawn on
    ``device`` from a generator seeded by the case."""
    import torch
    g = torch.Generator(device=device).manual_seed(zlib.crc32(repr(c).encode()))
    e4m3 = torch.float8_e4m3fn
    half = {"fp16": torch.float16}.get(c.dtype, torch.bfloat16)
    q_dtype = e4m3 if c.dtype == "e4m3qkv" else half
    kv_dtype = e4m3 if c.dtype.startswith("e4m3") else half

    def randn(*shape, dtype, tokens=False):
        """``tokens``: a (.., s, h, d) q/k/v, stored head-major for ``head_major`` (the
        layout attention modules hand over: (b, h, s, d).transpose(1, 2))."""
        if tokens and c.head_major:
            *lead, s_, h_, d_ = shape
            x = torch.randn(*lead, h_, s_, d_, device=device, generator=g).to(dtype)
            return x.transpose(-3, -2)
        return torch.randn(*shape, device=device, generator=g).to(dtype)

    kw = dict(causal=c.causal, return_lse=c.lse, scheduler=c.scheduler,
              window_size=c.window, softcap=c.softcap, num_splits=c.num_splits)
    pieces = {}
    if c.docs_q:  # varlen / chunked: packed queries
        q = randn(sum(c.docs_q), c.h, c.d, dtype=q_dtype, tokens=True)
        kw.update(cu_seqlens_q=_offsets(c.docs_q, device), max_seqlen_q=max(c.docs_q))
    else:
        q = randn(c.b, c.sq, c.h, c.d, dtype=q_dtype, tokens=True)
    if c.page:  # the keys of each sequence in a permuted pool of pages
        per_seq = max(1, -(-max(c.docs_k) // c.page))
        pool = c.b * per_seq + 3
        table = torch.randperm(pool, device=device, generator=g)[: c.b * per_seq]
        pieces["table"] = table = table.view(c.b, per_seq).to(torch.int32)
        k = randn(pool, c.page, c.hk, c.d, dtype=kv_dtype)
        v = randn(pool, c.page, c.hk, c.d, dtype=kv_dtype)
        kw.update(page_table=table,
                  seqused_k=torch.tensor(c.docs_k, dtype=torch.int32, device=device))
    elif c.docs_k:  # varlen: packed keys
        k = randn(sum(c.docs_k), c.hk, c.d, dtype=kv_dtype, tokens=True)
        v = randn(sum(c.docs_k), c.hk, c.d, dtype=kv_dtype, tokens=True)
        kw.update(cu_seqlens_k=_offsets(c.docs_k, device), max_seqlen_k=max(c.docs_k))
    else:
        k = randn(c.b, c.sk, c.hk, c.d, dtype=kv_dtype, tokens=True)
        v = randn(c.b, c.sk, c.hk, c.d, dtype=kv_dtype, tokens=True)
    descales = None
    if kv_dtype == e4m3:  # FA3's (batch, heads_k) descales around 10 ** k
        descales = [(torch.rand(c.b, c.hk, device=device, generator=g) * 0.5 + 0.75)
                    * c.descale for _ in range(3)]
        kw.update(k_descale=descales[1], v_descale=descales[2])
        if q_dtype == e4m3:
            kw["q_descale"] = descales[0]
    if c.out:
        kw["out"] = torch.full(q.shape, float("nan"), device=device,
                               dtype=torch.bfloat16 if q_dtype == e4m3 else q.dtype)
    pieces.update(q=q, k=k, v=v, descales=descales)
    return (q, k, v), {n: x for n, x in kw.items() if x is not None}, pieces


def _offsets(lens, device):
    import torch
    return torch.tensor([0, *itertools.accumulate(lens)], dtype=torch.int32, device=device)


def _dense_refs(q, k, v, descales, mask_kw, fp8_prefill=False):
    """(ref in fp32, [lower-precision outputs], lse ref) of one (1, s, h, d) batch entry.
    16-bit inputs: the same attention in the input dtype. FP8 (FA3's rule: the dequantized
    inputs, e4m3 * descale): the bf16 attention of the dequantized inputs, and where the FP8
    prefill kernel ran (``fp8_prefill``; no window or softcap) also FA3's FP8 prefill emulated
    (P rounded to e4m3, a bf16 q quantized as the runtime does); the check takes the larger of
    their errors (docs/design.md#fp8)."""
    import torch
    from .testing import attention_ref, fp8_references
    if descales is None:
        ref, lse = attention_ref(q, k, v, **mask_kw)
        return ref, [attention_ref(q, k, v, upcast=False, **mask_kw)[0]], lse
    emulate = ((q.dtype == torch.float8_e4m3fn or fp8_prefill) and set(mask_kw) <= {"causal"}
               and k.shape[1] > 0)
    return fp8_references(q, k, v, descales, emulate, **mask_kw)


def reference(c: Case, pieces, fp8_prefill=False):
    """[(where, ref, [lower-precision outputs], lse ref)] per batch entry or document;
    ``where``: (entry,) of a batched output, (first row, end row) of a packed one;
    ``fp8_prefill``: the call ran the FP8 prefill kernel (:func:`_dense_refs`)."""
    q, k, v, ds = pieces["q"], pieces["k"], pieces["v"], pieces["descales"]
    mask_kw = {n: x for n, x in (("causal", c.causal), ("window_size", c.window),
                                 ("softcap", c.softcap)) if x not in (False, (-1, -1), 0.0)}
    rows = [0, *itertools.accumulate(c.docs_q)]
    keys = [0, *itertools.accumulate(c.docs_k)]
    parts = []
    for i in range(c.b):
        if c.docs_q:
            where, qi = (rows[i], rows[i + 1]), q[rows[i]:rows[i + 1]].unsqueeze(0)
        else:
            where, qi = (i,), q[i:i + 1]
        if "table" in pieces:
            pages = pieces["table"][i].long()
            n = c.docs_k[i]
            ki = k[pages].reshape(1, -1, c.hk, c.d)[:, :n]
            vi = v[pages].reshape(1, -1, c.hk, c.d)[:, :n]
        elif c.docs_k:
            ki = k[keys[i]:keys[i + 1]].unsqueeze(0)
            vi = v[keys[i]:keys[i + 1]].unsqueeze(0)
        else:
            ki, vi = k[i:i + 1], v[i:i + 1]
        dsi = None if ds is None else [x[i:i + 1] for x in ds]
        parts.append((where,) + _dense_refs(qi, ki, vi, dsi, mask_kw, fp8_prefill))
    return parts


def check(c: Case, result, pieces, fp8_prefill=False) -> str:
    """'' when the output (and LSE) pass FlashAttention's rule, else what failed
    (``fp8_prefill``: :func:`reference`)."""
    import torch
    from .testing import check_close_lower
    out, lse = result if c.lse else (result, None)
    varlen = bool(c.docs_q)
    for where, ref, pts, lse_ref in reference(c, pieces, fp8_prefill):
        if varlen:
            a, b_ = where
            o = out[a:b_].unsqueeze(0)
            lo = lse[:, a:b_].unsqueeze(0) if lse is not None else None
        else:
            (i,) = where
            o = out[i:i + 1]
            lo = lse[i:i + 1] if lse is not None else None
        if o.numel() == 0:
            continue
        if torch.isnan(o).any():
            return f"NaN in out (entry {where})"
        try:
            check_close_lower(o, ref, pts, f"entry {where}")
        except AssertionError as e:
            return str(e)
        if lo is not None:
            fin = torch.isfinite(lse_ref)
            if not torch.equal(torch.isfinite(lo), fin):
                return f"entry {where}: LSE -inf pattern differs"
            if fin.any():
                tol = 1e-2 + 1e-3 * lse_ref[fin].abs()
                if not ((lo[fin] - lse_ref[fin]).abs() <= tol).all():
                    d = (lo[fin] - lse_ref[fin]).abs().max().item()
                    return f"entry {where}: max|lse-ref| = {d:.3e}"
    return ""


def run_case(c: Case) -> dict:
    """Run and check one case; the call is synchronised before its check."""
    import torch

    import fa4_aot
    from fa4_aot import interface
    args, kw, pieces = make_call(c)
    interface.clear_memo()
    t0 = time.perf_counter()
    result = fa4_aot.attention(*args, **kw)
    torch.cuda.synchronize()
    plans = interface.memo_plans()
    kernels = sorted({kl.name for p in plans for kl in p.launches})
    fp8_prefill = any(kl.record["config"]["fp8"] and not kl.record["config"]["decode"]
                      for p in plans for kl in p.launches)
    err = check(c, result, pieces, fp8_prefill)
    return {"case": c.describe(), "family": c.family, "index": c.index,
            "ok": not err, "error": err, "kernels": kernels,
            "device": torch.cuda.get_device_name(),
            "ms": round(1e3 * (time.perf_counter() - t0), 2)}


def _child(families, count, seed, small, start, log):
    """Run cases from ``start`` on, appending one JSON line per case to ``log``; on an
    exception (a sticky CUDA error included) log it and exit EXIT_FAILED_CASE."""
    os.environ.setdefault("FA4_AOT_EXPERIMENTAL_FP8", "1")
    todo = cases(families, count, seed, small)[start:]
    with open(log, "a") as f:
        for c in todo:
            try:
                rec = run_case(c)
            except Exception as e:  # noqa: BLE001 - recorded, then this process ends
                rec = {"case": c.describe(), "family": c.family, "index": c.index, "ok": False,
                       "error": f"{type(e).__name__}: {e}".splitlines()[0][:300],
                       "crash": True, "trace": traceback.format_exc()[-2000:]}
                f.write(json.dumps(rec) + "\n")
                f.flush()
                sys.exit(EXIT_FAILED_CASE)
            f.write(json.dumps(rec) + "\n")
            f.flush()


def _lines(path) -> int:
    with open(path) as f:
        return sum(1 for _ in f)


def _supervise(cmd, log, done, timeout_s=CASE_TIMEOUT_S):
    """Run a child until it exits or logs no case for ``timeout_s`` (then killed: status
    None). Returns (status, cases logged)."""
    child = subprocess.Popen(cmd)
    last, seen = time.time(), done
    while child.poll() is None:
        time.sleep(0.5)
        n = _lines(log)
        if n != seen:
            last, seen = time.time(), n
            if n % 50 == 0:
                print(f"sweep: {n} cases", flush=True)
        elif time.time() - last > timeout_s:
            child.kill()
            child.wait()
            return None, _lines(log)
    return child.returncode, _lines(log)


def summarize(records) -> str:
    """A table: cases, passed, failed, crashed and kernels reached per family."""
    fams = sorted({r["family"] for r in records})
    lines = [f"{'family':<9} {'cases':>6} {'ok':>6} {'failed':>6} {'crash':>6} {'kernels':>8}"]
    for fam in fams + ["all"]:
        rs = [r for r in records if fam == "all" or r["family"] == fam]
        ks = {k for r in rs for k in r.get("kernels", ())}
        lines.append(f"{fam:<9} {len(rs):>6} {sum(r['ok'] for r in rs):>6} "
                     f"{sum(not r['ok'] and not r.get('crash') for r in rs):>6} "
                     f"{sum(bool(r.get('crash')) for r in rs):>6} {len(ks):>8}")
    return "\n".join(lines)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--family", default=",".join(FAMILIES),
                    help=f"comma-separated subset of {','.join(FAMILIES)}")
    ap.add_argument("--cases", type=int, default=200, help="cases per family")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--small", action="store_true", help="lengths <= 1100 (compute-sanitizer)")
    ap.add_argument("--inline", action="store_true",
                    help="run in this process (stops at the first crash)")
    ap.add_argument("--out", default="sweep_out", help="folder for sweep.jsonl")
    ap.add_argument("--_child", type=int, default=None, help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    families = tuple(x for x in a.family.split(",") if x)
    for f in families:
        if f not in FAMILIES:
            ap.error(f"--family: {f!r} is not one of {FAMILIES}")
    os.makedirs(a.out, exist_ok=True)
    log = os.path.join(a.out, "sweep.jsonl")
    if a._child is not None:
        _child(families, a.cases, a.seed, a.small, a._child, log)
        return 0
    open(log, "w").close()
    total = len(cases(families, a.cases, a.seed, a.small))
    t0 = time.time()
    if a.inline:
        _child(families, a.cases, a.seed, a.small, 0, log)
    else:
        done = 0
        while done < total:
            cmd = [sys.executable, "-m", "fa4_aot.sweep", "--family", ",".join(families),
                   "--cases", str(a.cases), "--seed", str(a.seed), "--out", a.out,
                   "--_child", str(done)] + (["--small"] if a.small else [])
            rc, done = _supervise(cmd, log, done)
            if rc not in (0, EXIT_FAILED_CASE):  # killed or died without logging its case
                c = cases(families, a.cases, a.seed, a.small)[done]
                with open(log, "a") as f:
                    f.write(json.dumps({"case": c.describe(), "family": c.family,
                                        "index": c.index, "ok": False, "crash": True,
                                        "error": "hang: no result in "
                                                 f"{CASE_TIMEOUT_S} s" if rc is None else
                                                 f"child exit status {rc}"}) + "\n")
                done += 1
            print(f"sweep: {done}/{total} cases, {time.time() - t0:.0f} s", flush=True)
    with open(log) as f:
        records = [json.loads(x) for x in f]
    bad = [r for r in records if not r["ok"]]
    for r in bad[:40]:
        print(f"FAIL {r['family']}#{r['index']}: {r['error']}\n     {r['case']}")
    print(summarize(records))
    print(f"sweep: {len(records)} cases, {len(bad)} failed, {time.time() - t0:.0f} s; "
          f"log {log}")
    return 1 if bad or len(records) < total else 0


if __name__ == "__main__":
    sys.exit(main())
