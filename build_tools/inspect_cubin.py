"""Parsers for ptxas / cuobjdump / nvdisasm output, and a one-call cubin inspection.

Every parser takes the text a tool printed and returns plain dicts; the fixtures in
tests/fixtures/ are real outputs of ptxas 12.9/13.0/13.1 and cuobjdump/nvdisasm 13.5.

:func:`inspect_cubin` returns (all names snake_case; ``None`` means "not known")::

    {
      "sha256":              hex digest of the cubin file,
      "size_bytes":          cubin file size,
      "arch":                "sm_90a" (from the ELF header),
      "elf_toolkit":         toolkit release stamped in the ELF header, e.g. "13.1" or "12.9",
      "ptxas_version":       full ptxas version from the .note.nv.tkinfo note, e.g. "13.1.115";
                             None when the cubin has no note (ptxas 12.x and the CuTe DSL's
                             embedded ptxas write none),
      "ptxas_release":       "13.1" (same source),
      "ptxas_command_line":  ptxas arguments recorded in the note, e.g. "-v  -O 3 -arch sm_90a",
      "ptxas_diagnostics":   coded ptxas messages from the -v log, e.g.
                             ["(C7508) Potential Performance Loss: 'setmaxnreg' ignored; ..."],
      "entries": {
        <function name>: {
          "registers":         registers per thread (the launch budget under setmaxnreg),
          "stack_frame":       stack frame bytes per thread,
          "spill_store_bytes": bytes of spill stores (ptxas -v only; None without a log),
          "spill_load_bytes":  bytes of spill loads (ptxas -v only; None without a log),
          "shared_bytes":      static shared memory from the cubin (the CuTe DSL's
                               `.extern .shared .align 1024` adds 1024 bytes of padding),
          "local_bytes":       local memory bytes from the cubin,
          "ldl":               number of LDL instructions in the SASS,
          "stl":               number of STL instructions in the SASS,
        }
      }
    }

Under ``setmaxnreg`` the register count is the launch budget, not what each role
gets, so spills inside a role only show as LDL/STL: check ``ldl``/``stl`` as well as
the spill bytes.

Stdlib only.
"""

from __future__ import annotations

import hashlib
import os
import re
from collections import Counter
from pathlib import Path
from typing import Any

from .toolchain import InspectTools, Toolchain, ToolchainError, run_tool

__all__ = [
    "parse_ptxas_log",
    "parse_ptxas_diagnostics",
    "parse_resource_usage",
    "parse_elf_header",
    "parse_tkinfo",
    "count_local_mem_ops",
    "parse_ptx_entries",
    "ptx_target",
    "inspect_cubin",
    "verify_ptxas",
]

# --------------------------------------------------------------------------- ptxas -v

_ENTRY_RE = re.compile(r"Compiling entry function '([^']+)' for '([^']+)'")
_PROPS_RE = re.compile(r"Function properties for (\S+)")
_FRAME_RE = re.compile(
    r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads"
)
_USED_RE = re.compile(r"ptxas info\s*: Used (\d+ registers.*)$")
_COMPILE_TIME_RE = re.compile(r"Compile time = ([\d.]+) ms")
_USED_ITEM_RE = re.compile(r"^(?:used\s+)?(\d+)\s+(?:bytes\s+)?(.+)$", re.IGNORECASE)
_DIAGNOSTIC_RE = re.compile(r"^ptxas (?:info|warning)\s*: (\(C\d+\).*)$")


def _snake(name: str) -> str:
    return re.sub(r"[^a-z0-9]+", "_", name.lower()).strip("_")


def parse_ptxas_log(text: str) -> dict[str, dict[str, Any]]:
    """Per-function figures from a ``ptxas -v`` log.

    Returns ``{function: record}``.  A record has ``arch`` (entries only), the
    ``stack_frame``/``spill_stores``/``spill_loads`` byte counts, every item of the
    ``Used ...`` line (``registers``, ``barriers``, and when printed ``smem``,
    ``cumulative_stack_size``, ``cmem_0``...) and ``compile_time_ms``.
    """
    functions: dict[str, dict[str, Any]] = {}
    current: dict[str, Any] | None = None
    for line in text.splitlines():
        if m := _ENTRY_RE.search(line):
            current = functions.setdefault(m.group(1), {})
            current["arch"] = m.group(2)
        elif m := _PROPS_RE.search(line):
            current = functions.setdefault(m.group(1), {})
        elif current is None:
            continue
        elif m := _FRAME_RE.search(line):
            current["stack_frame"], current["spill_stores"], current["spill_loads"] = (
                int(g) for g in m.groups()
            )
        elif m := _USED_RE.search(line):
            for item in m.group(1).split(","):
                if im := _USED_ITEM_RE.match(item.strip()):
                    current[_snake(im.group(2))] = int(im.group(1))
        elif m := _COMPILE_TIME_RE.search(line):
            current["compile_time_ms"] = float(m.group(1))
    return functions


def parse_ptxas_diagnostics(text: str) -> list[str]:
    """Coded ptxas messages (``(C7508) Potential Performance Loss: ...``) from a -v log.

    ptxas prints them before the per-function blocks, so they cannot be tied to
    one entry; they matter (C7507/C7508 mean setmaxnreg was ignored).
    """
    return [m.group(1).strip() for line in text.splitlines() if (m := _DIAGNOSTIC_RE.match(line))]


# --------------------------------------------------------------------------- cuobjdump

_RES_FUNCTION_RE = re.compile(r"^\s*Function (\S+):\s*$")
_RES_ITEM_RE = re.compile(r"([A-Z]+(?:\[\d+\])?):(\d+)")


def parse_resource_usage(text: str) -> dict[str, dict[str, int]]:
    """``cuobjdump --dump-resource-usage`` → ``{function: {"reg", "stack", "shared",
    "local", "constant_0", "texture", "surface", "sampler"}}`` (keys as printed, snake_cased).

    It has no spill figures: those come from the ptxas -v log.
    """
    result: dict[str, dict[str, int]] = {}
    current: dict[str, int] | None = None
    for line in text.splitlines():
        if m := _RES_FUNCTION_RE.match(line):
            current = result.setdefault(m.group(1), {})
        elif current is not None and (items := _RES_ITEM_RE.findall(line)):
            current.update({_snake(k): int(v) for k, v in items})
            current = None
    return result


# 12.x-era cubins:  "64bit elf: type=2, abi=7, sm=90a, toolkit=129, flags = 0x5a0d5a"
# 13.x cubins:      "64-bit ELF: type=ET_EXEC, ABI=8, sm=90a, toolkit=13.1, flags=0x6005a04"
_ELF_HEADER_RE = re.compile(
    r"^\s*64-?bit elf:.*?\babi=(\d+).*?\bsm=(\w+).*?\btoolkit=([\d.]+)", re.IGNORECASE | re.MULTILINE
)


def parse_elf_header(text: str) -> dict[str, Any] | None:
    """First line of ``cuobjdump -elf`` → ``{"arch": "sm_90a", "toolkit": "13.1", "abi": 8}``.

    Old-style headers write the toolkit as ``129``; it is returned as ``"12.9"``.
    """
    m = _ELF_HEADER_RE.search(text)
    if m is None:
        return None
    toolkit = m.group(3)
    if "." not in toolkit:
        toolkit = f"{int(toolkit) // 10}.{int(toolkit) % 10}"
    return {"arch": f"sm_{m.group(2)}", "toolkit": toolkit, "abi": int(m.group(1))}


_TKINFO_SECTION_RE = re.compile(r"^\.section \.note\.nv\.tkinfo\s*$")
_NOTE_ITEM_RE = re.compile(r"^\t([A-Za-z][A-Za-z ]*?):[ \t]?(.*)$")
_TOOL_VERSION_RE = re.compile(r"release (\d+\.\d+), V(\d+\.\d+\.\d+)")


def parse_tkinfo(text: str) -> dict[str, Any] | None:
    """The ``.note.nv.tkinfo`` note of ``cuobjdump -elf`` output, or None without one.

    Returns ``{"tool": "ptxas", "release": "13.0", "version": "13.0.88",
    "branch": "Build cuda_13.0.r13.0/compiler.36424714_0", "command_line": "-v  -O 3 -arch sm_90a",
    "note_version": 2}``; ``note_version`` (and any other line) may be absent → None.
    ptxas 13.x writes the note; ptxas 12.9 and the DSL's embedded ptxas do not.
    """
    lines = text.splitlines()
    start = next((i for i, ln in enumerate(lines) if _TKINFO_SECTION_RE.match(ln)), None)
    if start is None:
        return None
    items: dict[str, str] = {}
    for line in lines[start + 1 :]:
        if line.startswith(".section") or line.startswith(".nv."):
            break
        if m := _NOTE_ITEM_RE.match(line):
            items[m.group(1)] = m.group(2).strip()
    version = _TOOL_VERSION_RE.search(items.get("Tool Version", ""))
    if version is None:
        return None
    note_version = items.get("Note Version")
    return {
        "tool": items.get("Tool Name"),
        "release": version.group(1),
        "version": version.group(2),
        "branch": items.get("Tool Branch"),
        "command_line": items.get("Tool Command Line Arguments"),
        "note_version": int(note_version) if note_version else None,
    }


# --------------------------------------------------------------------------- SASS

# cuobjdump -sass: "\t\tFunction : NAME";  nvdisasm: "\t.section\t.text.NAME,"ax",@progbits"
_SASS_FUNCTION_RE = re.compile(r"^\s*(?:Function : (\S+)|\.section\s+\.text\.([^,\s]+))")
# "        /*0110*/   @!P0 STL.64 [R1+0x30], R20 ;"  → opcode "STL"
_SASS_OPCODE_RE = re.compile(r"^\s*/\*[0-9a-f]+\*/\s+(?:@!?U?P[T0-9]+\s+)?([A-Z][A-Z0-9_]*)")


def count_local_mem_ops(sass_text: str) -> dict[str, dict[str, int]]:
    """``{function: {"LDL": n, "STL": n}}`` from ``cuobjdump -sass`` or ``nvdisasm`` output.

    Counts instructions (any width/modifier: ``LDL.LU.64`` counts as one LDL).
    Every function seen is listed, with zeros when it has no local accesses.
    """
    counts: dict[str, Counter] = {}
    current: Counter | None = None
    for line in sass_text.splitlines():
        if m := _SASS_FUNCTION_RE.match(line):
            current = counts.setdefault(m.group(1) or m.group(2), Counter())
        elif current is not None and (m := _SASS_OPCODE_RE.match(line)):
            if m.group(1) in ("LDL", "STL"):
                current[m.group(1)] += 1
    return {name: {"LDL": c["LDL"], "STL": c["STL"]} for name, c in counts.items()}


# --------------------------------------------------------------------------- PTX

_PTX_ENTRY_RE = re.compile(r"^\s*(?:\.(?:visible|weak)\s+)?\.entry\s+([\w$%]+)\s*\(([^)]*)\)", re.M)
_PTX_PARAM_RE = re.compile(
    r"^\.param\s+(?:\.align\s+(?P<align>\d+)\s+)?\.(?P<type>[a-z]+\d+)"
    r"(?P<ptr>\s+\.ptr(?:\s+\.(?:global|shared|const|local))?(?:\s+\.align\s+(?P<ptr_align>\d+))?)?"
    r"\s+(?P<name>[\w$%]+)(?:\[(?P<count>\d+)\])?$"
)
_PTX_TARGET_RE = re.compile(r"^\s*\.target\s+(\w+)", re.M)


def parse_ptx_entries(ptx_text: str) -> dict[str, list[dict[str, Any]]]:
    """Kernel signatures: ``{entry: [param, ...]}`` in parameter order.

    A param is ``{"name", "type" ("b8", "u32", "u64", "f32"...), "size" (bytes),
    "align" (bytes, of the param slot), "is_ptr", "ptr_align"}``; ``ptr_align`` is the
    alignment a ``.ptr .align N`` pointer promises for the memory it points to (else None).
    """
    entries: dict[str, list[dict[str, Any]]] = {}
    for entry in _PTX_ENTRY_RE.finditer(ptx_text):
        params = []
        for raw in entry.group(2).split(","):
            raw = " ".join(raw.split())
            if not raw:
                continue
            m = _PTX_PARAM_RE.match(raw)
            if m is None:
                raise ValueError(f"unrecognised PTX parameter in {entry.group(1)}: {raw!r}")
            elem_size = int(re.sub(r"\D", "", m["type"])) // 8
            params.append(
                {
                    "name": m["name"],
                    "type": m["type"],
                    "size": elem_size * int(m["count"] or 1),
                    "align": int(m["align"] or elem_size),
                    "is_ptr": m["ptr"] is not None,
                    "ptr_align": int(m["ptr_align"]) if m["ptr_align"] else None,
                }
            )
        entries[entry.group(1)] = params
    return entries


def ptx_target(ptx_text: str) -> str:
    """The architecture of a PTX module's ``.target`` directive, e.g. "sm_90a"."""
    m = _PTX_TARGET_RE.search(ptx_text)
    if m is None:
        raise ValueError("PTX text has no .target directive")
    return m.group(1)


# --------------------------------------------------------------------------- cubin


def inspect_cubin(
    tc: Toolchain | InspectTools, cubin_path: str | os.PathLike, ptxas_log: str | None = None
) -> dict[str, Any]:
    """Inspect one cubin with ``tc.cuobjdump``/``tc.nvdisasm`` (see the module docstring).

    ``tc`` may be a Toolchain or the ptxas-less InspectTools.  ``ptxas_log`` is the
    ``-v`` log of the ptxas run that produced the cubin; without it spill bytes are None.
    A missing tkinfo note is reported as ``ptxas_version: None``: callers that need
    proof of the assembler must check it (see :func:`verify_ptxas`).
    """
    cubin = Path(cubin_path)
    data = cubin.read_bytes()
    elf_text = run_tool([tc.cuobjdump, "-elf", cubin])
    resources = parse_resource_usage(run_tool([tc.cuobjdump, "--dump-resource-usage", cubin]))
    local_ops = count_local_mem_ops(run_tool([tc.nvdisasm, "-c", cubin]))
    log = parse_ptxas_log(ptxas_log) if ptxas_log is not None else {}
    header = parse_elf_header(elf_text) or {}
    tkinfo = parse_tkinfo(elf_text) or {}

    entries = {}
    for name, res in resources.items():
        from_log = log.get(name, {})
        ops = local_ops.get(name, {"LDL": 0, "STL": 0})
        entries[name] = {
            "registers": from_log.get("registers", res.get("reg")),
            "stack_frame": from_log.get("stack_frame", res.get("stack")),
            "spill_store_bytes": from_log.get("spill_stores"),
            "spill_load_bytes": from_log.get("spill_loads"),
            "shared_bytes": res.get("shared"),
            "local_bytes": res.get("local"),
            "ldl": ops["LDL"],
            "stl": ops["STL"],
        }
    return {
        "sha256": hashlib.sha256(data).hexdigest(),
        "size_bytes": len(data),
        "arch": header.get("arch"),
        "elf_toolkit": header.get("toolkit"),
        "ptxas_version": tkinfo.get("version"),
        "ptxas_release": tkinfo.get("release"),
        "ptxas_command_line": tkinfo.get("command_line"),
        "ptxas_diagnostics": parse_ptxas_diagnostics(ptxas_log or ""),
        "entries": entries,
    }


def verify_ptxas(info: dict[str, Any], tc: Toolchain) -> None:
    """Check that an :func:`inspect_cubin` result was assembled by ``tc.ptxas``.

    13.x: the tkinfo note must name ``tc.ptxas_version``.  12.x writes no note, so
    only the ELF header's toolkit release can be compared (and the DSL's embedded
    ptxas, which is 12.9, is indistinguishable from ptxas 12.9).
    """
    if info["ptxas_version"] is not None:
        if info["ptxas_version"] != tc.ptxas_version:
            raise ToolchainError(
                f"cubin was built by ptxas {info['ptxas_version']}, expected {tc.ptxas_version}"
            )
    elif tc.ptxas_release.startswith("12."):
        if info["elf_toolkit"] != tc.ptxas_release:
            raise ToolchainError(
                f"cubin's ELF header says toolkit {info['elf_toolkit']}, expected {tc.ptxas_release}"
            )
    else:
        raise ToolchainError(
            f"cubin has no .note.nv.tkinfo although ptxas {tc.ptxas_version} writes one"
        )
