"""Validation of an :func:`fa4_aot.attention` call: every check of its arguments, every error
message (each names the argument and what was expected), and the :class:`fa4_aot.plan.CallSpec`
of a valid call. Run once per memo miss, and once when torch.compile traces a call
(:func:`check`). Which kernels exist is not checked here: the planner asks the manifest
(:func:`fa4_aot.plan.refusal`). The call's arguments: :class:`Args`; in the torch op's lists:
:class:`OpTensors`, :class:`OpSizes`."""

from __future__ import annotations

import math
import os
from typing import NamedTuple

from .abi import KV_CHUNK
from .plan import MAX_SPLITS, SCHEDULERS, CallSpec, contiguous_strides

try:
    import torch
except ImportError:  # the build imports fa4_aot without torch
    torch = None

DTYPE_NAMES = {}  # torch dtype -> "bf16" / "fp16" (filled on first use)
# FP8 calls run only with FA4_AOT_EXPERIMENTAL_FP8=1 until the FP8 kernels have passed their GPU
# tests (tests/test_gpu_fp8.py; docs/design.md#fp8): they were built without a GPU at hand.
FP8_ENV = "FA4_AOT_EXPERIMENTAL_FP8"


class Args(NamedTuple):
    """The arguments of one attention call, FlashAttention names (built on a memo miss and
    under torch.compile, never on a memo hit)."""

    q: object
    k: object
    v: object
    causal: object = False
    softmax_scale: object = None
    scheduler: object = "auto"
    window_size: object = (-1, -1)
    softcap: object = 0.0
    cu_seqlens_q: object = None
    cu_seqlens_k: object = None
    max_seqlen_q: object = None
    max_seqlen_k: object = None
    seqused_q: object = None
    seqused_k: object = None
    page_table: object = None
    num_splits: object = None
    out: object = None
    trace: object = None
    q_descale: object = None
    k_descale: object = None
    v_descale: object = None

    @property
    def varlen(self) -> bool:
        return self.cu_seqlens_q is not None or self.cu_seqlens_k is not None


class OpTensors(NamedTuple):
    """``torch.ops.fa4_aot.fwd``'s ``tensors`` list, in order (None where absent; the
    descales may be left off)."""

    cu_seqlens_q: object
    cu_seqlens_k: object
    seqused_q: object
    seqused_k: object
    page_table: object
    q_descale: object = None
    k_descale: object = None
    v_descale: object = None


class OpSizes(NamedTuple):
    """``torch.ops.fa4_aot.fwd``'s ``sizes`` list, in order."""

    max_seqlen_q: int  # 0 without varlen
    max_seqlen_k: int
    window_left: int  # -1: unbounded
    window_right: int
    num_splits: int  # 0: automatic


def dtype_names() -> dict:
    """The 16-bit input dtypes and their names (the MMA and output types)."""
    if not DTYPE_NAMES:
        DTYPE_NAMES.update({torch.bfloat16: "bf16", torch.float16: "fp16"})
    return DTYPE_NAMES


def is_fp8(t) -> bool:
    return t.dtype == torch.float8_e4m3fn


def out_dtype(q):
    """The output dtype of a call: q's, bf16 for an e4m3 q."""
    return torch.bfloat16 if is_fp8(q) else q.dtype


def check_tensor(name, t, rank=4, layout="(batch, seqlen, heads, head_dim)"):
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if t.dim() != rank:
        raise ValueError(f"{name} must have {rank} dims {layout}, got shape {tuple(t.shape)}")
    if t.dtype not in dtype_names() and t.dtype != torch.float8_e4m3fn:
        raise TypeError(f"{name} must be bfloat16 or float16 (or float8_e4m3fn with "
                        f"descales), got {t.dtype}")
    check_strides(name, t)
    if not torch.compiler.is_compiling() and t.data_ptr() % 16:  # no pointer while tracing
        raise ValueError(f"{name} data pointer must be 16-byte aligned")


def check_strides(name, t):
    """A contiguous last dim and 16-byte aligned strides (TMA's rule)."""
    if t.stride(-1) != 1:
        raise ValueError(f"{name} must be contiguous in its last dim (head_dim); "
                         f"got stride {t.stride(-1)}")
    for ax in range(t.dim() - 1):
        if t.shape[ax] > 1 and (t.stride(ax) * t.element_size()) % 16:
            raise ValueError(f"{name}.stride({ax}) = {t.stride(ax)} elements is not a multiple of "
                             f"16 bytes (TMA needs 16-byte aligned strides)")


def check_qkv(a: Args):
    """q, k, v and the scalar arguments (softmax_scale, causal, softcap)."""
    q, k, v = a.q, a.k, a.v
    paged = a.page_table is not None
    rank = 3 if a.varlen else 4
    layout = "(total, heads, head_dim)" if a.varlen else "(batch, seqlen, heads, head_dim)"
    for name, t in (("q", q), ("k", k), ("v", v)):
        if paged and name != "q":  # the KV cache: (num_pages, page_size, heads_k, head_dim)
            check_tensor(name, t, 4, "(num_pages, page_size, heads_k, head_dim) with page_table")
        else:
            check_tensor(name, t, rank, layout)
    if is_fp8(k) or is_fp8(q):  # an e4m3 KV cache with a bf16 or e4m3 q
        if not (is_fp8(k) and is_fp8(v) and q.dtype in (torch.bfloat16, torch.float8_e4m3fn)):
            raise TypeError(f"FP8 calls take float8_e4m3fn k and v with a bfloat16 or "
                            f"float8_e4m3fn q; got q {q.dtype}, k {k.dtype}, v {v.dtype}")
    elif not (q.dtype == k.dtype == v.dtype):
        raise TypeError(f"q, k, v must share a dtype; got {q.dtype}, {k.dtype}, {v.dtype}")
    if not (q.device == k.device == v.device):
        raise ValueError(f"q, k, v must be on the same device; got {q.device}, {k.device}, {v.device}")
    check_kv_shapes(k, v)
    h, d = q.shape[-2:]
    hk, dk = k.shape[-2:]
    if not a.varlen and not paged and k.shape[0] != q.shape[0]:
        raise ValueError(f"k batch {k.shape[0]} != q batch {q.shape[0]}")
    if dk != d:
        raise ValueError(f"k head_dim {dk} != q head_dim {d}")
    if hk == 0 or h % hk:
        raise ValueError(f"q heads ({h}) must be a multiple of k/v heads ({hk})")
    if not isinstance(a.causal, bool):
        raise TypeError(f"causal must be a bool, got {type(a.causal).__name__}")
    # > 0: the kernels take each row's max of the raw scores as the softmax's reference point
    # and mask with -inf, both of which assume a positive scale.
    scale, softcap = a.softmax_scale, a.softcap
    if scale is not None and not (isinstance(scale, (int, float)) and math.isfinite(scale)
                                  and scale > 0):
        raise ValueError(f"softmax_scale must be a finite float > 0 or None, got {scale!r}")
    if (isinstance(softcap, bool) or not isinstance(softcap, (int, float))
            or not math.isfinite(softcap) or softcap < 0):
        raise ValueError(f"softcap must be a finite float >= 0 (0 = no capping), got {softcap!r}")


def check_kv_shapes(k, v):
    if k.shape != v.shape:
        raise ValueError(f"k and v must have the same shape; got {tuple(k.shape)} and {tuple(v.shape)}")


def check_cu_seqlens(name, cu, device=None):
    if not isinstance(cu, torch.Tensor) or cu.dtype != torch.int32 or cu.dim() != 1:
        raise TypeError(f"{name} must be a 1-D int32 tensor (batch + 1 offsets), got "
                        f"{getattr(cu, 'dtype', type(cu).__name__)}")
    if device is not None and cu.device != device:
        raise ValueError(f"{name} must be on {device}, got {cu.device}")
    if cu.numel() < 2:
        raise ValueError(f"{name} must have batch + 1 >= 2 entries, got {cu.numel()}")
    if cu.stride(0) != 1:
        raise ValueError(f"{name} must be contiguous (the kernel reads batch + 1 consecutive "
                         f"int32), got stride {cu.stride(0)}")


def check_varlen_args(a: Args):
    """Types, devices and lengths of the varlen arguments: what the launch depends on. The
    offsets' values are not read here (that costs a device sync): :func:`check_varlen`. Paged
    without ``cu_seqlens_k``: only q is packed (chunked prefill over a paged cache)."""
    sides = [("q", a.cu_seqlens_q, a.max_seqlen_q)]
    if not (a.page_table is not None and a.cu_seqlens_k is None):
        sides.append(("k", a.cu_seqlens_k, a.max_seqlen_k))
    for s, cu, _ in sides:
        check_cu_seqlens(f"cu_seqlens_{s}", cu, a.q.device)
    if len(sides) == 2 and a.cu_seqlens_q.numel() != a.cu_seqlens_k.numel():
        raise ValueError(f"cu_seqlens_q and cu_seqlens_k must have the same length (batch + 1); "
                         f"got {a.cu_seqlens_q.numel()} and {a.cu_seqlens_k.numel()}")
    for s, _, m in sides:
        if not isinstance(m, int) or m < 0:
            raise ValueError(f"max_seqlen_{s} must be a non-negative int with varlen, got {m!r}")


def check_index_tensor(name, t, device, shape, what):
    if not isinstance(t, torch.Tensor) or t.dtype != torch.int32:
        raise TypeError(f"{name} must be an int32 tensor {what}, got "
                        f"{getattr(t, 'dtype', type(t).__name__)}")
    if t.device != device:
        raise ValueError(f"{name} must be on {device} (the kernel reads it), got {t.device}")
    wrong = tuple(t.shape) != tuple(shape) if shape else t.dim() != 2
    if wrong:
        raise ValueError(f"{name} must have shape {tuple(shape) if shape else what}, got "
                         f"{tuple(t.shape)}")
    if t.stride(-1) != 1:
        raise ValueError(f"{name} must be contiguous in its last dim, got strides {t.stride()}")


def check_serving_args(a: Args, batch: int):
    """num_splits, seqused_q/k and page_table. Their values (lengths, page indices) are not read
    on the host: the kernels clamp them (a page outside the cache loads zeros)."""
    ns, table, device = a.num_splits, a.page_table, a.q.device
    if ns is not None and (isinstance(ns, bool) or not isinstance(ns, int)
                           or not 1 <= ns <= MAX_SPLITS):
        raise ValueError(f"num_splits must be None (automatic) or an int in [1, {MAX_SPLITS}], "
                         f"got {ns!r}")
    for name, t in (("seqused_q", a.seqused_q), ("seqused_k", a.seqused_k)):
        if t is not None:
            check_index_tensor(name, t, device, (batch,), "(batch,)")
    if table is not None:
        check_index_tensor("page_table", table, device, None, "(batch, pages_per_seq)")
        if table.shape[0] != batch or table.shape[1] < 1:
            raise ValueError(f"page_table must have shape (batch, pages_per_seq) with batch = "
                             f"{batch} and pages_per_seq >= 1, got {tuple(table.shape)}")
        page_size = a.k.shape[1]
        if page_size < KV_CHUNK or page_size % KV_CHUNK:
            raise ValueError(f"the page size (k.shape[1] = {page_size}) must be a multiple of "
                             f"{KV_CHUNK} with page_table")
        if a.seqused_k is None:
            raise ValueError("page_table needs seqused_k (the used KV length of each sequence)")
        if a.cu_seqlens_k is not None:
            raise ValueError("page_table replaces cu_seqlens_k: pass seqused_k for the lengths")


def check_varlen(cu_seqlens_q, cu_seqlens_k, max_seqlen_q: int, max_seqlen_k: int,
                 total_q: int | None = None, total_k: int | None = None):
    """Check the values of varlen offsets; raises ``ValueError`` naming what is wrong.

    ``fa4_aot.attention`` does not read ``cu_seqlens_q/k`` on the host (that would cost a
    device->host copy and a synchronisation on every call); the kernels clamp every document to
    the packed length, so bad offsets give wrong output but touch no memory outside q, k, v,
    out and the LSE. Call this where the offsets are made, or set ``FA4_AOT_CHECK_VARLEN=1`` to
    run it on every call. Checks, for q and k: the offsets start at 0, never decrease, end
    within the packed length (``total_q`` / ``total_k`` = q.shape[0] / k.shape[0], when given),
    and no document is longer than ``max_seqlen_q`` / ``max_seqlen_k``. One device->host copy
    of both tensors (not allowed while a CUDA graph is being captured)."""
    for name, cu in (("cu_seqlens_q", cu_seqlens_q), ("cu_seqlens_k", cu_seqlens_k)):
        check_cu_seqlens(name, cu)
    if cu_seqlens_q.numel() != cu_seqlens_k.numel():
        raise ValueError(f"cu_seqlens_q and cu_seqlens_k must have the same length (batch + 1); "
                         f"got {cu_seqlens_q.numel()} and {cu_seqlens_k.numel()}")
    n = cu_seqlens_q.numel()
    both = torch.cat((cu_seqlens_q, cu_seqlens_k.to(cu_seqlens_q.device))).tolist()  # one copy
    for name, vals, total, mx in (("cu_seqlens_q", both[:n], total_q, max_seqlen_q),
                                  ("cu_seqlens_k", both[n:], total_k, max_seqlen_k)):
        if vals[0] != 0:
            raise ValueError(f"{name}[0] = {vals[0]}: {name} must start at 0 and never decrease")
        for i in range(1, n):
            if vals[i] < vals[i - 1]:
                raise ValueError(f"{name} decreases at index {i} ({vals[i - 1]} -> {vals[i]}): "
                                 f"{name} must start at 0 and never decrease; got "
                                 f"{vals[:8]}{'...' if n > 8 else ''}")
        if total is not None and vals[-1] > total:
            raise ValueError(f"{name}[-1] = {vals[-1]} exceeds the packed length {total}")
        lens = [b - a for a, b in zip(vals, vals[1:])]
        longest = max(lens)
        if longest > mx:
            raise ValueError(f"a document of {longest} tokens (document {lens.index(longest)}) "
                             f"exceeds max_seqlen_{name[-1]} = {mx}")


def window(window_size, causal):
    """-> (local, left, right): FA convention, -1 = unbounded; causal forces right = 0."""
    if (not isinstance(window_size, (tuple, list)) or len(window_size) != 2
            or not all(isinstance(w, int) and w >= -1 for w in window_size)):
        raise ValueError(f"window_size must be a pair of ints >= -1 (left, right), got {window_size!r}")
    left, right = window_size
    if causal:
        right = 0
    if left < 0 and (right < 0 or (causal and right == 0)):
        return False, -1, -1  # plain full / causal mask
    return True, left, right


def check_descales(a: Args, batch: int):
    """q_descale / k_descale / v_descale (FA3's): fp32 (batch, heads_k) on q's device, any
    strides (an expanded scalar too), given exactly for the e4m3 inputs; FP8 calls only with
    FP8_ENV set. Their values are not read on the host; which FP8 kernels exist is the
    planner's to say (fa4_aot.plan.refusal)."""
    fp8_q, fp8_kv = is_fp8(a.q), is_fp8(a.k)
    hk = a.k.shape[-2]
    for name, t, e4m3 in (("q_descale", a.q_descale, fp8_q), ("k_descale", a.k_descale, fp8_kv),
                          ("v_descale", a.v_descale, fp8_kv)):
        x = name[0]
        if t is None:
            if e4m3:
                raise ValueError(f"{name} is required with a float8_e4m3fn {x}: fp32 "
                                 f"(batch, heads_k), the dequantized {x} = {x} * {name}")
            continue
        if not e4m3:
            raise ValueError(f"{name} applies to a float8_e4m3fn {x}; {x} is "
                             f"{getattr(a, x).dtype}")
        if not isinstance(t, torch.Tensor) or t.dtype != torch.float32:
            raise TypeError(f"{name} must be a float32 tensor (batch, heads_k), got "
                            f"{getattr(t, 'dtype', type(t).__name__)}")
        if t.device != a.q.device:
            raise ValueError(f"{name} must be on {a.q.device} (the kernel reads it), got "
                             f"{t.device}")
        if tuple(t.shape) != (batch, hk):
            raise ValueError(f"{name} must have shape (batch, heads_k) = ({batch}, {hk}), got "
                             f"{tuple(t.shape)}")
    if fp8_kv:
        if os.environ.get(FP8_ENV, "").strip() in ("", "0"):
            raise NotImplementedError(
                f"FP8 inputs: the FP8 kernels are built but have not yet been validated on a "
                f"GPU; set {FP8_ENV}=1 to run them anyway (docs/design.md#fp8)")


def check_out(out, q):
    if out is not None and not (
            isinstance(out, torch.Tensor) and out.shape == q.shape and out.dtype == out_dtype(q)
            and out.device == q.device and out.stride(-1) == 1
            and all(out.stride(i) % 8 == 0 for i in range(out.dim() - 1))
            and (torch.compiler.is_compiling() or out.data_ptr() % 16 == 0)):
        raise ValueError(f"out must be a tensor with q's shape and device, dtype {out_dtype(q)}, "
                         "a contiguous last dim and 16-byte aligned strides and data pointer; "
                         f"got {getattr(out, 'shape', out)!r} {getattr(out, 'dtype', '')}")


def forward_only():
    return NotImplementedError(
        "fa4_aot is forward-only (it has no backward): q, k or v requires grad while grad mode "
        "is on. Call it under torch.no_grad() / torch.inference_mode(), or pass detached "
        "tensors.")


def check(a: Args, device_type: str = "cuda"):
    """Every check of a call's arguments, in the order the error messages are documented and
    tested (the one entry of a memo miss and of torch.compile's tracing). Returns
    (local, left, right)."""
    check_qkv(a)
    if a.varlen:
        check_varlen_args(a)
    elif a.max_seqlen_q is not None or a.max_seqlen_k is not None:
        raise ValueError("max_seqlen_q/k are only for varlen (with cu_seqlens_q/k)")
    batch = (a.cu_seqlens_q.numel() - 1) if a.varlen else a.q.shape[0]
    check_serving_args(a, batch)
    check_descales(a, batch)
    local, left, right = window(a.window_size, a.causal)
    if a.scheduler not in SCHEDULERS:  # the name (the planner resolves it per architecture)
        raise ValueError(f"scheduler must be one of {SCHEDULERS}, got {a.scheduler!r}")
    if a.q.device.type != device_type:
        raise ValueError(f"q, k, v must be CUDA tensors; got device {a.q.device}")
    check_out(a.out, a.q)
    if a.trace is not None and not (isinstance(a.trace, torch.Tensor)
                                    and a.trace.device == a.q.device
                                    and a.trace.dtype == torch.int64):
        raise ValueError("_trace must be an int64 tensor on q's device")
    return local, left, right


def call_spec(a: Args, device_type: str = "cuda") -> CallSpec:
    """Validate (:func:`check`) and describe the call for the planner."""
    local, left, right = check(a, device_type)
    q, k, v, table = a.q, a.k, a.v, a.page_table
    if a.varlen:
        q4, k4, v4 = q.unsqueeze(0), k.unsqueeze(0), v.unsqueeze(0)
        b, sq, sk = a.cu_seqlens_q.numel() - 1, a.max_seqlen_q, a.max_seqlen_k
    else:
        q4, k4, v4 = q, k, v
        b, sq, sk = q.shape[0], q.shape[1], k.shape[1]
    if table is not None:  # k/v stay (num_pages, page_size, heads_k, d)
        k4, v4 = k, v
        sk = table.shape[1] * k.shape[1]
    h, d = q.shape[-2:]
    out_view = _out_view(a.out.unsqueeze(0) if a.varlen and a.out is not None else a.out, q4)
    scale = a.softmax_scale
    descales = tuple(None if t is None else t.stride()
                     for t in (a.q_descale, a.k_descale, a.v_descale))
    return CallSpec(
        dtype=dtype_names()[out_dtype(q)], elem_bytes=k.element_size(),
        q=(tuple(q4.shape), q4.stride()), k=(tuple(k4.shape), k4.stride()),
        v=(tuple(v4.shape), v4.stride()), out=out_view, varlen=a.varlen, batch=b,
        seqlen_q=sq, seqlen_k=sk, heads=h, heads_k=k.shape[-2], head_dim=d,
        causal=a.causal and not local, local=local, window_left=left if local else -1,
        window_right=right if local else -1,
        softmax_scale=float(scale) if scale is not None else 1.0 / math.sqrt(d),
        softcap=float(a.softcap), scheduler=a.scheduler, trace=a.trace is not None,
        num_splits=a.num_splits, seqused_q=a.seqused_q is not None,
        seqused_k=a.seqused_k is not None,
        page_table=(tuple(table.shape), table.stride()) if table is not None else None,
        fp8=("qkv" if is_fp8(q) else "kv") if is_fp8(k) else "",
        descales=descales if is_fp8(k) else ())


def _out_view(out4, q4) -> tuple:
    """(shape, strides) of the output the kernels write: ``out4`` as given, or a contiguous
    tensor of q's (4-D) shape."""
    if out4 is not None:
        return tuple(out4.shape), out4.stride()
    return tuple(q4.shape), contiguous_strides(tuple(q4.shape))


def resized_spec(c: CallSpec, a: Args) -> CallSpec:
    """The CallSpec of a dense call (no varlen, no paging) whose memo key differs from that of
    ``c``'s call only in the sequence lengths and strides of q, k, v and out
    (``fa4_aot.interface``'s form key): the checks that depend on those (every other one
    holds for the form), then ``c`` with the new views and lengths."""
    q, k, v = a.q, a.k, a.v
    for name, t in (("q", q), ("k", k), ("v", v)):
        check_strides(name, t)
    check_kv_shapes(k, v)
    check_out(a.out, q)
    return c._replace(q=(tuple(q.shape), q.stride()), k=(tuple(k.shape), k.stride()),
                      v=(tuple(v.shape), v.stride()), out=_out_view(a.out, q),
                      seqlen_q=q.shape[1], seqlen_k=k.shape[1])
