"""tools/experiments/turn_probe.py's summaries (CPU only; the probe itself needs a GPU)."""

import pytest

pytest.importorskip("torch")
from tools.experiments import turn_probe  # noqa: E402
from tools.experiments.turn_probe import segment_means, summarize  # noqa: E402


def test_segments_of_a_turn():
    turn = [10.0, 10.0, 10.0] + [5.0] * 7 + [4.0] * 10  # calls 1-3, 4-10, 11-20
    assert segment_means(turn) == [10.0, 5.0, 4.0, pytest.approx(5.25)]


def test_median_over_turns_per_segment():
    a = [2.0] * 20
    b = [4.0] * 20
    c = [3.0] * 3 + [9.0] * 17
    assert summarize([a, b, c]) == [3.0, 4.0, 4.0, pytest.approx(4.0)]


def test_run_mode_groups_turns_by_the_turn_before(monkeypatch):
    """The cuDNN peer's turns are run but not reported; each kernel's turns are grouped by
    what ran just before (benchlib.timed_rounds; the soak's last turn before the first)."""
    ran = []
    monkeypatch.setattr(turn_probe, "soak", lambda fs, n, s: "cudnn")
    monkeypatch.setattr(turn_probe, "timed_turn", lambda f, n: (ran.append(f()), [1.0] * n)[1])
    calls = {"fa4": lambda: "fa4", "fa4_aot": lambda: "fa4_aot"}
    out = turn_probe.run_mode("cudnn", calls, lambda: "cudnn", 4, 6, 0.0)
    assert ran.count("cudnn") == 6 and set(k for k, _ in out) == {"fa4", "fa4_aot"}
    for name in calls:
        assert len(out[(name, "all")]) == 6
        assert len(out[(name, "after cudnn")]) + len(out[(name, "after other")]) == 6
        assert len(out[(name, "after cudnn")]) == 3  # three providers: each after each other 3x
    out = turn_probe.run_mode("steady", calls, None, 4, 2, 0.0)
    assert sorted(out) == [("fa4", "all"), ("fa4_aot", "all")] and "cudnn" not in ran[-4:]
