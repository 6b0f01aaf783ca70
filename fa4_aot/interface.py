"""``fa4_aot.attention``: the memo, the launch on the torch stream, the torch.compile path.

A call, in three parts:

* **The key**, computed in :func:`attention`: everything the launch depends on except the
  tensors' addresses — shapes, strides, dtypes and devices of the tensors, the scalar
  arguments, and the current stream. Each thread keeps a memo from key to a prepared call.
* **A memo miss** (:func:`_prepare`): :func:`fa4_aot.validate.call_spec` (every check, each
  error naming the argument), then :func:`fa4_aot.plan.plan` (the kernels, grids and launch
  values), then the launch objects of ``fa4_aot.runtime`` (parameter buffers with every
  constant and TMA descriptor in place).
* **Every call** (:meth:`PreparedCall.run`): the checks a key cannot carry (16-byte aligned
  data pointers, forward-only), the output and LSE allocation, the call's address record (one
  list of :data:`fa4_aot.runtime.ADDRESSES`, filled by name) written into the parameter
  buffers, ``cuLaunchKernelEx``. No device->host copy, no synchronisation: varlen
  offsets are read on the host only when asked (:func:`check_varlen`,
  ``FA4_AOT_CHECK_VARLEN=1``); the kernels clamp documents to the packed length.
"""

from __future__ import annotations

import itertools
import math
import os
import threading

from . import plan as _planner
from . import runtime, validate
from .buffers import counter, quantized_q, transposed_v
from .manifest import load_manifest
from .plan import SCHED_COUNTER, DeviceInfo
from .runtime import TensorView
from .validate import Args, OpSizes, OpTensors, check_varlen, forward_only

try:
    import torch
except ImportError:  # the build imports fa4_aot without torch
    torch = None

__all__ = ["attention", "check_varlen", "clear_memo", "set_check_varlen", "select_kernel",
           "plan_call", "prepare", "PreparedCall", "memo_plans", "prepared_calls", "num_sms",
           "forward", "launch_counts"]

_sm_count: dict = {}

_NO_WINDOW = (-1, -1)  # the default window_size (identity-checked on the fast path)
_NO_DESCALES = (None, None, None)
# FA4_AOT_CHECK_VARLEN=1: check_varlen() on every varlen call (a device->host copy and a sync
# each); read when fa4_aot is imported, set_check_varlen() changes it at run time.
CHECK_VARLEN_ENV = "FA4_AOT_CHECK_VARLEN"
_check_varlen_always = os.environ.get(CHECK_VARLEN_ENV, "").strip() not in ("", "0")
# FA4_AOT_COUNT_LAUNCHES=1 (the GPU test suite sets it): count every kernel launch by manifest
# name (launch_counts()), so that a test can name the kernels no test reached.
COUNT_LAUNCHES_ENV = "FA4_AOT_COUNT_LAUNCHES"
_launch_counts = ({} if os.environ.get(COUNT_LAUNCHES_ENV, "").strip() not in ("", "0")
                  else None)
MEMO_SIZE = 512  # prepared calls per thread (oldest dropped first)
# Prepared calls per form (the memo key less the sequence lengths and strides of a dense call):
# a call of a new length is first prepared in full, up to this many per form; after that the
# least recently called one is retargeted to it (_prepare).
FORM_POOL = 4
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
    _grad_enabled = torch.is_grad_enabled
    _is_compiling = torch.compiler.is_compiling
    _capturing = getattr(torch._C, "_cuda_isCurrentStreamCapturing", None) or (
        torch.cuda.is_current_stream_capturing)
    _raw_stream = getattr(torch._C, "_cuda_getCurrentRawStream", None) or (
        lambda index: torch.cuda.current_stream(index).cuda_stream)
_DEVICE_TYPE = "cuda"  # the device type the fast path accepts (tests swap in "cpu")
_window = validate.window


class _ThreadState(threading.local):
    def __init__(self):
        self.memo = {}
        self.forms = {}  # form key (_form_key) -> up to FORM_POOL prepared calls of the form
        self.pools = {}  # (device index, stream handle) -> fp32 scratch buffer (_carve)
        # True while torch.ops.fa4_aot.fwd runs (torch.compile; under CUDA-graph trees its
        # warm-up allocations go to the graph's pool): calls then keep no scratch buffer.
        self.in_op = False


_tls = _ThreadState()
_calls = itertools.count(1)  # call stamps: the least recently called entry of a form


def clear_memo():
    """Forget this thread's prepared calls and its scratch pools (tests; the memo is bounded by
    MEMO_SIZE anyway)."""
    _tls.memo.clear()
    _tls.forms.clear()
    _tls.pools.clear()


def prepared_calls() -> tuple:
    """This thread's prepared calls, oldest first (for tests and host benchmarks): each has
    ``.plan`` (its :class:`fa4_aot.plan.LaunchPlan`) and ``.launchers`` (one per launch)."""
    return tuple(_tls.memo.values())


def memo_plans() -> tuple:
    """The :class:`fa4_aot.plan.LaunchPlan` of each call this thread's memo holds, oldest first
    (``.call`` is its :class:`fa4_aot.plan.CallSpec`, ``.launches`` its kernels and values)."""
    return tuple(e.plan for e in _tls.memo.values())


def launch_counts():
    """{manifest kernel name: launches} of this process since import, or None unless
    ``FA4_AOT_COUNT_LAUNCHES=1`` was set when fa4_aot was imported (the GPU test suite's
    kernel-coverage check)."""
    return None if _launch_counts is None else dict(_launch_counts)


def set_check_varlen(enabled: bool):
    """Run :func:`check_varlen` on every varlen call (True) or never (False); the default
    comes from ``FA4_AOT_CHECK_VARLEN``."""
    global _check_varlen_always
    _check_varlen_always = bool(enabled)


def _device_arch(device) -> str:
    return _planner.device_arch(torch.cuda.get_device_capability(device))  # cached by torch


def num_sms(device) -> int:
    idx = device.index
    if idx not in _sm_count:
        _sm_count[idx] = torch.cuda.get_device_properties(device).multi_processor_count
    return _sm_count[idx]


def _device_info(device) -> DeviceInfo:
    return DeviceInfo(_device_arch(device), num_sms(device))


def plan_call(a: Args, manifest=None, kernel: str | None = None):
    """Validate ``a`` and plan it (:class:`fa4_aot.plan.LaunchPlan`) against ``manifest``
    (default: the installed one), ``kernel`` forced by manifest name or planner form if given
    (:func:`fa4_aot.plan.choose_kernel`): the seam for tools, nothing to patch."""
    spec = validate.call_spec(a, _DEVICE_TYPE)
    return _planner.plan(spec, manifest or load_manifest(), _device_info(a.q.device), kernel)


def select_kernel(device, dtype, head_dim: int, causal: bool, scheduler: str = "auto", *,
                  trace: bool = False, local: bool = False, softcap: bool = False):
    """(manifest name, record) of this configuration's prefill kernel on ``device``'s arch:
    the planner's ``plain`` row (its own tile; :func:`plan_call` gives a call's kernel)."""
    spec = _planner.prefill_call(validate.dtype_names()[dtype], head_dim, causal, scheduler,
                                 trace=trace, local=local, softcap=softcap)
    return _planner.choose_kernel(spec, load_manifest(), DeviceInfo(_device_arch(device), 0),
                                  kernel="plain")


class PreparedCall:
    """A prepared call (one memo entry of one thread, or :func:`prepare`'s): its plan,
    allocations and launchers.

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
        if (self.varlen and _check_varlen_always and not self.mode and not _capturing()
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


def _build(p, a: Args, stream, manifest, e: PreparedCall | None = None) -> PreparedCall:
    """The prepared call of plan ``p``; ``e``: a prepared call of the same kernels (another
    call of the form) to retarget instead, its launchers taking the new parameters."""
    c, q, device = p.call, a.q, a.q.device
    launchers_of = e.launchers if e is not None else None
    e = e or PreparedCall()
    e.key, e.stamp = None, 0
    e.plan, e.out_shape, e.lse_shape, e.mode = p, p.out_shape, p.lse_shape, p.mode
    e.out_dtype = validate.out_dtype(q)
    e.varlen, e.total_q, e.total_k = c.varlen, c.q[0][1], c.k[0][1]
    e.max_q, e.max_k = a.max_seqlen_q, a.max_seqlen_k
    e.acc_shapes = p.acc_shapes
    # q contiguous (a property of its shape and strides, i.e. of the key): empty_like(q) is a
    # contiguous tensor of the output's shape
    e.out_like_q = (q.is_contiguous() and tuple(q.shape[-3:]) == p.out_shape[-3:]
                    and e.out_dtype == q.dtype)
    e.keep_lse = p.mode == _planner.LAUNCH and math.prod(p.lse_shape) * 4 <= LSE_SCRATCH_BYTES
    e.scratch_shapes = (p.lse_shape if e.keep_lse else (0,),) + tuple(p.acc_shapes)
    e.pool_key, e.pool, e.pooled = (device.index, stream), None, None
    # any optional input (varlen, serving, trace, FP8 descales): which ones is fixed per key
    e.inputs = any(getattr(a, f) is not None for f in _ARG_OF_SLOT
                   if f not in (None, "q", "k", "v"))
    views = {name: TensorView(view[0], view[1], size, t.data_ptr(), f"{name}_ptr")
             for name, view, t, size in (
                 ("q", p.q_quantized or c.q, q, 1 if p.q_quantized else q.element_size()),
                 ("k", c.k, a.k, a.k.element_size()),
                 ("v", p.v_transposed or c.v, a.v, a.v.element_size()))}
    e.vt_rows = p.v_transposed[0][1] if p.v_transposed else 0
    e.q8_heads_k = c.heads_k if p.q_quantized else 0
    launchers, launches = [], []
    for i, kl in enumerate(p.launches):
        launch, values = kl.record["launch"], kl.values
        if values.get("sched_ptr") is SCHED_COUNTER:
            values = {**values, "sched_ptr": counter(device, stream).data_ptr()}
            kl = kl._replace(values=values)
        launches.append(kl)
        kernel = runtime.get_kernel(device.index, kl.name, manifest.cubin_bytes(kl.name),
                                    kl.record)
        template = runtime.param_layout(kl.name, launch["params"]).template(values, views)
        if launchers_of is not None:
            launchers_of[i].retarget(template, kl.grid)
            launchers.append(launchers_of[i])
            continue
        launchers.append(runtime.Launcher(kernel, template, kl.grid, launch["block"],
                                          launch["dynamic_smem_bytes"], stream,
                                          launch.get("cluster")))
    e.launchers = tuple(launchers)
    e.plan = p._replace(launches=tuple(launches))  # as launched: the counter's address in place
    return e


def prepare(a: Args, manifest=None, kernel: str | None = None, stream=None) -> PreparedCall:
    """Validate, plan (:func:`plan_call`: ``manifest``, ``kernel``) and build the launchers of
    a call on ``stream`` (default: the current one), outside the memo: run it with
    :meth:`PreparedCall.launch`. Tools prepare calls against other artifact folders or with a
    kernel forced this way."""
    manifest = manifest or load_manifest()
    p = plan_call(a, manifest, kernel)
    return _build(p, a, _raw_stream(a.q.device.index) if stream is None else stream, manifest)


# Where the memo key (attention()) holds q/k/v's shapes and strides, out's key, cu_seqlens
# (None: not varlen) and the serving tuple (its last entry: the page table's key).
_KEY_Q, _KEY_OUT, _KEY_VARLEN, _KEY_SERVING = 0, 22, 21, 24


def _form_key(key):
    """The memo key of a dense call (not varlen, not paged) less the sequence lengths and
    strides of q, k, v and out: the calls one prepared call can be retargeted between
    (:func:`fa4_aot.validate.resized_spec` checks what depends on them). None otherwise."""
    serving = key[_KEY_SERVING]
    if key[_KEY_VARLEN] is not None or (serving is not None and serving[-1] is not None):
        return None
    (qs, _, ks, _, vs, _), out = key[_KEY_Q:_KEY_Q + 6], key[_KEY_OUT]
    return ((qs[0], qs[2:], ks[0], ks[2:], vs[0], vs[2:]) + key[_KEY_Q + 6:_KEY_OUT]
            + (None if out is None else out[2:],) + key[_KEY_OUT + 1:])


def _prepare(a: Args, key, stream) -> PreparedCall:
    """Memo miss: prepare the call and store it under ``key`` (None when the fast path could
    not form one: then the call is not memoized). A dense call whose form (:func:`_form_key`)
    already has FORM_POOL prepared calls runs the size-dependent checks and the plan only, and
    retargets the least recently called one of them that launches the same kernels (dropping
    the key it served; none: a new one replaces the least recently called): a call whose only
    change is a sequence length (a decode step over a growing KV cache) makes no new launch
    objects."""
    if key is None:
        return prepare(a, stream=stream)
    memo, forms = _tls.memo, _tls.forms
    fkey = _form_key(key)
    pool = forms.get(fkey) if fkey is not None else None
    if pool is not None and len(pool) >= FORM_POOL:
        manifest = load_manifest()
        p = _planner.plan(validate.resized_spec(pool[0].plan.call, a), manifest,
                          _device_info(a.q.device))
        names = [kl.name for kl in p.launches]
        same = [x for x in pool if [kl.name for kl in x.plan.launches] == names]
        old = min(same or pool, key=_stamp)
        if same:
            memo.pop(old.key, None)
        e = _build(p, a, stream, manifest, old if same else None)
        pool[pool.index(old)] = e
    else:
        e = prepare(a, stream=stream)
        if fkey is not None:
            if pool is None:
                if len(forms) >= MEMO_SIZE:
                    del forms[next(iter(forms))]
                pool = forms[fkey] = []
            pool.append(e)
    if len(memo) >= MEMO_SIZE:
        del memo[next(iter(memo))]
    memo[key] = e
    e.key, e.stamp = key, next(_calls)
    return e


def _stamp(e: PreparedCall) -> int:
    return e.stamp


def _tkey(t):
    return None if t is None else (t.shape, t.stride(), t.dtype, t.device)


def attention(q, k, v, causal: bool = False, softmax_scale: float | None = None,
              return_lse: bool = False, scheduler: str = "auto", *, window_size=_NO_WINDOW,
              softcap: float = 0.0, cu_seqlens_q=None, cu_seqlens_k=None, max_seqlen_q=None,
              max_seqlen_k=None, seqused_q=None, seqused_k=None, page_table=None,
              num_splits=None, out=None, q_descale=None, k_descale=None, v_descale=None,
              _trace=None):
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
    automatic, :func:`fa4_aot.plan.choose_num_splits`; 1 = no split). Calls whose
    seqlen_q * (heads // heads_k) <= 128, paged calls and calls with num_splits > 1 run on
    the decode kernels (packed GQA + split-KV, sm_90a).

    FP8 (sm_90a, FA3's convention): k and v in ``torch.float8_e4m3fn`` with ``k_descale`` and
    ``v_descale``, q in bfloat16, or in float8_e4m3fn with ``q_descale``; each descale fp32
    (batch, heads_k) (any strides: an expanded per-layer scalar too), the dequantized input
    being the e4m3 value times its descale. The output is bfloat16; head_dim 64, 128 or 256.
    A dense FP8 prefill (hd128, no window or softcap) runs FP8 wgmmas with V transposed per call
    (:func:`transposed_v`), a bf16 q quantized per call to e4m3 with a power-of-two descale per
    KV head (:func:`fa4_aot.buffers.quantized_q`); every other FP8 call (decode, paged,
    split-KV, varlen, chunked prefill) the FP8 decode kernels, which convert K/V to bf16."""
    e = key = stream = None
    compiling = _is_compiling()
    try:  # the memo key: what the launch depends on, less the addresses
        device = q.device
        if not compiling and device.type == _DEVICE_TYPE and (
                cu_seqlens_q is not None or cu_seqlens_k is not None
                or (max_seqlen_q is None and max_seqlen_k is None)):
            if window_size is _NO_WINDOW:
                wl = wr = -1
            else:
                local, wl, wr = _window(window_size, causal)
                if not local:
                    wl = wr = -1
            stream = _raw_stream(device.index)
            # causal / softcap / max_seqlen carry their type: 1 and True (0 and False) are not
            # the same call; a key is only stored after its call passed the full validation.
            key = (q.shape, q.stride(), k.shape, k.stride(), v.shape, v.stride(),
                   q.dtype, k.dtype, v.dtype, device, k.device, v.device,
                   stream, causal, causal.__class__, softmax_scale, wl, wr,
                   scheduler, softcap, softcap.__class__,
                   None if cu_seqlens_q is None and cu_seqlens_k is None else (
                       _tkey(cu_seqlens_q), _tkey(cu_seqlens_k), max_seqlen_q,
                       max_seqlen_q.__class__, max_seqlen_k, max_seqlen_k.__class__),
                   None if out is None else _tkey(out),
                   None if _trace is None else (_trace.shape, _trace.dtype, _trace.device),
                   None if (num_splits is None and seqused_q is None and seqused_k is None
                            and page_table is None) else (
                       num_splits, num_splits.__class__, _tkey(seqused_q), _tkey(seqused_k),
                       _tkey(page_table)),
                   None if q_descale is None and k_descale is None and v_descale is None
                   else (_tkey(q_descale), _tkey(k_descale), _tkey(v_descale)))
            e = _tls.memo.get(key)
            if e is not None:
                e.stamp = next(_calls)
    except Exception:  # noqa: BLE001 - whatever it is, the validation names it
        e = key = stream = None
    if e is None:  # a miss, or torch.compile tracing the call
        a = Args(q=q, k=k, v=v, causal=causal, softmax_scale=softmax_scale, scheduler=scheduler,
                 window_size=window_size, softcap=softcap, cu_seqlens_q=cu_seqlens_q,
                 cu_seqlens_k=cu_seqlens_k, max_seqlen_q=max_seqlen_q, max_seqlen_k=max_seqlen_k,
                 seqused_q=seqused_q, seqused_k=seqused_k, page_table=page_table,
                 num_splits=num_splits, out=out, trace=_trace, q_descale=q_descale,
                 k_descale=k_descale, v_descale=v_descale)
        if compiling:
            res = _traced(a)
            if res is not None:
                return res if return_lse else res[0]
        e = _prepare(a, key, stream)
    qp, kp, vp = q.data_ptr(), k.data_ptr(), v.data_ptr()
    if e.vt_rows:  # FP8 prefill: the kernel reads V transposed (kept alive until enqueued)
        vt = transposed_v(v, e.vt_rows)
        vp = vt.data_ptr()
        if e.q8_heads_k:  # and a bf16 q quantized, with its descale
            q8, q_descale = quantized_q(q, e.q8_heads_k)
            qp = q8.data_ptr()
    if (qp | kp | vp) & 15 or (out is not None and out.data_ptr() & 15):
        validate.check_qkv(Args(q=q, k=k, v=v, causal=causal, softmax_scale=softmax_scale,
                                softcap=softcap, cu_seqlens_q=cu_seqlens_q,
                                page_table=page_table))  # raises, naming it
        validate.check_out(out, q)
    if _grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad):
        raise forward_only()
    addrs = _NO_ADDRESSES.copy()
    addrs[_Q], addrs[_K], addrs[_V] = qp, kp, vp
    if e.inputs:  # optional inputs, each into its own slot (which ones: fixed per memo key)
        if cu_seqlens_q is not None:
            addrs[_CU_Q] = cu_seqlens_q.data_ptr()
        if cu_seqlens_k is not None:
            addrs[_CU_K] = cu_seqlens_k.data_ptr()
        if seqused_q is not None:
            addrs[_USED_Q] = seqused_q.data_ptr()
        if seqused_k is not None:
            addrs[_USED_K] = seqused_k.data_ptr()
        if page_table is not None:
            addrs[_TABLE] = page_table.data_ptr()
        if _trace is not None:
            addrs[_TRACE] = _trace.data_ptr()
        if q_descale is not None:
            addrs[_QD] = q_descale.data_ptr()
        if k_descale is not None:
            addrs[_KD] = k_descale.data_ptr()
        if v_descale is not None:
            addrs[_VD] = v_descale.data_ptr()
        if _check_varlen_always:
            e.check_offsets(cu_seqlens_q, cu_seqlens_k)
    o, lse = e.run(q, out, return_lse, addrs)
    return (o, lse) if return_lse else o


def _traced(a: Args):
    """Under torch.compile: validate (traced once per guard set) and call the
    ``torch.ops.fa4_aot.fwd`` op (fa4_aot/ops.py), which dynamo can trace. None with ``out``
    or a trace buffer: the eager path runs the call."""
    local, left, right = validate.check(a, _DEVICE_TYPE)
    if torch.is_grad_enabled() and (a.q.requires_grad or a.k.requires_grad
                                    or a.v.requires_grad):
        raise forward_only()
    if a.out is not None or a.trace is not None:
        return None
    sizes = OpSizes(max_seqlen_q=a.max_seqlen_q or 0, max_seqlen_k=a.max_seqlen_k or 0,
                    window_left=left if local else -1, window_right=right if local else -1,
                    num_splits=a.num_splits or 0)
    return torch.ops.fa4_aot.fwd(a.q, a.k, a.v, [getattr(a, f) for f in OpTensors._fields],
                                 list(sizes), a.causal, a.softmax_scale, a.scheduler,
                                 float(a.softcap))


def forward(q, k, v, tensors, sizes, causal, softmax_scale, scheduler, softcap=0.0):
    """``torch.ops.fa4_aot.fwd``'s implementation (fa4_aot/ops.py): ``tensors`` and ``sizes``
    as :class:`OpTensors` and :class:`OpSizes` name them. Returns (out, lse)."""
    # unpacked in the fields' order (named tuples cost ~0.5 us a call on this path)
    cu_seqlens_q, cu_seqlens_k, seqused_q, seqused_k, page_table, *descales = tensors
    q_descale, k_descale, v_descale = descales or _NO_DESCALES
    max_seqlen_q, max_seqlen_k, window_left, window_right, num_splits = sizes
    if cu_seqlens_q is None and cu_seqlens_k is None:
        max_seqlen_q = max_seqlen_k = None
    elif cu_seqlens_k is None:
        max_seqlen_k = None
    window = (_NO_WINDOW if window_left < 0 and window_right < 0
              else (window_left, window_right))
    _tls.in_op = True
    try:
        return attention(q, k, v, causal, softmax_scale, True, scheduler, window_size=window,
                         softcap=softcap, cu_seqlens_q=cu_seqlens_q, cu_seqlens_k=cu_seqlens_k,
                         max_seqlen_q=max_seqlen_q, max_seqlen_k=max_seqlen_k,
                         seqused_q=seqused_q, seqused_k=seqused_k, page_table=page_table,
                         num_splits=num_splits or None, q_descale=q_descale,
                         k_descale=k_descale, v_descale=v_descale)
    finally:
        _tls.in_op = False
