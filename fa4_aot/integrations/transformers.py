"""``attn_implementation="fa4_aot"`` for Hugging Face transformers (5.x).

    import fa4_aot.integrations.transformers as fa4_hf
    fa4_hf.register()                                   # once; imports transformers here
    model = AutoModelForCausalLM.from_pretrained(name, attn_implementation="fa4_aot",
                                                 dtype=torch.bfloat16, device_map="cuda")

:func:`register` adds :func:`attention_forward` to transformers' ``AttentionInterface`` and
transformers' own ``flash_attention_mask`` to its ``AttentionMaskInterface`` under the same name,
so the model hands the attention function what it hands the built-in flash backends: ``None``
(no padding; causal comes from ``module.is_causal``) or the 2-D padding mask
``(batch, kv_len)`` (1 = token, 0 = padding), sliced to the key length; with a static cache the
mask is narrower than the preallocated K/V buffer (its width is the number of filled slots).

What :func:`attention_forward` does with it (query/key/value arrive (batch, heads, seq, dim);
``.transpose(1, 2)`` gives fa4_aot's (batch, seq, heads, dim) views without a copy):

* no mask, no packing: one dense call, causal bottom-right aligned (decode with a dynamic cache:
  Sq = 1..k queries against all cached keys). With ``position_ids`` and K/V longer than the
  queries, ``seqused_k = position_ids[:, -1] + 1`` (on the device, no sync) cuts a static
  cache's buffer to its filled part; it is never longer than the keys of a dynamic cache, and
  fa4_aot clamps it to the buffer (a full sliding-window buffer).
* a padding mask: each row's tokens are moved to the front of the row (a permutation built on
  the device, :func:`compact_index`), one dense call with ``seqused_q`` / ``seqused_k`` = the
  number of tokens of each row, and the output rows are moved back (padding rows get 0). No
  host sync, so it also runs under CUDA-graph capture / ``torch.compile(mode="reduce-overhead")``
  with a static cache. Causal bottom-right alignment relative to seqused_k is exactly right:
  the queries are the last ``Sq`` columns of the mask, so a row's valid queries are its last
  ``seqused_q`` valid keys (left padding, right padding and holes alike). Outside capture and
  compilation, a mask with no padding (a static cache without padding) is detected with one
  host sync per forward (memoised on the mask tensor, shared by all layers) and runs as one
  dense call instead; on a static cache it takes the whole buffer with ``seqused_k`` = the
  filled length, so its shapes, and so its prepared launch, stay the same from step to step.
* packed sequences (no mask: none was given, or transformers dropped an all-ones one) -> one
  varlen call: ``cu_seq_lens_q/k`` (+ ``max_length_q/k``) kwargs, as transformers'
  ``DataCollatorWithFlattening`` produces them, or batch 1 with ``position_ids`` that are not
  one increasing run (each restart at their minimum starts a document; detected with one host
  sync per forward, not under torch.compile / CUDA-graph capture - pass the cu_seq_lens kwargs
  there). As in transformers' flash backends, packing is read from the position ids alone,
  whatever the cache: the row's tokens are the first rows of K/V, which holds with no cache and
  with a fresh one (dynamic: K/V are the new tokens; static: a buffer whose first slots they
  fill), so the offsets serve both sides (packed positions against a filled cache break that
  rule, here as there). A step against a cache continues one run of positions (decode, a
  chunk) and is not packing.
* ``sliding_window`` w -> ``window_size=(w - 1, 0)`` causal (``(w - 1, w - 1)`` otherwise), as
  transformers' flash backends; ``softcap``, ``scaling``, GQA/MQA, bf16/fp16.

It raises ``NotImplementedError`` naming the feature for what it cannot do: dropout > 0 in
training, a 4-D (arbitrary additive) mask, fp32 inputs, inputs that require grad (fa4_aot is
forward-only), attention sinks (``s_aux``), head dims other than 64/96/128/192/256.
The mask/position -> index conversions below are pure torch (CPU-testable).
"""

from __future__ import annotations

import weakref

import torch

from fa4_aot import prepared as _prepared

NAME = "fa4_aot"
HEAD_DIMS = (64, 96, 128, 192, 256)

__all__ = ["register", "attention_forward", "compact_index", "unpad_info",
           "cu_seqlens_from_position_ids", "is_packed", "window_size"]


# --------------------------------------------------------------------------------------------
# Pure conversions (torch only, any device, no host sync unless said)


def compact_index(mask: torch.Tensor):
    """``mask`` (batch, n), nonzero = token. Returns ``(src, dest, count)``: ``src`` (batch, n)
    int64, the column each compacted slot reads (a row's tokens first, in order, then its
    padding); ``dest`` (batch, n), where each column goes (the inverse permutation); ``count``
    (batch,) int32, the tokens per row. No host sync."""
    m = mask.bool()
    b, n = m.shape
    count = m.sum(-1, dtype=torch.int32)
    rank_tok = m.cumsum(-1) - 1
    rank_pad = (~m).cumsum(-1) - 1 + count[:, None].to(rank_tok.dtype)
    dest = torch.where(m, rank_tok, rank_pad)
    cols = torch.arange(n, device=m.device, dtype=dest.dtype).expand(b, n)
    src = torch.empty_like(dest).scatter_(1, dest, cols)
    return src, dest, count


def gather_rows(x: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """x (batch, n, ...) -> x[b, index[b, j], ...] (batch, index.shape[1], ...)."""
    rows = torch.arange(x.shape[0], device=x.device)[:, None]
    return x[rows, index]


def unpad_info(mask: torch.Tensor):
    """FlashAttention-2's unpad data of a 2-D padding mask: ``(indices, cu_seqlens, max_seqlen)``
    - flat indices of the tokens (int64), int32 (batch + 1) offsets, and the longest row as a
    Python int (one host sync)."""
    m = mask.bool()
    lens = m.sum(-1, dtype=torch.int32)
    indices = torch.nonzero(m.flatten(), as_tuple=False).flatten()
    cu = torch.nn.functional.pad(torch.cumsum(lens, 0, dtype=torch.int32), (1, 0))
    return indices, cu, int(lens.max().item()) if lens.numel() else 0


def cu_seqlens_from_position_ids(position_ids: torch.Tensor):
    """Packed sequences in one row: ``position_ids`` (1, n) or (n,) restarting at its minimum
    (0, or e.g. padding_idx + 1) at each document start. Returns (int32 cu_seqlens
    (docs + 1,), max_seqlen as a Python int (one host sync))."""
    p = position_ids.reshape(-1)
    starts = (p == p.min()).nonzero().view(-1).to(torch.int32)
    if starts.numel() == 0 or int(starts[0]) != 0:  # the first token always starts a document
        starts = torch.cat([torch.zeros(1, dtype=torch.int32, device=p.device), starts])
    cu = torch.cat([starts, torch.tensor([p.numel()], dtype=torch.int32, device=p.device)])
    return cu, int(cu.diff().max().item())


def is_packed(position_ids: torch.Tensor | None, batch: int) -> bool:
    """True when batch == 1 and ``position_ids`` is not one increasing run (transformers'
    ``_is_packed_sequence``). One host sync."""
    if position_ids is None or batch != 1 or position_ids.dim() != 2 or position_ids.shape[0] != 1:
        return False
    p = position_ids[0]
    ref = torch.arange(p.numel(), device=p.device, dtype=p.dtype) + p.min()
    return bool((ref != p).any().item())


def window_size(sliding_window, causal: bool, key_len: int):
    """transformers' ``sliding_window`` (window length, the token itself included) as FA's
    inclusive (left, right); (-1, -1) when there is none or it covers every key."""
    if sliding_window is None or sliding_window <= 0 or key_len <= sliding_window:
        return (-1, -1)
    return (int(sliding_window) - 1, 0 if causal else int(sliding_window) - 1)


# --------------------------------------------------------------------------------------------
# Host-side memo (one sync per forward, not per layer: every layer gets the same mask tensor)

_memo: dict = {}


def _version(t):
    """The tensor's in-place version; inference tensors have none (transformers builds a new
    mask / position tensor each forward, so identity is the key there)."""
    return None if t.is_inference() else t._version


def _memo_get(kind, t, fn):
    ent = _memo.get(kind)
    if ent is not None and ent[0]() is t and ent[1] == _version(t):
        return ent[2]
    val = fn(t)
    _memo[kind] = (weakref.ref(t), _version(t), val)
    return val


def _tracing() -> bool:
    """torch.compile tracing or CUDA-graph capture: no host syncs, no data-dependent branches."""
    return torch.compiler.is_compiling() or (torch.cuda.is_initialized()
                                             and _prepared._capturing())


def _unsupported(feature: str, hint: str = ""):
    return NotImplementedError(f'attn_implementation="{NAME}" does not support {feature}'
                               + (f"; {hint}" if hint else "") + ".")


def _call(q, k, v, window_size=(-1, -1), **kw):
    import fa4_aot  # the module attribute, so tests can substitute a reference
    if window_size != (-1, -1):  # without one, fa4_aot's key skips the window's normalisation
        kw["window_size"] = window_size
    return fa4_aot.attention(q, k, v, **kw)


# --------------------------------------------------------------------------------------------
# The attention function


def attention_forward(module, query, key, value, attention_mask, dropout: float = 0.0,
                      scaling: float | None = None, sliding_window: int | None = None,
                      softcap: float | None = None, **kwargs):
    """transformers' attention-interface signature: query (batch, heads, Sq, d), key/value
    (batch, heads_k, Sk, d) -> (attn_output (batch, Sq, heads, d), None). ``kwargs``: the
    model's further keywords (``is_causal``, ``s_aux``, ``position_ids``, ``cu_seq_lens_q/k``,
    ``max_length_q/k``)."""
    is_causal, s_aux = kwargs.get("is_causal"), kwargs.get("s_aux")
    if dropout and dropout > 0 and module.training:
        raise _unsupported(f"attention dropout (p = {dropout}) in training",
                           "call model.eval() or set attention_dropout=0")
    if s_aux is not None:
        raise _unsupported("attention sinks (s_aux)")
    if attention_mask is not None and attention_mask.dim() != 2:
        raise _unsupported(f"a {attention_mask.dim()}-D (arbitrary additive) attention mask",
                           "it takes no mask, a 2-D padding mask, position_ids or cu_seq_lens_q/k")
    if query.dtype not in (torch.bfloat16, torch.float16):
        raise _unsupported(f"{query.dtype} inputs", "load the model with dtype=torch.bfloat16 "
                           "or torch.float16")
    if torch.is_grad_enabled() and (query.requires_grad or key.requires_grad
                                    or value.requires_grad):
        raise _unsupported("training / inputs that require grad (it is forward-only)",
                           "run under torch.no_grad() or torch.inference_mode()")
    if any(n == 0 for n in query.shape):
        raise ValueError(f'attn_implementation="{NAME}": query has a zero dimension {tuple(query.shape)}')
    d, dv = query.shape[-1], value.shape[-1]
    if d not in HEAD_DIMS:
        raise _unsupported(f"head_dim {d}", f"head dims {HEAD_DIMS}")
    if dv != d:  # e.g. MLA: pad V up to the query head dim and crop the output (as FA2's backend)
        if dv > d:
            raise _unsupported(f"a value head dim ({dv}) larger than the query head dim ({d})")
        value = torch.nn.functional.pad(value, [0, d - dv])

    causal = bool(is_causal if is_causal is not None else getattr(module, "is_causal", True))
    q = query.transpose(1, 2)  # (b, Sq, h, d) views, last dim contiguous
    k = key.transpose(1, 2)
    v = value.transpose(1, 2)
    b, sq = q.shape[0], q.shape[1]
    kw = dict(causal=causal, softmax_scale=float(scaling) if scaling is not None else None,
              softcap=float(softcap) if softcap else 0.0)

    cu_q, cu_k = kwargs.get("cu_seq_lens_q"), kwargs.get("cu_seq_lens_k")
    position_ids = kwargs.get("position_ids")
    sk = k.shape[1]
    if attention_mask is not None:
        out = _masked(q, k, v, attention_mask, sliding_window, kw)
    elif cu_q is not None and cu_k is not None:
        out = _varlen(q, k, v, cu_q, cu_k, kwargs.get("max_length_q"),
                      kwargs.get("max_length_k"), sliding_window, kw)
    elif (sq > 1 and b == 1 and position_ids is not None and position_ids.shape == (1, sq)
          and (sk == sq or (causal and sk > sq))  # self-attention; sk > sq: a static buffer
          and not _tracing()
          and _memo_get("packed", position_ids, lambda p: is_packed(p, 1))):
        # the documents are the row's tokens, the first sq rows of K/V: one set of offsets
        cu, mx = _memo_get("posids", position_ids, cu_seqlens_from_position_ids)
        out = _varlen(q, k, v, cu, cu, mx, mx, sliding_window, kw)
    else:
        used_k = None
        if (sq < sk and position_ids is not None and position_ids.dim() == 2
                and position_ids.shape[-1] == sq):
            # static cache: the buffer is longer than what is filled; the last query's position
            # + 1 is the filled length (no padding here: padding comes with a mask; one run of
            # positions: packed rows take the branch above, outside tracing)
            def used(p):
                return (p[:, -1] + 1).to(torch.int32).expand(b).contiguous()
            used_k = used(position_ids) if _tracing() else _memo_get(("used", b), position_ids, used)
        out = _call(q, k, v, window_size=window_size(sliding_window, causal, sk),
                    seqused_k=used_k, **kw)
    if dv != d:
        out = out[..., :dv]
    return out, None


def _masked(q, k, v, mask, sliding_window, kw):
    """2-D padding mask (batch, W): W == Sk, or W < Sk with a static cache (only the first W
    slots of the buffer are filled)."""
    sq = q.shape[1]
    w = mask.shape[1]
    full_k, full_v = k, v
    if w < k.shape[1]:
        k, v = k[:, :w], v[:, :w]
    elif w > k.shape[1]:
        mask = mask[:, -k.shape[1]:]
        w = k.shape[1]
    if sq > w:
        raise ValueError(f'attn_implementation="{NAME}": {sq} queries but a {w}-key mask')
    win = window_size(sliding_window, kw["causal"], w)
    if not _tracing() and _memo_get("full", mask, lambda m: bool(m.bool().all().item())):
        if w == full_k.shape[1]:
            return _call(q, k, v, window_size=win, **kw)
        # a static cache with no padding: the whole buffer with seqused_k = w keeps the call's
        # shapes (and its prepared launch) the same from one decode step to the next
        used = _memo_get("filled", mask, lambda m: torch.full(
            (m.shape[0],), m.shape[1], dtype=torch.int32, device=m.device))
        return _call(q, full_k, full_v, window_size=win, seqused_k=used, **kw)
    src_k, dest_k, count_k = compact_index(mask)
    mq = mask[:, w - sq:]
    if sq == 1:  # decode: nothing to move, the row is valid or not
        count_q, qc, dest_q = mq.sum(-1, dtype=torch.int32), q, None
    elif sq == w:  # prefill: the queries are the keys' tokens
        count_q, qc, dest_q = count_k, gather_rows(q, src_k), dest_k
    else:  # chunked prefill / several new tokens against a cache
        src_q, dest_q, count_q = compact_index(mq)
        qc = gather_rows(q, src_q)
    kc, vc = gather_rows(k, src_k), gather_rows(v, src_k)
    out = _call(qc, kc, vc, window_size=win, seqused_q=count_q, seqused_k=count_k, **kw)
    if dest_q is not None:
        out = gather_rows(out, dest_q)
    keep = mq.bool()[:, :, None, None]
    return torch.where(keep, out, torch.zeros((), dtype=out.dtype, device=out.device))


def _as_int(x):
    if x is None or isinstance(x, int):
        return x
    return int(x.item()) if isinstance(x, torch.Tensor) else int(x)


def _varlen(q, k, v, cu_q, cu_k, max_q, max_k, sliding_window, kw):
    """Packed documents: q (b, S, h, d) with b * S tokens in document order."""
    b, s, h, d = q.shape
    cu_q, cu_k = cu_q.to(torch.int32), cu_k.to(torch.int32)
    if max_q is None:
        max_q = int(cu_q.diff().max().item())
    if max_k is None:
        max_k = int(cu_k.diff().max().item())
    max_q, max_k = _as_int(max_q), _as_int(max_k)
    q3 = q.reshape(b * s, h, d)
    k3 = k.reshape(-1, k.shape[-2], d)
    v3 = v.reshape(-1, v.shape[-2], d)
    out = _call(q3, k3, v3, cu_seqlens_q=cu_q.contiguous(), cu_seqlens_k=cu_k.contiguous(),
                max_seqlen_q=max_q, max_seqlen_k=max_k,
                window_size=window_size(sliding_window, kw["causal"], max_k), **kw)
    return out.view(b, s, h, d)


# --------------------------------------------------------------------------------------------
# Registration


def register(name: str = NAME):
    """Register :func:`attention_forward` and transformers' flash-style mask function (which
    gives ``None`` or the 2-D padding mask) under ``name``; afterwards
    ``attn_implementation=name`` works with ``from_pretrained`` / ``from_config`` /
    ``model.set_attn_implementation``. Idempotent. Returns ``name``."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, flash_attention_mask

    AttentionInterface.register(name, attention_forward)
    AttentionMaskInterface.register(name, flash_attention_mask)
    return name
