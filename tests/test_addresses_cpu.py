"""A call's address record (runtime.ADDRESSES): its order is the launch ABI's, every per-call
value the planner writes names one of its slots, and each optional input of attention() lands
in the parameter of its own name (fake driver, CPU tensors)."""

import pytest

from fa4_aot import abi, runtime

torch = pytest.importorskip("torch")
import fa4_aot  # noqa: E402
import fakecuda  # noqa: E402
from fa4_aot import interface  # noqa: E402
from fa4_aot.validate import FP8_ENV  # noqa: E402


def test_the_record_is_the_abis_per_call_pointers():
    ptrs = [a.name for spec in abi.SPECS.values() for a in spec.args() if a.kind == "ptr"]
    assert runtime.ADDRESSES == tuple(dict.fromkeys(n for n in ptrs if n != "sched_ptr"))
    assert all(runtime.ADDRESSES[runtime.SLOT[n]] == n for n in runtime.ADDRESSES)
    # the tensors' descriptors take "<tensor>_ptr"; the optional inputs are slots too
    assert {f"{t}_ptr" for t in abi.FWD_SM90.tensors} <= set(runtime.ADDRESSES)
    inputs = {n for n, f in zip(runtime.ADDRESSES, fa4_aot.prepared._ARG_OF_SLOT) if f}
    assert inputs == {"q_ptr", "k_ptr", "v_ptr", "trace_ptr", "cu_seqlens_q", "cu_seqlens_k",
                      "seqused_q", "seqused_k", "page_table", "q_descale", "k_descale", "v_descale"}


def _param_words(launch, record) -> dict:
    """{pointer parameter name: the 8 bytes the launch passed}."""
    return {p["name"]: int.from_bytes(launch["buffer"][off:off + 8], "little")
            for p, off in zip(record["launch"]["params"], launch["offsets"])
            if p["kind"] == "ptr"}


def _i32(*xs):
    return torch.tensor(xs, dtype=torch.int32)


def _cases():
    bf = torch.bfloat16
    q, k = torch.randn(2, 64, 4, 128, dtype=bf), torch.randn(2, 64, 2, 128, dtype=bf)
    cu = _i32(0, 40, 64)
    packed = torch.randn(64, 4, 128, dtype=bf), torch.randn(64, 2, 128, dtype=bf)
    cache = torch.randn(6, 16, 2, 128, dtype=bf)
    e4m3 = torch.float8_e4m3fn
    yield "varlen", (packed[0], packed[1], packed[1]), dict(
        cu_seqlens_q=cu, cu_seqlens_k=cu.clone(), max_seqlen_q=40, max_seqlen_k=40)
    yield "seqused", (q, k, k), dict(seqused_q=_i32(64, 3), seqused_k=_i32(9, 64))
    yield "paged", (q[:, :1], cache, cache), dict(page_table=_i32(0, 1, 2, 3, 4, 5).view(2, 3),
                                                  seqused_k=_i32(40, 7), causal=True)
    yield "trace", (torch.randn(1, 256, 2, 128, dtype=bf),) * 3, dict(
        causal=True, scheduler="steal", _trace=torch.zeros(4, 4, dtype=torch.int64),
        out=torch.empty(1, 256, 2, 128, dtype=bf))
    yield "fp8", (q[:, :1].to(e4m3), k.to(e4m3), k.to(e4m3)), dict(
        q_descale=torch.rand(2, 2), k_descale=torch.rand(2, 2), v_descale=torch.rand(2, 2))


@pytest.mark.parametrize("what,args,kw", list(_cases()), ids=[c[0] for c in _cases()])
def test_each_input_lands_in_its_own_parameter(monkeypatch, what, args, kw):
    monkeypatch.setenv(FP8_ENV, "1")
    drv = fakecuda.install(monkeypatch)
    inputs = {("trace_ptr" if n == "_trace" else n): t for n, t in kw.items()
              if isinstance(t, torch.Tensor) and n != "out"}
    with torch.no_grad():
        for _ in range(2):  # the miss, then the memo hit
            out, lse = fa4_aot.attention(*args, return_lse=True, **kw)
            (entry,) = interface.prepared_calls()
            launches = drv.launches[-len(entry.plan.launches):]
            words = _param_words(launches[0], entry.plan.launches[0].record)
            for name, t in inputs.items():
                assert words[name] == t.data_ptr(), (what, name)
            assert words["o_ptr"] == out.data_ptr() and words["lse_ptr"] == lse.data_ptr()
            assert words["k_ptr"] == args[1].data_ptr()
            optional = {n for n, f in zip(runtime.ADDRESSES, fa4_aot.prepared._ARG_OF_SLOT)
                        if f not in (None, "q", "k", "v")}
            for name in optional - set(inputs):
                assert words.get(name, 0) == 0, (what, name)
    interface.clear_memo()


@pytest.mark.parametrize("what,args,kw", [c for c in _cases() if c[0] != "trace"],
                         ids=[c[0] for c in _cases() if c[0] != "trace"])
def test_the_ops_lists_land_alike(monkeypatch, what, args, kw):
    """torch.ops.fa4_aot.fwd's implementation unpacks its lists in OpTensors / OpSizes order
    (as _traced packs them, by name)."""
    from fa4_aot.validate import OpSizes, OpTensors
    monkeypatch.setenv(FP8_ENV, "1")
    drv = fakecuda.install(monkeypatch)
    tensors = [kw.get(f) for f in OpTensors._fields]
    sizes = OpSizes(max_seqlen_q=kw.get("max_seqlen_q", 0), max_seqlen_k=kw.get("max_seqlen_k", 0),
                    window_left=-1, window_right=-1, num_splits=0)
    with torch.no_grad():
        out, lse = interface.forward(*args, tensors, list(sizes), kw.get("causal", False), None,
                                     "auto")
    (entry,) = interface.prepared_calls()
    words = _param_words(drv.launches[-len(entry.plan.launches)],
                         entry.plan.launches[0].record)
    for name in OpTensors._fields:
        if kw.get(name) is not None:
            assert words[name] == kw[name].data_ptr(), (what, name)
    assert words["o_ptr"] == out.data_ptr() and words["lse_ptr"] == lse.data_ptr()
    interface.clear_memo()
