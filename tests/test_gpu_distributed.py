"""Context-parallel attention on 2 GPUs with NCCL (issue 18): the gathered output and LSE of
fa4_aot.distributed.context_parallel_attention against single-GPU fa4_aot on the whole problem,
by the FlashAttention correctness rule (fa4_aot.testing.check_close) against an fp32 reference.
Skips unless there are >= 2 CUDA GPUs of compute capability 9.0 and NCCL.

Run: ``NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 python3 -m pytest -q
tests/test_gpu_distributed.py`` (one spawn of 2 processes runs every case; ~1 min)."""

import json
import os

os.environ["NCCL_NVLS_ENABLE"] = "0"  # never NVLink multicast (lent machines)
os.environ["TORCH_SYMM_MEM_DISABLE_MULTICAST"] = "1"

import pytest  # noqa: E402

torch = pytest.importorskip("torch")
dist = pytest.importorskip("torch.distributed")


def _why_skip():
    if not torch.cuda.is_available():
        return "needs 2 CUDA GPUs of capability 9.0 (no CUDA device)"
    n = torch.cuda.device_count()
    if n < 2:
        return f"needs 2 CUDA GPUs of capability 9.0 (found {n})"
    caps = [torch.cuda.get_device_capability(i) for i in range(2)]
    if any(c != (9, 0) for c in caps):
        return f"needs 2 CUDA GPUs of capability 9.0 (found {caps})"
    if not dist.is_available() or not dist.is_nccl_available():
        return "needs torch.distributed with NCCL"
    return None


WHY = _why_skip()
pytestmark = pytest.mark.skipif(WHY is not None, reason=WHY or "")

WORLD = 2
# b, s, h, hk, d, dtype, causal, window, comm, group_pairs
CASES = [
    (2, 4096, 8, 8, 128, "bf16", True, (-1, -1), "ring", True),
    (2, 4096, 8, 8, 128, "bf16", False, (-1, -1), "ring", True),
    (1, 3001, 8, 2, 128, "bf16", True, (-1, -1), "ring", True),    # GQA, odd: padding 3
    (1, 3001, 8, 2, 64, "bf16", False, (-1, -1), "ring", True),
    (1, 1027, 4, 1, 128, "fp16", True, (-1, -1), "ring", True),    # MQA, fp16
    (1, 2050, 6, 2, 256, "bf16", True, (-1, -1), "ring", True),    # hd256
    (1, 3001, 8, 2, 128, "bf16", True, (-1, -1), "ring", False),   # one call per pair
    (1, 3001, 8, 2, 128, "bf16", True, (-1, -1), "allgather", True),
    (1, 8190, 8, 4, 128, "bf16", True, (1000, 0), "ring", True),   # causal sliding window
    (1, 5003, 4, 4, 128, "bf16", False, (700, 300), "ring", True),  # two-sided window
    (1, 3, 2, 2, 64, "bf16", True, (-1, -1), "ring", True),         # shorter than 2W
]


def _ref_in_dtype(q, k, v, causal=False, softmax_scale=None, window_size=(-1, -1), **kw):
    from fa4_aot.testing import attention_ref
    o, lse = attention_ref(q, k, v, causal=causal, softmax_scale=softmax_scale,
                           window_size=window_size, **kw)
    return o.to(q.dtype), lse


def _worker(rank, init, results_path, cases=None, device="cuda"):
    """One rank: every case, results (errors per case) to ``results_path.<rank>``. ``device``
    "cpu" (the CPU test's dry run of this worker): gloo, and the reference in the input dtype
    in place of fa4_aot."""
    import fa4_aot
    from fa4_aot import distributed as cp
    from fa4_aot.testing import attention_ref, check_close

    cases = CASES if cases is None else cases
    if device == "cuda":
        torch.cuda.set_device(rank)
        dev = torch.device("cuda", rank)
        dist.init_process_group("nccl", init_method=init, rank=rank, world_size=WORLD,
                                device_id=dev)
        attn_fn, single_fn = None, fa4_aot.attention
    else:
        torch.set_num_threads(1)
        dev = torch.device("cpu")
        dist.init_process_group("gloo", init_method=init, rank=rank, world_size=WORLD)
        attn_fn = _ref_in_dtype
        single_fn = lambda *a, return_lse, **kw: _ref_in_dtype(*a, **kw)  # noqa: E731
    results = []
    try:
        for i, (b, s, h, hk, d, dt, causal, window, comm, grouped) in enumerate(cases):
            dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}[dt]
            g = torch.Generator(device=dev).manual_seed(1000 + i)
            q = torch.randn(b, s, h, d, device=dev, dtype=dtype, generator=g)
            k = torch.randn(b, s, hk, d, device=dev, dtype=dtype, generator=g)
            v = torch.randn(b, s, hk, d, device=dev, dtype=dtype, generator=g)
            res = {"case": cases[i]}
            try:
                qs, ks, vs = (cp.shard(x, rank, WORLD) for x in (q, k, v))
                out, lse = cp.context_parallel_attention(
                    qs, ks, vs, causal=causal, return_lse=True, seqlen=s, window_size=window,
                    comm=comm, group_pairs=grouped, attn_fn=attn_fn)
                assert out.dtype == dtype and out.shape == qs.shape
                full = cp.all_gather_unshard(out, seqlen=s)
                full_lse = cp.all_gather_unshard(lse, dim=2, seqlen=s)
                if device == "cuda":
                    torch.cuda.synchronize()
                if rank == 0:
                    single, lse1 = single_fn(q, k, v, causal=causal, return_lse=True,
                                             window_size=window)
                    ref, lse_ref = attention_ref(q, k, v, causal=causal, window_size=window)
                    ref_pt, _ = attention_ref(q, k, v, causal=causal, window_size=window,
                                              upcast=False)
                    err, bound = check_close(full, ref, ref_pt, what="cp out")
                    err1, _ = check_close(single, ref, ref_pt, what="single-GPU out")
                    fin = torch.isfinite(lse_ref)
                    assert torch.equal(torch.isfinite(full_lse), fin), "LSE -inf pattern"
                    dl = (full_lse[fin] - lse_ref[fin]).abs().max().item() if fin.any() else 0.0
                    dl1 = (full_lse[fin] - lse1[fin]).abs().max().item() if fin.any() else 0.0
                    assert dl < 1e-2 and dl1 < 1e-2, f"LSE: |cp-ref| {dl:.3e}, |cp-single| {dl1:.3e}"
                    res.update(err=err, bound=bound, err_single=err1, lse_err=dl,
                               lse_vs_single=dl1, diff_vs_single=(full.float() - single.float())
                               .abs().max().item())
            except Exception as e:  # noqa: BLE001 -- reported per case by the parent
                res["error"] = f"rank {rank}: {type(e).__name__}: {e}"
            results.append(res)
        if device == "cuda":
            # back-to-back calls, no synchronization between them: the ring's side stream and
            # buffers must not race (every call bitwise equal to the first)
            res = {"case": "repeat: 5 back-to-back ring calls, causal 1x16384x8x128 bf16"}
            try:
                g = torch.Generator(device=dev).manual_seed(7)
                q, k, v = (torch.randn(1, 16384, 8, 128, device=dev, dtype=torch.bfloat16,
                                       generator=g) for _ in range(3))
                qs, ks, vs = (cp.shard(x, rank, WORLD) for x in (q, k, v))
                outs = [cp.context_parallel_attention(qs, ks, vs, causal=True) for _ in range(5)]
                torch.cuda.synchronize()
                for j, o in enumerate(outs[1:], 1):
                    assert torch.equal(o, outs[0]), f"call {j} differs from call 0"
                res.update(err=0.0, bound=0.0, err_single=0.0, lse_err=0.0, diff_vs_single=0.0)
            except Exception as e:  # noqa: BLE001
                res["error"] = f"rank {rank}: {type(e).__name__}: {e}"
            results.append(res)
    finally:
        dist.destroy_process_group()
    with open(f"{results_path}.{rank}", "w") as f:
        json.dump(results, f)


def test_cp_matches_single_gpu(tmp_path):
    import torch.multiprocessing as mp
    init = f"file://{tmp_path / 'rendezvous'}"
    mp.spawn(_worker, args=(init, str(tmp_path / "results")), nprocs=WORLD, join=True)
    failures = []
    print()
    for r in range(WORLD):
        for res in json.loads((tmp_path / f"results.{r}").read_text()):
            if "error" in res:
                failures.append(f"{res['case']}: {res['error']}")
                print(f"FAIL {failures[-1]}")
            elif r == 0:
                print(f"ok {res['case']}: max|cp-ref| {res['err']:.2e} <= {res['bound']:.2e} "
                      f"(single-GPU {res['err_single']:.2e}), max|cp-single| "
                      f"{res['diff_vs_single']:.2e}, LSE {res['lse_err']:.1e}")
    assert not failures, "\n".join(failures)
