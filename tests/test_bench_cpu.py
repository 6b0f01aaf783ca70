"""bench/: the pure parts of the benchmarks on synthetic timings, no GPU: case lists, FLOP counting
against a brute-force mask count, the table, CSV and JSON writers, the bar chart, the schedule
trace statistics and timeline, cold_start's table, and the scripts' CPU-only modes."""

from __future__ import annotations

import csv
import inspect
import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
BENCH = ROOT / "bench"

import benchlib as bl  # noqa: E402  (bench/ is on pytest.ini's pythonpath)
import cold_start  # noqa: E402
import tracelib as tl  # noqa: E402

PROVIDERS = ["fa4_aot:single", "fa4_aot:static", "fa4_aot:steal", "cudnn", "flash", "fa4"]


# ------------------------------------------------------------------------------ FLOP counting
def brute_pairs(sq, sk, causal=False, window=None):
    """Count the (i, j) pairs a FlashAttention-style mask keeps, one by one."""
    left, right = window if window else (-1, -1)
    off = sk - sq
    n = 0
    for i in range(sq):
        for j in range(sk):
            if causal and j > i + off:
                continue
            if left >= 0 and j < i + off - left:
                continue
            if right >= 0 and j > i + off + right:
                continue
            n += 1
    return n


SMALL = [(1, 1), (5, 5), (7, 3), (3, 7), (16, 16), (33, 20), (20, 33), (64, 64), (0, 4), (4, 0)]
WINDOWS = [None, (0, 0), (3, 0), (2, 5), (-1, 4), (6, -1), (100, 100), (0, -1)]


@pytest.mark.parametrize("sq,sk", SMALL)
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("window", WINDOWS)
def test_visible_pairs_brute_force(sq, sk, causal, window):
    assert bl.visible_pairs(sq, sk, causal, window) == brute_pairs(sq, sk, causal, window)


def test_causal_counts_known_values():
    assert bl.visible_pairs(4, 4, True) == 10  # 1+2+3+4
    assert bl.visible_pairs(2, 4, True) == 3 + 4  # bottom-right aligned
    assert bl.visible_pairs(4, 2, True) == 0 + 0 + 1 + 2
    # causal sliding window (1024, 0) on S = 8192: rows see min(i + 1, 1025) keys
    s = 8192
    expect = sum(min(i + 1, 1025) for i in range(s))
    assert bl.visible_pairs(s, s, True, (1024, 0)) == expect


def test_case_flops_dense_and_varlen():
    c = bl.dense_case(2, 16, 8192, 128, False)
    assert c.flops() == 4 * 2 * 16 * 8192 * 8192 * 128
    cc = bl.dense_case(2, 16, 8192, 128, True)
    assert cc.flops() == 4 * 2 * 16 * 128 * (8192 * 8193 // 2)
    docs = (5, 3, 8)
    v = bl.Case("docs", "t", heads=3, head_dim=64, causal=True, docs=docs)
    assert v.flops() == 4 * 3 * 64 * sum(brute_pairs(n, n, True) for n in docs)
    assert v.cu_seqlens() == [0, 5, 8, 16]
    assert v.tokens == 16 and v.max_seqlen == 8 and v.num_seqs == 3
    # varlen is per document: never the cross-document pairs of one packed sequence
    assert v.pairs() < brute_pairs(16, 16, True)
    w = bl.Case("docs", "w", heads=1, head_dim=1, causal=True, window=(2, 0), docs=docs)
    assert w.pairs() == sum(brute_pairs(n, n, True, (2, 0)) for n in docs)


def test_tflops_units():
    # 1e12 FLOP in 1 ms = 1000 TFLOP/s
    assert bl.tflops(1e12, 1.0) == pytest.approx(1000.0)
    assert bl.tflops(1e12, None) is None and bl.tflops(1e12, 0) is None


# --------------------------------------------------------------------------------- case lists
def test_case_lists():
    cases = bl.build_cases("all")
    labels = [c.label for c in cases]
    assert len(labels) == len(set(labels))
    groups = [c.group for c in cases]
    assert groups.count("anchors") == 10 and groups.count("causal") == 10
    assert groups.count("docs") == 9 and groups.count("window") == 1
    for c in cases:
        assert c.flops() > 0
        if c.group == "causal":
            assert c.tokens == 32768 and c.causal and c.heads == 16
    docs = {c.label: c for c in cases if c.group == "docs"}
    assert sum(bl.ZIPF_DOCS) == 38912
    skewed = docs["docs 1x16k+32x512 causal hd128"]
    assert skewed.docs == (16384,) + (512,) * 32 and skewed.tokens == 32768
    assert docs["docs 16x2k full hd128"].tokens == 32768 and not docs["docs 16x2k full hd128"].causal
    (win,) = [c for c in cases if c.group == "window"]
    assert (win.batch, win.seqlen_q, win.head_dim, win.window, win.causal) == (4, 8192, 128, (1024, 0), True)
    assert {(c.batch, c.heads, c.seqlen_q, c.head_dim) for c in cases if c.group == "anchors"} == set(bl.ANCHORS)
    assert [c.group for c in bl.build_cases("imbalanced")] == ["causal"] * 10 + ["docs"] * 9 + ["window"]
    with pytest.raises(ValueError):
        bl.build_cases("nope")


def test_extra_cases():
    """hd96/hd192, fp16, one long causal sequence, chunked prefill (queries against a longer
    cache, causal counted bottom-right)."""
    extra = {c.label: c for c in bl.build_cases("extra")}
    assert set(extra) <= {c.label for c in bl.build_cases("all")}
    assert {c.head_dim for c in extra.values()} == {96, 128, 192}
    assert [c.dtype for c in extra.values()].count("fp16") == 2
    long = extra["1x32x32768x128 causal"]
    assert long.flops() == 4 * 32 * 128 * 32768 * 32769 // 2
    chunk = extra["chunked prefill 4x(2k on 16k) 32/8 hd128"]
    assert (chunk.batch, chunk.seqlen_q, chunk.seqlen_k, chunk.heads, chunk.kv_heads) == (
        4, 2048, 16384, 32, 8)
    assert chunk.tokens == 4 * 2048 and chunk.kv_tokens == 4 * 16384
    # bottom-right: row i sees 16384 - 2048 + i + 1 keys
    assert chunk.pairs() == 4 * sum(16384 - 2048 + i + 1 for i in range(2048))
    assert chunk.to_dict()["dtype"] == "" and extra["2x16x8192x128 fp16"].to_dict()["dtype"] == "fp16"


def test_parse_shapes_and_filter():
    cs = bl.parse_shapes("2,16,1024,128;1,4,256,64,c;1,2,512,128,c,w64:0")
    assert [(c.batch, c.heads, c.seqlen_q, c.head_dim, c.causal, c.window) for c in cs] == [
        (2, 16, 1024, 128, False, None), (1, 4, 256, 64, True, None), (1, 2, 512, 128, True, (64, 0))]
    with pytest.raises(ValueError):
        bl.parse_shapes("1,2,3")
    assert [c.label for c in bl.filter_cases(bl.build_cases("all"), "zipf")] == [
        c.label for c in bl.build_cases("docs") if "zipf" in c.label]


def test_providers_and_api_detection():
    assert bl.parse_provider("fa4_aot:steal") == ("fa4_aot", "steal", "")
    assert bl.parse_provider("fa4_aot:single:noovl") == ("fa4_aot", "single", "noovl")
    assert bl.display_name("cudnn") == "cuDNN" and bl.display_name("fa4_aot:static") == "aot/static"
    for bad in ("fa4_aot", "sdpa", "cudnn:x"):
        with pytest.raises(ValueError):
            bl.parse_provider(bad)

    def old(q, k, v, causal=False, softmax_scale=None, return_lse=False, scheduler="auto", *, out=None):
        pass

    def new(q, k, v, causal=False, softmax_scale=None, return_lse=False, scheduler="auto", *,
            out=None, window_size=(-1, -1), cu_seqlens_q=None, cu_seqlens_k=None,
            max_seqlen_q=None, max_seqlen_k=None):
        pass

    def catch_all(q, k, v, **kw):
        pass

    assert bl.api_features(old) == {"varlen": False, "window": False}
    assert bl.api_features(new) == {"varlen": True, "window": True}
    assert bl.api_features(catch_all) == {"varlen": False, "window": False}
    assert bl.filter_kwargs(old, {"causal": True, "window_size": (1, 0)}) == {"causal": True}
    assert bl.filter_kwargs(catch_all, {"a": 1}) == {"a": 1}
    win = bl.build_cases("window")[0]
    assert bl.needs(win) == ["window"] and bl.needs(bl.build_cases("docs")[0]) == ["varlen"]


def test_current_fa4_aot_signature_is_inspectable():
    """bench_fwd decides n/a (not supported yet) from this; it must not raise on the real API."""
    interface = pytest.importorskip("fa4_aot.interface")
    feats = bl.api_features(interface.attention)
    assert set(feats) == {"varlen", "window"}
    assert "causal" in inspect.signature(interface.attention).parameters


# ------------------------------------------------------------------------ synthetic timings
def synthetic_rows(cases=None):
    """Rows with made-up timings: a fixed TFLOP/s per provider, n/a where fa4_aot would be."""
    rate = {"fa4_aot:single": 500.0, "fa4_aot:static": 520.0, "fa4_aot:steal": 560.0,
            "cudnn": 600.0, "flash": 330.0, "fa4": 650.0}
    rows = []
    for c in cases or bl.build_cases("all"):
        row = bl.Row(c)
        for p in PROVIDERS:
            r = bl.Result(method="sdpa" if p in ("cudnn", "flash") else "")
            if p.startswith("fa4_aot") and (c.head_dim == 256 or c.varlen or c.window):
                r.note = "n/a (hd256 not built)" if c.head_dim == 256 else "n/a (not supported yet)"
            elif p == "cudnn" and c.window:
                r.note = "n/a (SDPA/cuDNN: no sliding window)"
            else:
                r.ms = c.flops() / (rate[p] * 1e9)
                if c.varlen and p == "cudnn":
                    r.method = f"per-doc SDPA loop ({c.num_seqs} calls)"
                if c.varlen and p == "flash":
                    r.method = "varlen_attn"
                r.max_diff = 0.004
            row.results[p] = r
        rows.append(row)
    rows[0].results["fa4_aot:steal"].mismatch = True
    rows[0].results["fa4_aot:steal"].max_diff = 0.5
    return rows


def test_table_is_well_formed():
    rows = synthetic_rows()
    text = bl.format_table(rows, PROVIDERS)
    lines = text.splitlines()
    header = lines[0]
    for name in ("case", "aot/single", "aot/static", "aot/steal", "cuDNN", "flash", "FA4", "notes"):
        assert name in header
    assert set(lines[1]) == {"-"}
    body = [ln for ln in lines[2:] if ln.strip()]
    assert len(body) == len(rows)
    ncols = len(PROVIDERS)
    for ln, row in zip(body, rows):
        assert ln.startswith(row.case.label)
        cells = ln[len(max((r.case.label for r in rows), key=len)):].split("  ")
        cells = [c.strip() for c in cells if c.strip()]
        # first ncols cells are values (with ratio) or n/a, the rest the notes
        vals = cells[:ncols]
        for p, v in zip(PROVIDERS, vals):
            t = row.tflops(p)
            if t is None:
                assert v == "n/a", (row.case.label, p, v)
            else:
                assert v.split()[0] == f"{t:.1f}"
                if p != "cudnn" and row.tflops("cudnn") is not None:
                    assert v.split()[1].rstrip("!") == f"{t / row.tflops('cudnn'):.2f}x"
    # the value columns line up: every cuDNN value ends at the same column
    assert "MISMATCH" in body[0] and "!" in body[0]
    varlen_line = next(ln for ln in body if "docs 16x2k causal hd128" in ln)
    assert "per-doc SDPA loop (16 calls)" in varlen_line and "varlen_attn" in varlen_line
    assert "aot: n/a (not supported yet)" in varlen_line
    hd256 = next(ln for ln in body if ln.startswith("2x8x8192x256 "))
    assert "n/a (hd256 not built)" in hd256
    # the synthetic rates come back out of the FLOP count
    r = rows[2]
    assert r.tflops("cudnn") == pytest.approx(600.0)
    assert r.ratio("fa4_aot:steal") == pytest.approx(560 / 600)


def test_csv_and_json_roundtrip(tmp_path):
    rows = synthetic_rows()
    cp, jp = tmp_path / "r.csv", tmp_path / "r.json"
    bl.write_csv(cp, rows, PROVIDERS)
    bl.write_json(jp, rows, PROVIDERS, meta={"device": "synthetic"})
    recs = list(csv.DictReader(cp.open()))
    assert len(recs) == len(rows) * len(PROVIDERS)
    assert set(recs[0]) == set(bl.CSV_FIELDS)
    for rec in recs:
        if rec["tflops"]:
            assert float(rec["tflops"]) > 0 and float(rec["ms"]) > 0
            assert int(rec["flops"]) > 0
        else:
            assert rec["note"].startswith("n/a")
    z = next(r for r in recs if r["case"].startswith("docs zipf") and r["provider"] == "cudnn")
    assert sum(map(int, z["docs"].split())) == 38912
    doc = json.loads(jp.read_text())
    assert doc["formula"] == bl.FORMULA and doc["providers"] == PROVIDERS
    assert doc["meta"]["device"] == "synthetic" and len(doc["rows"]) == len(rows)
    first = doc["rows"][2]["providers"]["fa4_aot:steal"]
    assert first["tflops"] == pytest.approx(560.0, abs=0.01)
    assert first["ratio_vs_cudnn"] == pytest.approx(560 / 600, abs=1e-3)
    rows2, provs2 = bl.rows_from_json(doc)
    assert provs2 == PROVIDERS
    assert bl.format_table(rows2, provs2) == bl.format_table(rows, PROVIDERS)


def test_bar_chart_png(tmp_path):
    pytest.importorskip("matplotlib")
    out = tmp_path / "bars.png"
    bl.plot_bars(synthetic_rows(), PROVIDERS, out, title="synthetic")
    data = out.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 10_000


def test_bench_fwd_from_json_cli(tmp_path):
    """The GPU script's CPU-only mode: re-tabulate a saved run, write CSV/PNG, table last."""
    pytest.importorskip("matplotlib")
    jp = tmp_path / "run.json"
    bl.write_json(jp, synthetic_rows(), PROVIDERS, meta={"device": "synthetic", "notes": ["x"]})
    p = subprocess.run([sys.executable, str(BENCH / "bench_fwd.py"), "--from-json", str(jp),
                        "--csv", str(tmp_path / "o.csv"), "--png", str(tmp_path / "o.png")],
                       capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert p.returncode == 0, p.stderr
    assert (tmp_path / "o.csv").stat().st_size > 0 and (tmp_path / "o.png").stat().st_size > 0
    last = p.stdout.rstrip().splitlines()
    assert last[-1].startswith("chunked prefill 16x(512 on 8k) 32/8 hd128")  # the last group
    assert any(ln.startswith("TFLOP/s = 4*B*H*Sq*Sk*D") for ln in last)


# ------------------------------------------------------------------------------------ traces
def test_trace_stats_handmade():
    np = pytest.importorskip("numpy")
    t0 = 10**18
    us = 1000
    tr = np.array([
        [0, 0, t0 + 0 * us, t0 + 10 * us],
        [0, 0, t0 + 10 * us, t0 + 20 * us],
        [1, 1, t0 + 0 * us, t0 + 5 * us],
        [1, 2, t0 + 2 * us, t0 + 6 * us],   # overlaps the tile above: union 0..6
        [0, 0, 0, 0],                       # never ran
    ], dtype=np.int64)
    st = tl.trace_stats(tr, num_sms=4)
    assert st["tiles"] == 5 and st["tiles_run"] == 4 and st["tiles_missing"] == 1
    assert st["makespan_us"] == pytest.approx(20.0)
    assert st["busy_per_sm"][:2] == [1.0, 0.3] and st["busy_per_sm"][2:] == [0.0, 0.0]
    assert st["busy_mean"] == pytest.approx(1.3 / 4)
    assert st["tail_us"] == pytest.approx(14.0)  # SM 1 idle from 6 us
    assert st["ctas"] == 3 and st["tiles_per_cta_max"] == 2
    lane, lanes = tl.assign_lanes(np.array([0, 10, 0, 2.0]), np.array([10, 20, 5, 6.0]),
                                  np.array([0, 0, 1, 1]))
    assert lanes == {0: 1, 1: 2} and list(lane) == [0, 0, 0, 1]
    text = tl.format_trace_stats(st, "t")
    assert "1 never ran" in text and "makespan" in text
    with pytest.raises(ValueError):
        tl.trace_array(np.zeros((3, 3)))
    assert tl.trace_stats(np.zeros((4, 4), np.int64))["tiles_run"] == 0


@pytest.mark.parametrize("sched", ["single", "static", "steal"])
def test_synthetic_trace_plausible(sched):
    np = pytest.importorskip("numpy")
    tr, meta = tl.synthetic_trace(sched, num_sms=8, num_m_blocks=6, heads=2, batch=2, seed=1)
    assert tr.shape == (24, 4) and tr.dtype == np.int64
    assert (tr[:, 3] > tr[:, 2]).all() and (tr[:, 0] < 8).all()
    # no two tiles of one CTA overlap in time
    for c in np.unique(tr[:, 1]):
        iv = sorted(map(tuple, tr[tr[:, 1] == c][:, 2:]))
        assert all(a[1] <= b[0] for a, b in zip(iv, iv[1:]))
    st = tl.trace_stats(tr, meta["num_sms"])
    assert st["tiles_run"] == 24 and 0 < st["busy_mean"] <= 1
    mb, hd, bt = tl.tile_decode(len(tr), meta)
    assert sorted(zip(mb, hd, bt)) == sorted((m, h, b) for m in range(6) for h in range(2) for b in range(2))
    assert st["ctas"] == (24 if sched == "single" else 8)


def test_steal_beats_static_on_causal_synthetic():
    pytest.importorskip("numpy")
    ms = {s: tl.trace_stats(tl.synthetic_trace(s, num_sms=16, num_m_blocks=32, heads=4,
                                               batch=1, seed=0)[0])["makespan_us"]
          for s in ("static", "steal")}
    assert ms["steal"] < ms["static"]


def test_trace_png_and_color_modes(tmp_path):
    pytest.importorskip("matplotlib")
    np = pytest.importorskip("numpy")
    tr, meta = tl.synthetic_trace("steal", num_sms=16, num_m_blocks=8, heads=4, batch=2,
                                  ctas_per_sm=2)
    for mode in ("auto", "cta", "head", "batch", "order"):
        out = tmp_path / f"t_{mode}.png"
        tl.plot_trace(tr, out, meta, color_by=mode)
        assert out.read_bytes()[:4] == b"\x89PNG"
    # without metadata m_block colouring falls back to CTA instead of failing
    tl.plot_trace(tr, tmp_path / "nometa.png", None, color_by="m_block")
    assert (tmp_path / "nometa.png").stat().st_size > 5000
    tr2 = tr.copy()
    tr2[3] = 0
    tl.plot_trace(tr2, tmp_path / "missing.png", meta)
    with pytest.raises(ValueError):
        tl.tile_decode(len(tr), dict(meta, num_m_blocks=3))
    explicit = {"m_block": list(range(len(tr)))}
    assert list(tl.tile_decode(len(tr), explicit)[0]) == list(range(len(tr)))
    np.save(tmp_path / "t.npy", tr)


def test_trace_render_cli(tmp_path):
    pytest.importorskip("matplotlib")
    np = pytest.importorskip("numpy")
    tr, meta = tl.synthetic_trace("static", num_sms=16, num_m_blocks=8, heads=4, batch=2)
    np.save(tmp_path / "buf.npy", tr)
    (tmp_path / "meta.json").write_text(json.dumps(
        {k: meta[k] for k in ("num_m_blocks", "heads", "batch", "scheduler", "section")}))
    p = subprocess.run([sys.executable, str(BENCH / "trace_render.py"), str(tmp_path / "buf.npy"),
                        "--meta", str(tmp_path / "meta.json"), "--json", str(tmp_path / "s.json")],
                       capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert p.returncode == 0, p.stderr
    assert (tmp_path / "buf.png").read_bytes()[:4] == b"\x89PNG"
    assert json.loads((tmp_path / "s.json").read_text())["tiles_run"] == len(tr)
    assert "idle tail" in p.stdout.splitlines()[-2] or "idle tail" in p.stdout
    assert p.stdout.rstrip().splitlines()[-1].startswith("tile time")
    p = subprocess.run([sys.executable, str(BENCH / "trace_render.py"), "--synthetic",
                        "--scheduler", "all", "--shape", "1,4,1024,128", "--num-sms", "16",
                        "--out", str(tmp_path / "syn.png")],
                       capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert p.returncode == 0, p.stderr
    for s in ("single", "static", "steal"):
        assert (tmp_path / f"syn_{s}.png").stat().st_size > 5000
    last = p.stdout.rstrip().splitlines()
    assert last[-1].startswith("steal") and last[-3].startswith("single")


# -------------------------------------------------------------------------------- cold start
def test_cold_start_table():
    run = {"import_torch_s": 1.5, "import_s": 0.004, "cuda_ctx_s": 0.3, "first_call_s": 0.05,
           "second_call_s": 0.0004, "first_call_b_s": 0.01, "small_enqueue_s": 12e-6,
           "small_events_s": 13e-6, "small_host_sync_s": 14e-6, "small_roundtrip_s": 30e-6}
    runs = {"fa4_aot": [run, dict(run, first_call_s=0.07), dict(run, first_call_s=0.06)],
            "cudnn": [dict(run, import_s=None)],
            "fa4": [{"provider": "fa4", "error": "exit 1: ModuleNotFoundError: flash_attn"}]}
    s = cold_start.summarize(runs)
    assert s["fa4_aot"]["first_call_ms"] == pytest.approx(60.0)
    assert s["fa4_aot"]["small_events_us"] == pytest.approx(13.0)
    assert s["cudnn"]["import_s"] is None and s["fa4"]["error"].startswith("exit 1")
    text = cold_start.format_table(s, ["fa4_aot", "cudnn", "fa4"], 3, "a", "b", "c")
    lines = text.splitlines()
    assert "fa4_aot" in lines[1] and "cuDNN SDPA" in lines[1]
    body = {ln.split("  ")[0].strip(): ln for ln in lines[3:]}
    assert len([k for k in body if "(" in k]) == len(cold_start.METRICS)
    assert "60.0" in body["1st call, config A (ms)"]
    assert "FA4: exit 1" in lines[-1]
    assert cold_start.parse_shape("1,1,128,64") == (1, 1, 128, 64, False)
    assert cold_start.shape_label((2, 16, 1024, 128, True)) == "2x16x1024x128 causal"
    assert math.isclose(cold_start.to_units(run)["small_roundtrip_us"], 30.0)


@pytest.mark.parametrize("n", [1, 2, 3, 4, 5])
def test_round_order_is_a_williams_design(n):
    """Over one cycle every provider takes every position, and runs right after every other
    provider, equally often (two providers: A B, B A, the order of the earlier benches)."""
    provs = [f"p{i}" for i in range(n)]
    cycle = bl.balanced_repeats(n)
    rows = [bl.round_order(provs, r) for r in range(cycle)]
    assert all(sorted(row) == provs for row in rows)
    assert rows == [bl.round_order(provs, r + cycle) for r in range(cycle)]
    for pos in range(n):
        assert sorted(row[pos] for row in rows) == sorted(provs * (cycle // n))
    pairs = [(row[i], row[i + 1]) for row in rows for i in range(n - 1)]
    if n > 1:
        per_pair = len(pairs) // (n * (n - 1))
        assert all(pairs.count((a, b)) == per_pair for a in provs for b in provs if a != b)
    if n == 2:
        assert rows == [["p0", "p1"], ["p1", "p0"]]
    elif n > 2:
        # the rows run back to back: nobody runs two turns in a row; odd n (the cycles that
        # reverse the rows): the cycle's last row ends as the warm-up (the providers in their
        # order) does
        seq = [p for row in rows for p in row]
        assert all(a != b for a, b in zip(seq, seq[1:] + seq[:1]))
        assert seq[0] == provs[0] and (n % 2 == 0 or seq[-1] == provs[-1])
        if n == 3:  # every ordered pair follows each other equally often, boundaries included
            cyc = list(zip(seq, seq[1:] + seq[:1]))
            assert all(cyc.count((a, b)) == 3 for a in provs for b in provs if a != b)
    assert bl.balance_note(n, cycle) is None and bl.balance_note(n, 3 * cycle) is None
    if cycle > 1:
        assert f"not a multiple of {cycle}" in bl.balance_note(n, cycle + 1)


def test_timed_rounds_records_the_provider_before_each_repeat():
    provs = ["p0", "p1", "p2"]
    seq = []

    def turn(p):
        seq.append(p)
        return float(len(seq))

    out = bl.timed_rounds(provs, 6, turn, first_after="p2")  # p2 warmed up last
    assert seq == [p for r in range(6) for p in bl.round_order(provs, r)]
    before = dict(zip(range(1, 19), ["p2"] + seq[:-1]))  # turn number -> provider before it
    for p, (times, after) in out.items():
        assert len(times) == 6 and after == [before[int(t)] for t in times]
    # over one cycle, with the warm-up (the providers in their order) before the first repeat,
    # each provider follows each other one three times, and never itself
    counts = {p: {q: after.count(q) for q in after} for p, (_, after) in out.items()}
    assert counts == {"p0": {"p2": 3, "p1": 3}, "p1": {"p0": 3, "p2": 3},
                      "p2": {"p0": 3, "p1": 3}}
    # the JSON form the benchmarks store (``samples``)
    assert bl.samples([1.23456789, 2.0], ["p2", "p1"]) == [[1.234568, "p2"], [2.0, "p1"]]

    def flaky(p):
        if p == "p1" and len(seq) > 3:
            raise RuntimeError("gone")
        return turn(p)

    seq.clear()
    errors = []
    out = bl.timed_rounds(provs, 6, flaky, on_error=lambda p, e: errors.append((p, str(e))))
    assert errors == [("p1", "gone")] and set(out) == {"p0", "p2"}
    assert all(len(t) == 6 for t, _ in out.values())
    with pytest.raises(RuntimeError):
        bl.timed_rounds(provs, 6, flaky)
