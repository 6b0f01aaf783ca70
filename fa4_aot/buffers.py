"""Device buffers of a prepared call besides its outputs and scratch: the work-stealing counter
of its (device, stream), and for the FP8 prefill kernels V transposed and a bf16 q quantized."""

from __future__ import annotations

import threading

from .abi import VT_GROUP

try:
    import torch
except ImportError:  # the build imports fa4_aot without torch
    torch = None

_state_lock = threading.Lock()
_counters: dict = {}  # (device index, stream handle) -> int32[2] work-stealing counter


def counter(device, stream_handle):
    """The int32[2] work-stealing counter of (device, stream): zeroed once, and each steal
    launch leaves it at zero again (kernels/tile_sched.py); kept for the process."""
    key = (device.index, stream_handle)
    with _state_lock:
        c = _counters.get(key)
        if c is None:
            c = _counters[key] = _zeroed(device)
        return c


def _zeroed(device):
    """A counter made outside any CUDA-graph memory pool this thread may be allocating into:
    torch.compile's CUDA-graph trees route a warm-up run's allocations to the graph's pool and
    reject one that outlives the run. So it is made and zeroed in a helper thread (its own
    allocation routing and stream) and synchronised. While this thread captures a graph (plain
    ``torch.cuda.graph``: other threads must not launch), it comes from the capture's pool."""
    if device.type != "cuda" or torch.cuda.is_current_stream_capturing():
        return torch.zeros(2, dtype=torch.int32, device=device)
    made = []

    def make():
        try:
            with torch.cuda.device(device):
                t = torch.zeros(2, dtype=torch.int32, device=device)
                torch.cuda.current_stream(device).synchronize()
            made.append(t)
        except BaseException as e:  # noqa: BLE001 - raised in the caller's thread
            made.append(e)

    th = threading.Thread(target=make, name="fa4_aot-counter")
    th.start()
    th.join()
    if isinstance(made[0], BaseException):
        raise made[0]
    return made[0]


def transposed_v(v, rows: int):
    """The V the FP8 prefill kernels read: (batch, seqlen_k, heads_k, d) e4m3 -> (batch,
    heads_k, d, rows) bytes, keys padded with zeros to ``rows`` (a multiple of VT_GROUP), each
    group's keys in abi.VT_ORDER (slot s holds key VT_ORDER[s]). VT_ORDER is an axis
    permutation: key 16h + 8a + 2t + c goes to slot 16h + 4t + 2a + c. One copy (two with
    padding) on the current stream; no sync, no host data (CUDA-graph capturable)."""
    b, sk, hk, d = v.shape
    u = v.view(torch.uint8)
    if rows != sk:
        u = torch.cat([u, u.new_zeros(b, rows - sk, hk, d)], 1)
    u = u.reshape(b, rows // VT_GROUP, 2, 2, 4, 2, hk, d)  # keys as (group, h, a, t, c)
    return u.permute(0, 6, 7, 1, 2, 4, 3, 5).contiguous().view(b, hk, d, rows)


E4M3_MAX = 448.0  # the largest finite float8_e4m3fn


def quantized_q(q, heads_k: int):
    """A bf16 q (batch, seqlen, heads, d) for the FP8 prefill kernels: (q8, q_descale), q8 a
    contiguous e4m3 tensor of q's shape and q_descale fp32 (batch, heads_k), q = q8 *
    q_descale per KV head's group of query heads. The descale is the power of two that brings
    the group's largest |q| to [224, 448] (e4m3 has the same relative precision in every
    binade, and the bf16 product by a power of two is exact: q8 is q rounded once, to e4m3);
    a group of zeros gets descale 0 and q8 = 0; a NaN or Inf in q gives a NaN or Inf descale
    (the output is then NaN, as a bf16 call's would be). Torch ops on the current stream (a max,
    a scale, a cast: three reads of q), no host sync."""
    b, s, h, d = q.shape
    # the max over head_dim first (the innermost, contiguous dim: one read of q at full
    # speed), then over the rows and the group's heads (a small tensor)
    rows = torch.linalg.vector_norm(q, float("inf"), dim=-1, dtype=torch.float32)
    amax = rows.unflatten(2, (heads_k, h // heads_k)).amax(dim=(1, 3))
    exp = torch.ceil(torch.log2(amax / E4M3_MAX))  # amax 0: -inf -> descale 0
    descale = torch.exp2(exp)
    inv = torch.where(amax > 0, torch.exp2(-exp), 0.0).to(q.dtype)
    inv = inv.repeat_interleave(h // heads_k, dim=1)[:, None, :, None]  # (b, 1, h, 1)
    q8 = (q * inv).to(torch.float8_e4m3fn, memory_format=torch.contiguous_format)
    return q8, descale
