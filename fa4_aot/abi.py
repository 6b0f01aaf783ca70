"""The launch ABI of fa4_aot kernels, defined once.

Each kernel family has one ordered :class:`KernelSpec`: the TMA-loaded tensors, then groups of
scalar/pointer arguments (``FWD_SM90``; ``FWD_SM90_FP8`` = ``FWD_SM90`` + the descales;
``FWD_SM100`` and ``COMBINE_SM90`` take subsets). Everything else is generated from it:

* the kernels take one NamedTuple per group (``spec.group_types()``; fields = the spec's
  names, in order), so a kernel reads ``shape.seqlen_q`` instead of the 17th positional
  argument;
* the build (``build_tools/dsl_compile.py``) makes the fake arguments of ``cute.compile`` from
  it, checks that the kernel's ``__call__`` takes exactly the spec's arguments in the spec's
  order (:func:`check_signature`) and checks the PTX ``.entry`` against :func:`ptx_params`
  (count, size, alignment);
* the manifest stores :func:`launch_record` (the ordered parameter records, with names), and
  the runtime packs each launch from that record.

A parameter record is a dict with ``name``, ``kind``, ``size`` and ``align`` (bytes, as in the
PTX ``.param`` declaration) and, by kind:

``tensormap``  a CUtensorMap passed by value (``.param .align 64 .b8 [128]``), built with
               ``cuTensorMapEncodeTiled``: ``tensor`` (q/k/v), ``dims`` (the logical axes of the
               user tensor, innermost first, from ``b``/``s``/``h``/``d``), ``box`` (elements per
               dim), ``swizzle``, ``interleave``, ``l2_promotion``, ``oob_fill``.
``i32_tuple``  a struct of int32 (the dynamic shape of a TMA coordinate tensor): ``values``.
``ptr``        a 64-bit device pointer: ``value``.
``i64``/``i32``/``f32``  one scalar: ``value``.

Value names (``values``/``value``) are the per-launch values the runtime computes;
:data:`LAUNCH_VALUES` documents each (generated from the specs). Pure Python: no cutlass, no
torch, no CUDA.
"""

from __future__ import annotations

import enum
import inspect
from collections import namedtuple
from dataclasses import dataclass

ABI_VERSION = 5


class SeqMode(enum.IntFlag):
    """Bits of the launch value ``seq_mode``: which per-batch-entry length sources a launch uses.

    Plain varlen sets ``VARLEN | VARLEN_K``; paged KV with packed queries (chunked prefill) sets
    ``VARLEN | USED_K``. ``COMPACT`` (with ``VARLEN``, prefill kernels only): the tile indices
    the scheduler hands out count only the non-empty m-blocks of the documents."""

    NONE = 0
    VARLEN = 1  # packed q documents (cu_seqlens_q)
    USED_Q = 2  # seqused_q cuts each entry's query rows
    USED_K = 4  # seqused_k cuts each entry's keys
    VARLEN_K = 8  # packed k/v documents (cu_seqlens_k)
    COMPACT = 16  # varlen tiles counted compactly


# What a kernel supports beyond plain (batch, seqlen) attention: the manifest's
# ``launch.capabilities``; the planner refuses a call that needs one its kernel lacks.
CAPABILITIES = ("varlen", "window", "seqused", "paged", "split_kv", "pack_gqa", "softcap",
                "trace", "fp8_kv", "fp8_qkv")
# The decode kernels load a key block of K/V in TMA boxes of ``kv_box_rows`` keys (a launch
# value: the whole n tile for contiguous K/V, gcd(page_size, n tile) with paged KV, so that a box
# never crosses a page); their shared-memory stage is laid out in KV_CHUNK-key pieces, and a box
# of kv_box_rows keys fills kv_box_rows / KV_CHUNK consecutive pieces.
KV_CHUNK = 16


@dataclass(frozen=True)
class Arg:
    """One scalar or pointer argument. ``elem`` (pointers): element type, ``"io"`` = the kernel's
    16-bit dtype; ``align``: the alignment the kernel may assume (bytes)."""

    name: str
    kind: str  # ptr | i64 | i32 | f32
    doc: str
    elem: str = ""
    align: int = 0


@dataclass(frozen=True)
class Group:
    name: str  # NamedTuple type name inside the kernels
    args: tuple


@dataclass(frozen=True)
class KernelSpec:
    family: str
    tensors: tuple  # TMA-loaded (b, s, h, d) tensors: a CUtensorMap + its (rows, heads, batch)
    groups: tuple

    @property
    def host_args(self) -> list[str]:
        """The kernel ``__call__`` arguments, in order (the stream follows them)."""
        return [f"m{t.upper()}" for t in self.tensors] + [g.name.lower() for g in self.groups]

    def args(self):
        for g in self.groups:
            yield from g.args

    def group(self, name: str) -> "Group":
        """The group called ``name`` (``Ptrs``, ``Strides``, ``Shape``, ``Softmax``, ``Redo``)."""
        for g in self.groups:
            if g.name == name:
                return g
        raise KeyError(f"{self.family} has no group {name!r}")

    def arg_names(self, group: str) -> tuple:
        return tuple(a.name for a in self.group(group).args)

    def group_types(self) -> dict:
        """{group name: NamedTuple type} with the spec's field names, in order (one type per
        group, shared by the specs that have it: the kernels' annotations and the build's
        values must be the same classes)."""
        return {g.name: _group_type(g) for g in self.groups}


def _group_type(g: Group):
    t = _GROUP_TYPES.get(g)
    if t is None:
        t = _GROUP_TYPES[g] = namedtuple(g.name, [a.name for a in g.args])
    return t


_GROUP_TYPES: dict = {}


def _ptrs(*args):
    return Group("Ptrs", tuple(Arg(n, "ptr", d, elem=e, align=al) for n, e, al, d in args))


def _scalars(group, kind, *args):
    return Group(group, tuple(Arg(n, kind, d) for n, d in args))


# ------------------------------------------------------------------ the forward, sm_90a
FWD_SM90 = KernelSpec("fwd_sm90", ("q", "k", "v"), (
    _ptrs(
        ("q_ptr", "io", 16, "q, for kernels that load Q without TMA (packed GQA), else unused"),
        ("o_ptr", "io", 16, "output, (batch, seqlen_q, heads, d)"),
        ("lse_ptr", "f32", 4, "fp32 log-sum-exp, (batch, heads, seqlen_q) / varlen (heads, total_q)"),
        ("oacc_ptr", "f32", 16, "split-KV: fp32 partial outputs (num_splits, acc_rows, heads, d)"),
        ("lseacc_ptr", "f32", 4, "split-KV: fp32 partial LSE (num_splits, acc_rows, heads)"),
        ("sched_ptr", "i32", 4, "int32[2] work-stealing counter (zeroed once, reset by the kernel)"),
        ("trace_ptr", "i64", 8, "int64 trace buffer (trace kernels only; null otherwise)"),
        ("cu_seqlens_q", "i32", 4, "int32 (batch + 1) document offsets of packed q (varlen)"),
        ("cu_seqlens_k", "i32", 4, "int32 (batch + 1) document offsets of packed k/v (varlen)"),
        ("seqused_q", "i32", 4, "int32 (batch,) used query rows per batch entry (SeqMode.USED_Q)"),
        ("seqused_k", "i32", 4, "int32 (batch,) used keys per batch entry (SeqMode.USED_K)"),
        ("page_table", "i32", 4, "paged KV (decode kernels): int32 (batch, pages_per_seq) page "
                                 "indices into k/v (num_pages, page_size, kv_heads, d)"),
    ),
    _scalars("Strides", "i64",
             ("q_stride_s", "q stride of the seqlen axis, elements"),
             ("q_stride_h", "q stride of the head axis, elements"),
             ("q_stride_b", "q stride of the batch axis, elements (0 for varlen)"),
             ("o_stride_s", "output stride of the seqlen axis, elements"),
             ("o_stride_h", "output stride of the head axis, elements"),
             ("o_stride_b", "output stride of the batch axis, elements (0 for varlen)"),
             ("lse_stride_h", "LSE stride of the head axis, elements"),
             ("lse_stride_b", "LSE stride of the batch axis, elements (0 for varlen)"),
             ("page_table_stride", "paged KV: page_table row stride, elements")),
    _scalars("Shape", "i32",
             ("seqlen_q", "query length (max_seqlen_q for varlen)"),
             ("seqlen_k", "key/value length (max_seqlen_k for varlen)"),
             ("num_heads", "query heads"),
             ("qhead_per_kvhead", "num_heads // num_heads_k (GQA/MQA group size)"),
             ("num_m_blocks", "m-blocks per (head, batch) pair: ceil(rows / tile_m), rows = "
                              "seqlen_q (seqlen_q * group with packed GQA)"),
             ("section", "(head, batch) pairs per L2 section (fa4_aot.schedule.choose_section)"),
             ("num_tiles", "num_m_blocks * heads * batch * num_splits (heads = kv heads with "
                           "packed GQA)"),
             ("num_splits", "split-KV: key ranges per tile (1 = no split)"),
             ("acc_rows", "split-KV: rows of the partial buffers (batch * seqlen_q, or total_q)"),
             ("seq_mode", "SeqMode bits: 1 varlen (cu_seqlens); 2 seqused_q; 4 seqused_k; "
                          "8 packed k/v; 16 varlen tiles counted compactly"),
             ("window_left", "local mask: keys visible down to row + sk - sq - window_left"),
             ("window_right", "local mask: keys visible up to row + sk - sq + window_right"),
             ("page_size", "paged KV: keys per page (a multiple of 16); 0 = contiguous K/V"),
             ("pages_per_seq", "paged KV: page_table columns (page indices read are clamped "
                               "to them)"),
             ("kv_box_rows", "decode kernels: keys per K/V TMA box (the n tile for contiguous "
                             "K/V, gcd(page_size, n tile) with paged KV)")),
    _scalars("Softmax", "f32",
             ("softmax_scale_log2", "softmax_scale * log2(e) (softcap: softcap * log2(e))"),
             ("softmax_scale", "softmax_scale (softcap: softcap)"),
             ("softcap_pre", "softmax_scale / softcap (0: no softcap)")),
    # Last, so that the kernels that do not read them keep every other parameter's place.
    Group("Redo", _ptrs(
        ("k_ptr", "io", 16, "k, read by Tile.lazy_reference's exact recomputation (prefill)"),
        ("v_ptr", "io", 16, "v, read by Tile.lazy_reference's exact recomputation (prefill)"),
    ).args + _scalars("Redo", "i64",
                      ("k_stride_s", "k stride of the seqlen axis, elements"),
                      ("k_stride_h", "k stride of the head axis, elements"),
                      ("k_stride_b", "k stride of the batch axis, elements (0 for packed k/v)"),
                      ("v_stride_s", "v stride of the seqlen axis, elements"),
                      ("v_stride_h", "v stride of the head axis, elements"),
                      ("v_stride_b", "v stride of the batch axis, elements (0 for packed k/v)"),
                      ).args),
))

# ------------------------------------------------------------------ FP8 decode, sm_90a
# The sm_90a forward of e4m3 inputs (KernelConfig.fp8): FWD_SM90 and the descales, FA3's names
# and meaning: fp32 (batch, heads_k), the dequantized input = the e4m3 value * its descale.
FWD_SM90_FP8 = KernelSpec("fwd_sm90_fp8", FWD_SM90.tensors, FWD_SM90.groups + (
    Group("Quant", _ptrs(
        ("q_descale", "f32", 4, "fp32 (batch, heads_k) descale of an e4m3 q (unused otherwise)"),
        ("k_descale", "f32", 4, "fp32 (batch, heads_k) descale of the e4m3 k"),
        ("v_descale", "f32", 4, "fp32 (batch, heads_k) descale of the e4m3 v"),
    ).args + _scalars("Quant", "i64",
                      ("q_descale_stride_b", "q_descale stride of the batch axis, elements"),
                      ("q_descale_stride_h", "q_descale stride of the head axis, elements"),
                      ("k_descale_stride_b", "k_descale stride of the batch axis, elements"),
                      ("k_descale_stride_h", "k_descale stride of the head axis, elements"),
                      ("v_descale_stride_b", "v_descale stride of the batch axis, elements"),
                      ("v_descale_stride_h", "v_descale stride of the head axis, elements"),
                      ).args),
))


# ------------------------------------------------------------------ the forward, sm_100a
def _subset(spec: KernelSpec, group: str, names) -> Group:
    """Group ``group`` of ``spec`` restricted to ``names`` (kept in the spec's order)."""
    return Group(group, tuple(a for a in spec.group(group).args if a.name in names))


FWD_SM100 = KernelSpec("fwd_sm100", ("q", "k", "v"), (
    _subset(FWD_SM90, "Ptrs", ("o_ptr", "lse_ptr", "sched_ptr", "trace_ptr")),
    _subset(FWD_SM90, "Strides", ("o_stride_s", "o_stride_h", "o_stride_b")),
    _subset(FWD_SM90, "Shape", ("seqlen_q", "seqlen_k", "num_heads", "qhead_per_kvhead",
                                "num_m_blocks", "section", "num_tiles")),
    _subset(FWD_SM90, "Softmax", ("softmax_scale_log2", "softmax_scale")),
))

# The output and LSE strides, shared by the forward and the combine kernel.
OUT_STRIDES = ("o_stride_s", "o_stride_h", "o_stride_b", "lse_stride_h", "lse_stride_b")

# ------------------------------------------------------------------ split-KV combine, sm_90a
COMBINE_SM90 = KernelSpec("combine_sm90", (), (
    _ptrs(
        ("oacc_ptr", "f32", 16, "fp32 partial outputs (num_splits, acc_rows, heads, d)"),
        ("lseacc_ptr", "f32", 4, "fp32 partial LSE (num_splits, acc_rows, heads)"),
        ("o_ptr", "io", 16, "output, (batch, seqlen_q, heads, d)"),
        ("lse_ptr", "f32", 4, "fp32 LSE, (batch, heads, seqlen_q) / varlen (heads, total_q)"),
    ),
    _subset(FWD_SM90, "Strides", OUT_STRIDES),
    _scalars("Shape", "i32",
             ("num_splits", "partial results per row"),
             ("acc_rows", "rows of the partial buffers (batch * seqlen_q, or total_q)"),
             ("seqlen_q", "rows per batch entry (total_q for varlen: one batch entry)"),
             ("num_heads", "query heads")),
))

SPECS = {s.family: s for s in (FWD_SM90, FWD_SM90_FP8, FWD_SM100, COMBINE_SM90)}


def spec_for(cfg) -> KernelSpec:
    if cfg.kind == "combine":
        return COMBINE_SM90
    if cfg.arch != "sm_90a":
        return FWD_SM100
    return FWD_SM90_FP8 if cfg.fp8 else FWD_SM90


LAUNCH_VALUES = {
    **{a.name: a.doc for s in SPECS.values() for a in s.args()},
    "q_rows": "rows of the q tensor the TMA descriptor covers (seqlen_q, or total_q for varlen)",
    "k_rows": "rows of the k/v tensors (seqlen_k, total_k for varlen, page_size when paged)",
    "num_heads_k": "key/value heads",
    "q_batch": "batch extent of q's TMA descriptor (1 for varlen: packed documents)",
    "k_batch": "batch extent of the k/v TMA descriptors (1 for varlen; num_pages when paged)",
    "vt_rows": "FP8 prefill: keys of the transposed v (seqlen_k rounded up to VT_GROUP)",
}
# The FP8 prefill kernels read V transposed, (batch, heads_k, d, keys) with the keys of each
# group of VT_GROUP in the order VT_ORDER (slot s holds key VT_ORDER[s]): the order in which a
# thread's fp32 accumulator values of S sit in its registers, so that P's e4m3 A operand is
# packed from them without moving values between threads. A wgmma k32 A fragment gives thread
# lane % 4 = t the slots 4t..4t+3 and 16+4t..16+4t+3 of its rows; its accumulator holds the
# columns 2t, 2t+1, 8+2t, 9+2t (and 16 more for the second half). Key 16h + 8a + 2t + c sits
# at slot 16h + 4t + 2a + c: an axis permutation (fa4_aot.interface.transposed_v).
VT_GROUP = 32
VT_ORDER = tuple(16 * h + 2 * t + (j & 1) + 8 * (j >> 1)
                 for h in range(2) for t in range(4) for j in range(4))

# Axis positions of the user tensors, layout (batch, seqlen, heads, head_dim).
AXES = {"b": 0, "s": 1, "h": 2, "d": 3}
_SHAPE_VALUES = {"q": ("q_rows", "num_heads", "q_batch"),
                 "k": ("k_rows", "num_heads_k", "k_batch"),
                 "v": ("k_rows", "num_heads_k", "k_batch")}
_SIZES = {"ptr": 8, "i64": 8, "i32": 4, "f32": 4}


# Bytes per element of the tensors' storage types (KernelConfig.q_storage / kv_storage).
ELEM_BYTES = {"bf16": 2, "fp16": 2, "e4m3": 1}


def head_dim_swizzle(head_dim: int, elem_bytes: int = 2) -> tuple[int, str]:
    """(box elements along d, swizzle) of the TMA loads: the widest swizzle (128/64/32 bytes)
    whose row divides head_dim — the shared-memory layout atom the CuTe DSL picks for a
    d-contiguous wgmma operand, so the TMA box is one swizzle row wide."""
    for sw in (128, 64, 32):
        if (head_dim * elem_bytes) % sw == 0:
            return sw // elem_bytes, f"{sw}B"
    raise ValueError(f"head_dim {head_dim}: rows are not a multiple of 32 bytes")


def ptx_params(spec: KernelSpec, dtype: str, head_dim: int, tile_m: int, tile_n: int,
               kv_l2_promotion: str = "256B", storage: dict | None = None,
               v_transposed: bool = False) -> list[dict]:
    """The kernel's PTX parameters, in order, as manifest records. ``tile_m``/``tile_n``: rows
    of the Q and K/V TMA boxes, an int or the name of a launch value (the decode kernels' K/V
    box, ``kv_box_rows``: the runtime encodes the descriptor with that value).
    ``kv_l2_promotion``: the L2 promotion of the K/V descriptors (what L2 fetches from DRAM on
    a miss; see :func:`launch_record`). ``storage``: element type per tensor where it is not
    ``dtype`` (FP8: ``{"k": "e4m3", ...}``). ``v_transposed`` (FP8 prefill): v is read as V^T,
    keys innermost (one swizzle row of keys x head_dim rows a box), ``vt_rows`` keys long."""
    params = []
    for t in spec.tensors:
        rows = tile_m if t == "q" else tile_n
        elem = (storage or {}).get(t, dtype)
        if t == "v" and v_transposed:  # keys innermost, loaded in box_inner-wide chunks
            box_inner, swz = head_dim_swizzle(tile_n, ELEM_BYTES[elem])
            dims, box, shape = ["s", "d", "h", "b"], [box_inner, head_dim, 1, 1], \
                ["vt_rows", "num_heads_k", "k_batch"]
        else:  # d is loaded in box_inner-wide chunks
            box_inner, swz = head_dim_swizzle(head_dim, ELEM_BYTES[elem])
            dims, box, shape = ["d", "s", "h", "b"], [box_inner, rows, 1, 1], \
                list(_SHAPE_VALUES[t])
        params.append({
            "name": f"tma_{t}", "kind": "tensormap", "size": 128, "align": 64, "tensor": t,
            "dtype": elem, "dims": dims, "box": box,
            "swizzle": swz, "interleave": "none",
            "l2_promotion": "256B" if t == "q" else kv_l2_promotion, "oob_fill": "zero"})
        params.append({"name": f"{t}_shape", "kind": "i32_tuple", "size": 12, "align": 4,
                       "values": shape})
    for a in spec.args():
        size = _SIZES[a.kind]
        params.append({"name": a.name, "kind": a.kind, "size": size, "align": size,
                       "value": a.name})
    return params


def launch_record(cfg, dynamic_smem_bytes: int) -> dict:
    """The manifest's ``launch`` record for a kernel configuration."""
    t = cfg.tile
    spec = spec_for(cfg)
    if cfg.kind == "combine":
        grid = {"rule": "rows", "rows_per_cta": cfg.threads // 32}  # one warp per (row, head)
    else:
        # CLC launches one CTA per tile: CTAs that finish early cancel not-yet-started ones and
        # take their tile; "single" is one CTA per tile too. static/steal are persistent.
        one_per_tile = cfg.scheduler in ("single", "clc")
        grid = {"rule": "tiles" if one_per_tile else "persistent", "ctas_per_sm": 1}
    return {
        "abi_version": ABI_VERSION,
        "family": spec.family,
        # The decode kernels stream K/V from HBM once: 128-byte L2 promotion fetches no lines
        # they do not read (docs/design.md#tile-choices). Prefill: left at 256.
        "params": ptx_params(spec, cfg.dtype, cfg.head_dim, t.m,
                             "kv_box_rows" if cfg.decode else t.n,
                             kv_l2_promotion="128B" if cfg.decode else "256B",
                             storage={"q": cfg.q_storage, "k": cfg.kv_storage,
                                      "v": cfg.kv_storage} if cfg.kind == "fwd" else None,
                             v_transposed=bool(cfg.fp8) and not cfg.decode),
        "block": [cfg.threads, 1, 1],
        "cluster": [1, 1, 1],
        "dynamic_smem_bytes": dynamic_smem_bytes,
        "grid": grid,
        "tile": {"m": t.m, "n": t.n},
        "pack_gqa": cfg.decode,
        "needs_counter": cfg.scheduler == "steal",
        "trace": cfg.trace,
        "capabilities": capabilities(cfg),
    }


def capabilities(cfg) -> list[str]:
    """The :data:`CAPABILITIES` of a kernel configuration (its manifest record says them, so
    the runtime never guesses them from parameter names)."""
    if cfg.kind == "combine":
        return []
    caps = set()
    if cfg.arch == "sm_90a":  # seq_mode: cu_seqlens and seqused_q/k at run time
        caps |= {"varlen", "seqused"}
    if cfg.local:  # the window sizes are launch values
        caps.add("window")
    if cfg.decode:
        caps |= {"paged", "split_kv", "pack_gqa", "softcap"}
    if cfg.softcap:
        caps.add("softcap")
    if cfg.fp8:
        caps.add("fp8_" + cfg.fp8)
    if cfg.trace:
        caps.add("trace")
    return [c for c in CAPABILITIES if c in caps]


def check_signature(spec: KernelSpec, call) -> list[str]:
    """Differences between the spec's host arguments and a kernel ``__call__``'s parameters
    (by name, in order): the spec's order is the PTX order only if the kernel takes its
    arguments in that order."""
    names = [p for p in inspect.signature(call).parameters if p != "self"]
    want = spec.host_args + ["stream"]
    if names != want:
        return [f"{spec.family}: kernel __call__ takes {names}, the spec says {want}"]
    return []


def check_against_ptx(params: list[dict], ptx_params: list[dict]) -> list[str]:
    """Differences between an ABI parameter list and the parsed PTX ``.entry`` params."""
    problems = []
    if len(params) != len(ptx_params):
        problems.append(f"parameter count: ABI has {len(params)}, PTX has {len(ptx_params)}")
    for i, (a, p) in enumerate(zip(params, ptx_params)):
        if a["size"] != p["size"] or a["align"] != p["align"]:
            problems.append(
                f"param {i} ({a['name']}): ABI size/align {a['size']}/{a['align']}, "
                f"PTX {p['size']}/{p['align']}")
    return problems
