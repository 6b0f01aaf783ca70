"""Runtime pieces that need no GPU: parameter packing, grid rule, input validation."""

import ctypes
import struct

import pytest

from fa4_aot import abi
from fa4_aot.interface import grid_size, resolve_scheduler
from fa4_aot.runtime import pack_params

torch = pytest.importorskip("torch")
import fa4_aot  # noqa: E402


def _values():
    return {k: i + 1 for i, k in enumerate(abi.LAUNCH_VALUES)} | {
        "softmax_scale_log2": 0.25, "softmax_scale": 0.125}


def test_pack_scalars_and_shapes_follow_the_record():
    params = [p for p in abi.fwd_params("bf16", 128, 128, 128) if p["kind"] != "tensormap"]
    vals = _values()
    packed = pack_params(params, vals, {})
    assert [len(b) for b in packed] == [p["size"] for p in params]
    by_name = dict(zip((p["name"] for p in params), packed))
    assert struct.unpack("<3i", by_name["q_shape"]) == (vals["q_rows"], vals["num_heads"], vals["tma_batch"])
    assert struct.unpack("<3i", by_name["k_shape"]) == (vals["k_rows"], vals["num_heads_k"], vals["tma_batch"])
    assert struct.unpack("<i", by_name["window_left"]) == (vals["window_left"],)
    assert struct.unpack("<Q", by_name["cu_seqlens_q"]) == (vals["cu_seqlens_q"],)
    assert struct.unpack("<Q", by_name["o_ptr"]) == (vals["o_ptr"],)
    assert struct.unpack("<q", by_name["o_stride_b"]) == (vals["o_stride_b"],)
    assert struct.unpack("<f", by_name["softmax_scale_log2"]) == (0.25,)
    assert by_name["static_0"] == b"\0"


def test_pack_rejects_unknown_kind():
    with pytest.raises(ValueError, match="unknown parameter kind"):
        pack_params([{"name": "x", "kind": "weird", "size": 4, "align": 4}], {}, {})


def test_grid_rule_uses_sm_count_at_launch():
    assert grid_size({"rule": "tiles", "ctas_per_sm": 1}, 1000, 132) == 1000
    assert grid_size({"rule": "persistent", "ctas_per_sm": 1}, 1000, 132) == 132
    assert grid_size({"rule": "persistent", "ctas_per_sm": 1}, 1000, 78) == 78  # H20
    assert grid_size({"rule": "persistent", "ctas_per_sm": 1}, 5, 132) == 5


def test_scheduler_resolution():
    assert resolve_scheduler("auto") == "steal"
    assert resolve_scheduler("auto", "sm_100a") == "clc"
    assert resolve_scheduler("steal", "sm_100a") == "clc"
    assert resolve_scheduler("static") == "static"
    with pytest.raises(ValueError, match="scheduler must be one of"):
        resolve_scheduler("fast")
    with pytest.raises(ValueError, match="not available on sm_100a"):
        resolve_scheduler("single", "sm_100a")


def _qkv(b=1, s=16, h=2, d=64, dtype=torch.bfloat16, **kw):
    q = torch.randn(b, s, h, d, dtype=dtype)
    return q, torch.randn(b, s, h, d, dtype=dtype), torch.randn(b, s, h, d, dtype=dtype)


@pytest.mark.parametrize("mutate,match", [
    (lambda q, k, v: (q.float(), k, v), "q must be bfloat16 or float16"),
    (lambda q, k, v: (q[0], k, v), "q must have 4 dims"),
    (lambda q, k, v: (q, k.half(), v), "share a dtype"),
    (lambda q, k, v: (q, k[:, :8], v), "k and v must have the same shape"),
    (lambda q, k, v: (q, k[..., :32], v[..., :32]), "head_dim"),
    (lambda q, k, v: (q.transpose(-1, -2).contiguous().transpose(-1, -2), k, v), "contiguous in its last dim"),
    (lambda q, k, v: ("q", k, v), "q must be a torch.Tensor"),
    (lambda q, k, v: (q, torch.cat([k, k[:, :, :1]], 2), torch.cat([v, v[:, :, :1]], 2)),
     "multiple of k/v heads"),
])
def test_validation_errors_name_the_argument(mutate, match):
    q, k, v = mutate(*_qkv())
    with pytest.raises((ValueError, TypeError), match=match):
        fa4_aot.attention(q, k, v)


def test_cpu_tensors_rejected_with_device_named():
    with pytest.raises(ValueError, match="must be CUDA tensors"):
        fa4_aot.attention(*_qkv())


def test_misaligned_stride_rejected():
    q = torch.randn(1, 16, 2, 72, dtype=torch.bfloat16)[..., :64]  # row stride 72*2 = 144 B: ok
    k = torch.randn(1, 16, 2, 68, dtype=torch.bfloat16)[..., :64]  # 136 B: not 16-aligned
    with pytest.raises(ValueError, match=r"k.stride\(2\).*16 bytes"):
        fa4_aot.attention(q, k, k)


def test_bad_scalar_arguments():
    q, k, v = _qkv()
    with pytest.raises(TypeError, match="causal must be a bool"):
        fa4_aot.attention(q, k, v, causal=1)
    with pytest.raises(ValueError, match="softmax_scale"):
        fa4_aot.attention(q, k, v, softmax_scale=float("nan"))
    with pytest.raises(ValueError, match="window_size"):
        fa4_aot.attention(q, k, v, window_size=(5,))
    for bad in (-1.0, float("inf"), float("nan"), True, "30"):
        with pytest.raises(ValueError, match=r"softcap must be a finite float >= 0"):
            fa4_aot.attention(q, k, v, softcap=bad)
    with pytest.raises(ValueError, match="max_seqlen_q/k are only for varlen"):
        fa4_aot.attention(q, k, v, max_seqlen_q=16)


def _packed(total=20, h=2, d=64):
    return (torch.randn(total, h, d, dtype=torch.bfloat16),
            torch.randn(total, h, d, dtype=torch.bfloat16),
            torch.randn(total, h, d, dtype=torch.bfloat16))


@pytest.mark.parametrize("cu_q,cu_k,mq,mk,match", [
    ([0, 5, 20], [0, 5, 20], 15, 15, None),
    ([0, 5, 20], [0, 20], 15, 20, "same length"),
    ([0, 9, 5, 20], [0, 9, 5, 20], 15, 15, "never decrease"),
    ([1, 5, 20], [1, 5, 20], 15, 15, "start at 0"),
    ([0, 5, 30], [0, 5, 20], 25, 15, "exceeds the packed length"),
    ([0, 5, 20], [0, 5, 20], 10, 15, "max_seqlen_q"),
])
def test_varlen_validation(cu_q, cu_k, mq, mk, match):
    from fa4_aot.interface import _validate_varlen
    q, k, v = _packed()
    cq, ck = torch.tensor(cu_q, dtype=torch.int32), torch.tensor(cu_k, dtype=torch.int32)
    if match is None:
        _validate_varlen(q, k, cq, ck, mq, mk)
    else:
        with pytest.raises(ValueError, match=match):
            _validate_varlen(q, k, cq, ck, mq, mk)
    with pytest.raises(TypeError, match="cu_seqlens_q must be a 1-D int32"):
        _validate_varlen(q, k, cq.long(), ck, mq, mk)


def test_varlen_needs_packed_rank():
    q, k, v = _qkv()
    cu = torch.tensor([0, 16], dtype=torch.int32)
    with pytest.raises(ValueError, match=r"q must have 3 dims \(total, heads, head_dim\)"):
        fa4_aot.attention(q, k, v, cu_seqlens_q=cu, cu_seqlens_k=cu, max_seqlen_q=16,
                          max_seqlen_k=16)


def test_window_resolution():
    from fa4_aot.interface import _window
    assert _window((-1, -1), False) == (False, -1, -1)
    assert _window((-1, -1), True) == (False, -1, -1)
    assert _window((128, -1), True) == (True, 128, 0)
    assert _window((-1, 0), True) == (False, -1, -1)
    assert _window((64, 32), False) == (True, 64, 32)


def test_fake_impl_shapes_for_torch_compile():
    """The custom op's fake implementation gives the right shapes (what torch.compile traces)."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    with FakeTensorMode():
        q = torch.empty(2, 100, 8, 64, dtype=torch.bfloat16)
        k = torch.empty(2, 80, 2, 64, dtype=torch.bfloat16)
        out, lse = torch.ops.fa4_aot.fwd(q, k, k, None, None, 0, 0, True, None, -1, -1, "auto",
                                         0.0)
        assert out.shape == q.shape and lse.shape == (2, 8, 100) and lse.dtype == torch.float32
        qp = torch.empty(300, 8, 64, dtype=torch.bfloat16)
        cu = torch.empty(3, dtype=torch.int32)
        out, lse = torch.ops.fa4_aot.fwd(qp, qp, qp, cu, cu, 200, 200, False, None, -1, -1, "auto",
                                         30.0)
        assert out.shape == qp.shape and lse.shape == (8, 300)


def test_softcap_kernel_selection(monkeypatch):
    """softcap > 0 selects the softcap kernel of the resolved scheduler; schedulers without
    softcap kernels (static) and sm_100a are refused by name."""
    from fa4_aot import interface
    from fa4_aot.configs import CONFIG_SPACE

    found = []

    class FakeManifest:
        def find(self, arch, dtype, hd, causal, sched, trace=False, variant="", local=False,
                 softcap=False):
            found.append((arch, sched, softcap))
            return "k", {}

    monkeypatch.setattr(interface, "load_manifest", lambda: FakeManifest())
    monkeypatch.setattr(interface, "_device_arch", lambda device: "sm_90a")
    dev = torch.device("cpu")
    interface.select_kernel(dev, torch.bfloat16, 128, True, "auto", softcap=True)
    interface.select_kernel(dev, torch.bfloat16, 128, False, "single", softcap=True)
    interface.select_kernel(dev, torch.bfloat16, 128, False, "auto")
    assert found == [("sm_90a", "steal", True), ("sm_90a", "single", True),
                     ("sm_90a", "steal", False)]
    with pytest.raises(ValueError, match="softcap kernels exist for scheduler 'auto', 'single', "
                                         "'steal'; got scheduler='static'"):
        interface.select_kernel(dev, torch.bfloat16, 128, True, "static", softcap=True)
    monkeypatch.setattr(interface, "_device_arch", lambda device: "sm_100a")
    with pytest.raises(ValueError, match="softcap is not supported on sm_100a"):
        interface.select_kernel(dev, torch.bfloat16, 128, True, "auto", softcap=True)
    # Every (dtype, head_dim, mask) of sm_90a has a softcap kernel for both schedulers.
    plain = {(c.dtype, c.head_dim, c.causal, c.local) for c in CONFIG_SPACE
             if c.arch == "sm_90a" and not c.trace}
    capped = {(c.dtype, c.head_dim, c.causal, c.local, c.scheduler) for c in CONFIG_SPACE
              if c.softcap}
    assert capped == {p + (s,) for p in plain for s in ("single", "steal")}


def test_softcap_launch_values():
    """The scalars a softcap launch passes: tanh(S * scale / cap), then the softmax in units of
    the cap (so P and the LSE are those of cap * tanh(scale * S / cap))."""
    import math
    from fa4_aot import interface
    from fa4_aot.testing import attention_ref
    q = torch.randn(1, 5, 1, 8)
    k = torch.randn(1, 7, 1, 8)
    v = torch.randn(1, 7, 1, 8)
    scale, cap = 0.7, 2.0
    out, lse = attention_ref(q, k, v, softmax_scale=scale, softcap=cap)
    vals = interface.softmax_scalars(scale, cap)
    s = torch.einsum("bqhd,bkhd->bhqk", q, k)
    t = torch.tanh(s * vals["softcap_pre"])  # the kernel's apply_softcap
    m = t.amax(-1, keepdim=True)
    p = torch.exp2(t * vals["softmax_scale_log2"] - m * vals["softmax_scale_log2"])
    lse_k = m.squeeze(-1) * vals["softmax_scale"] + torch.log(p.sum(-1))  # the epilogue
    torch.testing.assert_close(lse_k, lse)
    torch.testing.assert_close(torch.einsum("bhqk,bkhd->bqhd", p / p.sum(-1, keepdim=True), v), out)
    assert interface.softmax_scalars(scale, 0.0) == {
        "softmax_scale_log2": scale * math.log2(math.e), "softmax_scale": scale, "softcap_pre": 0.0}


def test_launch_plan_layout_and_buffer_reuse(monkeypatch):
    """The plan packs every parameter of a real record at 64-byte aligned offsets (descriptors
    from the descriptor cache, faked here), static placeholders zero, and rewrites the same
    buffer on the next call."""
    from fa4_aot import runtime
    params = abi.fwd_params("bf16", 128, 128, 128)
    monkeypatch.setattr(runtime, "tensormap_bytes", lambda p, t: bytes([len(p["name"])]) * 128)
    plan = runtime.LaunchPlan(params)
    assert all(o % 64 == 0 for o in plan.offsets)
    buf = plan.pack(_values(), {"q": None, "k": None, "v": None})
    for off, p, b in zip(plan.offsets, params, pack_params(params, _values(), {"q": None, "k": None, "v": None})):
        assert bytes(buf[off:off + p["size"]]) == b
    assert bytes(buf[plan.offsets[0]:plan.offsets[0] + 128]) == bytes([5]) * 128  # "tma_q"
    again = plan.pack(_values() | {"softmax_scale": 2.0}, {"q": None, "k": None, "v": None})
    assert ctypes.addressof(again) == ctypes.addressof(buf)
    i = [p["name"] for p in params].index("softmax_scale")
    assert struct.unpack_from("<f", again, plan.offsets[i]) == (2.0,)
    with pytest.raises(ValueError, match="packed 4 bytes, record says 8"):
        runtime.LaunchPlan([{"name": "x", "kind": "i32", "size": 8, "align": 8, "value": "x"}])
