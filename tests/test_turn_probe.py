"""tools/experiments/turn_probe.py's summaries (CPU only; the probe itself needs a GPU)."""

import pytest

pytest.importorskip("torch")
from tools.experiments.turn_probe import segment_means, summarize  # noqa: E402


def test_segments_of_a_turn():
    turn = [10.0, 10.0, 10.0] + [5.0] * 7 + [4.0] * 10  # calls 1-3, 4-10, 11-20
    assert segment_means(turn) == [10.0, 5.0, 4.0, pytest.approx(5.25)]


def test_median_over_turns_per_segment():
    a = [2.0] * 20
    b = [4.0] * 20
    c = [3.0] * 3 + [9.0] * 17
    assert summarize([a, b, c]) == [3.0, 4.0, 4.0, pytest.approx(4.0)]
