"""``fa4_aot.attention``: validation, kernel selection and launch on the torch stream."""

from __future__ import annotations

import math
import threading
from functools import lru_cache

from . import runtime
from .configs import SCHEDULERS_BY_ARCH, SOFTCAP_SCHEDULERS
from .manifest import load_manifest
from .schedule import choose_section

_section = lru_cache(maxsize=4096)(choose_section)  # pure; called on every launch

SCHEDULERS = ("auto", "single", "static", "steal", "clc")
_ARCH_BY_CAPABILITY = {(9, 0): "sm_90a", (10, 0): "sm_100a"}
_DTYPE_NAMES = None  # filled lazily: {torch.bfloat16: "bf16", torch.float16: "fp16"}
_state_lock = threading.Lock()
_counters: dict = {}  # (device index, stream handle) -> int32[2] work-stealing counter
_sm_count: dict = {}


def _torch_dtypes():
    global _DTYPE_NAMES
    if _DTYPE_NAMES is None:
        import torch
        _DTYPE_NAMES = {torch.bfloat16: "bf16", torch.float16: "fp16"}
    return _DTYPE_NAMES


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
                  trace: bool = False, variant: str = "", local: bool = False,
                  softcap: bool = False):
    """(manifest name, record) of the kernel for this device and problem."""
    arch = _device_arch(device)
    sched = resolve_scheduler(scheduler, arch)
    if softcap and (arch != "sm_90a" or sched not in SOFTCAP_SCHEDULERS):
        raise ValueError(
            f"softcap is not supported on {arch}" if arch != "sm_90a" else
            f"softcap kernels exist for scheduler 'auto', "
            + ", ".join(repr(s) for s in SOFTCAP_SCHEDULERS) + f"; got scheduler={scheduler!r}")
    return load_manifest().find(arch, _torch_dtypes()[dtype], head_dim, causal, sched,
                                trace=trace, variant=variant, local=local, softcap=softcap)


def _validate(q, k, v, softmax_scale, causal, varlen, softcap=0.0):
    import torch
    rank = 3 if varlen else 4
    layout = "(total, heads, head_dim)" if varlen else "(batch, seqlen, heads, head_dim)"
    for name, t in (("q", q), ("k", k), ("v", v)):
        _check_tensor(name, t, torch, rank, layout)
    if not (q.dtype == k.dtype == v.dtype):
        raise TypeError(f"q, k, v must share a dtype; got {q.dtype}, {k.dtype}, {v.dtype}")
    if not (q.device == k.device == v.device):
        raise ValueError(f"q, k, v must be on the same device; got {q.device}, {k.device}, {v.device}")
    if k.shape != v.shape:
        raise ValueError(f"k and v must have the same shape; got {tuple(k.shape)} and {tuple(v.shape)}")
    h, d = q.shape[-2:]
    hk, dk = k.shape[-2:]
    if not varlen and k.shape[0] != q.shape[0]:
        raise ValueError(f"k batch {k.shape[0]} != q batch {q.shape[0]}")
    if dk != d:
        raise ValueError(f"k head_dim {dk} != q head_dim {d}")
    if hk == 0 or h % hk:
        raise ValueError(f"q heads ({h}) must be a multiple of k/v heads ({hk})")
    if not isinstance(causal, bool):
        raise TypeError(f"causal must be a bool, got {type(causal).__name__}")
    if softmax_scale is not None and not (isinstance(softmax_scale, (int, float))
                                          and math.isfinite(softmax_scale)):
        raise ValueError(f"softmax_scale must be a finite float or None, got {softmax_scale!r}")
    if (isinstance(softcap, bool) or not isinstance(softcap, (int, float))
            or not math.isfinite(softcap) or softcap < 0):
        raise ValueError(f"softcap must be a finite float >= 0 (0 = no capping), got {softcap!r}")


def _validate_varlen(q, k, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k):
    """Shapes and types always; values (monotonic, totals, max) when not capturing a graph or
    compiling, since reading them costs a device sync."""
    import torch
    for name, cu in (("cu_seqlens_q", cu_seqlens_q), ("cu_seqlens_k", cu_seqlens_k)):
        if not isinstance(cu, torch.Tensor) or cu.dtype != torch.int32 or cu.dim() != 1:
            raise TypeError(f"{name} must be a 1-D int32 tensor (batch + 1 offsets), got "
                            f"{getattr(cu, 'dtype', type(cu).__name__)}")
        if cu.device != q.device:
            raise ValueError(f"{name} must be on {q.device}, got {cu.device}")
        if cu.numel() < 2:
            raise ValueError(f"{name} must have batch + 1 >= 2 entries, got {cu.numel()}")
    if cu_seqlens_q.numel() != cu_seqlens_k.numel():
        raise ValueError(f"cu_seqlens_q and cu_seqlens_k must have the same length (batch + 1); "
                         f"got {cu_seqlens_q.numel()} and {cu_seqlens_k.numel()}")
    for name, m in (("max_seqlen_q", max_seqlen_q), ("max_seqlen_k", max_seqlen_k)):
        if not isinstance(m, int) or m < 0:
            raise ValueError(f"{name} must be a non-negative int with varlen, got {m!r}")
    if torch.compiler.is_compiling() or (q.is_cuda and torch.cuda.is_current_stream_capturing()):
        return
    for name, cu, total, mx in (("cu_seqlens_q", cu_seqlens_q, q.shape[0], max_seqlen_q),
                                ("cu_seqlens_k", cu_seqlens_k, k.shape[0], max_seqlen_k)):
        vals = cu.tolist()
        lens = [b - a for a, b in zip(vals, vals[1:])]
        if vals[0] != 0 or min(lens) < 0:
            raise ValueError(f"{name} must start at 0 and never decrease; got {vals[:8]}...")
        if vals[-1] > total:
            raise ValueError(f"{name}[-1] = {vals[-1]} exceeds the packed length {total}")
        if max(lens) > mx:
            raise ValueError(f"a document of {max(lens)} tokens exceeds "
                             f"max_seqlen_{name[-1]} = {mx}")


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


def _device_arch(device) -> str:
    import torch
    cap = torch.cuda.get_device_capability(device)  # cached by torch
    arch = _ARCH_BY_CAPABILITY.get(cap)
    if arch is None:
        raise RuntimeError(f"fa4_aot has kernels for sm_90a (H100/H200) and sm_100a (B200); "
                           f"device {device} has compute capability {cap[0]}.{cap[1]}")
    return arch


def _counter(device, stream_handle):
    import torch
    key = (device.index, stream_handle)
    with _state_lock:
        c = _counters.get(key)
        if c is None:
            # Zeroed once; each steal launch leaves it at zero again (see tile_sched.py).
            c = torch.zeros(2, dtype=torch.int32, device=device)
            _counters[key] = c
        return c


def num_sms(device) -> int:
    import torch
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
    if rule["rule"] == "tiles":
        return num_tiles
    return max(1, min(num_tiles, rule["ctas_per_sm"] * sms))


def attention(q, k, v, causal: bool = False, softmax_scale: float | None = None,
              return_lse: bool = False, scheduler: str = "auto", *, window_size=(-1, -1),
              softcap: float = 0.0, cu_seqlens_q=None, cu_seqlens_k=None, max_seqlen_q=None,
              max_seqlen_k=None, out=None, _trace=None, _variant: str = ""):
    """Attention forward (FlashAttention argument names and conventions).

    q: (batch, seqlen_q, heads, head_dim); k, v: (batch, seqlen_k, heads_k, head_dim), heads a
    multiple of heads_k (GQA/MQA); bf16 or fp16 on a CUDA device. Variable-length batches:
    q (total_q, heads, d), k/v (total_k, heads_k, d) packed, with int32 ``cu_seqlens_q/k``
    (batch + 1 offsets, on the device) and ``max_seqlen_q/k``.

    Returns the output (q's shape and dtype) and with ``return_lse=True`` also the fp32
    log-sum-exp, (batch, heads, seqlen_q) or (heads, total_q) for varlen.
    ``causal`` is bottom-right aligned when seqlen_q != seqlen_k; ``window_size=(left, right)``
    is a sliding window around that diagonal, -1 meaning unbounded. ``softcap > 0`` caps the
    scores as softcap * tanh(scale * q.k / softcap) before the softmax (0 = off; the LSE is of the
    capped scores). Rows that see no key give
    output 0 and LSE -inf. ``out``: optional preallocated output (q's shape, dtype, device,
    16-byte aligned strides)."""
    import torch
    varlen = cu_seqlens_q is not None or cu_seqlens_k is not None
    _validate(q, k, v, softmax_scale, causal, varlen, softcap)
    if varlen:
        _validate_varlen(q, k, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k)
    elif max_seqlen_q is not None or max_seqlen_k is not None:
        raise ValueError("max_seqlen_q/k are only for varlen (with cu_seqlens_q/k)")
    local, left, right = _window(window_size, causal)
    resolve_scheduler(scheduler)  # validate the name before any GPU work
    if q.device.type != "cuda":
        raise ValueError(f"q, k, v must be CUDA tensors; got device {q.device}")
    if out is not None and not (
            isinstance(out, torch.Tensor) and out.shape == q.shape and out.dtype == q.dtype
            and out.device == q.device and out.stride(-1) == 1
            and all(out.stride(i) % 8 == 0 for i in range(out.dim() - 1))
            and (torch.compiler.is_compiling() or out.data_ptr() % 16 == 0)):
        raise ValueError("out must be a tensor with q's shape, dtype and device, a contiguous last "
                         "dim and 16-byte aligned strides and data pointer; got "
                         f"{getattr(out, 'shape', out)!r}")
    if torch.compiler.is_compiling() and out is None and _trace is None and not _variant:
        # Under torch.compile: the torch.library op (fa4_aot/ops.py), which dynamo can trace.
        # Eager calls go straight to forward(): the op's dispatch costs ~25 us a call and
        # its first call imports torch._dynamo (seconds).
        o, lse = torch.ops.fa4_aot.fwd(q, k, v, cu_seqlens_q, cu_seqlens_k,
                                       max_seqlen_q or 0, max_seqlen_k or 0, causal,
                                       softmax_scale, left if local else -1,
                                       right if local else -1, scheduler, float(softcap))
    else:
        o, lse = forward(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                         causal, softmax_scale, left if local else -1, right if local else -1,
                         scheduler, float(softcap), out=out, trace=_trace, variant=_variant)
    return (o, lse) if return_lse else o


def forward(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, causal,
            softmax_scale, window_left, window_right, scheduler, softcap=0.0, out=None, trace=None,
            variant=""):
    """Validated arguments -> kernel launch on the current stream. Returns (out, lse)."""
    import torch
    varlen = cu_seqlens_q is not None
    local = window_left >= 0 or window_right >= 0
    if varlen:
        h, d = q.shape[1:]
        hk = k.shape[1]
        b = cu_seqlens_q.numel() - 1
        sq, sk = max_seqlen_q, max_seqlen_k
        lse = torch.empty((h, q.shape[0]), dtype=torch.float32, device=q.device)
        q4, k4, v4 = q.unsqueeze(0), k.unsqueeze(0), v.unsqueeze(0)
    else:
        b, sq, h, d = q.shape
        sk, hk = k.shape[1], k.shape[2]
        lse = torch.empty((b, h, sq), dtype=torch.float32, device=q.device)
        q4, k4, v4 = q, k, v
    if out is None:
        out = torch.empty_like(q, memory_format=torch.contiguous_format)
    if q.numel() == 0:
        return out, lse
    if k.numel() == 0:
        out.zero_()
        lse.fill_(-math.inf)
        return out, lse

    # A window is its own kernel (causal windows are local with window_right = 0).
    name, rec = select_kernel(q.device, q.dtype, d, causal and not local, scheduler,
                              trace is not None, variant, local, softcap > 0)
    launch = rec["launch"]
    if (varlen or local) and not any(p["name"] == "varlen" for p in launch["params"]):
        raise ValueError(f"varlen and window_size are not supported by the {rec['arch']} kernels")
    kernel = runtime.get_kernel(q.device.index, name, load_manifest().cubin_bytes(name), rec)

    scale = softmax_scale if softmax_scale is not None else 1.0 / math.sqrt(d)
    num_m_blocks = -(-sq // launch["tile"]["m"])
    num_tiles = num_m_blocks * h * b
    if num_tiles == 0:
        return out, lse
    stream = torch.cuda.current_stream(q.device).cuda_stream
    unbounded = sq + sk  # a window side of -1: wider than any row can see
    out4 = out.unsqueeze(0) if varlen else out
    values = {
        "seqlen_q": sq, "seqlen_k": sk, "num_heads": h, "num_heads_k": hk, "batch": b,
        "q_rows": q4.shape[1], "k_rows": k4.shape[1], "tma_batch": q4.shape[0],
        "qhead_per_kvhead": h // hk, "num_m_blocks": num_m_blocks,
        "section": _section(h, b, sk, d, q.element_size(), h // hk),
        "num_tiles": num_tiles,
        **softmax_scalars(scale, softcap),
        "o_ptr": out.data_ptr(), "o_stride_s": out4.stride(1), "o_stride_h": out4.stride(2),
        "o_stride_b": 0 if varlen else out4.stride(0), "lse_ptr": lse.data_ptr(),
        "lse_stride_h": lse.stride(0) if varlen else lse.stride(1),
        "lse_stride_b": 0 if varlen else lse.stride(0),
        "sched_ptr": _counter(q.device, stream).data_ptr() if launch["needs_counter"] else 0,
        "trace_ptr": trace.data_ptr() if trace is not None else 0,
        "cu_seqlens_q": cu_seqlens_q.data_ptr() if varlen else 0,
        "cu_seqlens_k": cu_seqlens_k.data_ptr() if varlen else 0,
        "varlen": int(varlen),
        "window_left": window_left if window_left >= 0 else unbounded,
        "window_right": window_right if window_right >= 0 else unbounded,
    }
    grid = grid_size(launch["grid"], num_tiles, num_sms(q.device))
    runtime.launch_plan(name, launch["params"]).launch(
        kernel, (grid, 1, 1), launch["block"], launch["dynamic_smem_bytes"], stream, values,
        {"q": q4, "k": k4, "v": v4}, launch.get("cluster"))
    return out, lse
