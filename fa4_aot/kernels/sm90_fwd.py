"""FlashAttention forward for sm_90a (Hopper), written in CuTe DSL for ahead-of-time builds.

CTA = one producer warpgroup + one MMA warpgroup per 64 rows of the m tile:

* warpgroup 0, the producer (24 registers after ``setmaxnreg``): warp 1 fetches tile indices
  (see ``tile_sched.py``; varlen: only the non-empty tiles, ``compact_to_dense``) and hands
  them to the others through shared-memory slots; warp 0 issues the TMA loads of Q (once per
  tile) and of K and V (one n-block at a time, ``kv_stages`` deep, each on its own
  ``PipelineTmaAsync``);
* the MMA warpgroups (240 registers): each owns 64 rows of the m tile. S = Q K^T with wgmma
  (both operands in shared memory), online softmax in registers, P converted to 16-bit in
  registers and O += P V with wgmma (A from registers).

Key blocks are visited from the last to the first, so the blocks that need the causal or
the sequence-end mask come first and the rest run unmasked.

Masks (compile time): full, causal (bottom-right aligned), local (sliding window
``[row + sk - sq - window_left, row + sk - sq + window_right]``). Variable-length batches are a
runtime mode (``seq_mode`` bit 1): q/k/v are packed (total, d, heads, 1) and each tile reads
its document's offsets from ``cu_seqlens_q/k``; ``seqused_q/k`` (bits 2 and 4) cut a batch
entry's rows/keys shorter. Offsets are clamped to the packed lengths, so malformed offsets
can give wrong rows but never a load or store outside q/k/v/out/lse.

Decode kernels (``cfg.decode``, one MMA warpgroup, 64-row tiles):

* packed GQA: the ``g = qhead_per_kvhead`` query heads of one KV head share an m tile; packed
  row ``R`` is query row ``R // g`` of head ``kv_head * g + R % g``. Tiles are counted per KV
  head, so K and V are read once per KV head. Q is loaded by the MMA warpgroup itself with
  plain 16-byte loads (the packed rows are not one TMA box);
* split-KV: a tile's key blocks are cut into ``num_splits`` contiguous ranges, one tile index
  each; with ``num_splits > 1`` every tile writes its normalised fp32 O and its LSE to the
  partial buffers and ``combine.py`` merges them;
* softcap is a runtime value (``softcap_pre != 0``).

Kernel parameters: ``fa4_aot/abi.py`` ``FWD_SM90`` (TMA descriptors + coordinate shapes for
Q, K, V, then the Ptrs, Strides, Shape and Softmax groups, each a NamedTuple generated from the
spec). Nothing about the device (SM count) is baked in.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import cutlass
import cutlass.cute as cute
import cutlass.pipeline as pipeline
import cutlass.utils.hopper_helpers as sm90_utils
from cutlass import Float32, Int32, Int64, Uint32
from cutlass._mlir.dialects import llvm
from cutlass.cutlass_dsl import T, dsl_user_op
from cutlass.cute.nvgpu import cpasync, warpgroup
from cutlass.tensor_utils import LayoutEnum

from fa4_aot.abi import FWD_SM90, KV_CHUNK
from fa4_aot.configs import KernelConfig
from fa4_aot.schedule import (decode_tile, encode_tile, heavy_m_blocks,
                               light_tiles_limit)

from .common import (CHAINS4, SEQ_COMPACT, SEQ_USED_Q, SEQ_VARLEN, TREE, BlockInfo, RowView, clamped_doc,
                     mask_row, online_softmax_row, seqlen_info, tree_reduce, warp_needs_rescale)
from .tile_sched import STATIC, TILE_SLOTS, AtomicCounterScheduler, TileSchedParams

_DTYPES = {"bf16": cutlass.BFloat16, "fp16": cutlass.Float16}
GROUPS = FWD_SM90.group_types()
# Tile.lazy_rescale: a row's running max moves only when a key block raises it by more than
# 2^8 (log2 units; docs/perf-notes.md v22).
RESCALE_THRESHOLD = 8.0
# Tile.lazy_reference: a tile whose P went above 2^100 somewhere is recomputed exactly (P past
# 2^128 overflows; an O of P * V sums past it too, and a reference factor below 2^-126 is
# flushed to 0).
LAZY_GUARD = 2.0 ** 100
Ptrs, Strides, Shape, Softmax, Redo = (GROUPS[n] for n in ("Ptrs", "Strides", "Shape", "Softmax",
                                                          "Redo"))



def _acc_mn_view(t: cute.Tensor) -> cute.Tensor:
    """View a wgmma accumulator fragment ((2,2,V),M,N) as (rows, cols) of this thread."""
    s, d = t.layout.shape, t.layout.stride
    layout = cute.make_layout(
        ((s[0][1], s[1]), (s[0][0], s[0][2], s[2])),
        stride=((d[0][1], d[1]), (d[0][0], d[0][2], d[2])),
    )
    return cute.make_tensor(t.iterator, layout)


def _acc_as_a_layout(acc_layout: cute.Layout) -> cute.Layout:
    """Register layout of a 16-bit wgmma A fragment covering the same values as a fp32
    accumulator fragment ((2,2,V),1,1): k16 blocks of (2,2,2) values, V/2 of them."""
    v = acc_layout.shape[0][2]
    return cute.make_layout(((2, 2, 2), 1, v // 2), stride=((1, 2, 4), 0, 8))


@dsl_user_op
def _cvt_pair_pinned(lo: Float32, hi: Float32, ptx_type: str, *, loc=None, ip=None) -> Uint32:
    """(lo, hi) fp32 -> one 32-bit word of two 16-bit values, as a side-effecting asm statement.

    Why not ``.to()``: LLVM sinks a plain conversion down to its use, the O += P V wgmma of the
    next loop iteration, so the 64 fp32 values of P stay live across the back edge next to the
    new S; at head_dim 128 ptxas then runs out of registers and serialises every wgmma (C7512).
    A side-effecting statement stays where it is written (after the wait for the previous PV)."""
    return Uint32(llvm.inline_asm(
        T.i32(),
        [Float32(hi).ir_value(loc=loc, ip=ip), Float32(lo).ir_value(loc=loc, ip=ip)],
        f"cvt.rn.{ptx_type}x2.f32 $0, $1, $2;",
        "=r,f,f",
        has_side_effects=True,
        is_align_stack=False,
        asm_dialect=llvm.AsmDialect.AD_ATT,
    ))


@dsl_user_op
def _asm_u32(args, code: str, cons: str, *, loc=None, ip=None) -> Uint32:
    """One pure asm statement over 32-bit integer registers (``Uint32(a)`` converts a
    float's value: pass bits, see :func:`_f32_bits`), 32-bit result."""
    return Uint32(llvm.inline_asm(
        T.i32(), [Uint32(a).ir_value(loc=loc, ip=ip) for a in args], code, cons,
        has_side_effects=False, is_align_stack=False, asm_dialect=llvm.AsmDialect.AD_ATT))


@dsl_user_op
def _asm_f32(args, code: str, cons: str, *, loc=None, ip=None) -> Float32:
    """:func:`_asm_u32` with a float result."""
    return Float32(llvm.inline_asm(
        T.f32(), [Uint32(a).ir_value(loc=loc, ip=ip) for a in args], code, cons,
        has_side_effects=False, is_align_stack=False, asm_dialect=llvm.AsmDialect.AD_ATT))


@dsl_user_op
def _f32_bits(x, *, loc=None, ip=None) -> Uint32:
    """The bits of a float (a bitcast: Uint32(x) would convert the value)."""
    return Uint32(llvm.bitcast(T.i32(), Float32(x).ir_value(loc=loc, ip=ip), loc=loc, ip=ip))


@dsl_user_op
def _bits_f32(x, *, loc=None, ip=None) -> Float32:
    return Float32(llvm.bitcast(T.f32(), Uint32(x).ir_value(loc=loc, ip=ip), loc=loc, ip=ip))


def _hmax2(a, b):
    """Per-half max of two packed bf16x2 words."""
    return _asm_u32([a, b], "max.bf16x2 $0, $1, $2;", "=r,r,r")


def _bf16_lo(w):
    """The low bf16 of a packed word, as a float (exact)."""
    return _asm_f32([w], "shl.b32 $0, $1, 16;", "=f,r")


def _bf16_hi(w):
    """The high bf16 of a packed word, as a float (exact)."""
    return _asm_f32([w], "and.b32 $0, $1, 0xffff0000;", "=f,r")


@dsl_user_op
def _tanh_approx(x: Float32, *, loc=None, ip=None) -> Float32:
    """tanh.approx.f32: one MUFU.TANH (the softcap kernels' only extra cost per score)."""
    return Float32(llvm.inline_asm(
        T.f32(), [Float32(x).ir_value(loc=loc, ip=ip)], "tanh.approx.f32 $0, $1;", "=f,f",
        has_side_effects=False, is_align_stack=False, asm_dialect=llvm.AsmDialect.AD_ATT))


@dsl_user_op
def _st_shared_u32(addr: Int32, v: Uint32, *, loc=None, ip=None) -> None:
    """One 32-bit word to shared memory (st.shared.b32)."""
    llvm.inline_asm(
        None, [Int32(addr).ir_value(loc=loc, ip=ip), Uint32(v).ir_value(loc=loc, ip=ip)],
        "st.shared.b32 [$0], $1;", "r,r",
        has_side_effects=True, is_align_stack=False, asm_dialect=llvm.AsmDialect.AD_ATT)


@dsl_user_op
def _ld_shared_v4(addr: Int32, *, loc=None, ip=None):
    """16 bytes from shared memory (one ld.shared.v4.b32), as four 32-bit words."""
    res = llvm.inline_asm(
        llvm.StructType.get_literal([T.i32()] * 4),
        [Int32(addr).ir_value(loc=loc, ip=ip)],
        "ld.shared.v4.b32 {$0, $1, $2, $3}, [$4];",
        "=r,=r,=r,=r,r",
        has_side_effects=True, is_align_stack=False, asm_dialect=llvm.AsmDialect.AD_ATT)
    return [llvm.extractvalue(T.i32(), res, [i]) for i in range(4)]


@dsl_user_op
def _st_global_v4(addr: Int64, words, *, loc=None, ip=None) -> None:
    """16 bytes to global memory (one st.global.v4.b32); ``addr`` 16-byte aligned."""
    llvm.inline_asm(
        None,
        [Int64(addr).ir_value(loc=loc, ip=ip)] + list(words),
        "st.global.v4.b32 [$0], {$1, $2, $3, $4};",
        "l,r,r,r,r",
        has_side_effects=True, is_align_stack=False, asm_dialect=llvm.AsmDialect.AD_ATT)


@dsl_user_op
def _opaque_u32(x: Int32, *, loc=None, ip=None) -> Int32:
    """``x`` through a side-effecting move: computed where it is written (the compiler can
    neither hoist it into the kernel's prologue nor share it with another warp role's code)."""
    return Int32(llvm.inline_asm(
        T.i32(), [Int32(x).ir_value(loc=loc, ip=ip)], "mov.b32 $0, $1;", "=r,r",
        has_side_effects=True, is_align_stack=False, asm_dialect=llvm.AsmDialect.AD_ATT))


@dsl_user_op
def _ld_global_v4(addr: Int64, *, loc=None, ip=None):
    """16 bytes from global memory (ld.global.nc.v4.b32), four 32-bit words."""
    res = llvm.inline_asm(
        llvm.StructType.get_literal([T.i32()] * 4),
        [Int64(addr).ir_value(loc=loc, ip=ip)],
        "ld.global.nc.v4.b32 {$0, $1, $2, $3}, [$4];",
        "=r,=r,=r,=r,l",
        has_side_effects=True, is_align_stack=False, asm_dialect=llvm.AsmDialect.AD_ATT)
    return [llvm.extractvalue(T.i32(), res, [i]) for i in range(4)]


@dsl_user_op
def _ld_global_u32(addr: Int64, *, loc=None, ip=None) -> Uint32:
    """4 bytes from global memory (ld.global.nc.b32)."""
    return Uint32(llvm.inline_asm(
        T.i32(), [Int64(addr).ir_value(loc=loc, ip=ip)], "ld.global.nc.b32 $0, [$1];", "=r,l",
        has_side_effects=True, is_align_stack=False, asm_dialect=llvm.AsmDialect.AD_ATT))


def _swizzled_offset(row, chunk, slab, rows: int, row_bytes: int):
    """Byte offset of 16-byte chunk ``chunk`` of column slab ``slab`` of row ``row`` in a
    K-major swizzled 16-bit buffer of ``rows`` rows whose swizzle atom rows are ``row_bytes``
    long (128: Swizzle<3,4,3>, head_dim a multiple of 64; 64: Swizzle<2,4,3>, head_dim 96): the
    layout ``sm90_utils.make_smem_layout_a`` gives Q (8-row atoms stacked along the rows, then
    the slabs; the swizzle on the byte address, bits 7.. into bits 4..)."""
    k = row_bytes // 16  # chunks per atom row
    return slab * (rows * row_bytes) + row * row_bytes + ((chunk ^ ((row * k // 8) % k)) * 16)


def _in_order(a, b):
    return a, b


def _swapped(a, b):
    return b, a


def _frag_row(tidx, r):
    """Row (inside the m tile) of row ``r`` (0 or 1) of a wgmma m64 accumulator held by
    consumer thread ``tidx``: warpgroup * 64 + warp * 16 + lane / 4 + 8 * r."""
    return (tidx // 128) * 64 + ((tidx % 128) // 32) * 16 + (tidx % 32) // 4 + 8 * r


def _frag_col_static(c: int) -> int:
    """Static part of the column of value ``c`` in an accumulator row (the thread adds
    2 * (lane % 4)): values come in pairs of adjacent columns, pairs 8 columns apart."""
    return (c // 2) * 8 + c % 2


# Frozen dataclasses: the DSL treats a frozen object that a loop body only reads (calls methods
# of its members) as read-only, instead of as a loop-carried value.
@dataclass(frozen=True, eq=False)
class _Tile:
    """What the warps know about the tile in hand (plain Python: built while tracing)."""

    m_block: object
    head: object
    batch: object
    split: object
    q_start: object
    k_start: object
    sq: object
    sk: object
    q_b: object  # batch coordinate of q (0 for packed documents)
    k_b: object  # batch coordinate of k/v (0 for packed documents)


@dataclass(frozen=True, eq=False)
class _Frags:
    """The MMA warpgroup's operands, accumulators and softmax state."""

    mma_qk: object
    mma_pv: object
    tSrQ: object
    tSrK: object
    tOrV: object
    acc_S: object
    acc_O: object
    tOrP: object
    tOrP_as_acc: object
    acc_S_mn: object
    acc_O_mn: object
    row_max: object
    row_sum: object
    row_scale: object
    # Tile.lazy_reference: per row, the reference of the next block's P (log2 units), the
    # factor from the previous reference to it, and the block's P sum.
    row_next: object = None
    row_pend: object = None
    row_tot: object = None
    # Tile.edge_width: (MMA op, accumulator) of S's wgmmas on a trimmed first block.
    edge: tuple = ()


class FlashFwdSm90:
    def __init__(self, cfg: KernelConfig):
        self.cfg = cfg
        self.dtype = _DTYPES[cfg.dtype]
        self.hd = cfg.head_dim
        self.tile_m = cfg.tile.m
        self.tile_n = cfg.tile.n
        self.kv_stages = cfg.tile.kv_stages
        self.q_stages = 1 if cfg.decode else cfg.tile.q_stages
        self.causal = cfg.causal
        # Compact varlen order: light tiles of a causal document above which they go in head
        # sections (schedule.light_tiles_limit).
        self.light_limit = light_tiles_limit(self.tile_m, self.hd, self.dtype.width // 8)
        self.local = cfg.local
        self.sched = cfg.scheduler
        self.trace = cfg.trace
        self.softcap = cfg.softcap
        self.decode = cfg.decode
        self.threads = cfg.threads
        self.num_mma_wg = self.tile_m // 64
        assert self.threads == 128 * (1 + self.num_mma_wg)
        # setmaxnreg moves registers inside the CTA's allocation (ptxas gives each thread
        # 64 K / threads, rounded down to 8): what the producer warpgroup gives up must cover
        # what the MMA warpgroups take (the build checks: inspect_cubin.register_budget_problem).
        # Two MMA warpgroups: 128 * (168 - 24) = 256 * (240 - 168). Three (192-row tiles): 128
        # each, the producer's 104 spread over 384 threads -> 160. One (the decode kernels, 256
        # threads): the producer, which also looks up pages, keeps 56.
        self.producer_regs = 56 if self.num_mma_wg == 1 else 24
        base = (65536 // self.threads) // 8 * 8
        spare = (base - self.producer_regs) // self.num_mma_wg
        self.mma_regs = min(240, (base + spare) // 8 * 8)
        self.binfo = BlockInfo(self.tile_m, self.tile_n, self.causal, self.local)
        self.intra_wg_overlap = cfg.tile.overlap
        self.pingpong = cfg.tile.pingpong and self.num_mma_wg >= 2
        self.rescale_early = cfg.tile.rescale_early and self.intra_wg_overlap
        self.reduction = CHAINS4 if cfg.tile.sum_chains else TREE
        self.rescale_threshold = RESCALE_THRESHOLD if cfg.tile.lazy_rescale else None
        # O written through this tile's Q buffer (free once the tile's last S wgmma is done;
        # released after the epilogue, so with one Q buffer the next tile's Q load waits for
        # it).
        self.staged_store = cfg.tile.staged_store and not self.decode
        # ... through a 64-row O buffer of its own that the MMA warpgroups take in turn
        # (``Tile.o_buffer``; the Q stage is then released before the epilogue).
        self.o_buffer = self.staged_store and cfg.tile.o_buffer
        # Q's swizzle atom rows: 128 bytes where head_dim is a multiple of 64, else 64 (hd96).
        self.q_row_bytes = 128 if self.hd % 64 == 0 else 64
        # Tile.edge_width: the width a tile's first key block is cut to where its rows see no
        # more of it (0: never). Not in the softcap kernels: with the second copy of the
        # mainloop the causal 176-key one spilled (36 bytes).
        self.edge_n = (cfg.tile.edge_width
                       if self.intra_wg_overlap and not self.decode and not self.softcap else 0)
        assert self.edge_n % 16 == 0 and self.edge_n < self.tile_n, cfg.tile
        # Tile.lazy_reference: bf16 P only (fp16 P overflows at 2^16, which a row sink's
        # usual margin reaches), prefill kernels without softcap; its exact path reads K/V
        # through k_ptr / v_ptr, contiguous (non-paged) layouts.
        self.lazy_ref = (cfg.tile.lazy_reference and cfg.dtype == "bf16" and self.intra_wg_overlap
                         and not self.decode and not self.softcap)
        if self.lazy_ref and self.sched == "single":
            # One tile a CTA through static's tile loop (the single kernel's grid is the tile
            # count: the next tile, bid + grid, ends it). Compiled as a loop that provably runs
            # once, with the exact recomputation after it, ptxas serialised its wgmmas (C7511,
            # docs/perf-notes.md v37).
            self.sched = STATIC

    # ------------------------------------------------------------------ static pieces
    def _mmas_and_layouts(self, kv_rows=None):
        dt = self.dtype
        kv_rows = kv_rows or self.tile_n
        qk_tiler = (self.tile_m, kv_rows, self.hd)
        pv_tiler = (self.tile_m, self.hd, kv_rows)
        mma_qk = sm90_utils.make_trivial_tiled_mma(
            dt, dt, warpgroup.OperandMajorMode.K, warpgroup.OperandMajorMode.K, Float32,
            (self.num_mma_wg, 1, 1), (64, self.tile_n),
        )
        mma_pv = sm90_utils.make_trivial_tiled_mma(
            dt, dt, warpgroup.OperandMajorMode.K, warpgroup.OperandMajorMode.MN, Float32,
            (self.num_mma_wg, 1, 1), (64, self.hd), warpgroup.OperandSource.RMEM,
        )
        sQ = sm90_utils.make_smem_layout_a(LayoutEnum.ROW_MAJOR, qk_tiler, dt, self.q_stages)
        stages = self.kv_stages if kv_rows == self.tile_n else 1
        sK = sm90_utils.make_smem_layout_b(LayoutEnum.ROW_MAJOR, qk_tiler, dt, stages)
        sV = sm90_utils.make_smem_layout_b(LayoutEnum.COL_MAJOR, pv_tiler, dt, stages)
        return mma_qk, mma_pv, sQ, sK, sV

    # ------------------------------------------------------------------ host side (trace only)
    @cute.jit
    def __call__(
        self,
        mQ: cute.Tensor,  # (seqlen_q, d, heads, batch)
        mK: cute.Tensor,  # (seqlen_k, d, kv_heads, batch)
        mV: cute.Tensor,  # (seqlen_k, d, kv_heads, batch)
        ptrs: Ptrs,
        strides: Strides,
        shape: Shape,
        softmax: Softmax,
        redo: Redo,
        stream,
    ):
        dt = self.dtype
        _, _, sQ_layout, sK_layout, sV_layout = self._mmas_and_layouts()
        # V seen as (d, seqlen_k, kv_heads, batch): the MN-major B operand of O += P V.
        mVt = cute.make_tensor(
            mV.iterator,
            cute.make_layout(
                (mV.shape[1], mV.shape[0], mV.shape[2], mV.shape[3]),
                stride=(mV.stride[1], mV.stride[0], mV.stride[2], mV.stride[3]),
            ),
        )
        g2s = cpasync.CopyBulkTensorTileG2SOp()
        tma_q, tQ = cpasync.make_tiled_tma_atom(
            g2s, mQ, cute.slice_(sQ_layout, (None, None, 0)), (self.tile_m, self.hd))
        kv_rows = KV_CHUNK if self.decode else self.tile_n  # decode: chunked (paged) loads
        _, _, _, sK_box, sV_box = self._mmas_and_layouts(kv_rows)
        tma_k, tK = cpasync.make_tiled_tma_atom(
            g2s, mK, cute.slice_(sK_box, (None, None, 0)), (kv_rows, self.hd))
        tma_v, tV = cpasync.make_tiled_tma_atom(
            g2s, mVt, cute.slice_(sV_box, (None, None, 0)), (self.hd, kv_rows))
        self.q_bytes = cute.size_in_bytes(dt, cute.slice_(sQ_layout, (None, None, 0)))
        self.kv_bytes = cute.size_in_bytes(dt, cute.slice_(sK_layout, (None, None, 0)))

        @cute.struct
        class SharedStorage:
            mbar_q: cute.struct.MemRange[cutlass.Int64, 2 * self.q_stages]
            mbar_k: cute.struct.MemRange[cutlass.Int64, 2 * self.kv_stages]
            mbar_v: cute.struct.MemRange[cutlass.Int64, 2 * self.kv_stages]
            mbar_tile: cute.struct.MemRange[cutlass.Int64, 2 * TILE_SLOTS]
            # Per slot: the tile index and its (m_block, head, batch, split), decoded once by
            # the warp that fetched it (the readers do no division).
            # ... then (prefill kernels) an mbarrier the producer warp arrives on once a
            # tile's loads are issued (issued_barrier), 8-byte aligned after the slots.
            tile_slot: cute.struct.MemRange[Int32, 8 * TILE_SLOTS + 2]
            sQ: cute.struct.Align[cute.struct.MemRange[dt, cute.cosize(sQ_layout)], 1024]
            sK: cute.struct.Align[cute.struct.MemRange[dt, cute.cosize(sK_layout)], 1024]
            sV: cute.struct.Align[cute.struct.MemRange[dt, cute.cosize(sV_layout)], 1024]
            if cutlass.const_expr(self.o_buffer):
                # The O buffer (64 rows, Q's swizzled layout) and its hand-over: warpgroup w
                # writes once mbar_o[w] completes, and arrives on mbar_o[w + 1] when done.
                mbar_o: cute.struct.MemRange[cutlass.Int64, self.num_mma_wg]
                sO: cute.struct.Align[cute.struct.MemRange[dt, 64 * self.hd], 1024]

        self.shared_storage = SharedStorage
        # 227 KB per CTA on sm_90a: a tile whose buffers exceed it would build but not launch.
        size = SharedStorage.size_in_bytes()
        assert size <= 227 * 1024, f"{self.cfg.name}: shared storage of {size} B > 227 KB"

        self.kernel(tma_q, tQ, tma_k, tK, tma_v, tV, ptrs, strides, shape, softmax, redo).launch(
            grid=[1, 1, 1],  # the runtime sets the grid
            block=[self.threads, 1, 1],
            stream=stream,
            min_blocks_per_mp=1,
        )

    # ------------------------------------------------------------------ device side
    @cute.kernel
    def kernel(self, tma_q: cute.CopyAtom, tQ: cute.Tensor, tma_k: cute.CopyAtom,
               tK: cute.Tensor, tma_v: cute.CopyAtom, tV: cute.Tensor,
               ptrs: Ptrs, strides: Strides, shape: Shape, softmax: Softmax, redo: Redo):
        tidx, _, _ = cute.arch.thread_idx()
        warp_idx = cute.arch.make_warp_uniform(cute.arch.warp_idx())
        wg_idx = warp_idx // 4
        mma_qk, mma_pv, sQ_layout, sK_layout, sV_layout = self._mmas_and_layouts()

        smem = cutlass.utils.SmemAllocator()
        storage = smem.allocate(self.shared_storage)

        producer_one = pipeline.CooperativeGroup(pipeline.Agent.Thread, 1)
        consumer_warps = pipeline.CooperativeGroup(pipeline.Agent.Thread, 4 * self.num_mma_wg)
        pipe_q = pipeline.PipelineTmaAsync.create(
            barrier_storage=storage.mbar_q.data_ptr(), num_stages=self.q_stages,
            producer_group=producer_one, consumer_group=consumer_warps,
            tx_count=self.q_bytes, defer_sync=True,
        )
        pipe_k = pipeline.PipelineTmaAsync.create(
            barrier_storage=storage.mbar_k.data_ptr(), num_stages=self.kv_stages,
            producer_group=producer_one, consumer_group=consumer_warps,
            tx_count=self.kv_bytes, defer_sync=True,
        )
        pipe_v = pipeline.PipelineTmaAsync.create(
            barrier_storage=storage.mbar_v.data_ptr(), num_stages=self.kv_stages,
            producer_group=producer_one, consumer_group=consumer_warps,
            tx_count=self.kv_bytes, defer_sync=True,
        )
        pipe_tile = pipeline.PipelineAsync.create(
            barrier_storage=storage.mbar_tile.data_ptr(), num_stages=TILE_SLOTS,
            producer_group=pipeline.CooperativeGroup(pipeline.Agent.Thread, 32),
            consumer_group=pipeline.CooperativeGroup(
                pipeline.Agent.Thread, 128 * self.num_mma_wg + (0 if self.decode else 32)),
            defer_sync=True,
        )
        if cutlass.const_expr(not self.decode):
            if tidx == 0:
                cute.arch.mbarrier_init(self.issued_barrier(
                    storage.tile_slot.get_tensor(cute.make_layout((8, TILE_SLOTS)))), 1)
                if cutlass.const_expr(self.o_buffer):
                    for w in cutlass.range_constexpr(self.num_mma_wg):
                        cute.arch.mbarrier_init(storage.mbar_o.data_ptr() + w, 128)
        cute.arch.mbarrier_init_fence()
        cute.arch.sync_threads()

        sQ = storage.sQ.get_tensor(sQ_layout.outer, swizzle=sQ_layout.inner)
        sK = storage.sK.get_tensor(sK_layout.outer, swizzle=sK_layout.inner)
        sV = storage.sV.get_tensor(sV_layout.outer, swizzle=sV_layout.inner)
        slots = storage.tile_slot.get_tensor(cute.make_layout((8, TILE_SLOTS)))
        # Packed lengths (the TMA coordinate shapes): varlen offsets are clamped to them.
        totals = (tQ.shape[0], tK.shape[0])
        pipes = (pipe_q, pipe_k, pipe_v, pipe_tile)

        if wg_idx == 0:
            cute.arch.setmaxregister_decrease(self.producer_regs)
            if warp_idx == 0:
                self.producer((tma_q, tQ, tma_k, tK, tma_v, tV), (sQ, sK, sV, slots), pipes,
                              ptrs, strides, shape, totals)
            elif warp_idx == 1:
                if cutlass.const_expr(not self.decode):
                    self.tile_fetcher(slots, pipe_tile, ptrs, shape, totals)
        else:
            cute.arch.setmaxregister_increase(self.mma_regs)
            o_buf = None
            if cutlass.const_expr(self.o_buffer):
                o_buf = (storage.sO.data_ptr().toint(), storage.mbar_o.data_ptr())
            self.consumer(tidx - 128, (mma_qk, mma_pv), (sQ, sK, sV, slots), pipes,
                          ptrs, strides, shape, softmax, redo, totals, o_buf)

    # ------------------------------------------------------------------ tiles
    @cute.jit
    def tile_coords(self, tile, shape: Shape):
        """Tile index -> (m_block, head, batch, split). With packed GQA ``head`` is the KV
        head; the split index is folded into the batch index (batch-major)."""
        if cutlass.const_expr(self.decode):
            m_block, head, bs = decode_tile(tile, shape.num_m_blocks,
                                            shape.num_heads // shape.qhead_per_kvhead,
                                            shape.section)
            batch = bs // shape.num_splits
            return m_block, head, batch, bs - batch * shape.num_splits
        m_block, head, batch = decode_tile(tile, shape.num_m_blocks, shape.num_heads,
                                           shape.section)
        return m_block, head, batch, Int32(0)

    def tile_info(self, coords, ptrs: Ptrs, shape: Shape, totals) -> _Tile:
        """The tile of coordinates (m_block, head, batch, split) (:meth:`tile_coords`)."""
        return _Tile(*coords, *seqlen_info(coords[2], shape, ptrs, totals,
                                           separate_kv=self.decode))

    @cute.jit
    def hand_over(self, pipe_tile, tile_state, slots, tile, shape: Shape):
        """Writer warp: the next slot (``tile_state``, not advanced here) <- the tile index and,
        for a tile in range, its coordinates; returns them (garbage past the end)."""
        pipe_tile.producer_acquire(tile_state)
        coords = (Int32(0), Int32(0), Int32(0), Int32(0))
        if tile < shape.num_tiles:
            coords = self.tile_coords(tile, shape)
        if cute.arch.lane_idx() == 0:
            slots[0, tile_state.index] = tile
            for k in cutlass.range_constexpr(4):
                slots[1 + k, tile_state.index] = coords[k]
        pipe_tile.producer_commit(tile_state)
        return coords

    def issued_barrier(self, slots):
        """The mbarrier after the tile slots (prefill kernels): one arrival per tile whose loads
        the producer warp has issued."""
        return cute.recast_ptr(slots.iterator + 8 * TILE_SLOTS, dtype=Int64)

    def get_tile(self, slots, idx):
        """Reader: (tile index, coordinates) from slot ``idx``."""
        return slots[0, idx], tuple(slots[1 + k, idx] for k in range(4))

    def rows_of(self, t: _Tile, shape: Shape):
        """Rows of the tile's (head, batch) pair: query rows, times the group with packed GQA."""
        if cutlass.const_expr(self.decode):
            return t.sq * shape.qhead_per_kvhead
        return t.sq

    @cute.jit
    def seq_rows(self, row0, shape: Shape):
        """First and last query row of the tile's m-block (packed rows / group)."""
        if cutlass.const_expr(self.decode):
            return row0 // shape.qhead_per_kvhead, (row0 + self.tile_m - 1) // shape.qhead_per_kvhead
        return row0, row0 + self.tile_m - 1

    @cute.jit
    def n_block_range(self, t: _Tile, shape: Shape):
        """[n_min, n_max): the key blocks the tile sees (mask: full, causal or local; with
        split-KV, the tile's split of them)."""
        s_lo, s_hi = self.seq_rows(t.m_block * self.tile_m, shape)
        n_min, n_max = self.binfo.n_block_range(t.m_block, t.sq, t.sk, shape.window_left,
                                                shape.window_right, s_lo, s_hi)
        if cutlass.const_expr(self.decode):
            per = (n_max - n_min + shape.num_splits - 1) // shape.num_splits
            n_min = cutlass.min(n_min + t.split * per, n_max)
            n_max = cutlass.min(n_min + per, n_max)
        return n_min, n_max

    # ------------------------------------------------------------------ producer warp
    @cute.jit
    def producer(self, tma, smem, pipes, ptrs: Ptrs, strides: Strides, shape: Shape, totals):
        tma_q, tQ, tma_k, tK, tma_v, tV = tma
        sQ, sK, sV, slots = smem
        pipe_q, pipe_k, pipe_v, pipe_tile = pipes
        cpasync.prefetch_descriptor(tma_k)
        cpasync.prefetch_descriptor(tma_v)
        if cutlass.const_expr(not self.decode):
            cpasync.prefetch_descriptor(tma_q)
        q_state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Producer,
                                               self.q_stages)
        kv_state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Producer, self.kv_stages)
        # Prefill kernels: the tiles come from the fetcher warp. Decode kernels: this warp
        # fetches them itself and hands them on (after issuing a tile's loads, so the fetch's
        # latency stays hidden; no compact varlen order there).
        if cutlass.const_expr(self.decode):
            tile_state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Producer,
                                                      TILE_SLOTS)
            sched = self.scheduler(ptrs, shape)
            tile = sched.first()
        else:
            tile_state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Consumer,
                                                      TILE_SLOTS)
            tile = Int32(0)  # read from the slots at the top of every iteration
        running = cutlass.Boolean(True)
        while running:
            if cutlass.const_expr(self.decode):
                if shape.seq_mode & SEQ_VARLEN != 0:
                    tile = self.skip_empty_tiles(tile, ptrs, shape)
                coords = self.hand_over(pipe_tile, tile_state, slots, tile, shape)
            else:
                pipe_tile.consumer_wait(tile_state)
                tile, coords = self.get_tile(slots, tile_state.index)
                pipe_tile.consumer_release(tile_state)
            tile_state.advance()
            if tile >= shape.num_tiles:
                running = False
            else:
                t = self.tile_info(coords, ptrs, shape, totals)
                kv_head = t.head
                if cutlass.const_expr(not self.decode):
                    kv_head = t.head // shape.qhead_per_kvhead
                valid = t.m_block * self.tile_m < self.rows_of(t, shape)

                if cutlass.const_expr(not self.decode):  # decode: the MMA warpgroups load Q
                    # varlen: shift the coordinate tensor to the document's first row.
                    gQ = cute.local_tile(
                        cute.domain_offset((t.q_start, 0), tQ[None, None, t.head, t.q_b]),
                        (self.tile_m, self.hd), (t.m_block, 0))
                    tQs, tQg = cpasync.tma_partition(
                        tma_q, 0, cute.make_layout(1),
                        cute.group_modes(sQ, 0, 2), cute.group_modes(gQ, 0, 2))
                    if valid:
                        pipe_q.producer_acquire(q_state)
                        cute.copy(tma_q, tQg, tQs[None, q_state.index],
                                  tma_bar_ptr=pipe_q.producer_get_barrier(q_state))
                        q_state.advance()

                n_min, n_max = self.n_block_range(t, shape)
                if not valid:
                    n_max = n_min
                if cutlass.const_expr(self.decode):
                    # Paged KV: lane c holds the page and the row of box c of a block, looked
                    # up one block ahead (the table read's latency stays off the issue path);
                    # K and V share them.
                    page_nxt, row_nxt = self.block_pages(n_max - 1, t, ptrs, strides, shape)
                    for i in cutlass.range(n_max - n_min, unroll=1):
                        n_block = n_max - 1 - i
                        page = (page_nxt, row_nxt)
                        page_nxt, row_nxt = self.block_pages(n_block - 1, t, ptrs, strides,
                                                             shape)
                        loads = ((tma_k, tK, sK, pipe_k.producer_get_barrier(kv_state)),
                                 (tma_v, tV, sV, pipe_v.producer_get_barrier(kv_state)))
                        where = (n_block, kv_state.index, t, kv_head, page, shape)
                        if self.merged_kv_loads(shape):
                            pipe_k.producer_acquire(kv_state)
                            pipe_v.producer_acquire(kv_state)
                            self.load_kv_boxes(loads, (True, True), where)
                        else:
                            pipe_k.producer_acquire(kv_state)
                            self.load_kv_boxes(loads, (True, False), where)
                            pipe_v.producer_acquire(kv_state)
                            self.load_kv_boxes(loads, (False, True), where)
                        kv_state.advance()
                else:
                    gK = cute.local_tile(
                        cute.domain_offset((t.k_start, 0), tK[None, None, kv_head, t.k_b]),
                        (self.tile_n, self.hd), (None, 0))
                    tKs, tKg = cpasync.tma_partition(
                        tma_k, 0, cute.make_layout(1),
                        cute.group_modes(sK, 0, 2), cute.group_modes(gK, 0, 2))
                    gV = cute.local_tile(
                        cute.domain_offset((0, t.k_start), tV[None, None, kv_head, t.k_b]),
                        (self.hd, self.tile_n), (0, None))
                    tVs, tVg = cpasync.tma_partition(
                        tma_v, 0, cute.make_layout(1),
                        cute.group_modes(sV, 0, 2), cute.group_modes(gV, 0, 2))
                    for i in cutlass.range(n_max - n_min, unroll=1):
                        n_block = n_max - 1 - i
                        pipe_k.producer_acquire(kv_state)
                        cute.copy(tma_k, tKg[None, n_block], tKs[None, kv_state.index],
                                  tma_bar_ptr=pipe_k.producer_get_barrier(kv_state))
                        pipe_v.producer_acquire(kv_state)
                        cute.copy(tma_v, tVg[None, n_block], tVs[None, kv_state.index],
                                  tma_bar_ptr=pipe_v.producer_get_barrier(kv_state))
                        kv_state.advance()
                if cutlass.const_expr(self.decode):
                    # The next tile, once this tile's loads are issued: the consumers are still
                    # kv_stages blocks behind, so the atomic's latency stays hidden.
                    tile, _ = sched.next(tile)
                elif cute.arch.lane_idx() == 0:
                    # This tile's loads are issued: the fetcher may take the next one.
                    cute.arch.mbarrier_arrive(self.issued_barrier(slots))

    def scheduler(self, ptrs: Ptrs, shape: Shape, num_tiles=None) -> AtomicCounterScheduler:
        """The tile scheduler over ``num_tiles`` indices (default: the launch's tiles)."""
        return AtomicCounterScheduler(
            self.sched, TileSchedParams(shape.num_m_blocks, shape.section,
                                        shape.num_tiles if num_tiles is None else num_tiles),
            ptrs.sched_ptr)

    def compact(self, shape: Shape):
        """Whether the launch counts varlen tiles compactly (seq_mode bit 16; prefill kernels).
        Read from the parameter each time: the producer keeps no register for it."""
        if cutlass.const_expr(self.decode):
            return False
        return shape.seq_mode & SEQ_COMPACT != 0

    def num_docs(self, shape: Shape):
        """Documents of a varlen prefill launch (its tiles are m-blocks x heads x documents)."""
        return shape.num_tiles // (shape.num_m_blocks * shape.num_heads)

    @cute.jit
    def doc_m_blocks(self, d, ptrs: Ptrs, shape: Shape, totals):
        """m-blocks of document ``d`` of a varlen prefill launch (0 past the last document):
        its rows as the consumers see them (offsets clamped, seqused_q applied)."""
        nb = Int32(0)
        if d < self.num_docs(shape):
            _, rows = clamped_doc(ptrs.cu_seqlens_q, d, totals[0])
            if shape.seq_mode & SEQ_USED_Q != 0:
                rows = cutlass.min(rows, cutlass.max(cute.make_tensor(
                    ptrs.seqused_q + d, cute.make_layout(1))[0], Int32(0)))
            nb = (rows + self.tile_m - 1) // self.tile_m
        return nb

    @cute.jit
    def compact_total(self, ptrs: Ptrs, shape: Shape, totals):
        """Non-empty tiles of a varlen launch: heads x the documents' m-blocks (warp-wide:
        lane l sums documents l, l + 32, ...)."""
        s = Int32(0)
        for i in cutlass.range((self.num_docs(shape) + 31) // 32, unroll=1):
            s = s + self.doc_m_blocks(i * 32 + cute.arch.lane_idx(), ptrs, shape, totals)
        for off in (16, 8, 4, 2, 1):
            s = s + cute.arch.shuffle_sync_bfly(s, offset=off)
        return s * shape.num_heads

    @cute.jit
    def compact_to_dense(self, c, total, doc, doc_base, nb, ptrs: Ptrs, shape: Shape, totals):
        """Compact index ``c`` -> (tile index, document, its first compact index, its m-blocks
        ``nb``); the tile index is ``shape.num_tiles`` (stop) when ``c >= total``. The order
        (schedule.compact_tiles): documents in turn; inside a document its heavy m-blocks
        (schedule.heavy_m_blocks: all, or the upper half under a causal mask) with its heads in
        groups of ``shape.section`` (a divisor of num_heads on compact launches), each group's
        m-blocks from the last down, the group's heads together; then the other m-blocks the
        same way, in groups of ``shape.section`` if there are more than ``light_limit`` such
        tiles (schedule.light_tiles_limit), else all heads in one. The walk starts at the cursor
        ``doc`` (whose m-blocks ``nb`` the previous call returned): this CTA's indices only
        grow, so over the launch it reads each document's offsets about once."""
        dense = shape.num_tiles
        if cutlass.const_expr(self.sched == STATIC):
            # Read again: a register carried across the static fetcher's loop spills there.
            nb = self.doc_m_blocks(doc, ptrs, shape, totals)
        if c < total:
            while c >= doc_base + nb * shape.num_heads:
                doc_base = doc_base + nb * shape.num_heads
                doc = doc + 1
                nb = self.doc_m_blocks(doc, ptrs, shape, totals)
            r = c - doc_base
            heavy = heavy_m_blocks(nb, self.causal)
            # The part of the document r falls in: its first m-block (from the last), its
            # m-blocks, the heads of a group.
            m_base, span, sec = Int32(0), heavy, shape.section
            if r >= heavy * shape.num_heads:
                r = r - heavy * shape.num_heads
                m_base = heavy
                span = nb - heavy
                if span * shape.num_heads <= self.light_limit:
                    sec = shape.num_heads
            group = r // (span * sec)
            r = r - group * (span * sec)
            m_rev = r // sec
            head = group * sec + r - m_rev * sec
            dense = encode_tile(nb - 1 - m_base - m_rev, head, doc, shape.num_m_blocks,
                                shape.num_heads, shape.section)
        return dense, doc, doc_base, nb

    @cute.jit
    def tile_fetcher(self, slots, pipe_tile, ptrs: Ptrs, shape: Shape, totals):
        """Warp 1 of the producer warpgroup: takes tile indices from the scheduler and hands
        them to the producer warp and the MMA warpgroups through the tile slots; the last one
        handed over is out of range (stop). Varlen launches with seq_mode bit 16 (prefill
        kernels, mostly empty grids) count only the ``total`` non-empty m-blocks: each index
        becomes the tile index the others decode (compact_to_dense). Other varlen launches
        skip the m-blocks past a document's end (skip_empty_tiles). A warp of its own: the
        producer warp has no registers to spare for this."""
        tile_state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Producer,
                                                  TILE_SLOTS)
        total = shape.num_tiles
        if self.compact(shape):
            total = self.compact_total(ptrs, shape, totals)
        sched = self.scheduler(ptrs, shape, total)
        c = sched.first()
        if self.compact(shape):
            if c >= total:  # every CTA makes its one fetch past the end (counter reset)
                c, _ = sched.next(c)
        doc, doc_base, nb = Int32(0), Int32(0), Int32(0)
        if self.compact(shape):
            nb = self.doc_m_blocks(doc, ptrs, shape, totals)
        issued_phase = Int32(0)
        running = cutlass.Boolean(True)
        while running:
            tile = c
            if self.compact(shape):
                tile, doc, doc_base, nb = self.compact_to_dense(c, total, doc, doc_base, nb, ptrs,
                                                                shape, totals)
            elif shape.seq_mode & SEQ_VARLEN != 0:
                tile = self.skip_empty_tiles(c, ptrs, shape)
                c = tile
            self.hand_over(pipe_tile, tile_state, slots, tile, shape)
            tile_state.advance()
            if tile >= shape.num_tiles:
                running = False
            else:
                # Take the next tile once the producer warp has issued this one's loads: the
                # CTA claims one tile ahead. Claiming two ahead (free slots permitting) cost
                # causal 8k hd128 5 % (docs/perf-notes.md v12), and on the compact order,
                # whose head sections restart at the heaviest m-block, a long tail (v21).
                cute.arch.mbarrier_wait(self.issued_barrier(slots), issued_phase)
                issued_phase = issued_phase ^ 1
                c, _ = sched.next(c)

    @cute.jit
    def block_pages(self, n_block, t: _Tile, ptrs: Ptrs, strides: Strides, shape: Shape):
        """Paged KV: lane ``c`` of the producer warp gets (page, row in the page) of TMA box
        ``c`` (``kv_box_rows`` keys) of key block ``n_block``: ``page_table[batch, key //
        page_size]``, ``key % page_size`` (the column clamped into the table; a page index
        outside the cache makes TMA fill zeros, never read outside k/v). Contiguous K/V:
        (``k_b``, 0)."""
        page = t.k_b
        row = Int32(0)
        if shape.page_size != 0:
            c = cutlass.min(cute.arch.lane_idx(), Int32(self.tile_n) // shape.kv_box_rows - 1)
            key = cutlass.max(n_block * self.tile_n + c * shape.kv_box_rows, Int32(0))
            col = key // shape.page_size
            row = key - col * shape.page_size
            col = cutlass.min(col, shape.pages_per_seq - 1)
            page = cute.make_tensor(
                ptrs.page_table + (Int64(t.batch) * strides.page_table_stride + Int64(col)),
                cute.make_layout(1))[0]
        return page, row

    def merged_kv_loads(self, shape: Shape):
        """Paged KV in the decode kernels with 3+ stages: one pass over the boxes for K and V
        (one page shuffle and one set of coordinates per box instead of two), both stages
        acquired first. The producer warp's issue rate was the limit: 64-row kernels, page 16
        decode 277 -> 254 us (docs/perf-notes.md v11); 128-row kernels (3 stages since v13),
        chunked prefill page 16 +42 %, page 32 +18 % (v13). With 2 stages waiting for the V
        slot (released a block later than K's) before issuing K cost the chunked prefill 23 %
        (v11), so 2-stage kernels issue K and V in separate passes."""
        if cutlass.const_expr(self.kv_stages >= 3):
            return shape.page_size != 0
        return False

    @cute.jit
    def load_kv_boxes(self, loads, which: cutlass.Constexpr, where):
        """Decode kernels: key block ``n_block`` of K and/or V (``which``) in TMA boxes of
        ``kv_box_rows`` keys (one box per block for contiguous K/V; with paged KV boxes that
        never cross a page), each from its own place: contiguous rows ``k_start + key`` of
        batch entry ``k_b``, or with paged KV (``page_size != 0``) the (page, row) that lane
        ``c`` of ``pages`` holds for box ``c`` (:meth:`block_pages`). The stage is laid out in
        KV_CHUNK-key pieces, each swizzle panel holding all keys of the block, so a box of
        kv_box_rows keys issued at piece ``c * kv_box_rows / KV_CHUNK`` fills exactly its
        pieces (the descriptor's box sets the rows moved; the instruction names only its first
        piece)."""
        n_block, stage, t, kv_head, (pages, rows), shape = where
        box = shape.kv_box_rows
        step = box // KV_CHUNK
        for c in cutlass.range(Int32(self.tile_n) // box, unroll=1):
            row = t.k_start + n_block * self.tile_n + c * box
            page = pages
            if shape.page_size != 0:
                row = cute.arch.shuffle_sync(rows, c)
                page = cute.arch.shuffle_sync(pages, c)
            for is_v in cutlass.range_constexpr(2):
                if cutlass.const_expr(which[is_v]):
                    tma, tX, sX, bar = loads[is_v]
                    # K is (keys, d); V is seen as (d, keys): the same box, coordinates swapped.
                    kd = _swapped if is_v == 1 else _in_order
                    g = cute.local_tile(
                        cute.domain_offset(kd(row, 0), tX[None, None, kv_head, page]),
                        kd(KV_CHUNK, self.hd), (0, 0))
                    sc = cute.local_tile(sX[None, None, stage], kd(KV_CHUNK, self.hd),
                                         kd(c * step, 0))
                    ts, tg = cpasync.tma_partition(tma, 0, cute.make_layout(1),
                                                   cute.group_modes(sc, 0, 2),
                                                   cute.group_modes(g, 0, 2))
                    cute.copy(tma, tg, ts, tma_bar_ptr=bar)

    @cute.jit
    def skip_empty_tiles(self, tile, ptrs: Ptrs, shape: Shape):
        """varlen: the grid covers the m-blocks of max_seqlen_q for every document, so the
        m-blocks past a shorter document's end hold no rows. The fetcher warp fetches past them
        here instead of handing them on, so their fetches overlap the current tile. (A cheap
        test on cu_seqlens_q only: the consumers skip whatever else turns out empty.)"""
        sched = self.scheduler(ptrs, shape)
        empty = tile < shape.num_tiles
        while empty:
            m_block, head, batch, split = self.tile_coords(tile, shape)
            cq = cute.make_tensor(ptrs.cu_seqlens_q + batch, cute.make_layout(2))
            rows = cq[1] - cq[0]
            if cutlass.const_expr(self.decode):
                rows = rows * shape.qhead_per_kvhead
            if m_block * self.tile_m < rows:
                empty = False
            else:
                tile, _ = sched.next(tile)
                empty = tile < shape.num_tiles
        return tile

    # ------------------------------------------------------------------ MMA warpgroups
    @cute.jit
    def consumer(self, tidx, mmas, smem, pipes, ptrs: Ptrs, strides: Strides, shape: Shape,
                 softmax: Softmax, redo: Redo, totals, o_buf=None):
        """Per n-block, with intra-warpgroup overlap: issue S(n) = Q K(n)^T and O += P(n+1) V(n+1)
        back to back, run the softmax of S(n) while the PV wgmma runs, then rescale O.
        With two or three MMA warpgroups they take turns issuing (ping-pong, round robin through
        named barriers), so one's softmax overlaps the others' tensor-core work. ``o_buf``
        (``Tile.o_buffer``): (shared address of the O buffer, its hand-over mbarriers)."""
        mma_qk, mma_pv = mmas
        sQ, sK, sV, slots = smem
        pipe_q, pipe_k, pipe_v, pipe_tile = pipes
        # The wgmma operands (shared-memory descriptors) are the same for every thread of a
        # warpgroup: partitioned by the warp-uniform warpgroup index, so that ptxas keeps the
        # descriptors in uniform registers (partitioned by tidx, every wgmma of the loop
        # recomputed its descriptor in vector registers and moved it over: docs/perf-notes.md v14).
        wg = self.mma_wg(tidx)
        wg_threads = cute.make_layout(self.num_mma_wg, stride=128)
        thr_qk = mma_qk.get_slice(wg_threads(wg))
        thr_pv = mma_pv.get_slice(wg_threads(wg))
        acc_S = thr_qk.make_fragment_C(thr_qk.partition_shape_C((self.tile_m, self.tile_n)))
        acc_O = thr_pv.make_fragment_C(thr_pv.partition_shape_C((self.tile_m, self.hd)))
        tOrP = cute.make_rmem_tensor(_acc_as_a_layout(acc_S.layout), self.dtype)
        # Coordinates of the accumulator values are computed from tidx where needed (an
        # identity-tensor partition gets hoisted into ~100 live registers and spills).
        acc_S_mn = _acc_mn_view(acc_S)
        n_rows = cute.size(acc_S_mn, mode=[0])
        f = _Frags(
            mma_qk=mma_qk, mma_pv=mma_pv,
            tSrQ=thr_qk.make_fragment_A(thr_qk.partition_A(sQ)),
            tSrK=thr_qk.make_fragment_B(thr_qk.partition_B(sK)),
            tOrV=thr_pv.make_fragment_B(thr_pv.partition_B(sV)),
            acc_S=acc_S, acc_O=acc_O, tOrP=tOrP,
            tOrP_as_acc=cute.make_tensor(tOrP.iterator, acc_S.layout),
            acc_S_mn=acc_S_mn, acc_O_mn=_acc_mn_view(acc_O),
            row_max=cute.make_rmem_tensor(cute.make_layout(n_rows), Float32),
            row_sum=cute.make_rmem_tensor(cute.make_layout(n_rows), Float32),
            row_scale=cute.make_rmem_tensor(cute.make_layout(n_rows), Float32),
            **({n: cute.make_rmem_tensor(cute.make_layout(n_rows), Float32)
                for n in ("row_next", "row_pend", "row_tot")} if self.lazy_ref else {}),
            edge=self.edge_frags(wg_threads(wg), acc_S),
        )

        q_state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Consumer,
                                               self.q_stages)
        k_state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Consumer, self.kv_stages)
        v_state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Consumer, self.kv_stages)
        tile_state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Consumer,
                                                  TILE_SLOTS)

        if wg == 0 and cutlass.const_expr(self.pingpong):
            # Ping-pong: warpgroup 0 issues first.
            cute.arch.barrier_arrive(barrier_id=1, number_of_threads=256)

        o_phase = Int32(0)  # O buffer: parity of this warpgroup's epilogues so far
        running = cutlass.Boolean(True)
        while running:
            pipe_tile.consumer_wait(tile_state)
            tile, coords = self.get_tile(slots, tile_state.index)
            pipe_tile.consumer_release(tile_state)
            tile_state.advance()
            if tile >= shape.num_tiles:
                running = False
            else:
                t_start = Int64(0)
                if cutlass.const_expr(self.trace):
                    t_start = cute.arch.globaltimer()
                t = self.tile_info(coords, ptrs, shape, totals)
                row0 = t.m_block * self.tile_m
                if row0 < self.rows_of(t, shape):
                    n_min, n_max = self.n_block_range(t, shape)
                    f.acc_O.fill(0.0)
                    f.row_max.fill(-Float32.inf)
                    f.row_sum.fill(0.0)
                    if cutlass.const_expr(self.decode):
                        self.load_q_packed(tidx, sQ, t, ptrs, strides, shape)
                    else:
                        pipe_q.consumer_wait(q_state)
                    # This tile's Q stage (with two, the producer loads the next tile's Q into
                    # the other one while this tile runs).
                    q_stage = q_state.index if cutlass.const_expr(self.q_stages > 1) else 0
                    f_tile = dataclasses.replace(f, tSrQ=f.tSrQ[None, None, None, q_stage])
                    args = (tidx, f_tile, (pipe_k, pipe_v), k_state, v_state, t, (n_min, n_max),
                            shape, softmax)
                    if cutlass.const_expr(self.edge_n > 0):
                        # Tile.edge_width: tiles whose first block can be trimmed take a copy
                        # of the mainloop of their own, chosen here, where no wgmma is in
                        # flight (around the trimmed steps inside the mainloop, the branches'
                        # join made ptxas serialise every wgmma of the kernel: C7511).
                        fits = self.edge_fits(n_max - 1, t, shape)
                        if fits == 1:
                            if n_max - n_min == 1:
                                k_state, v_state = self.mainloop(*args, trim=True, single=True)
                            else:
                                k_state, v_state = self.mainloop(*args, trim=True)
                        if fits == 0:
                            k_state, v_state = self.mainloop(*args)
                    else:
                        k_state, v_state = self.mainloop(*args)
                    if cutlass.const_expr(self.lazy_ref):
                        self.tile_guard(tidx, f, t, redo, shape, softmax,
                                        (n_min, n_max), _opaque_u32(sQ.iterator.toint())
                                        + q_stage * self.q_bytes)
                    if cutlass.const_expr(self.o_buffer):
                        # O passes through the O buffer: Q is free once the mainloop is done.
                        pipe_q.consumer_release(q_state)
                        q_state.advance()
                        self.epilogue(tidx, f, t, ptrs, strides, shape, softmax,
                                      (_opaque_u32(o_buf[0]), o_buf[1], o_phase))
                        o_phase = o_phase ^ 1
                    elif cutlass.const_expr(self.staged_store):
                        # O passes through this Q stage: released once it is read back.
                        q_base = _opaque_u32(sQ.iterator.toint()) + q_stage * self.q_bytes
                        self.epilogue(tidx, f, t, ptrs, strides, shape, softmax, (q_base,))
                        pipe_q.consumer_release(q_state)
                        q_state.advance()
                    else:
                        if cutlass.const_expr(not self.decode):
                            pipe_q.consumer_release(q_state)
                            q_state.advance()
                        self.epilogue(tidx, f, t, ptrs, strides, shape, softmax)
                if cutlass.const_expr(self.trace):
                    if tidx == 0:
                        # (SM, CTA, start ns, end ns) of this tile; the tile index is unique.
                        rec = cute.make_tensor(ptrs.trace_ptr + Int64(tile) * 4,
                                               cute.make_layout(4))
                        rec[0] = Int64(cute.arch.smid())
                        rec[1] = Int64(cute.arch.block_idx()[0])
                        rec[2] = t_start
                        rec[3] = cute.arch.globaltimer()

    @cute.jit
    def load_q_packed(self, tidx, sQ, t: _Tile, ptrs: Ptrs, strides: Strides, shape: Shape):
        """Decode kernels: the warpgroup copies its 64 packed rows of Q into shared memory with
        16-byte cp.async (all in flight at once; rows past the tile's end are zero), waits for
        them and makes them visible to wgmma. Its previous tile's wgmmas have completed (the
        mainloop ends on wait_group(0))."""
        g = shape.qhead_per_kvhead
        wg = self.mma_wg(tidx)
        lt = tidx % 128
        chunks = self.hd // 8  # 16-byte chunks per row
        # Thread lt copies chunk lt % chunks of rows lt // chunks, + step, + 2 step, ... of the
        # warpgroup's 64 (the threads past step * chunks idle when chunks does not divide 128).
        # The row's (query row, head) advance without a division per copy: these copies run
        # on the MMA warpgroups' issue slots (with a division and the address arithmetic per
        # copy they were ~5 % of the chunked prefill's time, docs/perf-notes.md v13).
        step = 128 // chunks
        ch = lt % chunks
        r = lt // chunks
        if lt >= step * chunks:
            r = Int32(64)  # idle
        q_s = cute.assume(strides.q_stride_s, divby=8)
        q_h = cute.assume(strides.q_stride_h, divby=8)
        q_b = cute.assume(strides.q_stride_b, divby=8)
        base = (Int64(t.batch) * q_b + Int64(t.q_start) * q_s + Int64(t.head * g) * q_h
                + Int64(ch * 8))
        rows_valid = t.sq * g
        rr = t.m_block * self.tile_m + wg * 64 + r
        s_row = rr // g
        h_row = rr - s_row * g
        ds = step // g
        dh = step - ds * g
        sQ2 = sQ[None, None, 0]
        g2s = cute.make_copy_atom(cpasync.CopyG2SOp(), self.dtype, num_bits_per_copy=128)
        # A run-time loop: unrolled, the per-iteration addresses are hoisted out of the tile
        # loop and spill at head_dim 256.
        for _ in cutlass.range((64 + step - 1) // step, unroll=1):
            if r < 64:
                dst = cute.local_tile(sQ2, (1, 8), (wg * 64 + r, ch))[0, None]
                if rr < rows_valid:
                    off = cute.assume(base + Int64(s_row) * q_s + Int64(h_row) * q_h, divby=8)
                    src = cute.make_tensor(ptrs.q_ptr + off, cute.make_layout(8))
                    cute.copy(g2s, src, dst)
                else:
                    zeros = cute.make_rmem_tensor(cute.make_layout(8), self.dtype)
                    zeros.fill(0.0)
                    cute.autovec_copy(zeros, dst)
            r = r + step
            rr = rr + step
            s_row = s_row + ds
            h_row = h_row + dh
            if h_row >= g:
                h_row = h_row - g
                s_row = s_row + 1
        cute.arch.cp_async_commit_group()
        cute.arch.cp_async_wait_group(0)
        cute.arch.fence_view_async_shared()
        cute.arch.barrier(barrier_id=3 + wg, number_of_threads=128)

    @cute.jit
    def mainloop(self, tidx, f: _Frags, pipes, k_state, v_state, t: _Tile, n_range,
                 shape: Shape, softmax: Softmax, trim: cutlass.Constexpr = False,
                 single: cutlass.Constexpr = False):
        """Key blocks n_max-1 down to n_min for one m-tile; returns the advanced K/V states.
        ``trim`` (Tile.edge_width): the first block's S and PV wgmmas cover only its first
        ``edge_n`` columns (the caller has checked that no row of the tile sees more; the
        other columns of S hold -inf, their P is 0); ``single``: the tile has that one key
        block (else at least two)."""
        pipe_k, pipe_v = pipes
        n_min, n_max = n_range
        wg = self.mma_wg(tidx)
        row0 = t.m_block * self.tile_m
        scale_log2 = softmax.softmax_scale_log2
        if cutlass.const_expr(self.intra_wg_overlap):
            if n_max > n_min:
                # First (last-in-sequence) block: always masked.
                self.qk_alone(wg, f, pipe_k, k_state, trim)
                k_state.advance()
                self.apply_softcap(f.acc_S_mn, softmax.softcap_pre)
                self.apply_mask(f.acc_S_mn, tidx, (n_max - 1) * self.tile_n, row0, t, shape)
                self.online_softmax(f, scale_log2)
                self.convert_p(f)
                # The other blocks (n_max - 2 down to n_min) in three runs: those that need
                # the mask near the diagonal / sequence end, the unmasked steady state (its own
                # loop without the mask test, so ptxas schedules the row max ahead of the wait
                # for the PV wgmma, docs/perf-notes.md v12), those below a window's left edge.
                u_lo, u_hi = self.unmasked_blocks(n_min, n_max, t, shape)
                if cutlass.const_expr(self.decode):
                    # Decode kernels cap the scores when softcap_pre != 0 (a run-time
                    # value): then every block takes the masked run, which caps; the
                    # other runs never do. (A run-time softcap test in each run made
                    # ptxas take the producer's TMA operands out of uniform registers:
                    # every TMA issue became a loop over the lanes, docs/perf-notes.md v13.)
                    if softmax.softcap_pre != Float32(0.0):
                        u_lo, u_hi = n_min, n_min
                first = n_max - 1  # the blocks below it are left
                if cutlass.const_expr(trim and not single):
                    # The second block's step (peeled off) issues the trimmed block's PV.
                    self.overlap_block(tidx, f, pipes, k_state, v_state, n_max - 2, t, shape,
                                       softmax, True, trim=True)
                    k_state.advance()
                    v_state.advance()
                    first = n_max - 2
                top = cutlass.min(u_hi, first)
                for i in cutlass.range(cutlass.max(first - cutlass.max(u_hi, n_min), 0),
                                       unroll=1):
                    self.overlap_block(tidx, f, pipes, k_state, v_state, first - 1 - i, t,
                                       shape, softmax, True)
                    k_state.advance()
                    v_state.advance()
                if cutlass.const_expr(self.lazy_ref):
                    self.lazy_init(f, scale_log2)
                for i in cutlass.range(top - u_lo, unroll=1):
                    self.overlap_block(tidx, f, pipes, k_state, v_state, top - 1 - i, t,
                                       shape, softmax, False, capped=not self.decode)
                    k_state.advance()
                    v_state.advance()
                if cutlass.const_expr(self.lazy_ref):
                    self.lazy_finish(f, scale_log2)
                if cutlass.const_expr(self.local):
                    bottom = cutlass.min(u_lo, top)
                    for i in cutlass.range(bottom - n_min, unroll=1):
                        self.overlap_block(tidx, f, pipes, k_state, v_state, bottom - 1 - i,
                                           t, shape, softmax, True, capped=not self.decode)
                        k_state.advance()
                        v_state.advance()
                # Last PV.
                if cutlass.const_expr(self.rescale_early):
                    self.rescale_o(f)
                self.pv_alone(wg, f, pipe_v, v_state, trim and single)
                v_state.advance()
        else:
            for i in cutlass.range(n_max - n_min, unroll=1):
                col0 = (n_max - 1 - i) * self.tile_n
                self.qk_alone(wg, f, pipe_k, k_state)
                k_state.advance()
                self.apply_softcap(f.acc_S_mn, softmax.softcap_pre)
                if i == 0 or self.block_needs_mask(col0, row0, t, shape):
                    self.apply_mask(f.acc_S_mn, tidx, col0, row0, t, shape)
                self.online_softmax(f, scale_log2)
                self.rescale_o(f)
                self.convert_p(f)
                self.pv_alone(wg, f, pipe_v, v_state)
                v_state.advance()
        return k_state, v_state

    def overlap_block(self, tidx, f: _Frags, pipes, k_state, v_state, n_block, t: _Tile,
                      shape: Shape, softmax: Softmax, masked: bool, capped: bool = True,
                      trim: bool = False):
        """One steady-state step of the overlapped mainloop: S = Q K(n_block)^T and O += P V of
        the previous block issued together, the softmax of S while the PV wgmma runs, then O
        rescaled and P converted. ``masked``: apply the mask; ``capped``: apply the softcap
        (as configured: always in softcap kernels, when softcap_pre != 0 in decode kernels).
        Both are decided while tracing. The caller advances both pipeline states (see
        :meth:`qk_alone`). ``trim``: the PV wgmmas take only the first ``edge_n`` keys (the
        previous block was a trimmed first block).

        With ping-pong, V is waited for after S's wgmmas are issued (its load was issued after
        K's): the tensor cores work on S meanwhile, and the other warpgroups' turns do not
        wait on this one's V (three warpgroups in turn: 0.5-2 % better than waiting for V
        first, docs/perf-notes.md v15). Without (hd256, 64-row decode) both are waited for
        first (v12: 3-4 % better on the three-warpgroup tile when it had no ping-pong; at hd256
        either order, v14; the decode kernels keep the order they had).

        ``rescale_early`` (Tile): O is multiplied by the previous block's correction between
        the two issues, under S's wgmmas, instead of after the wait for PV; the mainloop does
        the same once more before the last PV. Each O value sees the same multiplications and
        additions in the same order either way."""
        pipe_k, pipe_v = pipes
        wg = self.mma_wg(tidx)
        pipe_k.consumer_wait(k_state)
        if cutlass.const_expr(not self.pingpong):
            pipe_v.consumer_wait(v_state)
        self.pingpong_wait(wg)
        self.gemm_qk(f, k_state.index)
        if cutlass.const_expr(self.rescale_early):
            self.rescale_o(f)
        if cutlass.const_expr(self.pingpong):
            pipe_v.consumer_wait(v_state)
        self.gemm_pv(f, v_state.index, trim)
        self.pingpong_signal(wg)
        # Tile.lazy_reference: the unmasked steps take P against a reference decided by the
        # blocks before (lazy_softmax) instead of this block's row max.
        lazy = self.lazy_ref and not masked
        if cutlass.const_expr(lazy):
            # The previous block's P (in tOrP, read by the PV wgmma just issued): its largest
            # value decides this block's reference, while the wgmmas run.
            self.lazy_decide(f)
        warpgroup.wait_group(1)
        pipe_k.consumer_release(k_state)
        if cutlass.const_expr(capped):
            self.apply_softcap(f.acc_S_mn, softmax.softcap_pre)
        if cutlass.const_expr(masked):
            self.apply_mask(f.acc_S_mn, tidx, n_block * self.tile_n, t.m_block * self.tile_m,
                            t, shape)
        if cutlass.const_expr(lazy):
            self.lazy_softmax(f, softmax.softmax_scale_log2)
        else:
            self.online_softmax(f, softmax.softmax_scale_log2)
        warpgroup.wait_group(0)
        if cutlass.const_expr(lazy):
            self.lazy_sum(f)
        pipe_v.consumer_release(v_state)
        if cutlass.const_expr(not self.rescale_early):
            self.rescale_o(f)
        self.convert_p(f)

    @cute.jit
    def unmasked_blocks(self, n_min, n_max, t: _Tile, shape: Shape):
        """[u_lo, u_hi): the tile's key blocks that need no mask (BlockInfo.unmasked_range)."""
        s_lo, s_hi = self.seq_rows(t.m_block * self.tile_m, shape)
        return self.binfo.unmasked_range(n_min, n_max, s_lo, s_hi, t.sq, t.sk, shape.window_left,
                                         shape.window_right)

    @cute.jit
    def block_needs_mask(self, col0, row0, t: _Tile, shape: Shape):
        """Whether key block [col0, col0 + tile_n) crosses the sequence end or a mask edge for
        some row of the m tile."""
        s_lo, s_hi = self.seq_rows(row0, shape)
        return self.binfo.block_needs_mask(col0, s_lo, t.sq, t.sk, shape.window_left,
                                           shape.window_right, s_hi)

    @cute.jit
    def convert_p(self, f: _Frags):
        """P (fp32, in acc_S) -> 16-bit A operand of the PV wgmma, written where it stands."""
        p32 = cute.recast_tensor(f.tOrP_as_acc, Uint32)
        ptx_type = "bf16" if cutlass.const_expr(self.dtype == cutlass.BFloat16) else "f16"
        for j in cutlass.range_constexpr(cute.size(p32)):
            p32[j] = _cvt_pair_pinned(f.acc_S[2 * j], f.acc_S[2 * j + 1], ptx_type)

    # Plain Python helpers (inlined while tracing, like pingpong_wait). The caller advances the
    # pipeline state after each: the tracer carries a state through a loop only when the
    # loop body itself rebinds it (an advance inside a helper escapes the loop).
    def mma_wg(self, tidx):
        """Index of the MMA warpgroup of consumer thread ``tidx``, marked warp-uniform (named
        barrier ids and wgmma descriptors derived from it stay in uniform registers)."""
        return cute.arch.make_warp_uniform(tidx // 128)

    def qk_alone(self, wg, f: _Frags, pipe_k, k_state, trim=False):
        """S = Q K^T for the next key block, waited for (no PV in flight); ``trim``: see
        :meth:`gemm_qk`."""
        pipe_k.consumer_wait(k_state)
        self.pingpong_wait(wg)
        self.gemm_qk(f, k_state.index, trim)
        self.pingpong_signal(wg)
        warpgroup.wait_group(0)
        pipe_k.consumer_release(k_state)

    def pv_alone(self, wg, f: _Frags, pipe_v, v_state, trim=False):
        """O += P V for the next value block, waited for (no QK in flight); ``trim``: see
        :meth:`gemm_pv`."""
        pipe_v.consumer_wait(v_state)
        self.pingpong_wait(wg)
        self.gemm_pv(f, v_state.index, trim)
        self.pingpong_signal(wg)
        warpgroup.wait_group(0)
        pipe_v.consumer_release(v_state)

    @cute.jit
    def rescale_o(self, f: _Frags):
        """O *= the online softmax's per-row correction. With ``lazy_rescale``, skipped when
        no row of the warp moved its max (every factor exactly 1)."""
        if cutlass.const_expr(self.rescale_threshold is None):
            self._scale_o_rows(f)
        elif warp_needs_rescale(f.row_scale, cute.size(f.acc_O_mn, mode=[0])):
            self._scale_o_rows(f)

    def _scale_o_rows(self, f: _Frags):
        for r in range(cute.size(f.acc_O_mn, mode=[0])):  # static sizes: unrolled while tracing
            for c in range(cute.size(f.acc_O_mn, mode=[1])):
                f.acc_O_mn[r, c] = f.acc_O_mn[r, c] * f.row_scale[r]

    def pingpong_wait(self, wg):
        if cutlass.const_expr(self.pingpong):
            cute.arch.barrier(barrier_id=1 + wg, number_of_threads=256)

    def pingpong_signal(self, wg):
        """The next warpgroup's turn (round robin over two or three)."""
        if cutlass.const_expr(self.pingpong):
            if cutlass.const_expr(self.num_mma_wg == 2):
                cute.arch.barrier_arrive(barrier_id=2 - wg, number_of_threads=256)
            else:
                cute.arch.barrier_arrive(barrier_id=1 + (wg + 1) % self.num_mma_wg,
                                         number_of_threads=256)

    @cute.jit
    def gemm_qk(self, f: _Frags, stage, trim: cutlass.Constexpr = False):
        """acc = Q K^T (zero-initialised by the first k-block). A fresh MMA atom per call keeps
        the accumulate flag a local value. ``trim`` (Tile.edge_width): only the block's first
        ``edge_n`` columns, by wgmmas of that width."""
        op, acc = f.mma_qk.op, f.acc_S
        if cutlass.const_expr(trim):
            op, acc = f.edge
            # The columns past it: -inf (the mask would overwrite them, but the compiler
            # cannot see that, and their stale values would stay live through the wgmmas,
            # taking registers the wgmma pipeline needs: C7511).
            for c in cutlass.range_constexpr(cute.size(acc), cute.size(f.acc_S)):
                f.acc_S[c] = -Float32.inf
        warpgroup.fence()
        atom = cute.make_mma_atom(op)
        for k in cutlass.range_constexpr(cute.size(f.tSrQ, mode=[2])):
            atom.set(warpgroup.Field.ACCUMULATE, k != 0)
            cute.gemm(atom, acc, f.tSrQ[None, None, k], f.tSrK[None, None, k, stage], acc)
        warpgroup.commit_group()

    @cute.jit
    def gemm_pv(self, f: _Frags, stage, trim: cutlass.Constexpr = False):
        """acc += P V (``trim``: over the block's first ``edge_n`` keys only)."""
        warpgroup.fence()
        atom = cute.make_mma_atom(f.mma_pv.op)
        atom.set(warpgroup.Field.ACCUMULATE, True)
        n_k = self.edge_n // 16 if cutlass.const_expr(trim) else cute.size(f.tOrP, mode=[2])
        for k in cutlass.range_constexpr(n_k):
            cute.gemm(atom, f.acc_O, f.tOrP[None, None, k], f.tOrV[None, None, k, stage], f.acc_O)
        warpgroup.commit_group()

    # ---------------------------------------------------------------- Tile.edge_width
    def edge_frags(self, wg_thread, acc_S):
        """(MMA op, accumulator) of S's wgmmas at ``edge_n`` columns, or () without trimming.
        The accumulator is acc_S's first columns: a wgmma m64nN accumulator holds its columns
        in groups of 8, one after another, so a narrower one's registers are a prefix of a
        wider one's. The K operand descriptors are the full block's (same start, same row
        stride)."""
        if cutlass.const_expr(self.edge_n == 0):
            return ()
        mma = sm90_utils.make_trivial_tiled_mma(
            self.dtype, self.dtype, warpgroup.OperandMajorMode.K, warpgroup.OperandMajorMode.K,
            Float32, (self.num_mma_wg, 1, 1), (64, self.edge_n))
        thr = mma.get_slice(wg_thread)
        layout = thr.make_fragment_C(thr.partition_shape_C((self.tile_m, self.edge_n))).layout
        return (mma.op, cute.make_tensor(acc_S.iterator, layout))

    @cute.jit
    def edge_fits(self, n_block, t: _Tile, shape: Shape):
        """1 if no row of the tile sees key block ``n_block`` past its first ``edge_n``
        columns (the tile's last row sees the most), else 0 (warp-uniform). One answer per CTA: with one per
        warpgroup (their last rows 64 apart) the two ping-pong warpgroups would often run
        different copies of the mainloop at once and stall on instruction fetch (5 % slower,
        docs/perf-notes.md v28)."""
        last_row = t.m_block * self.tile_m + self.tile_m - 1
        _, hi = self.binfo.col_limits(last_row, n_block * self.tile_n, t.sq, t.sk,
                                      shape.window_left, shape.window_right)
        fits = Int32(0)
        if hi <= self.edge_n:
            fits = Int32(1)
        return cute.arch.make_warp_uniform(fits)

    @cute.jit
    def apply_softcap(self, acc_S_mn, softcap_pre):
        """Softcap: S -> tanh(S * softmax_scale / softcap), before the mask (a masked -inf must
        stay -inf). The host then passes softcap * log2(e) and softcap as the softmax's scales,
        so P = exp(softcap * tanh(...) - max) and the LSE come out in the usual units. Softcap
        kernels always cap; decode kernels cap when softcap_pre != 0."""
        if cutlass.const_expr(self.softcap):
            self._tanh_all(acc_S_mn, softcap_pre)
        elif cutlass.const_expr(self.decode):
            if softcap_pre != Float32(0.0):
                self._tanh_all(acc_S_mn, softcap_pre)

    def _tanh_all(self, acc_S_mn, softcap_pre):
        for r in range(cute.size(acc_S_mn, mode=[0])):
            for c in range(cute.size(acc_S_mn, mode=[1])):
                acc_S_mn[r, c] = _tanh_approx(acc_S_mn[r, c] * softcap_pre)

    @cute.jit
    def apply_mask(self, acc_S_mn, tidx, col0, row0, t: _Tile, shape: Shape):
        """-inf outside the visible keys: col >= sk; causal: col > row + sk - sq; local: col
        outside [row + sk - sq - window_left, row + sk - sq + window_right]. ``row`` is the
        query row (packed row / group in decode kernels)."""
        thr_col = col0 + 2 * (tidx % 4)
        for r in cutlass.range_constexpr(cute.size(acc_S_mn, mode=[0])):
            row = row0 + _frag_row(tidx, r)
            if cutlass.const_expr(self.decode):
                row = row // shape.qhead_per_kvhead
            lo, hi = self.binfo.col_limits(row, thr_col, t.sq, t.sk, shape.window_left,
                                           shape.window_right)
            mask_row(RowView(acc_S_mn, r), cute.size(acc_S_mn, mode=[1]), _frag_col_static, hi,
                     lo if cutlass.const_expr(self.local) else None)

    # ------------------------------------------------ Tile.lazy_reference (bf16 only)
    @cute.jit
    def lazy_init(self, f: _Frags, scale_log2):
        """Before a tile's unmasked steps: the reference (log2 units) from the exact row max
        of the masked steps before them; row_max holds, until lazy_finish, the running packed
        bf16x2 maximum of the blocks' P (the overflow guard's evidence)."""
        for r in cutlass.range_constexpr(cute.size(f.row_max)):
            f.row_next[r] = Float32(cutlass.select_(
                f.row_max[r] == -Float32.inf, Float32(0.0), f.row_max[r] * scale_log2))
        f.row_pend.fill(1.0)
        f.row_max[0] = Float32(0.0)

    @cute.jit
    def lazy_decide(self, f: _Frags):
        """At the start of an unmasked step, once the PV wgmma that reads the previous block's
        P is issued: that P's largest value per row (16-bit maxes, packed, over the quad)
        moves the reference up by its log2 when it exceeds 2^8 (FA4's Blackwell threshold);
        the factor between the two references goes to O (row_scale, next step) and to the
        row sum (lazy_sum). The lane's own maxima also raise the guard's running peak."""
        p32 = cute.recast_tensor(f.tOrP_as_acc, Uint32)
        n = cute.size(p32)
        w0 = tree_reduce(_hmax2, [p32[j] for j in range(0, n, 2)])  # row 0's words
        w1 = tree_reduce(_hmax2, [p32[j] for j in range(1, n, 2)])  # row 1's
        w = _hmax2(_asm_u32([w0, w1], "prmt.b32 $0, $1, $2, 0x5410;", "=r,r,r"),
                   _asm_u32([w0, w1], "prmt.b32 $0, $1, $2, 0x7632;", "=r,r,r"))
        f.row_max[0] = _bits_f32(_hmax2(_f32_bits(f.row_max[0]), w))
        w = _hmax2(w, _asm_u32([w], "shfl.sync.bfly.b32 $0, $1, 1, 0x1f, -1;", "=r,r"))
        w = _hmax2(w, _asm_u32([w], "shfl.sync.bfly.b32 $0, $1, 2, 0x1f, -1;", "=r,r"))
        mx = [_bf16_lo(w), _bf16_hi(w)]
        for r in cutlass.range_constexpr(2):
            moved = mx[r] > Float32(2.0 ** RESCALE_THRESHOLD)
            ref = f.row_next[r]
            f.row_next[r] = Float32(cutlass.select_(
                moved, ref + cute.math.log2(mx[r], fastmath=True), ref))
            f.row_pend[r] = Float32(cutlass.select_(moved, cute.arch.rcp_approx(mx[r]),
                                                    Float32(1.0)))

    @cute.jit
    def lazy_softmax(self, f: _Frags, scale_log2):
        """P of an unmasked block against the reference decided by the blocks before it
        (row_next), so the exponentials start as soon as S is there: no row max of this
        block on the critical path (docs/perf-notes.md v36-v37)."""
        n_cols = cute.size(f.acc_S_mn, mode=[1])
        for r in cutlass.range_constexpr(cute.size(f.acc_S_mn, mode=[0])):
            row = RowView(f.acc_S_mn, r)
            ref = f.row_next[r]
            for c in cutlass.range_constexpr(n_cols):
                row[c] = cute.math.exp2(row[c] * scale_log2 - ref, fastmath=True)
            f.row_tot[r] = tree_reduce(lambda a, b: a + b, [row[c] for c in range(n_cols)])
            f.row_scale[r] = f.row_pend[r]

    @cute.jit
    def lazy_sum(self, f: _Frags):
        for r in cutlass.range_constexpr(2):
            f.row_sum[r] = f.row_sum[r] * f.row_pend[r] + f.row_tot[r]

    @cute.jit
    def lazy_finish(self, f: _Frags, scale_log2):
        """After the unmasked steps: row_max from the last reference (raw units); the row sum
        made infinite where a block's P went above 2^100 (its O may have overflowed, or its
        reference factor underflowed), for tile_guard."""
        pk = _f32_bits(f.row_max[0])
        bad = (_bf16_lo(pk) > Float32(LAZY_GUARD)) | (_bf16_hi(pk) > Float32(LAZY_GUARD))
        inv_k = cute.arch.rcp_approx(scale_log2)
        for r in cutlass.range_constexpr(2):
            f.row_max[r] = f.row_next[r] * inv_k
            f.row_sum[r] = Float32(cutlass.select_(bad, Float32.inf, f.row_sum[r]))

    @cute.jit
    def tile_guard(self, tidx, f: _Frags, t: _Tile, redo: Redo, shape: Shape, softmax: Softmax,
                   n_range, q_addr):
        """After the mainloop (no wgmma in flight, Q still held): P can overflow against a
        reference left behind by a block whose scores are ~70 nats above the blocks before
        it. Every such case leaves a lane's row sum infinite, NaN or above 2^100 (the last
        block's P is in the row sum; the earlier ones' peaks are in lazy_finish's flag); a
        warp with such a lane recomputes its rows exactly (tile_redo). Ordinary inputs never
        take it."""
        big = Float32(LAZY_GUARD)
        ok = (f.row_sum[0] <= big) & (f.row_sum[1] <= big)
        if not cute.arch.vote_all_sync(ok):
            self.tile_redo(tidx, f, t, redo, shape, softmax, n_range, q_addr)

    @cute.jit
    def tile_redo(self, tidx, f: _Frags, t: _Tile, redo: Redo, shape: Shape, softmax: Softmax,
                  n_range, q_addr):
        """The slow exact path (milliseconds a tile): the thread's two rows, key by key over
        the tile's keys, with FMAs: Q from shared memory, K and V rows from global memory
        (``k_ptr`` / ``v_ptr``; only keys below the document's length are read), the tile's
        mask from BlockInfo.col_limits, the online softmax in the log2 domain, O for the
        thread's own columns. Each lane of a quad computes the row; the first keeps the row
        sum (the epilogue sums it over the quad)."""
        lane = tidx % 32
        n_min, n_max = n_range
        k2 = softmax.softmax_scale_log2
        rb = self.q_row_bytes
        kk = rb // 16
        kv_head = t.head // shape.qhead_per_kvhead
        k_base = redo.k_ptr.toint() + 2 * (Int64(t.k_start) * redo.k_stride_s
                                           + Int64(kv_head) * redo.k_stride_h
                                           + Int64(t.k_b) * redo.k_stride_b)
        v_base = redo.v_ptr.toint() + 2 * (Int64(t.k_start) * redo.v_stride_s
                                           + Int64(kv_head) * redo.v_stride_h
                                           + Int64(t.k_b) * redo.v_stride_b)
        rows = [_frag_row(tidx, r) for r in range(2)]  # inside the tile
        lims = [self.binfo.col_limits(t.m_block * self.tile_m + rows[r], 0, t.sq, t.sk,
                                      shape.window_left, shape.window_right) for r in range(2)]
        acc_O = f.acc_O_mn
        n_cols = cute.size(acc_O, mode=[1])
        for r in cutlass.range_constexpr(2):
            for c in cutlass.range_constexpr(n_cols):
                acc_O[r, c] = Float32(0.0)
        # The running max and sum are loop-carried scalars (the DSL carries named values,
        # not list items).
        m0 = -Float32.inf
        m1 = -Float32.inf
        l0 = Float32(0.0)
        l1 = Float32(0.0)
        for j in cutlass.range(n_min * self.tile_n, cutlass.min(n_max * self.tile_n, t.sk),
                               unroll=1):
            s = [Float32(0.0), Float32(0.0)]
            krow = k_base + 2 * Int64(j) * redo.k_stride_s
            for ch in cutlass.range_constexpr(self.hd // 8):
                kw = _ld_global_v4(krow + Int64(ch * 16))
                qw = [_ld_shared_v4(q_addr + _swizzled_offset(rows[r], ch % kk, ch // kk,
                                                              self.tile_m, rb))
                      for r in range(2)]
                for e in cutlass.range_constexpr(8):
                    unpack = _bf16_lo if e % 2 == 0 else _bf16_hi
                    kf = unpack(kw[e // 2])
                    for r in cutlass.range_constexpr(2):
                        s[r] = s[r] + unpack(qw[r][e // 2]) * kf
            sv = [Float32(cutlass.select_((j >= lims[r][0]) & (j < lims[r][1]), s[r],
                                          -Float32.inf)) for r in range(2)]
            m_new = [cute.arch.fmax(m, sv[r]) for r, m in enumerate((m0, m1))]
            base = [Float32(cutlass.select_(m_new[r] == -Float32.inf, Float32(0.0),
                                            m_new[r] * k2)) for r in range(2)]
            c_old = [cute.math.exp2(m * k2 - base[r], fastmath=True)
                     for r, m in enumerate((m0, m1))]
            p = [cute.math.exp2(sv[r] * k2 - base[r], fastmath=True) for r in range(2)]
            l0 = l0 * c_old[0] + p[0]
            l1 = l1 * c_old[1] + p[1]
            m0 = m_new[0]
            m1 = m_new[1]
            vrow = v_base + 2 * Int64(j) * redo.v_stride_s
            for c in cutlass.range_constexpr(0, n_cols, 2):
                w = _ld_global_u32(vrow + Int64(2 * (_frag_col_static(c) + 2 * (lane % 4))))
                for r in cutlass.range_constexpr(2):
                    acc_O[r, c] = acc_O[r, c] * c_old[r] + p[r] * _bf16_lo(w)
                    acc_O[r, c + 1] = acc_O[r, c + 1] * c_old[r] + p[r] * _bf16_hi(w)
        first = lane % 4 == 0
        f.row_max[0] = m0
        f.row_max[1] = m1
        f.row_sum[0] = Float32(cutlass.select_(first, l0, Float32(0.0)))
        f.row_sum[1] = Float32(cutlass.select_(first, l1, Float32(0.0)))

    @cute.jit
    def online_softmax(self, f: _Frags, scale_log2):
        """S -> P = exp2(S * scale_log2 - rowmax * scale_log2) in place; row_scale gets the
        factor the running O must be multiplied by."""
        for r in cutlass.range_constexpr(cute.size(f.acc_S_mn, mode=[0])):
            m_new, s_new, rescale = online_softmax_row(
                RowView(f.acc_S_mn, r), cute.size(f.acc_S_mn, mode=[1]), f.row_max[r],
                f.row_sum[r], scale_log2, self.reduction, quad_lanes=True,
                rescale_threshold=self.rescale_threshold)
            f.row_max[r] = m_new
            f.row_sum[r] = s_new
            f.row_scale[r] = rescale

    # ------------------------------------------------------------------ epilogue
    @cute.jit
    def epilogue(self, tidx, f: _Frags, t: _Tile, ptrs: Ptrs, strides: Strides, shape: Shape,
                 softmax: Softmax, stage=None):
        """O /= row sum; LSE = max * scale + log(sum) (or -inf for rows that saw no key).
        Written to out/lse (with ``staged_store`` through shared memory, ``stage`` as
        :meth:`store_out_staged` takes it), or (decode kernels with num_splits > 1) to the fp32
        partial buffers for the combine kernel."""
        acc_O_mn = f.acc_O_mn
        n_rows = cute.size(acc_O_mn, mode=[0])
        lse_vals = []
        for r in cutlass.range_constexpr(n_rows):
            total = f.row_sum[r]
            total = total + cute.arch.shuffle_sync_bfly(total, offset=1)
            total = total + cute.arch.shuffle_sync_bfly(total, offset=2)
            inv = Float32(0.0)
            lse = -Float32.inf
            if total > 0.0:
                inv = cute.arch.rcp_approx(total)
                lse = f.row_max[r] * softmax.softmax_scale + cute.math.log(total, fastmath=True)
            for c in cutlass.range_constexpr(cute.size(acc_O_mn, mode=[1])):
                acc_O_mn[r, c] = acc_O_mn[r, c] * inv
            lse_vals.append(lse)
        if cutlass.const_expr(self.decode):
            if shape.num_splits > 1:
                self.store_partial(tidx, f, t, lse_vals, ptrs, shape)
            else:
                self.store_out(tidx, f, t, lse_vals, ptrs, strides, shape)
        elif cutlass.const_expr(self.staged_store):
            self.store_out_staged(tidx, f, t, lse_vals, ptrs, strides, shape, stage)
        else:
            self.store_out(tidx, f, t, lse_vals, ptrs, strides, shape)

    @cute.jit
    def row_target(self, tidx, r, t: _Tile, shape: Shape):
        """(query row inside the batch entry, head) of accumulator row ``r`` of this thread."""
        rr = t.m_block * self.tile_m + _frag_row(tidx, r)
        if cutlass.const_expr(self.decode):
            s = rr // shape.qhead_per_kvhead
            return s, t.head * shape.qhead_per_kvhead + (rr - s * shape.qhead_per_kvhead)
        return rr, t.head

    @cute.jit
    def store_out(self, tidx, f: _Frags, t: _Tile, lse_vals, ptrs: Ptrs, strides: Strides,
                  shape: Shape):
        rO = cute.make_rmem_tensor(f.acc_O.layout, self.dtype)
        rO.store(f.acc_O.load().to(self.dtype))
        # Adjacent columns pairs (c, c+1) sit next to each other in the fragment: store them as
        # one 32-bit word. The runtime guarantees 16-byte aligned output strides: tell the
        # compiler, so the 32-bit stores stay 32-bit.
        rO32 = cute.recast_tensor(rO, cutlass.Uint32)
        o_stride_s = cute.assume(strides.o_stride_s, divby=8)
        o_stride_h = cute.assume(strides.o_stride_h, divby=8)
        o_stride_b = cute.assume(strides.o_stride_b, divby=8)
        rO32_mn = _acc_mn_view(rO32)  # (2 rows, hd/8 column pairs)
        n_pairs = cute.size(rO32_mn, mode=[1])
        for r in cutlass.range_constexpr(cute.size(rO32_mn, mode=[0])):
            s, head = self.row_target(tidx, r, t, shape)
            if s < t.sq:
                self.store_lse(tidx, s, head, t, lse_vals[r], ptrs, strides)
                # One base pointer per row; the pairs sit at constant offsets from it (so the
                # compiler folds them into the stores instead of keeping one address per value).
                o_off = (Int64(head) * o_stride_h + Int64(t.batch) * o_stride_b
                         + Int64(t.q_start + s) * o_stride_s)
                row_ptr = cute.recast_ptr(ptrs.o_ptr + o_off, dtype=cutlass.Uint32)
                gRow = cute.make_tensor(row_ptr + (tidx % 4), cute.make_layout(n_pairs, stride=4))
                for j in cutlass.range_constexpr(n_pairs):
                    gRow[j] = rO32_mn[r, j]

    @cute.jit
    def store_lse(self, tidx, s, head, t: _Tile, lse, ptrs: Ptrs, strides: Strides):
        """The LSE of query row ``s`` of ``head``, by one thread of the row's quad."""
        if tidx % 4 == 0:
            lse_off = (Int64(head) * strides.lse_stride_h
                       + Int64(t.batch) * strides.lse_stride_b + Int64(t.q_start + s))
            cute.make_tensor(ptrs.lse_ptr + lse_off, cute.make_layout(1))[0] = lse

    @cute.jit
    def store_out_staged(self, tidx, f: _Frags, t: _Tile, lse_vals, ptrs: Ptrs,
                         strides: Strides, shape: Shape, stage):
        """``store_out`` through shared memory (``Tile.staged_store``): each MMA warpgroup
        writes its 64 rows of O (16-bit) into shared memory, syncs its 128 threads, then copies
        whole 16-byte chunks of rows to global memory: each store instruction writes two to
        four full 128-byte lines instead of eight 16-byte pieces of eight rows (``store_out``:
        four times the store requests, at the tile's end, through the MIO queue that the other
        warpgroups' exponentials use). Rows past the tile's sequence end are not written, as in
        ``store_out``; the values are the same. Plain 32-bit shared stores, not stmatrix: its
        ``.aligned`` form made ptxas add convergence barriers all over the kernel, and the
        producer warp spilled (docs/perf-notes.md v19).

        ``stage`` is ``(q_base,)``: the warpgroup's own rows of this tile's Q stage at shared
        address ``q_base`` (its last S wgmma has completed, and no other warpgroup reads those
        rows); or, with ``Tile.o_buffer``, ``(o_base, mbar_o, phase)``: the 64-row O buffer at
        ``o_base``, which the warpgroups take in turn — warpgroup ``w`` waits for ``mbar_o[w]``
        (completed by the warpgroup before it in the ring, or at once for warpgroup 0's first
        tile) and, once its rows are read back, arrives on ``mbar_o[w + 1]``. ``phase`` is the
        parity of the warpgroup's epilogues so far. mbarriers, not a named barrier's
        arrive/sync: compute-sanitizer's racecheck models the mbarrier hand-over (it reported
        the named-barrier one as a hazard, docs/perf-notes.md v19)."""
        wg = self.mma_wg(tidx)
        # The thread's addresses computed here, not hoisted out of the tile loop into registers
        # that the whole mainloop would carry.
        tidx = _opaque_u32(tidx)
        lt = tidx % 128
        lane = tidx % 32
        base = stage[0]
        buf_rows, row_off = self.tile_m, 0  # the Q stage: rows as in the tile
        if cutlass.const_expr(self.o_buffer):
            buf_rows, row_off = 64, wg * 64  # the O buffer: the warpgroup's rows 0..63
        rO = cute.make_rmem_tensor(f.acc_O.layout, self.dtype)
        rO.store(f.acc_O.load().to(self.dtype))
        rO32_mn = _acc_mn_view(cute.recast_tensor(rO, cutlass.Uint32))  # (2 rows, hd/8 pairs)
        if cutlass.const_expr(self.o_buffer):
            mbar_o, phase = stage[1], stage[2]
            # Epilogue k of warpgroup w > 0 waits for phase k of mbar_o[w] (warpgroup w - 1's
            # epilogue k); warpgroup 0's for phase k - 1 of mbar_o[0] (the last warpgroup's
            # epilogue k - 1; for k = 0 the fresh barrier's "previous" phase: at once).
            cute.arch.mbarrier_wait(mbar_o + wg, phase ^ (Int32(1) - cutlass.min(wg, Int32(1))))
        if cutlass.const_expr(self.q_stages == 1 or self.o_buffer):
            # One buffer: the warpgroup's reads of it in its previous tile (the copy-out
            # below) come before these writes. (With two Q stages, the other stage's epilogue
            # between them has this barrier.)
            cute.arch.barrier(barrier_id=4 + wg, number_of_threads=128)
        # Each pair (c, c+1) of accumulator row r as one 32-bit word at (row, 8j + 2 (lane % 4)):
        # in a store instruction the warp's eight rows of a pair column fall in eight
        # different 16-byte bank groups (the swizzle), so every store is one wavefront.
        srow = _frag_row(tidx, 0) - row_off  # row 0; row 1 is 8 rows down (same swizzle phase)
        rb = self.q_row_bytes
        k = rb // 16
        for j in cutlass.range_constexpr(self.hd // 8):
            addr = base + _swizzled_offset(srow, j % k, j // k, buf_rows, rb) + 4 * (lane % 4)
            for r in cutlass.range_constexpr(2):
                _st_shared_u32(addr + r * 8 * rb, rO32_mn[r, j])
        for r in cutlass.range_constexpr(2):
            s, head = self.row_target(tidx, r, t, shape)
            if s < t.sq:
                self.store_lse(tidx, s, head, t, lse_vals[r], ptrs, strides)
        cute.arch.barrier(barrier_id=4 + wg, number_of_threads=128)
        # The warpgroup's 64 rows are 64 * hd / 8 chunks of 16 bytes; thread lt copies chunks
        # lt, lt + 128, ... (row = chunk // (hd / 8)).
        chunks = self.hd // 8
        o_stride_s = cute.assume(strides.o_stride_s, divby=8)
        o_stride_h = cute.assume(strides.o_stride_h, divby=8)
        o_stride_b = cute.assume(strides.o_stride_b, divby=8)
        items = [((lt + 128 * i) // chunks, (lt + 128 * i) % chunks)
                 for i in range(64 * chunks // 128)]  # (row of the warpgroup's 64, chunk)
        # All reads first (their latencies overlap), then the stores.
        words = [_ld_shared_v4(base + _swizzled_offset(wg * 64 - row_off + row, ch % k, ch // k,
                                                       buf_rows, rb))
                 for row, ch in items]
        if cutlass.const_expr(self.o_buffer):
            # The reads are done (their values are in registers): the next warpgroup's turn.
            cute.arch.mbarrier_arrive(mbar_o + (wg + 1) % self.num_mma_wg)
        s0 = t.m_block * self.tile_m + wg * 64
        addr = ptrs.o_ptr.toint() + 2 * (Int64(t.head) * o_stride_h + Int64(t.batch) * o_stride_b
                                         + Int64(t.q_start + s0) * o_stride_s)
        for i in cutlass.range_constexpr(len(items)):
            row, ch = items[i]
            if s0 + row < t.sq:
                _st_global_v4(addr + 2 * (Int64(row) * o_stride_s + Int64(ch * 8)), words[i])
        if cutlass.const_expr(not self.o_buffer):
            # The producer's next TMA load into this Q stage comes after the release (async
            # proxy after these generic reads).
            cute.arch.fence_view_async_shared()

    @cute.jit
    def store_partial(self, tidx, f: _Frags, t: _Tile, lse_vals, ptrs: Ptrs, shape: Shape):
        """Split-KV: normalised fp32 O to oacc (num_splits, acc_rows, heads, d) and the LSE to
        lseacc (num_splits, acc_rows, heads); acc row = batch * seqlen_q + row (dense) or
        q_start + row (varlen)."""
        acc_O_mn = f.acc_O_mn
        n_cols = cute.size(acc_O_mn, mode=[1])
        row_base = t.batch * shape.seqlen_q
        if shape.seq_mode & SEQ_VARLEN != 0:
            row_base = t.q_start
        for r in cutlass.range_constexpr(cute.size(acc_O_mn, mode=[0])):
            s, head = self.row_target(tidx, r, t, shape)
            if s < t.sq:
                n = ((Int64(t.split) * shape.acc_rows + Int64(row_base + s)) * shape.num_heads
                     + Int64(head))
                if tidx % 4 == 0:
                    cute.make_tensor(ptrs.lseacc_ptr + n, cute.make_layout(1))[0] = lse_vals[r]
                gRow = cute.make_tensor(ptrs.oacc_ptr + (n * self.hd + Int64(2 * (tidx % 4))),
                                        cute.make_layout((2, n_cols // 2), stride=(1, 8)))
                for c in cutlass.range_constexpr(n_cols):
                    gRow[c % 2, c // 2] = acc_O_mn[r, c]
