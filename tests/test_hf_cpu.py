"""fa4_aot.integrations.transformers on the CPU: the mask / position_ids -> index conversions
(pure torch), that ``import fa4_aot`` does not import transformers, and (when transformers is
installed) tiny bf16 models run through the adapter with fa4_aot.attention replaced by a torch
reference of the same FlashAttention semantics (varlen, seqused_q/k, bottom-right causal,
window, softcap), compared with transformers' own sdpa backend."""

import itertools
import math
import subprocess
import sys

import pytest
import torch

from fa4_aot.integrations import transformers as hf

# --------------------------------------------------------------------------------------------
# conversions


def _check_compaction(mask):
    src, dest, count = hf.compact_index(mask)
    m = mask.bool()
    assert count.dtype == torch.int32
    assert count.tolist() == m.sum(-1).tolist()
    for b in range(m.shape[0]):
        toks = m[b].nonzero().flatten().tolist()
        pads = (~m[b]).nonzero().flatten().tolist()
        assert src[b].tolist() == toks + pads
        # dest is the inverse permutation
        assert src[b][dest[b]].tolist() == list(range(m.shape[1]))


@pytest.mark.parametrize("rows", [
    [[1, 1, 1, 0, 0], [1, 1, 1, 1, 1], [1, 0, 0, 0, 0]],   # ragged, right padding
    [[0, 0, 1, 1, 1], [0, 1, 1, 1, 1], [1, 1, 1, 1, 1]],   # left padding
    [[0, 0, 0, 0, 0], [1, 1, 0, 0, 0]],                      # an all-padding row
    [[1]], [[0]],                                            # one token
    [[1, 0, 1, 1, 0, 1]],                                    # holes
])
def test_compact_index(rows):
    _check_compaction(torch.tensor(rows, dtype=torch.int64))
    _check_compaction(torch.tensor(rows, dtype=torch.bool))


def test_gather_rows_roundtrip():
    mask = torch.tensor([[0, 1, 1, 0], [1, 1, 1, 1]])
    x = torch.randn(2, 4, 3, 8)
    src, dest, _ = hf.compact_index(mask)
    assert torch.equal(hf.gather_rows(hf.gather_rows(x, src), dest), x)
    assert torch.equal(hf.gather_rows(x, src)[0, :2], x[0, 1:3])


def test_unpad_info():
    mask = torch.tensor([[1, 1, 0], [0, 1, 1], [0, 0, 0], [1, 1, 1]])
    idx, cu, mx = hf.unpad_info(mask)
    assert idx.tolist() == [0, 1, 4, 5, 9, 10, 11]
    assert cu.dtype == torch.int32 and cu.tolist() == [0, 2, 4, 4, 7]
    assert mx == 3
    idx, cu, mx = hf.unpad_info(torch.tensor([[1]]))
    assert idx.tolist() == [0] and cu.tolist() == [0, 1] and mx == 1


def test_position_ids_to_cu_seqlens():
    p = torch.tensor([[0, 1, 2, 0, 1, 0, 1, 2, 3]])
    cu, mx = hf.cu_seqlens_from_position_ids(p)
    assert cu.dtype == torch.int32 and cu.tolist() == [0, 3, 5, 9] and mx == 4
    assert hf.is_packed(p, 1)
    assert not hf.is_packed(torch.arange(7)[None], 1)
    assert not hf.is_packed(torch.arange(3, 10)[None], 1)   # one run starting after a cache
    assert not hf.is_packed(p, 2)
    cu, mx = hf.cu_seqlens_from_position_ids(torch.tensor([[0]]))
    assert cu.tolist() == [0, 1] and mx == 1
    # RoBERTa-style offset: restarts at the minimum
    cu, _ = hf.cu_seqlens_from_position_ids(torch.tensor([[2, 3, 2, 3, 4]]))
    assert cu.tolist() == [0, 2, 5]


def test_window_size():
    assert hf.window_size(None, True, 100) == (-1, -1)
    assert hf.window_size(8, True, 8) == (-1, -1)       # covers every key
    assert hf.window_size(8, True, 9) == (7, 0)
    assert hf.window_size(8, False, 9) == (7, 7)


def test_import_does_not_import_transformers():
    code = ("import sys, fa4_aot, fa4_aot.integrations, fa4_aot.integrations.transformers; "
            "print('transformers' in sys.modules)")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert r.stdout.strip() == "False"


class _Mod(torch.nn.Module):
    is_causal = True


def test_clear_errors():
    q = torch.zeros(1, 2, 4, 64, dtype=torch.bfloat16)
    m = _Mod()
    with pytest.raises(NotImplementedError, match="4-D"):
        hf.attention_forward(m, q, q, q, torch.zeros(1, 1, 4, 4))
    with pytest.raises(NotImplementedError, match="float32"):
        hf.attention_forward(m, q.float(), q.float(), q.float(), None)
    with pytest.raises(NotImplementedError, match="dropout"):
        m.train()
        hf.attention_forward(m, q, q, q, None, dropout=0.1)
    m.eval()
    with pytest.raises(NotImplementedError, match="require grad"):
        hf.attention_forward(m, q.clone().requires_grad_(), q, q, None)
    with pytest.raises(NotImplementedError, match="head_dim 80"):
        z = torch.zeros(1, 2, 4, 80, dtype=torch.bfloat16)
        hf.attention_forward(m, z, z, z, None)
    with pytest.raises(NotImplementedError, match="sinks"):
        hf.attention_forward(m, q, q, q, None, s_aux=torch.zeros(2))


# --------------------------------------------------------------------------------------------
# A torch reference of fa4_aot.attention's semantics (what the adapter relies on)


def _ref_one(q, k, v, causal, scale, window, softcap):
    s, h, d = q.shape
    t, hk = k.shape[0], k.shape[1]
    out = torch.zeros(s, h, d, dtype=torch.float32)
    if s == 0 or t == 0:
        return out
    k = k.float().repeat_interleave(h // hk, dim=1)
    v = v.float().repeat_interleave(h // hk, dim=1)
    sc = torch.einsum("shd,thd->hst", q.float(), k) * scale
    if softcap:
        sc = softcap * torch.tanh(sc / softcap)
    i = torch.arange(s)[:, None] + t - s
    j = torch.arange(t)[None, :]
    left, right = window
    if causal:
        right = 0
    ok = torch.ones(s, t, dtype=torch.bool)
    if right >= 0:
        ok &= j <= i + right
    if left >= 0:
        ok &= j >= i - left
    sc = sc.masked_fill(~ok, float("-inf"))
    p = torch.softmax(sc, -1).nan_to_num(0.0)
    return torch.einsum("hst,thd->shd", p, v)


def ref_attention(q, k, v, causal=False, softmax_scale=None, window_size=(-1, -1), softcap=0.0,
                  cu_seqlens_q=None, cu_seqlens_k=None, max_seqlen_q=None, max_seqlen_k=None,
                  seqused_q=None, seqused_k=None, **_):
    scale = softmax_scale or 1.0 / math.sqrt(q.shape[-1])
    assert q.stride(-1) == 1 and k.stride(-1) == 1
    out = torch.zeros(q.shape, dtype=torch.float32)
    if cu_seqlens_q is not None:
        assert cu_seqlens_q.dtype == torch.int32 and isinstance(max_seqlen_q, int)
        cq, ck = cu_seqlens_q.tolist(), cu_seqlens_k.tolist()
        for i in range(len(cq) - 1):
            assert cq[i + 1] - cq[i] <= max_seqlen_q and ck[i + 1] - ck[i] <= max_seqlen_k
            out[cq[i]:cq[i + 1]] = _ref_one(q[cq[i]:cq[i + 1]], k[ck[i]:ck[i + 1]],
                                            v[ck[i]:ck[i + 1]], causal, scale, window_size,
                                            softcap)
        return out.to(q.dtype)
    for b in range(q.shape[0]):
        sq = q.shape[1] if seqused_q is None else min(int(seqused_q[b]), q.shape[1])
        sk = k.shape[1] if seqused_k is None else min(int(seqused_k[b]), k.shape[1])
        out[b, :sq] = _ref_one(q[b, :sq], k[b, :sk], v[b, :sk], causal, scale, window_size,
                               softcap)
    return out.to(q.dtype)


def test_ref_matches_sdpa():
    torch.manual_seed(0)
    q, k, v = (torch.randn(2, 5, 4, 64) for _ in range(3))
    want = torch.nn.functional.scaled_dot_product_attention(
        q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True).transpose(1, 2)
    assert torch.allclose(ref_attention(q, k, v, causal=True), want, atol=1e-5)


# --------------------------------------------------------------------------------------------
# Tiny models through the adapter (needs transformers)


@pytest.fixture
def tf(monkeypatch):
    transformers = pytest.importorskip("transformers", reason="transformers is not installed")
    import fa4_aot
    monkeypatch.setattr(fa4_aot, "attention", ref_attention)
    hf.register()
    return transformers


def _model(tf, kind, impl):
    torch.manual_seed(0)
    common = dict(vocab_size=128, hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, head_dim=64,
                  max_position_embeddings=256)
    if kind == "llama":
        cfg = tf.LlamaConfig(**common)
    elif kind == "qwen2":
        cfg = tf.Qwen2Config(**common, use_sliding_window=True, sliding_window=4,
                             max_window_layers=1, layer_types=["full_attention", "sliding_attention"])
    else:
        cfg = tf.Gemma2Config(**common, sliding_window=4, attn_logit_softcapping=20.0,
                              final_logit_softcapping=None, query_pre_attn_scalar=64)
    cfg._attn_implementation = impl
    model = tf.AutoModelForCausalLM.from_config(cfg, attn_implementation=impl,
                                                dtype=torch.bfloat16)
    return model.eval()


@pytest.mark.parametrize("kind", ["llama", "qwen2", "gemma2"])
def test_tiny_models_cpu(tf, kind):
    ours, ref = _model(tf, kind, "fa4_aot"), _model(tf, kind, "sdpa")
    ref.load_state_dict(ours.state_dict())
    torch.manual_seed(1)
    ids = torch.randint(1, 128, (3, 9))
    with torch.no_grad():
        for mask in ([[1] * 9, [1] * 6 + [0] * 3, [1] * 2 + [0] * 7],       # right padding
                     [[1] * 9, [0] * 3 + [1] * 6, [0] * 7 + [1] * 2]):      # left padding
            m = torch.tensor(mask)
            a = ours(ids, attention_mask=m).logits
            b = ref(ids, attention_mask=m).logits
            keep = m.bool()
            assert (a - b)[keep].abs().max() < 0.05, kind
        # packed: 3 documents in one row via position_ids
        pos = torch.tensor([[0, 1, 2, 3, 0, 1, 0, 1, 2]])
        a = ours(ids[:1], position_ids=pos).logits
        for s, e in ((0, 4), (4, 6), (6, 9)):
            b = ref(ids[:1, s:e]).logits
            assert (a[:, s:e] - b).abs().max() < 0.05, kind
        # generate: dynamic and static cache, left-padded batch and one without padding (a
        # static cache then runs on the whole buffer with seqused_k)
        padded = torch.tensor([[1] * 9, [0] * 3 + [1] * 6, [0] * 7 + [1] * 2])
        for cache, m in itertools.product(("dynamic", "static"),
                                          (padded, torch.ones_like(padded))):
            kw = dict(max_new_tokens=6, do_sample=False, pad_token_id=0, attention_mask=m)
            if cache == "static":
                kw["cache_implementation"] = "static"
            new = ours.generate(ids, **kw)[:, 9:]
            # A random model's logits are close to uniform, so two correct backends may break a
            # near-tie differently: each token ours picked must be (nearly) the reference's best
            # next token for the same prefix.
            full = torch.cat([ids, new], 1)
            lo = ref(full, attention_mask=torch.cat([m, torch.ones_like(new)], 1)).logits
            lo = lo[:, 8:-1].float()
            chosen = lo.gather(-1, new[..., None])[..., 0]
            assert (lo.max(-1).values - chosen).max() < 0.05, (kind, cache)


def test_bench_anatomy_counts_per_step(tf):
    """bench_hf --anatomy on a tiny model on the CPU: the per-step difference of two profiles."""
    import bench_hf
    model = _model(tf, "llama", "fa4_aot")
    ids = torch.randint(1, 128, (2, 9))
    with torch.no_grad():
        got = bench_hf._anatomy(model, ids, dict(do_sample=False, pad_token_id=0), steps=3)
    assert set(got) == {"syncs", "launches", "gpu_ms"}
    assert got["syncs"] >= 1 and got["launches"] == 0 and got["gpu_ms"] == 0  # CPU: no kernels
