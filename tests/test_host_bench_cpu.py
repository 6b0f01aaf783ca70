"""The host-time group of bench/bench_fwd.py (--set host): cases, table, merging into the bench
file by group (no GPU)."""

import json
import shutil
import subprocess
import sys

import pytest

from conftest import ROOT

import benchlib as bl  # noqa: E402  (bench/ is on pytest.ini's pythonpath)


def _host_rows():
    rows = []
    for i, c in enumerate(bl.build_cases("host")):
        r = bl.Row(c)
        for j, p in enumerate(bl.HOST_PROVIDERS):
            if p == "fa4":
                r.results[p] = bl.Result(note="n/a (FA4 not importable)")
            else:
                r.results[p] = bl.Result(method="eager", us_per_call=10.0 + i + j,
                                         enqueue_us=5.0 + i)
        rows.append(r)
    return rows


def test_host_cases():
    cases = bl.build_cases("host")
    assert [c.group for c in cases] == ["host"] * 4
    dense, gqa, decode, varlen = cases
    assert (dense.batch, dense.seqlen_q, dense.heads, dense.head_dim) == (1, 128, 1, 64)
    assert gqa.kv_heads < gqa.heads and gqa.heads % gqa.kv_heads == 0
    assert (decode.batch, decode.seqlen_q, decode.seqlen_k, decode.heads, decode.kv_heads,
            decode.head_dim) == (8, 1, 1024, 32, 8, 128)
    assert varlen.varlen and varlen.tokens == sum(bl.HOST_DOCS)
    assert all(c.group != "host" for c in bl.build_cases("all"))  # not in "all"


def test_host_table_and_json_merge(tmp_path):
    base = ROOT / "docs" / "bench_h200.json"
    path = tmp_path / "b.json"
    shutil.copy(base, path)
    old = json.loads(path.read_text())
    old_tf = [d for d in old["rows"] if d["group"] != "host"]
    rows = _host_rows()
    doc = bl.merge_json(path, rows, [], {"device": "synthetic"})
    assert doc["meta"]["device"] == old["meta"]["device"]  # the TFLOP/s run's meta stays
    assert doc["meta"]["group_meta"]["host"]["device"] == "synthetic"
    assert doc["providers"] == old["providers"]
    assert [d for d in doc["rows"] if d["group"] != "host"] == old_tf
    host = [d for d in doc["rows"] if d["group"] == "host"]
    assert len(host) == 4 and host[0]["providers"]["fa4_aot"]["us_per_call"] == 10.0
    assert "us_per_call" not in old["rows"][0]["providers"]["cudnn"]
    # again: the host rows are replaced, not duplicated
    doc = bl.merge_json(path, rows, [], {"device": "synthetic"})
    assert sum(d["group"] == "host" for d in doc["rows"]) == 4
    # a TFLOP/s run keeps the host rows
    tf_rows, provs = bl.rows_from_json(old)
    tf_rows = [r for r in tf_rows if r.case.group == "window"]
    doc = bl.merge_json(path, tf_rows, provs, {"device": "again"})
    assert doc["meta"]["device"] == "again" and sum(d["group"] == "host" for d in doc["rows"]) == 4
    assert len(doc["rows"]) == len(old_tf) + 4
    hrows, hp = bl.host_rows_from_json(json.loads(path.read_text()))
    table = bl.format_host_table(hrows, hp)
    first = table.splitlines()[2]
    assert first.startswith("dense 1x128x1x64") and "0.71x" in first  # 10 / 14
    assert "FA4: n/a (FA4 not importable)" in first
    p = subprocess.run([sys.executable, str(ROOT / "bench" / "bench_fwd.py"), "--from-json",
                        str(path)], capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    assert "case (us per call)" in p.stdout and "window(1024, 0)" in p.stdout


def test_fresh_file(tmp_path):
    path = tmp_path / "new.json"
    doc = bl.merge_json(path, _host_rows(), [], {"device": "x"})
    assert doc["providers"] == [] and doc["host_providers"] == list(bl.HOST_PROVIDERS)
    assert len(json.loads(path.read_text())["rows"]) == 4


@pytest.mark.parametrize("bad", ["nope", "host,nope"])
def test_unknown_group(bad):
    with pytest.raises(ValueError):
        bl.build_cases(bad)


def test_host_breakdown_length_change_runs_on_the_cpu(capsys):
    """``bench/host_breakdown.py --cpu``: the length-change table without a GPU (a smoke run;
    no figure is checked)."""
    import host_breakdown
    host_breakdown.main(["--cpu", "--n", "20"])
    out = capsys.readouterr().out
    assert "CPU tensors, fake driver" in out
    assert "(retargeted)" in out and "prepared in full" in out
