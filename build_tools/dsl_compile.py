"""CuTe DSL -> PTX for one configuration. The only build module that imports cutlass.

Runs in a worker process (``build.py`` fans configurations out over the cores). No GPU is
needed: the DSL compiles against fake tensors for the architecture named in
``CUTE_DSL_ARCH``; we keep its PTX and re-assemble it with the ptxas the user selected.
"""

from __future__ import annotations

import os
import re
import shutil
import tempfile
from pathlib import Path

ENTRY_PREFIX = "fa4aot_"


def entry_name(cfg) -> str:
    """PTX entry symbol: neutral, without the DSL's ``cutlass`` component (a name containing
    "cutlass" changes ptxas's register allocation; docs/perf-notes.md)."""
    # The DSL appends a per-process kernel counter ("_0"): one configuration per process.
    return f"{ENTRY_PREFIX}{cfg.name}_0"


def _dynamic_smem_from_host_ir(ir_text: str) -> int:
    """Dynamic shared memory the DSL's own host launcher would pass (launch config field 2)."""
    cfg_ty = r"!llvm\.struct<\(array<3 x i32>, array<3 x i32>, i64, ptr, ptr, i32\)>"
    gep = re.search(r"(%\d+) = llvm\.getelementptr %\d+\[0, 2\] : \(!llvm\.ptr\) -> !llvm\.ptr, "
                    + cfg_ty, ir_text)
    if not gep:
        raise RuntimeError("launch config not found in the DSL host IR")
    store = re.search(r"llvm\.store (%\d+), " + re.escape(gep.group(1)) + r" : i64", ir_text)
    const = store and re.search(re.escape(store.group(1)) + r" = llvm\.mlir\.constant\((\d+) : i64\)",
                                ir_text)
    if not const:
        raise RuntimeError("dynamic shared memory size is not a constant in the DSL host IR")
    return int(const.group(1))


def compile_to_ptx(cfg_dict: dict, out_ptx: str) -> dict:
    """Compile one configuration; write its PTX to ``out_ptx``. Returns entry and smem.

    Call once per process: the DSL reads its environment when cutlass is first imported."""
    dump = tempfile.mkdtemp(prefix="fa4aot_dsl_")
    os.environ.update(CUTE_DSL_ARCH=cfg_dict["arch"], CUTE_DSL_KEEP="ptx", CUTE_DSL_DUMP_DIR=dump)
    try:
        return _compile(cfg_dict, out_ptx)
    finally:
        shutil.rmtree(dump, ignore_errors=True)


def _compile(cfg_dict: dict, out_ptx: str) -> dict:
    import cutlass
    import cutlass.cute as cute
    from cutlass.cute.runtime import make_fake_stream, make_fake_tensor

    from fa4_aot.configs import KernelConfig

    cfg = KernelConfig.from_dict(cfg_dict)
    if cfg.kind == "combine":
        from fa4_aot.kernels.combine import FlashCombineSm90 as Kernel
    elif cfg.arch == "sm_100a":
        from fa4_aot.kernels.sm100_fwd import FlashFwdSm100 as Kernel
    else:
        from fa4_aot.kernels.sm90 import kernel_class

        Kernel = kernel_class(cfg)
    types = {"bf16": cutlass.BFloat16, "fp16": cutlass.Float16,
             "e4m3": cutlass.Float8E4M3FN}
    dt = types[cfg.dtype]
    hd = cfg.head_dim

    def fake_qkv(t):
        # (seqlen, d, heads, batch) with d contiguous (the FP8 prefill kernels' transposed v:
        # seqlen contiguous); strides are 16-byte aligned.
        elem = cfg.q_storage if t == "q" else cfg.kv_storage
        div = 16 // ELEM_BYTES[elem]
        inner = (cute.sym_int64(divisibility=div), 1)
        if t == "v" and cfg.fp8 and not cfg.decode:
            inner = (1, cute.sym_int64(divisibility=div))
        return make_fake_tensor(
            types[elem], (cute.sym_int32(), hd, cute.sym_int32(), cute.sym_int32()),
            (*inner, cute.sym_int64(divisibility=div), cute.sym_int64(divisibility=div)),
            assumed_align=16)

    from fa4_aot import abi
    from fa4_aot.abi import ELEM_BYTES

    spec = abi.spec_for(cfg)
    problems = abi.check_signature(spec, Kernel.__call__)
    if problems:
        raise RuntimeError("; ".join(problems))
    args = (*(fake_qkv(t) for t in spec.tensors),
            *fake_groups(spec, dt),
            make_fake_stream())
    entry = entry_name(cfg)
    Kernel.kernel.set_name_prefix(
        f"{ENTRY_PREFIX}{cfg.name}", remove_cutlass_symbol=True, keep_mangled_name=False)
    compiled = cute.compile(Kernel(cfg), *args)
    ptx = compiled.artifacts.PTX
    if ptx and ".entry" not in ptx and Path(ptx).is_file():
        ptx = Path(ptx).read_text()
    if not ptx or ".entry" not in ptx:
        raise RuntimeError(f"{cfg.name}: the DSL produced no PTX")
    smem = _dynamic_smem_from_host_ir(str(compiled.ir_module))
    found = re.search(r"\.entry\s+(\S+)\(", ptx)
    if not found or found.group(1) != entry:
        raise RuntimeError(f"{cfg.name}: expected entry {entry}, PTX has "
                           f"{found.group(1) if found else 'none'}")
    Path(out_ptx).write_text(ptx)
    return {"entry": entry, "dynamic_smem_bytes": smem,
            "cutlass_dsl_version": _dsl_version()}


def fake_groups(spec, io_dtype):
    """One NamedTuple of fake values per group of the spec (fa4_aot/abi.py), in order."""
    import cutlass.cute as cute
    from cutlass import Float32, Int32, Int64
    from cutlass.cute.runtime import make_ptr

    elems = {"io": io_dtype, "f32": Float32, "i32": Int32, "i64": Int64}
    scalars = {"i64": lambda: Int64(0), "i32": lambda: Int32(0), "f32": lambda: Float32(0.0)}
    types = spec.group_types()
    out = []
    for g in spec.groups:
        vals = [make_ptr(elems[a.elem], 0, cute.AddressSpace.gmem, assumed_align=a.align)
                if a.kind == "ptr" else scalars[a.kind]() for a in g.args]
        out.append(types[g.name](*vals))
    return out


def _dsl_version() -> str:
    from importlib.metadata import version
    return version("nvidia-cutlass-dsl")
