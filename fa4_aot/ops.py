"""``torch.ops.fa4_aot.fwd``: the forward as a torch operator with a fake (meta)
implementation, so ``torch.compile(fullgraph=True)`` traces models that call
:func:`fa4_aot.attention` and CUDA graphs capture it like any other op.

Arguments: q, k, v; ``tensors`` (:class:`fa4_aot.interface.OpTensors`: cu_seqlens_q/k,
seqused_q/k, page_table, q/k/v_descale, None where absent); ``sizes``
(:class:`fa4_aot.interface.OpSizes`: max_seqlen_q/k, window_left/right, num_splits); causal,
softmax_scale, scheduler, softcap.

Defined with ``torch.library.Library`` (schema, CUDA kernel, fake) rather than
``torch.library.custom_op``: the latter wraps every call in Python autograd and aliasing
checks (~6 us of host time a call); this op has no backward (the Autograd key falls through),
and :func:`fa4_aot.interface.forward` raises when grad mode is on and an input requires grad."""

from __future__ import annotations

import torch

from .interface import OpTensors, forward
from .validate import forward_only

SCHEMA = ("fwd(Tensor q, Tensor k, Tensor v, Tensor?[] tensors, SymInt[] sizes, bool causal, "
          "float? softmax_scale, str scheduler, float softcap) -> (Tensor, Tensor)")

_lib = torch.library.Library("fa4_aot", "DEF")  # kept alive: the registrations live with it
_lib.define(SCHEMA)
_lib.impl("fwd", forward, "CUDA")
# No autograd formula: skip the Autograd key (forward() refuses inputs that require grad while
# grad mode is on, with a message saying fa4_aot is forward-only).
_lib.impl("fwd", torch.library.fallthrough_kernel, "Autograd")


@torch.library.register_fake("fa4_aot::fwd", lib=_lib)
def _(q, k, v, tensors, sizes, causal, softmax_scale, scheduler, softcap):
    if torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad):
        raise forward_only()
    out = torch.empty_like(q, memory_format=torch.contiguous_format,
                           dtype=torch.bfloat16 if q.dtype == torch.float8_e4m3fn else q.dtype)
    if OpTensors(*tensors).cu_seqlens_q is not None:  # packed q
        lse = q.new_empty((q.shape[1], q.shape[0]), dtype=torch.float32)
    else:
        lse = q.new_empty((q.shape[0], q.shape[2], q.shape[1]), dtype=torch.float32)
    return out, lse
