"""The alignment contract (docs/design.md#alignment), on the CPU with the fake driver: every
address a kernel receives meets the alignment its ABI declares (``abi.Arg.align``: what the
kernel may assume for vector and TMA accesses), whatever the call's sizes; every view carved
from the scratch pool starts on a 128-byte boundary; the pointers with more alignment than their
element size are the ones the runtime checks per call or allocates itself."""

import math
import struct

import pytest

from fa4_aot import abi

torch = pytest.importorskip("torch")
import fa4_aot  # noqa: E402
import fakecuda  # noqa: E402
from fa4_aot import interface, prepared  # noqa: E402

ELEM_BYTES = {"io": 1, "f32": 4, "i32": 4, "i64": 8}  # "io": e4m3 at least one byte
# The pointers whose declared alignment exceeds their element size, and who guarantees it:
# q/k/v/out are the caller's (checked on every call, a ValueError naming the argument); the
# split-KV partials come from the scratch pool (SCRATCH_ALIGN).
OVER_ALIGNED = {"q_ptr": "checked", "o_ptr": "checked", "k_ptr": "checked", "v_ptr": "checked",
                "oacc_ptr": "scratch"}


def test_over_aligned_pointers_are_the_checked_or_allocated_ones():
    over = {a.name for spec in abi.SPECS.values() for a in spec.args()
            if a.kind == "ptr" and a.align > ELEM_BYTES[a.elem]}
    assert over == set(OVER_ALIGNED)
    assert prepared.SCRATCH_ALIGN % max(a.align for s in abi.SPECS.values()
                                         for a in s.args() if a.kind == "ptr") == 0


@pytest.mark.parametrize("shapes", [[(1, 1, 1)], [(1, 3, 1), (4, 3, 8, 128), (4, 3, 8)],
                                    [(5,), (7, 13, 9, 64), (7, 13, 9)], [(0,), (2, 1, 3, 96)]])
def test_scratch_views_start_on_128_byte_boundaries(shapes):
    starts, end = prepared.scratch_layout(shapes)
    step = prepared.SCRATCH_ALIGN // 4
    assert all(s % step == 0 for s in starts) and end % step == 0
    for shape, s, nxt in zip(shapes, starts, list(starts[1:]) + [end]):
        assert s + math.prod(shape) <= nxt  # no overlap


def _pointers(launch, record):
    """{ptr parameter name: the address the launch passed}."""
    params = record["launch"]["params"]
    return {p["name"]: struct.unpack_from("<Q", launch["buffer"], off)[0]
            for p, off in zip(params, launch["offsets"]) if p["kind"] == "ptr"}


CALLS = {  # odd batch x heads x seqlen products: LSE rows of 4, 12, 20 ... bytes
    "decode_1_head": dict(b=1, sq=1, sk=3000, h=1, hk=1, kw={"causal": True}),
    "decode_3_heads": dict(b=1, sq=1, sk=8192, h=3, hk=1, kw={"causal": True}),
    "decode_7_heads_lse": dict(b=1, sq=1, sk=5000, h=7, hk=1,
                               kw={"causal": True, "return_lse": True}),
    "split_5x3": dict(b=5, sq=3, sk=700, h=5, hk=5, kw={"num_splits": 3}),
    "split_odd_lse": dict(b=3, sq=5, sk=999, h=3, hk=1,
                          kw={"num_splits": 7, "return_lse": True}),
    "prefill_odd": dict(b=1, sq=4097, sk=4097, h=7, hk=7, kw={"causal": True,
                                                              "return_lse": True}),
}


@pytest.mark.parametrize("name", list(CALLS))
def test_every_launched_address_meets_its_abi_alignment(monkeypatch, name):
    drv = fakecuda.install(monkeypatch)
    c = CALLS[name]
    q = torch.randn(c["b"], c["sq"], c["h"], 128, dtype=torch.bfloat16)
    k = torch.randn(c["b"], c["sk"], c["hk"], 128, dtype=torch.bfloat16)
    v = torch.randn_like(k)
    with torch.no_grad():
        for _ in range(2):  # the call that carves the pool, and a memo hit
            fa4_aot.attention(q, k, v, **c["kw"])
    (plan,) = interface.memo_plans()
    assert len(drv.launches) == 2 * len(plan.launches)
    for launch, kl in zip(drv.launches, plan.launches * 2):
        spec = abi.SPECS[kl.record["launch"]["family"]]
        align = {a.name: a.align for a in spec.args() if a.kind == "ptr"}
        for pname, addr in _pointers(launch, kl.record).items():
            if addr:
                assert addr % align[pname] == 0, (name, kl.name, pname, hex(addr))
    (entry,) = interface.prepared_calls()
    if entry.pooled is not None:
        base = entry.pool.data_ptr()
        for view in entry.pooled:
            assert view.numel() == 0 or (view.data_ptr() - base) % prepared.SCRATCH_ALIGN == 0


def test_misaligned_caller_tensors_are_refused_by_name(monkeypatch):
    fakecuda.install(monkeypatch)
    q = torch.randn(1, 1, 3, 128, dtype=torch.bfloat16)
    k = torch.randn(1, 64, 1, 128, dtype=torch.bfloat16)
    flat = torch.randn(k.numel() + 1, dtype=k.dtype)
    with torch.no_grad():
        with pytest.raises(ValueError, match="k data pointer must be 16-byte aligned"):
            fa4_aot.attention(q, flat[1:].view(k.shape), k)
        out = torch.empty(q.numel() + 1, dtype=q.dtype)[1:].view(q.shape)
        with pytest.raises(ValueError, match="out must be"):
            fa4_aot.attention(q, k, k, out=out)
