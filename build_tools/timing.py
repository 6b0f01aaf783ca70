"""Timing on a GPU, shared by the benchmarks (bench/) and the ptxas tuner (build_tools/tune.py):
CUDA events around back-to-back calls, and the order in which rounds take their providers in
turn. torch is imported by :func:`event_time` only."""

from __future__ import annotations

import functools


def event_time(fn, iters: int) -> float:
    """Milliseconds per call of ``fn()``: CUDA events around ``iters`` back-to-back calls on the
    current stream, divided by ``iters`` (host launch cost hides behind the GPU unless it is
    longer than the kernel). torch is imported here, not by this module."""
    import torch
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(iters):
        fn()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) / iters


def round_order(providers, r):
    """The order in which round ``r`` of a benchmark times its providers: row ``r`` (cyclically)
    of a Williams design (:func:`_williams_rows`). Over one cycle (2n rows for n providers, n
    when n is even) every provider takes every position equally often and runs right after
    every other provider equally often, so neither the position nor the provider that ran
    before favours anyone. Near the GPU's power cap that matters: a kernel's clock depends on
    the load that ran before it (100 ms of its own calls first did not undo that), and with
    three providers in the old order (reversed every other round) the middle one followed the
    low-power cuDNN turn in every other round and gained up to 10 % on packed documents
    (docs/perf-notes.md v24). Two providers: A B, B A, as before.
    """
    providers = list(providers)
    if len(providers) < 2:
        return providers
    rows = _williams_rows(len(providers))
    return [providers[i] for i in rows[r % len(rows)]]


@functools.lru_cache(maxsize=None)
def _williams_rows(n: int) -> tuple:
    """The rows of :func:`round_order` for ``n >= 2`` providers: rows i = 0..n-1 are
    ``(x + i) % n`` for x in 0, 1, n-1, 2, n-2, ...; for odd n the n rows reversed follow.

    The rows run back to back, so a row's last provider is the next row's first one's
    predecessor too. With odd n the cycle's rows are put in an order in which no provider ends
    one row and starts the next (then it would run two turns in a row, and which load came
    before that pair would differ by provider: in the rows' plain order, three providers
    P0 P1 P2, P0's pair followed P1's turn and P1's followed P2's; docs/perf-notes.md v34), and
    no ordered pair of providers meets at more than one row boundary: for three providers every
    ordered pair then follows each other three times in the cycle, and nobody follows itself.
    The last row ends with the last provider, as the warm-up before the first round does (the
    providers in their order), so the first round starts as every later cycle does.
    Even n > 2 has no such boundary (its rows' order is the plain one); n = 2 keeps A B, B A
    (each provider runs twice in a row once a cycle, after the other one's turn: the same for
    both)."""
    first, lo, hi = [0], 1, n - 1
    while len(first) < n:  # 0, 1, n-1, 2, n-2, ...
        if len(first) % 2:
            first.append(lo)
            lo += 1
        else:
            first.append(hi)
            hi -= 1
    rows = [tuple((x + i) % n for x in first) for i in range(n)]
    if n % 2 == 0:
        return tuple(rows)
    rows += [row[::-1] for row in rows]

    def chain(seq, pairs):  # depth-first: the rows in a cyclic order with distinct boundaries
        if len(seq) == len(rows):
            # the last row ends with provider n - 1, as the warm-up does, and hands over to 0
            edge = (rows[seq[-1]][-1], rows[seq[0]][0])
            return seq if edge == (n - 1, 0) and edge not in pairs else None
        for j in range(len(rows)):
            edge = (rows[seq[-1]][-1], rows[j][0])
            if j not in seq and edge[0] != edge[1] and edge not in pairs:
                found = chain(seq + [j], pairs | {edge})
                if found:
                    return found
        return None

    order = chain([0], frozenset())
    assert order is not None, n
    return tuple(rows[j] for j in order)


def timed_rounds(providers, repeats, time_turn, first_after=None, on_error=None):
    """``{provider: ([ms of each repeat], [the provider that ran just before each])}``: the
    repeats taken round ``providers`` in the orders of :func:`round_order`;
    ``time_turn(provider)`` times one turn; ``first_after``: what ran before the first turn
    (the last provider warmed up). A provider whose turn raises is handed to
    ``on_error(provider, exception)`` (re-raised without one) and leaves the rotation."""
    providers = list(providers)
    out = {p: ([], []) for p in providers}
    prev = first_after
    for r in range(repeats):
        for p in round_order(providers, r):
            if p not in out:
                continue
            try:
                out[p][0].append(time_turn(p))
                out[p][1].append(prev)
            except Exception as e:  # noqa: BLE001 - the caller decides
                if on_error is None:
                    raise
                on_error(p, e)
                del out[p]
            prev = p
    return out


def samples(times, after) -> list:
    """The JSON form of a provider's repeats (``samples``, see :data:`TIMING`): ``[ms, the
    provider that ran just before]`` of each, from :func:`timed_rounds`' two lists."""
    return [[round(t, 6), a] for t, a in zip(times, after)]


def balanced_repeats(n_providers: int) -> int:
    """Rounds in one cycle of :func:`round_order` (a --repeats that is a multiple of this is
    balanced)."""
    return 1 if n_providers < 2 else (n_providers if n_providers % 2 == 0 else 2 * n_providers)


def balance_note(n_providers: int, repeats: int) -> str | None:
    """A note for the run's metadata when ``repeats`` rounds do not make whole cycles of
    :func:`round_order` (some provider then runs after another, or in a position, more often)."""
    cycle = balanced_repeats(n_providers)
    if repeats % cycle == 0:
        return None
    return (f"--repeats {repeats} is not a multiple of {cycle}: the provider orders are not "
            f"balanced over the run (benchlib.round_order)")
