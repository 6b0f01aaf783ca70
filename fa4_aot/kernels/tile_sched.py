"""The tile scheduler every fa4_aot kernel uses (CuTe DSL side).

One interface, three fetch mechanisms, chosen at compile time:

``single``  grid = number of tiles; each CTA runs the tile ``blockIdx.x`` and stops.
``static``  persistent grid (SM count x CTAs per SM, chosen at launch); tile += gridDim.x.
``steal``   persistent grid; the first tile is ``blockIdx.x``, every next one is
            ``gridDim.x + atomicAdd(counter, 1)``: a CTA that finishes early takes the next
            unstarted tile in the global (longest-first) order.

The producer warp fetches the next tile index ahead of time (while the loads of the current
tile are in flight) and hands it to the consumer warps through a small shared-memory pipeline
(``PipelineAsync``: full/empty mbarriers, ``TILE_SLOTS`` slots). Consumers read a slot only
after its *full* barrier completed, and the producer rewrites it only after all consumers
released it, so there is no window where a consumer can read a stale or unwritten index, also
when the grid has more CTAs than tiles (those CTAs receive an out-of-range index first and
stop at once).

Counter reuse without a host memset (CUDA-graph replay safe): the counter buffer holds two
int32 words, ``[next, done]``, zeroed once when the runtime allocates it. Every CTA makes
exactly one fetch that returns an index >= num_tiles, after which it fetches no more; at that
point it increments ``done``. The CTA that sees ``done == gridDim.x - 1`` is the last one to
finish fetching, so no other CTA of this launch touches the counter again: it resets both words
to 0. The next launch on the stream (or the next graph replay) starts from zero.

The index -> (m_block, head, batch) decode is :func:`fa4_aot.schedule.decode_tile`, the same
Python function the host tests run.
"""

from __future__ import annotations

import cutlass
import cutlass.cute as cute
from cutlass import Int32

TILE_SLOTS = 2

SINGLE, STATIC, STEAL = "single", "static", "steal"


@cute.jit
def first_tile() -> Int32:
    bidx, _, _ = cute.arch.block_idx()
    return Int32(bidx)


@cute.jit
def next_tile(mode: cutlass.Constexpr, tile: Int32, num_tiles: Int32, counter_ptr) -> Int32:
    """Producer-side fetch of the tile after ``tile``. Called by one whole warp; every lane
    gets the same value. ``mode`` is a compile-time constant."""
    nxt = num_tiles
    grid = Int32(cute.arch.grid_dim()[0])
    if cutlass.const_expr(mode == STATIC):
        nxt = tile + grid
    if cutlass.const_expr(mode == STEAL):
        got = Int32(0)
        if cute.arch.lane_idx() == 0:
            got = grid + cute.arch.atomic_add(
                counter_ptr.llvm_ptr, Int32(1), sem="relaxed", scope="gpu")
            if got >= num_tiles:
                _retire(counter_ptr, grid)
        nxt = cute.arch.shuffle_sync(got, 0)
    return nxt


@cute.jit
def _retire(counter_ptr, gdim: Int32):
    done_ptr = counter_ptr + 1
    done = cute.arch.atomic_add(done_ptr.llvm_ptr, Int32(1), sem="acq_rel", scope="gpu")
    if done == gdim - 1:
        # Last CTA to finish fetching: nobody reads the counter in this launch any more.
        cute.arch.atomic_exch(counter_ptr.llvm_ptr, Int32(0), sem="relaxed", scope="gpu")
        cute.arch.atomic_exch(done_ptr.llvm_ptr, Int32(0), sem="relaxed", scope="gpu")
