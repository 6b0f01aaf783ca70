"""Packed sequences through attn_implementation="fa4_aot" on the CPU, fa4_aot.attention replaced
by the torch reference of test_hf_cpu: every packed form that transformers' flash backends split
into documents must give each document the logits it gets alone. The forms: ``position_ids``
restarting at 0 in one row (no cache, a fresh dynamic cache - the default of a forward - or a
fresh static cache), the ``cu_seq_lens_q/k`` + ``max_length_q/k`` kwargs, and
``DataCollatorWithFlattening``'s output with no mask or an all-ones one. A decode step or a
chunk against a cache (one increasing run of positions) is not packing."""

import pytest
import torch

from fa4_aot.integrations import transformers as hf
from test_hf_cpu import ref_attention

DOCS = (100, 333, 67)
N = sum(DOCS)
TOL = 2e-2  # max |logit difference|; attention across documents moves them by 0.1 to 1


@pytest.fixture(scope="module")
def tf():
    transformers = pytest.importorskip("transformers", reason="transformers is not installed")
    import fa4_aot
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(fa4_aot, "attention", ref_attention)
        hf.register()
        yield transformers


@pytest.fixture(scope="module")
def setup(tf):
    """(model, config, ids (1, N), packed position_ids (1, N), per-document logits (1, N, V))."""
    torch.manual_seed(0)
    cfg = tf.LlamaConfig(vocab_size=128, hidden_size=128, intermediate_size=256,
                         num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                         head_dim=64, max_position_embeddings=1024)
    model = tf.AutoModelForCausalLM.from_config(cfg, attn_implementation="fa4_aot",
                                                dtype=torch.bfloat16).eval()
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(1, 128, (1, N), generator=g)
    pos = torch.cat([torch.arange(n) for n in DOCS])[None]
    with torch.no_grad():
        alone = torch.cat([model(ids[:, s:s + n], use_cache=False).logits
                           for s, n in zip(_starts(), DOCS)], 1)
    return model, cfg, ids, pos, alone


def _starts():
    return [sum(DOCS[:i]) for i in range(len(DOCS))]


def _check(logits, alone):
    errs = [(logits[:, s:s + n] - alone[:, s:s + n]).abs().max().item()
            for s, n in zip(_starts(), DOCS)]
    assert max(errs) < TOL, f"max |logits - per-document logits| per document: {errs}"


@pytest.fixture
def varlen_calls(monkeypatch):
    """The cu_seqlens_q of every varlen call the adapter makes."""
    calls = []
    real = hf._varlen

    def spy(q, k, v, cu_q, *a, **kw):
        calls.append(cu_q.tolist())
        return real(q, k, v, cu_q, *a, **kw)
    monkeypatch.setattr(hf, "_varlen", spy)
    return calls


# --------------------------------------------------------------------------------------------
# (a) position_ids restarting at 0


@pytest.mark.parametrize("use_cache", [None, True, False], ids=["default", "cache", "no_cache"])
def test_position_ids_packing(tf, setup, varlen_calls, use_cache):
    """model(input_ids=ids, position_ids=pos): use_cache is on by default in eval, so the
    forward makes a DynamicCache and the attention sees the fresh cache's K/V."""
    model, _, ids, pos, alone = setup
    kw = {} if use_cache is None else dict(use_cache=use_cache)
    with torch.no_grad():
        out = model(input_ids=ids, position_ids=pos, **kw)
    if use_cache is not False:
        assert isinstance(out.past_key_values, tf.DynamicCache)
        assert out.past_key_values.get_seq_length() == N
    _check(out.logits, alone)
    assert varlen_calls == [[0, 100, 433, 500]] * 2  # one per layer


def test_position_ids_packing_static_cache(tf, setup, varlen_calls):
    """A fresh static cache: K/V are the whole buffer (longer than the queries), the row's
    tokens its first N slots."""
    model, cfg, ids, pos, alone = setup
    cache = tf.StaticCache(config=cfg, max_cache_len=N + 24)
    with torch.no_grad():
        out = model(input_ids=ids, position_ids=pos, past_key_values=cache)
    _check(out.logits, alone)
    assert varlen_calls == [[0, 100, 433, 500]] * 2


def test_position_ids_packing_all_ones_mask(tf, setup):
    """An all-ones mask is no padding: transformers' flash mask function drops it."""
    model, _, ids, pos, alone = setup
    for use_cache in (True, False):
        with torch.no_grad():
            out = model(input_ids=ids, position_ids=pos, attention_mask=torch.ones_like(ids),
                        use_cache=use_cache)
        _check(out.logits, alone)


# --------------------------------------------------------------------------------------------
# (b) cu_seq_lens_q/k + max_length_q/k


@pytest.mark.parametrize("with_pos", [True, False], ids=["position_ids", "no_position_ids"])
@pytest.mark.parametrize("use_cache", [True, False], ids=["cache", "no_cache"])
def test_cu_seq_lens_kwargs(setup, varlen_calls, use_cache, with_pos):
    """Without position_ids the model numbers the row 0..N-1 (one run): only the kwargs say
    where the documents are (the rotary positions then differ, so only the first document is
    compared)."""
    model, _, ids, pos, alone = setup
    cu = torch.tensor([0] + [s + n for s, n in zip(_starts(), DOCS)], dtype=torch.int32)
    kw = dict(cu_seq_lens_q=cu, cu_seq_lens_k=cu, max_length_q=max(DOCS),
              max_length_k=max(DOCS))
    if with_pos:
        kw["position_ids"] = pos
    with torch.no_grad():
        out = model(input_ids=ids, use_cache=use_cache, **kw)
    if with_pos:
        _check(out.logits, alone)
    else:
        assert (out.logits[:, :DOCS[0]] - alone[:, :DOCS[0]]).abs().max() < TOL
    assert varlen_calls == [[0, 100, 433, 500]] * 2


def test_cu_seq_lens_kwargs_static_cache(tf, setup):
    model, cfg, ids, pos, alone = setup
    cu = torch.tensor([0, 100, 433, 500], dtype=torch.int32)
    with torch.no_grad():
        out = model(input_ids=ids, position_ids=pos, cu_seq_lens_q=cu, cu_seq_lens_k=cu,
                    max_length_q=333, max_length_k=333,
                    past_key_values=tf.StaticCache(config=cfg, max_cache_len=N + 24))
    _check(out.logits, alone)


# --------------------------------------------------------------------------------------------
# (c) DataCollatorWithFlattening (padding-free collation)


@pytest.mark.parametrize("mask", [False, True], ids=["no_mask", "ones_mask"])
@pytest.mark.parametrize("flash_kwargs", [False, True], ids=["position_ids", "cu_seq_lens"])
@pytest.mark.parametrize("use_cache", [True, False], ids=["cache", "no_cache"])
def test_data_collator_with_flattening(tf, setup, varlen_calls, flash_kwargs, mask, use_cache):
    model, _, ids, _, alone = setup
    feats = [{"input_ids": ids[0, s:s + n].tolist()} for s, n in zip(_starts(), DOCS)]
    batch = tf.DataCollatorWithFlattening(return_flash_attn_kwargs=flash_kwargs)(feats)
    assert torch.equal(batch["input_ids"], ids)
    batch.pop("labels")
    if mask:
        batch["attention_mask"] = torch.ones_like(batch["input_ids"])
    with torch.no_grad():
        out = model(**batch, use_cache=use_cache)
    _check(out.logits, alone)
    assert varlen_calls == [[0, 100, 433, 500]] * 2


# --------------------------------------------------------------------------------------------
# not packing: steps against a cache


@pytest.mark.parametrize("cache", ["dynamic", "static"])
def test_steps_against_a_cache_are_not_packing(tf, setup, varlen_calls, cache):
    """A prompt, then one token, then a 3-token chunk, each with the positions that continue
    the cache (one increasing run): dense calls over the cached keys, the logits of one forward
    over the whole sequence."""
    model, cfg, ids, _, _ = setup
    seq = ids[:, :40]
    with torch.no_grad():
        full = model(seq, use_cache=False).logits
        pkv = (tf.DynamicCache(config=cfg) if cache == "dynamic"
               else tf.StaticCache(config=cfg, max_cache_len=64))
        got = []
        for s, e in ((0, 36), (36, 37), (37, 40)):
            out = model(seq[:, s:e], position_ids=torch.arange(s, e)[None], past_key_values=pkv,
                        use_cache=True)
            got.append(out.logits)
    assert (torch.cat(got, 1) - full).abs().max() < TOL
    assert varlen_calls == []
