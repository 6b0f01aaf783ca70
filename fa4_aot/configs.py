"""The configuration space: every kernel fa4_aot builds and ships is listed here, once.

Both sides read this module: the build (``build_tools/build.py``) compiles one cubin per
:class:`KernelConfig` in :data:`CONFIG_SPACE`, and the runtime selects among the configurations
that the manifest says were built. Pure Python, no cutlass, no torch.

A configuration's :attr:`KernelConfig.name` is stable: it names the kernel's files under
``artifacts/`` and its key in ``artifacts/manifest.json``.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Iterable

ARCHS = ("sm_90a", "sm_100a")
DTYPES = ("bf16", "fp16")
# FP8 (e4m3) inputs (``KernelConfig.fp8``): "kv" = an e4m3 K/V cache with a 16-bit q, "qkv" =
# q, k and v in e4m3; the output is ``dtype`` (bf16). The decode kernels convert each e4m3 tile
# to bf16 in shared memory and run bf16 MMAs; the prefill kernels ("qkv" only) run FP8 MMAs.
FP8_MODES = ("kv", "qkv")
# Tile schedulers per architecture. sm_90a: one CTA per tile, static persistent, work stealing
# through a global atomic counter. sm_100a: static persistent, work stealing through cluster
# launch control (CLC try_cancel). The shared interface is fa4_aot/kernels/tile_sched.py.
SCHEDULERS_BY_ARCH = {"sm_90a": ("single", "static", "steal"), "sm_100a": ("static", "clc")}

# Schedulers that have softcap kernels (sm_90a): steal (what scheduler="auto" picks) and single.
SOFTCAP_SCHEDULERS = ("single", "steal")

# Threads per CTA. sm_90a: one producer warpgroup + one MMA warpgroup per 64 rows of the m tile
# (``Tile.m // 64``). sm_100a: 4 softmax warps + MMA warp + load warp + CLC scheduler warp.
# The split-KV combine kernel: 4 warps, one (row, head) per warp.
THREADS_BY_ARCH = {"sm_90a": None, "sm_100a": 224}
COMBINE_THREADS = 128


@dataclass(frozen=True)
class Tile:
    """Tile shape, pipeline depth and mainloop schedule chosen per (arch, head_dim). Each
    switch's measurements: docs/design.md#tile-choices.

    ``overlap``: issue S(n) and O += P(n+1)V(n+1) together and run the softmax of S(n) under the
    PV wgmma. ``pingpong``: the MMA warpgroups take turns issuing (round robin over two or
    three); off at hd256, whose long wgmmas leave nothing to interleave.
    ``rescale_early`` (with overlap): O is multiplied by the previous block's correction while
    S's wgmmas run instead of after the PV wait (same operations, same order: bitwise equal O).
    ``q_stages`` (sm_90a prefill): Q buffers; with 2 the producer loads the next tile's Q while
    this tile runs, so a short tile does not wait for it. Where shared memory allows (not
    hd192/hd256 or 176-key blocks). The decode kernels load Q themselves and keep one.
    ``sum_chains`` (sm_90a): each row's block sum of P in four interleaved chains (value c into
    chain c % 4, the sm_100a order) instead of a pairwise tree, so the adds fill issue slots
    while the MUFU queue is full (pays where exponentials bound the block: hd64). Another
    rounding order of the row sum.
    ``staged_store`` (sm_90a prefill): O goes to global memory through the tile's Q buffer
    (whole 16-byte chunks of rows, full 128-byte lines) instead of 32-bit pieces straight from
    the accumulators: the same values, a quarter of the store requests. The Q buffer is then
    released after the epilogue, so it pays where a second Q buffer hides that or where the
    epilogue is long; tiles where it does not pay stage through an O buffer instead.
    ``o_buffer`` (with ``staged_store``): O passes through a 64-row buffer of its own instead
    of the Q stage, which is then released before the epilogue; the MMA warpgroups hand the
    buffer on to each other through an mbarrier.
    ``lazy_rescale`` (sm_90a): a row's running max moves only when a key block raises it by
    more than 2^8 (FA4's Blackwell rule); otherwise P is taken against the old max (values up
    to 256, harmless in fp32 and in 16-bit P) and, when no row of a warp moved, O's rescale is
    skipped. Each row decides for itself, so the bits do not depend on which rows share a warp
    (packed GQA). Inside FA's error rule; on a sharply peaked row the dominant P is no longer
    exactly 1, which adds one 16-bit rounding to it.
    ``edge_width`` (sm_90a prefill, with ``overlap``; 0: off): a tile's first key block (the
    causal diagonal or the sequence end) is computed on only its first ``edge_width`` columns
    where no row of the tile sees more of them (P is exactly 0 past them: bitwise the same
    output). Such tiles run a second copy of the mainloop, chosen per tile; not in the decode
    or softcap kernels.
    ``lazy_reference`` (sm_90a prefill, bf16, with ``overlap``): in a tile's unmasked key
    blocks P is taken against a reference decided by the blocks before (moved when a block's
    largest P exceeds 2^8, decided at the next step under its wgmmas) instead of the block's
    own row max, so each block's exponentials start as soon as S is there. A block whose
    scores rise ~70 nats above the blocks before could overflow P: a test at the tile's end
    sends such a warp to an exact recomputation from global K/V. Ordinary attention never
    takes it."""

    m: int
    n: int
    kv_stages: int
    overlap: bool = True
    pingpong: bool = True
    rescale_early: bool = False
    q_stages: int = 1
    sum_chains: bool = False
    staged_store: bool = False
    o_buffer: bool = False
    lazy_rescale: bool = False
    edge_width: int = 0
    lazy_reference: bool = False


# Tile shapes per (arch, head_dim) (docs/design.md#tile-choices). On sm_90a each MMA warpgroup owns 64
# rows of the m tile; hd64 takes three (192 rows: FA4's hd64 tile), writing O through an O
# buffer. O is rescaled under S's wgmmas where a tile has many key blocks (not the 128-key
# hd128 tile, whose calls are short causal rows and windows). Every hd64 kernel (the 128-row
# and decode tiles too) sums P in four chains and moves its row max lazily: one arithmetic
# for all, so hd64's decode and prefill kernels stay bitwise equal.
TILES = {
    "sm_90a": {64: Tile(m=192, n=128, kv_stages=4, q_stages=2, rescale_early=True,
                        sum_chains=True, staged_store=True, o_buffer=True, lazy_rescale=True),
               96: Tile(m=128, n=128, kv_stages=2, q_stages=2, staged_store=True),
               128: Tile(m=128, n=128, kv_stages=2, q_stages=2, staged_store=True),
               192: Tile(m=128, n=112, kv_stages=2, staged_store=True),
               # hd256: long wgmmas next to an 80-column softmax: FA4's hd256 schedule (no
               # ping-pong, O rescaled under S's wgmmas) and the lazy row max.
               256: Tile(m=128, n=80, kv_stages=2, pingpong=False, rescale_early=True,
                         staged_store=True, lazy_rescale=True)},
    "sm_100a": {64: Tile(m=128, n=128, kv_stages=4), 128: Tile(m=128, n=128, kv_stages=2)},
}

# Wider key blocks (hd128: 176 keys, FA3's non-causal tile; 192 spills): every block but the
# last needs no mask when nothing is masked, so a wider n only amortises the per-block work.
# The non-causal kernels take it always; the causal ones have it (on 160 keys: TILES_LONG_KV)
# as an alternative for calls whose rows see enough keys (``plan.prefer_long_kv``): its
# diagonal blocks cost more, its steady state less (docs/design.md#kernel-choice).
TILES_WIDE_N = {"sm_90a": {128: Tile(m=128, n=176, kv_stages=2, rescale_early=True,
                                      staged_store=True, o_buffer=True, edge_width=96)}}

# The causal form of the wide tile (``KernelConfig.long_kv``): the same tile on 160 keys, which
# the causal rows run faster; non-causal stays on 176 keys (docs/design.md#tile-choices).
TILES_LONG_KV = {arch: {hd: dataclasses.replace(t, n=160, lazy_reference=True)
                        for hd, t in tiles.items()}
                 for arch, tiles in TILES_WIDE_N.items()}

# The 128-row alternative of a taller tile (sm_90a hd64): full and causal work-stealing kernels
# (``KernelConfig.m128``) for calls where the taller tile's rounding of the sequence costs
# more than it gains (``plan.prefer_m128``; docs/design.md#kernel-choice).
TILES_M128 = {"sm_90a": {64: Tile(m=128, n=128, kv_stages=3, q_stages=2, rescale_early=True,
                                  sum_chains=True, staged_store=True, lazy_rescale=True)}}

# Decode / short-query kernels (``KernelConfig.decode``, sm_90a): packed GQA (the query heads of
# one KV head share an m tile, so K/V are read once per KV head) and split-KV (the key range of
# a tile cut into ``num_splits`` parts, merged by the combine kernel). One MMA warpgroup of 64
# rows: a decode tile holds seqlen_q * group rows, often fewer than 64. The work is bound by
# reading K and V; about 96 KB of K/V in flight per SM reads fastest. Three stages or more where
# possible: the paged loads issue K and V in one pass then (docs/design.md#tile-choices).
DECODE_TILES = {64: Tile(m=64, n=128, kv_stages=3, pingpong=False, sum_chains=True,
                         lazy_rescale=True),
                96: Tile(m=64, n=64, kv_stages=4, pingpong=False),
                128: Tile(m=64, n=64, kv_stages=3, pingpong=False),
                192: Tile(m=64, n=64, kv_stages=2, pingpong=False),
                256: Tile(m=64, n=80, kv_stages=2, pingpong=False)}

# The FP8 decode kernels (``KernelConfig.fp8``): e4m3 stages are half as large, so twice the
# stages keep the same bytes in flight where shared memory (the stages, the bf16 K and V the
# MMAs read, Q) allows; hd256 has room for two only.
FP8_DECODE_TILES = {hd: dataclasses.replace(DECODE_TILES[hd], kv_stages=s)
                    for hd, s in ((64, 6), (128, 6), (256, 2))}

# The FP8 prefill kernels (``KernelConfig.fp8`` without ``decode``): FP8 wgmmas for S = Q K^T
# and O += P V (P rounded to e4m3, V transposed by the runtime). Q, K and V^T stages are half
# the bytes of bf16 ones; O is written from registers (the e4m3 Q stage cannot hold it).
FP8_PREFILL_TILES = {128: Tile(m=128, n=128, kv_stages=2)}

# The decode kernels with the 128-row tile (``KernelConfig.wide``: paged KV or forced splits
# with many packed rows, such as chunked prefill over a paged cache): the 128-row prefill tiles,
# with a third K/V stage at head_dim 128 (the paged loads then issue K and V in one pass).
# Larger head dims have no shared memory for a third stage.
DECODE_WIDE_TILES = {hd: dataclasses.replace(TILES_M128["sm_90a"].get(hd, t), q_stages=1,
                                              staged_store=False)
                     for hd, t in TILES["sm_90a"].items()}
DECODE_WIDE_TILES[128] = dataclasses.replace(DECODE_WIDE_TILES[128], kv_stages=3)

# Derived from the tables above (the source of truth).
HEAD_DIMS = tuple(sorted({hd for tiles in TILES.values() for hd in tiles}))


@dataclass(frozen=True)
class KernelConfig:
    arch: str
    dtype: str
    head_dim: int
    causal: bool
    scheduler: str
    trace: bool = False
    # Sliding-window (local) mask; the window sizes are launch-time values.
    local: bool = False
    # Tanh soft-capping of the scores (softcap * tanh(s / softcap)); the cap is a launch value.
    softcap: bool = False
    # Decode / short-query kernel (sm_90a): packed GQA + split-KV, DECODE_TILES. Masks and
    # softcap are runtime values there (one kernel per dtype x head_dim x mask).
    decode: bool = False
    # Decode kernel with the 128-row prefill tile (two MMA warpgroups, ping-pong): for calls that
    # must take the decode kernels (paged KV, forced splits) with many packed rows, such as
    # chunked prefill over a paged cache.
    wide: bool = False
    # "fwd": the attention forward; "combine": the split-KV merge (fp32 partials -> output).
    kind: str = "fwd"
    # The 128-row alternative tile (TILES_M128) of a head dim whose main tile is taller.
    m128: bool = False
    # The wide-n alternative (TILES_LONG_KV) of a causal prefill kernel, for long key ranges.
    long_kv: bool = False
    # "" or one of FP8_MODES: which inputs the decode kernel reads as e4m3 (with descales).
    fp8: str = ""

    def __post_init__(self):
        if self.arch not in ARCHS:
            raise ValueError(f"arch must be one of {ARCHS}, got {self.arch!r}")
        if self.dtype not in DTYPES:
            raise ValueError(f"dtype must be one of {DTYPES}, got {self.dtype!r}")
        if self.head_dim not in TILES.get(self.arch, {}):
            raise ValueError(f"head_dim must be one of {tuple(TILES.get(self.arch, {}))} on "
                             f"{self.arch}, got {self.head_dim!r}")
        if self.local and (self.causal or self.arch != "sm_90a"):
            raise ValueError("local (sliding window) is a mask of its own on sm_90a only; "
                             "causal windows use it with window_right = 0")
        if self.softcap and self.arch != "sm_90a":
            raise ValueError("softcap kernels exist on sm_90a only")
        if self.kind not in ("fwd", "combine"):
            raise ValueError(f"kind must be 'fwd' or 'combine', got {self.kind!r}")
        if (self.decode or self.kind == "combine") and self.arch != "sm_90a":
            raise ValueError("decode and combine kernels exist on sm_90a only")
        if self.wide and not self.decode:
            raise ValueError("wide is a variant of the decode kernels")
        if self.m128 and (self.head_dim not in TILES_M128.get(self.arch, {}) or self.decode):
            raise ValueError(f"m128 is the 128-row alternative of the prefill tiles "
                             f"{sorted(TILES_M128.get(self.arch, {}))} on {self.arch}")
        if self.long_kv and (not self.causal or self.decode or self.m128 or self.trace
                             or self.head_dim not in TILES_LONG_KV.get(self.arch, {})):
            raise ValueError(f"long_kv is the wide-n alternative of the causal prefill kernels "
                             f"{sorted(TILES_LONG_KV.get(self.arch, {}))} on {self.arch}")
        if self.fp8 and (self.fp8 not in FP8_MODES or self.wide or self.dtype != "bf16"
                         or self.head_dim not in FP8_DECODE_TILES):
            raise ValueError(f"fp8 must be one of {FP8_MODES}, on the bf16 64-row decode "
                             f"kernels of head dims {tuple(FP8_DECODE_TILES)}; got {self.fp8!r}")
        if self.fp8 and not self.decode and (
                self.fp8 != "qkv" or self.head_dim not in FP8_PREFILL_TILES or self.local
                or self.softcap or self.trace or self.scheduler != "steal" or self.m128
                or self.long_kv):
            raise ValueError(f"fp8 prefill kernels: fp8='qkv', head dims "
                             f"{tuple(FP8_PREFILL_TILES)}, full or causal, steal; got {self}")
        if self.scheduler not in SCHEDULERS_BY_ARCH[self.arch]:
            raise ValueError(f"scheduler must be one of {SCHEDULERS_BY_ARCH[self.arch]} on "
                             f"{self.arch}, got {self.scheduler!r}")

    @property
    def tile(self) -> Tile:
        """The tile of (arch, head_dim): TILES; DECODE_TILES / DECODE_WIDE_TILES for the
        decode kernels; TILES_M128 for ``m128``; TILES_LONG_KV for ``long_kv``; TILES_WIDE_N,
        where it has the head dim, for the non-causal, non-local kernels."""
        if self.fp8:
            return (FP8_DECODE_TILES if self.decode else FP8_PREFILL_TILES)[self.head_dim]
        if self.decode:
            return (DECODE_WIDE_TILES if self.wide else DECODE_TILES)[self.head_dim]
        if self.m128:
            return TILES_M128[self.arch][self.head_dim]
        if self.long_kv:
            return TILES_LONG_KV[self.arch][self.head_dim]
        wide_n = TILES_WIDE_N.get(self.arch, {}).get(self.head_dim)
        if wide_n and not (self.causal or self.local):
            return wide_n
        return TILES[self.arch][self.head_dim]

    @property
    def q_storage(self) -> str:
        """The element type of q in global memory: ``dtype``, or "e4m3"."""
        return "e4m3" if self.fp8 == "qkv" else self.dtype

    @property
    def kv_storage(self) -> str:
        """The element type of k and v in global memory: ``dtype``, or "e4m3"."""
        return "e4m3" if self.fp8 else self.dtype

    @property
    def threads(self) -> int:
        if self.kind == "combine":
            return COMBINE_THREADS
        return THREADS_BY_ARCH[self.arch] or 128 * (1 + self.tile.m // 64)

    @property
    def name(self) -> str:
        if self.kind == "combine":
            return f"combine_{self.arch}_{self.dtype}_hd{self.head_dim}"
        mask = "local" if self.local else ("causal" if self.causal else "full")
        t = self.tile
        name = (
            f"fwd_{self.arch}_{self.dtype}_hd{self.head_dim}_{mask}_{self.scheduler}"
            f"_m{t.m}n{t.n}s{t.kv_stages}"
        )
        name += "_softcap" if self.softcap else ""
        name += "_decode" if self.decode else ""
        name += f"_e4m3{self.fp8}" if self.fp8 else ""
        name += "_trace" if self.trace else ""
        return name

    @property
    def key(self) -> tuple:
        """What the runtime selects on (everything but the tile, which follows from it)."""
        return (self.arch, self.dtype, self.head_dim, self.causal, self.local, self.scheduler,
                self.trace, self.softcap, self.decode, self.wide, self.kind, self.m128,
                self.long_kv, self.fp8)

    def to_dict(self) -> dict:
        d = dataclasses.asdict(self)
        d["tile"] = dataclasses.asdict(self.tile)
        return d

    @staticmethod
    def from_dict(d: dict) -> "KernelConfig":
        fields = {f.name for f in dataclasses.fields(KernelConfig)}
        return KernelConfig(**{k: v for k, v in d.items() if k in fields})


def _space() -> Iterable[KernelConfig]:
    for arch in ARCHS:
        for dtype in DTYPES:
            for hd in TILES[arch]:
                masks = ([(False, False), (True, False)]
                         + ([(False, True)] if arch == "sm_90a" else []))
                for causal, local in masks:
                    for sched in SCHEDULERS_BY_ARCH[arch]:
                        yield KernelConfig(arch, dtype, hd, causal, sched, local=local)
                    if arch == "sm_90a":
                        # Soft-capped scores: steal ("auto") and single.
                        for sched in SOFTCAP_SCHEDULERS:
                            yield KernelConfig(arch, dtype, hd, causal, sched, local=local,
                                               softcap=True)
                    if hd in TILES_M128.get(arch, {}) and not local:
                        yield KernelConfig(arch, dtype, hd, causal, "steal", m128=True)
                    if hd in TILES_LONG_KV.get(arch, {}) and causal:
                        # Every scheduler: a call gets the same tile (the same bits) whichever
                        # scheduler runs it.
                        for sched in SCHEDULERS_BY_ARCH[arch]:
                            yield KernelConfig(arch, dtype, hd, causal, sched, long_kv=True)
                        for sched in SOFTCAP_SCHEDULERS if arch == "sm_90a" else ():
                            yield KernelConfig(arch, dtype, hd, causal, sched, softcap=True,
                                               long_kv=True)
    # Decode / short-query kernels (packed GQA + split-KV; softcap at run time) and the
    # split-KV combine.
    for dtype in DTYPES:
        for hd in DECODE_TILES:
            for causal, local in ((False, False), (True, False), (False, True)):
                for wide in (False, True):
                    yield KernelConfig("sm_90a", dtype, hd, causal, "steal", local=local,
                                       decode=True, wide=wide)
            yield KernelConfig("sm_90a", dtype, hd, False, "single", kind="combine")
    # FP8 prefill kernels (e4m3 q, k, v).
    for hd in FP8_PREFILL_TILES:
        for causal in (False, True):
            yield KernelConfig("sm_90a", "bf16", hd, causal, "steal", fp8="qkv")
    # FP8 decode kernels (e4m3 K/V; e4m3 q too), the 64-row tile: the serving decode step.
    for fp8 in FP8_MODES:
        for hd in FP8_DECODE_TILES:
            for causal, local in ((False, False), (True, False), (False, True)):
                yield KernelConfig("sm_90a", "bf16", hd, causal, "steal", local=local,
                                   decode=True, fp8=fp8)
    # Schedule-trace variants (record per tile: SM, CTA, start, end), not in the fast path.
    for sched in SCHEDULERS_BY_ARCH["sm_90a"]:
        yield KernelConfig("sm_90a", "bf16", 128, True, sched, trace=True)


CONFIG_SPACE: tuple[KernelConfig, ...] = tuple(_space())
