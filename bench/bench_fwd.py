"""Forward benchmark: fa4_aot (each scheduler) vs cuDNN SDPA, torch flash and upstream FA4, one
process, one GPU.

    python bench/bench_fwd.py [--set all|anchors|gqa|imbalanced|causal|docs|window|extra|host[,...]]
                              [--filter SUBSTR[,...]] [--shapes "B,H,S,D[,c][,wL:R];..."]
                              [--providers fa4_aot:single,fa4_aot:static,fa4_aot:steal,cudnn,flash,fa4]
                              [--iters N] [--repeats N] [--no-check] [--varlen-peer auto|native|loop]
                              [--json FILE] [--csv FILE] [--png FILE] [--from-json FILE]

Cases (bench/benchlib.py): the anchor table of shared/design.md (non-causal and causal), the
causal sweep S = 1k..16k at 32k tokens (hd 128 and 64), varlen document mixes (1x16k + 32x512,
16x2k, a zipf-like mix of 38,912 tokens; causal hd128/hd64 and non-causal hd128) and a causal
sliding window (1024, 0) at S=8192 B=4 hd128, grouped-query attention (2 x 32 query / 8 KV
heads x 8192 x 128, causal and not), and ``extra`` (benchlib.extra_cases: hd96 and hd192 at
2x16x8k, fp16 hd128 2x16x8k, 1x32x32k causal, chunked prefill 4 x 2k and 16 x 512 new queries
against 16k / 8k keys, 32/8 heads, causal bottom-right: SDPA's is_causal is top-left aligned,
so the cuDNN and flash columns are n/a there). 16 heads wherever the anchor table does not say.
A case's own dtype (the fp16 rows) wins over --dtype.

TFLOP/s = 4*B*H*Sq*Sk*D / t, causal / window / varlen counting only the unmasked (q, k) pairs,
computed exactly per document. Time: median over --repeats of (CUDA events around --iters
back-to-back calls) / iters after warm-up, the repeats taken round the providers in turn, in the
orders of a Williams design (benchlib.round_order: over 2n rounds for n providers, n when n is
even, each provider runs in every position and right after every other provider equally often,
so that clock/power drift and the previous provider's load fall on all alike; --repeats 6
balances three providers), rotating over up to 4 input sets (so that the inputs are not all
resident in L2). The JSON keeps every repeat with the provider that ran just before it
(samples). Every cell is the same call a user makes (host work included).

Peers: cuDNN = SDPA under sdpa_kernel(CUDNN_ATTENTION); flash = SDPA under
sdpa_kernel(FLASH_ATTENTION) (the context is entered once around the timed loop, not per call);
FA4 = flash_attn.cute.flash_attn_func / flash_attn_varlen_func (when importable; else the column
is dropped). Varlen and window peers (the notes column says which ran):
  flash: torch.nn.attention.varlen.varlen_attn when torch has it (torch 2.11: window_size=(l, r),
         causal = (-1, 0); it runs FA2 - torch's _should_use_cudnn is False), else one SDPA call
         per document;
  cuDNN: one SDPA call per document ("per-doc SDPA loop (N calls)"): varlen_attn never uses cuDNN
         in torch 2.11. --varlen-peer native uses cuDNN's ragged op instead
         (aten._cudnn_attention_forward with cu_seqlens, checked against the loop), which ran at
         only 2-35 TFLOP/s on the H200 with torch 2.11 / cuDNN 9.19, so it is not the default.
  SDPA has no sliding window: cuDNN is n/a on the window case.
fa4_aot's varlen / window cases need fa4_aot.attention to accept cu_seqlens_q / cu_seqlens_k /
max_seqlen_q / max_seqlen_k and window_size (checked with inspect.signature); otherwise those
cells are "n/a (not supported yet)".

--check (default on) compares every provider's output on the first input set with a reference
(cuDNN, else flash, else FA4, else the first that ran): max |out - ref| / (1 + |ref|) over all
elements; above 0.03 the cell gets a "!" and the notes say MISMATCH.

--set host (not part of "all"): host time per call of small calls (issue 16): a small dense
call (1x128x1x64), a small GQA call, a decode call (seqlen_q = 1, B=8, Sk=1024, 32/8 heads,
hd128) and a small varlen call, for fa4_aot (eager), fa4_aot_op (torch.ops.fa4_aot.fwd),
fa4 (upstream FA4, when importable), cudnn (SDPA under sdpa_kernel(CUDNN_ATTENTION)) and sdpa
(torch.nn.functional.scaled_dot_product_attention, torch's default dispatch; varlen: torch's
varlen_attn). us_per_call = host clock around --host-calls back-to-back calls + one
synchronize, / calls; median of --repeats, taken round the providers in turn. Inputs are made
once per case in each provider's layout (no per-call transposes). With --json the host rows
replace the file's host rows and the other groups' rows stay (and vice versa).

The last thing printed is the table. --from-json re-tabulates / re-plots a saved run (no GPU).
"""

from __future__ import annotations

import argparse
import datetime
import json
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import benchlib as bl  # noqa: E402

DEFAULT_PROVIDERS = "fa4_aot:single,fa4_aot:static,fa4_aot:steal,cudnn,flash,fa4"
CHECK_TOL = 0.03


class NotSupported(Exception):
    """A provider cannot run a case; the message is the table's note."""


def warm_up(fn, warmup=3):
    import torch
    for i in range(warmup):
        fn(i)
    torch.cuda.synchronize()


def time_once(fn, iters):
    """(CUDA events around ``iters`` back-to-back calls) / iters, as shared/bench/sdpa_baseline.py
    measures the peers: host launch cost hides behind the GPU unless it is longer than the
    kernel."""
    import torch
    s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    s.record()
    for i in range(iters):
        fn(i)
    e.record()
    e.synchronize()
    return s.elapsed_time(e) / iters


# ------------------------------------------------------------------------------ environment
class Env:
    """What this process can run: fa4_aot's optional keywords, torch's varlen API, FA4."""

    def __init__(self, providers):
        import torch
        self.torch = torch
        self.notes = []
        self.fa4_aot = None
        self.aot_features = {"varlen": False, "window": False}
        self.aot_head_dims = (64, 128)
        if any(p.startswith("fa4_aot") for p in providers):
            import fa4_aot
            self.fa4_aot = fa4_aot
            self.aot_features = bl.api_features(fa4_aot.attention)
            try:
                from fa4_aot.configs import HEAD_DIMS
                self.aot_head_dims = tuple(HEAD_DIMS)
            except Exception:  # noqa: BLE001
                pass
            missing = [k for k, v in self.aot_features.items() if not v]
            if missing:
                self.notes.append("fa4_aot.attention has no " + " / ".join(
                    {"varlen": "cu_seqlens_q/k + max_seqlen_q/k", "window": "window_size"}[m]
                    for m in missing) + ": those cases are n/a (not supported yet)")
        self.varlen_attn = None
        self.varlen_params = {}
        try:
            from torch.nn.attention import varlen as _vl
            self.varlen_attn = _vl.varlen_attn
            import inspect
            self.varlen_params = inspect.signature(_vl.varlen_attn).parameters
            self.varlen_module = _vl
            if getattr(_vl, "_should_use_cudnn", None) is not None:
                self.notes.append("torch varlen_attn backend: " + (
                    "cuDNN" if _vl._should_use_cudnn(0) else "flash (FA2)"))
        except Exception as e:  # noqa: BLE001
            self.notes.append(f"torch.nn.attention.varlen not available ({type(e).__name__}); "
                              "varlen peers loop over documents")
        self.fa4 = None
        self.fa4_varlen = None
        if "fa4" in providers:
            try:
                from flash_attn.cute import flash_attn_func
                self.fa4 = flash_attn_func
                try:
                    from flash_attn.cute import flash_attn_varlen_func
                    self.fa4_varlen = flash_attn_varlen_func
                except ImportError:
                    pass
            except Exception as e:  # noqa: BLE001
                self.notes.append(f"upstream FA4 not importable ({type(e).__name__}: {e}); "
                                  "column dropped")
        self.cudnn_ragged_checked: dict = {}

    def meta(self) -> dict:
        torch = self.torch
        props = torch.cuda.get_device_properties(0)
        m = {"date": datetime.datetime.now().isoformat(timespec="seconds"),
             "host": platform.node(), "python": platform.python_version(),
             "torch": torch.__version__, "cuda": torch.version.cuda,
             "cudnn": torch.backends.cudnn.version(), "device": props.name,
             "sms": props.multi_processor_count,
             "fa4_aot_api": self.aot_features, "notes": self.notes}
        if self.fa4_aot is not None:
            m["fa4_aot"] = getattr(self.fa4_aot, "__version__", "?")
            try:
                m["git"] = subprocess.run(["git", "-C", str(ROOT), "describe", "--always",
                                           "--dirty"], capture_output=True, text=True,
                                          timeout=10).stdout.strip()
            except Exception:  # noqa: BLE001
                pass
            # The kernels measured, whatever git the copy that ran reports: the manifest's
            # source fingerprint matches the commit that built them (`git log -S` on it, or
            # the manifest in that commit).
            try:
                from fa4_aot.manifest import load_manifest
                build = load_manifest().data.get("build", {})
                m["kernels"] = {k: build.get(k) for k in ("source_fingerprint", "ptxas_version")}
            except Exception:  # noqa: BLE001
                pass
        if self.fa4 is not None:
            m["flash_attn"] = _dist_version("flash-attn-4", "flash_attn_4", "flash-attn")
        return m


def _dist_version(*names):
    import importlib.metadata as md
    for n in names:
        try:
            return md.version(n)
        except md.PackageNotFoundError:
            continue
    return "?"


# ---------------------------------------------------------------------------------- inputs
class Inputs:
    """Rotating input sets for one case. Dense: (B, S, H, D) tensors (+ packed views (B*S, H, D)
    and (B, H, S, D) views for SDPA). Varlen: packed (total, H, D) tensors, cu_seqlens int32."""

    def __init__(self, case: bl.Case, dtype, max_bytes=2 << 30):
        import torch
        self.case = case
        if case.dtype:  # the case's own dtype wins over the run's
            dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}[case.dtype]
        h, hk, d = case.heads, case.kv_heads, case.head_dim
        per_set = ((h * case.tokens + 2 * hk * case.kv_tokens) * d
                   * torch.tensor([], dtype=dtype).element_size())
        self.n = max(1, min(4, max_bytes // max(per_set, 1)))
        dev = "cuda"

        def shape(heads, rows):
            if case.varlen:
                return (case.tokens, heads, d)
            return (case.batch, rows, heads, d)
        self.sets = [tuple(torch.randn(shape(x, rows), device=dev, dtype=dtype)
                           for x, rows in ((h, case.seqlen_q), (hk, case.seqlen_k),
                                           (hk, case.seqlen_k)))
                     for _ in range(self.n)]
        cu = case.cu_seqlens()
        self.cu = torch.tensor(cu, dtype=torch.int32, device=dev)
        self.cu_list = cu
        self.max_seqlen = case.max_seqlen

    def dense(self, i):
        return self.sets[i % self.n]

    def packed(self, i):
        q, k, v = self.sets[i % self.n]
        if self.case.varlen:
            return q, k, v
        return tuple(x.reshape(-1, x.shape[-2], x.shape[-1]) for x in (q, k, v))

    def bhsd(self, i):
        return tuple(x.transpose(1, 2) for x in self.dense(i))

    def docs(self, i):
        """Per-document (1, H, L, D) views for SDPA."""
        q, k, v = self.packed(i)
        out = []
        for s, e in zip(self.cu_list[:-1], self.cu_list[1:]):
            out.append(tuple(x[s:e].unsqueeze(0).transpose(1, 2) for x in (q, k, v)))
        return out


# --------------------------------------------------------------------------------- providers
def provider_context(prov):
    """SDPA providers run inside sdpa_kernel(<their backend>), entered once around the check
    call and the timed loop (entering it costs tens of us of host time per call)."""
    import contextlib
    if prov not in ("cudnn", "flash"):
        return contextlib.nullcontext()
    from torch.nn.attention import SDPBackend, sdpa_kernel
    return sdpa_kernel({"cudnn": SDPBackend.CUDNN_ATTENTION,
                        "flash": SDPBackend.FLASH_ATTENTION}[prov])


def per_doc_loop(inp: Inputs, causal):
    """One SDPA call per document (a list of (1, H, L, D) outputs; no concatenation timed)."""
    import torch.nn.functional as F
    doc_sets = [inp.docs(i) for i in range(inp.n)]

    def fn(i):
        return [F.scaled_dot_product_attention(q, k, v, is_causal=causal)
                for q, k, v in doc_sets[i % inp.n]]
    return fn


def docs_to_packed(outs):
    import torch
    return torch.cat([o[0].transpose(0, 1) for o in outs], dim=0)


def build_aot(env: Env, prov, case: bl.Case, inp: Inputs):
    _, sched, variant = bl.parse_provider(prov)
    if case.head_dim not in env.aot_head_dims:
        raise NotSupported(f"n/a (hd{case.head_dim} not built)")
    missing = [f for f in bl.needs(case) if not env.aot_features[f]]
    if missing:
        raise NotSupported("n/a (not supported yet)")
    if variant:
        raise NotSupported("n/a (experiment variants are not in the shipped package)")
    attention = env.fa4_aot.attention
    kw = {"causal": case.causal, "scheduler": sched}
    if case.window:
        kw["window_size"] = tuple(case.window)
    if case.varlen:
        kw.update(cu_seqlens_q=inp.cu, cu_seqlens_k=inp.cu, max_seqlen_q=inp.max_seqlen,
                  max_seqlen_k=inp.max_seqlen)
        return (lambda i: attention(*inp.packed(i), **kw)), "cu_seqlens"
    return (lambda i: attention(*inp.dense(i), **kw)), "fa4_aot"


def _varlen_attn_call(env: Env, inp: Inputs, causal, window):
    """torch.nn.attention.varlen.varlen_attn, whichever of its signatures torch has."""
    p = env.varlen_params
    kw = {}
    if "window_size" in p:
        if window:
            kw["window_size"] = tuple(window) if not causal else (window[0], 0)
        elif causal:
            kw["window_size"] = (-1, 0)
    elif window:
        raise NotSupported("n/a (this torch's varlen_attn has no window_size)")
    if "is_causal" in p:
        kw["is_causal"] = causal
    elif causal and "window_size" not in p:
        raise NotSupported("n/a (varlen_attn without causal)")
    f = env.varlen_attn

    def fn(i):
        q, k, v = inp.packed(i)
        return f(q, k, v, inp.cu, inp.cu, inp.max_seqlen, inp.max_seqlen, **kw)
    return fn


def _rel_diff(out, ref):
    return ((out.float() - ref.float()).abs() / (1 + ref.float().abs())).max().item()


def build_peer(env: Env, prov, case: bl.Case, inp: Inputs, varlen_peer):
    torch = env.torch
    if prov == "fa4":
        if env.fa4 is None:
            raise NotSupported("n/a (FA4 not importable)")
        kw = {"causal": case.causal}
        if case.window:
            kw["window_size"] = tuple(None if x < 0 else x for x in case.window)
        if case.varlen:
            if env.fa4_varlen is None:
                raise NotSupported("n/a (no flash_attn_varlen_func)")
            f = env.fa4_varlen
            kw.update(cu_seqlens_q=inp.cu, cu_seqlens_k=inp.cu, max_seqlen_q=inp.max_seqlen,
                      max_seqlen_k=inp.max_seqlen)
            kw = bl.filter_kwargs(f, kw)
            return (lambda i: _first(f(*inp.packed(i), **kw))), "flash_attn_varlen_func"
        f = env.fa4
        kw = bl.filter_kwargs(f, kw)
        if case.window and "window_size" not in kw:
            raise NotSupported("n/a (FA4 has no window_size)")
        return (lambda i: _first(f(*inp.dense(i), **kw))), "flash_attn_func"

    # cudnn / flash
    if case.causal and not case.varlen and case.seqlen_q != case.seqlen_k:
        raise NotSupported("n/a (SDPA's is_causal is top-left aligned)")
    if not case.varlen and not case.window:
        import torch.nn.functional as F
        gqa = {"enable_gqa": True} if case.kv_heads != case.heads else {}
        return (lambda i: F.scaled_dot_product_attention(*inp.bhsd(i), is_causal=case.causal,
                                                         **gqa).transpose(1, 2)), "sdpa"
    if prov == "flash":
        if env.varlen_attn is not None and varlen_peer != "loop":
            return _varlen_attn_call(env, inp, case.causal, case.window), "varlen_attn"
        if case.window:
            raise NotSupported("n/a (SDPA has no sliding window)")
        return per_doc_loop(inp, case.causal), f"per-doc SDPA loop ({case.num_seqs} calls)"
    # cudnn
    if case.window:
        raise NotSupported("n/a (SDPA/cuDNN: no sliding window)")
    loop_fn = per_doc_loop(inp, case.causal)
    loop_method = f"per-doc SDPA loop ({case.num_seqs} calls)"
    if varlen_peer != "native":
        return loop_fn, loop_method
    # cuDNN's ragged (cu_seqlens) forward, the op behind NJT SDPA: only when it matches the loop.
    op = getattr(torch.ops.aten, "_cudnn_attention_forward", None)
    if op is not None:
        def ragged(i):
            q, k, v = inp.packed(i)
            return op(q, k, v, None, inp.cu, inp.cu, inp.max_seqlen, inp.max_seqlen, False, 0.0,
                      case.causal, False)[0]
        try:
            d = _rel_diff(ragged(0), docs_to_packed(loop_fn(0)))
            torch.cuda.synchronize()
            if d <= CHECK_TOL:
                return ragged, "cuDNN ragged op"
            print(f"  cuDNN ragged op differs from the per-doc loop by {d:.3g}: using the loop",
                  file=sys.stderr)
            loop_method += f"; ragged op mismatched ({d:.2g})"
        except Exception as e:  # noqa: BLE001
            msg = str(e).splitlines()[0][:120] if str(e) else type(e).__name__
            print(f"  cuDNN ragged op failed on {case.label}: {msg}", file=sys.stderr)
    return loop_fn, loop_method


def _first(x):
    return x[0] if isinstance(x, (tuple, list)) else x


def build(env, prov, case, inp, varlen_peer):
    if prov.startswith("fa4_aot"):
        return build_aot(env, prov, case, inp)
    return build_peer(env, prov, case, inp, varlen_peer)


def run_case(env: Env, case: bl.Case, providers, iters, repeats, check, varlen_peer, dtype):
    """Every provider is built, checked and warmed up first; then the repeats go round the
    providers in turn (:func:`benchlib.round_order`), so that clock and power drift while the
    case runs, and the load each provider follows, fall on all providers alike, not on the
    order they ran in."""
    torch = env.torch
    row = bl.Row(case)
    inp = Inputs(case, dtype)
    outs, fns = {}, {}

    def failed(prov, res, e):
        msg = (str(e).splitlines() or [type(e).__name__])[0][:300]
        print(f"  {prov} failed on {case.label}: {type(e).__name__}: {msg}", file=sys.stderr)
        res.note = f"error: {type(e).__name__}"
        res.error = f"{type(e).__name__}: {msg}"
        res.ms = None
        outs.pop(prov, None)
        fns.pop(prov, None)

    for prov in providers:
        res = row.results[prov] = bl.Result()
        try:
            with provider_context(prov):
                fn, res.method = build(env, prov, case, inp, varlen_peer)
                if check:
                    o = fn(0)
                    o = docs_to_packed(o) if isinstance(o, list) else o
                    outs[prov] = o
                warm_up(fn)
            fns[prov] = fn
        except NotSupported as e:
            res.note = str(e)
        except Exception as e:  # noqa: BLE001 - a provider may reject a shape; keep going
            failed(prov, res, e)

    def turn(prov):
        with provider_context(prov):
            return time_once(fns[prov], iters)

    timed = bl.timed_rounds(list(fns), repeats, turn, first_after=next(reversed(fns), None),
                            on_error=lambda prov, e: failed(prov, row.results[prov], e))
    for prov, (times, after) in timed.items():
        res = row.results[prov]
        res.ms = statistics.median(times)
        res.samples = bl.samples(times, after)
    if check and outs:
        ref_p = next((p for p in ("cudnn", "flash", "fa4") if p in outs), next(iter(outs)))
        ref = outs[ref_p]
        for p, o in outs.items():
            if p == ref_p:
                continue
            try:
                d = _rel_diff(o.reshape(ref.shape), ref)
            except Exception as e:  # noqa: BLE001
                print(f"  cannot compare {p} with {ref_p}: {e}", file=sys.stderr)
                continue
            row.results[p].max_diff = d
            row.results[p].mismatch = not (d <= CHECK_TOL)  # NaN is a mismatch
    del inp, outs
    torch.cuda.empty_cache()
    return row


# ------------------------------------------------------------------------------ host group
class HostInputs:
    """One input set per host case, in every provider's layout, made once."""

    def __init__(self, case: bl.Case, dtype):
        import torch
        dev = "cuda"
        h, hk, d = case.heads, case.kv_heads, case.head_dim
        if case.varlen:
            n = case.tokens
            self.q = torch.randn(n, h, d, device=dev, dtype=dtype)
            self.k = torch.randn(n, hk, d, device=dev, dtype=dtype)
            self.v = torch.randn(n, hk, d, device=dev, dtype=dtype)
            self.cu = torch.tensor(case.cu_seqlens(), dtype=torch.int32, device=dev)
            self.max_seqlen = case.max_seqlen
            cu = case.cu_seqlens()
            self.docs = [tuple(x[s:e].unsqueeze(0).transpose(1, 2)
                               for x in (self.q, self.k, self.v))
                         for s, e in zip(cu[:-1], cu[1:])]
        else:
            b, sq, sk = case.batch, case.seqlen_q, case.seqlen_k
            self.q = torch.randn(b, sq, h, d, device=dev, dtype=dtype)
            self.k = torch.randn(b, sk, hk, d, device=dev, dtype=dtype)
            self.v = torch.randn(b, sk, hk, d, device=dev, dtype=dtype)
            self.bhsd = tuple(x.transpose(1, 2) for x in (self.q, self.k, self.v))
        torch.cuda.synchronize()


def build_host(env: Env, prov: str, case: bl.Case, inp: HostInputs):
    """(fn, method, output -> (tokens, heads, d) or (b, s, h, d) in q's layout)."""
    import torch
    import torch.nn.functional as F
    causal, gqa = case.causal, case.kv_heads != case.heads
    q, k, v = inp.q, inp.k, inp.v
    if prov in ("fa4_aot", "fa4_aot_op"):
        if env.fa4_aot is None:
            raise NotSupported("n/a (fa4_aot not importable)")
        if case.head_dim not in env.aot_head_dims:
            raise NotSupported(f"n/a (hd{case.head_dim} not built)")
        if prov == "fa4_aot":
            att = env.fa4_aot.attention
            if case.varlen:
                cu, m = inp.cu, inp.max_seqlen
                return (lambda: att(q, k, v, causal=causal, cu_seqlens_q=cu, cu_seqlens_k=cu,
                                    max_seqlen_q=m, max_seqlen_k=m)), "eager"
            return (lambda: att(q, k, v, causal=causal)), "eager"
        op = torch.ops.fa4_aot.fwd
        if case.varlen:
            cu, m = inp.cu, inp.max_seqlen
            return (lambda: op(q, k, v, [cu, cu, None, None, None], [m, m, -1, -1, 0], causal,
                               None, "auto", 0.0)[0]), "torch.ops.fa4_aot.fwd"
        return (lambda: op(q, k, v, [None] * 5, [0, 0, -1, -1, 0], causal, None, "auto",
                           0.0)[0]), "torch.ops.fa4_aot.fwd"
    if prov == "fa4":
        if env.fa4 is None:
            raise NotSupported("n/a (FA4 not importable)")
        if case.varlen:
            if env.fa4_varlen is None:
                raise NotSupported("n/a (no flash_attn_varlen_func)")
            f, cu, m = env.fa4_varlen, inp.cu, inp.max_seqlen
            kw = bl.filter_kwargs(f, {"causal": causal, "cu_seqlens_q": cu, "cu_seqlens_k": cu,
                                      "max_seqlen_q": m, "max_seqlen_k": m})
            return (lambda: _first(f(q, k, v, **kw))), "flash_attn_varlen_func"
        f = env.fa4
        kw = bl.filter_kwargs(f, {"causal": causal})
        return (lambda: _first(f(q, k, v, **kw))), "flash_attn_func"
    # cudnn (inside sdpa_kernel(CUDNN_ATTENTION), entered around the loop) / sdpa (default)
    if case.varlen:
        if prov == "sdpa" and env.varlen_attn is not None:
            class _I:  # what _varlen_attn_call reads
                pass
            vi = _I()
            vi.cu, vi.max_seqlen = inp.cu, inp.max_seqlen
            vi.packed = lambda i: (q, k, v)
            fn = _varlen_attn_call(env, vi, causal, None)
            return (lambda: fn(0)), "torch varlen_attn"
        docs = inp.docs
        return (lambda: [F.scaled_dot_product_attention(a, b, c, is_causal=causal,
                                                        enable_gqa=gqa) for a, b, c in docs]), \
            f"per-doc SDPA loop ({len(docs)} calls)"
    qb, kb, vb = inp.bhsd
    kw = {"is_causal": causal}
    if gqa:
        kw["enable_gqa"] = True
    return (lambda: F.scaled_dot_product_attention(qb, kb, vb, **kw)), "sdpa"


def _host_out(o, prov, case):
    """A provider's output in fa4_aot's layout, for the comparison."""
    import torch
    if isinstance(o, list):  # per-doc loop: (1, H, L, D) each
        return torch.cat([x[0].transpose(0, 1) for x in o], dim=0)
    if prov in ("cudnn", "sdpa") and not case.varlen:
        return o.transpose(1, 2)
    return o


def host_time(fn, n):
    """(us per call with a sync at the end, us per call before the sync)."""
    import torch
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(n):
        fn()
    t1 = time.perf_counter()
    torch.cuda.synchronize()
    t2 = time.perf_counter()
    return (t2 - t0) / n * 1e6, (t1 - t0) / n * 1e6


def run_host_case(env: Env, case: bl.Case, providers, calls, repeats, dtype):
    torch = env.torch
    row = bl.Row(case)
    inp = HostInputs(case, dtype)
    fns, outs, samples = {}, {}, {}
    for prov in providers:
        res = row.results[prov] = bl.Result()
        try:
            with provider_context(prov):
                fn, res.method = build_host(env, prov, case, inp)
                outs[prov] = _host_out(fn(), prov, case)
                for _ in range(50):
                    fn()
                torch.cuda.synchronize()
            fns[prov], samples[prov] = fn, []
        except NotSupported as e:
            res.note = str(e)
        except Exception as e:  # noqa: BLE001 - a backend may refuse a shape; keep going
            msg = (str(e).splitlines() or [type(e).__name__])[0][:300]
            print(f"  {prov} failed on {case.label}: {type(e).__name__}: {msg}", file=sys.stderr)
            res.note, res.error = f"error: {type(e).__name__}", f"{type(e).__name__}: {msg}"
    for r in range(repeats):
        for prov in bl.round_order(fns, r):
            with provider_context(prov):
                samples[prov].append(host_time(fns[prov], calls))
    for prov, ss in samples.items():
        res = row.results[prov]
        res.us_per_call = statistics.median(s[0] for s in ss)
        res.enqueue_us = statistics.median(s[1] for s in ss)
    ref_p = next((p for p in ("sdpa", "cudnn", "fa4") if p in outs), None)
    if ref_p is not None:
        for p, o in outs.items():
            if p == ref_p:
                continue
            try:
                d = _rel_diff(o.reshape(outs[ref_p].shape), outs[ref_p])
            except Exception as e:  # noqa: BLE001
                print(f"  cannot compare {p} with {ref_p}: {e}", file=sys.stderr)
                continue
            row.results[p].max_diff = d
            row.results[p].mismatch = not (d <= CHECK_TOL)
            if row.results[p].mismatch:
                row.results[p].note = f"MISMATCH vs {ref_p}: {d:.3g}"
    del inp, outs, fns
    torch.cuda.empty_cache()
    return row


def run_host(a, cases, dtype):
    import torch
    providers = [p.strip() for p in (a.host_providers or ",".join(bl.HOST_PROVIDERS)).split(",")
                 if p.strip()]
    for p in providers:
        if p not in bl.HOST_PROVIDERS:
            raise SystemExit(f"unknown host provider {p!r}; choose from "
                             f"{', '.join(bl.HOST_PROVIDERS)}")
    env = Env(["fa4_aot:steal"] + (["fa4"] if "fa4" in providers else []))
    if "fa4" in providers and env.fa4 is None:
        providers.remove("fa4")
    meta = env.meta()
    meta.update(host_calls=a.host_calls, repeats=a.repeats, dtype=a.dtype,
                timing=bl.HOST_TIMING)
    note = bl.balance_note(len(providers), a.repeats)
    if note:
        env.notes.append(note)
    for n in env.notes:
        print(f"note: {n}", flush=True)
    rows = []
    for case in cases:
        rows.append(run_host_case(env, case, providers, a.host_calls, a.repeats, dtype))
        r = rows[-1]
        print(f"{case.label}: " + " ".join(
            f"{p}={'n/a' if r.results[p].us_per_call is None else f'{r.results[p].us_per_call:.1f}'}"
            for p in providers), flush=True)
    torch.cuda.synchronize()
    return rows, providers, meta


def print_line(row, providers):
    cells = []
    for p in providers:
        t = row.tflops(p)
        cells.append(f"{bl.display_name(p)}={'n/a' if t is None else f'{t:.1f}'}")
    print(f"{row.case.label}: " + " ".join(cells), flush=True)


def _is_tflops_provider(p):
    try:
        bl.parse_provider(p)
        return True
    except ValueError:
        return False


def finish(rows, providers, a, meta):
    if a.json and not a.from_json:
        bl.merge_json(a.json, rows, providers, meta)
        print(f"wrote {a.json} (rows of the groups measured; other groups kept)")
    elif a.json:
        bl.write_json(a.json, rows, providers, meta)
        print(f"wrote {a.json}")
    if a.csv:
        bl.write_csv(a.csv, rows, providers)
        print(f"wrote {a.csv}")
    if a.png:
        title = "fa4_aot forward (bf16)"
        if meta.get("device"):
            title += f" — {meta['device']}, torch {meta.get('torch', '?')}"
        bl.plot_bars(rows, providers, a.png, title=title)
        print(f"wrote {a.png}")
    print()
    for n in meta.get("notes", []):
        print(f"note: {n}")
    print(bl.FORMULA)
    print("time: " + bl.TIMING + "; cells: TFLOP/s and ratio to cuDNN; ! = output mismatch")
    print(bl.format_table(rows, providers, title=None))


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--set", default="all",
                    help="comma list of all, anchors, gqa, imbalanced, causal, docs, window")
    ap.add_argument("--filter", help="keep cases whose label contains one of these substrings")
    ap.add_argument("--shapes", help="B,H,S,D[,c][,wL:R] list separated by ';' instead of --set")
    ap.add_argument("--providers", default=DEFAULT_PROVIDERS)
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--dtype", choices=["bf16", "fp16"], default="bf16")
    ap.add_argument("--no-check", dest="check", action="store_false",
                    help="skip the output comparison between providers")
    ap.add_argument("--varlen-peer", choices=["auto", "native", "loop"], default="auto",
                    help="varlen peers: auto = flash via torch varlen_attn, cuDNN via one SDPA "
                         "call per document; native = cuDNN's ragged op too (slow in torch "
                         "2.11); loop = both via one SDPA call per document")
    ap.add_argument("--host-calls", type=int, default=2000,
                    help="--set host: back-to-back calls per timed sample")
    ap.add_argument("--host-providers",
                    help="--set host: comma list of " + ", ".join(bl.HOST_PROVIDERS))
    ap.add_argument("--json", help="write (merge by group into) this bench file")
    ap.add_argument("--csv")
    ap.add_argument("--png")
    ap.add_argument("--from-json", help="re-tabulate / re-plot a saved --json file (no GPU)")
    a = ap.parse_args(argv)

    if a.from_json:
        doc = json.loads(Path(a.from_json).read_text())
        rows, providers = bl.rows_from_json(doc)
        host_rows = [r for r in rows if r.case.group == bl.HOST_GROUP]
        rows = [r for r in rows if r.case.group != bl.HOST_GROUP]
        providers = [p for p in providers if _is_tflops_provider(p)]
        if host_rows:
            _, hp = bl.host_rows_from_json(doc)
            print(bl.format_host_table(host_rows, hp))
            print()
        if rows:
            finish(rows, providers, a, doc.get("meta", {}))
        return 0

    providers = [p.strip() for p in a.providers.split(",") if p.strip()]
    for p in providers:
        bl.parse_provider(p)
    cases = bl.parse_shapes(a.shapes) if a.shapes else bl.build_cases(a.set)
    cases = bl.filter_cases(cases, a.filter)
    if not cases:
        ap.error("no case selected")
    host_cases = [c for c in cases if c.group == bl.HOST_GROUP]
    cases = [c for c in cases if c.group != bl.HOST_GROUP]

    import torch
    if not torch.cuda.is_available():
        print("bench_fwd.py needs a CUDA GPU (use --from-json FILE to re-tabulate a saved run)",
              file=sys.stderr)
        return 2
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}[a.dtype]
    if host_cases and not cases:
        rows, hp, meta = run_host(a, host_cases, dtype)
        if a.json:
            bl.merge_json(a.json, rows, [], meta, host_providers=hp)
            print(f"wrote {a.json} (host rows; other groups kept)")
        print()
        print("time: " + bl.HOST_TIMING)
        print(bl.format_host_table(rows, hp))
        return 0
    if host_cases:
        ap.error("--set host runs on its own (its cells are us per call, not TFLOP/s)")
    env = Env(providers)
    if "fa4" in providers and env.fa4 is None:
        providers.remove("fa4")
    meta = env.meta()
    meta.update(iters=a.iters, repeats=a.repeats, dtype=a.dtype, varlen_peer=a.varlen_peer)
    note = bl.balance_note(len(providers), a.repeats)
    if note:
        env.notes.append(note)
    for n in env.notes:
        print(f"note: {n}", flush=True)
    rows = []
    for case in cases:
        rows.append(run_case(env, case, providers, a.iters, a.repeats, a.check, a.varlen_peer,
                             dtype))
        print_line(rows[-1], providers)
    finish(rows, providers, a, meta)
    return 0


if __name__ == "__main__":
    sys.exit(main())
