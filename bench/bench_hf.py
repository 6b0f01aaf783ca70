"""Hugging Face transformers end to end: prefill and decode tokens/s of one random-init
Llama-shaped model (8 layers, hd128, 32/8 heads, bf16) with attn_implementation = sdpa,
flash_attention_4 (FA4, when importable) and fa4_aot, in one process.

    python bench/bench_hf.py [--batches 1,16] [--caches dynamic,static] [--prompt 2048]
                             [--new 128] [--anatomy] [--json docs/bench_h200.json]

Prefill: a forward of (batch, prompt) tokens without a cache (the median of 3 per round).
Decode: ``generate`` of ``--new`` tokens minus ``generate`` of one token (the same prefill and
setup), greedy, ``min_new_tokens`` = ``--new``: tokens/s = batch * (new - 1) / difference.
``static`` is transformers' static cache (``cache_implementation="static"``) without its
automatic torch.compile, so that every backend runs eagerly. Each time is the median of
``--repeats`` rounds after one untimed warm-up round; within a round the providers run one
after another, in alternating order. ``--anatomy`` adds, per backend, what one decode step does (host syncs, launches, GPU
kernel time; :func:`_anatomy`). ``--json`` merges the group ``hf`` (other groups kept;
bench_decode.merge_json).
"""

from __future__ import annotations

import argparse
import datetime
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def _seconds(fn):
    import torch
    torch.cuda.synchronize()
    t = time.perf_counter()
    fn()
    torch.cuda.synchronize()
    return time.perf_counter() - t


def _warm_up(model, ids, gen, new):
    """Loads kernels, prepares launches and grows the allocator's pools: the same work as a
    round, untimed (every provider warms up before any is timed)."""
    import torch
    with torch.inference_mode():
        model(ids, use_cache=False)
        model.generate(ids, max_new_tokens=new, min_new_tokens=new, **gen)


def _round(model, ids, gen, new, t, tokens, p, prompt):
    """One provider's share of a round: prefill, generate 1 token, generate ``new`` tokens."""
    import torch
    with torch.inference_mode():
        t["pre"].append(statistics.median(_seconds(lambda: model(ids, use_cache=False))
                                          for _ in range(3)))
        t["one"].append(_seconds(lambda: model.generate(ids, max_new_tokens=1, **gen)))
        out = {}
        t["all"].append(_seconds(lambda: out.__setitem__("t", model.generate(
            ids, max_new_tokens=new, min_new_tokens=new, **gen))))
    tokens[p] = out["t"][:, prompt:]


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--providers", default="sdpa,flash_attention_4,fa4_aot")
    ap.add_argument("--batches", default="1,16")
    ap.add_argument("--caches", default="dynamic,static")
    ap.add_argument("--prompt", type=int, default=2048)
    ap.add_argument("--new", type=int, default=128)
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--anatomy", action="store_true",
                    help="also profile each backend's decode steps: host syncs, kernel launches "
                         "and GPU kernel time per step (torch.profiler)")
    ap.add_argument("--json")
    a = ap.parse_args(argv)

    import torch
    import transformers
    from fa4_aot.integrations import transformers as fa4_hf
    fa4_hf.register()

    cfg = transformers.LlamaConfig(vocab_size=32000, hidden_size=4096, intermediate_size=14336,
                                   num_hidden_layers=a.layers, num_attention_heads=32,
                                   num_key_value_heads=8, head_dim=128,
                                   max_position_embeddings=a.prompt + a.new + 16)
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(cfg, attn_implementation="sdpa")
    model = model.to(device="cuda", dtype=torch.bfloat16).eval()
    provs = []
    for p in [x.strip() for x in a.providers.split(",") if x.strip()]:
        try:
            model.set_attn_implementation(p)
            provs.append(p)
        except Exception as e:  # noqa: BLE001  (FA4 not installed, ...)
            print(f"skipping {p}: {type(e).__name__}: {e}")
    rows = []
    for b in [int(x) for x in a.batches.split(",")]:
        g = torch.Generator().manual_seed(b)
        ids = torch.randint(1, cfg.vocab_size, (b, a.prompt), generator=g).cuda()
        for cache in [x.strip() for x in a.caches.split(",") if x.strip()]:
            gen = dict(do_sample=False, pad_token_id=0)
            if cache == "static":
                gen.update(cache_implementation="static", disable_compile=True)
            times = {p: {"pre": [], "one": [], "all": []} for p in provs}
            tokens, failed = {}, set()
            for p in provs:
                model.set_attn_implementation(p)
                try:
                    _warm_up(model, ids, gen, a.new)
                except Exception as e:  # noqa: BLE001 - a backend without this cache mode
                    print(f"{p} {cache} b{b}: {type(e).__name__}: {e}"[:300])
                    failed.add(p)
            for rnd in range(a.repeats):
                for p in (provs if rnd % 2 == 0 else provs[::-1]):
                    if p in failed:
                        continue
                    model.set_attn_implementation(p)
                    t = times[p]
                    try:
                        _round(model, ids, gen, a.new, t, tokens, p, a.prompt)
                    except Exception as e:  # noqa: BLE001 - a backend without this cache mode
                        print(f"{p} {cache} b{b}: {type(e).__name__}: {e}"[:300])
                        failed.add(p)
                    torch.cuda.empty_cache()
            res = {}
            for p, t in times.items():
                if p in failed:
                    continue
                pre, one, full = (statistics.median(t[x]) for x in ("pre", "one", "all"))
                res[p] = {"prefill_tok_s": b * a.prompt / pre,
                          "decode_tok_s": b * (a.new - 1) / max(full - one, 1e-9),
                          "prefill_ms": 1e3 * pre, "generate_1_ms": 1e3 * one,
                          "generate_ms": 1e3 * full}
            ref = tokens.get("sdpa")
            for p in res:
                if ref is not None:
                    res[p]["tokens_as_sdpa"] = (tokens[p] == ref).float().mean().item()
                if a.anatomy:
                    model.set_attn_implementation(p)
                    res[p]["per_step"] = _anatomy(model, ids, gen)
            rows.append({"group": "hf", "label": f"llama {a.layers}L hd128 32/8 b{b} "
                                                 f"prompt {a.prompt} +{a.new} {cache}",
                         "case": {"batch": b, "prompt": a.prompt, "new_tokens": a.new,
                                  "layers": a.layers, "heads": 32, "kv_heads": 8,
                                  "head_dim": 128, "dtype": "bf16", "cache": cache},
                         "providers": res})
            _print_row(rows[-1], provs)
    meta = {"device": torch.cuda.get_device_name(), "torch": torch.__version__,
            "transformers": transformers.__version__,
            "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
            "command": "python bench/bench_hf.py " + " ".join(argv if argv is not None
                                                             else sys.argv[1:])}
    try:
        from importlib.metadata import version
        meta["flash_attn"] = version("flash-attn-4")
    except Exception:  # noqa: BLE001
        pass
    if a.json:
        from bench_decode import merge_json
        merge_json(a.json, "hf", rows, provs, meta)
    print("\ntokens/s (prefill, decode)")
    for r in rows:
        _print_row(r, provs)


def _anatomy(model, ids, gen, steps=9):
    """What one decode step does, per backend: the profile of ``generate(steps)`` minus that of
    ``generate(1)`` (the same prefill), divided by ``steps - 1``. ``syncs``: device->host
    reads (``aten::_local_scalar_dense``, what ``.item()`` / ``bool(tensor)`` run), which stop
    the host from running ahead of the GPU; ``launches``: kernel launches through the runtime
    or the driver; ``gpu_ms``: kernel time on the device."""
    import torch
    from torch.profiler import ProfilerActivity, profile
    launch_names = ("cudaLaunchKernel", "cudaLaunchKernelExC", "cuLaunchKernel",
                    "cuLaunchKernelEx")

    cuda = ids.is_cuda
    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])

    def count(n):
        with torch.inference_mode(), profile(activities=acts) as prof:
            model.generate(ids, max_new_tokens=n, min_new_tokens=n, **gen)
            if cuda:
                torch.cuda.synchronize()
        c = {"syncs": 0, "launches": 0, "gpu_ms": 0.0}
        for e in prof.events():
            if e.device_type.name == "CUDA":
                c["gpu_ms"] += e.device_time / 1e3
            elif e.name == "aten::_local_scalar_dense":
                c["syncs"] += 1
            elif e.name in launch_names:
                c["launches"] += 1
        return c

    many, one = count(steps), count(1)
    return {k: (many[k] - one[k]) / (steps - 1) for k in many}


def _print_row(r, provs):
    cells = "".join(f"  {p}: {r['providers'][p]['prefill_tok_s']:>8.0f} "
                    f"{r['providers'][p]['decode_tok_s']:>8.1f}"
                    for p in provs if p in r["providers"])
    print(f"{r['label']:<44}{cells}", flush=True)
    for p in provs:
        a = r["providers"].get(p, {}).get("per_step")
        if a:
            print(f"    {p:<18} per decode step: {a['syncs']:.1f} syncs, "
                  f"{a['launches']:.0f} launches, {a['gpu_ms']:.2f} ms of kernels", flush=True)


if __name__ == "__main__":
    main()
