"""attn_implementation="fa4_aot" in transformers on an sm_90 GPU: tiny random-init Llama, Qwen2
(sliding window) and Gemma 2 (softcap + alternating windows) built from configs (no download),
bf16, against the same weights in fp32 (eager). Padded (left and right), packed (position_ids
with and without a cache, cu_seq_lens kwargs) and cached (generate with dynamic and static
cache). The logit error of fa4_aot must be <= 1.1 x that of transformers' own sdpa backend
(bf16; for packed rows sdpa run per document) + 2e-3; generated tokens are compared with
sdpa's (the agreement rate is printed; -s to see it)."""

import copy

import pytest
import torch

transformers = pytest.importorskip("transformers", reason="transformers is not installed")
if not torch.cuda.is_available() or torch.cuda.get_device_capability()[0] != 9:
    pytest.skip("needs a CUDA sm_90 GPU", allow_module_level=True)

from fa4_aot.integrations import transformers as fa4_hf  # noqa: E402

fa4_hf.register()
EPS = 2e-3
VOCAB = 512


def _config(kind, hd):
    heads, kv = (8, 2) if hd == 128 else (8, 8)
    common = dict(vocab_size=VOCAB, hidden_size=heads * hd, intermediate_size=2 * heads * hd,
                  num_hidden_layers=3, num_attention_heads=heads, num_key_value_heads=kv,
                  head_dim=hd, max_position_embeddings=1024)
    if kind == "llama":
        return transformers.LlamaConfig(**common)
    if kind == "qwen2":
        return transformers.Qwen2Config(
            **common, use_sliding_window=True, sliding_window=48, max_window_layers=1,
            layer_types=["full_attention", "sliding_attention", "sliding_attention"])
    return transformers.Gemma2Config(**common, sliding_window=48, attn_logit_softcapping=50.0,
                                     final_logit_softcapping=30.0, query_pre_attn_scalar=hd)


_MODELS = {}


def _models(kind, hd):
    """{impl: model} with one set of weights: fp32 eager, bf16 sdpa, bf16 fa4_aot."""
    key = (kind, hd)
    if key not in _MODELS:
        torch.manual_seed(0)
        cfg = _config(kind, hd)
        base = transformers.AutoModelForCausalLM.from_config(
            copy.deepcopy(cfg), attn_implementation="eager", dtype=torch.float32)
        sd = base.state_dict()
        out = {"fp32": base.cuda().eval()}
        for impl in ("sdpa", "fa4_aot"):
            # a config of its own: from_config sets the implementation on the config it is given
            m = transformers.AutoModelForCausalLM.from_config(copy.deepcopy(cfg),
                                                              attn_implementation=impl)
            m.load_state_dict(sd)
            out[impl] = m.to(device="cuda", dtype=torch.bfloat16).eval()
        _MODELS.clear()
        _MODELS[key] = out
    return _MODELS[key]


def _err(a, ref, keep):
    return (a.float() - ref.float())[keep].abs().mean().item()


CASES = [("llama", 128), ("llama", 64), ("qwen2", 128), ("gemma2", 64), ("gemma2", 128)]


@pytest.mark.parametrize("kind,hd", CASES)
def test_padded(kind, hd):
    ms = _models(kind, hd)
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(1, VOCAB, (4, 200), generator=g).cuda()
    lens = [200, 131, 70, 1]
    for side in ("right", "left"):
        mask = torch.zeros(4, 200, dtype=torch.long)
        for i, n in enumerate(lens):
            if side == "right":
                mask[i, :n] = 1
            else:
                mask[i, 200 - n:] = 1
        mask = mask.cuda()
        keep = mask.bool()
        with torch.no_grad():
            lo = {k: m(ids, attention_mask=mask).logits for k, m in ms.items()}
        e_ours, e_sdpa = _err(lo["fa4_aot"], lo["fp32"], keep), _err(lo["sdpa"], lo["fp32"], keep)
        print(f"\n{kind} hd{hd} padded-{side}: fa4_aot {e_ours:.4f} sdpa {e_sdpa:.4f}")
        assert e_ours <= 1.1 * e_sdpa + EPS, (kind, hd, side, e_ours, e_sdpa)


@pytest.mark.parametrize("kind,hd", CASES)
def test_packed(kind, hd):
    """Documents packed in one row give each document its logits alone. The bound is sdpa run
    per document: sdpa on the packed row separates the documents only without a cache
    (transformers' mask builder reads packing from position_ids only when past_key_values is
    None, and a forward makes a DynamicCache by default), so it is no reference here."""
    ms = _models(kind, hd)
    g = torch.Generator().manual_seed(2)
    docs = [150, 60, 1, 90]
    ids = torch.randint(1, VOCAB, (1, sum(docs)), generator=g).cuda()
    pos = torch.cat([torch.arange(n) for n in docs])[None].cuda()
    cu = torch.tensor([0] + list(torch.tensor(docs).cumsum(0)), dtype=torch.int32).cuda()
    spans = list(zip(cu[:-1].tolist(), cu[1:].tolist()))
    cfg = ms["fa4_aot"].config
    with torch.no_grad():
        # fp32 reference: each document on its own
        ref = torch.cat([ms["fp32"](ids[:, s:e]).logits for s, e in spans], 1)
        sdpa = torch.cat([ms["sdpa"](ids[:, s:e]).logits for s, e in spans], 1)
        ours = {
            "default": ms["fa4_aot"](ids, position_ids=pos).logits,
            "no_cache": ms["fa4_aot"](ids, position_ids=pos, use_cache=False).logits,
            "static": ms["fa4_aot"](ids, position_ids=pos, past_key_values=transformers.StaticCache(
                config=cfg, max_cache_len=sum(docs) + 64)).logits,
            "cu_seq_lens": ms["fa4_aot"](ids, position_ids=pos, cu_seq_lens_q=cu,
                                         cu_seq_lens_k=cu, max_length_q=max(docs),
                                         max_length_k=max(docs)).logits,
        }
    keep = torch.ones(ids.shape, dtype=torch.bool, device="cuda")
    e_sdpa = _err(sdpa, ref, keep)
    errs = {k: _err(x, ref, keep) for k, x in ours.items()}
    print(f"\n{kind} hd{hd} packed: fa4_aot {errs} sdpa per document {e_sdpa:.4f}")
    assert all(e <= 1.1 * e_sdpa + EPS for e in errs.values()), (errs, e_sdpa)


def test_varlen_head_major_views():
    """The adapter's varlen call takes (total, heads, d) views of (1, heads, total, d) tensors
    (token stride d, head stride total * d): the same output as contiguous copies."""
    import fa4_aot
    g = torch.Generator(device="cuda").manual_seed(5)
    cu = torch.tensor([0, 100, 433, 500], dtype=torch.int32, device="cuda")
    q, k, v = (torch.randn(1, h, 500, 128, device="cuda", dtype=torch.bfloat16, generator=g)
               .transpose(1, 2).reshape(500, h, 128) for h in (8, 2, 2))
    kw = dict(causal=True, cu_seqlens_q=cu, cu_seqlens_k=cu, max_seqlen_q=333, max_seqlen_k=333)
    got = fa4_aot.attention(q, k, v, **kw)
    want = fa4_aot.attention(q.contiguous(), k.contiguous(), v.contiguous(), **kw)
    torch.testing.assert_close(got, want)


@pytest.mark.parametrize("cache", ["dynamic", "static"])
@pytest.mark.parametrize("kind,hd", CASES)
def test_generate(kind, hd, cache):
    ms = _models(kind, hd)
    g = torch.Generator().manual_seed(3)
    ids = torch.randint(1, VOCAB, (3, 100), generator=g).cuda()
    mask = torch.ones(3, 100, dtype=torch.long)
    mask[1, :37] = 0   # left padding
    mask[2, :99] = 0   # one token
    mask = mask.cuda()
    kw = dict(max_new_tokens=24, do_sample=False, pad_token_id=0, attention_mask=mask)
    if cache == "static":
        kw["cache_implementation"] = "static"
    with torch.no_grad():
        out = {k: m.generate(ids, **kw)[:, 100:] for k, m in ms.items()}
        # cached logits: score the generated continuation of fp32 with one forward each
        full = torch.cat([ids, out["fp32"]], 1)
        fmask = torch.cat([mask, torch.ones_like(out["fp32"])], 1)
        lo = {k: m(full, attention_mask=fmask).logits[:, 100:] for k, m in ms.items()}
    keep = torch.ones(lo["fp32"].shape[:2], dtype=torch.bool, device="cuda")
    e_ours, e_sdpa = _err(lo["fa4_aot"], lo["fp32"], keep), _err(lo["sdpa"], lo["fp32"], keep)
    both = (out["sdpa"] == out["fp32"]) & (out["fa4_aot"] == out["fp32"])
    agree_fp32 = (out["sdpa"] == out["fp32"])
    same = (out["fa4_aot"] == out["sdpa"])[agree_fp32].float().mean().item() if agree_fp32.any() else 1.0
    print(f"\n{kind} hd{hd} generate-{cache}: logits fa4_aot {e_ours:.4f} sdpa {e_sdpa:.4f}; "
          f"tokens = sdpa where sdpa = fp32: {100 * same:.1f}% ({int(both.sum())} tokens)")
    assert e_ours <= 1.1 * e_sdpa + EPS
    # greedy sequences diverge after the first different token; the first tokens must agree
    first = agree_fp32[:, 0]
    assert torch.equal(out["fa4_aot"][first, 0], out["sdpa"][first, 0])


def test_static_cache_cuda_graph():
    """Static cache decode under torch.compile(mode="reduce-overhead") (CUDA graphs)."""
    ms = _models("llama", 128)
    g = torch.Generator().manual_seed(4)
    ids = torch.randint(1, VOCAB, (2, 64), generator=g).cuda()
    kw = dict(max_new_tokens=16, do_sample=False, pad_token_id=0,
              cache_implementation="static")
    with torch.no_grad():
        want = ms["fa4_aot"].generate(ids, **kw)
        got = ms["fa4_aot"].generate(ids, compile_config=transformers.CompileConfig(
            mode="reduce-overhead", fullgraph=False), **kw)
    agree = (got == want).float().mean().item()
    print(f"\nstatic cache + reduce-overhead: {100 * agree:.1f}% tokens as eager")
    assert agree >= 0.9


def test_errors():
    ms = _models("llama", 64)
    ids = torch.randint(1, VOCAB, (1, 8)).cuda()
    with pytest.raises(NotImplementedError, match="4-D"):
        with torch.no_grad():
            ms["fa4_aot"](ids, attention_mask=torch.ones(1, 1, 8, 8, device="cuda"))
