"""What the FP8 kernel classes share: the launch with the Quant group (abi.FWD_SM90_FP8), the
descale reads, and where the descales go: q_descale * k_descale into the tile's softmax scale
(``Frags.conv[0]``), v_descale into the epilogue (``conv[1]``, ``o_descale``)."""

from __future__ import annotations

import cutlass
import cutlass.cute as cute
from cutlass import Float32, Int64

from .state import Frags, Ptrs, Redo, Shape, Softmax, Strides


# What a zero q*k descale product becomes in the softmax scale: small enough that every
# exponent rounds to 0, large enough that scale_log2 times it stays a normal float.
ZERO_DESCALE = 1e-30


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

    @cute.jit
    def tile_softmax(self, softmax: Softmax, f: Frags):
        """S comes from the e4m3 values: the true scores are S * q_descale * k_descale. With a
        softcap (softcap_pre != 0) the scale goes into softcap_pre, the softmax's unit being
        the cap; otherwise into the softmax scale."""
        # A zero q_descale * k_descale (every score 0: uniform attention) is kept off exact
        # zero, so that a masked (-inf) score still gives exp2(-inf) = 0, not -inf * 0 = NaN.
        qk = cutlass.select_(f.conv[0] == Float32(0.0), Float32(ZERO_DESCALE), f.conv[0])
        unit = Float32(1.0)
        if softmax.softcap_pre == Float32(0.0):
            unit = qk
        return softmax._replace(softmax_scale_log2=softmax.softmax_scale_log2 * unit,
                                softmax_scale=softmax.softmax_scale * unit,
                                softcap_pre=softmax.softcap_pre * qk)
