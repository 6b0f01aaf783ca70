"""GPU tests of the paged KV cache (page_table + seqused_k, FlashAttention conventions); skip
cleanly without an sm_90 GPU."""

import pytest

torch = pytest.importorskip("torch")

import fa4_aot  # noqa: E402
from fa4_aot.testing import attention_ref, check_close  # noqa: E402

HAS_SM90 = torch.cuda.is_available() and torch.cuda.get_device_capability() == (9, 0)
pytestmark = pytest.mark.skipif(
    not HAS_SM90, reason="needs an sm_90 (Hopper) GPU: the shipped sm_90a cubins run only there")


def _paged(k, v, page_size, seed=0):
    """Scatter dense (b, sk, hk, d) k/v into a shuffled page pool. Returns the caches, the
    page table and the gathered contiguous copies (for references)."""
    b, sk, hk, d = k.shape
    pages_per_seq = -(-sk // page_size)
    num_pages = b * pages_per_seq + 3  # a few pages nobody uses
    g = torch.Generator().manual_seed(seed)
    perm = torch.randperm(num_pages, generator=g)[: b * pages_per_seq]
    table = perm.view(b, pages_per_seq).to(torch.int32)
    kc = torch.randn(num_pages, page_size, hk, d, device=k.device, dtype=k.dtype)
    vc = torch.randn_like(kc)
    pad = pages_per_seq * page_size - sk
    kp = torch.nn.functional.pad(k, (0, 0, 0, 0, 0, pad)).view(b, pages_per_seq, page_size, hk, d)
    vp = torch.nn.functional.pad(v, (0, 0, 0, 0, 0, pad)).view(b, pages_per_seq, page_size, hk, d)
    for i in range(b):
        kc[table[i].long()] = kp[i]
        vc[table[i].long()] = vp[i]
    return kc, vc, table.to(k.device)


def _check_rows(out, lse, q, k, v, used, **kw):
    for i, n in enumerate(used):
        if n == 0:
            assert (out[i] == 0).all() and torch.isinf(lse[i]).all()
            continue
        ref, lse_ref = attention_ref(q[i:i + 1], k[i:i + 1, :n], v[i:i + 1, :n], **kw)
        ref_pt, _ = attention_ref(q[i:i + 1], k[i:i + 1, :n], v[i:i + 1, :n], upcast=False, **kw)
        check_close(out[i:i + 1], ref, ref_pt)
        fin = torch.isfinite(lse_ref[0])
        assert (lse[i][fin] - lse_ref[0][fin]).abs().max().item() < 1e-2


@pytest.mark.parametrize("group", [1, 4, 8])
@pytest.mark.parametrize("page_size", [16, 32, 64, 128, 256])
def test_paged_decode_matches_reference(page_size, group):
    b, sq, sk, h, d = 4, 2, 1000, 8, 128
    used = [0, 1, 2 * page_size, 1000]
    q = torch.randn(b, sq, h, d, device="cuda", dtype=torch.bfloat16)
    k = torch.randn(b, sk, h // group, d, device="cuda", dtype=torch.bfloat16)
    v = torch.randn_like(k)
    kc, vc, table = _paged(k, v, page_size)
    seqused = torch.tensor(used, dtype=torch.int32, device="cuda")
    out = torch.full_like(q, float("nan"))
    out, lse = fa4_aot.attention(q, kc, vc, causal=True, return_lse=True, page_table=table,
                                 seqused_k=seqused, out=out, num_splits=2)
    _check_rows(out, lse, q, k, v, used, causal=True)
    # The same data as a contiguous cache: the same kernel family gives the same output.
    dense = fa4_aot.attention(q, k, v, causal=True, seqused_k=seqused, num_splits=2)
    assert torch.equal(torch.nan_to_num(dense[1:]), torch.nan_to_num(out[1:]))


@pytest.mark.parametrize("num_splits", [1, 3, 16])
def test_paged_split_kv(num_splits):
    b, sk, h, hk, d = 3, 5000, 32, 8, 128
    used = [5000, 4096, 17]
    q = torch.randn(b, 1, h, d, device="cuda", dtype=torch.bfloat16)
    k = torch.randn(b, sk, hk, d, device="cuda", dtype=torch.bfloat16)
    v = torch.randn_like(k)
    kc, vc, table = _paged(k, v, 16)
    seqused = torch.tensor(used, dtype=torch.int32, device="cuda")
    out, lse = fa4_aot.attention(q, kc, vc, causal=True, return_lse=True, page_table=table,
                                 seqused_k=seqused, num_splits=num_splits)
    _check_rows(out, lse, q, k, v, used, causal=True)


@pytest.mark.parametrize("ps", [16, 32, 128])
@pytest.mark.parametrize("lens_q,lens_k", [([5, 1, 16, 3], [37, 1, 300, 3]),
                                           ([200, 37, 129], [1000, 37, 700])])  # wide kernels
def test_chunked_prefill_varlen_q_against_paged_kv(lens_q, lens_k, ps):
    # Packed queries (a chunk of new tokens per sequence) against each sequence's cache, causal
    # bottom-right: the chunk is the last len_q tokens of the len_k keys. Pages below the key
    # block take several TMA boxes per block (K and V in one pass with 3+ stages).
    h, hk, d = 16, 4, 128
    b = len(lens_q)
    k = torch.randn(b, max(lens_k), hk, d, device="cuda", dtype=torch.bfloat16)
    v = torch.randn_like(k)
    kc, vc, table = _paged(k, v, ps)
    q = torch.randn(sum(lens_q), h, d, device="cuda", dtype=torch.bfloat16)
    cu_q = torch.tensor([0] + list(torch.tensor(lens_q).cumsum(0)), dtype=torch.int32,
                        device="cuda")
    seqused = torch.tensor(lens_k, dtype=torch.int32, device="cuda")
    out, lse = fa4_aot.attention(q, kc, vc, causal=True, return_lse=True, page_table=table,
                                 seqused_k=seqused, cu_seqlens_q=cu_q, max_seqlen_q=max(lens_q))
    for i in range(b):
        s = sum(lens_q[:i])
        qi = q[None, s:s + lens_q[i]]
        ki, vi = k[i:i + 1, :lens_k[i]], v[i:i + 1, :lens_k[i]]
        ref, lse_ref = attention_ref(qi, ki, vi, causal=True)
        ref_pt, _ = attention_ref(qi, ki, vi, causal=True, upcast=False)
        check_close(out[None, s:s + lens_q[i]], ref, ref_pt)
        assert (lse[:, s:s + lens_q[i]] - lse_ref[0]).abs().max().item() < 1e-2


def test_paged_graph_capture_and_custom_op():
    b, sk, h, hk, d = 8, 2048, 32, 8, 128
    q = torch.randn(b, 1, h, d, device="cuda", dtype=torch.bfloat16)
    k = torch.randn(b, sk, hk, d, device="cuda", dtype=torch.bfloat16)
    v = torch.randn_like(k)
    used = [sk] * b
    kc, vc, table = _paged(k, v, 64)
    seqused = torch.tensor(used, dtype=torch.int32, device="cuda")
    ref = fa4_aot.attention(q, kc, vc, causal=True, page_table=table, seqused_k=seqused)
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        fa4_aot.attention(q, kc, vc, causal=True, page_table=table, seqused_k=seqused)
    torch.cuda.current_stream().wait_stream(s)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = fa4_aot.attention(q, kc, vc, causal=True, page_table=table, seqused_k=seqused)
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(out, ref)
    o2, _ = torch.ops.fa4_aot.fwd(q, kc, vc, [None, None, None, seqused, table],
                                  [0, 0, -1, -1, 0], True, None, "auto", 0.0)
    assert torch.equal(o2, ref)


def test_bad_page_table_is_memory_safe():
    # Page indices outside the cache and a seqused_k past the table: wrong output is allowed,
    # touching memory outside k/v is not (run under compute-sanitizer by bench/sanitize.sh).
    q = torch.randn(2, 1, 8, 128, device="cuda", dtype=torch.bfloat16)
    kc = torch.randn(4, 16, 8, 128, device="cuda", dtype=torch.bfloat16)
    table = torch.tensor([[0, 99], [-5, 3]], dtype=torch.int32, device="cuda")
    seqused = torch.tensor([10_000, 20], dtype=torch.int32, device="cuda")
    out = fa4_aot.attention(q, kc, kc, page_table=table, seqused_k=seqused)
    torch.cuda.synchronize()
    assert out.shape == q.shape


def test_paged_argument_errors():
    q = torch.randn(2, 1, 8, 128, device="cuda", dtype=torch.bfloat16)
    kc = torch.randn(4, 16, 8, 128, device="cuda", dtype=torch.bfloat16)
    table = torch.zeros(2, 2, dtype=torch.int32, device="cuda")
    used = torch.tensor([1, 2], dtype=torch.int32, device="cuda")
    with pytest.raises(ValueError, match="seqused_k"):
        fa4_aot.attention(q, kc, kc, page_table=table)
    with pytest.raises(TypeError, match="page_table"):
        fa4_aot.attention(q, kc, kc, page_table=table.long(), seqused_k=used)
    with pytest.raises(ValueError, match="page_table"):
        fa4_aot.attention(q, kc, kc, page_table=table.cpu(), seqused_k=used)
    with pytest.raises(ValueError, match="multiple of 16"):
        fa4_aot.attention(q, kc[:, :8], kc[:, :8], page_table=table, seqused_k=used)
    with pytest.raises(ValueError, match="scheduler"):
        fa4_aot.attention(q, kc, kc, page_table=table, seqused_k=used, scheduler="single")
