"""Which inputs break the lazy reference, and does its guard catch every such row?

The arithmetic of ``Tile.lazy_reference`` (docs/design.md#lazy-reference, docs/perf-notes.md
v36-v37) emulated in numpy float32, row by row as the causal 160-key kernel does it, to see which inputs break the lazy
reference and whether the tile-end guard catches every such row. CPU only;
run from the repo root (tests: tools/tests/test_lazy_reference_emulation.py).

    python -m tools.lazy_reference_emulation [--keys 2048] [--scales 1,10,30,60,200]

Per scale (q scaled by it: scores ``scale`` times randn's), one head, causal: the rows whose
lazy result is NaN, the rows the guard flags (a running peak of the blocks' P above 2^100, or
a row sum not below 2^100 at the tile's end; the kernel recomputes every warp with such a
row), and the largest output / LSE error of the rows it does not flag. Exits 1 when an
unflagged row is wrong.

What is modelled: 128-row tiles, 160-key blocks visited last to first; the masked blocks with
the exact online softmax; from the first unmasked block on, P = exp2(S * k2 - reference), the
reference moved at the next step by log2 of the previous block's largest bf16 P when that
exceeds 2^8, its reciprocal flushed to zero below 2^-126 (rcp.approx.ftz); P rounded to bf16
for P V; the row sum kept per lane (the four lanes of a quad hold columns 8j + 2l, 8j + 2l + 1).
"""

from __future__ import annotations

import argparse
import sys

import numpy as np

TILE_M, TILE_N = 128, 160
GUARD = 2.0 ** 100
F32 = np.float32


def bf16(x):
    """Round float32 to bfloat16 (nearest even), kept as float32."""
    x = np.asarray(x, dtype=np.float32)
    b = x.view(np.uint32).astype(np.uint64)
    r = (((b + 0x7FFF + ((b >> 16) & 1)) >> 16) << 16).astype(np.uint32).view(np.float32)
    return np.where(np.isnan(x), x, r).astype(np.float32)


def _lane_sums(p, lanes):
    return np.stack([p[:, lanes == lane].sum(1) for lane in range(4)], 1)


def lazy_attention(q, k, v, scale, peak_guard=True):
    """(out, lse, flagged) of one head, causal, q/k/v (S, D) float32 holding bf16 values;
    ``peak_guard=False``: the guard on the row sums alone (v36's lz10)."""
    n_rows, d = q.shape
    k2 = F32(scale * np.log2(np.e))
    lanes = (np.arange(TILE_N) % 8) // 2
    out = np.zeros((n_rows, d), np.float32)
    lse = np.zeros(n_rows, np.float32)
    flagged = np.zeros(n_rows, bool)
    with np.errstate(all="ignore"):
        for r0 in range(0, n_rows, TILE_M):
            rows = np.arange(r0, min(r0 + TILE_M, n_rows))
            n_max = (rows[-1] + TILE_N) // TILE_N
            u_hi = (r0 + 1) // TILE_N  # blocks below it: unmasked for every row of the tile

            def block(b):
                cols = np.arange(b * TILE_N, (b + 1) * TILE_N)
                ok = cols < n_rows
                kb = np.zeros((TILE_N, d), np.float32)
                vb = np.zeros((TILE_N, d), np.float32)
                kb[ok], vb[ok] = k[cols[ok]], v[cols[ok]]
                s = (q[rows] @ kb.T).astype(np.float32)
                s[(cols[None, :] > rows[:, None]) | ~ok[None, :]] = -np.inf
                return s, vb

            o = np.zeros((len(rows), d), np.float32)
            row_max = np.full(len(rows), -np.inf, np.float32)
            row_sum = np.zeros((len(rows), 4), np.float32)
            p_prev = v_prev = None
            for b in range(n_max - 1, u_hi - 1, -1):  # masked blocks: exact online softmax
                s, vb = block(b)
                m_new = np.maximum(row_max, s.max(1))
                m_use = np.where(m_new == -np.inf, F32(0), m_new)
                corr = np.exp2((row_max - m_use) * k2).astype(np.float32)
                p = np.exp2(s * k2 - m_use[:, None] * k2).astype(np.float32)
                if p_prev is not None:
                    o = o + p_prev @ v_prev
                o = o * corr[:, None]
                row_sum = row_sum * corr[:, None] + _lane_sums(p, lanes)
                row_max = m_new
                p_prev, v_prev = bf16(p), vb
            ref = np.where(row_max == -np.inf, F32(0), row_max * k2).astype(np.float32)
            pend = np.ones(len(rows), np.float32)
            peak = np.zeros(len(rows), np.float32)
            for b in range(u_hi - 1, -1, -1):  # unmasked blocks: the lazy reference
                s, vb = block(b)
                o = (o * pend[:, None] + p_prev @ v_prev).astype(np.float32)
                mx = p_prev.max(1)
                peak = np.maximum(peak, mx)
                moved = mx > 256
                ref = np.where(moved, ref + np.log2(mx), ref).astype(np.float32)
                pend = np.where(moved, (1 / mx).astype(np.float32), F32(1))
                pend = np.where(pend < np.finfo(np.float32).tiny, F32(0), pend)
                p = np.exp2(s * k2 - ref[:, None]).astype(np.float32)
                row_sum = row_sum * pend[:, None] + _lane_sums(p, lanes)
                row_max = (ref / k2).astype(np.float32)
                p_prev, v_prev = bf16(p), vb
            o = (o * pend[:, None] + p_prev @ v_prev).astype(np.float32)
            flagged[rows] = ~((row_sum <= GUARD).all(1) & ((peak <= GUARD) | (not peak_guard)))
            total = row_sum.sum(1)
            inv = np.where(total > 0, 1 / total, 0).astype(np.float32)
            out[rows] = o * np.where(np.isinf(inv), F32(0), inv)[:, None]
            lse[rows] = np.where(total > 0, row_max * scale + np.log(total), -np.inf)
    return out, lse, flagged


def reference(q, k, v, scale):
    s = (q.astype(np.float64) @ k.T.astype(np.float64)) * scale
    s[np.triu(np.ones(s.shape, bool), 1)] = -np.inf
    m = s.max(1, keepdims=True)
    p = np.exp(s - m)
    l = p.sum(1, keepdims=True)
    return (p / l) @ v, m[:, 0] + np.log(l[:, 0])


def check(keys: int, scale: float, seed: int = 0, d: int = 128, peak_guard: bool = True):
    """(NaN rows, flagged rows, max output error and max LSE error of the unflagged rows)."""
    rng = np.random.default_rng(seed)
    q, k, v = (bf16(rng.standard_normal((keys, d), dtype=np.float32)) for _ in range(3))
    q = bf16(q * scale)
    sm = 1 / np.sqrt(d)
    out, lse, flagged = lazy_attention(q, k, v, sm, peak_guard)
    ref, lse_ref = reference(q, k, v, sm)
    ok = ~flagged
    err = np.abs(out - ref).max(1)
    lse_err = np.abs(lse - lse_ref)
    return (int(np.isnan(out).any(1).sum()), int(flagged.sum()),
            float(np.nanmax(np.where(ok, err, 0))), float(np.nanmax(np.where(ok, lse_err, 0))))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--keys", type=int, default=2048)
    ap.add_argument("--scales", default="1,10,30,60,200")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--no-peak", action="store_true",
                    help="guard on the row sums alone (misses rows: the reason for the peak)")
    a = ap.parse_args()
    bad = 0
    print(f"{'scale':>6s} {'NaN rows':>9s} {'flagged':>8s} {'err (unflagged)':>16s} {'LSE err':>9s}")
    for scale in (float(x) for x in a.scales.split(",")):
        nan, flagged, err, lse_err = check(a.keys, scale, a.seed, peak_guard=not a.no_peak)
        wrong = err > 0.05 or lse_err > 1e-3 or np.isnan(err)
        bad += wrong
        print(f"{scale:6g} {nan:9d} {flagged:8d} {err:16.3g} {lse_err:9.2g}"
              f"{'  UNFLAGGED WRONG ROWS' if wrong else ''}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
