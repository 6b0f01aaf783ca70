"""The tile schedulers of the fa4_aot kernels (CuTe DSL side): one interface, two mechanisms.

Interface (:class:`TileScheduler`): a warp that walks the tiles of its CTA does ::

    tile, state = sched.first(), sched.init_state()
    while tile < sched.num_tiles:
        ...                                   # work on tile
        tile, state = sched.next(tile, state)  # >= num_tiles: stop

(the state is rebound in the loop body so that the tracer carries it; it is ``None`` where the
mechanism has none). :class:`TileSchedParams` carries the launch's runtime scalars
(``num_m_blocks``, ``section``, ``num_tiles``) and decodes an index into
``(m_block, head, batch)`` with :func:`fa4_aot.schedule.decode_tile`, the same Python function
the host tests run.

:class:`AtomicCounterScheduler` (sm_90a; mode chosen at compile time)
=====================================================================

``single``  grid = number of tiles; each CTA runs the tile ``blockIdx.x`` and stops.
``static``  persistent grid (SM count x CTAs per SM, chosen at launch); tile += gridDim.x.
``steal``   persistent grid; the first tile is ``blockIdx.x``, every next one is
            ``gridDim.x + atomicAdd(counter, 1)``: a CTA that finishes early takes the next
            unstarted tile in the global (longest-first) order.

Only one warp fetches (sm_90a prefill kernels: warp 1 of the producer warpgroup, the fetcher,
one tile ahead of the load warp — or, for compact varlen grids, as far as the ``TILE_SLOTS``
slots allow; decode kernels: the load warp itself, once a tile's loads are issued) and hands
each index to the other warps through a small shared-memory pipeline (``PipelineAsync``:
full/empty mbarriers, ``TILE_SLOTS`` slots). Readers read a slot only after its *full* barrier
completed, and the fetcher rewrites it only after all readers released it, so there is no
window where a reader can see a stale or unwritten index, also when the grid has more CTAs
than tiles (those CTAs receive an out-of-range index first and stop at once).

Counter reuse without a host memset (CUDA-graph replay safe): the counter buffer holds two
int32 words, ``[next, done]``, zeroed once when the runtime allocates it. Every CTA makes
exactly one fetch that returns an index >= num_tiles, after which it fetches no more; at that
point it increments ``done``. The CTA that sees ``done == gridDim.x - 1`` is the last one to
finish fetching, so no other CTA of this launch touches the counter again: it resets both words
to 0. The next launch on the stream (or the next graph replay) starts from zero.

:class:`CompactVarlenOrder` (sm_90a prefill kernels, varlen launches with ``SeqMode.COMPACT``)
==============================================================================================

The scheduler then runs over compact indices, the non-empty m-blocks of the documents only
(their number, :meth:`CompactVarlenOrder.total`, is counted by the fetching warp at the
start); the fetching warp maps each index to the dense tile index that the other warps decode
(:meth:`CompactVarlenOrder.to_dense`, the order of schedule.compact_tiles).

:class:`ClcScheduler` (sm_100a; ``static`` or ``clc``)
======================================================

``static`` is the persistent tile += gridDim.x walk, done by every warp on its own.

``clc``: grid = one CTA per tile (``grid_x = num_tiles``). A CTA's first tile is
``blockIdx.x``. Every further tile comes from ``clusterlaunchcontrol.try_cancel``: the hardware
cancels a CTA of this grid that has not started yet and hands its ``ctaid.x`` (= its tile index)
to the asking CTA. A response that says "not canceled" means no unstarted CTA is left: the CTA
stops.

One response slot (16 bytes, 16-byte aligned, shared memory) guarded by
``PipelineClcFetchAsync`` with one stage: a *full* mbarrier (arrival count 1, plus 16
transaction bytes) and an *empty* mbarrier (arrival count = every thread of the CTA: all warps
read the response, the scheduler warp included).

1. Issue (scheduler warp only, :meth:`ClcScheduler.producer_loop`). ``producer_acquire`` waits
   on *empty* (so the slot is never rewritten before all readers released the previous
   response), then lane 0 does ``mbarrier.arrive.expect_tx(full, 16)``; one elected lane
   issues ``try_cancel`` with the slot and *full*. The hardware writes the 16 bytes and
   completes the transaction on *full*.
2. Read (every warp, :meth:`ClcScheduler.next`). ``consumer_wait`` waits for the phase of
   *full*; only then each lane loads the 16 bytes and decodes them with
   ``clusterlaunchcontrol.query_cancel`` (``is_canceled`` + ``get_first_ctaid.x``). Each lane
   then executes ``fence.proxy.async.shared::cta`` (the next response is written by the async
   proxy: the generic read must be ordered before it) and arrives on *empty*
   (``consumer_release``). No lane touches the slot after its arrive.
3. Every reader warp reads every response, in the same order, exactly once per tile it
   finished: a warp that finished tile k always waits for response k before deciding whether
   to continue. There is no shortcut for "my first tile was the last one": also when there are
   fewer tiles than SMs, every CTA issues one query, the response (not canceled) is still
   written with complete_tx, and all threads wait for it before reading it.
4. The scheduler issues query k+1 only after it read response k and saw "canceled" (a CTA
   never issues try_cancel after a failed one, which the PTX ISA leaves undefined), and only
   after all readers released response k. Before leaving, it waits once more on *empty*
   (``producer_tail``): every arrive on the slot's barriers has landed before it exits.
5. A canceled tile index >= num_tiles (an over-sized grid) also counts as "stop".
"""

from __future__ import annotations

from typing import NamedTuple

import cutlass
import cutlass.cute as cute
import cutlass.pipeline as pipeline
from cutlass import Int32

from fa4_aot.schedule import decode_tile, encode_tile, heavy_m_blocks

from .common.seqlen import SEQ_COMPACT, SEQ_USED_Q, clamped_doc

TILE_SLOTS = 2

# Modes (compile time). "single" needs no constant: its next tile is always num_tiles.
STATIC, STEAL, CLC = "static", "steal", "clc"


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


class TileSchedParams(NamedTuple):
    """The launch's tile-order scalars (kernel parameters ``num_m_blocks``, ``section``,
    ``num_tiles``; see fa4_aot/schedule.py)."""

    num_m_blocks: Int32
    section: Int32
    num_tiles: Int32

    def decode(self, tile, num_heads):
        """Tile index -> (m_block, head, batch)."""
        return decode_tile(tile, self.num_m_blocks, num_heads, self.section)


class _Carried:
    """Lets a scheduler object be used inside the kernel's tile loops: the tracer may carry it
    through a ``while``, so it flattens into its DSL values (``_dsl_fields``) and is rebuilt
    from them; the other attributes are compile-time and copied."""

    _dsl_fields: tuple = ()

    def __extract_mlir_values__(self):
        values, self._n_values = [], []
        for f in self._dsl_fields:
            v = cutlass.extract_mlir_values(getattr(self, f))
            values += v
            self._n_values.append(len(v))
        return values

    def __new_from_mlir_values__(self, values):
        new = object.__new__(type(self))
        new.__dict__.update(self.__dict__)
        for f, n in zip(self._dsl_fields, self._n_values):
            setattr(new, f, cutlass.new_from_mlir_values(getattr(self, f), values[:n]))
            values = values[n:]
        return new


class TileScheduler(_Carried):
    """The interface (see the module docstring): ``first()``, ``init_state()``,
    ``next(tile, state) -> (tile, state)``, ``num_tiles``; a tile ``>= num_tiles`` means
    stop. Subclasses hold compile-time choices as Python attributes and runtime values as DSL
    values; they are built inside the kernel."""

    params: TileSchedParams

    @property
    def num_tiles(self) -> Int32:
        return self.params.num_tiles

    def first(self) -> Int32:
        raise NotImplementedError

    def init_state(self):
        return None

    def next(self, tile: Int32, state):
        raise NotImplementedError


class AtomicCounterScheduler(TileScheduler):
    """sm_90a: ``single``/``static``/``steal`` (module docstring). The fetching warp (the
    producer) calls ``next``; other warps receive the index through the kernel's tile-slot
    pipeline. ``counter_ptr``: the int32[2] counter (read by ``steal`` only)."""

    _dsl_fields = ("params", "counter_ptr")

    def __init__(self, mode: str, params: TileSchedParams, counter_ptr):
        assert mode in ("single", STATIC, STEAL), mode
        self.mode = mode
        self.params = params
        self.counter_ptr = counter_ptr

    def first(self) -> Int32:
        return first_tile()

    def next(self, tile: Int32, state=None):
        return next_tile(self.mode, tile, self.num_tiles, self.counter_ptr), state


class ClcScheduler(TileScheduler):
    """sm_100a: ``static`` (every warp strides by gridDim.x) or ``clc`` (cluster launch
    control; one scheduler warp issues the queries, every warp of the CTA reads every response,
    module docstring). Build it with :meth:`create` inside the kernel, by every thread, before
    the barrier that follows mbarrier initialisation."""

    RESPONSE_BYTES = 16
    _dsl_fields = ("params", "pipe", "response_ptr", "_first")

    def __init__(self, mode: str, params: TileSchedParams, pipe, response_ptr, first: Int32):
        assert mode in (STATIC, CLC), mode
        self.mode = mode
        self.params = params
        self.pipe = pipe
        self.response_ptr = response_ptr
        self._first = first

    @staticmethod
    def create(mode: str, params: TileSchedParams, barrier_ptr, response_ptr, readers: int):
        """``barrier_ptr``: two mbarriers (Int64) in shared memory; ``response_ptr``: the
        16-byte aligned 16-byte response slot; ``readers``: threads of the CTA (all of them
        read every response). Static mode uses neither."""
        pipe = None
        if cutlass.const_expr(mode == CLC):
            pipe = pipeline.PipelineClcFetchAsync.create(
                num_stages=1,
                producer_group=pipeline.CooperativeGroup(pipeline.Agent.Thread, 1),
                consumer_group=pipeline.CooperativeGroup(pipeline.Agent.Thread, readers),
                tx_count=ClcScheduler.RESPONSE_BYTES,
                barrier_storage=barrier_ptr, defer_sync=True)
        return ClcScheduler(mode, params, pipe, response_ptr, Int32(cute.arch.block_idx()[0]))

    def first(self) -> Int32:
        """``blockIdx.x`` (read once, when the scheduler was created)."""
        return self._first

    def init_state(self):
        """The reader's pipeline state (``None`` in static mode)."""
        if cutlass.const_expr(self.mode == CLC):
            return pipeline.make_pipeline_state(pipeline.PipelineUserType.Consumer, 1)
        return None

    @cute.jit
    def next(self, tile: Int32, state):
        """The tile after ``tile`` (>= num_tiles: stop). Called by whole warps; every lane
        gets the same value. In CLC mode this is step 2 of the protocol."""
        nxt = self.num_tiles
        if cutlass.const_expr(self.mode == STATIC):
            nxt = tile + Int32(cute.arch.grid_dim()[0])
        else:
            self.pipe.consumer_wait(state)
            cta_x, _, _, canceled = cute.arch.clc_response(self.response_ptr)
            cute.arch.fence_proxy("async.shared", space="cta")
            self.pipe.consumer_release(state)
            state.advance()
            if canceled != 0:
                nxt = cta_x
        return nxt, state

    @cute.jit
    def producer_loop(self):
        """The scheduler warp (CLC mode): steps 1, 2 and 4 of the protocol."""
        prod_state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Producer, 1)
        cons_state = self.init_state()
        tile = self.first()
        while tile < self.num_tiles:
            # Step 1: the slot is free (all readers released it); arm full and ask.
            self.pipe.producer_acquire(prod_state)
            with cute.arch.elect_one():
                cute.arch.issue_clc_query(
                    self.pipe.producer_get_barrier(prod_state), self.response_ptr,
                    multicast=False)
            prod_state.advance()
            # Step 2: the scheduler warp reads the response like every other reader.
            tile, cons_state = self.next(tile, cons_state)
        # Step 4: wait until every reader released the last response before exiting.
        self.pipe.producer_tail(prod_state)


class CompactVarlenOrder:
    """Varlen prefill launches with ``SeqMode.COMPACT`` (mostly empty grids): the scheduler
    (:class:`AtomicCounterScheduler` over :meth:`total` indices) hands out compact indices,
    which count only the non-empty m-blocks of the documents; the fetching warp turns each into
    the dense tile index the other warps decode (:meth:`to_dense`). Compile-time: the
    scheduler ``mode`` (static re-reads a document's m-blocks instead of carrying them), the
    m tile, the mask (causal: heavy m-blocks first) and ``light_limit``
    (schedule.light_tiles_limit). ``ptrs``/``shape`` are the launch-ABI groups (fa4_aot/abi.py);
    ``totals`` the packed lengths (offsets are clamped to them)."""

    def __init__(self, mode: str, tile_m: int, causal: bool, light_limit: int):
        self.mode = mode
        self.tile_m = tile_m
        self.causal = causal
        self.light_limit = light_limit

    def enabled(self, shape):
        """Whether the launch counts varlen tiles compactly (``SeqMode.COMPACT``). Read from
        the parameter each time: the fetching warp keeps no register for it."""
        return shape.seq_mode & SEQ_COMPACT != 0

    def num_docs(self, shape):
        """Documents of a varlen prefill launch (its tiles are m-blocks x heads x documents)."""
        return shape.num_tiles // (shape.num_m_blocks * shape.num_heads)

    @cute.jit
    def doc_m_blocks(self, d, ptrs, shape, totals):
        """m-blocks of document ``d`` of a varlen prefill launch (0 past the last document):
        its rows as the consumers see them (offsets clamped, seqused_q applied)."""
        nb = Int32(0)
        if d < self.num_docs(shape):
            _, rows = clamped_doc(ptrs.cu_seqlens_q, d, totals[0])
            if shape.seq_mode & SEQ_USED_Q != 0:
                rows = cutlass.min(rows, cutlass.max(cute.make_tensor(
                    ptrs.seqused_q + d, cute.make_layout(1))[0], Int32(0)))
            nb = (rows + self.tile_m - 1) // self.tile_m
        return nb

    @cute.jit
    def total(self, ptrs, shape, totals):
        """Non-empty tiles of a varlen launch: heads x the documents' m-blocks (warp-wide:
        lane l sums documents l, l + 32, ...)."""
        s = Int32(0)
        for i in cutlass.range((self.num_docs(shape) + 31) // 32, unroll=1):
            s = s + self.doc_m_blocks(i * 32 + cute.arch.lane_idx(), ptrs, shape, totals)
        for off in (16, 8, 4, 2, 1):
            s = s + cute.arch.shuffle_sync_bfly(s, offset=off)
        return s * shape.num_heads

    @cute.jit
    def to_dense(self, c, total, doc, doc_base, nb, ptrs, shape, totals):
        """Compact index ``c`` -> (tile index, document, its first compact index, its m-blocks
        ``nb``); the tile index is ``shape.num_tiles`` (stop) when ``c >= total``. The order
        (schedule.compact_tiles): documents in turn; inside a document its heavy m-blocks
        (schedule.heavy_m_blocks: all, or the upper half under a causal mask) with its heads in
        groups of ``shape.section`` (a divisor of num_heads on compact launches), each group's
        m-blocks from the last down, the group's heads together; then the other m-blocks the
        same way, in groups of ``shape.section`` if there are more than ``light_limit`` such
        tiles (schedule.light_tiles_limit), else all heads in one. The walk starts at the cursor
        ``doc`` (whose m-blocks ``nb`` the previous call returned): this CTA's indices only
        grow, so over the launch it reads each document's offsets about once."""
        dense = shape.num_tiles
        if cutlass.const_expr(self.mode == STATIC):
            # Read again: a register carried across the static fetcher's loop spills there.
            nb = self.doc_m_blocks(doc, ptrs, shape, totals)
        if c < total:
            while c >= doc_base + nb * shape.num_heads:
                doc_base = doc_base + nb * shape.num_heads
                doc = doc + 1
                nb = self.doc_m_blocks(doc, ptrs, shape, totals)
            r = c - doc_base
            heavy = heavy_m_blocks(nb, self.causal)
            # The part of the document r falls in: its first m-block (from the last), its
            # m-blocks, the heads of a group.
            m_base, span, sec = Int32(0), heavy, shape.section
            if r >= heavy * shape.num_heads:
                r = r - heavy * shape.num_heads
                m_base = heavy
                span = nb - heavy
                if span * shape.num_heads <= self.light_limit:
                    sec = shape.num_heads
            group = r // (span * sec)
            r = r - group * (span * sec)
            m_rev = r // sec
            head = group * sec + r - m_rev * sec
            dense = encode_tile(nb - 1 - m_base - m_rev, head, doc, shape.num_m_blocks,
                                shape.num_heads, shape.section)
        return dense, doc, doc_base, nb
