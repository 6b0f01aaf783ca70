"""What a call of new shapes costs on the host path, on the CPU with a fake driver
(tests/fakecuda.py). Calls whose only change from a prepared one is a sequence length (a decode
step over a growing KV cache, prompts of new lengths): after FORM_POOL prepared calls of a
form, ``fa4_aot.interface`` retargets the least recently called one in place; every retargeted
launch is byte for byte the launch a call prepared from scratch makes, the size checks still
name the argument, and calls alternating between prepared lengths stay memo hits. New
descriptors are encoded by a ctypes call of the driver's function."""

import struct

import pytest

torch = pytest.importorskip("torch")
import fa4_aot  # noqa: E402
import fakecuda  # noqa: E402
from fa4_aot import interface  # noqa: E402
from fa4_aot.validate import Args  # noqa: E402

H, HK, D = 8, 2, 128


def _kv(flat, n):
    """(1, n, HK, D) K/V views of a fresh (1, HK, n, D) tensor (a dynamic cache: strides
    change with n)."""
    return flat[:HK * n * D].view(1, HK, n, D).transpose(1, 2)


def _state(e):
    """What a prepared call launches with: per launcher the parameter buffer as it stands
    (addresses of q/k/v in place), the per-call patches, grid, block and shared memory; and
    what it allocates."""
    return ([(bytes(x.buf), x.template.ptr_patches, x.template.tmap_patches,
              (x.cfg.gridDimX, x.cfg.gridDimY, x.cfg.gridDimZ),
              (x.cfg.blockDimX, x.cfg.blockDimY, x.cfg.blockDimZ), x.cfg.sharedMemBytes)
             for x in e.launchers],
            [kl.name for kl in e.plan.launches], e.out_shape, e.lse_shape, e.acc_shapes,
            e.scratch_shapes, e.keep_lse, e.out_like_q, e.vt_rows, e.q8_heads_k, e.mode)


@pytest.mark.parametrize("fp8", [False, True], ids=["bf16", "e4m3kv"])
def test_retargeted_launches_are_the_fresh_ones(monkeypatch, fp8):
    fakecuda.install(monkeypatch)
    monkeypatch.setenv("FA4_AOT_EXPERIMENTAL_FP8", "1")
    flat = torch.randn(HK * 5000 * D)
    flat = flat.to(torch.float8_e4m3fn) if fp8 else flat.bfloat16()
    extra = dict(k_descale=torch.ones(1, HK), v_descale=torch.ones(1, HK)) if fp8 else {}
    q1 = torch.randn(1, 1, H, D).bfloat16()
    # decode steps (every one a new length), then prompts of new lengths (new kernels:
    # the prefill ones, with split-KV and without), then decode again
    steps = ([(q1, n) for n in range(300, 310)]
             + [(torch.randn(1, n, H, D).bfloat16(), n) for n in (700, 1500, 129, 4000)]
             + [(q1, n) for n in (4001, 4002, 64)])
    retargets = []
    real = fa4_aot.runtime.Launcher.retarget
    monkeypatch.setattr(fa4_aot.runtime.Launcher, "retarget",
                        lambda self, *a: retargets.append(1) or real(self, *a))
    for q, n in steps:
        k = _kv(flat, n)
        fa4_aot.attention(q, k, k, causal=True, **extra)
        e = interface.prepared_calls()[-1]  # the call's entry: the newest in the memo
        fresh = interface.prepare(Args(q=q, k=k, v=k, causal=True, **extra))
        assert _state(e)[1:] == _state(fresh)[1:], (q.shape, n)
        assert [s[1:] for s in _state(e)[0]] == [s[1:] for s in _state(fresh)[0]]
        assert [x.template.image for x in e.launchers] == [
            x.template.image for x in fresh.launchers], (q.shape, n)
    assert len(retargets) >= 10


def test_alternating_lengths_stay_memo_hits(monkeypatch):
    drv = fakecuda.install(monkeypatch)
    flat = torch.randn(HK * 3000 * D).bfloat16()
    q = torch.randn(1, 1, H, D).bfloat16()
    lengths = [1000, 2000, 1001, 2001, 1002, 2002]  # e.g. local and global layers
    for n in lengths:
        fa4_aot.attention(q, _kv(flat, n), _kv(flat, n), causal=True)
    builds = []
    real = interface.build
    monkeypatch.setattr(interface, "build", lambda *a: builds.append(1) or real(*a))
    before = len(drv.launches)
    for _ in range(3):
        for n in lengths[-2:]:  # the two latest lengths, called again and again
            k = _kv(flat, n)
            fa4_aot.attention(q, k, k, causal=True)
    assert not builds and len(drv.launches) > before


def test_retargeted_calls_launch_with_their_own_scratch(monkeypatch):
    """Decode steps across a change of split count (960 keys: 15 blocks of 64, no split; 961:
    16 blocks, 2 splits): a retarget keeps the scratch views while their shapes stay, carves
    new ones when they change, and every launch writes its partials into the views it holds."""
    from fa4_aot import runtime
    drv = fakecuda.install(monkeypatch)
    flat = torch.randn(HK * 1000 * D).bfloat16()
    q = torch.randn(1, 1, H, D).bfloat16()
    slot = runtime.SLOT["oacc_ptr"]
    splits = []
    for n in range(950, 975):
        fa4_aot.attention(q, _kv(flat, n), _kv(flat, n), causal=True)
        e = interface.prepared_calls()[-1]
        assert [tuple(v.shape) for v in e.pooled] == list(e.scratch_shapes), n
        splits.append(e.plan.launches[0].values["num_splits"])
        words = [i for i, s in e.launchers[0].patches if s == slot]
        assert len(words) == (splits[-1] > 1), n
        if words:  # the partials' address the main kernel was launched with
            sent = drv.launches[-len(e.launchers)]["buffer"][words[0] * 8:words[0] * 8 + 8]
            assert struct.unpack("<Q", sent)[0] == e.pooled[1].data_ptr(), n
    assert splits[:11] == [1] * 11 and splits[11:] == [2] * 14


def test_resized_calls_are_still_checked(monkeypatch):
    fakecuda.install(monkeypatch)
    flat = torch.randn(HK * 3000 * D).bfloat16()
    q = torch.randn(1, 1, H, D).bfloat16()
    for n in range(100, 100 + interface.FORM_POOL + 1):
        fa4_aot.attention(q, _kv(flat, n), _kv(flat, n), causal=True)
    # a head stride of 105 * 128 + 4 elements: not 16-byte aligned
    bad = torch.randn(1, HK, 105 * D + 4).bfloat16()[:, :, :105 * D].view(1, HK, 105, D)
    with pytest.raises(ValueError, match=r"k.stride\(2\)"):
        fa4_aot.attention(q, bad.transpose(1, 2), _kv(flat, 105), causal=True)
    with pytest.raises(ValueError, match="k and v must have the same shape"):
        fa4_aot.attention(q, _kv(flat, 106), _kv(flat, 107), causal=True)
    with pytest.raises(ValueError, match="out must be"):
        fa4_aot.attention(q, _kv(flat, 108), _kv(flat, 108), causal=True,
                          out=torch.empty(1, 2, H, D).bfloat16())


def test_raw_encoder_passes_the_drivers_arguments(monkeypatch):
    """Where the driver gives cuTensorMapEncodeTiled's address, descriptors are encoded by a
    ctypes call: a stand-in C function (a ctypes callback) receives the record's data type,
    rank, address, dims, strides, box, element strides and modes as the binding would pass
    them, and its 16 words come back as the image; a nonzero result falls back to the binding,
    which raises naming the descriptor."""
    import ctypes

    from fa4_aot import runtime
    fakecuda.install(monkeypatch)
    seen = []

    def c_encode(out, dtype, rank, address, dims, strides, box, elem, *modes):
        address = address or 0  # a null void* arrives as None
        get = lambda ptr, t, n: [ctypes.cast(ptr, ctypes.POINTER(t))[i] for i in range(n)]  # noqa: E731
        seen.append((dtype, rank, address, get(dims, ctypes.c_uint64, rank),
                     get(strides, ctypes.c_uint64, rank - 1), get(box, ctypes.c_uint32, rank),
                     get(elem, ctypes.c_uint32, rank), modes))
        words = ctypes.cast(out, ctypes.POINTER(ctypes.c_uint64))
        for i in range(16):
            words[i] = address + i
        return 0 if address else 1
    fn = ctypes.CFUNCTYPE(ctypes.c_int, *runtime._ENCODE_ARGS)(c_encode)
    enums = {"bf16": 9, "128B": 3, "none": 0, "256B": 3, "zero": 0}
    monkeypatch.setattr(runtime, "_encoder", (fn, enums, 0))
    p = {**fakecuda.fwd_params("bf16", 128, 128, 128)[0], "swizzle": "128B", "l2_promotion": "256B",
         "oob_fill": "zero"}
    dims, strides = (128, 1000, 8, 2), (256, 2048, 2048000)
    img = runtime.encode_tensormap(p, dims, strides, 0x7F00_0000_1000)
    assert img == struct.pack("<16Q", *[0x7F00_0000_1000 + i for i in range(16)])
    assert seen == [(9, 4, 0x7F00_0000_1000, list(dims), list(strides), list(p["box"]),
                     [1] * 4, (0, 3, 3, 0))]
    # the driver's error: the binding encodes again (the fake one succeeds here)
    assert runtime.encode_tensormap(p, dims, strides, 0) != b"" and len(seen) == 2


def test_form_key_keeps_everything_but_lengths_and_strides(monkeypatch):
    """Two calls share a form (and may be retargeted between) exactly when their memo keys
    differ only in the sequence lengths and strides of q, k, v and out: every other argument
    (mask, scale, window, softcap, scheduler, dtype, batch, heads, head_dim, out's dtype, the
    optional inputs) gives another form; varlen and paged calls have none."""
    fakecuda.install(monkeypatch)
    b, h, hk, d = 2, 8, 2, 64

    def key(sq=5, sk=300, q_dtype=torch.bfloat16, batch=b, heads=h, dim=d, strided=False,
            **kw):
        q = torch.randn(batch, sq, heads, dim).to(q_dtype)
        kv = torch.randn(batch, hk, sk + 16 * strided, dim).to(q_dtype)[:, :, :sk]
        kv = kv.transpose(1, 2)
        interface.clear_memo()
        fa4_aot.attention(q, kv, kv, **kw)
        (e,) = interface.prepared_calls()
        return interface._form_key(e.key)

    base = key(causal=True)
    assert base is not None
    assert key(sq=7, sk=999, strided=True, causal=True) == base
    out = torch.empty(b, 9, h, d).bfloat16()
    assert key(sq=9, causal=True, out=out) == key(sq=9, sk=77, causal=True,
                                                  out=torch.empty(b, 9, h, d).bfloat16())
    others = [key(), key(causal=True, softmax_scale=0.5), key(causal=True, window_size=(64, 0)),
              key(causal=True, softcap=30.0), key(causal=True, scheduler="single"),
              key(causal=True, q_dtype=torch.float16), key(causal=True, batch=3),
              key(causal=True, heads=4), key(causal=True, dim=128),
              key(causal=True, out=torch.empty(b, 5, h, d).bfloat16()),
              key(causal=True, seqused_k=torch.full((b,), 100, dtype=torch.int32)),
              key(causal=True, num_splits=2)]
    assert base not in others and len(set(map(repr, others))) == len(others)
    q = torch.randn(10, h, d).bfloat16()
    kv = torch.randn(10, hk, d).bfloat16()
    cu = torch.tensor([0, 4, 10], dtype=torch.int32)
    interface.clear_memo()
    fa4_aot.attention(q, kv, kv, cu_seqlens_q=cu, cu_seqlens_k=cu, max_seqlen_q=6,
                      max_seqlen_k=6)
    (e,) = interface.prepared_calls()
    assert interface._form_key(e.key) is None
    cache = torch.randn(6, 16, hk, d).bfloat16()
    interface.clear_memo()
    fa4_aot.attention(torch.randn(b, 1, h, d).bfloat16(), cache, cache, causal=True,
                      page_table=torch.zeros(b, 3, dtype=torch.int32),
                      seqused_k=torch.full((b,), 40, dtype=torch.int32))
    (e,) = interface.prepared_calls()
    assert interface._form_key(e.key) is None
