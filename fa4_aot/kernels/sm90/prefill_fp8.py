"""sm_90a forward, FP8 prefill kernels (``cfg.fp8 == "qkv"``, not ``decode``): the prefill
kernel with e4m3 Q, K and V and FP8 wgmmas.

* S = Q K^T: both operands e4m3 in shared memory, K-major (as loaded).
* The softmax runs in fp32 with the tile's scale times q_descale * k_descale (one value per
  tile: its query head's KV head); the LSE is in the same units as the 16-bit kernels'.
* O += P V: P rounded to e4m3 (values in [0, 1]: the row max is subtracted; FA3's FP8 rule)
  as the register A operand, V as the K-major B operand: FP8 wgmma takes no MN-major operand,
  so the runtime passes V transposed, (batch, heads_k, d, keys), its keys reordered within
  each group of ``abi.VT_GROUP`` (``abi.VT_ORDER``) so that each thread packs P's e4m3 A
  operand from its own accumulator values (:meth:`convert_p`).
* The epilogue multiplies O by the tile's v_descale; O is bf16.

Dense batches only (no varlen, paging or windows: those FP8 calls take the FP8 decode
kernels)."""

from __future__ import annotations

import dataclasses

import cutlass
import cutlass.cute as cute
from cutlass import Uint32

from fa4_aot.abi import VT_GROUP

from .fp8 import Fp8Inputs
from .prefill import FlashFwdSm90Prefill
from .ptx import pack_e4m3x4
from .state import Frags, Shape, TileInfo


class FlashFwdSm90PrefillFp8(Fp8Inputs, FlashFwdSm90Prefill):

    def __init__(self, cfg):
        assert cfg.fp8 == "qkv" and not cfg.decode, cfg.name
        super().__init__(cfg)
        self.mma_dtype = cutlass.Float8E4M3FN
        self.v_k_major = True
        self.convert_kv = False
        self.o_descale = True
        assert not (self.staged_store or self.lazy_ref or self.edge_n), cfg.tile
        assert self.tile_n % VT_GROUP == 0 and self.rescale_threshold is None, cfg.tile

    def tile_frags(self, f: Frags, t: TileInfo, shape: Shape, staged):
        """(q_descale * k_descale, v_descale) of the tile's KV head."""
        quant = staged[-1]
        kv_head = t.head // shape.qhead_per_kvhead
        qk = (self.descale(quant, "q", t.batch, kv_head)
              * self.descale(quant, "k", t.batch, kv_head))
        return dataclasses.replace(f, conv=(qk, self.descale(quant, "v", t.batch, kv_head)))

    def make_p_frag(self, acc_S):
        """P's e4m3 A operand: per k32 block four 32-bit registers (row r, then r + 8, for key
        slots 4t..4t+3, then the same for 16+4t..16+4t+3, t = lane % 4), the wgmma k32
        fragment order."""
        groups = acc_S.layout.shape[0][2]  # the accumulator's 8-column groups
        return cute.make_rmem_tensor(
            cute.make_layout(((4, 2, 2), 1, groups // 4), stride=((1, 4, 8), 0, 16)),
            self.mma_dtype)

    @cute.jit
    def convert_p(self, f: Frags):
        """P (fp32, in acc_S) -> e4m3 A operand. The accumulator holds, per 8-column group g,
        (row r: columns 2t, 2t+1; row r + 8: the same) at 4g..4g+3. Register 4kb + 2h + r'
        of block kb packs groups g = 4kb + 2h and g + 1 of row r + 8r': columns 2t, 2t+1,
        8+2t, 9+2t of its 16-key half, which V's reordering (abi.VT_ORDER) puts at slots
        4t..4t+3."""
        p32 = cute.recast_tensor(f.tOrP, Uint32)
        a = f.acc_S
        for j in cutlass.range_constexpr(cute.size(p32)):
            g0 = 2 * (j // 2)  # 4kb + 2h
            r = j % 2
            p32[j] = pack_e4m3x4(a[4 * g0 + 2 * r], a[4 * g0 + 2 * r + 1],
                                 a[4 * g0 + 4 + 2 * r], a[4 * g0 + 4 + 2 * r + 1])
