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
                             None when the cubin has no note (ptxas 12.x writes none, nor
                             does the CuTe DSL's embedded ptxas for sm_90a; its sm_100a
                             cubins carry "12.9.83"),
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
          "lane_loops":        number of ``BRA.U.ANY`` loops in the SASS: an instruction that
                               needs warp-uniform operands (a TMA issue) whose operands ptxas
                               could not prove uniform, issued once per distinct lane value
                               (see :func:`count_lane_loops`),
          "reg_peak":          highest GPR index live in the SASS + 1 (what the code really
                               needs; ``registers`` is the launch budget under setmaxnreg),
          "reg_live_max":      most GPRs live at once,
          "reg_peak_by_role":  [{"setmaxnreg": 24 | None (launch budget), "peak": 22,
                               "instructions": 509}, ...] per setmaxnreg region, [] without
                               setmaxnreg (see :func:`parse_register_peaks`),
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
    "parse_register_peaks",
    "parse_ptx_dynamic_smem",
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
    ptxas 13.x writes the note; ptxas 12.9 does not, nor does the DSL's embedded ptxas (12.9)
    for sm_90a (an old-format ELF), while its sm_100a cubins carry one ("V12.9.83").
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


def _sass_ops(sass_text: str):
    """``(function, opcode, line)`` for each instruction of ``cuobjdump -sass`` or ``nvdisasm``
    output, and ``(function, None, line)`` where a function starts."""
    current = None
    for line in sass_text.splitlines():
        if m := _SASS_FUNCTION_RE.match(line):
            current = m.group(1) or m.group(2)
            yield current, None, line
        elif current is not None and (m := _SASS_OPCODE_RE.match(line)):
            yield current, m.group(1), line


def count_local_mem_ops(sass_text: str) -> dict[str, dict[str, int]]:
    """``{function: {"LDL": n, "STL": n}}`` from ``cuobjdump -sass`` or ``nvdisasm`` output.

    Counts instructions (any width/modifier: ``LDL.LU.64`` counts as one LDL).
    Every function seen is listed, with zeros when it has no local accesses.
    """
    counts: dict[str, Counter] = {}
    for function, op, _ in _sass_ops(sass_text):
        c = counts.setdefault(function, Counter())
        if op in ("LDL", "STL"):
            c[op] += 1
    return {name: {"LDL": c["LDL"], "STL": c["STL"]} for name, c in counts.items()}


def count_lane_loops(sass_text: str) -> dict[str, int]:
    """``{function: n}``: the ``BRA.U.ANY`` branches of each function in ``cuobjdump -sass`` or
    ``nvdisasm`` output. ptxas emits one such loop around an instruction that needs
    warp-uniform operands (``UTMALDG``, ``R2UR``-fed descriptors) when it cannot prove them
    uniform (e.g. a TMA descriptor address it kept in vector registers): the instruction then
    runs once per distinct value among the lanes, with a dozen instructions of overhead per
    issue. In an experiment build of the sm_90a 128-row decode kernels this made paged calls
    12-46 % slower (docs/perf-notes.md, decode and paged KV)."""
    counts: dict[str, int] = {}
    for function, op, line in _sass_ops(sass_text):
        counts[function] = counts.get(function, 0) + (op == "BRA" and "BRA.U.ANY" in line)
    return counts


# --------------------------------------------------------------------------- register peaks

# "nvdisasm -c -plr -lrm narrow": every instruction line ends in a comment holding one column
# per register (a mark where the register is live); a header above names the columns.
NVDISASM_PEAK_FLAGS = ("-plr", "-lrm", "narrow")
_SASS_INSN_RE = re.compile(
    r"^\s*/\*(?P<addr>[0-9a-f]+)\*/\s+(?P<pred>@!?U?P[T0-9]+\s+)?(?P<op>[A-Z][A-Z0-9_.]*)(?P<args>[^;]*);?"
)
_SASS_LABEL_RE = re.compile(r"^\s*([.$][\w$.]+):")  # .L_x_12: and $__internal_0_$__cuda_...:
_SASS_TARGET_RE = re.compile(r"`\(([^)]+)\)")
_BRANCH_TARGETS_RE = re.compile(r'BRANCH_TARGETS ([^"*]+)')
_SETMAXNREG_RE = re.compile(r"(0x[0-9a-f]+|\d+)\s*$")


def _gpr_cell(line: str) -> str | None:
    """The GPR column of a life-range comment (``// | 67 :: ^^ | ...``), or None."""
    at = line.find("// |")
    if at < 0:
        return None
    cells = line[at + 4 :].split("|")
    return cells[0] if len(cells) > 1 else None


def _register_columns(header_rows: list[str]) -> dict[int, int]:
    """Header rows of digits (hundreds/tens/units, the last one with ``#``) → {column: register}."""
    units = header_rows[-1]
    start = units.find("#")
    columns = {}
    for col in range(start + 1, len(units)):
        digits = "".join(row[col] for row in header_rows if col < len(row) and row[col].isdigit())
        if digits and units[col].isdigit():
            columns[col] = int(digits)
    return columns


def parse_register_peaks(plr_text: str) -> dict[str, dict[str, Any]]:
    """True register use per function from ``nvdisasm -c -plr -lrm narrow`` output.

    Returns ``{function: {"peak": n, "live_max": n, "by_role": [...], "cfg_complete": bool}}``:

    * ``peak``: highest GPR index an instruction writes or reads + 1 (R0..R<peak-1>; ptxas's
      "Used N registers" is this plus the registers it reserves, and under ``setmaxnreg`` it is
      the launch budget instead).  Registers merely live through an instruction do not count
      for its region: liveness follows every CFG path, also those one warp role never takes;
    * ``live_max``: most GPRs live at once (nvdisasm's ``#`` column);
    * ``by_role``: one ``{"setmaxnreg": N | None, "peak": n, "instructions": n}`` per register
      budget the code runs under, in order of first appearance: ``None`` is the launch budget
      (code before any ``setmaxnreg``), ``N`` the code reached after a ``USETMAXREG ... N``.
      Roles follow the control flow (branch targets, fall-through, ``EXIT``); code reached under
      several budgets counts for each.  Empty when the function has no ``setmaxnreg``.
    * ``cfg_complete``: False when an indirect branch (``BRX``/``JMX``, e.g. a switch over warp
      roles) hides successors; code reached only that way is taken to start under the budget
      of the nearest indirect branch above it.
    A function whose output carries no life-range columns (plain ``nvdisasm -c``) is absent.
    """
    functions: dict[str, dict[str, Any]] = {}
    current: dict[str, Any] | None = None
    for line in plr_text.splitlines():
        if m := _SASS_FUNCTION_RE.match(line):
            name = m.group(1) or m.group(2)
            current = {"header": [], "columns": None, "insns": [], "labels": {}}
            functions[name] = current
            continue
        if current is None:
            continue
        cell = _gpr_cell(line)
        if current["columns"] is None:
            if cell is not None and cell.strip() and set(cell) <= set("0123456789# "):
                current["header"].append(cell)
                if "#" in cell:
                    current["columns"] = _register_columns(current["header"])
            continue
        if m := _SASS_LABEL_RE.match(line):
            current["labels"][m.group(1)] = len(current["insns"])
        elif m := _SASS_INSN_RE.match(line):
            # marks: ^ written, v read (last use), x read and written, : live through
            touched = [reg for col, reg in current["columns"].items()
                       if cell is not None and col < len(cell) and cell[col] not in " :"]  # fmt: skip
            count = cell.split()[0] if cell and cell.split() and cell.split()[0].isdigit() else "0"
            if m["op"].startswith("CALL"):  # its marks are the calling convention's clobbers
                touched = []
            current["insns"].append((m["pred"], m["op"], m["args"], max(touched, default=-1), int(count)))
    return {name: _peaks(f) for name, f in functions.items() if f["columns"] is not None}


def _successors(i: int, insn: tuple, labels: dict[str, int], n: int) -> tuple[list[int], bool]:
    """(indices control may reach after instruction i, whether some successor is unknown:
    an indirect branch or a target without a label)."""
    pred, op, args, *_ = insn
    base = op.split(".")[0]
    conditional = pred is not None and pred.strip() not in ("@PT", "@UPT")
    nxt = [i + 1] if i + 1 < n else []
    if base in ("BRX", "JMX"):  # nvdisasm names the targets when it knows them
        known = _BRANCH_TARGETS_RE.search(args)
        names = known.group(1).split(",") if known else []
        targets = [labels[t.strip()] for t in names if t.strip() in labels]
        return targets + (nxt if conditional else []), not names or len(targets) < len(names)
    if base in ("EXIT", "RET", "KILL", "BPT"):
        return (nxt if conditional else []), False
    if base in ("BRA", "JMP", "CALL"):
        names = _SASS_TARGET_RE.findall(args)
        targets = [labels[t] for t in names if t in labels]
        unknown = len(targets) < len(names) or not names
        only_target = _SASS_TARGET_RE.sub("", args).strip(" ,") == ""
        if base != "CALL" and not conditional and only_target and not unknown:
            return targets, False
        return targets + nxt, unknown
    return nxt, False


def _peaks(function: dict[str, Any]) -> dict[str, Any]:
    insns, labels = function["insns"], function["labels"]
    n = len(insns)
    budget_after = {i: int(m.group(1), 0) for i, (_, op, args, *_) in enumerate(insns)
                    if op.startswith("USETMAXREG") and (m := _SETMAXNREG_RE.search(args))}  # fmt: skip
    reached: dict[int, set] = {}
    indirect: list[int] = []  # BRX/JMX seen (their successors are unknown)
    returns: dict[int, bool] = {}

    def can_return(target: int) -> bool:
        """Whether a subroutine may come back (the sm_100 tcgen05 guardrails trap instead)."""
        if target not in returns:
            seen, todo = set(), [target]
            while todo and not returns.get(target):
                i = todo.pop()
                if i in seen:
                    continue
                seen.add(i)
                if insns[i][1].startswith("RET"):
                    returns[target] = True
                todo.extend(_successors(i, insns[i], labels, n)[0])
            returns.setdefault(target, False)
        return returns[target]

    def walk(start: int, budget: Any) -> None:
        work = [(start, budget)]
        while work:
            i, budget = work.pop()
            budget = budget_after.get(i, budget)
            if budget in reached.setdefault(i, set()):
                continue
            reached[i].add(budget)
            succ, unknown = _successors(i, insns[i], labels, n)
            if insns[i][1].startswith("CALL") and not unknown:
                callees = [j for j in succ if j != i + 1]
                if not any(can_return(j) for j in callees):
                    succ = callees
            if unknown:
                indirect.append(i)
            work.extend((j, budget) for j in succ)

    if n:
        walk(0, None)
    # Code reached only through an indirect branch (a warp-role switch): each block not reached
    # yet is entered under the budget of the nearest indirect branch above it.
    for i in range(n):
        if i not in reached:
            above = [j for j in indirect if j < i]
            for budget in sorted(reached[above[-1]], key=str) if above else [None]:
                walk(i, budget)
    complete = not indirect
    roles: dict[Any, dict[str, Any]] = {}
    for i in range(n):
        for b in sorted(reached[i], key=lambda x: -1 if x is None else x):
            role = roles.setdefault(b, {"setmaxnreg": b, "peak": 0, "instructions": 0, "first": i})
            role["peak"] = max(role["peak"], insns[i][3] + 1)
            role["instructions"] += 1
    by_role = [{k: r[k] for k in ("setmaxnreg", "peak", "instructions")}
               for r in sorted(roles.values(), key=lambda r: r["first"])] if budget_after else []  # fmt: skip
    return {
        "peak": max((x[3] for x in insns), default=-1) + 1,
        "live_max": max((x[4] for x in insns), default=0),
        "by_role": by_role,
        "cfg_complete": complete,
    }


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


_PTX_SETMAXNREG_RE = re.compile(r"setmaxnreg\.(inc|dec)\.sync\.aligned\.u32\s+(\d+)\s*;")


def register_budget_problem(ptx_text: str, registers: int, threads: int) -> str | None:
    """Warp-specialised kernels move registers with ``setmaxnreg``: one warpgroup decreases to
    ``dec``, the other ``threads / 128 - 1`` increase to ``inc``, all inside the CTA's
    allocation (``registers`` per thread, from the cubin). An increase that the decrease does
    not cover waits forever on the GPU, so it is refused here. None when the budget holds (or
    the kernel does not use setmaxnreg)."""
    found = {"inc": set(), "dec": set()}
    for kind, n in _PTX_SETMAXNREG_RE.findall(ptx_text):
        found[kind].add(int(n))
    if not found["inc"]:
        return None
    dec = min(found["dec"]) if found["dec"] else registers
    inc = max(found["inc"])
    takers = threads // 128 - 1
    freed, needed = 128 * (registers - dec), 128 * takers * (inc - registers)
    if needed > freed:
        return (f"setmaxnreg: {takers} warpgroup(s) increase to {inc} registers from {registers} "
                f"({needed} registers) but the decrease to {dec} frees only {freed}: the "
                f"increase would wait forever")
    return None


_PTX_EXTERN_SHARED_RE = re.compile(r"^\s*\.extern\s+\.shared\b[^;]*?([\w$%]+)\s*\[\s*\]", re.M)


def parse_ptx_dynamic_smem(ptx_text: str) -> list[str]:
    """Names of the module's ``.extern .shared`` arrays (dynamic shared memory, sized at
    launch: the PTX does not say how much); ``[]`` means the kernels use none."""
    return _PTX_EXTERN_SHARED_RE.findall(ptx_text)


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
    peak_error = None
    try:  # one disassembly serves the LDL/STL count and the register peaks
        sass = run_tool([tc.nvdisasm, "-c", *NVDISASM_PEAK_FLAGS, cubin])
    except ToolchainError as exc:  # life ranges unavailable: peaks unknown, LDL/STL still counted
        lines = str(exc).splitlines() or [""]
        errors = [ln for ln in lines if "error" in ln.lower() and "nvdisasm" in ln]
        peak_error = re.sub(r"\s+", " ", (errors[-1] if errors else lines[0])).strip()
        if any("Old format" in ln for ln in lines):
            peak_error += " (old-format ELF, as the CuTe DSL's embedded ptxas writes)"
        sass = run_tool([tc.nvdisasm, "-c", cubin])
    local_ops = count_local_mem_ops(sass)
    lane_loops = count_lane_loops(sass)
    peaks = parse_register_peaks(sass)
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
            "lane_loops": lane_loops.get(name, 0),
            "reg_peak": peaks.get(name, {}).get("peak"),
            "reg_live_max": peaks.get(name, {}).get("live_max"),
            "reg_peak_by_role": peaks.get(name, {}).get("by_role"),
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
        "reg_peak_error": peak_error,  # why nvdisasm gave no life ranges (old-format ELF...)
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
