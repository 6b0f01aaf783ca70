"""sm_90a forward, FP8 decode kernels (``cfg.fp8``, ``cfg.decode``): the decode kernel of
``decode.py`` over e4m3 K and V ("kv": a 16-bit q) or e4m3 q, K and V ("qkv").

The producer's TMA loads K and V in e4m3 (half the bytes of bf16: decode is bound by that read)
into ``kv_stages`` stages. Before each wgmma the MMA warpgroup converts the stage it is about to
read into one bf16 K or V buffer (exact: every e4m3 value is a bf16 value), and the wgmmas run
in bf16 as in the 16-bit kernels; an e4m3 q is converted the same way while the warpgroup loads
it. The descales are applied where the prefill FP8 kernels apply them (:class:`.fp8.Fp8Inputs`):
q_descale * k_descale in the softmax scale, v_descale in the epilogue. So the softmax, the
masks, split-KV and the epilogue are the 16-bit kernel's, and the kernel adds no rounding to
FA's beyond the e4m3 inputs themselves.

Descales are FA3's: fp32 (batch, heads_k) with any strides (an expanded per-layer scalar has
stride 0), one value per tile: packed GQA tiles are per KV head."""

from __future__ import annotations

import dataclasses

import cutlass
import cutlass.cute as cute
from cutlass import Float32

from .decode import FlashFwdSm90Decode
from .fp8 import Fp8Inputs
from .mainloop import Mainloop
from .state import Frags, Ptrs, Shape, TileInfo

CHUNK = 16  # elements converted per thread and step: 16 bytes of e4m3


class FlashFwdSm90DecodeFp8(Fp8Inputs, FlashFwdSm90Decode):

    def __init__(self, cfg):
        assert cfg.fp8, cfg.name
        super().__init__(cfg)
        assert self.num_mma_wg == 1 and self.hd % CHUNK == 0
        assert (self.tile_n * self.hd // CHUNK) % 128 == 0, "stage chunks per thread"
        self.o_descale = True

    # ------------------------------------------------------------------ descales
    def tile_frags(self, f: Frags, t: TileInfo, shape: Shape, staged):
        """(q_descale * k_descale, v_descale, K stages, V stages, bf16 K, bf16 V) of the tile
        (packed GQA: a tile is one KV head, ``t.head``)."""
        sK, sV, cK, cV, quant = staged
        qk = self.descale(quant, "k", t.batch, t.head)
        if cutlass.const_expr(self.cfg.fp8 == "qkv"):
            qk = qk * self.descale(quant, "q", t.batch, t.head)
        return dataclasses.replace(
            f, conv=(qk, self.descale(quant, "v", t.batch, t.head), sK, sV, cK, cV))

    # ------------------------------------------------------------------ e4m3 -> bf16
    def copy_q_chunk(self, g2s, ptrs: Ptrs, off, dst, f: Frags):
        """e4m3 q: eight elements (8 bytes) at ``off``, as bf16 into ``dst``."""
        if cutlass.const_expr(self.cfg.fp8 != "qkv"):
            super().copy_q_chunk(g2s, ptrs, off, dst, f)
        else:
            q8 = cute.recast_ptr(ptrs.q_ptr, dtype=self.q_dtype)
            self.convert_chunk(cute.make_tensor(q8 + off, cute.make_layout(8)), [dst])

    def convert_chunk(self, src, dsts):
        """The e4m3 elements of ``src`` -> bf16, into ``dsts`` (consecutive pieces of
        ``src``'s length / len(dsts) elements each; all contiguous)."""
        n = cute.size(src)
        r8 = cute.make_rmem_tensor(cute.make_layout(n), self.kv_dtype)
        cute.autovec_copy(src, r8)
        rb = cute.make_rmem_tensor(cute.make_layout(n), self.dtype)
        rb.store(r8.load().to(Float32).to(self.dtype))
        piece = n // len(dsts)
        for j in range(len(dsts)):  # plain Python: unrolled while tracing
            cute.autovec_copy(cute.local_tile(rb, (piece,), (j,)), dsts[j])

    @cute.jit
    def convert_stage(self, src, dst, d_first: cutlass.Constexpr):
        """One e4m3 stage -> the bf16 buffer, by the warpgroup's 128 threads:
        16 consecutive head-dim elements (one 16-byte load, two 16-byte stores) per thread and
        step, consecutive threads along the head dim (whole 128-byte rows: the swizzle keeps
        the banks apart). ``src``/``dst``: K (keys, d) or, ``d_first``, V (d, keys). Then the
        writes are made visible to wgmma (async proxy) and the warpgroup syncs. The buffer's
        previous reader has completed: every mainloop step ends waiting for its wgmmas."""
        lt = cute.arch.thread_idx()[0] % 128
        per_row = self.hd // CHUNK
        half = CHUNK // 2
        steps = self.tile_n * per_row // 128
        # Unrolled, but at head_dim 256 (ten steps) as a loop: unrolled there, the addresses
        # are hoisted out of the mainloop and spill.
        for i in cutlass.range(steps, unroll=1 if self.hd >= 256 else steps):
            c = lt + i * 128
            row = c // per_row
            ch = c - row * per_row
            if cutlass.const_expr(d_first):
                s = cute.local_tile(src, (CHUNK, 1), (ch, row))[None, 0]
                d = [cute.local_tile(dst, (half, 1), (2 * ch + j, row))[None, 0]
                     for j in range(2)]
            else:
                s = cute.local_tile(src, (1, CHUNK), (row, ch))[0, None]
                d = [cute.local_tile(dst, (1, half), (row, 2 * ch + j))[0, None]
                     for j in range(2)]
            self.convert_chunk(s, d)
        cute.arch.fence_view_async_shared()
        cute.arch.barrier(barrier_id=3, number_of_threads=128)

    @cute.jit
    def gemm_qk(self, f: Frags, stage, trim: cutlass.Constexpr = False):
        """Stage ``stage`` of K converted, then S = Q K^T on the bf16 K."""
        _, _, sK, _, cK, _ = f.conv
        self.convert_stage(sK[None, None, stage], cK[None, None, 0], False)
        Mainloop.gemm_qk(self, f, 0, trim)

    @cute.jit
    def gemm_pv(self, f: Frags, stage, trim: cutlass.Constexpr = False):
        """Stage ``stage`` of V converted, then O += P V on the bf16 V."""
        _, _, _, sV, _, cV = f.conv
        self.convert_stage(sV[None, None, stage], cV[None, None, 0], True)
        Mainloop.gemm_pv(self, f, 0, trim)
