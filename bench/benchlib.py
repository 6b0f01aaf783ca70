"""Pure parts of the benchmarks: case lists, FLOP counting, tables, CSV/JSON, plots, schedule-trace
statistics and rendering. No torch and no GPU here: ``tests/test_bench_cpu.py`` imports this module
on a CPU-only machine. numpy and matplotlib are imported only by the functions that need them.

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

FORMULA = ("TFLOP/s = 4*B*H*Sq*Sk*D / t; causal / window / varlen count only the unmasked (q,k) "
           "pairs, exactly, per document (bottom-right aligned, FA convention)")
TIMING = ("median over repeats of (CUDA events around N back-to-back calls) / N, after warm-up, "
          "rotating over up to 4 input sets so that inputs are not all L2-resident; the repeats "
          "go round the providers in turn, in the orders of a Williams design (see round_order); "
          "samples: [ms, provider that ran just before] of each repeat")


def event_time(fn, iters: int) -> float:
    """Milliseconds per call of ``fn()``: CUDA events around ``iters`` back-to-back calls on the
    current stream, divided by ``iters`` (host launch cost hides behind the GPU unless it is
    longer than the kernel). torch is imported here, not by this module."""
    import torch
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(iters):
        fn()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) / iters


def round_order(providers, r):
    """The order in which round ``r`` of a benchmark times its providers: row ``r`` (cyclically)
    of a Williams design (:func:`_williams_rows`). Over one cycle (2n rows for n providers, n
    when n is even) every provider takes every position equally often and runs right after
    every other provider equally often, so neither the position nor the provider that ran
    before favours anyone. Near the GPU's power cap that matters: a kernel's clock depends on
    the load that ran before it (100 ms of its own calls first did not undo that), and with
    three providers in the old order (reversed every other round) the middle one followed the
    low-power cuDNN turn in every other round and gained up to 10 % on packed documents
    (docs/perf-notes.md v24). Two providers: A B, B A, as before.
    """
    providers = list(providers)
    if len(providers) < 2:
        return providers
    rows = _williams_rows(len(providers))
    return [providers[i] for i in rows[r % len(rows)]]


@functools.lru_cache(maxsize=None)
def _williams_rows(n: int) -> tuple:
    """The rows of :func:`round_order` for ``n >= 2`` providers: rows i = 0..n-1 are
    ``(x + i) % n`` for x in 0, 1, n-1, 2, n-2, ...; for odd n the n rows reversed follow.

    The rows run back to back, so a row's last provider is the next row's first one's
    predecessor too. With odd n the cycle's rows are put in an order in which no provider ends
    one row and starts the next (then it would run two turns in a row, and which load came
    before that pair would differ by provider: in the rows' plain order, three providers
    P0 P1 P2, P0's pair followed P1's turn and P1's followed P2's; docs/perf-notes.md v34), and
    no ordered pair of providers meets at more than one row boundary: for three providers every
    ordered pair then follows each other three times in the cycle, and nobody follows itself.
    The last row ends with the last provider, as the warm-up before the first round does (the
    providers in their order), so the first round starts as every later cycle does.
    Even n > 2 has no such boundary (its rows' order is the plain one); n = 2 keeps A B, B A
    (each provider runs twice in a row once a cycle, after the other one's turn: the same for
    both)."""
    first, lo, hi = [0], 1, n - 1
    while len(first) < n:  # 0, 1, n-1, 2, n-2, ...
        if len(first) % 2:
            first.append(lo)
            lo += 1
        else:
            first.append(hi)
            hi -= 1
    rows = [tuple((x + i) % n for x in first) for i in range(n)]
    if n % 2 == 0:
        return tuple(rows)
    rows += [row[::-1] for row in rows]

    def chain(seq, pairs):  # depth-first: the rows in a cyclic order with distinct boundaries
        if len(seq) == len(rows):
            # the last row ends with provider n - 1, as the warm-up does, and hands over to 0
            edge = (rows[seq[-1]][-1], rows[seq[0]][0])
            return seq if edge == (n - 1, 0) and edge not in pairs else None
        for j in range(len(rows)):
            edge = (rows[seq[-1]][-1], rows[j][0])
            if j not in seq and edge[0] != edge[1] and edge not in pairs:
                found = chain(seq + [j], pairs | {edge})
                if found:
                    return found
        return None

    order = chain([0], frozenset())
    assert order is not None, n
    return tuple(rows[j] for j in order)


def timed_rounds(providers, repeats, time_turn, first_after=None, on_error=None):
    """``{provider: ([ms of each repeat], [the provider that ran just before each])}``: the
    repeats taken round ``providers`` in the orders of :func:`round_order`;
    ``time_turn(provider)`` times one turn; ``first_after``: what ran before the first turn
    (the last provider warmed up). A provider whose turn raises is handed to
    ``on_error(provider, exception)`` (re-raised without one) and leaves the rotation."""
    providers = list(providers)
    out = {p: ([], []) for p in providers}
    prev = first_after
    for r in range(repeats):
        for p in round_order(providers, r):
            if p not in out:
                continue
            try:
                out[p][0].append(time_turn(p))
                out[p][1].append(prev)
            except Exception as e:  # noqa: BLE001 - the caller decides
                if on_error is None:
                    raise
                on_error(p, e)
                del out[p]
            prev = p
    return out


def samples(times, after) -> list:
    """The JSON form of a provider's repeats (``samples``, see :data:`TIMING`): ``[ms, the
    provider that ran just before]`` of each, from :func:`timed_rounds`' two lists."""
    return [[round(t, 6), a] for t, a in zip(times, after)]


def balanced_repeats(n_providers: int) -> int:
    """Rounds in one cycle of :func:`round_order` (a --repeats that is a multiple of this is
    balanced)."""
    return 1 if n_providers < 2 else (n_providers if n_providers % 2 == 0 else 2 * n_providers)


def balance_note(n_providers: int, repeats: int) -> str | None:
    """A note for the run's metadata when ``repeats`` rounds do not make whole cycles of
    :func:`round_order` (some provider then runs after another, or in a position, more often)."""
    cycle = balanced_repeats(n_providers)
    if repeats % cycle == 0:
        return None
    return (f"--repeats {repeats} is not a multiple of {cycle}: the provider orders are not "
            f"balanced over the run (benchlib.round_order)")

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


def dense_case(b, h, s, d, causal, group="anchors", window=None, label=None, hk=0, sk=None,
               dtype="") -> Case:
    """``s`` queries against ``sk`` keys (default ``s``; causal is bottom-right aligned)."""
    if label is None:
        gqa = bool(hk) and hk != h
        label = f"gqa {b}x{h}q/{hk}kvx{s}x{d}" if gqa else f"{b}x{h}x{s}x{d}"
        label += " causal" if causal else ""
        if window:
            label += f" window{tuple(window)}"
    return Case(group, label, h, d, causal, batch=b, seqlen_q=s, seqlen_k=s if sk is None else sk,
                window=tuple(window) if window else None, heads_k=hk, dtype=dtype)


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
        out.append(dense_case(b, 32, sq, 128, True, group="extra", hk=8, sk=sk,
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
            cases += [dense_case(b, h, s, d, c, group="gqa", hk=hk)
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
def _pyplot():
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
    plt = _pyplot()
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


# ------------------------------------------------------------------------------ schedule traces
# A trace is an int64 array (num_tiles, 4): (smid, cta_index, t_start_ns, t_end_ns) per output
# tile, indexed by tile id, from %globaltimer; rows of tiles never run are all zero.
TRACE_COLS = ("smid", "cta", "t_start_ns", "t_end_ns")


def trace_array(a):
    import numpy as np
    a = np.asarray(a)
    if a.ndim != 2 or a.shape[1] != 4:
        raise ValueError(f"trace must have shape (num_tiles, 4), got {a.shape}")
    return a.astype(np.int64, copy=False)


def trace_ran(a):
    """Boolean mask of tiles that ran (any non-zero field; a run tile has t_end > 0)."""
    a = trace_array(a)
    return (a != 0).any(axis=1)


def tile_decode(num_tiles: int, meta: dict | None):
    """Per-tile (m_block, head, batch) arrays, or None when the metadata cannot give them.

    meta may carry explicit per-tile lists ``m_block`` / ``head`` / ``batch`` (e.g. a varlen
    decode done by the capture side); otherwise ``num_m_blocks``, ``heads``, ``batch`` and the
    ``section`` are decoded with fa4_aot.schedule.decode_tile (the kernels' own tile order).
    Without ``section`` it is recomputed with fa4_aot.schedule.choose_section when ``seqlen_k``
    and ``head_dim`` are given."""
    import numpy as np
    meta = meta or {}
    if "m_block" in meta:
        mb = np.asarray(meta["m_block"], dtype=np.int64)
        hd = np.asarray(meta.get("head", np.zeros_like(mb)), dtype=np.int64)
        bt = np.asarray(meta.get("batch_index", np.zeros_like(mb)), dtype=np.int64)
        if len(mb) != num_tiles:
            raise ValueError(f"meta m_block has {len(mb)} entries, trace has {num_tiles} tiles")
        return mb, hd, bt
    try:
        nmb, heads, batch = int(meta["num_m_blocks"]), int(meta["heads"]), int(meta["batch"])
    except (KeyError, TypeError, ValueError):
        return None
    if nmb * heads * batch != num_tiles:
        raise ValueError(f"meta says {nmb} m-blocks x {heads} heads x {batch} batch = "
                         f"{nmb * heads * batch} tiles, trace has {num_tiles}")
    from fa4_aot.schedule import choose_section, decode_tile
    section = meta.get("section")
    if section is None:
        if "seqlen_k" in meta and "head_dim" in meta:
            section = choose_section(heads, batch, int(meta["seqlen_k"]), int(meta["head_dim"]),
                                     int(meta.get("elem_bytes", 2)),
                                     int(meta.get("qhead_per_kvhead", 1)),
                                     bool(meta.get("causal", False)))
        else:
            section = heads * batch  # one section: order is m-block-major over all (h, b)
    mb = np.empty(num_tiles, np.int64)
    hd = np.empty(num_tiles, np.int64)
    bt = np.empty(num_tiles, np.int64)
    for t in range(num_tiles):
        mb[t], hd[t], bt[t] = decode_tile(t, nmb, heads, int(section))
    return mb, hd, bt


def _union_length(starts, ends) -> float:
    total, cur_s, cur_e = 0.0, None, None
    for s, e in sorted(zip(starts, ends)):
        if cur_e is None or s > cur_e:
            if cur_e is not None:
                total += cur_e - cur_s
            cur_s, cur_e = s, e
        else:
            cur_e = max(cur_e, e)
    if cur_e is not None:
        total += cur_e - cur_s
    return total


def trace_stats(a, num_sms: int | None = None) -> dict:
    """Makespan, per-SM busy fraction (union of that SM's tile intervals / makespan; SMs with
    no tile count as 0 when ``num_sms`` is given), idle tail (from the moment the first SM runs
    out of work to the end), tile durations, tiles per CTA."""
    import numpy as np
    a = trace_array(a)
    ran = trace_ran(a)
    n_tiles, n_ran = len(a), int(ran.sum())
    st = {"tiles": n_tiles, "tiles_run": n_ran, "tiles_missing": n_tiles - n_ran}
    if n_ran == 0:
        return st
    r = a[ran]
    t0 = int(r[:, 2].min())
    s_us = (r[:, 2] - t0) / 1e3
    e_us = (r[:, 3] - t0) / 1e3
    makespan = float(e_us.max())
    sms = np.unique(r[:, 0])
    n_sms = max(int(num_sms or 0), int(r[:, 0].max()) + 1)
    busy = np.zeros(n_sms)
    last_end = np.zeros(n_sms)
    for sm in sms:
        m = r[:, 0] == sm
        busy[sm] = _union_length(s_us[m], e_us[m]) / makespan if makespan > 0 else 1.0
        last_end[sm] = e_us[m].max()
    used = busy[sms]
    dur = e_us - s_us
    ctas = np.unique(r[:, 1], return_counts=True)[1]
    first_idle = float(last_end[sms].min())
    st.update({
        "makespan_us": makespan,
        "sms_used": int(len(sms)), "sms": n_sms,
        "busy_mean": float(busy.mean()), "busy_min": float(used.min()),
        "busy_median": float(np.median(used)), "busy_max": float(used.max()),
        "busy_per_sm": [round(float(x), 4) for x in busy],
        "idle_frac": float(1 - busy.mean()),
        "tail_us": makespan - first_idle,
        "tail_frac": (makespan - first_idle) / makespan if makespan > 0 else 0.0,
        "tile_us_min": float(dur.min()), "tile_us_median": float(np.median(dur)),
        "tile_us_max": float(dur.max()),
        "ctas": int(len(ctas)), "tiles_per_cta_min": int(ctas.min()),
        "tiles_per_cta_max": int(ctas.max()),
    })
    return st


def format_trace_stats(st: dict, title: str = "") -> str:
    if st.get("tiles_run", 0) == 0:
        return f"{title}: no tile ran (all {st.get('tiles', 0)} rows are zero)"
    rows = [
        ("tiles run / total", f"{st['tiles_run']} / {st['tiles']}"
         + (f"  ({st['tiles_missing']} never ran!)" if st["tiles_missing"] else "")),
        ("CTAs, tiles per CTA", f"{st['ctas']}, {st['tiles_per_cta_min']}..{st['tiles_per_cta_max']}"),
        ("SMs used / SMs", f"{st['sms_used']} / {st['sms']}"),
        ("makespan", f"{st['makespan_us']:.1f} us"),
        ("SM busy mean (min/median/max)",
         f"{st['busy_mean']:.3f} ({st['busy_min']:.3f} / {st['busy_median']:.3f} / "
         f"{st['busy_max']:.3f})"),
        ("idle SM-time", f"{100 * st['idle_frac']:.1f} %"),
        ("idle tail (first SM idle -> end)", f"{st['tail_us']:.1f} us "
         f"({100 * st['tail_frac']:.1f} % of makespan)"),
        ("tile time min/median/max", f"{st['tile_us_min']:.1f} / {st['tile_us_median']:.1f} / "
         f"{st['tile_us_max']:.1f} us"),
    ]
    w = max(len(k) for k, _ in rows)
    out = [title] if title else []
    out += [f"{k:<{w}}  {v}" for k, v in rows]
    return "\n".join(out)


def assign_lanes(starts, ends, key):
    """Per-tile lane within its SM row so that overlapping tiles (several resident CTAs) do not
    draw over each other: greedy interval colouring per SM. Returns (lane, lanes_per_sm)."""
    import numpy as np
    n = len(starts)
    lane = np.zeros(n, np.int64)
    lanes = {}
    order = np.lexsort((starts, key))
    free_at: dict = {}
    for i in order:
        k = int(key[i])
        fl = free_at.setdefault(k, [])
        for j, t in enumerate(fl):
            if t <= starts[i]:
                lane[i] = j
                fl[j] = ends[i]
                break
        else:
            lane[i] = len(fl)
            fl.append(ends[i])
        lanes[k] = len(fl)
    return lane, lanes


def plot_trace(a, path, meta=None, color_by="auto", title=None, num_sms=None, stats=None):
    """Per-SM timeline PNG: y = SM id, x = us since the first tile start, one bar per tile,
    coloured by m_block (needs metadata), CTA, head, batch or tile order (= schedule order)."""
    import numpy as np
    plt = _pyplot()
    from matplotlib.collections import PolyCollection
    meta = meta or {}
    a = trace_array(a)
    ran = trace_ran(a)
    ids = np.nonzero(ran)[0]
    r = a[ran]
    st = stats or trace_stats(a, num_sms or meta.get("num_sms"))
    fig, ax = plt.subplots(figsize=(12, 6.5))
    sched = meta.get("scheduler", "?")
    if title is None:
        title = f"schedule trace — scheduler: {sched}"
        if meta.get("label"):
            title += f" — {meta['label']}"
    if len(r) == 0:
        ax.text(0.5, 0.5, "no tile ran", ha="center", transform=ax.transAxes)
        ax.set_title(title)
        fig.savefig(path, dpi=110)
        plt.close(fig)
        return path
    t0 = r[:, 2].min()
    s = (r[:, 2] - t0) / 1e3
    e = (r[:, 3] - t0) / 1e3
    dec = None
    if color_by in ("auto", "m_block", "head", "batch"):
        try:
            dec = tile_decode(len(a), meta)
        except Exception as ex:  # noqa: BLE001 - fall back to a colouring that needs no meta
            print(f"trace: cannot decode tiles ({ex}); colouring by CTA")
            dec = None
    if color_by == "auto":
        color_by = "m_block" if dec is not None else "cta"
    if color_by in ("m_block", "head", "batch") and dec is None:
        print(f"trace: colouring by {color_by} needs metadata (num_m_blocks, heads, batch); "
              "colouring by CTA")
        color_by = "cta"
    if color_by == "m_block":
        cval, cmap_name = dec[0][ids], "viridis"
    elif color_by == "head":
        cval, cmap_name = dec[1][ids], "tab20"
    elif color_by == "batch":
        cval, cmap_name = dec[2][ids], "tab10"
    elif color_by == "order":
        cval, cmap_name = ids, "viridis"
    elif color_by == "cta":
        cval, cmap_name = r[:, 1], "tab20"
    else:
        raise ValueError(f"color_by must be auto, m_block, cta, head, batch or order; "
                         f"got {color_by!r}")
    lane, lanes = assign_lanes(s, e, r[:, 0])
    nl = np.array([lanes[int(k)] for k in r[:, 0]])
    h = 0.9 / nl
    y0 = r[:, 0] - 0.45 + lane * h
    verts = [((x0, b), (x0, b + hh), (x1, b + hh), (x1, b)) for x0, x1, b, hh in zip(s, e, y0, h)]
    coll = PolyCollection(verts, array=cval.astype(float), cmap=cmap_name,
                          edgecolors="face" if len(verts) > 3000 else "black",
                          linewidths=0 if len(verts) > 3000 else 0.15)
    ax.add_collection(coll)
    cb = fig.colorbar(coll, ax=ax, pad=0.01)
    cb.set_label(color_by)
    n_sms = st["sms"]
    ax.set_xlim(0, st["makespan_us"] * 1.01)
    ax.set_ylim(-1, n_sms)
    ax.set_xlabel("µs since first tile start")
    ax.set_ylabel("SM id")
    first_idle = st["makespan_us"] - st["tail_us"]
    ax.axvline(first_idle, color="red", lw=0.8, ls="--")
    ax.text(first_idle, n_sms - 0.5, "first SM idle ", color="red", fontsize=7, va="top",
            ha="right", bbox={"facecolor": "white", "alpha": 0.7, "edgecolor": "none", "pad": 1})
    ax.set_title(title, fontsize=10)
    sub = (f"makespan {st['makespan_us']:.1f} µs, SM busy {100 * st['busy_mean']:.1f} % "
           f"(min {100 * st['busy_min']:.1f} %), idle tail {st['tail_us']:.1f} µs "
           f"({100 * st['tail_frac']:.1f} %), {st['tiles_run']}/{st['tiles']} tiles, "
           f"{st['ctas']} CTAs on {st['sms_used']} SMs")
    fig.text(0.01, 0.01, sub, fontsize=8)
    fig.tight_layout(rect=(0, 0.03, 1, 1))
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def synthetic_trace(scheduler="steal", num_sms=132, num_m_blocks=16, heads=16, batch=2,
                    causal=True, tile_m=128, tile_n=128, seqlen=None, head_dim=128,
                    ctas_per_sm=1, section=None, prologue_us=3.0, block_us=None, jitter=0.05,
                    seed=0, t0_ns=1_700_000_000_000_000_000):
    """A plausible trace for testing the renderer: list scheduling of the tiles in the kernels'
    order (fa4_aot.schedule.decode_tile) with a cost model t = prologue + n_blocks * block_us.

    single: one CTA per tile, CTAs dispatched in id order to the SM free first;
    static: ``ctas_per_sm * num_sms`` persistent CTAs, CTA c runs tiles c, c + grid, ...;
    steal:  the same CTAs, each takes the next tile in order when it finishes one.
    Returns (trace int64 (num_tiles, 4), meta dict)."""
    import heapq

    import numpy as np

    from fa4_aot.schedule import decode_tile, num_n_blocks
    rng = np.random.default_rng(seed)
    seqlen = seqlen or num_m_blocks * tile_m
    if block_us is None:  # 4*tile_m*tile_n*d FLOP at ~5.3 TFLOP/s per SM (700 TFLOP/s / 132)
        block_us = 4 * tile_m * tile_n * head_dim / 5.3e12 * 1e6
    num_tiles = num_m_blocks * heads * batch
    sec = section or heads * batch
    cost = np.empty(num_tiles)
    for t in range(num_tiles):
        mb, _, _ = decode_tile(t, num_m_blocks, heads, sec)
        nb = num_n_blocks(mb, tile_m, tile_n, seqlen, seqlen, causal)
        cost[t] = (prologue_us + nb * block_us) * (1 + jitter * rng.standard_normal())
    cost = np.maximum(cost, 0.1)
    out = np.zeros((num_tiles, 4), np.int64)
    start_skew = rng.uniform(0, 1.0, size=num_sms * max(ctas_per_sm, 1))  # launch ramp, us
    if scheduler == "single":
        slots = [(float(start_skew[i]), i % num_sms) for i in range(num_sms * ctas_per_sm)]
        heapq.heapify(slots)
        for t in range(num_tiles):
            free, sm = heapq.heappop(slots)
            out[t] = (sm, t, 0, 0)
            out[t, 2], out[t, 3] = int(free * 1e3), int((free + cost[t]) * 1e3)
            heapq.heappush(slots, (free + cost[t] + 0.5, sm))
    elif scheduler in ("static", "steal"):
        grid = min(num_tiles, ctas_per_sm * num_sms)
        sm_of = [c % num_sms for c in range(grid)]
        if scheduler == "static":
            for c in range(grid):
                now = float(start_skew[c])
                for t in range(c, num_tiles, grid):
                    out[t] = (sm_of[c], c, int(now * 1e3), int((now + cost[t]) * 1e3))
                    now += cost[t] + 0.2
        else:
            ready = [(float(start_skew[c]), c) for c in range(grid)]
            heapq.heapify(ready)
            for t in range(num_tiles):
                now, c = heapq.heappop(ready)
                out[t] = (sm_of[c], c, int(now * 1e3), int((now + cost[t]) * 1e3))
                heapq.heappush(ready, (now + cost[t] + 0.3, c))
    else:
        raise ValueError(f"scheduler must be single, static or steal, got {scheduler!r}")
    out[:, 2:] += t0_ns
    meta = {"num_m_blocks": num_m_blocks, "heads": heads, "batch": batch, "section": sec,
            "scheduler": scheduler, "num_sms": num_sms, "causal": causal, "seqlen_q": seqlen,
            "seqlen_k": seqlen, "head_dim": head_dim, "synthetic": True,
            "label": f"synthetic {batch}x{heads}x{seqlen}x{head_dim}"
                     + (" causal" if causal else "")}
    return out, meta


# ------------------------------------------------------------------------------------- misc
def median(xs):
    xs = [x for x in xs if x is not None]
    return statistics.median(xs) if xs else None
