"""Pure parts of the benchmarks: case lists, FLOP counting, tables, CSV/JSON and plots (the GPU
timing helpers come from build_tools/timing.py, schedule traces are bench/tracelib.py). No torch
and no GPU here: ``tests/test_bench_cpu.py`` imports this module on a CPU-only machine. numpy and
matplotlib are imported only by the functions that need them.

Counting convention (used by every table and file):

    TFLOP/s = 4 * H * D * (visible (q, k) pairs, summed over batch entries / documents) / t

i.e. 4*B*H*Sq*Sk*D/t for dense non-causal attention; causal, sliding-window and varlen cases count
only the unmasked (q, k) pairs, exactly, per document. Masks follow FlashAttention's convention:
bottom-right aligned (row i of a (Sq, Sk) block has its diagonal at key i + Sk - Sq); a window
(left, right) keeps keys j with  i + Sk - Sq - left <= j <= i + Sk - Sq + right  (-1 = unbounded);
causal is right = 0.
"""

from __future__ import annotations

import csv
import dataclasses
import functools
import inspect
import io
import json
import math
import statistics
from dataclasses import asdict, dataclass, field
from pathlib import Path

from build_tools.timing import (  # noqa: F401  (the benchmarks' timing, as bl.*)
    balance_note, balanced_repeats, event_time, round_order, samples, timed_rounds)

FORMULA = ("TFLOP/s = 4*B*H*Sq*Sk*D / t; causal / window / varlen count only the unmasked (q,k) "
           "pairs, exactly, per document (bottom-right aligned, FA convention)")
TIMING = ("median over repeats of (CUDA events around N back-to-back calls) / N, after warm-up, "
          "rotating over up to 4 input sets so that inputs are not all L2-resident; the repeats "
          "go round the providers in turn, in the orders of a Williams design (see round_order); "
          "samples: [ms, provider that ran just before] of each repeat")


# ---------------------------------------------------------------------------------------- cases
# The anchor table of shared/design.md: (B, H, S, D), each non-causal and causal.
ANCHORS = [(2, 16, 8192, 128), (2, 32, 8192, 64), (4, 16, 4096, 128), (8, 16, 2048, 128),
           (2, 8, 8192, 256)]
# Causal sweep at 32k tokens, 16 heads: S = 1k .. 16k, B = 32768 / S.
CAUSAL_SEQLENS = [1024, 2048, 4096, 8192, 16384]
CAUSAL_TOKENS = 32768
IMB_HEADS = 16
# Zipf-like document mix: L_r = 12288 / r rounded to a multiple of 64, r = 1..13, the last one
# trimmed so that the total is 38,912 tokens (several lengths are not multiples of the 128 tile).
ZIPF_DOCS = (12288, 6144, 4096, 3072, 2432, 2048, 1728, 1536, 1344, 1216, 1088, 1024, 896)
DOC_SETS = {
    "1x16k+32x512": (16384,) + (512,) * 32,
    "16x2k": (2048,) * 16,
    f"zipf{sum(ZIPF_DOCS)}": ZIPF_DOCS,
}
WINDOW_CASES = [(4, 16, 8192, 128, (1024, 0))]  # (B, H, S, D, (left, right)), causal
# Grouped-query attention (B, query heads, KV heads, S, D), each non-causal and causal.
GQA_CASES = [(2, 32, 8, 8192, 128)]
GROUPS = ("anchors", "gqa", "causal", "docs", "window", "extra")
GROUP_ALIASES = {"all": GROUPS, "imbalanced": ("causal", "docs", "window"),
                 "varlen": ("docs",)}
# Host time per call (issue 16): small calls, where the host work is the cost. Not in "all":
# measured in microseconds per call (bench_fwd.py --set host), not TFLOP/s.
HOST_GROUP = "host"
HOST_DOCS = (100, 28, 256, 128)  # the varlen call: 4 documents, 512 tokens
HOST_PROVIDERS = ("fa4_aot", "fa4_aot_op", "fa4", "cudnn", "sdpa")
HOST_NAMES = {"fa4_aot": "fa4_aot", "fa4_aot_op": "fa4_aot op", "fa4": "FA4", "cudnn": "cuDNN",
              "sdpa": "sdpa"}
HOST_TIMING = ("host clock around N back-to-back calls of the same call + one synchronize, / N "
               "(us_per_call); median over repeats taken round the providers in turn (round_order); "
               "enqueue_us: the same clock stopped before the synchronize")


@dataclass(frozen=True)
class Case:
    """One benchmark problem. Dense cases have ``batch`` x ``seqlen``; varlen cases have
    ``docs`` (per-document lengths, q and k alike, packed as (total, heads, head_dim))."""

    group: str
    label: str
    heads: int
    head_dim: int
    causal: bool
    batch: int = 1
    seqlen_q: int = 0
    seqlen_k: int = 0
    window: tuple | None = None  # (left, right), -1 = unbounded
    docs: tuple | None = None
    heads_k: int = 0  # key/value heads (GQA); 0 = heads
    dtype: str = ""  # "bf16" / "fp16"; "" = the run's --dtype

    @property
    def kv_heads(self) -> int:
        return self.heads_k or self.heads

    @property
    def varlen(self) -> bool:
        return self.docs is not None

    @property
    def num_seqs(self) -> int:
        return len(self.docs) if self.varlen else self.batch

    @property
    def tokens(self) -> int:
        return sum(self.docs) if self.varlen else self.batch * self.seqlen_q

    @property
    def kv_tokens(self) -> int:
        return sum(self.docs) if self.varlen else self.batch * self.seqlen_k

    def seqlens(self) -> list[tuple[int, int]]:
        """(seqlen_q, seqlen_k) of every batch entry / document."""
        if self.varlen:
            return [(n, n) for n in self.docs]
        return [(self.seqlen_q, self.seqlen_k)] * self.batch

    def cu_seqlens(self) -> list[int]:
        out = [0]
        for sq, _ in self.seqlens():
            out.append(out[-1] + sq)
        return out

    @property
    def max_seqlen(self) -> int:
        return max(sq for sq, _ in self.seqlens())

    def pairs(self) -> int:
        return sum(visible_pairs(sq, sk, self.causal, self.window) for sq, sk in self.seqlens())

    def flops(self) -> int:
        return 4 * self.heads * self.head_dim * self.pairs()

    def to_dict(self) -> dict:
        d = asdict(self)
        d["window"] = list(self.window) if self.window else None
        d["docs"] = list(self.docs) if self.docs else None
        d["tokens"] = self.tokens
        d["flops"] = self.flops()
        return d


def _kilo(n: int) -> str:
    return f"{n // 1024}k" if n % 1024 == 0 and n >= 1024 else str(n)


def dense_case(b, h, s, d, causal, group="anchors", label=None, **fields) -> Case:
    """``s`` queries of ``b`` sequences against ``seqlen_k`` keys (default ``s``; causal is
    bottom-right aligned); ``fields``: further :class:`Case` fields (``window``, ``heads_k``,
    ``seqlen_k``, ``dtype``)."""
    window, hk = fields.pop("window", None), fields.get("heads_k", 0)
    if label is None:
        gqa = bool(hk) and hk != h
        label = f"gqa {b}x{h}q/{hk}kvx{s}x{d}" if gqa else f"{b}x{h}x{s}x{d}"
        label += " causal" if causal else ""
        if window:
            label += f" window{tuple(window)}"
    return Case(group, label, h, d, causal, batch=b, seqlen_q=s,
                window=tuple(window) if window else None, **{"seqlen_k": s, **fields})


def extra_cases() -> list[Case]:
    """Shapes the other groups miss: hd96 and hd192, fp16, one long causal sequence, and chunked
    prefill (a chunk of new queries against a longer cache, causal bottom-right)."""
    out = []
    for d in (96, 192):
        out += [dense_case(2, 16, 8192, d, c, group="extra") for c in (False, True)]
    out += [dense_case(2, 16, 8192, 128, c, group="extra", dtype="fp16",
                       label=f"2x16x8192x128{' causal' if c else ''} fp16") for c in (False, True)]
    out.append(dense_case(1, 32, 32768, 128, True, group="extra"))
    for b, sq, sk in ((4, 2048, 16384), (16, 512, 8192)):
        out.append(dense_case(b, 32, sq, 128, True, group="extra", heads_k=8, seqlen_k=sk,
                              label=f"chunked prefill {b}x({_kilo(sq)} on {_kilo(sk)}) 32/8 "
                                    f"hd128"))
    return out


def host_cases() -> list[Case]:
    """The host-time group: a small dense call, a small GQA call, a decode call (one query
    row, GQA) and a small varlen call."""
    return [
        Case(HOST_GROUP, "dense 1x128x1x64", 1, 64, False, batch=1, seqlen_q=128, seqlen_k=128),
        Case(HOST_GROUP, "gqa 2x256 8/2 heads hd128 causal", 8, 128, True, batch=2,
             seqlen_q=256, seqlen_k=256, heads_k=2),
        Case(HOST_GROUP, "decode B=8 Sk=1024 32/8 heads hd128", 32, 128, False, batch=8,
             seqlen_q=1, seqlen_k=1024, heads_k=8),
        Case(HOST_GROUP, f"varlen {len(HOST_DOCS)} docs {sum(HOST_DOCS)} tok 4 heads hd128 causal",
             4, 128, True, docs=HOST_DOCS),
    ]


def build_cases(groups="all") -> list[Case]:
    """Cases of the groups named (comma list or iterable of anchors, causal, docs, window,
    host, or the aliases all, imbalanced, varlen), in table order."""
    if isinstance(groups, str):
        groups = [g.strip() for g in groups.split(",") if g.strip()]
    wanted = []
    for g in groups:
        for x in GROUP_ALIASES.get(g, (g,)):
            if x not in GROUPS + (HOST_GROUP,):
                raise ValueError(f"unknown case group {x!r}; choose from "
                                 f"{', '.join(GROUPS + (HOST_GROUP,) + tuple(GROUP_ALIASES))}")
            if x not in wanted:
                wanted.append(x)
    cases: list[Case] = []
    for g in GROUPS:
        if g not in wanted:
            continue
        if g == "anchors":
            cases += [dense_case(b, h, s, d, c) for b, h, s, d in ANCHORS for c in (False, True)]
        elif g == "gqa":
            cases += [dense_case(b, h, s, d, c, group="gqa", heads_k=hk)
                      for b, h, hk, s, d in GQA_CASES for c in (False, True)]
        elif g == "causal":
            for d in (128, 64):
                for s in CAUSAL_SEQLENS:
                    b = CAUSAL_TOKENS // s
                    cases.append(dense_case(b, IMB_HEADS, s, d, True, group="causal",
                                            label=f"causal S={s} B={b} hd{d}"))
        elif g == "docs":
            for causal, dims in ((True, (128, 64)), (False, (128,))):
                for name, docs in DOC_SETS.items():
                    for d in dims:
                        label = f"docs {name} {'causal' if causal else 'full'} hd{d}"
                        cases.append(Case("docs", label, IMB_HEADS, d, causal, docs=tuple(docs)))
        elif g == "window":
            for b, h, s, d, w in WINDOW_CASES:
                cases.append(dense_case(b, h, s, d, True, group="window", window=w,
                                        label=f"window{w} S={s} B={b} hd{d}"))
        elif g == "extra":
            cases += extra_cases()
    if HOST_GROUP in wanted:
        cases += host_cases()
    return cases


def doc_lens(spec: str) -> list[int]:
    """``16384+512*32`` -> document lengths (joined by ``+``; ``N*k``: k documents of N)."""
    return [int(n) for tok in spec.split("+")
            for n in ([tok.split("*")[0]] * int(tok.split("*")[1]) if "*" in tok else [tok])]


def parse_shapes(spec: str) -> list[Case]:
    """``B,H,S,D[,c][,wL:R];...`` -> dense cases (c = causal, wL:R = window (L, R))."""
    cases = []
    for item in spec.split(";"):
        f = [x.strip() for x in item.split(",") if x.strip()]
        if len(f) < 4:
            raise ValueError(f"shape {item!r}: expected B,H,S,D[,c][,wL:R]")
        b, h, s, d = (int(x) for x in f[:4])
        causal, window = False, None
        for extra in f[4:]:
            if extra == "c":
                causal = True
            elif extra.startswith("w"):
                lo, hi = extra[1:].split(":")
                window = (int(lo), int(hi))
            else:
                raise ValueError(f"shape {item!r}: unknown flag {extra!r}")
        cases.append(dense_case(b, h, s, d, causal, group="custom", window=window))
    return cases


def filter_cases(cases, substrings: str | None):
    if not substrings:
        return list(cases)
    keys = [s.strip() for s in substrings.split(",") if s.strip()]
    return [c for c in cases if any(k in c.label for k in keys)]


# ------------------------------------------------------------------------------- FLOP counting
def row_range(i: int, sq: int, sk: int, causal: bool, window=None) -> tuple[int, int]:
    """Keys [lo, hi] (inclusive) row i of a (sq, sk) block sees; empty when hi < lo."""
    off = sk - sq
    left, right = tuple(window) if window else (-1, -1)
    if causal:
        right = 0
    lo = 0 if left < 0 else max(0, i + off - left)
    hi = sk - 1 if right < 0 else min(sk - 1, i + off + right)
    return lo, hi


def visible_pairs(sq: int, sk: int, causal: bool = False, window=None) -> int:
    """Number of unmasked (q, k) pairs of one (sq, sk) attention block (exact)."""
    if not causal and not window:
        return sq * sk
    return _visible_pairs(int(sq), int(sk), bool(causal), tuple(window) if window else None)


@functools.lru_cache(maxsize=4096)
def _visible_pairs(sq: int, sk: int, causal: bool, window) -> int:
    total = 0
    for i in range(sq):
        lo, hi = row_range(i, sq, sk, causal, window)
        if hi >= lo:
            total += hi - lo + 1
    return total


def tflops(flops: float, ms: float | None) -> float | None:
    if ms is None or ms <= 0 or not math.isfinite(ms):
        return None
    return flops / ms / 1e9


# ------------------------------------------------------------------------------------ providers
PROVIDER_NAMES = {"cudnn": "cuDNN", "flash": "flash", "fa4": "FA4"}
BASELINE = "cudnn"


def parse_provider(p: str) -> tuple[str, str, str]:
    """``fa4_aot:<scheduler>[:<variant>]`` | cudnn | flash | fa4 -> (kind, scheduler, variant)."""
    parts = p.split(":")
    if parts[0] == "fa4_aot":
        if len(parts) < 2 or not parts[1]:
            raise ValueError(f"provider {p!r}: expected fa4_aot:<scheduler>[:<variant>]")
        return "fa4_aot", parts[1], parts[2] if len(parts) > 2 else ""
    if parts[0] not in PROVIDER_NAMES or len(parts) > 1:
        raise ValueError(f"unknown provider {p!r}; use fa4_aot:<sched>[:<variant>], "
                         f"{', '.join(PROVIDER_NAMES)}")
    return parts[0], "", ""


def display_name(p: str) -> str:
    kind, sched, var = parse_provider(p)
    if kind == "fa4_aot":
        return f"aot/{sched}" + (f"/{var}" if var else "")
    return PROVIDER_NAMES[kind]


VARLEN_KEYS = ("cu_seqlens_q", "cu_seqlens_k", "max_seqlen_q", "max_seqlen_k")


def api_features(fn) -> dict:
    """Which optional keywords ``fn`` (fa4_aot.attention) accepts: {'varlen': bool, 'window':
    bool}. A ``**kwargs`` catch-all does not count as support."""
    try:
        params = inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return {"varlen": False, "window": False}
    return {"varlen": all(k in params for k in VARLEN_KEYS), "window": "window_size" in params}


def needs(case: Case) -> list[str]:
    """API features a case needs from fa4_aot.attention."""
    out = []
    if case.varlen:
        out.append("varlen")
    if case.window:
        out.append("window")
    return out


def filter_kwargs(fn, kwargs: dict) -> dict:
    """The subset of ``kwargs`` that ``fn`` names (all of them if it takes ``**kwargs``)."""
    try:
        params = inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return dict(kwargs)
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
        return dict(kwargs)
    return {k: v for k, v in kwargs.items() if k in params}


# ------------------------------------------------------------------------------ result records
@dataclass
class Result:
    """One (case, provider) measurement. ``ms`` None = not measured; ``note`` says why or how."""

    ms: float | None = None
    method: str = ""
    note: str = ""
    max_diff: float | None = None  # vs the reference provider's output, relative (see bench_fwd)
    mismatch: bool = False
    error: str = ""  # the full exception text when the provider raised (note has its type)
    us_per_call: float | None = None  # host group: host clock per call, sync at the end
    enqueue_us: float | None = None  # host group: the same before the sync
    samples: list | None = None  # [ms, provider that ran just before] of each repeat

    def to_dict(self) -> dict:
        d = asdict(self)
        for k in ("us_per_call", "enqueue_us", "samples"):  # where measured only
            if d[k] is None:
                del d[k]
        return d


@dataclass
class Row:
    case: Case
    results: dict = field(default_factory=dict)  # provider -> Result

    def tflops(self, p: str) -> float | None:
        r = self.results.get(p)
        return None if r is None else tflops(self.case.flops(), r.ms)

    def ratio(self, p: str, baseline: str = BASELINE) -> float | None:
        a, b = self.tflops(p), self.tflops(baseline)
        return None if a is None or b is None or b == 0 else a / b

    def to_dict(self, providers, baseline=BASELINE) -> dict:
        out = {"group": self.case.group, "label": self.case.label, "case": self.case.to_dict(),
               "providers": {}}
        for p in providers:
            r = self.results.get(p, Result(note="not run"))
            d = r.to_dict()
            t = self.tflops(p)
            d["tflops"] = None if t is None else round(t, 2)
            q = self.ratio(p, baseline)
            d["ratio_vs_" + baseline] = None if q is None else round(q, 4)
            out["providers"][p] = d
        return out


def _fmt_num(x: float | None, nd=1) -> str:
    return "n/a" if x is None else f"{x:.{nd}f}"


def row_notes(row: Row, providers) -> str:
    """Short text for the table's notes column: how peers ran, why cells are n/a."""
    parts, seen = [], {}
    for p in providers:
        r = row.results.get(p)
        if r is None:
            continue
        text = r.note if r.ms is None else r.method
        if r.ms is not None and r.mismatch:
            text = (text + "; " if text else "") + f"MISMATCH {r.max_diff:.3g}"
        if not text or text in ("sdpa", "fa4_aot", "cu_seqlens", "flash_attn_func"):
            continue
        seen.setdefault(text, []).append(p)
    for text, ps in seen.items():
        kinds = {parse_provider(p)[0] for p in ps}
        who = "aot" if kinds == {"fa4_aot"} and len(ps) > 1 else "/".join(display_name(p) for p in ps)
        parts.append(f"{who}: {text}")
    return "; ".join(parts)


def format_table(rows, providers, baseline=BASELINE, title=None, notes=True) -> str:
    """Fixed-width table: one line per case; cells are TFLOP/s and, for non-baseline providers,
    the ratio to the baseline (e.g. ``612.3 0.92x``); n/a when not measured."""
    label_w = max([len("case")] + [len(r.case.label) for r in rows])
    heads = [display_name(p) for p in providers]
    cells = []
    for r in rows:
        line = []
        for p in providers:
            t = r.tflops(p)
            s = _fmt_num(t)
            if t is not None and p != baseline:
                q = r.ratio(p, baseline)
                s += f" {q:.2f}x" if q is not None else "      "
            if t is not None and r.results[p].mismatch:
                s += "!"
            line.append(s)
        cells.append(line)
    widths = [max(len(h), *(len(c[i]) for c in cells)) if cells else len(h)
              for i, h in enumerate(heads)]
    out = []
    if title:
        out.append(title)
    hdr = f"{'case':<{label_w}}  " + "  ".join(f"{h:>{w}}" for h, w in zip(heads, widths))
    if notes:
        hdr += "  notes"
    out.append(hdr)
    out.append("-" * len(hdr))
    group = None
    for r, line in zip(rows, cells):
        if group is not None and r.case.group != group:
            out.append("")
        group = r.case.group
        s = f"{r.case.label:<{label_w}}  " + "  ".join(f"{c:>{w}}" for c, w in zip(line, widths))
        if notes:
            n = row_notes(r, providers)
            if n:
                s += "  " + n
        out.append(s.rstrip())
    return "\n".join(out)


CSV_FIELDS = ["group", "case", "provider", "method", "ms", "tflops", "ratio_vs_cudnn", "flops",
              "batch", "heads", "head_dim", "seqlen_q", "seqlen_k", "causal", "window", "docs",
              "tokens", "max_diff", "mismatch", "note"]


def csv_text(rows, providers, baseline=BASELINE) -> str:
    """Long format: one line per (case, provider)."""
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=CSV_FIELDS, lineterminator="\n")
    w.writeheader()
    for r in rows:
        c = r.case
        for p in providers:
            res = r.results.get(p, Result(note="not run"))
            t, q = r.tflops(p), r.ratio(p, baseline)
            w.writerow({
                "group": c.group, "case": c.label, "provider": p, "method": res.method,
                "ms": "" if res.ms is None else f"{res.ms:.6g}",
                "tflops": "" if t is None else f"{t:.2f}",
                "ratio_vs_cudnn": "" if q is None else f"{q:.4f}",
                "flops": c.flops(), "batch": c.num_seqs, "heads": c.heads, "head_dim": c.head_dim,
                "seqlen_q": c.seqlen_q if not c.varlen else c.max_seqlen,
                "seqlen_k": c.seqlen_k if not c.varlen else c.max_seqlen,
                "causal": int(c.causal),
                "window": "" if not c.window else f"{c.window[0]}:{c.window[1]}",
                "docs": "" if not c.varlen else " ".join(map(str, c.docs)),
                "tokens": c.tokens,
                "max_diff": "" if res.max_diff is None else f"{res.max_diff:.4g}",
                "mismatch": int(res.mismatch), "note": res.note,
            })
    return buf.getvalue()


def write_csv(path, rows, providers, baseline=BASELINE):
    Path(path).write_text(csv_text(rows, providers, baseline))


def json_doc(rows, providers, meta=None, baseline=BASELINE) -> dict:
    return {"formula": FORMULA, "timing": TIMING, "baseline": baseline,
            "providers": list(providers), "meta": meta or {},
            "rows": [r.to_dict(providers, baseline) for r in rows]}


def write_json(path, rows, providers, meta=None, baseline=BASELINE):
    Path(path).write_text(json.dumps(json_doc(rows, providers, meta, baseline), indent=1))


def rows_from_json(doc: dict) -> tuple[list[Row], list[str]]:
    """Inverse of :func:`json_doc` (re-plot or re-tabulate a saved run without a GPU). Rows of
    other benchmarks in the same file (``bench_decode.py``: groups ``decode`` and ``paged``,
    whose cases have other fields) are left out."""
    rows = []
    fields = {f.name for f in dataclasses.fields(Case)}
    for d in doc["rows"]:
        c = dict(d["case"])
        c.pop("tokens", None)
        c.pop("flops", None)
        if set(c) - fields:
            continue
        c["window"] = tuple(c["window"]) if c.get("window") else None
        c["docs"] = tuple(c["docs"]) if c.get("docs") else None
        row = Row(Case(**c))
        for p, r in d["providers"].items():
            row.results[p] = Result(**{k: r[k] for k in ("ms", "method", "note", "max_diff",
                                                          "mismatch", "error", "us_per_call",
                                                          "enqueue_us", "samples")
                                       if k in r})
        rows.append(row)
    return rows, list(doc["providers"])


def host_rows_from_json(doc: dict) -> tuple[list[Row], list[str]]:
    """The ``host`` rows of a saved file (and their providers)."""
    rows, _ = rows_from_json({"rows": [d for d in doc["rows"] if d["group"] == HOST_GROUP],
                              "providers": []})
    return rows, list(doc.get("host_providers", HOST_PROVIDERS))


def merge_json(path, rows, providers, meta=None, baseline=BASELINE, host_providers=None):
    """Write ``rows`` into the bench file at ``path``, keeping the rows of every group this run
    did not measure (a ``--set host`` run keeps the TFLOP/s groups and vice versa). The
    top-level ``meta`` is the new run's when it measured a TFLOP/s group, else the file's; each
    group's run meta is kept under ``meta["group_meta"]``."""
    path = Path(path)
    new_groups = list(dict.fromkeys(r.case.group for r in rows))
    tflops_rows = [r for r in rows if r.case.group != HOST_GROUP]
    host_rows = [r for r in rows if r.case.group == HOST_GROUP]
    old = None
    if path.is_file():
        try:
            old = json.loads(path.read_text())
        except ValueError:
            old = None
    doc = json_doc(tflops_rows, providers, meta, baseline)
    doc["rows"] += [r.to_dict(host_providers or HOST_PROVIDERS, baseline) for r in host_rows]
    if host_rows:
        doc["host_timing"] = HOST_TIMING
        doc["host_providers"] = list(host_providers or HOST_PROVIDERS)
    group_meta = {g: meta or {} for g in new_groups}
    if old is not None and isinstance(old.get("rows"), list):
        kept = [d for d in old["rows"] if d.get("group") not in new_groups]
        if not tflops_rows:
            doc["meta"] = old.get("meta", {})
            doc["providers"] = old.get("providers", [])
        elif any(d.get("group") != HOST_GROUP for d in kept):
            doc["providers"] = list(dict.fromkeys(doc["providers"] + old.get("providers", [])))
        if not host_rows and "host_providers" in old:
            doc["host_providers"] = old["host_providers"]
            doc["host_timing"] = old.get("host_timing", HOST_TIMING)
        order = GROUPS + (HOST_GROUP,)
        rank = {g: i for i, g in enumerate(order)}
        doc["rows"] = sorted(kept + doc["rows"], key=lambda d: rank.get(d.get("group"),
                                                                       len(order)))
        group_meta = {**old.get("meta", {}).get("group_meta", {}), **group_meta}
    doc["meta"] = {**doc["meta"], "group_meta": {
        g: {k: v for k, v in m.items() if k != "group_meta"} for g, m in group_meta.items()}}
    path.write_text(json.dumps(doc, indent=1))
    return doc


def format_host_table(rows, providers, title=None) -> str:
    """us per call, one line per host case; then fa4_aot / sdpa and fa4_aot's enqueue time
    (the host clock before the final synchronize: below us per call when the GPU is the
    bottleneck)."""
    label_w = max([len("case")] + [len(r.case.label) for r in rows])
    heads = [HOST_NAMES.get(p, p) for p in providers] + ["aot/sdpa", "aot enqueue"]
    cells = []
    for r in rows:
        line = []
        for p in providers:
            res = r.results.get(p)
            u = None if res is None else res.us_per_call
            line.append("n/a" if u is None else f"{u:.1f}")
        a, b = (r.results.get(p) for p in ("fa4_aot", "sdpa"))
        ua = a.us_per_call if a else None
        ub = b.us_per_call if b else None
        line.append("n/a" if ua is None or not ub else f"{ua / ub:.2f}x")
        line.append("n/a" if a is None or a.enqueue_us is None else f"{a.enqueue_us:.1f}")
        cells.append(line)
    widths = [max(len(h), *(len(c[i]) for c in cells)) if cells else len(h)
              for i, h in enumerate(heads)]
    out = [title] if title else []
    hdr = f"{'case (us per call)':<{label_w}}  " + "  ".join(
        f"{h:>{w}}" for h, w in zip(heads, widths))
    out += [hdr, "-" * len(hdr)]
    for r, line in zip(rows, cells):
        s = f"{r.case.label:<{label_w}}  " + "  ".join(f"{c:>{w}}" for c, w in zip(line, widths))
        plain = ("", "eager", "sdpa", "torch.ops.fa4_aot.fwd", "flash_attn_func")
        notes = "; ".join(f"{HOST_NAMES.get(p, p)}: {r.results[p].note or r.results[p].method}"
                          for p in providers if p in r.results
                          and (r.results[p].note or r.results[p].method not in plain))
        out.append((s + ("  " + notes if notes else "")).rstrip())
    return "\n".join(out)


# ------------------------------------------------------------------------------------ plotting
def pyplot():
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    return plt


PROVIDER_COLORS = {"fa4_aot:single": "#9ecae1", "fa4_aot:static": "#4292c6",
                   "fa4_aot:steal": "#08306b", "cudnn": "#d62728", "flash": "#9467bd",
                   "fa4": "#2ca02c"}


def provider_color(p: str, j: int):
    if p in PROVIDER_COLORS:
        return PROVIDER_COLORS[p]
    import matplotlib
    return matplotlib.colormaps["tab10"]((j + 5) % 10)


def plot_bars(rows, providers, path, title="fa4_aot forward, bf16", baseline=BASELINE):
    """Grouped bar chart, one panel per case group: TFLOP/s per case and provider; n/a shown as
    a small 'n/a' at the base of the missing bar."""
    plt = pyplot()
    groups = []
    for r in rows:
        if not groups or groups[-1][0] != r.case.group:
            groups.append((r.case.group, []))
        groups[-1][1].append(r)
    n_prov = len(providers)
    width = 0.8 / max(n_prov, 1)
    from matplotlib.patches import Patch
    max_cases = max(len(g[1]) for g in groups) if groups else 1
    fig, axes = plt.subplots(len(groups) or 1, 1, squeeze=False,
                             figsize=(max(8.0, 0.9 * max_cases * max(1, n_prov) * 0.35 + 3),
                                      3.6 * max(1, len(groups))))
    for ax, (gname, grows) in zip(axes[:, 0], groups):
        for j, p in enumerate(providers):
            xs, ys = [], []
            for i, r in enumerate(grows):
                x = i + (j - (n_prov - 1) / 2) * width
                t = r.tflops(p)
                if t is None:
                    ax.text(x, 0, "n/a", rotation=90, ha="center", va="bottom", fontsize=6,
                            color="0.5")
                else:
                    xs.append(x)
                    ys.append(t)
            ax.bar(xs, ys, width=width, color=provider_color(p, j),
                   edgecolor="black" if p == baseline else "none", linewidth=0.6)
        ax.set_xticks(range(len(grows)))
        ax.set_xticklabels([r.case.label for r in grows], rotation=20, ha="right", fontsize=7)
        ax.set_ylabel("TFLOP/s")
        ax.set_title(gname, fontsize=9, loc="left")
        ax.grid(axis="y", alpha=0.3)
        ax.set_xlim(-0.6, max(len(grows), 4) - 0.4)  # a lone case keeps normal bar widths
    handles = [Patch(facecolor=provider_color(p, j), edgecolor="black" if p == baseline else
                     "none", label=display_name(p)) for j, p in enumerate(providers)]
    axes[0, 0].legend(handles=handles, fontsize=7, ncol=min(n_prov, 7), loc="upper left",
                      bbox_to_anchor=(0, 1.25 if len(groups) > 1 else 1.18))
    fig.suptitle(title, fontsize=10)
    fig.text(0.01, 0.002, FORMULA, fontsize=6, color="0.4")
    fig.tight_layout(rect=(0, 0.015, 1, 0.97))
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


# ------------------------------------------------------------------------------------- misc
def median(xs):
    xs = [x for x in xs if x is not None]
    return statistics.median(xs) if xs else None
