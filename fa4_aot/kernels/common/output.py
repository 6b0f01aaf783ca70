"""The output (O) addressing both kernels rely on."""

from __future__ import annotations

from typing import NamedTuple

import cutlass.cute as cute
from cutlass import Int64

# The runtime guarantees a 16-byte aligned O data pointer and O strides that are multiples of
# 8 elements (16 bytes of bf16/fp16); fa4_aot/interface.py copies an output that is not.
O_STRIDE_DIVBY = 8


class OStrides(NamedTuple):
    """Element strides of the output (batch, seqlen, heads, d) layout, d contiguous."""

    s: Int64
    h: Int64
    b: Int64

    def assume_aligned(self) -> "OStrides":
        """The same strides with the 16-byte alignment promise attached (so that stores the
        kernel writes as 32-bit / 16-byte accesses stay that wide)."""
        return OStrides(cute.assume(self.s, divby=O_STRIDE_DIVBY),
                        cute.assume(self.h, divby=O_STRIDE_DIVBY),
                        cute.assume(self.b, divby=O_STRIDE_DIVBY))

    def offset(self, head, batch, row):
        """Element offset of (batch, row, head, 0): ``head*h + batch*b + row*s`` in 64 bits."""
        return Int64(head) * self.h + Int64(batch) * self.b + Int64(row) * self.s
