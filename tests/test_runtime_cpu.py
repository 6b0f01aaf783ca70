"""Runtime pieces that need no GPU: parameter packing, grid rule, input validation, and the
whole host path (memo, descriptor patching, launch) on CPU tensors with a fake driver
(tests/fakecuda.py)."""

import itertools
import struct
import threading

import pytest

from fa4_aot import abi
from fa4_aot.plan import grid_size, resolve_scheduler
from fa4_aot.runtime import pack_params

torch = pytest.importorskip("torch")
import fa4_aot  # noqa: E402
import fa4_aot.plan  # noqa: E402
import fakecuda  # noqa: E402
from conftest import memo_plan, run_in_threads  # noqa: E402
from bench.benchlib import ZIPF_DOCS  # noqa: E402
from fakecuda import fwd_params  # noqa: E402


def _values():
    return {k: i + 1 for i, k in enumerate(abi.LAUNCH_VALUES)} | {
        "softmax_scale_log2": 0.25, "softmax_scale": 0.125}


def test_pack_scalars_and_shapes_follow_the_record():
    params = [p for p in fwd_params("bf16", 128, 128, 128) if p["kind"] != "tensormap"]
    vals = _values()
    packed = pack_params(params, vals, {})
    assert [len(b) for b in packed] == [p["size"] for p in params]
    by_name = dict(zip((p["name"] for p in params), packed))
    assert struct.unpack("<3i", by_name["q_shape"]) == (vals["q_rows"], vals["num_heads"], vals["q_batch"])
    assert struct.unpack("<3i", by_name["k_shape"]) == (vals["k_rows"], vals["num_heads_k"], vals["k_batch"])
    assert struct.unpack("<i", by_name["window_left"]) == (vals["window_left"],)
    assert struct.unpack("<Q", by_name["cu_seqlens_q"]) == (vals["cu_seqlens_q"],)
    assert struct.unpack("<Q", by_name["o_ptr"]) == (vals["o_ptr"],)
    assert struct.unpack("<q", by_name["o_stride_b"]) == (vals["o_stride_b"],)
    assert struct.unpack("<f", by_name["softmax_scale_log2"]) == (0.25,)
    if "static_0" in by_name:  # ABI 2 placeholders
        assert by_name["static_0"] == b"\0"


def test_pack_rejects_unknown_kind():
    with pytest.raises(ValueError, match="unknown parameter kind"):
        pack_params([{"name": "x", "kind": "weird", "size": 4, "align": 4}], {}, {})


def test_grid_rule_uses_sm_count_at_launch():
    assert grid_size({"rule": "tiles", "ctas_per_sm": 1}, 1000, 132) == 1000
    assert grid_size({"rule": "persistent", "ctas_per_sm": 1}, 1000, 132) == 132
    assert grid_size({"rule": "persistent", "ctas_per_sm": 1}, 1000, 78) == 78  # H20
    assert grid_size({"rule": "persistent", "ctas_per_sm": 1}, 5, 132) == 5
    assert grid_size({"rule": "rows", "rows_per_cta": 4}, 9, 132) == 3  # the combine kernel


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
    for bad in (float("nan"), 0.0, -0.125):
        with pytest.raises(ValueError, match="softmax_scale must be a finite float > 0"):
            fa4_aot.attention(q, k, v, softmax_scale=bad)
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


def _varlen_args(q, k, cu_q, cu_k, max_q, max_k):
    from fa4_aot import validate
    validate.check_varlen_args(validate.Args(q, k, k, cu_seqlens_q=cu_q, cu_seqlens_k=cu_k,
                                             max_seqlen_q=max_q, max_seqlen_k=max_k))


@pytest.mark.parametrize("cu_q,cu_k,mq,mk,match", [
    ([0, 5, 20], [0, 5, 20], 15, 15, None),
    ([0, 9, 5, 20], [0, 9, 5, 20], 15, 15, "cu_seqlens_q decreases at index 2 .*never decrease"),
    ([1, 5, 20], [1, 5, 20], 15, 15, r"cu_seqlens_q\[0\] = 1: .*must start at 0"),
    ([0, 5, 30], [0, 5, 20], 25, 15, r"cu_seqlens_q\[-1\] = 30 exceeds the packed length 20"),
    ([0, 5, 20], [0, 5, 20], 10, 15, r"15 tokens \(document 1\) exceeds max_seqlen_q = 10"),
    ([0, 5, 20], [0, 5, 21], 15, 16, r"cu_seqlens_k\[-1\] = 21 exceeds"),
    ([0, 5, 20], [0, 6, 20], 15, 13, "max_seqlen_k = 13"),
])
def test_check_varlen_reports_each_problem_by_name(cu_q, cu_k, mq, mk, match):
    """The offsets' values: only check_varlen reads them (one device->host copy)."""
    q, k, v = _packed()
    cq, ck = torch.tensor(cu_q, dtype=torch.int32), torch.tensor(cu_k, dtype=torch.int32)
    _varlen_args(q, k, cq, ck, mq, mk)  # structure only: never raises on values
    if match is None:
        fa4_aot.check_varlen(cq, ck, mq, mk, total_q=20, total_k=20)
    else:
        with pytest.raises(ValueError, match=match):
            fa4_aot.check_varlen(cq, ck, mq, mk, total_q=20, total_k=20)


def test_check_varlen_without_packed_lengths():
    cu = torch.tensor([0, 5, 30], dtype=torch.int32)
    fa4_aot.check_varlen(cu, cu, 25, 25)  # the past-the-end check needs total_q / total_k
    with pytest.raises(ValueError, match="exceeds the packed length 29"):
        fa4_aot.check_varlen(cu, cu, 25, 25, total_q=30, total_k=29)


def test_varlen_structure_validation():
    q, k, v = _packed()
    cq = torch.tensor([0, 5, 20], dtype=torch.int32)
    with pytest.raises(ValueError, match="same length"):
        _varlen_args(q, k, cq, torch.tensor([0, 20], dtype=torch.int32), 15, 20)
    with pytest.raises(TypeError, match="cu_seqlens_q must be a 1-D int32"):
        _varlen_args(q, k, cq.long(), cq, 15, 15)
    with pytest.raises(TypeError, match="cu_seqlens_k must be a 1-D int32"):
        fa4_aot.check_varlen(cq, cq.float(), 15, 15)
    with pytest.raises(ValueError, match="cu_seqlens_q must be contiguous"):
        _varlen_args(q, k, torch.tensor([0, 0, 5, 0, 20, 0], dtype=torch.int32)[::2], cq,
                         15, 15)
    with pytest.raises(ValueError, match="max_seqlen_q must be a non-negative int"):
        _varlen_args(q, k, cq, cq, 15.0, 15)


def test_varlen_needs_packed_rank():
    q, k, v = _qkv()
    cu = torch.tensor([0, 16], dtype=torch.int32)
    with pytest.raises(ValueError, match=r"q must have 3 dims \(total, heads, head_dim\)"):
        fa4_aot.attention(q, k, v, cu_seqlens_q=cu, cu_seqlens_k=cu, max_seqlen_q=16,
                          max_seqlen_k=16)


def test_window_resolution():
    from fa4_aot.validate import window
    assert window((-1, -1), False) == (False, -1, -1)
    assert window((-1, -1), True) == (False, -1, -1)
    assert window((128, -1), True) == (True, 128, 0)
    assert window((-1, 0), True) == (False, -1, -1)
    assert window((64, 32), False) == (True, 64, 32)


def test_fake_impl_shapes_for_torch_compile():
    """The custom op's fake implementation gives the right shapes (what torch.compile traces)."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    with FakeTensorMode():
        q = torch.empty(2, 100, 8, 64, dtype=torch.bfloat16)
        k = torch.empty(2, 80, 2, 64, dtype=torch.bfloat16)
        out, lse = torch.ops.fa4_aot.fwd(q, k, k, [None] * 5, [0, 0, -1, -1, 0], True, None,
                                         "auto", 0.0)
        assert out.shape == q.shape and lse.shape == (2, 8, 100) and lse.dtype == torch.float32
        qp = torch.empty(300, 8, 64, dtype=torch.bfloat16)
        cu = torch.empty(3, dtype=torch.int32)
        out, lse = torch.ops.fa4_aot.fwd(qp, qp, qp, [cu, cu, None, None, None],
                                         [200, 200, -1, -1, 0], False, None, "auto", 30.0)
        assert out.shape == qp.shape and lse.shape == (8, 300)


def test_softcap_kernel_selection(monkeypatch):
    """softcap > 0 selects the softcap kernel of the resolved scheduler; schedulers without
    softcap kernels (static) and sm_100a are refused by name."""
    from fa4_aot import interface
    from fa4_aot.configs import CONFIG_SPACE

    man = fakecuda.FakeManifest()
    monkeypatch.setattr(interface, "load_manifest", lambda: man)
    monkeypatch.setattr(interface, "_device_arch", lambda device: "sm_90a")
    dev = torch.device("cpu")
    interface.select_kernel(dev, torch.bfloat16, 128, True, "auto", softcap=True)
    interface.select_kernel(dev, torch.bfloat16, 128, False, "single", softcap=True)
    interface.select_kernel(dev, torch.bfloat16, 128, False, "auto")
    assert [(arch, sched, cap) for arch, _, _, _, sched, _, _, cap in man.found] == [
        ("sm_90a", "steal", True), ("sm_90a", "single", True), ("sm_90a", "steal", False)]
    with pytest.raises(ValueError, match="softcap kernels exist for scheduler 'auto', 'single', "
                                         "'steal'; got scheduler='static'"):
        interface.select_kernel(dev, torch.bfloat16, 128, True, "static", softcap=True)
    monkeypatch.setattr(interface, "_device_arch", lambda device: "sm_100a")
    with pytest.raises(ValueError, match="softcap kernels exist on sm_90a only; this device is "
                                         "sm_100a"):
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
    from fa4_aot.testing import attention_ref
    q = torch.randn(1, 5, 1, 8)
    k = torch.randn(1, 7, 1, 8)
    v = torch.randn(1, 7, 1, 8)
    scale, cap = 0.7, 2.0
    out, lse = attention_ref(q, k, v, softmax_scale=scale, softcap=cap)
    vals = fa4_aot.plan.softmax_scalars(scale, cap)
    s = torch.einsum("bqhd,bkhd->bhqk", q, k)
    t = torch.tanh(s * vals["softcap_pre"])  # the kernel's apply_softcap
    m = t.amax(-1, keepdim=True)
    p = torch.exp2(t * vals["softmax_scale_log2"] - m * vals["softmax_scale_log2"])
    lse_k = m.squeeze(-1) * vals["softmax_scale"] + torch.log(p.sum(-1))  # the epilogue
    torch.testing.assert_close(lse_k, lse)
    torch.testing.assert_close(torch.einsum("bhqk,bkhd->bqhd", p / p.sum(-1, keepdim=True), v), out)
    assert fa4_aot.plan.softmax_scalars(scale, 0.0) == {
        "softmax_scale_log2": scale * math.log2(math.e), "softmax_scale": scale, "softcap_pre": 0.0}


def test_param_layout(monkeypatch):
    """The layout packs every parameter of a real record at 64-byte aligned offsets (descriptors
    from the descriptor encoder, faked here), static placeholders zero."""
    from fa4_aot import runtime
    params = fwd_params("bf16", 128, 128, 128)
    monkeypatch.setattr(runtime, "tensormap_bytes", lambda p, t: bytes([len(p["name"])]) * 128)
    layout = runtime.ParamLayout(params)
    assert all(o % 64 == 0 for o in layout.offsets) and layout.size % 8 == 0
    tensors = {"q": None, "k": None, "v": None}
    buf = layout.pack(_values(), tensors)
    for off, p, b in zip(layout.offsets, params, pack_params(params, _values(), tensors)):
        assert bytes(buf[off:off + p["size"]]) == b
    assert bytes(buf[layout.offsets[0]:layout.offsets[0] + 128]) == bytes([5]) * 128  # "tma_q"
    with pytest.raises(ValueError, match="packed 4 bytes, record says 8"):
        runtime.ParamLayout([{"name": "x", "kind": "i32", "size": 8, "align": 8, "value": "x"}])


# ------------------------------------------------------------------ TMA descriptor patching
def _image(words):
    return struct.pack("<16Q", *words)


def test_address_field_is_found_only_when_exactly_one_field_differs():
    from fa4_aot.runtime import address_field
    base = [0x1111 * (i + 1) for i in range(16)]
    a, b = 0x7F00_0000_1000, 0x7F00_0000_1000 ^ 0x5A5A_5A5A_5A50
    img_a, img_b = list(base), list(base)
    img_a[2], img_b[2] = a, b
    assert address_field(_image(img_a), a, _image(img_b), b) == 16
    img_b[7] += 1  # another byte changes too: not a pure address field
    assert address_field(_image(img_a), a, _image(img_b), b) is None
    sa, sb = list(base), list(base)  # the address stored shifted: no raw field
    sa[1], sb[1] = a >> 4, b >> 4
    assert address_field(_image(sa), a, _image(sb), b) is None
    assert address_field(_image(img_a), a, _image(img_a), a) is None  # one address proves nothing


@pytest.mark.parametrize("addr_word", [0, 3, None])
def test_tensormap_template_patches_or_falls_back(monkeypatch, addr_word):
    """The first encode of a shape also encodes at a probe address; later addresses of that
    shape are patched into the cached image (no encode) when the field was found, and
    re-encoded otherwise. Either way the bytes equal a fresh encode at that address."""
    from fa4_aot import runtime
    drv = fakecuda.install(monkeypatch, addr_word=addr_word)
    p = fwd_params("bf16", 128, 128, 128)[0]
    dims, strides = (128, 1000, 8, 2), (256, 2048, 2048000)
    img, off = runtime.tensormap_template(p, dims, strides, 0x10000)
    assert drv.encodes == 2 and off == (None if addr_word is None else 8 * addr_word)
    for addr in (0x10000, 0x7F12_3456_7890, 0x20_0000_0010):
        img, off = runtime.tensormap_template(p, dims, strides, addr)
        assert img == runtime.encode_tensormap(p, dims, strides, addr)
    extra = 0 if addr_word is not None else 2  # fallback: one encode per new address
    assert drv.encodes == 2 + 3 + extra
    # a new shape of the same layout: one encode, no probe (the field is known)
    before = drv.encodes
    img, off = runtime.tensormap_template(p, (128, 1001, 8, 2), (256, 2048, 2050048), 0x30000)
    assert img == runtime.encode_tensormap(p, (128, 1001, 8, 2), (256, 2048, 2050048), 0x30000)
    assert drv.encodes == before + 2


# ------------------------------------------------------------------ the host path, faked driver
def _dense(b=2, sq=100, sk=80, h=4, hk=2, d=64, dtype=torch.bfloat16):
    return (torch.randn(b, sq, h, d, dtype=dtype), torch.randn(b, sk, hk, d, dtype=dtype),
            torch.randn(b, sk, hk, d, dtype=dtype))


def _reference_buffer(launch, record, values, tensors):
    """What the launch buffer must hold: every parameter packed from scratch."""
    params = record["launch"]["params"]
    ref = pack_params(params, values, tensors)
    got = [launch["buffer"][o:o + p["size"]] for o, p in zip(launch["offsets"], params)]
    return params, ref, got


def _expected_values(entry_launch, out, lse, q, k, v, cu_q=None, cu_k=None):
    vals = dict(entry_launch.values)
    addrs = {"q_ptr": q.data_ptr(), "k_ptr": k.data_ptr(), "v_ptr": v.data_ptr(),
             "o_ptr": out.data_ptr(), "lse_ptr": lse.data_ptr(),
             "cu_seqlens_q": cu_q.data_ptr() if cu_q is not None else 0,
             "cu_seqlens_k": cu_k.data_ptr() if cu_k is not None else 0, "trace_ptr": 0}
    return {n: (addrs[x.slot] if isinstance(x, fa4_aot.runtime.PerCall) else x)
            for n, x in vals.items()}


def test_memo_hit_patches_addresses_and_matches_a_full_pack(monkeypatch):
    """Same shapes, new tensors every call: one derivation, one descriptor template per shape,
    and every launch buffer equal to a from-scratch pack with that call's addresses."""
    drv = fakecuda.install(monkeypatch)
    derived = []
    real = fa4_aot.plan.plan
    monkeypatch.setattr(fa4_aot.plan, "plan", lambda c, *a: derived.append(c) or real(c, *a))
    with torch.no_grad():
        by_calls = 0
        for i in range(4):
            q, k, v = _dense()
            before = drv.encodes
            out, lse = fa4_aot.attention(q, k, v, causal=True, return_lse=True)
            by_calls += drv.encodes - before
            assert out.shape == q.shape and lse.shape == (2, 4, 100)
            (kl,) = memo_plan().launches
            values = _expected_values(kl, out, lse, q, k, v)
            params, ref, got = _reference_buffer(drv.launches[-1], kl.record, values,
                                                 {"q": q, "k": k, "v": v})
            for p, r, g in zip(params, ref, got):
                assert r == g, f"call {i}: parameter {p['name']} differs"
    assert len(derived) == 1 and len(drv.launches) == 4
    # q's descriptor encoded twice (the probe locates the address field of the layout), k's
    # once (same layout), v's none (k's image, patched)
    assert by_calls == 3
    assert drv.launches[-1]["grid"] == (8, 1, 1) and drv.launches[-1]["stream"] == 0x5000


def test_fallback_reencodes_when_the_address_field_is_not_raw(monkeypatch):
    drv = fakecuda.install(monkeypatch, addr_word=None)
    with torch.no_grad():
        for _ in range(3):
            q, k, v = _dense()
            out, lse = fa4_aot.attention(q, k, v, return_lse=True)
            (kl,) = memo_plan().launches
            values = _expected_values(kl, out, lse, q, k, v)
            params, ref, got = _reference_buffer(drv.launches[-1], kl.record, values,
                                                 {"q": q, "k": k, "v": v})
            assert ref == got


@pytest.mark.parametrize("change", ["stride", "dtype", "causal", "scale", "stream", "window",
                                    "softcap", "scheduler", "out"])
def test_memo_key_covers_what_the_launch_depends_on(monkeypatch, change):
    drv = fakecuda.install(monkeypatch)
    derived = []
    real = fa4_aot.plan.plan
    monkeypatch.setattr(fa4_aot.plan, "plan", lambda c, *a: derived.append(c) or real(c, *a))
    q, k, v = _dense()
    kw = {}
    with torch.no_grad():
        fa4_aot.attention(q, k, v)
        fa4_aot.attention(q, k, v)
        assert len(derived) == 1
        if change == "stride":
            big = torch.randn(2, 80, 4, 64, dtype=torch.bfloat16)
            k = big[:, :, :2]  # same shape, other strides
        elif change == "dtype":
            q, k, v = (x.half() for x in (q, k, v))
        elif change == "causal":
            kw["causal"] = True
        elif change == "scale":
            kw["softmax_scale"] = 0.3
        elif change == "stream":
            drv.stream = 0x6000
        elif change == "window":
            kw["window_size"] = (16, 0)
        elif change == "softcap":
            kw["softcap"] = 5.0
        elif change == "scheduler":
            kw["scheduler"] = "single"
        elif change == "out":
            kw["out"] = torch.empty_like(q)
        fa4_aot.attention(q, k, v, **kw)
    assert len(derived) == 2, change
    if change == "stream":
        assert drv.launches[-1]["stream"] == 0x6000


def test_type_sensitive_arguments_are_not_mistaken_for_memoized_ones(monkeypatch):
    """causal=1 after causal=True, softcap=False after 0.0: same hash, still refused."""
    fakecuda.install(monkeypatch)
    q, k, v = _dense()
    with torch.no_grad():
        fa4_aot.attention(q, k, v, causal=True)
        with pytest.raises(TypeError, match="causal must be a bool"):
            fa4_aot.attention(q, k, v, causal=1)
        with pytest.raises(ValueError, match="softcap must be a finite float"):
            fa4_aot.attention(q, k, v, causal=True, softcap=False)
        with pytest.raises(ValueError, match="window_size must be a pair of ints"):
            fa4_aot.attention(q, k, v, causal=True, window_size=(-1.0, -1))
        with pytest.raises(ValueError, match="max_seqlen_q/k are only for varlen"):
            fa4_aot.attention(q, k, v, causal=True, max_seqlen_q=100)


def test_per_call_checks_on_a_memo_hit(monkeypatch):
    """Alignment of every data pointer (not in the key) is checked on each call; grad mode
    with an input that requires grad is refused (forward only)."""
    fakecuda.install(monkeypatch)
    q, k, v = _dense(d=64)
    with torch.no_grad():
        fa4_aot.attention(q, k, v)
        flat = torch.randn(q.numel() + 8, dtype=q.dtype)
        q_off = flat[8:].view(q.shape)  # 16-byte aligned strides, pointer 16 bytes further
        fa4_aot.attention(q_off, k, v)
        q_bad = flat[1:q.numel() + 1].view(q.shape)  # 2 bytes off
        with pytest.raises(ValueError, match="q data pointer must be 16-byte aligned"):
            fa4_aot.attention(q_bad, k, v)
        out_bad = torch.empty(q.numel() + 1, dtype=q.dtype)[1:].view(q.shape)
        with pytest.raises(ValueError, match="out must be a tensor"):
            fa4_aot.attention(q, k, v, out=out_bad)
    fa4_aot.attention(q, k, v)  # grad mode on, nothing requires grad: fine
    qg = q.clone().requires_grad_()
    with pytest.raises(NotImplementedError, match="fa4_aot is forward-only"):
        fa4_aot.attention(qg, k, v)
    with pytest.raises(NotImplementedError, match="forward-only"):
        fa4_aot.interface.forward(q, k, v.clone().requires_grad_(), [None] * 5,
                                  [0, 0, -1, -1, 0], False, None, "auto", 0.0)
    with torch.no_grad():
        fa4_aot.attention(qg, k, v)
    with torch.inference_mode():
        fa4_aot.attention(qg, k, v)


def test_op_form_shares_the_memo(monkeypatch):
    """torch.ops.fa4_aot.fwd's implementation (interface.forward) hits the entries that
    attention() made, and packs the same values."""
    from fa4_aot import interface
    drv = fakecuda.install(monkeypatch)
    q, k, v = _dense()
    with torch.no_grad():
        fa4_aot.attention(q, k, v, causal=True, window_size=(32, 0))
        n = len(interface.memo_plans())
        out, lse = interface.forward(q, k, v, [None] * 5, [0, 0, 32, 0, 0], True, None, "auto",
                                     0.0)
    assert len(interface.memo_plans()) == n
    a, b = drv.launches[-2:]
    assert a["offsets"] == b["offsets"]


def test_varlen_reads_no_offsets_unless_asked(monkeypatch):
    """The default varlen path never copies cu_seqlens to the host; FA4_AOT_CHECK_VARLEN
    (set_check_varlen) runs check_varlen on every call."""
    drv = fakecuda.install(monkeypatch)
    q, k, v = _packed(total=20, h=4, d=64)
    cu = torch.tensor([0, 5, 20], dtype=torch.int32)
    bad = torch.tensor([0, 9, 5], dtype=torch.int32)

    def no_host_copy(self, *a, **kw):
        raise AssertionError("cu_seqlens copied to the host")
    with torch.no_grad():
        monkeypatch.setattr(torch.Tensor, "tolist", no_host_copy)
        for cu_q in (cu, bad):
            out, lse = fa4_aot.attention(q, k, v, cu_seqlens_q=cu_q, cu_seqlens_k=cu_q,
                                         max_seqlen_q=15, max_seqlen_k=15, return_lse=True)
            assert lse.shape == (4, 20)
        monkeypatch.undo()
        drv = fakecuda.install(monkeypatch)
        kl = drv.launches
        monkeypatch.setattr(fa4_aot.prepared, "check_varlen_always", True)
        fa4_aot.attention(q, k, v, cu_seqlens_q=cu, cu_seqlens_k=cu, max_seqlen_q=15,
                          max_seqlen_k=15)
        with pytest.raises(ValueError, match="cu_seqlens_q decreases at index 2"):
            fa4_aot.attention(q, k, v, cu_seqlens_q=bad, cu_seqlens_k=bad, max_seqlen_q=15,
                              max_seqlen_k=15)
        assert len(kl) == 1  # the bad call launched nothing


def test_varlen_launch_values(monkeypatch):
    drv = fakecuda.install(monkeypatch)
    q, k, v = _packed(total=20, h=4, d=64)
    k, v = k[:, :2].contiguous(), v[:, :2].contiguous()
    cu = torch.tensor([0, 5, 20], dtype=torch.int32)
    with torch.no_grad():
        out, lse = fa4_aot.attention(q, k, v, cu_seqlens_q=cu, cu_seqlens_k=cu, max_seqlen_q=15,
                                     max_seqlen_k=15, causal=True, return_lse=True)
    (kl,) = memo_plan().launches
    vals = kl.values
    assert (vals["batch"], vals["seqlen_q"], vals["q_rows"], vals["q_batch"]) == (2, 15, 20, 1)
    assert (vals["o_stride_b"], vals["lse_stride_b"], vals["lse_stride_h"]) == (0, 0, 20)
    # 15 query rows x 2 heads per KV head = 30 packed rows: the decode kernels (packed GQA), one
    # 64-row m-block per (KV head, document): 1 * 2 KV heads * 2 documents, no split.
    assert vals["num_tiles"] == 1 * 2 * 2 and vals["qhead_per_kvhead"] == 2
    assert vals["num_splits"] == 1 and vals["seq_mode"] == 1 | 8
    values = _expected_values(kl, out, lse, q, k, v, cu, cu)
    params, ref, got = _reference_buffer(drv.launches[-1], kl.record, values,
                                         {"q": q.unsqueeze(0), "k": k.unsqueeze(0),
                                          "v": v.unsqueeze(0)})
    assert ref == got


def test_empty_problems_launch_nothing(monkeypatch):
    drv = fakecuda.install(monkeypatch)
    with torch.no_grad():
        q, k, v = _dense(sq=0)
        out, lse = fa4_aot.attention(q, k, v, return_lse=True)
        assert out.shape == q.shape and lse.shape == (2, 4, 0)
        q, k, v = _dense(sk=0)
        out, lse = fa4_aot.attention(q, k, v, return_lse=True)
        assert torch.equal(out, torch.zeros_like(q)) and bool((lse == -float("inf")).all())
    assert drv.launches == []


def test_launch_error_is_raised(monkeypatch):
    drv = fakecuda.install(monkeypatch)
    drv.fail_launch = True
    q, k, v = _dense()
    with torch.no_grad(), pytest.raises(fa4_aot.runtime.CudaError, match="cuLaunchKernelEx"):
        fa4_aot.attention(q, k, v)


def test_threads_interleaved_each_launch_packs_its_own_call(monkeypatch):
    """Threads on their own streams, calls interleaved: every launch buffer holds the
    addresses of the call that made it (per-thread memo and parameter buffers)."""
    from fa4_aot import interface
    drv = fakecuda.install(monkeypatch)
    streams = {}
    monkeypatch.setattr(interface, "_raw_stream",
                        lambda index: streams.setdefault(threading.get_ident(),
                                                         0x7000 + len(streams)))
    records = []
    lock = threading.Lock()
    real_launch = drv.cuLaunchKernelEx
    barrier = threading.Barrier(4)

    def launch(cfg, func, params, extra):
        with lock:
            r = real_launch(cfg, func, params, extra)
            records.append((threading.get_ident(), drv.launches[-1]))
        return r
    drv.cuLaunchKernelEx = launch

    def worker(seed):
        barrier.wait()
        with torch.no_grad():
            for i in range(25):
                q, k, v = _dense(sq=50 + seed)
                out, lse = fa4_aot.attention(q, k, v, return_lse=True)
                ident = threading.get_ident()
                with lock:
                    mine = [r for t, r in records if t == ident][-1]
                (kl,) = memo_plan().launches
                values = _expected_values(kl, out, lse, q, k, v)
                _, ref, got = _reference_buffer(mine, kl.record, values,
                                                {"q": q, "k": k, "v": v})
                assert ref == got, (seed, i)
                assert mine["stream"] == streams[ident]
    run_in_threads(worker, 4)
    assert len(records) == 100


@pytest.mark.parametrize("layout", ["contiguous", "bhsd_view", "qkv_slice"])
def test_output_is_contiguous_and_its_strides_are_the_launched_ones(monkeypatch, layout):
    """The output is allocated contiguous whatever q's layout (empty_like only for a contiguous
    q), and the launch carries its strides."""
    drv = fakecuda.install(monkeypatch)
    b, s, h, d = 2, 100, 4, 64
    if layout == "contiguous":
        q = torch.randn(b, s, h, d, dtype=torch.bfloat16)
    elif layout == "bhsd_view":
        q = torch.randn(b, h, s, d, dtype=torch.bfloat16).transpose(1, 2)  # dense, permuted
    else:
        q = torch.randn(b, s, 3, h, d, dtype=torch.bfloat16)[:, :, 0]  # not dense
    k = torch.randn(b, s, h, d, dtype=torch.bfloat16)
    with torch.no_grad():
        for _ in range(2):  # miss, then hit
            out, lse = fa4_aot.attention(q, k, k, return_lse=True)
            assert out.is_contiguous() and out.shape == q.shape
            (kl,) = memo_plan().launches
            assert (kl.values["o_stride_s"], kl.values["o_stride_h"], kl.values["o_stride_b"]) \
                == (out.stride(1), out.stride(2), out.stride(0))
            values = _expected_values(kl, out, lse, q, k, k)
            _, ref, got = _reference_buffer(drv.launches[-1], kl.record, values,
                                            {"q": q, "k": k, "v": k})
            assert ref == got


@pytest.mark.parametrize("s,causal,kw,m", [
    (1024, True, {}, 128),                       # auto (steal): the 128-row alternative
    (4096, True, {}, 192),
    (1024, False, {}, 192),                      # 1152 rows for 1024, still cheaper
    (256, False, {}, 128),                       # 384 rows for 256 (1.5x the work)
    (1024, True, {"scheduler": "single"}, 192),   # alternatives exist for steal only
    (1024, True, {"window_size": (256, 0)}, 192),  # and not for windows
    (1024, True, {"softcap": 30.0}, 192),
])
def test_hd64_calls_take_the_cheaper_tile(monkeypatch, s, causal, kw, m):
    """hd64 prefill runs on 192-row tiles unless plan.prefer_m128 says the 128-row
    alternative costs less (full/causal work stealing only)."""
    kl = _dense_launch(monkeypatch, dict(b=2, sq=s, sk=s, h=16, hk=16, d=64), causal=causal, **kw)
    assert kl.record["launch"]["tile"]["m"] == m, kl.name


def _dense_launch(monkeypatch, shape: dict, **kw):
    """The one kernel launch of ``fa4_aot.attention`` on dense inputs of ``shape`` (_dense)."""
    fakecuda.install(monkeypatch)
    q, k, v = _dense(**shape)
    with torch.no_grad():
        fa4_aot.attention(q, k, v, **kw)
    (kl,) = memo_plan().launches
    return kl


@pytest.mark.parametrize("sq,sk,causal,kw,n", [
    (1024, 1024, False, {}, 176),                 # non-causal hd128: always the wide-n tile
    (1024, 1024, False, {"scheduler": "single"}, 176),
    (1536, 1536, True, {}, 128),                  # causal: rows see 768 keys on average
    (2048, 2048, True, {}, 160),                  # 1,024: the wide-n alternative (160 keys)
    (8192, 8192, True, {}, 160),
    (8192, 8192, True, {"scheduler": "single"}, 160),  # every scheduler: the same tile
    (8192, 8192, True, {"scheduler": "static"}, 160),
    (8192, 8192, True, {"softcap": 30.0}, 160),
    (1024, 8192, True, {}, 160),                  # short queries on a long cache
    (8192, 8192, True, {"window_size": (4096, 0)}, 128),  # windows keep their tile
])
def test_hd128_calls_take_the_wide_n_tile(monkeypatch, sq, sk, causal, kw, n):
    """hd128: non-causal kernels run on 176-key blocks; causal calls take the wide-n
    alternative (160 keys) when plan.prefer_long_kv says their rows see enough keys."""
    kl = _dense_launch(monkeypatch, dict(b=1, sq=sq, sk=sk, h=2, hk=2, d=128), causal=causal,
                       **kw)
    assert kl.record["launch"]["tile"]["n"] == n, kl.name
    assert kl.record["config"]["long_kv"] is (causal and n == 160)


@pytest.mark.parametrize("lens,n", [([8192] * 3, 160), ([6144] * 4, 160),
                                    ([16384] + [512] * 32, 160), ([4096] * 8, 160),
                                    ([2048] * 16, 160), ([1536] * 16, 128),
                                    ([1024] * 32, 128), ([1024] * 31 + [4096], 128),
                                    (list(ZIPF_DOCS), 160)])
def test_varlen_wide_n_on_the_token_weighted_length(monkeypatch, lens, n):
    """Causal varlen calls take the wide-n tile on plan.varlen_length (the length of an
    average token's document, from the totals and max_seqlen), not the mean document length:
    16k + 32 x 512 (mean 993, 8,448 by tokens) ran 2.5 % faster on it (docs/perf-notes.md
    v18); since v32 from rows of 1,024 keys (16 x 2k +2 % on it, 32 x 1k -0.3 to -0.8 %); one
    4k document among 31 of 1k (1,375 by tokens, 687 keys a row) stays on 128 keys."""
    kl = _causal_varlen_launch(monkeypatch, lens, heads=2)
    assert kl.record["launch"]["tile"]["n"] == n, kl.name


def _causal_varlen_launch(monkeypatch, lens, heads):
    """The one kernel launch of a causal hd128 varlen call over documents of ``lens``."""
    fakecuda.install(monkeypatch)
    cu = torch.tensor([0] + list(itertools.accumulate(lens)), dtype=torch.int32)
    q = torch.randn(sum(lens), heads, 128, dtype=torch.bfloat16)
    with torch.no_grad():
        fa4_aot.attention(q, q, q, causal=True, cu_seqlens_q=cu, cu_seqlens_k=cu,
                          max_seqlen_q=max(lens), max_seqlen_k=max(lens))
    (kl,) = memo_plan().launches
    return kl


@pytest.mark.parametrize("lens,compact", [([4000] + [50] * 70, True), ([2048] * 4, False),
                                          ([1] * 20 + [1000], True), ([0, 513, 0], False),
                                          ([300], False)])
def test_compact_varlen_bit(monkeypatch, lens, compact):
    """seq_mode bit 16 when at least half of the (document x m-block) grid must be empty."""
    kl = _causal_varlen_launch(monkeypatch, lens, heads=4)
    assert bool(kl.values["seq_mode"] & 16) is compact
    if compact:  # the compact order takes a causal document's heads together
        assert kl.values["section"] == 4


def test_moving_max_inputs_and_error_bound():
    """The GPU test's and moving_max_accuracy.py's inputs (fa4_aot.testing), and the FA rule's
    numbers that check_close asserts on."""
    from fa4_aot.testing import (MOVING_MAX_KINDS, attention_ref, check_close, error_and_bound,
                                 moving_max_inputs)
    base = moving_max_inputs("randn", 8, 64, 2, device="cpu")
    assert all(x.shape == (1, 64, 2, 8) and x.dtype == torch.bfloat16 for x in base)
    for kind in MOVING_MAX_KINDS:
        q, k, v = moving_max_inputs(kind, 8, 64, 2, device="cpu")
        assert torch.equal(v, base[2])
    q, k, _ = moving_max_inputs("rising", 8, 64, 2, device="cpu")
    assert k[:, :8].float().norm() > 3 * k[:, -8:].float().norm()
    q, _, _ = moving_max_inputs("x10", 8, 64, 2, device="cpu")
    assert torch.allclose(q.float(), (10 * base[0].float()).bfloat16().float(), rtol=1e-2)
    with pytest.raises(ValueError, match="kind must be one of"):
        moving_max_inputs("up", 8, 64, 2, device="cpu")
    q, k, v = base
    ref, _ = attention_ref(q, k, v)
    ref_pt, _ = attention_ref(q, k, v, upcast=False)
    err, err_pt, bound = error_and_bound(ref_pt, ref, ref_pt)
    assert err == err_pt and err <= bound
    assert check_close(ref_pt, ref, ref_pt) == (err, bound)
    with pytest.raises(AssertionError, match="NaN in output"):
        check_close(torch.full_like(ref, float("nan")), ref, ref_pt)


def test_torch_compile_traces_the_op_with_packed_arguments(monkeypatch):
    """torch.compile(fullgraph=True) traces attention() into torch.ops.fa4_aot.fwd (optional
    tensors as a Tensor?[] list, sizes as SymInt[]) and the op's implementation runs the
    eager path: the CPU stands in for CUDA through the fake driver."""
    from fa4_aot import interface
    drv = fakecuda.install(monkeypatch)
    lib = torch.library.Library("fa4_aot", "IMPL")
    lib.impl("fwd", interface.forward, "CPU")
    q = torch.randn(2, 64, 4, 64, dtype=torch.bfloat16)
    k = torch.randn(2, 64, 2, 64, dtype=torch.bfloat16)
    qp, kp = q.reshape(128, 4, 64)[:64], k.reshape(128, 2, 64)[:64]
    cu = torch.tensor([0, 30, 64], dtype=torch.int32)

    @torch.compile(fullgraph=True, backend="aot_eager")
    def f(q, k, qp, kp, cu):
        a = fa4_aot.attention(q, k, k, causal=True, window_size=(16, 0))
        b, lse = fa4_aot.attention(qp, kp, kp, cu_seqlens_q=cu, cu_seqlens_k=cu,
                                   max_seqlen_q=34, max_seqlen_k=34, return_lse=True)
        return a, b, lse
    try:
        with torch.no_grad():
            a, b, lse = f(q, k, qp, kp, cu)
    finally:
        lib._destroy()
    assert a.shape == q.shape and b.shape == qp.shape and lse.shape == (4, 64)
    assert len(drv.launches) == 2
    windows = sorted((p.call.local, p.call.window_left, p.call.varlen)
                     for p in interface.memo_plans())
    assert windows == [(False, -1, True), (True, 16, False)]


def test_scratch_is_pooled_from_eager_calls_only(monkeypatch):
    """return_lse=False: eager calls write the unwanted LSE into the thread's scratch pool of
    their stream, shared by every prepared call (a call that is never made again holds no
    memory); the torch op (torch.compile's path) takes nothing from the pool, so a
    CUDA-graph-trees warm-up leaves nothing behind in the graph's pool."""
    from fa4_aot import interface
    fakecuda.install(monkeypatch)
    q, k, v = _dense()
    with torch.no_grad():
        out, lse = interface.forward(q, k, v, [None] * 5, [0, 0, -1, -1, 0], True, None, "auto")
        (e,) = interface.prepared_calls()
        assert lse.shape == (2, 4, 100) and e.pool is None and not fa4_aot.prepared._tls.pools
        fa4_aot.attention(q, k, v, causal=True)
        assert interface.prepared_calls() == (e,) and e.pool is not None
        (pool,) = fa4_aot.prepared._tls.pools.values()
        assert e.pool is pool and e.pooled[0].data_ptr() == pool.data_ptr()
        fa4_aot.attention(q, k, v, causal=True)
        assert e.pool is pool
        # another prepared call on the same stream shares the pool (growing it if it must)
        q2, k2, v2 = _dense(sq=300)
        fa4_aot.attention(q2, k2, v2, causal=True)
        (pool2,) = fa4_aot.prepared._tls.pools.values()
        e2 = interface.prepared_calls()[-1]
        assert e2.pool is pool2 and pool2.numel() >= 2 * 4 * 300
        fa4_aot.attention(q, k, v, causal=True)  # the first entry re-carves from the new pool
        assert e.pool is pool2
