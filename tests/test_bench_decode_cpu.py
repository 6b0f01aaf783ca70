"""bench/bench_decode.py's pure parts on the CPU: measurement loop (fake timer), summary,
table, merge into the bench file (other groups kept)."""

import json
import shutil

import pytest

from conftest import ROOT

torch = pytest.importorskip("torch")
import bench_decode as bd  # noqa: E402  (bench/ is on pytest.ini's pythonpath)


def test_measure_checks_times_and_records_failures(monkeypatch):
    monkeypatch.setattr(torch.cuda, "synchronize", lambda: None)
    monkeypatch.setattr(bd, "time_calls", lambda f, iters: (f(), 0.25)[1])

    def boom():
        raise RuntimeError("nope")

    res = bd.measure({"a": lambda: torch.ones(4), "b": lambda: torch.ones(4) * 1.01,
                      "c": boom}, repeats=3, iters=2)
    assert len(res["a"]["times"]) == 3 and res["a"]["max_diff"] == 0
    assert res["b"]["max_diff"] == pytest.approx(0.01, rel=1e-3)
    assert res["c"]["times"] == [] and res["c"]["note"] == "RuntimeError: nope"
    s = bd._summarise(res, kvb=10**9, flops=10**12)
    assert s["a"]["us"] == 250.0 and s["a"]["tb_s"] == 4.0 and s["c"]["ms"] is None


def test_cases_and_bytes():
    assert len(bd.CASES) == 12
    assert bd.kv_bytes(32, 8192, 8) == 2 * 32 * 8192 * 8 * 128 * 2  # 1.07 GB
    assert bd.visible_pairs(1, 100) == 100 and bd.visible_pairs(4, 10) == 7 + 8 + 9 + 10


def test_merge_keeps_other_groups(tmp_path):
    path = tmp_path / "b.json"
    path.write_text(json.dumps({"rows": [{"group": "anchors", "label": "x"},
                                         {"group": "decode", "label": "old"}],
                                "providers": ["fa4_aot:auto"]}))
    row = {"group": "decode", "label": "new", "case": {"kv_bytes": 10**9},
           "providers": {"fa4_aot": {"us": 1.0, "tb_s": 4.0}, "fa4": {"us": 2.0, "tb_s": 2.0}}}
    bd.merge_json(path, "decode", [row], ["fa4_aot", "fa4"], {"device": "synthetic"})
    doc = json.loads(path.read_text())
    assert [r["label"] for r in doc["rows"]] == ["x", "new"]
    assert doc["providers"] == ["fa4_aot:auto", "fa4_aot", "fa4"]
    assert "2.00x" in bd.table([row], ["fa4_aot", "fa4"])
    assert doc["meta"]["group_meta"]["decode"] == {"device": "synthetic"}


def test_decode_meta_survives_a_prefill_merge(tmp_path):
    """bench_fwd.py rewrites the file's meta from its own run but keeps every group's run meta
    under meta.group_meta, where bench_decode.py writes its own (a prefill run after a decode run
    dropped the decode and paged meta when bench_decode kept it at the top level)."""
    import benchlib as bl
    path = tmp_path / "b.json"
    shutil.copy(ROOT / "docs" / "bench_h200.json", path)
    row = {"group": "paged", "label": "p", "case": {"kv_bytes": 10**9},
           "providers": {"fa4_aot": {"us": 1.0, "tb_s": 4.0}}}
    bd.merge_json(path, "paged", [row], ["fa4_aot"], {"device": "decode run"})
    tf_rows, provs = bl.rows_from_json(json.loads(path.read_text()))
    doc = bl.merge_json(path, [r for r in tf_rows if r.case.group == "window"], provs,
                        {"device": "prefill run"})
    assert doc["meta"]["device"] == "prefill run"
    assert doc["meta"]["group_meta"]["paged"] == {"device": "decode run"}
    assert doc["meta"]["group_meta"]["decode"]["command"].startswith("python bench/bench_decode.py")


def test_fp8_group_rows_and_table():
    """The fp8 group (issue 54): every case has its bf16 twin; the table shows the speedup and
    the _scaled_mm limit row."""
    assert {c[0] for c in bd.FP8_CASES} >= {"decode B32 sk8k 32/8", "decode B32 sk8k 32/8 page16"}
    assert bd.kv_bytes(32, 8192, 8, elem=1) * 2 == bd.kv_bytes(32, 8192, 8)
    rows = [{"group": "fp8", "label": "decode B32 sk8k 32/8", "case": {},
             "providers": {"fa4_aot": {"us": 100.0, "tb_s": 5.0}, "bf16": {"us": 180.0}},
             "speedup": 1.8},
            {"group": "fp8", "label": "limit: torch._scaled_mm e4m3 8192^3", "case": {},
             "providers": {"scaled_mm": {"tflops": 1300.0}}}]
    text = bd.fp8_table(rows)
    assert "1.80x" in text and "1300 TFLOP/s" in text


def test_unknown_group_is_refused():
    with pytest.raises(SystemExit, match="unknown group 'nope'"):
        bd.main(["--set", "decode,nope"])
