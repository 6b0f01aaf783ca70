"""Schedule traces (fa4_aot.trace: per output tile the SM, CTA, start and end): arrays,
statistics, the per-SM timeline plot and a synthetic trace for the renderer's tests. No torch
and no GPU; numpy and matplotlib are imported by the functions that need them."""

from __future__ import annotations

from benchlib import pyplot

# A trace is an int64 array (num_tiles, 4): (smid, cta_index, t_start_ns, t_end_ns) per output
# tile, indexed by tile id, from %globaltimer; rows of tiles never run are all zero.
TRACE_COLS = ("smid", "cta", "t_start_ns", "t_end_ns")


def trace_array(a):
    import numpy as np
    a = np.asarray(a)
    if a.ndim != 2 or a.shape[1] != 4:
        raise ValueError(f"trace must have shape (num_tiles, 4), got {a.shape}")
    return a.astype(np.int64, copy=False)


def trace_ran(a):
    """Boolean mask of tiles that ran (any non-zero field; a run tile has t_end > 0)."""
    a = trace_array(a)
    return (a != 0).any(axis=1)


def tile_decode(num_tiles: int, meta: dict | None):
    """Per-tile (m_block, head, batch) arrays, or None when the metadata cannot give them.

    meta may carry explicit per-tile lists ``m_block`` / ``head`` / ``batch`` (e.g. a varlen
    decode done by the capture side); otherwise ``num_m_blocks``, ``heads``, ``batch`` and the
    ``section`` are decoded with fa4_aot.schedule.decode_tile (the kernels' own tile order).
    Without ``section`` it is recomputed with fa4_aot.schedule.choose_section when ``seqlen_k``
    and ``head_dim`` are given."""
    import numpy as np
    meta = meta or {}
    if "m_block" in meta:
        mb = np.asarray(meta["m_block"], dtype=np.int64)
        hd = np.asarray(meta.get("head", np.zeros_like(mb)), dtype=np.int64)
        bt = np.asarray(meta.get("batch_index", np.zeros_like(mb)), dtype=np.int64)
        if len(mb) != num_tiles:
            raise ValueError(f"meta m_block has {len(mb)} entries, trace has {num_tiles} tiles")
        return mb, hd, bt
    try:
        nmb, heads, batch = int(meta["num_m_blocks"]), int(meta["heads"]), int(meta["batch"])
    except (KeyError, TypeError, ValueError):
        return None
    if nmb * heads * batch != num_tiles:
        raise ValueError(f"meta says {nmb} m-blocks x {heads} heads x {batch} batch = "
                         f"{nmb * heads * batch} tiles, trace has {num_tiles}")
    from fa4_aot.schedule import choose_section, decode_tile
    section = meta.get("section")
    if section is None:
        if "seqlen_k" in meta and "head_dim" in meta:
            section = choose_section(heads, batch, int(meta["seqlen_k"]), int(meta["head_dim"]),
                                     int(meta.get("elem_bytes", 2)),
                                     int(meta.get("qhead_per_kvhead", 1)),
                                     bool(meta.get("causal", False)))
        else:
            section = heads * batch  # one section: order is m-block-major over all (h, b)
    mb = np.empty(num_tiles, np.int64)
    hd = np.empty(num_tiles, np.int64)
    bt = np.empty(num_tiles, np.int64)
    for t in range(num_tiles):
        mb[t], hd[t], bt[t] = decode_tile(t, nmb, heads, int(section))
    return mb, hd, bt


def _union_length(starts, ends) -> float:
    total, cur_s, cur_e = 0.0, None, None
    for s, e in sorted(zip(starts, ends)):
        if cur_e is None or s > cur_e:
            if cur_e is not None:
                total += cur_e - cur_s
            cur_s, cur_e = s, e
        else:
            cur_e = max(cur_e, e)
    if cur_e is not None:
        total += cur_e - cur_s
    return total


def trace_stats(a, num_sms: int | None = None) -> dict:
    """Makespan, per-SM busy fraction (union of that SM's tile intervals / makespan; SMs with
    no tile count as 0 when ``num_sms`` is given), idle tail (from the moment the first SM runs
    out of work to the end), tile durations, tiles per CTA."""
    import numpy as np
    a = trace_array(a)
    ran = trace_ran(a)
    n_tiles, n_ran = len(a), int(ran.sum())
    st = {"tiles": n_tiles, "tiles_run": n_ran, "tiles_missing": n_tiles - n_ran}
    if n_ran == 0:
        return st
    r = a[ran]
    t0 = int(r[:, 2].min())
    s_us = (r[:, 2] - t0) / 1e3
    e_us = (r[:, 3] - t0) / 1e3
    makespan = float(e_us.max())
    sms = np.unique(r[:, 0])
    n_sms = max(int(num_sms or 0), int(r[:, 0].max()) + 1)
    busy = np.zeros(n_sms)
    last_end = np.zeros(n_sms)
    for sm in sms:
        m = r[:, 0] == sm
        busy[sm] = _union_length(s_us[m], e_us[m]) / makespan if makespan > 0 else 1.0
        last_end[sm] = e_us[m].max()
    used = busy[sms]
    dur = e_us - s_us
    ctas = np.unique(r[:, 1], return_counts=True)[1]
    first_idle = float(last_end[sms].min())
    st.update({
        "makespan_us": makespan,
        "sms_used": int(len(sms)), "sms": n_sms,
        "busy_mean": float(busy.mean()), "busy_min": float(used.min()),
        "busy_median": float(np.median(used)), "busy_max": float(used.max()),
        "busy_per_sm": [round(float(x), 4) for x in busy],
        "idle_frac": float(1 - busy.mean()),
        "tail_us": makespan - first_idle,
        "tail_frac": (makespan - first_idle) / makespan if makespan > 0 else 0.0,
        "tile_us_min": float(dur.min()), "tile_us_median": float(np.median(dur)),
        "tile_us_max": float(dur.max()),
        "ctas": int(len(ctas)), "tiles_per_cta_min": int(ctas.min()),
        "tiles_per_cta_max": int(ctas.max()),
    })
    return st


def format_trace_stats(st: dict, title: str = "") -> str:
    if st.get("tiles_run", 0) == 0:
        return f"{title}: no tile ran (all {st.get('tiles', 0)} rows are zero)"
    rows = [
        ("tiles run / total", f"{st['tiles_run']} / {st['tiles']}"
         + (f"  ({st['tiles_missing']} never ran!)" if st["tiles_missing"] else "")),
        ("CTAs, tiles per CTA", f"{st['ctas']}, {st['tiles_per_cta_min']}..{st['tiles_per_cta_max']}"),
        ("SMs used / SMs", f"{st['sms_used']} / {st['sms']}"),
        ("makespan", f"{st['makespan_us']:.1f} us"),
        ("SM busy mean (min/median/max)",
         f"{st['busy_mean']:.3f} ({st['busy_min']:.3f} / {st['busy_median']:.3f} / "
         f"{st['busy_max']:.3f})"),
        ("idle SM-time", f"{100 * st['idle_frac']:.1f} %"),
        ("idle tail (first SM idle -> end)", f"{st['tail_us']:.1f} us "
         f"({100 * st['tail_frac']:.1f} % of makespan)"),
        ("tile time min/median/max", f"{st['tile_us_min']:.1f} / {st['tile_us_median']:.1f} / "
         f"{st['tile_us_max']:.1f} us"),
    ]
    w = max(len(k) for k, _ in rows)
    out = [title] if title else []
    out += [f"{k:<{w}}  {v}" for k, v in rows]
    return "\n".join(out)


def assign_lanes(starts, ends, key):
    """Per-tile lane within its SM row so that overlapping tiles (several resident CTAs) do not
    draw over each other: greedy interval colouring per SM. Returns (lane, lanes_per_sm)."""
    import numpy as np
    n = len(starts)
    lane = np.zeros(n, np.int64)
    lanes = {}
    order = np.lexsort((starts, key))
    free_at: dict = {}
    for i in order:
        k = int(key[i])
        fl = free_at.setdefault(k, [])
        for j, t in enumerate(fl):
            if t <= starts[i]:
                lane[i] = j
                fl[j] = ends[i]
                break
        else:
            lane[i] = len(fl)
            fl.append(ends[i])
        lanes[k] = len(fl)
    return lane, lanes


def plot_trace(a, path, meta=None, color_by="auto", title=None, num_sms=None, stats=None):
    """Per-SM timeline PNG: y = SM id, x = us since the first tile start, one bar per tile,
    coloured by m_block (needs metadata), CTA, head, batch or tile order (= schedule order)."""
    import numpy as np
    plt = pyplot()
    from matplotlib.collections import PolyCollection
    meta = meta or {}
    a = trace_array(a)
    ran = trace_ran(a)
    ids = np.nonzero(ran)[0]
    r = a[ran]
    st = stats or trace_stats(a, num_sms or meta.get("num_sms"))
    fig, ax = plt.subplots(figsize=(12, 6.5))
    sched = meta.get("scheduler", "?")
    if title is None:
        title = f"schedule trace — scheduler: {sched}"
        if meta.get("label"):
            title += f" — {meta['label']}"
    if len(r) == 0:
        ax.text(0.5, 0.5, "no tile ran", ha="center", transform=ax.transAxes)
        ax.set_title(title)
        fig.savefig(path, dpi=110)
        plt.close(fig)
        return path
    t0 = r[:, 2].min()
    s = (r[:, 2] - t0) / 1e3
    e = (r[:, 3] - t0) / 1e3
    dec = None
    if color_by in ("auto", "m_block", "head", "batch"):
        try:
            dec = tile_decode(len(a), meta)
        except Exception as ex:  # noqa: BLE001 - fall back to a colouring that needs no meta
            print(f"trace: cannot decode tiles ({ex}); colouring by CTA")
            dec = None
    if color_by == "auto":
        color_by = "m_block" if dec is not None else "cta"
    if color_by in ("m_block", "head", "batch") and dec is None:
        print(f"trace: colouring by {color_by} needs metadata (num_m_blocks, heads, batch); "
              "colouring by CTA")
        color_by = "cta"
    if color_by == "m_block":
        cval, cmap_name = dec[0][ids], "viridis"
    elif color_by == "head":
        cval, cmap_name = dec[1][ids], "tab20"
    elif color_by == "batch":
        cval, cmap_name = dec[2][ids], "tab10"
    elif color_by == "order":
        cval, cmap_name = ids, "viridis"
    elif color_by == "cta":
        cval, cmap_name = r[:, 1], "tab20"
    else:
        raise ValueError(f"color_by must be auto, m_block, cta, head, batch or order; "
                         f"got {color_by!r}")
    lane, lanes = assign_lanes(s, e, r[:, 0])
    nl = np.array([lanes[int(k)] for k in r[:, 0]])
    h = 0.9 / nl
    y0 = r[:, 0] - 0.45 + lane * h
    verts = [((x0, b), (x0, b + hh), (x1, b + hh), (x1, b)) for x0, x1, b, hh in zip(s, e, y0, h)]
    coll = PolyCollection(verts, array=cval.astype(float), cmap=cmap_name,
                          edgecolors="face" if len(verts) > 3000 else "black",
                          linewidths=0 if len(verts) > 3000 else 0.15)
    ax.add_collection(coll)
    cb = fig.colorbar(coll, ax=ax, pad=0.01)
    cb.set_label(color_by)
    n_sms = st["sms"]
    ax.set_xlim(0, st["makespan_us"] * 1.01)
    ax.set_ylim(-1, n_sms)
    ax.set_xlabel("µs since first tile start")
    ax.set_ylabel("SM id")
    first_idle = st["makespan_us"] - st["tail_us"]
    ax.axvline(first_idle, color="red", lw=0.8, ls="--")
    ax.text(first_idle, n_sms - 0.5, "first SM idle ", color="red", fontsize=7, va="top",
            ha="right", bbox={"facecolor": "white", "alpha": 0.7, "edgecolor": "none", "pad": 1})
    ax.set_title(title, fontsize=10)
    sub = (f"makespan {st['makespan_us']:.1f} µs, SM busy {100 * st['busy_mean']:.1f} % "
           f"(min {100 * st['busy_min']:.1f} %), idle tail {st['tail_us']:.1f} µs "
           f"({100 * st['tail_frac']:.1f} %), {st['tiles_run']}/{st['tiles']} tiles, "
           f"{st['ctas']} CTAs on {st['sms_used']} SMs")
    fig.text(0.01, 0.01, sub, fontsize=8)
    fig.tight_layout(rect=(0, 0.03, 1, 1))
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


# synthetic_trace's launch and cost model, each overridable by keyword.
SYNTHETIC = {"num_m_blocks": 16, "heads": 16, "batch": 2, "causal": True, "tile_m": 128,
             "tile_n": 128, "seqlen": None, "head_dim": 128, "ctas_per_sm": 1, "section": None,
             "prologue_us": 3.0, "block_us": None, "jitter": 0.05,
             "t0_ns": 1_700_000_000_000_000_000}


def synthetic_trace(scheduler="steal", num_sms=132, seed=0, **model):
    """A plausible trace for testing the renderer: list scheduling of the tiles in the kernels'
    order (fa4_aot.schedule.decode_tile) with a cost model t = prologue + n_blocks * block_us
    (``model``: :data:`SYNTHETIC`'s keys).

    single: one CTA per tile, CTAs dispatched in id order to the SM free first;
    static: ``ctas_per_sm * num_sms`` persistent CTAs, CTA c runs tiles c, c + grid, ...;
    steal:  the same CTAs, each takes the next tile in order when it finishes one.
    Returns (trace int64 (num_tiles, 4), meta dict)."""
    import heapq

    import numpy as np

    from fa4_aot.schedule import decode_tile, num_n_blocks
    unknown = set(model) - set(SYNTHETIC)
    if unknown:
        raise TypeError(f"synthetic_trace: unknown {sorted(unknown)}; known: {sorted(SYNTHETIC)}")
    m = {**SYNTHETIC, **model}
    num_m_blocks, heads, batch, causal = m["num_m_blocks"], m["heads"], m["batch"], m["causal"]
    tile_m, tile_n, seqlen, head_dim = m["tile_m"], m["tile_n"], m["seqlen"], m["head_dim"]
    ctas_per_sm, section, prologue_us = m["ctas_per_sm"], m["section"], m["prologue_us"]
    block_us, jitter, t0_ns = m["block_us"], m["jitter"], m["t0_ns"]
    rng = np.random.default_rng(seed)
    seqlen = seqlen or num_m_blocks * tile_m
    if block_us is None:  # 4*tile_m*tile_n*d FLOP at ~5.3 TFLOP/s per SM (700 TFLOP/s / 132)
        block_us = 4 * tile_m * tile_n * head_dim / 5.3e12 * 1e6
    num_tiles = num_m_blocks * heads * batch
    sec = section or heads * batch
    cost = np.empty(num_tiles)
    for t in range(num_tiles):
        mb, _, _ = decode_tile(t, num_m_blocks, heads, sec)
        nb = num_n_blocks(mb, tile_m, tile_n, seqlen, seqlen, causal)
        cost[t] = (prologue_us + nb * block_us) * (1 + jitter * rng.standard_normal())
    cost = np.maximum(cost, 0.1)
    out = np.zeros((num_tiles, 4), np.int64)
    start_skew = rng.uniform(0, 1.0, size=num_sms * max(ctas_per_sm, 1))  # launch ramp, us
    if scheduler == "single":
        slots = [(float(start_skew[i]), i % num_sms) for i in range(num_sms * ctas_per_sm)]
        heapq.heapify(slots)
        for t in range(num_tiles):
            free, sm = heapq.heappop(slots)
            out[t] = (sm, t, 0, 0)
            out[t, 2], out[t, 3] = int(free * 1e3), int((free + cost[t]) * 1e3)
            heapq.heappush(slots, (free + cost[t] + 0.5, sm))
    elif scheduler in ("static", "steal"):
        grid = min(num_tiles, ctas_per_sm * num_sms)
        sm_of = [c % num_sms for c in range(grid)]
        if scheduler == "static":
            for c in range(grid):
                now = float(start_skew[c])
                for t in range(c, num_tiles, grid):
                    out[t] = (sm_of[c], c, int(now * 1e3), int((now + cost[t]) * 1e3))
                    now += cost[t] + 0.2
        else:
            ready = [(float(start_skew[c]), c) for c in range(grid)]
            heapq.heapify(ready)
            for t in range(num_tiles):
                now, c = heapq.heappop(ready)
                out[t] = (sm_of[c], c, int(now * 1e3), int((now + cost[t]) * 1e3))
                heapq.heappush(ready, (now + cost[t] + 0.3, c))
    else:
        raise ValueError(f"scheduler must be single, static or steal, got {scheduler!r}")
    out[:, 2:] += t0_ns
    meta = {"num_m_blocks": num_m_blocks, "heads": heads, "batch": batch, "section": sec,
            "scheduler": scheduler, "num_sms": num_sms, "causal": causal, "seqlen_q": seqlen,
            "seqlen_k": seqlen, "head_dim": head_dim, "synthetic": True,
            "label": f"synthetic {batch}x{heads}x{seqlen}x{head_dim}"
                     + (" causal" if causal else "")}
    return out, meta
