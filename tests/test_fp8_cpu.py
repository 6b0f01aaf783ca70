"""FP8 (e4m3) calls on the CPU: the configurations and launch ABI of the FP8 decode kernels,
the planner's choice and launch values (descale addresses and strides) through the whole host
path with a fake driver (tests/fakecuda.py), and the validation errors."""

import struct

import pytest

from fa4_aot import abi
from fa4_aot.configs import CONFIG_SPACE, FP8_DECODE_TILES, FP8_PREFILL_TILES, KernelConfig

torch = pytest.importorskip("torch")
import fa4_aot  # noqa: E402
import fakecuda  # noqa: E402
from conftest import memo_plan  # noqa: E402

E4M3 = torch.float8_e4m3fn


@pytest.fixture(autouse=True)
def _fp8_enabled(monkeypatch):
    from fa4_aot.validate import FP8_ENV
    monkeypatch.setenv(FP8_ENV, "1")


def test_fp8_configurations():
    fp8 = [c for c in CONFIG_SPACE if c.fp8 and c.decode]
    assert len(fp8) == 2 * len(FP8_DECODE_TILES) * 3  # kv / qkv x head dims x masks
    prefill = [c for c in CONFIG_SPACE if c.fp8 and not c.decode]
    assert len(prefill) == 2 * len(FP8_PREFILL_TILES)  # full, causal
    for c in prefill:
        assert c.fp8 == "qkv" and c.name.endswith("_e4m3qkv") and not c.local
        assert abi.spec_for(c) is abi.FWD_SM90_FP8
    for c in fp8:
        assert c.decode and not c.wide and c.dtype == "bf16" and c.scheduler == "steal"
        assert c.kv_storage == "e4m3" and c.q_storage == ("e4m3" if c.fp8 == "qkv" else "bf16")
        assert c.name.endswith(f"_decode_e4m3{c.fp8}") and abi.spec_for(c) is abi.FWD_SM90_FP8
    assert all(c.q_storage == c.kv_storage == c.dtype for c in CONFIG_SPACE if not c.fp8)
    for bad in (dict(decode=False, fp8="kv"), dict(decode=False, head_dim=64),
                dict(decode=False, causal=False, local=True), dict(wide=True), dict(head_dim=96),
                dict(dtype="fp16"), dict(fp8="e5m2")):
        kw = dict(arch="sm_90a", dtype="bf16", head_dim=128, causal=True, scheduler="steal",
                  decode=True, fp8="kv")
        with pytest.raises(ValueError, match="fp8"):
            KernelConfig(**{**kw, **bad})


@pytest.mark.parametrize("hd,box,swizzle", [(64, 64, "64B"), (128, 128, "128B"),
                                            (256, 128, "128B")])
def test_fp8_launch_record(hd, box, swizzle):
    cfg = KernelConfig("sm_90a", "bf16", hd, True, "steal", decode=True, fp8="qkv")
    rec = abi.launch_record(cfg, 1000)
    tmaps = {p["tensor"]: p for p in rec["params"] if p["kind"] == "tensormap"}
    for t in "qkv":  # one swizzle row of bytes per box row
        assert (tmaps[t]["dtype"], tmaps[t]["box"][0], tmaps[t]["swizzle"]) == ("e4m3", box,
                                                                                swizzle)
    names = [p["name"] for p in rec["params"]]
    # FWD_SM90's parameters in place, then the Quant group
    assert names[:-9] == [p["name"] for p in abi.launch_record(
        KernelConfig("sm_90a", "bf16", hd, True, "steal", decode=True), 1000)["params"]]
    assert names[-9:] == list(abi.FWD_SM90_FP8.arg_names("Quant"))
    assert "fp8_qkv" in rec["capabilities"]


def _fp8_call(monkeypatch, q_dtype, paged=False, **kw):
    drv = fakecuda.install(monkeypatch)
    b, h, hk, d = 3, 8, 2, 128
    q = torch.randn(b, 1, h, d).to(q_dtype)
    if paged:
        k = torch.randn(10, 16, hk, d).to(E4M3)
        kw.update(page_table=torch.zeros(b, 4, dtype=torch.int32),
                  seqused_k=torch.full((b,), 50, dtype=torch.int32))
    else:
        k = torch.randn(b, 300, hk, d).to(E4M3)
    v = k.clone()
    kd = torch.tensor(0.5).expand(b, hk)            # a per-layer scalar, expanded: strides 0
    vd = torch.rand(b, hk)
    qd = torch.rand(hk, b).t() if q_dtype == E4M3 else None  # transposed strides
    with torch.no_grad():
        out = fa4_aot.attention(q, k, v, causal=True, q_descale=qd, k_descale=kd,
                                v_descale=vd, **kw)
    return drv, out, (qd, kd, vd)


@pytest.mark.parametrize("q_dtype", [torch.bfloat16, E4M3], ids=["bf16_q", "e4m3_q"])
@pytest.mark.parametrize("paged", [False, True], ids=["dense", "paged"])
def test_fp8_call_takes_the_fp8_kernel(monkeypatch, q_dtype, paged):
    drv, out, (qd, kd, vd) = _fp8_call(monkeypatch, q_dtype, paged, num_splits=2)
    assert out.dtype == torch.bfloat16 and out.shape == (3, 1, 8, 128)
    main, comb = memo_plan().launches
    mode = "qkv" if q_dtype == E4M3 else "kv"
    assert main.record["config"]["fp8"] == mode and main.name.endswith("e4m3" + mode)
    assert comb.name.startswith("fake_combine_sm_90a_bf16")
    v = main.values
    assert (v["k_descale_stride_b"], v["k_descale_stride_h"]) == (0, 0)
    assert (v["v_descale_stride_b"], v["v_descale_stride_h"]) == (2, 1)
    assert (v["q_descale_stride_b"], v["q_descale_stride_h"]) == ((1, 3) if qd is not None
                                                                 else (0, 0))
    # the descale addresses land in the parameter buffer of the FP8 launch
    launch = drv.launches[0]
    names = [p["name"] for p in main.record["launch"]["params"]]
    for name, t in (("q_descale", qd), ("k_descale", kd), ("v_descale", vd)):
        off = launch["offsets"][names.index(name)]
        got = struct.unpack_from("<Q", launch["buffer"], off)[0]
        assert got == (0 if t is None else t.data_ptr()), name
    # the K/V descriptors were encoded as bytes (e4m3)
    assert v["k_rows"] == (16 if paged else 300)


def test_fp8_calls_memoize_and_keep_16bit_calls_apart(monkeypatch):
    from fa4_aot import interface
    _fp8_call(monkeypatch, torch.bfloat16)
    b, h, hk, d = 3, 8, 2, 128
    q = torch.randn(b, 1, h, d, dtype=torch.bfloat16)
    k = torch.randn(b, 300, hk, d, dtype=torch.bfloat16)
    with torch.no_grad():
        fa4_aot.attention(q, k, k, causal=True, num_splits=2)
    names = [e.plan.launches[0].name for e in interface.prepared_calls()]
    assert names[0].endswith("e4m3kv") and not names[1].endswith("e4m3kv")


def _args(**over):
    b, h, hk, d = 2, 8, 2, 128
    a = dict(q=torch.randn(b, 1, h, d, dtype=torch.bfloat16),
             k=torch.randn(b, 64, hk, d).to(E4M3), v=torch.randn(b, 64, hk, d).to(E4M3),
             k_descale=torch.ones(b, hk), v_descale=torch.ones(b, hk))
    a.update(over)
    return a


@pytest.mark.parametrize("over,exc,match", [
    (dict(k=torch.randn(2, 64, 2, 128).to(torch.float8_e5m2)), TypeError, "k must be"),
    (dict(q=torch.randn(2, 1, 8, 128).to(E4M3), k=torch.randn(2, 64, 2, 128).bfloat16(),
          v=torch.randn(2, 64, 2, 128).bfloat16()), TypeError,
     "FP8 calls take float8_e4m3fn k and v"),
    (dict(q=torch.randn(2, 1, 8, 128, dtype=torch.float16)), TypeError, "bfloat16 or"),
    (dict(k_descale=None), ValueError, "k_descale is required"),
    (dict(v_descale=None), ValueError, "v_descale is required"),
    (dict(q=torch.randn(2, 1, 8, 128).to(E4M3)), ValueError, "q_descale is required"),
    (dict(q_descale=torch.ones(2, 2)), ValueError, "q_descale applies to a float8_e4m3fn q"),
    (dict(k_descale=torch.ones(2, 2, dtype=torch.float16)), TypeError, "k_descale must be a "
                                                                      "float32"),
    (dict(k_descale=torch.ones(2)), ValueError, r"k_descale must have shape \(batch, heads_k\)"),
    (dict(v_descale=torch.ones(2, 8)), ValueError, r"= \(2, 2\)"),
    (dict(v_descale=torch.ones(2, 2, device="meta")), ValueError, "v_descale must be on"),
    (dict(q=torch.randn(2, 1, 8, 96, dtype=torch.bfloat16), k=torch.randn(2, 64, 2, 96).to(E4M3),
          v=torch.randn(2, 64, 2, 96).to(E4M3)), ValueError,
     r"FP8 \(float8_e4m3fn k/v\) kernels exist for head_dim 64, 128, 256 on sm_90a; got 96"),
    (dict(scheduler="single"), ValueError, "FP8 .* kernels exist for scheduler 'auto', 'steal'; "
                                           "got scheduler='single'"),
    (dict(out=torch.empty(2, 1, 8, 128).to(E4M3)), ValueError, "out must be a tensor .* dtype torch.bfloat16"),
])
def test_fp8_argument_errors(monkeypatch, over, exc, match):
    fakecuda.install(monkeypatch)
    a = _args(**over)
    with pytest.raises(exc, match=match), torch.no_grad():
        fa4_aot.attention(a.pop("q"), a.pop("k"), a.pop("v"), **a)


def test_fp8_needs_the_experimental_switch(monkeypatch):
    from fa4_aot.validate import FP8_ENV
    monkeypatch.delenv(FP8_ENV)
    fakecuda.install(monkeypatch)
    a = _args()
    with pytest.raises(NotImplementedError, match=FP8_ENV):
        fa4_aot.attention(a.pop("q"), a.pop("k"), a.pop("v"), **a)


def test_descales_refused_on_16bit_calls(monkeypatch):
    fakecuda.install(monkeypatch)
    q = torch.randn(2, 1, 8, 128, dtype=torch.bfloat16)
    k = torch.randn(2, 64, 2, 128, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="k_descale applies to a float8_e4m3fn k"):
        fa4_aot.attention(q, k, k, k_descale=torch.ones(2, 2))


def test_fp8_chunked_prefill_over_a_paged_cache(monkeypatch):
    """Packed new tokens (cu_seqlens_q) against an e4m3 paged cache: the 64-row FP8 kernel (there
    is no 128-row one), every packed row in its tiles."""
    fakecuda.install(monkeypatch)
    q = torch.randn(300, 8, 128, dtype=torch.bfloat16)
    cache = torch.randn(40, 16, 2, 128).to(E4M3)
    cu = torch.tensor([0, 100, 300], dtype=torch.int32)
    with torch.no_grad():
        out = fa4_aot.attention(q, cache, cache, causal=True, cu_seqlens_q=cu, max_seqlen_q=200,
                                page_table=torch.zeros(2, 20, dtype=torch.int32),
                                seqused_k=torch.tensor([150, 320], dtype=torch.int32),
                                k_descale=torch.ones(2, 2), v_descale=torch.ones(2, 2))
    assert out.dtype == torch.bfloat16 and out.shape == q.shape
    main = memo_plan().launches[0]
    assert main.name.endswith("_decode_e4m3kv") and main.record["launch"]["tile"]["m"] == 64
    assert main.values["num_m_blocks"] == -(-200 * 4 // 64)


def test_fp8_op_form(monkeypatch):
    """torch.ops.fa4_aot.fwd's implementation takes the descales as tensors 5..7 and hits the
    entry attention() made."""
    from fa4_aot import interface
    fakecuda.install(monkeypatch)
    a = _args()
    q, k, v = a.pop("q"), a.pop("k"), a.pop("v")
    with torch.no_grad():
        fa4_aot.attention(q, k, v, **a)
        n = len(interface.memo_plans())
        out, lse = interface.forward(q, k, v, [None] * 5 + [None, a["k_descale"], a["v_descale"]],
                                     [0, 0, -1, -1, 0], False, None, "auto", 0.0)
    assert len(interface.memo_plans()) == n and out.dtype == torch.bfloat16


# --------------------------------------------------------------------------------------------
# FP8 prefill: FP8 wgmmas, V transposed by the runtime


def test_transposed_v_orders_each_group_of_keys():
    from fa4_aot.abi import VT_GROUP, VT_ORDER
    from fa4_aot.interface import transposed_v
    assert sorted(VT_ORDER) == list(range(VT_GROUP))
    b, sk, hk, d = 2, 70, 3, 16
    v = torch.randn(b, sk, hk, d).to(E4M3)
    rows = 96
    vt = transposed_v(v, rows)
    assert vt.dtype == torch.uint8 and vt.shape == (b, hk, d, rows) and vt.is_contiguous()
    u = v.view(torch.uint8)
    for s in range(rows):
        key = (s // VT_GROUP) * VT_GROUP + VT_ORDER[s % VT_GROUP]
        want = u[:, key] if key < sk else torch.zeros(b, hk, d, dtype=torch.uint8)
        assert torch.equal(vt[:, :, :, s], want), s
    # a strided v (a view of a larger cache) gives the same bytes
    big = torch.randn(b, sk, 2 * hk, d).to(E4M3)
    assert torch.equal(transposed_v(big[:, :, :hk], rows),
                       transposed_v(big[:, :, :hk].contiguous(), rows))


def test_fp8_prefill_call(monkeypatch):
    drv = fakecuda.install(monkeypatch)
    b, s, h, hk, d = 2, 1000, 8, 8, 128
    q = torch.randn(b, s, h, d).to(E4M3)
    k = torch.randn(b, s, hk, d).to(E4M3)
    ds = [torch.rand(b, hk) for _ in range(3)]
    with torch.no_grad():
        out = fa4_aot.attention(q, k, k, causal=True, q_descale=ds[0], k_descale=ds[1],
                                v_descale=ds[2])
    assert out.dtype == torch.bfloat16 and out.shape == q.shape
    plan = memo_plan()
    (main,) = plan.launches
    assert main.name.endswith("m128n128s2_e4m3qkv") and not main.record["config"]["decode"]
    assert main.values["vt_rows"] == 1024 and main.values["seqlen_k"] == s
    assert plan.v_transposed == ((b, 1024, hk, d), (hk * d * 1024, 1, d * 1024, 1024))
    tma_v = next(p for p in main.record["launch"]["params"] if p["name"] == "tma_v")
    assert tma_v["dims"] == ["s", "d", "h", "b"] and tma_v["box"][:2] == [128, d]
    # the descriptor the runtime encoded for V: keys innermost, vt_rows of them
    assert [128, d, 1, 1] in drv.boxes


@pytest.mark.parametrize("kw,form", [
    (dict(), "prefill"),
    (dict(q_len=4), "decode"),                   # short queries: the decode kernels
    (dict(q_bf16=True), "prefill"),              # a bf16 q: quantized per call
    (dict(q_bf16=True, q_len=4), "decode"),
    (dict(window_size=(100, 0)), "decode"),      # no FP8 prefill window kernel
    (dict(num_splits=2), "decode"),
])
def test_fp8_routing(monkeypatch, kw, form):
    fakecuda.install(monkeypatch)
    b, hk, d = 2, 4, 128
    s = kw.pop("q_len", 512)
    q = torch.randn(b, s, 4, d).to(torch.bfloat16 if kw.pop("q_bf16", False) else E4M3)
    k = torch.randn(b, 512, hk, d).to(E4M3)
    qd = torch.ones(b, hk) if q.dtype == E4M3 else None
    with torch.no_grad():
        fa4_aot.attention(q, k, k, causal=True, q_descale=qd, k_descale=torch.ones(b, hk),
                          v_descale=torch.ones(b, hk), **kw)
    name = memo_plan().launches[0].name
    assert ("_decode_" in name) == (form == "decode") and "e4m3" in name


def test_fp8_prefill_of_a_bf16_q_quantizes_it(monkeypatch):
    """A bf16 q against an e4m3 KV cache (the serving prefill) runs the FP8 prefill kernel on q
    quantized per call: the launch reads a contiguous e4m3 copy through its q descriptor (one
    byte per element) and the copy's (batch, heads_k) descale."""
    drv = fakecuda.install(monkeypatch)
    b, s, h, hk, d = 2, 600, 8, 2, 128
    q = torch.randn(b, h, s, d).bfloat16().transpose(1, 2)  # a head-major view, as HF gives
    k = torch.randn(b, s, hk, d).to(E4M3)
    ones = torch.ones(b, hk)
    seen = []
    real = fa4_aot.interface.quantized_q

    def spy(x, heads_k):
        seen.append(real(x, heads_k))
        return seen[-1]
    monkeypatch.setattr(fa4_aot.interface, "quantized_q", spy)
    with torch.no_grad():
        out = fa4_aot.attention(q, k, k, causal=True, k_descale=ones, v_descale=ones)
    assert out.dtype == torch.bfloat16 and out.shape == q.shape
    plan = memo_plan()
    (main,) = plan.launches
    assert main.name.endswith("_e4m3qkv") and not main.record["config"]["decode"]
    assert plan.q_quantized == ((b, s, h, d), (s * h * d, h * d, d, 1))
    v = main.values
    assert (v["q_stride_b"], v["q_stride_s"], v["q_stride_h"]) == (s * h * d, h * d, d)
    assert (v["q_descale_stride_b"], v["q_descale_stride_h"]) == (hk, 1)
    (q8, qd), = seen
    launch = drv.launches[0]
    names = [p["name"] for p in main.record["launch"]["params"]]
    got = struct.unpack_from("<Q", launch["buffer"], launch["offsets"][names.index("q_descale")])
    assert got[0] == qd.data_ptr() and q8.dtype == E4M3 and q8.is_contiguous()
    tma_q = launch["offsets"][names.index("tma_q")]
    assert struct.unpack_from("<Q", launch["buffer"], tma_q + 24)[0] == q8.data_ptr()


def test_quantized_q():
    from fa4_aot.buffers import quantized_q
    g = torch.Generator().manual_seed(0)
    q = torch.randn(2, 37, 8, 64, generator=g).bfloat16() * 3
    q[1, :, 4:] = 0  # batch 1's second KV head group: all zeros
    q[0, :, :4] *= 1e-5  # a tiny group (subnormal in e4m3 without a scale)
    q8, ds = quantized_q(q.transpose(1, 2).contiguous().transpose(1, 2), 2)
    assert q8.shape == q.shape and q8.is_contiguous() and ds.shape == (2, 2)
    assert ds[1, 1] == 0 and not q8[1, :, 4:].float().any()
    nz = ds[ds > 0]
    assert torch.equal(torch.exp2(torch.log2(nz).round()), nz)  # powers of two
    peak = q8.float().unflatten(2, (2, 4)).abs().amax(dim=(1, 3, 4))
    assert ((peak[ds > 0] >= 224) & (peak[ds > 0] <= 448)).all()
    deq = (q8.float().unflatten(2, (2, 4)) * ds[:, None, :, None, None]).flatten(2, 3)
    # one e4m3 rounding of each element: relative error <= 2^-4 of the element
    assert ((deq - q.float()).abs() <= q.float().abs() / 16 + 1e-30).all()
    bad = q.clone()
    bad[0, 3, 1, 5] = float("nan")
    assert torch.isnan(quantized_q(bad, 2)[1][0, 0])
