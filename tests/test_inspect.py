"""build_tools.inspect_cubin parsers on real tool outputs (tests/fixtures/README.md says
how each was made).  No network: inspect_cubin() is fed the captured tool outputs."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from build_tools import inspect_cubin as ic
from build_tools.toolchain import InspectTools, Toolchain, ToolchainError

FIXTURES = Path(__file__).parent / "fixtures"
WG = "kernel_cutlass_wg_gemm_kernel_CopyAtom_ThrID10_TVLayoutSrc1409601_TVLayoutDst1409601_Valuetypebf16_tensor00odiv641281110_CopyAtom_ThrID10_TVLayoutSrc1819201_TVLayoutDst1819201_Valuetypebf_0"  # noqa: E501
PRESSURE = "kernel_cutlass_pressure_kernel_tensorptrf32gmemalign16odiv12864641_tensorptrf32gmemalign16odiv12864641__0"  # noqa: E501
REVERSE = "kernel_cutlass_reverse_kernel_tensorptrf32gmemalign16odiv12864641_tensorptrf32gmemalign16odiv12864641_1"  # noqa: E501


def fixture(name: str) -> str:
    return (FIXTURES / name).read_text()


# --------------------------------------------------------------------------- ptxas -v


def test_ptxas_log_spilling_two_entry_module():
    log = ic.parse_ptxas_log(fixture("pressure_maxnreg32.ptxas-13.1.115.log"))
    assert set(log) == {PRESSURE, REVERSE}
    p = log[PRESSURE]
    assert p["arch"] == "sm_90a"
    assert (p["registers"], p["stack_frame"], p["spill_stores"], p["spill_loads"]) == (32, 368, 640, 728)
    assert p["barriers"] == 0 and p["cumulative_stack_size"] == 368
    assert p["compile_time_ms"] > 0
    r = log[REVERSE]
    assert (r["registers"], r["spill_stores"], r["spill_loads"], r["smem"], r["barriers"]) == (14, 0, 0, 512, 1)
    assert "smem" not in p


@pytest.mark.parametrize(
    "name, registers",
    [
        ("wg_gemm.ptxas-13.1.115.log", 232),  # setmaxnreg honoured: the launch budget
        ("wg_gemm.ptxas-13.0.88.log", 232),
        ("wg_gemm.ptxas-12.9.86.log", 232),
        ("wg_gemm_nominctasm.ptxas-13.1.115.log", 90),  # setmaxnreg ignored (C7508)
    ],
)
def test_ptxas_log_warp_specialized(name, registers):
    log = ic.parse_ptxas_log(fixture(name))
    assert list(log) == [WG]
    assert log[WG]["registers"] == registers
    assert (log[WG]["stack_frame"], log[WG]["spill_stores"], log[WG]["spill_loads"]) == (0, 0, 0)


def test_ptxas_diagnostics():
    (message,) = ic.parse_ptxas_diagnostics(fixture("wg_gemm_nominctasm.ptxas-13.1.115.log"))
    assert message.startswith("(C7508) Potential Performance Loss: 'setmaxnreg' ignored")
    assert ic.parse_ptxas_diagnostics(fixture("wg_gemm.ptxas-13.1.115.log")) == []


def test_ptxas_log_older_used_line_items():
    # ptxas releases before 12.x printed cmem banks on the Used line; keys stay generic.
    text = (
        "ptxas info    : Compiling entry function 'k' for 'sm_80'\n"
        "ptxas info    : Function properties for k\n"
        "    8 bytes stack frame, 4 bytes spill stores, 4 bytes spill loads\n"
        "ptxas info    : Used 40 registers, 16 bytes smem, 368 bytes cmem[0], 8 bytes cmem[2]\n"
    )
    assert ic.parse_ptxas_log(text)["k"] == {
        "arch": "sm_80", "stack_frame": 8, "spill_stores": 4, "spill_loads": 4,
        "registers": 40, "smem": 16, "cmem_0": 368, "cmem_2": 8,
    }  # fmt: skip


# --------------------------------------------------------------------------- cuobjdump


def test_resource_usage():
    res = ic.parse_resource_usage(fixture("pressure_maxnreg32.ptxas-13.1.115.resource-usage.txt"))
    assert res[PRESSURE] == {
        "reg": 32, "stack": 368, "shared": 0, "local": 0, "constant_0": 564,
        "texture": 0, "surface": 0, "sampler": 0,
    }  # fmt: skip
    assert res[REVERSE]["shared"] == 1536  # 512 static + the DSL's 1024-byte alignment pad
    wg = ic.parse_resource_usage(fixture("wg_gemm.ptxas-13.1.115.resource-usage.txt"))
    assert (wg[WG]["reg"], wg[WG]["shared"]) == (232, 1024)


@pytest.mark.parametrize(
    "name, toolkit, abi",
    [
        ("wg_gemm.ptxas-13.1.115.elf.txt", "13.1", 8),
        ("wg_gemm.ptxas-13.0.88.elf.txt", "13.0", 8),
        ("wg_gemm.ptxas-12.9.86.elf.txt", "12.9", 7),  # old header style: toolkit=129
    ],
)
def test_elf_header(name, toolkit, abi):
    assert ic.parse_elf_header(fixture(name)) == {"arch": "sm_90a", "toolkit": toolkit, "abi": abi}


@pytest.mark.parametrize(
    "name, release, version, branch",
    [
        ("wg_gemm.ptxas-13.0.88.elf.txt", "13.0", "13.0.88", "Build cuda_13.0.r13.0/compiler.36424714_0"),
        ("wg_gemm.ptxas-13.1.115.elf.txt", "13.1", "13.1.115", "Build cuda_13.1.r13.1/compiler.37061995_0"),
    ],
)
def test_tkinfo_13x(name, release, version, branch):
    assert ic.parse_tkinfo(fixture(name)) == {
        "tool": "ptxas",
        "release": release,
        "version": version,
        "branch": branch,
        "command_line": "-v  -O 3 -arch sm_90a",
        "note_version": 2,
    }


def test_tkinfo_absent_from_12_9_cubins():
    # ptxas 12.9 writes no .note.nv.tkinfo (not even with --verbose-tkinfo true); the
    # DSL's embedded ptxas is 12.9 too (its cubin is byte-identical).
    assert ic.parse_tkinfo(fixture("wg_gemm.ptxas-12.9.86.elf.txt")) is None
    assert ic.parse_tkinfo("") is None


def test_tkinfo_without_note_version_line():
    # A note in the older layout, without "Note Version": derived from the 13.0 output.
    text = fixture("wg_gemm.ptxas-13.0.88.elf.txt")
    lines = text.splitlines(keepends=True)
    start = lines.index(".section .note.nv.tkinfo\n")
    note_version = next(i for i in range(start, len(lines)) if "Note Version" in lines[i])
    text = "".join(lines[:note_version] + lines[note_version + 1 :])
    info = ic.parse_tkinfo(text)
    assert (info["version"], info["note_version"], info["tool"]) == ("13.0.88", None, "ptxas")


# --------------------------------------------------------------------------- SASS


def test_local_mem_ops_same_from_nvdisasm_and_cuobjdump():
    expected = {PRESSURE: {"LDL": 168, "STL": 126}, REVERSE: {"LDL": 0, "STL": 0}}
    assert ic.count_local_mem_ops(fixture("pressure_maxnreg32.ptxas-13.1.115.nvdisasm.txt")) == expected
    assert ic.count_local_mem_ops(fixture("pressure_maxnreg32.ptxas-13.1.115.cuobjdump-sass.txt")) == expected
    assert ic.count_local_mem_ops(fixture("wg_gemm.ptxas-13.1.115.nvdisasm.txt")) == {WG: {"LDL": 0, "STL": 0}}


def test_local_mem_ops_predicates_and_modifiers():
    sass = (
        "\t\tFunction : k\n"
        "        /*0000*/              @!P0 LDL.LU.64 R2, [R1+0x8] ;\n"
        "        /*0010*/               @P1 STL.128 [R1], R4 ;\n"
        "        /*0020*/                   LDG.E R6, desc[UR4][R2.64] ;\n"
        "        /*0030*/                   STS [R0], R6 ;\n"
        "        /*0040*/                   LDL R8, [R1+0x4] ;\n"
    )
    assert ic.count_local_mem_ops(sass) == {"k": {"LDL": 2, "STL": 1}}


def test_count_lane_loops():
    """BRA.U.ANY (a uniform-operand instruction issued once per distinct lane value) is
    counted per function; other branches are not."""
    sass = (
        "\t\tFunction : k\n"
        "        /*37d0*/               @P0 ELECT P5, URZ, PT ;\n"
        "        /*37e0*/                   @UP1 UTMALDG.4D [UR8], [UR18], desc[URZ] ;\n"
        "        /*3810*/               @P0 BRA.U.ANY 0x37d0 ;\n"
        "        /*3820*/               @P1 BRA 0x3900 ;\n"
        "\t\tFunction : clean\n"
        "        /*0000*/                   BRA 0x0 ;\n"
    )
    assert ic.count_lane_loops(sass) == {"k": 1, "clean": 0}


# --------------------------------------------------------------------------- PTX


def test_ptx_entries_of_warp_specialized_kernel():
    entries = ic.parse_ptx_entries(fixture("wg_gemm.sm_90a.ptx"))
    params = entries[WG]
    assert [p["name"] for p in params] == [f"{WG}_param_{i}" for i in range(6)]
    # TMA atom, its coordinate tensor (one dynamic i32), TMA atom, output tensor
    # (ptr, i32, pad), the TiledMma (1 byte), the Float32 scale.
    assert [(p["type"], p["size"], p["align"]) for p in params] == [
        ("b8", 128, 64), ("b8", 4, 4), ("b8", 128, 64), ("b8", 16, 8), ("b8", 1, 1), ("f32", 4, 4),
    ]  # fmt: skip
    assert not any(p["is_ptr"] for p in params)
    assert all(p["ptr_align"] is None for p in params)


def test_ptx_entries_of_two_entry_module():
    entries = ic.parse_ptx_entries(fixture("pressure_maxnreg32.sm_90a.ptx"))
    assert list(entries) == [PRESSURE, REVERSE]
    assert [(p["type"], p["size"]) for p in entries[PRESSURE]] == [("b8", 16), ("b8", 16), ("u32", 4)]
    assert [(p["type"], p["size"]) for p in entries[REVERSE]] == [("b8", 16), ("b8", 16)]


def test_ptx_entries_pointer_and_scalar_forms():
    ptx = """
.visible .entry k(
\t.param .u64 .ptr .global .align 16 k_param_0,
\t.param .u64 .ptr .align 8 k_param_1,
\t.param .u64 k_param_2,
\t.param .b32 k_param_3[3]
)
.entry empty()
{
}
"""
    entries = ic.parse_ptx_entries(ptx)
    assert entries["empty"] == []
    p0, p1, p2, p3 = entries["k"]
    assert p0 == {"name": "k_param_0", "type": "u64", "size": 8, "align": 8, "is_ptr": True, "ptr_align": 16}
    assert (p1["is_ptr"], p1["ptr_align"]) == (True, 8)
    assert (p2["is_ptr"], p2["size"], p2["ptr_align"]) == (False, 8, None)
    assert (p3["size"], p3["align"]) == (12, 4)


def test_ptx_entries_reject_unknown_param_syntax():
    with pytest.raises(ValueError, match="unrecognised PTX parameter"):
        ic.parse_ptx_entries(".entry k(\n\t.param .texref k_param_0\n)\n")


def test_ptx_target():
    assert ic.ptx_target(fixture("wg_gemm.sm_90a.ptx")) == "sm_90a"
    with pytest.raises(ValueError):
        ic.ptx_target(".version 8.8\n")


# --------------------------------------------------------------------------- inspect_cubin


def fake_run_tool(outputs: dict[str, str]):
    """run_tool stand-in: answers each tool invocation with a captured output."""

    def run(argv, what=None):
        tool, flag = Path(argv[0]).name, str(argv[1])
        return outputs[f"{tool} {flag}"]

    return run


TOOLS = InspectTools(Path("cuobjdump"), Path("nvdisasm"), "13.5.37")


def test_inspect_cubin_combines_all_sources(monkeypatch):
    stem = "pressure_maxnreg32.ptxas-13.1.115"
    monkeypatch.setattr(ic, "run_tool", fake_run_tool({
        "cuobjdump -elf": fixture(f"{stem}.elf.txt"),
        "cuobjdump --dump-resource-usage": fixture(f"{stem}.resource-usage.txt"),
        "nvdisasm -c": fixture(f"{stem}.nvdisasm.txt"),
    }))  # fmt: skip
    cubin = FIXTURES / f"{stem}.cubin"
    info = ic.inspect_cubin(TOOLS, cubin, fixture(f"{stem}.log"))
    assert info["sha256"] == hashlib.sha256(cubin.read_bytes()).hexdigest()
    assert info["size_bytes"] == cubin.stat().st_size
    assert (info["arch"], info["elf_toolkit"]) == ("sm_90a", "13.1")
    assert (info["ptxas_version"], info["ptxas_release"]) == ("13.1.115", "13.1")
    assert info["ptxas_command_line"] == "-v  -O 3 -arch sm_90a"
    assert info["ptxas_diagnostics"] == []
    assert info["entries"][PRESSURE] == {
        "registers": 32, "stack_frame": 368, "spill_store_bytes": 640, "spill_load_bytes": 728,
        "shared_bytes": 0, "local_bytes": 0, "ldl": 168, "stl": 126, "lane_loops": 0,
        # the captured `nvdisasm -c` output has no life-range columns: peaks unknown
        "reg_peak": None, "reg_live_max": None, "reg_peak_by_role": None,
    }  # fmt: skip
    assert info["entries"][REVERSE]["shared_bytes"] == 1536


def test_inspect_cubin_without_log_or_note(monkeypatch):
    monkeypatch.setattr(ic, "run_tool", fake_run_tool({
        "cuobjdump -elf": fixture("wg_gemm.ptxas-12.9.86.elf.txt"),
        "cuobjdump --dump-resource-usage": fixture("wg_gemm.ptxas-13.1.115.resource-usage.txt"),
        "nvdisasm -c": fixture("wg_gemm.ptxas-13.1.115.nvdisasm.txt"),
    }))  # fmt: skip
    info = ic.inspect_cubin(TOOLS, FIXTURES / "wg_gemm.dsl-embedded.cubin")
    assert info["ptxas_version"] is None and info["elf_toolkit"] == "12.9"
    entry = info["entries"][WG]
    assert (entry["registers"], entry["stack_frame"]) == (232, 0)  # from the resource usage
    assert (entry["spill_store_bytes"], entry["spill_load_bytes"]) == (None, None)


def test_register_peaks_per_setmaxnreg_role():
    """nvdisasm -c -plr -lrm narrow of wg_gemm (ptxas 13.1): launch budget 232, but the SASS
    touches R0..R87; the producer (setmaxnreg 40) R0, the MMA warpgroup (232) up to R87."""
    text = fixture("wg_gemm.ptxas-13.1.115.nvdisasm-plr.txt")
    peaks = ic.parse_register_peaks(text)
    assert peaks[WG] == {
        "peak": 88, "live_max": 68, "cfg_complete": True,
        "by_role": [{"setmaxnreg": None, "peak": 3, "instructions": 27},
                    {"setmaxnreg": 40, "peak": 1, "instructions": 37},
                    {"setmaxnreg": 232, "peak": 88, "instructions": 260}],
    }  # fmt: skip
    assert ic.count_local_mem_ops(text) == {WG: {"LDL": 0, "STL": 0}}  # same text serves both
    assert ic.parse_register_peaks(fixture("wg_gemm.ptxas-13.1.115.nvdisasm.txt")) == {}  # no columns


def test_register_peaks_follow_control_flow():
    """Synthetic life-range listing: a role switch through BRX with nvdisasm's target list, a
    guardrail CALL that traps (no fall-through) and its clobber marks ignored."""
    head = ("\t.section\t.text.k,\"ax\",@progbits\n"
            "  // | GPR      |\n  // |     00000 |\n  // |  # 01234 |\n")

    def insn(addr: int, text: str, marks: str) -> str:
        return f"        /*{addr:04x}*/   {text} ;   // |{marks[:3]} {marks[3:]}|\n"

    sass = head + "".join([
        insn(0x00, "MOV R0, 0x1", "  1^    "),
        insn(0x10, 'BRX R0 -0x20 (*"BRANCH_TARGETS .L_x_1,.L_x_2"*)', "  1v    "),
        ".L_x_1:\n", insn(0x20, "USETMAXREG.DEALLOC.CTAPOOL 0x18", "  0     "),
        insn(0x28, "MOV R1, 0x0", "  1 ^   "),
        insn(0x30, "CALL.REL.NOINC `($__internal_0_$__trap)", "  5xxxxx"),  # clobbers: not a use
        insn(0x40, "MOV R4, 0x2", "  1    ^"),  # the callee traps: never reached from the 24 role
        insn(0x50, "EXIT", "  0     "),
        ".L_x_2:\n", insn(0x60, "USETMAXREG.TRY_ALLOC.CTAPOOL UP0, 0xf0", "  0     "),
        insn(0x70, "MOV R3, 0x2", "  1   ^ "),
        insn(0x80, "BRA `(.L_x_3)", "  1   : "),
        "$__internal_0_$__trap:\n", insn(0x90, "BPT.TRAP 0x1", "  0     "),
        insn(0xa0, "RET.REL.NODEC R2 `(k)", "  0     "),
        ".L_x_3:\n", insn(0xb0, "MOV R4, R3", "  2   v^"),
        insn(0xc0, "EXIT", "  0     "),
    ])  # fmt: skip
    peaks = ic.parse_register_peaks(sass)["k"]
    roles = {r["setmaxnreg"]: r["peak"] for r in peaks["by_role"]}
    assert peaks["cfg_complete"] and peaks["peak"] == 5
    assert roles[24] == 2 and roles[240] == 5  # R4 of 0x40 is not charged to the 24 role


# --------------------------------------------------------------------------- verify_ptxas


def toolchain(version: str) -> Toolchain:
    release = ".".join(version.split(".")[:2])
    return Toolchain(Path("ptxas"), version, release, Path("cuobjdump"), Path("nvdisasm"), "13.5.37")


def test_verify_ptxas():
    ic.verify_ptxas({"ptxas_version": "13.1.115", "elf_toolkit": "13.1"}, toolchain("13.1.115"))
    ic.verify_ptxas({"ptxas_version": None, "elf_toolkit": "12.9"}, toolchain("12.9.86"))
    with pytest.raises(ToolchainError, match="built by ptxas 13.0.88, expected 13.1.115"):
        ic.verify_ptxas({"ptxas_version": "13.0.88", "elf_toolkit": "13.0"}, toolchain("13.1.115"))
    with pytest.raises(ToolchainError, match="no .note.nv.tkinfo"):
        ic.verify_ptxas({"ptxas_version": None, "elf_toolkit": "12.9"}, toolchain("13.1.115"))
    with pytest.raises(ToolchainError, match="toolkit 13.1, expected 12.9"):
        ic.verify_ptxas({"ptxas_version": None, "elf_toolkit": "13.1"}, toolchain("12.9.86"))


def _ptx_with_setmaxnreg(dec, inc):
    return (f"\tsetmaxnreg.dec.sync.aligned.u32 \t{dec};\n"
            f"\tsetmaxnreg.inc.sync.aligned.u32 \t{inc};\n")


@pytest.mark.parametrize("regs,threads,dec,inc,ok", [
    (168, 384, 24, 240, True),    # the prefill kernels: 128 * 144 = 256 * 72, exactly
    (168, 384, 32, 232, True),    # a producer at 32, MMA warpgroups at 232: fits
    (168, 384, 32, 240, False),   # 128 * 136 < 256 * 72: the increase would wait forever
    (240, 256, 56, 240, True),    # the 64-row decode kernels: nothing to take
])
def test_register_budget(regs, threads, dec, inc, ok):
    from build_tools.inspect_cubin import register_budget_problem
    problem = register_budget_problem(_ptx_with_setmaxnreg(dec, inc), regs, threads)
    assert (problem is None) == ok
    if not ok:
        assert "wait forever" in problem and str(inc) in problem


def test_shipped_kernels_register_budgets_hold():
    """Every shipped kernel's setmaxnreg moves fit its allocation (the build refuses others)."""
    import json
    from build_tools.inspect_cubin import register_budget_problem
    root = Path(__file__).resolve().parent.parent / "artifacts"
    manifest = json.loads((root / "manifest.json").read_text())
    checked = 0
    for name, rec in manifest["kernels"].items():
        res = rec["resources"]
        text = (root / rec["ptx"]).read_text()
        assert register_budget_problem(text, res["registers"], res["threads"]) is None, name
        checked += "setmaxnreg" in text
    assert checked >= 150
