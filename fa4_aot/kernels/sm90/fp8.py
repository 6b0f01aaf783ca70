"""What the FP8 kernel classes share: the launch with the Quant group (abi.FWD_SM90_FP8) and
the descale reads."""

from __future__ import annotations

import cutlass.cute as cute
from cutlass import Int64

from .state import Ptrs, Redo, Shape, Softmax, Strides


class Fp8Inputs:
    """Mixin of the FP8 kernel classes (before the kernel class in the bases)."""

    @cute.jit
    def __call__(
        self,
        mQ: cute.Tensor,  # (seqlen_q, d, heads, batch)
        mK: cute.Tensor,  # (seqlen_k, d, kv_heads, batch), e4m3
        mV: cute.Tensor,  # (seqlen_k, d, kv_heads, batch), e4m3 (FP8 prefill: keys innermost)
        ptrs: Ptrs,
        strides: Strides,
        shape: Shape,
        softmax: Softmax,
        redo: Redo,
        quant,
        stream,
    ):
        self.launch(mQ, mK, mV, (ptrs, strides, shape, softmax, redo, quant), stream)

    @staticmethod
    def descale(quant, x: str, batch, kv_head):
        """The fp32 ``{x}_descale`` (x in q, k, v) of (batch, KV head)."""
        ptr = getattr(quant, f"{x}_descale")
        off = (Int64(batch) * getattr(quant, f"{x}_descale_stride_b")
               + Int64(kv_head) * getattr(quant, f"{x}_descale_stride_h"))
        return cute.make_tensor(ptr + off, cute.make_layout(1))[0]
