"""Cold start and small-call overhead: fa4_aot vs cuDNN SDPA, torch flash, torch's default SDPA
dispatch and upstream FA4.

    python bench/cold_start.py [--runs 3] [--providers fa4_aot,cudnn,flash,sdpa,fa4]
                               [--shape B,H,S,D[,c]] [--shape2 B,H,S,D[,c]] [--small B,H,S,D]
                               [--n 200] [--json FILE]

Each measurement runs in fresh Python processes (--runs of them per provider; medians shown), in
this order inside one process:

  import torch         `import torch` (s)
  import provider      `import fa4_aot` / `from flash_attn.cute import flash_attn_func` (s),
                       after torch; cuDNN and flash are part of torch (SDPA runs inside
                       sdpa_kernel(<backend>), entered once per process); sdpa is
                       scaled_dot_product_attention with torch's default dispatch
  CUDA context         first CUDA allocation + synchronize (s) - not part of any call below
  1st call, config A   first attention call on --shape (ms; host clock around call +
                       synchronize): fa4_aot reads the manifest, sha256-checks and loads the cubin
                       (cuLibraryLoadData) and imports cuda-python; cuDNN builds its graph; FA4
                       compiles (JIT)
  2nd call, config A   the same call again (ms)
  1st call, config B   first call on a second configuration (--shape2: another kernel) in the
                       same process (ms): the per-kernel part of the cold cost
  small call           --small (default 1x1x128x64, B,H,S,D) in steady state, after warm-up:
    host enqueue         host clock around N back-to-back calls, before synchronizing (us/call)
    events               CUDA events around N back-to-back calls (us/call): GPU-side spacing,
                         = host launch cost when that exceeds the kernel
    host + sync          host clock around N calls + one synchronize (us/call)
    round trip           median of (call + synchronize) one at a time (us)

The table (metrics x providers) is printed last; --json writes all runs.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MARK = "@@COLD_START "

METRICS = [  # key, label, unit scale from seconds, format
    ("import_torch_s", "import torch (s)", 1, "{:.2f}"),
    ("import_s", "import provider (s)", 1, "{:.3f}"),
    ("cuda_ctx_s", "CUDA context (s)", 1, "{:.2f}"),
    ("first_call_ms", "1st call, config A (ms)", 1e3, "{:.1f}"),
    ("second_call_ms", "2nd call, config A (ms)", 1e3, "{:.2f}"),
    ("first_call_b_ms", "1st call, config B (ms)", 1e3, "{:.1f}"),
    ("small_enqueue_us", "small: host enqueue (us/call)", 1e6, "{:.1f}"),
    ("small_events_us", "small: events, back-to-back (us/call)", 1e6, "{:.1f}"),
    ("small_host_sync_us", "small: host clock + sync (us/call)", 1e6, "{:.1f}"),
    ("small_roundtrip_us", "small: call + sync round trip (us)", 1e6, "{:.1f}"),
]
PROVIDERS = ("fa4_aot", "cudnn", "flash", "sdpa", "fa4")
NAMES = {"fa4_aot": "fa4_aot", "cudnn": "cuDNN SDPA", "flash": "torch flash", "sdpa": "SDPA",
         "fa4": "FA4"}


def parse_shape(s: str):
    f = [x.strip() for x in s.split(",")]
    b, h, sl, d = (int(x) for x in f[:4])
    return b, h, sl, d, len(f) > 4 and f[4] == "c"


def shape_label(shape) -> str:
    b, h, s, d, c = shape
    return f"{b}x{h}x{s}x{d}" + (" causal" if c else "")


# ------------------------------------------------------------------------------------ child
def child(provider: str, shape_a, shape_b, small, n: int) -> dict:
    """Runs in a fresh interpreter; returns seconds (and notes)."""
    res = {"provider": provider}
    t = time.perf_counter()
    import torch
    res["import_torch_s"] = time.perf_counter() - t

    t = time.perf_counter()
    if provider == "fa4_aot":
        sys.path.insert(0, str(ROOT))
        import fa4_aot

        def call(q, k, v, causal):
            return fa4_aot.attention(q, k, v, causal=causal)
        layout = "bshd"
        res["import_s"] = time.perf_counter() - t
    elif provider == "fa4":
        from flash_attn.cute import flash_attn_func

        def call(q, k, v, causal):
            return flash_attn_func(q, k, v, causal=causal)
        layout = "bshd"
        res["import_s"] = time.perf_counter() - t
    else:
        import torch.nn.functional as F
        from torch.nn.attention import SDPBackend, sdpa_kernel
        if provider != "sdpa":  # sdpa: torch's default dispatch
            backend = {"cudnn": SDPBackend.CUDNN_ATTENTION,
                       "flash": SDPBackend.FLASH_ATTENTION}[provider]
            # entered once for the whole process: per call it would add tens of us of host time
            sdpa_kernel(backend).__enter__()

        def call(q, k, v, causal):
            return F.scaled_dot_product_attention(q, k, v, is_causal=causal)
        layout = "bhsd"
        res["import_s"] = None

    t = time.perf_counter()
    torch.zeros(1, device="cuda")
    torch.cuda.synchronize()
    res["cuda_ctx_s"] = time.perf_counter() - t
    res["device"] = torch.cuda.get_device_name(0)
    res["torch"] = torch.__version__

    def inputs(shape):
        b, h, s, d, c = shape
        dims = (b, s, h, d) if layout == "bshd" else (b, h, s, d)
        xs = [torch.randn(dims, device="cuda", dtype=torch.bfloat16) for _ in range(3)]
        torch.cuda.synchronize()
        return xs, c

    def once(xs, c):
        t0 = time.perf_counter()
        call(*xs, c)
        torch.cuda.synchronize()
        return time.perf_counter() - t0

    xa, ca = inputs(shape_a)
    res["first_call_s"] = once(xa, ca)
    res["second_call_s"] = once(xa, ca)
    xb, cb = inputs(shape_b)
    res["first_call_b_s"] = once(xb, cb)

    xs, cs = inputs(small)
    for _ in range(20):
        call(*xs, cs)
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(n):
        call(*xs, cs)
    t1 = time.perf_counter()
    torch.cuda.synchronize()
    t2 = time.perf_counter()
    res["small_enqueue_s"] = (t1 - t0) / n
    res["small_host_sync_s"] = (t2 - t0) / n
    e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    e0.record()
    for _ in range(n):
        call(*xs, cs)
    e1.record()
    e1.synchronize()
    res["small_events_s"] = e0.elapsed_time(e1) / 1e3 / n
    rt = [once(xs, cs) for _ in range(min(n, 100))]
    res["small_roundtrip_s"] = statistics.median(rt)
    return res


def to_units(res: dict) -> dict:
    """Child seconds -> the table's units (keys of METRICS)."""
    out = {}
    for key, _, scale, _ in METRICS:
        src = key.rsplit("_", 1)[0] + "_s" if not key.endswith("_s") else key
        v = res.get(src)
        out[key] = None if v is None else v * scale
    return out


# ------------------------------------------------------------------------------------ parent
def run_child(provider, a, timeout=900) -> dict:
    cmd = [sys.executable, str(Path(__file__).resolve()), "--child", provider,
           "--shape", a.shape, "--shape2", a.shape2, "--small", a.small, "--n", str(a.n)]
    env = dict(os.environ)
    env.setdefault("PYTHONDONTWRITEBYTECODE", "1")
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)
    except subprocess.TimeoutExpired:
        return {"provider": provider, "error": f"timed out after {timeout} s"}
    for line in p.stdout.splitlines():
        if line.startswith(MARK):
            return json.loads(line[len(MARK):])
    tail = (p.stderr.strip().splitlines() or ["(no output)"])[-1]
    return {"provider": provider, "error": f"exit {p.returncode}: {tail[:200]}"}


def summarize(runs: dict) -> dict:
    """provider -> {metric: median over successful runs (None when none)}."""
    out = {}
    for prov, rs in runs.items():
        ok = [to_units(r) for r in rs if "error" not in r]
        out[prov] = {k: (statistics.median([o[k] for o in ok if o[k] is not None])
                         if any(o[k] is not None for o in ok) else None)
                     for k, *_ in METRICS}
        errs = [r["error"] for r in rs if "error" in r]
        if errs:
            out[prov]["error"] = errs[0]
    return out


def format_table(summary: dict, providers, runs_n: int, shape_a: str, shape_b: str,
                 small: str) -> str:
    lw = max(len(m[1]) for m in METRICS)
    cols = [NAMES.get(p, p) for p in providers]
    widths = [max(10, len(c)) for c in cols]
    lines = [f"cold start (median of {runs_n} fresh processes; config A = {shape_a}, "
             f"config B = {shape_b}, small = {small}, bf16)",
             f"{'metric':<{lw}}  " + "  ".join(f"{c:>{w}}" for c, w in zip(cols, widths))]
    lines.append("-" * len(lines[-1]))
    for key, label, _, fmt in METRICS:
        cells = []
        for p, w in zip(providers, widths):
            s = summary.get(p, {})
            v = s.get(key)
            if v is None:
                cell = "error" if s.get("error") and key != "import_s" else "—"
            else:
                cell = fmt.format(v)
            cells.append(f"{cell:>{w}}")
        lines.append(f"{label:<{lw}}  " + "  ".join(cells))
    for p in providers:
        if summary.get(p, {}).get("error"):
            lines.append(f"{NAMES.get(p, p)}: {summary[p]['error']}")
    return "\n".join(lines)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=3, help="fresh processes per provider")
    ap.add_argument("--providers", default=",".join(PROVIDERS))
    ap.add_argument("--shape", default="2,16,1024,128,c", help="config A: B,H,S,D[,c]")
    ap.add_argument("--shape2", default="2,16,1024,64", help="config B: B,H,S,D[,c]")
    ap.add_argument("--small", default="1,1,128,64", help="small call: B,H,S,D[,c]")
    ap.add_argument("--n", type=int, default=200, help="back-to-back small calls")
    ap.add_argument("--json")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    a = ap.parse_args(argv)

    if a.child:
        res = child(a.child, parse_shape(a.shape), parse_shape(a.shape2), parse_shape(a.small),
                    a.n)
        print(MARK + json.dumps(res), flush=True)
        return 0

    providers = [p.strip() for p in a.providers.split(",") if p.strip()]
    for p in providers:
        if p not in PROVIDERS:
            ap.error(f"unknown provider {p!r}; choose from {', '.join(PROVIDERS)}")
    runs = {p: [] for p in providers}
    active = list(providers)
    for i in range(a.runs):  # interleave providers so drift hits all alike
        for p in list(active):
            r = run_child(p, a)
            runs[p].append(r)
            brief = r.get("error") or ", ".join(
                f"{k}={v:.4g}" for k, v in to_units(r).items() if v is not None)
            print(f"run {i + 1} {p}: {brief}", flush=True)
            err = r.get("error", "")
            if "ImportError" in err or "ModuleNotFoundError" in err:
                active.remove(p)  # not importable: no point in more runs
    if "fa4" in runs and all("error" in r for r in runs["fa4"]):
        print(f"note: upstream FA4 not run ({runs['fa4'][0]['error']})")
        providers.remove("fa4")
    summary = summarize(runs)
    labels = tuple(shape_label(parse_shape(s)) for s in (a.shape, a.shape2, a.small))
    if a.json:
        Path(a.json).write_text(json.dumps({"shape_a": labels[0], "shape_b": labels[1],
                                            "small": labels[2], "n": a.n, "runs": runs,
                                            "median": summary}, indent=1))
        print(f"wrote {a.json}")
    print()
    print(format_table(summary, providers, a.runs, *labels))
    return 0


if __name__ == "__main__":
    sys.exit(main())
