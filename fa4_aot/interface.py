"""``fa4_aot.attention``: the memo, the launch on the torch stream, the torch.compile path.

A call, in three parts:

* **The key**, computed in :func:`attention`: everything the launch depends on except the
  tensors' addresses — shapes, strides, dtypes and devices of the tensors, the scalar
  arguments, and the current stream. Each thread keeps a memo from key to a prepared call.
* **A memo miss** (:func:`_prepare`): :func:`fa4_aot.validate.call_spec` (every check, each
  error naming the argument), then :func:`fa4_aot.plan.plan` (the kernels, grids and launch
  values), then :func:`fa4_aot.prepared.build` (the launch objects of ``fa4_aot.runtime``:
  parameter buffers with every constant and TMA descriptor in place). A dense call of a new
  sequence length may instead retarget a prepared call of its form (:func:`_prepare`).
* **Every call** (:meth:`fa4_aot.prepared.PreparedCall.run`): the checks a key cannot carry (16-byte aligned
  data pointers, forward-only), the output and LSE allocation, the call's address record (one
  list of :data:`fa4_aot.runtime.ADDRESSES`, filled by name) written into the parameter
  buffers, ``cuLaunchKernelEx``. No device->host copy, no synchronisation: varlen
  offsets are read on the host only when asked (:func:`check_varlen`,
  ``FA4_AOT_CHECK_VARLEN=1``); the kernels clamp documents to the packed length.
"""

from __future__ import annotations

import itertools

from . import plan as _planner
from . import prepared, validate
from .buffers import quantized_q, transposed_v
from .manifest import load_manifest
from .plan import DeviceInfo
from .prepared import (_CU_K, _CU_Q, _K, _NO_ADDRESSES, _Q, _QD, _TABLE, _TRACE, _USED_K,
                       _USED_Q, _V, _VD, _KD, PreparedCall, _tls, build, launch_counts)
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
MEMO_SIZE = 512  # prepared calls per thread (oldest dropped first)
# Prepared calls per form (the memo key less the sequence lengths and strides of a dense call):
# a call of a new length is first prepared in full, up to this many per form; after that the
# least recently called one is retargeted to it (_prepare).
FORM_POOL = 4

if torch is not None:
    _grad_enabled = torch.is_grad_enabled
    _is_compiling = torch.compiler.is_compiling
    _raw_stream = getattr(torch._C, "_cuda_getCurrentRawStream", None) or (
        lambda index: torch.cuda.current_stream(index).cuda_stream)
_DEVICE_TYPE = "cuda"  # the device type the fast path accepts (tests swap in "cpu")
_window = validate.window


_calls = itertools.count(1)  # call stamps: the least recently called entry of a form


def clear_memo():
    """Forget this thread's prepared calls and its scratch pools (tests; the memo is bounded by
    MEMO_SIZE anyway)."""
    _tls.memo.clear()
    _tls.forms.clear()
    _tls.pools.clear()
    _device_infos.clear()


def prepared_calls() -> tuple:
    """This thread's prepared calls, oldest first (for tests and host benchmarks): each has
    ``.plan`` (its :class:`fa4_aot.plan.LaunchPlan`) and ``.launchers`` (one per launch)."""
    return tuple(_tls.memo.values())


def memo_plans() -> tuple:
    """The :class:`fa4_aot.plan.LaunchPlan` of each call this thread's memo holds, oldest first
    (``.call`` is its :class:`fa4_aot.plan.CallSpec`, ``.launches`` its kernels and values)."""
    return tuple(e.plan for e in _tls.memo.values())


def set_check_varlen(enabled: bool):
    """Run :func:`check_varlen` on every varlen call (True) or never (False); the default
    comes from ``FA4_AOT_CHECK_VARLEN`` (:data:`fa4_aot.prepared.CHECK_VARLEN_ENV`)."""
    prepared.check_varlen_always = bool(enabled)


def _device_arch(device) -> str:
    return _planner.device_arch(torch.cuda.get_device_capability(device))  # cached by torch


def num_sms(device) -> int:
    idx = device.index
    if idx not in _sm_count:
        _sm_count[idx] = torch.cuda.get_device_properties(device).multi_processor_count
    return _sm_count[idx]


def _device_info(device) -> DeviceInfo:
    info = _device_infos.get(device.index)
    if info is None:
        info = _device_infos[device.index] = DeviceInfo(_device_arch(device), num_sms(device))
    return info


_device_infos: dict = {}  # device index -> DeviceInfo (clear_memo() forgets them)


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


def prepare(a: Args, manifest=None, kernel: str | None = None, stream=None) -> PreparedCall:
    """Validate, plan (:func:`plan_call`: ``manifest``, ``kernel``) and build the launchers of
    a call on ``stream`` (default: the current one), outside the memo: run it with
    :meth:`PreparedCall.launch`. Tools prepare calls against other artifact folders or with a
    kernel forced this way."""
    manifest = manifest or load_manifest()
    p = plan_call(a, manifest, kernel)
    return build(p, a, _raw_stream(a.q.device.index) if stream is None else stream, manifest)


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
        e = build(p, a, stream, manifest, old if same else None)
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
