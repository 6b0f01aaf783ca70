"""How many registers and spills do upstream FA4's kernels get from a given ptxas?

Cross-compile upstream FlashAttention-4's forward kernels on a machine without a GPU, keeping
the PTX (and the DSL's own cubin), so that ``build_tools/spill_report.py`` can report on them.

    # FA4 and its dependencies in any environment with nvidia-cutlass-dsl (no GPU needed), e.g.
    pip install --target /tmp/fa4cpu --no-deps flash-attn-4==4.0.0b36 quack-kernels==0.6.5 \\
        apache-tvm-ffi torch-c-dlpack-ext einops triton
    PYTHONPATH=/tmp/fa4cpu .venv/bin/python -m tools.fa4_cross_compile --out /tmp/fa4_ptx \\
        sm_90a:bf16:128:causal sm_100a:bf16:128:causal
    .venv/bin/python build_tools/spill_report.py /tmp/fa4_ptx/*/*.ptx --ptxas 13.1

Each configuration ``ARCH:DTYPE:HEAD_DIM:causal|full`` is compiled in its own process (the
DSL reads ``CUTE_DSL_ARCH`` at import) by calling ``flash_attn.cute.interface._flash_attn_fwd``
on torch fake tensors (``FakeTensorMode``: shapes and dtypes only, nothing runs), with
``FLASH_ATTENTION_ARCH``/``FLASH_ATTENTION_NUM_SMS`` set as FA4 documents for CPU-only
compilation (and ``cutlass.utils.HardwareInfo`` answering that SM count: FA4's persistent
schedulers ask the local GPU for it), and ``CUTE_DSL_KEEP=ptx,cubin`` dumping into
``OUT/<arch>_<dtype>_hd<d>_<mask>/``.
FA4's file names do not say which configuration they hold; the folder does.  Nothing of FA4
is stored in this repository.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

NUM_SMS = {"sm_90a": "132", "sm_100a": "148"}

CHILD = r"""
import os, sys, torch
from torch._subclasses.fake_tensor import FakeTensorMode
import cutlass.utils
from flash_attn.cute import interface
# FA4's persistent schedulers size the grid from the local GPU; there is none: answer for the target
cutlass.utils.HardwareInfo.__init__ = lambda self, *args, **kwargs: None
cutlass.utils.HardwareInfo.get_device_multiprocessor_count = lambda self: int(os.environ["FLASH_ATTENTION_NUM_SMS"])
dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}[sys.argv[1]]
head_dim, causal = int(sys.argv[2]), sys.argv[3] == "causal"
with FakeTensorMode():
    q, k, v = (torch.empty(2, 4096, 16, head_dim, dtype=dtype, device="cuda") for _ in range(3))
    interface._flash_attn_fwd(q, k, v, causal=causal)
"""


def compile_one(spec: str, out: Path) -> Path:
    arch, dtype, head_dim, mask = spec.split(":")
    if mask not in ("causal", "full"):
        raise SystemExit(f"{spec}: mask must be causal or full")
    folder = out / f"{arch}_{dtype}_hd{head_dim}_{mask}"
    folder.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ, CUTE_DSL_ARCH=arch, FLASH_ATTENTION_ARCH=arch.removesuffix("a"),
               FLASH_ATTENTION_NUM_SMS=NUM_SMS.get(arch, "132"), CUTE_DSL_KEEP="ptx,cubin",
               CUTE_DSL_DUMP_DIR=str(folder))
    subprocess.run([sys.executable, "-c", CHILD, dtype, head_dim, mask], check=True, env=env)
    return folder


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True, help="folder for the per-configuration dumps")
    parser.add_argument("configs", nargs="+", metavar="ARCH:DTYPE:HEAD_DIM:causal|full")
    args = parser.parse_args()
    for spec in args.configs:
        folder = compile_one(spec, args.out)
        for f in sorted(folder.iterdir()):
            print(f)


if __name__ == "__main__":
    main()
