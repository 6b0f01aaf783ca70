"""Context parallelism on the CPU (issue 18): zigzag sharding, the per-pair plan, the exact
LSE merge, and the whole ring algorithm on gloo with 2 and 3 processes, the per-pair attention
being fa4_aot.testing.attention_ref in fp32 (no GPU, no fa4_aot kernel)."""

import math
import os

import pytest

torch = pytest.importorskip("torch")
dist = pytest.importorskip("torch.distributed")

from fa4_aot import distributed as cp  # noqa: E402
from fa4_aot.testing import attention_ref  # noqa: E402

TOL = 2e-5  # fp32 end to end: merge rounding only


def _inputs(b, s, h, hk, d, seed=0):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(b, s, h, d, generator=g)
    k = torch.randn(b, s, hk, d, generator=g)
    v = torch.randn(b, s, hk, d, generator=g)
    return q, k, v


def _close_lse(lse, ref):
    fin = torch.isfinite(ref)
    assert torch.equal(torch.isfinite(lse), fin), "LSE -inf pattern differs"
    if fin.any():
        assert (lse[fin] - ref[fin]).abs().max().item() < TOL


# ------------------------------------------------------------------------------- sharding
@pytest.mark.parametrize("world", [1, 2, 3, 4])
@pytest.mark.parametrize("s", [1, 2, 5, 8, 13, 24, 37])
def test_shard_unshard_round_trip(world, s):
    x = torch.arange(2 * s * 3, dtype=torch.float32).view(2, s, 3)
    c = cp.chunk_size(s, world)
    shards = [cp.shard(x, r, world) for r in range(world)]
    assert all(t.shape == (2, 2 * c, 3) for t in shards)
    assert cp.padded_seqlen(s, world) == 2 * world * c and 2 * world * c - s < 2 * world
    torch.testing.assert_close(cp.unshard(shards, seqlen=s), x, rtol=0, atol=0)
    full = cp.unshard(shards)
    assert full.shape[1] == 2 * world * c and not full[:, s:].any()  # zero padding at the end
    # rank r holds chunks r and 2W-1-r
    xp = torch.cat([x, x.new_zeros(2, 2 * world * c - s, 3)], 1)
    for r in range(world):
        torch.testing.assert_close(shards[r][:, :c], xp[:, r * c:(r + 1) * c])
        torch.testing.assert_close(shards[r][:, c:], xp[:, (2 * world - 1 - r) * c:(2 * world - r) * c])
    # another dim (the LSE layout (B, H, S)) and a stacked tensor of shards
    y = x.transpose(1, 2).contiguous()
    ys = torch.stack([cp.shard(y, r, world, dim=2) for r in range(world)])
    torch.testing.assert_close(cp.unshard(ys, dim=2, seqlen=s), y, rtol=0, atol=0)


def test_unshard_rejects_odd_length():
    with pytest.raises(ValueError, match="even"):
        cp.unshard([torch.zeros(1, 3, 1)])


# ------------------------------------------------------------------------------- merge math
@pytest.mark.parametrize("causal", [False, True])
def test_merge_partials_exact(causal):
    """Attention over key blocks merged by LSE equals one attention over all keys; rows that
    see no key in a block (causal, sq > sk) have LSE -inf there, rows that see none at all
    give 0 / -inf."""
    q, k, v = _inputs(2, 9, 4, 2, 16)
    k2, v2 = k[:, :7], v[:, :7]  # sq > sk: causal leaves the first 2 rows without a key
    ref, lse_ref = attention_ref(q, k2, v2, causal=causal)
    outs, lses = [], []
    bounds = [0, 3, 4, 7]
    for a, e in zip(bounds, bounds[1:]):
        # the block's keys with the full problem's mask: mask columns outside [a, e)
        o, l = _masked_block(q, k2, v2, a, e, causal)
        outs.append(o)
        lses.append(l)
    out, lse = cp.merge_partials(outs, lses)
    assert not torch.isnan(out).any()
    torch.testing.assert_close(out, ref, atol=TOL, rtol=0)
    _close_lse(lse, lse_ref)
    if causal:
        assert torch.isinf(lse[:, :, :2]).all() and not out[:, :2].any()


def _masked_block(q, k, v, a, e, causal):
    scale = 1 / math.sqrt(q.shape[-1])
    kk = k.repeat_interleave(q.shape[2] // k.shape[2], 2)
    vv = v.repeat_interleave(q.shape[2] // v.shape[2], 2)
    s = torch.einsum("bqhd,bkhd->bhqk", q * scale, kk)
    sq, sk = q.shape[1], k.shape[1]
    row = torch.arange(sq).view(-1, 1)
    col = torch.arange(sk).view(1, -1)
    mask = (col < a) | (col >= e)
    if causal:
        mask = mask | (col > row + sk - sq)
    s = s.masked_fill(mask, float("-inf"))
    lse = torch.logsumexp(s, -1)
    p = torch.nan_to_num(torch.softmax(s, -1), nan=0.0)
    return torch.einsum("bhqk,bkhd->bqhd", p, vv), lse


def test_merge_into_matches_merge_partials():
    q, k, v = _inputs(1, 6, 2, 2, 8, seed=3)
    o1, l1 = attention_ref(q, k[:, :2], v[:, :2])
    o2, l2 = attention_ref(q, k[:, 2:], v[:, 2:])
    l2[:, :, 1] = float("-inf")
    o2[:, 1] = 0
    acc_o = o1.clone()
    acc_l = l1.clone()
    acc_l[:, :, 0] = float("-inf")
    acc_o[:, 0] = 0
    ref_o, ref_l = cp.merge_partials([acc_o, o2], [acc_l, l2])
    cp._merge_into(acc_o, acc_l, o2.to(torch.bfloat16).float(), l2)
    torch.testing.assert_close(acc_l, ref_l)
    torch.testing.assert_close(acc_o, ref_o, atol=1e-2, rtol=0)


# ------------------------------------------------------------------------------- the plan
def _simulate(q, k, v, world, causal, window=(-1, -1), group_pairs=True, softcap=0.0):
    """The ring algorithm without processes: every rank's plan over every source shard."""
    s = q.shape[1]
    c = cp.chunk_size(s, world)
    outs, lses, work = [], [], []
    for r in range(world):
        qs = cp.shard(q, r, world)
        acc_o = torch.zeros_like(qs)
        acc_l = torch.full((q.shape[0], q.shape[2], 2 * c), float("-inf"))
        pairs = 0
        for step in range(world):
            src = (r - step) % world
            ks, vs = cp.shard(k, src, world), cp.shard(v, src, world)
            for p in cp.plan_step(r, src, world, c, s, causal, window, group_pairs):
                if p.causal:
                    assert p.q1 - p.q0 == p.k1 - p.k0, "causal call on unequal lengths"
                o, l = attention_ref(qs[:, p.q0:p.q1], ks[:, p.k0:p.k1], vs[:, p.k0:p.k1],
                                     causal=p.causal, window_size=p.window, softcap=softcap)
                cp._merge_into(acc_o[:, p.q0:p.q1], acc_l[:, :, p.q0:p.q1], o, l)
                pairs += (p.q1 - p.q0) * (p.k1 - p.k0) / (2 if p.causal else 1)
        outs.append(acc_o)
        lses.append(acc_l)
        work.append(pairs)
    return cp.unshard(outs, seqlen=s), cp.unshard(lses, dim=2, seqlen=s), work, outs, lses


PLAN_CASES = [  # s, world, causal, window
    (16, 2, True, (-1, -1)), (16, 2, False, (-1, -1)), (24, 3, True, (-1, -1)),
    (37, 2, True, (-1, -1)), (37, 3, False, (-1, -1)), (5, 3, True, (-1, -1)),
    (1, 2, False, (-1, -1)), (3, 4, True, (-1, -1)), (29, 4, True, (-1, -1)),
    (37, 3, True, (5, 0)), (37, 2, False, (4, 3)), (40, 2, False, (-1, 6)),
    (40, 4, False, (7, -1)), (23, 3, True, (0, 0)), (33, 2, False, (0, 0)), (30, 3, True, (12, -1)),
    (16, 1, True, (-1, -1)), (7, 1, False, (-1, -1)), (9, 1, True, (2, 0)),
    (21, 2, False, (-1, 0)),  # = causal, written as a window
]


@pytest.mark.parametrize("group_pairs", [True, False], ids=["grouped", "per_pair"])
@pytest.mark.parametrize("case", PLAN_CASES, ids=lambda c: "s{}w{}{}win{}_{}".format(
    c[0], c[1], "c" if c[2] else "f", *c[3]))
def test_plan_matches_full_attention(case, group_pairs):
    s, world, causal, window = case
    q, k, v = _inputs(2, s, 4, 2, 8, seed=s)
    ref, lse_ref = attention_ref(q, k, v, causal=causal, window_size=window)
    out, lse, _, outs, lses = _simulate(q, k, v, world, causal, window, group_pairs)
    torch.testing.assert_close(out, ref, atol=TOL, rtol=0)
    _close_lse(lse, lse_ref)
    # padded rows: output 0, LSE -inf
    c = cp.chunk_size(s, world)
    full_o = cp.unshard(outs)
    full_l = cp.unshard(lses, dim=2)
    assert not full_o[:, s:].any() and torch.isinf(full_l[:, :, s:]).all()
    assert 2 * world * c - s < 2 * world


def test_causal_zigzag_balanced_and_grouped():
    """Causal zigzag without padding: every rank does the same work, one call per step;
    step 0 is the shard against itself (causal, equal lengths), the others are full."""
    world, c = 4, 8
    works = []
    for r in range(world):
        work = 0
        for step in range(world):
            calls = cp.plan_step(r, (r - step) % world, world, c, causal=True)
            assert len(calls) == 1
            p = calls[0]
            assert p.causal == (step == 0) and p.window == (-1, -1)
            work += (p.q1 - p.q0) * (p.k1 - p.k0) / (2 if p.causal else 1)
        works.append(work)
    assert len(set(works)) == 1 and works[0] == 2 * c * c * world
    # per pair: diagonal pairs causal on equal lengths, pairs after the q chunk skipped
    p0 = cp.plan_step(1, 1, world, c, causal=True, group_pairs=False)
    assert sorted((p.q0, p.k0, p.causal) for p in p0) == [(0, 0, True), (c, 0, False),
                                                            (c, c, True)]
    # a softcap passes through unchanged (per-score)
    q, k, v = _inputs(1, 20, 2, 1, 8)
    ref, lse_ref = attention_ref(q, k, v, causal=True, softcap=3.0)
    out, lse, *_ = _simulate(q, k, v, 2, True, softcap=3.0)
    torch.testing.assert_close(out, ref, atol=TOL, rtol=0)
    _close_lse(lse, lse_ref)


# ------------------------------------------------------------------------------- gloo
GLOO_CASES = [  # b, s, h, hk, d, causal, window, comm
    (2, 64, 4, 4, 16, True, (-1, -1), "ring"),
    (2, 64, 4, 4, 16, False, (-1, -1), "ring"),
    (1, 37, 4, 2, 16, True, (-1, -1), "ring"),     # GQA, odd length (padding)
    (1, 37, 4, 1, 16, False, (-1, -1), "ring"),    # MQA, odd length, non-causal
    (1, 5, 2, 2, 8, True, (-1, -1), "ring"),       # shorter than 2W: whole chunks of padding
    (1, 41, 4, 2, 16, True, (9, 0), "ring"),       # causal sliding window
    (1, 41, 2, 2, 16, False, (6, 4), "ring"),      # two-sided window, padding
    (1, 37, 4, 2, 16, True, (-1, -1), "allgather"),
]


def _gloo_worker(rank, world, init, cases, errors_path):
    import traceback
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=world)
    errors = []
    try:
        for i, (b, s, h, hk, d, causal, window, comm) in enumerate(cases):
            try:
                q, k, v = _inputs(b, s, h, hk, d, seed=100 + i)
                ref, lse_ref = attention_ref(q, k, v, causal=causal, window_size=window)
                qs, ks, vs = (cp.shard(x, rank, world) for x in (q, k, v))
                out, lse = cp.context_parallel_attention(
                    qs, ks, vs, causal=causal, return_lse=True, seqlen=s, window_size=window,
                    comm=comm, attn_fn=attention_ref)
                assert out.shape == qs.shape and out.dtype == qs.dtype
                assert lse.shape == (b, h, qs.shape[1]) and lse.dtype == torch.float32
                full = cp.all_gather_unshard(out, seqlen=s)
                full_lse = cp.all_gather_unshard(lse, dim=2, seqlen=s)
                torch.testing.assert_close(full, ref, atol=TOL, rtol=0)
                _close_lse(full_lse, lse_ref)
                # without return_lse: the output alone; group=WORLD names the same group
                o2 = cp.context_parallel_attention(qs, ks, vs, group=dist.group.WORLD,
                                                   causal=causal, seqlen=s, window_size=window,
                                                   attn_fn=attention_ref)
                torch.testing.assert_close(o2, out, atol=0, rtol=0)
            except Exception:
                errors.append(f"rank {rank} case {cases[i]}:\n{traceback.format_exc()}")
        with pytest.raises(ValueError, match="varlen"):
            cp.context_parallel_attention(qs, ks, vs, cu_seqlens_q=torch.zeros(2),
                                          attn_fn=attention_ref)
    finally:
        dist.destroy_process_group()
    if errors:
        with open(f"{errors_path}.{rank}", "w") as f:
            f.write("\n".join(errors))


@pytest.mark.parametrize("world", [2, 3])
def test_ring_on_gloo(world, tmp_path):
    import torch.multiprocessing as mp
    init = f"file://{tmp_path / 'rendezvous'}"
    errors = tmp_path / "errors"
    mp.spawn(_gloo_worker, args=(world, init, GLOO_CASES, str(errors)), nprocs=world, join=True)
    found = [p.read_text() for p in sorted(tmp_path.glob("errors.*"))]
    assert not found, "\n".join(found)


def test_not_initialized_and_bad_args():
    q = torch.zeros(1, 4, 1, 8)
    if not dist.is_initialized():
        with pytest.raises(RuntimeError, match="not initialized"):
            cp.context_parallel_attention(q, q, q, attn_fn=attention_ref)
    with pytest.raises(ValueError, match="varlen"):
        cp.context_parallel_attention(q, q, q, cu_seqlens_q=torch.zeros(2))
    with pytest.raises(ValueError, match="even"):
        cp.context_parallel_attention(q[:, :3], q[:, :3], q[:, :3])
    with pytest.raises(ValueError, match="comm"):
        cp.context_parallel_attention(q, q, q, comm="tree")


def test_nccl_multicast_off():
    assert os.environ.get("NCCL_NVLS_ENABLE") == "0"
    assert os.environ.get("TORCH_SYMM_MEM_DISABLE_MULTICAST") == "1"


# ------------------------------------------------------------------------------- bench_cp.py
def _bench_cp():
    import importlib.util
    from pathlib import Path
    path = Path(__file__).resolve().parent.parent / "bench" / "bench_cp.py"
    spec = importlib.util.spec_from_file_location("bench_cp", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_bench_cp_rows_merge(tmp_path):
    import json
    import shutil
    from pathlib import Path
    bc = _bench_cp()
    bl = bc.bl
    root = Path(__file__).resolve().parent.parent
    path = tmp_path / "b.json"
    shutil.copy(root / "docs" / "bench_h200.json", path)
    old = json.loads(path.read_text())
    case = bl.Case("cp", "causal 128k 1x16x128 (2 GPUs)", 16, 128, True, batch=1,
                   seqlen_q=131072, seqlen_k=131072)
    assert case.flops() == 4 * 16 * 128 * 131072 * 131073 // 2
    results = {"fa4_aot:cp2": {"ms": 60.0, "gpus": 2}, "fa4_aot": {"ms": 114.0}}
    scaling = {"fa4_aot:cp2": {"speedup_vs_fa4_aot": 1.9, "scaling_efficiency": 0.95}}
    rows = bc.cp_rows(case, 2, results, scaling)
    for _ in range(2):  # replaced, not duplicated
        doc = bc.merge_into_file(path, rows, {"device": "synthetic"})
    assert [r for r in doc["rows"] if r["group"] != "cp"] == [r for r in old["rows"]
                                                             if r["group"] != "cp"]
    assert doc["providers"] == old["providers"]
    assert doc["meta"]["group_meta"]["cp"] == {"device": "synthetic"}
    cp_rows = [r for r in doc["rows"] if r["group"] == "cp"]
    assert len(cp_rows) == 1
    pr = cp_rows[0]["providers"]
    t1 = case.flops() / 114.0 / 1e9
    assert pr["fa4_aot"]["tflops"] == round(t1, 2) and pr["fa4_aot"]["ms"] == 114.0
    assert pr["fa4_aot:cp2"]["tflops"] == round(case.flops() / 60.0 / 1e9, 2)
    assert pr["fa4_aot:cp2"]["tflops_per_gpu"] == round(case.flops() / 60.0 / 1e9 / 2, 2)
    # the whole file still reads back through benchlib (bench_fwd.py --from-json)
    back, _ = bl.rows_from_json(json.loads(path.read_text()))
    assert back[-1].case == case
    table = bc.table(cp_rows)
    assert "1.90x" in table and "95.0%" in table
    # --merge-from: the cp rows of a file written on the GPU machine into another file
    dst = tmp_path / "dst.json"
    shutil.copy(root / "docs" / "bench_h200.json", dst)
    assert bc.main(["--merge-from", str(path), "--json", str(dst)]) == 0
    assert json.loads(dst.read_text()) == json.loads(path.read_text())


def test_bench_cp_smoke_gloo(tmp_path):
    """bench_cp.py end to end under torchrun on 2 CPU processes (gloo, reference attention)."""
    import json
    import shutil
    import subprocess
    import sys
    from pathlib import Path
    root = Path(__file__).resolve().parent.parent
    path = tmp_path / "b.json"
    shutil.copy(root / "docs" / "bench_h200.json", path)
    p = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2",
         "--standalone", str(root / "bench" / "bench_cp.py"), "--device", "cpu",
         "--seqlen", "97", "--heads", "2", "--heads-k", "1", "--head-dim", "16", "--iters", "1",
         "--repeats", "2", "--check-rows", "70", "--json", str(path)],
        capture_output=True, text=True, timeout=120, cwd=root)
    assert p.returncode == 0, p.stdout + p.stderr
    assert "fa4_aot:cp2:allgather" in p.stdout.splitlines()[-2]
    doc = json.loads(path.read_text())
    row = [r for r in doc["rows"] if r["group"] == "cp"][0]
    assert set(row["providers"]) == {"fa4_aot:cp2", "fa4_aot:cp2:allgather", "fa4_aot"}
    assert not any(r["mismatch"] for r in row["providers"].values())
    assert row["case"]["seqlen_q"] == 97 and row["case"]["heads_k"] == 1


def test_gpu_test_worker_dry_run_on_gloo(tmp_path):
    """The 2-GPU test's worker, run on gloo with the reference attention in bf16/fp16 in place
    of fa4_aot (small cases): the GPU test's own code path, checked without a GPU."""
    import json
    import torch.multiprocessing as mp
    import test_gpu_distributed as tg
    cases = [(1, 67, 4, 2, 16, "bf16", True, (-1, -1), "ring", True),
             (2, 40, 2, 2, 16, "fp16", False, (-1, -1), "allgather", True),
             (1, 67, 4, 2, 16, "bf16", True, (9, 0), "ring", False),
             (1, 3, 2, 2, 16, "bf16", True, (-1, -1), "ring", True)]
    mp.spawn(tg._worker, args=(f"file://{tmp_path / 'rdv'}", str(tmp_path / "res"), cases, "cpu"),
             nprocs=tg.WORLD, join=True)
    res = json.loads((tmp_path / "res.0").read_text())
    errors = [r["error"] for r in res if "error" in r]
    errors += [r["error"] for r in json.loads((tmp_path / "res.1").read_text()) if "error" in r]
    assert not errors, errors
    assert len(res) == len(cases) and all(r["err"] <= r["bound"] for r in res)
