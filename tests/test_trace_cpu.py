"""fa4_aot.trace.capture on the CPU (fake driver): its buffer, tile and L2 section are the
planner's for the traced launch (plan_call), not recomputed."""

import pytest

torch = pytest.importorskip("torch")
import fakecuda  # noqa: E402
from conftest import memo_plan  # noqa: E402


@pytest.mark.parametrize("sched", ["single", "static", "steal"])
def test_capture_meta_is_the_launchs(monkeypatch, sched):
    from fa4_aot import interface, trace
    fakecuda.install(monkeypatch)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: None)
    q = torch.randn(2, 1000, 16, 128, dtype=torch.bfloat16)
    k = torch.randn(2, 1000, 4, 128, dtype=torch.bfloat16)
    with torch.no_grad():
        out, buf, meta = trace.capture(q, k, k, scheduler=sched)
    (launch,) = memo_plan().launches
    assert launch.record["config"]["trace"] and launch.record["config"]["scheduler"] == sched
    assert buf.shape == (launch.values["num_tiles"], 4) and out.shape == q.shape
    assert (meta["num_m_blocks"], meta["section"], meta["tile_m"], meta["num_sms"]) == (
        launch.values["num_m_blocks"], launch.values["section"],
        launch.record["launch"]["tile"]["m"], 132)
    interface.clear_memo()
