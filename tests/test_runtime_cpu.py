"""Runtime pieces that need no GPU: parameter packing, grid rule, input validation."""

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
    params = [p for p in abi.sm90_fwd_params("bf16", 128, 128, 128) if p["kind"] != "tensormap"]
    vals = _values()
    packed = pack_params(params, vals, {})
    assert [len(b) for b in packed] == [p["size"] for p in params]
    by_name = dict(zip((p["name"] for p in params), packed))
    assert struct.unpack("<3i", by_name["q_shape"]) == (vals["seqlen_q"], vals["num_heads"], vals["batch"])
    assert struct.unpack("<3i", by_name["k_shape"]) == (vals["seqlen_k"], vals["num_heads_k"], vals["batch"])
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
    assert resolve_scheduler("auto", True) == "steal"
    assert resolve_scheduler("static", False) == "static"
    with pytest.raises(ValueError, match="scheduler must be one of"):
        resolve_scheduler("fast", False)


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
