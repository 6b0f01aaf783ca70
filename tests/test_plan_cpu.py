"""The launch planner (fa4_aot/plan.py) on its own: no torch, no driver. Kernel names, grids
and the main launch values of representative calls, written out literally (the planner
reproduced the previous derivation on ~800 generated calls when it replaced it), the
kernel-choice table: its tiles, the capabilities it checks, the refusals it writes, forced
kernels (the module-size / parameter-count rules are tests/test_tree_rules.py's)."""

from pathlib import Path

import pytest

from fa4_aot import plan as planner
from fa4_aot.plan import KERNEL_CHOICE, CallSpec, DeviceInfo, plan
from fakecuda import FakeManifest

ROOT = Path(__file__).resolve().parent.parent
H200 = DeviceInfo("sm_90a", 132)
LONG_DOC_MIX = [16384] + [512] * 32


def _contiguous(shape):
    return planner.contiguous_strides(shape)


def spec(b=2, sq=512, sk=512, h=8, hk=8, d=128, causal=False, **kw):
    """The CallSpec of a call with contiguous bf16 tensors; ``kw``: ``window``, ``softcap``,
    ``scheduler``, ``trace``, ``docs`` (varlen document lengths), ``num_splits``, ``seqused_k``,
    ``paged`` ((page_size, pages_per_seq) of a 40-page cache)."""
    window, softcap, docs, paged = (kw.get(x) for x in ("window", "softcap", "docs", "paged"))
    softcap = softcap or 0.0
    varlen = docs is not None
    if varlen:
        b, sq, sk, total = len(docs), max(docs), max(docs), sum(docs)
        qs, ks = (1, total, h, d), (1, total, hk, d)
    else:
        qs, ks = (b, sq, h, d), (b, sk, hk, d)
    table = None
    if paged:
        page, pages = paged
        ks, sk = (40, page, hk, d), page * pages
        table = ((b, pages), (pages, 1))
    local = window is not None
    return CallSpec("bf16", 2, (qs, _contiguous(qs)), (ks, _contiguous(ks)),
                    (ks, _contiguous(ks)), (qs, _contiguous(qs)), varlen, b, sq, sk, h, hk, d,
                    causal and not local, local, window[0] if local else -1,
                    window[1] if local else -1, 0.125, softcap, kw.get("scheduler", "auto"),
                    kw.get("trace", False), kw.get("num_splits"), False,
                    kw.get("seqused_k", False) or paged is not None, table)


# (what, spec arguments, launches: (kernel, grid x, num_tiles, num_splits, section, seq_mode))
CASES = [
    ('plain hd128 non-causal (176-key tile)', {'b': 2, 'sq': 4096, 'sk': 4096, 'h': 16, 'hk': 16},
     (('fwd_sm_90a_bf16_hd128_full_steal_m128n176s2', 132, 1024, 1, 4, 0),)),
    ('plain hd128 causal short rows', {'b': 2, 'sq': 512, 'sk': 512, 'causal': True},
     (('fwd_sm_90a_bf16_hd128_causal_steal_m128n128s2', 64, 64, 1, 16, 0),)),
    ('long_kv: causal rows see >= 1024 keys', {'b': 2, 'sq': 4096, 'sk': 4096, 'causal': True},
     (('fwd_sm_90a_bf16_hd128_causal_steal_m128n160s2', 132, 512, 1, 4, 0),)),
    ('long_kv also for single', {'b': 2, 'sq': 4096, 'sk': 4096, 'causal': True, 'scheduler': 'single'},
     (('fwd_sm_90a_bf16_hd128_causal_single_m128n160s2', 512, 512, 1, 4, 0),)),
    ('long_kv softcap', {'b': 2, 'sq': 4096, 'sk': 4096, 'causal': True, 'softcap': 20.0},
     (('fwd_sm_90a_bf16_hd128_causal_steal_m128n160s2_softcap', 132, 512, 1, 4, 0),)),
    ('m128: hd64 causal 1k', {'b': 4, 'sq': 1024, 'sk': 1024, 'h': 16, 'hk': 16, 'd': 64, 'causal': True},
     (('fwd_sm_90a_bf16_hd64_causal_steal_m128n128s3', 132, 512, 1, 32, 0),)),
    ('hd64 192-row tile: long non-causal', {'b': 4, 'sq': 8192, 'sk': 8192, 'h': 16, 'hk': 16, 'd': 64},
     (('fwd_sm_90a_bf16_hd64_full_steal_m192n128s4', 132, 2752, 1, 4, 0),)),
    ('hd64 static keeps the 192-row tile', {'b': 4, 'sq': 1024, 'sk': 1024, 'h': 16, 'hk': 16, 'd': 64, 'causal': True, 'scheduler': 'static'},
     (('fwd_sm_90a_bf16_hd64_causal_static_m192n128s4', 132, 384, 1, 32, 0),)),
    ('window', {'b': 2, 'sq': 1024, 'sk': 1024, 'd': 64, 'causal': True, 'window': (128, 0)},
     (('fwd_sm_90a_bf16_hd64_local_steal_m192n128s4', 96, 96, 1, 16, 0),)),
    ('softcap single', {'b': 2, 'sq': 2048, 'sk': 2048, 'hk': 2, 'd': 64, 'softcap': 30.0, 'scheduler': 'single'},
     (('fwd_sm_90a_bf16_hd64_full_single_m192n128s4_softcap', 176, 176, 1, 16, 0),)),
    ('trace', {'b': 1, 'sq': 2048, 'sk': 2048, 'h': 4, 'hk': 4, 'causal': True, 'scheduler': 'steal', 'trace': True},
     (('fwd_sm_90a_bf16_hd128_causal_steal_m128n128s2_trace', 64, 64, 1, 4, 0),)),
    ('decode: one token, GQA 4, auto splits', {'b': 2, 'sq': 1, 'sk': 32768, 'h': 32, 'hk': 8},
     (('fwd_sm_90a_bf16_hd128_full_steal_m64n64s3_decode', 128, 128, 8, 1, 0), ('combine_sm_90a_bf16_hd128', 16, None, 8, None, None))),
    ('decode: num_splits=1', {'b': 2, 'sq': 1, 'sk': 32768, 'h': 32, 'hk': 8, 'num_splits': 1},
     (('fwd_sm_90a_bf16_hd128_full_steal_m64n64s3_decode', 16, 16, 1, 1, 0),)),
    ('decode wide: 16 tokens x 8 heads', {'b': 2, 'sq': 16, 'sk': 4096, 'h': 64, 'hk': 8, 'causal': True},
     (('fwd_sm_90a_bf16_hd128_causal_steal_m128n128s3_decode', 64, 64, 4, 4, 0), ('combine_sm_90a_bf16_hd128', 512, None, 4, None, None))),
    ('GQA packing pays (17 x 8)', {'b': 2, 'sq': 17, 'sk': 1000, 'h': 64, 'hk': 8, 'causal': True},
     (('fwd_sm_90a_bf16_hd128_causal_steal_m128n128s3_decode', 32, 32, 1, 16, 0),)),
    ('GQA packing does not pay (256 x 8)', {'b': 2, 'sq': 256, 'sk': 1000, 'h': 64, 'hk': 8, 'causal': True},
     (('fwd_sm_90a_bf16_hd128_causal_steal_m128n128s2', 132, 256, 1, 128, 0),)),
    ('forced split on long queries: wide decode', {'b': 1, 'sq': 4096, 'sk': 4096, 'causal': True, 'num_splits': 4},
     (('fwd_sm_90a_bf16_hd128_causal_steal_m128n128s3_decode', 132, 1024, 4, 4, 0), ('combine_sm_90a_bf16_hd128', 8192, None, 4, None, None))),
    ('decode refused with single: prefill', {'b': 2, 'sq': 1, 'sk': 8192, 'h': 32, 'hk': 8, 'scheduler': 'single'},
     (('fwd_sm_90a_bf16_hd128_full_single_m128n176s2', 64, 64, 1, 8, 0),)),
    ('varlen uniform (dense grid)', {'docs': [512] * 8, 'causal': True},
     (('fwd_sm_90a_bf16_hd128_causal_steal_m128n128s2', 132, 256, 1, 32, 9),)),
    ('varlen compact (one long doc)', {'docs': LONG_DOC_MIX, 'causal': True},
     (('fwd_sm_90a_bf16_hd128_causal_steal_m128n160s2', 132, 33792, 1, 2, 25),)),
    ('varlen compact non-causal hd64', {'docs': LONG_DOC_MIX, 'h': 16, 'hk': 16, 'd': 64},
     (('fwd_sm_90a_bf16_hd64_full_steal_m192n128s4', 132, 45408, 1, 2, 25),)),
    ('paged decode', {'b': 3, 'sq': 1, 'h': 2, 'hk': 2, 'causal': True, 'paged': (64, 4)},
     (('fwd_sm_90a_bf16_hd128_causal_steal_m64n64s3_decode', 6, 6, 1, 6, 4),)),
    ('paged decode, auto splits', {'b': 3, 'sq': 1, 'h': 2, 'hk': 2, 'causal': True, 'paged': (16, 64)},
     (('fwd_sm_90a_bf16_hd128_causal_steal_m64n64s3_decode', 12, 12, 2, 12, 4), ('combine_sm_90a_bf16_hd128', 2, None, 2, None, None))),
    ('paged chunked prefill: wide', {'b': 3, 'sq': 200, 'h': 16, 'hk': 2, 'causal': True, 'paged': (64, 64)},
     (('fwd_sm_90a_bf16_hd128_causal_steal_m128n128s3_decode', 132, 234, 3, 3, 4), ('combine_sm_90a_bf16_hd128', 2400, None, 3, None, None))),
    ('seqused_k prefill', {'b': 4, 'sq': 512, 'sk': 512, 'd': 64, 'seqused_k': True},
     (('fwd_sm_90a_bf16_hd64_full_steal_m128n128s3', 128, 128, 1, 32, 4),)),
]


@pytest.mark.parametrize("what,kw,want", CASES, ids=[c[0] for c in CASES])
def test_plan_kernels_grids_and_values(what, kw, want):
    p = plan(spec(**kw), FakeManifest(), H200)
    got = tuple((kl.name[len("fake_"):], kl.grid[0], kl.values.get("num_tiles"),
                 kl.values.get("num_splits"), kl.values.get("section"),
                 kl.values.get("seq_mode")) for kl in p.launches)
    assert got == want
    assert all(kl.grid[1:] == (1, 1) for kl in p.launches)
    assert p.mode == planner.LAUNCH and p.call == spec(**kw)


def test_empty_calls_launch_nothing():
    assert plan(spec(sq=0), FakeManifest(), H200).mode == planner.NOTHING
    assert plan(spec(sk=0), FakeManifest(), H200).mode == planner.ZERO_FILL


def test_choice_table_rows():
    forms = [r.form for r in KERNEL_CHOICE]
    assert forms[-1] == "plain" and set(forms) == {"fp8_prefill", "fp8_decode", "decode_wide",
                                                   "decode", "m128", "long_kv", "plain"}
    assert all(r.why and r.rules and all(rule.__doc__ for rule in r.rules)
               for r in KERNEL_CHOICE)
    assert [r.form for r in KERNEL_CHOICE if r.optional] == [
        "fp8_prefill", "decode_wide", "decode", "m128", "long_kv"]


def _family(cfg) -> str:
    if cfg.fp8:
        return "fp8_decode" if cfg.decode else "fp8_prefill"
    if cfg.decode:
        return "decode_wide" if cfg.wide else "decode"
    return "m128" if cfg.m128 else "long_kv" if cfg.long_kv else "plain"


def test_the_table_says_every_kernels_tile():
    """The tile column of KERNEL_CHOICE is the tile each shipped configuration is built with
    (configs.KernelConfig.tile): the first row of the kernel's family whose table has its head
    dim (and, for the plain rows, whose mask rule holds: hd128 non-causal takes 176 keys)."""
    from fa4_aot.configs import CONFIG_SPACE
    for cfg in CONFIG_SPACE:
        if cfg.kind != "fwd":
            continue
        call = planner.prefill_call(cfg.dtype, cfg.head_dim, cfg.causal, "auto", local=cfg.local)
        rows = [r for r in KERNEL_CHOICE if r.form == _family(cfg)
                and planner.row_tile(r, cfg.arch, cfg.head_dim) is not None
                and (r.form != "plain" or all(rule(call, None, None) for rule in r.rules))]
        assert rows, cfg.name
        assert planner.row_tile(rows[0], cfg.arch, cfg.head_dim) == cfg.tile, cfg.name


def test_every_capability_the_manifest_records_is_checked():
    """Each of abi.CAPABILITIES is asked of the chosen kernel: the call's needs, and packed GQA
    for the decode rows."""
    from fa4_aot.abi import CAPABILITIES
    calls = [spec(docs=[100, 200]), spec(window=(16, 0)), spec(seqused_k=True),
             spec(paged=(16, 4), sq=1), spec(num_splits=2), spec(softcap=5.0),
             spec(trace=True, causal=True), spec()._replace(fp8="kv"),
             spec()._replace(fp8="qkv")]
    needed = set().union(*(planner.needed_capabilities(c) for c in calls))
    assert needed | {"pack_gqa"} == set(CAPABILITIES)
    man = FakeManifest()
    real = man.find

    def find(*a, **kw):  # a decode kernel that says it does not pack GQA
        name, rec = real(*a, **kw)
        caps = [c for c in rec["launch"]["capabilities"] if c != "pack_gqa"]
        return name, dict(rec, launch=dict(rec["launch"], capabilities=caps))
    man.find = find
    with pytest.raises(ValueError, match="page_table"):
        plan(spec(paged=(16, 4), sq=1), man, H200)


@pytest.mark.parametrize("kw,match", [
    (dict(paged=(16, 4), sq=1, scheduler="single"),
     r"seqused_q/k, page_table \(paged KV\) kernels exist for scheduler 'auto', 'steal'; "
     r"got scheduler='single'"),
    (dict(num_splits=2, trace=True, causal=True),
     "num_splits > 1 \\(split-KV\\), _trace: no kernel of this build supports them together"),
    (dict(softcap=3.0, scheduler="static"),
     "softcap kernels exist for scheduler 'auto', 'single', 'steal'; got scheduler='static'"),
    (dict(trace=True, d=64, causal=True), "_trace kernels exist for head_dim 128 on sm_90a; got 64"),
    (dict(trace=True), "_trace kernels exist for mask causal on sm_90a; got full"),
])
def test_refusals_say_what_exists(kw, match):
    with pytest.raises(ValueError, match=match):
        plan(spec(**kw), FakeManifest(), H200)


def test_refusals_off_sm90():
    sm100 = DeviceInfo("sm_100a", 148)
    with pytest.raises(ValueError, match=r"page_table \(paged KV\).* kernels exist on sm_90a "
                                         "only; this device is sm_100a"):
        plan(spec(paged=(16, 4), sq=1), FakeManifest(), sm100)
    with pytest.raises(ValueError, match="window_size kernels exist on sm_90a only"):
        plan(spec(window=(16, 0)), FakeManifest(), sm100)
    # short queries: no decode kernels there, the plain kernels take them
    (kl,) = plan(spec(sq=1, h=32, hk=8), FakeManifest(), sm100).launches
    assert kl.name == "fake_fwd_sm_100a_bf16_hd128_full_clc_m128n128s2"


@pytest.mark.parametrize("kernel,kw,name", [
    ("long_kv", dict(b=2, sq=256, sk=256, causal=True),
     "fwd_sm_90a_bf16_hd128_causal_steal_m128n160s2"),
    ("plain", dict(b=2, sq=1, sk=8192, h=32, hk=8), "fwd_sm_90a_bf16_hd128_full_steal_m128n176s2"),
    ("m128", dict(b=2, sq=8192, sk=8192, d=64), "fwd_sm_90a_bf16_hd64_full_steal_m128n128s3"),
    ("fake_fwd_sm_90a_bf16_hd128_causal_static_m128n128s2", dict(causal=True),
     "fwd_sm_90a_bf16_hd128_causal_static_m128n128s2"),
])
def test_a_kernel_can_be_forced(kernel, kw, name):
    man = FakeManifest()
    man.kernels  # every record, so a name can be forced
    (kl,) = plan(spec(**kw), man, H200, kernel).launches
    assert kl.name == "fake_" + name
    with pytest.raises(ValueError, match="page_table"):  # still only where it can serve
        plan(spec(paged=(16, 4), sq=1), man, H200, "plain")


class _Without(FakeManifest):
    """A manifest built without one kernel form."""

    def __init__(self, flag):
        super().__init__()
        self.flag = flag

    def find(self, *a, **kw):
        if kw.get(self.flag):
            raise ValueError(f"no fa4_aot kernel ({self.flag})")
        return super().find(*a, **kw)


@pytest.mark.parametrize("flag,kw,name", [
    ("m128", dict(b=4, sq=1024, sk=1024, h=16, hk=16, d=64, causal=True),
     "fwd_sm_90a_bf16_hd64_causal_steal_m192n128s4"),
    ("long_kv", dict(b=2, sq=4096, sk=4096, causal=True),
     "fwd_sm_90a_bf16_hd128_causal_steal_m128n128s2")])
def test_optional_forms_fall_back_to_the_plain_kernel(flag, kw, name):
    (kl,) = plan(spec(**kw), _Without(flag), H200).launches
    assert kl.name == "fake_" + name


def test_capabilities_come_from_the_record():
    man = FakeManifest()
    real = man.find

    def find(*a, **kw):
        name, rec = real(*a, **kw)
        launch = dict(rec["launch"], capabilities=[])
        return name, dict(rec, launch=launch)
    man.find = find
    plan(spec(), man, H200)  # needs nothing
    with pytest.raises(ValueError, match=r"cu_seqlens_q/k \(varlen\)"):
        plan(spec(docs=[100, 200]), man, H200)


def test_work_stealing_counter_is_left_to_the_runtime():
    (kl,) = plan(spec(), FakeManifest(), H200).launches
    assert kl.values["sched_ptr"] is planner.SCHED_COUNTER
    (kl,) = plan(spec(scheduler="single"), FakeManifest(), H200).launches
    assert kl.values["sched_ptr"] == 0
