"""Tile.lazy_reference's overflow guard, on the numpy emulation of its arithmetic
(tools/lazy_reference_emulation.py; docs/perf-notes.md v37). CPU only."""

import pytest

np = pytest.importorskip("numpy")
from tools import lazy_reference_emulation as emu  # noqa: E402


def test_guard_catches_every_wrong_row():
    """Scores x60 over 800 keys: the lazy reference breaks rows (NaN, or a block's mass
    flushed away by a reference factor below 2^-126); the peak-and-row-sum guard flags every
    one of them, the row sums alone do not."""
    nan, flagged, err, lse_err = emu.check(800, 60)
    assert nan > 0 and flagged >= nan
    assert err < 0.05 and lse_err < 1e-3
    _, _, err_sums_only, _ = emu.check(800, 60, peak_guard=False)
    assert err_sums_only > 1


def test_ordinary_scores_need_no_guard():
    nan, flagged, err, lse_err = emu.check(800, 1)
    assert (nan, flagged) == (0, 0) and err < 0.01 and lse_err < 1e-5


def test_bf16_rounding():
    """Nearest even (the kernel's cvt.rn.bf16x2.f32); past bf16's largest value, infinity."""
    x = np.array([1.0, 1.00390625, 1.005859375, -2.5], np.float32)
    assert emu.bf16(x).tolist() == [1.0, 1.0, 1.0078125, -2.5]
    assert np.isinf(emu.bf16(np.float32(3.4e38)))
