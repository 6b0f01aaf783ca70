"""Proof that a kernel spec's parameter ORDER is the PTX order (not only sizes and alignment).

The kernels take the spec's groups as NamedTuples generated from ``fa4_aot/abi.py``; the DSL
flattens them into PTX parameters. :func:`probe_ptx` compiles a probe kernel that takes the
same groups (after one output pointer) and stores argument ``i`` of the spec at byte
``8 * i`` of its output. :func:`stored_param_at` reads the PTX back: for every store, the
``ld.param`` that feeds it; :func:`check_order` compares each argument's PTX position with the
position the spec (or a modified copy of it) claims. Swapping two
parameters of the same size in a copy of the spec makes the check fail
(tests/test_abi_order.py), which the size/alignment check alone cannot see.

Needs nvidia-cutlass-dsl (build side only); no GPU.
"""

import os
import re
import shutil
import tempfile
from pathlib import Path


def probe_ptx(spec) -> str:
    """PTX of the probe kernel for ``spec`` (compiled for sm_90a; one call per process is
    enough, the DSL caches nothing between specs that matters here)."""
    dump = tempfile.mkdtemp(prefix="fa4aot_probe_")
    os.environ.setdefault("CUTE_DSL_ARCH", "sm_90a")
    os.environ.update(CUTE_DSL_KEEP="ptx", CUTE_DSL_DUMP_DIR=dump)
    try:
        return _compile(spec)
    finally:
        shutil.rmtree(dump, ignore_errors=True)


def _compile(spec) -> str:
    import cutlass
    import cutlass.cute as cute
    from cutlass import Float32, Int32, Int64
    from cutlass.cute.runtime import make_fake_stream, make_ptr

    from build_tools.dsl_compile import fake_groups

    kinds = [a.kind for a in spec.args()]
    groups = [g.name for g in spec.groups]

    class Probe:
        @cute.jit
        def __call__(self, out: cute.Pointer, args: tuple, stream):
            self.kernel(out, args).launch(grid=[1, 1, 1], block=[1, 1, 1], stream=stream)

        @cute.kernel
        def kernel(self, out: cute.Pointer, args: tuple):
            i = 0
            for gi in cutlass.range_constexpr(len(groups)):
                for v in args[gi]:
                    kind = kinds[i]
                    if cutlass.const_expr(kind in ("i64", "ptr")):
                        slot = cute.make_tensor(out + i, cute.make_layout(1))
                        slot[0] = Int64(v.toint()) if kind == "ptr" else v
                    elif cutlass.const_expr(kind == "i32"):
                        cute.make_tensor(cute.recast_ptr(out + i, dtype=Int32),
                                         cute.make_layout(1))[0] = v
                    else:
                        cute.make_tensor(cute.recast_ptr(out + i, dtype=Float32),
                                         cute.make_layout(1))[0] = v
                    i += 1

    args = tuple(fake_groups(spec, cutlass.BFloat16))
    compiled = cute.compile(Probe(), make_ptr(Int64, 0, cute.AddressSpace.gmem, assumed_align=8),
                            args, make_fake_stream())
    ptx = compiled.artifacts.PTX
    if ptx and ".entry" not in ptx and Path(ptx).is_file():
        ptx = Path(ptx).read_text()
    return ptx


_LD = re.compile(r"ld\.param\.\w+\s+(%\w+),\s*\[\w+_param_(\d+)\];")
_ST = re.compile(r"st\.global\.\w+\s+\[(%\w+)(?:\+(\d+))?\],\s*(%\w+);")
_MOV = re.compile(r"mov\.\w+\s+(%\w+),\s*(%\w+);")


def stored_param_at(ptx: str) -> dict:
    """{byte offset in the output: PTX parameter index whose value is stored there}."""
    reg_param = {m.group(1): int(m.group(2)) for m in _LD.finditer(ptx)}
    for m in _MOV.finditer(ptx):  # a value moved between registers keeps its origin
        if m.group(2) in reg_param:
            reg_param.setdefault(m.group(1), reg_param[m.group(2)])
    out = {}
    for m in _ST.finditer(ptx):
        if m.group(3) in reg_param:
            out[int(m.group(2) or 0)] = reg_param[m.group(3)]
    return out


def check_order(spec, stored_at: dict, claimed=None) -> list:
    """The arguments whose PTX position differs from where ``claimed`` (default: ``spec``) says
    they are, given ``stored_at`` = :func:`stored_param_at` of the probe compiled from ``spec``
    (argument ``i`` of ``spec`` was stored at byte 8 i; PTX parameter 0 is the probe's output
    pointer). ``claimed`` must name the same arguments as ``spec``."""
    claimed = claimed or spec
    real = [a.name for a in spec.args()]
    said = [a.name for a in claimed.args()]
    if sorted(real) != sorted(said):
        raise ValueError(f"{claimed.family}: arguments differ from the compiled spec's")
    return [name for i, name in enumerate(real) if stored_at.get(8 * i) != 1 + said.index(name)]
