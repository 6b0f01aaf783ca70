"""A prepared call: what one memo entry of ``fa4_aot.interface`` holds and runs (its plan,
the launchers with their parameter buffers, its scratch), how one is built from a plan or
retargeted to another plan of the same kernels, and the per-thread state the entries share.
The scratch pool and its alignment contract: docs/design.md#alignment."""

from __future__ import annotations

import math
import os
import threading

from . import plan as _planner
from . import runtime, validate
from .buffers import counter, quantized_q, transposed_v
from .plan import SCHED_COUNTER
from .runtime import TensorView
from .validate import Args, check_varlen

try:
    import torch
except ImportError:  # the build imports fa4_aot without torch
    torch = None

# FA4_AOT_CHECK_VARLEN=1: check_varlen() on every varlen call (a device->host copy and a sync
# each); read when fa4_aot is imported, interface.set_check_varlen() changes it at run time.
CHECK_VARLEN_ENV = "FA4_AOT_CHECK_VARLEN"
check_varlen_always = os.environ.get(CHECK_VARLEN_ENV, "").strip() not in ("", "0")
# FA4_AOT_COUNT_LAUNCHES=1 (the GPU test suite sets it): count every kernel launch by manifest
# name (launch_counts()), so that a test can name the kernels no test reached.
COUNT_LAUNCHES_ENV = "FA4_AOT_COUNT_LAUNCHES"
_launch_counts = ({} if os.environ.get(COUNT_LAUNCHES_ENV, "").strip() not in ("", "0")
                  else None)
LSE_SCRATCH_BYTES = 64 * 1024  # largest unwanted LSE taken from the scratch pool
SCRATCH_ALIGN = 128  # bytes: where every view carved from the scratch pool starts

# A call's address record: runtime.ADDRESSES (the launch ABI's per-call pointers), by name.
_SLOT, _NO_ADDRESSES = runtime.SLOT, [0] * len(runtime.ADDRESSES)  # copied per call
_Q, _K, _V, _O, _LSE, _OACC, _LSEACC, _TRACE = (_SLOT[name] for name in (
    "q_ptr", "k_ptr", "v_ptr", "o_ptr", "lse_ptr", "oacc_ptr", "lseacc_ptr", "trace_ptr"))
_CU_Q, _CU_K, _USED_Q, _USED_K, _TABLE, _QD, _KD, _VD = (_SLOT[name] for name in (
    "cu_seqlens_q", "cu_seqlens_k", "seqused_q", "seqused_k", "page_table", "q_descale",
    "k_descale", "v_descale"))
# The Args field whose address fills each slot (Args names the inputs as the ABI does, less
# the "_ptr" of q/k/v/trace; the outputs and scratch are no fields: run() fills them).
_ARG_OF_SLOT = tuple(name.removesuffix("_ptr") if name.removesuffix("_ptr") in Args._fields
                     else None for name in runtime.ADDRESSES)

if torch is not None:
    _float32 = torch.float32
    _capturing = getattr(torch._C, "_cuda_isCurrentStreamCapturing", None) or (
        torch.cuda.is_current_stream_capturing)


class _ThreadState(threading.local):
    def __init__(self):
        self.memo = {}  # fa4_aot.interface's memo: key -> PreparedCall
        self.forms = {}  # form key (interface._form_key) -> up to FORM_POOL prepared calls
        self.pools = {}  # (device index, stream handle) -> fp32 scratch buffer (_carve)
        # True while torch.ops.fa4_aot.fwd runs (torch.compile; under CUDA-graph trees its
        # warm-up allocations go to the graph's pool): calls then keep no scratch buffer.
        self.in_op = False


_tls = _ThreadState()


def launch_counts():
    """{manifest kernel name: launches} of this process since import, or None unless
    ``FA4_AOT_COUNT_LAUNCHES=1`` was set when fa4_aot was imported (the GPU test suite's
    kernel-coverage check)."""
    return None if _launch_counts is None else dict(_launch_counts)


class PreparedCall:
    """A prepared call (one memo entry of one thread, or :func:`fa4_aot.interface.prepare`'s):
    its plan, allocations and launchers.

    Scratch (the LSE when the caller does not want it, small ones only; the split-KV partials)
    is carved from the thread's scratch pool of the entry's (device, stream), shared by every
    entry of that stream: their launches are ordered on it, and an entry that is never called
    again holds no memory. Never while a CUDA graph is captured (a graph must not keep a
    pointer into a buffer the pool may replace) nor inside the torch op (torch.compile's
    CUDA-graph trees reject a warm-up allocation that outlives the run): then per call."""

    __slots__ = ("plan", "out_shape", "out_dtype", "lse_shape", "mode", "launchers", "varlen",
                 "total_q", "total_k", "max_q", "max_k", "keep_lse", "out_like_q", "acc_shapes",
                 "scratch_shapes", "pool_key", "pool", "pooled", "vt_rows", "q8_heads_k", "inputs",
                 "key", "stamp")

    def _scratch(self, q, want_lse):
        """(lse or None, [oacc, lseacc] or None) of this call."""
        if _tls.in_op or _capturing():
            pooled = None
        else:
            buf = _tls.pools.get(self.pool_key)
            pooled = self.pooled
            if pooled is None or buf is None or buf is not self.pool:
                buf, pooled = self._carve(q, buf)
        lse = None
        if not want_lse and self.keep_lse and pooled is not None:
            lse = pooled[0]
        if lse is None:
            lse = q.new_empty(self.lse_shape, dtype=_float32)
        if not self.acc_shapes:
            return lse, None
        if pooled is not None:
            return lse, pooled[1:]
        return lse, [q.new_empty(shape, dtype=_float32) for shape in self.acc_shapes]

    def _carve(self, q, buf):
        """Views of this entry's scratch in the pool, growing the pool to a power of two
        elements if it is too small (an entry keeps the pool it carved from until its next
        call, so the pools left behind total less than the current one). Every view starts
        on a SCRATCH_ALIGN-byte boundary (the pool's own start is the allocator's, 512-byte
        aligned): the kernels store the split-KV partials in 8- and 16-byte vectors, and a
        view placed right after an LSE of an odd number of floats would be 4-byte aligned
        only (docs/design.md#alignment)."""
        starts, end = scratch_layout(self.scratch_shapes)
        if buf is None or buf.numel() < end:
            buf = q.new_empty(1 << max(end - 1, 0).bit_length(), dtype=_float32)
            _tls.pools[self.pool_key] = buf
        views = [buf[at:at + math.prod(shape)].view(shape)
                 for shape, at in zip(self.scratch_shapes, starts)]
        self.pool, self.pooled = buf, views
        return buf, views

    def run(self, q, out, want_lse, addrs):
        """Allocate (out when not given, the LSE, scratch), complete the call's address record
        ``addrs`` (q/k/v and the inputs filled in by the caller) and launch."""
        if out is None:  # contiguous (empty_like parses no shape: the cheaper call)
            out = (torch.empty_like(q) if self.out_like_q
                   else q.new_empty(self.out_shape, dtype=self.out_dtype))
        if self.mode:
            lse = q.new_empty(self.lse_shape, dtype=_float32)
            if self.mode == _planner.ZERO_FILL:
                out.zero_()
                lse.fill_(-math.inf)
            return out, lse
        lse, acc = self._scratch(q, want_lse)
        addrs[_O], addrs[_LSE] = out.data_ptr(), lse.data_ptr()
        if acc is not None:
            addrs[_OACC], addrs[_LSEACC] = acc[0].data_ptr(), acc[1].data_ptr()
        for launcher in self.launchers:
            launcher(addrs)
        if _launch_counts is not None:
            for kl in self.plan.launches:
                _launch_counts[kl.name] = _launch_counts.get(kl.name, 0) + 1
        return out, lse

    def check_offsets(self, cu_seqlens_q, cu_seqlens_k):
        """:func:`check_varlen` of a varlen call that launches, when it is on for every call."""
        if (self.varlen and check_varlen_always and not self.mode and not _capturing()
                and cu_seqlens_k is not None):
            check_varlen(cu_seqlens_q, cu_seqlens_k, self.max_q, self.max_k, self.total_q,
                         self.total_k)

    def launch(self, a: Args, want_lse: bool = False):
        """Run on the tensors of ``a`` (the shapes, strides and dtypes it was prepared for):
        (out, lse, the address record launched). Tools'; :func:`attention` is the fast path."""
        addrs = _NO_ADDRESSES.copy()
        for slot, field in enumerate(_ARG_OF_SLOT):
            t = getattr(a, field) if field else None
            if t is not None:
                addrs[slot] = t.data_ptr()
        vt = transposed_v(a.v, self.vt_rows) if self.vt_rows else a.v  # alive until enqueued
        addrs[_V] = vt.data_ptr()
        if self.q8_heads_k:
            q8, qd = quantized_q(a.q, self.q8_heads_k)
            addrs[_Q], addrs[_QD] = q8.data_ptr(), qd.data_ptr()
        self.check_offsets(a.cu_seqlens_q, a.cu_seqlens_k)
        out, lse = self.run(a.q, a.out, want_lse, addrs)
        return out, lse, addrs


def scratch_layout(shapes) -> tuple:
    """(start of each fp32 view, total elements) of scratch views laid end to end, each start
    rounded up to SCRATCH_ALIGN bytes."""
    step = SCRATCH_ALIGN // 4
    starts, at = [], 0
    for shape in shapes:
        starts.append(at)
        at += -(-math.prod(shape) // step) * step
    return tuple(starts), at


def build(p, a: Args, stream, manifest, e: PreparedCall | None = None) -> PreparedCall:
    """The prepared call of plan ``p``; ``e``: a prepared call of the same kernels (another
    call of its form, :func:`fa4_aot.interface._form_key`) to retarget instead: what the form
    fixes stays, its launchers take the new parameters (a launcher whose values, grid and
    descriptors are the same is left as it is), its scratch views stay while their shapes do."""
    c, q, device = p.call, a.q, a.q.device
    if e is None:
        e, old = PreparedCall(), None
        e.out_dtype = validate.out_dtype(q)
        e.varlen = c.varlen
        e.pool_key, e.scratch_shapes = (device.index, stream), None
        # any optional input (varlen, serving, trace, FP8 descales): which ones is fixed per key
        e.inputs = any(getattr(a, f) is not None for f in _ARG_OF_SLOT
                       if f not in (None, "q", "k", "v"))
        e.q8_heads_k = c.heads_k if p.q_quantized else 0
    else:
        old = e.launchers
    e.key, e.stamp = None, 0
    e.out_shape, e.lse_shape, e.mode = p.out_shape, p.lse_shape, p.mode
    e.total_q, e.total_k = c.q[0][1], c.k[0][1]
    e.max_q, e.max_k = a.max_seqlen_q, a.max_seqlen_k
    e.acc_shapes = p.acc_shapes
    # q contiguous (a property of its shape and strides, i.e. of the key): empty_like(q) is a
    # contiguous tensor of the output's shape
    e.out_like_q = (q.is_contiguous() and tuple(q.shape[-3:]) == p.out_shape[-3:]
                    and e.out_dtype == q.dtype)
    e.keep_lse = p.mode == _planner.LAUNCH and math.prod(p.lse_shape) * 4 <= LSE_SCRATCH_BYTES
    scratch = (p.lse_shape if e.keep_lse else (0,),) + tuple(p.acc_shapes)
    if scratch != e.scratch_shapes:  # carved at the next call
        e.scratch_shapes, e.pool, e.pooled = scratch, None, None
    views = {name: TensorView(view[0], view[1], size, t.data_ptr(), f"{name}_ptr")
             for name, view, t, size in (
                 ("q", p.q_quantized or c.q, q, 1 if p.q_quantized else q.element_size()),
                 ("k", c.k, a.k, a.k.element_size()),
                 ("v", p.v_transposed or c.v, a.v, a.v.element_size()))}
    e.vt_rows = p.v_transposed[0][1] if p.v_transposed else 0
    launchers, launches = [], []
    for i, kl in enumerate(p.launches):
        launch, values = kl.record["launch"], kl.values
        if values.get("sched_ptr") is SCHED_COUNTER:
            values = {**values, "sched_ptr": counter(device, stream).data_ptr()}
            kl = kl._replace(values=values)
        launches.append(kl)
        layout = runtime.param_layout(kl.name, launch["params"])
        if old is not None:
            x = old[i]
            was = e.plan.launches[i]
            if was.values != values or was.grid != kl.grid or layout.tmaps:
                x.retarget(layout.template(values, views), kl.grid)
            launchers.append(x)
            continue
        kernel = runtime.get_kernel(device.index, kl.name, manifest.cubin_bytes(kl.name),
                                    kl.record)
        launchers.append(runtime.Launcher(kernel, layout.template(values, views), kl.grid,
                                          launch["block"], launch["dynamic_smem_bytes"], stream,
                                          launch.get("cluster")))
    e.launchers = tuple(launchers)
    e.plan = p._replace(launches=tuple(launches))  # as launched: the counter's address in place
    return e
