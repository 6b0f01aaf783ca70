"""The launch planner: (validated call, manifest, device) -> kernels, grids and launch values.

Pure: no torch, no CUDA. :func:`plan` is the only place that chooses a kernel and computes
launch values; ``fa4_aot.interface`` runs it once per memo miss. The choice is one table,
:data:`KERNEL_CHOICE`, read top to bottom (docs/design.md#kernel-choice); every rule below it
is one function with its reason.
"""

from __future__ import annotations

import math
from functools import lru_cache
from typing import NamedTuple

from .abi import VT_GROUP, SeqMode
from .configs import (FP8_PREFILL_TILES, SCHEDULERS_BY_ARCH, SOFTCAP_SCHEDULERS, TILES_LONG_KV,
                      TILES_M128, KernelConfig)
from .runtime import PerCall
from .schedule import choose_section, compact_section, num_n_blocks

SCHEDULERS = ("auto", "single", "static", "steal", "clc")
ARCHS = ("sm_90a", "sm_100a")

# ------------------------------------------------------------------------------ the inputs


class DeviceInfo(NamedTuple):
    arch: str  # "sm_90a" / "sm_100a"
    num_sms: int


class CallSpec(NamedTuple):
    """A validated call, less the tensors' addresses: everything :func:`plan` may use.
    Tensors appear as (shape, element strides) of the 4-D (batch, seqlen, heads, d) views the
    kernels see (varlen: batch 1, the packed total as seqlen)."""

    dtype: str  # "bf16" / "fp16": the MMAs' and the output's
    elem_bytes: int  # of k and v
    q: tuple  # (shape, stride)
    k: tuple  # paged: the cache (num_pages, page_size, heads_k, d)
    v: tuple
    out: tuple
    varlen: bool
    batch: int  # batch, or documents for varlen
    seqlen_q: int  # seqlen_q, or max_seqlen_q for varlen
    seqlen_k: int  # paged: pages_per_seq * page_size
    heads: int
    heads_k: int
    head_dim: int
    causal: bool  # plain causal mask (a causal window is local with window_right = 0)
    local: bool
    window_left: int  # -1 = unbounded
    window_right: int
    softmax_scale: float  # resolved (1/sqrt(d) when None was given)
    softcap: float
    scheduler: str  # as given ("auto" resolved per arch by resolve_scheduler)
    trace: bool
    num_splits: int | None = None  # split-KV: None = automatic
    seqused_q: bool = False
    seqused_k: bool = False
    page_table: tuple | None = None  # (shape, stride) of the page table: paged KV
    fp8: str = ""  # e4m3 inputs (configs.FP8_MODES): "kv", "qkv"
    descales: tuple = ()  # FP8: the (batch, heads_k) strides of q/k/v_descale (None: absent)

    @property
    def paged(self) -> bool:
        return self.page_table is not None


class KernelLaunch(NamedTuple):
    name: str  # manifest kernel name
    record: dict  # manifest record
    grid: tuple
    values: dict  # launch value name -> constant, PerCall(slot), or SCHED_COUNTER


class LaunchPlan(NamedTuple):
    out_shape: tuple  # (allocated when the caller passes no out)
    lse_shape: tuple
    mode: int  # LAUNCH, NOTHING (no tile) or ZERO_FILL (no key)
    launches: tuple  # KernelLaunch, run in order on the call's stream
    acc_shapes: tuple = ()  # split-KV: fp32 (oacc, lseacc) shapes, the "oacc"/"lseacc" slots
    call: CallSpec | None = None
    # FP8 prefill: the kernels read V transposed (fa4_aot.interface.transposed_v, keys rounded up
    # to VT_GROUP); (shape, element strides) of that tensor as the (b, s, h, d) view they see.
    v_transposed: tuple | None = None


LAUNCH, NOTHING, ZERO_FILL = 0, 1, 2
# sched_ptr of a work-stealing launch: the runtime's zeroed int32[2] counter of the call's
# (device, stream), filled in by fa4_aot.interface when it builds the launch.
SCHED_COUNTER = PerCall("sched_counter")

# ------------------------------------------------------------------------------ rules
# Decode kernels: packed GQA rows in 64-row tiles (128 for "wide"), split-KV, paged KV.
DECODE_TILE_M = 64
MAX_PACKED_ROWS = 128  # packed rows the decode path always takes (two 64-row tiles)
PREFILL_TILE_M = 128
MAX_SPLITS = 128
MIN_BLOCKS_PER_SPLIT = 8  # a split costs a tile start-up and a combine read
LONG_KV_KEYS = 1024  # rows seeing this many keys on average pay back the wide-n tile
TALL_TILE_GAIN = 1.25  # a taller m tile's gain per unit of work (sm_90a hd64, 192 vs 128 rows)


def resolve_scheduler(scheduler: str, arch: str = "sm_90a") -> str:
    """``auto``: work stealing on sm_90a (persistent CTAs overlap a tile's store with the next
    load; docs/design.md#schedulers), CLC on sm_100a; ``steal`` on sm_100a means CLC."""
    if scheduler not in SCHEDULERS:
        raise ValueError(f"scheduler must be one of {SCHEDULERS}, got {scheduler!r}")
    if scheduler == "auto":
        scheduler = "steal" if arch == "sm_90a" else "clc"
    elif scheduler == "steal" and arch == "sm_100a":
        scheduler = "clc"
    if scheduler not in SCHEDULERS_BY_ARCH[arch]:
        raise ValueError(f"scheduler {scheduler!r} is not available on {arch}; available: "
                         f"{('auto',) + SCHEDULERS_BY_ARCH[arch]}")
    return scheduler


def packing_pays(seqlen_q: int, group: int) -> bool:
    """Packing a KV head's ``group`` query heads into shared 128-row tiles at least halves the
    tiles (each reads the KV head's K and V once)."""
    packed = -(-seqlen_q * group // PREFILL_TILE_M)
    plain = group * -(-seqlen_q // PREFILL_TILE_M)
    return group > 1 and 2 * packed <= plain


def use_decode_kernels(seqlen_q: int, group: int, num_splits: int | None,
                       scheduler: str, trace: bool = False) -> bool:
    """Short queries (seqlen_q * group <= MAX_PACKED_ROWS), GQA calls packing serves better, or
    num_splits > 1; work stealing only (the decode kernels exist for ``steal``)."""
    if trace or scheduler not in ("auto", "steal"):
        return False
    if num_splits is not None and num_splits > 1:
        return True
    return seqlen_q * group <= MAX_PACKED_ROWS or packing_pays(seqlen_q, group)


def use_wide_tile(seqlen_q: int, group: int) -> bool:
    """More packed rows than one 64-row decode tile: the 128-row decode kernels read a KV
    head's K/V once per 128 rows."""
    return seqlen_q * group > DECODE_TILE_M


def choose_num_splits(tiles: int, n_blocks: int, num_sms: int) -> int:
    """Split count for ``tiles`` work items of ``n_blocks`` key blocks: none while the tiles
    give 80 % of a wave; else the fewest splits whose items fill the waves within 5 % of the
    best, at least MIN_BLOCKS_PER_SPLIT blocks each, at most MAX_SPLITS."""
    if tiles <= 0 or n_blocks <= 1 or tiles * 5 >= num_sms * 4:
        return 1
    top = max(1, min(n_blocks // MIN_BLOCKS_PER_SPLIT, MAX_SPLITS))

    def fill(s):
        items = tiles * s
        return items / (-(-items // num_sms) * num_sms)

    best = max(fill(s) for s in range(1, top + 1))
    return next(s for s in range(1, top + 1) if fill(s) >= 0.95 * best)


def prefer_long_kv(seqlen_q: float, seqlen_k: float) -> bool:
    """A causal call's rows see ``seqlen_k - seqlen_q / 2`` keys on average; from LONG_KV_KEYS
    on, wider key blocks cost less in the steady state than they add on the diagonal."""
    return seqlen_k - seqlen_q / 2 >= LONG_KV_KEYS


def varlen_length(total: int, docs: int, max_len: int) -> float:
    """The document length of an average token of a packed batch (sum(L^2) / sum(L)), from the
    longest document and the others of equal length: exact for such mixes, a lower bound
    otherwise, never below the mean (no device read)."""
    if docs <= 1 or total <= 0:
        return float(max(total, 0))
    longest = min(max_len, total)
    rest = total - longest
    return max(total / docs, (longest * longest + rest * rest / (docs - 1)) / total)


def tile_cost(tile_m: int, tile_n: int, seqlen_q: int, seqlen_k: int, causal: bool,
              pairs: int, sms: int) -> float:
    """Work of one launch in (row x key block) units: rows (padding included) times the key
    blocks each visits, over ``sms`` persistent CTAs, never less than the largest tile."""
    per_pair, largest = 0, 0
    for m in range(-(-seqlen_q // tile_m)):
        w = tile_m * num_n_blocks(m, tile_m, tile_n, seqlen_q, seqlen_k, causal)
        per_pair += w
        largest = max(largest, w)
    return max(per_pair * pairs / sms, largest)


def prefer_m128(tall_m: int, tile_n: int, seqlen_q: int, seqlen_k: int, causal: bool,
                pairs: int, sms: int) -> bool:
    """The 128-row tile beats a ``tall_m``-row one where the taller tile's padding adds more
    work than TALL_TILE_GAIN pays back (``pairs`` = heads x batch)."""
    short = tile_cost(128, tile_n, seqlen_q, seqlen_k, causal, pairs, sms)
    tall = tile_cost(tall_m, tile_n, seqlen_q, seqlen_k, causal, pairs, sms)
    return short < tall / TALL_TILE_GAIN


# ------------------------------------------------------------------------------ kernel choice
# Each rule: (call, device, resolved scheduler) -> bool.
def _fp8(c, dev, sched):
    return bool(c.fp8)


def _fp8_prefill(c, dev, sched):
    """e4m3 q, k, v of a dense batch whose queries the decode kernels would not take."""
    return (c.fp8 == "qkv" and dev.arch == "sm_90a" and c.head_dim in FP8_PREFILL_TILES
            and not (c.paged or c.varlen or c.local or c.softcap > 0 or c.trace)
            and (c.num_splits or 1) == 1
            and not use_decode_kernels(c.seqlen_q, c.heads // c.heads_k, None, c.scheduler))


def _paged_or_split(c, dev, sched):
    return c.paged or (c.num_splits or 1) > 1


def _packable(c, dev, sched):
    return dev.arch == "sm_90a" and use_decode_kernels(
        c.seqlen_q, c.heads // c.heads_k, c.num_splits, c.scheduler, c.trace)


def _wide_rows(c, dev, sched):
    return use_wide_tile(c.seqlen_q, c.heads // c.heads_k)


def _m128_cheaper(c, dev, sched):
    if (c.local or c.softcap > 0 or c.trace or sched != "steal"
            or c.head_dim not in TILES_M128.get(dev.arch, {})):
        return False
    tile = _own_tile(dev.arch, c.dtype, c.head_dim, c.causal, sched)
    return tile.m > 128 and prefer_m128(tile.m, tile.n, c.seqlen_q, c.seqlen_k, c.causal,
                                        c.heads * c.batch, dev.num_sms)


@lru_cache(maxsize=None)
def _own_tile(arch, dtype, head_dim, causal, sched):
    """The tile of the configuration's own (plain) kernel: what the manifest record says."""
    return KernelConfig(arch, dtype, head_dim, causal, sched).tile


def _rows_see_many_keys(c, dev, sched):
    if not c.causal or c.local or c.trace or c.head_dim not in TILES_LONG_KV.get(dev.arch, {}):
        return False
    if c.varlen:  # from the packed totals and max_seqlen
        return prefer_long_kv(varlen_length(c.q[0][1], c.batch, c.seqlen_q),
                              varlen_length(c.k[0][1], c.batch, c.seqlen_k))
    return prefer_long_kv(c.seqlen_q, c.seqlen_k)


def _always(c, dev, sched):
    return True


class Row(NamedTuple):
    form: str  # decode_wide / decode / m128 / long_kv / plain
    rules: tuple  # all must hold: (call, device, resolved scheduler) -> bool
    optional: bool  # skipped when the manifest was built without this form
    why: str  # one line; the measurements are in docs/design.md#kernel-choice


# The kernel-choice table (docs/design.md#kernel-choice): the first row whose rules hold picks
# the kernel form, looked up once in the manifest.
KERNEL_CHOICE = (
    Row("fp8_prefill", (_fp8_prefill,), True,
        "FP8 wgmmas for dense e4m3 prefill (docs/design.md#fp8)"),
    Row("decode", (_fp8,), False,
        "e4m3 inputs exist only in the 64-row FP8 decode kernels (docs/design.md#fp8)"),
    Row("decode_wide", (_paged_or_split, _wide_rows), False,
        "paged/split-KV exist only in the decode kernels; > 64 packed rows: the 128-row form "
        "(docs/design.md#kernel-choice)"),
    Row("decode", (_paged_or_split,), False,
        "paged/split-KV exist only in the decode kernels (docs/design.md#kernel-choice)"),
    Row("decode_wide", (_packable, _wide_rows), False,
        "short or GQA-packable queries read K/V once per KV head and 128 packed rows "
        "(docs/design.md#kernel-choice)"),
    Row("decode", (_packable,), False,
        "short or GQA-packable queries that fit one 64-row tile (docs/design.md#kernel-choice)"),
    Row("m128", (_m128_cheaper,), True,
        "the taller tile's padding costs more than TALL_TILE_GAIN pays back "
        "(docs/design.md#kernel-choice)"),
    Row("long_kv", (_rows_see_many_keys,), True,
        "causal rows seeing >= LONG_KV_KEYS keys run faster on wide key blocks "
        "(docs/design.md#kernel-choice)"),
    Row("plain", (_always,), False,
        "the configuration's own tile (docs/design.md#kernel-choice)"),
)


def check_softcap(softcap: bool, arch: str, sched: str, scheduler: str):
    """Softcap kernels exist on sm_90a for SOFTCAP_SCHEDULERS only (``scheduler`` as given)."""
    if softcap and (arch != "sm_90a" or sched not in SOFTCAP_SCHEDULERS):
        raise ValueError(
            f"softcap is not supported on {arch}" if arch != "sm_90a" else
            "softcap kernels exist for scheduler 'auto', "
            + ", ".join(repr(s) for s in SOFTCAP_SCHEDULERS) + f"; got scheduler={scheduler!r}")


def _lookup(manifest, form: str, c: CallSpec, arch: str, sched: str):
    if form in ("decode", "decode_wide"):
        if arch != "sm_90a":
            raise ValueError(f"num_splits > 1, paged KV and the decode kernels exist on sm_90a "
                             f"only; this device is {arch}")
        kw = {"fp8": c.fp8} if c.fp8 else {}
        return manifest.find(arch, c.dtype, c.head_dim, c.causal, "steal", local=c.local,
                             decode=True, wide=form == "decode_wide", **kw)
    if form == "fp8_prefill":
        return manifest.find(arch, c.dtype, c.head_dim, c.causal, "steal", fp8="qkv")
    if form == "m128":
        return manifest.find(arch, c.dtype, c.head_dim, c.causal, sched, m128=True)
    if form == "long_kv":
        return manifest.find(arch, c.dtype, c.head_dim, True, sched, softcap=c.softcap > 0,
                             long_kv=True)
    return manifest.find(arch, c.dtype, c.head_dim, c.causal, sched, trace=c.trace,
                         local=c.local, softcap=c.softcap > 0)


def choose_kernel(c: CallSpec, manifest, device: DeviceInfo):
    """(form, name, record) of the call's kernel: the first row of :data:`KERNEL_CHOICE` that
    holds (and, for optional rows, that the manifest has)."""
    if device.arch not in ARCHS:
        raise RuntimeError(f"fa4_aot has kernels for sm_90a (H100/H200) and sm_100a (B200); "
                           f"the device has {device.arch}")
    sched = None
    for form, rules, optional, _ in KERNEL_CHOICE:
        if sched is None and not form.startswith("decode"):  # prefill rows: a real scheduler
            sched = resolve_scheduler(c.scheduler, device.arch)
            check_softcap(c.softcap > 0, device.arch, sched, c.scheduler)
        if not all(rule(c, device, sched) for rule in rules):
            continue
        try:
            return (form,) + tuple(_lookup(manifest, form, c, device.arch, sched))
        except ValueError:
            if not optional:
                raise
    raise AssertionError("the last row always holds")


def combine_kernel(manifest, dtype: str, head_dim: int):
    """(name, record) of the split-KV merge (sm_90a)."""
    return manifest.find("sm_90a", dtype, head_dim, False, "single", kind="combine")


# ------------------------------------------------------------------------------ launch values
_section = lru_cache(maxsize=4096)(choose_section)  # pure


def grid_size(rule: dict, num_tiles: int, sms: int) -> int:
    """CTAs of a launch of ``num_tiles`` work items (tiles; for the combine kernel, (row, head)
    pairs) under the manifest's grid rule."""
    if rule["rule"] == "tiles":
        return num_tiles
    if rule["rule"] == "rows":
        return -(-num_tiles // rule["rows_per_cta"])
    return max(1, min(num_tiles, rule["ctas_per_sm"] * sms))


def softmax_scalars(scale: float, softcap: float) -> dict:
    """Softcap kernels first turn S into tanh(S * softcap_pre), softcap_pre = scale / softcap;
    their softmax and LSE then scale by softcap instead of scale."""
    unit = softcap if softcap > 0 else scale
    return {"softmax_scale_log2": unit * math.log2(math.e), "softmax_scale": unit,
            "softcap_pre": scale / softcap if softcap > 0 else 0.0}


def contiguous_strides(shape):
    strides, acc = [], 1
    for n in reversed(shape):
        strides.append(acc)
        acc *= max(n, 1)
    return tuple(reversed(strides))


def _seq_mode(c: CallSpec, packed_k: bool, compact: bool) -> int:
    """The launch value ``seq_mode``: the :class:`fa4_aot.abi.SeqMode` bits of the call."""
    return sum(int(bit) for bit, on in ((SeqMode.VARLEN, c.varlen), (SeqMode.USED_Q, c.seqused_q),
                                        (SeqMode.USED_K, c.seqused_k),
                                        (SeqMode.VARLEN_K, packed_k), (SeqMode.COMPACT, compact))
               if on)


def _needed_capabilities(c: CallSpec) -> set:
    return {cap for cap, on in (("varlen", c.varlen), ("window", c.local),
                                ("seqused", c.seqused_q or c.seqused_k),
                                ("fp8_" + c.fp8, bool(c.fp8))) if on}


def _descale_values(descales) -> dict:
    """The Quant group (abi.FWD_SM90_FP8): each descale's address slot and (batch, head)
    strides; an absent one (q_descale with a bf16 q) is a null pointer."""
    values = {}
    for x, strides in zip("qkv", descales):
        name = f"{x}_descale"
        values[name] = PerCall(name) if strides is not None else 0
        values[f"{name}_stride_b"], values[f"{name}_stride_h"] = strides or (0, 0)
    return values


def plan(c: CallSpec, manifest, device: DeviceInfo) -> LaunchPlan:
    """(validated call, manifest, device) -> what to allocate and every launch value of every
    launch. Values that change from call to call are the tensors' addresses only, given as
    :class:`fa4_aot.runtime.PerCall` slots; ``sched_ptr`` is :data:`SCHED_COUNTER`."""
    b, sq, sk, h, hk, d = c.batch, c.seqlen_q, c.seqlen_k, c.heads, c.heads_k, c.head_dim
    (q_batch, q_rows, _, _), (k_batch, k_rows, _, _) = c.q[0], c.k[0]
    out_shape = (q_rows, h, d) if c.varlen else (b, sq, h, d)
    lse_shape = (h, q_rows) if c.varlen else (b, h, sq)
    if 0 in c.q[0]:
        return LaunchPlan(out_shape, lse_shape, NOTHING, (), (), c)
    if 0 in c.k[0] or (c.paged and 0 in c.page_table[0]):
        return LaunchPlan(out_shape, lse_shape, ZERO_FILL, (), (), c)
    g = h // hk
    form, name, rec = choose_kernel(c, manifest, device)
    decode = form.startswith("decode")
    launch = rec["launch"]
    missing = _needed_capabilities(c) - set(launch["capabilities"])
    if missing:
        raise ValueError(f"{', '.join(sorted(missing))}: not supported by the {rec['arch']} "
                         f"kernels (varlen, window_size, seqused_q/k, FP8 inputs)")
    tile_m, tile_n = launch["tile"]["m"], launch["tile"]["n"]
    sms = device.num_sms
    compact = False
    if decode:  # packed GQA: a tile's rows are (query row, query head of the KV head)
        num_m_blocks = -(-sq * g // tile_m)
        tiles = num_m_blocks * hk * b
        splits = c.num_splits or choose_num_splits(tiles, -(-sk // tile_n), sms)
        section = _section(hk, b * splits, sk, d, c.elem_bytes, 1)
    else:
        num_m_blocks = -(-sq // tile_m)
        tiles = num_m_blocks * h * b
        splits = 1
        # Compact varlen tiles where the (document x m-block) grid is at least half empty: at
        # most ceil(q_rows / tile_m) + batch m-blocks per head hold rows.
        compact = c.varlen and b * num_m_blocks >= 2 * (-(-q_rows // tile_m) + b)
        section = (compact_section(h, sk, d, c.elem_bytes, g, c.causal) if compact
                   else _section(h, b, sk, d, c.elem_bytes, g, c.causal))
    num_tiles = tiles * splits
    if num_tiles == 0:
        return LaunchPlan(out_shape, lse_shape, NOTHING, (), (), c)
    o_stride = c.out[1]
    lse_stride = contiguous_strides(lse_shape)
    acc_rows = q_rows if c.varlen else b * sq
    split = splits > 1
    unbounded = sq + sk  # a window side of -1: wider than any row can see
    packed_k = c.varlen and not c.paged
    strides = {"o_stride_s": o_stride[1], "o_stride_h": o_stride[2],
               "o_stride_b": 0 if c.varlen else o_stride[0],
               "lse_stride_h": lse_stride[0] if c.varlen else lse_stride[1],
               "lse_stride_b": 0 if c.varlen else lse_stride[0]}
    values = {
        "seqlen_q": sq, "seqlen_k": sk, "num_heads": h, "num_heads_k": hk, "batch": b,
        "q_rows": q_rows, "k_rows": k_rows, "q_batch": q_batch, "k_batch": k_batch,
        "qhead_per_kvhead": g, "num_m_blocks": num_m_blocks, "section": section,
        "num_tiles": num_tiles, "num_splits": splits, "acc_rows": acc_rows,
        **softmax_scalars(c.softmax_scale, c.softcap), **strides,
        "q_ptr": PerCall("q"), "o_ptr": PerCall("out"), "lse_ptr": PerCall("lse"),
        "oacc_ptr": PerCall("oacc") if split else 0,
        "lseacc_ptr": PerCall("lseacc") if split else 0,
        "sched_ptr": SCHED_COUNTER if launch["needs_counter"] else 0,
        "trace_ptr": PerCall("trace") if c.trace else 0,
        "cu_seqlens_q": PerCall("cu_seqlens_q") if c.varlen else 0,
        "cu_seqlens_k": PerCall("cu_seqlens_k") if packed_k else 0,
        "seqused_q": PerCall("seqused_q") if c.seqused_q else 0,
        "seqused_k": PerCall("seqused_k") if c.seqused_k else 0,
        "seq_mode": _seq_mode(c, packed_k, compact),
        "window_left": c.window_left if c.window_left >= 0 else unbounded,
        "window_right": c.window_right if c.window_right >= 0 else unbounded,
        "q_stride_s": c.q[1][1], "q_stride_h": c.q[1][2],
        "q_stride_b": 0 if c.varlen else c.q[1][0],
        "k_ptr": PerCall("k"), "k_stride_s": c.k[1][1], "k_stride_h": c.k[1][2],
        "k_stride_b": 0 if packed_k else c.k[1][0],
        "v_ptr": PerCall("v"), "v_stride_s": c.v[1][1], "v_stride_h": c.v[1][2],
        "v_stride_b": 0 if packed_k else c.v[1][0],
        "page_table": PerCall("page_table") if c.paged else 0,
        "page_size": k_rows if c.paged else 0,
        "pages_per_seq": c.page_table[0][1] if c.paged else 0,
        "page_table_stride": c.page_table[1][0] if c.paged else 0,
        # decode K/V TMA box: a key block, or with pages the largest box dividing block and page
        "kv_box_rows": math.gcd(k_rows, tile_n) if c.paged else tile_n,
    }
    v_transposed = None
    if c.fp8:
        values.update(_descale_values(c.descales))
    if form == "fp8_prefill":
        rows = -(-sk // VT_GROUP) * VT_GROUP
        values["vt_rows"] = rows
        v_transposed = ((b, rows, hk, d), (hk * d * rows, 1, d * rows, rows))
    grid = (grid_size(launch["grid"], num_tiles, sms), 1, 1)
    launches = [KernelLaunch(name, rec, grid, values)]
    acc_shapes = ()
    if split:
        cname, crec = combine_kernel(manifest, c.dtype, d)
        cvalues = {"oacc_ptr": PerCall("oacc"), "lseacc_ptr": PerCall("lseacc"),
                   "o_ptr": PerCall("out"), "lse_ptr": PerCall("lse"), **strides,
                   "num_splits": splits, "acc_rows": acc_rows,
                   "seqlen_q": q_rows if c.varlen else sq, "num_heads": h}
        cgrid = (grid_size(crec["launch"]["grid"], acc_rows * h, sms), 1, 1)
        launches.append(KernelLaunch(cname, crec, cgrid, cvalues))
        acc_shapes = ((splits, acc_rows, h, d), (splits, acc_rows, h))
    return LaunchPlan(out_shape, lse_shape, LAUNCH, tuple(launches), acc_shapes, c,
                      v_transposed)
