"""Context-parallel attention forward on torch.distributed (issue 18).

Each rank of a process group of ``W`` ranks holds a **zigzag shard** of the sequence: the
(padded) sequence is cut into ``2W`` equal chunks of ``C`` tokens and rank ``r`` holds chunks
``r`` and ``2W-1-r``, concatenated (``shard``/``unshard``). With a causal mask every rank then has
the same amount of work: one early and one late chunk.

:func:`context_parallel_attention` passes the K/V shards round a ring (``W - 1`` steps of
``torch.distributed.batch_isend_irecv``, send to ``r+1``, receive from ``r-1``); on CUDA the P2P
calls are issued on a side stream, so the transfer of the next shard overlaps the attention of
the shard in hand. Each step computes the (q chunk, kv chunk) pairs that the mask leaves visible
-- for causal zigzag: diagonal pairs with ``causal=True`` on equal lengths, fully visible pairs
with ``causal=False``, pairs whose kv chunk lies entirely after the q chunk skipped, grouped
into one call per step (step 0: the local shard against itself, causal; the other steps: both q
chunks against the early kv chunk, or the late q chunk against both kv chunks, full) -- and
merges the partial (out, lse) exactly in fp32: ``lse = logaddexp(lse_acc, lse_i)``,
``out = exp(lse_acc - lse) * out_acc + exp(lse_i - lse) * out_i`` (rows that saw no key keep
output 0 and LSE -inf; no NaN). ``comm="allgather"`` all-gathers K/V once instead (no overlap,
``W`` times the K/V memory: for short contexts or debugging; the ring is the default).

Padding: ``shard`` pads the sequence with zeros at its **end** to ``2W * ceil(S / 2W)`` tokens.
Pass the real length as ``seqlen=S``: query rows at positions ``>= S`` are not computed (their
output is 0 and their LSE -inf) and keys at positions ``>= S`` are cut from every call, so the
output and LSE of the real tokens are exactly those of the unpadded problem (for every mask:
full, causal, window). Real tokens always form a prefix of each local shard and of each chunk,
so the cut is a slice, never a mask.

Window: ``window_size=(left, right)`` (FlashAttention convention on the global sequence; with
``causal`` right is 0) is supported: each pair gets the window shifted by the distance of its
chunks, with the invisible rows / columns sliced off so that the kernel's bottom-right aligned
window expresses it exactly; pairs outside the window are skipped. Softcap is per score and
passes through. Varlen (cu_seqlens) is not supported: ``ValueError``.

The per-pair attention is injectable: ``attn_fn(q, k, v, causal=..., softmax_scale=...,
window_size=(l, r)[, softcap=...]) -> (out, lse)`` with fa4_aot's layouts (lse fp32
(batch, heads, seqlen_q)); the default calls :func:`fa4_aot.attention` with ``return_lse=True``.
``fa4_aot.testing.attention_ref`` has that signature, which lets the CPU tests run the whole
algorithm on gloo.

NCCL: this module sets ``NCCL_NVLS_ENABLE=0`` and ``TORCH_SYMM_MEM_DISABLE_MULTICAST=1`` (when
not set) at import: NVLink multicast must never be used on the lent machines. Import it (or set
them) before the first NCCL collective.
"""

from __future__ import annotations

import math
import os
from typing import NamedTuple

os.environ.setdefault("NCCL_NVLS_ENABLE", "0")
os.environ.setdefault("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1")

__all__ = ["context_parallel_attention", "shard", "unshard", "padded_seqlen", "chunk_size",
           "all_gather_unshard", "merge_partials", "plan_step", "PairCall"]


# ------------------------------------------------------------------------------- sharding
def chunk_size(seqlen: int, world: int) -> int:
    """C = ceil(seqlen / 2W): the length of one of the 2W zigzag chunks."""
    if world < 1:
        raise ValueError(f"world must be >= 1, got {world}")
    if seqlen < 1:
        raise ValueError(f"seqlen must be >= 1, got {seqlen}")
    return -(-seqlen // (2 * world))


def padded_seqlen(seqlen: int, world: int) -> int:
    """2W * ceil(seqlen / 2W): the sequence length after shard()'s zero padding."""
    return 2 * world * chunk_size(seqlen, world)


def shard(x, rank: int, world: int, dim: int = 1):
    """Rank ``rank``'s zigzag shard of ``x`` along ``dim``: chunks ``rank`` and ``2W-1-rank`` of
    the sequence cut into 2W chunks of C = ceil(S / 2W), concatenated (length 2C). The sequence
    is first zero-padded at its end to 2W*C; pass the real S as ``seqlen=`` to
    :func:`context_parallel_attention` and :func:`unshard`."""
    import torch
    if not 0 <= rank < world:
        raise ValueError(f"rank {rank} not in [0, {world})")
    dim = dim % x.dim()
    s = x.shape[dim]
    c = chunk_size(s, world)
    pad = 2 * world * c - s
    if pad:
        shape = list(x.shape)
        shape[dim] = pad
        x = torch.cat([x, x.new_zeros(shape)], dim=dim)
    return torch.cat([x.narrow(dim, rank * c, c), x.narrow(dim, (2 * world - 1 - rank) * c, c)],
                     dim=dim).contiguous()


def unshard(shards, dim: int = 1, seqlen: int | None = None):
    """Inverse of :func:`shard`: ``shards`` = the W shards in rank order (list, or a tensor whose
    first dim is the rank); returns the sequence in its original order, the padding removed
    (``seqlen`` = the real length; None keeps all 2W*C positions)."""
    import torch
    shards = list(shards)
    world = len(shards)
    dim = dim % shards[0].dim()
    two_c = shards[0].shape[dim]
    if two_c % 2:
        raise ValueError(f"zigzag shards have an even length along dim {dim}, got {two_c}")
    c = two_c // 2
    chunks = [None] * (2 * world)
    for r, t in enumerate(shards):
        if t.shape != shards[0].shape:
            raise ValueError(f"shard {r} has shape {tuple(t.shape)}, shard 0 {tuple(shards[0].shape)}")
        chunks[r] = t.narrow(dim, 0, c)
        chunks[2 * world - 1 - r] = t.narrow(dim, c, c)
    full = torch.cat(chunks, dim=dim)
    if seqlen is not None:
        if not 0 < seqlen <= full.shape[dim]:
            raise ValueError(f"seqlen {seqlen} not in [1, {full.shape[dim]}]")
        full = full.narrow(dim, 0, seqlen)
    return full


def all_gather_unshard(x, group=None, dim: int = 1, seqlen: int | None = None):
    """All-gather every rank's zigzag shard ``x`` and :func:`unshard` them (tests, benchmarks)."""
    import torch
    import torch.distributed as dist
    world = dist.get_world_size(group)
    x = x.contiguous()
    parts = [torch.empty_like(x) for _ in range(world)]
    dist.all_gather(parts, x, group=group)
    return unshard(parts, dim=dim, seqlen=seqlen)


# ------------------------------------------------------------------------------- merging
def merge_partials(outs, lses):
    """Exact merge of partial attentions over disjoint key sets: ``lse = logsumexp_i lse_i``,
    ``out = sum_i exp(lse_i - lse) * out_i`` in fp32. outs: (B, S, H, D) each, lses fp32
    (B, H, S) each. Rows where every lse_i is -inf give output 0 and LSE -inf.
    Returns (out fp32, lse fp32)."""
    import torch
    lse = torch.logsumexp(torch.stack([l.float() for l in lses]), dim=0)
    safe = lse.masked_fill(torch.isinf(lse), 0.0)
    out = None
    for o, l in zip(outs, lses):
        w = torch.exp(l.float() - safe).transpose(1, 2).unsqueeze(-1)  # (B, S, H, 1)
        out = o.float() * w if out is None else out.add_(o.float() * w)
    return out, lse


def _merge_into(acc_o, acc_l, o, l):
    """In place: (acc_o, acc_l) := merge((acc_o, acc_l), (o, l)). acc_o fp32 (B, n, H, D),
    acc_l fp32 (B, H, n) (views allowed); o any float dtype, l fp32."""
    import torch
    l = l.float()
    new = torch.logaddexp(acc_l, l)
    safe = new.masked_fill(torch.isinf(new), 0.0)  # -inf rows: both weights exp(-inf) = 0
    w_old = torch.exp(acc_l - safe).transpose(1, 2).unsqueeze(-1)
    w_new = torch.exp(l - safe).transpose(1, 2).unsqueeze(-1)
    acc_o.mul_(w_old).addcmul_(o.float() if o.dtype != acc_o.dtype else o, w_new)
    acc_l.copy_(new)


# ------------------------------------------------------------------------------- planning
class PairCall(NamedTuple):
    """One attention call of a ring step, in local coordinates: rows [q0, q1) of the local q
    shard against rows [k0, k1) of the kv shard in hand, with ``causal`` and ``window``
    ((left, right) for the kernel, bottom-right aligned on the sliced block; (-1, -1) = none)."""
    q0: int
    q1: int
    k0: int
    k1: int
    causal: bool
    window: tuple


def _real(chunk: int, c: int, seqlen: int) -> int:
    return max(0, min(c, seqlen - chunk * c))


def _band(causal, window_size):
    """Global visibility band of (key - query): (lo, hi), None = unbounded."""
    left, right = window_size
    lo = -left if left >= 0 else None
    hi = 0 if causal else (right if right >= 0 else None)
    return lo, hi


def _pair_call(qc, kc, c, seqlen, lo, hi, qoff, koff):
    """The call for q chunk ``qc`` against kv chunk ``kc`` (global chunk indices, C tokens each,
    placed at local offsets qoff / koff), or None when nothing of it is visible. Rows and
    columns that see nothing (padding, outside the band) are sliced off; the slicing is chosen
    so that the kernel's bottom-right aligned window (left = c - lo, right = hi - c with
    c = k_end - q_end) is exactly the band."""
    rq, rk = _real(qc, c, seqlen), _real(kc, c, seqlen)
    off = (qc - kc) * c  # key - query = j - i - off  (local i, j in their chunks)
    lo = None if lo is None else lo + off
    hi = None if hi is None else hi + off
    kend = rk if hi is None else min(rk, rq + hi)
    qend = rq if lo is None else min(rq, kend - lo)
    q0 = 0 if hi is None else max(0, -hi)
    k0 = 0 if lo is None else max(0, lo)
    if qend - q0 <= 0 or kend - k0 <= 0:
        return None
    sq, sk = qend - q0, kend - k0
    cc = kend - qend
    left = -1 if lo is None else cc - lo
    right = -1 if hi is None else hi - cc
    assert left >= -1 and right >= -1 and (lo is None or left >= 0) and (hi is None or right >= 0)
    if left >= sk - 1:
        left = -1  # never binds on this block
    if right >= sq - 1:
        right = -1
    if (left, right) == (-1, 0):
        causal, window = True, (-1, -1)
    else:
        causal, window = False, (left, right)
    return PairCall(qoff + q0, qoff + qend, koff + k0, koff + kend, causal, window)


def _prefix(chunks, c, seqlen):
    """Real (unpadded) length of a local buffer made of ``chunks``: always a prefix."""
    n = 0
    for ch in chunks:
        r = _real(ch, c, seqlen)
        n += r
        if r < c:
            break
    return n


def plan_step(rank: int, src: int, world: int, c: int, seqlen: int | None = None,
              causal: bool = False, window_size=(-1, -1), group_pairs: bool = True):
    """The calls rank ``rank`` makes with the kv shard of rank ``src`` (zigzag, chunk size c,
    real length ``seqlen``, default 2*world*c). Pairs are full, diagonal (causal on equal
    lengths), windowed or skipped; with ``group_pairs`` (and no window) the pairs of a step are
    grouped into one call where their masks allow."""
    seqlen = 2 * world * c if seqlen is None else seqlen
    qch = (rank, 2 * world - 1 - rank)
    kch = (src, 2 * world - 1 - src)
    lo, hi = _band(causal, window_size)
    pairs = {(a, b): _pair_call(qch[a], kch[b], c, seqlen, lo, hi, a * c, b * c)
             for a in (0, 1) for b in (0, 1)}
    if not group_pairs or lo is not None or (hi is not None and hi != 0):
        return [p for p in pairs.values() if p is not None]
    # no window: each pair is full, causal diagonal or skipped, judged without the padding
    # (the grouped call then cuts the padding off as a prefix of the local buffers)
    kind = {}
    for (a, b) in pairs:  # hi is None (full) or 0 (causal) here
        qc, kc = qch[a], kch[b]
        kind[a, b] = ("full" if hi is None or kc < qc else "diag" if kc == qc else "skip")
    lq, lk = _prefix(qch, c, seqlen), _prefix(kch, c, seqlen)

    def call(q0, q1, k0, k1, causal_):
        q1, k1 = min(q1, lq), min(k1, lk)
        if causal_:  # only the local shard against itself: same chunks, same prefix
            assert (q0, k0) == (0, 0) and q1 == k1
        if q1 <= q0 or k1 <= k0:
            return []
        return [PairCall(q0, q1, k0, k1, causal_, (-1, -1))]

    if all(v == "full" for v in kind.values()):
        return call(0, 2 * c, 0, 2 * c, False)
    if kind == {(0, 0): "diag", (0, 1): "skip", (1, 0): "full", (1, 1): "diag"}:
        return call(0, 2 * c, 0, 2 * c, True)
    if "diag" in kind.values():  # not produced by zigzag; per pair
        return [p for p in pairs.values() if p is not None]
    rows = {a: tuple(b for b in (0, 1) if kind[a, b] == "full") for a in (0, 1)}
    span = {(): None, (0,): (0, c), (1,): (c, 2 * c), (0, 1): (0, 2 * c)}
    if rows[0] == rows[1]:
        return call(0, 2 * c, *span[rows[0]], False) if rows[0] else []
    out = []
    for a in (0, 1):
        if rows[a]:
            out += call(a * c, (a + 1) * c, *span[rows[a]], False)
    return out


# ------------------------------------------------------------------------------- attention
def _fa4_attention(q, k, v, causal=False, softmax_scale=None, window_size=(-1, -1), **kw):
    from . import attention
    if tuple(window_size) != (-1, -1):  # else the default: attention's fast path
        kw["window_size"] = tuple(window_size)
    return attention(q, k, v, causal=causal, softmax_scale=softmax_scale, return_lse=True, **kw)


_SIDE_STREAMS = {}


def _side_stream(device):
    import torch
    key = (device.type, device.index)
    if key not in _SIDE_STREAMS:
        _SIDE_STREAMS[key] = torch.cuda.Stream(device=device)
    return _SIDE_STREAMS[key]


# context_parallel_attention's further keyword arguments and their defaults
CP_OPTIONS = {"softcap": 0.0, "comm": "ring", "attn_fn": None, "group_pairs": True}
_VARLEN_ARGS = ("cu_seqlens_q", "cu_seqlens_k", "max_seqlen_q", "max_seqlen_k")  # refused


def context_parallel_attention(q, k, v, group=None, causal: bool = False,
                               softmax_scale: float | None = None, return_lse: bool = False, *,
                               seqlen: int | None = None, window_size=(-1, -1), **options):
    """Attention forward over a sequence split across the ranks of ``group`` (zigzag shards).

    q: this rank's shard (batch, 2C, heads, head_dim) from :func:`shard`; k, v: (batch, 2C,
    heads_k, head_dim) likewise (GQA: heads a multiple of heads_k). Every rank passes the same
    shapes. ``seqlen``: the real total sequence length (the rest is shard()'s padding at the
    end); None = 2*W*C. ``causal`` / ``window_size`` / ``softcap`` / ``softmax_scale``: as in
    :func:`fa4_aot.attention`, applied to the whole (global) sequence.

    Returns this rank's shard of the output (q's shape and dtype) and, with ``return_lse``, of
    the fp32 LSE (batch, heads, 2C); padded rows have output 0 and LSE -inf.
    ``comm``: ``"ring"`` (default: P2P ring overlapped with compute, memory of two K/V shards)
    or ``"allgather"`` (one all-gather of K/V up front). ``attn_fn``: the per-pair attention (see
    the module docstring). ``group_pairs=False`` makes one call per (q chunk, kv chunk) pair
    (testing). Keyword ``options``: ``softcap``, ``comm``, ``attn_fn``, ``group_pairs``
    (:data:`CP_OPTIONS`); varlen arguments (``cu_seqlens_q`` ...) are refused."""
    import torch
    import torch.distributed as dist

    unknown = sorted(set(options) - set(CP_OPTIONS) - set(_VARLEN_ARGS))
    if unknown:
        raise TypeError(f"context_parallel_attention() got unexpected keyword arguments "
                        f"{unknown}; options: {sorted(CP_OPTIONS)}")
    softcap, comm, attn_fn, group_pairs = (options.get(n, d) for n, d in CP_OPTIONS.items())
    if any(options.get(n) is not None for n in _VARLEN_ARGS):
        raise ValueError("context_parallel_attention does not support varlen (cu_seqlens / "
                         "max_seqlen): pass batched (batch, seqlen, heads, head_dim) shards")
    if comm not in ("ring", "allgather"):
        raise ValueError(f"comm must be 'ring' or 'allgather', got {comm!r}")
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, torch.Tensor) or t.dim() != 4:
            raise ValueError(f"{name} must be a 4-d tensor (batch, 2C, heads, head_dim), got "
                             f"{getattr(t, 'shape', type(t).__name__)}")
    if k.shape != v.shape or k.shape[0] != q.shape[0] or k.shape[1] != q.shape[1] \
            or k.shape[3] != q.shape[3]:
        raise ValueError(f"k and v must be (batch, 2C, heads_k, head_dim) with q's batch, 2C and "
                         f"head_dim; got q {tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)}")
    if q.shape[1] % 2:
        raise ValueError(f"a zigzag shard has an even length (2C), got {q.shape[1]}")
    if (not isinstance(window_size, (tuple, list)) or len(window_size) != 2
            or not all(isinstance(w, int) and w >= -1 for w in window_size)):
        raise ValueError(f"window_size must be a pair of ints >= -1, got {window_size!r}")
    if not dist.is_initialized():
        raise RuntimeError("torch.distributed is not initialized (init_process_group first)")
    world = dist.get_world_size(group)
    rank = dist.get_rank(group)
    c = q.shape[1] // 2
    seqlen = 2 * world * c if seqlen is None else int(seqlen)
    if not 0 < seqlen <= 2 * world * c:
        raise ValueError(f"seqlen {seqlen} not in [1, {2 * world * c}] (2 * world * C)")
    if softmax_scale is None:
        softmax_scale = 1.0 / math.sqrt(q.shape[-1])
    attn = attn_fn or _fa4_attention
    extra = {"softcap": softcap} if softcap else {}
    window_size = tuple(window_size)

    b, _, h, d = q.shape
    acc_o = torch.zeros(b, 2 * c, h, d, dtype=torch.float32, device=q.device)
    acc_l = torch.full((b, h, 2 * c), float("-inf"), dtype=torch.float32, device=q.device)
    fresh = [True]

    def compute(src, kk, vv):
        for p in plan_step(rank, src, world, c, seqlen, causal, window_size, group_pairs):
            o, l = attn(q[:, p.q0:p.q1], kk[:, p.k0:p.k1], vv[:, p.k0:p.k1], causal=p.causal,
                        softmax_scale=softmax_scale, window_size=p.window, **extra)
            if fresh[0] and (p.q0, p.q1) == (0, 2 * c):
                acc_o.copy_(o)
                acc_l.copy_(l)
            else:
                _merge_into(acc_o[:, p.q0:p.q1], acc_l[:, :, p.q0:p.q1], o, l)
            fresh[0] = False

    k, v = k.contiguous(), v.contiguous()
    if comm == "allgather" and world > 1:
        ks = [torch.empty_like(k) for _ in range(world)]
        vs = [torch.empty_like(v) for _ in range(world)]
        dist.all_gather(ks, k, group=group)
        dist.all_gather(vs, v, group=group)
        for step in range(world):
            src = (rank - step) % world
            compute(src, ks[src], vs[src])
    else:
        cuda = q.device.type == "cuda"
        side = _side_stream(q.device) if cuda and world > 1 else None
        nxt_rank = dist.get_global_rank(group, (rank + 1) % world) if group is not None \
            else (rank + 1) % world
        prv_rank = dist.get_global_rank(group, (rank - 1) % world) if group is not None \
            else (rank - 1) % world
        bufs = [(torch.empty_like(k), torch.empty_like(v)) for _ in range(min(2, world - 1))]
        cur = (k, v)
        for step in range(world):
            src = (rank - step) % world
            reqs = None
            if step < world - 1:
                nxt = bufs[step % 2]
                ops = [dist.P2POp(dist.isend, cur[0], nxt_rank, group, tag=0),
                       dist.P2POp(dist.irecv, nxt[0], prv_rank, group, tag=0),
                       dist.P2POp(dist.isend, cur[1], nxt_rank, group, tag=1),
                       dist.P2POp(dist.irecv, nxt[1], prv_rank, group, tag=1)]
                if side is not None:
                    # the side stream waits for what the compute stream has queued (the shard
                    # to send is ready, the buffer to receive into is no longer read)
                    side.wait_stream(torch.cuda.current_stream(q.device))
                    with torch.cuda.stream(side):
                        reqs = dist.batch_isend_irecv(ops)
                else:
                    reqs = dist.batch_isend_irecv(ops)
            compute(src, *cur)
            if reqs is not None:
                for r in reqs:
                    r.wait()  # on CUDA: the current stream waits for the transfer
                cur = nxt
    out = acc_o.to(q.dtype)
    return (out, acc_l) if return_lse else out
