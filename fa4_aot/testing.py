"""Reference attention and the FlashAttention correctness rule (used by tests and benchmarks).

ref    = attention in fp32 on upcast inputs;
out_pt = the same math in the input dtype.
Pass when max|out - ref| <= 2 * max|out_pt - ref| + 2 * max|(ref + 0.3 - 0.3) - ref|.
NaN never passes. Causal with seqlen_q != seqlen_k is bottom-right aligned; fully masked rows
give output 0 and LSE -inf.
"""

from __future__ import annotations

import math


def attention_ref(q, k, v, causal=False, softmax_scale=None, upcast=True, window_size=(-1, -1),
                  softcap=0.0):
    """q (b, sq, h, d); k, v (b, sk, hk, d). Returns (out (b, sq, h, d), lse (b, h, sq)).
    window_size=(left, right) around the bottom-right diagonal, -1 = unbounded; softcap > 0:
    scores become softcap * tanh(scores / softcap) before the mask."""
    import torch
    dtype = q.dtype
    if upcast:
        q, k, v = q.float(), k.float(), v.float()
    b, sq, h, d = q.shape
    sk, hk = k.shape[1], k.shape[2]
    if h != hk:
        k = k.repeat_interleave(h // hk, dim=2)
        v = v.repeat_interleave(h // hk, dim=2)
    scale = softmax_scale if softmax_scale is not None else 1.0 / math.sqrt(d)
    s = torch.einsum("bqhd,bkhd->bhqk", q * scale, k)
    if softcap > 0:
        s = softcap * torch.tanh(s / softcap)
    row = torch.arange(sq, device=q.device).view(-1, 1)
    col = torch.arange(sk, device=q.device).view(1, -1)
    left, right = window_size
    if causal:
        right = 0
    if right >= 0:
        s = s.masked_fill(col > row + (sk - sq) + right, float("-inf"))
    if left >= 0:
        s = s.masked_fill(col < row + (sk - sq) - left, float("-inf"))
    lse = torch.logsumexp(s.float(), dim=-1)
    p = torch.softmax(s, dim=-1)
    p = torch.nan_to_num(p, nan=0.0)  # fully masked rows -> 0
    out = torch.einsum("bhqk,bkhd->bqhd", p.to(v.dtype), v)
    return out.to(dtype) if not upcast else out, lse


def dequantize(x, descale):
    """An e4m3 (b, s, heads, d) tensor times its fp32 (b, heads_k) descale (query heads share
    their KV head's), in fp32."""
    b, _, hx, _ = x.shape
    per = descale.repeat_interleave(hx // descale.shape[1], dim=1)
    return x.float() * per.reshape(b, 1, hx, 1)


def fp8_attention_ref(q8, k8, v8, q_descale, k_descale, v_descale, causal=False,
                      softmax_scale=None):
    """FA3's FP8 forward emulated (an ``out_pt`` of FP8 prefill checks): scores of the
    dequantized q and k in fp32, P = exp(S - rowmax) rounded to e4m3, O = P8 @ v_dequantized /
    rowsum of the unrounded P, rounded to bf16 as the kernels' output is. Returns (out
    (b, sq, h, d) bf16, lse fp32)."""
    import torch
    q, k, v = (dequantize(x, ds) for x, ds in ((q8, q_descale), (k8, k_descale),
                                               (v8, v_descale)))
    b, sq, h, d = q.shape
    sk, hk = k.shape[1], k.shape[2]
    k = k.repeat_interleave(h // hk, dim=2)
    v = v.repeat_interleave(h // hk, dim=2)
    scale = softmax_scale if softmax_scale is not None else 1.0 / math.sqrt(d)
    s = torch.einsum("bqhd,bkhd->bhqk", q * scale, k)
    if causal:
        row = torch.arange(sq, device=q.device).view(-1, 1)
        col = torch.arange(sk, device=q.device).view(1, -1)
        s = s.masked_fill(col > row + (sk - sq), float("-inf"))
    m = s.amax(-1, keepdim=True).clamp_min(-3e38)
    p = torch.exp(s - m)
    total = p.sum(-1, keepdim=True)
    p8 = p.to(torch.float8_e4m3fn).float()
    out = torch.einsum("bhqk,bkhd->bqhd", p8, v) / total.transpose(1, 2).clamp_min(1e-30)
    return out.bfloat16(), (m + total.log()).squeeze(-1)


def fp8_references(q, k8, v8, descales, emulate=False, **mask):
    """(ref, [lower-precision outputs], lse ref) of an FP8 call by FA3's convention: ``ref``
    the fp32 attention of the dequantized inputs (e4m3 * descale; a bf16 q as it is); the
    lower-precision outputs the bf16 attention of the dequantized inputs and, with
    ``emulate`` (the FP8 prefill kernels: full or causal), FA3's FP8 forward emulated
    (:func:`fp8_attention_ref`) on e4m3 q, or on a bf16 q quantized as the runtime quantizes
    it (:func:`fa4_aot.buffers.quantized_q`). Check with :func:`check_close_lower`."""
    import torch
    qd, kd, vd = descales
    qf = dequantize(q, qd) if q.dtype == torch.float8_e4m3fn else q.float()
    kf, vf = dequantize(k8, kd), dequantize(v8, vd)
    ref, lse = attention_ref(qf, kf, vf, **mask)
    pts = [attention_ref(qf.bfloat16(), kf.bfloat16(), vf.bfloat16(), upcast=False, **mask)[0]]
    if emulate:
        if q.dtype != torch.float8_e4m3fn:
            from .buffers import quantized_q
            q, qd = quantized_q(q, k8.shape[2])
        pts.append(fp8_attention_ref(q, k8, v8, qd, kd, vd, **mask)[0])
    return ref, pts, lse


def error_and_bound(out, ref, ref_pt):
    """``(max|out - ref|, max|out_pt - ref|, the FA rule's bound)`` (NaN in ``out`` gives a NaN
    error, which no bound passes)."""
    out, ref, ref_pt = out.float(), ref.float(), ref_pt.float()
    err = (out - ref).abs().max().item()
    err_pt = (ref_pt - ref).abs().max().item()
    err_rt = ((ref + 0.3 - 0.3) - ref).abs().max().item()
    return err, err_pt, 2 * err_pt + 2 * err_rt


def check_close(out, ref, ref_pt, what="out"):
    """Assert the FA rule; returns the numbers for reporting."""
    import torch
    if torch.isnan(out).any():
        raise AssertionError(f"{what}: NaN in output")
    err, err_pt, bound = error_and_bound(out, ref, ref_pt)
    if not err <= bound:
        raise AssertionError(f"{what}: max|out-ref| = {err:.3e} > bound {bound:.3e} "
                             f"(max|out_pt-ref| = {err_pt:.3e})")
    return err, bound


def check_close_lower(out, ref, ref_pts, what="out"):
    """The FA rule where more than one lower-precision computation describes the kernel:
    out_pt is whichever of ``ref_pts`` lies farther from ``ref`` (FP8 prefill: FA3's
    emulation, whose fp32 scores are exact, and the bf16 attention of the dequantized inputs,
    whose scores are no more exact than the FP8 tensor cores' accumulation; docs/design.md#fp8).
    Returns (err, bound)."""
    errs = [error_and_bound(out, ref, pt) for pt in ref_pts]
    worst = max(range(len(errs)), key=lambda i: errs[i][2])
    return check_close(out, ref, ref_pts[worst], what)


MOVING_MAX_KINDS = ("randn", "x3", "x5", "x10", "rising", "falling", "outlier")


def moving_max_inputs(kind, head_dim, seqlen, heads, seed=0, device="cuda"):
    """bf16 (q, k, v), each (1, seqlen, heads, head_dim), whose row max moves from key block to
    key block (the kernels visit key blocks last to first): ``randn``; ``xN``: scores x N;
    ``rising``: keys scaled up toward the first keys (the max keeps rising); ``falling``: toward
    the last; ``outlier``: key 5 along the mean of the last 200 queries. For the lazy row max
    (``Tile.lazy_rescale``)."""
    import torch
    g = torch.Generator(device=device).manual_seed(seed)
    q, k, v = (torch.randn(1, seqlen, heads, head_dim, device=device, generator=g)
               for _ in range(3))
    pos = torch.arange(seqlen, device=device).view(1, seqlen, 1, 1) / seqlen
    if kind.startswith("x"):
        q = q * int(kind[1:])
    elif kind == "rising":
        k = k * (1 + 6 * (1 - pos))
    elif kind == "falling":
        k = k * (1 + 6 * pos)
    elif kind == "outlier":
        k[:, 5] = 4 * q[:, -200:].mean(1)
    elif kind != "randn":
        raise ValueError(f"kind must be one of {MOVING_MAX_KINDS}, got {kind!r}")
    return tuple(x.bfloat16() for x in (q, k, v))
