"""The launch ABI of fa4_aot kernels, defined once.

The build writes :func:`launch_record` into the manifest for every kernel (and checks it
against the ``.entry`` signature of the PTX it compiled); the runtime reads that record back and
packs one buffer per parameter from it. Pure Python: no cutlass, no torch, no CUDA.

A parameter record is a dict with ``name``, ``kind``, ``size`` and ``align`` (bytes, as in the
PTX ``.param`` declaration) and, by kind:

``tensormap``  a CUtensorMap passed by value (``.param .align 64 .b8 [128]``), built with
               ``cuTensorMapEncodeTiled``: ``tensor`` (q/k/v), ``dims`` (the logical axes of the
               user tensor, innermost first, from ``b``/``s``/``h``/``d``), ``box`` (elements per
               dim), ``swizzle``, ``interleave``, ``l2_promotion``, ``oob_fill``.
``i32_tuple``  a struct of int32 (the dynamic shape of a TMA coordinate tensor): ``values``.
``ptr``        a 64-bit device pointer: ``value``.
``i64``/``i32``/``f32``  one scalar: ``value``.
``static``     a placeholder the DSL emits for compile-time objects (``.b8 [1]``): zero bytes.

Value names (``values``/``value``) refer to the per-launch values the runtime computes
(:data:`LAUNCH_VALUES` documents each).
"""

from __future__ import annotations

ABI_VERSION = 2

LAUNCH_VALUES = {
    "seqlen_q": "query length",
    "seqlen_k": "key/value length",
    "num_heads": "query heads",
    "num_heads_k": "key/value heads",
    "batch": "batch size (number of documents for varlen)",
    "q_rows": "rows of the q tensor the TMA descriptor covers (seqlen_q, or total_q for varlen)",
    "k_rows": "rows of the k/v tensors (seqlen_k, or total_k for varlen)",
    "tma_batch": "batch extent of the TMA descriptors (1 for varlen: packed documents)",
    "qhead_per_kvhead": "num_heads // num_heads_k (GQA/MQA group size)",
    "num_m_blocks": "ceil(seqlen_q / tile_m)",
    "section": "heads*batch pairs per L2 section (fa4_aot.schedule.choose_section)",
    "num_tiles": "num_m_blocks * num_heads * batch",
    "softmax_scale_log2": "softmax_scale * log2(e) (softcap kernels: softcap * log2(e))",
    "softmax_scale": "softmax_scale (softcap kernels: softcap)",
    "softcap_pre": "softmax_scale / softcap (softcap kernels; 0 otherwise, unused)",
    "o_ptr": "output, (batch, seqlen_q, heads, d)",
    "o_stride_s": "output stride of the seqlen axis, elements",
    "o_stride_h": "output stride of the head axis, elements",
    "o_stride_b": "output stride of the batch axis, elements",
    "lse_ptr": "fp32 log-sum-exp, contiguous (batch, heads, seqlen_q)",
    "sched_ptr": "int32[2] work-stealing counter (zeroed once, reset by the kernel)",
    "trace_ptr": "int64 trace buffer (trace variant only; null otherwise)",
    "cu_seqlens_q": "int32 (batch + 1) document offsets of packed q (varlen; null otherwise)",
    "cu_seqlens_k": "int32 (batch + 1) document offsets of packed k/v (varlen; null otherwise)",
    "lse_stride_h": "LSE stride of the head axis, elements",
    "lse_stride_b": "LSE stride of the batch axis, elements (0 for varlen: rows are global)",
    "varlen": "1 when q/k/v are packed documents described by cu_seqlens, else 0",
    "window_left": "local mask: keys visible down to row + sk - sq - window_left",
    "window_right": "local mask: keys visible up to row + sk - sq + window_right",
}

# Axis positions of the user tensors, layout (batch, seqlen, heads, head_dim).
AXES = {"b": 0, "s": 1, "h": 2, "d": 3}

# Grid rules: "tiles" launches one CTA per tile; "persistent" launches
# min(num_tiles, ctas_per_sm * SM count of the device at launch time).
GRID_RULES = ("tiles", "persistent")


def _tensormap(name, tensor, dtype, box, swizzle):
    return {
        "name": name, "kind": "tensormap", "size": 128, "align": 64,
        "tensor": tensor, "dtype": dtype, "dims": ["d", "s", "h", "b"], "box": list(box),
        "swizzle": swizzle, "interleave": "none", "l2_promotion": "256B", "oob_fill": "zero",
    }


def head_dim_swizzle(head_dim: int, elem_bytes: int = 2) -> tuple[int, str]:
    """(box elements along d, swizzle) of the TMA loads: the widest swizzle (128/64/32 bytes)
    whose row divides head_dim — the shared-memory layout atom the CuTe DSL picks for a
    d-contiguous wgmma operand, so the TMA box is one swizzle row wide."""
    for sw in (128, 64, 32):
        if (head_dim * elem_bytes) % sw == 0:
            return sw // elem_bytes, f"{sw}B"
    raise ValueError(f"head_dim {head_dim}: rows are not a multiple of 32 bytes")


def _shape(name, values):
    return {"name": name, "kind": "i32_tuple", "size": 4 * len(values), "align": 4,
            "values": list(values)}


def _scalar(kind, value):
    size = {"ptr": 8, "i64": 8, "i32": 4, "f32": 4}[kind]
    return {"name": value, "kind": kind, "size": size, "align": size, "value": value}


# Compile-time objects the DSL still declares as 1-byte parameters, per architecture: the two
# tiled MMAs of FlashFwdSm90; FlashFwdSm100 builds its MMAs inside the kernel.
STATIC_PARAMS_BY_ARCH = {"sm_90a": 2, "sm_100a": 0}


# FlashFwdSm90 also takes the varlen / window / LSE-stride / softcap parameters; FlashFwdSm100 does not
# (yet): its list is the base one.
EXTENDED_BY_ARCH = {"sm_90a": True, "sm_100a": False}


def fwd_params(dtype: str, head_dim: int, tile_m: int, tile_n: int,
               n_static: int = 2, extended: bool = True) -> list[dict]:
    """Parameter list of the forward kernels, in order (the kernels' ``__call__`` signatures)."""
    box_inner, swz = head_dim_swizzle(head_dim)  # d is loaded in box_inner-wide chunks
    params = [
        _tensormap("tma_q", "q", dtype, (box_inner, tile_m, 1, 1), swz),
        _shape("q_shape", ("q_rows", "num_heads", "tma_batch")),
        _tensormap("tma_k", "k", dtype, (box_inner, tile_n, 1, 1), swz),
        _shape("k_shape", ("k_rows", "num_heads_k", "tma_batch")),
        _tensormap("tma_v", "v", dtype, (box_inner, tile_n, 1, 1), swz),
        _shape("v_shape", ("k_rows", "num_heads_k", "tma_batch")),
        _scalar("ptr", "o_ptr"),
        _scalar("ptr", "lse_ptr"),
        _scalar("ptr", "sched_ptr"),
        _scalar("ptr", "trace_ptr"),
    ]
    if extended:
        params += [_scalar("ptr", "cu_seqlens_q"), _scalar("ptr", "cu_seqlens_k")]
    params += [_scalar("i64", v) for v in ("o_stride_s", "o_stride_h", "o_stride_b")]
    if extended:
        params += [_scalar("i64", "lse_stride_h"), _scalar("i64", "lse_stride_b")]
    for v in ("seqlen_q", "seqlen_k", "num_heads", "qhead_per_kvhead", "num_m_blocks",
              "section", "num_tiles"):
        params.append(_scalar("i32", v))
    if extended:
        params += [_scalar("i32", v) for v in ("varlen", "window_left", "window_right")]
    params += [_scalar("f32", "softmax_scale_log2"), _scalar("f32", "softmax_scale")]
    if extended:
        params.append(_scalar("f32", "softcap_pre"))
    params += [{"name": f"static_{i}", "kind": "static", "size": 1, "align": 1}
               for i in range(n_static)]
    return params


def launch_record(cfg, dynamic_smem_bytes: int) -> dict:
    """The manifest's ``launch`` record for a kernel configuration."""
    t = cfg.tile
    # CLC launches one CTA per tile: CTAs that finish early cancel not-yet-started ones and
    # take their tile; "single" is one CTA per tile too. static/steal are persistent.
    one_per_tile = cfg.scheduler in ("single", "clc")
    return {
        "abi_version": ABI_VERSION,
        "params": fwd_params(cfg.dtype, cfg.head_dim, t.m, t.n, STATIC_PARAMS_BY_ARCH[cfg.arch],
                             EXTENDED_BY_ARCH[cfg.arch]),
        "block": [cfg.threads, 1, 1],
        "cluster": [1, 1, 1],
        "dynamic_smem_bytes": dynamic_smem_bytes,
        "grid": {"rule": "tiles" if one_per_tile else "persistent", "ctas_per_sm": 1},
        "tile": {"m": t.m, "n": t.n},
        "needs_counter": cfg.scheduler == "steal",
        "trace": cfg.trace,
    }


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
