"""Hugging Face transformers end to end: prefill and decode tokens/s of one random-init
Llama-shaped model (8 layers, hd128, 32/8 heads, bf16) with attn_implementation = sdpa,
flash_attention_4 (FA4, when importable) and fa4_aot, in one process.

    python bench/bench_hf.py [--batches 1,16] [--prompt 2048] [--new 128] [--json docs/bench_h200.json]

Prefill: median of ``--repeats`` timed forwards of (batch, prompt) tokens (CUDA events).
Decode: generate(``--new`` tokens, greedy, dynamic cache, ``min_new_tokens`` = ``--new``) minus
one prefill, as tokens/s = batch * (new - 1) / time. ``--json`` merges the group ``hf``
(other groups kept; bench_decode.merge_json).
"""

from __future__ import annotations

import argparse
import datetime
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def _timed(fn, repeats):
    import torch
    ts = []
    for _ in range(repeats):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        torch.cuda.synchronize()
        ts.append(a.elapsed_time(b) / 1e3)
    return statistics.median(ts)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--providers", default="sdpa,flash_attention_4,fa4_aot")
    ap.add_argument("--batches", default="1,16")
    ap.add_argument("--prompt", type=int, default=2048)
    ap.add_argument("--new", type=int, default=128)
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--repeats", type=int, default=5)
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
        res = {}
        tokens = {}
        for _round in range(2):  # two rounds, alternating order; the last one counts
            order = provs if _round % 2 == 0 else provs[::-1]
            for p in order:
                model.set_attn_implementation(p)
                with torch.inference_mode():
                    model(ids[:, :128])  # warm-up (loads kernels)
                    t_pre = _timed(lambda: model(ids, use_cache=False), a.repeats)
                    kw = dict(max_new_tokens=a.new, min_new_tokens=a.new, do_sample=False,
                              pad_token_id=0)
                    model.generate(ids[:, :256], **dict(kw, max_new_tokens=8, min_new_tokens=8))
                    out = {}
                    t_gen = _timed(lambda: out.__setitem__("t", model.generate(ids, **kw)),
                                   max(1, a.repeats // 2))
                tokens[p] = out["t"][:, a.prompt:]
                t_dec = max(t_gen - t_pre, 1e-9)
                res[p] = {"prefill_tok_s": b * a.prompt / t_pre,
                          "decode_tok_s": b * (a.new - 1) / t_dec,
                          "prefill_ms": 1e3 * t_pre, "generate_ms": 1e3 * t_gen}
                torch.cuda.empty_cache()
        ref = tokens.get("sdpa")
        for p in res:
            if ref is not None:
                res[p]["tokens_as_sdpa"] = (tokens[p] == ref).float().mean().item()
        rows.append({"group": "hf", "label": f"llama {a.layers}L hd128 32/8 b{b} "
                                             f"prompt {a.prompt} +{a.new}",
                     "case": {"batch": b, "prompt": a.prompt, "new_tokens": a.new,
                              "layers": a.layers, "heads": 32, "kv_heads": 8, "head_dim": 128,
                              "dtype": "bf16", "cache": "dynamic"},
                     "providers": res})
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
    print()
    head = f"{'case':<36}" + "".join(f"{p + ' pre':>22}{p + ' dec':>22}" for p in provs)
    print("tokens/s (prefill, decode)")
    print(head)
    for r in rows:
        print(f"{r['label']:<36}" + "".join(
            f"{r['providers'][p]['prefill_tok_s']:>22.0f}{r['providers'][p]['decode_tok_s']:>22.1f}"
            for p in provs if p in r["providers"]))


if __name__ == "__main__":
    main()
