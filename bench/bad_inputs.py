"""Malformed varlen offsets and paged-KV tables, for compute-sanitizer memcheck.

    python bench/bad_inputs.py            (bench/sanitize.sh runs it under memcheck)

Wrong output is acceptable for wrong input; a load or store outside q, k, v, out, lse (or the
page pool) is not. Every call here is malformed on purpose: non-monotonic offsets, offsets past
the packed length, documents longer than max_seqlen, negative offsets, page indices outside the
cache, a seqused_k past the page table, a seqused_k larger than the keys. Prints "ok" when all
calls returned (the sanitizer's summary says whether any touched foreign memory).
"""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
import torch  # noqa: E402

import fa4_aot  # noqa: E402

dev, bf = "cuda", torch.bfloat16
h, hk, d = 8, 2, 128
total = 300
q = torch.randn(total, h, d, device=dev, dtype=bf)
k = torch.randn(total, hk, d, device=dev, dtype=bf)
v = torch.randn_like(k)
bad_offsets = {
    "non-monotonic": [0, 200, 100, 300],
    "past the end": [0, 100, 250, 900],
    "longer than max_seqlen": [0, 10, 20, 300],
    "negative": [-50, 40, 80, 120],
}
for name, cu in bad_offsets.items():
    cu_t = torch.tensor(cu, dtype=torch.int32, device=dev)
    for causal in (False, True):
        # decode kernels (packed GQA), the 128-row kernels, the compact varlen tile order (1024)
        for max_q in (1, 64, 256, 1024):
            fa4_aot.attention(q, k, v, causal=causal, cu_seqlens_q=cu_t, cu_seqlens_k=cu_t,
                              max_seqlen_q=max_q, max_seqlen_k=64, return_lse=True)
# Paged KV: page indices outside the pool, a table narrower than seqused_k, seqused_k huge.
pool = torch.randn(6, 16, hk, d, device=dev, dtype=bf)
table = torch.tensor([[0, 99, -7], [5, 4, 3], [2, 2, 2]], dtype=torch.int32, device=dev)
used = torch.tensor([48, 10_000, -3], dtype=torch.int32, device=dev)
# 2 query tokens: the 64-row decode kernels; 40 (160 packed rows): the 128-row ones, whose
# paged K and V go in one pass over the boxes (3 stages at hd128).
for sq in (2, 40):
    qd = torch.randn(3, sq, h, d, device=dev, dtype=bf)
    for ns in (1, 4):
        fa4_aot.attention(qd, pool, pool, causal=True, page_table=table, seqused_k=used,
                          num_splits=ns, return_lse=True)
# seqused_k / seqused_q larger than the tensors (dense).
qq = torch.randn(2, 3, h, d, device=dev, dtype=bf)
kk = torch.randn(2, 50, hk, d, device=dev, dtype=bf)
big = torch.tensor([10_000, 7], dtype=torch.int32, device=dev)
fa4_aot.attention(qq, kk, kk, seqused_k=big, seqused_q=big, num_splits=3, return_lse=True)
torch.cuda.synchronize()
print("ok bad inputs ran")
