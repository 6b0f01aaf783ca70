"""``fa4_aot.attention``: validation, kernel selection and launch on the torch stream."""

from __future__ import annotations

import math
import threading

from . import runtime
from .manifest import load_manifest
from .schedule import choose_section

SCHEDULERS = ("auto", "single", "static", "steal")
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


def _check_tensor(name, t, torch):
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if t.dim() != 4:
        raise ValueError(f"{name} must have 4 dims (batch, seqlen, heads, head_dim), "
                         f"got shape {tuple(t.shape)}")
    if t.dtype not in _torch_dtypes():
        raise TypeError(f"{name} must be bfloat16 or float16, got {t.dtype}")
    if t.stride(-1) != 1:
        raise ValueError(f"{name} must be contiguous in its last dim (head_dim); "
                         f"got stride {t.stride(-1)}")
    for ax in range(3):
        if t.shape[ax] > 1 and (t.stride(ax) * t.element_size()) % 16:
            raise ValueError(f"{name}.stride({ax}) = {t.stride(ax)} elements is not a multiple of "
                             f"16 bytes (TMA needs 16-byte aligned strides)")
    if t.data_ptr() % 16:
        raise ValueError(f"{name} data pointer must be 16-byte aligned")


def resolve_scheduler(scheduler: str, causal: bool) -> str:
    """``auto``: work stealing for causal (imbalanced tiles), one CTA per tile otherwise.
    Source of the rule: docs/perf-notes.md (scheduler table measured on the H200)."""
    if scheduler not in SCHEDULERS:
        raise ValueError(f"scheduler must be one of {SCHEDULERS}, got {scheduler!r}")
    if scheduler != "auto":
        return scheduler
    return "steal" if causal else "single"


def _validate(q, k, v, softmax_scale, causal):
    import torch
    for name, t in (("q", q), ("k", k), ("v", v)):
        _check_tensor(name, t, torch)
    if not (q.dtype == k.dtype == v.dtype):
        raise TypeError(f"q, k, v must share a dtype; got {q.dtype}, {k.dtype}, {v.dtype}")
    if not (q.device == k.device == v.device):
        raise ValueError(f"q, k, v must be on the same device; got {q.device}, {k.device}, {v.device}")
    if q.device.type != "cuda":
        raise ValueError(f"q, k, v must be CUDA tensors; got device {q.device}")
    if k.shape != v.shape:
        raise ValueError(f"k and v must have the same shape; got {tuple(k.shape)} and {tuple(v.shape)}")
    b, sq, h, d = q.shape
    bk, sk, hk, dk = k.shape
    if bk != b:
        raise ValueError(f"k batch {bk} != q batch {b}")
    if dk != d:
        raise ValueError(f"k head_dim {dk} != q head_dim {d}")
    if hk == 0 or h % hk:
        raise ValueError(f"q heads ({h}) must be a multiple of k/v heads ({hk})")
    if not isinstance(causal, bool):
        raise TypeError(f"causal must be a bool, got {type(causal).__name__}")
    if softmax_scale is not None and not (isinstance(softmax_scale, (int, float))
                                          and math.isfinite(softmax_scale)):
        raise ValueError(f"softmax_scale must be a finite float or None, got {softmax_scale!r}")


def _device_arch(device) -> str:
    import torch
    cap = torch.cuda.get_device_capability(device)
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


def grid_size(rule: dict, num_tiles: int, sms: int) -> int:
    if rule["rule"] == "tiles":
        return num_tiles
    return max(1, min(num_tiles, rule["ctas_per_sm"] * sms))


def attention(q, k, v, causal: bool = False, softmax_scale: float | None = None,
              return_lse: bool = False, scheduler: str = "auto", *, out=None, _trace=None,
              _variant: str = ""):
    """Attention forward. q: (batch, seqlen_q, heads, head_dim); k, v: (batch, seqlen_k,
    heads_k, head_dim), heads a multiple of heads_k. bf16 or fp16 on a CUDA device.

    Returns the output (batch, seqlen_q, heads, head_dim) in q's dtype, and with
    ``return_lse=True`` also the fp32 log-sum-exp (batch, heads, seqlen_q).
    Causal masking is bottom-right aligned when seqlen_q != seqlen_k.
    ``out``: optional preallocated output (q's shape, dtype and device; last dim contiguous)."""
    import torch
    _validate(q, k, v, softmax_scale, causal)
    sched = resolve_scheduler(scheduler, causal)
    b, sq, h, d = q.shape
    _, sk, hk, _ = k.shape
    if out is None:
        out = torch.empty((b, sq, h, d), dtype=q.dtype, device=q.device)
    elif not (isinstance(out, torch.Tensor) and out.shape == q.shape and out.dtype == q.dtype
              and out.device == q.device and out.stride(-1) == 1
              and all(out.stride(i) % 8 == 0 for i in range(3)) and out.data_ptr() % 16 == 0):
        raise ValueError("out must be a tensor with q's shape, dtype and device, a contiguous last "
                         "dim and 16-byte aligned strides and data pointer; got "
                         f"{getattr(out, 'shape', out)!r} strides {getattr(out, 'stride', lambda: None)()}")
    lse = torch.empty((b, h, sq), dtype=torch.float32, device=q.device)
    if b == 0 or sq == 0 or h == 0:
        return (out, lse) if return_lse else out
    if sk == 0:
        out.zero_()
        lse.fill_(-math.inf)
        return (out, lse) if return_lse else out

    arch = _device_arch(q.device)
    manifest = load_manifest()
    name, rec = manifest.find(arch, _torch_dtypes()[q.dtype], d, causal, sched,
                              trace=_trace is not None, variant=_variant)
    launch = rec["launch"]
    kernel = runtime.get_kernel(q.device.index, name, manifest.cubin_bytes(name), rec)

    scale = softmax_scale if softmax_scale is not None else 1.0 / math.sqrt(d)
    tile_m = launch["tile"]["m"]
    num_m_blocks = -(-sq // tile_m)
    num_tiles = num_m_blocks * h * b
    stream = torch.cuda.current_stream(q.device).cuda_stream
    values = {
        "seqlen_q": sq, "seqlen_k": sk, "num_heads": h, "num_heads_k": hk, "batch": b,
        "qhead_per_kvhead": h // hk, "num_m_blocks": num_m_blocks,
        "section": choose_section(h, b, sk, d, q.element_size(), h // hk),
        "num_tiles": num_tiles,
        "softmax_scale_log2": scale * math.log2(math.e), "softmax_scale": scale,
        "o_ptr": out.data_ptr(), "o_stride_s": out.stride(1), "o_stride_h": out.stride(2),
        "o_stride_b": out.stride(0), "lse_ptr": lse.data_ptr(),
        "sched_ptr": _counter(q.device, stream).data_ptr() if launch["needs_counter"] else 0,
        "trace_ptr": _trace.data_ptr() if _trace is not None else 0,
    }
    packed = runtime.pack_params(launch["params"], values, {"q": q, "k": k, "v": v})
    grid = grid_size(launch["grid"], num_tiles, num_sms(q.device))
    runtime.launch(kernel, (grid, 1, 1), launch["block"], launch["dynamic_smem_bytes"], stream,
                   packed, launch.get("cluster"))
    return (out, lse) if return_lse else out
