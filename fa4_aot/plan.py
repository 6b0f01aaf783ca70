"""The launch planner: (validated call, manifest, device) -> kernels, grids and launch values.

Pure: no torch, no CUDA. :func:`plan` is the only place that chooses a kernel and computes
launch values; ``fa4_aot.interface`` runs it once per memo miss. The choice is one table,
:data:`KERNEL_CHOICE`, read top to bottom (docs/design.md#kernel-choice, written from it): each
row names a kernel family, the configs table its tile comes from and why; every rule is one
function with its reason. What exists is the manifest's to say: a call no kernel serves is
refused by :func:`refusal`, which reads the manifest's capabilities.
"""

from __future__ import annotations

import math
from functools import lru_cache
from typing import NamedTuple

from . import configs
from .abi import CAPABILITIES, VT_GROUP, SeqMode
from .configs import SCHEDULERS_BY_ARCH
from .runtime import ADDRESSES, PerCall
from .schedule import choose_section, compact_section, num_n_blocks

SCHEDULERS = ("auto", "single", "static", "steal", "clc")
# The kernels' architecture per compute capability.
ARCH_BY_CAPABILITY = {(9, 0): "sm_90a", (10, 0): "sm_100a"}

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
    acc_shapes: tuple = ()  # split-KV: fp32 shapes of the partials at oacc_ptr, lseacc_ptr
    call: CallSpec | None = None
    # FP8 prefill: the kernels read V transposed (fa4_aot.buffers.transposed_v, keys rounded up
    # to VT_GROUP); (shape, element strides) of that tensor as the (b, s, h, d) view they see.
    v_transposed: tuple | None = None
    # FP8 prefill of a bf16 q: the kernels read q quantized per call (fa4_aot.buffers.quantized_q:
    # a contiguous e4m3 copy and its fp32 (batch, heads_k) q_descale); (shape, element strides).
    q_quantized: tuple | None = None


LAUNCH, NOTHING, ZERO_FILL = 0, 1, 2
# sched_ptr of a work-stealing launch: the runtime's zeroed int32[2] counter of the call's
# (device, stream), filled in by fa4_aot.interface when it builds the launch.
SCHED_COUNTER = PerCall("sched_counter")
# The per-call value of each address slot, made once (a plan is made on every memo miss).
_PER_CALL = {name: PerCall(name) for name in ADDRESSES}

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


def device_arch(capability) -> str:
    """The kernels' architecture of a device of compute capability (major, minor): the one
    error for a device fa4_aot has no kernels for."""
    arch = ARCH_BY_CAPABILITY.get(tuple(capability))
    if arch is None:
        raise RuntimeError(f"fa4_aot has kernels for sm_90a (H100/H200) and sm_100a (B200); "
                           f"the device has compute capability {capability[0]}.{capability[1]}")
    return arch


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
# Each rule: (call, device, resolved scheduler) -> bool; its docstring is its cell in the table
# of docs/design.md#kernel-choice (build_tools/figures.py writes it from KERNEL_CHOICE).
def _fp8(c, dev, sched):
    """e4m3 k/v"""
    return bool(c.fp8)


def _fp8_prefill(c, dev, sched):
    """e4m3 k, v (a bf16 q is quantized per call); dense; not short queries; no
    window/softcap/splits"""
    return (bool(c.fp8) and not (c.paged or c.varlen or c.local or c.softcap > 0 or c.trace)
            and (c.num_splits or 1) == 1
            and not use_decode_kernels(c.seqlen_q, c.heads // c.heads_k, None, sched))


def _paged_or_split(c, dev, sched):
    """paged KV or `num_splits > 1`"""
    return c.paged or (c.num_splits or 1) > 1


def _packable(c, dev, sched):
    """`use_decode_kernels`"""
    return use_decode_kernels(c.seqlen_q, c.heads // c.heads_k, c.num_splits, sched, c.trace)


def _wide_rows(c, dev, sched):
    """`seqlen_q · group > 64`"""
    return use_wide_tile(c.seqlen_q, c.heads // c.heads_k)


def _m128_cheaper(c, dev, sched):
    """full/causal, `steal`, no softcap/trace, the plain tile taller than 128 rows,
    `prefer_m128`"""
    if c.local or c.softcap > 0 or c.trace or sched != "steal":
        return False
    tile = plain_tile(c, dev)
    return tile.m > 128 and prefer_m128(tile.m, tile.n, c.seqlen_q, c.seqlen_k, c.causal,
                                        c.heads * c.batch, dev.num_sms)


def _rows_see_many_keys(c, dev, sched):
    """causal (not local, not trace), `prefer_long_kv`"""
    if not c.causal or c.local or c.trace:
        return False
    if c.varlen:  # from the packed totals and max_seqlen
        return prefer_long_kv(varlen_length(c.q[0][1], c.batch, c.seqlen_q),
                              varlen_length(c.k[0][1], c.batch, c.seqlen_k))
    return prefer_long_kv(c.seqlen_q, c.seqlen_k)


def _full(c, dev, sched):
    """no mask (not causal, not local)"""
    return not (c.causal or c.local)


def _always(c, dev, sched):
    """always"""
    return True


class Row(NamedTuple):
    form: str  # the kernel family: fp8_prefill / fp8_decode / decode_wide / decode / m128 /
    # long_kv / plain (``kernel=`` of interface.prepare forces one)
    kernel: dict  # KernelConfig fields that make the family; the others are the call's
    tile: str  # the configs table the kernel's tile comes from; the row applies only to the
    # (arch, head_dim) that table has
    rules: tuple  # all must hold: (call, device, resolved scheduler) -> bool
    optional: bool  # skipped when the manifest has no such kernel for the call
    why: str  # one line, markdown; the measurements are in docs/design.md


_DECODE = {"decode": True, "softcap": False}  # softcap is a run-time value there
# The kernel-choice table (docs/design.md#kernel-choice): the first row whose tile table has the
# call's head dim and whose rules hold picks the kernel, looked up once in the manifest.
KERNEL_CHOICE = (
    Row("fp8_prefill", {"fp8": "qkv"}, "FP8_PREFILL_TILES", (_fp8_prefill,), True,
        "FP8 wgmmas ([FP8](#fp8))"),
    Row("fp8_decode", _DECODE, "FP8_DECODE_TILES", (_fp8,), False,
        "every other FP8 call: the 64-row [FP8 decode kernels](#fp8)"),
    Row("decode_wide", {**_DECODE, "wide": True}, "DECODE_WIDE_TILES",
        (_paged_or_split, _wide_rows), False,
        "paging and split-KV exist only in the decode kernels; more packed rows than one "
        "64-row tile take the 128-row form"),
    Row("decode", _DECODE, "DECODE_TILES", (_paged_or_split,), False,
        "as above, one 64-row tile"),
    Row("decode_wide", {**_DECODE, "wide": True}, "DECODE_WIDE_TILES", (_packable, _wide_rows),
        True, "[decode routing](#decode-routing)"),
    Row("decode", _DECODE, "DECODE_TILES", (_packable,), True,
        "[decode routing](#decode-routing)"),
    Row("m128", {"m128": True}, "TILES_M128", (_m128_cheaper,), True,
        "[tall tile](#tall-tile-or-128-rows)"),
    Row("long_kv", {"long_kv": True}, "TILES_LONG_KV", (_rows_see_many_keys,), True,
        "[long key ranges](#long-key-ranges)"),
    Row("plain", {}, "TILES_WIDE_N", (_full,), False,
        "the wider key block amortises per-block work ([prefill tiles](#prefill-sm_90a))"),
    Row("plain", {}, "TILES", (_always,), False,
        "the prefill kernel of (arch, dtype, head_dim, mask, scheduler, softcap); a window is "
        "its own kernel (`local`; a causal window is local with `window_right = 0`)"),
)
FORMS = tuple(dict.fromkeys(r.form for r in KERNEL_CHOICE))


def row_tile(row: Row, arch: str, head_dim: int):
    """The tile of ``row``'s kernels at (arch, head_dim), from its configs table; None where
    the table has none (the row does not apply)."""
    return _table_tile(row.tile, arch, head_dim)


@lru_cache(maxsize=None)
def _table_tile(name: str, arch: str, head_dim: int):
    table = getattr(configs, name)
    if any(isinstance(key, str) for key in table):  # {arch: {head_dim: Tile}}
        table = table.get(arch, {})
    return table.get(head_dim)


def plain_tile(c: CallSpec, device: DeviceInfo):
    """The tile of the call's plain kernel (the prefill rows above weigh theirs against it)."""
    for row in KERNEL_CHOICE:
        if (row.form == "plain" and row_tile(row, device.arch, c.head_dim) is not None
                and all(rule(c, device, None) for rule in row.rules)):
            return row_tile(row, device.arch, c.head_dim)
    raise AssertionError("the last row always holds")


def needed_capabilities(c: CallSpec, fp8: str | None = None) -> frozenset:
    """The manifest capabilities (abi.CAPABILITIES) a call needs of its kernel; ``fp8``: the
    FP8 mode the kernel sees, when the runtime changes the call's (a quantized q)."""
    return _capabilities(c.varlen, c.local, c.seqused_q or c.seqused_k, c.paged,
                         (c.num_splits or 1) > 1, c.softcap > 0, c.trace,
                         c.fp8 if fp8 is None else fp8)


@lru_cache(maxsize=None)
def _capabilities(varlen, window, seqused, paged, split_kv, softcap, trace, fp8) -> frozenset:
    return frozenset(cap for cap, on in (
        ("varlen", varlen), ("window", window), ("seqused", seqused), ("paged", paged),
        ("split_kv", split_kv), ("softcap", softcap), ("trace", trace),
        ("fp8_" + fp8, bool(fp8))) if on)


def _fields(row: Row, c: CallSpec, arch: str, sched: str) -> dict:
    """The KernelConfig fields of the call's kernel of ``row``'s family."""
    return {"arch": arch, "dtype": c.dtype, "head_dim": c.head_dim, "causal": c.causal,
            "scheduler": sched, "trace": c.trace, "local": c.local, "softcap": c.softcap > 0,
            "fp8": c.fp8, **row.kernel}


def _find(manifest, fields: dict, needed: frozenset):
    """(name, record) of the kernel with these fields if the manifest has it and it has every
    needed capability; else None."""
    f = dict(fields)
    try:
        name, rec = manifest.find(f.pop("arch"), f.pop("dtype"), f.pop("head_dim"),
                                  f.pop("causal"), f.pop("scheduler"), **f)
    except ValueError:
        return None
    return (name, rec) if needed <= set(rec["launch"]["capabilities"]) else None


def choose_kernel(c: CallSpec, manifest, device: DeviceInfo, kernel: str | None = None):
    """(name, record) of the call's kernel: the first row of :data:`KERNEL_CHOICE` that applies
    and holds (for optional rows: that the manifest has). ``kernel`` forces one: a manifest
    kernel name, or a form (the first row of that form whose table has the head dim, its rules
    not asked). The scheduler is resolved here, once per call."""
    sched = resolve_scheduler(c.scheduler, device.arch)
    needed = needed_capabilities(c)
    if kernel is not None and kernel not in FORMS:
        rec = manifest.kernels[kernel]
        if not needed <= set(rec["launch"]["capabilities"]):
            raise refusal(manifest, rec["config"], needed, c.scheduler)
        return kernel, rec
    for row in KERNEL_CHOICE:
        if (row_tile(row, device.arch, c.head_dim) is None
                or (kernel is None and not all(r(c, device, sched) for r in row.rules))
                or (kernel is not None and row.form != kernel)):
            continue
        fields = _fields(row, c, device.arch, sched)
        implied = frozenset(("pack_gqa",)) if row.kernel.get("decode") else frozenset()
        need = needed if fields["fp8"] == c.fp8 else needed_capabilities(c, fields["fp8"])
        found = _find(manifest, fields, need | implied)
        if found is not None:
            return found
        if kernel is not None or not row.optional:
            raise refusal(manifest, fields, need, c.scheduler, implied)
    raise ValueError(f"kernel={kernel!r}: no row of that form applies to head_dim {c.head_dim}")


# What each capability is called among attention()'s arguments (refusals name them).
CAPABILITY_ARGS = {"varlen": "cu_seqlens_q/k (varlen)", "window": "window_size",
                   "seqused": "seqused_q/k", "paged": "page_table (paged KV)",
                   "split_kv": "num_splits > 1 (split-KV)", "pack_gqa": "packed GQA",
                   "softcap": "softcap", "trace": "_trace",
                   "fp8_kv": "FP8 (float8_e4m3fn k/v)", "fp8_qkv": "FP8 (float8_e4m3fn q, k, v)"}


def _mask(cfg: dict) -> str:
    return "local" if cfg.get("local") else "causal" if cfg.get("causal") else "full"


def refusal(manifest, fields: dict, needed: frozenset, scheduler: str,
            implied: frozenset = frozenset()) -> ValueError:
    """The error of a call no kernel of ``manifest`` serves, saying what exists: among the
    kernels with every capability the call needs (``implied``: needed by the row, not named),
    the first of arch, scheduler, dtype, head_dim and mask where the call is not among them."""
    what = ", ".join(CAPABILITY_ARGS[x] for x in CAPABILITIES if x in needed) or "fa4_aot"
    have = [r["config"] for r in manifest.kernels.values()
            if r["config"].get("kind", "fwd") == "fwd"
            and needed | implied <= set(r["launch"]["capabilities"])]
    if not have:
        return ValueError(f"{what}: no kernel of this build supports "
                          + ("them together" if len(needed) > 1 else "it"))
    arch = fields["arch"]
    for key in ("arch", "scheduler", "dtype", "head_dim", "mask"):
        value = _mask(fields) if key == "mask" else fields[key]
        values = {_mask(h) if key == "mask" else h[key] for h in have}
        if value in values:
            have = [h for h in have if (_mask(h) if key == "mask" else h[key]) == value]
            continue
        if key == "arch":
            return ValueError(f"{what} kernels exist on {' and '.join(sorted(values))} only; "
                              f"this device is {arch}")
        if key == "scheduler":
            names = [s for s in SCHEDULERS if s in values
                     or (s == "auto" and resolve_scheduler("auto", arch) in values)]
            return ValueError(f"{what} kernels exist for scheduler "
                              f"{', '.join(map(repr, names))}; got scheduler={scheduler!r}")
        listed = ", ".join(str(x) for x in sorted(values))
        return ValueError(f"{what} kernels exist for {key} {listed} on {arch}; got {value}")
    return ValueError(f"{what}: no {arch} kernel for " + ", ".join(
        f"{k}={v}" for k, v in fields.items() if k != "arch" and v not in (False, "")))


def prefill_call(dtype: str, head_dim: int, causal: bool, scheduler: str, trace: bool = False,
                 local: bool = False, softcap: bool = False) -> CallSpec:
    """The CallSpec of a one-row dense call of a configuration (what
    ``interface.select_kernel`` asks :func:`choose_kernel` about)."""
    view = ((1, 1, 1, head_dim), contiguous_strides((1, 1, 1, head_dim)))
    return CallSpec(dtype=dtype, elem_bytes=2, q=view, k=view, v=view, out=view, varlen=False,
                    batch=1, seqlen_q=1, seqlen_k=1, heads=1, heads_k=1, head_dim=head_dim,
                    causal=causal and not local, local=local, window_left=-1,
                    window_right=-1, softmax_scale=1.0, softcap=1.0 if softcap else 0.0,
                    scheduler=scheduler, trace=trace)


def combine_kernel(manifest, dtype: str, head_dim: int):
    """(name, record) of the split-KV merge (sm_90a)."""
    return manifest.find("sm_90a", dtype, head_dim, False, "single", kind="combine")


# ------------------------------------------------------------------------------ launch values
_section = lru_cache(maxsize=4096)(choose_section)  # pure
_num_splits = lru_cache(maxsize=4096)(choose_num_splits)  # pure


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


_VARLEN, _USED_Q, _USED_K, _VARLEN_K, _COMPACT = (int(SeqMode[x]) for x in (
    "VARLEN", "USED_Q", "USED_K", "VARLEN_K", "COMPACT"))  # as ints: IntFlag's | is slow


def _seq_mode(c: CallSpec, packed_k: bool, compact: bool) -> int:
    """The launch value ``seq_mode``: the :class:`fa4_aot.abi.SeqMode` bits of the call."""
    return ((_VARLEN if c.varlen else 0) | (_USED_Q if c.seqused_q else 0)
            | (_USED_K if c.seqused_k else 0) | (_VARLEN_K if packed_k else 0)
            | (_COMPACT if compact else 0))


def _descale_values(descales) -> dict:
    """The Quant group (abi.FWD_SM90_FP8): each descale's address slot and (batch, head)
    strides; an absent one (q_descale with a bf16 q) is a null pointer."""
    values = {}
    for x, strides in zip("qkv", descales):
        name = f"{x}_descale"
        values[name] = _PER_CALL[name] if strides is not None else 0
        values[f"{name}_stride_b"], values[f"{name}_stride_h"] = strides or (0, 0)
    return values


def plan(c: CallSpec, manifest, device: DeviceInfo, kernel: str | None = None) -> LaunchPlan:
    """(validated call, manifest, device) -> what to allocate and every launch value of every
    launch. Values that change from call to call are the tensors' addresses only, given as
    :class:`fa4_aot.runtime.PerCall` slots; ``sched_ptr`` is :data:`SCHED_COUNTER`.
    ``kernel``: force a kernel (:func:`choose_kernel`; tools)."""
    b, sq, sk, h, hk, d = c.batch, c.seqlen_q, c.seqlen_k, c.heads, c.heads_k, c.head_dim
    (q_batch, q_rows, _, _), (k_batch, k_rows, _, _) = c.q[0], c.k[0]
    out_shape = (q_rows, h, d) if c.varlen else (b, sq, h, d)
    lse_shape = (h, q_rows) if c.varlen else (b, h, sq)
    if 0 in c.q[0]:
        return LaunchPlan(out_shape, lse_shape, NOTHING, (), (), c)
    if 0 in c.k[0] or (c.paged and 0 in c.page_table[0]):
        return LaunchPlan(out_shape, lse_shape, ZERO_FILL, (), (), c)
    g = h // hk
    name, rec = choose_kernel(c, manifest, device, kernel)
    decode = rec["config"]["decode"]
    launch = rec["launch"]
    tile_m, tile_n = launch["tile"]["m"], launch["tile"]["n"]
    sms = device.num_sms
    compact = False
    if decode:  # packed GQA: a tile's rows are (query row, query head of the KV head)
        num_m_blocks = -(-sq * g // tile_m)
        tiles = num_m_blocks * hk * b
        splits = c.num_splits or _num_splits(tiles, -(-sk // tile_n), sms)
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
        "q_ptr": _PER_CALL["q_ptr"], "o_ptr": _PER_CALL["o_ptr"], "lse_ptr": _PER_CALL["lse_ptr"],
        "oacc_ptr": _PER_CALL["oacc_ptr"] if split else 0,
        "lseacc_ptr": _PER_CALL["lseacc_ptr"] if split else 0,
        "sched_ptr": SCHED_COUNTER if launch["needs_counter"] else 0,
        "trace_ptr": _PER_CALL["trace_ptr"] if c.trace else 0,
        "cu_seqlens_q": _PER_CALL["cu_seqlens_q"] if c.varlen else 0,
        "cu_seqlens_k": _PER_CALL["cu_seqlens_k"] if packed_k else 0,
        "seqused_q": _PER_CALL["seqused_q"] if c.seqused_q else 0,
        "seqused_k": _PER_CALL["seqused_k"] if c.seqused_k else 0,
        "seq_mode": _seq_mode(c, packed_k, compact),
        "window_left": c.window_left if c.window_left >= 0 else unbounded,
        "window_right": c.window_right if c.window_right >= 0 else unbounded,
        "q_stride_s": c.q[1][1], "q_stride_h": c.q[1][2],
        "q_stride_b": 0 if c.varlen else c.q[1][0],
        "k_ptr": _PER_CALL["k_ptr"], "k_stride_s": c.k[1][1], "k_stride_h": c.k[1][2],
        "k_stride_b": 0 if packed_k else c.k[1][0],
        "v_ptr": _PER_CALL["v_ptr"], "v_stride_s": c.v[1][1], "v_stride_h": c.v[1][2],
        "v_stride_b": 0 if packed_k else c.v[1][0],
        "page_table": _PER_CALL["page_table"] if c.paged else 0,
        "page_size": k_rows if c.paged else 0,
        "pages_per_seq": c.page_table[0][1] if c.paged else 0,
        "page_table_stride": c.page_table[1][0] if c.paged else 0,
        # decode K/V TMA box: a key block, or with pages the largest box dividing block and page
        "kv_box_rows": math.gcd(k_rows, tile_n) if c.paged else tile_n,
    }
    v_transposed = q_quantized = None
    descales = c.descales
    if c.fp8 and not decode:  # the FP8 prefill kernels read V transposed
        rows = -(-sk // VT_GROUP) * VT_GROUP
        values["vt_rows"] = rows
        v_transposed = ((b, rows, hk, d), (hk * d * rows, 1, d * rows, rows))
        if c.fp8 == "kv":  # and an e4m3 q: a bf16 one is quantized per call, contiguous
            q_quantized = (c.q[0], contiguous_strides(c.q[0]))
            descales = (contiguous_strides((b, hk)),) + descales[1:]
            values.update({"q_stride_s": q_quantized[1][1], "q_stride_h": q_quantized[1][2],
                           "q_stride_b": q_quantized[1][0]})
    if c.fp8:
        values.update(_descale_values(descales))
    grid = (grid_size(launch["grid"], num_tiles, sms), 1, 1)
    launches = [KernelLaunch(name, rec, grid, values)]
    acc_shapes = ()
    if split:
        cname, crec = combine_kernel(manifest, c.dtype, d)
        cvalues = {"oacc_ptr": _PER_CALL["oacc_ptr"], "lseacc_ptr": _PER_CALL["lseacc_ptr"],
                   "o_ptr": _PER_CALL["o_ptr"], "lse_ptr": _PER_CALL["lse_ptr"], **strides,
                   "num_splits": splits, "acc_rows": acc_rows,
                   "seqlen_q": q_rows if c.varlen else sq, "num_heads": h}
        cgrid = (grid_size(crec["launch"]["grid"], acc_rows * h, sms), 1, 1)
        launches.append(KernelLaunch(cname, crec, cgrid, cvalues))
        acc_shapes = ((splits, acc_rows, h, d), (splits, acc_rows, h))
    return LaunchPlan(out_shape, lse_shape, LAUNCH, tuple(launches), acc_shapes, c,
                      v_transposed, q_quantized)
