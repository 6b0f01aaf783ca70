"""``fa4_aot.attention``: validation, kernel selection and launch on the torch stream.

The host path of a call, in three parts:

* **The key** (:func:`_key`): everything the launch depends on except the tensors' addresses —
  shapes, strides, dtypes and devices of q/k/v (and of ``out``, ``cu_seqlens_q/k``, the trace
  buffer), the scalar arguments, and the current stream. Each thread keeps a memo from key to
  a prepared call (:class:`_Entry`).
* **A memo miss** (:func:`_prepare`): full validation (every error message names the argument),
  then :func:`derive_launches` — the one function that maps a validated call (:class:`Call`) to
  its launch values — and the launch objects of ``fa4_aot.runtime`` (parameter buffer with
  every constant and every TMA descriptor already in place, launch config).
* **Every call** (:meth:`_Entry.run`): the checks a key cannot carry (16-byte aligned data
  pointers, forward-only), the output and LSE allocation, the 8-byte addresses written into the
  parameter buffer, ``cuLaunchKernelEx``. No device->host copy, no synchronisation: varlen
  offsets are not read on the host unless asked (:func:`check_varlen`,
  ``FA4_AOT_CHECK_VARLEN=1``); the kernels clamp documents to the packed length.
"""

from __future__ import annotations

import math
import os
import threading
from functools import lru_cache
from typing import NamedTuple

from . import runtime
from .abi import KV_CHUNK
from .configs import SCHEDULERS_BY_ARCH, SOFTCAP_SCHEDULERS, TILES_LONG_KV, TILES_M128
from .decode import MAX_SPLITS, choose_num_splits, use_decode_kernels, use_wide_tile
from .manifest import load_manifest
from .runtime import PerCall, TensorView
from .schedule import (choose_section, compact_section, prefer_long_kv, prefer_m128,
                       varlen_length)

try:
    import torch
except ImportError:  # the build imports fa4_aot without torch
    torch = None

_section = lru_cache(maxsize=4096)(choose_section)  # pure

SCHEDULERS = ("auto", "single", "static", "steal", "clc")
_ARCH_BY_CAPABILITY = {(9, 0): "sm_90a", (10, 0): "sm_100a"}
_DTYPE_NAMES = None  # filled lazily: {torch.bfloat16: "bf16", torch.float16: "fp16"}
_state_lock = threading.Lock()
_counters: dict = {}  # (device index, stream handle) -> int32[2] work-stealing counter
_sm_count: dict = {}

_NO_WINDOW = (-1, -1)  # the default window_size (identity-checked on the fast path)
# FA4_AOT_CHECK_VARLEN=1: check_varlen() on every varlen call (a device->host copy and a sync
# each); read when fa4_aot is imported, set_check_varlen() changes it at run time.
CHECK_VARLEN_ENV = "FA4_AOT_CHECK_VARLEN"
_check_varlen_always = os.environ.get(CHECK_VARLEN_ENV, "").strip() not in ("", "0")
MEMO_SIZE = 512  # prepared calls per thread (oldest dropped first)
LSE_SCRATCH_BYTES = 64 * 1024  # largest LSE an entry keeps for calls that do not return it

# The per-call addresses, in the order _Entry.run hands them to the launchers.
SLOTS = ("q", "k", "v", "out", "lse", "cu_seqlens_q", "cu_seqlens_k", "trace", "seqused_q",
         "seqused_k", "page_table", "oacc", "lseacc")
_NO_EXTRA = (0, 0, 0, 0, 0)  # the last five slots of a call without seqused/paging/split
# (num_splits, seqused_q, seqused_k, page_table) of a call that passes none of them
_NO_EXT = (None, None, None, None)

if torch is not None:
    _float32 = torch.float32
    _grad_enabled = torch.is_grad_enabled
    _is_compiling = torch.compiler.is_compiling
    _capturing = getattr(torch._C, "_cuda_isCurrentStreamCapturing", None) or (
        torch.cuda.is_current_stream_capturing)
    _raw_stream = getattr(torch._C, "_cuda_getCurrentRawStream", None) or (
        lambda index: torch.cuda.current_stream(index).cuda_stream)
_DEVICE_TYPE = "cuda"  # the device type the fast path accepts (tests swap in "cpu")


class _ThreadState(threading.local):
    def __init__(self):
        self.memo = {}


_tls = _ThreadState()


def clear_memo():
    """Forget this thread's prepared calls (tests; the memo is bounded by MEMO_SIZE anyway)."""
    _tls.memo.clear()


def set_check_varlen(enabled: bool):
    """Run :func:`check_varlen` on every varlen call (True) or never (False); the default
    comes from ``FA4_AOT_CHECK_VARLEN``."""
    global _check_varlen_always
    _check_varlen_always = bool(enabled)


def _torch_dtypes():
    global _DTYPE_NAMES
    if _DTYPE_NAMES is None:
        _DTYPE_NAMES = {torch.bfloat16: "bf16", torch.float16: "fp16"}
    return _DTYPE_NAMES


# ------------------------------------------------------------------------------ validation
def _check_tensor(name, t, torch, rank=4, layout="(batch, seqlen, heads, head_dim)"):
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if t.dim() != rank:
        raise ValueError(f"{name} must have {rank} dims {layout}, got shape {tuple(t.shape)}")
    if t.dtype not in _torch_dtypes():
        raise TypeError(f"{name} must be bfloat16 or float16, got {t.dtype}")
    if t.stride(-1) != 1:
        raise ValueError(f"{name} must be contiguous in its last dim (head_dim); "
                         f"got stride {t.stride(-1)}")
    for ax in range(t.dim() - 1):
        if t.shape[ax] > 1 and (t.stride(ax) * t.element_size()) % 16:
            raise ValueError(f"{name}.stride({ax}) = {t.stride(ax)} elements is not a multiple of "
                             f"16 bytes (TMA needs 16-byte aligned strides)")
    if not torch.compiler.is_compiling() and t.data_ptr() % 16:  # no pointer while tracing
        raise ValueError(f"{name} data pointer must be 16-byte aligned")


def resolve_scheduler(scheduler: str, arch: str = "sm_90a") -> str:
    """``auto``: on sm_90a work stealing, for every problem: in the v7 measurements (interleaved
    A/B runs on the H200, docs/perf-notes.md "Scheduler rule") it is at least as fast as one CTA
    per tile on every causal, varlen and dense shape — the persistent CTA loads the next tile
    while it stores the last one, where a new CTA per tile pays ~1.9 us of start-up. On sm_100a
    CLC. ``steal`` on sm_100a means CLC, Blackwell's work-stealing mechanism."""
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


def select_kernel(device, dtype, head_dim: int, causal: bool, scheduler: str = "auto",
                  trace: bool = False, local: bool = False, softcap: bool = False,
                  kind: str = "fwd", decode: bool = False, wide: bool = False,
                  m128: bool = False, long_kv: bool = False):
    """(manifest name, record) of the kernel for this device and problem. ``decode``: the
    packed-GQA / split-KV / paged kernels (work stealing; softcap at run time; ``wide``: their
    128-row form for many packed rows); ``kind="combine"``: the split-KV merge; ``m128``: the
    128-row alternative of a taller prefill tile (configs.TILES_M128); ``long_kv``: the wide-n
    alternative of a causal prefill kernel (configs.TILES_LONG_KV)."""
    arch = _device_arch(device)
    if kind == "combine" or decode:
        if arch != "sm_90a":
            raise ValueError(f"num_splits > 1, paged KV and the decode kernels exist on sm_90a "
                             f"only; this device is {arch}")
        if kind == "combine":
            return load_manifest().find(arch, _torch_dtypes()[dtype], head_dim, False, "single",
                                        kind="combine")
        return load_manifest().find(arch, _torch_dtypes()[dtype], head_dim, causal, "steal",
                                    local=local, decode=True, wide=wide)
    sched = resolve_scheduler(scheduler, arch)
    if softcap and (arch != "sm_90a" or sched not in SOFTCAP_SCHEDULERS):
        raise ValueError(
            f"softcap is not supported on {arch}" if arch != "sm_90a" else
            "softcap kernels exist for scheduler 'auto', "
            + ", ".join(repr(s) for s in SOFTCAP_SCHEDULERS) + f"; got scheduler={scheduler!r}")
    extra = {k: True for k, on in (("m128", m128), ("long_kv", long_kv)) if on}
    return load_manifest().find(arch, _torch_dtypes()[dtype], head_dim, causal, sched,
                                trace=trace, local=local, softcap=softcap, **extra)


def _long_kv_instead(c: "Call", rec: dict):
    """The wide-n alternative of a causal kernel, (name, record), when the call's rows see
    enough keys for it (:func:`fa4_aot.schedule.prefer_long_kv`; varlen calls on
    :func:`fa4_aot.schedule.varlen_length`, from the packed totals and max_seqlen); else None
    (also when the manifest was built without it). Every scheduler has it, so a call gets the
    same tile whichever scheduler runs it."""
    cfg = rec["config"]
    if (not c.causal or c.local or c.trace or cfg.get("m128")
            or cfg["head_dim"] not in TILES_LONG_KV.get(cfg["arch"], {})):
        return None
    len_q, len_k = ((varlen_length(c.q[0][1], c.batch, c.seqlen_q),
                     varlen_length(c.k[0][1], c.batch, c.seqlen_k)) if c.varlen
                    else (c.seqlen_q, c.seqlen_k))
    if not prefer_long_kv(len_q, len_k):
        return None
    try:
        return select_kernel(c.device, c.dtype, c.head_dim, True, c.scheduler,
                             softcap=c.softcap > 0, long_kv=True)
    except ValueError:
        return None


def _m128_instead(c: "Call", rec: dict):
    """The 128-row alternative of ``rec``'s taller tile, (name, record), when the call is cheaper
    on it (full/causal work-stealing calls: :func:`fa4_aot.schedule.prefer_m128`); else None
    (also when the manifest was built without it)."""
    cfg, tile = rec["config"], rec["launch"]["tile"]
    if (c.local or c.softcap > 0 or c.trace or cfg["scheduler"] != "steal" or tile["m"] <= 128
            or cfg["head_dim"] not in TILES_M128.get(cfg["arch"], {})):
        return None
    if not prefer_m128(tile["m"], tile["n"], c.seqlen_q, c.seqlen_k, c.causal,
                       c.heads * c.batch, num_sms(c.device)):
        return None
    try:
        return select_kernel(c.device, c.dtype, c.head_dim, c.causal, c.scheduler, m128=True)
    except ValueError:
        return None


def _validate(q, k, v, softmax_scale, causal, varlen, softcap=0.0, paged=False):
    rank = 3 if varlen else 4
    layout = "(total, heads, head_dim)" if varlen else "(batch, seqlen, heads, head_dim)"
    for name, t in (("q", q), ("k", k), ("v", v)):
        if paged and name != "q":  # the KV cache: (num_pages, page_size, heads_k, head_dim)
            _check_tensor(name, t, torch, 4, "(num_pages, page_size, heads_k, head_dim) with "
                          "page_table")
        else:
            _check_tensor(name, t, torch, rank, layout)
    if not (q.dtype == k.dtype == v.dtype):
        raise TypeError(f"q, k, v must share a dtype; got {q.dtype}, {k.dtype}, {v.dtype}")
    if not (q.device == k.device == v.device):
        raise ValueError(f"q, k, v must be on the same device; got {q.device}, {k.device}, {v.device}")
    if k.shape != v.shape:
        raise ValueError(f"k and v must have the same shape; got {tuple(k.shape)} and {tuple(v.shape)}")
    h, d = q.shape[-2:]
    hk, dk = k.shape[-2:]
    if not varlen and not paged and k.shape[0] != q.shape[0]:
        raise ValueError(f"k batch {k.shape[0]} != q batch {q.shape[0]}")
    if dk != d:
        raise ValueError(f"k head_dim {dk} != q head_dim {d}")
    if hk == 0 or h % hk:
        raise ValueError(f"q heads ({h}) must be a multiple of k/v heads ({hk})")
    if not isinstance(causal, bool):
        raise TypeError(f"causal must be a bool, got {type(causal).__name__}")
    # > 0: the kernels take each row's max of the raw scores as the softmax's reference point
    # and mask with -inf, both of which assume a positive scale.
    if softmax_scale is not None and not (isinstance(softmax_scale, (int, float))
                                          and math.isfinite(softmax_scale) and softmax_scale > 0):
        raise ValueError(f"softmax_scale must be a finite float > 0 or None, got {softmax_scale!r}")
    if (isinstance(softcap, bool) or not isinstance(softcap, (int, float))
            or not math.isfinite(softcap) or softcap < 0):
        raise ValueError(f"softcap must be a finite float >= 0 (0 = no capping), got {softcap!r}")


def _check_cu_seqlens(name, cu, device=None):
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


def _validate_varlen(q, k, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                     paged=False):
    """Types, devices and lengths of the varlen arguments: what the launch depends on. The
    offsets' values are not read here (that costs a device sync): :func:`check_varlen`.
    ``paged`` without ``cu_seqlens_k``: only q is packed (chunked prefill over a paged cache;
    the keys come from the page table)."""
    sides = [("q", cu_seqlens_q, max_seqlen_q)]
    if not (paged and cu_seqlens_k is None):
        sides.append(("k", cu_seqlens_k, max_seqlen_k))
    for s, cu, _ in sides:
        _check_cu_seqlens(f"cu_seqlens_{s}", cu, q.device)
    if len(sides) == 2 and cu_seqlens_q.numel() != cu_seqlens_k.numel():
        raise ValueError(f"cu_seqlens_q and cu_seqlens_k must have the same length (batch + 1); "
                         f"got {cu_seqlens_q.numel()} and {cu_seqlens_k.numel()}")
    for s, _, m in sides:
        if not isinstance(m, int) or m < 0:
            raise ValueError(f"max_seqlen_{s} must be a non-negative int with varlen, got {m!r}")


def _check_index_tensor(name, t, device, shape, what):
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


def _validate_extra(q, k, cu_k, batch, num_splits, seqused_q, seqused_k, page_table, scheduler,
                    trace):
    """num_splits, seqused_q/k and page_table (FlashAttention names). Their values (lengths,
    page indices) are not read on the host: the kernels clamp them (a page index outside the
    cache loads zeros, a length only shortens)."""
    if num_splits is not None and (isinstance(num_splits, bool) or not isinstance(num_splits, int)
                                   or not 1 <= num_splits <= MAX_SPLITS):
        raise ValueError(f"num_splits must be None (automatic) or an int in [1, {MAX_SPLITS}], "
                         f"got {num_splits!r}")
    for name, t in (("seqused_q", seqused_q), ("seqused_k", seqused_k)):
        if t is not None:
            _check_index_tensor(name, t, q.device, (batch,), "(batch,)")
    if page_table is not None:
        _check_index_tensor("page_table", page_table, q.device, None, "(batch, pages_per_seq)")
        if page_table.shape[0] != batch or page_table.shape[1] < 1:
            raise ValueError(f"page_table must have shape (batch, pages_per_seq) with batch = "
                             f"{batch} and pages_per_seq >= 1, got {tuple(page_table.shape)}")
        page_size = k.shape[1]
        if page_size < KV_CHUNK or page_size % KV_CHUNK:
            raise ValueError(f"the page size (k.shape[1] = {page_size}) must be a multiple of "
                             f"{KV_CHUNK} with page_table")
        if seqused_k is None:
            raise ValueError("page_table needs seqused_k (the used KV length of each sequence)")
        if cu_k is not None:
            raise ValueError("page_table replaces cu_seqlens_k: pass seqused_k for the lengths")
    paged_or_split = page_table is not None or (num_splits or 1) > 1
    if paged_or_split and (trace or scheduler not in ("auto", "steal")):
        raise ValueError("num_splits > 1 and page_table run on the work-stealing decode kernels: "
                         f"scheduler must be 'auto' or 'steal', got {scheduler!r}")


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
        _check_cu_seqlens(name, cu)
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


def _window(window_size, causal):
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


def _check_out(out, q):
    if out is not None and not (
            isinstance(out, torch.Tensor) and out.shape == q.shape and out.dtype == q.dtype
            and out.device == q.device and out.stride(-1) == 1
            and all(out.stride(i) % 8 == 0 for i in range(out.dim() - 1))
            and (torch.compiler.is_compiling() or out.data_ptr() % 16 == 0)):
        raise ValueError("out must be a tensor with q's shape, dtype and device, a contiguous last "
                         "dim and 16-byte aligned strides and data pointer; got "
                         f"{getattr(out, 'shape', out)!r}")


def _forward_only():
    return NotImplementedError(
        "fa4_aot is forward-only (it has no backward): q, k or v requires grad while grad mode "
        "is on. Call it under torch.no_grad() / torch.inference_mode(), or pass detached "
        "tensors.")


def _device_arch(device) -> str:
    cap = torch.cuda.get_device_capability(device)  # cached by torch
    arch = _ARCH_BY_CAPABILITY.get(cap)
    if arch is None:
        raise RuntimeError(f"fa4_aot has kernels for sm_90a (H100/H200) and sm_100a (B200); "
                           f"device {device} has compute capability {cap[0]}.{cap[1]}")
    return arch


def _counter(device, stream_handle):
    key = (device.index, stream_handle)
    with _state_lock:
        c = _counters.get(key)
        if c is None:
            # Zeroed once; each steal launch leaves it at zero again (see tile_sched.py).
            c = torch.zeros(2, dtype=torch.int32, device=device)
            _counters[key] = c
        return c


def num_sms(device) -> int:
    idx = device.index
    if idx not in _sm_count:
        _sm_count[idx] = torch.cuda.get_device_properties(device).multi_processor_count
    return _sm_count[idx]


def softmax_scalars(scale: float, softcap: float) -> dict:
    """The softmax launch values. Softcap kernels first turn S into tanh(S * softcap_pre) with
    softcap_pre = scale / softcap; their softmax and LSE then scale by softcap instead."""
    unit = softcap if softcap > 0 else scale
    return {"softmax_scale_log2": unit * math.log2(math.e), "softmax_scale": unit,
            "softcap_pre": scale / softcap if softcap > 0 else 0.0}


def grid_size(rule: dict, num_tiles: int, sms: int) -> int:
    """CTAs of a launch of ``num_tiles`` work items (tiles; for the combine kernel, (row, head)
    pairs) under the manifest's grid rule."""
    if rule["rule"] == "tiles":
        return num_tiles
    if rule["rule"] == "rows":
        return -(-num_tiles // rule["rows_per_cta"])
    return max(1, min(num_tiles, rule["ctas_per_sm"] * sms))


# ------------------------------------------------------------------------------ derivation
class Call(NamedTuple):
    """A validated call, less the tensors' addresses: everything :func:`derive_launches` may
    use. Tensors appear as (shape, element strides) of the 4-D (batch, seqlen, heads, d) views
    the kernels see (varlen: batch 1, the packed total as seqlen)."""

    device: object  # torch.device
    stream: int  # raw CUstream handle of the current torch stream
    dtype: object  # torch dtype of q/k/v/out
    elem_bytes: int
    q: tuple  # (shape, stride)
    k: tuple
    v: tuple
    out: tuple
    varlen: bool
    batch: int  # batch, or documents for varlen
    seqlen_q: int  # seqlen_q, or max_seqlen_q for varlen
    seqlen_k: int
    heads: int
    heads_k: int
    head_dim: int
    causal: bool  # plain causal mask (a causal window is local with window_right = 0)
    local: bool
    window_left: int  # -1 = unbounded
    window_right: int
    softmax_scale: float  # resolved (1/sqrt(d) when None was given)
    softcap: float
    scheduler: str  # as given (resolved per arch by select_kernel)
    trace: bool
    num_splits: int | None = None  # split-KV: None = automatic
    seqused_q: bool = False
    seqused_k: bool = False
    paged: bool = False  # k/v (num_pages, page_size, heads_k, d) through page_table
    page_table: tuple = ()  # (shape, stride) of the page table when paged


class KernelLaunch(NamedTuple):
    name: str  # manifest kernel name
    record: dict  # manifest record
    grid: tuple
    values: dict  # launch value name -> constant, or PerCall(slot) for per-call addresses


class CallPlan(NamedTuple):
    out_shape: tuple  # (allocated when the caller passes no out)
    lse_shape: tuple
    mode: int  # _LAUNCH, _NOTHING (no tile) or _ZERO_FILL (no key)
    launches: tuple  # KernelLaunch, run in order on the call's stream
    acc_shapes: tuple = ()  # split-KV: fp32 (oacc, lseacc) shapes, the "oacc"/"lseacc" slots


_LAUNCH, _NOTHING, _ZERO_FILL = 0, 1, 2


def _contiguous_strides(shape):
    strides, acc = [], 1
    for n in reversed(shape):
        strides.append(acc)
        acc *= max(n, 1)
    return tuple(reversed(strides))


def derive_launches(c: Call) -> CallPlan:
    """(validated call) -> what to allocate and every launch value of every kernel launch.

    The one place where launch values are computed: a new kernel parameter is added here (and
    to :class:`Call` if it depends on something new about the call — the memo key, :func:`_key`,
    must then cover it). Values that change from call to call are the tensors' addresses only,
    given as :class:`fa4_aot.runtime.PerCall` slots (:data:`SLOTS`)."""
    b, sq, sk, h, hk, d = c.batch, c.seqlen_q, c.seqlen_k, c.heads, c.heads_k, c.head_dim
    (q_batch, q_rows, _, _), (k_batch, k_rows, _, _) = c.q[0], c.k[0]
    out_shape = (q_rows, h, d) if c.varlen else (b, sq, h, d)
    lse_shape = (h, q_rows) if c.varlen else (b, h, sq)
    if 0 in c.q[0]:
        return CallPlan(out_shape, lse_shape, _NOTHING, ())
    if 0 in c.k[0] or (c.paged and 0 in c.page_table[0]):
        return CallPlan(out_shape, lse_shape, _ZERO_FILL, ())
    g = h // hk
    decode = c.paged or use_decode_kernels(sq, g, c.num_splits, c.scheduler, c.trace)
    if (decode and not (c.paged or (c.num_splits or 1) > 1)
            and _device_arch(c.device) != "sm_90a"):
        decode = False  # short queries elsewhere: the plain kernels (select_kernel refuses the
        # decode kernels, i.e. paging and splits, on other archs, naming them)
    if decode:  # packed GQA (+ split-KV, + paged KV); softcap is a run-time value there
        # More packed rows than one 64-row tile (chunked prefill over pages, many query tokens
        # per KV head, forced splits on long queries): the 128-row form, two MMA warpgroups
        # taking turns on the tensor cores.
        name, rec = select_kernel(c.device, c.dtype, d, c.causal, c.scheduler, c.trace, c.local,
                                  decode=True, wide=use_wide_tile(sq, g))
    else:  # a window is its own kernel (causal windows are local with window_right = 0)
        name, rec = select_kernel(c.device, c.dtype, d, c.causal, c.scheduler, c.trace, c.local,
                                  c.softcap > 0)
        name, rec = _m128_instead(c, rec) or _long_kv_instead(c, rec) or (name, rec)
    launch = rec["launch"]
    if ((c.varlen or c.local or c.seqused_q or c.seqused_k)
            and not any(p["name"] == "seq_mode" for p in launch["params"])):
        raise ValueError(f"varlen, window_size and seqused_q/k are not supported by the "
                         f"{rec['arch']} kernels")
    tile_m, tile_n = launch["tile"]["m"], launch["tile"]["n"]
    sms = num_sms(c.device)
    # Varlen prefill whose (document x m-block) grid is mostly empty (one long document among
    # short ones): the kernel counts only the non-empty tiles (seq_mode bit 16). At most
    # ceil(q_rows / tile_m) + batch m-blocks per head hold rows.
    compact = False
    if decode:
        num_m_blocks = -(-sq * g // tile_m)
        tiles = num_m_blocks * hk * b
        splits = c.num_splits or choose_num_splits(tiles, -(-sk // tile_n), sms)
        section = _section(hk, b * splits, sk, d, c.elem_bytes, 1)
    else:
        num_m_blocks = -(-sq // tile_m)
        tiles = num_m_blocks * h * b
        splits = 1
        compact = c.varlen and b * num_m_blocks >= 2 * (-(-q_rows // tile_m) + b)
        # Compact: the head sections inside each document (a divisor of h)
        section = (compact_section(h, sk, d, c.elem_bytes, g, c.causal) if compact
                   else _section(h, b, sk, d, c.elem_bytes, g, c.causal))
    num_tiles = tiles * splits
    if num_tiles == 0:
        return CallPlan(out_shape, lse_shape, _NOTHING, ())
    o_stride = c.out[1]
    lse_stride = _contiguous_strides(lse_shape)
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
        "sched_ptr": (_counter(c.device, c.stream).data_ptr() if launch["needs_counter"]
                      else 0),
        "trace_ptr": PerCall("trace") if c.trace else 0,
        "cu_seqlens_q": PerCall("cu_seqlens_q") if c.varlen else 0,
        "cu_seqlens_k": PerCall("cu_seqlens_k") if packed_k else 0,
        "seqused_q": PerCall("seqused_q") if c.seqused_q else 0,
        "seqused_k": PerCall("seqused_k") if c.seqused_k else 0,
        # seq_mode bits (kernels/common/seqlen.py): 1 packed q, 2 seqused_q, 4 seqused_k,
        # 8 packed k/v, 16 compact varlen tiles
        "seq_mode": (int(c.varlen) | 2 * c.seqused_q | 4 * c.seqused_k | 8 * packed_k
                     | 16 * compact),
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
        # decode kernels' K/V TMA box: a whole key block, or with pages the largest box that
        # divides both the block and the page (abi.KV_CHUNK at least: page sizes are multiples)
        "kv_box_rows": math.gcd(k_rows, tile_n) if c.paged else tile_n,
    }
    grid = (grid_size(launch["grid"], num_tiles, sms), 1, 1)
    launches = [KernelLaunch(name, rec, grid, values)]
    acc_shapes = ()
    if split:
        cname, crec = select_kernel(c.device, c.dtype, d, False, kind="combine")
        cvalues = {"oacc_ptr": PerCall("oacc"), "lseacc_ptr": PerCall("lseacc"),
                   "o_ptr": PerCall("out"), "lse_ptr": PerCall("lse"), **strides,
                   "num_splits": splits, "acc_rows": acc_rows,
                   "seqlen_q": q_rows if c.varlen else sq, "num_heads": h}
        cgrid = (grid_size(crec["launch"]["grid"], acc_rows * h, sms), 1, 1)
        launches.append(KernelLaunch(cname, crec, cgrid, cvalues))
        acc_shapes = ((splits, acc_rows, h, d), (splits, acc_rows, h))
    return CallPlan(out_shape, lse_shape, _LAUNCH, tuple(launches), acc_shapes)


class _Entry:
    """A prepared call (one memo entry of one thread): the allocations and the launchers.

    ``lse_scratch``: when the caller does not want the LSE (``return_lse=False``), the kernel
    writes it into a buffer the entry keeps (small LSEs only, never while a CUDA graph is being
    captured: a graph must not keep a pointer into a buffer that the memo may drop) — one
    allocation less per call. The entry's stream is part of its key, so the launches that
    share the buffer are ordered on that stream."""

    __slots__ = ("call", "out_shape", "lse_shape", "dtype", "device", "mode", "launchers",
                 "varlen", "total_q", "total_k", "max_q", "max_k", "lse_scratch", "out_like_q",
                 "acc_shapes", "acc_scratch")

    def run(self, q, qp, kp, vp, out, cu_q, cu_k, trace, want_lse, ext=None):
        if out is None:  # contiguous (empty_like parses no shape: the cheaper call)
            out = torch.empty_like(q) if self.out_like_q else q.new_empty(self.out_shape)
        lse = self.lse_scratch
        if want_lse or lse is None or _capturing():
            lse = q.new_empty(self.lse_shape, dtype=_float32)
        if self.mode:
            if self.mode == _ZERO_FILL:
                out.zero_()
                lse.fill_(-math.inf)
            return out, lse
        if self.varlen:
            if _check_varlen_always and not _capturing() and cu_k is not None:
                check_varlen(cu_q, cu_k, self.max_q, self.max_k, self.total_q, self.total_k)
            addrs = (qp, kp, vp, out.data_ptr(), lse.data_ptr(), cu_q.data_ptr(),
                     0 if cu_k is None else cu_k.data_ptr(),
                     0 if trace is None else trace.data_ptr())
        else:
            addrs = (qp, kp, vp, out.data_ptr(), lse.data_ptr(), 0, 0,
                     0 if trace is None else trace.data_ptr())
        if ext is None and not self.acc_shapes:
            addrs += _NO_EXTRA
        else:
            _, used_q, used_k, table = ext or _NO_EXT
            acc = self.acc_scratch
            if self.acc_shapes and (acc is None or _capturing()):
                acc = [q.new_empty(shape, dtype=_float32) for shape in self.acc_shapes]
            addrs += tuple(0 if t is None else t.data_ptr() for t in (used_q, used_k, table))
            addrs += (acc[0].data_ptr(), acc[1].data_ptr()) if self.acc_shapes else (0, 0)
        for launcher in self.launchers:
            launcher(addrs)
        return out, lse


def _build_entry(c: Call, q4, k4, v4, max_q, max_k) -> _Entry:
    plan = derive_launches(c)
    e = _Entry()
    e.call = c
    e.out_shape, e.lse_shape, e.mode = plan.out_shape, plan.lse_shape, plan.mode
    e.dtype, e.device, e.varlen = c.dtype, c.device, c.varlen
    e.total_q, e.total_k, e.max_q, e.max_k = c.q[0][1], c.k[0][1], max_q, max_k
    e.lse_scratch = None
    # Split-KV partial buffers: kept by the entry (its launches are ordered on its stream), but
    # allocated per call while a CUDA graph is being captured (from the graph's pool).
    e.acc_shapes, e.acc_scratch = plan.acc_shapes, None
    if plan.acc_shapes and not _capturing():
        e.acc_scratch = [q4.new_empty(shape, dtype=torch.float32) for shape in plan.acc_shapes]
    # q contiguous (a property of its shape and strides, i.e. of the key): empty_like(q) is a
    # contiguous tensor of the output's shape
    e.out_like_q = q4.is_contiguous() and tuple(q4.shape[-3:]) == plan.out_shape[-3:]
    if (plan.mode == _LAUNCH and math.prod(plan.lse_shape) * 4 <= LSE_SCRATCH_BYTES
            and not _capturing()):  # not from a graph's private pool
        e.lse_scratch = q4.new_empty(plan.lse_shape, dtype=torch.float32)
    views = {name: TensorView(tuple(t.shape), t.stride(), c.elem_bytes, t.data_ptr(), name)
             for name, t in (("q", q4), ("k", k4), ("v", v4))}
    launchers = []
    for kl in plan.launches:
        launch = kl.record["launch"]
        kernel = runtime.get_kernel(c.device.index, kl.name,
                                    load_manifest().cubin_bytes(kl.name), kl.record)
        template = runtime.launch_plan(kl.name, launch["params"]).template(kl.values, views)
        launchers.append(runtime.Launcher(kernel, template, SLOTS, kl.grid, launch["block"],
                                          launch["dynamic_smem_bytes"], c.stream,
                                          launch.get("cluster")))
    e.launchers = tuple(launchers)
    return e


# ------------------------------------------------------------------------------ the call path
def _tkey(t):
    return None if t is None else (t.shape, t.stride(), t.dtype, t.device)


def _extras(num_splits, seqused_q, seqused_k, page_table):
    """The decode / serving arguments as one tuple (``ext``), or None when the call passes none
    of them (the memo key and the call path then skip them)."""
    ext = (num_splits, seqused_q, seqused_k, page_table)
    return None if all(x is None for x in ext) else ext


def _key(q, k, v, cu_q, cu_k, max_q, max_k, causal, scale, wl, wr, scheduler, softcap, out,
         trace, device, ext=None):
    """What a launch depends on, less the addresses (the memo key). ``causal`` and ``softcap``
    carry their type, so that 1 and True (or 0 and False) are not the same call: a key is
    only ever stored after its call passed the full validation."""
    return (q.shape, q.stride(), k.shape, k.stride(), v.shape, v.stride(),
            q.dtype, k.dtype, v.dtype, device, k.device, v.device, _raw_stream(device.index),
            causal, causal.__class__, scale, wl, wr, scheduler, softcap, softcap.__class__,
            None if cu_q is None and cu_k is None else (
                _tkey(cu_q), _tkey(cu_k), max_q, max_q.__class__, max_k, max_k.__class__),
            _tkey(out),
            None if trace is None else (trace.shape, trace.dtype, trace.device),
            None if ext is None else (ext[0], ext[0].__class__, _tkey(ext[1]), _tkey(ext[2]),
                                      _tkey(ext[3])))


def _call(q, k, v, cu_q, cu_k, max_q, max_k, causal, scale, window, scheduler, softcap, out,
          trace, want_lse=True, ext=None):
    """Eager call: memo lookup, per-call checks, launch. Arguments as ``attention``'s."""
    e = None
    try:
        device = q.device
        if device.type == _DEVICE_TYPE and (cu_q is not None or cu_k is not None
                                             or (max_q is None and max_k is None)):
            if window is _NO_WINDOW:
                wl = wr = -1
            else:
                local, wl, wr = _window(window, causal)
                if not local:
                    wl = wr = -1
            e = _tls.memo.get(_key(q, k, v, cu_q, cu_k, max_q, max_k, causal, scale, wl, wr,
                                   scheduler, softcap, out, trace, device, ext))
    except Exception:  # noqa: BLE001 - whatever it is, _prepare names it
        e = None
    if e is None:
        e = _prepare(q, k, v, cu_q, cu_k, max_q, max_k, causal, scale, window, scheduler,
                     softcap, out, trace, ext)
    qp, kp, vp = q.data_ptr(), k.data_ptr(), v.data_ptr()
    if (qp | kp | vp) & 15 or (out is not None and out.data_ptr() & 15):
        _validate(q, k, v, scale, causal, cu_q is not None, softcap,
                  ext is not None and ext[3] is not None)  # raises, naming it
        _check_out(out, q)
    if _grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad):
        raise _forward_only()
    return e.run(q, qp, kp, vp, out, cu_q, cu_k, trace, want_lse, ext)


def _validate_call(q, k, v, cu_q, cu_k, max_q, max_k, causal, scale, window, scheduler,
                   softcap, out, trace, ext, device_type=None):
    """Every check of a call's arguments, in the order the error messages are documented and
    tested (a memo miss, and torch.compile's tracing). Returns (local, left, right)."""
    num_splits, used_q, used_k, table = ext or _NO_EXT
    paged = table is not None
    varlen = cu_q is not None or cu_k is not None
    _validate(q, k, v, scale, causal, varlen, softcap, paged)
    if varlen:
        _validate_varlen(q, k, cu_q, cu_k, max_q, max_k, paged)
    elif max_q is not None or max_k is not None:
        raise ValueError("max_seqlen_q/k are only for varlen (with cu_seqlens_q/k)")
    batch = (cu_q.numel() - 1) if varlen else q.shape[0]
    _validate_extra(q, k, cu_k, batch, num_splits, used_q, used_k, table, scheduler,
                    trace is not None)
    local, left, right = _window(window, causal)
    resolve_scheduler(scheduler)  # validate the name before any GPU work
    if q.device.type != (device_type or _DEVICE_TYPE):
        raise ValueError(f"q, k, v must be CUDA tensors; got device {q.device}")
    _check_out(out, q)
    if trace is not None and not (isinstance(trace, torch.Tensor) and trace.device == q.device
                                  and trace.dtype == torch.int64):
        raise ValueError("_trace must be an int64 tensor on q's device")
    return local, left, right


def _prepare(q, k, v, cu_q, cu_k, max_q, max_k, causal, scale, window, scheduler, softcap, out,
             trace, ext=None) -> _Entry:
    """Memo miss: validate everything, derive the launches, store the entry under the call's
    key."""
    local, left, right = _validate_call(q, k, v, cu_q, cu_k, max_q, max_k, causal, scale,
                                        window, scheduler, softcap, out, trace, ext)
    num_splits, used_q, used_k, table = ext or _NO_EXT
    paged = table is not None
    varlen = cu_q is not None or cu_k is not None
    wl, wr = (left, right) if local else (-1, -1)
    device = q.device
    key = _key(q, k, v, cu_q, cu_k, max_q, max_k, causal, scale, wl, wr, scheduler, softcap,
               out, trace, device, ext)
    memo = _tls.memo
    e = memo.get(key)
    if e is not None:
        return e
    if varlen:
        q4, k4, v4 = q.unsqueeze(0), k.unsqueeze(0), v.unsqueeze(0)
        b, sq, sk = cu_q.numel() - 1, max_q, max_k
    else:
        q4, k4, v4 = q, k, v
        b, sq, sk = q.shape[0], q.shape[1], k.shape[1]
    if paged:  # k/v stay (num_pages, page_size, heads_k, d); keys per sequence <= the table's
        k4, v4 = k, v
        sk = table.shape[1] * k.shape[1]
    h, d = q.shape[-2:]
    if out is not None:
        o4 = out.unsqueeze(0) if varlen else out
        out_view = (tuple(o4.shape), o4.stride())
    else:
        out_view = (tuple(q4.shape), _contiguous_strides(tuple(q4.shape)))
    c = Call(device=device, stream=key[12], dtype=q.dtype, elem_bytes=q.element_size(),
             q=(tuple(q4.shape), q4.stride()), k=(tuple(k4.shape), k4.stride()),
             v=(tuple(v4.shape), v4.stride()), out=out_view, varlen=varlen, batch=b,
             seqlen_q=sq, seqlen_k=sk, heads=h, heads_k=k.shape[-2], head_dim=d,
             causal=causal and not local, local=local, window_left=wl, window_right=wr,
             softmax_scale=float(scale) if scale is not None else 1.0 / math.sqrt(d),
             softcap=float(softcap), scheduler=scheduler, trace=trace is not None,
             num_splits=num_splits, seqused_q=used_q is not None, seqused_k=used_k is not None,
             paged=paged, page_table=(tuple(table.shape), table.stride()) if paged else ())
    e = _build_entry(c, q4, k4, v4, max_q, max_k)
    if len(memo) >= MEMO_SIZE:
        del memo[next(iter(memo))]
    memo[key] = e
    return e


def attention(q, k, v, causal: bool = False, softmax_scale: float | None = None,
              return_lse: bool = False, scheduler: str = "auto", *, window_size=_NO_WINDOW,
              softcap: float = 0.0, cu_seqlens_q=None, cu_seqlens_k=None, max_seqlen_q=None,
              max_seqlen_k=None, seqused_q=None, seqused_k=None, page_table=None,
              num_splits=None, out=None, _trace=None):
    """Attention forward (FlashAttention argument names and conventions). Forward only.

    q: (batch, seqlen_q, heads, head_dim); k, v: (batch, seqlen_k, heads_k, head_dim), heads a
    multiple of heads_k (GQA/MQA); bf16 or fp16 on a CUDA device. Variable-length batches:
    q (total_q, heads, d), k/v (total_k, heads_k, d) packed, with int32 ``cu_seqlens_q/k``
    (batch + 1 offsets, on the device) and ``max_seqlen_q/k``; the offsets' values are not
    checked on the host (no sync): :func:`check_varlen` does, on demand.

    Returns the output (q's shape and dtype) and with ``return_lse=True`` also the fp32
    log-sum-exp, (batch, heads, seqlen_q) or (heads, total_q) for varlen.
    ``causal`` is bottom-right aligned when seqlen_q != seqlen_k; ``window_size=(left, right)``
    is a sliding window around that diagonal, -1 meaning unbounded. ``softcap > 0`` caps the
    scores as softcap * tanh(scale * q.k / softcap) before the softmax (0 = off; the LSE is of the
    capped scores). Rows that see no key give
    output 0 and LSE -inf. ``out``: optional preallocated output (q's shape, dtype, device,
    16-byte aligned strides). Raises ``NotImplementedError`` when grad mode is on and q, k or v
    requires grad (there is no backward).

    Decode and serving (FlashAttention names): ``seqused_q`` / ``seqused_k`` (int32 (batch,) on
    the device) cut each batch entry to its used query rows / keys; ``page_table`` (int32
    (batch, pages_per_seq)) reads k/v as a paged cache (num_pages, page_size, heads_k, d),
    page_size a multiple of 16, with ``seqused_k`` the used length of each sequence (q may be
    packed with cu_seqlens_q: chunked prefill). ``num_splits``: split-KV count (None =
    automatic, :func:`fa4_aot.decode.choose_num_splits`; 1 = no split). Calls whose
    seqlen_q * (heads // heads_k) <= 128, paged calls and calls with num_splits > 1 run on
    the decode kernels (packed GQA + split-KV, sm_90a)."""
    ext = _extras(num_splits, seqused_q, seqused_k, page_table)
    if _is_compiling():
        o, lse = _traced(q, k, v, causal, softmax_scale, scheduler, window_size, softcap,
                         cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, out, _trace,
                         ext)
    else:
        o, lse = _call(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, causal,
                       softmax_scale, window_size, scheduler, softcap, out, _trace, return_lse,
                       ext)
    return (o, lse) if return_lse else o


def _traced(q, k, v, causal, softmax_scale, scheduler, window_size, softcap, cu_seqlens_q,
            cu_seqlens_k, max_seqlen_q, max_seqlen_k, out, trace, ext=None):
    """Under torch.compile: validate (traced once per guard set) and call the
    ``torch.ops.fa4_aot.fwd`` op (fa4_aot/ops.py), which dynamo can trace."""
    local, left, right = _validate_call(
        q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, causal, softmax_scale,
        window_size, scheduler, softcap, out, trace, ext, "cuda")
    if torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad):
        raise _forward_only()
    if out is None and trace is None:
        num_splits, used_q, used_k, table = ext or _NO_EXT
        return torch.ops.fa4_aot.fwd(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q or 0,
                                     max_seqlen_k or 0, causal, softmax_scale,
                                     left if local else -1, right if local else -1, scheduler,
                                     float(softcap), num_splits or 0, used_q, used_k, table)
    return _call(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, causal,
                 softmax_scale, window_size, scheduler, softcap, out, trace, True, ext)


def forward(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, causal,
            softmax_scale, window_left, window_right, scheduler, softcap=0.0, num_splits=0,
            seqused_q=None, seqused_k=None, page_table=None):
    """``torch.ops.fa4_aot.fwd``'s implementation: the op's arguments (max_seqlen 0 without
    varlen, the window as two ints, -1 = unbounded, num_splits 0 = automatic) to
    :func:`_call`. Returns (out, lse)."""
    if cu_seqlens_q is None and cu_seqlens_k is None:
        max_seqlen_q = max_seqlen_k = None
    elif cu_seqlens_k is None:
        max_seqlen_k = None
    window = (_NO_WINDOW if window_left < 0 and window_right < 0
              else (window_left, window_right))
    ext = _extras(num_splits or None, seqused_q, seqused_k, page_table)
    return _call(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, causal,
                 softmax_scale, window, scheduler, softcap, None, None, True, ext)
