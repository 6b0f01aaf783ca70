"""Device buffers of a prepared call besides its outputs and scratch: the work-stealing counter
of its (device, stream), and V transposed for the FP8 prefill kernels."""

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
